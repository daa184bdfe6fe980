"""A task index out of range (command line, instance name or TF_CONFIG) exits 78 at once, naming the
problem, with nothing started."""
import json

import harness as h


def expect_78(wd, name, argv, env=None, must=()):
    p = h.Proc(wd, name, argv, env)
    rc = p.wait(15)
    err = p.stderr()
    h.log(name, "->", rc, err.strip().splitlines()[-1] if err.strip() else "")
    assert rc == 78, "%s: exit %s, expected 78:\n%s" % (name, rc, err)
    for m in must:
        assert m in err, "%s: %r not in:\n%s" % (name, m, err)


def test():
    h.require("psd", "workerd", "chiefd")
    wd = h.Workdir()
    job, spec = h.make_job(wd, n_ps=2, n_workers=2)
    st = ["--state-dir", wd.file("state")]
    expect_78(wd, "psd-index-2", [h.BIN["psd"], "--job", job, "--task-index", "2"] + st,
              must=["task index 2 is out of range", "2 ps tasks"])
    expect_78(wd, "workerd-index-9", [h.BIN["workerd"], "--job", job, "--task-index", "9"] + st,
              must=["9 is out of range", "2 worker tasks"])
    expect_78(wd, "workerd-index-bad", [h.BIN["workerd"], "--job", job, "--task-index", "x"] + st,
              must=["not a whole decimal number"])
    tf = json.dumps({"cluster": spec["cluster"], "task": {"type": "worker", "index": 5}})
    expect_78(wd, "workerd-tf-config", [h.BIN["workerd"], "--job", job] + st, {"TF_CONFIG": tf},
              must=["TF_CONFIG", "task.index: 5 is out of range"])
    tf = json.dumps({"cluster": spec["cluster"], "task": {"type": "worker", "index": 0}})
    expect_78(wd, "chiefd-tf-worker", [h.BIN["chiefd"], "--job", job] + st, {"TF_CONFIG": tf},
              must=["task.type"])
    # A bad job file: exit 78 naming the file and the key.
    bad = wd.file("bad.json")
    with open(bad, "w") as f:
        json.dump(dict(spec, training={"batch_size": 0}), f)
    for kind in ("chiefd", "psd"):
        argv = [h.BIN[kind], "--job", bad] + st + (["--task-index", "0"] if kind == "psd" else [])
        expect_78(wd, kind + "-bad-job", argv, must=[bad, "training.batch_size"])
    if h.os.access(h.BIN["psfleet"], h.os.X_OK):
        expect_78(wd, "psfleet-local-bad-job", [h.BIN["psfleet"], "local", bad], must=["training.batch_size"])
    # Nothing was started: no state written.
    assert not h.os.path.exists(wd.file("state")), h.os.listdir(wd.file("state"))


if __name__ == "__main__":
    h.main(test)

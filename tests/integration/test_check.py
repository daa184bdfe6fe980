"""psfleet check, the pre-flight: broken job files (the config, the endpoints, the data, the
certificates), each problem named on its own line and exit 78; warnings alone exit 0; the demo file
with nothing on its ports exits 0; a running psd of the same job passes, one of another job does not."""
import json
import os
import shutil
import socket
import subprocess

import harness as h


def check(job_path, *args, expect=78):
    argv = [h.BIN["psfleet"], "check", "--timeout", "1000"] + list(args) + [job_path]
    p = subprocess.run(argv, env=h.child_env(), capture_output=True, text=True, timeout=120)
    h.log("psfleet check", os.path.basename(job_path), "->", p.returncode)
    assert expect is None or p.returncode == expect, "%s: exit %d, expected %d:\n%s%s" % (argv, p.returncode, expect, p.stdout,
                                                                       p.stderr)
    if expect is None:
        assert p.returncode == (78 if lines(p.stdout) else 0), p.stdout
    return p.stdout


def lines(out, severity="error"):
    return [l for l in out.splitlines() if l.startswith(severity + " ")]


def has(out, thing, *words, severity="error"):
    """Some `severity` line names `thing` and says every one of words."""
    for l in lines(out, severity):
        if (thing + ":") in l and all(w in l for w in words):
            return l
    raise AssertionError("no %s line for %r with %r in:\n%s" % (severity, thing, words, out))


def write(wd, name, spec):
    path = wd.file(name)
    with open(path, "w") as f:
        json.dump(spec, f, indent=2)
    return path


def variant(wd, spec, name, change):
    s = json.loads(json.dumps(spec))
    change(s)
    return write(wd, name, s)


def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
    h.require("psd", "psfleet")
    wd = h.Workdir()
    # the demo file as shipped, nothing on its ports: all well
    out = check(h.EXAMPLE, expect=0)
    assert "0 errors" in out and "checked data train: 60000 examples" in out, out
    job, spec = h.make_job(wd, n_ps=1, n_workers=2)
    check(job, expect=0)
    insecure = {"mode": "insecure", "allow_insecure": True}   # remote endpoints without certificates

    # 1. not JSON
    bad = wd.file("bad.json")
    with open(bad, "w") as f:
        f.write('{"job": "x", "cluster": ')
    has(check(bad), "config")

    # 2. an endpoint written twice: the config refuses it
    has(check(variant(wd, spec, "dup.json", lambda s: s["cluster"]["worker"].__setitem__(1, s["cluster"]["ps"][0]))),
        "config", "duplicates")

    # 3. one socket spelt two ways
    port = spec["cluster"]["ps"][0].split(":")[1]
    out = check(variant(wd, spec, "dup2.json", lambda s: s["cluster"]["worker"].__setitem__(1, "localhost:" + port)))
    has(out, "worker:1 localhost:" + port, "the same socket as ps:0")

    # 4. a ps on TEST-NET-1 (RFC 5737): nothing there answers
    def testnet(s):
        s["cluster"]["ps"][0] = "192.0.2.1:7001"
        s["security"] = insecure
    # where no route drops it, an error; where a firewall on the way refuses it (as in some sandboxes),
    # the warning for a remote daemon not started yet: named either way, and the exit status agrees
    out = check(variant(wd, spec, "unreach.json", testnet), expect=None)
    if lines(out):
        has(out, "ps:0 192.0.2.1:7001", "cannot be reached")
        assert "1 error" in out, out
    else:
        has(out, "ps:0 192.0.2.1:7001", "nothing listens there", severity="warning")
        assert "0 errors, 1 warning" in out, out

    # 5. a host name that does not resolve
    def nohost(s):
        s["cluster"]["ps"][0] = "no-such-host.invalid:7001"
        s["security"] = insecure
    has(check(variant(wd, spec, "nohost.json", nohost)), "ps:0 no-such-host.invalid:7001", "does not resolve")

    # 6. a port taken by another program: it accepts TCP connections but speaks no gRPC
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", int(spec["cluster"]["worker"][0].split(":")[1])))
    squatter.listen(16)
    try:
        out = check(job)
        has(out, "worker:0 " + spec["cluster"]["worker"][0], "taken by another program")
        assert len(lines(out)) == 1, out     # only that one
        # by a name that resolves to more than the taken address too
        wport = spec["cluster"]["worker"][0].split(":")[1]
        out = check(variant(wd, spec, "squat-name.json", lambda s: s["cluster"]["worker"].__setitem__(0, "localhost:" + wport)))
        has(out, "worker:0 localhost:" + wport, "taken by another program")
    finally:
        squatter.close()

    # a psd of the job: the same job answers (all well), others are told apart
    ps = h.daemon(wd, "psd", job, 0)
    h.wait_healthy(spec["cluster"]["ps"][0], ps)
    out = check(job, expect=0)
    assert "0 errors" in out, out

    # 7. the wrong role: that psd where another job's chief should be
    def chief_on_ps(s):
        s["cluster"]["chief"][0], s["cluster"]["ps"][0] = spec["cluster"]["ps"][0], spec["cluster"]["chief"][0]
    has(check(variant(wd, spec, "role.json", chief_on_ps)), "chief " + spec["cluster"]["ps"][0],
        "a ps answers there, not a chief")

    # 8. another job's psd on the ps port (the files differ in the learning rate)
    def other_lr(s):
        s["training"]["learning_rate"] = 0.5
    has(check(variant(wd, spec, "fp.json", other_lr)), "ps:0 " + spec["cluster"]["ps"][0], "another job")
    ps.kill()
    assert ps.wait(30) == 0, ps.stderr()

    # 9. the model's input does not fit the images
    has(check(variant(wd, spec, "shape.json", lambda s: s["model"].__setitem__("input", [100]))),
        "data train", "784", "takes 100 values")

    # 10. fewer classes than the labels
    def five(s):
        s["model"]["layers"][-1]["units"] = 5
    has(check(variant(wd, spec, "classes.json", five)), "data train", "5 classes")

    # 11. a data file missing (the train split; the test split is fine)
    out = check(variant(wd, spec, "missing.json", lambda s: s["data"].__setitem__("train_labels", "nope.gz")))
    has(out, "data train", "nope.gz")
    assert "checked data test" in out and len(lines(out)) == 1, out

    # 12. data.dir that cannot be read: not a directory (and, unless we are root, a directory of mode 000)
    plain = wd.file("plain")
    open(plain, "w").close()
    has(check(variant(wd, spec, "notdir.json", lambda s: s["data"].__setitem__("dir", plain))), "data",
        "not a directory")
    if os.getuid() != 0:
        closed = wd.file("closed")
        os.mkdir(closed, 0)
        has(check(variant(wd, spec, "closed.json", lambda s: s["data"].__setitem__("dir", closed))), "data",
            "Permission denied")

    # 13. a corrupt data file, and the images of another dataset's count
    data = wd.file("data")
    os.mkdir(data)
    for n in ("train-images-idx3-ubyte.gz", "t10k-images-idx3-ubyte.gz"):
        os.symlink(os.path.join(h.DATA_DIR, n), os.path.join(data, n))
    with open(os.path.join(data, "train-labels-idx1-ubyte.gz"), "wb") as f:
        f.write(b"not an IDX file")
    shutil.copy(os.path.join(h.DATA_DIR, "train-labels-idx1-ubyte.gz"), os.path.join(data, "t10k-labels-idx1-ubyte.gz"))
    out = check(variant(wd, spec, "corrupt.json", lambda s: s["data"].__setitem__("dir", data)))
    has(out, "data train", "train-labels-idx1-ubyte.gz")
    has(out, "data test", "t10k")

    # 14. mutual TLS without certificates: each task's files named, with the command that makes them
    tls = wd.file("tls")
    mtls = {"mode": "mtls", "ca": tls + "/{job}/ca.crt", "cert": tls + "/{job}/{task}.crt",
            "key": tls + "/{job}/{task}.key"}
    tjob = variant(wd, spec, "mtls.json", lambda s: s.__setitem__("security", mtls))
    out = check(tjob)
    has(out, "certs", "ca.crt", "psfleet certs --job")
    for task in ("chief", "ps-0", "worker-0", "worker-1", "admin"):
        has(out, "certs " + task, task + ".crt is missing", "--task " + task)

    # 15. a task's certificate from another CA (the same job's files made twice)
    h.psfleet_certs(wd, tjob, tls)
    check(tjob, expect=0)
    other = wd.file("tls-other")
    h.psfleet_certs(wd, tjob, other)
    for ext in ("crt", "key"):
        shutil.copy(os.path.join(other, spec["job"], "ps-0." + ext), os.path.join(tls, spec["job"], "ps-0." + ext))
    out = check(tjob)
    has(out, "certs ps-0", "ps-0.crt")
    assert len(lines(out)) == 1, out

    # 16. a certificate ending within 30 days: a warning, not an error
    h.psfleet_certs(wd, tjob, tls, "--task", "ps-0", "--force", "--days", "10")
    out = check(tjob, expect=0)
    has(out, "certs ps-0", "within 30 days", severity="warning")

    # under mutual TLS: the job's own psd passes; where the chief should be, its certificate gives it away
    ps = h.daemon(wd, "psd", tjob, 0)
    h.wait_for("ps:0 listening", lambda: "ps:0 " + spec["cluster"]["ps"][0] not in check(tjob, expect=None), procs=[ps])
    out = check(tjob, expect=0)
    assert "0 errors" in out, out
    tjob2 = variant(wd, json.load(open(tjob)), "mtls-role.json", chief_on_ps)
    has(check(tjob2), "chief " + spec["cluster"]["ps"][0], "does not answer a gRPC health check as chief",
        "mutual TLS")
    ps.kill()
    assert ps.wait(30) == 0, ps.stderr()

    # --json: one object, every problem in it
    out = check(variant(wd, spec, "json.json", lambda s: (s["model"].__setitem__("input", [100]),
                                                          s["data"].__setitem__("test_labels", "nope.gz"))), "--json")
    o = json.loads(out)
    assert o["ok"] is False and o["errors"] == 2 and len(o["problems"]) == 2, o
    assert {p["thing"] for p in o["problems"]} == {"data train", "data test"}, o
    assert all(p["severity"] == "error" for p in o["problems"]), o
    o = json.loads(check(job, "--json", expect=0))
    assert o["ok"] is True and o["problems"] == [] and len(o["checked"]) >= 4, o


if __name__ == "__main__":
    h.main(test)

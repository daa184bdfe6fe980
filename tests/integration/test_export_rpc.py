"""Supervisor.Export against a live chief, under mutual TLS (the job's own CA, made by the daemons).

The demo MLP trains 300 steps (1 ps + 1 worker, a checkpoint every 100); the chief stays up after
DONE. Then, as admin:
- Export of a step writes <state>/<job>/exports/step-N, whose model.onnx is byte for byte the offline
  `psfleet export --job ... --step N` of the same step; the files listed are those in the directory;
- the same request again answers the same directory, existing, nothing rewritten (same inode and
  mtime); three at once (the exports serialized) all answer one directory, written once;
- step 0 exports the newest checkpoint;
- a step without a checkpoint: FAILED_PRECONDITION naming it, nothing left in exports/;
- `psfleet export --via-chief --json` prints the chief's reply; a bad step exits 65 naming it; a delta of
  this model (no tables) 78, as offline.
As worker-0 (the worker's own certificate): PERMISSION_DENIED.
Then a CTR job (examples/ctr-widedeep.json's model, increments chained to one full checkpoint): the
chief's whole export of an incremental step (every table outside) and its delta between two steps are
the offline exports' files byte for byte (the chains read through the chief's own store). About 10 s.
"""
import filecmp
import json
import os
import subprocess
import threading

import harness as h
from test_sparse_job import gen_split

STEPS = 300
SLOW_STEP_MS = 10   # about 3 s of training: a checkpoint at each hundred steps, not one the poll skips
SUPERVISOR = {"save_checkpoint_steps": 100, "save_checkpoint_secs": 0, "keep_checkpoints": 10}


def listening(p, addr):
    h.wait_for(p.name + " to listen", lambda: "on %s" % addr in p.stderr(), 30, [p])


def psfleet(*args):
    return subprocess.run([h.BIN["psfleet"]] + list(args), capture_output=True, text=True, timeout=180,
                          env=h.child_env())


def read(path):
    with open(path, "rb") as f:
        return f.read()


def test():
    h.require("psd", "workerd", "chiefd", "psfleet")
    import grpc
    s = h.stubs()
    wd = h.Workdir()
    path, spec = h.make_job(wd, n_ps=1, n_workers=1, training={"max_steps": STEPS}, supervisor=SUPERVISOR)
    chief_addr, ps_addr = spec["cluster"]["chief"][0], spec["cluster"]["ps"][0]
    state = wd.file("state")
    chief = h.daemon(wd, "chiefd", path)
    listening(chief, chief_addr)
    ps = h.daemon(wd, "psd", path, 0)
    listening(ps, ps_addr)
    worker = h.daemon(wd, "workerd", path, 0, env={"PSFLEET_TEST_SLOW_STEP_MS": str(SLOW_STEP_MS)})
    h.use_tls(os.path.join(wd.path, "tls"), spec)   # security.auto_dir: the CA and admin's pair are there
    h.wait_state(chief_addr, "DONE", 240, [chief, ps, worker])
    assert chief.alive()

    ch = h.channel(chief_addr)
    sup = s.supervisor_pb2_grpc.SupervisorStub(ch)
    steps = [c.global_step for c in sup.ListCheckpoints(s.supervisor_pb2.ListCheckpointsRequest(), timeout=5).checkpoints]
    h.log("checkpoints:", steps)
    trained = [st for st in steps if st]   # newest first; step 0 in a request means the newest
    assert len(trained) >= 3, steps
    step, other = trained[1], trained[2]   # not the newest: what step 0 exports is told apart

    rep = sup.Export(s.supervisor_pb2.ExportRequest(step=step), timeout=120)
    want_dir = os.path.join(state, spec["job"], "exports", "step-%d" % step)
    h.log("exported:", rep.dir, [(f.path, f.bytes) for f in rep.files])
    assert os.path.realpath(rep.dir) == os.path.realpath(want_dir), (rep.dir, want_dir)
    assert rep.global_step == step and not rep.existing, rep
    files = sorted(os.listdir(rep.dir))
    assert [f.path for f in rep.files] == files and "model.onnx" in files, (rep.files, files)
    for f in rep.files:
        assert os.path.getsize(os.path.join(rep.dir, f.path)) == f.bytes, f
    assert not os.path.exists(os.path.join(state, spec["job"], "exports", ".export.tmp"))

    off = wd.file("offline")
    p = psfleet("export", "--job", path, "--step", str(step), "--state-dir", state, "--out", off)
    assert p.returncode == 0, p.stderr
    onnx = os.path.join(rep.dir, "model.onnx")
    assert read(onnx) == read(os.path.join(off, "model.onnx")), "the chief's model.onnx differs from the offline one"
    h.log("model.onnx of global_step %d: the chief's and the offline export's are the same %d bytes"
          % (step, os.path.getsize(onnx)))

    # the same again: answered as it is
    st = os.stat(onnx)
    again = sup.Export(s.supervisor_pb2.ExportRequest(step=step), timeout=60)
    assert again.dir == rep.dir and again.existing and again.global_step == step, again
    st2 = os.stat(onnx)
    assert (st.st_ino, st.st_mtime_ns) == (st2.st_ino, st2.st_mtime_ns), "model.onnx rewritten"

    # three at once, of a step not exported yet: one writes, the others find it
    replies, errors = [], []

    def call():
        try:
            replies.append(sup.Export(s.supervisor_pb2.ExportRequest(step=other), timeout=120))
        except grpc.RpcError as e:
            errors.append(e)
    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, [(e.code(), e.details()) for e in errors]
    assert len({r.dir for r in replies}) == 1 and sorted(r.existing for r in replies) == [False, True, True], \
        [(r.dir, r.existing) for r in replies]

    newest = sup.Export(s.supervisor_pb2.ExportRequest(), timeout=120)
    assert newest.global_step == trained[0] and newest.dir.endswith("step-%d" % trained[0]), newest

    try:
        sup.Export(s.supervisor_pb2.ExportRequest(step=123457), timeout=60)
        raise AssertionError("an export of a step without a checkpoint answered")
    except grpc.RpcError as e:
        h.log("bad step:", e.code().name, e.details())
        assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and "123457" in e.details(), (e.code(), e.details())
    left = sorted(os.listdir(os.path.join(state, spec["job"], "exports")))
    assert left == sorted(["step-%d" % step, "step-%d" % other, "step-%d" % trained[0]]), left
    ch.close()

    with h.channel(chief_addr, "worker-0") as wch:
        try:
            s.supervisor_pb2_grpc.SupervisorStub(wch).Export(s.supervisor_pb2.ExportRequest(step=step), timeout=10)
            raise AssertionError("a worker's Export answered")
        except grpc.RpcError as e:
            h.log("as worker-0:", e.code().name, e.details())
            assert e.code() == grpc.StatusCode.PERMISSION_DENIED, (e.code(), e.details())

    # the command
    p = psfleet("export", "--job", path, "--via-chief", "--step", str(step), "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["dir"] == rep.dir and out["global_step"] == step and out["existing"], out
    assert [f["path"] for f in out["files"]] == files, out
    p = psfleet("export", "--job", path, "--via-chief", "--step", "123457")
    assert p.returncode == 65 and "123457" in p.stderr, (p.returncode, p.stderr)
    p = psfleet("export", "--job", path, "--via-chief", "--out", off)
    assert p.returncode == 2, (p.returncode, p.stderr)
    # a delta of a model without tables is the model's fault: 78, as offline
    p = psfleet("export", "--job", path, "--via-chief", "--since", "100")
    assert p.returncode == 78 and "no embedding table" in p.stderr, (p.returncode, p.stderr)
    h.log("psfleet export --via-chief: the chief's reply as JSON; a bad step 65; a delta without tables 78")

    chief.kill()
    assert chief.wait(30) == 0, chief.stderr()[-3000:]
    ctr(wd, state)


def same_files(a, b):
    """The files under a and b (one level of subdirectories): the same names, the same bytes."""
    def names(d):
        return sorted(os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs)
    assert names(a) == names(b), (names(a), names(b))
    for n in names(a):
        assert filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False), n
    return names(a)


def ctr(wd, state):
    import grpc  # noqa: F401
    s = h.stubs()
    data = gen_split(wd, 20000, 1000)
    with open(os.path.join(h.SOURCE_DIR, "examples", "ctr-widedeep.json")) as f:
        base = json.load(f)
    base["job"] = "ctrx"
    base["data"]["dir"] = data
    base["supervisor"] = {"save_checkpoint_steps": 50, "save_checkpoint_secs": 0, "keep_checkpoints": 100,
                          "full_checkpoint_every": 1000}
    path, spec = h.make_job(wd, "ctrx.json", n_ps=1, n_workers=1, base=base,
                            training={"max_steps": 200, "report_every_steps": 100, "threads": 1})
    chief_addr, ps_addr = spec["cluster"]["chief"][0], spec["cluster"]["ps"][0]
    chief = h.daemon(wd, "chiefd", path, name="ctr-chief")
    listening(chief, chief_addr)
    ps = h.daemon(wd, "psd", path, 0, name="ctr-ps")
    listening(ps, ps_addr)
    worker = h.daemon(wd, "workerd", path, 0, env={"PSFLEET_TEST_SLOW_STEP_MS": str(SLOW_STEP_MS)},
                      name="ctr-worker")
    h.use_tls(os.path.join(wd.path, "tls"), spec)
    h.wait_state(chief_addr, "DONE", 240, [chief, ps, worker])
    with h.channel(chief_addr) as ch:
        sup = s.supervisor_pb2_grpc.SupervisorStub(ch)
        cks = sup.ListCheckpoints(s.supervisor_pb2.ListCheckpointsRequest(), timeout=5).checkpoints
        incs = sorted(c.global_step for c in cks if c.incremental)
        h.log("ctr checkpoints (step, parent):", [(c.global_step, c.parent_step) for c in cks])
        assert len(incs) >= 2, [(c.global_step, c.incremental) for c in cks]
        a, b = incs[0], incs[-1]
        whole = sup.Export(s.supervisor_pb2.ExportRequest(step=b, max_inline_rows=1), timeout=120)
        delta = sup.Export(s.supervisor_pb2.ExportRequest(step=b, since=a), timeout=120)
    assert whole.dir.endswith("step-%d-rows-1" % b) and delta.dir.endswith("delta-%d-%d" % (a, b)), (whole, delta)
    assert delta.since == a and delta.changed > 0, delta
    common = ["export", "--job", path, "--state-dir", state, "--step", str(b)]
    p = psfleet(*common, "--max-inline-rows", "1", "--out", wd.file("ctr-whole"))
    q = psfleet(*common, "--since", str(a), "--out", wd.file("ctr-delta"))
    assert p.returncode == 0 and q.returncode == 0, (p.stderr, q.stderr)
    h.log("ctr: the chief's export of step %d (%s) and delta %d -> %d (%d rows changed, %d gone: %s) are the "
          "offline ones" % (b, ", ".join(same_files(whole.dir, wd.file("ctr-whole"))), a, b, delta.changed,
                            delta.tombstones, ", ".join(same_files(delta.dir, wd.file("ctr-delta")))))
    chief.kill()
    assert chief.wait(30) == 0, chief.stderr()[-3000:]


if __name__ == "__main__":
    h.main(test)

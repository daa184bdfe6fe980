"""Checkpoints against crashes, and a restarted psd restored from one (issue 4).

Real daemons (1 ps, 1 worker) with the test hook PSFLEET_TEST_CHECKPOINT_DELAY_MS, which makes chiefd
sleep between a checkpoint file's fsync and its rename, and again between the rename and its SQLite
record. chiefd is killed with SIGKILL in each window while a requested checkpoint is being written;
the partial checkpoint is never listed, and after each restart the SQLite records and the files agree
(the temp file, or the unrecorded file, is removed and says so). Then, with training stopped, a
checkpoint is compared with what psd holds (Pull with the optimizer's slots), bit for bit; psd is
killed and restarted, and chiefd restores it from that checkpoint (variables, slots and global_step)
while the worker waits; training then goes on and the job ends with a final checkpoint."""
import glob
import os
import re
import signal
import sqlite3
import time

import harness as h
import pyenv

DELAY_MS = 1000


def records(db):
    con = sqlite3.connect("file:%s?mode=ro" % db, uri=True)
    try:
        rows = con.execute("SELECT global_step, path, bytes, checksum FROM checkpoints ORDER BY global_step").fetchall()
        # paths under the state directory are stored relative to it (chief.db's directory)
        return [(r[0], os.path.join(os.path.dirname(db), r[1])) + tuple(r[2:]) for r in rows]
    finally:
        con.close()


def agree(db, ckdir):
    """SQLite rows and files are the same set; each file has the recorded size and checksum."""
    rows = records(db)
    files = sorted(os.path.join(ckdir, n) for n in os.listdir(ckdir))
    assert sorted(r[1] for r in rows) == files, "records %s, files %s" % (rows, files)
    for step, path, size, checksum in rows:
        with open(path, "rb") as f:
            data = f.read()
        assert len(data) == size, (path, len(data), size)
        assert checksum == "crc32c:%08x" % h.crc32c(data), (path, checksum)
    return rows


def wait_for(what, cond, timeout=30, procs=()):
    return h.wait_for(what, cond, timeout, procs, poll=0.02)


def pull(s, ps_addr, fingerprint, shapes):
    """Every tensor of the shard with slots, reassembled from row ranges; and global_step."""
    import numpy as np
    req = s.ps_pb2.PullRequest(header=s.ps_pb2.PullHeader(
        caller=s.tensor_pb2.Caller(fingerprint=fingerprint, task="test"), with_slots=True))
    with h.channel(ps_addr) as ch:
        rep = s.ps_pb2_grpc.ParameterServerStub(ch).Pull(req, timeout=10)
    out = {}
    for t in rep.tensors:
        full = out.setdefault(t.name, np.full(shapes[t.name], np.nan, dtype=np.float32))
        rows = np.frombuffer(t.data, dtype="<f4").reshape(tuple(t.shape))
        full[t.row_offset:t.row_offset + rows.shape[0]] = rows
    return out, rep.header.global_step


def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
    pyenv.ensure()
    h.require("psd", "workerd", "chiefd")
    import numpy as np
    from safetensors.numpy import load_file
    from safetensors import safe_open
    s = h.stubs()
    import grpc

    wd = h.Workdir()
    job, spec = h.make_job(wd, n_ps=1, n_workers=1,
                           training={"max_steps": 1000000, "report_every_steps": 20, "learning_rate": 0.02})
    spec["supervisor"] = {"save_checkpoint_steps": 0, "save_checkpoint_secs": 0, "keep_checkpoints": 3,
                          "save_summaries_secs": 0}
    with open(job, "w") as f:
        h.json.dump(spec, f)
    chief_addr, ps_addr = spec["cluster"]["chief"][0], spec["cluster"]["ps"][0]
    state = wd.file("state")
    jobdir = os.path.join(state, spec["job"])
    ckdir, db = os.path.join(jobdir, "checkpoints"), os.path.join(jobdir, "chief.db")
    hook = {"PSFLEET_TEST_CHECKPOINT_DELAY_MS": str(DELAY_MS)}

    ps = h.daemon(wd, "psd", job, 0)
    chief = h.daemon(wd, "chiefd", job, env=hook)
    worker = h.daemon(wd, "workerd", job, 0)
    h.wait_state(chief_addr, "TRAINING", 60, [ps, chief, worker])
    ch = h.channel(chief_addr)
    sup = s.supervisor_pb2_grpc.SupervisorStub(ch)
    listed = lambda: [c.global_step for c in sup.ListCheckpoints(s.supervisor_pb2.ListCheckpointsRequest(),
                                                                  timeout=5).checkpoints]

    # A checkpoint on request; it answers once written and recorded (two delays of the hook).
    t0 = time.monotonic()
    first = sup.SaveCheckpoint(s.supervisor_pb2.SaveCheckpointRequest(reason="test"), timeout=30).checkpoint
    assert time.monotonic() - t0 >= 2 * DELAY_MS / 1000 * 0.9
    assert first.trigger == "request" and first.checksum.startswith("crc32c:"), first
    assert listed() == [first.global_step, 0]
    agree(db, ckdir)

    # Window 1: killed after the fsync, before the rename. Only the temp file exists; never listed.
    n = 0
    for window in ("temp file", "unrecorded file"):
        fut = sup.SaveCheckpoint.future(s.supervisor_pb2.SaveCheckpointRequest(reason=window), timeout=30)
        if window == "temp file":
            found = wait_for(window, lambda: glob.glob(os.path.join(ckdir, ".ckpt-*.tmp")), 10, [chief])
        else:
            known = {r[1] for r in records(db)}
            found = wait_for(window, lambda: [p for p in glob.glob(os.path.join(ckdir, "ckpt-*.safetensors"))
                                              if p not in known], 10, [chief])
        assert listed() == [first.global_step, 0], "a checkpoint being written was listed"
        chief.kill(signal.SIGKILL)
        chief.wait(10)
        try:
            fut.result()
            raise AssertionError("SaveCheckpoint answered although chiefd was killed")
        except grpc.RpcError:
            pass
        assert all(os.path.exists(p) for p in found), found
        h.log("killed chiefd with %s %s on disk" % (window, [os.path.basename(p) for p in found]))
        n += 1
        chief = h.daemon(wd, "chiefd", job, env=hook)
        h.wait_healthy(chief_addr, chief)
        rows = agree(db, ckdir)
        assert [r[0] for r in rows] == [0, first.global_step], rows   # with the step-0 checkpoint
        assert not any(os.path.exists(p) for p in found), found
        err = chief.stderr()
        why = ("the write of a checkpoint was interrupted" if window == "temp file"
               else "a checkpoint file that was never recorded")
        assert ('Removed "%s": %s' % (found[0], why)) in err, err[-3000:]
        assert listed() == [first.global_step, 0]
        # chiefd carries on with the shards it finds initialized; the worker never stopped training.
        st = h.wait_state(chief_addr, "TRAINING", 30, [ps, chief, worker])
        assert "Every ps shard is already initialized" in chief.stderr()
        assert worker.alive()

    # Training stopped: a checkpoint equals what psd holds, bit for bit, slots and global_step too.
    worker.kill(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.stderr()[-2000:]
    ck = sup.SaveCheckpoint(s.supervisor_pb2.SaveCheckpointRequest(reason="compare"), timeout=30).checkpoint
    saved = load_file(ck.path)
    with safe_open(ck.path, "np") as f:
        meta = f.metadata()
    shapes = {k: v.shape for k, v in saved.items()}
    st = h.job_status(chief_addr)
    held, gs = pull(s, ps_addr, st.fingerprint, shapes)
    assert sorted(held) == sorted(saved), (sorted(held), sorted(saved))
    for name, v in saved.items():
        assert v.dtype == np.float32 and np.array_equal(v, held[name]), name
    assert int(meta["global_step"]) == gs == ck.global_step, (meta, gs, ck.global_step)
    assert meta["fingerprint"] == "%016x" % st.fingerprint
    again = sup.SaveCheckpoint(s.supervisor_pb2.SaveCheckpointRequest(reason="same step"), timeout=30)
    assert again.existing and again.checkpoint.global_step == ck.global_step, again
    agree(db, ckdir)
    h.log("checkpoint at global_step %d equals psd's %d tensors" % (gs, len(saved)))

    # psd dies and comes back empty: chiefd restores it from the newest checkpoint.
    ps.kill(signal.SIGKILL)
    ps.wait(10)
    ps = h.daemon(wd, "psd", job, 0)
    wait_for("the restore", lambda: "Restored ps:0 from checkpoint" in chief.stderr(), 30, [ps, chief])
    assert re.search(r'ps:0 \(%s\) restarted \(incarnation \d+\) without its variables' % re.escape(ps_addr),
                     chief.stderr()), chief.stderr()[-3000:]
    assert 'Restored ps:0 from checkpoint "%s" at global_step %d, with the optimizer\'s slots' % (ck.path, gs) \
        in chief.stderr(), chief.stderr()[-3000:]
    held, gs2 = pull(s, ps_addr, st.fingerprint, shapes)
    assert gs2 == gs, (gs2, gs)
    for name, v in saved.items():
        assert np.array_equal(v, held[name]), name
    st = h.job_status(chief_addr)
    assert st.restored_step == gs and st.restored_from == ck.path, st
    h.log("psd restored at global_step %d" % gs)

    # Delete one through the API: its row, then its file.
    rep = sup.DeleteCheckpoint(s.supervisor_pb2.DeleteCheckpointRequest(global_step=first.global_step), timeout=5)
    assert rep.deleted.path == first.path and not os.path.exists(first.path)
    try:
        sup.DeleteCheckpoint(s.supervisor_pb2.DeleteCheckpointRequest(global_step=first.global_step), timeout=5)
        raise AssertionError("deleted twice")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.NOT_FOUND, e
    agree(db, ckdir)

    # Training resumes from there. psd dies again while the worker trains: the worker waits for the
    # restore and carries on.
    worker = h.daemon(wd, "workerd", job, 0)
    wait_for("training past the restore", lambda: h.job_status(chief_addr).global_step > gs + 50, 60, [ps, chief, worker])
    ps.kill(signal.SIGKILL)
    ps.wait(10)
    ps = h.daemon(wd, "psd", job, 0)
    wait_for("the second restore", lambda: chief.stderr().count("Restored ps:0 from checkpoint") == 2, 30, [ps, chief])
    wait_for("training after it", lambda: h.job_status(chief_addr).global_step > gs + 50, 60, [ps, chief, worker])
    assert "re-reading the parameters" in worker.stderr(), worker.stderr()[-2000:]
    # on one host the worker pushed through shared memory: it saw psd's process go, and linked the new one
    assert "through shared memory: the ps process" in worker.stderr(), worker.stderr()[-2000:]
    assert worker.stderr().count("ps:0 is on this host: pushing through shared memory") == 2, worker.stderr()[-2000:]
    h.log("worker carried on after the second restore")
    sup.Stop(s.ps_pb2.StopRequest(reason="test done"), timeout=5)
    assert chief.wait(60) == 0, chief.stderr()[-3000:]
    rows = agree(db, ckdir)
    assert rows[-1][0] > gs, rows
    with safe_open(rows[-1][1], "np") as f:
        assert int(f.metadata()["global_step"]) == rows[-1][0]
    ch.close()


if __name__ == "__main__":
    h.main(test)

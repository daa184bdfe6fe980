"""Checkpoints and summaries across a stop and a restart (issue 4).

A job (1 ps, 1 worker, 2000 steps, a checkpoint every 200 steps) is run once without interruption. Then
the same job runs with a kept state directory, is stopped with SIGTERM at about half way (psfleet local
passes it to every process), its newest checkpoint is corrupted, and it is started again on the same
state directory: chiefd must say that the newest checkpoint is corrupt, restore the one before it, resume
at that checkpoint's global_step (not 0), and end within 0.5 points of the uninterrupted run's test
accuracy. The checkpoint files are read with the `safetensors` package and the summaries with
TensorBoard's own event reader, both from PyPI (pyenv.py)."""
import glob
import json
import os
import re
import signal
import sqlite3
import time

import harness as h
import pyenv

N = 2000
TRAINING = {"max_steps": N, "learning_rate": 0.05, "lr_decay_rate": 0.2, "lr_decay_steps": 1000,
            "report_every_steps": 50}
SUPERVISOR = {"save_checkpoint_steps": 200, "save_checkpoint_secs": 0, "keep_checkpoints": 3,
              "save_summaries_secs": 1, "eval_every_steps": 500}


def rows(db):
    con = sqlite3.connect("file:%s?mode=ro" % db, uri=True)
    try:
        rows = con.execute("SELECT global_step, path, bytes, checksum, trigger FROM checkpoints"
                           " ORDER BY time_us DESC, global_step DESC").fetchall()
        # paths under the state directory are stored relative to it (chief.db's directory)
        return [(r[0], os.path.join(os.path.dirname(db), r[1])) + tuple(r[2:]) for r in rows]
    finally:
        con.close()


def wait_step(state_dir, proc, step, timeout=120):
    """Waits until the chief (address from the job copy psfleet local wrote) reports global_step >= step
    and has at least two checkpoints; returns the chief's address."""
    end = time.monotonic() + timeout
    addr = None
    while time.monotonic() < end:
        if not proc.alive():
            raise AssertionError("psfleet local ended early (%s):\n%s" % (proc.p.returncode, proc.stderr()[-3000:]))
        try:
            with open(os.path.join(state_dir, "job.json")) as f:
                addr = json.load(f)["cluster"]["chief"][0]
            st = h.job_status(addr)
            if st.global_step >= step and st.checkpoints >= 2:
                return addr, st
        except Exception:
            pass
        time.sleep(0.05)
    raise AssertionError("global_step %d not reached in %.0f s" % (step, timeout))


def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
    pyenv.ensure()
    h.require("psd", "workerd", "chiefd", "psfleet")
    import numpy as np
    from safetensors import safe_open
    from tensorboard.backend.event_processing import event_accumulator, event_file_loader

    wd = h.Workdir()
    job, spec = h.make_job(wd, n_ps=1, n_workers=1, training=TRAINING)
    spec["supervisor"] = SUPERVISOR
    with open(job, "w") as f:
        json.dump(spec, f)
    state = wd.file("state")
    jobdir = os.path.join(state, spec["job"])
    ckdir, sumdir, db = os.path.join(jobdir, "checkpoints"), os.path.join(jobdir, "summaries"), os.path.join(jobdir, "chief.db")

    # 1. Uninterrupted.
    t0 = time.monotonic()
    a = h.psfleet_local(wd, job, ["--quiet", "--workers", "1"], name="uninterrupted")
    assert a.wait(180) == 0, a.stderr()[-3000:]
    ra = h.result_line(a)
    h.log("uninterrupted:", ra, "in %.1f s" % (time.monotonic() - t0))
    assert ra["global_step"] == N, ra

    # 2. The same job, stopped with SIGTERM at about N/2.
    b = h.psfleet_local(wd, job, ["--quiet", "--workers", "1", "--state-dir", state], name="first-half")
    addr, st = wait_step(state, b, N // 2)
    b.kill(signal.SIGTERM)
    rc = b.wait(60)
    assert rc == 128 + signal.SIGTERM, "psfleet local exited %s after SIGTERM" % rc
    assert h.wait_no_tagged(15) == [], "processes left after SIGTERM"
    h.log("stopped at global_step >= %d" % st.global_step)
    recorded = rows(db)
    h.log("recorded:", [(r[0], r[4]) for r in recorded])
    assert len(recorded) >= 2, recorded
    files = sorted(glob.glob(os.path.join(ckdir, "*")))
    assert sorted(r[1] for r in recorded) == files, (recorded, files)   # no partial file, none unrecorded
    newest, previous = recorded[0], recorded[1]
    assert newest[0] > previous[0] and newest[0] <= N // 2 + 400, recorded

    # The files are plain safetensors: variables and momentum slots, metadata with the step.
    with safe_open(newest[1], "np") as f:
        meta = f.metadata()
        names = set(f.keys())
        kernel = f.get_tensor("dense0/kernel")
    assert meta["global_step"] == str(newest[0]) and meta["optimizer"] == "momentum", meta
    assert meta["fingerprint"] and meta["format"] == "psfleet.checkpoint.v1", meta
    variables = {"dense%d/%s" % (i, k) for i in range(4) for k in ("kernel", "bias")}
    assert names == variables | {v + "/momentum" for v in variables}, names
    assert kernel.shape == (784, 256) and kernel.dtype == np.float32 and np.isfinite(kernel).all()
    assert os.path.getsize(newest[1]) == newest[2]

    # 3. Corrupt the newest checkpoint (a few bytes of its data), start again on the same state.
    with open(newest[1], "r+b") as f:
        f.seek(-100, os.SEEK_END)
        chunk = f.read(8)
        f.seek(-100, os.SEEK_END)
        f.write(bytes(x ^ 0x5A for x in chunk))
    c = h.psfleet_local(wd, job, ["--workers", "1", "--state-dir", state], name="second-half")
    assert c.wait(180) == 0, c.stderr()[-3000:]
    rc_ = h.result_line(c)
    log = c.stderr()
    h.log("resumed:", rc_)
    assert rc_["global_step"] == N, rc_
    assert re.search(r'Checkpoint "%s" \(global_step %d\) is corrupt: checksum crc32c:[0-9a-f]{8}, %s was recorded'
                     % (re.escape(newest[1]), newest[0], newest[3]), log), log[-4000:]
    assert 'Restored ps:0 from checkpoint "%s" at global_step %d' % (previous[1], previous[0]) in log, log[-4000:]
    assert "Job ready at global_step %d of %d" % (previous[0], N) in log, log[-4000:]
    assert "training from global_step %d to %d" % (previous[0], N) in log, log[-4000:]
    assert os.path.exists(newest[1] + ".corrupt")
    diff = abs(rc_["test_accuracy"] - ra["test_accuracy"])
    h.log("test accuracy: uninterrupted %.4f, stopped and resumed %.4f (difference %.4f)"
          % (ra["test_accuracy"], rc_["test_accuracy"], diff))
    assert diff <= 0.005, (ra, rc_)

    # Records and files agree; the last keep_checkpoints are kept; the final one is at N.
    recorded = rows(db)
    assert len(recorded) == SUPERVISOR["keep_checkpoints"], recorded
    assert sorted(r[1] for r in recorded) == sorted(glob.glob(os.path.join(ckdir, "ckpt-*.safetensors"))), recorded
    assert recorded[0][0] == N and recorded[0][4] == "end", recorded
    with safe_open(recorded[0][1], "np") as f:
        assert f.metadata()["global_step"] == str(N)

    # 4. Summaries, read by TensorBoard: one event file per chiefd start, each opening with the file
    # version; the restart's SessionLog START at the restored step made TensorBoard drop the first
    # run's events past it, so every series runs forward.
    event_files = sorted(glob.glob(os.path.join(sumdir, "events.out.tfevents.*")))
    assert len(event_files) == 2, event_files
    for path in event_files:
        first = next(iter(event_file_loader.EventFileLoader(path).Load()))
        assert first.file_version == "brain.Event:2", first
    acc = event_accumulator.EventAccumulator(sumdir)
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    want = {"loss", "loss/worker_0", "global_step/sec", "examples/sec", "learning_rate", "eval/accuracy", "eval/loss"}
    assert want <= tags, tags
    for t in want:
        steps = [e.step for e in acc.Scalars(t)]
        assert steps == sorted(steps), (t, steps)
    ev = acc.Scalars("eval/accuracy")
    assert ev[-1].step == N and abs(ev[-1].value - rc_["test_accuracy"]) < 1e-4, ev[-1]
    assert [e.step for e in ev if e.step < N], ev          # evaluations during training too
    lr = acc.Scalars("learning_rate")
    assert all(0 < e.value <= 0.05 * (1 + 1e-6) for e in lr), lr
    rate = acc.Scalars("global_step/sec")
    assert rate[-1].step == N and rate[-1].value > 0, rate   # the end's point: the rate over the training
    h.log("summaries: %s; %d eval points" % (sorted(tags), len(ev)))


if __name__ == "__main__":
    h.main(test)

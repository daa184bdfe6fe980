#!/usr/bin/env python3
"""Failure semantics of the chief (issue 13), with real daemons on loopback:
- a step-0 checkpoint exists before the first worker step;
- a psd killed before any periodic checkpoint: every shard restored from step 0, global_step back to 0,
  and the loss reported (ShardLoss, steps_lost) equal to the steps lost;
- SIGTERM to chiefd while training: the workers stopped, a final checkpoint, STOPPED in SQLite, exit 0;
  a new chiefd resumes from it with 0 steps lost (global_step and the checkpoint list);
- a job listed with 3 workers finishes with 2 started, and the status lists the missing one;
- a FAILED job stays FAILED across a restart of chiefd, says why (status, `psfleet status`), and
  trains again only after `psfleet restart`; the wait that failed it was visible as waiting_for;
- a job whose every worker stays away past the deadline fails, naming them.
"""

import os
import signal
import subprocess
import time

import harness as h


def db_job(db):
    return h.db_query(db, "SELECT state, global_step, reason, state_since_us FROM job")[0]


def checkpoints(chief_addr):
    return [(c.global_step, c.trigger) for c in h.list_checkpoints(chief_addr)]


def lifecycle():
    s = h.stubs()
    J = s.supervisor_pb2
    wd = h.Workdir()
    job, spec = h.make_job(wd, n_ps=2, n_workers=3,
                           training={"max_steps": 3000, "report_every_steps": 20, "learning_rate": 0.02},
                           supervisor={"save_checkpoint_steps": 0, "save_checkpoint_secs": 0, "save_summaries_secs": 0,
                                       "worker_timeout_secs": 5})
    chief_addr = spec["cluster"]["chief"][0]
    db = os.path.join(wd.file("state"), spec["job"], "chief.db")

    ps = [h.daemon(wd, "psd", job, i) for i in range(2)]
    chief = h.daemon(wd, "chiefd", job)
    h.wait_state(chief_addr, "READY", 60, ps + [chief])
    # Before any worker: the initial values are a checkpoint.
    assert checkpoints(chief_addr) == [(0, "init")], checkpoints(chief_addr)
    st = h.job_status(chief_addr)
    assert st.waiting_for.peer == "" or st.waiting_for.peer == "workers", st.waiting_for
    assert list(st.workers_missing) == [0, 1, 2] and not st.workers_live, st

    workers = [h.daemon(wd, "workerd", job, i) for i in range(2)]   # worker:2 is never started
    h.wait_for("training past step 300", lambda: h.job_status(chief_addr).global_step > 300, 60, ps + [chief])
    st = h.job_status(chief_addr)
    assert sorted(st.workers_live) == [0, 1] and list(st.workers_missing) == [2], st

    # psd killed before any periodic checkpoint: every shard back to step 0, the loss reported.
    ps[1].kill(signal.SIGKILL)
    ps[1].wait(10)
    before = h.job_status(chief_addr).global_step
    ps[1] = h.daemon(wd, "psd", job, 1)
    h.wait_for("the loss to be reported", lambda: len(h.job_status(chief_addr).losses) == 1, 60, [chief])
    st = h.job_status(chief_addr)
    loss = st.losses[0]
    assert loss.shard == 1 and loss.restored_step == 0 and loss.job_step >= before, loss
    assert loss.steps_lost == loss.job_step - loss.restored_step and st.steps_lost == loss.steps_lost, st
    assert st.restored_step == 0, st
    assert "ps:1 lost its variables: every shard restored from the checkpoint of global_step 0; %d steps of updates lost" \
        % loss.steps_lost in chief.stderr(), chief.stderr()[-2000:]
    h.log("ps:1 lost %d steps" % loss.steps_lost)

    # A save that fails shows in the status until one succeeds (the directory replaced by a file: the
    # tests run as root, so permissions would not stop the write).
    h.wait_for("training again", lambda: h.job_status(chief_addr).global_step > 200, 60, [chief])
    import grpc
    ckdir = os.path.join(os.path.dirname(db), "checkpoints")
    os.rename(ckdir, ckdir + ".away")
    open(ckdir, "w").close()
    with h.channel(chief_addr) as ch:
        sup = s.supervisor_pb2_grpc.SupervisorStub(ch)
        try:
            sup.SaveCheckpoint(J.SaveCheckpointRequest(reason="test"), timeout=30)
            raise AssertionError("a save into a file succeeded")
        except grpc.RpcError as e:
            assert "Not a directory" in e.details(), e.details()
        err = h.job_status(chief_addr).last_checkpoint_error
        assert "Not a directory" in err, err
        os.unlink(ckdir)
        os.rename(ckdir + ".away", ckdir)
        sup.SaveCheckpoint(J.SaveCheckpointRequest(reason="test"), timeout=30)
        assert h.job_status(chief_addr).last_checkpoint_error == ""

    # SIGTERM while training: STOPPED after a final checkpoint; chiefd exits 0 and stops the shards.
    chief.kill(signal.SIGTERM)
    assert chief.wait(30) == 0, chief.stderr()[-3000:]
    state, gs, reason, since = db_job(db)
    assert state == J.JOB_STATE_STOPPED and gs > 200 and since > 0, (state, gs, reason)
    assert reason == "stopped at global_step %d after its final checkpoint" % gs, reason
    for p in ps + workers:
        p.wait(30)
    h.log("stopped at global_step %d" % gs)

    # A new chiefd resumes from that checkpoint: 0 steps lost.
    ps = [h.daemon(wd, "psd", job, i) for i in range(2)]
    chief = h.daemon(wd, "chiefd", job)
    st = h.wait_state(chief_addr, "READY", 60, ps + [chief])
    assert st.global_step == gs and st.restored_step == gs, st
    assert checkpoints(chief_addr)[0] == (gs, "stop"), checkpoints(chief_addr)
    assert st.steps_lost == loss.steps_lost and len(st.losses) == 1, st   # nothing more lost
    workers = [h.daemon(wd, "workerd", job, i) for i in range(2)]
    st = h.wait_state(chief_addr, "DONE", 120, ps + [chief])
    assert st.global_step >= 3000 and 2 in st.workers_missing, st
    out = subprocess.run([h.BIN["psfleet"], "status", "--address", chief_addr], capture_output=True, text=True)
    missing = [l for l in out.stdout.splitlines() if l.strip().startswith("missing")]
    assert out.returncode == 0 and missing and "worker:2" in missing[0], out.stdout
    assert "lost       %d steps" % loss.steps_lost in out.stdout, out.stdout
    # DONE: chiefd stays up until told to stop.
    time.sleep(1)
    assert chief.alive()
    chief.kill(signal.SIGTERM)
    assert chief.wait(30) == 0


def sticky_failure():
    s = h.stubs()
    J = s.supervisor_pb2
    wd = h.Workdir()
    job, spec = h.make_job(wd, n_ps=1, n_workers=1, training={"max_steps": 300, "report_every_steps": 20},
                           supervisor={"ready_timeout_secs": 4, "save_summaries_secs": 0})
    chief_addr = spec["cluster"]["chief"][0]
    chief = h.daemon(wd, "chiefd", job)   # no psd: the wait for ps:0 runs out
    h.wait_healthy(chief_addr, chief)
    st = h.job_status(chief_addr)
    assert st.state == J.JOB_STATE_INITIALIZING and st.waiting_for.peer == "ps:0", st
    assert st.waiting_for.deadline_us - st.waiting_for.since_us == 4000000, st.waiting_for
    assert "UNAVAILABLE" in st.waiting_for.last_error, st.waiting_for
    h.wait_for("FAILED", lambda: h.healthy(chief_addr) and h.job_status(chief_addr).state == J.JOB_STATE_FAILED, 30,
             [chief])
    st = h.job_status(chief_addr)
    assert st.reason.startswith("ps:0 not reachable for 4 s: "), st.reason
    assert not st.HasField("waiting_for"), st
    reason = st.reason
    time.sleep(1)
    assert chief.alive(), "chiefd exited on a failed job"
    chief.kill(signal.SIGTERM)
    assert chief.wait(30) == 0

    # A new chiefd, with psd up now: still FAILED, same reason; it does not train.
    ps = h.daemon(wd, "psd", job, 0)
    chief = h.daemon(wd, "chiefd", job)
    h.wait_healthy(chief_addr, chief)
    st = h.job_status(chief_addr)
    assert st.state == J.JOB_STATE_FAILED and st.reason == reason, st
    out = subprocess.run([h.BIN["psfleet"], "status", "--address", chief_addr], capture_output=True, text=True)
    assert out.returncode == 0 and ": failed" in out.stdout and reason in out.stdout, out.stdout
    time.sleep(1)
    assert h.job_status(chief_addr).state == J.JOB_STATE_FAILED
    # Training again is an explicit act.
    out = subprocess.run([h.BIN["psfleet"], "restart", "--address", chief_addr, "--reason", "test"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    worker = h.daemon(wd, "workerd", job, 0)
    h.wait_state(chief_addr, "DONE", 60, [ps, chief])
    out = subprocess.run([h.BIN["psfleet"], "stop", "--address", chief_addr], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert chief.wait(30) == 0
    worker.wait(30)


def no_workers():
    """A job whose every worker stays away past the deadline fails, naming each worker's last state."""
    s = h.stubs()
    wd = h.Workdir()
    job, spec = h.make_job(wd, n_ps=1, n_workers=2, training={"max_steps": 300},
                           supervisor={"ready_timeout_secs": 2, "save_summaries_secs": 0})
    chief_addr = spec["cluster"]["chief"][0]
    ps = h.daemon(wd, "psd", job, 0)
    chief = h.daemon(wd, "chiefd", job)
    h.wait_state(chief_addr, "READY", 30, [ps, chief])
    # the chief says whom it waits for from its first look at the workers, just after READY
    h.wait_for("waiting_for workers", lambda: h.job_status(chief_addr).waiting_for.peer == "workers", 2, [chief])
    h.wait_for("FAILED", lambda: h.job_status(chief_addr).state == s.supervisor_pb2.JOB_STATE_FAILED, 30, [chief])
    st = h.job_status(chief_addr)
    assert st.reason == "every worker not reachable for 2 s: worker:0 not joined; worker:1 not joined", st.reason
    chief.kill(signal.SIGTERM)
    assert chief.wait(30) == 0


def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
    h.require("psd", "workerd", "chiefd", "psfleet")
    no_workers()
    sticky_failure()
    lifecycle()


if __name__ == "__main__":
    h.main(test)

#!/usr/bin/env python3
"""Backup workers in training.mode sync, side by side in one run: 3 workers, one of them slowed by
200 ms per step (PSFLEET_TEST_SLOW_STEP_MS, workerd's test hook). With N = 2 of 3 (one backup) the
job trains at >= 0.8 x the examples/s of the same job without a slow worker: a step needs only the
first two gradients, and the straggler's late ones are dropped as stale (counted). With N = 3 (no
backup) every step waits for the straggler, and the slowdown shows (< 0.5 x)."""

import signal
import time

import harness as h

SUP = {"save_checkpoint_secs": 0, "save_summaries_secs": 0}
BATCH = 64


def measure(wd, name, n_aggregate, slow, span):
    """Starts a job of 1 ps + 3 workers (worker 2 slowed when `slow`), returns its examples/s over
    `span` global steps once every worker is live (the chief's status, polled), and ps:0's state line,
    then stops it."""
    training = {"max_steps": 100000, "report_every_steps": 20, "batch_size": BATCH, "mode": "sync",
                "replicas_to_aggregate": n_aggregate, "total_num_replicas": 3}
    job, spec = h.make_job(wd, name=name + ".json", n_ps=1, n_workers=3, training=training, supervisor=SUP)
    chief_addr = spec["cluster"]["chief"][0]
    state = wd.file("state-" + name)
    ps = h.daemon(wd, "psd", job, 0, state_dir=state)
    chief = h.daemon(wd, "chiefd", job, state_dir=state)
    ws = [h.daemon(wd, "workerd", job, i, state_dir=state,
                   env={"PSFLEET_TEST_SLOW_STEP_MS": "200"} if slow and i == 2 else None) for i in range(3)]
    procs = [ps, chief] + ws
    h.wait_healthy(chief_addr, chief)
    h.wait_for("every worker live", lambda: sorted(h.job_status(chief_addr).workers_live) == [0, 1, 2], 60, procs)
    lo = h.job_status(chief_addr).global_step + 10
    hi = lo + span
    marks = {}
    deadline = time.monotonic() + 60
    while len(marks) < 2:
        assert time.monotonic() < deadline, "%s: global_step %d..%d not reached in 60 s" % (name, lo, hi)
        for p in procs:
            assert p.alive(), "%s exited" % p.name
        step = h.job_status(chief_addr).global_step
        for mark in (lo, hi):
            if step >= mark and mark not in marks:
                marks[mark] = (time.monotonic(), step)
        time.sleep(0.05)
    (t0, s0), (t1, s1) = marks[lo], marks[hi]
    eps = (s1 - s0) * n_aggregate * BATCH / (t1 - t0)
    state_line = [n.state for n in h.job_status(chief_addr).nodes if n.task == "ps:0"][0]
    for p in ws + [chief, ps]:
        p.kill(signal.SIGKILL)
        p.wait(10)
    h.log("%s: %.0f examples/s (global_step %d..%d in %.2f s); ps:0: %s" % (name, eps, s0, s1, t1 - t0, state_line))
    return eps, state_line


def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
    h.require("psd", "workerd", "chiefd")
    wd = h.Workdir()
    base, _ = measure(wd, "n2-no-straggler", 2, False, 400)
    backup, line = measure(wd, "n2-straggler", 2, True, 400)
    if backup < 0.8 * base:
        # the machine is shared: a second interleaved round, the best of each (as bench_train.py does)
        h.log("%.3f x: measuring both again" % (backup / base))
        base = max(base, measure(wd, "n2-no-straggler-2", 2, False, 400)[0])
        b2, l2 = measure(wd, "n2-straggler-2", 2, True, 400)
        backup, line = max((backup, line), (b2, l2))
    nobackup, _ = measure(wd, "n3-straggler", 3, True, 15)
    h.log("with a backup: %.3f x the job without a straggler; without a backup: %.3f x" %
          (backup / base, nobackup / base))
    assert backup >= 0.8 * base, "one backup worker: %.0f examples/s, %.0f without the straggler" % (backup, base)
    assert nobackup < 0.5 * base, "no backup worker: %.0f examples/s, %.0f without the straggler" % (nobackup, base)
    stale = int(line.split(" stale dropped")[0].rsplit(" ", 1)[1])
    assert stale > 0, "the straggler's gradients were never dropped: %s" % line


if __name__ == "__main__":
    h.main(test)

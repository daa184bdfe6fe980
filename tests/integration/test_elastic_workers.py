#!/usr/bin/env python3
"""Elastic workers (issue 13): a worker killed with SIGKILL shows as missing once it has not reported
for supervisor.worker_timeout_secs while the job goes on with the other; started again, it rejoins with
the current parameters, is live again, and its examples count again (its reports, with a growing
`examples`, reach the chief's record). The job ends DONE at max_steps."""

import os
import signal
import sqlite3
import time

import harness as h


def reports(db, worker, after_us):
    con = sqlite3.connect("file:%s?mode=ro" % db, uri=True)
    try:
        return con.execute("SELECT time_us, examples FROM progress WHERE worker = ? AND time_us > ? ORDER BY id",
                           (worker, after_us)).fetchall()
    finally:
        con.close()


def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
    h.require("psd", "workerd", "chiefd")
    wd = h.Workdir()
    job, spec = h.make_job(wd, n_ps=1, n_workers=2,
                           training={"max_steps": 6000, "report_every_steps": 20, "learning_rate": 0.02},
                           supervisor={"save_checkpoint_secs": 0, "save_summaries_secs": 0, "worker_timeout_secs": 2})
    chief_addr = spec["cluster"]["chief"][0]
    db = os.path.join(wd.file("state"), spec["job"], "chief.db")

    ps = h.daemon(wd, "psd", job, 0)
    chief = h.daemon(wd, "chiefd", job)
    w0 = h.daemon(wd, "workerd", job, 0)
    w1 = h.daemon(wd, "workerd", job, 1)
    h.wait_healthy(chief_addr, chief)
    h.wait_for("both workers live", lambda: sorted(h.job_status(chief_addr).workers_live) == [0, 1], 60,
             [ps, chief, w0, w1])

    w1.kill(signal.SIGKILL)
    w1.wait(10)
    h.wait_for("worker:1 missing", lambda: list(h.job_status(chief_addr).workers_missing) == [1], 20, [ps, chief, w0])
    st = h.job_status(chief_addr)
    assert list(st.workers_live) == [0] and st.state == h.stubs().supervisor_pb2.JOB_STATE_TRAINING, st
    h.wait_for("training on without worker:1", lambda: h.job_status(chief_addr).global_step > st.global_step + 100, 30,
             [ps, chief, w0])
    h.log("worker:1 missing at global_step %d" % st.global_step)

    back_us = int(time.time() * 1e6)
    w1 = h.daemon(wd, "workerd", job, 1)
    h.wait_for("worker:1 live again", lambda: 1 in h.job_status(chief_addr).workers_live, 60, [ps, chief, w0, w1])
    h.wait_for("worker:1's examples counting", lambda: len(reports(db, 1, back_us)) >= 3, 60, [ps, chief, w0])
    rows = reports(db, 1, back_us)
    assert rows[-1][1] > rows[0][1] > 0, rows
    assert "resuming at global_step" in w1.stderr(), w1.stderr()[-2000:]
    st = h.wait_state(chief_addr, "DONE", 120, [ps, chief])
    assert st.global_step >= 6000, st
    assert w0.wait(30) == 0 and w1.wait(30) == 0
    chief.kill(signal.SIGTERM)
    assert chief.wait(30) == 0


if __name__ == "__main__":
    h.main(test)

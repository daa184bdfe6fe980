#!/usr/bin/env python3
"""training.mode sync with workers that die. N = 2 of 3 workers (one backup): a worker killed with
SIGKILL changes nothing but the count of dropped gradients, and the job reaches max_steps DONE.
N = 2 of 2 (no backup): with one worker killed the job waits — global_step stands still and ps:0's
state in the chief's status says for whom ("from worker:1") — and when the worker is started again
it pulls the step, and the job resumes and ends DONE."""

import signal
import time

import harness as h

SUP = {"save_checkpoint_secs": 0, "save_summaries_secs": 0, "worker_timeout_secs": 2}


def ps_state(chief_addr):
    return [n.state for n in h.job_status(chief_addr).nodes if n.task == "ps:0"][0]


def start(wd, name, workers, training, rpc=None):
    job, spec = h.make_job(wd, name=name, n_ps=1, n_workers=workers, training=training, supervisor=SUP, rpc=rpc)
    chief_addr = spec["cluster"]["chief"][0]
    state = wd.file("state-" + name)
    ps = h.daemon(wd, "psd", job, 0, state_dir=state)
    chief = h.daemon(wd, "chiefd", job, state_dir=state)
    ws = [h.daemon(wd, "workerd", job, i, state_dir=state) for i in range(workers)]
    h.wait_healthy(chief_addr, chief)
    h.wait_for("every worker live", lambda: sorted(h.job_status(chief_addr).workers_live) == list(range(workers)),
               60, [ps, chief] + ws)
    return job, chief_addr, ps, chief, ws


def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
    h.require("psd", "workerd", "chiefd")
    wd = h.Workdir()

    # 1. One backup: a worker lost costs nothing.
    training = {"max_steps": 1500, "report_every_steps": 20, "mode": "sync", "replicas_to_aggregate": 2,
                "total_num_replicas": 3}
    job, chief_addr, ps, chief, ws = start(wd, "backup.json", 3, training)
    h.wait_for("training", lambda: h.job_status(chief_addr).global_step > 50, 30, [ps, chief] + ws)
    ws[2].kill(signal.SIGKILL)
    ws[2].wait(10)
    at = h.job_status(chief_addr).global_step
    h.log("worker:2 killed at global_step %d" % at)
    assert at < 1000, "too late to show anything: global_step %d" % at
    st = h.wait_state(chief_addr, "DONE", 120, [ps, chief])
    assert st.global_step == 1500, st
    h.log("done without worker:2; ps:0:", ps_state(chief_addr))
    assert ws[0].wait(30) == 0 and ws[1].wait(30) == 0
    chief.kill(signal.SIGTERM)
    assert chief.wait(30) == 0 and ps.wait(30) == 0

    # 2. No backup: the job waits for the lost worker, says so, and resumes when it is back.
    training = dict(training, total_num_replicas=2, max_steps=1000)
    job, chief_addr, ps, chief, ws = start(wd, "nobackup.json", 2, training, rpc={"deadline_ms": 1500})
    h.wait_for("training", lambda: h.job_status(chief_addr).global_step > 50, 30, [ps, chief] + ws)
    ws[1].kill(signal.SIGKILL)
    ws[1].wait(10)
    h.wait_for("ps:0 saying it waits for worker:1", lambda: "from worker:1" in ps_state(chief_addr), 20, [ps, chief])

    def settled():
        # the chief hears global_step from ps:0 a moment late: the step it shows stops moving first
        a = h.job_status(chief_addr).global_step
        time.sleep(1.0)
        b = h.job_status(chief_addr).global_step
        return (b,) if a == b else None

    stuck = h.wait_for("the chief's global_step to stop moving", settled, 20, [ps, chief])[0]
    h.log("waiting at global_step %d; ps:0: %s" % (stuck, ps_state(chief_addr)))
    assert "waiting for 1 more" in ps_state(chief_addr)
    time.sleep(2.5)   # past a deadline: the survivor pulls and pushes again, and still no step is made
    assert h.job_status(chief_addr).global_step == stuck
    assert stuck < 1000, "the job ended before the worker was lost"
    ws[1] = h.daemon(wd, "workerd", job, 1, state_dir=wd.file("state-nobackup.json"))
    h.wait_for("steps again", lambda: h.job_status(chief_addr).global_step > stuck + 50, 60, [ps, chief, ws[0], ws[1]])
    st = h.wait_state(chief_addr, "DONE", 120, [ps, chief])
    assert st.global_step == 1000, st
    assert "re-reading the parameters" in ws[0].stderr()   # its waits ended at their deadline, and it tried again
    assert ws[0].wait(30) == 0 and ws[1].wait(30) == 0
    chief.kill(signal.SIGTERM)
    assert chief.wait(30) == 0


if __name__ == "__main__":
    h.main(test)

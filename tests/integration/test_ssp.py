#!/usr/bin/env python3
"""Bounded staleness (training.mode ssp): 2 workers, worker 1 slowed by 40 ms per step
(PSFLEET_TEST_SLOW_STEP_MS) and started first. For s = 0, 2 and 8, ps:0 logs every decision to let a worker start a
step with how far it is ahead of the slowest live worker (PSFLEET_LOG_LEVEL=debug): in that per-step
log the lead never exceeds s, and reaches s (the fast worker ran ahead as far as allowed and was held
there, else it would be far ahead of a worker 10x slower). The clock table is in the chief's status
(ps:0's state line) while it runs, with the held worker marked."""

import re
import signal

import harness as h

SUP = {"save_checkpoint_secs": 0, "save_summaries_secs": 0}
LINE = re.compile(r"ssp: worker:(\d+) starts step (\d+), (\d+) ahead of the slowest live worker \(bound (\d+)\)")


def run(wd, s):
    training = {"max_steps": 120, "report_every_steps": 10, "mode": "ssp", "staleness": s}
    job, spec = h.make_job(wd, name="ssp%d.json" % s, n_ps=1, n_workers=2, training=training, supervisor=SUP)
    chief_addr = spec["cluster"]["chief"][0]
    state = wd.file("state-ssp%d" % s)
    ps = h.daemon(wd, "psd", job, 0, state_dir=state, env={"PSFLEET_LOG_LEVEL": "debug"})
    chief = h.daemon(wd, "chiefd", job, state_dir=state)
    h.wait_healthy(chief_addr, chief)
    # the slow worker first, so that both are live (clocks only bind live workers) for most of the run
    slow = h.daemon(wd, "workerd", job, 1, state_dir=state, env={"PSFLEET_TEST_SLOW_STEP_MS": "40"})
    h.wait_for("worker:1 training", lambda: h.job_status(chief_addr).global_step >= 3, 60, [ps, chief, slow])
    ws = [h.daemon(wd, "workerd", job, 0, state_dir=state), slow]
    seen = []

    def table():
        st = h.job_status(chief_addr)
        line = [n.state for n in st.nodes if n.task == "ps:0"][0]
        if "ssp clocks" in line:
            seen.append(line)
        return st.state == h.stubs().supervisor_pb2.JOB_STATE_DONE

    h.wait_for("the job done", table, 120, [ps, chief])
    assert ws[0].wait(30) == 0 and ws[1].wait(30) == 0
    chief.kill(signal.SIGTERM)
    assert chief.wait(30) == 0 and ps.wait(30) == 0
    steps = [tuple(map(int, m.groups())) for m in LINE.finditer(ps.stderr())]
    assert len(steps) >= 100, "only %d per-step lines in ps:0's log" % len(steps)
    worst = max(a for _, _, a, _ in steps)
    fast = [c for w, c, _, _ in steps if w == 0]
    slow = [c for w, c, _, _ in steps if w == 1]
    h.log("s=%d: %d steps logged (worker:0 %d, worker:1 %d), largest lead %d; e.g. %s" %
          (s, len(steps), len(fast), len(slow), worst, seen[len(seen) // 2] if seen else "(no table seen)"))
    assert all(b == s for _, _, _, b in steps)
    assert worst <= s, "a worker started a step %d ahead of the slowest (bound %d)" % (worst, s)
    assert worst == s, "the lead never reached the bound %d (largest %d): the fast worker was not held" % (s, worst)
    assert seen and all(re.search(r"w0 \d+.*w1 \d+", l) for l in seen), seen[:3]
    return seen


def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
    h.require("psd", "workerd", "chiefd")
    wd = h.Workdir()
    held = []
    for s in (0, 2, 8):
        held += [l for l in run(wd, s) if "(waits)" in l]
    assert held, "the status never showed a held worker"
    h.log("a held worker in the status:", held[0])


if __name__ == "__main__":
    h.main(test)

"""psfleet top (issue 18): a job of 1 ps and 3 workers, one of them slowed by the test hook
PSFLEET_TEST_SLOW_STEP_MS; `psfleet top --once --json` marks it, and it alone, as the straggler and
shows the shard's pushes; the plain view marks the same line; the live view prints a block per refresh,
or on a terminal redraws in place, until Ctrl-C and exits 0; with no chief at the address it says so
and exits 1."""
import json
import os
import select
import signal
import subprocess
import time

import harness as h

SLOW_MS = 200


def top(*args, timeout=30):
    r = subprocess.run([h.BIN["psfleet"], "top"] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, env=h.child_env(), timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
    h.require("psd", "workerd", "chiefd", "psfleet")
    wd = h.Workdir()
    # long enough to be training throughout; a report every 10 steps: every ~2 s from the slowed worker
    job, spec = h.make_job(wd, n_ps=1, n_workers=3, training={"max_steps": 10000000, "report_every_steps": 10})
    chief = spec["cluster"]["chief"][0]
    procs = [h.daemon(wd, "psd", job, 0), h.daemon(wd, "chiefd", job)]
    for i in range(3):
        env = {"PSFLEET_TEST_SLOW_STEP_MS": str(SLOW_MS)} if i == 2 else None
        procs.append(h.daemon(wd, "workerd", job, i, env=env))
    h.wait_state(chief, "TRAINING", timeout=60, procs=procs)
    assert "PSFLEET_TEST_SLOW_STEP_MS=%d" % SLOW_MS in h.wait_for(
        "the slowed worker's warning", lambda: procs[4].stderr() if "Test hook" in procs[4].stderr() else None,
        procs=procs), procs[4].stderr()

    # every worker has reported twice (the slowed one after ~4 s), so each has a report interval
    def reported_twice():
        st = h.job_status(chief)
        steps = {n.task: n.local_step for n in st.nodes if n.task.startswith("worker:")}
        return steps if len(steps) == 3 and min(steps.values()) >= 20 else None
    h.log("steps:", h.wait_for("every worker's second report", reported_twice, timeout=40, procs=procs))

    rc, out, err = top("--once", "--json", "--address", chief, "--interval-ms", "2500")
    assert rc == 0, "exit %d: %s" % (rc, err)
    lines = [l for l in out.splitlines() if l.strip()]
    assert len(lines) == 1, out
    v = json.loads(lines[0])
    h.log("top:", json.dumps(v, indent=1))
    assert v["state"] == "training", v
    workers = {w["task"]: w for w in v["workers"]}
    assert sorted(workers) == ["worker:0", "worker:1", "worker:2"], v
    assert v["stragglers"] == ["worker:2"], v
    slow = workers["worker:2"]
    assert slow["straggler"] and slow["straggler_reason"] == "slow", slow
    # at most 1000 / SLOW_MS steps/s, and below half of the median (which is a fast worker's)
    assert 0 < slow["steps_per_s"] <= 1000.0 / SLOW_MS * 1.05, slow
    assert slow["steps_per_s"] < 0.5 * v["median_steps_per_s"], v
    for t in ("worker:0", "worker:1"):
        w = workers[t]
        assert not w["straggler"] and w["straggler_reason"] is None, w
        assert w["steps_per_s"] > 2 * slow["steps_per_s"], v
        assert w["last_report_age_s"] is not None and w["last_report_age_s"] < 10, w
        assert w["error"] is None and w["waiting_for"] is None, w
    [ps] = v["shards"]
    assert ps["task"] == "ps:0" and ps["error"] is None and ps["initialized"], ps
    assert ps["pushes"] > 0 and ps["pushes_per_s"] > 0, ps
    assert ps["bytes_in_per_s"] > 0 and ps["bytes_out_per_s"] > 0, ps
    assert ps["apply_ms_per_push"] > 0 and ps["busy"] > 0, ps
    assert ps["rejected"] == 0, ps

    # the plain view (stdout not a terminal): one block, the slowed worker's line marked
    rc, out, err = top("--once", "--address", chief, "--interval-ms", "2500")
    assert rc == 0, "exit %d: %s" % (rc, err)
    h.log("plain view:\n" + out)
    assert "\033[" not in out, out
    marked = [l.split()[0] for l in out.splitlines() if "STRAGGLER" in l]
    assert marked == ["worker:2"], out
    assert any(l.startswith("ps:0 ") for l in out.splitlines()), out

    # the live view: a block per refresh until SIGINT, then exit 0
    p = h.Proc(wd, "top", [h.BIN["psfleet"], "top", "--address", chief, "--interval-ms", "200"],
               stdout_to_log=False)
    h.wait_for("three views", lambda: p.stdout().count("WORKER ") >= 3, timeout=20, procs=[p])
    p.kill(signal.SIGINT)
    assert p.wait(10) == 0, p.stderr()

    # on a terminal: redrawn in place (cursor home, clear) at each refresh, until SIGINT
    master, slave = os.openpty()
    p = subprocess.Popen([h.BIN["psfleet"], "top", "--address", chief, "--interval-ms", "200"], stdin=slave,
                         stdout=slave, stderr=slave, env=h.child_env(), close_fds=True)
    os.close(slave)
    out = b""
    end = time.monotonic() + 20
    while out.count(b"\033[H\033[J") < 3 and time.monotonic() < end and p.poll() is None:
        if select.select([master], [], [], 0.5)[0]:
            out += os.read(master, 65536)
    p.send_signal(signal.SIGINT)
    rc = p.wait(10)
    os.close(master)
    text = out.decode(errors="replace")
    assert rc == 0 and text.count("\033[H\033[J") >= 3 and "worker:2 " in text, (rc, text[-2000:])

    # no chief there: a clear message and exit 1, within the deadline
    [free] = h.free_ports(1)
    rc, out, err = top("--once", "--address", "127.0.0.1:%d" % free, "--timeout-ms", "500", timeout=10)
    assert rc == 1 and "cannot get the job's status from the chief at 127.0.0.1:%d" % free in err, (rc, err)


if __name__ == "__main__":
    h.main(test)

#!/usr/bin/python3
"""What a lost psd costs under supervisor.recovery job against shard (docs/performance.md, "Recovery
of a lost shard"), side by side in one run: per mode, --trials jobs of 2 ps + 2 workers (the
Fashion-MNIST MLP, a checkpoint every --interval steps), in each of which ps:1 is killed (-9) at a
drawn global_step while the workers train and started again at once, as systemd's Restart= would.
Measured per trial:

  - recovery time: from the kill until the restarted shard is initialized and global_step has moved
    again (shard 0's, polled every 20 ms);
  - global steps redone: how far global_step went back (job: to the checkpoint; shard: 0);
  - the shard's updates lost: the chief's record (ShardLoss.steps_lost, the job's step when the loss was
    found minus the checkpoint's);
  - the final test accuracy.

Prints a table and one JSON line.

Usage: tests/bench/bench_recovery.py [--build build] [--trials 3] [--steps 3000] [--interval 300]
                                     [--seed 1]
"""
import argparse, json, os, random, signal, statistics, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))
if "--build" in sys.argv[:-1]:   # the harness finds the daemons through it when imported
    os.environ["PSFLEET_BUILD_DIR"] = os.path.abspath(sys.argv[sys.argv.index("--build") + 1])


def trial(h, a, mode, kill_at):
    wd = h.Workdir()
    job, spec = h.make_job(wd, n_ps=2, n_workers=2,
                           training={"max_steps": a.steps, "report_every_steps": 20},
                           supervisor={"save_checkpoint_steps": a.interval, "save_checkpoint_secs": 0,
                                       "save_summaries_secs": 0, "recovery": mode})
    chief_addr, ps_addr = spec["cluster"]["chief"][0], spec["cluster"]["ps"]
    state = wd.file("state")

    def status(addr):
        return h.shard_status(addr, timeout=1)

    def start(kind, index=None, n=1):
        argv = [h.BIN[kind], "--job", job, "--state-dir", state]
        if index is not None:
            argv += ["--task-index", str(index)]
        return h.Proc(wd, "%s.%s.%d" % (kind, index, n), argv)

    ps = [start("psd", 0), start("psd", 1)]
    chief = start("chiefd")
    workers = [start("workerd", 0), start("workerd", 1)]
    procs = ps + [chief] + workers
    t_start = time.monotonic()
    h.wait_for("global_step %d" % kill_at, lambda: (lambda x: x is not None and x.initialized and x.global_step >= kill_at)(
        h.rpc_or_none(lambda: status(ps_addr[0]))), 300, procs, poll=0.02)
    g = status(ps_addr[0]).global_step
    h.kill_now(ps[1])
    t0 = time.monotonic()
    ps[1] = start("psd", 1, 2)
    low, base = [g], [None]

    def resumed():
        # the restarted shard is back, then global_step (read after it) moved 5 steps
        a1 = h.rpc_or_none(lambda: status(ps_addr[1]))
        a0 = h.rpc_or_none(lambda: status(ps_addr[0]))
        if a0 is None or not a0.initialized:
            return None
        low[0] = min(low[0], a0.global_step)
        if base[0] is None:
            if a1 is not None and a1.initialized:
                base[0] = a0.global_step
            return None
        return a0.global_step >= base[0] + 5
    h.wait_for("training again after the restore", resumed, 120, [chief, ps[0], ps[1]], poll=0.02)
    took = time.monotonic() - t0
    final = h.wait_state(chief_addr, "DONE", 600, [chief, ps[0], ps[1]])
    wall = time.monotonic() - t_start
    loss = final.losses[-1] if final.losses else None
    r = {"mode": mode, "kill_at": g, "recovery_s": round(took, 3), "global_steps_redone": g - low[0],
         "restored_step": loss.restored_step if loss else None,
         "shard_updates_lost": loss.steps_lost if loss else None,
         "test_accuracy": round(final.test_accuracy, 4), "wall_s": round(wall, 1)}
    for p in list(h._procs):
        if p.alive():
            p.kill(signal.SIGTERM)
    h.cleanup()
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--interval", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    import harness as h
    h.plain_rpc()
    h.require_built("psd", "workerd", "chiefd")
    rng = random.Random(a.seed)
    at = [rng.randint(a.steps // 5, a.steps // 2) for _ in range(a.trials)]
    rows = []
    for k in range(a.trials):
        for mode in ("job", "shard"):   # the same kill step for both
            rows.append(trial(h, a, mode, at[k]))
            h.log(json.dumps(rows[-1]))
    print("%-6s %8s %11s %14s %14s %9s %7s" % ("mode", "kill_at", "recovery_s", "steps_redone", "shard_lost",
                                               "accuracy", "wall_s"))
    for r in rows:
        print("%-6s %8d %11.2f %14d %14s %9.4f %7.1f" % (r["mode"], r["kill_at"], r["recovery_s"],
                                                         r["global_steps_redone"], r["shard_updates_lost"],
                                                         r["test_accuracy"], r["wall_s"]))
    summary = {}
    for mode in ("job", "shard"):
        rs = [r for r in rows if r["mode"] == mode]
        summary[mode] = {"recovery_s_median": statistics.median(r["recovery_s"] for r in rs),
                         "global_steps_redone_median": statistics.median(r["global_steps_redone"] for r in rs),
                         "shard_updates_lost_median": statistics.median(r["shard_updates_lost"] or 0 for r in rs),
                         "test_accuracy_median": statistics.median(r["test_accuracy"] for r in rs)}
    print(json.dumps({"trials": rows, "summary": summary, "seed": a.seed, "steps": a.steps,
                      "interval": a.interval}))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""ps.replicas 2: what it costs and what it saves (docs/performance.md, "Replicated shards").

  1. The cost, side by side in one run: a 2 ps + 2 workers job of --steps steps (the Fashion-MNIST MLP)
     with and without replicas, through shared memory and through gRPC (rpc.shared_memory false),
     --rounds rounds interleaved; examples/s and test accuracy of each (the chief's JobStatus at DONE).
  2. The long chaos run: tests/integration/test_replicas.py with --kills kill -9 of a random primary,
     its accuracy held to the median of the undisturbed replicated runs of part 1 (--tolerance points):
     0 steps lost, global_step never back, fail-over time p50 and max.

  --mode sync makes part 1's job training.mode sync; --model ctr makes it examples/ctr-widedeep.json's
  (embedding tables on both shards, gen-data rows; test AUC instead of accuracy). The chaos run is the
  MLP's, async, whatever these say. --security default runs part 1 under the default security (mutual
  TLS with the job's own CA, so gRPC pushes go as int8, as between hosts) instead of insecure.

Prints a table and one JSON line.

Usage: tests/bench/bench_failover.py [--build build] [--steps 3000] [--rounds 2] [--kills 20]
                                     [--chaos-steps 12000] [--tolerance 0.5] [--skip-chaos]
                                     [--mode async|sync] [--model mlp|ctr]
                                     [--security insecure|default] [--transports shm,grpc]
"""
import argparse, json, os, statistics, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))
if "--build" in sys.argv[:-1]:   # the harness finds the daemons through it when imported
    os.environ["PSFLEET_BUILD_DIR"] = os.path.abspath(sys.argv[sys.argv.index("--build") + 1])


def one(h, tr, steps, replicas, transport, mode="async", model="mlp", tls=False, replica_transport=None):
    wd = h.Workdir()
    rpc = {"shared_memory": transport == "shm"}
    base = h.ctr_example(h.ctr_data(wd, 200000, 20000)) if model == "ctr" else None
    if replicas:
        job, spec = tr.make_replicated_job(wd, steps, rpc=rpc, mode=mode, base=base,
                                           replica_transport=replica_transport)
    else:
        job, spec = h.make_job(wd, n_ps=2, n_workers=2, rpc=rpc, base=base,
                               training={"max_steps": steps, "report_every_steps": 20, "mode": mode},
                               supervisor={"save_checkpoint_steps": 500, "save_checkpoint_secs": 0,
                                           "save_summaries_secs": 0})
        spec["cluster"]["ps_backup"] = []
    j = tr.Job(wd, job, spec)
    if tls:   # security.auto_dir: the job's CA and the admin's pair are made there at start
        h.use_tls(os.path.join(wd.path, "tls"), spec)
    t0 = time.monotonic()
    j.start_all()
    ca = os.path.join(wd.path, "tls", spec["job"], "ca.crt")
    while tls and not os.path.exists(ca) and time.monotonic() - t0 < 60:   # the first daemon up makes it
        time.sleep(0.05)
    final = h.wait_state(j.chief_addr, "DONE", 900, j.daemons())
    r = {"replicas": 2 if replicas else 1, "transport": transport, "forward": replica_transport or "-",
         "examples_per_s": round(final.examples_per_s),
         "wall_s": round(time.monotonic() - t0, 1),
         "test_accuracy": round(final.test_auc if model == "ctr" else final.test_accuracy, 4)}
    h.cleanup()
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--chaos-steps", type=int, default=12000)
    ap.add_argument("--tolerance", type=float, default=0.5)
    ap.add_argument("--skip-chaos", action="store_true")
    ap.add_argument("--mode", choices=("async", "sync"), default="async", help="part 1's training.mode")
    ap.add_argument("--model", choices=("mlp", "ctr"), default="mlp",
                    help="part 1's model: the MLP, or examples/ctr-widedeep.json's (accuracy is then the test AUC)")
    ap.add_argument("--transports", default="shm,grpc", help="part 1's transports (comma-separated: shm, grpc)")
    ap.add_argument("--replica-transports", default="auto",
                    help="part 1's ps.replica_transport for the replicated runs (comma-separated: auto, the ring "
                         "to the backups on this host; grpc, Replicate calls as between hosts)")
    ap.add_argument("--security", choices=("insecure", "default"), default="insecure",
                    help="part 1's security.mode: insecure (plain TCP; gRPC pushes in float32 on loopback), or the "
                         "default (auto: mutual TLS with the job's own CA, gRPC pushes int8 as between hosts)")
    a = ap.parse_args()
    import harness as h
    import test_replicas as tr
    if a.security == "default" and not a.skip_chaos:
        ap.error("--security default measures the cost only (the chaos run's clients are plain): add --skip-chaos")
    if a.security == "insecure":
        h.plain_rpc()
    h.require_built("psd", "workerd", "chiefd")
    rows = []
    for _ in range(a.rounds):
        for transport in a.transports.split(","):
            for forward in [None] + a.replica_transports.split(","):
                rows.append(one(h, tr, a.steps, forward is not None, transport, a.mode, a.model,
                                a.security == "default", forward))
                h.log(json.dumps(rows[-1]))
    print("%-9s %8s %7s %13s %9s %7s" % ("transport", "replicas", "forward", "examples/s", "accuracy", "wall_s"))
    for r in rows:
        print("%-9s %8d %7s %13d %9.4f %7.1f" % (r["transport"], r["replicas"], r["forward"], r["examples_per_s"],
                                                 r["test_accuracy"], r["wall_s"]))
    summary = {}
    for transport in a.transports.split(","):
        for forward in ["-"] + a.replica_transports.split(","):
            rs = [r for r in rows if r["transport"] == transport and r["forward"] == forward]
            key = "%s_replicas1" % transport if forward == "-" else "%s_replicas2%s" % (
                transport, "" if forward == "auto" else "_" + forward)
            summary[key] = {
                "examples_per_s_median": statistics.median(r["examples_per_s"] for r in rs),
                "test_accuracy_median": statistics.median(r["test_accuracy"] for r in rs)}
    chaos = None
    if not a.skip_chaos:
        # the undisturbed replicated runs' accuracy, of the chaos run's length: one run of it
        ref = one(h, tr, a.chaos_steps, True, "shm")
        h.log("undisturbed %d steps with replicas: %s" % (a.chaos_steps, json.dumps(ref)))
        env = dict(os.environ, PSFLEET_BUILD_DIR=os.environ.get("PSFLEET_BUILD_DIR", ""))
        p = subprocess.run([sys.executable, os.path.join(os.path.dirname(HERE), "integration", "test_replicas.py"),
                            "--kills", str(a.kills), "--steps", str(a.chaos_steps), "--seed", "1",
                            "--accuracy-of", str(ref["test_accuracy"]), "--tolerance", str(a.tolerance)],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=3600)
        lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
        chaos = json.loads(lines[-1]) if lines else None
        chaos = {"rc": p.returncode, "undisturbed_accuracy": ref["test_accuracy"], "result": chaos,
                 "log_tail": [l for l in p.stderr.splitlines() if "kill " in l or "fail-over" in l or "FAIL" in l
                              or "Error" in l][-30:]}
        for l in chaos["log_tail"]:
            print(l)
    print(json.dumps({"rows": rows, "summary": summary, "chaos": chaos, "steps": a.steps, "mode": a.mode,
                      "model": a.model}))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Test accuracy under each rpc.compression (docs/performance.md, "Compression"): the demo job
(examples/fmnist-mlp.json, 1 ps) trained --steps steps through gRPC (rpc.shared_memory false, so that
every push is compressed as asked) with 1 and with 2 workers, --runs times each, interleaved. One worker
repeats itself exactly; two asynchronous workers do not (which push reaches psd first varies), so each
compression's figure is the median of its runs, with their spread, and the difference is taken against
the median of the uncompressed runs.

Prints one JSON line: per compression and worker count the accuracies, their median, and the median's
difference from `none` in points.

Usage: tests/bench/bench_compression_accuracy.py [--build build] [--steps 3000] [--runs 3]
                                                 [--compressions none,bf16,int8,topk:0.01] [--workers 1,2]
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--job", default=os.path.join(ROOT, "examples", "fmnist-mlp.json"))
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--compressions", default="none,bf16,int8,topk:0.01")
    ap.add_argument("--workers", default="1,2")
    a = ap.parse_args()
    psfleet = os.path.join(a.build, "services", "cli", "psfleet")
    comps = a.compressions.split(",")
    workers = [int(w) for w in a.workers.split(",")]
    jobs = {}
    tmp = tempfile.mkdtemp(prefix="bench-comp-acc-")
    for c in comps:
        j = json.load(open(a.job))
        j["job"] = "compacc"
        j.setdefault("rpc", {}).update({"shared_memory": False, "compression": c})
        # plain TCP: the compression's effect alone (under TLS the bytes are the same)
        j["security"] = {"mode": "insecure"}
        jobs[c] = os.path.join(tmp, "job-%s.json" % c.replace(":", "-"))
        json.dump(j, open(jobs[c], "w"))
    acc = {(c, w): [] for c in comps for w in workers}
    for r in range(a.runs):
        for w in workers:
            for c in comps:
                p = subprocess.run([psfleet, "local", jobs[c], "--quiet", "--max-steps", str(a.steps), "--ps", "1",
                                    "--workers", str(w)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   timeout=1200)
                if p.returncode != 0:
                    sys.exit("psfleet local %s --workers %d: exit %d\n%s" % (c, w, p.returncode, p.stderr[-3000:]))
                res = json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1])
                acc[(c, w)].append(res["test_accuracy"])
                print("run %d, %d worker(s), %s: %.4f" % (r + 1, w, c, res["test_accuracy"]), file=sys.stderr)
    out = {"steps": a.steps, "runs": a.runs, "results": []}
    for w in workers:
        base = statistics.median(acc[("none", w)]) if ("none", w) in acc else None
        for c in comps:
            xs = acc[(c, w)]
            m = statistics.median(xs)
            out["results"].append({"compression": c, "workers": w, "accuracies": xs, "median": round(m, 4),
                                   "spread": round(max(xs) - min(xs), 4),
                                   "points_from_none": None if base is None else round(100 * (m - base), 2)})
    for f in jobs.values():
        os.unlink(f)
    os.rmdir(tmp)
    print(json.dumps(out))


if __name__ == "__main__":
    main()

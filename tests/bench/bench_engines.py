#!/usr/bin/python3
"""A job file's layer list trained by the layer-list engine and by the graph engine, side by side in one
run: each job trained by a build whose CPU path runs layer lists on model.c's layer code (--base-build,
the tree before the switch) and by this one (--build: the graph engine), alternated R times, with
`psfleet local`. The jobs: the demo MLP standalone and as 1 ps + 1 worker (shared memory, the job's
default security), and the CNN standalone. Prints one JSON line per run and, per job, one with the best
of each build and their ratio, with the test accuracy each reached (docs/performance.md, "One engine").

    bench_engines.py --build BUILD --base-build BASE [--steps S] [--cnn-steps S] [--rounds R]
"""
import argparse
import json
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))


def train(build, job, steps, extra):
    cmd = [os.path.join(build, "services", "cli", "psfleet"), "local", job, "--quiet", "--max-steps", str(steps)]
    p = subprocess.run(cmd + extra, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise SystemExit("failed: %s (exit %d)\n%s" % (" ".join(cmd + extra), p.returncode, p.stderr[-3000:]))
    return json.loads([l for l in p.stdout.splitlines() if l.startswith("{")][-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--base-build", required=True)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--cnn-steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    mlp = os.path.join(SOURCE, "examples", "fmnist-mlp.json")
    cnn = os.path.join(SOURCE, "examples", "fmnist-cnn.json")
    jobs = [("mlp-standalone", mlp, a.steps, ["--standalone"]),
            ("mlp-1ps+1worker", mlp, a.steps, ["--ps", "1", "--workers", "1"]),
            ("cnn-standalone", cnn, a.cnn_steps, ["--standalone"])]
    best = {}
    for r in range(a.rounds):
        for name, job, steps, extra in jobs:
            for engine, build in (("layers", a.base_build), ("graph", a.build)):
                res = train(build, job, steps, extra)
                key = (name, engine)
                if key not in best or res["examples_per_s"] > best[key]["examples_per_s"]:
                    best[key] = res
                print(json.dumps({"round": r, "job": name, "engine": engine,
                                  "examples_per_s": round(res["examples_per_s"], 1),
                                  "test_accuracy": res.get("test_accuracy")}), flush=True)
    for name, _, _, _ in jobs:
        lay, gra = best[(name, "layers")], best[(name, "graph")]
        print(json.dumps({"best": True, "job": name, "layers_examples_per_s": round(lay["examples_per_s"], 1),
                          "graph_examples_per_s": round(gra["examples_per_s"], 1),
                          "ratio": round(gra["examples_per_s"] / lay["examples_per_s"], 3),
                          "layers_test_accuracy": lay.get("test_accuracy"),
                          "graph_test_accuracy": gra.get("test_accuracy")}), flush=True)


if __name__ == "__main__":
    main()

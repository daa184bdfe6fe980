#!/usr/bin/python3
"""A graph model's split weight moved whole against in row blocks, side by side in one run: the DCN-v2
example (examples/models/dcnv2.json: its 429 x 429 cross weight, 736 KB, is split into row ranges at
the default ps.split_bytes of 256 KiB) trained by 1 ps + 1 worker with every tensor through loopback
gRPC (rpc.shared_memory false), once by a build whose graph moves a split weight whole (--base-build,
the tree before graph_exec_set_blocks) and once by this one (--build), alternated R times. Prints one
JSON line per run and one with the best of each (docs/performance.md, "Row blocks in the graph").

    bench_graph_blocks.py --build BUILD --base-build BASE [--rows N] [--steps S] [--rounds R]

Needs Debian's python3-torch (export.py); run it with /usr/bin/python3.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--base-build", required=True)
    ap.add_argument("--rows", type=int, default=300000)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    wd = tempfile.mkdtemp(prefix="graph-blocks-")
    subprocess.run([sys.executable, os.path.join(SOURCE, "examples", "models", "export.py"), "--out", wd, "--model",
                    "dcnv2"], check=True, stdout=subprocess.DEVNULL)
    psfleet = os.path.join(a.build, "services", "cli", "psfleet")
    subprocess.run([psfleet, "gen-data", "--rows", str(a.rows), "--out", os.path.join(wd, "train.tsv.gz"),
                    "--test-rows", "20000", "--test-out", os.path.join(wd, "test.tsv.gz"), "--vocab", "1000"],
                   check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(SOURCE, "examples", "models", "dcnv2.json")) as f:
        job = json.load(f)
    ports = free_ports(3)
    job["cluster"] = {"chief": ["127.0.0.1:%d" % ports[0]], "ps": ["127.0.0.1:%d" % ports[1]],
                      "worker": ["127.0.0.1:%d" % ports[2]]}
    job["data"]["dir"] = wd
    job["training"]["max_steps"] = a.steps
    job["rpc"] = {"shared_memory": False}
    path = os.path.join(wd, "dcnv2.json")
    with open(path, "w") as f:
        json.dump(job, f)
    best = {}
    for r in range(a.rounds):
        for name, build in (("whole", a.base_build), ("blocks", a.build)):
            p = subprocess.run([os.path.join(build, "services", "cli", "psfleet"), "local", path, "--quiet"],
                               check=True, capture_output=True, text=True)
            res = json.loads(p.stdout.strip().splitlines()[-1])
            best[name] = max(best.get(name, 0.0), res["examples_per_s"])
            print(json.dumps({"round": r, "moved": name, "examples_per_s": round(res["examples_per_s"], 1),
                              "test_auc": res.get("test_auc"), "cpu_s": res.get("cpu_s")}), flush=True)
    print(json.dumps({"best": True, "whole_examples_per_s": round(best["whole"], 1),
                      "blocks_examples_per_s": round(best["blocks"], 1),
                      "ratio": round(best["blocks"] / best["whole"], 3)}))


if __name__ == "__main__":
    main()

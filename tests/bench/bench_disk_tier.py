#!/usr/bin/python3
"""The disk tier against all rows in DRAM (docs/sparse.md, "Disk tier"; docs/performance.md): `psfleet
gen-data`'s Criteo-like rows, examples/ctr-widedeep.json trained one pass with 1 ps and 2 workers, once
with its tables unbounded in DRAM and once with each table bounded to --dram-rows rows in DRAM and
disk_tier on (the rest on the psd's disk, under the job's state directory). Prints, per run, examples/s,
the test AUC and the rows each table holds at the end (from the final checkpoint, which includes the rows
on disk). One JSON line.

Usage: tests/bench/bench_disk_tier.py [--build build] [--rows 1000000] [--test-rows 100000]
                                      [--dram-rows 200000]
"""
import argparse, json, os, sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))
if "--build" in sys.argv[:-1]:   # the harness finds the daemons through it when imported
    os.environ["PSFLEET_BUILD_DIR"] = os.path.abspath(sys.argv[sys.argv.index("--build") + 1])

from bench_admission import train_runs  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build")
    ap.add_argument("--rows", type=int, default=10 ** 6)
    ap.add_argument("--test-rows", type=int, default=10 ** 5)
    ap.add_argument("--dram-rows", type=int, default=200000)
    a = ap.parse_args()
    runs = [("dram", {}), ("tier", {"max_rows": a.dram_rows, "evict_policy": "lru", "disk_tier": True})]
    out = train_runs(a, runs, timeout=3600)
    out["dram_rows"] = a.dram_rows
    print(json.dumps(out))


if __name__ == "__main__":
    import harness
    harness.main(main)

#!/usr/bin/python3
"""Admission on power-law ids (docs/sparse.md, "Admission"; docs/performance.md): `psfleet gen-data`'s
Criteo-like rows (26 fields of tokens with power-law frequencies, labels from a planted logistic
model), examples/ctr-widedeep.json trained one pass with 1 ps and 2 workers, once as it is and once
with admit_after N on both tables; with --max-rows M, also bounded to M rows per table under lru and
under lfu. Prints, per run, the rows each table holds at the end (from the final checkpoint; without
a bound nothing is evicted, so every row made) and the test AUC, and the planted model's AUC.
One JSON line.

Usage: tests/bench/bench_admission.py [--build build] [--rows 1000000] [--test-rows 100000] [--admit-after 2]
                                      [--max-rows M]
"""
import argparse, json, os, struct, sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))
if "--build" in sys.argv[:-1]:   # the harness finds the daemons through it when imported
    os.environ["PSFLEET_BUILD_DIR"] = os.path.abspath(sys.argv[sys.argv.index("--build") + 1])


def table_rows(wd, job):
    ck = sorted(os.path.join(rt, fn) for rt, _, fs in os.walk(wd.path) for fn in fs
                if fn.endswith(".safetensors") and os.sep + job + os.sep in rt + os.sep)
    assert ck, "no checkpoint of job %s" % job
    with open(ck[-1], "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
    return {k[4:-4]: v["shape"][0] for k, v in head.items() if k.startswith("emb/") and k.endswith("/ids")}


def train_runs(a, runs, timeout=1800):
    """Generates a.rows training and a.test_rows test rows, then trains examples/ctr-widedeep.json one pass
    with 1 ps and 2 workers once per (name, keys) of runs, keys set on both tables. Returns the JSON
    object to print: per run its keys, test AUC, examples/s, wall time and rows per table."""
    import harness as h
    from test_sparse_job import gen
    h.require_built("psd", "workerd", "chiefd", "psfleet")
    wd = h.Workdir()
    data = wd.file("data")
    os.makedirs(data)
    meta = gen(wd, a.rows, os.path.join(data, "train.tsv.gz"), a.test_rows, os.path.join(data, "test.tsv.gz"))
    out = {"train_rows": a.rows, "test_rows": a.test_rows, "planted_auc": meta["planted_auc"]}
    for name, keys in runs:
        base = h.ctr_example(data, name, keys)
        steps = a.rows // 256
        path, _ = h.make_job(wd, name + ".json", n_ps=1, n_workers=2, base=base,
                             training={"max_steps": steps, "report_every_steps": 100})
        r = h.local_result(wd, path, args=["--keep-state"], name=name, timeout=timeout)
        out[name] = {"keys": keys, "test_auc": r["test_auc"], "rows": table_rows(wd, name),
                     "examples_per_s": r["examples_per_s"], "wall_s": r["wall_s"]}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build")
    ap.add_argument("--rows", type=int, default=10 ** 6)
    ap.add_argument("--test-rows", type=int, default=10 ** 5)
    ap.add_argument("--admit-after", type=int, default=2)
    ap.add_argument("--max-rows", type=int, default=0)
    a = ap.parse_args()
    runs = [("plain", {}), ("admit", {"admit_after": a.admit_after})]
    if a.max_rows:
        runs += [(pol, {"max_rows": a.max_rows, "evict_policy": pol}) for pol in ("lru", "lfu")]
    print(json.dumps(train_runs(a, runs)))


if __name__ == "__main__":
    import harness
    harness.main(main)

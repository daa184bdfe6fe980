#!/usr/bin/python3
"""Deltas for serving (docs/serving.md, "Following a job with deltas"; docs/performance.md): the CTR
example (examples/ctr-widedeep.json, `psfleet local`, 1 ps + 1 worker) on --rows of `psfleet gen-data`
(fewer steps than an epoch, so that each step meets ids no step met before), a checkpoint every --every
steps, increments after the first. Then `psfleet export --since A --step B` from the first increment A to
each later checkpoint B: the rows changed, the tombstones, the bytes of the delta's tables and their
payload (8 bytes an id, 4 a value), against the whole export's tables of B (--max-inline-rows 1). One JSON
line per delta.

Usage: tests/bench/bench_export_delta.py [--build build] [--rows 300000] [--steps 400] [--every 50]
"""
import argparse, json, os, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))
if "--build" in sys.argv[:-1]:   # the harness finds the programs through it when imported
    os.environ["PSFLEET_BUILD_DIR"] = os.path.abspath(sys.argv[sys.argv.index("--build") + 1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build")
    ap.add_argument("--rows", type=int, default=300000)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--every", type=int, default=50)
    a = ap.parse_args()
    import harness as h
    from test_export_delta import delta_bytes, records
    from test_sparse_job import gen_split
    wd = h.Workdir()
    data = gen_split(wd, a.rows, 1000)
    with open(os.path.join(h.SOURCE_DIR, "examples", "ctr-widedeep.json")) as f:
        base = json.load(f)
    base["job"] = "ctrbench"
    base["data"]["dir"] = data
    base["supervisor"] = {"save_checkpoint_steps": a.every, "save_checkpoint_secs": 0, "keep_checkpoints": 1000,
                          "full_checkpoint_every": 1000}
    job, _ = h.make_job(wd, "ctrbench.json", n_ps=1, n_workers=1, base=base,
                        training={"max_steps": a.steps, "report_every_steps": 100})
    h.local_result(wd, job, args=["--keep-state"], name="ctrbench", timeout=1200)
    db = [os.path.join(r, "chief.db") for r, _, fs in os.walk(wd.path) if "chief.db" in fs and
          os.path.basename(r) == "ctrbench"][0]
    common = ["--job", job, "--state-dir", os.path.dirname(os.path.dirname(db))]
    recs = records(db)
    incs = [r[0] for r in recs if r[2] is not None]

    def export(*args):
        t0 = time.monotonic()
        p = subprocess.run([h.BIN["psfleet"], "export"] + common + list(args), capture_output=True, text=True,
                           timeout=600, env=h.child_env())
        assert p.returncode == 0, p.stderr
        return time.monotonic() - t0

    for b in [r[0] for r in recs if r[0] > incs[0]]:
        d, full = wd.file("delta-%d" % b), wd.file("full-%d" % b)
        secs = export("--since", str(incs[0]), "--step", str(b), "--out", d)
        export("--step", str(b), "--out", full, "--max-inline-rows", "1")
        m, size, payload = delta_bytes(d)
        whole = sum(os.path.getsize(os.path.join(full, "tables", f)) for f in os.listdir(os.path.join(full, "tables")))
        changed = sum(t["changed"] for t in m["tables"])
        print(json.dumps({"from": incs[0], "to": b, "steps": b - incs[0], "changed": changed,
                          "tombstones": sum(t["tombstones"] for t in m["tables"]),
                          "rows": sum(t["rows"] for t in m["tables"]), "delta_bytes": size, "payload": payload,
                          "bytes_per_changed": round(size / max(changed, 1), 2), "whole_bytes": whole,
                          "export_s": round(secs, 2)}), flush=True)


if __name__ == "__main__":
    main()

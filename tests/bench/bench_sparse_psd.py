#!/usr/bin/python3
"""A psd's memory with a large embedding table (docs/performance.md, "Embedding tables"): a job of
1 ps with one table of dim 16 and Adagrad, its chiefd to initialize the shard, and this script as a
worker creating N rows (default 10^7) through SparseExchange pulls in pages of 65,536 ids. Then
psd's VmRSS against the raw bytes of the rows and their accumulators (N x 16 x 4 x 2), and against
the same psd's RSS before any row, and against `psfleet plan`'s figure for the psd (the table's
expected_rows set to N). Prints one JSON line.

Usage: tests/bench/bench_sparse_psd.py [--build build] [--rows 10000000]
"""
import argparse, json, os, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))
if "--build" in sys.argv[:-1]:   # the harness finds the daemons through it when imported
    os.environ["PSFLEET_BUILD_DIR"] = os.path.abspath(sys.argv[sys.argv.index("--build") + 1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build")
    ap.add_argument("--rows", type=int, default=10 ** 7)
    ap.add_argument("--page", type=int, default=65536)
    a = ap.parse_args()
    import harness as h
    import numpy as np
    s = h.stubs()
    wd = h.Workdir()
    base = {"model": {"input": [13], "head": "logistic", "seed": 1,
                      "embeddings": [{"name": "t", "fields": "all", "dim": 16, "expected_rows": a.rows}],
                      "layers": [{"type": "dense", "units": 1}]},
            "data": {"dir": wd.path, "format": "criteo", "train_files": ["none.tsv"]},
            "training": {"optimizer": "adagrad", "sparse_optimizer": "adagrad", "max_steps": 10 ** 9},
            "supervisor": {"save_checkpoint_steps": 0, "save_checkpoint_secs": 0, "save_summaries_secs": 0}}
    h.plain_rpc()   # its own gRPC client calls psd as a worker, without certificates
    job, spec = h.make_job(wd, n_ps=1, n_workers=1, base=base)
    chief, ps, fp = h.chief_and_ps(wd, job, spec)
    ps_addr = spec["cluster"]["ps"][0]
    before = h.proc_bytes(ps.pid)
    caller = s.tensor_pb2.Caller(fingerprint=fp, task="worker:0")
    t0 = time.monotonic()
    with h.channel(ps_addr) as ch:
        stub = s.ps_pb2_grpc.ParameterServerStub(ch)
        for at in range(0, a.rows, a.page):
            n = min(a.page, a.rows - at)
            # ids spread over 64 bits, as hashed tokens are
            ids = (np.arange(at, at + n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)).astype("<u8")
            hdr = s.ps_pb2.SparseExchangeHeader(caller=caller, worker=0, table=0, create=True,
                                                pull_ids=ids.tobytes())
            stub.SparseExchange(s.ps_pb2.SparseExchangeRequest(header=hdr), timeout=60)
        st = stub.GetShardStatus(s.ps_pb2.ShardStatusRequest(), timeout=5)
    el = time.monotonic() - t0
    after = h.proc_bytes(ps.pid)
    raw = a.rows * 16 * 4 * 2
    import subprocess
    r = subprocess.run([h.BIN["psfleet"], "plan", "--json", job], capture_output=True, text=True,
                       env=h.child_env(), timeout=60, check=True)
    planned = json.loads(r.stdout)[0]["total"]
    t = st.tables[0]
    print(json.dumps({"rows": t.rows, "raw_bytes": raw, "table_bytes": t.bytes, "psd_rss": after,
                      "psd_rss_before": before, "rss_over_raw": round(after / raw, 4),
                      "growth_over_raw": round((after - before) / raw, 4), "rows_per_s": round(a.rows / el),
                      "plan_bytes": planned, "rss_over_plan": round(after / planned, 4)}))
    assert t.rows == a.rows, t


if __name__ == "__main__":
    import harness
    harness.main(main)

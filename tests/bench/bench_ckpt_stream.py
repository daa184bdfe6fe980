#!/usr/bin/python3
"""Checkpoints of a large embedding table (docs/checkpoints.md, "Streaming" and "Incremental
checkpoints"; docs/performance.md): a job of 1 ps with one table of dim 16 and Adagrad, its chiefd, and
this script as a worker creating N rows (default 10^7) through SparseExchange pulls. Then a checkpoint
(Supervisor.SaveCheckpoint: full, the first of this chiefd) with chiefd's peak RSS (VmHWM) before and
after it; then, with --incremental, pushes of gradients to a fraction of the rows (default 1 %) and a
second checkpoint, incremental (supervisor.full_checkpoint_every 1000), its time and size against the
full one's; with --restore, psd killed (-9) and started again, the chief restoring it from the newest
checkpoint (the chain with --incremental), with chiefd's VmHWM before and after and the restore's time.
Prints one JSON line.

Usage: tests/bench/bench_ckpt_stream.py [--build build] [--rows 10000000] [--incremental] [--changed 0.01]
                                        [--restore]
--build may name the build of an older tree (without --incremental: its chiefd need not know the key).
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
    ap.add_argument("--incremental", action="store_true")
    ap.add_argument("--changed", type=float, default=0.01)
    ap.add_argument("--restore", action="store_true")
    a = ap.parse_args()
    import harness as h
    import numpy as np
    s = h.stubs()
    wd = h.Workdir()
    sup = {"save_checkpoint_steps": 0, "save_checkpoint_secs": 0, "save_summaries_secs": 0, "keep_checkpoints": 5}
    if a.incremental:
        sup["full_checkpoint_every"] = 1000
    base = {"model": {"input": [13], "head": "logistic", "seed": 1,
                      "embeddings": [{"name": "t", "fields": "all", "dim": 16}],
                      "layers": [{"type": "dense", "units": 1}]},
            "data": {"dir": wd.path, "format": "criteo", "train_files": ["none.tsv"]},
            "training": {"optimizer": "adagrad", "sparse_optimizer": "adagrad", "max_steps": 10 ** 9},
            "supervisor": sup}
    h.plain_rpc()   # its own gRPC clients call the daemons as a worker and an admin, without certificates
    job, spec = h.make_job(wd, n_ps=1, n_workers=1, base=base)
    chief, ps, fp = h.chief_and_ps(wd, job, spec)
    ps_addr, chief_addr = spec["cluster"]["ps"][0], spec["cluster"]["chief"][0]
    caller = s.tensor_pb2.Caller(fingerprint=fp, task="worker:0")

    def ids_of(at, n):
        # ids spread over 64 bits, as hashed tokens are
        return (np.arange(at, at + n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)).astype("<u8")

    with h.channel(ps_addr) as ch, h.channel(chief_addr) as cch:
        stub = s.ps_pb2_grpc.ParameterServerStub(ch)
        sv = s.supervisor_pb2_grpc.SupervisorStub(cch)
        for at in range(0, a.rows, a.page):
            n = min(a.page, a.rows - at)
            hdr = s.ps_pb2.SparseExchangeHeader(caller=caller, worker=0, table=0, create=True,
                                                pull_ids=ids_of(at, n).tobytes())
            stub.SparseExchange(s.ps_pb2.SparseExchangeRequest(header=hdr), timeout=60)
        pulled = stub.Pull(s.ps_pb2.PullRequest(header=s.ps_pb2.PullHeader(caller=caller)), timeout=30).tensors[0]

        def step():
            h.zero_step(stub, caller, pulled)

        def save():
            t0 = time.monotonic()
            c = sv.SaveCheckpoint(s.supervisor_pb2.SaveCheckpointRequest(reason="bench"), timeout=1800).checkpoint
            return time.monotonic() - t0, c

        step()
        hwm0 = h.proc_bytes(chief.pid, "VmHWM")
        full_s, full = save()
        out = {"rows": a.rows, "dim": 16, "optimizer": "adagrad", "raw_bytes": a.rows * 16 * 4 * 2,
               "chief_hwm_before": hwm0, "chief_hwm_after_full": h.proc_bytes(chief.pid, "VmHWM"),
               "full_s": round(full_s, 2), "full_bytes": full.bytes, "psd_rss": h.proc_bytes(ps.pid, "VmRSS")}
        if a.incremental:
            k = int(a.rows * a.changed)
            pick = np.random.default_rng(1).choice(a.rows, size=k, replace=False).astype(np.uint64)
            for at in range(0, k, a.page):
                ids = (pick[at:at + a.page] * np.uint64(0x9E3779B97F4A7C15)).astype("<u8")
                n = len(ids)
                g = s.tensor_pb2.Tensor(name="grads", dtype=s.tensor_pb2.DTYPE_FLOAT32, shape=[n, 16],
                                        data=np.full((n, 16), 0.01, dtype="<f4").tobytes())
                hdr = s.ps_pb2.SparseExchangeHeader(caller=caller, worker=0, table=0, create=True,
                                                    push_ids=ids.tobytes())
                stub.SparseExchange(s.ps_pb2.SparseExchangeRequest(header=hdr, tensors=[g]), timeout=60)
            step()
            inc_s, inc = save()
            assert inc.incremental and inc.parent_step == full.global_step, inc
            out.update({"changed_rows": k, "incremental_s": round(inc_s, 2), "incremental_bytes": inc.bytes,
                        "time_ratio": round(inc_s / full_s, 4), "size_ratio": round(inc.bytes / full.bytes, 4),
                        "chief_hwm_after_incremental": h.proc_bytes(chief.pid, "VmHWM")})
    if a.restore:
        # the shard lost: the chief restores it from the newest checkpoint
        hwm = h.proc_bytes(chief.pid, "VmHWM")
        h.kill_now(ps)
        t0 = time.monotonic()
        ps = h.daemon(wd, "psd", job, 0, name="psd.2")
        st = h.wait_shard_initialized(ps_addr, "ps:0 restored", 3600, [ps, chief])
        out.update({"restore_s": round(time.monotonic() - t0, 2), "restored_rows": st.tables[0].rows,
                    "chief_hwm_before_restore": hwm, "chief_hwm_after_restore": h.proc_bytes(chief.pid, "VmHWM")})
    print(json.dumps(out))


if __name__ == "__main__":
    import harness
    harness.main(main)

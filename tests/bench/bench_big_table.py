#!/usr/bin/python3
"""A table past RAM (issue #31; docs/sparse.md, "Disk tier"; docs/performance.md): one psd holding an
embedding table of --vocab rows (default 10^8) x dim 16 with Adagrad under ps.memory_limit_bytes
(default 4 GB), the rows past the limit on its disk tier, trained by two workers on `psfleet gen-data`'s
Criteo-like rows (power-law tokens hashed into the table), against the same job uncapped.

Runs, each its own job (1 ps + 2 workers; chiefd, psd and workerd started as daemons):
  capped   vocab rows, every row made first (SparseExchange pages from this script, as a table that has
           grown to vocab rows over a long job would hold them), ps.memory_limit_bytes, disk_tier, lru;
  fits     the same vocab and data, no limit, no prefill: the table holds what the data touches and fits;
  small    a table of --small-vocab rows (default 10^7), every row made first, no limit (the examples/s
           reference of a table that fits in DRAM whole).
Per run: psd's and chiefd's peak RSS (VmHWM; chiefd's includes the final checkpoint of the whole table,
which the job writes at its end), the time to make the rows, examples/s of the training (global_step
polled from the chief between the workers' start and max_steps), the final checkpoint's bytes and time,
the test AUC. One JSON line; --runs picks and orders the runs.

Usage: tests/bench/bench_big_table.py [--build build] [--vocab 100000000] [--small-vocab 10000000]
           [--limit 4000000000] [--rows 1000000] [--test-rows 100000] [--runs capped,fits,small]
Needs about 2.5x the table's bytes of free disk (the disk tier, and the final checkpoint spooled then
written) and, for `fits`, the rows the data touches in DRAM.
"""
import argparse, json, os, sys, threading, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))
if "--build" in sys.argv[:-1]:   # the harness finds the daemons through it when imported
    os.environ["PSFLEET_BUILD_DIR"] = os.path.abspath(sys.argv[sys.argv.index("--build") + 1])

PAGE = 65536


class Peak(threading.Thread):
    """VmHWM of some processes, read every half second while they live (VmHWM is gone with them)."""

    def __init__(self, procs):
        super().__init__(daemon=True)
        self.procs, self.peak, self.stop = procs, {p.name: 0 for p in procs}, False

    def run(self):
        import harness as h
        while not self.stop:
            for p in self.procs:
                try:
                    self.peak[p.name] = max(self.peak[p.name], h.proc_bytes(p.p.pid, "VmHWM"))
                except (OSError, ValueError):
                    pass
            time.sleep(0.5)


def prefill(s, h, ps_addr, fp, vocab):
    """Makes rows 0..vocab-1 of table 0 (ids are row numbers in a table with a vocab)."""
    import numpy as np
    caller = s.tensor_pb2.Caller(fingerprint=fp, task="worker:0")
    t0 = time.monotonic()
    with h.channel(ps_addr) as ch:
        stub = s.ps_pb2_grpc.ParameterServerStub(ch)
        for at in range(0, vocab, PAGE):
            n = min(PAGE, vocab - at)
            hdr = s.ps_pb2.SparseExchangeHeader(caller=caller, worker=0, table=0, create=True,
                                                pull_ids=np.arange(at, at + n, dtype="<u8").tobytes())
            stub.SparseExchange(s.ps_pb2.SparseExchangeRequest(header=hdr), timeout=300)
            if at // PAGE % 160 == 0:
                h.log("prefill: %d of %d rows, %.0f s" % (at + n, vocab, time.monotonic() - t0))
    return time.monotonic() - t0


def one_run(a, wd, data, name, vocab, capped, fill):
    import harness as h
    s = h.stubs()
    base = h.ctr_example(data, name)
    base["model"]["embeddings"] = [{"name": "deep", "fields": "all", "dim": 16, "vocab": vocab}]
    ps = {}
    if capped:
        base["model"]["embeddings"][0].update({"disk_tier": True, "evict_policy": "lru"})
        ps["memory_limit_bytes"] = a.limit
    steps = a.rows // 256
    # ready_timeout_secs: the chief waits for the workers while this script makes the rows
    sup = {"save_checkpoint_steps": 0, "save_checkpoint_secs": 0, "save_summaries_secs": 0, "keep_checkpoints": 1,
           "ready_timeout_secs": 86400}
    path, spec = h.make_job(wd, name + ".json", n_ps=1, n_workers=2, base=base, ps=ps, supervisor=sup,
                            training={"max_steps": steps, "report_every_steps": 100})
    chief, psd, fp = h.chief_and_ps(wd, path, spec, timeout=120)
    peak = Peak([chief, psd])
    peak.start()
    chief_addr, ps_addr = spec["cluster"]["chief"][0], spec["cluster"]["ps"][0]
    out = {"vocab": vocab, "capped": capped, "prefilled": fill, "steps": steps}
    if fill:
        out["prefill_s"] = round(prefill(s, h, ps_addr, fp, vocab), 1)
        st = h.shard_status(ps_addr, timeout=30)
        out["psd_rss_after_prefill"] = h.proc_bytes(psd.p.pid, "VmRSS")
        h.log("%s: %d rows made in %.0f s; psd RSS %.2f GB" % (name, vocab, out["prefill_s"],
                                                            out["psd_rss_after_prefill"] / 1e9))
        del st
    workers = [h.daemon(wd, "workerd", path, i) for i in range(2)]
    t0, last = time.monotonic(), 0
    t_end = None
    while True:
        st = h.job_status(chief_addr, timeout=30)
        if st.global_step >= steps and t_end is None:
            t_end = time.monotonic()
        if st.state in (s.supervisor_pb2.JOB_STATE_DONE, s.supervisor_pb2.JOB_STATE_FAILED):
            break
        for p in workers + [chief, psd]:
            if not p.alive() and p.p.returncode != 0:
                raise AssertionError("%s exited with %s:\n%s" % (p.name, p.p.returncode, p.stderr()[-3000:]))
        if time.monotonic() - t0 > a.timeout:
            raise AssertionError("%s: not done after %d s (global_step %d)" % (name, a.timeout, st.global_step))
        if st.global_step - last >= 500:
            last = st.global_step
            h.log("%s: global_step %d, %.0f s" % (name, last, time.monotonic() - t0))
        time.sleep(0.2)
    t_done = time.monotonic()
    assert st.state == s.supervisor_pb2.JOB_STATE_DONE, st.reason
    out.update({"examples_per_s": round(steps * 256 / ((t_end or t_done) - t0), 1),
                "train_s": round((t_end or t_done) - t0, 1), "end_s": round(t_done - (t_end or t_done), 1),
                "test_auc": round(st.test_auc, 4), "checkpoint_bytes": st.last_checkpoint.bytes,
                "checkpoint_trigger": st.last_checkpoint.trigger})
    for p in workers:
        p.wait(60)
    for p in (chief, psd):   # done: they serve the job's status until stopped
        p.p.terminate()
        p.wait(120)
    peak.stop = True
    peak.join()
    out["psd_hwm"], out["chief_hwm"] = peak.peak[psd.name], peak.peak[chief.name]
    h.log("%s: %s" % (name, json.dumps(out)))
    # the next run needs the disk: this one's checkpoints and disk tier go
    for sub in ("state",):
        d = wd.file(sub)
        if os.path.isdir(d):
            import shutil
            shutil.rmtree(d, ignore_errors=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build")
    ap.add_argument("--vocab", type=int, default=10 ** 8)
    ap.add_argument("--small-vocab", type=int, default=10 ** 7)
    ap.add_argument("--limit", type=int, default=4 * 10 ** 9)
    ap.add_argument("--rows", type=int, default=10 ** 6)
    ap.add_argument("--test-rows", type=int, default=10 ** 5)
    ap.add_argument("--runs", default="capped,fits,small")
    ap.add_argument("--timeout", type=int, default=6 * 3600)
    a = ap.parse_args()
    import harness as h
    from test_sparse_job import gen
    h.require_built("psd", "workerd", "chiefd", "psfleet")
    h.plain_rpc()   # this script makes the rows with its own gRPC client, as worker:0, without certificates
    wd = h.Workdir()
    data = wd.file("data")
    os.makedirs(data)
    meta = gen(wd, a.rows, os.path.join(data, "train.tsv.gz"), a.test_rows, os.path.join(data, "test.tsv.gz"))
    out = {"train_rows": a.rows, "test_rows": a.test_rows, "planted_auc": meta["planted_auc"],
           "limit": a.limit, "dim": 16, "optimizer": "adagrad"}
    runs = {"capped": (a.vocab, True, True), "fits": (a.vocab, False, False), "small": (a.small_vocab, False, True)}
    for name in a.runs.split(","):
        out[name] = one_run(a, wd, data, name, *runs[name])
    if "capped" in out and "fits" in out:
        out["auc_difference"] = round(abs(out["capped"]["test_auc"] - out["fits"]["test_auc"]), 4)
    if "capped" in out and "small" in out:
        out["examples_per_s_ratio"] = round(out["capped"]["examples_per_s"] / out["small"]["examples_per_s"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    import harness
    harness.main(main)

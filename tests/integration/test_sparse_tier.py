"""The disk tier of embedding tables on a real psd (docs/sparse.md, "Disk tier"): a table with max_rows and
disk_tier, filled past its bound and trained through SparseExchange, answers exactly as the same table
unbounded (every pulled row bit-equal), keeps at most its bound in DRAM with the rest on disk, counts it in
GetShardStatus, /metrics and `psfleet top`, and stays within `psfleet plan`'s figure; a tier directory that
cannot be made stops psd with exit 74; a `psfleet local` job whose tables hold 2,000 rows each in DRAM
reaches the test AUC of the same job unbounded."""
import os
import re
import struct
import subprocess
import sys
import urllib.request

import harness as h
sys.path.insert(0, os.path.join(h.SOURCE_DIR, "tests", "bench"))
from bench_admission import table_rows  # noqa: E402
from test_sparse_bounds import plan
from test_sparse_job import gen

CAP = 20000       # rows of "big" in DRAM (dim 16, adagrad)
IDS = 60000       # ids it sees: two thirds of them end on disk
CHUNK = 2048      # ids per message: a batch's worth, as the plan's buffers count them


def model(extra):
    e = {"name": "big", "fields": "all", "dim": 16, "evict_policy": "lru"}
    e.update(extra)
    return {"input": [13], "seed": 3, "head": "logistic", "embeddings": [e],
            "layers": [{"type": "dense", "units": 8}, {"type": "relu"}, {"type": "dense", "units": 1}]}


def run_exchanges(wd, name, extra, metrics=None):
    """One chief and one psd of a job with table big as extra says; the same pulls and pushes each time.
    Returns (every row pulled, as bytes; the last status; the psd; the chief; the job; its spec)."""
    h.plain_rpc()
    s = h.stubs()
    base = h.load_example()
    base["data"] = {"dir": wd.path, "format": "criteo", "train_files": ["train.tsv"]}
    job, spec = h.make_job(wd, name, n_ps=1, n_workers=1, model=model(extra), base=base,
                           training={"sparse_optimizer": "adagrad", "learning_rate": 0.1})
    chief = h.daemon(wd, "chiefd", job, state_dir=wd.file("state-" + name))
    env = {"PSFLEET_METRICS_LISTEN": metrics} if metrics else None
    ps = h.daemon(wd, "psd", job, 0, env=env, state_dir=wd.file("state-" + name))
    h.wait_healthy(spec["cluster"]["ps"][0], ps)
    st = h.wait_state(spec["cluster"]["chief"][0], "READY", 60, [chief, ps])
    caller = s.tensor_pb2.Caller(fingerprint=st.fingerprint, task="worker:0")
    stub = s.ps_pb2_grpc.ParameterServerStub(h.channel(spec["cluster"]["ps"][0]))
    rss0 = h.proc_bytes(ps.pid)
    h.log("%s: psd VmRSS %d before any row" % (name, rss0))

    def exchange(pull, push, step):
        tensors = []
        if push:
            g = [((i * 2654435761 + step) % 1000) / 1000.0 - 0.5 for i in push for _ in range(16)]
            tensors = [s.tensor_pb2.Tensor(name="grads", dtype=s.tensor_pb2.DTYPE_FLOAT32, shape=[len(push), 16],
                                           data=struct.pack("<%df" % len(g), *g))]
        hdr = s.ps_pb2.SparseExchangeHeader(caller=caller, worker=0, table=0, global_step=step, create=True,
                                            pull_ids=struct.pack("<%dQ" % len(pull), *pull),
                                            push_ids=struct.pack("<%dQ" % len(push), *push))
        r = stub.SparseExchange(s.ps_pb2.SparseExchangeRequest(header=hdr, tensors=tensors), timeout=60)
        return b"".join(t.data for t in r.tensors)

    out = []
    step = 1
    # fill past the bound, then train old and new ids alike: rows go to disk and come back
    for at in range(0, IDS, CHUNK):
        out.append(exchange(list(range(at, min(at + CHUNK, IDS))), [], step))
        step += 1
    for k in range(40):
        ids = sorted({(k * 7919 + i * 104729) % IDS for i in range(CHUNK)})
        out.append(exchange(ids, ids, step))
        step += 1
    for at in range(0, IDS, CHUNK):
        out.append(exchange(list(range(at, min(at + CHUNK, IDS))), [], step))
    t = stub.GetShardStatus(s.ps_pb2.ShardStatusRequest(), timeout=5)
    h.log("%s: psd VmRSS %d after" % (name, h.proc_bytes(ps.pid)))
    return out, t, ps, chief, job, spec, rss0


def same_as_unbounded(wd):
    metrics = "127.0.0.1:%d" % h.free_ports(1)[0]
    want, t0, ps, chief, _, _, _ = run_exchanges(wd, "flat.json", {})
    ps.kill(), chief.kill(), ps.wait(15), chief.wait(15)
    got, t, ps, chief, job, spec, rss0 = run_exchanges(wd, "tier.json", {"max_rows": CAP, "disk_tier": True}, metrics)
    big = t.tables[0]
    h.log("tiered big: rows %d (max %d), disk_rows %d, disk_bytes %d, reads %d, spills %d, errors %d; unbounded %d"
          % (big.rows, big.max_rows, big.disk_rows, big.disk_bytes, big.disk_reads, big.disk_spills,
             big.disk_errors, t0.tables[0].rows))
    assert len(got) == len(want) and all(a == b for a, b in zip(got, want)), "rows differ from the unbounded table's"
    assert big.rows <= CAP and big.rows + big.disk_rows == t0.tables[0].rows == IDS, big
    assert big.disk_spills > 0 and big.disk_reads > 0 and big.disk_errors == 0 and big.evicted_limit == 0, big
    tier = os.path.join(wd.file("state-tier.json"), spec["job"], "tier", "ps-0", "table-0")
    assert os.path.isdir(tier), tier

    def scrape():
        with urllib.request.urlopen("http://%s/metrics" % metrics, timeout=5) as f:
            text = f.read().decode()
        return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(psfleet_ps_sparse_disk\S+) (\S+)$", text, re.M)}
    want_m = {'psfleet_ps_sparse_disk_rows{table="big"}': big.disk_rows,
              'psfleet_ps_sparse_disk_errors_total{table="big"}': 0}
    h.wait_for("the disk tier in /metrics", lambda: all(scrape().get(k) == v for k, v in want_m.items()), 10, [ps])
    r = subprocess.run([h.BIN["psfleet"], "top", "--address", spec["cluster"]["chief"][0], "--once",
                        "--interval-ms", "100"], capture_output=True, text=True, env=h.child_env(), timeout=60)
    assert r.returncode == 0 and "disk tier: %d rows" % big.disk_rows in r.stdout, (r.returncode, r.stdout)

    p = plan(job)[0]
    rss = h.proc_bytes(ps.pid)
    h.log("psd VmRSS %d; plan %d (big %d, tier caches %d)" % (rss, p["total"], p["tables"][0]["bytes"],
                                                             p["tables"][0]["tier_memory"]))
    h.log(subprocess.run([h.BIN["psfleet"], "plan", job], capture_output=True, text=True, env=h.child_env(),
                         timeout=60).stdout)
    # what the rows add to the process: DRAM's part at its bound and the tier's caches, as planned (the
    # process's own base is the plan's estimate for any psd, table or not: not this test's subject)
    grown, planned = rss - rss0, p["tables"][0]["bytes"] + p["tables"][0]["tier_memory"] + p["buffers"]
    h.log("psd grew by %d with the rows; plan: table %d + tier caches %d + buffers %d = %d"
          % (grown, p["tables"][0]["bytes"], p["tables"][0]["tier_memory"], p["buffers"], planned))
    assert grown <= 1.10 * planned, (grown, planned, p)

    # kill -9: the psd starts again with its tier wiped, restored by the chief as any shard (here from
    # the checkpoint of step 0: no rows)
    h.kill_now(ps)
    ps = h.daemon(wd, "psd", job, 0, state_dir=wd.file("state-tier.json"))
    h.wait_healthy(spec["cluster"]["ps"][0], ps)
    s = h.stubs()
    stub = s.ps_pb2_grpc.ParameterServerStub(h.channel(spec["cluster"]["ps"][0]))
    st = h.wait_for("ps:0 restored by the chief", lambda: (lambda x: x if x.initialized else None)(
        stub.GetShardStatus(s.ps_pb2.ShardStatusRequest(), timeout=5)), 60, [ps, chief])
    big = st.tables[0]
    h.log("restarted: rows %d, disk_rows %d, disk_bytes %d" % (big.rows, big.disk_rows, big.disk_bytes))
    assert big.rows == 0 and big.disk_rows == 0 and big.disk_spills == 0, big
    assert not [f for f in os.listdir(tier) if f.endswith(".sst")], os.listdir(tier)
    ps.kill(), chief.kill(), ps.wait(15), chief.wait(15)


def unwritable(wd):
    """ps.disk_tier_dir under a regular file (fails as root too): psd exits 74 saying why."""
    plain = wd.file("plain")
    with open(plain, "w") as f:
        f.write("x")
    base = h.load_example()
    base["data"] = {"dir": wd.path, "format": "criteo", "train_files": ["train.tsv"]}
    job, _ = h.make_job(wd, "bad.json", n_ps=1, n_workers=1, model=model({"max_rows": CAP, "disk_tier": True}),
                        base=base, ps={"disk_tier_dir": os.path.join(plain, "tier")})
    ps = h.daemon(wd, "psd", job, 0)
    assert ps.wait(30) == 74, ps.stderr()
    assert "ps.disk_tier_dir" in ps.stderr() and "Not a directory" in ps.stderr(), ps.stderr()


def local_auc(wd):
    """The example wide-and-deep job, its tables bounded to 2,000 rows in DRAM with the rest on disk,
    against the same job unbounded: the same test AUC within 0.005."""
    data = wd.file("data")
    os.makedirs(data)
    gen(wd, 20000, os.path.join(data, "train.tsv.gz"), 5000, os.path.join(data, "test.tsv.gz"))
    auc, rows = {}, {}
    for name, extra in (("flat", {}), ("tiered", {"max_rows": 2000, "evict_policy": "lru", "disk_tier": True})):
        base = h.ctr_example(data, name, extra)
        path, _ = h.make_job(wd, name + ".json", n_ps=1, n_workers=1, base=base,
                             training={"max_steps": 300, "report_every_steps": 100})
        r = h.local_result(wd, path, args=["--keep-state"], name=name, timeout=300)
        assert r["global_step"] >= 300 and "test_auc" in r, r
        auc[name] = r["test_auc"]
        rows[name] = table_rows(wd, name)
    h.log("test AUC: unbounded %.4f, 2,000 rows in DRAM + disk tier %.4f; checkpointed rows %s"
          % (auc["flat"], auc["tiered"], rows))
    assert abs(auc["flat"] - auc["tiered"]) <= 0.005, auc
    # one worker reads the same examples in both: the final checkpoint, rows on disk with it, holds every row
    assert rows["flat"] == rows["tiered"], rows


def test():
    h.require_built("psd", "chiefd", "workerd", "psfleet")
    wd = h.Workdir()
    same_as_unbounded(wd)
    unwritable(wd)
    local_auc(wd)


if __name__ == "__main__":
    h.main(test)

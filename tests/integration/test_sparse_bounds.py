"""Bounded embedding tables on a real psd (docs/sparse.md, "Bounds"): a table with max_rows and lru,
filled past its bound through SparseExchange, keeps at most its bound and counts the evictions in
GetShardStatus, /metrics and `psfleet top`; a table with admit_after 2 gives an id its row on its second pull,
drops its gradients before, and counts both; the psd's VmRSS is within 10 % of `psfleet plan`'s
figure for it; under ps.memory_limit_bytes alone a table gets the rows the limit leaves and the psd's
VmRSS stays under it; a ps.memory_limit_bytes below the dense part stops psd and `psfleet check` with exit 78
and the figures; a short `psfleet local` job with both keys ends DONE with its checkpointed table
within its bound."""
import json
import os
import re
import struct
import subprocess
import urllib.request

import harness as h
from test_sparse_job import gen

FILL_CAP = 200000        # rows of table "big" (dim 16, adagrad): about 30 MiB
FILL_IDS = 300000        # ids pulled into it: a third more than fit
CHUNK = 8192            # ids per SparseExchange: a large batch's (the plan's buffers are a batch's)


def plan(job):
    r = subprocess.run([h.BIN["psfleet"], "plan", "--json", job], capture_output=True, text=True,
                       env=h.child_env(), timeout=60)
    assert r.returncode == 0, (r.returncode, r.stderr)
    return json.loads(r.stdout)


def model(big_cap, extra=None):
    m = {"input": [13], "seed": 3, "head": "logistic",
         "embeddings": [{"name": "big", "fields": "all", "dim": 16, "max_rows": big_cap, "evict_policy": "lru"},
                        {"name": "adm", "fields": [0, 1], "dim": 4, "admit_after": 2}],
         "layers": [{"type": "dense", "units": 8}, {"type": "relu"}, {"type": "dense", "units": 1}]}
    if extra:
        m["embeddings"][0].update(extra)
    return m


def exchange_rpc(wd):
    """A chief and one psd; the table filled past its bound and admission through SparseExchange."""
    h.plain_rpc()
    s = h.stubs()
    base = h.load_example()
    base["data"] = {"dir": wd.path, "format": "criteo", "train_files": ["train.tsv"]}
    job, spec = h.make_job(wd, "rpc.json", n_ps=1, n_workers=1, model=model(FILL_CAP), base=base,
                           training={"sparse_optimizer": "adagrad", "learning_rate": 0.1},
                           supervisor={"full_checkpoint_every": 10})   # the shard tracks what changed
    metrics = "127.0.0.1:%d" % h.free_ports(1)[0]
    chief = h.daemon(wd, "chiefd", job)
    ps = h.daemon(wd, "psd", job, 0, env={"PSFLEET_METRICS_LISTEN": metrics})
    h.wait_healthy(spec["cluster"]["ps"][0], ps)
    st = h.wait_state(spec["cluster"]["chief"][0], "READY", 60, [chief, ps])
    caller = s.tensor_pb2.Caller(fingerprint=st.fingerprint, task="worker:0")
    stub = s.ps_pb2_grpc.ParameterServerStub(h.channel(spec["cluster"]["ps"][0]))
    rss_empty = h.proc_bytes(ps.pid)

    def exchange(table, pull=(), push=(), step=1):
        tensors = []
        if push:
            dim = 16 if table == 0 else 4
            tensors = [s.tensor_pb2.Tensor(name="grads", dtype=s.tensor_pb2.DTYPE_FLOAT32, shape=[len(push), dim],
                                           data=struct.pack("<%df" % (len(push) * dim), *([0.5] * len(push) * dim)))]
        hdr = s.ps_pb2.SparseExchangeHeader(caller=caller, worker=0, table=table, global_step=step, create=True,
                                            pull_ids=struct.pack("<%dQ" % len(pull), *pull),
                                            push_ids=struct.pack("<%dQ" % len(push), *push))
        return stub.SparseExchange(s.ps_pb2.SparseExchangeRequest(header=hdr, tensors=tensors), timeout=60)

    def status():
        return stub.GetShardStatus(s.ps_pb2.ShardStatusRequest(), timeout=5)

    # max_rows + lru: every pull of a new id past the bound evicts the oldest rows first
    for at in range(0, FILL_IDS, CHUNK):
        exchange(0, pull=range(at, min(at + CHUNK, FILL_IDS)), step=1 + at // CHUNK)
        t = status().tables[0]
        assert t.rows <= FILL_CAP, t
    t = status().tables[0]
    h.log("big: rows %d of max_rows %d, evicted_limit %d, bytes %d" % (t.rows, t.max_rows, t.evicted_limit, t.bytes))
    assert t.max_rows == FILL_CAP and t.rows > FILL_CAP * 9 // 10, t
    assert t.evicted_limit >= FILL_IDS - FILL_CAP, t
    # the newest ids kept their rows (lru): the last chunk's are all there, found without a new eviction
    exchange(0, pull=range(FILL_IDS - 1000, FILL_IDS), step=100)
    assert status().tables[0].evicted_limit == t.evicted_limit

    # admit_after 2: the first pull gives the initial row and stores nothing, a push is dropped
    ids = list(range(10 ** 9, 10 ** 9 + 500))
    exchange(1, pull=ids)
    a = status().tables[1]
    assert (a.rows, a.admit_pending, a.admitted) == (0, 500, 0), a
    exchange(1, push=ids)
    assert status().tables[1].grads_dropped == 500
    exchange(1, pull=ids)
    a = status().tables[1]
    assert (a.rows, a.admitted, a.admit_pending, a.grads_dropped) == (500, 500, 500, 500), a
    exchange(1, push=ids)
    assert status().tables[1].grads_dropped == 500

    # the same counters in /metrics (within the main loop's 2 s tick)
    def scrape():
        with urllib.request.urlopen("http://%s/metrics" % metrics, timeout=5) as f:
            text = f.read().decode()
        return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(psfleet_ps_sparse_\S+) (\S+)$", text, re.M)}

    want = {'psfleet_ps_sparse_evicted_limit_total{table="big"}': t.evicted_limit,
            'psfleet_ps_sparse_admitted_total{table="adm"}': 500,
            'psfleet_ps_sparse_admit_pending_total{table="adm"}': 500,
            'psfleet_ps_sparse_grads_dropped_total{table="adm"}': 500,
            'psfleet_ps_sparse_rows{table="adm"}': 500}
    h.wait_for("the counters in /metrics", lambda: all(scrape().get(k) == v for k, v in want.items()), 10, [ps])

    # psfleet top shows the same, as text and as JSON
    chief_addr = spec["cluster"]["chief"][0]
    r = subprocess.run([h.BIN["psfleet"], "top", "--address", chief_addr, "--once", "--interval-ms", "100"],
                       capture_output=True, text=True, env=h.child_env(), timeout=60)
    assert r.returncode == 0, (r.returncode, r.stderr)
    h.log(r.stdout)
    assert re.search(r"^ps:0\s+big\s+%d\s+%d\s" % (t.rows, FILL_CAP), r.stdout, re.M), r.stdout
    assert re.search(r"^ps:0\s+adm\s+500\s+-\s+\S+\s+0\s+0\s+500\s+500\s+500$", r.stdout, re.M), r.stdout
    r = subprocess.run([h.BIN["psfleet"], "top", "--address", chief_addr, "--once", "--json", "--interval-ms", "100"],
                       capture_output=True, text=True, env=h.child_env(), timeout=60)
    tables = json.loads(r.stdout)["shards"][0]["tables"]
    assert tables[0]["evicted_limit"] == t.evicted_limit and tables[1]["grads_dropped"] == 500, tables

    # psfleet plan's figure for this psd against its resident memory
    p = plan(job)[0]
    rss = h.proc_bytes(ps.pid)
    h.log("psd VmRSS: %d before the rows, %d after; plan %d (process %d, buffers %d, big %d, adm %d)"
          % (rss_empty, rss, p["total"], p["process"], p["buffers"], p["tables"][0]["bytes"], p["tables"][1]["bytes"]))
    assert abs(rss - p["total"]) <= 0.10 * p["total"], (rss, p)

    # a checkpoint's walk (SparseExport with take_evicted): after the rows, the evicted ids a page's worth
    # of bytes at a time (2,000 rows of 16 floats and a slot: 32,000 ids), the last page done
    def walk(max_rows=2000):
        cursor, evicted, pages, rows = 0, [], [], 0
        while True:
            hdr = s.ps_pb2.SparseExportHeader(caller=caller, table=0, cursor=cursor, max_rows=max_rows,
                                              take_evicted=True, evicted_from=len(evicted))
            rh = stub.SparseExport(s.ps_pb2.SparseExportRequest(header=hdr), timeout=60).header
            assert not rh.changes_lost
            n = len(rh.evicted) // 8
            assert n == 0 or len(rh.ids) == 0, "evicted ids on a page of rows"
            rows += len(rh.ids) // 8
            evicted += struct.unpack("<%dQ" % n, rh.evicted)
            pages.append(n)
            cursor = rh.next_cursor
            if rh.done:
                return rows, evicted, [k for k in pages if k]

    rows, evicted, pages = walk()
    h.log("a walk: %d rows, then %d evicted ids in pages of %s" % (rows, len(evicted), pages))
    assert rows == status().tables[0].rows and len(evicted) == len(set(evicted)) == t.evicted_limit, (rows, len(evicted), t)
    assert len(pages) > 1 and max(pages) <= 32000, pages
    assert walk()[1] == [], "the evicted ids were taken: a second walk has none"
    st = status()
    assert st.memory_planned_bytes == p["total"] and st.memory_limit_bytes == 0, st
    ps.kill()
    chief.kill()
    ps.wait(15)
    chief.wait(15)


def limit_held(wd):
    """Under ps.memory_limit_bytes alone, an unbounded table gets the rows the limit leaves it, and the
    psd stays within its limit however many ids come."""
    h.plain_rpc()
    s = h.stubs()
    limit = 48 << 20
    base = h.load_example()
    base["data"] = {"dir": wd.path, "format": "criteo", "train_files": ["train.tsv"]}
    m = model(0)
    del m["embeddings"][0]["max_rows"]
    job, spec = h.make_job(wd, "limit.json", n_ps=1, n_workers=1, model=m, base=base, ps={"memory_limit_bytes": limit})
    p = plan(job)[0]
    big = p["tables"][0]
    assert big["rows_from"] == "memory limit" and big["max_rows"] > 0 and p["total"] <= limit, p
    chief = h.daemon(wd, "chiefd", job)
    ps = h.daemon(wd, "psd", job, 0)
    h.wait_healthy(spec["cluster"]["ps"][0], ps)
    st = h.wait_state(spec["cluster"]["chief"][0], "READY", 60, [chief, ps])
    caller = s.tensor_pb2.Caller(fingerprint=st.fingerprint, task="worker:0")
    stub = s.ps_pb2_grpc.ParameterServerStub(h.channel(spec["cluster"]["ps"][0]))
    page = 16384
    for at in range(0, 2 * big["max_rows"], page):
        hdr = s.ps_pb2.SparseExchangeHeader(caller=caller, worker=0, table=0, global_step=1 + at // page, create=True,
                                            pull_ids=struct.pack("<%dQ" % page, *range(at, at + page)))
        stub.SparseExchange(s.ps_pb2.SparseExchangeRequest(header=hdr), timeout=60)
    t = stub.GetShardStatus(s.ps_pb2.ShardStatusRequest(), timeout=5)
    rss = h.proc_bytes(ps.pid)
    h.log("limit %d: big max_rows %d, rows %d, evicted_limit %d; plan %d; VmRSS %d"
          % (limit, t.tables[0].max_rows, t.tables[0].rows, t.tables[0].evicted_limit, p["total"], rss))
    assert t.memory_limit_bytes == limit and t.tables[0].max_rows == big["max_rows"], t
    assert t.tables[0].rows <= big["max_rows"] and t.tables[0].evicted_limit > 0, t
    assert rss <= limit, (rss, limit)
    ps.kill()
    chief.kill()
    ps.wait(15)
    chief.wait(15)


def limit_refused(wd):
    """A limit below the dense part: psd and psfleet check exit 78 naming the figures."""
    base = h.load_example()
    base["data"] = {"dir": wd.path, "format": "criteo", "train_files": ["train.tsv"]}
    job, spec = h.make_job(wd, "small.json", n_ps=1, n_workers=1, model=model(FILL_CAP), base=base,
                           ps={"memory_limit_bytes": 1000000})
    ps = h.daemon(wd, "psd", job, 0)
    assert ps.wait(30) == 78, ps.stderr()
    assert "ps.memory_limit_bytes: 1000000 is below what ps:0 needs without its tables" in ps.stderr(), ps.stderr()
    r = subprocess.run([h.BIN["psfleet"], "check", job], capture_output=True, text=True, env=h.child_env(), timeout=60)
    assert r.returncode == 78 and "ps.memory_limit_bytes: 1000000 is below" in r.stdout, (r.returncode, r.stdout)
    r = subprocess.run([h.BIN["psfleet"], "plan", job], capture_output=True, text=True, env=h.child_env(), timeout=60)
    assert r.returncode == 78 and "dense variables with slots" in r.stderr, (r.returncode, r.stderr)


def safetensors_shapes(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
    return {k: v["shape"] for k, v in head.items() if k != "__metadata__"}


def local_job(wd):
    """A short job with a bounded lru table and admission trains to DONE within its bound."""
    data = wd.file("data")
    os.makedirs(data)
    gen(wd, 20000, os.path.join(data, "train.tsv.gz"), 5000, os.path.join(data, "test.tsv.gz"))
    base = h.ctr_example(data, "bounded", {"max_rows": 3000, "evict_policy": "lru", "admit_after": 2})
    path, _ = h.make_job(wd, "bounded.json", n_ps=1, n_workers=2, base=base,
                         training={"max_steps": 100, "report_every_steps": 50})
    r = h.local_result(wd, path, args=["--keep-state"], name="bounded", timeout=300)
    assert r["global_step"] >= 100 and "test_auc" in r, r
    ck = sorted(os.path.join(rt, fn) for rt, _, fs in os.walk(wd.path) for fn in fs
                if fn.endswith(".safetensors") and "bounded" in rt)
    assert ck, "no checkpoint of job bounded"
    shapes = safetensors_shapes(ck[-1])
    for name in ("wide", "deep"):
        n = shapes["emb/%s/ids" % name][0]
        h.log("checkpointed table %s: %d rows (max_rows 3000)" % (name, n))
        assert 0 < n <= 3000, shapes


def test():
    h.require_built("psd", "chiefd", "workerd", "psfleet")
    wd = h.Workdir()
    exchange_rpc(wd)
    limit_held(wd)
    limit_refused(wd)
    local_job(wd)


if __name__ == "__main__":
    h.main(test)

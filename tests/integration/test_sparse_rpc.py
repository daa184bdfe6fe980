"""Embedding tables on two real psd shards (docs/sparse.md). tests/integration/sparse_client.c drives
the ps client (ids split over the shards and put back in order, lookup without creating, push, bytes
exactly 8 per id and 4 * dim per row on both sides, export and import after an Assign emptied the
tables). Then, from Python, every malformed SparseExchange, SparseExport and SparseImport is refused
with a message naming the field, counted in GetShardStatus, and changes no row."""
import os
import struct
import subprocess

import harness as h

SPARSE_CLIENT = os.path.join(h.BUILD_DIR, "tests", "integration", "sparse_client")
DIM = 8


def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
    for n in ("psd",):
        if not os.access(h.BIN[n], os.X_OK):
            h.skip("%s not built" % n)
    if not os.access(SPARSE_CLIENT, os.X_OK):
        h.skip("sparse_client not built (%s)" % SPARSE_CLIENT)
    s = h.stubs()
    import grpc
    wd = h.Workdir()
    base = h.load_example()
    base["data"] = {"dir": wd.path, "format": "criteo", "train_files": ["train.tsv"], "test_files": ["test.tsv"]}
    model = {"input": [13], "seed": 3, "head": "logistic",
             "embeddings": [{"name": "cat", "fields": "all", "dim": DIM},
                            {"name": "site", "fields": [0, 1], "dim": 4, "evict_after_steps": 10}],
             "layers": [{"type": "dense", "units": 4}, {"type": "relu"}, {"type": "dense", "units": 1}]}
    job, spec = h.make_job(wd, n_ps=2, n_workers=1, model=model, base=base,
                           training={"sparse_optimizer": "adagrad", "learning_rate": 0.1})
    metrics = "127.0.0.1:%d" % h.free_ports(1)[0]
    ps = [h.daemon(wd, "psd", job, i, env={"PSFLEET_METRICS_LISTEN": metrics} if i == 0 else None) for i in range(2)]
    for i, p in enumerate(ps):
        h.wait_healthy(spec["cluster"]["ps"][i], p)

    r = subprocess.run([SPARSE_CLIENT, job], capture_output=True, text=True, env=h.child_env(), timeout=60)
    h.log(r.stdout.strip(), r.stderr.strip())
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stdout, r.stderr)
    fp = int(r.stdout.split()[1], 16)
    caller = s.tensor_pb2.Caller(fingerprint=fp, task="worker:0")
    F32 = s.tensor_pb2.DTYPE_FLOAT32

    def packed(ids):
        return struct.pack("<%dQ" % len(ids), *ids)

    def rows(name, n, dim=DIM, vals=None):
        vals = vals if vals is not None else [0.01] * (n * dim)
        return s.tensor_pb2.Tensor(name=name, dtype=F32, shape=[n, dim], data=struct.pack("<%df" % len(vals), *vals))

    chans = [h.channel(a) for a in spec["cluster"]["ps"]]
    stubs = [s.ps_pb2_grpc.ParameterServerStub(c) for c in chans]

    def export(k, table=0, cursor=0):
        hdr = s.ps_pb2.SparseExportHeader(caller=caller, table=table, max_rows=100000, cursor=cursor)
        return stubs[k].SparseExport(s.ps_pb2.SparseExportRequest(header=hdr), timeout=10)

    def export_all(k):
        """A whole walk (eviction waits for the walk's end): the pages' ids and tensors."""
        pages, cursor = [], 0
        while True:
            r = export(k, cursor=cursor)
            pages.append((r.header.ids, [(t.name, list(t.shape), t.data) for t in r.tensors]))
            if r.header.done:
                return pages
            cursor = r.header.next_cursor

    def status(k):
        return stubs[k].GetShardStatus(s.ps_pb2.ShardStatusRequest(), timeout=5)

    # each shard's own ids, from its export
    mine = [list(struct.unpack("<%dQ" % (sum(len(p[0]) for p in export_all(k)) // 8),
                               b"".join(p[0] for p in export_all(k)))) for k in range(2)]
    assert mine[0] and mine[1], [len(m) for m in mine]
    inc0 = status(0).incarnation
    before = export_all(0)
    rejected0 = status(0).rejected

    def exchange(push=(), pull=(), tensors=None, table=0, inc=0, who=caller, push_bytes=None, pull_bytes=None):
        hdr = s.ps_pb2.SparseExchangeHeader(caller=who, worker=0, table=table, incarnation=inc, global_step=1,
                                            create=True,
                                            push_ids=push_bytes if push_bytes is not None else packed(push),
                                            pull_ids=pull_bytes if pull_bytes is not None else packed(pull))
        if tensors is None:
            tensors = [rows("grads", len(push))] if push else []
        return stubs[0].SparseExchange(s.ps_pb2.SparseExchangeRequest(header=hdr, tensors=tensors), timeout=10)

    a, b = mine[0][:3], mine[1][:1]
    nan = float("nan")
    INVALID, PRECOND = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION
    cases = [
        ("table", lambda: exchange(pull=a, table=2), INVALID, "table: 2 is not an embedding table of this job"),
        ("ids bytes", lambda: exchange(pull_bytes=b"\0" * 12), INVALID, "pull_ids: 12 bytes, not a multiple of 8"),
        ("push ids bytes", lambda: exchange(push_bytes=b"\0" * 7, tensors=[]), INVALID,
         "push_ids: 7 bytes, not a multiple of 8"),
        ("another shard's id", lambda: exchange(pull=a + b), INVALID,
         "pull_ids[3]: id %d belongs to ps:1, not ps:0" % b[0]),
        ("another shard's push", lambda: exchange(push=b), INVALID, "push_ids[0]: id %d belongs to ps:1" % b[0]),
        ("too many ids", lambda: exchange(pull_bytes=b"\0" * (8 * ((1 << 20) + 1))), INVALID,
         "pull_ids: 1048577 ids, more than the 1048576 one message may carry"),
        ("repeated push id", lambda: exchange(push=a + a[:1]), INVALID,
         "push_ids: id %d is given more than once" % a[0]),
        ("grads missing", lambda: exchange(push=a, tensors=[]), INVALID, 'tensor "grads" is missing'),
        ("grads shape", lambda: exchange(push=a, tensors=[rows("grads", 3, DIM + 1)]), INVALID,
         'tensor "grads": shape (3, 9), (3, 8) expected'),
        ("grads rows", lambda: exchange(push=a, tensors=[rows("grads", 2)]), INVALID,
         'tensor "grads": shape (2, 8), (3, 8) expected'),
        ("grads NaN", lambda: exchange(push=a, tensors=[rows("grads", 3, vals=[0.0] * 23 + [nan])]), INVALID,
         'tensor "grads": row 2 holds NaN'),
        ("grads Inf", lambda: exchange(push=a, tensors=[rows("grads", 3, vals=[float("inf")] + [0.0] * 23)]),
         INVALID, 'tensor "grads": row 0 holds Inf'),
        ("grads without ids", lambda: exchange(pull=a, tensors=[rows("grads", 3)]), INVALID,
         'tensor "grads" is not expected here'),
        ("incarnation", lambda: exchange(pull=a, inc=inc0 + 1), PRECOND, "incarnation: %d" % (inc0 + 1)),
        ("fingerprint", lambda: exchange(pull=a, who=s.tensor_pb2.Caller(fingerprint=fp ^ 1, task="worker:0")),
         PRECOND, "job fingerprint"),
        ("export table", lambda: export(0, table=7), INVALID, "table: 7 is not an embedding table"),
    ]

    def imp(ids, tensors, table=0, evicted=b""):
        hdr = s.ps_pb2.SparseImportHeader(caller=caller, table=table, ids=packed(ids), global_step=1, evicted=evicted)
        return stubs[0].SparseImport(s.ps_pb2.SparseImportRequest(header=hdr, tensors=tensors), timeout=10)

    cases += [
        ("import slot missing", lambda: imp(a, [rows("rows", 3)]), INVALID, 'tensor "accumulator" is missing'),
        ("import shape", lambda: imp(a, [rows("rows", 3, 4), rows("accumulator", 3)]), INVALID,
         'tensor "rows": shape (3, 4), (3, 8) expected'),
        ("import another shard's id", lambda: imp(b, [rows("rows", 1), rows("accumulator", 1)]), INVALID,
         "ids[0]: id %d belongs to ps:1" % b[0]),
        ("import repeated id", lambda: imp(a + a[:1], [rows("rows", 4), rows("accumulator", 4)]), INVALID,
         "ids: id %d is given more than once" % a[0]),
        ("import NaN", lambda: imp(a, [rows("rows", 3), rows("accumulator", 3, vals=[nan] * 24)]), INVALID,
         'tensor "accumulator": row 0 holds NaN'),
        ("import unknown tensor", lambda: imp(a, [rows("rows", 3), rows("accumulator", 3), rows("linear", 3)]),
         INVALID, 'tensor "linear" is not expected here'),
        # a restore's evicted ids (dropped before the rows): whole ids of this shard, or nothing is done
        ("import evicted bytes", lambda: imp(a, [rows("rows", 3), rows("accumulator", 3)], evicted=b"\0" * 12),
         INVALID, "evicted: 12 bytes, not a multiple of 8"),
        ("import another shard's evicted id", lambda: imp([], [], evicted=packed(a[:1] + b)), INVALID,
         "evicted[1]: id %d belongs to ps:1, not ps:0" % b[0]),
    ]
    for what, call, code, msg in cases:
        try:
            call()
        except grpc.RpcError as e:
            assert e.code() == code, (what, e.code(), e.details())
            assert msg in e.details(), (what, e.details())
            h.log("refused (%s): %s" % (what, e.details()))
            continue
        raise AssertionError("%s: accepted" % what)
    st = status(0)
    assert st.rejected == rejected0 + len(cases), (st.rejected, rejected0, len(cases))
    assert export_all(0) == before, "a refused call changed the table"
    assert st.tables[0].rows == len(mine[0]) and st.tables[0].name == "cat", st.tables[0]

    # a good exchange still goes through: pull-only counts 8 bytes per id in, 4 * dim per row out
    in0, out0 = st.tables[0].bytes_in, st.tables[0].bytes_out
    rep = exchange(pull=a)
    assert len(rep.tensors) == 1 and list(rep.tensors[0].shape) == [3, DIM], rep.tensors
    st = status(0)
    assert (st.tables[0].bytes_in - in0, st.tables[0].bytes_out - out0) == (3 * 8, 3 * DIM * 4), st.tables[0]

    # eviction: rows of "site" untouched for 10 of the steps the workers report go, within a tick
    def exchange_at(step, pull):
        hdr = s.ps_pb2.SparseExchangeHeader(caller=caller, worker=0, table=1, global_step=step, create=True,
                                            pull_ids=packed(pull))
        return stubs[0].SparseExchange(s.ps_pb2.SparseExchangeRequest(header=hdr), timeout=10)

    exchange_at(1, mine[0][:2])
    exchange_at(5, mine[0][2:3])
    assert status(0).tables[1].rows == 3
    exchange_at(14, mine[0][3:4])   # 14 - 10: the rows of step 1 are due, the one of step 5 not yet
    h.wait_for("the rows of step 1 evicted", lambda: status(0).tables[1].evicted == 2, 10, ps)
    assert status(0).tables[1].rows == 2, status(0).tables[1]

    # the same counts in ps:0's metrics; the rows' gauge follows within the main loop's tick
    import re
    import urllib.request

    def scrape():
        with urllib.request.urlopen("http://%s/metrics" % metrics, timeout=5) as f:
            text = f.read().decode()
        return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(psfleet_ps_sparse_\S+) (\S+)$", text, re.M)}

    st = status(0)
    ids = sum(t.ids_in for t in st.tables)
    want = {'psfleet_ps_sparse_ids_total': ids,
            'psfleet_ps_sparse_bytes_total{direction="in"}': sum(t.bytes_in for t in st.tables),
            'psfleet_ps_sparse_bytes_total{direction="out"}': sum(t.bytes_out for t in st.tables),
            'psfleet_ps_sparse_rows{table="cat"}': st.tables[0].rows,
            'psfleet_ps_sparse_rows{table="site"}': st.tables[1].rows}
    for t in st.tables:   # the bounds' and admission's counters, each table's own
        for name, v in (("table_bytes", t.bytes), ("evicted_age_total", t.evicted),
                        ("evicted_limit_total", t.evicted_limit), ("admitted_total", t.admitted),
                        ("admit_pending_total", t.admit_pending), ("grads_dropped_total", t.grads_dropped)):
            want['psfleet_ps_sparse_%s{table="%s"}' % (name, t.name)] = v
    h.wait_for("ps:0's sparse metrics equal to its status", lambda: scrape() == want, 10, ps)
    assert ids > 0 and st.tables[1].rows == 2, st
    for c in chans:
        c.close()
    for p in ps:
        p.kill()
        p.wait(15)


if __name__ == "__main__":
    h.main(test)

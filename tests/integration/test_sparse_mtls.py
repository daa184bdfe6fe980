"""The embedding tables' RPCs under mutual TLS (docs/security.md, docs/sparse.md), with certificates
made by `psfleet certs`: a real chiefd assigns a psd of a job with one table, then

- a worker exchanges rows (creating them) and may neither export nor import;
- the chief may look rows up (create false, no push_ids) but not create or push any: its evaluation
  reads the table and changes nothing;
- a viewer may call none of the three;
- every refusal is PERMISSION_DENIED and leaves the table as it was.
"""
import os
import struct

import harness as h

JOB = "sparse-mtls"
DIM = 8


def expect_denied(what, fn, text=None):
    import grpc
    try:
        fn()
    except grpc.RpcError as e:
        h.log("%-40s %s: %s" % (what, e.code().name, (e.details() or "")[:160]))
        assert e.code() == grpc.StatusCode.PERMISSION_DENIED, (what, e.code(), e.details())
        assert text is None or text in (e.details() or ""), (what, e.details())
        return
    raise AssertionError("%s: accepted" % what)


def test():
    h.require("psd", "chiefd", "psfleet")
    s = h.stubs()
    wd = h.Workdir()
    tls_dir, data = wd.file("tls"), wd.file("data")
    os.makedirs(data)
    g = h.Proc(wd, "gen-data", [h.BIN["psfleet"], "gen-data", "--rows", "200", "--out",
                                os.path.join(data, "train.tsv"), "--test-rows", "100", "--test-out",
                                os.path.join(data, "test.tsv"), "--seed", "5"])
    assert g.wait(60) == 0, g.stderr()
    base = h.load_example()
    base["job"] = JOB
    base["security"] = {"mode": "mtls", "ca": tls_dir + "/{job}/ca.crt", "cert": tls_dir + "/{job}/{task}.crt",
                        "key": tls_dir + "/{job}/{task}.key"}
    base["data"] = {"dir": data, "format": "criteo", "train_files": ["train.tsv"], "test_files": ["test.tsv"]}
    model = {"input": [13], "seed": 3, "head": "logistic",
             "embeddings": [{"name": "cat", "fields": "all", "dim": DIM}],
             "layers": [{"type": "dense", "units": 4}, {"type": "relu"}, {"type": "dense", "units": 1}]}
    job, spec = h.make_job(wd, n_ps=1, n_workers=1, model=model, base=base,
                           training={"sparse_optimizer": "adagrad", "learning_rate": 0.1})
    h.psfleet_certs(wd, job, tls_dir)
    h.use_tls(tls_dir, spec, "admin")
    chief, ps, fp = h.chief_and_ps(wd, job, spec)
    ps_addr = spec["cluster"]["ps"][0]
    F32 = s.tensor_pb2.DTYPE_FLOAT32

    def stub(identity):
        return s.ps_pb2_grpc.ParameterServerStub(h.channel(ps_addr, identity))

    worker, chief_ps, viewer = stub("worker-0"), stub("chief"), stub("viewer")

    def packed(ids):
        return struct.pack("<%dQ" % len(ids), *ids)

    def grads(n):
        return s.tensor_pb2.Tensor(name="grads", dtype=F32, shape=[n, DIM], data=struct.pack("<%df" % (n * DIM),
                                                                                             *([0.01] * n * DIM)))

    def exchange(st, who, push=(), pull=(), create=True):
        caller = s.tensor_pb2.Caller(fingerprint=fp, task=who)
        hdr = s.ps_pb2.SparseExchangeHeader(caller=caller, worker=0, table=0, global_step=1, create=create,
                                            push_ids=packed(push), pull_ids=packed(pull))
        tensors = [grads(len(push))] if push else []
        return st.SparseExchange(s.ps_pb2.SparseExchangeRequest(header=hdr, tensors=tensors), timeout=10)

    def export(st, who="chief:0"):
        """A whole walk of the table: its pages' ids and tensors."""
        caller, pages, cursor = s.tensor_pb2.Caller(fingerprint=fp, task=who), [], 0
        while True:
            hdr = s.ps_pb2.SparseExportHeader(caller=caller, table=0, max_rows=100000, cursor=cursor)
            r = st.SparseExport(s.ps_pb2.SparseExportRequest(header=hdr), timeout=10)
            pages.append((r.header.ids, [(t.name, list(t.shape), t.data) for t in r.tensors]))
            if r.header.done:
                return pages
            cursor = r.header.next_cursor

    def imp(st, who, ids):
        caller = s.tensor_pb2.Caller(fingerprint=fp, task=who)
        hdr = s.ps_pb2.SparseImportHeader(caller=caller, table=0, ids=packed(ids), global_step=1)
        rows = [s.tensor_pb2.Tensor(name=n, dtype=F32, shape=[len(ids), DIM], data=b"\0" * (4 * DIM * len(ids)))
                for n in ("rows", "accumulator")]
        return st.SparseImport(s.ps_pb2.SparseImportRequest(header=hdr, tensors=rows), timeout=10)

    # a worker trains: its rows are created, then pushed to
    ids = [11, 22, 33]
    rep = exchange(worker, "worker:0", pull=ids)
    assert list(rep.tensors[0].shape) == [3, DIM], rep.tensors
    exchange(worker, "worker:0", push=ids, pull=ids)
    before = export(chief_ps)
    assert sum(len(p[0]) for p in before) == 8 * len(ids), before

    # the chief evaluates: it looks rows up, stored or not, and stores nothing
    look = exchange(chief_ps, "chief:0", pull=ids + [44], create=False)
    assert list(look.tensors[0].shape) == [4, DIM], look.tensors
    wlook = exchange(worker, "worker:0", pull=ids, create=False)
    assert look.tensors[0].data[:3 * 4 * DIM] == wlook.tensors[0].data, "the chief's lookup differs from the worker's"
    expect_denied("chief creating rows", lambda: exchange(chief_ps, "chief:0", pull=[55]),
                  "the chief may only look rows up")
    expect_denied("chief pushing", lambda: exchange(chief_ps, "chief:0", push=ids, create=False),
                  "the chief may only look rows up")
    # a worker may not take or replace the table; a viewer may touch none of it
    expect_denied("worker SparseExport", lambda: export(worker, "worker:0"), "chief only")
    expect_denied("worker SparseImport", lambda: imp(worker, "worker:0", [66]), "chief only")
    expect_denied("viewer SparseExchange", lambda: exchange(viewer, "worker:0", pull=ids, create=False))
    expect_denied("viewer SparseExport", lambda: export(viewer))
    assert export(chief_ps) == before, "a refused call or the chief's lookup changed the table"

    # every refusal by the table is one line in psd's log naming the peer
    assert ps.alive() and chief.alive()
    log = ps.stderr()
    for line in ("refused /psfleet.v1.ParameterServer/SparseExport from worker/0",
                 "refused /psfleet.v1.ParameterServer/SparseImport from worker/0",
                 "refused /psfleet.v1.ParameterServer/SparseExchange from viewer"):
        assert line in log, (line, log[-3000:])
    ps.kill()
    chief.kill()
    ps.wait(15)
    chief.wait(15)


if __name__ == "__main__":
    h.main(test)

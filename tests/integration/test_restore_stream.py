"""A restore streams (docs/checkpoints.md, "Restore"): one ps, one table of 10^6 rows of dim 16 with
Adagrad (128 MB of values and slots), filled through SparseExchange; a full checkpoint, then ~1 % of the
rows pushed, some made, some evicted by age and a few of those made again, and an incremental checkpoint
on it. psd killed (-9) and started again: the chief restores it from the chain (the full checkpoint's
rows, then the increment's evicted ids and rows), and the shard holds exactly the rows it held at the
increment, bit for bit (SparseExport before and after), while chiefd's peak RSS (VmHWM) rises by much
less than the table: the chief pages through the files instead of building the table."""
import time

import harness as h
import numpy as np

ROWS, DIM, PAGE = 10 ** 6, 16, 65536
EVICT_AFTER = 1000
GONE = 3000          # rows touched long ago: evicted after the full checkpoint
CHANGED = ROWS // 100
MADE = 2000          # rows new since the full checkpoint
BACK = 100           # of the evicted, made again before the increment


def ids_of(at, n):
    # ids spread over 64 bits, as hashed tokens are
    return (np.arange(at, at + n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)).astype("<u8")


def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as a worker and as the chief
    h.require_built("psd", "chiefd")
    s = h.stubs()
    wd = h.Workdir()
    base = {"model": {"input": [13], "head": "logistic", "seed": 1,
                      "embeddings": [{"name": "t", "fields": "all", "dim": DIM, "evict_after_steps": EVICT_AFTER}],
                      "layers": [{"type": "dense", "units": 1}]},
            "data": {"dir": wd.path, "format": "criteo", "train_files": ["none.tsv"]},
            "training": {"optimizer": "adagrad", "sparse_optimizer": "adagrad", "max_steps": 10 ** 9},
            "supervisor": {"save_checkpoint_steps": 0, "save_checkpoint_secs": 0, "save_summaries_secs": 0,
                           "keep_checkpoints": 5, "full_checkpoint_every": 2}}
    job, spec = h.make_job(wd, n_ps=1, n_workers=1, base=base)
    chief, ps, fp = h.chief_and_ps(wd, job, spec)
    ps_addr, chief_addr = spec["cluster"]["ps"][0], spec["cluster"]["chief"][0]
    worker = s.tensor_pb2.Caller(fingerprint=fp, task="worker:0")
    as_chief = s.tensor_pb2.Caller(fingerprint=fp, task="chief:0")

    def exchange(stub, ids, step, push=False):
        hdr = s.ps_pb2.SparseExchangeHeader(caller=worker, worker=0, table=0, create=True, global_step=step)
        tensors = []
        if push:
            hdr.push_ids = ids.tobytes()
            tensors = [s.tensor_pb2.Tensor(name="grads", dtype=s.tensor_pb2.DTYPE_FLOAT32, shape=[len(ids), DIM],
                                           data=np.full((len(ids), DIM), 0.01, dtype="<f4").tobytes())]
        else:
            hdr.pull_ids = ids.tobytes()
        stub.SparseExchange(s.ps_pb2.SparseExchangeRequest(header=hdr, tensors=tensors), timeout=60)

    def export(stub):
        """The whole table, sorted by id: ids (n), rows (n, DIM), accumulators (n, DIM)."""
        ids, rows, acc, cursor = [], [], [], 0
        while True:
            hdr = s.ps_pb2.SparseExportHeader(caller=as_chief, table=0, cursor=cursor, max_rows=PAGE)
            r = stub.SparseExport(s.ps_pb2.SparseExportRequest(header=hdr), timeout=60)
            ids.append(np.frombuffer(r.header.ids, dtype="<u8"))
            t = {x.name: np.frombuffer(x.data, dtype="<f4").reshape(-1, DIM) for x in r.tensors}
            if len(ids[-1]):
                rows.append(t["rows"])
                acc.append(t["accumulator"])
            if r.header.done:
                break
            cursor = r.header.next_cursor
        ids = np.concatenate(ids)
        order = np.argsort(ids)
        return ids[order], np.concatenate(rows)[order], np.concatenate(acc)[order]

    with h.channel(ps_addr) as ch, h.channel(chief_addr) as cch:
        stub = s.ps_pb2_grpc.ParameterServerStub(ch)
        sv = s.supervisor_pb2_grpc.SupervisorStub(cch)
        pulled = stub.Pull(s.ps_pb2.PullRequest(header=s.ps_pb2.PullHeader(caller=worker)), timeout=30).tensors[0]

        def step():
            h.zero_step(stub, worker, pulled)

        def save():
            return sv.SaveCheckpoint(s.supervisor_pb2.SaveCheckpointRequest(reason="test"), timeout=300).checkpoint

        # the rows: GONE of them last touched at step 100, the others at EVICT_AFTER (nothing is evicted
        # while the newest step is not past EVICT_AFTER)
        t0 = time.monotonic()
        exchange(stub, ids_of(0, GONE), 100)
        for at in range(GONE, ROWS, PAGE):
            exchange(stub, ids_of(at, min(PAGE, ROWS - at)), EVICT_AFTER)
        # every 2nd checkpoint full: the one after the chief's first (init, of no rows) is an increment
        step()
        assert save().incremental
        step()
        full = save()
        assert not full.incremental, full
        h.log("%d rows in %.1f s; full checkpoint at %d: %d bytes" % (ROWS, time.monotonic() - t0, full.global_step,
                                                                     full.bytes))
        # after it, at step EVICT_AFTER + 200: 1 % pushed, MADE rows made, the GONE evicted by age (psd
        # checks every 2 s, not while a walk is recent), then BACK of those made again
        later = EVICT_AFTER + 200
        pick = np.random.default_rng(1).choice(np.arange(GONE, ROWS), size=CHANGED, replace=False).astype(np.uint64)
        pushed = (pick * np.uint64(0x9E3779B97F4A7C15)).astype("<u8")
        for at in range(0, CHANGED, PAGE):
            exchange(stub, pushed[at:at + PAGE], later, push=True)
        exchange(stub, ids_of(ROWS, MADE), later)
        h.wait_for("the %d old rows evicted" % GONE,
                   lambda: h.shard_status(ps_addr).tables[0].evicted >= GONE, 30, [ps, chief])
        exchange(stub, ids_of(0, BACK), later, push=True)
        step()
        inc = save()
        assert inc.incremental and inc.parent_step == full.global_step, inc
        h.log("incremental checkpoint at %d: %d bytes" % (inc.global_step, inc.bytes))
        want = export(stub)
    assert len(want[0]) == ROWS - GONE + MADE + BACK, len(want[0])

    hwm0 = h.proc_bytes(chief.pid, "VmHWM")
    h.kill_now(ps)
    t0 = time.monotonic()
    ps = h.daemon(wd, "psd", job, 0, name="psd.2")
    st = h.wait_shard_initialized(ps_addr, "ps:0 restored by the chief", 60, [ps, chief])
    restore_s = time.monotonic() - t0
    hwm1 = h.proc_bytes(chief.pid, "VmHWM")
    assert st.global_step == inc.global_step, (st.global_step, inc.global_step)

    with h.channel(ps_addr) as ch:
        got = export(s.ps_pb2_grpc.ParameterServerStub(ch))
    for name, a, b in zip(("ids", "rows", "accumulators"), want, got):
        assert a.shape == b.shape and a.tobytes() == b.tobytes(), "%s differ after the restore" % name
    table = ROWS * DIM * 4 * 2
    h.log("restored %d rows in %.1f s; chiefd VmHWM %.1f MB before the restore, %.1f MB after (+%.1f MB; the "
          "table is %.0f MB)" % (len(got[0]), restore_s, hwm0 / 1e6, hwm1 / 1e6, (hwm1 - hwm0) / 1e6, table / 1e6))
    assert hwm1 - hwm0 < table / 3, (hwm0, hwm1, table)


if __name__ == "__main__":
    h.main(test)

"""psd refuses bad pushes and changes nothing: through gRPC (a Python client) a NaN or Inf gradient, a
wrong shape, a wrong dtype, a short payload, an unknown variable, compressed gradients that lie
(rpc.compression: an int8 block scale that is NaN, an int8 payload a byte short, a top-k count past its
block, top-k indices out of order, a top-k value that is NaN) and a wrong fingerprint each get
INVALID_ARGUMENT (FAILED_PRECONDITION for the fingerprint) with a message naming the tensor; through
shared memory (tests/integration/shm_client.c) bad attaches (on psd's socket: another uid, when run as
root, and no descriptor; in the AttachSharedMemory call: a nonce no descriptor came with, another pid,
a descriptor that is not a psfleet memfd, an unsealed one, a segment without the nonce, bad groups)
and a NaN gradient are refused too, and good pushes put psd's fresh values into the worker's segment.
The variables are unchanged by every refusal (Pull before and after), GetShardStatus counts each one,
and psd logs each."""
import os
import struct

import harness as h

SHM_CLIENT = os.path.join(h.BUILD_DIR, "tests", "integration", "shm_client")


def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
    h.require("psd", "chiefd")
    if not os.access(SHM_CLIENT, os.X_OK):
        h.skip("shm_client not built (%s)" % SHM_CLIENT)
    s = h.stubs()
    import grpc
    wd = h.Workdir()
    root = os.geteuid() == 0
    if root:
        # the other-uid case joins the socket's group (root's here) and must reach the runtime dir
        os.chmod(wd.path, 0o750)
    job, spec = h.make_job(wd, n_ps=1, n_workers=1, training={"max_steps": 100})
    chief_addr, ps_addr = spec["cluster"]["chief"][0], spec["cluster"]["ps"][0]
    chief, ps, fp = h.chief_and_ps(wd, job, spec)
    caller = s.tensor_pb2.Caller(fingerprint=fp, task="worker:0")
    F32 = s.tensor_pb2.DTYPE_FLOAT32

    with h.channel(ps_addr) as ch:
        stub = s.ps_pb2_grpc.ParameterServerStub(ch)

        def pull():
            return h.pull_shard(stub, fp)

        def status():
            return stub.GetShardStatus(s.ps_pb2.ShardStatusRequest(), timeout=5)

        def tensor(name, rows, cols, values=None, dtype=F32, row_offset=0, data=None):
            if data is None:
                vals = values if values is not None else [0.01] * (rows * cols)
                data = struct.pack("<%df" % len(vals), *vals)
            return s.tensor_pb2.Tensor(name=name, dtype=dtype, shape=[rows, cols], row_offset=row_offset, data=data)

        def push(grads, who=caller):
            hdr = s.ps_pb2.PushHeader(caller=who, worker=0, local_step=1, want_values=True, count_step=True)
            return stub.Push(s.ps_pb2.PushRequest(header=hdr, grads=grads), timeout=5)

        before, gs0 = pull()
        rejected0 = status().rejected
        good_bias = tensor("dense3/bias", 1, 10)
        nan = float("nan")
        INT8, TOPK = 4, 5   # DTYPE_INT8_BLOCKS, DTYPE_TOPK: dense2/kernel (128, 64) is 32 blocks of 256

        def int8(scales, cut=0):
            data = b"".join(struct.pack("<f", sc) + b"\1" * 256 for sc in scales)
            return tensor("dense2/kernel", 128, 64, dtype=INT8, data=data[:len(data) - cut])

        def topk(blocks):   # per block a list of (index, value)
            data = b"".join(struct.pack("<H", len(b)) + b"".join(struct.pack("<Bf", i, v) for i, v in b)
                            for b in blocks)
            return tensor("dense2/kernel", 128, 64, dtype=TOPK, data=data)

        one = [(7, 0.5)]
        cases = [
            ("NaN", [good_bias, tensor("dense2/bias", 1, 64, [0.0] * 63 + [nan])],
             grpc.StatusCode.INVALID_ARGUMENT, 'gradient "dense2/bias" from worker:0 contains NaN or Inf'),
            ("Inf", [tensor("dense0/kernel", 196, 256, [float("inf")] + [0.0] * (196 * 256 - 1), row_offset=196)],
             grpc.StatusCode.INVALID_ARGUMENT, 'gradient "dense0/kernel" from worker:0 contains NaN or Inf'),
            ("shape", [tensor("dense3/bias", 1, 9)],
             grpc.StatusCode.INVALID_ARGUMENT, 'tensor "dense3/bias": shape (1, 9), expected (1, 10)'),
            ("dtype", [tensor("dense3/bias", 1, 10, dtype=s.tensor_pb2.DTYPE_INT64, data=b"\0" * 80)],
             grpc.StatusCode.INVALID_ARGUMENT, 'tensor "dense3/bias": dtype 2, expected float32'),
            ("size", [tensor("dense3/bias", 1, 10, data=b"\0" * 36)],
             grpc.StatusCode.INVALID_ARGUMENT, 'tensor "dense3/bias": 36 data bytes do not match shape'),
            ("unknown", [good_bias, tensor("dense9/kernel", 2, 2)],
             grpc.StatusCode.INVALID_ARGUMENT, 'tensor "dense9/kernel" rows from 0: no such variable on ps:0'),
            ("rows", [tensor("dense0/kernel", 196, 256, row_offset=100)],
             grpc.StatusCode.INVALID_ARGUMENT, 'tensor "dense0/kernel" rows from 100: no such variable on ps:0'),
            ("twice", [good_bias, good_bias],
             grpc.StatusCode.INVALID_ARGUMENT, 'tensor "dense3/bias" appears twice in one push'),
            ("fingerprint", [good_bias], grpc.StatusCode.FAILED_PRECONDITION, "job fingerprint"),
        ]
        def refused(cases):
            for what, grads, code, msg in cases:
                who = s.tensor_pb2.Caller(fingerprint=fp ^ 1, task="worker:0") if what == "fingerprint" else caller
                try:
                    push(grads, who)
                    raise AssertionError("%s: push accepted" % what)
                except grpc.RpcError as e:
                    h.log("%-11s %s: %s" % (what, e.code().name, e.details()))
                    assert e.code() == code, (what, e.code(), e.details())
                    assert msg in e.details(), (what, e.details())

        refused(cases)
        after, gs1 = pull()
        assert after == before and gs1 == gs0, "a refused push changed the shard"
        st = status()
        assert st.rejected == rejected0 + len(cases), (st.rejected, rejected0, len(cases))
        assert cases[-1][3] in st.last_error, st.last_error

        # A good push is applied and answered with the fresh values.
        rep = push([good_bias])
        assert rep.header.global_step == gs0 + 1, rep.header
        assert [t.name for t in rep.values] == ["dense3/bias"], rep.values
        now, _ = pull()
        assert now[("dense3/bias", 0)] == rep.values[0].data != before[("dense3/bias", 0)]

        # Shared memory: the C client plays a worker on this host.
        rejected1 = status().rejected
        cli = h.Proc(wd, "shm_client", [SHM_CLIENT, job])
        assert cli.wait(60) == 0, cli.stderr()
        h.log("shm_client:", cli.stderr().strip().replace("\n", "; "))
        out = cli.stderr()
        assert "ok: 11 groups pushed through shared memory" in out, out
        st = status()
        # refused: no descriptor on the socket; in the call: no descriptor with its nonce, another pid,
        # not a psfleet memfd, unsealed, the nonce not in the segment, a part twice, a group out of
        # range; the NaN push; and as root another uid on the socket
        assert st.rejected == rejected1 + 9 + root, (st.rejected, rejected1, root)
        assert "NaN or Inf" in st.last_error, st.last_error
        if root:
            assert "refused, another uid:" in out, out
        else:
            assert "skipped, another uid: not root" in out, out
            h.log("not root: the attach of another uid is not tried")

        # Compressed gradients (rpc.compression) that lie, after the shared-memory part: psd logs at
        # most 20 rejections in 10 s, and that part reads its own from the log.
        compressed = [
            ("int8 scale", [int8([0.01] * 5 + [nan] + [0.01] * 26)],
             grpc.StatusCode.INVALID_ARGUMENT, 'tensor "dense2/kernel": block 5\'s int8 scale is not finite'),
            ("int8 size", [int8([0.01] * 32, cut=1)],
             grpc.StatusCode.INVALID_ARGUMENT, 'tensor "dense2/kernel": 8319 data bytes do not match shape'),
            ("topk count", [topk([[(i, 0.1) for i in range(256)] + [(0, 0.1)]] + [one] * 31)],
             grpc.StatusCode.INVALID_ARGUMENT, 'tensor "dense2/kernel": block 0 has 257 top-k entries for 256'),
            ("topk order", [topk([one] * 3 + [[(9, 0.1), (8, 0.1)]] + [one] * 28)],
             grpc.StatusCode.INVALID_ARGUMENT, 'block 3: top-k index 8 out of range or out of order'),
            ("topk NaN", [topk([one] * 31 + [[(3, nan)]])],
             grpc.StatusCode.INVALID_ARGUMENT, 'gradient "dense2/kernel" from worker:0 contains NaN or Inf'),
        ]
        before, gs0 = pull()
        rejected2 = status().rejected
        refused(compressed)
        after, gs1 = pull()
        assert after == before and gs1 == gs0, "a refused compressed push changed the shard"
        assert status().rejected == rejected2 + len(compressed)
    ps.kill()
    chief.kill()
    assert ps.wait(15) == 0, ps.stderr()
    log = ps.stderr()
    # the link ended with the client's exit; psd said so
    assert "shared-memory link ended" in log, log[-2000:]
    # every refusal is in psd's log, the socket's with the peer's pid and uid
    for says in ["(uid %d) refused: no descriptor sent" % os.geteuid(), "no descriptor with this nonce came on",
                 "the descriptor came from process", "not a psfleet segment", "not sealed",
                 "its nonce is not the one", "given twice", "no such group"] + \
            ["(uid 65534) refused: uid 65534 is neither psd's (0) nor root"] * root:
        assert ("rejected: " in log) and says in log, (says, log[-3000:])
    assert "worker:0 (pid %d, uid %d) pushes through shared memory" % (cli.pid, os.geteuid()) in log, log[-3000:]


if __name__ == "__main__":
    h.main(test)

"""A worker started before psd and chiefd waits (saying why, in its status) and then trains."""
import harness as h


def worker_state(addr):
    s = h.stubs()
    import grpc
    with h.channel(addr) as ch:
        try:
            return s.worker_pb2_grpc.WorkerStub(ch).GetWorkerStatus(s.worker_pb2.WorkerStatusRequest(),
                                                                    timeout=1).state
        except grpc.RpcError as e:
            return "rpc error: %s" % e.code()


def wait_worker_state(addr, prefix, proc, timeout=20):
    end = h.time.monotonic() + timeout
    st = None
    while h.time.monotonic() < end:
        st = worker_state(addr)
        if st.startswith(prefix):
            return st
        assert proc.alive(), proc.stderr()
        h.time.sleep(0.1)
    raise AssertionError("worker state %r, expected %r..." % (st, prefix))


def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
    h.require("psd", "workerd", "chiefd")
    wd = h.Workdir()
    job, spec = h.make_job(wd, n_ps=1, n_workers=1, training={"max_steps": 200})
    chief_addr, ps_addr = spec["cluster"]["chief"][0], spec["cluster"]["ps"][0]
    w_addr = spec["cluster"]["worker"][0]

    w = h.daemon(wd, "workerd", job, 0)
    h.wait_healthy(w_addr, w)
    st = wait_worker_state(w_addr, "waiting: chief not reachable", w)
    h.log("worker alone:", st[:100])

    chief = h.daemon(wd, "chiefd", job)
    st = wait_worker_state(w_addr, "waiting: the job is not ready", w)
    h.log("worker with a chief but no psd:", st[:140])
    assert "ps:0" in st, st

    ps = h.daemon(wd, "psd", job, 0)
    h.wait_healthy(ps_addr, ps)
    t0 = h.time.monotonic()
    st = h.wait_state(chief_addr, "DONE", 60, [chief, ps, w])
    h.log("done in %.1f s after psd started: step %d, test accuracy %.4f"
          % (h.time.monotonic() - t0, st.global_step, st.test_accuracy))
    assert st.global_step >= 200
    assert 0 <= st.test_accuracy <= 1
    assert w.wait(20) == 0, w.stderr()
    worker = [n for n in st.nodes if n.task == "worker:0"][0]
    assert worker.local_step >= 200 and worker.state.startswith("done"), worker


if __name__ == "__main__":
    h.main(test)

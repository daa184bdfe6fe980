"""workerd's bounded waits show in WorkerStatus.waiting_for and its state line, and past their deadline
(supervisor.ready_timeout_secs) workerd exits 75, which systemd restarts: joining, for chief:0; and
re-reading the parameters after a ps shard was lost, for that shard."""
import signal
import time

import harness as h

EX_TEMPFAIL = 75


def worker_status(s, addr):
    with h.channel(addr) as ch:
        return s.worker_pb2_grpc.WorkerStub(ch).GetWorkerStatus(s.worker_pb2.WorkerStatusRequest(), timeout=2)


def wait_waiting_for(s, addr, peer, proc, timeout=30):
    import grpc
    end = time.monotonic() + timeout
    st = None
    while time.monotonic() < end:
        try:
            st = worker_status(s, addr)
            if st.HasField("waiting_for") and st.waiting_for.peer == peer:
                return st
        except grpc.RpcError:
            pass
        assert proc.alive(), proc.stderr()
        time.sleep(0.1)
    raise AssertionError("worker not waiting for %s: %s" % (peer, st))


def test():
    h.require("psd", "workerd", "chiefd")
    s = h.stubs()
    wd = h.Workdir()
    base = dict(h.load_example(), supervisor={"ready_timeout_secs": 3})

    # no chief: waits for chief:0, then exits 75
    job, spec = h.make_job(wd, "alone.json", training={"max_steps": 10}, base=base)
    w_addr = spec["cluster"]["worker"][0]
    t0 = time.monotonic()
    w = h.daemon(wd, "workerd", job, 0)
    st = wait_waiting_for(s, w_addr, "chief:0", w)
    h.log("alone:", st.state, "|", st.waiting_for)
    wf = st.waiting_for
    assert wf.deadline_us - wf.since_us == 3 * 1000000 and wf.last_error, wf
    assert st.state.startswith("waiting: chief not reachable") and "gives up in" in st.state, st.state
    assert w.wait(20) == EX_TEMPFAIL
    assert 2.5 < time.monotonic() - t0 < 15

    # training, then ps:0 gone for good: waits for ps:0, then exits 75
    job, spec = h.make_job(wd, "lost.json", training={"max_steps": 1000000}, base=base)
    chief_addr, ps_addr, w_addr = spec["cluster"]["chief"][0], spec["cluster"]["ps"][0], spec["cluster"]["worker"][0]
    chief = h.daemon(wd, "chiefd", job, state_dir=wd.file("state-lost"))
    ps = h.daemon(wd, "psd", job, 0)
    w = h.daemon(wd, "workerd", job, 0)
    h.wait_state(chief_addr, "TRAINING", 30, [chief, ps, w])
    assert not worker_status(s, w_addr).HasField("waiting_for")
    ps.kill(signal.SIGKILL)
    ps.wait(10)
    st = wait_waiting_for(s, w_addr, "ps:0", w)
    h.log("ps:0 lost:", st.state, "|", st.waiting_for)
    assert st.state.startswith("waiting: cannot read the parameters") and "gives up in" in st.state, st.state
    assert st.waiting_for.deadline_us - st.waiting_for.since_us == 3 * 1000000
    assert w.wait(20) == EX_TEMPFAIL
    assert "gave up waiting for ps:0 after supervisor.ready_timeout_secs=3" in w.stderr(), w.stderr()


if __name__ == "__main__":
    h.main(test)

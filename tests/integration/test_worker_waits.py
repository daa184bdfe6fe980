"""workerd's bounded waits show in WorkerStatus.waiting_for and its state line, and past their deadline
(supervisor.ready_timeout_secs) workerd exits 75, which systemd restarts: joining, for chief:0; and
re-reading the parameters after a ps shard was lost, for that shard. A worker restarted while the job
went on far without it joins again with the current parameters and trains on."""
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
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
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
    end = time.monotonic() + 15
    while chief.alive() and time.monotonic() < end:
        chief.kill(signal.SIGTERM)
        time.sleep(0.5)

    # worker:1 killed, the job goes far on without it, worker:1 started again: it rejoins where the job is
    job, spec = h.make_job(wd, "rejoin.json", n_workers=2, training={"max_steps": 3000})
    chief_addr = spec["cluster"]["chief"][0]
    chief = h.daemon(wd, "chiefd", job, state_dir=wd.file("state-rejoin"))
    ps = h.daemon(wd, "psd", job, 0)
    w0 = h.daemon(wd, "workerd", job, 0)
    w1 = h.daemon(wd, "workerd", job, 1)
    h.wait_state(chief_addr, "TRAINING", 30, [chief, ps, w0, w1])
    w1.kill(signal.SIGKILL)
    w1.wait(10)
    end = time.monotonic() + 60
    while h.job_status(chief_addr).global_step < 1500:
        assert time.monotonic() < end and w0.alive(), "the job did not go on without worker:1"
        time.sleep(0.2)
    gone_at = h.job_status(chief_addr).global_step
    w1 = h.Proc(wd, "worker:1-again", w1.argv)
    st = h.wait_state(chief_addr, "DONE", 120, [chief, ps, w0, w1])
    assert w1.wait(30) == 0, w1.stderr()
    log = w1.stderr()
    h.log("worker:1 rejoined after global_step %d:" % gone_at,
          [l for l in log.splitlines() if "resuming" in l or "done:" in l])
    assert "resuming at global_step" in log, log
    resumed = int(log.split("resuming at global_step ")[1].split(":")[0])
    assert resumed >= gone_at, (resumed, gone_at)
    local = int(log.split("done: ")[-1].split(" local steps")[0])
    assert local > 0 and st.global_step >= 3000, (local, st.global_step)


if __name__ == "__main__":
    h.main(test)

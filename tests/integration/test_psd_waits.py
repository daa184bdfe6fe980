"""psd's two bounded waits. For the chief's first Assign: its status shows waiting_for chief:0 with the
deadline of supervisor.ready_timeout_secs, and past it psd exits 75 (systemd restarts it). After
SIGTERM (ps.stop_grace_secs): it keeps answering Pull until the chief's Stop arrives, then exits 0;
without a Stop (the chief there but silent: SIGSTOP) it exits 0 at the grace's end; a second SIGTERM
ends it at once, and so does a chief that is gone (its port refuses connections)."""
import signal
import time

import harness as h

EX_TEMPFAIL = 75


def shard_status(s, addr):
    with h.channel(addr) as ch:
        return s.ps_pb2_grpc.ParameterServerStub(ch).GetShardStatus(s.ps_pb2.ShardStatusRequest(), timeout=2)


def pull(s, addr, fp):
    req = s.ps_pb2.PullRequest(header=s.ps_pb2.PullHeader(caller=s.tensor_pb2.Caller(fingerprint=fp, task="test")))
    with h.channel(addr) as ch:
        rep = s.ps_pb2_grpc.ParameterServerStub(ch).Pull(req, timeout=5)
    assert rep.tensors, rep.header
    return rep.header.global_step


def assigned_psd(wd, name, grace, chief_sig=signal.SIGSTOP):
    """A psd the chief has assigned; the chief then stopped (there, but no Stop comes from it) or
    killed. Returns (psd, its address, the fingerprint, the chief)."""
    job, spec = h.make_job(wd, name, training={"max_steps": 100}, ps={"stop_grace_secs": grace})
    chief_addr, ps_addr = spec["cluster"]["chief"][0], spec["cluster"]["ps"][0]
    chief = h.daemon(wd, "chiefd", job, state_dir=wd.file("state-" + name))
    ps = h.daemon(wd, "psd", job, 0)
    h.wait_healthy(ps_addr, ps)
    st = h.wait_state(chief_addr, "READY", 30, [chief, ps])
    chief.kill(chief_sig)
    if chief_sig == signal.SIGKILL:
        chief.wait(10)
    return ps, ps_addr, st.fingerprint, chief


def end_chief(chief):
    chief.kill(signal.SIGKILL)
    chief.kill(signal.SIGCONT)
    chief.wait(10)


def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
    h.require("psd", "chiefd")
    s = h.stubs()
    wd = h.Workdir()

    # a chief that never comes: waiting_for, then exit 75 after the ready timeout
    job, spec = h.make_job(wd, "alone.json", training={"max_steps": 10},
                           base=dict(h.load_example(), supervisor={"ready_timeout_secs": 4}))
    ps_addr = spec["cluster"]["ps"][0]
    t0 = time.monotonic()
    ps = h.daemon(wd, "psd", job, 0)
    h.wait_healthy(ps_addr, ps)
    st = shard_status(s, ps_addr)
    h.log("alone:", st.waiting_for)
    assert not st.initialized
    assert st.HasField("waiting_for") and st.waiting_for.peer == "chief:0", st
    wf = st.waiting_for
    assert wf.since_us > 0 and wf.deadline_us - wf.since_us == 4 * 1000000, wf
    assert abs(wf.since_us / 1e6 - time.time()) < 10, wf
    assert ps.wait(20) == EX_TEMPFAIL
    took = time.monotonic() - t0
    h.log("psd exited %d after %.1f s" % (ps.p.returncode, took))
    assert 3.5 < took < 10, took
    assert "no Assign from chief:0 within supervisor.ready_timeout_secs=4 s" in ps.stderr(), ps.stderr()

    # SIGTERM, then the chief's Stop: serves meanwhile, exits 0 when Stop arrives
    ps, ps_addr, fp, chief = assigned_psd(wd, "grace.json", 30)
    assert not shard_status(s, ps_addr).HasField("waiting_for")
    ps.kill(signal.SIGTERM)
    t0 = time.monotonic()
    for _ in range(3):
        time.sleep(0.5)
        pull(s, ps_addr, fp)
    st = shard_status(s, ps_addr)
    h.log("in the grace:", st.waiting_for)
    assert st.waiting_for.peer == "chief:0" and st.waiting_for.deadline_us - st.waiting_for.since_us == 30 * 1000000
    assert ps.alive()
    with h.channel(ps_addr) as ch:
        s.ps_pb2_grpc.ParameterServerStub(ch).Stop(s.ps_pb2.StopRequest(reason="test: final checkpoint taken"),
                                                   timeout=2)
    assert ps.wait(15) == 0
    assert time.monotonic() - t0 < 15
    err = ps.stderr()
    assert "serving for up to 30 s (ps.stop_grace_secs) until the chief's Stop" in err, err
    assert "stop requested: test: final checkpoint taken" in err, err
    end_chief(chief)

    # SIGTERM and no Stop: exits 0 at the grace's end
    ps, ps_addr, fp, chief = assigned_psd(wd, "nostop.json", 2)
    t0 = time.monotonic()
    ps.kill(signal.SIGTERM)
    time.sleep(0.5)
    pull(s, ps_addr, fp)
    assert ps.wait(20) == 0
    took = time.monotonic() - t0
    h.log("without Stop: exited after %.1f s" % took)
    assert 1.5 < took < 15, took
    assert "no Stop from the chief within ps.stop_grace_secs=2 s" in ps.stderr(), ps.stderr()
    end_chief(chief)

    # a second SIGTERM ends the grace at once
    ps, ps_addr, fp, chief = assigned_psd(wd, "twice.json", 60)
    ps.kill(signal.SIGTERM)
    time.sleep(1.5)
    assert ps.alive()
    t0 = time.monotonic()
    ps.kill(signal.SIGTERM)
    assert ps.wait(15) == 0
    assert time.monotonic() - t0 < 12
    end_chief(chief)

    # the chief gone: nobody will pull, so psd does not wait out the grace
    ps, ps_addr, fp, chief = assigned_psd(wd, "gone.json", 60, signal.SIGKILL)
    t0 = time.monotonic()
    ps.kill(signal.SIGTERM)
    assert ps.wait(15) == 0
    took = time.monotonic() - t0
    h.log("chief gone: psd exited after %.1f s" % took)
    assert took < 12, took
    assert "the chief is gone" in ps.stderr(), ps.stderr()


if __name__ == "__main__":
    h.main(test)

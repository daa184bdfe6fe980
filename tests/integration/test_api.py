"""The API is usable from another language: a Python grpcio client calls Health/Check on chiefd and psd,
Supervisor.GetStatus, ParameterServer.GetShardStatus, and gets UNIMPLEMENTED for an unknown method."""
import harness as h


def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
    h.require("psd", "chiefd")
    s = h.stubs()
    import grpc
    wd = h.Workdir()
    job, spec = h.make_job(wd, n_ps=1, n_workers=1, training={"max_steps": 100})
    chief_addr, ps_addr = spec["cluster"]["chief"][0], spec["cluster"]["ps"][0]

    chief = h.daemon(wd, "chiefd", job)
    h.wait_healthy(chief_addr, chief)
    # With no psd yet, the job waits, and says why.
    st = h.wait_state(chief_addr, "INITIALIZING", 10)
    assert st.job == "fmnist-mlp", st.job
    assert st.max_steps == 100 and st.test_accuracy == -1, st
    end = h.time.monotonic() + 10
    while "ps:0" not in st.reason and h.time.monotonic() < end:
        h.time.sleep(0.1)
        st = h.job_status(chief_addr)
    assert "waiting for ps:0 (%s)" % ps_addr in st.reason, st.reason
    h.log("reason while waiting:", st.reason)

    ps = h.daemon(wd, "psd", job, 0)
    h.wait_healthy(ps_addr, ps)
    st = h.wait_state(chief_addr, "READY", 15, [chief, ps])
    tasks = [n.task for n in st.nodes]
    assert tasks == ["ps:0", "worker:0"], tasks
    assert st.nodes[0].address == ps_addr and st.nodes[0].state.startswith("initialized"), st.nodes[0]
    assert st.nodes[1].state == "not joined", st.nodes[1]

    with h.channel(ps_addr) as ch:
        shard = s.ps_pb2_grpc.ParameterServerStub(ch).GetShardStatus(s.ps_pb2.ShardStatusRequest(), timeout=2)
    h.log("shard status:", str(shard).replace("\n", "; "))
    assert shard.shard == 0 and shard.initialized and shard.variables >= 8, shard  # parts: a split variable counts per part
    assert shard.bytes == 242762 * 4, shard.bytes

    # Health for a named service: ours SERVING, anything else NOT_FOUND.
    with h.channel(chief_addr) as ch:
        hs = s.health_pb2_grpc.HealthStub(ch)
        r = hs.Check(s.health_pb2.HealthCheckRequest(service="psfleet.v1.Supervisor"), timeout=2)
        assert r.status == s.health_pb2.HealthCheckResponse.SERVING
        try:
            hs.Check(s.health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=2)
            raise AssertionError("unknown health service answered")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.NOT_FOUND, e.code()
        # An unknown method: UNIMPLEMENTED at once, not a hang until the deadline.
        t0 = h.time.monotonic()
        try:
            ch.unary_unary("/psfleet.v1.Supervisor/NoSuchMethod")(b"", timeout=5)
            raise AssertionError("unknown method answered")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNIMPLEMENTED, e.code()
        assert h.time.monotonic() - t0 < 2

        # Join with a wrong fingerprint and no job description: refused, saying so.
        sup = s.supervisor_pb2_grpc.SupervisorStub(ch)
        rep = sup.Join(s.supervisor_pb2.JoinRequest(task="worker:0", fingerprint=1), timeout=2)
        assert rep.refused and not rep.ready and "fingerprint" in rep.reason, rep

        # Stop: the chief exits cleanly.
        sup.Stop(s.ps_pb2.StopRequest(reason="test"), timeout=2)
    assert chief.wait(10) == 0, chief.stderr()


if __name__ == "__main__":
    h.main(test)

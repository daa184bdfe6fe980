"""Mutual TLS end to end, with certificates made by `psfleet certs` as an administrator would.

A chief and a ps (no workers: the variables stay still) under security.mode mtls:
- a client with no certificate, one whose certificate comes from another CA, and a plain-TCP client
  are refused by the handshake; a client that expects another task than the server is refuses it;
- a viewer gets GetStatus but PERMISSION_DENIED on Push, Assign, ParameterServer.Stop,
  Supervisor.Stop and SaveCheckpoint; a worker gets PERMISSION_DENIED on Assign and both Stops;
  worker 1 cannot Report as worker 0, worker 0 cannot Push as worker 1; every refusal is one line in the daemon's log naming the peer;
- from an authorized worker, a Push of NaN and one of 1e30 (over training.max_gradient_norm) are
  rejected and a Pull before and after shows the parameters unchanged;
- a 512 MiB request gets RESOURCE_EXHAUSTED and, once the connection that sent it is closed, psd's
  resident memory comes back under its baseline plus twice the model's size (with its optimizer slot).
Then the demo job (examples/fmnist-mlp.json, 2 workers, shared memory) trains under mTLS to >= 0.88.
"""
import os
import struct
import threading
import time

import harness as h

JOB = "mtls"
MAX_NORM = 1000.0


def expect_code(what, fn, code, text=None):
    import grpc
    try:
        fn()
    except grpc.RpcError as e:
        h.log("%-40s %s: %s" % (what, e.code().name, (e.details() or "")[:160]))
        assert e.code() == code, (what, e.code(), e.details())
        assert text is None or text in (e.details() or ""), (what, e.details())
        return e
    raise AssertionError("%s: accepted" % what)


def probes(wd, job, spec, tls_dir, other_dir):
    import grpc
    s = h.stubs()
    chief_addr, ps_addr = spec["cluster"]["chief"][0], spec["cluster"]["ps"][0]
    chief, ps, fp = h.chief_and_ps(wd, job, spec)
    F32 = s.tensor_pb2.DTYPE_FLOAT32
    UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
    DENIED = grpc.StatusCode.PERMISSION_DENIED

    def health(ch):
        return s.health_pb2_grpc.HealthStub(ch).Check(s.health_pb2.HealthCheckRequest(), timeout=3)

    # ---- the handshake refuses whoever has no certificate of this job's CA
    with open(os.path.join(tls_dir, JOB, "ca.crt"), "rb") as f:
        ca = f.read()
    server = ("grpc.ssl_target_name_override", "ps-0.%s.psfleet" % JOB)
    with grpc.secure_channel(ps_addr, grpc.ssl_channel_credentials(root_certificates=ca), options=[server]) as ch:
        expect_code("no client certificate", lambda: health(ch), UNAVAILABLE)
    with h.channel(ps_addr, credentials=h.tls_credentials("worker-0", tls_dir=other_dir, ca_from=tls_dir)) as ch:
        expect_code("a certificate of another CA", lambda: health(ch), UNAVAILABLE)
    with grpc.insecure_channel(ps_addr) as ch:
        expect_code("plain TCP", lambda: health(ch), UNAVAILABLE)
    with grpc.secure_channel(ps_addr, h.tls_credentials("worker-0"),
                             options=[("grpc.ssl_target_name_override", "chief.%s.psfleet" % JOB)]) as ch:
        expect_code("a server that is not the task expected", lambda: health(ch), UNAVAILABLE)

    def ps_stub(identity):
        ch = h.channel(ps_addr, identity)
        return ch, s.ps_pb2_grpc.ParameterServerStub(ch)

    def chief_stub(identity):
        ch = h.channel(chief_addr, identity)
        return ch, s.supervisor_pb2_grpc.SupervisorStub(ch)

    def tensor(name, rows, cols, values, row_offset=0):
        return s.tensor_pb2.Tensor(name=name, dtype=F32, shape=[rows, cols], row_offset=row_offset,
                                   data=struct.pack("<%df" % len(values), *values))

    def push_req(grads, worker=0):
        caller = s.tensor_pb2.Caller(fingerprint=fp, task="worker:%d" % worker)
        hdr = s.ps_pb2.PushHeader(caller=caller, worker=worker, local_step=1, want_values=False, count_step=True)
        return s.ps_pb2.PushRequest(header=hdr, grads=grads)

    bias = tensor("dense3/bias", 1, 10, [0.01] * 10)

    # ---- a viewer reads, and may do nothing else
    vch, vps = ps_stub("viewer")
    cch, vsup = chief_stub("viewer")
    assert vsup.GetStatus(s.supervisor_pb2.StatusRequest(), timeout=5).fingerprint == fp
    assert vps.GetShardStatus(s.ps_pb2.ShardStatusRequest(), timeout=5).global_step == 0
    expect_code("viewer Push", lambda: vps.Push(push_req([bias]), timeout=5), DENIED, "viewer may not call")
    expect_code("viewer Assign", lambda: vps.Assign(s.ps_pb2.AssignRequest(), timeout=5), DENIED)
    expect_code("viewer ParameterServer.Stop", lambda: vps.Stop(s.ps_pb2.StopRequest(), timeout=5), DENIED)
    expect_code("viewer Supervisor.Stop", lambda: vsup.Stop(s.ps_pb2.StopRequest(), timeout=5), DENIED)
    expect_code("viewer SaveCheckpoint",
                lambda: vsup.SaveCheckpoint(s.supervisor_pb2.SaveCheckpointRequest(), timeout=5), DENIED)
    vch.close()
    cch.close()

    # ---- a worker pushes and pulls, and may not assign or stop anything
    wch, wps = ps_stub("worker-0")
    cch, wsup = chief_stub("worker-0")
    expect_code("worker Assign", lambda: wps.Assign(s.ps_pb2.AssignRequest(), timeout=5), DENIED, "chief only")
    expect_code("worker ParameterServer.Stop", lambda: wps.Stop(s.ps_pb2.StopRequest(), timeout=5), DENIED)
    expect_code("worker Supervisor.Stop", lambda: wsup.Stop(s.ps_pb2.StopRequest(), timeout=5), DENIED)
    report = s.supervisor_pb2.ReportRequest(worker=0, local_step=1, global_step=0, loss=2.3, state="training")
    wsup.Report(report, timeout=5)   # as itself: fine
    cch.close()
    c1, w1sup = chief_stub("worker-1")
    expect_code("worker 1 reporting as worker 0", lambda: w1sup.Report(report, timeout=5), DENIED,
                "worker/1 may not report as worker/0")
    c1.close()

    # ---- from an authorized worker, poison is refused and changes nothing
    before, gs0 = h.pull_shard(wps, fp)
    expect_code("worker Push of NaN", lambda: wps.Push(push_req([tensor("dense3/bias", 1, 10, [float("nan")] * 10)]),
                                                       timeout=5), grpc.StatusCode.INVALID_ARGUMENT, "NaN")
    expect_code("worker Push of 1e30", lambda: wps.Push(push_req([tensor("dense3/bias", 1, 10, [1e30] * 10)]),
                                                        timeout=5), grpc.StatusCode.INVALID_ARGUMENT)
    # a push speaks for the worker its header names (its place in a sync step, its clock under ssp)
    expect_code("worker 0 pushing as worker 1",
                lambda: wps.Push(push_req([tensor("dense3/bias", 1, 10, [0.5] * 10)], worker=1), timeout=5),
                DENIED, "Push as worker:1 from worker/0, which is not worker/1")
    after, gs1 = h.pull_shard(wps, fp)
    assert after == before and gs1 == gs0, "a refused push changed the shard"
    model_bytes = sum(len(v) for v in before.values())   # values and the optimizer's slot

    # ---- a 512 MiB request: refused, and psd's memory comes back
    time.sleep(1.5)
    baseline = h.proc_bytes(ps.pid)
    peak = [0]
    done = threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], h.proc_bytes(ps.pid))
            time.sleep(0.01)
    t = threading.Thread(target=watch)
    t.start()
    blob = b"\x0a" + os.urandom(512 << 20)
    t0 = time.monotonic()
    try:
        expect_code("a 512 MiB request", lambda: wch.unary_unary("/psfleet.v1.ParameterServer/Push")(blob, timeout=60),
                    grpc.StatusCode.RESOURCE_EXHAUSTED)
    finally:
        took = time.monotonic() - t0
        del blob
    # What gRPC holds for a connection (its read buffers, grown for the big message) goes with it: the
    # sender's connection closed, what stays is psd's own. With the connection open, up to 6 MB stayed
    # above the baseline in one CI run in several on a loaded machine.
    wch.close()
    settled = 0
    for _ in range(200):      # the watcher looks every second, and backs off 3 s after a fruitless try
        time.sleep(0.1)
        settled = h.proc_bytes(ps.pid)
        if settled <= baseline + 2 * model_bytes:
            break
    done.set()
    t.join()
    h.log("512 MiB request: refused in %.2f s; psd resident: baseline %.1f MB, peak %.1f MB, after %.1f MB; "
          "model with slots %.2f MB" % (took, baseline / 1e6, peak[0] / 1e6, settled / 1e6, model_bytes / 1e6))
    assert settled <= baseline + 2 * model_bytes, (baseline, settled, model_bytes)
    assert ps.alive() and chief.alive()

    # ---- every refusal is in the logs, naming the peer
    for proc, lines in ((ps, ["refused /psfleet.v1.ParameterServer/Push from viewer",
                              "refused /psfleet.v1.ParameterServer/Assign from worker/0",
                              "refused /psfleet.v1.ParameterServer/Stop from viewer"]),
                        (chief, ["refused /psfleet.v1.Supervisor/Stop from viewer",
                                 "refused /psfleet.v1.Supervisor/SaveCheckpoint from viewer",
                                 "refused /psfleet.v1.Supervisor/Stop from worker/0",
                                 "refused /psfleet.v1.Supervisor/Report from worker/1"])):
        log = proc.stderr()
        for line in lines:
            assert line in log, (line, log[-3000:])
    ps.kill()
    chief.kill()
    ps.wait(15)
    chief.wait(15)


def test():
    h.require("psd", "workerd", "chiefd", "psfleet")
    h.stubs()
    wd = h.Workdir()
    tls_dir, other_dir = wd.file("tls"), wd.file("other-ca")
    base = h.load_example()
    base["job"] = JOB
    base["security"] = {"mode": "mtls", "ca": tls_dir + "/{job}/ca.crt", "cert": tls_dir + "/{job}/{task}.crt",
                        "key": tls_dir + "/{job}/{task}.key"}
    job, spec = h.make_job(wd, n_ps=1, n_workers=2, base=base,
                           training={"max_steps": 100000, "max_gradient_norm": MAX_NORM})
    out = h.psfleet_certs(wd, job, tls_dir)
    h.log("psfleet certs:", out.strip().replace("\n", "; ")[:300])
    h.psfleet_certs(wd, job, other_dir)
    h.use_tls(tls_dir, spec, "admin")
    probes(wd, job, spec, tls_dir, other_dir)

    # ---- the demo, whole, under mutual TLS
    demo, _ = h.make_job(wd, name="demo.json", n_ps=1, n_workers=2, base=base)
    # --quiet keeps the progress display off; the children still log at info, so that each daemon's own
    # "mutual TLS as" line shows that it really runs under TLS
    p = h.psfleet_local(wd, demo, ["--quiet"], env={"PSFLEET_LOG_LEVEL": "info"})
    rc = p.wait(300)
    assert rc == 0, "exit %s:\n%s" % (rc, p.stderr()[-3000:])
    r = h.result_line(p)
    h.log("demo under mTLS:", r)
    assert "psfleet: job %s: chief at 127.0.0.1:" % JOB in p.stderr(), p.stderr()[-2000:]
    assert " (mutual TLS), state in " in p.stderr(), p.stderr()[-2000:]
    for task in ("chief", "ps-0", "worker-0", "worker-1"):
        assert "mutual TLS as %s of job %s" % (task, JOB) in p.stderr(), (task, p.stderr()[-2000:])
    assert r["test_accuracy"] >= 0.88, r


if __name__ == "__main__":
    h.main(test)

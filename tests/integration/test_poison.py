"""Input that cannot poison a model, even from a peer that may send it (issue 14). Through gRPC, as a
client playing a worker or the chief:

- training.max_gradient_norm with action reject: a Push of gradients of 1e30 (finite, so only the norm
  stops it) and a Push of NaN are refused INVALID_ARGUMENT and Pull shows the parameters unchanged;
- a Report of global_step 2^64-1 and a Report going back from the worker's last are refused
  INVALID_ARGUMENT; the job trains on to max_steps, as ps:0 counts them, and status never shows a step
  ps:0 does not have;
- with action clip the same Push is applied scaled to the limit: plain SGD moves the parameters by
  learning_rate x limit in norm, and GetShardStatus counts it;
- a model Assigned weights of 1e30 (as the chief would) reports a loss of NaN, not 0: the job ends
  FAILED saying so, and status and `psfleet status` show the loss as nan."""
import math
import struct
import subprocess

import harness as h

NORM_LIMIT = 1000.0   # far above a real push's norm (a few units), far below 1e30


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def unpack(data):
    return struct.unpack("<%df" % (len(data) // 4), data)


class Shard:
    """A client of ps:0 with the job's fingerprint, as the task it says it is."""

    def __init__(self, s, ch, fp, task="worker:0"):
        self.s = s
        self.stub = s.ps_pb2_grpc.ParameterServerStub(ch)
        self.fp = fp
        self.caller = s.tensor_pb2.Caller(fingerprint=fp, task=task)

    def pull(self):
        s = self.s
        r = self.stub.Pull(s.ps_pb2.PullRequest(header=s.ps_pb2.PullHeader(caller=self.caller)), timeout=5)
        return {(t.name, t.row_offset): t for t in r.tensors}, r.header.global_step

    def status(self):
        return self.stub.GetShardStatus(self.s.ps_pb2.ShardStatusRequest(), timeout=5)

    def tensor(self, name, rows, cols, values, row_offset=0):
        return self.s.tensor_pb2.Tensor(name=name, dtype=self.s.tensor_pb2.DTYPE_FLOAT32, shape=[rows, cols],
                                        row_offset=row_offset, data=f32(values))

    def push(self, grads):
        hdr = self.s.ps_pb2.PushHeader(caller=self.caller, worker=0, local_step=1, want_values=True)
        return self.stub.Push(self.s.ps_pb2.PushRequest(header=hdr, grads=grads), timeout=5)

    def assign(self, tensors):
        s = self.s
        chief = s.tensor_pb2.Caller(fingerprint=self.fp, task="chief:0")
        hdr = s.ps_pb2.AssignHeader(caller=chief, global_step=0)
        return self.stub.Assign(s.ps_pb2.AssignRequest(header=hdr, tensors=tensors), timeout=10)


def refused(what, call, code, msg):
    import grpc
    try:
        call()
    except grpc.RpcError as e:
        h.log("%-22s %s: %s" % (what, e.code().name, e.details()))
        assert e.code() == code, (what, e.code(), e.details())
        assert msg in e.details(), (what, e.details())
        return
    raise AssertionError("%s: accepted" % what)


def poison_grads(ps):
    return [ps.tensor("dense3/bias", 1, 10, [1e30] * 10), ps.tensor("dense2/bias", 1, 64, [-1e30] * 64)]


def start(wd, training, n_workers=1):
    job, spec = h.make_job(wd, n_ps=1, n_workers=n_workers, training=training)
    chief_addr, ps_addr = spec["cluster"]["chief"][0], spec["cluster"]["ps"][0]
    chief = h.daemon(wd, "chiefd", job)
    ps = h.daemon(wd, "psd", job, 0)
    h.wait_healthy(ps_addr, ps)
    st = h.wait_state(chief_addr, "READY", 30, [chief, ps])
    return job, chief_addr, ps_addr, chief, ps, st.fingerprint


def report(s, chief_addr, global_step, local_step=1, loss=0.5):
    with h.channel(chief_addr) as ch:
        q = s.supervisor_pb2.ReportRequest(worker=0, local_step=local_step, global_step=global_step, loss=loss,
                                           examples_per_s=1.0, examples=32, state="training")
        return s.supervisor_pb2_grpc.SupervisorStub(ch).Report(q, timeout=5)


def reject_and_reports(s):
    """Norm limit, action reject; then bogus Reports while a real worker trains."""
    import grpc
    wd = h.Workdir()
    max_steps = 1000
    job, chief_addr, ps_addr, chief, ps, fp = start(
        wd, {"max_steps": max_steps, "report_every_steps": 10, "max_gradient_norm": NORM_LIMIT,
             "gradient_norm_action": "reject"})
    with h.channel(ps_addr) as ch:
        shard = Shard(s, ch, fp)
        before, gs0 = shard.pull()
        rejected0 = shard.status().rejected
        refused("push 1e30", lambda: shard.push(poison_grads(shard)), grpc.StatusCode.INVALID_ARGUMENT,
                "over training.max_gradient_norm 1000; nothing applied")
        refused("push NaN", lambda: shard.push([shard.tensor("dense3/bias", 1, 10, [float("nan")] + [0.0] * 9)]),
                grpc.StatusCode.INVALID_ARGUMENT, 'gradient "dense3/bias" from worker:0 contains NaN or Inf')
        after, gs1 = shard.pull()
        assert {k: t.data for k, t in after.items()} == {k: t.data for k, t in before.items()}, \
            "a refused push changed the shard"
        assert gs1 == gs0
        st = shard.status()
        assert st.rejected == rejected0 + 2 and st.clipped == 0, st

    # A worker's word never ends the job: 2^64-1 is refused before and while a worker trains.
    refused("report 2^64-1", lambda: report(s, chief_addr, 2 ** 64 - 1), grpc.StatusCode.INVALID_ARGUMENT,
            "is beyond any step ps:0 can have")
    st = h.job_status(chief_addr)
    assert st.state == s.supervisor_pb2.JOB_STATE_READY and st.global_step == 0, st
    worker = h.daemon(wd, "workerd", job, 0)
    procs = [chief, ps, worker]

    def worker_reported():
        st = h.job_status(chief_addr)
        w = [n for n in st.nodes if n.task == "worker:0"][0]
        return st if w.last_report_us and w.local_step >= 10 and st.global_step < max_steps else None

    h.wait_for("worker:0's first report", worker_reported, 60, procs)
    refused("report going back", lambda: report(s, chief_addr, 1), grpc.StatusCode.INVALID_ARGUMENT,
            "goes back from its last")
    refused("report 2^64-1 training", lambda: report(s, chief_addr, 2 ** 64 - 1),
            grpc.StatusCode.INVALID_ARGUMENT, "is beyond any step ps:0 can have")
    st = h.job_status(chief_addr)
    assert st.global_step < max_steps and st.state == s.supervisor_pb2.JOB_STATE_TRAINING, st
    st = h.wait_state(chief_addr, "DONE", 120, procs)
    ps_step = [n for n in st.nodes if n.task == "ps:0"][0].local_step   # as the chief last read it
    h.log("DONE at global_step %d (ps:0 at %d), test accuracy %.4f" % (st.global_step, ps_step, st.test_accuracy))
    assert max_steps <= st.global_step == ps_step < max_steps + 16, (st.global_step, ps_step)
    assert "Report refused" in chief.stderr(), chief.stderr()[-2000:]
    assert worker.wait(30) == 0, worker.stderr()[-2000:]
    chief.kill()
    assert chief.wait(15) == 0, chief.stderr()[-2000:]
    ps.wait(15)


def clip(s):
    """Norm limit, action clip: the same push applied, scaled to the limit."""
    wd = h.Workdir()
    limit, lr = 2.0, 0.05
    job, chief_addr, ps_addr, chief, ps, fp = start(
        wd, {"max_steps": 100, "optimizer": "sgd", "learning_rate": lr, "lr_schedule": "constant",
             "max_gradient_norm": limit, "gradient_norm_action": "clip"})
    with h.channel(ps_addr) as ch:
        shard = Shard(s, ch, fp)
        before, _ = shard.pull()
        shard.push(poison_grads(shard))
        after, _ = shard.pull()
        moved = 0.0
        for k, t in before.items():
            a, b = unpack(after[k].data), unpack(t.data)
            moved += sum((x - y) ** 2 for x, y in zip(a, b))
        moved = math.sqrt(moved)
        h.log("clipped push moved the parameters by %.6g (learning_rate x limit = %.6g)" % (moved, lr * limit))
        assert lr * limit * 0.999 <= moved <= lr * limit * 1.001, moved
        st = shard.status()
        assert st.clipped == 1 and st.rejected == 0, st
    chief.kill()
    chief.wait(15)
    ps.kill()
    ps.wait(15)


def poisoned_weights(s):
    """Weights of 1e30, assigned as the chief would: the worker's loss is NaN, and the job fails so."""
    wd = h.Workdir()
    job, chief_addr, ps_addr, chief, ps, fp = start(wd, {"max_steps": 1000, "report_every_steps": 5})
    with h.channel(ps_addr) as ch:
        shard = Shard(s, ch, fp, task="chief:0")
        values, _ = shard.pull()
        poisoned = []
        for (name, row), t in values.items():
            n = len(t.data) // 4
            poisoned.append(shard.tensor(name, t.shape[0], t.shape[1], [1e30] * n, row_offset=row))
        shard.assign(poisoned)
    worker = h.daemon(wd, "workerd", job, 0)
    end = h.wait_for("the job to fail", lambda: (lambda st: st if st.state == s.supervisor_pb2.JOB_STATE_FAILED
                                                 else None)(h.job_status(chief_addr)), 60, [chief, ps])
    h.log("FAILED: %s; loss %s" % (end.reason, end.loss))
    assert "worker:0 reported a non-finite loss (nan) at global_step" in end.reason, end.reason
    assert "the model diverged or was poisoned" in end.reason, end.reason
    assert math.isnan(end.loss), end.loss
    out = subprocess.run([h.BIN["psfleet"], "status", "--address", chief_addr], capture_output=True, text=True)
    h.log("psfleet status:\n" + out.stdout)
    assert ": failed" in out.stdout.splitlines()[0] and "non-finite loss (nan)" in out.stdout, out.stdout
    loss_line = [l for l in out.stdout.splitlines() if l.strip().startswith("loss ")]
    assert loss_line and "nan" in loss_line[0], out.stdout
    assert "loss 0.0000" not in out.stdout, out.stdout
    assert "the model diverged or was poisoned" in worker.stderr(), worker.stderr()[-2000:]
    # told to stop by the chief's answer
    assert worker.wait(30) == 0, worker.stderr()[-2000:]
    chief.kill()
    chief.wait(15)
    ps.kill()
    ps.wait(15)


def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
    h.require("psd", "chiefd", "workerd", "psfleet")
    s = h.stubs()
    reject_and_reports(s)
    clip(s)
    poisoned_weights(s)


if __name__ == "__main__":
    h.main(test)

"""The cross-host levers together: the demo model, 1 ps + 1 worker, every tensor through gRPC
(rpc.shared_memory off), pushes overlapped with the next step (training.overlap_push) and in bfloat16
(rpc.wire_dtype). The job trains to its end and still learns (test accuracy >= 0.80 after ~2 epochs,
as integration.accuracy asks of the default job; 0.85-0.86 measured); psd's counters show every push
travelled in bfloat16: exactly 2 bytes per parameter in and out per push. (With two workers the
overlap's extra staleness costs accuracy with this job's momentum: docs/performance.md.)"""
import harness as h

STEPS = 2000


def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
    h.require("psd", "workerd", "chiefd")
    wd = h.Workdir()
    job, spec = h.make_job(wd, n_ps=1, n_workers=1, training={"max_steps": STEPS, "overlap_push": True},
                           rpc={"shared_memory": False, "wire_dtype": "bfloat16"})
    chief_addr = spec["cluster"]["chief"][0]
    chief, ps = h.chief_and_ps(wd, job, spec)[:2]
    worker = h.daemon(wd, "workerd", job, 0)

    # mid-run (psd stops with the job): the bytes of the pushes so far, within one step's
    shard = h.wait_pushes(spec["cluster"]["ps"][0], 1000, [worker, chief, ps])
    n_params = shard.bytes // 4   # the variables' values it holds, float32
    per_step = n_params * 2       # a step's gradients in bfloat16
    steps = shard.pushes / 5      # a push per group: 5 groups per step for this model
    h.log("pushes %d, bytes in %d, out %d, parameters %d" % (shard.pushes, shard.bytes_in, shard.bytes_out, n_params))
    assert abs(shard.bytes_in - steps * per_step) <= per_step, shard
    assert abs(shard.bytes_out - shard.bytes_in) <= per_step, shard

    assert worker.wait(240) == 0, worker.stderr()[-3000:]
    assert "pushing through shared memory" not in worker.stderr()
    st = h.wait_state(chief_addr, "DONE", 120, [chief])
    h.log("state DONE, global_step %d, test accuracy %.4f" % (st.global_step, st.test_accuracy))
    assert st.global_step >= STEPS, st
    assert st.test_accuracy >= 0.80, st
    for p in (chief, ps):
        p.kill()


if __name__ == "__main__":
    h.main(test)

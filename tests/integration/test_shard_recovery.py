"""supervisor.recovery shard (issue 30): in a 2 ps + 2 workers job, a psd is killed (-9) and started
again, twice (ps:1, then ps:0, which owns global_step). Each time only the lost shard is restored from
the newest checkpoint: the other shard's variables and slots are bit-for-bit what they were before the
kill (the workers are frozen around it, so nothing else changes them), global_step, polled throughout,
never goes back, the loss is recorded (shard, restored step, the job's step, steps of that shard's
updates lost), and the job finishes DONE."""
import signal
import threading
import time

import harness as h

STEPS = 2500


def pull(addr, fingerprint):
    s = h.stubs()
    with h.channel(addr) as ch:
        return h.pull_shard(s.ps_pb2_grpc.ParameterServerStub(ch), fingerprint)


def test():
    h.plain_rpc()
    h.require_built("psd", "workerd", "chiefd")
    wd = h.Workdir()
    job, spec = h.make_job(wd, n_ps=2, n_workers=2,
                           training={"max_steps": STEPS, "report_every_steps": 20},
                           supervisor={"save_checkpoint_steps": 500, "save_checkpoint_secs": 0,
                                       "save_summaries_secs": 0, "recovery": "shard"})
    chief_addr, ps_addr = spec["cluster"]["chief"][0], spec["cluster"]["ps"]
    state = wd.file("state")
    starts = {}

    def start(kind, index=None):
        n = starts[(kind, index)] = starts.get((kind, index), 0) + 1
        argv = [h.BIN[kind], "--job", job, "--state-dir", state]
        if index is not None:
            argv += ["--task-index", str(index)]
        return h.Proc(wd, "%s%s.%d" % (kind, "" if index is None else ":%d" % index, n), argv)

    ps = [start("psd", 0), start("psd", 1)]
    chief = start("chiefd")
    workers = [start("workerd", 0), start("workerd", 1)]

    # global_step as shard 0 reports it, polled throughout: it must never go back
    seen, stop = [], threading.Event()

    def poll():
        while not stop.is_set():
            st = h.rpc_or_none(lambda: h.shard_status(ps_addr[0], timeout=1))
            if st is not None and st.initialized:
                seen.append(st.global_step)
            time.sleep(0.05)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        for victim, at in ((1, 700), (0, 1700)):
            other = 1 - victim
            h.wait_for("global_step %d" % at, lambda: (lambda s: s is not None and s.initialized and s.global_step >= at)(
                h.rpc_or_none(lambda: h.shard_status(ps_addr[0], timeout=1))), 240, ps + [chief] + workers)
            for w in workers:
                w.kill(signal.SIGSTOP)
            time.sleep(0.8)   # pushes in flight settle; the chief polls the step the workers reached
            fp = h.job_status(chief_addr).fingerprint
            before, _ = pull(ps_addr[other], fp)
            g = h.shard_status(ps_addr[0], timeout=1).global_step
            n_losses = len(h.job_status(chief_addr).losses)
            h.kill_now(ps[victim])
            t0 = time.monotonic()
            ps[victim] = start("psd", victim)
            h.wait_for("ps:%d restored" % victim, lambda: (lambda s: s is not None and s.initialized)(
                h.rpc_or_none(lambda: h.shard_status(ps_addr[victim], timeout=1))), 60, ps + [chief])
            took = time.monotonic() - t0
            js = h.wait_for("the loss recorded", lambda: (lambda j: j if len(j.losses) > n_losses else None)(
                h.job_status(chief_addr)), 30, [chief])
            loss = js.losses[-1]
            after, gs_after = pull(ps_addr[other], fp)
            g_after = h.shard_status(ps_addr[0], timeout=1).global_step
            h.log("ps:%d killed at global_step %d: restored in %.2f s from the checkpoint of %d, %d steps of its "
                  "updates lost; global_step now %d" % (victim, g, took, loss.restored_step, loss.steps_lost, g_after))
            assert loss.shard == victim, loss
            assert loss.restored_step <= g and loss.job_step <= g, (loss, g)   # a checkpoint may fall in the freeze
            assert loss.steps_lost == loss.job_step - loss.restored_step, loss
            assert g_after == g, ("global_step went from %d to %d" % (g, g_after))
            assert before.keys() == after.keys()
            changed = [k for k in before if before[k] != after[k]]
            assert not changed, "ps:%d's values changed with ps:%d's restore: %s" % (other, victim, changed[:5])
            for w in workers:
                w.kill(signal.SIGCONT)
        final = h.wait_state(chief_addr, "DONE", 300, ps + [chief])
    finally:
        stop.set()
        poller.join(5)
    back = [(a, b) for a, b in zip(seen, seen[1:]) if b < a]
    h.log("done at global_step %d, test accuracy %.4f; %d polls of global_step, %d losses recorded"
          % (final.global_step, final.test_accuracy, len(seen), len(final.losses)))
    assert not back, "global_step went back: %s" % back[:5]
    assert final.global_step >= STEPS
    assert len(final.losses) == 2 and final.steps_lost == sum(l.steps_lost for l in final.losses), final.losses
    assert final.test_accuracy > 0.5, final.test_accuracy


if __name__ == "__main__":
    h.main(test)

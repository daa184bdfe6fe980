"""A whole-job restart counts the steps it does again (issue 29: what a Slurm requeue after a power cut
does to a job).

Real daemons (1 ps, 1 worker), a checkpoint every 500 steps. Mid-training every process is killed at
once with SIGKILL, as a power cut does; started again on the same state directory, the chief restores
the shard from the newest checkpoint, behind the step the job had reached (its workers' last reports).
It records the difference in its losses table and in JobStatus.losses, one row per restored shard,
says so in the journal, and the job goes on to the end. A second, orderly stop (SIGTERM: a final
checkpoint) and start loses nothing and records nothing more."""
import os
import signal

import harness as h

STEPS, EVERY = 4000, 500


def test():
    h.plain_rpc()
    h.require("psd", "chiefd", "workerd")
    wd = h.Workdir()
    job, spec = h.make_job(wd, n_ps=1, n_workers=1,
                           training={"max_steps": STEPS, "report_every_steps": 10},
                           supervisor={"save_checkpoint_steps": EVERY, "save_checkpoint_secs": 0,
                                       "save_summaries_secs": 0})
    chief_addr, ps_addr = spec["cluster"]["chief"][0], spec["cluster"]["ps"][0]
    db = os.path.join(wd.file("state"), spec["job"], "chief.db")

    def start(n):
        return [h.daemon(wd, "psd", job, 0, name="ps.%d" % n), h.daemon(wd, "chiefd", job, name="chief.%d" % n),
                h.daemon(wd, "workerd", job, 0, name="worker.%d" % n)]

    procs = start(1)
    # past a periodic checkpoint, and a few reports past it
    first = h.wait_for("the first periodic checkpoint", lambda: [c.global_step for c in (h.rpc_or_none(
        lambda: h.list_checkpoints(chief_addr, 2)) or []) if c.global_step >= EVERY], 120, procs, poll=0.01)[0]
    h.wait_for("60 steps past it", lambda: (lambda st: st is not None and st.global_step >= first + 60)(
        h.rpc_or_none(lambda: h.shard_status(ps_addr))), 120, procs, poll=0.01)
    for p in procs:   # a power cut: nothing gets to save or record anything more
        p.kill(signal.SIGKILL)
    for p in procs:
        p.p.wait(10)
        h._procs.remove(p)
    reached = max(r[0] for r in h.db_query(db, "SELECT global_step FROM progress"))
    newest = max(r[0] for r in h.db_query(db, "SELECT global_step FROM checkpoints"))
    h.log("killed every process: the workers had reported global_step %d, the newest checkpoint is at %d"
          % (reached, newest))
    assert reached > newest >= EVERY, (reached, newest)

    procs = start(2)
    chief = procs[1]
    h.wait_for("the restart's loss", lambda: h.rpc_or_none(lambda: h.job_status(chief_addr).losses), 60, procs)
    st = h.job_status(chief_addr)
    loss = st.losses[0]
    h.log("recorded: %s" % [(l.shard, l.restored_step, l.job_step, l.steps_lost) for l in st.losses])
    assert len(st.losses) == 1 and loss.shard == 0, st.losses
    assert loss.restored_step == newest and loss.job_step == reached, (loss, newest, reached)
    assert loss.steps_lost == reached - newest and st.steps_lost == loss.steps_lost, st
    assert h.db_query(db, "SELECT shard, restored_step, job_step, steps_lost FROM losses") == \
        [(0, newest, reached, reached - newest)]
    assert ("ps:0 lost its variables: every shard restored from the checkpoint of global_step %d; %d steps of "
            "updates lost (the job was at global_step %d)" % (newest, reached - newest, reached)) in chief.stderr(), \
        chief.stderr()[-3000:]

    # an orderly stop and start: the final checkpoint is where the job was, nothing lost
    h.wait_for("training past the restart", lambda: h.job_status(chief_addr).global_step > reached + 100, 120, procs)
    chief.kill(signal.SIGTERM)
    h.wait_for("the chief's final checkpoint", lambda: not chief.alive(), 60)
    for p in procs:
        p.kill(signal.SIGTERM)
        p.wait(30)
    procs = start(3)
    st = h.wait_state(chief_addr, "DONE", 240, procs)
    h.log("done at global_step %d, test accuracy %.4f; losses %d" % (st.global_step, st.test_accuracy, len(st.losses)))
    assert st.global_step >= STEPS and len(st.losses) == 1 and st.steps_lost == reached - newest, st
    for p in procs:
        p.kill(signal.SIGTERM)
        p.wait(30)


if __name__ == "__main__":
    h.main(test)

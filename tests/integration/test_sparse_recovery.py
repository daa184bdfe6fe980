"""A ps shard holding embedding rows is killed (-9) in the middle of a job with embeddings
(examples/ctr-widedeep.json's model, 1 ps + 1 worker, a checkpoint every 100 steps) and started again:
the chief restores it from the newest checkpoint, embedding tables included (their rows are back
before the worker, frozen meanwhile, touches anything), and the job finishes DONE with a test AUC near
the planted model's, its evaluations' AUC and log loss in the TensorBoard summaries (read with
TensorBoard's own reader, pyenv.py). Also: bytes per step on the sparse path follow the batch's unique
ids (the shard's counters: 8 bytes per id and 4 x dim per row or gradient, nothing else)."""
import json
import os
import signal
import time

import harness as h
import pyenv

ROWS, TEST_ROWS, STEPS = 60000, 10000, 1000




def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
    pyenv.ensure()
    from tensorboard.backend.event_processing import event_accumulator
    h.require_built("psd", "workerd", "chiefd", "psfleet")
    wd = h.Workdir()
    data = h.ctr_data(wd, ROWS, TEST_ROWS, seed=3)
    planted = json.load(open(os.path.join(data, "test.tsv.gz.meta.json")))["planted_auc"]
    base = h.ctr_example(data)
    base["supervisor"] = {"save_checkpoint_steps": 100, "save_checkpoint_secs": 0, "save_summaries_secs": 1,
                          "eval_every_steps": 250}
    job, spec = h.make_job(wd, n_ps=1, n_workers=1, base=base,
                           training={"max_steps": STEPS, "report_every_steps": 20})
    chief_addr, ps_addr = spec["cluster"]["chief"][0], spec["cluster"]["ps"][0]
    state = wd.file("state")

    def start(kind, index=None, n=1):
        argv = [h.BIN[kind], "--job", job, "--state-dir", state]
        if index is not None:
            argv += ["--task-index", str(index)]
        return h.Proc(wd, "%s.%d" % (kind, n), argv)

    ps = start("psd", 0)
    chief = start("chiefd")
    worker = start("workerd", 0)
    procs = [ps, chief, worker]
    h.wait_for("global_step 450", lambda: (lambda s: s is not None and s.initialized and s.global_step >= 450)(
        h.rpc_or_none(lambda: h.shard_status(ps_addr))), 180, procs)

    # bytes per step follow the unique ids: what came in is 8 bytes per id plus a gradient row per
    # pushed id, what went out a row per pulled id; pushed ids were pulled the step before
    st = h.shard_status(ps_addr)
    dims = {e["name"]: e["dim"] for e in base["model"]["embeddings"]}
    for t in st.tables:
        d = dims[t.name]
        assert t.rows > 0 and t.ids_in > 0, t
        pulled = t.bytes_out // (4 * d)
        assert t.bytes_out == pulled * 4 * d, t
        pushed = t.ids_in - pulled
        assert t.bytes_in == 8 * t.ids_in + 4 * d * pushed, t
        # every step's pull is its unique ids: at most 26 per record, far fewer than batch x fields
        assert pulled <= 26 * 256 * st.global_step, t
        h.log("table %s: %d rows, %d ids in, %.0f bytes in and %.0f out per id" %
              (t.name, t.rows, t.ids_in, t.bytes_in / t.ids_in, t.bytes_out / max(1, pulled)))

    worker.kill(signal.SIGSTOP)
    time.sleep(0.5)
    h.kill_now(ps)
    time.sleep(1.0)
    ps = start("psd", 0, 2)
    procs = [ps, chief, worker]
    st = h.wait_shard_initialized(ps_addr, "ps:0 restored by the chief", 60, [ps, chief])
    restored = {t.name: t.rows for t in st.tables}
    h.log("restored at global_step %d: rows %s" % (st.global_step, restored))
    assert st.global_step >= 300, st.global_step
    # the tables come back with the dense variables, before the shard takes any exchange: a worker
    # must never see a restored shard's fresh initial rows in place of its checkpointed ones
    assert all(n > 0 for n in restored.values()), restored
    worker.kill(signal.SIGCONT)
    final = h.wait_state(chief_addr, "DONE", 300, procs)
    h.log("done: global_step %d, test AUC %.4f (planted %.4f)" % (final.global_step, final.test_auc, planted))
    assert final.global_step >= STEPS
    assert final.test_auc >= planted - 0.06, (final.test_auc, planted)
    worker.p.wait(30)   # the chief stays up after DONE, answering for the job; the harness stops it
    acc = event_accumulator.EventAccumulator(os.path.join(state, spec["job"], "summaries"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"eval/auc", "eval/logloss"} <= tags, tags
    auc = acc.Scalars("eval/auc")
    assert auc[-1].step >= STEPS and abs(auc[-1].value - final.test_auc) < 1e-4, (auc[-1], final.test_auc)
    assert len(auc) >= 2 and auc[0].step < STEPS, auc   # an evaluation during training too
    h.log("summaries: eval/auc at steps %s" % [e.step for e in auc])


if __name__ == "__main__":
    h.main(test)

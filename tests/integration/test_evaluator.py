"""TF_CONFIG's evaluator task, as the training-operator starts a TFJob's Evaluator replica.

A job of 1 ps + 1 worker + the chief + the evaluator, each started as `psfleet run JOB.json` with only
TF_CONFIG (the same cluster, with its "evaluator" entry, for every task). The evaluator starts first and
waits for the chief (a logged, bounded wait). The demo trains STEPS steps with a checkpoint every 100,
its worker slowed down (PSFLEET_TEST_SLOW_STEP_MS) so that the evaluator sees checkpoints come while the
job trains; then:
1. the evaluator evaluated every recorded checkpoint, oldest first, each once (its journal lines), and
   wrote eval/accuracy and eval/loss for each into its own event file, <summaries>/eval, read back with
   TensorBoard's EventAccumulator;
2. its evaluation of the final checkpoint has the chief's final test accuracy and loss to 4 decimals
   (the same values, the same code);
3. the chief did no periodic evaluation (supervisor.eval_every_steps is set): one evaluation row, the
   final one, and it said why;
4. every task exits 0 (the evaluator once the job is DONE and the last checkpoint evaluated, even after
   the chief has gone), and nothing is left running (the harness checks);
5. `psfleet certs` issues the evaluator's certificate when TF_CONFIG's cluster has one, and only then;
6. under mutual TLS (the job's own CA, security.mode auto on loopback) the evaluator presents its own
   certificate (role evaluator) and reads the chief's list the same way;
7. a model with embedding tables (the wide-and-deep example on generated rows) and incremental
   checkpoints: the evaluator rebuilds each checkpoint's tables from its chain, and its AUC of the final
   checkpoint is the chief's final test AUC to 4 decimals."""
import json
import os
import re
import sqlite3
import subprocess

import harness as h
import pyenv

STEPS = 600
SLOW_STEP_MS = 8   # about 5 s of training: several looks of the evaluator (one a second) while it trains
SUPERVISOR = {"save_checkpoint_steps": 100, "save_checkpoint_secs": 0, "eval_every_steps": 100,
              "save_summaries_secs": 1, "keep_checkpoints": 20}
CTR_ROWS, CTR_TEST_ROWS, CTR_STEPS = 20000, 3000, 300
AUC_LINE = re.compile(r"Evaluation at global_step (\d+): test AUC ([0-9.]+), log loss ([0-9.]+), accuracy ([0-9.]+)")
EVAL_LINE = re.compile(r"Evaluation at global_step (\d+): test accuracy ([0-9.]+), test loss ([0-9.]+) "
                       r"\((\d+) examples\)")


def tf_config(cluster, task_type, index=0):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}, "environment": "cloud"})


def run_job(wd, job, cluster, state, worker_env=None, tls=False):
    """Starts the evaluator first, then ps, chief and worker, each as `psfleet run` with TF_CONFIG; waits
    for every one to exit 0. Returns (evaluator, chief). Under TLS, readiness is the daemons' own
    "Listening" lines (the harness's health checks are plain gRPC)."""
    def run(task_type, env=None):
        return h.Proc(wd, "run-" + task_type, [h.BIN["psfleet"], "run", job, "--state-dir", state],
                      dict({"TF_CONFIG": tf_config(cluster, task_type)}, **(env or {})))

    def ready(addr, p):
        if tls:
            h.wait_for(p.name + " to listen", lambda: "on %s" % addr in p.stderr(), 30, [p])
        else:
            h.wait_healthy(addr, p)

    evaluator = run("evaluator")
    h.wait_for("the evaluator to wait for the chief", lambda: "Waiting for the chief" in evaluator.stderr(), 30,
               [evaluator])
    ps = run("ps")
    ready(cluster["ps"][0], ps)
    chief = run("chief")
    ready(cluster["chief"][0], chief)
    worker = run("worker", worker_env)
    for p in (worker, chief, ps, evaluator):
        assert p.wait(240) == 0, "%s: %s" % (p.name, p.stderr()[-3000:])
    return evaluator, chief


def test_tls(wd):
    job, spec = h.make_job(wd, "tls.json", n_ps=1, n_workers=1, training={"max_steps": 300},
                           supervisor=dict(SUPERVISOR, eval_every_steps=0))
    cluster = dict(spec["cluster"], evaluator=["127.0.0.1:%d" % h.free_ports(1)[0]])
    state = wd.file("tls-state")
    evaluator, _ = run_job(wd, job, cluster, state, {"PSFLEET_TEST_SLOW_STEP_MS": str(SLOW_STEP_MS)}, tls=True)
    log = evaluator.stderr()
    assert "mutual TLS as evaluator of job" in log, log
    assert "The chief answers: the job is" in log, log
    assert "The job has ended (done)" in log, log
    h.log("under mutual TLS: %d evaluations" % len(EVAL_LINE.findall(log)))


def test_ctr(wd):
    data = h.ctr_data(wd, CTR_ROWS, CTR_TEST_ROWS, seed=5)
    base = h.ctr_example(data, "ctr-eval")
    job, spec = h.make_job(wd, "ctr.json", n_ps=1, n_workers=1, base=base, training={"max_steps": CTR_STEPS},
                           supervisor={"save_checkpoint_steps": 60, "save_checkpoint_secs": 0, "eval_every_steps": 60,
                                       "save_summaries_secs": 1, "keep_checkpoints": 20, "full_checkpoint_every": 3})
    cluster = dict(spec["cluster"], evaluator=["127.0.0.1:%d" % h.free_ports(1)[0]])
    state = wd.file("ctr-state")
    evaluator, chief = run_job(wd, job, cluster, state, {"PSFLEET_TEST_SLOW_STEP_MS": "10"})
    con = sqlite3.connect("file:%s?mode=ro" % os.path.join(state, spec["job"], "chief.db"), uri=True)
    step, auc = con.execute("SELECT global_step, test_auc FROM job").fetchone()
    rows = con.execute("SELECT global_step, parent_step FROM checkpoints ORDER BY global_step").fetchall()
    con.close()
    seen = [(int(m.group(1)), float(m.group(2))) for m in AUC_LINE.finditer(evaluator.stderr())]
    h.log("ctr: checkpoints (step, parent) %s; evaluator %s; the chief's AUC %.4f" % (rows, seen, auc))
    assert any(p for _, p in rows), rows   # some incremental ones: chains were read
    assert [s for s, _ in seen] == [s for s, _ in rows], (seen, rows)
    assert seen[-1][0] == step and round(seen[-1][1], 4) == round(auc, 4), (seen[-1], step, auc)
    assert [int(m.group(1)) for m in AUC_LINE.finditer(chief.stderr())] == [step]


def test():
    h.require("psd", "workerd", "chiefd", "psfleet")
    pyenv.ensure()
    from tensorboard.backend.event_processing import event_accumulator
    wd = h.Workdir()
    test_tls(wd)    # before plain_rpc: its job runs the default, mutual TLS with its own CA
    h.plain_rpc()   # from here, readiness by plain health checks, as test_run.py
    job, spec = h.make_job(wd, n_ps=1, n_workers=1, training={"max_steps": STEPS}, supervisor=SUPERVISOR)
    cluster = dict(spec["cluster"], evaluator=["127.0.0.1:%d" % h.free_ports(1)[0]])
    state = wd.file("state")
    evaluator, chief = run_job(wd, job, cluster, state, {"PSFLEET_TEST_SLOW_STEP_MS": str(SLOW_STEP_MS)})
    ev_log, chief_log = evaluator.stderr(), chief.stderr()

    con = sqlite3.connect("file:%s?mode=ro" % os.path.join(state, spec["job"], "chief.db"), uri=True)
    state_no, step, acc, loss = con.execute("SELECT state, global_step, test_accuracy, test_loss FROM job").fetchone()
    ckpt_steps = sorted(r[0] for r in con.execute("SELECT global_step FROM checkpoints"))
    evals = con.execute("SELECT global_step FROM evaluations").fetchall()
    con.close()
    h.log("chief.db: state %d, global_step %d, test accuracy %.4f, loss %.4f; checkpoints %s" %
          (state_no, step, acc, loss, ckpt_steps))
    assert state_no == 6 and step >= STEPS, (state_no, step)   # JOB_STATE_DONE
    assert len(ckpt_steps) >= 4, ckpt_steps

    # 1. every checkpoint, oldest first, once
    seen = [(int(m.group(1)), float(m.group(2)), float(m.group(3)), int(m.group(4))) for m in EVAL_LINE.finditer(ev_log)]
    h.log("evaluator: %s" % ", ".join("%d: %.4f" % (s, a) for s, a, _, _ in seen))
    assert [s for s, _, _, _ in seen] == ckpt_steps, (seen, ckpt_steps)
    assert all(n == 10000 for _, _, _, n in seen), seen
    assert "Waiting for the chief" in ev_log and "giving up in" in ev_log, ev_log[-2000:]
    assert "The chief answers: the job is" in ev_log, ev_log[-2000:]   # ListCheckpoints while it trained
    assert "The job has ended (done)" in ev_log, ev_log[-2000:]
    sumdir = os.path.join(state, spec["job"], "summaries", "eval")
    ea = event_accumulator.EventAccumulator(sumdir)
    ea.Reload()
    points = ea.Scalars("eval/accuracy")
    assert [e.step for e in points] == ckpt_steps, points
    assert [e.step for e in ea.Scalars("eval/loss")] == ckpt_steps
    for e, (s, a, _, _) in zip(points, seen):
        assert abs(e.value - a) < 1e-4, (e, a)

    # 2. the final checkpoint, the chief's final figures
    last_step, last_acc, last_loss, _ = seen[-1]
    assert last_step == step, (seen[-1], step)
    assert round(last_acc, 4) == round(acc, 4) and round(last_loss, 4) == round(loss, 4), (seen[-1], acc, loss)
    assert abs(points[-1].value - acc) < 1e-4, (points[-1], acc)

    # 3. the chief evaluated only at the end
    chief_evals = [int(m.group(1)) for m in EVAL_LINE.finditer(chief_log)]
    assert chief_evals == [step], chief_evals
    assert evals == [(step,)], evals
    assert "The cluster has an evaluator" in chief_log, chief_log[-3000:]
    h.log("evaluator: %d checkpoints evaluated, the last at global_step %d: accuracy %.4f (chief %.4f), loss %.4f "
          "(chief %.4f)" % (len(seen), last_step, last_acc, acc, last_loss, loss))

    # 5. its certificate
    for with_eval in (True, False):
        tls = wd.file("tls-%s" % with_eval)
        cl = cluster if with_eval else spec["cluster"]
        r = subprocess.run([h.BIN["psfleet"], "certs", "--job", job, "--dir", tls], capture_output=True, text=True,
                           env=h.child_env({"TF_CONFIG": json.dumps({"cluster": cl})}), timeout=60)
        assert r.returncode == 0, r.stderr
        crt = os.path.join(tls, spec["job"], "evaluator.crt")
        assert os.path.exists(crt) == with_eval, r.stdout
        assert ("DNS evaluator.%s.psfleet" % spec["job"] in r.stdout) == with_eval, r.stdout

    test_ctr(wd)


if __name__ == "__main__":
    h.main(test)

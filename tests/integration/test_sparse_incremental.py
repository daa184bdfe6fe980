"""Incremental checkpoints of a job with embedding tables (examples/ctr-widedeep.json's model, 1 ps + 1
worker, a checkpoint every 50 steps, only the first one full): the chief writes increments chained to the
checkpoint before (chief.db's parent_step, the file's metadata), smaller than the full ones, never
prunes a full checkpoint that a kept increment needs; a ps shard killed (-9) after a checkpoint taken
with the worker stopped comes back from the chain (the full one, then each increment) with exactly the
rows it had, at that checkpoint's global_step; with that increment corrupt and the shard killed again,
the chain restores to the link before it and the steps after it are recorded as lost; the job
finishes DONE."""
import json
import os
import signal
import sqlite3
import subprocess
import time

import harness as h
import pyenv

ROWS, TEST_ROWS, STEPS = 30000, 5000, 600




def records(db):
    con = sqlite3.connect("file:%s?mode=ro" % db, uri=True)
    try:
        rows = con.execute("SELECT global_step, path, bytes, parent_step FROM checkpoints ORDER BY global_step")
        # paths under the job's state directory are stored relative to it
        return [(r[0], os.path.join(os.path.dirname(db), r[1]), r[2], r[3]) for r in rows]
    finally:
        con.close()


def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
    pyenv.ensure()
    from safetensors import safe_open
    h.require_built("psd", "workerd", "chiefd", "psfleet")
    wd = h.Workdir()
    data = h.ctr_data(wd, ROWS, TEST_ROWS, seed=5)
    base = h.ctr_example(data)
    base["supervisor"] = {"save_checkpoint_steps": 50, "save_checkpoint_secs": 0, "save_summaries_secs": 5,
                          "keep_checkpoints": 2, "full_checkpoint_every": 1000}
    job, spec = h.make_job(wd, n_ps=1, n_workers=1, base=base,
                           training={"max_steps": STEPS, "report_every_steps": 20})
    chief_addr, ps_addr = spec["cluster"]["chief"][0], spec["cluster"]["ps"][0]
    state = wd.file("state")
    db = os.path.join(state, spec["job"], "chief.db")
    tables = [e["name"] for e in base["model"]["embeddings"]]

    def start(kind, index=None, n=1):
        argv = [h.BIN[kind], "--job", job, "--state-dir", state]
        if index is not None:
            argv += ["--task-index", str(index)]
        return h.Proc(wd, "%s.%d" % (kind, n), argv)

    def settled(addr, ps_procs):
        """Waits until the shard's global_step has stopped moving (the worker is frozen)."""
        last = [None]

        def still():
            g = h.rpc_or_none(lambda: h.shard_status(addr).global_step)
            same = g is not None and g == last[0]
            last[0] = g
            return same
        h.wait_for("global_step to settle", still, 30, ps_procs, poll=0.5)

    ps = start("psd", 0)
    chief = start("chiefd")
    worker = start("workerd", 0)
    procs = [ps, chief, worker]
    h.wait_for("global_step 300", lambda: (lambda s: s is not None and s.initialized and s.global_step >= 300)(
        h.rpc_or_none(lambda: h.shard_status(ps_addr))), 180, procs)

    worker.kill(signal.SIGSTOP)
    settled(ps_addr, procs)   # a step in flight lands
    cli = subprocess.run([h.BIN["psfleet"], "checkpoints", "save", "--json", "--reason", "test", "--address",
                          chief_addr], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60, text=True,
                         env=h.child_env(wd=wd))
    assert cli.returncode == 0, cli.stderr
    saved = json.loads(cli.stdout)
    rows = records(db)
    h.log("checkpoints (step, bytes, parent): %s; saved %s" %
          ([(r[0], r[2], r[3]) for r in rows], (saved["global_step"], saved.get("incremental"))))
    steps = {r[0] for r in rows}
    incs = [r for r in rows if r[3] is not None]
    fulls = [r for r in rows if r[3] is None]
    assert incs and fulls, rows
    # every kept increment's chain is kept, though only 2 are asked for
    for r in incs:
        assert r[3] in steps, (r, rows)
    assert len(rows) > 2, rows
    # the chain goes down to the first checkpoint (the only full one), though only 2 are asked for
    assert fulls == [rows[0]] and len(incs) == len(rows) - 1 and saved["incremental"], (rows, saved)
    with safe_open(incs[-1][1], "np") as f:
        meta = f.metadata()
        assert meta["checkpoint"] == "incremental" and int(meta["parent_step"]) == incs[-1][3], meta
        for t in tables:
            assert f.get_tensor("emb/%s/evicted" % t).dtype.name == "uint64"
            assert f.get_tensor("emb/%s/ids" % t).shape[0] == f.get_tensor("emb/%s" % t).shape[0]
    with safe_open(fulls[-1][1], "np") as f:
        assert f.metadata()["checkpoint"] == "full", f.metadata()

    before = h.shard_status(ps_addr)
    want = {t.name: t.rows for t in before.tables}
    # a later increment holds the rows touched in its 50 steps, fewer than the table's
    with safe_open(incs[-1][1], "np") as f:
        for t in tables:
            n = f.get_tensor("emb/%s/ids" % t).shape[0]
            h.log("increment %d, table %s: %d rows of %d" % (incs[-1][0], t, n, want[t]))
            assert 0 < n < want[t], (n, want)
    h.kill_now(ps)
    time.sleep(1.0)
    ps = start("psd", 0, 2)
    procs = [ps, chief, worker]
    st = h.wait_shard_initialized(ps_addr, "ps:0 restored by the chief", 60, [ps, chief])
    got = {t.name: t.rows for t in st.tables}
    h.log("before the kill at global_step %d: rows %s; restored at %d from the chain: %s" %
          (before.global_step, want, st.global_step, got))
    newest = records(db)[-1]
    assert st.global_step == newest[0], (st.global_step, newest)
    if not saved.get("existing"):
        # nothing trained between that checkpoint and the kill: the chain gives back every row
        assert newest[0] == saved["global_step"] and got == want, (got, want, saved)
    assert all(n > 0 for n in got.values()), got

    # a broken link: the newest increment corrupt, the shard killed again: the chain restores to the
    # link before it, and the steps after it are reported lost
    newest_path, prev_step = newest[1], records(db)[-2][0]
    with open(newest_path, "r+b") as f:
        f.seek(os.path.getsize(newest_path) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    h.kill_now(ps)
    time.sleep(1.0)
    ps = start("psd", 0, 3)
    procs = [ps, chief, worker]
    st = h.wait_shard_initialized(ps_addr, "ps:0 restored from the chain's last good link", 60, [ps, chief])
    h.log("after the broken link: restored at %d (the link before %d)" % (st.global_step, newest[0]))
    assert st.global_step == prev_step, (st.global_step, prev_step)
    assert os.path.exists(newest_path + ".corrupt") and newest[0] not in [r[0] for r in records(db)]
    def losses():
        con = sqlite3.connect("file:%s?mode=ro" % db, uri=True)
        try:
            return con.execute("SELECT restored_step, job_step, steps_lost FROM losses").fetchall()
        finally:
            con.close()
    # the chief records the loss after the restore that made the shard initialized: wait for its row
    want_loss = (prev_step, newest[0], newest[0] - prev_step)
    h.wait_for("the loss %s recorded" % (want_loss,), lambda: want_loss in losses(), 30, [ps, chief])
    h.log("losses: %s" % losses())
    worker.kill(signal.SIGCONT)
    final = h.wait_state(chief_addr, "DONE", 300, procs)
    h.log("done: global_step %d, test AUC %.4f" % (final.global_step, final.test_auc))
    assert final.global_step >= STEPS
    worker.p.wait(30)


if __name__ == "__main__":
    h.main(test)

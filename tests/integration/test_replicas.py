"""ps.replicas 2 (issue 30): a 2 ps + 2 workers job where every shard has a backup psd.

  1. Undisturbed, the workers frozen a moment (SIGSTOP): each shard's primary and backup hold the same
     variables and optimizer slots, bit for bit (Pull of both); again at each of the next --checkpoints
     checkpoints, frozen as soon as the chief has recorded it.
  2. --kills times: kill -9 of a random shard's primary while the workers train, the psd started again
     at once (it rejoins as the backup and gets the state by a transfer). The chief promotes the backup:
     no restore from a checkpoint (JobStatus.losses stays empty), global_step, polled throughout, never
     goes back. Fail-over time: from the kill until the shard's new primary counts steps again; p50
     and max printed. Before the next kill the shard's new backup must be in sync.
  3. Gray failures (unless --no-gray): a backup stopped (SIGSTOP) is dropped and the shard trains on
     unreplicated, then rejoins; a primary stopped past ps.failover_ms is failed over and, resumed, is at
     an older epoch: it becomes the backup and rejoins by a state transfer.
  4. Frozen again at the end: primary and backup bit-equal after the fail-overs and transfers; the
     job finishes DONE with an accuracy near an undisturbed run's (--accuracy-of gives that run's).

  With --sparse the job is examples/ctr-widedeep.json's (embedding tables on the shards, gen-data rows):
  every exchange's writes and the chief's restores go to the backup too, and the comparisons hold the
  tables' rows and accumulators (SparseExport of both) bit for bit as well. --table-keys sets keys on
  every table: with a bound, admission or eviction by age, the rows the primary's table made and
  dropped go with each write.

  With --compression C every push goes through gRPC as rpc.compression C has it (int8 blocks, top-k,
  bfloat16), and the primary forwards each as it came: the backup decodes the same bytes, so the
  comparisons still hold bit for bit.

  test_replicas.py [--kills 3] [--steps 4000] [--seed S] [--checkpoints 3] [--accuracy-of A --tolerance 0.5] [--no-gray]
                   [--mode async|ssp|sync] [--sparse [--table-keys JSON]] [--compression C]
"""
import argparse
import json
import random
import signal
import statistics
import threading
import time

import harness as h


def pull(addr, fingerprint):
    s = h.stubs()
    with h.channel(addr) as ch:
        return h.pull_shard(s.ps_pb2_grpc.ParameterServerStub(ch), fingerprint, task="chief:0")


def tables(addr, fingerprint, n_tables):
    """Every embedding table of the psd at addr, sorted by id: {table: (ids, {tensor: bytes})}."""
    import numpy as np
    s = h.stubs()
    caller = s.tensor_pb2.Caller(task="chief:0", fingerprint=fingerprint)
    out = {}
    with h.channel(addr) as ch:
        stub = s.ps_pb2_grpc.ParameterServerStub(ch)
        for t in range(n_tables):
            ids, vals, cursor = [], {}, 0
            while True:
                hdr = s.ps_pb2.SparseExportHeader(caller=caller, table=t, cursor=cursor, max_rows=65536)
                r = stub.SparseExport(s.ps_pb2.SparseExportRequest(header=hdr), timeout=30)
                ids.append(np.frombuffer(r.header.ids, dtype="<u8"))
                for x in r.tensors:
                    vals.setdefault(x.name, []).append(np.frombuffer(x.data, dtype="<f4"))
                if r.header.done:
                    break
                cursor = r.header.next_cursor
            ids = np.concatenate(ids)
            order = np.argsort(ids)
            out[t] = (ids[order].tobytes(),
                      {k: np.concatenate(v).reshape(len(ids), -1)[order].tobytes() for k, v in vals.items()})
    return out


def make_replicated_job(wd, steps, n_ps=2, n_workers=2, rpc=None, mode="async", base=None, replica_transport=None):
    # a push to a frozen primary gives up after rpc.deadline_ms: the workers' switch is bounded by it
    rpc = dict(rpc or {}, deadline_ms=3000)
    job, spec = h.make_job(wd, n_ps=n_ps, n_workers=n_workers, rpc=rpc, base=base,
                           training={"max_steps": steps, "report_every_steps": 20, "mode": mode},
                           supervisor={"save_checkpoint_steps": 500, "save_checkpoint_secs": 0,
                                       "save_summaries_secs": 0})
    spec["cluster"]["ps_backup"] = ["127.0.0.1:%d" % p for p in h.free_ports(n_ps)]
    spec.setdefault("ps", {}).update({"replicas": 2, "failover_ms": 500, "replica_timeout_ms": 2000})
    if replica_transport:
        spec["ps"]["replica_transport"] = replica_transport
    with open(job, "w") as f:
        json.dump(spec, f, indent=2)
    return job, spec


class Job:
    def __init__(self, wd, job, spec):
        self.wd, self.job, self.spec = wd, job, spec
        self.state = wd.file("state")
        self.starts = {}
        self.procs = {}
        self.addr = {("ps", i): a for i, a in enumerate(spec["cluster"]["ps"])}
        self.addr.update({("backup", i): a for i, a in enumerate(spec["cluster"].get("ps_backup", []))})
        self.chief_addr = spec["cluster"]["chief"][0]
        self.chief_metrics = "127.0.0.1:%d" % h.free_ports(1)[0]
        self.compression = (spec.get("rpc") or {}).get("compression")
        self.replica_transport = (spec.get("ps") or {}).get("replica_transport", "auto")

    def start(self, kind, index=None):
        key = (kind, index)
        n = self.starts[key] = self.starts.get(key, 0) + 1
        exe = {"ps": "psd", "backup": "psd"}.get(kind, kind)
        argv = [h.BIN[exe], "--job", self.job, "--state-dir", self.state]
        if index is not None:
            argv += ["--task-index", str(index)]
        if kind == "backup":
            argv.append("--backup")
        # the chief's metrics (its replica series), on a port of their own
        env = {"PSFLEET_METRICS_LISTEN": self.chief_metrics} if kind == "chiefd" else None
        self.procs[key] = h.Proc(self.wd, "%s%s.%d" % (kind, "" if index is None else ":%d" % index, n), argv, env)
        return self.procs[key]

    def start_all(self):
        for i in range(len(self.spec["cluster"]["ps"])):
            self.start("ps", i)
            if self.spec["cluster"].get("ps_backup"):
                self.start("backup", i)
        self.start("chiefd")
        for i in range(len(self.spec["cluster"]["worker"])):
            self.start("workerd", i)

    def workers(self):
        return [p for (k, _), p in self.procs.items() if k == "workerd"]

    def daemons(self):
        return [p for (k, _), p in self.procs.items() if k != "workerd"]

    def shards(self):
        """{shard: NodeStatus} from the chief."""
        js = h.rpc_or_none(lambda: h.job_status(self.chief_addr))
        if js is None:
            return None
        return {int(n.task.split(":")[1]): n for n in js.nodes if n.task.startswith("ps:")}

    def key_of(self, addr):
        return [k for k, a in self.addr.items() if a == addr][0]

    def frozen_compare(self, what):
        """Workers stopped, every shard's primary and backup pulled: bit-equal."""
        for w in self.workers():
            w.kill(signal.SIGSTOP)
        try:
            time.sleep(0.5)
            fp = h.job_status(self.chief_addr).fingerprint
            for s, n in sorted(self.shards().items()):
                a, ga = pull(n.address, fp)
                b, gb = pull(n.backup, fp)
                assert a.keys() == b.keys(), (s, a.keys(), b.keys())
                diff = [k for k in a if a[k] != b[k]]
                assert not diff, "%s: ps:%d's primary %s and backup %s differ in %s" % (what, s, n.address, n.backup,
                                                                                      diff[:4])
                assert ga == gb, (what, s, ga, gb)
                n_tables = len(self.spec["model"].get("embeddings", []))
                rows = ""
                if n_tables:
                    ta, tb = tables(n.address, fp, n_tables), tables(n.backup, fp, n_tables)
                    for t in ta:
                        assert ta[t][0] == tb[t][0], "%s: ps:%d's table %d: primary and backup hold other ids (%d, %d)" % (
                            what, s, t, len(ta[t][0]) // 8, len(tb[t][0]) // 8)
                        diff = [k for k in ta[t][1] if ta[t][1][k] != tb[t][1].get(k)]
                        assert not diff, "%s: ps:%d's table %d differs in %s" % (what, s, t, diff)
                    rows = ", tables' %s rows too" % "+".join(str(len(ta[t][0]) // 8) for t in sorted(ta))
                sa = h.shard_status(n.address, timeout=1)
                ca = [(c.worker, c.clock) for c in sa.clocks]
                cb = [(c.worker, c.clock) for c in h.shard_status(n.backup, timeout=1).clocks]
                assert ca == cb, "%s: ps:%d's ssp clocks differ: primary %s, backup %s" % (what, s, ca, cb)
                # nothing in flight with the workers stopped: every update numbered is acknowledged
                rp = sa.replica
                assert rp.acked == rp.seq, "%s: ps:%d's primary numbered %d updates, its backup acknowledged %d" % (
                    what, s, rp.seq, rp.acked)
                # the way they went: a ring to a backup on this host unless told otherwise or tables
                want_ring = self.replica_transport != "grpc" and not n_tables
                assert rp.ring == want_ring and (rp.calls == 0 if want_ring else rp.calls > 0 or rp.seq == 0), (
                    "%s: ps:%d forwards %s (%d Replicate calls), expected %s" % (
                        what, s, "through a ring" if rp.ring else "through Replicate calls", rp.calls,
                        "a ring" if want_ring else "Replicate calls"))
                # what the updates weighed: float32 as applied (4 bytes a value), or as pushed
                per_value = rp.bytes / rp.values if rp.values else 0
                if rp.values and not n_tables and not self.compression:
                    assert rp.bytes == 4 * rp.values, "%s: ps:%d forwarded %d values in %d bytes, not float32" % (
                        what, s, rp.values, rp.bytes)
                if rp.values and self.compression == "int8":   # int8 blocks: 1 + 4/256 bytes a value
                    assert per_value < 1.25, "%s: ps:%d forwarded int8 pushes at %.2f bytes a value" % (
                        what, s, per_value)
                h.log("%s: ps:%d primary %s and backup %s bit-equal (%d tensors with slots%s, global_step %d, epoch %d%s); "
                      "%d updates since the last transfer in %s, %d values in %d bytes (%.2f a value)"
                      % (what, s, n.address, n.backup, len(a), rows, ga, n.epoch, ", ssp clocks %s" % ca if ca else "",
                         rp.seq, "a ring in shared memory" if rp.ring else "%d Replicate calls" % rp.calls, rp.values,
                         rp.bytes, per_value))
        finally:
            for w in self.workers():
                w.kill(signal.SIGCONT)
            for w in self.workers():   # running again, or said: a worker left stopped would look like a hang
                end = time.monotonic() + 2
                while w.alive() and proc_state(w.p.pid) == "T" and time.monotonic() < end:
                    time.sleep(0.05)
                if w.alive() and proc_state(w.p.pid) == "T":
                    h.log("%s: worker pid %d still stopped 2 s after SIGCONT: sent again" % (what, w.p.pid))
                    w.kill(signal.SIGCONT)


def proc_state(pid):
    """The one-letter state of a process (/proc/PID/stat), "" when gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def wait_in_sync(j, timeout=60):
    return h.wait_for("every shard's backup in sync", lambda: (lambda sh: sh is not None and all(
        n.replicated for n in sh.values()) and sh)(j.shards()), timeout, j.daemons())


def step_now(j):
    return h.job_status(j.chief_addr).global_step


def gray(j):
    """A backup that stops answering (SIGSTOP) is dropped, the shard trains on unreplicated and says so;
    resumed, it rejoins. A primary stopped past ps.failover_ms is failed over; resumed, it is at an older
    epoch: the chief makes it the backup and it rejoins by a state transfer."""
    wait_in_sync(j)
    n = j.shards()[0]
    b = j.procs[j.key_of(n.backup)]
    b.kill(signal.SIGSTOP)
    try:
        h.wait_for("ps:0 unreplicated", lambda: not j.shards()[0].replicated, 30, [j.procs[("chiefd", None)]])
        g = step_now(j)
        h.wait_for("training on without the backup", lambda: step_now(j) >= g + 50, 30, [j.procs[("chiefd", None)]])
        h.log("gray: ps:0's backup %s stopped: dropped, the shard trains on unreplicated (%s)"
              % (n.backup, j.shards()[0].state.split("; ")[-1]))
    finally:
        b.kill(signal.SIGCONT)
    wait_in_sync(j)
    st = h.shard_status(j.shards()[0].address, timeout=1)
    assert st.replica.dropped >= 1 and not st.replica.awaiting_chief, st.replica
    h.log("gray: ps:0's backup resumed and in sync again (its primary dropped it %d time(s); the chief's record "
          "of the drop let it answer writes again)" % st.replica.dropped)
    n = j.shards()[1]
    epoch = n.epoch
    old = j.procs[j.key_of(n.address)]
    old.kill(signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        h.wait_for("ps:1 failed over from its stopped primary", lambda: j.shards()[1].epoch > epoch, 30,
                   [j.procs[("chiefd", None)]])
        took = time.monotonic() - t0
        g = step_now(j)
        h.wait_for("training on the promoted backup", lambda: step_now(j) >= g + 50, 30, [j.procs[("chiefd", None)]])
    finally:
        old.kill(signal.SIGCONT)
    now = j.shards()[1]

    def rejoined():
        st = h.rpc_or_none(lambda: h.shard_status(n.address, timeout=1))
        return st is not None and st.replica.role == 2 and st.replica.epoch == now.epoch and st
    st = h.wait_for("the old primary back as the backup", rejoined, 30, j.daemons())
    h.log("gray: ps:1's primary %s stopped: its backup %s promoted at epoch %d after %.2f s; resumed, the old "
          "primary is the backup of epoch %d (%d writes refused as fenced)" % (n.address, now.address, now.epoch,
                                                                               took, st.replica.epoch,
                                                                               st.replica.fenced_writes))


def cli_views(j, dropped=True):
    """psfleet top and psfleet status show each shard's primary, backup, epoch and replication, as the
    primaries and the chief know them, and the bytes of the forwarded updates; with dropped, that
    ps:0 has dropped its backup (the gray failures)."""
    import subprocess
    sh = j.shards()
    top = subprocess.run([h.BIN["psfleet"], "top", "--once", "--json", "--address", j.chief_addr, "--interval-ms",
                          "300"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30)
    assert top.returncode == 0, top.stderr
    shards = {x["task"]: x for x in json.loads(top.stdout)["shards"]}
    for s, n in sh.items():
        r = shards["ps:%d" % s].get("replica")
        assert r and r["primary"] == n.address and r["backup"] == n.backup and r["epoch"] == n.epoch, (s, r, n)
        assert r["replicating"] and r["values"] > 0 and r["bytes"] > 0, (s, r)
    if dropped:
        assert shards["ps:0"]["replica"]["dropped"] >= 1, shards["ps:0"]
    text = subprocess.run([h.BIN["psfleet"], "top", "--once", "--address", j.chief_addr, "--interval-ms", "300"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30)
    assert text.returncode == 0 and "BACKUP" in text.stdout and "B/VALUE" in text.stdout, text.stdout + text.stderr
    st = subprocess.run([h.BIN["psfleet"], "status", "--address", j.chief_addr], stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True, timeout=30)
    assert st.returncode == 0, st.stderr
    for s, n in sh.items():
        assert "primary %s (epoch %d), backup %s" % (n.address, n.epoch, n.backup) in st.stdout, (s, st.stdout)
    # and the chief's metrics: each shard's epoch, replication, lag and fail-overs
    import urllib.request
    with urllib.request.urlopen("http://%s/metrics" % j.chief_metrics, timeout=5) as r:
        exposition = r.read().decode()

    def series(name, s):
        line = [ln for ln in exposition.splitlines() if ln.startswith('%s{shard="%d"} ' % (name, s))]
        assert line, "no %s for shard %d in the chief's metrics" % (name, s)
        return float(line[0].split()[-1])
    for s, n in sh.items():
        assert series("psfleet_chief_shard_epoch", s) == n.epoch, (s, n.epoch)
        assert series("psfleet_chief_shard_replicated", s) == 1, s
        assert series("psfleet_chief_shard_failovers", s) == n.failovers, (s, n.failovers)
        assert series("psfleet_chief_shard_replication_lag_seconds", s) >= 0, s
    h.log("psfleet top and status show every shard's primary, backup and epoch:\n" +
          "\n".join(ln for ln in text.stdout.splitlines() if "ps:" in ln and "127.0.0.1" in ln))


def pre_run(wd, spec, steps=300):
    """The same job without replicas for a few steps, into the same state directory: the replicated job
    then starts by restoring its checkpoint, tables included (SparseImport to each primary, which its
    backup gets too, by the state transfer or as updates, whichever comes first)."""
    pre = json.loads(json.dumps(spec))
    del pre["cluster"]["ps_backup"]
    pre["ps"]["replicas"] = 1
    pre["training"]["max_steps"] = steps
    path = wd.file("job-pre.json")
    with open(path, "w") as f:
        json.dump(pre, f, indent=2)
    jp = Job(wd, path, pre)
    jp.start_all()
    final = h.wait_state(jp.chief_addr, "DONE", 120, jp.daemons())
    chief = jp.procs[("chiefd", None)]
    chief.kill(signal.SIGTERM)   # it serves status after DONE until told to stop
    for p in jp.procs.values():
        assert p.wait(60) == 0, "%s did not exit 0 at the first job's end:\n%s" % (p.name, p.stderr()[-2000:])
        h._procs.remove(p)
    h.log("a first run without replicas to global_step %d (checkpointed): the replicated job restores it"
          % final.global_step)


def run(opts):
    h.plain_rpc()
    h.require_built("psd", "workerd", "chiefd", "psfleet")
    wd = h.Workdir()
    # --compression: every push through gRPC, compressed; the primary forwards it as it came
    rpc = {"shared_memory": False, "compression": opts.compression} if opts.compression else None
    job, spec = make_replicated_job(wd, opts.steps, rpc=rpc, mode=opts.mode, base=h.ctr_example(h.ctr_data(wd, 60000, 10000), table_keys=json.loads(opts.table_keys)) if opts.sparse else None,
                                    replica_transport=opts.replica_transport)
    if opts.sparse:
        pre_run(wd, spec)
    j = Job(wd, job, spec)
    j.start_all()
    rng = random.Random(opts.seed)
    h.log("seed %d" % opts.seed)

    seen, stop = [], threading.Event()

    def poll():
        while not stop.is_set():
            js = h.rpc_or_none(lambda: h.job_status(j.chief_addr, timeout=1))
            if js is not None and js.global_step:
                seen.append(js.global_step)
            time.sleep(0.02)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    failovers = []
    try:
        wait_in_sync(j)
        h.wait_for("global_step 300", lambda: (lambda js: js is not None and js.global_step >= 300)(
            h.rpc_or_none(lambda: h.job_status(j.chief_addr))), 120, j.daemons())
        j.frozen_compare("undisturbed")
        if not opts.gray:   # else after the gray failures, when ps:0 has dropped its backup once
            cli_views(j, dropped=False)
        # at each of the next checkpoints (every 500 steps): frozen as soon as the chief has recorded it
        for _ in range(opts.checkpoints):
            # by its step: the count of checkpoints stops at the number kept (supervisor.keep_checkpoints)
            seen_ckpt = h.job_status(j.chief_addr).last_checkpoint.global_step
            last = h.wait_for("the next checkpoint", lambda: (lambda x: x is not None and
                                                              x.last_checkpoint.global_step > seen_ckpt and x)(
                                  h.rpc_or_none(lambda: h.job_status(j.chief_addr))), 120, j.daemons())
            j.frozen_compare("at the checkpoint of global_step %d" % last.last_checkpoint.global_step)
        span = opts.steps * 0.8 / max(1, opts.kills)
        for k in range(opts.kills):
            wait_in_sync(j)
            js = h.job_status(j.chief_addr)
            at = js.global_step + rng.randint(20, max(21, int(span * 0.6)))
            h.wait_for("global_step %d" % at, lambda: (lambda x: x is not None and x.global_step >= at)(
                h.rpc_or_none(lambda: h.job_status(j.chief_addr))), 120, j.daemons())
            s = rng.randrange(len(spec["cluster"]["ps"]))
            n = j.shards()[s]
            key, epoch = j.key_of(n.address), n.epoch
            victim = j.procs[key]
            victim.kill(signal.SIGKILL)
            t0 = time.monotonic()
            victim.p.wait(10)
            h._procs.remove(victim)
            j.start(*key)   # rejoins as the backup
            # failed over: a newer epoch whose primary counts steps again
            g0 = [None]

            def moved():
                sh = j.shards()
                if sh is None or sh[s].epoch <= epoch:
                    return None
                st = h.rpc_or_none(lambda: h.shard_status(sh[0].address, timeout=1))
                if st is None or not st.initialized:
                    return None
                if g0[0] is None:
                    g0[0] = st.global_step
                return st.global_step > g0[0]
            h.wait_for("ps:%d failed over" % s, moved, 60, [p for p in j.daemons() if p is not victim])
            took = time.monotonic() - t0
            failovers.append(took)
            h.log("kill %d: ps:%d's primary %s (epoch %d) killed; training again on its backup after %.3f s"
                  % (k + 1, s, n.address, epoch, took))
        if opts.gray:
            gray(j)
            wait_in_sync(j)
            cli_views(j)
        wait_in_sync(j)
        j.frozen_compare("after %d fail-overs" % opts.kills)
        final = h.wait_state(j.chief_addr, "DONE", 600, j.daemons())
        # the chief stops every psd at the end, backups too (under systemd a unit left running is a job
        # that never ends)
        for (kind, i), p in j.procs.items():
            if kind in ("ps", "backup"):
                assert p.wait(60) == 0, "%s:%d did not exit 0 at the job's end:\n%s" % (kind, i, p.stderr()[-2000:])
    finally:
        stop.set()
        poller.join(5)
    back = [(a, b) for a, b in zip(seen, seen[1:]) if b < a]
    h.log("done at global_step %d, test accuracy %.4f, AUC %.4f; %d polls of global_step; checkpoint restores: %d"
          % (final.global_step, final.test_accuracy, final.test_auc, len(seen), len(final.losses)))
    if failovers:
        h.log("fail-over time over %d kills: p50 %.3f s, max %.3f s" % (len(failovers), statistics.median(failovers),
                                                                       max(failovers)))
    assert not back, "global_step went back: %s" % back[:5]
    assert not final.losses and final.steps_lost == 0, final.losses
    assert final.global_step >= opts.steps
    if opts.accuracy_of is not None:
        assert abs(final.test_accuracy - opts.accuracy_of) * 100 <= opts.tolerance, (final.test_accuracy,
                                                                                      opts.accuracy_of)
    elif opts.sparse:
        assert final.test_auc > 0.6, final.test_auc
    else:
        assert final.test_accuracy > 0.5, final.test_accuracy
    print(json.dumps({"kills": opts.kills, "failover_s": [round(x, 3) for x in failovers],
                      "failover_p50_s": round(statistics.median(failovers), 3) if failovers else None,
                      "failover_max_s": round(max(failovers), 3) if failovers else None,
                      "test_accuracy": final.test_accuracy, "global_step": final.global_step,
                      "steps_lost": final.steps_lost}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    ap.add_argument("--checkpoints", type=int, default=3,
                    help="compare primary and backup at each of this many checkpoints of the undisturbed start")
    ap.add_argument("--accuracy-of", type=float)
    ap.add_argument("--tolerance", type=float, default=0.5)
    ap.add_argument("--mode", choices=("async", "ssp", "sync"), default="async", help="training.mode")
    ap.add_argument("--sparse", action="store_true", help="examples/ctr-widedeep.json's model: embedding tables")
    ap.add_argument("--table-keys", default="{}",
                    help="with --sparse, JSON keys set on every table (a bound, admission, eviction, a disk tier)")
    ap.add_argument("--compression", help="rpc.compression (int8, topk:R, bf16), every push through gRPC")
    ap.add_argument("--no-gray", dest="gray", action="store_false", help="skip the SIGSTOP of a backup and a primary")
    ap.add_argument("--replica-transport", choices=("auto", "grpc"), default="auto",
                    help="ps.replica_transport: auto (a ring in shared memory, the backups being on this host; "
                         "Replicate calls for embedding tables) or grpc (Replicate calls always)")
    opts = ap.parse_args()
    h.main(lambda: run(opts))


if __name__ == "__main__":
    main()

"""Chaos under real systemd (issue 13), driven from the host into a booted container (chaos_systemd.sh).

The container shares the host's network, so this process talks gRPC to the daemons on loopback as the
local chaos test does, and runs systemctl inside through nsenter. The units are the installed
packages' (Restart=on-failure, RestartSec=2s): a daemon killed with kill -9 is started again by systemd.

  1. chaos: --trials kills per role, with test_chaos.py's trials and assertions, the daemons as units;
  2. `systemctl stop psfleet.target` mid-job, then start: it resumes with 0 steps lost (the newest
     checkpoint is at or past the last global_step shard 0 answered, and the job restores from it);
  3. every checkpoint corrupted and a psd killed: the job FAILED with that reason, `psfleet status`
     prints it, chiefd stays active and its NRestarts does not grow over 60 s (watched while 4 runs);
  4. a job listing 3 workers, 2 started: it finishes; worker 1 is killed, kept down 30 s and started
     again: it rejoins and its examples count again; the status shows the missing and the live workers.

  chaos_systemd.py INIT_PID ROOTFS [--trials 5] [--seed S] [--only chaos,stop,corrupt,elastic]
"""
import argparse
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))
import harness as h  # noqa: E402
import test_chaos as tc  # noqa: E402

CT = {}


def ct(*argv, check=True, timeout=60):
    """A command inside the container; its stdout."""
    cmd = ["nsenter", "-t", str(CT["pid"]), "-a", "--", "env", "-i",
           "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8",
           "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0"] + list(argv)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, text=True)
    if check and r.returncode != 0:
        raise AssertionError("in the container: %s: exit %d: %s" % (" ".join(argv), r.returncode, r.stderr.strip()))
    return r.stdout


def kill(sig, pid):
    """kill(1) inside: the container's minimal system has only the shell's builtin."""
    ct("bash", "-c", "kill -%d %d" % (sig, pid), check=False)


def prop(unit, name):
    return ct("systemctl", "show", "-P", name, unit).strip()


UNIT = {"psd": "psfleet-psd@%s:%d.service", "workerd": "psfleet-workerd@%s:%d.service",
        "chiefd": "psfleet-chiefd@%s.service"}


class UnitTrial(tc.Trial):
    """test_chaos's trial with its daemons as the packages' systemd units: the job file in
    /etc/psfleet/jobs, the state in the units' StateDirectory, restarts by systemd."""

    seq = 0

    def __init__(self, opts, name, role, rng, base, n_workers_started=None, supervisor=None, steps=None):
        UnitTrial.seq += 1
        self.jobname = "c%d%s" % (UnitTrial.seq, name.replace("_", ""))[:20]
        if steps:
            opts = argparse.Namespace(**dict(vars(opts), steps=steps))
        tc.Trial.__init__(self, opts, name, role, rng, base)
        with open(self.job) as f:
            spec = h.json.load(f)
        spec["job"] = self.jobname
        if supervisor:
            spec["supervisor"].update(supervisor)
        self.spec = spec
        path = os.path.join(CT["root"], "etc/psfleet/jobs", self.jobname + ".json")
        with open(path, "w") as f:
            h.json.dump(spec, f, indent=2)
        os.chmod(path, 0o644)
        self.n_started = opts.workers if n_workers_started is None else n_workers_started

    def unit(self, kind, index=0):
        return UNIT[kind] % ((self.jobname,) if kind == "chiefd" else (self.jobname, index))

    def units(self):
        return ([self.unit("psd", i) for i in range(self.opts.ps)] + [self.unit("chiefd")]
                + [self.unit("workerd", i) for i in range(self.opts.workers)])

    def start(self, kind, index):
        ct("systemctl", "start", "--no-block", self.unit(kind, index))

    def start_all(self):
        ct("systemctl", "start", *[self.unit("psd", i) for i in range(self.opts.ps)])
        ct("systemctl", "start", self.unit("chiefd"))
        ct("systemctl", "start", "--no-block", *[self.unit("workerd", i) for i in range(self.n_started)])

    def main_pid(self, kind, index=0):
        return int(prop(self.unit(kind, index), "MainPID") or 0)

    def kill9_and_restart(self, kind, index, delay):
        """kill -9 of the unit's main process; systemd starts it again (RestartSec), not us."""
        u = self.unit(kind, index)
        pid, n = self.main_pid(kind, index), int(prop(u, "NRestarts"))
        assert pid > 0, "%s has no main process" % u
        kill(9, pid)
        # A new main process that systemd started (ExecMainPID stays after it exits: a worker killed near
        # the end can restart, finish its last steps and be inactive again between two polls).
        tc.wait_until("systemd to restart %s" % u,
                      lambda: int(prop(u, "NRestarts")) > n
                      and int(prop(u, "ExecMainPID") or 0) not in (0, pid), 30, period=0.1)

    def signal_workers(self, sig):
        for i in range(self.n_started):
            pid = self.main_pid("workerd", i)
            if pid:
                kill(sig, pid)

    def watched(self, but_workers=False):
        return []

    def stop_all(self):
        self.signal_workers(signal.SIGCONT)
        ct("systemctl", "stop", *self.units(), check=False, timeout=120)
        for u in self.units():
            ct("systemctl", "reset-failed", u, check=False)

    def forget(self):
        pass

    def logs(self):
        return ct("journalctl", "--no-pager", "-o", "cat", "-n", "60", *["-u" + u for u in self.units()],
                  check=False)


def psfleet_status(trial):
    return ct("timeout", "30", "psfleet", "status", "--job", "/etc/psfleet/jobs/%s.json" % trial.jobname,
              check=False)


def corrupt_start(opts, rng, base):
    """Scenario 3, first half: returns (trial, NRestarts of its chief) once the job has failed."""
    tr = UnitTrial(opts, "corrupt", None, rng, base, steps=10 ** 6)
    tr.start_all()
    ckdir = [None]

    def two_checkpoints():
        st = tr.status()
        if st is None or st.checkpoints < 2:
            return False
        ckdir[0] = st.checkpoint_dir
        return True

    tc.wait_until("two checkpoints", two_checkpoints, 60)
    host_dir = os.path.join(CT["root"], ckdir[0].lstrip("/"))
    files = [os.path.join(host_dir, n) for n in os.listdir(host_dir) if n.endswith(".safetensors")]
    assert files, "no checkpoint file in " + host_dir
    for path in files:
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            f.write(b"\xde\xad\xbe\xef" * 64)
    h.log("corrupted %d checkpoint(s) in %s; kill -9 of ps:0" % (len(files), ckdir[0]))
    tr.kill9_and_restart("psd", 0, 0)
    failed = h.stubs().supervisor_pb2.JOB_STATE_FAILED
    st = tc.wait_until("the job to be FAILED", lambda: (lambda s: s if s is not None and s.state == failed
                                                         else None)(tr.status()), 60)
    assert "checkpoint" in st.reason, "FAILED, but the reason does not name the checkpoints: %s" % st.reason
    out = psfleet_status(tr)
    assert "failed" in out and st.reason in out, "psfleet status does not print the failure:\n" + out
    chief = tr.unit("chiefd")
    assert prop(chief, "ActiveState") == "active", "%s is %s" % (chief, prop(chief, "ActiveState"))
    h.log("FAILED: %s; psfleet status says so; %s active" % (st.reason, chief))
    return tr, int(prop(chief, "NRestarts")), time.monotonic()


def corrupt_end(tr, n0, t0):
    """Scenario 3, second half: 60 s later, still FAILED, chiefd active, NRestarts unchanged."""
    left = 60 - (time.monotonic() - t0)
    if left > 0:
        time.sleep(left)
    chief = tr.unit("chiefd")
    n1 = int(prop(chief, "NRestarts"))
    st = tr.status()
    assert prop(chief, "ActiveState") == "active", "%s is %s after 60 s" % (chief, prop(chief, "ActiveState"))
    assert n1 == n0, "%s NRestarts grew from %d to %d over 60 s" % (chief, n0, n1)
    assert st is not None and st.state == h.stubs().supervisor_pb2.JOB_STATE_FAILED, st
    h.log("60 s later: still FAILED, %s active, NRestarts %d" % (chief, n1))
    tr.stop_all()


def stop_target(opts, rng, base):
    """Scenario 2."""
    tr = UnitTrial(opts, "stop", None, rng, base, steps=10 ** 6)
    ct("systemctl", "enable", "-q", *tr.units())
    try:
        ct("systemctl", "start", "psfleet.target")
        st = tc.wait_until("global_step 1000", lambda: (lambda x: x if x is not None and x.global_step >= 1000
                                                        else None)(tr.status()), 120)
        ckdir = os.path.join(CT["root"], st.checkpoint_dir.lstrip("/"))
        # global_step as long as shard 0 answers, while the stop goes on
        import threading
        seen, stopping = [0], threading.Event()

        def poll():
            while not stopping.is_set():
                seen[0] = max(seen[0], tr.global_step() or 0)
                time.sleep(0.01)

        th = threading.Thread(target=poll)
        th.start()
        try:
            ct("systemctl", "stop", "psfleet.target", timeout=120)
        finally:
            stopping.set()
            th.join()
        for u in tr.units():
            tc.wait_until("%s to stop" % u, lambda: prop(u, "ActiveState") in ("inactive", "failed"), 60, period=0.1)
        steps = sorted(int(n[5:15]) for n in os.listdir(ckdir) if n.startswith("ckpt-") and n.endswith(".safetensors"))
        assert steps, "no checkpoint after the stop in " + ckdir
        last = steps[-1]
        assert last >= seen[0], "the newest checkpoint is at %d, the ps was seen at global_step %d" % (last, seen[0])
        h.log("stopped at global_step %d (last seen); checkpoints %s" % (seen[0], steps))
        ct("systemctl", "start", "psfleet.target")
        s = h.stubs()
        st = tc.wait_until("the job to train again", lambda: (lambda x: x if x is not None and x.state in (
            s.supervisor_pb2.JOB_STATE_TRAINING, s.supervisor_pb2.JOB_STATE_READY) else None)(tr.status()), 60)
        assert st.restored_step == last, "restored from %d, the newest checkpoint is %d" % (st.restored_step, last)
        assert st.steps_lost == 0 and not st.losses, "steps lost after an orderly stop: %s" % list(st.losses)
        ck = h.list_checkpoints(tr.chief_addr, 2)
        assert ck and ck[0].global_step == last, [c.global_step for c in ck]
        h.log("resumed from the stop's checkpoint at global_step %d; 0 steps lost" % last)
        return last
    finally:
        ct("systemctl", "disable", "-q", *tr.units(), check=False)
        tr.stop_all()


def elastic(opts, rng, base):
    """Scenario 4."""
    o = argparse.Namespace(**dict(vars(opts), workers=3))
    # a worker is missing 10 s after its last report (default 60)
    tr = UnitTrial(o, "elastic", None, rng, base, n_workers_started=2, steps=45000,
                   supervisor={"worker_timeout_secs": 10})
    s = h.stubs()
    tr.start_all()
    # both started workers live (one slow to start on a loaded machine joins late: wait for it, do not
    # call it missing) and training under way
    st = tc.wait_until("training with 2 of 3 workers", lambda: (lambda x: x if x is not None and x.global_step > 500
                                                                 and {0, 1} <= set(x.workers_live)
                                                                 else None)(tr.status()), 90)
    assert 2 in st.workers_missing and {0, 1} <= set(st.workers_live), (list(st.workers_live), list(st.workers_missing))
    u1 = tr.unit("workerd", 1)
    before = {n.task: n.local_step for n in st.nodes}.get("worker:1", 0)
    kill(9, tr.main_pid("workerd", 1))
    ct("systemctl", "stop", u1)            # cancels systemd's restart: down for 30 s
    t_down = time.monotonic()
    st = tc.wait_until("worker 1 to be missing", lambda: (lambda x: x if x is not None
                                                          and 1 in x.workers_missing else None)(tr.status()), 60)
    h.log("worker:1 killed at local step %d; status: live %s, missing %s"
          % (before, list(st.workers_live), list(st.workers_missing)))
    time.sleep(max(0, 30 - (time.monotonic() - t_down)))
    back_us = int(time.time() * 1e6)
    ct("systemctl", "start", "--no-block", u1)

    def w1(x):
        """worker:1's node status if it reported since it was started again."""
        n = [n for n in x.nodes if n.task == "worker:1"] if x is not None else []
        return n[0] if n and n[0].last_report_us > back_us else None

    st = tc.wait_until("worker 1 to rejoin and report", lambda: (lambda x: x if w1(x) and 1 in x.workers_live
                                                                  else None)(tr.status()), 60)
    h.log("worker:1 rejoined: live %s, missing %s" % (list(st.workers_live), list(st.workers_missing)))
    st = tc.wait_until("the job to end DONE", lambda: (lambda x: x if x is not None and x.state in (
        s.supervisor_pb2.JOB_STATE_DONE, s.supervisor_pb2.JOB_STATE_FAILED) else None)(tr.status()), 180)
    assert st.state == s.supervisor_pb2.JOB_STATE_DONE, "the job ended %s: %s" % (st.state, st.reason)
    n1 = w1(st)
    assert n1 is not None and n1.local_step > 0, "worker:1's steps after it rejoined do not count: %s" % st.nodes
    steps1 = n1.local_step
    assert 2 in st.workers_missing, list(st.workers_missing)
    h.log("DONE at %d with 2 of 3 workers; worker:1 trained %d steps after it rejoined" % (st.global_step, steps1))
    tr.stop_all()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("init_pid", type=int)
    p.add_argument("rootfs")
    p.add_argument("--only", default="chaos,stop,corrupt,elastic")
    args, rest = p.parse_known_args()
    CT["pid"], CT["root"] = args.init_pid, args.rootfs
    opts = tc.parse(["--trials", "5", "--clean", "2", "--delay", "2", "2"] + rest)
    if opts.seed is None:
        opts.seed = int(time.time() * 1000) % 1000000
    only = args.only.split(",")
    base = h.Workdir().path
    import random
    rng = random.Random(opts.seed)
    h.stubs()
    h.plain_rpc()   # its own gRPC clients call the daemons as any role, as test_chaos.py's do

    failures = []

    def part(name, f, *a):
        if name not in only:
            return None
        try:
            return f(*a)
        except (AssertionError, tc.Hang) as e:
            h.log("FAIL %s: %s" % (name, e))
            failures.append("%s: %s" % (name, e))
            return None

    # stopping psfleet.target stops every job's units: before the corrupt job's 60 s, not during them
    part("stop", stop_target, opts, rng, base)
    corrupt = part("corrupt", corrupt_start, opts, rng, base)
    part("elastic", elastic, opts, rng, base)
    if corrupt:
        part("corrupt", corrupt_end, *corrupt)
    part("chaos", tc.campaign, opts, UnitTrial, base)
    assert not failures, "failed:\n  " + "\n  ".join(failures)


if __name__ == "__main__":
    h.main(main)

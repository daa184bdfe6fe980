"""A job on one host is closed to everyone but its user: `psfleet local` under the default
security.mode (auto), attacked as an outsider would.

A job started with `psfleet local` (1 ps, 1 worker, every endpoint loopback) runs under mutual TLS with
the credentials made for it in its state directory. An attacker that knows every port and the job's
fingerprint (handed to it, as if it had guessed) calls Supervisor.GetStatus, ParameterServer.Pull, a
Push of 1e30, ParameterServer.Assign of zeros as chief:0 and ParameterServer.Stop, with plain gRPC and
with TLS but no certificate of the job's CA:
- as another uid (root runs the test: setpriv to 65534), which also cannot read the job's keys nor
  connect to psd's attach socket (the shared-memory path);
- as the job's own uid without the job's key.
Every call must fail before a handler runs (UNAVAILABLE: no fingerprint, no model, no write, no stop),
the job must train on (global_step grows, psd still up, not FAILED), the key files must be 0600 in a
0700 directory, and the job's user's `psfleet status/top/watch/checkpoints/stop --job NAME` must work,
the stop ending the job in order (psfleet local exits 75).

Then psd, workerd and chiefd started directly at the same moment, as the units of a job on one host
are: one CA in security.auto_dir that every pair verifies against, the job trains, the other uid's calls
are refused and `psfleet status/stop --job FILE` work for the job's user.

The same attacker against the same job run with security.mode insecure gets its GetStatus and Pull
answered: the control that shows the probe can see an open job.
"""

import json
import os
import shutil
import stat
import subprocess
import tempfile

import harness as h

NAME = "loopback-secure"

ATTACKER = r'''
import json, os, socket, struct, sys
sys.path.insert(0, sys.argv[1])
import grpc
from psfleet.v1 import ps_pb2, ps_pb2_grpc, supervisor_pb2, supervisor_pb2_grpc, tensor_pb2
a = json.loads(sys.argv[2])
out = {"calls": {}, "files": {}, "sockets": {}}
fp = int(a["fingerprint"], 16)

def call(what, fn):
    try:
        r = fn()
        out["calls"][what] = {"ok": True, "reply": str(r)[:200], "fingerprint": getattr(r, "fingerprint", None)}
    except grpc.RpcError as e:
        out["calls"][what] = {"ok": False, "code": e.code().name, "details": (e.details() or "")[:200]}

def tensor(name, shape, value):
    n = 1
    for d in shape:
        n *= d
    return tensor_pb2.Tensor(name=name, dtype=tensor_pb2.DTYPE_FLOAT32, shape=shape,
                             data=struct.pack("<%df" % n, *([value] * n)))

for how in ("plain", "tls-no-cert"):
    def ch(addr, task):
        if how == "plain":
            return grpc.insecure_channel(addr)
        return grpc.secure_channel(addr, grpc.ssl_channel_credentials(),
                                   options=[("grpc.ssl_target_name_override", "%s.%s.psfleet" % (task, a["job"]))])
    sup = supervisor_pb2_grpc.SupervisorStub(ch(a["chief"], "chief"))
    ps = ps_pb2_grpc.ParameterServerStub(ch(a["ps"], "ps-0"))
    chief_caller = tensor_pb2.Caller(fingerprint=fp, task="chief:0")
    worker_caller = tensor_pb2.Caller(fingerprint=fp, task="worker:0")
    call(how + " Supervisor.GetStatus", lambda: sup.GetStatus(supervisor_pb2.StatusRequest(), timeout=5))
    call(how + " ParameterServer.Pull",
         lambda: ps.Pull(ps_pb2.PullRequest(header=ps_pb2.PullHeader(caller=worker_caller)), timeout=5))
    if a["destructive"]:
        hdr = ps_pb2.PushHeader(caller=worker_caller, worker=0, local_step=1, count_step=True)
        call(how + " Push of 1e30", lambda: ps.Push(ps_pb2.PushRequest(
            header=hdr, grads=[tensor(a["bias"], [1, a["bias_n"]], 1e30)]), timeout=5))
        call(how + " Assign of zeros as chief:0", lambda: ps.Assign(ps_pb2.AssignRequest(
            header=ps_pb2.AssignHeader(caller=chief_caller), tensors=[tensor(a["bias"], [1, a["bias_n"]], 0.0)]),
            timeout=5))
        call(how + " ParameterServer.Stop", lambda: ps.Stop(ps_pb2.StopRequest(reason="attack"), timeout=5))
        call(how + " Supervisor.Stop", lambda: sup.Stop(ps_pb2.StopRequest(reason="attack"), timeout=5))

for path in a["files"]:
    try:
        with open(path, "rb") as f:
            f.read(1)
        out["files"][path] = "read"
    except OSError as e:
        out["files"][path] = e.__class__.__name__
for path in a["sockets"]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        out["sockets"][path] = "connected"
    except OSError as e:
        out["sockets"][path] = e.__class__.__name__
    finally:
        s.close()
print(json.dumps(out))
'''


def cli(*args, timeout=30):
    r = subprocess.run([h.BIN["psfleet"]] + list(args), capture_output=True, text=True, timeout=timeout,
                       env=h.child_env())
    h.log("psfleet", " ".join(args), "->", r.returncode)
    return r


def status(name, may_fail=False):
    r = cli("status", "--job", name, "--json")
    if may_fail and r.returncode != 0:
        return {"state": "unreachable", "global_step": 0}
    assert r.returncode == 0, "the job's user's psfleet status failed:\n" + r.stderr
    return json.loads(r.stdout)


def attack(att_dir, args, wrap=()):
    r = subprocess.run(list(wrap) + ["/usr/bin/python3", os.path.join(att_dir, "attacker.py"),
                                     os.path.join(att_dir, "stubs"), json.dumps(args)],
                       capture_output=True, text=True, timeout=120, cwd=att_dir)
    assert r.returncode == 0, "attacker failed to run:\n" + r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def attack_dir(s):
    """A directory any uid can read: the attacker's script and a copy of the generated stubs."""
    d = tempfile.mkdtemp(prefix="psfleet-attacker-")
    shutil.copytree(os.path.dirname(os.path.dirname(os.path.dirname(s.ps_pb2.__file__))),
                    os.path.join(d, "stubs"))
    with open(os.path.join(d, "attacker.py"), "w") as f:
        f.write(ATTACKER)
    for root, dirs, files in os.walk(d):
        os.chmod(root, 0o755)
        for n in files:
            os.chmod(os.path.join(root, n), 0o644)
    return d


def start(wd, mode, state):
    job, spec = h.make_job(wd, mode + ".json", n_ps=1, n_workers=1, training={"max_steps": 10000000},
                           security={"mode": mode})
    spec["job"] = NAME + "-" + mode
    with open(job, "w") as f:
        json.dump(spec, f)
    p = h.psfleet_local(wd, job, ["--state-dir", state, "--quiet"], name="local-" + mode)
    copy = os.path.join(state, "job.json")
    h.wait_for("the job copy", lambda: os.path.exists(copy), procs=[p])
    with open(copy) as f:
        spec = json.load(f)
    st = h.wait_for("the job training", lambda: (lambda x: x if x["state"] == "training" and x["global_step"] > 0
                                                 else None)(status(spec["job"], True)), timeout=60, procs=[p])
    return p, spec, st


def test():
    h.require("psd", "workerd", "chiefd", "psfleet")
    s = h.stubs()
    wd = h.Workdir()
    att = attack_dir(s)
    os.chmod(wd.path, 0o755)    # the attacker may walk to the state directory; what is in it decides
    other = ()
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv:
            other = (setpriv, "--reuid=65534", "--regid=65534", "--clear-groups")
    try:
        # ---- the default: auto on loopback
        state = wd.file("state-auto")
        p, spec, st = start(wd, "auto", state)
        name = spec["job"]
        tls = os.path.join(state, "tls")
        assert stat.S_IMODE(os.stat(tls).st_mode) == 0o700, oct(os.stat(tls).st_mode)
        keys = sorted(n for n in os.listdir(tls) if n.endswith(".key"))
        assert keys == ["admin.key", "ca.key", "chief.key", "ps-0.key", "viewer.key", "worker-0.key"], keys
        for k in keys:
            assert stat.S_IMODE(os.stat(os.path.join(tls, k)).st_mode) == 0o600, k
        run = wd.runtime_dir   # the harness gives psfleet local its own (PSFLEET_RUNTIME_DIR)
        socks = [os.path.join(run, n) for n in os.listdir(run)] if os.path.isdir(run) else []
        assert socks, "psd's attach socket missing in " + run
        args = {"job": name, "chief": spec["cluster"]["chief"][0], "ps": spec["cluster"]["ps"][0],
                "fingerprint": st["fingerprint"], "bias": "dense3/bias", "bias_n": 10, "destructive": True,
                "files": [os.path.join(tls, k) for k in keys], "sockets": socks}
        step0 = st["global_step"]
        attackers = [("the job's uid without its key", ())]
        if other:
            attackers.append(("uid 65534", other))
        else:
            h.log("not root (or no setpriv): the other-uid attack is left out")
        for who, wrap in attackers:
            r = attack(att, args, wrap)
            for what, c in sorted(r["calls"].items()):
                h.log("%-30s %-40s %s" % (who, what, c))
                assert not c["ok"], "%s: %s was answered: %s" % (who, what, c)
                assert c["code"] == "UNAVAILABLE", (who, what, c)
            assert len(r["calls"]) == 12, r["calls"]
            if wrap:
                for path, res in r["files"].items():
                    assert res == "PermissionError", (who, path, res)
                for path, res in r["sockets"].items():
                    assert res == "PermissionError", (who, path, res)
        assert p.alive(), "psfleet local ended under attack:\n" + p.stderr()[-3000:]
        later = h.wait_for("training on", lambda: (lambda x: x if x["global_step"] > step0 + 50 else None)(
            status(name)), timeout=60, procs=[p])
        assert later["state"] == "training", later
        assert later["fingerprint"] == st["fingerprint"]

        # ---- the job's user's commands find the job and its admin pair
        r = cli("status", "--job", name)
        assert r.returncode == 0 and "training" in r.stdout, r.stdout + r.stderr
        r = cli("top", "--job", name, "--once", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout.strip().splitlines()[-1])["workers"], r.stdout
        r = cli("checkpoints", "save", "--job", name, "--reason", "test")
        assert r.returncode == 0, r.stderr
        r = cli("checkpoints", "list", "--job", name, "--json")
        assert r.returncode == 0 and json.loads(r.stdout), r.stdout + r.stderr
        watch = subprocess.Popen([h.BIN["psfleet"], "watch", "--job", name, "--json", "--interval-ms", "100"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=h.child_env())
        try:
            first = json.loads(watch.stdout.readline())
            assert first["state"] == "training", first
        finally:
            watch.terminate()
            watch.wait(10)
        r = cli("stop", "--job", name, "--reason", "test done")
        assert r.returncode == 0, r.stderr
        rc = p.wait(60)
        assert rc == 75, "psfleet local after psfleet stop: exit %s\n%s" % (rc, p.stderr()[-3000:])
        assert "WITHOUT TLS" not in p.stderr()

        # ---- the daemons started directly, all at once, as the units of a job on one host are: the
        # first to take the lock makes the job's CA in security.auto_dir, the others use it
        jobd, specd = h.make_job(wd, "units.json", n_ps=1, n_workers=1, training={"max_steps": 10000000})
        units = [h.daemon(wd, "psd", jobd, 0, state_dir=wd.file("unit-psd")),
                 h.daemon(wd, "workerd", jobd, 0, state_dir=wd.file("unit-workerd")),
                 h.daemon(wd, "chiefd", jobd, state_dir=wd.file("unit-chiefd"))]
        std = h.wait_for("the units' job training", lambda: (lambda x: x if x["state"] == "training" and
                         x["global_step"] > 0 else None)(status(jobd, True)), timeout=60, procs=units)
        auto = os.path.join(wd.path, "tls", specd["job"])
        assert stat.S_IMODE(os.stat(auto).st_mode) == 0o700
        made = sorted(n for n in os.listdir(auto) if n.endswith(".key"))
        assert made == ["admin.key", "ca.key", "chief.key", "ps-0.key", "viewer.key", "worker-0.key"], made
        v = subprocess.run(["openssl", "verify", "-CAfile", os.path.join(auto, "ca.crt")] +
                           [os.path.join(auto, t + ".crt") for t in ("chief", "ps-0", "worker-0", "admin", "viewer")],
                           capture_output=True, text=True)
        assert v.returncode == 0, "the units' pairs are not all of one CA:\n" + v.stdout + v.stderr
        for u in units:
            assert "mutual TLS as " in u.stderr(), u.stderr()
        if other:
            r = attack(att, dict(args, job=specd["job"], chief=specd["cluster"]["chief"][0],
                                 ps=specd["cluster"]["ps"][0], fingerprint=std["fingerprint"],
                                 files=[os.path.join(auto, k) for k in made], sockets=[]), other)
            for what, c in sorted(r["calls"].items()):
                assert not c["ok"] and c["code"] == "UNAVAILABLE", ("units", what, c)
            assert all(res == "PermissionError" for res in r["files"].values()), r["files"]
            h.log("units on one host: every call of uid 65534 refused")
        r = cli("stop", "--job", jobd)
        assert r.returncode == 0, r.stderr
        assert units[2].wait(60) == 0, units[2].stderr()[-2000:]
        for u in units[:2]:
            u.wait(60)

        # ---- the control: the same attacker's reads get through to the job run insecure
        p2, spec2, st2 = start(wd, "insecure", wd.file("state-insecure"))
        assert "runs WITHOUT TLS (security.mode: insecure)" in p2.stderr()
        args2 = dict(args, job=spec2["job"], chief=spec2["cluster"]["chief"][0], ps=spec2["cluster"]["ps"][0],
                     fingerprint=st2["fingerprint"], destructive=False, files=[], sockets=[])
        r = attack(att, args2, other)
        h.log("control, insecure:", {k: v["ok"] for k, v in r["calls"].items()})
        assert r["calls"]["plain Supervisor.GetStatus"]["ok"], r["calls"]
        assert r["calls"]["plain Supervisor.GetStatus"]["fingerprint"] == int(st2["fingerprint"], 16), r["calls"]
        assert r["calls"]["plain ParameterServer.Pull"]["ok"], r["calls"]
        r = cli("stop", "--job", spec2["job"])
        assert r.returncode == 0, r.stderr
        assert p2.wait(60) == 75
    finally:
        shutil.rmtree(att, True)


if __name__ == "__main__":
    h.main(test)

"""Integration-test harness: real daemons on loopback with free ports.

Finds the build (PSFLEET_BUILD_DIR, set by CTest), writes job files with a cluster of free loopback
ports, starts psd/workerd/chiefd (or `psfleet local`), waits for readiness through the standard
grpc.health.v1.Health/Check, and kills every process it started, even when a test fails; then checks
that none is left. Every process started here carries PSFLEET_TEST_TAG in its environment, so that
grandchildren (the daemons `psfleet local` starts) can be found and accounted for too.

Run with Debian's /usr/bin/python3 (python3-grpcio, python3-protobuf). Stubs are generated at test
time into a temporary directory with protoc and /usr/bin/grpc_python_plugin.
"""

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

from ports import free_ports  # noqa: F401 (the tests call h.free_ports)

SKIP = 77  # CTest SKIP_RETURN_CODE

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("PSFLEET_SOURCE_DIR") or os.path.dirname(os.path.dirname(HERE))
BUILD_DIR = os.environ.get("PSFLEET_BUILD_DIR") or os.path.join(SOURCE_DIR, "build")
BIN = {
    "psd": os.path.join(BUILD_DIR, "services", "psd", "psd"),
    "workerd": os.path.join(BUILD_DIR, "services", "workerd", "workerd"),
    "chiefd": os.path.join(BUILD_DIR, "services", "chiefd", "chiefd"),
    "psfleet": os.path.join(BUILD_DIR, "services", "cli", "psfleet"),
}
EXAMPLE = os.path.join(SOURCE_DIR, "examples", "fmnist-mlp.json")
DATA_DIR = "/usr/share/datasets/fashion-mnist"
TAG = "psfleet-it-" + uuid.uuid4().hex[:12]


def log(*a):
    print("[%7.2f]" % (time.monotonic() - _T0), *a, file=sys.stderr, flush=True)


_T0 = time.monotonic()


def skip(why):
    log("SKIP:", why)
    sys.exit(SKIP)


def require_built(*names):
    """Skips unless each of the binaries (BIN's names) is built."""
    for n in names:
        if not os.access(BIN[n], os.X_OK):
            skip("%s not built (%s)" % (n, BIN[n]))


def require(*names):
    """require_built, and Fashion-MNIST installed."""
    require_built(*names)
    if not os.path.isdir(DATA_DIR):
        skip("Fashion-MNIST not installed in " + DATA_DIR)


# ---- ports and job files -----------------------------------------------------------------------

class Workdir:
    """A temporary directory for one test, removed at exit unless PSFLEET_KEEP_TEST_DIR is set."""

    def __init__(self):
        self.path = tempfile.mkdtemp(prefix="psfleet-it-")
        if not os.environ.get("PSFLEET_KEEP_TEST_DIR"):
            atexit.register(shutil.rmtree, self.path, True)

    def file(self, name):
        return os.path.join(self.path, name)

    @property
    def runtime_dir(self):
        """The daemons' rpc.runtime_dir (made by psd)."""
        return os.path.join(self.path, "run")


def load_example():
    with open(EXAMPLE) as f:
        return json.load(f)


def ctr_example(data_dir=None, job=None, table_keys=None):
    """examples/ctr-widedeep.json as a dict: reading data_dir, named job, table_keys set on each table."""
    with open(os.path.join(SOURCE_DIR, "examples", "ctr-widedeep.json")) as f:
        base = json.load(f)
    if data_dir:
        base["data"]["dir"] = data_dir
    if job:
        base["job"] = job
    for e in base["model"]["embeddings"]:
        e.update(table_keys or {})
    return base


def ctr_data(wd, rows, test_rows, seed=3):
    """A data directory in wd with `psfleet gen-data` rows: train.tsv.gz (rows) and test.tsv.gz
    (test_rows, with its .meta.json: the planted AUC). Returns its path."""
    data = wd.file("data")
    os.makedirs(data)
    g = Proc(wd, "gen-data", [BIN["psfleet"], "gen-data", "--rows", str(rows), "--out",
                              os.path.join(data, "train.tsv.gz"), "--test-rows", str(test_rows), "--test-out",
                              os.path.join(data, "test.tsv.gz"), "--seed", str(seed)])
    assert g.wait(120) == 0, g.stderr()
    return data


_plain = False


def plain_rpc():
    """This test calls the daemons with its own plain gRPC clients (any role, no certificates): the jobs
    make_job writes from now on run with security.mode insecure, as an operator may ask. Tests without
    it run the default: mutual TLS with the job's own CA (in the work dir's tls/JOB for daemons started
    here, in the state directory for `psfleet local`)."""
    global _plain
    _plain = True


def make_job(wd, name="job.json", n_ps=1, n_workers=1, training=None, model=None, ps=None, base=None, rpc=None,
             supervisor=None, security=None):
    """Writes a job file with a fresh loopback cluster; returns (path, job dict)."""
    job = json.loads(json.dumps(base)) if base else load_example()
    ports = free_ports(1 + n_ps + n_workers)
    job["cluster"] = {
        "chief": ["127.0.0.1:%d" % ports[0]],
        "ps": ["127.0.0.1:%d" % p for p in ports[1:1 + n_ps]],
        "worker": ["127.0.0.1:%d" % p for p in ports[1 + n_ps:]],
    }
    if training:
        job.setdefault("training", {}).update(training)
    if model:
        job["model"] = model
    if ps:
        job.setdefault("ps", {}).update(ps)
    if rpc:
        job.setdefault("rpc", {}).update(rpc)
    if supervisor is not None:
        job["supervisor"] = dict(supervisor)
    sec = job.setdefault("security", {})
    sec.update(security or {})
    sec.setdefault("auto_dir", os.path.join(wd.path, "tls", "{job}"))
    if _plain:
        sec.setdefault("mode", "insecure")
    path = wd.file(name)
    with open(path, "w") as f:
        json.dump(job, f, indent=2)
    return path, job


# ---- processes ---------------------------------------------------------------------------------

_procs = []


def child_env(extra=None, wd=None):
    """The environment of a started process; with wd, its daemons' runtime directory (psd's attach
    sockets, rpc.runtime_dir) is wd's own, not the system's /run/psfleet."""
    env = dict(os.environ)
    env["PSFLEET_TEST_TAG"] = TAG
    if wd:
        env["PSFLEET_RUNTIME_DIR"] = wd.file("run")   # Workdir.runtime_dir (or another dir's "run")
    env.pop("TF_CONFIG", None)
    env.pop("NOTIFY_SOCKET", None)
    # OpenBLAS starts a thread in a library constructor, before a daemon can block signals; with one
    # thread at load time the pool is made later and inherits the mask (see psfleet local).
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    if extra:
        env.update(extra)
    return env


class Proc:
    """A started process whose stderr (and stdout) go to a file in the work dir."""

    def __init__(self, wd, name, argv, env=None, stdout_to_log=True):
        self.name = name
        self.argv = argv
        self.log_path = wd.file(name.replace(":", "-") + ".log")
        self.out_path = wd.file(name.replace(":", "-") + ".out")
        self._log = open(self.log_path, "wb")
        self._out = self._log if stdout_to_log else open(self.out_path, "wb")
        log("start", name, " ".join(argv))
        self.p = subprocess.Popen(argv, stdout=self._out, stderr=self._log, env=child_env(env, wd),
                                  stdin=subprocess.DEVNULL)
        _procs.append(self)

    @property
    def pid(self):
        return self.p.pid

    def alive(self):
        return self.p.poll() is None

    def wait(self, timeout):
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("%s did not exit within %.0f s" % (self.name, timeout))

    def stderr(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def stdout(self):
        with open(self.out_path if self._out is not self._log else self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def kill(self, sig=signal.SIGTERM):
        if self.alive():
            self.p.send_signal(sig)


def daemon(wd, kind, job, index=None, args=(), env=None, state_dir=None, name=None):
    argv = [BIN[kind], "--job", job, "--state-dir", state_dir or wd.file("state")]
    if index is not None:
        argv += ["--task-index", str(index)]
    argv += list(args)
    name = name or {"psd": "ps", "workerd": "worker", "chiefd": "chief"}[kind] + ":%d" % (index or 0)
    return Proc(wd, name, argv, env)


def kill_now(proc):
    """SIGKILL, reaped: a crash; the harness no longer cleans it up."""
    proc.kill(signal.SIGKILL)
    proc.p.wait(10)
    _procs.remove(proc)


def tagged_pids():
    """Every live process (but us) whose environment carries this run's tag."""
    found = []
    needle = ("PSFLEET_TEST_TAG=" + TAG).encode()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % d, "rb") as f:
                env = f.read().split(b"\0")
            with open("/proc/%s/stat" % d) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env and state != "Z":
            found.append(int(d))
    return found


def wait_no_tagged(timeout=15):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        left = tagged_pids()
        if not left:
            return []
        time.sleep(0.1)
    return tagged_pids()


def cleanup():
    """SIGTERM, then SIGKILL after 10 s, for everything we started; then anything still tagged."""
    for pr in _procs:
        pr.kill(signal.SIGTERM)
    end = time.monotonic() + 10
    for pr in _procs:
        try:
            pr.p.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            log("killing", pr.name)
            pr.p.kill()
            pr.p.wait()
    for pid in tagged_pids():
        log("killing leftover tagged pid", pid)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main(test):
    """Runs test(), always cleans up, fails if anything we started is left running."""
    rc = 0
    try:
        test()
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
        if isinstance(e.code, str):   # sys.exit("why"): said, as Python itself would
            sys.stderr.write(e.code + "\n")
    except BaseException:
        import traceback
        traceback.print_exc()
        rc = 1
    finally:
        if rc not in (0, SKIP):
            for pr in _procs:
                sys.stderr.write("---- %s (%s) ----\n%s" % (pr.name, " ".join(pr.argv), pr.stderr()[-4000:]))
        cleanup()
        left = wait_no_tagged(5)
        if left:
            log("FAIL: processes left behind:", left)
            rc = rc or 1
    log("PASS" if rc == 0 else ("SKIP" if rc == SKIP else "FAIL (%d)" % rc))
    sys.exit(rc)


# ---- gRPC ---------------------------------------------------------------------------------------

_stubs = None


def stubs():
    """Generated modules: ps_pb2, supervisor_pb2, worker_pb2 (+ _grpc), health_pb2 (+ _grpc)."""
    global _stubs
    if _stubs:
        return _stubs
    try:
        import grpc  # noqa: F401
    except ImportError:
        skip("python3-grpcio is not installed for %s" % sys.executable)
    out = tempfile.mkdtemp(prefix="psfleet-stubs-")
    atexit.register(shutil.rmtree, out, True)
    plugin = shutil.which("grpc_python_plugin") or "/usr/bin/grpc_python_plugin"
    protos = ["psfleet/v1/tensor.proto", "psfleet/v1/ps.proto", "psfleet/v1/supervisor.proto",
              "psfleet/v1/worker.proto"]
    # health.proto from a flat path: a generated grpc/ package would shadow the grpc module.
    shutil.copy("/usr/share/grpc-proto/grpc/health/v1/health.proto", os.path.join(out, "health.proto"))
    try:
        import grpc_tools.protoc  # noqa: F401
        gen = [sys.executable, "-m", "grpc_tools.protoc"]
        plug = []
    except ImportError:
        if not shutil.which("protoc") or not os.access(plugin, os.X_OK):
            skip("neither grpc_tools nor protoc + grpc_python_plugin is available")
        gen = ["protoc"]
        plug = ["--plugin=protoc-gen-grpc_python=" + plugin]
    for inc, files in ((os.path.join(SOURCE_DIR, "proto"), protos), (out, ["health.proto"])):
        subprocess.run(gen + plug + ["-I" + inc, "--python_out=" + out, "--grpc_python_out=" + out] + files,
                       check=True)
    sys.path.insert(0, out)
    import importlib
    mods = {}
    for m in ("tensor", "ps", "supervisor", "worker"):
        mods[m + "_pb2"] = importlib.import_module("psfleet.v1.%s_pb2" % m)
        if m != "tensor":
            mods[m + "_pb2_grpc"] = importlib.import_module("psfleet.v1.%s_pb2_grpc" % m)
    mods["health_pb2"] = importlib.import_module("health_pb2")
    mods["health_pb2_grpc"] = importlib.import_module("health_pb2_grpc")

    class S:
        pass

    _stubs = S()
    for k, v in mods.items():
        setattr(_stubs, k, v)
    return _stubs


_tls = None
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1),
                   ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 500)]


def psfleet_certs(wd, job_path, tls_dir, *args):
    """Runs `psfleet certs` for the job into tls_dir (as an administrator would); returns its stdout."""
    r = subprocess.run([BIN["psfleet"], "certs", "--job", job_path, "--dir", tls_dir] + list(args),
                       capture_output=True, text=True, env=child_env(), timeout=60)
    assert r.returncode == 0, "psfleet certs: exit %d\n%s%s" % (r.returncode, r.stdout, r.stderr)
    return r.stdout


def use_tls(tls_dir, spec, identity="admin"):
    """From now on channel() speaks mutual TLS as `identity` with the certificates `psfleet certs` made in
    tls_dir for the job `spec` (a job dict with "job" and "cluster")."""
    global _tls
    tasks = {}
    for kind, addrs in spec["cluster"].items():
        for i, a in enumerate(addrs):
            tasks[a] = "chief" if kind == "chief" else "%s-%d" % (kind, i)
    _tls = {"dir": tls_dir, "job": spec["job"], "identity": identity, "tasks": tasks}


def tls_credentials(identity, tls_dir=None, job=None, ca_from=None):
    """grpc channel credentials: identity's key and certificate, trusting the CA in ca_from (default:
    the same directory)."""
    import grpc
    tls_dir = tls_dir or _tls["dir"]
    job = job or _tls["job"]
    d = os.path.join(tls_dir, job)

    def rd(name, base=d):
        with open(os.path.join(base, name), "rb") as f:
            return f.read()
    return grpc.ssl_channel_credentials(root_certificates=rd("ca.crt", os.path.join(ca_from or tls_dir, job)),
                                        private_key=rd(identity + ".key"), certificate_chain=rd(identity + ".crt"))


def channel(addr, identity=None, credentials=None):
    """A channel to addr: plain, or under use_tls() mutual TLS as identity (default: use_tls's), checking
    that the server is the task the job has at addr."""
    import grpc
    if _tls is None and credentials is None:
        return grpc.insecure_channel(addr, options=CHANNEL_OPTIONS)
    creds = credentials or tls_credentials(identity or _tls["identity"])
    server = "%s.%s.psfleet" % (_tls["tasks"][addr], _tls["job"])
    return grpc.secure_channel(addr, creds, options=CHANNEL_OPTIONS + [("grpc.ssl_target_name_override", server)])


def chief_and_ps(wd, job, spec, timeout=30):
    """Starts the job's chiefd and ps:0 and waits until the job is READY (initialized, no worker needed);
    returns (chief, ps, fingerprint)."""
    chief_addr, ps_addr = spec["cluster"]["chief"][0], spec["cluster"]["ps"][0]
    chief = daemon(wd, "chiefd", job)
    ps = daemon(wd, "psd", job, 0)
    wait_healthy(ps_addr, ps)
    st = wait_state(chief_addr, "READY", timeout, [chief, ps])
    return chief, ps, st.fingerprint


def shard_status(ps_addr, timeout=5):
    """GetShardStatus of the psd at ps_addr."""
    s = stubs()
    with channel(ps_addr) as ch:
        return s.ps_pb2_grpc.ParameterServerStub(ch).GetShardStatus(s.ps_pb2.ShardStatusRequest(), timeout=timeout)


def wait_pushes(ps_addr, n, procs=(), timeout=120):
    """Waits until the psd at ps_addr has applied n pushes; returns its ShardStatus then (mid-run: a psd
    stops with its job, so its counters are read while it trains)."""
    return wait_for("%d pushes" % n, lambda: (lambda st: st if st.pushes >= n else None)(shard_status(ps_addr)),
                    timeout, procs)


def pull_shard(stub, fingerprint, task="worker:0", with_slots=True):
    """A shard's tensors as {(name, row_offset): bytes}, and its global_step, through a ParameterServer stub."""
    s = stubs()
    caller = s.tensor_pb2.Caller(fingerprint=fingerprint, task=task)
    r = stub.Pull(s.ps_pb2.PullRequest(header=s.ps_pb2.PullHeader(caller=caller, with_slots=with_slots)), timeout=5)
    return {(t.name, t.row_offset): t.data for t in r.tensors}, r.header.global_step


def zero_step(stub, caller, pulled):
    """Pushes a zero gradient to the variable part pulled (a Tensor of a Pull) that counts a step, through
    a ParameterServer stub: global_step moves without changing any value (so that a checkpoint is
    written)."""
    s = stubs()
    t = s.tensor_pb2.Tensor(name=pulled.name, dtype=pulled.dtype, shape=pulled.shape, row_offset=pulled.row_offset,
                            data=bytes(len(pulled.data)))
    hdr = s.ps_pb2.PushHeader(caller=caller, worker=0, local_step=1, count_step=True)
    stub.Push(s.ps_pb2.PushRequest(header=hdr, grads=[t]), timeout=30)


def healthy(addr, timeout=0.5):
    import grpc
    s = stubs()
    with channel(addr) as ch:
        try:
            r = s.health_pb2_grpc.HealthStub(ch).Check(s.health_pb2.HealthCheckRequest(), timeout=timeout)
            return r.status == s.health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            return False


def wait_healthy(addr, proc=None, timeout=30):
    """Polls Health/Check (short deadlines) until SERVING; fails early if proc exits."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if healthy(addr):
            return
        if proc is not None and not proc.alive():
            raise AssertionError("%s exited with %s before it was ready:\n%s"
                                 % (proc.name, proc.p.returncode, proc.stderr()[-3000:]))
        time.sleep(0.1)
    raise AssertionError("%s not healthy after %.0f s" % (addr, timeout))


def job_status(chief_addr, timeout=2.0):
    s = stubs()
    with channel(chief_addr) as ch:
        return s.supervisor_pb2_grpc.SupervisorStub(ch).GetStatus(s.supervisor_pb2.StatusRequest(),
                                                                  timeout=timeout)


def proc_bytes(pid, key="VmRSS"):
    """A size line of /proc/PID/status (VmRSS, VmHWM, ...) in bytes."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def rpc_or_none(f):
    """f() or None when its RPC failed (a daemon not up yet, or gone)."""
    import grpc
    try:
        return f()
    except grpc.RpcError:
        return None


def wait_shard_initialized(ps_addr, what, timeout=60, procs=()):
    """Waits until the shard answers initialized (restored or assigned); returns its ShardStatus."""
    return wait_for(what, lambda: (lambda st: st if st is not None and st.initialized else None)(
        rpc_or_none(lambda: shard_status(ps_addr))), timeout, procs)


def list_checkpoints(chief_addr, timeout=5.0):
    """The chief's checkpoint records (Supervisor.ListCheckpoints), newest first."""
    s = stubs()
    with channel(chief_addr) as ch:
        return s.supervisor_pb2_grpc.SupervisorStub(ch).ListCheckpoints(
            s.supervisor_pb2.ListCheckpointsRequest(), timeout=timeout).checkpoints


def db_query(path, sql, args=()):
    """Every row of sql on an SQLite file opened read-only (chief.db while the chief writes it)."""
    import sqlite3
    con = sqlite3.connect("file:%s?mode=ro" % path, uri=True)
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def wait_state(chief_addr, state_name, timeout=60, procs=()):
    """Waits until the chief reports JOB_STATE_<state_name>; returns that JobStatus."""
    import grpc
    s = stubs()
    want = s.supervisor_pb2.JobState.Value("JOB_STATE_" + state_name)
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        try:
            last = job_status(chief_addr)
            if last.state == want:
                return last
            if last.state == s.supervisor_pb2.JOB_STATE_FAILED:
                raise AssertionError("job failed: " + last.reason)
        except grpc.RpcError as e:
            last = e
        for p in procs:
            if not p.alive() and p.p.returncode != 0:
                raise AssertionError("%s exited with %s:\n%s" % (p.name, p.p.returncode, p.stderr()[-3000:]))
        time.sleep(0.2)
    raise AssertionError("chief not %s after %.0f s; last: %s" % (state_name, timeout, last))


def wait_for(what, pred, timeout=30, procs=(), poll=0.1):
    """Polls pred() until it returns something true, and returns that; fails after timeout, or at once
    if one of procs exits."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        for p in procs:
            if not p.alive():
                raise AssertionError("%s exited (%s) while waiting for %s:\n%s"
                                     % (p.name, p.p.returncode, what, p.stderr()[-3000:]))
        time.sleep(poll)
    raise AssertionError("timed out waiting for " + what)


def psfleet_local(wd, job, args=(), env=None, name="psfleet-local"):
    """Starts `psfleet local` (stdout kept apart: the JSON line)."""
    e = {"TMPDIR": wd.path}
    if env:
        e.update(env)
    return Proc(wd, name, [BIN["psfleet"], "local", job] + list(args), e, stdout_to_log=False)


def result_line(proc):
    lines = [l for l in proc.stdout().splitlines() if l.strip()]
    assert len(lines) == 1, "expected one JSON line on stdout, got %r" % lines
    return json.loads(lines[0])


def local_result(wd, job, args=(), name="local", timeout=600):
    """Runs `psfleet local JOB ARGS --quiet` to its end, which must be exit 0; its JSON result line."""
    p = psfleet_local(wd, job, list(args) + ["--quiet"], name=name)
    rc = p.wait(timeout)
    assert rc == 0, "%s: exit %s:\n%s" % (name, rc, p.stderr()[-4000:])
    r = result_line(p)
    log(name, r)
    return r


def crc32c(data):
    """CRC-32C (Castagnoli), independent of psfleet's: to check checkpoint checksums, to frame TFRecord files."""
    table = crc32c.table
    if table is None:
        table = crc32c.table = []
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            table.append(c)
    c = 0xFFFFFFFF
    for b in data:
        c = table[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


crc32c.table = None

"""Each exit status systemd acts on (docs/operations.md, "Exit codes"), from the real daemons, with the one
line that says why: a malformed job file 78 naming the file and the key; a job beyond loopback without
certificates 78 naming the missing security.* keys and files (and insecure there without
allow_insecure 78); an empty data directory and a
truncated IDX file 65 from workerd, naming the file; a state directory chiefd cannot create or write 74;
an address already taken 75 with "cannot listen on ADDR: Address already in use" and no gRPC dump (and
psd 75 when a live listener holds its attach socket);
`psfleet local` on a broken data directory 65, naming the worker."""
import json
import os
import shutil
import socket
import struct

import harness as h

EX_DATAERR, EX_IOERR, EX_TEMPFAIL, EX_CONFIG = 65, 74, 75, 78


_runs = [0]


def run(wd, kind, job, index=None, state_dir=None, wrap=(), timeout=60):
    """Runs a daemon (under `wrap`, a command prefix) to its exit; returns (status, its error lines)."""
    argv = [h.BIN[kind], "--job", job, "--state-dir", state_dir or wd.file("state")]
    if index is not None:
        argv += ["--task-index", str(index)]
    _runs[0] += 1
    p = h.Proc(wd, "%s-%d" % (kind, _runs[0]), list(wrap) + argv)
    rc = p.wait(timeout)
    errors = [l for l in p.stderr().splitlines() if " error: " in l or l.startswith(kind + ": ")]
    h.log("%s exited %d: %s" % (kind, rc, errors))
    assert "chttp2_server" not in p.stderr(), p.stderr()   # no gRPC error dump
    return rc, errors


def with_data(job_path, data_dir):
    with open(job_path) as f:
        job = json.load(f)
    job["data"]["dir"] = data_dir
    with open(job_path, "w") as f:
        json.dump(job, f)


def test():
    h.require("psd", "workerd", "chiefd", "psfleet")
    wd = h.Workdir()

    # 78: a malformed job file, one line naming the file and the key, for each daemon
    job, spec = h.make_job(wd, "bad.json", training={"max_steps": 10})
    spec["training"]["batch_size"] = "many"
    with open(job, "w") as f:
        json.dump(spec, f)
    for kind, idx in (("psd", 0), ("workerd", 0), ("chiefd", None)):
        rc, errors = run(wd, kind, job, idx)
        assert rc == EX_CONFIG, (kind, rc)
        assert len(errors) == 1 and job in errors[0] and "training.batch_size" in errors[0], errors

    # 78: a job beyond loopback without certificates (security.mode auto means mtls there): each daemon
    # names the missing keys and files and says how to make them; nothing listens
    job, spec = h.make_job(wd, "remote.json", training={"max_steps": 10})
    spec["cluster"]["worker"].append("192.0.2.7:7002")   # TEST-NET: never this host
    spec["security"] = {"ca": wd.file("tls") + "/{job}/ca.crt", "cert": wd.file("tls") + "/{job}/{task}.crt",
                        "key": wd.file("tls") + "/{job}/{task}.key"}
    with open(job, "w") as f:
        json.dump(spec, f)
    for kind, idx, task in (("psd", 0, "ps-0"), ("workerd", 0, "worker-0"), ("chiefd", None, "chief")):
        rc, errors = run(wd, kind, job, idx)
        assert rc == EX_CONFIG, (kind, rc)
        assert len(errors) == 1, errors
        for text in ("security.mode is mtls (auto: an endpoint is beyond loopback)", "security.ca (",
                     "security.cert (%s/%s/%s.crt" % (wd.file("tls"), spec["job"], task), "security.key (",
                     "psfleet certs --job %s" % spec["job"]):
            assert text in errors[0], (kind, text, errors)
    # and insecure beyond loopback only with security.allow_insecure
    spec["security"] = {"mode": "insecure"}
    with open(job, "w") as f:
        json.dump(spec, f)
    rc, errors = run(wd, "psd", job, 0)
    assert rc == EX_CONFIG and "security.allow_insecure" in errors[0], (rc, errors)

    # 65: an empty data directory: workerd names the missing file
    empty = wd.file("empty-data")
    os.mkdir(empty)
    job, spec = h.make_job(wd, "empty.json", training={"max_steps": 10})
    with_data(job, empty)
    rc, errors = run(wd, "workerd", job, 0)
    assert rc == EX_DATAERR, rc
    assert len(errors) == 1 and os.path.join(empty, "train-images-idx3-ubyte.gz") in errors[0], errors
    assert "No such file or directory" in errors[0], errors
    # ... and chiefd for its test split
    rc, errors = run(wd, "chiefd", job, state_dir=wd.file("state-empty"))
    assert rc == EX_DATAERR, rc
    assert any(os.path.join(empty, "t10k-images-idx3-ubyte.gz") in e for e in errors), errors

    # 65: a truncated IDX file (the header promises 60000 images, the file holds a few bytes of one)
    trunc = wd.file("truncated-data")
    os.mkdir(trunc)
    for name in os.listdir(h.DATA_DIR):
        os.symlink(os.path.join(h.DATA_DIR, name), os.path.join(trunc, name))
    images = os.path.join(trunc, "train-images-idx3-ubyte.gz")
    os.unlink(images)
    with open(images, "wb") as f:
        f.write(struct.pack(">IIII", 0x803, 60000, 28, 28) + bytes(100))
    job, spec = h.make_job(wd, "trunc.json", training={"max_steps": 10})
    with_data(job, trunc)
    rc, errors = run(wd, "workerd", job, 0)
    assert rc == EX_DATAERR, rc
    assert len(errors) == 1 and images in errors[0] and "truncated" in errors[0], errors

    # 74: a state directory chiefd cannot create (a file where a directory should be) ...
    # (plain gRPC: the other user below could not make the job's own credentials in our work dir, and
    # they are not what is tested here)
    job, spec = h.make_job(wd, "state.json", training={"max_steps": 10}, security={"mode": "insecure"})
    blocker = wd.file("not-a-dir")
    open(blocker, "w").close()
    rc, errors = run(wd, "chiefd", job, state_dir=os.path.join(blocker, "state"))
    assert rc == EX_IOERR, rc
    assert len(errors) == 1 and blocker in errors[0], errors
    # ... and one it cannot write (as an unprivileged user: root writes anywhere)
    ro = wd.file("read-only-state")
    os.mkdir(ro, 0o555)
    os.chmod(wd.path, 0o755)
    wrap = ()
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv:
            wrap = (setpriv, "--reuid=65534", "--regid=65534", "--clear-groups")
    if os.geteuid() != 0 or wrap:
        os.chmod(job, 0o644)
        rc, errors = run(wd, "chiefd", job, state_dir=ro, wrap=wrap)
        assert rc == EX_IOERR, rc
        assert len(errors) == 1 and ro in errors[0] and "Permission denied" in errors[0], errors
    else:
        h.log("no setpriv: the read-only state directory case needs an unprivileged user")

    # 75: an address already taken, one line naming it, for each daemon
    job, spec = h.make_job(wd, "port.json", training={"max_steps": 10})
    for kind, idx, addr in (("psd", 0, spec["cluster"]["ps"][0]), ("workerd", 0, spec["cluster"]["worker"][0]),
                            ("chiefd", None, spec["cluster"]["chief"][0])):
        host, port = addr.rsplit(":", 1)
        taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        taken.bind((host, int(port)))
        taken.listen()
        try:
            rc, errors = run(wd, kind, job, idx, state_dir=wd.file("state-port"))
        finally:
            taken.close()
        assert rc == EX_TEMPFAIL, (kind, rc)
        assert len(errors) == 1, errors
        line = errors[0].replace('"', "")   # chiefd quotes the address
        assert ("annot listen on %s: Address already in use" % addr) in line, errors

    # 75 too: psd's attach socket held by a live listener (another psd of the same name on this host)
    os.makedirs(wd.runtime_dir, exist_ok=True)
    sock_path = os.path.join(wd.runtime_dir, "%s-ps-0.sock" % spec["job"])
    held = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    held.bind(sock_path)
    held.listen()
    try:
        rc, errors = run(wd, "psd", job, 0, state_dir=wd.file("state-port"))
    finally:
        held.close()
    assert rc == EX_TEMPFAIL, rc
    assert len(errors) == 1 and ("another psd listens at %s already" % sock_path) in errors[0], errors
    assert os.path.exists(sock_path), "psd removed a socket that was not its own"
    os.unlink(sock_path)

    # psfleet local: the status of the task that failed first, and which task it was
    job, spec = h.make_job(wd, "local.json", training={"max_steps": 50})
    with_data(job, empty)
    local = h.psfleet_local(wd, job, ["--quiet"])
    rc = local.wait(90)
    lines = [l for l in local.stderr().splitlines() if l.startswith("psfleet: ")]
    h.log("psfleet local exited %d: %s" % (rc, lines))
    assert rc == EX_DATAERR, rc
    # both the worker (its training split) and the chief (its test split) find no data: whichever exits
    # first is the one named
    assert any(("worker:0 exited with status 65: a data error" in l or
                "chief:0 exited with status 65: a data error" in l) for l in lines), lines

    # 78: a bad environment value of a key (log.*, rpc.*), one line naming the variable, before anything
    # starts; and psfleet's own commands refuse a bad rpc.* one the same way
    job, spec = h.make_job(wd, "env.json", training={"max_steps": 10})
    for var, value in (("PSFLEET_LOG_LEVEL", "loud"), ("PSFLEET_LOG_TIME", "sometimes"),
                       ("PSFLEET_RPC_MAX_RECONNECT_BACKOFF_MS", "0")):
        for kind, idx in (("psd", 0), ("workerd", 0), ("chiefd", None)):
            rc, errors = run_env(wd, kind, job, idx, {var: value})
            assert rc == EX_CONFIG, (kind, var, rc)
            assert len(errors) == 1 and ('%s: "%s"' % (var, value)) in errors[0], (kind, var, errors)
    # 78: a model with embedding tables on several GPUs of one worker (its sparse front runs on one
    # device), refused before anything is built, with no GPU needed to see it
    ctr = h.ctr_example()
    job, spec = h.make_job(wd, "ctr-gpus.json", base=ctr, training={"max_steps": 10})
    rc, errors = run_env(wd, "workerd", job, 0, {"PSFLEET_DEVICE": "gpu:0,1"})
    assert rc == EX_CONFIG, rc
    assert len(errors) == 1 and "model.embeddings" in errors[0] and "2 GPUs" in errors[0], errors
    p = h.Proc(wd, "psfleet-env", [h.BIN["psfleet"], "status", "--address", "127.0.0.1:1"],
               {"PSFLEET_RPC_INITIAL_RECONNECT_BACKOFF_MS": "fast"})
    rc = p.wait(60)
    assert rc == EX_CONFIG, rc
    assert 'psfleet: PSFLEET_RPC_INITIAL_RECONNECT_BACKOFF_MS: "fast"' in p.stderr(), p.stderr()


def run_env(wd, kind, job, index, env):
    """run() with `env` added to the daemon's environment."""
    argv = [h.BIN[kind], "--job", job, "--state-dir", wd.file("state-env")]
    if index is not None:
        argv += ["--task-index", str(index)]
    _runs[0] += 1
    p = h.Proc(wd, "%s-%d" % (kind, _runs[0]), argv, env)
    rc = p.wait(60)
    errors = [l for l in p.stderr().splitlines() if " error: " in l or l.startswith(kind + ": ")]
    h.log("%s exited %d: %s" % (kind, rc, errors))
    return rc, errors


if __name__ == "__main__":
    h.main(test)

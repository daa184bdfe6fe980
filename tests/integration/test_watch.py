"""The job as clients see it (issue 4): `psfleet watch` under a pseudo-terminal draws a live bar that
moves, and ends when the job is done; `psfleet checkpoints save|list|rm` and `psfleet status` with
--json; and the Python client example of docs/examples (grpcio + stubs generated from proto/) saves a
checkpoint, lists them, follows the Watch stream to the end and opens the final checkpoint."""
import json
import os
import re
import subprocess
import sys
import threading

import harness as h
import pyenv

EXAMPLE = os.path.join(h.SOURCE_DIR, "docs", "examples", "supervisor_client.py")


def run_cli(*args):
    r = subprocess.run([h.BIN["psfleet"]] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, env=h.child_env(), timeout=120)
    assert r.returncode == 0, "psfleet %s: exit %d\n%s" % (" ".join(args), r.returncode, r.stderr)
    return r.stdout


class PtyWatch:
    """`psfleet watch` with a pseudo-terminal as its stdout and stderr; reads everything it draws."""

    def __init__(self, args):
        master, slave = os.openpty()
        self.p = subprocess.Popen([h.BIN["psfleet"], "watch"] + args, stdin=slave, stdout=slave, stderr=slave,
                                  env=h.child_env(), close_fds=True)
        os.close(slave)
        self.master, self.out = master, b""
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        while True:
            try:
                d = os.read(self.master, 4096)
            except OSError:      # EIO: the other side is closed
                break
            if not d:
                break
            self.out += d

    def wait(self, timeout):
        rc = self.p.wait(timeout)
        self.t.join(5)
        os.close(self.master)
        return rc, self.out.decode(errors="replace")


def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
    pyenv.ensure()
    h.require("psd", "workerd", "chiefd", "psfleet")
    wd = h.Workdir()
    job, spec = h.make_job(wd, n_ps=1, n_workers=1, training={"max_steps": 2500, "report_every_steps": 25})
    spec["supervisor"] = {"save_checkpoint_steps": 500, "save_checkpoint_secs": 0, "keep_checkpoints": 2,
                          "save_summaries_secs": 0}
    with open(job, "w") as f:
        json.dump(spec, f)
    chief_addr = spec["cluster"]["chief"][0]

    chief = h.daemon(wd, "chiefd", job)
    h.wait_healthy(chief_addr, chief)
    watch = PtyWatch(["--job", job])     # before training starts: it must follow the whole run
    ps = h.daemon(wd, "psd", job, 0)
    worker = h.daemon(wd, "workerd", job, 0)

    s = h.stubs()
    stubs_dir = os.path.dirname(os.path.dirname(os.path.dirname(s.supervisor_pb2.__file__)))
    h.wait_state(chief_addr, "TRAINING", 60, [ps, chief, worker])
    example = h.Proc(wd, "example", [sys.executable, EXAMPLE, "--address", chief_addr, "--stubs", stubs_dir, "--save",
                                     "--read-checkpoint"], stdout_to_log=False)

    # The checkpoint commands, while the job trains.
    saved = json.loads(run_cli("checkpoints", "save", "--json", "--reason", "test", "--address", chief_addr))
    assert saved["trigger"] == "request" and saved["checksum"].startswith("crc32c:") and not saved["existing"], saved
    assert os.path.exists(saved["path"]), saved
    listing = json.loads(run_cli("checkpoints", "list", "--json", "--job", job))
    assert saved["global_step"] in [c["global_step"] for c in listing["checkpoints"]], listing
    assert listing["keep"] == 2 and listing["checkpoint_dir"] == os.path.dirname(saved["path"]), listing
    text = run_cli("checkpoints", "list", "--address", chief_addr)
    assert "STEP" in text and "CHECKSUM" in text and saved["path"] in text, text
    st = json.loads(run_cli("status", "--json", "--job", job))
    assert st["state"] in ("training", "stopping"), st
    assert re.fullmatch(r"[0-9a-f]{16}", st["fingerprint"]) and st["last_checkpoint"]["path"], st
    gone = json.loads(run_cli("checkpoints", "rm", str(saved["global_step"]), "--json", "--address", chief_addr))
    assert gone["path"] == saved["path"] and not os.path.exists(saved["path"]), gone
    listing = json.loads(run_cli("checkpoints", "list", "--json", "--address", chief_addr))
    assert saved["global_step"] not in [c["global_step"] for c in listing["checkpoints"]], listing

    # The bar: redrawn in place (carriage return, erase line) with the step moving; then the end.
    rc, out = watch.wait(120)
    h.log("watch drew %d updates; last: %r" % (out.count("\r\x1b[K"), out[-300:]))
    assert rc == 0, out[-2000:]
    frames = [f for f in out.split("\r\x1b[K") if f.strip()]
    steps = [int(m.group(1)) for f in frames for m in [re.search(r"\] (\d+)/2500", f)] if m]
    assert len(frames) >= 4 and len(set(steps)) >= 3, frames
    assert steps == sorted(steps) and steps[-1] == 2500, steps
    assert any(re.match(r"training \[#+-*\] \d+/2500  loss \d\.\d{4}  \d+ ex/s  ETA \d+:\d\d", f) for f in frames), frames
    assert any("ckpt " in f for f in frames), frames
    assert re.search(r"job fmnist-mlp done at global_step 2500: test accuracy 0\.\d{4}", out), out[-500:]

    # The Python example saw the same run to its end and read the final checkpoint.
    assert example.wait(60) == 0, example.stderr()[-3000:]
    ex = example.stdout()
    h.log("example printed %d lines, ending: %s" % (len(ex.splitlines()), ex.splitlines()[-3:]))
    assert re.search(r"job fmnist-mlp \(fingerprint [0-9a-f]{16}\): JOB_STATE_(TRAINING|READY)", ex), ex
    assert re.search(r"checkpoint at global_step \d+: .*ckpt-\d{10}\.safetensors \(\d+ bytes, crc32c:[0-9a-f]{8}\)", ex), ex
    assert re.search(r"^training step \d+/2500", ex, re.M) and re.search(r"^done +step 2500/2500", ex, re.M), ex
    assert re.search(r"done: test accuracy 0\.\d{4}", ex), ex
    assert re.search(r"ckpt-0000002500\.safetensors: global_step 2500, optimizer momentum", ex), ex
    assert re.search(r"dense0/kernel +784x256 +float32", ex), ex

    with h.channel(chief_addr) as ch:
        s.supervisor_pb2_grpc.SupervisorStub(ch).Stop(s.ps_pb2.StopRequest(reason="test done"), timeout=5)
    assert chief.wait(30) == 0, chief.stderr()[-2000:]


if __name__ == "__main__":
    h.main(test)

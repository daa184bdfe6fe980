"""A Python environment with packages from PyPI for the tests that hold psfleet to other people's
software: `safetensors` (checkpoints) and `tensorboard` (event files) read its files, `onnx` builds
models and `onnxruntime` runs them beside psfleet's graph engine (test_onnx_ops.py),
`kubernetes-validate` checks deploy/kubernetes/ against the Kubernetes API schema (test_manifests.py);
plus numpy.

ensure() creates <build>/pyenv once (`/usr/bin/python3 -m venv --system-site-packages`, so Debian's
grpcio and protobuf stay visible) and `pip install`s the packages there, under a file lock so that
tests run in parallel share one set-up; then it re-executes the calling test with that interpreter.
The ready-mark holds the package list: an environment made for another list (an older checkout's) gets
the missing packages installed into it the next time a test asks. A test exits 77 (skipped) only when
PyPI cannot be reached, and says why. Debian packages needed: python3-venv (for the venv module and
ensurepip) and python3-numpy.
"""
import fcntl
import os
import subprocess
import sys

import harness as h

PACKAGES = ["safetensors", "tensorboard", "onnx", "onnxruntime", "kubernetes-validate"]
VENV = os.environ.get("PSFLEET_PYENV") or os.path.join(h.BUILD_DIR, "pyenv")
PYTHON = os.path.join(VENV, "bin", "python")
MARK = os.path.join(VENV, ".psfleet-ready")
CHECK = ("import numpy, safetensors.numpy, grpc, onnx, onnx.helper, onnxruntime, kubernetes_validate; "
         "from tensorboard.backend.event_processing import event_accumulator")
# What the ready-mark holds: an environment whose mark differs was made for another list.
MARK_TEXT = "psfleet pyenv: %s\n" % " ".join(PACKAGES)

# What pip prints when it cannot reach the index (directly or through a proxy or mirror).
OFFLINE_SIGNS = ["NewConnectionError", "Failed to establish a new connection", "Temporary failure in name resolution",
                 "Name or service not known", "Network is unreachable", "Connection refused", "ConnectTimeoutError",
                 "Read timed out", "ProxyError", "Could not fetch URL", "No matching distribution found",
                 "connection error", "SSLError"]


def _ready():
    try:
        with open(MARK) as f:
            return f.read() == MARK_TEXT
    except OSError:
        return False


def _create():
    if os.access(PYTHON, os.X_OK):
        # made for another package list: install what it lacks (pip leaves what is there)
        h.log("adding to", VENV, "what it lacks of", " ".join(PACKAGES), "from PyPI (once)")
    else:
        h.log("setting up", VENV, "with", " ".join(PACKAGES), "from PyPI (once)")
        r = subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", VENV],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            # Not a network problem: the machine lacks Debian's python3-venv. A failure, not a skip.
            raise AssertionError("cannot create %s (is Debian's python3-venv installed?):\n%s" % (VENV, r.stdout))
    if os.path.exists(MARK):
        os.unlink(MARK)   # not ready until this list is in
    r = subprocess.run([PYTHON, "-m", "pip", "install", "--disable-pip-version-check", "--retries", "2",
                        "--timeout", "30"] + PACKAGES, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        tail = r.stdout[-3000:]
        if any(s in r.stdout for s in OFFLINE_SIGNS):
            h.skip("PyPI cannot be reached, so %s cannot be installed: %s"
                   % (" and ".join(PACKAGES), tail.strip().splitlines()[-1] if tail.strip() else "pip failed"))
        raise AssertionError("pip install %s failed:\n%s" % (" ".join(PACKAGES), tail))
    r = subprocess.run([PYTHON, "-c", CHECK], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise AssertionError("the packages do not import in %s:\n%s" % (VENV, r.stdout[-3000:]))
    with open(MARK + ".tmp", "w") as f:
        f.write(MARK_TEXT)
    os.replace(MARK + ".tmp", MARK)


def ensure():
    """Returns when running inside the environment; otherwise sets it up and re-executes this test."""
    if os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        return
    os.makedirs(os.path.dirname(VENV), exist_ok=True)
    with open(VENV + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _ready():
            _create()
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(PYTHON, [PYTHON] + sys.argv)

"""A psd that cannot map a worker's shared memory (as on another host: here it runs as another user, so
the kernel refuses it the worker's descriptor) answers AttachSharedMemory with FAILED_PRECONDITION; the
worker says so once, pushes to it through gRPC, and the job trains to its end."""
import os
import shutil

import harness as h

STEPS = 200


def test():
    h.require("psd", "workerd", "chiefd")
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        h.skip("needs root and setpriv(1) to run psd as another user")
    wd = h.Workdir()
    os.chmod(wd.path, 0o755)   # the other user reads the job file
    job, spec = h.make_job(wd, n_ps=1, n_workers=1, training={"max_steps": STEPS})
    os.chmod(job, 0o644)
    chief = h.daemon(wd, "chiefd", job)
    ps_argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", h.BIN["psd"], "--job", job,
               "--task-index", "0", "--state-dir", wd.file("ps-state")]
    ps = h.Proc(wd, "ps:0", ps_argv)
    h.wait_healthy(spec["cluster"]["ps"][0], ps)
    worker = h.daemon(wd, "workerd", job, 0)
    assert worker.wait(120) == 0, worker.stderr()[-3000:]
    log = worker.stderr()
    line = [l for l in log.splitlines() if "pushing through gRPC" in l]
    h.log("worker:", line)
    assert len(line) == 1, log[-3000:]   # said once
    assert "FAILED_PRECONDITION" in line[0] and "cannot serve worker:0 through shared memory" in line[0], line[0]
    assert "pushing through shared memory" not in log, log[-3000:]
    assert "done: %d local steps" % STEPS in log, log[-3000:]


if __name__ == "__main__":
    h.main(test)

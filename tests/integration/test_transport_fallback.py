"""A psd that cannot make its attach socket (its rpc.runtime_dir cannot be created: here a path under a
regular file) says so once, naming the path and the reason, and offers no shared memory; its worker on
the same host finds no socket, says so once, pushes through gRPC, and the job trains to its end."""
import harness as h

STEPS = 200


def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
    h.require("psd", "workerd", "chiefd")
    wd = h.Workdir()
    job, spec = h.make_job(wd, n_ps=1, n_workers=1, training={"max_steps": STEPS})
    with open(wd.file("not-a-dir"), "w") as f:
        f.write("in the way\n")
    bad_dir = wd.file("not-a-dir/run")
    chief = h.daemon(wd, "chiefd", job)
    ps_argv = [h.BIN["psd"], "--job", job, "--task-index", "0", "--state-dir", wd.file("ps-state")]
    ps = h.Proc(wd, "ps:0", ps_argv, env={"PSFLEET_RUNTIME_DIR": bad_dir})
    h.wait_healthy(spec["cluster"]["ps"][0], ps)
    worker = h.daemon(wd, "workerd", job, 0)
    assert worker.wait(120) == 0, worker.stderr()[-3000:]
    log = worker.stderr()
    line = [l for l in log.splitlines() if "pushing through gRPC" in l]
    h.log("worker:", line)
    assert len(line) == 1, log[-3000:]   # said once
    sock = "%s/%s-ps-0.sock" % (wd.runtime_dir, spec["job"])
    assert "nothing listens at %s" % sock in line[0] and "offers no shared memory" in line[0], line[0]
    assert "pushing through shared memory" not in log, log[-3000:]
    assert "done: %d local steps" % STEPS in log, log[-3000:]
    ps.kill()
    chief.kill()
    ps.wait(15)
    warned = [l for l in ps.stderr().splitlines() if "no shared memory for workers on this host" in l]
    h.log("ps:", warned)
    assert len(warned) == 1, ps.stderr()[-3000:]
    assert "cannot make the directory %s: Not a directory" % bad_dir in warned[0], warned[0]


if __name__ == "__main__":
    h.main(test)

"""Killing `psfleet local` leaves no process behind: SIGTERM stops every child cleanly (and removes the
temporary state directory); SIGKILL takes the children with it (PR_SET_PDEATHSIG)."""
import os
import signal

import harness as h


def children_of(pid):
    kids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid and fields[0] != "Z":
                    kids.append(int(d))
            except OSError:
                pass
    return kids


def start_and_wait_training(wd, name):
    p = h.psfleet_local(wd, h.EXAMPLE, ["--max-steps", "1000000"], name=name)
    # Training is under way once a worker has logged its first steps; every daemon is up by then.
    end = h.time.monotonic() + 60
    while h.time.monotonic() < end:
        assert p.alive(), p.stderr()
        if p.stderr().count("training from global_step") >= 2:
            break
        h.time.sleep(0.1)
    else:
        raise AssertionError("no training after 60 s:\n" + p.stderr())
    kids = children_of(p.pid)
    assert len(kids) == 4, "expected psd, chiefd and 2 workerd under psfleet, got %s" % kids
    return p, kids


def gone(pids, timeout):
    end = h.time.monotonic() + timeout
    while h.time.monotonic() < end:
        left = [k for k in pids if os.path.exists("/proc/%d" % k) and not is_zombie(k)]
        if not left:
            return []
        h.time.sleep(0.05)
    return left


def is_zombie(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test():
    h.require("psd", "workerd", "chiefd", "psfleet")
    wd = h.Workdir()

    p, kids = start_and_wait_training(wd, "local-sigterm")
    p.kill(signal.SIGTERM)
    rc = p.wait(30)
    h.log("after SIGTERM: exit", rc, "|", p.stderr().strip().splitlines()[-1])
    assert rc != 0, "psfleet local exited 0 after SIGTERM"
    assert gone(kids, 1) == [], "children left after SIGTERM: %s" % kids
    assert h.tagged_pids() == [], h.tagged_pids()
    left = [d for d in os.listdir(wd.path) if d.startswith("psfleet-local-")]
    assert not left, "state directory not removed: %s" % left

    p, kids = start_and_wait_training(wd, "local-sigkill")
    p.kill(signal.SIGKILL)
    p.wait(10)
    left = gone(kids, 10)
    assert left == [], "children left after SIGKILL: %s" % left
    assert h.wait_no_tagged(5) == [], h.tagged_pids()


if __name__ == "__main__":
    h.main(test)

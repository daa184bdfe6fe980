"""The distributed path is right: with 1 ps and 1 worker, the loss of every one of 200 steps equals the
standalone trainer's (same seed, same data order) within 1e-5 relative, with the tensors moving through
shared memory (the default on one host) and through gRPC (rpc.shared_memory false) alike."""
import harness as h

STEPS = 200


def read_log(path):
    out = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                step, loss = line.split()
                out[int(step)] = float(loss)
    return out


def compare(a, b, what):
    assert sorted(b) == list(range(STEPS)), "%s steps: %s... (%d)" % (what, sorted(b)[:5], len(b))
    worst = max(range(STEPS), key=lambda s: abs(a[s] - b[s]) / max(abs(a[s]), 1e-30))
    rel = abs(a[worst] - b[worst]) / max(abs(a[worst]), 1e-30)
    h.log("%s: largest relative difference %.3g at step %d (%.9g vs %.9g)" % (what, rel, worst, a[worst], b[worst]))
    bad = [s for s in range(STEPS) if abs(a[s] - b[s]) > 1e-5 * abs(a[s])]
    assert not bad, "%s: steps differing by more than 1e-5 relative: %s (first: %.9g vs %.9g)" % (
        what, bad[:10], a[bad[0]], b[bad[0]])


def test():
    h.require("psd", "workerd", "chiefd", "psfleet")
    wd = h.Workdir()
    job, _ = h.make_job(wd, n_ps=1, n_workers=1, training={"max_steps": STEPS})
    sa_log = wd.file("standalone.loss")
    sa = h.psfleet_local(wd, job, ["--standalone", "--loss-log", sa_log, "--quiet"], name="standalone")
    assert sa.wait(120) == 0, sa.stderr()
    h.log("standalone:", h.result_line(sa))
    a = read_log(sa_log)
    assert sorted(a) == list(range(STEPS)), "standalone steps: %s..." % sorted(a)[:5]

    for transport, shm, says in (("shared memory", True, "pushing through shared memory"),
                                 ("gRPC", False, "pushing through gRPC only")):
        tj, _ = h.make_job(wd, name="job-%s.json" % ("shm" if shm else "grpc"), n_ps=1, n_workers=1,
                           training={"max_steps": STEPS}, rpc={"shared_memory": shm, "compression": "none"})
        log_path = wd.file("distributed-%s.loss" % ("shm" if shm else "grpc"))
        dist = h.psfleet_local(wd, tj, ["--loss-log", log_path], name="distributed-" + ("shm" if shm else "grpc"))
        assert dist.wait(120) == 0, dist.stderr()
        h.log("distributed through %s:" % transport, h.result_line(dist))
        # the run went the way it was meant to: the worker says which way it pushed
        assert says in dist.stderr(), "the worker did not say %r:\n%s" % (says, dist.stderr()[-3000:])
        compare(a, read_log(log_path), "through " + transport)


if __name__ == "__main__":
    h.main(test)

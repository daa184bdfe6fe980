"""The distributed path is right: with 1 ps and 1 worker, the loss of every one of 200 steps equals the
standalone trainer's (same seed, same data order) within 1e-5 relative."""
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


def test():
    h.require("psd", "workerd", "chiefd", "psfleet")
    wd = h.Workdir()
    job, _ = h.make_job(wd, n_ps=1, n_workers=1, training={"max_steps": STEPS})
    sa_log, dist_log = wd.file("standalone.loss"), wd.file("distributed.loss")

    sa = h.psfleet_local(wd, job, ["--standalone", "--loss-log", sa_log, "--quiet"], name="standalone")
    assert sa.wait(120) == 0, sa.stderr()
    dist = h.psfleet_local(wd, job, ["--loss-log", dist_log, "--quiet"], name="distributed")
    assert dist.wait(120) == 0, dist.stderr()
    h.log("standalone:", h.result_line(sa))
    h.log("distributed:", h.result_line(dist))

    a, b = read_log(sa_log), read_log(dist_log)
    assert sorted(a) == list(range(STEPS)), "standalone steps: %s..." % sorted(a)[:5]
    assert sorted(b) == list(range(STEPS)), "distributed steps: %s... (%d)" % (sorted(b)[:5], len(b))
    worst = max(range(STEPS), key=lambda s: abs(a[s] - b[s]) / max(abs(a[s]), 1e-30))
    rel = abs(a[worst] - b[worst]) / max(abs(a[worst]), 1e-30)
    h.log("largest relative difference %.3g at step %d (%.9g vs %.9g)" % (rel, worst, a[worst], b[worst]))
    bad = [s for s in range(STEPS) if abs(a[s] - b[s]) > 1e-5 * abs(a[s])]
    assert not bad, "steps differing by more than 1e-5 relative: %s (first: %.9g vs %.9g)" % (
        bad[:10], a[bad[0]], b[bad[0]])


if __name__ == "__main__":
    h.main(test)

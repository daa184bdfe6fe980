"""training.mode sync is deterministic: 2 workers, N = 2, no backup, each step the mean of both workers'
gradients summed in worker order, equals the standalone trainer with a batch of 2 x 64 made of the same
examples (worker 0's next 64, then worker 1's): after 200 steps every variable of the job's final
checkpoint equals the standalone trainer's within 1e-5, and so does every step's loss (the mean of
the two workers' losses), through shared memory and through gRPC alike. No push is dropped as stale."""
import glob
import os

import harness as h
import pyenv
from test_equality import read_log   # "step loss" lines: {step: loss}

STEPS = 200
TRAINING = {"max_steps": STEPS, "batch_size": 64, "mode": "sync", "replicas_to_aggregate": 2,
            "total_num_replicas": 2}


def variables(path):
    from safetensors.numpy import load_file
    return {k: v for k, v in load_file(path).items() if "/" not in k or k.count("/") == 1 and
            not k.endswith(("/momentum", "/m", "/v", "/accumulator"))}


def test():
    pyenv.ensure()
    h.require("psd", "workerd", "chiefd", "psfleet")
    import numpy as np
    wd = h.Workdir()
    job, spec = h.make_job(wd, n_ps=1, n_workers=2, training=TRAINING)
    sa_log, sa_params = wd.file("standalone.loss"), wd.file("standalone.safetensors")
    sa = h.psfleet_local(wd, job, ["--standalone", "--loss-log", sa_log, "--params-out", sa_params, "--quiet"],
                         name="standalone")
    assert sa.wait(120) == 0, sa.stderr()
    h.log("standalone (batch 2 x 64):", h.result_line(sa))
    a = read_log(sa_log)
    assert sorted(a) == list(range(STEPS)), "standalone steps: %s..." % sorted(a)[:5]
    want = variables(sa_params)
    assert len(want) >= 2, sorted(want)

    for shm in (True, False):
        tag = "shm" if shm else "grpc"
        tj, _ = h.make_job(wd, name="job-%s.json" % tag, n_ps=1, n_workers=2, training=TRAINING,
                           rpc={"shared_memory": shm, "compression": "none"})
        state, log_path = wd.file("state-" + tag), wd.file("distributed-%s.loss" % tag)
        dist = h.psfleet_local(wd, tj, ["--loss-log", log_path, "--state-dir", state], name="sync-" + tag)
        assert dist.wait(180) == 0, dist.stderr()[-3000:]
        res = h.result_line(dist)
        h.log("sync through %s:" % tag, res)
        assert res["global_step"] == STEPS, res
        err = dist.stderr()
        says = "pushing through shared memory" if shm else "pushing through gRPC only"
        assert says in err, "the workers did not say %r" % says
        # every step's loss: the mean of the workers' two halves of the standalone batch
        logs = [read_log(log_path + ".%d" % k) for k in range(2)]
        for k in range(2):
            assert sorted(logs[k]) == list(range(STEPS)), "worker %d logged steps %s..." % (k, sorted(logs[k])[:8])
        worst = 0.0
        for s in range(STEPS):
            mean = (logs[0][s] + logs[1][s]) / 2
            rel = abs(mean - a[s]) / max(abs(a[s]), 1e-30)
            worst = max(worst, rel)
            assert rel <= 1e-5, "%s step %d: loss %.9g (mean of the workers'), standalone %.9g" % (tag, s, mean, a[s])
        h.log("%s: losses within %.3g relative of the standalone trainer's" % (tag, worst))
        # the variables: the final checkpoint at global_step STEPS
        files = glob.glob(os.path.join(state, spec["job"], "checkpoints", "ckpt-*.safetensors"))
        from safetensors import safe_open
        final = [f for f in files if safe_open(f, "np").metadata()["global_step"] == str(STEPS)]
        assert len(final) == 1, files
        got = variables(final[0])
        assert sorted(got) == sorted(want), (sorted(got), sorted(want))
        for name in sorted(want):
            d = float(np.max(np.abs(got[name] - want[name])))
            h.log("%s: %s (%s) largest difference %.3g" % (tag, name, "x".join(map(str, want[name].shape)), d))
            assert d <= 1e-5, "%s: %s differs by %.3g from the standalone trainer's" % (tag, name, d)
        assert "dropped as stale" not in err


if __name__ == "__main__":
    h.main(test)

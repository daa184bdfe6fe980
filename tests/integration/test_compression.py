"""rpc.compression end to end: the demo model, 1 ps + 1 worker, every push through gRPC (rpc.shared_memory
off), trained 2000 steps with each compression. Each run still learns as the float32 run does (test
accuracy within ACCURACY_POINTS of it; int8 and topk carry what they drop to the next push: error
feedback), and psd's counters show the bytes each compression saves: gradient bytes in per push of
int8 at most 0.3 of float32's, of topk:0.01 at most 0.05; answers in bfloat16 (half of float32's) for
bf16 and topk, and as int8 changes to the worker's values for int8 (at most 0.3 of float32's, psd keeping
the worker's copy), so int8 moves at most 0.3 of float32's bytes both ways; auto (the default) over plain TCP on loopback is none. Under mutual TLS (the
default security of a job on one host) auto is int8 on loopback too: the job learns alike and the worker
says why. Prints a table of the figures (docs/performance.md, "Compression")."""
import harness as h

STEPS = 2000
MODES = ["none", "bf16", "int8", "topk:0.01", "auto"]   # auto, the default: none on loopback
ACCURACY_POINTS = 0.005      # 0.5 points of test accuracy


def run(mode):
    wd = h.Workdir()
    job, spec = h.make_job(wd, n_ps=1, n_workers=1, training={"max_steps": STEPS},
                           rpc={"shared_memory": False, "compression": mode})
    chief_addr = spec["cluster"]["chief"][0]
    chief, ps = h.chief_and_ps(wd, job, spec)[:2]
    worker = h.daemon(wd, "workerd", job, 0)
    st = h.wait_pushes(spec["cluster"]["ps"][0], 1000, [worker, chief, ps])
    assert st.rejected == 0, st
    assert worker.wait(240) == 0, worker.stderr()[-3000:]
    assert "pushing through shared memory" not in worker.stderr()
    # auto's int8 is for shards on other hosts, or under mutual TLS
    assert "is beyond loopback" not in worker.stderr() and "under mutual TLS" not in worker.stderr()
    done = h.wait_state(chief_addr, "DONE", 120, [chief])
    for p in (chief, ps):
        p.kill()
    assert done.global_step >= STEPS, done
    return {"mode": mode, "in_per_push": st.bytes_in / st.pushes, "out_per_push": st.bytes_out / st.pushes,
            "params": st.bytes // 4, "accuracy": done.test_accuracy}


def run_auto_mtls():
    """auto under the default security of a job on one host (mutual TLS with the job's own CA): int8."""
    wd = h.Workdir()
    job, _ = h.make_job(wd, n_ps=1, n_workers=1, training={"max_steps": STEPS},
                        rpc={"shared_memory": False}, security={"mode": "auto"})
    p = h.psfleet_local(wd, job, name="auto-mtls")   # not --quiet: the worker's info lines
    assert p.wait(300) == 0, p.stderr()[-3000:]
    assert "is reached under mutual TLS: its gRPC pushes go as int8 with error feedback" in p.stderr(), \
        p.stderr()[-3000:]
    return h.result_line(p)["test_accuracy"]


def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
    h.require("psd", "workerd", "chiefd")
    res = {m: run(m) for m in MODES}
    base = res["none"]
    h.log("%-10s %14s %9s %14s %9s %9s" % ("mode", "in B/push", "of fp32", "out B/push", "of fp32", "accuracy"))
    for m in MODES:
        r = res[m]
        h.log("%-10s %14.0f %9.3f %14.0f %9.3f %9.4f" % (m, r["in_per_push"], r["in_per_push"] / base["in_per_push"],
                                                        r["out_per_push"], r["out_per_push"] / base["out_per_push"],
                                                        r["accuracy"]))
    assert base["accuracy"] >= 0.80, base
    assert abs(base["in_per_push"] - base["out_per_push"]) < 1, base   # float32 both ways
    for k in ("in_per_push", "out_per_push"):   # float32 both ways (a push's header varies by a few bytes)
        assert abs(res["auto"][k] / base[k] - 1) < 0.001, (res["auto"], base)
    assert abs(res["bf16"]["in_per_push"] / base["in_per_push"] - 0.5) < 0.01, res["bf16"]
    assert res["int8"]["in_per_push"] <= 0.3 * base["in_per_push"], res["int8"]
    assert res["topk:0.01"]["in_per_push"] <= 0.05 * base["in_per_push"], res["topk:0.01"]
    for m in ("bf16", "int8", "topk:0.01"):
        # answers: bfloat16 (bf16, topk) or int8 changes (int8) for the compressed variables, float32 for the
        # small ones left alone
        assert res[m]["out_per_push"] <= (0.3 if m == "int8" else 0.51) * base["out_per_push"], res[m]
        assert res[m]["accuracy"] >= base["accuracy"] - ACCURACY_POINTS, (m, res[m], base)
    acc = run_auto_mtls()
    h.log("auto under mutual TLS (int8): accuracy %.4f" % acc)
    assert acc >= base["accuracy"] - ACCURACY_POINTS, (acc, base)


if __name__ == "__main__":
    h.main(test)

"""A worker whose job file differs from the chief's is refused with a message naming the difference
(exit 78, the key path in the message), while a worker with the right file trains to the end."""
import json

import harness as h


def test():
    h.plain_rpc()   # its own gRPC clients call the daemons as any role
    h.require("psd", "workerd", "chiefd")
    wd = h.Workdir()
    job, spec = h.make_job(wd, n_ps=1, n_workers=2, training={"max_steps": 150})
    other = json.loads(json.dumps(spec))
    other["model"]["layers"][2]["units"] = 64           # dense 128 -> 64
    bad_job = wd.file("other.json")
    with open(bad_job, "w") as f:
        json.dump(other, f)
    chief_addr = spec["cluster"]["chief"][0]

    chief = h.daemon(wd, "chiefd", job)
    ps = h.daemon(wd, "psd", job, 0)
    h.wait_state(chief_addr, "READY", 20, [chief, ps])
    bad = h.daemon(wd, "workerd", bad_job, 1)
    rc = bad.wait(30)
    err = bad.stderr()
    h.log("mismatched worker exited", rc, "|", [l for l in err.splitlines() if "refused" in l][:1])
    assert rc == 78, "exit %s:\n%s" % (rc, err)
    assert "model.layers[2].units" in err and "ours 128, theirs 64" in err, err
    assert "job file differs from the chief's" in err, err
    assert "model.layers[2].units" in chief.stderr(), chief.stderr()   # logged by the chief too

    good = h.daemon(wd, "workerd", job, 0)
    st = h.wait_state(chief_addr, "DONE", 60, [chief, ps, good])
    assert st.global_step >= 150, st
    assert good.wait(20) == 0, good.stderr()


if __name__ == "__main__":
    h.main(test)

"""psfleet local with 2 ps shards (a variable split across them) and 3 workers finishes, and its one
JSON line says so. A job so short that it ends before the chief first sees global_step move still
reports a rate (from its start), not 0."""
import harness as h


def test():
    h.require("psd", "workerd", "chiefd", "psfleet")
    wd = h.Workdir()
    # split_bytes below dense0/kernel's 802816 bytes: that variable is split into row ranges.
    job, spec = h.make_job(wd, n_ps=1, n_workers=1, training={"max_steps": 400}, ps={"split_bytes": 262144})
    p = h.psfleet_local(wd, job, ["--ps", "2", "--workers", "3", "--quiet"])
    rc = p.wait(120)
    assert rc == 0, "exit %s:\n%s" % (rc, p.stderr())
    r = h.result_line(p)
    h.log("result:", r)
    assert r["mode"] == "distributed" and r["ps"] == 2 and r["workers"] == 3, r
    assert r["global_step"] >= 400, r
    assert 0.5 < r["test_accuracy"] <= 1, r
    assert r["examples_per_s"] > 0 and r["wall_s"] > 0, r

    # 20 steps end within the chief's first poll of global_step
    short, _ = h.make_job(wd, n_ps=1, n_workers=1, training={"max_steps": 20}, name="short.json")
    p = h.psfleet_local(wd, short, ["--ps", "1", "--workers", "2", "--quiet"])
    rc = p.wait(120)
    assert rc == 0, "exit %s:\n%s" % (rc, p.stderr())
    r = h.result_line(p)
    h.log("a short job's result:", r)
    assert r["global_step"] >= 20 and r["examples_per_s"] > 0, r

    # The plan really splits: psfleet placement shows dense0/kernel in parts on both shards.
    import subprocess
    import json
    with open(job) as f:
        j = json.load(f)
    j["cluster"]["ps"].append("127.0.0.1:1")
    job2 = wd.file("two-ps.json")
    with open(job2, "w") as f:
        json.dump(j, f)
    out = subprocess.run([h.BIN["psfleet"], "placement", job2], capture_output=True, text=True, check=True).stdout
    h.log("placement:\n" + out)
    rows = [l.split() for l in out.splitlines() if l.split() and l.split()[1:2] == ["dense0/kernel"]]
    assert len(rows) >= 2 and {r[0] for r in rows} == {"0", "1"}, out


if __name__ == "__main__":
    h.main(test)

"""A model with embeddings trained through real daemons (docs/sparse.md): `psfleet gen-data` writes 10^6
Criteo-like rows (and 10^5 test rows) from a planted logistic model; examples/ctr-widedeep.json's job
(one pass over them) with 1 ps + 2 workers reaches the planted model's own AUC on the test rows within
0.02, and the same job with 2 ps shards gives the same AUC within 0.005 (rows are initialized by id,
not by shard, so the model is the same whatever the sharding). About 2.5 minutes on 2 cores."""
import json
import os

import harness as h

TRAIN_ROWS, TEST_ROWS = 1000000, 100000


def gen(wd, rows, out, test_rows=None, test_out=None):
    args = [h.BIN["psfleet"], "gen-data", "--rows", str(rows), "--out", out, "--seed", "7"]
    if test_rows:
        args += ["--test-rows", str(test_rows), "--test-out", test_out]
    p = h.Proc(wd, "gen-data", args)
    assert p.wait(300) == 0, p.stderr()
    with open((test_out or out) + ".meta.json") as f:
        return json.load(f)


def gen_split(wd, rows, test_rows):
    """A data directory with train.tsv.gz (rows) and test.tsv.gz (test_rows) from gen-data."""
    data = wd.file("data")
    os.makedirs(data)
    gen(wd, rows, os.path.join(data, "train.tsv.gz"), test_rows, os.path.join(data, "test.tsv.gz"))
    return data


def job_for(wd, name, n_ps, n_workers, data_dir, steps):
    with open(os.path.join(h.SOURCE_DIR, "examples", "ctr-widedeep.json")) as f:
        base = json.load(f)
    base["data"]["dir"] = data_dir
    base["job"] = name
    path, _ = h.make_job(wd, name + ".json", n_ps=n_ps, n_workers=n_workers, base=base,
                         training={"max_steps": steps, "report_every_steps": 100})
    return path


def test():
    h.require_built("psd", "workerd", "chiefd", "psfleet")
    wd = h.Workdir()
    data = wd.file("data")
    os.makedirs(data)
    meta = gen(wd, TRAIN_ROWS, os.path.join(data, "train.tsv.gz"), TEST_ROWS, os.path.join(data, "test.tsv.gz"))
    planted = meta["planted_auc"]
    h.log("planted AUC on the test rows: %.4f" % planted)
    steps = TRAIN_ROWS // 256   # one pass over the data, both workers together
    one = h.local_result(wd, job_for(wd, "ctr-1ps", 1, 2, data, steps), name="1ps-2w")
    two = h.local_result(wd, job_for(wd, "ctr-2ps", 2, 2, data, steps), name="2ps-2w")
    for r in (one, two):
        assert r["global_step"] >= steps, r
        assert r["test_auc"] >= planted - 0.02, (r, planted)
    assert abs(one["test_auc"] - two["test_auc"]) <= 0.005, (one, two)


if __name__ == "__main__":
    h.main(test)

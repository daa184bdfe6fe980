"""The other two record formats through real daemons: a CSV regression (no embeddings, an MSE head)
reaches the planted model's RMSE within 10 %, and a LIBSVM job (one table of dim 1, FTRL, 2 ps shards:
logistic regression on hashed features) gets within 0.06 of the planted AUC after 600 steps of 64."""
import json
import os

import harness as h


def gen(wd, fmt, name):
    out, test = wd.file(name + ".train"), wd.file(name + ".test")
    p = h.Proc(wd, "gen-" + fmt, [h.BIN["psfleet"], "gen-data", "--format", fmt, "--rows", "20000", "--out", out,
                                  "--test-rows", "2000", "--test-out", test, "--seed", "5"])
    assert p.wait(60) == 0, p.stderr()
    return json.load(open(test + ".meta.json"))


def run(wd, job):
    return h.local_result(wd, job, name=os.path.basename(job), timeout=120)


def test():
    h.require_built("psd", "workerd", "chiefd", "psfleet")
    wd = h.Workdir()
    csv, svm = gen(wd, "csv", "csv"), gen(wd, "libsvm", "svm")
    job, _ = h.make_job(wd, "csv.json", n_ps=1, n_workers=1, base={
        "model": {"input": [13], "head": "mse", "layers": [{"type": "dense", "units": 1}]},
        "data": {"dir": wd.path, "format": "csv", "train_files": ["csv.train"], "test_files": ["csv.test"]},
        "training": {"batch_size": 64, "optimizer": "sgd", "learning_rate": 0.05, "max_steps": 1000}})
    r = run(wd, job)
    assert 0 < r["test_rmse"] <= 1.1 * csv["planted_rmse"], (r, csv["planted_rmse"])
    job, _ = h.make_job(wd, "svm.json", n_ps=2, n_workers=1, base={
        "model": {"input": [0], "head": "logistic", "layers": [{"type": "dense", "units": 1}],
                  "embeddings": [{"name": "lr", "fields": "all", "dim": 1, "init_stddev": 0}]},
        "data": {"dir": wd.path, "format": "libsvm", "train_files": ["svm.train"], "test_files": ["svm.test"]},
        "training": {"batch_size": 64, "optimizer": "adagrad", "learning_rate": 0.1, "sparse_optimizer": "ftrl",
                     "sparse_learning_rate": 0.5, "max_steps": 600}})
    r = run(wd, job)
    assert r["test_auc"] >= svm["planted_auc"] - 0.06, (r, svm["planted_auc"])


if __name__ == "__main__":
    h.main(test)

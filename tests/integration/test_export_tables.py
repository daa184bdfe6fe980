"""psfleet export of models with embedding tables, against ONNX Runtime: examples/ctr-widedeep.json (a
layer list with two raw-id tables), the same with a hashed table (vocab) and mean pooling, and the graph
examples DLRM, DeepFM and DCN-v2, and LIBSVM jobs (one field of many weighted ids, sum and mean pooled) (examples/models/export.py, Debian's python3-torch), each trained
through real daemons (1 ps + 1 worker, a short run) on `psfleet gen-data`'s Criteo-like rows and
exported offline. onnx.checker accepts each file; ONNX Runtime, fed the test split as the data has it
(the dense columns as the reader gives them, the ids as the reader hashes the tokens, docs/serving.md),
gives the test AUC the chief reported, to 4 decimals. The layer list again with --max-inline-rows 1:
the tables go out as tables/NAME.safetensors with tables.json, equal to the checkpoint's rows in id order, and the
graph, fed the rows pooled from those files, gives the same AUC; and with --external-data, the tables'
rows in model.onnx.data (ONNX external data, as for a model over 2 GiB), the same AUC.

onnx and onnxruntime come from PyPI in <build>/pyenv (pyenv.py); the graph examples are skipped, saying
so, without python3-torch. About 2 minutes."""
import json
import os
import subprocess
import sys

import harness as h
import pyenv
from test_export import export, state_dir
from test_sparse_job import gen_split

sys.path.insert(0, os.path.join(h.SOURCE_DIR, "tools"))
import serving  # noqa: E402  (the reference of what a server does to a record, docs/serving.md)

TORCH_PYTHON = "/usr/bin/python3"
EXAMPLES = os.path.join(h.SOURCE_DIR, "examples")
TRAIN_ROWS, TEST_ROWS, STEPS = 60000, 20000, 300
def auc(np, p, y):
    """AUC as the chief computes it: each positive scores 1 per negative below it, 1/2 per tie."""
    order = np.argsort(p, kind="mergesort")
    p, y = p[order], y[order]
    neg_below = total = pos = 0.0
    i, n = 0, len(p)
    while i < n:
        j = i
        while j < n and p[j] == p[i]:
            j += 1
        gp = float(y[i:j].sum())
        gn = (j - i) - gp
        total += gp * neg_below + 0.5 * gp * gn
        neg_below += gn
        pos += gp
        i = j
    return total / (pos * neg_below)


def train(wd, name, base, data):
    base = json.loads(json.dumps(base))
    base["job"] = name
    base["data"]["dir"] = data
    path, job = h.make_job(wd, name + ".json", n_ps=1, n_workers=1, base=base,
                           training={"max_steps": STEPS, "report_every_steps": 100, "threads": 1})
    r = h.local_result(wd, path, args=["--keep-state"], name=name, timeout=600)
    return path, r


def serve(np, ort, f, feeds_of):
    s = ort.InferenceSession(f, providers=["CPUExecutionProvider"])
    names = [i.name for i in s.get_inputs()]
    out = [o.name for o in s.get_outputs()]
    assert "probability" in out, out
    (prob,) = s.run(["probability"], feeds_of(names))
    return prob.reshape(-1), names


def check(wd, np, onnx, ort, name, base, data, test, *extra):
    path, r = train(wd, name, base, data)
    out = wd.file(name + "-export")
    p = export(None, path, out, "--state-dir", state_dir(wd, name), *extra)
    assert p.returncode == 0, "%s: export exit %d:\n%s" % (name, p.returncode, p.stderr)
    h.log(p.stdout.strip())
    f = os.path.join(out, "model.onnx")
    onnx.checker.check_model(onnx.load(f), full_check=True)
    dense, ids, weights, y = test

    def feeds(names):
        d = {}
        for n in names:
            d[n] = dense if n == "dense" else weights if n.endswith("weights") else ids
        return d
    prob, names = serve(np, ort, f, feeds)
    got = auc(np, prob, y)
    h.log("%s: inputs %s; ONNX Runtime's test AUC %.4f, the chief's %.4f" % (name, names, got, r["test_auc"]))
    assert round(got, 4) == round(r["test_auc"], 4), (name, got, r["test_auc"])
    return path, r, out


def check_external(wd, np, onnx, ort, st, path, r, test):
    """The layer list with its tables served from outside: the files and the pooled inputs."""
    out = wd.file("ctr-external")
    p = export(None, path, out, "--state-dir", state_dir(wd, "ctr"), "--max-inline-rows", "1")
    assert p.returncode == 0, p.stderr
    f = os.path.join(out, "model.onnx")
    onnx.checker.check_model(onnx.load(f), full_check=True)
    with open(os.path.join(out, "tables.json")) as fh:
        manifest = json.load(fh)
    ck = [os.path.join(rt, fn) for rt, _, fs in os.walk(os.path.join(state_dir(wd, "ctr"), "ctr"))
          for fn in fs if fn.endswith(".safetensors")]
    newest = st.load_file(sorted(ck)[-1])
    dense, ids, weights, y = test
    feeds = {"dense": dense}
    for t in manifest["tables"]:
        tf = st.load_file(os.path.join(out, t["file"]))
        order = np.argsort(newest["emb/%s/ids" % t["name"]], kind="stable")   # exports list ids in order
        assert np.array_equal(tf["ids"], newest["emb/%s/ids" % t["name"]][order]), t["name"]
        assert np.array_equal(tf["rows"], newest["emb/%s" % t["name"]][order]), t["name"]
        # what a serving system with its own store does: look up, pool (sum, weight 1), feed
        row_of = {int(k): i for i, k in enumerate(tf["ids"])}
        rows = np.vstack([tf["rows"], np.zeros((1, t["dim"]), np.float32)])
        u = ids[:, t["fields"]].view(np.uint64)
        idx = np.array([[row_of.get(int(v), len(row_of)) for v in line] for line in u])
        pooled = rows[idx] * weights[:, t["fields"], None]
        feeds[t["pooled_input"]] = pooled.reshape(len(y), -1).astype(np.float32)
    prob, names = serve(np, ort, f, lambda names: {n: feeds[n] for n in names})
    got = auc(np, prob, y)
    h.log("ctr, tables served from outside (%s): inputs %s; AUC %.4f, the chief's %.4f" %
          (", ".join("%s %d rows" % (t["name"], t["rows"]) for t in manifest["tables"]), names, got, r["test_auc"]))
    assert round(got, 4) == round(r["test_auc"], 4), (got, r["test_auc"])
    # exported again into the same directory with the tables inline: no file of the first is left
    p = export(None, path, out, "--state-dir", state_dir(wd, "ctr"))
    assert p.returncode == 0, p.stderr
    left = sorted(os.listdir(out)) + sorted(os.listdir(os.path.join(out, "tables")))
    assert left == ["model.onnx", "tables"], left


def check_external_data(wd, np, onnx, ort, path, r, test):
    """The tables' rows as ONNX external data (model.onnx.data), as for a model over 2 GiB."""
    out = wd.file("ctr-external-data")
    p = export(None, path, out, "--state-dir", state_dir(wd, "ctr"), "--external-data")
    assert p.returncode == 0, p.stderr
    f, data = os.path.join(out, "model.onnx"), os.path.join(out, "model.onnx.data")
    onnx.checker.check_model(f, full_check=True)
    m = onnx.load(f, load_external_data=False)
    ext = [t.name for t in m.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert "emb/deep/table" in ext, ext
    dense, ids, weights, y = test
    prob, _ = serve(np, ort, f, lambda names: {"dense": dense, "ids": ids, "weights": weights})
    got = auc(np, prob, y)
    h.log("ctr with external data: model.onnx %d bytes, model.onnx.data %d bytes (%s); AUC %.4f, the chief's %.4f" %
          (os.path.getsize(f), os.path.getsize(data), ", ".join(ext), got, r["test_auc"]))
    assert round(got, 4) == round(r["test_auc"], 4), (got, r["test_auc"])
    p = export(None, path, out, "--state-dir", state_dir(wd, "ctr"))
    assert p.returncode == 0 and os.listdir(out) == ["model.onnx"], (p.stderr, os.listdir(out))


def check_libsvm(wd, np, onnx, ort):
    """LIBSVM: one field of many ids, each weighted by its value (sum) or all alike (mean): ids and weights
    (batch, 1, ids_per_field), padded with weight 0."""
    out = wd.file("svm")
    g = h.Proc(wd, "gen-svm", [h.BIN["psfleet"], "gen-data", "--format", "libsvm", "--rows", "20000", "--out",
                               out + ".train", "--test-rows", "2000", "--test-out", out + ".test", "--seed", "5"])
    assert g.wait(60) == 0, g.stderr()
    ids, weights, y = serving.libsvm_inputs(np, out + ".test")
    for pooling in ("sum", "mean"):
        name = "svm" + pooling
        base = {"model": {"input": [0], "head": "logistic", "layers": [{"type": "dense", "units": 1}],
                          "embeddings": [{"name": "lr", "fields": "all", "dim": 2, "vocab": 1000003,
                                          "pooling": pooling}]},
                "data": {"dir": wd.path, "format": "libsvm", "train_files": ["svm.train"], "test_files": ["svm.test"]},
                "training": {"batch_size": 64, "optimizer": "adagrad", "learning_rate": 0.1,
                             "sparse_learning_rate": 0.5}}
        path, r = train(wd, name, base, wd.path)
        f = os.path.join(wd.file(name + "-export"), "model.onnx")
        p = export(None, path, os.path.dirname(f), "--state-dir", state_dir(wd, name))
        assert p.returncode == 0, p.stderr
        onnx.checker.check_model(onnx.load(f), full_check=True)
        prob, names = serve(np, ort, f, lambda names: {"ids": ids, "weights": weights})
        got = auc(np, prob, y)
        h.log("%s: inputs %s, ids (%d, 1, %d); ONNX Runtime's test AUC %.4f, the chief's %.4f" %
              (name, names, ids.shape[0], ids.shape[2], got, r["test_auc"]))
        assert round(got, 4) == round(r["test_auc"], 4), (name, got, r["test_auc"])


def test():
    pyenv.ensure()
    import numpy as np
    import onnx
    import onnxruntime as ort
    import safetensors.numpy as st
    h.require_built("psfleet", "psd", "workerd", "chiefd")
    wd = h.Workdir()
    data = gen_split(wd, TRAIN_ROWS, TEST_ROWS)
    test_split = serving.criteo_inputs(np, os.path.join(data, "test.tsv.gz"))

    with open(os.path.join(EXAMPLES, "ctr-widedeep.json")) as f:
        example = json.load(f)
    # raw ids: an id never trained is the zero row in the export, its initial value in psfleet's lookups,
    # the same with init_stddev 0 (docs/serving.md)
    ctr = json.loads(json.dumps(example))
    for e in ctr["model"]["embeddings"]:
        e["init_stddev"] = 0
    path, r, _ = check(wd, np, onnx, ort, "ctr", ctr, data, test_split)
    check_external(wd, np, onnx, ort, st, path, r, test_split)
    check_external_data(wd, np, onnx, ort, path, r, test_split)
    # refused, nothing written: a checkpoint without one of the model's tables
    other = json.loads(json.dumps(ctr))
    other["job"] = "ctr"
    other["model"]["embeddings"][1]["name"] = "deep2"
    other_path, _ = h.make_job(wd, "other.json", base=other)
    bad = wd.file("bad-export")
    p = export(None, other_path, bad, "--state-dir", state_dir(wd, "ctr"))
    # the records' checkpoint is read as a restore reads it: its table the model lacks is named
    assert p.returncode == 65 and '"emb/deep/ids" is not a variable' in p.stderr and not os.path.exists(bad), (
        p.returncode, p.stderr)
    h.log("refused: %s" % p.stderr.strip().splitlines()[-1])

    hashed = json.loads(json.dumps(example))
    hashed["model"]["embeddings"][1].update({"vocab": 5000, "pooling": "mean"})
    check(wd, np, onnx, ort, "ctrhash", hashed, data, test_split)

    check_libsvm(wd, np, onnx, ort)

    if subprocess.run([TORCH_PYTHON, "-c", "import torch"], capture_output=True).returncode != 0:
        h.log("SKIPPED DLRM, DeepFM, DCN-v2: Debian's python3-torch is not installed (export.py defines them)")
        return
    # both kinds of lookup in the graph models: hashed (every row exported) and raw ids from zero
    for name, change in (("dlrm", {"vocab": 10000}), ("deepfm", {"init_stddev": 0}), ("dcnv2", {"vocab": 20000})):
        p = subprocess.run([TORCH_PYTHON, os.path.join(EXAMPLES, "models", "export.py"), "--out", wd.path, "--model",
                            name], env=h.child_env(), capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        with open(os.path.join(EXAMPLES, "models", name + ".json")) as f:
            base = json.load(f)
        base["model"]["onnx"] = os.path.join(wd.path, name + ".onnx")
        for e in base["model"]["embeddings"]:
            e.update(change)
        check(wd, np, onnx, ort, name, base, data, test_split)


if __name__ == "__main__":
    h.main(test)

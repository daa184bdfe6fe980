"""psfleet export against ONNX Runtime: the demo MLP, the CNN (layer lists) and the ResNet (a graph
model from ONNX, batch normalization and all) trained through real daemons (1 ps + 1 worker, a short
run), exported offline from the chief's records; onnx.checker accepts each file; ONNX Runtime's
predictions on the whole Fashion-MNIST test split give the test accuracy the chief reported, to 4
decimals; its logits on the first 1,000 test images equal psfleet's graph engine's on the same file
(onnx_run) within 1e-5 relative to their scale. And what export refuses, writing nothing: a step that
has no checkpoint (65), a checkpoint cut short (65), a checkpoint of another model (65).

onnx and onnxruntime come from PyPI, in <build>/pyenv (pyenv.py); the ResNet needs Debian's
python3-torch (export.py) and is skipped, saying so, without it. Skips (77) without Fashion-MNIST or
PyPI. About a minute.
"""
import gzip
import json
import os
import shutil
import subprocess

import harness as h
import pyenv

TORCH_PYTHON = "/usr/bin/python3"
ONNX_RUN = os.path.join(h.BUILD_DIR, "tests", "integration", "onnx_run")
EXAMPLES = os.path.join(h.SOURCE_DIR, "examples")
DATA = "/usr/share/datasets/fashion-mnist"


def test_split(np):
    with gzip.open(os.path.join(DATA, "t10k-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).astype(np.float32) / 255.0
    with gzip.open(os.path.join(DATA, "t10k-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    return x.reshape(len(y), -1), y


def export(wd, job_path, out, *args):
    return subprocess.run([h.BIN["psfleet"], "export", "--job", job_path, "--out", out] + list(args),
                          capture_output=True, text=True, timeout=120, env=h.child_env())


def state_dir(wd, job):
    """The directory that holds the chief's records of job (under the test's directory)."""
    for root, _, files in os.walk(wd.path):
        if "chief.db" in files and os.path.basename(root) == job:
            return os.path.dirname(root)
    raise AssertionError("no chief.db of job %s under %s" % (job, wd.path))


def check_model(wd, name, base, steps, np, onnx, ort, x, y):
    path, job = h.make_job(wd, name=name + ".json", n_ps=1, n_workers=1, base=base,
                           training={"max_steps": steps, "threads": 1})
    r = h.local_result(wd, path, args=["--keep-state"], name=name, timeout=600)
    out = wd.file(name + "-export")
    p = export(wd, path, out, "--state-dir", state_dir(wd, job["job"]))
    assert p.returncode == 0, "%s: export exit %d:\n%s" % (name, p.returncode, p.stderr)
    h.log(p.stdout.strip())
    f = os.path.join(out, "model.onnx")
    onnx.checker.check_model(onnx.load(f), full_check=True)
    s = ort.InferenceSession(f, providers=["CPUExecutionProvider"])
    inp = s.get_inputs()[0]
    assert [o.name for o in s.get_outputs()] == ["logits" if name != "resnet" else s.get_outputs()[0].name,
                                                 "probabilities"], s.get_outputs()
    xs = x.reshape([len(y)] + [d for d in inp.shape[1:]])
    logits, probs = s.run(None, {inp.name: xs})
    acc = float((probs.argmax(1) == y).mean())
    h.log("%s: ONNX Runtime test accuracy %.4f, the chief's %.4f" % (name, acc, r["test_accuracy"]))
    assert round(acc, 4) == round(r["test_accuracy"], 4), (acc, r)
    # the same file through psfleet's graph engine
    n = 1000
    xin, xout = wd.file(name + "-x.raw"), wd.file(name + "-logits.raw")
    xs[:n].astype("<f4").tofile(xin)
    out_name = s.get_outputs()[0].name
    q = subprocess.run([ONNX_RUN, f, "--batch", str(n), "--in", "%s=%s" % (inp.name, xin), "--out",
                        "%s=%s" % (out_name, xout)], capture_output=True, text=True, timeout=120)
    assert q.returncode == 0, q.stderr
    ours = np.fromfile(xout, dtype="<f4").reshape(logits[:n].shape)
    scale = max(1.0, float(np.abs(logits[:n]).max()))
    diff = float(np.abs(ours - logits[:n]).max()) / scale
    h.log("%s: logits, psfleet's graph engine against ONNX Runtime: max abs %.3g of scale %.3g" % (name, diff * scale,
                                                                                                  scale))
    assert diff <= 1e-5, diff
    return path, job, out


def test():
    pyenv.ensure()
    import numpy as np
    import onnx
    import onnxruntime as ort
    if not os.path.isfile(os.path.join(DATA, "t10k-images-idx3-ubyte.gz")):
        h.skip("Fashion-MNIST is not in %s (Debian's dataset-fashion-mnist)" % DATA)
    h.require_built("psfleet", "psd", "workerd", "chiefd")
    if not os.access(ONNX_RUN, os.X_OK):
        h.skip("onnx_run is not built (%s)" % ONNX_RUN)
    x, y = test_split(np)
    wd = h.Workdir()
    with open(os.path.join(EXAMPLES, "fmnist-mlp.json")) as f:
        mlp = json.load(f)
    path, job, out = check_model(wd, "mlp", mlp, 300, np, onnx, ort, x, y)

    # refusals, nothing written
    bad = wd.file("bad-export")
    p = export(wd, path, bad, "--state-dir", state_dir(wd, job["job"]), "--step", "123456")
    assert p.returncode == 65 and "123456" in p.stderr and not os.path.exists(os.path.join(bad, "model.onnx")), \
        (p.returncode, p.stderr)
    ck = [os.path.join(rt, fn) for rt, _, fs in os.walk(wd.path) for fn in fs if fn.endswith(".safetensors")][0]
    cut = wd.file("cut.safetensors")
    with open(ck, "rb") as a, open(cut, "wb") as b:
        b.write(a.read()[:-100])
    p = export(wd, path, bad, "--checkpoint", cut)
    assert p.returncode == 65 and "cut.safetensors" in p.stderr and not os.path.exists(os.path.join(bad, "model.onnx")), \
        (p.returncode, p.stderr)
    with open(os.path.join(EXAMPLES, "ctr-widedeep.json")) as f:
        ctr = json.load(f)
    ctr_path, _ = h.make_job(wd, name="ctr.json", base=ctr)
    p = export(wd, ctr_path, bad, "--checkpoint", ck)
    assert p.returncode == 65 and "dense0/kernel" in p.stderr and not os.path.exists(os.path.join(bad, "model.onnx")), \
        (p.returncode, p.stderr)
    h.log("refused: a missing step, a cut checkpoint, another model's checkpoint; nothing written")

    with open(os.path.join(EXAMPLES, "fmnist-cnn.json")) as f:
        cnn = json.load(f)
    check_model(wd, "cnn", cnn, 100, np, onnx, ort, x, y)

    if subprocess.run([TORCH_PYTHON, "-c", "import torch"], capture_output=True).returncode != 0:
        h.log("SKIPPED the ResNet: Debian's python3-torch is not installed (export.py defines it in PyTorch)")
        return
    p = subprocess.run([TORCH_PYTHON, os.path.join(EXAMPLES, "models", "export.py"), "--out", wd.path, "--model",
                        "resnet", "--no-fuse"], env=h.child_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    with open(os.path.join(EXAMPLES, "models", "resnet.json")) as f:
        resnet = json.load(f)
    check_model(wd, "resnet", resnet, 60, np, onnx, ort, x, y)


if __name__ == "__main__":
    h.main(test)

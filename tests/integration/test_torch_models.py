"""The example models (examples/models/export.py: DLRM, DeepFM, DCN-v2, a small ResNet) as PyTorch
writes them with torch.onnx.export, run through psfleet's graph engine (onnx_run) and held to torch's
own outputs.

For each model, exported at test time into a scratch directory:
- eval mode (as exported by default, where the exporter fuses batch normalization into the convolutions,
  and with --no-fuse, where BatchNormalization stays in its inference form): the model loads
  (`onnx_run --check`, the inputs' batch symbolic), and its forward on a seeded random batch of 4 is
  torch's eval-mode output within 1e-5 * max(1, max|torch|);
- training mode (TrainingMode.TRAINING: Dropout and BatchNormalization in their training form): the model
  loads; where it has no Dropout (dlrm, resnet) its forward with --training is torch's training-mode output
  (batch normalization over the batch's statistics) within the same bound; where it has no batch
  normalization (dlrm, deepfm, dcnv2) its forward without --training is torch's eval-mode output (Dropout
  passes through); where it has Dropout, a forward with --training is finite, differs from the eval-mode
  output, and is the same again with the same seed and another with another seed.

Skips (77) only when Debian's python3-torch is missing. Needs onnx_run built (<build>/tests/integration).
"""
import json
import math
import os
import struct
import subprocess
import time

import harness as h

TORCH_PYTHON = "/usr/bin/python3"   # Debian's python3-torch is for Debian's interpreter
EXPORT = os.path.join(h.SOURCE_DIR, "examples", "models", "export.py")
ONNX_RUN = os.path.join(h.BUILD_DIR, "tests", "integration", "onnx_run")
MODELS = ["dlrm", "deepfm", "dcnv2", "resnet"]
TOL = 1e-5   # times max(1, max|torch|)


def read_f32(path):
    with open(path, "rb") as f:
        data = f.read()
    return list(struct.unpack("<%df" % (len(data) // 4), data))


def export(out, *args):
    argv = [TORCH_PYTHON, EXPORT, "--out", out] + list(args)
    t0 = time.monotonic()
    p = subprocess.run(argv, env=h.child_env(), capture_output=True, text=True, timeout=600)
    h.log("export.py", " ".join(args) or "(eval)", "->", p.returncode, "in %.1f s" % (time.monotonic() - t0))
    assert p.returncode == 0, "%s: exit %d:\n%s%s" % (argv, p.returncode, p.stdout, p.stderr[-4000:])
    for m in MODELS:
        assert os.path.isfile(os.path.join(out, m + ".onnx")), (out, m)


def onnx_run(model, *args, expect=0):
    argv = [ONNX_RUN, model] + [str(a) for a in args]
    p = subprocess.run(argv, env=h.child_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == expect, "%s: exit %d, expected %d:\n%s%s" % (" ".join(argv), p.returncode, expect,
                                                                       p.stdout, p.stderr)
    return json.loads(p.stdout) if p.returncode == 0 else None


def check(model, entry):
    """onnx_run --check: loads, with the manifest's inputs (batch symbolic); returns its JSON."""
    j = onnx_run(model, "--check")
    want = {k: [-1] + v["shape"][1:] for k, v in entry["inputs"].items()}
    assert j["inputs"] == want, (model, j, want)
    return j


def forward(wd, model, ref, entry, tag, *extra):
    """Runs model on the reference batch; returns its output's values."""
    (oname, o), = entry["outputs"].items()
    out = wd.file("%s.%s.out" % (os.path.basename(model), tag))
    args = ["--batch", len_batch(entry)]
    for name, inp in entry["inputs"].items():
        args += ["--in", "%s=%s" % (name, os.path.join(ref, inp["file"]))]
    args += ["--out", "%s=%s" % (oname, out)] + list(extra)
    j = onnx_run(model, *args)
    assert j["outputs"][oname]["shape"] == o["shape"], (model, j, o)
    return read_f32(out)


def len_batch(entry):
    return next(iter(entry["inputs"].values()))["shape"][0]


def compare(what, got, want):
    """Max |got - want| within TOL * max(1, max|want|); returns it."""
    assert len(got) == len(want), (what, len(got), len(want))
    assert all(math.isfinite(v) for v in got), (what, got)
    top = max(abs(v) for v in want)
    scale = max(1.0, top)
    diff = max(abs(a - b) for a, b in zip(got, want))
    h.log("%-31s max|diff| %.3g (max|torch| %.3g, bound %.3g)" % (what, diff, top, TOL * scale))
    assert diff <= TOL * scale, "%s: max|diff| %.3g > %.3g (%g * %.3g)\n engine %s\n torch  %s" % (
        what, diff, TOL * scale, TOL, scale, got, want)
    return diff


def test():
    if not os.access(TORCH_PYTHON, os.X_OK):
        h.skip("%s is missing, so Debian's python3-torch is not installed" % TORCH_PYTHON)
    p = subprocess.run([TORCH_PYTHON, "-c", "import torch, torch.onnx; print(torch.__version__)"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        h.skip("PyTorch does not import in %s (is Debian's python3-torch installed?): %s"
               % (TORCH_PYTHON, (p.stderr.strip().splitlines() or ["?"])[-1]))
    h.log("torch", p.stdout.strip())
    assert os.access(ONNX_RUN, os.X_OK), "onnx_run is not built: " + ONNX_RUN
    wd = h.Workdir()
    ref, d_eval, d_nofuse, d_train = (wd.file(n) for n in ("ref", "eval", "nofuse", "train"))
    export(d_eval, "--reference", ref)
    export(d_nofuse, "--no-fuse")
    export(d_train, "--training")
    with open(os.path.join(ref, "reference.json")) as f:
        manifest = json.load(f)
    assert manifest["batch"] == 4 and sorted(manifest["models"]) == sorted(MODELS), manifest

    for name in MODELS:
        e = manifest["models"][name]
        (oname, o), = e["outputs"].items()
        want_eval = read_f32(os.path.join(ref, o["eval"]))
        m_eval, m_nofuse, m_train = (os.path.join(d, name + ".onnx") for d in (d_eval, d_nofuse, d_train))

        j = check(m_eval, e)
        h.log("%s: torch %d parameters; eval graph %d nodes, %d parameters" % (name, e["params"], j["nodes"],
                                                                                 j["params"]))
        if not e["batchnorm"]:   # every float initializer is a trained weight
            assert j["params"] == e["params"], (name, j, e["params"])
        compare(name + " eval", forward(wd, m_eval, ref, e, "eval"), want_eval)

        j = check(m_nofuse, e)
        h.log("%s: eval graph, not fused: %d nodes, %d parameters" % (name, j["nodes"], j["params"]))
        compare(name + " eval, not fused", forward(wd, m_nofuse, ref, e, "nofuse"), want_eval)

        j = check(m_train, e)
        h.log("%s: training graph loads: %d nodes, %d parameters" % (name, j["nodes"], j["params"]))
        if o["train"]:
            compare(name + " training", forward(wd, m_train, ref, e, "train", "--training", "--seed", 1),
                    read_f32(os.path.join(ref, o["train"])))
        if not e["batchnorm"]:
            compare(name + " training graph, eval run", forward(wd, m_train, ref, e, "train-eval"), want_eval)
        if e["dropout"]:
            a = forward(wd, m_train, ref, e, "drop1", "--training", "--seed", 1)
            b = forward(wd, m_train, ref, e, "drop1b", "--training", "--seed", 1)
            c = forward(wd, m_train, ref, e, "drop2", "--training", "--seed", 2)
            assert all(math.isfinite(v) for v in a + c), (name, a, c)
            assert a == b, "%s: --training --seed 1 twice gave %s and %s" % (name, a, b)
            assert a != c, "%s: seeds 1 and 2 gave the same Dropout masks: %s" % (name, a)
            assert a != want_eval, "%s: Dropout in its training form dropped nothing: %s" % (name, a)
            h.log("%s: Dropout in training form: seeded, and not the identity" % name)


if __name__ == "__main__":
    h.main(test)

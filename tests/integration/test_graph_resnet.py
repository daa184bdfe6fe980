"""The ResNet example (examples/models/resnet.json: residual blocks with batch normalization, from
export.py with --no-fuse, so BatchNormalization stays in the graph) trained through real daemons, 1 ps +
2 workers, for a short run (800 global steps of 64 Fashion-MNIST images): its test accuracy, which the
chief measures in inference form, normalizing by the running statistics the ps holds, must be at least
0.80 (async training on two workers landed between 0.797 and 0.834 after 600 steps, so the run is
longer; with the statistics never updated, inference is at chance: 0.1014 standalone after 600
steps), and the final checkpoint's running statistics must have moved from the file's initial ones toward
the data's (the running variances the workers' moving-average updates made, not the random ones
export.py writes). The full run to >= 0.91 is a benchmark (docs/performance.md, "Graph models").

Skips (77) when Debian's python3-torch or the Fashion-MNIST files are missing. About a minute.
"""
import json
import os
import struct
import subprocess

import harness as h

TORCH_PYTHON = "/usr/bin/python3"
EXPORT = os.path.join(h.SOURCE_DIR, "examples", "models", "export.py")
STEPS = 800


def safetensors(path):
    """name -> list of floats of a safetensors file (F32 tensors only)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__" or t.get("dtype") != "F32":
            continue
        a, b = t["data_offsets"]
        out[name] = list(struct.unpack("<%df" % ((b - a) // 4), data[a:b]))
    return out


def initial_stats(wd):
    """The running variances export.py's ResNet starts from (torch.manual_seed(1)), by parameter name."""
    code = ("import json, sys; sys.path.insert(0, %r); import export; m = export.build('resnet', 1); "
            "print(json.dumps({k: v.flatten().tolist() for k, v in m.state_dict().items() "
            "if k.endswith('running_var')}))" % os.path.dirname(EXPORT))
    p = subprocess.run([TORCH_PYTHON, "-c", code], capture_output=True, text=True, timeout=120, cwd=wd.path)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def test():
    if subprocess.run([TORCH_PYTHON, "-c", "import torch"], capture_output=True).returncode != 0:
        h.skip("Debian's python3-torch is not installed (export.py defines the model in PyTorch)")
    with open(os.path.join(h.SOURCE_DIR, "examples", "models", "resnet.json")) as f:
        base = json.load(f)
    if not os.path.isfile(os.path.join(base["data"]["dir"], "train-images-idx3-ubyte.gz")):
        h.skip("Fashion-MNIST is not in %s (Debian's dataset-fashion-mnist)" % base["data"]["dir"])
    h.require_built("psfleet", "psd", "workerd", "chiefd")
    wd = h.Workdir()
    p = subprocess.run([TORCH_PYTHON, EXPORT, "--out", wd.path, "--model", "resnet", "--no-fuse"],
                       env=h.child_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    path, job = h.make_job(wd, name="resnet.json", n_ps=1, n_workers=2, base=base,
                           training={"max_steps": STEPS})
    r = h.local_result(wd, path, args=["--keep-state"], name="resnet", timeout=900)
    assert r["mode"] == "distributed" and r["workers"] == 2 and r["global_step"] >= STEPS, r
    h.log("resnet: test accuracy %.4f after %d steps, %.0f examples/s" % (r["test_accuracy"], r["global_step"],
                                                                        r["examples_per_s"]))
    assert r["test_accuracy"] >= 0.80, r

    # the final checkpoint's running variances against the file's
    ckpts = []
    for root, _, files in os.walk(wd.path):
        ckpts += [os.path.join(root, f) for f in files if f.startswith("ckpt-") and f.endswith(".safetensors")]
    assert ckpts, "no checkpoint under %s" % wd.path
    final = safetensors(sorted(ckpts)[-1])
    init = initial_stats(wd)
    assert init, "export.py's ResNet has no running variances"
    moved = 0
    for name, v0 in init.items():
        assert name in final, "%s is not in the checkpoint (%s)" % (name, sorted(final)[:8])
        v1 = final[name]
        assert len(v1) == len(v0) and all(x > 0 for x in v1), (name, v1[:4])
        moved += any(abs(a - b) > 1e-3 * max(1.0, abs(b)) for a, b in zip(v1, v0))
    h.log("running variances moved in %d of %d BatchNormalization nodes" % (moved, len(init)))
    assert moved == len(init), "only %d of %d running variances moved" % (moved, len(init))


if __name__ == "__main__":
    h.main(test)

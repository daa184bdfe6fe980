#!/usr/bin/python3
"""The ResNet example trained by psfleet standalone and by PyTorch on one thread each, side by side in
one run: training examples/s (docs/performance.md, "Graph models").

    resnet_speed.py [--build BUILD] [--steps N] [--threads T] [--rounds R]

Both train examples/models/export.py's ResNet (batch normalization kept: --no-fuse) on Fashion-MNIST
(Debian's dataset-fashion-mnist), batch 64, Adam 1e-3, for N steps; psfleet through `psfleet local
--standalone` on examples/models/resnet.json (its examples_per_s: the training steps' own, not the
evaluation), PyTorch with torch.set_num_threads(T). The two alternate R times; one JSON line per round
and one with the best of each: {"psfleet_examples_per_s", "torch_examples_per_s", "ratio"}.
Needs Debian's python3-torch and numpy (run it with /usr/bin/python3).
"""
import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
DATA = "/usr/share/datasets/fashion-mnist"


def idx(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def torch_round(model, x, y, steps, batch):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    lossf = torch.nn.CrossEntropyLoss()
    model.train()
    t0 = None
    for s in range(steps + 3):
        if s == 3:
            t0 = time.monotonic()
        b = (s * batch) % (len(y) - batch)
        opt.zero_grad()
        lossf(model(x[b:b + batch]), y[b:b + batch]).backward()
        opt.step()
    return steps * batch / (time.monotonic() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(SOURCE, "build"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(SOURCE, "examples", "models"))
    import export   # noqa: E402
    wd = tempfile.mkdtemp(prefix="resnet-speed-")
    subprocess.run([sys.executable, os.path.join(SOURCE, "examples", "models", "export.py"), "--out", wd, "--model",
                    "resnet", "--no-fuse"], check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(SOURCE, "examples", "models", "resnet.json")) as f:
        job = json.load(f)
    job["training"].update({"threads": a.threads, "max_steps": a.steps, "lr_schedule": "constant"})
    for k in ("lr_decay_rate", "lr_decay_steps"):
        job["training"].pop(k, None)
    job_p = os.path.join(wd, "resnet.json")
    with open(job_p, "w") as f:
        json.dump(job, f)
    torch.set_num_threads(a.threads)
    x = torch.from_numpy(idx(os.path.join(DATA, "train-images-idx3-ubyte.gz"), 16).astype(np.float32) / 255.0)
    x = x.reshape(-1, 1, 28, 28)
    y = torch.from_numpy(idx(os.path.join(DATA, "train-labels-idx1-ubyte.gz"), 8).astype(np.int64))
    best_p = best_t = 0.0
    psfleet = os.path.join(a.build, "services", "cli", "psfleet")
    for r in range(a.rounds):
        p = subprocess.run([psfleet, "local", job_p, "--standalone", "--quiet"], check=True, capture_output=True,
                           text=True, env=dict(os.environ, OPENBLAS_NUM_THREADS=str(a.threads)))
        ours = json.loads(p.stdout.strip().splitlines()[-1])["examples_per_s"]
        theirs = torch_round(export.build("resnet", 1), x, y, a.steps, job["training"]["batch_size"])
        best_p, best_t = max(best_p, ours), max(best_t, theirs)
        print(json.dumps({"round": r, "psfleet_examples_per_s": round(ours, 1),
                          "torch_examples_per_s": round(theirs, 1), "ratio": round(ours / theirs, 3)}), flush=True)
    print(json.dumps({"best": True, "threads": a.threads, "steps": a.steps, "psfleet_examples_per_s": round(best_p, 1),
                      "torch_examples_per_s": round(best_t, 1), "ratio": round(best_p / best_t, 3)}))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""PyTorch on one GPU with examples/fmnist-cnn.json's CNN, batch and optimizer, on random data as
tests/bench/bench_cnn.c uses: forward + backward + Momentum step, examples/s. One JSON line per mode:

  fp32            data resident on the GPU, no per-step sync; TF32 off (psfleet's default math)
  fp32_host_fed   each batch copied from host memory and the loss read back every step, as psfleet's
                  step does (its parameters and gradients also cross the bus: see docs/gpu.md)
  tf32            PyTorch's own default: TF32 allowed in cuDNN convolutions
"""
import argparse
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def cnn():
    return nn.Sequential(nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(7 * 7 * 64, 1024), nn.ReLU(), nn.Linear(1024, 10))


def run(mode, batch, steps, warm):
    tf32 = mode == "tf32"
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    torch.manual_seed(1)
    m = cnn().to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    xh = torch.rand(batch, 1, 28, 28)
    yh = torch.arange(batch) % 10
    x, y = xh.to(dev), yh.to(dev)
    t0 = None
    for s in range(warm + steps):
        if s == warm:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        if mode == "fp32_host_fed":
            x, y = xh.to(dev), yh.to(dev)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        if mode == "fp32_host_fed":
            loss.item()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    return {"bench": "cnn", "framework": "pytorch-" + torch.__version__, "mode": mode,
            "device": torch.cuda.get_device_name(0), "batch": batch, "steps": steps,
            "examples_per_s": round(steps * batch / dt, 1), "ms_per_step": round(dt * 1e3 / steps, 3),
            "loss_last": round(loss.item(), 4)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warm", type=int, default=20)
    p.add_argument("--modes", default="fp32,fp32_host_fed,tf32")
    a = p.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"bench": "cnn", "framework": "pytorch", "error": "no CUDA device"}))
        return 77
    for mode in a.modes.split(","):
        print(json.dumps(run(mode, a.batch, a.steps, a.warm)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

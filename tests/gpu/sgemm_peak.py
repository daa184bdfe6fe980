#!/usr/bin/env python3
"""cuBLAS SGEMM's peak on this GPU, the ceiling psfleet's GPU step is held to (docs/gpu.md): square fp32
products through PyTorch (which calls cuBLAS), TF32 off as in psfleet's default math, then with TF32 for
reference. Each figure is the best of 3 timed rounds of 10 products after 3 warm-ups, timed with CUDA
events. One JSON line per size and mode."""
import json

import torch


def peak(n, tf32):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    c = torch.empty(n, n, device="cuda")
    for _ in range(3):
        torch.mm(a, b, out=c)
    best = 0.0
    for _ in range(3):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(10):
            torch.mm(a, b, out=c)
        e1.record()
        e1.synchronize()
        best = max(best, 10 * 2.0 * n ** 3 / (e0.elapsed_time(e1) / 1e3) / 1e12)
    return best


for tf32 in (False, True):
    for n in (2048, 4096, 8192):
        print(json.dumps({"bench": "sgemm_peak", "n": n, "math": "tf32" if tf32 else "fp32",
                          "tflop_per_s": round(peak(n, tf32), 2), "gpu": torch.cuda.get_device_name(0)}),
              flush=True)

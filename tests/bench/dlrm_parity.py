#!/usr/bin/python3
"""DLRM trained by PyTorch and by psfleet standalone, side by side, on the same rows: the test AUC each
reaches and the examples/s each trains at, on the same threads (docs/performance.md, "Graph models").

    dlrm_parity.py --build BUILD [--rows N] [--test-rows M] [--threads T] [--out DIR]

Both train the architecture of examples/models/export.py's DLRM from the same initial dense weights
(the exported file's initializers, torch.manual_seed(1)), one epoch over the same `psfleet gen-data`
rows in the same order, batch 256, Adagrad (learning rate 0.1 for the dense variables, 2.0 for the
embedding rows, initial accumulator 0.1, epsilon 1e-7), the job file examples/models/dlrm.json. The
rows are read as psfleet reads them (records.h): a count x becomes log1p(x) (0 when empty or not
positive), a token its 64-bit hash of the field and its bytes (FNV-1a, then splitmix64), an empty field
no id (a zero vector). PyTorch's table holds a row per id seen (rows drawn truncated-normal with stddev
1/sqrt(16), as the ps draws them), looked up with sparse gradients; psfleet's lives on its sparse table.

Prints one JSON line: {"torch": {"auc", "examples_per_s", "train_s"}, "psfleet": {...}, "auc_diff",
"speed_ratio"}. Needs Debian's python3-torch and numpy (run it with /usr/bin/python3).
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
N_DENSE, N_FIELDS, DIM, BATCH = 13, 26, 16, 256
M64 = (1 << 64) - 1


def hash_tokens(tokens, field):
    """records_hash over a column of tokens (bytes; b"" for none): FNV-1a, xor the field's multiple,
    splitmix64. Returns uint64 hashes (0 where empty) and the mask of non-empty tokens."""
    n = len(tokens)
    width = max((len(t) for t in tokens), default=0)
    buf = np.zeros((n, max(width, 1)), dtype=np.uint8)
    lens = np.array([len(t) for t in tokens], dtype=np.int64)
    for i, t in enumerate(tokens):
        buf[i, :len(t)] = np.frombuffer(t, dtype=np.uint8)
    with np.errstate(over="ignore"):
        h = np.full(n, 0xcbf29ce484222325, dtype=np.uint64)
        for j in range(width):
            live = lens > j
            h[live] = (h[live] ^ buf[live, j].astype(np.uint64)) * np.uint64(0x100000001b3)
        s = h ^ np.uint64((field * 0x9e3779b97f4a7c15) & M64)
        z = s + np.uint64(0x9e3779b97f4a7c15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xbf58476d1ce4e5b9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94d049bb133111eb)
        z = z ^ (z >> np.uint64(31))
    return z, lens > 0


def read_rows(path):
    labels, dense, cols = [], [], [[] for _ in range(N_FIELDS)]
    with gzip.open(path, "rb") as f:
        for line in f:
            c = line.rstrip(b"\n").split(b"\t")
            labels.append(float(c[0]))
            d = []
            for j in range(N_DENSE):
                v = int(c[1 + j]) if c[1 + j] else 0
                d.append(np.log1p(np.float32(v)) if v > 0 else 0.0)
            dense.append(d)
            for f_ in range(N_FIELDS):
                cols[f_].append(c[1 + N_DENSE + f_])
    ids = np.zeros((len(labels), N_FIELDS), dtype=np.uint64)
    mask = np.zeros((len(labels), N_FIELDS), dtype=bool)
    for f_ in range(N_FIELDS):
        ids[:, f_], mask[:, f_] = hash_tokens(cols[f_], f_)
    return np.array(labels, dtype=np.float32), np.array(dense, dtype=np.float32), ids, mask


def auc(p, y):
    order = np.argsort(p, kind="mergesort")
    ranks = np.empty(len(p))
    ranks[order] = np.arange(1, len(p) + 1)
    # ties share their mean rank
    ps = p[order]
    i = 0
    while i < len(ps):
        j = i
        while j + 1 < len(ps) and ps[j + 1] == ps[i]:
            j += 1
        if j > i:
            ranks[order[i:j + 1]] = (i + j + 2) / 2.0
        i = j + 1
    pos = y > 0.5
    n_pos, n_neg = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def torch_run(onnx_dir, train, test, threads):
    sys.path.insert(0, os.path.join(SOURCE, "examples", "models"))
    import export   # noqa: E402: examples/models/export.py, the architecture
    torch.set_num_threads(threads)
    model = export.build("dlrm", 1)
    y, x, ids, mask = train
    ty, tx, tids, tmask = test
    # a row per id seen, index 0 the empty field's zero vector
    uniq = np.unique(np.concatenate([ids[mask], tids[tmask]]))
    index = lambda a, m: np.where(m, np.searchsorted(uniq, a) + 1, 0).astype(np.int64)
    emb = torch.nn.Embedding(len(uniq) + 1, DIM, padding_idx=0, sparse=True)
    with torch.no_grad():
        torch.nn.init.trunc_normal_(emb.weight, std=DIM ** -0.5, a=-2 * DIM ** -0.5, b=2 * DIM ** -0.5)
        emb.weight[0].zero_()
    model.emb = emb
    dense_params = [p for n, p in model.named_parameters() if not n.startswith("emb.")]
    opt_d = torch.optim.Adagrad(dense_params, lr=0.1, initial_accumulator_value=0.1, eps=1e-7)
    opt_s = torch.optim.Adagrad(emb.parameters(), lr=2.0, initial_accumulator_value=0.1, eps=1e-7)
    lossf = torch.nn.BCEWithLogitsLoss()
    xi, ii, yi = torch.from_numpy(x), torch.from_numpy(index(ids, mask)), torch.from_numpy(y)
    t0 = time.monotonic()
    n = 0
    model.train()
    for b in range(0, len(y) - BATCH + 1, BATCH):
        opt_d.zero_grad()
        opt_s.zero_grad()
        out = model(xi[b:b + BATCH], ii[b:b + BATCH])
        lossf(out[:, 0], yi[b:b + BATCH]).backward()
        opt_d.step()
        opt_s.step()
        n += BATCH
    train_s = time.monotonic() - t0
    model.eval()
    with torch.no_grad():
        p = torch.sigmoid(model(torch.from_numpy(tx), torch.from_numpy(index(tids, tmask)))[:, 0]).numpy()
    return {"auc": auc(p, ty), "examples_per_s": n / train_s, "train_s": train_s, "steps": n // BATCH}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(SOURCE, "build"))
    ap.add_argument("--rows", type=int, default=1000000)
    ap.add_argument("--test-rows", type=int, default=20000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    psfleet = os.path.join(a.build, "services", "cli", "psfleet")
    wd = a.out or tempfile.mkdtemp(prefix="dlrm-parity-")
    os.makedirs(wd, exist_ok=True)
    subprocess.run([sys.executable, os.path.join(SOURCE, "examples", "models", "export.py"), "--out", wd,
                    "--model", "dlrm"], check=True, stdout=subprocess.DEVNULL)
    train_p, test_p = os.path.join(wd, "train.tsv.gz"), os.path.join(wd, "test.tsv.gz")
    subprocess.run([psfleet, "gen-data", "--rows", str(a.rows), "--out", train_p, "--test-rows",
                    str(a.test_rows), "--test-out", test_p, "--vocab", "1000"], check=True, stdout=subprocess.DEVNULL)
    steps = a.rows // BATCH
    with open(os.path.join(SOURCE, "examples", "models", "dlrm.json")) as f:
        job = json.load(f)
    job["data"]["dir"] = wd
    job["data"]["shuffle_buffer"] = 0
    job["training"].update({"threads": a.threads, "max_steps": steps})
    job_p = os.path.join(wd, "dlrm.json")
    with open(job_p, "w") as f:
        json.dump(job, f)
    p = subprocess.run([psfleet, "local", job_p, "--standalone", "--quiet"], check=True, capture_output=True,
                       text=True, env=dict(os.environ, OPENBLAS_NUM_THREADS=str(a.threads)))
    ours = json.loads(p.stdout.strip().splitlines()[-1])
    train, test = read_rows(train_p), read_rows(test_p)
    theirs = torch_run(wd, train, test, a.threads)
    r = {"rows": a.rows, "threads": a.threads,
         "torch": theirs,
         "psfleet": {"auc": ours.get("test_auc"), "examples_per_s": ours["examples_per_s"], "wall_s": ours["wall_s"],
                     "steps": ours["global_step"]}}
    r["auc_diff"] = r["psfleet"]["auc"] - theirs["auc"]
    r["speed_ratio"] = r["psfleet"]["examples_per_s"] / theirs["examples_per_s"]
    print(json.dumps(r))


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""The PyTorch anchor of the CTR benchmark (tests/bench/bench_ctr.py): the model of a psfleet job file
with embeddings (model.embeddings, layers, head logistic), as PyTorch would be written for it: one
nn.EmbeddingBag (mode sum, sparse gradients) per table, ids hashed as psfleet hashes them (the same
reader: records_hash of each field's token, mod vocab), the dense features log1p'd, an MLP, BCE with
logits; Adagrad on the embeddings (torch's Adagrad takes sparse gradients) and the job's optimizer on
the dense layers, the same batch. The records are parsed before the clock starts (parsing in Python
would otherwise dominate): the figure is the training loop alone, which favours the anchor.

Prints one JSON line: {"examples_per_s", "test_auc", "steps", "threads"}. Run with Debian's python3
(python3-torch; install libopenblas0-pthread so it does not fall back to the reference BLAS).
Usage: torch_ctr.py --job JOB --train FILE --test FILE [--steps N] [--threads 1]
"""
import argparse, gzip, json, math, time

import numpy as np
import torch

M64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def read(path, n_max, vocab=None):
    """Labels, dense (n, 13), and the 26 fields' tokens as Python ints (a per-field dictionary index:
    the table ids; hashing them as psfleet does changes nothing for the model, whose rows are
    independent per id)."""
    op = gzip.open if path.endswith(".gz") else open
    ys, xs, cats = [], [], []
    grow = vocab is None
    vocab = vocab or [dict() for _ in range(26)]
    with op(path, "rt") as f:
        for i, line in enumerate(f):
            if i >= n_max:
                break
            c = line.rstrip("\n").split("\t")
            ys.append(float(c[0]))
            xs.append([math.log1p(float(v)) if v and float(v) > 0 else 0.0 for v in c[1:14]])
            row = []
            for j, tok in enumerate(c[14:40]):
                if not tok:
                    row.append(-1)
                elif grow:
                    row.append(vocab[j].setdefault(tok, len(vocab[j])))
                else:  # a token the training rows never had: the field's last row, never trained
                    row.append(vocab[j].get(tok, len(vocab[j])))
            cats.append(row)
    return np.array(ys, np.float32), np.array(xs, np.float32), np.array(cats, np.int64), vocab


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--job", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    job = json.load(open(a.job))
    m, t = job["model"], job["training"]
    B = t.get("batch_size", 64)
    steps = a.steps or t.get("max_steps", 1000)
    y, x, cats, vocab = read(a.train, steps * B)
    ty, tx, tcats, _ = read(a.test, 10 ** 7, vocab)
    n_dense = x.shape[1]
    tables = []
    width = n_dense
    for e in m["embeddings"]:
        fields = list(range(26)) if e["fields"] == "all" else e["fields"]
        n_rows = sum(len(vocab[f]) + 2 for f in fields)
        std = e.get("init_stddev", 1.0 / math.sqrt(e["dim"]))
        bag = torch.nn.EmbeddingBag(n_rows, e["dim"], mode="sum", sparse=True)
        with torch.no_grad():
            bag.weight.normal_(0, std) if std > 0 else bag.weight.zero_()
        offs = np.cumsum([0] + [len(vocab[f]) + 2 for f in fields])[:-1]   # empty, the tokens, unseen
        tables.append((bag, fields, offs, e["dim"]))
        width += len(fields) * e["dim"]
    layers, w = [], width
    for l in m["layers"]:
        if l["type"] == "dense":
            layers.append(torch.nn.Linear(w, l["units"]))
            w = l["units"]
        elif l["type"] == "relu":
            layers.append(torch.nn.ReLU())
    mlp = torch.nn.Sequential(*layers)
    lr, slr = t.get("learning_rate", 0.01), t.get("sparse_learning_rate", 0) or t.get("learning_rate", 0.01)
    sparse_params = [b.weight for b, _, _, _ in tables]
    opt_s = torch.optim.Adagrad(sparse_params, lr=slr, initial_accumulator_value=t.get("initial_accumulator", 0.1))
    opt_d = (torch.optim.Adagrad(mlp.parameters(), lr=lr, initial_accumulator_value=t.get("initial_accumulator", 0.1))
             if t.get("optimizer") == "adagrad" else torch.optim.SGD(mlp.parameters(), lr=lr, momentum=t.get("momentum", 0)))

    def forward(xb, cb):
        parts = [xb]
        for bag, fields, offs, dim in tables:
            ids = cb[:, fields]
            ids = np.where(ids < 0, 0, ids + 1) + offs          # empty field: row offs (never pushed: zero-ish)
            emb = bag(torch.from_numpy(ids.reshape(-1)), torch.arange(0, ids.size, 1))  # one id per bag
            parts.append(emb.reshape(len(xb), len(fields) * dim))
        return mlp(torch.cat(parts, 1)).squeeze(1)

    lossf = torch.nn.BCEWithLogitsLoss()
    n = len(y)
    t0 = time.perf_counter()
    tw = t0
    warm = min(20, steps // 10)
    for s in range(steps):
        if s == warm:
            tw = time.perf_counter()
        i = (s * B) % max(1, n - B)
        xb, cb, yb = torch.from_numpy(x[i:i + B]), cats[i:i + B], torch.from_numpy(y[i:i + B])
        opt_s.zero_grad()
        opt_d.zero_grad()
        loss = lossf(forward(xb, cb), yb)
        loss.backward()
        opt_s.step()
        opt_d.step()
    el = time.perf_counter() - tw
    with torch.no_grad():
        p = torch.sigmoid(forward(torch.from_numpy(tx), tcats)).numpy()
    # AUC with ties counted half (as binmetrics)
    order = np.argsort(p, kind="mergesort")
    ps, ys = p[order], ty[order]
    ranks = np.empty(len(p))
    i = 0
    while i < len(p):
        j = i
        while j + 1 < len(p) and ps[j + 1] == ps[i]:
            j += 1
        ranks[i:j + 1] = (i + j) / 2 + 1
        i = j + 1
    npos = (ys > 0.5).sum()
    nneg = len(ys) - npos
    auc = (ranks[ys > 0.5].sum() - npos * (npos + 1) / 2) / (npos * nneg)
    print(json.dumps({"examples_per_s": round((steps - warm) * B / el, 1), "test_auc": round(float(auc), 4),
                      "steps": steps, "threads": a.threads}))


if __name__ == "__main__":
    main()

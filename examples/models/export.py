#!/usr/bin/python3
"""Example models for psfleet's graph engine, defined in PyTorch and written as ONNX (opset 17) with
torch.onnx.export (Debian's python3-torch, 1.13).

    export.py --out DIR [--model NAME]... [--training | --no-fuse] [--reference DIR] [--seed N] [--batch B]

writes DIR/<name>.onnx for each model (all of them without --model):

  dlrm    DLRM for Criteo-style rows: a bottom MLP over the 13 dense features (13-64-16), 26 embedding
          lookups (16 dims), the dot interaction (the pairwise dots of the 27 vectors, the upper triangle
          without the diagonal: 351 values) and a top MLP (367-64-32-1).
  deepfm  DeepFM: first-order terms (a weight per id, a linear map of the dense features), the FM
          second-order term 0.5 * sum((sum_f e_f)^2 - sum_f e_f^2) and a deep MLP (429-64-32-1, with
          Dropout), added into one logit.
  dcnv2   DCN-v2: x0 = [dense, embeddings] (429), two full-rank cross layers x' = x0 * (W x + b) + x,
          then an MLP (429-64-32-1, with Dropout).
  resnet  A small ResNet for Fashion-MNIST: a 3x3 stem conv (16 channels), three residual blocks with
          batch normalization and ReLU (16, 32 with stride 2 and a 1x1 projection, 64 likewise), global
          average pooling and a Linear to 10 logits.

Inputs and outputs (dim 0, the batch, is symbolic: dynamic_axes):
  CTR models: "dense" (N, 13) float32 (the dense features, already transformed, e.g. log1p of the
              counts) and "ids" (N, 26) int64; output "logit" (N, 1).
  resnet:     "image" (N, 1, 28, 28) float32; output "logits" (N, 10).

The embeddings. The 26 fields' tables (1000 hashed rows each) are stored stacked as one (26000, 16)
table, and field f's id arrives already offset: ids[:, f] = f * 1000 + (hashed token mod 1000). One
Gather makes the (N, 26, 16) block. This is how the graph engine can take it: int64 tensors may only be
a Gather's indices there (graph.c), so neither slicing ids per field (a Gather over int64 data) nor
adding the field offsets inside the model (an int64 Add) runs, and a Concat of 26 separate tables is
over the engine's 8 inputs per node. 26 nn.Embedding(1000, 16) with field-local ids are the same model
with the offsets added on the data side.

The dot interaction is a batched MatMul of the stacked vectors (N, 27, 16) with their transpose, a
Flatten to (N, 729) and a Gather of the 351 upper-triangle positions from a constant index list
(torch.triu exports to ops outside the engine's set).

--training exports with training=TrainingMode.TRAINING and do_constant_folding=False: Dropout and
BatchNormalization in their training form. Without it the graphs are exported in eval mode
(TrainingMode.EVAL, with the exporter's constant folding), where the exporter fuses ResNet's batch
normalization into its convolutions (with or without constant folding); --no-fuse exports the model in
eval mode with TrainingMode.PRESERVE instead, which keeps BatchNormalization, in its inference form.

A training-mode export traces the model in training mode once, which moves batch normalization's running
statistics by one step (momentum 0.1) over the tracing batch: the file holds those, not the statistics
the eval-mode export and the reference hold.

--reference DIR also writes, for each model, a seeded random input batch (B = --batch, 4) and torch's
outputs, as raw little-endian files: DIR/<name>.<input>.bin (float32 or int64, row-major),
DIR/<name>.<output>.eval.bin (float32: the model in eval mode) and, for the models without Dropout
(dlrm, resnet), DIR/<name>.<output>.train.bin (float32: the model in training mode on the same batch:
batch normalization over the batch's statistics, which is deterministic). DIR/reference.json lists them:
  {"batch": 4, "seed": 1, "models": {"dlrm": {"inputs": {"dense": {"file": "dlrm.dense.bin",
   "dtype": "float32", "shape": [4, 13]}, ...}, "outputs": {"logit": {"shape": [4, 1],
   "eval": "dlrm.logit.eval.bin", "train": "dlrm.logit.train.bin" or null}}, "params": N,
   "dropout": false, "batchnorm": false}, ...}}

Every model's weights come from torch.manual_seed(seed) (--seed, 1) set just before it is built, so a
model is the same whichever others are exported with it; batch normalization's running statistics and
affine parameters are randomized too, so that eval mode exercises them.
"""
import argparse
import copy
import json
import os
import sys
import warnings

import torch
from torch import nn

N_DENSE = 13
N_FIELDS = 26
VOCAB = 1000          # hashed rows per field
EMB_DIM = 16


def mlp(sizes, dropout=0.0, last_relu=False):
    """Linear layers with ReLU between them (and Dropout after each ReLU when dropout > 0)."""
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_relu:
            layers.append(nn.ReLU())
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


def embedding(rows, dim):
    e = nn.Embedding(rows, dim)
    nn.init.normal_(e.weight, std=dim ** -0.5)
    return e


class DLRM(nn.Module):
    def __init__(self):
        super().__init__()
        self.bottom = mlp([N_DENSE, 64, EMB_DIM], last_relu=True)
        self.emb = embedding(N_FIELDS * VOCAB, EMB_DIM)
        n = N_FIELDS + 1
        # positions i * n + j, i < j, of the flattened (n, n) dot matrix
        pairs = [i * n + j for i in range(n) for j in range(i + 1, n)]
        self.register_buffer("pairs", torch.tensor(pairs, dtype=torch.int64))
        self.top = mlp([EMB_DIM + len(pairs), 64, 32, 1])

    def forward(self, dense, ids):
        x = self.bottom(dense)                               # (N, 16)
        e = self.emb(ids)                                    # (N, 26, 16)
        t = torch.cat([x.unsqueeze(1), e], dim=1)            # (N, 27, 16)
        z = torch.matmul(t, t.transpose(1, 2))               # (N, 27, 27)
        z = torch.index_select(torch.flatten(z, 1), 1, self.pairs)   # (N, 351)
        return self.top(torch.cat([x, z], dim=1))            # (N, 1)


class DeepFM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = embedding(N_FIELDS * VOCAB, EMB_DIM)
        self.first = embedding(N_FIELDS * VOCAB, 1)
        self.dense_linear = nn.Linear(N_DENSE, 1)
        self.deep = mlp([N_DENSE + N_FIELDS * EMB_DIM, 64, 32, 1], dropout=0.2)

    def forward(self, dense, ids):
        e = self.emb(ids)                                              # (N, 26, 16)
        first = self.first(ids).sum(dim=1) + self.dense_linear(dense)  # (N, 1)
        s = e.sum(dim=1)                                               # (N, 16)
        fm = 0.5 * (s * s - (e * e).sum(dim=1)).sum(dim=1, keepdim=True)   # (N, 1)
        deep = self.deep(torch.cat([dense, torch.flatten(e, 1)], dim=1))  # (N, 1)
        return first + fm + deep


class CrossLayer(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        nn.init.normal_(self.linear.weight, std=dim ** -0.5 * 0.5)

    def forward(self, x0, x):
        return x0 * self.linear(x) + x


class DCNv2(nn.Module):
    def __init__(self, n_cross=2):
        super().__init__()
        dim = N_DENSE + N_FIELDS * EMB_DIM
        self.emb = embedding(N_FIELDS * VOCAB, EMB_DIM)
        self.cross = nn.ModuleList([CrossLayer(dim) for _ in range(n_cross)])
        self.deep = mlp([dim, 64, 32, 1], dropout=0.2)

    def forward(self, dense, ids):
        x0 = torch.cat([dense, torch.flatten(self.emb(ids), 1)], dim=1)   # (N, 429)
        x = x0
        for c in self.cross:
            x = c(x0, x)
        return self.deep(x)


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.proj = None
        if stride != 1 or cin != cout:
            self.proj = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.proj is None else self.proj(x)))


class ResNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.blocks = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, classes)

    def forward(self, image):
        x = self.blocks(self.stem(image))
        return self.fc(torch.flatten(self.pool(x), 1))


CTR_INPUTS = [("dense", torch.float32, (N_DENSE,)), ("ids", torch.int64, (N_FIELDS,))]
MODELS = {
    "dlrm": (DLRM, CTR_INPUTS, "logit"),
    "deepfm": (DeepFM, CTR_INPUTS, "logit"),
    "dcnv2": (DCNv2, CTR_INPUTS, "logit"),
    "resnet": (ResNet, [("image", torch.float32, (1, 28, 28))], "logits"),
}


def build(name, seed):
    torch.manual_seed(seed)
    m = MODELS[name][0]()
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 2.0)
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.2, 0.2)
    return m.eval()


def sample_inputs(name, batch, seed):
    """A random batch like the project's data: dense features log1p of counts, ids per field in its
    block of the stacked table; images in [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for iname, dtype, shape in MODELS[name][1]:
        if iname == "dense":
            counts = torch.randint(0, 200, (batch,) + shape, generator=g)
            out.append(torch.log1p(counts.to(torch.float32)))
        elif iname == "ids":
            local = torch.randint(0, VOCAB, (batch,) + shape, generator=g, dtype=torch.int64)
            out.append(local + torch.arange(N_FIELDS, dtype=torch.int64) * VOCAB)
        else:
            out.append(torch.rand((batch,) + shape, generator=g, dtype=torch.float32))
    return out


def export(name, model, path, training, fuse=True):
    inputs = MODELS[name][1]
    out_name = MODELS[name][2]
    args = tuple(sample_inputs(name, 2, 0))
    names = [i[0] for i in inputs]
    axes = {n: {0: "batch"} for n in names + [out_name]}
    kw = {}
    if training:
        kw = dict(training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    else:
        kw = dict(training=torch.onnx.TrainingMode.EVAL if fuse else torch.onnx.TrainingMode.PRESERVE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, path, input_names=names, output_names=[out_name], dynamic_axes=axes,
                          opset_version=17, **kw)


def has(model, kind):
    return any(isinstance(m, kind) for m in model.modules())


def write_reference(name, model, ref_dir, batch, seed):
    xs = sample_inputs(name, batch, seed)
    out_name = MODELS[name][2]
    entry = {"inputs": {}, "outputs": {}, "params": sum(p.numel() for p in model.parameters()),
             "dropout": has(model, nn.Dropout), "batchnorm": has(model, nn.BatchNorm2d)}
    for (iname, dtype, _), x in zip(MODELS[name][1], xs):
        f = "%s.%s.bin" % (name, iname)
        with open(os.path.join(ref_dir, f), "wb") as fh:
            fh.write(x.contiguous().numpy().astype("<f4" if dtype == torch.float32 else "<i8").tobytes())
        entry["inputs"][iname] = {"file": f, "dtype": "float32" if dtype == torch.float32 else "int64",
                                  "shape": list(x.shape)}
    with torch.no_grad():
        y = model.eval()(*xs)
        ytrain = None
        if not entry["dropout"]:
            ytrain = copy.deepcopy(model).train()(*xs)
    out = {"shape": list(y.shape), "eval": "%s.%s.eval.bin" % (name, out_name), "train": None}
    with open(os.path.join(ref_dir, out["eval"]), "wb") as fh:
        fh.write(y.numpy().astype("<f4").tobytes())
    if ytrain is not None:
        out["train"] = "%s.%s.train.bin" % (name, out_name)
        with open(os.path.join(ref_dir, out["train"]), "wb") as fh:
            fh.write(ytrain.numpy().astype("<f4").tobytes())
    entry["outputs"][out_name] = out
    return entry


def main(argv=None):
    ap = argparse.ArgumentParser(description="Writes psfleet's example models as ONNX (opset 17).")
    ap.add_argument("--out", required=True, help="directory for <name>.onnx")
    ap.add_argument("--model", action="append", choices=sorted(MODELS), help="a model (default: all)")
    ap.add_argument("--training", action="store_true", help="export in training mode (TrainingMode.TRAINING)")
    ap.add_argument("--no-fuse", action="store_true",
                    help="eval mode, keeping BatchNormalization (not fused into the convolutions)")
    ap.add_argument("--reference", metavar="DIR", help="also write a random input batch and torch's outputs")
    ap.add_argument("--seed", type=int, default=1, help="the weights' and the reference batch's seed")
    ap.add_argument("--batch", type=int, default=4, help="the reference batch's size")
    a = ap.parse_args(argv)
    if a.training and a.no_fuse:
        ap.error("--no-fuse is for eval mode (a training-mode export never fuses)")
    torch.set_num_threads(1)
    os.makedirs(a.out, exist_ok=True)
    names = a.model or list(MODELS)
    manifest = {"batch": a.batch, "seed": a.seed, "models": {}}
    if a.reference:
        os.makedirs(a.reference, exist_ok=True)
    for name in dict.fromkeys(names):
        model = build(name, a.seed)
        path = os.path.join(a.out, name + ".onnx")
        export(name, copy.deepcopy(model), path, a.training, not a.no_fuse)   # tracing in training mode moves BN's stats
        n = sum(p.numel() for p in model.parameters())
        print("%s: %s (%d parameters, %s)" % (name, path, n, "training" if a.training else
                                              "eval, not fused" if a.no_fuse else "eval"))
        if a.reference:
            manifest["models"][name] = write_reference(name, model, a.reference, a.batch, a.seed)
    if a.reference:
        with open(os.path.join(a.reference, "reference.json"), "w") as fh:
            json.dump(manifest, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What a server must do to a record before the graph `psfleet export` writes can take it (docs/serving.md):
the reference, in Python, of psfleet's readers for the Criteo and LIBSVM formats. Usable as a module
(records_hash, criteo_record, criteo_inputs, libsvm_record, libsvm_inputs) or as a command that prints
a Criteo line's inputs as JSON:

    python3 tools/serving.py < line.tsv
"""
import gzip
import json
import math
import sys

M64 = (1 << 64) - 1
CRITEO_DENSE, CRITEO_FIELDS = 13, 26


def records_hash(field, token):
    """The id of a categorical token (bytes) of field `field` (0-based): 64-bit FNV-1a of its bytes,
    xor field * 0x9e3779b97f4a7c15, then one splitmix64 step (services/common/train/records.c)."""
    h = 0xCBF29CE484222325
    for b in token:
        h = ((h ^ b) * 0x100000001B3) & M64
    z = ((h ^ ((field * 0x9E3779B97F4A7C15) & M64)) + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def criteo_record(line):
    """A Criteo line (bytes: label, 13 integer columns, 26 categorical tokens, tab-separated) as the
    exported graph takes it: (label, dense: 13 floats (log1p of a positive count, else 0), ids: 26
    unsigned 64-bit ids (0 where the field is empty), weights: 26 floats (1 where the field has a token,
    0 where it is empty))."""
    col = line.rstrip(b"\r\n").split(b"\t")
    if len(col) != 1 + CRITEO_DENSE + CRITEO_FIELDS:
        raise ValueError("%d tab-separated columns, expected %d" % (len(col), 1 + CRITEO_DENSE + CRITEO_FIELDS))
    dense = [math.log1p(int(c)) if c and int(c) > 0 else 0.0 for c in col[1:1 + CRITEO_DENSE]]
    toks = col[1 + CRITEO_DENSE:]
    ids = [records_hash(j, t) if t else 0 for j, t in enumerate(toks)]
    weights = [1.0 if t else 0.0 for t in toks]
    return int(col[0]), dense, ids, weights


def criteo_inputs(np, path):
    """A Criteo file (gzip'd or not) as the graph's inputs: dense (n, 13) float32, ids (n, 26) int64 (the
    unsigned ids' bits, as ONNX takes them), weights (n, 26) float32, and the labels (n,) float64."""
    opener = gzip.open if open(path, "rb").read(2) == b"\x1f\x8b" else open
    labels, dense, ids, weights = [], [], [], []
    with opener(path, "rb") as f:
        for line in f:
            y, d, i, w = criteo_record(line)
            labels.append(y)
            dense.append(d)
            ids.append(i)
            weights.append(w)
    return (np.array(dense, np.float32), np.array(ids, np.uint64).view(np.int64), np.array(weights, np.float32),
            np.array(labels, np.float64))


def libsvm_record(line):
    """A LIBSVM line (bytes: "label idx:val ...") as psfleet reads it: (label, ids, values) of its one
    field, the ids the indices as they are."""
    parts = line.split()
    ids, values = [], []
    for p in parts[1:]:
        i, v = p.split(b":")
        ids.append(int(i))
        values.append(float(v))
    return float(parts[0]), ids, values


def libsvm_inputs(np, path):
    """A LIBSVM file as the graph's inputs: ids (n, 1, k) int64 and weights (n, 1, k) float32, k the most
    ids of a line, shorter lines padded with id 0 of weight 0; and the labels (n,) float64."""
    opener = gzip.open if open(path, "rb").read(2) == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        recs = [libsvm_record(line) for line in f if line.strip()]
    k = max(1, max(len(r[1]) for r in recs))
    ids = np.zeros((len(recs), 1, k), np.uint64)
    weights = np.zeros((len(recs), 1, k), np.float32)
    for n, (_, i, v) in enumerate(recs):
        ids[n, 0, :len(i)] = i
        weights[n, 0, :len(v)] = v
    return ids.view(np.int64), weights, np.array([r[0] for r in recs], np.float64)


def main():
    for line in sys.stdin.buffer:
        y, d, i, w = criteo_record(line)
        print(json.dumps({"label": y, "dense": d, "ids": i, "weights": w}))


if __name__ == "__main__":
    main()

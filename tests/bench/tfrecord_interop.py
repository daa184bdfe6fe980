#!/usr/bin/python3
"""TFRecord interop and speed against TensorFlow itself (docs/data-formats.md and docs/performance.md,
"TFRecord"). Run it with a Python that has TensorFlow (PyPI tensorflow-cpu); without one it says so and
exits 77 (skipped).

1. Interop: TensorFlow's own tf.io.TFRecordWriter writes the same tf.train.Examples uncompressed, GZIP and
   ZLIB (a float label, a dense float feature of shape [2] missing from some records, a dense int64,
   varying-length int64 and bytes features, a raw image); psfleet's reader (records_dump, with the
   matching data.tfrecord spec, compression told by the bytes) must give, record for record, what
   tf.data.TFRecordDataset + tf.io.parse_example give: the same label, dense values (defaults filled in),
   image bytes / 255, int64 ids and bytes hashed as records_hash (reimplemented here).
2. Speed, one run: `psfleet gen-data` rows as GZIP'd TFRecord and as gzip'd Criteo TSV (the same rows);
   records/s of psfleet's TFRecord reader, of its TSV reader, and of tf.data.TFRecordDataset +
   batch + tf.io.parse_example (the same spec) on the same file with the same threads.

Usage: tests/bench/tfrecord_interop.py [--build build] [--rows 200000] [--threads 1,2] [--no-bench]
Prints one JSON line per measurement.
"""
import argparse, json, os, subprocess, sys, tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MASK64 = (1 << 64) - 1


def records_hash(field, data):
    """records.h's records_hash: FNV-1a 64, xor field * golden, one splitmix64 step."""
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & MASK64
    z = (h ^ (field * 0x9e3779b97f4a7c15 & MASK64)) + 0x9e3779b97f4a7c15 & MASK64
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & MASK64
    return z ^ (z >> 31)


def run(cmd, timeout=3600, **kw):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if out.returncode != 0:
        sys.stderr.write(out.stderr[-3000:])
        raise SystemExit("failed: %s (exit %d)" % (" ".join(cmd), out.returncode))
    return out.stdout


def write_job(tmp, name, data, dense_n, n_fields):
    job = {
        "job": name,
        "cluster": {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"], "worker": ["127.0.0.1:3"]},
        "model": {"input": [dense_n], "head": "logistic", "layers": [{"type": "dense", "units": 1}]},
        "data": data,
    }
    if n_fields:
        job["model"]["embeddings"] = [{"name": "e", "fields": "all", "dim": 1}]
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump(job, f)
    return path


# ---- 1. interop ----

SPARSE = [("ids", "int64"), ("words", "string")]


def examples(tf, n):
    import random
    rnd = random.Random(5)
    for i in range(n):
        f = {"label": tf.train.Feature(float_list=tf.train.FloatList(value=[rnd.random()])),
             "count": tf.train.Feature(int64_list=tf.train.Int64List(value=[rnd.randrange(-5, 10 ** 12)])),
             "ids": tf.train.Feature(int64_list=tf.train.Int64List(
                 value=[rnd.randrange(-2 ** 63, 2 ** 63) for _ in range(rnd.randrange(0, 6))])),
             "words": tf.train.Feature(bytes_list=tf.train.BytesList(
                 value=[bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 12)))
                        for _ in range(rnd.randrange(0, 4))])),
             "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes(rnd.randrange(256)
                                                                                  for _ in range(12))])),
             "unused": tf.train.Feature(float_list=tf.train.FloatList(value=[1, 2, 3]))}
        if i % 3:   # every third record lacks "xy": its default
            f["xy"] = tf.train.Feature(float_list=tf.train.FloatList(value=[rnd.uniform(-1e6, 1e6),
                                                                            rnd.gauss(0, 1)]))
        yield tf.train.Example(features=tf.train.Features(feature=f))


def tf_expected(tf, path, comp):
    spec = {"label": tf.io.FixedLenFeature([], tf.float32),
            "xy": tf.io.FixedLenFeature([2], tf.float32, default_value=[-7.5, -7.5]),
            "count": tf.io.FixedLenFeature([], tf.int64),
            "ids": tf.io.VarLenFeature(tf.int64), "words": tf.io.VarLenFeature(tf.string),
            "image": tf.io.FixedLenFeature([], tf.string)}
    import numpy as np
    rows = []
    for batch in tf.data.TFRecordDataset(path, compression_type=comp).batch(64):
        p = tf.io.parse_example(batch, spec)
        ids = tf.sparse.to_dense(p["ids"]).numpy()
        ids_n = tf.math.bincount(tf.cast(p["ids"].indices[:, 0], tf.int32), minlength=len(batch)).numpy()
        words = p["words"]
        img = tf.io.decode_raw(p["image"], tf.uint8).numpy()
        for r in range(len(batch)):
            w = [words.values[k].numpy() for k in range(len(words.values)) if words.indices[k][0] == r]
            dense = [p["xy"][r][0].numpy(), p["xy"][r][1].numpy(), np.float32(p["count"][r].numpy())]
            dense += list(img[r].astype(np.float32) / np.float32(255))
            rows.append(("%.9g" % p["label"][r].numpy(),
                         ",".join("%.9g" % v for v in dense),
                         ",".join(str(int(v) & MASK64) for v in ids[r][:ids_n[r]]),
                         ",".join(str(records_hash(1, x)) for x in w)))
    return rows


def interop(tf, build, tmp, n):
    data = {"dir": tmp, "format": "tfrecord", "train_files": [], "max_ids_per_example": 64,
            "tfrecord": {"label": "label",
                         "dense": [{"name": "xy", "shape": [2], "default_value": -7.5},
                                   {"name": "count", "dtype": "int64"}],
                         "sparse": [{"name": s, "dtype": t} for s, t in SPARSE],
                         "image": {"name": "image", "shape": [3, 2, 2]}}}
    for comp in ("", "GZIP", "ZLIB"):
        path = os.path.join(tmp, "tf-%s.tfrecord" % (comp or "none"))
        with tf.io.TFRecordWriter(path, options=tf.io.TFRecordOptions(compression_type=comp)) as w:
            for ex in examples(tf, n):
                w.write(ex.SerializeToString())
        data["train_files"] = [os.path.basename(path)]
        job = write_job(tmp, "interop-" + (comp or "none"), data, 2 + 1 + 12, len(SPARSE))
        ours = [tuple(l.split(";")) for l in run([os.path.join(build, "tests", "bench", "records_dump"), job])
                .splitlines()]
        want = tf_expected(tf, path, comp)
        assert len(ours) == len(want) == n, (comp, len(ours), len(want))
        for i, (a, b) in enumerate(zip(ours, want)):
            assert a == b, "%s record %d:\n psfleet    %s\n tensorflow %s" % (comp or "none", i, a, b)
        print(json.dumps({"interop": comp or "none", "records": n, "equal": True}), flush=True)


# ---- 2. speed ----

TF_BENCH = r"""
import json, os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
path, threads, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tf.config.threading.set_inter_op_parallelism_threads(threads)
tf.config.threading.set_intra_op_parallelism_threads(threads)
spec = {"label": tf.io.FixedLenFeature([], tf.int64)}
spec.update({"I%d" % j: tf.io.FixedLenFeature([], tf.float32, default_value=0.0) for j in range(1, 14)})
spec.update({"C%d" % f: tf.io.VarLenFeature(tf.string) for f in range(1, 27)})
ds = (tf.data.TFRecordDataset(path, compression_type="GZIP", num_parallel_reads=threads).batch(batch)
      .map(lambda x: tf.io.parse_example(x, spec), num_parallel_calls=threads).prefetch(2))
opt = tf.data.Options()
opt.threading.private_threadpool_size = threads
ds = ds.with_options(opt)
t0, n = time.perf_counter(), 0
for p in ds:
    n += int(p["label"].shape[0])
s = time.perf_counter() - t0
print(json.dumps({"records": n, "seconds": round(s, 3), "records_per_s": round(n / s), "threads": threads}))
"""


def bench(build, tmp, rows, threads):
    psfleet = os.path.join(build, "services", "cli", "psfleet")
    dump = os.path.join(build, "tests", "bench", "records_dump")
    tfr, tsv = os.path.join(tmp, "bench.tfrecord.gz"), os.path.join(tmp, "bench.tsv.gz")
    run([psfleet, "gen-data", "--format", "tfrecord", "--rows", str(rows), "--out", tfr, "--seed", "7"])
    run([psfleet, "gen-data", "--format", "criteo", "--rows", str(rows), "--out", tsv, "--seed", "7"])
    with open(os.path.join(ROOT, "examples", "ctr-tfrecord.json")) as f:
        spec = json.load(f)["data"]["tfrecord"]
    jt = write_job(tmp, "bench-tfrecord", {"dir": tmp, "format": "tfrecord", "train_files": [tfr],
                                           "tfrecord": spec}, 13, 26)
    jc = write_job(tmp, "bench-tsv", {"dir": tmp, "format": "criteo", "train_files": [tsv]}, 13, 26)
    for t in threads:
        for name, job in (("psfleet tfrecord", jt), ("psfleet criteo tsv", jc)):
            r = json.loads(run([dump, job, "--count", "--threads", str(t), "--batch", "256"]))
            assert r["records"] == rows, r
            r.update({"reader": name, "file": os.path.basename(job == jt and tfr or tsv), "rows": rows})
            print(json.dumps(r), flush=True)
        r = json.loads(run([sys.executable, "-c", TF_BENCH, tfr, str(t), "256"]))
        assert r["records"] == rows, r
        r.update({"reader": "tf.data.TFRecordDataset + tf.io.parse_example", "file": os.path.basename(tfr),
                  "rows": rows, "tensorflow": __import__("tensorflow").__version__})
        print(json.dumps(r), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rows", type=int, default=200000)
    ap.add_argument("--interop-rows", type=int, default=300)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--no-bench", action="store_true")
    a = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        import tensorflow as tf
    except ImportError as e:
        print("skipped: TensorFlow cannot be imported by %s (%s); run this with a Python that has PyPI's "
              "tensorflow-cpu" % (sys.executable, e), flush=True)
        sys.exit(77)
    with tempfile.TemporaryDirectory(prefix="psfleet-tfrecord-") as tmp:
        interop(tf, a.build, tmp, a.interop_rows)
        if not a.no_bench:
            bench(a.build, tmp, a.rows, [int(t) for t in a.threads.split(",")])


if __name__ == "__main__":
    main()

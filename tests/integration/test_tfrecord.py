"""TFRecord files of tf.train.Example through real daemons (docs/data-formats.md, "TFRecord"): `psfleet
gen-data` writes the same rows as Criteo TSV and as GZIP'd TFRecord (seed 7, 300000 training and 20000
test rows); examples/ctr-tfrecord.json's model (1 ps + 1 worker, one pass) reaches the same test AUC on
both within 0.002, and above the planted AUC less 0.05. Then bad records are exit 65 with a message
naming the file, the record's index and byte offset: a test file whose first record's CRC is broken
stops chiefd at start, a training file whose record 123 is broken stops the job (psfleet local) when
the worker reaches it. Last, with Fashion-MNIST installed, its images as raw-bytes image features (framed
here, CRCs and all) train a small convolutional model (model.input [1, 28, 28]) to a test accuracy of
at least 0.75 in 300 steps (0.866 here). About 25 s on 2 cores."""
import gzip
import json
import os
import struct

import harness as h

TRAIN_ROWS, TEST_ROWS, BATCH = 300000, 20000, 256
EX_DATAERR = 65


def gen(wd, fmt, out, test_out):
    p = h.Proc(wd, "gen-" + os.path.basename(out), [
        h.BIN["psfleet"], "gen-data", "--format", fmt, "--rows", str(TRAIN_ROWS), "--out", out,
        "--test-rows", str(TEST_ROWS), "--test-out", test_out, "--seed", "7", "--vocab", "20000"])
    assert p.wait(120) == 0, p.stderr()
    with open(test_out + ".meta.json") as f:
        return json.load(f)


def job(wd, name, data, fmt, train, test):
    with open(os.path.join(h.SOURCE_DIR, "examples", "ctr-tfrecord.json")) as f:
        base = json.load(f)
    base["job"] = name
    base["data"].update({"dir": data, "train_files": [train], "test_files": [test]})
    if fmt == "criteo":
        base["data"] = {k: v for k, v in base["data"].items() if k != "tfrecord"}
    base["data"]["format"] = fmt
    path, _ = h.make_job(wd, name + ".json", n_ps=1, n_workers=1, base=base,
                         training={"max_steps": TRAIN_ROWS // BATCH, "batch_size": BATCH})
    return path


def break_crc(src, dst, index):
    """A copy of the plain TFRecord file src with record index's data CRC flipped; its byte offset."""
    with open(src, "rb") as f:
        buf = bytearray(f.read())
    at = 0
    for _ in range(index):
        (n,) = struct.unpack_from("<Q", buf, at)
        at += 16 + n
    (n,) = struct.unpack_from("<Q", buf, at)
    buf[at + 12 + n] ^= 0xff
    with open(dst, "wb") as f:
        f.write(buf)
    return at


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xa282ead8) & 0xffffffff


def fmnist_tfrecord(images, labels, n, out):
    """The first n images (raw bytes, "image") and labels (int64, "label") of the IDX files as a plain
    TFRecord file of Examples, encoded and framed here."""
    x = gzip.open(os.path.join(h.DATA_DIR, images)).read()[16:]
    y = gzip.open(os.path.join(h.DATA_DIR, labels)).read()[8:]

    def entry(key, kind, payload):   # Features.feature entry: key, Feature{kind: list{value = payload}}
        lst = b"\x0a" + varint(len(payload)) + payload
        feat = bytes([kind << 3 | 2]) + varint(len(lst)) + lst
        e = b"\x0a" + varint(len(key)) + key + b"\x12" + varint(len(feat)) + feat
        return b"\x0a" + varint(len(e)) + e

    with open(out, "wb") as f:
        for i in range(n):
            feats = entry(b"label", 3, varint(y[i])) + entry(b"image", 1, x[784 * i:784 * (i + 1)])
            ex = b"\x0a" + varint(len(feats)) + feats
            head = struct.pack("<Q", len(ex))
            f.write(head + struct.pack("<I", masked(h.crc32c(head))) + ex + struct.pack("<I", masked(h.crc32c(ex))))


def varint(v):
    out = b""
    while v >= 0x80:
        out += bytes([v & 0x7f | 0x80])
        v >>= 7
    return out + bytes([v])


def images(wd, data):
    if not os.path.isdir(h.DATA_DIR):
        h.log("Fashion-MNIST not installed in %s: the image part is not run" % h.DATA_DIR)
        return
    fmnist_tfrecord("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", 6000, os.path.join(data, "img.tfrecord"))
    fmnist_tfrecord("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", 1000, os.path.join(data, "img-test.tfrecord"))
    base = {"job": "img",
            "model": {"input": [1, 28, 28], "head": "softmax", "layers": [
                {"type": "conv2d", "filters": 8, "kernel": 3}, {"type": "relu"}, {"type": "maxpool2d", "pool": 2},
                {"type": "flatten"}, {"type": "dense", "units": 10}]},
            "data": {"dir": data, "format": "tfrecord", "train_files": ["img.tfrecord"],
                     "test_files": ["img-test.tfrecord"],
                     "tfrecord": {"label": "label", "image": {"name": "image", "shape": [1, 28, 28]}}},
            "training": {"batch_size": 64, "optimizer": "adam", "learning_rate": 0.002, "max_steps": 300}}
    path, _ = h.make_job(wd, "img.json", n_ps=1, n_workers=1, base=base)
    r = h.local_result(wd, path, name="images")
    assert r["test_accuracy"] >= 0.75, r


def test():
    h.require_built("psd", "workerd", "chiefd", "psfleet")
    wd = h.Workdir()
    data = wd.file("data")
    os.makedirs(data)
    tsv = gen(wd, "criteo", os.path.join(data, "train.tsv.gz"), os.path.join(data, "test.tsv.gz"))
    tfr = gen(wd, "tfrecord", os.path.join(data, "train.tfrecord.gz"), os.path.join(data, "test.tfrecord.gz"))
    assert tsv["planted_auc"] == tfr["planted_auc"], (tsv, tfr)   # the same rows
    a = h.local_result(wd, job(wd, "ctr-tsv", data, "criteo", "train.tsv.gz", "test.tsv.gz"), name="tsv")
    b = h.local_result(wd, job(wd, "ctr-tfr", data, "tfrecord", "train.tfrecord.gz", "test.tfrecord.gz"),
                       name="tfrecord")
    h.log("test AUC: TSV %.4f, TFRecord %.4f, planted %.4f" % (a["test_auc"], b["test_auc"], tsv["planted_auc"]))
    assert abs(a["test_auc"] - b["test_auc"]) <= 0.002, (a, b)
    assert b["test_auc"] >= tsv["planted_auc"] - 0.05, (b, tsv["planted_auc"])

    # bad data: chiefd checks the test file's first record at start; broken, it is exit 65, named
    plain = os.path.join(data, "small.tfrecord")
    p = h.Proc(wd, "gen-small", [h.BIN["psfleet"], "gen-data", "--format", "tfrecord", "--rows", "200",
                                 "--out", plain, "--seed", "3"])
    assert p.wait(60) == 0, p.stderr()
    at = break_crc(plain, os.path.join(data, "bad.tfrecord"), 0)
    path = job(wd, "ctr-bad", data, "tfrecord", "small.tfrecord", "bad.tfrecord")
    p = h.Proc(wd, "chiefd-bad", [h.BIN["chiefd"], "--job", path, "--state-dir", wd.file("state-bad")])
    rc = p.wait(60)
    want = "bad.tfrecord: record 0 at byte %d: the data's CRC does not match" % at
    assert rc == EX_DATAERR and want in p.stderr(), (rc, p.stderr()[-2000:])
    # and a worker that meets record 123 broken in its training file: exit 65 too, named to the byte
    at = break_crc(plain, os.path.join(data, "bad-train.tfrecord"), 123)
    path = job(wd, "ctr-bad-train", data, "tfrecord", "bad-train.tfrecord", "small.tfrecord")
    p = h.psfleet_local(wd, path, ["--quiet"], name="local-bad")
    rc = p.wait(120)
    want = "bad-train.tfrecord: record 123 at byte %d: the data's CRC does not match" % at
    assert rc == EX_DATAERR and want in p.stderr(), (rc, p.stderr()[-3000:])
    images(wd, data)


if __name__ == "__main__":
    h.main(test)

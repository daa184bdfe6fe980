"""TFRecord files of tf.train.Example through real daemons (docs/data-formats.md, "TFRecord"): `psfleet
gen-data` writes the same rows as Criteo TSV and as GZIP'd TFRecord (seed 7, 300000 training and 20000
test rows); examples/ctr-tfrecord.json's model (1 ps + 1 worker, one pass) reaches the same test AUC on
both within 0.002, and above the planted AUC less 0.05. Then bad records are exit 65 with a message
naming the file, the record's index and byte offset: a test file whose first record's CRC is broken
stops chiefd at start, a training file whose record 123 is broken stops the job (psfleet local) when
the worker reaches it. About 25 s on 2 cores."""
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


if __name__ == "__main__":
    h.main(test)

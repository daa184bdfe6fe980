"""psfleet gen-data as a user runs it: two runs with the same options give the same bytes (training
and test files, gzip'd and plain); PATH.meta.json is beside each with sane numbers; the rows have the
shape docs/data-formats.md gives; another seed gives other rows; bad options exit 2 and a file that
cannot be written 74, naming it. The rows read back through the C readers in unit/test_gendata.c."""
import gzip
import json
import os
import re
import subprocess

import harness as h


def gen(*args, expect=0):
    argv = [h.BIN["psfleet"], "gen-data"] + [str(a) for a in args]
    p = subprocess.run(argv, env=h.child_env(None), capture_output=True, text=True, timeout=120)
    h.log("psfleet gen-data", " ".join(str(a) for a in args), "->", p.returncode)
    assert p.returncode == expect, "%s: exit %d, expected %d:\n%s%s" % (argv, p.returncode, expect, p.stdout,
                                                                       p.stderr)
    return p.stdout, p.stderr


def read(path):
    with open(path, "rb") as f:
        return f.read()


def text(path):
    data = read(path)
    return (gzip.decompress(data) if path.endswith(".gz") else data).decode()


def meta(path):
    with open(path + ".meta.json") as f:
        return json.load(f)


def check_criteo(path, rows):
    lines = text(path).splitlines()
    assert len(lines) == rows, (path, len(lines))
    tok = re.compile(r"^[0-9a-f]{8}$")
    empty_c = 0
    for ln in lines:
        cols = ln.split("\t")
        assert len(cols) == 40, (path, ln)
        assert cols[0] in ("0", "1"), ln
        for c in cols[1:14]:
            assert c == "" or (c.isdigit() and int(c) >= 0), ln
        for c in cols[14:]:
            assert c == "" or tok.match(c), ln
            empty_c += c == ""
    assert 0 < empty_c < rows * 26 / 4, empty_c


def check_binary_meta(m, fmt, rows, seed):
    assert m["format"] == fmt and m["rows"] == rows and m["seed"] == seed, m
    assert 0.2 < m["positive_rate"] < 0.3, m
    assert 0.74 < m["planted_auc"] < 0.84, m
    assert 0.35 < m["planted_logloss"] < 0.55, m


def test():
    if not os.access(h.BIN["psfleet"], os.X_OK):
        h.skip("psfleet not built")
    wd = h.Workdir()
    out = {}
    for run in ("a", "b"):
        d = wd.file(run)
        os.mkdir(d)
        stdout, _ = gen("--rows", 5000, "--out", os.path.join(d, "train.tsv.gz"), "--seed", 11,
                        "--test-rows", 2000, "--test-out", os.path.join(d, "test.tsv"), "--vocab", 5000)
        assert "planted AUC" in stdout, stdout
        gen("--rows", 3000, "--out", os.path.join(d, "r.svm"), "--format", "libsvm", "--seed", 11, "--vocab", 1000)
        gen("--rows", 3000, "--out", os.path.join(d, "r.csv"), "--format", "csv", "--noise", "0.5")
        out[run] = d
    for name in ("train.tsv.gz", "test.tsv", "r.svm", "r.csv"):
        a, b = read(os.path.join(out["a"], name)), read(os.path.join(out["b"], name))
        assert a == b, "%s differs between two runs" % name
        assert meta(os.path.join(out["a"], name)) == meta(os.path.join(out["b"], name)), name
    d = out["a"]
    assert read(os.path.join(d, "train.tsv.gz"))[:2] == b"\x1f\x8b", "not gzip'd"
    check_criteo(os.path.join(d, "train.tsv.gz"), 5000)
    check_criteo(os.path.join(d, "test.tsv"), 2000)
    check_binary_meta(meta(os.path.join(d, "train.tsv.gz")), "criteo", 5000, 11)
    check_binary_meta(meta(os.path.join(d, "test.tsv")), "criteo", 2000, 11)
    assert text(os.path.join(d, "train.tsv.gz"))[:20000] != text(os.path.join(d, "test.tsv"))[:20000], "test = train"

    svm = text(os.path.join(d, "r.svm")).splitlines()
    assert len(svm) == 3000
    for ln in svm:
        parts = ln.split(" ")
        assert parts[0] in ("0", "1"), ln
        idx = [int(p.split(":")[0]) for p in parts[1:]]
        assert idx == sorted(idx) and len(set(idx)) == len(idx), ln
        assert all(i < 26 * 1000 + 13 for i in idx), ln
    check_binary_meta(meta(os.path.join(d, "r.svm")), "libsvm", 3000, 11)

    csv = text(os.path.join(d, "r.csv")).splitlines()
    assert csv[0] == "y," + ",".join("x%d" % j for j in range(1, 14)), csv[0]
    assert len(csv) == 3001 and all(len(ln.split(",")) == 14 for ln in csv[1:])
    m = meta(os.path.join(d, "r.csv"))
    assert m["format"] == "csv" and m["rows"] == 3000 and m["seed"] == 1, m
    assert abs(m["planted_rmse"] - 0.5) < 0.05, m

    # another seed: other rows
    other = wd.file("other.tsv")
    gen("--rows", 5000, "--out", other, "--seed", 12, "--vocab", 5000)
    assert read(other) != text(os.path.join(d, "train.tsv.gz")).encode()

    # bad usage: 2, nothing written
    bad = wd.file("bad.tsv")
    for args in (["--out", bad], ["--rows", 10], ["--rows", 10, "--out", bad, "--format", "parquet"],
                 ["--rows", 0, "--out", bad], ["--rows", 10, "--out", bad, "--zipf", "abc"],
                 ["--rows", 10, "--out", bad, "--test-rows", 5], ["--rows", 10, "--out", bad, "--bogus"],
                 ["--rows", 10, "--out", bad, "extra"]):
        gen(*args, expect=2)
    assert not os.path.exists(bad)
    stdout, _ = gen("--help")
    assert "--test-out" in stdout
    # a file that cannot be written: 74, naming it
    missing = wd.file("no/such/dir/x.tsv")
    _, err = gen("--rows", 10, "--out", missing, expect=74)
    assert missing in err, err
    ro = wd.file("ro")
    os.mkdir(ro)
    if os.geteuid() != 0:   # root writes anywhere
        os.chmod(ro, 0o500)
        _, err = gen("--rows", 10, "--out", os.path.join(ro, "x.tsv"), expect=74)


if __name__ == "__main__":
    h.main(test)

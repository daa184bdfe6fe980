"""psfleet export of incremental checkpoints and deltas (docs/serving.md, "Following a job with deltas"): a
CTR job (examples/ctr-widedeep.json's model, `psfleet local`, a checkpoint every 50 steps, only the first
one full, the rest increments chained to it, at most 120,000 rows a table, so
that ids are evicted) exported offline at an incremental step A and at the
newest B (full or not), every table outside (--max-inline-rows 1): each table file equals the chain resolved here
independently (the full checkpoint's rows, then each increment's evictions and rows), in id order.
The delta A -> B (`--since A`) applied to a copy of A's export (`--apply DELTA --to FULL`) gives B's
export byte for byte (every table file, tables.json, model.onnx); a delta's size is its rows' and
tombstones' bytes and a header. What export refuses, writing nothing: --since not recorded, --since not
before --step, a --step not recorded, a corrupt link of the chain (each 65, the step or file named),
--since with --checkpoint (2), a delta applied to an export of another step (65, the export unchanged).

safetensors and numpy come from PyPI in <build>/pyenv (pyenv.py). About a minute."""
import filecmp
import json
import os
import shutil
import sqlite3
import subprocess

import harness as h
import pyenv
from test_sparse_job import gen_split

ROWS, TEST_ROWS, STEPS, EVERY = 30000, 2000, 400, 50


def psfleet(*args):
    return subprocess.run([h.BIN["psfleet"], "export"] + list(args), capture_output=True, text=True, timeout=180,
                          env=h.child_env())


def records(db):
    con = sqlite3.connect("file:%s?mode=ro" % db, uri=True)
    try:
        rows = con.execute("SELECT global_step, path, parent_step FROM checkpoints ORDER BY global_step")
        return [(r[0], os.path.join(os.path.dirname(db), r[1]), r[2]) for r in rows]
    finally:
        con.close()


def chain_of(recs, step):
    """The records of step's chain, newest first."""
    by_step = {r[0]: r for r in recs}
    chain = [by_step[step]]
    while chain[-1][2] is not None:
        chain.append(by_step[chain[-1][2]])
    return chain


def chain_rows(np, st, recs, step, table):
    """The table's rows at step, its chain resolved here: {id: row}."""
    rows = {}
    for r in reversed(chain_of(recs, step)):
        f = st.load_file(r[1])
        for i in f.get("emb/%s/evicted" % table, np.zeros(0, np.uint64)):
            rows.pop(int(i), None)
        for i, v in zip(f["emb/%s/ids" % table], f["emb/%s" % table]):
            rows[int(i)] = v
    return rows


def same_dirs(a, b):
    """Every file of b's export, the same bytes in a (and no other file of it)."""
    names = ["model.onnx", "tables.json"] + ["tables/" + f for f in sorted(os.listdir(os.path.join(b, "tables")))]
    got = ["model.onnx", "tables.json"] + ["tables/" + f for f in sorted(os.listdir(os.path.join(a, "tables")))]
    assert got == names, (got, names)
    for n in names:
        assert filecmp.cmp(os.path.join(a, n), os.path.join(b, n), shallow=False), n
    return names


def delta_bytes(d):
    """delta.json, the bytes of the delta's table files, and what their rows and tombstones alone take."""
    with open(os.path.join(d, "delta.json")) as f:
        m = json.load(f)
    with open(os.path.join(d, "tables.json")) as f:
        dim = {t["name"]: t["dim"] for t in json.load(f)["tables"]}
    payload = sum(t["changed"] * (8 + 4 * dim[t["name"]]) + 8 * t["tombstones"] for t in m["tables"])
    return m, sum(os.path.getsize(os.path.join(d, t["file"])) for t in m["tables"]), payload


def refused(what, args, out, code, words):
    p = psfleet(*args)
    assert p.returncode == code, "%s: exit %d, not %d:\n%s" % (what, p.returncode, code, p.stderr)
    for w in words:
        assert w in p.stderr, "%s: %r not in %r" % (what, w, p.stderr)
    assert out is None or not os.path.exists(out), "%s: %s was written" % (what, out)
    h.log("%s: exit %d, %s" % (what, code, p.stderr.strip().splitlines()[-1]))


def test():
    pyenv.ensure()
    import numpy as np
    import safetensors.numpy as st
    h.require_built("psd", "workerd", "chiefd", "psfleet")
    wd = h.Workdir()
    data = gen_split(wd, ROWS, TEST_ROWS)
    with open(os.path.join(h.SOURCE_DIR, "examples", "ctr-widedeep.json")) as f:
        base = json.load(f)
    base["job"] = "ctrdelta"
    base["data"]["dir"] = data
    for e in base["model"]["embeddings"]:
        e["max_rows"] = 120000   # ids that go at the bound: tombstones in a delta, evictions in the increments
    base["supervisor"] = {"save_checkpoint_steps": EVERY, "save_checkpoint_secs": 0, "keep_checkpoints": 100,
                          "full_checkpoint_every": 1000}
    job, spec = h.make_job(wd, "ctrdelta.json", n_ps=1, n_workers=1, base=base,
                           training={"max_steps": STEPS, "report_every_steps": 100, "threads": 1})
    h.local_result(wd, job, args=["--keep-state"], name="ctrdelta", timeout=600)
    db = [os.path.join(r, "chief.db") for r, _, fs in os.walk(wd.path) if "chief.db" in fs and
          os.path.basename(r) == "ctrdelta"][0]
    state = os.path.dirname(os.path.dirname(db))
    recs = records(db)
    incs = [r for r in recs if r[2] is not None]
    h.log("checkpoints (step, parent): %s" % [(r[0], r[2]) for r in recs])
    assert recs[0][2] is None and len(incs) >= 4, recs
    a, b1, b = incs[0][0], incs[1][0], recs[-1][0]
    tables = [e["name"] for e in base["model"]["embeddings"]]
    common = ["--job", job, "--state-dir", state]

    # whole exports of incremental steps: the chain resolved, each table in id order
    full = {}
    for s in (a, b1, b):
        out = wd.file("full-%d" % s)
        p = psfleet(*common, "--step", str(s), "--out", out, "--max-inline-rows", "1")
        assert p.returncode == 0, p.stderr
        full[s] = out
        for t in tables:
            want = chain_rows(np, st, recs, s, t)
            f = st.load_file(os.path.join(out, "tables", t + ".safetensors"))
            ids = sorted(want)
            assert f["ids"].tolist() == ids, (s, t)
            assert np.array_equal(f["rows"], np.array([want[i] for i in ids])), (s, t)
        h.log("step %d exported whole from its chain: %s" % (s, p.stdout.strip()))

    # delta A -> B applied to A's export is B's export, byte for byte
    figures = []
    for to in (b1, b):
        d = wd.file("delta-%d-%d" % (a, to))
        p = psfleet(*common, "--since", str(a), "--step", str(to), "--out", d)
        assert p.returncode == 0, p.stderr
        m, size, payload = delta_bytes(d)
        # the size follows the rows: 8 bytes an id, 4 a value, a header of a few hundred bytes a table
        assert 0 <= size - payload < 1024 * len(m["tables"]), (size, payload, m)
        assert (m["from_step"], m["to_step"]) == (a, to), m
        copy = wd.file("applied-%d-%d" % (a, to))
        shutil.copytree(full[a], copy)
        q = psfleet("--apply", d, "--to", copy)
        assert q.returncode == 0, q.stderr
        names = same_dirs(copy, full[to])
        changed = sum(t["changed"] for t in m["tables"])
        gone = sum(t["tombstones"] for t in m["tables"])
        rows = sum(t["rows"] for t in m["tables"])
        figures.append((to - a, changed, gone, rows, size))
        h.log("delta %d -> %d: %d rows changed, %d tombstones of %d rows, %d bytes of tables (whole: %d); %s; "
              "applied: %s equal to the export of %d" %
              (a, to, changed, gone, rows, size,
               sum(os.path.getsize(os.path.join(full[to], n)) for n in names if n.startswith("tables/")),
               q.stdout.strip(), ", ".join(names), to))
    # a delta into a whole export's directory leaves no whole table there, and the other way round
    d = wd.file("delta-over-full")
    shutil.copytree(full[b1], d)
    p = psfleet(*common, "--since", str(a), "--step", str(b1), "--out", d)
    assert p.returncode == 0 and sorted(os.listdir(d)) == ["delta", "delta.json", "model.onnx", "tables.json"], (
        p.stderr, os.listdir(d))
    p = psfleet(*common, "--step", str(b1), "--out", d, "--max-inline-rows", "1")
    assert p.returncode == 0 and sorted(os.listdir(d)) == ["model.onnx", "tables", "tables.json"], (p.stderr,
                                                                                                  os.listdir(d))
    same_dirs(d, full[b1])
    # rows changed in both, and ids evicted (tombstones) over the longer one
    assert figures[0][1] > 0 and figures[1][1] > 0 and figures[1][2] > 0, figures

    # refusals: nothing written
    refused("--since not recorded", common + ["--since", str(a + 1), "--out", wd.file("r1")], wd.file("r1"), 65,
            ["global_step %d" % (a + 1)])
    refused("--since not before --step", common + ["--since", str(b1), "--step", str(a), "--out", wd.file("r2")],
            wd.file("r2"), 65, ["--since %d" % b1, "global_step %d" % a])
    refused("--since the step itself", common + ["--since", str(b), "--out", wd.file("r3")], wd.file("r3"), 65,
            ["--since %d" % b])
    refused("--step not recorded", common + ["--step", str(b + 7), "--out", wd.file("r4")], wd.file("r4"), 65,
            ["global_step %d" % (b + 7)])
    refused("--since with --checkpoint", ["--job", job, "--checkpoint", incs[0][1], "--since", "1", "--out",
                                          wd.file("r5")], wd.file("r5"), 2, ["--since"])
    refused("an incremental --checkpoint", ["--job", job, "--checkpoint", incs[0][1], "--out", wd.file("r6")],
            wd.file("r6"), 65, ["incremental", "--step %d" % a])
    before = {n: open(os.path.join(full[b1], n), "rb").read() for n in ("model.onnx", "tables.json")}
    refused("a delta applied to another step's export", ["--apply", wd.file("delta-%d-%d" % (a, b)), "--to", full[b1]],
            None, 65, ["global_step %d" % b1, "goes from job"])
    assert all(open(os.path.join(full[b1], n), "rb").read() == v for n, v in before.items())
    assert not [f for f in os.listdir(full[b1]) + os.listdir(os.path.join(full[b1], "tables")) if f.startswith(".")]

    # a corrupt link between A and a later step on it (in a copy of the state): its file named, nothing
    # written (the newest checkpoint may be a full one: the end's, when a shard lost track of changes)
    c = max(r[0] for r in recs if incs[1] in chain_of(recs, r[0]))
    state2 = wd.file("state-corrupt")
    shutil.copytree(state, state2)
    link = os.path.join(state2, os.path.relpath(incs[1][1], state))
    with open(link, "r+b") as f:
        f.seek(os.path.getsize(link) - 5)
        f.write(b"\xff\xff")
    common2 = ["--job", job, "--state-dir", state2]
    refused("a corrupt link", common2 + ["--step", str(c), "--out", wd.file("r7"), "--max-inline-rows", "1"],
            wd.file("r7"), 65, [link, "global_step %d" % incs[1][0]])
    refused("a delta over a corrupt link", common2 + ["--since", str(a), "--step", str(c), "--out", wd.file("r8")],
            wd.file("r8"), 65, [link])


if __name__ == "__main__":
    h.main(test)

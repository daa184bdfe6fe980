#!/usr/bin/python3
"""CTR benchmark (docs/performance.md, "Embeddings"): examples/ctr-widedeep.json's model on rows from
`psfleet gen-data`, measured side by side in one run: examples/s and test AUC of psfleet standalone,
1 ps + 1 worker and 2 ps + 2 workers (and 1 ps + 2 workers, the accuracy check), next to the PyTorch
anchor (tests/bench/torch_ctr.py, Debian's python3-torch) on the same model, batch and rows; the
planted model's own AUC on the test rows is the ceiling. With --streaming SIZE_GB it writes one large
file instead and trains 1 ps + 1 worker over all of it once, reporting the worker's peak RSS.

Prints one JSON line per measurement. Usage:
  tests/bench/bench_ctr.py [--build build] [--rows 1000000] [--test-rows 100000] [--epochs 1]
                           [--data DIR] [--modes standalone,1ps+1worker,...] [--no-anchor]
  tests/bench/bench_ctr.py --streaming 2 [--build build]
"""
import argparse, json, os, shutil, subprocess, sys, tempfile, threading, time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))
import harness as h  # noqa: E402  free ports, and every process this run started ended at exit (h.main)
MODES = {"standalone": (0, 1), "1ps+1worker": (1, 1), "1ps+2workers": (1, 2), "2ps+2workers": (2, 2)}


def run(cmd, timeout=3600):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        sys.stderr.write(out.stderr[-3000:])
        raise SystemExit("failed: %s (exit %d)" % (" ".join(cmd), out.returncode))
    return out.stdout


def gen(psfleet, data, rows, test_rows, seed=7):
    train, test = os.path.join(data, "train.tsv.gz"), os.path.join(data, "test.tsv.gz")
    if not (os.path.exists(train + ".meta.json") and os.path.exists(test + ".meta.json")):
        run([psfleet, "gen-data", "--rows", str(rows), "--out", train, "--test-rows", str(test_rows),
             "--test-out", test, "--seed", str(seed)])
    return train, test, json.load(open(test + ".meta.json"))


def job_file(tmp, data, n_ps, n_workers, steps, name):
    job = json.load(open(os.path.join(ROOT, "examples", "ctr-widedeep.json")))
    p = h.free_ports(1 + max(n_ps, 1) + n_workers)
    job["job"] = name
    job["cluster"] = {"chief": ["127.0.0.1:%d" % p[0]], "ps": ["127.0.0.1:%d" % q for q in p[1:1 + max(n_ps, 1)]],
                      "worker": ["127.0.0.1:%d" % q for q in p[1 + max(n_ps, 1):]]}
    job["data"]["dir"] = data
    job["training"]["max_steps"] = steps
    path = os.path.join(tmp, name + ".json")
    json.dump(job, open(path, "w"), indent=1)
    return path


def peak_rss_of(pid_root, name, stop, out):
    """The largest VmHWM (kB) of processes called `name` below pid_root, polled until stop is set."""
    while not stop.is_set():
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                st = open("/proc/%s/status" % d).read()
            except OSError:
                continue
            if ("Name:\t%s\n" % name) in st:
                for l in st.splitlines():
                    if l.startswith("VmHWM:"):
                        out[d] = max(out.get(d, 0), int(l.split()[1]))
        time.sleep(0.2)


def local(psfleet, job, standalone, tmp, watch=None):
    cmd = [psfleet, "local", job, "--quiet"] + (["--standalone"] if standalone else [])
    env = dict(os.environ, TMPDIR=tmp, PSFLEET_TEST_TAG=h.TAG)   # the daemons it starts too: h.main ends what is left
    stop, rss = threading.Event(), {}
    if watch:
        th = threading.Thread(target=peak_rss_of, args=(0, watch, stop, rss), daemon=True)
        th.start()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=7200)
    stop.set()
    if out.returncode != 0:
        sys.stderr.write(out.stderr[-3000:])
        raise SystemExit("failed: %s (exit %d)" % (" ".join(cmd), out.returncode))
    r = json.loads(out.stdout.strip().splitlines()[-1])
    if watch:
        r["peak_rss_mb"] = round(max(rss.values()) / 1024, 1) if rss else None
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rows", type=int, default=1000000)
    ap.add_argument("--test-rows", type=int, default=100000)
    ap.add_argument("--epochs", type=float, default=1)
    ap.add_argument("--data")
    ap.add_argument("--modes", default="standalone,1ps+1worker,1ps+2workers,2ps+2workers")
    ap.add_argument("--no-anchor", action="store_true")
    ap.add_argument("--streaming", type=float, default=0, help="GB of one training file; one worker trains on it")
    a = ap.parse_args()
    psfleet = os.path.join(a.build, "services", "cli", "psfleet")
    tmp = tempfile.mkdtemp(prefix="psfleet-bench-ctr-")
    data = a.data or os.path.join(tmp, "data")
    os.makedirs(data, exist_ok=True)
    job = json.load(open(os.path.join(ROOT, "examples", "ctr-widedeep.json")))
    B = job["training"]["batch_size"]
    try:
        if a.streaming:
            rows = int(a.streaming * 1e9 / 250)   # ~250 bytes a row, uncompressed
            train = os.path.join(data, "train.tsv")
            test = os.path.join(data, "test.tsv.gz")
            if not os.path.exists(train):
                run([psfleet, "gen-data", "--rows", str(rows), "--out", train, "--test-rows", "20000",
                     "--test-out", test, "--seed", "7"])
            size = os.path.getsize(train)
            steps = rows // B   # one pass over the whole file
            jf = job_file(tmp, data, 1, 1, steps, "ctr-stream")
            j = json.load(open(jf))
            j["data"]["train_files"] = ["train.tsv"]
            json.dump(j, open(jf, "w"))
            r = local(psfleet, jf, False, tmp, watch="workerd")
            r.update({"mode": "streaming", "file_bytes": size})
            print(json.dumps(r), flush=True)
            return
        train, test, meta = gen(psfleet, data, a.rows, a.test_rows)
        print(json.dumps({"planted_auc": meta["planted_auc"], "rows": a.rows, "test_rows": a.test_rows}), flush=True)
        for mode in a.modes.split(","):
            n_ps, n_w = MODES[mode]
            steps = int(a.epochs * a.rows / B)
            jf = job_file(tmp, data, n_ps, n_w, steps, "ctr-" + mode.replace("+", "-"))
            r = local(psfleet, jf, n_ps == 0, tmp)
            r["mode_name"] = mode
            r["auc_gap"] = round(meta["planted_auc"] - r.get("test_auc", 0), 4)
            print(json.dumps(r), flush=True)
        if not a.no_anchor:
            try:
                import torch  # noqa: F401
            except ImportError:
                print(json.dumps({"mode_name": "pytorch", "skipped": "python3-torch not installed"}), flush=True)
                return
            out = run(["/usr/bin/python3", os.path.join(HERE, "torch_ctr.py"), "--job",
                       os.path.join(ROOT, "examples", "ctr-widedeep.json"), "--train", train, "--test", test,
                       "--steps", str(int(a.epochs * a.rows / B))])
            r = json.loads(out.strip().splitlines()[-1])
            r["mode_name"] = "pytorch"
            print(json.dumps(r), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True) if not a.data else None


if __name__ == "__main__":
    h.main(main)

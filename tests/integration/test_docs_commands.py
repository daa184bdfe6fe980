"""The README's and docs/operations.md's command blocks, run as written against local jobs.

Every ```sh block of those files is either marked, on the line before it, or listed in SKIPPED below
with the reason it is not run here (systemd, packages, several hosts); a block that is neither fails
the test, as does a SKIPPED entry that no longer names a block, so that a new block must be placed.

  <!-- test: run -->      each line runs in order, in a scratch directory holding `examples/` (a link to
                          the source tree's); `psfleet local` without --max-steps gets --max-steps 300
                          (the demo shortened, said in the log)
  <!-- test: running -->  the same, while `psfleet local examples/fmnist-mlp.json` runs in the
                          background (started before, answering `psfleet status` by its name)

Each line must exit 0 (a `psfleet stop` line also ends the background job, which exits 75) and print
what its command prints when it works (CHECKS). The commands find `psfleet` on PATH (the build's) and
the local jobs' records in a runtime directory of the test's own (XDG_RUNTIME_DIR).
"""
import os
import re
import subprocess
import time

import harness as h

DOCS = ["README.md", "docs/operations.md"]

# (document, the block's first line up to its comment): why it is not run here.
SKIPPED = {
    ("README.md", "psfleet gen-data --rows 1000000 --out /var/tmp/psfleet-ctr/train.tsv.gz  --test-rows 100000 "
                  "--test-out /var/tmp/psfleet-ctr/test.tsv.gz"):
        "writes 275 MB of rows and trains a minute; integration.sparse_job runs that job on the same data",
    ("README.md", "/usr/bin/python3 examples/models/export.py --out examples/models"):
        "writes into the source tree and trains on /var/tmp/psfleet-ctr's rows; integration.graph_models trains "
        "the three CTR examples through real daemons on rows of its own",
    ("README.md", "./run-demo.sh"):
        "installs packages and builds from scratch; tests/run.sh is the suite itself (.ci/run runs it)",
    ("docs/operations.md", "node1# apt install ./psfleet-common_*.deb ./psfleet-chiefd_*.deb ./psfleet-psd_*.deb ./psfleet_*.deb"):
        "installs the .deb packages on three hosts (the system test installs them in a container)",
    ("docs/operations.md", "psfleet placement /etc/psfleet/jobs/fmnist.json"):
        "reads /etc/psfleet/jobs/fmnist.json, the example cluster's job file as installed on its nodes",
    ("docs/operations.md", "systemctl edit psfleet-workerd@fmnist:1.service"): "needs systemd and the units",
    ("docs/operations.md", "psfleet check /etc/psfleet/jobs/fmnist.json"):
        "checks the example cluster's installed job file (integration.check runs psfleet check on 16 broken files)",
    ("docs/operations.md", "node1# systemctl start psfleet-psd@fmnist:0 psfleet-chiefd@fmnist"):
        "needs systemd on three hosts",
    ("docs/operations.md", "psfleet status --job /etc/psfleet/jobs/fmnist.json"):
        "asks the example cluster's chief at 10.0.0.1 through its installed job file",
    ("docs/operations.md", "node1# systemctl stop psfleet-chiefd@fmnist"): "needs systemd and the units",
    ("docs/operations.md", "node2# systemctl enable psfleet-psd@fmnist:1 psfleet-workerd@fmnist:0 psfleet.target"):
        "needs systemd and the units",
    ("docs/operations.md", "journalctl -u 'psfleet-*' JOB=fmnist"): "reads the journal of a node running the units",
    ("docs/operations.md", "sbatch examples/slurm/psfleet.sbatch /shared/psfleet/fmnist.json /shared/psfleet/state"):
        "needs a Slurm cluster; integration.run resolves a 2-node step from faked SLURM_* variables",
    # "Three nodes, step by step": system.multinode runs these, in three containers
    ("docs/operations.md", "admin$ psfleet placement fmnist.json"): "copies the job file to three hosts over ssh",
    ("docs/operations.md", "admin$ psfleet certs --job fmnist.json --dir tls"):
        "copies the certificates to three hosts over ssh",
    ("docs/operations.md", "node1# systemctl enable -q psfleet-psd@fmnist:0 psfleet-chiefd@fmnist psfleet.target && "
                           "systemctl start psfleet-psd@fmnist:0 psfleet-chiefd@fmnist"): "needs systemd on three hosts",
    ("docs/operations.md", "node1# psfleet status --identity viewer --job /etc/psfleet/jobs/fmnist.json"):
        "asks the example cluster's chief through its installed job file and the viewer's certificate",
    ("docs/operations.md", "node1# systemctl disable -q --now psfleet-psd@fmnist:0 psfleet-chiefd@fmnist"):
        "needs systemd on three hosts",
    ("docs/operations.md", "psfleet certs --job fmnist.json --dir tls --k8s-secrets - | kubectl apply -f -"):
        "needs kubectl and a cluster; system.k8s makes the Secrets the same way (--k8s-secrets) and mounts "
        "each role's as the manifest does; integration.manifests validates them",
    ("docs/operations.md", "deploy/container/build-image.sh build/packages"):
        "pulls debian:bookworm-slim from a registry and pushes to one (none can be reached here)",
    ("docs/operations.md", "podman import /var/cache/psfleet-test/rootfs-bookworm-*.tar localhost/debian:bookworm-local"):
        "builds an image as root with podman; system.k8s does it, in a podman storage of its own",
}

# What a command prints when it works: (pattern of the line, pattern its output must hold).
CHECKS = [
    (r"psfleet local .*--standalone", r'"mode": "standalone"'),
    (r"psfleet local ", r'"global_step": \d+.*"mode": "distributed"'),
    (r"psfleet placement ", r"dense"),
    (r"psfleet status ", r"job fmnist-mlp: "),
    (r"psfleet checkpoints list .*--state-dir", r"checkpoints? recorded \(offline: read from .*fmnist-state"),
    (r"psfleet checkpoints list ", r"checkpoints? in .*\n.*STEP"),
    (r"psfleet watch ", r"done"),
    (r"psfleet export ", r"exported job \S+ at global_step \d+ .* to \S+/model\.onnx"),
    (r"psfleet stop ", r"the chief is stopping the job"),
    (r"(\w+=('[^']*'|\S+) )*psfleet run .*--dry-run", r'^\{"cluster":\{"chief":\[.*\]\},"task":\{"type":"\w+","index":\d+\},"exec":\["/'),
]

BACKGROUND_STEPS = 5000         # a running block's job: long enough for its commands, short for watch
STOPPED_STEPS = 1000000         # one that a `psfleet stop` ends
EX_TEMPFAIL = 75


def blocks(doc):
    """(marker or None, first line, [command lines]) for each ```sh block of doc."""
    with open(os.path.join(h.SOURCE_DIR, doc)) as f:
        text = f.read()
    out = []
    for m in re.finditer(r"^([ \t]*)```sh\n(.*?)^\1```", text, re.S | re.M):
        before = [l.strip() for l in text[:m.start()].splitlines() if l.strip()]
        mark = re.fullmatch(r"<!-- test: (\w+) -->", before[-1]) if before else None
        lines, cont = [], ""
        for l in m.group(2).splitlines():
            l = l.strip()
            if l.endswith("\\"):
                cont += l[:-1] + " "
                continue
            l, cont = cont + l, ""
            if l and not l.startswith("#"):
                lines.append(l)
        first = lines[0].split("  #")[0].strip() if lines else ""
        out.append((mark.group(1) if mark else None, first, lines))
    return out


def env_for(wd):
    cli = os.path.dirname(h.BIN["psfleet"])
    return h.child_env({"PATH": cli + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin"),
                        "XDG_RUNTIME_DIR": wd.file("xdg"), "TMPDIR": wd.path}, wd)


def shortened(line):
    if re.match(r"psfleet local ", line) and "--max-steps" not in line:
        cmd, sep, comment = line.partition("  #")
        line = cmd.rstrip() + " --max-steps 300" + ("  " + sep + comment if sep else "")
        h.log("shortened to 300 steps:", line)
    return line


def run_line(wd, line):
    t = time.monotonic()
    p = subprocess.run(["bash", "-c", line], cwd=wd.file("cwd"), env=env_for(wd), stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=60)
    out = p.stdout + p.stderr
    h.log("$ %s  -> %d in %.1f s\n%s" % (line, p.returncode, time.monotonic() - t, out[-1500:]))
    assert p.returncode == 0, "%r exited %d:\n%s" % (line, p.returncode, out)
    for pat, want in CHECKS:
        if re.match(pat, line):
            assert re.search(want, out), "%r: expected /%s/ in its output:\n%s" % (line, want, out)
            break


def start_background(wd, steps):
    """`psfleet local` of the demo job in the background, once `psfleet status --job fmnist-mlp` answers."""
    p = h.Proc(wd, "psfleet-local-bg-%d" % steps, [h.BIN["psfleet"], "local", h.EXAMPLE, "--max-steps", str(steps)],
               env_for(wd), stdout_to_log=False)
    end = time.monotonic() + 60
    while True:
        assert p.alive(), "psfleet local ended early:\n" + p.stderr()
        r = subprocess.run([h.BIN["psfleet"], "status", "--job", "fmnist-mlp", "--json"], env=env_for(wd),
                           capture_output=True, text=True)
        if r.returncode == 0 and '"training"' in r.stdout:
            said = re.search(r"psfleet: job fmnist-mlp: chief at 127\.0\.0\.1:\d+ \(mutual TLS\), state in (\S+).*"
                             r"`psfleet status --job fmnist-mlp` finds it", p.stderr())
            assert said and os.path.isdir(said.group(1)), "psfleet local did not say where its job is:\n" + p.stderr()
            return p
        assert time.monotonic() < end, "the local job did not answer by its name within 60 s:\n%s%s" % (
            r.stderr, p.stderr())
        time.sleep(0.2)


def test():
    h.require("psd", "workerd", "chiefd", "psfleet")
    wd = h.Workdir()
    os.makedirs(wd.file("cwd"))
    os.symlink(os.path.join(h.SOURCE_DIR, "examples"), wd.file("cwd/examples"))
    found, ran = set(), 0
    for doc in DOCS:
        for mark, first, lines in blocks(doc):
            key = (doc, first)
            if mark is None:
                assert key in SKIPPED, "%s: the block %r is neither marked (<!-- test: run|running -->) nor in " \
                                       "SKIPPED with a reason" % (doc, first)
                found.add(key)
                h.log("skipped: %s: %s: %s" % (doc, first, SKIPPED[key]))
                continue
            assert mark in ("run", "running"), "%s: unknown marker %r before %r" % (doc, mark, first)
            h.log("%s: a %r block: %s" % (doc, mark, first))
            bg = None
            if mark == "running":
                stops = any(l.startswith("psfleet stop ") for l in lines)
                bg = start_background(wd, STOPPED_STEPS if stops else BACKGROUND_STEPS)
            for line in lines:
                run_line(wd, shortened(line))
            if bg:
                # done (watch followed it to the end), or stopped in order by the block's `psfleet stop`
                rc = bg.wait(60)
                want = EX_TEMPFAIL if stops else 0
                assert rc == want, "the background job exited %d, expected %d:\n%s" % (rc, want, bg.stderr())
                assert not os.listdir(wd.file("xdg/psfleet/local")), "psfleet local left its record behind"
            ran += 1
    stale = set(SKIPPED) - found
    assert not stale, "SKIPPED names blocks that are gone: %s" % sorted(stale)
    assert ran >= 4, "only %d blocks ran" % ran
    h.log("%d blocks ran, %d skipped with their reasons" % (ran, len(found)))


if __name__ == "__main__":
    h.main(test)

"""psfleet run, as Kubernetes and Slurm start it.

1. A real job of 1 ps + 1 worker + the chief, each task started as `psfleet run JOB.json` with only
   TF_CONFIG as the training-operator sets it (the same cluster for every pod, the pod's own task,
   "environment": "cloud"); the job file's cluster is deliberately wrong, so the job can only train
   through TF_CONFIG's. Each run becomes its daemon (exec: the process is psd, workerd, chiefd); the
   demo trains to its end and its usual short-run accuracy (>= 0.80 after 2000 steps, as
   integration.accuracy asks); SIGTERM stops ps and chief with status 0.
2. The Slurm resolution, dry: four tasks on two nodes (SLURM_STEP_NODELIST node[01-02], 2 tasks each)
   for --ps 1 --workers 2: every rank prints the same cluster, ranks in sorted role order over the
   node list (chief, ps on node01; the workers on node02), ports 8888 + the task's index on its node,
   each task half of the node's two GPUs; the TF_CONFIG handed to the daemon is the printed one.
3. Bad input exits 78 at once, naming the variable and the reason, and starts nothing.
4. --exit-codes kubernetes: a psd whose port is taken exits 75, which psfleet run turns into 138 (the
   training-operator's retryable code; without the option the status stays 75); SIGTERM is passed on
   and ends the daemon with 0.
5. The sbatch script of docs/operations.md is examples/slurm/psfleet.sbatch's, and bash parses it.
6. deploy/kubernetes's manifests (not run on a cluster): each replica's command, run dry with its job
   file from the ConfigMap and, for the TFJob, the TF_CONFIG the operator would give that pod, resolves
   to that replica's task."""
import json
import os
import re
import socket
import sqlite3
import subprocess

import harness as h

STEPS = 2000


def tf_config(cluster, task_type, index=0):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}, "environment": "cloud"})


def proc_name(pid):
    with open("/proc/%d/comm" % pid) as f:
        return f.read().strip()


def clean_env(env, wd=None):
    """The child's environment with only env's SLURM_* and CUDA_VISIBLE_DEVICES (none of ours)."""
    e = h.child_env(env, wd)
    for k in [k for k in e if k.startswith("SLURM_") or k == "CUDA_VISIBLE_DEVICES"]:
        if k not in env:
            del e[k]
    return e


def run_dry(job, args, env):
    return subprocess.run([h.BIN["psfleet"], "run", job] + args + ["--dry-run"], capture_output=True, text=True,
                          env=clean_env(env), timeout=30)


def test_operator_tf_config(wd):
    # TF_CONFIG carries the cluster (fresh loopback ports); the job file's points where nothing can run
    job, spec = h.make_job(wd, n_ps=1, n_workers=1, training={"max_steps": STEPS})
    cluster = spec["cluster"]
    spec["cluster"] = {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"], "worker": ["127.0.0.1:3"]}
    with open(job, "w") as f:
        json.dump(spec, f)
    state = wd.file("state")

    def run(task_type):
        return h.Proc(wd, "run-" + task_type, [h.BIN["psfleet"], "run", job, "--state-dir", state],
                      {"TF_CONFIG": tf_config(cluster, task_type)})

    ps = run("ps")
    h.wait_healthy(cluster["ps"][0], ps)
    chief = run("chief")
    h.wait_healthy(cluster["chief"][0], chief)
    worker = run("worker")
    # psfleet run became each daemon: the same process, under the daemon's name
    for p, name in ((ps, "psd"), (chief, "chiefd"), (worker, "workerd")):
        h.wait_for("%s to exec %s" % (p.name, name), lambda: proc_name(p.pid) == name, 10, [p])
    # The job's end ends every task: the worker at max_steps, psd on the chief's Stop, and the chief
    # itself (psfleet run passes --exit-at-end), as a Slurm step or a TFJob's chief pod must.
    for p in (worker, chief, ps):
        assert p.wait(240) == 0, p.stderr()[-3000:]
    assert "The job has ended (done): exiting (--exit-at-end)" in chief.stderr(), chief.stderr()[-3000:]
    con = sqlite3.connect("file:%s?mode=ro" % os.path.join(state, spec["job"], "chief.db"), uri=True)
    state_no, step, acc = con.execute("SELECT state, global_step, test_accuracy FROM job").fetchone()
    con.close()
    h.log("chief.db: state %d, global_step %d, test accuracy %.4f" % (state_no, step, acc))
    assert state_no == 6, state_no   # JOB_STATE_DONE
    assert step >= STEPS, step
    assert acc >= 0.80, acc


def test_slurm_dry_run(wd):
    job, _ = h.make_job(wd, n_ps=1, n_workers=1)
    base = {"SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NODELIST": "node[01-02]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
            "SLURM_STEP_GPUS": "0,1"}
    want_cluster = {"chief": ["node01:8888"], "ps": ["node01:8889"], "worker": ["node02:8888", "node02:8889"]}
    want = [("chief", 0, "chiefd", "0"), ("ps", 0, "psd", "1"), ("worker", 0, "workerd", "0"),
            ("worker", 1, "workerd", "1")]
    for rank in range(4):
        r = run_dry(job, ["--slurm", "--ps", "1", "--workers", "2"], dict(base, SLURM_PROCID=str(rank)))
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert len(lines) == 1, r.stdout
        out = json.loads(lines[0])
        h.log("rank %d: %s" % (rank, lines[0]))
        task_type, index, daemon, gpus = want[rank]
        assert out["cluster"] == want_cluster, out
        assert out["task"] == {"type": task_type, "index": index}, out
        assert os.path.basename(out["exec"][0]) == daemon and os.access(out["exec"][0], os.X_OK), out
        assert out["exec"][1:3] == ["--job", job], out
        assert ("--task-index" in out["exec"]) == (task_type != "chief"), out
        assert ("--exit-at-end" in out["exec"]) == (task_type == "chief"), out
        if task_type != "chief":
            assert out["exec"][out["exec"].index("--task-index") + 1] == str(index), out
        assert out["env"]["CUDA_VISIBLE_DEVICES"] == gpus, out
        assert json.loads(out["env"]["TF_CONFIG"]) == {"cluster": out["cluster"], "task": out["task"]}, out
    # another port base and an evaluator: one more task, sorted in after the chief
    r = run_dry(job, ["--slurm", "--ps", "1", "--workers", "1", "--evaluator", "--port-base", "7000",
                      "--state-dir", "/st", "--listen", "0.0.0.0:7000"], dict(base, SLURM_PROCID="2"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["exec"][1:] == ["--job", job, "--task-index", "0", "--state-dir", "/st", "--listen", "0.0.0.0:7000"], out
    assert out["cluster"] == {"chief": ["node01:7000"], "ps": ["node02:7000"], "worker": ["node02:7001"],
                              "evaluator": ["node01:7001"]}, out
    assert out["task"] == {"type": "ps", "index": 0}, out
    # the evaluator's rank: chiefd --evaluator (tests/integration/test_evaluator.py runs one)
    r = run_dry(job, ["--slurm", "--ps", "1", "--workers", "1", "--evaluator", "--port-base", "7000"],
                dict(base, SLURM_PROCID="1"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["task"] == {"type": "evaluator", "index": 0}, out
    assert os.path.basename(out["exec"][0]) == "chiefd" and out["exec"][1:] == ["--job", job, "--evaluator"], out


def test_bad_input(wd):
    job, spec = h.make_job(wd, n_ps=1, n_workers=1)
    cl = spec["cluster"]
    slurm = {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NODELIST": "node[01-02]",
             "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}
    s2 = ["--slurm", "--ps", "1", "--workers", "2"]
    cases = [
        ({"TF_CONFIG": "{not json"}, [], ["TF_CONFIG", "line 1"]),
        ({"TF_CONFIG": tf_config(cl, "boss")}, [], ["TF_CONFIG", "task.type", "\"boss\" is not one of"]),
        ({"TF_CONFIG": tf_config(cl, "worker", 3)}, [], ["TF_CONFIG", "task.index: 3 is out of range"]),
        ({"TF_CONFIG": tf_config(dict(cl, evaluator=["127.0.0.1:1"]), "evaluator", 1)}, [],
         ["TF_CONFIG", "task.index: 1 is out of range: cluster has 1 evaluator task"]),
        ({"TF_CONFIG": tf_config(dict(cl, evaluator=["127.0.0.1:1", "127.0.0.1:2"]), "evaluator")}, [],
         ["TF_CONFIG", "cluster.evaluator: must have at most 1 entry, has 2"]),
        ({"TF_CONFIG": json.dumps({"sparseCluster": {"ps": ["127.0.0.1:9"]}, "task": {"type": "ps", "index": 0}})},
         [], ["TF_CONFIG", "sparseCluster.ps[0]", "disagrees with the job file's cluster.ps[0]"]),
        ({"TF_CONFIG": json.dumps({"task": {"type": "ps", "index": 0}})}, ["--job-name", "worker", "--task-index", "0"],
         ["disagrees with TF_CONFIG's task"]),
        (dict(slurm, SLURM_STEP_NUM_TASKS="3", SLURM_STEP_TASKS_PER_NODE="2,1"), s2,
         ["Slurm", "need 4 tasks, the step has 3"]),
        (dict(slurm, SLURM_STEP_NODELIST="node[01-02"), s2, ["SLURM_STEP_NODELIST", "'[' without ']'"]),
        (dict(slurm, SLURM_STEP_TASKS_PER_NODE="2(x2"), s2, ["SLURM_STEP_TASKS_PER_NODE", "N(xR)"]),
        ({k: v for k, v in slurm.items() if k != "SLURM_PROCID"}, s2, ["SLURM_PROCID", "not set"]),
        ({}, [], ["which task is this"]),
    ]
    for env, args, must in cases:
        for dry in (True, False):
            argv = [h.BIN["psfleet"], "run", job] + args + (["--dry-run"] if dry else [])
            r = subprocess.run(argv, capture_output=True, text=True, env=clean_env(env, wd), timeout=30)
            assert r.returncode == 78, "%s %s: exit %d\n%s" % (env, args, r.returncode, r.stderr)
            assert r.stdout == "", r.stdout
            for m in must:
                assert m in r.stderr, "%r not in: %s" % (m, r.stderr)
        h.log("78:", r.stderr.strip())


def test_exit_codes_kubernetes(wd):
    job, spec = h.make_job(wd, name="k8s.json", n_ps=1, n_workers=1)
    ps_port = int(spec["cluster"]["ps"][0].rsplit(":", 1)[1])
    argv = [h.BIN["psfleet"], "run", job, "--job-name", "ps", "--task-index", "0", "--state-dir", wd.file("k8s")]
    taken = socket.socket()
    taken.bind(("127.0.0.1", ps_port))
    taken.listen(1)
    try:
        for extra, want in (([], 75), (["--exit-codes", "kubernetes"], 138)):
            p = h.Proc(wd, "run-ps-taken-%d" % want, argv + extra)
            rc = p.wait(30)
            assert rc == want, "exit %d, expected %d:\n%s" % (rc, want, p.stderr())
            assert "Address already in use" in p.stderr(), p.stderr()
        assert "exiting 138, which the training-operator retries" in p.stderr(), p.stderr()
    finally:
        taken.close()
    # the parent passes SIGTERM on; the psd (uninitialized: nothing to pull) stops at once with 0
    p = h.Proc(wd, "run-ps-k8s", argv + ["--exit-codes", "kubernetes"])
    h.wait_healthy(spec["cluster"]["ps"][0], p)
    assert proc_name(p.pid) == "psfleet", "not the daemon's parent"
    p.kill()
    assert p.wait(30) == 0, p.stderr()


def test_sbatch_script():
    script = os.path.join(h.SOURCE_DIR, "examples", "slurm", "psfleet.sbatch")
    subprocess.run(["bash", "-n", script], check=True)
    with open(script) as f:
        lines = {l.split("  #")[0].strip() for l in f}
    with open(os.path.join(h.SOURCE_DIR, "docs", "operations.md")) as f:
        doc = f.read()
    block = re.search(r"```bash\n(#SBATCH --job-name=psfleet.*?)```", doc, re.S).group(1)
    for l in block.splitlines():
        l = l.split("  #")[0].strip()
        assert l in lines, "docs/operations.md's sbatch line %r is not in %s" % (l, script)


def test_manifests(wd):
    import yaml
    d = os.path.join(h.SOURCE_DIR, "deploy", "kubernetes")
    checked = 0
    for name in ("tfjob.yaml", "statefulset.yaml"):
        with open(os.path.join(d, name)) as f:
            docs = list(yaml.safe_load_all(f))
        cm = next(x for x in docs if x["kind"] == "ConfigMap")
        job = wd.file(name + ".json")
        with open(job, "w") as f:
            f.write(cm["data"]["fmnist.json"])
        if name == "tfjob.yaml":
            spec = next(x for x in docs if x["kind"] == "TFJob")["spec"]["tfReplicaSpecs"]
            # as the operator writes it: every replica type's pods by service name, port 2222
            cluster = {rt.lower(): ["fmnist-%s-%d.default.svc:2222" % (rt.lower(), i) for i in range(r["replicas"])]
                       for rt, r in spec.items()}
            pods = [(rt.lower(), i, r["template"]["spec"]["containers"][0], {"TF_CONFIG": tf_config(cluster, rt.lower(), i)})
                    for rt, r in spec.items() for i in range(r["replicas"])]
        else:
            pods = []
            for ss in (x for x in docs if x["kind"] == "StatefulSet"):
                role = ss["spec"]["selector"]["matchLabels"]["psfleet/role"]
                for i in range(ss["spec"]["replicas"]):
                    pods.append((role, i, ss["spec"]["template"]["spec"]["containers"][0], {}))
        for role, i, c, env in pods:
            argv = [job if a == "/etc/psfleet/jobs/fmnist.json" else a.replace("$(POD_INDEX)", str(i))
                    for a in c["command"]]
            assert argv[:2] == ["psfleet", "run"], argv
            r = subprocess.run([h.BIN["psfleet"]] + argv[1:] + ["--dry-run"], capture_output=True, text=True,
                               env=clean_env(env), timeout=30)
            assert r.returncode == 0, "%s %s:%d: exit %d\n%s" % (name, role, i, r.returncode, r.stderr)
            out = json.loads(r.stdout)
            assert out["task"] == {"type": role, "index": i}, (name, out)
            assert "--listen" in out["exec"], out
            checked += 1
    assert checked == 8, checked


def test():
    h.require("psd", "workerd", "chiefd", "psfleet")
    h.plain_rpc()   # its readiness probes are plain gRPC health checks (the TLS default: integration.local_secure)
    wd = h.Workdir()
    test_manifests(wd)
    test_sbatch_script()
    test_slurm_dry_run(wd)
    test_bad_input(wd)
    test_exit_codes_kubernetes(wd)
    test_operator_tf_config(wd)


if __name__ == "__main__":
    h.main(test)

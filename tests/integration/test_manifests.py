"""deploy/kubernetes/ against the Kubernetes API schema, offline (issue 29).

PyPI's kubernetes-validate (in <build>/pyenv, pyenv.py) bundles the OpenAPI schemas of Kubernetes'
built-in kinds and validates strictly (a field the schema does not know is an error), for Kubernetes
1.28 (the oldest the StatefulSet variant works with: its pods' apps.kubernetes.io/pod-index label) and
the newest version the tool knows:
- statefulset.yaml: every document (Service, ConfigMap, StatefulSets);
- tfjob.yaml: the ConfigMap and the PersistentVolumeClaim; the TFJob (kubeflow.org/v1, a custom
  resource) is not in the core schema and the training-operator's CRD is not available here, so its
  own fields are NOT checked against a schema: each replica's pod template is checked as a core
  PodTemplate (its containers, volumes and mounts are core objects), and the TFJob's own fields
  against the values the operator's API documents (replica types, restart policies, cleanPodPolicy);
- `psfleet certs --k8s-secrets` on the manifests' job file: each Secret valid, and each pod template's
  projected volume made of them, with only the CA's certificate and its own role's keys.
Also: the tool itself rejects a manifest with an unknown field and with a wrongly typed one, so a pass
means something."""
import copy
import os

import harness as h
import pyenv

OLDEST = "1.28.0"
REPLICA_TYPES = {"Chief", "Master", "PS", "Worker", "Evaluator"}
RESTART_POLICIES = {"Always", "OnFailure", "Never", "ExitCode"}
CLEAN_POD_POLICIES = {"All", "Running", "None"}


def check(kv, doc, what, versions):
    for v in versions:
        try:
            kv.validate(doc, v, True)
        except kv.ValidationError as e:
            raise AssertionError("%s against Kubernetes %s: %s" % (what, v, e))


def test():
    pyenv.ensure()
    import yaml
    import kubernetes_validate as kv
    from kubernetes_validate import utils as kvu
    from importlib.metadata import version

    newest = kvu.latest_version()
    versions = [OLDEST, newest]
    h.log("kubernetes-validate", version("kubernetes-validate"), "; Kubernetes", ", ".join(versions))

    d = os.path.join(h.SOURCE_DIR, "deploy", "kubernetes")
    checked = []
    for name in ("statefulset.yaml", "tfjob.yaml"):
        with open(os.path.join(d, name)) as f:
            docs = [x for x in yaml.safe_load_all(f) if x]
        for doc in docs:
            what = "%s: %s %s" % (name, doc["kind"], doc["metadata"]["name"])
            if doc["apiVersion"] == "kubeflow.org/v1" and doc["kind"] == "TFJob":
                spec = doc["spec"]
                assert set(spec) <= {"runPolicy", "tfReplicaSpecs", "successPolicy", "enableDynamicWorker"}, what
                assert spec["runPolicy"].get("cleanPodPolicy", "Running") in CLEAN_POD_POLICIES, what
                for rt, rs in spec["tfReplicaSpecs"].items():
                    assert rt in REPLICA_TYPES, (what, rt)
                    assert set(rs) <= {"replicas", "restartPolicy", "template"}, (what, rt)
                    assert isinstance(rs["replicas"], int) and rs["replicas"] >= 1, (what, rt)
                    assert rs.get("restartPolicy", "Never") in RESTART_POLICIES, (what, rt)
                    # the operator finds the TensorFlow container by this name, and its port by tfjob-port
                    c = [c for c in rs["template"]["spec"]["containers"] if c["name"] == "tensorflow"]
                    assert len(c) == 1 and any(p["name"] == "tfjob-port" for p in c[0]["ports"]), (what, rt)
                    tmpl = {"apiVersion": "v1", "kind": "PodTemplate",
                            "metadata": {"name": "%s-%s" % (doc["metadata"]["name"], rt.lower())},
                            "template": rs["template"]}
                    check(kv, tmpl, "%s: %s's pod template" % (what, rt), versions)
                    checked.append("%s %s template" % (name, rt))
                continue
            check(kv, doc, what, versions)
            checked.append("%s %s/%s" % (name, doc["kind"], doc["metadata"]["name"]))

    # the tool catches what it should: an unknown field, a wrong type, a TFJob given to it whole
    ss = next(x for x in yaml.safe_load_all(open(os.path.join(d, "statefulset.yaml"))) if x["kind"] == "StatefulSet")
    bad = copy.deepcopy(ss)
    bad["spec"]["template"]["spec"]["containers"][0]["comand"] = ["psfleet"]
    bad2 = copy.deepcopy(ss)
    bad2["spec"]["replicas"] = "two"
    for b, why in ((bad, "an unknown field"), (bad2, "a string for replicas")):
        try:
            kv.validate(b, newest, True)
        except kv.ValidationError:
            continue
        raise AssertionError("kubernetes-validate accepted %s" % why)
    tfjob = next(x for x in yaml.safe_load_all(open(os.path.join(d, "tfjob.yaml"))) if x["kind"] == "TFJob")
    try:
        kv.validate(tfjob, newest, True)
        raise AssertionError("kubernetes-validate has a schema for TFJob: validate it whole")
    except kv.SchemaNotFoundError:
        pass
    h.log("valid:", "; ".join(checked))
    assert len(checked) == 10, checked
    secrets(kv, yaml, versions, d)


def secrets(kv, yaml, versions, d):
    """psfleet certs --k8s-secrets on the manifests' own job file: every Secret valid, every Secret a pod
    template mounts among them, each role's projected volume holding only the CA's certificate and that
    role's keys."""
    import base64
    import subprocess
    h.require_built("psfleet")
    wd = h.Workdir()
    docs = [x for name in ("statefulset.yaml", "tfjob.yaml") for x in yaml.safe_load_all(open(os.path.join(d, name)))
            if x]
    cm = next(x for x in docs if x["kind"] == "ConfigMap")
    job = wd.file("fmnist.json")
    with open(job, "w") as f:
        f.write(cm["data"]["fmnist.json"])
    out = wd.file("secrets.yaml")
    r = subprocess.run([h.BIN["psfleet"], "certs", "--job", job, "--dir", wd.file("tls"), "--k8s-secrets", out],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert os.stat(out).st_mode & 0o777 == 0o600
    made = {x["metadata"]["name"]: x for x in yaml.safe_load_all(open(out)) if x}
    for name, sec in made.items():
        check(kv, sec, "psfleet certs' Secret %s" % name, versions)
        for k, v in sec["data"].items():
            with open(os.path.join(wd.file("tls"), "fmnist", k), "rb") as f:
                assert base64.b64decode(v) == f.read(), (name, k)
    assert sorted(made) == ["fmnist-tls-ca", "fmnist-tls-chief", "fmnist-tls-ps-0", "fmnist-tls-worker-0",
                            "fmnist-tls-worker-1"], sorted(made)
    assert not any("ca.key" in sec["data"] for sec in made.values())
    # the pods' volumes: in a TFJob's replica specs and in the StatefulSets
    pods = [(rt.lower(), rs["template"]["spec"]) for x in docs if x["kind"] == "TFJob"
            for rt, rs in x["spec"]["tfReplicaSpecs"].items()]
    pods += [(x["metadata"]["name"].split("-")[-1], x["spec"]["template"]["spec"]) for x in docs
             if x["kind"] == "StatefulSet"]
    for role, spec in pods:
        v = next(v for v in spec["volumes"] if v["name"] == "tls")
        keys = []
        for src in v["projected"]["sources"]:
            assert src["secret"]["name"] in made, (role, src)
            keys += list(made[src["secret"]["name"]]["data"])
        assert len(keys) == len(set(keys)), (role, keys)
        assert all(k == "ca.crt" or k.startswith(role) for k in keys), (role, keys)
        assert "ca.crt" in keys and any(k.endswith(".key") for k in keys), (role, keys)
    h.log("psfleet certs --k8s-secrets: %d Secrets valid; %d pod templates mount only theirs"
          % (len(made), len(pods)))


if __name__ == "__main__":
    h.main(test)

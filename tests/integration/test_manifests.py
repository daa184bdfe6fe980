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
  against the values the operator's API documents (replica types, restart policies, cleanPodPolicy).
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


if __name__ == "__main__":
    h.main(test)

#!/usr/bin/env bash
# system.k8s  issue 29: the Kubernetes contract as far as a machine without a cluster allows.
#  1. psfleet's image is built by deploy/container/build-image.sh from the .debs (PKGDIR), on a Debian 12
#     base imported from the debootstrap root filesystem rootfs.sh caches (no registry can be reached);
#     apt inside installs the .debs' dependencies and the data from the host's mirror.
#  2. Every replica of deploy/kubernetes/tfjob.yaml runs as a container from that image, as the
#     training-operator would start its pod: the replica's own arguments after the image's ENTRYPOINT
#     (`psfleet run`, which the manifest's `command:` names), TF_CONFIG in the shape the operator writes
#     (cluster of JOB-ROLE-I.NAMESPACE.svc:PORT, the pod's task, "environment": "cloud"), those names as
#     network aliases on one podman network (what a pod's DNS name is), the ConfigMap's job file, each
#     role's projected volume of the Secrets that `psfleet certs --k8s-secrets` wrote (as the
#     manifest's comment says; no pod gets another role's key) and the chief's claim mounted where the
#     manifest mounts them.
#  3. The chief exits 0 at the end of the job (DONE in its records, test accuracy >= 0.87), and so does
#     every other container.
# Not run: a Kubernetes cluster, the training-operator, its restart policy, kubectl applying the Secrets.
#
#   k8s_test.sh PKGDIR       (root, podman and runc; exits 77 without root or podman)
#
# Podman on these machines (Debian 12's podman 4.3; PID 1 is not systemd; cgroups are hybrid, v1
# controllers with v2 at /sys/fs/cgroup/unified), found by trying:
#  - crun (podman's default runtime) refuses hybrid cgroups ("cgroups in hybrid mode not supported, drop
#    all controllers from cgroupv2"), with --cgroups=disabled too; runc runs: runtime = "runc".
#  - the process lacks CAP_SYS_RESOURCE, so podman's default RLIMIT_NOFILE (1048576) and RLIMIT_NPROC
#    cannot be set ("error setting rlimit type 7: operation not permitted"): RLIMIT_NOFILE is this
#    shell's hard limit; RLIMIT_NPROC at this shell's hard limit (96362) is refused too, as is 65536,
#    while 32768 is accepted: at most 32768. Both go in default_ulimits (one --ulimit on the command
#    line drops the other defaults back to podman's).
#  - cgroup_manager = "cgroupfs" (no systemd to ask).
# Those go into a containers.conf of the test's own (CONTAINERS_CONF), and images and containers into a
# storage of its own under the work directory (CONTAINERS_STORAGE_CONF), so that nothing of the host's
# podman is touched and teardown removes all of it. The network is the host's podman's, named per run.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
# shellcheck source=tests/system/container.sh
. "$here/container.sh"

if [ "$(id -u)" -ne 0 ]; then
        echo "system.k8s: needs root (podman with its own storage, networks); skipping" >&2
        exit 77
fi
if ! command -v podman >/dev/null; then
        echo "system.k8s: podman is missing (Debian packages podman and runc; packaging/install-deps.sh); skipping" >&2
        exit 77
fi
for t in runc debootstrap python3 dpkg-deb; do
        command -v "$t" >/dev/null || fail "$t is missing (Debian packages runc, debootstrap, python3, dpkg)"
done
python3 -c 'import yaml' 2>/dev/null || fail "python3's yaml module is missing (Debian package python3-yaml)"
pkgdir=$(cd "${1:?usage: k8s_test.sh PKGDIR}" && pwd)
cache=${PSFLEET_TEST_CACHE:-/var/cache/psfleet-test}
work=$(mktemp -d "${TMPDIR:-/tmp}/psfleet-k8s.XXXXXX")
net=psfleet-k8s-$$
base=localhost/psfleet-k8s-base:bookworm
image=

mkdir -p "$work/storage" "$work/run"
nofile=$(ulimit -Hn)
nproc=$(ulimit -Hu)
case $nproc in unlimited) nproc=32768 ;; *) [ "$nproc" -le 32768 ] || nproc=32768 ;; esac
cat >"$work/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
EOF
cat >"$work/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$work/storage"
runroot = "$work/run"
EOF
export CONTAINERS_CONF=$work/containers.conf CONTAINERS_STORAGE_CONF=$work/storage.conf
# (podman says "failed to connect to syslog" on every call here, where no syslog runs: not an error)

teardown() {
        local rc=$?
        set +e
        trap - EXIT
        if [ $rc -ne 0 ] && [ -d "$work/logs" ]; then
                for f in "$work"/logs/*.log; do
                        [ -f "$f" ] && { ct_log "last lines of $(basename "$f"):"; tail -n 15 "$f" >&2; }
                done
        fi
        timeout 60 podman rm -a -f -t 5 >/dev/null 2>&1
        timeout 30 podman network rm -f "$net" >/dev/null 2>&1
        timeout 60 podman rmi -a -f >/dev/null 2>&1
        # nothing of ours may stay mounted before the storage goes
        grep -o " $work/[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m"; done
        if [ $rc -ne 0 ] && [ "${PSFLEET_TEST_KEEP:-}" = 1 ]; then
                ct_log "kept $work (PSFLEET_TEST_KEEP=1)"
        else
                rm -rf "$work"
        fi
        podman network exists "$net" 2>/dev/null && ct_log "WARNING: network $net is left"
        if [ $rc -eq 0 ]; then ct_log "system.k8s: PASS"; else ct_log "system.k8s: FAIL (status $rc)"; fi
        exit $rc
}
trap teardown EXIT

step "the base: the cached Debian 12 root filesystem, imported"
tarball=$(bash "$here/rootfs.sh" "$cache") || fail "rootfs.sh failed"
timeout 300 podman import -q "$tarball" "$base" >/dev/null || fail "podman import $tarball"

step "the image: deploy/container/build-image.sh $pkgdir"
t_build=$SECONDS
# the build's RUN shares the host's network, as apt inside the rootfs is configured for
image=$(timeout 900 bash "$src/deploy/container/build-image.sh" "$pkgdir" --build-arg "BASE=$base" --network host \
        2>"$work/build.log") || { tail -n 30 "$work/build.log" >&2; fail "the image did not build"; }
t_build=$((SECONDS - t_build))
size=$(podman image inspect --format '{{.Size}}' "$image")
ct_log "built $image in ${t_build} s ($((size / 1024 / 1024)) MiB)"
[ "$(podman image inspect --format '{{json .Config.Entrypoint}}' "$image")" = '["psfleet","run"]' ] ||
        fail "$image's ENTRYPOINT is not [\"psfleet\",\"run\"]"

step "the TFJob's pods, as the training-operator would make them"
# Per replica: WORK/pods/ROLE-I.{tfconfig,args,mounts}; the ConfigMap's files in WORK/configmap-NAME,
# each pod's projected Secrets in WORK/projected-ROLE-I-VOLUME (filled below), a claim in WORK/pvc-NAME.
# Prints "JOB NAMESPACE", then "projected DIR MODE SECRET,..." and "pod ROLE I" lines.
mkdir -p "$work/pods" "$work/logs"
python3 - "$src/deploy/kubernetes/tfjob.yaml" "$work" >"$work/pods.txt" <<'PY'
import json, os, sys
import yaml
manifest, work = sys.argv[1], sys.argv[2]
docs = [d for d in yaml.safe_load_all(open(manifest)) if d]
tfjob = next(d for d in docs if d["kind"] == "TFJob")
job, ns = tfjob["metadata"]["name"], tfjob["metadata"].get("namespace", "default")
for cm in (d for d in docs if d["kind"] == "ConfigMap"):
    os.makedirs(os.path.join(work, "configmap-" + cm["metadata"]["name"]))
    for k, v in cm["data"].items():
        with open(os.path.join(work, "configmap-" + cm["metadata"]["name"], k), "w") as f:
            f.write(v)
specs = tfjob["spec"]["tfReplicaSpecs"]
def port(rs):
    c = next(c for c in rs["template"]["spec"]["containers"] if c["name"] == "tensorflow")
    return next(p["containerPort"] for p in c["ports"] if p["name"] == "tfjob-port")
# the operator's genClusterSpec: lower-case replica type, JOB-TYPE-I.NAMESPACE.svc:PORT
cluster = {rt.lower(): ["%s-%s-%d.%s.svc:%d" % (job, rt.lower(), i, ns, port(rs)) for i in range(rs["replicas"])]
           for rt, rs in specs.items()}
print(job, ns)
for rt, rs in specs.items():
    pod = rs["template"]["spec"]
    c = next(c for c in pod["containers"] if c["name"] == "tensorflow")
    assert c["command"][:2] == ["psfleet", "run"], c["command"]
    vols = {v["name"]: v for v in pod["volumes"]}
    for i in range(rs["replicas"]):
        name = "%s-%d" % (rt.lower(), i)
        with open(os.path.join(work, "pods", name + ".tfconfig"), "w") as f:
            json.dump({"cluster": cluster, "task": {"type": rt.lower(), "index": i}, "environment": "cloud"}, f)
        with open(os.path.join(work, "pods", name + ".args"), "w") as f:
            f.write("".join(a + "\n" for a in c["command"][2:]))   # after the ENTRYPOINT, psfleet run
        with open(os.path.join(work, "pods", name + ".mounts"), "w") as f:
            for m in c.get("volumeMounts", []):
                v = vols[m["name"]]
                if "configMap" in v:
                    f.write("%s/configmap-%s %s ro\n" % (work, v["configMap"]["name"], m["mountPath"]))
                elif "projected" in v:
                    # the role's Secrets as one volume: WORK/projected-ROLE-I-VOLUME, filled from them
                    d = "%s/projected-%s-%s" % (work, name, m["name"])
                    srcs = [x["secret"]["name"] for x in v["projected"]["sources"]]
                    f.write("%s %s ro\n" % (d, m["mountPath"]))
                    print("projected", d, "%o" % v["projected"].get("defaultMode", 0o644), ",".join(srcs))
                elif "persistentVolumeClaim" in v:
                    f.write("%s/pvc-%s %s rw\n" % (work, v["persistentVolumeClaim"]["claimName"], m["mountPath"]))
                else:
                    raise SystemExit("volume %s: not a ConfigMap, projected Secrets or claim" % m["name"])
        print("pod", rt.lower(), i)
PY
read -r jobname ns <"$work/pods.txt"
mapfile -t pods < <(awk '$1 == "pod" { print $2 "-" $3 }' "$work/pods.txt")
ct_log "TFJob $jobname in namespace $ns: ${pods[*]}"
jobfiles=("$work"/configmap-*/*.json)
{ [ ${#jobfiles[@]} = 1 ] && [ -f "${jobfiles[0]}" ]; } || fail "expected one job file in the ConfigMaps: ${jobfiles[*]}"
jobfile=${jobfiles[0]}

step "the Secrets: psfleet certs --job (the ConfigMap's job file) --k8s-secrets, each pod's role's projected"
mkdir -p "$work/certs"
timeout 120 podman run --rm --network none --entrypoint psfleet -v "$(dirname "$jobfile"):/jobs:ro" -v "$work/certs:/out" \
        "$image" certs --job "/jobs/$(basename "$jobfile")" --dir /out --k8s-secrets /out/secrets.yaml \
        >"$work/certs.log" 2>&1 || { cat "$work/certs.log" >&2; fail "psfleet certs"; }
grep -q "^projected " "$work/pods.txt" || fail "no projected Secrets mounted in tfjob.yaml"
# as the kubelet would: each Secret's keys as files in the volume, with its defaultMode; a key given by
# two sources, or a pod given another role's key or the CA's key, fails the test
python3 - "$work/certs/secrets.yaml" "$work/pods.txt" >"$work/secrets.txt" <<'PY' || fail "the Secrets do not fit the pods"
import base64, os, sys
import yaml
secrets = {d["metadata"]["name"]: d for d in yaml.safe_load_all(open(sys.argv[1])) if d}
for line in open(sys.argv[2]):
    w = line.split()
    if w[0] != "projected":
        continue
    d, mode, names = w[1], int(w[2], 8), w[3].split(",")
    role = os.path.basename(d).split("-")[1]   # projected-ROLE-I-VOLUME
    os.makedirs(d)
    for n in names:
        if n not in secrets:
            raise SystemExit("%s: Secret %s is not in psfleet certs' output (%s)" % (d, n, sorted(secrets)))
        for k, v in secrets[n]["data"].items():
            p = os.path.join(d, k)
            if os.path.exists(p):
                raise SystemExit("%s: two Secrets give %s" % (d, k))
            if k != "ca.crt" and not k.startswith(role):
                raise SystemExit("%s: a %s pod would hold %s" % (d, role, k))
            with open(p, "wb") as f:
                f.write(base64.b64decode(v))
            os.chmod(p, mode)
    print(os.path.basename(d), " ".join(sorted(os.listdir(d))))
PY
ct_log "Secrets: $(grep -c '^kind: Secret' "$work/certs/secrets.yaml") from psfleet certs; the pods' volumes: $(tr '\n' ';' <"$work/secrets.txt")"
while read -r dir _ mode2; do [ "$mode2" = rw ] && mkdir -p "$dir"; done < <(cat "$work"/pods/*.mounts)

step "the pods: one podman network, each pod's DNS name an alias; started together"
timeout 60 podman network create "$net" >/dev/null || fail "podman network create $net"
t_job=$SECONDS
for p in "${pods[@]}"; do
        opts=(--name "$net-$p" --hostname "$jobname-$p" --network "$net" --network-alias "$jobname-$p.$ns.svc"
              -e "TF_CONFIG=$(cat "$work/pods/$p.tfconfig")")
        while read -r from to how; do opts+=(-v "$from:$to:$how"); done <"$work/pods/$p.mounts"
        mapfile -t args <"$work/pods/$p.args"
        timeout 60 podman run -d "${opts[@]}" "$image" "${args[@]}" >/dev/null || fail "podman run $p"
done
ct_log "TF_CONFIG of ${pods[0]}: $(cat "$work/pods/${pods[0]}.tfconfig")"

step "the chief ends with the job (psfleet run --exit-at-end): exit 0"
chief=$(printf '%s\n' "${pods[@]}" | grep -m1 '^chief-') || fail "no chief replica"
status=$(timeout 900 podman wait "$net-$chief") || fail "the chief did not exit within 900 s"
t_job=$((SECONDS - t_job))
for p in "${pods[@]}"; do podman logs "$net-$p" >"$work/logs/$p.log" 2>&1 || true; done
[ "$status" = 0 ] || fail "the chief exited with status $status"
read -r step_ acc < <(sed -n 's/.*Evaluation at global_step \([0-9]*\): test accuracy \([0-9.]*\).*/\1 \2/p' \
        "$work/logs/$chief.log" | tail -n1) || fail "no evaluation in the chief's log"
dbs=("$work"/pvc-*/*/chief.db)
db=${dbs[0]}
[ -f "$db" ] || fail "no chief.db in the chief's claim"
state=$(python3 - "$db" <<'PY'
import sqlite3, sys
con = sqlite3.connect("file:%s?mode=ro" % sys.argv[1], uri=True, timeout=10)
print(*con.execute("SELECT CASE state WHEN 6 THEN 'DONE' WHEN 7 THEN 'FAILED' WHEN 8 THEN 'STOPPED' ELSE state END, global_step FROM job").fetchone())
PY
)
ct_log "chief: exit 0 after ${t_job} s, job $state, test accuracy $acc at step $step_"
[ "${state%% *}" = DONE ] || fail "the job is $state, not DONE"
grep -q "mutual TLS as chief of job $jobname" "$work/logs/$chief.log" || fail "the chief does not say it runs under mutual TLS"
awk -v a="$acc" 'BEGIN { exit !(a >= 0.87) }' || fail "test accuracy $acc < 0.87"

step "every other pod exits 0 once the job has ended"
for p in "${pods[@]}"; do
        [ "$p" = "$chief" ] && continue
        s=$(timeout 120 podman wait "$net-$p") || fail "$p did not exit within 120 s of the chief"
        podman logs "$net-$p" >"$work/logs/$p.log" 2>&1 || true
        [ "$s" = 0 ] || fail "$p exited with status $s"
        grep -q "mutual TLS as $p of job $jobname" "$work/logs/$p.log" || fail "$p does not say it runs under mutual TLS"
        ct_log "$p: exit 0"
done
ct_log "image built in ${t_build} s; the job (${#pods[@]} pods) in ${t_job} s; test accuracy $acc"

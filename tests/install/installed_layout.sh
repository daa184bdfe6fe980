#!/usr/bin/env bash
# The installed layout, as a node gets it: `cmake --install` into a scratch root (DESTDIR), then the
# INSTALLED workerd, with a job asking for gpu:0, no GPU visible and no PSFLEET_CUDA_PLUGIN, must load
# the installed CUDA plugin and say that it found no device, not that no plugin was found. Then the
# same with the .debs (cpack): the plugin that psfleet-workerd-cuda carries, by `dpkg-deb -c`, is the
# file the packaged /usr/bin/workerd, unpacked, loads. Nothing here names the plugin's file: it is
# whatever `cmake --install --component cuda` installs, so the test fails when the name or the
# directory the programs look in diverge from what CMake builds and installs.
# Exits 77 (CTest: skipped) when the CUDA backend is not built.
#
#   installed_layout.sh BUILD_DIR HAVE_CUDA(0|1)
set -euo pipefail

build=$(cd "${1:?usage: installed_layout.sh BUILD_DIR HAVE_CUDA}" && pwd)
have_cuda=${2:?usage: installed_layout.sh BUILD_DIR HAVE_CUDA}
data=/usr/share/datasets/fashion-mnist

log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
fail() { log "FAIL: $*"; exit 1; }
if [ "$have_cuda" != 1 ]; then
        log "SKIP: the CUDA backend is not built (no CUDA toolkit or cuDNN found): there is no plugin to install"
        exit 77
fi
[ -r "$data/train-images-idx3-ubyte.gz" ] || { log "SKIP: no training data in $data (workerd reads it first)"; exit 77; }

x=$(mktemp -d "${TMPDIR:-/tmp}/psfleet-layout.XXXXXX")
trap 'rm -rf "$x"' EXIT

# The plugin's path under the prefix, as CMake installs it.
DESTDIR=$x/cuda cmake --install "$build" --prefix /usr --component cuda >/dev/null
mapfile -t plugins < <(cd "$x/cuda" && find . -type f | sed 's|^\.||')
[ ${#plugins[@]} -eq 1 ] || fail "component cuda installs ${#plugins[@]} files, expected the plugin alone: ${plugins[*]}"
plugin=${plugins[0]}
log "the plugin installs as $plugin"

cat >"$x/job.json" <<JOB
{"job": "layout", "cluster": {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"], "worker": ["127.0.0.1:3"]},
 "model": {"input": [784], "layers": [{"type": "dense", "units": 10}]},
 "data": {"dir": "$data"}, "supervisor": {"ready_timeout_secs": 1}, "device": {"device": "gpu:0"}}
JOB

# check_workerd ROOT: ROOT/usr/bin/workerd must say that it loaded ROOT$plugin and found no GPU. It exits
# on the device error (or, never here, when no chief answers): only its device line matters.
check_workerd() {
        local root=$1 out
        [ -x "$root/usr/bin/workerd" ] || fail "no $root/usr/bin/workerd"
        # No GPU on any machine (CUDA_VISIBLE_DEVICES=""), and none of the device overrides.
        out=$(env -u PSFLEET_CUDA_PLUGIN -u PSFLEET_DEVICE -u PSFLEET_ALLOW_SOFT_PLACEMENT -u PSFLEET_TEST_FAKE_NO_GPU \
                CUDA_VISIBLE_DEVICES= timeout 60 "$root/usr/bin/workerd" --job "$x/job.json" --task-index 0 \
                --state-dir "$x/state" 2>&1) || true
        local line
        line=$(grep -m1 'device' <<<"$out" || true)
        log "$root/usr/bin/workerd: $line"
        [ -n "$line" ] || fail "workerd printed no device line: $out"
        if grep -q "the CUDA backend is not available" <<<"$line"; then
                fail "the installed workerd found no CUDA plugin"
        fi
        grep -qF "device \"gpu:0\": no GPU is visible (" <<<"$line" || fail "expected \"no GPU is visible\": $line"
        grep -qF "CUDA plugin $root$plugin)" <<<"$line" || fail "expected the plugin $root$plugin to be loaded: $line"
}

log "cmake --install $build -> $x/inst (DESTDIR)"
DESTDIR=$x/inst cmake --install "$build" --prefix /usr >/dev/null
check_workerd "$x/inst"

log "cpack -G DEB (workerd, cuda) -> $x/deb"
(cd "$build" && cpack -G DEB -B "$x/deb" -D CPACK_COMPONENTS_ALL="workerd;cuda") >"$x/cpack.log" 2>&1 ||
        { tail -n 30 "$x/cpack.log" >&2; fail "cpack"; }
cuda_deb=$(ls "$x"/deb/psfleet-workerd-cuda_*.deb) || fail "no psfleet-workerd-cuda .deb"
workerd_deb=$(ls "$x"/deb/psfleet-workerd_*.deb) || fail "no psfleet-workerd .deb"
listed=$(dpkg-deb -c "$cuda_deb" | awk '{print $6}' | sed 's|^\./|/|' | grep -v '/$')
[ "$listed" = "$plugin" ] || fail "psfleet-workerd-cuda carries \"$listed\", expected $plugin"
dpkg-deb -c "$workerd_deb" | awk '{print $6}' | grep -qx './usr/bin/workerd' || fail "psfleet-workerd lacks /usr/bin/workerd"
dpkg-deb -x "$workerd_deb" "$x/debroot"
dpkg-deb -x "$cuda_deb" "$x/debroot"
check_workerd "$x/debroot"
log "PASS: the installed and the packaged workerd load the plugin they ship with"

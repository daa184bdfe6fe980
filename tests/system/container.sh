# A Debian container booted with systemd-nspawn, for tests that need a real systemd (PID 1 on the test
# machines is not systemd). Source this file, then:
#   ct_boot NAME TARBALL WORKDIR [systemd-nspawn options...]   unpack, boot, wait until systemd is up
#   ct_start NAME WORKDIR [systemd-nspawn options...]          boot WORKDIR/root as it is (a restart)
#   ct NAME... / ct_sh 'script'                                 run a command / a bash script inside
#   ct_stop                                                     power off, kill if need be, remove the
#                                                               cgroup; the rootfs stays
#   ct_teardown                                                 ct_stop, then remove the unpacked rootfs
#   S=$(ct_save) / ct_load "$S"                                 several containers: one's state as a
#                                                               word, and back to it as the current one
#   ct_psfleet_prereqs WHO DATA PKGDIR                          root, tools, dataset, .debs (in CT_DEBS)
#   ct_boot_psfleet NAME WORKDIR CACHE PKGDIR DATA [opts...]    ct_boot with the .debs, data, apt cache
#   ct_psfleet_rootfs CACHE PKGDIR DATA                         its tarball and options, without a boot
#   ct_install LOG DEB...                                       apt install inside
#   ct_wait_for SECONDS WHAT COMMAND...                         poll COMMAND until it succeeds, or fail
#   ct_psfleet_test WHO TAG PKGDIR                              a psfleet system test's start: pkgdir, cache,
#                                                               data, ct_psfleet_prereqs, debs, work
#   ct_finish RC WORKDIR WHAT                                   ct_teardown, WORKDIR removed (kept after a
#                                                               failure with PSFLEET_TEST_KEEP=1), a last line
# ct_teardown is safe to call twice and from an EXIT trap, whatever state ct_boot reached.
# What works on these machines, and why each step is here: ../../../shared/notes/systemd-container.md.

CT_NAME=
CT_DIR=
CT_CGROUP=
CT_NSPAWN_PID=
CT_INIT_PID=

ct_log() { printf '%s [%6.1fs] %s\n' "$(date +%H:%M:%S)" "$(ct_elapsed)" "$*" >&2; }
ct_elapsed() { awk -v s="${CT_T0:-0}" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }'; }
CT_T0=${CT_T0:-$(date +%s.%N)}
# A psfleet system test's failure and its steps, in its log.
fail() { ct_log "FAIL: $*"; exit 1; }
step() { ct_log "--- $*"; }

# The cgroup the container lives in: its own, so that teardown can remove everything nspawn made.
# The hosts have a hybrid v1/v2 layout (v2 at /sys/fs/cgroup/unified); a pure v2 host has it at the top.
ct_cgroup_root() {
        if [ -f /sys/fs/cgroup/unified/cgroup.procs ]; then
                echo /sys/fs/cgroup/unified
        elif [ -f /sys/fs/cgroup/cgroup.procs ] && [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
                echo /sys/fs/cgroup
        else
                return 1
        fi
}

ct_boot() {
        local name=$1 tarball=$2 dir=$3
        shift 3
        mkdir -p "$dir/root"
        tar -C "$dir/root" --numeric-owner -xf "$tarball"
        ct_start "$name" "$dir" "$@"
}

ct_start() {
        local name=$1 dir=$2
        shift 2
        CT_NAME=$name
        CT_DIR=$dir
        local cgroot
        cgroot=$(ct_cgroup_root) || { ct_log "no cgroup2 hierarchy to put the container in"; return 1; }
        CT_CGROUP=$cgroot/psfleet-test-$name
        mkdir -p "$CT_CGROUP"
        # The subshell moves itself into the new cgroup, then becomes nspawn.
        (
                echo "$BASHPID" >"$CT_CGROUP/cgroup.procs"
                SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1 exec systemd-nspawn -q -b --register=no --keep-unit \
                        --console=read-only -M "$name" -D "$dir/root" "$@"
        ) >"$dir/console.log" 2>&1 </dev/null &
        CT_NSPAWN_PID=$!
        # The container's init is the child of nspawn whose comm is systemd: the first child may be
        # nspawn's short-lived outer child, and a boot that took it waited its whole timeout on a dead PID.
        local i c
        CT_INIT_PID=
        for i in $(seq 1 400); do
                for c in $(cat "/proc/$CT_NSPAWN_PID/task/$CT_NSPAWN_PID/children" 2>/dev/null); do
                        if [ "$(cat "/proc/$c/comm" 2>/dev/null)" = systemd ] && ct_alive "$c"; then
                                CT_INIT_PID=$c
                                break
                        fi
                done
                [ -n "$CT_INIT_PID" ] && break
                if ! ct_alive "$CT_NSPAWN_PID"; then
                        ct_log "systemd-nspawn exited early:"; tail -n 20 "$dir/console.log" >&2; return 1
                fi
                sleep 0.05
        done
        [ -n "$CT_INIT_PID" ] || { ct_log "no systemd process in the container after 20 s"; return 1; }
        # systemd is up once it answers; `is-system-running --wait` returns when boot is over.
        # (at most 2 minutes: before its D-Bus is up, systemctl fails at once, hence the loop)
        local state= deadline=$((SECONDS + 120))
        while [ $SECONDS -lt $deadline ]; do
                state=$(ct timeout $((deadline - SECONDS + 1)) systemctl is-system-running --wait 2>/dev/null) && break
                case $state in running|degraded) break ;; esac
                sleep 0.1
        done
        case $state in
        running) ;;
        degraded) ct_log "container booted degraded:"; ct systemctl --failed --no-pager >&2 || true ;;
        *) ct_log "container did not boot (state \"$state\")"; tail -n 30 "$dir/console.log" >&2; return 1 ;;
        esac
        ct_log "container $name booted (nspawn $CT_NSPAWN_PID, init $CT_INIT_PID)"
}

# Runs a command inside, with a clean environment.
ct() {
        nsenter -t "$CT_INIT_PID" -a -- env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
                LANG=C.UTF-8 TERM=dumb SYSTEMD_PAGER= SYSTEMD_COLORS=0 DEBIAN_FRONTEND=noninteractive "$@"
}

ct_sh() { ct bash -euo pipefail -c "$1"; }

# What a psfleet system test needs: root, the tools, the dataset, the five .debs, whose paths inside the
# container (PKGDIR bound on /mnt/pkgs) go to the array CT_DEBS. Returns 77 (skip) without root, 1 with
# a message when something is missing.
ct_psfleet_prereqs() {
        local who=$1 data=$2 pkgdir=$3 t p f
        if [ "$(id -u)" -ne 0 ]; then
                echo "$who: needs root (systemd-nspawn); skipping" >&2
                return 77
        fi
        for t in systemd-nspawn nsenter debootstrap python3; do
                command -v "$t" >/dev/null ||
                        { ct_log "$t is missing (Debian packages: systemd-container, util-linux, debootstrap, python3)"; return 1; }
        done
        [ -f "$data/train-images-idx3-ubyte.gz" ] ||
                { ct_log "$data is missing (Debian package dataset-fashion-mnist)"; return 1; }
        CT_DEBS=()
        for p in psfleet-common psfleet-psd psfleet-workerd psfleet-chiefd psfleet; do
                f=$(ls "$pkgdir"/${p}_*.deb 2>/dev/null | head -n1)
                [ -n "$f" ] || { ct_log "no $p .deb in $pkgdir"; return 1; }
                CT_DEBS+=("/mnt/pkgs/$(basename "$f")")
        done
}

# The start of a psfleet system test WHO: sets pkgdir (PKGDIR made absolute), cache (PSFLEET_TEST_CACHE,
# default /var/cache/psfleet-test), data (the fashion-mnist dataset), checks ct_psfleet_prereqs (its
# status is this function's: 77 to skip), sets debs (CT_DEBS) and makes work, a new directory
# psfleet-TAG.XXXXXX under TMPDIR.
ct_psfleet_test() {
        local who=$1 tag=$2
        pkgdir=$(cd "$3" && pwd) || return 1
        cache=${PSFLEET_TEST_CACHE:-/var/cache/psfleet-test}
        data=/usr/share/datasets/fashion-mnist
        ct_psfleet_prereqs "$who" "$data" "$pkgdir" || return $?
        debs=("${CT_DEBS[@]}")
        work=$(mktemp -d "${TMPDIR:-/tmp}/psfleet-$tag.XXXXXX") || return 1
}

# ct_boot from the cached rootfs (rootfs.sh builds it when missing), with the packages on /mnt/pkgs,
# the dataset at its own path and apt's archive cache bound in.
# Further nspawn options (a network namespace) follow DATA; the tarball's path goes to CT_TARBALL and the
# options to the array CT_OPTS, for booting further containers, or the same one again (ct_start).
ct_boot_psfleet() {
        local name=$1 work=$2 cache=$3 pkgdir=$4 data=$5
        shift 5
        ct_psfleet_rootfs "$cache" "$pkgdir" "$data" || return 1
        ct_boot "$name" "$CT_TARBALL" "$work" "${CT_OPTS[@]}" "$@"
}

# ct_psfleet_rootfs CACHE PKGDIR DATA: only the tarball (CT_TARBALL) and the options (CT_OPTS).
ct_psfleet_rootfs() {
        local cache=$1 pkgdir=$2 data=$3
        CT_TARBALL=$(bash "$(dirname "${BASH_SOURCE[0]}")/rootfs.sh" "$cache") || return 1
        ct_log "rootfs $CT_TARBALL"
        mkdir -p "$cache/apt-archives/partial"
        CT_OPTS=(--bind-ro="$pkgdir:/mnt/pkgs" --bind-ro="$data:$data" --bind="$cache/apt-archives:/var/cache/apt/archives")
}

# apt-get install inside, bounded; refreshes stale package lists once. Output in LOG.
ct_install() {
        local log=$1
        shift
        if ! ct timeout 300 apt-get install -y -q "$@" >"$log" 2>&1; then
                ct timeout 180 apt-get update -q >>"$log" 2>&1 || true
                ct timeout 300 apt-get install -y -q "$@" >>"$log" 2>&1 || { tail -n 40 "$log" >&2; return 1; }
        fi
}

# ct_wait_for SECONDS DESCRIPTION COMMAND...: polls COMMAND every 0.2 s; a test that waited in vain
# exits 1 (its EXIT trap tears down) with a line saying what for.
ct_wait_for() {
        local secs=$1 what=$2 i
        shift 2
        for i in $(seq 1 $((secs * 5))); do
                "$@" && return 0
                sleep 0.2
        done
        ct_log "FAIL: timed out after $secs s waiting for $what"
        exit 1
}

# Whether PID is running: a zombie (exited, not yet reaped by this shell) is not.
ct_alive() {
        local st
        st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
        [ -n "$st" ] && [ "$st" != Z ]
}

# The current container's state in one word, for scripts that drive several: VAR=$(ct_save).
ct_save() { printf '%s|%s|%s|%s|%s' "$CT_NAME" "$CT_DIR" "$CT_CGROUP" "$CT_NSPAWN_PID" "$CT_INIT_PID"; }
ct_load() { IFS='|' read -r CT_NAME CT_DIR CT_CGROUP CT_NSPAWN_PID CT_INIT_PID <<<"$1"; }

ct_teardown() {
        local rc=0
        ct_stop || rc=1
        if [ -n "$CT_DIR" ] && [ -d "$CT_DIR/root" ]; then
                # Nothing may still be mounted below the rootfs before it is deleted.
                if grep -q " $CT_DIR/root" /proc/self/mounts; then
                        ct_log "mounts left below $CT_DIR/root; not deleting it"
                        rc=1
                else
                        rm -rf "$CT_DIR/root"
                fi
        fi
        return $rc
}

ct_stop() {
        local rc=0 i
        if [ -n "$CT_NSPAWN_PID" ] && ct_alive "$CT_NSPAWN_PID"; then
                # SIGRTMIN+4 asks systemd for a poweroff; nspawn exits when the container has.
                [ -n "$CT_INIT_PID" ] && kill -s RTMIN+4 "$CT_INIT_PID" 2>/dev/null || true
                # The psfleet units may take their TimeoutStopSec=30s. Once the container has said
                # "Powering off.", nspawn normally exits at once; now and then (on a loaded host) it
                # lingers, and then it is killed: the container itself is down by then.
                local off=0
                for i in $(seq 1 450); do
                        ct_alive "$CT_NSPAWN_PID" || break
                        if grep -q "^Powering off" "$CT_DIR/console.log" 2>/dev/null; then
                                off=$((off + 1))
                                [ $off -lt 100 ] || break
                        fi
                        sleep 0.1
                done
                if ct_alive "$CT_NSPAWN_PID"; then
                        if [ $off -ge 100 ]; then
                                ct_log "container $CT_NAME powered off, but systemd-nspawn lingers: killing it"
                        else
                                ct_log "container $CT_NAME did not power off in 45 s: killing it"
                                rc=1
                        fi
                        kill -KILL "$CT_NSPAWN_PID" 2>/dev/null || true
                fi
                wait "$CT_NSPAWN_PID" 2>/dev/null || true
        fi
        if [ -n "$CT_CGROUP" ] && [ -d "$CT_CGROUP" ]; then
                # Whatever is left (a killed container's processes): kill it, then remove the tree, deepest
                # directories first.
                local procs
                for i in $(seq 1 50); do
                        procs=$(find "$CT_CGROUP" -name cgroup.procs -exec cat {} + 2>/dev/null)
                        [ -z "$procs" ] && break
                        [ -f "$CT_CGROUP/cgroup.kill" ] && echo 1 >"$CT_CGROUP/cgroup.kill" 2>/dev/null ||
                                kill -KILL $procs 2>/dev/null || true
                        sleep 0.1
                done
                # (a cgroup whose children are still being released may refuse rmdir for a moment)
                for i in $(seq 1 20); do
                        find "$CT_CGROUP" -depth -type d -exec rmdir {} + 2>/dev/null || true
                        [ -d "$CT_CGROUP" ] || break
                        sleep 0.1
                done
                if [ -d "$CT_CGROUP" ]; then
                        ct_log "could not remove the cgroup $CT_CGROUP"
                        rc=1
                fi
        fi
        CT_NSPAWN_PID=
        CT_INIT_PID=
        CT_CGROUP=
        return $rc
}

# The end of a system test's EXIT trap: teardown, the work directory removed unless a failure is to be
# kept (PSFLEET_TEST_KEEP=1), one line saying how it went. Exits with RC, or 1 if the teardown failed.
ct_finish() {
        local rc=$1 work=$2 what=$3
        ct_teardown || rc=1
        if [ "${PSFLEET_TEST_KEEP:-0}" != 1 ] || [ "$rc" -eq 0 ]; then
                rm -rf "$work"
        fi
        ct_log "$what $([ "$rc" -eq 0 ] && echo passed || echo FAILED) in $(ct_elapsed) s"
        exit "$rc"
}

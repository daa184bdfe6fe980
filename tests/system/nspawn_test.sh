#!/usr/bin/env bash
# The system test: psfleet's .deb packages on a real systemd. Boots a Debian 12 container with
# systemd-nspawn, apt-installs the packages there, runs a small job (1 chief, 2 ps, 2 workers) as
# systemd services, checks readiness, status lines, a restart after kill -9, the end of the job and
# `psfleet status`, then stops everything and purges the packages, leaving no unit or user behind.
# The container and its cgroups are removed whatever happens.
#
#   nspawn_test.sh PACKAGE_DIR        (the .debs, from packages_test.sh)
# Environment: PSFLEET_TEST_CACHE (rootfs and apt cache; default /var/cache/psfleet-test),
#              PSFLEET_TEST_KEEP=1 (leave the work directory for inspection after a failure),
#              PSFLEET_TEST_ARTIFACTS=DIR (copy the `systemd-analyze security` reports there)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/container.sh"

ct_psfleet_test nspawn_test systest "${1:?usage: nspawn_test.sh PACKAGE_DIR}" || exit $?
job=systest
name=psfleet-$$
dump_logs() {
        [ -n "$CT_INIT_PID" ] || return 0
        ct_log "the units, and the journal of the psfleet units:"
        ct systemctl list-units --all --no-pager 'psfleet*' >&2 || true
        ct journalctl --no-pager -o short-monotonic -u 'psfleet-*' -n 200 >&2 || true
}
cleanup() {
        local rc=$?
        [ $rc -ne 0 ] && dump_logs
        ct_finish $rc "$work" "system test"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The job's ports: free on the host now (the container shares the host's network), below the
# ephemeral range, where no connection of the host's takes them meanwhile (tests/integration/ports.py).
read -r p_chief p_ps0 p_ps1 p_w0 p_w1 < <(python3 "$here/../integration/ports.py" 5)

step "boot"
ct_boot_psfleet "$name" "$work" "$cache" "$pkgdir" "$data"

step "apt install ${debs[*]##*/}"
# Every step is bounded, so that the EXIT trap (teardown) always runs before CTest's own timeout.
ct_install "$work/apt.log" "${debs[@]}" || fail "apt install"
grep -E "^(Unpacking|Setting up) " "$work/apt.log" | sed 's/^/  /' >&2 || true
ct getent passwd psfleet >/dev/null || fail "no psfleet user after install"
ct test -d /var/lib/psfleet || fail "no /var/lib/psfleet after install"
for u in psfleet-psd@ psfleet-workerd@ psfleet-chiefd@; do
        st=$(ct systemctl is-active "${u}$job:0.service" || true)
        [ "$st" = inactive ] || fail "$u$job:0 is \"$st\" right after install: the packages must start nothing"
done

step "systemd-analyze verify (templates through a colon-free instance) and security"
for u in psfleet-psd@check.service psfleet-workerd@check.service psfleet-chiefd@check.service psfleet.target; do
        out=$(ct systemd-analyze verify --man=no "$u" 2>&1) || fail "systemd-analyze verify $u: $out"
        [ -z "$out" ] || fail "systemd-analyze verify $u warns: $out"
done
for u in psfleet-psd@check.service psfleet-chiefd@check.service psfleet-workerd@check.service; do
        ct systemd-analyze security --no-pager "$u" >"$work/security-$u.txt" 2>&1 || true
        [ -z "${PSFLEET_TEST_ARTIFACTS:-}" ] || { mkdir -p "$PSFLEET_TEST_ARTIFACTS"; cp "$work/security-$u.txt" "$PSFLEET_TEST_ARTIFACTS/"; }
        e=$(sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' "$work/security-$u.txt")
        ct_log "exposure $u: $e"
        case $u in
        psfleet-workerd*) ;;
        *) awk -v e="$e" 'BEGIN { exit !(e != "" && e <= 2.0) }' || fail "$u: exposure $e > 2.0" ;;
        esac
done

step "job $job: chief :$p_chief, ps :$p_ps0 :$p_ps1, workers :$p_w0 :$p_w1"
# 20000 steps, several seconds: long enough that a worker slow to start on a loaded machine still
# joins before the other has trained it all (the shared-memory check below wants both).
ct tee /etc/psfleet/jobs/$job.json >/dev/null <<EOF
{
  "job": "$job",
  "cluster": {
    "chief": ["127.0.0.1:$p_chief"],
    "ps": ["127.0.0.1:$p_ps0", "127.0.0.1:$p_ps1"],
    "worker": ["127.0.0.1:$p_w0", "127.0.0.1:$p_w1"]
  },
  "model": {
    "input": [784],
    "seed": 1,
    "layers": [{"type": "dense", "units": 64}, {"type": "relu"}, {"type": "dense", "units": 10}]
  },
  "data": {"dir": "$data"},
  "training": {
    "batch_size": 32, "optimizer": "momentum", "momentum": 0.9, "learning_rate": 0.01,
    "max_steps": 20000, "report_every_steps": 20, "threads": 1, "seed": 1
  },
  "security": {"mode": "mtls"}
}
EOF

step "psfleet certs, as an administrator would (docs/security.md)"
ct psfleet certs --job /etc/psfleet/jobs/$job.json >"$work/certs.log" 2>&1 || { cat "$work/certs.log" >&2; fail "psfleet certs"; }
sed 's/^/  /' "$work/certs.log" >&2
modes=$(ct stat -c '%n %a %U:%G' /etc/psfleet/tls/$job/ca.key /etc/psfleet/tls/$job/ps-0.key /etc/psfleet/tls/$job/ps-0.crt)
ct_log "$modes"
echo "$modes" | grep -q "ca.key 600 root:root" || fail "ca.key is not 0600 root:root: $modes"
echo "$modes" | grep -q "ps-0.key 640 root:psfleet" || fail "ps-0.key is not 0640 root:psfleet: $modes"
ps0=psfleet-psd@$job:0.service ps1=psfleet-psd@$job:1.service
w0=psfleet-workerd@$job:0.service w1=psfleet-workerd@$job:1.service
chief=psfleet-chiefd@$job.service
all=("$chief" "$ps0" "$ps1" "$w0" "$w1")
# Enabled instances belong to psfleet.target (the node's set); the purge below must remove the links.
ct systemctl enable -q "${all[@]}" || fail "systemctl enable"

prop() { ct systemctl show -P "$2" "$1"; }
is_active() { [ "$(prop "$1" ActiveState)" = active ]; }
is_inactive() { [ "$(prop "$1" ActiveState)" = inactive ]; }
status_has() { local u=$1; shift; prop "$u" StatusText | grep -q "$@"; }

step "start the parameter servers"
ct systemctl start "$ps0" "$ps1" || fail "systemctl start $ps0 $ps1"
# Type=notify: start returns once READY=1 came.
for u in "$ps0" "$ps1"; do
        is_active "$u" || fail "$u is not active after start"
        ct_wait_for 10 "$u's STATUS=" status_has "$u" uninitialized
        ct_log "$u: $(prop "$u" StatusText)"
done
[ "$(prop "$ps0" User)" = psfleet ] || fail "$ps0 does not run as psfleet"

step "kill -9 a running psd: systemd restarts it"
old=$(prop "$ps1" MainPID)
[ "$old" -gt 0 ] || fail "$ps1 has no main PID"
ct bash -c "kill -9 $old"
restarted() { [ "$(prop "$ps1" NRestarts)" -ge 1 ] && is_active "$ps1" && [ "$(prop "$ps1" MainPID)" != "$old" ]; }
ct_wait_for 20 "$ps1 to be restarted" restarted
ct_log "$ps1: PID $old killed, now PID $(prop "$ps1" MainPID), NRestarts=$(prop "$ps1" NRestarts)"
ct_wait_for 10 "$ps1's STATUS= after the restart" status_has "$ps1" uninitialized

step "start the chief"
ct systemctl start "$chief" || fail "systemctl start $chief"
# "ready: global_step 0/20000, waiting for workers", then "step 0/20000, ..." while no worker has pushed
ct_wait_for 30 "the chief to declare the job ready" status_has "$chief" -E "^(ready|step 0/)"
ct systemctl status --no-pager "$chief" >"$work/status.txt" 2>&1 || true
grep -qE "Status: \"(ready|step 0/)" "$work/status.txt" ||
        { cat "$work/status.txt" >&2; fail "systemctl status $chief shows no STATUS= line"; }
ct_log "systemctl status $chief: $(grep 'Status:' "$work/status.txt" | sed 's/^ *//')"
for u in "$ps0" "$ps1"; do ct_wait_for 10 "$u to be assigned" status_has "$u" "^serving"; done

step "start the workers"
ct systemctl start "$w0" "$w1" || fail "systemctl start $w0 $w1"
seen_step=
training_or_done() {
        local s
        s=$(prop "$chief" StatusText)
        case $s in "step 0/"*) ;; step\ *) [ -n "$seen_step" ] || { seen_step=$s; ct_log "$chief: $s"; } ;; esac
        case $s in done*) return 0 ;; failed*) fail "the job failed: $s" ;; esac
        return 1
}
ct_wait_for 240 "the job to finish" training_or_done
ct_log "$chief: $(prop "$chief" StatusText)"
[ -n "$seen_step" ] || ct_log "(the job finished before a step N/M status line was seen)"

step "mutual TLS: every daemon said so; a viewer reads but may not stop the job"
for u in "$ps0" "$chief" "$w1"; do
        ct journalctl --no-pager -o cat -u "$u" | grep -q "mutual TLS as" || fail "$u did not start with mutual TLS"
done
ct timeout 30 psfleet status --identity viewer --job /etc/psfleet/jobs/$job.json >/dev/null ||
        fail "psfleet status --identity viewer failed"
if out=$(ct timeout 30 psfleet stop --identity viewer --job /etc/psfleet/jobs/$job.json 2>&1); then
        fail "psfleet stop as viewer succeeded: $out"
fi
echo "$out" | grep -q PERMISSION_DENIED || fail "psfleet stop as viewer: not PERMISSION_DENIED: $out"
ct journalctl --no-pager -o cat -u "$chief" | grep -q "refused /psfleet.v1.Supervisor/Stop from viewer" ||
        fail "$chief did not log the viewer's refused Stop"
ct_log "a viewer's Stop: $out"

step "psfleet status"
ct timeout 30 psfleet status --job /etc/psfleet/jobs/$job.json | tee "$work/psfleet-status.txt" | sed 's/^/  /' >&2 ||
        fail "psfleet status failed"
grep -q "^job $job: done" "$work/psfleet-status.txt" || fail "psfleet status does not say the job is done"
is_active "$chief" || fail "$chief should keep serving after the job is done"
# Workers exit 0 at max_steps, the ps when the chief stops them: inactive, not failed.
for u in "$w0" "$w1" "$ps0" "$ps1"; do
        ct_wait_for 30 "$u to exit" is_inactive "$u"
        r=$(prop "$u" Result)
        [ "$r" = success ] || fail "$u ended with result \"$r\""
done

step "journal fields"
ct journalctl --no-pager -o json -u 'psfleet-*' JOB=$job >"$work/journal.json"
for t in chief:0 ps:0 ps:1 worker:0 worker:1; do
        grep -q "\"TASK\":\"$t\"" "$work/journal.json" || fail "no journal entry with JOB=$job TASK=$t"
done
grep -q '"STEP":"' "$work/journal.json" || fail "no journal entry with a STEP= field"
ct_log "journalctl -u 'psfleet-*' JOB=$job: $(wc -l <"$work/journal.json") entries from 5 tasks"

step "shared memory under the units' hardening"
# psd (ProtectProc=invisible, PrivateDevices=, PrivateIPC=) opens each worker's memfd through /proc:
# both ps shards run on this host, so every worker pushes to both through shared memory.
for u in "$w0" "$w1"; do
        n=$(ct journalctl --no-pager -o cat -u "$u" | grep -c "is on this host: pushing through shared memory" || true)
        [ "$n" = 2 ] || { ct journalctl --no-pager -o cat -u "$u" | tail -n 20 >&2;
                          fail "$u pushed to $n of 2 ps shards through shared memory"; }
done
ct journalctl --no-pager -o cat -u "$ps0" | grep -q "pushes through shared memory" ||
        fail "$ps0 never served a worker through shared memory"
# segments are memfds: nothing in /dev/shm, before or after
left=$(ct sh -c 'ls /dev/shm | grep "^psfleet-" || true')
[ -z "$left" ] || fail "files left in /dev/shm: $left"
ct_log "both workers pushed to both shards through shared memory; nothing in /dev/shm"

step "stop everything"
ct systemctl stop psfleet.target "${all[@]}" || fail "systemctl stop"
for u in "${all[@]}"; do
        st=$(prop "$u" ActiveState)
        [ "$st" = inactive ] || fail "$u is $st after stop"
done

step "apt purge"
ct timeout 180 apt-get purge -y -q psfleet-common psfleet-psd psfleet-workerd psfleet-chiefd psfleet >"$work/purge.log" 2>&1 ||
        { tail -n 30 "$work/purge.log" >&2; fail "apt purge"; }
left=$(ct bash -c 'ls -d /usr/lib/systemd/system/psfleet* /etc/systemd/system/*/psfleet* /etc/systemd/system/psfleet* \
        /var/lib/psfleet /usr/bin/psd /usr/bin/workerd /usr/bin/chiefd /usr/bin/psfleet 2>/dev/null' || true)
[ -z "$left" ] || fail "left behind after purge: $left"
units=$(ct systemctl list-units --all --no-legend --plain 'psfleet*' || true)
[ -z "$units" ] || fail "units still loaded after purge: $units"
files=$(ct systemctl list-unit-files --no-legend 'psfleet*' || true)   # exits 1 when nothing matches
[ -z "$files" ] || fail "unit files still known after purge: $files"
ct getent passwd psfleet >/dev/null && fail "the psfleet user is still there after purge"
ct getent group psfleet >/dev/null && fail "the psfleet group is still there after purge"
ct_log "purged: no unit, file, user or group left"

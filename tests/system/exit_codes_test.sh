#!/usr/bin/env bash
# The exit statuses under a real systemd: a workerd whose data directory is empty exits 65 and is not
# restarted (RestartPreventExitStatus=), so it does not loop; a psd whose address is taken exits 75
# and is restarted, until five starts within a minute end the loop (StartLimitBurst=). Boots the same Debian 12 container as nspawn_test.sh with the .debs installed.
#
#   exit_codes_test.sh PACKAGE_DIR        (the .debs, from packages_test.sh)
# Environment: PSFLEET_TEST_CACHE (rootfs and apt cache; default /var/cache/psfleet-test).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/container.sh"

ct_psfleet_test exit_codes_test exitcodes "${1:?usage: exit_codes_test.sh PACKAGE_DIR}" || exit $?
job=exitcodes
name=psfleet-x$$
holder=
cleanup() {
        local rc=$?
        if [ $rc -ne 0 ] && [ -n "$CT_INIT_PID" ]; then
                ct systemctl list-units --all --no-pager 'psfleet*' >&2 || true
                ct journalctl --no-pager -o short-monotonic -u 'psfleet-*' -n 100 >&2 || true
        fi
        [ -z "$holder" ] || kill "$holder" 2>/dev/null || true
        ct_finish $rc "$work" "exit codes test"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step "root filesystem, boot, apt install"
# below the ephemeral range: no connection of the host's takes them while the container boots
read -r p_chief p_ps0 p_w0 < <(python3 "$here/../integration/ports.py" 3)
ct_boot_psfleet "$name" "$work" "$cache" "$pkgdir" "$data"
ct_install "$work/apt.log" "${debs[@]}" || fail "apt install"

ct mkdir -p /srv/empty-data
ct tee /etc/psfleet/jobs/$job.json >/dev/null <<EOF
{
  "job": "$job",
  "cluster": {"chief": ["127.0.0.1:$p_chief"], "ps": ["127.0.0.1:$p_ps0"], "worker": ["127.0.0.1:$p_w0"]},
  "model": {"input": [784], "layers": [{"type": "dense", "units": 10}]},
  "data": {"dir": "/srv/empty-data"},
  "training": {"batch_size": 32, "max_steps": 100}
}
EOF
prop() { ct systemctl show -P "$2" "$1"; }

step "workerd on an empty data directory: exit 65, not restarted"
w0=psfleet-workerd@$job:0.service
ct systemctl start "$w0" && fail "$w0 started on an empty data directory"
# RestartSec=2s: a unit that loops would have restarted several times by now.
sleep 12
st=$(prop "$w0" ExecMainStatus) n=$(prop "$w0" NRestarts) a=$(prop "$w0" ActiveState)
ct_log "$w0: ExecMainStatus=$st NRestarts=$n ActiveState=$a"
[ "$st" = 65 ] || fail "$w0 exited with $st, expected 65"
[ "$n" = 0 ] || fail "$w0 was restarted $n times after a data error"
[ "$a" = failed ] || fail "$w0 is $a, expected failed"
line=$(ct journalctl --no-pager -o cat -u "$w0" -p err | grep "cannot read the training data" | head -n1)
case $line in *"/srv/empty-data/train-images-idx3-ubyte.gz: No such file or directory"*) ;;
*) fail "$w0's journal does not name the missing file: $line" ;; esac

step "psd on a taken address: exit 75, restarted"
# the container shares the host's network: hold the port here
python3 -c "
import socket, time
s = socket.socket(); s.bind(('127.0.0.1', $p_ps0)); s.listen(); time.sleep(60)" &
holder=$!
sleep 1
ps0=psfleet-psd@$job:0.service
ct systemctl start "$ps0" && fail "$ps0 started on a taken address"
restarted() { [ "$(prop "$ps0" NRestarts)" -ge 1 ]; }
for _ in $(seq 1 50); do restarted && break; sleep 0.2; done
restarted || fail "$ps0 was not restarted after exit 75"
# ExecMainStatus already describes the restarted run by now: systemd's own journal line tells the exit
ct journalctl --no-pager -o cat -u "$ps0" | grep -q "Main process exited, code=exited, status=75/TEMPFAIL" ||
        fail "$ps0: no exit with status 75 in its journal"
line=$(ct journalctl --no-pager -o cat -u "$ps0" -p err | grep "cannot listen on" | head -n1)
[ "$line" = "cannot listen on 127.0.0.1:$p_ps0: Address already in use" ] || fail "$ps0's journal: $line"
# the address stays taken: five starts within a minute end the loop (StartLimitBurst=5)
hit() {
        [ "$(prop "$ps0" ActiveState)" = failed ] &&
                ct journalctl --no-pager -o cat -u "$ps0" | grep -q "Start request repeated too quickly"
}
for _ in $(seq 1 150); do hit && break; sleep 0.2; done
hit || fail "$ps0 still restarting (NRestarts $(prop "$ps0" NRestarts), $(prop "$ps0" ActiveState))"
n=$(prop "$ps0" NRestarts)
sleep 5   # RestartSec=2s: a unit still looping would have started again
[ "$(prop "$ps0" NRestarts)" = "$n" ] && [ "$(prop "$ps0" ActiveState)" = failed ] || fail "$ps0 restarted after its start limit"
ct_log "$ps0: start limit hit after $n restarts; not started again"
ct systemctl reset-failed "$ps0" || true
ct systemctl stop "$ps0" || true

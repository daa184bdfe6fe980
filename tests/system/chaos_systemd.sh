#!/usr/bin/env bash
# Chaos under real systemd (issue 13): the .deb packages in a booted Debian container (as nspawn_test.sh
# installs them), then chaos_systemd.py drives jobs of the installed units from the host: kill -9 of
# each role with systemd restarting it, every checkpoint corrupted, `systemctl stop psfleet.target`
# and start, a job with fewer workers than listed and a worker back after 30 s.
#
#   chaos_systemd.sh PACKAGE_DIR [chaos_systemd.py options: --trials 5 --seed S --only ...]
# Environment: PSFLEET_TEST_CACHE, PSFLEET_TEST_KEEP=1 (as nspawn_test.sh)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
. "$here/container.sh"

ct_psfleet_test chaos_systemd chaos "${1:?usage: chaos_systemd.sh PACKAGE_DIR [options]}" || exit $?
shift
name=pfchaos-$$
cleanup() {
        local rc=$?
        if [ $rc -ne 0 ] && [ -n "$CT_INIT_PID" ]; then
                ct journalctl --no-pager -o short-monotonic -u 'psfleet-*' -n 150 >&2 || true
        fi
        ct_finish $rc "$work" "chaos under systemd"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ct_boot_psfleet "$name" "$work" "$cache" "$pkgdir" "$data"
ct_install "$work/apt.log" "${CT_DEBS[@]}" || fail "apt install"
ct_log "installed ${CT_DEBS[*]##*/}"

# Bounded below CTest's TIMEOUT, so that the teardown always runs.
timeout 1500 /usr/bin/python3 "$here/chaos_systemd.py" "$CT_INIT_PID" "$work/root" "$@"

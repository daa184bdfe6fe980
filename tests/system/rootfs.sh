#!/usr/bin/env bash
# Builds (once) the Debian 12 root filesystem the system test boots with systemd-nspawn, and prints the
# path of the cached tarball. The cache key covers everything that shapes the rootfs, so a change here
# builds a new one. Concurrent runs wait on a lock instead of building twice.
#
#   rootfs.sh [CACHE_DIR]      CACHE_DIR defaults to $PSFLEET_TEST_CACHE, else /var/cache/psfleet-test
#   ROOTFS_PRINT_MIRROR=1 rootfs.sh   prints the mirror it would use (from the host's apt sources), builds nothing
set -euo pipefail

cache=${1:-${PSFLEET_TEST_CACHE:-/var/cache/psfleet-test}}
suite=bookworm
# minbase has apt and dpkg; systemd-sysv makes systemd PID 1; dbus lets systemctl talk to it.
include=systemd,systemd-sysv,dbus
# The host's mirror (the container shares its network, and apt inside uses the same one): the first
# enabled `deb` source for $suite over http(s) in the host's apt sources, one-line (sources.list,
# sources.list.d/*.list) or deb822 (sources.list.d/*.sources), read in apt's order. Prints "URI FILE".
host_mirror() {
        local f files=()
        [ -f /etc/apt/sources.list ] && files+=(/etc/apt/sources.list)
        for f in /etc/apt/sources.list.d/*; do
                case $f in *.list | *.sources) [ -f "$f" ] && files+=("$f") ;; esac
        done
        [ ${#files[@]} -gt 0 ] || return 0
        awk -v suite="$1" '
                function has(list, word,   n, i, w) { n = split(list, w, /[ \t]+/); for (i = 1; i <= n; i++) if (w[i] == word) return 1; return 0 }
                function found(uri, file) { sub(/\/+$/, "", uri); print uri, file; done = 1; exit }
                function stanza() { if (deb && on && has(suites, suite)) { n = split(uris, u, /[ \t]+/); for (i = 1; i <= n; i++) if (u[i] ~ /^https?:\/\//) found(u[i], sf) } deb = 0; on = 1; uris = suites = "" }
                FNR == 1 { stanza(); sf = FILENAME }
                /^[ \t]*#/ { next }
                FILENAME ~ /\.sources$/ {
                        if ($0 ~ /^[ \t]*$/) { stanza(); next }
                        if (tolower($1) == "types:") deb = has($0, "deb")
                        else if (tolower($1) == "uris:") { uris = $0; sub(/^[^:]*:[ \t]*/, "", uris) }
                        else if (tolower($1) == "suites:") { suites = $0; sub(/^[^:]*:[ \t]*/, "", suites) }
                        else if (tolower($1) == "enabled:") on = (tolower($2) != "no")
                        next
                }
                $1 == "deb" {
                        line = $0; sub(/^[ \t]*deb[ \t]+/, "", line); sub(/^\[[^]]*\][ \t]*/, "", line)
                        split(line, w, /[ \t]+/)
                        if (w[2] == suite && w[1] ~ /^https?:\/\//) found(w[1], FILENAME)
                }
                END { if (!done) stanza() }' "${files[@]}"
}
read -r mirror mirror_file < <(host_mirror "$suite") || true
if [ -z "${mirror:-}" ]; then
        echo "rootfs.sh: no apt source for $suite over http(s) in /etc/apt/sources.list{,.d/*.list,.d/*.sources}" >&2
        exit 1
fi
if [ "${ROOTFS_PRINT_MIRROR:-}" = 1 ]; then        # what this machine would use, and nothing else
        echo "$mirror (from $mirror_file)"
        exit 0
fi
# v2: bump when the provisioning below changes.
key=$(printf '%s\n' v2 "$suite" "$include" "$mirror" | sha256sum | cut -c1-12)
tarball=$cache/rootfs-$suite-$key.tar

if [ -s "$tarball" ]; then
        echo "$tarball"
        exit 0
fi
for t in debootstrap tar; do
        command -v "$t" >/dev/null || { echo "rootfs.sh: $t is missing (apt-get install debootstrap)" >&2; exit 1; }
done
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if [ -s "$tarball" ]; then        # built by whoever held the lock
        echo "$tarball"
        exit 0
fi

work=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
echo "rootfs.sh: debootstrap $suite from $mirror into $work (about 90 s, once)" >&2
timeout 900 debootstrap --variant=minbase --include="$include" "$suite" "$work/root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
        tail -n 30 "$work/debootstrap.log" >&2
        exit 1
}
r=$work/root
# apt inside the container: the host's sources (bookworm, -updates, -security) and its tolerance of a
# snapshot mirror whose Release files are past their Valid-Until date.
if [ "$mirror_file" = /etc/apt/sources.list ]; then
        cp "$mirror_file" "$r/etc/apt/sources.list"
else
        cp "$mirror_file" "$r/etc/apt/sources.list.d/"
        : >"$r/etc/apt/sources.list"
fi
cat >"$r/etc/apt/apt.conf.d/90psfleet-test" <<'APT'
Acquire::Check-Valid-Until "false";
Acquire::Languages "none";
APT::Install-Recommends "false";
Binary::apt::APT::Keep-Downloaded-Packages "true";
APT
echo psfleet-test >"$r/etc/hostname"
# Nothing but systemd, journald and dbus needs to run: no console login, no timers that wake apt.
for u in console-getty.service getty@.service serial-getty@.service apt-daily.timer apt-daily-upgrade.timer \
         dpkg-db-backup.timer e2scrub_all.timer fstrim.timer systemd-timesyncd.service; do
        ln -sf /dev/null "$r/etc/systemd/system/$u"
done
timeout 300 chroot "$r" apt-get update -qq >/dev/null 2>&1 || echo "rootfs.sh: apt-get update in the rootfs failed; the test will retry" >&2
chroot "$r" apt-get clean
tar -C "$r" --numeric-owner -cf "$work/rootfs.tar" .
mv "$work/rootfs.tar" "$tarball"
echo "rootfs.sh: built $tarball ($(du -h "$tarball" | cut -f1)) in $(( $(date +%s) - start )) s" >&2
echo "$tarball"

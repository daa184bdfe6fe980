#!/usr/bin/env bash
# Builds psfleet's .deb and .rpm packages with CPack in the build directory, and checks them without a
# running systemd: the files and dependencies each package carries, lintian on every .deb, rpmlint on
# every .rpm, and an install of the .rpms into a scratch root with `rpm --root`.
# The packages stay in BUILD_DIR/packages for nspawn_test.sh.
#
#   packages_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail

build=$(cd "${1:?usage: packages_test.sh BUILD_DIR SOURCE_DIR}" && pwd)
src=$(cd "${2:?usage: packages_test.sh BUILD_DIR SOURCE_DIR}" && pwd)
out=$build/packages
t0=$(date +%s)
failures=0
x=$(mktemp -d "${TMPDIR:-/tmp}/psfleet-pkgtest.XXXXXX")
trap 'rm -rf "$x"' EXIT

log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
bad() { log "FAIL: $*"; failures=$((failures + 1)); }
for t in cpack dpkg-deb dpkg-shlibdeps objdump lintian rpm rpmbuild rpmlint; do
        command -v "$t" >/dev/null || { log "FAIL: $t is missing (Debian packages: cmake dpkg-dev binutils lintian rpm rpmlint)"; exit 1; }
done

log "cpack -G DEB;RPM -> $out"
rm -rf "$out"
mkdir -p "$out"
(cd "$build" && cpack -G "DEB;RPM" -B "$out") >"$out/cpack.log" 2>&1 || { tail -n 40 "$out/cpack.log" >&2; exit 1; }
rm -rf "$out/_CPack_Packages"
ls -l "$out"/*.deb "$out"/*.rpm | awk '{print "  " $5 "\t" $9}' >&2

version=$(sed -n 's/^set(CPACK_PACKAGE_VERSION "\(.*\)")$/\1/p' "$build/CPackConfig.cmake")
[ -n "$version" ] || { log "FAIL: no version in $build/CPackConfig.cmake"; exit 1; }

# ---- .deb: files, dependencies, scripts ----------------------------------------------------------

# expect_files FILELIST PATH...: every PATH is in FILELIST.
expect_files() {
        local list=$1 f
        shift
        for f in "$@"; do
                grep -qxF "$f" <<<"$list" || bad "$pkg: missing $f"
        done
}
deb() { ls "$out"/${1}_*.deb; }
for pkg in psfleet-common psfleet-psd psfleet-workerd psfleet-chiefd psfleet; do
        f=$(deb $pkg) || { bad "no $pkg .deb"; continue; }
        files=$(dpkg-deb -c "$f" | awk '{print $6}' | sed 's|^\./|/|')
        depends=$(dpkg-deb -f "$f" Depends)
        control=$(dpkg-deb --ctrl-tarfile "$f" | tar -t | sed 's|^\./||')
        expect_files "$files" /usr/share/doc/$pkg/copyright /usr/share/doc/$pkg/changelog.Debian.gz
        case $pkg in
        psfleet-common)
                expect_files "$files" /usr/lib/systemd/system/psfleet.target /usr/lib/sysusers.d/psfleet.conf \
                        /usr/lib/tmpfiles.d/psfleet.conf /etc/psfleet/psfleet.env /etc/psfleet/jobs/README \
                        /usr/share/doc/psfleet-common/examples/fmnist-mlp.json /usr/share/man/man5/psfleet-job.5.gz
                grep -q "systemd-sysusers" <<<"$depends" || bad "$pkg: Depends lacks systemd-sysusers: $depends"
                [ "$(dpkg-deb -f "$f" Architecture)" = all ] || bad "$pkg: not Architecture: all"
                ;;
        psfleet)
                expect_files "$files" /usr/bin/psfleet /usr/share/man/man1/psfleet.1.gz
                ;;
        *)
                role=${pkg#psfleet-}
                expect_files "$files" /usr/bin/$role "/usr/lib/systemd/system/psfleet-$role@.service" \
                        /usr/share/man/man8/$role.8.gz
                [ $role != workerd ] || expect_files "$files" /etc/psfleet/workerd.env \
                        /usr/share/doc/psfleet-workerd/examples/workerd-gpus.conf
                grep -q "psfleet-common (= $version-" <<<"$depends" || bad "$pkg: Depends lacks psfleet-common: $depends"
                ;;
        esac
        case $pkg in
        psfleet-common) ;;
        *)      # computed by dpkg-shlibdeps, not listed by hand (the daemons call sd_notify, the client does not)
                # psd computes nothing: its variables' layout comes from the job's model spec, so it
                # links no BLAS (and must not start to)
                libs="libc6 libgrpc libjansson4 libprotobuf-c1"
                [ $pkg = psfleet-psd ] || libs="$libs libopenblas"
                [ $pkg = psfleet ] || libs="$libs libsystemd0"
                for lib in $libs; do
                        grep -q "$lib" <<<"$depends" || bad "$pkg: Depends lacks $lib: $depends"
                done
                [ $pkg != psfleet-psd ] || ! grep -q libopenblas <<<"$depends" ||
                        bad "$pkg: depends on a BLAS it does not use: $depends" ;;
        esac
        case $pkg in
        psfleet) ;;
        *)      for s in postinst postrm; do grep -qx "$s" <<<"$control" || bad "$pkg: no $s"; done ;;
        esac
        log "$pkg: $(wc -l <<<"$files") paths; Depends: $depends"
done

# ---- every library a packaged program needs comes from a Debian package ----------------------------
# dpkg-shlibdeps (run by CPack with --ignore-missing-info) silently leaves out a library that no
# Debian package provides, e.g. one from /usr/local: the package would install and its program would
# not start. Resolve each DT_NEEDED entry as the dynamic linker would here and ask dpkg who owns it.
owner() {
        local p=$1 q o
        for q in "$p" "$(readlink -f "$p")" "${p#/usr}" "/usr$p"; do
                o=$(dpkg -S "$q" 2>/dev/null) && { echo "${o%%:*}"; return 0; }
        done
        return 1
}
ldcache=$(ldconfig -p)
for pkg in psfleet-psd psfleet-workerd psfleet-chiefd psfleet; do
        f=$(deb $pkg) || continue
        rm -rf "$x/root" && mkdir -p "$x/root" && dpkg-deb -x "$f" "$x/root"
        for bin in "$x"/root/usr/bin/*; do
                for lib in $(objdump -p "$bin" | awk '$1 == "NEEDED" {print $2}'); do
                        path=$(awk -v l="$lib" '$1 == l && /x86-64/ {print $NF; exit}' <<<"$ldcache")
                        if [ -z "$path" ]; then
                                bad "$pkg: ${bin##*/} needs $lib, which this machine does not have"
                        elif ! o=$(owner "$path"); then
                                bad "$pkg: ${bin##*/} needs $lib ($path), which no Debian package provides: Depends cannot cover it and the program will not start where it is missing"
                        fi
                done
        done
done

# ---- lintian --------------------------------------------------------------------------------------

log "lintian (errors and warnings fail, info tags are shown; overrides in packaging/lintian/ say why)"
if ! lintian --fail-on error,warning --display-info "$out"/*.deb >"$out/lintian.log" 2>&1; then
        bad "lintian:"
        cat "$out/lintian.log" >&2
else
        grep -v "running with root privileges" "$out/lintian.log" | sed 's/^/  /' >&2 || true
fi

# ---- rpmlint --------------------------------------------------------------------------------------

log "rpmlint -s (every finding fails; packaging/rpmlint.toml filters say why)"
if ! rpmlint -s -c "$src/packaging/rpmlint.toml" "$out"/*.rpm >"$out/rpmlint.log" 2>&1; then
        bad "rpmlint:"
        cat "$out/rpmlint.log" >&2
else
        grep -E "checked;" "$out/rpmlint.log" | sed 's/^ */  /' >&2 || true
fi

# ---- rpm --root -----------------------------------------------------------------------------------

root=$x/rpmroot
mkdir -p "$root"
log "rpm --root $root: install all five"
rpm --root "$root" --initdb
# --nodeps: the scratch root has none of the libraries; --noscripts: nor a shell to run scriptlets in.
# What they would need is what -qR lists below.
# (Debian's rpm warns that it is not Debian's package manager: dropped from the log.)
rpm --root "$root" -i --nodeps --noscripts --nosignature "$out"/*.rpm >"$out/rpm-install.log" 2>&1 || bad "rpm --root -i"
grep -v "^rpm: " "$out/rpm-install.log" >&2 || true
installed=$(rpm --root "$root" -qa --qf '%{NAME}\n' | sort)
[ "$installed" = "$(printf '%s\n' psfleet psfleet-chiefd psfleet-common psfleet-psd psfleet-workerd)" ] ||
        bad "rpm -qa in the scratch root: $installed"
for pkg in psfleet-common psfleet-psd psfleet-workerd psfleet-chiefd psfleet; do
        files=$(rpm --root "$root" -ql "$pkg")
        requires=$(rpm --root "$root" -qR "$pkg")
        case $pkg in
        psfleet-common)
                expect_files "$files" /usr/lib/systemd/system/psfleet.target /usr/lib/sysusers.d/psfleet.conf \
                        /usr/lib/tmpfiles.d/psfleet.conf /etc/psfleet/psfleet.env /etc/psfleet/jobs/README
                grep -qx /etc/psfleet/psfleet.env <<<"$(rpm --root "$root" -qc "$pkg")" ||
                        bad "$pkg: /etc/psfleet/psfleet.env is not %config"
                grep -q "^systemd" <<<"$requires" || bad "$pkg: does not require systemd"
                ;;
        psfleet)
                expect_files "$files" /usr/bin/psfleet /usr/share/man/man1/psfleet.1.gz ;;
        *)
                role=${pkg#psfleet-}
                expect_files "$files" /usr/bin/$role "/usr/lib/systemd/system/psfleet-$role@.service" \
                        /usr/share/man/man8/$role.8.gz
                grep -q "^psfleet-common = $version" <<<"$requires" || bad "$pkg: does not require psfleet-common"
                ;;
        esac
        case $pkg in
        psfleet-common) ;;
        *)      # computed by rpm's autoreq
                libs="libgrpc.so. libjansson.so.4()(64bit) libprotobuf-c.so.1()(64bit) libc.so.6(GLIBC_"
                [ $pkg = psfleet ] || libs="$libs libsystemd.so.0()(64bit)"
                for lib in $libs; do
                        grep -qF "$lib" <<<"$requires" || bad "$pkg: does not require $lib"
                done ;;
        esac
        for f in $files; do
                [ -e "$root$f" ] || bad "$pkg: $f listed but not in the scratch root"
        done
        grep -q "\.Debian\.gz\|lintian" <<<"$files" && bad "$pkg: the .rpm carries Debian-only files"
        log "$pkg.rpm: $(wc -l <<<"$files") files; requires: $(grep -c . <<<"$requires")," \
            "$(grep -E '^(psfleet|systemd|libgrpc)' <<<"$requires" | tr '\n' ' ')"
done

log "packages: $failures failure(s) in $(( $(date +%s) - t0 )) s"
[ "$failures" -eq 0 ]

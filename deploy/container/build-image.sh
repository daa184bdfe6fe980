#!/usr/bin/env bash
# Builds psfleet's image from the .debs in PKGDIR (cpack's output, or the release's) with podman:
# psfleet:VERSION (the .debs' version) and psfleet:latest. Prints the VERSION tag.
#
#   build-image.sh PKGDIR [podman build options...]
#   build-image.sh build/packages --build-arg BASE=localhost/debian:bookworm-local
#
# Options after PKGDIR go to `podman build` (another BASE, DATA= for an image without the data, --network).
set -euo pipefail

pkgdir=${1:?usage: build-image.sh PKGDIR [podman build options...]}
shift
here=$(cd "$(dirname "$0")" && pwd)
ctx=$(mktemp -d "${TMPDIR:-/tmp}/psfleet-image.XXXXXX")
trap 'rm -rf "$ctx"' EXIT

for p in psfleet-common psfleet-psd psfleet-workerd psfleet-chiefd psfleet; do
        f=("$pkgdir/${p}_"*.deb)
        [ -f "${f[0]}" ] || { echo "build-image.sh: no ${p}_*.deb in $pkgdir" >&2; exit 1; }
        cp "${f[0]}" "$ctx/"
done
version=$(dpkg-deb -f "$ctx"/psfleet_*.deb Version)
tag=psfleet:${version%-*}
cp "$here/Containerfile" "$ctx/"
podman build -t "$tag" -t psfleet:latest "$@" "$ctx" >&2
echo "$tag"

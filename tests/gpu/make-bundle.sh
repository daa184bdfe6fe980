#!/bin/bash
# Prepares the folder that tests/gpu/device-check.sh takes to a GPU machine with no package registry:
# the prebuilt test and bench programs (and the daemons, when built), the shared libraries they need
# that such a machine may lack (found with ldd; glibc, libstdc++ and the CUDA libraries stay behind:
# the GPU machine has its own, PyTorch's among them), the headers for building there instead, and the
# Fashion-MNIST for the daemons' runs. Libraries travel xz-compressed (the device tool
# carries at most 64 MiB with the working tree).
#
#   tests/gpu/make-bundle.sh [BUILD_DIR [BUNDLE_DIR]]      defaults: build .gpu-bundle
#
# Run it from the repository root after `cmake --preset default && cmake --build --preset default`.
# It adds BUNDLE_DIR to .git/info/exclude so that it travels only when named in `carry`.
set -euo pipefail
build=${1:-build}
bundle=${2:-.gpu-bundle}
root=$(git rev-parse --show-toplevel)
cd "$root"

programs=(test_backend_equiv test_device_cuda bench_cnn workerd psd chiefd psfleet)
# (the CLI's target is psfleet_cli; `psfleet` is the library)
cmake --build "$build" -j2 --target test_backend_equiv test_device_cuda bench_cnn workerd psd chiefd psfleet_cli \
        >/dev/null 2>&1 || cmake --build "$build" -j2 --target test_backend_equiv test_device_cuda bench_cnn >/dev/null

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/include" "$bundle/data"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib"

for t in "${programs[@]}"; do
        f=$(find "$build" -type f -name "$t" -perm -u+x | head -1)
        [ -n "$f" ] || continue
        strip --strip-debug -o "$bundle/bin/$t" "$f"
done

# Libraries: everything ldd resolves except the C library family, the C++ runtime and CUDA's own.
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libresolv\.|libgcc_s\.|libstdc\+\+\.|libcuda\.|libcudart|libcublas|libcudnn|libnccl|libnvrtc|libnvJitLink)'
for b in "$bundle"/bin/*; do
        ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
        if [[ ! $name =~ $skip ]]; then
                cp -L "$path" "$stage/lib/$name"
        fi
done
tar -C "$stage" -cJf "$bundle/lib.tar.xz" lib

# The CUDA plugin, where the bundle's programs look for it (<bin>/../lib/psfleet/, as installed): what
# `cmake --install --component cuda` installs, so its name and directory are CMake's. plugin.env
# records both for building there (device-check.sh).
DESTDIR="$stage/cuda" cmake --install "$build" --prefix /p --component cuda >/dev/null
plugin=$(cd "$stage/cuda/p" && find . -type f -name '*.so' | sed 's|^\./||' | head -1)
if [ -n "$plugin" ]; then
        mkdir -p "$bundle/$(dirname "$plugin")"
        strip --strip-debug -o "$bundle/$plugin" "$stage/cuda/p/$plugin"
        bindir=$(sed -n 's/^CMAKE_INSTALL_BINDIR:[A-Z]*=//p' "$build/CMakeCache.txt")
        reldir=$(realpath -m --relative-to="/p/${bindir:-bin}" "/p/$(dirname "$plugin")")
        printf 'PLUGIN_FILE=%s\nPLUGIN_RELDIR=%s\n' "$(basename "$plugin")" "$reldir" >"$bundle/plugin.env"
fi

# Headers for building on the GPU machine when the prebuilt programs cannot run there.
for h in /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h \
         /usr/include/x86_64-linux-gnu/openblas-pthread/openblas_config.h \
         /usr/include/jansson.h /usr/include/jansson_config.h; do
        [ -f "$h" ] && cp "$h" "$bundle/include/"
done
cuda_inc=$(dirname "$(find /usr/local/cuda/include /usr/include -maxdepth 1 -name cudnn.h 2>/dev/null | head -1)")
cp "$cuda_inc"/cudnn*.h "$bundle/include/" 2>/dev/null || true

# Fashion-MNIST, both splits (30 MiB): the daemons' runs on the GPU report test accuracy.
fm=/usr/share/datasets/fashion-mnist
for f in t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz; do
        [ -f "$fm/$f" ] && cp "$fm/$f" "$bundle/data/"
done

(cd "$bundle/bin" && for b in *; do echo "$b $(sha256sum "$b" | cut -c1-16)"; done) >"$bundle/MANIFEST"
echo "built $(date -u +%FT%TZ) on $(. /etc/os-release; echo "$PRETTY_NAME"), $(nvcc --version 2>/dev/null | tail -1)" \
        >>"$bundle/MANIFEST"

exclude=$(git rev-parse --git-path info/exclude)
grep -qxF "/$bundle/" "$exclude" 2>/dev/null || echo "/$bundle/" >>"$exclude"
echo "bundle $bundle: $(du -sh "$bundle" | cut -f1) ($(ls "$bundle/bin" | tr '\n' ' ')$(cat "$bundle/plugin.env" 2>/dev/null | tr '\n' ' '))"

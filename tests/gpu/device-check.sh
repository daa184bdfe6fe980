#!/bin/bash
# The GPU check, in one go, on a machine with one NVIDIA GPU, PyTorch and no package registry:
#   1. the GPU and driver;
#   2. the programs: prebuilt ones from the bundle (tests/gpu/make-bundle.sh) when they load there, else
#      built there from this checkout with nvcc and gcc against the bundle's headers and libraries;
#   3. tests/gpu/test_backend_equiv (every CUDA op against the CPU backend) and test_device_cuda;
#   4. CNN examples/s, as JSON lines: psfleet's training step on the GPU (bench_cnn: model.c on the
#      CUDA backend, what workerd runs per step, without the RPC), next to PyTorch on the same GPU with
#      the same model, batch and optimizer (tests/gpu/torch_cnn_gpu.py); then, when the bundle holds
#      the daemons and data, a short `psfleet local` job with workerd on the GPU.
# All within about 10 minutes. Every result line is JSON; the full log goes to $OUT/device-check.log
# when OUT is set (the device tool's output folder), else to the work folder it prints.
#
#   tests/gpu/device-check.sh [BUNDLE_DIR]        default .gpu-bundle
#
# With the device tool (docs/gpu.md): run tests/gpu/make-bundle.sh here, then
#   run(command="bash tests/gpu/device-check.sh", carry=[".gpu-bundle"], timeout_s=600)
# PSFLEET_CHECK_BUILD=1 builds there even when the prebuilt programs load.
# Exit status: 0 all checks passed, 1 a check failed, 2 the programs could not be had.
set -u
bundle=${1:-.gpu-bundle}
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
work=$(mktemp -d /tmp/psfleet-gpu.XXXXXX)
log=${OUT:-$work}/device-check.log
mkdir -p "$(dirname "$log")"
t_start=$(date +%s)
status=0

note() { echo "# $*"; }
jline() { echo "$1"; }  # one JSON result line
elapsed() { echo $(($(date +%s) - t_start)); }

main() {
# ---- 1. the GPU ----
if ! nvidia-smi -L >/dev/null 2>&1; then
        jline '{"check": "gpu", "pass": false, "error": "nvidia-smi finds no GPU"}'
fi
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
jline "{\"check\": \"gpu\", \"nvidia_smi\": \"$gpu\", \"bundle\": \"$(tail -1 "$bundle/MANIFEST" 2>/dev/null)\"}"

# ---- 2. libraries and programs ----
mkdir -p "$work/lib"
[ -f "$bundle/lib.tar.xz" ] && tar -C "$work" -xJf "$bundle/lib.tar.xz"
# CUDA's libraries on that machine: the toolkit's, or the ones PyTorch's wheels brought.
site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null)
cuda_dirs=""
for l in libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libcudnn_cnn.so.9 libnccl.so.2 libcudart.so.13; do
        f=$(find /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib ${site:+$site/nvidia} \
                ${site:+$site/torch/lib} /usr/lib/x86_64-linux-gnu -maxdepth 5 -name "$l*" 2>/dev/null | head -1)
        if [ -n "$f" ]; then
                d=$(dirname "$f")
                case ":$cuda_dirs:" in *":$d:"*) ;; *) cuda_dirs="$cuda_dirs:$d" ;; esac
        else
                note "$l not found"
        fi
done
[ -d /usr/local/nvidia/lib64 ] && cuda_dirs="$cuda_dirs:/usr/local/nvidia/lib64"
LDP="$work/lib${cuda_dirs}"
note "library path for psfleet's programs: $LDP"
run_env() { env LD_LIBRARY_PATH="$LDP${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }

bin="$root/$bundle/bin"
loads() { [ -x "$1" ] && ! run_env ldd "$1" 2>/dev/null | grep -q "not found"; }
if [ "${PSFLEET_CHECK_BUILD:-0}" != 1 ] && loads "$bin/test_backend_equiv" && loads "$bin/bench_cnn"; then
        note "using the bundle's prebuilt programs"
        built=prebuilt
else
        note "prebuilt programs missing or not loadable here; building from the checkout"
        [ -x "$bin/bench_cnn" ] && run_env ldd "$bin/bench_cnn" | grep "not found"
        bin="$work/bin"
        mkdir -p "$bin" "$work/obj"
        inc="-I$root/$bundle/include"
        for room in "$root"/services/common "$root"/services/common/*/; do inc="$inc -I$room"; done
        cudnn_inc=$(find ${site:+$site/nvidia} /usr/local/cuda/include /usr/include -maxdepth 4 -name cudnn.h 2>/dev/null | head -1)
        [ -n "$cudnn_inc" ] && inc="$inc -I$(dirname "$cudnn_inc")"
        libs="-L$work/lib -l:libopenblas.so.0 -l:libjansson.so.4"
        for d in ${cuda_dirs//:/ }; do libs="$libs -L$d"; done
        libs="$libs -l:libcublas.so.13 -l:libcublasLt.so.13 -l:libcudnn.so.9 -lpthread -ldl -lrt -lm"
        common="device.c backend_cpu.c model.c rng.c util.c config.c config_keys.c config_cluster.c
                config_canonical.c device_spec.c optim.c"
        # The plugin's name and place relative to the programs, as CMake made them (make-bundle.sh).
        PLUGIN_FILE= PLUGIN_RELDIR=
        [ -f "$bundle/plugin.env" ] && . "$bundle/plugin.env"
        if [ -z "$PLUGIN_FILE" ] || [ -z "$PLUGIN_RELDIR" ]; then
                jline '{"check": "build", "pass": false, "error": "no plugin.env in the bundle: run tests/gpu/make-bundle.sh"}'
                return 2
        fi
        plugdefs="-DPSFLEET_CUDA_PLUGIN_FILE=\"$PLUGIN_FILE\" -DPSFLEET_CUDA_PLUGIN_RELDIR=\"$PLUGIN_RELDIR\""
        ok=1
        nvcc -O2 -std=c++17 -gencode arch=compute_90,code=sm_90 -Xcompiler -fPIC -DPSFLEET_VERSION='"device-check"' \
                -D_GNU_SOURCE $inc -c "$root/services/workerd/backend/backend_cuda.cu" -o "$work/obj/backend_cuda.o" || ok=0
        mkdir -p "$bin/$PLUGIN_RELDIR"
        nvcc -shared -o "$bin/$PLUGIN_RELDIR/$PLUGIN_FILE" "$work/obj/backend_cuda.o" $libs || ok=0
        for s in $common; do
                gcc -std=c11 -O2 -D_GNU_SOURCE -DPSFLEET_VERSION='"device-check"' $plugdefs $inc \
                        -c "$(ls "$root"/services/common/*/"$s")" -o "$work/obj/${s%.c}.o" || ok=0
        done
        objs="$work/obj/backend_cuda.o"
        for s in $common; do objs="$objs $work/obj/${s%.c}.o"; done
        for p in tests/gpu/test_backend_equiv tests/bench/bench_cnn; do
                gcc -std=c11 -O2 -D_GNU_SOURCE -DPSFLEET_SOURCE_DIR="\"$root\"" $inc -c "$root/$p.c" -o "$work/obj/p.o" &&
                        nvcc -o "$bin/$(basename $p)" "$work/obj/p.o" $objs $libs || ok=0
        done
        if [ $ok = 0 ] || ! loads "$bin/test_backend_equiv"; then
                jline '{"check": "build", "pass": false}'
                return 2
        fi
        built=built-here
fi
jline "{\"check\": \"programs\", \"how\": \"$built\", \"elapsed_s\": $(elapsed)}"

# ---- 3. equivalence ----
run_env timeout 300 "$bin/test_backend_equiv" | tee "$work/equiv.txt"
rc=${PIPESTATUS[0]}
nfail=$(grep -c '"pass": false' "$work/equiv.txt")
npass=$(grep -c '"pass": true' "$work/equiv.txt")
jline "{\"check\": \"test_backend_equiv\", \"rc\": $rc, \"checks_passed\": $npass, \"checks_failed\": $nfail, \"elapsed_s\": $(elapsed)}"
[ "$rc" = 0 ] || status=1
if [ -x "$bin/test_device_cuda" ]; then
        run_env timeout 120 "$bin/test_device_cuda" >"$work/device.txt" 2>&1
        rc=$?
        grep -E "auto:" "$work/device.txt"
        jline "{\"check\": \"test_device_cuda\", \"rc\": $rc}"
        [ "$rc" = 0 ] || status=1
fi

# ---- 4. CNN examples/s, psfleet next to PyTorch ----
cfg="$root/examples/fmnist-cnn.json"
note "psfleet: one training step of $cfg's model per iteration, batch 64, on gpu:0"
run_env timeout 120 "$bin/bench_cnn" --config "$cfg" --device gpu:0 --steps 300 || status=1
PSFLEET_CUDA_TF32=1 run_env timeout 120 "$bin/bench_cnn" --config "$cfg" --device gpu:0 --steps 300 |
        sed 's/"bench": "cnn"/"bench": "cnn", "mode": "tf32"/'
run_env timeout 120 "$bin/bench_cnn" --config "$cfg" --device gpu:0 --steps 50 --profile |
        sed 's/"bench": "cnn"/"bench": "cnn", "mode": "profile (synchronizes after every op)"/'
run_env timeout 120 "$bin/bench_cnn" --config "$cfg" --device gpu:0 --steps 100 --batch 512 |
        sed 's/"bench": "cnn"/"bench": "cnn", "mode": "batch 512"/'
note "PyTorch on the same GPU"
PYTHONUNBUFFERED=1 timeout 180 python3 "$root/tests/gpu/torch_cnn_gpu.py" --steps 300 || status=1
PYTHONUNBUFFERED=1 timeout 60 python3 "$root/tests/gpu/torch_cnn_gpu.py" --steps 100 --batch 512 --modes fp32 |
        sed 's/"mode": "fp32"/"mode": "fp32 batch 512"/'

# ---- 5. workerd on the GPU in a real job (1 ps, 1 worker), when the bundle has it ----
if [ -x "$bin/psfleet" ] && [ -x "$bin/workerd" ] && [ -f "$bundle/data/t10k-images-idx3-ubyte.gz" ] &&
        [ $(elapsed) -lt 400 ]; then
        job="$work/fmnist-cnn-gpu.json"
        python3 - "$cfg" "$root/$bundle/data" "$job" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
j["job"] = "fmnist-cnn-gpu"
# the test split serves as training data too: this run measures speed, not accuracy
j["data"] = {"dir": sys.argv[2], "train_images": "t10k-images-idx3-ubyte.gz",
             "train_labels": "t10k-labels-idx1-ubyte.gz", "test_images": "t10k-images-idx3-ubyte.gz",
             "test_labels": "t10k-labels-idx1-ubyte.gz"}
j["training"]["max_steps"] = 600
j["device"] = {"device": "gpu:0", "allow_growth": True, "log_device_placement": True}
json.dump(j, open(sys.argv[3], "w"), indent=1)
EOF
        for mode in "" "--standalone"; do
                PSFLEET_BIN_DIR="$bin" run_env timeout 150 "$bin/psfleet" local $mode "$job" </dev/null \
                        >"$work/local.json" 2>"$work/local.err"
                rc=$?
                line=$(tail -1 "$work/local.json")
                [ -n "$line" ] || line='{}'
                echo "${line%\}}, \"check\": \"psfleet local ${mode:-(1 ps, 1 worker)}\", \"device\": \"gpu:0\", \"rc\": $rc, \"note\": \"trained and tested on the test split: speed only\"}"
                grep -i -E "gpu|cuda|device|placement" "$work/local.err" | head -20
        done
else
        note "skipping the psfleet local run (no daemons or data in the bundle, or too little time left)"
fi

jline "{\"check\": \"device-check\", \"pass\": $([ $status = 0 ] && echo true || echo false), \"elapsed_s\": $(elapsed), \"log\": \"$log\"}"
return $status
}

# Everything to the terminal and to the log; the exit status is main's.
main 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"

#!/bin/bash
# The GPU check, in one go, on a machine with one NVIDIA GPU, PyTorch and no package registry:
#   1. the GPU and driver;
#   2. the programs: prebuilt ones from the bundle (tests/gpu/make-bundle.sh) when they load there, else
#      built there from this checkout with nvcc and gcc against the bundle's headers and libraries;
#   3. tests/gpu/test_backend_equiv (every CUDA op against the CPU backend, every graph op's CUDA kernels
#      against the CPU's) and test_device_cuda;
#   4. cuBLAS SGEMM's peak (tests/gpu/sgemm_peak.py, through PyTorch), then examples/s and TFLOP/s of
#      psfleet's step (bench_cnn: model.c on the backend, what workerd runs per step without the RPC) for
#      the CNN at batch 64 to 4096 (standalone, worker, and profiled per op) and the MLP, and the CPU
#      backend on the same machine;
#   5. when the bundle holds the daemons and data, real jobs (psfleet local, 1 ps + 1 worker, gpu:0): the
#      demo MLP, two MLP jobs sharing the GPU at gpu_memory_fraction 0.4 (one reserving, one growing,
#      nvidia-smi sampled), two replicas on the one GPU (gpu:0,0) against one, the CNN, and the ResNet
#      example as a graph model (exported there by examples/models/export.py) for 300 steps;
#   6. PyTorch on the same GPU with the same CNN, batch and optimizer (tests/gpu/torch_cnn_gpu.py).
# About 4 minutes on an H200. Every result line is JSON; the full log goes to $OUT/device-check.log
# when OUT is set (the device tool's output folder), else to the work folder it prints.
#
#   tests/gpu/device-check.sh [BUNDLE_DIR]        default .gpu-bundle
#
# With the device tool (docs/gpu.md): run tests/gpu/make-bundle.sh here, then
#   run(command="bash tests/gpu/device-check.sh", carry=[".gpu-bundle"], timeout_s=600)
# PSFLEET_CHECK_BUILD=1 builds there even when the prebuilt programs load; PSFLEET_CHECK_ONLY=equiv stops
# after the equivalence tests (a short first call), PSFLEET_CHECK_ONLY=benches after the benchmarks.
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
        # (Incomplete: config_model.c now reaches the ONNX loader, whose protobuf-c sources CMake
        # generates into the build tree, and log.c libsystemd; the prebuilt bundle is the path that works.)
        common="device.c backend_cpu.c model.c model_pass.c model_graph.c model_spec.c rng.c util.c log.c
                config.c config_keys.c config_env.c config_model.c config_sparse.c config_cluster.c
                config_canonical.c device_spec.c optim.c optim_slots.c graph.c graph_exec.c graph_ops.c
                graph_k_blas.c graph_k_conv.c graph_k_elem.c graph_k_matmul.c graph_k_shape.c"
        # The plugin's name and place relative to the programs, as CMake made them (make-bundle.sh).
        PLUGIN_FILE= PLUGIN_RELDIR=
        [ -f "$bundle/plugin.env" ] && . "$bundle/plugin.env"
        if [ -z "$PLUGIN_FILE" ] || [ -z "$PLUGIN_RELDIR" ]; then
                jline '{"check": "build", "pass": false, "error": "no plugin.env in the bundle: run tests/gpu/make-bundle.sh"}'
                return 2
        fi
        plugdefs="-DPSFLEET_CUDA_PLUGIN_FILE=\"$PLUGIN_FILE\" -DPSFLEET_CUDA_PLUGIN_RELDIR=\"$PLUGIN_RELDIR\""
        ok=1
        for cu in backend_cuda graph_cuda; do
                nvcc -O2 -std=c++17 -gencode arch=compute_90,code=sm_90 -Xcompiler -fPIC -DPSFLEET_VERSION='"device-check"' \
                        -D_GNU_SOURCE $inc -c "$root/services/workerd/backend/$cu.cu" -o "$work/obj/$cu.o" || ok=0
        done
        mkdir -p "$bin/$PLUGIN_RELDIR"
        nvcc -shared -o "$bin/$PLUGIN_RELDIR/$PLUGIN_FILE" "$work/obj/backend_cuda.o" "$work/obj/graph_cuda.o" $libs || ok=0
        for s in $common; do
                gcc -std=c11 -O2 -D_GNU_SOURCE -DPSFLEET_VERSION='"device-check"' $plugdefs $inc \
                        -c "$(ls "$root"/services/common/*/"$s")" -o "$work/obj/${s%.c}.o" || ok=0
        done
        objs="$work/obj/backend_cuda.o $work/obj/graph_cuda.o"
        for s in $common; do objs="$objs $work/obj/${s%.c}.o"; done
        for p in tests/gpu/test_backend_equiv tests/bench/bench_cnn; do
                gcc -std=c11 -O2 -D_GNU_SOURCE -DPSFLEET_SOURCE_DIR="\"$root\"" $inc -I"$root/tests/unit" -c "$root/$p.c" -o "$work/obj/p.o" &&
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
run_env timeout 150 "$bin/test_backend_equiv" | tee "$work/equiv.txt"
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

if [ "${PSFLEET_CHECK_ONLY:-}" = equiv ]; then
        jline "{\"check\": \"device-check\", \"only\": \"equiv\", \"pass\": $([ $status = 0 ] && echo true || echo false), \"elapsed_s\": $(elapsed)}"
        return $status
fi

# ---- 4. the ceiling: cuBLAS SGEMM's peak (through PyTorch), then psfleet's step on the GPU and the CPU ----
PYTHONUNBUFFERED=1 timeout 60 python3 "$root/tests/gpu/sgemm_peak.py" | tee "$work/sgemm.txt"
cfg="$root/examples/fmnist-cnn.json"
mlp="$root/examples/fmnist-mlp.json"
note "psfleet: one training step of $cfg's model per iteration (model.c on the backend, host Momentum)"
for b in 64 512 2048 4096; do
        run_env timeout 60 "$bin/bench_cnn" --config "$cfg" --device gpu:0 --steps 200 --batch $b || status=1
        run_env timeout 60 "$bin/bench_cnn" --config "$cfg" --device gpu:0 --steps 200 --batch $b --worker-step
        run_env timeout 60 "$bin/bench_cnn" --config "$cfg" --device gpu:0 --steps 30 --batch $b --profile |
                sed 's/"bench": "cnn"/"bench": "cnn", "mode": "profile (synchronizes after every op)"/'
done
PSFLEET_CUDA_TF32=1 run_env timeout 60 "$bin/bench_cnn" --config "$cfg" --device gpu:0 --steps 200 --batch 512 |
        sed 's/"bench": "cnn"/"bench": "cnn", "mode": "tf32"/'
for b in 64 512; do
        run_env timeout 60 "$bin/bench_cnn" --config "$mlp" --device gpu:0 --steps 300 --batch $b |
                sed 's/"bench": "cnn"/"bench": "mlp"/'
done
ncpu=$(nproc)
note "the CPU backend on this machine's $ncpu cores"
run_env timeout 90 "$bin/bench_cnn" --config "$cfg" --device cpu --threads "1,$ncpu" --steps 20 || status=1
run_env timeout 90 "$bin/bench_cnn" --config "$cfg" --device cpu --threads "$ncpu" --steps 10 --batch 512
run_env timeout 30 "$bin/bench_cnn" --config "$mlp" --device cpu --threads 1 --steps 300 |
        sed 's/"bench": "cnn"/"bench": "mlp"/'
jline "{\"check\": \"benches\", \"elapsed_s\": $(elapsed)}"
if [ "${PSFLEET_CHECK_ONLY:-}" = benches ]; then
        jline "{\"check\": \"device-check\", \"only\": \"benches\", \"pass\": $([ $status = 0 ] && echo true || echo false), \"elapsed_s\": $(elapsed)}"
        return $status
fi

# ---- 5. workerd on the GPU in real jobs (1 ps, 1 worker) ----
data="$root/$bundle/data"
# mkjob SRC OUT NAME DEVICE-JSON MAX_STEPS (0: the example's): the example with this run's data, device, name
mkjob() {
        python3 -c '
import json, os, sys
src, out, name, dev, steps, data = sys.argv[1:7]
j = json.load(open(src))
j["job"] = name
j["data"] = {"dir": data}
if not os.path.exists(os.path.join(data, "train-images-idx3-ubyte.gz")):
    # speed only: the test split serves as training data too
    j["data"].update({"train_images": "t10k-images-idx3-ubyte.gz", "train_labels": "t10k-labels-idx1-ubyte.gz"})
if int(steps):
    j["training"]["max_steps"] = int(steps)
j["device"] = json.loads(dev)
json.dump(j, open(out, "w"), indent=1)
' "$@" "$data"
}
# local_job LABEL JOB TIMEOUT [ARGS...]: one psfleet local run (1 ps, 1 worker); its result line, labelled
local_job() {
        local label=$1 job=$2 tmo=$3
        shift 3
        PSFLEET_BIN_DIR="$bin" run_env timeout "$tmo" "$bin/psfleet" local --ps 1 --workers 1 "$@" "$job" </dev/null \
                >"$work/$label.json" 2>"$work/$label.err"
        local rc=$? line
        line=$(tail -1 "$work/$label.json")
        case "$line" in
        "{"*"}") echo "${line%\}}, \"check\": \"psfleet local $label\", \"rc\": $rc}" ;;
        *) echo "{\"check\": \"psfleet local $label\", \"rc\": $rc}" ;;
        esac
        grep -i -E "cuda|device|placement|memory cap|error|fail|done:" "$work/$label.err" | head -14
        [ $rc = 0 ] || tail -5 "$work/$label.err"
        return $rc
}
if [ -x "$bin/psfleet" ] && [ -x "$bin/workerd" ] && [ -f "$data/t10k-images-idx3-ubyte.gz" ]; then
        mkjob "$mlp" "$work/mlp.json" fmnist-mlp-gpu '{"device": "gpu:0", "log_device_placement": true}' 0
        local_job mlp-gpu "$work/mlp.json" 120 || status=1
        # two jobs on the one GPU, 0.4 of its memory each: one reserves its share, one grows
        mkjob "$mlp" "$work/a.json" share-a '{"device": "gpu:0", "gpu_memory_fraction": 0.4}' 3000
        mkjob "$mlp" "$work/b.json" share-b '{"device": "gpu:0", "gpu_memory_fraction": 0.4, "allow_growth": true}' 3000
        (local_job share-a-reserved "$work/a.json" 120 >"$work/share-a.out") &
        pa=$!
        (local_job share-b-growth "$work/b.json" 120 >"$work/share-b.out") &
        pb=$!
        for i in $(seq 1 60); do
                sleep 1
                kill -0 $pa 2>/dev/null || kill -0 $pb 2>/dev/null || break
                m=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)
                apps=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null | tr '\n' ';')
                [ $((i % 3)) = 1 ] && echo "{\"check\": \"two jobs\", \"t_s\": $i, \"gpu_memory_used_mib\": \"$m\", \"apps\": \"$apps\"}"
        done
        wait $pa || status=1
        wait $pb || status=1
        cat "$work/share-a.out" "$work/share-b.out"
        # two replicas on the one GPU (the replica path), against one
        if [ $(elapsed) -lt 330 ]; then
                mkjob "$mlp" "$work/rep.json" rep2 '{"device": "gpu:0,0", "allow_growth": true}' 3000
                local_job replicas-gpu0x2 "$work/rep.json" 60
                mkjob "$mlp" "$work/rep1.json" rep1 '{"device": "gpu:0", "allow_growth": true}' 3000
                local_job replicas-gpu0x1 "$work/rep1.json" 60
        fi
        if [ $(elapsed) -lt 330 ]; then
                mkjob "$cfg" "$work/cnn.json" fmnist-cnn-gpu '{"device": "gpu:0", "allow_growth": true}' 0
                local_job cnn-gpu "$work/cnn.json" 150 || status=1
        fi
        # a graph model (model.onnx) on the GPU: the ResNet example through the CUDA graph kernels
        if [ $(elapsed) -lt 360 ] && python3 "$root/examples/models/export.py" --out "$work" --model resnet >/dev/null; then
                mkjob "$root/examples/models/resnet.json" "$work/resnet.json" resnet-gpu \
                        '{"device": "gpu:0", "allow_growth": true, "log_device_placement": true}' 300
                local_job resnet-graph-gpu "$work/resnet.json" 150 || status=1
        fi
else
        note "skipping the psfleet local runs (no daemons or data in the bundle)"
fi

# ---- 6. PyTorch on the same GPU, same CNN, when time is left ----
if [ $(elapsed) -lt 420 ]; then
        PYTHONUNBUFFERED=1 timeout 90 python3 "$root/tests/gpu/torch_cnn_gpu.py" --steps 300 || status=1
fi

jline "{\"check\": \"device-check\", \"pass\": $([ $status = 0 ] && echo true || echo false), \"elapsed_s\": $(elapsed), \"log\": \"$log\"}"
return $status
}

# Everything to the terminal and to the log; the exit status is main's.
main 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"

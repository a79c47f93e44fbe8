#!/usr/bin/env bash
# check.sh: the CUDA backend's checks for a machine with an NVIDIA GPU (sm_90: H100/H200) and its
# driver; nothing here has run on a GPU before such a session (the same tests pass on the CPU through
# the emulating driver in every `make test`: docs/GPU.md). Four steps, each printed with its result;
# exit 0 only when all pass:
#   1. build with clang-19 (the kernels compiled to PTX and embedded);
#   2. test_gpu_cuda_kernels: every kernel against the CPU's reference (tests/gpu/test_cuda_kernels.c);
#   3. test_gpu_cuda_forward: the forward pass through the runtime: ../shared's F32 greedy vectors with
#      an f32 KV cache, top-1 agreement with the CPU for f16 and q8 caches (tests/gpu/test_cuda_forward.c);
#   4. a greedy run of stories260K on the GPU from the CLI, its token ids compared with the CPU's.
# Usage: bench/gpu/check.sh [BUILD_DIR]   (default build-gpu; needs cmake, a C compiler, clang-19)
# HEADROOM_CUDA_DRIVER=FILE uses that driver library instead of libcuda.so.1 in every step: with the
# emulating one (BUILD_DIR/libhr_emu_cuda.so) the whole script runs on a machine without a GPU, which
# checks the script itself before a GPU session spends its minutes on it.
set -u
cd "$(dirname "$0")/../.." || exit 2
build=${1:-build-gpu}
model=models/stories260K-q8_0.gguf
fail=0
step() { printf '\n== %s\n' "$*"; }

step "1. build ($build) with clang-19"
command -v clang-19 >/dev/null || { echo "clang-19 is not installed (apt-get install clang-19)"; exit 1; }
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>/dev/null || echo "(no nvidia-smi)"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null || exit 1
cmake --build "$build" -j "$(nproc)" --target headroom test_gpu_cuda_kernels test_gpu_cuda_forward test_cuda_backend || exit 1

step "2. kernels against the CPU reference (test_gpu_cuda_kernels)"
"$build/test_gpu_cuda_kernels" ${HEADROOM_CUDA_DRIVER:+"$HEADROOM_CUDA_DRIVER"}
rc=$?
case $rc in
0) echo "PASS" ;;
77) echo "SKIPPED: the GPU could not be opened (the line above says why)"; fail=1 ;;
*) echo "FAIL (exit $rc)"; fail=1 ;;
esac
env -u HEADROOM_CUDA_DRIVER "$build/test_cuda_backend" >/dev/null || { echo "test_cuda_backend FAILED on this machine"; fail=1; }

step "3. the forward pass against the CPU and the vectors (test_gpu_cuda_forward)"
"$build/test_gpu_cuda_forward" ${HEADROOM_CUDA_DRIVER:+"$HEADROOM_CUDA_DRIVER"}
rc=$?
case $rc in
0) echo "PASS" ;;
*) echo "FAIL (exit $rc)"; fail=1 ;;
esac

step "4. greedy stories260K from the CLI: GPU ids against CPU ids"
ids() { # the completion's token ids from --json
    "$build/headroom" run -m "$model" -p "Once upon a time" -n 48 --temp 0 --json "$@" |
        grep -o '"completion_token_ids":\[[0-9,]*\]'
}
cpu=$(ids --device cpu) || { echo "the CPU run failed"; exit 1; }
gpu=$(ids --device cuda 2>/tmp/hr_gpu_check.err)
if [ -z "$gpu" ]; then
    echo "the GPU run did not complete: $(head -1 /tmp/hr_gpu_check.err)"
    fail=1
elif [ "$cpu" = "$gpu" ]; then
    echo "PASS: the same 48 ids"
else
    echo "FAIL: ids differ"
    echo "  cpu $cpu"
    echo "  gpu $gpu"
    fail=1
fi
exit $fail

#!/usr/bin/env bash
# kernels_compile.sh: every CUDA kernel (src/backend/cuda/kernels/*.cu) compiles to PTX with
# clang-19's NVPTX target (no CUDA SDK, no GPU), warnings as errors, and every extern "C" __global__
# function of the sources is an .entry of the PTX (the host finds kernels by those names), and no
# PTX calls a function it does not define (no libdevice here). Run by
# ctest as test_cuda_kernels_compile: kernels_compile.sh KERNEL_DIR OUT_DIR CLANG_FLAGS...
# Exits 77 (skipped) when clang-19 is not installed; scripts/deps.sh installs it for `make test`.
set -u
dir=$1 out=$2
shift 2
clang=$(command -v clang-19) || { echo "SKIP: clang-19 is not installed (apt-get install clang-19): the CUDA kernels were not compiled"; exit 77; }
mkdir -p "$out" || exit 2
status=0 n=0
for cu in "$dir"/*.cu; do
    stem=$(basename "$cu" .cu)
    if ! "$clang" "$@" -S -o "$out/$stem.ptx" "$cu"; then
        echo "kernels_compile: $stem.cu does not compile"
        status=1
        continue
    fi
    # the kernel names as written: extern "C" __global__ void NAME(, and gemv.cu's pairs made by its
    # macro: HR_K_GEMV_KERNELS(TYPE, ...) defines hr_k_gemv_TYPE and hr_k_gemv_moe_TYPE
    names=$(grep -oE 'extern "C" __global__ void [A-Za-z_0-9]+\(' "$cu" | sed -E 's/.* void ([A-Za-z_0-9]+)\(/\1/'
        grep -oE '^HR_K_GEMV_KERNELS\([A-Za-z_0-9]+,' "$cu" | sed -E 's/^HR_K_GEMV_KERNELS\(([A-Za-z_0-9]+),/hr_k_gemv_\1 hr_k_gemv_moe_\1/')
    [[ -n $names ]] || { echo "kernels_compile: $stem.cu defines no extern \"C\" __global__ kernel"; status=1; }
    for k in $names; do
        if grep -qE "^\.visible \.entry $k\(" "$out/$stem.ptx"; then
            n=$((n + 1))
        else
            echo "kernels_compile: $stem.ptx has no entry $k"
            status=1
        fi
    done
    # a call left to an outside function (a libdevice math function: -nocudalib links none) would
    # only fail when the driver loads the module on a GPU; here it fails at once
    if grep -qE '^\.extern \.func' "$out/$stem.ptx"; then
        echo "kernels_compile: $stem.ptx calls functions it does not define: $(grep -E '^\.extern \.func' "$out/$stem.ptx" | tr '\n' ' ')"
        status=1
    fi
    grep -q '^\.target sm_90a' "$out/$stem.ptx" || { echo "kernels_compile: $stem.ptx does not target sm_90a"; status=1; }
done
[[ $status == 0 ]] && echo "kernels_compile: $n kernels compiled to PTX with $clang"
exit $status

#!/usr/bin/env bash
# check.sh: the CUDA backend's checks for a machine with an NVIDIA GPU (sm_90: H100/H200) and its
# driver; nothing here has run on a GPU before such a session (the same tests pass on the CPU through
# the emulating driver in every `make test`: docs/GPU.md). Six steps, each printed with its result;
# exit 0 only when all pass:
#   1. build with clang-19 (the kernels compiled to PTX and embedded);
#   2. test_gpu_cuda_kernels: every kernel against the CPU's reference (tests/gpu/test_cuda_kernels.c);
#   3. test_gpu_cuda_forward: the forward pass through the runtime: ../shared's F32 greedy vectors with
#      an f32 KV cache, top-1 agreement with the CPU for f16 and q8 caches, decode steps replayed as CUDA
#      graphs equal to the eager ones (tests/gpu/test_cuda_forward.c);
#   4. a greedy run of stories260K on the GPU from the CLI, its token ids compared with the CPU's;
#   5. the measurements (bench/gpu/gpu_bench*.c: copy (the logits' download into pageable and page-locked
#      memory), GEMV, prefill, attention per KV format, end to end with decode steps eager, as CUDA graphs
#      and as graphs with the greedy ids picked on the device, each switch's ratio printed on one line;
#      each kernel checked against the CPU at the measured shape first) and PyTorch's attention at the
#      same shapes (bench/gpu/torch_attn.py, when python3 and torch are there), written as JSON and
#      markdown into $OUT when set, else bench/gpu/out/ (docs/GPU.md, "Measurements");
#   5b. planned = measured: `headroom plan --device CARD`'s KV blocks against the server's on this GPU
#      (Llama-3-8B's KV cache, context 8192; f16, q8, q4h), within 3%; CARD is the driver's name for
#      it, which picks the datasheet profile (h200, h100-80gb, ...); and `plan --device cuda` (the
#      driver's own report) equal to the server's;
#   6. compute-sanitizer's memcheck and racecheck over step 2's kernel checks, where the CUDA toolkit's
#      compute-sanitizer is installed (PATH, or /usr/local/cuda*/bin): errors fail the step, a run cut
#      by its time limit (SANITIZE_SECONDS, default 100, shared by the two) is reported as incomplete.
# Usage: bench/gpu/check.sh [BUILD_DIR]   (default build-gpu; needs cmake, a C compiler, clang-19)
# The lent machines have none of clang-19 and the -dev libraries: there step 1 takes the binaries
# bench/gpu/pack.sh built here (.gpu-pack/pack.tar.gz, carried by the device tool) instead of building,
# wherever that file is present (HEADROOM_GPU_PACK=FILE: another; =0: build even so).
# The whole run stays under 8 minutes on an H100 or H200: step 5 gets what is left of 415 s (gpu_bench
# --max-seconds skips what would not fit); E2E_LAYERS (default 8) of Llama-3-8B's 32 layers go into the
# end-to-end model, whose synthesis on the host is most of step 5's time.
# STEPS="5 5b" runs only those after step 1 (a second device call: what the first skipped), and
# GPU_BENCH_ARGS adds words to gpu_bench's (e.g. "--only capacity,e2e").
# HEADROOM_CUDA_DRIVER=FILE uses that driver library instead of libcuda.so.1 in every step: with the
# emulating one (BUILD_DIR/libhr_emu_cuda.so) the whole script runs on a machine without a GPU, which
# checks the script itself before a GPU session spends its minutes on it (step 5 then measures
# gpu_bench --quick's tiny shapes: seconds).
set -u
cd "$(dirname "$0")/../.." || exit 2
build=${1:-build-gpu}
model=models/stories260K-q8_0.gguf
fail=0
step() { printf '\n== %s\n' "$*"; }
# every result goes to $OUT or bench/gpu/out, the whole console too as check.log (a device call's
# reply keeps only its last 12,000 characters); under $OUT, of which a device call brings back at most
# 8 files, all but check.log and the measurements' JSON and markdown go into one extras.tar.gz at the
# end
out=${OUT:-bench/gpu/out}
mkdir -p "$out" || exit 1
exec > >(tee "$out/check.log") 2>&1
tee_pid=$!
trap 'exec 1>&- 2>&-; wait "$tee_pid" 2>/dev/null' EXIT # check.log whole before the call returns

pack=${HEADROOM_GPU_PACK:-.gpu-pack/pack.tar.gz}
# runs one of headroom's programs (with the pack: its libraries first on the path); through env, so a
# program started in the background is $! itself (a function there would be a subshell: killing it
# would leave the program running)
run_env=(env)
hr() { "${run_env[@]}" "$@"; }
if [ "$pack" != 0 ] && [ -f "$pack" ]; then
    step "1. the binaries bench/gpu/pack.sh built ($pack)"
    nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>/dev/null || echo "(no nvidia-smi)"
    unpacked=$(mktemp -d /tmp/hr-gpu-pack.XXXXXX) || exit 1
    tar -C "$unpacked" -xzf "$pack" || { echo "FAIL: cannot unpack $pack"; exit 1; }
    manifest() { sed -n "s/^$1=//p" "$unpacked/MANIFEST"; }
    src=$(manifest src)
    build=$(manifest build)
    echo "pack: commit $(manifest commit), built at $src/$build on $(manifest made | sed 's/^[^ ]* on //')"
    echo "glibc: the pack needs $(manifest glibc) or newer; this machine has $(ldd --version 2>/dev/null | head -1 | grep -oE '[0-9.]+$')"
    # the tests name the source tree by the absolute path they were built at: that path is this checkout
    if [ "$src" != "$PWD" ]; then
        if [ -e "$src" ] && [ "$(cd "$src" && pwd -P)" != "$(pwd -P)" ]; then
            echo "FAIL: the pack was built at $src, which is another folder here (link it to $PWD by hand)"
            exit 1
        fi
        [ -e "$src" ] || { mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"; } || exit 1
    fi
    mkdir -p "$build" && cp "$unpacked"/build/* "$build/" || exit 1
    export HR_SHARED_DIR=${HR_SHARED_DIR:-$unpacked/shared}
    libs=$unpacked/lib
    # the C++ runtime only where the machine has none (an older one first on the path breaks PyTorch)
    ldconfig -p 2>/dev/null | grep -q 'libstdc++\.so\.6 ' || libs=$libs:$unpacked/lib/cxx
    run_env=(env "LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
    if ! hr "$build/headroom" --version >/dev/null 2>"$unpacked/start.err"; then
        echo "FAIL: the packed binaries do not start here: $(head -3 "$unpacked/start.err")"
        exit 1
    fi
    echo "PASS: $(hr "$build/headroom" --version | head -1) starts here"
else
    step "1. build ($build) with clang-19"
    command -v clang-19 >/dev/null || { echo "clang-19 is not installed (apt-get install clang-19; or run bench/gpu/pack.sh where it is and carry .gpu-pack)"; exit 1; }
    nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>/dev/null || echo "(no nvidia-smi)"
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null || exit 1
    cmake --build "$build" -j "$(nproc)" --target headroom test_gpu_cuda_kernels test_gpu_cuda_forward test_cuda_backend gpu_bench || exit 1
    unpacked=
fi

# the driver where the loader would not look for it (a container's read-only driver mount)
if [ -z "${HEADROOM_CUDA_DRIVER:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
    for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib64/nvidia; do
        if [ -e "$d/libcuda.so.1" ]; then
            export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d
            echo "driver: $d/libcuda.so.1 (not in the loader's cache)"
            break
        fi
    done
fi

# runs test program $1 on the GPU (or the driver HEADROOM_CUDA_DRIVER names) and says how it ended
gpu_test() {
    hr "$build/$1" ${HEADROOM_CUDA_DRIVER:+"$HEADROOM_CUDA_DRIVER"}
    local rc=$?
    case $rc in
    0) echo "PASS" ;;
    77) echo "SKIPPED: the GPU could not be opened (the line above says why)"; fail=1 ;;
    *) echo "FAIL (exit $rc)"; fail=1 ;;
    esac
}

step2() {
    step "2. kernels against the CPU reference (test_gpu_cuda_kernels)"
    gpu_test test_gpu_cuda_kernels
    hr env -u HEADROOM_CUDA_DRIVER "$build/test_cuda_backend" >/dev/null || { echo "test_cuda_backend FAILED on this machine"; fail=1; }
}

step3() {
    step "3. the forward pass against the CPU and the vectors (test_gpu_cuda_forward)"
    gpu_test test_gpu_cuda_forward
}

step4() {
    step "4. greedy stories260K from the CLI: GPU ids against CPU ids"
    ids() { # the completion's token ids from --json
        hr "$build/headroom" run -m "$model" -p "Once upon a time" -n 48 --temp 0 --json "$@" |
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
}

# TITLE: then gpu_bench's rows (its console table) as sed's expression EXPR makes them, on one line
ratios() {
    local r
    r=$(sed -nE "$2" "$out/gpu_bench.txt" | tr '\n' ';' | sed 's/;$//; s/;/; /g')
    [ -n "$r" ] && echo "$1: $r"
    return 0
}

step5() {
    step "5. measurements (gpu_bench, torch_attn.py)"
    driver_version=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
    commit=${HEADROOM_COMMIT:-$(git describe --always --dirty 2>/dev/null || echo unknown)} # a copy without .git: set it
    bench=(--json "$out/gpu_bench.json" --md "$out/gpu_bench.md" --commit "$commit")
    [ -n "$driver_version" ] && bench+=(--driver-version "$driver_version")
    quick=()
    if [ -n "${HEADROOM_CUDA_DRIVER:-}" ]; then
        bench+=(--driver "$HEADROOM_CUDA_DRIVER" --quick)
        quick=(--quick)
    else
        left=$((415 - SECONDS - 60 - ${SANITIZE_SECONDS:-100})) # 60 s kept for torch_attn.py (90 at most), ~25 s for 5b, then step 6's
        [ "$left" -lt 120 ] && left=120
        bench+=(--max-seconds "$left" --e2e-layers "${E2E_LAYERS:-8}")
    fi
    # shellcheck disable=SC2206 # GPU_BENCH_ARGS: words, e.g. "--only capacity,e2e"
    bench+=(${GPU_BENCH_ARGS:-})
    hr "$build/gpu_bench" "${bench[@]}" | tee "$out/gpu_bench.txt"
    rc=${PIPESTATUS[0]}
    case $rc in
    0)
        if hr "$build/gpu_bench" --validate "$out/gpu_bench.json" "$out/gpu_bench.md"; then
            echo "PASS: $out/gpu_bench.json, $out/gpu_bench.md"
        else
            echo "FAIL: the files gpu_bench wrote are incomplete"
            fail=1
        fi
        ;;
    77) echo "SKIPPED: the GPU could not be opened (the line above says why)"; fail=1 ;;
    *) echo "FAIL (exit $rc): a kernel's output differs from the CPU's, or a run failed (the lines above say which)"; fail=1 ;;
    esac
    # gpu_bench's "A time / B time" rows, one line each: the ratios that decide the switches' defaults
    ratios "attention kernels, split time / rows time (> 1: rows faster)" \
        's/^ +attention +([a-z0-9]+) split\/rows +ctx ([0-9]+),.*: ([a-z]+) faster +([0-9.e+-]+) x.*/\1 ctx \2 \4x (\3)/p'
    ratios "decode steps, eager time / CUDA graphs time (> 1: graphs faster)" \
        's/^ +e2e +eager\/graphs +decode batch ([0-9]+) \(eager time \/ graphs time\): ([a-z-]+) faster +([0-9.e+-]+) x.*/batch \1 \3x (\2)/p'
    ratios "prefill attention, split time / mma time (> 1: mma faster; HEADROOM_CUDA_PREFILL_ATTN)" \
        's/^ +attention +prefill split\/mma +([0-9]+) rows after ([0-9]+) .*: ([a-z]+) faster +([0-9.e+-]+) x.*/\1 rows after \2 \4x (\3)/p'
    ratios "greedy sampling, logits copy + host argmax time / device argmax time (> 1: device faster)" \
        's/^ +copy +host\/device argmax +batch ([0-9]+) \(.*\): ([a-z-]+) faster +([0-9.e+-]+) x.*/batch \1 \3x (\2)/p'
    ratios "logits download, pageable time / page-locked time (> 1: page-locked faster; HEADROOM_CUDA_PINNED_LOGITS)" \
        's/^ +copy +pageable\/pinned +logits batch ([0-9]+) \(pageable time \/ pinned time\): ([a-z-]+) faster +([0-9.e+-]+) x.*/batch \1 \3x (\2)/p'
    ratios "decode steps (graphs), logits copied time / ids picked on the device time (> 1: device faster; HEADROOM_CUDA_ARGMAX)" \
        's/^ +e2e +logits\/argmax +decode batch ([0-9]+) \(logits time \/ argmax time\): ([a-z-]+) faster +([0-9.e+-]+) x.*/batch \1 \3x (\2)/p'
    # the host's side of a sampled step: a step's rows of Llama-3's logits sampled on one thread against
    # the pool of this machine's CPUs, awake and woken from sleep as after a GPU's forward pass (the
    # engine hands a step's rows to the backend's host threads from backend_cuda.c's run_items_min
    # logits, which was measured on 2 CPUs only)
    if [ -x "$build/bench_sampler" ]; then
        if [ -n "${HEADROOM_CUDA_DRIVER:-}" ]; then sargs=(3 32000); else sargs=(7 128256); fi
        timeout 60 "${run_env[@]}" "$build/bench_sampler" "${sargs[@]}" >"$out/host_sampling.txt" 2>&1
        echo "host sampling (bench_sampler ${sargs[*]}: exit $?; one thread time / pool time, awake and asleep, > 1: the pool faster):"
        sed -nE 's/^ +(greedy|chain) +([0-9]+) rows x +([0-9]+) .*one\/pool ([0-9.]+)x.*one\/asleep ([0-9.]+)x.*/  \1 \2 rows: \4x \5x/p' \
            "$out/host_sampling.txt" | paste -sd ' ' -
    fi
    if command -v python3 >/dev/null; then
        timeout 90 python3 bench/gpu/torch_attn.py ${quick[@]+"${quick[@]}"} --json "$out/torch_attn.json" --md "$out/torch_attn.md" \
            --bench-json "$out/gpu_bench.json" | tee "$out/torch_attn.txt"
        trc=${PIPESTATUS[0]}
        case $trc in
        0) echo "torch: measured ($out/torch_attn.json)" ;;
        3) echo "torch: not available" ;;
        *) echo "torch: FAILED (exit $trc; the peer's numbers are missing, headroom's are not affected)" ;;
        esac
    else
        echo "torch: not available (no python3)"
    fi
}

step5b() {
    step "5b. planned = measured: headroom plan --device <this card>'s KV blocks against the server's on this GPU"
    # a Llama-3-8B KV cache (32 layers, 8 KV heads of 128) on a small body, context 8192, the same engine
    # sizes on both sides; the issue's bound is 3%. The plan's profile is the one the driver's name for the
    # card picks (the server's "GPU: NAME:" line; plan --device "NVIDIA H200" is h200's, "NVIDIA H100
    # 80GB HBM3" h100-80gb's). A card without a profile is planned as an H200, and the emulating driver's
    # (1 GiB) is too: their figures are printed, not compared.
    pm=$(mktemp --suffix=.gguf /tmp/hr-plan-check.XXXXXX)
    if hr "$build/headroom" synth --shape llama-3-8b-kv --type q8_0 -o "$pm" >/dev/null 2>&1; then
        for fmt in f16 q8 q4h; do
            sizes=(--ctx 8192 --kv-type "$fmt" -b 512 --max-running 64)
            log=$(mktemp)
            # (the emulating driver's 1 GiB holds no 8K f16 sequence of this model: 4 GiB there)
            HR_FAKE_CUDA_MEM=${HR_FAKE_CUDA_MEM:-$((4 << 30))} "${run_env[@]}" "$build/headroom" serve --device cuda \
                -m "$pm" "${sizes[@]}" --port 0 >"$log" 2>&1 &
            pid=$!
            for _ in $(seq 1 240); do
                grep -q "listening on" "$log" && break
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.5
            done
            kill -TERM "$pid" 2>/dev/null
            wait "$pid" 2>/dev/null
            tokens=$(sed -nE 's/.*budget [^=]*= ([0-9]+) tokens.*/\1/p' "$log" | head -1)
            gpu=$(grep -m1 '^GPU: ' "$log")
            card=$(printf '%s\n' "$gpu" | sed -nE 's/^GPU: ([^:]+): arena .*/\1/p')
            profile=$card
            if [ -z "$card" ] || ! hr "$build/headroom" plan -m "$pm" --device "$card" "${sizes[@]}" >/dev/null 2>&1; then
                profile=h200
            fi
            planned=$(hr "$build/headroom" plan -m "$pm" --device "$profile" "${sizes[@]}" --json | tr -d ' \n' |
                grep -o '"gpu_arena":{[^}]*}' | grep -o '"kv_blocks":[0-9]*' | cut -d: -f2)
            # and plan --device cuda: this GPU as its driver reports it, which the server's blocks equal
            here=$(HR_FAKE_CUDA_MEM=${HR_FAKE_CUDA_MEM:-$((4 << 30))} "${run_env[@]}" "$build/headroom" plan -m "$pm" \
                --device cuda "${sizes[@]}" --json | tr -d ' \n' | grep -o '"gpu_arena":{[^}]*}' |
                grep -o '"kv_blocks":[0-9]*' | cut -d: -f2)
            if [ -z "$planned" ] || [ -z "$tokens" ]; then
                echo "$fmt: FAIL: no figure (plan: ${planned:-none}; server: $(grep -m1 -iE 'error|CUDA' "$log" || tail -1 "$log"))"
                fail=1
            else
                measured=$((tokens / 16))
                off=$(awk -v p="$planned" -v m="$measured" 'BEGIN { d = p - m; if (d < 0) d = -d; printf "%.2f", 100 * d / m }')
                if [ -n "${HEADROOM_CUDA_DRIVER:-}" ]; then
                    verdict="emulated: not compared"
                elif [ "$profile" != "$card" ]; then
                    verdict="not compared: no profile for '$card' (plan --device h200's figure)"
                elif awk -v o="$off" 'BEGIN { exit !(o <= 3) }'; then
                    verdict="PASS (<= 3%)"
                else
                    verdict="FAIL (> 3%)"
                    fail=1
                fi
                echo "$fmt: plan --device '$profile': $planned blocks, the server $measured ($off% apart): $verdict"
                if [ "${here:-x}" = "$measured" ]; then
                    echo "  plan --device cuda: $here blocks, the server's: PASS (equal)"
                else
                    echo "  plan --device cuda: ${here:-no figure} blocks, the server $measured: FAIL (not equal)"
                    fail=1
                fi
            fi
            [ -n "$gpu" ] && echo "  $gpu"
            rm -f "$log"
        done
    else
        echo "FAIL: headroom synth could not write the model"
        fail=1
    fi
    rm -f "$pm"
}

step6() {
    step "6. compute-sanitizer memcheck and racecheck (test_gpu_cuda_kernels)"
    san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
    if [ -n "${HEADROOM_CUDA_DRIVER:-}" ]; then
        echo "not run: the emulating driver is in use (the sanitizer watches a GPU)"
    elif [ -z "$san" ]; then
        echo "not run: compute-sanitizer is not installed (the CUDA toolkit's; headroom needs only the driver)"
    else
        half=$((${SANITIZE_SECONDS:-100} / 2))
        for tool in memcheck racecheck; do
            hr timeout "$half" "$san" --tool "$tool" --error-exitcode 3 --print-limit 20 "$build/test_gpu_cuda_kernels" \
                >"$out/sanitize_$tool.txt" 2>&1
            src=$?
            # the sanitizer's reports ("========= Invalid __global__ read ...", "========= Error: Race reported
            # ..."), also those printed before a timeout cut the run
            errs=$(grep -cE '^=+ +(Invalid|Error|Race|.*hazard)' "$out/sanitize_$tool.txt")
            if [ "$src" = 3 ] || [ "$errs" -gt 0 ]; then
                echo "$tool: ERRORS (first lines below; all in $out/sanitize_$tool.txt)"
                grep -m 8 -E '^=+ +(Invalid|Error|Race|.*hazard)' "$out/sanitize_$tool.txt"
                fail=1
            elif [ "$src" = 0 ]; then
                echo "$tool: clean ($out/sanitize_$tool.txt)"
            elif [ "$src" = 124 ]; then
                echo "$tool: incomplete (cut at ${half} s, no report before: $out/sanitize_$tool.txt)"
            else
                echo "$tool: the checks failed under the sanitizer (exit $src: $out/sanitize_$tool.txt)"
                fail=1
            fi
        done
    fi
}

# the steps asked for (STEPS, default all; step 1 always runs first)
for s in ${STEPS:-2 3 4 5 5b 6}; do
    case $s in
    2 | 3 | 4 | 5 | 5b | 6) "step$s" ;;
    *) echo "STEPS: no step $s (2 3 4 5 5b 6)"; exit 2 ;;
    esac
done
echo "(the script ran ${SECONDS} s)"
extras=$(cd "$out" && ls | grep -vxE 'check\.log|gpu_bench\.json|gpu_bench\.md|torch_attn\.json|torch_attn\.md|extras\.tar\.gz')
if [ -n "${OUT:-}" ] && [ -n "$extras" ]; then
    # shellcheck disable=SC2086 # the names are ours, without spaces
    (cd "$out" && tar -czf extras.tar.gz $extras && rm -f $extras) && echo "the rest of $out: extras.tar.gz ($(echo $extras))"
fi
exit $fail

#!/usr/bin/env bash
# engine_bench.sh: the engine's benchmarks (docs/BENCHMARKS.md holds the figures).
#   (a) aggregate generation tokens/s through `headroom run` on a tinyllama-1.1b-shaped q8_0 model at
#       1, 4, 16, 64 concurrent sequences, 2 threads: the steady decode rate (steps without prompt
#       tokens) and the whole run's rate (medians of REPEATS runs, sizes interleaved per repeat);
#   (b) one KV byte budget, a mixed workload (prompts 64-2048, outputs 16-512): requests/min, peak
#       concurrency, preemptions, recomputed tokens for contiguous vs paged x each admission mode
#       (bench/engine_bench.c on a small synthetic model: tinyllama is too slow on 2 cores for 2k
#       prompts x 4 configurations x 3 repeats);
#   (c) a burst of 10x the concurrency the budget holds: completed or refused with a reason, none
#       lost, max RSS under /usr/bin/time -v.
# usage: bench/engine_bench.sh [a|b|c|all]   (env: BUILD=build REPEATS=3 NGEN=32 MODEL=/tmp/tl-q8.gguf)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
REPEATS=${REPEATS:-3}
NGEN=${NGEN:-32}
MODEL=${MODEL:-/tmp/tl-q8.gguf}
WHAT=${1:-all}
HR=$BUILD/headroom
[ -x "$HR" ] || { echo "build first: make build" >&2; exit 1; }

# The C bench is CMake's bench_engine_bench target (every bench/<name>.c builds as bench_<name>).
build_c_bench() {
    cmake --build "$BUILD" -j2 --target bench_engine_bench >/dev/null
    ln -sf bench_engine_bench "$BUILD/engine_bench"
}

median() { sort -g | awk '{v[NR]=$1} END {if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }

bench_a() {
    if [ ! -f "$MODEL" ]; then
        echo "writing $MODEL (1.2 GB, not committed)"
        "$HR" synth --shape tinyllama-1.1b --type q8_0 -o "$MODEL"
    fi
    echo "## (a) aggregate generation tokens/s, tinyllama-1.1b shape, q8_0, 2 threads, $NGEN tokens per sequence"
    echo "(decode: tokens sampled in steps without prompt tokens / their seconds, the steady-state rate;"
    echo " whole run: all generated tokens / wall time with prefill; medians of $REPEATS, sizes interleaved)"
    echo
    echo "| concurrent sequences | decode tok/s | vs 1 | per-sequence decode tok/s | whole-run tok/s | vs 1 | engine steps |"
    echo "|---|---|---|---|---|---|---|"
    local sizes=(1 4 16 64)
    local -A dec run stp
    for c in "${sizes[@]}"; do
        local pf="/tmp/headroom-engine-bench-$c.txt"
        : >"$pf"
        for i in $(seq 1 "$c"); do echo "Story $i: once upon a time there was a little dog" >>"$pf"; done
    done
    for _ in $(seq 1 "$REPEATS"); do
        for c in "${sizes[@]}"; do
            local out
            out=$("$HR" run -m "$MODEL" --prompts "/tmp/headroom-engine-bench-$c.txt" -n "$NGEN" --temp 0 \
                --ignore-eos -t 2 --ctx 256 --max-running 64 --json)
            read -r d g s < <(echo "$out" | python3 -c 'import sys,json; e=json.load(sys.stdin)["engine"]; print(e["decode_tokens_per_second"], e["generation_tokens_per_second"], e["steps"])')
            dec[$c]+="$d "
            run[$c]+="$g "
            stp[$c]=$s
        done
    done
    local bd="" br=""
    for c in "${sizes[@]}"; do
        local d g
        d=$(echo "${dec[$c]}" | tr ' ' '\n' | grep . | median)
        g=$(echo "${run[$c]}" | tr ' ' '\n' | grep . | median)
        [ -z "$bd" ] && bd=$d && br=$g
        awk -v c="$c" -v d="$d" -v bd="$bd" -v g="$g" -v br="$br" -v s="${stp[$c]}" \
            'BEGIN {printf "| %d | %.1f | %.2fx | %.2f | %.1f | %.2fx | %s |\n", c, d, d / bd, d / c, g, g / br, s}'
        rm -f "/tmp/headroom-engine-bench-$c.txt"
    done
}

bench_b() {
    build_c_bench
    echo "## (b) mixed workload, one KV budget"
    "$BUILD/engine_bench" mixed --repeats "$REPEATS"
}

bench_c() {
    build_c_bench
    echo "## (c) burst of 10x the concurrency the budget holds"
    local t; t=$(mktemp)
    /usr/bin/time -v "$BUILD/engine_bench" burst --mult 10 2>"$t"
    grep -E "Maximum resident set size|Elapsed \(wall" "$t" | sed 's/^[[:space:]]*/  \/usr\/bin\/time -v: /'
    rm -f "$t"
}

case "$WHAT" in
a) bench_a ;;
b) bench_b ;;
c) bench_c ;;
all) bench_a; echo; bench_b; echo; bench_c ;;
*) echo "usage: $0 [a|b|c|all]" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# engine_bench.sh: the engine's benchmarks (docs/BENCHMARKS.md holds the figures).
#   (a) aggregate generation tokens/s through `headroom run` on a tinyllama-1.1b-shaped q8_0 model at
#       1, 4, 16, 64 concurrent sequences, 2 threads (medians of REPEATS runs);
#   (b) one KV byte budget, a mixed workload (prompts 64-2048, outputs 16-512): requests/min, peak
#       concurrency, preemptions, recomputed tokens for contiguous vs paged x each admission mode
#       (bench/engine_bench.c on a small synthetic model: tinyllama is too slow on 2 cores for 2k
#       prompts x 4 configurations x 3 repeats);
#   (c) a burst of 10x the concurrency the budget holds: completed or refused with a reason, none
#       lost, max RSS under /usr/bin/time -v.
# usage: bench/engine_bench.sh [a|b|c|all]   (env: BUILD=build REPEATS=3 NGEN=12 MODEL=/tmp/tl-q8.gguf)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
REPEATS=${REPEATS:-3}
NGEN=${NGEN:-12}
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
    echo "(tokens generated / wall time of the whole run, prefill included; median of $REPEATS)"
    echo
    echo "| concurrent sequences | aggregate tok/s | vs 1 | per-sequence tok/s | engine steps |"
    echo "|---|---|---|---|---|"
    local base=""
    for c in 1 4 16 64; do
        local pf; pf=$(mktemp)
        for i in $(seq 1 "$c"); do echo "Story $i: once upon a time there was a little dog" >>"$pf"; done
        local runs=()
        local steps=0
        for _ in $(seq 1 "$REPEATS"); do
            local out
            out=$("$HR" run -m "$MODEL" --prompts "$pf" -n "$NGEN" --temp 0 --ignore-eos \
                -t 2 --ctx 256 --max-running 64 --json)
            runs+=("$(echo "$out" | python3 -c 'import sys,json; e=json.load(sys.stdin)["engine"]; print(e["generation_tokens_per_second"], e["steps"])')")
        done
        local tps; tps=$(printf '%s\n' "${runs[@]}" | awk '{print $1}' | median)
        steps=$(printf '%s\n' "${runs[@]}" | awk '{print $2}' | median)
        [ -z "$base" ] && base=$tps
        awk -v c="$c" -v t="$tps" -v b="$base" -v s="$steps" \
            'BEGIN {printf "| %d | %.1f | %.2fx | %.2f | %s |\n", c, t, t / b, t / c, s}'
        rm -f "$pf"
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

#!/usr/bin/env bash
# The whole engine matrix (tests/test_engine_matrix.c: every KV format and K/V mix x block sizes x
# prompt lengths x prefill chunks x concurrency x budgets x layouts, 42,240 cells) under each kernel
# ISA this CPU has, in SHARDS parallel shards. CI runs a seeded sample of it; this runs all of it.
#   bench/engine_matrix.sh [BUILD_DIR]      (SHARDS=2 ISAS="scalar avx2 avx512" to choose)
# Several hours on 2 cores; each shard's log is in $OUT (default /tmp/engine_matrix).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
SHARDS=${SHARDS:-$(nproc)}
OUT=${OUT:-/tmp/engine_matrix}
ISAS=${ISAS:-"scalar avx2 avx512"}
cmake --build "$BUILD" --target test_engine_matrix >/dev/null
mkdir -p "$OUT"
status=0
for isa in $ISAS; do
  pids=()
  for k in $(seq 0 $((SHARDS - 1))); do
    HEADROOM_ISA=$isa HR_MATRIX_CELLS=all HR_MATRIX_SHARD="$k/$SHARDS" \
      "$BUILD/test_engine_matrix" >"$OUT/$isa-$k.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    rc=0
    wait "${pids[$i]}" || rc=$?
    if [ "$rc" = 77 ]; then echo "$isa: skipped ($(head -1 "$OUT/$isa-$i.log"))"; continue; fi
    echo "$isa shard $i/$SHARDS: $(tail -1 "$OUT/$isa-$i.log") (exit $rc)"
    [ "$rc" = 0 ] || status=1
  done
done
exit $status

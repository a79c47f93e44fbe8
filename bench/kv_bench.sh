#!/usr/bin/env bash
# kv_bench.sh: the KV cache's memory promises on a TinyLlama-1.1B-shaped cache (22 layers, 4 KV
# heads, head_dim 64, block 16), in one run:
#   1. concurrent 1,024-token sequences that one byte budget holds, per format, paged vs contiguous
#      per-sequence allocation of the maximum context (llama.cpp-style slots), and the waste paging
#      leaves under a mixed-length workload (bench_kv_memory; accounting through the real pool);
#   2. peak RSS (/usr/bin/time -v) of a process that creates a pool of a given budget and writes every
#      block, and of one that only creates it, against the budget;
#   3. optionally (DECODE=1) decode attention time per token per format (bench_kv_decode).
#
# usage: bench/kv_bench.sh [BUDGET] [RSS_BUDGET] [RSS_FORMATS]   (defaults 1GiB 512MiB "f16 q8")
# env:   BUILD (default build; a Release build: the accounting commits without writes),
#        DECODE=1 to add the decode table (ROUNDS, default 9)
set -euo pipefail
cd "$(dirname "$0")/.."
BUDGET=${1:-1GiB}
RSS_BUDGET=${2:-512MiB}
RSS_FORMATS=${3:-"f16 q8"}
BUILD=${BUILD:-build}
for b in bench_kv_memory bench_kv_decode; do
  [ -x "$BUILD/$b" ] || { echo "build first: cmake --build $BUILD --target $b" >&2; exit 1; }
done

echo "== sequences per budget, paging waste =="
"$BUILD"/bench_kv_memory "$BUDGET" 1024 2048
echo
echo "== peak RSS vs budget ($RSS_BUDGET) =="
printf "%-6s %-8s %12s %14s %12s\n" format mode "budget MiB" "peak RSS MiB" "RSS/budget"
budget_bytes=$(numfmt --from=iec-i --suffix=B "$RSS_BUDGET" 2>/dev/null | tr -d B || true)
[ -n "$budget_bytes" ] || budget_bytes=$(numfmt --from=iec "${RSS_BUDGET%iB}")
tmp=$(mktemp)
for f in $RSS_FORMATS; do
  for mode in filled created; do
    arg=""
    [ "$mode" = created ] && arg=none
    /usr/bin/time -v "$BUILD"/bench_kv_memory --fill "$RSS_BUDGET" "$f" $arg >/dev/null 2>"$tmp"
    kb=$(awk '/Maximum resident set size/ {print $6}' "$tmp")
    awk -v f="$f" -v m="$mode" -v b="$budget_bytes" -v kb="$kb" \
      'BEGIN {printf "%-6s %-8s %12.1f %14.1f %11.1f%%\n", f, m, b/1048576, kb/1024, 100*kb*1024/b}'
  done
done
rm -f "$tmp"
echo "(filled: every block written through hr_kv_write; created: the pool only. The arena is one"
echo " anonymous mapping that is not prefaulted, so pages become resident as blocks are first written.)"

if [ "${DECODE:-0}" = 1 ]; then
  echo
  echo "== decode attention =="
  "$BUILD"/bench_kv_decode "${ROUNDS:-9}"
fi

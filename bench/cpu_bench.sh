#!/usr/bin/env bash
# cpu_bench.sh: prompt and generation speed of headroom on a TinyLlama-1.1B-shaped model in several
# weight types, side by side in one run, medians over repeats, against the machine's measured memory
# bandwidth (the roof for decode: every weight byte is read once per generated token).
#
# usage: bench/cpu_bench.sh [TYPES] [REPEATS]     e.g. bench/cpu_bench.sh "f16 q8_0 q4_0 q4_K" 3
# env:   BUILD (default build), MODELS (default /tmp/headroom-bench), THREADS (default 2),
#        PROMPT_WORDS (default 510: about 512 prompt tokens), GEN (default 64 generated tokens),
#        SHAPE (default tinyllama-1.1b)
set -euo pipefail
cd "$(dirname "$0")/.."
TYPES=${1:-"f16 q8_0 q4_0 q4_K"}
REPEATS=${2:-3}
BUILD=${BUILD:-build}
MODELS=${MODELS:-/tmp/headroom-bench}
THREADS=${THREADS:-2}
PROMPT_WORDS=${PROMPT_WORDS:-510}
GEN=${GEN:-64}
SHAPE=${SHAPE:-tinyllama-1.1b}
HR=$BUILD/headroom
[ -x "$HR" ] || { echo "build first: make build" >&2; exit 1; }
mkdir -p "$MODELS"

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
jget() { python3 -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }

# a prompt of single-token words in the synthetic vocabulary ("▁" + three letters)
words=(the cat sat and ran far out one day she saw big red box hat dog)
prompt=""
for ((i = 0; i < PROMPT_WORDS; i++)); do prompt+="${words[i % ${#words[@]}]} "; done

bw=$("$BUILD"/bench_membw 1024 5)
bw1=$(echo "$bw" | jget gbps_1t)
bw2=$(echo "$bw" | jget gbps_2t)
echo "memory bandwidth (1 GiB streaming read, median of 5): 1 thread $bw1 GB/s, 2 threads $bw2 GB/s"
roof_bw=$bw2
[ "$THREADS" = 1 ] && roof_bw=$bw1

printf "%-6s %9s %12s %12s %10s %9s %10s\n" type "size GB" "prompt tok/s" "gen tok/s" "roof tok/s" "of roof" "peak RSS"
for t in $TYPES; do
  f="$MODELS/$SHAPE-$t.gguf"
  [ -f "$f" ] || "$HR" synth --shape "$SHAPE" --type "$t" -o "$f" >/dev/null 2>&1
  size=$(stat -c %s "$f")
  pp=(); tg=(); rss=()
  for ((r = 0; r < REPEATS; r++)); do
    out=$(/usr/bin/time -v "$HR" run -m "$f" -p "$prompt" -n "$GEN" --temp 0 --ignore-eos -t "$THREADS" \
          --ctx 1024 --json 2>/tmp/headroom-bench-time.txt)
    pp+=("$(echo "$out" | jget prompt_tokens_per_second)")
    tg+=("$(echo "$out" | jget generation_tokens_per_second)")
    rss+=("$(awk '/Maximum resident set size/ {print $6}' /tmp/headroom-bench-time.txt)")
  done
  ppm=$(printf "%s\n" "${pp[@]}" | median)
  tgm=$(printf "%s\n" "${tg[@]}" | median)
  rssm=$(printf "%s\n" "${rss[@]}" | median)
  roof=$(awk -v bw="$roof_bw" -v s="$size" 'BEGIN {printf "%.1f", bw * 1e9 / s}')
  frac=$(awk -v g="$tgm" -v r="$roof" 'BEGIN {printf "%.0f%%", 100 * g / r}')
  printf "%-6s %9.2f %12.1f %12.2f %10s %9s %8.0f MiB\n" "$t" "$(awk -v s="$size" 'BEGIN{print s/1e9}')" \
    "$ppm" "$tgm" "$roof" "$frac" "$(awk -v k="$rssm" 'BEGIN{print k/1024}')"
done
echo "($SHAPE, $THREADS threads, ~$PROMPT_WORDS-word prompt, $GEN generated tokens, medians of $REPEATS runs;"
echo " roof = bandwidth / bytes of the model file, as every weight is read once per generated token)"

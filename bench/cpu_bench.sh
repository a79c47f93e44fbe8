#!/usr/bin/env bash
# cpu_bench.sh: prompt and generation speed of headroom on a TinyLlama-1.1B-shaped model in several
# weight types, side by side in one run, medians over repeats, against the machine's measured memory
# bandwidth (the roof for decode: every weight byte is read once per generated token).
#
# usage: bench/cpu_bench.sh [TYPES] [REPEATS]     e.g. bench/cpu_bench.sh "f16 q8_0 q4_0 q4_K" 3
#        ISAS="avx2 avx512" bench/cpu_bench.sh "q8_0 q4_0" 3   kernel ISAs side by side instead: per
#        type, runs alternate between the ISAs (--isa), REPEATS rounds; prints the medians of prompt
#        tok/s (one ~512-token prompt), 1-stream generation tok/s and 16-stream decode tok/s, and
#        each ISA's ratio to the first
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

if [ -n "${ISAS:-}" ]; then
  streams=()
  for ((i = 0; i < 16; i++)); do streams+=(-p "${words[i]} ${words[(i + 3) % 16]} ${words[(i + 7) % 16]}"); done
  printf "%-6s %-7s %13s %12s %16s   (ratios to %s)\n" type isa "prompt tok/s" "gen tok/s" "16-stream dec/s" \
    "${ISAS%% *}"
  for t in $TYPES; do
    f="$MODELS/$SHAPE-$t.gguf"
    [ -f "$f" ] || "$HR" synth --shape "$SHAPE" --type "$t" -o "$f" >/dev/null 2>&1
    declare -A pp=() tg=() dec=()
    for ((r = 0; r < REPEATS; r++)); do
      for isa in $ISAS; do
        out=$("$HR" run -m "$f" -p "$prompt" -n 32 --temp 0 --ignore-eos -t "$THREADS" --ctx 1024 --isa "$isa" \
              --json 2>/dev/null)
        pp[$isa]+="$(echo "$out" | jget prompt_tokens_per_second) "
        tg[$isa]+="$(echo "$out" | jget generation_tokens_per_second) "
        out=$("$HR" run -m "$f" "${streams[@]}" -n 32 --temp 0 --ignore-eos -t "$THREADS" --ctx 256 --isa "$isa" \
              --json 2>/dev/null)
        dec[$isa]+="$(echo "$out" | python3 -c "import json,sys; print(json.load(sys.stdin)['engine']['decode_tokens_per_second'])") "
      done
    done
    base=${ISAS%% *}
    b_pp=$(printf "%s\n" ${pp[$base]} | median) b_tg=$(printf "%s\n" ${tg[$base]} | median)
    b_dec=$(printf "%s\n" ${dec[$base]} | median)
    for isa in $ISAS; do
      m_pp=$(printf "%s\n" ${pp[$isa]} | median) m_tg=$(printf "%s\n" ${tg[$isa]} | median)
      m_dec=$(printf "%s\n" ${dec[$isa]} | median)
      printf "%-6s %-7s %13.1f %12.2f %16.2f   %.2fx %.2fx %.2fx   (runs: %s| %s| %s)\n" "$t" "$isa" "$m_pp" "$m_tg" \
        "$m_dec" "$(awk -v a="$m_pp" -v b="$b_pp" 'BEGIN{print a/b}')" "$(awk -v a="$m_tg" -v b="$b_tg" 'BEGIN{print a/b}')" \
        "$(awk -v a="$m_dec" -v b="$b_dec" 'BEGIN{print a/b}')" "${pp[$isa]}" "${tg[$isa]}" "${dec[$isa]}"
    done
    unset pp tg dec
  done
  echo "($SHAPE, $THREADS threads, medians of $REPEATS alternating rounds)"
  exit 0
fi

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

#!/usr/bin/env bash
# side_by_side.sh: llama.cpp and headroom on this machine, same synthetic TinyLlama-1.1B-shaped models,
# same prompt length, same generated tokens, same threads; the two alternate within each repeat so
# load on a shared box hits both alike. Prints medians and the ratio headroom / llama.cpp.
#
# usage: bench/llamacpp/side_by_side.sh [TYPES] [REPEATS]     e.g. ... "f16 q8_0 q4_0 q4_K" 3
# env:   BUILD (build), MODELS (/tmp/headroom-bench), THREADS (2), PROMPT (512 tokens), GEN (64),
#        SHAPE (tinyllama-1.1b), PARALLEL (0; N > 0 adds both engines' aggregate generation speed with
#        N sequences decoding together: headroom's engine decode_tokens_per_second), LOG (/tmp/headroom-side-by-side.jsonl: every run's JSON),
#        QUIET (60: before each try, wait up to this many seconds for the CPUs to be under 10% busy;
#        llama.cpp's spinning threads slow down many times over when another process takes a core)
#
# llama.cpp comes from node-llama-cpp's prebuilt CPU libraries (bench.mjs says how it is measured).
# Install it once (Node >= 20; the version is pinned in package.json):
#     cd bench/llamacpp && npm install
#
# What differs, knowingly: llama.cpp's tg starts after a 4-token prompt (as llama-bench's tg does),
# headroom's after the PROMPT-token one (about 2% more attention reads per token at 512 for q4 weights,
# less for f16); headroom's generation rate counts GEN tokens over GEN-1 decodes (the first token comes
# out of the prefill), llama.cpp's GEN tokens over GEN decodes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."
TYPES=${1:-"f16 q8_0 q4_0 q4_K"}
REPEATS=${2:-3}
BUILD=${BUILD:-build}
MODELS=${MODELS:-/tmp/headroom-bench}
THREADS=${THREADS:-2}
PROMPT=${PROMPT:-512}
GEN=${GEN:-64}
SHAPE=${SHAPE:-tinyllama-1.1b}
PARALLEL=${PARALLEL:-0}
LOG=${LOG:-/tmp/headroom-side-by-side.jsonl}
QUIET=${QUIET:-60}
HR=$BUILD/headroom

if ! command -v node >/dev/null || ! (cd "$here" && node -e 'import("node-llama-cpp")' 2>/dev/null); then
    echo "llama.cpp side skipped: node-llama-cpp is not installed. Install it with"
    echo "    cd bench/llamacpp && npm install      # Node >= 20; node-llama-cpp $(sed -n 's/.*"node-llama-cpp": "\(.*\)".*/\1/p' "$here/package.json")"
    exit 0
fi

# another engineer may be rebuilding: wait for the binary, then run a private copy of it throughout
for _ in $(seq 60); do [ -x "$HR" ] && break; sleep 10; done
[ -x "$HR" ] || { echo "no $HR after 10 minutes: make build" >&2; exit 1; }
hr_built="$HR built $(date -r "$HR" "+%F %T"), tree then at $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo ' with uncommitted src changes')"
tmp=$(mktemp -d /tmp/headroom-sbs.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cp "$HR" "$tmp/headroom"
hr() { "$tmp/headroom" "$@"; }

cpu() { awk '/^cpu / {print $2 + $3 + $4, $2 + $3 + $4 + $5}' /proc/stat; } # busy and all jiffies, all cores
wait_quiet() {
    local t0=$SECONDS b0 a0 b1 a1
    while ((SECONDS - t0 < QUIET)); do
        read -r b0 a0 < <(cpu); sleep 2; read -r b1 a1 < <(cpu)
        ((100 * (b1 - b0) < 10 * (a1 - a0))) && return
    done
}
# measure CMD...: runs it up to 3 times until other processes took under 10% of the CPUs meanwhile;
# prints that share (in %) and the stdout of the least disturbed try. bench.mjs retries each of its
# timed phases itself and reports their share as others_pct: that counts instead, and is not retried.
measure() {
    local best="" bestp=101 p own b0 a0 b1 a1
    for _ in 1 2 3; do
        wait_quiet
        read -r b0 a0 < <(cpu)
        /usr/bin/time -f "%U %S" -o "$tmp/time" "$@" >"$tmp/out" 2>"$tmp/err" || { tail -n 5 "$tmp/err" >&2; return 1; }
        read -r b1 a1 < <(cpu)
        p=$(awk -v b=$((b1 - b0)) -v a=$((a1 - a0)) -v hz="$(getconf CLK_TCK)" \
            '{p = 100 * (b - ($1 + $2) * hz) / a; print (p < 0) ? 0 : int(p + 0.5)}' "$tmp/time")
        own=$(python3 -c 'import json,sys; print(json.load(sys.stdin).get("others_pct", ""))' <"$tmp/out")
        ((${own:-$p} < bestp)) && { bestp=${own:-$p}; best=$(cat "$tmp/out"); }
        if ((bestp < 10)) || [ -n "$own" ]; then break; fi
    done
    echo "$bestp $best"
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
m() { printf "%s\n" "$@" | median; }
jget() { python3 -c 'import json,sys; j=json.load(sys.stdin); [j := j[k] for k in sys.argv[1].split(".")]; print(j)' "$1"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2fx", a / b}'; }

mkdir -p "$MODELS"
: >"$LOG"
# headroom's prompt: single-token words of the synthetic vocabulary ("▁the", ...), PROMPT tokens with BOS
words=(the cat sat and ran far out one day she saw big red box hat dog)
first=$MODELS/$SHAPE-${TYPES%% *}.gguf
[ -f "$first" ] || hr synth --shape "$SHAPE" --type "${TYPES%% *}" -o "$first" >/dev/null
prompt=${words[0]}
for ((i = 1; i < PROMPT - 1; i++)); do prompt+=" ${words[i % ${#words[@]}]}"; done
n=$(hr tokenize -m "$first" --count "$prompt")
[ "$n" = "$PROMPT" ] || { echo "headroom prompt is $n tokens, not $PROMPT" >&2; exit 1; }
# with PARALLEL: that many 4-token prompts at once (bench.mjs's parallel sequences start from 4 tokens too)
par=(); for ((i = 0; i < PARALLEL; i++)); do par+=(-p "the cat sat"); done
[ "$PARALLEL" = 0 ] || [ "$(hr tokenize -m "$first" --count "the cat sat")" = 4 ] || { echo "short prompt is not 4 tokens" >&2; exit 1; }

# keep SIDE TYPE REPEAT RES: log a measured run, and track the most other processes took during one
keep() {
    others=$((${4%% *} > others ? ${4%% *} : others))
    printf '{"engine":"%s","type":"%s","repeat":%d,"others_pct":%d,"result":%s}\n' "$1" "$2" "$3" "${4%% *}" "${4#* }" >>"$LOG"
}

printf "%-6s %13s %12s %6s %13s %12s %6s" type "llama.cpp pp" "headroom pp" ratio "llama.cpp tg" "headroom tg" ratio
if [ "$PARALLEL" -gt 0 ]; then printf " %17s %16s %6s" "llama.cpp tg x$PARALLEL" "headroom tg x$PARALLEL" ratio; fi
printf " %7s\n" "others"
info=""
for t in $TYPES; do
    f=$MODELS/$SHAPE-$t.gguf
    [ -f "$f" ] || hr synth --shape "$SHAPE" --type "$t" -o "$f" >/dev/null
    lpp=(); ltg=(); lpar=(); hpp=(); htg=(); hpar=(); others=0
    for ((r = 0; r < REPEATS; r++)); do
        for side in $( ((r % 2)) && echo "headroom llama.cpp" || echo "llama.cpp headroom"); do
            if [ "$side" = llama.cpp ]; then
                if ! res=$(measure node "$here/bench.mjs" "$f" --threads "$THREADS" --prompt "$PROMPT" \
                           --gen "$GEN" --repeats 1 --parallel "$PARALLEL" --quiet "$QUIET"); then
                    echo "llama.cpp could not run $f (its error is above)" >&2
                    break 2
                fi
                out=${res#* }
                lpp+=("$(echo "$out" | jget pp_tokens_per_second)")
                ltg+=("$(echo "$out" | jget tg_tokens_per_second)")
                if [ "$PARALLEL" -gt 0 ]; then lpar+=("$(echo "$out" | jget parallel_tg_tokens_per_second)"); fi
                [ -n "$info" ] || info=$(echo "$out" | python3 -c \
                    'import json,sys; j=json.load(sys.stdin); print(j["engine"] + ", CPU library " + j["cpu_backend"])')
            else
                res=$(measure "$tmp/headroom" run -m "$f" -p "$prompt" -n "$GEN" --temp 0 --ignore-eos \
                      -t "$THREADS" --ctx 1024 --json)
                out=${res#* }
                hpp+=("$(echo "$out" | jget prompt_tokens_per_second)")
                htg+=("$(echo "$out" | jget generation_tokens_per_second)")
                if [ "$PARALLEL" -gt 0 ]; then
                    keep "$side" "$t" "$r" "$res"
                    res=$(measure "$tmp/headroom" run -m "$f" "${par[@]}" -n "$GEN" --temp 0 --ignore-eos \
                          -t "$THREADS" --ctx 1024 --json)
                    hpar+=("$(echo "${res#* }" | jget engine.decode_tokens_per_second)")
                fi
            fi
            keep "$side" "$t" "$r" "$res"
        done
    done
    [ ${#lpp[@]} -gt 0 ] && [ ${#hpp[@]} -gt 0 ] || { printf "%-6s llama.cpp failed\n" "$t"; continue; }
    lp=$(m "${lpp[@]}"); hp=$(m "${hpp[@]}"); lt=$(m "${ltg[@]}"); ht=$(m "${htg[@]}")
    printf "%-6s %13.1f %12.1f %6s %13.2f %12.2f %6s" "$t" "$lp" "$hp" "$(ratio "$hp" "$lp")" "$lt" "$ht" "$(ratio "$ht" "$lt")"
    if [ "$PARALLEL" -gt 0 ]; then
        lx=$(m "${lpar[@]}"); hx=$(m "${hpar[@]}")
        printf " %17.2f %16.2f %6s" "$lx" "$hx" "$(ratio "$hx" "$lx")"
    fi
    printf " %6d%%\n" "$others"
done
echo "(tok/s, medians of $REPEATS alternating runs; ratio = headroom / llama.cpp; $SHAPE shape, random weights;"
echo " $THREADS threads, $PROMPT-token prompt, $GEN generated tokens, greedy, f16 KV, no flash attention;"
if [ "$PARALLEL" -gt 0 ]; then
    echo " tg x$PARALLEL: aggregate tok/s of $PARALLEL sequences decoding together after 4-token prompts, decode steps only;"
fi
echo " others = the most of the CPUs other processes took during a kept run (each run is tried up to 3 times for <10%;"
echo "         llama.cpp's timed phases each, headroom's whole run);"
echo " llama.cpp: ${info:-not run}; headroom $hr_built;"
echo " every run in $LOG)"

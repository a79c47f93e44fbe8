#!/usr/bin/env bash
# native.sh: headroom (default kernels and --isa avx2) against llama.cpp built from source on this
# machine (-DGGML_NATIVE=ON: on an AVX-512 CPU its AVX-512/VNNI paths), same synthetic
# TinyLlama-1.1B-shaped GGUFs, same threads. Within a round the three sides alternate per type (the
# order rotates each round) so load on a shared box hits all alike; prints medians and ratios.
#
# usage: bench/llamacpp/native.sh [TYPES] [ROUNDS]        e.g. ... "Q4_0 Q8_0 Q4_K_M Q5_K_M Q6_K" 3
#        TYPES: llama.cpp's mixes (Q4_0, Q8_0, Q4_K_M, Q5_K_M, Q6_K: `headroom synth --mix`, the types
#        its quantizer gives each tensor, as in the files people download; MODELS/tl-mix-NAME.gguf)
#        or single types (q4_0, q4_K, ...: every matrix in that type, `synth --type`; MODELS/tl-TYPE.gguf)
# env:   LLAMA (/tmp/llama.cpp/build/bin: llama-bench and llama-batched-bench), HR (build/headroom),
#        MODELS (/tmp: models are MODELS/tl-TYPE.gguf, made with `headroom synth` when absent),
#        THREADS (2), PROMPT (512 tokens), GEN (64), PARALLEL (16), LOG (/tmp/headroom-native.jsonl),
#        QUIET (20: before each run, wait up to this many seconds for the CPUs to be under 10% busy;
#        each run's log line has "others": the share of the CPUs other processes took meanwhile, in %,
#        and the table gives the worst of them per type and side: llama.cpp's spinning threads slow
#        down many times over when another process takes a core),
#        MAXOTHERS (15: a run during which other processes took more than this % of the CPUs is
#        repeated up to RETRIES (2) times; if it is still loaded its figures are logged with
#        "discarded":true and left out of the medians; the table says how many were),
#        LLAMA_AVX2_LIB (unset: off; a directory holding a libggml-cpu.so built without AVX-512, e.g.
#        /tmp/llama.cpp/build-avx2/bin: adds a fourth side, llama.cpp with that library on
#        LD_LIBRARY_PATH, to set against headroom --isa avx2)
#
# Building llama.cpp (under /tmp, never in this tree):
#     cmake -S /tmp/llama.cpp -B /tmp/llama.cpp/build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
#         -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
#     cmake --build /tmp/llama.cpp/build -j2 --target llama-bench llama-batched-bench
# and its AVX2-only CPU backend (the same llama-bench, another libggml-cpu.so):
#     cmake -S /tmp/llama.cpp -B /tmp/llama.cpp/build-avx2 -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
#         -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF \
#         -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
#     cmake --build /tmp/llama.cpp/build-avx2 -j2 --target ggml-cpu
#
# What is timed:
#   prompt:     llama-bench pp512 (one 512-token batch) vs headroom's prompt_tokens_per_second
#               (a 512-token prompt incl. BOS);
#   1 stream:   llama-bench tg64 (64 tokens after a 4-token context, as llama-bench does) vs headroom's
#               generation_tokens_per_second (64 tokens after the 512-token prompt);
#   PARALLEL:   llama-batched-bench -npp 4 -ntg GEN -npl PARALLEL speed_tg (PARALLEL sequences, one
#               llama_decode per step, decode steps only) vs headroom's engine.decode_tokens_per_second
#               with PARALLEL 4-token prompts (-p repeated), steps without prompt tokens.
#   llama.cpp runs with f16 KV and flash attention off (-fa off), as headroom does; -r 1 per round.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."
TYPES=${1:-"q4_0 q8_0 q4_K"}
ROUNDS=${2:-3}
LLAMA=${LLAMA:-/tmp/llama.cpp/build/bin}
HR=${HR:-build/headroom}
MODELS=${MODELS:-/tmp}
THREADS=${THREADS:-2}
PROMPT=${PROMPT:-512}
GEN=${GEN:-64}
PARALLEL=${PARALLEL:-16}
LOG=${LOG:-/tmp/headroom-native.jsonl}
QUIET=${QUIET:-20}
MAXOTHERS=${MAXOTHERS:-15}
RETRIES=${RETRIES:-2}
LLAMA_AVX2_LIB=${LLAMA_AVX2_LIB:-}
if [ -n "$LLAMA_AVX2_LIB" ] && [ ! -f "$LLAMA_AVX2_LIB/libggml-cpu.so" ]; then
    echo "LLAMA_AVX2_LIB=$LLAMA_AVX2_LIB has no libggml-cpu.so" >&2
    exit 1
fi
for b in "$LLAMA/llama-bench" "$LLAMA/llama-batched-bench" "$HR"; do
    [ -x "$b" ] || { echo "missing $b (see the header of $0)" >&2; exit 1; }
done
tmp=$(mktemp -d /tmp/headroom-native.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cp "$HR" "$tmp/headroom" # a private copy: another engineer may rebuild meanwhile

median() { sort -g | awk 'NF {a[++n]=$1} END {print !n ? 0 : (n%2) ? a[(n+1)/2] : (a[n/2]+a[n/2+1])/2}'; }
m() { printf "%s\n" "$@" | median; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else printf "n/a"}'; }
jget() { python3 -c 'import json,sys; j=json.load(sys.stdin); [j := j[k] for k in sys.argv[1].split(".")]; print(j)' "$1"; }

words=(the cat sat and ran far out one day she saw big red box hat dog)
prompt=${words[0]}
for ((i = 1; i < PROMPT - 1; i++)); do prompt+=" ${words[i % ${#words[@]}]}"; done
par=(); for ((i = 0; i < PARALLEL; i++)); do par+=(-p "the cat sat"); done
: >"$LOG"

declare -A V # V[type,side,metric] = space-separated samples (runs under load left out)
add() { $DISCARD || V[$1,$2,$3]+="$4 "; }
cpu() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8, $2 + $3 + $4 + $5 + $6 + $7 + $8}' /proc/stat; } # busy, all jiffies
wait_quiet() {
    local t0=$SECONDS b0 a0 b1 a1
    while ((SECONDS - t0 < QUIET)); do
        read -r b0 a0 < <(cpu); sleep 2; read -r b1 a1 < <(cpu)
        ((100 * (b1 - b0) < 10 * (a1 - a0))) && return 0
    done
    return 0
}
# timed CMD...: its stdout; sets OTHERS to the % of the CPUs that other processes took while it ran
# and DISCARD to true when that stayed above MAXOTHERS through RETRIES repeats
OTHERS=0
DISCARD=false
NDISCARD=0
timed() {
    local b0 a0 b1 a1 try
    for ((try = 0; try <= RETRIES; try++)); do
        wait_quiet
        read -r b0 a0 < <(cpu)
        /usr/bin/time -f "%U %S" -o "$tmp/time" "$@" >"$tmp/out" 2>"$tmp/err" || { tail -n 5 "$tmp/err" >&2; return 1; }
        read -r b1 a1 < <(cpu)
        OTHERS=$(awk -v b=$((b1 - b0)) -v a=$((a1 - a0)) -v hz="$(getconf CLK_TCK)" \
            '{p = 100 * (b - ($1 + $2) * hz) / a; print (p < 0) ? 0 : int(p + 0.5)}' "$tmp/time")
        ((OTHERS <= MAXOTHERS)) && break
        echo "  loaded run ($OTHERS% of the CPUs to others, $(cut -d' ' -f1-3 /proc/loadavg)): $1 ${*: -3}" >&2
    done
    DISCARD=false
    ((OTHERS > MAXOTHERS)) && DISCARD=true && NDISCARD=$((NDISCARD + 1))
    cat "$tmp/out"
}
declare -A W # W[type,side] = worst OTHERS
worst() { local k=$1,$2; ((OTHERS > ${W[$k]:-0})) && W[$k]=$OTHERS; return 0; }

hr_side() { # TYPE FILE SIDE [--isa avx2]
    local t=$1 f=$2 s=$3; shift 3
    local o
    timed "$tmp/headroom" run -m "$f" -p "$prompt" -n "$GEN" --temp 0 --ignore-eos -t "$THREADS" --ctx 1024 --json "$@" >"$tmp/o"
    o=$(cat "$tmp/o"); worst "$t" "$s"
    echo "{\"side\":\"$s\",\"type\":\"$t\",\"what\":\"single\",\"others\":$OTHERS,\"discarded\":$DISCARD,\"load\":\"$(cut -d' ' -f1-3 /proc/loadavg)\",\"result\":$o}" >>"$LOG"
    add "$t" "$s" pp "$(echo "$o" | jget prompt_tokens_per_second)"
    add "$t" "$s" tg "$(echo "$o" | jget generation_tokens_per_second)"
    timed "$tmp/headroom" run -m "$f" "${par[@]}" -n "$GEN" --temp 0 --ignore-eos -t "$THREADS" --ctx 1024 --json "$@" >"$tmp/o"
    o=$(cat "$tmp/o"); worst "$t" "$s"
    echo "{\"side\":\"$s\",\"type\":\"$t\",\"what\":\"parallel\",\"others\":$OTHERS,\"discarded\":$DISCARD,\"load\":\"$(cut -d' ' -f1-3 /proc/loadavg)\",\"result\":$o}" >>"$LOG"
    add "$t" "$s" par "$(echo "$o" | jget engine.decode_tokens_per_second)"
}
llama_side() { # TYPE FILE [SIDE LIBDIR]
    local t=$1 f=$2 s=${3:-llama} lib=${4:-} o
    local env=(env)
    [ -n "$lib" ] && env+=(LD_LIBRARY_PATH="$lib")
    timed "${env[@]}" "$LLAMA/llama-bench" -m "$f" -p "$PROMPT" -n "$GEN" -t "$THREADS" -r 1 -fa 0 -o jsonl >"$tmp/o"
    o=$(cat "$tmp/o"); worst "$t" "$s"
    echo "$o" | while read -r l; do echo "{\"side\":\"$s\",\"type\":\"$t\",\"what\":\"llama-bench\",\"others\":$OTHERS,\"discarded\":$DISCARD,\"load\":\"$(cut -d' ' -f1-3 /proc/loadavg)\",\"result\":$l}"; done >>"$LOG"
    add "$t" "$s" pp "$(echo "$o" | python3 -c 'import json,sys; print([j["avg_ts"] for j in map(json.loads, sys.stdin) if j["n_prompt"] > 0][0])')"
    add "$t" "$s" tg "$(echo "$o" | python3 -c 'import json,sys; print([j["avg_ts"] for j in map(json.loads, sys.stdin) if j["n_gen"] > 0][0])')"
    timed "${env[@]}" "$LLAMA/llama-batched-bench" -m "$f" -c $((PARALLEL * (GEN + 4) + 256)) -npp 4 -ntg "$GEN" -npl "$PARALLEL" \
        -t "$THREADS" -tb "$THREADS" -fa off --output-format jsonl >"$tmp/o"
    o=$(grep '^{' "$tmp/o"); worst "$t" "$s"
    echo "{\"side\":\"$s\",\"type\":\"$t\",\"what\":\"llama-batched-bench\",\"others\":$OTHERS,\"discarded\":$DISCARD,\"load\":\"$(cut -d' ' -f1-3 /proc/loadavg)\",\"result\":$o}" >>"$LOG"
    add "$t" "$s" par "$(echo "$o" | jget speed_tg)"
}

ismix() { case ${1^^} in Q4_0 | Q8_0 | Q4_K_M | Q5_K_M | Q6_K) [[ $1 == "${1^^}" ]] ;; *) false ;; esac; }
model() { if ismix "$1"; then echo "$MODELS/tl-mix-$1.gguf"; else echo "$MODELS/tl-$1.gguf"; fi; }
for t in $TYPES; do
    f=$(model "$t")
    if [ ! -f "$f" ]; then
        if ismix "$t"; then
            "$tmp/headroom" synth --shape tinyllama-1.1b --mix "$t" -o "$f" >/dev/null
        else
            "$tmp/headroom" synth --shape tinyllama-1.1b --type "$t" -o "$f" >/dev/null
        fi
    fi
done
n=$("$tmp/headroom" tokenize -m "$(model "${TYPES%% *}")" --count "$prompt")
[ "$n" = "$PROMPT" ] || { echo "headroom prompt is $n tokens, not $PROMPT" >&2; exit 1; }

sides=(hr llama hr_avx2)
[ -n "$LLAMA_AVX2_LIB" ] && sides+=(llama_avx2)
ns=${#sides[@]}
for ((r = 0; r < ROUNDS; r++)); do
    echo "round $((r + 1))/$ROUNDS: $(uptime)" >&2
    for t in $TYPES; do
        f=$(model "$t")
        for ((k = 0; k < ns; k++)); do
            case ${sides[(k + r) % ns]} in
                hr) hr_side "$t" "$f" hr ;;
                hr_avx2) hr_side "$t" "$f" hr_avx2 --isa avx2 ;;
                llama) llama_side "$t" "$f" ;;
                llama_avx2) llama_side "$t" "$f" llama_avx2 "$LLAMA_AVX2_LIB" ;;
            esac
        done
    done
done
echo "end: $(uptime)" >&2
echo "runs left out of the medians (others > $MAXOTHERS% of the CPUs after $RETRIES repeats): $NDISCARD" >&2

printf "%-6s %-10s %9s %9s %9s %9s  %s\n" type metric llama.cpp headroom "llama avx2" "hr avx2" \
    "headroom/llama.cpp, hr avx2/llama avx2 (or /llama.cpp without LLAMA_AVX2_LIB), headroom/hr avx2"
for t in $TYPES; do
    for k in pp tg par; do
        l=$(m ${V[$t,llama,$k]:-}); h=$(m ${V[$t,hr,$k]:-}); a=$(m ${V[$t,hr_avx2,$k]:-}); la=$l
        [ -n "$LLAMA_AVX2_LIB" ] && la=$(m ${V[$t,llama_avx2,$k]:-})
        printf "%-6s %-10s %9.2f %9.2f %9.2f %9.2f  %s %s %s   (llama.cpp: %s| headroom: %s| llama avx2: %s| avx2: %s)\n" "$t" \
            "$(case $k in pp) echo "pp$PROMPT" ;; tg) echo "tg$GEN" ;; par) echo "tg$GEN x$PARALLEL" ;; esac)" \
            "$l" "$h" "$la" "$a" "$(ratio "$h" "$l")" "$(ratio "$a" "$la")" "$(ratio "$h" "$a")" \
            "${V[$t,llama,$k]:-}" "${V[$t,hr,$k]:-}" "${V[$t,llama_avx2,$k]:-}" "${V[$t,hr_avx2,$k]:-}"
    done
    h1=$(m ${V[$t,hr,tg]:-}); hx=$(m ${V[$t,hr,par]:-}); a1=$(m ${V[$t,hr_avx2,tg]:-}); ax=$(m ${V[$t,hr_avx2,par]:-})
    l1=$(m ${V[$t,llama,tg]:-}); lx=$(m ${V[$t,llama,par]:-})
    echo "$t worst share of the CPUs taken by others during a run: llama.cpp ${W[$t,llama]:-0}%, headroom ${W[$t,hr]:-0}%, llama avx2 ${W[$t,llama_avx2]:-0}%, avx2 ${W[$t,hr_avx2]:-0}%"
    echo "$t x$PARALLEL / 1-stream: headroom $(ratio "$hx" "$h1"), avx2 $(ratio "$ax" "$a1"), llama.cpp $(ratio "$lx" "$l1")"
done
echo "(tok/s, medians of $ROUNDS rounds, sides alternating; every run in $LOG)"

#!/usr/bin/env bash
# moe_side_by_side.sh: headroom and llama.cpp (llama-bench from a local build, never committed) on the
# same synthetic mixture-of-experts GGUF (qwen3moe, Mixtral, gpt-oss: `headroom synth --type mxfp4` for its MXFP4
# experts), alternating within each repeat so a shared box's load hits
# both alike; prints each side's medians and the ratio headroom / llama.cpp.
#   bench/llamacpp/moe_side_by_side.sh MODEL.gguf LLAMA_BENCH [REPEATS]
# env: BUILD (build), THREADS (2), PROMPT (128 tokens), GEN (32).
# headroom: `run` with a PROMPT-token prompt (prefill tok/s) and GEN greedy tokens (generation tok/s,
# GEN tokens over GEN-1 decodes); llama.cpp: llama-bench pp PROMPT and tg GEN, f16 K/V, flash attention
# off, one repetition per call.
set -euo pipefail
model=$1 lb=$2 repeats=${3:-3}
BUILD=${BUILD:-build} THREADS=${THREADS:-2} PROMPT=${PROMPT:-128} GEN=${GEN:-32}
hr=$BUILD/headroom
# a prompt of about PROMPT tokens: "the cat sat on ..." words, grown until the tokenizer says PROMPT or
# more (BOS included); llama-bench's pp then takes that many tokens too
words=(the cat sat on a mat and then it ran)
prompt=the i=1
while [ "$("$hr" tokenize -m "$model" --count "$prompt")" -lt "$PROMPT" ]; do
    prompt+=" ${words[i % ${#words[@]}]}" i=$((i + 1))
done
PROMPT=$("$hr" tokenize -m "$model" --count "$prompt")
jget() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
hpp=() htg=() lpp=() ltg=()
for ((r = 0; r < repeats; r++)); do
    out=$("$hr" run -m "$model" -p "$prompt" -n "$GEN" --temp 0 --ignore-eos -t "$THREADS" --ctx 1024 --json)
    hpp+=("$(echo "$out" | jget "['prompt_tokens_per_second']")")
    htg+=("$(echo "$out" | jget "['generation_tokens_per_second']")")
    out=$("$lb" -m "$model" -p "$PROMPT" -n "$GEN" -t "$THREADS" -r 1 -fa off -o json 2>/dev/null)
    lpp+=("$(echo "$out" | jget "[0]['avg_ts']")")
    ltg+=("$(echo "$out" | jget "[1]['avg_ts']")")
    echo "repeat $r: headroom pp ${hpp[r]} tg ${htg[r]}; llama.cpp pp ${lpp[r]} tg ${ltg[r]}" >&2
done
a=$(median "${hpp[@]}") b=$(median "${lpp[@]}") c=$(median "${htg[@]}") d=$(median "${ltg[@]}")
echo "$(basename "$model"), $THREADS threads, $repeats repeats (medians, tok/s):"
printf '  prefill %d tokens: headroom %.2f, llama.cpp %.2f, ratio %.2f\n' "$PROMPT" "$a" "$b" "$(echo "$a / $b" | bc -l)"
printf '  generation %d tokens: headroom %.2f, llama.cpp %.2f, ratio %.2f\n' "$GEN" "$c" "$d" "$(echo "$c / $d" | bc -l)"

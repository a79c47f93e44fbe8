#!/usr/bin/env bash
# serve_bench.sh: what HTTP + JSON + SSE cost per generated token, and how the server scales with
# concurrent streaming clients. For each N in CLIENTS, R alternating rounds of
#   (a) `headroom run` with N prompts of M tokens (the engine alone; --json engine rate), and
#   (b) `headroom serve` + N concurrent streaming clients (bench/serve/load.mjs), same prompts, same M;
# medians of each and the ratio (b)/(a). Default model: a TinyLlama-shaped q4_0 synthetic model.
# (Traffic shapes, goodput, refusals and KV figures against any server: `headroom bench`;
# headroom vs llama-server under each shape: bench/vs_llamacpp_server.sh.)
#   bench/serve/serve_bench.sh [BUILD_DIR]     (CLIENTS="1 16 64" M=32 R=3 TYPE=q4_0 SHAPE=tinyllama-1.1b)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
CLIENTS=${CLIENTS:-"1 16 64"}
M=${M:-32}
R=${R:-3}
TYPE=${TYPE:-q4_0}
SHAPE=${SHAPE:-tinyllama-1.1b}
MODEL=${MODEL:-/tmp/headroom-bench-$SHAPE-$TYPE.gguf}
cmake --build "$BUILD" --target headroom >/dev/null
H="$BUILD/headroom"
[ -f "$MODEL" ] || "$H" synth --shape "$SHAPE" --type "$TYPE" -o "$MODEL" >/dev/null
median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) print 0; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
echo "model $MODEL, $M tokens per request, $R rounds, $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-8s %14s %14s %8s %10s %10s\n' clients run_tok_s serve_tok_s ratio ttft_p50 itl_p50
for n in $CLIENTS; do
  runs=(); serves=(); ttfts=(); itls=()
  prompts=()
  for i in $(seq 0 $((n - 1))); do prompts+=(-p "Once upon a time $i"); done
  for r in $(seq 1 "$R"); do
    # (a) the engine through the CLI
    j=$("$H" run -m "$MODEL" "${prompts[@]}" -n "$M" --ctx 256 --temp 0 --ignore-eos --max-running "$n" --json 2>/dev/null || true)
    runs+=("$(node -e 'const j=JSON.parse(require("fs").readFileSync(0,"utf8"));console.log((j.engine||j).generation_tokens_per_second)' <<<"$j")")
    # (b) the same through HTTP
    log=$(mktemp)
    "$H" serve -m "$MODEL" --port 0 --ctx 256 --max-running "$n" --kv-seqs "$n" >"$log" 2>&1 &
    pid=$!
    url=""
    for _ in $(seq 1 600); do
      url=$(grep -o 'http://127.0.0.1:[0-9]*' "$log" | head -1 || true)
      [ -n "$url" ] && curl -sf "$url/health" >/dev/null && break
      sleep 0.1
    done
    out=$(node bench/serve/load.mjs "$url" "$n" "$M")
    kill -TERM "$pid"; wait "$pid" || true; rm -f "$log"
    serves+=("$(node -e 'console.log(JSON.parse(process.argv[1]).tokens_per_second)' "$out")")
    ttfts+=("$(node -e 'console.log(JSON.parse(process.argv[1]).ttft_ms_p50)' "$out")")
    itls+=("$(node -e 'console.log(JSON.parse(process.argv[1]).itl_ms_p50)' "$out")")
  done
  a=$(printf '%s\n' "${runs[@]}" | median); b=$(printf '%s\n' "${serves[@]}" | median)
  printf '%-8s %14.2f %14.2f %8.3f %10s %10s\n' "$n" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN{print (a>0)?b/a:0}')" \
    "$(printf '%s\n' "${ttfts[@]}" | median)" "$(printf '%s\n' "${itls[@]}" | median)"
done

#!/bin/bash
# kv_remote.sh: the Redis KV tier measured (docs/BENCHMARKS.md). Starts its own redis-server on a free
# loopback port (maxmemory 2gb, allkeys-lru, no persistence) and, on a synthetic model (headroom synth):
#   1. GB/s of the tier's own write and read path (bench_kv_remote_bw: Llama-3-8B KV shape, 2 MiB blocks)
#   2. TTFT (max_tokens 1, wall time of the request) of a ~2,000-token prompt: cold on replica A (computed,
#      then written to Redis), local on A again (its own prefix cache), fetched on a fresh replica B
#      (its missing prefix blocks read from Redis); B's completion must equal A's.
# Usage: bench/kv_remote.sh BUILD_DIR [SHAPE (qwen2.5-0.5b)] [TYPE (q8_0)] [N_WORDS (340: ~2,000 tokens with the synth vocabulary)]
set -eu
build=$(cd "$1" && pwd)
shape=${2:-qwen2.5-0.5b}
type=${3:-q8_0}
words=${4:-340}
command -v redis-server > /dev/null || { echo "redis-server is absent (apt-get install redis-server)"; exit 77; }
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done; wait 2> /dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

rp=$(free_port)
redis-server --port "$rp" --bind 127.0.0.1 --save '' --appendonly no --maxmemory 2gb \
    --maxmemory-policy allkeys-lru > "$tmp/redis.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do redis-cli -p "$rp" ping > /dev/null 2>&1 && break; sleep 0.2; done
echo "## tier bandwidth (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
[ "${SKIP_BW:-0}" = 1 ] || "$build/bench_kv_remote_bw" "redis://127.0.0.1:$rp" 64
redis-cli -p "$rp" flushall > /dev/null

"$build/headroom" synth --shape "$shape" --type "$type" -o "$tmp/model.gguf" > /dev/null
prompt=$(python3 -c "import random; r=random.Random(7); print(' '.join('w%d' % r.randrange(100000) for _ in range($words)))")
body="{\"prompt\": \"$prompt\", \"max_tokens\": 1, \"temperature\": 0}"
start() { # start NAME: a replica with the tier; sets url
    "$build/headroom" serve -m "$tmp/model.gguf" --port 0 -c 4096 --ctx-extend --kv-remote "redis://127.0.0.1:$rp" \
        > "$tmp/$1.out" 2> "$tmp/$1.err" &
    pids+=($!)
    url=
    for _ in $(seq 600); do
        url=$(grep -o 'http://127.0.0.1:[0-9]*' "$tmp/$1.out" 2> /dev/null | head -1 || true)
        [ -n "$url" ] && curl -sf "$url/health" > /dev/null && return 0
        sleep 0.2
    done
    echo "replica $1 did not start" >&2
    exit 1
}
ask() { # ask LABEL: one request, prints the wall time and the prefix-hit tokens
    curl -s -o "$tmp/$1.json" -w '%{time_total}' "$url/v1/completions" -H 'Content-Type: application/json' \
        -d "$body" > "$tmp/$1.t"
    grep -q "\"usage\"" "$tmp/$1.json" || { echo "$1: $(head -c 300 "$tmp/$1.json")" >&2; exit 1; }
    python3 - "$1" "$tmp/$1.json" "$tmp/$1.t" << 'PY'
import json, sys
d = json.load(open(sys.argv[2])); t = float(open(sys.argv[3]).read())
print("%-8s TTFT %7.3f s   prompt %d tokens, prefix hits %d" % (sys.argv[1], t, d["usage"]["prompt_tokens"], d["usage"]["kv"]["prefix_hit_tokens"]))
PY
}
echo "## TTFT, $shape $type, max_tokens 1 (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
start a
ask cold
sleep 2 # let the writer finish (the next request would find the blocks locally anyway)
ask local
start b
ask fetched
for f in cold local fetched; do python3 -c "import json,sys; print(json.load(open('$tmp/$f.json'))['choices'][0]['text'].encode())"; done \
    | sort -u | wc -l | grep -q '^1$' && echo "same completion on all three" || { echo "completions differ" >&2; exit 1; }
kill -TERM "${pids[1]}" "${pids[2]}"
wait "${pids[1]}" "${pids[2]}" 2> /dev/null || true
grep -h "KV tier:" "$tmp/a.err" "$tmp/b.err"

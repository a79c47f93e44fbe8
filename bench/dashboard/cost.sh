#!/bin/bash
# cost.sh: does the dashboard cost a server anything when nobody watches? (docs/BENCHMARKS.md,
# "Dashboard and headroom top")
#   1. the per-request hooks, timed in a loop (activity_cost.c against BUILD's libraries)
#   2. serve throughput, alternating rounds: A (a headroom built without the feature), B (with it,
#      nobody polling /v1/kv) and Bw (with it, /v1/kv polled every 500 ms, as the page does)
# usage: bench/dashboard/cost.sh BUILD A_HEADROOM [ROUNDS=8] [REQUESTS=400]
#   A_HEADROOM: a build without the feature (e.g. commit 5e70098); B is BUILD/headroom, or
#   $B_HEADROOM (a build that differs from A by the feature alone). BUILD's headroom is the client.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
a_bin=$2
rounds=${3:-8}
requests=${4:-400}
b_bin=${B_HEADROOM:-$build/headroom}
client=$build/headroom
model=$root/models/stories260K-q8_0.gguf
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
libs=""
for l in server runtime engine model tokenizer sampler kv backend_cpu gguf tensor common; do libs="$libs $build/libhr_$l.a"; done
cc -O2 -I "$root/src" "$root/bench/dashboard/activity_cost.c" $libs -ljansson -lmicrohttpd -lpcre2-8 -lm -lpthread \
    -o "$tmp/activity_cost"
"$tmp/activity_cost"

port=18931
run() { # label binary poll_ms
    "$2" serve -m "$model" --port $port -t 1 --kv-budget 4MiB --drain-timeout 1 > /dev/null 2>&1 &
    local pid=$!
    for _ in $(seq 100); do curl -s -o /dev/null "localhost:$port/health" && break; sleep 0.1; done
    "$client" bench --url "http://127.0.0.1:$port" --pattern decode-heavy --scale 0.5 --requests "$requests" \
        --concurrency 16 --poll-ms "$3" -q --json 2> /dev/null |
        python3 -c "import json, sys; d = json.load(sys.stdin); print('$1', round(d['throughput']['output_tokens_per_s']))"
    kill $pid
    wait $pid 2> /dev/null || true
}
for round in $(seq "$rounds"); do
    if [ $((round % 2)) -eq 1 ]; then order="A B Bw"; else order="Bw B A"; fi
    for x in $order; do
        case $x in
            A) run A "$a_bin" 0 ;;
            B) run B "$b_bin" 0 ;;
            Bw) run Bw "$b_bin" 500 ;;
        esac
    done
done | tee "$tmp/runs"
python3 - "$tmp/runs" << 'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    k, v = line.split()
    runs.setdefault(k, []).append(int(v))
for k in ("A", "B", "Bw"):
    v = runs.get(k, [])
    if v:
        print(f"{k:3s} generated tok/s: median {statistics.median(v):.0f}, min {min(v)}, max {max(v)} over {len(v)} runs")
PY

#!/bin/bash
# prometheus.sh: /metrics as Prometheus reads it. Run by ctest:  prometheus.sh HEADROOM_BIN [MODEL.gguf]
# Checks: `promtool check metrics` accepts the native exposition with no lint problem, and the
# --metrics-compat vllm one with none but the colons vLLM's names carry; a real Prometheus server on
# loopback scrapes `headroom serve` and its HTTP API returns the series (vllm:num_preemptions_total,
# vllm:prefix_cache_queries_total / _hits_total with the tokens a repeated prompt hit, the pool gauges).
# Exits 77 (skipped) when prometheus, promtool or curl is absent. Every wait is bounded.
set -u
bin=$1
model=${2:-}
for t in prometheus promtool curl; do
    command -v $t > /dev/null || { echo "SKIP: $t is absent (apt-get install prometheus curl)"; exit 77; }
done
tmp=$(mktemp -d)
srv_pid=
prom_pid=
failed=0
passed=0
cleanup() {
    [ -n "$srv_pid" ] && kill "$srv_pid" 2> /dev/null
    [ -n "$prom_pid" ] && kill "$prom_pid" 2> /dev/null
    wait 2> /dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
check() { # check CONDITION-STATUS MESSAGE
    if [ "$1" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "CHECK failed: $2" >&2; fi
}
wait_for() { # wait_for SECONDS COMMAND...: polls every 0.2 s until COMMAND succeeds
    local deadline=$((SECONDS + $1))
    shift
    while ! "$@"; do
        [ $SECONDS -ge $deadline ] && return 1
        sleep 0.2
    done
}

args=(serve --port 0 --metrics-compat vllm --drain-timeout 1 -t 1)
[ -n "$model" ] && [ -f "$model" ] && args+=(-m "$model")
"$bin" "${args[@]}" > "$tmp/srv.out" 2> "$tmp/srv.err" &
srv_pid=$!
port_of() { grep -oE 'listening on [^ ]+:[0-9]+' "$tmp/srv.out" | grep -oE '[0-9]+$'; }
wait_for 60 port_of > /dev/null || { echo "the server did not start: $(cat "$tmp/srv.err")" >&2; exit 1; }
port=$(port_of)
url="http://127.0.0.1:$port"
wait_for 60 curl -sf "$url/health" > /dev/null
# the same prompt twice: the second takes its full blocks from the prefix cache
prompt='Once upon a time there was a little girl named Lily. She liked to play outside with her friends in the park near her house every day.'
for i in 1 2; do
    curl -sf "$url/v1/completions" -d "{\"prompt\":\"$prompt\",\"max_tokens\":4,\"temperature\":0}" > "$tmp/c$i.json"
done
cached=$(grep -oE '"cached_tokens":[0-9]+' "$tmp/c2.json" | grep -oE '[0-9]+$')
check $((${cached:-0} <= 0)) "the repeated prompt reports cached_tokens > 0 (got '${cached:-}')"

# ---- promtool: the native exposition lints clean; vLLM's names only trip the colon rule ------------
curl -sf "$url/metrics" > "$tmp/m.txt"
grep -v '^vllm:' "$tmp/m.txt" | awk '/^# (HELP|TYPE) vllm:/ {next} {print}' > "$tmp/native.txt"
promtool check metrics < "$tmp/native.txt" > "$tmp/lint1" 2>&1
rc=$?
check $rc "promtool on the native metrics: exit $rc: $(head -5 "$tmp/lint1")"
promtool check metrics < "$tmp/m.txt" > "$tmp/lint2" 2>&1
rc=$?
other=$(grep -v "metric names should not contain ':'" "$tmp/lint2" | grep -v '^$')
check $(((rc != 0 && rc != 3) || ${#other} > 0)) "promtool on the vllm metrics: exit $rc: $other"
for name in vllm:num_preemptions_total vllm:prefix_cache_queries_total vllm:prefix_cache_hits_total; do
    grep -q "^# TYPE $name counter$" "$tmp/m.txt"
    check $? "/metrics lacks the counter $name"
done

# ---- a real Prometheus scrapes it ------------------------------------------------------------------
pport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2> /dev/null ||
    echo $((20000 + RANDOM % 20000)))
cat > "$tmp/prom.yml" << YML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: headroom
    static_configs:
      - targets: ['127.0.0.1:$port']
YML
prometheus --config.file="$tmp/prom.yml" --storage.tsdb.path="$tmp/tsdb" --web.listen-address="127.0.0.1:$pport" \
    > "$tmp/prom.log" 2>&1 &
prom_pid=$!
query() { # query EXPR: the first sample's value, or nothing
    curl -sf --get "http://127.0.0.1:$pport/api/v1/query" --data-urlencode "query=$1" |
        grep -oE '"value":\[[0-9.]+,"[^"]*"\]' | head -1 | grep -oE '"[^"]*"\]$' | tr -d '"]'
}
has_series() { [ -n "$(query "$1")" ]; }
wait_for 60 has_series 'vllm:prefix_cache_hits_total'
check $? "Prometheus never scraped vllm:prefix_cache_hits_total: $(tail -3 "$tmp/prom.log")"
hits=$(query 'vllm:prefix_cache_hits_total')
queries=$(query 'vllm:prefix_cache_queries_total')
check $(( ${hits%.*} <= 0 || ${queries%.*} < ${hits%.*} )) "prefix-cache hits $hits of $queries queried tokens"
check $(( $(query 'up{job="headroom"}' | cut -d. -f1) != 1 )) "up{job=headroom} is not 1"
check $([ "$(query 'vllm:num_preemptions_total')" = 0 ]; echo $?) "vllm:num_preemptions_total is not 0"
has_series 'headroom_kv_pool_bytes{state="free"}'
check $? "Prometheus lacks headroom_kv_pool_bytes"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]

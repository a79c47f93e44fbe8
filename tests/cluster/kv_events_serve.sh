#!/bin/bash
# kv_events_serve.sh: `headroom serve --kv-events` (and --kv-remote's failure path) as a whole process. Run by ctest:
#   kv_events_serve.sh HEADROOM_BIN
# Checks: an endpoint that cannot bind (an address this host does not have) is one log line and serve
# still answers; with a good endpoint (and replay), two requests sharing a prompt publish batches
# (the exit line counts them, none dropped). The wire format itself is checked by test_kv_events.
# Exits 77 when curl is absent. Every wait is bounded; nothing asserts a speed.
set -u
bin=$1
command -v curl > /dev/null || { echo "SKIP: curl is absent (apt-get install curl)"; exit 77; }
tmp=$(mktemp -d)
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2> /dev/null
    wait 2> /dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
failed=0
check() { if [ "$1" -eq 0 ]; then echo "ok: $2"; else failed=1; echo "CHECK failed: $2" >&2; fi; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start() { # start ARGS...: serve on a free HTTP port; sets pid and url
    "$bin" serve --port 0 "$@" > "$tmp/out" 2> "$tmp/err" &
    pid=$!
    url=
    for _ in $(seq 1 150); do
        url=$(grep -o 'http://127.0.0.1:[0-9]*' "$tmp/out" 2> /dev/null | head -1)
        [ -n "$url" ] && curl -sf "$url/health" > /dev/null && return 0
        sleep 0.2
    done
    return 1
}
stop() {
    kill -TERM "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2> /dev/null || break; sleep 0.2; done
    wait "$pid"
    local rc=$?
    pid=
    return $rc
}
ask() {
    curl -sf "$url/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt": "a shared system prompt that is long enough to fill more than one block of sixteen tokens, twice over at least", "max_tokens": 4, "temperature": 0}'
}

start --kv-events tcp://203.0.113.1:5557
check $? "serve starts although the events endpoint cannot bind"
grep -q "cannot bind tcp://203.0.113.1:5557.*serving without KV events" "$tmp/err"
check $? "the bind failure is one log line naming the endpoint"
ask | grep -q '"finish_reason"'
check $? "serve answers without events"
stop
check $? "serve exits 0"

p1=$(free_port)
p2=$(free_port)
start --kv-events "tcp://127.0.0.1:$p1" --kv-events-replay "tcp://127.0.0.1:$p2"
check $? "serve starts with events"
grep -q "KV events on tcp://127.0.0.1:$p1, replay on tcp://127.0.0.1:$p2" "$tmp/err"
check $? "the start line names both endpoints"
ask > /dev/null && ask | grep -q '"finish_reason"'
check $? "two requests sharing a prompt"
stop
check $? "serve exits 0"
line=$(grep "KV events: " "$tmp/err")
echo "$line"
b=$(echo "$line" | sed -n 's/.*KV events: \([0-9]*\) batches, \([0-9]*\) events, \([0-9]*\) dropped.*/\1 \2 \3/p')
read -r nb ne nd <<< "$b"
[ "${nb:-0}" -ge 2 ] && [ "${ne:-0}" -ge 3 ] && [ "${nd:-1}" -eq 0 ]
check $? "batches were published (stored blocks and the clears at start and exit), none dropped"

# --kv-remote with nothing listening: one line, serve runs without the tier
p3=$(free_port)
start --kv-remote "redis://127.0.0.1:$p3"
check $? "serve starts although Redis is unreachable"
grep -q "cannot reach redis://127.0.0.1:$p3.*serving without the shared KV tier" "$tmp/err"
check $? "the unreachable tier is one log line naming the URL"
ask | grep -q '"finish_reason"'
check $? "serve answers without the tier"
stop
check $? "serve exits 0"
exit $failed

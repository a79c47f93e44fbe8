#!/bin/bash
# top_tmux.sh: `headroom top` against a live server, in a real terminal (tmux: send-keys and
# capture-pane). Run by ctest:  top_tmux.sh HEADROOM_BIN [MODEL.gguf] [SCREEN.txt]
# Checks: an unreachable URL and a wrong key end with one line and exit 1; --once prints the pool
# and the requests; the live view draws the pool bar and request rows under load, says
# "disconnected, retrying" when the server goes away, quits on q and on Ctrl-C with exit 0, and
# leaves the terminal as it found it (no alternate screen, canonical mode and echo back on).
# Exits 77 (skipped) when tmux or curl is absent. Every wait is bounded; nothing asserts a speed.
set -u
bin=$1
model=${2:-}
screen_out=${3:-}
command -v tmux > /dev/null || { echo "SKIP: tmux is absent (apt-get install tmux)"; exit 77; }
command -v curl > /dev/null || { echo "SKIP: curl is absent (apt-get install curl)"; exit 77; }

tmp=$(mktemp -d)
sock="hrtop$$"
srv_pid=
load_pids=()
failed=0
passed=0
cleanup() {
    for p in "${load_pids[@]}"; do kill "$p" 2> /dev/null; done
    [ -n "$srv_pid" ] && kill "$srv_pid" 2> /dev/null
    tmux -L "$sock" kill-server 2> /dev/null
    wait 2> /dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
check() { # check CONDITION-STATUS MESSAGE
    if [ "$1" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "CHECK failed: $2" >&2; fi
}
# wait_for SECONDS COMMAND...: polls every 0.2 s until COMMAND succeeds; 1 when time ran out
wait_for() {
    local deadline=$((SECONDS + $1))
    shift
    while ! "$@"; do
        [ $SECONDS -ge $deadline ] && return 1
        sleep 0.2
    done
}
pane() { tmux -L "$sock" capture-pane -p -t "$1"; }
pane_has() { pane "$1" | grep -qE "$2"; }

# ---- a server with a key and a tight pool ----------------------------------------------------------
key=top-key
args=(serve --port 0 --api-key "$key" --drain-timeout 1 -t 1 --kv-budget 400KiB --admission optimistic)
[ -n "$model" ] && [ -f "$model" ] && args+=(-m "$model")
"$bin" "${args[@]}" > "$tmp/srv.out" 2> "$tmp/srv.err" &
srv_pid=$!
port_of() { grep -oE 'listening on [^ ]+:[0-9]+' "$tmp/srv.out" | grep -oE '[0-9]+$'; }
wait_for 60 port_of > /dev/null || { echo "the server did not start: $(cat "$tmp/srv.err")" >&2; exit 1; }
port=$(port_of)
url="http://127.0.0.1:$port"
wait_for 60 curl -sf "$url/health" > /dev/null # bound before the model is loaded: /health says when

# ---- bad input: one line, exit 1 ---------------------------------------------------------------------
"$bin" top --url http://127.0.0.1:1 --once > "$tmp/o" 2> "$tmp/e"
rc=$?
check $((rc != 1)) "unreachable URL: exit $rc (want 1)"
check $(($(wc -l < "$tmp/e") != 1)) "unreachable URL: one line on stderr, got: $(cat "$tmp/e")"
grep -q "cannot reach http://127.0.0.1:1/v1/kv" "$tmp/e"
check $? "unreachable URL names it: $(cat "$tmp/e")"
"$bin" top --url "$url" --api-key wrong --once > "$tmp/o" 2> "$tmp/e"
rc=$?
check $((rc != 1)) "wrong key: exit $rc (want 1)"
check $(($(wc -l < "$tmp/e") != 1)) "wrong key: one line on stderr, got: $(cat "$tmp/e")"
grep -q "401" "$tmp/e"
check $? "wrong key says 401: $(cat "$tmp/e")"
"$bin" top --url "$url" --once < /dev/null > "$tmp/o" 2> "$tmp/e"
check $(($? != 1)) "no key: exit 1"
"$bin" top --url "$url" --api-key "$key" < /dev/null > "$tmp/o" 2> "$tmp/e"
rc=$?
check $((rc != 2)) "the live view without a terminal: exit $rc (want 2)"
"$bin" top --url "$url" --bogus > /dev/null 2> "$tmp/e"
check $(($? != 2)) "an unknown flag: exit 2"
"$bin" top --url "$url" --timeout 0.5 --once > /dev/null 2> "$tmp/e"
check $(($? != 2)) "--timeout below 1 s: exit 2"
grep -q -- "--timeout" "$tmp/e"
check $? "--timeout out of range names it: $(cat "$tmp/e")"
"$bin" top --url "$url" --api-key "$key" --once > "$tmp/o" 2> "$tmp/e"
check $? "--once exits 0 ($(cat "$tmp/e"))"
grep -q "^pool \[" "$tmp/o" && grep -q "no active requests" "$tmp/o" && grep -q "budget 400.0 KiB" "$tmp/o"
check $? "--once prints the pool, the budget and no requests: $(cat "$tmp/o")"

# ---- the live view under load --------------------------------------------------------------------------
tmux -L "$sock" new-session -d -s live -x 150 -y 40 \
    "HEADROOM_API_KEY=$key '$bin' top --url '$url' --timeout 60; echo EXIT=\$? > '$tmp/exit1'; stty -a > '$tmp/stty1'; sleep 60"
wait_for 90 pane_has live '^pool \['
check $? "the live view draws the pool bar: $(pane live)"
body='{"prompt": "Once upon a time there was a little girl", "max_tokens": 400, "temperature": 0.8, "ignore_eos": true}'
for i in 1 2 3 4 5 6; do
    (while true; do
        curl -s -o /dev/null -m 30 -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
            -d "$body" "$url/v1/completions"
    done) &
    load_pids+=($!)
done
row='^ +[0-9]+ (decode|prefill|waiting|preempted|swapped) '
wait_for 60 pane_has live "$row"
check $? "request rows appear under load: $(pane live)"
wait_for 60 pane_has live 'preempt_(recompute|swap) #[0-9]+'
check $? "preemption events appear: $(pane live)"
pane live | grep -qE '[0-9.]+ req/s  prompt [0-9.]+ tok/s  generated [0-9.]+ tok/s'
check $? "rates line"
if [ -n "$screen_out" ]; then # bench/screenshots.sh: the screen as text, and with its colours
    wait_for 30 pane_has live "$row"
    tmux -L "$sock" capture-pane -p -e -t live > "${screen_out%.*}.ansi"
    pane live | awk '{ line[NR] = $0 } NF { last = NR } END { for (i = 1; i <= last; i++) print line[i] }' > "$screen_out"
fi
for p in "${load_pids[@]}"; do kill "$p" 2> /dev/null; done
load_pids=()

# ---- the server goes away, then q -----------------------------------------------------------------------
kill "$srv_pid"
wait "$srv_pid" 2> /dev/null
srv_pid=
wait_for 20 pane_has live 'disconnected, retrying'
check $? "a server that goes away: 'disconnected, retrying': $(pane live)"
pane live | grep -q '^pool \['
check $? "the last picture stays under the message"
tmux -L "$sock" send-keys -t live q
wait_for 15 test -s "$tmp/stty1"
check $? "q quits"
grep -q "EXIT=0" "$tmp/exit1" 2> /dev/null
check $? "q: exit 0 ($(cat "$tmp/exit1" 2> /dev/null))"
grep -qE '(^| )icanon( |$)' "$tmp/stty1" && grep -qE '(^| )echo( |$)' "$tmp/stty1"
check $? "q: the terminal is back in canonical mode with echo"
alt=$(tmux -L "$sock" display-message -p -t live '#{alternate_on}')
check $((alt != 0)) "q: the alternate screen is left (alternate_on=$alt)"

# ---- unreachable at start in a terminal; then Ctrl-C on a live view ------------------------------------
tmux -L "$sock" new-session -d -s sig -x 120 -y 30 \
    "'$bin' top --url '$url' --api-key '$key'; echo EXIT=\$? > '$tmp/exit2'; stty -a > '$tmp/stty2'; sleep 60"
wait_for 20 test -s "$tmp/exit2"
check $? "top exits by itself when the server is unreachable at start"
grep -q "EXIT=1" "$tmp/exit2" 2> /dev/null
check $? "unreachable at start in a terminal: exit 1 ($(cat "$tmp/exit2" 2> /dev/null))"
"$bin" "${args[@]}" > "$tmp/srv.out" 2> "$tmp/srv.err" &
srv_pid=$!
wait_for 60 port_of > /dev/null || { echo "the server did not restart" >&2; exit 1; }
url="http://127.0.0.1:$(port_of)"
wait_for 60 curl -sf "$url/health" > /dev/null
wait_for 60 curl -sf -H "Authorization: Bearer $key" "$url/v1/kv" > /dev/null
# --timeout 60: a machine loaded past top's default 5 s per fetch (the whole suite under sanitizers
# on 2 cores) would make the first fetch fail and top exit 1 ("unreachable at start", as designed and
# checked above); this live view is here for Ctrl-C, so it waits as long as the other waits here do
tmux -L "$sock" new-session -d -s sig2 -x 120 -y 30 \
    "'$bin' top --url '$url' --api-key '$key' --timeout 60; echo EXIT=\$? > '$tmp/exit3'; stty -a > '$tmp/stty3'; sleep 60"
wait_for 90 pane_has sig2 '^pool \['
check $? "a second live view starts: $(pane sig2)"
tmux -L "$sock" send-keys -t sig2 C-c
wait_for 15 test -s "$tmp/stty3"
check $? "Ctrl-C quits"
grep -q "EXIT=0" "$tmp/exit3" 2> /dev/null && grep -qE '(^| )icanon( |$)' "$tmp/stty3"
check $? "Ctrl-C: exit 0 and the terminal restored ($(cat "$tmp/exit3" 2> /dev/null))"

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]

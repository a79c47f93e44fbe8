#!/bin/bash
# replicas.sh: 3 headroom replicas on loopback behind HAProxy (deploy/haproxy.cfg.in), prefix-aware
# (consistent hash of the prefix key, bounded load) against round-robin, in one run.
#   bench/replicas.sh BUILD_DIR [REQUESTS (96)] [CONCURRENCY (3)] [SCALE (0.6)]
# Checks (exit 1 when one fails): requests sharing a system prompt land on one replica; 12 concurrent
# requests of one prefix spread over more than one replica (hash-balance-factor); then
# `headroom bench --pattern shared-prefix` through each frontend, each time on 3 fresh replicas
# (empty caches), and prints prefix-hit tokens and TTFT p50 with the ratios prefix-aware / round-robin.
# Needs haproxy and python3 (exits 77 without haproxy). The demo model (random weights) unless MODEL=FILE.
# CHECK_ONLY=1 (ctest's test_deploy_haproxy): only the affinity checks, which do not depend on timing.
set -u
build=$(cd "$1" && pwd)
requests=${2:-96}
conc=${3:-3}
scale=${4:-0.6}
here=$(cd "$(dirname "$0")/.." && pwd)
command -v haproxy > /dev/null || { echo "SKIP: haproxy is absent (apt-get install haproxy)"; exit 77; }
tmp=$(mktemp -d)
rpids=()
hpid=
failed=0
cleanup() {
    for p in "${rpids[@]}"; do kill "$p" 2> /dev/null || true; done
    [ -n "$hpid" ] && kill "$hpid" 2> /dev/null
    wait 2> /dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
check() { if [ "$1" -eq 0 ]; then echo "ok: $2"; else failed=1; echo "CHECK failed: $2" >&2; fi; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
model_args=()
[ -n "${MODEL:-}" ] && model_args=(-m "$MODEL")

start_replicas() { # 3 fresh replicas; sets ports[]
    for p in "${rpids[@]}"; do kill "$p" 2> /dev/null || true; wait "$p" 2> /dev/null; done
    rpids=()
    ports=()
    for i in 0 1 2; do
        "$build/headroom" serve "${model_args[@]}" --port 0 -c 1024 --ctx-extend --kv-seqs ${KV_SEQS:-1} > "$tmp/r$i.out" 2> "$tmp/r$i.err" &
        rpids+=($!)
    done
    for i in 0 1 2; do
        local u=
        for _ in $(seq 300); do
            u=$(grep -o 'http://127.0.0.1:[0-9]*' "$tmp/r$i.out" 2> /dev/null | head -1)
            [ -n "$u" ] && curl -sf "$u/health" > /dev/null && break
            sleep 0.2
        done
        [ -n "$u" ] || { echo "replica $i did not start" >&2; exit 1; }
        ports+=("${u##*:}")
    done
}
start_haproxy() { # (re)starts HAProxy over ports[]; sets hport and rrport
    [ -n "$hpid" ] && { kill "$hpid" 2> /dev/null; wait "$hpid" 2> /dev/null; }
    hpid=
    local servers=""
    for i in 0 1 2; do servers+="    server r$i 127.0.0.1:${ports[$i]} maxconn 64"$'\n'; done
    # a free port can be taken by another program between free_port and haproxy's bind (ctest runs
    # other servers beside this one): haproxy then exits, and the next try takes fresh ports
    for try in 1 2 3; do
        hport=$(free_port)
        rrport=$(free_port)
        [ "$hport" = "$rrport" ] && continue
        python3 - "$here/deploy/haproxy.cfg.in" "$tmp/haproxy.cfg" "$hport" "$rrport" "$servers" << 'PY'
import sys
s = open(sys.argv[1]).read()
s = s.replace("@BIND@", "127.0.0.1").replace("@PORT_HASH@", sys.argv[3]).replace("@PORT_RR@", sys.argv[4])
s = s.replace("@FACTOR@", "125").replace("@SERVERS@\n", sys.argv[5])
open(sys.argv[2], "w").write(s)
PY
        haproxy -c -f "$tmp/haproxy.cfg" > /dev/null || { echo "haproxy rejects the configuration" >&2; exit 1; }
        haproxy -db -f "$tmp/haproxy.cfg" > "$tmp/haproxy.log" 2>&1 &
        hpid=$!
        for _ in $(seq 150); do # up to 30 s on a loaded machine
            curl -sf "http://127.0.0.1:$hport/health" > /dev/null && return 0
            kill -0 "$hpid" 2> /dev/null || break
            sleep 0.2
        done
        echo "haproxy try $try on ports $hport, $rrport did not answer; its log:" >&2
        sed 's/^/  /' "$tmp/haproxy.log" >&2
        kill "$hpid" 2> /dev/null
        wait "$hpid" 2> /dev/null
        hpid=
    done
    echo "haproxy did not start" >&2
    exit 1
}
ask() { # ask PORT SYSTEM TAIL MAX_TOKENS: prints the replica that answered
    curl -s -D - -o /dev/null "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"prompt\": \"$2 $3\", \"max_tokens\": $4, \"ignore_eos\": true}" |
        tr -d '\r' | sed -n 's/^x-headroom-replica: //Ip'
}

start_replicas
start_haproxy
sys_a="You are a careful assistant for a shipping company. Answer in two sentences and cite the manual section. Never promise a delivery date; give the window the tracking page shows. If the parcel is insured, say so and name the claim form. Keep a polite tone and do not repeat the question back to the customer."
sys_b="Translate the user's text into French, keeping names and numbers unchanged, and say nothing else at all. Keep the punctuation of the original, use the formal vous, keep units as written, and when a sentence is ambiguous choose the reading a lawyer would choose. Do not add notes or explanations."
# affinity: one prefix, different tails, one after another
got=$(for t in 1 2 3 4 5 6; do ask "$hport" "$sys_a" "question $t about parcels" 4; done | sort -u)
[ "$(echo "$got" | wc -l)" -eq 1 ] && [ -n "$got" ]
check $? "6 requests sharing a prefix all went to $got"
got_b=$(for t in 1 2 3; do ask "$hport" "$sys_b" "text $t" 4; done | sort -u)
[ "$(echo "$got_b" | wc -l)" -eq 1 ]
check $? "3 requests of another prefix all went to $got_b"
if [ "${CHECK_ONLY:-0}" = 1 ]; then exit $failed; fi # ctest: the deterministic part (no timing)
# bounded load: 12 concurrent long requests of one prefix
for t in $(seq 12); do ask "$hport" "$sys_a" "burst $t" 160 > "$tmp/burst$t" & done
wait $(jobs -p | grep -v "^$hpid$" | grep -vw -e "${rpids[0]}" -e "${rpids[1]}" -e "${rpids[2]}") 2> /dev/null
spread=$(cat "$tmp"/burst* | sort | uniq -c | sort -rn)
echo "burst of 12 concurrent same-prefix requests by replica:"
echo "$spread"
top=$(echo "$spread" | head -1 | awk '{print $1}')
[ "$(echo "$spread" | wc -l)" -ge 2 ] && [ "$top" -lt 12 ]
check $? "bounded load spread the burst (largest share $top of 12)"

run_bench() { # run_bench PORT OUT.json
    "$build/headroom" bench --url "http://127.0.0.1:$1" --pattern shared-prefix --requests "$requests" \
        --concurrency "$conc" --scale "$scale" --poll-ms 0 --json -q > "$2"
}
start_replicas
start_haproxy
run_bench "$hport" "$tmp/hash.json"
check $? "bench through the prefix-aware frontend: every request ok"
start_replicas
start_haproxy
run_bench "$rrport" "$tmp/rr.json"
check $? "bench through the round-robin frontend: every request ok"
python3 - "$tmp/hash.json" "$tmp/rr.json" << 'PY'
import json, sys
h, r = (json.load(open(p)) for p in sys.argv[1:3])
def row(name, d):
    print("%-14s prefix-hit tokens %6d of %6d prompt tokens (%4.1f%%)   TTFT p50 %7.1f ms  p90 %7.1f ms" % (
        name, d["kv"]["prefix_hit_tokens"], d["tokens"]["prompt"], 100.0 * d["kv"]["prefix_hit_tokens"] / d["tokens"]["prompt"],
        d["ttft_ms"]["p50"], d["ttft_ms"]["p90"]))
row("prefix-aware", h)
row("round-robin", r)
hits = h["kv"]["prefix_hit_tokens"] / max(1, r["kv"]["prefix_hit_tokens"])
ttft = r["ttft_ms"]["p50"] / h["ttft_ms"]["p50"]
print("ratios: prefix-hit tokens x%.2f (prefix-aware / round-robin), TTFT p50 x%.2f faster" % (hits, ttft))
sys.exit(0 if hits > 1 and ttft > 1 else 3)
PY
check $? "prefix-aware beats round-robin on prefix hits and TTFT p50"
exit $failed

#!/usr/bin/env bash
# vs_llamacpp_server.sh: headroom serve and llama.cpp's llama-server side by side under every
# `headroom bench` pattern, same model, same threads, same KV memory. For each pattern a fresh
# llama-server and a fresh headroom serve each take the same requests (same pattern, seed, scale,
# loop), one after the other (the order alternates by pattern so load on a shared box falls on both);
# the table prints each figure for both and the ratio headroom / llama-server.
#
# usage: bench/vs_llamacpp_server.sh /path/to/llama-server [BUILD_DIR]
# env:   MODEL (/tmp/headroom-bench-tinyllama-1.1b-q4_0.gguf, synthesized when absent), CTX (2048: the
#        KV tokens both servers hold), NP (4: llama-server slots, each CTX/NP tokens), THREADS (2),
#        SLO_TTFT (10000 ms), SLO_ITL (500 ms per output token), SEED (1), PATTERNS (all six),
#        OUT (/tmp/headroom-vs-llama-server: every run's JSON report and the servers' logs)
#
# The same KV memory: llama-server -c CTX -np NP --no-kv-unified gives each of NP slots CTX/NP
# tokens of f16 K and V, CTX tokens in all; headroom serve --kv-budget holds the bytes of CTX f16
# tokens (the bytes per token are the model's: 2 x layers x KV heads x head size x 2 bytes) in one
# paged pool that any request may use up to --ctx CTX. llama.cpp is not part of this repository:
# build its llama-server from its own source and pass the binary.
set -euo pipefail
LLAMA_SERVER=${1:?usage: $0 /path/to/llama-server [BUILD_DIR]}
BUILD=${2:-build}
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
MODEL=${MODEL:-/tmp/headroom-bench-tinyllama-1.1b-q4_0.gguf}
CTX=${CTX:-2048}
NP=${NP:-4}
THREADS=${THREADS:-2}
SLO_TTFT=${SLO_TTFT:-10000}
SLO_ITL=${SLO_ITL:-500}
SEED=${SEED:-1}
PATTERNS=${PATTERNS:-"long-few short-burst prefill-heavy decode-heavy shared-prefix mixed"}
OUT=${OUT:-/tmp/headroom-vs-llama-server}
[ -x "$LLAMA_SERVER" ] || { echo "not an executable: $LLAMA_SERVER" >&2; exit 2; }
command -v node >/dev/null || { echo "node is needed to read the JSON reports" >&2; exit 2; }
if ! cmake --build "$BUILD" --target headroom >"$OUT.build.log" 2>&1; then
    [ -x "$BUILD/headroom" ] || { cat "$OUT.build.log" >&2; exit 1; }
    echo "warning: building headroom failed (see $OUT.build.log); using the existing $BUILD/headroom" >&2
fi
mkdir -p "$OUT"
HR="$OUT/headroom"
cp "$BUILD/headroom" "$HR" # a private copy: another engineer may rebuild meanwhile
[ -f "$MODEL" ] || "$HR" synth --shape tinyllama-1.1b --type q4_0 -o "$MODEL" >/dev/null

# Per pattern: the bench's bounds and loop. Small, because 2 cores run a 1.1B model at a few tokens per
# second; the scale keeps long-few's prompts (~300-500 words, 450-750 tokens) past one llama-server
# slot (CTX/NP = 512 tokens) and inside headroom's --ctx, which is the point of that row.
args_for() {
    case $1 in
    long-few) echo "--scale 0.4 --requests 3 --concurrency 2" ;;
    short-burst) echo "--scale 1 --requests 16 --rate 4" ;;
    prefill-heavy) echo "--scale 0.25 --requests 8 --concurrency 4" ;;
    decode-heavy) echo "--scale 0.25 --requests 8 --concurrency 8" ;;
    shared-prefix) echo "--scale 0.5 --requests 12 --concurrency 6" ;;
    mixed) echo "--scale 0.25 --requests 12 --rate 1" ;;
    *) echo "unknown pattern $1" >&2; exit 2 ;;
    esac
}

free_port() { node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }
pid=""
stop() { if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=""; fi; }
trap stop EXIT
wait_health() { # $1 port: up to 120 s for /health 200
    for _ in $(seq 600); do
        curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.2
    done
    return 1
}

# KV bytes per token of the model, f16 K and V, read from the GGUF through headroom's own banner
port=$(free_port)
"$HR" serve -m "$MODEL" --port "$port" --ctx "$CTX" --kv-type f16 --kv-seqs 1 -t 1 >"$OUT/probe.log" 2>&1 &
pid=$!
wait_health "$port" || { cat "$OUT/probe.log" >&2; exit 1; }
budget=$(sed -n 's/.*budget \([0-9.]* [KMG]iB\) = \([0-9]*\) tokens.*/\1 \2/p' "$OUT/probe.log" | head -1)
stop
[ -n "$budget" ] || { echo "could not read headroom's KV budget line" >&2; cat "$OUT/probe.log" >&2; exit 1; }
bytes=$(node -e 'const [v,u,t]=process.argv.slice(1);const m={KiB:1024,MiB:1048576,GiB:1073741824}[u];console.log(Math.round(v*m))' $budget)
echo "model $MODEL; KV: $CTX f16 tokens = $bytes bytes for both (llama-server: $NP slots x $((CTX / NP)) tokens; headroom: one pool, --ctx $CTX)"
echo "threads $THREADS, SLO: TTFT <= $SLO_TTFT ms and time per output token <= $SLO_ITL ms, seed $SEED, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"

run_llama() { # $1 pattern
    port=$(free_port)
    "$LLAMA_SERVER" -m "$MODEL" -c "$CTX" -np "$NP" --no-kv-unified -ctk f16 -ctv f16 -t "$THREADS" \
        --host 127.0.0.1 --port "$port" >"$OUT/llama-$1.log" 2>&1 &
    pid=$!
    wait_health "$port" || { tail -5 "$OUT/llama-$1.log" >&2; return 1; }
    # shellcheck disable=SC2046
    "$HR" bench --url "http://127.0.0.1:$port" --pattern "$1" $(args_for "$1") --seed "$SEED" \
        --slo-ttft "$SLO_TTFT" --slo-itl "$SLO_ITL" --timeout 300 --json -q >"$OUT/llama-$1.json" || true
    stop
}
run_headroom() { # $1 pattern
    port=$(free_port)
    "$HR" serve -m "$MODEL" --ctx "$CTX" --kv-budget "$bytes" --kv-type f16 -t "$THREADS" \
        --host 127.0.0.1 --port "$port" >"$OUT/headroom-$1.log" 2>&1 &
    pid=$!
    wait_health "$port" || { tail -5 "$OUT/headroom-$1.log" >&2; return 1; }
    # shellcheck disable=SC2046
    "$HR" bench --url "http://127.0.0.1:$port" --pattern "$1" $(args_for "$1") --seed "$SEED" \
        --slo-ttft "$SLO_TTFT" --slo-itl "$SLO_ITL" --timeout 300 --json -q --plot "$OUT/headroom-$1.svg" \
        >"$OUT/headroom-$1.json" || true
    stop
}

i=0
for p in $PATTERNS; do
    if ((i % 2 == 0)); then run_llama "$p"; run_headroom "$p"; else run_headroom "$p"; run_llama "$p"; fi
    i=$((i + 1))
done

# one row per pattern: each figure as headroom / llama-server and their ratio
node - "$OUT" $PATTERNS <<'EOF'
const fs = require("fs");
const [out, ...patterns] = process.argv.slice(2);
const read = (who, p) => { try { return JSON.parse(fs.readFileSync(`${out}/${who}-${p}.json`, "utf8")); } catch { return null; } };
const ratio = (a, b) => (b > 0 ? (a / b).toFixed(2) : a > 0 ? "inf" : "-");
const f = (x, d = 2) => (x == null ? "-" : Number(x).toFixed(d));
const rows = [["pattern", "sent", "sessions hr/ll (x)", "goodput req/s hr/ll (x)", "TTFT p99 s hr/ll (x)",
               "refused+short hr/ll", "out tok/s hr/ll (x)"]];
for (const p of patterns) {
    const h = read("headroom", p), l = read("llama", p);
    if (!h || !l) { rows.push([p, "run failed (see the logs in " + out + ")"]); continue; }
    const fails = (j) => `${j.requests.refused + j.requests.failed + j.requests.timed_out}+${j.requests.short_of_max_tokens}`;
    const t99 = (j) => (j.ttft_ms.p99 == null ? null : j.ttft_ms.p99 / 1000);
    rows.push([p, String(h.requests.sent),
        `${h.concurrency.peak_streaming}/${l.concurrency.peak_streaming} (${ratio(h.concurrency.peak_streaming, l.concurrency.peak_streaming)})`,
        `${f(h.throughput.goodput_requests_per_s, 3)}/${f(l.throughput.goodput_requests_per_s, 3)} (${ratio(h.throughput.goodput_requests_per_s, l.throughput.goodput_requests_per_s)})`,
        `${f(t99(h), 1)}/${f(t99(l), 1)} (${t99(h) != null && t99(l) != null ? ratio(t99(h), t99(l)) : "-"})`,
        `${fails(h)}/${fails(l)}`,
        `${f(h.throughput.output_tokens_per_s, 1)}/${f(l.throughput.output_tokens_per_s, 1)} (${ratio(h.throughput.output_tokens_per_s, l.throughput.output_tokens_per_s)})`]);
}
const w = rows[0].map((_, c) => Math.max(...rows.map((r) => (r[c] || "").length)));
for (const r of rows) console.log(r.map((c, k) => (c || "").padEnd(w[k])).join("  "));
console.log("\nsessions: the most requests streaming at once (first token seen, not done), client side;");
console.log("goodput: ok requests within both SLOs per second; refused+short: refused, failed or timed out +");
console.log("ok but stopped short of max_tokens (a full llama-server slot); (x) = headroom / llama-server.");
for (const p of patterns) {
    for (const who of ["headroom", "llama"]) {
        const j = read(who, p);
        if (!j) continue;
        const why = Object.entries(j.requests.failure_reasons).map(([k, v]) => `${v}x ${k}`);
        const codes = Object.entries(j.requests.refusals_by_code).map(([k, v]) => `${v}x HTTP ${k}`);
        const short = j.per_request.filter((q) => q.status === "ok" && q.completion_tokens != null && q.completion_tokens < q.max_tokens).length;
        const kv = j.kv.reported ? `, KV pool peak ${(j.kv.pool_peak_used_bytes / 1048576).toFixed(1)} of ${(j.kv.pool_total_bytes / 1048576).toFixed(1)} MiB, prefix hits ${j.kv.prefix_hit_tokens} tokens, preemptions ${j.kv.preemptions}` : "";
        const cached = j.kv.openai_cached_tokens != null ? `, cached prompt tokens ${j.kv.openai_cached_tokens}` : "";
        const notes = [...codes, ...why, ...(short ? [`${short} short of max_tokens`] : [])].join("; ");
        console.log(`${p.padEnd(14)} ${who.padEnd(8)} ok ${j.requests.ok}/${j.requests.sent}, TTFT p50 ${f(j.ttft_ms.p50 / 1000, 2)} s, ITL p50 ${f(j.itl_ms.p50, 0)} ms${kv}${cached}${notes ? "; " + notes : ""}`);
    }
}
EOF

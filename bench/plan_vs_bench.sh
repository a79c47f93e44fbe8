#!/usr/bin/env bash
# plan_vs_bench.sh [BUILD]: the traffic simulator (`headroom plan --traffic`) against a real
# `headroom serve` measured by `headroom bench`, end to end, on this machine (issue #14; results in
# docs/BENCHMARKS.md). Steps: synthesize a TinyLlama-shaped q4_0 model cut to 2 layers; for each of
# two open-loop traces (burst, chat): calibrate the cost model (`headroom plan --calibrate`), start a
# fresh server (so no prefix cache carries over) with a step log, replay the trace with `headroom bench
# --pattern`, note who used the CPU (engine, HTTP threads, client), stop the server, calibrate again,
# then simulate the same requests (arrival times from the trace, token counts the server reported)
# with the same settings and each calibration; print measured vs simulated output tokens/s and median
# TTFT (the simulation's: the mean of the two calibrations'), and PASS when every ratio is within 15%.
# Exit 0 all PASS, 1 some FAIL, 2 setup failed. About 80 s on 2 quiet cores. Needs python3 and curl.
# Env: SEED (default 1), TOL (default 0.15), KEEP=1 keeps the work folder (traces, calibrations, step
# logs, bench and plan JSON) and prints its path.
set -euo pipefail
BUILD=${1:-build}
HR=$BUILD/headroom
SEED=${SEED:-1}
TOL=${TOL:-0.15}
[ -x "$HR" ] || { echo "plan_vs_bench: $HR not found (build it: cmake --build $BUILD --target headroom)" >&2; exit 2; }
command -v python3 >/dev/null && command -v curl >/dev/null || { echo "plan_vs_bench: needs python3 and curl" >&2; exit 2; }
WORK=$(mktemp -d /tmp/plan_vs_bench.XXXXXX)
SERVER_PID=
cleanup() {
    if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
    if [ "${KEEP:-0}" = 1 ]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
# one server setting for both sides
CTX=1024 RUN=16 THREADS=2
SERVE_FLAGS="--ctx $CTX --kv-seqs $RUN --max-running $RUN --admission adaptive -t $THREADS"
PLAN_FLAGS="--ctx $CTX --max-running $RUN -t $THREADS"

echo "== model ($(date -u +%H:%M:%S) UTC, load average $(cut -d' ' -f1-3 /proc/loadavg))"
"$HR" synth --shape tinyllama-1.1b --type q4_0 --layers 2 --seed 7 -o "$WORK/model.gguf"

# the traces: prompt_words and max_tokens per request, arrival times in seconds
python3 - "$WORK" "$SEED" <<'EOF'
import json, random, sys
work, seed = sys.argv[1], int(sys.argv[2])
r = random.Random(seed)
with open(f"{work}/burst.jsonl", "w") as f:  # 3 bursts of 12 requests, 6 s apart
    for b in range(3):
        for i in range(12):
            f.write(json.dumps({"t": round(6.0 * b + 0.01 * i, 3), "prompt_words": r.randint(48, 80),
                                "max_tokens": r.randint(24, 40)}) + "\n")
with open(f"{work}/chat.jsonl", "w") as f:  # Poisson 1.5/s, long-tailed lengths
    t = 0.0
    for i in range(30):
        f.write(json.dumps({"t": round(t, 3), "prompt_words": min(600, max(8, int(r.lognormvariate(4.4, 0.7)))),
                            "max_tokens": min(200, max(4, int(r.lognormvariate(3.7, 0.6))))}) + "\n")
        t += r.expovariate(1.5)
EOF

fail=0
printf '\n%-6s %10s %10s %7s   %9s %9s %7s\n' trace "tok/s meas" "sim" ratio "TTFT50 ms" "sim" ratio
for trace in burst chat; do
    # calibrated just before and just after each run (this machine's speed drifts by 10-20% from one
    # minute to the next): the simulation with each, and their mean, are compared
    "$HR" plan --calibrate "$WORK/$trace.cal1.json" -t $THREADS >"$WORK/$trace.cal1.txt"
    # a fresh server: port 0, the port read from its log
    "$HR" serve -m "$WORK/model.gguf" --host 127.0.0.1 --port 0 $SERVE_FLAGS --step-log "$WORK/$trace.steps.jsonl" >"$WORK/serve.out" 2>"$WORK/serve.err" </dev/null &
    SERVER_PID=$!
    port=
    for _ in $(seq 1 300); do
        port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$WORK/serve.out" "$WORK/serve.err" | head -1)
        [ -n "$port" ] && break
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.2
    done
    if [ -z "$port" ]; then echo "plan_vs_bench: the server did not start:" >&2; cat "$WORK/serve.err" >&2; exit 2; fi
    rc=0
    TIMEFORMAT='%U %S'
    { time timeout 240 "$HR" bench --url "http://127.0.0.1:$port" --pattern "$WORK/$trace.jsonl" --scale 1 \
        --poll-ms 0 --seed "$SEED" --json -q >"$WORK/$trace.bench.json" 2>"$WORK/bench.err" || rc=$?; } \
        2>"$WORK/$trace.client_cpu"
    # who used the two cores during the run: the server's threads named "headroom" (main, engine and its
    # kernel workers) against the rest (libmicrohttpd's listener and connection threads, finished ones
    # included), and the bench client; CPU seconds from /proc (clock ticks)
    python3 - "$SERVER_PID" "$WORK/$trace.client_cpu" "$WORK/$trace.bench.json" >"$WORK/$trace.cpu" <<'EOF' || true
import glob, json, os, sys
pid, hz = sys.argv[1], os.sysconf("SC_CLK_TCK")
def cpu(path):
    f = open(path).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / hz
total = cpu(f"/proc/{pid}/stat")
named = sum(cpu(t + "/stat") for t in glob.glob(f"/proc/{pid}/task/*") if open(t + "/comm").read().strip() == "headroom")
client = sum(float(x) for x in open(sys.argv[2]).read().split()[-2:])
wall = json.load(open(sys.argv[3]))["throughput"]["wall_s"]
print(f"  cpu over {wall:.1f} s wall (2 cores: {2 * wall:.1f} core-s): server engine {named:.1f} s, "
      f"server HTTP threads {total - named:.1f} s, bench client {client:.1f} s")
EOF
    kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=
    if [ $rc -ne 0 ]; then echo "plan_vs_bench: bench on $trace: exit $rc (not every request ok)" >&2; cat "$WORK/bench.err" >&2; exit 2; fi
    "$HR" plan --calibrate "$WORK/$trace.cal2.json" -t $THREADS >"$WORK/$trace.cal2.txt"
    # the same requests for the simulator: the trace's arrivals, the server's token counts
    python3 - "$WORK/$trace.jsonl" "$WORK/$trace.bench.json" >"$WORK/$trace.plan.jsonl" <<'EOF'
import json, sys
trace = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
per = json.load(open(sys.argv[2]))["per_request"]
assert len(per) == len(trace), "bench answered a different number of requests"
for q in sorted(per, key=lambda q: q["index"]):
    print(json.dumps({"t": trace[q["index"]]["t"], "prompt": q["prompt_tokens"], "output": q["completion_tokens"]}))
EOF
    for k in 1 2; do
        rc=0
        "$HR" plan -m "$WORK/model.gguf" $PLAN_FLAGS --traffic "$WORK/$trace.plan.jsonl" --cost "$WORK/$trace.cal$k.json" \
            --json >"$WORK/$trace.plan$k.json" || rc=$?
        [ $rc -le 1 ] || { echo "plan_vs_bench: plan on $trace: exit $rc" >&2; exit 2; }
    done
    python3 - "$trace" "$WORK/$trace.bench.json" "$WORK/$trace.plan1.json" "$WORK/$trace.plan2.json" "$TOL" <<'EOF' || fail=1
import json, sys
name, tol = sys.argv[1], float(sys.argv[5])
b = json.load(open(sys.argv[2]))
def row(path):
    rows = json.load(open(path))["traffic"]["candidates"]
    return next(r for r in rows if r["kv_type"] == "f16" and r["policy"] == "full" and r["admission"] == "adaptive")
s1, s2 = row(sys.argv[3]), row(sys.argv[4])
mt, st = b["throughput"]["output_tokens_per_s"], (s1["throughput_tok_s"] + s2["throughput_tok_s"]) / 2
mf, sf = b["ttft_ms"]["p50"], (s1["ttft_p50_s"] + s2["ttft_p50_s"]) / 2 * 1000
srv = sorted(q["server_ttft_ms"] for q in b["per_request"] if q.get("server_ttft_ms") is not None)
rt, rf = st / mt, sf / mf
ok = abs(rt - 1) <= tol and abs(rf - 1) <= tol
print(f"{name:<6} {mt:10.1f} {st:10.1f} {rt:7.2f}   {mf:9.0f} {sf:9.0f} {rf:7.2f}   {'PASS' if ok else 'FAIL'}")
print(f"  simulated TTFT p50 with the calibration before the run {s1['ttft_p50_s'] * 1000:.0f} ms, after it "
      f"{s2['ttft_p50_s'] * 1000:.0f} ms (compared: their mean)")
if srv:
    h = (len(srv) - 1) / 2  # interpolated, as headroom bench and the simulator take percentiles
    p50 = srv[int(h)] + (srv[min(int(h) + 1, len(srv) - 1)] - srv[int(h)]) * (h - int(h))
    print(f"  the server's own TTFT p50 (usage.kv.first_token_seconds): {p50:.0f} ms")
sys.exit(0 if ok else 1)
EOF
    cat "$WORK/$trace.cpu"
    echo "  cost model before: $(head -1 "$WORK/$trace.cal1.txt")"
    echo "  cost model after:  $(head -1 "$WORK/$trace.cal2.txt")"
done
echo "(ratio = simulated / measured; PASS within $TOL)"
exit $fail

#!/usr/bin/env python3
"""scale.py: the numbers behind docs/SCALE.md. A fleet of N replicas of Llama-3-8B (f16 KV) on
H100-80GB serving a documented workload, round-robin vs prefix-aware routing, with and without a
shared KV tier:

  workload: P = 2,000 distinct 2,000-token system prompts (per-customer prompts, RAG documents),
  popularity Zipf(s = 1.0); each request = its prefix + 200 fresh tokens, 200 output tokens;
  4 requests/s per replica (the fleet's rate grows with N).

Two parts:
 1. hit rates, for N = 1..100, over the whole fleet: an exact LRU over prefix ids per replica
    (capacity C prefixes, from the pool `headroom plan` sizes: 28,448 blocks of 16 = 455,168 tokens,
    less ~2 running requests' worth: C = 220 prefixes), max(50,000, 600 N) requests of which the
    first fifth warm up; with the tier, a local miss of a prefix computed anywhere before is a fetch
    (Redis large enough to keep all P: 2,000 x 250 MiB = 500 GiB, i.e. a cluster, not one box).
 2. TTFT from the planner's simulator (`headroom plan --traffic TRACE`, the engine's scheduler and
    block manager in virtual time, H100 roofline) on replica 0's own trace for a few N (the
    simulator runs one engine; replicas do not interact without a tier, so one replica's trace is
    exact for it). The simulator has no fetch cost model: the tier rows are arithmetic.

  python3 bench/scale.py BUILD_DIR [--sim]     (--sim: also run part 2, ~15 s per run)
"""
import json, random, subprocess, sys, zlib, os
from collections import OrderedDict, deque

P, PREFIX, FRESH, OUT, RATE, C = 2000, 2000, 200, 200, 4.0, 220
WARM, MEASURE = 10000, 40000
weights = [1.0 / (i + 1) for i in range(P)]
cum = []
acc = 0.0
for w in weights:
    acc += w
    cum.append(acc)

def draw(r):
    import bisect
    return bisect.bisect_left(cum, r.random() * acc)

def replica_of(prefix, n):  # consistent hashing: a ring of 100 points per replica, like HAProxy's
    return ring_lookup(n, zlib.crc32(b"p%d" % prefix))

_rings = {}
def ring_lookup(n, h):
    import bisect
    if n not in _rings:
        pts = sorted((zlib.crc32(b"r%d-%d" % (s, k)), s) for s in range(n) for k in range(100))
        _rings[n] = ([p for p, _ in pts], [s for _, s in pts])
    keys, owners = _rings[n]
    i = bisect.bisect_left(keys, h) % len(keys)
    return owners[i]

def hit_rates(n, routing, seed=1):
    """The whole fleet: fractions of requests that hit their replica's cache, would be fetched from
    the tier (computed before somewhere, evicted or never here), or are computed for the first time;
    and the busiest replica's share of requests over the mean (without hash-balance-factor)."""
    r = random.Random(seed)
    lrus = [OrderedDict() for _ in range(n)]
    load = [0] * n
    seen_fleet = set()
    hits = fetch = miss = 0
    recent, window_load = deque(), [0] * n
    total = max(50000, 600 * n)
    warm = total // 5
    for i in range(total):
        p = draw(r)
        if routing == "rr":
            k = i % n
        elif routing == "prefix":
            k = replica_of(p, n)
        else:  # prefix+bound: HAProxy's hash-balance-factor 125, on requests in a sliding window
            k = bounded_replica(p, n, recent, window_load)
            recent.append(k)
            window_load[k] += 1
            if len(recent) > 8 * n:
                window_load[recent.popleft()] -= 1
        lru = lrus[k]
        local = p in lru
        if local:
            lru.move_to_end(p)
        else:
            lru[p] = True
            if len(lru) > C:
                lru.popitem(last=False)
        if i >= warm:
            load[k] += 1
            if local:
                hits += 1
            elif p in seen_fleet:
                fetch += 1
            else:
                miss += 1
        seen_fleet.add(p)
    t = hits + fetch + miss
    return hits / t, fetch / t, miss / t, max(load) / (t / n)

def bounded_replica(p, n, recent, window_load):
    """The first replica on p's ring walk whose share of the last 8 N requests is under 125% of the
    mean (a stand-in for requests in flight, which a closed-form model does not have)."""
    import bisect
    ring_lookup(n, 0)
    keys, owners = _rings[n]
    i = bisect.bisect_left(keys, zlib.crc32(b"p%d" % p)) % len(keys)
    cap = 1.25 * max(1, len(recent)) / n
    tried = set()
    for step in range(len(keys)):
        k = owners[(i + step) % len(keys)]
        if k in tried:
            continue
        tried.add(k)
        if window_load[k] + 1 <= cap or len(tried) == n:
            return k
    return owners[i]


def trace(n, routing, path, n_req=400, seed=2):
    r = random.Random(seed)
    t = 0.0
    out = []
    i = 0
    while len(out) < n_req:
        t += r.expovariate(RATE * n)  # the fleet's arrivals
        p = draw(r)
        mine = (i % n == 0) if routing == "rr" else (replica_of(p, n) == 0)
        i += 1
        if mine:
            out.append('{"t": %.4f, "prompt": %d, "output": %d, "prefix": %d, "prefix_tokens": %d}' %
                       (t, PREFIX + FRESH, OUT, p, PREFIX))
    open(path, "w").write("\n".join(out) + "\n")

def simulate(build, path):
    cfg = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "plan", "llama-3-8b.config.json")
    o = subprocess.run([build + "/headroom", "plan", "-m", cfg, "--device", "h100-80gb", "--traffic", path,
                        "--sim-running", "64", "--kv-type", "f16", "--json"], capture_output=True, text=True)
    d = json.loads(o.stdout)
    c = [x for x in d["traffic"]["candidates"] if x["ran"] and x["admission"] == "adaptive" and x["policy"] == "full"
         and x["kv_type"] == "f16"][0]
    return c["ttft_p50_s"], c["ttft_p99_s"], c["throughput_tok_s"]

if __name__ == "__main__":
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    print("N    routing       local  tier-hit  first-time   busiest replica / mean")
    for n in (1, 2, 4, 8, 16, 32, 64, 100):
        for routing in ("rr", "prefix", "prefix+bound"):
            if n == 1 and routing != "rr":
                continue
            h, f, m, load = hit_rates(n, routing)
            print("%-4d %-12s %6.1f%% %7.1f%% %9.1f%%      %.2f" % (n, routing, 100 * h, 100 * f, 100 * m, load))
    if "--sim" in sys.argv:
        print("\nsimulator (replica 0, 400 requests, H100 roofline, f16, full policy, adaptive admission, 64 running):")
        print("N    routing       TTFT p50   TTFT p99   tokens/s")
        for n in (1, 8, 32, 100):
            for routing in ("rr", "prefix"):
                if n == 1 and routing == "prefix":
                    continue
                path = "/tmp/scale_%d_%s.jsonl" % (n, routing)
                trace(n, routing, path)
                p50, p99, tps = simulate(build, path)
                print("%-4d %-12s %7.3f s  %7.3f s  %8.0f" % (n, routing, p50, p99, tps))

#!/usr/bin/env python3
"""torch_attn.py: PyTorch's decode attention at gpu_bench's shapes, the peer of its "attention" rows.

Batch 16 queries (one new token each, each its own sequence), 32 query heads, 8 KV heads, head_dim 128,
contexts 1K / 8K / 32K, f16 K and V, through torch.nn.functional.scaled_dot_product_attention on the
GPU (enable_gqa=True where this torch has it; else K and V repeated to 32 heads with repeat_interleave,
which the output says). Bytes read are counted as gpu_bench counts them: K + V of every query's context
for the 8 KV heads (16 * ctx * 8 * 128 * 2 * 2 bytes), whatever the kernel really reads. Timing: CUDA
events around loops of R back-to-back calls after a warm-up (R making a loop about 2 ms), the median
over the loops of (loop time / R); the calls rotate over copies of K and V totalling >= 256 MiB so each
reads from HBM, not L2.

Usage: torch_attn.py [--json FILE] [--md FILE] [--bench-json gpu_bench.json] [--quick]
  --bench-json: gpu_bench's JSON, for its copy bandwidth (each row's % of copy) and its attention rows
  (the ratio headroom / torch per context).
Exit 0 measured, 3 when torch or a CUDA device is missing (one line "torch: not available (...)"),
1 when a check failed (the output against a float32 reference on the same inputs).
"""
import argparse
import datetime
import json
import math
import statistics
import sys


def not_available(args, why):
    print("torch: not available (%s)" % why)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"schema": "headroom-gpu-bench-torch/1", "available": False, "reason": why}, f, indent=2)
    return 3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    ap.add_argument("--md")
    ap.add_argument("--bench-json")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (a check of the script)")
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # ImportError, or a torch that fails to load its libraries
        return not_available(args, "import torch: %s" % (str(e).splitlines()[0] if str(e) else type(e).__name__))
    if not torch.cuda.is_available():
        return not_available(args, "torch %s sees no CUDA device" % torch.__version__)

    copy_gbs, ours = None, {}
    if args.bench_json:
        try:
            with open(args.bench_json) as f:
                b = json.load(f)
            copy_gbs = b["copy"][0]["value"]
            for r in b.get("attention", []):
                if r.get("format") == "f16" and r.get("value"):
                    ours[r["ctx"]] = r["value"]
        except Exception as e:
            print("torch_attn: %s unreadable (%s); no %% of copy" % (args.bench_json, e))

    dev = torch.device("cuda")
    if args.quick:
        batch, H, Hkv, D, ctxs = 3, 8, 2, 64, [40, 300]
    else:
        batch, H, Hkv, D, ctxs = 16, 32, 8, 128, [1024, 8192, 32768]
    # enable_gqa (torch >= 2.5): tried on a tiny GQA call (the function is a builtin: no signature to read)
    try:
        t = torch.zeros(1, 4, 1, 8, device=dev, dtype=torch.float16)
        F.scaled_dot_product_attention(t, t[:, :2], t[:, :2], enable_gqa=True)
        gqa = True
    except (TypeError, RuntimeError):
        gqa = False
    how = "enable_gqa=True" if gqa else "K and V repeat_interleave'd to %d heads before the call" % H
    name = torch.cuda.get_device_name(dev)
    print("torch %s, CUDA %s, %s; GQA: %s" % (torch.__version__, torch.version.cuda, name, how))

    def sdpa(q, k, v):
        if gqa:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        g = H // Hkv
        return F.scaled_dot_product_attention(q, k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1))

    rows, failed = [], 0
    for ctx in ctxs:
        rep_bytes = batch * ctx * Hkv * D * 2 * 2  # K + V, f16
        copies = max(1, min(8, math.ceil((256 << 20) / rep_bytes)))
        gen = torch.Generator(device=dev).manual_seed(ctx)
        q = torch.randn(batch, H, 1, D, device=dev, dtype=torch.float16, generator=gen)
        kv = [(torch.randn(batch, Hkv, ctx, D, device=dev, dtype=torch.float16, generator=gen),
               torch.randn(batch, Hkv, ctx, D, device=dev, dtype=torch.float16, generator=gen)) for _ in range(copies)]
        # the check: query batch-1 against float32 attention on the same f16 inputs
        out = sdpa(q, kv[0][0], kv[0][1])
        k32 = kv[0][0][-1].float().repeat_interleave(H // Hkv, dim=0)
        v32 = kv[0][1][-1].float().repeat_interleave(H // Hkv, dim=0)
        p = torch.softmax((q[-1].float() @ k32.transpose(-1, -2)) / math.sqrt(D), dim=-1)
        err = (out[-1].float() - p @ v32).abs().max().item()
        ok = err < 2e-3
        failed += not ok
        # warm-up, then loops of R calls
        torch.cuda.synchronize()
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        sdpa(q, kv[0][0], kv[0][1])
        t1.record()
        t1.synchronize()
        est = max(t0.elapsed_time(t1), 1e-3)
        reps = 1 if args.quick else max(1, min(200, math.ceil(2.0 / est)))
        loops = 3 if args.quick else max(3, min(15, int(400.0 / (est * reps))))
        per, i = [], 0
        for _ in range(loops):
            t0.record()
            for _ in range(reps):
                k, v = kv[i % copies]
                sdpa(q, k, v)
                i += 1
            t1.record()
            t1.synchronize()
            per.append(t0.elapsed_time(t1) / reps)
        ms = statistics.median(per)
        gbs = rep_bytes / (ms * 1e-3) / 1e9
        r = {
            "what": "torch sdpa f16", "ctx": ctx, "queries": batch, "n_heads": H, "n_kv_heads": Hkv, "head_dim": D,
            "dtype": "float16", "bytes_per_rep": rep_bytes, "median_ms": ms, "loops": loops, "reps_per_loop": reps,
            "value": gbs, "unit": "GB/s", "kv_copies_rotated": copies,
            "pct_of_copy_bw": 100.0 * gbs / copy_gbs if copy_gbs else None,
            "headroom_f16_gbs": ours.get(ctx), "headroom_over_torch": ours[ctx] / gbs if ctx in ours else None,
            "check": "%s (max abs err %.2g vs float32)" % ("ok" if ok else "FAIL", err),
        }
        rows.append(r)
        print("  torch sdpa f16  ctx %-6d %d queries H %d/%d D %d  %9.4g GB/s  %.4g ms (%dx%d)  %s%s" % (
            ctx, batch, H, Hkv, D, gbs, ms, loops, reps,
            "%.1f%% of copy  " % r["pct_of_copy_bw"] if copy_gbs else "", r["check"]))
        del kv, q, out
        torch.cuda.empty_cache()

    result = {
        "schema": "headroom-gpu-bench-torch/1", "available": True, "torch": torch.__version__,
        "cuda": torch.version.cuda, "device": name, "gqa": how, "quick": args.quick,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "bytes": "K + V of every query's context for the KV heads, f16 (as gpu_bench counts)",
        "timing": "CUDA events around loops of reps_per_loop calls after a warm-up; median over loops of loop/reps",
        "copy_gbs": copy_gbs, "rows": rows, "failed": failed,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if args.md:
        with open(args.md, "w") as f:
            f.write("# PyTorch's decode attention (bench/gpu/torch_attn.py)\n\n")
            f.write("torch %s, CUDA %s, %s; GQA: %s\n\n" % (torch.__version__, torch.version.cuda, name, how))
            f.write("| ctx | shape | GB/s | median (loops x reps) | % of copy | headroom f16 / torch | check |\n")
            f.write("| ---: | --- | ---: | ---: | ---: | ---: | --- |\n")
            for r in rows:
                f.write("| %d | %d queries, H %d/%d, D %d, f16 | %.4g | %.4g ms (%dx%d) | %s | %s | %s |\n" % (
                    r["ctx"], batch, H, Hkv, D, r["value"], r["median_ms"], r["loops"], r["reps_per_loop"],
                    "%.1f%%" % r["pct_of_copy_bw"] if r["pct_of_copy_bw"] else "-",
                    "%.2f" % r["headroom_over_torch"] if r["headroom_over_torch"] else "-", r["check"]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

/* gpu_bench_attn.c: gpu_bench's section 4 (gpu_bench.c has what each part measures): the device KV
 * storage's decode attention per KV format, context and attention kernel; the same under token masks
 * (h2o, snapkv); a prefill chunk's attention through the split kernels and the tensor cores. Each
 * checked against the CPU KV storage's attention over the same bytes before it is timed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kv_storage_cpu.h"
#include "backend/cuda/cuda.h"
#include "gpu_bench.h"

/* ---- 4. decode attention -------------------------------------------------------------------------------- */

typedef struct attn_ctx {
    hr_kv_storage *st;
    uint64_t q, tables, n_ctx, out, scratch;
    int copies, nq, nbq, ctx, H;
    float scale;
} attn_ctx;

static hr_status attn_rep(void *p, int rep, hr_error *e) {
    attn_ctx *c = p;
    uint64_t tab = c->tables + (uint64_t)(rep % c->copies) * (uint64_t)c->nq * (uint64_t)c->nbq * 4u;
    return hr_kv_storage_cuda_attend_dev(c->st, 0, c->q, tab, c->nbq, c->n_ctx, c->nq, c->ctx, c->H, c->scale, 0.0f,
                                         c->out, c->scratch, e);
}

typedef struct attn_shape_t {
    int H, Hkv, D, B, nq;
} attn_shape_t;

/* the attention kernels measured side by side (kv_storage_cuda.c's HEADROOM_CUDA_ATTN_KERNEL): rows
 * first, so that split, the default, is each format's and context's last row (torch_attn.py's f16
 * figure is the last one it reads per context) */
static const char *const k_attn_kernels[] = {"rows", "split"};
#define N_ATTN_KERNELS 2

/* one format at one context, each kernel on the same storage, checked then timed: ms[k] the median ms
 * of kernel k (NAN when not measured); *refused set when the storage refuses the format (the remaining
 * contexts are then skipped) */
static void bench_attn_one(gpu_bench *g, hr_kv_format fmt, const attn_shape_t *as, int ctx, bool target, double *ms,
                           bool *refused) {
    const int H = as->H, Hkv = as->Hkv, D = as->D, B = as->B, nq = as->nq, nbq = (ctx + B - 1) / B;
    hr_error e = {0};
    row r[N_ATTN_KERNELS];
    for (int k = 0; k < N_ATTN_KERNELS; k++) {
        char what[40];
        snprintf(what, sizeof what, "%s KV %s", hr_kv_format_name(fmt), k_attn_kernels[k]);
        r[k] = gb_new_row("attention", what);
        snprintf(r[k].shape, sizeof r[k].shape, "ctx %d, %d queries, H %d/%d, D %d, B %d", ctx, nq, H, Hkv, D, B);
        snprintf(r[k].unit, sizeof r[k].unit, "GB/s");
        ms[k] = NAN;
    }
    /* a reason nothing is measured: each kernel's row says it */
    char skip[96] = "";
    if (gb_out_of_time(g)) snprintf(skip, sizeof skip, "skipped: time budget (--max-seconds)");
    hr_kv_storage_params p = {.n_layers = 1, .n_kv_heads = Hkv, .head_dim = D, .block_size = B, .isa = "scalar"};
    if (!skip[0] && (kv_fmt_init(&p.k, fmt, KV_K, B, D, &e) || kv_fmt_init(&p.v, fmt, KV_V, B, D, &e))) {
        *refused = true;
        snprintf(skip, sizeof skip, "skipped: %.80s", e.msg);
    }
    /* q4, kivi2: one tail buffer each side, the pattern blocks filled through it; every pattern block is
     * whole and encoded, so attention reads codes only (no tail stage) whatever the context */
    const bool deferred = !skip[0] && (p.k.deferred || p.v.deferred);
    if (deferred) {
        p.n_stage = 1;
        kv_fmt_init(&p.stage, HR_KV_F16, KV_K, B, D, &e);
    }
    const uint64_t tok_bytes = (uint64_t)Hkv * (p.k.head_bytes + p.v.head_bytes) / (uint64_t)B;
    const uint64_t rep_bytes = (uint64_t)nq * (uint64_t)ctx * tok_bytes; /* K + V of every query's context */
    const uint64_t block_bytes = (uint64_t)Hkv * (p.k.head_bytes + p.v.head_bytes);
    size_t rot = g->o.quick ? (size_t)64 << 10 : (size_t)256 << 20;
    int copies = rep_bytes ? (int)((rot + rep_bytes - 1) / rep_bytes) : 1;
    copies = copies < 1 ? 1 : copies > 8 ? 8 : copies;
    p.n_blocks = copies * nq * nbq;
    hr_kv_storage *st = NULL, *cpu = NULL;
    if (!skip[0] && hr_kv_storage_cuda_create(g->dev, &p, &st, &e)) {
        *refused = true;
        snprintf(skip, sizeof skip, "skipped: %.80s", e.msg);
    }
    if (skip[0]) {
        for (int k = 0; k < N_ATTN_KERNELS; k++) {
            snprintf(r[k].check, sizeof r[k].check, "%s", skip);
            gb_add_row(g, &r[k], NULL);
        }
        return;
    }
    /* Pb pattern blocks of real encoded K and V (the CPU storage's writes: random floats, its bytes),
     * uploaded, then copied over the whole arena: block b holds pattern block b % Pb */
    hr_kv_storage_params pc = p;
    const int Pb = p.n_blocks < 32 ? p.n_blocks : 32;
    pc.n_blocks = Pb;
    attn_ctx c = {.st = st, .copies = copies, .nq = nq, .nbq = nbq, .ctx = ctx, .H = H};
    c.scale = 1.0f / sqrtf((float)D);
    const size_t qf = (size_t)nq * H * D;
    float *kv = malloc(sizeof(float) * 2 * Hkv * D), *q = malloc(sizeof(float) * qf);
    float *o_gpu = malloc(sizeof(float) * qf), *o_cpu = malloc(sizeof(float) * (size_t)H * D);
    int32_t *tables = malloc(sizeof(int32_t) * (size_t)copies * nq * nbq), *ctxs = malloc(sizeof(int32_t) * nq);
    int32_t *t_cpu = malloc(sizeof(int32_t) * (size_t)nbq);
    size_t n_scratch = ((size_t)ctx + B) * HR_KV_ATTN_GROUP + (size_t)D + 64;
    float *scratch = malloc(sizeof(float) * n_scratch);
    unsigned char *pat = malloc((size_t)block_bytes * Pb);
    if (!kv || !q || !o_gpu || !o_cpu || !tables || !ctxs || !t_cpu || !scratch || !pat) {
        fprintf(stderr, "gpu_bench: out of memory\n");
        exit(1);
    }
    bool ok = true;
    const char *fail_what = "CPU storage";
    if (hr_kv_storage_cpu_create(&pc, &cpu, &e)) ok = false;
    for (int b = 0; ok && b < Pb; b++) {
        if (deferred) cpu->ops->stage_reset(cpu, 0);
        for (int t = 0; t < B; t++) {
            gb_fill(g, kv, (size_t)Hkv * D, 1.5f);
            gb_fill(g, kv + (size_t)Hkv * D, (size_t)Hkv * D, 1.0f);
            cpu->ops->write(cpu, 0, b, t, deferred ? 0 : -1, kv, kv + (size_t)Hkv * D);
        }
        cpu->ops->read_block(cpu, b, pat + (size_t)block_bytes * b);
    }
    for (int k = 0; k < copies; k++)
        for (int i = 0; i < nq; i++)
            for (int j = 0; j < nbq; j++)
                tables[((size_t)k * nq + i) * nbq + j] = (int32_t)(((size_t)k * nq + i) * nbq + j);
    for (int i = 0; i < nq; i++) ctxs[i] = ctx;
    gb_fill(g, q, qf, 1.0f);
    uint64_t arena = hr_kv_storage_cuda_arena(st);
    if (ok &&
        (hr_cuda_upload(g->dev, arena, pat, (size_t)block_bytes * Pb, &e) ||
         gb_replicate(g, arena, (size_t)block_bytes * Pb, (size_t)block_bytes * p.n_blocks, &e) ||
         hr_cuda_alloc(g->dev, sizeof(float) * qf, &c.q, &e) || hr_cuda_alloc(g->dev, sizeof(float) * qf, &c.out, &e) ||
         hr_cuda_alloc(g->dev, sizeof(int32_t) * (size_t)copies * nq * nbq, &c.tables, &e) ||
         hr_cuda_alloc(g->dev, sizeof(int32_t) * nq, &c.n_ctx, &e) ||
         hr_cuda_alloc(g->dev, hr_kv_storage_cuda_attend_scratch(st, nq, H, ctx), &c.scratch, &e) ||
         hr_cuda_upload(g->dev, c.q, q, sizeof(float) * qf, &e) ||
         hr_cuda_upload(g->dev, c.tables, tables, sizeof(int32_t) * (size_t)copies * nq * nbq, &e) ||
         hr_cuda_upload(g->dev, c.n_ctx, ctxs, sizeof(int32_t) * nq, &e)))
        ok = false, fail_what = "setup";
    if (!ok)
        for (int k = 0; k < N_ATTN_KERNELS; k++) gb_dev_fail(g, &r[k], fail_what, &e);
    /* the reference: the last copy's tables, the last query, through the CPU storage's attention over the
     * same bytes (its table: the pattern blocks the GPU's blocks hold) */
    if (ok) {
        const int32_t *tg = tables + ((size_t)(copies - 1) * nq + (nq - 1)) * nbq;
        for (int j = 0; j < nbq; j++) t_cpu[j] = tg[j] % Pb;
        hr_kv_attn_query qc = {
            .table = t_cpu, .n_ctx = ctx, .tail_stage = -1, .q = q + (size_t)(nq - 1) * H * D, .out = o_cpu};
        hr_kv_attn_args a = {.n_heads = H, .scale = c.scale};
        cpu->ops->attend(cpu, 0, &qc, 1, &a, scratch);
    }
    for (int k = 0; ok && k < N_ATTN_KERNELS; k++) {
        row *rk = &r[k];
        /* the check: this kernel's output against the CPU's */
        bool kok = true;
        memset(o_gpu, 0xff, sizeof(float) * qf);
        if (hr_kv_storage_cuda_set_attn_kernel(st, k_attn_kernels[k], &e) ||
            hr_cuda_upload(g->dev, c.out, o_gpu, sizeof(float) * qf, &e) || attn_rep(&c, copies - 1, &e) ||
            hr_cuda_download(g->dev, o_gpu, c.out, sizeof(float) * qf, &e))
            kok = gb_dev_fail(g, rk, "run", &e);
        if (kok) {
            const float *last = o_gpu + (size_t)(nq - 1) * H * D; /* the last query's */
            double worst = 0;
            /* the order of additions only: relative, floor 1e-2; q4h: the CPU's int16-rounded query too
             * (test_cuda_kernels' bound); q4, kivi2: that of q times K's per-channel scales (at most 3 /
             * levels for these keys, a quarter more for the refit), test_cuda_kernels' derivation */
            if (fmt == HR_KV_F32 || fmt == HR_KV_Q8 || fmt == HR_KV_Q4H || deferred) {
                for (int i = 0; i < H * D; i++) {
                    double d = fabs((double)last[i] - o_cpu[i]) / fmax(fabs((double)o_cpu[i]), 1e-2);
                    if (!(d <= worst)) worst = d;
                }
                const int levels = fmt == HR_KV_KIVI2 ? 3 : 15;
                const double bound = deferred ? 2.0 * c.scale * D * levels * (1.25 * 3.0 / levels) / 65534.0 + 1e-3
                                     : fmt == HR_KV_Q4H ? 4e-3
                                                        : 1e-3;
                kok = gb_verdict(g, rk, worst < bound, "rel err", worst);
            } else { /* f16 (the CPU rounds softmax weights to f16 before P.V: 2^-11 absolute) and others */
                for (int i = 0; i < H * D; i++) {
                    double d = fabs((double)last[i] - o_cpu[i]);
                    if (!(d <= worst)) worst = d;
                }
                kok = gb_verdict(g, rk, worst < 4.9e-4, "abs err", worst);
            }
        }
        if (kok) {
            timing t;
            if (gb_time_reps(g, attn_rep, &c, 400.0, &t, &e))
                gb_dev_fail(g, rk, "timing", &e);
            else if (hr_kv_storage_cuda_check(st, &e))
                gb_dev_fail(g, rk, "storage", &e);
            else {
                gb_set_timing(rk, &t);
                ms[k] = t.median_ms;
                rk->value = (double)rep_bytes / (t.median_ms * 1e-3) / 1e9;
                rk->pct_copy = gb_pct(rk->value, g->copy_gbs);
                if (target) {
                    snprintf(rk->target, sizeof rk->target, ">= %.0f%% of copy", ATTN_TARGET_PCT);
                    rk->pct_target = gb_pct(rk->pct_copy, ATTN_TARGET_PCT);
                }
            }
        }
    }
    for (int k = 0; k < N_ATTN_KERNELS; k++) {
        json_t *xj = json_object();
        json_object_set_new(xj, "format", json_string(hr_kv_format_name(fmt)));
        json_object_set_new(xj, "kernel", json_string(k_attn_kernels[k]));
        json_object_set_new(xj, "ctx", json_integer(ctx));
        json_object_set_new(xj, "queries", json_integer(nq));
        json_object_set_new(xj, "n_heads", json_integer(H));
        json_object_set_new(xj, "n_kv_heads", json_integer(Hkv));
        json_object_set_new(xj, "head_dim", json_integer(D));
        json_object_set_new(xj, "block_size", json_integer(B));
        json_object_set_new(xj, "bytes_per_rep", json_integer((json_int_t)rep_bytes));
        json_object_set_new(xj, "kv_bytes_per_token", json_integer((json_int_t)tok_bytes));
        json_object_set_new(xj, "arena_copies_rotated", json_integer(copies));
        gb_add_row(g, &r[k], xj);
    }
    if (cpu) cpu->ops->destroy(cpu);
    st->ops->destroy(st);
    hr_cuda_free(g->dev, c.q);
    hr_cuda_free(g->dev, c.out);
    hr_cuda_free(g->dev, c.tables);
    hr_cuda_free(g->dev, c.n_ctx);
    hr_cuda_free(g->dev, c.scratch);
    free(kv), free(q), free(o_gpu), free(o_cpu), free(tables), free(ctxs), free(t_cpu), free(scratch), free(pat);
}

void gb_bench_attention(gpu_bench *g) {
    static const hr_kv_format fmts[] = {HR_KV_F16, HR_KV_Q8,  HR_KV_F32, HR_KV_BF16,
                                        HR_KV_FP8, HR_KV_Q4H, HR_KV_Q4,  HR_KV_KIVI2};
    static const int ctx_full[] = {1024, 8192, 32768}, ctx_quick[] = {40, 300};
    const int *ctxs = g->o.quick ? ctx_quick : ctx_full;
    const int n_ctx = g->o.quick ? 2 : 3, target_ctx = g->o.quick ? 300 : 8192;
    attn_shape_t as = g->o.quick ? (attn_shape_t){8, 2, 64, 16, 3} : (attn_shape_t){32, 8, 128, 16, 16};
    double ms[8][3][N_ATTN_KERNELS];
    bool refused[8] = {false};
    for (size_t fi = 0; fi < HR_ARRAY_LEN(fmts); fi++) {
        for (int ci = 0; ci < n_ctx; ci++) {
            for (int k = 0; k < N_ATTN_KERNELS; k++) ms[fi][ci][k] = NAN;
            if (refused[fi]) continue;
            bool target = (fmts[fi] == HR_KV_F16 || fmts[fi] == HR_KV_Q8) && ctxs[ci] == target_ctx;
            bench_attn_one(g, fmts[fi], &as, ctxs[ci], target, ms[fi][ci], &refused[fi]);
        }
    }
    /* q8's, q4h's and q4's speed over f16's (fmts[1], fmts[5] and fmts[6] over fmts[0]), per kernel */
    static const struct {
        int fi;
        double target;
    } low[] = {{1, ATTN_Q8_F16_TARGET}, {5, ATTN_4BIT_F16_TARGET}, {6, ATTN_4BIT_F16_TARGET}};
    for (size_t li = 0; li < HR_ARRAY_LEN(low); li++)
        for (int k = 0; k < N_ATTN_KERNELS; k++)
            for (int ci = 0; ci < n_ctx; ci++) {
                const char *name = hr_kv_format_name(fmts[low[li].fi]);
                char what[40];
                snprintf(what, sizeof what, "%s / f16 speed", name);
                row r = gb_new_row("attention", what);
                snprintf(r.shape, sizeof r.shape, "ctx %d, %d queries, %s kernel (f16 time / %s time)", ctxs[ci], as.nq,
                         k_attn_kernels[k], name);
                snprintf(r.unit, sizeof r.unit, "x");
                r.value = ms[0][ci][k] / ms[low[li].fi][ci][k];
                snprintf(r.target, sizeof r.target, ">= %.1fx", low[li].target);
                r.pct_target = gb_pct(r.value, low[li].target);
                if (!isfinite(r.value)) snprintf(r.check, sizeof r.check, "skipped: f16 or %s not measured", name);
                json_t *xj = json_object();
                json_object_set_new(xj, "ctx", json_integer(ctxs[ci]));
                json_object_set_new(xj, "kernel", json_string(k_attn_kernels[k]));
                gb_add_row(g, &r, xj);
            }
    /* the kernels side by side: split's time over rows' (> 1: rows is faster), per format measured and
     * context */
    for (size_t fi = 0; fi < HR_ARRAY_LEN(fmts); fi++) {
        if (refused[fi]) continue;
        for (int ci = 0; ci < n_ctx; ci++) {
            char what[40];
            snprintf(what, sizeof what, "%s split/rows", hr_kv_format_name(fmts[fi]));
            char prefix[48];
            snprintf(prefix, sizeof prefix, "ctx %d, %d queries", ctxs[ci], as.nq);
            json_t *xj = json_object();
            /* not "format": torch_attn.py reads the rows that have one as GB/s figures */
            json_object_set_new(xj, "kv_format", json_string(hr_kv_format_name(fmts[fi])));
            json_object_set_new(xj, "ctx", json_integer(ctxs[ci]));
            gb_add_ratio(g, gb_new_row("attention", what), prefix, "split", NULL, ms[fi][ci][1], "rows", NULL,
                         ms[fi][ci][0], "kernel", xj);
        }
    }
}

/* ---- 4a. decode attention under token masks (h2o, snapkv) -------------------------------------------- */

typedef struct tok_ctx {
    attn_ctx a;
    hr_kv_cuda_tokens tok;
    int mode; /* 0: no masks (full, window), 1: masks (snapkv after its window), 2: masks and scores (h2o) */
} tok_ctx;

static hr_status tok_rep(void *p, int rep, hr_error *e) {
    tok_ctx *c = p;
    hr_kv_cuda_tokens t = c->tok;
    if (c->mode < 2) t.scores = 0;
    return hr_kv_storage_cuda_attend_runs(c->a.st, 0, c->a.q, c->a.tables, c->a.nbq, 0, c->a.n_ctx, 0, 0, c->a.nq,
                                          c->a.ctx, c->a.H, c->a.scale, 0.0f, NULL, 0, 0, c->mode ? &t : NULL, c->a.out,
                                          c->a.scratch, e);
}

/* What a token-level policy costs decode attention (f16 KV, the default split kernel, the target
 * context): the same queries without masks, with every token's mask bit set (the kernels read each
 * bit; the output must equal the unmasked one bit for bit), and with the scores accumulated as h2o
 * does (hr_k_attn_score after the reduce: its q.K pass and the atomic adds; every head's weights must
 * sum to 1, so each (query, KV head) row of scores to G x 2^32 within 1e-4). Rows: each mode's time,
 * and its time over the unmasked one. */
void gb_bench_attn_tokens(gpu_bench *g) {
    const attn_shape_t as = g->o.quick ? (attn_shape_t){8, 2, 64, 16, 3} : (attn_shape_t){32, 8, 128, 16, 16};
    const int ctx = g->o.quick ? 300 : 8192, H = as.H, Hkv = as.Hkv, D = as.D, B = as.B, nq = as.nq;
    const int nbq = (ctx + B - 1) / B, MW = (B + 63) / 64, G = H / Hkv;
    static const char *const modes[] = {"f16 KV no masks", "f16 KV masks", "f16 KV masks+scores"};
    row r[3];
    for (int m = 0; m < 3; m++) {
        r[m] = gb_new_row("attention", modes[m]);
        snprintf(r[m].shape, sizeof r[m].shape, "ctx %d, %d queries, H %d/%d, D %d, B %d, split kernel", ctx, nq, H,
                 Hkv, D, B);
        snprintf(r[m].unit, sizeof r[m].unit, "ms");
    }
    hr_error e = {0};
    hr_kv_storage_params p = {
        .n_layers = 1, .n_kv_heads = Hkv, .head_dim = D, .block_size = B, .n_blocks = nq * nbq, .isa = "scalar"};
    kv_fmt_init(&p.k, HR_KV_F16, KV_K, B, D, &e);
    kv_fmt_init(&p.v, HR_KV_F16, KV_V, B, D, &e);
    tok_ctx c = {.a = {.nq = nq, .nbq = nbq, .ctx = ctx, .H = H, .copies = 1, .scale = 1.0f / sqrtf((float)D)}};
    const size_t qf = (size_t)nq * H * D, n_mask = (size_t)nq * nbq * Hkv * MW, n_sc = (size_t)nq * nbq * Hkv * B;
    float *q = malloc(sizeof(float) * qf), *o0 = malloc(sizeof(float) * qf), *o1 = malloc(sizeof(float) * qf);
    float *kv = malloc(sizeof(float) * 2 * Hkv * D);
    int32_t *tables = malloc(sizeof(int32_t) * (size_t)nq * nbq), ctxs[64], view[128];
    uint64_t *masks = malloc(sizeof(uint64_t) * n_mask), *sc = malloc(sizeof(uint64_t) * n_sc);
    if (!q || !o0 || !o1 || !kv || !tables || !masks || !sc || nq > 64) {
        fprintf(stderr, "gpu_bench: out of memory\n");
        exit(1);
    }
    bool ok = hr_kv_storage_cuda_create(g->dev, &p, &c.a.st, &e) == HR_OK;
    /* Pb blocks written (the host write: the device encoder), then copied over the rest */
    const int Pb = p.n_blocks < 32 ? p.n_blocks : 32;
    const size_t block_bytes = (size_t)Hkv * (p.k.head_bytes + p.v.head_bytes);
    for (int b = 0; ok && b < Pb; b++)
        for (int t = 0; t < B; t++) {
            gb_fill(g, kv, (size_t)2 * Hkv * D, 1.0f);
            c.a.st->ops->write(c.a.st, 0, b, t, -1, kv, kv + (size_t)Hkv * D);
        }
    if (ok && gb_replicate(g, hr_kv_storage_cuda_arena(c.a.st), block_bytes * Pb, block_bytes * p.n_blocks, &e))
        ok = false;
    for (int i = 0; i < nq * nbq; i++) tables[i] = i;
    for (int i = 0; i < nq; i++) ctxs[i] = ctx, view[2 * i] = i, view[2 * i + 1] = 1;
    for (size_t i = 0; i < n_mask; i++) masks[i] = B >= 64 ? ~0ull : (1ull << B) - 1;
    memset(sc, 0, sizeof(uint64_t) * n_sc);
    gb_fill(g, q, qf, 1.0f);
    if (ok && (hr_kv_storage_cuda_check(c.a.st, &e) || hr_cuda_alloc(g->dev, sizeof(float) * qf, &c.a.q, &e) ||
               hr_cuda_alloc(g->dev, sizeof(float) * qf, &c.a.out, &e) ||
               hr_cuda_alloc(g->dev, sizeof(int32_t) * (size_t)nq * nbq, &c.a.tables, &e) ||
               hr_cuda_alloc(g->dev, sizeof(int32_t) * nq, &c.a.n_ctx, &e) ||
               hr_cuda_alloc(g->dev, hr_kv_storage_cuda_attend_scratch(c.a.st, nq, H, ctx), &c.a.scratch, &e) ||
               hr_cuda_alloc(g->dev, sizeof(int32_t) * 2 * nq, &c.tok.view, &e) ||
               hr_cuda_alloc(g->dev, sizeof(uint64_t) * n_mask, &c.tok.masks, &e) ||
               hr_cuda_alloc(g->dev, sizeof(uint64_t) * n_sc, &c.tok.scores, &e) ||
               hr_cuda_upload(g->dev, c.a.q, q, sizeof(float) * qf, &e) ||
               hr_cuda_upload(g->dev, c.a.tables, tables, sizeof(int32_t) * (size_t)nq * nbq, &e) ||
               hr_cuda_upload(g->dev, c.a.n_ctx, ctxs, sizeof(int32_t) * nq, &e) ||
               hr_cuda_upload(g->dev, c.tok.view, view, sizeof(int32_t) * 2 * nq, &e) ||
               hr_cuda_upload(g->dev, c.tok.masks, masks, sizeof(uint64_t) * n_mask, &e)))
        ok = false;
    if (!ok)
        for (int m = 0; m < 3; m++) gb_dev_fail(g, &r[m], "setup", &e);
    double ms[3] = {NAN, NAN, NAN};
    for (int m = 0; ok && m < 3; m++) {
        /* the check: one rep (scores zeroed first) */
        c.mode = m;
        if (hr_cuda_upload(g->dev, c.tok.scores, sc, sizeof(uint64_t) * n_sc, &e) || tok_rep(&c, 0, &e) ||
            hr_cuda_download(g->dev, m ? o1 : o0, c.a.out, sizeof(float) * qf, &e) ||
            (m == 2 && hr_cuda_download(g->dev, sc, c.tok.scores, sizeof(uint64_t) * n_sc, &e))) {
            gb_dev_fail(g, &r[m], "run", &e);
            continue;
        }
        bool mok = true;
        int differ = 0; /* outputs not bit for bit the unmasked ones */
        for (size_t i = 0; m > 0 && i < qf; i++) differ += memcmp(&o0[i], &o1[i], sizeof(float)) != 0;
        if (m == 1) mok = gb_verdict(g, &r[m], differ == 0, "outputs differing", differ);
        if (m == 2) {
            double worst = 0;
            for (int i = 0; i < nq; i++)
                for (int kh = 0; kh < Hkv; kh++) {
                    double sum = 0;
                    for (int j = 0; j < nbq; j++)
                        for (int t = 0; t < B; t++) sum += (double)sc[(((size_t)i * nbq + j) * Hkv + kh) * B + t];
                    worst = fmax(worst, fabs(sum / (G * 4294967296.0) - 1.0));
                }
            memset(sc, 0, sizeof(uint64_t) * n_sc);
            mok = gb_verdict(g, &r[m], worst < 1e-4 && differ == 0, "weights' sum err", differ ? INFINITY : worst);
        }
        if (m == 0) snprintf(r[m].check, sizeof r[m].check, "(the reference)");
        timing t;
        if (mok && (gb_time_reps(g, tok_rep, &c, 400.0, &t, &e) || hr_kv_storage_cuda_check(c.a.st, &e)))
            gb_dev_fail(g, &r[m], "timing", &e);
        else if (mok) {
            gb_set_timing(&r[m], &t);
            ms[m] = r[m].value = t.median_ms;
        }
    }
    for (int m = 0; m < 3; m++) {
        json_t *xj = json_object();
        json_object_set_new(xj, "kv_format", json_string("f16"));
        json_object_set_new(xj, "ctx", json_integer(ctx));
        json_object_set_new(xj, "queries", json_integer(nq));
        json_object_set_new(xj, "token_masks", json_boolean(m >= 1));
        json_object_set_new(xj, "scores", json_boolean(m == 2));
        gb_add_row(g, &r[m], xj);
    }
    for (int m = 1; m < 3; m++) {
        char what[40];
        snprintf(what, sizeof what, "%s / none", m == 1 ? "masks" : "masks+scores");
        row x = gb_new_row("attention", what);
        snprintf(x.shape, sizeof x.shape, "ctx %d, %d queries: time under the policy over the unmasked time", ctx, nq);
        snprintf(x.unit, sizeof x.unit, "x");
        x.value = ms[m] / ms[0];
        if (!isfinite(x.value)) snprintf(x.check, sizeof x.check, "skipped: a mode not measured");
        gb_add_row(g, &x, NULL);
    }
    if (c.a.st) c.a.st->ops->destroy(c.a.st);
    uint64_t bufs[] = {c.a.q, c.a.out, c.a.tables, c.a.n_ctx, c.a.scratch, c.tok.view, c.tok.masks, c.tok.scores};
    for (size_t i = 0; i < HR_ARRAY_LEN(bufs); i++) hr_cuda_free(g->dev, bufs[i]);
    free(q), free(o0), free(o1), free(kv), free(tables), free(masks), free(sc);
}

/* ---- 4b. prefill attention: the split kernels against the tensor cores -------------------------------- */

typedef struct pfa_ctx {
    hr_kv_storage *st;
    uint64_t q, table, qrow, n_ctx, runs, out, scratch;
    const int32_t *h_runs;
    int n, n_runs, max_ctx, H;
    float scale;
} pfa_ctx;

static hr_status pfa_rep(void *p, int rep, hr_error *e) {
    pfa_ctx *c = p;
    return hr_kv_storage_cuda_attend_runs(c->st, 0, c->q, c->table, (c->max_ctx + 15) / 16, c->qrow, c->n_ctx, 0, 0,
                                          c->n, c->max_ctx, c->H, c->scale, 0.0f, c->h_runs, c->runs, c->n_runs, NULL,
                                          c->out, c->scratch, e);
}

/* One chunk of n rows of one sequence at positions ctx0 .. ctx0 + n - 1 (f16 KV, B 16), through
 * hr_kv_storage_cuda_attend_runs with the storage's prefill attention "split" then "mma" (the runs
 * the forward pass finds: hr_cuda_attn_runs), each checked against the CPU storage's attention on
 * three rows, then timed: FLOP = 4 H D (visible positions, summed over rows) (Q K^T and P V). The
 * check's bound (tests/gpu/cuda_kernels_prefill.c's derivation, Q now not on f16's grid): Q's f16
 * rounding moves a score by at most eps = scale 2^-11 |q|_1 kmax (kmax 1.5, K exact in f16), the
 * output by (e^(2 eps) - 1) max|v|; P's rounding and the CPU's f16 weights add 2^-10 max|v|. */
static void bench_prefill_attn_one(gpu_bench *g, const attn_shape_t *as, int n, int ctx0, double *ms) {
    const int H = as->H, Hkv = as->Hkv, D = as->D, B = 16, max_ctx = ctx0 + n, nb = (max_ctx + B - 1) / B;
    static const char *const kernels[] = {"split", "mma"};
    hr_error e = {0};
    row r[2];
    for (int k = 0; k < 2; k++) {
        char what[40];
        snprintf(what, sizeof what, "prefill f16 %s", kernels[k]);
        r[k] = gb_new_row("attention", what);
        snprintf(r[k].shape, sizeof r[k].shape, "%d rows at %d..%d, H %d/%d, D %d, B %d", n, ctx0, max_ctx - 1, H, Hkv,
                 D, B);
        snprintf(r[k].unit, sizeof r[k].unit, "TFLOP/s");
        ms[k] = NAN;
    }
    double flop = 0;
    for (int i = 0; i < n; i++) flop += 4.0 * H * D * (double)(ctx0 + i + 1);
    hr_kv_storage_params p = {
        .n_layers = 1, .n_kv_heads = Hkv, .head_dim = D, .block_size = B, .n_blocks = nb, .isa = "scalar"};
    kv_fmt_init(&p.k, HR_KV_F16, KV_K, B, D, &e);
    kv_fmt_init(&p.v, HR_KV_F16, KV_V, B, D, &e);
    hr_kv_storage_params pc = p;
    const int Pb = nb < 32 ? nb : 32; /* pattern blocks, block b holding pattern b % Pb */
    pc.n_blocks = Pb;
    const size_t qf = (size_t)n * H * D, bb = (size_t)Hkv * (p.k.head_bytes + p.v.head_bytes);
    float *kv = malloc(sizeof(float) * 2 * Hkv * D), *q = malloc(sizeof(float) * qf), *o = malloc(sizeof(float) * qf);
    float *o_cpu = malloc(sizeof(float) * (size_t)H * D), *scr = malloc(sizeof(float) * ((size_t)max_ctx + B) * 16);
    int32_t *tab = malloc(sizeof(int32_t) * nb), *t_cpu = malloc(sizeof(int32_t) * nb);
    int32_t *qrow = calloc((size_t)n, sizeof(int32_t)), *pos = malloc(sizeof(int32_t) * n),
            *nctx = malloc(sizeof(int32_t) * n), *runs = malloc(sizeof(int32_t) * 4 * n);
    unsigned char *pat = malloc(bb * Pb);
    if (!kv || !q || !o || !o_cpu || !scr || !tab || !t_cpu || !qrow || !pos || !nctx || !runs || !pat) {
        fprintf(stderr, "gpu_bench: out of memory\n");
        exit(1);
    }
    hr_kv_storage *st = NULL, *cpu = NULL;
    pfa_ctx c = {.n = n, .max_ctx = max_ctx, .H = H, .scale = 1.0f / sqrtf((float)D), .h_runs = runs};
    bool ok =
        hr_kv_storage_cuda_create(g->dev, &p, &st, &e) == HR_OK && hr_kv_storage_cpu_create(&pc, &cpu, &e) == HR_OK;
    for (int b = 0; ok && b < Pb; b++) {
        for (int t = 0; t < B; t++) {
            gb_fill(g, kv, (size_t)Hkv * D, 1.5f);
            gb_fill(g, kv + (size_t)Hkv * D, (size_t)Hkv * D, 1.0f);
            cpu->ops->write(cpu, 0, b, t, -1, kv, kv + (size_t)Hkv * D);
        }
        cpu->ops->read_block(cpu, b, pat + bb * b);
    }
    for (int j = 0; j < nb; j++) tab[j] = nb - 1 - j; /* the blocks backwards: the table is read */
    for (int i = 0; i < n; i++) pos[i] = ctx0 + i, nctx[i] = ctx0 + i + 1;
    c.n_runs = hr_cuda_attn_runs(qrow, pos, n, hr_cuda_prefill_tile_rows(H, Hkv), runs);
    gb_fill(g, q, qf, 1.0f);
    c.st = st;
    const uint64_t arena = ok ? hr_kv_storage_cuda_arena(st) : 0;
    if (ok &&
        (hr_cuda_upload(g->dev, arena, pat, bb * Pb, &e) || gb_replicate(g, arena, bb * Pb, bb * nb, &e) ||
         hr_cuda_alloc(g->dev, sizeof(float) * qf, &c.q, &e) || hr_cuda_alloc(g->dev, sizeof(float) * qf, &c.out, &e) ||
         hr_cuda_alloc(g->dev, sizeof(int32_t) * nb, &c.table, &e) ||
         hr_cuda_alloc(g->dev, sizeof(int32_t) * n, &c.qrow, &e) ||
         hr_cuda_alloc(g->dev, sizeof(int32_t) * n, &c.n_ctx, &e) ||
         hr_cuda_alloc(g->dev, sizeof(int32_t) * 4 * n, &c.runs, &e) ||
         hr_cuda_alloc(g->dev, hr_kv_storage_cuda_attend_scratch(st, n, H, max_ctx), &c.scratch, &e) ||
         hr_cuda_upload(g->dev, c.q, q, sizeof(float) * qf, &e) ||
         hr_cuda_upload(g->dev, c.table, tab, sizeof(int32_t) * nb, &e) ||
         hr_cuda_upload(g->dev, c.qrow, qrow, sizeof(int32_t) * n, &e) ||
         hr_cuda_upload(g->dev, c.n_ctx, nctx, sizeof(int32_t) * n, &e) ||
         hr_cuda_upload(g->dev, c.runs, runs, sizeof(int32_t) * 4 * n, &e)))
        ok = false;
    for (int k = 0; k < 2; k++) {
        if (!ok) {
            gb_dev_fail(g, &r[k], "setup", &e);
            continue;
        }
        bool kok = true;
        memset(o, 0xff, sizeof(float) * qf);
        if (hr_kv_storage_cuda_set_prefill_attn(st, kernels[k], &e) ||
            hr_cuda_upload(g->dev, c.out, o, sizeof(float) * qf, &e) || pfa_rep(&c, 0, &e) ||
            hr_cuda_download(g->dev, o, c.out, sizeof(float) * qf, &e))
            kok = gb_dev_fail(g, &r[k], "run", &e);
        double worst = 0; /* |err| / bound over three rows' heads */
        for (int ri = 0; kok && ri < 3; ri++) {
            const int i = ri == 0 ? 0 : ri == 1 ? n / 2 : n - 1;
            for (int j = 0; j < nb; j++) t_cpu[j] = tab[j] % Pb;
            hr_kv_attn_query qc = {
                .table = t_cpu, .n_ctx = nctx[i], .tail_stage = -1, .q = q + (size_t)i * H * D, .out = o_cpu};
            hr_kv_attn_args a = {.n_heads = H, .scale = c.scale};
            cpu->ops->attend(cpu, 0, &qc, 1, &a, scr);
            for (int h = 0; h < H; h++) {
                double q1 = 0;
                for (int d = 0; d < D; d++) q1 += fabs(q[((size_t)i * H + h) * D + d]);
                const double bound = expm1(2.0 * c.scale * 0x1p-11 * q1 * 1.5) + 0x1p-10 + 5e-5;
                for (int d = 0; d < D; d++) {
                    const double err = fabs((double)o[((size_t)i * H + h) * D + d] - o_cpu[h * D + d]) / bound;
                    worst = err != err ? INFINITY : fmax(worst, err);
                }
            }
        }
        if (kok) kok = gb_verdict(g, &r[k], worst <= 1.0, "err/bound", worst);
        timing t;
        if (kok && gb_time_reps(g, pfa_rep, &c, 400.0, &t, &e))
            gb_dev_fail(g, &r[k], "timing", &e);
        else if (kok) {
            gb_set_timing(&r[k], &t);
            ms[k] = t.median_ms;
            r[k].value = flop / (t.median_ms * 1e-3) / 1e12;
        }
    }
    for (int k = 0; k < 2; k++) {
        json_t *xj = json_object();
        json_object_set_new(xj, "prefill_attn", json_string(kernels[k]));
        json_object_set_new(xj, "rows", json_integer(n));
        json_object_set_new(xj, "ctx_before", json_integer(ctx0));
        json_object_set_new(xj, "n_heads", json_integer(H));
        json_object_set_new(xj, "n_kv_heads", json_integer(Hkv));
        json_object_set_new(xj, "head_dim", json_integer(D));
        json_object_set_new(xj, "flop_per_call", json_real(flop));
        gb_add_row(g, &r[k], xj);
    }
    if (cpu) cpu->ops->destroy(cpu);
    if (st) st->ops->destroy(st);
    uint64_t bufs[] = {c.q, c.out, c.table, c.qrow, c.n_ctx, c.runs, c.scratch};
    for (size_t i = 0; i < HR_ARRAY_LEN(bufs); i++) hr_cuda_free(g->dev, bufs[i]);
    free(kv), free(q), free(o), free(o_cpu), free(scr), free(tab), free(t_cpu), free(qrow), free(pos), free(nctx);
    free(runs), free(pat);
}

/* a 512-token chunk at Llama-3-8B's attention shape, at the start and after 8K positions (--quick: 24
 * rows at D 64, after 0 and 40), split then mma, and split's time over mma's (> 1: mma faster) */
void gb_bench_prefill_attn(gpu_bench *g) {
    const attn_shape_t as = g->o.quick ? (attn_shape_t){8, 2, 64, 16, 0} : (attn_shape_t){32, 8, 128, 16, 0};
    const int n = g->o.quick ? 24 : 512, ctx0s[2] = {0, g->o.quick ? 40 : 8192};
    for (int ci = 0; ci < 2; ci++) {
        double ms[2] = {NAN, NAN};
        if (gb_out_of_time(g)) {
            gb_skip_row(g, "attention", "prefill f16", "-", "time budget (--max-seconds)");
            continue;
        }
        bench_prefill_attn_one(g, &as, n, ctx0s[ci], ms);
        char prefix[48];
        snprintf(prefix, sizeof prefix, "%d rows after %d", n, ctx0s[ci]);
        json_t *xj = json_object();
        json_object_set_new(xj, "ctx_before", json_integer(ctx0s[ci]));
        gb_add_ratio(g, gb_new_row("attention", "prefill split/mma"), prefix, "split", NULL, ms[0], "mma", NULL, ms[1],
                     "kernel", xj);
    }
}

/* test_engine_matrix.c: the engine path that `headroom run` and the server take, over the product of
 * what a user can choose: every KV format (and K/V mixes) x block sizes 8/16/32/64 x prompt lengths
 * from 1 token past the context x prefill chunk sizes x 1 or several concurrent requests x roomy,
 * tight and preempting budgets (swap, recompute, auto) x paged and contiguous layouts, on the real
 * stories260K model (skipped when ../shared is absent).
 *
 * Each cell must: finish every request (or refuse it at submit when prompt + output is past the
 * context), give exactly the ids of the same prompt run alone in a roomy pool with the same format
 * and block size (batch, chunk, budget and preemption invariance), and where a reference exists
 * (f32 and f16 caches: the established implementation's ids) exactly the reference ids; afterwards
 * the pool holds no used block and passes its own check, and the swap tier holds nothing.
 *
 * The whole product is 42,240 cells (about 0.5 s each on 2 cores): CI runs a sample of
 * HR_MATRIX_CELLS (default 40, 16 in the per-ISA variants, 6 under the sanitizers) drawn with a seed that is printed
 * (HR_MATRIX_SEED repeats a run); HR_MATRIX_CELLS=all runs every cell, HR_MATRIX_SHARD=k/n a share of
 * them (bench/engine_matrix.sh runs them all, in shards). A no-progress watchdog ends a hung cell in seconds, naming
 * it. */
#include <jansson.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "engine/engine.h"
#include "greedy_vectors.h"
#include "harness.h"
#include "model/model.h"
#include "runtime/runtime_parts.h"
#include "tokenizer/tokenizer.h"

#define NGEN HR_VEC_NGEN
#define MAXV 8
#define MAXC 4 /* concurrent requests in a "several" cell */

/* ---- the watchdog: a cell that makes no progress for WATCHDOG_S seconds fails the test at once ---- */

#define WATCHDOG_S 30
static char g_cell[256]; /* the cell being run, for the watchdog's message */

static void on_alarm(int sig) {
    (void)sig;
    static const char head[] = "test_engine_matrix: watchdog: no progress for 30 s in cell: ";
    ssize_t w = write(2, head, sizeof head - 1);
    w = write(2, g_cell, strnlen(g_cell, sizeof g_cell));
    w = write(2, "\n", 1);
    (void)w;
    _exit(1);
}

/* ---- the dimensions ------------------------------------------------------------------------------ */

typedef struct kvfmt {
    hr_kv_format k, v;
} kvfmt;

static const kvfmt k_fmts[] = {
    {HR_KV_F32, HR_KV_F32}, {HR_KV_F16, HR_KV_F16},   {HR_KV_BF16, HR_KV_BF16},   {HR_KV_Q8, HR_KV_Q8},
    {HR_KV_Q4, HR_KV_Q4},   {HR_KV_FP8, HR_KV_FP8},   {HR_KV_KIVI2, HR_KV_KIVI2}, {HR_KV_Q4H, HR_KV_Q4H},
    {HR_KV_Q8, HR_KV_Q4},   {HR_KV_F16, HR_KV_KIVI2}, {HR_KV_KIVI2, HR_KV_F16},   {HR_KV_FP8, HR_KV_Q4H},
};
#define N_FMTS ((int)(sizeof k_fmts / sizeof k_fmts[0]))
static const int k_blocks[] = {8, 16, 32, 64};
/* prompt lengths, as codes resolved against the block size and the context: */
enum { L_REF = 0, L_ONE, L_BM1, L_B, L_BP1, L_2BP1, L_HALF, L_CTXM16, L_CTXM1, L_CTX, L_CTXP1, N_LENS };
static const char *k_len_names[] = {"ref", "1", "B-1", "B", "B+1", "2B+1", "ctx/2", "ctx-16", "ctx-1", "ctx", "ctx+1"};
static const int k_chunks[] = {1, 7, 32, 512};
enum { BUD_ROOMY = 0, BUD_TIGHT, BUD_SWAP, BUD_RECOMPUTE, BUD_AUTO, N_BUDGETS };
static const char *k_bud_names[] = {"roomy", "tight", "preempt-swap", "preempt-recompute", "preempt-auto"};

typedef struct cell {
    int fmt, block, len, chunk, conc, budget, layout;
} cell;

#define N_CELLS ((long)N_FMTS * 4 * N_LENS * 4 * 2 * N_BUDGETS * 2)

static cell cell_at(long i) {
    cell c;
    c.layout = (int)(i % 2), i /= 2;
    c.budget = (int)(i % N_BUDGETS), i /= N_BUDGETS;
    c.conc = (int)(i % 2) ? MAXC : 1, i /= 2;
    c.chunk = k_chunks[i % 4], i /= 4;
    c.len = (int)(i % N_LENS), i /= N_LENS;
    c.block = k_blocks[i % 4], i /= 4;
    c.fmt = (int)i;
    return c;
}

static void cell_name(const cell *c, char *buf, size_t n) {
    snprintf(buf, n, "K %s / V %s, block %d, prompt %s, chunk %d, %d request%s, %s budget, %s",
             hr_kv_format_name(k_fmts[c->fmt].k), hr_kv_format_name(k_fmts[c->fmt].v), c->block, k_len_names[c->len],
             c->chunk, c->conc, c->conc > 1 ? "s" : "", k_bud_names[c->budget], c->layout ? "contiguous" : "paged");
}

/* ---- one engine ---------------------------------------------------------------------------------- */

typedef struct env {
    const hr_model *m;
    const int32_t *corpus; /* token ids of the evaluation text (prompts of any length are cut from it) */
    int n_corpus;
    const vec *v;
    int nv;
    int n_ctx;
} env;

typedef struct setup {
    kvfmt f;
    int block, n_blocks, max_seqs, max_batch, chunk, swap_blocks;
    hr_admission admission;
    hr_preempt_mode preempt;
    hr_kv_layout layout;
} setup;

typedef struct engine_rig {
    hr_runtime *rt; /* when opened through the runtime: owns the rest */
    hr_kv_pool *kv;
    hr_kv_swap *swap;
    hr_model_ctx *ctx;
    hr_engine *e;
} engine_rig;

/* The engine as `headroom run` and the server open it (src/runtime), with an exact pool size. */
static bool rig_open(const env *en, const setup *s, engine_rig *r, hr_error *err) {
    memset(r, 0, sizeof *r);
    hr_runtime_params p = hr_runtime_default_params();
    p.model = en->m;
    p.n_ctx = en->n_ctx;
    p.kv_blocks = s->n_blocks;
    p.k_format = (hr_rt_kv_format)s->f.k;
    p.v_format = (hr_rt_kv_format)s->f.v;
    p.block_size = s->block;
    p.max_batch_tokens = s->max_batch;
    p.prefill_chunk = s->chunk;
    p.max_running = s->max_seqs;
    p.admission = (hr_rt_admission)s->admission;
    p.preempt = (hr_rt_preempt)s->preempt;
    p.layout = (hr_rt_layout)s->layout;
    p.n_threads = 2;
    p.isa = hr_test_isa();
    p.raw_ids = true;
    if (s->swap_blocks > 0) {
        const hr_hparams *hp = hr_model_hparams(en->m);
        hr_kv_config kc = {.n_layers = hp->n_layer,
                           .n_kv_heads = hp->n_head_kv,
                           .head_dim = hp->head_dim,
                           .block_size = s->block,
                           .k_format = s->f.k,
                           .v_format = s->f.v,
                           .max_seqs = s->max_seqs};
        /* swap_blocks block slots and one tail buffer (a sequence swapped out carries its partial block) */
        p.swap_space = hr_kv_block_bytes(&kc) * (uint64_t)s->swap_blocks + hr_kv_stage_block_bytes(&kc);
    }
    if (hr_runtime_open(&p, &r->rt, NULL, err)) return false;
    r->kv = hr_runtime_kv(r->rt);
    r->swap = hr_runtime_swap(r->rt);
    r->ctx = hr_runtime_ctx(r->rt);
    r->e = hr_runtime_engine(r->rt);
    return true;
}

static void rig_close(engine_rig *r) {
    if (r->rt) {
        hr_runtime_close(r->rt);
        return;
    }
    hr_engine_destroy(r->e); /* the hand-built rigs of the engine-level cases below */
    hr_kv_swap_destroy(r->swap);
    hr_model_ctx_destroy(r->ctx);
    hr_kv_pool_destroy(r->kv);
}

typedef struct job {
    const int32_t *prompt;
    int n_prompt, max_tokens;
    hr_status submit; /* what submit answered */
    int32_t out[NGEN];
    int n_out;
    hr_request_stats st;
} job;

/* Submits every job, steps until all are final (kicking the watchdog at each step), collects. */
static void run_jobs(engine_rig *r, job *q, int n) {
    hr_request *h[MAXV];
    for (int i = 0; i < n; i++) {
        hr_request_params p = {
            .prompt = q[i].prompt, .n_prompt = q[i].n_prompt, .max_tokens = q[i].max_tokens, .ignore_eos = true};
        p.sampling = hr_sampler_default_params();
        p.sampling.temperature = 0;
        hr_error err = {0};
        h[i] = NULL;
        q[i].submit = hr_engine_submit(r->e, &p, &h[i], &err);
    }
    int left = 1;
    for (int steps = 0; left > 0; steps++) {
        alarm(WATCHDOG_S);
        hr_error err = {0};
        if (hr_engine_step(r->e, &left, &err) != HR_OK || steps > 100000) {
            CHECKF(0, "stepping: %s (%s)", err.msg, g_cell);
            break;
        }
    }
    alarm(0);
    for (int i = 0; i < n; i++) {
        q[i].n_out = 0;
        if (!h[i]) continue;
        int nt = 0;
        const int32_t *o = hr_request_output(h[i], &nt);
        q[i].n_out = HR_MIN(nt, NGEN);
        memcpy(q[i].out, o, sizeof(int32_t) * (size_t)q[i].n_out);
        hr_request_get_stats(h[i], &q[i].st);
        hr_request_release(h[i]);
    }
}

/* The pool holds no used block and passes its own check; the swap tier holds nothing. */
static bool rig_clean(const engine_rig *r) {
    hr_kv_pool_ledger l;
    hr_kv_pool_get_ledger(r->kv, &l);
    hr_error err = {0};
    bool ok = hr_kv_pool_check(r->kv, &err) == HR_OK;
    if (!ok) fprintf(stderr, "pool check: %s\n", err.msg);
    ok = ok && l.blocks_used == 0 && l.blocks_free + l.blocks_cached == l.blocks_total &&
         hr_kv_pool_n_stage_free(r->kv) == hr_kv_pool_n_stage(r->kv);
    if (r->swap) {
        hr_kv_swap_ledger sl;
        hr_kv_swap_get_ledger(r->swap, &sl);
        ok = ok && sl.slots_used == 0 && sl.bytes_used == 0;
    }
    return ok;
}

/* ---- the prompts of a cell ----------------------------------------------------------------------- */

static int resolve_len(const cell *c, int n_ctx) {
    int B = c->block;
    switch (c->len) {
    case L_ONE: return 1;
    case L_BM1: return B - 1;
    case L_B: return B;
    case L_BP1: return B + 1;
    case L_2BP1: return 2 * B + 1;
    case L_HALF: return n_ctx / 2;
    case L_CTXM16: return n_ctx - 16;
    case L_CTXM1: return n_ctx - 1;
    case L_CTX: return n_ctx;
    case L_CTXP1: return n_ctx + 1;
    default: return 0;
    }
}

/* Fills the cell's jobs: reference prompts, or prompts of the cell's length cut from the corpus at
 * different offsets (each starting with BOS). */
static int make_jobs(const env *en, const cell *c, job *q, int32_t (*buf)[600]) {
    int n = c->conc;
    for (int i = 0; i < n; i++) {
        memset(&q[i], 0, sizeof q[i]);
        if (c->len == L_REF) {
            const vec *v = &en->v[i % en->nv];
            q[i].prompt = v->ptoks;
            q[i].n_prompt = v->np;
            q[i].max_tokens = NGEN;
            continue;
        }
        int L = resolve_len(c, en->n_ctx);
        buf[i][0] = 1;
        for (int t = 1; t < L; t++) buf[i][t] = en->corpus[(i * 97 + t) % en->n_corpus];
        q[i].prompt = buf[i];
        q[i].n_prompt = L;
        q[i].max_tokens = HR_MAX(1, HR_MIN(16, en->n_ctx - L));
    }
    return n;
}

/* ---- the solo oracle ----------------------------------------------------------------------------- */

/* Output of one prompt alone in a roomy paged pool, whole prompt in one chunk, same format and block
 * size. Cached per (format, block, prompt) for the run. */
typedef struct solo {
    int fmt, block, n_prompt;
    const int32_t *prompt; /* identity: prompts come from fixed buffers below */
    uint64_t key;
    int32_t out[NGEN];
    int n_out;
} solo;
#define MAX_SOLO 4096
static solo g_solo[MAX_SOLO];
static int g_n_solo;

static uint64_t prompt_key(const int32_t *p, int n) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)n;
    for (int i = 0; i < n; i++) h = (h ^ (uint64_t)(uint32_t)p[i]) * 1099511628211ull;
    return h;
}

static const solo *solo_run(const env *en, int fmt, int block, const job *j) {
    uint64_t key = prompt_key(j->prompt, j->n_prompt);
    for (int i = 0; i < g_n_solo; i++)
        if (g_solo[i].fmt == fmt && g_solo[i].block == block && g_solo[i].key == key &&
            g_solo[i].n_prompt == j->n_prompt)
            return &g_solo[i];
    if (g_n_solo == MAX_SOLO) g_n_solo = 0; /* forget the oldest: cells revisit few prompts */
    solo *s = &g_solo[g_n_solo++];
    s->fmt = fmt, s->block = block, s->key = key, s->n_prompt = j->n_prompt, s->n_out = -1;
    setup su = {.f = k_fmts[fmt],
                .block = block,
                .n_blocks = (en->n_ctx + block - 1) / block + 2,
                .max_seqs = 1,
                .max_batch = 1024,
                .admission = HR_ADMIT_RESERVE};
    engine_rig r;
    hr_error err = {0};
    if (!rig_open(en, &su, &r, &err)) {
        CHECKF(0, "solo rig: %s", err.msg);
        rig_close(&r);
        return s;
    }
    job q = *j;
    run_jobs(&r, &q, 1);
    if (q.submit == HR_OK && q.st.state == HR_REQ_COMPLETED) {
        memcpy(s->out, q.out, sizeof(int32_t) * (size_t)q.n_out);
        s->n_out = q.n_out;
    }
    rig_close(&r);
    return s;
}

/* ---- one cell ------------------------------------------------------------------------------------ */

static int blocks_for(int tokens, int B) { return (tokens + B - 1) / B; }

static void run_cell(const env *en, const cell *c) {
    cell_name(c, g_cell, sizeof g_cell);
    job q[MAXC];
    static int32_t buf[MAXC][600];
    int n = make_jobs(en, c, q, buf);
    int B = c->block, life_max = 0, life_sum = 0;
    for (int i = 0; i < n; i++) {
        int life = blocks_for(HR_MIN(q[i].n_prompt + q[i].max_tokens, en->n_ctx), B);
        life_max = HR_MAX(life_max, life);
        life_sum += life;
    }
    setup s = {.f = k_fmts[c->fmt],
               .block = B,
               .max_seqs = n,
               .max_batch = 512,
               .chunk = c->chunk,
               .admission = HR_ADMIT_ADAPTIVE,
               .layout = c->layout ? HR_LAYOUT_CONTIGUOUS : HR_LAYOUT_PAGED};
    int ctx_blocks = blocks_for(en->n_ctx, B);
    switch (c->budget) {
    case BUD_ROOMY: s.n_blocks = n * (ctx_blocks + 1); break;
    case BUD_TIGHT: /* every request's whole life fits, and nothing more: reserve never preempts */
        s.n_blocks = c->layout ? n * ctx_blocks : life_sum;
        s.admission = HR_ADMIT_RESERVE;
        break;
    default: /* one request's life and a little: several requests must take turns or be preempted */
        s.n_blocks = c->layout ? ctx_blocks : life_max + (n > 1 ? life_max / 2 + 1 : 0);
        s.admission = HR_ADMIT_OPTIMISTIC;
        s.preempt = c->budget == BUD_SWAP   ? HR_PREEMPT_SWAP
                    : c->budget == BUD_AUTO ? HR_PREEMPT_AUTO
                                            : HR_PREEMPT_RECOMPUTE;
        s.swap_blocks = c->budget == BUD_RECOMPUTE ? 0 : life_max + 2; /* fills with two sequences out */
        break;
    }
    engine_rig r;
    hr_error err = {0};
    if (!rig_open(en, &s, &r, &err)) {
        CHECKF(0, "%s: rig: %s", g_cell, err.msg);
        rig_close(&r);
        return;
    }
    run_jobs(&r, q, n);
    for (int i = 0; i < n; i++) {
        bool past_ctx = q[i].n_prompt + q[i].max_tokens > en->n_ctx;
        if (past_ctx) { /* refused at submit, with HR_ERR_RANGE */
            CHECKF(q[i].submit == HR_ERR_RANGE, "%s: request %d (prompt %d) past the context: submit %d", g_cell, i,
                   q[i].n_prompt, (int)q[i].submit);
            continue;
        }
        CHECKF(q[i].submit == HR_OK && q[i].st.state == HR_REQ_COMPLETED && q[i].n_out == q[i].max_tokens,
               "%s: request %d: submit %d, state %s, %d of %d tokens: %s", g_cell, i, (int)q[i].submit,
               hr_request_state_name(q[i].st.state), q[i].n_out, q[i].max_tokens, q[i].st.error);
        const solo *o = solo_run(en, c->fmt, B, &q[i]);
        cell_name(c, g_cell, sizeof g_cell); /* solo_run used the watchdog */
        CHECKF(o->n_out == q[i].n_out && memcmp(o->out, q[i].out, sizeof(int32_t) * (size_t)q[i].n_out) == 0,
               "%s: request %d differs from the same prompt alone", g_cell, i);
        hr_kv_format kf = k_fmts[c->fmt].k, vf = k_fmts[c->fmt].v;
        bool exact = (kf == HR_KV_F32 || kf == HR_KV_F16) && kf == vf;
        if (c->len == L_REF && exact) {
            const vec *v = &en->v[i % en->nv];
            CHECKF(q[i].n_out == NGEN && memcmp(q[i].out, v->ctoks, sizeof(int32_t) * NGEN) == 0,
                   "%s: request %d differs from the reference ids", g_cell, i);
        }
    }
    CHECKF(rig_clean(&r), "%s: the pool or swap tier did not return to its starting state", g_cell);
    rig_close(&r);
}

/* ---- preemption x formats ------------------------------------------------------------------------ */

/* Six requests in a pool that holds about two, a swap tier that holds one: with swap preemption both
 * modes must actually run (the tier fills, so later victims fall back to recompute), and every
 * output must equal the prompt alone; afterwards pool and tier are empty. */
static void test_preempt_formats(const env *en) {
    for (int f = 0; f < N_FMTS; f++) {
        for (int mode = 0; mode < 3; mode++) {
            const int B = 16, n = 6;
            job q[6];
            static int32_t buf[6][600];
            for (int i = 0; i < n; i++) {
                memset(&q[i], 0, sizeof q[i]);
                buf[i][0] = 1;
                for (int t = 1; t < 40 + 7 * i; t++) buf[i][t] = en->corpus[(i * 131 + t) % en->n_corpus];
                q[i].prompt = buf[i], q[i].n_prompt = 40 + 7 * i, q[i].max_tokens = NGEN;
            }
            int life = blocks_for(40 + 7 * 5 + NGEN, B);
            hr_preempt_mode pm = mode == 0 ? HR_PREEMPT_SWAP : mode == 1 ? HR_PREEMPT_RECOMPUTE : HR_PREEMPT_AUTO;
            setup s = {.f = k_fmts[f],
                       .block = B,
                       .n_blocks = 2 * life,
                       .max_seqs = n,
                       .max_batch = 512,
                       .admission = HR_ADMIT_OPTIMISTIC,
                       .preempt = pm,
                       .swap_blocks = pm == HR_PREEMPT_RECOMPUTE ? 0 : life + 1};
            snprintf(g_cell, sizeof g_cell, "preemption %s, K %s / V %s", hr_preempt_mode_name(pm),
                     hr_kv_format_name(k_fmts[f].k), hr_kv_format_name(k_fmts[f].v));
            engine_rig r;
            hr_error err = {0};
            if (!rig_open(en, &s, &r, &err)) {
                CHECKF(0, "%s: %s", g_cell, err.msg);
                rig_close(&r);
                continue;
            }
            run_jobs(&r, q, n);
            hr_engine_stats st;
            hr_engine_get_stats(r.e, &st);
            char name[256];
            snprintf(name, sizeof name, "%s", g_cell);
            for (int i = 0; i < n; i++) {
                CHECKF(q[i].submit == HR_OK && q[i].st.state == HR_REQ_COMPLETED, "%s: request %d %s: %s", name, i,
                       hr_request_state_name(q[i].st.state), q[i].st.error);
                const solo *o = solo_run(en, f, B, &q[i]);
                CHECKF(o->n_out == q[i].n_out && memcmp(o->out, q[i].out, sizeof(int32_t) * (size_t)q[i].n_out) == 0,
                       "%s: request %d differs from the same prompt alone", name, i);
            }
            if (pm == HR_PREEMPT_SWAP)
                CHECKF(st.preempt_swap > 0 && st.preempt_recompute > 0,
                       "%s: swap %llu and recompute %llu preemptions: both must run", name,
                       (unsigned long long)st.preempt_swap, (unsigned long long)st.preempt_recompute);
            else if (pm == HR_PREEMPT_RECOMPUTE)
                CHECKF(st.preempt_recompute > 0 && st.preempt_swap == 0, "%s: recompute %llu, swap %llu", name,
                       (unsigned long long)st.preempt_recompute, (unsigned long long)st.preempt_swap);
            else
                CHECKF(st.preemptions > 0, "%s: no preemption happened", name);
            CHECKF(rig_clean(&r), "%s: the pool or swap tier did not return to its starting state", name);
            rig_close(&r);
        }
    }
}

/* ---- no progress possible: the engine fails the request instead of spinning --------------------- */

/* A q4 pool of 64 blocks with exactly stage_blocks tail buffers, its forward context and an engine of
 * max_running sequences, built by hand (the runtime sizes tail buffers itself: these cases test the
 * engine's own checks). Returns the first failure, or what hr_engine_create answered. */
static hr_status hand_rig(const env *en, int max_seqs, int stage_blocks, int max_running, engine_rig *r,
                          hr_error *err) {
    memset(r, 0, sizeof *r);
    const hr_hparams *hp = hr_model_hparams(en->m);
    hr_kv_config kc = {.n_layers = hp->n_layer,
                       .n_kv_heads = hp->n_head_kv,
                       .head_dim = hp->head_dim,
                       .block_size = 16,
                       .k_format = HR_KV_Q4,
                       .v_format = HR_KV_Q4,
                       .max_seqs = max_seqs,
                       .stage_blocks = stage_blocks};
    kc.budget_bytes = hr_kv_fixed_bytes(&kc) + hr_kv_block_bytes(&kc) * 64;
    hr_model_ctx_params mp = {
        .n_threads = 2, .max_batch_tokens = 512, .max_ctx = en->n_ctx, .force_isa = hr_test_isa()};
    hr_status st = hr_kv_pool_create(&kc, &r->kv, err);
    if (st == HR_OK) st = hr_model_ctx_create(en->m, r->kv, &mp, &r->ctx, err);
    if (st != HR_OK) return st;
    hr_engine_params ep = {.model = en->m, .ctx = r->ctx, .kv = r->kv, .n_ctx = en->n_ctx, .max_running = max_running};
    return hr_engine_create(&ep, &r->e, err);
}

/* A pool with exactly one tail buffer more than the running sequences is the least the engine accepts;
 * one less is refused at create with the reason. */
static void test_stage_floor(const env *en) {
    engine_rig r;
    hr_error err = {0};
    CHECK(hand_rig(en, 4, 4, 4, &r, &err) == HR_ERR_INVALID_ARG);
    CHECKF(strstr(err.msg, "tail buffers") != NULL, "%s", err.msg);
    rig_close(&r);
    /* five buffers for four sequences: a long prompt goes through a block at a time, and all finish */
    CHECK(hand_rig(en, 4, 5, 4, &r, &err) == HR_OK);
    job q[4];
    static int32_t buf[4][600];
    for (int i = 0; i < 4; i++) {
        memset(&q[i], 0, sizeof q[i]);
        buf[i][0] = 1;
        for (int t = 1; t < 200; t++) buf[i][t] = en->corpus[(i * 53 + t) % en->n_corpus];
        q[i].prompt = buf[i], q[i].n_prompt = 200, q[i].max_tokens = 8;
    }
    snprintf(g_cell, sizeof g_cell, "q4 with 5 tail buffers for 4 sequences");
    run_jobs(&r, q, 4);
    for (int i = 0; i < 4; i++) {
        CHECKF(q[i].st.state == HR_REQ_COMPLETED, "request %d: %s", i, q[i].st.error);
        const solo *o = solo_run(en, 4 /* q4 */, 16, &q[i]);
        CHECK(o->n_out == q[i].n_out && memcmp(o->out, q[i].out, sizeof(int32_t) * (size_t)q[i].n_out) == 0);
    }
    CHECK(rig_clean(&r));
    rig_close(&r);
}

/* A request whose claim cannot be placed although submit accepted it (a contiguous slot asks for the
 * whole context; here the pool was made to hold one slot and two requests arrive): the second waits
 * while the first runs, then runs. And a request that can never be placed fails with the reason
 * within two steps instead of spinning. */
static void test_no_progress(const env *en) {
    setup s = {.f = {HR_KV_F16, HR_KV_F16},
               .block = 16,
               .n_blocks = blocks_for(en->n_ctx, 16),
               .max_seqs = 2,
               .max_batch = 512,
               .layout = HR_LAYOUT_CONTIGUOUS};
    engine_rig r;
    hr_error err = {0};
    CHECK(rig_open(en, &s, &r, &err));
    job q[2];
    for (int i = 0; i < 2; i++) {
        memset(&q[i], 0, sizeof q[i]);
        q[i].prompt = en->v[i].ptoks, q[i].n_prompt = en->v[i].np, q[i].max_tokens = NGEN;
    }
    snprintf(g_cell, sizeof g_cell, "two contiguous slots in a pool of one");
    run_jobs(&r, q, 2);
    for (int i = 0; i < 2; i++) {
        CHECKF(q[i].st.state == HR_REQ_COMPLETED, "request %d: %s", i, q[i].st.error);
        CHECK(memcmp(q[i].out, en->v[i].ctoks, sizeof(int32_t) * NGEN) == 0);
    }
    CHECK(rig_clean(&r));
    rig_close(&r);

    /* Forced: every tail buffer of a q4 pool is held by a sequence outside the engine, so no block
     * can be written. The request must fail within two steps, with the reason, not spin. */
    CHECK(hand_rig(en, 2, 2, 1, &r, &err) == HR_OK);
    hr_kv_seq hog;
    CHECK(hr_kv_seq_create(r.kv, &hog, &err) == HR_OK);
    CHECK(hr_kv_seq_reserve(r.kv, hog, 2 * 16, &err) == HR_OK); /* takes both tail buffers */
    CHECK(hr_kv_pool_n_stage_free(r.kv) == 0);
    hr_request_params p = {.prompt = en->v[0].ptoks, .n_prompt = en->v[0].np, .max_tokens = 8};
    p.sampling = hr_sampler_default_params();
    hr_request *h = NULL;
    CHECK(hr_engine_submit(r.e, &p, &h, &err) == HR_OK);
    int left = 1, steps = 0;
    while (left > 0 && steps < 10) {
        CHECK(hr_engine_step(r.e, &left, &err) == HR_OK);
        steps++;
    }
    hr_request_stats st;
    hr_request_get_stats(h, &st);
    CHECKF(steps <= 3 && st.state == HR_REQ_FAILED, "%d steps, state %s", steps, hr_request_state_name(st.state));
    CHECKF(strstr(st.error, "no progress") && strstr(st.error, "tail buffers"), "%s", st.error);
    hr_request_release(h);
    /* with the buffers back, the same request runs */
    hr_kv_seq_free(r.kv, hog);
    CHECK(hr_engine_submit(r.e, &p, &h, &err) == HR_OK);
    CHECK(hr_engine_run_until_idle(r.e, &err) == HR_OK);
    hr_request_get_stats(h, &st);
    CHECKF(st.state == HR_REQ_COMPLETED, "%s", st.error);
    hr_request_release(h);
    CHECK(rig_clean(&r));
    rig_close(&r);
}

/* ---- main ---------------------------------------------------------------------------------------- */

int main(void) {
    const char *path = hr_test_shared_path("models/stories260K.gguf");
    const char *vpath = hr_test_shared_path("vectors/stories260K-greedy.jsonl");
    const char *cpath = hr_test_shared_path("corpus/stories260K-samples.txt");
    if (!path || !vpath || !cpath) HR_SKIP("../shared (stories260K, its vectors and corpus) is absent");
    signal(SIGALRM, on_alarm);
    hr_error err = {0};
    hr_model *m = NULL;
    hr_tokenizer *tok = NULL;
    if (hr_model_load(path, &m, &err) || hr_tokenizer_load(hr_model_gguf(m), &tok, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    static vec v[MAXV];
    int nv = load_vectors(vpath, v, MAXV);
    size_t n_text = 0;
    char *text = hr_test_slurp(cpath, &n_text);
    int32_t *corpus = NULL;
    size_t n_corpus = 0;
    hr_tokenize_opts to = {0};
    if (!text || hr_tokenizer_encode_alloc(tok, text, n_text, &to, &corpus, &n_corpus, &err) != HR_OK ||
        n_corpus < 600) {
        fprintf(stderr, "corpus: %s (%zu tokens)\n", err.msg, n_corpus);
        return 1;
    }
    env en = {.m = m,
              .corpus = corpus,
              .n_corpus = (int)n_corpus,
              .v = v,
              .nv = nv,
              .n_ctx = hr_model_hparams(m)->n_ctx_train};
    CHECK(nv == MAXV);

    test_stage_floor(&en);
    test_no_progress(&en);
    test_preempt_formats(&en);

    const char *cells_env = getenv("HR_MATRIX_CELLS");
    const char *seed_env = getenv("HR_MATRIX_SEED");
    bool all = cells_env && !strcmp(cells_env, "all");
#if defined(__SANITIZE_ADDRESS__)
    const long default_cells = 6; /* about ten times slower under the sanitizers */
#else
    /* the per-ISA variants (HEADROOM_ISA set; scalar runs ~2.5x slower) take a smaller sample: the
     * default run carries the main one */
    const long default_cells = hr_test_isa() ? 16 : 40;
#endif
    long n_cells = all ? N_CELLS : cells_env && atol(cells_env) > 0 ? atol(cells_env) : default_cells;
    /* HR_MATRIX_SHARD=k/n (with HR_MATRIX_CELLS=all): only the cells whose index is k modulo n */
    long shard_k = 0, shard_n = 1;
    const char *shard_env = getenv("HR_MATRIX_SHARD");
    if (shard_env && sscanf(shard_env, "%ld/%ld", &shard_k, &shard_n) != 2) shard_k = 0, shard_n = 1;
    if (shard_n < 1 || shard_k < 0 || shard_k >= shard_n) shard_k = 0, shard_n = 1;
    uint64_t seed = seed_env && seed_env[0] ? strtoull(seed_env, NULL, 10) : (uint64_t)hr_time_now() * 1000003u;
    printf("engine matrix: %ld of %ld cells, HR_MATRIX_SEED=%llu, kernels %s\n", n_cells, N_CELLS,
           (unsigned long long)seed, hr_test_isa() ? hr_test_isa() : "default");
    fflush(stdout);
    hr_rng rng;
    hr_rng_seed(&rng, seed);
    int failed0 = hr_test_failed;
    for (long i = 0; i < n_cells; i++) {
        long idx = all ? i : (long)(hr_rng_next(&rng) % (uint64_t)N_CELLS);
        if (all && idx % shard_n != shard_k) continue;
        cell c = cell_at(idx);
        int before = hr_test_failed;
        run_cell(&en, &c);
        if (hr_test_failed != before) fprintf(stderr, "  cell %ld failed: %s\n", idx, g_cell);
        if (all && i % 500 == 499) fprintf(stderr, "  %ld cells done\n", i + 1);
    }
    if (hr_test_failed != failed0) fprintf(stderr, "rerun with HR_MATRIX_SEED=%llu\n", (unsigned long long)seed);
    free(text);
    free(corpus);
    hr_tokenizer_destroy(tok);
    hr_model_destroy(m);
    return hr_test_finish();
}

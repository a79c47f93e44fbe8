/* test_engine_rig.h: what the engine tests share: a model + KV pool + forward context + engine built
 * from a few numbers, and a helper that runs a set of prompts to the end and collects every output.
 * Header-only (static functions) so each test stays one translation unit. */
#ifndef HR_TESTS_ENGINE_RIG_H
#define HR_TESTS_ENGINE_RIG_H

#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "engine/engine.h"
#include "harness.h"
#include "model/synth.h"

#define RIG_MAX_OUT 512

typedef struct rig {
    hr_kv_pool *kv;
    hr_kv_swap *swap;
    hr_model_ctx *ctx;
    hr_engine *e;
} rig;

typedef struct rig_opts {
    int n_blocks;      /* KV pool size in blocks of 16 tokens */
    int max_seqs;      /* sequence slots (= max_running) */
    int max_batch;     /* max_batch_tokens */
    int prefill_chunk; /* 0: max_batch */
    int n_ctx;
    int max_queue;
    hr_admission admission;
    hr_kv_layout layout;
    hr_kv_format fmt;
    const hr_tokenizer *tok;
    int swap_blocks; /* > 0: a swap tier of this many blocks */
    int ctx_max;     /* > 0: the forward context's max_ctx (below n_ctx: forward failures on demand) */
    hr_preempt_mode preempt;
} rig_opts;

/* A synthetic model (f32 weights) of a named shape, built in memory; n_ctx > 0 overrides its context.
 * *mem holds the file the model reads: free it after hr_model_destroy. Exits on failure. */
static inline hr_model *rig_build_model(const char *shape_name, uint64_t seed, int n_ctx, void **mem) {
    hr_error err = {0};
    hr_synth_shape shape;
    hr_model *m = NULL;
    if (hr_synth_shape_by_name(shape_name, &shape, &err) == HR_OK && n_ctx > 0) shape.n_ctx = n_ctx;
    if (err.msg[0] || hr_synth_model(&shape, HR_DTYPE_F32, seed, &m, mem, &err)) {
        fprintf(stderr, "model: %s\n", err.msg);
        exit(1);
    }
    return m;
}

static inline rig rig_open(const hr_model *m, const rig_opts *o) {
    rig r = {0};
    const hr_hparams *hp = hr_model_hparams(m);
    hr_kv_config kc = {.n_layers = hp->n_layer,
                       .n_kv_heads = hp->n_head_kv,
                       .head_dim = hp->head_dim,
                       .block_size = 16,
                       .k_format = o->fmt,
                       .v_format = o->fmt,
                       .max_seqs = o->max_seqs};
    kc.budget_bytes = hr_kv_fixed_bytes(&kc) + hr_kv_block_bytes(&kc) * (uint64_t)o->n_blocks;
    hr_error err = {0};
    int n_ctx = o->n_ctx ? o->n_ctx : hp->n_ctx_train;
    hr_model_ctx_params mp = {
        .n_threads = 2, .max_batch_tokens = o->max_batch, .max_ctx = o->ctx_max ? o->ctx_max : n_ctx};
    hr_engine_params ep = {.model = m,
                           .tok = o->tok,
                           .n_ctx = n_ctx,
                           .max_batch_tokens = o->max_batch,
                           .max_running = o->max_seqs,
                           .max_queue = o->max_queue,
                           .prefill_chunk = o->prefill_chunk,
                           .admission = o->admission,
                           .preempt = o->preempt,
                           .layout = o->layout};
    if (hr_kv_pool_create(&kc, &r.kv, &err) || hr_model_ctx_create(m, r.kv, &mp, &r.ctx, &err)) {
        fprintf(stderr, "rig: %s\n", err.msg);
        exit(1);
    }
    if (o->swap_blocks > 0) {
        hr_kv_swap_config sc = {.budget_bytes = hr_kv_block_bytes(&kc) * (uint64_t)o->swap_blocks};
        if (hr_kv_swap_create(r.kv, &sc, &r.swap, &err)) {
            fprintf(stderr, "rig swap: %s\n", err.msg);
            exit(1);
        }
    }
    ep.ctx = r.ctx;
    ep.kv = r.kv;
    ep.swap = r.swap;
    if (hr_engine_create(&ep, &r.e, &err)) {
        fprintf(stderr, "rig engine: %s\n", err.msg);
        exit(1);
    }
    return r;
}

static inline void rig_close(rig *r) {
    hr_engine_destroy(r->e);
    hr_kv_swap_destroy(r->swap);
    hr_model_ctx_destroy(r->ctx);
    hr_kv_pool_destroy(r->kv);
}

/* The pool holds no used block and passes its own check: every block is free or cached. */
static inline bool rig_pool_clean(const rig *r) {
    hr_kv_pool_ledger l;
    hr_kv_pool_get_ledger(r->kv, &l);
    hr_error err = {0};
    bool ok = hr_kv_pool_check(r->kv, &err) == HR_OK;
    if (!ok) fprintf(stderr, "pool check: %s\n", err.msg);
    return ok && l.blocks_used == 0 && l.blocks_free + l.blocks_cached == l.blocks_total;
}

typedef struct rig_req {
    const int32_t *prompt;
    int n_prompt, max_tokens, priority;
    float temp;
    uint64_t seed;
    /* results */
    int32_t out[RIG_MAX_OUT];
    int n_out;
    hr_request_stats stats;
} rig_req;

/* Submits every request, steps the engine until all are final, collects outputs and stats. */
static inline void rig_run(rig *r, rig_req *q, int n) {
    hr_request **h = calloc((size_t)n, sizeof *h);
    hr_error err = {0};
    for (int i = 0; i < n; i++) {
        hr_request_params p = {.prompt = q[i].prompt,
                               .n_prompt = q[i].n_prompt,
                               .max_tokens = q[i].max_tokens,
                               .priority = q[i].priority,
                               .ignore_eos = true};
        p.sampling = hr_sampler_default_params();
        p.sampling.temperature = q[i].temp;
        p.sampling.seed = q[i].seed;
        hr_status st = hr_engine_submit(r->e, &p, &h[i], &err);
        CHECKF(st == HR_OK, "submit %d: %s", i, err.msg);
        if (st) exit(1);
    }
    CHECKF(hr_engine_run_until_idle(r->e, &err) == HR_OK, "%s", err.msg);
    for (int i = 0; i < n; i++) {
        int nt = 0;
        const int32_t *o = hr_request_output(h[i], &nt);
        q[i].n_out = HR_MIN(nt, RIG_MAX_OUT);
        memcpy(q[i].out, o, sizeof(int32_t) * (size_t)q[i].n_out);
        hr_request_get_stats(h[i], &q[i].stats);
        hr_request_release(h[i]);
    }
    free(h);
}

#endif

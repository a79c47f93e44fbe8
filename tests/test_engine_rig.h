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
#include "runtime/runtime_parts.h"

#define RIG_MAX_OUT 512

typedef struct rig {
    hr_runtime *rt; /* owns everything below */
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

/* The engine as every front end opens it (src/runtime), with the knobs these tests need: a pool of
 * exactly n_blocks blocks of 16 (it may hold less than a context), a forward context shorter than the
 * engine's (ctx_max: forward failures on demand), and no tokenizer in the engine (raw ids: the random
 * models' EOS never stops a request) unless o->tok asks for one. */
static inline rig rig_open(const hr_model *m, const rig_opts *o) {
    rig r = {0};
    hr_runtime_params p = hr_runtime_default_params();
    p.model = m;
    p.n_ctx = o->n_ctx ? o->n_ctx : hr_model_hparams(m)->n_ctx_train;
    p.ctx_extend = true;
    p.kv_blocks = o->n_blocks;
    p.k_format = p.v_format = (hr_rt_kv_format)o->fmt;
    p.block_size = 16;
    p.max_batch_tokens = o->max_batch;
    p.prefill_chunk = o->prefill_chunk;
    p.max_running = o->max_seqs;
    p.max_queue = o->max_queue;
    p.admission = (hr_rt_admission)o->admission;
    p.preempt = (hr_rt_preempt)o->preempt;
    p.layout = (hr_rt_layout)o->layout;
    p.n_threads = 2;
    p.forward_max_ctx = o->ctx_max;
    p.raw_ids = o->tok == NULL;
    if (o->swap_blocks > 0) {
        const hr_hparams *hp = hr_model_hparams(m);
        hr_kv_config kc = {.n_layers = hp->n_layer,
                           .n_kv_heads = hp->n_head_kv,
                           .head_dim = hp->head_dim,
                           .block_size = 16,
                           .k_format = o->fmt,
                           .v_format = o->fmt,
                           .max_seqs = o->max_seqs};
        p.swap_space = hr_kv_block_bytes(&kc) * (uint64_t)o->swap_blocks;
    }
    hr_error err = {0};
    if (hr_runtime_open(&p, &r.rt, NULL, &err)) {
        fprintf(stderr, "rig: %s\n", err.msg);
        exit(1);
    }
    r.kv = hr_runtime_kv(r.rt);
    r.swap = hr_runtime_swap(r.rt);
    r.ctx = hr_runtime_ctx(r.rt);
    r.e = hr_runtime_engine(r.rt);
    return r;
}

static inline void rig_close(rig *r) { hr_runtime_close(r->rt); }

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

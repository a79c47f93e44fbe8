/* test_kv_policy_model.c: policies through the forward pass, on a synthetic mistral model whose
 * metadata declares a sliding window of 32 tokens.
 *   - the model's window is applied natively: a sequence decoding 200 tokens holds at most the
 *     blocks the window needs, and runs past max_ctx (64) because the window bounds attention;
 *   - logits decoding one token at a time equal, bit for bit, one forward over all 200 tokens (the
 *     window mask depends only on positions, not on chunking or eviction timing);
 *   - past position 32 they differ from the same weights without a window (the window does act);
 *   - policies the model cannot use are refused; a window policy narrower than the model's works. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "model/model.h"
#include "model/synth.h"

enum { N = 200, NATIVE = 32 };

typedef struct rig {
    hr_model *m;
    void *mem;
    hr_kv_pool *kv;
    hr_model_ctx *ctx;
} rig;

static rig rig_open(int sliding_window, int max_ctx, int max_batch) {
    rig r = {0};
    hr_error err = {0};
    hr_synth_shape shape;
    hr_synth_shape_by_name("mistral-tiny", &shape, &err);
    shape.sliding_window = sliding_window;
    if (hr_synth_model(&shape, HR_DTYPE_F32, 5, &r.m, &r.mem, &err)) {
        fprintf(stderr, "build: %s\n", err.msg);
        exit(1);
    }
    const hr_hparams *hp = hr_model_hparams(r.m);
    hr_kv_config kc = {.n_layers = hp->n_layer,
                       .n_kv_heads = hp->n_head_kv,
                       .head_dim = hp->head_dim,
                       .block_size = 16,
                       .k_format = HR_KV_F32,
                       .v_format = HR_KV_F32,
                       .max_seqs = 2};
    kc.budget_bytes = hr_kv_block_bytes(&kc) * (N / 16 + 4);
    hr_model_ctx_params mp = {.n_threads = 2, .max_batch_tokens = max_batch, .max_ctx = max_ctx};
    if (hr_kv_pool_create(&kc, &r.kv, &err) || hr_model_ctx_create(r.m, r.kv, &mp, &r.ctx, &err)) {
        fprintf(stderr, "setup: %s\n", err.msg);
        exit(1);
    }
    return r;
}

static void rig_close(rig *r) {
    hr_model_ctx_destroy(r->ctx);
    hr_kv_pool_destroy(r->kv);
    hr_model_destroy(r->m);
    free(r->mem);
}

/* Runs tokens through a fresh sequence, `chunk` tokens per forward; logits for all N positions. */
static hr_status run(rig *r, const char *policy, const int32_t *toks, int chunk, float *logits, int *max_blocks,
                     hr_error *err) {
    hr_kv_seq s;
    hr_status st = hr_kv_seq_create(r->kv, &s, err);
    if (st) return st;
    hr_kv_policy pol;
    if (policy && ((st = hr_kv_policy_parse(policy, &pol, err)) || (st = hr_kv_seq_set_policy(r->kv, s, &pol, err))))
        goto out;
    int V = hr_model_hparams(r->m)->n_vocab;
    static int32_t pos[N];
    static hr_kv_seq seqs[N];
    static uint8_t want[N];
    *max_blocks = 0;
    for (int c0 = 0; c0 < N; c0 += chunk) {
        int n = c0 + chunk <= N ? chunk : N - c0;
        for (int i = 0; i < n; i++) pos[i] = c0 + i, seqs[i] = s, want[i] = 1;
        hr_batch b = {.n_tokens = n, .tokens = toks + c0, .pos = pos, .seq = seqs, .want_logits = want};
        if ((st = hr_kv_seq_reserve(r->kv, s, c0 + n, err)) ||
            (st = hr_model_forward(r->ctx, &b, logits + (size_t)c0 * V, err)))
            goto out;
        hr_kv_seq_commit(r->kv, s, toks + c0, n);
        hr_kv_seq_ledger lg;
        hr_kv_seq_get_ledger(r->kv, s, &lg, err);
        if (lg.blocks_own + lg.blocks_shared > *max_blocks) *max_blocks = lg.blocks_own + lg.blocks_shared;
    }
    if (hr_kv_pool_check(r->kv, err) != HR_OK) st = HR_ERR_INTERNAL;
out:
    hr_kv_seq_free(r->kv, s);
    return st;
}

int main(void) {
    hr_error err = {0};
    static int32_t toks[N];
    rig big = rig_open(NATIVE, 256, N);   /* one forward over everything */
    rig small = rig_open(NATIVE, 64, 16); /* decode, past max_ctx */
    rig none = rig_open(0, 256, N);       /* the same weights, no window */
    int V = hr_model_hparams(big.m)->n_vocab;
    for (int i = 0; i < N; i++) toks[i] = (int32_t)((i * 7919 + 13) % V);
    CHECK(hr_model_hparams(big.m)->sliding_window == NATIVE);
    float *l_all = malloc(sizeof(float) * (size_t)N * V), *l_dec = malloc(sizeof(float) * (size_t)N * V);
    float *l_none = malloc(sizeof(float) * (size_t)N * V);
    int blocks_all = 0, blocks_dec = 0, blocks_none = 0;
    CHECKF(run(&big, NULL, toks, N, l_all, &blocks_all, &err) == HR_OK, "%s", err.msg);
    CHECKF(run(&small, NULL, toks, 1, l_dec, &blocks_dec, &err) == HR_OK, "past max_ctx: %s", err.msg);
    CHECKF(run(&none, NULL, toks, N, l_none, &blocks_none, &err) == HR_OK, "%s", err.msg);
    CHECK(memcmp(l_all, l_dec, sizeof(float) * (size_t)N * V) == 0);
    /* the window changes nothing while it covers everything, and acts beyond it */
    CHECK(memcmp(l_all, l_none, sizeof(float) * (size_t)NATIVE * V) == 0);
    CHECK(memcmp(l_all + (size_t)(NATIVE + 1) * V, l_none + (size_t)(NATIVE + 1) * V, sizeof(float) * V) != 0);
    CHECKF(blocks_dec <= NATIVE / 16 + 1, "decode held %d blocks", blocks_dec);
    CHECKF(blocks_all <= NATIVE / 16 + 1 && blocks_none == (N + 15) / 16, "after one forward: %d, no window %d",
           blocks_all, blocks_none);

    /* a full cache without a window stops at max_ctx */
    rig none_small = rig_open(0, 64, 16);
    CHECK(run(&none_small, NULL, toks, 16, l_none, &blocks_none, &err) == HR_ERR_RANGE);
    CHECK(strstr(err.msg, "window") != NULL);
    /* ... unless a window policy bounds attention */
    CHECKF(run(&none_small, "sinks:4,window:32", toks, 16, l_none, &blocks_none, &err) == HR_OK, "%s", err.msg);
    rig_close(&none_small);

    /* policies against the model's window */
    CHECK(run(&small, "h2o:32", toks, 1, l_dec, &blocks_dec, &err) == HR_ERR_INVALID_ARG &&
          strstr(err.msg, "sliding window of 32"));
    CHECK(run(&small, "window:64", toks, 1, l_dec, &blocks_dec, &err) == HR_ERR_INVALID_ARG);
    CHECKF(run(&small, "window:16", toks, 1, l_dec, &blocks_dec, &err) == HR_OK, "%s", err.msg);
    CHECK(blocks_dec <= 2);
    CHECKF(run(&big, "window:16", toks, N, l_all, &blocks_all, &err) == HR_OK, "%s", err.msg);
    CHECK(memcmp(l_all, l_dec, sizeof(float) * (size_t)N * V) == 0);

    free(l_all), free(l_dec), free(l_none);
    rig_close(&big);
    rig_close(&small);
    rig_close(&none);
    return hr_test_finish();
}

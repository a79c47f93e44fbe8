/* test_runtime_shape.c: the runtime's calls for the planner (issue 23 point 7): a runtime opened on a
 * model's shape alone with a chosen backend (here a test backend whose logits make greedy sampling
 * count upwards, so the output ids are known exactly), its refusals (text prompts, no backend, a bad
 * shape), and a runtime on a synthetic model whose timed forward passes (hr_runtime_time_forward) give
 * the same logits as scoring the same tokens. hr_runtime_describe on each family's synthetic model: its
 * layer kinds in order, its window counts, latent width and sinks, and its shape given back as
 * hr_runtime_params.shape making a pool of the same layer groups, kinds and bytes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "harness.h"
#include "runtime/runtime.h"

#define V 32

typedef struct fake_ctx {
    hr_backend_base base;
    hr_kv_pool *kv;
} fake_ctx;

static int n_forward, n_tokens_seen;

static hr_status fake_create(const hr_model *m, hr_kv_pool *kv, const hr_model_ctx_params *p, hr_model_ctx **out,
                             hr_error *err) {
    (void)err;
    fake_ctx *c = calloc(1, sizeof *c);
    if (!c || m != NULL || p->backend_user != &n_forward) { /* no model; the user pointer passed through */
        free(c);
        return HR_ERR_INTERNAL;
    }
    c->base.ops = p->backend;
    c->kv = kv;
    *out = (hr_model_ctx *)(void *)c;
    return HR_OK;
}

static void fake_destroy(hr_model_ctx *c) { free(c); }

/* Writes zero K/V and logits whose argmax is the token after the input (mod V). */
static hr_status fake_forward(hr_model_ctx *ctx, const hr_batch *b, float *logits, hr_error *err) {
    (void)err;
    fake_ctx *c = (fake_ctx *)(void *)ctx;
    static const float zero[64];
    int row = 0;
    n_forward++;
    for (int i = 0; i < b->n_tokens; i++) {
        hr_kv_write(c->kv, 0, b->seq[i], b->pos[i], zero, zero);
        n_tokens_seen++;
        if (!b->want_logits || !b->want_logits[i]) continue;
        float *y = logits + (size_t)row++ * V;
        for (int v = 0; v < V; v++) y[v] = 0;
        y[(b->tokens[i] + 1) % V] = 1;
    }
    return HR_OK;
}

static const hr_backend_ops fake_ops = {
    .name = "fake", .create = fake_create, .destroy = fake_destroy, .forward = fake_forward};

static void test_shape(void) {
    hr_rt_shape shape = {
        .n_vocab = V, .n_embd = 64, .n_ff = 64, .n_head = 2, .n_head_kv = 1, .n_layer = 1, .head_dim = 64};
    hr_runtime_params p = hr_runtime_default_params();
    p.shape = &shape;
    p.backend = &fake_ops;
    p.backend_user = &n_forward;
    p.n_ctx = 64;
    p.kv_blocks = 8;
    p.raw_ids = true;
    hr_runtime *rt = NULL;
    hr_error err;
    bool bad = false;
    CHECKF(hr_runtime_open(&p, &rt, &bad, &err) == HR_OK, "%s", err.msg);
    if (!rt) return;
    hr_runtime_info info;
    hr_runtime_describe(rt, &info);
    CHECK(info.n_vocab == V && info.shape.n_vocab == V && info.shape.n_head == 2 && info.shape.n_head_kv == 1 &&
          info.shape.head_dim == 64 && info.weight_bytes == 0 && !strcmp(info.arch, "shape"));
    CHECK(!hr_runtime_is_demo(rt) && hr_runtime_n_ctx(rt) == 64 && hr_runtime_budget(rt)->n_blocks == 8);

    int32_t prompt[3] = {5, 6, 7};
    hr_rt_request_params rp = {.prompt_ids = prompt, .n_prompt_ids = 3, .max_tokens = 4, .ignore_eos = true};
    rp.sampling = hr_rt_sampling_default();
    rp.sampling.temperature = 0;
    hr_rt_request *r = NULL;
    CHECKF(hr_runtime_submit(rt, &rp, &r, &err) == HR_OK, "%s", err.msg);
    CHECKF(hr_runtime_run_until_idle(rt, &err) == HR_OK, "%s", err.msg);
    hr_rt_result res;
    if (r) {
        hr_rt_request_result(r, &res);
        CHECKF(res.state == HR_RT_COMPLETED && res.n_ids == 4, "state %d, %d ids", (int)res.state, res.n_ids);
        for (int i = 0; i < res.n_ids && i < 4; i++) CHECK(res.ids[i] == 8 + i);
        hr_rt_request_release(rt, r);
    }
    /* one forward of the prompt, then one per token but the last sampled: 3 + 3 tokens through it */
    CHECKF(n_forward == 4 && n_tokens_seen == 6, "%d forwards, %d tokens", n_forward, n_tokens_seen);
    hr_runtime_pool pool;
    hr_runtime_get_pool(rt, &pool);
    CHECK(pool.engine.completed == 1 && pool.engine.generated_tokens == 4 && pool.ledger.blocks_total == 8);

    /* no tokenizer: text is refused, ids only */
    hr_rt_request_params tp = {.prompt = "hello", .max_tokens = 2};
    r = NULL;
    CHECK(hr_runtime_submit(rt, &tp, &r, &err) == HR_ERR_INVALID_ARG && r == NULL);
    CHECK(strstr(err.msg, "token ids") != NULL);
    /* a sibling of a runtime on a shape has the same shape, its own pool */
    hr_runtime_params sp = p;
    sp.shape = NULL;
    sp.kv_blocks = 4;
    hr_runtime *sib = NULL;
    CHECKF(hr_runtime_open_sibling(rt, &sp, &sib, NULL, &err) == HR_OK, "%s", err.msg);
    if (sib) {
        hr_runtime_describe(sib, &info);
        CHECK(info.shape.n_head == 2 && info.n_vocab == V && hr_runtime_budget(sib)->n_blocks == 4);
        hr_runtime_close(sib);
    }
    hr_runtime_close(rt);

    /* a shape needs a backend that runs without weights */
    p.backend = NULL;
    rt = NULL;
    CHECK(hr_runtime_open(&p, &rt, &bad, &err) == HR_ERR_INVALID_ARG && rt == NULL && bad);
    p.backend = &fake_ops;
    shape.n_head_kv = 0;
    CHECK(hr_runtime_open(&p, &rt, &bad, &err) == HR_ERR_INVALID_ARG && rt == NULL && bad);
}

static void test_synth_time_forward(void) {
    hr_rt_synth synth = {.shape = "tiny", .weight_type = "f32", .n_layer = 1, .seed = 3};
    hr_runtime_params p = hr_runtime_default_params();
    p.synth = &synth;
    p.raw_ids = true;
    p.n_threads = 1;
    p.n_ctx = 96;
    p.max_batch_tokens = 32;
    p.kv_blocks = 16;
    hr_runtime *rt = NULL;
    hr_error err;
    CHECKF(hr_runtime_open(&p, &rt, NULL, &err) == HR_OK, "%s", err.msg);
    if (!rt) return;
    hr_runtime_info info;
    hr_runtime_describe(rt, &info);
    CHECK(info.shape.n_layer == 1 && info.weight_bytes > 0 && info.n_vocab == info.shape.n_vocab);
    int nv = info.n_vocab, n = 8;
    int32_t toks[8], past[40];
    for (int i = 0; i < n; i++) toks[i] = 3 + (i * 5) % 20;
    for (int i = 0; i < 40; i++) past[i] = 3 + i % 17;
    float *want = malloc(sizeof(float) * (size_t)n * (size_t)nv), *got = malloc(sizeof(float) * (size_t)n * (size_t)nv);
    double secs[2] = {-1, -1};
    if (want && got) {
        /* every token's logits: the same forward pass as scoring the tokens under the full policy */
        CHECKF(hr_runtime_score(rt, NULL, toks, n, want, NULL, &err) == HR_OK, "%s", err.msg);
        CHECKF(hr_runtime_time_forward(rt, NULL, 0, toks, n, true, 2, got, secs, &err) == HR_OK, "%s", err.msg);
        CHECK(memcmp(want, got, sizeof(float) * (size_t)n * (size_t)nv) == 0);
        CHECK(secs[0] >= 0 && secs[1] >= 0 && secs[0] < 60 && secs[1] < 60);
        /* the last token's only: the score's last row */
        CHECKF(hr_runtime_time_forward(rt, NULL, 0, toks, n, false, 1, got, secs, &err) == HR_OK, "%s", err.msg);
        CHECK(memcmp(want + (size_t)(n - 1) * nv, got, sizeof(float) * (size_t)nv) == 0);
        /* after cached tokens the logits differ (attention sees them), and are finite */
        CHECKF(hr_runtime_time_forward(rt, past, 40, toks, n, false, 1, got, secs, &err) == HR_OK, "%s", err.msg);
        CHECK(memcmp(want + (size_t)(n - 1) * nv, got, sizeof(float) * (size_t)nv) != 0 && isfinite(got[0]));
        /* the pool is left as it was: every block free again */
        hr_runtime_pool pool;
        hr_runtime_get_pool(rt, &pool);
        CHECK(pool.ledger.blocks_used == 0);
        /* bounds: a step's tokens, the context */
        CHECK(hr_runtime_time_forward(rt, NULL, 0, toks, 33, false, 1, got, secs, &err) == HR_ERR_INVALID_ARG);
        CHECK(hr_runtime_time_forward(rt, past, 90, toks, 8, false, 1, got, secs, &err) == HR_ERR_INVALID_ARG);
    }
    free(want);
    free(got);
    hr_runtime_close(rt);

    synth.weight_type = "q3_x";
    rt = NULL;
    CHECK(hr_runtime_open(&p, &rt, NULL, &err) == HR_ERR_INVALID_ARG && rt == NULL && strstr(err.msg, "q3_x"));
}

/* Each family's synthetic model described, then its described shape opened alone: the same pool. */
static void test_describe_round_trip(void) {
    const struct {
        const char *shape, *kinds;
        int sliding_window, swa_window, n_window_layers, kv_lora_rank;
        bool sinks;
    } cases[] = {{"qwen3-tiny", "FF", 0, 0, 0, 0, false},     {"mistral-tiny", "WW", 256, -1, 2, 0, false},
                 {"gemma2-tiny", "WFWF", 0, 16, 2, 0, false}, {"gemma3-tiny", "WWWWWF", 0, 16, 5, 0, false},
                 {"gpt-oss-tiny", "WF", 0, 16, 1, 0, true},   {"deepseek3-tiny", "LLL", 0, 0, 0, 32, false}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        hr_rt_synth synth = {.shape = cases[c].shape, .weight_type = "f32", .seed = 1};
        hr_runtime_params p = hr_runtime_default_params();
        p.synth = &synth;
        p.raw_ids = true;
        p.n_threads = 1;
        p.n_ctx = 64;
        p.kv_blocks = 12;
        hr_runtime *rt = NULL, *alone = NULL;
        hr_error err;
        CHECKF(hr_runtime_open(&p, &rt, NULL, &err) == HR_OK, "%s: %s", cases[c].shape, err.msg);
        if (!rt) continue;
        hr_runtime_info info;
        hr_runtime_describe(rt, &info);
        const hr_rt_shape *s = &info.shape;
        CHECKF(info.layer_kinds && !strcmp(info.layer_kinds, cases[c].kinds), "%s: layer kinds '%s', want '%s'",
               cases[c].shape, info.layer_kinds ? info.layer_kinds : "(null)", cases[c].kinds);
        CHECKF(s->sliding_window == cases[c].sliding_window &&
                   (cases[c].swa_window < 0 || s->swa_window == cases[c].swa_window) &&
                   s->n_window_layers == cases[c].n_window_layers && s->kv_lora_rank == cases[c].kv_lora_rank &&
                   s->attn_sinks == cases[c].sinks,
               "%s: window %d, swa %d x %d layers, latent %d, sinks %d", cases[c].shape, s->sliding_window,
               s->swa_window, s->n_window_layers, s->kv_lora_rank, s->attn_sinks);
        /* the described shape alone (no weights) with the same pool parameters */
        hr_rt_shape shape = *s;
        hr_runtime_params q = hr_runtime_default_params();
        q.shape = &shape;
        q.backend = &fake_ops;
        q.backend_user = &n_forward;
        q.raw_ids = true;
        q.n_ctx = 64;
        q.kv_blocks = 12;
        CHECKF(hr_runtime_open(&q, &alone, NULL, &err) == HR_OK, "%s alone: %s", cases[c].shape, err.msg);
        if (alone) {
            const hr_kv_budget *a = hr_runtime_budget(rt), *b = hr_runtime_budget(alone);
            CHECKF(a->block_bytes == b->block_bytes && a->token_bytes == b->token_bytes && a->n_blocks == b->n_blocks,
                   "%s: block %llu / %llu bytes, token %llu / %llu", cases[c].shape, (unsigned long long)a->block_bytes,
                   (unsigned long long)b->block_bytes, (unsigned long long)a->token_bytes,
                   (unsigned long long)b->token_bytes);
            hr_runtime_pool pa, pb;
            hr_runtime_get_pool(rt, &pa);
            hr_runtime_get_pool(alone, &pb);
            CHECKF(pa.ledger.n_groups == pb.ledger.n_groups && pa.ledger.n_kinds == pb.ledger.n_kinds &&
                       pa.ledger.bytes_total == pb.ledger.bytes_total,
                   "%s: %d / %d groups, %d / %d kinds", cases[c].shape, pa.ledger.n_groups, pb.ledger.n_groups,
                   pa.ledger.n_kinds, pb.ledger.n_kinds);
            for (int k = 0; k < pa.ledger.n_kinds && k < pb.ledger.n_kinds; k++) {
                const hr_rt_kv_kind *ka = &pa.ledger.kinds[k], *kb = &pb.ledger.kinds[k];
                CHECKF(ka->window == kb->window && ka->n_layers == kb->n_layers && ka->latent == kb->latent &&
                           ka->token_bytes == kb->token_bytes,
                       "%s kind %d: window %d / %d, layers %d / %d, latent %d / %d", cases[c].shape, k, ka->window,
                       kb->window, ka->n_layers, kb->n_layers, ka->latent, kb->latent);
            }
            /* a shape alone keeps the counts, not the order: its first n_window_layers are windowed */
            hr_runtime_info ia;
            hr_runtime_describe(alone, &ia);
            int wa = 0, wb = 0;
            for (const char *k = info.layer_kinds; k && *k; k++) wa += *k == 'W';
            for (const char *k = ia.layer_kinds; k && *k; k++) wb += *k == 'W';
            CHECKF(ia.layer_kinds && strlen(ia.layer_kinds) == strlen(cases[c].kinds) && wa == wb &&
                       ia.shape.kv_lora_rank == s->kv_lora_rank && ia.shape.attn_sinks == s->attn_sinks,
                   "%s alone: layer kinds '%s'", cases[c].shape, ia.layer_kinds ? ia.layer_kinds : "(null)");
            printf("%-15s layer kinds %-7s -> alone %-7s: %d group(s), %llu bytes a block in both\n", cases[c].shape,
                   info.layer_kinds, ia.layer_kinds, pb.ledger.n_groups, (unsigned long long)b->block_bytes);
            hr_runtime_close(alone);
        }
        hr_runtime_close(rt);
    }
    /* a latent width the cache cannot hold: refused as a parameter */
    hr_rt_shape bad = {.n_vocab = V,
                       .n_embd = 64,
                       .n_ff = 64,
                       .n_head = 2,
                       .n_head_kv = 2,
                       .n_layer = 1,
                       .head_dim = 64,
                       .kv_lora_rank = 32};
    hr_runtime_params q = hr_runtime_default_params();
    q.shape = &bad;
    q.backend = &fake_ops;
    q.backend_user = &n_forward;
    q.raw_ids = true;
    q.kv_blocks = 4;
    hr_runtime *rt = NULL;
    hr_error err;
    bool bad_option = false;
    CHECK(hr_runtime_open(&q, &rt, &bad_option, &err) == HR_ERR_INVALID_ARG && rt == NULL && bad_option &&
          strstr(err.msg, "kv_lora_rank"));
    bad.n_head_kv = 1, bad.kv_lora_rank = 64; /* no room for the roped key */
    CHECK(hr_runtime_open(&q, &rt, &bad_option, &err) == HR_ERR_INVALID_ARG && rt == NULL);
}

int main(void) {
    test_shape();
    test_synth_time_forward();
    test_describe_round_trip();
    return hr_test_finish();
}

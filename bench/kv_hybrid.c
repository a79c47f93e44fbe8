/* kv_hybrid.c: how many 32K-context sequences one KV budget serves at once for a Gemma-3-shaped model
 * (5 sliding-window layers of 1024 tokens to 1 full layer) or a gpt-oss-shaped one (window layers of
 * 128 tokens alternating with full ones), with the hybrid KV manager (kv.h's layer groups: the window
 * groups free what their window no longer sees) and with the same pool keeping every layer's blocks
 * (one group, as before).
 *
 *   bench_kv_hybrid [--shape gemma3|gpt-oss] [--requests N] [--budget-mib M] [--ctx T] [--window W]
 *                   [--layers L] [--kv-heads H] [--head-dim D]
 *
 * The real engine (scheduler, admission in reserve mode: a request is admitted only when its whole
 * life fits, so none is ever preempted; 8192 tokens a step in prefill chunks of 512, so every
 * admitted request prefills at once) and the real KV pool serve N requests of (ctx - 64) prompt
 * tokens + 64 generated tokens, all submitted at once; the figure is the engine's peak of requests
 * running together. The step executor writes every token's K/V in every layer through hr_kv_write and
 * runs every layer's attention (hr_kv_attention, the window layers masked to their window) for each
 * row that samples, so every block a sequence keeps is written and read; it skips the model's
 * matrices (a 32K prefill of even a tiny model takes minutes per sequence on 2 cores) and samples
 * from constant logits. The shapes: a synthetic gemma3 (`headroom synth --shape gemma3-tiny` with
 * L layers, window W, context T: 1 KV head of dimension 32) or gpt-oss (`gpt-oss-tiny` with 24 layers,
 * window 128, 1 KV head of dimension 64 unless --kv-heads / --head-dim say otherwise); f16 K/V, block
 * 16. Every layer of both shapes has the same K/V width, so the ratio does not depend on H x D (gpt-oss's
 * real 8 x 64 costs 8x the attention time on 2 cores for the same figure). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "engine/engine.h"
#include "model/synth.h"

typedef struct exec {
    hr_kv_pool *kv;
    int n_layers, n_vocab, d;
    int n_q_heads;
    float *scratch, *k, *v, *q, *out;
    int32_t last_seq_tokens;
} exec;

/* The step: K/V of every token in every layer; attention of every layer for the rows that sample. */
static hr_status step(void *user, const hr_batch *b, float *logits, hr_error *err) {
    exec *x = user;
    int row = 0;
    for (int i = 0; i < b->n_tokens; i++) {
        for (int j = 0; j < x->d; j++) x->k[j] = x->v[j] = (float)((b->pos[i] * 31 + j) % 17) * 0.0625f;
        for (int l = 0; l < x->n_layers; l++) hr_kv_write(x->kv, l, b->seq[i], b->pos[i], x->k, x->v);
    }
    for (int i = 0; i < b->n_tokens; i++) {
        if (!b->want_logits[i]) continue;
        for (int l = 0; l < x->n_layers; l++)
            hr_kv_attention(x->kv, l, b->seq[i], b->pos[i] + 1, x->q, x->n_q_heads, 0.18f, x->out, x->scratch);
        memset(logits + (size_t)row * x->n_vocab, 0, sizeof(float) * (size_t)x->n_vocab);
        row++;
    }
    (void)err;
    return HR_OK;
}

typedef struct result {
    int peak_running, completed, n_blocks;
    uint64_t preemptions;
    uint64_t pool_bytes, seq_bytes;
    double seconds;
} result;

static result serve(const hr_model *m, bool hybrid, uint64_t budget, int n_req, int ctx) {
    const hr_hparams *hp = hr_model_hparams(m);
    const hr_layer_attn *la = hr_model_layer_attn(m);
    int32_t *win = calloc((size_t)hp->n_layer, sizeof *win);
    for (int l = 0; l < hp->n_layer; l++) win[l] = la[l].window;
    hr_kv_config kc = {.n_layers = hp->n_layer,
                       .n_kv_heads = hp->n_head_kv,
                       .head_dim = hp->head_dim,
                       .block_size = 16,
                       .k_format = HR_KV_F16,
                       .v_format = HR_KV_F16,
                       .max_seqs = 64,
                       .max_step_tokens = 512,
                       .budget_bytes = budget,
                       .layer_window = hybrid ? win : NULL};
    hr_error err = {0};
    hr_kv_pool *kv = NULL;
    if (hr_kv_pool_create(&kc, &kv, &err) != HR_OK) {
        fprintf(stderr, "bench_kv_hybrid: %s\n", err.msg);
        exit(1);
    }
    /* without groups the window layers are still masked to their window (the model's attention),
     * only their blocks stay, as before the hybrid manager */
    for (int l = 0; !hybrid && l < hp->n_layer; l++) hr_kv_pool_set_sliding_window(kv, l, win[l], NULL);
    /* 4 query heads per KV head at most 4 KV heads, one per KV head past that (grouped queries) */
    exec x = {.kv = kv,
              .n_layers = hp->n_layer,
              .n_vocab = hp->n_vocab,
              .d = hp->n_head_kv * hp->head_dim,
              .n_q_heads = HR_MAX(4, hp->n_head_kv)};
    x.scratch = malloc(sizeof(float) * hr_kv_attention_scratch_floats(kv, ctx));
    x.k = malloc(sizeof(float) * (size_t)x.d);
    x.v = malloc(sizeof(float) * (size_t)x.d);
    x.q = malloc(sizeof(float) * (size_t)(x.n_q_heads * hp->head_dim));
    x.out = malloc(sizeof(float) * (size_t)(x.n_q_heads * hp->head_dim));
    for (int i = 0; i < x.n_q_heads * hp->head_dim; i++) x.q[i] = (float)(i % 7) * 0.1f;
    hr_engine_params ep = {.forward = step,
                           .forward_user = &x,
                           .n_vocab = hp->n_vocab,
                           .kv = kv,
                           .n_ctx = ctx,
                           .max_batch_tokens = 8192, /* room for many prefill chunks a step */
                           .prefill_chunk = 512,     /* what the pool's max_step_tokens says */
                           .max_running = 64,
                           .max_queue = n_req + 1,
                           .admission = HR_ADMIT_RESERVE,
                           .preempt = HR_PREEMPT_RECOMPUTE};
    hr_engine *e = NULL;
    if (hr_engine_create(&ep, &e, &err) != HR_OK) {
        fprintf(stderr, "bench_kv_hybrid: engine: %s\n", err.msg);
        exit(1);
    }
    int n_prompt = ctx - 64;
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n_prompt);
    hr_request **h = calloc((size_t)n_req, sizeof *h);
    double t0 = hr_time_now();
    for (int i = 0; i < n_req; i++) {
        for (int t = 0; t < n_prompt; t++) prompt[t] = 1 + (t * 7 + i * 13) % (hp->n_vocab - 1); /* no shared prefix */
        hr_request_params p = {.prompt = prompt,
                               .n_prompt = n_prompt,
                               .max_tokens = 64,
                               .sampling = hr_sampler_default_params(),
                               .ignore_eos = true};
        p.sampling.temperature = 0;
        if (hr_engine_submit(e, &p, &h[i], &err) != HR_OK) {
            fprintf(stderr, "bench_kv_hybrid: submit: %s\n", err.msg);
            exit(1);
        }
    }
    if (hr_engine_run_until_idle(e, &err) != HR_OK) {
        fprintf(stderr, "bench_kv_hybrid: run: %s\n", err.msg);
        exit(1);
    }
    result r = {.seconds = hr_time_now() - t0, .n_blocks = hr_kv_pool_n_blocks(kv)};
    hr_engine_stats st;
    hr_engine_get_stats(e, &st);
    r.peak_running = st.peak_running;
    r.preemptions = st.preemptions;
    for (int i = 0; i < n_req; i++) {
        hr_request_stats s;
        hr_request_get_stats(h[i], &s);
        r.completed += s.state == HR_REQ_COMPLETED;
        r.seq_bytes = HR_MAX(r.seq_bytes, s.kv.bytes_peak);
        hr_request_release(h[i]);
    }
    r.pool_bytes = (uint64_t)r.n_blocks * hr_kv_block_bytes(hr_kv_pool_config(kv));
    hr_engine_destroy(e);
    hr_kv_pool_destroy(kv);
    free(h);
    free(prompt);
    free(x.scratch);
    free(x.k);
    free(x.v);
    free(x.q);
    free(x.out);
    free(win);
    return r;
}

int main(int argc, char **argv) {
    int n_req = 24, ctx = 32768, window = -1, layers = -1, kv_heads = -1, head_dim = -1;
    double budget_mib = 96;
    const char *shape = "gemma3";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--shape"))
            shape = argv[i + 1];
        else if (!strcmp(argv[i], "--kv-heads"))
            kv_heads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--head-dim"))
            head_dim = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--requests"))
            n_req = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--budget-mib"))
            budget_mib = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--ctx"))
            ctx = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--window"))
            window = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--layers"))
            layers = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_kv_hybrid [--shape gemma3|gpt-oss] [--requests N] [--budget-mib M] [--ctx T] "
                            "[--window W] [--layers L] [--kv-heads H] [--head-dim D]\n");
            return 2;
        }
    }
    bool gptoss = !strcmp(shape, "gpt-oss");
    if (!gptoss && strcmp(shape, "gemma3")) {
        fprintf(stderr, "bench_kv_hybrid: --shape %s: gemma3 or gpt-oss\n", shape);
        return 2;
    }
    if (window < 0) window = gptoss ? 128 : 1024;
    if (layers < 0) layers = gptoss ? 24 : 6;
    if (kv_heads < 1) kv_heads = 1;
    if (head_dim < 1) head_dim = gptoss ? 64 : 32;
    hr_synth_shape sh;
    hr_error err = {0};
    hr_model *m = NULL;
    void *mem = NULL;
    if (hr_synth_shape_by_name(gptoss ? "gpt-oss-tiny" : "gemma3-tiny", &sh, &err) != HR_OK) return 1;
    sh.n_layer = layers;
    sh.n_head_kv = kv_heads;
    sh.head_dim = head_dim;
    sh.n_head = HR_MAX(4, kv_heads);
    sh.sliding_window = window;
    sh.n_ctx = ctx;
    if (hr_synth_model(&sh, HR_DTYPE_F32, 1, &m, &mem, &err) != HR_OK) {
        fprintf(stderr, "bench_kv_hybrid: model: %s\n", err.msg);
        return 1;
    }
    const hr_hparams *hp = hr_model_hparams(m);
    uint64_t budget = (uint64_t)(budget_mib * 1048576.0);
    printf("%s-shaped: %d layers (%d window of %d tokens, %d full), %d KV head x %d, f16 K/V, block 16\n", shape,
           hp->n_layer, hp->n_window_layers, window, hp->n_layer - hp->n_window_layers, hp->n_head_kv, hp->head_dim);
    printf("KV budget %.0f MiB, %d requests of %d prompt + 64 output tokens (context %d), reserve admission\n\n",
           budget_mib, n_req, ctx - 64, ctx);
    printf("%-22s %8s %12s %14s %10s %8s %9s %8s\n", "pool", "blocks", "block bytes", "peak running", "completed",
           "preempt", "seq MiB", "seconds");
    result r[2];
    for (int hy = 0; hy < 2; hy++) {
        r[hy] = serve(m, hy == 1, budget, n_req, ctx);
        printf("%-22s %8d %12llu %14d %10d %8llu %9.2f %8.1f\n", hy ? "hybrid (layer groups)" : "every layer full",
               r[hy].n_blocks, (unsigned long long)(r[hy].pool_bytes / (uint64_t)r[hy].n_blocks), r[hy].peak_running,
               r[hy].completed, (unsigned long long)r[hy].preemptions, (double)r[hy].seq_bytes / 1048576.0,
               r[hy].seconds);
    }
    printf("\nconcurrent 32K-context sequences, hybrid / every layer full: %.2fx\n",
           r[0].peak_running ? (double)r[1].peak_running / r[0].peak_running : 0.0);
    hr_model_destroy(m);
    free(mem);
    return r[0].completed == n_req && r[1].completed == n_req ? 0 : 1;
}

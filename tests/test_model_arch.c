/* test_model_arch.c: the families past llama's (qwen3, gemma2, gemma3, phi3, qwen3moe, and llama with
 * experts: Mixtral) against an independent implementation, and their bad input.
 *   - llama.cpp's greedy ids: tests/vectors/arch-llamacpp.jsonl records what llama.cpp (CPU, f16 K/V,
 *     flash attention off) generated on the synthetic f32 models `headroom synth --shape S --type f32`
 *     (seed 1) makes, 8 prompts x 64 tokens each (how: tests/vectors/README.md); headroom must
 *     generate the same ids with an f16 cache, and llama.cpp's 8 largest logits at steps 0, 21, 42
 *     and 63 within 2e-3 of the largest (llama.cpp's GELU reads an f16 table: gemma's 8e-4).
 *   - mixture of experts (qwen3moe, Mixtral): a float64 reference of one layer (every token its own
 *     sequence at position 0, so attention is V: the router, top-k, renormalization and the experts
 *     checked closely); batch invariance (a sequence's logits bit-identical alone and batched with
 *     others, f32, q8_0 and q4_K experts); q8_0 / q4_K experts near the f32 model's logits.
 *   - a GGUF of a known family with a missing key or tensor, a mis-shaped tensor or a window larger
 *     than its context fails to load with one message naming the key or tensor; an unknown
 *     architecture names the supported list; through the CLI (`run`, `serve`) that is exit 1 and one
 *     line on stderr, and the server does not start.
 * (The float64 reference checks of the same families are in test_model.c; deepseek2's latent attention
 * is in test_model_mla.c, gpt-oss in test_model_gptoss.c; both share model_arch_common.h.) */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fault.h"
#include "common/util.h"
#include "harness.h"
#include "model/model.h"
#include "model/synth.h"
#include "model_arch_common.h"
#include "model_images.h"

/* ---- mixture of experts ---- */

/* The logits of token `tok` alone at position 0 of a 1-layer MoE model, in double: attention over one
 * position is V, so the layer is x + Wo V(x), then the experts. Also returns the gap between the k-th
 * and (k+1)-th router probability (how far the choice is from a tie). */
static void moe_ref_first_token(const hr_model *m, int tok, double *logits, double *gap) {
    const hr_hparams *hp = hr_model_hparams(m);
    const int E = hp->n_embd, D = hp->head_dim, H = hp->n_head, Hkv = hp->n_head_kv, NE = hp->n_expert,
              K = hp->n_expert_used, Fe = hp->n_ff_exp, V = hp->n_vocab;
    const double eps = hp->norm_eps;
    double *x = calloc((size_t)E, sizeof(double)), *xn = calloc((size_t)E, sizeof(double)),
           *v = calloc((size_t)Hkv * D, sizeof(double)), *att = calloc((size_t)H * D, sizeof(double)),
           *o = calloc((size_t)E, sizeof(double)), *p = calloc((size_t)NE, sizeof(double)),
           *g = calloc((size_t)Fe, sizeof(double)), *u = calloc((size_t)Fe, sizeof(double)),
           *y = calloc((size_t)E, sizeof(double)), *acc = calloc((size_t)E, sizeof(double));
    const float *emb = f32_tensor(m, "token_embd.weight"), *out = f32_tensor(m, "output.weight");
    const float *an = f32_tensor(m, "blk.0.attn_norm.weight"), *wv = f32_tensor(m, "blk.0.attn_v.weight"),
                *wo = f32_tensor(m, "blk.0.attn_output.weight"), *fn = f32_tensor(m, "blk.0.ffn_norm.weight"),
                *wr = f32_tensor(m, "blk.0.ffn_gate_inp.weight"), *wg = f32_tensor(m, "blk.0.ffn_gate_exps.weight"),
                *wu = f32_tensor(m, "blk.0.ffn_up_exps.weight"), *wd = f32_tensor(m, "blk.0.ffn_down_exps.weight"),
                *on = f32_tensor(m, "output_norm.weight");
    if (!emb || !out || !an || !wv || !wo || !fn || !wr || !wg || !wu || !wd || !on) goto done;
    for (int i = 0; i < E; i++) x[i] = emb[(size_t)tok * E + i];
    rmsnorm64(xn, x, an, E, eps);
    matvec64(wv, xn, Hkv * D, E, v);
    for (int h = 0; h < H; h++) /* query head h reads KV head h / (H / Hkv) */
        for (int d = 0; d < D; d++) att[h * D + d] = v[(h / (H / Hkv)) * D + d];
    matvec64(wo, att, E, H * D, o);
    for (int i = 0; i < E; i++) x[i] += o[i];
    rmsnorm64(xn, x, fn, E, eps);
    matvec64(wr, xn, NE, E, p);
    double mx = p[0], sum = 0;
    for (int e = 1; e < NE; e++) mx = fmax(mx, p[e]);
    for (int e = 0; e < NE; e++) sum += (p[e] = exp(p[e] - mx));
    for (int e = 0; e < NE; e++) p[e] /= sum;
    int sel[64];
    double w[64], wsum = 0;
    for (int k = 0; k <= K && k < NE; k++) { /* K + 1 largest: the last one only for the gap */
        int best = -1;
        for (int e = 0; e < NE; e++) {
            bool taken = false;
            for (int j = 0; j < k; j++) taken |= sel[j] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        sel[k] = best;
        w[k] = p[best];
        if (k < K) wsum += w[k];
    }
    *gap = K < NE ? w[K - 1] - w[K] : 1.0;
    for (int k = 0; k < K; k++) {
        const size_t e = (size_t)sel[k];
        matvec64(wg + e * Fe * E, xn, Fe, E, g);
        matvec64(wu + e * Fe * E, xn, Fe, E, u);
        for (int i = 0; i < Fe; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
        matvec64(wd + e * E * Fe, g, E, Fe, y);
        for (int i = 0; i < E; i++) acc[i] += w[k] / wsum * y[i];
    }
    for (int i = 0; i < E; i++) x[i] += acc[i];
    rmsnorm64(xn, x, on, E, eps);
    matvec64(out, xn, V, E, logits);
done:
    free(x), free(xn), free(v), free(att), free(o), free(p), free(g), free(u), free(y), free(acc);
}

/* 24 tokens, each its own sequence at position 0, in one batch of a 1-layer model, against the float64
 * reference (f32 cache: nothing rounded to f16 between the two). */
static void check_moe_reference(const char *shape) {
    void *mem = NULL;
    hr_model *m = synth(shape, 1, HR_DTYPE_F32, &mem);
    if (!m) return;
    const hr_hparams *hp = hr_model_hparams(m);
    const int V = hp->n_vocab, N = 24;
    double worst = 0, min_gap = 1;
    float *logits = malloc(sizeof(float) * (size_t)V * 8);
    double *ref = malloc(sizeof(double) * (size_t)V);
    for (int round = 0; round < N / 8; round++) {
        moe_rig r = rig_open(m, HR_KV_F32, 8, 2);
        if (!r.c) break;
        int32_t toks[8];
        int si[8], at[8] = {0};
        for (int i = 0; i < 8; i++) toks[i] = 3 + ((round * 8 + i) * 97) % (V - 3), si[i] = i;
        rig_step(&r, toks, si, 8, at, logits);
        for (int i = 0; i < 8; i++) {
            double gap = 0, top = 0, d = 0;
            moe_ref_first_token(m, toks[i], ref, &gap);
            for (int v = 0; v < V; v++) top = fmax(top, fabs(ref[v]));
            for (int v = 0; v < V; v++) d = fmax(d, fabs(logits[(size_t)i * V + v] - ref[v]) / top);
            worst = fmax(worst, d);
            min_gap = fmin(min_gap, gap);
        }
        rig_close(&r);
    }
    /* a near tie between the k-th and (k+1)-th expert would let a rounding pick either: the gaps here are
     * far above f32's rounding of the probabilities (~1e-7) */
    CHECKF(min_gap > 1e-6, "%s: router near tie %.3g", shape, min_gap);
    CHECKF(worst < 1e-5, "%s: logits %.3g (relative) from the float64 reference", shape, worst);
    printf("%s (1 layer): %d tokens, logits within %.2e of float64 (bound 1e-5), smallest top-k gap %.3g\n", shape, N,
           worst, min_gap);
    free(logits);
    free(ref);
    hr_model_destroy(m);
    free(mem);
}

static void check_moe(void) {
    check_moe_reference("qwen3moe-tiny");
    check_moe_reference("mixtral-tiny");
    float *k32 = calloc(2048, sizeof(float)), *kq = calloc(2048, sizeof(float));
    check_moe_batch_invariance("mixtral-tiny", HR_DTYPE_F32, k32);
    check_moe_batch_invariance("qwen3moe-tiny", HR_DTYPE_Q8_0, kq);
    check_moe_batch_invariance("qwen3moe-small", HR_DTYPE_F32, k32);
    /* quantized experts (every expert matrix of qwen3moe-small in the type: rows of 256): the last
     * logits of sequence 0 near the f32 model's */
    const struct {
        hr_dtype type;
        double bound;
    } qs[] = {{HR_DTYPE_Q8_0, 0.02}, {HR_DTYPE_Q4_K, 0.15}};
    for (size_t i = 0; i < sizeof qs / sizeof *qs; i++) {
        check_moe_batch_invariance("qwen3moe-small", qs[i].type, kq);
        double top = 0, d = 0;
        for (int v = 0; v < 2048; v++) top = fmax(top, fabs(k32[v]));
        for (int v = 0; v < 2048; v++) d = fmax(d, fabs(kq[v] - k32[v]) / top);
        CHECKF(d < qs[i].bound, "qwen3moe-small %s: logits %.3g (relative) from f32's",
               hr_dtype_get_info(qs[i].type)->name, d);
        printf("qwen3moe-small %s: logits within %.3g of f32's (bound %g)\n", hr_dtype_get_info(qs[i].type)->name, d,
               qs[i].bound);
    }
    free(k32);
    free(kq);
}

/* ---- bad input ---- */

static void check_bad_input(void) {
    const char *dir = hr_test_tmpdir();
    size_t n;
    void *mem;
    /* an unknown architecture names the supported ones */
    hr_gguf_writer *w = hr_gguf_writer_create(3);
    hr_gguf_writer_set_str(w, "general.architecture", "gemma9");
    hr_error err = {0};
    CHECK(hr_gguf_writer_write_memory(w, &mem, &n, &err) == HR_OK);
    hr_gguf_writer_destroy(w);
    expect_load_error(mem, n, "llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3", dir, "unknown-arch.gguf");
    /* a missing key llama.cpp requires */
    mem = image("gemma2-tiny", -1, &n);
    rename_in(mem, n, "gemma2.attention.layer_norm_rms_epsilon", "gemma2.attention.layer_norm_rms_epsilox");
    expect_load_error(mem, n, "'gemma2.attention.layer_norm_rms_epsilon'", dir, "no-eps.gguf");
    /* a missing tensor of each family's own */
    mem = image("qwen3-tiny", -1, &n);
    rename_in(mem, n, "blk.1.attn_k_norm.weight", "blk.1.attn_k_norx.weight");
    expect_load_error(mem, n, "'blk.1.attn_k_norm.weight'", dir, "no-k-norm.gguf");
    mem = image("gemma2-tiny", -1, &n);
    rename_in(mem, n, "blk.3.post_ffw_norm.weight", "blk.3.post_ffw_norx.weight");
    expect_load_error(mem, n, "'blk.3.post_ffw_norm.weight'", dir, "no-post-ffw-norm.gguf");
    mem = image("gemma3-tiny", -1, &n);
    rename_in(mem, n, "blk.2.post_attention_norm.weight", "blk.2.post_attention_norx.weight");
    expect_load_error(mem, n, "'blk.2.post_attention_norm.weight'", dir, "no-post-attn-norm.gguf");
    mem = image("phi3-tiny", -1, &n);
    rename_in(mem, n, "blk.1.attn_qkv.weight", "blk.1.attn_qkx.weight");
    expect_load_error(mem, n, "'blk.1.attn_qkv.weight'", dir, "no-qkv.gguf");
    mem = image("phi3-tiny", -1, &n);
    rename_in(mem, n, "rope_factors_short.weight", "rope_factors_shorx.weight");
    expect_load_error(mem, n, "'rope_factors_short.weight'", dir, "no-rope-short.gguf");
    /* mis-shaped: a Q norm of D / 2, phi3's gate|up with F rows instead of 2F */
    mem = image("qwen3-tiny", -1, &n);
    reshape_in(mem, n, "blk.0.attn_q_norm.weight", 0, 16);
    expect_load_error(mem, n, "'blk.0.attn_q_norm.weight'", dir, "q-norm-shape.gguf");
    mem = image("phi3-tiny", -1, &n);
    reshape_in(mem, n, "blk.0.ffn_up.weight", 1, 128);
    expect_load_error(mem, n, "'blk.0.ffn_up.weight' has shape [64, 128]", dir, "gate-up-shape.gguf");
    /* experts: a missing stack, a stack of the wrong count, more experts used than there are, qwen3moe
     * without its expert count */
    mem = image("qwen3moe-tiny", -1, &n);
    rename_in(mem, n, "blk.1.ffn_up_exps.weight", "blk.1.ffn_up_expx.weight");
    expect_load_error(mem, n, "'blk.1.ffn_up_exps.weight'", dir, "no-up-exps.gguf");
    mem = image("mixtral-tiny", -1, &n);
    reshape_in(mem, n, "blk.0.ffn_down_exps.weight", 2, 2);
    expect_load_error(mem, n, "'blk.0.ffn_down_exps.weight' has shape [64, 64, 2]", dir, "exps-shape.gguf");
    mem = image("qwen3moe-tiny", -1, &n);
    rename_in(mem, n, "qwen3moe.expert_count", "qwen3moe.expert_counx");
    expect_load_error(mem, n, "'qwen3moe.expert_count'", dir, "no-expert-count.gguf");
    {
        hr_synth_shape s;
        hr_gguf_writer *wr = NULL;
        CHECK(hr_synth_shape_by_name("mixtral-tiny", &s, &err) == HR_OK);
        CHECK(hr_synth_build(&s, HR_DTYPE_F32, 1, &wr, &err) == HR_OK);
        hr_gguf_writer_set_u32(wr, "llama.expert_used_count", 5); /* of 4 */
        CHECK(hr_gguf_writer_write_memory(wr, &mem, &n, &err) == HR_OK);
        hr_gguf_writer_destroy(wr);
        expect_load_error(mem, n, "'llama.expert_used_count' = 5", dir, "used-over-count.gguf");
    }
    /* a window larger than the context (512) */
    mem = image("gemma3-tiny", 1024, &n);
    expect_load_error(mem, n, "'gemma3.attention.sliding_window' = 1024", dir, "big-window.gguf");

    /* the CLI: one line, exit 1; serve fails before it listens */
    char args[8400];
    snprintf(args, sizeof args, "run -m %s/no-qkv.gguf -p hi", dir);
    expect_cli_failure(args, "blk.1.attn_qkv.weight");
    snprintf(args, sizeof args, "run -m %s/unknown-arch.gguf -p hi", dir);
    expect_cli_failure(args, "gemma3");
    int port = hr_test_free_port();
    snprintf(args, sizeof args, "serve -m %s/big-window.gguf --host 127.0.0.1 --port %d", dir, port);
    expect_cli_failure(args, "gemma3.attention.sliding_window");
    snprintf(args, sizeof args, "serve -m %s/no-eps.gguf --host 127.0.0.1 --port %d", dir, port);
    expect_cli_failure(args, "layer_norm_rms_epsilon");
}

/* Each family end to end through `headroom run` (synth, tokenizer, engine): 5 tokens. */
static void check_cli_runs(void) {
    const char *dir = hr_test_tmpdir();
    const char *shapes[] = {"qwen3-tiny",    "gemma2-tiny",  "gemma3-tiny",    "phi3-tiny",
                            "qwen3moe-tiny", "mixtral-tiny", "deepseek2-tiny", "deepseek3-tiny"};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        char args[8400], *out = NULL;
        snprintf(args, sizeof args, "synth --shape %s --type q8_0 -o %s/%s.gguf", shapes[i], dir, shapes[i]);
        CHECK(hr_test_run_cli(args, NULL, NULL) == 0);
        snprintf(args, sizeof args, "run -m %s/%s.gguf -p 'the cat' -n 5 --temp 0 --json --ignore-eos", dir, shapes[i]);
        CHECKF(hr_test_run_cli(args, &out, NULL) == 0, "%s", args);
        json_error_t je;
        json_t *j = out ? json_loads(out, 0, &je) : NULL;
        CHECKF(j && json_integer_value(json_object_get(j, "completion_tokens")) == 5, "%s: %s", shapes[i],
               out ? out : "");
        json_decref(j);
        free(out);
    }
}

/* A policy window wider than the model's own: meaningful for gemma (its full layers then see the
 * policy's window, its window layers their own) and allowed; refused for mistral, where every layer
 * already has the narrower window. Through the CLI: gemma2-tiny runs window:32 past its 16-token
 * windows. */
static void check_policy_windows(void) {
    const char *shapes[] = {"gemma2-tiny", "mistral-tiny"};
    for (int i = 0; i < 2; i++) {
        hr_synth_shape s;
        hr_model *m = NULL;
        void *mem = NULL;
        hr_error err = {0};
        CHECK(hr_synth_shape_by_name(shapes[i], &s, &err) == HR_OK);
        CHECK(hr_synth_model(&s, HR_DTYPE_F32, 1, &m, &mem, &err) == HR_OK);
        if (!m) continue;
        const hr_hparams *hp = hr_model_hparams(m);
        hr_kv_config kc = {.n_layers = hp->n_layer,
                           .n_kv_heads = hp->n_head_kv,
                           .head_dim = hp->head_dim,
                           .block_size = 16,
                           .k_format = HR_KV_F16,
                           .v_format = HR_KV_F16,
                           .max_seqs = 1};
        kc.budget_bytes = hr_kv_block_bytes(&kc) * 8;
        hr_kv_pool *kv = NULL;
        hr_model_ctx *c = NULL;
        hr_model_ctx_params mp = {.n_threads = 1, .max_batch_tokens = 4, .max_ctx = 64};
        CHECK(hr_kv_pool_create(&kc, &kv, &err) == HR_OK && hr_model_ctx_create(m, kv, &mp, &c, &err) == HR_OK);
        hr_kv_policy pol;
        char text[32];
        snprintf(text, sizeof text, "window:%d", 2 * s.sliding_window);
        CHECK(hr_kv_policy_parse(text, &pol, &err) == HR_OK);
        hr_status st = hr_kv_policy_check(kv, &pol, &err);
        CHECKF(i == 0 ? st == HR_OK : st == HR_ERR_INVALID_ARG, "%s %s: status %d (%s)", shapes[i], text, st,
               st ? err.msg : "");
        CHECK(hr_kv_policy_parse("h2o:32", &pol, &err) == HR_OK); /* token eviction: never beside a window */
        CHECK(hr_kv_policy_check(kv, &pol, &err) == HR_ERR_INVALID_ARG);
        hr_model_ctx_destroy(c);
        hr_kv_pool_destroy(kv);
        hr_model_destroy(m);
        free(mem);
    }
    const char *dir = hr_test_tmpdir();
    char args[8400], *out = NULL;
    snprintf(args, sizeof args, "synth --shape gemma2-tiny --type f32 -o %s/g2-policy.gguf", dir);
    CHECK(hr_test_run_cli(args, NULL, NULL) == 0);
    snprintf(args, sizeof args,
             "run -m %s/g2-policy.gguf --kv-policy window:32 -p 'the cat sat on the mat' -n 48 --temp 0 --json "
             "--ignore-eos",
             dir);
    CHECKF(hr_test_run_cli(args, &out, NULL) == 0, "%s: %s", args, out ? out : "");
    json_error_t je;
    json_t *j = out ? json_loads(out, 0, &je) : NULL;
    CHECK(j && json_integer_value(json_object_get(j, "completion_tokens")) == 48);
    json_decref(j);
    free(out);
}

/* The per-layer description a KV manager groups layers by. */
static void check_layer_attn(void) {
    struct {
        const char *shape;
        const char *kinds; /* W: window, F: full */
        float base_w, base_f;
    } cases[] = {{"gemma2-tiny", "WFWF", 10000.0f, 10000.0f},
                 {"gemma3-tiny", "WWWWWF", 10000.0f, 1000000.0f},
                 {"qwen3-tiny", "FF", 0, 1000000.0f},
                 {"mistral-tiny", "WW", 10000.0f, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        hr_synth_shape s;
        hr_model *m = NULL;
        void *mem = NULL;
        hr_error err = {0};
        CHECK(hr_synth_shape_by_name(cases[c].shape, &s, &err) == HR_OK);
        CHECK(hr_synth_model(&s, HR_DTYPE_F32, 1, &m, &mem, &err) == HR_OK);
        if (!m) continue;
        const hr_hparams *hp = hr_model_hparams(m);
        const hr_layer_attn *la = hr_model_layer_attn(m);
        int n_win = 0;
        CHECK(hp->n_layer == (int)strlen(cases[c].kinds));
        for (int il = 0; il < hp->n_layer; il++) {
            bool win = cases[c].kinds[il] == 'W';
            n_win += win;
            CHECKF(la[il].kind == (win ? HR_ATTN_WINDOW : HR_ATTN_FULL) &&
                       la[il].window == (win ? s.sliding_window : 0),
                   "%s layer %d: kind %d window %d", cases[c].shape, il, la[il].kind, la[il].window);
            CHECKF(la[il].rope_base == (win ? cases[c].base_w : cases[c].base_f), "%s layer %d: base %g",
                   cases[c].shape, il, (double)la[il].rope_base);
        }
        CHECK(hp->n_window_layers == n_win);
        /* hparams' sliding_window: every layer's window or none (what the planner reads) */
        CHECK(hp->sliding_window == (n_win == hp->n_layer ? s.sliding_window : 0));
        hr_model_destroy(m);
        free(mem);
    }
}

#if HR_FAULT
/* Fault build: loading each family's model and creating its forward context with the Nth allocation
 * failing, for every N the clean run makes, ends in a clean error (or success) and leaks nothing
 * (LeakSanitizer at exit). */
static void check_alloc_faults(void) {
    static const char *const shapes[] = {"qwen3-tiny", "gemma2-tiny", "gemma3-tiny", "phi3-tiny", "qwen3moe-tiny"};
    check_shapes_alloc_faults(shapes, sizeof shapes / sizeof *shapes);
}
#else
static void check_alloc_faults(void) {}
#endif

int main(void) {
    check_layer_attn();
    check_llamacpp_ids("arch-llamacpp.jsonl", 64);
    check_moe();
    check_bad_input();
    check_cli_runs();
    check_alloc_faults();
    check_policy_windows();
    return hr_test_finish();
}

/* test_model_gptoss.c: gpt-oss (llama.cpp's openai-moe) against independent implementations, and its bad
 * input.
 *   - llama.cpp's greedy ids: tests/vectors/gptoss-llamacpp.jsonl records what llama.cpp (CPU, f16 K/V,
 *     flash attention off, one thread) generated on `headroom synth --shape gpt-oss-tiny` (seed 1), 8
 *     prompts x 64 tokens: with f32 weights headroom generates the same 64 ids and llama.cpp's 8 largest
 *     logits at steps 0, 21, 42 and 63 lie within 1e-3 of the step's largest (measured 1.6e-4 over all
 *     logits); with MXFP4 experts (--type mxfp4: the rest q8_0) the first 24 ids are equal and step 0's
 *     top logits within 2e-2 (measured 8e-8; later steps part at near ties through the q8_0 activations'
 *     roundings, 6 of 8 prompts equal over 64 tokens, as qwen3moe-tiny in q8_0 parts too).
 *   - the float64 reference: a 40-token prompt through both layers (a 16-token window layer, a full
 *     one), written here from the model card's math: Q/K/V/O biases, YaRN (factor 32 over 4096, beta
 *     32 / 1, mscale 1 + 0.1 ln 32), sinks in each softmax's denominator, router bias, top-4 of the
 *     logits then softmax over them, expert biases, swiglu_oai; every logit of every position.
 *   - batch invariance: a sequence's logits bit-identical alone and batched (f32, MXFP4, q8_0, f16).
 *   - bad input: a missing sink / bias / window key, an expert stack of the wrong count, a window
 *     larger than the context, an MXFP4 block with the NaN scale: one message naming it; through the
 *     CLI exit 1 and one line.
 * Every forward runs on HEADROOM_ISA's kernels where set (test_model_gptoss_isa_*: the scalar, AVX2 and
 * AVX-512 MXFP4 kernels give the same bits, so the same ids and bounds). */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fault.h"
#include "harness.h"
#include "model/model.h"
#include "model/synth.h"
#include "model_images.h"

#define N_GEN 64

static const char *g_isa; /* HEADROOM_ISA (the *_isa_* variants), or NULL: the CPU's default kernels */

static hr_model *synth(const char *shape, hr_dtype type, void **mem) {
    hr_synth_shape s;
    hr_model *m = NULL;
    hr_error err = {0};
    CHECK(hr_synth_shape_by_name(shape, &s, &err) == HR_OK);
    CHECKF(hr_synth_model(&s, type, 1, &m, mem, &err) == HR_OK, "%s: %s", shape, err.msg);
    return m;
}

/* A forward rig: a pool of `fmt` for n_seqs sequences of up to 64 tokens, batches up to 16 tokens. */
typedef struct rig {
    hr_kv_pool *kv;
    hr_model_ctx *c;
    hr_kv_seq seq[4];
    int at[4];
} rig;

static rig rig_open(const hr_model *m, hr_kv_format fmt, int n_seqs) {
    const hr_hparams *hp = hr_model_hparams(m);
    rig r = {0};
    hr_kv_config kc = {.n_layers = hp->n_layer,
                       .n_kv_heads = hp->n_head_kv,
                       .head_dim = hp->head_dim,
                       .block_size = 16,
                       .k_format = fmt,
                       .v_format = fmt,
                       .max_seqs = n_seqs};
    kc.budget_bytes = hr_kv_block_bytes(&kc) * (uint64_t)(6 * n_seqs + 2);
    hr_model_ctx_params mp = {.n_threads = 2, .max_batch_tokens = 16, .max_ctx = 80, .force_isa = g_isa};
    hr_error err = {0};
    CHECKF(hr_kv_pool_create(&kc, &r.kv, &err) == HR_OK && hr_model_ctx_create(m, r.kv, &mp, &r.c, &err) == HR_OK, "%s",
           err.msg);
    for (int i = 0; r.c && i < n_seqs; i++) CHECK(hr_kv_seq_create(r.kv, &r.seq[i], &err) == HR_OK);
    return r;
}

static void rig_close(rig *r) {
    hr_model_ctx_destroy(r->c);
    hr_kv_pool_destroy(r->kv);
}

/* n tokens appended to sequence q (n <= 16), logits for every one of them (or only the last). */
static void rig_feed(rig *r, int q, const int32_t *toks, int n, bool all, float *logits) {
    int32_t pos[16];
    hr_kv_seq seq[16];
    uint8_t want[16];
    hr_error err = {0};
    for (int i = 0; i < n; i++) pos[i] = r->at[q] + i, seq[i] = r->seq[q], want[i] = all || i == n - 1;
    CHECK(hr_kv_seq_reserve(r->kv, r->seq[q], r->at[q] + n, &err) == HR_OK);
    hr_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .seq = seq, .want_logits = want};
    CHECKF(hr_model_forward(r->c, &b, logits, &err) == HR_OK, "%s", err.msg);
    hr_kv_seq_commit(r->kv, r->seq[q], toks, n);
    r->at[q] += n;
}

/* ---- llama.cpp's ids ---- */

static void check_llamacpp(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/vectors/gptoss-llamacpp.jsonl", HR_SOURCE_DIR);
    FILE *f = fopen(path, "r");
    CHECKF(f != NULL, "cannot open %s", path);
    if (!f) return;
    char line[8192], loaded[32] = "";
    hr_model *m = NULL;
    void *mem = NULL;
    int n_lines = 0;
    double worst[2] = {0, 0};
    while (fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        CHECK(o != NULL);
        if (!o) continue;
        const char *type = json_string_value(json_object_get(o, "type"));
        const bool mx = type && !strcmp(type, "mxfp4");
        if (type && strcmp(type, loaded)) {
            hr_model_destroy(m);
            free(mem);
            m = synth("gpt-oss-tiny", mx ? HR_DTYPE_MXFP4 : HR_DTYPE_F32, &mem);
            snprintf(loaded, sizeof loaded, "%s", type);
        }
        if (!m) break;
        json_t *pt = json_object_get(o, "prompt_tokens"), *ct = json_object_get(o, "completion_tokens");
        const int V = hr_model_hparams(m)->n_vocab, np = (int)json_array_size(pt);
        CHECK(np <= 16 && json_array_size(ct) == N_GEN);
        rig r = rig_open(m, HR_KV_F16, 1);
        if (!r.c) break;
        float *lg = malloc(sizeof(float) * (size_t)V), *kept = malloc(sizeof(float) * (size_t)V * 4);
        int32_t toks[16];
        for (int i = 0; i < np && i < 16; i++) toks[i] = (int32_t)json_integer_value(json_array_get(pt, i));
        int first_diff = -1, n = np;
        for (int g = 0; g < N_GEN; g++) { /* the prompt as one batch, then a token a step, as llama.cpp ran it */
            rig_feed(&r, 0, toks, n, false, lg);
            int best = 0;
            for (int v = 1; v < V; v++) best = lg[v] > lg[best] ? v : best;
            if (g % 21 == 0) memcpy(kept + (size_t)(g / 21) * V, lg, sizeof(float) * (size_t)V);
            if (first_diff < 0 && best != json_integer_value(json_array_get(ct, g))) first_diff = g;
            toks[0] = (int32_t)json_integer_value(json_array_get(ct, g)); /* llama.cpp's path from here on */
            n = 1;
        }
        rig_close(&r);
        /* llama.cpp's 8 largest logits, headroom's at those ids, relative to the largest (f32: all 4
         * steps; mxfp4: step 0) */
        json_t *tops = json_object_get(o, "top_logits");
        for (size_t k = 0; k < (mx ? 1 : json_array_size(tops)); k++) {
            json_t *tid = json_object_get(json_array_get(tops, k), "ids"),
                   *tl = json_object_get(json_array_get(tops, k), "logits");
            const double top = fabs(json_real_value(json_array_get(tl, 0)));
            for (size_t i = 0; i < json_array_size(tid); i++) {
                const int64_t id = json_integer_value(json_array_get(tid, i));
                CHECK(id >= 0 && id < V);
                if (id >= 0 && id < V)
                    worst[mx] =
                        fmax(worst[mx],
                             fabs(kept[k * (size_t)V + (size_t)id] - json_real_value(json_array_get(tl, i))) / top);
            }
        }
        const int must = mx ? 24 : N_GEN;
        CHECKF(first_diff < 0 || first_diff >= must, "%s prompt %d: id %d differs from llama.cpp's", type, n_lines % 8,
               first_diff);
        free(lg);
        free(kept);
        n_lines++;
        json_decref(o);
    }
    fclose(f);
    hr_model_destroy(m);
    free(mem);
    CHECK(n_lines == 16);
    CHECKF(worst[0] < 1e-3 && worst[1] < 2e-2, "top logits %.3g (f32), %.3g (mxfp4) from llama.cpp's", worst[0],
           worst[1]);
    printf("llama.cpp: gpt-oss-tiny f32 64 of 64 ids on 8 prompts, top logits within %.2e (bound 1e-3); mxfp4 "
           "experts 24 ids on 8 prompts, step-0 top logits within %.2e (bound 2e-2)\n",
           worst[0], worst[1]);
}

/* ---- the float64 reference ---- */

static const float *f32_tensor(const hr_model *m, const char *name) {
    const hr_gguf_tensor *t = hr_gguf_find_tensor(hr_model_gguf(m), name);
    CHECKF(t && t->type == HR_DTYPE_F32, "%s: absent or not f32", name);
    return t && t->type == HR_DTYPE_F32 ? t->data : NULL;
}

static const float *lt(const hr_model *m, int il, const char *suffix) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", il, suffix);
    return f32_tensor(m, name);
}

/* y = W x (+ b), W rows x cols f32, in double */
static void mv(const float *W, const float *b, const double *x, int rows, int cols, double *y) {
    for (int r = 0; r < rows; r++) {
        double acc = b ? b[r] : 0.0;
        for (int c = 0; c < cols; c++) acc += (double)W[(size_t)r * cols + c] * x[c];
        y[r] = acc;
    }
}

static void rms(double *out, const double *x, const float *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const double inv = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * inv * w[i];
}

/* NeoX rotation of one head by position p with YaRN: pair i turns b^(-2i/n) ((1 - r_i) / s + r_i), the
 * ramp r_i = 1 - clamp((i - lo) / (hi - lo), 0, 1) between lo = floor(corr(32)) and hi = ceil(corr(1)),
 * corr(n_rot) = n ln(orig / (2 pi n_rot)) / (2 ln b) (the YaRN paper's by-parts rule); rotated dims
 * times 1 + 0.1 ln s. */
static void rope64(double *x, int D, int p, double base, double s, int orig) {
    const double corr_fast = D * log(orig / (32.0 * 2 * M_PI)) / (2 * log(base));
    const double corr_slow = D * log(orig / (1.0 * 2 * M_PI)) / (2 * log(base));
    const double lo = fmax(0, floor(corr_fast)), hi = fmin(D - 1, ceil(corr_slow)), ms = 1 + 0.1 * log(s);
    for (int i = 0; i < D / 2; i++) {
        const double ramp = 1 - fmin(1, fmax(0, (i - lo) / fmax(0.001, hi - lo)));
        const double th = p * pow(base, -2.0 * i / D) * ((1 - ramp) / s + ramp);
        const double a = x[i], b = x[i + D / 2];
        x[i] = (a * cos(th) - b * sin(th)) * ms;
        x[i + D / 2] = (a * sin(th) + b * cos(th)) * ms;
    }
}

/* Logits (n x V) of tokens toks[0..n) as one sequence from position 0, in double. *gap: the smallest
 * distance between the k-th and (k+1)-th router logit over every token and layer. */
static void ref_forward(const hr_model *m, const int32_t *toks, int n, double *logits, double *gap) {
    const hr_hparams *hp = hr_model_hparams(m);
    const hr_layer_attn *la = hr_model_layer_attn(m);
    const int E = hp->n_embd, D = hp->head_dim, H = hp->n_head, Hkv = hp->n_head_kv, NE = hp->n_expert,
              K = hp->n_expert_used, Fe = hp->n_ff_exp, V = hp->n_vocab;
    const double eps = hp->norm_eps;
    double *x = calloc((size_t)n * E, sizeof(double)), *xn = calloc((size_t)E, sizeof(double)),
           *q = calloc((size_t)n * H * D, sizeof(double)), *k = calloc((size_t)n * Hkv * D, sizeof(double)),
           *v = calloc((size_t)n * Hkv * D, sizeof(double)), *att = calloc((size_t)H * D, sizeof(double)),
           *o = calloc((size_t)E, sizeof(double)), *sc = calloc((size_t)n, sizeof(double)),
           *lg = calloc((size_t)NE, sizeof(double)), *g = calloc((size_t)Fe, sizeof(double)),
           *u = calloc((size_t)Fe, sizeof(double)), *y = calloc((size_t)E, sizeof(double));
    const float *emb = f32_tensor(m, "token_embd.weight");
    *gap = 1e9;
    for (int t = 0; emb && t < n; t++)
        for (int i = 0; i < E; i++) x[(size_t)t * E + i] = emb[(size_t)toks[t] * E + i];
    for (int il = 0; il < hp->n_layer; il++) {
        const float *an = lt(m, il, "attn_norm.weight"), *wq = lt(m, il, "attn_q.weight"),
                    *bq = lt(m, il, "attn_q.bias"), *wk = lt(m, il, "attn_k.weight"), *bk = lt(m, il, "attn_k.bias"),
                    *wv = lt(m, il, "attn_v.weight"), *bv = lt(m, il, "attn_v.bias"),
                    *wo = lt(m, il, "attn_output.weight"), *bo = lt(m, il, "attn_output.bias"),
                    *sinks = lt(m, il, "attn_sinks.weight"), *fn = lt(m, il, "post_attention_norm.weight"),
                    *wr = lt(m, il, "ffn_gate_inp.weight"), *br = lt(m, il, "ffn_gate_inp.bias"),
                    *wg = lt(m, il, "ffn_gate_exps.weight"), *bg = lt(m, il, "ffn_gate_exps.bias"),
                    *wu = lt(m, il, "ffn_up_exps.weight"), *bu = lt(m, il, "ffn_up_exps.bias"),
                    *wd = lt(m, il, "ffn_down_exps.weight"), *bd = lt(m, il, "ffn_down_exps.bias");
        if (!an || !wq || !bq || !wk || !bk || !wv || !bv || !wo || !bo || !sinks || !fn || !wr || !br || !wg || !bg ||
            !wu || !bu || !wd || !bd)
            goto done;
        for (int t = 0; t < n; t++) {
            rms(xn, x + (size_t)t * E, an, E, eps);
            mv(wq, bq, xn, H * D, E, q + (size_t)t * H * D);
            mv(wk, bk, xn, Hkv * D, E, k + (size_t)t * Hkv * D);
            mv(wv, bv, xn, Hkv * D, E, v + (size_t)t * Hkv * D);
            for (int h = 0; h < H; h++) rope64(q + ((size_t)t * H + h) * D, D, t, hp->rope_base, 32.0, 4096);
            for (int h = 0; h < Hkv; h++) rope64(k + ((size_t)t * Hkv + h) * D, D, t, hp->rope_base, 32.0, 4096);
        }
        const int W = il % 2 == 0 ? 16 : 0; /* even layers: a 16-token window */
        CHECK(la[il].window == W);
        for (int t = 0; t < n; t++) {
            for (int h = 0; h < H; h++) {
                const int kh = h / (H / Hkv), t0 = W > 0 && t - W + 1 > 0 ? t - W + 1 : 0;
                double mx = sinks[h];
                for (int s = t0; s <= t; s++) {
                    double d = 0;
                    for (int i = 0; i < D; i++) d += q[((size_t)t * H + h) * D + i] * k[((size_t)s * Hkv + kh) * D + i];
                    sc[s] = d / sqrt((double)D);
                    mx = fmax(mx, sc[s]);
                }
                double sum = exp(sinks[h] - mx);
                for (int s = t0; s <= t; s++) sum += (sc[s] = exp(sc[s] - mx));
                for (int i = 0; i < D; i++) {
                    double a = 0;
                    for (int s = t0; s <= t; s++) a += sc[s] * v[((size_t)s * Hkv + kh) * D + i];
                    att[h * D + i] = a / sum;
                }
            }
            mv(wo, bo, att, E, H * D, o);
            double *xt = x + (size_t)t * E;
            for (int i = 0; i < E; i++) xt[i] += o[i];
        }
        for (int t = 0; t < n; t++) {
            double *xt = x + (size_t)t * E;
            rms(xn, xt, fn, E, eps);
            mv(wr, br, xn, NE, E, lg);
            int sel[16];
            double w[16], mx = 0, sum = 0;
            for (int j = 0; j <= K && j < NE; j++) { /* K + 1 largest: the last only for the gap */
                int best = -1;
                for (int e = 0; e < NE; e++) {
                    bool taken = false;
                    for (int i = 0; i < j; i++) taken |= sel[i] == e;
                    if (!taken && (best < 0 || lg[e] > lg[best])) best = e;
                }
                sel[j] = best;
                w[j] = lg[best];
            }
            if (K < NE) *gap = fmin(*gap, w[K - 1] - w[K]);
            mx = w[0];
            for (int j = 0; j < K; j++) sum += (w[j] = exp(w[j] - mx));
            double acc[512] = {0};
            for (int j = 0; j < K; j++) {
                const size_t e = (size_t)sel[j];
                mv(wg + e * Fe * E, bg + e * Fe, xn, Fe, E, g);
                mv(wu + e * Fe * E, bu + e * Fe, xn, Fe, E, u);
                for (int i = 0; i < Fe; i++) {
                    const double gg = fmin(g[i], 7.0), uu = fmin(fmax(u[i], -7.0), 7.0);
                    g[i] = gg / (1 + exp(-1.702 * gg)) * (uu + 1);
                }
                mv(wd + e * E * Fe, bd + e * E, g, E, Fe, y);
                for (int i = 0; i < E && i < 512; i++) acc[i] += w[j] / sum * y[i];
            }
            for (int i = 0; i < E && i < 512; i++) xt[i] += acc[i];
        }
    }
    const float *on = f32_tensor(m, "output_norm.weight"), *out = f32_tensor(m, "output.weight");
    for (int t = 0; on && out && t < n; t++) {
        rms(xn, x + (size_t)t * E, on, E, eps);
        mv(out, NULL, xn, V, E, logits + (size_t)t * V);
    }
done:
    free(x), free(xn), free(q), free(k), free(v), free(att), free(o), free(sc), free(lg), free(g), free(u), free(y);
}

static void check_reference(void) {
    void *mem = NULL;
    hr_model *m = synth("gpt-oss-tiny", HR_DTYPE_F32, &mem);
    if (!m) return;
    const hr_hparams *hp = hr_model_hparams(m);
    CHECK(hp->arch == HR_ARCH_GPT_OSS && hp->attn_sinks && hp->moe_softmax_topk && hp->yarn_factor == 32.0f &&
          hp->n_ctx_orig == 4096 && hp->n_window_layers == 1 && fabsf(hp->rope_attn_factor - 1.34657359f) < 1e-6f);
    enum { N = 40 };
    const int V = hp->n_vocab;
    int32_t toks[N];
    for (int i = 0; i < N; i++) toks[i] = 3 + (i * 389 + 17) % (V - 3);
    double *ref = malloc(sizeof(double) * (size_t)N * V), gap = 0;
    float *got = malloc(sizeof(float) * (size_t)N * V);
    ref_forward(m, toks, N, ref, &gap);
    rig r = rig_open(m, HR_KV_F32, 1);
    if (r.c) { /* chunks of 16, 16, 7, then one token (two batch shapes) */
        rig_feed(&r, 0, toks, 16, true, got);
        rig_feed(&r, 0, toks + 16, 16, true, got + (size_t)16 * V);
        rig_feed(&r, 0, toks + 32, 7, true, got + (size_t)32 * V);
        rig_feed(&r, 0, toks + 39, 1, true, got + (size_t)39 * V);
        rig_close(&r);
    }
    double worst = 0;
    for (int t = 0; t < N; t++) {
        double top = 0;
        for (int v = 0; v < V; v++) top = fmax(top, fabs(ref[(size_t)t * V + v]));
        for (int v = 0; v < V; v++) worst = fmax(worst, fabs(got[(size_t)t * V + v] - ref[(size_t)t * V + v]) / top);
    }
    /* a near tie between the router's k-th and (k+1)-th logit would let a rounding pick either */
    CHECKF(gap > 1e-4, "router near tie %.3g", gap);
    CHECKF(worst < 1e-5, "logits %.3g (relative) from the float64 reference", worst);
    printf("float64 reference: gpt-oss-tiny, 40 positions (window 16 crossed), logits within %.2e (bound 1e-5), "
           "smallest top-k gap %.3g\n",
           worst, gap);
    free(ref);
    free(got);
    hr_model_destroy(m);
    free(mem);
}

/* Three sequences: each alone, then all three in one batch per step (prompts, then 3 decode steps):
 * every logit row bit-identical. */
static void check_batch_invariance(hr_dtype type) {
    void *mem = NULL;
    hr_model *m = synth("gpt-oss-tiny", type, &mem);
    if (!m) return;
    const int V = hr_model_hparams(m)->n_vocab, NS = 3, STEPS = 3;
    float *alone = malloc(sizeof(float) * (size_t)V * NS * (STEPS + 1)), *lg = malloc(sizeof(float) * (size_t)V * 16);
    int32_t prompts[3][6];
    for (int q = 0; q < NS; q++)
        for (int i = 0; i < 4 + q; i++) prompts[q][i] = 3 + (q * 211 + i * 53) % (V - 3);
    for (int q = 0; q < NS; q++) {
        rig r = rig_open(m, HR_KV_F16, 1);
        if (!r.c) break;
        rig_feed(&r, 0, prompts[q], 4 + q, false, lg);
        memcpy(alone + (size_t)q * (STEPS + 1) * V, lg, sizeof(float) * (size_t)V);
        for (int s = 0; s < STEPS; s++) {
            int32_t t = 100 + 7 * s + q;
            rig_feed(&r, 0, &t, 1, false, lg);
            memcpy(alone + ((size_t)q * (STEPS + 1) + 1 + s) * V, lg, sizeof(float) * (size_t)V);
        }
        rig_close(&r);
    }
    rig r = rig_open(m, HR_KV_F16, NS);
    int n_diff = 0;
    if (r.c) {
        hr_error err = {0};
        for (int s = 0; s <= STEPS; s++) {
            int32_t toks[16], pos[16];
            hr_kv_seq seq[16];
            uint8_t want[16];
            int n = 0, last[3];
            for (int q = 0; q < NS; q++) {
                const int cnt = s == 0 ? 4 + q : 1;
                for (int i = 0; i < cnt; i++) {
                    toks[n] = s == 0 ? prompts[q][i] : 100 + 7 * (s - 1) + q;
                    pos[n] = r.at[q] + i, seq[n] = r.seq[q], want[n] = i == cnt - 1;
                    n++;
                }
                last[q] = n - 1;
                CHECK(hr_kv_seq_reserve(r.kv, r.seq[q], r.at[q] + cnt, &err) == HR_OK);
            }
            hr_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .seq = seq, .want_logits = want};
            CHECKF(hr_model_forward(r.c, &b, lg, &err) == HR_OK, "%s", err.msg);
            for (int q = 0, row = 0; q < NS; q++) {
                const int first = q == 0 ? 0 : last[q - 1] + 1;
                hr_kv_seq_commit(r.kv, r.seq[q], toks + first, last[q] - first + 1);
                r.at[q] += last[q] - first + 1;
                n_diff += memcmp(lg + (size_t)row++ * V, alone + ((size_t)q * (STEPS + 1) + s) * V,
                                 sizeof(float) * (size_t)V) != 0;
            }
        }
        rig_close(&r);
    }
    CHECKF(n_diff == 0, "gpt-oss-tiny %s: %d logit rows differ batched from alone", hr_dtype_get_info(type)->name,
           n_diff);
    printf("gpt-oss-tiny %s: %d logit rows bit-identical alone and batched\n", hr_dtype_get_info(type)->name,
           NS * (STEPS + 1) - n_diff);
    free(alone);
    free(lg);
    hr_model_destroy(m);
    free(mem);
}

/* ---- bad input ---- */

static void *image(hr_dtype type, int window, size_t *size) {
    hr_synth_shape s;
    hr_error err = {0};
    hr_gguf_writer *w = NULL;
    void *mem = NULL;
    CHECK(hr_synth_shape_by_name("gpt-oss-tiny", &s, &err) == HR_OK);
    if (window >= 0) s.sliding_window = window;
    CHECK(hr_synth_build(&s, type, 1, &w, &err) == HR_OK);
    CHECK(hr_gguf_writer_write_memory(w, &mem, size, &err) == HR_OK);
    hr_gguf_writer_destroy(w);
    return mem;
}

static void check_bad_input(void) {
    size_t n;
    void *mem = image(HR_DTYPE_F32, -1, &n);
    rename_in(mem, n, "blk.1.attn_sinks.weight", "blk.1.attn_sinkx.weight");
    expect_load_error(mem, n, "'blk.1.attn_sinks.weight'", hr_test_tmpdir(), "no-sinks.gguf");
    mem = image(HR_DTYPE_F32, -1, &n);
    rename_in(mem, n, "blk.0.ffn_down_exps.bias", "blk.0.ffn_down_expx.bias");
    expect_load_error(mem, n, "'blk.0.ffn_down_exps.bias'", hr_test_tmpdir(), "no-down-bias.gguf");
    mem = image(HR_DTYPE_F32, -1, &n);
    rename_in(mem, n, "blk.0.post_attention_norm.weight", "blk.0.post_attention_norx.weight");
    expect_load_error(mem, n, "'blk.0.post_attention_norm.weight'", hr_test_tmpdir(), "no-ffn-norm.gguf");
    mem = image(HR_DTYPE_F32, -1, &n);
    rename_in(mem, n, "gpt-oss.attention.sliding_window", "gpt-oss.attention.sliding_windox");
    expect_load_error(mem, n, "'gpt-oss.attention.sliding_window'", hr_test_tmpdir(), "no-window.gguf");
    mem = image(HR_DTYPE_F32, -1, &n);
    rename_in(mem, n, "gpt-oss.expert_feed_forward_length", "gpt-oss.expert_feed_forward_lengtx");
    expect_load_error(mem, n, "'gpt-oss.expert_feed_forward_length'", hr_test_tmpdir(), "no-exp-ff.gguf");
    { /* 9 experts claimed, 8 stacked */
        hr_synth_shape s;
        hr_gguf_writer *w = NULL;
        hr_error err = {0};
        CHECK(hr_synth_shape_by_name("gpt-oss-tiny", &s, &err) == HR_OK);
        CHECK(hr_synth_build(&s, HR_DTYPE_F32, 1, &w, &err) == HR_OK);
        hr_gguf_writer_set_u32(w, "gpt-oss.expert_count", 9);
        CHECK(hr_gguf_writer_write_memory(w, &mem, &n, &err) == HR_OK);
        hr_gguf_writer_destroy(w);
        expect_load_error(mem, n, "'blk.0.ffn_gate_inp.weight' has shape [64, 8]", hr_test_tmpdir(),
                          "expert-count.gguf");
    }
    mem = image(HR_DTYPE_F32, 262144, &n); /* the context is 131072 */
    expect_load_error(mem, n, "'gpt-oss.attention.sliding_window' = 262144 is larger than the context",
                      hr_test_tmpdir(), "big-window.gguf");
    /* an MXFP4 block with the scale byte 0xFF: block 5 of blk.1.ffn_up_exps */
    mem = image(HR_DTYPE_MXFP4, -1, &n);
    hr_gguf *g = NULL;
    hr_error err = {0};
    CHECK(hr_gguf_open_memory(mem, n, &g, &err) == HR_OK);
    const hr_gguf_tensor *t = g ? hr_gguf_find_tensor(g, "blk.1.ffn_up_exps.weight") : NULL;
    CHECK(t && t->type == HR_DTYPE_MXFP4);
    const size_t off = t ? (size_t)((const char *)t->data - (const char *)mem) : 0;
    hr_gguf_close(g);
    ((unsigned char *)mem)[off + 5 * sizeof(hr_block_mxfp4)] = 0xFF;
    expect_load_error(mem, n, "'blk.1.ffn_up_exps.weight': MXFP4 block 5 (row 2) has the scale byte 0xFF",
                      hr_test_tmpdir(), "nan-scale.gguf");
    /* the CLI: one line, exit 1; serve never listens */
    const struct {
        const char *cmd, *file, *needle;
    } cli[] = {{"run", "nan-scale.gguf", "0xFF"},
               {"serve", "no-sinks.gguf", "blk.1.attn_sinks.weight"},
               {"serve", "big-window.gguf", "sliding_window"}};
    for (size_t i = 0; i < sizeof cli / sizeof *cli; i++) {
        char args[8400], *out = NULL, *e = NULL;
        if (!strcmp(cli[i].cmd, "run"))
            snprintf(args, sizeof args, "run -m %s/%s -p hi", hr_test_tmpdir(), cli[i].file);
        else
            snprintf(args, sizeof args, "serve -m %s/%s --host 127.0.0.1 --port %d", hr_test_tmpdir(), cli[i].file,
                     hr_test_free_port());
        const int rc = hr_test_run_cli(args, &out, &e);
        CHECKF(rc == 1 && count_lines(e) == 1 && strstr(e, cli[i].needle), "'%s': exit %d, stderr '%s'", args, rc,
               e ? e : "");
        free(out);
        free(e);
    }
}

/* The CLI end to end on MXFP4 experts, and the layers' kinds (even layers a window of 16). */
static void check_cli_and_layers(void) {
    char args[8400], *out = NULL;
    snprintf(args, sizeof args, "synth --shape gpt-oss-tiny --type mxfp4 -o %s/oss-mx.gguf", hr_test_tmpdir());
    CHECK(hr_test_run_cli(args, NULL, NULL) == 0);
    snprintf(args, sizeof args, "run -m %s/oss-mx.gguf -p 'the cat' -n 5 --temp 0 --json --ignore-eos --ctx 256",
             hr_test_tmpdir());
    CHECKF(hr_test_run_cli(args, &out, NULL) == 0, "%s", args);
    json_error_t je;
    json_t *j = out ? json_loads(out, 0, &je) : NULL;
    CHECKF(j && json_integer_value(json_object_get(j, "completion_tokens")) == 5, "%s", out ? out : "");
    json_decref(j);
    free(out);
    void *mem = NULL;
    hr_model *m = synth("gpt-oss-tiny", HR_DTYPE_MXFP4, &mem);
    if (!m) return;
    const hr_layer_attn *la = hr_model_layer_attn(m);
    CHECK(la[0].kind == HR_ATTN_WINDOW && la[0].window == 16 && la[1].kind == HR_ATTN_FULL && la[1].window == 0);
    CHECK(la[0].rope_base == 150000.0f && la[1].rope_base == 150000.0f);
    const hr_gguf_tensor *t = hr_gguf_find_tensor(hr_model_gguf(m), "blk.1.ffn_down_exps.weight");
    CHECK(t && t->type == HR_DTYPE_MXFP4 && hr_model_tensor_type(m, t) == HR_DTYPE_MXFP4);
    hr_model_destroy(m);
    free(mem);
}

#if HR_FAULT
#include "model_faults.h"

/* Fault build: loading gpt-oss-tiny (MXFP4 experts) and creating its forward context with the Nth
 * allocation failing, for every N the clean run makes, ends in a clean error (or success) and leaks
 * nothing (LeakSanitizer at exit). */
static void check_alloc_faults(void) {
    size_t n;
    void *mem = image(HR_DTYPE_MXFP4, -1, &n);
    check_model_alloc_faults(mem, n, "gpt-oss-tiny mxfp4");
    free(mem);
}
#else
static void check_alloc_faults(void) {}
#endif

int main(void) {
    g_isa = hr_test_isa();
    check_reference();
    check_llamacpp();
    check_batch_invariance(HR_DTYPE_F32);
    check_batch_invariance(HR_DTYPE_MXFP4);
    check_batch_invariance(HR_DTYPE_Q8_0); /* every matrix q8_0, the experts' stacks x16-repacked */
    check_batch_invariance(HR_DTYPE_F16);
    check_bad_input();
    check_cli_and_layers();
    check_alloc_faults();
    return hr_test_finish();
}

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
 * (The float64 reference checks of the same families are in test_model.c.) */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/isa.h"
#include "common/fault.h"
#include "common/util.h"
#include "harness.h"
#include "model/model.h"
#include "model/synth.h"
#include "model_images.h"
#include "plan/plan.h"

#define N_GEN 64

/* Greedy generation of one prompt in a fresh f16 cache: the prompt as one batch, then one token a
 * step, as llama.cpp ran it. */
static void greedy(const hr_model *m, const int32_t *prompt, int n_prompt, int n_ctx, int32_t *out, float *kept) {
    const hr_hparams *hp = hr_model_hparams(m);
    hr_kv_config kc = {.n_layers = hp->n_layer,
                       .n_kv_heads = hp->n_head_kv,
                       .head_dim = hp->head_dim,
                       .v_from_k = hp->kv_lora_rank, /* deepseek2: the latent cache */
                       .block_size = 16,
                       .k_format = HR_KV_F16,
                       .v_format = HR_KV_F16,
                       .max_seqs = 1};
    kc.budget_bytes = hr_kv_block_bytes(&kc) * (uint64_t)(n_ctx / 16 + 1);
    hr_kv_pool *kv = NULL;
    hr_model_ctx *c = NULL;
    hr_model_ctx_params mp = {.n_threads = 2, .max_batch_tokens = 16, .max_ctx = n_ctx};
    hr_error err = {0};
    hr_kv_seq s;
    CHECK(hr_kv_pool_create(&kc, &kv, &err) == HR_OK && hr_model_ctx_create(m, kv, &mp, &c, &err) == HR_OK &&
          hr_kv_seq_create(kv, &s, &err) == HR_OK);
    if (!c) return;
    float *logits = malloc(sizeof(float) * (size_t)hp->n_vocab);
    int32_t toks[16], pos[16];
    hr_kv_seq seq[16];
    uint8_t want[16] = {0};
    int n = n_prompt, at = 0;
    memcpy(toks, prompt, sizeof(int32_t) * (size_t)n);
    for (int g = 0; g < N_GEN; g++) {
        for (int i = 0; i < n; i++) pos[i] = at + i, seq[i] = s, want[i] = i == n - 1;
        hr_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .seq = seq, .want_logits = want};
        CHECK(hr_kv_seq_reserve(kv, s, at + n, &err) == HR_OK);
        CHECKF(hr_model_forward(c, &b, logits, &err) == HR_OK, "%s", err.msg);
        hr_kv_seq_commit(kv, s, toks, n);
        at += n;
        int best = 0;
        for (int v = 1; v < hp->n_vocab; v++)
            if (logits[v] > logits[best]) best = v;
        out[g] = toks[0] = best;
        if (g % 21 == 0) memcpy(kept + (size_t)(g / 21) * hp->n_vocab, logits, sizeof(float) * (size_t)hp->n_vocab);
        n = 1;
    }
    free(logits);
    hr_model_ctx_destroy(c);
    hr_kv_pool_destroy(kv);
}

/* file: under tests/vectors/, n_expected lines of 8 per model */
static void check_llamacpp_ids(const char *file, int n_expected) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/vectors/%s", HR_SOURCE_DIR, file);
    FILE *f = fopen(path, "r");
    CHECKF(f != NULL, "cannot open %s", path);
    if (!f) return;
    char line[8192], loaded[96] = "";
    hr_model *m = NULL;
    void *mem = NULL;
    int n_lines = 0, n_equal = 0;
    double worst_logit = 0;
    while (fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        CHECK(o != NULL);
        if (!o) continue;
        const char *shape = json_string_value(json_object_get(o, "shape"));
        json_t *pt = json_object_get(o, "prompt_tokens"), *ct = json_object_get(o, "completion_tokens");
        CHECK(shape && json_array_size(pt) <= 16 && json_array_size(ct) == N_GEN);
        /* "layers": the shape's first N layers, as `headroom synth --layers N` writes it */
        const int layers = (int)json_integer_value(json_object_get(o, "layers"));
        char key[96];
        snprintf(key, sizeof key, "%s:%d", shape ? shape : "", layers);
        if (shape && strcmp(key, loaded)) {
            hr_model_destroy(m);
            free(mem);
            hr_synth_shape s;
            hr_error err = {0};
            CHECK(hr_synth_shape_by_name(shape, &s, &err) == HR_OK);
            if (layers > 0) s.n_layer = layers;
            CHECKF(hr_synth_model(&s, HR_DTYPE_F32, 1, &m, &mem, &err) == HR_OK, "%s", err.msg);
            snprintf(loaded, sizeof loaded, "%s", key);
        }
        int32_t prompt[16], ids[N_GEN];
        int np = (int)json_array_size(pt), first_diff = -1;
        const int V = m ? hr_model_hparams(m)->n_vocab : 1;
        float *kept = calloc((size_t)4 * V, sizeof(float));
        for (int i = 0; i < np && i < 16; i++) prompt[i] = (int32_t)json_integer_value(json_array_get(pt, i));
        greedy(m, prompt, np, (int)json_integer_value(json_object_get(o, "n_ctx")), ids, kept);
        /* llama.cpp's 8 largest logits at steps 0, 21, 42, 63: headroom's at those ids, relative to
         * the largest (its GELU goes through an f16 table, headroom's does not) */
        json_t *tops = json_object_get(o, "top_logits");
        CHECK(json_array_size(tops) == 4);
        for (size_t k = 0; k < json_array_size(tops); k++) {
            json_t *tk = json_array_get(tops, k), *tid = json_object_get(tk, "ids"),
                   *tl = json_object_get(tk, "logits");
            double top = fabs(json_real_value(json_array_get(tl, 0)));
            for (size_t r = 0; r < json_array_size(tid); r++) {
                int64_t id = json_integer_value(json_array_get(tid, r));
                CHECK(id >= 0 && id < V);
                if (id < 0 || id >= V) continue;
                double d = fabs(kept[k * (size_t)V + (size_t)id] - json_real_value(json_array_get(tl, r))) / top;
                if (d > worst_logit) worst_logit = d;
            }
        }
        free(kept);
        for (int g = N_GEN - 1; g >= 0; g--)
            if (ids[g] != json_integer_value(json_array_get(ct, g))) first_diff = g;
        CHECKF(first_diff < 0, "%s prompt %d: id %d is %d, llama.cpp's %lld", key, n_lines % 8, first_diff,
               first_diff < 0 ? 0 : ids[first_diff],
               first_diff < 0 ? 0 : json_integer_value(json_array_get(ct, first_diff)));
        n_equal += first_diff < 0;
        n_lines++;
        json_decref(o);
    }
    fclose(f);
    hr_model_destroy(m);
    free(mem);
    CHECK(n_lines == n_expected);
    CHECKF(worst_logit < 2e-3, "logits %.3g (relative to the largest) from llama.cpp's", worst_logit);
    printf("llama.cpp greedy ids (%s): %d of %d prompts (%d models x 8, 64 tokens each) equal; its top-8 logits at "
           "4 steps each within %.2e of the largest (bound 2e-3)\n",
           file, n_equal, n_lines, n_lines / 8, worst_logit);
}

/* ---- mixture of experts ---- */

static hr_model *synth(const char *shape, int layers, hr_dtype type, void **mem) {
    hr_synth_shape s;
    hr_model *m = NULL;
    hr_error err = {0};
    CHECK(hr_synth_shape_by_name(shape, &s, &err) == HR_OK);
    if (layers > 0) s.n_layer = layers;
    CHECKF(hr_synth_model(&s, type, 1, &m, mem, &err) == HR_OK, "%s: %s", shape, err.msg);
    return m;
}

static const float *f32_tensor(const hr_model *m, const char *name) {
    const hr_gguf_tensor *t = hr_gguf_find_tensor(hr_model_gguf(m), name);
    CHECKF(t && t->type == HR_DTYPE_F32, "%s: absent or not f32", name);
    return t && t->type == HR_DTYPE_F32 ? t->data : NULL;
}

/* y[r] = sum_c W[r][c] x[c], W in f32, in double */
static void matvec64(const float *W, const double *x, int rows, int cols, double *y) {
    for (int r = 0; r < rows; r++) {
        double acc = 0;
        for (int c = 0; c < cols; c++) acc += (double)W[(size_t)r * cols + c] * x[c];
        y[r] = acc;
    }
}

static void rmsnorm64(double *out, const double *x, const float *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const double inv = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * inv * w[i];
}

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

/* A forward rig: an f16 (or f32) pool for n_seqs sequences of up to 64 tokens, T up to 32. */
typedef struct moe_rig {
    hr_kv_pool *kv;
    hr_model_ctx *c;
    hr_kv_seq seq[8];
} moe_rig;

static moe_rig rig_open(const hr_model *m, hr_kv_format fmt, int n_seqs, int n_threads) {
    const hr_hparams *hp = hr_model_hparams(m);
    moe_rig r = {0};
    hr_kv_config kc = {.n_layers = hp->n_layer,
                       .n_kv_heads = hp->n_head_kv,
                       .head_dim = hp->head_dim,
                       .v_from_k = hp->kv_lora_rank, /* deepseek2: the latent cache */
                       .block_size = 16,
                       .k_format = fmt,
                       .v_format = fmt,
                       .max_seqs = n_seqs};
    kc.budget_bytes = hr_kv_block_bytes(&kc) * (uint64_t)(4 * n_seqs + 4);
    hr_model_ctx_params mp = {.n_threads = n_threads, .max_batch_tokens = 32, .max_ctx = 64};
    hr_error err = {0};
    CHECKF(hr_kv_pool_create(&kc, &r.kv, &err) == HR_OK && hr_model_ctx_create(m, r.kv, &mp, &r.c, &err) == HR_OK, "%s",
           err.msg);
    for (int i = 0; r.c && i < n_seqs; i++) CHECK(hr_kv_seq_create(r.kv, &r.seq[i], &err) == HR_OK);
    return r;
}

static void rig_close(moe_rig *r) {
    hr_model_ctx_destroy(r->c);
    hr_kv_pool_destroy(r->kv);
}

/* One forward of n tokens: token i to sequence si[i] at the sequence's next position, logits for all. */
static void rig_step(moe_rig *r, const int32_t *toks, const int *si, int n, int *at, float *logits) {
    int32_t pos[32];
    hr_kv_seq seq[32];
    uint8_t want[32];
    int first[8];
    hr_error err = {0};
    memcpy(first, at, sizeof first);
    for (int i = 0; i < n; i++) pos[i] = at[si[i]]++, seq[i] = r->seq[si[i]], want[i] = 1;
    for (int q = 0; q < 8; q++)
        if (at[q] > first[q]) CHECK(hr_kv_seq_reserve(r->kv, r->seq[q], at[q], &err) == HR_OK);
    hr_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .seq = seq, .want_logits = want};
    CHECKF(hr_model_forward(r->c, &b, logits, &err) == HR_OK, "%s", err.msg);
    for (int q = 0; q < 8; q++) { /* each sequence's tokens are consecutive in toks (the callers' batches) */
        int i0 = -1, cnt = 0;
        for (int i = 0; i < n; i++)
            if (si[i] == q) i0 = i0 < 0 ? i : i0, cnt++;
        if (cnt) hr_kv_seq_commit(r->kv, r->seq[q], toks + i0, cnt);
    }
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

/* Six sequences (prompts of 2..7 tokens, then 3 decode steps): each run alone, then all six in one
 * batch per step (27 prompt tokens, then 6 a step). Every logit equal bit for bit: the experts' grouped
 * products and the rank-order sums do not depend on the batch. Returns the last step's logits of
 * sequence 0 (alone) in keep (V floats) for the type comparison. */
static void check_moe_batch_invariance(const char *shape, hr_dtype type, float *keep) {
    void *mem = NULL;
    hr_model *m = synth(shape, 0, type, &mem);
    if (!m) return;
    const int V = hr_model_hparams(m)->n_vocab, NS = 6, STEPS = 3;
    float *alone = malloc(sizeof(float) * (size_t)V * NS * (STEPS + 1));
    float *batched = malloc(sizeof(float) * (size_t)V * 32);
    int32_t prompts[6][8];
    for (int q = 0; q < NS; q++)
        for (int i = 0; i < 2 + q; i++) prompts[q][i] = 3 + (q * 211 + i * 53) % (V - 3);
    const int32_t dec[3] = {17, 401, 99};
    /* alone: sequence q in a rig of its own */
    for (int q = 0; q < NS; q++) {
        moe_rig r = rig_open(m, HR_KV_F16, 1, 2);
        if (!r.c) break;
        int at[8] = {0}, si[8] = {0};
        rig_step(&r, prompts[q], si, 2 + q, at, batched);
        memcpy(alone + ((size_t)q * (STEPS + 1)) * V, batched + (size_t)(1 + q) * V, sizeof(float) * (size_t)V);
        for (int s = 0; s < STEPS; s++) {
            int32_t t = dec[s] + q;
            rig_step(&r, &t, si, 1, at, batched);
            memcpy(alone + ((size_t)q * (STEPS + 1) + 1 + s) * V, batched, sizeof(float) * (size_t)V);
        }
        rig_close(&r);
    }
    memcpy(keep, alone + (size_t)STEPS * V, sizeof(float) * (size_t)V);
    moe_rig r = rig_open(m, HR_KV_F16, NS, 2);
    int n_diff = 0;
    if (r.c) {
        int32_t toks[32];
        int si[32], at[8] = {0}, n = 0, last[6];
        for (int q = 0; q < NS; q++) {
            for (int i = 0; i < 2 + q; i++) toks[n] = prompts[q][i], si[n++] = q;
            last[q] = n - 1;
        }
        rig_step(&r, toks, si, n, at, batched);
        for (int q = 0; q < NS; q++)
            n_diff += memcmp(batched + (size_t)last[q] * V, alone + ((size_t)q * (STEPS + 1)) * V,
                             sizeof(float) * (size_t)V) != 0;
        for (int s = 0; s < STEPS; s++) {
            for (int q = 0; q < NS; q++) toks[q] = dec[s] + q, si[q] = q;
            rig_step(&r, toks, si, NS, at, batched);
            for (int q = 0; q < NS; q++)
                n_diff += memcmp(batched + (size_t)q * V, alone + ((size_t)q * (STEPS + 1) + 1 + s) * V,
                                 sizeof(float) * (size_t)V) != 0;
        }
        rig_close(&r);
    }
    CHECKF(n_diff == 0, "%s %s: %d of %d logit rows differ batched from alone", shape, hr_dtype_get_info(type)->name,
           n_diff, NS * (STEPS + 1));
    printf("%s %s: %d logit rows bit-identical alone and batched (6 sequences, 27-token prefill, 3 steps)\n", shape,
           hr_dtype_get_info(type)->name, NS * (STEPS + 1) - n_diff);
    free(alone);
    free(batched);
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

/* ---- deepseek2: multi-head latent attention against a float64 reference without absorption ----
 * The reference decompresses every cached latent into per-head keys (k_nope = W_UK_h^T c) and values
 * (W_UV_h c) and runs plain multi-head attention over [k_nope | k_pe], as the DeepSeek-V2 paper writes
 * MLA before its absorption trick; headroom attends over the latent cache with the absorbed query. The
 * two agree only if the absorption, the cache layout (latent | rope key, V read from K) and DeepSeek's
 * routing (softmax or sigmoid gates, selection bias, groups, norm, scale, shared experts, dense lead) are
 * right. */

static const float *layer_tensor(const hr_model *m, int il, const char *suffix) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", il, suffix);
    const hr_gguf_tensor *t = hr_gguf_find_tensor(hr_model_gguf(m), name);
    return t && t->type == HR_DTYPE_F32 ? t->data : NULL;
}

/* YaRN as a DeepSeek file gives it, read from the file's keys here (not the loader's results); s = 0:
 * none. DeepSeek's converter writes yarn_log_multiplier = 0.1 mscale_all_dim, and its model (and
 * llama.cpp's deepseek2 graph) keeps the rotation's magnitude at 1 and scales the softmax by mscale^2,
 * mscale = 1 + 0.1 mscale_all_dim ln s. */
typedef struct yarn64 {
    double s, orig, mscale;
} yarn64;

static yarn64 yarn64_of(const hr_model *m) {
    const hr_gguf *g = hr_model_gguf(m);
    yarn64 y = {0, 0, 1};
    char type[16];
    double lm = 0;
    int64_t orig = 0;
    if (hr_gguf_get_cstr(g, "deepseek2.rope.scaling.type", type, sizeof type, NULL) != HR_OK || strcmp(type, "yarn"))
        return y;
    CHECK(hr_gguf_get_float(g, "deepseek2.rope.scaling.factor", &y.s, NULL) == HR_OK &&
          hr_gguf_get_int(g, "deepseek2.rope.scaling.original_context_length", &orig, NULL) == HR_OK);
    if (hr_gguf_get_float(g, "deepseek2.rope.scaling.yarn_log_multiplier", &lm, NULL) != HR_OK) lm = 0;
    y.orig = (double)orig;
    y.mscale = 1 + lm * log(y.s); /* 0.1 mscale_all_dim ln s + 1 */
    return y;
}

/* llama.cpp's "norm" RoPE (adjacent pairs) over n dims, in double; with YaRN (the paper's NTK-by-parts,
 * beta_fast 32, beta_slow 1): pair i turns theta / s (1 - r_i) + theta r_i, r_i = 1 - clamp((i - lo) /
 * (hi - lo), 0, 1), lo and hi the pairs that turn 32 and 1 times over the original context */
static void rope64(double *x, int n, double pos, double base, const yarn64 *y) {
    double lo = 0, hi = 0;
    if (y->s > 0) {
        lo = fmax(0, floor(n * log(y->orig / (32 * 2 * M_PI)) / (2 * log(base))));
        hi = fmin(n - 1, ceil(n * log(y->orig / (1 * 2 * M_PI)) / (2 * log(base))));
    }
    for (int i = 0; i < n / 2; i++) {
        double th = pos * pow(base, -2.0 * i / n);
        if (y->s > 0) {
            const double r = 1 - fmin(1, fmax(0, (i - lo) / fmax(0.001, hi - lo)));
            th = th / y->s * (1 - r) + th * r;
        }
        const double c = cos(th), s = sin(th);
        const double a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = a * c - b * s;
        x[2 * i + 1] = a * s + b * c;
    }
}

static void swiglu_ffn64(const float *wg, const float *wu, const float *wd, const double *xn, int E, int F, double *y) {
    double *g = calloc((size_t)F, sizeof(double)), *u = calloc((size_t)F, sizeof(double));
    matvec64(wg, xn, F, E, g);
    matvec64(wu, xn, F, E, u);
    for (int i = 0; i < F; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
    matvec64(wd, g, E, F, y);
    free(g), free(u);
}

/* DeepSeek's FFN of one normed row (a MoE layer), in double; *gap: the smallest margin between the k-th
 * chosen and the best expert left out (how far the choice is from a tie). */
static void deepseek_moe64(const hr_model *m, int il, const double *xn, double *y, double *gap) {
    const hr_hparams *hp = hr_model_hparams(m);
    const int E = hp->n_embd, NE = hp->n_expert, K = hp->n_expert_used, Fe = hp->n_ff_exp;
    const float *wr = layer_tensor(m, il, "ffn_gate_inp.weight"), *bias = layer_tensor(m, il, "exp_probs_b.bias");
    const float *wg = layer_tensor(m, il, "ffn_gate_exps.weight"), *wu = layer_tensor(m, il, "ffn_up_exps.weight"),
                *wd = layer_tensor(m, il, "ffn_down_exps.weight");
    double p[64], sc[64], w[16], ye[256];
    int sel[16];
    CHECK(NE <= 64 && K < 16 && E <= 256 && wr && wg && wu && wd);
    if (!(NE <= 64 && K < 16 && E <= 256 && wr && wg && wu && wd)) return;
    matvec64(wr, xn, NE, E, p);
    if (hp->moe_gating == HR_MOE_GATING_SIGMOID) {
        for (int e = 0; e < NE; e++) p[e] = 1 / (1 + exp(-p[e]));
    } else {
        double mx = p[0], sum = 0;
        for (int e = 1; e < NE; e++) mx = fmax(mx, p[e]);
        for (int e = 0; e < NE; e++) sum += (p[e] = exp(p[e] - mx));
        for (int e = 0; e < NE; e++) p[e] /= sum;
    }
    for (int e = 0; e < NE; e++) sc[e] = p[e] + (bias ? bias[e] : 0);
    if (hp->n_expert_groups > 1) { /* groups ranked by the sum of their two best */
        const int G = hp->n_expert_groups, per = NE / G;
        double gs[64];
        bool keep[64] = {false};
        for (int g = 0; g < G; g++) {
            double b1 = -INFINITY, b2 = -INFINITY;
            for (int e = g * per; e < (g + 1) * per; e++)
                if (sc[e] > b1)
                    b2 = b1, b1 = sc[e];
                else if (sc[e] > b2)
                    b2 = sc[e];
            gs[g] = b1 + b2;
        }
        for (int u = 0; u < hp->n_group_used; u++) {
            int best = -1;
            for (int g = 0; g < G; g++)
                if (!keep[g] && (best < 0 || gs[g] > gs[best])) best = g;
            keep[best] = true;
        }
        for (int e = 0; e < NE; e++)
            if (!keep[e / per]) sc[e] = -INFINITY;
    }
    double wsum = 0;
    for (int k = 0; k <= K && k < NE; k++) {
        int best = -1;
        for (int e = 0; e < NE; e++) {
            bool taken = false;
            for (int j = 0; j < k; j++) taken |= sel[j] == e;
            if (!taken && (best < 0 || sc[e] > sc[best])) best = e;
        }
        sel[k] = best;
        if (k == K) {
            if (sc[best] > -INFINITY) *gap = fmin(*gap, sc[sel[K - 1]] - sc[best]);
            break;
        }
        w[k] = p[best];
        wsum += w[k];
    }
    for (int k = 0; k < K; k++) {
        double wk = hp->moe_norm ? w[k] / wsum : w[k];
        if (hp->moe_scale > 0) wk *= hp->moe_scale;
        const size_t e = (size_t)sel[k];
        swiglu_ffn64(wg + e * Fe * E, wu + e * Fe * E, wd + e * E * Fe, xn, E, Fe, ye);
        for (int i = 0; i < E; i++) y[i] += wk * ye[i];
    }
    if (hp->n_expert_shared > 0) {
        const int Fs = hp->n_expert_shared * Fe;
        swiglu_ffn64(layer_tensor(m, il, "ffn_gate_shexp.weight"), layer_tensor(m, il, "ffn_up_shexp.weight"),
                     layer_tensor(m, il, "ffn_down_shexp.weight"), xn, E, Fs, ye);
        for (int i = 0; i < E; i++) y[i] += ye[i];
    }
}

/* The logits (n x V) of tokens [0, n) of one sequence, in double. */
static void mla_ref64(const hr_model *m, const int32_t *toks, int n, double *logits, double *gap) {
    const hr_hparams *hp = hr_model_hparams(m);
    const int E = hp->n_embd, H = hp->n_head, R = hp->n_rot, Dn = hp->qk_nope_dim, Dv = hp->v_head_dim,
              C = hp->kv_lora_rank, Cq = hp->q_lora_rank, Dq = Dn + R, V = hp->n_vocab;
    const yarn64 yarn = yarn64_of(m);
    const double eps = hp->norm_eps, base = hp->rope_base, scale = yarn.mscale * yarn.mscale / sqrt((double)Dq);
    double *x = calloc((size_t)n * E, sizeof(double)), *xn = calloc((size_t)n * E, sizeof(double)),
           *q = calloc((size_t)n * H * Dq, sizeof(double)), *kv = calloc((size_t)n * (C + R), sizeof(double)),
           *kn = calloc((size_t)n * H * Dn, sizeof(double)), *vv = calloc((size_t)n * H * Dv, sizeof(double)),
           *att = calloc((size_t)H * Dv, sizeof(double)), *o = calloc((size_t)E, sizeof(double)),
           *qa = calloc((size_t)(Cq > 0 ? Cq : 1), sizeof(double)), *pr = calloc((size_t)n, sizeof(double)),
           *y = calloc((size_t)E, sizeof(double));
    const float *emb = f32_tensor(m, "token_embd.weight"), *out = f32_tensor(m, "output.weight"),
                *on = f32_tensor(m, "output_norm.weight");
    for (int t = 0; t < n; t++)
        for (int i = 0; i < E; i++) x[(size_t)t * E + i] = emb[(size_t)toks[t] * E + i];
    for (int il = 0; il < hp->n_layer; il++) {
        const float *wkb = layer_tensor(m, il, "attn_k_b.weight"), *wvb = layer_tensor(m, il, "attn_v_b.weight");
        for (int t = 0; t < n; t++) {
            double *xt = xn + (size_t)t * E, *qt = q + (size_t)t * H * Dq, *kt = kv + (size_t)t * (C + R);
            rmsnorm64(xt, x + (size_t)t * E, layer_tensor(m, il, "attn_norm.weight"), E, eps);
            if (Cq > 0) {
                matvec64(layer_tensor(m, il, "attn_q_a.weight"), xt, Cq, E, qa);
                rmsnorm64(qa, qa, layer_tensor(m, il, "attn_q_a_norm.weight"), Cq, eps);
                matvec64(layer_tensor(m, il, "attn_q_b.weight"), qa, H * Dq, Cq, qt);
            } else {
                matvec64(layer_tensor(m, il, "attn_q.weight"), xt, H * Dq, E, qt);
            }
            matvec64(layer_tensor(m, il, "attn_kv_a_mqa.weight"), xt, C + R, E, kt);
            rmsnorm64(kt, kt, layer_tensor(m, il, "attn_kv_a_norm.weight"), C, eps);
            rope64(kt + C, R, t, base, &yarn);
            for (int h = 0; h < H; h++) {
                rope64(qt + h * Dq + Dn, R, t, base, &yarn);
                /* decompress: k_nope[c] = sum_r W_UK[h][r][c] lat[r]; v[d] = sum_r W_UV[h][d][r] lat[r] */
                for (int c2 = 0; c2 < Dn; c2++) {
                    double acc = 0;
                    for (int r = 0; r < C; r++) acc += (double)wkb[((size_t)h * C + r) * Dn + c2] * kt[r];
                    kn[((size_t)t * H + h) * Dn + c2] = acc;
                }
                matvec64(wvb + (size_t)h * Dv * C, kt, Dv, C, vv + ((size_t)t * H + h) * Dv);
            }
        }
        for (int t = 0; t < n; t++) { /* causal MHA over the decompressed keys and values */
            for (int h = 0; h < H; h++) {
                const double *qh = q + ((size_t)t * H + h) * Dq;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double d = 0;
                    for (int c2 = 0; c2 < Dn; c2++) d += qh[c2] * kn[((size_t)j * H + h) * Dn + c2];
                    for (int r = 0; r < R; r++) d += qh[Dn + r] * kv[(size_t)j * (C + R) + C + r];
                    pr[j] = d * scale;
                    mx = fmax(mx, pr[j]);
                }
                for (int j = 0; j <= t; j++) sum += (pr[j] = exp(pr[j] - mx));
                for (int d = 0; d < Dv; d++) {
                    double acc = 0;
                    for (int j = 0; j <= t; j++) acc += pr[j] * vv[((size_t)j * H + h) * Dv + d];
                    att[h * Dv + d] = acc / sum;
                }
            }
            matvec64(layer_tensor(m, il, "attn_output.weight"), att, E, H * Dv, o);
            for (int i = 0; i < E; i++) x[(size_t)t * E + i] += o[i];
        }
        for (int t = 0; t < n; t++) {
            double *xt = xn + (size_t)t * E;
            rmsnorm64(xt, x + (size_t)t * E, layer_tensor(m, il, "ffn_norm.weight"), E, eps);
            memset(y, 0, sizeof(double) * (size_t)E);
            if (il < hp->n_layer_dense)
                swiglu_ffn64(layer_tensor(m, il, "ffn_gate.weight"), layer_tensor(m, il, "ffn_up.weight"),
                             layer_tensor(m, il, "ffn_down.weight"), xt, E, hp->n_ff, y);
            else
                deepseek_moe64(m, il, xt, y, gap);
            for (int i = 0; i < E; i++) x[(size_t)t * E + i] += y[i];
        }
    }
    for (int t = 0; t < n; t++) {
        rmsnorm64(xn, x + (size_t)t * E, on, E, eps);
        matvec64(out, xn, V, E, logits + (size_t)t * V);
    }
    free(x), free(xn), free(q), free(kv), free(kn), free(vv), free(att), free(o), free(qa), free(pr), free(y);
}

/* A 12-token prompt in one batch, then 6 greedy decode steps, in an f32 latent cache: every logit
 * within 1e-4 (relative to the step's largest) of the float64 reference. */
static void check_mla_reference(const char *shape) {
    void *mem = NULL;
    hr_model *m = synth(shape, 0, HR_DTYPE_F32, &mem);
    if (!m) return;
    const hr_hparams *hp = hr_model_hparams(m);
    const int V = hp->n_vocab, NP = 12, NG = 6, N = NP + NG;
    if (hp->yarn_factor > 0) { /* DeepSeek's YaRN: the rotation keeps magnitude 1, the scale takes mscale^2 */
        const double ms = 1 + 0.0707 * log(40.0), want = ms * ms / sqrt(32.0);
        CHECKF(hp->yarn_factor == 40.0f && fabsf(hp->yarn_log_mul - 0.707f) < 1e-6f &&
                   fabs(hp->attn_scale - want) < 1e-6 * want &&
                   (hp->rope_attn_factor == 0.0f || fabsf(hp->rope_attn_factor - 1.0f) < 1e-6f),
               "%s: yarn %g, log mul %g, scale %.9g (want %.9g), rope factor %.9g", shape, hp->yarn_factor,
               hp->yarn_log_mul, hp->attn_scale, want, hp->rope_attn_factor);
    }
    float *logits = malloc(sizeof(float) * (size_t)V * NP);
    double *ref = malloc(sizeof(double) * (size_t)V * N), worst = 0, gap = INFINITY;
    int32_t toks[18];
    moe_rig r = rig_open(m, HR_KV_F32, 1, 2);
    int si[16] = {0}, at[8] = {0};
    for (int i = 0; i < NP; i++) toks[i] = 3 + (i * 211) % (V - 3);
    if (r.c) rig_step(&r, toks, si, NP, at, logits);
    int n = NP;
    for (int g = 0; r.c && g <= NG; g++) {
        /* compare the newest rows (the prompt's 12, then each step's one) with the reference */
        mla_ref64(m, toks, n, ref, &gap);
        const int first = g == 0 ? 0 : n - 1;
        for (int t = first; t < n; t++) {
            const float *lg = logits + (size_t)(t - first) * V;
            const double *rf = ref + (size_t)t * V;
            double top = 0, d = 0;
            for (int v = 0; v < V; v++) top = fmax(top, fabs(rf[v]));
            for (int v = 0; v < V; v++) d = fmax(d, fabs(lg[v] - rf[v]) / top);
            worst = fmax(worst, d);
        }
        if (g == NG) break;
        const float *last = logits + (size_t)(n - 1 - first) * V;
        int best = 0;
        for (int v = 1; v < V; v++)
            if (last[v] > last[best]) best = v;
        toks[n] = best;
        rig_step(&r, toks + n, si, 1, at, logits);
        n++;
    }
    rig_close(&r);
    CHECKF(gap > 1e-5, "%s: expert choice near a tie (%.3g)", shape, gap);
    CHECKF(worst < 1e-5, "%s: logits %.3g (relative) from the float64 reference", shape, worst);
    printf("%s: %d prompt + %d decode tokens, f32 latent cache: logits within %.2e of float64 without absorption "
           "(bound 1e-5), smallest expert margin %.3g\n",
           shape, NP, NG, worst, gap);
    free(logits);
    free(ref);
    hr_model_destroy(m);
    free(mem);
}

/* Latent attention and DeepSeek's routing keep a sequence's logits independent of its batch (f16 cache, f32
 * and q8_0 weights). */
/* A file from before llama.cpp's MLA converter (one attn_kv_b, a head's key_length and value_length) is
 * split at load into the very model the converter's split file is: every logit bit-identical. */
static void check_mla_legacy_kv_b(void) {
    void *m1 = NULL, *m2 = NULL;
    hr_model *a = synth("deepseek2-tiny", 0, HR_DTYPE_F32, &m1), *b = synth("deepseek2-tiny-kvb", 0, HR_DTYPE_F32, &m2);
    if (a && b) {
        const hr_hparams *ha = hr_model_hparams(a), *hb = hr_model_hparams(b);
        CHECK(hb->kv_b_split && !ha->kv_b_split && hb->head_dim == ha->head_dim && hb->n_head_kv == 1 &&
              hb->qk_nope_dim == ha->qk_nope_dim && hb->v_head_dim == ha->v_head_dim);
        const int V = ha->n_vocab;
        float *la = malloc(sizeof(float) * (size_t)V * 10), *lb = malloc(sizeof(float) * (size_t)V * 10);
        moe_rig ra = rig_open(a, HR_KV_F16, 1, 2), rb = rig_open(b, HR_KV_F16, 1, 2);
        int32_t toks[10];
        int si[10] = {0}, ata[8] = {0}, atb[8] = {0}, n_diff = 0;
        for (int i = 0; i < 10; i++) toks[i] = 3 + (i * 577) % (V - 3);
        if (ra.c && rb.c) {
            rig_step(&ra, toks, si, 10, ata, la);
            rig_step(&rb, toks, si, 10, atb, lb);
            n_diff += memcmp(la, lb, sizeof(float) * (size_t)V * 10) != 0;
            for (int g = 0; g < 4; g++) {
                toks[0] = 50 + g;
                rig_step(&ra, toks, si, 1, ata, la);
                rig_step(&rb, toks, si, 1, atb, lb);
                n_diff += memcmp(la, lb, sizeof(float) * (size_t)V) != 0;
            }
        }
        CHECKF(n_diff == 0, "deepseek2-tiny-kvb: %d of 5 steps' logits differ from deepseek2-tiny's", n_diff);
        printf("deepseek2-tiny-kvb (attn_kv_b split at load): logits bit-identical to deepseek2-tiny's (5 steps)\n");
        rig_close(&ra);
        rig_close(&rb);
        free(la);
        free(lb);
    }
    hr_model_destroy(a);
    hr_model_destroy(b);
    free(m1);
    free(m2);
}

static void check_mla_batch_invariance(void) {
    float *k32 = calloc(2048, sizeof(float)), *kq = calloc(2048, sizeof(float));
    check_moe_batch_invariance("deepseek3-tiny", HR_DTYPE_F32, k32);
    check_moe_batch_invariance("deepseek2-tiny", HR_DTYPE_F32, k32);
    check_moe_batch_invariance("deepseek2-tiny", HR_DTYPE_Q8_0, kq);
    double top = 0, d = 0;
    for (int v = 0; v < 2048; v++) top = fmax(top, fabs(k32[v]));
    for (int v = 0; v < 2048; v++) d = fmax(d, fabs(kq[v] - k32[v]) / top);
    CHECKF(d < 0.05, "deepseek2-tiny q8_0: logits %.3g (relative) from f32's", d);
    printf("deepseek2-tiny q8_0 (latent-attention matrices x16-repacked): logits within %.3g of f32's (bound 0.05)\n",
           d);
    /* the q8_0 matrices whose rows are a multiple of 16, repacked: the output; layer 0's attn_q, attn_output,
     * ffn_gate/up/down, attn_kv_a_mqa and attn_v_b (16 rows a head; attn_k_b's rows of 16 are f16); layers 1
     * and 2's attn_q, attn_output, the three expert stacks, attn_kv_a_mqa, attn_v_b and the three shared */
    void *mem = NULL;
    hr_model *m = synth("deepseek2-tiny", 0, HR_DTYPE_Q8_0, &mem);
    CHECKF(m && hr_model_packed_tensors(m, NULL) == 1 + 7 + 2 * 10, "%d packed",
           m ? hr_model_packed_tensors(m, NULL) : -1);
    hr_model_destroy(m);
    free(mem);
    free(k32);
    free(kq);
}

/* A latent pool's attention (V the first C dims of K, only those summed) against a pool that stores the
 * same rows as K and again as V: every output head's first C dims bit-identical, and 0 past them, for
 * every latent format, scalar and AVX2 kernels, contexts 1..70 (block 16: partial blocks), 4 heads on
 * one KV head, C a multiple of 16 and not (C 24 sums up to 32, the kernels' step, and drops the rest). */
static void check_mla_v_from_k_bits(void) {
    static const int dims[][2] = {{48, 32}, {40, 24}, {576, 512}}; /* D, C */
    static const hr_kv_format fmts[] = {HR_KV_F32, HR_KV_F16, HR_KV_BF16, HR_KV_Q8, HR_KV_FP8};
    const bool avx2 = hr_cpu_isa_has_avx2(hr_cpu_isa_select(NULL));
    enum { H = 4, NCTX = 70 };
    int n_cases = 0, bad = 0;
    hr_rng rng;
    hr_rng_seed(&rng, 7);
    for (size_t di = 0; di < HR_ARRAY_LEN(dims); di++)
        for (size_t fi = 0; fi < HR_ARRAY_LEN(fmts); fi++)
            for (int isa = 0; isa < (avx2 ? 2 : 1); isa++) {
                const int D = dims[di][0], C = dims[di][1];
                hr_kv_pool *pl[2] = {NULL, NULL};
                hr_kv_seq sq[2] = {-1, -1};
                hr_error err = {0};
                bool ok = true;
                for (int k = 0; k < 2; k++) {
                    hr_kv_config c = {.n_layers = 1,
                                      .n_kv_heads = 1,
                                      .head_dim = D,
                                      .v_from_k = k == 0 ? C : 0,
                                      .block_size = 16,
                                      .k_format = fmts[fi],
                                      .v_format = fmts[fi],
                                      .max_seqs = 1,
                                      .isa = isa ? "avx2" : "scalar"};
                    c.budget_bytes = hr_kv_block_bytes(&c) * (NCTX / 16 + 2) + hr_kv_fixed_bytes(&c);
                    ok = ok && hr_kv_pool_create(&c, &pl[k], &err) == HR_OK &&
                         hr_kv_seq_create(pl[k], &sq[k], &err) == HR_OK;
                }
                CHECKF(ok, "D %d C %d %s: %s", D, C, hr_kv_format_name(fmts[fi]), err.msg);
                float *kv = malloc(sizeof(float) * D), *q = malloc(sizeof(float) * H * D),
                      *o[2] = {malloc(sizeof(float) * H * D), malloc(sizeof(float) * H * D)},
                      *scratch = malloc(sizeof(float) * (NCTX + 4 * (size_t)D + 64));
                for (int pos = 0; ok && pos < NCTX; pos++) {
                    for (int i = 0; i < D; i++) kv[i] = (float)hr_rng_normal(&rng) * (i % 13 == 5 ? 5.0f : 1.0f);
                    for (int i = 0; i < H * D; i++) q[i] = (float)hr_rng_normal(&rng);
                    for (int k = 0; k < 2; k++) {
                        CHECK(hr_kv_seq_reserve(pl[k], sq[k], pos + 1, &err) == HR_OK);
                        hr_kv_write(pl[k], 0, sq[k], pos, kv, kv);
                        int32_t tok = pos;
                        hr_kv_seq_commit(pl[k], sq[k], &tok, 1);
                        CHECK(hr_kv_attention_scratch_floats(pl[k], pos + 1) <= NCTX + 4 * (size_t)D + 64);
                        hr_kv_attention(pl[k], 0, sq[k], pos + 1, q, H, 0.125f, o[k], scratch);
                    }
                    for (int h = 0; h < H; h++) {
                        bool same = !memcmp(o[0] + h * D, o[1] + h * D, sizeof(float) * (size_t)C);
                        for (int d = C; d < D; d++) same &= o[0][h * D + d] == 0.0f;
                        bad += !same;
                    }
                    n_cases++;
                }
                free(kv), free(q), free(o[0]), free(o[1]), free(scratch);
                hr_kv_pool_destroy(pl[0]);
                hr_kv_pool_destroy(pl[1]);
            }
    CHECKF(bad == 0, "%d of %d latent attention heads differ from a V-arena pool's first C dims", bad, n_cases * H);
    printf("latent attention (V the first C of K, only those summed): %d queries x %d heads bit-identical to a "
           "V-arena pool's first C dims (f32, f16, bf16, q8, fp8; %s)\n",
           n_cases, H, avx2 ? "scalar and AVX2" : "scalar");
}

/* The latent cache in each per-token format: the same 12-token prompt and 4 decode steps as the f32
 * cache, the last logits near f32's (the bounds a few times what each format measured); the formats
 * that cannot hold V inside K (q4, kivi2 per channel; q4h rotated) are refused with one line. A block
 * holds K only: L x B x head_dim elements. */
static void check_mla_kv_formats(void) {
    void *mem = NULL;
    hr_model *m = synth("deepseek3-tiny", 0, HR_DTYPE_F32, &mem);
    if (!m) return;
    const hr_hparams *hp = hr_model_hparams(m);
    const int V = hp->n_vocab;
    const struct {
        hr_kv_format f;
        double bound, elem_bytes;
    } fs[] = {{HR_KV_F32, 0, 4}, {HR_KV_F16, 2e-3, 2}, {HR_KV_BF16, 1e-2, 2}, {HR_KV_Q8, 2e-2, 0}, {HR_KV_FP8, 0.1, 0}};
    float *ref = malloc(sizeof(float) * (size_t)V), *lg = malloc(sizeof(float) * (size_t)V * 12);
    for (size_t i = 0; i < sizeof fs / sizeof *fs; i++) {
        moe_rig r = rig_open(m, fs[i].f, 1, 2);
        if (!r.c) continue;
        int32_t toks[12];
        int si[12] = {0}, at[8] = {0};
        for (int t = 0; t < 12; t++) toks[t] = 3 + (t * 389) % (V - 3);
        rig_step(&r, toks, si, 12, at, lg);
        for (int g = 0; g < 4; g++) { /* the same tokens whatever the format: only the cache differs */
            toks[0] = 100 + 17 * g;
            rig_step(&r, toks, si, 1, at, lg);
        }
        const hr_kv_config *kc = hr_kv_pool_config(r.kv);
        if (fs[i].elem_bytes > 0)
            CHECK(hr_kv_block_bytes(kc) == (uint64_t)(hp->n_layer * 16 * hp->head_dim * fs[i].elem_bytes));
        if (i == 0) memcpy(ref, lg, sizeof(float) * (size_t)V);
        double top = 0, d = 0;
        for (int v = 0; v < V; v++) top = fmax(top, fabs(ref[v]));
        for (int v = 0; v < V; v++) d = fmax(d, fabs(lg[v] - ref[v]) / top);
        CHECKF(i == 0 || d < fs[i].bound, "latent cache %s: logits %.3g from f32's", hr_kv_format_name(fs[i].f), d);
        printf("deepseek3-tiny latent cache %-4s: %llu bytes a token, logits within %.2e of the f32 cache's "
               "(bound %g)\n",
               hr_kv_format_name(fs[i].f), (unsigned long long)(hr_kv_block_bytes(kc) / 16), d, fs[i].bound);
        rig_close(&r);
    }
    const hr_kv_format bad[] = {HR_KV_Q4, HR_KV_KIVI2, HR_KV_Q4H};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        /* head_dim a power of two, so that q4h's own shape check passes and the latent one speaks */
        hr_kv_config kc = {.n_layers = 2,
                           .n_kv_heads = 1,
                           .head_dim = 512,
                           .v_from_k = 448,
                           .block_size = 16,
                           .k_format = bad[i],
                           .v_format = bad[i],
                           .max_seqs = 1,
                           .budget_bytes = 1 << 24};
        hr_kv_pool *kv = NULL;
        hr_error err = {0};
        CHECKF(hr_kv_pool_create(&kc, &kv, &err) != HR_OK && strstr(err.msg, "latent") && !strchr(err.msg, '\n'),
               "%s: '%s'", hr_kv_format_name(bad[i]), err.msg);
        CHECK(hr_kv_block_bytes(&kc) == 0);
        hr_kv_pool_destroy(kv);
    }
    free(ref);
    free(lg);
    hr_model_destroy(m);
    free(mem);
}

/* DeepSeek-V3's cache: (d_c + d_h^R) x l = (512 + 64) x 61 elements a token (DeepSeek-V2 paper, table 1:
 * MLA caches (d_c + d_h^R) l; V3 keeps V2's d_c = 4 d_h and d_h^R = d_h / 2 with d_h = 128), 70,272 bytes
 * in f16. The planner (from the shape) and the pool (from the config the runtime builds) both give it;
 * the same model's cache with K and V per head would take 128 x 2 x 128 x 61 x 2 bytes, 56.9 times more. */
static void check_mla_paper_bytes(void) {
    const int d_c = 512, d_rh = 64, l = 61, n_h = 128, d_h = 128;
    const uint64_t paper = (uint64_t)(d_c + d_rh) * (uint64_t)l * 2; /* f16 */
    CHECK(paper == 70272);
    hr_plan_model m = {0};
    m.hp = (hr_hparams){.arch = HR_ARCH_DEEPSEEK2,
                        .n_vocab = 129280,
                        .n_ctx_train = 163840,
                        .n_embd = 7168,
                        .n_ff = 18432,
                        .n_head = n_h,
                        .n_head_kv = 1,
                        .n_layer = l,
                        .head_dim = d_c + d_rh,
                        .n_rot = d_rh,
                        .norm_eps = 1e-6f,
                        .rope_base = 10000,
                        .rope_linear_scale = 1,
                        .q_lora_rank = 1536,
                        .kv_lora_rank = d_c,
                        .qk_nope_dim = d_h,
                        .v_head_dim = d_h,
                        .n_layer_dense = 3,
                        .n_expert = 256,
                        .n_expert_used = 8,
                        .n_ff_exp = 2048,
                        .n_expert_shared = 1,
                        .moe_gating = HR_MOE_GATING_SIGMOID,
                        .moe_norm = true,
                        .moe_scale = 2.5f,
                        .n_expert_groups = 8,
                        .n_group_used = 4};
    snprintf(m.hp.arch_name, sizeof m.hp.arch_name, "deepseek2");
    m.file_bytes = m.resident_bytes = 1ull << 30; /* the weights do not enter bytes per token */
    hr_plan_device d = {.mem_bytes = 2048ull << 30, .util = 1, .bw_gbps = 100, .reserved_bytes = 1ull << 30};
    hr_plan_params p = {.n_ctx = 4096, .concurrency = 1, .k_format = HR_RT_KV_F16, .v_format = HR_RT_KV_F16};
    hr_plan *pl = calloc(1, sizeof *pl);
    hr_error err = {0};
    CHECKF(pl && hr_plan_compute(&m, &d, &p, pl, &err) == HR_OK, "%s", err.msg);
    if (pl) {
        CHECKF(pl->rows[HR_RT_KV_F16].token_bytes == paper, "planner: %llu bytes a token, the paper's %llu",
               (unsigned long long)pl->rows[HR_RT_KV_F16].token_bytes, (unsigned long long)paper);
        CHECK(pl->rows[HR_RT_KV_F32].token_bytes == 2 * paper);
        /* q8: 576 int8 + 18 f16 group scales; fp8: 576 e4m3 + one f32 scale (docs/KV.md's table) */
        CHECKF(pl->rows[HR_RT_KV_Q8].token_bytes == 37332 && pl->rows[HR_RT_KV_FP8].token_bytes == 35380,
               "q8 %llu, fp8 %llu", (unsigned long long)pl->rows[HR_RT_KV_Q8].token_bytes,
               (unsigned long long)pl->rows[HR_RT_KV_FP8].token_bytes);
        CHECK(!pl->rows[HR_RT_KV_Q4].usable && !pl->rows[HR_RT_KV_KIVI2].usable && pl->rows[HR_RT_KV_Q8].usable);
    }
    hr_kv_config kc = {.n_layers = l,
                       .n_kv_heads = 1,
                       .head_dim = d_c + d_rh,
                       .v_from_k = d_c,
                       .block_size = 16,
                       .k_format = HR_KV_F16,
                       .v_format = HR_KV_F16,
                       .max_seqs = 1};
    CHECK(hr_kv_block_bytes(&kc) / 16 == paper);
    const uint64_t mha = (uint64_t)n_h * 2 * d_h * l * 2;
    printf("DeepSeek-V3 shape: %llu bytes a token in f16 (paper: (d_c + d_h^R) l = %d elements), planner %llu, "
           "pool %llu; per-head K and V would take %llu (%.1fx)\n",
           (unsigned long long)paper, (d_c + d_rh) * l, pl ? (unsigned long long)pl->rows[HR_RT_KV_F16].token_bytes : 0,
           (unsigned long long)(hr_kv_block_bytes(&kc) / 16), (unsigned long long)mha, (double)mha / (double)paper);
    free(pl);
}

/* ---- bad input ---- */

/* The synthetic model of `shape` as a GGUF image (f32, seed 1), with sliding_window overridden when
 * window >= 0. */
static void *image(const char *shape, int window, size_t *size) {
    hr_synth_shape s;
    hr_error err = {0};
    hr_gguf_writer *w = NULL;
    void *mem = NULL;
    CHECK(hr_synth_shape_by_name(shape, &s, &err) == HR_OK);
    if (window >= 0) s.sliding_window = window;
    CHECK(hr_synth_build(&s, HR_DTYPE_F32, 1, &w, &err) == HR_OK);
    CHECK(hr_gguf_writer_write_memory(w, &mem, size, &err) == HR_OK);
    hr_gguf_writer_destroy(w);
    return mem;
}

/* Renames `from` in the image (a key or tensor name) to the same-length `to`: the original is absent. */

/* `headroom ARGS` exits 1 with one line on stderr containing needle (and the server never listens). */
static void expect_cli_failure(const char *args, const char *needle) {
    char *out = NULL, *err = NULL;
    int rc = hr_test_run_cli(args, &out, &err);
    CHECKF(rc == 1, "'%s' exited %d", args, rc);
    CHECKF(count_lines(err) == 1 && strstr(err, needle), "'%s': stderr '%s' lacks '%s' or is not one line", args,
           err ? err : "", needle);
    free(out);
    free(err);
}

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

/* deepseek2's own bad input: a missing or mis-shaped latent-attention tensor, an expert stack whose count
 * is not expert_count, a file from before llama.cpp's MLA converter (no key_length_mla), a cache width
 * that is not kv_lora_rank + rope dims, a negative YaRN log multiplier: one message naming the key or
 * tensor, and through the CLI exit 1 with one line. */
static hr_gguf_writer *mla_writer(const char *shape) {
    hr_synth_shape s;
    hr_gguf_writer *w = NULL;
    hr_error err = {0};
    CHECK(hr_synth_shape_by_name(shape, &s, &err) == HR_OK && hr_synth_build(&s, HR_DTYPE_F32, 1, &w, &err) == HR_OK);
    return w;
}

static void *mla_written(hr_gguf_writer *w, size_t *n) {
    void *mem = NULL;
    hr_error err = {0};
    CHECK(w && hr_gguf_writer_write_memory(w, &mem, n, &err) == HR_OK);
    hr_gguf_writer_destroy(w);
    return mem;
}

static void check_mla_bad_input(void) {
    const char *dir = hr_test_tmpdir();
    size_t n;
    void *mem = image("deepseek3-tiny", -1, &n);
    rename_in(mem, n, "blk.1.attn_kv_a_mqa.weight", "blk.1.attn_kv_a_mqx.weight");
    expect_load_error(mem, n, "'blk.1.attn_kv_a_mqa.weight'", dir, "ds-no-kv-a.gguf");
    mem = image("deepseek3-tiny", -1, &n);
    rename_in(mem, n, "blk.2.attn_q_a_norm.weight", "blk.2.attn_q_a_norx.weight");
    expect_load_error(mem, n, "'blk.2.attn_q_a_norm.weight'", dir, "ds-no-q-a-norm.gguf");
    mem = image("deepseek2-tiny", -1, &n);
    rename_in(mem, n, "blk.0.attn_v_b.weight", "blk.0.attn_v_x.weight");
    expect_load_error(mem, n, "'blk.0.attn_v_b.weight'", dir, "ds-no-v-b.gguf");
    mem = image("deepseek3-tiny", -1, &n);
    rename_in(mem, n, "blk.1.ffn_up_shexp.weight", "blk.1.ffn_up_shexx.weight");
    expect_load_error(mem, n, "'blk.1.ffn_up_shexp.weight'", dir, "ds-no-shexp.gguf");
    /* W_UK of 16 latent rows instead of kv_lora_rank 32; an expert stack of 8 where expert_count is 16 */
    mem = image("deepseek3-tiny", -1, &n);
    reshape_in(mem, n, "blk.0.attn_k_b.weight", 1, 16);
    expect_load_error(mem, n, "'blk.0.attn_k_b.weight' has shape [16, 16, 4]", dir, "ds-k-b-shape.gguf");
    mem = image("deepseek3-tiny", -1, &n);
    reshape_in(mem, n, "blk.2.ffn_gate_exps.weight", 2, 8);
    expect_load_error(mem, n, "'blk.2.ffn_gate_exps.weight' has shape [64, 32, 8] (3 dims), expected [64, 32, 16]", dir,
                      "ds-exps-count.gguf");
    mem = image("deepseek3-tiny", -1, &n);
    reshape_in(mem, n, "blk.1.exp_probs_b.bias", 0, 8);
    expect_load_error(mem, n, "'blk.1.exp_probs_b.bias'", dir, "ds-bias-shape.gguf");
    /* keys */
    mem = image("deepseek2-tiny-kvb", -1, &n);
    reshape_in(mem, n, "blk.1.attn_kv_b.weight", 1, 100);
    expect_load_error(mem, n, "'blk.1.attn_kv_b.weight' has shape [32, 100]", dir, "ds-kv-b-shape.gguf");
    mem = image("deepseek2-tiny", -1, &n);
    rename_in(mem, n, "deepseek2.attention.kv_lora_rank", "deepseek2.attention.kv_lora_ranx");
    expect_load_error(mem, n, "'deepseek2.attention.kv_lora_rank'", dir, "ds-no-kv-lora.gguf");
    mem = image("deepseek2-tiny", -1, &n);
    rename_in(mem, n, "deepseek2.attention.key_length_mla", "deepseek2.attention.key_length_mlx");
    expect_load_error(mem, n, "'deepseek2.attention.key_length_mla'", dir, "ds-legacy.gguf");
    mem = image("deepseek3-tiny", -1, &n);
    rename_in(mem, n, "deepseek2.expert_count", "deepseek2.expert_counx");
    expect_load_error(mem, n, "'deepseek2.expert_count'", dir, "ds-no-expert-count.gguf");
    hr_gguf_writer *w = mla_writer("deepseek2-tiny");
    hr_gguf_writer_set_u32(w, "deepseek2.attention.key_length", 40); /* not 32 + 16 */
    mem = mla_written(w, &n);
    expect_load_error(mem, n, "'deepseek2.attention.key_length' = 40", dir, "ds-key-length.gguf");
    w = mla_writer("deepseek3-tiny");
    hr_gguf_writer_set_u32(w, "deepseek2.expert_group_count", 3); /* 16 experts do not split in 3 */
    mem = mla_written(w, &n);
    expect_load_error(mem, n, "'deepseek2.expert_group_count' = 3", dir, "ds-groups.gguf");
    w = mla_writer("deepseek3-tiny");
    hr_gguf_writer_set_u32(w, "deepseek2.expert_gating_func", 4); /* sqrt-softplus: not DeepSeek's */
    mem = mla_written(w, &n);
    expect_load_error(mem, n, "'deepseek2.expert_gating_func' = 4", dir, "ds-gating.gguf");
    w = mla_writer("deepseek2-tiny-yarn");
    hr_gguf_writer_set_f32(w, "deepseek2.rope.scaling.yarn_log_multiplier", -0.0707f); /* a negative temperature */
    mem = mla_written(w, &n);
    expect_load_error(mem, n, "'deepseek2.rope.scaling.yarn_log_multiplier' = -0.0707", dir, "ds-yarn.gguf");

    char args[8400];
    snprintf(args, sizeof args, "run -m %s/ds-k-b-shape.gguf -p hi", dir);
    expect_cli_failure(args, "blk.0.attn_k_b.weight");
    snprintf(args, sizeof args, "run -m %s/ds-yarn.gguf -p hi", dir);
    expect_cli_failure(args, "rope.scaling.yarn_log_multiplier");
    int port = hr_test_free_port();
    snprintf(args, sizeof args, "serve -m %s/ds-exps-count.gguf --host 127.0.0.1 --port %d", dir, port);
    expect_cli_failure(args, "blk.2.ffn_gate_exps.weight");
    /* a KV format the latent cache cannot hold */
    snprintf(args, sizeof args, "synth --shape deepseek2-tiny --type f32 -o %s/ds-ok.gguf", dir);
    CHECK(hr_test_run_cli(args, NULL, NULL) == 0);
    /* a KV format the latent cache cannot hold: a usage error (exit 2, as any --kv-type a shape refuses) */
    snprintf(args, sizeof args, "run -m %s/ds-ok.gguf -p hi --kv-type kivi2", dir);
    char *err = NULL;
    CHECK(hr_test_run_cli(args, NULL, &err) == 2);
    CHECKF(count_lines(err) == 1 && strstr(err, "cannot hold a latent cache"), "'%s'", err ? err : "");
    free(err);
}

/* The runtime builds a latent pool for deepseek2: `run --json` reports one block of 16 tokens x 3 layers
 * x 48 f16 (K only) for a 5 + 5-token request, not twice that. */
static void check_mla_cli_kv(void) {
    const char *dir = hr_test_tmpdir();
    char args[8400], *out = NULL;
    snprintf(args, sizeof args, "synth --shape deepseek3-tiny --type f32 -o %s/ds3.gguf", dir);
    CHECK(hr_test_run_cli(args, NULL, NULL) == 0);
    snprintf(args, sizeof args, "run -m %s/ds3.gguf -p 'the cat' -n 5 --temp 0 --json --ignore-eos", dir);
    CHECK(hr_test_run_cli(args, &out, NULL) == 0);
    json_error_t je;
    json_t *j = out ? json_loads(out, 0, &je) : NULL;
    CHECKF(j && json_integer_value(json_object_get(j, "kv_bytes")) == 16 * 3 * 48 * 2, "%s", out ? out : "");
    json_decref(j);
    free(out);
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
#include "model_faults.h"

/* Fault build: loading each family's model and creating its forward context with the Nth allocation
 * failing, for every N the clean run makes, ends in a clean error (or success) and leaks nothing
 * (LeakSanitizer at exit). */
static void check_alloc_faults(void) {
    const char *shapes[] = {"qwen3-tiny",    "gemma2-tiny",    "gemma3-tiny",       "phi3-tiny",
                            "qwen3moe-tiny", "deepseek3-tiny", "deepseek2-tiny-kvb"};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        size_t n;
        void *mem = image(shapes[i], -1, &n);
        check_model_alloc_faults(mem, n, shapes[i]);
        free(mem);
    }
}
#else
static void check_alloc_faults(void) {}
#endif

int main(void) {
    check_layer_attn();
    check_llamacpp_ids("arch-llamacpp.jsonl", 64);
    check_llamacpp_ids("arch-llamacpp-mla.jsonl", 32); /* deepseek2: latent attention, DeepSeek's MoE, YaRN */
    check_moe();
    check_mla_reference("deepseek2-tiny");
    check_mla_reference("deepseek3-tiny");
    check_mla_reference("deepseek2-tiny-yarn");
    check_mla_batch_invariance();
    check_mla_legacy_kv_b();
    check_mla_kv_formats();
    check_mla_v_from_k_bits();
    check_mla_paper_bytes();
    check_bad_input();
    check_mla_bad_input();
    check_mla_cli_kv();
    check_cli_runs();
    check_alloc_faults();
    check_policy_windows();
    return hr_test_finish();
}

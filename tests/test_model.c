/* test_model.c: the forward pass against a plain float64 reference written here, for synthetic
 * models of each architecture (llama, mistral, qwen2 with Q/K/V biases; qwen3's Q/K norms, gemma2's
 * and gemma3's window layers, soft-caps, post-norms and GeGLU, phi3's fused matrices and LongRoPE),
 * several GQA ratios, tied and separate outputs, Llama-3 RoPE scaling, and a ragged batch that mixes a prefill chunk of
 * one sequence with decode steps of others. Also: a token's logits are bit-identical whether it runs alone or in a
 * batch (batch invariance), and loading errors name the problem. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "harness.h"
#include "model/model.h"
#include "model/synth.h"

/* ---- float64 reference: one sequence, all positions ---- */

typedef struct ref_model {
    const hr_gguf *g;
    hr_hparams hp;
} ref_model;

/* A tensor as doubles: the file's values, also where the load repacked the data (q4_0x16). */
static double *tensor_f64(const hr_model *m, const char *name, int64_t *n_out) {
    const hr_gguf_tensor *t = hr_gguf_find_tensor(hr_model_gguf(m), name);
    if (!t) return NULL;
    int64_t n = 1;
    for (uint32_t i = 0; i < t->n_dims; i++) n *= t->ne[i];
    float *f = malloc(sizeof(float) * (size_t)n);
    const hr_dtype mt = hr_model_tensor_type(m, t);
    if (hr_dtype_get_info(mt)->row_group > 1) {
        char *plain = malloc(t->size_bytes), *tmp = malloc(t->size_bytes);
        memcpy(plain, t->data, t->size_bytes);
        hr_x16_unpack(mt, plain, t->ne[1], t->ne[0], tmp);
        hr_dequantize_row_ref((hr_dtype)t->type, plain, f, n);
        free(plain);
        free(tmp);
    } else {
        hr_dequantize_row_ref((hr_dtype)t->type, t->data, f, n);
    }
    double *d = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) d[i] = f[i];
    free(f);
    if (n_out) *n_out = n;
    return d;
}

static double *layer_tensor(const hr_model *m, int il, const char *suffix) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", il, suffix);
    return tensor_f64(m, name, NULL);
}

/* y[r] = sum_c W[r][c] x[c] */
static void ref_matvec(const double *W, const double *x, int rows, int cols, double *y) {
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++) s += W[(size_t)r * cols + c] * x[c];
        y[r] = s;
    }
}

static void ref_rmsnorm(double *out, const double *x, const double *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double sc = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * sc * w[i];
}

/* The families past llama's, read from the file's metadata here rather than from the loader's
 * hparams where the loader derives them (per-layer windows, RoPE bases, soft-caps, LongRoPE), so that
 * a loader bug shows as a mismatch: the keys and llama.cpp's defaults (gemma2: window 4096 and
 * pattern 2, soft-caps 50 / 30; gemma3: pattern 6, window-layer base 10000). */
typedef struct ref_arch {
    bool gemma, gemma2, qk_norm, phi3;
    double embd_scale, attn_scale, attn_cap, final_cap, mscale;
    int window, pattern;
    double base_swa;
} ref_arch;

static double meta_float(const hr_model *m, const char *suffix, double dflt) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", hr_model_hparams(m)->arch_name, suffix);
    double v = dflt;
    hr_gguf_get_float(hr_model_gguf(m), key, &v, NULL);
    return v;
}

static ref_arch ref_arch_of(const hr_model *m) {
    const hr_hparams *hp = hr_model_hparams(m);
    const char *a = hp->arch_name;
    ref_arch r = {.embd_scale = 1, .mscale = 1, .base_swa = hp->rope_base};
    r.gemma2 = !strcmp(a, "gemma2");
    r.gemma = r.gemma2 || !strcmp(a, "gemma3");
    r.qk_norm = !strcmp(a, "qwen3") || !strcmp(a, "gemma3");
    r.phi3 = !strcmp(a, "phi3");
    r.attn_scale = 1.0 / sqrt((double)hp->head_dim);
    if (r.gemma) {
        r.embd_scale = sqrt((double)hp->n_embd);
        r.attn_cap = r.gemma2 ? meta_float(m, "attn_logit_softcapping", 50) : 0;
        r.final_cap = meta_float(m, "final_logit_softcapping", r.gemma2 ? 30 : 0);
        r.window = (int)meta_float(m, "attention.sliding_window", r.gemma2 ? 4096 : 0);
        r.pattern = (int)meta_float(m, "attention.sliding_window_pattern", r.gemma2 ? 2 : 6);
        r.base_swa = meta_float(m, "rope.freq_base_swa", r.gemma2 ? hp->rope_base : 10000.0);
    } else if (!strcmp(a, "mistral")) {
        r.window = hp->sliding_window;
    }
    r.mscale = meta_float(m, "rope.scaling.attn_factor", 1.0);
    return r;
}

static bool ref_window_layer(const ref_arch *r, int il) {
    return r->window > 0 && (r->pattern == 0 || il % r->pattern < r->pattern - 1);
}

static void ref_rope_base(double *x, const hr_hparams *hp, const double *freq_factors, int pos, double base, double lin,
                          double mscale) {
    int half = hp->n_rot / 2;
    for (int i = 0; i < half; i++) {
        double f = pow(base, -2.0 * i / hp->n_rot);
        if (freq_factors) f /= freq_factors[i];
        double th = pos * lin * f;
        int a = hp->rope_neox ? i : 2 * i, b = hp->rope_neox ? i + half : 2 * i + 1;
        double x0 = x[a], x1 = x[b];
        x[a] = mscale * (x0 * cos(th) - x1 * sin(th));
        x[b] = mscale * (x0 * sin(th) + x1 * cos(th));
    }
}

static double ref_gelu_tanh(double x) { return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }

/* logits (n_tokens x V) for every position of one sequence; max_ctx picks LongRoPE's factors (long
 * where it exceeds rope.scaling.original_context_length) */
static double *ref_forward_ctx(const hr_model *m, const int32_t *toks, int n, int max_ctx, int pol_window) {
    const hr_hparams *hp = hr_model_hparams(m);
    const ref_arch ra = ref_arch_of(m);
    int E = hp->n_embd, F = hp->n_ff, H = hp->n_head, Hkv = hp->n_head_kv, D = hp->head_dim, V = hp->n_vocab;
    int qd = H * D, kvd = Hkv * D;
    double *emb = tensor_f64(m, "token_embd.weight", NULL);
    double *freqs = tensor_f64(m, "rope_freqs.weight", NULL);
    if (ra.phi3) {
        double orig = meta_float(m, "rope.scaling.original_context_length", hp->n_ctx_train);
        freqs = tensor_f64(m, max_ctx > orig ? "rope_factors_long.weight" : "rope_factors_short.weight", NULL);
    }
    double *x = calloc((size_t)n * E, sizeof(double));
    for (int t = 0; t < n; t++)
        for (int i = 0; i < E; i++) x[(size_t)t * E + i] = emb[(size_t)toks[t] * E + i] * ra.embd_scale;
    double *xb = malloc(sizeof(double) * E), *q = malloc(sizeof(double) * (size_t)n * qd);
    double *k = malloc(sizeof(double) * (size_t)n * kvd), *v = malloc(sizeof(double) * (size_t)n * kvd);
    double *att = malloc(sizeof(double) * qd), *tmp = malloc(sizeof(double) * (E > F ? E : F));
    double *hg = malloc(sizeof(double) * F), *hu = malloc(sizeof(double) * F), *sc = malloc(sizeof(double) * n);
    for (int il = 0; il < hp->n_layer; il++) {
        double *an = layer_tensor(m, il, "attn_norm.weight"), *wq = layer_tensor(m, il, "attn_q.weight");
        double *wk = layer_tensor(m, il, "attn_k.weight"), *wv = layer_tensor(m, il, "attn_v.weight");
        double *wqkv = layer_tensor(m, il, "attn_qkv.weight");
        double *wo = layer_tensor(m, il, "attn_output.weight"), *fn = layer_tensor(m, il, "ffn_norm.weight");
        double *wg = layer_tensor(m, il, "ffn_gate.weight"), *wu = layer_tensor(m, il, "ffn_up.weight");
        double *wd = layer_tensor(m, il, "ffn_down.weight");
        double *bq = layer_tensor(m, il, "attn_q.bias"), *bk = layer_tensor(m, il, "attn_k.bias");
        double *bv = layer_tensor(m, il, "attn_v.bias");
        double *qn = layer_tensor(m, il, "attn_q_norm.weight"), *kn = layer_tensor(m, il, "attn_k_norm.weight");
        double *pan = layer_tensor(m, il, "post_attention_norm.weight");
        double *pfn = layer_tensor(m, il, "post_ffw_norm.weight");
        if (wqkv) wq = wqkv, wk = wqkv + (size_t)qd * E, wv = wqkv + (size_t)(qd + kvd) * E; /* row ranges */
        double *gate = wg, *up = wu;
        if (ra.phi3) gate = wu, up = wu + (size_t)F * E; /* ffn_up: gate rows, then up rows */
        const bool win = ref_window_layer(&ra, il);
        /* gemma3: window layers rotate with base_swa and no linear scaling; gemma2 keeps both */
        const double base = win ? ra.base_swa : hp->rope_base;
        const double lin = win && !ra.gemma2 && ra.gemma ? 1.0 : hp->rope_linear_scale;
        for (int t = 0; t < n; t++) {
            ref_rmsnorm(xb, x + (size_t)t * E, an, E, hp->norm_eps);
            ref_matvec(wq, xb, qd, E, q + (size_t)t * qd);
            ref_matvec(wk, xb, kvd, E, k + (size_t)t * kvd);
            ref_matvec(wv, xb, kvd, E, v + (size_t)t * kvd);
            for (int i = 0; bq && i < qd; i++) q[(size_t)t * qd + i] += bq[i];
            for (int i = 0; bk && i < kvd; i++) k[(size_t)t * kvd + i] += bk[i];
            for (int i = 0; bv && i < kvd; i++) v[(size_t)t * kvd + i] += bv[i];
            for (int h = 0; qn && h < H; h++)
                ref_rmsnorm(q + (size_t)t * qd + h * D, q + (size_t)t * qd + h * D, qn, D, hp->norm_eps);
            for (int h = 0; kn && h < Hkv; h++)
                ref_rmsnorm(k + (size_t)t * kvd + h * D, k + (size_t)t * kvd + h * D, kn, D, hp->norm_eps);
            for (int h = 0; h < H; h++) ref_rope_base(q + (size_t)t * qd + h * D, hp, freqs, t, base, lin, ra.mscale);
            for (int h = 0; h < Hkv; h++)
                ref_rope_base(k + (size_t)t * kvd + h * D, hp, freqs, t, base, lin, ra.mscale);
        }
        for (int t = 0; t < n; t++) {
            /* sees s > t - W: the layer's window, or a window policy's, the narrower where both */
            int W = win ? ra.window : 0;
            if (pol_window > 0 && (W == 0 || pol_window < W)) W = pol_window;
            const int s0 = W > 0 && t - W + 1 > 0 ? t - W + 1 : 0;
            for (int h = 0; h < H; h++) {
                int hk = h / (H / Hkv);
                const double *qh = q + (size_t)t * qd + h * D;
                double mx = -1e300;
                for (int s = s0; s <= t; s++) {
                    double d = 0;
                    for (int i = 0; i < D; i++) d += qh[i] * k[(size_t)s * kvd + hk * D + i];
                    sc[s] = d * ra.attn_scale;
                    if (ra.attn_cap > 0) sc[s] = ra.attn_cap * tanh(sc[s] / ra.attn_cap);
                    if (sc[s] > mx) mx = sc[s];
                }
                double sum = 0;
                for (int s = s0; s <= t; s++) sum += (sc[s] = exp(sc[s] - mx));
                for (int i = 0; i < D; i++) {
                    double acc = 0;
                    for (int s = s0; s <= t; s++) acc += sc[s] / sum * v[(size_t)s * kvd + hk * D + i];
                    att[h * D + i] = acc;
                }
            }
            ref_matvec(wo, att, E, qd, tmp);
            if (pan) ref_rmsnorm(tmp, tmp, pan, E, hp->norm_eps);
            for (int i = 0; i < E; i++) x[(size_t)t * E + i] += tmp[i];
            ref_rmsnorm(xb, x + (size_t)t * E, fn, E, hp->norm_eps);
            ref_matvec(gate, xb, F, E, hg);
            ref_matvec(up, xb, F, E, hu);
            for (int i = 0; i < F; i++) hg[i] = (ra.gemma ? ref_gelu_tanh(hg[i]) : hg[i] / (1 + exp(-hg[i]))) * hu[i];
            ref_matvec(wd, hg, E, F, tmp);
            if (pfn) ref_rmsnorm(tmp, tmp, pfn, E, hp->norm_eps);
            for (int i = 0; i < E; i++) x[(size_t)t * E + i] += tmp[i];
        }
        free(an), free(wqkv ? NULL : wq), free(wqkv ? NULL : wk), free(wqkv ? NULL : wv), free(wqkv), free(wo);
        free(fn), free(wg), free(wu), free(wd), free(bq), free(bk), free(bv), free(qn), free(kn), free(pan), free(pfn);
    }
    double *on = tensor_f64(m, "output_norm.weight", NULL), *out = tensor_f64(m, "output.weight", NULL);
    if (!out) out = emb, emb = NULL;
    double *logits = malloc(sizeof(double) * (size_t)n * V);
    for (int t = 0; t < n; t++) {
        ref_rmsnorm(xb, x + (size_t)t * E, on, E, hp->norm_eps);
        ref_matvec(out, xb, V, E, logits + (size_t)t * V);
        for (int i = 0; ra.final_cap > 0 && i < V; i++)
            logits[(size_t)t * V + i] = ra.final_cap * tanh(logits[(size_t)t * V + i] / ra.final_cap);
    }
    free(emb), free(freqs), free(x), free(xb), free(q), free(k), free(v), free(att), free(tmp), free(hg), free(hu);
    free(sc), free(on), free(out);
    return logits;
}

static double *ref_forward(const hr_model *m, const int32_t *toks, int n) {
    return ref_forward_ctx(m, toks, n, 256, 0);
}

/* ---- helpers ---- */

/* When set, build() makes the model with llama.cpp's mix instead of the one type. */
static hr_synth_mix g_mix = HR_SYNTH_PURE;
static const char *g_mix_name = NULL;

static hr_model *build(const hr_synth_shape *shape, hr_dtype type, void **mem) {
    hr_error err = {0};
    hr_model *m = NULL;
    if (g_mix != HR_SYNTH_PURE ? hr_synth_model_mix(shape, g_mix, 5, &m, mem, &err)
                               : hr_synth_model(shape, type, 5, &m, mem, &err)) {
        fprintf(stderr, "build %s: %s\n", shape->name, err.msg);
        exit(1);
    }
    return m;
}

typedef struct rig {
    hr_model *m;
    void *mem;
    hr_kv_pool *kv;
    hr_model_ctx *ctx;
} rig;

static rig rig_open_ctx(const hr_synth_shape *shape, hr_dtype type, hr_kv_format fmt, int n_threads, int max_tokens,
                        int max_ctx) {
    rig r = {0};
    r.m = build(shape, type, &r.mem);
    const hr_hparams *hp = hr_model_hparams(r.m);
    hr_kv_config kc = {.n_layers = hp->n_layer,
                       .n_kv_heads = hp->n_head_kv,
                       .head_dim = hp->head_dim,
                       .block_size = 16,
                       .k_format = fmt,
                       .v_format = fmt,
                       .max_seqs = 16};
    kc.budget_bytes = hr_kv_block_bytes(&kc) * 64;
    hr_error err = {0};
    hr_model_ctx_params mp = {.n_threads = n_threads, .max_batch_tokens = max_tokens, .max_ctx = max_ctx};
    if (hr_kv_pool_create(&kc, &r.kv, &err) || hr_model_ctx_create(r.m, r.kv, &mp, &r.ctx, &err)) {
        fprintf(stderr, "rig: %s\n", err.msg);
        exit(1);
    }
    return r;
}

static rig rig_open(const hr_synth_shape *shape, hr_dtype type, hr_kv_format fmt, int n_threads, int max_tokens) {
    return rig_open_ctx(shape, type, fmt, n_threads, max_tokens, 256);
}

static void rig_close(rig *r) {
    hr_model_ctx_destroy(r->ctx);
    hr_kv_pool_destroy(r->kv);
    hr_model_destroy(r->m);
    free(r->mem);
}

/* max |a - b| / max |b| over n values */
static double rel_err(const float *a, const double *b, int n) {
    double md = 0, mb = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return INFINITY; /* fmax would pass over a NaN */
        md = fmax(md, fabs(a[i] - b[i]));
        mb = fmax(mb, fabs(b[i]));
    }
    return md / (mb > 0 ? mb : 1);
}

/* Two sequences: A prefills 7 tokens then decodes 3, B prefills 3 then decodes; the batches mix
 * A's decode steps with B's prefill. Every position's logits are compared with the reference. */
static void check_against_reference(const hr_synth_shape *shape, hr_dtype type, hr_kv_format fmt, double tol) {
    rig r = rig_open(shape, type, fmt, 2, 32);
    const hr_hparams *hp = hr_model_hparams(r.m);
    int V = hp->n_vocab;
    if (g_mix != HR_SYNTH_PURE || type == HR_DTYPE_Q4_0 || type == HR_DTYPE_Q8_0 || type == HR_DTYPE_Q4_K) {
        /* all but the embedding (every type of the mixes has an x16 layout) */
        const int packed = hr_model_packed_tensors(r.m, NULL);
        CHECKF(packed == 7 * hp->n_layer + !hp->tied_output, "%d matrices repacked, expected %d", packed,
               7 * hp->n_layer + !hp->tied_output);
    }
    int32_t A[10], B[6];
    for (int i = 0; i < 10; i++) A[i] = (i * 37 + 11) % V;
    for (int i = 0; i < 6; i++) B[i] = (i * 53 + 5) % V;
    double *ra = ref_forward(r.m, A, 10), *rb = ref_forward(r.m, B, 6);
    hr_kv_seq sa, sb;
    hr_error err = {0};
    CHECK(hr_kv_seq_create(r.kv, &sa, &err) == HR_OK);
    CHECK(hr_kv_seq_create(r.kv, &sb, &err) == HR_OK);
    float *logits = malloc(sizeof(float) * (size_t)V * 16);
    double worst = 0;
    /* step 1: A's 7-token prefill (all logits) */
    {
        int32_t pos[7];
        hr_kv_seq seq[7];
        uint8_t want[7];
        for (int i = 0; i < 7; i++) pos[i] = i, seq[i] = sa, want[i] = 1;
        hr_kv_seq_reserve(r.kv, sa, 7, &err);
        hr_batch b = {.n_tokens = 7, .tokens = A, .pos = pos, .seq = seq, .want_logits = want};
        CHECK(hr_model_forward(r.ctx, &b, logits, &err) == HR_OK);
        hr_kv_seq_commit(r.kv, sa, A, 7);
        for (int i = 0; i < 7; i++) worst = fmax(worst, rel_err(logits + (size_t)i * V, ra + (size_t)i * V, V));
    }
    /* steps 2-4: one decode token of A + one prefill chunk (or decode token) of B */
    int bpos = 0;
    for (int step = 0; step < 3; step++) {
        int nb = step == 0 ? 3 : step == 1 ? 2 : 1;
        int32_t toks[4], pos[4];
        hr_kv_seq seq[4];
        uint8_t want[4] = {1, 1, 1, 1};
        toks[0] = A[7 + step], pos[0] = 7 + step, seq[0] = sa;
        for (int i = 0; i < nb; i++) toks[1 + i] = B[bpos + i], pos[1 + i] = bpos + i, seq[1 + i] = sb;
        hr_kv_seq_reserve(r.kv, sa, 8 + step, &err);
        hr_kv_seq_reserve(r.kv, sb, bpos + nb, &err);
        hr_batch b = {.n_tokens = 1 + nb, .tokens = toks, .pos = pos, .seq = seq, .want_logits = want};
        CHECK(hr_model_forward(r.ctx, &b, logits, &err) == HR_OK);
        hr_kv_seq_commit(r.kv, sa, toks, 1);
        hr_kv_seq_commit(r.kv, sb, toks + 1, nb);
        worst = fmax(worst, rel_err(logits, ra + (size_t)(7 + step) * V, V));
        for (int i = 0; i < nb; i++)
            worst = fmax(worst, rel_err(logits + (size_t)(1 + i) * V, rb + (size_t)(bpos + i) * V, V));
        bpos += nb;
    }
    CHECKF(worst < tol, "%s (%s, kv %s): max relative logit error %.3g >= %.3g", shape->name,
           hr_dtype_get_info(type)->name, hr_kv_format_name(fmt), worst, tol);
    printf("%-14s %-5s kv %-4s heads %d/%d: max rel error %.2e (tolerance %.0e)\n", shape->name,
           g_mix_name ? g_mix_name : hr_dtype_get_info(type)->name, hr_kv_format_name(fmt), hp->n_head, hp->n_head_kv,
           worst, tol);
    free(logits), free(ra), free(rb);
    rig_close(&r);
}

/* One sequence of n tokens longer than the model's windows: prefill chunks of 11 tokens up to n / 2,
 * then decode steps; every position's logits against the reference run with the same max_ctx (which
 * picks phi3's LongRoPE factors). */
static void check_long_policy(const hr_synth_shape *shape, hr_dtype type, hr_kv_format fmt, int max_ctx, int n,
                              int pol_window, double tol) {
    rig r = rig_open_ctx(shape, type, fmt, 2, 16, max_ctx);
    const hr_hparams *hp = hr_model_hparams(r.m);
    const int V = hp->n_vocab;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)n), pos[16];
    for (int i = 0; i < n; i++) toks[i] = (i * 97 + 13) % V;
    double *ref = ref_forward_ctx(r.m, toks, n, max_ctx, pol_window);
    float *logits = malloc(sizeof(float) * (size_t)V * 16);
    hr_kv_seq s, seq[16];
    uint8_t want[16];
    memset(want, 1, sizeof want);
    hr_error err = {0};
    CHECK(hr_kv_seq_create(r.kv, &s, &err) == HR_OK);
    if (pol_window > 0) {
        char text[32];
        hr_kv_policy pol;
        snprintf(text, sizeof text, "window:%d", pol_window);
        CHECK(hr_kv_policy_parse(text, &pol, &err) == HR_OK);
        CHECKF(hr_kv_seq_set_policy(r.kv, s, &pol, &err) == HR_OK, "%s", err.msg);
    }
    double worst = 0;
    for (int at = 0; at < n;) {
        int chunk = at < n / 2 ? HR_MIN(11, n / 2 - at) : 1;
        for (int i = 0; i < chunk; i++) pos[i] = at + i, seq[i] = s;
        CHECK(hr_kv_seq_reserve(r.kv, s, at + chunk, &err) == HR_OK);
        hr_batch b = {.n_tokens = chunk, .tokens = toks + at, .pos = pos, .seq = seq, .want_logits = want};
        CHECKF(hr_model_forward(r.ctx, &b, logits, &err) == HR_OK, "%s", err.msg);
        hr_kv_seq_commit(r.kv, s, toks + at, chunk);
        for (int i = 0; i < chunk; i++)
            worst = fmax(worst, rel_err(logits + (size_t)i * V, ref + (size_t)(at + i) * V, V));
        at += chunk;
    }
    CHECKF(worst < tol, "%s (%s, kv %s, ctx %d, %d tokens): max relative logit error %.3g >= %.3g", shape->name,
           hr_dtype_get_info(type)->name, hr_kv_format_name(fmt), max_ctx, n, worst, tol);
    printf("%-14s %-5s kv %-4s ctx %3d, %d tokens (windows %d of %d layers, policy window %d): max rel error %.2e "
           "(tolerance %.0e)\n",
           shape->name, hr_dtype_get_info(type)->name, hr_kv_format_name(fmt), max_ctx, n, hp->n_window_layers,
           hp->n_layer, pol_window, worst, tol);
    free(toks), free(ref), free(logits);
    rig_close(&r);
}

static void check_long(const hr_synth_shape *shape, hr_dtype type, hr_kv_format fmt, int max_ctx, int n, double tol) {
    check_long_policy(shape, type, fmt, max_ctx, n, 0, tol);
}

/* llama.cpp's mixes (synth.h): every matrix's type in the file, as llama-quantize assigns it for
 * the llama family, written out here by hand for 8 layers (use_more_bits: layers 0, 3, 6, 7); the
 * fallbacks where rows are not whole super-blocks; then the model loads (the K-quants repacked) and
 * its logits follow the float64 reference. */
/* hr_synth_fallback: llama.cpp's tensor_type_fallback for the types synth writes (--type and --mix). */
static void check_fallbacks(void) {
    CHECK(hr_synth_fallback(HR_DTYPE_Q4_K, 512) == HR_DTYPE_Q4_K);
    CHECK(hr_synth_fallback(HR_DTYPE_Q4_K, 1408) == HR_DTYPE_Q5_0); /* DeepSeek-V2-Lite's expert down */
    CHECK(hr_synth_fallback(HR_DTYPE_Q4_K, 896) == HR_DTYPE_Q5_0);  /* Qwen2.5-0.5B */
    CHECK(hr_synth_fallback(HR_DTYPE_Q5_K, 10944) == HR_DTYPE_Q5_1);
    CHECK(hr_synth_fallback(HR_DTYPE_Q6_K, 896) == HR_DTYPE_Q8_0);
    CHECK(hr_synth_fallback(HR_DTYPE_Q4_K, 48) == HR_DTYPE_F16 && hr_synth_fallback(HR_DTYPE_Q6_K, 48) == HR_DTYPE_F16);
    CHECK(hr_synth_fallback(HR_DTYPE_Q8_0, 48) == HR_DTYPE_F16 &&
          hr_synth_fallback(HR_DTYPE_Q4_0, 64) == HR_DTYPE_Q4_0);
    CHECK(hr_synth_fallback(HR_DTYPE_F32, 7) == HR_DTYPE_F32);
}

static void check_mixes(void) {
    static const struct {
        hr_synth_mix mix;
        const char *name;
        hr_dtype base, more, output;
    } mixes[] = {
        {HR_SYNTH_MIX_Q4_0, "Q4_0", HR_DTYPE_Q4_0, HR_DTYPE_Q4_0, HR_DTYPE_Q6_K},
        {HR_SYNTH_MIX_Q8_0, "q8_0", HR_DTYPE_Q8_0, HR_DTYPE_Q8_0, HR_DTYPE_Q8_0},
        {HR_SYNTH_MIX_Q4_K_M, "Q4_K_M", HR_DTYPE_Q4_K, HR_DTYPE_Q6_K, HR_DTYPE_Q6_K},
        {HR_SYNTH_MIX_Q5_K_M, "q5_k_m", HR_DTYPE_Q5_K, HR_DTYPE_Q6_K, HR_DTYPE_Q6_K},
        {HR_SYNTH_MIX_Q6_K, "Q6_K", HR_DTYPE_Q6_K, HR_DTYPE_Q6_K, HR_DTYPE_Q6_K},
    };
    static const char *const plain[] = {"attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"};
    static const bool more_bits[8] = {true, false, false, true, false, false, true, true};
    hr_error err = {0};
    hr_synth_mix m;
    CHECK(hr_synth_mix_by_name("Q4_K_S", &m, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "Q5_K_M"));
    for (size_t i = 0; i < HR_ARRAY_LEN(mixes); i++) {
        CHECK(hr_synth_mix_by_name(mixes[i].name, &m, &err) == HR_OK && m == mixes[i].mix);
        hr_synth_shape s;
        hr_synth_shape_by_name("tiny", &s, NULL);
        s.name = "llama-mix", s.n_embd = 256, s.n_ff = 512, s.n_head = 4, s.n_head_kv = 2, s.n_layer = 8;
        hr_gguf_writer *w = NULL;
        void *mem = NULL;
        size_t size = 0;
        hr_gguf *g = NULL;
        CHECK(hr_synth_build_mix(&s, m, 1, &w, &err) == HR_OK);
        CHECK(hr_gguf_writer_write_memory(w, &mem, &size, &err) == HR_OK);
        hr_gguf_writer_destroy(w);
        CHECK(hr_gguf_open_memory(mem, size, &g, &err) == HR_OK);
        int bad = 0;
#define EXPECT(tname, want)                                                                                            \
    do {                                                                                                               \
        const hr_gguf_tensor *t = hr_gguf_find_tensor(g, tname);                                                       \
        if (!t || t->type != (uint32_t)(want)) {                                                                       \
            fprintf(stderr, "%s: %s is %s, expected %s\n", mixes[i].name, tname,                                       \
                    t ? hr_gguf_tensor_type_name(t->type) : "missing", hr_dtype_get_info(want)->name);                 \
            bad++;                                                                                                     \
        }                                                                                                              \
    } while (0)
        EXPECT("token_embd.weight", mixes[i].base);
        EXPECT("output.weight", mixes[i].output);
        EXPECT("output_norm.weight", HR_DTYPE_F32);
        char n[64];
        for (int l = 0; l < 8; l++) {
            for (size_t p = 0; p < HR_ARRAY_LEN(plain); p++) {
                snprintf(n, sizeof n, "blk.%d.%s.weight", l, plain[p]);
                EXPECT(n, mixes[i].base);
            }
            snprintf(n, sizeof n, "blk.%d.attn_v.weight", l);
            EXPECT(n, more_bits[l] ? mixes[i].more : mixes[i].base);
            snprintf(n, sizeof n, "blk.%d.ffn_down.weight", l);
            EXPECT(n, more_bits[l] ? mixes[i].more : mixes[i].base);
            snprintf(n, sizeof n, "blk.%d.ffn_norm.weight", l);
            EXPECT(n, HR_DTYPE_F32);
        }
        static const int64_t ftypes[] = {0, 2, 7, 15, 17, 18}; /* llama.cpp's LLAMA_FTYPE_MOSTLY_* */
        int64_t ft = -1;
        CHECK(hr_gguf_get_int(g, "general.file_type", &ft, &err) == HR_OK && ft == ftypes[mixes[i].mix]);
        hr_gguf_close(g);
        free(mem);
        /* a tied output: the embedding takes the output's type; rows of 64 (tiny): no K-quant fits,
         * llama.cpp's q6_K fallback and the output's rule give q8_0; q4_K and q5_K fall back to q5_0 and
         * q5_1 (llama-quant.cpp's tensor_type_fallback) */
        hr_synth_shape t;
        hr_synth_shape_by_name("tiny", &t, NULL);
        t.tied_output = true;
        CHECK(hr_synth_mix_type(m, &t, "token_embd.weight", 256) == mixes[i].output);
        CHECK(hr_synth_mix_type(m, &t, "token_embd.weight", 64) == HR_DTYPE_Q8_0);
        CHECK(hr_synth_mix_type(m, &t, "blk.1.ffn_down.weight", 64) ==
              (mixes[i].base == HR_DTYPE_Q4_0 ? HR_DTYPE_Q4_0 : HR_DTYPE_Q8_0));
        static const hr_dtype plain64[] = {[HR_SYNTH_MIX_Q4_0] = HR_DTYPE_Q4_0,
                                           [HR_SYNTH_MIX_Q8_0] = HR_DTYPE_Q8_0,
                                           [HR_SYNTH_MIX_Q4_K_M] = HR_DTYPE_Q5_0,
                                           [HR_SYNTH_MIX_Q5_K_M] = HR_DTYPE_Q5_1,
                                           [HR_SYNTH_MIX_Q6_K] = HR_DTYPE_Q8_0};
        CHECK(hr_synth_mix_type(m, &t, "blk.0.attn_q.weight", 64) == plain64[mixes[i].mix]);
        CHECK(hr_synth_mix_type(m, &t, "blk.0.attn_q.weight", 896) == plain64[mixes[i].mix]);
        CHECK(hr_synth_mix_type(m, &t, "blk.0.attn_q.weight", 48) == HR_DTYPE_F16);
        CHECKF(bad == 0, "%s: %d tensors of another type than llama.cpp's", mixes[i].name, bad);
#undef EXPECT
        g_mix = m, g_mix_name = mixes[i].name;
        check_against_reference(&s, mixes[i].base, HR_KV_F32, 3e-2);
        g_mix = HR_SYNTH_PURE, g_mix_name = NULL;
    }
}

/* The logits of a sequence's last token are bit-identical alone and inside a larger batch. */
static void check_batch_invariance(void) {
    hr_synth_shape s;
    hr_synth_shape_by_name("tiny", &s, NULL);
    rig r = rig_open(&s, HR_DTYPE_Q8_0, HR_KV_F16, 2, 64);
    int V = hr_model_hparams(r.m)->n_vocab;
    hr_error err;
    int32_t toks[40];
    for (int i = 0; i < 40; i++) toks[i] = (i * 31 + 7) % V;
    float *alone = malloc(sizeof(float) * V), *batched = malloc(sizeof(float) * V * 4);
    /* alone: 9 tokens of one sequence */
    hr_kv_seq s1, s2, s3;
    hr_kv_seq_create(r.kv, &s1, &err);
    int32_t pos[40];
    hr_kv_seq seq[40];
    uint8_t want[40] = {0};
    for (int i = 0; i < 9; i++) pos[i] = i, seq[i] = s1;
    want[8] = 1;
    hr_kv_seq_reserve(r.kv, s1, 9, &err);
    hr_batch b = {.n_tokens = 9, .tokens = toks, .pos = pos, .seq = seq, .want_logits = want};
    CHECK(hr_model_forward(r.ctx, &b, alone, &err) == HR_OK);
    /* batched: the same 9 tokens between two other sequences' 20 and 11 tokens */
    hr_kv_seq_create(r.kv, &s2, &err);
    hr_kv_seq_create(r.kv, &s3, &err);
    int32_t bt[40];
    memset(want, 0, sizeof want);
    int n = 0;
    for (int i = 0; i < 20; i++) bt[n] = toks[(i + 13) % 40], pos[n] = i, seq[n++] = s2;
    for (int i = 0; i < 9; i++) bt[n] = toks[i], pos[n] = i, seq[n++] = s3;
    want[n - 1] = 1;
    for (int i = 0; i < 11; i++) bt[n] = toks[(i + 3) % 40], pos[n] = i, seq[n++] = s1;
    /* s1 is reused from position 0: reset its cache first */
    hr_kv_seq_reset(r.kv, s1);
    hr_kv_seq_reserve(r.kv, s1, 11, &err);
    hr_kv_seq_reserve(r.kv, s2, 20, &err);
    hr_kv_seq_reserve(r.kv, s3, 9, &err);
    b = (hr_batch){.n_tokens = n, .tokens = bt, .pos = pos, .seq = seq, .want_logits = want};
    CHECK(hr_model_forward(r.ctx, &b, batched, &err) == HR_OK);
    CHECK(memcmp(alone, batched, sizeof(float) * V) == 0);
    free(alone), free(batched);
    rig_close(&r);
}

static void check_load_errors(void) {
    hr_error err = {0};
    hr_model *m = NULL;
    CHECK(hr_model_load("/nonexistent/model.gguf", &m, &err) != HR_OK && m == NULL);
    /* unsupported architecture */
    hr_gguf_writer *w = hr_gguf_writer_create(3);
    hr_gguf_writer_set_str(w, "general.architecture", "mamba");
    void *mem;
    size_t size;
    hr_gguf *g = NULL;
    CHECK(hr_gguf_writer_write_memory(w, &mem, &size, &err) == HR_OK);
    hr_gguf_writer_destroy(w);
    CHECK(hr_gguf_open_memory(mem, size, &g, &err) == HR_OK);
    CHECK(hr_model_load_gguf(g, &m, &err) == HR_ERR_UNSUPPORTED && strstr(err.msg, "mamba"));
    free(mem);
    /* a missing tensor is named */
    hr_synth_shape s;
    hr_synth_shape_by_name("tiny", &s, NULL);
    CHECK(hr_synth_build(&s, HR_DTYPE_F32, 1, &w, &err) == HR_OK);
    CHECK(hr_gguf_writer_write_memory(w, &mem, &size, &err) == HR_OK);
    hr_gguf_writer_destroy(w);
    /* break the file's directory by renaming one tensor in place: "blk.1.ffn_up" -> "blk.1.ffn_uq" */
    char *p = memmem(mem, size, "blk.1.ffn_up.weight", 19);
    CHECK(p != NULL);
    if (p) p[11] = 'q';
    CHECK(hr_gguf_open_memory(mem, size, &g, &err) == HR_OK);
    CHECK(hr_model_load_gguf(g, &m, &err) == HR_ERR_FORMAT && strstr(err.msg, "blk.1.ffn_up.weight"));
    free(mem);
}

int main(void) {
    hr_synth_shape s;
    /* llama: GQA ratios 1, 2, 4 and 8, separate output */
    int kv_heads[] = {8, 4, 2, 1};
    for (int i = 0; i < 4; i++) {
        hr_synth_shape_by_name("tiny", &s, NULL);
        s.name = "llama-gqa";
        s.n_embd = 64, s.n_head = 8, s.n_head_kv = kv_heads[i];
        check_against_reference(&s, HR_DTYPE_F32, HR_KV_F32, 1e-4);
    }
    /* llama with tied output and Llama-3 RoPE scaling, in f16 weights and an f16 cache */
    hr_synth_shape_by_name("tiny", &s, NULL);
    s.name = "llama3-tiny", s.tied_output = true, s.llama3_rope = true, s.rope_base = 500000.0f;
    check_against_reference(&s, HR_DTYPE_F32, HR_KV_F32, 1e-4);
    check_against_reference(&s, HR_DTYPE_F16, HR_KV_F16, 1e-3);
    /* mistral and qwen2 (Q/K/V biases, NeoX RoPE, BPE vocabulary) */
    hr_synth_shape_by_name("mistral-tiny", &s, NULL);
    check_against_reference(&s, HR_DTYPE_F32, HR_KV_F32, 1e-4);
    hr_synth_shape_by_name("qwen2-tiny", &s, NULL);
    check_against_reference(&s, HR_DTYPE_F32, HR_KV_F32, 1e-4);
    /* quantized weights go through the q8 activation path: the reference dequantizes the same
     * weights, so the error is the activation quantization's (a few percent at most) */
    hr_synth_shape_by_name("tiny", &s, NULL);
    check_against_reference(&s, HR_DTYPE_Q8_0, HR_KV_F32, 3e-2);
    check_against_reference(&s, HR_DTYPE_Q4_0, HR_KV_F32, 3e-2);
    check_against_reference(&s, HR_DTYPE_Q5_0, HR_KV_F32, 3e-2);
    check_against_reference(&s, HR_DTYPE_Q5_1, HR_KV_F32, 3e-2);
    check_fallbacks();
    s.n_embd = 256, s.n_ff = 512, s.n_head = 4; /* q4_K: rows of whole super-blocks (head_dim 64) */
    check_against_reference(&s, HR_DTYPE_Q4_K, HR_KV_F32, 3e-2);
    /* the families past llama's (synth_arch.c): every position of a 48-token sequence, so that the
     * 16-token windows of gemma's window layers mask; phi3 with LongRoPE's short factors (max_ctx 64,
     * its original context) and long ones; quantized: phi3's fused matrices repacked as row ranges */
    const char *archs[] = {"qwen3-tiny", "gemma2-tiny", "gemma3-tiny", "phi3-tiny"};
    for (size_t i = 0; i < sizeof archs / sizeof *archs; i++) {
        hr_synth_shape_by_name(archs[i], &s, NULL);
        check_against_reference(&s, HR_DTYPE_F32, HR_KV_F32, 1e-4);
        check_long(&s, HR_DTYPE_F32, HR_KV_F32, 256, 48, 1e-4);
    }
    /* gemma3 with Gemma 3 4B+'s linear RoPE scaling (factor 8), which its full layers alone apply */
    hr_synth_shape_by_name("gemma3-tiny-scaled", &s, NULL);
    check_long(&s, HR_DTYPE_F32, HR_KV_F32, 256, 48, 1e-4);
    /* gemma3 cut to 2 layers: every layer a window layer, all rotating with the window base (10000) */
    hr_synth_shape_by_name("gemma3-tiny", &s, NULL);
    s.n_layer = 2;
    check_long(&s, HR_DTYPE_F32, HR_KV_F32, 256, 48, 1e-4);
    /* a window policy wider than gemma2's windows: its full layers see the last 32 positions (the
     * blocks past every layer's window leave the pool), its window layers their own 16 */
    hr_synth_shape_by_name("gemma2-tiny", &s, NULL);
    check_long_policy(&s, HR_DTYPE_F32, HR_KV_F32, 256, 64, 32, 1e-4);
    hr_synth_shape_by_name("phi3-tiny", &s, NULL);
    check_long(&s, HR_DTYPE_F32, HR_KV_F32, 64, 48, 1e-4);
    check_long(&s, HR_DTYPE_Q8_0, HR_KV_F32, 256, 48, 3e-2);
    /* six layers whose Q/K norms rescale the q8 activation rounding: 3.6e-2 measured */
    hr_synth_shape_by_name("gemma3-tiny", &s, NULL);
    check_long(&s, HR_DTYPE_Q8_0, HR_KV_F32, 256, 48, 6e-2);
    check_mixes();
    check_batch_invariance();
    check_load_errors();
    return hr_test_finish();
}

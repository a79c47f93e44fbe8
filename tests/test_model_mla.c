/* test_model_mla.c: deepseek2 (DeepSeek-V2 / V3: multi-head latent attention, DeepSeek's MoE, YaRN)
 * against llama.cpp and an independent implementation, and its bad input. Split from test_model_arch.c
 * (the helpers both use are in model_arch_common.h).
 *   - llama.cpp's greedy ids: tests/vectors/arch-llamacpp-mla.jsonl records what llama.cpp generated on
 *     the four tiny deepseek2 shapes (f32, seed 1), 8 prompts x 64 tokens each; headroom must generate
 *     the same ids with an f16 latent cache and llama.cpp's top-8 logits at 4 steps within 2e-3.
 *   - a float64 reference without absorption (below): a prompt and greedy decode steps in an f32 latent
 *     cache; batch invariance; a legacy attn_kv_b file; the latent cache in every per-token format; a
 *     latent pool's attention against one that stores V; DeepSeek-V3's cache bytes as the paper gives.
 *   - a missing or mis-shaped latent-attention tensor, a bad expert stack, a cache width that is not
 *     kv_lora_rank + rope dims and the like fail to load with one message; through the CLI exit 1 with
 *     one line; `run --json` reports a latent pool's bytes. */
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
#include "model_arch_common.h"
#include "model_images.h"
#include "plan/plan.h"

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
        /* q8: 576 int8 + 9 f16 group scales (16-token blocks padded to 64 bytes: 596 a token and layer); fp8: 576 e4m3
         * + one f32 scale (docs/KV.md's table) */
        CHECKF(pl->rows[HR_RT_KV_Q8].token_bytes == 36356 && pl->rows[HR_RT_KV_FP8].token_bytes == 35380,
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

#if HR_FAULT
/* Fault build: loading each deepseek2 model and creating its forward context with the Nth allocation
 * failing, for every N the clean run makes, ends in a clean error (or success) and leaks nothing
 * (LeakSanitizer at exit). */
static void check_alloc_faults(void) {
    static const char *const shapes[] = {"deepseek3-tiny", "deepseek2-tiny-kvb"};
    check_shapes_alloc_faults(shapes, sizeof shapes / sizeof *shapes);
}
#else
static void check_alloc_faults(void) {}
#endif

int main(void) {
    check_llamacpp_ids("arch-llamacpp-mla.jsonl", 32); /* deepseek2: latent attention, DeepSeek's MoE, YaRN */
    check_mla_reference("deepseek2-tiny");
    check_mla_reference("deepseek3-tiny");
    check_mla_reference("deepseek2-tiny-yarn");
    check_mla_batch_invariance();
    check_mla_legacy_kv_b();
    check_mla_kv_formats();
    check_mla_v_from_k_bits();
    check_mla_paper_bytes();
    check_mla_bad_input();
    check_mla_cli_kv();
    check_alloc_faults();
    return hr_test_finish();
}

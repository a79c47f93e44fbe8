/* kv_attention.c: the CPU storage's writes (one token's K/V into a block slot) and attention (one
 * token's query heads over its sequence's blocks, read in their formats directly). The manager
 * (kv/attend.c) resolves a sequence and position into blocks, slots, tail buffers and a view.
 *
 * Determinism: for a query at n_ctx, every reduction (each q.k, the max, the exp-sum, the P.V sums)
 * runs over tokens 0..n_ctx-1 block by block in the same order with the same kernels, so the result
 * depends only on the cache contents and n_ctx, never on which other sequences or tokens share the
 * batch or which thread runs it.
 *
 * Deferred formats (q4, kivi2): the last block, when a query sees only part of it (n_ctx % B != 0),
 * is read from its f16 tail buffer while it has one (until the commit of its last token); every
 * block the query sees whole is read encoded (the write that completed it encoded it). So the
 * result is the same whether the tokens came in one prefill chunk or one by one. A query over an
 * older prefix of a committed sequence reads the encoded block even for its partial last block.
 *
 * f16 cache (llama.cpp's default, read as ggml's non-flash-attention path does): ggml multiplies an
 * f16 K or V by an f32 operand after converting that operand to f16 (f16's vec_dot_type). So with
 * an f16 K the query is rounded to f16 before q.k, and with an f16 V the softmax probabilities are
 * normalized first and rounded to f16 before P.V (no division at the end). On small models whose
 * logits sit near ties (stories260K q8_0) this decides greedy tokens; it is what makes headroom's
 * output equal llama.cpp's there. Other formats keep f32 q and P and normalize once at the end. */
#include <math.h>
#include <string.h>

#include "backend/cpu/kv_cpu.h"
#include "backend/cpu/ops.h"
#include "common/util.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF /* the scalar softmax follows the AVX2 one's roundings (kv_format.c) */
#endif

void kv_cpu_write(hr_kv_storage *base, int layer, int32_t b, int t, int32_t slot, const float *k, const float *v) {
    kv_cpu *p = (kv_cpu *)base;
    int B = p->B, D = p->D, Hkv = p->Hkv, L = p->L;
    KV_ASSERT(layer >= 0 && layer < L && b >= 0 && b < p->n_blocks && t >= 0 && t < B);
    KV_ASSERT(!p->stage || (slot >= 0 && slot < p->n_stage));
    for (int kind = 0; kind < (p->v_from_k ? 1 : 2); kind++) { /* a latent cache: K only (v unread) */
        const kv_fmt *f = kind == KV_K ? &p->kf : &p->vf;
        const kv_fmt_ops *ops = kind == KV_K ? &p->kops : &p->vops;
        const float *x = kind == KV_K ? k : v;
        if (f->deferred) {
            uint16_t *st = kv_stage_ptr(p, slot, layer, kind);
            for (int h = 0; h < Hkv; h++) {
                uint16_t *row = st + ((size_t)h * B + t) * D;
                for (int c = 0; c < D; c++) row[c] = kv_f32_to_f16(x[(size_t)h * D + c]);
            }
        } else {
            uint8_t *blk = kv_block_ptr(p, layer, kind, b);
            for (int h = 0; h < Hkv; h++) ops->enc_token(f, blk + (size_t)h * f->head_bytes, t, x + (size_t)h * D);
        }
    }
    if (!p->stage) return;
    /* the write that completes the block in this layer encodes it; acq_rel makes the other writers'
     * rows visible to it */
    int done = atomic_fetch_add_explicit(&p->filled[(size_t)slot * L + layer], 1, memory_order_acq_rel) + 1;
    KV_ASSERT(done <= B);
    if (done != B) return;
    for (int kind = 0; kind < 2; kind++) {
        const kv_fmt *f = kind == KV_K ? &p->kf : &p->vf;
        if (!f->deferred) continue;
        const kv_fmt_ops *ops = kind == KV_K ? &p->kops : &p->vops;
        uint8_t *blk = kv_block_ptr(p, layer, kind, b);
        const uint16_t *st = kv_stage_ptr(p, slot, layer, kind);
        for (int h = 0; h < Hkv; h++) ops->enc_block(f, blk + (size_t)h * f->head_bytes, st + (size_t)h * B * D);
    }
}

void kv_scale_round_f16_ref(float *x, int n, float scale) {
    for (int t = 0; t < n; t++) x[t] = kv_f16_to_f32(kv_f32_to_f16(x[t] * scale));
}

/* kv_softmax_avx2's sequence: tokens below n & ~7 get hr_exp_neg and sum in 8 lanes (token t in lane
 * t % 8) reduced as its hsum8; the rest expf, added one by one. The max is exact in any order. */
float kv_softmax_ref(float *s, int n, float scale) {
    int n8 = n & ~7;
    float mx = -INFINITY;
    for (int t = 0; t < n; t++) mx = fmaxf(mx, s[t] *= scale);
    float l[8] = {0};
    for (int t = 0; t < n8; t++) l[t % 8] += (s[t] = hr_exp_neg(s[t] - mx));
    float sum = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    for (int t = n8; t < n; t++) sum += (s[t] = expf(s[t] - mx));
    return sum;
}

/* Soft-capping (gemma2): the scaled scores become cap * tanh(s * scale / cap), after which the
 * softmax scales by 1. Applied before any mask, so a masked score stays -inf. Returns the scale the
 * softmax is to apply. */
static float kv_softcap(float cap, float *sc, int n, float scale) {
    if (cap <= 0.0f) return scale;
    for (int t = 0; t < n; t++) sc[t] = cap * tanhf(sc[t] * scale / cap);
    return 1.0f;
}

/* The softmax's sum for head h: p->softmax's (the scaled scores' max m subtracted), plus, with learned
 * sinks (gpt-oss), e^(sink_h - m), the sink's share of the denominator (llama.cpp takes the max over the
 * scores and the sink; the ratios are the same, only roundings differ). Without sinks: p->softmax alone,
 * the path every other model takes, unchanged. */
static float kv_softmax_sum(const kv_cpu *p, const hr_kv_attn_args *a, int h, float *sc, int n, float scale) {
    if (!a->sinks) return p->softmax(sc, n, scale);
    float mx = -INFINITY;
    for (int t = 0; t < n; t++) mx = fmaxf(mx, sc[t] * scale); /* the max p->softmax subtracts */
    return p->softmax(sc, n, scale) + expf(a->sinks[h] - mx);
}

/* The query a head's q.K reads, in buf (head_dim floats) when it differs from q itself:
 *   - keys stored rotated (q4h): the query rotated by the same transform, once per head;
 *   - an f16 K: the query rounded to f16, as the reference engine reads an f16 cache;
 *   - otherwise the query itself. */
static const float *kv_query(const kv_cpu *p, const float *qh, float *buf) {
    if (p->kf.rotate) {
        memcpy(buf, qh, (size_t)p->D * sizeof *buf);
        kv_hadamard(buf, p->D);
        return buf;
    }
    if (p->kf.format != HR_KV_F16) return qh;
    memcpy(buf, qh, (size_t)p->D * sizeof *buf);
    p->scale_round_f16(buf, p->D, 1.0f);
    return buf;
}

/* After the softmax (sc: n exp weights summing to sum): with an f16 V the weights become
 * f16(e / sum) and 1 is returned (nothing left to divide by); otherwise 1 / sum, for the end. */
static float kv_weights(const kv_cpu *p, float *sc, int n, float sum) {
    float inv = 1.0f / sum;
    if (p->vf.format != HR_KV_F16) return inv;
    p->scale_round_f16(sc, n, inv);
    return 1.0f;
}

/* P.V over one block's head region (w: n weights) into oh. A latent cache's V is the first v_from_k dims
 * of each K row: only those are summed (rounded up to the kernels' 16-channel steps), not the RoPE key
 * behind them, with the bits the whole row's sums had on those dims (each channel's sum is its own). */
static inline void kv_accum_v(const kv_cpu *p, const uint8_t *head, int n, const float *w, float *oh) {
    const int nc = (p->v_from_k + 15) & ~15;
    if (p->v_from_k && nc < p->D)
        p->vops.accum_first(&p->vf, head, n, w, nc, oh);
    else
        p->vops.accum(&p->vf, head, n, w, oh);
}

/* oh (one head's output) times inv; a latent cache's past V's dims set to 0 (what was summed there is
 * not V) */
static inline void kv_finish_head(const kv_cpu *p, float *oh, float inv) {
    const int nv = p->v_from_k ? p->v_from_k : p->D;
    for (int d = 0; d < nv; d++) oh[d] *= inv;
    memset(oh + nv, 0, (size_t)(p->D - nv) * sizeof *oh);
}

/* ---- attention under a view -----------------------------------------------------------------------
 * The blocks a query reads are [0, sink_blocks) and [first_blk, n_blk) (the manager computed them
 * from the policy: for window-like ones first_blk = lo / B, lo the first position the window sees;
 * token-level ones read every block still in the table). Their scores are packed block after block
 * as in the full path, so with nothing masked the result is the full path's bit for bit. A token the
 * view hides gets a score of -inf before the softmax and a weight of exactly 0 after it. */

static inline int kv_view_next(const hr_kv_attn_view *v, int j) {
    return j + 1 == v->sink_blocks ? v->first_blk : j + 1;
}

static inline size_t kv_meta_index(const kv_cpu *p, int j, int layer, int kh) {
    return ((size_t)j * p->L + (size_t)layer) * p->Hkv + (size_t)kh;
}

/* Hides the tokens of logical block j (n of them) that the view masks: score -inf or weight 0. */
static void kv_view_mask(const kv_cpu *p, const hr_kv_attn_view *v, int layer, int kh, int j, int n, float *sc,
                         float fill) {
    int B = p->B;
    if (v->mask) {
        const uint64_t *m = v->mask + kv_meta_index(p, j, layer, kh) * (size_t)((B + 63) / 64);
        for (int t = 0; t < n; t++)
            if (!((m[t / 64] >> (t % 64)) & 1)) sc[t] = fill;
        return;
    }
    int p0 = j * B;
    if (p0 >= v->lo || p0 + n <= v->sinks) return; /* wholly visible */
    for (int t = 0; t < n; t++)
        if (p0 + t >= v->sinks && p0 + t < v->lo) sc[t] = fill;
}

#define KV_GROUP_MAX_D 256 /* the group paths' rounded queries live on the stack: G x D floats */

/* q.K of block b (logical j of n_blk, n tokens) for G heads of KV head kh into blk[g]: the group kernel
 * (G >= 2), a deferred format's last partial block from its f16 tail buffer stk, or the one-head dot. */
static void kv_dot_block(const kv_cpu *p, int layer, int kh, int32_t b, bool tail, const uint16_t *stk, int n,
                         const float *const *qg, int G, float *row, float *const *blk) {
    if (G >= 2)
        p->kops.dot_heads(&p->kf, kv_block_ptr(p, layer, KV_K, b) + (size_t)kh * p->kf.head_bytes, n, qg, G, blk);
    else if (tail && stk && p->kf.deferred)
        p->sops.dot(&p->sf, (const uint8_t *)(stk + (size_t)kh * p->B * p->D), n, qg[0], row, blk[0]);
    else
        p->kops.dot(&p->kf, kv_block_ptr(p, layer, KV_K, b) + (size_t)kh * p->kf.head_bytes, n, qg[0], row, blk[0]);
}

/* P.V of the same block with weights blk[g] into oh[g], the same three ways. */
static void kv_accum_block(const kv_cpu *p, int layer, int kh, int32_t b, bool tail, const uint16_t *stv, int n,
                           float *const *blk, int G, float *const *oh) {
    if (G >= 2)
        p->vops.accum_heads(&p->vf, kv_block_ptr(p, layer, KV_V, b) + (size_t)kh * p->vf.head_bytes, n,
                            (const float *const *)blk, G, oh);
    else if (tail && stv && p->vf.deferred)
        p->sops.accum(&p->sf, (const uint8_t *)(stv + (size_t)kh * p->B * p->D), n, blk[0], oh[0]);
    else
        kv_accum_v(p, kv_block_ptr(p, layer, KV_V, b) + (size_t)kh * p->vf.head_bytes, n, blk[0], oh[0]);
}

/* Query heads [h0, h0 + G) of one KV head under the view: G == 1 with the one-head kernels (and a
 * deferred format's tail buffer), G >= 2 (at most a->group) with the group kernels, each block's K and V
 * read once for the G heads. Head h0 + g's scores lie at scratch + g x n_vis x B, the row buffer of
 * per-channel formats after all of them; every step per head is the one-head path's, in its order. */
static void attention_view_heads(const kv_cpu *p, int layer, const hr_kv_attn_query *aq, const hr_kv_attn_args *a,
                                 int h0, int G, float *scratch) {
    int B = p->B, D = p->D;
    int n_ctx = aq->n_ctx, n_blk = (n_ctx + B - 1) / B;
    const int kh = h0 / (a->n_heads / p->Hkv);
    const int32_t *table = aq->table;
    const hr_kv_attn_view v = *aq->view;
    atomic_uint_fast64_t *acc = v.score;

    int32_t slot = aq->tail_stage;
    const uint16_t *stk = slot >= 0 ? kv_stage_ptr(p, slot, layer, KV_K) : NULL;
    const uint16_t *stv = slot >= 0 ? kv_stage_ptr(p, slot, layer, KV_V) : NULL;
    int n_vis = 0;
    for (int j = v.sink_blocks > 0 ? 0 : v.first_blk; j < n_blk; j = kv_view_next(&v, j)) n_vis += table[j] >= 0;
    const size_t stride = (size_t)n_vis * B;
    float *row = scratch + (size_t)G * stride;
    float q16[HR_KV_ATTN_GROUP * KV_GROUP_MAX_D]; /* G x D <= this (G == 1: D <= KV_MAX_HEAD_DIM) */
    const float *qg[HR_KV_ATTN_GROUP];
    float *sc[HR_KV_ATTN_GROUP], *oh[HR_KV_ATTN_GROUP], *blk[HR_KV_ATTN_GROUP], inv[HR_KV_ATTN_GROUP];
    float sm_scale[HR_KV_ATTN_GROUP];
    for (int g = 0; g < G; g++) {
        qg[g] = kv_query(p, aq->q + (size_t)(h0 + g) * D, q16 + (size_t)g * D);
        sc[g] = scratch + (size_t)g * stride;
        oh[g] = aq->out + (size_t)(h0 + g) * D;
        sm_scale[g] = a->scale;
    }
    int n_sc = 0, k = 0;
    for (int j = v.sink_blocks > 0 ? 0 : v.first_blk; j < n_blk; j = kv_view_next(&v, j)) {
        int32_t b = table[j];
        if (b < 0) continue; /* dropped: a query over an older prefix would have needed it */
        int n = (j == n_blk - 1) ? n_ctx - j * B : B;
        for (int g = 0; g < G; g++) blk[g] = sc[g] + (size_t)k * B;
        kv_dot_block(p, layer, kh, b, j == n_blk - 1, stk, n, qg, G, row, blk);
        for (int g = 0; g < G; g++) {
            sm_scale[g] = kv_softcap(a->softcap, blk[g], n, a->scale);
            kv_view_mask(p, &v, layer, kh, j, n, blk[g], -INFINITY);
        }
        n_sc = k * B + n;
        k++;
    }
    for (int g = 0; g < G; g++) {
        inv[g] = kv_weights(p, sc[g], n_sc, kv_softmax_sum(p, a, h0 + g, sc[g], n_sc, sm_scale[g]));
        memset(oh[g], 0, (size_t)D * sizeof *oh[g]);
    }
    k = 0;
    for (int j = v.sink_blocks > 0 ? 0 : v.first_blk; j < n_blk; j = kv_view_next(&v, j)) {
        int32_t b = table[j];
        if (b < 0) continue;
        int n = (j == n_blk - 1) ? n_ctx - j * B : B;
        for (int g = 0; g < G; g++) {
            blk[g] = sc[g] + (size_t)k * B;
            kv_view_mask(p, &v, layer, kh, j, n, blk[g], 0.0f);
        }
        kv_accum_block(p, layer, kh, b, j == n_blk - 1, stv, n, blk, G, oh);
        if (acc) {
            atomic_uint_fast64_t *w = acc + kv_meta_index(p, j, layer, kh) * B;
            for (int g = 0; g < G; g++)
                for (int t = 0; t < n; t++)
                    if (blk[g][t] > 0.0f)
                        atomic_fetch_add_explicit(&w[t], (uint64_t)((double)(blk[g][t] * inv[g]) * 4294967296.0 + 0.5),
                                                  memory_order_relaxed);
        }
        k++;
    }
    for (int g = 0; g < G; g++) kv_finish_head(p, oh[g], inv[g]);
}

/* Whether a query's heads may go through the group kernels: the formats have them, the scratch holds
 * a group's scores, and the blocks are read as stored (not a deferred format's tail buffer, not a
 * latent V). Returns the largest group, or 1. */
static int kv_group_size(const kv_cpu *p, const hr_kv_attn_query *aq, const hr_kv_attn_args *a) {
    const int gmax = HR_MIN(HR_MIN(a->group, a->n_heads / p->Hkv), HR_KV_ATTN_GROUP);
    const bool ok = gmax >= 2 && p->kops.dot_heads && p->vops.accum_heads && p->D <= KV_GROUP_MAX_D && !p->v_from_k &&
                    !(aq->tail_stage >= 0 && (p->kf.deferred || p->vf.deferred));
    return ok ? gmax : 1;
}

/* The heads [head_begin, head_end) of a query in groups of one KV head's heads (at most gmax), each
 * through fn. */
typedef void (*kv_heads_fn)(const kv_cpu *p, int layer, const hr_kv_attn_query *aq, const hr_kv_attn_args *a, int h0,
                            int G, float *scratch);
static void kv_each_group(const kv_cpu *p, int layer, const hr_kv_attn_query *aq, const hr_kv_attn_args *a,
                          float *scratch, kv_heads_fn fn) {
    const int group = a->n_heads / p->Hkv, head_end = hr_kv_attn_head_end(a), gmax = kv_group_size(p, aq, a);
    for (int h = a->head_begin; h < head_end;) {
        const int G = HR_MIN(gmax, HR_MIN(head_end, (h / group + 1) * group) - h);
        fn(p, layer, aq, a, h, G, scratch);
        h += G;
    }
}

static void attention_view(const kv_cpu *p, int layer, const hr_kv_attn_query *aq, const hr_kv_attn_args *a,
                           float *scratch) {
    kv_each_group(p, layer, aq, a, scratch, attention_view_heads);
}

/* Query heads [h0, h0 + G) of one KV head over every position of [0, n_ctx) (no policy, no holes): the
 * path of a full sequence. G == 1 with the one-head kernels (and a deferred format's tail buffer), G >= 2
 * with the group kernels, each block's K and V read once for the G heads; head h0 + g's scores lie at
 * scratch + g x n_blk x B (packed, so token t is its scores[t]), the row buffer after them. Every step
 * per head is the one-head path's, in its order, so each head's output has the bits it has alone. */
static void attention_full_heads(const kv_cpu *p, int layer, const hr_kv_attn_query *aq, const hr_kv_attn_args *a,
                                 int h0, int G, float *scratch) {
    int B = p->B, D = p->D, n_ctx = aq->n_ctx, n_blk = (n_ctx + B - 1) / B;
    const int kh = h0 / (a->n_heads / p->Hkv);
    int32_t slot = aq->tail_stage;
    const uint16_t *stk = slot >= 0 ? kv_stage_ptr(p, slot, layer, KV_K) : NULL;
    const uint16_t *stv = slot >= 0 ? kv_stage_ptr(p, slot, layer, KV_V) : NULL;
    const size_t stride = (size_t)n_blk * B;
    float *row = scratch + (size_t)G * stride;
    float q16[HR_KV_ATTN_GROUP * KV_GROUP_MAX_D]; /* G x D <= this (G == 1: D <= KV_MAX_HEAD_DIM) */
    const float *qg[HR_KV_ATTN_GROUP];
    float *sc[HR_KV_ATTN_GROUP], *oh[HR_KV_ATTN_GROUP], *blk[HR_KV_ATTN_GROUP], inv[HR_KV_ATTN_GROUP];
    for (int g = 0; g < G; g++) {
        qg[g] = kv_query(p, aq->q + (size_t)(h0 + g) * D, q16 + (size_t)g * D);
        sc[g] = scratch + (size_t)g * stride;
        oh[g] = aq->out + (size_t)(h0 + g) * D;
    }
    /* scores = q . k for every cached token, block by block */
    for (int j = 0; j < n_blk; j++) {
        int n = (j == n_blk - 1) ? n_ctx - j * B : B;
        for (int g = 0; g < G; g++) blk[g] = sc[g] + (size_t)j * B;
        kv_dot_block(p, layer, kh, aq->table[j], j == n_blk - 1, stk, n, qg, G, row, blk);
    }
    /* softmax with the max subtracted */
    for (int g = 0; g < G; g++) {
        const float sm_scale = kv_softcap(a->softcap, sc[g], n_ctx, a->scale);
        inv[g] = kv_weights(p, sc[g], n_ctx, kv_softmax_sum(p, a, h0 + g, sc[g], n_ctx, sm_scale));
        memset(oh[g], 0, (size_t)D * sizeof *oh[g]);
    }
    /* out = sum_t p_t v_t, normalized once at the end (unless kv_weights did) */
    for (int j = 0; j < n_blk; j++) {
        int n = (j == n_blk - 1) ? n_ctx - j * B : B;
        for (int g = 0; g < G; g++) blk[g] = sc[g] + (size_t)j * B;
        kv_accum_block(p, layer, kh, aq->table[j], j == n_blk - 1, stv, n, blk, G, oh);
    }
    for (int g = 0; g < G; g++) kv_finish_head(p, oh[g], inv[g]);
}

static void attention_full(const kv_cpu *p, int layer, const hr_kv_attn_query *aq, const hr_kv_attn_args *a,
                           float *scratch) {
    kv_each_group(p, layer, aq, a, scratch, attention_full_heads);
}

void kv_cpu_attend(const hr_kv_storage *st, int layer, const hr_kv_attn_query *qs, int n, const hr_kv_attn_args *a,
                   float *scratch) {
    const kv_cpu *p = (const kv_cpu *)st;
    KV_ASSERT(layer >= 0 && layer < p->L && a->n_heads % p->Hkv == 0);
    for (int i = 0; i < n; i++) {
        const hr_kv_attn_query *aq = &qs[i];
        if (aq->n_ctx <= 0) {
            memset(aq->out + (size_t)a->head_begin * p->D, 0,
                   (size_t)(hr_kv_attn_head_end(a) - a->head_begin) * p->D * sizeof *aq->out);
        } else if (aq->view)
            attention_view(p, layer, aq, a, scratch);
        else
            attention_full(p, layer, aq, a, scratch);
    }
}

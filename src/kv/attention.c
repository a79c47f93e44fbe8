/* attention.c: writing one token's K/V into its block, and attention of one token's query heads over
 * a sequence's blocks, read in their formats directly.
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

#include "kv/kv_internal.h"

void hr_kv_write(hr_kv_pool *p, int layer, hr_kv_seq seq, int pos, const float *k, const float *v) {
    KV_ASSERT(kv_seq_valid(p, seq) && layer >= 0 && layer < p->cfg.n_layers);
    const kv_seq *s = &p->seqs[seq];
    int B = p->cfg.block_size, D = p->cfg.head_dim, Hkv = p->cfg.n_kv_heads, L = p->cfg.n_layers;
    int bi = pos / B, t = pos % B;
    KV_ASSERT(pos >= 0 && bi < s->n_table);
    int32_t b = s->table[bi];
    /* a shared or hashed (full, committed) block is never written */
    KV_ASSERT(p->refcnt[b] == 1 && p->flags[b] == 0);
    int32_t slot = p->stage ? p->blk_stage[b] : -1;
    KV_ASSERT(!p->stage || slot >= 0);
    for (int kind = 0; kind < 2; kind++) {
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
    int done = atomic_fetch_add_explicit(&p->filled[(size_t)b * L + layer], 1, memory_order_acq_rel) + 1;
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

float kv_softmax_ref(float *s, int n, float scale) {
    float mx = -INFINITY;
    for (int t = 0; t < n; t++) mx = fmaxf(mx, s[t] *= scale);
    float sum = 0.0f;
    for (int t = 0; t < n; t++) sum += (s[t] = expf(s[t] - mx));
    return sum;
}

/* Soft-capping (gemma2): the scaled scores become cap * tanh(s * scale / cap), after which the
 * softmax scales by 1. Applied before any mask, so a masked score stays -inf. Returns the scale the
 * softmax is to apply. */
static float kv_softcap(const hr_kv_pool *p, float *sc, int n, float scale) {
    const float cap = p->attn_softcap;
    if (cap <= 0.0f) return scale;
    for (int t = 0; t < n; t++) sc[t] = cap * tanhf(sc[t] * scale / cap);
    return 1.0f;
}

/* The query a head's q.K reads, in buf (head_dim floats) when it differs from q itself:
 *   - keys stored rotated (q4h): the query rotated by the same transform, once per head;
 *   - an f16 K: the query rounded to f16, as the reference engine reads an f16 cache;
 *   - otherwise the query itself. */
static const float *kv_query(const hr_kv_pool *p, const float *qh, float *buf) {
    if (p->kf.rotate) {
        memcpy(buf, qh, (size_t)p->cfg.head_dim * sizeof *buf);
        kv_hadamard(buf, p->cfg.head_dim);
        return buf;
    }
    if (p->kf.format != HR_KV_F16) return qh;
    memcpy(buf, qh, (size_t)p->cfg.head_dim * sizeof *buf);
    p->scale_round_f16(buf, p->cfg.head_dim, 1.0f);
    return buf;
}

/* After the softmax (sc: n exp weights summing to sum): with an f16 V the weights become
 * f16(e / sum) and 1 is returned (nothing left to divide by); otherwise 1 / sum, for the end. */
static float kv_weights(const hr_kv_pool *p, float *sc, int n, float sum) {
    float inv = 1.0f / sum;
    if (p->vf.format != HR_KV_F16) return inv;
    p->scale_round_f16(sc, n, inv);
    return 1.0f;
}

size_t hr_kv_attention_scratch_floats_for(const hr_kv_config *cfg, int n_ctx) {
    /* scores (n_ctx, padded to a block) + one head-row for per-channel formats + slack for SIMD */
    int B = cfg->block_size > 0 ? cfg->block_size : 1;
    size_t n = ((size_t)(n_ctx > 0 ? n_ctx : 0) + B - 1) / B * B;
    return n + (size_t)cfg->head_dim + 16;
}
size_t hr_kv_attention_scratch_floats(const hr_kv_pool *p, int n_ctx) {
    return hr_kv_attention_scratch_floats_for(&p->cfg, n_ctx);
}

/* ---- attention under a policy ---------------------------------------------------------------------
 * The blocks a query reads are [0, sink_blocks) and [lo / B, n_blk) for window-like policies (lo = the
 * first position its window sees), or every block still in the table for token-level ones. Their
 * scores are packed block after block as in the full path, so with nothing masked the result is the
 * full path's bit for bit. A token the policy hides gets a score of -inf before the softmax and a
 * weight of exactly 0 after it. */

typedef struct kv_view {
    int n_ctx, n_blk;
    int sink_blocks, first_blk; /* visible: [0, sink_blocks) and [first_blk, n_blk) */
    int sinks, lo;              /* window-like: position t visible iff t < sinks || t >= lo */
    const uint64_t *mask;       /* token-level: the sequence's masks, else NULL */
} kv_view;

static inline int kv_view_next(const kv_view *v, int j) { return j + 1 == v->sink_blocks ? v->first_blk : j + 1; }

/* Hides the tokens of logical block j (n of them) that the view masks: score -inf or weight 0. */
static void kv_view_mask(const hr_kv_pool *p, const kv_view *v, int layer, int kh, int j, int n, float *sc,
                         float fill) {
    int B = p->cfg.block_size;
    if (v->mask) {
        const uint64_t *m = v->mask + kv_meta_index(p, j, layer, kh) * kv_mask_words(p);
        for (int t = 0; t < n; t++)
            if (!((m[t / 64] >> (t % 64)) & 1)) sc[t] = fill;
        return;
    }
    int p0 = j * B;
    if (p0 >= v->lo || p0 + n <= v->sinks) return; /* wholly visible */
    for (int t = 0; t < n; t++)
        if (p0 + t >= v->sinks && p0 + t < v->lo) sc[t] = fill;
}

static void attention_policy(const hr_kv_pool *p, int layer, const kv_seq *s, int n_ctx, const float *q, int n_heads,
                             float scale, float *out, float *scratch) {
    const hr_kv_config *c = &p->cfg;
    int B = c->block_size, D = c->head_dim, Hkv = c->n_kv_heads;
    int group = n_heads / Hkv;
    kv_view v = {.n_ctx = n_ctx, .n_blk = (n_ctx + B - 1) / B, .sinks = kv_policy_sinks(s)};
    int W = kv_layer_window(p, s, layer);
    v.lo = W > 0 && n_ctx - W > 0 ? n_ctx - W : 0;
    v.first_blk = v.lo / B;
    v.sink_blocks = (v.sinks + B - 1) / B;
    if (v.sink_blocks >= v.first_blk) v.sink_blocks = v.first_blk = 0; /* the two ranges meet */
    if (v.lo <= v.sinks) v.lo = 0;
    v.mask = kv_token_level(s) ? s->mask : NULL;
    /* token-level: add the weights to the scores (h2o: every query; snapkv: the observation window) */
    atomic_uint_fast64_t *acc = NULL;
    if (s->pol.kind == HR_KV_POLICY_H2O) acc = s->score;
    if (s->pol.kind == HR_KV_POLICY_SNAPKV && !s->snap_done) {
        int end = kv_snap_end(s);
        if (n_ctx <= end && n_ctx > end - kv_snap_window(&s->pol)) acc = s->score;
    }

    int32_t last = s->table[v.n_blk - 1];
    int32_t slot = (p->stage && n_ctx % B != 0) ? p->blk_stage[last] : -1;
    const uint16_t *stk = slot >= 0 ? kv_stage_ptr(p, slot, layer, KV_K) : NULL;
    const uint16_t *stv = slot >= 0 ? kv_stage_ptr(p, slot, layer, KV_V) : NULL;
    int n_vis = 0;
    for (int j = v.sink_blocks > 0 ? 0 : v.first_blk; j < v.n_blk; j = kv_view_next(&v, j)) n_vis += s->table[j] >= 0;
    float *scores = scratch;
    float *row = scratch + (size_t)n_vis * B; /* scratch holds n_vis * B scores, then one head-row */
    float q16[KV_MAX_HEAD_DIM];

    for (int h = 0; h < n_heads; h++) {
        int kh = h / group;
        const float *qh = kv_query(p, q + (size_t)h * D, q16);
        float *oh = out + (size_t)h * D;
        int n_sc = 0, k = 0;
        float sm_scale = scale;
        for (int j = v.sink_blocks > 0 ? 0 : v.first_blk; j < v.n_blk; j = kv_view_next(&v, j)) {
            int32_t b = s->table[j];
            if (b < 0) continue; /* dropped: a query over an older prefix would have needed it */
            int n = (j == v.n_blk - 1) ? n_ctx - j * B : B;
            float *sc = scores + (size_t)k * B;
            if (j == v.n_blk - 1 && stk && p->kf.deferred)
                p->sops.dot(&p->sf, (const uint8_t *)(stk + (size_t)kh * B * D), n, qh, row, sc);
            else
                p->kops.dot(&p->kf, kv_block_ptr(p, layer, KV_K, b) + (size_t)kh * p->kf.head_bytes, n, qh, row, sc);
            sm_scale = kv_softcap(p, sc, n, scale);
            kv_view_mask(p, &v, layer, kh, j, n, sc, -INFINITY);
            n_sc = k * B + n;
            k++;
        }
        float inv = kv_weights(p, scores, n_sc, p->softmax(scores, n_sc, sm_scale));
        memset(oh, 0, (size_t)D * sizeof *oh);
        k = 0;
        for (int j = v.sink_blocks > 0 ? 0 : v.first_blk; j < v.n_blk; j = kv_view_next(&v, j)) {
            int32_t b = s->table[j];
            if (b < 0) continue;
            int n = (j == v.n_blk - 1) ? n_ctx - j * B : B;
            float *sc = scores + (size_t)k * B;
            kv_view_mask(p, &v, layer, kh, j, n, sc, 0.0f);
            if (j == v.n_blk - 1 && stv && p->vf.deferred)
                p->sops.accum(&p->sf, (const uint8_t *)(stv + (size_t)kh * B * D), n, sc, oh);
            else
                p->vops.accum(&p->vf, kv_block_ptr(p, layer, KV_V, b) + (size_t)kh * p->vf.head_bytes, n, sc, oh);
            if (acc) {
                atomic_uint_fast64_t *a = acc + kv_meta_index(p, j, layer, kh) * B;
                for (int t = 0; t < n; t++)
                    if (sc[t] > 0.0f)
                        atomic_fetch_add_explicit(&a[t], (uint64_t)((double)(sc[t] * inv) * 4294967296.0 + 0.5),
                                                  memory_order_relaxed);
            }
            k++;
        }
        for (int d = 0; d < D; d++) oh[d] *= inv;
    }
}

void hr_kv_attention(const hr_kv_pool *p, int layer, hr_kv_seq seq, int n_ctx, const float *q, int n_heads, float scale,
                     float *out, float *scratch) {
    const hr_kv_config *c = &p->cfg;
    int B = c->block_size, D = c->head_dim, Hkv = c->n_kv_heads;
    KV_ASSERT(kv_seq_valid(p, seq) && layer >= 0 && layer < c->n_layers);
    KV_ASSERT(n_heads % Hkv == 0);
    const kv_seq *s = &p->seqs[seq];
    KV_ASSERT(n_ctx >= 0 && n_ctx <= s->n_table * B);
    if (n_ctx <= 0) {
        memset(out, 0, (size_t)n_heads * D * sizeof *out);
        return;
    }
    if (s->pol.kind != HR_KV_POLICY_FULL || p->native_window[layer] > 0 || s->n_holes > 0) {
        attention_policy(p, layer, s, n_ctx, q, n_heads, scale, out, scratch);
        return;
    }
    int group = n_heads / Hkv;
    int n_blk = (n_ctx + B - 1) / B;
    /* the last block, when partial for this query, is read from its f16 tail buffer (q4/kivi2) */
    int32_t slot = (p->stage && n_ctx % B != 0) ? p->blk_stage[s->table[n_blk - 1]] : -1;
    const uint16_t *stk = slot >= 0 ? kv_stage_ptr(p, slot, layer, KV_K) : NULL;
    const uint16_t *stv = slot >= 0 ? kv_stage_ptr(p, slot, layer, KV_V) : NULL;
    float *scores = scratch;
    float *row = scratch + (size_t)n_blk * B;
    float q16[KV_MAX_HEAD_DIM];

    for (int h = 0; h < n_heads; h++) {
        int kh = h / group;
        const float *qh = kv_query(p, q + (size_t)h * D, q16);
        float *oh = out + (size_t)h * D;
        /* scores = q . k for every cached token, block by block */
        for (int j = 0; j < n_blk; j++) {
            int n = (j == n_blk - 1) ? n_ctx - j * B : B;
            int32_t b = s->table[j];
            if (j == n_blk - 1 && stk && p->kf.deferred)
                p->sops.dot(&p->sf, (const uint8_t *)(stk + (size_t)kh * B * D), n, qh, row, scores + (size_t)j * B);
            else
                p->kops.dot(&p->kf, kv_block_ptr(p, layer, KV_K, b) + (size_t)kh * p->kf.head_bytes, n, qh, row,
                            scores + (size_t)j * B);
        }
        /* softmax with the max subtracted; blocks are packed, so token t is scores[t] */
        const float sm_scale = kv_softcap(p, scores, n_ctx, scale);
        float inv = kv_weights(p, scores, n_ctx, p->softmax(scores, n_ctx, sm_scale));
        /* out = sum_t p_t v_t, normalized once at the end (unless kv_weights did) */
        memset(oh, 0, (size_t)D * sizeof *oh);
        for (int j = 0; j < n_blk; j++) {
            int n = (j == n_blk - 1) ? n_ctx - j * B : B;
            int32_t b = s->table[j];
            if (j == n_blk - 1 && stv && p->vf.deferred)
                p->sops.accum(&p->sf, (const uint8_t *)(stv + (size_t)kh * B * D), n, scores + (size_t)j * B, oh);
            else
                p->vops.accum(&p->vf, kv_block_ptr(p, layer, KV_V, b) + (size_t)kh * p->vf.head_bytes, n,
                              scores + (size_t)j * B, oh);
        }
        for (int d = 0; d < D; d++) oh[d] *= inv;
    }
}

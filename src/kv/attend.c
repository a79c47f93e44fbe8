/* attend.c: the manager's side of the forward pass: hr_kv_write and hr_kv_attention turn a sequence
 * and a position into what the storage needs (the block and slot to write, with its tail buffer;
 * the block table, the last block's tail buffer and, under a policy or a model sliding window, the
 * view of visible positions) and call the storage, which holds the bytes and the kernels. Also the
 * attention scratch the forward pass sizes per thread.
 *
 * Threads: both run on kernel worker threads during a forward pass, reading the manager's state,
 * which no one changes then (the engine thread commits after the pass). */
#include <string.h>

#include "kv/kv_internal.h"

void hr_kv_write(hr_kv_pool *p, int layer, hr_kv_seq seq, int pos, const float *k, const float *v) {
    KV_ASSERT(kv_seq_valid(p, seq) && layer >= 0 && layer < p->cfg.n_layers);
    const kv_seq *s = &p->seqs[seq];
    int B = p->cfg.block_size;
    int bi = pos / B, t = pos % B;
    KV_ASSERT(pos >= 0 && bi < s->n_table);
    int g = p->layer_gs[2 * layer], slot_l = p->layer_gs[2 * layer + 1]; /* the layer's group and slot */
    int32_t b = kv_tab(s, g)[bi];
    /* a shared or hashed (full, committed) block is never written */
    KV_ASSERT(p->refcnt[b] == 1 && p->flags[b] == 0);
    int32_t slot = kv_deferred(p) ? p->blk_stage[b] : -1;
    KV_ASSERT(!kv_deferred(p) || slot >= 0);
    p->st->ops->write(p->st, slot_l, b, t, slot, k, v);
}

int32_t hr_kv_write_slot_stage(const hr_kv_pool *p, int layer, hr_kv_seq seq, int pos, int *slot_layer,
                               int32_t *stage) {
    KV_ASSERT(kv_seq_valid(p, seq) && layer >= 0 && layer < p->cfg.n_layers);
    const kv_seq *s = &p->seqs[seq];
    int B = p->cfg.block_size, bi = pos / B;
    KV_ASSERT(pos >= 0 && bi < s->n_table);
    int32_t b = kv_tab(s, p->layer_gs[2 * layer])[bi];
    KV_ASSERT(p->refcnt[b] == 1 && p->flags[b] == 0); /* as hr_kv_write: never a shared or hashed block */
    int32_t st = kv_deferred(p) ? p->blk_stage[b] : -1;
    KV_ASSERT(!kv_deferred(p) || st >= 0); /* reserved for writing: it holds one (hr_kv_seq_reserve) */
    if (slot_layer) *slot_layer = p->layer_gs[2 * layer + 1];
    *stage = st;
    return b * B + pos % B;
}

void hr_kv_pool_layer_slot(const hr_kv_pool *p, int layer, int *group, int *slot) {
    KV_ASSERT(layer >= 0 && layer < p->cfg.n_layers);
    *group = p->layer_gs[2 * layer];
    *slot = p->layer_gs[2 * layer + 1];
}

int32_t hr_kv_write_slot(const hr_kv_pool *p, int layer, hr_kv_seq seq, int pos, int *slot_layer) {
    KV_ASSERT(!kv_deferred(p)); /* a deferred format's write needs its stage: hr_kv_write_slot_stage */
    int32_t stage;
    return hr_kv_write_slot_stage(p, layer, seq, pos, slot_layer, &stage);
}

const int32_t *hr_kv_seq_table(const hr_kv_pool *p, int layer, hr_kv_seq seq, int *n) {
    KV_ASSERT(kv_seq_valid(p, seq) && layer >= 0 && layer < p->cfg.n_layers);
    const kv_seq *s = &p->seqs[seq];
    *n = s->n_table;
    return kv_tab(s, p->layer_gs[2 * layer]);
}

/* The positions a query at n_ctx of s sees in layer beyond causality (see kv_storage.h): the sinks
 * and the window of window-like policies and the model's window, the masks of token-level ones, and
 * where its softmax weights are added (h2o: every query; snapkv: the observation window). */
static void kv_view(const hr_kv_pool *p, const kv_seq *s, int layer, int n_ctx, hr_kv_attn_view *v) {
    int B = p->cfg.block_size;
    memset(v, 0, sizeof *v);
    v->sinks = kv_policy_sinks(s);
    int W = kv_layer_window(p, s, layer);
    v->lo = W > 0 && n_ctx - W > 0 ? n_ctx - W : 0;
    v->first_blk = v->lo / B;
    v->sink_blocks = (v->sinks + B - 1) / B;
    if (v->sink_blocks >= v->first_blk) v->sink_blocks = v->first_blk = 0; /* the two ranges meet */
    if (v->lo <= v->sinks) v->lo = 0;
    v->mask = kv_token_level(s) ? s->mask : NULL;
    if (s->pol.kind == HR_KV_POLICY_H2O) v->score = s->score;
    if (s->pol.kind == HR_KV_POLICY_SNAPKV && !s->snap_done) {
        int end = kv_snap_end(s);
        if (n_ctx <= end && n_ctx > end - kv_snap_window(&s->pol)) v->score = s->score;
    }
}

void hr_kv_seq_window(const hr_kv_pool *p, int layer, hr_kv_seq seq, int n_ctx, int *sinks, int *lo) {
    KV_ASSERT(kv_seq_valid(p, seq) && layer >= 0 && layer < p->cfg.n_layers);
    hr_kv_attn_view v;
    kv_view(p, &p->seqs[seq], layer, n_ctx, &v);
    *sinks = v.sinks;
    *lo = v.lo;
}

const uint64_t *hr_kv_seq_token_mask(const hr_kv_pool *p, hr_kv_seq seq, int n_ctx, int *n_blocks, int *mask_words,
                                     bool *score) {
    KV_ASSERT(kv_seq_valid(p, seq));
    const kv_seq *s = &p->seqs[seq];
    hr_kv_attn_view v;
    kv_view(p, s, 0, n_ctx, &v); /* masks and scores are the same decision in every layer */
    *n_blocks = s->meta_n;
    *mask_words = kv_mask_words(p);
    *score = v.mask && v.score;
    return v.mask;
}

void hr_kv_seq_add_scores(hr_kv_pool *p, hr_kv_seq seq, const uint64_t *w, int n_blocks) {
    KV_ASSERT(kv_seq_valid(p, seq));
    kv_seq *s = &p->seqs[seq];
    if (!kv_token_level(s)) return;
    if (n_blocks > s->meta_n) n_blocks = s->meta_n;
    const size_t n = (size_t)n_blocks * p->cfg.n_layers * p->cfg.n_kv_heads * p->cfg.block_size;
    for (size_t i = 0; i < n; i++)
        if (w[i]) atomic_fetch_add_explicit(&s->score[i], w[i], memory_order_relaxed);
}

void hr_kv_attention(const hr_kv_pool *p, int layer, hr_kv_seq seq, int n_ctx, const float *q, int n_heads, float scale,
                     float *out, float *scratch) {
    hr_kv_attention_sinks(p, layer, seq, n_ctx, q, n_heads, scale, NULL, out, scratch);
}

void hr_kv_attention_sinks(const hr_kv_pool *p, int layer, hr_kv_seq seq, int n_ctx, const float *q, int n_heads,
                           float scale, const float *sinks, float *out, float *scratch) {
    hr_kv_attention_heads(p, layer, seq, n_ctx, q, n_heads, 0, n_heads, scale, sinks, out, scratch);
}

void hr_kv_attention_heads(const hr_kv_pool *p, int layer, hr_kv_seq seq, int n_ctx, const float *q, int n_heads,
                           int head_begin, int head_end, float scale, const float *sinks, float *out, float *scratch) {
    const hr_kv_config *c = &p->cfg;
    KV_ASSERT(head_begin >= 0 && head_begin <= head_end && head_end <= n_heads);
    if (head_begin == head_end) return;
    int B = c->block_size;
    KV_ASSERT(kv_seq_valid(p, seq) && layer >= 0 && layer < c->n_layers);
    KV_ASSERT(n_heads % c->n_kv_heads == 0);
    const kv_seq *s = &p->seqs[seq];
    KV_ASSERT(n_ctx >= 0 && n_ctx <= s->n_table * B);
    int g = p->layer_gs[2 * layer], slot_l = p->layer_gs[2 * layer + 1]; /* the layer's group and slot */
    const int32_t *table = kv_tab(s, g);
    hr_kv_attn_query aq = {.table = table, .n_ctx = n_ctx > 0 ? n_ctx : 0, .tail_stage = -1, .q = q, .out = out};
    hr_kv_attn_view view;
    if (n_ctx > 0) {
        /* the last block, when partial for this query, is read from its f16 tail buffer (q4/kivi2) */
        if (kv_deferred(p) && n_ctx % B != 0) aq.tail_stage = p->blk_stage[table[(n_ctx + B - 1) / B - 1]];
        /* full sequences take the storage's plain path, the same code as before policies (a hybrid
         * pool's full groups too: their rows have no holes) */
        if (s->pol.kind != HR_KV_POLICY_FULL || p->native_window[layer] > 0 || kv_holes(s, g) > 0) {
            kv_view(p, s, layer, n_ctx, &view);
            aq.view = &view;
        }
    }
    hr_kv_attn_args a = {.n_heads = n_heads,
                         .scale = scale,
                         .softcap = p->attn_softcap,
                         .sinks = sinks,
                         .head_begin = head_begin,
                         .head_end = head_end,
                         .group = kv_attn_group(c)};
    p->st->ops->attend(p->st, slot_l, &aq, 1, &a, scratch);
}

size_t hr_kv_attention_scratch_floats_for(const hr_kv_config *cfg, int n_ctx) {
    /* scores (n_ctx, padded to a block) for each head of a group + one head-row for per-channel
     * formats + slack for SIMD */
    int B = cfg->block_size > 0 ? cfg->block_size : 1;
    size_t n = ((size_t)(n_ctx > 0 ? n_ctx : 0) + B - 1) / B * B;
    return n * (size_t)kv_attn_group(cfg) + (size_t)cfg->head_dim + 16;
}

size_t hr_kv_attention_scratch_floats(const hr_kv_pool *p, int n_ctx) {
    return hr_kv_attention_scratch_floats_for(&p->cfg, n_ctx);
}

size_t hr_kv_seq_attention_scratch_floats(const hr_kv_pool *p, hr_kv_seq seq, int n_ctx) {
    size_t all = hr_kv_attention_scratch_floats(p, n_ctx);
    if (!kv_seq_valid(p, seq)) return all;
    const kv_seq *s = &p->seqs[seq];
    int B = p->cfg.block_size, wmax = 0;
    for (int l = 0; l < p->cfg.n_layers; l++) {
        int w = kv_layer_window(p, s, l);
        if (w == 0) return all; /* some layer sees everything */
        wmax = w > wmax ? w : wmax;
    }
    int S = kv_policy_sinks(s);
    size_t slots = (size_t)((S + B - 1) / B + (wmax + B - 1) / B + 1) * B;
    size_t bounded = slots * (size_t)kv_attn_group(&p->cfg) + (size_t)p->cfg.head_dim + 16 +
                     (p->kf.rotate ? (size_t)p->cfg.head_dim : 0);
    return bounded < all ? bounded : all;
}

/* attention.c: writing one token's K/V into its block, and attention of one token's query heads over
 * a sequence's blocks, read in their formats directly.
 *
 * Determinism: for a query at n_ctx, every reduction (each q.k, the max, the exp-sum, the P.V sums)
 * runs over tokens 0..n_ctx-1 block by block in the same order with the same kernels, so the result
 * depends only on the cache contents and n_ctx, never on which other sequences or tokens share the
 * batch or which thread runs it.
 *
 * Deferred formats (q4, kivi2): block j of a layer is read from the sequence's f16 staging buffer
 * while it is the staged block (it has not been filled yet), and from the encoded block afterwards.
 * The write of a block's last slot encodes it, so hr_kv_write for one (sequence, layer) must be
 * called in position order and the last slot's write must come after the others of its block
 * (one thread per sequence and layer, or a barrier). A query inside a prefill chunk that reaches past
 * its own block sees its block encoded (decode would have seen it in f16): chunked prefill and
 * token-by-token decode can differ by that block's quantization error with these two formats only. */
#include <math.h>
#include <string.h>

#include "kv/kv_internal.h"

void hr_kv_write(hr_kv_pool *p, int layer, hr_kv_seq seq, int pos, const float *k, const float *v) {
    KV_ASSERT(kv_seq_valid(p, seq) && layer >= 0 && layer < p->cfg.n_layers);
    const kv_seq *s = &p->seqs[seq];
    int B = p->cfg.block_size, D = p->cfg.head_dim, Hkv = p->cfg.n_kv_heads;
    int bi = pos / B, t = pos % B;
    KV_ASSERT(pos >= 0 && bi < s->n_table);
    int32_t b = s->table[bi];
    /* a shared or hashed (full, committed) block is never written */
    KV_ASSERT(p->refcnt[b] == 1 && p->flags[b] == 0);
    (void)s;
    int32_t *staged = &p->stage_blk[(size_t)seq * p->cfg.n_layers + layer];
    bool any_deferred = p->kf.deferred || p->vf.deferred;
    if (any_deferred && *staged != bi) {
        KV_ASSERT(*staged == -1 || *staged < bi); /* writes go in position order */
        *staged = bi;
    }
    for (int kind = 0; kind < 2; kind++) {
        const kv_fmt *f = kind == KV_K ? &p->kf : &p->vf;
        const kv_fmt_ops *ops = kind == KV_K ? &p->kops : &p->vops;
        const float *x = kind == KV_K ? k : v;
        uint8_t *blk = kv_block_ptr(p, layer, kind, b);
        if (!f->deferred) {
            for (int h = 0; h < Hkv; h++) ops->enc_token(f, blk + (size_t)h * f->head_bytes, t, x + (size_t)h * D);
            continue;
        }
        uint16_t *st = kv_stage_ptr(p, seq, layer, kind);
        for (int h = 0; h < Hkv; h++) {
            uint16_t *row = st + ((size_t)h * B + t) * D;
            for (int c = 0; c < D; c++) row[c] = kv_f32_to_f16(x[(size_t)h * D + c]);
        }
        if (t == B - 1)
            for (int h = 0; h < Hkv; h++) ops->enc_block(f, blk + (size_t)h * f->head_bytes, st + (size_t)h * B * D);
    }
    if (any_deferred && t == B - 1) *staged = -1;
}

size_t hr_kv_attention_scratch_floats(const hr_kv_pool *p, int n_ctx) {
    /* scores (n_ctx, padded to a block) + one head-row for per-channel formats + slack for SIMD */
    int B = p->cfg.block_size;
    size_t n = ((size_t)(n_ctx > 0 ? n_ctx : 0) + B - 1) / B * B;
    return n + (size_t)p->cfg.head_dim + 16;
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
    int group = n_heads / Hkv;
    int n_blk = (n_ctx + B - 1) / B;
    int32_t staged = p->stage_blk[(size_t)seq * c->n_layers + layer];
    const uint16_t *stk = p->stage ? kv_stage_ptr(p, seq, layer, KV_K) : NULL;
    const uint16_t *stv = p->stage ? kv_stage_ptr(p, seq, layer, KV_V) : NULL;
    float *scores = scratch;
    float *row = scratch + (size_t)n_blk * B;

    for (int h = 0; h < n_heads; h++) {
        int kh = h / group;
        const float *qh = q + (size_t)h * D;
        float *oh = out + (size_t)h * D;
        /* scores = q . k for every cached token, block by block */
        for (int j = 0; j < n_blk; j++) {
            int n = (j == n_blk - 1) ? n_ctx - j * B : B;
            int32_t b = s->table[j];
            if (j == staged && p->kf.deferred)
                p->sops.dot(&p->sf, (const uint8_t *)(stk + (size_t)kh * B * D), n, qh, row, scores + (size_t)j * B);
            else
                p->kops.dot(&p->kf, kv_block_ptr(p, layer, KV_K, b) + (size_t)kh * p->kf.head_bytes, n, qh, row,
                            scores + (size_t)j * B);
        }
        /* softmax with the max subtracted, in token order; blocks are packed, so token t is scores[t] */
        float mx = -INFINITY;
        for (int t = 0; t < n_ctx; t++) {
            scores[t] *= scale;
            mx = fmaxf(mx, scores[t]);
        }
        float sum = 0.0f;
        for (int t = 0; t < n_ctx; t++) {
            scores[t] = expf(scores[t] - mx);
            sum += scores[t];
        }
        /* out = sum_t p_t v_t, normalized once at the end */
        memset(oh, 0, (size_t)D * sizeof *oh);
        for (int j = 0; j < n_blk; j++) {
            int n = (j == n_blk - 1) ? n_ctx - j * B : B;
            int32_t b = s->table[j];
            if (j == staged && p->vf.deferred)
                p->sops.accum(&p->sf, (const uint8_t *)(stv + (size_t)kh * B * D), n, scores + (size_t)j * B, oh);
            else
                p->vops.accum(&p->vf, kv_block_ptr(p, layer, KV_V, b) + (size_t)kh * p->vf.head_bytes, n,
                              scores + (size_t)j * B, oh);
        }
        float inv = 1.0f / sum;
        for (int d = 0; d < D; d++) oh[d] *= inv;
    }
}

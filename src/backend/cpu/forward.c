/* forward.c: the CPU backend (backend.h: hr_backend_cpu): one forward pass over a ragged batch of T tokens
 * from many sequences, executing the model's description (model_internal.h: hyper-parameters, weights,
 * each layer's attention) with this backend's kernels.
 *
 * Per layer: RMSNorm -> Q/K/V projections for all T tokens at once (one weight read per step) ->
 * [per-head Q/K RMSNorm] -> RoPE (the layer's base) -> K/V written into each token's sequence blocks ->
 * attention per token through its block table (the layer's window, soft-capped scores where the model
 * says) -> output projection [-> post-attention RMSNorm] and residual -> RMSNorm -> SwiGLU or GeGLU FFN
 * [-> post-FFN RMSNorm] and residual; or, where the model has experts (qwen3moe, Mixtral, gpt-oss), the router, top-k
 * experts per token and their weighted SwiGLU outputs (moe_ffn). Logits only for the tokens that ask
 * (soft-capped for gemma).
 * Bracketed steps are the qwen3/gemma ones (model.h says which family has which). Every reduction a token's result
 * depends on is computed per row in a fixed order (matmul rows, attention over its own sequence), so a token's output
 * does not depend on which other tokens share the batch: the basis of headroom's batch-invariance promise. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "common/threadpool.h"
#include "common/util.h"
#include "model/model_internal.h"

struct hr_model_ctx {
    hr_backend_base base; /* first: the seam's handle (backend.h) */
    const hr_model *m;
    hr_kv_pool *kv;
    hr_kernels kernels;
    hr_threadpool *tp;
    hr_matmul_ctx *mm;
    int max_tokens, max_ctx;
    float *inv_freq;     /* (n_rot/2) full-attention layers (all layers of most models) */
    float *inv_freq_swa; /* (n_rot/2) window layers where a model mixes the two (gemma), else NULL */
    /* scratch, sized once for max_tokens */
    float *x;                          /* (T, E) residual stream */
    float *xb;                         /* (T, E) normed input / projection output */
    float *q;                          /* (T, H*D) */
    float *k, *v;                      /* (T, Hkv*D) */
    float *att;                        /* (T, H*D) */
    float *hg, *hu;                    /* (T, 2F) (room for the fused gate|up rows), (T, F) */
    float *qkv;                        /* (T, H*D + 2*Hkv*D) fused Q|K|V rows */
    unsigned char *fuse_qkv, *fuse_gu; /* (L) layer's Q/K/V (gate/up) weights lie back to back */
    float *att_scratch;                /* (n_threads, scratch_floats) */
    size_t att_scratch_floats;
    int32_t *out_rows; /* (T) indices of tokens that want logits */
    /* mixture of experts (hp.n_expert > 0; hg and hu then absent), K = n_expert_used, NE = n_expert,
     * Fe = n_ff_exp */
    float *moe_probs;     /* (T, NE) router logits, then probabilities */
    int32_t *moe_sel;     /* (T, K) each token's experts, rank order */
    float *moe_w;         /* (T, K) their renormalized weights */
    int32_t *moe_slots;   /* (T*K) slot t*K + k of the tokens routed to each expert, expert by expert */
    int32_t *moe_start;   /* (NE + 1) where each expert's slots begin in moe_slots */
    float *moe_xe;        /* (T, E) one expert's gathered input rows */
    float *moe_g, *moe_u; /* (T, Fe) its gate and up rows */
    float *moe_out;       /* (T*K, E) each (token, rank)'s expert output */
    /* deepseek2 (hp.kv_lora_rank > 0; else NULL). Dq = qk_nope_dim + n_rot, C = kv_lora_rank, Cq =
     * q_lora_rank, Dv = v_head_dim, Dm = max(qk_nope_dim, C, Dv), Fs = n_expert_shared x Fe. The latent
     * attention's absorbed query goes in q (T, H*D), the cached vector [latent | rope key] in k (T, D). */
    float *mla_q;         /* (T, H*Dq) the query before absorption */
    float *mla_qa;        /* (T, Cq) Q's low-rank projection */
    float *mla_a, *mla_b; /* (T, Dm) one head's gathered rows in, product out */
    float *mla_o;         /* (T, H*Dv) the heads' outputs after W_UV */
    float *moe_sc;        /* (NE) one token's selection scores */
    float *sh_g, *sh_u;   /* (T, Fs) the shared experts' gate and up rows */
    float *sh_out;        /* (T, E) their output */
};

/* Bytes of a 64-byte aligned buffer of n floats (aligned_alloc wants a multiple of the alignment). */
static size_t xbytes(uint64_t n_floats) { return (size_t)((n_floats * sizeof(float) + 63) / 64 * 64); }

/* The scratch, one size per buffer (bytes): hr_model_ctx_create allocates exactly these and
 * hr_model_ctx_scratch_bytes adds them up, so the plan's figure is the allocation's. The FFN's hg
 * holds fused gate|up rows (2F) where a layer's gate and up weights lie back to back, F otherwise; hu
 * exists only where some layer's are apart. att_floats: one thread's attention scratch (a multiple of
 * 16 floats). */
typedef struct fwd_sizes {
    size_t inv_freq, inv_freq_swa, x, xb, q, k, v, att, hg, hu, qkv, fuse, att_scratch, out_rows;
    size_t moe_probs, moe_sel, moe_w, moe_slots, moe_start, moe_xe, moe_gu, moe_out; /* 0 without experts */
    size_t mla_q, mla_qa, mla_ab, mla_o, moe_sc, sh_gu, sh_out;                      /* 0 but deepseek2 */
    size_t att_floats;
    int64_t max_k; /* the widest matmul input row */
} fwd_sizes;

/* deepseek2's buffers (the latent attention's and the shared experts'), and its widest matmul inputs. */
static void mla_sizes_of(const hr_hparams *hp, uint64_t T, fwd_sizes *z) {
    const uint64_t H = (uint64_t)hp->n_head, Dq = (uint64_t)(hp->qk_nope_dim + hp->n_rot),
                   C = (uint64_t)hp->kv_lora_rank, Dv = (uint64_t)hp->v_head_dim, E = (uint64_t)hp->n_embd;
    const uint64_t Dm = HR_MAX(HR_MAX((uint64_t)hp->qk_nope_dim, C), Dv);
    const uint64_t Fs = (uint64_t)hp->n_expert_shared * (uint64_t)hp->n_ff_exp;
    z->mla_q = xbytes(T * H * Dq);
    z->mla_qa = hp->q_lora_rank > 0 ? xbytes(T * (uint64_t)hp->q_lora_rank) : 0;
    z->mla_ab = xbytes(T * Dm);
    z->mla_o = xbytes(T * H * Dv);
    z->moe_sc = hp->n_expert > 0 ? xbytes((uint64_t)hp->n_expert) : 0;
    z->sh_gu = Fs > 0 ? xbytes(T * Fs) : 0;
    z->sh_out = Fs > 0 ? xbytes(T * E) : 0;
    int64_t k = HR_MAX(HR_MAX((int64_t)hp->q_lora_rank, (int64_t)Dm), HR_MAX((int64_t)(H * Dv), (int64_t)Fs));
    z->max_k = HR_MAX(z->max_k, k);
}

static void fwd_sizes_of(const hr_hparams *hp, int max_tokens, const hr_kv_config *kc, int max_ctx, int n_threads,
                         bool gu_fused, bool gu_split, fwd_sizes *z) {
    uint64_t T = (uint64_t)HR_MAX(1, max_tokens), E = (uint64_t)hp->n_embd, F = (uint64_t)hp->n_ff;
    uint64_t qd = (uint64_t)hp->n_head * (uint64_t)hp->head_dim, kvd = (uint64_t)hp->n_head_kv * (uint64_t)hp->head_dim;
    const bool hybrid = hp->n_window_layers > 0 && hp->n_window_layers < hp->n_layer;
    const bool moe = hp->n_expert > 0;
    const bool dense = !moe || hp->n_layer_dense > 0; /* some layer has a dense FFN (deepseek2: the leading ones) */
    const uint64_t K = (uint64_t)hp->n_expert_used, NE = (uint64_t)hp->n_expert, Fe = (uint64_t)hp->n_ff_exp;
    size_t att_floats = (hr_kv_attention_scratch_floats_for(kc, max_ctx) + 15) & ~(size_t)15;
    *z = (fwd_sizes){.inv_freq = xbytes((uint64_t)hp->n_rot / 2),
                     .inv_freq_swa = hybrid ? xbytes((uint64_t)hp->n_rot / 2) : 0,
                     .x = xbytes(T * E),
                     .xb = xbytes(T * E),
                     .q = xbytes(T * qd),
                     .k = xbytes(T * kvd),
                     .v = xbytes(T * kvd),
                     .att = xbytes(T * qd),
                     .hg = dense ? xbytes((gu_fused ? 2 : 1) * T * F) : 0,
                     .hu = gu_split && dense ? xbytes(T * F) : 0,
                     .qkv = xbytes(T * (qd + 2 * kvd)),
                     .fuse = (size_t)hp->n_layer,
                     .att_scratch = xbytes((uint64_t)att_floats * (uint64_t)HR_MAX(1, n_threads)),
                     .out_rows = (size_t)T * sizeof(int32_t),
                     .att_floats = att_floats,
                     .max_k = HR_MAX(HR_MAX((int64_t)E, (int64_t)F), HR_MAX((int64_t)qd, (int64_t)Fe))};
    if (moe) {
        z->moe_probs = xbytes(T * NE);
        z->moe_sel = xbytes(T * K);
        z->moe_w = xbytes(T * K);
        z->moe_slots = xbytes(T * K);
        z->moe_start = xbytes(NE + 1);
        z->moe_xe = xbytes(T * E);
        z->moe_gu = xbytes(T * Fe);
        z->moe_out = xbytes(T * K * E);
    }
    if (hp->kv_lora_rank > 0) mla_sizes_of(hp, T, z);
}

/* Everything create allocates for these sizes: the context, its scratch, the two fusion tables, the
 * thread pool and the matmul context. */
static uint64_t fwd_sizes_total(const fwd_sizes *z, int max_tokens, int n_threads) {
    return sizeof(hr_model_ctx) + z->inv_freq + z->inv_freq_swa + z->x + z->xb + z->q + z->k + z->v + z->att + z->hg +
           z->hu + z->qkv + 2 * z->fuse + z->att_scratch + z->out_rows + z->moe_probs + z->moe_sel + z->moe_w +
           z->moe_slots + z->moe_start + z->moe_xe + 2 * z->moe_gu + z->moe_out + z->mla_q + z->mla_qa + 2 * z->mla_ab +
           z->mla_o + z->moe_sc + 2 * z->sh_gu + z->sh_out + hr_threadpool_bytes(HR_MAX(1, n_threads)) +
           hr_matmul_ctx_bytes(HR_MAX(1, max_tokens), z->max_k);
}

/* b's rows follow a's in memory with the same type and width, so one product over a's rows extended
 * by b's computes both (matmul.h: an output element's bits do not depend on the rows around it). */
static bool adjacent(const hr_weight *a, const hr_weight *b) {
    return a->type == b->type && a->cols == b->cols && a->row_bytes == b->row_bytes &&
           (const uint8_t *)a->data + (size_t)a->rows * a->row_bytes == (const uint8_t *)b->data;
}

static void cpu_destroy(hr_model_ctx *c);

/* deepseek2's scratch (mla_sizes_of), made resident as the rest. */
static hr_status mla_alloc(hr_model_ctx *c, const fwd_sizes *z, hr_error *err) {
    struct {
        float **p;
        size_t n;
    } bufs[] = {{&c->mla_q, z->mla_q},  {&c->mla_qa, z->mla_qa}, {&c->mla_a, z->mla_ab},
                {&c->mla_b, z->mla_ab}, {&c->mla_o, z->mla_o},   {&c->moe_sc, z->moe_sc},
                {&c->sh_g, z->sh_gu},   {&c->sh_u, z->sh_gu},    {&c->sh_out, z->sh_out}};
    for (size_t i = 0; i < HR_ARRAY_LEN(bufs); i++) {
        if (!bufs[i].n) continue;
        if (!(*bufs[i].p = aligned_alloc(64, bufs[i].n)))
            return hr_error_set(err, HR_ERR_NOMEM, "out of memory for the latent attention's scratch (%d tokens)",
                                c->max_tokens);
        memset(*bufs[i].p, 0, bufs[i].n);
    }
    return HR_OK;
}

static hr_status cpu_create(const hr_model *m, hr_kv_pool *kv, const hr_model_ctx_params *p, hr_model_ctx **out,
                            hr_error *err) {
    const hr_hparams *hp = &m->hp;
    const hr_kv_config *kc = hr_kv_pool_config(kv);
    if (kc->n_layers != hp->n_layer || kc->n_kv_heads != hp->n_head_kv || kc->head_dim != hp->head_dim)
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "KV pool shape (%d layers, %d KV heads, dim %d) does not match the model (%d, %d, %d)",
                            kc->n_layers, kc->n_kv_heads, kc->head_dim, hp->n_layer, hp->n_head_kv, hp->head_dim);
    if (p->max_batch_tokens < 1 || p->max_ctx < 1)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "max_batch_tokens and max_ctx must be positive");
    hr_model_ctx *c = calloc(1, sizeof *c);
    if (!c) return hr_error_set(err, HR_ERR_NOMEM, "out of memory creating the model context");
    c->base.ops = &hr_backend_cpu;
    c->m = m;
    c->kv = kv;
    c->max_tokens = p->max_batch_tokens;
    c->max_ctx = p->max_ctx;
    hr_kernels_init(&c->kernels, hr_cpu_detect(), p->force_isa);
    int n_threads = p->n_threads > 0 ? p->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads < 1) n_threads = 1;
    hr_status st = hr_threadpool_create(n_threads, &c->tp, err);
    if (st) goto fail;
    int64_t qd = (int64_t)hp->n_head * hp->head_dim, kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    bool gu_fused = false, gu_split = false; /* some layer's gate and up weights lie together / apart */
    for (int il = 0; il < hp->n_layer; il++) {
        if (!m->layers[il].w_gate.data) continue; /* a MoE layer */
        bool f = adjacent(&m->layers[il].w_gate, &m->layers[il].w_up);
        gu_fused |= f;
        gu_split |= !f;
    }
    fwd_sizes z; /* what hr_model_ctx_scratch_bytes counts */
    fwd_sizes_of(hp, c->max_tokens, kc, c->max_ctx, n_threads, gu_fused, gu_split, &z);
    if ((st = hr_matmul_ctx_create(&c->kernels, c->tp, c->max_tokens, z.max_k, &c->mm, err))) goto fail;
    size_t T = (size_t)c->max_tokens;
    c->inv_freq = aligned_alloc(64, z.inv_freq);
    if (z.inv_freq_swa && !(c->inv_freq_swa = aligned_alloc(64, z.inv_freq_swa))) {
        st = hr_error_set(err, HR_ERR_NOMEM, "out of memory for forward-pass scratch");
        goto fail;
    }
    c->x = aligned_alloc(64, z.x);
    c->xb = aligned_alloc(64, z.xb);
    c->q = aligned_alloc(64, z.q);
    c->k = aligned_alloc(64, z.k);
    c->v = aligned_alloc(64, z.v);
    c->att = aligned_alloc(64, z.att);
    c->hg = z.hg ? aligned_alloc(64, z.hg) : NULL;
    c->qkv = aligned_alloc(64, z.qkv);
    c->fuse_qkv = calloc(1, z.fuse);
    c->fuse_gu = calloc(1, z.fuse);
    c->hu = z.hu ? aligned_alloc(64, z.hu) : NULL;
    c->att_scratch_floats = z.att_floats;
    c->att_scratch = aligned_alloc(64, z.att_scratch);
    c->out_rows = malloc(z.out_rows);
    if (z.moe_probs) {
        c->moe_probs = aligned_alloc(64, z.moe_probs);
        c->moe_sel = aligned_alloc(64, z.moe_sel);
        c->moe_w = aligned_alloc(64, z.moe_w);
        c->moe_slots = aligned_alloc(64, z.moe_slots);
        c->moe_start = aligned_alloc(64, z.moe_start);
        c->moe_xe = aligned_alloc(64, z.moe_xe);
        c->moe_g = aligned_alloc(64, z.moe_gu);
        c->moe_u = aligned_alloc(64, z.moe_gu);
        c->moe_out = aligned_alloc(64, z.moe_out);
        if (!c->moe_probs || !c->moe_sel || !c->moe_w || !c->moe_slots || !c->moe_start || !c->moe_xe || !c->moe_g ||
            !c->moe_u || !c->moe_out) {
            st = hr_error_set(err, HR_ERR_NOMEM, "out of memory for the experts' scratch (%d tokens)", c->max_tokens);
            goto fail;
        }
        /* made resident now, as the rest below */
        memset(c->moe_xe, 0, z.moe_xe);
        memset(c->moe_g, 0, z.moe_gu);
        memset(c->moe_u, 0, z.moe_gu);
        memset(c->moe_out, 0, z.moe_out);
    }
    if (hp->kv_lora_rank > 0 && (st = mla_alloc(c, &z, err))) goto fail;
    if (!c->inv_freq || !c->x || !c->xb || !c->q || !c->k || !c->v || !c->att || (z.hg && !c->hg) || (z.hu && !c->hu) ||
        !c->att_scratch || !c->out_rows || !c->qkv || !c->fuse_qkv || !c->fuse_gu) {
        st = hr_error_set(err, HR_ERR_NOMEM, "out of memory for forward-pass scratch (%d tokens)", c->max_tokens);
        goto fail;
    }
    /* the model's own sliding windows (mistral: every layer; gemma, gpt-oss: the window layers):
     * attention masks them; in a one-group pool blocks no layer can see again leave the table (with a
     * full layer among them, none), in a hybrid pool (kv.h's layer groups) each window group drops the
     * blocks its own window no longer sees while the full groups keep theirs */
    for (int il = 0; il < hp->n_layer; il++)
        if (m->layer_attn[il].window > 0 && (st = hr_kv_pool_set_sliding_window(kv, il, m->layer_attn[il].window, err)))
            goto fail;
    if ((st = hr_kv_pool_set_attn_softcap(kv, hp->attn_softcap, err))) goto fail;
    for (int il = 0; il < hp->n_layer; il++) {
        const hr_layer *L = &m->layers[il];
        c->fuse_qkv[il] = adjacent(&L->wq, &L->wk) && adjacent(&L->wk, &L->wv);
        c->fuse_gu[il] = adjacent(&L->w_gate, &L->w_up);
    }
    /* The scratch made resident now (what hr_model_ctx_scratch_bytes counts), so that the first large
     * step does not pay tens of milliseconds of page faults: on a fresh server the first 512-token
     * prompt step took 1.4x the next ones. hu only where a layer's gate and up are apart (then hg is
     * F wide, or half used where other layers fuse): 2 x T x F floats touched either way. */
    bool split_gu = gu_split;
    memset(c->x, 0, T * hp->n_embd * sizeof(float));
    memset(c->xb, 0, T * hp->n_embd * sizeof(float));
    memset(c->q, 0, T * qd * sizeof(float));
    memset(c->k, 0, T * kvd * sizeof(float));
    memset(c->v, 0, T * kvd * sizeof(float));
    memset(c->att, 0, T * qd * sizeof(float));
    if (c->hg) memset(c->hg, 0, (split_gu ? 1 : 2) * T * hp->n_ff * sizeof(float));
    if (split_gu) memset(c->hu, 0, T * hp->n_ff * sizeof(float));
    memset(c->qkv, 0, T * (size_t)(qd + 2 * kvd) * sizeof(float));
    memset(c->att_scratch, 0, c->att_scratch_floats * (size_t)n_threads * sizeof(float));
    hr_model_rope_inv_freq(m, c->max_ctx, c->inv_freq, c->inv_freq_swa);
    *out = c;
    return HR_OK;
fail:
    cpu_destroy(c);
    return st;
}

/* What create allocates for a model whose layers all keep gate and up alike (the plan's figure). */
static uint64_t cpu_scratch_bytes(const hr_hparams *hp, int max_batch_tokens, int max_ctx, int block_size,
                                  int n_threads) {
    /* every layer alike (gate and up together, or every one apart: 2 x T x F floats either way) */
    /* attention's group of query heads as the runtime configures the pool */
    hr_kv_config kc = {.block_size = block_size, .head_dim = hp->head_dim, .q_per_kv = hr_model_q_per_kv(hp)};
    fwd_sizes z;
    fwd_sizes_of(hp, max_batch_tokens, &kc, max_ctx, n_threads, true, false, &z);
    return fwd_sizes_total(&z, max_batch_tokens, n_threads);
}

static void cpu_destroy(hr_model_ctx *c) {
    if (!c) return;
    hr_matmul_ctx_destroy(c->mm);
    hr_threadpool_destroy(c->tp);
    free(c->inv_freq);
    free(c->inv_freq_swa);
    free(c->x);
    free(c->xb);
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->att);
    free(c->hg);
    free(c->hu);
    free(c->qkv);
    free(c->fuse_qkv);
    free(c->fuse_gu);
    free(c->att_scratch);
    free(c->out_rows);
    free(c->moe_probs);
    free(c->moe_sel);
    free(c->moe_w);
    free(c->moe_slots);
    free(c->moe_start);
    free(c->moe_xe);
    free(c->moe_g);
    free(c->moe_u);
    free(c->moe_out);
    free(c->mla_q);
    free(c->mla_qa);
    free(c->mla_a);
    free(c->mla_b);
    free(c->mla_o);
    free(c->moe_sc);
    free(c->sh_g);
    free(c->sh_u);
    free(c->sh_out);
    free(c);
}

static const char *cpu_isa(const hr_model_ctx *c) { return c->kernels.isa; }
static int cpu_n_threads(const hr_model_ctx *c) { return hr_threadpool_size(c->tp); }
static void cpu_run_items(hr_model_ctx *c, hr_model_item_fn fn, void *user, int64_t n) {
    hr_threadpool_run_items(c->tp, fn, user, n);
}

static void matmul(hr_model_ctx *c, const hr_weight *w, const float *X, int64_t T, float *Y) {
    hr_matmul(c->mm, w->data, w->type, w->rows, w->cols, X, T, Y);
}

/* Q, K, V of the normed rows xb: one product (one fork/join, one activation quantization) when the
 * three weights lie back to back, its rows then split into q, k and v. */
static void project_qkv(hr_model_ctx *c, int il, int T) {
    const hr_layer *L = &c->m->layers[il];
    if (!c->fuse_qkv[il]) {
        matmul(c, &L->wq, c->xb, T, c->q);
        matmul(c, &L->wk, c->xb, T, c->k);
        matmul(c, &L->wv, c->xb, T, c->v);
        return;
    }
    const int64_t qd = L->wq.rows, kvd = L->wk.rows, n = qd + 2 * kvd;
    hr_matmul(c->mm, L->wq.data, L->wq.type, n, L->wq.cols, c->xb, T, c->qkv);
    for (int t = 0; t < T; t++) {
        const float *row = c->qkv + (size_t)t * n;
        memcpy(c->q + (size_t)t * qd, row, sizeof(float) * (size_t)qd);
        memcpy(c->k + (size_t)t * kvd, row + qd, sizeof(float) * (size_t)kvd);
        memcpy(c->v + (size_t)t * kvd, row + qd + kvd, sizeof(float) * (size_t)kvd);
    }
}

static void gated_act(const hr_model_ctx *c, float *gate, const float *up, int n) {
    if (c->m->hp.ffn_act == HR_FFN_GELU_TANH)
        hr_op_geglu_tanh(gate, up, n);
    else
        c->kernels.swiglu(gate, up, n);
}

/* ---- row-wise steps, split over the pool by tokens ----
 * The steps between the products work token by token (norms, the residual, RoPE, the gated
 * activation), and a token's row depends on nothing but itself, so running the rows on the pool's
 * threads changes no bits. On one thread they were a serial part of every step while the other
 * threads waited: 6.4% of a 16-token TinyLlama step's CPU (~2M expf, 0.4M cosf / sinf, 1.5M
 * elements of RMSNorm), about 12% of its wall time at 2 threads (docs/BENCHMARKS_LOG.md). */
enum {
    ROW_ATTN_NORM, /* xb = RMSNorm(x) with the layer's attention norm */
    ROW_ATTN_PREP, /* Q/K/V biases, per-head Q/K norms, RoPE (q, k and v of the token) */
    ROW_ATTN_OUT,  /* x += [post-norm](xb), then xb = RMSNorm(x) with the FFN norm */
    ROW_FFN_OUT,   /* x += [post-norm](xb), then the next layer's ROW_ATTN_NORM */
    ROW_ACT_FUSED, /* hg's gate half = act(gate) * up of a fused gate|up row (2F) */
    ROW_ACT_SPLIT  /* hg = act(hg) * hu (rows of F) */
};

typedef struct rows_job {
    hr_model_ctx *c;
    const hr_batch *b; /* ROW_ATTN_PREP only */
    int il, op;
} rows_job;

static void rows(hr_model_ctx *c, const hr_batch *b, int il, int op, int T);

/* hg = act(xb W_gate^T) * (xb W_up^T): one product when the two weights lie back to back (phi3's
 * ffn_up always), each output row then [gate | up] and the gated activation in place in its gate
 * half. Returns the floats between hg's rows (F, or 2F where fused: the down projection reads the
 * gate halves in place, no copy). */
static int64_t ffn_gate_up(hr_model_ctx *c, int il, int T) {
    const hr_layer *L = &c->m->layers[il];
    const int64_t F = L->w_gate.rows;
    if (!c->fuse_gu[il]) {
        matmul(c, &L->w_gate, c->xb, T, c->hg);
        matmul(c, &L->w_up, c->xb, T, c->hu);
        rows(c, NULL, il, ROW_ACT_SPLIT, T);
        return F;
    }
    hr_matmul(c->mm, L->w_gate.data, L->w_gate.type, 2 * F, L->w_gate.cols, c->xb, T, c->hg);
    rows(c, NULL, il, ROW_ACT_FUSED, T);
    return 2 * F;
}

/* ---- mixture of experts ---- */

/* Expert e's matrix of a stack (model_internal.h: expert e at data + e * rows * row_bytes). */
static hr_weight expert(const hr_weight *stack, int e) {
    hr_weight w = *stack;
    w.data = (const uint8_t *)stack->data + (size_t)e * (size_t)stack->rows * stack->row_bytes;
    return w;
}

/* Routing, as llama.cpp's build_moe_ffn runs it for qwen3moe and Mixtral: the router's logits
 * (xb W_router^T), a softmax over all NE experts (its sum in double, then one multiply by 1/sum), the K
 * largest probabilities (ties to the lower expert id) in descending order, and those K renormalized by
 * their sum (double, clamped below at f16's smallest normal). Per token, on its own row. */
static void moe_route_softmax_topk(hr_model_ctx *c, const hr_layer *L, int T);
static void add_bias(float *y, const float *bias, int64_t T, int n);

/* p[0..n) = softmax(p): the largest subtracted, the sum in double, then one multiply by 1/sum. */
static void moe_softmax(float *p, int n) {
    float mx = -INFINITY;
    for (int e = 0; e < n; e++) mx = p[e] > mx ? p[e] : mx;
    double sum = 0;
    for (int e = 0; e < n; e++) sum += (double)(p[e] = expf(p[e] - mx));
    const float inv = (float)(1.0 / sum);
    for (int e = 0; e < n; e++) p[e] *= inv;
}

/* The K experts of the largest score[0..NE) (ties to the lower id) in descending order into sel, with
 * w[k] = val[sel[k]]; returns the sum of those K values in double. K passes of NE: K and NE are small
 * (8 of 256 at most in practice). */
static double moe_top_k(const float *score, const float *val, int NE, int K, int32_t *sel, float *w) {
    double wsum = 0;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < NE; e++) {
            bool taken = false;
            for (int j = 0; j < k; j++) taken |= sel[j] == e;
            if (!taken && (best < 0 || score[e] > score[best])) best = e;
        }
        sel[k] = best;
        w[k] = val[best];
        wsum += w[k];
    }
    return wsum;
}

/* w[0..K) divided by their sum, clamped below at f16's smallest normal (llama.cpp's norm_w). */
static void moe_renorm(float *w, int K, double wsum) {
    const float ws = (float)wsum < 6.103515625e-5f ? 6.103515625e-5f : (float)wsum;
    for (int k = 0; k < K; k++) w[k] /= ws;
}

static void moe_route(hr_model_ctx *c, const hr_layer *L, int T) {
    const hr_hparams *hp = &c->m->hp;
    const int NE = hp->n_expert, K = hp->n_expert_used;
    if (hp->moe_softmax_topk) {
        moe_route_softmax_topk(c, L, T);
        return;
    }
    matmul(c, &L->w_router, c->xb, T, c->moe_probs);
    for (int t = 0; t < T; t++) {
        float *p = c->moe_probs + (size_t)t * NE;
        moe_softmax(p, NE);
        float *w = c->moe_w + (size_t)t * K;
        moe_renorm(w, K, moe_top_k(p, p, NE, K, c->moe_sel + (size_t)t * K, w));
    }
}

/* DeepSeek's routing (deepseek2), as llama.cpp's build_moe_ffn runs it: gates from the router's logits
 * by a softmax (V2; as moe_route's) or a sigmoid (V3); selection over the gates plus exp_probs_b where
 * the layer has it (the bias picks experts, never weighs them); with expert groups, only the
 * n_group_used groups whose two best biased gates sum highest take part; the K best (ties to the lower
 * id) in descending order; their unbiased gates renormalized (expert_weights_norm; sum in double,
 * clamped below at f16's smallest normal) and multiplied by expert_weights_scale. Per token. */
static void moe_route_deepseek(hr_model_ctx *c, const hr_layer *L, int T) {
    const hr_hparams *hp = &c->m->hp;
    const int NE = hp->n_expert, K = hp->n_expert_used, NG = hp->n_expert_groups;
    matmul(c, &L->w_router, c->xb, T, c->moe_probs);
    float *s = c->moe_sc;
    for (int t = 0; t < T; t++) {
        float *p = c->moe_probs + (size_t)t * NE;
        if (hp->moe_gating == HR_MOE_GATING_SIGMOID) {
            for (int e = 0; e < NE; e++) p[e] = 1.0f / (1.0f + expf(-p[e]));
        } else {
            moe_softmax(p, NE);
        }
        for (int e = 0; e < NE; e++) s[e] = L->exp_probs_b ? p[e] + L->exp_probs_b[e] : p[e];
        if (NG > 1) { /* group-limited: each group scored by its two best, the best n_group_used kept */
            const int per = NE / NG;
            float gs[64]; /* the loader allows 64 groups */
            bool keep[64] = {false};
            const int ng = NG < 64 ? NG : 64;
            for (int g = 0; g < ng; g++) {
                float b1 = -INFINITY, b2 = -INFINITY;
                for (int e = g * per; e < (g + 1) * per; e++) {
                    if (s[e] > b1)
                        b2 = b1, b1 = s[e];
                    else if (s[e] > b2)
                        b2 = s[e];
                }
                gs[g] = b1 + b2;
            }
            for (int u = 0; u < hp->n_group_used && u < ng; u++) {
                int best = -1;
                for (int g = 0; g < ng; g++)
                    if (!keep[g] && (best < 0 || gs[g] > gs[best])) best = g;
                keep[best] = true;
            }
            for (int e = 0; e < NE; e++)
                if (e / per >= ng || !keep[e / per]) s[e] = -INFINITY;
        }
        float *w = c->moe_w + (size_t)t * K;
        const double wsum = moe_top_k(s, p, NE, K, c->moe_sel + (size_t)t * K, w);
        if (hp->moe_norm) moe_renorm(w, K, wsum);
        if (hp->moe_scale != 0.0f && hp->moe_scale != 1.0f)
            for (int k = 0; k < K; k++) w[k] *= hp->moe_scale;
    }
}

/* sh_out = the shared experts' SwiGLU FFN of xb's rows (deepseek2: one FFN n_expert_shared x Fe wide,
 * added to every token's routed output). */
static void shared_experts(hr_model_ctx *c, const hr_layer *L, int T) {
    const int64_t Fs = L->sh_gate.rows;
    matmul(c, &L->sh_gate, c->xb, T, c->sh_g);
    matmul(c, &L->sh_up, c->xb, T, c->sh_u);
    for (int t = 0; t < T; t++) c->kernels.swiglu(c->sh_g + (size_t)t * Fs, c->sh_u + (size_t)t * Fs, (int)Fs);
    matmul(c, &L->sh_down, c->sh_g, T, c->sh_out);
}

/* gpt-oss's routing (llama.cpp's SOFTMAX_WEIGHT gating): the router's logits plus its bias, the K
 * largest (ties to the lower expert id) in descending order, and a softmax over those K alone (the
 * largest subtracted, the sum in double, one multiply by 1/sum). Per token, on its own row. */
static void moe_route_softmax_topk(hr_model_ctx *c, const hr_layer *L, int T) {
    const hr_hparams *hp = &c->m->hp;
    const int NE = hp->n_expert, K = hp->n_expert_used;
    matmul(c, &L->w_router, c->xb, T, c->moe_probs);
    add_bias(c->moe_probs, L->b_router, T, NE);
    for (int t = 0; t < T; t++) {
        const float *p = c->moe_probs + (size_t)t * NE;
        float *w = c->moe_w + (size_t)t * K;
        (void)moe_top_k(p, p, NE, K, c->moe_sel + (size_t)t * K, w);
        const float mx = w[0];
        double sum = 0;
        for (int k = 0; k < K; k++) sum += (double)(w[k] = expf(w[k] - mx));
        const float inv = (float)(1.0 / sum);
        for (int k = 0; k < K; k++) w[k] *= inv;
    }
}

/* n rows of width `width`, row i += bias row e (an expert's bias; NULL: none). */
static void add_expert_bias(float *y, const float *bias, int e, int n, int64_t width) {
    if (!bias) return;
    for (int i = 0; i < n; i++) hr_op_add(y + (size_t)i * width, bias + (size_t)e * width, (int)width);
}

/* xb = the MoE FFN of xb's rows. Tokens are grouped by expert so each expert's three matrices are read
 * once per step: its tokens' rows gathered, one product per matrix over them, SwiGLU, the results put
 * in each (token, rank) slot; then each token's slots summed in rank order, weighted. Each product's
 * row is bit-identical whichever rows share it (matmul.h) and the sum's order is the token's own, so
 * a token's output does not depend on the batch. */
static void moe_ffn(hr_model_ctx *c, int il, int T) {
    const hr_layer *L = &c->m->layers[il];
    const hr_hparams *hp = &c->m->hp;
    const int NE = hp->n_expert, K = hp->n_expert_used, E = hp->n_embd;
    const int64_t Fe = hp->n_ff_exp;
    if (hp->arch == HR_ARCH_DEEPSEEK2) {
        moe_route_deepseek(c, L, T);
        if (L->sh_gate.data) shared_experts(c, L, T); /* from xb, before the sum below overwrites it */
    } else {
        moe_route(c, L, T);
    }
    /* counting sort of the T*K slots by expert, slots ascending within one */
    int32_t *start = c->moe_start;
    memset(start, 0, sizeof(int32_t) * (size_t)(NE + 1));
    for (int i = 0; i < T * K; i++) start[c->moe_sel[i] + 1]++;
    for (int e = 0; e < NE; e++) start[e + 1] += start[e];
    for (int i = 0, e; i < T * K; i++) { /* start[e] advances as slots are placed, then is restored */
        e = c->moe_sel[i];
        c->moe_slots[start[e]++] = i;
    }
    for (int e = NE; e > 0; e--) start[e] = start[e - 1];
    start[0] = 0;
    for (int e = 0; e < NE; e++) {
        const int n = start[e + 1] - start[e];
        if (n == 0) continue;
        const int32_t *slots = c->moe_slots + start[e];
        for (int i = 0; i < n; i++) /* a token picks an expert once: at most T rows */
            memcpy(c->moe_xe + (size_t)i * E, c->xb + (size_t)(slots[i] / K) * E, sizeof(float) * (size_t)E);
        const hr_weight wg = expert(&L->exp_gate, e), wu = expert(&L->exp_up, e), wd = expert(&L->exp_down, e);
        matmul(c, &wg, c->moe_xe, n, c->moe_g);
        matmul(c, &wu, c->moe_xe, n, c->moe_u);
        add_expert_bias(c->moe_g, L->b_exp_gate, e, n, Fe); /* gpt-oss's expert biases */
        add_expert_bias(c->moe_u, L->b_exp_up, e, n, Fe);
        for (int i = 0; i < n; i++) {
            if (hp->ffn_act == HR_FFN_SWIGLU_OAI)
                hr_op_swiglu_oai(c->moe_g + (size_t)i * Fe, c->moe_u + (size_t)i * Fe, (int)Fe);
            else
                c->kernels.swiglu(c->moe_g + (size_t)i * Fe, c->moe_u + (size_t)i * Fe, (int)Fe);
        }
        matmul(c, &wd, c->moe_g, n, c->moe_xe); /* the gathered input is spent: its rows take the output */
        add_expert_bias(c->moe_xe, L->b_exp_down, e, n, E);
        for (int i = 0; i < n; i++)
            memcpy(c->moe_out + (size_t)slots[i] * E, c->moe_xe + (size_t)i * E, sizeof(float) * (size_t)E);
    }
    for (int t = 0; t < T; t++) {
        float *y = c->xb + (size_t)t * E;
        const float *w = c->moe_w + (size_t)t * K, *o = c->moe_out + (size_t)t * K * E;
        for (int j = 0; j < E; j++) y[j] = w[0] * o[j];
        for (int k = 1; k < K; k++)
            for (int j = 0; j < E; j++) y[j] += w[k] * o[(size_t)k * E + j];
        if (L->sh_gate.data) hr_op_add(y, c->sh_out + (size_t)t * E, E); /* deepseek2: routed + shared */
    }
}

/* ---- attention phase: K/V writes, then per-token attention, each split over the thread pool ---- */

typedef struct attn_job {
    hr_model_ctx *c;
    const hr_batch *b;
    int layer;
} attn_job;

static void kv_write_task(void *arg, int ith, int nth) {
    attn_job *j = arg;
    hr_model_ctx *c = j->c;
    const hr_hparams *hp = &c->m->hp;
    int kvd = hp->n_head_kv * hp->head_dim;
    const float *v = hp->kv_lora_rank > 0 ? c->k : c->v; /* latent attention: V is K's first dims */
    for (int t = ith; t < j->b->n_tokens; t += nth)
        hr_kv_write(c->kv, j->layer, j->b->seq[t], j->b->pos[t], c->k + (size_t)t * kvd, v + (size_t)t * kvd);
}

/* Token after token over the threads; with fewer tokens than threads each token's query heads are
 * cut into nth / T parts (a lone token's attention over a long context is the step's largest serial
 * part otherwise: 22 layers x 32 heads x 2K positions, ~12 ms a token on one thread). Each head's
 * result is the same whichever thread computes it. */
static void attention_task(void *arg, int ith, int nth) {
    attn_job *j = arg;
    hr_model_ctx *c = j->c;
    const hr_hparams *hp = &c->m->hp;
    const int qd = hp->n_head * hp->head_dim, T = j->b->n_tokens, H = hp->n_head;
    const int parts = T >= nth ? 1 : HR_MIN(nth / T, H);
    const float scale = hp->attn_scale;
    float *scratch = c->att_scratch + (size_t)ith * c->att_scratch_floats;
    for (int i = ith; i < T * parts; i += nth) {
        const int t = i / parts, part = i % parts;
        hr_kv_attention_heads(c->kv, j->layer, j->b->seq[t], j->b->pos[t] + 1, c->q + (size_t)t * qd, H,
                              part * H / parts, (part + 1) * H / parts, scale, c->m->layers[j->layer].sinks,
                              c->att + (size_t)t * qd, scratch);
    }
}

/* Layer il's K/V writes for the batch, then its attention (a lone token's heads shared by the pool). */
static void write_and_attend(hr_model_ctx *c, const hr_batch *b, int il) {
    attn_job job = {.c = c, .b = b, .layer = il};
    if (b->n_tokens == 1) /* one write: not worth a fork */
        kv_write_task(&job, 0, 1);
    else
        hr_threadpool_run(c->tp, kv_write_task, &job);
    hr_threadpool_run(c->tp, attention_task, &job);
}

static void add_bias(float *y, const float *bias, int64_t T, int n) {
    if (!bias) return;
    for (int64_t t = 0; t < T; t++) hr_op_add(y + t * n, bias, n);
}

/* Per-head RMSNorm of token t's Q and K (qwen3, gemma3), over D with the layer's (D) weights. */
static void norm_heads_row(hr_model_ctx *c, const hr_layer *L, int t) {
    const hr_hparams *hp = &c->m->hp;
    const int D = hp->head_dim;
    float *q = c->q + (size_t)t * hp->n_head * D, *k = c->k + (size_t)t * hp->n_head_kv * D;
    for (int h = 0; h < hp->n_head; h++) hr_op_rmsnorm(q + h * D, q + h * D, L->q_norm, D, hp->norm_eps);
    for (int h = 0; h < hp->n_head_kv; h++) hr_op_rmsnorm(k + h * D, k + h * D, L->k_norm, D, hp->norm_eps);
}

/* Rotates one head, then scales its rotated dims by LongRoPE's attention factor (cos and sin carry
 * it in llama.cpp's rope; the dims past n_rot are left as they are there too). */
static void rope_head(const hr_hparams *hp, float *x, const float *inv_freq, float pos) {
    hr_op_rope(x, hp->n_rot, inv_freq, pos, hp->rope_neox);
    if (hp->rope_attn_factor > 0.0f)
        for (int i = 0; i < hp->n_rot; i++) x[i] *= hp->rope_attn_factor;
}

/* Pairs of rotated dims whose angles rope_row computes once for all heads (every model's n_rot / 2
 * so far is at most 256; past this it turns head by head, the same bits). */
#define HR_ROPE_PAIRS_MAX 512

/* RoPE of token t's Q and K heads: the angles' cosines and sines once for the token, since every
 * head turns by the same ones (per head, a 16-token TinyLlama step made ~400K cosf / sinf calls). */
static void rope_row(hr_model_ctx *c, const hr_batch *b, int il, int t) {
    const hr_hparams *hp = &c->m->hp;
    const hr_layer_attn *la = &c->m->layer_attn[il];
    const float *inv_freq = la->kind == HR_ATTN_WINDOW && c->inv_freq_swa ? c->inv_freq_swa : c->inv_freq;
    const int D = hp->head_dim, qd = hp->n_head * D, kvd = hp->n_head_kv * D;
    const float pos = (float)b->pos[t] * la->rope_linear_scale;
    float *q = c->q + (size_t)t * qd, *k = c->k + (size_t)t * kvd;
    if (hp->n_rot / 2 > HR_ROPE_PAIRS_MAX) {
        for (int h = 0; h < hp->n_head; h++) rope_head(hp, q + h * D, inv_freq, pos);
        for (int h = 0; h < hp->n_head_kv; h++) rope_head(hp, k + h * D, inv_freq, pos);
        return;
    }
    float cs[2 * HR_ROPE_PAIRS_MAX];
    hr_op_rope_angles(cs, hp->n_rot, inv_freq, pos);
    for (int h = 0; h < hp->n_head + hp->n_head_kv; h++) {
        float *x = h < hp->n_head ? q + h * D : k + (h - hp->n_head) * D;
        hr_op_rope_cs(x, hp->n_rot, cs, hp->rope_neox);
        if (hp->rope_attn_factor > 0.0f) /* as rope_head */
            for (int i = 0; i < hp->n_rot; i++) x[i] *= hp->rope_attn_factor;
    }
}

/* ---- multi-head latent attention (deepseek2) ----
 * xb = the layer's attention of xb's rows with the absorbed projections (DeepSeek-V2 paper, section
 * 2.1; llama.cpp's MLA graph): per token the cache gets one vector [RMSNorm(c_KV) (C) | RoPE(k_pe) (R)]
 * (xb W_kv_a^T); each query head becomes [q_nope W_UK_h (C) | RoPE(q_pe) (R)], so q.k over the cached
 * vector equals the head's q.k over its decompressed key, and attention's output over the cached vectors'
 * first C dims (V from K, one KV head for all H) is the latent the head's W_UV decompresses. Decode reads
 * only the latent cache. Shapes: Dq = qk_nope_dim + R, D = C + R (the cache's head_dim). */
static void mla_attention(hr_model_ctx *c, const hr_batch *b, int il) {
    const hr_layer *L = &c->m->layers[il];
    const hr_hparams *hp = &c->m->hp;
    const hr_layer_attn *la = &c->m->layer_attn[il];
    const int T = b->n_tokens, H = hp->n_head, R = hp->n_rot, Dn = hp->qk_nope_dim, Dv = hp->v_head_dim;
    const int C = hp->kv_lora_rank, D = hp->head_dim, Dq = Dn + R;
    if (hp->q_lora_rank > 0) { /* V2/V3: Q through its low-rank pair, normed between */
        matmul(c, &L->wq_a, c->xb, T, c->mla_qa);
        for (int t = 0; t < T; t++) {
            float *r = c->mla_qa + (size_t)t * hp->q_lora_rank;
            hr_op_rmsnorm(r, r, L->q_a_norm, hp->q_lora_rank, hp->norm_eps);
        }
        matmul(c, &L->wq_b, c->mla_qa, T, c->mla_q);
    } else { /* V2-Lite */
        matmul(c, &L->wq, c->xb, T, c->mla_q);
    }
    matmul(c, &L->wkv_a, c->xb, T, c->k); /* (T, C + R) */
    for (int t = 0; t < T; t++) {
        const float pos = (float)b->pos[t] * la->rope_linear_scale;
        float *kt = c->k + (size_t)t * D;
        hr_op_rmsnorm(kt, kt, L->kv_a_norm, C, hp->norm_eps);
        rope_head(hp, kt + C, c->inv_freq, pos);
        for (int h = 0; h < H; h++) rope_head(hp, c->mla_q + ((size_t)t * H + h) * Dq + Dn, c->inv_freq, pos);
    }
    for (int h = 0; h < H; h++) { /* absorb W_UK: one product per head over the T tokens */
        for (int t = 0; t < T; t++)
            memcpy(c->mla_a + (size_t)t * Dn, c->mla_q + ((size_t)t * H + h) * Dq, sizeof(float) * (size_t)Dn);
        const hr_weight wk = expert(&L->wk_b, h);
        matmul(c, &wk, c->mla_a, T, c->mla_b);
        for (int t = 0; t < T; t++) {
            float *qh = c->q + ((size_t)t * H + h) * D;
            memcpy(qh, c->mla_b + (size_t)t * C, sizeof(float) * (size_t)C);
            memcpy(qh + C, c->mla_q + ((size_t)t * H + h) * Dq + Dn, sizeof(float) * (size_t)R);
        }
    }
    write_and_attend(c, b, il);
    for (int h = 0; h < H; h++) { /* decompress through W_UV: the first C dims of each head's output */
        for (int t = 0; t < T; t++)
            memcpy(c->mla_a + (size_t)t * C, c->att + ((size_t)t * H + h) * D, sizeof(float) * (size_t)C);
        const hr_weight wv = expert(&L->wv_b, h);
        matmul(c, &wv, c->mla_a, T, c->mla_b);
        for (int t = 0; t < T; t++)
            memcpy(c->mla_o + ((size_t)t * H + h) * Dv, c->mla_b + (size_t)t * Dv, sizeof(float) * (size_t)Dv);
    }
    matmul(c, &L->wo, c->mla_o, T, c->xb);
}

/* y = RMSNorm(y) * w (gemma's post-attention and post-FFN norms, where present), then x += y. */
static void residual_row(const hr_hparams *hp, const float *post_norm, float *x, float *y) {
    if (post_norm) hr_op_rmsnorm(y, y, post_norm, hp->n_embd, hp->norm_eps);
    hr_op_add(x, y, hp->n_embd);
}

static void row_op(const rows_job *j, int t) {
    hr_model_ctx *c = j->c;
    const hr_hparams *hp = &c->m->hp;
    const hr_layer *L = &c->m->layers[j->il];
    const int E = hp->n_embd;
    const int64_t F = L->w_gate.rows; /* ROW_ACT_*: a dense layer's FFN width */
    float *x = c->x + (size_t)t * E, *xb = c->xb + (size_t)t * E;
    switch (j->op) {
    case ROW_ATTN_NORM: hr_op_rmsnorm(xb, x, L->attn_norm, E, hp->norm_eps); break;
    case ROW_ATTN_PREP: {
        const int qd = hp->n_head * hp->head_dim, kvd = hp->n_head_kv * hp->head_dim;
        if (L->bq) hr_op_add(c->q + (size_t)t * qd, L->bq, qd);
        if (L->bk) hr_op_add(c->k + (size_t)t * kvd, L->bk, kvd);
        if (L->bv) hr_op_add(c->v + (size_t)t * kvd, L->bv, kvd);
        if (L->q_norm) norm_heads_row(c, L, t);
        rope_row(c, j->b, j->il, t);
        break;
    }
    case ROW_ATTN_OUT:
        residual_row(hp, L->attn_post_norm, x, xb);
        hr_op_rmsnorm(xb, x, L->ffn_norm, E, hp->norm_eps);
        break;
    case ROW_FFN_OUT:
        residual_row(hp, L->ffn_post_norm, x, xb);
        if (j->il + 1 < hp->n_layer) hr_op_rmsnorm(xb, x, c->m->layers[j->il + 1].attn_norm, E, hp->norm_eps);
        break;
    case ROW_ACT_FUSED: gated_act(c, c->hg + (size_t)t * 2 * F, c->hg + (size_t)t * 2 * F + F, (int)F); break;
    case ROW_ACT_SPLIT: gated_act(c, c->hg + (size_t)t * F, c->hu + (size_t)t * F, (int)F); break;
    default: break;
    }
}

static void rows_item(void *arg, int64_t t, int ith) {
    (void)ith;
    row_op(arg, (int)t);
}

/* Step op of layer il for the T tokens; one token runs inline (run_items does not fork for one). */
static void rows(hr_model_ctx *c, const hr_batch *b, int il, int op, int T) {
    rows_job j = {.c = c, .b = b, .il = il, .op = op};
    hr_threadpool_run_items(c->tp, rows_item, &j, T);
}

static hr_status check_batch(const hr_model_ctx *c, const hr_batch *b, hr_error *err) {
    if (b->n_tokens < 1 || b->n_tokens > c->max_tokens)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "batch of %d tokens (allowed 1..%d)", b->n_tokens, c->max_tokens);
    for (int t = 0; t < b->n_tokens; t++) {
        if (b->tokens[t] < 0 || b->tokens[t] >= c->m->hp.n_vocab)
            return hr_error_set(err, HR_ERR_INVALID_ARG, "token id %d is outside the vocabulary (0..%d)", b->tokens[t],
                                c->m->hp.n_vocab - 1);
        /* past max_ctx only where the sequence's policy bounds what attention reads (window, sinks) */
        if (b->pos[t] < 0 || (b->pos[t] >= c->max_ctx && hr_kv_seq_attention_scratch_floats(
                                                             c->kv, b->seq[t], b->pos[t] + 1) > c->att_scratch_floats))
            return hr_error_set(err, HR_ERR_RANGE,
                                "position %d is outside the context (0..%d); a window or sinks KV policy lets a "
                                "sequence run past it",
                                b->pos[t], c->max_ctx - 1);
    }
    return HR_OK;
}

static hr_status cpu_forward(hr_model_ctx *c, const hr_batch *b, float *logits, hr_error *err) {
    hr_status st = check_batch(c, b, err);
    if (st) return st;
    const hr_model *m = c->m;
    const hr_hparams *hp = &m->hp;
    const int T = b->n_tokens, E = hp->n_embd;

    /* x = token_embd[tokens] */
    const hr_dequantize_row_fn deq = c->kernels.type[m->tok_embd.type].dequantize;
    for (int t = 0; t < T; t++)
        deq((const uint8_t *)m->tok_embd.data + (size_t)b->tokens[t] * m->tok_embd.row_bytes, c->x + (size_t)t * E, E);
    if (hp->embd_scale > 0.0f) /* gemma: sqrt(E) */
        for (size_t i = 0; i < (size_t)T * E; i++) c->x[i] *= hp->embd_scale;

    rows(c, b, 0, ROW_ATTN_NORM, T); /* the later layers' attention norms end the layer before (ROW_FFN_OUT) */
    for (int il = 0; il < hp->n_layer; il++) {
        const hr_layer *L = &m->layers[il];
        if (hp->kv_lora_rank > 0) { /* deepseek2 */
            mla_attention(c, b, il);
        } else {
            project_qkv(c, il, T);
            rows(c, b, il, ROW_ATTN_PREP, T);
            write_and_attend(c, b, il);
            matmul(c, &L->wo, c->att, T, c->xb);
            add_bias(c->xb, L->bo, T, E); /* gpt-oss */
        }
        rows(c, b, il, ROW_ATTN_OUT, T);
        if (hp->n_expert > 0 && il >= hp->n_layer_dense) { /* deepseek2's leading layers are dense */
            moe_ffn(c, il, T);
        } else {
            const int64_t hs = ffn_gate_up(c, il, T);
            hr_matmul_strided(c->mm, L->w_down.data, L->w_down.type, L->w_down.rows, L->w_down.cols, c->hg, hs, T,
                              c->xb);
        }
        rows(c, b, il, ROW_FFN_OUT, T);
    }

    /* logits for the rows that want them: gather, norm, project */
    int n_out = 0;
    for (int t = 0; t < T; t++)
        if (b->want_logits && b->want_logits[t]) c->out_rows[n_out++] = t;
    if (n_out == 0) return HR_OK;
    for (int i = 0; i < n_out; i++)
        hr_op_rmsnorm(c->xb + (size_t)i * E, c->x + (size_t)c->out_rows[i] * E, m->output_norm, E, hp->norm_eps);
    matmul(c, &m->output, c->xb, n_out, logits);
    if (hp->final_softcap > 0.0f) { /* gemma: logits become cap * tanh(logit / cap) */
        const float cap = hp->final_softcap;
        for (size_t i = 0; i < (size_t)n_out * hp->n_vocab; i++) logits[i] = cap * tanhf(logits[i] / cap);
    }
    return HR_OK;
}

/* Weights as this backend holds them: the model's tensors, used in place (mapped or resident; the
 * x16 repacking at load keeps their size). */
static uint64_t cpu_weight_bytes(const hr_model *m) { return hr_model_weight_bytes(m); }

const hr_backend_ops hr_backend_cpu = {.name = "cpu",
                                       .create = cpu_create,
                                       .destroy = cpu_destroy,
                                       .forward = cpu_forward,
                                       .isa = cpu_isa,
                                       .n_threads = cpu_n_threads,
                                       .run_items = cpu_run_items,
                                       /* 2 threads, workers spinning from the forward pass: 1.0-2.2x
                                        * from 8 rows of 32,000 or 2 of 128,256 (docs/BENCHMARKS.md) */
                                       .run_items_min = 8 * 32000,
                                       .weight_bytes = cpu_weight_bytes,
                                       .scratch_bytes = cpu_scratch_bytes};

/* kv_storage.h: the KV storage interface: where the bytes of the KV cache live and the code that
 * writes and reads them. The KV manager (kv/: block ids, tables, reference counts, prefix cache,
 * policies, ledger, swap and remote-tier bookkeeping) decides which block and which slot; a storage
 * holds the blocks and does what needs their bytes: write K/V, attend, whole-block read/write/copy
 * for swap, the remote tier and copy-on-write. The manager never touches a block's bytes; the CPU
 * storage (backend/cpu/kv_storage_cpu.h) implements this today, a GPU storage next.
 *
 * A storage holds n_blocks blocks, each [L][K | V] with, per layer, K = [Hkv][head region in the K
 * layout] and V the same in the V layout (kv_format.h), and, for formats encoded when a block fills
 * (q4, kivi2: "deferred"), n_stage f16 tail buffers ("stages"), each [L][K | V][Hkv][B][D] with a
 * count per layer of the token slots written. The manager gives a stage to a block being filled,
 * names it in every write to that block, and takes it back when the block is full.
 *
 * Threads: write and attend may run on kernel worker threads at once for distinct (layer, block
 * slot) writes and for queries of blocks no one writes in the same phase; everything else runs on
 * the manager's thread. Dimension letters: L layers, Hkv KV heads, H query heads, D head_dim,
 * B block_size. */
#ifndef HR_KV_KV_STORAGE_H
#define HR_KV_KV_STORAGE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kv/kv_format.h"

/* The byte layout read_block gives and write_block takes (every layer's K block then V block, each
 * head-major in its format); the remote tier writes it into its metadata, so bump it on a change. */
#define HR_KV_BLOCK_LAYOUT 2u /* 2: q8's groups of 64 */

typedef struct hr_kv_storage_params {
    /* L is the layer slots of one block: every layer of a one-kind model; a hybrid pool's G slots
     * per group (kv.h's layer groups), the manager mapping each model layer to a group's slot */
    int n_layers, n_kv_heads, head_dim, block_size; /* L, Hkv, D, B */
    kv_fmt k, v;                                    /* the K and V head-region layouts (kv_fmt_init) */
    kv_fmt stage;  /* an f16 head region at this shape: how a stage is read (deferred formats) */
    int n_blocks;  /* blocks to hold, >= 1 */
    int n_stage;   /* tail buffers (0 unless k or v is deferred) */
    bool prefault; /* make the memory resident at create, so a budget that cannot be held fails there */
    /* the kernels: "scalar", "avx2" or "avx512" (the AVX2 KV kernels), the same names as --isa. The
     * caller chooses (the CPU-feature dispatcher) and vouches that the CPU runs them; a storage never
     * probes the CPU itself. NULL = "scalar". */
    const char *isa;
    /* a latent cache: no V bytes; V is each token's first v_from_k dims of K, which V's kernels read (k
     * and v share one format, per token), and attention's out holds them per head (0 past them); 0: V
     * has its own bytes */
    int v_from_k;
} hr_kv_storage_params;

/* Which positions a query sees beyond causality (a policy or a model's sliding window); the manager
 * computes it. Visible blocks: logical [0, sink_blocks) and [first_blk, n_blk); within them a
 * position t is visible iff t < sinks || t >= lo, and, with a mask, iff its bit is set. Every storage's
 * attend applies the whole view, masks and scores included (the CPU's and the CUDA one's). */
typedef struct hr_kv_attn_view {
    int sink_blocks, first_blk;
    int sinks, lo;
    /* token-level policies: bit t of mask[((j * L + layer) * Hkv + kv_head) * MW + t / 64], MW =
     * ceil(B / 64), for logical block j; NULL: no token mask */
    const uint64_t *mask;
    /* where each visible token's softmax weight is added, fixed point 2^-32, at
     * score[((j * L + layer) * Hkv + kv_head) * B + t]; NULL: not accumulated */
    atomic_uint_fast64_t *score;
} hr_kv_attn_view;

/* One query row of a ragged batch: one token of one sequence, over that sequence's blocks. */
typedef struct hr_kv_attn_query {
    const int32_t *table;        /* physical block ids in logical order (-1: a block the policy dropped) */
    int n_ctx;                   /* positions [0, n_ctx) take part (0: out is zeroed) */
    int32_t tail_stage;          /* the stage of block n_ctx / B when n_ctx % B != 0 and it has one, else -1 */
    const hr_kv_attn_view *view; /* NULL: every position of [0, n_ctx), no holes */
    const float *q;              /* [H][D], RoPE applied */
    float *out;                  /* [H][D] */
} hr_kv_attn_query;

/* The most query heads attention serves from one read of a KV head (hr_kv_attn_args.group). */
#define HR_KV_ATTN_GROUP 8

typedef struct hr_kv_attn_args {
    int n_heads;   /* H, a multiple of Hkv: head h reads KV head h / (H / Hkv) */
    float scale;   /* applied to q.k */
    float softcap; /* > 0: a score s becomes softcap * tanh(s / softcap) after the scale */
    /* [H] or NULL: head h's learned sink logit joins its softmax's denominator (gpt-oss): the weights
     * become e^(x_t - m) / (sum_t e^(x_t - m) + e^(sinks[h] - m)), m the scores' max */
    const float *sinks;
    /* the query heads to compute, [head_begin, head_end) (head_end 0: all n_heads); the other heads'
     * outputs are left as they are, so threads can share one token's heads */
    int head_begin, head_end;
    /* how many query heads' scores the scratch holds (>= 1): up to that many heads of one KV head may
     * be computed together from one read of its K and V */
    int group;
} hr_kv_attn_args;
/* the end of a's head range (head_end 0: n_heads) */
static inline int hr_kv_attn_head_end(const hr_kv_attn_args *a) { return a->head_end ? a->head_end : a->n_heads; }

typedef struct hr_kv_storage hr_kv_storage;

typedef struct hr_kv_storage_ops {
    const char *name; /* "cpu", "cuda" */
    void (*destroy)(hr_kv_storage *st);
    /* the kernels in use ("scalar", "avx2") */
    const char *(*isa)(const hr_kv_storage *st);
    /* the bytes it holds for blocks and stages, for the budget (the manager's metadata apart) */
    uint64_t (*footprint)(const hr_kv_storage *st);
    /* one token's K and V ([Hkv][D] each) at slot t of block in layer; stage: the block's tail
     * buffer (deferred formats), else -1. The write that fills the last slot of a block in a layer
     * encodes the block there. The block is not shared and slot t not written before in that layer. */
    void (*write)(hr_kv_storage *st, int layer, int32_t block, int t, int32_t stage, const float *k, const float *v);
    /* out = softmax(scale * q . K) . V for each query of qs[0..n) in layer, reading blocks in their
     * formats where they lie. scratch: the floats the manager sized for the call's largest query
     * (hr_kv_attention_scratch_floats), private to the calling thread. Each query's result depends
     * only on its inputs and the bytes, never on the other queries. */
    void (*attend)(const hr_kv_storage *st, int layer, const hr_kv_attn_query *qs, int n, const hr_kv_attn_args *a,
                   float *scratch);
    /* whole blocks in the HR_KV_BLOCK_LAYOUT byte order (block_bytes = L * Hkv * (K + V head bytes)) */
    void (*read_block)(const hr_kv_storage *st, int32_t block, void *out);
    void (*write_block)(hr_kv_storage *st, int32_t block, const void *in);
    void (*copy_block)(hr_kv_storage *st, int32_t from, int32_t to);
    /* tail buffers: reset (a block starts filling: no slot written), how many slots of layer are
     * written, the whole buffer (L * 2 * Hkv * B * D f16) with its L counts, and a copy of both */
    void (*stage_reset)(hr_kv_storage *st, int32_t stage);
    int (*stage_filled)(const hr_kv_storage *st, int32_t stage, int layer);
    void (*stage_read)(const hr_kv_storage *st, int32_t stage, void *out, uint16_t *filled);
    void (*stage_write)(hr_kv_storage *st, int32_t stage, const void *in, const uint16_t *filled);
    void (*stage_copy)(hr_kv_storage *st, int32_t from, int32_t to);
    /* Host memory for the swap tier's slots, which read_block / write_block then fill and read in
     * place (a GPU's pinned memory: DMA straight into the slot); NULL: the tier is a file. host_alloc
     * returns NULL with err set when it cannot. */
    void *(*host_alloc)(hr_kv_storage *st, size_t bytes, hr_error *err);
    void (*host_free)(hr_kv_storage *st, void *p);
} hr_kv_storage_ops;

/* Every storage begins with this (its own state follows); the manager holds it by pointer. */
struct hr_kv_storage {
    const hr_kv_storage_ops *ops;
};

/* How a pool makes its storage (hr_kv_config.storage, called with hr_kv_config.storage_user: a GPU
 * storage's device): a GPU's, or a test's; a pool without one makes the CPU storage. On success *out
 * is the storage, which the pool destroys through its ops. */
typedef hr_status (*hr_kv_storage_create_fn)(void *user, const hr_kv_storage_params *p, hr_kv_storage **out,
                                             hr_error *err);

#endif

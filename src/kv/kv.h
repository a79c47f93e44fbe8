/* kv.h: the paged KV cache: one pool of fixed-size blocks allocated once from a byte budget, block
 * tables per sequence, reference counts, a prefix cache of full blocks, KV formats, swap tier, and the
 * ledger that accounts for every byte.
 *
 * Invariants (checked by hr_kv_pool_check and by the property test):
 *   1. free + used + cached == total blocks, always.
 *   2. a block's reference count == the number of sequence block tables holding it; used blocks have
 *      refcount >= 1, cached and free blocks refcount 0.
 *   3. only full blocks carry a prefix hash and are shared; a shared block is never written.
 *   4. the pool's memory is allocated once in hr_kv_pool_create and never grows.
 *   5. (layer groups, below) a block is held only by rows of one group; a window group's row has a
 *      hole exactly where its window no longer sees a whole block (no policy), a full group's none;
 *      the blocks in use by each layer kind are counted (the ledger's kinds).
 *
 * Threads: one thread (the engine's) owns a pool and calls everything here except that, during a
 * forward pass, hr_kv_write and hr_kv_attention may be called from kernel worker threads for
 * distinct (layer, token) / (layer, token, head) work items. Ledger reads (hr_kv_pool_ledger) may be
 * called from any thread: the figures are kept in atomics, each read is a consistent-enough snapshot
 * for metrics.
 *
 * Manager and storage: this is the KV manager (block ids, tables, reference counts, the prefix cache,
 * policies, the ledger, swap and remote-tier bookkeeping); it never touches a block's bytes. Those
 * live in a KV storage (kv_storage.h: the CPU's in backend/cpu/kv_storage_cpu.c, a GPU's next), which
 * writes K/V, attends, and reads, writes and copies whole blocks when the manager asks.
 *
 * The files of kv/ in dependency order: each calls only files above it (tests/test_kv_layers.c checks
 * this list against the code, so there is no call circle):
 *   kv_format.c      formats as vocabulary: names, parsing, per-head byte layouts
 *   map.c            the prefix map (hash -> block) and the root of every hash chain
 *   block.c          block states, free list and LRU, reference counts, tail buffers, table helpers
 *   evict.c          what policies do to a sequence: holes, token masks and scores, top-k
 *   policy_window.c  window:W, sinks:S,window:W and model sliding windows
 *   policy_h2o.c     h2o:B
 *   policy_snapkv.c  snapkv:B
 *   policy.c         parsing, checks, the registry, after-commit dispatch, the ledger's policy figures
 *   swap.c           the swap tier: a file of block slots, bytes through the storage
 *   prefix.c         chain hashes, commit, share_prefix, the observer and remote fetch, read_block
 *   pool.c           sizes, create/destroy (with the storage), sequences: create, reserve, free, fork
 *   attend.c         hr_kv_write, hr_kv_attention: a sequence and position into storage calls
 *   ledger.c         pool and sequence ledgers, hr_kv_pool_check
 * Below them all, the storage, reached only through its ops (pool.c also names the CPU storage's
 * create function as the default).
 *
 * Dimension letters: L = layers, H = query heads, Hkv = KV heads, D = head_dim, B = block_size. */
#ifndef HR_KV_KV_H
#define HR_KV_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kv/kv_format.h"  /* hr_kv_format, names, parsing */
#include "kv/kv_storage.h" /* the storage a pool keeps its bytes in */

typedef struct hr_kv_config {
    int n_layers;
    int n_kv_heads;
    int head_dim;
    int block_size; /* tokens per block, 8..256 */
    hr_kv_format k_format;
    hr_kv_format v_format;
    uint64_t budget_bytes; /* the pool gets floor(budget / block_bytes) blocks */
    int max_seqs;          /* capacity of the sequence table */
    bool force_scalar;     /* use the scalar reference kernels even where AVX2 exists (tests, eval) */
    int stage_blocks;      /* q4/kivi2 only: f16 tail buffers, one per block being filled (0: enough for
                              a step: hr_kv_stage_blocks_for(block_size, max_step_tokens, max_seqs)) */
    int max_step_tokens;   /* the most tokens written in one step over all sequences (the engine's
                              max_batch_tokens; 0: 512); sizes the default stage_blocks */
    bool prefault;         /* map the arena resident at create (MAP_POPULATE): RSS = budget from the start,
                              and a budget the machine cannot hold fails here, not mid-run */
    const char *isa;       /* the storage's kernels as --isa names them ("scalar"; "avx2" or "avx512": the
                              AVX2 KV kernels), chosen by the caller's CPU-feature dispatcher; NULL: the
                              best this CPU has. force_scalar wins over it */
    /* where the bytes live: NULL for the CPU storage (backend/cpu/kv_storage_cpu.h), or another's
     * (the CUDA storage: backend/cuda/cuda.h), called with storage_user (the CUDA storage's device) */
    hr_kv_storage_create_fn storage;
    void *storage_user;
    /* > 0: a latent cache (DeepSeek's multi-head latent attention, hr_hparams.kv_lora_rank): V is not
     * stored; a token's V is the first v_from_k dims of its K (attention reads K's bytes for both), so a
     * block holds K only. Needs a per-token format read as stored (f32, f16, bf16, q8, fp8) with
     * v_format == k_format. 0: K and V stored apart. */
    int v_from_k;
    /* [n_layers]: each layer's sliding window (0: full attention), borrowed for the calls that take the
     * config; NULL: every layer full. Layers are grouped by kind (layer groups, below): a model whose
     * layers are all of one kind (llama, qwen, mistral) has one group and the pool is exactly the
     * one-table pool; a model mixing window and full layers (gemma2/3, gpt-oss) has several, and its
     * window groups free what their window no longer sees while the full groups keep everything. */
    const int32_t *layer_window;
    /* query heads per KV head (the model's n_head / n_head_kv; 0 counts as 1). Attention then reads a
     * KV head's K and V once for up to HR_KV_ATTN_GROUP of its query heads, where the format's kernels
     * can (the same bits as one head at a time); the scratch holds that many heads' scores. */
    int q_per_kv;
} hr_kv_config;

/* ---- layer groups -------------------------------------------------------------------------------
 * The hybrid KV manager (vLLM's hybrid allocator, llama.cpp's iSWA cache, done here this way): layers
 * of one kind (full attention; a sliding window of W tokens; a later MLA latent is one more shape) are
 * grouped, every group has the same number G of layer slots, G = the gcd of the kinds' layer counts
 * (G = n_layers and one group for a one-kind model), so every physical block is G slots x Hkv x (K +
 * V) for B tokens, all groups draw from ONE free list and ONE budget, and each sequence has one block
 * table per group. Layer l of kind k, the i-th of its kind, is slot i % G of that kind's group i / G.
 * A window group's table loses (holes) the blocks its window cannot see any more, as the sequence
 * grows; a full group keeps everything. More than HR_KV_MAX_GROUPS groups (a gcd of 1 on a deep model
 * with a lopsided mix) falls back to one group of every layer (the old behaviour: a block leaves only
 * when no layer sees it). */
#define HR_KV_MAX_GROUPS 64
#define HR_KV_MAX_KINDS  4 /* distinct layer kinds (window sizes, full); more: one group */

typedef struct hr_kv_kind_info {
    int window;           /* 0: full attention; > 0: sliding window of this many tokens */
    int n_layers;         /* layers of this kind */
    int n_groups;         /* groups of this kind (n_layers / G) */
    bool latent;          /* full layers of a latent cache (v_from_k: MLA's one latent per token, K only) */
    uint64_t token_bytes; /* one token in every layer of this kind */
} hr_kv_kind_info;

typedef struct hr_kv_groups {
    int n_groups;                           /* 1 for a one-kind model */
    int slots;                              /* G: layer slots per block */
    int n_kinds;                            /* 1..HR_KV_MAX_KINDS (1 when fallen back to one group) */
    hr_kv_kind_info kinds[HR_KV_MAX_KINDS]; /* in order of their first layer */
    int8_t group_kind[HR_KV_MAX_GROUPS];    /* each group's kind */
    uint64_t block_bytes;                   /* one physical block (G slots) */
    uint64_t group_token_bytes;             /* block_bytes / block_size: one group, one token */
} hr_kv_groups;

/* The grouping a config makes (pure; HR_ERR_INVALID_ARG for a bad config or a negative window). */
hr_status hr_kv_config_groups(const hr_kv_config *cfg, hr_kv_groups *out, hr_error *err);
/* The most physical blocks one sequence holds with n_tokens slots reserved, all groups: a full group
 * ceil(n / B); a window group min(ceil(n / B), the most its window ever holds: the window, the chunk
 * one step writes (max_step_tokens, 0: 512) reserved before the commit that frees the oldest, and a
 * partial block at each end; about (W + max_step_tokens) / B + 2). A one-group pool counts ceil(n / B)
 * whatever its window (the scheduler bounds windowed requests by their span). What the budget,
 * `headroom plan` and the scheduler count. 0 for a bad config. */
int64_t hr_kv_seq_blocks_at(const hr_kv_config *cfg, int64_t n_tokens);
/* The same for the groups of one kind only (hr_kv_groups.kinds[kind]); 0 for a bad kind. */
int64_t hr_kv_kind_blocks_at(const hr_kv_config *cfg, int kind, int64_t n_tokens);

typedef struct hr_kv_pool hr_kv_pool;
typedef int32_t hr_kv_seq; /* a sequence handle, valid from hr_kv_seq_create to hr_kv_seq_free */

/* Bytes one block takes across all layers for K and V, including its scales. 0 for a bad config. */
uint64_t hr_kv_block_bytes(const hr_kv_config *cfg);
/* Formats encoded when a block fills (q4, kivi2) keep every block that is being filled in f16 in a
 * tail buffer: this many bytes per buffer (0 for the other formats). A buffer is taken when a block
 * is reserved for writing (hr_kv_seq_reserve) and given back when the block fills: between steps a
 * sequence holds at most one (its partial last block); a step writing n tokens of a sequence takes at
 * most ceil(n / block_size) + 1 more. */
uint64_t hr_kv_stage_block_bytes(const hr_kv_config *cfg);
/* The default tail buffers: ceil(max_step_tokens / block_size) + max_seqs + 1. Between steps a
 * sequence holds at most one (its partial last block); a decode that starts a block had its previous
 * one fill and give its buffer back; a prefill chunk of n tokens takes at most ceil(n / B) + 1. So this
 * covers every step with one prefilling sequence; with several, the scheduler ends a chunk a block
 * early where buffers run out (it never needs more than max_running + 1 to progress). Pure. */
int hr_kv_stage_blocks_for(int block_size, int max_step_tokens, int max_seqs);
/* Bytes the pool takes from the budget before any block: stage_blocks tail buffers (0 for formats
 * without them). The pool holds floor((budget_bytes - hr_kv_fixed_bytes) / hr_kv_block_bytes)
 * blocks, so size a budget as fixed + n_blocks * block bytes. */
uint64_t hr_kv_fixed_bytes(const hr_kv_config *cfg);
/* Why a config cannot make a pool (HR_ERR_INVALID_ARG: a field out of range, a format the head size
 * cannot use), without making one; HR_OK when hr_kv_block_bytes is > 0. The budget is not checked. */
hr_status hr_kv_config_check(const hr_kv_config *cfg, hr_error *err);
/* Bytes hr_kv_pool_create allocates beside the arena for a pool of n_blocks: the pool itself, the
 * per-block tables (reference counts, states, prefix hashes and parents, token ids, list links,
 * tail-buffer slots), the prefix map, the sequence slots and their open-block rows (max_seqs), the
 * per-layer windows, and the CPU storage's header and tail-buffer fill counts (cfg->storage NULL). The
 * same sizes create allocates (0 for a bad config). Pure. */
uint64_t hr_kv_pool_meta_bytes(const hr_kv_config *cfg, int n_blocks);
/* Bytes of one sequence's block table once it holds n_tokens (allocated as the sequence grows). */
uint64_t hr_kv_seq_table_bytes(const hr_kv_config *cfg, int n_tokens);

/* Allocates the pool. HR_ERR_BUDGET (with a message saying what fits) when the budget holds no block;
 * HR_ERR_INVALID_ARG for a bad block size or format the head size cannot use. */
hr_status hr_kv_pool_create(const hr_kv_config *cfg, hr_kv_pool **out, hr_error *err);
void hr_kv_pool_destroy(hr_kv_pool *pool); /* NULL allowed */

const hr_kv_config *hr_kv_pool_config(const hr_kv_pool *pool);
/* The storage the pool keeps its bytes in (its ops' name says which: "cpu", "cuda"), for a backend
 * that must check it can reach them and read a device storage's deferred faults. */
const hr_kv_storage *hr_kv_pool_storage(const hr_kv_pool *pool);
/* The same for a forward pass that writes the storage's bytes itself, at the slots hr_kv_write_slot
 * gives (the GPU's batch writes) */
hr_kv_storage *hr_kv_pool_storage_rw(hr_kv_pool *pool);
int hr_kv_pool_n_blocks(const hr_kv_pool *pool);
int hr_kv_pool_n_free(const hr_kv_pool *pool);                 /* free + evictable cached blocks */
const char *hr_kv_pool_isa(const hr_kv_pool *pool);            /* "avx2" or "scalar": the kernels in use */
const hr_kv_groups *hr_kv_pool_groups(const hr_kv_pool *pool); /* the pool's layer groups */
/* hr_kv_seq_blocks_at for this pool's config. */
int64_t hr_kv_pool_seq_blocks(const hr_kv_pool *pool, int64_t n_tokens);
/* Blocks seq may still take to grow from n_slots reserved slots to `claim`: on a one-group pool
 * hr_kv_pool_seq_blocks(claim) - hr_kv_pool_seq_blocks(n_slots) (as before groups); on a hybrid pool
 * the claim's most less the blocks it holds now (a window group between two steps holds fewer than
 * its most: the next prefill chunk takes them back). seq < 0 or swapped: the whole claim. >= 0. */
int64_t hr_kv_seq_claim_blocks(const hr_kv_pool *pool, hr_kv_seq seq, int64_t n_slots, int64_t claim);

/* ---- sequences --------------------------------------------------------------------------------- */

hr_status hr_kv_seq_create(hr_kv_pool *pool, hr_kv_seq *out, hr_error *err);

/* Puts an empty sequence in a cache scope (a tenant: a hash of its API key or cache salt): its full
 * blocks are hashed with the scope mixed in, so they are shared with, and found by, only sequences of
 * the same scope. 0 (every sequence's start) is the shared scope. Kept across hr_kv_seq_reset and
 * copied by hr_kv_seq_fork. HR_ERR_INVALID_ARG when the sequence already holds tokens. */
hr_status hr_kv_seq_set_scope(hr_kv_pool *pool, hr_kv_seq seq, uint64_t scope, hr_error *err);

/* Shares the longest run of leading full blocks of `tokens` already in the pool (held by running
 * sequences or cached). Only for an empty sequence. Sets *n_cached to the number of tokens whose K/V
 * are now present (a multiple of block_size, at most n_tokens - 1 so that at least one token is left
 * to compute logits from). */
hr_status hr_kv_seq_share_prefix(hr_kv_pool *pool, hr_kv_seq seq, const int32_t *tokens, int n_tokens, int *n_cached,
                                 hr_error *err);

/* Makes the block table hold at least n_tokens slots and every block that tokens up to n_tokens will
 * be written to writable (q4/kivi2: holding a tail buffer). HR_ERR_FULL when the pool lacks free
 * blocks, or (q4/kivi2) free tail buffers (then nothing changed). Idempotent. */
hr_status hr_kv_seq_reserve(hr_kv_pool *pool, hr_kv_seq seq, int n_tokens, hr_error *err);
/* Makes the block table hold at least n_tokens slots without making them writable: a contiguous slot
 * claims its whole context up front, while tail buffers are taken step by step by hr_kv_seq_reserve.
 * HR_ERR_FULL when the pool lacks free blocks (then nothing changed). */
hr_status hr_kv_seq_reserve_ahead(hr_kv_pool *pool, hr_kv_seq seq, int n_tokens, hr_error *err);
/* Tail buffers a hr_kv_seq_reserve(seq, n_tokens) would take now (0 for formats without them). */
int hr_kv_seq_stage_need(const hr_kv_pool *pool, hr_kv_seq seq, int n_tokens);
/* Tail buffers in all and free now (0 and 0 for formats without them). */
int hr_kv_pool_n_stage(const hr_kv_pool *pool);
int hr_kv_pool_n_stage_free(const hr_kv_pool *pool);

/* Records that tokens [n_computed, n_computed + n) now have K/V written (hr_kv_write was called for
 * each in every layer). Full blocks get their prefix hash and become shareable. */
void hr_kv_seq_commit(hr_kv_pool *pool, hr_kv_seq seq, const int32_t *tokens, int n);

int hr_kv_seq_n_tokens(const hr_kv_pool *pool, hr_kv_seq seq); /* committed tokens */

/* Releases the sequence: full hashed blocks whose refcount drops to 0 go to the prefix cache (LRU),
 * the rest to the free list. */
void hr_kv_seq_free(hr_kv_pool *pool, hr_kv_seq seq);

/* A new sequence sharing all of src's full blocks (and a copy of its partial tail block). */
hr_status hr_kv_seq_fork(hr_kv_pool *pool, hr_kv_seq src, hr_kv_seq *out, hr_error *err);

/* Drops the sequence's blocks but keeps the handle (preemption by recompute); n_tokens becomes 0. */
void hr_kv_seq_reset(hr_kv_pool *pool, hr_kv_seq seq);

/* ---- storage, used by the forward pass --------------------------------------------------------- */

/* Writes one token's K and V for one layer at position pos (the slot must be reserved; the block
 * must not be shared). k, v: [Hkv][D] floats. Each (layer, pos) is written once, in any order and
 * from any thread (distinct (layer, pos) per call); with q4/kivi2 the write that completes a block
 * in a layer encodes it. */
void hr_kv_write(hr_kv_pool *pool, int layer, hr_kv_seq seq, int pos, const float *k, const float *v);

/* For a forward pass that writes and attends on a device itself (the GPU's: its storage's own batch
 * calls, kernels reading block tables): where hr_kv_write(pool, layer, seq, pos) would write, as the
 * physical slot block * block_size + pos % block_size of the layer's group, under the same
 * conditions (reserved, the block not shared); layer's slot in its group's blocks in *slot_layer
 * (NULL allowed). For immediate formats only: with q4/kivi2 use hr_kv_write_slot_stage. */
int32_t hr_kv_write_slot(const hr_kv_pool *pool, int layer, hr_kv_seq seq, int pos, int *slot_layer);
/* The same for any format, with the tail buffer hr_kv_write would name in *stage: formats encoded when
 * a block fills (q4, kivi2) write the token there (the block's stage, which is also the tail stage of
 * a query at n_ctx = pos + 1 when that is not a multiple of block_size: hr_kv_attn_query.tail_stage),
 * the storage encoding the block from it when it fills; -1 for the other formats. The commit that
 * fills the block takes the stage back, as after hr_kv_write. */
int32_t hr_kv_write_slot_stage(const hr_kv_pool *pool, int layer, hr_kv_seq seq, int pos, int *slot_layer,
                               int32_t *stage);
/* Layer's group (whose block tables it reads: hr_kv_seq_table) and its slot among the group's layers in
 * a physical block (the storage's layer index: blocks hold hr_kv_groups.slots layers). One group, every
 * layer its own slot, for a one-kind model. */
void hr_kv_pool_layer_slot(const hr_kv_pool *pool, int layer, int *group, int *slot);
/* seq's block table in layer's group: the physical block ids of its logical blocks in order (-1: a
 * block a policy dropped), *n of them; valid until the pool next changes (reserve, free, swap). */
const int32_t *hr_kv_seq_table(const hr_kv_pool *pool, int layer, hr_kv_seq seq, int *n);
/* What a device forward pass needs of a policy, as data (the GPU's: it walks the tables itself).
 * hr_kv_seq_window: which positions a query at n_ctx of seq sees in layer beyond causality: t < *sinks
 * or t >= *lo (*lo 0: all of [0, n_ctx)), from its policy and the model's sliding window. */
void hr_kv_seq_window(const hr_kv_pool *pool, int layer, hr_kv_seq seq, int n_ctx, int *sinks, int *lo);
/* Token-level policies (h2o, snapkv; their sequences have no window): seq's token masks, NULL for any
 * other sequence. The words for logical blocks [0, *n_blocks) of every layer: bit t % 64 of word
 * ((j * L + layer) * Hkv + kv_head) * *mask_words + t / 64 set = token j * B + t kept (*mask_words =
 * ceil(B / 64)); *score: whether a query at n_ctx adds its softmax weights to the sequence's scores
 * (h2o: always; snapkv: in its observation window), which the caller then gives back through
 * hr_kv_seq_add_scores. Valid until the pool next changes (a commit evicts). */
const uint64_t *hr_kv_seq_token_mask(const hr_kv_pool *pool, hr_kv_seq seq, int n_ctx, int *n_blocks, int *mask_words,
                                     bool *score);
/* Adds weights a device accumulated for seq (the forward pass's, before its commit) to its scores: in the
 * pool's fixed point (2^-32, a weight of 1 = 2^32), w[((j * L + layer) * Hkv + kv_head) * B + t] for
 * logical blocks [0, n_blocks), the masks' layout with B entries in place of the words. The policy then
 * decides from them at the commit as from the CPU's own attention. Nothing for a sequence without
 * token masks. */
void hr_kv_seq_add_scores(hr_kv_pool *pool, hr_kv_seq seq, const uint64_t *w, int n_blocks);

/* out[h][:] = softmax(scale * q[h] . K[0..n_ctx)) . V for each query head h of one token, reading
 * the sequence's blocks in their formats directly (no dequantized copy of the cache). Under a policy
 * (or a model sliding window) only the positions it keeps take part, masked exactly; h2o and snapkv
 * sequences also add each token's softmax weight to its accumulated score (full sequences skip all of
 * this: their path is the same code as before policies). For a query past the context the scratch
 * was sized for, use hr_kv_seq_attention_scratch_floats.
 * q, out: [H][D]; heads map to KV heads by h / (H / Hkv). scratch: at least
 * hr_kv_attention_scratch_floats(pool, n_ctx) floats, private to the calling thread. */
void hr_kv_attention(const hr_kv_pool *pool, int layer, hr_kv_seq seq, int n_ctx, const float *q, int n_heads,
                     float scale, float *out, float *scratch);
/* The same with learned attention sinks (gpt-oss): sinks[h] (n_heads of them, or NULL: hr_kv_attention)
 * joins head h's softmax denominator as a logit no value stands behind (kv_storage.h). */
void hr_kv_attention_sinks(const hr_kv_pool *pool, int layer, hr_kv_seq seq, int n_ctx, const float *q, int n_heads,
                           float scale, const float *sinks, float *out, float *scratch);
/* Only query heads [head_begin, head_end) of it (0 <= head_begin <= head_end <= n_heads), out's other
 * heads untouched: a token's heads shared among threads, each with its own scratch. Each head's
 * result has the bits hr_kv_attention_sinks gives it. */
void hr_kv_attention_heads(const hr_kv_pool *pool, int layer, hr_kv_seq seq, int n_ctx, const float *q, int n_heads,
                           int head_begin, int head_end, float scale, const float *sinks, float *out, float *scratch);
size_t hr_kv_attention_scratch_floats(const hr_kv_pool *pool, int n_ctx);
/* The same for a pool of this config (block_size, head_dim and q_per_kv decide it), before one exists. */
size_t hr_kv_attention_scratch_floats_for(const hr_kv_config *cfg, int n_ctx);

/* ---- eviction policies -------------------------------------------------------------------------
 * A policy bounds what a sequence keeps (docs/POLICIES.md). Positions are logical: a sequence's
 * block table keeps one entry per block of positions, and whole blocks a policy drops leave the
 * table as holes (their block returns to the pool; a full hashed block goes to the prefix cache).
 * Keys stay rotated at their original positions. Attention applies each policy's exact token mask.
 *   full            keep everything (default)
 *   window:W        keep the last W tokens: a query at position p sees positions > p - W
 *   sinks:S,window:W  also keep the first S tokens (StreamingLLM attention sinks)
 *   h2o:B           per layer and KV head: B tokens, the B/2 most recent and the B - B/2 with the
 *                   highest accumulated attention (heavy hitters); per-block token masks
 *   snapkv:B[,window:W]  at the end of prefill keep, per layer and KV head, the last W prompt tokens
 *                   (default 32, at most B/2) and the B - W prompt tokens they attend to most
 *                   (max-pooled over 5 positions); later tokens are all kept
 * A model whose metadata declares a sliding window gets it per layer from hr_kv_pool_set_sliding_window
 * (the forward pass does this); window policies then use the smaller of the two. */
typedef enum hr_kv_policy_kind {
    HR_KV_POLICY_FULL = 0,
    HR_KV_POLICY_WINDOW = 1,
    HR_KV_POLICY_SINKS = 2,
    HR_KV_POLICY_H2O = 3,
    HR_KV_POLICY_SNAPKV = 4,
} hr_kv_policy_kind;

typedef struct hr_kv_policy {
    hr_kv_policy_kind kind;
    int window; /* WINDOW, SINKS: tokens kept at the end; SNAPKV: observation window (0: default) */
    int sinks;  /* SINKS: tokens kept at the start */
    int budget; /* H2O, SNAPKV: tokens kept per layer and KV head */
} hr_kv_policy;

/* Parses "full", "window:256", "sinks:4,window:64", "h2o:128", "snapkv:128", "snapkv:128,window:16".
 * Checks only the syntax and that numbers are positive; hr_kv_policy_check checks a pool can use it.
 * Errors say what is valid. */
hr_status hr_kv_policy_parse(const char *text, hr_kv_policy *out, hr_error *err);
/* The canonical text of a policy ("sinks:4,window:64"); returns buf. */
const char *hr_kv_policy_str(const hr_kv_policy *pol, char *buf, size_t cap);
/* Whether pool can run pol: a window of at least one block, a budget of at least two tokens (and
 * larger than the snapkv window), and, where the model has a sliding window, no h2o/snapkv and, where
 * every layer has one (mistral, not gemma's mix of window and full layers), no window larger than
 * the model's. HR_ERR_INVALID_ARG with a message naming what is valid. */
hr_status hr_kv_policy_check(const hr_kv_pool *pool, const hr_kv_policy *pol, hr_error *err);
/* "full", "window", "sinks", "h2o", "snapkv"; "?" for other values. */
const char *hr_kv_policy_kind_name(hr_kv_policy_kind kind);
/* Positions a policy keeps resident at most (window: W, sinks: S + W), 0 when it does not bound them.
 * A sequence with a bounded policy may run past the context; its claim on the pool is bounded. */
int hr_kv_policy_span(const hr_kv_policy *pol);

/* The model's own sliding window for one layer (layer -1: all layers), 0 = none. Queries in that layer
 * see only positions > p - window; blocks no layer can see again leave the table. Set it before any
 * sequence holds tokens. HR_ERR_INVALID_ARG for a bad layer or a negative window. */
hr_status hr_kv_pool_set_sliding_window(hr_kv_pool *pool, int layer, int window, hr_error *err);
/* The model's attention logit soft-capping (gemma2): every q.k score s, after the scale, becomes
 * cap * tanh(s / cap) before the softmax; 0 (the default) leaves scores as they are. Set it before
 * attention runs. HR_ERR_INVALID_ARG for a negative or non-finite cap. */
hr_status hr_kv_pool_set_attn_softcap(hr_kv_pool *pool, float cap, hr_error *err);
/* The policy every new sequence starts with (initially full). Checked as hr_kv_policy_check. */
hr_status hr_kv_pool_set_default_policy(hr_kv_pool *pool, const hr_kv_policy *pol, hr_error *err);
/* Sets a sequence's policy (per request). Allowed while nothing of the sequence has been evicted (a
 * fresh sequence, or one that only took a shared prefix); reset keeps the policy. Checked as
 * hr_kv_policy_check; HR_ERR_NOMEM when h2o/snapkv bookkeeping cannot be allocated. */
hr_status hr_kv_seq_set_policy(hr_kv_pool *pool, hr_kv_seq seq, const hr_kv_policy *pol, hr_error *err);
hr_kv_policy hr_kv_seq_policy(const hr_kv_pool *pool, hr_kv_seq seq);
/* snapkv: the prompt has n_prompt tokens; its last `window` queries are observed and the cache is
 * compressed by the commit that reaches n_prompt. Without this call the prompt is taken to end where
 * the first hr_kv_seq_reserve of the sequence ends (a prompt prefilled in one chunk). */
void hr_kv_seq_set_prompt_len(hr_kv_pool *pool, hr_kv_seq seq, int n_prompt);
/* Attention scratch (floats) a query of seq at n_ctx needs under its policy: at most
 * hr_kv_attention_scratch_floats(pool, n_ctx); for window/sinks bounded by the window whatever the
 * position (so a sequence may run past the context the scratch was sized for). */
size_t hr_kv_seq_attention_scratch_floats(const hr_kv_pool *pool, hr_kv_seq seq, int n_ctx);

/* ---- swap tier ---------------------------------------------------------------------------------
 * A second, slower tier (a file for the CPU backend) where a preempted sequence's blocks can wait
 * instead of being recomputed. It has its own byte budget, fixed at create: the file is divided into
 * slots of one block each (hr_kv_block_bytes); a block's f16 tail buffer (q4/kivi2) takes further
 * slots. Swapping out copies the sequence's blocks to the tier and releases them from the pool
 * (shared blocks stay for their other holders; full hashed blocks stay in the prefix cache);
 * swapping in allocates fresh blocks and copies them back bit for bit. A swapped-out sequence keeps
 * its handle and token count; it can be freed or reset (its slots return to the tier) but not
 * reserved, written, forked or attended until it is swapped in. One thread (the pool's owner) calls
 * these. Destroy the swap tier after the sequences in it are swapped in or freed. */

typedef struct hr_kv_swap hr_kv_swap;

typedef struct hr_kv_swap_config {
    const char *path;      /* file to create (truncated; removed at destroy); NULL: an anonymous temp file,
                              or the storage's host memory where it gives some (a GPU's pinned memory:
                              hr_kv_storage_ops.host_alloc) */
    uint64_t budget_bytes; /* the tier gets floor(budget / block bytes) slots */
} hr_kv_swap_config;

typedef struct hr_kv_swap_ledger {
    int slots_total, slots_used;
    uint64_t bytes_total, bytes_used;
    uint64_t blocks_out_total, blocks_in_total; /* blocks copied out / back since create */
} hr_kv_swap_ledger;

/* HR_ERR_BUDGET when the budget holds no slot (the message says what one slot takes); HR_ERR_IO when
 * the file cannot be created or sized. */
hr_status hr_kv_swap_create(const hr_kv_pool *pool, const hr_kv_swap_config *cfg, hr_kv_swap **out, hr_error *err);
void hr_kv_swap_destroy(hr_kv_swap *swap); /* NULL allowed */
void hr_kv_swap_get_ledger(const hr_kv_swap *swap, hr_kv_swap_ledger *out);

/* Moves seq's blocks to the tier. HR_ERR_FULL when the tier lacks free slots now, HR_ERR_BUDGET when
 * it could never hold them, HR_ERR_IO on a write error; on any error nothing changed. */
hr_status hr_kv_seq_swap_out(hr_kv_pool *pool, hr_kv_swap *swap, hr_kv_seq seq, hr_error *err);
/* Brings them back. HR_ERR_FULL when the pool lacks free blocks (or tail buffers) now, HR_ERR_IO on a
 * read error; on any error nothing changed. */
hr_status hr_kv_seq_swap_in(hr_kv_pool *pool, hr_kv_seq seq, hr_error *err);
bool hr_kv_seq_is_swapped(const hr_kv_pool *pool, hr_kv_seq seq);

/* ---- ledger ------------------------------------------------------------------------------------ */

/* Blocks and bytes held by the groups of one layer kind. */
typedef struct hr_kv_kind_bytes {
    int window;   /* the kind: 0 full, > 0 a sliding window */
    int n_layers; /* layers of the kind */
    int blocks;   /* blocks its groups hold (pool: in use) */
    uint64_t bytes;
    bool latent;          /* a latent cache's layers (hr_kv_kind_info.latent) */
    uint64_t token_bytes; /* one token in every layer of the kind */
} hr_kv_kind_bytes;

typedef struct hr_kv_seq_ledger {
    int blocks_own;     /* blocks only this sequence holds */
    int blocks_shared;  /* blocks held together with other sequences or the prefix cache */
    uint64_t bytes_now; /* bytes of the blocks it holds */
    uint64_t bytes_peak;
    int tokens_resident; /* committed tokens in the pool, less those its policy evicted */
    int tokens_total;
    hr_kv_format k_format, v_format;
    uint64_t bytes_swapped; /* bytes of this sequence now in the swap tier */
    int prefix_hit_tokens;  /* tokens whose K/V came from the prefix cache */
    hr_kv_policy policy;
    int tokens_evicted;  /* committed tokens no later query can see in any layer and KV head */
    int blocks_evicted;  /* blocks the policy took out of the table over the sequence's life */
    int tokens_kept_max; /* the most committed tokens the next query sees in one layer and KV head
                          * (window:W keeps W - 1 of them besides the query itself; h2o:B keeps B) */
    /* by layer kind (hr_kv_groups.kinds; one entry for a one-kind model): what this sequence holds */
    int n_kinds;
    hr_kv_kind_bytes kinds[HR_KV_MAX_KINDS];
    int blocks_window_freed; /* blocks its window groups gave back as it grew (several groups only) */
} hr_kv_seq_ledger;

typedef struct hr_kv_pool_ledger {
    int blocks_total, blocks_used, blocks_cached, blocks_free;
    uint64_t bytes_total, bytes_used, bytes_cached, bytes_free;
    uint64_t waste_slots; /* slots in used blocks not yet filled */
    uint64_t waste_bytes;
    uint64_t prefix_hit_tokens_total;
    uint64_t blocks_evicted_total;        /* cached blocks reclaimed for new work */
    uint64_t bytes_swapped;               /* bytes of this pool's sequences now in swap tiers */
    uint64_t policy_blocks_evicted_total; /* blocks sequences' policies took out of their tables */
    uint64_t fetched_tokens_total;        /* prefix tokens whose K/V came from the observer's fetch */
    int n_groups;                         /* layer groups (1: a one-kind model) */
    int n_kinds;
    hr_kv_kind_bytes kinds[HR_KV_MAX_KINDS]; /* blocks in use by kind */
    uint64_t window_blocks_freed_total;      /* blocks window groups gave back (several groups only) */
} hr_kv_pool_ledger;

hr_status hr_kv_seq_get_ledger(const hr_kv_pool *pool, hr_kv_seq seq, hr_kv_seq_ledger *out, hr_error *err);
void hr_kv_pool_get_ledger(const hr_kv_pool *pool, hr_kv_pool_ledger *out);

/* The distinct blocks the resident sequences among seqs[0..n) hold together (swapped sequences and
 * policy holes hold none): a block two of them share counts once. Blocks are only ever shared at the
 * same logical position (prefix sharing and fork both keep positions), so the count compares table
 * entries index by index: O(n^2 * blocks). Invalid ids are skipped. Owning thread. */
int hr_kv_seqs_distinct_blocks(const hr_kv_pool *pool, const hr_kv_seq *seqs, int n);

/* ---- prefix-cache observer ----------------------------------------------------------------------
 * Lets a caller mirror the prefix cache (KV events) or back it with a shared tier (a remote store)
 * without the KV layer knowing how. All callbacks run on the thread that changed the pool (the engine
 * thread), inside the pool call, so they must be quick or bounded in time; the only pool call they may
 * make is hr_kv_pool_read_block.
 *   stored:  a full block's hash entered the prefix map (it became shareable): computed and committed,
 *            swapped back in, or fetched (b->fetched).
 *   removed: a hash left the map (the block was reclaimed for new work); group: its layer group, as
 *            stored gave it (0 on a one-group pool).
 *   fetch:   (optional) hr_kv_seq_share_prefix found no local block for b: fill out (n_bytes, the
 *            block's bytes as hr_kv_pool_read_block gives them) with that block's K/V and return true,
 *            or return false (then the prefix stops there and the rest is computed). The pool trusts
 *            what it gets: the callback checks identity and integrity. */
typedef struct hr_kv_block_info {
    uint64_t hash;         /* the block's chain hash (covers its parent, its tokens, formats and shape) */
    bool has_parent;       /* false for a sequence's first block (its parent is the pool's root) */
    uint64_t parent;       /* the previous block's hash */
    const int32_t *tokens; /* block_size ids, borrowed for the call */
    int block_size;
    bool fetched; /* stored: the bytes came from fetch, not from this process's forward pass */
    int group;    /* the layer group (0 on a one-group pool); a hybrid pool reports each group's blocks
                     with that group's hashes (hash and parent), so each group is a chain of its own */
} hr_kv_block_info;

typedef struct hr_kv_observer {
    void (*stored)(void *ctx, const hr_kv_block_info *b);
    void (*removed)(void *ctx, uint64_t hash, int group);
    bool (*fetch)(void *ctx, const hr_kv_block_info *b, void *out, uint64_t n_bytes);
    void *ctx;
} hr_kv_observer;

/* Sets the observer (copied; NULL removes it). Call while no other thread uses the pool (before the
 * engine starts). Blocks already in the map are not reported. HR_ERR_NOMEM when the fetch buffer (one
 * block) cannot be allocated (then nothing changed). */
hr_status hr_kv_pool_set_observer(hr_kv_pool *pool, const hr_kv_observer *obs, hr_error *err);

/* The hashes of every block now in the prefix map (running or cached): writes up to cap of them to
 * out and returns how many there are. For tests and checks; O(map size). */
int hr_kv_pool_prefix_hashes(const hr_kv_pool *pool, uint64_t *out, int cap);

/* Copies the K/V of the block with this hash in the prefix map into out: every layer's K block then
 * V block, hr_kv_block_bytes bytes in all. False when no block has the hash or cap is too small. */
bool hr_kv_pool_read_block(const hr_kv_pool *pool, uint64_t hash, void *out, uint64_t cap);

/* Verifies invariants 1-3 over the whole pool. HR_ERR_INTERNAL with a message naming the first
 * violation. O(blocks + table entries). */
hr_status hr_kv_pool_check(const hr_kv_pool *pool, hr_error *err);

#endif

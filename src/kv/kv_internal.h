/* kv_internal.h: the pool's private structures, shared by the files of src/kv/ only.
 *
 * Storage layout (why): for every layer there is a K arena and a V arena, each an array of blocks
 * indexed by physical block id. Inside a block the data is head-major: [Hkv][B tokens][D] in the
 * block's format, followed (per head) by that head's scales. One query head's q.K over a block then
 * streams one contiguous run of B*D elements plus its scales, and the P.V accumulation streams the
 * same way; GQA query heads that share a KV head read the same run while it is hot in cache.
 * Every head region starts on a 64-byte boundary, every block too.
 *
 * Formats that quantize per channel over a whole block (Q4, KIVI2: "deferred") cannot encode a block
 * until all of its tokens are written. Such a block gets an f16 staging slot ("tail buffer",
 * [L][K|V][Hkv][B][D]) when it is reserved, from a fixed set allocated at create. Writes go to the
 * slot; a per-(block, layer) atomic count of written slots lets the write that completes a block
 * encode it, whichever thread and order the writes come in. Attention reads a block from its slot
 * while the block is partial for that query, and encoded once full, so a query's result depends
 * only on n_ctx and the data, not on chunking or batch. The slot returns at commit of the block's
 * last token (or when the block is released). */
#ifndef HR_KV_KV_INTERNAL_H
#define HR_KV_KV_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kv/kv.h"

#ifndef HR_DEBUG_CHECKS
#define HR_DEBUG_CHECKS 0
#endif

/* Invariant checks that are compiled in only for debug (sanitizer) builds. */
#if HR_DEBUG_CHECKS
#include <assert.h>
#define KV_ASSERT(c) assert(c)
#else
#define KV_ASSERT(c) ((void)0)
#endif

/* ---- f16 / bf16 (private copies; tensor/ owns the public ones) ---------------------------------- */

static inline uint32_t kv_f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float kv_u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float kv_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    if (em >= 0x7c00u) return kv_u2f(sign | 0x7f800000u | ((em & 0x3ffu) << 13));
    if (em >= 0x0400u) return kv_u2f(sign | ((em << 13) + 0x38000000u));
    return kv_u2f(sign | kv_f2u((float)em * 5.9604644775390625e-8f)); /* subnormal: em * 2^-24 */
}

/* Round to nearest even; overflow gives inf, NaN stays NaN. */
static inline uint16_t kv_f32_to_f16(float f) {
    uint32_t x = kv_f2u(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) return (uint16_t)(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (x < 0x38800000u) { /* below 2^-14: f16 subnormal, the FPU rounds when adding 0.5 */
        float v = kv_u2f(x) + 0.5f;
        return (uint16_t)(sign | (kv_f2u(v) - 0x3f000000u));
    }
    uint32_t odd = (x >> 13) & 1u;
    x += 0xc8000fffu + odd; /* rebias exponent (-112 << 23) and round */
    return (uint16_t)(sign | (x >> 13));
}

static inline float kv_bf16_to_f32(uint16_t h) { return kv_u2f((uint32_t)h << 16); }
static inline uint16_t kv_f32_to_bf16(float f) {
    uint32_t x = kv_f2u(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* e4m3 (OCP FP8, no infinities, max 448): placing the 7 magnitude bits at f32 bit 20 reads them as
 * an f32 with bias 127; multiplying by 2^120 rebiases to 7 and is exact for subnormals too. */
static inline float kv_e4m3_to_f32(uint8_t b) {
    float v = kv_u2f((uint32_t)(b & 0x7fu) << 20) * 0x1p120f;
    return (b & 0x80u) ? -v : v;
}
uint8_t kv_f32_to_e4m3(float x); /* round to nearest even, saturating at 448 */

/* ---- formats --------------------------------------------------------------------------------- */

enum { KV_K = 0, KV_V = 1 };

/* One format in one role (K or V) at one shape. Offsets are within a head region. */
typedef struct kv_fmt {
    hr_kv_format format;
    int role;         /* KV_K or KV_V */
    int B, D;         /* tokens per block, head_dim */
    int G;            /* group size for per-token group scales (Q8, Q4-V, KIVI2-V, Q4H) */
    int bits;         /* code bits for Q4 / KIVI2 / Q4H */
    bool deferred;    /* encoded when the block fills (Q4, KIVI2) */
    bool per_channel; /* K of Q4/KIVI2: scale and min per channel over the block's tokens */
    bool rotate;      /* K of Q4H: keys are stored Hadamard-rotated; attention passes dot a rotated q */
    bool sym;         /* Q4H test variant: symmetric codes (min fixed at -8 * scale) */
    size_t code_off;  /* where the element codes start */
    size_t scale_off; /* where the scales start */
    size_t head_bytes;
} kv_fmt;

/* Kernels for one format in one role. `head` points at a head region of one block.
 *   enc_token: encode token t (x: D floats). NULL for deferred formats.
 *   enc_block: encode a whole staged block (stage: [B][D] f16). NULL for immediate formats.
 *   dot:       scores[t] = q . k_t for t < n. row: D floats of private scratch.
 *   accum:     acc[:] += sum_t p[t] * v_t for t < n (acc: D floats). */
typedef struct kv_fmt_ops {
    void (*enc_token)(const kv_fmt *f, uint8_t *head, int t, const float *x);
    void (*enc_block)(const kv_fmt *f, uint8_t *head, const uint16_t *stage);
    void (*dot)(const kv_fmt *f, const uint8_t *head, int n, const float *q, float *row, float *scores);
    void (*accum)(const kv_fmt *f, const uint8_t *head, int n, const float *p, float *acc);
} kv_fmt_ops;

/* x <- H x / sqrt(n), the normalized Walsh-Hadamard transform (orthogonal and its own inverse); n a
 * power of two. Butterflies in a fixed order, so every caller gets the same bits. */
void kv_hadamard(float *x, int n);

/* Fills f for a format/role/shape. HR_ERR_INVALID_ARG when the head size cannot use the format. */
hr_status kv_fmt_init(kv_fmt *f, hr_kv_format format, int role, int B, int D, hr_error *err);
void kv_fmt_ops_ref(const kv_fmt *f, kv_fmt_ops *ops);
/* Overwrites entries that have an AVX2 version. Only call where the CPU has AVX2+FMA+F16C. */
void kv_fmt_ops_avx2(const kv_fmt *f, kv_fmt_ops *ops);

/* s[t] = exp(scale * s[t] - max), returns the sum; the reduction order depends only on n. */
float kv_softmax_ref(float *s, int n, float scale);
float kv_softmax_avx2(float *s, int n, float scale);
#define KV_MAX_HEAD_DIM 1024 /* what hr_kv_pool_create accepts */

/* x[t] = f16(x[t] * scale) (round to nearest even), kept as f32; the same bits on both paths. */
void kv_scale_round_f16_ref(float *x, int n, float scale);
void kv_scale_round_f16_avx2(float *x, int n, float scale);

/* ---- pool ------------------------------------------------------------------------------------ */

enum { KV_BLK_FREE = 0, KV_BLK_USED = 1, KV_BLK_CACHED = 2 };
enum { KV_FLAG_HASHED = 1, KV_FLAG_IN_MAP = 2 };

typedef struct kv_list {
    int32_t head, tail; /* -1 when empty */
    int count;
} kv_list;

typedef struct kv_seq {
    bool active;
    bool swapped;
    int n_tokens;       /* committed tokens */
    int n_table;        /* blocks in the table */
    int cap;            /* allocated table entries */
    int32_t *table;     /* physical block ids, logical order */
    uint64_t last_hash; /* chain hash of the last full committed block (or the root) */
    uint64_t scope;     /* cache scope mixed into every chain link (0: shared); kept across reset */
    uint64_t bytes_peak;
    int prefix_hit_tokens;
    /* swap tier (swap.c) */
    struct hr_kv_swap *swap; /* the tier holding the swapped copy, while swapped */
    struct kv_swap_rec *rec; /* what is there and how to restore it */
    uint64_t bytes_swapped;
    /* eviction policy (policy*.c). Logical block j covers positions [j*B, (j+1)*B); a block the
     * policy dropped stays in the table as a hole (-1). */
    hr_kv_policy pol;
    int n_holes;        /* table entries that are -1 */
    int blocks_evicted; /* blocks the policy dropped over the sequence's life (kept across reset) */
    int evict_from;     /* window: blocks in [sink blocks, evict_from) are already holes */
    int reserve_end;    /* where the first reserve ended: snapkv's prompt end when none was set */
    int prompt_len;     /* snapkv: hr_kv_seq_set_prompt_len, 0 = unknown */
    bool snap_done;     /* snapkv: the prompt was compressed */
    /* h2o / snapkv bookkeeping, per logical block (metadata outside the budget) */
    int meta_cap, meta_n;        /* blocks allocated / initialized */
    uint64_t *mask;              /* [meta_cap][L][Hkv][MW]: bit t set = token t kept */
    atomic_uint_fast64_t *score; /* [meta_cap][L][Hkv][B]: softmax weight received, fixed point 2^-32 */
} kv_seq;

struct hr_kv_pool {
    hr_kv_config cfg;
    int n_blocks;
    kv_fmt kf, vf, sf; /* sf: F16 at the same shape, to read staged blocks */
    kv_fmt_ops kops, vops, sops;
    float (*softmax)(float *s, int n, float scale);
    void (*scale_round_f16)(float *x, int n, float scale);
    bool avx2;

    size_t k_block_bytes, v_block_bytes; /* one layer, one block */
    uint64_t block_bytes;                /* all layers, K + V */
    uint8_t *arena;                      /* [L][K blocks | V blocks], then staging */
    size_t arena_bytes;
    uint8_t *stage;            /* [n_stage][L][K|V][Hkv][B][D] f16; NULL without deferred formats */
    size_t stage_layer_bytes;  /* one slot, one layer, K and V */
    uint64_t stage_slot_bytes; /* one slot, all layers */
    int n_stage, n_stage_free;
    int32_t *stage_free;   /* stack of free slot ids */
    int32_t *blk_stage;    /* [n_blocks]: the block's staging slot, -1 none */
    atomic_ushort *filled; /* [n_blocks][L]: slots written in the block (deferred formats) */

    /* block metadata, indexed by physical id */
    int32_t *refcnt;
    uint8_t *state, *flags;
    uint64_t *hash, *parent;
    int32_t *tokens; /* [n_blocks][B]: the tokens a hashed block was filled with */
    int32_t *prev, *next;
    kv_list free_list, lru;

    /* prefix map: open addressing, linear probing, hash -> block id */
    int32_t *map;
    uint64_t map_mask;

    kv_seq *seqs;
    int32_t *pending; /* [max_seqs][B]: tokens of each sequence's open block */

    hr_kv_observer obs; /* prefix-map changes, reported to the caller (stored/removed may be NULL) */
    uint8_t *fetch_buf; /* block_bytes: what obs.fetch fills (allocated when it is set) */
    bool fetching;      /* the block entering the map now came from obs.fetch */

    /* policies */
    hr_kv_policy default_pol; /* what hr_kv_seq_create gives a sequence */
    int32_t *native_window;   /* [L]: the model's sliding window per layer, 0 = none */
    float attn_softcap;       /* the model's score soft-capping (hr_kv_pool_set_attn_softcap), 0 = none */

    /* ledger figures readable from any thread */
    atomic_int n_used, n_cached, n_free;
    atomic_uint_fast64_t waste_slots, prefix_hits, evicted, bytes_swapped, policy_evicted, fetched_tokens;
};

static inline uint8_t *kv_block_ptr(const hr_kv_pool *p, int layer, int kind, int32_t block) {
    size_t layer_bytes = (size_t)p->n_blocks * (p->k_block_bytes + p->v_block_bytes);
    size_t off = (size_t)layer * layer_bytes;
    if (kind == KV_V) off += (size_t)p->n_blocks * p->k_block_bytes;
    off += (size_t)block * (kind == KV_K ? p->k_block_bytes : p->v_block_bytes);
    return p->arena + off;
}

static inline uint16_t *kv_stage_ptr(const hr_kv_pool *p, int32_t slot, int layer, int kind) {
    size_t half = p->stage_layer_bytes / 2;
    return (uint16_t *)(p->stage + (size_t)slot * p->stage_slot_bytes + (size_t)layer * p->stage_layer_bytes +
                        (size_t)kind * half);
}

static inline bool kv_fmt_deferred(hr_kv_format f) { return f == HR_KV_Q4 || f == HR_KV_KIVI2; }

/* prefix.c */
bool kv_prefix_map_init(hr_kv_pool *p);
uint64_t kv_prefix_map_slots(int n_blocks); /* the map's capacity for n_blocks (load under 1/2) */
uint64_t kv_prefix_root(const hr_kv_pool *p);
void kv_prefix_map_remove(hr_kv_pool *p, int32_t b);
void kv_prefix_map_add(hr_kv_pool *p, int32_t b); /* b's hash is set; inserts unless present */
int32_t kv_prefix_map_find(const hr_kv_pool *p, uint64_t hash);

/* swap.c: forgets a swapped-out sequence's copy (its slots return to the swap tier). */
void kv_swap_drop(hr_kv_pool *p, kv_seq *s);

/* ---- policies (policy.c, policy_window.c, policy_h2o.c, policy_snapkv.c) -----------------------
 * The interface one policy implements: `check` validates its parameters against a pool, and
 * `after_commit` runs when a commit leaves the sequence at n_tokens: it drops what no later query
 * can see (holes for whole blocks, mask bits for tokens). Attention reads the result through
 * kv_layer_window / kv_policy_sinks (window-like policies) or the masks (token-level ones). */
typedef struct kv_policy_ops {
    hr_kv_policy_kind kind;
    const char *name;
    bool token_level; /* keeps per-block masks and scores */
    hr_status (*check)(const hr_kv_pool *p, const hr_kv_policy *pol, hr_error *err);
    void (*after_commit)(hr_kv_pool *p, kv_seq *s);
} kv_policy_ops;

extern const kv_policy_ops kv_pol_full, kv_pol_window, kv_pol_sinks, kv_pol_h2o, kv_pol_snapkv;
const kv_policy_ops *kv_policy_ops_of(hr_kv_policy_kind k);

static inline int kv_mask_words(const hr_kv_pool *p) { return (p->cfg.block_size + 63) / 64; }
static inline size_t kv_meta_index(const hr_kv_pool *p, int j, int layer, int kh) {
    return ((size_t)j * p->cfg.n_layers + (size_t)layer) * p->cfg.n_kv_heads + (size_t)kh;
}
static inline bool kv_token_level(const kv_seq *s) {
    return s->pol.kind == HR_KV_POLICY_H2O || s->pol.kind == HR_KV_POLICY_SNAPKV;
}
/* The tokens a query in `layer` sees at the end (0 = all): the policy's window and the model's own,
 * the smaller where both exist. */
static inline int kv_layer_window(const hr_kv_pool *p, const kv_seq *s, int layer) {
    int w = (s->pol.kind == HR_KV_POLICY_WINDOW || s->pol.kind == HR_KV_POLICY_SINKS) ? s->pol.window : 0;
    int n = p->native_window[layer];
    return (w > 0 && n > 0) ? (w < n ? w : n) : (w > 0 ? w : n);
}
static inline int kv_policy_sinks(const kv_seq *s) { return s->pol.kind == HR_KV_POLICY_SINKS ? s->pol.sinks : 0; }
/* snapkv: where the prompt ends (0 unknown) and the observation window. */
static inline int kv_snap_end(const kv_seq *s) { return s->prompt_len > 0 ? s->prompt_len : s->reserve_end; }
int kv_snap_window(const hr_kv_policy *pol);

/* Runs the sequence's policy after a commit (prefix.c). */
void kv_policy_after_commit(hr_kv_pool *p, kv_seq *s);
/* Makes the mask/score arrays cover n blocks, initializing new ones (all kept, zero score). */
hr_status kv_policy_meta_grow(hr_kv_pool *p, kv_seq *s, int n, hr_error *err);
/* Takes logical block j out of the table (a hole): unref, counters. */
void kv_policy_drop_block(hr_kv_pool *p, kv_seq *s, int j);
/* Drops every resident block of [0, n_tokens / B) whose tokens are all masked in every layer/head. */
void kv_policy_drop_masked_blocks(hr_kv_pool *p, kv_seq *s);
/* Keeps, for each (layer, KV head), the k tokens of [0, end) with the highest key among those still
 * kept (ties: the later position); clears the others' mask bits. key[pos] for each position. */
void kv_policy_keep_top(hr_kv_pool *p, kv_seq *s, int layer, int kh, int end, int k, const uint64_t *key);
/* ledger figures (ledger.c) */
void kv_policy_ledger(const hr_kv_pool *p, const kv_seq *s, hr_kv_seq_ledger *l);

/* pool.c helpers used by prefix.c and swap.c */
void kv_block_ref(hr_kv_pool *p, int32_t b);
void kv_block_release(hr_kv_pool *p, int32_t b); /* one table less holds b */
bool kv_deferred(const hr_kv_pool *p);
void kv_stage_release(hr_kv_pool *p, int32_t b); /* returns b's staging slot, if any */
int32_t kv_stage_take(hr_kv_pool *p, int32_t b); /* gives b a slot (one must be free) */
void kv_seq_release_blocks(hr_kv_pool *p, kv_seq *s);
int32_t kv_block_alloc(hr_kv_pool *p); /* -1 when none; caller checked availability */
hr_status kv_table_reserve(kv_seq *s, int n, hr_error *err);
bool kv_seq_valid(const hr_kv_pool *p, hr_kv_seq seq);
void kv_update_peak(hr_kv_pool *p, kv_seq *s);

#endif

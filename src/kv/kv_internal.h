/* kv_internal.h: the KV manager's private structures, shared by the files of src/kv/ only.
 *
 * The manager holds no block bytes: the pool's blocks, their formats' kernels and attention live in a
 * KV storage (kv_storage.h; the CPU's in backend/cpu/), which the pool creates for its budget and
 * reaches only through the storage's ops. What stays here is bookkeeping: block states and lists,
 * reference counts, the prefix map and each hashed block's tokens, block tables, which tail buffer
 * (q4/kivi2 "stage") each block being filled holds, policies' masks and scores, the ledger.
 *
 * Tail buffers (why): formats that quantize per channel over a whole block (Q4, KIVI2: "deferred")
 * cannot encode a block until all of its tokens are written, so such a block gets an f16 tail buffer
 * when it is reserved, from a fixed set the storage holds; the manager hands them out (stage_free,
 * blk_stage), names the block's buffer in every write, and takes it back at the commit of the
 * block's last token (or when the block is released). */
#ifndef HR_KV_KV_INTERNAL_H
#define HR_KV_KV_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "common/util.h"
#include "kv/kv.h"
#include "kv/kv_assert.h"
#include "kv/kv_storage.h"

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
    int n_table;        /* blocks in each group's table (every group covers the same positions) */
    int cap;            /* allocated entries per group */
    int32_t *table;     /* [n_groups][cap]: physical block ids, logical order (kv_tab: group g's row;
                           group 0 first, so one-group code reads s->table as before) */
    int32_t *ghole;     /* several groups: [n_groups] holes per group, then [n_groups] evict_from per
                           group; NULL for one group (n_holes and evict_from are the group's) */
    int window_freed;   /* blocks window groups dropped over the sequence's life (several groups) */
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
    int n_holes;        /* table entries that are -1 (all groups) */
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
    kv_fmt kf, vf, sf;         /* layouts of K, V and an f16 tail buffer's head region */
    hr_kv_storage *st;         /* the bytes: blocks and tail buffers (owned) */
    hr_kv_groups lay;          /* layer groups (kv.h); one group: the one-table pool */
    int n_groups;              /* lay.n_groups */
    int32_t *layer_gs;         /* [L][2]: each layer's group and slot in the group's blocks; then [L]: the
                                  config's windows, which cfg.layer_window points at */
    int8_t *blk_group;         /* [n_blocks]: the group whose tables hold a used block */
    uint64_t block_bytes;      /* one block, G = lay.slots layers, K + V: what read_block gives */
    uint64_t stage_slot_bytes; /* one tail buffer, all layers (0 without deferred formats) */
    int n_stage, n_stage_free; /* tail buffers: 0 and 0 without deferred formats */
    int32_t *stage_free;       /* stack of free tail buffer ids */
    int32_t *blk_stage;        /* [n_blocks]: the block's tail buffer, -1 none */

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
    atomic_int kind_used[HR_KV_MAX_KINDS];
    atomic_uint_fast64_t window_freed;
};

/* Group g's row of a sequence's block table. */
static inline int32_t *kv_tab(const kv_seq *s, int g) { return s->table + (size_t)g * (size_t)s->cap; }
/* Holes in group g's row, and where its window eviction goes on from. */
static inline int kv_holes(const kv_seq *s, int g) { return s->ghole ? s->ghole[g] : s->n_holes; }
static inline int *kv_evict_from(const hr_kv_pool *p, kv_seq *s, int g) {
    return s->ghole ? &s->ghole[p->n_groups + g] : &s->evict_from;
}

/* ---- the files of kv/, in dependency order (each calls only files above it; see kv.h) ----------- */

/* map.c: the prefix map (hash -> block) and the chains' root */
bool kv_prefix_map_init(hr_kv_pool *p);
uint64_t kv_prefix_map_slots(int n_blocks); /* the map's capacity for n_blocks (load under 1/2) */
uint64_t kv_prefix_root(const hr_kv_pool *p);
/* Group g's hash of the block whose token chain is h: group 0 keeps the chain itself (a one-group
 * pool's hashes, events and remote keys are as they always were); the others mix their index in, so
 * a group shares only with the same group of another sequence, and a KV event names group + contents. */
static inline uint64_t kv_group_hash(uint64_t h, int g) {
    return g == 0 ? h : hr_mix64(h ^ (0x67726f7570000000ull + (uint64_t)g));
}
void kv_prefix_map_remove(hr_kv_pool *p, int32_t b);
void kv_prefix_map_add(hr_kv_pool *p, int32_t b); /* b's hash is set; inserts unless present */
int32_t kv_prefix_map_find(const hr_kv_pool *p, uint64_t hash);

/* block.c: block states, lists, tail buffers, block tables */
void kv_blocks_init(hr_kv_pool *p);               /* at create: every block free */
int32_t kv_block_alloc(hr_kv_pool *p, int group); /* -1 when none; caller checked availability */
void kv_block_ref(hr_kv_pool *p, int32_t b);
void kv_block_release(hr_kv_pool *p, int32_t b); /* one table less holds b */
bool kv_deferred(const hr_kv_pool *p);           /* the formats use tail buffers */
void kv_stage_release(hr_kv_pool *p, int32_t b); /* returns b's tail buffer, if any */
int32_t kv_stage_take(hr_kv_pool *p, int32_t b); /* gives b a tail buffer (one must be free) */
bool kv_seq_valid(const hr_kv_pool *p, hr_kv_seq seq);
/* A block table's capacity for n entries: it grows by doubling from 8 (kv_table_reserve; the budget's
 * hr_kv_seq_table_bytes counts the same). */
static inline int kv_table_cap(int n) {
    int cap = 8;
    while (cap < n) cap *= 2;
    return cap;
}
/* Makes every group's row hold n entries (rows move when the capacity grows). */
hr_status kv_table_reserve(const hr_kv_pool *p, kv_seq *s, int n, hr_error *err);
void kv_update_peak(hr_kv_pool *p, kv_seq *s);
void kv_seq_release_blocks(hr_kv_pool *p, kv_seq *s);

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
/* Query heads attention takes together (hr_kv_config.q_per_kv, 1..HR_KV_ATTN_GROUP). */
static inline int kv_attn_group(const hr_kv_config *c) {
    return c->q_per_kv < 1 ? 1 : c->q_per_kv > HR_KV_ATTN_GROUP ? HR_KV_ATTN_GROUP : c->q_per_kv;
}
static inline int kv_policy_sinks(const kv_seq *s) { return s->pol.kind == HR_KV_POLICY_SINKS ? s->pol.sinks : 0; }
/* snapkv: where the prompt ends (0 unknown) and the observation window. */
static inline int kv_snap_end(const kv_seq *s) { return s->prompt_len > 0 ? s->prompt_len : s->reserve_end; }

/* evict.c: what policies do to a sequence */
/* snapkv's observation window */
int kv_snap_window(const hr_kv_policy *pol);
/* Makes the mask/score arrays cover n blocks, initializing new ones (all kept, zero score). */
hr_status kv_policy_meta_grow(hr_kv_pool *p, kv_seq *s, int n, hr_error *err);
/* Takes logical block j out of the table (a hole): unref, counters. */
void kv_policy_drop_block(hr_kv_pool *p, kv_seq *s, int j);
/* The same in group g's row; `policy` false for a window group of a hybrid pool (the model's own
 * window freeing memory, not an eviction: counted apart, the tokens stay visible to full layers). */
void kv_group_drop_block(hr_kv_pool *p, kv_seq *s, int g, int j, bool policy);
/* The window and sinks group g keeps for s (0 window: everything): the widest kv_layer_window of its
 * layers (all of one kind, so the same unless a policy window applies), and whether block j is kept
 * once the sequence holds n_tokens (what window eviction leaves; share_prefix asks the same). */
int kv_group_window(const hr_kv_pool *p, const kv_seq *s, int g);
bool kv_group_keeps(const hr_kv_pool *p, const kv_seq *s, int g, int j, int n_tokens);
/* Drops every resident block of [0, n_tokens / B) whose tokens are all masked in every layer/head. */
void kv_policy_drop_masked_blocks(hr_kv_pool *p, kv_seq *s);
/* Keeps, for each (layer, KV head), the k tokens of [0, end) with the highest key among those still
 * kept (ties: the later position); clears the others' mask bits. key[pos] for each position. */
void kv_policy_keep_top(hr_kv_pool *p, kv_seq *s, int layer, int kh, int end, int k, const uint64_t *key);

/* policy_window.c, policy_h2o.c, policy_snapkv.c: kv_pol_window, kv_pol_sinks, kv_pol_h2o, kv_pol_snapkv */

/* policy.c: the registry and dispatch */
/* Runs the sequence's policy after a commit (prefix.c). */
void kv_policy_after_commit(hr_kv_pool *p, kv_seq *s);
/* the ledger's policy figures (ledger.c) */
void kv_policy_ledger(const hr_kv_pool *p, const kv_seq *s, hr_kv_seq_ledger *l);

/* swap.c: forgets a swapped-out sequence's copy (its slots return to the swap tier). */
void kv_swap_drop(hr_kv_pool *p, kv_seq *s);

/* prefix.c, pool.c, attend.c, ledger.c: only the public API (kv.h) */

#endif

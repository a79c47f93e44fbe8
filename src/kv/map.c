/* map.c: the prefix map: hash -> block id for every full hashed block that can be shared (held by a
 * sequence or cached), open addressing with linear probing and backward-shift deletion, and the root
 * of every hash chain. Entering and leaving the map is what the pool's observer hears (stored,
 * removed). Bookkeeping only: no block bytes. */
#include <stdlib.h>

#include "common/util.h"
#include "kv/kv_internal.h"

uint64_t kv_prefix_root(const hr_kv_pool *p) {
    const hr_kv_config *c = &p->cfg;
    uint64_t h = 0x6b765f726f6f7431ull; /* "kv_root1" */
    h = hr_mix64(h ^ ((uint64_t)c->k_format | (uint64_t)c->v_format << 8 | (uint64_t)c->block_size << 16));
    h = hr_mix64(h ^ ((uint64_t)c->n_layers | (uint64_t)c->n_kv_heads << 16 | (uint64_t)c->head_dim << 32));
    return h;
}

/* ---- map: open addressing with linear probing and backward-shift deletion ------------------------ */

uint64_t kv_prefix_map_slots(int n_blocks) {
    uint64_t cap = 16;
    while (cap < (uint64_t)n_blocks * 2) cap *= 2;
    return cap;
}

bool kv_prefix_map_init(hr_kv_pool *p) {
    uint64_t cap = kv_prefix_map_slots(p->n_blocks);
    p->map = malloc(cap * sizeof *p->map);
    if (!p->map) return false;
    for (uint64_t i = 0; i < cap; i++) p->map[i] = -1;
    p->map_mask = cap - 1;
    return true;
}

int32_t kv_prefix_map_find(const hr_kv_pool *p, uint64_t hash) {
    for (uint64_t i = hash & p->map_mask;; i = (i + 1) & p->map_mask) {
        int32_t b = p->map[i];
        if (b < 0) return -1;
        if (p->hash[b] == hash) return b;
    }
}

static void kv_prefix_map_insert(hr_kv_pool *p, int32_t b) {
    uint64_t i = p->hash[b] & p->map_mask;
    while (p->map[i] >= 0) i = (i + 1) & p->map_mask;
    p->map[i] = b;
    p->flags[b] |= KV_FLAG_IN_MAP;
    if (p->obs.stored) {
        /* a hybrid pool reports every group's blocks: group g's hash and its parent's in group g (the
         * parent link is the token chain's; kv_group_hash maps it), so each group is a chain of its own */
        int g = p->n_groups > 1 ? p->blk_group[b] : 0;
        bool has_parent = p->parent[b] != kv_prefix_root(p);
        hr_kv_block_info bi = {.hash = p->hash[b],
                               .has_parent = has_parent,
                               .parent = has_parent ? kv_group_hash(p->parent[b], g) : p->parent[b],
                               .tokens = p->tokens + (size_t)b * p->cfg.block_size,
                               .block_size = p->cfg.block_size,
                               .fetched = p->fetching,
                               .group = g};
        p->obs.stored(p->obs.ctx, &bi);
    }
}

void kv_prefix_map_add(hr_kv_pool *p, int32_t b) {
    if (kv_prefix_map_find(p, p->hash[b]) < 0) kv_prefix_map_insert(p, b);
}

void kv_prefix_map_remove(hr_kv_pool *p, int32_t b) {
    uint64_t i = p->hash[b] & p->map_mask;
    while (p->map[i] != b) {
        KV_ASSERT(p->map[i] >= 0);
        i = (i + 1) & p->map_mask;
    }
    /* backward shift: move later entries of the probe run into the hole when their home allows */
    uint64_t j = i;
    for (;;) {
        j = (j + 1) & p->map_mask;
        int32_t e = p->map[j];
        if (e < 0) break;
        uint64_t home = p->hash[e] & p->map_mask;
        bool movable = (i <= j) ? (home <= i || home > j) : (home <= i && home > j);
        if (movable) {
            p->map[i] = e;
            i = j;
        }
    }
    p->map[i] = -1;
    p->flags[b] &= (uint8_t)~KV_FLAG_IN_MAP;
    if (p->obs.removed) /* group g's own hash and g (stored's): the block keeps its group until reallocated */
        p->obs.removed(p->obs.ctx, p->hash[b], p->n_groups > 1 ? p->blk_group[b] : 0);
}

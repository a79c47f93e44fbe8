/* block.c: block states, the free list and the LRU of cached blocks, reference counts, the tail
 * buffers handed to blocks being filled, and the block-table helpers every sequence operation uses.
 *
 * Block states and the functions behind each transition:
 *
 *            kv_block_alloc                    kv_block_release (refcount -> 0, not hashed)
 *     FREE -----------------> USED (refcnt >= 1) ---------------------------------------> FREE
 *       ^                      |  ^
 *       |  kv_block_alloc      |  | share_prefix / fork (refcnt++), share_prefix takes a
 *       |  evicts LRU head     |  | CACHED block back to USED
 *       |                      v  |
 *       +----------------- CACHED (refcnt 0, hash in the prefix map, in the LRU)
 *                kv_block_release (refcount -> 0, hashed)
 *
 * Invariants (see kv.h): free + used + cached == total; refcnt == number of tables holding a block;
 * only USED blocks are in tables; CACHED blocks are exactly the LRU list and are all in the map.
 * Allocation takes never-hashed FREE blocks first and evicts the least recently used CACHED block
 * only when none is left. A sequence's blocks are released last-to-first, so a freed sequence's tail
 * blocks are evicted before its head blocks (heads are the ones other prompts share). Eviction
 * policies release single blocks from the middle of a table the same way and leave a hole (-1):
 * every walk over a table skips holes. Bookkeeping only: a block's bytes are the storage's. */
#include <stdlib.h>

#include "kv/kv_internal.h"

/* ---- lists --------------------------------------------------------------------------------------- */

static void kv_list_push_tail(hr_kv_pool *p, kv_list *l, int32_t b) {
    p->prev[b] = l->tail;
    p->next[b] = -1;
    if (l->tail >= 0)
        p->next[l->tail] = b;
    else
        l->head = b;
    l->tail = b;
    l->count++;
}

static void kv_list_remove(hr_kv_pool *p, kv_list *l, int32_t b) {
    if (p->prev[b] >= 0)
        p->next[p->prev[b]] = p->next[b];
    else
        l->head = p->next[b];
    if (p->next[b] >= 0)
        p->prev[p->next[b]] = p->prev[b];
    else
        l->tail = p->prev[b];
    p->prev[b] = p->next[b] = -1;
    l->count--;
}

/* Every block free (in id order), no tail buffer held, every tail buffer free; counters to match. */
void kv_blocks_init(hr_kv_pool *p) {
    p->free_list = (kv_list){-1, -1, 0};
    p->lru = (kv_list){-1, -1, 0};
    for (int b = 0; b < p->n_blocks; b++) {
        kv_list_push_tail(p, &p->free_list, b);
        p->blk_stage[b] = -1;
    }
    for (int i = p->n_stage - 1; i >= 0; i--) p->stage_free[p->n_stage_free++] = i;
    atomic_init(&p->n_free, p->n_blocks);
    atomic_init(&p->n_used, 0);
    atomic_init(&p->n_cached, 0);
}

/* ---- blocks -------------------------------------------------------------------------------------- */

int32_t kv_block_alloc(hr_kv_pool *p, int group) {
    int32_t b = p->free_list.head;
    if (b >= 0) {
        kv_list_remove(p, &p->free_list, b);
        atomic_fetch_sub_explicit(&p->n_free, 1, memory_order_relaxed);
    } else {
        b = p->lru.head;
        if (b < 0) return -1;
        kv_list_remove(p, &p->lru, b);
        kv_prefix_map_remove(p, b);
        atomic_fetch_sub_explicit(&p->n_cached, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->evicted, 1, memory_order_relaxed);
    }
    p->state[b] = KV_BLK_USED;
    p->refcnt[b] = 1;
    p->flags[b] = 0;
    p->blk_group[b] = (int8_t)group;
    atomic_fetch_add_explicit(&p->n_used, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->kind_used[p->lay.group_kind[group]], 1, memory_order_relaxed);
    return b;
}

bool kv_deferred(const hr_kv_pool *p) { return p->n_stage > 0; }

int32_t kv_stage_take(hr_kv_pool *p, int32_t b) {
    KV_ASSERT(p->n_stage_free > 0 && p->blk_stage[b] < 0);
    int32_t slot = p->stage_free[--p->n_stage_free];
    p->blk_stage[b] = slot;
    p->st->ops->stage_reset(p->st, slot); /* no slot of the block written yet */
    return slot;
}

void kv_stage_release(hr_kv_pool *p, int32_t b) {
    if (!kv_deferred(p) || p->blk_stage[b] < 0) return;
    p->stage_free[p->n_stage_free++] = p->blk_stage[b];
    p->blk_stage[b] = -1;
}

/* One more table holds b (b is USED or CACHED). */
void kv_block_ref(hr_kv_pool *p, int32_t b) {
    if (p->state[b] == KV_BLK_CACHED) {
        kv_list_remove(p, &p->lru, b);
        p->state[b] = KV_BLK_USED;
        atomic_fetch_sub_explicit(&p->n_cached, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->n_used, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->kind_used[p->lay.group_kind[p->blk_group[b]]], 1, memory_order_relaxed);
    }
    KV_ASSERT(p->state[b] == KV_BLK_USED);
    p->refcnt[b]++;
}

void kv_block_release(hr_kv_pool *p, int32_t b) {
    KV_ASSERT(p->state[b] == KV_BLK_USED && p->refcnt[b] > 0);
    if (--p->refcnt[b] > 0) return;
    kv_stage_release(p, b);
    atomic_fetch_sub_explicit(&p->n_used, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&p->kind_used[p->lay.group_kind[p->blk_group[b]]], 1, memory_order_relaxed);
    if (p->flags[b] & KV_FLAG_IN_MAP) {
        p->state[b] = KV_BLK_CACHED;
        kv_list_push_tail(p, &p->lru, b);
        atomic_fetch_add_explicit(&p->n_cached, 1, memory_order_relaxed);
    } else {
        p->state[b] = KV_BLK_FREE;
        p->flags[b] = 0;
        kv_list_push_tail(p, &p->free_list, b);
        atomic_fetch_add_explicit(&p->n_free, 1, memory_order_relaxed);
    }
}

int hr_kv_pool_n_free(const hr_kv_pool *p) {
    return atomic_load_explicit(&p->n_free, memory_order_relaxed) +
           atomic_load_explicit(&p->n_cached, memory_order_relaxed);
}

/* ---- block tables ---------------------------------------------------------------------------- */

bool kv_seq_valid(const hr_kv_pool *p, hr_kv_seq seq) {
    return p && seq >= 0 && seq < p->cfg.max_seqs && p->seqs[seq].active;
}

hr_status kv_table_reserve(const hr_kv_pool *p, kv_seq *s, int n, hr_error *err) {
    if (n <= s->cap) return HR_OK;
    int cap = kv_table_cap(n), NG = p->n_groups; /* s->cap is a smaller capacity of the same series */
    int32_t *t = realloc(s->table, (size_t)cap * (size_t)NG * sizeof *t);
    if (!t) return hr_error_set(err, HR_ERR_NOMEM, "KV: out of memory growing a block table to %d entries", cap);
    /* group rows move to their new stride, last first (the rows only move up) */
    for (int g = NG - 1; g > 0; g--)
        memmove(t + (size_t)g * cap, t + (size_t)g * s->cap, (size_t)s->n_table * sizeof *t);
    s->table = t;
    s->cap = cap;
    return HR_OK;
}

void kv_update_peak(hr_kv_pool *p, kv_seq *s) {
    uint64_t now = ((uint64_t)s->n_table * (uint64_t)p->n_groups - (uint64_t)s->n_holes) * p->block_bytes;
    if (now > s->bytes_peak) s->bytes_peak = now;
}

/* Drops every block of the table (last to first, group by group) and the waste they carried. */
void kv_seq_release_blocks(hr_kv_pool *p, kv_seq *s) {
    int B = p->cfg.block_size;
    uint64_t waste = (uint64_t)s->n_table * B - (uint64_t)s->n_tokens;
    if (s->n_table > 0) atomic_fetch_sub_explicit(&p->waste_slots, waste, memory_order_relaxed);
    for (int g = 0; g < p->n_groups; g++) {
        const int32_t *t = kv_tab(s, g);
        for (int i = s->n_table - 1; i >= 0; i--)
            if (t[i] >= 0) kv_block_release(p, t[i]);
    }
    s->n_table = 0;
    s->n_holes = 0;
    s->evict_from = 0;
    if (s->ghole) memset(s->ghole, 0, 2 * (size_t)p->n_groups * sizeof *s->ghole);
}

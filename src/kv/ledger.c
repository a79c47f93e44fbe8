/* ledger.c: the accounting views of the pool (per pool, per sequence) and the invariant checker.
 *
 * Pool figures are kept incrementally in atomics by the owning thread (block.c, prefix.c, swap.c...) and
 * may be read from any thread; a sequence's figures are computed from its block table on request
 * (O(blocks it holds)) by the owning thread. */
#include <stdlib.h>
#include <string.h>

#include "kv/kv_internal.h"

void hr_kv_pool_get_ledger(const hr_kv_pool *p, hr_kv_pool_ledger *out) {
    memset(out, 0, sizeof *out);
    out->blocks_total = p->n_blocks;
    out->blocks_used = atomic_load_explicit(&p->n_used, memory_order_relaxed);
    out->blocks_cached = atomic_load_explicit(&p->n_cached, memory_order_relaxed);
    out->blocks_free = atomic_load_explicit(&p->n_free, memory_order_relaxed);
    out->bytes_total = (uint64_t)p->n_blocks * p->block_bytes;
    out->bytes_used = (uint64_t)out->blocks_used * p->block_bytes;
    out->bytes_cached = (uint64_t)out->blocks_cached * p->block_bytes;
    out->bytes_free = (uint64_t)out->blocks_free * p->block_bytes;
    out->waste_slots = atomic_load_explicit(&p->waste_slots, memory_order_relaxed);
    /* a slot reserved and not filled is one in every group's block */
    out->waste_bytes = out->waste_slots * (p->block_bytes / (uint64_t)p->cfg.block_size) * (uint64_t)p->n_groups;
    out->prefix_hit_tokens_total = atomic_load_explicit(&p->prefix_hits, memory_order_relaxed);
    out->blocks_evicted_total = atomic_load_explicit(&p->evicted, memory_order_relaxed);
    out->bytes_swapped = atomic_load_explicit(&p->bytes_swapped, memory_order_relaxed);
    out->policy_blocks_evicted_total = atomic_load_explicit(&p->policy_evicted, memory_order_relaxed);
    out->fetched_tokens_total = atomic_load_explicit(&p->fetched_tokens, memory_order_relaxed);
    out->n_groups = p->n_groups;
    out->n_kinds = p->lay.n_kinds;
    for (int k = 0; k < p->lay.n_kinds; k++) {
        int used = atomic_load_explicit(&p->kind_used[k], memory_order_relaxed);
        out->kinds[k] = (hr_kv_kind_bytes){.window = p->lay.kinds[k].window,
                                           .n_layers = p->lay.kinds[k].n_layers,
                                           .blocks = used,
                                           .bytes = (uint64_t)used * p->block_bytes,
                                           .latent = p->lay.kinds[k].latent,
                                           .token_bytes = p->lay.kinds[k].token_bytes};
    }
    out->window_blocks_freed_total = atomic_load_explicit(&p->window_freed, memory_order_relaxed);
}

hr_status hr_kv_seq_get_ledger(const hr_kv_pool *p, hr_kv_seq seq, hr_kv_seq_ledger *out, hr_error *err) {
    if (!kv_seq_valid(p, seq)) return hr_error_set(err, HR_ERR_INVALID_ARG, "KV ledger: %d is not a sequence", seq);
    const kv_seq *s = &p->seqs[seq];
    hr_kv_seq_ledger l;
    memset(&l, 0, sizeof l);
    l.n_kinds = p->lay.n_kinds;
    for (int k = 0; k < p->lay.n_kinds; k++) {
        l.kinds[k].window = p->lay.kinds[k].window;
        l.kinds[k].n_layers = p->lay.kinds[k].n_layers;
        l.kinds[k].latent = p->lay.kinds[k].latent;
        l.kinds[k].token_bytes = p->lay.kinds[k].token_bytes;
    }
    for (int g = 0; g < p->n_groups; g++) {
        const int32_t *t = kv_tab(s, g);
        hr_kv_kind_bytes *kb = &l.kinds[p->lay.group_kind[g]];
        for (int i = 0; i < s->n_table; i++) {
            int32_t b = t[i];
            if (b < 0) continue; /* a block its policy (or its window group) dropped */
            kb->blocks++;
            kb->bytes += p->block_bytes;
            /* shared: another table holds it, or it is the prefix cache's copy another prompt may take */
            if (p->refcnt[b] > 1 || ((p->flags[b] & KV_FLAG_IN_MAP) && i * p->cfg.block_size < s->prefix_hit_tokens))
                l.blocks_shared++;
            else
                l.blocks_own++;
        }
    }
    l.bytes_now = ((uint64_t)s->n_table * (uint64_t)p->n_groups - (uint64_t)s->n_holes) * p->block_bytes;
    l.bytes_peak = s->bytes_peak > l.bytes_now ? s->bytes_peak : l.bytes_now;
    l.blocks_window_freed = s->window_freed;
    l.tokens_total = s->n_tokens;
    l.tokens_resident = s->swapped ? 0 : s->n_tokens;
    l.k_format = p->cfg.k_format;
    l.v_format = p->cfg.v_format;
    l.bytes_swapped = s->bytes_swapped;
    l.prefix_hit_tokens = s->prefix_hit_tokens;
    kv_policy_ledger(p, s, &l);
    if (!s->swapped) l.tokens_resident = s->n_tokens - l.tokens_evicted;
    *out = l;
    return HR_OK;
}

int hr_kv_seqs_distinct_blocks(const hr_kv_pool *p, const hr_kv_seq *seqs, int n) {
    int count = 0;
    for (int j = 0; j < n; j++) {
        if (!kv_seq_valid(p, seqs[j]) || p->seqs[seqs[j]].swapped) continue;
        const kv_seq *s = &p->seqs[seqs[j]];
        for (int g = 0; g < p->n_groups; g++)
            for (int t = 0; t < s->n_table; t++) {
                int32_t b = kv_tab(s, g)[t];
                bool seen = b < 0;
                for (int i = 0; i < j && !seen; i++) {
                    if (!kv_seq_valid(p, seqs[i]) || p->seqs[seqs[i]].swapped) continue;
                    const kv_seq *o = &p->seqs[seqs[i]];
                    seen = t < o->n_table && kv_tab(o, g)[t] == b;
                }
                count += !seen;
            }
    }
    return count;
}

hr_status hr_kv_pool_check(const hr_kv_pool *p, hr_error *err) {
    int n = p->n_blocks, B = p->cfg.block_size;
    int n_free = 0, n_used = 0, n_cached = 0;
    for (int b = 0; b < n; b++) {
        switch (p->state[b]) {
        case KV_BLK_FREE: n_free++; break;
        case KV_BLK_USED: n_used++; break;
        case KV_BLK_CACHED: n_cached++; break;
        default: return hr_error_set(err, HR_ERR_INTERNAL, "KV check: block %d has state %d", b, p->state[b]);
        }
    }
    if (n_free + n_used + n_cached != n)
        return hr_error_set(err, HR_ERR_INTERNAL, "KV check: free %d + used %d + cached %d != total %d", n_free, n_used,
                            n_cached, n);
    if (n_free != atomic_load(&p->n_free) || n_used != atomic_load(&p->n_used) || n_cached != atomic_load(&p->n_cached))
        return hr_error_set(err, HR_ERR_INTERNAL,
                            "KV check: counted free/used/cached %d/%d/%d but the ledger says %d/%d/%d", n_free, n_used,
                            n_cached, atomic_load(&p->n_free), atomic_load(&p->n_used), atomic_load(&p->n_cached));
    if (p->free_list.count != n_free || p->lru.count != n_cached)
        return hr_error_set(err, HR_ERR_INTERNAL, "KV check: free list %d (want %d), LRU %d (want %d)",
                            p->free_list.count, n_free, p->lru.count, n_cached);
    int walked = 0;
    for (int32_t b = p->free_list.head; b >= 0 && walked <= n; b = p->next[b], walked++)
        if (p->state[b] != KV_BLK_FREE || p->flags[b] != 0)
            return hr_error_set(err, HR_ERR_INTERNAL, "KV check: block %d on the free list is not free", b);
    if (walked != n_free)
        return hr_error_set(err, HR_ERR_INTERNAL, "KV check: free list walk %d != %d", walked, n_free);
    walked = 0;
    for (int32_t b = p->lru.head; b >= 0 && walked <= n; b = p->next[b], walked++)
        if (p->state[b] != KV_BLK_CACHED || !(p->flags[b] & KV_FLAG_IN_MAP))
            return hr_error_set(err, HR_ERR_INTERNAL, "KV check: block %d in the LRU is not a cached block", b);
    if (walked != n_cached) return hr_error_set(err, HR_ERR_INTERNAL, "KV check: LRU walk %d != %d", walked, n_cached);

    int32_t *held = calloc((size_t)n, sizeof *held);
    if (!held) return hr_error_set(err, HR_ERR_NOMEM, "KV check: out of memory");
    hr_status rc = HR_OK;
    uint64_t waste = 0;
    for (int si = 0; si < p->cfg.max_seqs && rc == HR_OK; si++) {
        const kv_seq *s = &p->seqs[si];
        if (!s->active) continue;
        if (s->n_tokens > s->n_table * B && !s->swapped)
            rc = hr_error_set(err, HR_ERR_INTERNAL, "KV check: seq %d has %d tokens in %d blocks", si, s->n_tokens,
                              s->n_table);
        waste += (uint64_t)s->n_table * B - (uint64_t)(s->swapped ? 0 : s->n_tokens);
        int holes = 0;
        for (int g = 0; g < p->n_groups && rc == HR_OK; g++) {
            const int32_t *t = kv_tab(s, g);
            int g_holes = 0;
            for (int i = 0; i < s->n_table && rc == HR_OK; i++) {
                int32_t b = t[i];
                if (b == -1 && (i + 1) * B <= s->n_tokens) { /* a block its policy dropped: only full ones */
                    holes++;
                    g_holes++;
                    continue;
                }
                if (b < 0 || b >= n) {
                    rc = hr_error_set(err, HR_ERR_INTERNAL, "KV check: seq %d group %d entry %d holds bad block %d", si,
                                      g, i, b);
                    break;
                }
                held[b]++;
                bool full = (i + 1) * B <= s->n_tokens;
                if (p->blk_group[b] != g)
                    rc = hr_error_set(err, HR_ERR_INTERNAL,
                                      "KV check: seq %d group %d entry %d holds block %d of group %d", si, g, i, b,
                                      p->blk_group[b]);
                else if (!full && (p->flags[b] & KV_FLAG_HASHED))
                    rc = hr_error_set(err, HR_ERR_INTERNAL,
                                      "KV check: seq %d block %d (group %d entry %d) is not full but hashed", si, b, g,
                                      i);
                else if (full && !(p->flags[b] & KV_FLAG_HASHED))
                    rc =
                        hr_error_set(err, HR_ERR_INTERNAL,
                                     "KV check: seq %d block %d (group %d entry %d) is full but unhashed", si, b, g, i);
            }
            /* a window group's holes are exactly the blocks its window no longer sees; a full group has
             * none (several groups, no policy: one group's holes are a policy's, checked above) */
            if (rc == HR_OK && s->ghole && g_holes != s->ghole[g])
                rc = hr_error_set(err, HR_ERR_INTERNAL, "KV check: seq %d group %d has %d holes but counts %d", si, g,
                                  g_holes, s->ghole[g]);
            if (rc == HR_OK && p->n_groups > 1 && s->pol.kind == HR_KV_POLICY_FULL && !s->swapped)
                for (int i = 0; i < s->n_table && i * B < s->n_tokens && rc == HR_OK; i++)
                    if ((t[i] < 0) == kv_group_keeps(p, s, g, i, s->n_tokens))
                        rc = hr_error_set(err, HR_ERR_INTERNAL,
                                          "KV check: seq %d group %d entry %d is %s but its window %s it at %d tokens",
                                          si, g, i, t[i] < 0 ? "a hole" : "held",
                                          t[i] < 0 ? "still sees" : "no longer sees", s->n_tokens);
        }
        if (rc == HR_OK && holes != s->n_holes)
            rc = hr_error_set(err, HR_ERR_INTERNAL, "KV check: seq %d has %d holes but counts %d", si, holes,
                              s->n_holes);
    }
    for (int b = 0; b < n && rc == HR_OK; b++) {
        if (held[b] != p->refcnt[b])
            rc = hr_error_set(err, HR_ERR_INTERNAL, "KV check: block %d has refcount %d but %d tables hold it", b,
                              p->refcnt[b], held[b]);
        else if ((p->refcnt[b] > 0) != (p->state[b] == KV_BLK_USED))
            rc = hr_error_set(err, HR_ERR_INTERNAL, "KV check: block %d refcount %d in state %d", b, p->refcnt[b],
                              p->state[b]);
        else if ((p->flags[b] & KV_FLAG_IN_MAP) && kv_prefix_map_find(p, p->hash[b]) != b)
            rc = hr_error_set(err, HR_ERR_INTERNAL, "KV check: block %d is marked in the map but not found", b);
        else if ((p->flags[b] & KV_FLAG_IN_MAP) && !(p->flags[b] & KV_FLAG_HASHED))
            rc = hr_error_set(err, HR_ERR_INTERNAL, "KV check: block %d is in the map without a hash", b);
    }
    int kind_used[HR_KV_MAX_KINDS] = {0}; /* invariant 5: the blocks in use by kind */
    for (int b = 0; b < n; b++)
        if (p->state[b] == KV_BLK_USED) kind_used[p->lay.group_kind[p->blk_group[b]]]++;
    for (int k = 0; k < p->lay.n_kinds && rc == HR_OK; k++)
        if (kind_used[k] != atomic_load(&p->kind_used[k]))
            rc = hr_error_set(err, HR_ERR_INTERNAL, "KV check: kind %d has %d blocks in use but the ledger says %d", k,
                              kind_used[k], atomic_load(&p->kind_used[k]));
    int staged = 0;
    for (int b = 0; b < n && rc == HR_OK && kv_deferred(p); b++) {
        if (p->blk_stage[b] < 0) continue;
        staged++;
        if (p->state[b] != KV_BLK_USED || (p->flags[b] & KV_FLAG_HASHED))
            rc =
                hr_error_set(err, HR_ERR_INTERNAL, "KV check: block %d holds a tail buffer but is not being filled", b);
    }
    if (rc == HR_OK && staged + p->n_stage_free != p->n_stage)
        rc = hr_error_set(err, HR_ERR_INTERNAL, "KV check: %d tail buffers held + %d free != %d", staged,
                          p->n_stage_free, p->n_stage);
    free(held);
    if (rc == HR_OK && waste != atomic_load(&p->waste_slots))
        rc = hr_error_set(err, HR_ERR_INTERNAL, "KV check: waste slots %llu, ledger %llu", (unsigned long long)waste,
                          (unsigned long long)atomic_load(&p->waste_slots));
    return rc;
}

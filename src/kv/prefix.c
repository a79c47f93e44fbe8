/* prefix.c: the prefix cache: chain hashes of full blocks, commit (which makes full blocks
 * shareable: into map.c's hash -> block map) and share_prefix (which reuses them, or fetches the next
 * ones through the observer: the remote tier), and the whole-block read the remote tier stores. The
 * bytes of a fetched or read block go through the storage (write_block, read_block).
 *
 * A full block's identity is hash(parent block's hash, its B tokens, block_size, K format, V format),
 * chained from a root that also covers the shape, so equal hashes mean equal prefixes (and the map
 * also compares the parent hash and the tokens before sharing, so a 64-bit collision cannot share the
 * wrong data). A sequence's cache scope (hr_kv_seq_set_scope: a tenant) is mixed into every link
 * of its chain, so two scopes never produce the same hash and never share or report each other's
 * blocks; scope 0 is the shared default and leaves the hashes as they were. Only full committed blocks are hashed; a
 * partial block is never in the map and is never shared, so a shared block is never written. When two sequences compute
 * the same block independently, the first one committed stays in the map; the other is an ordinary private block. */
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "kv/kv_internal.h"

static uint64_t kv_chain(uint64_t parent, uint64_t scope, const int32_t *tokens, int B) {
    uint64_t h = hr_mix64(parent ^ 0x9e3779b97f4a7c15ull ^ scope);
    for (int i = 0; i < B; i++) h = hr_mix64(h ^ ((uint64_t)(uint32_t)tokens[i] + 0x9e3779b97f4a7c15ull * (i + 1)));
    return h;
}

hr_status hr_kv_pool_set_observer(hr_kv_pool *p, const hr_kv_observer *obs, hr_error *err) {
    if (obs && obs->fetch && !p->fetch_buf) {
        p->fetch_buf = malloc(p->block_bytes);
        if (!p->fetch_buf)
            return hr_error_set(err, HR_ERR_NOMEM, "KV: out of memory for a %llu-byte fetch buffer",
                                (unsigned long long)p->block_bytes);
    }
    if (obs)
        p->obs = *obs;
    else
        memset(&p->obs, 0, sizeof p->obs);
    return HR_OK;
}

bool hr_kv_pool_read_block(const hr_kv_pool *p, uint64_t hash, void *out, uint64_t cap) {
    int32_t b = kv_prefix_map_find(p, hash);
    if (b < 0 || cap < p->block_bytes) return false;
    p->st->ops->read_block(p->st, b, out);
    return true;
}

/* After the local run (a one-group pool; kv_fetch_groups does a hybrid one): asks obs.fetch for the
 * following full blocks of tokens, one at a time, and appends each one it fills to s as a hashed,
 * shared-in-the-map block. Stops at the first miss, at a
 * hash the map already holds for other tokens, or when no block is free. Returns blocks appended. */
static int kv_fetch_more(hr_kv_pool *p, kv_seq *s, const int32_t *tokens, int from, int max_blocks) {
    int B = p->cfg.block_size, n = 0;
    if (!p->obs.fetch || !p->fetch_buf || s->pol.kind != HR_KV_POLICY_FULL || p->n_groups > 1) return 0;
    uint64_t root = kv_prefix_root(p), h = s->last_hash;
    for (int i = from; i < max_blocks; i++) {
        const int32_t *tk = tokens + (size_t)i * B;
        uint64_t nh = kv_chain(h, s->scope, tk, B);
        if (kv_prefix_map_find(p, nh) >= 0) break; /* same hash, other parent or tokens: a collision */
        if (p->free_list.count + p->lru.count == 0) break;
        hr_kv_block_info bi = {.hash = nh, .has_parent = h != root, .parent = h, .tokens = tk, .block_size = B};
        if (!p->obs.fetch(p->obs.ctx, &bi, p->fetch_buf, p->block_bytes)) break;
        if (kv_table_reserve(p, s, s->n_table + 1, NULL) != HR_OK) break;
        int32_t b = kv_block_alloc(p, 0);
        if (b < 0) break;
        p->st->ops->write_block(p->st, b, p->fetch_buf);
        p->parent[b] = h;
        p->hash[b] = nh;
        memcpy(p->tokens + (size_t)b * B, tk, (size_t)B * sizeof *tk);
        p->flags[b] |= KV_FLAG_HASHED;
        p->fetching = true;
        kv_prefix_map_add(p, b);
        p->fetching = false;
        s->table[s->n_table++] = b;
        s->last_hash = h = nh;
        s->n_tokens += B;
        n++;
    }
    return n;
}

int hr_kv_pool_prefix_hashes(const hr_kv_pool *p, uint64_t *out, int cap) {
    int n = 0;
    for (uint64_t i = 0; i <= p->map_mask; i++) {
        int32_t b = p->map[i];
        if (b < 0) continue;
        if (n < cap) out[n] = p->hash[b];
        n++;
    }
    return n;
}

/* ---- commit / share ------------------------------------------------------------------------------ */

void hr_kv_seq_commit(hr_kv_pool *p, hr_kv_seq seq, const int32_t *tokens, int n) {
    if (!kv_seq_valid(p, seq) || n <= 0) return;
    kv_seq *s = &p->seqs[seq];
    int B = p->cfg.block_size;
    int32_t *pend = p->pending + (size_t)seq * B;
    KV_ASSERT(!s->swapped && (int64_t)s->n_tokens + n <= (int64_t)s->n_table * B);
    for (int i = 0; i < n; i++) {
        pend[s->n_tokens % B] = tokens[i];
        s->n_tokens++;
        if (s->n_tokens % B != 0) continue;
        uint64_t h = kv_chain(s->last_hash, s->scope, pend, B);
        for (int g = 0; g < p->n_groups; g++) {
            int32_t b = kv_tab(s, g)[s->n_tokens / B - 1];
            KV_ASSERT(b >= 0 && p->refcnt[b] == 1 && p->flags[b] == 0);
#if HR_DEBUG_CHECKS
            for (int l = 0; kv_deferred(p) && l < p->lay.slots; l++) /* every layer slot written */
                KV_ASSERT(p->blk_stage[b] >= 0 && p->st->ops->stage_filled(p->st, p->blk_stage[b], l) == B);
#endif
            kv_stage_release(p, b);      /* encoded: the tail buffer is not needed any more */
            p->parent[b] = s->last_hash; /* the token chain's previous link, whatever the group */
            p->hash[b] = kv_group_hash(h, g);
            memcpy(p->tokens + (size_t)b * B, pend, (size_t)B * sizeof *pend);
            p->flags[b] |= KV_FLAG_HASHED;
            kv_prefix_map_add(p, b);
        }
        s->last_hash = h;
    }
    atomic_fetch_sub_explicit(&p->waste_slots, (uint64_t)n, memory_order_relaxed);
    kv_policy_after_commit(p, s); /* the policy drops what no later query can see */
}

hr_status hr_kv_seq_set_scope(hr_kv_pool *p, hr_kv_seq seq, uint64_t scope, hr_error *err) {
    if (!kv_seq_valid(p, seq)) return hr_error_set(err, HR_ERR_INVALID_ARG, "KV set_scope: %d is not a sequence", seq);
    kv_seq *s = &p->seqs[seq];
    if (s->n_tokens != 0 || s->n_table != 0 || s->swapped)
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "KV set_scope: sequence %d already holds %d tokens; the scope is set before any", seq,
                            s->n_tokens);
    s->scope = scope;
    return HR_OK;
}

/* Group g's block of chain hash h whose parent link is `parent` and tokens tk, or -1. */
static int32_t kv_group_find(const hr_kv_pool *p, int g, uint64_t h, uint64_t parent, const int32_t *tk) {
    int B = p->cfg.block_size;
    int32_t b = kv_prefix_map_find(p, kv_group_hash(h, g));
    if (b < 0 || p->parent[b] != parent || memcmp(p->tokens + (size_t)b * B, tk, (size_t)B * sizeof *tk) != 0)
        return -1;
    return b;
}

/* Holds group g's block j of the chain ch (ch[j + 1]: the chain after block j) for the fetch pass: the
 * map's (one more reference), or one obs.fetch fills into a new block of group g, entered in the map
 * with its allocation's reference. Appends it to held; false when neither (then nothing changed). */
static bool kv_fetch_hold(hr_kv_pool *p, int g, const int32_t *tokens, const uint64_t *ch, int j, int32_t *held,
                          int *n_held, int *n_fetched) {
    int B = p->cfg.block_size;
    const int32_t *tk = tokens + (size_t)j * B;
    int32_t b = kv_group_find(p, g, ch[j + 1], ch[j], tk);
    if (b >= 0) {
        kv_block_ref(p, b);
        held[(*n_held)++] = b;
        return true;
    }
    uint64_t gh = kv_group_hash(ch[j + 1], g);
    if (kv_prefix_map_find(p, gh) >= 0) return false; /* same hash, other parent or tokens: a collision */
    if (p->free_list.count + p->lru.count == 0) return false;
    bool has_parent = ch[j] != kv_prefix_root(p);
    hr_kv_block_info bi = {.hash = gh,
                           .has_parent = has_parent,
                           .parent = has_parent ? kv_group_hash(ch[j], g) : ch[j],
                           .tokens = tk,
                           .block_size = B,
                           .group = g};
    if (!p->obs.fetch(p->obs.ctx, &bi, p->fetch_buf, p->block_bytes)) return false;
    if ((b = kv_block_alloc(p, g)) < 0) return false;
    p->st->ops->write_block(p->st, b, p->fetch_buf);
    p->parent[b] = ch[j]; /* the token chain's link, as commit sets it */
    p->hash[b] = gh;
    memcpy(p->tokens + (size_t)b * B, tk, (size_t)B * sizeof *tk);
    p->flags[b] |= KV_FLAG_HASHED;
    p->fetching = true;
    kv_prefix_map_add(p, b);
    p->fetching = false;
    held[(*n_held)++] = b;
    (*n_fetched)++;
    return true;
}

/* The shared tier on a hybrid pool (obs.fetch): before kv_share_groups plans, the blocks its plan will
 * look for and the map lacks are fetched, each into a block of its own group: every full group's
 * blocks from the first up to the first one neither the map nor the tier has (the run R), then each
 * window group's blocks its window keeps at R blocks (the others stay holes: never fetched). What is
 * found or fetched is held until the end, so a fetch's allocation never evicts a block of this very
 * prefix; then it goes back to the cache, where the plan finds it. Returns the first block index that
 * came from the tier (max_blocks when none). */
static int kv_fetch_groups(hr_kv_pool *p, kv_seq *s, const int32_t *tokens, const uint64_t *ch, int max_blocks) {
    if (!p->obs.fetch || !p->fetch_buf || s->pol.kind != HR_KV_POLICY_FULL || max_blocks <= 0) return max_blocks;
    int B = p->cfg.block_size, NG = p->n_groups, n_held = 0, n_fetched = 0, first = max_blocks, run = 0;
    int32_t *held = malloc((size_t)max_blocks * (size_t)NG * sizeof *held);
    if (!held) return max_blocks; /* no room to plan fetches: the local hit only */
    for (bool ok = true; ok && run < max_blocks; run += ok) {
        int before = n_fetched;
        for (int g = 0; g < NG && ok; g++)
            if (kv_group_window(p, s, g) == 0) ok = kv_fetch_hold(p, g, tokens, ch, run, held, &n_held, &n_fetched);
        if (n_fetched > before && first == max_blocks) first = run;
    }
    for (int g = 0; g < NG; g++) {
        if (kv_group_window(p, s, g) == 0) continue;
        for (int j = 0; j < run; j++) {
            if (!kv_group_keeps(p, s, g, j, run * B)) continue;
            int before = n_fetched;
            if (!kv_fetch_hold(p, g, tokens, ch, j, held, &n_held, &n_fetched)) break;
            if (n_fetched > before && j < first) first = j;
        }
    }
    for (int i = 0; i < n_held; i++) kv_block_release(p, held[i]);
    free(held);
    return first;
}

/* share_prefix on a hybrid pool. A hit of n blocks needs every full group's blocks [0, n) and, in
 * each window group, only the blocks its window still sees once the sequence holds n * B tokens
 * (kv_group_keeps: the window's and the sinks'); the others start as holes, as if the window had
 * dropped them. So a shared prefix longer than a window is still a hit when the window groups kept
 * (or the prefix cache still holds) the blocks at its end: the longest n for which every group has
 * what it needs is taken. Plan, then take: a failed allocation changes nothing. */
static hr_status kv_share_groups(hr_kv_pool *p, kv_seq *s, const int32_t *tokens, int max_blocks, int *n_cached,
                                 hr_error *err) {
    int B = p->cfg.block_size, NG = p->n_groups;
    uint64_t *ch = malloc(((size_t)max_blocks + 1) * sizeof *ch); /* ch[j + 1]: the chain after block j */
    if (!ch) return hr_error_set(err, HR_ERR_NOMEM, "KV share_prefix: out of memory for %d hashes", max_blocks);
    ch[0] = s->last_hash;
    for (int j = 0; j < max_blocks; j++) ch[j + 1] = kv_chain(ch[j], s->scope, tokens + (size_t)j * B, B);
    int first_fetched = kv_fetch_groups(p, s, tokens, ch, max_blocks);
    int run = max_blocks; /* the full groups' run: every block from the first */
    for (int g = 0; g < NG; g++) {
        if (kv_group_window(p, s, g) > 0) continue;
        int j = 0;
        while (j < run && kv_group_find(p, g, ch[j + 1], ch[j], tokens + (size_t)j * B) >= 0) j++;
        run = j;
    }
    int n = run;
    for (; n > 0; n--) { /* the longest run the window groups can take too */
        bool ok = true;
        for (int g = 0; g < NG && ok; g++) {
            if (kv_group_window(p, s, g) == 0) continue;
            for (int j = 0; j < n && ok; j++)
                if (kv_group_keeps(p, s, g, j, n * B))
                    ok = kv_group_find(p, g, ch[j + 1], ch[j], tokens + (size_t)j * B) >= 0;
        }
        if (ok) break;
    }
    hr_status rc = kv_table_reserve(p, s, n, err);
    if (rc != HR_OK) {
        free(ch);
        return rc;
    }
    for (int g = 0; g < NG; g++) {
        int32_t *t = kv_tab(s, g);
        for (int j = 0; j < n; j++) {
            if (!kv_group_keeps(p, s, g, j, n * B)) {
                t[j] = -1; /* what the window dropped: a hole from the start, not an eviction */
                s->n_holes++;
                s->ghole[g]++;
                continue;
            }
            int32_t b = kv_group_find(p, g, ch[j + 1], ch[j], tokens + (size_t)j * B);
            kv_block_ref(p, b);
            t[j] = b;
        }
    }
    s->n_table = n;
    s->last_hash = ch[n];
    s->n_tokens = n * B;
    s->prefix_hit_tokens = n * B;
    free(ch);
    atomic_fetch_add_explicit(&p->prefix_hits, (uint64_t)n * B, memory_order_relaxed);
    if (n > first_fetched) /* the hit's tokens from the first block the tier gave on */
        atomic_fetch_add_explicit(&p->fetched_tokens, (uint64_t)(n - first_fetched) * B, memory_order_relaxed);
    kv_update_peak(p, s);
    *n_cached = n * B;
    return HR_OK;
}

hr_status hr_kv_seq_share_prefix(hr_kv_pool *p, hr_kv_seq seq, const int32_t *tokens, int n_tokens, int *n_cached,
                                 hr_error *err) {
    if (!kv_seq_valid(p, seq))
        return hr_error_set(err, HR_ERR_INVALID_ARG, "KV share_prefix: %d is not a sequence", seq);
    kv_seq *s = &p->seqs[seq];
    if (s->n_tokens != 0 || s->n_table != 0 || s->swapped)
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "KV share_prefix: sequence %d already holds %d tokens in %d blocks; only an empty "
                            "sequence can take a cached prefix",
                            seq, s->n_tokens, s->n_table);
    int B = p->cfg.block_size;
    int max_blocks = n_tokens > 0 ? (n_tokens - 1) / B : 0;
    if (p->n_groups > 1) return kv_share_groups(p, s, tokens, max_blocks, n_cached, err);
    /* find the run first (plan), then take it (commit), so a failed table allocation changes nothing */
    uint64_t h = s->last_hash;
    int n_found = 0;
    for (; n_found < max_blocks; n_found++) {
        const int32_t *tk = tokens + (size_t)n_found * B;
        uint64_t nh = kv_chain(h, s->scope, tk, B);
        int32_t b = kv_prefix_map_find(p, nh);
        if (b < 0 || p->parent[b] != h || memcmp(p->tokens + (size_t)b * B, tk, (size_t)B * sizeof *tk) != 0) break;
        h = nh;
    }
    hr_status rc = kv_table_reserve(p, s, n_found, err);
    if (rc != HR_OK) return rc;
    h = s->last_hash;
    for (int i = 0; i < n_found; i++) {
        h = kv_chain(h, s->scope, tokens + (size_t)i * B, B);
        int32_t b = kv_prefix_map_find(p, h);
        kv_block_ref(p, b);
        s->table[s->n_table++] = b;
    }
    s->last_hash = h;
    s->n_tokens = n_found * B;
    int n_fetched = kv_fetch_more(p, s, tokens, n_found, max_blocks);
    n_found += n_fetched;
    s->prefix_hit_tokens = n_found * B;
    atomic_fetch_add_explicit(&p->prefix_hits, (uint64_t)n_found * B, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->fetched_tokens, (uint64_t)n_fetched * B, memory_order_relaxed);
    kv_update_peak(p, s);
    *n_cached = n_found * B;
    return HR_OK;
}

/* evict.c: what eviction policies do to a sequence, shared by every policy: growing the per-block
 * token masks and scores of token-level policies, dropping a block from the table (a hole), dropping
 * blocks whose tokens are all masked, and keeping the top-k tokens per layer and KV head. The
 * policies themselves (policy_window.c, policy_h2o.c, policy_snapkv.c) decide what to drop; policy.c
 * parses, checks and dispatches. Bookkeeping only: attention reads masks through the storage. */
#include <stdlib.h>

#include "kv/kv_internal.h"

int kv_snap_window(const hr_kv_policy *pol) {
    if (pol->window > 0) return pol->window;
    int w = pol->budget / 2;
    return w < 32 ? w : 32;
}

hr_status kv_policy_meta_grow(hr_kv_pool *p, kv_seq *s, int n, hr_error *err) {
    if (!kv_token_level(s) || n <= s->meta_n) return HR_OK;
    size_t per = (size_t)p->cfg.n_layers * p->cfg.n_kv_heads;
    int MW = kv_mask_words(p), B = p->cfg.block_size;
    if (n > s->meta_cap) {
        int cap = s->meta_cap ? s->meta_cap : 8;
        while (cap < n) cap *= 2;
        uint64_t *m = realloc(s->mask, (size_t)cap * per * MW * sizeof *m);
        if (!m) return hr_error_set(err, HR_ERR_NOMEM, "KV policy: out of memory for the masks of %d blocks", cap);
        s->mask = m;
        atomic_uint_fast64_t *sc = realloc(s->score, (size_t)cap * per * B * sizeof *sc);
        if (!sc) return hr_error_set(err, HR_ERR_NOMEM, "KV policy: out of memory for the scores of %d blocks", cap);
        s->score = sc;
        s->meta_cap = cap;
    }
    for (int j = s->meta_n; j < n; j++) {
        for (size_t i = 0; i < per; i++) {
            uint64_t *m = s->mask + ((size_t)j * per + i) * MW;
            for (int w = 0; w < MW; w++) {
                int bits = B - 64 * w;
                m[w] = bits >= 64 ? ~0ull : ((1ull << bits) - 1);
            }
        }
        atomic_uint_fast64_t *sc = s->score + (size_t)j * per * B;
        for (size_t i = 0; i < per * (size_t)B; i++) atomic_init(&sc[i], 0);
    }
    s->meta_n = n;
    return HR_OK;
}

/* ---- dropping ------------------------------------------------------------------------------------ */

void kv_group_drop_block(hr_kv_pool *p, kv_seq *s, int g, int j, bool policy) {
    int32_t *t = kv_tab(s, g);
    int32_t b = t[j];
    KV_ASSERT(b >= 0 && (j + 1) * p->cfg.block_size <= s->n_tokens);
    t[j] = -1;
    s->n_holes++;
    if (s->ghole) s->ghole[g]++;
    if (policy) {
        s->blocks_evicted++;
        atomic_fetch_add_explicit(&p->policy_evicted, 1, memory_order_relaxed);
    } else {
        s->window_freed++;
        atomic_fetch_add_explicit(&p->window_freed, 1, memory_order_relaxed);
    }
    kv_block_release(p, b);
}

void kv_policy_drop_block(hr_kv_pool *p, kv_seq *s, int j) { kv_group_drop_block(p, s, 0, j, true); }

void kv_policy_drop_masked_blocks(hr_kv_pool *p, kv_seq *s) {
    int B = p->cfg.block_size, MW = kv_mask_words(p);
    size_t per = (size_t)p->cfg.n_layers * p->cfg.n_kv_heads;
    int n_full = s->n_tokens / B;
    for (int j = 0; j < n_full && j < s->meta_n; j++) {
        if (s->table[j] < 0) continue;
        const uint64_t *m = s->mask + (size_t)j * per * MW;
        uint64_t any = 0;
        for (size_t i = 0; i < per * (size_t)MW; i++) any |= m[i];
        if (!any) kv_policy_drop_block(p, s, j);
    }
}

typedef struct kv_cand {
    uint64_t key;
    int pos;
} kv_cand;

static int kv_cand_cmp(const void *a, const void *b) {
    const kv_cand *x = a, *y = b;
    if (x->key != y->key) return x->key > y->key ? -1 : 1;
    return y->pos - x->pos; /* later position first */
}

void kv_policy_keep_top(hr_kv_pool *p, kv_seq *s, int layer, int kh, int end, int k, const uint64_t *key) {
    int B = p->cfg.block_size, MW = kv_mask_words(p);
    int n_kept = 0;
    for (int pos = 0; pos < end; pos++) {
        int j = pos / B, t = pos % B;
        if (s->table[j] < 0) {
            pos = (j + 1) * B - 1;
            continue;
        }
        n_kept += (s->mask[kv_meta_index(p, j, layer, kh) * MW + t / 64] >> (t % 64)) & 1;
    }
    if (n_kept <= k) return;
    kv_cand *c = malloc((size_t)n_kept * sizeof *c);
    if (!c) return; /* keep more than the budget rather than fail a commit */
    int n = 0;
    for (int pos = 0; pos < end; pos++) {
        int j = pos / B, t = pos % B;
        if (s->table[j] < 0) {
            pos = (j + 1) * B - 1;
            continue;
        }
        if ((s->mask[kv_meta_index(p, j, layer, kh) * MW + t / 64] >> (t % 64)) & 1)
            c[n++] = (kv_cand){.key = key[pos], .pos = pos};
    }
    qsort(c, (size_t)n, sizeof *c, kv_cand_cmp);
    for (int i = k; i < n; i++) {
        int j = c[i].pos / B, t = c[i].pos % B;
        s->mask[kv_meta_index(p, j, layer, kh) * MW + t / 64] &= ~(1ull << (t % 64));
    }
    free(c);
}

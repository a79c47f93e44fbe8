/* policy_h2o.c: `h2o:B`, heavy-hitter eviction (H2O, Zhang et al. 2023).
 *
 * Per layer and KV head (the group of query heads sharing it), every cached token accumulates the
 * softmax weight each later query of the group gives it (the storage's attention adds it, fixed point so the
 * sum does not depend on thread order). After each commit, per layer and KV head, the B/2 most recent
 * tokens are kept, and of the older ones still kept only the B - B/2 with the highest accumulated
 * weight stay (ties: the later position); the others lose their bit in the block's token mask and
 * attention skips them from then on. A block whose tokens are masked in every layer and KV head
 * leaves the table and returns to the pool. So the budget bounds what attention reads per head; the
 * memory it frees depends on how much the heads agree (a block stays while any head keeps a token). */
#include <stdlib.h>

#include "kv/kv_internal.h"

static hr_status h2o_check(const hr_kv_pool *p, const hr_kv_policy *pol, hr_error *err) {
    if (pol->budget < 2)
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "KV policy h2o:%d: the budget must be at least 2 tokens (half recent, half heavy "
                            "hitters), e.g. h2o:128",
                            pol->budget);
    return HR_OK;
}

static void h2o_after_commit(hr_kv_pool *p, kv_seq *s) {
    int B = p->cfg.block_size, n = s->n_tokens;
    int recent = s->pol.budget / 2, heavy = s->pol.budget - recent;
    int end = n - recent; /* older than the recent half */
    if (end <= heavy) return;
    uint64_t *key = malloc((size_t)end * sizeof *key);
    if (!key) return; /* keep more than the budget rather than fail a commit */
    for (int l = 0; l < p->cfg.n_layers; l++)
        for (int kh = 0; kh < p->cfg.n_kv_heads; kh++) {
            for (int pos = 0; pos < end; pos++) {
                int j = pos / B;
                key[pos] = s->table[j] >= 0 ? atomic_load_explicit(&s->score[kv_meta_index(p, j, l, kh) * B + pos % B],
                                                                   memory_order_relaxed)
                                            : 0;
            }
            kv_policy_keep_top(p, s, l, kh, end, heavy, key);
        }
    free(key);
    kv_policy_drop_masked_blocks(p, s);
}

const kv_policy_ops kv_pol_h2o = {
    .kind = HR_KV_POLICY_H2O, .name = "h2o", .token_level = true, .check = h2o_check, .after_commit = h2o_after_commit};

/* policy_snapkv.c: `snapkv:B[,window:W]` (SnapKV, Li et al. 2024).
 *
 * During prefill, the last W queries of the prompt (the observation window; default min(32, B/2))
 * add their softmax weights to each prompt token's score, per layer and KV head (the storage's attention). At the
 * commit that completes the prompt, per layer and KV head, the scores of the tokens before the window
 * are max-pooled over 5 neighbouring positions (so a token next to an attended one tends to stay with
 * it, as SnapKV's pooling keeps clusters), and the B - W best of them stay, with the W window tokens;
 * the others are masked, and blocks masked in every layer and KV head return to the pool. Generation
 * then proceeds with that cache: every later token is kept. */
#include <stdlib.h>

#include "kv/kv_internal.h"

enum { SNAP_POOL_RADIUS = 2 };

static hr_status snapkv_check(const hr_kv_pool *p, const hr_kv_policy *pol, hr_error *err) {
    if (pol->budget < 2)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "KV policy snapkv:%d: the budget must be at least 2 tokens",
                            pol->budget);
    if (kv_snap_window(pol) >= pol->budget)
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "KV policy snapkv:%d,window:%d: the observation window must be smaller than the budget "
                            "(e.g. snapkv:128,window:32)",
                            pol->budget, pol->window);
    return HR_OK;
}

static void snapkv_after_commit(hr_kv_pool *p, kv_seq *s) {
    int end = kv_snap_end(s);
    if (s->snap_done || end <= 0 || s->n_tokens < end) return;
    s->snap_done = true;
    int B = p->cfg.block_size, w = kv_snap_window(&s->pol);
    int obs = end - w; /* tokens before the observation window */
    int keep = s->pol.budget - w;
    if (obs <= keep) return;
    uint64_t *raw = malloc((size_t)obs * sizeof *raw), *pooled = malloc((size_t)obs * sizeof *pooled);
    if (raw && pooled) {
        for (int l = 0; l < p->cfg.n_layers; l++)
            for (int kh = 0; kh < p->cfg.n_kv_heads; kh++) {
                for (int pos = 0; pos < obs; pos++) {
                    int j = pos / B;
                    raw[pos] = s->table[j] >= 0
                                   ? atomic_load_explicit(&s->score[kv_meta_index(p, j, l, kh) * B + pos % B],
                                                          memory_order_relaxed)
                                   : 0;
                }
                for (int pos = 0; pos < obs; pos++) {
                    uint64_t mx = 0;
                    for (int d = -SNAP_POOL_RADIUS; d <= SNAP_POOL_RADIUS; d++)
                        if (pos + d >= 0 && pos + d < obs && raw[pos + d] > mx) mx = raw[pos + d];
                    pooled[pos] = mx;
                }
                kv_policy_keep_top(p, s, l, kh, obs, keep, pooled);
            }
        kv_policy_drop_masked_blocks(p, s);
    }
    free(raw);
    free(pooled);
}

const kv_policy_ops kv_pol_snapkv = {.kind = HR_KV_POLICY_SNAPKV,
                                     .name = "snapkv",
                                     .token_level = true,
                                     .check = snapkv_check,
                                     .after_commit = snapkv_after_commit};

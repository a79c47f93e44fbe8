/* policy_window.c: `window:W` and `sinks:S,window:W` (StreamingLLM), and a model's own sliding window.
 *
 * A query at position p sees positions > p - W (and, with sinks, positions < S); attention (attend.c's view) applies
 * that mask token by token, so results match a reference sliding-window attention exactly. What the
 * cache keeps is whole blocks: after each commit, every block whose positions are all below
 * n_tokens + 1 - W (the first position the next query can see) and that holds no sink position
 * becomes a hole and returns to the pool. A sequence in decode therefore holds at most
 * ceil(S / B) + ceil(W / B) + 1 blocks, whatever its length. With per-layer windows (a model's
 * metadata), a block leaves a group's row only when the layer of the group with the widest window
 * cannot see it; a group with a layer without a window keeps everything. A one-kind pool has one group
 * of every layer; a hybrid pool (gemma's window layers beside full ones) frees its window groups'
 * blocks while its full groups keep theirs. */
#include "kv/kv_internal.h"

static hr_status window_check(const hr_kv_pool *p, const hr_kv_policy *pol, hr_error *err) {
    int B = p->cfg.block_size;
    if (pol->window < B)
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "KV policy window:%d is smaller than one block (%d tokens); use window:W with W >= %d "
                            "(whole blocks leave the cache)",
                            pol->window, B, B);
    if (pol->kind == HR_KV_POLICY_SINKS && pol->sinks < 1)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "KV policy sinks:%d: sinks must be >= 1 (or use window:W alone)",
                            pol->sinks);
    return HR_OK;
}

int kv_group_window(const hr_kv_pool *p, const kv_seq *s, int g) {
    int wmax = 0;
    for (int l = 0; l < p->cfg.n_layers; l++) {
        if (p->layer_gs[2 * l] != g) continue;
        int w = kv_layer_window(p, s, l);
        if (w == 0) return 0; /* this layer sees everything */
        wmax = w > wmax ? w : wmax;
    }
    return wmax;
}

bool kv_group_keeps(const hr_kv_pool *p, const kv_seq *s, int g, int j, int n_tokens) {
    int B = p->cfg.block_size, w = kv_group_window(p, s, g);
    if (w == 0) return true;
    int lo = n_tokens + 1 - w; /* first position the next query sees */
    int sink_blocks = (kv_policy_sinks(s) + B - 1) / B;
    return j < sink_blocks || (j + 1) * B > lo;
}

/* Drops, in each group, the blocks no later query can see in any of its layers. One group (a
 * one-kind model, or policies on it) is a policy's eviction; a window group of a hybrid pool under
 * no policy is the model's own window freeing memory (kv_group_drop_block's `policy`). */
static void window_after_commit(hr_kv_pool *p, kv_seq *s) {
    int B = p->cfg.block_size;
    bool policy = p->n_groups == 1 || s->pol.kind != HR_KV_POLICY_FULL;
    for (int g = 0; g < p->n_groups; g++) {
        int wmax = kv_group_window(p, s, g);
        if (wmax == 0) continue;         /* a full group keeps everything */
        int lo = s->n_tokens + 1 - wmax; /* first position the next query sees */
        int sink_blocks = (kv_policy_sinks(s) + B - 1) / B;
        int *from = kv_evict_from(p, s, g);
        int j = *from > sink_blocks ? *from : sink_blocks;
        const int32_t *t = kv_tab(s, g);
        for (; (j + 1) * B <= lo; j++)
            if (t[j] >= 0) kv_group_drop_block(p, s, g, j, policy);
        if (j > *from) *from = j;
    }
}

const kv_policy_ops kv_pol_window = {.kind = HR_KV_POLICY_WINDOW,
                                     .name = "window",
                                     .token_level = false,
                                     .check = window_check,
                                     .after_commit = window_after_commit};

const kv_policy_ops kv_pol_sinks = {.kind = HR_KV_POLICY_SINKS,
                                    .name = "sinks",
                                    .token_level = false,
                                    .check = window_check,
                                    .after_commit = window_after_commit};

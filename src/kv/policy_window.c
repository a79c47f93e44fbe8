/* policy_window.c: `window:W` and `sinks:S,window:W` (StreamingLLM), and a model's own sliding window.
 *
 * A query at position p sees positions > p - W (and, with sinks, positions < S); attention (attend.c's view) applies
 * that mask token by token, so results match a reference sliding-window attention exactly. What the
 * cache keeps is whole blocks: after each commit, every block whose positions are all below
 * n_tokens + 1 - W (the first position the next query can see) and that holds no sink position
 * becomes a hole and returns to the pool. A sequence in decode therefore holds at most
 * ceil(S / B) + ceil(W / B) + 1 blocks, whatever its length. With per-layer windows (a model's
 * metadata), a block leaves only when the layer with the widest window cannot see it; a layer without
 * a window keeps everything. */
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

/* Drops the blocks no later query can see in any layer. */
static void window_after_commit(hr_kv_pool *p, kv_seq *s) {
    int B = p->cfg.block_size, wmax = 0;
    for (int l = 0; l < p->cfg.n_layers; l++) {
        int w = kv_layer_window(p, s, l);
        if (w == 0) return; /* this layer sees everything */
        wmax = w > wmax ? w : wmax;
    }
    int lo = s->n_tokens + 1 - wmax; /* first position the next query sees */
    int sink_blocks = (kv_policy_sinks(s) + B - 1) / B;
    int j = s->evict_from > sink_blocks ? s->evict_from : sink_blocks;
    for (; (j + 1) * B <= lo; j++)
        if (s->table[j] >= 0) kv_policy_drop_block(p, s, j);
    if (j > s->evict_from) s->evict_from = j;
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

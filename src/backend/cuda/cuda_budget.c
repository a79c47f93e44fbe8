/* cuda_budget.c: the GPU's memory as arithmetic (cuda.h's arena plan): what the one device arena holds
 * for weights, the forward pass's scratch and the KV blocks, from the model's shape and the driver's
 * report. Pure: the runtime sizes the arena with it and the planner plans with the same function, so
 * `headroom plan --device h200` and `serve --device cuda` on an H200 agree but for what the profile's
 * memory figure and the driver's report differ by. The piece lists below are the allocations the
 * backend (backend_cuda.c) and the KV storage (kv_storage_cuda.c) make, in their order; the tests
 * compare the arena's use after start with this plan byte for byte. */
#include <stdlib.h>

#include "backend/cuda/cuda.h"
#include "common/threadpool.h"
#include "common/util.h"

/* thread blocks an attention call aims for: enough to fill an H100/H200 (132 SMs) several times
 * over; HEADROOM_CUDA_ATTN_BLOCKS replaces it (tuning, tests) */
#define CUDA_ATT_TARGET_BLOCKS 1024
#define CUDA_ATT_TILE          256 /* kernels/attention.cu's HR_K_ATT_TILE */
#define CUDA_ATT_G             8   /* its HR_K_ATT_G */
/* sequences under a token-level policy (h2o, snapkv) whose masks and scores one forward pass holds on
 * the device; a batch with more runs in pieces (backend_cuda.c). HEADROOM_CUDA_TOKEN_SEQS replaces it */
#define CUDA_TOKEN_SEQS 4

int hr_cuda_attn_target_blocks(void) {
    const char *tb = getenv("HEADROOM_CUDA_ATTN_BLOCKS");
    return tb && atoi(tb) > 0 ? atoi(tb) : CUDA_ATT_TARGET_BLOCKS;
}

void hr_cuda_attn_split(int n_kv_heads, int n_heads, int n, int max_ctx, int target_blocks, int *n_splits, int *chunk) {
    int ng = (n_heads / n_kv_heads + CUDA_ATT_G - 1) / CUDA_ATT_G;
    int64_t per_split = (int64_t)(n > 0 ? n : 1) * n_kv_heads * ng;
    int tiles = (max_ctx + CUDA_ATT_TILE - 1) / CUDA_ATT_TILE;
    if (tiles < 1) tiles = 1;
    int64_t want = (target_blocks + per_split - 1) / per_split;
    if (want > 65535) want = 65535; /* the splits are grid.y: at most 65535 (a huge HEADROOM_CUDA_ATTN_BLOCKS) */
    int ns = want < 1 ? 1 : want > tiles ? tiles : (int)want;
    int tiles_per = (tiles + ns - 1) / ns;
    *chunk = tiles_per * CUDA_ATT_TILE;
    *n_splits = (tiles + tiles_per - 1) / tiles_per;
}

uint64_t hr_cuda_attn_scratch_bytes(int n_kv_heads, int head_dim, int n_heads, int n, int max_ctx, int target_blocks) {
    int ns, chunk;
    hr_cuda_attn_split(n_kv_heads, n_heads, n, max_ctx, target_blocks, &ns, &chunk);
    /* the splits asked for (want, at most the tiles), not the ones made: those can be more for a shorter
     * context (asking 4, 5 tiles go in 3 splits of 2 but 4 tiles in 4), and a batch of any context up to
     * max_ctx (a sequence short of it, a graph's bucket) must fit this scratch; the asked count only
     * grows with max_ctx and bounds the made one */
    const int ng = (n_heads / n_kv_heads + CUDA_ATT_G - 1) / CUDA_ATT_G;
    const int64_t per_split = (int64_t)(n > 0 ? n : 1) * n_kv_heads * ng;
    const int64_t tiles = (max_ctx + CUDA_ATT_TILE - 1) / CUDA_ATT_TILE;
    const int64_t want = (target_blocks + per_split - 1) / per_split;
    int64_t asked = want < tiles ? want : tiles;
    if (asked < 1) asked = 1;
    if (asked > ns) ns = (int)asked;
    /* o_part [n][H][ns][D], ml_part [n][H][ns][2], and the rotated queries [n][H][D] (q4h keys) */
    const uint64_t rows = (uint64_t)(n > 0 ? n : 1) * (uint64_t)n_heads;
    return rows * ((uint64_t)ns * (uint64_t)(head_dim + 2) + (uint64_t)head_dim) * 4u;
}

int hr_cuda_token_seqs(int max_tokens) {
    const char *v = getenv("HEADROOM_CUDA_TOKEN_SEQS");
    int n = v && atoi(v) > 0 ? atoi(v) : CUDA_TOKEN_SEQS;
    return n < max_tokens ? n : max_tokens > 0 ? max_tokens : 1;
}

uint64_t hr_cuda_token_row_bytes(const hr_hparams *hp, int max_ctx, int block_size, bool scores) {
    const uint64_t max_blocks = (uint64_t)((max_ctx + block_size - 1) / block_size);
    const uint64_t per = max_blocks * (uint64_t)hp->n_layer * (uint64_t)hp->n_head_kv;
    return per * (scores ? (uint64_t)block_size : (uint64_t)((block_size + 63) / 64)) * 8u;
}

int hr_cuda_scratch_pieces(const hr_hparams *hp, int max_tokens, int max_ctx, int block_size, int n_groups,
                           uint64_t *out) {
    const uint64_t G = (uint64_t)(n_groups > 1 ? n_groups : 1); /* slots, tables and windows: a set a group */
    const uint64_t T = (uint64_t)max_tokens, E = (uint64_t)hp->n_embd, qd = (uint64_t)hp->n_head * hp->head_dim,
                   kvd = (uint64_t)hp->n_head_kv * hp->head_dim, V = (uint64_t)hp->n_vocab;
    /* a mixture of experts: every (token, rank) slot's gate and up rows in g and u, the router's logits,
     * each token's experts and weights, each slot's output; none without experts */
    const uint64_t NE = hp->n_expert > 0 ? (uint64_t)hp->n_expert : 0, K = NE ? (uint64_t)hp->n_expert_used : 0;
    const uint64_t F = NE ? K * (uint64_t)hp->n_ff_exp : (uint64_t)hp->n_ff;
    const uint64_t max_blocks = (uint64_t)((max_ctx + block_size - 1) / block_size);
    /* the attention's scratch for the largest split any batch of up to T queries gets */
    uint64_t scr = 0;
    int target = hr_cuda_attn_target_blocks();
    for (int n = 1; n <= max_tokens; n++) {
        uint64_t b = hr_cuda_attn_scratch_bytes(hp->n_head_kv, hp->head_dim, hp->n_head, n, max_ctx, target);
        scr = b > scr ? b : scr;
    }
    /* x, xb, xo, q, k, v, att, g, u, logits, ids, pos, slots (with each token's stage and fill: 3
     * ints), qrow, n_ctx, tables, attention scratch,
     * the rows that want logits, the windows, prefill attention's runs (at most one tile a row: 4 ints),
     * the token-level policies' rows (hr_kv_cuda_tokens: a view a row, and the masks and scores of
     * hr_cuda_token_seqs sequences), and the experts' router logits, choices, weights and outputs */
    const uint64_t tl = (uint64_t)hr_cuda_token_seqs(max_tokens);
    const uint64_t pieces[HR_CUDA_SCRATCH_PIECES] = {T * E * 4,
                                                     T * E * 4,
                                                     T * E * 4,
                                                     T * qd * 4,
                                                     T * kvd * 4,
                                                     T * kvd * 4,
                                                     T * qd * 4,
                                                     T * F * 4,
                                                     T * F * 4,
                                                     T * V * 4,
                                                     T * 4,
                                                     T * 4,
                                                     G * T * 12,
                                                     T * 4,
                                                     T * 4,
                                                     G * T * max_blocks * 4,
                                                     scr,
                                                     T * 4,
                                                     G * T * 8,
                                                     T * 16,
                                                     T * 8,
                                                     tl * hr_cuda_token_row_bytes(hp, max_ctx, block_size, false),
                                                     tl * hr_cuda_token_row_bytes(hp, max_ctx, block_size, true),
                                                     T * NE * 4,
                                                     T * K * 4,
                                                     T * K * 4,
                                                     T * K * E * 4};
    for (int i = 0; i < HR_CUDA_SCRATCH_PIECES; i++) out[i] = pieces[i];
    return HR_CUDA_SCRATCH_PIECES;
}

uint64_t hr_cuda_host_scratch_bytes(const hr_hparams *hp, int max_tokens, int max_ctx, int block_size, int n_groups,
                                    int n_threads) {
    const uint64_t T = (uint64_t)max_tokens, max_blocks = (uint64_t)((max_ctx + block_size - 1) / block_size),
                   G = (uint64_t)(n_groups > 1 ? n_groups : 1);
    /* backend_cuda.c's alloc_activations: slots (with stages and fills: 3 a row), qrow, n_ctx, windows (2 a
     * row), tables, out rows, the embedding rows (counted whatever the type: T x E floats), and the
     * token-level policies' views (2 a row), each of their device rows' sequence, blocks and flag, and one
     * row's scores as they come down; slots, windows and tables a set per KV layer group */
    const uint64_t tl = (uint64_t)hr_cuda_token_seqs(max_tokens);
    return G * T * 4 * 3 + T * 4 * 2 + G * T * 8 + G * T * max_blocks * 4 + T * sizeof(int) +
           T * (uint64_t)hp->n_embd * 4 + T * 8 + tl * (4 + sizeof(int) + sizeof(bool)) +
           hr_cuda_token_row_bytes(hp, max_ctx, block_size, true) + hr_threadpool_bytes(HR_MAX(1, n_threads));
}

uint64_t hr_cuda_storage_stage_bytes(int n_kv_heads, int head_dim) {
    return 2u * (uint64_t)n_kv_heads * (uint64_t)head_dim * 4u + 12u;
}

hr_status hr_cuda_arena_plan_compute(const hr_cuda_arena_query *q, hr_cuda_arena_plan *out, hr_error *err) {
    const hr_hparams *hp = q->hp;
    *out = (hr_cuda_arena_plan){.total_bytes = q->total_bytes, .free_bytes = q->free_bytes};
    double util = q->util > 0.0 ? q->util : HR_CUDA_DEFAULT_UTIL;
    if (!(util > 0.0 && util <= 1.0))
        return hr_error_set(err, HR_ERR_INVALID_ARG, "--gpu-util %g: must be in (0, 1]", util);
    out->util = util;
    if (q->max_batch_tokens > HR_CUDA_MAX_BATCH_TOKENS) /* the runtime and the planner alike, before the sizes */
        return hr_error_set(err, HR_ERR_INVALID_ARG, "CUDA: max_batch_tokens %d is past %d (the GEMV's grid rows)",
                            q->max_batch_tokens, HR_CUDA_MAX_BATCH_TOKENS);
    out->budget_bytes = (uint64_t)((double)q->total_bytes * util);
    out->weight_bytes = q->weight_bytes;
    uint64_t pieces[HR_CUDA_SCRATCH_PIECES];
    int n = hr_cuda_scratch_pieces(hp, q->max_batch_tokens, q->max_ctx, q->block_size, q->n_groups, pieces);
    for (int i = 0; i < n; i++) out->scratch_bytes += hr_cuda_arena_piece_bytes(pieces[i]);
    out->block_bytes = q->block_bytes;
    /* the KV storage's pieces beside its blocks: its host write's rows, and the tail buffers */
    const uint64_t stage = hr_cuda_arena_piece_bytes(hr_cuda_storage_stage_bytes(hp->n_head_kv, hp->head_dim)) +
                           (q->stage_bytes ? hr_cuda_arena_piece_bytes(q->stage_bytes) : 0);
    const uint64_t fixed = out->weight_bytes + out->scratch_bytes + stage;
    const double gib = 1u << 30;
    if (q->n_blocks > 0) {
        out->n_blocks = q->n_blocks;
    } else if (q->kv_budget > 0) {
        out->n_blocks = (int)(q->kv_budget / q->block_bytes < INT32_MAX ? q->kv_budget / q->block_bytes : INT32_MAX);
    } else {
        /* what the budget leaves after everything else, less the last piece's rounding */
        uint64_t left = out->budget_bytes > fixed + 256u ? out->budget_bytes - fixed - 256u : 0;
        uint64_t nb = left / q->block_bytes;
        out->n_blocks = (int)(nb < INT32_MAX ? nb : INT32_MAX);
    }
    out->kv_bytes = hr_cuda_arena_piece_bytes((uint64_t)out->n_blocks * q->block_bytes) + stage;
    out->arena_bytes = out->weight_bytes + out->scratch_bytes + out->kv_bytes;
    if (out->n_blocks < 1 || out->arena_bytes > out->budget_bytes)
        return hr_error_set(err, HR_ERR_BUDGET,
                            "the GPU budget (--gpu-util %.2f of %.2f GiB: %.2f GiB) holds the weights (%.2f GiB) and "
                            "scratch (%.2f GiB) but %s; lower --ctx, --max-batch-tokens or --kv-budget, or raise "
                            "--gpu-util",
                            util, (double)q->total_bytes / gib, (double)out->budget_bytes / gib,
                            (double)out->weight_bytes / gib, (double)out->scratch_bytes / gib,
                            out->n_blocks < 1 ? "no KV block" : "not the KV pool asked for");
    if (out->arena_bytes > q->free_bytes)
        return hr_error_set(err, HR_ERR_BUDGET,
                            "the GPU has %.2f GiB free of %.2f GiB; the arena needs %.2f GiB (--gpu-util %.2f): "
                            "another process holds the rest, or lower --gpu-util",
                            (double)q->free_bytes / gib, (double)q->total_bytes / gib, (double)out->arena_bytes / gib,
                            util);
    return HR_OK;
}

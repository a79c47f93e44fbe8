/* test_kv_hybrid.c: the hybrid KV manager (kv.h's layer groups): layers grouped by kind in one pool.
 *   - groups: one group of every layer for a one-kind model (the same block bytes as before), the
 *     gcd grouping for gemma2/3-like mixes, the fall-back to one group where groups would be too many.
 *   - window groups free blocks as a sequence grows, exactly the blocks their window no longer sees,
 *     per group, while the full group keeps all; hr_kv_pool_check's per-group invariants hold after
 *     every commit; attention equals a one-group pool's bit for bit.
 *   - gemma2 / gemma3 synthetic models: greedy ids and every logit bit-identical with a hybrid pool
 *     and with the one-group pool (test_model_arch checks the latter against llama.cpp), in less memory.
 *   - prefix sharing across a window: a hit needs the full groups' blocks and, in window groups, only
 *     the blocks the window still sees; older window blocks may be gone from the cache.
 *   - swap round trip of a hybrid sequence (its window holes stay holes) and decoding on after it;
 *     the engine preempting hybrid sequences by swap and by recompute gives the ids of a roomy pool.
 *   - the runtime: a gemma3 model gets a hybrid pool; usage.kv and the pool ledger by layer kind; the
 *     same prompt again is a 96-token prefix hit across the window with the same ids;
 *     policies on a hybrid pool (h2o refused, window:W bounds every group, swap refused, fork).
 *   - `headroom plan` (hr_plan_compute) and the pool agree on bytes per token per kind and on one
 *     sequence's worst case at the context (llama, gemma2, gemma3, phi3, qwen3 shapes), within 1%.
 *   - a latent cache (v_from_k: DeepSeek MLA) is kind "latent" with its bytes per token (DeepSeek-V3:
 *     70,272 f16) in the groups, the plan, usage.kv and the pool ledger (deepseek2-tiny).
 *   - the prefix observer (KV events) on a hybrid pool: every group's blocks stored with the group's
 *     hashes (group 0 a one-group pool's), each group a chain; removed on reclaim; the map is stored
 *     minus removed. The remote tier takes a hybrid pool (its round trip: test_kv_remote).
 *   - plan --sim (hr_sim_run) on a gemma3 shape: the real pool's block count (layer groups) in the
 *     same memory, and a stand-in that holds the groups' blocks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "harness.h"
#include "kv/kv.h"
#include "model/model.h"
#include "model/synth.h"
#include "plan/plan.h"
#include "remote/kv_remote.h"
#include "runtime/runtime.h"

enum { HKV = 2, D = 16, H = 4, B = 16, NT = 220 };

static float kd[NT][HKV * D], vd[NT][HKV * D];
static int32_t toks[NT];

static hr_kv_pool *make_f(int n_layers, const int32_t *win, int n_blocks, int max_seqs, hr_kv_format f) {
    hr_kv_config c = {.n_layers = n_layers,
                      .n_kv_heads = HKV,
                      .head_dim = D,
                      .block_size = B,
                      .k_format = f,
                      .v_format = f,
                      .max_seqs = max_seqs,
                      .max_step_tokens = B,
                      .layer_window = win};
    c.budget_bytes = hr_kv_block_bytes(&c) * (uint64_t)n_blocks + hr_kv_fixed_bytes(&c);
    hr_kv_pool *p = NULL;
    hr_error err = {0};
    CHECKF(hr_kv_pool_create(&c, &p, &err) == HR_OK, "%s", err.msg);
    return p;
}

static hr_kv_pool *make(int n_layers, const int32_t *win, int n_blocks, int max_seqs) {
    return make_f(n_layers, win, n_blocks, max_seqs, HR_KV_F16);
}

/* Reserves, writes every layer's K/V of tokens [from, to) and commits them. */
static void put(hr_kv_pool *p, hr_kv_seq s, int from, int to) {
    hr_error err = {0};
    CHECKF(hr_kv_seq_reserve(p, s, to, &err) == HR_OK, "%s", err.msg);
    for (int t = from; t < to; t++)
        for (int l = 0; l < hr_kv_pool_config(p)->n_layers; l++) hr_kv_write(p, l, s, t, kd[t], vd[t]);
    hr_kv_seq_commit(p, s, toks + from, to - from);
}

/* Attention of every layer at n_ctx, a in pa vs b in pb: 1 when bit-identical. */
static int same_attention(hr_kv_pool *pa, hr_kv_seq a, hr_kv_pool *pb, hr_kv_seq b, int n_ctx) {
    float q[H * D], oa[H * D], ob[H * D], scratch[1024];
    for (int i = 0; i < H * D; i++) q[i] = sinf((float)i * 0.7f + (float)n_ctx);
    for (int l = 0; l < hr_kv_pool_config(pa)->n_layers; l++) {
        hr_kv_attention(pa, l, a, n_ctx, q, H, 0.25f, oa, scratch);
        hr_kv_attention(pb, l, b, n_ctx, q, H, 0.25f, ob, scratch);
        if (memcmp(oa, ob, sizeof oa) != 0) return 0;
    }
    return 1;
}

static int used_blocks(const hr_kv_pool *p) {
    hr_kv_pool_ledger l;
    hr_kv_pool_get_ledger(p, &l);
    return l.blocks_used;
}

/* ---- groups ------------------------------------------------------------------------------------- */

static void test_groups(void) {
    hr_kv_config c = {.n_layers = 8,
                      .n_kv_heads = HKV,
                      .head_dim = D,
                      .block_size = B,
                      .k_format = HR_KV_F16,
                      .v_format = HR_KV_F16,
                      .max_seqs = 1};
    hr_kv_groups g;
    hr_error err = {0};
    /* one kind: one group of every layer, the block every layer's K and V, as before groups */
    CHECK(hr_kv_config_groups(&c, &g, &err) == HR_OK);
    CHECK(g.n_groups == 1 && g.slots == 8 && g.n_kinds == 1 && g.kinds[0].window == 0);
    CHECK(g.block_bytes == 8ull * HKV * 2 * B * D * 2 && hr_kv_block_bytes(&c) == g.block_bytes);
    CHECK(hr_kv_seq_blocks_at(&c, 1000) == (1000 + B - 1) / B);
    int32_t mistral[8] = {64, 64, 64, 64, 64, 64, 64, 64};
    c.layer_window = mistral; /* a window on every layer is still one kind: one group */
    CHECK(hr_kv_config_groups(&c, &g, &err) == HR_OK && g.n_groups == 1 && g.kinds[0].window == 64);
    CHECK(hr_kv_seq_blocks_at(&c, 1000) == (1000 + B - 1) / B);
    /* gemma3: 5 window layers to 1 full: G = gcd(5, 1) = 1, six groups of one slot */
    int32_t g3[6] = {32, 32, 32, 32, 32, 0};
    c.n_layers = 6;
    c.layer_window = g3;
    CHECK(hr_kv_config_groups(&c, &g, &err) == HR_OK);
    CHECK(g.n_groups == 6 && g.slots == 1 && g.n_kinds == 2);
    CHECK(g.kinds[0].window == 32 && g.kinds[0].n_layers == 5 && g.kinds[0].n_groups == 5);
    CHECK(g.kinds[1].window == 0 && g.kinds[1].n_layers == 1 && g.kinds[1].n_groups == 1);
    CHECK(g.block_bytes == 1ull * HKV * 2 * B * D * 2);
    /* at 1000 tokens: the full group 63 blocks, each window group at most its 32 tokens + a 16-token
     * step + a partial block at each end: 4 blocks */
    c.max_step_tokens = B;
    CHECK(hr_kv_seq_blocks_at(&c, 1000) == 63 + 5 * 4);
    CHECK(hr_kv_kind_blocks_at(&c, 1, 1000) == 63 && hr_kv_kind_blocks_at(&c, 0, 1000) == 20);
    /* gemma2: alternating, G = 2 */
    int32_t g2[4] = {16, 0, 16, 0};
    c.n_layers = 4;
    c.layer_window = g2;
    CHECK(hr_kv_config_groups(&c, &g, &err) == HR_OK && g.n_groups == 2 && g.slots == 2);
    /* a real gemma3 mix: 30 window + 6 full layers: G = 6 */
    int32_t big[100];
    for (int l = 0; l < 36; l++) big[l] = l % 6 < 5 ? 1024 : 0;
    c.n_layers = 36;
    c.layer_window = big;
    CHECK(hr_kv_config_groups(&c, &g, &err) == HR_OK && g.n_groups == 6 && g.slots == 6);
    /* 97 window + 3 full: a gcd of 1 would make 100 groups: one group of every layer instead */
    for (int l = 0; l < 100; l++) big[l] = l < 97 ? 1024 : 0;
    c.n_layers = 100;
    CHECK(hr_kv_config_groups(&c, &g, &err) == HR_OK && g.n_groups == 1 && g.slots == 100);
    big[0] = -1;
    CHECK(hr_kv_config_groups(&c, &g, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "layer 0"));
}

/* ---- window freeing ---------------------------------------------------------------------------- */

static void test_window_freeing(hr_kv_format f) {
    const int32_t win[6] = {32, 32, 32, 32, 32, 0};
    hr_kv_pool *p = make_f(6, win, 400, 2, f);
    hr_kv_pool *one = make_f(6, NULL, 400, 2, f); /* the one-group pool the forward pass had before */
    /* formats encoded when a block fills: a tail buffer per group's block being filled, by default
     * as many sets as groups (the same bytes: each is one group's G slots) */
    if (hr_kv_pool_n_stage(one) > 0)
        CHECK(hr_kv_pool_n_stage(p) == 6 * hr_kv_pool_n_stage(one) &&
              hr_kv_fixed_bytes(hr_kv_pool_config(p)) == hr_kv_fixed_bytes(hr_kv_pool_config(one)));
    hr_error err = {0};
    for (int l = 0; l < 5; l++) CHECK(hr_kv_pool_set_sliding_window(one, l, 32, &err) == HR_OK);
    /* the hybrid pool's groups are fixed by its config */
    CHECK(hr_kv_pool_set_sliding_window(p, 0, 32, &err) == HR_OK);
    CHECK(hr_kv_pool_set_sliding_window(p, 5, 32, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "layer_window"));
    hr_kv_seq s = -1, o = -1;
    CHECK(hr_kv_seq_create(p, &s, &err) == HR_OK && hr_kv_seq_create(one, &o, &err) == HR_OK);
    int freed = 0, bad_check = 0, bad_count = 0, bad_attn = 0, peak = 0;
    for (int n = 1; n <= 200; n++) {
        /* the next query (at n_ctx = n) over the blocks kept after n - 1 tokens, then the commit */
        CHECK(hr_kv_seq_reserve(p, s, n, &err) == HR_OK && hr_kv_seq_reserve(one, o, n, &err) == HR_OK);
        peak = HR_MAX(peak, used_blocks(p));
        for (int l = 0; l < 6; l++) {
            hr_kv_write(p, l, s, n - 1, kd[n - 1], vd[n - 1]);
            hr_kv_write(one, l, o, n - 1, kd[n - 1], vd[n - 1]);
        }
        bad_attn += !same_attention(p, s, one, o, n);
        hr_kv_seq_commit(p, s, toks + n - 1, 1);
        hr_kv_seq_commit(one, o, toks + n - 1, 1);
        bad_check += hr_kv_pool_check(p, &err) != HR_OK;
        /* exactly: the full group holds every block; a window group the blocks with a position the
         * next query (at n) sees, those ending past n + 1 - 32 */
        int nb = (n + B - 1) / B, kept = 0;
        for (int j = 0; j < nb; j++) kept += (j + 1) * B > n + 1 - 32;
        freed += 0;
        hr_kv_seq_ledger l;
        CHECK(hr_kv_seq_get_ledger(p, s, &l, &err) == HR_OK);
        bad_count += l.n_kinds != 2 || l.kinds[1].blocks != nb || l.kinds[0].blocks != 5 * kept ||
                     l.blocks_window_freed != 5 * (nb - kept) || l.blocks_evicted != 0 || l.tokens_evicted != 0 ||
                     l.bytes_now != (uint64_t)(nb + 5 * kept) * hr_kv_block_bytes(hr_kv_pool_config(p)) ||
                     used_blocks(p) != nb + 5 * kept;
        freed = l.blocks_window_freed;
    }
    CHECKF(bad_check == 0, "%d checks failed: %s", bad_check, err.msg);
    CHECK(bad_count == 0);
    CHECK(bad_attn == 0);
    CHECK(freed == 5 * (13 - 3)); /* 13 blocks, 3 kept at 200 */
    /* the peak never passed what the plan counts for this sequence */
    CHECK(peak <= hr_kv_pool_seq_blocks(p, 200) && hr_kv_pool_seq_blocks(p, 200) == 13 + 5 * 4);
    /* the one-group pool kept every block (a full layer sees them all) */
    CHECK(used_blocks(one) == 13);
    hr_kv_pool_ledger pl;
    hr_kv_pool_get_ledger(p, &pl);
    CHECK(pl.n_groups == 6 && pl.n_kinds == 2 && pl.kinds[0].window == 32 && pl.kinds[0].blocks == 15 &&
          pl.kinds[1].window == 0 && pl.kinds[1].blocks == 13 && pl.window_blocks_freed_total == 50 &&
          pl.policy_blocks_evicted_total == 0);
    /* freeing the sequence: its full blocks go to the prefix cache, nothing stays in use */
    hr_kv_seq_free(p, s);
    CHECK(used_blocks(p) == 0 && hr_kv_pool_check(p, &err) == HR_OK);
    hr_kv_pool_destroy(p);
    hr_kv_pool_destroy(one);
}

/* ---- models: the same tokens, less memory ------------------------------------------------------- */

/* Greedy decoding of a fixed prompt for n_gen tokens; logits of every step into all (n_gen x V). */
static int greedy(const hr_model *m, bool hybrid, int n_gen, float *all, int *blocks_used) {
    const hr_hparams *hp = hr_model_hparams(m);
    const hr_layer_attn *la = hr_model_layer_attn(m);
    int32_t win[64];
    for (int l = 0; l < hp->n_layer; l++) win[l] = la[l].window;
    hr_kv_config kc = {.n_layers = hp->n_layer,
                       .n_kv_heads = hp->n_head_kv,
                       .head_dim = hp->head_dim,
                       .block_size = 16,
                       .k_format = HR_KV_F16,
                       .v_format = HR_KV_F16,
                       .max_seqs = 1,
                       .max_step_tokens = 16,
                       .layer_window = hybrid ? win : NULL};
    kc.budget_bytes = hr_kv_block_bytes(&kc) * (uint64_t)hr_kv_seq_blocks_at(&kc, 16 + n_gen);
    hr_kv_pool *kv = NULL;
    hr_model_ctx *c = NULL;
    hr_model_ctx_params mp = {.n_threads = 2, .max_batch_tokens = 16, .max_ctx = 16 + n_gen};
    hr_error err = {0};
    hr_kv_seq s = -1;
    CHECKF(hr_kv_pool_create(&kc, &kv, &err) == HR_OK && hr_model_ctx_create(m, kv, &mp, &c, &err) == HR_OK &&
               hr_kv_seq_create(kv, &s, &err) == HR_OK,
           "%s", err.msg);
    if (!c) {
        hr_kv_pool_destroy(kv);
        return 0;
    }
    int32_t tk[16], pos[16];
    hr_kv_seq seq[16];
    uint8_t want[16] = {0};
    int n = 8, at = 0, ok = 1;
    for (int i = 0; i < n; i++) tk[i] = 3 + 7 * i;
    for (int g = 0; g < n_gen && ok; g++) {
        for (int i = 0; i < n; i++) pos[i] = at + i, seq[i] = s, want[i] = i == n - 1;
        hr_batch b = {.n_tokens = n, .tokens = tk, .pos = pos, .seq = seq, .want_logits = want};
        float *logits = all + (size_t)g * hp->n_vocab;
        ok = hr_kv_seq_reserve(kv, s, at + n, &err) == HR_OK && hr_model_forward(c, &b, logits, &err) == HR_OK;
        CHECKF(ok, "%s", err.msg);
        hr_kv_seq_commit(kv, s, tk, n);
        ok = ok && hr_kv_pool_check(kv, &err) == HR_OK;
        at += n;
        int best = 0;
        for (int v = 1; v < hp->n_vocab; v++)
            if (logits[v] > logits[best]) best = v;
        tk[0] = best;
        n = 1;
    }
    *blocks_used = used_blocks(kv);
    hr_model_ctx_destroy(c);
    hr_kv_pool_destroy(kv);
    return ok;
}

static void test_models(void) {
    const char *shapes[] = {"gemma2-tiny", "gemma3-tiny"};
    for (int i = 0; i < 2; i++) {
        hr_synth_shape sh;
        hr_model *m = NULL;
        void *mem = NULL;
        hr_error err = {0};
        CHECK(hr_synth_shape_by_name(shapes[i], &sh, &err) == HR_OK);
        CHECKF(hr_synth_model(&sh, HR_DTYPE_F32, 1, &m, &mem, &err) == HR_OK, "%s", err.msg);
        if (!m) continue;
        const int n_gen = 90, V = hr_model_hparams(m)->n_vocab; /* 97 tokens: six windows of 16 */
        float *a = malloc(sizeof(float) * (size_t)n_gen * V), *b = malloc(sizeof(float) * (size_t)n_gen * V);
        int ua = 0, ub = 0;
        CHECK(a && b && greedy(m, false, n_gen, a, &ua) && greedy(m, true, n_gen, b, &ub));
        CHECKF(a && b && memcmp(a, b, sizeof(float) * (size_t)n_gen * V) == 0, "%s: logits differ", shapes[i]);
        /* at 97 tokens one group keeps all 7 blocks of every layer; the hybrid pool the full groups' 7
         * and, per window group (window 16), the 2 blocks ending past 97 + 1 - 16: gemma2 one full and
         * one window group of 2 layers, gemma3 one full and five window groups of one layer */
        const hr_hparams *hp = hr_model_hparams(m);
        int n_window_groups = i == 0 ? 1 : 5, slots = i == 0 ? 2 : 1;
        CHECKF(ua == 7 && ub == 7 + 2 * n_window_groups, "%s: %d and %d blocks", shapes[i], ua, ub);
        CHECK((uint64_t)ub * slots < (uint64_t)ua * hp->n_layer);
        free(a);
        free(b);
        hr_model_destroy(m);
        free(mem);
    }
}

/* ---- prefix sharing across a window ------------------------------------------------------------ */

static void test_prefix(void) {
    const int32_t win[6] = {32, 32, 32, 32, 32, 0};
    hr_kv_pool *p = make(6, win, 120, 4);
    hr_error err = {0};
    hr_kv_seq a = -1, b = -1, c = -1, d = -1;
    CHECK(hr_kv_seq_create(p, &a, &err) == HR_OK);
    put(p, a, 0, 100); /* window groups dropped blocks 0..3 into the prefix cache */
    hr_kv_seq_ledger la;
    CHECK(hr_kv_seq_get_ledger(p, a, &la, &err) == HR_OK && la.kinds[0].blocks == 5 * 3);
    /* another sequence takes every free block: the cache's oldest (the window's dropped ones) go */
    CHECK(hr_kv_seq_create(p, &c, &err) == HR_OK);
    int n_free = hr_kv_pool_n_free(p);
    CHECK(hr_kv_seq_reserve(p, c, n_free / 6 * B, &err) == HR_OK);
    hr_kv_pool_ledger pl;
    hr_kv_pool_get_ledger(p, &pl);
    CHECK(pl.blocks_cached < 6 && pl.blocks_evicted_total >= 15);
    hr_kv_seq_free(p, c); /* unhashed: back to the free list */
    /* a prompt of A's 100 tokens and one more: the full group's 6 blocks are there, and the window
     * groups need only blocks 4 and 5 (at 96 tokens a query sees positions > 96 - 32): a 96-token hit */
    CHECK(hr_kv_seq_create(p, &b, &err) == HR_OK);
    int32_t prompt[101];
    memcpy(prompt, toks, sizeof(int32_t) * 100);
    prompt[100] = 5;
    int cached = -1;
    CHECKF(hr_kv_seq_share_prefix(p, b, prompt, 101, &cached, &err) == HR_OK, "%s", err.msg);
    CHECK(cached == 96);
    hr_kv_seq_ledger lb;
    CHECK(hr_kv_seq_get_ledger(p, b, &lb, &err) == HR_OK);
    CHECK(lb.kinds[1].blocks == 6 && lb.kinds[0].blocks == 5 * 2 && lb.blocks_shared == 16 && lb.blocks_own == 0 &&
          lb.prefix_hit_tokens == 96 && lb.blocks_window_freed == 0);
    CHECKF(hr_kv_pool_check(p, &err) == HR_OK, "%s", err.msg);
    /* B computes tokens 96..99 as A did: its next query sees what A's sees, bit for bit */
    put(p, b, 96, 100);
    CHECK(hr_kv_seq_reserve(p, a, 101, &err) == HR_OK && hr_kv_seq_reserve(p, b, 101, &err) == HR_OK);
    for (int l = 0; l < 6; l++) {
        hr_kv_write(p, l, a, 100, kd[100], vd[100]);
        hr_kv_write(p, l, b, 100, kd[100], vd[100]);
    }
    CHECK(same_attention(p, a, p, b, 101));
    CHECKF(hr_kv_pool_check(p, &err) == HR_OK, "%s", err.msg);
    /* a 41-token prompt: the full group has blocks 0 and 1, but at 32 tokens (or 16) the window groups
     * need blocks the cache lost: no hit (computing is the only way to get their K/V) */
    CHECK(hr_kv_seq_create(p, &d, &err) == HR_OK);
    CHECK(hr_kv_seq_share_prefix(p, d, toks, 41, &cached, &err) == HR_OK && cached == 0);
    hr_kv_seq_free(p, d);
    /* with the whole prefix still cached (a fresh pool), a long prompt is a hit with the window groups'
     * early blocks as holes from the start */
    hr_kv_pool_destroy(p);
    p = make(6, win, 200, 4);
    CHECK(hr_kv_seq_create(p, &a, &err) == HR_OK && hr_kv_seq_create(p, &b, &err) == HR_OK);
    put(p, a, 0, 100);
    hr_kv_seq_free(p, a);
    CHECK(hr_kv_seq_share_prefix(p, b, prompt, 101, &cached, &err) == HR_OK && cached == 96);
    CHECK(hr_kv_seq_get_ledger(p, b, &lb, &err) == HR_OK && lb.kinds[0].blocks == 10 && lb.kinds[1].blocks == 6);
    CHECKF(hr_kv_pool_check(p, &err) == HR_OK, "%s", err.msg);
    hr_kv_pool_destroy(p);
}

/* ---- swap --------------------------------------------------------------------------------------- */

static void test_swap(void) {
    const int32_t win[6] = {32, 32, 32, 32, 32, 0};
    hr_kv_pool *p = make(6, win, 120, 4);
    hr_error err = {0};
    uint64_t bb = hr_kv_block_bytes(hr_kv_pool_config(p));
    hr_kv_swap *w = NULL;
    hr_kv_swap_config sc = {.budget_bytes = bb * 60};
    CHECKF(hr_kv_swap_create(p, &sc, &w, &err) == HR_OK, "%s", err.msg);
    hr_kv_seq a = -1, ctl = -1;
    CHECK(hr_kv_seq_create(p, &a, &err) == HR_OK && hr_kv_seq_create(p, &ctl, &err) == HR_OK);
    put(p, a, 0, 90); /* a partial last block, and holes in the window groups */
    put(p, ctl, 0, 90);
    int before = used_blocks(p);
    CHECKF(hr_kv_seq_swap_out(p, w, a, &err) == HR_OK, "%s", err.msg);
    hr_kv_seq_ledger l;
    CHECK(hr_kv_seq_get_ledger(p, a, &l, &err) == HR_OK && l.bytes_swapped == (uint64_t)(6 + 5 * 3) * bb);
    CHECK(hr_kv_pool_check(p, &err) == HR_OK);
    CHECK(used_blocks(p) == before - 21); /* every block it held: ctl computed its own copies */
    CHECKF(hr_kv_seq_swap_in(p, a, &err) == HR_OK, "%s", err.msg);
    CHECKF(hr_kv_pool_check(p, &err) == HR_OK, "%s", err.msg);
    CHECK(hr_kv_seq_get_ledger(p, a, &l, &err) == HR_OK && l.kinds[0].blocks == 5 * 3 && l.kinds[1].blocks == 6);
    /* decoding on: the next tokens' attention equals the sequence that never left */
    int bad = 0;
    for (int n = 90; n < 110; n++) {
        CHECK(hr_kv_seq_reserve(p, a, n + 1, &err) == HR_OK && hr_kv_seq_reserve(p, ctl, n + 1, &err) == HR_OK);
        for (int ly = 0; ly < 6; ly++) {
            hr_kv_write(p, ly, a, n, kd[n], vd[n]);
            hr_kv_write(p, ly, ctl, n, kd[n], vd[n]);
        }
        bad += !same_attention(p, a, p, ctl, n + 1);
        hr_kv_seq_commit(p, a, toks + n, 1);
        hr_kv_seq_commit(p, ctl, toks + n, 1);
        bad += hr_kv_pool_check(p, &err) != HR_OK;
    }
    CHECK(bad == 0);
    hr_kv_seq_free(p, a);
    hr_kv_seq_free(p, ctl);
    hr_kv_pool_destroy(p);
    hr_kv_swap_destroy(w);
}

/* ---- policies on a hybrid pool ----------------------------------------------------------------- */

static void test_policies(void) {
    const int32_t win[6] = {32, 32, 32, 32, 32, 0};
    hr_kv_pool *p = make(6, win, 200, 4);
    hr_error err = {0};
    hr_kv_policy pol;
    /* token-level eviction needs full attention: refused with what is valid */
    CHECK(hr_kv_policy_parse("h2o:64", &pol, &err) == HR_OK);
    CHECK(hr_kv_policy_check(p, &pol, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "sliding window"));
    /* window:48 bounds the full group too: every group frees, counted as the policy's evictions */
    CHECK(hr_kv_policy_parse("window:48", &pol, &err) == HR_OK);
    hr_kv_seq s = -1, t = -1;
    CHECK(hr_kv_seq_create(p, &s, &err) == HR_OK && hr_kv_seq_set_policy(p, s, &pol, &err) == HR_OK);
    put(p, s, 0, 150);
    CHECKF(hr_kv_pool_check(p, &err) == HR_OK, "%s", err.msg);
    hr_kv_seq_ledger l;
    CHECK(hr_kv_seq_get_ledger(p, s, &l, &err) == HR_OK);
    /* at 150 tokens: window groups keep blocks ending past 119 (7..9), the full group past 103 (6..9) */
    CHECK(l.kinds[0].blocks == 5 * 3 && l.kinds[1].blocks == 4 && l.blocks_evicted == 5 * 7 + 6 &&
          l.tokens_evicted > 0);
    /* a sequence whose policy dropped blocks comes back only by recompute */
    hr_kv_swap *w = NULL;
    hr_kv_swap_config sc = {.budget_bytes = hr_kv_block_bytes(hr_kv_pool_config(p)) * 40};
    CHECK(hr_kv_swap_create(p, &sc, &w, &err) == HR_OK);
    CHECK(hr_kv_seq_swap_out(p, w, s, &err) == HR_ERR_UNSUPPORTED && strstr(err.msg, "recompute"));
    /* fork copies every group's row, holes included */
    CHECK(hr_kv_seq_fork(p, s, &t, &err) == HR_OK);
    CHECKF(hr_kv_pool_check(p, &err) == HR_OK, "%s", err.msg);
    CHECK(hr_kv_seq_reserve(p, s, 151, &err) == HR_OK && hr_kv_seq_reserve(p, t, 151, &err) == HR_OK);
    for (int ly = 0; ly < 6; ly++) {
        hr_kv_write(p, ly, s, 150, kd[150], vd[150]);
        hr_kv_write(p, ly, t, 150, kd[150], vd[150]);
    }
    CHECK(same_attention(p, s, p, t, 151));
    hr_kv_seq_free(p, s);
    hr_kv_seq_free(p, t);
    CHECK(used_blocks(p) == 0 && hr_kv_pool_check(p, &err) == HR_OK);
    hr_kv_swap_destroy(w);
    hr_kv_pool_destroy(p);
}

/* ---- plan and pool agree ------------------------------------------------------------------------ */

static void test_plan_agrees(void) {
    const char *shapes[] = {"tiny", "gemma2-tiny", "gemma3-tiny", "phi3-tiny", "qwen3-tiny"};
    const int n_ctx = 2048, step = 256;
    for (int i = 0; i < 5; i++) {
        hr_synth_shape sh;
        hr_model *m = NULL;
        void *mem = NULL;
        hr_error err = {0};
        CHECK(hr_synth_shape_by_name(shapes[i], &sh, &err) == HR_OK);
        sh.n_ctx = 4096;
        if (sh.sliding_window > 0) sh.sliding_window = 256; /* the window layers' */
        CHECKF(hr_synth_model(&sh, HR_DTYPE_F32, 1, &m, &mem, &err) == HR_OK, "%s", err.msg);
        if (!m) continue;
        const hr_hparams *hp = hr_model_hparams(m);
        /* the plan */
        hr_plan_model pm = {.hp = *hp, .resident_bytes = 1 << 20};
        hr_plan_device dev = {.mem_bytes = 64ull << 30, .util = 1.0};
        hr_plan_params pp = {.n_ctx = n_ctx,
                             .concurrency = 1,
                             .k_format = HR_RT_KV_F16,
                             .v_format = HR_RT_KV_F16,
                             .block_size = 16,
                             .max_batch_tokens = step};
        hr_plan pl;
        CHECKF(hr_plan_compute(&pm, &dev, &pp, &pl, &err) == HR_OK, "%s", err.msg);
        /* the pool the runtime makes: each layer's window from the model */
        int32_t win[64];
        for (int l = 0; l < hp->n_layer; l++) win[l] = hr_model_layer_attn(m)[l].window;
        hr_kv_config kc = {.n_layers = hp->n_layer,
                           .n_kv_heads = hp->n_head_kv,
                           .head_dim = hp->head_dim,
                           .block_size = 16,
                           .k_format = HR_KV_F16,
                           .v_format = HR_KV_F16,
                           .max_seqs = 1,
                           .max_step_tokens = step,
                           .layer_window = win};
        kc.budget_bytes = hr_kv_block_bytes(&kc) * (uint64_t)(n_ctx / 16 * hp->n_layer + 8);
        hr_kv_pool *p = NULL;
        hr_kv_seq s = -1;
        CHECKF(hr_kv_pool_create(&kc, &p, &err) == HR_OK && hr_kv_seq_create(p, &s, &err) == HR_OK, "%s", err.msg);
        if (!p) continue;
        const hr_kv_groups *g = hr_kv_pool_groups(p);
        CHECK(g->n_groups == pl.groups.n_groups && g->block_bytes == pl.groups.block_bytes &&
              g->n_kinds == pl.groups.n_kinds);
        /* bytes per token per kind: the pool's blocks / B, and all kinds together every layer's */
        uint64_t all = 0;
        for (int k = 0; k < g->n_kinds; k++) {
            uint64_t pool_tb = g->block_bytes * (uint64_t)g->kinds[k].n_groups / 16;
            CHECKF(pool_tb == pl.kind_token_bytes[k], "%s kind %d: %llu vs %llu", shapes[i], k,
                   (unsigned long long)pool_tb, (unsigned long long)pl.kind_token_bytes[k]);
            all += pool_tb;
        }
        CHECK(all == (uint64_t)hp->n_layer * hp->n_head_kv * hp->head_dim * 2 * 2);
        /* one sequence to the context: a first chunk of r tokens, then steps of 256, for every
         * alignment r (the window groups' count depends on it), and the same ending with a whole step
         * at each of the last 16 positions; the peak over every reserve */
        uint64_t peak = 0, kind_peak[HR_KV_MAX_KINDS] = {0};
        int32_t tk[256] = {0};
        for (int r = 0; r < 32; r++) {
            int end = r < 16 ? n_ctx : n_ctx - (r - 16); /* r >= 16: stop short, a whole step last */
            for (int n = 0; n < end;) {
                int first = r < 16 ? r : (end - 1) % step + 1;
                int c = n == 0 && first > 0 ? first : HR_MIN(step, end - n);
                CHECK(hr_kv_seq_reserve(p, s, n + c, &err) == HR_OK);
                hr_kv_seq_ledger l;
                hr_kv_seq_get_ledger(p, s, &l, &err);
                if (l.bytes_now > peak) /* the kinds at the moment of the peak: they add up to it */
                    for (int k = 0; k < l.n_kinds; k++) kind_peak[k] = l.kinds[k].bytes;
                peak = HR_MAX(peak, l.bytes_now);
                hr_kv_seq_commit(p, s, tk, c); /* bookkeeping only: no bytes needed to count them */
                n += c;
            }
            hr_kv_seq_reset(p, s);
        }
        double dev_all = fabs((double)peak - (double)pl.seq_bytes) / (double)pl.seq_bytes;
        CHECKF(dev_all <= 0.01, "%s: pool peak %llu, plan %llu", shapes[i], (unsigned long long)peak,
               (unsigned long long)pl.seq_bytes);
        for (int k = 0; k < g->n_kinds; k++)
            CHECKF(fabs((double)kind_peak[k] - (double)pl.kind_seq_bytes[k]) <= 0.01 * (double)pl.kind_seq_bytes[k],
                   "%s kind %d: %llu vs %llu", shapes[i], k, (unsigned long long)kind_peak[k],
                   (unsigned long long)pl.kind_seq_bytes[k]);
        /* the budget the runtime sizes holds exactly that sequence */
        CHECK(pl.rows[pl.chosen].need.ctx_blocks * pl.groups.block_bytes == pl.seq_bytes);
        if (g->n_groups > 1) CHECK(pl.seq_bytes < (uint64_t)n_ctx * all); /* the windows' saving */
        if (i == 2) CHECK(pl.seq_bytes * 2 < (uint64_t)n_ctx * all);      /* gemma3: 5 of 6 layers windowed */
        hr_kv_pool_destroy(p);
        hr_model_destroy(m);
        free(mem);
    }
}

/* ---- the prefix observer (KV events) on a hybrid pool: every group's blocks, a chain per group ---- */

enum { EVN = 256 };
typedef struct ev_log {
    int n_stored, n_removed;
    uint64_t hash[EVN], parent[EVN], removed[EVN];
    bool has_parent[EVN];
    int group[EVN];
} ev_log;

static void ev_stored(void *ctx, const hr_kv_block_info *b) {
    ev_log *e = ctx;
    if (e->n_stored >= EVN) return;
    e->hash[e->n_stored] = b->hash;
    e->parent[e->n_stored] = b->parent;
    e->has_parent[e->n_stored] = b->has_parent;
    e->group[e->n_stored++] = b->group;
}
static void ev_removed(void *ctx, uint64_t h, int group) {
    ev_log *e = ctx;
    for (int i = 0; i < e->n_stored; i++) /* the group stored named for this hash */
        if (e->hash[i] == h)
            CHECKF(e->group[i] == group, "removed %llx in group %d, stored in %d", (unsigned long long)h, group,
                   e->group[i]);
    if (e->n_removed < EVN) e->removed[e->n_removed++] = h;
}

static bool has_hash(const uint64_t *v, int n, uint64_t h) {
    for (int i = 0; i < n; i++)
        if (v[i] == h) return true;
    return false;
}

static void test_events(void) {
    const int32_t win[4] = {32, 0, 32, 0}; /* group 0: the window layers, group 1: the full ones */
    hr_kv_pool *hy = make(4, win, 16, 2), *one = make(4, NULL, 16, 2);
    if (!hy || !one) return;
    static ev_log eh, eo;
    memset(&eh, 0, sizeof eh);
    memset(&eo, 0, sizeof eo);
    hr_error err = {0};
    hr_kv_observer oh = {.stored = ev_stored, .removed = ev_removed, .ctx = &eh};
    hr_kv_observer oo = {.stored = ev_stored, .removed = ev_removed, .ctx = &eo};
    CHECK(hr_kv_pool_set_observer(hy, &oh, &err) == HR_OK && hr_kv_pool_set_observer(one, &oo, &err) == HR_OK);
    hr_kv_seq s = -1, so = -1;
    CHECK(hr_kv_seq_create(hy, &s, &err) == HR_OK && hr_kv_seq_create(one, &so, &err) == HR_OK);
    put(hy, s, 0, 96);
    put(one, so, 0, 96);
    /* 6 full blocks: one stored event per group and block; the one-group pool's 6 */
    CHECKF(eh.n_stored == 12 && eo.n_stored == 6 && eh.n_removed == 0, "stored %d / %d", eh.n_stored, eo.n_stored);
    uint64_t g_hash[2][6];
    int n_g[2] = {0, 0};
    for (int i = 0; i < eh.n_stored; i++) {
        int g = eh.group[i];
        CHECK(g == 0 || g == 1);
        if (g < 0 || g > 1 || n_g[g] >= 6) continue;
        int j = n_g[g]++;
        g_hash[g][j] = eh.hash[i];
        /* a chain per group: block j's parent is the same group's block j - 1 */
        CHECKF(eh.has_parent[i] == (j > 0) && (j == 0 || eh.parent[i] == g_hash[g][j - 1]), "group %d block %d", g, j);
    }
    CHECK(n_g[0] == 6 && n_g[1] == 6);
    for (int j = 0; j < 6 && n_g[0] == 6 && eo.n_stored == 6; j++) {
        CHECK(g_hash[0][j] == eo.hash[j] && eo.group[j] == 0); /* group 0: a one-group pool's hashes */
        CHECK(g_hash[1][j] != g_hash[0][j] && !has_hash(eo.hash, 6, g_hash[1][j])); /* the group mixed in */
    }
    /* reclaim: the first sequence's blocks cached, another (other scope: other hashes) takes the pool;
     * every removed hash was stored, and the map holds exactly stored minus removed */
    hr_kv_seq_reset(hy, s);
    hr_kv_seq s2 = -1;
    CHECK(hr_kv_seq_create(hy, &s2, &err) == HR_OK && hr_kv_seq_set_scope(hy, s2, 7, &err) == HR_OK);
    for (int t = 0; t < 208; t += B) put(hy, s2, t, t + B); /* a block a step: the window frees as it goes */
    CHECKF(eh.n_removed >= 8, "removed %d", eh.n_removed);
    uint64_t map[64];
    int n_map = hr_kv_pool_prefix_hashes(hy, map, 64);
    int expect = 0;
    for (int i = 0; i < eh.n_stored; i++) {
        bool gone = has_hash(eh.removed, eh.n_removed, eh.hash[i]);
        expect += !gone;
        CHECK(has_hash(map, HR_MIN(n_map, 64), eh.hash[i]) == !gone);
    }
    for (int i = 0; i < eh.n_removed; i++) CHECK(has_hash(eh.hash, eh.n_stored, eh.removed[i]));
    CHECKF(n_map == expect, "map %d, stored - removed %d", n_map, expect);
    CHECK(hr_kv_pool_check(hy, &err) == HR_OK);
    hr_kv_pool_destroy(hy);
    hr_kv_pool_destroy(one);
    /* the shared tier takes a hybrid pool (per group: test_kv_remote): nothing listening is the only error */
    hy = make(4, win, 16, 2);
    hr_kv_remote *rm = NULL;
    hr_kv_remote_params rp = {.url = "redis://127.0.0.1:9", .model_id = "t", .pool = hy};
    CHECK(hy && hr_kv_remote_create(&rp, &rm, &err) == HR_ERR_IO && !rm && strstr(err.msg, "redis://127.0.0.1:9") &&
          !strstr(err.msg, "hybrid"));
    hr_kv_pool_destroy(hy);
}

/* ---- plan --sim on a gemma3 shape: the real runtime's hybrid pool, not one group ---------------- */

static void test_sim_groups(void) {
    hr_synth_shape sh;
    hr_model *m = NULL;
    void *mem = NULL;
    hr_error err = {0};
    CHECK(hr_synth_shape_by_name("gemma3-tiny", &sh, &err) == HR_OK);
    sh.n_ctx = 4096;
    sh.sliding_window = 256;
    CHECKF(hr_synth_model(&sh, HR_DTYPE_F32, 1, &m, &mem, &err) == HR_OK, "%s", err.msg);
    if (!m) return;
    const hr_hparams *hp = hr_model_hparams(m);
    hr_plan_model pm = {.hp = *hp, .resident_bytes = 1 << 20};
    /* a device that holds two sequences of 2048 tokens */
    hr_plan_device dev = {.mem_bytes = 1ull << 40, .util = 1, .bw_gbps = 100, .reserved_bytes = 1 << 20};
    hr_plan_params pp = {.n_ctx = 2048, .concurrency = 2, .max_running = 8, .n_threads = 1, .max_batch_tokens = 256};
    hr_plan *pl = calloc(1, sizeof *pl);
    CHECK(hr_plan_compute(&pm, &dev, &pp, pl, &err) == HR_OK);
    dev.mem_bytes = pl->rows[HR_KV_F16].need.total_bytes;
    CHECK(hr_plan_compute(&pm, &dev, &pp, pl, &err) == HR_OK);
    hr_traffic_req reqs[4];
    for (int i = 0; i < 4; i++)
        reqs[i] = (hr_traffic_req){.t_arrival = 0, .n_prompt = 1900, .n_output = 100, .prefix_id = -1};
    hr_traffic t = {.n = 4, .reqs = reqs};
    hr_sim_candidate cand = {.format = HR_RT_KV_F16, .admission = HR_RT_ADMIT_RESERVE, .max_running = 8};
    hr_cost_model cost = {.bw_gbps = 100, .gflops = 1000, .overhead_s = 0.001, .source = "test"};
    hr_sim_result r;
    CHECKF(hr_sim_run(&pm, pl, &dev, &cost, &t, &cand, &r, &err) == HR_OK, "%s", err.msg);
    /* the real pool in the same memory: the runtime's query, each layer's window from the model */
    int32_t win[64];
    for (int l = 0; l < hp->n_layer; l++) win[l] = hr_model_layer_attn(m)[l].window;
    hr_kv_budget_query q = {.kv = {.n_layers = hp->n_layer,
                                   .n_kv_heads = hp->n_head_kv,
                                   .head_dim = hp->head_dim,
                                   .block_size = 16,
                                   .k_format = HR_KV_F16,
                                   .v_format = HR_KV_F16,
                                   .max_seqs = 8,
                                   .max_step_tokens = 256,
                                   .layer_window = win},
                            .n_ctx = pl->held_ctx,
                            .n_seqs = 1,
                            .mem = {.model = hp,
                                    .weight_bytes = pm.resident_bytes,
                                    .max_batch_tokens = 256,
                                    .n_threads = 1,
                                    .base_bytes = dev.reserved_bytes,
                                    .mem_limit = pl->usable_bytes}};
    hr_kv_budget b;
    CHECKF(hr_kv_budget_compute(&q, &b, &err) == HR_OK, "%s", err.msg);
    CHECKF(r.n_blocks == b.n_blocks && b.block_bytes == 1ull * 2 * 16 * 32 * 2, "sim %d blocks, real pool %d of %llu",
           r.n_blocks, b.n_blocks, (unsigned long long)b.block_bytes);
    /* one group of every layer (what the sim counted before) would give about a sixth of the blocks,
     * each 6 layers: fewer than one 2048-token context, so the budget says HR_ERR_BUDGET */
    q.kv.layer_window = NULL;
    hr_kv_budget one;
    hr_error e2;
    CHECK(hr_kv_budget_compute(&q, &one, &e2) == HR_ERR_BUDGET);
    CHECKF(one.n_blocks * 5 < b.n_blocks, "one group %d, groups %d", one.n_blocks, b.n_blocks);
    /* the stand-in pool holds the groups' blocks: every request completes, the peak at most the pool
     * and each running sequence's blocks in 6 groups (at least its full group's 2000 / 16) */
    CHECKF(r.completed == 4 && r.refused == 0 && r.peak_blocks <= r.n_blocks && r.peak_blocks >= 125 + 5 * 16 &&
               r.peak_kv_bytes == (uint64_t)r.peak_blocks * b.block_bytes,
           "completed %d refused %d peak %d of %d", r.completed, r.refused, r.peak_blocks, r.n_blocks);
    free(pl);
    hr_model_destroy(m);
    free(mem);
}

/* ---- a latent cache (v_from_k, MLA) reports its layers as kind "latent" with their bytes per token -- */

static void test_latent(void) {
    hr_error err = {0};
    /* DeepSeek-V3: 61 layers, one latent of kv_lora_rank 512 + 64 RoPE dims, f16: 61 x 576 x 2 */
    hr_kv_config v3 = {.n_layers = 61,
                       .n_kv_heads = 1,
                       .head_dim = 576,
                       .v_from_k = 512,
                       .block_size = 16,
                       .k_format = HR_KV_F16,
                       .v_format = HR_KV_F16,
                       .max_seqs = 1};
    hr_kv_groups g;
    CHECKF(hr_kv_config_groups(&v3, &g, &err) == HR_OK, "%s", err.msg);
    CHECKF(g.n_kinds == 1 && g.kinds[0].latent && g.kinds[0].window == 0 && g.kinds[0].token_bytes == 70272,
           "kinds %d latent %d token bytes %llu", g.n_kinds, g.kinds[0].latent,
           (unsigned long long)g.kinds[0].token_bytes);
    v3.v_from_k = 0; /* the same shape with V of its own: full, twice the bytes */
    CHECK(hr_kv_config_groups(&v3, &g, &err) == HR_OK && g.n_kinds == 1 && !g.kinds[0].latent &&
          g.kinds[0].token_bytes == 2 * 70272);
    /* deepseek2-tiny: 3 layers of one latent of 32 + 16 f16 values = 288 bytes a token, in the plan
     * (the kind and its bytes) and in the runtime's ledgers */
    hr_synth_shape sh;
    hr_model *m = NULL;
    void *mem = NULL;
    CHECK(hr_synth_shape_by_name("deepseek2-tiny", &sh, &err) == HR_OK);
    CHECKF(hr_synth_model(&sh, HR_DTYPE_F32, 1, &m, &mem, &err) == HR_OK, "%s", err.msg);
    if (!m) return;
    hr_plan_model pm = {.hp = *hr_model_hparams(m), .resident_bytes = 1 << 20};
    hr_plan_device dev = {.mem_bytes = 64ull << 30, .util = 1.0};
    hr_plan_params pp = {.n_ctx = 256,
                         .concurrency = 1,
                         .k_format = HR_RT_KV_F16,
                         .v_format = HR_RT_KV_F16,
                         .block_size = 16,
                         .max_batch_tokens = 256};
    hr_plan pl;
    CHECKF(hr_plan_compute(&pm, &dev, &pp, &pl, &err) == HR_OK, "%s", err.msg);
    CHECKF(pl.groups.n_kinds == 1 && pl.groups.kinds[0].latent && pl.kind_token_bytes[0] == 288 &&
               pl.groups.kinds[0].token_bytes == 288 && pl.seq_bytes == 256ull * 288,
           "plan: latent %d, %llu bytes a token, %llu a sequence", pl.groups.kinds[0].latent,
           (unsigned long long)pl.kind_token_bytes[0], (unsigned long long)pl.seq_bytes);
    hr_runtime_params p = hr_runtime_default_params();
    p.model = m;
    p.n_ctx = 256;
    p.kv_seqs = 1;
    p.n_threads = 2;
    hr_runtime *rt = NULL;
    CHECKF(hr_runtime_open(&p, &rt, NULL, &err) == HR_OK, "%s", err.msg);
    if (rt) {
        int32_t ids[40];
        for (int i = 0; i < 40; i++) ids[i] = 3 + (i * 11) % 500;
        hr_rt_request_params rp = {.prompt_ids = ids, .n_prompt_ids = 40, .max_tokens = 8, .ignore_eos = true};
        rp.sampling = hr_rt_sampling_default();
        rp.sampling.temperature = 0;
        hr_rt_request *r = NULL;
        CHECKF(hr_runtime_submit(rt, &rp, &r, &err) == HR_OK, "%s", err.msg);
        CHECK(hr_runtime_run_until_idle(rt, &err) == HR_OK);
        hr_rt_result res;
        if (r) {
            hr_rt_request_result(r, &res);
            /* 47 tokens at its last step: 3 blocks of 16 tokens x 288 bytes */
            CHECKF(res.state == HR_RT_COMPLETED && res.kv.n_kinds == 1 && res.kv.kinds[0].latent &&
                       res.kv.kinds[0].token_bytes == 288 && res.kv.kinds[0].n_layers == 3 &&
                       res.kv.kinds[0].blocks == 3 && res.kv.kinds[0].bytes == 3ull * 16 * 288,
                   "usage.kv: kinds %d latent %d token bytes %llu blocks %d", res.kv.n_kinds, res.kv.kinds[0].latent,
                   (unsigned long long)res.kv.kinds[0].token_bytes, res.kv.kinds[0].blocks);
            hr_runtime_pool pool;
            hr_runtime_get_pool(rt, &pool);
            CHECK(pool.ledger.n_groups == 1 && pool.ledger.n_kinds == 1 && pool.ledger.kinds[0].latent &&
                  pool.ledger.kinds[0].token_bytes == 288);
            hr_rt_request_release(rt, r);
        }
        hr_runtime_close(rt);
    }
    hr_model_destroy(m);
    free(mem);
}

/* ---- the runtime: a gemma3 model gets a hybrid pool; usage.kv and the pool ledger by kind ------- */

static void test_runtime(void) {
    hr_synth_shape sh;
    hr_model *m = NULL;
    void *mem = NULL;
    hr_error err = {0};
    CHECK(hr_synth_shape_by_name("gemma3-tiny", &sh, &err) == HR_OK);
    CHECKF(hr_synth_model(&sh, HR_DTYPE_F32, 1, &m, &mem, &err) == HR_OK, "%s", err.msg);
    if (!m) return;
    hr_runtime_params p = hr_runtime_default_params();
    p.model = m;
    p.n_ctx = 256;
    p.kv_seqs = 2;
    p.n_threads = 2;
    hr_runtime *rt = NULL;
    CHECKF(hr_runtime_open(&p, &rt, NULL, &err) == HR_OK, "%s", err.msg);
    if (!rt) {
        hr_model_destroy(m);
        free(mem);
        return;
    }
    /* the budget: 2 sequences of 256 tokens, the window groups counted at their window */
    const hr_kv_budget *b = hr_runtime_budget(rt);
    CHECK(b->block_bytes == 1ull * 1 * 2 * 16 * 32 * 2 && b->token_bytes == 6ull * 2 * 32 * 2);
    int32_t ids[100];
    for (int i = 0; i < 100; i++) ids[i] = 3 + (i * 11) % 500;
    hr_rt_request_params rp = {.prompt_ids = ids, .n_prompt_ids = 100, .max_tokens = 40, .ignore_eos = true};
    rp.sampling = hr_rt_sampling_default();
    rp.sampling.temperature = 0;
    hr_rt_request *r = NULL;
    CHECKF(hr_runtime_submit(rt, &rp, &r, &err) == HR_OK, "%s", err.msg);
    CHECK(hr_runtime_run_until_idle(rt, &err) == HR_OK);
    hr_rt_result res;
    hr_rt_request_result(r, &res);
    CHECK(res.state == HR_RT_COMPLETED && res.n_ids == 40);
    /* at its last step 139 tokens: the full group 9 blocks; each window group (16 tokens) 2 */
    CHECKF(res.kv.n_kinds == 2 && res.kv.kinds[0].window == 16 && res.kv.kinds[0].n_layers == 5 &&
               res.kv.kinds[1].window == 0 && res.kv.kinds[1].n_layers == 1 && res.kv.kinds[1].blocks == 9 &&
               res.kv.kinds[0].blocks <= 5 * 3 && res.kv.window_blocks_freed >= 5 * 6,
           "kinds %d: window %d blocks, full %d blocks, freed %d", res.kv.n_kinds, res.kv.kinds[0].blocks,
           res.kv.kinds[1].blocks, res.kv.window_blocks_freed);
    CHECK(res.kv.bytes_now == (uint64_t)(res.kv.kinds[0].blocks + res.kv.kinds[1].blocks) * b->block_bytes);
    hr_runtime_pool pool;
    hr_runtime_get_pool(rt, &pool);
    CHECK(pool.ledger.n_groups == 6 && pool.ledger.n_kinds == 2 && pool.ledger.window_blocks_freed_total >= 30);
    /* the same prompt again: a prefix hit across the window (96 of its 100 tokens: the full group's
     * 6 blocks, the window groups' last ones, cached when the first request ended), the same ids */
    hr_rt_request *r2 = NULL;
    CHECKF(hr_runtime_submit(rt, &rp, &r2, &err) == HR_OK, "%s", err.msg);
    CHECK(hr_runtime_run_until_idle(rt, &err) == HR_OK);
    hr_rt_result res2;
    hr_rt_request_result(r2, &res2);
    CHECK(res2.state == HR_RT_COMPLETED && res2.kv.prefix_hit_tokens == 96 && res2.n_ids == res.n_ids);
    CHECK(res2.n_ids == res.n_ids && memcmp(res2.ids, res.ids, sizeof(int32_t) * (size_t)res.n_ids) == 0);
    hr_rt_request_release(rt, r2);
    hr_rt_request_release(rt, r);
    hr_runtime_close(rt);
    hr_model_destroy(m);
    free(mem);
}

/* ---- the engine preempting hybrid sequences: swap and recompute give the ids of a roomy pool ------ */

/* 6 requests of 20 prompt + 100 output tokens on gemma3-tiny; ids[6][100]; preemptions of that mode. */
static uint64_t run_six(const hr_model *m, int kv_blocks, hr_rt_preempt mode, int32_t ids[6][100]) {
    hr_runtime_params p = hr_runtime_default_params();
    p.model = m;
    p.n_ctx = 128;
    p.kv_seqs = 6;
    p.kv_blocks = kv_blocks;
    p.n_threads = 2;
    p.max_batch_tokens = 64;
    p.admission = HR_RT_ADMIT_OPTIMISTIC; /* grow, preempt on exhaustion */
    p.preempt = mode;
    hr_runtime *rt = NULL;
    hr_error err = {0};
    CHECKF(hr_runtime_open(&p, &rt, NULL, &err) == HR_OK, "%s", err.msg);
    if (!rt) return 0;
    hr_rt_request *r[6] = {0};
    for (int i = 0; i < 6; i++) {
        int32_t prompt[20];
        for (int t = 0; t < 20; t++) prompt[t] = 3 + (t * 13 + i * 7) % 500;
        hr_rt_request_params rp = {.prompt_ids = prompt, .n_prompt_ids = 20, .max_tokens = 100, .ignore_eos = true};
        rp.sampling = hr_rt_sampling_default();
        rp.sampling.temperature = 0;
        CHECKF(hr_runtime_submit(rt, &rp, &r[i], &err) == HR_OK, "%s", err.msg);
    }
    CHECK(hr_runtime_run_until_idle(rt, &err) == HR_OK);
    for (int i = 0; i < 6; i++) {
        hr_rt_result res;
        hr_rt_request_result(r[i], &res);
        CHECK(res.state == HR_RT_COMPLETED && res.n_ids == 100);
        for (int t = 0; t < 100 && t < res.n_ids; t++) ids[i][t] = res.ids[t];
        hr_rt_request_release(rt, r[i]);
    }
    hr_runtime_pool pool;
    hr_runtime_get_pool(rt, &pool);
    hr_runtime_close(rt);
    /* preemptions of the mode asked for (a swap refused would have fallen back to recompute) */
    return mode == HR_RT_PREEMPT_SWAP ? pool.engine.preempt_swap : pool.engine.preempt_recompute;
}

static void test_engine_preempt(void) {
    hr_synth_shape sh;
    hr_model *m = NULL;
    void *mem = NULL;
    hr_error err = {0};
    CHECK(hr_synth_shape_by_name("gemma3-tiny", &sh, &err) == HR_OK);
    CHECKF(hr_synth_model(&sh, HR_DTYPE_F32, 1, &m, &mem, &err) == HR_OK, "%s", err.msg);
    if (!m) return;
    static int32_t roomy[6][100], swapped[6][100], recomputed[6][100];
    /* a sequence at 120 tokens holds 8 full-group blocks and 2 in each of 5 window groups: 600 blocks
     * hold all six at once; 40 admit three after their prompts (12 each), which then outgrow it */
    CHECK(run_six(m, 600, HR_RT_PREEMPT_RECOMPUTE, roomy) == 0);
    CHECK(run_six(m, 40, HR_RT_PREEMPT_SWAP, swapped) > 0);
    CHECK(run_six(m, 40, HR_RT_PREEMPT_RECOMPUTE, recomputed) > 0);
    CHECK(memcmp(roomy, swapped, sizeof roomy) == 0);
    CHECK(memcmp(roomy, recomputed, sizeof roomy) == 0);
    hr_model_destroy(m);
    free(mem);
}

int main(void) {
    hr_rng r;
    hr_rng_seed(&r, 11);
    for (int t = 0; t < NT; t++) {
        toks[t] = 1 + (t * 37) % 500;
        for (int i = 0; i < HKV * D; i++) {
            kd[t][i] = hr_rng_normal(&r);
            vd[t][i] = hr_rng_normal(&r);
        }
    }
    test_groups();
    test_window_freeing(HR_KV_F16);
    test_window_freeing(HR_KV_Q4); /* encoded when a block fills: tail buffers per group */
    test_window_freeing(HR_KV_KIVI2);
    test_window_freeing(HR_KV_Q8);
    test_models();
    test_prefix();
    test_swap();
    test_policies();
    test_plan_agrees();
    test_latent();
    test_sim_groups();
    test_events();
    test_runtime();
    test_engine_preempt();
    return hr_test_finish();
}

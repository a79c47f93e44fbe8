/* test_kv_swap.c: the swap tier: a bit-exact round trip in every format (attention before and after,
 * and decoding on afterwards, equal a sequence that never left), shared prefixes surviving a swap,
 * budgets (BUDGET when it could never fit, FULL when it does not fit now, nothing changed on error),
 * slots returned when a swapped sequence is freed, and the ledger's bytes_swapped. */
#include <math.h>
#include <string.h>

#include "common/util.h"
#include "harness.h"
#include "kv/kv.h"

enum { HKV = 2, D = 16, H = 4, NT = 60 };

static float kd[NT][HKV * D], vd[NT][HKV * D];

static void put(hr_kv_pool *p, hr_kv_seq s, int from, int to) {
    hr_error err = {0};
    const hr_kv_config *c = hr_kv_pool_config(p);
    CHECKF(hr_kv_seq_reserve(p, s, to, &err) == HR_OK, "%s", err.msg);
    for (int t = from; t < to; t++)
        for (int l = 0; l < c->n_layers; l++) hr_kv_write(p, l, s, t, kd[t], vd[t]);
    int32_t tok[NT];
    for (int t = 0; t < NT; t++) tok[t] = t % 7;
    hr_kv_seq_commit(p, s, tok + from, to - from);
}

/* 1 when a and b give identical attention for every n_ctx in [1, n] and every layer */
static int same_attention(hr_kv_pool *p, hr_kv_seq a, hr_kv_seq b, int n) {
    float q[H * D], oa[H * D], ob[H * D], scratch[512];
    for (int i = 0; i < H * D; i++) q[i] = sinf((float)i);
    for (int l = 0; l < hr_kv_pool_config(p)->n_layers; l++)
        for (int t = 1; t <= n; t++) {
            hr_kv_attention(p, l, a, t, q, H, 0.25f, oa, scratch);
            hr_kv_attention(p, l, b, t, q, H, 0.25f, ob, scratch);
            if (memcmp(oa, ob, sizeof oa) != 0) return 0;
        }
    return 1;
}

static hr_kv_pool *make(hr_kv_format f, int n_blocks) {
    hr_kv_config c = {
        .n_layers = 2, .n_kv_heads = HKV, .head_dim = D, .block_size = 16, .k_format = f, .v_format = f, .max_seqs = 4};
    c.budget_bytes = hr_kv_block_bytes(&c) * (uint64_t)n_blocks + hr_kv_fixed_bytes(&c);
    hr_kv_pool *p = NULL;
    hr_error err = {0};
    CHECK(hr_kv_pool_create(&c, &p, &err) == HR_OK);
    return p;
}

static void test_round_trip(hr_kv_format f, const char *path) {
    hr_kv_pool *p = make(f, 16);
    hr_error err = {0};
    uint64_t bb = hr_kv_block_bytes(hr_kv_pool_config(p));
    hr_kv_swap *w = NULL;
    hr_kv_swap_config sc = {.path = path, .budget_bytes = bb * 40};
    CHECKF(hr_kv_swap_create(p, &sc, &w, &err) == HR_OK, "%s", err.msg);
    hr_kv_seq a = -1, ctl = -1;
    CHECK(hr_kv_seq_create(p, &a, &err) == HR_OK && hr_kv_seq_create(p, &ctl, &err) == HR_OK);
    put(p, a, 0, 45); /* 2 full blocks and a partial one (in its f16 tail buffer for q4/kivi2) */
    put(p, ctl, 0, 45);
    CHECK(same_attention(p, a, ctl, 45));
    hr_kv_pool_ledger before, out;
    hr_kv_pool_get_ledger(p, &before);
    CHECK(hr_kv_seq_swap_out(p, w, a, &err) == HR_OK);
    CHECK(hr_kv_seq_is_swapped(p, a) && hr_kv_seq_n_tokens(p, a) == 45);
    hr_kv_pool_get_ledger(p, &out);
    CHECK(out.blocks_used == before.blocks_used - 3);
    CHECK(out.bytes_swapped > 0);
    hr_kv_seq_ledger sl;
    CHECK(hr_kv_seq_get_ledger(p, a, &sl, &err) == HR_OK);
    CHECK(sl.bytes_swapped == out.bytes_swapped && sl.bytes_now == 0 && sl.tokens_resident == 0 &&
          sl.tokens_total == 45 && sl.bytes_peak >= 3 * bb);
    CHECK(hr_kv_seq_reserve(p, a, 50, &err) == HR_ERR_INVALID_ARG);
    CHECK(hr_kv_pool_check(p, &err) == HR_OK);
    /* churn the pool so the blocks come back elsewhere */
    hr_kv_seq x;
    CHECK(hr_kv_seq_create(p, &x, &err) == HR_OK);
    put(p, x, 0, 30);
    CHECK(hr_kv_seq_swap_in(p, a, &err) == HR_OK);
    hr_kv_seq_free(p, x);
    CHECK(!hr_kv_seq_is_swapped(p, a));
    hr_kv_pool_get_ledger(p, &out);
    CHECK(out.bytes_swapped == 0);
    CHECKF(same_attention(p, a, ctl, 45), "%s: attention differs after the round trip", hr_kv_format_name(f));
    put(p, a, 45, NT); /* decoding goes on, across the block the tail buffer held */
    put(p, ctl, 45, NT);
    CHECKF(same_attention(p, a, ctl, NT), "%s: decoding after swap-in differs", hr_kv_format_name(f));
    hr_kv_swap_ledger wl;
    hr_kv_swap_get_ledger(w, &wl);
    CHECK(wl.slots_used == 0 && wl.blocks_out_total == 3 && wl.blocks_in_total == 3);
    CHECK(hr_kv_pool_check(p, &err) == HR_OK);
    hr_kv_pool_destroy(p);
    hr_kv_swap_destroy(w);
}

static void test_shared_and_budgets(void) {
    hr_kv_pool *p = make(HR_KV_F16, 12);
    hr_error err = {0};
    uint64_t bb = hr_kv_block_bytes(hr_kv_pool_config(p));
    hr_kv_swap *w = NULL;
    hr_kv_swap_config sc = {.budget_bytes = bb - 1};
    CHECK(hr_kv_swap_create(p, &sc, &w, &err) == HR_ERR_BUDGET);
    sc.budget_bytes = bb * 3 + bb / 2; /* 3 slots */
    CHECK(hr_kv_swap_create(p, &sc, &w, &err) == HR_OK);
    hr_kv_seq a = -1, b = -1, c = -1;
    CHECK(hr_kv_seq_create(p, &a, &err) == HR_OK);
    put(p, a, 0, 40);
    /* b shares a's two full blocks, then adds its own */
    int32_t tok[NT];
    for (int t = 0; t < NT; t++) tok[t] = t % 7;
    int got = 0;
    CHECK(hr_kv_seq_create(p, &b, &err) == HR_OK);
    CHECK(hr_kv_seq_share_prefix(p, b, tok, 40, &got, &err) == HR_OK && got == 32);
    put(p, b, 32, 40);
    hr_kv_pool_ledger l0, l1;
    hr_kv_pool_get_ledger(p, &l0);
    CHECK(hr_kv_seq_swap_out(p, w, b, &err) == HR_OK); /* 3 slots: all of them */
    hr_kv_pool_get_ledger(p, &l1);
    CHECK(l1.blocks_used == l0.blocks_used - 1); /* only b's own tail left the pool; a keeps the shared two */
    CHECK(hr_kv_seq_create(p, &c, &err) == HR_OK);
    put(p, c, 0, 5);
    CHECK(hr_kv_seq_swap_out(p, w, c, &err) == HR_ERR_FULL); /* the tier is full now */
    CHECK(!hr_kv_seq_is_swapped(p, c) && hr_kv_seq_n_tokens(p, c) == 5);
    CHECK(hr_kv_seq_swap_out(p, w, a, &err) == HR_ERR_FULL);
    CHECK(hr_kv_seq_swap_in(p, b, &err) == HR_OK);
    CHECK(same_attention(p, a, b, 40));
    /* a sequence longer than the whole tier: BUDGET, never FULL */
    hr_kv_seq_free(p, c);
    CHECK(hr_kv_seq_create(p, &c, &err) == HR_OK);
    put(p, c, 0, 60);
    CHECK(hr_kv_seq_swap_out(p, w, c, &err) == HR_ERR_BUDGET);
    CHECKF(strstr(err.msg, "in all") != NULL, "%s", err.msg);
    hr_kv_seq_free(p, c);
    /* swap-in when the pool is full: FULL and nothing changed */
    CHECK(hr_kv_seq_swap_out(p, w, b, &err) == HR_OK);
    CHECK(hr_kv_seq_create(p, &c, &err) == HR_OK);
    int n_free = hr_kv_pool_n_free(p);
    CHECK(hr_kv_seq_reserve(p, c, n_free * 16, &err) == HR_OK);
    CHECK(hr_kv_seq_swap_in(p, b, &err) == HR_ERR_FULL);
    CHECK(hr_kv_seq_is_swapped(p, b));
    CHECK(hr_kv_pool_check(p, &err) == HR_OK);
    /* freeing a swapped sequence returns its slots */
    hr_kv_seq_free(p, b);
    hr_kv_swap_ledger wl;
    hr_kv_swap_get_ledger(w, &wl);
    CHECK(wl.slots_used == 0 && wl.slots_total == 3);
    hr_kv_pool_ledger l2;
    hr_kv_pool_get_ledger(p, &l2);
    CHECK(l2.bytes_swapped == 0);
    CHECK(hr_kv_pool_check(p, &err) == HR_OK);
    hr_kv_pool_destroy(p);
    hr_kv_swap_destroy(w);
    hr_kv_swap_config bad = {.path = "/nonexistent-dir/x", .budget_bytes = 1 << 20};
    p = make(HR_KV_F16, 2);
    CHECK(hr_kv_swap_create(p, &bad, &w, &err) == HR_ERR_IO);
    hr_kv_pool_destroy(p);
}

int main(void) {
    hr_rng r;
    hr_rng_seed(&r, 5);
    for (int t = 0; t < NT; t++)
        for (int i = 0; i < HKV * D; i++) {
            kd[t][i] = hr_rng_normal(&r) + (i % 5 == 0 ? 4.0f : 0.0f);
            vd[t][i] = hr_rng_normal(&r);
        }
    char path[4096];
    snprintf(path, sizeof path, "%s/swap.bin", hr_test_tmpdir());
    for (int f = 0; f < HR_KV_FORMAT_COUNT; f++) test_round_trip((hr_kv_format)f, f % 2 ? path : NULL);
    test_shared_and_budgets();
    return hr_test_finish();
}

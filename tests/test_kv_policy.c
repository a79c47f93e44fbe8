/* test_kv_policy.c: eviction policies on hand-made inputs.
 *   - parsing and checking: valid strings, and errors that say what is valid;
 *   - window and sinks: attention equals a float64 reference attention restricted to the kept
 *     positions (positions > p - W, and < S) at every step of a decode, blocks leave the table and
 *     the sequence never holds more than the window needs; a window wider than the context is
 *     bit-identical to full; a model sliding window per layer;
 *   - h2o and snapkv: queries that attend to known tokens; exactly those tokens survive, the rest of
 *     the budget is the recent (h2o) or observation (snapkv) window, fully evicted blocks are freed,
 *     and attention equals the reference over the survivors;
 *   - randomized operations with every policy: the pool invariants (hr_kv_pool_check) hold. */
#include <math.h>
#include <string.h>

#include "common/util.h"
#include "harness.h"
#include "kv/kv.h"

enum { NMAX = 256, HMAX = 8, DMAX = 16 };

/* float64 attention over the positions with keep[t] != 0 (t < n_ctx). K, V: [n][Hkv][D]. */
static void ref_attention(const float *K, const float *V, const bool *keep, int n_ctx, int Hkv, int D, const float *q,
                          int H, double scale, double *out) {
    int group = H / Hkv;
    double s[NMAX];
    for (int h = 0; h < H; h++) {
        int kh = h / group;
        double mx = -INFINITY;
        for (int t = 0; t < n_ctx; t++) {
            if (!keep[t]) continue;
            double d = 0;
            for (int c = 0; c < D; c++) d += (double)q[h * D + c] * K[((size_t)t * Hkv + kh) * D + c];
            s[t] = d * scale;
            mx = fmax(mx, s[t]);
        }
        double sum = 0;
        for (int t = 0; t < n_ctx; t++)
            if (keep[t]) sum += (s[t] = exp(s[t] - mx));
        for (int c = 0; c < D; c++) {
            double o = 0;
            for (int t = 0; t < n_ctx; t++)
                if (keep[t]) o += s[t] * V[((size_t)t * Hkv + kh) * D + c];
            out[h * D + c] = o / sum;
        }
    }
}

static hr_kv_pool *make_pool(int L, int Hkv, int D, int B, hr_kv_format f, int n_blocks, int max_seqs) {
    hr_kv_config c = {.n_layers = L,
                      .n_kv_heads = Hkv,
                      .head_dim = D,
                      .block_size = B,
                      .k_format = f,
                      .v_format = f,
                      .max_seqs = max_seqs};
    c.budget_bytes = hr_kv_fixed_bytes(&c) + hr_kv_block_bytes(&c) * (uint64_t)n_blocks;
    hr_kv_pool *p = NULL;
    hr_error err = {0};
    if (hr_kv_pool_create(&c, &p, &err) != HR_OK) {
        fprintf(stderr, "pool: %s\n", err.msg);
        exit(1);
    }
    return p;
}

static double max_err(const float *a, const double *b, int n) {
    double w = 0;
    for (int i = 0; i < n; i++) w = fmax(w, fabs(a[i] - b[i]));
    return w;
}

/* ---- parsing --------------------------------------------------------------------------------------- */

static void test_parse(void) {
    hr_kv_policy pol;
    hr_error err = {0};
    char buf[64];
    CHECK(hr_kv_policy_parse("full", &pol, &err) == HR_OK && pol.kind == HR_KV_POLICY_FULL);
    CHECK(hr_kv_policy_parse("window:256", &pol, &err) == HR_OK && pol.kind == HR_KV_POLICY_WINDOW &&
          pol.window == 256);
    CHECK(hr_kv_policy_parse("sinks:4,window:64", &pol, &err) == HR_OK && pol.kind == HR_KV_POLICY_SINKS &&
          pol.sinks == 4 && pol.window == 64);
    CHECK(!strcmp(hr_kv_policy_str(&pol, buf, sizeof buf), "sinks:4,window:64"));
    CHECK(hr_kv_policy_parse("window:64,sinks:4", &pol, &err) == HR_OK && pol.kind == HR_KV_POLICY_SINKS);
    CHECK(hr_kv_policy_parse("h2o:128", &pol, &err) == HR_OK && pol.kind == HR_KV_POLICY_H2O && pol.budget == 128);
    CHECK(hr_kv_policy_parse("snapkv:128", &pol, &err) == HR_OK && pol.kind == HR_KV_POLICY_SNAPKV &&
          pol.budget == 128 && pol.window == 0);
    CHECK(hr_kv_policy_parse("snapkv:128,window:16", &pol, &err) == HR_OK && pol.window == 16);
    CHECK(!strcmp(hr_kv_policy_str(&pol, buf, sizeof buf), "snapkv:128,window:16"));
    const char *bad[] = {
        "",      "lru:5",   "window",        "window:",         "window:x",       "window:-3",
        "h2o:0", "sinks:4", "sinks:4,h2o:8", "h2o:8,window:64", "full,window:64", "window:8,window:16"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        hr_status st = hr_kv_policy_parse(bad[i], &pol, &err);
        CHECKF(st == HR_ERR_INVALID_ARG, "'%s' parsed", bad[i]);
        CHECKF(st == HR_OK || strstr(err.msg, "window:") || strstr(err.msg, "positive"), "'%s': %s", bad[i], err.msg);
    }
    CHECK(hr_kv_policy_parse("h2o:0", &pol, &err) != HR_OK && strstr(err.msg, "keeps nothing"));
    CHECK(hr_kv_policy_parse("lru:5", &pol, &err) != HR_OK && strstr(err.msg, "unknown") && strstr(err.msg, "h2o:B"));

    hr_kv_pool *p = make_pool(2, 2, 8, 16, HR_KV_F32, 8, 2);
    hr_kv_policy_parse("window:8", &pol, &err);
    CHECK(hr_kv_policy_check(p, &pol, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "smaller than one block"));
    hr_kv_policy_parse("window:16", &pol, &err);
    CHECK(hr_kv_policy_check(p, &pol, &err) == HR_OK);
    hr_kv_policy_parse("h2o:1", &pol, &err);
    CHECK(hr_kv_policy_check(p, &pol, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "at least 2"));
    hr_kv_policy_parse("snapkv:16,window:16", &pol, &err);
    CHECK(hr_kv_policy_check(p, &pol, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "smaller than the budget"));
    /* a model with its own sliding window cannot take token eviction or a wider window */
    CHECK(hr_kv_pool_set_sliding_window(p, -1, 64, &err) == HR_OK);
    hr_kv_policy_parse("h2o:32", &pol, &err);
    CHECK(hr_kv_policy_check(p, &pol, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "sliding window of 64"));
    hr_kv_policy_parse("window:128", &pol, &err);
    CHECK(hr_kv_pool_set_default_policy(p, &pol, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "W <= 64"));
    hr_kv_policy_parse("sinks:4,window:32", &pol, &err);
    CHECK(hr_kv_pool_set_default_policy(p, &pol, &err) == HR_OK);
    hr_kv_seq s;
    CHECK(hr_kv_seq_create(p, &s, &err) == HR_OK && hr_kv_seq_policy(p, s).kind == HR_KV_POLICY_SINKS);
    CHECK(hr_kv_pool_set_sliding_window(p, 2, 64, &err) == HR_ERR_INVALID_ARG);
    hr_kv_pool_destroy(p);
}

/* ---- window and sinks ------------------------------------------------------------------------------ */

/* Decodes N tokens one at a time under `policy` in every layer and checks each step's attention
 * against the reference over the positions the layer keeps. native[l]: model window per layer. */
static void run_window(const char *policy, hr_kv_format fmt, double tol, const int *native, int N) {
    enum { L = 2, HKV = 2, H = 4, D = 8, B = 16 };
    hr_kv_pool *p = make_pool(L, HKV, D, B, fmt, 24, 2);
    hr_error err = {0};
    hr_kv_policy pol;
    CHECK(hr_kv_policy_parse(policy, &pol, &err) == HR_OK);
    for (int l = 0; native && l < L; l++) hr_kv_pool_set_sliding_window(p, l, native[l], &err);
    hr_kv_seq s;
    CHECK(hr_kv_seq_create(p, &s, &err) == HR_OK);
    CHECKF(hr_kv_seq_set_policy(p, s, &pol, &err) == HR_OK, "%s: %s", policy, err.msg);
    hr_rng rng;
    hr_rng_seed(&rng, 11);
    static float K[L][NMAX][HKV][D], V[L][NMAX][HKV][D];
    float q[H * D], out[H * D], scratch[NMAX + 64];
    double ref[H * D];
    bool keep[NMAX];
    int S = pol.kind == HR_KV_POLICY_SINKS ? pol.sinks : 0, max_blocks = 0;
    double worst = 0;
    for (int t = 0; t < N; t++) {
        CHECK(hr_kv_seq_reserve(p, s, t + 1, &err) == HR_OK);
        for (int l = 0; l < L; l++) {
            float *kt = &K[l][t][0][0], *vt = &V[l][t][0][0];
            for (int i = 0; i < HKV * D; i++) kt[i] = hr_rng_normal(&rng), vt[i] = hr_rng_normal(&rng);
            hr_kv_write(p, l, s, t, &K[l][t][0][0], &V[l][t][0][0]);
        }
        for (int l = 0; l < L; l++) {
            for (int i = 0; i < H * D; i++) q[i] = hr_rng_normal(&rng);
            CHECK(hr_kv_seq_attention_scratch_floats(p, s, t + 1) <= sizeof scratch / sizeof *scratch);
            hr_kv_attention(p, l, s, t + 1, q, H, 0.35f, out, scratch);
            int W = pol.kind == HR_KV_POLICY_FULL ? 0 : pol.window;
            if (native && native[l] && (W == 0 || native[l] < W)) W = native[l];
            for (int u = 0; u <= t; u++) keep[u] = W == 0 || u > t - W || u < S;
            ref_attention(&K[l][0][0][0], &V[l][0][0][0], keep, t + 1, HKV, D, q, H, 0.35, ref);
            worst = fmax(worst, max_err(out, ref, H * D));
        }
        int32_t tok = t % 7;
        hr_kv_seq_commit(p, s, &tok, 1);
        CHECK(hr_kv_pool_check(p, &err) == HR_OK);
        hr_kv_seq_ledger lg;
        hr_kv_seq_get_ledger(p, s, &lg, &err);
        int blocks = lg.blocks_own + lg.blocks_shared;
        max_blocks = blocks > max_blocks ? blocks : max_blocks;
    }
    CHECKF(worst < tol, "%s %s: max error %g", policy, hr_kv_format_name(fmt), worst);
    hr_kv_seq_ledger lg;
    hr_kv_seq_get_ledger(p, s, &lg, &err);
    int W = 0; /* the widest layer window; 0 when some layer sees everything */
    for (int l = 0; l < L; l++) {
        int w = pol.kind == HR_KV_POLICY_FULL ? 0 : pol.window;
        if (native && native[l] && (w == 0 || native[l] < w)) w = native[l];
        if (w == 0) {
            W = 0;
            break;
        }
        W = w > W ? w : W;
    }
    if (W > 0) {
        int bound = (S + B - 1) / B + (W + B - 1) / B + 1;
        CHECKF(max_blocks <= bound, "%s: held %d blocks, the window needs %d", policy, max_blocks, bound);
        /* the next query (at N) sees the sinks and positions > N - W */
        CHECKF(lg.blocks_evicted > 0 && lg.tokens_evicted == N + 1 - W - S, "%s: evicted %d tokens %d blocks", policy,
               lg.tokens_evicted, lg.blocks_evicted);
        CHECK(lg.tokens_kept_max == S + W - 1 && lg.tokens_resident == N - lg.tokens_evicted);
        CHECK(lg.bytes_now <= (uint64_t)bound * hr_kv_block_bytes(hr_kv_pool_config(p)));
    } else {
        CHECK(lg.blocks_evicted == 0 && lg.tokens_evicted == 0);
    }
    hr_kv_pool_ledger pl;
    hr_kv_pool_get_ledger(p, &pl);
    CHECK(pl.policy_blocks_evicted_total == (uint64_t)lg.blocks_evicted);
    hr_kv_seq_free(p, s);
    CHECK(hr_kv_pool_check(p, &err) == HR_OK);
    hr_kv_pool_destroy(p);
}

/* window:W with W >= the context is the full path bit for bit. */
static void test_window_equals_full(void) {
    enum { L = 1, HKV = 2, H = 4, D = 8, N = 70 };
    hr_kv_pool *p = make_pool(L, HKV, D, 16, HR_KV_F16, 16, 2);
    hr_error err = {0};
    hr_kv_seq a, b;
    hr_kv_seq_create(p, &a, &err);
    hr_kv_seq_create(p, &b, &err);
    hr_kv_policy pol = {.kind = HR_KV_POLICY_WINDOW, .window = 256};
    CHECK(hr_kv_seq_set_policy(p, b, &pol, &err) == HR_OK);
    hr_kv_seq_reserve(p, a, N, &err);
    hr_kv_seq_reserve(p, b, N, &err);
    hr_rng rng;
    hr_rng_seed(&rng, 3);
    float k[HKV * D], v[HKV * D], q[H * D], o1[H * D], o2[H * D], scratch[256];
    for (int t = 0; t < N; t++) {
        for (int i = 0; i < HKV * D; i++) k[i] = hr_rng_normal(&rng), v[i] = hr_rng_normal(&rng);
        hr_kv_write(p, 0, a, t, k, v);
        hr_kv_write(p, 0, b, t, k, v);
    }
    int same = 1;
    for (int n = 1; n <= N; n++) {
        for (int i = 0; i < H * D; i++) q[i] = hr_rng_normal(&rng);
        hr_kv_attention(p, 0, a, n, q, H, 0.3f, o1, scratch);
        hr_kv_attention(p, 0, b, n, q, H, 0.3f, o2, scratch);
        same &= memcmp(o1, o2, sizeof o1) == 0;
    }
    CHECK(same);
    hr_kv_pool_destroy(p);
}

/* ---- h2o and snapkv on hand-made attention ---------------------------------------------------------- */

/* Keys: channel 0 carries `spike[t]` (0 for ordinary tokens), the other channels small noise; every
 * query points along channel 0, so attention goes to the spiked tokens in proportion to exp(spike). */
static void make_spiked(float *K, float *V, int N, int Hkv, int D, const float *spike, hr_rng *rng) {
    for (int t = 0; t < N; t++)
        for (int h = 0; h < Hkv; h++)
            for (int c = 0; c < D; c++) {
                K[((size_t)t * Hkv + h) * D + c] = c == 0 ? spike[t] : 0.05f * hr_rng_normal(rng);
                V[((size_t)t * Hkv + h) * D + c] = hr_rng_normal(rng);
            }
}

static bool kept_set_is(hr_kv_pool *p, hr_kv_seq s, const float *K, const float *V, const bool *want, int n_ctx,
                        int Hkv, int H, int D, double *err_out) {
    /* the kept set is observable through attention: compare with the reference over `want` using a
     * query that does not favour any token, and one along channel 0 */
    float q[HMAX * DMAX], out[HMAX * DMAX], scratch[NMAX + 64];
    double ref[HMAX * DMAX], worst = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < H * D; i++) q[i] = pass == 0 ? (i % D == 1 ? 0.5f : 0.0f) : (i % D == 0 ? 1.0f : 0.0f);
        hr_kv_attention(p, 0, s, n_ctx, q, H, 0.35f, out, scratch);
        ref_attention(K, V, want, n_ctx, Hkv, D, q, H, 0.35, ref);
        worst = fmax(worst, max_err(out, ref, H * D));
    }
    *err_out = worst;
    return worst < 1e-5;
}

static void test_h2o(void) {
    enum { HKV = 2, H = 4, D = 8, B = 8, N = 40 };
    hr_kv_pool *p = make_pool(1, HKV, D, B, HR_KV_F32, 16, 2);
    hr_error err = {0};
    hr_kv_seq s;
    hr_kv_seq_create(p, &s, &err);
    hr_kv_policy pol;
    hr_kv_policy_parse("h2o:10", &pol, &err);
    CHECK(hr_kv_seq_set_policy(p, s, &pol, &err) == HR_OK);
    static float K[N][HKV][D], V[N][HKV][D];
    float spike[N] = {0};
    spike[3] = spike[7] = spike[20] = spike[25] = 20.0f; /* the heavy hitters */
    hr_rng rng;
    hr_rng_seed(&rng, 5);
    make_spiked(&K[0][0][0], &V[0][0][0], N, HKV, D, spike, &rng);
    float q[H * D], out[H * D], scratch[NMAX + 64];
    for (int i = 0; i < H * D; i++) q[i] = i % D == 0 ? 1.0f : 0.0f;
    for (int t = 0; t < N; t++) { /* decode one token at a time; every query looks along channel 0 */
        hr_kv_seq_reserve(p, s, t + 1, &err);
        hr_kv_write(p, 0, s, t, &K[t][0][0], &V[t][0][0]);
        hr_kv_attention(p, 0, s, t + 1, q, H, 0.35f, out, scratch);
        int32_t tok = 1;
        hr_kv_seq_commit(p, s, &tok, 1);
        CHECK(hr_kv_pool_check(p, &err) == HR_OK);
    }
    /* budget 10: the 5 most recent, and the 5 older tokens with the most attention: the four spiked
     * ones and token 0, which the first queries (with few tokens to look at) gave most of their weight:
     * 1 + 1/2 + 1/3 per head, more than any ordinary token and less than token 25's 6 x 1/4 by the
     * time 25 leaves the recent half */
    bool want[N] = {false};
    want[0] = want[3] = want[7] = want[20] = want[25] = true;
    for (int t = N - 5; t < N; t++) want[t] = true;
    double e;
    CHECKF(kept_set_is(p, s, &K[0][0][0], &V[0][0][0], want, N, HKV, H, D, &e), "h2o survivors, error %g", e);
    hr_kv_seq_ledger lg;
    hr_kv_seq_get_ledger(p, s, &lg, &err);
    /* blocks of 8: [0,8) keeps 0, 3 and 7, [8,16) nothing -> freed, [16,24) keeps 20, [24,32) 25,
     * [32,40) the recent five */
    CHECKF(lg.blocks_evicted == 1 && lg.blocks_own == 4, "evicted %d own %d", lg.blocks_evicted, lg.blocks_own);
    CHECKF(lg.tokens_kept_max == 10 && lg.tokens_evicted == N - 10, "kept %d evicted %d", lg.tokens_kept_max,
           lg.tokens_evicted);
    CHECK(lg.tokens_resident == 10 && lg.policy.kind == HR_KV_POLICY_H2O);
    CHECK(hr_kv_seq_set_policy(p, s, &pol, &err) == HR_ERR_INVALID_ARG); /* too late: it has evicted */
    hr_kv_seq_reset(p, s);
    CHECK(hr_kv_seq_set_policy(p, s, &pol, &err) == HR_OK);
    hr_kv_seq_free(p, s);
    CHECK(hr_kv_pool_check(p, &err) == HR_OK);
    hr_kv_pool_destroy(p);
}

static void test_snapkv(void) {
    enum { HKV = 2, H = 4, D = 8, B = 8, NP = 64, NG = 6 };
    hr_kv_pool *p = make_pool(1, HKV, D, B, HR_KV_F32, 16, 2);
    hr_error err = {0};
    hr_kv_seq s;
    hr_kv_seq_create(p, &s, &err);
    hr_kv_policy pol;
    hr_kv_policy_parse("snapkv:16,window:8", &pol, &err);
    CHECK(hr_kv_seq_set_policy(p, s, &pol, &err) == HR_OK);
    static float K[NP + NG][HKV][D], V[NP + NG][HKV][D];
    float spike[NP + NG] = {0};
    spike[5] = 3.0f, spike[30] = 5.0f; /* 30 draws more than 5 */
    hr_rng rng;
    hr_rng_seed(&rng, 9);
    make_spiked(&K[0][0][0], &V[0][0][0], NP + NG, HKV, D, spike, &rng);
    /* prefill: one chunk of NP tokens; only the last 8 queries (the observation window) count */
    hr_kv_seq_reserve(p, s, NP, &err);
    for (int t = 0; t < NP; t++) hr_kv_write(p, 0, s, t, &K[t][0][0], &V[t][0][0]);
    float q[H * D], out[H * D], scratch[NMAX + 64];
    for (int t = 0; t < NP; t++) {
        /* earlier queries look elsewhere (channel 1, which no key has): they must not count */
        for (int i = 0; i < H * D; i++) q[i] = i % D == (t >= NP - 8 ? 0 : 1) ? 1.0f : 0.0f;
        hr_kv_attention(p, 0, s, t + 1, q, H, 0.35f, out, scratch);
    }
    int32_t toks[NP] = {0};
    hr_kv_seq_commit(p, s, toks, NP);
    CHECK(hr_kv_pool_check(p, &err) == HR_OK);
    /* pooled (max over +-2) scores: 28..32 share 30's, 3..7 share 5's; 8 slots: 28..32 then the
     * latest three of 3..7 (5, 6, 7); plus the window 56..63 */
    bool want[NP + NG] = {false};
    for (int t = 28; t <= 32; t++) want[t] = true;
    want[5] = want[6] = want[7] = true;
    for (int t = NP - 8; t < NP; t++) want[t] = true;
    double e;
    CHECKF(kept_set_is(p, s, &K[0][0][0], &V[0][0][0], want, NP, HKV, H, D, &e), "snapkv survivors, error %g", e);
    hr_kv_seq_ledger lg;
    hr_kv_seq_get_ledger(p, s, &lg, &err);
    /* blocks [8,16) [16,24) [40,48) [48,56) are empty: freed; [0,8) [24,32) [32,40) [56,64) stay */
    CHECKF(lg.blocks_evicted == 4 && lg.blocks_own == 4, "evicted %d own %d", lg.blocks_evicted, lg.blocks_own);
    CHECK(lg.tokens_kept_max == 16);
    /* generation keeps every new token */
    for (int t = NP; t < NP + NG; t++) {
        hr_kv_seq_reserve(p, s, t + 1, &err);
        hr_kv_write(p, 0, s, t, &K[t][0][0], &V[t][0][0]);
        hr_kv_attention(p, 0, s, t + 1, q, H, 0.35f, out, scratch);
        int32_t tok = 0;
        hr_kv_seq_commit(p, s, &tok, 1);
        want[t] = true;
    }
    CHECKF(kept_set_is(p, s, &K[0][0][0], &V[0][0][0], want, NP + NG, HKV, H, D, &e), "after generation %g", e);
    hr_kv_seq_get_ledger(p, s, &lg, &err);
    CHECK(lg.tokens_kept_max == 16 + NG && lg.blocks_evicted == 4);
    hr_kv_seq_free(p, s);
    CHECK(hr_kv_pool_check(p, &err) == HR_OK);
    hr_kv_pool_destroy(p);
}

/* ---- randomized invariants -------------------------------------------------------------------------- */

static void test_random(hr_kv_format fmt, uint64_t seed) {
    enum { L = 2, HKV = 2, H = 4, D = 8, B = 8, SEQ = 6, STEPS = 1500 };
    hr_kv_pool *p = make_pool(L, HKV, D, B, fmt, 60, SEQ);
    hr_error err = {0};
    hr_rng rng;
    hr_rng_seed(&rng, seed);
    const char *pols[] = {"full", "window:16", "sinks:3,window:16", "h2o:10", "snapkv:12,window:4", "window:24"};
    hr_kv_seq seq[SEQ];
    int32_t hist[SEQ][512];
    int live[SEQ] = {0};
    float kv[HKV * D], q[H * D], out[H * D], scratch[1024];
    int failures = 0;
    for (int step = 0; step < STEPS && failures == 0; step++) {
        int i = (int)(hr_rng_next(&rng) % SEQ);
        int op = (int)(hr_rng_next(&rng) % 10);
        if (!live[i]) {
            if (hr_kv_seq_create(p, &seq[i], &err) != HR_OK) continue;
            live[i] = 1;
            hr_kv_policy pol;
            hr_kv_policy_parse(pols[hr_rng_next(&rng) % 6], &pol, &err);
            if (hr_kv_seq_set_policy(p, seq[i], &pol, &err) != HR_OK) failures++;
            /* a prompt from a small alphabet, so prefixes are shared between sequences */
            int n = 1 + (int)(hr_rng_next(&rng) % 40);
            for (int t = 0; t < n; t++) hist[i][t] = (int32_t)(hr_rng_next(&rng) % 2);
            int cached = 0;
            hr_kv_seq_share_prefix(p, seq[i], hist[i], n, &cached, &err);
            continue;
        }
        int n0 = hr_kv_seq_n_tokens(p, seq[i]);
        if (op < 6 && n0 < 400) { /* a chunk: reserve, write, attend, commit */
            int n = op < 4 ? 1 : 1 + (int)(hr_rng_next(&rng) % 20);
            if (hr_kv_seq_reserve(p, seq[i], n0 + n, &err) != HR_OK) continue;
            for (int t = n0; t < n0 + n; t++) {
                for (int l = 0; l < L; l++) {
                    for (int c = 0; c < HKV * D; c++) kv[c] = hr_rng_normal(&rng);
                    hr_kv_write(p, l, seq[i], t, kv, kv);
                }
                if (t >= n0 && hist[i][t] == 0 && t > 0) hist[i][t] = (int32_t)(hr_rng_next(&rng) % 2);
            }
            for (int t = n0; t < n0 + n; t++)
                for (int l = 0; l < L; l++) {
                    for (int c = 0; c < H * D; c++) q[c] = hr_rng_normal(&rng);
                    hr_kv_attention(p, l, seq[i], t + 1, q, H, 0.35f, out, scratch);
                    for (int c = 0; c < H * D; c++)
                        if (!isfinite(out[c])) failures++;
                }
            hr_kv_seq_commit(p, seq[i], hist[i] + n0, n);
        } else if (op == 6) {
            hr_kv_seq c;
            for (int j = 0; j < SEQ; j++)
                if (!live[j] && hr_kv_seq_fork(p, seq[i], &c, &err) == HR_OK) {
                    seq[j] = c;
                    live[j] = 1;
                    memcpy(hist[j], hist[i], sizeof hist[i]);
                    break;
                }
        } else if (op == 7) {
            hr_kv_seq_reset(p, seq[i]);
        } else {
            hr_kv_seq_free(p, seq[i]);
            live[i] = 0;
        }
        if (hr_kv_pool_check(p, &err) != HR_OK) {
            fprintf(stderr, "step %d: %s\n", step, err.msg);
            failures++;
        }
        for (int j = 0; j < SEQ; j++) {
            hr_kv_seq_ledger lg;
            if (!live[j] || hr_kv_seq_get_ledger(p, seq[j], &lg, &err) != HR_OK) continue;
            if (lg.tokens_resident + lg.tokens_evicted != lg.tokens_total || lg.tokens_kept_max > lg.tokens_total)
                failures++;
        }
    }
    CHECKF(failures == 0, "%s: %d failures", hr_kv_format_name(fmt), failures);
    for (int j = 0; j < SEQ; j++)
        if (live[j]) hr_kv_seq_free(p, seq[j]);
    hr_kv_pool_ledger pl;
    hr_kv_pool_get_ledger(p, &pl);
    CHECK(hr_kv_pool_check(p, &err) == HR_OK && pl.blocks_used == 0 && pl.policy_blocks_evicted_total > 0);
    hr_kv_pool_destroy(p);
}

int main(void) {
    test_parse();
    int native_l0[2] = {32, 0}, native_all[2] = {32, 48};
    run_window("window:16", HR_KV_F32, 1e-5, NULL, 100);
    run_window("window:40", HR_KV_F32, 1e-5, NULL, 120);
    run_window("sinks:4,window:32", HR_KV_F32, 1e-5, NULL, 150);
    run_window("sinks:20,window:16", HR_KV_F32, 1e-5, NULL, 90);
    run_window("sinks:4,window:32", HR_KV_Q4, 0.5, NULL, 110);
    run_window("window:24", HR_KV_KIVI2, 2.0, NULL, 80);
    run_window("sinks:4,window:32", HR_KV_Q4H, 0.8, NULL, 110); /* rotated query, bounded scratch */
    run_window("full", HR_KV_F32, 1e-5, native_l0, 90);         /* one layer windowed: nothing leaves */
    run_window("full", HR_KV_F32, 1e-5, native_all, 90);        /* every layer: blocks past 48 leave */
    run_window("window:16", HR_KV_F32, 1e-5, native_all, 90);
    test_window_equals_full();
    test_h2o();
    test_snapkv();
    test_random(HR_KV_F32, 1);
    test_random(HR_KV_Q4, 2);
    test_random(HR_KV_Q4H, 3);
    return hr_test_finish();
}

/* test_kv_basic.c: the KV pool's first contract: sizes, budget errors, write + attention in f32/f16
 * against a float64 attention computed here, and batch-independence of the result. */
#include <math.h>
#include <string.h>

#include "common/util.h"
#include "harness.h"
#include "kv/kv.h"

static void ref_attention(const float *K, const float *V, int n_ctx, int Hkv, int D, const float *q, int H, float scale,
                          double *out) {
    /* K, V: [n_ctx][Hkv][D] */
    int group = H / Hkv;
    double s[2048];
    for (int h = 0; h < H; h++) {
        int kh = h / group;
        double mx = -INFINITY;
        for (int t = 0; t < n_ctx; t++) {
            double d = 0;
            for (int c = 0; c < D; c++) d += (double)q[h * D + c] * K[((size_t)t * Hkv + kh) * D + c];
            s[t] = d * scale;
            if (s[t] > mx) mx = s[t];
        }
        double sum = 0;
        for (int t = 0; t < n_ctx; t++) sum += (s[t] = exp(s[t] - mx));
        for (int c = 0; c < D; c++) {
            double o = 0;
            for (int t = 0; t < n_ctx; t++) o += s[t] * V[((size_t)t * Hkv + kh) * D + c];
            out[h * D + c] = o / sum;
        }
    }
}

static void test_budget(void) {
    hr_kv_config c = {.n_layers = 2,
                      .n_kv_heads = 2,
                      .head_dim = 8,
                      .block_size = 16,
                      .k_format = HR_KV_F32,
                      .v_format = HR_KV_F32,
                      .budget_bytes = 100,
                      .max_seqs = 4};
    uint64_t bb = hr_kv_block_bytes(&c);
    CHECK(bb == 2 * 2 * 2 * 16 * 8 * 4);
    hr_kv_pool *p = NULL;
    hr_error err = {0};
    CHECK(hr_kv_pool_create(&c, &p, &err) == HR_ERR_BUDGET);
    CHECKF(strstr(err.msg, "smallest budget") != NULL, "%s", err.msg);
    c.budget_bytes = bb * 10 + bb / 2;
    CHECK(hr_kv_pool_create(&c, &p, &err) == HR_OK);
    CHECK(hr_kv_pool_n_blocks(p) == 10);
    hr_kv_pool_destroy(p);
    c.block_size = 7;
    CHECK(hr_kv_pool_create(&c, &p, &err) == HR_ERR_INVALID_ARG);
    hr_kv_format f;
    CHECK(hr_kv_format_parse("kivi2", &f, &err) == HR_OK && f == HR_KV_KIVI2);
    CHECK(hr_kv_format_parse("int3", &f, &err) == HR_ERR_INVALID_ARG);
    CHECK(strstr(err.msg, "q8") != NULL);
    hr_kv_pool_destroy(NULL);
}

static void test_attention(hr_kv_format fmt, double tol) {
    enum { L = 2, HKV = 2, H = 4, D = 16, N = 37 };
    hr_kv_config c = {.n_layers = L,
                      .n_kv_heads = HKV,
                      .head_dim = D,
                      .block_size = 16,
                      .k_format = fmt,
                      .v_format = fmt,
                      .max_seqs = 4};
    c.budget_bytes = hr_kv_block_bytes(&c) * 16;
    hr_kv_pool *p = NULL;
    hr_error err = {0};
    CHECK(hr_kv_pool_create(&c, &p, &err) == HR_OK);
    hr_rng rng;
    hr_rng_seed(&rng, 7);
    static float K[L][N][HKV][D], V[L][N][HKV][D];
    hr_kv_seq a, b;
    CHECK(hr_kv_seq_create(p, &a, &err) == HR_OK);
    CHECK(hr_kv_seq_create(p, &b, &err) == HR_OK);
    CHECK(hr_kv_seq_reserve(p, a, N, &err) == HR_OK);
    CHECK(hr_kv_seq_reserve(p, b, 5, &err) == HR_OK);
    for (int l = 0; l < L; l++)
        for (int t = 0; t < N; t++) {
            float *kt = &K[l][t][0][0], *vt = &V[l][t][0][0];
            for (int i = 0; i < HKV * D; i++) {
                kt[i] = hr_rng_normal(&rng);
                vt[i] = hr_rng_normal(&rng);
            }
            hr_kv_write(p, l, a, t, &K[l][t][0][0], &V[l][t][0][0]);
            if (t < 5) hr_kv_write(p, l, b, t, &V[l][t][0][0], &K[l][t][0][0]);
        }
    int32_t toks[N] = {0};
    hr_kv_seq_commit(p, a, toks, N);
    hr_kv_seq_commit(p, b, toks, 5);
    CHECK(hr_kv_pool_check(p, &err) == HR_OK);
    float q[H * D], out[H * D], out2[H * D];
    double ref[H * D];
    float scratch[4096];
    CHECK(hr_kv_attention_scratch_floats(p, N) <= 4096);
    for (int i = 0; i < H * D; i++) q[i] = hr_rng_normal(&rng);
    for (int l = 0; l < L; l++)
        for (int n_ctx = 1; n_ctx <= N; n_ctx += 6) {
            hr_kv_attention(p, l, a, n_ctx, q, H, 0.25f, out, scratch);
            ref_attention(&K[l][0][0][0], &V[l][0][0][0], n_ctx, HKV, D, q, H, 0.25, ref);
            double worst = 0;
            for (int i = 0; i < H * D; i++) worst = fmax(worst, fabs(out[i] - ref[i]));
            CHECKF(worst < tol, "%s l=%d n_ctx=%d err %g", hr_kv_format_name(fmt), l, n_ctx, worst);
            /* the same query again, after other work in the pool, gives bit-identical output */
            hr_kv_attention(p, l, b, 5, q, H, 0.25f, out2, scratch);
            hr_kv_attention(p, l, a, n_ctx, q, H, 0.25f, out2, scratch);
            CHECK(memcmp(out, out2, sizeof out) == 0);
        }
    hr_kv_seq_free(p, a);
    hr_kv_seq_free(p, b);
    CHECK(hr_kv_pool_check(p, &err) == HR_OK);
    hr_kv_pool_destroy(p);
}

int main(void) {
    test_budget();
    test_attention(HR_KV_F32, 1e-5);
    test_attention(HR_KV_F16, 5e-3);
    return hr_test_finish();
}

/* test_kv_basic.c: the KV pool's first contract: sizes, budget errors, write + attention in f32/f16
 * against a float64 attention computed here, and batch-independence of the result. */
#include <math.h>
#include <string.h>

#include "backend/cpu/kv_cpu.h" /* the CPU storage's f16/bf16/e4m3 conversions */
#include "common/util.h"
#include "harness.h"
#include "kv/kv.h"
#include "tensor/tensor.h"

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
            /* the heads in parts (as threads share a lone token's): each part writes only its heads,
             * and the whole has the bits of one call */
            for (int cut = 0; cut <= H; cut++) {
                for (int i = 0; i < H * D; i++) out2[i] = -7.0f;
                hr_kv_attention_heads(p, l, a, n_ctx, q, H, 0, cut, 0.25f, NULL, out2, scratch);
                for (int i = cut * D; i < H * D; i++) CHECKF(out2[i] == -7.0f, "head %d written, cut %d", i / D, cut);
                hr_kv_attention_heads(p, l, a, n_ctx, q, H, cut, H, 0.25f, NULL, out2, scratch);
                CHECKF(memcmp(out, out2, sizeof out) == 0, "%s l=%d n_ctx=%d heads cut at %d differ",
                       hr_kv_format_name(fmt), l, n_ctx, cut);
            }
        }
    hr_kv_seq_free(p, a);
    hr_kv_seq_free(p, b);
    CHECK(hr_kv_pool_check(p, &err) == HR_OK);
    hr_kv_pool_destroy(p);
}

/* kv's private inline conversions agree with tensor/'s, and e4m3 rounds to the nearest code. */
static void test_conversions(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float a = kv_f16_to_f32((uint16_t)h), b = hr_f16_to_f32((hr_f16)h);
        bad += memcmp(&a, &b, 4) != 0 && !(a != a && b != b);
        a = kv_bf16_to_f32((uint16_t)h), b = hr_bf16_to_f32((hr_bf16)h);
        bad += memcmp(&a, &b, 4) != 0 && !(a != a && b != b);
    }
    CHECKF(bad == 0, "%d f16/bf16 -> f32 mismatches", bad);
    hr_rng r;
    hr_rng_seed(&r, 11);
    bad = 0;
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)hr_rng_next(&r);
        float x;
        memcpy(&x, &u, 4);
        if (i % 2) x = (float)(hr_rng_normal(&r) * pow(2.0, (double)(i % 40) - 26));
        if (x != x) continue;
        bad += kv_f32_to_f16(x) != hr_f32_to_f16(x);
        bad += kv_f32_to_bf16(x) != hr_f32_to_bf16(x);
    }
    CHECKF(bad == 0, "%d f32 -> f16/bf16 mismatches", bad);
    /* e4m3: every code round-trips; random values go to the nearest code (ties to even code) */
    bad = 0;
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f) continue; /* NaN */
        bad += kv_f32_to_e4m3(kv_e4m3_to_f32((uint8_t)c)) != (c == 0x80 ? 0x80 : c);
    }
    CHECKF(bad == 0, "%d e4m3 codes do not round-trip", bad);
    CHECK(kv_e4m3_to_f32(0x7e) == 448.0f && kv_e4m3_to_f32(0x01) == 0x1p-9f && kv_e4m3_to_f32(0x08) == 0x1p-6f);
    CHECK(kv_f32_to_e4m3(1e9f) == 0x7e && kv_f32_to_e4m3(-1e9f) == 0xfe);
    bad = 0;
    for (int i = 0; i < 100000; i++) {
        float x = (float)(hr_rng_uniform(&r) * 460.0);
        uint8_t c = kv_f32_to_e4m3(x);
        double best = INFINITY;
        for (int k = 0; k < 0x7f; k++) best = fmin(best, fabs((double)kv_e4m3_to_f32((uint8_t)k) - x));
        bad += fabs((double)kv_e4m3_to_f32(c) - x) > best;
    }
    CHECKF(bad == 0, "%d values not rounded to the nearest e4m3 code", bad);
    hr_kv_format f;
    hr_error err = {0};
    CHECK(hr_kv_format_parse("q8_0", &f, &err) == HR_OK && f == HR_KV_Q8);
    CHECK(hr_kv_format_parse("fp16", &f, &err) == HR_OK && f == HR_KV_F16);
    for (int i = 0; i < HR_KV_FORMAT_COUNT; i++)
        CHECK(hr_kv_format_parse(hr_kv_format_name((hr_kv_format)i), &f, &err) == HR_OK && f == (hr_kv_format)i);
}

int main(void) {
    test_conversions();
    test_budget();
    test_attention(HR_KV_F32, 1e-5);
    test_attention(HR_KV_F16, 5e-3);
    return hr_test_finish();
}

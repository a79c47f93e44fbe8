/* test_kv_formats.c: attention through every KV format against a float64 attention computed here,
 * at head_dim 8, 64, 80, 128, GQA ratios 1, 2, 4, 8 and context lengths 1, 15, 16, 17, 100, 1000,
 * with a stated tolerance per format; and the AVX2 kernels against the scalar reference (1e-5
 * relative; the q4/kivi2 encoders bit for bit). Keys carry outlier channels (a few channels with a
 * large fixed offset, a few with a wider spread), as real keys do: that is what per-channel key
 * quantization is for. Tokens are written one at a time and attention runs when the context reaches
 * each length, as in decoding. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "harness.h"
#include "kv/kv.h"

enum { HKV = 2, NMAX = 1000, DMAX = 128, GMAX = 8 };

/* Stated tolerances: the max and the mean absolute error of the output, for V ~ N(0,1) and keys with
 * outlier channels (outputs are averages of V rows, |out| < ~3). Set from the measured worst case
 * over all shapes here with a margin of about 2x; the test prints the measured figures. 2-bit KIVI is
 * coarse per element (4 levels) and its max error is large on short contexts whose attention is
 * peaky; its mean error is the figure to watch. */
static const double tol_max[HR_KV_FORMAT_COUNT] = {
    [HR_KV_F32] = 1e-5, [HR_KV_F16] = 3e-3, [HR_KV_BF16] = 3e-2, [HR_KV_Q8] = 7e-2,
    [HR_KV_Q4] = 0.5,   [HR_KV_FP8] = 0.3,  [HR_KV_KIVI2] = 2.0, [HR_KV_Q4H] = 0.8,
};
static const double tol_mean[HR_KV_FORMAT_COUNT] = {
    [HR_KV_F32] = 1e-6, [HR_KV_F16] = 6e-4, [HR_KV_BF16] = 4e-3,  [HR_KV_Q8] = 2e-2,
    [HR_KV_Q4] = 0.1,   [HR_KV_FP8] = 0.05, [HR_KV_KIVI2] = 0.35, [HR_KV_Q4H] = 0.15,
};

static float Kd[NMAX][HKV][DMAX], Vd[NMAX][HKV][DMAX];

static void ref_attention(int n_ctx, int D, const float *q, int H, double scale, double *out) {
    int group = H / HKV;
    static double s[NMAX];
    for (int h = 0; h < H; h++) {
        int kh = h / group;
        double mx = -INFINITY;
        for (int t = 0; t < n_ctx; t++) {
            double d = 0;
            for (int c = 0; c < D; c++) d += (double)q[h * D + c] * Kd[t][kh][c];
            s[t] = d * scale;
            if (s[t] > mx) mx = s[t];
        }
        double sum = 0;
        for (int t = 0; t < n_ctx; t++) sum += (s[t] = exp(s[t] - mx));
        for (int c = 0; c < D; c++) {
            double o = 0;
            for (int t = 0; t < n_ctx; t++) o += s[t] * Vd[t][kh][c];
            out[h * D + c] = o / sum;
        }
    }
}

static hr_kv_pool *make(int D, hr_kv_format kf, hr_kv_format vf, bool scalar) {
    hr_kv_config c = {.n_layers = 1,
                      .n_kv_heads = HKV,
                      .head_dim = D,
                      .block_size = 16,
                      .k_format = kf,
                      .v_format = vf,
                      .max_seqs = 2,
                      .force_scalar = scalar};
    c.budget_bytes = hr_kv_block_bytes(&c) * (NMAX / 16 + 2) + hr_kv_fixed_bytes(&c);
    hr_kv_pool *p = NULL;
    hr_error err = {0};
    hr_status rc = hr_kv_pool_create(&c, &p, &err);
    CHECKF(rc == HR_OK, "%s", err.msg);
    return rc == HR_OK ? p : NULL;
}

static double worst_err[HR_KV_FORMAT_COUNT][HR_KV_FORMAT_COUNT];
static double worst_mean[HR_KV_FORMAT_COUNT][HR_KV_FORMAT_COUNT];
static double worst_simd;

static void run_case(int D, hr_kv_format kf, hr_kv_format vf, hr_rng *rng) {
    for (int t = 0; t < NMAX; t++)
        for (int h = 0; h < HKV; h++)
            for (int c = 0; c < D; c++) {
                /* outlier key channels: a large per-channel offset (c % 17 == 3) or a wider spread */
                float off = (c % 17 == 3) ? (c % 2 ? 6.0f : -6.0f) : 0.0f;
                Kd[t][h][c] = off + hr_rng_normal(rng) * ((c % 23 == 5) ? 2.0f : 1.0f);
                Vd[t][h][c] = hr_rng_normal(rng);
            }
    hr_kv_pool *ps = make(D, kf, vf, true), *pv = make(D, kf, vf, false);
    if (!ps || !pv) return;
    hr_error err = {0};
    hr_kv_seq ss, sv;
    CHECK(hr_kv_seq_create(ps, &ss, &err) == HR_OK && hr_kv_seq_create(pv, &sv, &err) == HR_OK);
    static const int lengths[] = {1, 15, 16, 17, 100, 1000};
    static const int ratios[] = {1, 2, 4, 8};
    static float q[GMAX * HKV * DMAX], os[GMAX * HKV * DMAX], ov[GMAX * HKV * DMAX];
    static double ref[GMAX * HKV * DMAX];
    static float scratch[NMAX + 2 * DMAX + 64];
    CHECK(hr_kv_attention_scratch_floats(ps, NMAX) <= HR_ARRAY_LEN(scratch));
    int li = 0;
    for (int pos = 0; pos < NMAX; pos++) { /* as in decoding: reserve, write, commit one token */
        CHECK(hr_kv_seq_reserve(ps, ss, pos + 1, &err) == HR_OK && hr_kv_seq_reserve(pv, sv, pos + 1, &err) == HR_OK);
        float kb[HKV * DMAX], vb[HKV * DMAX]; /* [Hkv][D] packed */
        for (int h = 0; h < HKV; h++)
            for (int c = 0; c < D; c++) {
                kb[h * D + c] = Kd[pos][h][c];
                vb[h * D + c] = Vd[pos][h][c];
            }
        hr_kv_write(ps, 0, ss, pos, kb, vb);
        hr_kv_write(pv, 0, sv, pos, kb, vb);
        int32_t tok = pos;
        hr_kv_seq_commit(ps, ss, &tok, 1);
        hr_kv_seq_commit(pv, sv, &tok, 1);
        if (pos + 1 != lengths[li]) continue;
        int n_ctx = lengths[li++];
        for (int ri = 0; ri < 4; ri++) {
            int H = HKV * ratios[ri];
            for (int i = 0; i < H * D; i++) q[i] = hr_rng_normal(rng);
            float scale = 1.0f / sqrtf((float)D);
            hr_kv_attention(ps, 0, ss, n_ctx, q, H, scale, os, scratch);
            hr_kv_attention(pv, 0, sv, n_ctx, q, H, scale, ov, scratch);
            ref_attention(n_ctx, D, q, H, scale, ref);
            double e = 0, d = 0, mag = 0, mean = 0;
            for (int i = 0; i < H * D; i++) {
                e = fmax(e, fabs(os[i] - ref[i]));
                mean += fabs(os[i] - ref[i]) / (H * D);
                d = fmax(d, fabs((double)ov[i] - os[i]));
                mag = fmax(mag, fabs(os[i]));
            }
            double rel = d / fmax(mag, 1e-6);
            worst_err[kf][vf] = fmax(worst_err[kf][vf], e);
            worst_mean[kf][vf] = fmax(worst_mean[kf][vf], mean);
            worst_simd = fmax(worst_simd, rel);
            double tol = fmax(tol_max[kf], tol_max[vf]), tolm = fmax(tol_mean[kf], tol_mean[vf]);
            CHECKF(mean <= tolm, "K %s V %s D=%d gqa=%d n_ctx=%d: mean abs error %.3g > %.3g", hr_kv_format_name(kf),
                   hr_kv_format_name(vf), D, ratios[ri], n_ctx, mean, tolm);
            CHECKF(e <= tol, "K %s V %s D=%d gqa=%d n_ctx=%d: max abs error %.3g > %.3g", hr_kv_format_name(kf),
                   hr_kv_format_name(vf), D, ratios[ri], n_ctx, e, tol);
            /* an f16 V rounds the probabilities to f16 (as llama.cpp does), so the ISAs' last-bit exp
             * differences can move a probability by one f16 step (2^-11 relative) */
            double rel_tol = vf == HR_KV_F16 ? 1e-3 : 1e-5;
            CHECKF(rel <= rel_tol, "K %s V %s D=%d gqa=%d n_ctx=%d: %s vs scalar differ by %.3g relative",
                   hr_kv_format_name(kf), hr_kv_format_name(vf), D, ratios[ri], n_ctx, hr_kv_pool_isa(pv), rel);
        }
    }
    CHECK(hr_kv_pool_check(pv, &err) == HR_OK);
    hr_kv_pool_destroy(ps);
    hr_kv_pool_destroy(pv);
}

static void test_bytes_per_token(void) {
    printf("bytes per token (K+V, 1 layer, 8 KV heads, head_dim 128, block 16):\n");
    for (int f = 0; f < HR_KV_FORMAT_COUNT; f++) {
        hr_kv_config c = {.n_layers = 1,
                          .n_kv_heads = 8,
                          .head_dim = 128,
                          .block_size = 16,
                          .k_format = f,
                          .v_format = f,
                          .max_seqs = 1};
        uint64_t bb = hr_kv_block_bytes(&c);
        printf("  %-6s %6.1f (f16 tail buffer %llu bytes)\n", hr_kv_format_name(f), bb / 16.0,
               (unsigned long long)hr_kv_stage_block_bytes(&c));
        CHECK(bb > 0);
    }
    hr_kv_config c = {.n_layers = 1, .n_kv_heads = 8, .head_dim = 128, .block_size = 16, .max_seqs = 1};
    c.k_format = c.v_format = HR_KV_F16;
    uint64_t f16 = hr_kv_block_bytes(&c);
    c.k_format = c.v_format = HR_KV_KIVI2;
    CHECK(hr_kv_block_bytes(&c) * 4 < f16); /* 2-bit codes plus scales: under a quarter of f16 */
}

/* ---- chunk and thread invariance ------------------------------------------------------------------
 * A 45-token chunk written by two threads (interleaved positions, as the forward pass splits them),
 * then attention at every n_ctx inside the chunk, must equal token-by-token decoding bit for bit. */

enum { CH_N = 45, CH_D = 16, CH_H = 4 };
static float ch_k[CH_N][HKV * CH_D], ch_v[CH_N][HKV * CH_D];

typedef struct {
    hr_kv_pool *p;
    hr_kv_seq s;
    int ith;
} ch_job;

static void *ch_writer(void *arg) {
    ch_job *j = arg;
    for (int t = CH_N - 1 - j->ith; t >= 0; t -= 2) hr_kv_write(j->p, 0, j->s, t, ch_k[t], ch_v[t]);
    return NULL;
}

static void test_chunk_invariance(hr_kv_format f, hr_rng *rng) {
    for (int t = 0; t < CH_N; t++)
        for (int i = 0; i < HKV * CH_D; i++) {
            ch_k[t][i] = hr_rng_normal(rng) + (i % 7 == 2 ? 5.0f : 0.0f);
            ch_v[t][i] = hr_rng_normal(rng);
        }
    hr_kv_config c = {.n_layers = 1,
                      .n_kv_heads = HKV,
                      .head_dim = CH_D,
                      .block_size = 16,
                      .k_format = f,
                      .v_format = f,
                      .max_seqs = 2};
    c.budget_bytes = hr_kv_block_bytes(&c) * 8 + hr_kv_fixed_bytes(&c);
    hr_kv_pool *pc = NULL, *pd = NULL;
    hr_error err = {0};
    CHECK(hr_kv_pool_create(&c, &pc, &err) == HR_OK && hr_kv_pool_create(&c, &pd, &err) == HR_OK);
    hr_kv_seq sc, sd;
    CHECK(hr_kv_seq_create(pc, &sc, &err) == HR_OK && hr_kv_seq_create(pd, &sd, &err) == HR_OK);
    CHECK(hr_kv_seq_reserve(pc, sc, CH_N, &err) == HR_OK);
    pthread_t th[2];
    ch_job jobs[2] = {{pc, sc, 0}, {pc, sc, 1}};
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, ch_writer, &jobs[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    float q[CH_N][CH_H * CH_D], oc[CH_N][CH_H * CH_D], od[CH_H * CH_D], scratch[256];
    for (int t = 0; t < CH_N; t++) {
        for (int i = 0; i < CH_H * CH_D; i++) q[t][i] = hr_rng_normal(rng);
        hr_kv_attention(pc, 0, sc, t + 1, q[t], CH_H, 0.25f, oc[t], scratch);
    }
    int32_t tok[CH_N] = {0};
    hr_kv_seq_commit(pc, sc, tok, CH_N);
    int same = 0;
    for (int t = 0; t < CH_N; t++) {
        CHECK(hr_kv_seq_reserve(pd, sd, t + 1, &err) == HR_OK);
        hr_kv_write(pd, 0, sd, t, ch_k[t], ch_v[t]);
        hr_kv_attention(pd, 0, sd, t + 1, q[t], CH_H, 0.25f, od, scratch);
        hr_kv_seq_commit(pd, sd, tok, 1);
        same += memcmp(od, oc[t], sizeof od) == 0;
    }
    CHECKF(same == CH_N, "%s: chunked prefill and decode agree on %d of %d tokens", hr_kv_format_name(f), same, CH_N);
    CHECK(hr_kv_pool_check(pc, &err) == HR_OK && hr_kv_pool_check(pd, &err) == HR_OK);
    hr_kv_pool_destroy(pc);
    hr_kv_pool_destroy(pd);
}

/* Tail buffers are a budgeted resource too: reserve says FULL when none is free. */
static void test_stage_limit(void) {
    hr_kv_config c = {.n_layers = 1,
                      .n_kv_heads = 1,
                      .head_dim = 8,
                      .block_size = 8,
                      .k_format = HR_KV_KIVI2,
                      .v_format = HR_KV_F16,
                      .max_seqs = 2,
                      .stage_blocks = 3};
    c.budget_bytes = hr_kv_block_bytes(&c) * 10 + hr_kv_fixed_bytes(&c);
    CHECK(hr_kv_fixed_bytes(&c) == 3 * hr_kv_stage_block_bytes(&c));
    hr_kv_pool *p = NULL;
    hr_error err = {0};
    CHECK(hr_kv_pool_create(&c, &p, &err) == HR_OK);
    CHECK(hr_kv_pool_n_blocks(p) == 10);
    hr_kv_seq s;
    CHECK(hr_kv_seq_create(p, &s, &err) == HR_OK);
    CHECK(hr_kv_seq_reserve(p, s, 32, &err) == HR_ERR_FULL);
    CHECKF(strstr(err.msg, "stage_blocks") != NULL, "%s", err.msg);
    CHECK(hr_kv_seq_reserve(p, s, 24, &err) == HR_OK);
    float k[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t tok[8] = {0};
    for (int t = 0; t < 8; t++) hr_kv_write(p, 0, s, t, k, k);
    hr_kv_seq_commit(p, s, tok, 8); /* the first block is encoded and gives its buffer back */
    CHECK(hr_kv_seq_reserve(p, s, 32, &err) == HR_OK);
    CHECK(hr_kv_pool_check(p, &err) == HR_OK);
    hr_kv_pool_destroy(p);
}

/* The AVX2 encoders of q4/kivi2 (the error-minimizing fit on eight groups at once) must store the
 * scalar encoder's bytes exactly, at every head_dim (whole 16-byte code chunks or not). The bytes are
 * read back through the swap tier, which copies blocks verbatim to a file. */
static void test_encoder_bytes(hr_kv_format f, int D, hr_rng *rng) {
    enum { N = 48 };
    static float k[N][HKV * DMAX], v[N][HKV * DMAX];
    for (int t = 0; t < N; t++)
        for (int i = 0; i < HKV * D; i++) {
            k[t][i] = hr_rng_normal(rng) * (i % 5 == 1 ? 3.0f : 1.0f) + (i % 11 == 4 ? 4.0f : 0.0f);
            v[t][i] = hr_rng_normal(rng);
        }
    char path[2][64];
    for (int scalar = 0; scalar < 2; scalar++) {
        hr_kv_config c = {.n_layers = 2,
                          .n_kv_heads = HKV,
                          .head_dim = D,
                          .block_size = 16,
                          .k_format = f,
                          .v_format = f,
                          .max_seqs = 1,
                          .force_scalar = scalar == 1,
                          .stage_blocks = N / 16};
        c.budget_bytes = hr_kv_block_bytes(&c) * 4 + hr_kv_fixed_bytes(&c);
        hr_kv_pool *p = NULL;
        hr_kv_swap *sw = NULL;
        hr_error err = {0};
        hr_kv_seq s = 0;
        snprintf(path[scalar], sizeof path[scalar], "/tmp/test_kv_formats_%d_%d.swap", (int)getpid(), scalar);
        hr_kv_swap_config sc = {.path = path[scalar], .budget_bytes = hr_kv_block_bytes(&c) * 8};
        CHECK(hr_kv_pool_create(&c, &p, &err) == HR_OK && hr_kv_seq_create(p, &s, &err) == HR_OK);
        CHECK(hr_kv_swap_create(p, &sc, &sw, &err) == HR_OK);
        CHECK(hr_kv_seq_reserve(p, s, N, &err) == HR_OK);
        int32_t tok[N] = {0};
        for (int t = 0; t < N; t++)
            for (int l = 0; l < 2; l++) hr_kv_write(p, l, s, t, k[t], v[t]);
        hr_kv_seq_commit(p, s, tok, N);
        CHECKF(hr_kv_seq_swap_out(p, sw, s, &err) == HR_OK, "%s", err.msg);
        FILE *fp = fopen(path[scalar], "rb");
        static unsigned char buf[2][1 << 20];
        size_t got = fp ? fread(buf[scalar], 1, sizeof buf[scalar], fp) : 0;
        if (fp) fclose(fp);
        CHECK(got > 0);
        if (scalar == 1) {
            CHECKF(memcmp(buf[0], buf[1], got) == 0, "%s D=%d: AVX2 and scalar encoders store different bytes",
                   hr_kv_format_name(f), D);
        }
        hr_kv_seq_free(p, s);
        hr_kv_swap_destroy(sw);
        hr_kv_pool_destroy(p);
    }
}

/* q4h rotates keys by a Hadamard transform: head_dim 80 is refused with a message saying why. */
static void test_q4h_refusal(void) {
    hr_kv_config c = {.n_layers = 1,
                      .n_kv_heads = 2,
                      .head_dim = 80,
                      .block_size = 16,
                      .k_format = HR_KV_Q4H,
                      .v_format = HR_KV_Q4H,
                      .max_seqs = 1,
                      .budget_bytes = 1 << 20};
    hr_kv_pool *p = NULL;
    hr_error err = {0};
    CHECK(hr_kv_pool_create(&c, &p, &err) == HR_ERR_INVALID_ARG && p == NULL);
    CHECKF(strstr(err.msg, "power of two") && strstr(err.msg, "80"), "message: %s", err.msg);
    CHECK(hr_kv_block_bytes(&c) == 0);
    c.v_format = HR_KV_F16;
    CHECK(hr_kv_pool_create(&c, &p, &err) == HR_ERR_INVALID_ARG && p == NULL);
    c.head_dim = 64;
    CHECK(hr_kv_pool_create(&c, &p, &err) == HR_OK);
    hr_kv_pool_destroy(p);
    hr_kv_format f;
    CHECK(hr_kv_format_parse("q4h", &f, &err) == HR_OK && f == HR_KV_Q4H);
    CHECK(hr_kv_format_parse("q4_hadamard", &f, &err) == HR_OK && f == HR_KV_Q4H);
}

int main(void) {
    hr_rng rng;
    hr_rng_seed(&rng, 2026);
    test_bytes_per_token();
    test_stage_limit();
    for (int f = 0; f < HR_KV_FORMAT_COUNT; f++) test_chunk_invariance((hr_kv_format)f, &rng);
    static const int dims[] = {8, 64, 80, 128};
    for (int di = 0; di < 4; di++)
        for (int f = 0; f < HR_KV_FORMAT_COUNT; f++)
            if (f != HR_KV_Q4H || dims[di] != 80) /* q4h K needs a power of two: test_q4h_refusal */
                run_case(dims[di], (hr_kv_format)f, (hr_kv_format)f, &rng);
    test_q4h_refusal();
    run_case(80, HR_KV_F16, HR_KV_Q4H, &rng); /* q4h V alone has no rotation: any multiple of 8 */
    run_case(64, HR_KV_Q4H, HR_KV_F16, &rng);
    run_case(64, HR_KV_Q4, HR_KV_F16, &rng);
    /* K and V formats chosen separately */
    for (int f = 0; f < HR_KV_FORMAT_COUNT; f++) {
        run_case(64, (hr_kv_format)f, (hr_kv_format)((f + 3) % HR_KV_FORMAT_COUNT), &rng);
        run_case(8, (hr_kv_format)f, (hr_kv_format)((f + 1) % HR_KV_FORMAT_COUNT), &rng);
    }
    static const int enc_dims[] = {8, 16, 40, 64, 80, 128};
    for (int i = 0; i < 6; i++) {
        test_encoder_bytes(HR_KV_Q4, enc_dims[i], &rng);
        test_encoder_bytes(HR_KV_KIVI2, enc_dims[i], &rng);
        if (enc_dims[i] != 40 && enc_dims[i] != 80) test_encoder_bytes(HR_KV_Q4H, enc_dims[i], &rng);
    }
    printf("worst max-abs error vs float64 (K = V format):");
    for (int f = 0; f < HR_KV_FORMAT_COUNT; f++) printf(" %s %.2g", hr_kv_format_name(f), worst_err[f][f]);
    printf("\nworst mean-abs error vs float64 (K = V format):");
    for (int f = 0; f < HR_KV_FORMAT_COUNT; f++) printf(" %s %.2g", hr_kv_format_name(f), worst_mean[f][f]);
    printf("\nworst SIMD vs scalar relative difference: %.2g\n", worst_simd);
    return hr_test_finish();
}

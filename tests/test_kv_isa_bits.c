/* test_kv_isa_bits.c: the CPU KV storage's scalar kernels give the AVX2 kernels' bits exactly, as
 * test_tensor_simd checks for matmul: for every KV format in both roles at head_dim 8, 12 (float
 * formats), 40, 64, 80 and 128 and block sizes 16 and 32, over random data, the encoders store the
 * same bytes, and q.K scores and P.V sums (added into a nonzero accumulator) are equal bit for bit for
 * every token count 1..B; the softmax (with -inf masks) and the f16 rounding of P likewise for n
 * 1..1000; the group kernels (a KV head's query heads from one read) against the one-head ones for
 * every group of 2..8; and whole attention through two pools (scalar one head at a time, AVX2 with its
 * group path) at GQA 1, 2, 3, 4, 8, 16 and every context 1..300, with K and V formats paired, whole
 * and with the heads split in two ranges, full and under window, sinks, h2o and snapkv policies. That
 * equality is what lets --isa scalar reach attention without changing a token. Skipped (77) where the
 * CPU lacks AVX2. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/isa.h"
#include "backend/cpu/kv_cpu.h"
#include "common/util.h"
#include "harness.h"
#include "kv/kv.h"

enum { DMAX = 128, BMAX = 32, SMAX = 1000 };

static long n_compared;

/* Random values of a scale that moves per token and channel (a few large channels, some tiny
 * values), so that quantizers and sums see varied exponents. */
static float rnd(hr_rng *rng, int t, int c) {
    float v = hr_rng_normal(rng);
    if (c % 17 == 3) v += (c % 2 ? 6.0f : -6.0f);
    if ((t + c) % 29 == 7) v *= 1e-3f;
    return v * (1.0f + (float)(t % 5));
}

static bool same_bits(const void *a, const void *b, size_t n) {
    n_compared++;
    return memcmp(a, b, n) == 0;
}

/* The group kernels (dot_heads, accum_heads: G query heads of one KV head from one read of its rows)
 * against the reference's one-head kernels run G times: every head's scores and sums bit for bit, for
 * every G 2..HR_KV_ATTN_GROUP. Formats without group kernels have nothing to check. */
static void heads_dot_case(const kv_fmt *f, const kv_fmt_ops *ref, const kv_fmt_ops *simd, const uint8_t *head, int n,
                           hr_rng *rng) {
    CHECKF((simd->dot_heads != NULL) ==
               (f->format <= HR_KV_BF16 ? f->D % 8 == 0 : f->format == HR_KV_Q8 && f->G % 16 == 0),
           "%s K D=%d: group kernel present where it should not be, or missing", hr_kv_format_name(f->format), f->D);
    if (!simd->dot_heads) return;
    static float q[HR_KV_ATTN_GROUP][DMAX], want[HR_KV_ATTN_GROUP][BMAX], got[HR_KV_ATTN_GROUP][BMAX], row[DMAX];
    const float *qp[HR_KV_ATTN_GROUP];
    float *gp[HR_KV_ATTN_GROUP];
    for (int G = 2; G <= HR_KV_ATTN_GROUP; G++) {
        for (int g = 0; g < G; g++) {
            for (int c = 0; c < f->D; c++) q[g][c] = hr_rng_normal(rng) * (c % 5 == g % 5 ? 3.0f : 1.0f);
            ref->dot(f, head, n, q[g], row, want[g]);
            qp[g] = q[g];
            gp[g] = got[g];
        }
        simd->dot_heads(f, head, n, qp, G, gp);
        bool ok = true;
        for (int g = 0; g < G; g++) ok &= same_bits(want[g], got[g], (size_t)n * sizeof(float));
        CHECKF(ok, "%s K B=%d D=%d n=%d G=%d: group q.K scores differ from one head's", hr_kv_format_name(f->format),
               f->B, f->D, n, G);
    }
}

static void heads_accum_case(const kv_fmt *f, const kv_fmt_ops *ref, const kv_fmt_ops *simd, const uint8_t *head, int n,
                             hr_rng *rng) {
    CHECKF((simd->accum_heads != NULL) ==
               (f->format <= HR_KV_BF16 ? f->D % 8 == 0 : f->format == HR_KV_Q8 && f->G % 16 == 0),
           "%s V D=%d: group kernel present where it should not be, or missing", hr_kv_format_name(f->format), f->D);
    if (!simd->accum_heads) return;
    static float p[HR_KV_ATTN_GROUP][BMAX], want[HR_KV_ATTN_GROUP][DMAX], got[HR_KV_ATTN_GROUP][DMAX];
    const float *pp[HR_KV_ATTN_GROUP];
    float *gp[HR_KV_ATTN_GROUP];
    for (int G = 2; G <= HR_KV_ATTN_GROUP; G++) {
        for (int g = 0; g < G; g++) {
            for (int t = 0; t < n; t++) p[g][t] = (float)hr_rng_uniform(rng) * ((t + g) % 3 ? 1.0f : 1e-6f);
            for (int c = 0; c < f->D; c++) want[g][c] = got[g][c] = hr_rng_normal(rng);
            ref->accum(f, head, n, p[g], want[g]);
            pp[g] = p[g];
            gp[g] = got[g];
        }
        simd->accum_heads(f, head, n, pp, G, gp);
        bool ok = true;
        for (int g = 0; g < G; g++) ok &= same_bits(want[g], got[g], (size_t)f->D * sizeof(float));
        CHECKF(ok, "%s V B=%d D=%d n=%d G=%d: group P.V sums differ from one head's", hr_kv_format_name(f->format),
               f->B, f->D, n, G);
    }
}

static void kernel_case(hr_kv_format fmt, int role, int B, int D, hr_rng *rng) {
    kv_fmt f;
    hr_error err = {0};
    if (kv_fmt_init(&f, fmt, role, B, D, &err) != HR_OK) return; /* q4h K needs a power of two */
    kv_fmt_ops ref, simd;
    kv_fmt_ops_ref(&f, &ref);
    kv_fmt_ops_ref(&f, &simd);
    kv_fmt_ops_avx2(&f, &simd);
    uint8_t *h1 = aligned_alloc(64, (f.head_bytes + 63) / 64 * 64),
            *h2 = aligned_alloc(64, (f.head_bytes + 63) / 64 * 64);
    CHECK(h1 && h2);
    if (!h1 || !h2) {
        free(h1);
        free(h2);
        return;
    }
    static float x[BMAX][DMAX], q[DMAX], row[DMAX], s1[BMAX], s2[BMAX], p[BMAX], a0[DMAX], a1[DMAX], a2[DMAX];
    static uint16_t stage[BMAX * DMAX];
    const char *name = hr_kv_format_name(fmt), *rn = role == KV_K ? "K" : "V";
    for (int rep = 0; rep < 3; rep++) {
        memset(h1, 0, f.head_bytes);
        memset(h2, 0, f.head_bytes);
        for (int t = 0; t < B; t++)
            for (int c = 0; c < D; c++) x[t][c] = rnd(rng, t + rep, c);
        if (f.deferred) {
            for (int t = 0; t < B; t++)
                for (int c = 0; c < D; c++) stage[t * D + c] = kv_f32_to_f16(x[t][c]);
            ref.enc_block(&f, h1, stage);
            simd.enc_block(&f, h2, stage);
        } else {
            for (int t = 0; t < B; t++) {
                ref.enc_token(&f, h1, t, x[t]);
                simd.enc_token(&f, h2, t, x[t]);
            }
        }
        CHECKF(same_bits(h1, h2, f.head_bytes), "%s %s B=%d D=%d: encoders store different bytes", name, rn, B, D);
        for (int n = 1; n <= B; n++) {
            if (role == KV_K) {
                for (int c = 0; c < D; c++) q[c] = hr_rng_normal(rng) * (c % 7 == 0 ? 4.0f : 1.0f);
                ref.dot(&f, h1, n, q, row, s1);
                simd.dot(&f, h1, n, q, row, s2);
                CHECKF(same_bits(s1, s2, (size_t)n * sizeof *s1), "%s K B=%d D=%d n=%d: q.K scores differ", name, B, D,
                       n);
                heads_dot_case(&f, &ref, &simd, h1, n, rng);
            } else {
                for (int t = 0; t < n; t++) p[t] = (float)hr_rng_uniform(rng) * (t % 3 ? 1.0f : 1e-6f);
                for (int c = 0; c < D; c++) a0[c] = hr_rng_normal(rng);
                memcpy(a1, a0, sizeof a0);
                memcpy(a2, a0, sizeof a0);
                ref.accum(&f, h1, n, p, a1);
                simd.accum(&f, h1, n, p, a2);
                CHECKF(same_bits(a1, a2, (size_t)D * sizeof *a1), "%s V B=%d D=%d n=%d: P.V sums differ", name, B, D,
                       n);
                heads_accum_case(&f, &ref, &simd, h1, n, rng);
                /* a latent cache's V (its first nc channels): accum's bits there on both paths, the rest
                 * of the accumulator untouched */
                for (int nc = 16; ref.accum_first && nc < D; nc += 16) {
                    float b1[DMAX], b2[DMAX];
                    memcpy(b1, a0, sizeof b1);
                    memcpy(b2, a0, sizeof b2);
                    ref.accum_first(&f, h1, n, p, nc, b1);
                    simd.accum_first(&f, h1, n, p, nc, b2);
                    CHECKF(same_bits(b1, a1, (size_t)nc * sizeof *b1) && same_bits(b2, a1, (size_t)nc * sizeof *b2) &&
                               same_bits(b1 + nc, a0 + nc, (size_t)(D - nc) * sizeof *b1) &&
                               same_bits(b2 + nc, a0 + nc, (size_t)(D - nc) * sizeof *b2),
                           "%s V B=%d D=%d n=%d: the first %d channels' P.V sums differ from the whole row's", name, B,
                           D, n, nc);
                }
            }
        }
    }
    free(h1);
    free(h2);
}

static void test_kernels(hr_rng *rng) {
    static const int dims[] = {8, 12, 40, 64, 80, 128}, blocks[] = {16, 32};
    for (int fmt = 0; fmt < HR_KV_FORMAT_COUNT; fmt++)
        for (int role = 0; role < 2; role++)
            for (int bi = 0; bi < 2; bi++)
                for (int di = 0; di < 6; di++)
                    if (dims[di] % 8 == 0 || fmt <= HR_KV_BF16)
                        kernel_case((hr_kv_format)fmt, role, blocks[bi], dims[di], rng);
    /* the stage's f16 view at the q4/kivi2 shapes is the F16 kernel: covered above */
}

static void test_softmax(hr_rng *rng) {
    static float x[SMAX], y1[SMAX], y2[SMAX];
    for (int n = 1; n <= SMAX; n += n < 40 ? 1 : 7) {
        for (int t = 0; t < n; t++) x[t] = hr_rng_normal(rng) * 8.0f;
        if (n > 3) x[n / 3] = -INFINITY; /* a masked token */
        if (n > 5) x[n / 5] = -200.0f;   /* below exp's clamp once scaled */
        float scale = 0.125f + (float)(n % 4);
        memcpy(y1, x, (size_t)n * sizeof *x);
        memcpy(y2, x, (size_t)n * sizeof *x);
        float sum1 = kv_softmax_ref(y1, n, scale), sum2 = kv_softmax_avx2(y2, n, scale);
        CHECKF(same_bits(&sum1, &sum2, sizeof sum1) && same_bits(y1, y2, (size_t)n * sizeof *y1),
               "softmax n=%d: sums %.9g vs %.9g", n, sum1, sum2);
        /* P rounded to f16 after 1 / sum, as attention does for an f16 V; tiny values reach f16's
         * subnormals */
        kv_scale_round_f16_ref(y1, n, 1.0f / sum1);
        kv_scale_round_f16_avx2(y2, n, 1.0f / sum2);
        CHECKF(same_bits(y1, y2, (size_t)n * sizeof *y1), "f16 rounding of P, n=%d", n);
    }
}

/* Whole attention through a scalar and an AVX2 pool: same writes, same queries, same bits. */
enum { HKV = 2, NCTX = 300, GMAX = 16 };
static hr_kv_pool *make(int D, hr_kv_format kf, hr_kv_format vf, const char *isa, int q_per_kv) {
    hr_kv_config c = {.q_per_kv = q_per_kv,
                      .n_layers = 1,
                      .n_kv_heads = HKV,
                      .head_dim = D,
                      .block_size = 16,
                      .k_format = kf,
                      .v_format = vf,
                      .max_seqs = 1,
                      .isa = isa};
    c.budget_bytes = hr_kv_block_bytes(&c) * (NCTX / 16 + 2) + hr_kv_fixed_bytes(&c);
    hr_kv_pool *p = NULL;
    hr_error err = {0};
    hr_status rc = hr_kv_pool_create(&c, &p, &err);
    CHECKF(rc == HR_OK, "%s", err.msg);
    return rc == HR_OK ? p : NULL;
}

static void attention_case(int D, hr_kv_format kf, hr_kv_format vf, const char *policy, hr_rng *rng) {
    /* the scalar pool one head at a time; the AVX2 one takes a KV head's query heads together (up to
     * HR_KV_ATTN_GROUP) where the formats have group kernels */
    hr_kv_pool *ps = make(D, kf, vf, "scalar", 0), *pv = make(D, kf, vf, "avx2", GMAX);
    hr_error err = {0};
    hr_kv_seq ss = -1, sv = -1;
    if (!ps || !pv || hr_kv_seq_create(ps, &ss, &err) != HR_OK || hr_kv_seq_create(pv, &sv, &err) != HR_OK) {
        CHECKF(false, "K %s V %s D=%d: pools: %s", hr_kv_format_name(kf), hr_kv_format_name(vf), D, err.msg);
        hr_kv_pool_destroy(ps);
        hr_kv_pool_destroy(pv);
        return;
    }
    CHECK(strcmp(hr_kv_pool_isa(ps), "scalar") == 0 && strcmp(hr_kv_pool_isa(pv), "avx2") == 0);
    if (policy) { /* the view path: masks, dropped blocks, h2o's scores summed over the heads */
        hr_kv_policy pol;
        CHECKF(hr_kv_policy_parse(policy, &pol, &err) == HR_OK && hr_kv_seq_set_policy(ps, ss, &pol, &err) == HR_OK &&
                   hr_kv_seq_set_policy(pv, sv, &pol, &err) == HR_OK,
               "policy %s: %s", policy, err.msg);
    }
    static float q[GMAX * HKV * DMAX], o1[GMAX * HKV * DMAX], o2[GMAX * HKV * DMAX], o3[GMAX * HKV * DMAX],
        kb[HKV * DMAX], vb[HKV * DMAX];
    static float scratch[HR_KV_ATTN_GROUP * (NCTX + 32) + 2 * DMAX + 64];
    CHECK(hr_kv_attention_scratch_floats(ps, NCTX) <= HR_ARRAY_LEN(scratch) &&
          hr_kv_attention_scratch_floats(pv, NCTX) <= HR_ARRAY_LEN(scratch) &&
          hr_kv_attention_scratch_floats(pv, NCTX) >= HR_KV_ATTN_GROUP * (size_t)NCTX);
    int bad = 0;
    for (int pos = 0; pos < NCTX && !bad; pos++) {
        CHECK(hr_kv_seq_reserve(ps, ss, pos + 1, &err) == HR_OK && hr_kv_seq_reserve(pv, sv, pos + 1, &err) == HR_OK);
        for (int i = 0; i < HKV * D; i++) {
            kb[i] = rnd(rng, pos, i % D);
            vb[i] = hr_rng_normal(rng);
        }
        hr_kv_write(ps, 0, ss, pos, kb, vb);
        hr_kv_write(pv, 0, sv, pos, kb, vb);
        int32_t tok = pos;
        hr_kv_seq_commit(ps, ss, &tok, 1);
        hr_kv_seq_commit(pv, sv, &tok, 1);
        static const int ratios[] = {1, 2, 3, 4, 8, 16};
        int ratio = ratios[pos % 6], H = HKV * ratio; /* GQA 1, 2, 3, 4, 8, 16 in turn */
        for (int i = 0; i < H * D; i++) q[i] = hr_rng_normal(rng) * 2.0f;
        float scale = 1.0f / sqrtf((float)D);
        hr_kv_attention(ps, 0, ss, pos + 1, q, H, scale, o1, scratch);
        hr_kv_attention(pv, 0, sv, pos + 1, q, H, scale, o2, scratch);
        if (!same_bits(o1, o2, (size_t)H * D * sizeof *o1)) bad = pos + 1;
        /* the heads cut in two ranges that split a group (threads sharing a token): the same bits */
        int cut = H > 1 ? 1 + pos % (H - 1) : 1;
        hr_kv_attention_heads(pv, 0, sv, pos + 1, q, H, 0, cut, scale, NULL, o3, scratch);
        hr_kv_attention_heads(pv, 0, sv, pos + 1, q, H, cut, H, scale, NULL, o3, scratch);
        if (!same_bits(o1, o3, (size_t)H * D * sizeof *o1)) bad = pos + 1;
    }
    CHECKF(!bad, "K %s V %s D=%d policy %s: scalar and avx2 attention differ at n_ctx=%d", hr_kv_format_name(kf),
           hr_kv_format_name(vf), D, policy ? policy : "full", bad);
    hr_kv_pool_destroy(ps);
    hr_kv_pool_destroy(pv);
}

static void test_attention(hr_rng *rng) {
    static const int dims[] = {8, 64, 128};
    for (int di = 0; di < 3; di++)
        for (int f = 0; f < HR_KV_FORMAT_COUNT; f++) {
            attention_case(dims[di], (hr_kv_format)f, (hr_kv_format)f, NULL, rng);
            if (dims[di] == 64)
                attention_case(64, (hr_kv_format)f, (hr_kv_format)((f + 3) % HR_KV_FORMAT_COUNT), NULL, rng);
        }
    attention_case(12, HR_KV_F16, HR_KV_F32, NULL, rng); /* head_dim past the 8-lane part */
    /* under policies (the view path), the group formats and one without group kernels */
    static const char *const policies[] = {"window:64", "sinks:4,window:48", "h2o:96", "snapkv:64"};
    static const hr_kv_format pf[] = {HR_KV_F16, HR_KV_BF16, HR_KV_F32, HR_KV_Q8};
    for (size_t i = 0; i < HR_ARRAY_LEN(policies); i++)
        for (size_t f = 0; f < HR_ARRAY_LEN(pf); f++) attention_case(64, pf[f], pf[f], policies[i], rng);
}

int main(void) {
    if (!hr_cpu_isa_has_avx2(hr_cpu_isa_select(NULL))) {
        printf("no AVX2+FMA+F16C here: nothing to compare\n");
        return 77;
    }
    hr_rng rng;
    hr_rng_seed(&rng, 23);
    test_kernels(&rng);
    test_softmax(&rng);
    test_attention(&rng);
    printf("%ld comparisons, all bit for bit\n", n_compared);
    return hr_test_finish();
}

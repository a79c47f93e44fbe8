/* test_tensor_simd.c: every kernel table this CPU has (scalar, avx2, avx512 and the default; only
 * $HEADROOM_ISA's when set) against the scalar reference and against each other:
 *   every table: every dot and tile element bit-identical to the scalar table's (one program on
 *   every CPU: tensor.h, hr_kernels_init)
 *   float weights (f32/f16/bf16 . f32): |got - ref| <= 1e-5 * sum|w*x| at k = 1..4128, odd sizes too
 *   quantized (q8_0/q4_0/q5_0/q5_1/mxfp4 . q8_0, K-quants . q8_K): the activation quantizer writes the reference's
 *   bytes; the dot equals the exact integer sums times scales within 1e-6 of sum|terms|
 *   tiles: every element bit-identical to the table's own vec_dot, for tile shapes from 1 x 1 to
 *   9 rows x 22 tokens (every register tile, its leftover rows and tokens, odd block counts)
 *   q4_0x16, q8_0x16, q4_Kx16, q5_Kx16, q6_Kx16, q5_0x16 (check_x16): the repack, the activations and every tile
 *   element against the one sequence of tensor.h computed from the plain rows, bit for bit
 * and f32 -> f16 against the CPU's F16C instruction on random bit patterns. */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "common/util.h"
#include "harness.h"

__attribute__((target("f16c"))) static uint16_t f16c_convert(float f) {
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}

static void test_f16c(hr_rng *rng) {
    int bad = 0;
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)hr_rng_next(rng);
        if (i & 1) u = (u & 0x87ffffff) | 0x30000000; /* bias toward the half range */
        float f;
        memcpy(&f, &u, sizeof f);
        if (isnan(f)) continue;
        bad += hr_f32_to_f16(f) != f16c_convert(f);
    }
    CHECKF(bad == 0, "%d floats convert differently from F16C", bad);
}

/* Exact value of a q8_0-activation dot: the integer block sums times the f32 product of scales. */
static double exact_q_dot(hr_dtype t, int64_t k, const void *w, const void *a, double *mag) {
    float *wf = malloc(sizeof(float) * (size_t)k), *af = malloc(sizeof(float) * (size_t)k);
    hr_dequantize_row_ref(t, w, wf, k);
    hr_dequantize_row_ref(hr_dtype_get_info(t)->vec_dot_type, a, af, k);
    double s = 0;
    *mag = 0;
    for (int64_t j = 0; j < k; j++) {
        s += (double)wf[j] * af[j];
        *mag += fabs((double)wf[j] * af[j]);
    }
    free(wf);
    free(af);
    return s;
}

static void check_kernels(const hr_kernels *kern, const hr_kernels *scalar, hr_rng *rng) {
    static const hr_dtype types[] = {HR_DTYPE_F32,  HR_DTYPE_F16,  HR_DTYPE_BF16, HR_DTYPE_Q8_0,
                                     HR_DTYPE_Q4_0, HR_DTYPE_Q5_0, HR_DTYPE_Q5_1, HR_DTYPE_Q4_K,
                                     HR_DTYPE_Q5_K, HR_DTYPE_Q6_K, HR_DTYPE_MXFP4};
    static const int64_t float_ks[] = {1, 7, 8, 9, 15, 16, 17, 31, 33, 65, 96, 100, 4096, 4128};
    static const int64_t q_ks[] = {32, 64, 96, 4096, 4128, 16416}; /* 16416: past the tiles' prepared tables */
    static const int64_t k_ks[] = {256, 512, 4096};
    enum { NR = 9, NT = 22 }; /* 22: two of the float tiles' 16-token passes and 2 left over */
    static const int shapes[][2] = {{1, 1},  {4, 1}, {5, 1}, {1, 4},  {2, 4},  {3, 5},  {5, 7},
                                    {8, 16}, {7, 2}, {8, 3}, {5, 11}, {9, 14}, {7, 21}, {NR, NT}};
    for (size_t ti = 0; ti < HR_ARRAY_LEN(types); ti++) {
        const hr_dtype t = types[ti];
        const hr_dtype_info *info = hr_dtype_get_info(t);
        const hr_type_kernels *tk = &kern->type[t];
        if (!tk->vec_dot) continue;
        const int64_t *ks = info->block_elems == 1 ? float_ks : info->block_elems == 32 ? q_ks : k_ks;
        const size_t nks = info->block_elems == 1    ? HR_ARRAY_LEN(float_ks)
                           : info->block_elems == 32 ? HR_ARRAY_LEN(q_ks)
                                                     : HR_ARRAY_LEN(k_ks);
        for (size_t ki = 0; ki < nks; ki++) {
            const int64_t k = ks[ki];
            const size_t wrow = hr_dtype_row_bytes(t, k), arow = hr_dtype_row_bytes(info->vec_dot_type, k);
            float *x = malloc(sizeof(float) * (size_t)k * NT), *wf = malloc(sizeof(float) * (size_t)k * NR);
            unsigned char *W = malloc(wrow * NR), *A = malloc(arow * NT), *Aref = malloc(arow * NT);
            for (int64_t j = 0; j < k * NR; j++) wf[j] = hr_rng_normal(rng) * (j % 7 == 0 ? 4.0f : 1.0f);
            for (int64_t j = 0; j < k * NT; j++) x[j] = hr_rng_normal(rng);
            if (k >= 32) { /* exact ties for the q8_0 rounding: amax 127 makes d = 1 */
                x[0] = 127;
                for (int j = 1; j < 32; j++) x[j] = (float)(j - 16) + 0.5f;
            }
            for (int r = 0; r < NR; r++) hr_quantize_row_ref(t, wf + r * k, W + r * wrow, k);
            int bad_q = 0, bad_dot = 0, bad_tile = 0, bad_isa = 0;
            double worst = 0;
            for (int a = 0; a < NT; a++) {
                tk->quantize_act(x + a * k, A + a * arow, k);
                hr_quantize_row_ref(info->vec_dot_type, x + a * k, Aref + a * arow, k);
                bad_q += memcmp(A + a * arow, Aref + a * arow, arow) != 0;
            }
            float y[NR * NT], dots[NR * NT];
            for (int a = 0; a < NT; a++)
                for (int r = 0; r < NR; r++) {
                    dots[a * NR + r] = tk->vec_dot(k, W + r * wrow, A + a * arow);
                    const float s = scalar->type[t].vec_dot(k, W + r * wrow, A + a * arow);
                    bad_isa += memcmp(&s, &dots[a * NR + r], sizeof s) != 0;
                }
            for (size_t si = 0; si < HR_ARRAY_LEN(shapes); si++) {
                const int nr = shapes[si][0], nt = shapes[si][1];
                tk->vec_dot_tile(k, W, wrow, nr, A, arow, nt, y, NR);
                for (int a = 0; a < nt; a++)
                    for (int r = 0; r < nr; r++)
                        bad_tile += memcmp(&dots[a * NR + r], &y[a * NR + r], sizeof y[0]) != 0;
            }
            for (int a = 0; a < NT; a++) {
                for (int r = 0; r < NR; r++) {
                    const float got = dots[a * NR + r];
                    double mag;
                    const double want = exact_q_dot(t, k, W + r * wrow, A + a * arow, &mag);
                    const double tol = info->block_elems == 1 ? 1e-5 : 1e-6;
                    const double e = fabs(got - want) / (mag + 1e-30);
                    worst = fmax(worst, e);
                    bad_dot += e > tol;
                }
            }
            CHECKF(bad_q == 0, "%s/%s k=%lld: %d activation rows differ from the reference quantizer", kern->isa,
                   info->name, (long long)k, bad_q);
            CHECKF(bad_dot == 0, "%s/%s k=%lld: %d dots off (worst rel %g)", kern->isa, info->name, (long long)k,
                   bad_dot, worst);
            CHECKF(bad_isa == 0, "%s/%s k=%lld: %d dots differ from the scalar table's bits", kern->isa, info->name,
                   (long long)k, bad_isa);
            CHECKF(bad_tile == 0, "%s/%s k=%lld: %d tile elements differ from vec_dot", kern->isa, info->name,
                   (long long)k, bad_tile);
            /* dequantize entries equal the reference */
            float *d1 = malloc(sizeof(float) * (size_t)k), *d2 = malloc(sizeof(float) * (size_t)k);
            tk->dequantize(W, d1, k);
            hr_dequantize_row_ref(t, W, d2, k);
            CHECK(!memcmp(d1, d2, sizeof(float) * (size_t)k));
            free(d1);
            free(d2);
            free(x);
            free(wf);
            free(W);
            free(A);
            free(Aref);
        }
    }
}

/* The 6-bit scale and min of sub-block j of a q4_K super-block (the format's packing, written here
 * again so that the test does not lean on the code under test). */
static void k4_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* The one sequence of tensor.h for weight row w (plain q4_0 / q8_0 / q4_K) and activation row a
 * (the reference's q8_0 / q8_K), computed from the plain layouts. */
static float x16_expected(hr_dtype ft, int64_t k, const char *w, const char *a) {
    float acc = 0.0f;
    if (ft == HR_DTYPE_Q6_K) {
        /* the format's values: q6_K element e of half h = e / 128, l = e % 32, quarter q = (e % 128) / 32 */
        const hr_block_q6_K *x = (const void *)w;
        const hr_block_q8_K *q = (const void *)a;
        for (int64_t b = 0; b < k / 256; b++) {
            int32_t isum = 0;
            for (int g = 0; g < 16; g++) {
                int32_t s = 0;
                for (int e = 16 * g; e < 16 * g + 16; e++) {
                    const int h = e / 128, qq = (e % 128) / 32, l = e % 32;
                    const int lo = (x[b].ql[64 * h + 32 * (qq & 1) + l] >> (4 * (qq / 2))) & 15;
                    const int hi = (x[b].qh[32 * h + l] >> (2 * qq)) & 3;
                    s += ((lo | hi << 4) - 32) * q[b].qs[e];
                }
                isum += x[b].scales[g] * s;
            }
            acc = fmaf(hr_f16_to_f32(x[b].d) * q[b].d, (float)isum, acc);
        }
        return acc;
    }
    if (ft == HR_DTYPE_Q4_K || ft == HR_DTYPE_Q5_K) {
        /* q4_K and q5_K share d, dmin, scales and the nibbles' places; q5_K adds bit sb of qh[l] */
        const bool q5 = ft == HR_DTYPE_Q5_K;
        const hr_block_q8_K *q = (const void *)a;
        for (int64_t b = 0; b < k / 256; b++) {
            const hr_block_q4_K *x4 = (const hr_block_q4_K *)w + b;
            const hr_block_q5_K *x5 = (const hr_block_q5_K *)w + b;
            const hr_f16 d = q5 ? x5->d : x4->d, dmin = q5 ? x5->dmin : x4->dmin;
            const uint8_t *scales = q5 ? x5->scales : x4->scales, *qs = q5 ? x5->qs : x4->qs;
            const float dw = hr_f16_to_f32(d), mw = hr_f16_to_f32(dmin);
            int32_t isum = 0, msum = 0;
            for (int sb = 0; sb < 8; sb++) {
                int sc, m;
                k4_scale_min(sb, scales, &sc, &m);
                int32_t qd = 0, ys = 0;
                for (int l = 0; l < 32; l++) {
                    const int e = 32 * sb + l; /* element; its nibble: byte 32 (sb / 2) + l, high for odd sb */
                    const int nib =
                        ((qs[32 * (sb / 2) + l] >> (4 * (sb & 1))) & 15) | (q5 ? ((x5->qh[l] >> sb) & 1) << 4 : 0);
                    qd += nib * q[b].qs[e];
                    ys += q[b].qs[e];
                }
                isum += sc * qd;
                msum += m * ys;
            }
            acc = fmaf(dw * q[b].d, (float)isum, acc);
            acc = fmaf(-(mw * q[b].d), (float)msum, acc);
        }
        return acc;
    }
    const hr_block_q8_0 *ab = (const void *)a;
    for (int64_t b = 0; b < k / 32; b++) {
        int32_t isum = 0;
        float dw;
        if (ft == HR_DTYPE_Q5_0) { /* element j: nibble j % 16 (low for j < 16) and bit j of qh */
            const hr_block_q5_0 *x = (const hr_block_q5_0 *)w + b;
            for (int j = 0; j < 32; j++) {
                const int nib = j < 16 ? x->qs[j] & 15 : x->qs[j - 16] >> 4;
                const int bit = (x->qh[j / 8] >> (j % 8)) & 1;
                isum += ((nib | bit << 4) - 16) * ab[b].qs[j];
            }
            dw = hr_f16_to_f32(x->d);
        } else if (ft == HR_DTYPE_Q4_0) {
            const hr_block_q4_0 *x = (const hr_block_q4_0 *)w + b;
            for (int j = 0; j < 16; j++)
                isum += ((x->qs[j] & 15) - 8) * ab[b].qs[j] + ((x->qs[j] >> 4) - 8) * ab[b].qs[j + 16];
            dw = hr_f16_to_f32(x->d);
        } else {
            const hr_block_q8_0 *x = (const hr_block_q8_0 *)w + b;
            for (int j = 0; j < 32; j++) isum += x->qs[j] * ab[b].qs[j];
            dw = hr_f16_to_f32(x->d);
        }
        acc = fmaf(dw * hr_f16_to_f32(ab[b].d), (float)isum, acc);
    }
    return acc;
}

/* q4_0x16 / q8_0x16 / q4_Kx16 (16 interleaved rows): the repack is exact (unpack gives the plain
 * rows back), the activation quantizer writes the reference q8_0's / q8_K's values with the sums the
 * layout needs, and every tile element, for groups x token counts of every tile width and its
 * leftovers, equals the one sequence of tensor.h computed here from the plain rows. Bit for bit, in
 * every table. q8_0 weights include -128 (a file may hold it; the quantizer never writes it). */
static void check_x16(const hr_kernels *kern, hr_dtype xt, hr_rng *rng) {
    static const int64_t ks32[] = {32, 64, 96, 2048, 4128, 16416}, ks256[] = {256, 512, 4096, 16640};
    static const int nrs[] = {16, 48};
    static const int nts[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33};
    const hr_dtype ft = hr_dtype_get_info(xt)->file_type;
    const hr_dtype at = hr_dtype_get_info(ft)->vec_dot_type;  /* the reference's activations */
    const hr_dtype xat = hr_dtype_get_info(xt)->vec_dot_type; /* the layout's */
    const int qk = hr_dtype_get_info(ft)->block_elems;
    const char *xname = hr_dtype_get_info(xt)->name;
    const hr_type_kernels *tk = &kern->type[xt];
    CHECK(tk->vec_dot_tile && tk->quantize_act && !tk->vec_dot);
    const int64_t *ks = qk == 256 ? ks256 : ks32;
    const size_t nks = qk == 256 ? HR_ARRAY_LEN(ks256) : HR_ARRAY_LEN(ks32);
    for (size_t ki = 0; ki < nks; ki++)
        for (size_t ri = 0; ri < HR_ARRAY_LEN(nrs); ri++) {
            const int64_t k = ks[ki], nb = k / qk;
            const int nr = nrs[ri], NTMAX = 33;
            const size_t ws = hr_dtype_row_bytes(ft, k), as = hr_dtype_row_bytes(xat, k);
            const size_t aps = hr_dtype_row_bytes(at, k), ablk = hr_dtype_get_info(at)->block_bytes;
            float *x = malloc(sizeof(float) * (size_t)k);
            char *plain = malloc(ws * (size_t)nr), *W = malloc(ws * (size_t)nr), *tmp = malloc(ws * HR_X16);
            char *A = malloc(as * (size_t)NTMAX), *Ap = malloc(aps * (size_t)NTMAX);
            float *y = malloc(sizeof(float) * (size_t)(nr + 1) * NTMAX);
            for (int r = 0; r < nr; r++) {
                const float scale = r % 5 == 0 ? 1e-3f : r % 5 == 1 ? 30.0f : 1.0f;
                for (int64_t j = 0; j < k; j++) x[j] = scale * (float)(hr_rng_uniform(rng) * 2.0 - 1.0);
                if (r == 3) memset(x, 0, sizeof(float) * (size_t)k); /* an all-zero row: scale 0 */
                hr_quantize_row_ref(ft, x, plain + (size_t)r * ws, k);
                if (r == 7 && qk == 256) { /* any bytes: the quantizer's scales are >= 0, a file's need not be */
                    char *row = plain + (size_t)r * ws;
                    for (size_t i = 0; i < ws; i++) {
                        const size_t off = i % hr_dtype_get_info(ft)->block_bytes;
                        const bool keep = ft == HR_DTYPE_Q6_K ? off >= 208 : off < 4; /* d (and dmin) stay sane */
                        if (!keep) row[i] = (char)hr_rng_next(rng);
                    }
                }
                if (ft == HR_DTYPE_Q8_0 && (r == 5 || r == 6)) { /* -128 here and there, a whole block in row 6 */
                    hr_block_q8_0 *blk = (hr_block_q8_0 *)(plain + (size_t)r * ws);
                    for (int64_t b = 0; b < nb; b += 3)
                        for (int j = 0; j < 32; j += r == 6 ? 1 : 7) blk[b].qs[j] = -128;
                }
            }
            memcpy(W, plain, ws * (size_t)nr);
            hr_x16_repack(xt, W, nr, k, tmp);
            CHECK(memcmp(W, plain, ws * (size_t)nr) != 0);
            hr_x16_unpack(xt, W, nr, k, tmp);
            CHECKF(!memcmp(W, plain, ws * (size_t)nr), "%s k=%lld: unpack does not give the rows back", xname,
                   (long long)k);
            hr_x16_repack(xt, W, nr, k, tmp);
            int bad_act = 0;
            for (int t = 0; t < NTMAX; t++) {
                for (int64_t j = 0; j < k; j++) x[j] = (float)(hr_rng_uniform(rng) * 4.0 - 2.0);
                tk->quantize_act(x, A + (size_t)t * as, k);
                hr_quantize_row_ref(at, x, Ap + (size_t)t * aps, k);
                for (int64_t b = 0; b < nb; b++) {
                    const char *ref = Ap + (size_t)t * aps + (size_t)b * ablk;
                    if (xat == at) { /* q6_Kx16 takes the plain q8_K blocks */
                        bad_act += memcmp(ref, A + (size_t)t * as + (size_t)b * ablk, ablk) != 0;
                    } else if (xat == HR_DTYPE_Q8_0S) {
                        hr_block_q8_0s want;
                        hr_q8_0s_from_q8_0((const hr_block_q8_0 *)ref, &want);
                        bad_act += memcmp(&want, (const hr_block_q8_0s *)(A + (size_t)t * as) + b, sizeof want) != 0;
                    } else {
                        hr_block_q8_Ks want;
                        hr_q8_Ks_from_q8_K((const hr_block_q8_K *)ref, &want);
                        bad_act += memcmp(&want, (const hr_block_q8_Ks *)(A + (size_t)t * as) + b, sizeof want) != 0;
                    }
                }
            }
            CHECKF(bad_act == 0, "%s %s k=%lld: %d activation blocks differ from the reference's", kern->isa, xname,
                   (long long)k, bad_act);
            for (size_t ti = 0; ti < HR_ARRAY_LEN(nts); ti++) {
                const int nt = nts[ti];
                const size_t ys = (size_t)nr + 1; /* a stride past the rows */
                tk->vec_dot_tile(k, W, ws, nr, A, as, nt, y, ys);
                int bad = 0;
                for (int t = 0; t < nt; t++)
                    for (int r = 0; r < nr; r++) {
                        const float want = x16_expected(ft, k, plain + (size_t)r * ws, Ap + (size_t)t * aps);
                        const float got = y[(size_t)t * ys + (size_t)r];
                        bad += memcmp(&got, &want, sizeof want) != 0;
                    }
                CHECKF(bad == 0, "%s %s k=%lld %d rows x %d tokens: %d elements differ from the sequence", kern->isa,
                       xname, (long long)k, nr, nt, bad);
            }
            free(x);
            free(plain);
            free(W);
            free(tmp);
            free(A);
            free(Ap);
            free(y);
        }
}

int main(void) {
    const char *pinned = hr_test_isa();
    hr_rng rng;
    hr_rng_seed(&rng, 1234);
    const hr_cpu_features f = hr_cpu_detect();
    if (f.f16c) test_f16c(&rng);
    /* force_isa picks lower ISAs and clamps higher ones to what the CPU has */
    hr_kernels probe;
    hr_kernels_init(&probe, f, "scalar");
    CHECK(!strcmp(probe.isa, "scalar") && probe.type[HR_DTYPE_Q4_K].vec_dot && probe.type[HR_DTYPE_BF16].vec_dot_tile);
    hr_kernels_init(&probe, f, "avx512");
    const char *clamped = !hr_kernels_isa_available(f, "avx2")     ? "scalar"
                          : !hr_kernels_isa_available(f, "avx512") ? "avx2"
                                                                   : NULL; /* NULL: avx512 or avx2 */
    CHECK(clamped ? !strcmp(probe.isa, clamped) : strcmp(probe.isa, "scalar") != 0);
    hr_kernels_init(&probe, f, NULL);
    CHECK(!strcmp(probe.isa, "scalar") == !hr_kernels_isa_available(f, "avx2"));
    char desc[256];
    const int dn = hr_kernels_describe(&probe, desc, sizeof desc);
    printf("default table: %s (%s)\n", probe.isa, desc);
    CHECK(dn > 0 && (size_t)dn < sizeof desc && strstr(desc, "q4_0 ") && strstr(desc, "f32 "));
    CHECK(hr_kernels_describe(&probe, desc, 8) == dn && strlen(desc) == 7);
    hr_cpu_features none = {0};
    hr_kernels_init(&probe, none, "avx2");
    CHECK(!strcmp(probe.isa, "scalar"));
    CHECK(hr_kernels_isa_available(none, "scalar") && !hr_kernels_isa_available(none, "avx2") &&
          !hr_kernels_isa_available(f, "sse9"));
    hr_kernels scalar;
    hr_kernels_init(&scalar, f, "scalar");
    int ran = 0;
    /* NULL: the default table, which mixes ISAs per type on an AVX-512 CPU */
    static const char *isas[] = {"scalar", "avx2", "avx512", NULL};
    for (size_t i = 0; i < HR_ARRAY_LEN(isas); i++) {
        if (pinned && (!isas[i] || strcmp(isas[i], pinned))) continue;
        if (isas[i] && !hr_kernels_isa_available(f, isas[i])) {
            printf("note: %s not available on this CPU, not tested\n", isas[i]);
            continue;
        }
        hr_kernels kern;
        hr_kernels_init(&kern, f, isas[i]);
        hr_kernels_describe(&kern, desc, sizeof desc);
        printf("table %s: %s\n", isas[i] ? isas[i] : "(default)", desc);
        check_kernels(&kern, &scalar, &rng);
        check_x16(&kern, HR_DTYPE_Q4_0X16, &rng);
        check_x16(&kern, HR_DTYPE_Q8_0X16, &rng);
        check_x16(&kern, HR_DTYPE_Q4_KX16, &rng);
        check_x16(&kern, HR_DTYPE_Q5_KX16, &rng);
        check_x16(&kern, HR_DTYPE_Q6_KX16, &rng);
        check_x16(&kern, HR_DTYPE_Q5_0X16, &rng);
        ran++;
    }
    CHECK(ran >= 1);
    return hr_test_finish();
}

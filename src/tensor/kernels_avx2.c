/* kernels_avx2.c: AVX2 + FMA + F16C kernels for q8_0 and q4_0 weights (against q8_0 activations)
 * and the q8_0 activation quantizer (float weights: kernels_float_avx2.c).
 *
 * Reduction order (what makes results batch-invariant): each dot keeps one 8-lane f32 accumulator
 * per (weight row, activation row) pair, adds blocks in increasing order, and finishes with
 * hsum8(). The tiles below do exactly this per pair; they only share the loads and the nibble
 * unpacking between pairs. */
#include <immintrin.h>
#include <math.h>

#include "tensor/kernels_internal.h"

/* Horizontal sum of 8 floats in a fixed order: (lo128 + hi128), then pairs. */
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float f16_to_f32(hr_f16 h) { return _cvtsh_ss(h); }

/* ---- q8_0 activation quantizer: same formula as the reference (d = amax/127, q = round(x/d),
 * half away from zero), so it produces the same bytes ---- */

void hr_avx2_quantize_q8_0(const float *x, void *dst, int64_t k) {
    hr_block_q8_0 *y = dst;
    const __m256 sign_mask = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < k / HR_QK8_0; i++) {
        const float *xb = x + i * HR_QK8_0;
        __m256 v[4];
        __m256 amax = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(xb + 8 * j);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, v[j]));
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float d = _mm_cvtss_f32(m) / 127.0f;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = hr_f32_to_f16(d);
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int j = 0; j < 4; j++) {
            /* roundf (ties away from zero): round to nearest even, then move the ties that went
             * toward zero; s - r is exact here, so a tie shows as exactly +-0.5 */
            const __m256 s = _mm256_mul_ps(v[j], vid);
            __m256 r = _mm256_round_ps(s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __m256 diff = _mm256_sub_ps(s, r);
            const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
            const __m256 up = _mm256_and_ps(_mm256_cmp_ps(diff, _mm256_set1_ps(0.5f), _CMP_EQ_OQ),
                                            _mm256_cmp_ps(s, zero, _CMP_GT_OQ));
            const __m256 dn = _mm256_and_ps(_mm256_cmp_ps(diff, _mm256_set1_ps(-0.5f), _CMP_EQ_OQ),
                                            _mm256_cmp_ps(s, zero, _CMP_LT_OQ));
            r = _mm256_sub_ps(_mm256_add_ps(r, _mm256_and_ps(up, one)), _mm256_and_ps(dn, one));
            q[j] = _mm256_cvtps_epi32(r);
        }
        /* pack 32 int32 -> 32 int8 in order (packs work per 128-bit lane, so fix the order) */
        __m256i p01 = _mm256_packs_epi32(q[0], q[1]);
        __m256i p23 = _mm256_packs_epi32(q[2], q[3]);
        __m256i p = _mm256_packs_epi16(p01, p23);
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)y[i].qs, p);
    }
}

/* ---- q8_0 and q4_0 weights against q8_0 activations ---- */

/* 32 signed bytes of a q4_0 block in q8_0 element order: low nibbles then high nibbles, minus 8. */
static inline __m256i unpack_q4_0(const uint8_t *qs) {
    const __m128i tmp = _mm_loadu_si128((const __m128i *)qs);
    const __m256i bytes = _mm256_set_m128i(_mm_srli_epi16(tmp, 4), tmp);
    return _mm256_sub_epi8(_mm256_and_si256(bytes, _mm256_set1_epi8(0x0F)), _mm256_set1_epi8(8));
}

/* Sum of products of 32 signed bytes in 8 int32 lanes -> f32; `ax` = |x|. */
static inline __m256 dot_i8(__m256i ax, __m256i x, __m256i y) {
    const __m256i sy = _mm256_sign_epi8(y, x);
    const __m256i s16 = _mm256_maddubs_epi16(ax, sy);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(s16, _mm256_set1_epi16(1)));
}

/* One weight block ready for the dots: its signed bytes, their absolute values and its scale. */
typedef struct wblk {
    __m256i q, a;
    float d;
} wblk;

static inline wblk load_wblk(const char *row, int64_t ib, const bool q4) {
    wblk x;
    if (q4) {
        const hr_block_q4_0 *b = (const hr_block_q4_0 *)row + ib;
        x.d = f16_to_f32(b->d);
        x.q = unpack_q4_0(b->qs);
    } else {
        const hr_block_q8_0 *b = (const hr_block_q8_0 *)row + ib;
        x.d = f16_to_f32(b->d);
        x.q = _mm256_loadu_si256((const __m256i *)b->qs);
    }
    x.a = _mm256_sign_epi8(x.q, x.q);
    return x;
}

/* The per-pair step every shape runs, block after block: acc += (dx * dy) * sum_i8(x, y). */
static inline __m256 step(__m256 acc, wblk x, __m256i yq, float dy) {
    return _mm256_fmadd_ps(_mm256_set1_ps(x.d * dy), dot_i8(x.a, x.q, yq), acc);
}

#define ACT(t)   ((const hr_block_q8_0 *)(a + (size_t)(t)*as) + ib)
#define ACT_Q(t) _mm256_loadu_si256((const __m256i *)ACT(t)->qs)
#define ACT_D(t) f16_to_f32(ACT(t)->d)

/* The shapes are written out so every compiler keeps the accumulators in registers. */

static inline __attribute__((always_inline)) float tile_1x1(int64_t nb, const char *w, const char *a, const bool q4) {
    const size_t as = 0;
    __m256 c = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib++) c = step(c, load_wblk(w, ib, q4), ACT_Q(0), ACT_D(0));
    return hsum8(c);
}

/* 2 rows x 1 token (decode) */
static inline __attribute__((always_inline)) void tile_2x1(int64_t nb, const char *w, size_t ws, const char *a,
                                                           float *y, const bool q4) {
    const size_t as = 0;
    __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib++) {
        const __m256i yq = ACT_Q(0);
        const float dy = ACT_D(0);
        c0 = step(c0, load_wblk(w, ib, q4), yq, dy);
        c1 = step(c1, load_wblk(w + ws, ib, q4), yq, dy);
    }
    y[0] = hsum8(c0);
    y[1] = hsum8(c1);
}

/* 1 row x 4 tokens */
static inline __attribute__((always_inline)) void tile_1x4(int64_t nb, const char *w, const char *a, size_t as,
                                                           float *y, size_t ys, const bool q4) {
    __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps(), c2 = _mm256_setzero_ps(), c3 = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib++) {
        const wblk x = load_wblk(w, ib, q4);
        c0 = step(c0, x, ACT_Q(0), ACT_D(0));
        c1 = step(c1, x, ACT_Q(1), ACT_D(1));
        c2 = step(c2, x, ACT_Q(2), ACT_D(2));
        c3 = step(c3, x, ACT_Q(3), ACT_D(3));
    }
    y[0] = hsum8(c0);
    y[ys] = hsum8(c1);
    y[2 * ys] = hsum8(c2);
    y[3 * ys] = hsum8(c3);
}

/* 2 rows x 4 tokens (the batch tile) */
static inline __attribute__((always_inline)) void tile_2x4(int64_t nb, const char *w, size_t ws, const char *a,
                                                           size_t as, float *y, size_t ys, const bool q4) {
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c02 = _mm256_setzero_ps(), c03 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps(), c12 = _mm256_setzero_ps(), c13 = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib++) {
        const wblk x0 = load_wblk(w, ib, q4), x1 = load_wblk(w + ws, ib, q4);
        __m256i yq = ACT_Q(0);
        float dy = ACT_D(0);
        c00 = step(c00, x0, yq, dy);
        c10 = step(c10, x1, yq, dy);
        yq = ACT_Q(1);
        dy = ACT_D(1);
        c01 = step(c01, x0, yq, dy);
        c11 = step(c11, x1, yq, dy);
        yq = ACT_Q(2);
        dy = ACT_D(2);
        c02 = step(c02, x0, yq, dy);
        c12 = step(c12, x1, yq, dy);
        yq = ACT_Q(3);
        dy = ACT_D(3);
        c03 = step(c03, x0, yq, dy);
        c13 = step(c13, x1, yq, dy);
    }
    y[0] = hsum8(c00);
    y[1] = hsum8(c10);
    y[ys] = hsum8(c01);
    y[ys + 1] = hsum8(c11);
    y[2 * ys] = hsum8(c02);
    y[2 * ys + 1] = hsum8(c12);
    y[3 * ys] = hsum8(c03);
    y[3 * ys + 1] = hsum8(c13);
}

float hr_avx2_dot_q8_0(int64_t k, const void *w, const void *a) { return tile_1x1(k / HR_QK8_0, w, a, false); }
float hr_avx2_dot_q4_0(int64_t k, const void *w, const void *a) { return tile_1x1(k / HR_QK8_0, w, a, true); }

/* 2 x 4 tiles, then the odd row, then leftover tokens in 2 x 1 and 1 x 1. */
static inline __attribute__((always_inline)) void tile_driver(int64_t k, const char *w, size_t ws, int nr,
                                                              const char *a, size_t as, int nt, float *y, size_t ys,
                                                              const bool q4) {
    const int64_t nb = k / HR_QK8_0;
    int t = 0;
    for (; t + 4 <= nt; t += 4) {
        const char *at = a + (size_t)t * as;
        float *yt = y + (size_t)t * ys;
        int r = 0;
        for (; r + 2 <= nr; r += 2) tile_2x4(nb, w + (size_t)r * ws, ws, at, as, yt + r, ys, q4);
        for (; r < nr; r++) tile_1x4(nb, w + (size_t)r * ws, at, as, yt + r, ys, q4);
    }
    for (; t < nt; t++) {
        const char *at = a + (size_t)t * as;
        float *yt = y + (size_t)t * ys;
        int r = 0;
        for (; r + 2 <= nr; r += 2) tile_2x1(nb, w + (size_t)r * ws, ws, at, yt + r, q4);
        for (; r < nr; r++) yt[r] = tile_1x1(nb, w + (size_t)r * ws, at, q4);
    }
}

void hr_avx2_tile_q8_0(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                       float *y, size_t y_stride) {
    tile_driver(k, w, w_stride, nr, a, a_stride, nt, y, y_stride, false);
}

void hr_avx2_tile_q4_0(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                       float *y, size_t y_stride) {
    tile_driver(k, w, w_stride, nr, a, a_stride, nt, y, y_stride, true);
}

/* kernels_mxfp4_avx2.c: AVX2 dot and tile of MXFP4 weights against q8_0 activations (the order the
 * scalar build in kernels_mxfp4.c reproduces).
 *
 * Blocks go in pairs: one register holds the 16 code bytes of block b in its low half and of b + 1 in
 * its high half; one AND and one shift+AND give both blocks' codes of elements 0..15 and 16..31, and a
 * byte shuffle through the doubled E2M1 table turns codes into signed values (-12..12). The activations
 * are rearranged the same way (two lane shuffles). Products go through maddubs as |v| * (y with v's
 * sign) (exact: |p| <= 4 * 12 * 127 per int16), then madd by 1 to int32: lanes 0-3 block b, 4-7 block
 * b + 1. The float part: acc = fma([dx_b x4, dx_b+1 x4] * [dy_b x4, dy_b+1 x4], cvt(s), acc), pairs in
 * order, then hsum8. The tile computes each (row, token) pair exactly as the dot: up to 4 tokens share
 * each decoded weight pair. */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/kernels_internal.h"

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

typedef struct mx_w {
    __m256i lo, hi; /* signed values of elements 0..15 and 16..31 of both blocks */
    __m256 d;       /* [dx_b x4, dx_b+1 x4] */
} mx_w;

typedef struct mx_a {
    __m256i lo, hi; /* the activations, same layout */
    __m256 d;
} mx_a;

static inline __attribute__((always_inline)) mx_w load_w(const hr_block_mxfp4 *b, const bool two) {
    const __m128i q0 = _mm_loadu_si128((const __m128i *)b[0].qs);
    const __m256i q = _mm256_set_m128i(two ? _mm_loadu_si128((const __m128i *)b[1].qs) : _mm_setzero_si128(), q0);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)HR_MXFP4_VALUES));
    mx_w x;
    x.lo = _mm256_shuffle_epi8(table, _mm256_and_si256(q, m4));
    x.hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
    const float d0 = hr_mxfp4_half_scale(b[0].e), d1 = two ? hr_mxfp4_half_scale(b[1].e) : 0.0f;
    x.d = _mm256_set_m128(_mm_set1_ps(d1), _mm_set1_ps(d0));
    return x;
}

static inline __attribute__((always_inline)) mx_a load_a(const hr_block_q8_0 *b, const bool two) {
    const __m256i y0 = _mm256_loadu_si256((const __m256i *)b[0].qs);
    const __m256i y1 = two ? _mm256_loadu_si256((const __m256i *)b[1].qs) : _mm256_setzero_si256();
    mx_a y;
    y.lo = _mm256_permute2x128_si256(y0, y1, 0x20);
    y.hi = _mm256_permute2x128_si256(y0, y1, 0x31);
    uint16_t h0, h1 = 0;
    memcpy(&h0, &b[0].d, 2);
    if (two) memcpy(&h1, &b[1].d, 2);
    const __m128i h = _mm_cvtsi32_si128((int)(h0 | (uint32_t)h1 << 16));
    y.d = _mm256_cvtph_ps(_mm_shuffle_epi8(h, _mm_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3)));
    return y;
}

static inline __attribute__((always_inline)) __m256 step(__m256 acc, const mx_w *x, const mx_a *y) {
    const __m256i p =
        _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(x->lo, x->lo), _mm256_sign_epi8(y->lo, x->lo)),
                         _mm256_maddubs_epi16(_mm256_sign_epi8(x->hi, x->hi), _mm256_sign_epi8(y->hi, x->hi)));
    const __m256i s = _mm256_madd_epi16(p, _mm256_set1_epi16(1));
    return _mm256_fmadd_ps(_mm256_mul_ps(x->d, y->d), _mm256_cvtepi32_ps(s), acc);
}

float hr_avx2_dot_mxfp4(int64_t k, const void *w, const void *a) {
    const hr_block_mxfp4 *x = w;
    const hr_block_q8_0 *y = a;
    const int64_t nb = k / HR_QK_MXFP4;
    __m256 acc = _mm256_setzero_ps();
    int64_t ib = 0;
    for (; ib + 2 <= nb; ib += 2) {
        const mx_w wx = load_w(x + ib, true);
        const mx_a ay = load_a(y + ib, true);
        acc = step(acc, &wx, &ay);
    }
    if (ib < nb) {
        const mx_w wx = load_w(x + ib, false);
        const mx_a ay = load_a(y + ib, false);
        acc = step(acc, &wx, &ay);
    }
    return hsum8(acc);
}

/* One row against n (1..4) tokens: each weight pair decoded once for all of them. */
static void row_x4(int64_t nb, const hr_block_mxfp4 *x, const char *a, size_t a_stride, int n, float *y,
                   size_t y_stride) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t ib = 0;
    for (; ib + 2 <= nb; ib += 2) {
        const mx_w wx = load_w(x + ib, true);
        for (int t = 0; t < n; t++) {
            const mx_a ay = load_a((const hr_block_q8_0 *)(a + (size_t)t * a_stride) + ib, true);
            acc[t] = step(acc[t], &wx, &ay);
        }
    }
    if (ib < nb) {
        const mx_w wx = load_w(x + ib, false);
        for (int t = 0; t < n; t++) {
            const mx_a ay = load_a((const hr_block_q8_0 *)(a + (size_t)t * a_stride) + ib, false);
            acc[t] = step(acc[t], &wx, &ay);
        }
    }
    for (int t = 0; t < n; t++) y[(size_t)t * y_stride] = hsum8(acc[t]);
}

void hr_avx2_tile_mxfp4(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                        float *y, size_t y_stride) {
    const int64_t nb = k / HR_QK_MXFP4;
    for (int t0 = 0; t0 < nt; t0 += 4) {
        const int n = nt - t0 < 4 ? nt - t0 : 4;
        for (int r = 0; r < nr; r++)
            row_x4(nb, (const hr_block_mxfp4 *)((const char *)w + (size_t)r * w_stride),
                   (const char *)a + (size_t)t0 * a_stride, a_stride, n, y + (size_t)t0 * y_stride + r, y_stride);
    }
}

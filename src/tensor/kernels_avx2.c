/* kernels_avx2.c: AVX2 + FMA + F16C kernels for f32, f16, bf16 (against f32 activations) and q8_0,
 * q4_0 (against q8_0 activations), plus the q8_0 activation quantizer.
 *
 * Reduction order (what makes results batch-invariant): each dot keeps one 8-lane f32 accumulator
 * per (weight row, activation row) pair, adds blocks in increasing order, and finishes with
 * hsum8() then, for float types, the scalar tail. The tiles below do exactly this per pair; they only
 * share the loads and nibble unpacking between pairs. */
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

/* ---- float weights against f32 activations: 4 accumulators of 8 lanes over 32-element steps,
 * then 8-element steps into acc0, then a scalar tail ---- */

#define HR_FLOAT_DOT_BODY(LOAD)                                                                                        \
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                                                     \
    __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();                                                     \
    int64_t i = 0;                                                                                                     \
    for (; i + 32 <= k; i += 32) {                                                                                     \
        acc0 = _mm256_fmadd_ps(LOAD(i), _mm256_loadu_ps(y + i), acc0);                                                 \
        acc1 = _mm256_fmadd_ps(LOAD(i + 8), _mm256_loadu_ps(y + i + 8), acc1);                                         \
        acc2 = _mm256_fmadd_ps(LOAD(i + 16), _mm256_loadu_ps(y + i + 16), acc2);                                       \
        acc3 = _mm256_fmadd_ps(LOAD(i + 24), _mm256_loadu_ps(y + i + 24), acc3);                                       \
    }                                                                                                                  \
    for (; i + 8 <= k; i += 8) acc0 = _mm256_fmadd_ps(LOAD(i), _mm256_loadu_ps(y + i), acc0);                          \
    float sum = hsum8(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));

float hr_avx2_dot_f32(int64_t k, const void *w, const void *a) {
    const float *x = w, *y = a;
#define LOAD_F32(j) _mm256_loadu_ps(x + (j))
    HR_FLOAT_DOT_BODY(LOAD_F32)
    for (; i < k; i++) sum = fmaf(x[i], y[i], sum);
    return sum;
}

float hr_avx2_dot_f16(int64_t k, const void *w, const void *a) {
    const hr_f16 *x = w;
    const float *y = a;
#define LOAD_F16(j) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + (j))))
    HR_FLOAT_DOT_BODY(LOAD_F16)
    for (; i < k; i++) sum = fmaf(f16_to_f32(x[i]), y[i], sum);
    return sum;
}

float hr_avx2_dot_bf16(int64_t k, const void *w, const void *a) {
    const hr_bf16 *x = w;
    const float *y = a;
#define LOAD_BF16(j)                                                                                                   \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + (j)))), 16))
    HR_FLOAT_DOT_BODY(LOAD_BF16)
    for (; i < k; i++) sum = fmaf(hr_bf16_to_f32(x[i]), y[i], sum);
    return sum;
}

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

#define HR_TILE_R 2
#define HR_TILE_T 4

/* R x T dot products of q8_0 (q4 = false) or q4_0 (q4 = true) rows against q8_0 activation rows.
 * With R = T = 1 this is the vec_dot; larger tiles run the identical per-pair sequence. */
static inline __attribute__((always_inline)) void tile_q(int64_t k, const char *w, size_t ws, const char *a, size_t as,
                                                         float *y, size_t ys, const int R, const int T, const bool q4) {
    const int64_t nb = k / HR_QK8_0;
    const size_t wbytes = q4 ? sizeof(hr_block_q4_0) : sizeof(hr_block_q8_0);
    __m256 acc[HR_TILE_R][HR_TILE_T];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib++) {
        __m256i xq[HR_TILE_R], xa[HR_TILE_R];
        float dx[HR_TILE_R];
        for (int r = 0; r < R; r++) {
            const char *blk = w + (size_t)r * ws + (size_t)ib * wbytes;
            if (q4) {
                const hr_block_q4_0 *b = (const hr_block_q4_0 *)blk;
                dx[r] = f16_to_f32(b->d);
                xq[r] = unpack_q4_0(b->qs);
            } else {
                const hr_block_q8_0 *b = (const hr_block_q8_0 *)blk;
                dx[r] = f16_to_f32(b->d);
                xq[r] = _mm256_loadu_si256((const __m256i *)b->qs);
            }
            xa[r] = _mm256_sign_epi8(xq[r], xq[r]);
        }
        for (int t = 0; t < T; t++) {
            const hr_block_q8_0 *b = (const hr_block_q8_0 *)(a + (size_t)t * as) + ib;
            const float dy = f16_to_f32(b->d);
            const __m256i yq = _mm256_loadu_si256((const __m256i *)b->qs);
            for (int r = 0; r < R; r++) {
                const __m256 d = _mm256_set1_ps(dx[r] * dy);
                acc[r][t] = _mm256_fmadd_ps(d, dot_i8(xa[r], xq[r], yq), acc[r][t]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < T; t++) y[(size_t)t * ys + (size_t)r] = hsum8(acc[r][t]);
}

float hr_avx2_dot_q8_0(int64_t k, const void *w, const void *a) {
    float out;
    tile_q(k, w, 0, a, 0, &out, 0, 1, 1, false);
    return out;
}

float hr_avx2_dot_q4_0(int64_t k, const void *w, const void *a) {
    float out;
    tile_q(k, w, 0, a, 0, &out, 0, 1, 1, true);
    return out;
}

/* Full HR_TILE_R x HR_TILE_T tiles, the edges one pair at a time (same per-pair sequence). */
static inline __attribute__((always_inline)) void tile_driver(int64_t k, const char *w, size_t ws, int nr,
                                                              const char *a, size_t as, int nt, float *y, size_t ys,
                                                              const bool q4) {
    int t = 0;
    for (; t + HR_TILE_T <= nt; t += HR_TILE_T) {
        int r = 0;
        for (; r + HR_TILE_R <= nr; r += HR_TILE_R)
            tile_q(k, w + (size_t)r * ws, ws, a + (size_t)t * as, as, y + (size_t)t * ys + r, ys, HR_TILE_R, HR_TILE_T,
                   q4);
        for (; r < nr; r++)
            tile_q(k, w + (size_t)r * ws, ws, a + (size_t)t * as, as, y + (size_t)t * ys + r, ys, 1, HR_TILE_T, q4);
    }
    for (; t < nt; t++) {
        int r = 0;
        for (; r + HR_TILE_R <= nr; r += HR_TILE_R)
            tile_q(k, w + (size_t)r * ws, ws, a + (size_t)t * as, as, y + (size_t)t * ys + r, ys, HR_TILE_R, 1, q4);
        for (; r < nr; r++)
            tile_q(k, w + (size_t)r * ws, ws, a + (size_t)t * as, as, y + (size_t)t * ys + r, ys, 1, 1, q4);
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

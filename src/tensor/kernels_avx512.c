/* kernels_avx512.c: AVX-512 dots for f32, bf16 (against f32 activations), f16 (against f16) and q8_0, q4_0 (against
 * q8_0 activations), using only AVX-512F/BW instructions (what hr_kernels_init checks). Only reached
 * when hr_cpu_detect reports AVX-512; test_tensor_simd checks every function against the scalar
 * reference on machines that have it (the AVX2-only dev machine compiles but cannot run them).
 *
 * Reduction order: one 16-lane f32 accumulator set per dot, blocks in increasing order, a fixed
 * horizontal sum, then (float types) a scalar tail. The AVX-512 table's tiles call these per pair. */
#include <immintrin.h>
#include <math.h>

#include "tensor/kernels_internal.h"

/* Fixed-order horizontal sum: (lo256 + hi256), then as hsum8. */
static inline float hsum16(__m512 v) {
    /* the 64x4 extract is AVX-512F (the 32x8 one would need DQ, which is not checked at run time) */
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#define HR_FLOAT_DOT512_BODY(LOAD, LOADA)                                                                              \
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();                                                     \
    __m512 acc2 = _mm512_setzero_ps(), acc3 = _mm512_setzero_ps();                                                     \
    int64_t i = 0;                                                                                                     \
    for (; i + 64 <= k; i += 64) {                                                                                     \
        acc0 = _mm512_fmadd_ps(LOAD(i), LOADA(i), acc0);                                                               \
        acc1 = _mm512_fmadd_ps(LOAD(i + 16), LOADA(i + 16), acc1);                                                     \
        acc2 = _mm512_fmadd_ps(LOAD(i + 32), LOADA(i + 32), acc2);                                                     \
        acc3 = _mm512_fmadd_ps(LOAD(i + 48), LOADA(i + 48), acc3);                                                     \
    }                                                                                                                  \
    for (; i + 16 <= k; i += 16) acc0 = _mm512_fmadd_ps(LOAD(i), LOADA(i), acc0);                                      \
    float sum = hsum16(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));

/* f32 activations */
#define LOAD_Y(j) _mm512_loadu_ps(y + (j))

float hr_avx512_dot_f32(int64_t k, const void *w, const void *a) {
    const float *x = w, *y = a;
#define LOAD_F32(j) _mm512_loadu_ps(x + (j))
    HR_FLOAT_DOT512_BODY(LOAD_F32, LOAD_Y)
    for (; i < k; i++) sum = fmaf(x[i], y[i], sum);
    return sum;
}

/* f16 weights against f16 activations (ggml's vec_dot_type for f16) */
float hr_avx512_dot_f16(int64_t k, const void *w, const void *a) {
    const hr_f16 *x = w, *yh = a;
#define LOAD_F16(j)     _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + (j))))
#define LOAD_F16_ACT(j) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(yh + (j))))
    HR_FLOAT_DOT512_BODY(LOAD_F16, LOAD_F16_ACT)
    for (; i < k; i++) sum = fmaf(_cvtsh_ss(x[i]), _cvtsh_ss(yh[i]), sum);
    return sum;
}

float hr_avx512_dot_bf16(int64_t k, const void *w, const void *a) {
    const hr_bf16 *x = w;
    const float *y = a;
#define LOAD_BF16(j)                                                                                                   \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(x + (j)))), 16))
    HR_FLOAT_DOT512_BODY(LOAD_BF16, LOAD_Y)
    for (; i < k; i++) sum = fmaf(hr_bf16_to_f32(x[i]), y[i], sum);
    return sum;
}

/* ---- quantized: two 32-element blocks per 512-bit register; lanes 0-7 hold block ib, 8-15 block ib+1 ---- */

static inline __m256i unpack_q4_0(const uint8_t *qs) {
    const __m128i tmp = _mm_loadu_si128((const __m128i *)qs);
    const __m256i bytes = _mm256_set_m128i(_mm_srli_epi16(tmp, 4), tmp);
    return _mm256_sub_epi8(_mm256_and_si256(bytes, _mm256_set1_epi8(0x0F)), _mm256_set1_epi8(8));
}

/* Products of signed bytes x*y summed in groups of 4 -> 16 int32 lanes -> f32. */
static inline __m512 dot_i8x64(__m512i x, __m512i y) {
    const __m512i ax = _mm512_abs_epi8(x);
    const __m512i sy = _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(x), _mm512_setzero_si512(), y);
    const __m512i s16 = _mm512_maddubs_epi16(ax, sy);
    return _mm512_cvtepi32_ps(_mm512_madd_epi16(s16, _mm512_set1_epi16(1)));
}

static inline float dot_q_blocks(int64_t k, const void *w, const hr_block_q8_0 *y, const bool q4) {
    const int64_t nb = k / HR_QK8_0;
    const hr_block_q8_0 *x8 = w;
    const hr_block_q4_0 *x4 = w;
    __m512 acc = _mm512_setzero_ps();
    int64_t ib = 0;
    for (; ib + 2 <= nb; ib += 2) {
        __m256i lo, hi;
        float d0, d1;
        if (q4) {
            lo = unpack_q4_0(x4[ib].qs);
            hi = unpack_q4_0(x4[ib + 1].qs);
            d0 = _cvtsh_ss(x4[ib].d) * _cvtsh_ss(y[ib].d);
            d1 = _cvtsh_ss(x4[ib + 1].d) * _cvtsh_ss(y[ib + 1].d);
        } else {
            lo = _mm256_loadu_si256((const __m256i *)x8[ib].qs);
            hi = _mm256_loadu_si256((const __m256i *)x8[ib + 1].qs);
            d0 = _cvtsh_ss(x8[ib].d) * _cvtsh_ss(y[ib].d);
            d1 = _cvtsh_ss(x8[ib + 1].d) * _cvtsh_ss(y[ib + 1].d);
        }
        const __m512i xq = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        const __m512i yq = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)y[ib].qs)),
                                              _mm256_loadu_si256((const __m256i *)y[ib + 1].qs), 1);
        const __m512 d = _mm512_castpd_ps(
            _mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(d0)), _mm256_castps_pd(_mm256_set1_ps(d1)), 1));
        acc = _mm512_fmadd_ps(d, dot_i8x64(xq, yq), acc);
    }
    if (ib < nb) { /* odd block count: the last block in lanes 0-7, zeros above */
        __m256i lo;
        float d0;
        if (q4) {
            lo = unpack_q4_0(x4[ib].qs);
            d0 = _cvtsh_ss(x4[ib].d) * _cvtsh_ss(y[ib].d);
        } else {
            lo = _mm256_loadu_si256((const __m256i *)x8[ib].qs);
            d0 = _cvtsh_ss(x8[ib].d) * _cvtsh_ss(y[ib].d);
        }
        const __m512i xq = _mm512_inserti64x4(_mm512_setzero_si512(), lo, 0);
        const __m512i yq = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_loadu_si256((const __m256i *)y[ib].qs), 0);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d0), dot_i8x64(xq, yq), acc);
    }
    return hsum16(acc);
}

float hr_avx512_dot_q8_0(int64_t k, const void *w, const void *a) { return dot_q_blocks(k, w, a, false); }
float hr_avx512_dot_q4_0(int64_t k, const void *w, const void *a) { return dot_q_blocks(k, w, a, true); }

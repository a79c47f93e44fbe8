/* simd_avx2.h: the small AVX2 helpers every AVX2 kernel file shares (one definition, one order of
 * operations: a sum or a scale pair computed here has the same bits in every kernel that uses it). */
#ifndef HR_BACKEND_CPU_SIMD_AVX2_H
#define HR_BACKEND_CPU_SIMD_AVX2_H

#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "common/exp_avx2.h" /* hr_exp_neg8 */
#include "tensor/tensor.h"

/* The horizontal sum of 8 floats in one fixed order: halves, then pairs, then the last two. */
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* [f16 at p x4, f16 at p + stride x4] as floats (zeros above when !two): two blocks' scales. */
static inline __m256 f16_scale_pair(const char *p, size_t stride, const bool two) {
    uint16_t h0, h1 = 0;
    memcpy(&h0, p, 2);
    if (two) memcpy(&h1, p + stride, 2);
    const __m128i h = _mm_cvtsi32_si128((int)(h0 | (uint32_t)h1 << 16));
    return _mm256_cvtph_ps(_mm_shuffle_epi8(h, _mm_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3)));
}

/* Two q8_0 activation blocks (b[1] as zeros when !two) laid out for the 32-element pair kernels
 * (q4_0, q5_0, q5_1): *lo = elements 0..15 of both blocks, *hi = 16..31 (block b in the low 128 bits
 * of each, b + 1 in the high); returns each int32 lane's sum of its 8 activations (exact). */
static inline __attribute__((always_inline)) __m256i q8_0_pair_lanes(const hr_block_q8_0 *b, const bool two,
                                                                     __m256i *lo, __m256i *hi) {
    const __m256i y0 = _mm256_loadu_si256((const __m256i *)b[0].qs);
    const __m256i y1 = two ? _mm256_loadu_si256((const __m256i *)b[1].qs) : _mm256_setzero_si256();
    *lo = _mm256_permute2x128_si256(y0, y1, 0x20);
    *hi = _mm256_permute2x128_si256(y0, y1, 0x31);
    const __m256i ones8 = _mm256_set1_epi8(1);
    const __m256i sum16 = _mm256_add_epi16(_mm256_maddubs_epi16(ones8, *lo), _mm256_maddubs_epi16(ones8, *hi));
    return _mm256_madd_epi16(sum16, _mm256_set1_epi16(1));
}

#endif

/* simd_avx2.h: the small AVX2 helpers every AVX2 kernel file shares (one definition, one order of
 * operations: a sum or a scale pair computed here has the same bits in every kernel that uses it). */
#ifndef HR_BACKEND_CPU_SIMD_AVX2_H
#define HR_BACKEND_CPU_SIMD_AVX2_H

#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

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

#endif

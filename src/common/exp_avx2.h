/* exp_avx2.h: exp of 8 non-positive floats at once (for files built with AVX2 and FMA only): what a
 * softmax's scores after their maximum, SwiGLU's -|g| and the sampler's logprobs need. One definition,
 * so each of them gets the same bits for the same input. */
#ifndef HR_COMMON_EXP_AVX2_H
#define HR_COMMON_EXP_AVX2_H

#include <immintrin.h>

/* exp for x <= 0 (a softmax's scores after the max, SwiGLU's -|g|): Cody-Waite reduction by ln 2 and
 * a degree-6 polynomial (the Cephes expf coefficients); about 1 ulp. Below -87.3 the result is clamped
 * there (NaN too: _mm256_max_ps gives its second operand). hr_exp_neg (backend/cpu/ops.h) is one lane of
 * it, the
 * same steps, so the same bits. */
static inline __m256 hr_exp_neg8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

#endif

/* kernels_avx2.c: the q8_0 activation quantizer (AVX2) and the AVX2 build of the q8_0 dot and tiles
 * (the code is in kernels_q8_0_tile.h, shared with the AVX-512 VNNI build; q4_0: kernels_q4_avx2.c;
 * float weights: kernels_float_avx2.c). */
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/kernels_internal.h"

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

#define HR_Q_VNNI    0
#define HR_QFN(name) hr_avx2_##name
#include "backend/cpu/kernels_q8_0_tile.h"

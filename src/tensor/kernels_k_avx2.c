/* kernels_k_avx2.c: AVX2 dots of the K-quants (q4_K, q5_K, q6_K) against q8_K activations.
 *
 * Per super-block the integer sums of q * y, weighted by the integer sub-block scales, collect in
 * 8 int32 lanes; then acc += d * lanes (one FMA, blocks in order) and the scalar min/offset term is
 * kept apart; the result is hsum8(acc) - offsets. Exact integers up to that float step. */
#include <immintrin.h>

#include "tensor/kernels_internal.h"

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* sum over pairs of (u8 q) * (i8 y), then times a 16-bit scale: 8 int32 lanes */
static inline __m256i scaled_dot(__m256i q, __m256i y, __m256i scale16) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), scale16);
}

/* Sub-block scales and the q8_K-bsum-weighted sum of mins of a q4_K/q5_K super-block. */
static inline int32_t scales_mins(const uint8_t scales[HR_K_SCALE_SIZE], const hr_block_q8_K *y, uint8_t sc[8]) {
    int32_t summ = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t m;
        hr_get_scale_min_k4(j, scales, &sc[j], &m);
        summ += m * (y->bsums[2 * j] + y->bsums[2 * j + 1]);
    }
    return summ;
}

float hr_avx2_dot_q4_K(int64_t k, const void *w, const void *a) {
    const hr_block_q4_K *x = w;
    const hr_block_q8_K *y = a;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps();
    float msum = 0;
    for (int64_t i = 0; i < k / HR_QK_K; i++) {
        uint8_t sc[8];
        const int32_t summ = scales_mins(x[i].scales, &y[i], sc);
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            const __m256i q4 = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c));
            const __m256i lo = _mm256_and_si256(q4, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            const __m256i ylo = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * c));
            const __m256i yhi = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * c + 32));
            sumi = _mm256_add_epi32(sumi, scaled_dot(lo, ylo, _mm256_set1_epi16(sc[2 * c])));
            sumi = _mm256_add_epi32(sumi, scaled_dot(hi, yhi, _mm256_set1_epi16(sc[2 * c + 1])));
        }
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        const float dmin = _cvtsh_ss(x[i].dmin) * y[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        msum += dmin * (float)summ;
    }
    return hsum8(acc) - msum;
}

float hr_avx2_dot_q5_K(int64_t k, const void *w, const void *a) {
    const hr_block_q5_K *x = w;
    const hr_block_q8_K *y = a;
    const __m256i m4 = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(16);
    __m256 acc = _mm256_setzero_ps();
    float msum = 0;
    for (int64_t i = 0; i < k / HR_QK_K; i++) {
        uint8_t sc[8];
        const int32_t summ = scales_mins(x[i].scales, &y[i], sc);
        const __m256i hbits = _mm256_loadu_si256((const __m256i *)x[i].qh);
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            const __m256i q4 = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c));
            const __m256i blo = _mm256_set1_epi8((char)(1 << (2 * c)));
            const __m256i bhi = _mm256_set1_epi8((char)(1 << (2 * c + 1)));
            const __m256i h_lo = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, blo), blo), sixteen);
            const __m256i h_hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, bhi), bhi), sixteen);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(q4, m4), h_lo);
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4, 4), m4), h_hi);
            const __m256i ylo = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * c));
            const __m256i yhi = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * c + 32));
            sumi = _mm256_add_epi32(sumi, scaled_dot(lo, ylo, _mm256_set1_epi16(sc[2 * c])));
            sumi = _mm256_add_epi32(sumi, scaled_dot(hi, yhi, _mm256_set1_epi16(sc[2 * c + 1])));
        }
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        const float dmin = _cvtsh_ss(x[i].dmin) * y[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        msum += dmin * (float)summ;
    }
    return hsum8(acc) - msum;
}

/* q6_K: q is stored as u6 = q + 32, so sum (u6 - 32) * y * sc = sum u6 * y * sc - 32 * sum sc * bsums
 * (the q8_K bsums cover exactly the 16-element scale groups). */
float hr_avx2_dot_q6_K(int64_t k, const void *w, const void *a) {
    const hr_block_q6_K *x = w;
    const hr_block_q8_K *y = a;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    float osum = 0;
    for (int64_t i = 0; i < k / HR_QK_K; i++) {
        const int8_t *sc = x[i].scales;
        int32_t offs = 0;
        for (int g = 0; g < 16; g++) offs += sc[g] * y[i].bsums[g];
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h));
            const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(x[i].ql + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
            for (int m = 0; m < 4; m++) {
                const int g = 8 * h + 2 * m; /* scale groups of elements 128h + 32m + [0,16) and [16,32) */
                const __m256i yv = _mm256_loadu_si256((const __m256i *)(y[i].qs + 128 * h + 32 * m));
                const __m256i s16 = _mm256_set_m128i(_mm_set1_epi16(sc[g + 1]), _mm_set1_epi16(sc[g]));
                sumi = _mm256_add_epi32(sumi, scaled_dot(q[m], yv, s16));
            }
        }
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        osum += d * (float)(32 * offs);
    }
    return hsum8(acc) - osum;
}

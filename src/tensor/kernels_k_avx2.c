/* kernels_k_avx2.c: AVX2 dots and tiles of the K-quants (q4_K, q5_K, q6_K) against q8_K activations.
 *
 * Per super-block, a weight block is unpacked once into eight 32-byte vectors of small unsigned
 * values (plus its per-sub-block 16-bit scales), then dotted with each activation row of the tile.
 * The integer part (sum of scale * q * y, minus the q6_K offset) is exact, so how it is grouped does
 * not matter; the float part is one fixed sequence per (row, token) pair, the same for the lone dot
 * and for every tile:
 *     acc = fma(set1(d_w * d_y), cvt(sumi), acc)        blocks in order
 *     ms  = fmaf(dmin_w * d_y, (float)summ, ms)          (q4_K, q5_K: the mins term)
 *     result = hsum8(acc) - ms                           (q6_K: hsum8(acc))  */
#include <immintrin.h>
#include <math.h>

#include "tensor/kernels_internal.h"

#define HR_K_TILE_TOKENS 64 /* activation rows handled per unpacked weight block */

/* gcc -O2 does not unroll the fixed 4- and 8-step loops by itself; unrolled, the block stays in registers. */
#define HR_UNROLL _Pragma("GCC unroll 8")

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* One super-block of weights, unpacked: q[j] holds elements 32j..32j+31 as unsigned bytes, sc[j]
 * the 16-bit scale(s) for them; mins16 (q4_K/q5_K) pairs each 16-element bsum with its sub-block's
 * min, scales16 (q6_K) each 16-element bsum with its scale. */
typedef struct kblock {
    __m256i q[8], sc[8];
    __m256i mins16;   /* q4_K/q5_K: m[j] in 16-bit lanes 2j and 2j+1 */
    __m256i scales16; /* q6_K: the 16 int8 scales as 16-bit lanes */
    float d, dmin;
} kblock;

static inline void unpack_scales_k4(const uint8_t scales[HR_K_SCALE_SIZE], kblock *b) {
    int16_t mins[16];
    HR_UNROLL
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        hr_get_scale_min_k4(j, scales, &sc, &m);
        b->sc[j] = _mm256_set1_epi16(sc);
        mins[2 * j] = mins[2 * j + 1] = m;
    }
    b->mins16 = _mm256_loadu_si256((const __m256i *)mins);
}

static inline void unpack_q4_K(const hr_block_q4_K *x, kblock *b) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    HR_UNROLL
    for (int c = 0; c < 4; c++) {
        const __m256i q4 = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * c));
        b->q[2 * c] = _mm256_and_si256(q4, m4);
        b->q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
    }
    unpack_scales_k4(x->scales, b);
    b->d = _cvtsh_ss(x->d);
    b->dmin = _cvtsh_ss(x->dmin);
}

static inline void unpack_q5_K(const hr_block_q5_K *x, kblock *b) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(16);
    const __m256i hbits = _mm256_loadu_si256((const __m256i *)x->qh);
    HR_UNROLL
    for (int j = 0; j < 8; j++) {
        const __m256i q4 = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * (j / 2)));
        const __m256i nib = (j & 1) ? _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4) : _mm256_and_si256(q4, m4);
        const __m256i bit = _mm256_set1_epi8((char)(1 << j)); /* bit j of qh[l] is element 32j + l's fifth */
        const __m256i h = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, bit), bit), sixteen);
        b->q[j] = _mm256_or_si256(nib, h);
    }
    unpack_scales_k4(x->scales, b);
    b->d = _cvtsh_ss(x->d);
    b->dmin = _cvtsh_ss(x->dmin);
}

/* q6_K: stored values u = q + 32 in 0..63; the -32 is applied through the bsums. */
static inline void unpack_q6_K(const hr_block_q6_K *x, kblock *b) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    HR_UNROLL
    for (int h = 0; h < 2; h++) {
        const __m256i ql0 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h));
        const __m256i ql1 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
        b->q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
        b->q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
        b->q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
        b->q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
    }
    HR_UNROLL
    for (int j = 0; j < 8; j++) /* 16-bit lanes 0-7 come from bytes 0-15 (group 2j), 8-15 from group 2j+1 */
        b->sc[j] = _mm256_set_m128i(_mm_set1_epi16(x->scales[2 * j + 1]), _mm_set1_epi16(x->scales[2 * j]));
    b->scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
    b->d = _cvtsh_ss(x->d);
    b->dmin = 0;
}

/* Exact integer sum over the block of sc * q * y, as 8 lanes. */
static inline __m256i dot_kblock(const kblock *b, const hr_block_q8_K *y) {
    __m256i s = _mm256_setzero_si256();
    HR_UNROLL
    for (int j = 0; j < 8; j++) {
        const __m256i yv = _mm256_loadu_si256((const __m256i *)(y->qs + 32 * j));
        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(b->q[j], yv), b->sc[j]));
    }
    return s;
}

enum { K_Q4, K_Q5, K_Q6 };

static inline void unpack(const char *row, int64_t i, const int kind, kblock *b) {
    if (kind == K_Q4)
        unpack_q4_K((const hr_block_q4_K *)row + i, b);
    else if (kind == K_Q5)
        unpack_q5_K((const hr_block_q5_K *)row + i, b);
    else
        unpack_q6_K((const hr_block_q6_K *)row + i, b);
}

/* One row against nt <= HR_K_TILE_TOKENS activation rows. */
static inline __attribute__((always_inline)) void row_tile(int64_t k, const char *w, const char *a, size_t as, int nt,
                                                           float *y, size_t ys, const int kind) {
    __m256 acc[HR_K_TILE_TOKENS];
    float ms[HR_K_TILE_TOKENS];
    for (int t = 0; t < nt; t++) {
        acc[t] = _mm256_setzero_ps();
        ms[t] = 0;
    }
    kblock b;
    for (int64_t i = 0; i < k / HR_QK_K; i++) {
        unpack(w, i, kind, &b);
        for (int t = 0; t < nt; t++) {
            const hr_block_q8_K *yb = (const hr_block_q8_K *)(a + (size_t)t * as) + i;
            const __m256i bsums = _mm256_loadu_si256((const __m256i *)yb->bsums);
            __m256i s = dot_kblock(&b, yb);
            if (kind == K_Q6) s = _mm256_sub_epi32(s, _mm256_slli_epi32(_mm256_madd_epi16(b.scales16, bsums), 5));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(b.d * yb->d), _mm256_cvtepi32_ps(s), acc[t]);
            if (kind != K_Q6) {
                const int32_t summ = hsum_i32(_mm256_madd_epi16(b.mins16, bsums));
                ms[t] = fmaf(b.dmin * yb->d, (float)summ, ms[t]);
            }
        }
    }
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = hsum8(acc[t]) - ms[t];
}

static inline __attribute__((always_inline)) void tile_k(int64_t k, const char *w, size_t ws, int nr, const char *a,
                                                         size_t as, int nt, float *y, size_t ys, const int kind) {
    for (int t = 0; t < nt; t += HR_K_TILE_TOKENS) {
        const int n = nt - t < HR_K_TILE_TOKENS ? nt - t : HR_K_TILE_TOKENS;
        for (int r = 0; r < nr; r++)
            row_tile(k, w + (size_t)r * ws, a + (size_t)t * as, as, n, y + (size_t)t * ys + r, ys, kind);
    }
}

#define HR_K_KERNELS(name, kind)                                                                                       \
    float hr_avx2_dot_##name(int64_t k, const void *w, const void *a) {                                                \
        float out;                                                                                                     \
        row_tile(k, w, a, 0, 1, &out, 0, kind);                                                                        \
        return out;                                                                                                    \
    }                                                                                                                  \
    void hr_avx2_tile_##name(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride,        \
                             int nt, float *y, size_t y_stride) {                                                      \
        tile_k(k, w, w_stride, nr, a, a_stride, nt, y, y_stride, kind);                                                \
    }

HR_K_KERNELS(q4_K, K_Q4)
HR_K_KERNELS(q5_K, K_Q5)
HR_K_KERNELS(q6_K, K_Q6)

/* kernels_k_avx2.c: AVX2 dots and tiles of the K-quants (q4_K, q5_K, q6_K) against q8_K activations.
 *
 * A super-block (256 weights) is eight 32-weight chunks; chunk j's weights become 32 unsigned bytes
 * q_j (0..15, 0..31 or 0..63) and its scale(s) a vector sc_j of 16-bit lanes. The integer part per
 * (row, token) pair and super-block is eight int32 lanes
 *     s = sum_j madd(maddubs(q_j, y_j), sc_j)        (q6_K: minus 32 * madd(scales16, bsums))
 * which is exact, so it does not matter whether q_j is made on the fly (decode: one token, nothing
 * to share) or once per super-block for a tile of tokens. The float part is one fixed sequence per
 * pair, the same for the lone dot and every tile:
 *     acc  = fma(set1(d_w) * set1(d_y), cvt(s), acc)                   super-blocks in order
 *     macc = fma(set1(dmin_w) * set1(d_y), cvt(madd(mins16, bsums)), macc)   (q4_K, q5_K)
 *     result = hsum8(acc) - hsum8(macc)
 * so the only horizontal sums are two per pair, at the end. The scales are decoded with vector
 * shuffles (no per-sub-block scalar work). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "tensor/kernels_internal.h"

#define HR_K_TILE_TOKENS 64 /* activation rows handled per unpacked weight block */

/* gcc -O2 does not unroll the fixed 4- and 8-step loops by itself; unrolled, the block stays in registers. */
#define HR_UNROLL _Pragma("GCC unroll 8")

enum { K_Q4, K_Q5, K_Q6 };

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* A super-block's scales, ready to shuffle out per chunk. */
typedef struct kscale {
    __m256i src_lo, src_hi; /* 16-bit scales that chunks 0-3 and 4-7 pick from */
    __m256i corr16;         /* q4_K/q5_K: min m_j at 16-bit lanes 2j, 2j+1; q6_K: the 16 scales */
    __m256 d, dmin;         /* broadcast */
} kscale;

/* q4_K/q5_K: the 6-bit scales and mins of scales[12] (hr_get_scale_min_k4, four at a time). */
static inline kscale scales_k4(const uint8_t *scales, hr_f16 d, hr_f16 dmin) {
    uint32_t w[3];
    memcpy(w, scales, sizeof w);
    const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
    const uint32_t sc_lo = w[0] & m6, mn_lo = w[1] & m6;
    const uint32_t sc_hi = (w[2] & m4) | (((w[0] >> 6) & m2) << 4);
    const uint32_t mn_hi = ((w[2] >> 4) & m4) | (((w[1] >> 6) & m2) << 4);
    const __m128i b = _mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)mn_lo, (int)mn_hi); /* 8 scales, 8 mins */
    kscale k;
    k.src_lo = k.src_hi = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(b));
    k.corr16 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(b, b));
    k.d = _mm256_set1_ps(_cvtsh_ss(d));
    k.dmin = _mm256_set1_ps(_cvtsh_ss(dmin));
    return k;
}

static inline kscale scales_q6(const hr_block_q6_K *x) {
    kscale k;
    k.corr16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
    k.src_lo = _mm256_permute2x128_si256(k.corr16, k.corr16, 0x00);
    k.src_hi = _mm256_permute2x128_si256(k.corr16, k.corr16, 0x11);
    k.d = _mm256_set1_ps(_cvtsh_ss(x->d));
    k.dmin = _mm256_setzero_ps();
    return k;
}

/* sc_j: q4_K/q5_K: scale j in all 16 lanes; q6_K: scale 2j in lanes 0-7, 2j + 1 in lanes 8-15. */
static inline __m256i scale_j(const kscale *k, int j, const int kind) {
    if (kind != K_Q6) return _mm256_shuffle_epi8(k->src_lo, _mm256_set1_epi16((short)(((2 * j + 1) << 8) | (2 * j))));
    const int i = j & 3;
    const __m256i ctrl = _mm256_set_m128i(_mm_set1_epi16((short)(((4 * i + 3) << 8) | (4 * i + 2))),
                                          _mm_set1_epi16((short)(((4 * i + 1) << 8) | (4 * i))));
    return _mm256_shuffle_epi8(j < 4 ? k->src_lo : k->src_hi, ctrl);
}

static inline kscale block_scales(const char *row, int64_t i, const int kind) {
    if (kind == K_Q4) {
        const hr_block_q4_K *x = (const hr_block_q4_K *)row + i;
        return scales_k4(x->scales, x->d, x->dmin);
    }
    if (kind == K_Q5) {
        const hr_block_q5_K *x = (const hr_block_q5_K *)row + i;
        return scales_k4(x->scales, x->d, x->dmin);
    }
    return scales_q6((const hr_block_q6_K *)row + i);
}

/* q_j of super-block i: 32 unsigned bytes (q4_K: low nibbles of qs[32 (j/2)..] for even j, high for
 * odd; q5_K: plus bit j of qh[l] as 16; q6_K: 4 low bits from ql, 2 high from qh, value + 32). */
static inline __m256i chunk_j(const char *row, int64_t i, int j, const int kind) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    if (kind == K_Q4 || kind == K_Q5) {
        const uint8_t *qs = kind == K_Q4 ? ((const hr_block_q4_K *)row + i)->qs : ((const hr_block_q5_K *)row + i)->qs;
        const __m256i q4 = _mm256_loadu_si256((const __m256i *)(qs + 32 * (j / 2)));
        const __m256i nib = (j & 1) ? _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4) : _mm256_and_si256(q4, m4);
        if (kind == K_Q4) return nib;
        const __m256i hbits = _mm256_loadu_si256((const __m256i *)((const hr_block_q5_K *)row + i)->qh);
        const __m256i bit = _mm256_set1_epi8((char)(1 << j));
        const __m256i h = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, bit), bit), _mm256_set1_epi8(16));
        return _mm256_or_si256(nib, h);
    }
    const hr_block_q6_K *x = (const hr_block_q6_K *)row + i;
    const int h = j / 4, sub = j % 4;
    const __m256i ql = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32 * (sub & 1)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
    const __m256i lo = sub < 2 ? _mm256_and_si256(ql, m4) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * sub), _mm256_set1_epi8(3));
    return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
}

/* The float step of one pair and super-block (see the top of the file). */
static inline __attribute__((always_inline)) void pair_step(__m256 *acc, __m256 *macc, __m256i s, const kscale *k,
                                                            const hr_block_q8_K *yb, const int kind) {
    const __m256i corr = _mm256_madd_epi16(k->corr16, _mm256_loadu_si256((const __m256i *)yb->bsums));
    const __m256 dy = _mm256_set1_ps(yb->d);
    if (kind == K_Q6) s = _mm256_sub_epi32(s, _mm256_slli_epi32(corr, 5));
    *acc = _mm256_fmadd_ps(_mm256_mul_ps(k->d, dy), _mm256_cvtepi32_ps(s), *acc);
    if (kind != K_Q6) *macc = _mm256_fmadd_ps(_mm256_mul_ps(k->dmin, dy), _mm256_cvtepi32_ps(corr), *macc);
}

/* Decode: one row, one token; chunks made on the fly. */
static inline __attribute__((always_inline)) float dot_1x1(int64_t k, const char *w, const char *a, const int kind) {
    __m256 acc = _mm256_setzero_ps(), macc = _mm256_setzero_ps();
    for (int64_t i = 0; i < k / HR_QK_K; i++) {
        const hr_block_q8_K *yb = (const hr_block_q8_K *)a + i;
        const kscale ks = block_scales(w, i, kind);
        __m256i s = _mm256_setzero_si256();
        HR_UNROLL
        for (int j = 0; j < 8; j++) {
            const __m256i yv = _mm256_loadu_si256((const __m256i *)(yb->qs + 32 * j));
            s = _mm256_add_epi32(
                s, _mm256_madd_epi16(_mm256_maddubs_epi16(chunk_j(w, i, j, kind), yv), scale_j(&ks, j, kind)));
        }
        pair_step(&acc, &macc, s, &ks, yb, kind);
    }
    return hsum8(acc) - hsum8(macc);
}

/* One row against 1 < nt <= HR_K_TILE_TOKENS activation rows: each super-block unpacked once. */
static inline __attribute__((always_inline)) void row_tile(int64_t k, const char *w, const char *a, size_t as, int nt,
                                                           float *y, size_t ys, const int kind) {
    __m256 acc[HR_K_TILE_TOKENS], macc[HR_K_TILE_TOKENS];
    for (int t = 0; t < nt; t++) acc[t] = macc[t] = _mm256_setzero_ps();
    __m256i q[8], sc[8];
    for (int64_t i = 0; i < k / HR_QK_K; i++) {
        const kscale ks = block_scales(w, i, kind);
        HR_UNROLL
        for (int j = 0; j < 8; j++) {
            q[j] = chunk_j(w, i, j, kind);
            sc[j] = scale_j(&ks, j, kind);
        }
        for (int t = 0; t < nt; t++) {
            const hr_block_q8_K *yb = (const hr_block_q8_K *)(a + (size_t)t * as) + i;
            __m256i s = _mm256_setzero_si256();
            HR_UNROLL
            for (int j = 0; j < 8; j++) {
                const __m256i yv = _mm256_loadu_si256((const __m256i *)(yb->qs + 32 * j));
                s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(q[j], yv), sc[j]));
            }
            pair_step(&acc[t], &macc[t], s, &ks, yb, kind);
        }
    }
    for (int t = 0; t < nt; t++) y[(size_t)t * ys] = hsum8(acc[t]) - hsum8(macc[t]);
}

static inline __attribute__((always_inline)) void tile_k(int64_t k, const char *w, size_t ws, int nr, const char *a,
                                                         size_t as, int nt, float *y, size_t ys, const int kind) {
    if (nt == 1) {
        for (int r = 0; r < nr; r++) y[r] = dot_1x1(k, w + (size_t)r * ws, a, kind);
        return;
    }
    for (int t = 0; t < nt; t += HR_K_TILE_TOKENS) {
        const int n = nt - t < HR_K_TILE_TOKENS ? nt - t : HR_K_TILE_TOKENS;
        for (int r = 0; r < nr; r++) {
            float *yr = y + (size_t)t * ys + r;
            if (n == 1)
                *yr = dot_1x1(k, w + (size_t)r * ws, a + (size_t)t * as, kind);
            else
                row_tile(k, w + (size_t)r * ws, a + (size_t)t * as, as, n, yr, ys, kind);
        }
    }
}

#define HR_K_KERNELS(name, kind)                                                                                       \
    float hr_avx2_dot_##name(int64_t k, const void *w, const void *a) { return dot_1x1(k, w, a, kind); }               \
    void hr_avx2_tile_##name(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride,        \
                             int nt, float *y, size_t y_stride) {                                                      \
        tile_k(k, w, w_stride, nr, a, a_stride, nt, y, y_stride, kind);                                                \
    }

HR_K_KERNELS(q4_K, K_Q4)
HR_K_KERNELS(q5_K, K_Q5)
HR_K_KERNELS(q6_K, K_Q6)

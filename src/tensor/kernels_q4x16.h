/* kernels_q4x16.h: the q4_0x16 tile (16 interleaved q4_0 rows, tensor.h) against q8_0s activations,
 * written once and compiled twice: AVX-512 VNNI on 512-bit registers (kernels_q4x16_avx512.c,
 * HR_X16_512 1) and AVX2 (kernels_q4x16_avx2.c, HR_X16_512 0). The includer defines HR_X16_512 and
 * HR_X16FN(name).
 *
 * Why this layout: with the rows in the lanes, one register holds one block's integer sums for 16
 * (AVX-512) or 8 (AVX2) rows, so the float work (convert, scale, FMA) is done once per block for
 * all of them, where the 1 x 8 tiles of the plain q4_0 layout (kernels_q4_0_tile.h) spend it per
 * pair of blocks and per row: per 16 rows x 1 token x 1 block this tile runs 8 vpdpbusd and 3
 * float instructions, the plain one 16 vpdpbusd (256-bit) and 24 float.
 *
 * Per block b of a group: the 4 chunks of 64 bytes are loaded and split into low and high nibbles
 * (8 registers; unsigned, so u = x + 8) and shared by the C tokens of the tile; per token the
 * integer sum of every row starts from the activation's s8 = -8 sum(y) and adds u times 4
 * activation bytes broadcast to all lanes:
 *     AVX-512: 8 x vpdpbusd (4 products a lane each)
 *     AVX2:    8 x vpmaddubsw summed in int16 (|sum| <= 8 x 2 x 15 x 128 < 2^15), one vpmaddwd
 * giving the same exact integers isum; then acc = fma(d_w * d_y, (float)isum, acc), the sequence of
 * tensor.h, so both builds and the scalar tile (quant_x16.c) give the same bits. */
#ifndef HR_TENSOR_KERNELS_Q4X16_H
#define HR_TENSOR_KERNELS_Q4X16_H

#include <immintrin.h>
#include <string.h>

#include "tensor/kernels_internal.h"

static inline int32_t load_i32(const void *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

#if HR_X16_512
#define HR_X16_TC   16 /* tokens per tile */
#define HR_X16_ROWS 16 /* rows per register */
typedef __m512 vacc;

/* One group (16 rows) x C tokens over all nb blocks; y[t * ys + r]. */
static inline __attribute__((always_inline)) void rows_tile(const int C, int64_t nb, const hr_block_q4_0x16 *g,
                                                            int half, const char *a, size_t as, float *y, size_t ys) {
    (void)half;
    __m512 acc[HR_X16_TC];
#pragma GCC unroll 16
    for (int t = 0; t < C; t++) acc[t] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; b++) {
        __m512i lo[4], hi[4];
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            const __m512i w = _mm512_loadu_si512((const void *)(g[b].qs + 64 * v));
            lo[v] = _mm512_and_si512(w, m4);
            hi[v] = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)g[b].d));
#pragma GCC unroll 16
        for (int t = 0; t < C; t++) {
            const hr_block_q8_0s *yb = (const hr_block_q8_0s *)(a + (size_t)t * as) + b;
            __m512i s = _mm512_set1_epi32(yb->s8);
#pragma GCC unroll 4
            for (int v = 0; v < 4; v++) {
                s = _mm512_dpbusd_epi32(s, lo[v], _mm512_set1_epi32(load_i32(yb->qs + 4 * v)));
                s = _mm512_dpbusd_epi32(s, hi[v], _mm512_set1_epi32(load_i32(yb->qs + 16 + 4 * v)));
            }
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(yb->d)), _mm512_cvtepi32_ps(s), acc[t]);
        }
    }
#pragma GCC unroll 16
    for (int t = 0; t < C; t++) _mm512_storeu_ps(y + (size_t)t * ys, acc[t]);
}
#else
#define HR_X16_TC   4 /* tokens per tile: 8 nibble registers + 4 accumulators + temporaries in 16 */
#define HR_X16_ROWS 8 /* rows per register: a group is two halves */

static inline __attribute__((always_inline)) void rows_tile(const int C, int64_t nb, const hr_block_q4_0x16 *g,
                                                            int half, const char *a, size_t as, float *y, size_t ys) {
    __m256 acc[HR_X16_TC];
#pragma GCC unroll 4
    for (int t = 0; t < C; t++) acc[t] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; b++) {
        __m256i lo[4], hi[4];
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(g[b].qs + 64 * v + 32 * half));
            lo[v] = _mm256_and_si256(w, m4);
            hi[v] = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g[b].d + 8 * half)));
#pragma GCC unroll 4
        for (int t = 0; t < C; t++) {
            const hr_block_q8_0s *yb = (const hr_block_q8_0s *)(a + (size_t)t * as) + b;
            __m256i s16 = _mm256_maddubs_epi16(lo[0], _mm256_set1_epi32(load_i32(yb->qs)));
            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi[0], _mm256_set1_epi32(load_i32(yb->qs + 16))));
#pragma GCC unroll 4
            for (int v = 1; v < 4; v++) {
                s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(lo[v], _mm256_set1_epi32(load_i32(yb->qs + 4 * v))));
                s16 = _mm256_add_epi16(s16,
                                       _mm256_maddubs_epi16(hi[v], _mm256_set1_epi32(load_i32(yb->qs + 16 + 4 * v))));
            }
            const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(s16, ones), _mm256_set1_epi32(yb->s8));
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(yb->d)), _mm256_cvtepi32_ps(s), acc[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < C; t++) _mm256_storeu_ps(y + (size_t)t * ys, acc[t]);
}
#endif

/* The tokens in tiles of HR_X16_TC (the last one narrower, its width a compile-time constant after
 * inlining); per tile, every group (and half) of the call's rows. The tile's activations (C x nb x
 * 40 bytes) stay in L1/L2 while the rows stream past; the call's rows (matmul gives up to 64, about
 * a quarter of L2) come from L2 for every tile after the first. */
void HR_X16FN(tile_q4_0x16)(int64_t k, const void *w, size_t ws, int nr, const void *a, size_t as, int nt, float *y,
                            size_t ys) {
    const int64_t nb = k / HR_QK4_0;
    const int ng = nr / HR_X16;
    const char *A = a;
    for (int t0 = 0; t0 < nt; t0 += HR_X16_TC) {
        const int C = nt - t0 < HR_X16_TC ? nt - t0 : HR_X16_TC;
        for (int g = 0; g < ng; g++) {
            const hr_block_q4_0x16 *grp = (const void *)((const char *)w + (size_t)g * HR_X16 * ws);
            for (int h = 0; h < HR_X16 / HR_X16_ROWS; h++) {
                const char *at = A + (size_t)t0 * as;
                float *yt = y + (size_t)t0 * ys + (size_t)(g * HR_X16 + h * HR_X16_ROWS);
                switch (C) {
                case HR_X16_TC: rows_tile(HR_X16_TC, nb, grp, h, at, as, yt, ys); break;
#if HR_X16_TC > 8
                case 15: rows_tile(15, nb, grp, h, at, as, yt, ys); break;
                case 14: rows_tile(14, nb, grp, h, at, as, yt, ys); break;
                case 13: rows_tile(13, nb, grp, h, at, as, yt, ys); break;
                case 12: rows_tile(12, nb, grp, h, at, as, yt, ys); break;
                case 11: rows_tile(11, nb, grp, h, at, as, yt, ys); break;
                case 10: rows_tile(10, nb, grp, h, at, as, yt, ys); break;
                case 9: rows_tile(9, nb, grp, h, at, as, yt, ys); break;
                case 8: rows_tile(8, nb, grp, h, at, as, yt, ys); break;
#endif
#if HR_X16_TC > 4
                case 7: rows_tile(7, nb, grp, h, at, as, yt, ys); break;
                case 6: rows_tile(6, nb, grp, h, at, as, yt, ys); break;
                case 5: rows_tile(5, nb, grp, h, at, as, yt, ys); break;
                case 4: rows_tile(4, nb, grp, h, at, as, yt, ys); break;
#endif
                case 3: rows_tile(3, nb, grp, h, at, as, yt, ys); break;
                case 2: rows_tile(2, nb, grp, h, at, as, yt, ys); break;
                default: rows_tile(1, nb, grp, h, at, as, yt, ys); break;
                }
            }
        }
    }
}

#if !HR_X16_512
/* q8_0s activations: the AVX2 q8_0 quantizer (the reference's bytes) per block, then the widened
 * scale and the sum; the AVX-512 table uses it too. */
void HR_X16FN(quantize_q8_0s)(const float *x, void *dst, int64_t k) {
    hr_block_q8_0s *y = dst;
    for (int64_t b = 0; b < k / HR_QK8_0; b++) {
        hr_block_q8_0 q;
        hr_avx2_quantize_q8_0(x + b * HR_QK8_0, &q, HR_QK8_0);
        hr_q8_0s_from_q8_0(&q, &y[b]);
    }
}
#endif

#endif

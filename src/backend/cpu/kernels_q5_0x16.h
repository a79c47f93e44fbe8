/* kernels_q5_0x16.h: the tiles of q5_0x16 (16 interleaved q5_0 rows, tensor.h) against q8_0s
 * activations, included at the end of kernels_x16.h so that it is compiled with it for AVX-512 VNNI
 * (HR_X16_512 1) and AVX2 (0), with its helpers and its driver (HR_X16_DRIVER).
 *
 * q4_0x16's program (kernels_x16.h) with the fifth bits ORed into the nibbles: per block the group's
 * 16 qh dwords (one per row, in the rows' lanes) give, for chunk v, byte i of lane r the bit 4 v + i
 * (low nibbles) or 16 + 4 v + i (high nibbles) of row r's qh: a byte shuffle copies the qh byte that
 * holds them to the lane's 4 bytes, and a per-byte bit test turns it into 0x10 (AVX-512: a mask
 * register and a masked add; AVX2: compare and AND). The values u = 0..31 are shared by the C tokens;
 * per token the integer sum starts from 2 s8 = -16 sum(y):
 *     AVX-512: 8 x vpdpbusd (4 products a lane each)
 *     AVX2:    vpmaddubsw per chunk, summed in int16 per half (4 x 2 x 31 x 128 < 2^15), two
 *              vpmaddwd
 * the same exact integers isum, then acc = fma(d_w * d_y, (float)isum, acc): tensor.h's sequence,
 * as the scalar tile (kernels_x16_scalar.c) runs it. A lone token runs the tile with C = 1. */
#ifndef HR_BACKEND_CPU_KERNELS_Q5_0X16_H
#define HR_BACKEND_CPU_KERNELS_Q5_0X16_H

/* The shuffle that copies byte s of each dword to the dword's 4 bytes (within 128-bit lanes). */
#define HR_Q50_BCAST(s)                                                                                                \
    (s), (s), (s), (s), 4 + (s), 4 + (s), 4 + (s), 4 + (s), 8 + (s), 8 + (s), 8 + (s), 8 + (s), 12 + (s), 12 + (s),    \
        12 + (s), 12 + (s)

#if HR_X16_512
static inline __attribute__((always_inline)) void rows_tile_q50(const int C, int64_t nb, const char *gp, int half,
                                                                const char *a, size_t as, float *y, size_t ys,
                                                                const int pf) {
    (void)half;
    const hr_block_q5_0x16 *g = (const void *)gp;
    __m512 acc[HR_X16_TC];
#pragma GCC unroll 16
    for (int t = 0; t < C; t++) acc[t] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(0x10);
    /* byte i of each dword: bit i (even chunks) or 4 + i (odd chunks) of the byte copied there */
    const __m512i sel[2] = {_mm512_set1_epi32(0x08040201), _mm512_set1_epi32((int)0x80402010)};
    for (int64_t b = 0; b < nb; b++) {
        if (pf) prefetch_block(&g[b], sizeof g[b]);
        const __m512i qh = _mm512_loadu_si512((const void *)g[b].qh);
        __m512i lo[4], hi[4];
#pragma GCC unroll 2
        for (int s = 0; s < 2; s++) {
            /* chunks 2 s and 2 s + 1: bits 8 s .. 8 s + 7 (low nibbles), 16 + 8 s .. (high) */
            const __m512i blo = _mm512_shuffle_epi8(qh, _mm512_broadcast_i32x4(_mm_setr_epi8(HR_Q50_BCAST(s))));
            const __m512i bhi = _mm512_shuffle_epi8(qh, _mm512_broadcast_i32x4(_mm_setr_epi8(HR_Q50_BCAST(2 + s))));
#pragma GCC unroll 2
            for (int e = 0; e < 2; e++) {
                const int v = 2 * s + e;
                const __m512i w = _mm512_loadu_si512((const void *)(g[b].qs + 64 * v));
                const __m512i l = _mm512_and_si512(w, m4), h = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
                lo[v] = _mm512_mask_add_epi8(l, _mm512_test_epi8_mask(blo, sel[e]), l, sixteen);
                hi[v] = _mm512_mask_add_epi8(h, _mm512_test_epi8_mask(bhi, sel[e]), h, sixteen);
            }
        }
        x16_q0_tokens(C, lo, hi, g[b].d, a, as, b, 2, acc);
    }
#pragma GCC unroll 16
    for (int t = 0; t < C; t++) _mm512_storeu_ps(y + (size_t)t * ys, acc[t]);
}
#else
static inline __attribute__((always_inline)) void rows_tile_q50(const int C, int64_t nb, const char *gp, int half,
                                                                const char *a, size_t as, float *y, size_t ys,
                                                                const int pf) {
    const hr_block_q5_0x16 *g = (const void *)gp;
    __m256 acc[HR_X16_TC];
#pragma GCC unroll 4
    for (int t = 0; t < C; t++) acc[t] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1), sixteen = _mm256_set1_epi8(0x10);
    const __m256i sel[2] = {_mm256_set1_epi32(0x08040201), _mm256_set1_epi32((int)0x80402010)};
    for (int64_t b = 0; b < nb; b++) {
        if (pf) prefetch_block(&g[b], sizeof g[b]);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(g[b].qh + 32 * half));
        __m256i lo[4], hi[4];
#pragma GCC unroll 2
        for (int s = 0; s < 2; s++) {
            const __m256i blo = _mm256_shuffle_epi8(qh, _mm256_broadcastsi128_si256(_mm_setr_epi8(HR_Q50_BCAST(s))));
            const __m256i bhi =
                _mm256_shuffle_epi8(qh, _mm256_broadcastsi128_si256(_mm_setr_epi8(HR_Q50_BCAST(2 + s))));
#pragma GCC unroll 2
            for (int e = 0; e < 2; e++) {
                const int v = 2 * s + e;
                const __m256i w = _mm256_loadu_si256((const __m256i *)(g[b].qs + 64 * v + 32 * half));
                const __m256i fl = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(blo, sel[e]), sel[e]), sixteen);
                const __m256i fh = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bhi, sel[e]), sel[e]), sixteen);
                lo[v] = _mm256_or_si256(_mm256_and_si256(w, m4), fl);
                hi[v] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w, 4), m4), fh);
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g[b].d + 8 * half)));
#pragma GCC unroll 4
        for (int t = 0; t < C; t++) {
            const hr_block_q8_0s *yb = (const hr_block_q8_0s *)(a + (size_t)t * as) + b;
            __m256i sl = _mm256_maddubs_epi16(lo[0], _mm256_set1_epi32(load_i32(yb->qs)));
            __m256i sh = _mm256_maddubs_epi16(hi[0], _mm256_set1_epi32(load_i32(yb->qs + 16)));
#pragma GCC unroll 4
            for (int v = 1; v < 4; v++) {
                sl = _mm256_add_epi16(sl, _mm256_maddubs_epi16(lo[v], _mm256_set1_epi32(load_i32(yb->qs + 4 * v))));
                sh =
                    _mm256_add_epi16(sh, _mm256_maddubs_epi16(hi[v], _mm256_set1_epi32(load_i32(yb->qs + 16 + 4 * v))));
            }
            const __m256i s =
                _mm256_add_epi32(_mm256_add_epi32(_mm256_madd_epi16(sl, ones), _mm256_madd_epi16(sh, ones)),
                                 _mm256_set1_epi32(2 * yb->s8));
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(yb->d)), _mm256_cvtepi32_ps(s), acc[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < C; t++) _mm256_storeu_ps(y + (size_t)t * ys, acc[t]);
}
#endif

HR_X16_ONE_VIA(rows_tile_q50)
HR_X16_DRIVER(HR_X16FN(tile_q5_0x16), rows_tile_q50, one_tok_via_rows_tile_q50, HR_QK5_0)

#endif

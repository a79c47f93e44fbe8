/* kernels_x16.h: the tiles of the interleaved layouts (16 rows per group, tensor.h): q4_0x16 and
 * q8_0x16 against q8_0s activations, q4_Kx16 against q8_Ks, written once and compiled twice:
 * AVX-512 VNNI on 512-bit registers (kernels_x16_avx512.c, HR_X16_512 1) and AVX2
 * (kernels_x16_avx2.c, HR_X16_512 0). The includer defines HR_X16_512 and HR_X16FN(name).
 *
 * Why this layout: with the rows in the lanes, one register holds one block's integer sums for 16
 * (AVX-512) or 8 (AVX2) rows, so the float work (convert, scale, FMA) is done once per block for
 * all of them, where the 1 x 8 tiles of the file's layout (kernels_q4_0_tile.h) spend it per pair of
 * blocks and per row: per 16 rows x 1 token x 32 weights this tile runs 8 vpdpbusd and 3 float
 * instructions, the plain one 16 vpdpbusd (256-bit) and 24 float.
 *
 * Per block b of a group (q4_0x16): the 4 chunks of 64 bytes are loaded and split into low and high
 * nibbles (8 registers; unsigned, so u = x + 8) and shared by the C tokens of the tile; per token
 * the integer sum of every row starts from the activation's s8 = -8 sum(y) and adds u times 4
 * activation bytes broadcast to all lanes:
 *     AVX-512: 8 x vpdpbusd (4 products a lane each)
 *     AVX2:    8 x vpmaddubsw summed in int16 (|sum| <= 8 x 2 x 15 x 128 < 2^15), one vpmaddwd
 * giving the same exact integers isum; then acc = fma(d_w * d_y, (float)isum, acc), the sequence of
 * tensor.h, so both builds and the scalar tiles (quant_x16.c) give the same bits. q8_0x16 does the
 * same over 8 chunks of bytes stored + 128 (AVX-512 from s128 = -128 sum(y); AVX2 by |w| x sign(y,
 * w)); q4_Kx16 per sub-block of 32 with the 6-bit scales and mins decoded in the lanes. One token
 * (decode) goes through a path that reads each line of a group once. */
#ifndef HR_BACKEND_CPU_KERNELS_X16_H
#define HR_BACKEND_CPU_KERNELS_X16_H

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "backend/cpu/kernels_internal.h"

static inline int32_t load_i32(const void *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The lines HR_X16_PF bytes ahead of each block are prefetched (past a group's end into the next: a
 * call's groups are contiguous). The first pass over a call's rows reads them from DRAM, and the
 * hardware prefetcher alone falls behind even with 16 tokens of arithmetic per block to hide the
 * loads: q4_K 16-stream decode 269 vs 190 tok/s with it (TinyLlama shape, 2 threads); the prompt
 * rates, whose later passes find the rows in L2, did not drop (docs/BENCHMARKS.md, run C). */
#ifndef HR_X16_PF
#define HR_X16_PF 4096
#endif
/* into L1, or into L2 where l2 (a constant after inlining: the hint must be one): */
static inline __attribute__((always_inline)) void prefetch_block_at(const void *p, size_t bytes, size_t ahead,
                                                                    const int l2) {
    for (size_t o = 0; o < bytes; o += 64)
        if (l2)
            _mm_prefetch((const char *)p + ahead + o, _MM_HINT_T1);
        else
            _mm_prefetch((const char *)p + ahead + o, _MM_HINT_T0);
}
/* The k-quant tiles' (q4_Kx16, q5_Kx16, q6_Kx16 at more than one token) prefetch goes to L2, not L1: a
 * whole super-block's lines at once (36-44) into L1 stalled the tiles' own loads behind them, and
 * the rows they need next are in L2 in time. bench_kernels 2 threads, 2048 x 5632, 16 copies (from
 * memory), GF/s at 16 tokens, L1 / L2 (December 6, 3 alternating rounds): AVX-512 q4_Kx16 365-407 /
 * 473-564, q5_Kx16 304-379 / 471-536; AVX2 q4_Kx16 250-264 / 298-300, q5_Kx16 110-196 / 215-230,
 * q6_Kx16 212-277 / 279-308; at 64 tokens equal or up to 1.15x. q4_0x16 / q8_0x16 (5 lines a block)
 * measured the same either way and keep L1; a lone token's q6_Kx16 path keeps L1 (36.7-42 GB/s with L1
 * against 27-37 with L2). */
static inline __attribute__((always_inline)) void prefetch_block(const void *p, size_t bytes) {
    prefetch_block_at(p, bytes, HR_X16_PF, 0);
}
#ifndef HR_X16_PF_K56
#define HR_X16_PF_K56 8192
#endif

/* q4_Kx16 and q5_Kx16 share d, dmin and scales at the same offsets (the q5 block has its qh between
 * scales and qs), so one program serves both: kb is super-block b of a group of either, read through
 * q4_Kx16's leading fields; kqs / kqh give the nibbles and the fifth bits. */
_Static_assert(offsetof(hr_block_q5_Kx16, scales) == offsetof(hr_block_q4_Kx16, scales) &&
                   offsetof(hr_block_q5_Kx16, dmin) == offsetof(hr_block_q4_Kx16, dmin),
               "q4_Kx16 and q5_Kx16 share their leading fields");
static inline __attribute__((always_inline)) const hr_block_q4_Kx16 *kb(const char *gp, int64_t b, const int q5) {
    return (const void *)(gp + (size_t)b * (q5 ? sizeof(hr_block_q5_Kx16) : sizeof(hr_block_q4_Kx16)));
}
static inline __attribute__((always_inline)) const uint8_t *kqs(const hr_block_q4_Kx16 *g, const int q5) {
    return q5 ? ((const hr_block_q5_Kx16 *)(const void *)g)->qs : g->qs;
}
static inline __attribute__((always_inline)) const uint8_t *kqh(const hr_block_q4_Kx16 *g) {
    return ((const hr_block_q5_Kx16 *)(const void *)g)->qh;
}

/* The prefetch of q6_Kx16, a quarter of the super-block (840 bytes) HR_X16_PF_K56 ahead per segment
 * rather than all 53 lines at once: into L1 for a lone token (one), into L2 for the tiles. */
static inline __attribute__((always_inline)) void k6_prefetch(const hr_block_q6_Kx16 *g, int seg, const int one) {
    prefetch_block_at((const char *)g + seg * (sizeof *g / 4), sizeof *g / 4, HR_X16_PF_K56, !one);
}

/* One token (decode) of q4_Kx16 / q5_Kx16 (and of q4_0x16 / q8_0x16) leaves the prefetch to the
 * hardware: the tiles' burst of a whole block's lines (36 / 44 prefetches at once, 4-8 KiB ahead)
 * slowed a lone token down from DRAM (q6_Kx16's per-segment prefetch helps it: without, 9.8 vs 20.7
 * GB/s on AVX2). One token, 2 MiB pages, 32 matrices in turn (none stays in L3), CPU-time GB/s,
 * burst vs none (December 6, a loaded machine, medians of 3 alternating rounds): 1 thread 2048 x
 * 2048 q4_Kx16 AVX-512 29.2 vs 33.1, AVX2 24.6 vs 29.4; q5_Kx16 AVX-512 16.8 vs 33.5; 2048 x 5632
 * q5_Kx16 AVX2 13.0 vs 21.3; 2 threads 2048 x 5632 q4_Kx16 AVX-512 39.1 vs 56.7. Spreading the same
 * prefetch over the block (a quarter per step, 2-8 KiB ahead) was between
 * the two. q4_0x16 / q8_0x16, 2048 x 2048: AVX-512 30.4 vs 35.5 / 31.6 vs 34.8, AVX2 31.0 vs 33.6 /
 * 31.6 vs 32.5. */

#if HR_X16_512
#define HR_X16_TC   16 /* tokens per tile */
#define HR_X16_ROWS 16 /* rows per register */

/* Block b of a 32-element x16 group (q4_0x16, q5_0x16) against C tokens: the 16 rows' unsigned values
 * lo (elements 0..15) / hi (16..31) in 4 registers each, their f16 scales d; per token one integer
 * sum started from s8_mul x the activations' s8 term (the offset the unsigned values carry: 8 for
 * q4_0, 16 = 2 x 8 for q5_0), then one FMA into acc[t]. */
static inline __attribute__((always_inline)) void x16_q0_tokens(const int C, const __m512i lo[4], const __m512i hi[4],
                                                                const hr_f16 *d, const char *a, size_t as, int64_t b,
                                                                const int s8_mul, __m512 *acc) {
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)d));
#pragma GCC unroll 16
    for (int t = 0; t < C; t++) {
        const hr_block_q8_0s *yb = (const hr_block_q8_0s *)(a + (size_t)t * as) + b;
        __m512i s = _mm512_set1_epi32(s8_mul * yb->s8);
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            s = _mm512_dpbusd_epi32(s, lo[v], _mm512_set1_epi32(load_i32(yb->qs + 4 * v)));
            s = _mm512_dpbusd_epi32(s, hi[v], _mm512_set1_epi32(load_i32(yb->qs + 16 + 4 * v)));
        }
        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(yb->d)), _mm512_cvtepi32_ps(s), acc[t]);
    }
}

/* One group (16 rows) x C tokens over all nb blocks; y[t * ys + r]. */
static inline __attribute__((always_inline)) void rows_tile_q4p(const int C, int64_t nb, const char *gp, const char *a,
                                                                size_t as, float *y, size_t ys, const int pf) {
    const hr_block_q4_0x16 *g = (const void *)gp;
    __m512 acc[HR_X16_TC];
#pragma GCC unroll 16
    for (int t = 0; t < C; t++) acc[t] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; b++) {
        if (pf) prefetch_block(&g[b], sizeof g[b]);
        __m512i lo[4], hi[4];
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            const __m512i w = _mm512_loadu_si512((const void *)(g[b].qs + 64 * v));
            lo[v] = _mm512_and_si512(w, m4);
            hi[v] = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
        }
        x16_q0_tokens(C, lo, hi, g[b].d, a, as, b, 1, acc);
    }
#pragma GCC unroll 16
    for (int t = 0; t < C; t++) _mm512_storeu_ps(y + (size_t)t * ys, acc[t]);
}

static inline __attribute__((always_inline)) void rows_tile_q4(const int C, int64_t nb, const char *gp, int half,
                                                               const char *a, size_t as, float *y, size_t ys,
                                                               const int pf) {
    (void)half;
    rows_tile_q4p(C, nb, gp, a, as, y, ys, pf);
}

/* q8_0x16: the 8 chunks' bytes (x + 128) are the unsigned operand as loaded; each token's sum starts
 * from its s128 = -128 sum(y). */
static inline __attribute__((always_inline)) void rows_tile_q8p(const int C, int64_t nb, const char *gp, const char *a,
                                                                size_t as, float *y, size_t ys, const int pf) {
    const hr_block_q8_0x16 *g = (const void *)gp;
    __m512 acc[HR_X16_TC];
#pragma GCC unroll 16
    for (int t = 0; t < C; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        if (pf) prefetch_block(&g[b], sizeof g[b]);
        __m512i w[8];
#pragma GCC unroll 8
        for (int v = 0; v < 8; v++) w[v] = _mm512_loadu_si512((const void *)(g[b].qs + 64 * v));
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)g[b].d));
#pragma GCC unroll 16
        for (int t = 0; t < C; t++) {
            const hr_block_q8_0s *yb = (const hr_block_q8_0s *)(a + (size_t)t * as) + b;
            __m512i s = _mm512_set1_epi32(yb->s128);
#pragma GCC unroll 8
            for (int v = 0; v < 8; v++) s = _mm512_dpbusd_epi32(s, w[v], _mm512_set1_epi32(load_i32(yb->qs + 4 * v)));
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(yb->d)), _mm512_cvtepi32_ps(s), acc[t]);
        }
    }
#pragma GCC unroll 16
    for (int t = 0; t < C; t++) _mm512_storeu_ps(y + (size_t)t * ys, acc[t]);
}

static inline __attribute__((always_inline)) void rows_tile_q8(const int C, int64_t nb, const char *gp, int half,
                                                               const char *a, size_t as, float *y, size_t ys,
                                                               const int pf) {
    (void)half;
    rows_tile_q8p(C, nb, gp, a, as, y, ys, pf);
}

/* q4_Kx16, shared by the two tiles below: the 16 rows' 6-bit scales of super-block g, sc0..3 in the
 * bytes of *lo and sc4..7 in those of *hi (get_scale_min_k4 on 4 bytes a lane); */
static inline __attribute__((always_inline)) void k_scales(const hr_block_q4_Kx16 *g, __m512i *lo, __m512i *hi) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m63 = _mm512_set1_epi8(0x3F), m30 = _mm512_set1_epi8(0x30);
    const __m512i s0 = _mm512_loadu_si512((const void *)g->scales);
    const __m512i s2 = _mm512_loadu_si512((const void *)(g->scales + 128));
    *lo = _mm512_and_si512(s0, m63);
    *hi = _mm512_or_si512(_mm512_and_si512(s2, m4), _mm512_and_si512(_mm512_srli_epi16(s0, 2), m30));
}

/* the 16 rows' scale of sub-block sb, one a lane; */
static inline __attribute__((always_inline)) __m512i k_sc(__m512i lo, __m512i hi, int sb) {
    return _mm512_and_si512(_mm512_srli_epi32(sb < 4 ? lo : hi, 8 * (sb & 3)), _mm512_set1_epi32(0xFF));
}

/* and the mins, last in each element's sequence: acc[t] -= (dmin_w x d_y) x sum_s m[s] ys[s], the
 * sum by vpmaddwd of the mins paired (m0, m2), (m1, m3), (m4, m6), (m5, m7) against q8_Ks's ysp. */
static inline __attribute__((always_inline)) void k_mins(const int C, const hr_block_q4_Kx16 *g, const char *a,
                                                         size_t as, int64_t b, __m512 *acc) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m63 = _mm512_set1_epi8(0x3F), m30 = _mm512_set1_epi8(0x30);
    const __m512i lowords = _mm512_set1_epi32(0x00FF00FF);
    const __m512i s1 = _mm512_loadu_si512((const void *)(g->scales + 64));
    const __m512i s2 = _mm512_loadu_si512((const void *)(g->scales + 128));
    const __m512i mlo = _mm512_and_si512(s1, m63);
    const __m512i mhi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(s2, 4), m4),
                                        _mm512_and_si512(_mm512_srli_epi16(s1, 2), m30));
    const __m512i m[4] = {_mm512_and_si512(mlo, lowords), _mm512_srli_epi16(mlo, 8), _mm512_and_si512(mhi, lowords),
                          _mm512_srli_epi16(mhi, 8)};
    const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)g->dmin));
#pragma GCC unroll 16
    for (int t = 0; t < C; t++) {
        const hr_block_q8_Ks *yb = (const hr_block_q8_Ks *)(a + (size_t)t * as) + b;
        __m512i ms = _mm512_madd_epi16(m[0], _mm512_set1_epi32(yb->ysp[0]));
        for (int i = 1; i < 4; i++) ms = _mm512_add_epi32(ms, _mm512_madd_epi16(m[i], _mm512_set1_epi32(yb->ysp[i])));
        acc[t] = _mm512_fnmadd_ps(_mm512_mul_ps(mw, _mm512_set1_ps(yb->d)), _mm512_cvtepi32_ps(ms), acc[t]);
    }
}

/* a super-block's end: y[t] += (d_w x d_y) x isum[t] (the scaled sub-block sums), then the mins (k_mins);
 * y holds the tokens' sums between super-blocks (zeroed first) so that the integer sums keep the
 * registers. */
static inline __attribute__((always_inline)) void k_finish(const int C, const hr_block_q4_Kx16 *g, const char *a,
                                                           size_t as, int64_t b, const __m512i *isum, float *y,
                                                           size_t ys) {
    __m512 acc[16];
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)g->d));
#pragma GCC unroll 16
    for (int t = 0; t < C; t++) {
        const hr_block_q8_Ks *yb = (const hr_block_q8_Ks *)(a + (size_t)t * as) + b;
        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(yb->d)), _mm512_cvtepi32_ps(isum[t]),
                                 _mm512_loadu_ps(y + (size_t)t * ys));
    }
    k_mins(C, g, a, as, b, acc);
#pragma GCC unroll 16
    for (int t = 0; t < C; t++) _mm512_storeu_ps(y + (size_t)t * ys, acc[t]);
}

/* q5_Kx16's values of sub-block sb in chunk v: the nibbles plus 16 where bit sb of the lane's qh byte
 * is set (vptestmb, then a masked add). */
static inline __attribute__((always_inline)) __m512i k_fifth(__m512i nib, const uint8_t *qh, int v, int sb) {
    const __mmask64 set =
        _mm512_test_epi8_mask(_mm512_loadu_si512((const void *)(qh + 64 * v)), _mm512_set1_epi8((char)(1 << sb)));
    return _mm512_mask_add_epi8(nib, set, nib, _mm512_set1_epi8(16));
}

/* q4_Kx16 (and q5_Kx16, q5 1), 8 tokens at most per pass (16 nibble registers per pair of
 * sub-blocks): per super-block the 16 rows' 6-bit scales and mins are decoded in the lanes
 * (get_scale_min_k4 on 4 bytes at once), then per pair j of sub-blocks the 8 chunks' nibbles (and
 * fifth bits) are split once for the tokens, and each token runs 8 vpdpbusd per sub-block and one
 * vpmulld by the scale into its integer sum; per super-block one FMA (k_finish), then the mins by
 * vpmaddwd. */
static inline __attribute__((always_inline)) void rows_tile_k8(const int C, int64_t nb, const char *gp, const char *a,
                                                               size_t as, float *y, size_t ys, const int q5,
                                                               const int pf) {
#pragma GCC unroll 8
    for (int t = 0; t < C; t++) _mm512_storeu_ps(y + (size_t)t * ys, _mm512_setzero_ps());
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; b++) {
        const hr_block_q4_Kx16 *g = kb(gp, b, q5);
        const uint8_t *qs = kqs(g, q5);
        const size_t gbytes = q5 ? sizeof(hr_block_q5_Kx16) : sizeof(hr_block_q4_Kx16);
        if (pf) prefetch_block_at(g, gbytes, q5 ? HR_X16_PF_K56 : HR_X16_PF, 1);
        __m512i sclo, schi, isum[8];
        k_scales(g, &sclo, &schi);
#pragma GCC unroll 8
        for (int t = 0; t < C; t++) isum[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            __m512i lo[8], hi[8];
#pragma GCC unroll 8
            for (int v = 0; v < 8; v++) {
                const __m512i w = _mm512_loadu_si512((const void *)(qs + 512 * j + 64 * v));
                lo[v] = _mm512_and_si512(w, m4);
                hi[v] = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
                if (q5) {
                    lo[v] = k_fifth(lo[v], kqh(g), v, 2 * j);
                    hi[v] = k_fifth(hi[v], kqh(g), v, 2 * j + 1);
                }
            }
            const __m512i sc0 = k_sc(sclo, schi, 2 * j), sc1 = k_sc(sclo, schi, 2 * j + 1);
#pragma GCC unroll 8
            for (int t = 0; t < C; t++) {
                const hr_block_q8_Ks *yb = (const hr_block_q8_Ks *)(a + (size_t)t * as) + b;
                const int8_t *yq = yb->qs + 64 * j;
                __m512i q0 = _mm512_setzero_si512(), q1 = _mm512_setzero_si512();
#pragma GCC unroll 8
                for (int v = 0; v < 8; v++) {
                    q0 = _mm512_dpbusd_epi32(q0, lo[v], _mm512_set1_epi32(load_i32(yq + 4 * v)));
                    q1 = _mm512_dpbusd_epi32(q1, hi[v], _mm512_set1_epi32(load_i32(yq + 32 + 4 * v)));
                }
                isum[t] = _mm512_add_epi32(isum[t],
                                           _mm512_add_epi32(_mm512_mullo_epi32(q0, sc0), _mm512_mullo_epi32(q1, sc1)));
            }
        }
        k_finish(C, g, a, as, b, isum, y, ys);
    }
}

/* The same for up to 16 tokens in one pass, sub-block after sub-block (8 nibble registers, each
 * chunk loaded once per sub-block, from L1 the second time) so that 16 accumulators fit. */
static inline __attribute__((always_inline)) void rows_tile_k16(const int C, int64_t nb, const char *gp, const char *a,
                                                                size_t as, float *y, size_t ys, const int q5,
                                                                const int pf) {
#pragma GCC unroll 16
    for (int t = 0; t < C; t++) _mm512_storeu_ps(y + (size_t)t * ys, _mm512_setzero_ps());
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; b++) {
        const hr_block_q4_Kx16 *g = kb(gp, b, q5);
        const uint8_t *qs = kqs(g, q5);
        if (pf)
            prefetch_block_at(g, q5 ? sizeof(hr_block_q5_Kx16) : sizeof(hr_block_q4_Kx16),
                              q5 ? HR_X16_PF_K56 : HR_X16_PF, 1);
        __m512i sclo, schi, isum[16];
        k_scales(g, &sclo, &schi);
#pragma GCC unroll 16
        for (int t = 0; t < C; t++) isum[t] = _mm512_setzero_si512();
        for (int sb = 0; sb < 8; sb++) {
            const int j = sb >> 1, odd = sb & 1;
            __m512i nib[8];
#pragma GCC unroll 8
            for (int v = 0; v < 8; v++) {
                const __m512i w = _mm512_loadu_si512((const void *)(qs + 512 * j + 64 * v));
                nib[v] = _mm512_and_si512(odd ? _mm512_srli_epi16(w, 4) : w, m4);
                if (q5) nib[v] = k_fifth(nib[v], kqh(g), v, sb);
            }
            const __m512i sc = k_sc(sclo, schi, sb);
#pragma GCC unroll 16
            for (int t = 0; t < C; t++) {
                const int8_t *yq = ((const hr_block_q8_Ks *)(a + (size_t)t * as) + b)->qs + 32 * sb;
                __m512i q = _mm512_setzero_si512();
#pragma GCC unroll 8
                for (int v = 0; v < 8; v++) q = _mm512_dpbusd_epi32(q, nib[v], _mm512_set1_epi32(load_i32(yq + 4 * v)));
                isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(q, sc));
            }
        }
        k_finish(C, g, a, as, b, isum, y, ys);
    }
}

static inline __attribute__((always_inline)) void rows_tile_q4k(const int C, int64_t nb, const char *gp, int half,
                                                                const char *a, size_t as, float *y, size_t ys,
                                                                const int pf) {
    (void)half;
    if (C > 8)
        rows_tile_k16(C, nb, gp, a, as, y, ys, 0, pf);
    else
        rows_tile_k8(C, nb, gp, a, as, y, ys, 0, pf);
}

static inline __attribute__((always_inline)) void rows_tile_q5k(const int C, int64_t nb, const char *gp, int half,
                                                                const char *a, size_t as, float *y, size_t ys,
                                                                const int pf) {
    (void)half;
    if (C > 8)
        rows_tile_k16(C, nb, gp, a, as, y, ys, 1, pf);
    else
        rows_tile_k8(C, nb, gp, a, as, y, ys, 1, pf);
}

/* q6_Kx16: the 6-bit values u = q (0..63, unsigned for vpdpbusd) of quarter q (0..3) of half h of
 * the super-block, 4 bytes of each row in chunk v (0..7: elements 4 v .. 4 v + 3 of the quarter's
 * 32). The lanes of ql chunks 16 h + v (a) and 16 h + 8 + v (b) and qh chunk 8 h + v (c) hold u_0,
 * u_1, u_2 in their low 6 bits and u_3's bits 0-1, 2-3, 4-5 in their top 2 (tensor.h): one AND for
 * q < 3; for q = 3 the three tops shifted into place (16-bit shifts: the selects keep only the bits
 * that came from the lane's own byte) and joined by two bitwise selects. */
static inline __attribute__((always_inline)) __m512i k6_u(const hr_block_q6_Kx16 *g, int h, int q, int v) {
    const __m512i m63 = _mm512_set1_epi8(0x3F);
    const void *pa = g->q + hr_q6x16_ql_at(16 * h + v), *pb = g->q + hr_q6x16_ql_at(16 * h + 8 + v);
    const void *pc = g->q + hr_q6x16_qh_at(8 * h + v);
    if (q < 3) return _mm512_and_si512(_mm512_loadu_si512(q == 0 ? pa : q == 1 ? pb : pc), m63);
    /* 0xE4: c ? a : b, bit by bit */
    const __m512i ab =
        _mm512_ternarylogic_epi32(_mm512_srli_epi16(_mm512_loadu_si512(pa), 6),
                                  _mm512_srli_epi16(_mm512_loadu_si512(pb), 4), _mm512_set1_epi8(0x03), 0xE4);
    const __m512i abc =
        _mm512_ternarylogic_epi32(ab, _mm512_srli_epi16(_mm512_loadu_si512(pc), 2), _mm512_set1_epi8(0x0F), 0xE4);
    return _mm512_and_si512(abc, m63);
}

/* The 16 rows' int8 scale of sub-block sb, sign-extended to the lanes. */
static inline __attribute__((always_inline)) __m512i k6_sc(const hr_block_q6_Kx16 *g, int sb) {
    const __m512i s = _mm512_loadu_si512((const void *)(g->scales + 64 * (sb >> 2)));
    return _mm512_srai_epi32(_mm512_slli_epi32(s, 24 - 8 * (sb & 3)), 24);
}

/* The -32 of every value, for all sub-blocks at once: -32 x sum_g scale[g] x bsums[g] by vpmaddwd of
 * the scales paired (sc[4c], sc[4c+1]), (sc[4c+2], sc[4c+3]) as int16 against the q8_K block's
 * adjacent int16 sums. */
static inline __attribute__((always_inline)) void k6_pairs(const hr_block_q6_Kx16 *g, __m512i p[8]) {
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m512i s = _mm512_loadu_si512((const void *)(g->scales + 64 * c));
        const __m512i ev = _mm512_srai_epi16(_mm512_slli_epi16(s, 8), 8), od = _mm512_srai_epi16(s, 8);
        p[2 * c] = _mm512_mask_blend_epi16(0xAAAAAAAA, ev, _mm512_slli_epi32(od, 16));
        p[2 * c + 1] = _mm512_mask_blend_epi16(0xAAAAAAAA, _mm512_srli_epi32(ev, 16), od);
    }
}
static inline __attribute__((always_inline)) __m512i k6_corr(const __m512i p[8], const hr_block_q8_K *yb) {
    __m512i c = _mm512_madd_epi16(p[0], _mm512_set1_epi32(load_i32(yb->bsums)));
#pragma GCC unroll 8
    for (int i = 1; i < 8; i++)
        c = _mm512_add_epi32(c, _mm512_madd_epi16(p[i], _mm512_set1_epi32(load_i32(yb->bsums + 2 * i))));
    return _mm512_slli_epi32(c, 5);
}

/* q6_Kx16, 8 tokens at most per pass (8 integer sums, 8 accumulators): per sub-block the rows'
 * values once for the tokens (4 registers), per token 4 vpdpbusd and one vpmulld by the scale; per
 * super-block the -32 term by vpmaddwd and one FMA. */
static inline __attribute__((always_inline)) void rows_tile_q6k8(const int C, int64_t nb, const char *gp, const char *a,
                                                                 size_t as, float *y, size_t ys, const int pf) {
    const hr_block_q6_Kx16 *g = (const void *)gp;
    __m512 acc[8];
#pragma GCC unroll 8
    for (int t = 0; t < C; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512i isum[8];
#pragma GCC unroll 8
        for (int t = 0; t < C; t++) isum[t] = _mm512_setzero_si512();
        /* segment after segment (h, e), in memory order; in each the 4 quarters' sub-blocks 8 h + 2 q + e */
        for (int h = 0; h < 2; h++)
#pragma GCC unroll 2
            for (int e = 0; e < 2; e++)
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++) {
                    if (q == 0 && pf) k6_prefetch(&g[b], 2 * h + e, C == 1);
                    __m512i u[4];
#pragma GCC unroll 4
                    for (int v = 0; v < 4; v++) u[v] = k6_u(&g[b], h, q, 4 * e + v);
                    const __m512i sc = k6_sc(&g[b], 8 * h + 2 * q + e);
#pragma GCC unroll 8
                    for (int t = 0; t < C; t++) {
                        const int8_t *yq =
                            ((const hr_block_q8_K *)(a + (size_t)t * as) + b)->qs + 128 * h + 32 * q + 16 * e;
                        __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[0], _mm512_set1_epi32(load_i32(yq)));
#pragma GCC unroll 4
                        for (int v = 1; v < 4; v++)
                            s = _mm512_dpbusd_epi32(s, u[v], _mm512_set1_epi32(load_i32(yq + 4 * v)));
                        isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(s, sc));
                    }
                }
        __m512i p[8];
        k6_pairs(&g[b], p);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)g[b].d));
#pragma GCC unroll 8
        for (int t = 0; t < C; t++) {
            const hr_block_q8_K *yb = (const hr_block_q8_K *)(a + (size_t)t * as) + b;
            const __m512i s = _mm512_sub_epi32(isum[t], k6_corr(p, yb));
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(yb->d)), _mm512_cvtepi32_ps(s), acc[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < C; t++) _mm512_storeu_ps(y + (size_t)t * ys, acc[t]);
}

static inline __attribute__((always_inline)) void rows_tile_q6k(const int C, int64_t nb, const char *gp, int half,
                                                                const char *a, size_t as, float *y, size_t ys,
                                                                const int pf) {
    (void)half;
    if (C > 8) {
        rows_tile_q6k8(8, nb, gp, a, as, y, ys, pf);
        rows_tile_q6k8(C - 8, nb, gp, a + 8 * as, as, y + 8 * ys, ys, 0); /* the rows in L2 now */
    } else {
        rows_tile_q6k8(C, nb, gp, a, as, y, ys, pf);
    }
}

/* One token (decode): the tiles at C = 1 without their prefetch (pf 0: see the one-token note above). */
static inline void one_tok_q4k(int64_t nb, const char *gp, const char *a, float *y) {
    rows_tile_k8(1, nb, gp, a, 0, y, 0, 0, 0);
}
static inline void one_tok_q5k(int64_t nb, const char *gp, const char *a, float *y) {
    rows_tile_k8(1, nb, gp, a, 0, y, 0, 1, 0);
}
static inline void one_tok_q4(int64_t nb, const char *gp, const char *a, float *y) {
    rows_tile_q4p(1, nb, gp, a, 0, y, 0, 0);
}
static inline void one_tok_q8(int64_t nb, const char *gp, const char *a, float *y) {
    rows_tile_q8p(1, nb, gp, a, 0, y, 0, 0);
}
#define HR_X16_ONE_Q4K one_tok_q4k
#define HR_X16_ONE_Q5K one_tok_q5k
#define HR_X16_ONE_Q4  one_tok_q4
#define HR_X16_ONE_Q8  one_tok_q8
#else
#define HR_X16_TC      4 /* tokens per tile: q4_0x16's 8 nibble registers + 4 accumulators + temporaries in 16 */
#define HR_X16_TC_WIDE 8 /* q5_Kx16's, q6_Kx16's and q8_0x16's: one integer sum a token (HR_X16_DRIVER_WIDE) */
#define HR_X16_ROWS    8 /* rows per register: a group is two halves */

static inline __attribute__((always_inline)) void rows_tile_q4(const int C, int64_t nb, const char *gp, int half,
                                                               const char *a, size_t as, float *y, size_t ys,
                                                               const int pf) {
    const hr_block_q4_0x16 *g = (const void *)gp;
    __m256 acc[HR_X16_TC];
#pragma GCC unroll 4
    for (int t = 0; t < C; t++) acc[t] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; b++) {
        if (pf) prefetch_block(&g[b], sizeof g[b]);
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

/* q8_0x16 with AVX2 (no unsigned x signed dot without saturation for bytes up to 255): per chunk the
 * signed values w = stored ^ 0x80 and |w| once for the C tokens, then per token
 * vpmaddubsw(|w|, sign(y, w)) (pairs <= 2 x 128 x 127 < 2^15) and vpmaddwd into int32: sum w y
 * exactly, without the s128 correction. Up to HR_X16_TC_WIDE = 8 tokens a pass (2 value registers a
 * chunk leave room for 8 sums; the float accumulators, one FMA a block, may go to memory), each sum
 * kept in a register by an empty asm: bench_tile q8_0x16 64 2048 16 avx2, 6 alternating rounds,
 * medians 117.7 -> 130.4 GF/s (8 tokens without the asm: 116.8). */
static inline __attribute__((always_inline)) void rows_tile_q8(const int C, int64_t nb, const char *gp, int half,
                                                               const char *a, size_t as, float *y, size_t ys,
                                                               const int pf) {
    const hr_block_q8_0x16 *g = (const void *)gp;
    __m256 acc[HR_X16_TC_WIDE];
#pragma GCC unroll 8
    for (int t = 0; t < C; t++) acc[t] = _mm256_setzero_ps();
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; b++) {
        if (pf) prefetch_block(&g[b], sizeof g[b]);
        __m256i s[HR_X16_TC_WIDE];
#pragma GCC unroll 8
        for (int t = 0; t < C; t++) s[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int v = 0; v < 8; v++) {
            const __m256i w =
                _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(g[b].qs + 64 * v + 32 * half)), flip);
            const __m256i aw = _mm256_abs_epi8(w);
#pragma GCC unroll 8
            for (int t = 0; t < C; t++) {
                const hr_block_q8_0s *yb = (const hr_block_q8_0s *)(a + (size_t)t * as) + b;
                const __m256i sy = _mm256_sign_epi8(_mm256_set1_epi32(load_i32(yb->qs + 4 * v)), w);
                s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sy), ones));
                __asm__("" : "+x"(s[t])); /* a register, no reassociation (as q6_Kx16's) */
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g[b].d + 8 * half)));
#pragma GCC unroll 8
        for (int t = 0; t < C; t++) {
            const hr_block_q8_0s *yb = (const hr_block_q8_0s *)(a + (size_t)t * as) + b;
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(yb->d)), _mm256_cvtepi32_ps(s[t]), acc[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < C; t++) _mm256_storeu_ps(y + (size_t)t * ys, acc[t]);
}

/* q4_Kx16 with AVX2, shared by the tile and the one-token path below (as the AVX-512 ones, for the
 * 8 rows of one half): the scales, sc0..3 in *lo's bytes and sc4..7 in *hi's; */
static inline __attribute__((always_inline)) void k_scales(const hr_block_q4_Kx16 *g, int half, __m256i *lo,
                                                           __m256i *hi) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m63 = _mm256_set1_epi8(0x3F), m30 = _mm256_set1_epi8(0x30);
    const __m256i s0 = _mm256_loadu_si256((const __m256i *)(g->scales + 32 * half));
    const __m256i s2 = _mm256_loadu_si256((const __m256i *)(g->scales + 128 + 32 * half));
    *lo = _mm256_and_si256(s0, m63);
    *hi = _mm256_or_si256(_mm256_and_si256(s2, m4), _mm256_and_si256(_mm256_srli_epi16(s0, 2), m30));
}

/* the 8 rows' scale of sub-block sb as int16 in both halves of each dword (vpmaddwd's pairs): one
 * vpshufb of the scale bytes, its control from a table (sb is a loop's variable: built in the loop,
 * the control cost scalar ops and inserts per sub-block); */
#define K_CTRL(i)  (int8_t)(i), -128, (int8_t)(i), -128
#define K_CTRL4(i) K_CTRL(i), K_CTRL(4 + (i)), K_CTRL(8 + (i)), K_CTRL(12 + (i))
static const int8_t k_sc16_ctrl[4][32] __attribute__((aligned(32))) = {
    {K_CTRL4(0), K_CTRL4(0)}, {K_CTRL4(1), K_CTRL4(1)}, {K_CTRL4(2), K_CTRL4(2)}, {K_CTRL4(3), K_CTRL4(3)}};
#undef K_CTRL4
#undef K_CTRL
static inline __attribute__((always_inline)) __m256i k_sc16(__m256i lo, __m256i hi, int sb) {
    return _mm256_shuffle_epi8(sb < 4 ? lo : hi, _mm256_load_si256((const __m256i *)k_sc16_ctrl[sb & 3]));
}

/* the mins term, last: acc[t] -= (dmin_w x d_y) x sum_s m[s] ys[s]. */
static inline __attribute__((always_inline)) void k_mins(const int C, const hr_block_q4_Kx16 *g, int half,
                                                         const char *a, size_t as, int64_t b, __m256 *acc) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m63 = _mm256_set1_epi8(0x3F), m30 = _mm256_set1_epi8(0x30);
    const __m256i lowords = _mm256_set1_epi32(0x00FF00FF);
    const __m256i s1 = _mm256_loadu_si256((const __m256i *)(g->scales + 64 + 32 * half));
    const __m256i s2 = _mm256_loadu_si256((const __m256i *)(g->scales + 128 + 32 * half));
    const __m256i mlo = _mm256_and_si256(s1, m63);
    const __m256i mhi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(s2, 4), m4),
                                        _mm256_and_si256(_mm256_srli_epi16(s1, 2), m30));
    const __m256i m[4] = {_mm256_and_si256(mlo, lowords), _mm256_srli_epi16(mlo, 8), _mm256_and_si256(mhi, lowords),
                          _mm256_srli_epi16(mhi, 8)};
    const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g->dmin + 8 * half)));
#pragma GCC unroll 8
    for (int t = 0; t < C; t++) {
        const hr_block_q8_Ks *yb = (const hr_block_q8_Ks *)(a + (size_t)t * as) + b;
        __m256i ms = _mm256_madd_epi16(m[0], _mm256_set1_epi32(yb->ysp[0]));
        for (int i = 1; i < 4; i++) ms = _mm256_add_epi32(ms, _mm256_madd_epi16(m[i], _mm256_set1_epi32(yb->ysp[i])));
        acc[t] = _mm256_fnmadd_ps(_mm256_mul_ps(mw, _mm256_set1_ps(yb->d)), _mm256_cvtepi32_ps(ms), acc[t]);
    }
}

/* a super-block's end: y[t] += (d_w x d_y) x isum[t] (the scaled sub-block sums), then the mins
 * (k_mins); y holds the tokens' sums between super-blocks (zeroed first), so that the integer sums
 * keep the registers. */
static inline __attribute__((always_inline)) void k_finish(const int C, const hr_block_q4_Kx16 *g, int half,
                                                           const char *a, size_t as, int64_t b, const __m256i *isum,
                                                           float *y, size_t ys) {
    __m256 acc[HR_X16_TC_WIDE];
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g->d + 8 * half)));
#pragma GCC unroll 8
    for (int t = 0; t < C; t++) {
        const hr_block_q8_Ks *yb = (const hr_block_q8_Ks *)(a + (size_t)t * as) + b;
        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(yb->d)), _mm256_cvtepi32_ps(isum[t]),
                                 _mm256_loadu_ps(y + (size_t)t * ys));
    }
    k_mins(C, g, half, a, as, b, acc);
#pragma GCC unroll 8
    for (int t = 0; t < C; t++) _mm256_storeu_ps(y + (size_t)t * ys, acc[t]);
}

/* q5_Kx16's fifth bits of sub-block sb for chunk v of one half: 16 where bit sb of the byte is set. */
static inline __attribute__((always_inline)) __m256i k_fifth(const uint8_t *qh, int v, int half, int sb) {
    const __m256i bit = _mm256_set1_epi8((char)(1 << sb));
    const __m256i h = _mm256_loadu_si256((const __m256i *)(qh + 64 * v + 32 * half));
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bit), bit), _mm256_set1_epi8(16));
}

/* The int16 sum of 4 chunks n[] (unsigned, < 16 or < 32) times the token's values yq, vpmaddubsw
 * pairs: q4_K's 8 chunks fit in int16 (8 x 2 x 15 x 128 < 2^15) and go into int32 with one vpmaddwd,
 * q5_K's 4 at most (4 x 2 x 31 x 128 < 2^15), so two. */
static inline __attribute__((always_inline)) __m256i k_four(const __m256i n[4], const int8_t *yq) {
    __m256i s16 = _mm256_maddubs_epi16(n[0], _mm256_set1_epi32(load_i32(yq)));
#pragma GCC unroll 4
    for (int v = 1; v < 4; v++)
        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(n[v], _mm256_set1_epi32(load_i32(yq + 4 * v))));
    return s16;
}

/* q4_Kx16 with AVX2, 8 rows a half: per super-block the scales and mins decoded in the lanes, then
 * sub-block after sub-block its 8 chunks' values, 4 at a time, once for the C tokens, each token 8
 * vpmaddubsw (k_four) and one vpmaddwd by the scales into its integer sum; per super-block one FMA
 * and the mins by vpmaddwd (k_finish). 8 chunks at once with the accumulators and temporaries
 * spilled: 4 at a time, bench_tile q4_Kx16 64 2048 16 avx2, 4 alternating rounds, medians 155.9 ->
 * 176.1 GF/s. 8 tokens a pass as q5_Kx16 below: from L2 (bench_tile, 8 alternating runs of a noisy
 * host) median 144.9 -> 171.0, max 191.0 -> 198.1, but 2 threads from memory, the decode case
 * (bench_kernels 2 avx2 5 q4_Kx16 16 5632 2048 16, 6 runs), median 254 -> 249: not taken. */
static inline __attribute__((always_inline)) void rows_tile_q4k(const int C, int64_t nb, const char *gp, int half,
                                                                const char *a, size_t as, float *y, size_t ys,
                                                                const int pf) {
#pragma GCC unroll 4
    for (int t = 0; t < C; t++) _mm256_storeu_ps(y + (size_t)t * ys, _mm256_setzero_ps());
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; b++) {
        const hr_block_q4_Kx16 *g = kb(gp, b, 0);
        const uint8_t *qs = kqs(g, 0);
        if (pf) prefetch_block_at(g, sizeof(hr_block_q4_Kx16), HR_X16_PF, 1);
        __m256i sclo, schi, isum[HR_X16_TC];
        k_scales(g, half, &sclo, &schi);
#pragma GCC unroll 4
        for (int t = 0; t < C; t++) isum[t] = _mm256_setzero_si256();
        for (int sb = 0; sb < 8; sb++) {
            const int j = sb >> 1, odd = sb & 1;
            const __m256i sc16 = k_sc16(sclo, schi, sb);
            __m256i s16[HR_X16_TC];
#pragma GCC unroll 2
            for (int k4 = 0; k4 < 2; k4++) {
                __m256i nib[4];
#pragma GCC unroll 4
                for (int v = 0; v < 4; v++) {
                    const __m256i w =
                        _mm256_loadu_si256((const __m256i *)(qs + 512 * j + 64 * (4 * k4 + v) + 32 * half));
                    nib[v] = _mm256_and_si256(odd ? _mm256_srli_epi16(w, 4) : w, m4);
                }
#pragma GCC unroll 4
                for (int t = 0; t < C; t++) {
                    const __m256i p =
                        k_four(nib, ((const hr_block_q8_Ks *)(a + (size_t)t * as) + b)->qs + 32 * sb + 16 * k4);
                    if (k4 == 0)
                        s16[t] = p;
                    else
                        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_add_epi16(s16[t], p), sc16));
                }
            }
        }
        k_finish(C, g, half, a, as, b, isum, y, ys);
    }
}

/* q5_Kx16 with AVX2, 8 rows a half, up to HR_X16_TC_WIDE = 8 tokens a pass: per sub-block its 8
 * chunks' values (nibbles and fifth bits, 5 instructions a chunk more than q4_Kx16's) once for the
 * pass's tokens, each token 8 vpmaddubsw (k_four, two int16 sums of 4 chunks: q5_K's bound) and two
 * vpmaddwd by the scales into its integer sum, held in memory (the 8 value registers and the
 * temporaries fill the 16). Against 4 tokens a pass (4 values a time): bench_tile q5_Kx16 64 2048 16
 * avx2, 6 alternating runs, median 115.2 -> 131.6 GF/s (max 147.4 -> 149.0), 64 tokens 134.4 ->
 * 137.7; 2 threads from memory (bench_kernels 2 avx2 5 q5_Kx16 16 5632 2048 16), 6 runs, median 186 ->
 * 214. */
static inline __attribute__((always_inline)) void rows_tile_q5k(const int C, int64_t nb, const char *gp, int half,
                                                                const char *a, size_t as, float *y, size_t ys,
                                                                const int pf) {
#pragma GCC unroll 8
    for (int t = 0; t < C; t++) _mm256_storeu_ps(y + (size_t)t * ys, _mm256_setzero_ps());
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i isum[HR_X16_TC_WIDE];
    for (int64_t b = 0; b < nb; b++) {
        const hr_block_q4_Kx16 *g = kb(gp, b, 1);
        const uint8_t *qs = kqs(g, 1);
        if (pf) prefetch_block_at(g, sizeof(hr_block_q5_Kx16), HR_X16_PF_K56, 1);
        __m256i sclo, schi;
        k_scales(g, half, &sclo, &schi);
#pragma GCC unroll 8
        for (int t = 0; t < C; t++) {
            isum[t] = _mm256_setzero_si256();
            __asm__("" : "+m"(isum[t]));
        }
        for (int sb = 0; sb < 8; sb++) {
            const int j = sb >> 1, odd = sb & 1;
            const __m256i sc16 = k_sc16(sclo, schi, sb);
            __m256i nib[8];
#pragma GCC unroll 8
            for (int v = 0; v < 8; v++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(qs + 512 * j + 64 * v + 32 * half));
                nib[v] = _mm256_or_si256(_mm256_and_si256(odd ? _mm256_srli_epi16(w, 4) : w, m4),
                                         k_fifth(kqh(g), v, half, sb));
            }
#pragma GCC unroll 8
            for (int t = 0; t < C; t++) {
                const int8_t *yq = ((const hr_block_q8_Ks *)(a + (size_t)t * as) + b)->qs + 32 * sb;
                const __m256i lo = _mm256_madd_epi16(k_four(nib, yq), sc16);
                isum[t] =
                    _mm256_add_epi32(isum[t], _mm256_add_epi32(lo, _mm256_madd_epi16(k_four(nib + 4, yq + 16), sc16)));
                __asm__("" : "+m"(isum[t])); /* in memory, not spilled at the compiler's choosing */
            }
        }
        k_finish(C, g, half, a, as, b, isum, y, ys);
    }
}

/* q6_Kx16 with AVX2, 8 rows a half: the values of quarter q of half h, chunk v (as the AVX-512
 * k6_u; u_3 by masking the three tops first, so that the 16-bit shifts move no bits across bytes), */
static inline __attribute__((always_inline)) __m256i k6_u(const hr_block_q6_Kx16 *g, int half, int h, int q, int v) {
    const __m256i *pa = (const __m256i *)(g->q + hr_q6x16_ql_at(16 * h + v) + 32 * half);
    const __m256i *pb = (const __m256i *)(g->q + hr_q6x16_ql_at(16 * h + 8 + v) + 32 * half);
    const __m256i *pc = (const __m256i *)(g->q + hr_q6x16_qh_at(8 * h + v) + 32 * half);
    const __m256i low = _mm256_set1_epi8(0x3F);
    if (q < 3) return _mm256_and_si256(_mm256_loadu_si256(q == 0 ? pa : q == 1 ? pb : pc), low);
    const __m256i a = _mm256_srli_epi16(_mm256_andnot_si256(low, _mm256_loadu_si256(pa)), 6);
    const __m256i b = _mm256_srli_epi16(_mm256_andnot_si256(low, _mm256_loadu_si256(pb)), 4);
    const __m256i c = _mm256_srli_epi16(_mm256_andnot_si256(low, _mm256_loadu_si256(pc)), 2);
    return _mm256_or_si256(_mm256_or_si256(a, b), c);
}

/* the 8 rows' scale of sub-block sb as int16 in both halves of each dword (for vpmaddwd), */
static inline __attribute__((always_inline)) __m256i k6_sc16(const hr_block_q6_Kx16 *g, int half, int sb) {
    const __m256i s = _mm256_loadu_si256((const __m256i *)(g->scales + 64 * (sb >> 2) + 32 * half));
    const int i = sb & 3;
#define K6_CTRL(j) (int)(((4 * (j) + i) << 24) | (0x80 << 16) | ((4 * (j) + i) << 8) | 0x80)
    const __m256i ctrl = _mm256_setr_epi32(K6_CTRL(0), K6_CTRL(1), K6_CTRL(2), K6_CTRL(3), K6_CTRL(0), K6_CTRL(1),
                                           K6_CTRL(2), K6_CTRL(3));
#undef K6_CTRL
    return _mm256_srai_epi16(_mm256_shuffle_epi8(s, ctrl), 8);
}

/* the scales paired for the -32 term (as the AVX-512 k6_pairs), */
static inline __attribute__((always_inline)) void k6_pairs(const hr_block_q6_Kx16 *g, int half, __m256i p[8]) {
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m256i s = _mm256_loadu_si256((const __m256i *)(g->scales + 64 * c + 32 * half));
        const __m256i ev = _mm256_srai_epi16(_mm256_slli_epi16(s, 8), 8), od = _mm256_srai_epi16(s, 8);
        p[2 * c] = _mm256_blend_epi16(ev, _mm256_slli_epi32(od, 16), 0xAA);
        p[2 * c + 1] = _mm256_blend_epi16(_mm256_srli_epi32(ev, 16), od, 0xAA);
    }
}
static inline __attribute__((always_inline)) __m256i k6_corr(const __m256i p[8], const hr_block_q8_K *yb) {
    __m256i c = _mm256_madd_epi16(p[0], _mm256_set1_epi32(load_i32(yb->bsums)));
#pragma GCC unroll 8
    for (int i = 1; i < 8; i++)
        c = _mm256_add_epi32(c, _mm256_madd_epi16(p[i], _mm256_set1_epi32(load_i32(yb->bsums + 2 * i))));
    return _mm256_slli_epi32(c, 5);
}

/* and the exact int32 sum over one sub-block of 16 values (4 chunks u) times its scale: vpmaddubsw
 * pairs of two chunks summed in int16 (2 x 2 x 63 x 128 < 2^15, k6_two), vpmaddwd by the scale. */
static inline __attribute__((always_inline)) __m256i k6_two(__m256i u0, __m256i u1, const int8_t *yq) {
    return _mm256_add_epi16(_mm256_maddubs_epi16(u0, _mm256_set1_epi32(load_i32(yq))),
                            _mm256_maddubs_epi16(u1, _mm256_set1_epi32(load_i32(yq + 4))));
}
static inline __attribute__((always_inline)) __m256i k6_sub(const __m256i u[4], __m256i sc16, const int8_t *yq) {
    return _mm256_add_epi32(_mm256_madd_epi16(k6_two(u[0], u[1], yq), sc16),
                            _mm256_madd_epi16(k6_two(u[2], u[3], yq + 8), sc16));
}

/* q6_Kx16 with AVX2, one half, C tokens: sub-block after sub-block, two chunks at a time (2 value
 * registers shared by the tokens), an int32 sum per token over the super-block, then the -32 term and
 * one FMA. The halves' loop is unrolled as in one_tok_q6k below (constant offsets): bench_tile
 * q6_Kx16 64 2048 N avx2, 5 alternating rounds at load 2-4, medians 80.5 -> 94.3 GF/s (64 tokens),
 * 87.5 -> 100.9 (16); the same pragma in the AVX-512 tile measured no faster (257 -> 217, 247 -> 254)
 * and is not there. Up to HR_X16_TC_WIDE = 8 tokens a pass (the other AVX2 tiles take 4): the values of
 * a sub-block are unpacked once for twice the tokens. 8 sums, 2 + 1 value and scale registers and the
 * temporaries fill the 16 ymm registers, so two things keep the sums out of memory: the chunks go two
 * at a time (4 at once spilled sums), and the empty asm after each sum's add, which stops GCC from
 * reassociating a token's 32 adds into a tree of partial sums held across the super-block (it stored
 * 264 vectors a super-block and half to the stack). bench_tile q6_Kx16 64 2048 16 avx2, 8 alternating
 * rounds, median 181.9 -> 201.8 GF/s. */
static inline __attribute__((always_inline)) void rows_tile_q6k(const int C, int64_t nb, const char *gp, int half,
                                                                const char *a, size_t as, float *y, size_t ys,
                                                                const int pf) {
    const hr_block_q6_Kx16 *g = (const void *)gp;
    __m256 acc[HR_X16_TC_WIDE];
#pragma GCC unroll 8
    for (int t = 0; t < C; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i isum[HR_X16_TC_WIDE];
#pragma GCC unroll 8
        for (int t = 0; t < C; t++) isum[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) /* in memory order, as the AVX-512 tile */
#pragma GCC unroll 2
            for (int e = 0; e < 2; e++)
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++) {
                    if (q == 0 && pf) k6_prefetch(&g[b], 2 * h + e, C == 1);
                    const __m256i sc16 = k6_sc16(&g[b], half, 8 * h + 2 * q + e);
#pragma GCC unroll 2
                    for (int j = 0; j < 2; j++) {
                        const __m256i u0 = k6_u(&g[b], half, h, q, 4 * e + 2 * j);
                        const __m256i u1 = k6_u(&g[b], half, h, q, 4 * e + 2 * j + 1);
#pragma GCC unroll 8
                        for (int t = 0; t < C; t++) {
                            const int8_t *yq = ((const hr_block_q8_K *)(a + (size_t)t * as) + b)->qs + 128 * h +
                                               32 * q + 16 * e + 8 * j;
                            isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(k6_two(u0, u1, yq), sc16));
                            __asm__("" : "+x"(isum[t])); /* a register, no reassociation */
                        }
                    }
                }
        __m256i p[8];
        k6_pairs(&g[b], half, p);
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g[b].d + 8 * half)));
#pragma GCC unroll 8
        for (int t = 0; t < C; t++) {
            const hr_block_q8_K *yb = (const hr_block_q8_K *)(a + (size_t)t * as) + b;
            const __m256i s = _mm256_sub_epi32(isum[t], k6_corr(p, yb));
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(yb->d)), _mm256_cvtepi32_ps(s), acc[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < C; t++) _mm256_storeu_ps(y + (size_t)t * ys, acc[t]);
}

/* One token (decode) of q6_Kx16 with AVX2: both halves per sub-block, so each line of the group is
 * read once and each activation broadcast serves 16 rows. The loop over the two halves of the
 * super-block is unrolled too, so every offset (hr_q6x16_ql_at / qh_at, the scales' shuffle) is a
 * constant: as a loop, the offsets were computed with scalar shifts and adds per chunk and the path
 * ran compute-bound at 20-22 GB/s even from L3, below the plain q6_K rows (25); unrolled 32 GB/s from
 * L3 and 24-25 from DRAM, the plain rows' rate (December 6, docs/BENCHMARKS_LOG.md). */
static inline void one_tok_q6k(int64_t nb, const char *gp, const char *a, float *y) {
    const hr_block_q6_Kx16 *g = (const void *)gp;
    const hr_block_q8_K *yb = (const void *)a;
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < nb; b++) {
        __m256i isum[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) /* in memory order */
#pragma GCC unroll 2
            for (int e = 0; e < 2; e++)
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++) {
                    if (q == 0) k6_prefetch(&g[b], 2 * h + e, 1);
                    const int8_t *yq = yb[b].qs + 128 * h + 32 * q + 16 * e;
#pragma GCC unroll 2
                    for (int hf = 0; hf < 2; hf++) {
                        __m256i u[4];
#pragma GCC unroll 4
                        for (int v = 0; v < 4; v++) u[v] = k6_u(&g[b], hf, h, q, 4 * e + v);
                        isum[hf] = _mm256_add_epi32(isum[hf], k6_sub(u, k6_sc16(&g[b], hf, 8 * h + 2 * q + e), yq));
                    }
                }
        const __m256 dy = _mm256_set1_ps(yb[b].d);
        for (int hf = 0; hf < 2; hf++) {
            __m256i p[8];
            k6_pairs(&g[b], hf, p);
            const __m256i s = _mm256_sub_epi32(isum[hf], k6_corr(p, &yb[b]));
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g[b].d + 8 * hf)));
            acc[hf] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dy), _mm256_cvtepi32_ps(s), acc[hf]);
        }
    }
    _mm256_storeu_ps(y, acc[0]);
    _mm256_storeu_ps(y + 8, acc[1]);
}
#define HR_X16_ONE_Q6K one_tok_q6k

/* One token (decode) of q8_0x16 with AVX2: both halves of the group per block, so each line of the
 * group is read once and the token's activation broadcasts serve both. */
static inline void one_tok_q8(int64_t nb, const char *gp, const char *a, float *y) {
    const hr_block_q8_0x16 *g = (const void *)gp;
    const hr_block_q8_0s *yb = (const void *)a;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; b++) {
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int v = 0; v < 8; v++) {
            const __m256i yv = _mm256_set1_epi32(load_i32(yb[b].qs + 4 * v));
            const __m256i w0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(g[b].qs + 64 * v)), flip);
            const __m256i w1 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(g[b].qs + 64 * v + 32)), flip);
            s0 = _mm256_add_epi32(
                s0, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w0), _mm256_sign_epi8(yv, w0)), ones));
            s1 = _mm256_add_epi32(
                s1, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w1), _mm256_sign_epi8(yv, w1)), ones));
        }
        const __m256 dy = _mm256_set1_ps(yb[b].d);
        const __m256 dw0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)g[b].d));
        const __m256 dw1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g[b].d + 8)));
        acc0 = _mm256_fmadd_ps(_mm256_mul_ps(dw0, dy), _mm256_cvtepi32_ps(s0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_mul_ps(dw1, dy), _mm256_cvtepi32_ps(s1), acc1);
    }
    _mm256_storeu_ps(y, acc0);
    _mm256_storeu_ps(y + 8, acc1);
}
#define HR_X16_ONE_Q8 one_tok_q8

/* One token (decode) of q4_Kx16 (q5_Kx16: q5 1) with AVX2: both halves per sub-block, so each line
 * of the group is read once and each activation broadcast serves 16 rows. */
static inline __attribute__((always_inline)) void one_tok_k(int64_t nb, const char *gp, const char *a, float *y,
                                                            const int q5) {
    const hr_block_q8_Ks *yb = (const void *)a;
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; b++) {
        const hr_block_q4_Kx16 *g = kb(gp, b, q5);
        const uint8_t *qs = kqs(g, q5);
        __m256i sclo[2], schi[2], isum[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int h = 0; h < 2; h++) k_scales(g, h, &sclo[h], &schi[h]);
        for (int sb = 0; sb < 8; sb++) {
            const int j = sb >> 1, odd = sb & 1;
            const int8_t *yq = yb[b].qs + 32 * sb;
            const __m256i sc16[2] = {k_sc16(sclo[0], schi[0], sb), k_sc16(sclo[1], schi[1], sb)};
            /* int16 sums of 8 chunks (q4_K) or 4 (q5_K: k_four's bound), then by the scales into int32 */
            __m256i s16[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 8
            for (int v = 0; v < 8; v++) {
                const __m256i yv = _mm256_set1_epi32(load_i32(yq + 4 * v));
                for (int h = 0; h < 2; h++) {
                    const __m256i w = _mm256_loadu_si256((const __m256i *)(qs + 512 * j + 64 * v + 32 * h));
                    __m256i n = _mm256_and_si256(odd ? _mm256_srli_epi16(w, 4) : w, m4);
                    if (q5) n = _mm256_or_si256(n, k_fifth(kqh(g), v, h, sb));
                    s16[h] = _mm256_add_epi16(s16[h], _mm256_maddubs_epi16(n, yv));
                    if (q5 && v == 3) {
                        isum[h] = _mm256_add_epi32(isum[h], _mm256_madd_epi16(s16[h], sc16[h]));
                        s16[h] = _mm256_setzero_si256();
                    }
                }
            }
            for (int h = 0; h < 2; h++) isum[h] = _mm256_add_epi32(isum[h], _mm256_madd_epi16(s16[h], sc16[h]));
        }
        const __m256 dy = _mm256_set1_ps(yb[b].d);
        for (int h = 0; h < 2; h++) {
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g->d + 8 * h)));
            acc[h] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dy), _mm256_cvtepi32_ps(isum[h]), acc[h]);
            k_mins(1, g, h, a, 0, b, &acc[h]);
        }
    }
    _mm256_storeu_ps(y, acc[0]);
    _mm256_storeu_ps(y + 8, acc[1]);
}
static inline void one_tok_q4k(int64_t nb, const char *gp, const char *a, float *y) { one_tok_k(nb, gp, a, y, 0); }
static inline void one_tok_q5k(int64_t nb, const char *gp, const char *a, float *y) { one_tok_k(nb, gp, a, y, 1); }
#define HR_X16_ONE_Q5K one_tok_q5k
#define HR_X16_ONE_Q4K one_tok_q4k

/* One token (decode) of q4_0x16 with AVX2: both halves per block (each line read once). */
static inline void one_tok_q4(int64_t nb, const char *gp, const char *a, float *y) {
    const hr_block_q4_0x16 *g = (const void *)gp;
    const hr_block_q8_0s *yb = (const void *)a;
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; b++) {
        __m256i s16[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            const __m256i ylo = _mm256_set1_epi32(load_i32(yb[b].qs + 4 * v));
            const __m256i yhi = _mm256_set1_epi32(load_i32(yb[b].qs + 16 + 4 * v));
            for (int h = 0; h < 2; h++) {
                const __m256i w = _mm256_loadu_si256((const __m256i *)(g[b].qs + 64 * v + 32 * h));
                s16[h] = _mm256_add_epi16(s16[h], _mm256_maddubs_epi16(_mm256_and_si256(w, m4), ylo));
                s16[h] =
                    _mm256_add_epi16(s16[h], _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(w, 4), m4), yhi));
            }
        }
        const __m256 dy = _mm256_set1_ps(yb[b].d);
        const __m256i s8 = _mm256_set1_epi32(yb[b].s8);
        for (int h = 0; h < 2; h++) {
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g[b].d + 8 * h)));
            const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(s16[h], ones), s8);
            acc[h] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dy), _mm256_cvtepi32_ps(s), acc[h]);
        }
    }
    _mm256_storeu_ps(y, acc[0]);
    _mm256_storeu_ps(y + 8, acc[1]);
}
#define HR_X16_ONE_Q4 one_tok_q4
#endif

/* One token over a group through the tile, half after half (where no dedicated path is faster). */
#define HR_X16_ONE_VIA(rows_tile)                                                                                      \
    static inline void one_tok_via_##rows_tile(int64_t nb, const char *gp, const char *a, float *y) {                  \
        for (int h = 0; h < HR_X16 / HR_X16_ROWS; h++) rows_tile(1, nb, gp, h, a, 0, y + h * HR_X16_ROWS, 0, h == 0);  \
    }
#ifndef HR_X16_ONE_Q4
HR_X16_ONE_VIA(rows_tile_q4)
#define HR_X16_ONE_Q4 one_tok_via_rows_tile_q4
#endif
#ifndef HR_X16_ONE_Q4K
HR_X16_ONE_VIA(rows_tile_q4k)
#define HR_X16_ONE_Q4K one_tok_via_rows_tile_q4k
#endif
#ifndef HR_X16_ONE_Q5K
HR_X16_ONE_VIA(rows_tile_q5k)
#define HR_X16_ONE_Q5K one_tok_via_rows_tile_q5k
#endif
#ifndef HR_X16_ONE_Q6K
HR_X16_ONE_VIA(rows_tile_q6k)
#define HR_X16_ONE_Q6K one_tok_via_rows_tile_q6k
#endif
#ifndef HR_X16_ONE_Q8
HR_X16_ONE_VIA(rows_tile_q8)
#define HR_X16_ONE_Q8 one_tok_via_rows_tile_q8
#endif

/* The tokens in tiles of HR_X16_TC (the last one narrower, its width a compile-time constant after
 * inlining); per tile, every group (and half) of the call's rows. The tile's activations (C x nb x
 * 44 bytes) stay in L1/L2 while the rows stream past; the call's rows (matmul gives up to 64, about
 * a quarter of L2) come from L2 for every tile after the first. */
#define HR_X16_CASE(n, rows_tile)                                                                                      \
    case n:                                                                                                            \
        rows_tile(n, nb, grp, h, at, as, yt, ys, pf);                                                                  \
        break;
#if HR_X16_TC > 8
/* one case a line: clang-format rejoined a longer list differently from run to run */
/* clang-format off */
#define HR_X16_WIDE_CASES(rows_tile)                                                                                   \
    HR_X16_CASE(15, rows_tile)                                                                                         \
    HR_X16_CASE(14, rows_tile)                                                                                         \
    HR_X16_CASE(13, rows_tile)                                                                                         \
    HR_X16_CASE(12, rows_tile)                                                                                         \
    HR_X16_CASE(11, rows_tile)                                                                                         \
    HR_X16_CASE(10, rows_tile)                                                                                         \
    HR_X16_CASE(9, rows_tile)                                                                                          \
    HR_X16_CASE(8, rows_tile)                                                                                          \
    HR_X16_CASE(7, rows_tile)                                                                                          \
    HR_X16_CASE(6, rows_tile)                                                                                          \
    HR_X16_CASE(5, rows_tile)                                                                                          \
    HR_X16_CASE(4, rows_tile)
/* clang-format on */
#else
#define HR_X16_WIDE_CASES(rows_tile)
/* clang-format off */
#define HR_X16_WIDE8_CASES(rows_tile)                                                                                  \
    HR_X16_CASE(8, rows_tile)                                                                                          \
    HR_X16_CASE(7, rows_tile)                                                                                          \
    HR_X16_CASE(6, rows_tile)                                                                                          \
    HR_X16_CASE(5, rows_tile)
/* clang-format on */
#endif
/* The driver: tokens step at a time (HR_X16_TC, or a tile's own), wide_cases the switch's cases above
 * HR_X16_TC (clang-format joins a macro argument's cases into one line otherwise). A tile prefetches
 * (its pf) only on the first pass over a group's lines, the first token step's first half: the later
 * passes and the other half find the lines in L1 / L2, and their prefetches (a 4-instruction loop
 * per block, 36 lines for q4_Kx16) were 7.7% of bench_tile q4_Kx16's samples. bench_kernels 2 avx2 3
 * q4_Kx16 16 5632 2048 16 (from memory), 5 alternating runs, median 244 -> 298 GF/s. */
/* clang-format off */
#define HR_X16_DRIVER_BY(name, rows_tile, one_tok, qk, step, wide_cases)                                               \
    void name(int64_t k, const void *w, size_t ws, int nr, const void *a, size_t as, int nt, float *y, size_t ys) {    \
        const int64_t nb = k / (qk);                                                                                   \
        const int ng = nr / HR_X16;                                                                                    \
        const char *A = a;                                                                                             \
        if (nt == 1) {                                                                                                 \
            for (int g = 0; g < ng; g++) one_tok(nb, (const char *)w + (size_t)g * HR_X16 * ws, A, y + g * HR_X16);    \
            return;                                                                                                    \
        }                                                                                                              \
        for (int t0 = 0; t0 < nt; t0 += (step)) {                                                                      \
            const int C = nt - t0 < (step) ? nt - t0 : (step);                                                         \
            for (int g = 0; g < ng; g++) {                                                                             \
                const char *grp = (const char *)w + (size_t)g * HR_X16 * ws;                                           \
                for (int h = 0; h < HR_X16 / HR_X16_ROWS; h++) {                                                       \
                    const char *at = A + (size_t)t0 * as;                                                              \
                    const int pf = t0 == 0 && h == 0; /* the first pass over the group's lines */                        \
                    float *yt = y + (size_t)t0 * ys + (size_t)(g * HR_X16 + h * HR_X16_ROWS);                          \
                    switch (C) {                                                                                       \
                        wide_cases                                                                                     \
                        HR_X16_CASE(HR_X16_TC, rows_tile)                                                              \
                        HR_X16_CASE(3, rows_tile)                                                                      \
                        HR_X16_CASE(2, rows_tile)                                                                      \
                    default: rows_tile(1, nb, grp, h, at, as, yt, ys, pf); break;                                      \
                    }                                                                                                  \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
    }
/* clang-format on */

#define HR_X16_DRIVER(name, rows_tile, one_tok, qk)                                                                    \
    HR_X16_DRIVER_BY(name, rows_tile, one_tok, qk, HR_X16_TC, HR_X16_WIDE_CASES(rows_tile))
/* the tiles that take HR_X16_TC_WIDE tokens a pass with AVX2 (AVX-512: HR_X16_TC as the others) */
#if HR_X16_512
#define HR_X16_DRIVER_WIDE(name, rows_tile, one_tok, qk) HR_X16_DRIVER(name, rows_tile, one_tok, qk)
#else
#define HR_X16_DRIVER_WIDE(name, rows_tile, one_tok, qk)                                                               \
    HR_X16_DRIVER_BY(name, rows_tile, one_tok, qk, HR_X16_TC_WIDE, HR_X16_WIDE8_CASES(rows_tile))
#endif

HR_X16_DRIVER(HR_X16FN(tile_q4_0x16), rows_tile_q4, HR_X16_ONE_Q4, HR_QK4_0)
HR_X16_DRIVER_WIDE(HR_X16FN(tile_q8_0x16), rows_tile_q8, HR_X16_ONE_Q8, HR_QK8_0)
HR_X16_DRIVER(HR_X16FN(tile_q4_Kx16), rows_tile_q4k, HR_X16_ONE_Q4K, HR_QK_K)
HR_X16_DRIVER_WIDE(HR_X16FN(tile_q5_Kx16), rows_tile_q5k, HR_X16_ONE_Q5K, HR_QK_K)
HR_X16_DRIVER_WIDE(HR_X16FN(tile_q6_Kx16), rows_tile_q6k, HR_X16_ONE_Q6K, HR_QK_K)

#include "backend/cpu/kernels_q5_0x16.h" /* q5_0x16's tiles, with these helpers and driver */

#endif

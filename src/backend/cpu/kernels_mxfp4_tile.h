/* kernels_mxfp4_tile.h: the dot and tile of MXFP4 weights against q8_0 activations, written once and
 * compiled twice: AVX2 (kernels_mxfp4_avx2.c: HR_MX_VNNI 0, names hr_avx2_*) and AVX-512 VNNI at 256 bits
 * (kernels_mxfp4_avx512.c: HR_MX_VNNI 1, names hr_avx512_*: s below is two vpdpbusd from -12 sum(y), the
 * same integers, so the same bits). The order is the one the scalar build in kernels_mxfp4.c reproduces.
 *
 * Blocks go in pairs: one register holds the 16 code bytes of block b in its low half and of b + 1 in
 * its high half; one AND and one shift+AND give both blocks' codes of elements 0..15 and 16..31, and a
 * byte shuffle through the doubled E2M1 table turns codes into signed values (-12..12). The activations
 * are rearranged the same way (two lane shuffles). The table is stored offset by 12 (u = v + 12, 0..24,
 * unsigned: maddubs's first operand), and 12 x the sum of each lane's 8 activations is subtracted:
 *     s = madd(maddubs(u_lo, y_lo) + maddubs(u_hi, y_hi), 1) - 12 sum(y)     (int16 exact: <= 12192)
 * the exact integer dot of the signed values; lanes 0-3 block b, 4-7 block b + 1. The float part:
 * acc = fma([dx_b x4, dx_b+1 x4] * [dy_b x4, dy_b+1 x4], cvt(s), acc), pairs in order, then hsum8.
 *
 * The tile prepares the tokens' activation pairs once per block of 64 rows (a 32 KiB stack table: up to
 * 256 pairs for one token, 64 each for four; longer rows go in chunks, the accumulators kept exactly in
 * memory between them) and runs register tiles of rows x tokens (4 x 1, 2 x 2, 1 x 3, 1 x 4) sharing
 * each decoded weight pair; every (row, token) element is the dot's sequence, so the same bits. No
 * thread-local storage (tests/no_tls.sh). */
#ifndef HR_BACKEND_CPU_KERNELS_MXFP4_TILE_H
#define HR_BACKEND_CPU_KERNELS_MXFP4_TILE_H

#include <immintrin.h>
#include <string.h>

#include "backend/cpu/kernels_internal.h"
#include "backend/cpu/simd_avx2.h"

typedef struct mx_w {
    __m256i lo, hi; /* v + 12 of elements 0..15 and 16..31 of both blocks */
    __m256 d;       /* [dx_b x4, dx_b+1 x4] */
} mx_w;

typedef struct mx_a {
    __m256i lo, hi; /* the activations, same layout */
    __m256i y12;    /* 12 x the sum of each int32 lane's 8 activations */
    __m256 d;
} mx_a;

static const int8_t k_table_u[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0}; /* v + 12 */

/* half the E8M0 scale, 2^(e - 128), as f32 bits (e 0 and 1: subnormal), a table rather than the
 * compare and shifts per block: a pair's scales were half the one-token path's operations */
#define MX_HS1(e)  ((e) < 2 ? 0x00200000u << ((e)&1) : (uint32_t)((e)-1) << 23) /* (e & 1): e, below 2 */
#define MX_HS4(e)  MX_HS1(e), MX_HS1((e) + 1), MX_HS1((e) + 2), MX_HS1((e) + 3)
#define MX_HS16(e) MX_HS4(e), MX_HS4((e) + 4), MX_HS4((e) + 8), MX_HS4((e) + 12)
#define MX_HS64(e) MX_HS16(e), MX_HS16((e) + 16), MX_HS16((e) + 32), MX_HS16((e) + 48)
static const uint32_t k_half_scale[256] = {MX_HS64(0), MX_HS64(64), MX_HS64(128), MX_HS64(192)};
#undef MX_HS64
#undef MX_HS16
#undef MX_HS4
#undef MX_HS1

static inline __attribute__((always_inline)) mx_w load_w(const hr_block_mxfp4 *b, const bool two) {
    const __m128i q0 = _mm_loadu_si128((const __m128i *)b[0].qs);
    const __m256i q = _mm256_set_m128i(two ? _mm_loadu_si128((const __m128i *)b[1].qs) : _mm_setzero_si128(), q0);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)k_table_u));
    mx_w x;
    x.lo = _mm256_shuffle_epi8(table, _mm256_and_si256(q, m4));
    x.hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
    /* a missing second block: codes 0 give u = 12 against zero activations and zero sums, scale 0 */
    const __m128i d01 =
        _mm_insert_epi32(_mm_cvtsi32_si128((int)k_half_scale[b[0].e]), two ? (int)k_half_scale[b[1].e] : 0, 1);
    x.d = _mm256_castsi256_ps(
        _mm256_permutevar8x32_epi32(_mm256_castsi128_si256(d01), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1)));
    return x;
}

static inline __attribute__((always_inline)) mx_a load_a(const hr_block_q8_0 *b, const bool two) {
    const __m256i y0 = _mm256_loadu_si256((const __m256i *)b[0].qs);
    const __m256i y1 = two ? _mm256_loadu_si256((const __m256i *)b[1].qs) : _mm256_setzero_si256();
    mx_a y;
    y.lo = _mm256_permute2x128_si256(y0, y1, 0x20);
    y.hi = _mm256_permute2x128_si256(y0, y1, 0x31);
    const __m256i ones8 = _mm256_set1_epi8(1);
    const __m256i sum16 = _mm256_add_epi16(_mm256_maddubs_epi16(ones8, y.lo), _mm256_maddubs_epi16(ones8, y.hi));
    const __m256i sum32 = _mm256_madd_epi16(sum16, _mm256_set1_epi16(1));
    y.y12 = _mm256_add_epi32(_mm256_slli_epi32(sum32, 3), _mm256_slli_epi32(sum32, 2));
#if HR_MX_VNNI
    y.y12 = _mm256_sub_epi32(_mm256_setzero_si256(), y.y12); /* the dots' start */
#endif
    uint16_t h0, h1 = 0;
    memcpy(&h0, &b[0].d, 2);
    if (two) memcpy(&h1, &b[1].d, 2);
    const __m128i h = _mm_cvtsi32_si128((int)(h0 | (uint32_t)h1 << 16));
    y.d = _mm256_cvtph_ps(_mm_shuffle_epi8(h, _mm_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3)));
    return y;
}

static inline __attribute__((always_inline)) __m256 step(__m256 acc, const mx_w *x, const mx_a *y) {
#if HR_MX_VNNI /* the same exact integers: -12 sum(y) + sum u y, four products per lane and instruction */
    const __m256i s = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(y->y12, x->lo, y->lo), x->hi, y->hi);
#else
    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(x->lo, y->lo), _mm256_maddubs_epi16(x->hi, y->hi));
    const __m256i s = _mm256_sub_epi32(_mm256_madd_epi16(p, _mm256_set1_epi16(1)), y->y12);
#endif
    return _mm256_fmadd_ps(_mm256_mul_ps(x->d, y->d), _mm256_cvtepi32_ps(s), acc);
}

float HR_MXFN(dot_mxfp4)(int64_t k, const void *w, const void *a) {
    const hr_block_mxfp4 *x = w;
    const hr_block_q8_0 *y = a;
    const int64_t nb = k / HR_QK_MXFP4;
    __m256 acc = _mm256_setzero_ps();
    int64_t ib = 0;
    for (; ib + 2 <= nb; ib += 2) {
        const mx_w wx = load_w(x + ib, true);
        const mx_a ay = load_a(y + ib, true);
        acc = step(acc, &wx, &ay);
    }
    if (ib < nb) {
        const mx_w wx = load_w(x + ib, false);
        const mx_a ay = load_a(y + ib, false);
        acc = step(acc, &wx, &ay);
    }
    return hsum8(acc);
}

#define MX_PREP   256 /* prepared activation pairs on the stack (32 KiB), shared by the tile's tokens */
#define MX_ROWS   64  /* rows whose accumulators persist between chunks of pairs (8 KiB) */
#define MX_TOKENS 4

/* One token (decode) prefetches each pair of the next R rows while it reads the current ones: four
 * rows of 17-byte blocks side by side were not followed closely enough by the hardware prefetcher
 * alone, 7.2 GB/s from DRAM against 12 with it (gate/up of gpt-oss-20b, 5760 x 2880 x 8 copies, 1
 * thread, AVX-512, CPU-time GB/s, December 6, docs/BENCHMARKS_LOG.md). Past the call's rows the
 * prefetch only touches lines it does not use (no fault). */
/* R rows x N tokens over pairs [p0, p1) against prepared pairs (token t's pair p at ap[t * stride + p -
 * p0]); the accumulators start at zero (first) or from acc, and end in y (last) or back in acc
 * ([r][MX_TOKENS] vectors; memory holds them exactly). */
static inline __attribute__((always_inline)) void tile_rn(int64_t nb, const char *w, size_t ws, const mx_a *ap,
                                                          int64_t stride, int64_t p0, int64_t p1, __m256 *acc_mem,
                                                          bool first, bool last, float *y, size_t ys, const int R,
                                                          const int N) {
    __m256 acc[4][4];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < N; t++) acc[r][t] = first ? _mm256_setzero_ps() : acc_mem[r * MX_TOKENS + t];
    const int64_t pf = 2 * p1 <= nb ? p1 : p1 - 1; /* pairs of two blocks; an odd last block alone */
    for (int64_t p = p0; p < pf; p++)
        for (int r = 0; r < R; r++) {
            if (N == 1) /* the same pair of row r + R (the next register tile), see below */
                _mm_prefetch((const char *)((const hr_block_mxfp4 *)(w + (size_t)(r + R) * ws) + 2 * p), _MM_HINT_T0);
            const mx_w wx = load_w((const hr_block_mxfp4 *)(w + (size_t)r * ws) + 2 * p, true);
            for (int t = 0; t < N; t++) acc[r][t] = step(acc[r][t], &wx, &ap[t * stride + p - p0]);
        }
    if (pf < p1)
        for (int r = 0; r < R; r++) {
            const mx_w wx = load_w((const hr_block_mxfp4 *)(w + (size_t)r * ws) + 2 * pf, false);
            for (int t = 0; t < N; t++) acc[r][t] = step(acc[r][t], &wx, &ap[t * stride + pf - p0]);
        }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < N; t++) {
            if (last)
                y[(size_t)t * ys + r] = hsum8(acc[r][t]);
            else
                acc_mem[r * MX_TOKENS + t] = acc[r][t];
        }
}

/* Rows [0, nr) (nr <= MX_ROWS) x n tokens over pairs [p0, p1) in the register tile for n. */
static inline void rows_n(int64_t nb, const char *w, size_t ws, int nr, const mx_a *ap, int64_t stride, int64_t p0,
                          int64_t p1, __m256 *acc, bool first, bool last, float *y, size_t ys, int n) {
    int r = 0;
#define MX_T(R, N)                                                                                                     \
    tile_rn(nb, w + (size_t)r * ws, ws, ap, stride, p0, p1, acc + r * MX_TOKENS, first, last, y + r, ys, R, N)
    switch (n) {
    case 1:
        for (; r + 4 <= nr; r += 4) MX_T(4, 1);
        for (; r < nr; r++) MX_T(1, 1);
        break;
    case 2:
        for (; r + 2 <= nr; r += 2) MX_T(2, 2);
        for (; r < nr; r++) MX_T(1, 2);
        break;
    case 3:
        for (; r < nr; r++) MX_T(1, 3);
        break;
    default:
        for (; r < nr; r++) MX_T(1, 4);
        break;
    }
#undef MX_T
}

void HR_MXFN(tile_mxfp4)(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                         float *y, size_t y_stride) {
    const int64_t nb = k / HR_QK_MXFP4, np = (nb + 1) / 2;
    mx_a prep[MX_PREP];
    __m256 acc[MX_ROWS * MX_TOKENS];
    /* tokens in groups of up to 4; per group, rows in blocks of MX_ROWS and pairs in chunks that fit
     * the table (256 / n pairs a token): each chunk's activation pairs prepared once for the block's rows */
    for (int t0 = 0; t0 < nt; t0 += MX_TOKENS) {
        const int n = nt - t0 < MX_TOKENS ? nt - t0 : MX_TOKENS;
        const int64_t chunk = MX_PREP / n;
        for (int r0 = 0; r0 < nr; r0 += MX_ROWS) {
            const int rows = nr - r0 < MX_ROWS ? nr - r0 : MX_ROWS;
            for (int64_t p0 = 0; p0 < np; p0 += chunk) {
                const int64_t p1 = p0 + chunk < np ? p0 + chunk : np;
                for (int t = 0; t < n; t++) {
                    const hr_block_q8_0 *yb = (const hr_block_q8_0 *)((const char *)a + (size_t)(t0 + t) * a_stride);
                    for (int64_t p = p0; p < p1; p++) prep[t * chunk + p - p0] = load_a(yb + 2 * p, 2 * p + 1 < nb);
                }
                rows_n(nb, (const char *)w + (size_t)r0 * w_stride, w_stride, rows, prep, chunk, p0, p1, acc, p0 == 0,
                       p1 == np, y + (size_t)t0 * y_stride + r0, y_stride, n);
            }
        }
    }
}

#endif

/* kernels_q5_tile.h: the dots and tiles of q5_0 and q5_1 weights against q8_0 activations, written
 * once and compiled twice: AVX2 (kernels_q5_avx2.c: HR_Q5_VNNI 0, names hr_avx2_*) and AVX-512 VNNI at
 * 256 bits (kernels_q5_avx512.c: HR_Q5_VNNI 1, names hr_avx512_*: the integer sums by vpdpbusd and the
 * fifth bits by a byte mask, the same integers, so the same bits). The includer defines HR_Q5_VNNI and
 * HR_Q5FN(name). The order is the one kernels_q5.c (the scalar table) writes out.
 *
 * Blocks go in pairs, as q4_0's (kernels_q4_0_tile.h): one register holds the 16 nibble bytes of block
 * b in its low half and of b + 1 in its high half; AND and shift+AND give both blocks' elements 0..15
 * and 16..31, and the fifth bits (qh, 32 per block: bit j belongs to element j) are spread to bytes of
 * 0x10 and ORed in, giving the unsigned values u = 0..31. The activations are rearranged the same way
 * (two lane shuffles per pair, shared by every row of a tile). Per int32 lane (4 elements of the low
 * half and the 4 matching of the high half; lanes 0-3 block b, 4-7 block b + 1):
 *     p = maddubs(u_lo, y_lo) + maddubs(u_hi, y_hi)           (int16, exact: |p| <= 4 x 31 x 127)
 *     q5_0: s = madd(p, 1) - 16 sum(y)                         (the exact dot of q - 16)
 *     q5_1: s = madd(p, 1)                                     (the exact dot of q)
 * and the float part, one fixed sequence per (row, token) pair in the dot and every tile:
 *     acc = fma([dx_b x4, dx_b+1 x4] * [dy_b x4, dy_b+1 x4], cvt(s), acc)
 *     q5_1: acc = fma([mx_b x4, mx_b+1 x4], [dy_b x4, dy_b+1 x4] * cvt(sum(y)), acc)
 * pairs in order, then hsum8. An odd last block is a pair whose second half is zero (values,
 * activations, scales and mins).
 *
 * The batch tile (nt > 1) is q4_0's 1 weight row x 8 tokens through the shared driver
 * (kernels_tile.h): the tokens' prepared pairs packed once per k-block, each weight pair unpacked once
 * for the 8 tokens. A lone token goes row after row against pairs prepared once on the stack. */
#ifndef HR_BACKEND_CPU_KERNELS_Q5_TILE_H
#define HR_BACKEND_CPU_KERNELS_Q5_TILE_H

#include <immintrin.h>
#include <string.h>

#include "backend/cpu/kernels_tile.h"
#include "backend/cpu/simd_avx2.h"

/* Byte i of the result is 0x10 where bit i of w is set, else 0. */
static inline __m256i bits_to_0x10(uint32_t w) {
#if HR_Q5_VNNI
    return _mm256_maskz_mov_epi8((__mmask32)w, _mm256_set1_epi8(0x10));
#else
    const __m256i idx = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                                         3, 3, 3, 3, 3, 3);
    const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)w), idx), sel);
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, sel), _mm256_set1_epi8(0x10));
#endif
}

typedef struct q5a {
    __m256i lo, hi; /* activations 0..15 and 16..31 of both blocks */
    __m256 d;       /* [dy_b x4, dy_b+1 x4] */
    __m256i e;      /* q5_0: 16 x each lane's sum of 8 activations (negated for VNNI: the dots' start);
                     * q5_1: the bits of d x cvt(that sum) */
} q5a;

typedef struct q5w {
    __m256i lo, hi; /* u = 0..31, same layout */
    __m256 d, m;    /* [dx_b x4, dx_b+1 x4], q5_1's mins likewise */
} q5w;

static inline __attribute__((always_inline)) q5a load_a(const char *a, int64_t ib, const bool two, const bool q51) {
    const hr_block_q8_0 *b = (const hr_block_q8_0 *)a + ib;
    q5a y;
    const __m256i sum = q8_0_pair_lanes(b, two, &y.lo, &y.hi);
    y.d = f16_scale_pair((const char *)b, sizeof(hr_block_q8_0), two);
    if (q51) {
        y.e = _mm256_castps_si256(_mm256_mul_ps(y.d, _mm256_cvtepi32_ps(sum)));
    } else {
        y.e = _mm256_slli_epi32(sum, 4);
#if HR_Q5_VNNI
        y.e = _mm256_sub_epi32(_mm256_setzero_si256(), y.e);
#endif
    }
    return y;
}

static inline __attribute__((always_inline)) q5w load_w(const char *w, int64_t ib, const bool two, const bool q51) {
    /* q5_0: d, qh at 2, qs at 6 (22 bytes); q5_1: d, m, qh at 4, qs at 8 (24 bytes) */
    const size_t bs = q51 ? sizeof(hr_block_q5_1) : sizeof(hr_block_q5_0), qh_at = q51 ? 4 : 2, qs_at = qh_at + 4;
    const char *b = w + (size_t)ib * bs;
    uint32_t h0, h1 = 0;
    memcpy(&h0, b + qh_at, 4);
    if (two) memcpy(&h1, b + bs + qh_at, 4);
    const __m128i q0 = _mm_loadu_si128((const __m128i *)(b + qs_at));
    const __m256i q =
        _mm256_set_m128i(two ? _mm_loadu_si128((const __m128i *)(b + bs + qs_at)) : _mm_setzero_si128(), q0);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    q5w x;
    x.lo = _mm256_or_si256(_mm256_and_si256(q, m4), bits_to_0x10((h0 & 0xFFFFu) | h1 << 16));
    x.hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), bits_to_0x10(h0 >> 16 | (h1 & 0xFFFF0000u)));
    x.d = f16_scale_pair(b, bs, two);
    x.m = q51 ? f16_scale_pair(b + 2, bs, two) : _mm256_setzero_ps();
    return x;
}

static inline __attribute__((always_inline)) __m256 step(__m256 acc, const q5w *x, const q5a *y, const bool q51) {
#if HR_Q5_VNNI /* the same exact integers, four products per lane and instruction */
    const __m256i s0 = q51 ? _mm256_setzero_si256() : y->e;
    const __m256i s = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(s0, x->lo, y->lo), x->hi, y->hi);
#else
    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(x->lo, y->lo), _mm256_maddubs_epi16(x->hi, y->hi));
    __m256i s = _mm256_madd_epi16(p, _mm256_set1_epi16(1));
    if (!q51) s = _mm256_sub_epi32(s, y->e);
#endif
    acc = _mm256_fmadd_ps(_mm256_mul_ps(x->d, y->d), _mm256_cvtepi32_ps(s), acc);
    if (q51) acc = _mm256_fmadd_ps(x->m, _mm256_castsi256_ps(y->e), acc);
    return acc;
}

static inline __attribute__((always_inline)) float dot_1x1(int64_t nb, const char *w, const char *a, const bool q51) {
    __m256 c = _mm256_setzero_ps();
    int64_t ib = 0;
    for (; ib + 2 <= nb; ib += 2) {
        const q5a v = load_a(a, ib, true, q51);
        const q5w x = load_w(w, ib, true, q51);
        c = step(c, &x, &v, q51);
    }
    if (ib < nb) {
        const q5a v = load_a(a, ib, false, q51);
        const q5w x = load_w(w, ib, false, q51);
        c = step(c, &x, &v, q51);
    }
    return hsum8(c);
}

/* One weight row x C tokens over the pairs [p0, p1) against packed tokens (pair p of token t at
 * ap[(p - p0) * C + t]); accumulators from zero (first) or acc, to y (last) or back to acc. */
static inline __attribute__((always_inline)) void tile_row(const int C, int64_t p0, int64_t p1, int64_t nb,
                                                           const char *w, const q5a *ap, __m256 *acc, bool first,
                                                           bool last, float *y, size_t ys, const bool q51) {
    __m256 c[HR_TILE_TC];
#pragma GCC unroll 8
    for (int t = 0; t < C; t++) c[t] = first ? _mm256_setzero_ps() : acc[t];
    const int64_t pfull = p1 * 2 <= nb ? p1 : p1 - 1; /* pairs with two blocks */
    for (int64_t p = p0; p < pfull; p++) {
        const q5a *v = ap + (p - p0) * C;
        __asm__("" : "+r"(v)); /* the tokens' pairs are read as memory operands, not kept live */
        const q5w x = load_w(w, 2 * p, true, q51);
#pragma GCC unroll 8
        for (int t = 0; t < C; t++) c[t] = step(c[t], &x, v + t, q51);
    }
    if (pfull < p1) { /* the lone last block */
        const q5a *v = ap + (pfull - p0) * C;
        const q5w x = load_w(w, 2 * pfull, false, q51);
#pragma GCC unroll 8
        for (int t = 0; t < C; t++) c[t] = step(c[t], &x, v + t, q51);
    }
    if (last) {
#pragma GCC unroll 8
        for (int t = 0; t < C; t++) y[(size_t)t * ys] = hsum8(c[t]);
    } else {
#pragma GCC unroll 8
        for (int t = 0; t < C; t++) acc[t] = c[t];
    }
}

/* Decode: nr rows x 1 token, row after row, the token's pairs prepared once on the stack (the values
 * load_a gives, so the same bits); rows longer than the table prepare on the fly. Weights prefetched
 * HR_Q5_PF bytes ahead, as q4_0's lone-token path does. */
#define HR_Q5_PREP_PAIRS 256 /* 32 KiB of stack: k <= 16384 */
#define HR_Q5_PF         4096
static inline __attribute__((always_inline)) void rows_1tok(int64_t nb, const char *w, size_t ws, int nr, const char *a,
                                                            float *y, const bool q51) {
    const int64_t np = nb / 2;
    if (np + 1 > HR_Q5_PREP_PAIRS) {
        for (int r = 0; r < nr; r++) y[r] = dot_1x1(nb, w + (size_t)r * ws, a, q51);
        return;
    }
    const size_t pair_bytes = 2 * (q51 ? sizeof(hr_block_q5_1) : sizeof(hr_block_q5_0));
    q5a prep[HR_Q5_PREP_PAIRS];
    for (int64_t p = 0; p < np; p++) prep[p] = load_a(a, 2 * p, true, q51);
    if (nb & 1) prep[np] = load_a(a, nb - 1, false, q51);
    for (int r = 0; r < nr; r++) {
        const char *row = w + (size_t)r * ws;
        __m256 c = _mm256_setzero_ps();
        for (int64_t p = 0; p < np; p++) {
            _mm_prefetch(row + (size_t)p * pair_bytes + HR_Q5_PF, _MM_HINT_T0);
            const q5w x = load_w(row, 2 * p, true, q51);
            c = step(c, &x, &prep[p], q51);
        }
        if (nb & 1) {
            const q5w x = load_w(row, nb - 1, false, q51);
            c = step(c, &x, &prep[np], q51);
        }
        y[r] = hsum8(c);
    }
}

/* The driver's limits, q4_0's (kernels_q4_0_tile.h has the measurements behind them). */
#define HR_Q5_KP          16
#define HR_Q5_KP_STREAM   128
#define HR_Q5_ROWS        64
#define HR_Q5_CHUNK_BYTES (192 * 1024)
#define Q5_PAIRS(k)       (((k) / HR_QK5_0 + 1) / 2)

static inline __attribute__((always_inline)) q5a pack_q5_0(const char *a, int64_t p, int64_t k) {
    return load_a(a, 2 * p, 2 * p + 1 < k / HR_QK5_0, false);
}
static inline __attribute__((always_inline)) q5a pack_q5_1(const char *a, int64_t p, int64_t k) {
    return load_a(a, 2 * p, 2 * p + 1 < k / HR_QK5_1, true);
}
static inline __attribute__((always_inline)) void row_q5_0(const int C, int64_t p0, int64_t p1, int64_t k,
                                                           const char *w, const q5a *ap, __m256 *acc, bool first,
                                                           bool last, float *y, size_t ys) {
    tile_row(C, p0, p1, k / HR_QK5_0, w, ap, acc, first, last, y, ys, false);
}
static inline __attribute__((always_inline)) void row_q5_1(const int C, int64_t p0, int64_t p1, int64_t k,
                                                           const char *w, const q5a *ap, __m256 *acc, bool first,
                                                           bool last, float *y, size_t ys) {
    tile_row(C, p0, p1, k / HR_QK5_1, w, ap, acc, first, last, y, ys, true);
}
static void one_token_q5_0(int64_t k, const char *w, size_t ws, int nr, const char *a, float *y) {
    rows_1tok(k / HR_QK5_0, w, ws, nr, a, y, false);
}
static void one_token_q5_1(int64_t k, const char *w, size_t ws, int nr, const char *a, float *y) {
    rows_1tok(k / HR_QK5_1, w, ws, nr, a, y, true);
}

float HR_Q5FN(dot_q5_0)(int64_t k, const void *w, const void *a) { return dot_1x1(k / HR_QK5_0, w, a, false); }
float HR_Q5FN(dot_q5_1)(int64_t k, const void *w, const void *a) { return dot_1x1(k / HR_QK5_1, w, a, true); }

HR_TILE_DRIVER(HR_Q5FN(tile_q5_0), q5a, __m256, 1, Q5_PAIRS, HR_Q5_KP, HR_Q5_KP_STREAM, HR_Q5_ROWS, HR_Q5_CHUNK_BYTES,
               pack_q5_0, row_q5_0, one_token_q5_0)
HR_TILE_DRIVER(HR_Q5FN(tile_q5_1), q5a, __m256, 1, Q5_PAIRS, HR_Q5_KP, HR_Q5_KP_STREAM, HR_Q5_ROWS, HR_Q5_CHUNK_BYTES,
               pack_q5_1, row_q5_1, one_token_q5_1)

#endif

/* kernels_q8_0_tile.h: the q8_0 dot and batch tile (q8_0 weights against q8_0 activations), written
 * once and compiled twice: for AVX2 (kernels_avx2.c: HR_Q_VNNI 0, names hr_avx2_*) and for AVX-512
 * VNNI at 256 bits (kernels_q8_avx512.c: HR_Q_VNNI 1, names hr_avx512_*). The two differ only in how
 * the exact integer block sums are formed (maddubs + madd, or one vpdpbusd per half), so they give
 * the same bits. The includer defines HR_Q_VNNI and HR_QFN(name).
 *
 * Reduction order (what makes results batch-invariant): each dot keeps one 8-lane f32 accumulator
 * per (weight row, activation row) pair, adds block pairs in increasing order, and finishes with
 * hsum8(). The tiles below do exactly this per pair; they only share the loads between pairs.
 *
 * Shapes: the dot is 1 x 1. Decode (vec_dot_tile, nt == 1) goes row after row against the token's
 * block pairs prepared once into a stack table. The batch tile (nt > 1) is 1 weight row x 8 tokens:
 * the 8 tokens' prepared pairs are packed once per k-block into a thread-local table read as memory
 * operands, each weight pair is loaded and made absolute once for the 8 tokens, and the 8
 * accumulators stay in registers, kept in memory (exact) between k-blocks. Rows go in chunks of at
 * most 64 (about 192 KiB of weights, the chunks evenly sized); per chunk the first group of 8
 * tokens streams the rows whole (up to k = 8192 at a time: one sequential read the prefetcher
 * follows, its table in L2), the later groups take k-blocks of 16 pairs (table in L1, weights in
 * L2), and the tokens past the groups of 8 run 1 x 4, 1 x 3 and 1 x 2 tiles (no token alone). */
#ifndef HR_BACKEND_CPU_KERNELS_Q8_0_TILE_H
#define HR_BACKEND_CPU_KERNELS_Q8_0_TILE_H

#include <immintrin.h>

#include "backend/cpu/kernels_tile.h"
#include "backend/cpu/simd_avx2.h"

/* ---- q8_0 weights against q8_0 activations ----
 *
 * Blocks go in pairs (b, b + 1; an odd last block pairs with zeros). Their bytes are interleaved
 * four at a time, lo = unpacklo_epi32(b, b + 1) and hi = unpackhi_epi32(b, b + 1), so after
 * madd(maddubs(|x|, sign(y, x)), 1) (exact: |x|, |y| <= 127) the int32 lanes alternate b, b + 1 and
 * lo + hi holds the pair's integer sums, four lanes per block. The float part is one fixed
 * sequence per (weight row, activation row) pair, the same in the dot and in every tile:
 *     acc = fma([dx_b, dx_b+1] x4 * [dy_b, dy_b+1] x4, cvt(lo + hi), acc)   pairs in order
 *     result = hsum8(acc) */

/* The scale pair [d_b, d_b+1] x4 (d_b+1 = 0 when !two). */
static inline __attribute__((always_inline)) __m256 dpair(const hr_block_q8_0 *b, const bool two) {
    const int h = b[0].d | (two ? (int)b[1].d << 16 : 0);
    const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128(h));
    return _mm256_castpd_ps(_mm256_broadcastsd_pd(_mm_castps_pd(f)));
}

/* An activation block pair as every row of a tile uses it. */
typedef struct ablk {
    __m256i lo, hi; /* the interleaved signed bytes */
    __m256 d;       /* scale pair */
} ablk;

static inline __attribute__((always_inline)) void pair_bytes(const hr_block_q8_0 *b, const bool two, __m256i *lo,
                                                             __m256i *hi) {
    const __m256i q0 = _mm256_loadu_si256((const __m256i *)b[0].qs);
    const __m256i q1 = two ? _mm256_loadu_si256((const __m256i *)b[1].qs) : _mm256_setzero_si256();
    *lo = _mm256_unpacklo_epi32(q0, q1);
    *hi = _mm256_unpackhi_epi32(q0, q1);
}

/* The pair at block ib (two: with block ib + 1, else the lone last block). */
static inline __attribute__((always_inline)) ablk load_ablk(const char *a, int64_t ib, const bool two) {
    const hr_block_q8_0 *b = (const hr_block_q8_0 *)a + ib;
    ablk y;
    pair_bytes(b, two, &y.lo, &y.hi);
    y.d = dpair(b, two);
    return y;
}

/* A weight block pair as every token of a tile uses it: its bytes and their absolute values. */
typedef struct wblk {
    __m256i lo, hi, alo, ahi;
    __m256 d;
} wblk;

static inline __attribute__((always_inline)) wblk load_wblk(const char *row, int64_t ib, const bool two) {
    const hr_block_q8_0 *b = (const hr_block_q8_0 *)row + ib;
    wblk x;
    pair_bytes(b, two, &x.lo, &x.hi);
    x.alo = _mm256_sign_epi8(x.lo, x.lo);
    x.ahi = _mm256_sign_epi8(x.hi, x.hi);
    x.d = dpair(b, two);
    return x;
}

/* The per-pair step every shape runs, block pair after block pair. */
static inline __attribute__((always_inline)) __m256 step(__m256 acc, const wblk *x, const ablk *y) {
#if HR_Q_VNNI /* each int32 lane: the sum of its 4 byte products, as madd(maddubs()) gives it */
    const __m256i s =
        _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), x->alo, _mm256_sign_epi8(y->lo, x->lo)), x->ahi,
                            _mm256_sign_epi8(y->hi, x->hi));
#else
    const __m256i one = _mm256_set1_epi16(1);
    const __m256i s =
        _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(x->alo, _mm256_sign_epi8(y->lo, x->lo)), one),
                         _mm256_madd_epi16(_mm256_maddubs_epi16(x->ahi, _mm256_sign_epi8(y->hi, x->hi)), one));
#endif
    return _mm256_fmadd_ps(_mm256_mul_ps(x->d, y->d), _mm256_cvtepi32_ps(s), acc);
}

static inline __attribute__((always_inline)) float tile_1x1(int64_t nb, const char *w, const char *a) {
    __m256 c = _mm256_setzero_ps();
    int64_t ib = 0;
    for (; ib + 2 <= nb; ib += 2) {
        const ablk y = load_ablk(a, ib, true);
        const wblk x = load_wblk(w, ib, true);
        c = step(c, &x, &y);
    }
    if (ib < nb) {
        const ablk y = load_ablk(a, ib, false);
        const wblk x = load_wblk(w, ib, false);
        c = step(c, &x, &y);
    }
    return hsum8(c);
}

/* The batch tile: one weight row x C tokens (C = HR_Q8_TC, or 4, 3 and 2 for a batch's leftover
 * tokens), over the block pairs [p0, p1) of a k-block. The tokens' block pairs are packed
 * beforehand into a table (ap: pair p's tokens at ap[(p - p0) * C + t], the values load_ablk
 * makes) that is read as memory operands; the weight pair is loaded and made absolute once for all
 * the tokens. The C accumulators start at zero (first) or from acc, and end in y (last: hsum8) or
 * back in acc, so splitting k into blocks keeps the one sequence of operations per element: every
 * element has the bits of tile_1x1. With AVX2's 16 registers: 8 accumulators, the weight pair (4)
 * and the step's temporaries; a 4 x 4 tile spilled its accumulators to the stack, and a 2 x 4 one
 * did the weight work twice as often. */
#define HR_Q8_TC HR_TILE_TC /* tokens of the batch tile */
#define HR_Q8_KP 16         /* block pairs per k-block: the packed tokens (16 x 8 x 96 bytes) stay in L1 */
static inline __attribute__((always_inline)) void tile_row(const int C, int64_t p0, int64_t p1, int64_t nb,
                                                           const char *w, const ablk *ap, __m256 *acc, bool first,
                                                           bool last, float *y, size_t ys) {
    __m256 c[HR_Q8_TC];
#pragma GCC unroll 8
    for (int t = 0; t < C; t++) c[t] = first ? _mm256_setzero_ps() : acc[t];
    const int64_t pfull = p1 * 2 <= nb ? p1 : p1 - 1; /* pairs with two blocks */
    for (int64_t p = p0; p < pfull; p++) {
        /* hide from the compiler that the pairs' loads are of the same table, so it does not keep
         * them live across iterations */
        const ablk *v = ap + (p - p0) * C;
        __asm__("" : "+r"(v));
        const wblk x = load_wblk(w, 2 * p, true);
#pragma GCC unroll 8
        for (int t = 0; t < C; t++) c[t] = step(c[t], &x, v + t);
    }
    if (pfull < p1) { /* the lone last block */
        const ablk *v = ap + (pfull - p0) * C;
        const wblk x = load_wblk(w, 2 * pfull, false);
#pragma GCC unroll 8
        for (int t = 0; t < C; t++) c[t] = step(c[t], &x, v + t);
    }
    if (last) {
#pragma GCC unroll 8
        for (int t = 0; t < C; t++) y[(size_t)t * ys] = hsum8(c[t]);
    } else {
#pragma GCC unroll 8
        for (int t = 0; t < C; t++) acc[t] = c[t];
    }
}

/* The driver's k-blocks and row chunks (kernels_tile.h): the first group over a chunk streams the
 * rows in k-blocks of up to HR_Q8_KP_STREAM pairs, the later ones take HR_Q8_KP. */
#define HR_Q8_KP_STREAM   128          /* pairs: k <= 8192 in one k-block (8 x 128 x 96 bytes) */
#define HR_Q8_ROWS        64           /* rows per chunk at most */
#define HR_Q8_CHUNK_BYTES (192 * 1024) /* weight bytes per chunk at most (then at least one row) */

float HR_QFN(dot_q8_0)(int64_t k, const void *w, const void *a) { return tile_1x1(k / HR_QK8_0, w, a); }

/* Decode: nr rows x 1 token, row after row, the activation pairs (bytes and broadcast scales)
 * prepared once into a stack table for all nr rows (the values load_ablk makes, so the same bits).
 * Rows longer than the table fall back to tile_1x1. The weights, which come from DRAM, are
 * prefetched HR_Q8_PF bytes ahead of the loads (past a row's end into the next row: a share's rows
 * are contiguous); 2 threads, 32768 x 2048, alternating runs on a shared 2-core EPYC: 1.15-1.4x
 * the rate without (D = 2048-8192 alike, 512 no gain); rows already in L2 lose 3-5%. */
#define HR_Q8_PREP_PAIRS 256  /* 24 KiB of stack: k <= 16384 */
#define HR_Q8_PF         4096 /* prefetch distance, bytes */
static void rows_1tok(int64_t nb, const char *w, size_t ws, int nr, const char *a, float *y) {
    const int64_t np = nb / 2;
    if ((nb + 1) / 2 > HR_Q8_PREP_PAIRS) {
        for (int r = 0; r < nr; r++) y[r] = tile_1x1(nb, w + (size_t)r * ws, a);
        return;
    }
    ablk prep[HR_Q8_PREP_PAIRS];
    for (int64_t p = 0; p < np; p++) prep[p] = load_ablk(a, 2 * p, true);
    if (nb & 1) prep[np] = load_ablk(a, nb - 1, false);
    for (int r = 0; r < nr; r++) {
        const char *row = w + (size_t)r * ws;
        __m256 c = _mm256_setzero_ps();
        for (int64_t p = 0; p < np; p++) {
            const char *pf = row + (size_t)p * 2 * sizeof(hr_block_q8_0) + HR_Q8_PF;
            _mm_prefetch(pf, _MM_HINT_T0); /* 68 bytes a pair: two lines cover every line */
            _mm_prefetch(pf + 64, _MM_HINT_T0);
            const wblk x = load_wblk(row, 2 * p, true);
            c = step(c, &x, &prep[p]);
        }
        if (nb & 1) {
            const wblk x = load_wblk(row, nb - 1, false);
            c = step(c, &x, &prep[np]);
        }
        y[r] = hsum8(c);
    }
}

/* The driver's parts (kernels_tile.h): the step unit is a block pair. */
#define Q8_PAIRS(k) (((k) / HR_QK8_0 + 1) / 2)
static inline __attribute__((always_inline)) ablk pack_q8(const char *a, int64_t p, int64_t k) {
    return load_ablk(a, 2 * p, 2 * p + 1 < k / HR_QK8_0);
}
static inline __attribute__((always_inline)) void row_q8(const int C, int64_t p0, int64_t p1, int64_t k, const char *w,
                                                         const ablk *ap, __m256 *acc, bool first, bool last, float *y,
                                                         size_t ys) {
    tile_row(C, p0, p1, k / HR_QK8_0, w, ap, acc, first, last, y, ys);
}
static void one_token_q8(int64_t k, const char *w, size_t ws, int nr, const char *a, float *y) {
    rows_1tok(k / HR_QK8_0, w, ws, nr, a, y);
}

/* A lone token (decode) goes row after row (rows_1tok): its weights come from DRAM, and one
 * sequential stream per thread is prefetched better than four interleaved row streams (2 threads,
 * 32768 x 2048: 1.2-1.5x the 4 x 1 rate). A batch goes through the shared 1 x 8 driver. */
HR_TILE_DRIVER(HR_QFN(tile_q8_0), ablk, __m256, 1, Q8_PAIRS, HR_Q8_KP, HR_Q8_KP_STREAM, HR_Q8_ROWS, HR_Q8_CHUNK_BYTES,
               pack_q8, row_q8, one_token_q8)

#endif

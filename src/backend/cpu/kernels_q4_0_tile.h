/* kernels_q4_0_tile.h: the dot and tiles of q4_0 weights against q8_0 activations, written once and
 * compiled twice: for AVX2 (kernels_q4_avx2.c: HR_Q_VNNI 0, names hr_avx2_*) and for AVX-512 VNNI at
 * 256 bits (kernels_q4_avx512.c: HR_Q_VNNI 1, names hr_avx512_*: s below is one vpdpbusd per half
 * starting from -8 * sum(y), the same integers, so the same bits). The includer defines HR_Q_VNNI
 * and HR_QFN(name).
 *
 * Blocks go in pairs: one 256-bit register holds the 16 packed bytes of block b in its low half and
 * of block b + 1 in its high half, so one AND gives both blocks' elements 0..15 and one shift+AND
 * both blocks' elements 16..31, against activations rearranged the same way (two lane shuffles per
 * pair, shared by every row of a tile). The nibbles stay unsigned (u = x + 8):
 *     p = maddubs(u_lo, y_lo) + maddubs(u_hi, y_hi)                (int16, exact: |p| <= 7680)
 *     s = madd(p, 1) - 8 * madd(maddubs(1, y_lo) + maddubs(1, y_hi), 1)   (int32; lanes 0-3 block b,
 *                                                                    lanes 4-7 block b + 1)
 * The float part is one fixed sequence per (row, token) pair, the same in the dot and every tile:
 *     acc = fma([dx_b x4, dx_b+1 x4] * [dy_b x4, dy_b+1 x4], cvt(s), acc)    pairs in order
 *     result = hsum8(acc)
 * An odd last block is a pair whose second half is zero (bytes, activations and scales).
 *
 * The batch tile (vec_dot_tile, nt > 1) is 1 weight row x 8 tokens: the 8 tokens' prepared pairs
 * (y_lo, y_hi, the 8 * sums, the scales) are packed once per k-block into a thread-local table read
 * as memory operands, each weight pair is unpacked once for the 8 tokens, and the 8 accumulators
 * stay in registers, kept in memory (exact) between k-blocks. Rows go in chunks of at most 64
 * (about 192 KiB of weights); per chunk the first group of 8 tokens streams the rows whole (up to
 * k = 8192 at a time: one sequential read the prefetcher follows, its table in L2), the later
 * groups take k-blocks of 16 pairs (table in L1, weights in L2), and the tokens past the groups of
 * 8 run 1 x 4, 1 x 3 and 1 x 2 tiles. A lone token (decode) goes row after row. */
#ifndef HR_BACKEND_CPU_KERNELS_Q4_0_TILE_H
#define HR_BACKEND_CPU_KERNELS_Q4_0_TILE_H

#include <immintrin.h>
#include <string.h>

#include "backend/cpu/kernels_tile.h"
#include "backend/cpu/simd_avx2.h"

typedef struct apair {
    __m256i lo, hi; /* elements 0..15 and 16..31 of both blocks */
    __m256i y8;     /* 8 * the sum of each lane's 8 activations (negated for VNNI: the dots' start) */
    __m256 d;
} apair;

typedef struct wpair {
    __m256i lo, hi; /* unsigned nibbles, same layout */
    __m256 d;
} wpair;

static inline __attribute__((always_inline)) apair load_apair(const char *a, int64_t ib, const bool two) {
    const hr_block_q8_0 *b = (const hr_block_q8_0 *)a + ib;
    apair y;
    y.y8 = _mm256_slli_epi32(q8_0_pair_lanes(b, two, &y.lo, &y.hi), 3);
#if HR_Q_VNNI
    y.y8 = _mm256_sub_epi32(_mm256_setzero_si256(), y.y8);
#endif
    y.d = f16_scale_pair((const char *)b, sizeof(hr_block_q8_0), two);
    return y;
}

static inline __attribute__((always_inline)) wpair load_wpair(const char *w, int64_t ib, const bool two) {
    const hr_block_q4_0 *b = (const hr_block_q4_0 *)w + ib;
    const __m128i q0 = _mm_loadu_si128((const __m128i *)b[0].qs);
    const __m256i q = two ? _mm256_set_m128i(_mm_loadu_si128((const __m128i *)b[1].qs), q0)
                          : _mm256_set_m128i(_mm_setzero_si128(), q0);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    wpair x;
    x.lo = _mm256_and_si256(q, m4);
    x.hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    x.d = f16_scale_pair((const char *)b, sizeof(hr_block_q4_0), two);
    return x;
}

static inline __attribute__((always_inline)) __m256 step(__m256 acc, const wpair *x, const apair *y) {
#if HR_Q_VNNI /* the same exact integers: -8 sum(y) + sum u * y, four products per lane and instruction */
    const __m256i s = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(y->y8, x->lo, y->lo), x->hi, y->hi);
#else
    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(x->lo, y->lo), _mm256_maddubs_epi16(x->hi, y->hi));
    const __m256i s = _mm256_sub_epi32(_mm256_madd_epi16(p, _mm256_set1_epi16(1)), y->y8);
#endif
    return _mm256_fmadd_ps(_mm256_mul_ps(x->d, y->d), _mm256_cvtepi32_ps(s), acc);
}

/* Every shape below loops over pairs (two = true), then the odd block (two = false). */
#define HR_PAIRS(...)                                                                                                  \
    do {                                                                                                               \
        int64_t ib = 0;                                                                                                \
        for (; ib + 2 <= nb; ib += 2) {                                                                                \
            const bool two = true;                                                                                     \
            __VA_ARGS__                                                                                                \
        }                                                                                                              \
        if (ib < nb) {                                                                                                 \
            const bool two = false;                                                                                    \
            __VA_ARGS__                                                                                                \
        }                                                                                                              \
    } while (0)

static float tile_1x1(int64_t nb, const char *w, const char *a) {
    __m256 c = _mm256_setzero_ps();
    HR_PAIRS({
        const apair v = load_apair(a, ib, two);
        const wpair x = load_wpair(w, ib, two);
        c = step(c, &x, &v);
    });
    return hsum8(c);
}

/* The batch tile: one weight row x C tokens (C = HR_Q4_TC, or 4, 3 and 2 for a batch's leftover
 * tokens), over the block pairs [p0, p1) of a k-block. The tokens' activation pairs are packed
 * beforehand into a table (ap: pair p's tokens at ap[(p - p0) * C + t], the values load_apair
 * gives) that is read as memory operands; the weight pair is unpacked once for all the tokens. The
 * C accumulators start at zero (first) or from acc, and end in y (last: hsum8) or back in acc, so
 * splitting k into blocks keeps the one sequence of operations per element: every element has the
 * bits of tile_1x1. With AVX2's 16 registers: 8 accumulators, the weight pair (3) and the step's
 * temporaries. A 4 x 4 tile spilled its accumulators to the stack, and so did a 2 rows x 4 tokens
 * one (each token's activation operands loaded once for both rows): its two weight pairs leave too
 * few registers for 8 accumulators. */
#define HR_Q4_TC HR_TILE_TC /* tokens of the batch tile */
#define HR_Q4_KP 16         /* block pairs per k-block: the packed tokens (16 x 8 x 128 bytes) stay in L1 */
static inline __attribute__((always_inline)) void tile_row(const int C, int64_t p0, int64_t p1, int64_t nb,
                                                           const char *w, const apair *ap, __m256 *acc, bool first,
                                                           bool last, float *y, size_t ys) {
    __m256 c[HR_Q4_TC];
#pragma GCC unroll 8
    for (int t = 0; t < C; t++) c[t] = first ? _mm256_setzero_ps() : acc[t];
    const int64_t pfull = p1 * 2 <= nb ? p1 : p1 - 1; /* pairs with two blocks */
    for (int64_t p = p0; p < pfull; p++) {
        /* hide from the compiler that the pairs' loads are of the same table, so it does not keep
         * them live across iterations */
        const apair *v = ap + (p - p0) * C;
        __asm__("" : "+r"(v));
        const wpair x = load_wpair(w, 2 * p, true);
#pragma GCC unroll 8
        for (int t = 0; t < C; t++) c[t] = step(c[t], &x, v + t);
    }
    if (pfull < p1) { /* the lone last block */
        const apair *v = ap + (pfull - p0) * C;
        const wpair x = load_wpair(w, 2 * pfull, false);
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
 * rows in k-blocks of up to HR_Q4_KP_STREAM pairs, the later ones take HR_Q4_KP. */
#define HR_Q4_KP_STREAM   128          /* pairs: k <= 8192 in one k-block (8 x 128 x 128 bytes) */
#define HR_Q4_ROWS        64           /* rows per chunk at most */
#define HR_Q4_CHUNK_BYTES (192 * 1024) /* weight bytes per chunk at most (then at least one row) */

float HR_QFN(dot_q4_0)(int64_t k, const void *w, const void *a) { return tile_1x1(k / HR_QK4_0, w, a); }

/* Decode: nr rows x 1 token, row after row (one sequential stream; see below). The activation pairs
 * are prepared once into a stack table and shared by all nr rows, which halves the per-block work
 * of the lone-row loop; the values are the ones load_apair gives, so the bits do not change. Rows
 * longer than the table fall back to preparing on the fly. The weights, which come from DRAM, are
 * prefetched HR_Q4_PF bytes ahead of the loads (past a row's end into the next row: a share's rows
 * are contiguous); 2 threads, 32768 x 2048, alternating runs on a shared 2-core EPYC: 1.2-1.35x
 * the rate without (D = 2048-8192 alike, 512 no gain); rows already in L2 lose 3-5%. */
#define HR_Q4_PREP_PAIRS 256  /* 32 KiB of stack: k <= 16384 */
#define HR_Q4_PF         4096 /* prefetch distance, bytes */
static void rows_1tok(int64_t nb, const char *w, size_t ws, int nr, const char *a, float *y) {
    const int64_t np = nb / 2;
    if (np + 1 > HR_Q4_PREP_PAIRS) {
        for (int r = 0; r < nr; r++) y[r] = tile_1x1(nb, w + (size_t)r * ws, a);
        return;
    }
    apair prep[HR_Q4_PREP_PAIRS];
    for (int64_t p = 0; p < np; p++) prep[p] = load_apair(a, 2 * p, true);
    if (nb & 1) prep[np] = load_apair(a, nb - 1, false);
    for (int r = 0; r < nr; r++) {
        const char *row = w + (size_t)r * ws;
        __m256 c = _mm256_setzero_ps();
        for (int64_t p = 0; p < np; p++) {
            _mm_prefetch(row + (size_t)p * 2 * sizeof(hr_block_q4_0) + HR_Q4_PF, _MM_HINT_T0); /* 36 bytes a pair */
            const wpair x = load_wpair(row, 2 * p, true);
            c = step(c, &x, &prep[p]);
        }
        if (nb & 1) {
            const wpair x = load_wpair(row, nb - 1, false);
            c = step(c, &x, &prep[np]);
        }
        y[r] = hsum8(c);
    }
}

/* The driver's parts (kernels_tile.h): the step unit is a block pair. */
#define Q4_PAIRS(k) (((k) / HR_QK4_0 + 1) / 2)
static inline __attribute__((always_inline)) apair pack_q4(const char *a, int64_t p, int64_t k) {
    return load_apair(a, 2 * p, 2 * p + 1 < k / HR_QK4_0);
}
static inline __attribute__((always_inline)) void row_q4(const int C, int64_t p0, int64_t p1, int64_t k, const char *w,
                                                         const apair *ap, __m256 *acc, bool first, bool last, float *y,
                                                         size_t ys) {
    tile_row(C, p0, p1, k / HR_QK4_0, w, ap, acc, first, last, y, ys);
}
static void one_token_q4(int64_t k, const char *w, size_t ws, int nr, const char *a, float *y) {
    rows_1tok(k / HR_QK4_0, w, ws, nr, a, y);
}

/* A lone token (decode) goes row after row (rows_1tok): its weights come from DRAM, and one
 * sequential stream per thread is prefetched better than four interleaved row streams (2 threads,
 * 32768 x 2048: 1.2-1.7x the 4 x 1 rate that a 4 rows x 1 token tile got). A batch goes through the
 * shared 1 x 8 driver. */
HR_TILE_DRIVER(HR_QFN(tile_q4_0), apair, __m256, 1, Q4_PAIRS, HR_Q4_KP, HR_Q4_KP_STREAM, HR_Q4_ROWS, HR_Q4_CHUNK_BYTES,
               pack_q4, row_q4, one_token_q4)

#endif

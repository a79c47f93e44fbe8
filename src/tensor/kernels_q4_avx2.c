/* kernels_q4_avx2.c: AVX2 dot and tiles of q4_0 weights against q8_0 activations.
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
 * An odd last block is a pair whose second half is zero (bytes, activations and scales). */
#include <immintrin.h>
#include <string.h>

#include "tensor/kernels_internal.h"

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* [f16 at p x4, f16 at p + stride x4] as floats (or zeros above when !two). The 32-bit loads also
 * take two bytes after each scale; those lanes are dropped by the permute. */
static inline __m256 scale_pair(const char *p, size_t stride, const bool two) {
    int32_t v0, v1 = 0;
    memcpy(&v0, p, 4);
    if (two) memcpy(&v1, p + stride, 4);
    const __m128 f = _mm_cvtph_ps(_mm_setr_epi32(v0 & 0xFFFF, v1 & 0xFFFF, 0, 0));
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(f), _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2));
}

typedef struct apair {
    __m256i lo, hi; /* elements 0..15 and 16..31 of both blocks */
    __m256i y8;     /* 8 * the sum of each lane's 8 activations */
    __m256 d;
} apair;

typedef struct wpair {
    __m256i lo, hi; /* unsigned nibbles, same layout */
    __m256 d;
} wpair;

static inline __attribute__((always_inline)) apair load_apair(const char *a, int64_t ib, const bool two) {
    const hr_block_q8_0 *b = (const hr_block_q8_0 *)a + ib;
    const __m256i y0 = _mm256_loadu_si256((const __m256i *)b[0].qs);
    const __m256i y1 = two ? _mm256_loadu_si256((const __m256i *)b[1].qs) : _mm256_setzero_si256();
    apair y;
    y.lo = _mm256_permute2x128_si256(y0, y1, 0x20);
    y.hi = _mm256_permute2x128_si256(y0, y1, 0x31);
    const __m256i ones8 = _mm256_set1_epi8(1);
    const __m256i sum16 = _mm256_add_epi16(_mm256_maddubs_epi16(ones8, y.lo), _mm256_maddubs_epi16(ones8, y.hi));
    y.y8 = _mm256_slli_epi32(_mm256_madd_epi16(sum16, _mm256_set1_epi16(1)), 3);
    y.d = scale_pair((const char *)b, sizeof(hr_block_q8_0), two);
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
    x.d = scale_pair((const char *)b, sizeof(hr_block_q4_0), two);
    return x;
}

static inline __attribute__((always_inline)) __m256 step(__m256 acc, const wpair *x, const apair *y) {
    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(x->lo, y->lo), _mm256_maddubs_epi16(x->hi, y->hi));
    const __m256i s = _mm256_sub_epi32(_mm256_madd_epi16(p, _mm256_set1_epi16(1)), y->y8);
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

/* 4 rows x 1 token (decode): four chains, the activation pair prepared once for the four. */
static void tile_4x1(int64_t nb, const char *w, size_t ws, const char *a, float *y) {
    const char *w0 = w, *w1 = w + ws, *w2 = w + 2 * ws, *w3 = w + 3 * ws;
    __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps(), c2 = _mm256_setzero_ps(), c3 = _mm256_setzero_ps();
    HR_PAIRS({
        const apair v = load_apair(a, ib, two);
        wpair x = load_wpair(w0, ib, two);
        c0 = step(c0, &x, &v);
        x = load_wpair(w1, ib, two);
        c1 = step(c1, &x, &v);
        x = load_wpair(w2, ib, two);
        c2 = step(c2, &x, &v);
        x = load_wpair(w3, ib, two);
        c3 = step(c3, &x, &v);
    });
    y[0] = hsum8(c0);
    y[1] = hsum8(c1);
    y[2] = hsum8(c2);
    y[3] = hsum8(c3);
}

/* 1 row x 4 tokens */
static void tile_1x4(int64_t nb, const char *w, const char *a, size_t as, float *y, size_t ys) {
    __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps(), c2 = _mm256_setzero_ps(), c3 = _mm256_setzero_ps();
    HR_PAIRS({
        const wpair x = load_wpair(w, ib, two);
        apair v = load_apair(a, ib, two);
        c0 = step(c0, &x, &v);
        v = load_apair(a + as, ib, two);
        c1 = step(c1, &x, &v);
        v = load_apair(a + 2 * as, ib, two);
        c2 = step(c2, &x, &v);
        v = load_apair(a + 3 * as, ib, two);
        c3 = step(c3, &x, &v);
    });
    y[0] = hsum8(c0);
    y[ys] = hsum8(c1);
    y[2 * ys] = hsum8(c2);
    y[3 * ys] = hsum8(c3);
}

/* 2 rows x 4 tokens (the batch tile): 8 chains; weights unpacked once for 4 tokens, each activation
 * pair prepared once for 2 rows. */
static void tile_2x4(int64_t nb, const char *w, size_t ws, const char *a, size_t as, float *y, size_t ys) {
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c02 = _mm256_setzero_ps(), c03 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps(), c12 = _mm256_setzero_ps(), c13 = _mm256_setzero_ps();
    HR_PAIRS({
        const wpair x0 = load_wpair(w, ib, two), x1 = load_wpair(w + ws, ib, two);
        apair v = load_apair(a, ib, two);
        c00 = step(c00, &x0, &v);
        c10 = step(c10, &x1, &v);
        v = load_apair(a + as, ib, two);
        c01 = step(c01, &x0, &v);
        c11 = step(c11, &x1, &v);
        v = load_apair(a + 2 * as, ib, two);
        c02 = step(c02, &x0, &v);
        c12 = step(c12, &x1, &v);
        v = load_apair(a + 3 * as, ib, two);
        c03 = step(c03, &x0, &v);
        c13 = step(c13, &x1, &v);
    });
    y[0] = hsum8(c00);
    y[1] = hsum8(c10);
    y[ys] = hsum8(c01);
    y[ys + 1] = hsum8(c11);
    y[2 * ys] = hsum8(c02);
    y[2 * ys + 1] = hsum8(c12);
    y[3 * ys] = hsum8(c03);
    y[3 * ys + 1] = hsum8(c13);
}

/* R rows x C tokens (the batch tile), R * C chains: each weight pair unpacked once for C tokens; the
 * activation pairs come from a table prepared once per tile call for all rows (ap: token t's pair p at
 * ap[t * npp + p], the values load_apair gives), so the step per (row, token) pair is the one above
 * and every element has the bits of tile_1x1. R and C are constants at every call. */
#ifndef HR_Q4_TR
#define HR_Q4_TR 4 /* rows of the batch tile */
#endif
#ifndef HR_Q4_TC
#define HR_Q4_TC 4 /* tokens of the batch tile */
#endif
static inline __attribute__((always_inline)) void tile_rxc(const int R, const int C, int64_t nb, const char *w,
                                                           size_t ws, const apair *ap, int64_t npp, float *y,
                                                           size_t ys) {
    __m256 c[HR_Q4_TR][HR_Q4_TC];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < C; t++) c[r][t] = _mm256_setzero_ps();
    HR_PAIRS({
        const int64_t p = ib / 2;
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {
            const wpair x = load_wpair(w + (size_t)r * ws, ib, two);
            _Pragma("GCC unroll 8") for (int t = 0; t < C; t++) c[r][t] = step(c[r][t], &x, &ap[t * npp + p]);
        }
    });
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < C; t++) y[(size_t)t * ys + r] = hsum8(c[r][t]);
}

/* The activation pairs of C tokens (stride as), token after token, npp = ceil(nb / 2) each. */
static void prep_apairs(int64_t nb, const char *a, size_t as, int C, apair *out) {
    const int64_t npp = (nb + 1) / 2;
    for (int t = 0; t < C; t++) {
        const char *at = a + (size_t)t * as;
        for (int64_t p = 0; p < nb / 2; p++) out[t * npp + p] = load_apair(at, 2 * p, true);
        if (nb & 1) out[t * npp + nb / 2] = load_apair(at, nb - 1, false);
    }
}

/* Batch tiles over all nr rows and ngroups groups of HR_Q4_TC tokens (the caller runs the rest). */
#define HR_Q4_TILE_PAIRS 256 /* k <= 16384 */
static _Thread_local apair t_ap[HR_Q4_TC * HR_Q4_TILE_PAIRS];
static void rows_tiles(int64_t nb, const char *w, size_t ws, int nr, const char *a, size_t as, int ngroups, float *y,
                       size_t ys) {
    const int64_t npp = (nb + 1) / 2;
    for (int g = 0; g < ngroups; g++) {
        float *yt = y + (size_t)g * HR_Q4_TC * ys;
        prep_apairs(nb, a + (size_t)g * HR_Q4_TC * as, as, HR_Q4_TC, t_ap);
        int r = 0;
        for (; r + HR_Q4_TR <= nr; r += HR_Q4_TR)
            tile_rxc(HR_Q4_TR, HR_Q4_TC, nb, w + (size_t)r * ws, ws, t_ap, npp, yt + r, ys);
        for (; r < nr; r++) tile_rxc(1, HR_Q4_TC, nb, w + (size_t)r * ws, ws, t_ap, npp, yt + r, ys);
    }
}

float hr_avx2_dot_q4_0(int64_t k, const void *w, const void *a) { return tile_1x1(k / HR_QK4_0, w, a); }

/* Decode: nr rows x 1 token, row after row (one sequential stream; see below). The activation pairs
 * are prepared once into a stack table and shared by all nr rows, which halves the per-block work
 * of the lone-row loop; the values are the ones load_apair gives, so the bits do not change. Rows
 * longer than the table fall back to preparing on the fly. */
#define HR_Q4_PREP_PAIRS 256 /* 32 KiB of stack: k <= 16384 */
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

/* A lone token (decode) goes row after row (rows_1tok): its weights come from DRAM, and one
 * sequential stream per thread is prefetched better than four interleaved row streams (2 threads,
 * 32768 x 2048: 1.2-1.7x the 4 x 1 rate). A batch runs 2 x 4 tiles, then the odd row, and its
 * leftover tokens in 4 x 1 and 1 x 1 (its rows are in cache by then, where 4 x 1 is faster). */
void hr_avx2_tile_q4_0(int64_t k, const void *w, size_t ws, int nr, const void *a, size_t as, int nt, float *y,
                       size_t ys) {
    const int64_t nb = k / HR_QK4_0;
    const char *W = w, *A = a;
    if (nt == 1) {
        rows_1tok(nb, W, ws, nr, A, y);
        return;
    }
    int t = 0;
    if ((nb + 1) / 2 <= HR_Q4_TILE_PAIRS && nt >= HR_Q4_TC) {
        rows_tiles(nb, W, ws, nr, A, as, nt / HR_Q4_TC, y, ys);
        t = nt / HR_Q4_TC * HR_Q4_TC;
    }
    for (; t + 4 <= nt; t += 4) {
        const char *at = A + (size_t)t * as;
        float *yt = y + (size_t)t * ys;
        int r = 0;
        for (; r + 2 <= nr; r += 2) tile_2x4(nb, W + (size_t)r * ws, ws, at, as, yt + r, ys);
        for (; r < nr; r++) tile_1x4(nb, W + (size_t)r * ws, at, as, yt + r, ys);
    }
    for (; t < nt; t++) {
        const char *at = A + (size_t)t * as;
        float *yt = y + (size_t)t * ys;
        int r = 0;
        for (; r + 4 <= nr; r += 4) tile_4x1(nb, W + (size_t)r * ws, ws, at, yt + r);
        for (; r < nr; r++) yt[r] = tile_1x1(nb, W + (size_t)r * ws, at);
    }
}

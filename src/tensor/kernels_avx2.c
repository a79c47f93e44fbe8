/* kernels_avx2.c: AVX2 + FMA + F16C kernels for q8_0 weights (against q8_0 activations) and the
 * q8_0 activation quantizer (q4_0: kernels_q4_avx2.c; float weights: kernels_float_avx2.c).
 *
 * Reduction order (what makes results batch-invariant): each dot keeps one 8-lane f32 accumulator
 * per (weight row, activation row) pair, adds block pairs in increasing order, and finishes with
 * hsum8(). The tiles below do exactly this per pair; they only share the loads between pairs. */
#include <immintrin.h>
#include <math.h>

#include "tensor/kernels_internal.h"

/* Horizontal sum of 8 floats in a fixed order: (lo128 + hi128), then pairs. */
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- q8_0 activation quantizer: same formula as the reference (d = amax/127, q = round(x/d),
 * half away from zero), so it produces the same bytes ---- */

void hr_avx2_quantize_q8_0(const float *x, void *dst, int64_t k) {
    hr_block_q8_0 *y = dst;
    const __m256 sign_mask = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < k / HR_QK8_0; i++) {
        const float *xb = x + i * HR_QK8_0;
        __m256 v[4];
        __m256 amax = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(xb + 8 * j);
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_mask, v[j]));
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float d = _mm_cvtss_f32(m) / 127.0f;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = hr_f32_to_f16(d);
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int j = 0; j < 4; j++) {
            /* roundf (ties away from zero): round to nearest even, then move the ties that went
             * toward zero; s - r is exact here, so a tie shows as exactly +-0.5 */
            const __m256 s = _mm256_mul_ps(v[j], vid);
            __m256 r = _mm256_round_ps(s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __m256 diff = _mm256_sub_ps(s, r);
            const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
            const __m256 up = _mm256_and_ps(_mm256_cmp_ps(diff, _mm256_set1_ps(0.5f), _CMP_EQ_OQ),
                                            _mm256_cmp_ps(s, zero, _CMP_GT_OQ));
            const __m256 dn = _mm256_and_ps(_mm256_cmp_ps(diff, _mm256_set1_ps(-0.5f), _CMP_EQ_OQ),
                                            _mm256_cmp_ps(s, zero, _CMP_LT_OQ));
            r = _mm256_sub_ps(_mm256_add_ps(r, _mm256_and_ps(up, one)), _mm256_and_ps(dn, one));
            q[j] = _mm256_cvtps_epi32(r);
        }
        /* pack 32 int32 -> 32 int8 in order (packs work per 128-bit lane, so fix the order) */
        __m256i p01 = _mm256_packs_epi32(q[0], q[1]);
        __m256i p23 = _mm256_packs_epi32(q[2], q[3]);
        __m256i p = _mm256_packs_epi16(p01, p23);
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)y[i].qs, p);
    }
}

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

/* The pair at block ib (< nb) of a row of nb blocks. */
static inline __attribute__((always_inline)) ablk load_ablk(const char *a, int64_t ib, int64_t nb) {
    const hr_block_q8_0 *b = (const hr_block_q8_0 *)a + ib;
    const bool two = ib + 1 < nb;
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

static inline __attribute__((always_inline)) wblk wblk_bytes(const hr_block_q8_0 *b, const bool two) {
    wblk x;
    pair_bytes(b, two, &x.lo, &x.hi);
    x.alo = _mm256_sign_epi8(x.lo, x.lo);
    x.ahi = _mm256_sign_epi8(x.hi, x.hi);
    return x;
}

static inline __attribute__((always_inline)) wblk load_wblk(const char *row, int64_t ib, int64_t nb) {
    const hr_block_q8_0 *b = (const hr_block_q8_0 *)row + ib;
    const bool two = ib + 1 < nb;
    wblk x = wblk_bytes(b, two);
    x.d = dpair(b, two);
    return x;
}

/* The per-pair step every shape runs, block pair after block pair. */
static inline __attribute__((always_inline)) __m256 step(__m256 acc, const wblk *x, const ablk *y) {
    const __m256i one = _mm256_set1_epi16(1);
    const __m256i s =
        _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(x->alo, _mm256_sign_epi8(y->lo, x->lo)), one),
                         _mm256_madd_epi16(_mm256_maddubs_epi16(x->ahi, _mm256_sign_epi8(y->hi, x->hi)), one));
    return _mm256_fmadd_ps(_mm256_mul_ps(x->d, y->d), _mm256_cvtepi32_ps(s), acc);
}

/* The shapes are written out so every compiler keeps the accumulators in registers. */

static inline __attribute__((always_inline)) float tile_1x1(int64_t nb, const char *w, const char *a) {
    __m256 c = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib += 2) {
        const ablk y = load_ablk(a, ib, nb);
        const wblk x = load_wblk(w, ib, nb);
        c = step(c, &x, &y);
    }
    return hsum8(c);
}

/* 4 rows x 1 token (decode): four independent chains, the activation block loaded once. */
static inline __attribute__((always_inline)) void tile_4x1(int64_t nb, const char *w, size_t ws, const char *a,
                                                           float *y) {
    const char *w0 = w, *w1 = w + ws, *w2 = w + 2 * ws, *w3 = w + 3 * ws;
    __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps(), c2 = _mm256_setzero_ps(), c3 = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib += 2) {
        const ablk v = load_ablk(a, ib, nb);
        wblk x = load_wblk(w0, ib, nb);
        c0 = step(c0, &x, &v);
        x = load_wblk(w1, ib, nb);
        c1 = step(c1, &x, &v);
        x = load_wblk(w2, ib, nb);
        c2 = step(c2, &x, &v);
        x = load_wblk(w3, ib, nb);
        c3 = step(c3, &x, &v);
    }
    y[0] = hsum8(c0);
    y[1] = hsum8(c1);
    y[2] = hsum8(c2);
    y[3] = hsum8(c3);
}

/* 1 row x 4 tokens */
static inline __attribute__((always_inline)) void tile_1x4(int64_t nb, const char *w, const char *a, size_t as,
                                                           float *y, size_t ys) {
    const char *a0 = a, *a1 = a + as, *a2 = a + 2 * as, *a3 = a + 3 * as;
    __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps(), c2 = _mm256_setzero_ps(), c3 = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib += 2) {
        const wblk x = load_wblk(w, ib, nb);
        ablk v = load_ablk(a0, ib, nb);
        c0 = step(c0, &x, &v);
        v = load_ablk(a1, ib, nb);
        c1 = step(c1, &x, &v);
        v = load_ablk(a2, ib, nb);
        c2 = step(c2, &x, &v);
        v = load_ablk(a3, ib, nb);
        c3 = step(c3, &x, &v);
    }
    y[0] = hsum8(c0);
    y[ys] = hsum8(c1);
    y[2 * ys] = hsum8(c2);
    y[3 * ys] = hsum8(c3);
}

/* 2 rows x 4 tokens (the batch tile): 8 chains; each weight block unpacked once for 4 tokens, each
 * activation block loaded once for 2 rows. */
static inline __attribute__((always_inline)) void tile_2x4(int64_t nb, const char *w, size_t ws, const char *a,
                                                           size_t as, float *y, size_t ys) {
    const char *a0 = a, *a1 = a + as, *a2 = a + 2 * as, *a3 = a + 3 * as;
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c02 = _mm256_setzero_ps(), c03 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps(), c12 = _mm256_setzero_ps(), c13 = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < nb; ib += 2) {
        const wblk x0 = load_wblk(w, ib, nb), x1 = load_wblk(w + ws, ib, nb);
        ablk v = load_ablk(a0, ib, nb);
        c00 = step(c00, &x0, &v);
        c10 = step(c10, &x1, &v);
        v = load_ablk(a1, ib, nb);
        c01 = step(c01, &x0, &v);
        c11 = step(c11, &x1, &v);
        v = load_ablk(a2, ib, nb);
        c02 = step(c02, &x0, &v);
        c12 = step(c12, &x1, &v);
        v = load_ablk(a3, ib, nb);
        c03 = step(c03, &x0, &v);
        c13 = step(c13, &x1, &v);
    }
    y[0] = hsum8(c00);
    y[1] = hsum8(c10);
    y[ys] = hsum8(c01);
    y[ys + 1] = hsum8(c11);
    y[2 * ys] = hsum8(c02);
    y[2 * ys + 1] = hsum8(c12);
    y[3 * ys] = hsum8(c03);
    y[3 * ys + 1] = hsum8(c13);
}

/* The batch tile: one weight row x HR_Q8_TC tokens, over the block pairs [p0, p1) of a k-block.
 * The tokens' block pairs are packed beforehand (ap: pair p's tokens at ap[(p - p0) * HR_Q8_TC + t],
 * the values load_ablk makes), so the loop reads them from L1 as memory operands; the weight pair is
 * loaded and made absolute once for all the tokens. The HR_Q8_TC accumulators start at zero
 * (first) or from acc, and end in y (last: hsum8) or back in acc, so splitting k into blocks keeps
 * the one sequence of operations per element: every element has the bits of tile_1x1. With AVX2's
 * 16 registers: 8 accumulators, the weight pair (4) and the step's temporaries; a 4 x 4 tile
 * spilled its accumulators to the stack, and a 2 x 4 one did the weight work twice as often. */
#define HR_Q8_TC 8  /* tokens of the batch tile */
#define HR_Q8_KP 16 /* block pairs per k-block: the packed tokens (16 x 8 x 96 bytes) stay in L1 */
static inline __attribute__((always_inline)) void tile_row(int64_t p0, int64_t p1, int64_t nb, const char *w,
                                                           const ablk *ap, __m256 *acc, bool first, bool last, float *y,
                                                           size_t ys) {
    __m256 c[HR_Q8_TC];
#pragma GCC unroll 8
    for (int t = 0; t < HR_Q8_TC; t++) c[t] = first ? _mm256_setzero_ps() : acc[t];
    const int64_t pfull = p1 * 2 <= nb ? p1 : p1 - 1; /* pairs with two blocks */
    for (int64_t p = p0; p < pfull; p++) {
        /* hide from the compiler that the pairs' loads are of the same table, so it does not keep
         * them live across iterations */
        const ablk *v = ap + (p - p0) * HR_Q8_TC;
        __asm__("" : "+r"(v));
        const wblk x = load_wblk(w, 2 * p, nb);
#pragma GCC unroll 8
        for (int t = 0; t < HR_Q8_TC; t++) c[t] = step(c[t], &x, v + t);
    }
    if (pfull < p1) { /* the lone last block */
        const ablk *v = ap + (pfull - p0) * HR_Q8_TC;
        const wblk x = load_wblk(w, 2 * pfull, nb);
#pragma GCC unroll 8
        for (int t = 0; t < HR_Q8_TC; t++) c[t] = step(c[t], &x, v + t);
    }
    if (last) {
#pragma GCC unroll 8
        for (int t = 0; t < HR_Q8_TC; t++) y[(size_t)t * ys] = hsum8(c[t]);
    } else {
#pragma GCC unroll 8
        for (int t = 0; t < HR_Q8_TC; t++) acc[t] = c[t];
    }
}

/* Batch tiles over nr <= HR_Q8_ROWS rows and ngroups groups of HR_Q8_TC tokens (the caller runs the
 * rest): for each group and k-block, the group's pairs are packed once for all rows, then each row
 * runs them, its accumulators kept between k-blocks in t_acc. */
#define HR_Q8_ROWS 64
static _Thread_local ablk t_ap[HR_Q8_KP * HR_Q8_TC];
static _Thread_local __m256 t_acc[HR_Q8_ROWS * HR_Q8_TC];
static void rows_tiles(int64_t nb, const char *w, size_t ws, int nr, const char *a, size_t as, int ngroups, float *y,
                       size_t ys) {
    const int64_t npair = (nb + 1) / 2;
    for (int r0 = 0; r0 < nr; r0 += HR_Q8_ROWS) {
        const int n = nr - r0 < HR_Q8_ROWS ? nr - r0 : HR_Q8_ROWS;
        const char *wr = w + (size_t)r0 * ws;
        for (int g = 0; g < ngroups; g++) {
            const char *at = a + (size_t)g * HR_Q8_TC * as;
            float *yt = y + (size_t)g * HR_Q8_TC * ys + r0;
            for (int64_t p0 = 0; p0 < npair; p0 += HR_Q8_KP) {
                const int64_t p1 = p0 + HR_Q8_KP < npair ? p0 + HR_Q8_KP : npair;
                for (int64_t p = p0; p < p1; p++)
                    for (int t = 0; t < HR_Q8_TC; t++)
                        t_ap[(p - p0) * HR_Q8_TC + t] = load_ablk(at + (size_t)t * as, 2 * p, nb);
                for (int r = 0; r < n; r++)
                    tile_row(p0, p1, nb, wr + (size_t)r * ws, t_ap, t_acc + r * HR_Q8_TC, p0 == 0, p1 == npair, yt + r,
                             ys);
            }
        }
    }
}

float hr_avx2_dot_q8_0(int64_t k, const void *w, const void *a) { return tile_1x1(k / HR_QK8_0, w, a); }

/* Decode: nr rows x 1 token, row after row, the activation blocks (bytes and broadcast scale)
 * prepared once into a stack table for all nr rows (same values as load_ablk, so the same bits).
 * Rows longer than the table fall back to tile_1x1. */
#define HR_Q8_PREP_BLOCKS 512 /* 256 pairs, 24 KiB of stack: k <= 16384 */
static void rows_1tok(int64_t nb, const char *w, size_t ws, int nr, const char *a, float *y) {
    if (nb > HR_Q8_PREP_BLOCKS) {
        for (int r = 0; r < nr; r++) y[r] = tile_1x1(nb, w + (size_t)r * ws, a);
        return;
    }
    ablk prep[HR_Q8_PREP_BLOCKS / 2];
    for (int64_t ib = 0; ib < nb; ib += 2) prep[ib / 2] = load_ablk(a, ib, nb);
    for (int r = 0; r < nr; r++) {
        const char *row = w + (size_t)r * ws;
        __m256 c = _mm256_setzero_ps();
        for (int64_t ib = 0; ib < nb; ib += 2) {
            const wblk x = load_wblk(row, ib, nb);
            c = step(c, &x, &prep[ib / 2]);
        }
        y[r] = hsum8(c);
    }
}

/* A lone token (decode) goes row after row (rows_1tok): its weights come from DRAM, and one
 * sequential stream per thread is prefetched better than four interleaved row streams (2 threads,
 * 32768 x 2048: 1.2-1.5x the 4 x 1 rate). A batch runs 2 x 4 tiles, then the odd row, and its
 * leftover tokens in 4 x 1 and 1 x 1 (its rows are in cache by then, where 4 x 1 is faster). */
void hr_avx2_tile_q8_0(int64_t k, const void *wv, size_t ws, int nr, const void *av, size_t as, int nt, float *y,
                       size_t ys) {
    const char *w = wv, *a = av;
    const int64_t nb = k / HR_QK8_0;
    if (nt == 1) {
        rows_1tok(nb, w, ws, nr, a, y);
        return;
    }
    int t = 0;
    if (nt >= HR_Q8_TC) {
        rows_tiles(nb, w, ws, nr, a, as, nt / HR_Q8_TC, y, ys);
        t = nt / HR_Q8_TC * HR_Q8_TC;
    }
    for (; t + 4 <= nt; t += 4) {
        const char *at = a + (size_t)t * as;
        float *yt = y + (size_t)t * ys;
        int r = 0;
        for (; r + 2 <= nr; r += 2) tile_2x4(nb, w + (size_t)r * ws, ws, at, as, yt + r, ys);
        for (; r < nr; r++) tile_1x4(nb, w + (size_t)r * ws, at, as, yt + r, ys);
    }
    for (; t < nt; t++) {
        const char *at = a + (size_t)t * as;
        float *yt = y + (size_t)t * ys;
        int r = 0;
        for (; r + 4 <= nr; r += 4) tile_4x1(nb, w + (size_t)r * ws, ws, at, yt + r);
        for (; r < nr; r++) yt[r] = tile_1x1(nb, w + (size_t)r * ws, at);
    }
}

/* kernels_float_avx2.c: AVX2 + FMA + F16C dots of f32 and bf16 weights against f32 activations and of
 * f16 weights against f16 activations (ggml's vec_dot_type for f16), and their register-blocked tiles.
 *
 * Reduction order (the batch-invariance contract): each (weight row, activation row) pair owns one
 * 8-lane accumulator; element groups [8i, 8i + 8) are added in increasing i with one FMA each; then
 * hsum8(); then the k % 8 tail elements in order with scalar fmaf. A tile of R rows x T tokens runs
 * exactly this per pair while sharing each weight load (and its f16/bf16 conversion) across T tokens
 * and each activation load across R rows. One chain per pair is latency-bound for a lone dot, but
 * decode uses 4-row tiles (4 chains) and batches use 3 x 4 tiles (12 chains). A batch walks rows
 * outside tokens in passes of 16 tokens, prefetching the next rows while a tile works, and runs the
 * 2 or 3 tokens left over after the groups of 4 together (tile_rxt). None of this changes a pair's
 * sequence, so every shape gives the lone dot's bits. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "backend/cpu/kernels_internal.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/simd_avx2.h"

enum { W_F32, W_F16, W_BF16 };
/* the activation element type that goes with a weight kind: f16 with f16, else f32 */
#define AK(kind) ((kind) == W_F16 ? W_F16 : W_F32)

static inline __m256 load8(const char *row, int64_t j, const int kind) {
    if (kind == W_F32) return _mm256_loadu_ps((const float *)row + j);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + j));
    if (kind == W_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline float load1(const char *row, int64_t j, const int kind) {
    if (kind == W_F32) return ((const float *)row)[j];
    if (kind == W_F16) return _cvtsh_ss(((const uint16_t *)row)[j]);
    return hr_bf16_to_f32(((const uint16_t *)row)[j]);
}

/* A hint for a line of the rows after the tile's (past the matrix for the last tile: a prefetch never
 * faults, and the address is an integer so no pointer leaves its object). Into L2 (T1), not L1: at
 * k = 10944 three rows are 64 KB, and pulling them into L1 evicted the rows in use (bench_kernels
 * f16 2048 x 10944, T = 129: T0 88-97 GF/s, T1 99-102, the old driver 70-102; 2048 x 1408 from memory,
 * T = 12: T0 86-88, T1 101-103, the old driver 64-70). Always inlined: gcc 12 deleted the calls of a plain
 * static inline version as if they had no effect. */
static inline __attribute__((always_inline)) void prefetch(uintptr_t at) {
    _mm_prefetch((const char *)at, _MM_HINT_T1);
}

/* One pair's finish: the fixed horizontal sum, then the tail elements in order. */
static inline float finish(__m256 acc, const char *wrow, const char *arow, int64_t i, int64_t k, const int kind) {
    float sum = hsum8(acc);
    for (int64_t j = i; j < k; j++) sum = fmaf(load1(wrow, j, kind), load1(arow, j, AK(kind)), sum);
    return sum;
}

/* The shapes are written out (not loops over R and T) so that every compiler keeps the
 * accumulators in registers. Each pair's sequence is the same in all of them. */

static inline __attribute__((always_inline)) void tile_1x1(int64_t k, const char *w, const char *a, float *y,
                                                           const int kind) {
    __m256 c = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) c = _mm256_fmadd_ps(load8(w, i, kind), load8(a, i, AK(kind)), c);
    *y = finish(c, w, a, i, k, kind);
}

/* 4 rows x 1 token (decode) */
static inline __attribute__((always_inline)) void tile_4x1(int64_t k, const char *w, size_t ws, const char *a, float *y,
                                                           const int kind) {
    const char *w0 = w, *w1 = w + ws, *w2 = w + 2 * ws, *w3 = w + 3 * ws;
    __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps(), c2 = _mm256_setzero_ps(), c3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        const __m256 v = load8(a, i, AK(kind));
        c0 = _mm256_fmadd_ps(load8(w0, i, kind), v, c0);
        c1 = _mm256_fmadd_ps(load8(w1, i, kind), v, c1);
        c2 = _mm256_fmadd_ps(load8(w2, i, kind), v, c2);
        c3 = _mm256_fmadd_ps(load8(w3, i, kind), v, c3);
    }
    y[0] = finish(c0, w0, a, i, k, kind);
    y[1] = finish(c1, w1, a, i, k, kind);
    y[2] = finish(c2, w2, a, i, k, kind);
    y[3] = finish(c3, w3, a, i, k, kind);
}

/* 1 row x 4 tokens (the odd row of a batch) */
static inline __attribute__((always_inline)) void tile_1x4(int64_t k, const char *w, const char *a, size_t as, float *y,
                                                           size_t ys, const int kind) {
    const char *a0 = a, *a1 = a + as, *a2 = a + 2 * as, *a3 = a + 3 * as;
    __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps(), c2 = _mm256_setzero_ps(), c3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        const __m256 x = load8(w, i, kind);
        c0 = _mm256_fmadd_ps(x, load8(a0, i, AK(kind)), c0);
        c1 = _mm256_fmadd_ps(x, load8(a1, i, AK(kind)), c1);
        c2 = _mm256_fmadd_ps(x, load8(a2, i, AK(kind)), c2);
        c3 = _mm256_fmadd_ps(x, load8(a3, i, AK(kind)), c3);
    }
    y[0] = finish(c0, w, a0, i, k, kind);
    y[ys] = finish(c1, w, a1, i, k, kind);
    y[2 * ys] = finish(c2, w, a2, i, k, kind);
    y[3 * ys] = finish(c3, w, a3, i, k, kind);
}

/* 2 rows x 4 tokens (the batch tile): 8 chains, 6 loads per 8 FMAs */
static inline __attribute__((always_inline)) void tile_2x4(int64_t k, const char *w, size_t ws, const char *a,
                                                           size_t as, float *y, size_t ys, const int kind) {
    const char *w0 = w, *w1 = w + ws;
    const char *a0 = a, *a1 = a + as, *a2 = a + 2 * as, *a3 = a + 3 * as;
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c02 = _mm256_setzero_ps(), c03 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps(), c12 = _mm256_setzero_ps(), c13 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        const __m256 x0 = load8(w0, i, kind), x1 = load8(w1, i, kind);
        __m256 v = load8(a0, i, AK(kind));
        c00 = _mm256_fmadd_ps(x0, v, c00);
        c10 = _mm256_fmadd_ps(x1, v, c10);
        v = load8(a1, i, AK(kind));
        c01 = _mm256_fmadd_ps(x0, v, c01);
        c11 = _mm256_fmadd_ps(x1, v, c11);
        v = load8(a2, i, AK(kind));
        c02 = _mm256_fmadd_ps(x0, v, c02);
        c12 = _mm256_fmadd_ps(x1, v, c12);
        v = load8(a3, i, AK(kind));
        c03 = _mm256_fmadd_ps(x0, v, c03);
        c13 = _mm256_fmadd_ps(x1, v, c13);
    }
    y[0] = finish(c00, w0, a0, i, k, kind);
    y[1] = finish(c10, w1, a0, i, k, kind);
    y[ys] = finish(c01, w0, a1, i, k, kind);
    y[ys + 1] = finish(c11, w1, a1, i, k, kind);
    y[2 * ys] = finish(c02, w0, a2, i, k, kind);
    y[2 * ys + 1] = finish(c12, w1, a2, i, k, kind);
    y[3 * ys] = finish(c03, w0, a3, i, k, kind);
    y[3 * ys + 1] = finish(c13, w1, a3, i, k, kind);
}

/* 3 rows x 4 tokens: 12 chains in 12 registers, the 3 weight vectors in 3 more, f32 activations taken
 * straight from memory by the FMAs: 7 loads per 12 FMAs (2 x 4: 6 per 8); f16 ones are converted. */
static inline __attribute__((always_inline)) void tile_3x4(int64_t k, const char *w, size_t ws, const char *a,
                                                           size_t as, float *y, size_t ys, const int kind,
                                                           const int pf) {
    const char *w0 = w, *w1 = w + ws, *w2 = w + 2 * ws;
    const char *a0 = a, *a1 = a + as, *a2 = a + 2 * as, *a3 = a + 3 * as;
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c02 = _mm256_setzero_ps(), c03 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps(), c12 = _mm256_setzero_ps(), c13 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(), c22 = _mm256_setzero_ps(), c23 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        if (pf) { /* the next 3 rows, one tile ahead: memory latency hidden behind this tile's work */
            const uintptr_t at = (uintptr_t)w + 3 * ws + (size_t)i * (kind == W_F32 ? 4 : 2);
            prefetch(at);
            prefetch(at + ws);
            prefetch(at + 2 * ws);
        }
        const __m256 x0 = load8(w0, i, kind), x1 = load8(w1, i, kind), x2 = load8(w2, i, kind);
        __m256 v = load8(a0, i, AK(kind));
        c00 = _mm256_fmadd_ps(x0, v, c00);
        c10 = _mm256_fmadd_ps(x1, v, c10);
        c20 = _mm256_fmadd_ps(x2, v, c20);
        v = load8(a1, i, AK(kind));
        c01 = _mm256_fmadd_ps(x0, v, c01);
        c11 = _mm256_fmadd_ps(x1, v, c11);
        c21 = _mm256_fmadd_ps(x2, v, c21);
        v = load8(a2, i, AK(kind));
        c02 = _mm256_fmadd_ps(x0, v, c02);
        c12 = _mm256_fmadd_ps(x1, v, c12);
        c22 = _mm256_fmadd_ps(x2, v, c22);
        v = load8(a3, i, AK(kind));
        c03 = _mm256_fmadd_ps(x0, v, c03);
        c13 = _mm256_fmadd_ps(x1, v, c13);
        c23 = _mm256_fmadd_ps(x2, v, c23);
    }
    y[0] = finish(c00, w0, a0, i, k, kind);
    y[1] = finish(c10, w1, a0, i, k, kind);
    y[2] = finish(c20, w2, a0, i, k, kind);
    y[ys] = finish(c01, w0, a1, i, k, kind);
    y[ys + 1] = finish(c11, w1, a1, i, k, kind);
    y[ys + 2] = finish(c21, w2, a1, i, k, kind);
    y[2 * ys] = finish(c02, w0, a2, i, k, kind);
    y[2 * ys + 1] = finish(c12, w1, a2, i, k, kind);
    y[2 * ys + 2] = finish(c22, w2, a2, i, k, kind);
    y[3 * ys] = finish(c03, w0, a3, i, k, kind);
    y[3 * ys + 1] = finish(c13, w1, a3, i, k, kind);
    y[3 * ys + 2] = finish(c23, w2, a3, i, k, kind);
}

/* full unrolling of the constant-bound loops below, which -O2 alone does not do */
#ifdef __clang__
#define UNROLL _Pragma("clang loop unroll(full)")
#else
#define UNROLL _Pragma("GCC unroll 4")
#endif

/* R rows x T tokens for the few tokens left over after the groups of 4 (T = 2 or 3): one pass over
 * the rows for them together instead of one 4 x 1 pass per token (each pass converts every weight
 * again). The loops have constant bounds once inlined, so the compilers unroll them and keep the
 * R * T accumulators in registers (R * T + R + 1 <= 16 ymm registers). Each pair's sequence is the
 * one above. */
static inline __attribute__((always_inline)) void tile_rxt(int64_t k, const char *w, size_t ws, const char *a,
                                                           size_t as, float *y, size_t ys, const int kind, const int R,
                                                           const int T) {
    __m256 c[4][3];
    UNROLL for (int r = 0; r < R; r++) { UNROLL for (int t = 0; t < T; t++) c[r][t] = _mm256_setzero_ps(); }
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256 x[4];
        UNROLL for (int r = 0; r < R; r++) { /* the next R rows, as in tile_3x4 */
            prefetch((uintptr_t)w + (size_t)(R + r) * ws + (size_t)i * (kind == W_F32 ? 4 : 2));
            x[r] = load8(w + (size_t)r * ws, i, kind);
        }
        UNROLL for (int t = 0; t < T; t++) {
            const __m256 v = load8(a + (size_t)t * as, i, AK(kind));
            UNROLL for (int r = 0; r < R; r++) c[r][t] = _mm256_fmadd_ps(x[r], v, c[r][t]);
        }
    }
    UNROLL for (int t = 0; t < T; t++) {
        UNROLL for (int r = 0; r < R; r++) {
            y[(size_t)t * ys + (size_t)r] = finish(c[r][t], w + (size_t)r * ws, a + (size_t)t * as, i, k, kind);
        }
    }
}

/* Tokens per weight pass in the tile driver: a row group (3 rows, 8.4 KB of f16 at k = 1408) is
 * loaded once (from memory on the first pass over a cache block, prefetched during the previous
 * group's first tile) and then serves up to 4 groups of 4 tokens from L1. Looping tokens outside
 * rows, as before, left the first group of 4 waiting on memory: an expert's down projection (2048 x
 * 1408, ~12 tokens) ran at 64-70 GF/s from memory against ~103 in cache; now 100-103 (bench_kernels,
 * 1 thread, CPU time, Zen 4). 16 activation rows stay in L2 beside matmul.c's weight block up to
 * k ~ 10k. */
#define HR_FLOAT_TB 16

static inline __attribute__((always_inline)) void tile_driver(int64_t k, const char *w, size_t ws, int nr,
                                                              const char *a, size_t as, int nt, float *y, size_t ys,
                                                              const int kind) {
    const int n4 = nt / 4 * 4;
    for (int t0 = 0; t0 < n4; t0 += HR_FLOAT_TB) {
        const int t1 = t0 + HR_FLOAT_TB < n4 ? t0 + HR_FLOAT_TB : n4;
        int r = 0;
        for (; r + 3 <= nr; r += 3) {
            tile_3x4(k, w + (size_t)r * ws, ws, a + (size_t)t0 * as, as, y + (size_t)t0 * ys + r, ys, kind, 1);
            for (int t = t0 + 4; t < t1; t += 4)
                tile_3x4(k, w + (size_t)r * ws, ws, a + (size_t)t * as, as, y + (size_t)t * ys + r, ys, kind, 0);
        }
        for (; r + 2 <= nr; r += 2)
            for (int t = t0; t < t1; t += 4)
                tile_2x4(k, w + (size_t)r * ws, ws, a + (size_t)t * as, as, y + (size_t)t * ys + r, ys, kind);
        for (; r < nr; r++)
            for (int t = t0; t < t1; t += 4)
                tile_1x4(k, w + (size_t)r * ws, a + (size_t)t * as, as, y + (size_t)t * ys + r, ys, kind);
    }
    const char *at = a + (size_t)n4 * as;
    float *yt = y + (size_t)n4 * ys;
    int r = 0;
    switch (nt - n4) {
    case 3:
        for (; r + 3 <= nr; r += 3) tile_rxt(k, w + (size_t)r * ws, ws, at, as, yt + r, ys, kind, 3, 3);
        if (nr - r == 2) tile_rxt(k, w + (size_t)r * ws, ws, at, as, yt + r, ys, kind, 2, 3);
        if (nr - r == 1) tile_rxt(k, w + (size_t)r * ws, ws, at, as, yt + r, ys, kind, 1, 3);
        break;
    case 2:
        for (; r + 4 <= nr; r += 4) tile_rxt(k, w + (size_t)r * ws, ws, at, as, yt + r, ys, kind, 4, 2);
        for (; r < nr; r++) tile_rxt(k, w + (size_t)r * ws, ws, at, as, yt + r, ys, kind, 1, 2);
        break;
    case 1:
        for (; r + 4 <= nr; r += 4) tile_4x1(k, w + (size_t)r * ws, ws, at, yt + r, kind);
        for (; r < nr; r++) tile_1x1(k, w + (size_t)r * ws, at, yt + r, kind);
        break;
    default: break;
    }
}

#define HR_FLOAT_KERNELS(name, kind)                                                                                   \
    float hr_avx2_dot_##name(int64_t k, const void *w, const void *a) {                                                \
        float out;                                                                                                     \
        tile_1x1(k, w, a, &out, kind);                                                                                 \
        return out;                                                                                                    \
    }                                                                                                                  \
    void hr_avx2_tile_##name(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride,        \
                             int nt, float *y, size_t y_stride) {                                                      \
        tile_driver(k, w, w_stride, nr, a, a_stride, nt, y, y_stride, kind);                                           \
    }

void hr_avx2_quantize_f16(const float *x, void *dst, int64_t k) {
    uint16_t *y = dst;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < k; i++) y[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

HR_FLOAT_KERNELS(f32, W_F32)
HR_FLOAT_KERNELS(f16, W_F16)
HR_FLOAT_KERNELS(bf16, W_BF16)

/* SwiGLU, 8 at a time: hr_op_swiglu1's steps in the lanes (ops.h), the tail by it: the same bits. */
void hr_avx2_swiglu(float *gate, const float *up, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    const __m256 lo = _mm256_set1_ps(-87.3f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_max_ps(lo, _mm256_loadu_ps(gate + i)); /* NaN: the second operand */
        const __m256 e = hr_exp_neg8(_mm256_or_ps(g, sign));           /* e^-|g| */
        const __m256 num = _mm256_blendv_ps(e, one, _mm256_cmp_ps(g, zero, _CMP_GE_OQ));
        const __m256 s = _mm256_div_ps(num, _mm256_add_ps(one, e));
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_mul_ps(g, s), _mm256_loadu_ps(up + i)));
    }
    for (; i < n; i++) gate[i] = hr_op_swiglu1(gate[i], up[i]);
}

/* kv_format_avx2.c: AVX2/FMA/F16C versions of the format kernels in kv_format.c (same contracts;
 * the same bits as the scalar reference, which follows these kernels' order of operations: keep the
 * two in step, test_kv_formats compares them bit for bit; encoders store the reference's bytes).
 * Compiled with -mavx2 -mfma -mf16c; called only when the CPU storage was created with isa "avx2"
 * (or "avx512"), which its creator chooses only where the CPU has those features.
 *
 * q.K for q8/q4/kivi2 is integer (vpmaddwd of the int16 query row with codes zero- or sign-extended
 * to 16 bits), exact and so identical to the reference's sums whatever the grouping of tokens; P.V
 * stays in f32 FMAs with one weight per token and group. Shapes without a fast path (head_dim not a
 * multiple of the code chunk, or above KV_QMAX_D) keep the reference kernel for that entry. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/kv_cpu.h"
#include "backend/cpu/simd_avx2.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF /* a * b + c written apart stays two roundings, as in kv_format.c */
#endif

/* ---- f32 / f16 / bf16 --------------------------------------------------------------------------- */

static inline __m256 load_f16x8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline __m256 load_bf16x8(const uint16_t *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* Four dot products at once: four independent FMA chains, then one transposing reduction. */
static inline __m128 hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* dot: 4 tokens per step. accum: the output row is held in up to 4 registers (32 channels) while
 * all n tokens stream through, instead of a load and store of acc per token. */
#define KV_DEF_FLOAT(name, T, LOAD, CVT)                                                                               \
    static void dot_##name(const kv_fmt *f, const uint8_t *head, int n, const float *q, float *row, float *scores) {   \
        int D = f->D, D8 = D & ~7, t = 0;                                                                              \
        const T *k = (const T *)head;                                                                                  \
        for (; D8 == D && t + 8 <= n; t += 8) {                                                                        \
            const T *k0 = k + (size_t)t * D;                                                                           \
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;            \
            for (int c = 0; c < D; c += 8) {                                                                           \
                __m256 qv = _mm256_loadu_ps(q + c);                                                                    \
                a0 = _mm256_fmadd_ps(qv, LOAD(k0 + c), a0);                                                            \
                a1 = _mm256_fmadd_ps(qv, LOAD(k0 + D + c), a1);                                                        \
                a2 = _mm256_fmadd_ps(qv, LOAD(k0 + 2 * D + c), a2);                                                    \
                a3 = _mm256_fmadd_ps(qv, LOAD(k0 + 3 * D + c), a3);                                                    \
                a4 = _mm256_fmadd_ps(qv, LOAD(k0 + 4 * D + c), a4);                                                    \
                a5 = _mm256_fmadd_ps(qv, LOAD(k0 + 5 * D + c), a5);                                                    \
                a6 = _mm256_fmadd_ps(qv, LOAD(k0 + 6 * D + c), a6);                                                    \
                a7 = _mm256_fmadd_ps(qv, LOAD(k0 + 7 * D + c), a7);                                                    \
            }                                                                                                          \
            _mm_storeu_ps(scores + t, hsum4(a0, a1, a2, a3));                                                          \
            _mm_storeu_ps(scores + t + 4, hsum4(a4, a5, a6, a7));                                                      \
        }                                                                                                              \
        for (; t + 4 <= n; t += 4) {                                                                                   \
            const T *k0 = k + (size_t)t * D, *k1 = k0 + D, *k2 = k1 + D, *k3 = k2 + D;                                 \
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                                                \
            for (int c = 0; c < D8; c += 8) {                                                                          \
                __m256 qv = _mm256_loadu_ps(q + c);                                                                    \
                a0 = _mm256_fmadd_ps(qv, LOAD(k0 + c), a0);                                                            \
                a1 = _mm256_fmadd_ps(qv, LOAD(k1 + c), a1);                                                            \
                a2 = _mm256_fmadd_ps(qv, LOAD(k2 + c), a2);                                                            \
                a3 = _mm256_fmadd_ps(qv, LOAD(k3 + c), a3);                                                            \
            }                                                                                                          \
            _mm_storeu_ps(scores + t, hsum4(a0, a1, a2, a3));                                                          \
            for (int c = D8; c < D; c++) {                                                                             \
                scores[t] += q[c] * CVT(k0[c]);                                                                        \
                scores[t + 1] += q[c] * CVT(k1[c]);                                                                    \
                scores[t + 2] += q[c] * CVT(k2[c]);                                                                    \
                scores[t + 3] += q[c] * CVT(k3[c]);                                                                    \
            }                                                                                                          \
        }                                                                                                              \
        for (; t < n; t++) {                                                                                           \
            const T *kt = k + (size_t)t * D;                                                                           \
            __m256 a = _mm256_setzero_ps();                                                                            \
            for (int c = 0; c < D8; c += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), LOAD(kt + c), a);              \
            float sum = hsum8(a);                                                                                      \
            for (int c = D8; c < D; c++) sum += q[c] * CVT(kt[c]);                                                     \
            scores[t] = sum;                                                                                           \
        }                                                                                                              \
    }                                                                                                                  \
    static void accf_##name(const kv_fmt *f, const uint8_t *head, int n, const float *p, int nc, float *acc) {         \
        int D = f->D, D8 = D & ~7, E8 = nc < D8 ? nc : D8;                                                             \
        const T *v = (const T *)head;                                                                                  \
        int c0 = 0;                                                                                                    \
        for (; c0 + 64 <= E8; c0 += 64) {                                                                              \
            __m256 a[8];                                                                                               \
            for (int i = 0; i < 8; i++) a[i] = _mm256_loadu_ps(acc + c0 + 8 * i);                                      \
            for (int t = 0; t < n; t++) {                                                                              \
                __m256 pw = _mm256_set1_ps(p[t]);                                                                      \
                const T *vt = v + (size_t)t * D + c0;                                                                  \
                for (int i = 0; i < 8; i++) a[i] = _mm256_fmadd_ps(pw, LOAD(vt + 8 * i), a[i]);                        \
            }                                                                                                          \
            for (int i = 0; i < 8; i++) _mm256_storeu_ps(acc + c0 + 8 * i, a[i]);                                      \
        }                                                                                                              \
        for (; c0 < E8; c0 += 32) {                                                                                    \
            int w = (E8 - c0 >= 32 ? 32 : E8 - c0) / 8;                                                                \
            __m256 a[4];                                                                                               \
            for (int i = 0; i < 4; i++) a[i] = i < w ? _mm256_loadu_ps(acc + c0 + 8 * i) : _mm256_setzero_ps();        \
            for (int t = 0; t < n; t++) {                                                                              \
                __m256 pw = _mm256_set1_ps(p[t]);                                                                      \
                const T *vt = v + (size_t)t * D + c0;                                                                  \
                for (int i = 0; i < 4; i++)                                                                            \
                    if (i < w) a[i] = _mm256_fmadd_ps(pw, LOAD(vt + 8 * i), a[i]);                                     \
            }                                                                                                          \
            for (int i = 0; i < w; i++) _mm256_storeu_ps(acc + c0 + 8 * i, a[i]);                                      \
        }                                                                                                              \
        for (int t = 0; t < n && D8 < nc; t++)                                                                         \
            for (int c = D8; c < nc; c++) acc[c] += p[t] * CVT(v[(size_t)t * D + c]);                                  \
    }                                                                                                                  \
    static void acc_##name(const kv_fmt *f, const uint8_t *head, int n, const float *p, float *acc) {                  \
        accf_##name(f, head, n, p, f->D, acc);                                                                         \
    }

static inline float id_f32(float x) { return x; }
KV_DEF_FLOAT(f32, float, _mm256_loadu_ps, id_f32)
KV_DEF_FLOAT(f16, uint16_t, load_f16x8, kv_f16_to_f32)
KV_DEF_FLOAT(bf16, uint16_t, load_bf16x8, kv_bf16_to_f32)

/* dot_heads / accum_heads (kv_cpu.h): G query heads of one KV head, D % 8 == 0, in passes of up to 4
 * heads. A pass loads and converts each K (V) row chunk once for its heads, where the one-head kernels
 * do it once per head; with R rows (chunks) a pass, R x G <= 8 accumulators (R = 4 for G <= 2, 2 for
 * G 3-4, 1 for a block's last odd row), each loaded q chunk (broadcast weight) serves R rows, so the
 * loads stay under one per FMA. Each head's arithmetic is the one-head kernels' own: q.k_t in 8 lanes
 * over the channels in order, reduced as dot reduces row t (hsum4's tree for the rows its 8- and 4-row
 * steps take, t < n & ~3; hsum8's for the last n % 4); acc += p_t v_t in t order from acc's value. So
 * every head gets the bits dot / accum give it (test_kv_isa_bits). G and R are constants in each
 * instance (KV_HEAD_PASSES below), so the accumulators stay in registers. P.V of a 256-token prompt's
 * attention: 2.6x faster (perf of accf_f16 against acc_heads_f16); q.K about even (FMA-bound either
 * way). */
enum { KV_LD_F32, KV_LD_F16, KV_LD_BF16 };
static inline __attribute__((always_inline)) __m256 load_kind(const void *p, size_t i, const int kind) {
    if (kind == KV_LD_F32) return _mm256_loadu_ps((const float *)p + i);
    if (kind == KV_LD_F16) return load_f16x8((const uint16_t *)p + i);
    return load_bf16x8((const uint16_t *)p + i);
}

/* scores[g][t] from the lanes of a[g] (g < G), reduced as dot reduces row t */
static inline __attribute__((always_inline)) void heads_scores(const __m256 *a, const int G, int t, int n4,
                                                               float *const *scores) {
    if (t >= n4) {
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) scores[g][t] = hsum8(a[g]);
        return;
    }
    const __m256 z = _mm256_setzero_ps();
    float v[4];
    _mm_storeu_ps(v, hsum4(a[0], G > 1 ? a[1] : z, G > 2 ? a[2] : z, G > 3 ? a[3] : z));
#pragma GCC unroll 4
    for (int g = 0; g < G; g++) scores[g][t] = v[g];
}

/* rows t..t+R-1 of k against the G queries */
static inline __attribute__((always_inline)) void dotg_rows(const void *k, int D, int t, const int R, int n4,
                                                            const float *const *q, const int G, float *const *scores,
                                                            const int kind) {
    __m256 a[8];
#pragma GCC unroll 8
    for (int i = 0; i < R * G; i++) a[i] = _mm256_setzero_ps();
    for (int c = 0; c < D; c += 8) {
        __m256 qv[4];
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) qv[g] = _mm256_loadu_ps(q[g] + c);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m256 kv = load_kind(k, (size_t)(t + r) * D + c, kind);
#pragma GCC unroll 4
            for (int g = 0; g < G; g++) a[r * G + g] = _mm256_fmadd_ps(qv[g], kv, a[r * G + g]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) heads_scores(a + r * G, G, t + r, n4, scores);
}

static inline __attribute__((always_inline)) void dotg(const kv_fmt *f, const uint8_t *head, int n,
                                                       const float *const *q, const int G, float *const *scores,
                                                       const int kind) {
    const int D = f->D, n4 = n & ~3, R = G <= 2 ? 4 : 2;
    int t = 0;
    for (; t + R <= n; t += R) dotg_rows(head, D, t, R, n4, q, G, scores, kind);
    for (; t < n; t++) dotg_rows(head, D, t, 1, n4, q, G, scores, kind);
}

/* channels c..c+8W-1 of acc[g] += sum_t p[g][t] v_t */
static inline __attribute__((always_inline)) void accg_cols(const void *v, int D, int n, int c, const int W,
                                                            const float *const *p, const int G, float *const *acc,
                                                            const int kind) {
    __m256 a[8];
#pragma GCC unroll 4
    for (int w = 0; w < W; w++)
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) a[w * G + g] = _mm256_loadu_ps(acc[g] + c + 8 * w);
    for (int t = 0; t < n; t++) {
        __m256 pw[4];
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) pw[g] = _mm256_set1_ps(p[g][t]);
#pragma GCC unroll 4
        for (int w = 0; w < W; w++) {
            const __m256 vv = load_kind(v, (size_t)t * D + c + 8 * w, kind);
#pragma GCC unroll 4
            for (int g = 0; g < G; g++) a[w * G + g] = _mm256_fmadd_ps(pw[g], vv, a[w * G + g]);
        }
    }
#pragma GCC unroll 4
    for (int w = 0; w < W; w++)
#pragma GCC unroll 4
        for (int g = 0; g < G; g++) _mm256_storeu_ps(acc[g] + c + 8 * w, a[w * G + g]);
}

static inline __attribute__((always_inline)) void accg(const kv_fmt *f, const uint8_t *head, int n,
                                                       const float *const *p, const int G, float *const *acc,
                                                       const int kind) {
    const int D = f->D, W = G <= 2 ? 4 : 2;
    int c = 0;
    for (; c + 8 * W <= D; c += 8 * W) accg_cols(head, D, n, c, W, p, G, acc, kind);
    for (; c < D; c += 8) accg_cols(head, D, n, c, 1, p, G, acc, kind);
}

/* PASS(g0, NG) for the heads in passes of up to 4 from g0, NG a constant in each case (the kernels'
 * accumulators, R x NG of them, stay in registers only where it is). */
#define KV_HEAD_PASSES(G, PASS)                                                                                        \
    for (int g0 = 0; g0 < (G); g0 += 4) {                                                                              \
        switch ((G)-g0 < 4 ? (G)-g0 : 4) {                                                                             \
        case 1: PASS(g0, 1); break;                                                                                    \
        case 2: PASS(g0, 2); break;                                                                                    \
        case 3: PASS(g0, 3); break;                                                                                    \
        default: PASS(g0, 4); break;                                                                                   \
        }                                                                                                              \
    }

static inline __attribute__((always_inline)) void dot_heads_kind(const kv_fmt *f, const uint8_t *head, int n,
                                                                 const float *const *q, int G, float *const *scores,
                                                                 const int kind) {
#define KV_PASS(g0, NG) dotg(f, head, n, q + (g0), NG, scores + (g0), kind)
    KV_HEAD_PASSES(G, KV_PASS)
#undef KV_PASS
}

static inline __attribute__((always_inline)) void acc_heads_kind(const kv_fmt *f, const uint8_t *head, int n,
                                                                 const float *const *p, int G, float *const *acc,
                                                                 const int kind){
#define KV_PASS(g0, NG) accg(f, head, n, p + (g0), NG, acc + (g0), kind)
    KV_HEAD_PASSES(G, KV_PASS)
#undef KV_PASS
}

#define KV_DEF_HEADS(name, KIND)                                                                                       \
    static void dot_heads_##name(const kv_fmt *f, const uint8_t *head, int n, const float *const *q, int G,            \
                                 float *const *scores) {                                                               \
        dot_heads_kind(f, head, n, q, G, scores, KIND);                                                                \
    }                                                                                                                  \
    static void acc_heads_##name(const kv_fmt *f, const uint8_t *head, int n, const float *const *p, int G,            \
                                 float *const *acc) {                                                                  \
        acc_heads_kind(f, head, n, p, G, acc, KIND);                                                                   \
    }
KV_DEF_HEADS(f32, KV_LD_F32) KV_DEF_HEADS(f16, KV_LD_F16) KV_DEF_HEADS(bf16, KV_LD_BF16)

    /* ---- Q8 ------------------------------------------------------------------------------------------ */

    static inline __m256 load_i8x8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

enum { KV_QMAX_D = 256 }; /* int16 query rows live on the stack: fast paths need D <= this */

/* x rounded to int16 against its max |x| (kv_format.c's kv_q16: same products, same rounding), in
 * channel order; returns the step. D % 16 == 0. */
static float row_i16(const float *x, int D, int16_t *q16) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 vmax = _mm256_setzero_ps();
    for (int c = 0; c < D; c += 8) vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(x + c), absmask));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float amax = _mm_cvtss_f32(m4);
    __m256 inv = _mm256_set1_ps(amax > 0.0f ? 32767.0f / amax : 0.0f);
    for (int c = 0; c < D; c += 16) {
        __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + c), inv));
        __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + c + 8), inv));
        __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xd8); /* channel order */
        _mm256_storeu_si256((__m256i *)(q16 + c), w);
    }
    return amax / 32767.0f;
}

static inline __m128i hsum4_epi32(__m256i a0, __m256i a1, __m256i a2, __m256i a3) {
    __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}
static inline int32_t hsum_epi32(__m256i a) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 1)));
}
static inline __m256i idot_i8x16(const int8_t *k, const int16_t *q16) {
    return _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)k)),
                             _mm256_loadu_si256((const __m256i *)q16));
}

/* Exact integer group sums (int16 q x int8 k), then the reference's float steps in its order: the
 * same scores as kv_format.c bit for bit. Four tokens at a time. Needs G % 16 == 0. */
static void dot_q8(const kv_fmt *f, const uint8_t *head, int n, const float *q, float *row, float *scores) {
    int D = f->D, G = f->G, ng = D / G, t = 0;
    (void)row;
    int16_t q16[KV_QMAX_D];
    float step = row_i16(q, D, q16);
    const int8_t *k = (const int8_t *)head;
    const uint16_t *sc = (const uint16_t *)(head + f->scale_off);
    for (; t + 4 <= n; t += 4) {
        const int8_t *k0 = k + (size_t)t * D, *k1 = k0 + D, *k2 = k1 + D, *k3 = k2 + D;
        const uint16_t *st = sc + (size_t)t * ng;
        __m128 tot = _mm_setzero_ps();
        __m256 sc2 = _mm256_setzero_ps();
        if (ng == 2) /* [t0 g0, t0 g1, t1 g0, ...] -> [t0..t3 g0 | t0..t3 g1] */
            sc2 = _mm256_permutevar8x32_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)st)),
                                           _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
        for (int g = 0; g < ng; g++) {
            __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
            for (int c = g * G; c < (g + 1) * G; c += 16) {
                a0 = _mm256_add_epi32(a0, idot_i8x16(k0 + c, q16 + c));
                a1 = _mm256_add_epi32(a1, idot_i8x16(k1 + c, q16 + c));
                a2 = _mm256_add_epi32(a2, idot_i8x16(k2 + c, q16 + c));
                a3 = _mm256_add_epi32(a3, idot_i8x16(k3 + c, q16 + c));
            }
            __m128 s4;
            if (ng == 2) /* the 4 tokens' 8 scales in one load, group g's in the lanes (the same values) */
                s4 = g == 0 ? _mm256_castps256_ps128(sc2) : _mm256_extractf128_ps(sc2, 1);
            else
                s4 = _mm_setr_ps(_cvtsh_ss(st[g]), _cvtsh_ss(st[ng + g]), _cvtsh_ss(st[2 * ng + g]),
                                 _cvtsh_ss(st[3 * ng + g]));
            tot = _mm_add_ps(tot, _mm_mul_ps(_mm_cvtepi32_ps(hsum4_epi32(a0, a1, a2, a3)), s4));
        }
        _mm_storeu_ps(scores + t, _mm_mul_ps(tot, _mm_set1_ps(step)));
    }
    for (; t < n; t++) {
        const int8_t *kt = k + (size_t)t * D;
        float s = 0.0f;
        for (int g = 0; g < ng; g++) {
            __m256i a = _mm256_setzero_si256();
            for (int c = g * G; c < (g + 1) * G; c += 16) a = _mm256_add_epi32(a, idot_i8x16(kt + c, q16 + c));
            s += (float)hsum_epi32(a) * _cvtsh_ss(sc[(size_t)t * ng + g]);
        }
        scores[t] = s * step;
    }
}

/* dot_heads / accum_heads for q8 (the float formats' scheme above, kv_cpu.h), G % 16 == 0 and D <=
 * KV_QMAX_D as dot_q8's: per pass of up to 4 heads and 2 rows, each 16-value chunk of a row is
 * sign-extended once for the heads (vpmaddwd against each head's int16 query). A row's integer group
 * sums are exact, so how they are added does not matter; the float steps are dot_q8's per (row, head):
 * tot += (float)isum_g x scale_g over the groups in order, then x the head's query step, in 4 lanes
 * (one a head), each lane the scalar sequence. P.V: acc += (p_t x scale) v_t in t order, 16 channels
 * (one scale group) a pass, as accf_q8 computes each channel. */
static inline __attribute__((always_inline)) void dotg_q8_rows(const kv_fmt *f, const int8_t *k, const uint16_t *sc,
                                                               int t, const int R, int16_t (*q16)[KV_QMAX_D],
                                                               const float *step, const int G, float *const *scores) {
    const int D = f->D, Gq = f->G, ng = D / Gq;
    __m128 tot[2] = {_mm_setzero_ps(), _mm_setzero_ps()};
    for (int g = 0; g < ng; g++) {
        __m256i a[8];
#pragma GCC unroll 8
        for (int i = 0; i < R * G; i++) a[i] = _mm256_setzero_si256();
        for (int c = g * Gq; c < (g + 1) * Gq; c += 16) {
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                const __m256i kx =
                    _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(k + (size_t)(t + r) * D + c)));
#pragma GCC unroll 4
                for (int h = 0; h < G; h++)
                    a[r * G + h] = _mm256_add_epi32(
                        a[r * G + h], _mm256_madd_epi16(kx, _mm256_loadu_si256((const __m256i *)(q16[h] + c))));
            }
        }
        const __m256i z = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            const __m256i *ar = a + r * G;
            const __m128i is = hsum4_epi32(ar[0], G > 1 ? ar[1] : z, G > 2 ? ar[2] : z, G > 3 ? ar[3] : z);
            tot[r] = _mm_add_ps(tot[r],
                                _mm_mul_ps(_mm_cvtepi32_ps(is), _mm_set1_ps(_cvtsh_ss(sc[(size_t)(t + r) * ng + g]))));
        }
    }
    const __m128 st = _mm_loadu_ps(step);
#pragma GCC unroll 2
    for (int r = 0; r < R; r++) {
        float v[4];
        _mm_storeu_ps(v, _mm_mul_ps(tot[r], st));
#pragma GCC unroll 4
        for (int h = 0; h < G; h++) scores[h][t + r] = v[h];
    }
}

static inline __attribute__((always_inline)) void dotg_q8(const kv_fmt *f, const uint8_t *head, int n,
                                                          const float *const *q, const int G, float *const *scores) {
    int16_t q16[4][KV_QMAX_D];
    float step[4] = {0};
#pragma GCC unroll 4
    for (int h = 0; h < G; h++) step[h] = row_i16(q[h], f->D, q16[h]);
    const int8_t *k = (const int8_t *)head;
    const uint16_t *sc = (const uint16_t *)(head + f->scale_off);
    int t = 0;
    for (; t + 2 <= n; t += 2) dotg_q8_rows(f, k, sc, t, 2, q16, step, G, scores);
    if (t < n) dotg_q8_rows(f, k, sc, t, 1, q16, step, G, scores);
}

static inline __attribute__((always_inline)) void accg_q8(const kv_fmt *f, const uint8_t *head, int n,
                                                          const float *const *p, const int G, float *const *acc) {
    const int D = f->D, Gq = f->G, ng = D / Gq;
    const uint16_t *sc = (const uint16_t *)(head + f->scale_off);
    for (int c = 0; c < D; c += 16) {
        __m256 a[8];
#pragma GCC unroll 4
        for (int h = 0; h < G; h++) {
            a[2 * h] = _mm256_loadu_ps(acc[h] + c);
            a[2 * h + 1] = _mm256_loadu_ps(acc[h] + c + 8);
        }
        for (int t = 0; t < n; t++) {
            const int8_t *qs = (const int8_t *)head + (size_t)t * D + c;
            const float s = _cvtsh_ss(sc[(size_t)t * ng + c / Gq]);
            const __m256 v0 = load_i8x8(qs), v1 = load_i8x8(qs + 8);
#pragma GCC unroll 4
            for (int h = 0; h < G; h++) {
                const __m256 wv = _mm256_set1_ps(p[h][t] * s);
                a[2 * h] = _mm256_fmadd_ps(wv, v0, a[2 * h]);
                a[2 * h + 1] = _mm256_fmadd_ps(wv, v1, a[2 * h + 1]);
            }
        }
#pragma GCC unroll 4
        for (int h = 0; h < G; h++) {
            _mm256_storeu_ps(acc[h] + c, a[2 * h]);
            _mm256_storeu_ps(acc[h] + c + 8, a[2 * h + 1]);
        }
    }
}

static void dot_heads_q8(const kv_fmt *f, const uint8_t *head, int n, const float *const *q, int G,
                         float *const *scores) {
#define KV_PASS(g0, NG) dotg_q8(f, head, n, q + (g0), NG, scores + (g0))
    KV_HEAD_PASSES(G, KV_PASS)
#undef KV_PASS
}

static void acc_heads_q8(const kv_fmt *f, const uint8_t *head, int n, const float *const *p, int G, float *const *acc) {
#define KV_PASS(g0, NG) accg_q8(f, head, n, p + (g0), NG, acc + (g0))
    KV_HEAD_PASSES(G, KV_PASS)
#undef KV_PASS
}

/* P.V: 32 output channels in registers while the tokens stream by; one weight p * scale per token
 * and group (G >= 8, so one per register). */
static void accf_q8(const kv_fmt *f, const uint8_t *head, int n, const float *p, int nc, float *acc) {
    int D = f->D, G = f->G, ng = D / G;
    const uint16_t *sc = (const uint16_t *)(head + f->scale_off);
    int c0 = 0;
    for (; c0 + 64 <= nc; c0 += 64) { /* 8 registers: 8 FMA chains, not 4 (latency) */
        __m256 a[8];
        for (int i = 0; i < 8; i++) a[i] = _mm256_loadu_ps(acc + c0 + 8 * i);
        for (int t = 0; t < n; t++) {
            const int8_t *qs = (const int8_t *)head + (size_t)t * D + c0;
            const uint16_t *st = sc + (size_t)t * ng;
            /* the groups' cases apart: one loop testing where a group starts per register ran 1.7x
             * slower (59 against 35 ms a token at 4K, bench_kv_decode) */
            if (G >= 64) {
                __m256 wv = _mm256_set1_ps(p[t] * _cvtsh_ss(st[c0 / G]));
                for (int i = 0; i < 8; i++) a[i] = _mm256_fmadd_ps(wv, load_i8x8(qs + 8 * i), a[i]);
            } else if (G == 32) { /* a group a half */
                for (int h = 0; h < 2; h++) {
                    __m256 wv = _mm256_set1_ps(p[t] * _cvtsh_ss(st[c0 / G + h]));
                    for (int i = 4 * h; i < 4 * h + 4; i++) a[i] = _mm256_fmadd_ps(wv, load_i8x8(qs + 8 * i), a[i]);
                }
            } else {
                for (int i = 0; i < 8; i++) {
                    __m256 wv = _mm256_set1_ps(p[t] * _cvtsh_ss(st[(c0 + 8 * i) / G]));
                    a[i] = _mm256_fmadd_ps(wv, load_i8x8(qs + 8 * i), a[i]);
                }
            }
        }
        for (int i = 0; i < 8; i++) _mm256_storeu_ps(acc + c0 + 8 * i, a[i]);
    }
    for (; c0 < nc; c0 += 32) {
        int w = (nc - c0 >= 32 ? 32 : nc - c0) / 8;
        __m256 a[4];
        for (int i = 0; i < 4; i++) a[i] = i < w ? _mm256_loadu_ps(acc + c0 + 8 * i) : _mm256_setzero_ps();
        for (int t = 0; t < n; t++) {
            const int8_t *qs = (const int8_t *)head + (size_t)t * D + c0;
            const uint16_t *st = sc + (size_t)t * ng;
            if (G >= 32 && w == 4) { /* one group for the whole pass */
                __m256 wv = _mm256_set1_ps(p[t] * _cvtsh_ss(st[c0 / G]));
                for (int i = 0; i < 4; i++) a[i] = _mm256_fmadd_ps(wv, load_i8x8(qs + 8 * i), a[i]);
            } else {
                for (int i = 0; i < 4; i++)
                    if (i < w) {
                        __m256 wv = _mm256_set1_ps(p[t] * _cvtsh_ss(st[(c0 + 8 * i) / G]));
                        a[i] = _mm256_fmadd_ps(wv, load_i8x8(qs + 8 * i), a[i]);
                    }
            }
        }
        for (int i = 0; i < w; i++) _mm256_storeu_ps(acc + c0 + 8 * i, a[i]);
    }
}
static void acc_q8(const kv_fmt *f, const uint8_t *head, int n, const float *p, float *acc) {
    accf_q8(f, head, n, p, f->D, acc);
}

/* Encoder: kv_format.c's enc_q8 with the same operations per element (max |x|, the f16 scale, one
 * reciprocal, round to nearest even, saturate), so the same bytes. */
static inline float hmax8(__m256 v) {
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    return _mm_cvtss_f32(m4);
}
static inline void store_i32x8_as_i8(int8_t *dst, __m256i v) {
    __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64((__m128i *)dst, _mm_packs_epi16(w, w));
}
static void enc_q8(const kv_fmt *f, uint8_t *head, int t, const float *x) {
    int D = f->D, G = f->G, ng = D / G;
    int8_t *qs = (int8_t *)head + (size_t)t * D;
    uint16_t *sc = (uint16_t *)(head + f->scale_off) + (size_t)t * ng;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int g = 0; g < ng; g++) {
        const float *xg = x + g * G;
        __m256 vmax = _mm256_setzero_ps();
        for (int c = 0; c < G; c += 8) vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(xg + c), absmask));
        uint16_t s16 = kv_f32_to_f16(hmax8(vmax) / 127.0f);
        float s = _cvtsh_ss(s16);
        __m256 inv = _mm256_set1_ps(s > 0.0f ? 1.0f / s : 0.0f);
        for (int c = 0; c < G; c += 8) {
            __m256i r = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + c), inv));
            r = _mm256_min_epi32(_mm256_max_epi32(r, _mm256_set1_epi32(-127)), _mm256_set1_epi32(127));
            store_i32x8_as_i8(qs + g * G + c, r);
        }
        sc[g] = s16;
    }
}

/* ---- FP8 e4m3: magnitude bits moved to f32 bit 20 and scaled by 2^120 (exact, see kv_internal.h) -- */

static inline __m256 load_e4m3x8(const uint8_t *p) {
    __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    __m256i mag = _mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7f)), 20);
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x80)), 24);
    __m256 v = _mm256_mul_ps(_mm256_castsi256_ps(mag), _mm256_set1_ps(0x1p120f));
    return _mm256_or_ps(v, _mm256_castsi256_ps(sign));
}

static void dot_fp8(const kv_fmt *f, const uint8_t *head, int n, const float *q, float *row, float *scores) {
    int D = f->D, t = 0;
    const float *sc = (const float *)(head + f->scale_off);
    for (; t + 4 <= n; t += 4) {
        const uint8_t *k0 = head + (size_t)t * D, *k1 = k0 + D, *k2 = k1 + D, *k3 = k2 + D;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int c = 0; c < D; c += 8) {
            __m256 qv = _mm256_loadu_ps(q + c);
            a0 = _mm256_fmadd_ps(qv, load_e4m3x8(k0 + c), a0);
            a1 = _mm256_fmadd_ps(qv, load_e4m3x8(k1 + c), a1);
            a2 = _mm256_fmadd_ps(qv, load_e4m3x8(k2 + c), a2);
            a3 = _mm256_fmadd_ps(qv, load_e4m3x8(k3 + c), a3);
        }
        _mm_storeu_ps(scores + t, _mm_mul_ps(hsum4(a0, a1, a2, a3), _mm_loadu_ps(sc + t)));
    }
    for (; t < n; t++) {
        const uint8_t *kt = head + (size_t)t * D;
        __m256 a = _mm256_setzero_ps();
        for (int c = 0; c < D; c += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), load_e4m3x8(kt + c), a);
        scores[t] = hsum8(a) * sc[t];
    }
}

static void accf_fp8(const kv_fmt *f, const uint8_t *head, int n, const float *p, int nc, float *acc) {
    int D = f->D;
    const float *sc = (const float *)(head + f->scale_off);
    for (int c0 = 0; c0 < nc; c0 += 32) {
        int w = (nc - c0 >= 32 ? 32 : nc - c0) / 8;
        __m256 a[4];
        for (int i = 0; i < 4; i++) a[i] = i < w ? _mm256_loadu_ps(acc + c0 + 8 * i) : _mm256_setzero_ps();
        for (int t = 0; t < n; t++) {
            __m256 wv = _mm256_set1_ps(p[t] * sc[t]);
            const uint8_t *vt = head + (size_t)t * D + c0;
            for (int i = 0; i < 4; i++)
                if (i < w) a[i] = _mm256_fmadd_ps(wv, load_e4m3x8(vt + 8 * i), a[i]);
        }
        for (int i = 0; i < w; i++) _mm256_storeu_ps(acc + c0 + 8 * i, a[i]);
    }
}
static void acc_fp8(const kv_fmt *f, const uint8_t *head, int n, const float *p, float *acc) {
    accf_fp8(f, head, n, p, f->D, acc);
}

/* 16 e4m3 codes as f16 bits: magnitude bits << 7 make an f16 of the same mantissa with exponent bias
 * 15 instead of 7, i.e. the value times 2^-8 exactly (subnormals too); the 2^8 goes into the token's
 * scale. Two F16C conversions then replace a shift-mask-multiply per 8 codes. */
static inline void load_e4m3x16(const uint8_t *p, __m256 *lo, __m256 *hi) {
    __m256i y = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(y, _mm256_set1_epi16(0x7f)), 7),
                                _mm256_slli_epi16(_mm256_and_si256(y, _mm256_set1_epi16(0x80)), 8));
    *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

static void dot_fp8_16(const kv_fmt *f, const uint8_t *head, int n, const float *q, float *row, float *scores) {
    int D = f->D, t = 0;
    (void)row;
    const float *sc = (const float *)(head + f->scale_off);
    for (; t + 4 <= n; t += 4) {
        const uint8_t *k0 = head + (size_t)t * D;
        __m256 a[4];
        for (int i = 0; i < 4; i++) a[i] = _mm256_setzero_ps();
        for (int c = 0; c < D; c += 16) {
            __m256 q0 = _mm256_loadu_ps(q + c), q1 = _mm256_loadu_ps(q + c + 8);
            for (int i = 0; i < 4; i++) {
                __m256 lo, hi;
                load_e4m3x16(k0 + (size_t)i * D + c, &lo, &hi);
                a[i] = _mm256_fmadd_ps(q1, hi, _mm256_fmadd_ps(q0, lo, a[i]));
            }
        }
        __m128 s4 = _mm_mul_ps(_mm_loadu_ps(sc + t), _mm_set1_ps(256.0f));
        _mm_storeu_ps(scores + t, _mm_mul_ps(hsum4(a[0], a[1], a[2], a[3]), s4));
    }
    for (; t < n; t++) {
        const uint8_t *kt = head + (size_t)t * D;
        __m256 a = _mm256_setzero_ps();
        for (int c = 0; c < D; c += 16) {
            __m256 lo, hi;
            load_e4m3x16(kt + c, &lo, &hi);
            a = _mm256_fmadd_ps(_mm256_loadu_ps(q + c + 8), hi, _mm256_fmadd_ps(_mm256_loadu_ps(q + c), lo, a));
        }
        scores[t] = hsum8(a) * (sc[t] * 256.0f);
    }
}

static void accf_fp8_16(const kv_fmt *f, const uint8_t *head, int n, const float *p, int nc, float *acc) {
    int D = f->D;
    const float *sc = (const float *)(head + f->scale_off);
    for (int c0 = 0; c0 < nc; c0 += 32) {
        int w = (nc - c0 >= 32 ? 32 : nc - c0) / 16;
        __m256 a[4];
        for (int i = 0; i < 4; i++) a[i] = i < 2 * w ? _mm256_loadu_ps(acc + c0 + 8 * i) : _mm256_setzero_ps();
        for (int t = 0; t < n; t++) {
            __m256 wv = _mm256_set1_ps(p[t] * (sc[t] * 256.0f));
            const uint8_t *vt = head + (size_t)t * D + c0;
            for (int i = 0; i < w; i++) {
                __m256 lo, hi;
                load_e4m3x16(vt + 16 * i, &lo, &hi);
                a[2 * i] = _mm256_fmadd_ps(wv, lo, a[2 * i]);
                a[2 * i + 1] = _mm256_fmadd_ps(wv, hi, a[2 * i + 1]);
            }
        }
        for (int i = 0; i < 2 * w; i++) _mm256_storeu_ps(acc + c0 + 8 * i, a[i]);
    }
}
static void acc_fp8_16(const kv_fmt *f, const uint8_t *head, int n, const float *p, float *acc) {
    accf_fp8_16(f, head, n, p, f->D, acc);
}

/* Encoder: kv_format.c's enc_fp8 and kv_f32_to_e4m3 per element: round to nearest even on the bits
 * (normals: 3 mantissa bits kept, the carry moves into the exponent; subnormals: steps of 2^-9),
 * saturating at 448. Same bytes as the reference for finite input. */
static void enc_fp8(const kv_fmt *f, uint8_t *head, int t, const float *x) {
    int D = f->D;
    uint8_t *qs = head + (size_t)t * D;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 vmax = _mm256_setzero_ps();
    for (int c = 0; c < D; c += 8) vmax = _mm256_max_ps(vmax, _mm256_and_ps(_mm256_loadu_ps(x + c), absmask));
    float s = hmax8(vmax) / 448.0f;
    __m256 inv = _mm256_set1_ps(s > 0.0f ? 1.0f / s : 0.0f);
    for (int c = 0; c < D; c += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + c), inv);
        __m256i u = _mm256_castps_si256(v);
        __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
        __m256 a = _mm256_and_ps(v, absmask);
        __m256i ua = _mm256_castps_si256(a);
        __m256i odd = _mm256_and_si256(_mm256_srli_epi32(ua, 20), _mm256_set1_epi32(1));
        __m256i nrm = _mm256_sub_epi32(
            _mm256_srli_epi32(_mm256_add_epi32(ua, _mm256_add_epi32(_mm256_set1_epi32(0x7ffff), odd)), 20),
            _mm256_set1_epi32(120 << 3));
        __m256i sub = _mm256_cvtps_epi32(_mm256_mul_ps(a, _mm256_set1_ps(512.0f)));
        __m256i code = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(nrm), _mm256_castsi256_ps(sub),
                                                            _mm256_cmp_ps(a, _mm256_set1_ps(0x1p-6f), _CMP_LT_OQ)));
        code = _mm256_min_epi32(code, _mm256_set1_epi32(0x7e));
        code = _mm256_or_si256(code, sign);
        __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
        _mm_storel_epi64((__m128i *)(qs + c), _mm_packus_epi16(w, w));
    }
    memcpy(head + f->scale_off + (size_t)t * 4, &s, 4);
}

/* ---- Q4 / KIVI2 ------------------------------------------------------------------------------------
 * A 16-byte chunk of a token row holds 32 (4-bit) or 64 (2-bit) channels laid out so that, zero-
 * extended, shift i and a mask give channels [16i, 16i + 16) of the chunk in order (kv_format.c). The
 * fast paths need D a multiple of the chunk width and D <= 256 (else the reference runs). */

/* q' = q * scale rounded to int16 against its max |q'| (the same numbers as kv_format.c's reference:
 * same products, same rounding), stored in channel order; returns the step, sets bias. */
static float qrow_i16(const kv_fmt *f, const uint8_t *head, const float *q, float *row, int16_t *q16, float *bias) {
    int D = f->D;
    const uint16_t *sc = (const uint16_t *)(head + f->scale_off);
    const uint16_t *mn = sc + D;
    __m256 vb = _mm256_setzero_ps();
    for (int c = 0; c < D; c += 8) {
        __m256 qv = _mm256_loadu_ps(q + c);
        _mm256_storeu_ps(row + c, _mm256_mul_ps(qv, load_f16x8(sc + c)));
        vb = _mm256_fmadd_ps(qv, load_f16x8(mn + c), vb);
    }
    *bias = hsum8(vb);
    return row_i16(row, D, q16);
}

/* Integer dot of one token's 16-byte code chunk with the chunk's q16 (4-bit: 32 channels). */
static inline __m256i idot_u4(const uint8_t *codes, const int16_t *q16) {
    __m256i y = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)codes));
    __m256i lo = _mm256_and_si256(y, _mm256_set1_epi16(0x0f)), hi = _mm256_srli_epi16(y, 4);
    return _mm256_add_epi32(_mm256_madd_epi16(lo, _mm256_loadu_si256((const __m256i *)q16)),
                            _mm256_madd_epi16(hi, _mm256_loadu_si256((const __m256i *)(q16 + 16))));
}
static inline __m256i idot_u2(const uint8_t *codes, const int16_t *q16) { /* 2-bit: 64 channels */
    __m256i y = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)codes));
    __m256i m = _mm256_set1_epi16(3);
    __m256i s0 = _mm256_madd_epi16(_mm256_and_si256(y, m), _mm256_loadu_si256((const __m256i *)q16));
    __m256i s1 = _mm256_madd_epi16(_mm256_and_si256(_mm256_srli_epi16(y, 2), m),
                                   _mm256_loadu_si256((const __m256i *)(q16 + 16)));
    __m256i s2 = _mm256_madd_epi16(_mm256_and_si256(_mm256_srli_epi16(y, 4), m),
                                   _mm256_loadu_si256((const __m256i *)(q16 + 32)));
    __m256i s3 = _mm256_madd_epi16(_mm256_srli_epi16(y, 6), _mm256_loadu_si256((const __m256i *)(q16 + 48)));
    return _mm256_add_epi32(_mm256_add_epi32(s0, s1), _mm256_add_epi32(s2, s3));
}

/* Exact integer sums, so grouping tokens by four changes nothing: scores depend on the data only. */
#define KV_DEF_DOT_LOWBIT(name, IDOT, BITS)                                                                            \
    static void name(const kv_fmt *f, const uint8_t *head, int n, const float *q, float *row, float *scores) {         \
        int D = f->D, rb = D * BITS / 8, t = 0;                                                                        \
        int16_t q16[KV_QMAX_D];                                                                                        \
        float bias, step = qrow_i16(f, head, q, row, q16, &bias);                                                      \
        const uint8_t *codes = head + f->code_off;                                                                     \
        __m128 vstep = _mm_set1_ps(step), vbias = _mm_set1_ps(bias);                                                   \
        for (; t + 4 <= n; t += 4) {                                                                                   \
            const uint8_t *c0 = codes + (size_t)t * rb, *c1 = c0 + rb, *c2 = c1 + rb, *c3 = c2 + rb;                   \
            __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;                                            \
            for (int j = 0, k = 0; k < rb; j += 128 / BITS, k += 16) {                                                 \
                a0 = _mm256_add_epi32(a0, IDOT(c0 + k, q16 + j));                                                      \
                a1 = _mm256_add_epi32(a1, IDOT(c1 + k, q16 + j));                                                      \
                a2 = _mm256_add_epi32(a2, IDOT(c2 + k, q16 + j));                                                      \
                a3 = _mm256_add_epi32(a3, IDOT(c3 + k, q16 + j));                                                      \
            }                                                                                                          \
            __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));                       \
            __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));                      \
            _mm_storeu_ps(scores + t, _mm_add_ps(_mm_mul_ps(_mm_cvtepi32_ps(s), vstep), vbias));                       \
        }                                                                                                              \
        for (; t < n; t++) {                                                                                           \
            __m256i a = _mm256_setzero_si256();                                                                        \
            for (int j = 0, k = 0; k < rb; j += 128 / BITS, k += 16)                                                   \
                a = _mm256_add_epi32(a, IDOT(codes + (size_t)t * rb + k, q16 + j));                                    \
            __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));                      \
            s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));                                                            \
            s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));                                                             \
            scores[t] = _mm_cvtss_f32(_mm_add_ss(_mm_mul_ss(_mm_cvtepi32_ps(s), vstep), vbias));                       \
        }                                                                                                              \
    }
KV_DEF_DOT_LOWBIT(dot_q4_k, idot_u4, 4)
KV_DEF_DOT_LOWBIT(dot_kivi2_k, idot_u2, 2)

static inline __m256 cvt_u8x8(__m256i x) { return _mm256_cvtepi32_ps(x); }

/* P.V for 4-bit V: a pass holds one 32-channel chunk (G = 32 there) in four registers; per token the
 * weight p * scale multiplies the codes and the mins are summed apart (p * min once per token). */
static void acc_q4_v(const kv_fmt *f, const uint8_t *head, int n, const float *p, float *acc) {
    int D = f->D, rb = D / 2, ng = D / 32;
    const uint16_t *sm = (const uint16_t *)(head + f->scale_off);
    const __m256i m4 = _mm256_set1_epi32(0x0f);
    for (int g = 0; g < ng; g++) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        float wmin = 0.0f;
        const uint8_t *codes = head + f->code_off + (size_t)g * 16;
        for (int t = 0; t < n; t++, codes += rb) {
            const uint16_t *pair = sm + ((size_t)t * ng + g) * 2;
            __m256 ws = _mm256_set1_ps(p[t] * _cvtsh_ss(pair[0]));
            wmin += p[t] * _cvtsh_ss(pair[1]);
            __m256i x0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)codes));
            __m256i x1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + 8)));
            a0 = _mm256_fmadd_ps(ws, cvt_u8x8(_mm256_and_si256(x0, m4)), a0);
            a1 = _mm256_fmadd_ps(ws, cvt_u8x8(_mm256_and_si256(x1, m4)), a1);
            a2 = _mm256_fmadd_ps(ws, cvt_u8x8(_mm256_srli_epi32(x0, 4)), a2);
            a3 = _mm256_fmadd_ps(ws, cvt_u8x8(_mm256_srli_epi32(x1, 4)), a3);
        }
        float *o = acc + g * 32;
        __m256 wm = _mm256_set1_ps(wmin);
        _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), _mm256_add_ps(a0, wm)));
        _mm256_storeu_ps(o + 8, _mm256_add_ps(_mm256_loadu_ps(o + 8), _mm256_add_ps(a1, wm)));
        _mm256_storeu_ps(o + 16, _mm256_add_ps(_mm256_loadu_ps(o + 16), _mm256_add_ps(a2, wm)));
        _mm256_storeu_ps(o + 24, _mm256_add_ps(_mm256_loadu_ps(o + 24), _mm256_add_ps(a3, wm)));
    }
}

/* q4h K (keys Hadamard-rotated, q is the rotated query): per token and group of 32 channels an exact
 * integer sum of int16 q x 4-bit code, then the reference's float steps in its order (scale per
 * group, min times the group's float sum of q), so the scores equal kv_format.c's bit for bit. A
 * group's 16 code bytes hold channels k (low nibble) and k + 16 (high nibble). Four tokens at a time.
 * Needs D % 32 == 0 (G = 32) and D <= KV_QMAX_D. */
static void dot_q4h_k(const kv_fmt *f, const uint8_t *head, int n, const float *q, float *row, float *scores) {
    int D = f->D, ng = D / 32, rb = D / 2, t = 0;
    (void)row;
    int16_t q16[KV_QMAX_D];
    float step = row_i16(q, D, q16), qsum[KV_QMAX_D / 32];
    for (int g = 0; g < ng; g++) {
        float sg = 0.0f;
        for (int c = g * 32; c < (g + 1) * 32; c++) sg += q[c];
        qsum[g] = sg;
    }
    const __m256i m4 = _mm256_set1_epi16(0x0f);
    const uint8_t *codes = head + f->code_off;
    const uint16_t *sm = (const uint16_t *)(head + f->scale_off);
    for (; t + 4 <= n; t += 4) {
        __m128 s = _mm_setzero_ps(), b = _mm_setzero_ps();
        for (int g = 0; g < ng; g++) {
            __m256i ql = _mm256_loadu_si256((const __m256i *)(q16 + g * 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(q16 + g * 32 + 16));
            __m256i a[4];
            for (int i = 0; i < 4; i++) {
                __m256i x = _mm256_cvtepu8_epi16(
                    _mm_loadu_si128((const __m128i *)(codes + (size_t)(t + i) * rb + (size_t)g * 16)));
                a[i] = _mm256_add_epi32(_mm256_madd_epi16(_mm256_and_si256(x, m4), ql),
                                        _mm256_madd_epi16(_mm256_srli_epi16(x, 4), qh));
            }
            const uint16_t *p0 = sm + ((size_t)t * ng + g) * 2, *p1 = p0 + 2 * ng, *p2 = p1 + 2 * ng, *p3 = p2 + 2 * ng;
            __m128 sc4 = _mm_setr_ps(_cvtsh_ss(p0[0]), _cvtsh_ss(p1[0]), _cvtsh_ss(p2[0]), _cvtsh_ss(p3[0]));
            __m128 mn4 = _mm_setr_ps(_cvtsh_ss(p0[1]), _cvtsh_ss(p1[1]), _cvtsh_ss(p2[1]), _cvtsh_ss(p3[1]));
            s = _mm_add_ps(s, _mm_mul_ps(_mm_cvtepi32_ps(hsum4_epi32(a[0], a[1], a[2], a[3])), sc4));
            b = _mm_add_ps(b, _mm_mul_ps(_mm_set1_ps(qsum[g]), mn4));
        }
        _mm_storeu_ps(scores + t, _mm_add_ps(_mm_mul_ps(s, _mm_set1_ps(step)), b));
    }
    for (; t < n; t++) {
        float s = 0.0f, b = 0.0f;
        for (int g = 0; g < ng; g++) {
            __m256i x =
                _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(codes + (size_t)t * rb + (size_t)g * 16)));
            __m256i a = _mm256_add_epi32(
                _mm256_madd_epi16(_mm256_and_si256(x, m4), _mm256_loadu_si256((const __m256i *)(q16 + g * 32))),
                _mm256_madd_epi16(_mm256_srli_epi16(x, 4), _mm256_loadu_si256((const __m256i *)(q16 + g * 32 + 16))));
            const uint16_t *pair = sm + ((size_t)t * ng + g) * 2;
            s += (float)hsum_epi32(a) * _cvtsh_ss(pair[0]);
            b += qsum[g] * _cvtsh_ss(pair[1]);
        }
        scores[t] = s * step + b;
    }
}

/* 2-bit V: a pass holds one 64-channel chunk (two groups of 32) in eight registers. */
static void acc_kivi2_v(const kv_fmt *f, const uint8_t *head, int n, const float *p, float *acc) {
    int D = f->D, rb = D / 4, ng = D / 32;
    const uint16_t *sm = (const uint16_t *)(head + f->scale_off);
    const __m256i m2 = _mm256_set1_epi32(3);
    for (int g = 0; g < ng; g += 2) {
        __m256 a[8];
        for (int i = 0; i < 8; i++) a[i] = _mm256_setzero_ps();
        float wmin0 = 0.0f, wmin1 = 0.0f;
        const uint8_t *codes = head + f->code_off + (size_t)g / 2 * 16;
        for (int t = 0; t < n; t++, codes += rb) {
            const uint16_t *pair = sm + ((size_t)t * ng + g) * 2;
            __m256 w0 = _mm256_set1_ps(p[t] * _cvtsh_ss(pair[0])), w1 = _mm256_set1_ps(p[t] * _cvtsh_ss(pair[2]));
            wmin0 += p[t] * _cvtsh_ss(pair[1]);
            wmin1 += p[t] * _cvtsh_ss(pair[3]);
            __m256i x0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)codes));
            __m256i x1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + 8)));
            a[0] = _mm256_fmadd_ps(w0, cvt_u8x8(_mm256_and_si256(x0, m2)), a[0]);
            a[1] = _mm256_fmadd_ps(w0, cvt_u8x8(_mm256_and_si256(x1, m2)), a[1]);
            a[2] = _mm256_fmadd_ps(w0, cvt_u8x8(_mm256_and_si256(_mm256_srli_epi32(x0, 2), m2)), a[2]);
            a[3] = _mm256_fmadd_ps(w0, cvt_u8x8(_mm256_and_si256(_mm256_srli_epi32(x1, 2), m2)), a[3]);
            a[4] = _mm256_fmadd_ps(w1, cvt_u8x8(_mm256_and_si256(_mm256_srli_epi32(x0, 4), m2)), a[4]);
            a[5] = _mm256_fmadd_ps(w1, cvt_u8x8(_mm256_and_si256(_mm256_srli_epi32(x1, 4), m2)), a[5]);
            a[6] = _mm256_fmadd_ps(w1, cvt_u8x8(_mm256_srli_epi32(x0, 6)), a[6]);
            a[7] = _mm256_fmadd_ps(w1, cvt_u8x8(_mm256_srli_epi32(x1, 6)), a[7]);
        }
        float *o = acc + g * 32;
        for (int i = 0; i < 8; i++) {
            __m256 wm = _mm256_set1_ps(i < 4 ? wmin0 : wmin1);
            _mm256_storeu_ps(o + 8 * i, _mm256_add_ps(_mm256_loadu_ps(o + 8 * i), _mm256_add_ps(a[i], wm)));
        }
    }
}

/* ---- Q4 / KIVI2 encoders: kv_lowbit_fit (kv_format.c) on 8 fits at once ---------------------------------
 * Lane l of every vector below is one fit, and it runs exactly the reference's operations in its
 * order (no contraction into FMA, min/max with the reference's operand order), so scales and codes
 * are bit for bit those of the scalar encoder. K: 8 channels of a block; V: 8 tokens of one group. */

#define RNE (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

static inline __m256 quant8(__m256 x, __m256 s, __m256 m, __m256 lv) { /* kv_quant */
    __m256 r = _mm256_round_ps(_mm256_div_ps(_mm256_sub_ps(x, m), s), RNE);
    r = _mm256_min_ps(_mm256_max_ps(r, _mm256_setzero_ps()), lv);
    return _mm256_and_ps(r, _mm256_cmp_ps(s, _mm256_setzero_ps(), _CMP_GT_OQ));
}

static __m256 fit_err8(const float *xt, int n, __m256 lv, __m256 s, __m256 m, __m128i *sh, __m128i *mh) {
    *sh = _mm256_cvtps_ph(_mm256_max_ps(s, _mm256_setzero_ps()), RNE);
    *mh = _mm256_cvtps_ph(m, RNE);
    __m256 sr = _mm256_cvtph_ps(*sh), mr = _mm256_cvtph_ps(*mh), e = _mm256_setzero_ps();
    for (int i = 0; i < n; i++) {
        __m256 x = _mm256_loadu_ps(xt + 8 * i);
        __m256 d = _mm256_sub_ps(x, _mm256_add_ps(_mm256_mul_ps(sr, quant8(x, sr, mr, lv)), mr));
        e = _mm256_add_ps(e, _mm256_mul_ps(d, d));
    }
    return e;
}

static inline __m128i blend_h8(__m128i a, __m128i b, __m256 mask) { /* lanes of b where mask */
    __m256i m = _mm256_castps_si256(mask);
    __m128i m16 = _mm_packs_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    return _mm_blendv_epi8(a, b, m16);
}

/* xt: [n][8]. Sets the 8 f16 scales and mins, returns the rounded values in *s, *m. */
static void fit8(const float *xt, int n, int bits, __m128i *s16, __m128i *m16, __m256 *s, __m256 *m) {
    const __m256 lv = _mm256_set1_ps((float)((1 << bits) - 1)), fn = _mm256_set1_ps((float)n);
    const __m256 zero = _mm256_setzero_ps();
    __m256 lo = _mm256_loadu_ps(xt), hi = lo;
    for (int i = 1; i < n; i++) {
        __m256 x = _mm256_loadu_ps(xt + 8 * i);
        lo = _mm256_min_ps(x, lo); /* x < lo ? x : lo */
        hi = _mm256_max_ps(x, hi); /* x > hi ? x : hi */
    }
    __m256 range = _mm256_sub_ps(hi, lo);
    __m128i bs, bm;
    __m256 best = fit_err8(xt, n, lv, _mm256_div_ps(range, lv), lo, &bs, &bm);
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) {
            __m256 l =
                _mm256_add_ps(lo, _mm256_div_ps(_mm256_mul_ps(range, _mm256_set1_ps((float)a)), _mm256_set1_ps(16.0f)));
            __m256 h =
                _mm256_sub_ps(hi, _mm256_div_ps(_mm256_mul_ps(range, _mm256_set1_ps((float)b)), _mm256_set1_ps(16.0f)));
            __m256 sc = _mm256_div_ps(_mm256_sub_ps(h, l), lv);
            __m256 sq = zero, sx = zero, sqq = zero, sqx = zero;
            for (int i = 0; i < n; i++) {
                __m256 x = _mm256_loadu_ps(xt + 8 * i), c = quant8(x, sc, l, lv);
                sq = _mm256_add_ps(sq, c);
                sx = _mm256_add_ps(sx, x);
                sqq = _mm256_add_ps(sqq, _mm256_mul_ps(c, c));
                sqx = _mm256_add_ps(sqx, _mm256_mul_ps(c, x));
            }
            __m256 det = _mm256_sub_ps(_mm256_mul_ps(fn, sqq), _mm256_mul_ps(sq, sq));
            __m256 s2 = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(fn, sqx), _mm256_mul_ps(sq, sx)), det);
            __m256 upd = _mm256_and_ps(_mm256_cmp_ps(det, zero, _CMP_GT_OQ), _mm256_cmp_ps(s2, zero, _CMP_GT_OQ));
            __m256 l2 = _mm256_div_ps(_mm256_sub_ps(sx, _mm256_mul_ps(s2, sq)), fn);
            sc = _mm256_blendv_ps(sc, s2, upd);
            l = _mm256_blendv_ps(l, l2, upd);
            __m128i cs, cm;
            __m256 e = fit_err8(xt, n, lv, sc, l, &cs, &cm);
            __m256 better = _mm256_cmp_ps(e, best, _CMP_LT_OQ);
            best = _mm256_blendv_ps(best, e, better);
            bs = blend_h8(bs, cs, better);
            bm = blend_h8(bm, cm, better);
        }
    *s16 = bs;
    *m16 = bm;
    *s = _mm256_cvtph_ps(bs);
    *m = _mm256_cvtph_ps(bm);
}

/* kv_format.c's kv_code_byte: where channel c's code sits in a token row, and its shift. */
static inline int code_byte(int D, int bits, int c, int *shift) {
    int per = 8 / bits, W = 16 * per, base = c - c % W;
    int w = D - base < W ? D - base : W, nb = w / per, r = c - base;
    *shift = (r / nb) * bits;
    return base / per + r % nb;
}

static void encb_lowbit_k(const kv_fmt *f, uint8_t *head, const uint16_t *stage) {
    int B = f->B, D = f->D, bits = f->bits, per = 8 / bits;
    uint16_t *sc = (uint16_t *)(head + f->scale_off);
    uint16_t *mn = sc + D;
    uint8_t *codes = head + f->code_off;
    const __m256 lv = _mm256_set1_ps((float)((1 << bits) - 1));
    float xt[256 * 8] = {0}; /* B <= 256 */
    int32_t q[8];
    memset(codes, 0, (size_t)B * D / per);
    for (int c0 = 0; c0 < D; c0 += 8) {
        for (int t = 0; t < B; t++) _mm256_storeu_ps(xt + 8 * t, load_f16x8(stage + (size_t)t * D + c0));
        __m128i s16, m16;
        __m256 s, m;
        fit8(xt, B, bits, &s16, &m16, &s, &m);
        _mm_storeu_si128((__m128i *)(sc + c0), s16);
        _mm_storeu_si128((__m128i *)(mn + c0), m16);
        int sh[8], byte[8];
        for (int l = 0; l < 8; l++) byte[l] = code_byte(D, bits, c0 + l, &sh[l]);
        for (int t = 0; t < B; t++) {
            _mm256_storeu_si256((__m256i *)q, _mm256_cvtps_epi32(quant8(_mm256_loadu_ps(xt + 8 * t), s, m, lv)));
            uint8_t *row = codes + (size_t)t * D / per;
            for (int l = 0; l < 8; l++) row[byte[l]] |= (uint8_t)(q[l] << sh[l]);
        }
    }
}

static void encb_lowbit_v(const kv_fmt *f, uint8_t *head, const uint16_t *stage) {
    int B = f->B, D = f->D, G = f->G, ng = D / G, bits = f->bits, per = 8 / bits;
    uint8_t *codes = head + f->code_off;
    uint16_t *sm = (uint16_t *)(head + f->scale_off);
    const __m256 lv = _mm256_set1_ps((float)((1 << bits) - 1));
    float xt[32 * 8] = {0}; /* G <= 32 */
    int32_t q[8];
    uint16_t s16[8], m16[8];
    memset(codes, 0, (size_t)B * D / per);
    for (int g = 0; g < ng; g++)
        for (int t0 = 0; t0 < B; t0 += 8) {
            for (int l = 0; l < 8; l++) { /* lanes past the block repeat its last token */
                const uint16_t *xg = stage + (size_t)(t0 + l < B ? t0 + l : B - 1) * D + g * G;
                for (int i = 0; i < G; i++) xt[8 * i + l] = _cvtsh_ss(xg[i]);
            }
            __m128i sh16, mh16;
            __m256 s, m;
            fit8(xt, G, bits, &sh16, &mh16, &s, &m);
            _mm_storeu_si128((__m128i *)s16, sh16);
            _mm_storeu_si128((__m128i *)m16, mh16);
            int nl = B - t0 < 8 ? B - t0 : 8;
            for (int l = 0; l < nl; l++) {
                sm[((size_t)(t0 + l) * ng + g) * 2] = s16[l];
                sm[((size_t)(t0 + l) * ng + g) * 2 + 1] = m16[l];
            }
            for (int i = 0; i < G; i++) {
                _mm256_storeu_si256((__m256i *)q, _mm256_cvtps_epi32(quant8(_mm256_loadu_ps(xt + 8 * i), s, m, lv)));
                int sh, byte = code_byte(D, bits, g * G + i, &sh);
                for (int l = 0; l < nl; l++) codes[(size_t)(t0 + l) * D / per + byte] |= (uint8_t)(q[l] << sh);
            }
        }
}

/* q4h: one token's ng = D / 32 groups of 32 channels as the lanes of fit8 (lanes past ng repeat the
 * last group), the reference's bytes exactly. x is the rotated key (K) or the value (V). Needs
 * D % 32 == 0 and D <= 256. */
static void enc_q4tok(const kv_fmt *f, uint8_t *head, int t, const float *x) {
    int D = f->D, ng = D / 32;
    uint8_t *row = head + f->code_off + (size_t)t * D / 2;
    uint16_t *sm = (uint16_t *)(head + f->scale_off) + (size_t)t * ng * 2;
    const __m256 lv = _mm256_set1_ps(15.0f);
    float xt[32 * 8];
    int32_t q[8];
    uint16_t s16[8], m16[8];
    for (int i = 0; i < 32; i++)
        for (int l = 0; l < 8; l++) xt[8 * i + l] = x[(l < ng ? l : ng - 1) * 32 + i];
    __m128i sh16, mh16;
    __m256 s, m;
    fit8(xt, 32, 4, &sh16, &mh16, &s, &m);
    _mm_storeu_si128((__m128i *)s16, sh16);
    _mm_storeu_si128((__m128i *)m16, mh16);
    for (int l = 0; l < ng; l++) {
        sm[2 * l] = s16[l];
        sm[2 * l + 1] = m16[l];
    }
    memset(row, 0, (size_t)D / 2);
    for (int i = 0; i < 32; i++) { /* channel l * 32 + i: byte l * 16 + i % 16, bits 4 * (i / 16) */
        _mm256_storeu_si256((__m256i *)q, _mm256_cvtps_epi32(quant8(_mm256_loadu_ps(xt + 8 * i), s, m, lv)));
        for (int l = 0; l < ng; l++) row[l * 16 + i % 16] |= (uint8_t)(q[l] << (4 * (i / 16)));
    }
}
static void enc_q4h_k(const kv_fmt *f, uint8_t *head, int t, const float *x) {
    float y[KV_QMAX_D];
    memcpy(y, x, (size_t)f->D * sizeof *y);
    if (f->rotate) kv_hadamard(y, f->D);
    enc_q4tok(f, head, t, y);
}

/* ---- softmax ------------------------------------------------------------------------------------- */

float kv_softmax_avx2(float *s, int n, float scale) {
    int n8 = n & ~7;
    __m256 vs = _mm256_set1_ps(scale), vmx = _mm256_set1_ps(-INFINITY);
    float mx = -INFINITY;
    for (int t = 0; t < n8; t += 8) {
        __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + t), vs);
        _mm256_storeu_ps(s + t, x);
        vmx = _mm256_max_ps(vmx, x);
    }
    for (int t = n8; t < n; t++) mx = fmaxf(mx, s[t] *= scale);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmx), _mm256_extractf128_ps(vmx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    mx = fmaxf(mx, _mm_cvtss_f32(m4));
    __m256 vm = _mm256_set1_ps(mx), vsum = _mm256_setzero_ps();
    for (int t = 0; t < n8; t += 8) {
        __m256 e = hr_exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(s + t), vm));
        _mm256_storeu_ps(s + t, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    float sum = hsum8(vsum);
    for (int t = n8; t < n; t++) sum += (s[t] = expf(s[t] - mx));
    return sum;
}

void kv_scale_round_f16_avx2(float *x, int n, float scale) {
    const __m256 vs = _mm256_set1_ps(scale);
    int t = 0;
    for (; t + 8 <= n; t += 8) {
        const __m128i h = _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(x + t), vs), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_ps(x + t, _mm256_cvtph_ps(h));
    }
    for (; t < n; t++) x[t] = _cvtsh_ss(_cvtss_sh(x[t] * scale, _MM_FROUND_TO_NEAREST_INT));
}

void kv_fmt_ops_avx2(const kv_fmt *f, kv_fmt_ops *ops) {
    switch (f->format) {
    case HR_KV_F32:
        ops->dot = dot_f32, ops->accum = acc_f32, ops->accum_first = accf_f32;
        if (f->D % 8 == 0) ops->dot_heads = dot_heads_f32, ops->accum_heads = acc_heads_f32;
        break;
    case HR_KV_F16:
        ops->dot = dot_f16, ops->accum = acc_f16, ops->accum_first = accf_f16;
        if (f->D % 8 == 0) ops->dot_heads = dot_heads_f16, ops->accum_heads = acc_heads_f16;
        break;
    case HR_KV_BF16:
        ops->dot = dot_bf16, ops->accum = acc_bf16, ops->accum_first = accf_bf16;
        if (f->D % 8 == 0) ops->dot_heads = dot_heads_bf16, ops->accum_heads = acc_heads_bf16;
        break;
    case HR_KV_Q8:
        ops->enc_token = enc_q8;
        ops->accum = acc_q8, ops->accum_first = accf_q8;
        if (f->G % 16 == 0 && f->D <= KV_QMAX_D)
            ops->dot = dot_q8, ops->dot_heads = dot_heads_q8, ops->accum_heads = acc_heads_q8;
        break;
    case HR_KV_FP8:
        ops->enc_token = enc_fp8;
        if (f->D % 16 == 0)
            ops->dot = dot_fp8_16, ops->accum = acc_fp8_16, ops->accum_first = accf_fp8_16;
        else
            ops->dot = dot_fp8, ops->accum = acc_fp8, ops->accum_first = accf_fp8;
        break;
    case HR_KV_Q4:
    case HR_KV_KIVI2:
        if (f->role == KV_K)
            ops->enc_block = encb_lowbit_k;
        else
            ops->enc_block = encb_lowbit_v;
        /* fast paths: whole 16-byte code chunks, one V group per 32 channels */
        if (f->D > KV_QMAX_D || f->D % (f->bits == 4 ? 32 : 64) != 0 || f->G != 32) break;
        if (f->role == KV_K)
            ops->dot = f->bits == 4 ? dot_q4_k : dot_kivi2_k;
        else
            ops->accum = f->bits == 4 ? acc_q4_v : acc_kivi2_v;
        break;
    case HR_KV_Q4H: /* fast paths: whole groups of 32 channels (V has q4's V layout) */
        if (f->D > KV_QMAX_D || f->D % 32 != 0 || f->G != 32) break;
        if (f->role == KV_K) {
            ops->dot = dot_q4h_k;
            if (!f->sym) ops->enc_token = enc_q4h_k; /* the symmetric test variant stays scalar */
        } else {
            ops->enc_token = enc_q4tok;
            ops->accum = acc_q4_v;
        }
        break;
    }
}

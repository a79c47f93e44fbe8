/* format_avx2.c: AVX2/FMA/F16C versions of the format kernels in format.c (same contracts; agree
 * with the scalar reference to 1e-5 relative). Compiled with -mavx2 -mfma -mf16c; called only when
 * the pool found those features at create. */
#include <immintrin.h>

#include "kv/kv_internal.h"

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- f32 / f16 / bf16 --------------------------------------------------------------------------- */

static inline __m256 load_f16x8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline __m256 load_bf16x8(const uint16_t *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

#define KV_DEF_FLOAT(name, T, LOAD, CVT)                                                                               \
    static void dot_##name(const kv_fmt *f, const uint8_t *head, int n, const float *q, float *row, float *scores) {   \
        int D = f->D, D8 = D & ~7;                                                                                     \
        const T *k = (const T *)head;                                                                                  \
        for (int t = 0; t < n; t++, k += D) {                                                                          \
            __m256 acc = _mm256_setzero_ps();                                                                          \
            for (int c = 0; c < D8; c += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), LOAD(k + c), acc);           \
            float s = hsum8(acc);                                                                                      \
            for (int c = D8; c < D; c++) s += q[c] * CVT(k[c]);                                                        \
            scores[t] = s;                                                                                             \
        }                                                                                                              \
    }                                                                                                                  \
    static void acc_##name(const kv_fmt *f, const uint8_t *head, int n, const float *p, float *acc) {                  \
        int D = f->D, D8 = D & ~7;                                                                                     \
        const T *v = (const T *)head;                                                                                  \
        for (int t = 0; t < n; t++, v += D) {                                                                          \
            __m256 w = _mm256_set1_ps(p[t]);                                                                           \
            for (int c = 0; c < D8; c += 8)                                                                            \
                _mm256_storeu_ps(acc + c, _mm256_fmadd_ps(w, LOAD(v + c), _mm256_loadu_ps(acc + c)));                  \
            for (int c = D8; c < D; c++) acc[c] += p[t] * CVT(v[c]);                                                   \
        }                                                                                                              \
    }

static inline float id_f32(float x) { return x; }
KV_DEF_FLOAT(f32, float, _mm256_loadu_ps, id_f32)
KV_DEF_FLOAT(f16, uint16_t, load_f16x8, kv_f16_to_f32)
KV_DEF_FLOAT(bf16, uint16_t, load_bf16x8, kv_bf16_to_f32)

void kv_fmt_ops_avx2(const kv_fmt *f, kv_fmt_ops *ops) {
    switch (f->format) {
    case HR_KV_F32: ops->dot = dot_f32, ops->accum = acc_f32; break;
    case HR_KV_F16: ops->dot = dot_f16, ops->accum = acc_f16; break;
    case HR_KV_BF16: ops->dot = dot_bf16, ops->accum = acc_bf16; break;
    default: break;
    }
}

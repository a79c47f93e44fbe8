/* format_avx2.c: AVX2/FMA/F16C versions of the format kernels in format.c (same contracts; agree
 * with the scalar reference to 1e-5 relative). Compiled with -mavx2 -mfma -mf16c; called only when
 * the pool found those features at create. */
#include <immintrin.h>
#include <string.h>

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

/* ---- Q8 ------------------------------------------------------------------------------------------ */

static inline __m256 load_i8x8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

static void dot_q8(const kv_fmt *f, const uint8_t *head, int n, const float *q, float *row, float *scores) {
    int D = f->D, G = f->G, ng = D / G;
    for (int t = 0; t < n; t++) {
        const int8_t *qs = (const int8_t *)head + (size_t)t * D;
        const uint16_t *sc = (const uint16_t *)(head + f->scale_off) + (size_t)t * ng;
        __m256 acc = _mm256_setzero_ps();
        for (int g = 0; g < ng; g++) {
            __m256 part = _mm256_setzero_ps();
            for (int c = g * G; c < g * G + G; c += 8)
                part = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), load_i8x8(qs + c), part);
            acc = _mm256_fmadd_ps(part, _mm256_set1_ps(kv_f16_to_f32(sc[g])), acc);
        }
        scores[t] = hsum8(acc);
    }
}

static void acc_q8(const kv_fmt *f, const uint8_t *head, int n, const float *p, float *acc) {
    int D = f->D, G = f->G, ng = D / G;
    for (int t = 0; t < n; t++) {
        const int8_t *qs = (const int8_t *)head + (size_t)t * D;
        const uint16_t *sc = (const uint16_t *)(head + f->scale_off) + (size_t)t * ng;
        for (int g = 0; g < ng; g++) {
            __m256 w = _mm256_set1_ps(p[t] * kv_f16_to_f32(sc[g]));
            for (int c = g * G; c < g * G + G; c += 8)
                _mm256_storeu_ps(acc + c, _mm256_fmadd_ps(w, load_i8x8(qs + c), _mm256_loadu_ps(acc + c)));
        }
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
    int D = f->D;
    for (int t = 0; t < n; t++) {
        const uint8_t *qs = head + (size_t)t * D;
        float sc;
        memcpy(&sc, head + f->scale_off + (size_t)t * 4, 4);
        __m256 acc = _mm256_setzero_ps();
        for (int c = 0; c < D; c += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), load_e4m3x8(qs + c), acc);
        scores[t] = hsum8(acc) * sc;
    }
}

static void acc_fp8(const kv_fmt *f, const uint8_t *head, int n, const float *p, float *acc) {
    int D = f->D;
    for (int t = 0; t < n; t++) {
        const uint8_t *qs = head + (size_t)t * D;
        float sc;
        memcpy(&sc, head + f->scale_off + (size_t)t * 4, 4);
        __m256 w = _mm256_set1_ps(p[t] * sc);
        for (int c = 0; c < D; c += 8)
            _mm256_storeu_ps(acc + c, _mm256_fmadd_ps(w, load_e4m3x8(qs + c), _mm256_loadu_ps(acc + c)));
    }
}

/* ---- Q4 / KIVI2: 8 channels' codes are 8*bits consecutive bits; a variable shift spreads them ---- */

static inline __m256 load_codes8(const uint8_t *codes, int bits, int c, __m256i shifts, __m256i mask) {
    uint32_t x = 0;
    memcpy(&x, codes + c * bits / 8, (size_t)bits); /* 8 codes = `bits` bytes */
    __m256i v = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)x), shifts), mask);
    return _mm256_cvtepi32_ps(v);
}

static inline __m256i code_shifts(int bits) {
    return bits == 4 ? _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28) : _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
}

static void dot_lowbit_k(const kv_fmt *f, const uint8_t *head, int n, const float *q, float *row, float *scores) {
    int D = f->D, bits = f->bits;
    const uint16_t *sc = (const uint16_t *)(head + f->scale_off);
    const uint16_t *mn = sc + D;
    __m256 vb = _mm256_setzero_ps();
    for (int c = 0; c < D; c += 8) {
        __m256 qv = _mm256_loadu_ps(q + c);
        _mm256_storeu_ps(row + c, _mm256_mul_ps(qv, load_f16x8(sc + c)));
        vb = _mm256_fmadd_ps(qv, load_f16x8(mn + c), vb);
    }
    float bias = hsum8(vb);
    __m256i shifts = code_shifts(bits), mask = _mm256_set1_epi32((1 << bits) - 1);
    for (int t = 0; t < n; t++) {
        const uint8_t *codes = head + f->code_off + (size_t)t * D * bits / 8;
        __m256 acc = _mm256_setzero_ps();
        for (int c = 0; c < D; c += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(row + c), load_codes8(codes, bits, c, shifts, mask), acc);
        scores[t] = hsum8(acc) + bias;
    }
}

static void acc_lowbit_v(const kv_fmt *f, const uint8_t *head, int n, const float *p, float *acc) {
    int D = f->D, G = f->G, ng = D / G, bits = f->bits;
    const uint16_t *sm = (const uint16_t *)(head + f->scale_off);
    __m256i shifts = code_shifts(bits), mask = _mm256_set1_epi32((1 << bits) - 1);
    for (int t = 0; t < n; t++) {
        const uint8_t *codes = head + f->code_off + (size_t)t * D * bits / 8;
        for (int g = 0; g < ng; g++) {
            const uint16_t *pair = sm + ((size_t)t * ng + g) * 2;
            __m256 ws = _mm256_set1_ps(p[t] * kv_f16_to_f32(pair[0]));
            __m256 wm = _mm256_set1_ps(p[t] * kv_f16_to_f32(pair[1]));
            for (int c = g * G; c < g * G + G; c += 8) {
                __m256 a = _mm256_add_ps(_mm256_loadu_ps(acc + c), wm);
                _mm256_storeu_ps(acc + c, _mm256_fmadd_ps(ws, load_codes8(codes, bits, c, shifts, mask), a));
            }
        }
    }
}

void kv_fmt_ops_avx2(const kv_fmt *f, kv_fmt_ops *ops) {
    switch (f->format) {
    case HR_KV_F32: ops->dot = dot_f32, ops->accum = acc_f32; break;
    case HR_KV_F16: ops->dot = dot_f16, ops->accum = acc_f16; break;
    case HR_KV_BF16: ops->dot = dot_bf16, ops->accum = acc_bf16; break;
    case HR_KV_Q8: ops->dot = dot_q8, ops->accum = acc_q8; break;
    case HR_KV_FP8: ops->dot = dot_fp8, ops->accum = acc_fp8; break;
    case HR_KV_Q4:
    case HR_KV_KIVI2:
        if (f->role == KV_K)
            ops->dot = dot_lowbit_k;
        else
            ops->accum = acc_lowbit_v;
        break;
    }
}

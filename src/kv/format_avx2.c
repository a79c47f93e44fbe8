/* format_avx2.c: AVX2/FMA/F16C versions of the format kernels in format.c (same contracts; agree
 * with the scalar reference to 1e-5 relative). Compiled with -mavx2 -mfma -mf16c; called only when
 * the pool found those features at create. */
#include <immintrin.h>
#include <math.h>
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
    static void acc_##name(const kv_fmt *f, const uint8_t *head, int n, const float *p, float *acc) {                  \
        int D = f->D, D8 = D & ~7;                                                                                     \
        const T *v = (const T *)head;                                                                                  \
        for (int c0 = 0; c0 < D8; c0 += 32) {                                                                          \
            int w = (D8 - c0 >= 32 ? 32 : D8 - c0) / 8;                                                                \
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
        for (int t = 0; t < n && D8 < D; t++)                                                                          \
            for (int c = D8; c < D; c++) acc[c] += p[t] * CVT(v[(size_t)t * D + c]);                                   \
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
    const uint16_t *sc = (const uint16_t *)(head + f->scale_off);
    for (int c0 = 0; c0 < D; c0 += 32) {
        int w = (D - c0 >= 32 ? 32 : D - c0) / 8;
        __m256 a[4];
        for (int i = 0; i < 4; i++) a[i] = i < w ? _mm256_loadu_ps(acc + c0 + 8 * i) : _mm256_setzero_ps();
        for (int t = 0; t < n; t++) {
            const int8_t *qs = (const int8_t *)head + (size_t)t * D + c0;
            const uint16_t *st = sc + (size_t)t * ng;
            for (int i = 0; i < 4; i++)
                if (i < w) {
                    __m256 wv = _mm256_set1_ps(p[t] * kv_f16_to_f32(st[(c0 + 8 * i) / G]));
                    a[i] = _mm256_fmadd_ps(wv, load_i8x8(qs + 8 * i), a[i]);
                }
        }
        for (int i = 0; i < w; i++) _mm256_storeu_ps(acc + c0 + 8 * i, a[i]);
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

static void acc_fp8(const kv_fmt *f, const uint8_t *head, int n, const float *p, float *acc) {
    int D = f->D;
    const float *sc = (const float *)(head + f->scale_off);
    for (int c0 = 0; c0 < D; c0 += 32) {
        int w = (D - c0 >= 32 ? 32 : D - c0) / 8;
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

/* ---- Q4 / KIVI2: 8 channels' codes are 8*bits consecutive bits; a variable shift spreads them ---- */

static inline __m256 codes8_u4(const uint8_t *p) { /* 4 bytes -> 8 nibbles, low nibble first */
    uint32_t x;
    memcpy(&x, p, 4);
    __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32((int)x), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(0xf)));
}
static inline __m256 codes8_u2(const uint8_t *p) { /* 2 bytes -> 8 crumbs, lowest bits first */
    uint16_t x;
    memcpy(&x, p, 2);
    __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32((int)x), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
    return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(0x3)));
}
static inline __m256 load_codes8(const uint8_t *codes, int bits, int c) {
    return bits == 4 ? codes8_u4(codes + c / 2) : codes8_u2(codes + c / 4);
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
    for (int t = 0; t < n; t++) {
        const uint8_t *codes = head + f->code_off + (size_t)t * D * bits / 8;
        __m256 acc = _mm256_setzero_ps();
        if (bits == 4)
            for (int c = 0; c < D; c += 8)
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(row + c), codes8_u4(codes + c / 2), acc);
        else
            for (int c = 0; c < D; c += 8)
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(row + c), codes8_u2(codes + c / 4), acc);
        scores[t] = hsum8(acc) + bias;
    }
}

static void acc_lowbit_v(const kv_fmt *f, const uint8_t *head, int n, const float *p, float *acc) {
    int D = f->D, G = f->G, ng = D / G, bits = f->bits;
    const uint16_t *sm = (const uint16_t *)(head + f->scale_off);
    for (int c0 = 0; c0 < D; c0 += 32) {
        int w = (D - c0 >= 32 ? 32 : D - c0) / 8;
        __m256 a[4];
        for (int i = 0; i < 4; i++) a[i] = i < w ? _mm256_loadu_ps(acc + c0 + 8 * i) : _mm256_setzero_ps();
        for (int t = 0; t < n; t++) {
            const uint8_t *codes = head + f->code_off + (size_t)t * D * bits / 8;
            for (int i = 0; i < 4; i++)
                if (i < w) {
                    int c = c0 + 8 * i;
                    const uint16_t *pair = sm + ((size_t)t * ng + c / G) * 2;
                    __m256 ws = _mm256_set1_ps(p[t] * kv_f16_to_f32(pair[0]));
                    __m256 wm = _mm256_set1_ps(p[t] * kv_f16_to_f32(pair[1]));
                    a[i] = _mm256_fmadd_ps(ws, load_codes8(codes, bits, c), _mm256_add_ps(a[i], wm));
                }
        }
        for (int i = 0; i < w; i++) _mm256_storeu_ps(acc + c0 + 8 * i, a[i]);
    }
}

/* ---- softmax ------------------------------------------------------------------------------------- */

/* exp for x <= 0 (after the max is subtracted): Cody-Waite reduction by ln 2 and a degree-6
 * polynomial (the Cephes expf coefficients); about 1 ulp. Below -87.3 the result is clamped there. */
static inline __m256 exp_neg(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

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
        __m256 e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(s + t), vm));
        _mm256_storeu_ps(s + t, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    float sum = hsum8(vsum);
    for (int t = n8; t < n; t++) sum += (s[t] = expf(s[t] - mx));
    return sum;
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

/* kv_format.c: the CPU storage's scalar reference kernels for every KV format (encode, fused
 * dequantize-and-dot for q.K, fused weighted accumulate for P.V), over the layouts kv/format.c
 * describes (kv/kv_format.h).
 *
 * The scalar kernels are the definition of correct, and kv_format_avx2.c gives their bits exactly
 * (test_kv_formats), so --isa scalar and the AVX2 kernels attend alike. Where the AVX2 kernels sum
 * floats, these follow the same sequence: 8 lanes (lane l takes channels l, l + 8, ...) with fmaf,
 * the AVX2 horizontal reductions (kv_hsum8 / kv_hsum8x4 below, chosen by the token's place as the
 * AVX2 kernel groups tokens by four), P.V as fmaf per channel and token. Built with contraction off
 * (ISO C for gcc, the pragma below for clang), so a * b + c stays two roundings where written so.
 * Quantized blocks are never expanded: a dot
 * reads codes and scales and multiplies as it goes; the only temporary is one head-row (D floats):
 * for q8, q4 and kivi2 the query (times the per-channel K scales for q4/kivi2) rounded to int16 once
 * per block, so that every token's dot is an exact integer sum, identical in every kernel.
 *
 * Packed codes (per = 8/bits codes a byte): a token row is cut into chunks of 16 bytes (32 channels
 * at 4 bits, 64 at 2; the last chunk may be narrower); in a chunk of w channels, byte k holds
 * channels k, k + w/per, ... at bits 0, bits, ... (kv_code_byte). One 16-byte load then unpacks into
 * runs of 16 consecutive channels with one shift and mask each, no shuffles. */
#include <math.h>
#include <string.h>

#include "backend/cpu/kv_cpu.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* The two horizontal sums of an 8-lane register that kv_format_avx2.c uses: hsum8 (extract, movehl,
 * movehdup) for a token alone and hsum4's hadd tree for tokens taken four at a time. */
static inline float kv_hsum8(const float *l) {
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}
static inline float kv_hsum8x4(const float *l) {
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

uint8_t kv_f32_to_e4m3(float x) {
    uint8_t sign = (x < 0.0f || (x == 0.0f && signbit(x))) ? 0x80u : 0u;
    float v = fabsf(x);
    if (!(v == v)) return 0; /* NaN: encoders never see one from finite input; store zero */
    if (v >= 448.0f) return (uint8_t)(sign | 0x7eu);
    if (v < 0x1p-6f) { /* subnormal range: steps of 2^-9; q == 8 is the smallest normal */
        int q = (int)rintf(v * 512.0f);
        return (uint8_t)(sign | q);
    }
    int ex;
    float fr = frexpf(v, &ex); /* v = fr * 2^ex, fr in [0.5, 1) */
    int E = ex - 1;
    int q = (int)rintf((fr * 2.0f - 1.0f) * 8.0f);
    if (q == 8) {
        q = 0;
        E++;
    }
    int code = ((E + 7) << 3) | q;
    if (code > 0x7e) code = 0x7e;
    return (uint8_t)(sign | code);
}

/* ---- plain float formats ----------------------------------------------------------------------- */

static void enc_f32(const kv_fmt *f, uint8_t *head, int t, const float *x) {
    memcpy(head + (size_t)t * f->D * 4, x, (size_t)f->D * 4);
}
static void enc_f16(const kv_fmt *f, uint8_t *head, int t, const float *x) {
    uint16_t *d = (uint16_t *)head + (size_t)t * f->D;
    for (int c = 0; c < f->D; c++) d[c] = kv_f32_to_f16(x[c]);
}
static void enc_bf16(const kv_fmt *f, uint8_t *head, int t, const float *x) {
    uint16_t *d = (uint16_t *)head + (size_t)t * f->D;
    for (int c = 0; c < f->D; c++) d[c] = kv_f32_to_bf16(x[c]);
}

/* q.k in kv_format_avx2.c's order: channels below D8 in 8 fmaf lanes, the reduction of the token's
 * place (tokens below n & ~3 went four at a time), then the channels past D8 one by one. P.V: per
 * channel below D8 one fmaf per token, past it a multiply and an add. */
#define KV_REF_FLOAT(name, T, CVT)                                                                                     \
    static void dot_##name(const kv_fmt *f, const uint8_t *head, int n, const float *q, float *row, float *scores) {   \
        int D = f->D, D8 = D & ~7, n4 = n & ~3;                                                                        \
        const T *k = (const T *)head;                                                                                  \
        for (int t = 0; t < n; t++, k += D) {                                                                          \
            float l[8] = {0};                                                                                          \
            for (int c = 0; c < D8; c += 8)                                                                            \
                for (int i = 0; i < 8; i++) l[i] = fmaf(q[c + i], CVT(k[c + i]), l[i]);                                \
            float s = t < n4 ? kv_hsum8x4(l) : kv_hsum8(l);                                                            \
            for (int c = D8; c < D; c++) s += q[c] * CVT(k[c]);                                                        \
            scores[t] = s;                                                                                             \
        }                                                                                                              \
    }                                                                                                                  \
    static void accf_##name(const kv_fmt *f, const uint8_t *head, int n, const float *p, int nc, float *acc) {         \
        int D = f->D, D8 = D & ~7, E8 = nc < D8 ? nc : D8;                                                             \
        const T *v = (const T *)head;                                                                                  \
        for (int t = 0; t < n; t++, v += D) {                                                                          \
            for (int c = 0; c < E8; c++) acc[c] = fmaf(p[t], CVT(v[c]), acc[c]);                                       \
            for (int c = D8; c < nc; c++) acc[c] += p[t] * CVT(v[c]);                                                  \
        }                                                                                                              \
    }                                                                                                                  \
    static void acc_##name(const kv_fmt *f, const uint8_t *head, int n, const float *p, float *acc) {                  \
        accf_##name(f, head, n, p, f->D, acc);                                                                         \
    }

static inline float kv_id(float x) { return x; }
KV_REF_FLOAT(f32, float, kv_id)
KV_REF_FLOAT(f16, uint16_t, kv_f16_to_f32)
KV_REF_FLOAT(bf16, uint16_t, kv_bf16_to_f32)

static inline int kv_q16(float x, float inv) {
    float r = rintf(x * inv);
    return r > 32767.0f ? 32767 : r < -32767.0f ? -32767 : (int)r;
}

/* ---- Q8: symmetric int8, per token and group --------------------------------------------------- */

static void enc_q8(const kv_fmt *f, uint8_t *head, int t, const float *x) {
    int ng = f->D / f->G;
    int8_t *qs = (int8_t *)head + (size_t)t * f->D;
    uint16_t *sc = (uint16_t *)(head + f->scale_off) + (size_t)t * ng;
    for (int g = 0; g < ng; g++) {
        const float *xg = x + g * f->G;
        float amax = 0.0f;
        for (int c = 0; c < f->G; c++) amax = fmaxf(amax, fabsf(xg[c]));
        uint16_t s16 = kv_f32_to_f16(amax / 127.0f);
        float s = kv_f16_to_f32(s16);
        float inv = s > 0.0f ? 1.0f / s : 0.0f;
        for (int c = 0; c < f->G; c++) {
            float r = rintf(xg[c] * inv);
            qs[g * f->G + c] = (int8_t)fmaxf(-127.0f, fminf(127.0f, r));
        }
        sc[g] = s16;
    }
}
/* q is rounded to int16 once per block against its largest magnitude (a step of amax / 32767, far
 * below the int8 codes' own error), so each group's sum is exact integer arithmetic: the same in
 * every kernel, which lets the SIMD kernel use integer multiply-adds and match this bit for bit. */
static void dot_q8(const kv_fmt *f, const uint8_t *head, int n, const float *q, float *row, float *scores) {
    int ng = f->D / f->G;
    float amax = 0.0f;
    for (int c = 0; c < f->D; c++) amax = fmaxf(amax, fabsf(q[c]));
    float inv = amax > 0.0f ? 32767.0f / amax : 0.0f, step = amax / 32767.0f;
    for (int c = 0; c < f->D; c++) row[c] = (float)kv_q16(q[c], inv); /* exact integers */
    for (int t = 0; t < n; t++) {
        const int8_t *qs = (const int8_t *)head + (size_t)t * f->D;
        const uint16_t *sc = (const uint16_t *)(head + f->scale_off) + (size_t)t * ng;
        float s = 0.0f;
        for (int g = 0; g < ng; g++) {
            int32_t sg = 0;
            for (int c = g * f->G; c < (g + 1) * f->G; c++) sg += (int32_t)row[c] * qs[c];
            s += (float)sg * kv_f16_to_f32(sc[g]);
        }
        scores[t] = s * step;
    }
}
static void accf_q8(const kv_fmt *f, const uint8_t *head, int n, const float *p, int nc, float *acc) {
    int ng = f->D / f->G;
    for (int t = 0; t < n; t++) {
        const int8_t *qs = (const int8_t *)head + (size_t)t * f->D;
        const uint16_t *sc = (const uint16_t *)(head + f->scale_off) + (size_t)t * ng;
        for (int g = 0; g < ng && g * f->G < nc; g++) {
            float w = p[t] * kv_f16_to_f32(sc[g]);
            int ce = nc - g * f->G < f->G ? nc - g * f->G : f->G;
            for (int c = 0; c < ce; c++) acc[g * f->G + c] = fmaf(w, (float)qs[g * f->G + c], acc[g * f->G + c]);
        }
    }
}
static void acc_q8(const kv_fmt *f, const uint8_t *head, int n, const float *p, float *acc) {
    accf_q8(f, head, n, p, f->D, acc);
}

/* ---- FP8 e4m3, per token and head scale -------------------------------------------------------- */

static void enc_fp8(const kv_fmt *f, uint8_t *head, int t, const float *x) {
    uint8_t *qs = head + (size_t)t * f->D;
    float amax = 0.0f;
    for (int c = 0; c < f->D; c++) amax = fmaxf(amax, fabsf(x[c]));
    float s = amax / 448.0f;
    float inv = s > 0.0f ? 1.0f / s : 0.0f;
    for (int c = 0; c < f->D; c++) qs[c] = kv_f32_to_e4m3(x[c] * inv);
    memcpy(head + f->scale_off + (size_t)t * 4, &s, 4);
}
/* kv_format_avx2.c reads codes at head_dim % 16 == 0 as f16 bits, the value times 2^-8 exactly, and
 * moves the 2^8 into the token's scale (sc * 256); else as they are. The same here, so the same
 * products and sums: 8 fmaf lanes, the AVX2 reduction, then times the scale. */
static void dot_fp8(const kv_fmt *f, const uint8_t *head, int n, const float *q, float *row, float *scores) {
    int D = f->D, n4 = n & ~3;
    bool wide = D % 16 == 0;
    float ks = wide ? 0x1p-8f : 1.0f;
    for (int t = 0; t < n; t++) {
        const uint8_t *qs = head + (size_t)t * D;
        float sc;
        memcpy(&sc, head + f->scale_off + (size_t)t * 4, 4);
        float l[8] = {0};
        for (int c = 0; c < D; c += 8)
            for (int i = 0; i < 8; i++) l[i] = fmaf(q[c + i], kv_e4m3_to_f32(qs[c + i]) * ks, l[i]);
        float s = t < n4 ? kv_hsum8x4(l) : kv_hsum8(l);
        scores[t] = s * (wide ? sc * 256.0f : sc);
    }
}
static void accf_fp8(const kv_fmt *f, const uint8_t *head, int n, const float *p, int nc, float *acc) {
    int D = f->D;
    bool wide = D % 16 == 0;
    float ks = wide ? 0x1p-8f : 1.0f;
    for (int t = 0; t < n; t++) {
        const uint8_t *qs = head + (size_t)t * D;
        float sc;
        memcpy(&sc, head + f->scale_off + (size_t)t * 4, 4);
        float w = p[t] * (wide ? sc * 256.0f : sc);
        for (int c = 0; c < nc; c++) acc[c] = fmaf(w, kv_e4m3_to_f32(qs[c]) * ks, acc[c]);
    }
}
static void acc_fp8(const kv_fmt *f, const uint8_t *head, int n, const float *p, float *acc) {
    accf_fp8(f, head, n, p, f->D, acc);
}

/* ---- Q4 / KIVI2: asymmetric low-bit codes ------------------------------------------------------ */

/* Where channel c's code sits in a token row (see the layout at the top): the byte, and the shift in
 * *shift. Chunks of 16 bytes hold W = 16 * per channels; a narrower last chunk of w channels (a
 * multiple of 8) holds w / per bytes; byte k of a chunk of w channels holds channels k + i * (w / per)
 * at bit i * bits. So 16 bytes zero-extended to 16-bit lanes give, shift by shift, 16 consecutive
 * channels (kv_format_avx2.c). */
static inline int kv_code_byte(int D, int bits, int c, int *shift) {
    int per = 8 / bits, W = 16 * per, base = c - c % W;
    int w = D - base < W ? D - base : W, nb = w / per, r = c - base;
    *shift = (r / nb) * bits;
    return base / per + r % nb;
}
static inline int kv_code(const uint8_t *codes, int D, int bits, int c) {
    int sh, byte = kv_code_byte(D, bits, c, &sh);
    return (codes[byte] >> sh) & ((1 << bits) - 1);
}
static inline void kv_code_put(uint8_t *codes, int D, int bits, int c, int code) {
    int sh, byte = kv_code_byte(D, bits, c, &sh);
    codes[byte] |= (uint8_t)(code << sh);
}

static inline int kv_quant(float x, float s, float m, int levels) {
    if (s <= 0.0f) return 0;
    float r = rintf((x - m) / s);
    return r < 0.0f ? 0 : r > (float)levels ? levels : (int)r;
}

/* Squared error of x[0..n) coded against (s, m) stored as f16 (s16, m16 are set). */
static float kv_fit_err(const float *x, int n, int levels, float s, float m, uint16_t *s16, uint16_t *m16) {
    *s16 = kv_f32_to_f16(s > 0.0f ? s : 0.0f);
    *m16 = kv_f32_to_f16(m);
    float sr = kv_f16_to_f32(*s16), mr = kv_f16_to_f32(*m16), e = 0.0f;
    for (int i = 0; i < n; i++) {
        float d = x[i] - (sr * (float)kv_quant(x[i], sr, mr, levels) + mr);
        e += d * d;
    }
    return e;
}

/* Scale and min (f16) for x[0..n) at `bits`: the plain min-max range, and ranges clipped by up to
 * 3/16 of it at either end, each refined once by least squares on its codes; the candidate with the
 * smallest squared error wins (ties: the earlier, so min-max when nothing helps). Codes are then
 * computed against the rounded values, so decode(encode(x)) is as close as the stored scales allow.
 * On stories260K this takes kivi2 from +20% to +12% perplexity and q4 from +0.52% to +0.28%.
 * kv_format_avx2.c runs the same operations in the same order on 8 fits at once (same codes): keep
 * the two in step. */
static void kv_lowbit_fit(const float *x, int n, int bits, uint16_t *s16, uint16_t *m16, float *s, float *m) {
    int levels = (1 << bits) - 1;
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    float range = hi - lo;
    float best = kv_fit_err(x, n, levels, range / (float)levels, lo, s16, m16);
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) {
            float l = lo + range * (float)a / 16.0f, h = hi - range * (float)b / 16.0f;
            float sc = (h - l) / (float)levels;
            /* least squares on the codes this range gives: x ~ s2 * code + l2 (sums exact in float) */
            float sq = 0.0f, sx = 0.0f, sqq = 0.0f, sqx = 0.0f;
            for (int i = 0; i < n; i++) {
                float c = (float)kv_quant(x[i], sc, l, levels);
                sq += c;
                sx += x[i];
                sqq += c * c;
                sqx += c * x[i];
            }
            float det = (float)n * sqq - sq * sq;
            if (det > 0.0f) {
                float s2 = ((float)n * sqx - sq * sx) / det;
                if (s2 > 0.0f) {
                    sc = s2;
                    l = (sx - s2 * sq) / (float)n;
                }
            }
            uint16_t cs, cm;
            float e = kv_fit_err(x, n, levels, sc, l, &cs, &cm);
            if (e < best) {
                best = e;
                *s16 = cs;
                *m16 = cm;
            }
        }
    *s = kv_f16_to_f32(*s16);
    *m = kv_f16_to_f32(*m16);
}

/* K per channel over the staged block. */
static void encb_lowbit_k(const kv_fmt *f, uint8_t *head, const uint16_t *stage) {
    int B = f->B, D = f->D, bits = f->bits, per = 8 / bits, levels = (1 << bits) - 1;
    uint16_t *sc = (uint16_t *)(head + f->scale_off);
    uint16_t *mn = sc + D;
    uint8_t *codes = head + f->code_off;
    float x[256]; /* B <= 256 */
    memset(codes, 0, (size_t)B * D / per);
    for (int c = 0; c < D; c++) {
        for (int t = 0; t < B; t++) x[t] = kv_f16_to_f32(stage[(size_t)t * D + c]);
        float s, m;
        kv_lowbit_fit(x, B, bits, &sc[c], &mn[c], &s, &m);
        for (int t = 0; t < B; t++) kv_code_put(codes + (size_t)t * D / per, D, bits, c, kv_quant(x[t], s, m, levels));
    }
}

/* q . k_t = sum_c q[c] * (scale[c] * code[t][c] + min[c]) = sum_c q'[c] * code[t][c] + bias with
 * q' = q * scale. q' is rounded once per block to int16 against its largest magnitude (a step of
 * amax / 32767, far below the codes' own error), so each token's sum is exact integer arithmetic: the
 * same in every kernel and whatever the order, which lets SIMD kernels use integer multiply-adds. */
static float kv_qrow_step(const kv_fmt *f, const uint8_t *head, const float *q, float *inv, float *bias) {
    const uint16_t *sc = (const uint16_t *)(head + f->scale_off);
    const uint16_t *mn = sc + f->D;
    float amax = 0.0f, l[8] = {0}; /* the bias in kv_format_avx2.c's order: 8 fmaf lanes, hsum8 */
    for (int c = 0; c < f->D; c++) {
        amax = fmaxf(amax, fabsf(q[c] * kv_f16_to_f32(sc[c])));
        l[c % 8] = fmaf(q[c], kv_f16_to_f32(mn[c]), l[c % 8]);
    }
    *bias = kv_hsum8(l);
    *inv = amax > 0.0f ? 32767.0f / amax : 0.0f;
    return amax / 32767.0f;
}
static void dot_lowbit_k(const kv_fmt *f, const uint8_t *head, int n, const float *q, float *row, float *scores) {
    int D = f->D, bits = f->bits, per = 8 / bits;
    const uint16_t *sc = (const uint16_t *)(head + f->scale_off);
    float inv, bias, step = kv_qrow_step(f, head, q, &inv, &bias);
    for (int c = 0; c < D; c++) row[c] = (float)kv_q16(q[c] * kv_f16_to_f32(sc[c]), inv); /* exact integers */
    for (int t = 0; t < n; t++) {
        const uint8_t *codes = head + f->code_off + (size_t)t * D / per;
        int32_t s = 0;
        for (int c = 0; c < D; c++) s += (int32_t)row[c] * kv_code(codes, D, bits, c);
        scores[t] = (float)s * step + bias;
    }
}

/* V per token in groups of G: one (scale, min) pair per group. */
static void encb_lowbit_v(const kv_fmt *f, uint8_t *head, const uint16_t *stage) {
    int B = f->B, D = f->D, G = f->G, ng = D / G, bits = f->bits, per = 8 / bits, levels = (1 << bits) - 1;
    uint8_t *codes = head + f->code_off;
    uint16_t *sm = (uint16_t *)(head + f->scale_off);
    float x[32]; /* G <= 32 */
    memset(codes, 0, (size_t)B * D / per);
    for (int t = 0; t < B; t++) {
        for (int g = 0; g < ng; g++) {
            const uint16_t *xg = stage + (size_t)t * D + g * G;
            for (int c = 0; c < G; c++) x[c] = kv_f16_to_f32(xg[c]);
            float s, m;
            uint16_t *pair = sm + ((size_t)t * ng + g) * 2;
            kv_lowbit_fit(x, G, bits, &pair[0], &pair[1], &s, &m);
            for (int c = 0; c < G; c++)
                kv_code_put(codes + (size_t)t * D / per, D, bits, g * G + c, kv_quant(x[c], s, m, levels));
        }
    }
}
static void acc_lowbit_v(const kv_fmt *f, const uint8_t *head, int n, const float *p, float *acc) {
    int D = f->D, G = f->G, ng = D / G, bits = f->bits, per = 8 / bits;
    const uint16_t *sm = (const uint16_t *)(head + f->scale_off);
    /* kv_format_avx2.c's order: per group, the codes' fmaf sums and the mins' sum run apart from
     * zero over the tokens, then acc + (codes' sum + mins' sum) */
    for (int g = 0; g < ng; g++) {
        float a[32] = {0}, wm = 0.0f; /* G <= 32 */
        for (int t = 0; t < n; t++) {
            const uint8_t *codes = head + f->code_off + (size_t)t * D / per;
            const uint16_t *pair = sm + ((size_t)t * ng + g) * 2;
            float ws = p[t] * kv_f16_to_f32(pair[0]);
            wm += p[t] * kv_f16_to_f32(pair[1]);
            for (int c = 0; c < G; c++) a[c] = fmaf(ws, (float)kv_code(codes, D, bits, g * G + c), a[c]);
        }
        for (int c = 0; c < G; c++) acc[g * G + c] += a[c] + wm;
    }
}

/* ---- Q4H: keys rotated by a Hadamard transform, then 4-bit per token ---------------------------- */

void kv_hadamard(float *x, int n) {
    for (int h = 1; h < n; h *= 2)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    float norm = 1.0f / sqrtf((float)n);
    for (int i = 0; i < n; i++) x[i] *= norm;
}

/* Symmetric 4-bit fit (test variant): x ~ s * (code - 8), s from the largest magnitude or that
 * clipped by up to 3/16; the least squared error wins. Stored as (s, -8 s) in Q4 V's layout. */
static void kv_sym_fit(const float *x, int n, uint16_t *s16, uint16_t *m16, float *s, float *m) {
    float amax = 0.0f, best = INFINITY;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    for (int a = 0; a < 4; a++) {
        uint16_t cs = kv_f32_to_f16(amax * (1.0f - (float)a / 16.0f) / 7.0f);
        uint16_t cm = kv_f32_to_f16(-8.0f * kv_f16_to_f32(cs));
        float sr = kv_f16_to_f32(cs), mr = kv_f16_to_f32(cm), e = 0.0f;
        for (int i = 0; i < n; i++) {
            float d = x[i] - (sr * (float)kv_quant(x[i], sr, mr, 15) + mr);
            e += d * d;
        }
        if (e < best) {
            best = e;
            *s16 = cs;
            *m16 = cm;
        }
    }
    *s = kv_f16_to_f32(*s16);
    *m = kv_f16_to_f32(*m16);
}

/* One token of D values (rotated or not) into 4-bit codes with (scale, min) per group of G, in Q4 V's
 * layout. Used by Q4H's K (after the rotation) and V (as is). */
static void enc_q4tok(const kv_fmt *f, uint8_t *head, int t, const float *x) {
    int D = f->D, G = f->G, ng = D / G;
    uint8_t *codes = head + f->code_off + (size_t)t * D / 2;
    uint16_t *sm = (uint16_t *)(head + f->scale_off) + (size_t)t * ng * 2;
    memset(codes, 0, (size_t)D / 2);
    for (int g = 0; g < ng; g++) {
        float s, m;
        if (f->sym)
            kv_sym_fit(x + g * G, G, &sm[2 * g], &sm[2 * g + 1], &s, &m);
        else
            kv_lowbit_fit(x + g * G, G, 4, &sm[2 * g], &sm[2 * g + 1], &s, &m);
        for (int c = 0; c < G; c++) kv_code_put(codes, D, 4, g * G + c, kv_quant(x[g * G + c], s, m, 15));
    }
}

static void enc_q4h_k(const kv_fmt *f, uint8_t *head, int t, const float *x) {
    float y[1024]; /* D <= 1024 */
    memcpy(y, x, (size_t)f->D * sizeof *y);
    if (f->rotate) kv_hadamard(y, f->D);
    enc_q4tok(f, head, t, y);
}

/* q is the rotated query (attention rotates it once per head): q . k = (H q) . (H k). As for q8 the
 * query is rounded to int16 once per block against its largest magnitude, so each group's sum of
 * q16 * code is exact integer arithmetic; then score = step * sum_g scale_g * sum_g' + sum_g min_g *
 * qsum_g, with qsum_g the group's sum of q (float, once per block). */
static void dot_q4h_k(const kv_fmt *f, const uint8_t *head, int n, const float *q, float *row, float *scores) {
    int D = f->D, G = f->G, ng = D / G;
    float amax = 0.0f, qsum[32]; /* ng <= 32 */
    for (int c = 0; c < D; c++) amax = fmaxf(amax, fabsf(q[c]));
    float inv = amax > 0.0f ? 32767.0f / amax : 0.0f, step = amax / 32767.0f;
    for (int g = 0; g < ng; g++) {
        float sg = 0.0f;
        for (int c = g * G; c < (g + 1) * G; c++) sg += q[c];
        qsum[g] = sg;
    }
    for (int c = 0; c < D; c++) row[c] = (float)kv_q16(q[c], inv); /* exact integers */
    for (int t = 0; t < n; t++) {
        const uint8_t *codes = head + f->code_off + (size_t)t * D / 2;
        const uint16_t *sm = (const uint16_t *)(head + f->scale_off) + (size_t)t * ng * 2;
        float s = 0.0f, b = 0.0f;
        for (int g = 0; g < ng; g++) {
            int32_t sg = 0;
            for (int c = g * G; c < (g + 1) * G; c++) sg += (int32_t)row[c] * kv_code(codes, D, 4, c);
            s += (float)sg * kv_f16_to_f32(sm[2 * g]);
            b += qsum[g] * kv_f16_to_f32(sm[2 * g + 1]);
        }
        scores[t] = s * step + b;
    }
}

/* K role of a low-bit format read as V would need per-channel accumulation, V role as K a
 * per-token dot: both are valid combinations because K and V formats are chosen separately, and the
 * role fixes the layout. The K role is only ever dotted and the V role only ever accumulated. */

/* The reference has no group kernels (dot_heads, accum_heads): with it, attention reads one head at a
 * time, which is what the group kernels' bits are checked against. */
#define KV_OPS(e, eb, d, a, af)                                                                                        \
    (kv_fmt_ops) { .enc_token = e, .enc_block = eb, .dot = d, .accum = a, .accum_first = af }

void kv_fmt_ops_ref(const kv_fmt *f, kv_fmt_ops *ops) {
    memset(ops, 0, sizeof *ops);
    switch (f->format) {
    case HR_KV_F32: *ops = KV_OPS(enc_f32, NULL, dot_f32, acc_f32, accf_f32); break;
    case HR_KV_F16: *ops = KV_OPS(enc_f16, NULL, dot_f16, acc_f16, accf_f16); break;
    case HR_KV_BF16: *ops = KV_OPS(enc_bf16, NULL, dot_bf16, acc_bf16, accf_bf16); break;
    case HR_KV_Q8: *ops = KV_OPS(enc_q8, NULL, dot_q8, acc_q8, accf_q8); break;
    case HR_KV_FP8: *ops = KV_OPS(enc_fp8, NULL, dot_fp8, acc_fp8, accf_fp8); break;
    case HR_KV_Q4:
    case HR_KV_KIVI2:
        if (f->role == KV_K)
            *ops = KV_OPS(NULL, encb_lowbit_k, dot_lowbit_k, NULL, NULL);
        else
            *ops = KV_OPS(NULL, encb_lowbit_v, NULL, acc_lowbit_v, NULL);
        break;
    case HR_KV_Q4H:
        if (f->role == KV_K)
            *ops = KV_OPS(enc_q4h_k, NULL, dot_q4h_k, NULL, NULL);
        else
            *ops = KV_OPS(enc_q4tok, NULL, NULL, acc_lowbit_v, NULL);
        break;
    }
}

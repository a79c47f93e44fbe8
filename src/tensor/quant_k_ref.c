/* quant_k_ref.c: scalar reference kernels for the K-quants q4_K, q5_K and q6_K (256-element
 * super-blocks) against q8_K activations.
 *
 * Dequantization follows ggml's format definition exactly (so any GGUF file decodes to the same
 * floats). The quantizers are simple and correct (min/max per sub-block, 6-bit or 8-bit scales by
 * rounding) rather than ggml's iterative search, so their bytes can differ from llama.cpp's. The
 * dots compute, per super-block, integer sums of q * y weighted by the integer sub-block scales,
 * then apply the f32 scales once: exact up to the final float arithmetic. */
#include <math.h>
#include <string.h>

#include "tensor/tensor_ref.h"

/* ---- shared: 6-bit scale/min packing of q4_K and q5_K (the inverse of hr_get_scale_min_k4) ---- */

static void pack_scale_min_k4(const uint8_t sc[8], const uint8_t mn[8], uint8_t out[HR_K_SCALE_SIZE]) {
    memset(out, 0, HR_K_SCALE_SIZE);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            out[j] = sc[j];
            out[j + 4] = mn[j];
        } else {
            out[j + 4] = (uint8_t)((sc[j] & 0xF) | ((mn[j] & 0xF) << 4));
            out[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            out[j] |= (uint8_t)((mn[j] >> 4) << 6);
        }
    }
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Quantizes one super-block into n-bit unsigned values q[256] (nmax = 15 or 31) with per-32 scales
 * and mins: x ~= d * sc[j] * q - dmin * mn[j]. */
static void quantize_asym_superblock(const float *x, int nmax, uint8_t q[HR_QK_K], hr_f16 *d_out, hr_f16 *dmin_out,
                                     uint8_t scales[HR_K_SCALE_SIZE]) {
    float scale[8], min[8], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        float lo = x[32 * j], hi = x[32 * j];
        for (int l = 1; l < 32; l++) {
            lo = fminf(lo, x[32 * j + l]);
            hi = fmaxf(hi, x[32 * j + l]);
        }
        if (lo > 0) lo = 0; /* the offset is subtracted: keep min <= 0 so mn >= 0 */
        scale[j] = (hi - lo) / (float)nmax;
        min[j] = -lo;
        max_scale = fmaxf(max_scale, scale[j]);
        max_min = fmaxf(max_min, min[j]);
    }
    const float d = max_scale / 63.0f, dmin = max_min / 63.0f;
    *d_out = hr_f32_to_f16(d);
    *dmin_out = hr_f32_to_f16(dmin);
    const float dq = hr_f16_to_f32(*d_out), dminq = hr_f16_to_f32(*dmin_out);
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)(dq > 0 ? clampi(hr_nearest_int(scale[j] / dq), 0, 63) : 0);
        mn[j] = (uint8_t)(dminq > 0 ? clampi(hr_nearest_int(min[j] / dminq), 0, 63) : 0);
        const float step = dq * sc[j], off = dminq * mn[j];
        for (int l = 0; l < 32; l++)
            q[32 * j + l] = (uint8_t)(step > 0 ? clampi(hr_nearest_int((x[32 * j + l] + off) / step), 0, nmax) : 0);
    }
    pack_scale_min_k4(sc, mn, scales);
}

/* ---- q4_K: 8 sub-blocks of 32; qs[32c + l] holds element 64c + l (low nibble) and 64c + 32 + l
 * (high nibble); x = d * sc * q - dmin * m ---- */

void hr_ref_quantize_q4_K(const float *x, void *dst, int64_t k) {
    hr_block_q4_K *y = dst;
    uint8_t q[HR_QK_K];
    for (int64_t i = 0; i < k / HR_QK_K; i++) {
        quantize_asym_superblock(x + i * HR_QK_K, 15, q, &y[i].d, &y[i].dmin, y[i].scales);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) y[i].qs[32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
    }
}

void hr_ref_dequantize_q4_K(const void *src, float *y, int64_t k) {
    const hr_block_q4_K *x = src;
    for (int64_t i = 0; i < k / HR_QK_K; i++) {
        const float d = hr_f16_to_f32(x[i].d), min = hr_f16_to_f32(x[i].dmin);
        const uint8_t *q = x[i].qs;
        for (int c = 0; c < 4; c++, q += 32) {
            uint8_t sc, m;
            hr_get_scale_min_k4(2 * c, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            hr_get_scale_min_k4(2 * c + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
        }
    }
}

/* Shared by q4_K and q5_K dots: qv[256] unsigned values of one super-block. */
static float dot_asym_superblock(const uint8_t qv[HR_QK_K], const uint8_t scales[HR_K_SCALE_SIZE], hr_f16 d,
                                 hr_f16 dmin, const hr_block_q8_K *y) {
    int32_t sumq = 0, summ = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        hr_get_scale_min_k4(j, scales, &sc, &m);
        int32_t s = 0;
        for (int l = 0; l < 32; l++) s += qv[32 * j + l] * y->qs[32 * j + l];
        sumq += sc * s;
        summ += m * (y->bsums[2 * j] + y->bsums[2 * j + 1]);
    }
    return hr_f16_to_f32(d) * y->d * (float)sumq - hr_f16_to_f32(dmin) * y->d * (float)summ;
}

float hr_ref_dot_q4_K(int64_t k, const void *w, const void *a) {
    const hr_block_q4_K *x = w;
    const hr_block_q8_K *y = a;
    float sumf = 0;
    uint8_t qv[HR_QK_K];
    for (int64_t i = 0; i < k / HR_QK_K; i++) {
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                qv[64 * c + l] = x[i].qs[32 * c + l] & 0xF;
                qv[64 * c + 32 + l] = x[i].qs[32 * c + l] >> 4;
            }
        sumf += dot_asym_superblock(qv, x[i].scales, x[i].d, x[i].dmin, &y[i]);
    }
    return sumf;
}

/* ---- q5_K: q4_K plus a fifth bit: bit 2c of qh[l] for element 64c + l, bit 2c + 1 for 64c + 32 + l ---- */

void hr_ref_quantize_q5_K(const float *x, void *dst, int64_t k) {
    hr_block_q5_K *y = dst;
    uint8_t q[HR_QK_K];
    for (int64_t i = 0; i < k / HR_QK_K; i++) {
        quantize_asym_superblock(x + i * HR_QK_K, 31, q, &y[i].d, &y[i].dmin, y[i].scales);
        memset(y[i].qh, 0, sizeof y[i].qh);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                const uint8_t lo = q[64 * c + l], hi = q[64 * c + 32 + l];
                y[i].qs[32 * c + l] = (uint8_t)((lo & 0xF) | ((hi & 0xF) << 4));
                y[i].qh[l] |= (uint8_t)(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
            }
    }
}

static void unpack_q5_K(const hr_block_q5_K *b, uint8_t qv[HR_QK_K]) {
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            qv[64 * c + l] = (uint8_t)((b->qs[32 * c + l] & 0xF) | (((b->qh[l] >> (2 * c)) & 1) << 4));
            qv[64 * c + 32 + l] = (uint8_t)((b->qs[32 * c + l] >> 4) | (((b->qh[l] >> (2 * c + 1)) & 1) << 4));
        }
}

void hr_ref_dequantize_q5_K(const void *src, float *y, int64_t k) {
    const hr_block_q5_K *x = src;
    uint8_t qv[HR_QK_K];
    for (int64_t i = 0; i < k / HR_QK_K; i++) {
        const float d = hr_f16_to_f32(x[i].d), min = hr_f16_to_f32(x[i].dmin);
        unpack_q5_K(&x[i], qv);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            hr_get_scale_min_k4(j, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            for (int l = 0; l < 32; l++) *y++ = d1 * qv[32 * j + l] - m1;
        }
    }
}

float hr_ref_dot_q5_K(int64_t k, const void *w, const void *a) {
    const hr_block_q5_K *x = w;
    const hr_block_q8_K *y = a;
    float sumf = 0;
    uint8_t qv[HR_QK_K];
    for (int64_t i = 0; i < k / HR_QK_K; i++) {
        unpack_q5_K(&x[i], qv);
        sumf += dot_asym_superblock(qv, x[i].scales, x[i].d, x[i].dmin, &y[i]);
    }
    return sumf;
}

/* ---- q6_K: 16 sub-blocks of 16 with int8 scales; in each 128-element half n, for l < 32:
 *   e = n + l:      ql[64h + l] low nibble,       qh[32h + l] bits 0-1
 *   e = n + 32 + l: ql[64h + 32 + l] low nibble,  bits 2-3
 *   e = n + 64 + l: ql[64h + l] high nibble,      bits 4-5
 *   e = n + 96 + l: ql[64h + 32 + l] high nibble, bits 6-7
 * value = d * scales[e / 16] * (q - 32) ---- */

static void unpack_q6_K(const hr_block_q6_K *b, int8_t qv[HR_QK_K]) {
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b->ql + 64 * h, *qh = b->qh + 32 * h;
        int8_t *q = qv + 128 * h;
        for (int l = 0; l < 32; l++) {
            q[l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
            q[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
            q[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            q[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
}

void hr_ref_quantize_q6_K(const float *x, void *dst, int64_t k) {
    hr_block_q6_K *y = dst;
    for (int64_t i = 0; i < k / HR_QK_K; i++) {
        const float *xb = x + i * HR_QK_K;
        float scale[16], max_abs_scale = 0;
        for (int g = 0; g < 16; g++) {
            float amax = 0;
            for (int l = 0; l < 16; l++) amax = fmaxf(amax, fabsf(xb[16 * g + l]));
            scale[g] = amax / 31.0f;
            max_abs_scale = fmaxf(max_abs_scale, scale[g]);
        }
        const float d = max_abs_scale / 127.0f;
        y[i].d = hr_f32_to_f16(d);
        const float dq = hr_f16_to_f32(y[i].d);
        uint8_t q[HR_QK_K];
        for (int g = 0; g < 16; g++) {
            y[i].scales[g] = (int8_t)(dq > 0 ? clampi(hr_nearest_int(scale[g] / dq), -128, 127) : 0);
            const float step = dq * y[i].scales[g];
            for (int l = 0; l < 16; l++)
                q[16 * g + l] = (uint8_t)(step > 0 ? clampi(hr_nearest_int(xb[16 * g + l] / step), -32, 31) + 32 : 32);
        }
        memset(y[i].qh, 0, sizeof y[i].qh);
        for (int h = 0; h < 2; h++) {
            const uint8_t *qq = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                y[i].ql[64 * h + l] = (uint8_t)((qq[l] & 0xF) | ((qq[l + 64] & 0xF) << 4));
                y[i].ql[64 * h + 32 + l] = (uint8_t)((qq[l + 32] & 0xF) | ((qq[l + 96] & 0xF) << 4));
                y[i].qh[32 * h + l] = (uint8_t)((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) | ((qq[l + 64] >> 4) << 4) |
                                                ((qq[l + 96] >> 4) << 6));
            }
        }
    }
}

void hr_ref_dequantize_q6_K(const void *src, float *y, int64_t k) {
    const hr_block_q6_K *x = src;
    int8_t qv[HR_QK_K];
    for (int64_t i = 0; i < k / HR_QK_K; i++) {
        const float d = hr_f16_to_f32(x[i].d);
        unpack_q6_K(&x[i], qv);
        for (int e = 0; e < HR_QK_K; e++) *y++ = d * x[i].scales[e / 16] * qv[e];
    }
}

float hr_ref_dot_q6_K(int64_t k, const void *w, const void *a) {
    const hr_block_q6_K *x = w;
    const hr_block_q8_K *y = a;
    float sumf = 0;
    int8_t qv[HR_QK_K];
    for (int64_t i = 0; i < k / HR_QK_K; i++) {
        unpack_q6_K(&x[i], qv);
        int32_t sumi = 0;
        for (int g = 0; g < 16; g++) {
            int32_t s = 0;
            for (int l = 0; l < 16; l++) s += qv[16 * g + l] * y[i].qs[16 * g + l];
            sumi += x[i].scales[g] * s;
        }
        sumf += hr_f16_to_f32(x[i].d) * y[i].d * (float)sumi;
    }
    return sumf;
}

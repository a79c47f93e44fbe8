/* quant_q5_ref.c: the reference quantizers, dequantizers and dots of q5_0 and q5_1 (the 32-element
 * 5-bit types llama.cpp's quantizer falls back to for q4_K and q5_K tensors whose rows are not whole
 * super-blocks; tensor.h has the layouts).
 *
 * The quantizers follow ggml's reference formulas (so the bytes equal a row quantized by ggml):
 *   q5_0: d = max / -16 with max the signed value of largest magnitude, q = min(31, trunc(x / d + 16.5))
 *   q5_1: d = (max - min) / 31, m = min, q = trunc((x - min) / d + 0.5)
 * The dots are against q8_0 activations, in ggml's order: per block the exact integer sum, then
 *   q5_0: sum += (float)isum * (d_w * d_a)
 *   q5_1: sum += (float)isum * (d_w * d_a) + m_w * (d_a * (float)sum(a))   */
#include <string.h>

#include "tensor/tensor_ref.h"

static uint32_t load_qh(const uint8_t qh[4]) {
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

static void store_qh(uint8_t qh[4], uint32_t v) {
    for (int i = 0; i < 4; i++) qh[i] = (uint8_t)(v >> (8 * i));
}

/* The 5-bit value (0..31) of element j (0..31) of a block's qs / qh. */
static inline int q5_elem(const uint8_t *qs, uint32_t qh, int j) {
    const int nib = j < 16 ? qs[j] & 0x0F : qs[j - 16] >> 4;
    return nib | (int)((qh >> j) & 1) << 4;
}

void hr_ref_quantize_q5_0(const float *x, void *dst, int64_t k) {
    hr_block_q5_0 *y = dst;
    for (int64_t i = 0; i < k / HR_QK5_0; i++) {
        const float *xb = x + i * HR_QK5_0;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < HR_QK5_0; j++)
            if (amax < fabsf(xb[j])) {
                amax = fabsf(xb[j]);
                max = xb[j];
            }
        const float d = max / -16.0f;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = hr_f32_to_f16(d);
        uint32_t qh = 0;
        for (int j = 0; j < HR_QK5_0 / 2; j++) {
            /* the cast truncates, as ggml's (int8_t) cast: x / d + 16.5 >= 0.5 here */
            const int q0 = (int8_t)(xb[j] * id + 16.5f) < 31 ? (int8_t)(xb[j] * id + 16.5f) : 31;
            const int q1 = (int8_t)(xb[j + 16] * id + 16.5f) < 31 ? (int8_t)(xb[j + 16] * id + 16.5f) : 31;
            y[i].qs[j] = (uint8_t)((q0 & 0x0F) | (q1 & 0x0F) << 4);
            qh |= (uint32_t)(q0 >> 4 & 1) << j | (uint32_t)(q1 >> 4 & 1) << (j + 16);
        }
        store_qh(y[i].qh, qh);
    }
}

void hr_ref_quantize_q5_1(const float *x, void *dst, int64_t k) {
    hr_block_q5_1 *y = dst;
    for (int64_t i = 0; i < k / HR_QK5_1; i++) {
        const float *xb = x + i * HR_QK5_1;
        float min = xb[0], max = xb[0];
        for (int j = 1; j < HR_QK5_1; j++) {
            if (xb[j] < min) min = xb[j];
            if (xb[j] > max) max = xb[j];
        }
        const float d = (max - min) / 31.0f;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = hr_f32_to_f16(d);
        y[i].m = hr_f32_to_f16(min);
        uint32_t qh = 0;
        for (int j = 0; j < HR_QK5_1 / 2; j++) {
            const int q0 = (uint8_t)((xb[j] - min) * id + 0.5f);
            const int q1 = (uint8_t)((xb[j + 16] - min) * id + 0.5f);
            y[i].qs[j] = (uint8_t)((q0 & 0x0F) | (q1 & 0x0F) << 4);
            qh |= (uint32_t)(q0 >> 4 & 1) << j | (uint32_t)(q1 >> 4 & 1) << (j + 16);
        }
        store_qh(y[i].qh, qh);
    }
}

void hr_ref_dequantize_q5_0(const void *src, float *y, int64_t k) {
    const hr_block_q5_0 *x = src;
    for (int64_t i = 0; i < k / HR_QK5_0; i++) {
        const float d = hr_f16_to_f32(x[i].d);
        const uint32_t qh = load_qh(x[i].qh);
        for (int j = 0; j < HR_QK5_0; j++) y[i * HR_QK5_0 + j] = (float)(q5_elem(x[i].qs, qh, j) - 16) * d;
    }
}

void hr_ref_dequantize_q5_1(const void *src, float *y, int64_t k) {
    const hr_block_q5_1 *x = src;
    for (int64_t i = 0; i < k / HR_QK5_1; i++) {
        const float d = hr_f16_to_f32(x[i].d), m = hr_f16_to_f32(x[i].m);
        const uint32_t qh = load_qh(x[i].qh);
        for (int j = 0; j < HR_QK5_1; j++) y[i * HR_QK5_1 + j] = (float)q5_elem(x[i].qs, qh, j) * d + m;
    }
}

float hr_ref_dot_q5_0(int64_t k, const void *w, const void *a) {
    const hr_block_q5_0 *x = w;
    const hr_block_q8_0 *y = a;
    float sumf = 0;
    for (int64_t i = 0; i < k / HR_QK5_0; i++) {
        const uint32_t qh = load_qh(x[i].qh);
        int sumi = 0;
        for (int j = 0; j < HR_QK5_0; j++) sumi += (q5_elem(x[i].qs, qh, j) - 16) * y[i].qs[j];
        sumf += (float)sumi * (hr_f16_to_f32(x[i].d) * hr_f16_to_f32(y[i].d));
    }
    return sumf;
}

float hr_ref_dot_q5_1(int64_t k, const void *w, const void *a) {
    const hr_block_q5_1 *x = w;
    const hr_block_q8_0 *y = a;
    float sumf = 0;
    for (int64_t i = 0; i < k / HR_QK5_1; i++) {
        const uint32_t qh = load_qh(x[i].qh);
        int sumi = 0, sumy = 0;
        for (int j = 0; j < HR_QK5_1; j++) {
            sumi += q5_elem(x[i].qs, qh, j) * y[i].qs[j];
            sumy += y[i].qs[j];
        }
        const float dy = hr_f16_to_f32(y[i].d);
        sumf += (float)sumi * (hr_f16_to_f32(x[i].d) * dy) + hr_f16_to_f32(x[i].m) * (dy * (float)sumy);
    }
    return sumf;
}

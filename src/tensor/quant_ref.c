/* quant_ref.c: scalar reference kernels for f32, f16, bf16, q8_0, q4_0 and the q8_K activation
 * format, plus the hr_*_row_ref entry points that dispatch on type.
 *
 * These are the definition of correct: quantizers follow ggml's reference quantizers formula for
 * formula (so a row quantized here is byte-identical to one quantized by ggml), and every SIMD kernel
 * is tested against the functions here. Float dots accumulate in double. */
#include <math.h>
#include <string.h>

#include "tensor/tensor_ref.h"

/* ---- float types (activations are f32) ---- */

void hr_ref_copy_f32(const float *x, void *dst, int64_t k) { memcpy(dst, x, (size_t)k * sizeof(float)); }

void hr_ref_quantize_f16(const float *x, void *dst, int64_t k) {
    hr_f16 *y = dst;
    for (int64_t i = 0; i < k; i++) y[i] = hr_f32_to_f16(x[i]);
}

void hr_ref_quantize_bf16(const float *x, void *dst, int64_t k) {
    hr_bf16 *y = dst;
    for (int64_t i = 0; i < k; i++) y[i] = hr_f32_to_bf16(x[i]);
}

void hr_ref_dequantize_f32(const void *src, float *y, int64_t k) { memcpy(y, src, (size_t)k * sizeof(float)); }

void hr_ref_dequantize_f16(const void *src, float *y, int64_t k) {
    const hr_f16 *x = src;
    for (int64_t i = 0; i < k; i++) y[i] = hr_f16_to_f32(x[i]);
}

void hr_ref_dequantize_bf16(const void *src, float *y, int64_t k) {
    const hr_bf16 *x = src;
    for (int64_t i = 0; i < k; i++) y[i] = hr_bf16_to_f32(x[i]);
}

float hr_ref_dot_f32(int64_t k, const void *w, const void *a) {
    const float *x = w, *y = a;
    double sum = 0;
    for (int64_t i = 0; i < k; i++) sum += (double)x[i] * (double)y[i];
    return (float)sum;
}

float hr_ref_dot_f16(int64_t k, const void *w, const void *a) {
    const hr_f16 *x = w, *y = a;
    double sum = 0;
    for (int64_t i = 0; i < k; i++) sum += (double)hr_f16_to_f32(x[i]) * (double)hr_f16_to_f32(y[i]);
    return (float)sum;
}

float hr_ref_dot_bf16(int64_t k, const void *w, const void *a) {
    const hr_bf16 *x = w;
    const float *y = a;
    double sum = 0;
    for (int64_t i = 0; i < k; i++) sum += (double)hr_bf16_to_f32(x[i]) * (double)y[i];
    return (float)sum;
}

/* ---- q8_0: d = amax / 127, q = round(x / d) (ggml's quantize_row_q8_0_ref) ---- */

void hr_ref_quantize_q8_0(const float *x, void *dst, int64_t k) {
    hr_block_q8_0 *y = dst;
    for (int64_t i = 0; i < k / HR_QK8_0; i++) {
        const float *xb = x + i * HR_QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < HR_QK8_0; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const float d = amax / 127.0f;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = hr_f32_to_f16(d);
        for (int j = 0; j < HR_QK8_0; j++) y[i].qs[j] = (int8_t)roundf(xb[j] * id);
    }
}

void hr_ref_dequantize_q8_0(const void *src, float *y, int64_t k) {
    const hr_block_q8_0 *x = src;
    for (int64_t i = 0; i < k / HR_QK8_0; i++) {
        const float d = hr_f16_to_f32(x[i].d);
        for (int j = 0; j < HR_QK8_0; j++) y[i * HR_QK8_0 + j] = x[i].qs[j] * d;
    }
}

float hr_ref_dot_q8_0(int64_t k, const void *w, const void *a) {
    const hr_block_q8_0 *x = w, *y = a;
    float sumf = 0;
    for (int64_t i = 0; i < k / HR_QK8_0; i++) {
        int sumi = 0;
        for (int j = 0; j < HR_QK8_0; j++) sumi += x[i].qs[j] * y[i].qs[j];
        sumf += (float)sumi * (hr_f16_to_f32(x[i].d) * hr_f16_to_f32(y[i].d));
    }
    return sumf;
}

/* ---- q4_0: d = max / -8 with max the signed value of largest magnitude, q = min(15, (int8)(x/d + 8.5))
 * (ggml's quantize_row_q4_0_ref); qs[j] holds element j in its low nibble and j+16 in its high ---- */

void hr_ref_quantize_q4_0(const float *x, void *dst, int64_t k) {
    hr_block_q4_0 *y = dst;
    for (int64_t i = 0; i < k / HR_QK4_0; i++) {
        const float *xb = x + i * HR_QK4_0;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < HR_QK4_0; j++) {
            if (amax < fabsf(xb[j])) {
                amax = fabsf(xb[j]);
                max = xb[j];
            }
        }
        const float d = max / -8.0f;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = hr_f32_to_f16(d);
        for (int j = 0; j < HR_QK4_0 / 2; j++) {
            const float x0 = xb[j] * id;
            const float x1 = xb[HR_QK4_0 / 2 + j] * id;
            const int8_t q0 = (int8_t)(x0 + 8.5f) < 15 ? (int8_t)(x0 + 8.5f) : 15;
            const int8_t q1 = (int8_t)(x1 + 8.5f) < 15 ? (int8_t)(x1 + 8.5f) : 15;
            y[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

void hr_ref_dequantize_q4_0(const void *src, float *y, int64_t k) {
    const hr_block_q4_0 *x = src;
    for (int64_t i = 0; i < k / HR_QK4_0; i++) {
        const float d = hr_f16_to_f32(x[i].d);
        for (int j = 0; j < HR_QK4_0 / 2; j++) {
            y[i * HR_QK4_0 + j] = ((x[i].qs[j] & 0x0F) - 8) * d;
            y[i * HR_QK4_0 + j + HR_QK4_0 / 2] = ((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

float hr_ref_dot_q4_0(int64_t k, const void *w, const void *a) {
    const hr_block_q4_0 *x = w;
    const hr_block_q8_0 *y = a;
    float sumf = 0;
    for (int64_t i = 0; i < k / HR_QK4_0; i++) {
        int sumi0 = 0, sumi1 = 0;
        for (int j = 0; j < HR_QK4_0 / 2; j++) {
            sumi0 += ((x[i].qs[j] & 0x0F) - 8) * y[i].qs[j];
            sumi1 += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + HR_QK4_0 / 2];
        }
        sumf += (float)(sumi0 + sumi1) * hr_f16_to_f32(x[i].d) * hr_f16_to_f32(y[i].d);
    }
    return sumf;
}

/* ---- q8_K (activations for the K-quants): d = max / -127 with max the signed value of largest
 * magnitude, q = min(127, nearest(x / d)), bsums = sums of 16-element groups (ggml's
 * quantize_row_q8_K_ref) ---- */

void hr_ref_quantize_q8_K(const float *x, void *dst, int64_t k) {
    hr_block_q8_K *y = dst;
    for (int64_t i = 0; i < k / HR_QK_K; i++) {
        const float *xb = x + i * HR_QK_K;
        float amax = 0, max = 0;
        for (int j = 0; j < HR_QK_K; j++) {
            if (fabsf(xb[j]) > amax) {
                amax = fabsf(xb[j]);
                max = xb[j];
            }
        }
        if (amax == 0) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < HR_QK_K; j++) {
            const int v = hr_nearest_int(iscale * xb[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < HR_QK_K / 16; j++) {
            int sum = 0;
            for (int ii = 0; ii < 16; ii++) sum += y[i].qs[j * 16 + ii];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

void hr_ref_dequantize_q8_K(const void *src, float *y, int64_t k) {
    const hr_block_q8_K *x = src;
    for (int64_t i = 0; i < k / HR_QK_K; i++)
        for (int j = 0; j < HR_QK_K; j++) y[i * HR_QK_K + j] = x[i].d * x[i].qs[j];
}

/* ---- dispatch by type ---- */

void hr_quantize_row_ref(hr_dtype t, const float *x, void *dst, int64_t k) {
    switch (t) {
    case HR_DTYPE_F32: hr_ref_copy_f32(x, dst, k); break;
    case HR_DTYPE_F16: hr_ref_quantize_f16(x, dst, k); break;
    case HR_DTYPE_BF16: hr_ref_quantize_bf16(x, dst, k); break;
    case HR_DTYPE_Q8_0: hr_ref_quantize_q8_0(x, dst, k); break;
    case HR_DTYPE_Q4_0: hr_ref_quantize_q4_0(x, dst, k); break;
    case HR_DTYPE_Q5_0: hr_ref_quantize_q5_0(x, dst, k); break;
    case HR_DTYPE_Q5_1: hr_ref_quantize_q5_1(x, dst, k); break;
    case HR_DTYPE_Q8_K: hr_ref_quantize_q8_K(x, dst, k); break;
    case HR_DTYPE_Q4_K: hr_ref_quantize_q4_K(x, dst, k); break;
    case HR_DTYPE_Q5_K: hr_ref_quantize_q5_K(x, dst, k); break;
    case HR_DTYPE_Q6_K: hr_ref_quantize_q6_K(x, dst, k); break;
    case HR_DTYPE_MXFP4: hr_ref_quantize_mxfp4(x, dst, k); break;
    case HR_DTYPE_Q8_0S: hr_ref_quantize_q8_0s(x, dst, k); break;
    case HR_DTYPE_Q8_KS: hr_ref_quantize_q8_Ks(x, dst, k); break;
    case HR_DTYPE_Q4_0X16: /* rows live in groups: quantize q4_0 (q8_0, q4_K), then hr_x16_repack */
    case HR_DTYPE_Q8_0X16:
    case HR_DTYPE_Q4_KX16:
    case HR_DTYPE_Q5_KX16:
    case HR_DTYPE_Q6_KX16:
    case HR_DTYPE_Q5_0X16: break;
    }
}

void hr_dequantize_row_ref(hr_dtype t, const void *src, float *y, int64_t k) {
    switch (t) {
    case HR_DTYPE_F32: hr_ref_dequantize_f32(src, y, k); break;
    case HR_DTYPE_F16: hr_ref_dequantize_f16(src, y, k); break;
    case HR_DTYPE_BF16: hr_ref_dequantize_bf16(src, y, k); break;
    case HR_DTYPE_Q8_0: hr_ref_dequantize_q8_0(src, y, k); break;
    case HR_DTYPE_Q4_0: hr_ref_dequantize_q4_0(src, y, k); break;
    case HR_DTYPE_Q5_0: hr_ref_dequantize_q5_0(src, y, k); break;
    case HR_DTYPE_Q5_1: hr_ref_dequantize_q5_1(src, y, k); break;
    case HR_DTYPE_Q8_K: hr_ref_dequantize_q8_K(src, y, k); break;
    case HR_DTYPE_Q4_K: hr_ref_dequantize_q4_K(src, y, k); break;
    case HR_DTYPE_Q5_K: hr_ref_dequantize_q5_K(src, y, k); break;
    case HR_DTYPE_Q6_K: hr_ref_dequantize_q6_K(src, y, k); break;
    case HR_DTYPE_MXFP4: hr_ref_dequantize_mxfp4(src, y, k); break;
    case HR_DTYPE_Q8_0S:
        for (int64_t i = 0; i < k / HR_QK8_0; i++)
            for (int j = 0; j < HR_QK8_0; j++)
                y[i * HR_QK8_0 + j] = ((const hr_block_q8_0s *)src)[i].d * ((const hr_block_q8_0s *)src)[i].qs[j];
        break;
    case HR_DTYPE_Q8_KS:
        for (int64_t i = 0; i < k / HR_QK_K; i++)
            for (int j = 0; j < HR_QK_K; j++)
                y[i * HR_QK_K + j] = ((const hr_block_q8_Ks *)src)[i].d * ((const hr_block_q8_Ks *)src)[i].qs[j];
        break;
    case HR_DTYPE_Q4_0X16: /* rows live in groups: hr_x16_unpack, then the file type's */
    case HR_DTYPE_Q8_0X16:
    case HR_DTYPE_Q4_KX16:
    case HR_DTYPE_Q5_KX16:
    case HR_DTYPE_Q6_KX16:
    case HR_DTYPE_Q5_0X16: break;
    }
}

float hr_vec_dot_ref(hr_dtype t, int64_t k, const void *w_row, const void *act_row) {
    switch (t) {
    case HR_DTYPE_F32: return hr_ref_dot_f32(k, w_row, act_row);
    case HR_DTYPE_F16: return hr_ref_dot_f16(k, w_row, act_row);
    case HR_DTYPE_BF16: return hr_ref_dot_bf16(k, w_row, act_row);
    case HR_DTYPE_Q8_0: return hr_ref_dot_q8_0(k, w_row, act_row);
    case HR_DTYPE_Q4_0: return hr_ref_dot_q4_0(k, w_row, act_row);
    case HR_DTYPE_Q5_0: return hr_ref_dot_q5_0(k, w_row, act_row);
    case HR_DTYPE_Q5_1: return hr_ref_dot_q5_1(k, w_row, act_row);
    case HR_DTYPE_Q4_K: return hr_ref_dot_q4_K(k, w_row, act_row);
    case HR_DTYPE_Q5_K: return hr_ref_dot_q5_K(k, w_row, act_row);
    case HR_DTYPE_Q6_K: return hr_ref_dot_q6_K(k, w_row, act_row);
    case HR_DTYPE_MXFP4: return hr_ref_dot_mxfp4(k, w_row, act_row);
    case HR_DTYPE_Q8_K: /* activation types: nothing dots against them as weights */
    case HR_DTYPE_Q8_0S:
    case HR_DTYPE_Q8_KS: break;
    case HR_DTYPE_Q4_0X16: /* no lone row: hr_kernels' tile */
    case HR_DTYPE_Q8_0X16:
    case HR_DTYPE_Q4_KX16:
    case HR_DTYPE_Q5_KX16:
    case HR_DTYPE_Q6_KX16:
    case HR_DTYPE_Q5_0X16: break;
    }
    return 0.0f;
}

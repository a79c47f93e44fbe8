/* tensor_ref.h: the per-type reference row routines behind hr_quantize_row_ref / hr_dequantize_row_ref /
 * hr_vec_dot_ref (quant_ref.c, quant_k_ref.c, quant_q5_ref.c), by name, for the backends whose kernel tables hold
 * them (backend/cpu/kernels.c) and their scalar kernels (the nearest-int rounding and the K-quant
 * scale unpacking every implementation must share to give the same bytes). */
#ifndef HR_TENSOR_TENSOR_REF_H
#define HR_TENSOR_TENSOR_REF_H

#include <math.h>

#include "tensor/tensor.h"

/* Nearest integer, ties to even, for |x| < 2^22 (ggml's nearest_int: the 1.5*2^23 trick). */
static inline int hr_nearest_int(float fval) {
    float val = fval + 12582912.f;
    int32_t i;
    __builtin_memcpy(&i, &val, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* Scalar reference kernels (quant_ref.c, quant_k_ref.c). Activation quantizers: */
void hr_ref_copy_f32(const float *x, void *dst, int64_t k);
void hr_ref_quantize_q8_0(const float *x, void *dst, int64_t k);
void hr_ref_quantize_q8_K(const float *x, void *dst, int64_t k);
void hr_ref_quantize_q4_0(const float *x, void *dst, int64_t k);
void hr_ref_quantize_f16(const float *x, void *dst, int64_t k);
void hr_ref_quantize_bf16(const float *x, void *dst, int64_t k);
void hr_ref_quantize_q5_0(const float *x, void *dst, int64_t k); /* quant_q5_ref.c */
void hr_ref_quantize_q5_1(const float *x, void *dst, int64_t k);
void hr_ref_quantize_q4_K(const float *x, void *dst, int64_t k);
void hr_ref_quantize_q5_K(const float *x, void *dst, int64_t k);
void hr_ref_quantize_q6_K(const float *x, void *dst, int64_t k);
void hr_ref_quantize_mxfp4(const float *x, void *dst, int64_t k); /* quant_mxfp4_ref.c */

void hr_ref_dequantize_f32(const void *src, float *y, int64_t k);
void hr_ref_dequantize_f16(const void *src, float *y, int64_t k);
void hr_ref_dequantize_bf16(const void *src, float *y, int64_t k);
void hr_ref_dequantize_q8_0(const void *src, float *y, int64_t k);
void hr_ref_dequantize_q4_0(const void *src, float *y, int64_t k);
void hr_ref_dequantize_q5_0(const void *src, float *y, int64_t k);
void hr_ref_dequantize_q5_1(const void *src, float *y, int64_t k);
void hr_ref_dequantize_q8_K(const void *src, float *y, int64_t k);
void hr_ref_dequantize_q4_K(const void *src, float *y, int64_t k);
void hr_ref_dequantize_q5_K(const void *src, float *y, int64_t k);
void hr_ref_dequantize_q6_K(const void *src, float *y, int64_t k);
void hr_ref_dequantize_mxfp4(const void *src, float *y, int64_t k);

float hr_ref_dot_f32(int64_t k, const void *w, const void *a);
float hr_ref_dot_f16(int64_t k, const void *w, const void *a);
float hr_ref_dot_bf16(int64_t k, const void *w, const void *a);
float hr_ref_dot_q8_0(int64_t k, const void *w, const void *a);
float hr_ref_dot_q4_0(int64_t k, const void *w, const void *a);
float hr_ref_dot_q5_0(int64_t k, const void *w, const void *a); /* against q8_0 */
float hr_ref_dot_q5_1(int64_t k, const void *w, const void *a); /* against q8_0 */
float hr_ref_dot_q4_K(int64_t k, const void *w, const void *a);
float hr_ref_dot_q5_K(int64_t k, const void *w, const void *a);
float hr_ref_dot_q6_K(int64_t k, const void *w, const void *a);
float hr_ref_dot_mxfp4(int64_t k, const void *w, const void *a); /* against q8_0 */

/* Decodes the 6-bit scale and min of sub-block j (0..7) from a q4_K/q5_K scales[12] array. */
static inline void hr_get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

/* q8_0s / q8_Ks rows (x16.c) by a given q8_0 / q8_K block quantizer (the reference, or a backend's
 * build of it that gives the same bytes), then the sums the x16 tiles need. */
void hr_quantize_q8_0s_with(const float *x, void *dst, int64_t k, void (*q8_0)(const float *, void *, int64_t));
void hr_quantize_q8_Ks_with(const float *x, void *dst, int64_t k, void (*q8_K)(const float *, void *, int64_t));
void hr_ref_quantize_q8_0s(const float *x, void *dst, int64_t k);
void hr_ref_quantize_q8_Ks(const float *x, void *dst, int64_t k);

#endif

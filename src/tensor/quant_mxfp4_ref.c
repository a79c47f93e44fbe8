/* quant_mxfp4_ref.c: the MXFP4 reference (tensor.h: 4-bit E2M1 codes, one E8M0 scale per 32 values):
 * quantizer, dequantizer and its dot with q8_0 activations (the type llama.cpp multiplies it with).
 *
 * Arithmetic: the value table is E2M1 doubled (integers), so a block's values are table[c] * 2^(e - 128)
 * and its dot with a q8_0 block is an exact integer sum times two scales: (2^(e - 128) * d_y) * sum. */
#include <math.h>

#include "tensor/tensor_ref.h"

/* E2M1 codes 0..7 are +0, 0.5, 1, 1.5, 2, 3, 4, 6; 8..15 the same negated (doubled here). */
const int8_t HR_MXFP4_VALUES[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

int64_t hr_mxfp4_find_nan_scale(const void *row, int64_t k) {
    const hr_block_mxfp4 *b = row;
    for (int64_t i = 0; i < k / HR_QK_MXFP4; i++)
        if (b[i].e == 0xFF) return i;
    return -1;
}

/* The code whose value (table[c] * d) is nearest x; the lowest code on a tie. */
static uint8_t nearest_code(float x, float d) {
    uint8_t best = 0;
    float best_err = fabsf(x);
    for (uint8_t c = 1; c < 16; c++) {
        const float err = fabsf((float)HR_MXFP4_VALUES[c] * d - x);
        if (err < best_err) best = c, best_err = err;
    }
    return best;
}

/* The scale puts the block's largest magnitude in [4, 8) x 2^(e - 127 - 2)... i.e. e = floor(log2(amax))
 * - 2 + 127, so amax / 2^(e - 127) lies in [4, 8), near E2M1's largest value 6 (ggml's choice; bytes
 * equal its quantize_row_mxfp4_ref for normal inputs). */
void hr_ref_quantize_mxfp4(const float *x, void *dst, int64_t k) {
    hr_block_mxfp4 *y = dst;
    for (int64_t i = 0; i < k / HR_QK_MXFP4; i++) {
        const float *xb = x + i * HR_QK_MXFP4;
        float amax = 0.0f;
        for (int j = 0; j < HR_QK_MXFP4; j++) amax = fmaxf(amax, fabsf(xb[j]));
        float e = amax > 0.0f ? floorf(log2f(amax)) - 2.0f + 127.0f : 0.0f;
        e = e < 0.0f ? 0.0f : e > 254.0f ? 254.0f : e; /* never 0xFF (NaN) */
        y[i].e = (uint8_t)e;
        const float d = hr_mxfp4_half_scale(y[i].e);
        for (int j = 0; j < HR_QK_MXFP4 / 2; j++)
            y[i].qs[j] = (uint8_t)(nearest_code(xb[j], d) | nearest_code(xb[j + HR_QK_MXFP4 / 2], d) << 4);
    }
}

void hr_ref_dequantize_mxfp4(const void *src, float *y, int64_t k) {
    const hr_block_mxfp4 *x = src;
    for (int64_t i = 0; i < k / HR_QK_MXFP4; i++) {
        const float d = hr_mxfp4_half_scale(x[i].e);
        for (int j = 0; j < HR_QK_MXFP4 / 2; j++) {
            y[i * HR_QK_MXFP4 + j] = (float)HR_MXFP4_VALUES[x[i].qs[j] & 0x0F] * d;
            y[i * HR_QK_MXFP4 + j + HR_QK_MXFP4 / 2] = (float)HR_MXFP4_VALUES[x[i].qs[j] >> 4] * d;
        }
    }
}

float hr_ref_dot_mxfp4(int64_t k, const void *w, const void *a) {
    const hr_block_mxfp4 *x = w;
    const hr_block_q8_0 *y = a;
    float sumf = 0;
    for (int64_t i = 0; i < k / HR_QK_MXFP4; i++) {
        int sumi = 0;
        for (int j = 0; j < HR_QK_MXFP4 / 2; j++)
            sumi += HR_MXFP4_VALUES[x[i].qs[j] & 0x0F] * y[i].qs[j] +
                    HR_MXFP4_VALUES[x[i].qs[j] >> 4] * y[i].qs[j + HR_QK_MXFP4 / 2];
        sumf += (hr_f16_to_f32(y[i].d) * hr_mxfp4_half_scale(x[i].e)) * (float)sumi;
    }
    return sumf;
}

/* kernels_mxfp4.c: the scalar table's MXFP4 dot (against q8_0 activations) and its tile, in portable C
 * that reduces in exactly the order of the AVX2 kernel (kernels_mxfp4_avx2.c), so both give the same
 * bits.
 *
 * The order: blocks in pairs (b, b + 1), an odd last block paired with a zero block of scale 0; lane l
 * (0..7) belongs to block b + (l >> 2) and receives
 *     acc_l = fmaf(dx * dy, (float)s_l, acc_l),  dx = 2^(e - 128), dy = the q8_0 block's scale
 * with s_l the exact integer sum over j = 4 (l & 3) .. + 3 of v(lo_j) y_j + v(hi_j) y_(j + 16) (v the
 * doubled E2M1 table, lo_j / hi_j the low / high nibble of qs[j]); the result is hsum8 of the lanes
 * ((l, l + 4) pairs, then (0, 2) and (1, 3), then the two halves), as every other 32-element type. */
#include "backend/cpu/kernels_internal.h"

float hr_scalar_dot_mxfp4(int64_t k, const void *w, const void *a) {
    const hr_block_mxfp4 *x = w;
    const hr_block_q8_0 *y = a;
    const int64_t nb = k / HR_QK_MXFP4;
    float acc[8] = {0};
    for (int64_t b = 0; b < nb; b += 2) {
        for (int l = 0; l < 8; l++) {
            const int64_t ib = b + (l >> 2);
            int s = 0;
            float d = 0.0f;
            if (ib < nb) {
                for (int j = 4 * (l & 3); j < 4 * (l & 3) + 4; j++)
                    s += HR_MXFP4_VALUES[x[ib].qs[j] & 0x0F] * y[ib].qs[j] +
                         HR_MXFP4_VALUES[x[ib].qs[j] >> 4] * y[ib].qs[j + 16];
                d = hr_mxfp4_half_scale(x[ib].e) * hr_f16_to_f32(y[ib].d);
            }
            acc[l] = fmaf(d, (float)s, acc[l]);
        }
    }
    const float s0 = acc[0] + acc[4], s1 = acc[1] + acc[5], s2 = acc[2] + acc[6], s3 = acc[3] + acc[7];
    return (s0 + s2) + (s1 + s3);
}

void hr_scalar_tile_mxfp4(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                          float *y, size_t y_stride) {
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < nr; r++)
            y[(size_t)t * y_stride + (size_t)r] =
                hr_scalar_dot_mxfp4(k, (const char *)w + (size_t)r * w_stride, (const char *)a + (size_t)t * a_stride);
}

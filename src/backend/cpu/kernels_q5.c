/* kernels_q5.c: the scalar table's q5_0 and q5_1 dots (against q8_0 activations) and their tiles, in
 * portable C that reduces in exactly the order of the SIMD builds (kernels_q5_tile.h), so every table
 * gives the same bits.
 *
 * The order: blocks in pairs (b, b + 1), an odd last block paired with a zero block of scales 0; lane
 * l (0..7) belongs to block b + (l >> 2) and covers elements j = 4 (l & 3) .. + 3 and j + 16. With q
 * the 5-bit values (0..31) and y the activations, per pair:
 *   q5_0: acc_l = fmaf(dx * dy, (float)s_l, acc_l),   s_l = sum (q - 16) y        (exact)
 *   q5_1: acc_l = fmaf(dx * dy, (float)s_l, acc_l),   s_l = sum q y               (exact)
 *         acc_l = fmaf(mx, dy * (float)ys_l, acc_l),  ys_l = sum y               (exact)
 * then hsum8 of the lanes ((l, l + 4) pairs, then (0, 2) and (1, 3), then the two halves). */
#include "backend/cpu/kernels_internal.h"

static float q5_dot(int64_t k, const void *w, const void *a, const bool q51) {
    const hr_block_q5_0 *x0 = w;
    const hr_block_q5_1 *x1 = w;
    const hr_block_q8_0 *y = a;
    const int64_t nb = k / HR_QK5_0;
    float acc[8] = {0};
    for (int64_t b = 0; b < nb; b += 2) {
        for (int l = 0; l < 8; l++) {
            const int64_t ib = b + (l >> 2);
            int s = 0, ys = 0;
            float d = 0.0f, m = 0.0f, dy = 0.0f;
            if (ib < nb) {
                const uint8_t *qs = q51 ? x1[ib].qs : x0[ib].qs;
                const uint8_t *qhb = q51 ? x1[ib].qh : x0[ib].qh;
                const uint32_t qh =
                    (uint32_t)qhb[0] | (uint32_t)qhb[1] << 8 | (uint32_t)qhb[2] << 16 | (uint32_t)qhb[3] << 24;
                const int off = q51 ? 0 : 16;
                for (int j = 4 * (l & 3); j < 4 * (l & 3) + 4; j++) {
                    const int lo = (qs[j] & 0x0F) | (int)((qh >> j) & 1) << 4;
                    const int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
                    s += (lo - off) * y[ib].qs[j] + (hi - off) * y[ib].qs[j + 16];
                    ys += y[ib].qs[j] + y[ib].qs[j + 16];
                }
                dy = hr_f16_to_f32(y[ib].d);
                d = hr_f16_to_f32(q51 ? x1[ib].d : x0[ib].d) * dy;
                if (q51) m = hr_f16_to_f32(x1[ib].m);
            }
            acc[l] = fmaf(d, (float)s, acc[l]);
            if (q51) acc[l] = fmaf(m, dy * (float)ys, acc[l]);
        }
    }
    const float s0 = acc[0] + acc[4], s1 = acc[1] + acc[5], s2 = acc[2] + acc[6], s3 = acc[3] + acc[7];
    return (s0 + s2) + (s1 + s3);
}

float hr_scalar_dot_q5_0(int64_t k, const void *w, const void *a) { return q5_dot(k, w, a, false); }
float hr_scalar_dot_q5_1(int64_t k, const void *w, const void *a) { return q5_dot(k, w, a, true); }

/* Each element is the dot: invariant by construction. */
static void q5_tile(float (*dot)(int64_t, const void *, const void *), int64_t k, const void *w, size_t w_stride,
                    int nr, const void *a, size_t a_stride, int nt, float *y, size_t y_stride) {
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < nr; r++)
            y[(size_t)t * y_stride + (size_t)r] =
                dot(k, (const char *)w + (size_t)r * w_stride, (const char *)a + (size_t)t * a_stride);
}

void hr_scalar_tile_q5_0(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                         float *y, size_t y_stride) {
    q5_tile(hr_scalar_dot_q5_0, k, w, w_stride, nr, a, a_stride, nt, y, y_stride);
}

void hr_scalar_tile_q5_1(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                         float *y, size_t y_stride) {
    q5_tile(hr_scalar_dot_q5_1, k, w, w_stride, nr, a, a_stride, nt, y, y_stride);
}

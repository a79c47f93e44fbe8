/* kernels_x16_scalar.c: the scalar tiles of the interleaved layouts q4_0x16, q8_0x16, q4_Kx16, q5_Kx16 and
 * q6_Kx16 (the layouts and their repacking: tensor/x16.c), which define every table's results
 * (kernels_x16.h computes the same bits with SIMD), and the AVX2 tables' q8_0s / q8_Ks quantizers. */
#include <string.h>

#include "backend/cpu/kernels_internal.h"

/* The scalar element of each layout: row r of a group's nb blocks against one activation row. */
typedef float (*x16_dot_fn)(int64_t nb, const void *group, int r, const void *act);

static float dot_q4_0x16(int64_t nb, const void *gp, int r, const void *ap);
static float dot_q8_0x16(int64_t nb, const void *gp, int r, const void *ap);
static float dot_q4_Kx16(int64_t nb, const void *gp, int r, const void *ap);
static float dot_q5_Kx16(int64_t nb, const void *gp, int r, const void *ap);
static float dot_q6_Kx16(int64_t nb, const void *gp, int r, const void *ap);
static float dot_q5_0x16(int64_t nb, const void *gp, int r, const void *ap);

/* ---- the scalar tiles: each element the one sequence of tensor.h ---- */

static void tile(hr_dtype x16, x16_dot_fn dot, int64_t k, const void *w, size_t w_stride, int nr, const void *a,
                 size_t a_stride, int nt, float *y, size_t y_stride) {
    const int64_t nb = k / hr_dtype_get_info(x16)->block_elems;
    for (int g = 0; g < nr / HR_X16; g++) {
        const char *grp = (const char *)w + (size_t)g * HR_X16 * w_stride;
        for (int t = 0; t < nt; t++)
            for (int r = 0; r < HR_X16; r++)
                y[(size_t)t * y_stride + (size_t)(g * HR_X16 + r)] =
                    dot(nb, grp, r, (const char *)a + (size_t)t * a_stride);
    }
}

void hr_scalar_tile_q4_0x16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                            float *y, size_t y_stride) {
    tile(HR_DTYPE_Q4_0X16, dot_q4_0x16, k, w, w_stride, nr, a, a_stride, nt, y, y_stride);
}

void hr_scalar_tile_q8_0x16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                            float *y, size_t y_stride) {
    tile(HR_DTYPE_Q8_0X16, dot_q8_0x16, k, w, w_stride, nr, a, a_stride, nt, y, y_stride);
}

void hr_scalar_tile_q4_Kx16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                            float *y, size_t y_stride) {
    tile(HR_DTYPE_Q4_KX16, dot_q4_Kx16, k, w, w_stride, nr, a, a_stride, nt, y, y_stride);
}

void hr_scalar_tile_q5_Kx16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                            float *y, size_t y_stride) {
    tile(HR_DTYPE_Q5_KX16, dot_q5_Kx16, k, w, w_stride, nr, a, a_stride, nt, y, y_stride);
}

void hr_scalar_tile_q6_Kx16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                            float *y, size_t y_stride) {
    tile(HR_DTYPE_Q6_KX16, dot_q6_Kx16, k, w, w_stride, nr, a, a_stride, nt, y, y_stride);
}

void hr_scalar_tile_q5_0x16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                            float *y, size_t y_stride) {
    tile(HR_DTYPE_Q5_0X16, dot_q5_0x16, k, w, w_stride, nr, a, a_stride, nt, y, y_stride);
}

/* q5_0x16: u = nibble | fifth bit << 4 (0..31), the sum from 2 s8 = -16 sum(y): the exact dot of u - 16. */
static float dot_q5_0x16(int64_t nb, const void *gp, int r, const void *ap) {
    const hr_block_q5_0x16 *g = gp;
    const hr_block_q8_0s *a = ap;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        uint32_t qh;
        memcpy(&qh, &g[b].qh[4 * r], 4); /* little-endian, as the format stores it */
        int32_t isum = 2 * a[b].s8;
        for (int v = 0; v < 4; v++)
            for (int i = 0; i < 4; i++) {
                const uint8_t q = g[b].qs[64 * v + 4 * r + i];
                const int j = 4 * v + i;
                isum += (int)((q & 0x0F) | ((qh >> j) & 1) << 4) * a[b].qs[j] +
                        (int)((q >> 4) | ((qh >> (j + 16)) & 1) << 4) * a[b].qs[16 + j];
            }
        acc = fmaf(hr_f16_to_f32(g[b].d[r]) * a[b].d, (float)isum, acc);
    }
    return acc;
}

static float dot_q4_0x16(int64_t nb, const void *gp, int r, const void *ap) {
    const hr_block_q4_0x16 *g = gp;
    const hr_block_q8_0s *a = ap;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int32_t isum = a[b].s8;
        for (int v = 0; v < 4; v++)
            for (int i = 0; i < 4; i++) {
                const uint8_t q = g[b].qs[64 * v + 4 * r + i];
                isum += (q & 0x0F) * a[b].qs[4 * v + i] + (q >> 4) * a[b].qs[16 + 4 * v + i];
            }
        acc = fmaf(hr_f16_to_f32(g[b].d[r]) * a[b].d, (float)isum, acc);
    }
    return acc;
}

static float dot_q8_0x16(int64_t nb, const void *gp, int r, const void *ap) {
    const hr_block_q8_0x16 *g = gp;
    const hr_block_q8_0s *a = ap;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int32_t isum = a[b].s128;
        for (int v = 0; v < 8; v++)
            for (int i = 0; i < 4; i++) isum += g[b].qs[64 * v + 4 * r + i] * a[b].qs[4 * v + i];
        acc = fmaf(hr_f16_to_f32(g[b].d[r]) * a[b].d, (float)isum, acc);
    }
    return acc;
}

static float dot_q4_Kx16(int64_t nb, const void *gp, int r, const void *ap) {
    const hr_block_q4_Kx16 *g = gp;
    const hr_block_q8_Ks *a = ap;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t sc[HR_K_SCALE_SIZE];
        for (int c = 0; c < 3; c++) memcpy(&sc[4 * c], &g[b].scales[64 * c + 4 * r], 4);
        const float dw = hr_f16_to_f32(g[b].d[r]), mw = hr_f16_to_f32(g[b].dmin[r]);
        int32_t isum = 0, msum = 0;
        for (int s = 0; s < 8; s++) {
            uint8_t scale, min;
            hr_get_scale_min_k4(s, sc, &scale, &min);
            const int j = s / 2, shift = 4 * (s & 1);
            int32_t qdot = 0, ys = 0;
            for (int v = 0; v < 8; v++)
                for (int i = 0; i < 4; i++) {
                    const int8_t y = a[b].qs[64 * j + 32 * (s & 1) + 4 * v + i];
                    qdot += ((g[b].qs[512 * j + 64 * v + 4 * r + i] >> shift) & 15) * y;
                    ys += y;
                }
            isum += scale * qdot;
            msum += min * ys;
        }
        acc = fmaf(dw * a[b].d, (float)isum, acc);
        acc = fmaf(-(mw * a[b].d), (float)msum, acc);
    }
    return acc;
}

/* q5_Kx16: q4_Kx16's sequence with the fifth bit (bit s of the lane's qh byte) on every value. */
static float dot_q5_Kx16(int64_t nb, const void *gp, int r, const void *ap) {
    const hr_block_q5_Kx16 *g = gp;
    const hr_block_q8_Ks *a = ap;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t sc[HR_K_SCALE_SIZE];
        for (int c = 0; c < 3; c++) memcpy(&sc[4 * c], &g[b].scales[64 * c + 4 * r], 4);
        const float dw = hr_f16_to_f32(g[b].d[r]), mw = hr_f16_to_f32(g[b].dmin[r]);
        int32_t isum = 0, msum = 0;
        for (int s = 0; s < 8; s++) {
            uint8_t scale, min;
            hr_get_scale_min_k4(s, sc, &scale, &min);
            const int j = s / 2, shift = 4 * (s & 1);
            int32_t qdot = 0, ys = 0;
            for (int v = 0; v < 8; v++)
                for (int i = 0; i < 4; i++) {
                    const int8_t y = a[b].qs[32 * s + 4 * v + i];
                    const int q = ((g[b].qs[512 * j + 64 * v + 4 * r + i] >> shift) & 15) |
                                  (((g[b].qh[64 * v + 4 * r + i] >> s) & 1) << 4);
                    qdot += q * y;
                    ys += y;
                }
            isum += scale * qdot;
            msum += min * ys;
        }
        acc = fmaf(dw * a[b].d, (float)isum, acc);
        acc = fmaf(-(mw * a[b].d), (float)msum, acc);
    }
    return acc;
}

/* q6_Kx16: element 128 h + 32 q + l (half h, quarter q, l < 32) of row r lives in lane 4 r + l % 4 of
 * the chunks a = ql chunk 16 h + l / 4, b = ql chunk 16 h + 8 + l / 4, c = qh chunk 8 h + l / 4
 * (hr_q6x16_value, tensor.h); its sub-block is 8 h + 2 q + l / 16. */
static float dot_q6_Kx16(int64_t nb, const void *gp, int r, const void *ap) {
    const hr_block_q6_Kx16 *g = gp;
    const hr_block_q8_K *a = ap;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int32_t isum = 0;
        for (int h = 0; h < 2; h++)
            for (int q = 0; q < 4; q++)
                for (int half16 = 0; half16 < 2; half16++) {
                    const int sb = 8 * h + 2 * q + half16;
                    int32_t s = 0;
                    for (int l = 16 * half16; l < 16 * half16 + 16; l++) {
                        const int lane = 4 * r + l % 4;
                        const int ca = g[b].q[hr_q6x16_ql_at(16 * h + l / 4) + lane];
                        const int cb = g[b].q[hr_q6x16_ql_at(16 * h + 8 + l / 4) + lane];
                        const int cc = g[b].q[hr_q6x16_qh_at(8 * h + l / 4) + lane];
                        s += (hr_q6x16_value(ca, cb, cc, q) - 32) * a[b].qs[128 * h + 32 * q + l];
                    }
                    isum += g[b].scales[64 * (sb / 4) + 4 * r + sb % 4] * s;
                }
        acc = fmaf(hr_f16_to_f32(g[b].d[r]) * a[b].d, (float)isum, acc);
    }
    return acc;
}

#if defined(__x86_64__) || defined(__i386__)
/* The AVX2 tables' (their base quantizers are AVX2 code, called only where the CPU has it). */
void hr_avx2_quantize_q8_0s(const float *x, void *dst, int64_t k) {
    hr_quantize_q8_0s_with(x, dst, k, hr_avx2_quantize_q8_0);
}
void hr_avx2_quantize_q8_Ks(const float *x, void *dst, int64_t k) {
    hr_quantize_q8_Ks_with(x, dst, k, hr_avx2_quantize_q8_K);
}
#endif

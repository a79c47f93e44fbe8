/* quant_x16.c: the q4_0x16 and q8_0x16 layouts (tensor.h): repacking q4_0 / q8_0 rows in place into
 * interleaved groups of 16 and back, the q8_0s activations they multiply, and the scalar
 * tiles, which define every table's results (kernels_x16.h computes the same bits with SIMD). */
#include <string.h>

#include "tensor/kernels_internal.h"

/* One group: the 16 plain rows at src -> the interleaved blocks at dst (distinct buffers). */
static void pack_group(const hr_block_q4_0 *src, int64_t nb, hr_block_q4_0x16 *dst) {
    for (int64_t b = 0; b < nb; b++)
        for (int r = 0; r < HR_X16; r++) {
            const hr_block_q4_0 *x = src + (size_t)r * (size_t)nb + b;
            dst[b].d[r] = x->d;
            for (int v = 0; v < 4; v++) memcpy(&dst[b].qs[64 * v + 4 * r], &x->qs[4 * v], 4);
        }
}

static void unpack_group(const hr_block_q4_0x16 *src, int64_t nb, hr_block_q4_0 *dst) {
    for (int64_t b = 0; b < nb; b++)
        for (int r = 0; r < HR_X16; r++) {
            hr_block_q4_0 *x = dst + (size_t)r * (size_t)nb + b;
            x->d = src[b].d[r];
            for (int v = 0; v < 4; v++) memcpy(&x->qs[4 * v], &src[b].qs[64 * v + 4 * r], 4);
        }
}

void hr_q4_0_repack_x16(void *rows_data, int64_t rows, int64_t k, void *tmp) {
    const int64_t nb = k / HR_QK4_0;
    const size_t group = (size_t)HR_X16 * (size_t)nb * sizeof(hr_block_q4_0);
    for (int64_t g = 0; g < rows / HR_X16; g++) {
        char *p = (char *)rows_data + (size_t)g * group;
        memcpy(tmp, p, group);
        pack_group(tmp, nb, (hr_block_q4_0x16 *)p);
    }
}

void hr_q4_0_unpack_x16(void *rows_data, int64_t rows, int64_t k, void *tmp) {
    const int64_t nb = k / HR_QK4_0;
    const size_t group = (size_t)HR_X16 * (size_t)nb * sizeof(hr_block_q4_0);
    for (int64_t g = 0; g < rows / HR_X16; g++) {
        char *p = (char *)rows_data + (size_t)g * group;
        memcpy(tmp, p, group);
        unpack_group(tmp, nb, (hr_block_q4_0 *)p);
    }
}

/* q8_0s from one q8_0 block: the same values, the f16 scale widened, -8 x the sum. */
void hr_q8_0s_from_q8_0(const hr_block_q8_0 *x, hr_block_q8_0s *y) {
    int32_t sum = 0;
    for (int j = 0; j < HR_QK8_0; j++) sum += x->qs[j];
    y->d = hr_f16_to_f32(x->d);
    y->s8 = -8 * sum;
    y->s128 = -128 * sum;
    memcpy(y->qs, x->qs, sizeof y->qs);
}

void hr_ref_quantize_q8_0s(const float *x, void *dst, int64_t k) {
    hr_block_q8_0s *y = dst;
    for (int64_t b = 0; b < k / HR_QK8_0; b++) {
        hr_block_q8_0 q;
        hr_ref_quantize_q8_0(x + b * HR_QK8_0, &q, HR_QK8_0);
        hr_q8_0s_from_q8_0(&q, &y[b]);
    }
}

/* The element of row r of a group and one activation row: the one sequence of tensor.h. */
static float x16_dot(int64_t nb, const hr_block_q4_0x16 *g, int r, const hr_block_q8_0s *a) {
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

void hr_scalar_tile_q4_0x16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                            float *y, size_t y_stride) {
    const int64_t nb = k / HR_QK4_0;
    for (int g = 0; g < nr / HR_X16; g++) {
        const hr_block_q4_0x16 *grp = (const void *)((const char *)w + (size_t)g * HR_X16 * w_stride);
        for (int t = 0; t < nt; t++) {
            const hr_block_q8_0s *at = (const void *)((const char *)a + (size_t)t * a_stride);
            for (int r = 0; r < HR_X16; r++)
                y[(size_t)t * y_stride + (size_t)(g * HR_X16 + r)] = x16_dot(nb, grp, r, at);
        }
    }
}

/* ---- q8_0x16 ---- */

static void pack_group8(const hr_block_q8_0 *src, int64_t nb, hr_block_q8_0x16 *dst) {
    for (int64_t b = 0; b < nb; b++)
        for (int r = 0; r < HR_X16; r++) {
            const hr_block_q8_0 *x = src + (size_t)r * (size_t)nb + b;
            dst[b].d[r] = x->d;
            for (int v = 0; v < 8; v++)
                for (int i = 0; i < 4; i++) dst[b].qs[64 * v + 4 * r + i] = (uint8_t)x->qs[4 * v + i] ^ 0x80;
        }
}

static void unpack_group8(const hr_block_q8_0x16 *src, int64_t nb, hr_block_q8_0 *dst) {
    for (int64_t b = 0; b < nb; b++)
        for (int r = 0; r < HR_X16; r++) {
            hr_block_q8_0 *x = dst + (size_t)r * (size_t)nb + b;
            x->d = src[b].d[r];
            for (int v = 0; v < 8; v++)
                for (int i = 0; i < 4; i++) x->qs[4 * v + i] = (int8_t)(src[b].qs[64 * v + 4 * r + i] ^ 0x80);
        }
}

void hr_q8_0_repack_x16(void *rows_data, int64_t rows, int64_t k, void *tmp) {
    const int64_t nb = k / HR_QK8_0;
    const size_t group = (size_t)HR_X16 * (size_t)nb * sizeof(hr_block_q8_0);
    for (int64_t g = 0; g < rows / HR_X16; g++) {
        char *p = (char *)rows_data + (size_t)g * group;
        memcpy(tmp, p, group);
        pack_group8(tmp, nb, (hr_block_q8_0x16 *)p);
    }
}

void hr_q8_0_unpack_x16(void *rows_data, int64_t rows, int64_t k, void *tmp) {
    const int64_t nb = k / HR_QK8_0;
    const size_t group = (size_t)HR_X16 * (size_t)nb * sizeof(hr_block_q8_0);
    for (int64_t g = 0; g < rows / HR_X16; g++) {
        char *p = (char *)rows_data + (size_t)g * group;
        memcpy(tmp, p, group);
        unpack_group8(tmp, nb, (hr_block_q8_0 *)p);
    }
}

static float x16_dot8(int64_t nb, const hr_block_q8_0x16 *g, int r, const hr_block_q8_0s *a) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int32_t isum = a[b].s128;
        for (int v = 0; v < 8; v++)
            for (int i = 0; i < 4; i++) isum += g[b].qs[64 * v + 4 * r + i] * a[b].qs[4 * v + i];
        acc = fmaf(hr_f16_to_f32(g[b].d[r]) * a[b].d, (float)isum, acc);
    }
    return acc;
}

void hr_scalar_tile_q8_0x16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                            float *y, size_t y_stride) {
    const int64_t nb = k / HR_QK8_0;
    for (int g = 0; g < nr / HR_X16; g++) {
        const hr_block_q8_0x16 *grp = (const void *)((const char *)w + (size_t)g * HR_X16 * w_stride);
        for (int t = 0; t < nt; t++) {
            const hr_block_q8_0s *at = (const void *)((const char *)a + (size_t)t * a_stride);
            for (int r = 0; r < HR_X16; r++)
                y[(size_t)t * y_stride + (size_t)(g * HR_X16 + r)] = x16_dot8(nb, grp, r, at);
        }
    }
}

/* ---- q4_Kx16 ---- */

static void pack_group_k(const hr_block_q4_K *src, int64_t nb, hr_block_q4_Kx16 *dst) {
    for (int64_t b = 0; b < nb; b++)
        for (int r = 0; r < HR_X16; r++) {
            const hr_block_q4_K *x = src + (size_t)r * (size_t)nb + b;
            dst[b].d[r] = x->d;
            dst[b].dmin[r] = x->dmin;
            for (int c = 0; c < 3; c++) memcpy(&dst[b].scales[64 * c + 4 * r], &x->scales[4 * c], 4);
            for (int j = 0; j < 4; j++)
                for (int v = 0; v < 8; v++) memcpy(&dst[b].qs[512 * j + 64 * v + 4 * r], &x->qs[32 * j + 4 * v], 4);
        }
}

static void unpack_group_k(const hr_block_q4_Kx16 *src, int64_t nb, hr_block_q4_K *dst) {
    for (int64_t b = 0; b < nb; b++)
        for (int r = 0; r < HR_X16; r++) {
            hr_block_q4_K *x = dst + (size_t)r * (size_t)nb + b;
            x->d = src[b].d[r];
            x->dmin = src[b].dmin[r];
            for (int c = 0; c < 3; c++) memcpy(&x->scales[4 * c], &src[b].scales[64 * c + 4 * r], 4);
            for (int j = 0; j < 4; j++)
                for (int v = 0; v < 8; v++) memcpy(&x->qs[32 * j + 4 * v], &src[b].qs[512 * j + 64 * v + 4 * r], 4);
        }
}

void hr_q4_K_repack_x16(void *rows_data, int64_t rows, int64_t k, void *tmp) {
    const int64_t nb = k / HR_QK_K;
    const size_t group = (size_t)HR_X16 * (size_t)nb * sizeof(hr_block_q4_K);
    for (int64_t g = 0; g < rows / HR_X16; g++) {
        char *p = (char *)rows_data + (size_t)g * group;
        memcpy(tmp, p, group);
        pack_group_k(tmp, nb, (hr_block_q4_Kx16 *)p);
    }
}

void hr_q4_K_unpack_x16(void *rows_data, int64_t rows, int64_t k, void *tmp) {
    const int64_t nb = k / HR_QK_K;
    const size_t group = (size_t)HR_X16 * (size_t)nb * sizeof(hr_block_q4_K);
    for (int64_t g = 0; g < rows / HR_X16; g++) {
        char *p = (char *)rows_data + (size_t)g * group;
        memcpy(tmp, p, group);
        unpack_group_k(tmp, nb, (hr_block_q4_K *)p);
    }
}

void hr_q8_Ks_from_q8_K(const hr_block_q8_K *x, hr_block_q8_Ks *y) {
    y->d = x->d;
    memcpy(y->qs, x->qs, sizeof y->qs);
    int32_t ys[8];
    for (int s = 0; s < 8; s++) ys[s] = x->bsums[2 * s] + x->bsums[2 * s + 1];
    static const int pair[4][2] = {{0, 2}, {1, 3}, {4, 6}, {5, 7}};
    for (int p = 0; p < 4; p++)
        y->ysp[p] = (int32_t)(((uint32_t)(uint16_t)ys[pair[p][0]]) | ((uint32_t)(uint16_t)ys[pair[p][1]] << 16));
}

static void quantize_q8_Ks(const float *x, void *dst, int64_t k, void (*q8_K)(const float *, void *, int64_t)) {
    hr_block_q8_Ks *y = dst;
    for (int64_t b = 0; b < k / HR_QK_K; b++) {
        hr_block_q8_K q;
        q8_K(x + b * HR_QK_K, &q, HR_QK_K);
        hr_q8_Ks_from_q8_K(&q, &y[b]);
    }
}

void hr_ref_quantize_q8_Ks(const float *x, void *dst, int64_t k) { quantize_q8_Ks(x, dst, k, hr_ref_quantize_q8_K); }

#if defined(__x86_64__) || defined(__i386__)
/* The AVX2 tables' (the q8_K quantizer is AVX2 code, called only where the CPU has it). */
void hr_avx2_quantize_q8_Ks(const float *x, void *dst, int64_t k) { quantize_q8_Ks(x, dst, k, hr_avx2_quantize_q8_K); }
#endif

static float x16_dot_k(int64_t nb, const hr_block_q4_Kx16 *g, int r, const hr_block_q8_Ks *a) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t sc[HR_K_SCALE_SIZE];
        for (int c = 0; c < 3; c++) memcpy(&sc[4 * c], &g[b].scales[64 * c + 4 * r], 4);
        const float dw = hr_f16_to_f32(g[b].d[r]), mw = hr_f16_to_f32(g[b].dmin[r]);
        int32_t msum = 0;
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
            acc = fmaf((dw * (float)scale) * a[b].d, (float)qdot, acc);
            msum += min * ys;
        }
        acc = fmaf(-(mw * a[b].d), (float)msum, acc);
    }
    return acc;
}

void hr_scalar_tile_q4_Kx16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                            float *y, size_t y_stride) {
    const int64_t nb = k / HR_QK_K;
    for (int g = 0; g < nr / HR_X16; g++) {
        const hr_block_q4_Kx16 *grp = (const void *)((const char *)w + (size_t)g * HR_X16 * w_stride);
        for (int t = 0; t < nt; t++) {
            const hr_block_q8_Ks *at = (const void *)((const char *)a + (size_t)t * a_stride);
            for (int r = 0; r < HR_X16; r++)
                y[(size_t)t * y_stride + (size_t)(g * HR_X16 + r)] = x16_dot_k(nb, grp, r, at);
        }
    }
}

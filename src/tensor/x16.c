/* x16.c: the interleaved layouts q4_0x16, q8_0x16, q4_Kx16, q5_Kx16, q6_Kx16 and q5_0x16 (tensor.h): repacking rows in
 * place into groups of 16 and back, and the q8_0s / q8_Ks activations they multiply (their reference
 * quantizers). The scalar tiles that define every kernel table's results are the CPU backend's
 * (backend/cpu/kernels_x16_scalar.c). */
#include <string.h>

#include "tensor/tensor_ref.h"

/* ---- the layouts: how row r's block moves between the file's layout and its group's block ----
 * move(plain, x, r, pack): pack copies the plain block into its place in the group block x, else
 * the other way. Every layout is the scales by row and the values as 4-byte lanes of 64-byte chunks. */

static void lane4(void *plain, void *x, bool pack) {
    if (pack)
        memcpy(x, plain, 4);
    else
        memcpy(plain, x, 4);
}

static void scale(hr_f16 *plain, hr_f16 *x, bool pack) {
    if (pack)
        *x = *plain;
    else
        *plain = *x;
}

static void move_q4_0(void *plain, void *x, int r, bool pack) {
    hr_block_q4_0 *p = plain;
    hr_block_q4_0x16 *g = x;
    scale(&p->d, &g->d[r], pack);
    for (int v = 0; v < 4; v++) lane4(&p->qs[4 * v], &g->qs[64 * v + 4 * r], pack);
}

static void move_q5_0(void *plain, void *x, int r, bool pack) {
    hr_block_q5_0 *p = plain;
    hr_block_q5_0x16 *g = x;
    scale(&p->d, &g->d[r], pack);
    lane4(p->qh, &g->qh[4 * r], pack);
    for (int v = 0; v < 4; v++) lane4(&p->qs[4 * v], &g->qs[64 * v + 4 * r], pack);
}

static void move_q8_0(void *plain, void *x, int r, bool pack) {
    hr_block_q8_0 *p = plain;
    hr_block_q8_0x16 *g = x;
    scale(&p->d, &g->d[r], pack);
    for (int v = 0; v < 8; v++) {
        lane4(&p->qs[4 * v], &g->qs[64 * v + 4 * r], pack);
        for (int i = 0; i < 4; i++) /* stored + 128 (x ^ 0x80), undone by the same xor */
            if (pack)
                g->qs[64 * v + 4 * r + i] ^= 0x80;
            else
                p->qs[4 * v + i] = (int8_t)((uint8_t)p->qs[4 * v + i] ^ 0x80);
    }
}

static void move_q4_K(void *plain, void *x, int r, bool pack) {
    hr_block_q4_K *p = plain;
    hr_block_q4_Kx16 *g = x;
    scale(&p->d, &g->d[r], pack);
    scale(&p->dmin, &g->dmin[r], pack);
    for (int c = 0; c < 3; c++) lane4(&p->scales[4 * c], &g->scales[64 * c + 4 * r], pack);
    for (int j = 0; j < 4; j++)
        for (int v = 0; v < 8; v++) lane4(&p->qs[32 * j + 4 * v], &g->qs[512 * j + 64 * v + 4 * r], pack);
}

static void move_q5_K(void *plain, void *x, int r, bool pack) {
    hr_block_q5_K *p = plain;
    hr_block_q5_Kx16 *g = x;
    scale(&p->d, &g->d[r], pack);
    scale(&p->dmin, &g->dmin[r], pack);
    for (int c = 0; c < 3; c++) lane4(&p->scales[4 * c], &g->scales[64 * c + 4 * r], pack);
    for (int v = 0; v < 8; v++) lane4(&p->qh[4 * v], &g->qh[64 * v + 4 * r], pack);
    for (int j = 0; j < 4; j++)
        for (int v = 0; v < 8; v++) lane4(&p->qs[32 * j + 4 * v], &g->qs[512 * j + 64 * v + 4 * r], pack);
}

static void move_q6_K(void *plain, void *x, int r, bool pack) {
    hr_block_q6_K *p = plain;
    hr_block_q6_Kx16 *g = x;
    scale(&p->d, &g->d[r], pack);
    for (int c = 0; c < 4; c++) lane4(&p->scales[4 * c], &g->scales[64 * c + 4 * r], pack);
    /* element 128 h + 32 q + l: value u_q from the file's a (ql, q0 low / q2 high nibble), b (ql, q1 / q3)
     * and c (qh, 2 bits a quarter); in the lanes a' = u0 | u3 bits 0-1 << 6, b' = u1 | bits 2-3 << 6,
     * c' = u2 | bits 4-5 << 6 (tensor.h) */
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            uint8_t *a = &p->ql[64 * h + l], *b = &p->ql[64 * h + 32 + l], *c = &p->qh[32 * h + l];
            const int lane = 4 * r + l % 4;
            uint8_t *xa = &g->q[hr_q6x16_ql_at(16 * h + l / 4) + lane];
            uint8_t *xb = &g->q[hr_q6x16_ql_at(16 * h + 8 + l / 4) + lane],
                    *xc = &g->q[hr_q6x16_qh_at(8 * h + l / 4) + lane];
            if (pack) {
                const int u0 = (*a & 15) | (*c & 3) << 4, u1 = (*b & 15) | (*c >> 2 & 3) << 4;
                const int u2 = *a >> 4 | (*c >> 4 & 3) << 4, u3 = *b >> 4 | (*c >> 6) << 4;
                *xa = (uint8_t)(u0 | (u3 & 3) << 6);
                *xb = (uint8_t)(u1 | (u3 >> 2 & 3) << 6);
                *xc = (uint8_t)(u2 | (u3 >> 4) << 6);
            } else {
                const int u0 = hr_q6x16_value(*xa, *xb, *xc, 0), u1 = hr_q6x16_value(*xa, *xb, *xc, 1);
                const int u2 = hr_q6x16_value(*xa, *xb, *xc, 2), u3 = hr_q6x16_value(*xa, *xb, *xc, 3);
                *a = (uint8_t)((u0 & 15) | (u2 & 15) << 4);
                *b = (uint8_t)((u1 & 15) | (u3 & 15) << 4);
                *c = (uint8_t)(u0 >> 4 | (u1 >> 4) << 2 | (u2 >> 4) << 4 | (u3 >> 4) << 6);
            }
        }
}

typedef struct x16_kind {
    hr_dtype x16, file;
    void (*move)(void *plain, void *x, int r, bool pack);
} x16_kind;

static const x16_kind kinds[] = {
    {HR_DTYPE_Q4_0X16, HR_DTYPE_Q4_0, move_q4_0}, {HR_DTYPE_Q8_0X16, HR_DTYPE_Q8_0, move_q8_0},
    {HR_DTYPE_Q4_KX16, HR_DTYPE_Q4_K, move_q4_K}, {HR_DTYPE_Q5_KX16, HR_DTYPE_Q5_K, move_q5_K},
    {HR_DTYPE_Q6_KX16, HR_DTYPE_Q6_K, move_q6_K}, {HR_DTYPE_Q5_0X16, HR_DTYPE_Q5_0, move_q5_0},
};

static const x16_kind *kind_of(hr_dtype x16) {
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (kinds[i].x16 == x16) return &kinds[i];
    return NULL;
}

hr_dtype hr_dtype_x16(hr_dtype t) {
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (kinds[i].file == t) return kinds[i].x16;
    return t;
}

/* Group after group: the group's bytes to tmp, then every (block, row) moved back into place. */
static void regroup(hr_dtype x16, void *rows_data, int64_t rows, int64_t k, void *tmp, bool pack) {
    const x16_kind *kd = kind_of(x16);
    if (!kd) return;
    const hr_dtype_info *info = hr_dtype_get_info(kd->file);
    const int64_t nb = k / info->block_elems;
    const size_t bb = (size_t)info->block_bytes, group = (size_t)HR_X16 * (size_t)nb * bb;
    for (int64_t g = 0; g < rows / HR_X16; g++) {
        char *p = (char *)rows_data + (size_t)g * group, *t = tmp;
        memcpy(t, p, group);
        char *plain = pack ? t : p, *x = pack ? p : t;
        for (int64_t b = 0; b < nb; b++)
            for (int r = 0; r < HR_X16; r++)
                kd->move(plain + ((size_t)r * (size_t)nb + (size_t)b) * bb, x + (size_t)b * HR_X16 * bb, r, pack);
    }
}

void hr_x16_repack(hr_dtype x16, void *rows_data, int64_t rows, int64_t k, void *tmp) {
    regroup(x16, rows_data, rows, k, tmp, true);
}

void hr_x16_unpack(hr_dtype x16, void *rows_data, int64_t rows, int64_t k, void *tmp) {
    regroup(x16, rows_data, rows, k, tmp, false);
}

/* ---- activations ---- */

/* q8_0s from one q8_0 block: the same values, the f16 scale widened, -8 x the sum. */
void hr_q8_0s_from_q8_0(const hr_block_q8_0 *x, hr_block_q8_0s *y) {
    int32_t sum = 0;
    for (int j = 0; j < HR_QK8_0; j++) sum += x->qs[j];
    y->d = hr_f16_to_f32(x->d);
    y->s8 = -8 * sum;
    y->s128 = -128 * sum;
    memcpy(y->qs, x->qs, sizeof y->qs);
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

/* One block of the base quantizer (q8_0 / q8_K: the reference here; the CPU backend passes its AVX2
 * build, the same bytes), then its sums. */
void hr_quantize_q8_0s_with(const float *x, void *dst, int64_t k, void (*q8_0)(const float *, void *, int64_t)) {
    hr_block_q8_0s *y = dst;
    for (int64_t b = 0; b < k / HR_QK8_0; b++) {
        hr_block_q8_0 q;
        q8_0(x + b * HR_QK8_0, &q, HR_QK8_0);
        hr_q8_0s_from_q8_0(&q, &y[b]);
    }
}

void hr_quantize_q8_Ks_with(const float *x, void *dst, int64_t k, void (*q8_K)(const float *, void *, int64_t)) {
    hr_block_q8_Ks *y = dst;
    for (int64_t b = 0; b < k / HR_QK_K; b++) {
        hr_block_q8_K q;
        q8_K(x + b * HR_QK_K, &q, HR_QK_K);
        hr_q8_Ks_from_q8_K(&q, &y[b]);
    }
}

void hr_ref_quantize_q8_0s(const float *x, void *dst, int64_t k) {
    hr_quantize_q8_0s_with(x, dst, k, hr_ref_quantize_q8_0);
}
void hr_ref_quantize_q8_Ks(const float *x, void *dst, int64_t k) {
    hr_quantize_q8_Ks_with(x, dst, k, hr_ref_quantize_q8_K);
}

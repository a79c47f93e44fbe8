/* kernels_scalar.c: the scalar table's dots, in portable C that reduces in exactly the order of the
 * SIMD kernels (kernels_*_avx2.c), so that every table gives the same bits for the same input.
 *
 * The order being reproduced, per (weight row, activation row) pair: eight float lanes, each updated
 * with one correctly rounded fused multiply-add (fmaf) per step; steps in increasing k; then the
 * fixed horizontal sum hsum8 ((l, l + 4) pairs, then (0, 2) and (1, 3), then the two halves), then
 * (float types) the k % 8 tail elements in order with fmaf. What each lane receives at a step is
 * written out per type below; the integer parts are exact, so only which products land in which
 * lane matters, not the order they are added in. The _ref functions in quant_ref.c stay the
 * definition of correct (ggml's order); these are the definition of "the same program". */
#include <math.h>
#include <string.h>

#include "backend/cpu/kernels_internal.h"

/* hsum8 of the SIMD kernels: (lo128 + hi128), then (0 + 2, 1 + 3), then their sum. */
static float lanes_hsum8(const float v[8]) {
    const float s0 = v[0] + v[4], s1 = v[1] + v[5], s2 = v[2] + v[6], s3 = v[3] + v[7];
    const float t0 = s0 + s2, t1 = s1 + s3;
    return t0 + t1;
}

/* ---- float weights: lane l takes element 8i + l of every full group of 8 ---- */

enum { F_F32, F_F16, F_BF16 };

static float load_elem(const void *row, int64_t j, int kind) {
    if (kind == F_F32) return ((const float *)row)[j];
    if (kind == F_F16) return hr_f16_to_f32(((const hr_f16 *)row)[j]);
    return hr_bf16_to_f32(((const hr_bf16 *)row)[j]);
}

static float float_dot(int64_t k, const void *w, int wkind, const void *a, int akind) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= k; i += 8)
        for (int l = 0; l < 8; l++) acc[l] = fmaf(load_elem(w, i + l, wkind), load_elem(a, i + l, akind), acc[l]);
    float sum = lanes_hsum8(acc);
    for (; i < k; i++) sum = fmaf(load_elem(w, i, wkind), load_elem(a, i, akind), sum);
    return sum;
}

float hr_scalar_dot_f32(int64_t k, const void *w, const void *a) { return float_dot(k, w, F_F32, a, F_F32); }
float hr_scalar_dot_f16(int64_t k, const void *w, const void *a) { return float_dot(k, w, F_F16, a, F_F16); }
float hr_scalar_dot_bf16(int64_t k, const void *w, const void *a) { return float_dot(k, w, F_BF16, a, F_F32); }

/* ---- q8_0 / q4_0 weights against q8_0 activations: blocks in pairs (b, b + 1), an odd last block
 * paired with a zero block of scale 0. Each lane belongs to one block c of the pair and receives
 *     fma(d_x[c] * d_y[c], (float)s_lane, acc_lane)
 * where s_lane is an exact integer sum of products of that block's elements:
 *   q8_0: lane l is block l & 1; its elements are the 4-byte groups g and g + 2 with
 *         g = ((l >> 1) & 1) + 4 * (l >> 2) (the unpacklo/unpackhi interleave of kernels_avx2.c)
 *   q4_0: lane l is block l >> 2; its elements are j = 4 (l & 3) .. + 3 (low nibbles, x[j]) and
 *         j + 16 (high nibbles) */

static float q_pair_dots(int64_t nb, const void *w, const hr_block_q8_0 *y, bool q4) {
    const hr_block_q8_0 *x8 = w;
    const hr_block_q4_0 *x4 = w;
    float acc[8] = {0};
    for (int64_t b = 0; b < nb; b += 2) {
        for (int l = 0; l < 8; l++) {
            const int c = q4 ? l >> 2 : l & 1;
            const int64_t ib = b + c;
            int s = 0;
            float d = 0.0f;
            if (ib < nb) {
                const int8_t *yq = y[ib].qs;
                if (q4) {
                    const uint8_t *q = x4[ib].qs;
                    for (int j = 4 * (l & 3); j < 4 * (l & 3) + 4; j++)
                        s += ((q[j] & 0x0F) - 8) * yq[j] + ((q[j] >> 4) - 8) * yq[j + 16];
                    d = hr_f16_to_f32(x4[ib].d) * hr_f16_to_f32(y[ib].d);
                } else {
                    const int g = ((l >> 1) & 1) + 4 * (l >> 2);
                    const int8_t *q = x8[ib].qs;
                    for (int j = 0; j < 4; j++)
                        s += q[4 * g + j] * yq[4 * g + j] + q[4 * g + 8 + j] * yq[4 * g + 8 + j];
                    d = hr_f16_to_f32(x8[ib].d) * hr_f16_to_f32(y[ib].d);
                }
            }
            acc[l] = fmaf(d, (float)s, acc[l]);
        }
    }
    return lanes_hsum8(acc);
}

float hr_scalar_dot_q8_0(int64_t k, const void *w, const void *a) { return q_pair_dots(k / HR_QK8_0, w, a, false); }
float hr_scalar_dot_q4_0(int64_t k, const void *w, const void *a) { return q_pair_dots(k / HR_QK4_0, w, a, true); }

/* ---- K-quants against q8_K: per super-block, lane l receives
 *     acc  = fma(d_x * d_y, (float)s_l, acc)
 *     macc = fma(dmin_x * d_y, (float)m_l, macc)                    (q4_K, q5_K)
 * with s_l = sum over the eight 32-element chunks j of sc_j(l) * sum_{b = 4l..4l+3} q_j[b] y[32j + b]
 * (q_j unsigned: q4_K 0..15, q5_K 0..31, q6_K 0..63; q6_K's sc_j(l) is scale 2j for l < 4 and
 * 2j + 1 above, and s_l also loses 32 (sc[2l] bsums[2l] + sc[2l + 1] bsums[2l + 1])) and
 * m_l = min_l (bsums[2l] + bsums[2l + 1]); result hsum8(acc) - hsum8(macc). */

enum { KQ4, KQ5, KQ6 };

/* Element b (0..31) of chunk j of super-block x, unsigned. */
static int k_elem(const void *x, int j, int b, int kind) {
    if (kind == KQ4) {
        const hr_block_q4_K *q = x;
        const uint8_t v = q->qs[32 * (j / 2) + b];
        return (j & 1) ? v >> 4 : v & 0x0F;
    }
    if (kind == KQ5) {
        const hr_block_q5_K *q = x;
        const uint8_t v = q->qs[32 * (j / 2) + b];
        return ((j & 1) ? v >> 4 : v & 0x0F) | (((q->qh[b] >> j) & 1) << 4);
    }
    const hr_block_q6_K *q = x;
    const int h = j / 4, sub = j % 4;
    const uint8_t v = q->ql[64 * h + 32 * (sub & 1) + b];
    const int lo = sub < 2 ? v & 0x0F : v >> 4;
    return lo | (((q->qh[32 * h + b] >> (2 * sub)) & 3) << 4);
}

static float k_dot(int64_t k, const char *w, const void *a, int kind) {
    const size_t wbytes = kind == KQ4   ? sizeof(hr_block_q4_K)
                          : kind == KQ5 ? sizeof(hr_block_q5_K)
                                        : sizeof(hr_block_q6_K);
    float acc[8] = {0}, macc[8] = {0};
    for (int64_t i = 0; i < k / HR_QK_K; i++) {
        const void *x = w + (size_t)i * wbytes;
        const hr_block_q8_K *yb = (const hr_block_q8_K *)a + i;
        int sc[16], mn[8] = {0};
        float d, dmin = 0.0f;
        if (kind == KQ6) {
            const hr_block_q6_K *q = x;
            for (int j = 0; j < 16; j++) sc[j] = q->scales[j];
            d = hr_f16_to_f32(q->d);
        } else {
            const hr_block_q4_K *q4 = x;
            const hr_block_q5_K *q5 = x;
            const uint8_t *scales = kind == KQ4 ? q4->scales : q5->scales;
            for (int j = 0; j < 8; j++) {
                uint8_t s6, m6;
                hr_get_scale_min_k4(j, scales, &s6, &m6);
                sc[j] = s6;
                mn[j] = m6;
            }
            d = hr_f16_to_f32(kind == KQ4 ? q4->d : q5->d);
            dmin = hr_f16_to_f32(kind == KQ4 ? q4->dmin : q5->dmin);
        }
        for (int l = 0; l < 8; l++) {
            int s = 0;
            for (int j = 0; j < 8; j++) {
                const int scale = kind == KQ6 ? sc[2 * j + (l >= 4)] : sc[j];
                int p = 0;
                for (int b = 4 * l; b < 4 * l + 4; b++) p += k_elem(x, j, b, kind) * yb->qs[32 * j + b];
                s += scale * p;
            }
            const int bs = yb->bsums[2 * l] + yb->bsums[2 * l + 1];
            if (kind == KQ6) s -= 32 * (sc[2 * l] * yb->bsums[2 * l] + sc[2 * l + 1] * yb->bsums[2 * l + 1]);
            acc[l] = fmaf(d * yb->d, (float)s, acc[l]);
            if (kind != KQ6) macc[l] = fmaf(dmin * yb->d, (float)(mn[l] * bs), macc[l]);
        }
    }
    return lanes_hsum8(acc) - lanes_hsum8(macc);
}

float hr_scalar_dot_q4_K(int64_t k, const void *w, const void *a) { return k_dot(k, w, a, KQ4); }
float hr_scalar_dot_q5_K(int64_t k, const void *w, const void *a) { return k_dot(k, w, a, KQ5); }
float hr_scalar_dot_q6_K(int64_t k, const void *w, const void *a) { return k_dot(k, w, a, KQ6); }

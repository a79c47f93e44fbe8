/* gemv.cu: y[t] = W x[t] for the tokens of a batch, W in GGUF's row layout: f32, f16, or q8_0 / q4_0
 * blocks of 32 weights. One warp per output row (blockDim.x = 256: 8 rows per thread block, grid.x =
 * ceil(rows / 8)), one token per grid row (grid.y = T; x is [T][cols], y [T][rows]); each lane takes
 * every 32nd block (f32, f16: element) of the row, and the warp sums the lanes. x is f32 (no activation
 * quantization here: the CPU quantizes x to q8_0 for q8_0 / q4_0 weights and to f16 for f16 weights,
 * so results differ from the CPU's by that rounding and the order of the additions). Decode runs one
 * token (grid.y = 1); a prefill reads W once per token: the simple version. */
#include "common.cuh"

/* The frame every GEMV shares: the warp's row and lane, the grid row's token (its x and y), the lanes'
 * partial dot products summed, lane 0 writing y. dot(row, lane, x) gives a lane's part of row . x. */
template <typename Dot> static __device__ inline void gemv_rows(float *y, const float *x, int rows, int cols, Dot dot) {
    int row = ctaid_x() * (ntid_x() / HR_K_WARP) + tid_x() / HR_K_WARP, lane = tid_x() % HR_K_WARP;
    if (row >= rows) return; /* a whole warp leaves together: the shuffles below stay full-warp */
    x += (u64)ctaid_y() * (u64)cols;
    y += (u64)ctaid_y() * (u64)rows;
    float acc = warp_sum(dot(row, lane, x));
    if (lane == 0) y[row] = acc;
}

/* q8_0: per block an f16 scale d then 32 int8 q; w = d * q. W: [rows][cols / 32] blocks of 34 bytes. */
extern "C" __global__ void hr_k_gemv_q8_0(float *y, const u8 *W, const float *x, int rows, int cols) {
    gemv_rows(y, x, rows, cols, [=](int row, int lane, const float *xt) {
        int nb = cols / 32;
        const u8 *wr = W + (u64)row * (u64)nb * 34u;
        float acc = 0.0f;
        for (int b = lane; b < nb; b += HR_K_WARP) {
            const u8 *blk = wr + (u64)b * 34u;
            const float *xb = xt + (u64)b * 32u;
            float s = 0.0f;
            for (int i = 0; i < 32; i++) s += (float)(i8)blk[2 + i] * xb[i];
            acc += hr_h2f(hr_ld_u16(blk)) * s;
        }
        return acc;
    });
}

/* q4_0: per block an f16 scale d then 16 bytes; byte j holds weight j in its low nibble and weight
 * j + 16 in its high nibble; w = d * (nibble - 8). W: [rows][cols / 32] blocks of 18 bytes. */
extern "C" __global__ void hr_k_gemv_q4_0(float *y, const u8 *W, const float *x, int rows, int cols) {
    gemv_rows(y, x, rows, cols, [=](int row, int lane, const float *xt) {
        int nb = cols / 32;
        const u8 *wr = W + (u64)row * (u64)nb * 18u;
        float acc = 0.0f;
        for (int b = lane; b < nb; b += HR_K_WARP) {
            const u8 *blk = wr + (u64)b * 18u;
            const float *xb = xt + (u64)b * 32u;
            float s = 0.0f;
            for (int j = 0; j < 16; j++) {
                int q = blk[2 + j];
                s += (float)((q & 0xf) - 8) * xb[j] + (float)((q >> 4) - 8) * xb[j + 16];
            }
            acc += hr_h2f(hr_ld_u16(blk)) * s;
        }
        return acc;
    });
}

/* f32 and f16 weights: W [rows][cols] elements; lane l takes elements l, l + 32, ... */
extern "C" __global__ void hr_k_gemv_f32(float *y, const float *W, const float *x, int rows, int cols) {
    gemv_rows(y, x, rows, cols, [=](int row, int lane, const float *xt) {
        const float *wr = W + (u64)row * (u64)cols;
        float acc = 0.0f;
        for (int c = lane; c < cols; c += HR_K_WARP) acc += wr[c] * xt[c];
        return acc;
    });
}

extern "C" __global__ void hr_k_gemv_f16(float *y, const u16 *W, const float *x, int rows, int cols) {
    gemv_rows(y, x, rows, cols, [=](int row, int lane, const float *xt) {
        const u16 *wr = W + (u64)row * (u64)cols;
        float acc = 0.0f;
        for (int c = lane; c < cols; c += HR_K_WARP) acc += hr_h2f(wr[c]) * xt[c];
        return acc;
    });
}

/* bf16 weights: the upper half of an f32 */
extern "C" __global__ void hr_k_gemv_bf16(float *y, const u16 *W, const float *x, int rows, int cols) {
    gemv_rows(y, x, rows, cols, [=](int row, int lane, const float *xt) {
        const u16 *wr = W + (u64)row * (u64)cols;
        float acc = 0.0f;
        for (int c = lane; c < cols; c += HR_K_WARP) acc += __builtin_bit_cast(float, (u32)wr[c] << 16) * xt[c];
        return acc;
    });
}

/* ---- the K-quants: super-blocks of 256 weights. Each lane takes every 32nd run of 32 weights (run j
 * of a super-block: weights 32j .. 32j + 31), whose scale (and min) is one, so a row of 4096 keeps all
 * 32 lanes busy. Layouts (GGUF's):
 *   q4_K (144 bytes): f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles:
 *     byte 32 (j / 2) + l holds weight 32j + l in its low (j even) or high (j odd) nibble;
 *     w = d * sc_j * q - dmin * m_j.
 *   q5_K (176 bytes): d, dmin, the 12 scale bytes, 32 bytes qh, 128 bytes qs: q4_K's nibble plus bit
 *     j of qh[l] as the fifth bit.
 *   q6_K (210 bytes): 128 bytes ql, 64 bytes qh, 16 int8 scales, f16 d; in half h = j / 4, run r =
 *     j % 4: the low (r < 2) or high nibble of ql[64h + 32 (r % 2) + l] with bits 2r, 2r + 1 of
 *     qh[32h + l] above it, minus 32; w = d * scales[16h' ...] (one per 16 weights) * q. */

/* q4_K's and q5_K's 6-bit scale and min of run j (the packing of llama.cpp's get_scale_min_k4) */
static __device__ inline void k4_scale_min(const u8 *s, int j, float *sc, float *m) {
    if (j < 4) {
        *sc = (float)(s[j] & 63);
        *m = (float)(s[j + 4] & 63);
    } else {
        *sc = (float)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        *m = (float)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

/* sum over run j of super-block blk: w . x32 */
static __device__ inline float run_q4_K(const u8 *blk, int j, const float *x32) {
    float sc, m;
    k4_scale_min(blk + 4, j, &sc, &m);
    const float d = hr_h2f(hr_ld_u16(blk)) * sc, mn = hr_h2f(hr_ld_u16(blk + 2)) * m;
    const u8 *q = blk + 16 + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    float s = 0.0f, sx = 0.0f;
    for (int l = 0; l < 32; l++) {
        s += (float)((q[l] >> shift) & 0xF) * x32[l];
        sx += x32[l];
    }
    return d * s - mn * sx;
}

static __device__ inline float run_q5_K(const u8 *blk, int j, const float *x32) {
    float sc, m;
    k4_scale_min(blk + 4, j, &sc, &m);
    const float d = hr_h2f(hr_ld_u16(blk)) * sc, mn = hr_h2f(hr_ld_u16(blk + 2)) * m;
    const u8 *qh = blk + 16, *q = blk + 48 + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    float s = 0.0f, sx = 0.0f;
    for (int l = 0; l < 32; l++) {
        const int v = ((q[l] >> shift) & 0xF) | (((qh[l] >> j) & 1) << 4);
        s += (float)v * x32[l];
        sx += x32[l];
    }
    return d * s - mn * sx;
}

static __device__ inline float run_q6_K(const u8 *blk, int j, const float *x32) {
    const int h = j / 4, r = j % 4;
    const u8 *ql = blk + 64 * h + 32 * (r % 2), *qh = blk + 128 + 32 * h;
    const i8 *scales = (const i8 *)(blk + 192) + 8 * h + 2 * r; /* runs of 16: two scales per run */
    const float d = hr_h2f(hr_ld_u16(blk + 208));
    const int nshift = 4 * (r / 2), hshift = 2 * r;
    float s0 = 0.0f, s1 = 0.0f;
    for (int l = 0; l < 16; l++) {
        s0 += (float)((((ql[l] >> nshift) & 0xF) | (((qh[l] >> hshift) & 3) << 4)) - 32) * x32[l];
        s1 += (float)((((ql[l + 16] >> nshift) & 0xF) | (((qh[l + 16] >> hshift) & 3) << 4)) - 32) * x32[l + 16];
    }
    return d * ((float)scales[0] * s0 + (float)scales[1] * s1);
}

/* a lane's part of a K-quant row: its runs of 32 (kind 4, 5, 6: q4_K, q5_K, q6_K) */
static __device__ inline float dot_k(const u8 *W, int row, int lane, const float *x, int cols, int kind) {
    const u64 bytes = kind == 4 ? 144u : kind == 5 ? 176u : 210u;
    const u8 *wr = W + (u64)row * (u64)(cols / 256) * bytes;
    float acc = 0.0f;
    for (int r = lane; r < cols / 32; r += HR_K_WARP) {
        const u8 *blk = wr + (u64)(r / 8) * bytes;
        const float *x32 = x + (u64)r * 32u;
        acc += kind == 4   ? run_q4_K(blk, r % 8, x32)
               : kind == 5 ? run_q5_K(blk, r % 8, x32)
                           : run_q6_K(blk, r % 8, x32);
    }
    return acc;
}

extern "C" __global__ void hr_k_gemv_q4_K(float *y, const u8 *W, const float *x, int rows, int cols) {
    gemv_rows(y, x, rows, cols, [=](int row, int lane, const float *xt) { return dot_k(W, row, lane, xt, cols, 4); });
}
extern "C" __global__ void hr_k_gemv_q5_K(float *y, const u8 *W, const float *x, int rows, int cols) {
    gemv_rows(y, x, rows, cols, [=](int row, int lane, const float *xt) { return dot_k(W, row, lane, xt, cols, 5); });
}
extern "C" __global__ void hr_k_gemv_q6_K(float *y, const u8 *W, const float *x, int rows, int cols) {
    gemv_rows(y, x, rows, cols, [=](int row, int lane, const float *xt) { return dot_k(W, row, lane, xt, cols, 6); });
}

/* ---- q5_0 / q5_1 (llama.cpp's fallbacks for q4_K / q5_K where a row is not whole super-blocks): blocks
 * of 32; q5_0 (22 bytes): f16 d, 4 bytes qh, 16 bytes qs, w = d * (q - 16); q5_1 (24 bytes): f16 d, f16
 * m, qh, qs, w = d * q + m; q's low four bits are qs[j]'s low nibble (j < 16) or qs[j - 16]'s high one,
 * its fifth bit j of qh (little-endian). */
static __device__ inline float dot_q5(const u8 *W, int row, int lane, const float *x, int cols, bool one) {
    const u64 bytes = one ? 24u : 22u;
    const u8 *wr = W + (u64)row * (u64)(cols / 32) * bytes;
    float acc = 0.0f;
    for (int b = lane; b < cols / 32; b += HR_K_WARP) {
        const u8 *blk = wr + (u64)b * bytes, *qhp = blk + (one ? 4 : 2), *qs = qhp + 4;
        const u32 qh = (u32)qhp[0] | (u32)qhp[1] << 8 | (u32)qhp[2] << 16 | (u32)qhp[3] << 24;
        const float *xb = x + (u64)b * 32u;
        float s = 0.0f, sx = 0.0f;
        for (int j = 0; j < 16; j++) {
            const int q0 = (qs[j] & 0xF) | (int)((qh >> j) & 1) << 4, q1 = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1)
                                                                                              << 4;
            s += (float)q0 * xb[j] + (float)q1 * xb[j + 16];
            sx += xb[j] + xb[j + 16];
        }
        const float d = hr_h2f(hr_ld_u16(blk));
        acc += one ? d * s + hr_h2f(hr_ld_u16(blk + 2)) * sx : d * (s - 16.0f * sx);
    }
    return acc;
}

extern "C" __global__ void hr_k_gemv_q5_0(float *y, const u8 *W, const float *x, int rows, int cols) {
    gemv_rows(y, x, rows, cols,
              [=](int row, int lane, const float *xt) { return dot_q5(W, row, lane, xt, cols, false); });
}
extern "C" __global__ void hr_k_gemv_q5_1(float *y, const u8 *W, const float *x, int rows, int cols) {
    gemv_rows(y, x, rows, cols,
              [=](int row, int lane, const float *xt) { return dot_q5(W, row, lane, xt, cols, true); });
}

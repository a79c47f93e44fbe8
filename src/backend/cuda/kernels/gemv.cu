/* gemv.cu: y[t] = W x[t] for the tokens of a batch, W in GGUF's row layout: f32, f16, or q8_0 / q4_0
 * blocks of 32 weights. One warp per output row (blockDim.x = 256: 8 rows per thread block, grid.x =
 * ceil(rows / 8)), one token per grid row (grid.y = T; x is [T][cols], y [T][rows]); each lane takes
 * every 32nd block (f32, f16: element) of the row, and the warp sums the lanes. x is f32 (no activation
 * quantization here: the CPU quantizes x to q8_0 for q8_0 / q4_0 weights and to f16 for f16 weights,
 * so results differ from the CPU's by that rounding and the order of the additions). Decode runs one
 * token (grid.y = 1); a prefill reads W once per token: the simple version. */
#include "common.cuh"

/* q8_0: per block an f16 scale d then 32 int8 q; w = d * q. W: [rows][cols / 32] blocks of 34 bytes. */
extern "C" __global__ void hr_k_gemv_q8_0(float *y, const u8 *W, const float *x, int rows, int cols) {
    int row = ctaid_x() * (ntid_x() / HR_K_WARP) + tid_x() / HR_K_WARP, lane = tid_x() % HR_K_WARP;
    if (row >= rows) return; /* a whole warp leaves together: the shuffles below stay full-warp */
    x += (u64)ctaid_y() * (u64)cols;
    y += (u64)ctaid_y() * (u64)rows;
    int nb = cols / 32;
    const u8 *wr = W + (u64)row * (u64)nb * 34u;
    float acc = 0.0f;
    for (int b = lane; b < nb; b += HR_K_WARP) {
        const u8 *blk = wr + (u64)b * 34u;
        const float *xb = x + (u64)b * 32u;
        float s = 0.0f;
        for (int i = 0; i < 32; i++) s += (float)(i8)blk[2 + i] * xb[i];
        acc += hr_h2f(hr_ld_u16(blk)) * s;
    }
    acc = warp_sum(acc);
    if (lane == 0) y[row] = acc;
}

/* q4_0: per block an f16 scale d then 16 bytes; byte j holds weight j in its low nibble and weight
 * j + 16 in its high nibble; w = d * (nibble - 8). W: [rows][cols / 32] blocks of 18 bytes. */
extern "C" __global__ void hr_k_gemv_q4_0(float *y, const u8 *W, const float *x, int rows, int cols) {
    int row = ctaid_x() * (ntid_x() / HR_K_WARP) + tid_x() / HR_K_WARP, lane = tid_x() % HR_K_WARP;
    if (row >= rows) return;
    x += (u64)ctaid_y() * (u64)cols;
    y += (u64)ctaid_y() * (u64)rows;
    int nb = cols / 32;
    const u8 *wr = W + (u64)row * (u64)nb * 18u;
    float acc = 0.0f;
    for (int b = lane; b < nb; b += HR_K_WARP) {
        const u8 *blk = wr + (u64)b * 18u;
        const float *xb = x + (u64)b * 32u;
        float s = 0.0f;
        for (int j = 0; j < 16; j++) {
            int q = blk[2 + j];
            s += (float)((q & 0xf) - 8) * xb[j] + (float)((q >> 4) - 8) * xb[j + 16];
        }
        acc += hr_h2f(hr_ld_u16(blk)) * s;
    }
    acc = warp_sum(acc);
    if (lane == 0) y[row] = acc;
}

/* f32 and f16 weights: W [rows][cols] elements; lane l takes elements l, l + 32, ... */
extern "C" __global__ void hr_k_gemv_f32(float *y, const float *W, const float *x, int rows, int cols) {
    int row = ctaid_x() * (ntid_x() / HR_K_WARP) + tid_x() / HR_K_WARP, lane = tid_x() % HR_K_WARP;
    if (row >= rows) return;
    x += (u64)ctaid_y() * (u64)cols;
    y += (u64)ctaid_y() * (u64)rows;
    const float *wr = W + (u64)row * (u64)cols;
    float acc = 0.0f;
    for (int c = lane; c < cols; c += HR_K_WARP) acc += wr[c] * x[c];
    acc = warp_sum(acc);
    if (lane == 0) y[row] = acc;
}

extern "C" __global__ void hr_k_gemv_f16(float *y, const u16 *W, const float *x, int rows, int cols) {
    int row = ctaid_x() * (ntid_x() / HR_K_WARP) + tid_x() / HR_K_WARP, lane = tid_x() % HR_K_WARP;
    if (row >= rows) return;
    x += (u64)ctaid_y() * (u64)cols;
    y += (u64)ctaid_y() * (u64)rows;
    const u16 *wr = W + (u64)row * (u64)cols;
    float acc = 0.0f;
    for (int c = lane; c < cols; c += HR_K_WARP) acc += hr_h2f(wr[c]) * x[c];
    acc = warp_sum(acc);
    if (lane == 0) y[row] = acc;
}

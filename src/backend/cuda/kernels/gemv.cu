/* gemv.cu: y[t] = W x[t] for the tokens of a batch, W in GGUF's row layout (f32, f16, bf16, q8_0,
 * q4_0, q5_0, q5_1, q4_K, q5_K, q6_K). One warp per output row (blockDim.x = 256: 8 rows per thread
 * block, grid.x = ceil(rows / 8)), a tile of up to HR_K_GEMV_TT tokens per grid row (grid.y =
 * ceil(T / HR_K_GEMV_TT); x is [T][cols], y [T][rows]): each lane decodes every 32nd run of 32
 * weights of the row into registers once and multiplies it with each of the tile's tokens, and the
 * warp sums the lanes per token. So a batch of T tokens reads W ceil(T / 8) times, not T times (decode
 * at batch 16 or 64, prefill). x is f32 (no activation quantization here: the CPU quantizes x to q8_0
 * for q8_0 / q4_0 weights and to f16 for f16 weights, so results differ from the CPU's by that rounding
 * and the order of the additions). No tensor cores yet. */
#include "common.cuh"

#define HR_K_GEMV_TT 8 /* tokens a warp takes at once: the host's HR_CUDA_GEMV_TOKENS (cuda.h) */

/* The frame every GEMV shares: the warp's row and lane, tile `tile`'s tokens [t0, t0 + nt); lane l
 * takes runs l, l + 32, ... of the row (n_runs of them; the last may be short of 32 weights for the
 * float types, whose rows need not be whole runs), decode(row, run, w) writing the run's weights, then
 * a dot with each token's x. The lanes' sums per token are summed over the warp; lane 0 writes y. */
template <typename Decode>
static __device__ inline void gemv_rows(float *y, const float *x, int rows, int cols, int n_tokens, int tile,
                                        Decode decode) {
    const int row = ctaid_x() * (ntid_x() / HR_K_WARP) + tid_x() / HR_K_WARP, lane = tid_x() % HR_K_WARP;
    if (row >= rows) return; /* a whole warp leaves together: the shuffles below stay full-warp */
    const int t0 = tile * HR_K_GEMV_TT;
    const int nt = n_tokens - t0 < HR_K_GEMV_TT ? n_tokens - t0 : HR_K_GEMV_TT;
    float acc[HR_K_GEMV_TT];
    for (int t = 0; t < HR_K_GEMV_TT; t++) acc[t] = 0.0f;
    const int n_runs = (cols + 31) / 32;
    for (int r = lane; r < n_runs; r += HR_K_WARP) {
        const int len = cols - 32 * r < 32 ? cols - 32 * r : 32;
        float w[32];
        decode(row, r, w);
        for (int t = 0; t < nt; t++) {
            const float *xr = x + (u64)(t0 + t) * (u64)cols + (u64)r * 32u;
            float s = 0.0f;
            for (int i = 0; i < len; i++) s += w[i] * xr[i];
            acc[t] += s;
        }
    }
    for (int t = 0; t < nt; t++) { /* nt is the same for every lane: full-warp shuffles */
        const float v = warp_sum(acc[t]);
        if (lane == 0) y[(u64)(t0 + t) * (u64)rows + (u64)row] = v;
    }
}

/* The two kernels of a weight type whose run decoder is dec_NAME:
 *   hr_k_gemv_NAME(y, W, x, rows, cols, T): y[t] = W x[t], grid.y = ceil(T / HR_K_GEMV_TT) tiles;
 *   hr_k_gemv_moe_NAME(y, W, x, rows, cols, sel, x_div, expert_bytes): a mixture of experts' products,
 *     one (token, rank) slot s per grid row (grid.y = T K): y[s] = W_e x[s / x_div] with W_e the expert
 *     e = sel[s] of the stack W (expert e's rows at e * expert_bytes; GGUF's ffn_*_exps, experts
 *     outermost). x_div K: every slot of a token reads its row (gate, up); 1: each its own (down).
 *     First version: a slot reads its expert's rows alone, so a prefill reads an expert once per token
 *     routed to it, not once per step. */
#define HR_K_GEMV_KERNELS(NAME, WT)                                                                                    \
    extern "C" __global__ void hr_k_gemv_##NAME(float *y, const WT *W, const float *x, int rows, int cols,             \
                                                int n_tokens) {                                                        \
        gemv_rows(y, x, rows, cols, n_tokens, ctaid_y(),                                                               \
                  [=](int row, int r, float *w) { dec_##NAME(W, row, r, cols, w); });                                  \
    }                                                                                                                  \
    extern "C" __global__ void hr_k_gemv_moe_##NAME(float *y, const WT *W, const float *x, int rows, int cols,         \
                                                    const int *sel, int x_div, u64 expert_bytes) {                     \
        const int s = ctaid_y();                                                                                       \
        const WT *We = (const WT *)(const void *)((const u8 *)W + (u64)sel[s] * expert_bytes);                         \
        gemv_rows(y + (u64)s * (u64)rows, x + (u64)(s / x_div) * (u64)cols, rows, cols, 1, 0,                          \
                  [=](int row, int r, float *w) { dec_##NAME(We, row, r, cols, w); });                                 \
    }

/* q8_0: per block an f16 scale d then 32 int8 q; w = d * q. W: [rows][cols / 32] blocks of 34 bytes. */
static __device__ inline void dec_q8_0(const u8 *W, int row, int r, int cols, float *w) {
    const u8 *blk = W + ((u64)row * (u64)(cols / 32) + (u64)r) * 34u;
    const float d = hr_h2f(hr_ld_u16(blk));
    for (int i = 0; i < 32; i++) w[i] = d * (float)(i8)blk[2 + i];
}
HR_K_GEMV_KERNELS(q8_0, u8)

/* q4_0: per block an f16 scale d then 16 bytes; byte j holds weight j in its low nibble and weight
 * j + 16 in its high nibble; w = d * (nibble - 8). W: [rows][cols / 32] blocks of 18 bytes. */
static __device__ inline void dec_q4_0(const u8 *W, int row, int r, int cols, float *w) {
    const u8 *blk = W + ((u64)row * (u64)(cols / 32) + (u64)r) * 18u;
    const float d = hr_h2f(hr_ld_u16(blk));
    for (int j = 0; j < 16; j++) {
        const int q = blk[2 + j];
        w[j] = d * (float)((q & 0xf) - 8);
        w[j + 16] = d * (float)((q >> 4) - 8);
    }
}
HR_K_GEMV_KERNELS(q4_0, u8)

/* f32, f16 and bf16 (the upper half of an f32) weights: W [rows][cols] elements, a run the 32 from
 * 32r (fewer at the row's end) */
static __device__ inline void dec_f32(const float *W, int row, int r, int cols, float *w) {
    const float *wr = W + (u64)row * (u64)cols + (u64)r * 32u;
    const int len = cols - 32 * r < 32 ? cols - 32 * r : 32;
    for (int i = 0; i < len; i++) w[i] = wr[i];
}
HR_K_GEMV_KERNELS(f32, float)

static __device__ inline void dec_f16(const u16 *W, int row, int r, int cols, float *w) {
    const u16 *wr = W + (u64)row * (u64)cols + (u64)r * 32u;
    const int len = cols - 32 * r < 32 ? cols - 32 * r : 32;
    for (int i = 0; i < len; i++) w[i] = hr_h2f(wr[i]);
}
HR_K_GEMV_KERNELS(f16, u16)

static __device__ inline void dec_bf16(const u16 *W, int row, int r, int cols, float *w) {
    const u16 *wr = W + (u64)row * (u64)cols + (u64)r * 32u;
    const int len = cols - 32 * r < 32 ? cols - 32 * r : 32;
    for (int i = 0; i < len; i++) w[i] = hr_bf2f(wr[i]);
}
HR_K_GEMV_KERNELS(bf16, u16)

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

/* run j of super-block blk's 32 weights into w */
static __device__ inline void run_q4_K(const u8 *blk, int j, float *w) {
    float sc, m;
    k4_scale_min(blk + 4, j, &sc, &m);
    const float d = hr_h2f(hr_ld_u16(blk)) * sc, mn = hr_h2f(hr_ld_u16(blk + 2)) * m;
    const u8 *q = blk + 16 + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; l++) w[l] = d * (float)((q[l] >> shift) & 0xF) - mn;
}

static __device__ inline void run_q5_K(const u8 *blk, int j, float *w) {
    float sc, m;
    k4_scale_min(blk + 4, j, &sc, &m);
    const float d = hr_h2f(hr_ld_u16(blk)) * sc, mn = hr_h2f(hr_ld_u16(blk + 2)) * m;
    const u8 *qh = blk + 16, *q = blk + 48 + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; l++) w[l] = d * (float)(((q[l] >> shift) & 0xF) | (((qh[l] >> j) & 1) << 4)) - mn;
}

static __device__ inline void run_q6_K(const u8 *blk, int j, float *w) {
    const int h = j / 4, r = j % 4;
    const u8 *ql = blk + 64 * h + 32 * (r % 2), *qh = blk + 128 + 32 * h;
    const i8 *scales = (const i8 *)(blk + 192) + 8 * h + 2 * r; /* runs of 16: two scales per run */
    const float d = hr_h2f(hr_ld_u16(blk + 208));
    const float d0 = d * (float)scales[0], d1 = d * (float)scales[1];
    const int nshift = 4 * (r / 2), hshift = 2 * r;
    for (int l = 0; l < 32; l++)
        w[l] = (l < 16 ? d0 : d1) * (float)((((ql[l] >> nshift) & 0xF) | (((qh[l] >> hshift) & 3) << 4)) - 32);
}

/* run r of a K-quant row (kind 4, 5, 6: q4_K, q5_K, q6_K): run r % 8 of super-block r / 8 */
static __device__ inline void decode_k(const u8 *W, int row, int r, int cols, int kind, float *w) {
    const u64 bytes = kind == 4 ? 144u : kind == 5 ? 176u : 210u;
    const u8 *blk = W + ((u64)row * (u64)(cols / 256) + (u64)(r / 8)) * bytes;
    if (kind == 4)
        run_q4_K(blk, r % 8, w);
    else if (kind == 5)
        run_q5_K(blk, r % 8, w);
    else
        run_q6_K(blk, r % 8, w);
}

static __device__ inline void dec_q4_K(const u8 *W, int row, int r, int cols, float *w) {
    decode_k(W, row, r, cols, 4, w);
}
HR_K_GEMV_KERNELS(q4_K, u8)
static __device__ inline void dec_q5_K(const u8 *W, int row, int r, int cols, float *w) {
    decode_k(W, row, r, cols, 5, w);
}
HR_K_GEMV_KERNELS(q5_K, u8)
static __device__ inline void dec_q6_K(const u8 *W, int row, int r, int cols, float *w) {
    decode_k(W, row, r, cols, 6, w);
}
HR_K_GEMV_KERNELS(q6_K, u8)

/* ---- q5_0 / q5_1 (llama.cpp's fallbacks for q4_K / q5_K where a row is not whole super-blocks): blocks
 * of 32; q5_0 (22 bytes): f16 d, 4 bytes qh, 16 bytes qs, w = d * (q - 16); q5_1 (24 bytes): f16 d, f16
 * m, qh, qs, w = d * q + m; q's low four bits are qs[j]'s low nibble (j < 16) or qs[j - 16]'s high one,
 * its fifth bit j of qh (little-endian). */
static __device__ inline void decode_q5(const u8 *W, int row, int r, int cols, bool one, float *w) {
    const u64 bytes = one ? 24u : 22u;
    const u8 *blk = W + ((u64)row * (u64)(cols / 32) + (u64)r) * bytes, *qhp = blk + (one ? 4 : 2), *qs = qhp + 4;
    const u32 qh = (u32)qhp[0] | (u32)qhp[1] << 8 | (u32)qhp[2] << 16 | (u32)qhp[3] << 24;
    const float d = hr_h2f(hr_ld_u16(blk)), m = one ? hr_h2f(hr_ld_u16(blk + 2)) : -16.0f * d;
    for (int j = 0; j < 16; j++) {
        const int q0 = (qs[j] & 0xF) | (int)((qh >> j) & 1) << 4, q1 = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        w[j] = d * (float)q0 + m;
        w[j + 16] = d * (float)q1 + m;
    }
}

static __device__ inline void dec_q5_0(const u8 *W, int row, int r, int cols, float *w) {
    decode_q5(W, row, r, cols, false, w);
}
HR_K_GEMV_KERNELS(q5_0, u8)
static __device__ inline void dec_q5_1(const u8 *W, int row, int r, int cols, float *w) {
    decode_q5(W, row, r, cols, true, w);
}
HR_K_GEMV_KERNELS(q5_1, u8)

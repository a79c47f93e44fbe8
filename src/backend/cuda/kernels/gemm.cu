/* gemm.cu: y[t] = W x[t] for a prefill's tokens on the tensor cores (mma.sync m16n8k16, f32
 * accumulation): y [T][rows] = x [T][cols] . W [rows][cols]^T, the GEMV's parameters and layouts
 * (gemv.cu), for bf16, f16, q8_0 and q4_0 weights. The host takes it for batches of 16 tokens or more
 * (backend_cuda.c's gemv()); f32 weights stay on the GEMV (f32 exact, the F32 model's greedy vectors).
 *
 * Tiles. A thread block (256 threads, 8 warps) computes HR_GEMM_BM = 128 rows x HR_GEMM_BN = 64 tokens
 * of y (grid.x = ceil(rows / 128), grid.y = ceil(T / 64)), walking cols in K-steps of HR_GEMM_BK = 32:
 * each step stages W's 128 x 32 tile and x's 64 x 32 tile in shared memory as 16-bit values, two per
 * 32-bit word (the lower k in the low half, as the mma's registers hold them), rows padded to 20 words
 * so that the fragment reads below hit 32 different banks. Warp w takes rows 32 (w % 4) .. + 31 and
 * tokens 32 (w / 4) .. + 31: 2 x 4 tiles of 16 x 8, two k16 steps per K-step, 16 mma a step. The
 * next step's global loads are issued into registers before this step's mma (one stage of software
 * pipelining), and stored to shared memory after it. An mma tile wholly past rows or n_tokens is
 * skipped (warp-uniform: every lane of the warp skips it); ragged edges load zeros and store nothing.
 *
 * The mma's operands: A = W's tile (16 rows x 16 k, row-major), B = x's tile read as k x tokens
 * (column-major: x[t][k] is B[k][t]), D = y's 16 rows x 8 tokens. Fragments as the PTX ISA defines
 * them for m16n8k16 with 16-bit inputs (g = lane / 4, q = lane % 4): A's register i holds row
 * g + 8 (i % 2), k 2q + 8 (i / 2) and the next k; B's register i holds k 2q + 8i and the next, token g;
 * D's element i is row g + 8 (i / 2), token 2q + (i % 2).
 *
 * Conversions, and the rounding they add over the f32 GEMV:
 * - bf16 weights: bf16 mma; x rounded to bf16 (nearest even): a relative error of at most 2^-8 per
 *   activation (the weights are exact).
 * - f16 weights: f16 mma; x rounded to f16 (nearest even): at most 2^-11 relative per activation
 *   (2^-25 absolute below 2^-14; an |x| past 65504 becomes inf), as the CPU's f16 dot (tensor.h: f16 weights see f16
 * activations).
 * - q8_0 / q4_0: the block's integers (q, or nibble - 8) go to shared memory as f16, exactly, and x
 *   as f16 as above; a K-step is exactly one block of 32, so its two mma sum q . x into a fresh f32
 *   tile and the block's scale multiplies that in f32 before it is added: the weight d * q is never
 *   rounded to 16 bits. f16 rather than bf16 for the activations: 3 more bits (bf16 would hold the
 *   integers exactly too), against an overflow past 65504 that llama.cpp's f16 GEMM path shares.
 * Products of two 16-bit values are exact in f32; what remains is the f32 accumulation (its order,
 * and the tensor core's own rounding inside an mma).
 *
 * Loads assume what the arena gives: W and x 16-byte aligned, cols a multiple of 8 (bf16, f16; the
 * host falls back to the GEMV otherwise) or of 32 (q8_0, q4_0: whole blocks). */
#include "common.cuh"

#define HR_GEMM_BM  128 /* rows of y a block computes */
#define HR_GEMM_BN  64  /* tokens a block computes */
#define HR_GEMM_BK  32  /* k a step: one q8_0 / q4_0 block */
#define HR_GEMM_LDS 20  /* words per staged row: 16 of data (32 values), 4 of padding */

enum { GEMM_BF16, GEMM_F16, GEMM_Q8_0, GEMM_Q4_0 };

/* 16-byte loads and stores (ld.global.v4, st.shared.v4): clang's vector types, 16-byte aligned */
typedef float f32x4 __attribute__((ext_vector_type(4)));
typedef u32 u32x4 __attribute__((ext_vector_type(4)));

static __device__ inline u32 pack2(u16 lo, u16 hi) { return (u32)lo | (u32)hi << 16; }

/* a small integer (|q| <= 2048) as f16 bits, exactly */
static __device__ inline u16 int_to_f16(int q) {
    if (q == 0) return 0;
    const u32 sign = q < 0 ? 0x8000u : 0u, m = (u32)(q < 0 ? -q : q);
    const int e = 31 - __builtin_clz(m); /* m = 1.f * 2^e, e <= 11 */
    return (u16)(sign | (u32)(e + 15) << 10 | ((m << (10 - e)) & 0x3ffu));
}

/* an activation as the mma's 16-bit type (f16 for every kind but bf16) */
template <int KIND> static __device__ inline u16 act16(float v) { return KIND == GEMM_BF16 ? hr_f2bf(v) : hr_f2h(v); }

/* one stage of a K-step's tiles, global -> registers -> shared memory; thread tid's share:
 * - x: token tid / 4, k 8 (tid % 4) .. + 7 (8 floats);
 * - W, bf16 / f16: rows tid / 4 and 64 + tid / 4, k 8 (tid % 4) .. + 7 (4 words each);
 * - W, q8_0: row tid / 2, half tid % 2 of its block (16 int8) and, half 0, the scale;
 * - W, q4_0: row tid / 2, bytes 8 h .. 8 h + 7 of its block's 16 (h = tid % 2): weights 8h .. 8h + 7
 *   (low nibbles) and 16 + 8h .. 16 + 8h + 7 (high nibbles). */
template <int KIND> struct gemm_stage {
    float xv[8];
    u32 wv[2][4]; /* bf16 / f16: two runs of 8 values, two a word */
    u32 qb[4];    /* q8_0: 16 int8 codes; q4_0: 8 bytes of nibbles (qb[0], qb[1]); little-endian */
    u16 d;        /* q8_0 / q4_0: the block's f16 scale */

    __device__ void load(const void *W, const float *x, int rows, int cols, int n_tokens, int row0, int tok0, int k0,
                         int tid) {
        { /* x */
            const int tok = tok0 + tid / 4, k = k0 + 8 * (tid % 4);
            const bool ok = tok < n_tokens && k < cols;
            for (int j = 0; j < 8; j++) xv[j] = 0.0f;
            if (ok) { /* 32-byte aligned (cols % 8 == 0): two 16-byte loads */
                const f32x4 *p = hr_aligned<16>((const f32x4 *)(x + (u64)tok * (u64)cols + (u64)k));
                for (int h = 0; h < 2; h++) {
                    const f32x4 v = p[h];
                    xv[4 * h] = v.x, xv[4 * h + 1] = v.y, xv[4 * h + 2] = v.z, xv[4 * h + 3] = v.w;
                }
            }
        }
        if (KIND == GEMM_BF16 || KIND == GEMM_F16) {
            const u32 *w = (const u32 *)W; /* pairs of 16-bit weights; a row is cols / 2 words */
            for (int i = 0; i < 2; i++) {
                const int row = row0 + 64 * i + tid / 4, k = k0 + 8 * (tid % 4);
                const bool ok = row < rows && k < cols;
                for (int j = 0; j < 4; j++) wv[i][j] = 0u;
                if (ok) { /* one 16-byte load */
                    const u32x4 v = *hr_aligned<16>((const u32x4 *)(w + (u64)row * (u64)(cols / 2) + (u64)(k / 2)));
                    wv[i][0] = v.x, wv[i][1] = v.y, wv[i][2] = v.z, wv[i][3] = v.w;
                }
            }
        } else {
            const int row = row0 + tid / 2, h = tid % 2;
            const bool ok = row < rows;
            const u64 bytes = KIND == GEMM_Q8_0 ? 34u : 18u;
            const u8 *blk = (const u8 *)W + ((u64)row * (u64)(cols / 32) + (u64)(k0 / 32)) * bytes;
            /* the blocks are 2-byte aligned (34 and 18 bytes from an aligned W): u16 loads. q8_0: 16 codes
             * from byte 2 + 16h; q4_0: 8 bytes from 2 + 8h */
            const int n16 = KIND == GEMM_Q8_0 ? 8 : 4;
            const u16 *p = hr_aligned<2>((const u16 *)blk);
            d = 0;
            for (int j = 0; j < 4; j++) qb[j] = 0u;
            if (ok) {
                d = p[0];
                for (int j = 0; j < n16; j++) qb[j / 2] |= (u32)p[1 + n16 * h + j] << (16 * (j % 2));
            }
        }
    }

    /* into Ws [BM][LDS] words, Xs [BN][LDS] words, scale [BM] (q8_0 / q4_0) */
    __device__ void store(u32 *Ws, u32 *Xs, float *scale, int tid) const {
        /* rows of 80 bytes, a thread's 4 words at 16 (tid % 4): 16-byte aligned */
        u32x4 v;
        for (int j = 0; j < 4; j++) v[j] = pack2(act16<KIND>(xv[2 * j]), act16<KIND>(xv[2 * j + 1]));
        *hr_aligned<16>((u32x4 *)(Xs + (tid / 4) * HR_GEMM_LDS + 4 * (tid % 4))) = v;
        if (KIND == GEMM_BF16 || KIND == GEMM_F16) {
            for (int i = 0; i < 2; i++) {
                for (int j = 0; j < 4; j++) v[j] = wv[i][j];
                *hr_aligned<16>((u32x4 *)(Ws + (64 * i + tid / 4) * HR_GEMM_LDS + 4 * (tid % 4))) = v;
            }
            return;
        }
        const int r = tid / 2, h = tid % 2;
        u32 *ws = Ws + r * HR_GEMM_LDS;
        if (h == 0) scale[r] = hr_h2f(d);
        u8 b[16];
        for (int i = 0; i < 16; i++) b[i] = (u8)(qb[i / 4] >> (8 * (i % 4)));
        if (KIND == GEMM_Q8_0) { /* codes 16h .. 16h + 15: words 8h .. 8h + 7 */
            for (int j = 0; j < 8; j++) ws[8 * h + j] = pack2(int_to_f16((i8)b[2 * j]), int_to_f16((i8)b[2 * j + 1]));
        } else { /* bytes 8h .. 8h + 7: low nibbles -> weights 8h.., high -> 16 + 8h.. */
            for (int j = 0; j < 4; j++) {
                const int b0 = b[2 * j], b1 = b[2 * j + 1];
                ws[4 * h + j] = pack2(int_to_f16((b0 & 0xf) - 8), int_to_f16((b1 & 0xf) - 8));
                ws[8 + 4 * h + j] = pack2(int_to_f16((b0 >> 4) - 8), int_to_f16((b1 >> 4) - 8));
            }
        }
    }
};

template <int KIND> static __device__ inline void mma16816(float d[4], const u32 a[4], const u32 b[2]) {
    if (KIND == GEMM_BF16)
        hr_mma_16816_bf16(d, a, b);
    else
        hr_mma_16816_f16(d, a, b);
}

template <int KIND>
static __device__ inline void gemm_tc(float *y, const void *W, const float *x, int rows, int cols, int n_tokens) {
    __shared__ __attribute__((aligned(16))) u32 Ws[HR_GEMM_BM * HR_GEMM_LDS];
    __shared__ __attribute__((aligned(16))) u32 Xs[HR_GEMM_BN * HR_GEMM_LDS];
    __shared__ float scale[HR_GEMM_BM];
    constexpr bool scaled = KIND == GEMM_Q8_0 || KIND == GEMM_Q4_0;
    const int tid = tid_x(), warp = tid / HR_K_WARP, lane = tid % HR_K_WARP, g = lane / 4, q = lane % 4;
    const int row0 = ctaid_x() * HR_GEMM_BM, tok0 = ctaid_y() * HR_GEMM_BN;
    const int wr = 32 * (warp % 4), wt = 32 * (warp / 4); /* the warp's rows and tokens in the tile */
    /* which of the warp's 16 x 8 tiles hold anything (the same for every lane) */
    bool m_on[2], n_on[4];
    for (int mi = 0; mi < 2; mi++) m_on[mi] = row0 + wr + 16 * mi < rows;
    for (int ni = 0; ni < 4; ni++) n_on[ni] = tok0 + wt + 8 * ni < n_tokens;

    float acc[2][4][4];
    for (int mi = 0; mi < 2; mi++)
        for (int ni = 0; ni < 4; ni++)
            for (int i = 0; i < 4; i++) acc[mi][ni][i] = 0.0f;

    gemm_stage<KIND> st;
    st.load(W, x, rows, cols, n_tokens, row0, tok0, 0, tid);
    for (int k0 = 0; k0 < cols; k0 += HR_GEMM_BK) {
        st.store(Ws, Xs, scale, tid);
        __syncthreads();
        if (k0 + HR_GEMM_BK < cols) st.load(W, x, rows, cols, n_tokens, row0, tok0, k0 + HR_GEMM_BK, tid);

        float part[2][4][4]; /* q8_0 / q4_0: this block's q . x, scaled below */
        float(*d)[4][4] = scaled ? part : acc;
        if (scaled)
            for (int mi = 0; mi < 2; mi++)
                for (int ni = 0; ni < 4; ni++)
                    for (int i = 0; i < 4; i++) part[mi][ni][i] = 0.0f;
        for (int kk = 0; kk < HR_GEMM_BK / 16; kk++) {
            const int c = 8 * kk + q; /* the word holding k 16 kk + 2q, 2q + 1 */
            u32 a[2][4], b[4][2];
            for (int mi = 0; mi < 2; mi++) {
                const u32 *r = Ws + (wr + 16 * mi + g) * HR_GEMM_LDS + c;
                a[mi][0] = r[0];                   /* row g,     k 2q     */
                a[mi][1] = r[8 * HR_GEMM_LDS];     /* row g + 8, k 2q     */
                a[mi][2] = r[4];                   /* row g,     k 2q + 8 */
                a[mi][3] = r[8 * HR_GEMM_LDS + 4]; /* row g + 8, k 2q + 8 */
            }
            for (int ni = 0; ni < 4; ni++) {
                const u32 *r = Xs + (wt + 8 * ni + g) * HR_GEMM_LDS + c;
                b[ni][0] = r[0]; /* k 2q,     token g */
                b[ni][1] = r[4]; /* k 2q + 8, token g */
            }
            for (int mi = 0; mi < 2; mi++)
                for (int ni = 0; ni < 4; ni++)
                    if (m_on[mi] && n_on[ni]) mma16816<KIND>(d[mi][ni], a[mi], b[ni]);
        }
        if (scaled)
            for (int mi = 0; mi < 2; mi++) {
                const float s0 = scale[wr + 16 * mi + g], s1 = scale[wr + 16 * mi + g + 8];
                for (int ni = 0; ni < 4; ni++) {
                    acc[mi][ni][0] += s0 * part[mi][ni][0];
                    acc[mi][ni][1] += s0 * part[mi][ni][1];
                    acc[mi][ni][2] += s1 * part[mi][ni][2];
                    acc[mi][ni][3] += s1 * part[mi][ni][3];
                }
            }
        __syncthreads(); /* the tiles are read; the next step may overwrite them */
    }

    for (int mi = 0; mi < 2; mi++)
        for (int ni = 0; ni < 4; ni++)
            for (int i = 0; i < 4; i++) {
                const int row = row0 + wr + 16 * mi + g + 8 * (i / 2), tok = tok0 + wt + 8 * ni + 2 * q + i % 2;
                if (row < rows && tok < n_tokens) y[(u64)tok * (u64)rows + (u64)row] = acc[mi][ni][i];
            }
}

extern "C" __global__ void hr_k_gemm_bf16(float *y, const u16 *W, const float *x, int rows, int cols, int n_tokens) {
    gemm_tc<GEMM_BF16>(y, W, x, rows, cols, n_tokens);
}
extern "C" __global__ void hr_k_gemm_f16(float *y, const u16 *W, const float *x, int rows, int cols, int n_tokens) {
    gemm_tc<GEMM_F16>(y, W, x, rows, cols, n_tokens);
}
extern "C" __global__ void hr_k_gemm_q8_0(float *y, const u8 *W, const float *x, int rows, int cols, int n_tokens) {
    gemm_tc<GEMM_Q8_0>(y, W, x, rows, cols, n_tokens);
}
extern "C" __global__ void hr_k_gemm_q4_0(float *y, const u8 *W, const float *x, int rows, int cols, int n_tokens) {
    gemm_tc<GEMM_Q4_0>(y, W, x, rows, cols, n_tokens);
}

/* The mma wrappers' own check (tests/gpu/cuda_kernels_matrix.c): one 16 x 8 x 16 product from fragments
 * the host laid out, launched with one warp (blockDim.x = 32; other warps leave). a: [32][4] words,
 * b: [32][2], cd: [32][4] floats, C in and D out; f16: 0 bf16, 1 f16. */
extern "C" __global__ void hr_k_mma_selftest(float *cd, const u32 *a, const u32 *b, int f16) {
    const int lane = tid_x();
    if (lane >= HR_K_WARP) return; /* whole warps */
    float d[4];
    u32 ra[4], rb[2];
    for (int i = 0; i < 4; i++) d[i] = cd[4 * lane + i], ra[i] = a[4 * lane + i];
    for (int i = 0; i < 2; i++) rb[i] = b[2 * lane + i];
    if (f16)
        hr_mma_16816_f16(d, ra, rb);
    else
        hr_mma_16816_bf16(d, ra, rb);
    for (int i = 0; i < 4; i++) cd[4 * lane + i] = d[i];
}

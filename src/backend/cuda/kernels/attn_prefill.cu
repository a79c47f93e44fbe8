/* attn_prefill.cu: prefill (and chunked-prefill) attention on the tensor cores, flash-attention
 * style, over the paged K/V of the device storage (kv.cuh; the layout at the top of attention.cu).
 *
 * hr_k_attn_prefill: one thread block (256 threads, 8 warps) per (tile of a run, KV head) (grid.x =
 * the tiles, grid.y = Hkv). A run is a stretch of the batch's rows of ONE sequence at consecutive
 * positions (the host finds them: at least HR_CUDA_PREFILL_MIN_RUN rows); the host cuts each into
 * tiles of at most 128 / G rows, G = H / Hkv, and passes them as runs[i] = (first row, rows, table
 * row, first position). The block's MMA rows are the tile's rows times the G query heads of its KV
 * head (m = r G + g: GQA's heads share every K/V tile), 16 a warp, 128 at most. It walks the
 * sequence's positions [0, last row's position] in tiles of HR_PF_TK = 64:
 *   1. the K tile ([64][D]) and the V tile, transposed ([D][64]), dequantized into shared memory as
 *      f16 (kv.cuh's coalesced chunk reads: 8 elements a thread, every device format);
 *   2. S = Q K^T with mma.sync m16n8k16 (f16 in, f32 accumulation): each warp 16 rows x 64
 *      positions, its Q fragments (f16) held in registers from the start;
 *   3. scale, softcap (as the split kernels), the mask: row r at position p sees t <= p, inside its
 *      window (win: sinks and lo, kv.cuh's win_of) and not in a dropped block (table entry -1);
 *   4. the online softmax in f32: per row the running max m and sum l, the accumulators rescaled by
 *      e^(m_old - m_new) when m grows; P = e^(s - m) stays in registers, where S's accumulator
 *      fragments are already the next mma's A fragments (rounded to f16);
 *   5. O += P V with mma (f32 accumulators: 16 rows x D a warp).
 * At the end each row is divided by its l and written to out [row][H][D]: no splits and no reduce
 * (a prefill has many tiles to fill the GPU with). A tile of positions no row of the block sees (the
 * gap between the sinks and a window) is skipped whole.
 *
 * Why f16 and not bf16: the values are K and V as stored (f16 and bf16 formats, q8 codes times their
 * f16 scale, fp8 times its scale, f32) and P in [0, 1]: f16's 11 bits against bf16's 8 keep the
 * scores' rounding 8x smaller, and K/V elements past f16's 65504 (where an f32 or bf16 cache would
 * overflow to inf) do not occur in a model's keys and values; P's smallest weights fall into f16's
 * subnormals (below 2^-14), an absolute error under 2^-25 each. The error this adds over the split
 * kernels (f32 throughout) is bounded in tests/gpu/cuda_kernels_prefill.c's test_prefill_attention.
 *
 * head_dim 8, 16, 32, 64 or 128 (the host sends other shapes to the split kernels; 8, the demo
 * models', pads K's k16 step with zeros), q8 groups a multiple of 8.
 * Not yet run on a GPU: the first version, no cp.async or ldmatrix, K and V loaded by every block of
 * a run (the tiles of one run read the same K/V; L2 serves the repeats). */
#include "kv.cuh"

#define HR_PF_TK    64                    /* positions a K/V tile */
#define HR_PF_M     128                   /* MMA rows a block: 8 warps x 16 (the host's CUDA_PF_M) */
#define HR_PF_MAX_D 128                   /* head_dim at most */
#define HR_PF_KS    (HR_PF_MAX_D / 2 + 4) /* words a staged K row holds at most: D / 2 + 4 of padding */
#define HR_PF_VS    (HR_PF_TK / 2 + 4)    /* words a staged V^T row: 64 positions + 8 of padding */

/* float -> f16 bits by the hardware's conversion (cvt.rn.f16.f32: round to nearest even) */
static __device__ inline u16 pf_f2h(float x) { return __builtin_bit_cast(u16, (_Float16)x); }
static __device__ inline u32 pf_pack(float lo, float hi) { return (u32)pf_f2h(lo) | (u32)pf_f2h(hi) << 16; }

/* K's d extent in the mma: D, or 16 for D 8 (one k16 step, its upper half zeros) */
template <int D> static __device__ inline constexpr int pf_kd() { return D < 16 ? 16 : D; }

/* A tile's K rows into Ks [64][D / 2 + 4] words (two elements a word, the lower d in the low half: the
 * mma's B fragments read them as k x positions), or its V rows transposed into Vt [D][72] halves (the
 * P.V mma's B fragments: two consecutive positions of one d a word). Row strides of 4 (mod 32) words
 * put the 8 x 4 lanes of a fragment read on 32 banks. Positions at or past tlim, or in a dropped
 * block, are zeros (the mask drops them). */
template <int F, int D, bool V>
static __device__ void pf_load(u32 *Ks, u16 *Vt, const u8 *arena, const int *table, u64 head_off, int group,
                               const hr_k_attn_shape &sh, int t0, int tlim) {
    constexpr int CPR = D / HR_K_ROWS_E, KS = pf_kd<D>() / 2 + 4; /* chunks a row */
    const int B = sh.block_size;
    for (int c = tid_x(); c < HR_PF_TK * CPR; c += ntid_x()) {
        const int p = c / CPR, d0 = (c % CPR) * HR_K_ROWS_E, t = t0 + p;
        const int blk = t < tlim ? table[t / B] : -1;
        float x[HR_K_ROWS_E];
        for (int j = 0; j < HR_K_ROWS_E; j++) x[j] = 0.0f;
        if (blk >= 0) {
            const rows_raw r = rows_fetch<F>(arena + (u64)blk * sh.block_bytes + head_off, B, D, group, t % B, d0);
            const float f = rows_deq<F>(r, x);
            for (int j = 0; j < HR_K_ROWS_E; j++) x[j] *= f;
        }
        if (V) {
            for (int j = 0; j < HR_K_ROWS_E; j++) Vt[(d0 + j) * (2 * HR_PF_VS) + p] = pf_f2h(x[j]);
        } else {
            u32 *w = Ks + p * KS + d0 / 2;
            for (int j = 0; j < HR_K_ROWS_E / 2; j++) w[j] = pf_pack(x[2 * j], x[2 * j + 1]);
            if (D < 16) /* D 8: d 8..15 zeros (Q's are zeros too; 0 x a stale NaN would not be) */
                for (int j = HR_K_ROWS_E / 2; j < HR_K_ROWS_E; j++) w[j] = 0u;
        }
    }
}

template <int D, bool V>
static __device__ void pf_load_fmt(int fmt, u32 *Ks, u16 *Vt, const u8 *arena, const int *table, u64 head_off,
                                   int group, const hr_k_attn_shape &sh, int t0, int tlim) {
    switch (fmt) {
    case HR_K_KV_F16: pf_load<HR_K_KV_F16, D, V>(Ks, Vt, arena, table, head_off, group, sh, t0, tlim); break;
    case HR_K_KV_F32: pf_load<HR_K_KV_F32, D, V>(Ks, Vt, arena, table, head_off, group, sh, t0, tlim); break;
    case HR_K_KV_BF16: pf_load<HR_K_KV_BF16, D, V>(Ks, Vt, arena, table, head_off, group, sh, t0, tlim); break;
    case HR_K_KV_FP8: pf_load<HR_K_KV_FP8, D, V>(Ks, Vt, arena, table, head_off, group, sh, t0, tlim); break;
    case HR_K_KV_Q4H: /* D % 16 == 0 (the host keeps other shapes on the split kernels) */
        if (D % 16 == 0) pf_load<HR_K_KV_Q4H, D, V>(Ks, Vt, arena, table, head_off, group, sh, t0, tlim);
        break;
    default: pf_load<HR_K_KV_Q8, D, V>(Ks, Vt, arena, table, head_off, group, sh, t0, tlim); break;
    }
}

/* what a row sees: positions t <= pos with t < sinks or t >= lo (lo 0: no window); pos -1: nothing
 * (an MMA row past the tile's) */
struct pf_row {
    int pos, sinks, lo;
};
static __device__ inline pf_row pf_row_of(const int *win, int row, int pos) {
    int ws = 0, off = 0;
    win_of(win, row, &ws, &off);
    return pf_row{pos, ws, off > 0 ? ws + off : 0};
}
static __device__ inline bool pf_sees(const pf_row &r, int t) { return t <= r.pos && (t < r.sinks || t >= r.lo); }

template <int D>
static __device__ __attribute__((always_inline)) inline void
prefill_attend(u32 *Ks, u16 *Vt, int *present, float *red, float *out, const float *q, const u8 *arena,
               const int *tables, const int *runs, const int *win, int layer, const hr_k_attn_shape &sh) {
    constexpr int NK = pf_kd<D>() / 16, ND = D / 8, KS = pf_kd<D>() / 2 + 4; /* k16 steps over D; n8 tiles of D */
    const int H = sh.n_heads, G = H / sh.n_kv_heads, kvh = ctaid_y(), B = sh.block_size;
    const int *run = runs + 4 * ctaid_x();
    const int row0 = run[0], nrows = run[1], pos0 = run[3], M = nrows * G;
    const int *table = tables + (u64)run[2] * (u64)sh.max_blocks;
    const u64 layer_off = (u64)layer * (u64)sh.n_kv_heads * (sh.k_head_bytes + sh.v_head_bytes);
    const u64 k_off = layer_off + (u64)kvh * sh.k_head_bytes;
    const u64 v_off = layer_off + (u64)sh.n_kv_heads * sh.k_head_bytes + (u64)kvh * sh.v_head_bytes;
    const int warp = tid_x() / HR_K_WARP, lane = tid_x() % HR_K_WARP, g8 = lane / 4, qd = lane % 4;
    const bool active = 16 * warp < M; /* the warp has a row (warp-uniform) */

    /* the lane's two MMA rows (fragment rows g8 and g8 + 8): their batch row, query head, sight */
    int row[2], head[2];
    bool on[2];
    pf_row sight[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int m = 16 * warp + g8 + 8 * i;
        on[i] = m < M;
        row[i] = row0 + (on[i] ? m / G : 0);
        head[i] = kvh * G + m % G;
        sight[i] = pf_row_of(win, row[i], on[i] ? pos0 + m / G : -1);
    }
    /* the block's sinks at most and window start at least: a tile inside [smax, lomin) no row sees */
    float smax = 0.0f, lomin = 2147483648.0f; /* positions are exact in f32 (< 2^24) */
    for (int r = tid_x(); r < nrows; r += ntid_x()) {
        const pf_row s = pf_row_of(win, row0 + r, pos0 + r);
        smax = __builtin_fmaxf(smax, (float)s.sinks);
        lomin = __builtin_fminf(lomin, (float)s.lo);
    }
    smax = block_max(smax, red);
    lomin = -block_max(-lomin, red);

    /* Q's fragments (A: 16 rows x 16 d per k-step), f16, for the whole walk */
    u32 qa[NK][4];
#pragma unroll
    for (int kk = 0; kk < NK; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int h = i % 2, d = 16 * kk + 2 * qd + 8 * (i / 2); /* row g8 + 8 (i % 2), d and d + 1 */
            const float *qp = q + ((u64)row[h] * (u64)H + (u64)head[h]) * (u64)D + (u64)d;
            qa[kk][i] = on[h] && d < D ? pf_pack(qp[0], qp[1]) : 0u;
        }
    float o[ND][4], m_run[2] = {-__builtin_inff(), -__builtin_inff()}, l_run[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) o[n][i] = 0.0f;

    const int tlim = pos0 + nrows; /* no row sees past its own position */
    for (int t0 = 0; t0 < tlim; t0 += HR_PF_TK) {
        if ((float)t0 >= smax && (float)(t0 + HR_PF_TK) <= lomin) continue; /* block-uniform */
        pf_load_fmt<D, false>(sh.k_fmt, Ks, Vt, arena, table, k_off, sh.k_group, sh, t0, tlim);
        pf_load_fmt<D, true>(sh.v_fmt, Ks, Vt, arena, table, v_off, sh.v_group, sh, t0, tlim);
        for (int p = tid_x(); p < HR_PF_TK; p += ntid_x()) present[p] = t0 + p < tlim && table[(t0 + p) / B] >= 0;
        __syncthreads();
        if (active) {
            /* S: 16 rows x 64 positions, 8 n-tiles; element i of tile n is row g8 + 8 (i / 2), position
             * 8 n + 2 qd + i % 2 */
            float s[HR_PF_TK / 8][4];
#pragma unroll
            for (int n = 0; n < HR_PF_TK / 8; n++) {
#pragma unroll
                for (int i = 0; i < 4; i++) s[n][i] = 0.0f;
                const u32 *kr = Ks + (8 * n + g8) * KS + qd;
#pragma unroll
                for (int kk = 0; kk < NK; kk++) {
                    const u32 b[2] = {kr[8 * kk], kr[8 * kk + 4]}; /* d 16 kk + 2 qd (+ 8), position 8 n + g8 */
                    hr_mma_16816_f16(s[n], qa[kk], b);
                }
            }
            float mx[2] = {-__builtin_inff(), -__builtin_inff()};
#pragma unroll
            for (int n = 0; n < HR_PF_TK / 8; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int h = i / 2, p = 8 * n + 2 * qd + i % 2;
                    float v = s[n][i] * sh.scale;
                    if (sh.softcap > 0.0f) v = sh.softcap * hr_tanhf(v / sh.softcap);
                    v = present[p] && pf_sees(sight[h], t0 + p) ? v : -__builtin_inff();
                    s[n][i] = v;
                    mx[h] = v > mx[h] ? v : mx[h];
                }
            float r[2];
#pragma unroll
            for (int h = 0; h < 2; h++) { /* a row's 64 positions are on the 4 lanes of its quad */
                mx[h] = __builtin_fmaxf(mx[h], hr_shfl_xor(mx[h], 1));
                mx[h] = __builtin_fmaxf(mx[h], hr_shfl_xor(mx[h], 2));
                const float m_new = mx[h] > m_run[h] ? mx[h] : m_run[h];
                r[h] = m_run[h] == -__builtin_inff() ? 0.0f : hr_expf(m_run[h] - m_new);
                m_run[h] = m_new;
                l_run[h] *= r[h];
            }
#pragma unroll
            for (int n = 0; n < HR_PF_TK / 8; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int h = i / 2;
                    const float w = s[n][i] == -__builtin_inff() ? 0.0f : hr_expf(s[n][i] - m_run[h]);
                    s[n][i] = w;
                    l_run[h] += w; /* the lane's part of the row's sum; the quad's meet at the end */
                }
#pragma unroll
            for (int n = 0; n < ND; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) o[n][i] *= r[i / 2];
/* O += P V: P's k16 step j is S's n-tiles 2j and 2j + 1, which hold A's fragment as is */
#pragma unroll
            for (int j = 0; j < HR_PF_TK / 16; j++) {
                const u32 a[4] = {pf_pack(s[2 * j][0], s[2 * j][1]), pf_pack(s[2 * j][2], s[2 * j][3]),
                                  pf_pack(s[2 * j + 1][0], s[2 * j + 1][1]), pf_pack(s[2 * j + 1][2], s[2 * j + 1][3])};
                const u32 *vw = hr_aligned<4>((const u32 *)Vt) + g8 * HR_PF_VS + 8 * j + qd;
#pragma unroll
                for (int n = 0; n < ND; n++) {
                    /* positions 16 j + 2 qd (+ 8) and the next, d 8 n + g8 */
                    const u32 b[2] = {vw[8 * n * HR_PF_VS], vw[8 * n * HR_PF_VS + 4]};
                    hr_mma_16816_f16(o[n], a, b);
                }
            }
        }
        __syncthreads(); /* the tiles are read; the next loads overwrite them */
    }
    if (!active) return;
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float l = l_run[h];
        l += hr_shfl_xor(l, 1);
        l += hr_shfl_xor(l, 2);
        inv[h] = l > 0.0f ? 1.0f / l : 0.0f; /* a row that sees nothing: zeros, as the split kernels */
    }
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int h = i / 2;
            if (on[h])
                out[((u64)row[h] * (u64)H + (u64)head[h]) * (u64)D + (u64)(8 * n + 2 * qd + i % 2)] = o[n][i] * inv[h];
        }
}

/* out: [n][H][D] (the tiles' rows written, no other); q: [n][H][D] with RoPE applied; tables [rows]
 * [max_blocks]; runs: [grid.x][4] (first row, rows, table row, first position), rows * G <= 128;
 * win: [n][2] (sinks, lo) or NULL; sh: the split kernels' shape (n_splits and chunk unused). */
extern "C" __global__ void hr_k_attn_prefill(float *out, const float *q, const u8 *arena, const int *tables,
                                             const int *runs, const int *win, int layer, hr_k_attn_shape sh) {
    __shared__ __attribute__((aligned(16))) u32 Ks[HR_PF_TK * HR_PF_KS];
    __shared__ __attribute__((aligned(16))) u16 Vt[HR_PF_MAX_D * 2 * HR_PF_VS];
    __shared__ int present[HR_PF_TK];
    __shared__ float red[32];
    switch (sh.head_dim) {
    case 8: prefill_attend<8>(Ks, Vt, present, red, out, q, arena, tables, runs, win, layer, sh); break;
    case 16: prefill_attend<16>(Ks, Vt, present, red, out, q, arena, tables, runs, win, layer, sh); break;
    case 32: prefill_attend<32>(Ks, Vt, present, red, out, q, arena, tables, runs, win, layer, sh); break;
    case 64: prefill_attend<64>(Ks, Vt, present, red, out, q, arena, tables, runs, win, layer, sh); break;
    default: prefill_attend<128>(Ks, Vt, present, red, out, q, arena, tables, runs, win, layer, sh); break;
    }
}

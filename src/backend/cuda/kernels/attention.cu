/* attention.cu: paged attention for decode: each query row attends over its sequence's KV blocks,
 * found through a block table, in the KV storage's byte layout (kv/kv_storage.h, kv/kv_format.h):
 *
 *   block b at arena + b * block_bytes = [L][K heads | V heads], each head a region of
 *   k_head_bytes / v_head_bytes:  f32: [B][D] floats;  f16: [B][D] halves;  q8: [B][D] int8 codes
 *   then [B][D / G] f16 scales (code * scale, groups of G along D).
 *
 * Split over the sequence (flash-decoding) and GQA-aware, in two kernels:
 *   hr_k_attn_split: one thread block per (query, KV head, group of up to 8 of its query heads) and
 *     chunk of HR_K_ATT_CHUNK positions (grid.x = n_queries * Hkv * ceil(G / 8), grid.y = n_splits).
 *     Each K and V element is read and dequantized once for all the group's query heads. The chunk's
 *     scores stay in shared memory; it writes, per query head, its unnormalized P.V, its max m and its
 *     exp-sum l (a chunk past the query's n_ctx: m = -inf, l = 0, zeros).
 *   hr_k_attn_reduce: one thread block per (query, head) combines the chunks: out = sum_s o_s e^(m_s -
 *     M) / sum_s l_s e^(m_s - M), M the largest m_s (a query with no position: zeros).
 * The first versions: no tensor cores, K rows read one per thread (uncoalesced), P.V threads over D.
 * Dropped blocks (table entry -1) are skipped; token masks, sinks and windows (hr_kv_attn_view) are not
 * supported here yet. */
#include "common.cuh"

enum { HR_K_KV_F16 = 0, HR_K_KV_Q8 = 1, HR_K_KV_F32 = 2 }; /* the host's CUDA_KV_* */

typedef struct hr_k_attn_shape {
    u64 block_bytes, k_head_bytes, v_head_bytes;
    int n_layers, n_kv_heads, n_heads, head_dim, block_size;
    int k_fmt, v_fmt, k_group, v_group; /* formats and q8 group sizes */
    int max_blocks, n_splits;           /* table row stride; chunks of HR_K_ATT_CHUNK (grid.y) */
    float scale, softcap;
} hr_k_attn_shape;
/* the host's attn_shape (backend/cuda/kv_storage_cuda.c) asserts the same size: the struct is passed
 * by value, byte for byte */
static_assert(sizeof(hr_k_attn_shape) == 80, "hr_k_attn_shape must match attn_shape in kv_storage_cuda.c");

/* element d of token slot s in a head region of format fmt */
static __device__ inline float kv_elem(const u8 *head, int fmt, int B, int D, int G, int s, int d) {
    if (fmt == HR_K_KV_F16) return hr_h2f(hr_ld_u16(head + 2u * ((u64)s * (u64)D + (u64)d)));
    if (fmt == HR_K_KV_F32) return ((const float *)head)[(u64)s * (u64)D + (u64)d];
    const u8 *scales = head + (u64)B * (u64)D;
    float sc = hr_h2f(hr_ld_u16(scales + 2u * ((u64)s * (u64)(D / G) + (u64)(d / G))));
    return (float)(i8)head[(u64)s * (u64)D + (u64)d] * sc;
}

#define HR_K_ATT_CHUNK 256 /* positions per split (the host's CUDA_ATT_CHUNK) */
#define HR_K_ATT_G     8   /* query heads per thread block */
#define HR_K_ATT_MAX_D 256 /* head_dim at most (the host refuses more) */

/* o_part: [nq][H][n_splits][D] unnormalized P.V; ml_part: [nq][H][n_splits][2] (m, l). q: [nq][H][D]
 * with RoPE applied; tables: [nq][max_blocks] physical ids. */
extern "C" __global__ void hr_k_attn_split(float *o_part, float *ml_part, const float *q, const u8 *arena,
                                           const int *tables, const int *n_ctx, int layer, hr_k_attn_shape sh) {
    __shared__ float qs[HR_K_ATT_G * HR_K_ATT_MAX_D];
    __shared__ float sc[HR_K_ATT_G * HR_K_ATT_CHUNK];
    __shared__ float stat[2 * HR_K_ATT_G];
    __shared__ float red[32];
    const int H = sh.n_heads, G = H / sh.n_kv_heads, ng = (G + HR_K_ATT_G - 1) / HR_K_ATT_G;
    const int D = sh.head_dim, B = sh.block_size, split = ctaid_y();
    int idx = ctaid_x();
    const int hg = idx % ng;
    idx /= ng;
    const int kvh = idx % sh.n_kv_heads, qi = idx / sh.n_kv_heads;
    const int h0 = kvh * G + hg * HR_K_ATT_G, gn = G - hg * HR_K_ATT_G < HR_K_ATT_G ? G - hg * HR_K_ATT_G : HR_K_ATT_G;
    const int n = n_ctx[qi], t0 = split * HR_K_ATT_CHUNK;
    const int t1 = n < t0 + HR_K_ATT_CHUNK ? n : t0 + HR_K_ATT_CHUNK; /* <= t0: nothing to see */
    const int *table = tables + (u64)qi * (u64)sh.max_blocks;
    const u64 layer_off = (u64)layer * (u64)sh.n_kv_heads * (sh.k_head_bytes + sh.v_head_bytes);
    const u64 k_off = layer_off + (u64)kvh * sh.k_head_bytes;
    const u64 v_off = layer_off + (u64)sh.n_kv_heads * sh.k_head_bytes + (u64)kvh * sh.v_head_bytes;

    for (int i = tid_x(); i < gn * D; i += ntid_x()) qs[i] = q[((u64)qi * (u64)H + (u64)(h0 + i / D)) * (u64)D + i % D];
    __syncthreads();
    /* 1. scores: one position per thread, its K row dequantized once for the group's heads */
    for (int t = t0 + tid_x(); t < t1; t += ntid_x()) {
        const int blk = table[t / B];
        float acc[HR_K_ATT_G];
        for (int g = 0; g < HR_K_ATT_G; g++) acc[g] = 0.0f;
        if (blk >= 0) {
            const u8 *kh = arena + (u64)blk * sh.block_bytes + k_off;
            for (int d = 0; d < D; d++) {
                const float k = kv_elem(kh, sh.k_fmt, B, D, sh.k_group, t % B, d);
                for (int g = 0; g < gn; g++) acc[g] += qs[g * D + d] * k;
            }
        }
        for (int g = 0; g < gn; g++) {
            float s = -__builtin_inff();
            if (blk >= 0) {
                s = acc[g] * sh.scale;
                if (sh.softcap > 0.0f) s = sh.softcap * hr_tanhf(s / sh.softcap);
            }
            sc[g * HR_K_ATT_CHUNK + (t - t0)] = s;
        }
    }
    __syncthreads();
    /* 2. per head: the chunk's max, its weights e^(s - m) in place, their sum */
    for (int g = 0; g < gn; g++) {
        float *sg = sc + g * HR_K_ATT_CHUNK;
        float m = -__builtin_inff();
        for (int t = tid_x(); t < t1 - t0; t += ntid_x()) m = sg[t] > m ? sg[t] : m;
        m = block_max(m, red);
        float l = 0.0f;
        for (int t = tid_x(); t < t1 - t0; t += ntid_x()) {
            const float w = m == -__builtin_inff() ? 0.0f : hr_expf(sg[t] - m);
            sg[t] = w;
            l += w;
        }
        l = block_sum(l, red);
        if (tid_x() == 0) stat[g] = m, stat[HR_K_ATT_G + g] = l;
    }
    __syncthreads();
    /* 3. the weighted V rows, one output dimension per thread, each V element read once for the group */
    for (int d = tid_x(); d < D; d += ntid_x()) {
        float acc[HR_K_ATT_G];
        for (int g = 0; g < HR_K_ATT_G; g++) acc[g] = 0.0f;
        for (int t = t0; t < t1; t++) {
            const int blk = table[t / B];
            if (blk < 0) continue;
            const u8 *vh = arena + (u64)blk * sh.block_bytes + v_off;
            const float v = kv_elem(vh, sh.v_fmt, B, D, sh.v_group, t % B, d);
            for (int g = 0; g < gn; g++) acc[g] += sc[g * HR_K_ATT_CHUNK + (t - t0)] * v;
        }
        for (int g = 0; g < gn; g++)
            o_part[(((u64)qi * (u64)H + (u64)(h0 + g)) * (u64)sh.n_splits + (u64)split) * (u64)D + d] = acc[g];
    }
    if (tid_x() < gn) {
        float *ml = ml_part + (((u64)qi * (u64)H + (u64)(h0 + tid_x())) * (u64)sh.n_splits + (u64)split) * 2u;
        ml[0] = stat[tid_x()];
        ml[1] = stat[HR_K_ATT_G + tid_x()];
    }
}

/* out[q][h][D] from the chunks' partial results (grid.x = n_queries, grid.y = H) */
extern "C" __global__ void hr_k_attn_reduce(float *out, const float *o_part, const float *ml_part, int n_heads,
                                            int head_dim, int n_splits) {
    const u64 row = (u64)ctaid_x() * (u64)n_heads + (u64)ctaid_y();
    const float *ml = ml_part + row * (u64)n_splits * 2u;
    const float *o = o_part + row * (u64)n_splits * (u64)head_dim;
    float M = -__builtin_inff();
    for (int s = 0; s < n_splits; s++) M = ml[2 * s] > M ? ml[2 * s] : M;
    float L = 0.0f;
    for (int s = 0; s < n_splits; s++)
        if (ml[2 * s] != -__builtin_inff()) L += ml[2 * s + 1] * hr_expf(ml[2 * s] - M);
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    for (int d = tid_x(); d < head_dim; d += ntid_x()) {
        float acc = 0.0f;
        for (int s = 0; s < n_splits; s++)
            if (ml[2 * s] != -__builtin_inff()) acc += o[(u64)s * (u64)head_dim + d] * hr_expf(ml[2 * s] - M);
        out[row * (u64)head_dim + d] = acc * inv;
    }
}

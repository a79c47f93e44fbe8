/* attention.cu: paged attention for decode: each query row attends over its sequence's KV blocks,
 * found through a block table, in the KV storage's byte layout (kv/kv_storage.h, kv/kv_format.h):
 *
 *   block b at arena + b * block_bytes = [L][K heads | V heads], each head a region of
 *   k_head_bytes / v_head_bytes:  f32: [B][D] floats;  f16: [B][D] halves;  q8: [B][D] int8 codes
 *   then [B][D / G] f16 scales (code * scale, groups of G along D).
 *
 * One thread block per (query, head) (grid.x = n_queries, grid.y = n_heads, blockDim.x = 256). The
 * scores go through global scratch ([n_queries][n_heads][max_ctx] floats) so that any context length
 * works with no shared-memory limit; this is the simple version, to be checked against the CPU, not
 * a fast one (no split-K, no tensor cores). Dropped blocks (table entry -1) are skipped; token masks,
 * sinks and windows (hr_kv_attn_view) are not supported here yet. */
#include "common.cuh"

enum { HR_K_KV_F16 = 0, HR_K_KV_Q8 = 1, HR_K_KV_F32 = 2 }; /* the host's CUDA_KV_* */

typedef struct hr_k_attn_shape {
    u64 block_bytes, k_head_bytes, v_head_bytes;
    int n_layers, n_kv_heads, n_heads, head_dim, block_size;
    int k_fmt, v_fmt, k_group, v_group; /* formats and q8 group sizes */
    int max_blocks, max_ctx;            /* table row stride; scratch row length */
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

/* out[q][h][D] = softmax(scale * q[q][h] . K) . V over positions [0, n_ctx[q]) of layer. q: [nq][H][D]
 * with RoPE applied; tables: [nq][max_blocks] physical ids; scratch: see above. */
extern "C" __global__ void hr_k_attn_decode(float *out, const float *q, const u8 *arena, const int *tables,
                                            const int *n_ctx, int layer, hr_k_attn_shape sh, float *scratch) {
    __shared__ float red[32];
    int qi = ctaid_x(), h = ctaid_y();
    int D = sh.head_dim, B = sh.block_size, n = n_ctx[qi];
    int kvh = h / (sh.n_heads / sh.n_kv_heads);
    const float *qv = q + ((u64)qi * (u64)sh.n_heads + (u64)h) * (u64)D;
    float *o = out + ((u64)qi * (u64)sh.n_heads + (u64)h) * (u64)D;
    float *sc = scratch + ((u64)qi * (u64)sh.n_heads + (u64)h) * (u64)sh.max_ctx;
    const int *table = tables + (u64)qi * (u64)sh.max_blocks;
    u64 layer_off = (u64)layer * (u64)sh.n_kv_heads * (sh.k_head_bytes + sh.v_head_bytes);
    u64 k_off = layer_off + (u64)kvh * sh.k_head_bytes;
    u64 v_off = layer_off + (u64)sh.n_kv_heads * sh.k_head_bytes + (u64)kvh * sh.v_head_bytes;

    /* 1. scores, one position per thread at a time */
    float m = -__builtin_inff();
    for (int t = tid_x(); t < n; t += ntid_x()) {
        int blk = table[t / B];
        float s = -__builtin_inff();
        if (blk >= 0) {
            const u8 *kh = arena + (u64)blk * sh.block_bytes + k_off;
            float dot = 0.0f;
            for (int d = 0; d < D; d++) dot += qv[d] * kv_elem(kh, sh.k_fmt, B, D, sh.k_group, t % B, d);
            s = dot * sh.scale;
            if (sh.softcap > 0.0f) s = sh.softcap * hr_tanhf(s / sh.softcap);
        }
        sc[t] = s;
        m = s > m ? s : m;
    }
    m = block_max(m, red);
    /* 2. weights; a row whose every position was dropped (m = -inf) gets zeros, as n_ctx = 0 does */
    float sum = 0.0f;
    for (int t = tid_x(); t < n; t += ntid_x()) {
        float w = m == -__builtin_inff() ? 0.0f : hr_expf(sc[t] - m);
        sc[t] = w;
        sum += w;
    }
    sum = block_sum(sum, red); /* its barriers also make every sc[t] visible to every thread */
    float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    /* 3. the weighted sum of V, one output dimension per thread */
    for (int d = tid_x(); d < D; d += ntid_x()) {
        float acc = 0.0f;
        for (int t = 0; t < n; t++) {
            int blk = table[t / B];
            if (blk < 0 || sc[t] == 0.0f) continue;
            const u8 *vh = arena + (u64)blk * sh.block_bytes + v_off;
            acc += sc[t] * kv_elem(vh, sh.v_fmt, B, D, sh.v_group, t % B, d);
        }
        o[d] = acc * inv;
    }
}

/* attention.cu: the KV cache on the device: K/V writes and paged decode attention, each query row
 * attending over its sequence's KV blocks, found through a block table, in the KV storage's byte
 * layout (kv/kv_storage.h, kv/kv_format.h):
 *
 *   block b at arena + b * block_bytes = [L][K heads | V heads], each head a region of
 *   k_head_bytes / v_head_bytes:  f32: [B][D] floats;  f16, bf16: [B][D] halves;  q8: [B][D] int8
 *   codes then [B][D / G] f16 scales (code * scale, groups of G along D);  fp8: [B][D] e4m3 codes
 *   then, 4-byte aligned, [B] f32 scales (per token and head: amax / 448);  q4h: [B][D / 2] bytes of
 *   4-bit codes then [B][D / G] f16 (scale, min) pairs (code * scale + min), K Hadamard-rotated per
 *   head (the attention then dots a rotated query: hr_k_hadamard_rows), V as it is;  q4 and kivi2
 *   (deferred: encoded when the block fills): K f16 scale [D], f16 min [D], then [B][D * bits / 8]
 *   codes (per channel over the block's tokens), V q4h's layout at 4 or 2 bits, unrotated.
 *
 * hr_k_kv_write encodes tokens' K and V rows into their slots (the CPU storage's encoders step for
 * step: the same bytes); a deferred format's rows go to their block's f16 stage instead, and
 * hr_k_kv_encode encodes the blocks a batch filled from their stages (encb_lowbit_k / _v's bytes).
 * A query whose context ends inside a block reads that block from its stage (kv.cuh's tail_of).
 * Attention is split over the sequence (flash-decoding) and GQA-aware:
 *   hr_k_attn_split: one thread block (HR_K_THREADS threads, >= head_dim) per (query, KV head, group of
 *     up to 8 of its query heads) and split of sh.chunk positions (grid.x = n_queries * Hkv *
 *     ceil(G / 8), grid.y = n_splits). It walks its split HR_K_ATT_TILE positions at a time with an
 *     online softmax (running max m and exp-sum l, the P.V accumulators rescaled when m grows); each K
 *     and V element is read and dequantized once for all the group's query heads; scores stay in
 *     shared memory. It writes, per query head, its unnormalized P.V, m and l (a split past the
 *     query's n_ctx: m = -inf, l = 0).
 *   hr_k_attn_reduce: one thread block per (query, head) combines the splits: out = sum_s o_s
 *     e^(m_s - M) / sum_s l_s e^(m_s - M), M the largest m_s (a query with no position: zeros).
 *   hr_k_attn_split_rows: hr_k_attn_split's work, grid and results, with K and V rows read whole by
 *     groups of lanes (coalesced vector loads; its comment below); kv_storage_cuda.c runs it when
 *     HEADROOM_CUDA_ATTN_KERNEL=rows (not yet the default: not measured on a GPU).
 * The host picks the split count for enough thread blocks to fill the GPU, not more
 * (kv_storage_cuda.c). The first versions: no tensor cores; hr_k_attn_split reads K rows one per
 * thread (uncoalesced) and has P.V threads over D. Dropped blocks (table entry -1) are skipped; a
 * query's sinks and window (win: kv.cuh's win_of) are walked as visible positions only; a token
 * masked by its sequence's policy (h2o, snapkv: tview and masks, kv.cuh's tok_mask_of) scores -inf,
 * so its weight is 0, as on the CPU.
 *   hr_k_attn_score: after the reduce, for the rows whose softmax weights the policy accumulates,
 *     each visible token's normalized weight summed over the query heads of a KV head, added to the
 *     sequence's scores in the manager's fixed point (2^-32). */
#include "kv.cuh" /* the formats, the shape, kv_elem, the window, the rows reads */

#define HR_K_ATT_TILE  256 /* positions scored at a time (shared memory) */
#define HR_K_ATT_G     8   /* query heads per thread block */
#define HR_K_ATT_MAX_D 256 /* head_dim at most (the host refuses more) */

/* ---- writes ---------------------------------------------------------------------------------------- */

/* x[0..D) in shared memory (D a power of two) becomes its normalized Hadamard transform: kv_format.c's
 * kv_hadamard, butterfly for butterfly (a + b, a - b), then times 1 / sqrt(D); every thread calls it */
static __device__ void hadamard_shared(float *x, int D) {
    for (int h = 1; h < D; h *= 2) {
        for (int p = tid_x(); p < D / 2; p += ntid_x()) {
            const int j = p / h * 2 * h + p % h;
            const float a = x[j], b = x[j + h];
            x[j] = a + b;
            x[j + h] = a - b;
        }
        __syncthreads();
    }
    const float norm = 1.0f / hr_sqrtf((float)D);
    for (int d = tid_x(); d < D; d += ntid_x()) x[d] *= norm;
    __syncthreads();
}

/* ---- the low-bit encoders: kv_format.c's kv_lowbit_fit, enc_q4tok (q4h), encb_lowbit_k and
 * encb_lowbit_v (q4, kivi2), operation for operation (one thread a fit: the search is serial and short;
 * contraction off, as the C build has it, so no a * b + c becomes an fma and the squared errors, hence
 * the chosen scale and min, are the CPU's) */

/* x's code against (s, m) with `levels` (2^bits - 1) steps */
static __device__ inline int lowbit_quant(float x, float s, float m, int levels) {
#pragma clang fp contract(off)
    if (s <= 0.0f) return 0;
    const float r = hr_rintf((x - m) / s);
    return r < 0.0f ? 0 : r > (float)levels ? levels : (int)r;
}
static __device__ inline int q4_quant(float x, float s, float m) { return lowbit_quant(x, s, m, 15); }

/* squared error of x[0..n) coded against (s, m) as stored in f16 (*s16, *m16 set) */
static __device__ float lowbit_fit_err(const float *x, int n, int levels, float s, float m, u16 *s16, u16 *m16) {
#pragma clang fp contract(off)
    *s16 = hr_f2h(s > 0.0f ? s : 0.0f);
    *m16 = hr_f2h(m);
    const float sr = hr_h2f(*s16), mr = hr_h2f(*m16);
    float e = 0.0f;
    for (int i = 0; i < n; i++) {
        const float d = x[i] - (sr * (float)lowbit_quant(x[i], sr, mr, levels) + mr);
        e += d * d;
    }
    return e;
}

/* the min-max range and 15 ranges clipped by up to 3/16 at either end, each refined once by least
 * squares on its codes; the smallest squared error wins (ties: the earlier) */
static __device__ void lowbit_fit(const float *x, int n, int levels, u16 *s16, u16 *m16) {
#pragma clang fp contract(off)
    float lo = x[0], hi = x[0];
    for (int i = 1; i < n; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
    }
    const float range = hi - lo;
    float best = lowbit_fit_err(x, n, levels, range / (float)levels, lo, s16, m16);
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) {
            const float l = lo + range * (float)a / 16.0f, h = hi - range * (float)b / 16.0f;
            const float sc0 = (h - l) / (float)levels;
            float sc = sc0, mn = l, sq = 0.0f, sx = 0.0f, sqq = 0.0f, sqx = 0.0f;
            for (int i = 0; i < n; i++) {
                const float c = (float)lowbit_quant(x[i], sc0, l, levels);
                sq += c;
                sx += x[i];
                sqq += c * c;
                sqx += c * x[i];
            }
            const float det = (float)n * sqq - sq * sq;
            if (det > 0.0f) {
                const float s2 = ((float)n * sqx - sq * sx) / det;
                if (s2 > 0.0f) {
                    sc = s2;
                    mn = (sx - s2 * sq) / (float)n;
                }
            }
            u16 cs, cm;
            const float e = lowbit_fit_err(x, n, levels, sc, mn, &cs, &cm);
            if (e < best) {
                best = e;
                *s16 = cs;
                *m16 = cm;
            }
        }
}

/* x (D floats in shared memory) into slot s of a q4h head region, rotated first when rotate (K): the
 * normalized Hadamard transform by butterflies (kv_hadamard's order), then each group of G by one
 * thread: its (scale, min) and its chunk's code bytes (a group owns whole bytes: G is 32, or D < 32) */
static __device__ void q4h_put(u8 *head, int B, int D, int G, int s, float *x, bool rotate) {
    if (rotate) hadamard_shared(x, D);
    const int g = tid_x();
    if (g >= D / G) return;
    u16 s16, m16;
    lowbit_fit(x + g * G, G, 15, &s16, &m16);
    const float sr = hr_h2f(s16), mr = hr_h2f(m16);
    u8 bytes[16] = {};
    int first = -1;
    for (int c = g * G; c < (g + 1) * G; c++) {
        int sh;
        const int byte = q4_code_byte(D, c, &sh);
        first = first < 0 || byte < first ? byte : first;
        bytes[byte % 16] |= (u8)(q4_quant(x[c], sr, mr) << sh);
    }
    u8 *codes = head + (u64)s * (u64)(D / 2);
    for (int i = 0; i < G / 2; i++) codes[first + i] = bytes[(first + i) % 16];
    u8 *pair = head + scale_off(HR_K_KV_Q4H, B, D) + 4u * ((u64)s * (u64)(D / G) + (u64)g);
    pair[0] = (u8)(s16 & 0xffu), pair[1] = (u8)(s16 >> 8), pair[2] = (u8)(m16 & 0xffu), pair[3] = (u8)(m16 >> 8);
}

/* One token's head x (D floats) into slot s of a head region: the CPU storage's encoders (enc_f16,
 * enc_q8, enc_fp8, ...) step for step. Every thread of the block calls it (the amax reductions); q4h
 * takes x from xs, shared memory the caller filled. */
static __device__ void kv_put(u8 *head, int fmt, int B, int D, int G, int s, const float *x, float *red, float *xs,
                              bool rotate) {
    const u64 row = (u64)s * (u64)D;
    if (fmt == HR_K_KV_Q4H) {
        q4h_put(head, B, D, G, s, xs, rotate);
    } else if (fmt == HR_K_KV_F32) {
        for (int d = tid_x(); d < D; d += ntid_x()) hr_aligned<4>((float *)head)[row + d] = x[d];
    } else if (fmt == HR_K_KV_F16 || fmt == HR_K_KV_BF16) {
        for (int d = tid_x(); d < D; d += ntid_x()) {
            const u16 h = fmt == HR_K_KV_F16 ? hr_f2h(x[d]) : hr_f2bf(x[d]);
            head[2u * (row + d)] = (u8)(h & 0xffu);
            head[2u * (row + d) + 1u] = (u8)(h >> 8);
        }
    } else if (fmt == HR_K_KV_FP8) {
        float amax = 0.0f;
        for (int d = tid_x(); d < D; d += ntid_x()) amax = __builtin_fmaxf(amax, __builtin_fabsf(x[d]));
        amax = block_max(amax, red);
        const float sc = amax / 448.0f, inv = sc > 0.0f ? 1.0f / sc : 0.0f;
        for (int d = tid_x(); d < D; d += ntid_x()) head[row + d] = hr_f_to_e4m3(x[d] * inv);
        if (tid_x() == 0) hr_aligned<4>((float *)(head + scale_off(fmt, B, D)))[s] = sc;
    } else { /* q8: per group of G, scale = amax / 127 rounded to f16, codes against the stored scale */
        u8 *scales = head + scale_off(fmt, B, D);
        for (int d = tid_x(); d < D; d += ntid_x()) {
            const int g0 = d / G * G;
            float amax = 0.0f;
            for (int c = 0; c < G; c++) amax = __builtin_fmaxf(amax, __builtin_fabsf(x[g0 + c]));
            const u16 s16 = hr_f2h(amax / 127.0f);
            const float sc = hr_h2f(s16), inv = sc > 0.0f ? 1.0f / sc : 0.0f;
            const float r = hr_rintf(x[d] * inv);
            head[row + d] = (u8)(i8)__builtin_fmaxf(-127.0f, __builtin_fminf(127.0f, r));
            if (d == g0) {
                const u64 at = 2u * ((u64)s * (u64)(D / G) + (u64)(d / G));
                scales[at] = (u8)(s16 & 0xffu);
                scales[at + 1u] = (u8)(s16 >> 8);
            }
        }
    }
}

/* stage st's [B][D] f16 rows of KV head h in layer, K (role 0) or V (kv.cuh's tail_of has the layout) */
static __device__ inline u8 *stage_head(u8 *stages, int st, int layer, int role, int h, const hr_k_attn_shape &sh) {
    const u64 head = (u64)sh.block_size * (u64)sh.head_dim * 2u;
    return stages + (((u64)st * (u64)sh.n_layers + (u64)layer) * 2u + (u64)role) * (u64)sh.n_kv_heads * head +
           (u64)h * head;
}

/* Token i's K and V rows (k, v: [n][Hkv][D] f32) into physical slot slots[i] = block * B + t of
 * layer: one thread block per (token, K or V, KV head) (grid.x = n, grid.y = 2 * Hkv). A deferred
 * format's row goes to row t of the block's stage tok_stage[i] in f16 (kv_cpu_write's), encoded into
 * the block when it fills (hr_k_kv_encode). */
extern "C" __global__ void hr_k_kv_write(u8 *arena, u8 *stages, const float *k, const float *v, const int *slots,
                                         const int *tok_stage, int layer, hr_k_attn_shape sh) {
    __shared__ float red[32];
    __shared__ float xs[HR_K_ATT_MAX_D];
    const int i = ctaid_x(), role = ctaid_y() / sh.n_kv_heads, h = ctaid_y() % sh.n_kv_heads;
    const int D = sh.head_dim, B = sh.block_size, slot = slots[i], fmt = role == 0 ? sh.k_fmt : sh.v_fmt;
    const u64 layer_off = (u64)layer * (u64)sh.n_kv_heads * (sh.k_head_bytes + sh.v_head_bytes);
    u8 *blk = arena + (u64)(slot / B) * sh.block_bytes + layer_off;
    const float *x = (role == 0 ? k : v) + ((u64)i * (u64)sh.n_kv_heads + (u64)h) * (u64)D;
    if (kv_deferred(fmt)) {
        u8 *row = stage_head(stages, tok_stage[i], layer, role, h, sh) + (u64)(slot % B) * (u64)D * 2u;
        for (int d = tid_x(); d < D; d += ntid_x()) {
            const u16 f = hr_f2h(x[d]);
            row[2 * d] = (u8)(f & 0xffu);
            row[2 * d + 1] = (u8)(f >> 8);
        }
        return;
    }
    if (fmt == HR_K_KV_Q4H) {
        for (int d = tid_x(); d < D; d += ntid_x()) xs[d] = x[d];
        __syncthreads();
    }
    if (role == 0)
        kv_put(blk + (u64)h * sh.k_head_bytes, sh.k_fmt, B, D, sh.k_group, slot % B, x, red, xs, true);
    else
        kv_put(blk + (u64)sh.n_kv_heads * sh.k_head_bytes + (u64)h * sh.v_head_bytes, sh.v_fmt, B, D, sh.v_group,
               slot % B, x, red, xs, false);
}

/* Code byte `byte` of token t's row in a low-bit head region: each of its 8 / bits channels' codes
 * (lowbit_code_byte's map, inverted) against the scale and min already stored, its channel's (per
 * channel) or its group's (per token), from the stage's f16 row */
static __device__ u8 lowbit_byte(const u8 *head, const u8 *src, int fmt, int B, int D, int G, int t, int byte) {
    const int bits = kv_bits(fmt), per = 8 / bits, W = 16 * per, base = byte / 16 * W;
    const int w = D - base < W ? D - base : W, nb = w / per, k = byte % 16;
    u8 out = 0;
    for (int j = 0; j < per; j++) {
        const int c = base + k + j * nb;
        const u8 *sm =
            kv_per_channel(fmt) ? nullptr : head + scale_off(fmt, B, D) + 4u * ((u64)t * (u64)(D / G) + c / G);
        const float s = hr_h2f(sm ? hr_ld_u16(sm) : hr_ld_u16(head + 2u * (u64)c));
        const float m = hr_h2f(sm ? hr_ld_u16(sm + 2) : hr_ld_u16(head + 2u * (u64)(D + c)));
        const float x = hr_h2f(hr_ld_u16(src + 2u * ((u64)t * (u64)D + (u64)c)));
        out |= (u8)(lowbit_quant(x, s, m, (1 << bits) - 1) << (j * bits));
    }
    return out;
}

/* A staged head region (src: [B][D] f16) into head in a deferred format: first every fit (K: one a
 * channel over the B tokens, encb_lowbit_k; V: one a token's group of G, encb_lowbit_v) stores its
 * f16 scale and min, then, those read back, every code byte is made whole by one thread (several
 * fits share a byte, so the fits cannot write their codes themselves) */
static __device__ void lowbit_encode(u8 *head, const u8 *src, int fmt, int B, int D, int G) {
    const int levels = (1 << kv_bits(fmt)) - 1;
    float x[256]; /* B <= 256, G <= 32 */
    if (kv_per_channel(fmt)) {
        for (int c = tid_x(); c < D; c += ntid_x()) {
            for (int t = 0; t < B; t++) x[t] = hr_h2f(hr_ld_u16(src + 2u * ((u64)t * (u64)D + (u64)c)));
            u16 s16, m16;
            lowbit_fit(x, B, levels, &s16, &m16);
            head[2 * c] = (u8)(s16 & 0xffu), head[2 * c + 1] = (u8)(s16 >> 8);
            head[2 * (D + c)] = (u8)(m16 & 0xffu), head[2 * (D + c) + 1] = (u8)(m16 >> 8);
        }
    } else {
        const int ng = D / G;
        for (int j = tid_x(); j < B * ng; j += ntid_x()) {
            const int t = j / ng, g = j % ng;
            for (int c = 0; c < G; c++) x[c] = hr_h2f(hr_ld_u16(src + 2u * ((u64)t * (u64)D + (u64)(g * G + c))));
            u16 s16, m16;
            lowbit_fit(x, G, levels, &s16, &m16);
            u8 *pair = head + scale_off(fmt, B, D) + 4u * (u64)j;
            pair[0] = (u8)(s16 & 0xffu), pair[1] = (u8)(s16 >> 8), pair[2] = (u8)(m16 & 0xffu),
            pair[3] = (u8)(m16 >> 8);
        }
    }
    __syncthreads(); /* the scales and mins, global memory, seen by the block's threads */
    const int row = D * kv_bits(fmt) / 8;
    u8 *codes = head + code_off(fmt, D);
    for (int j = tid_x(); j < B * row; j += ntid_x()) codes[j] = lowbit_byte(head, src, fmt, B, D, G, j / row, j % row);
}

/* The blocks that filled in a batch, encoded from their stages: token i's write completed its block
 * where fills[i] != 0 (the host's count: kv_storage_cuda.c), that block (slots[i] / B) then encoded in
 * layer from stage tok_stage[i], K and V where deferred: one thread block per (token, K or V, KV head)
 * (the grid of hr_k_kv_write, run after it; the other tokens' blocks return at once) */
extern "C" __global__ void hr_k_kv_encode(u8 *arena, const u8 *stages, const int *slots, const int *tok_stage,
                                          const int *fills, int layer, hr_k_attn_shape sh) {
    const int i = ctaid_x(), role = ctaid_y() / sh.n_kv_heads, h = ctaid_y() % sh.n_kv_heads;
    const int fmt = role == 0 ? sh.k_fmt : sh.v_fmt;
    if (!fills[i] || !kv_deferred(fmt)) return;
    const int B = sh.block_size, D = sh.head_dim;
    const u64 layer_off = (u64)layer * (u64)sh.n_kv_heads * (sh.k_head_bytes + sh.v_head_bytes);
    u8 *blk = arena + (u64)(slots[i] / B) * sh.block_bytes + layer_off;
    u8 *head = role == 0 ? blk + (u64)h * sh.k_head_bytes
                         : blk + (u64)sh.n_kv_heads * sh.k_head_bytes + (u64)h * sh.v_head_bytes;
    const u8 *src = stage_head((u8 *)stages, tok_stage[i], layer, role, h, sh);
    lowbit_encode(head, src, fmt, B, D, role == 0 ? sh.k_group : sh.v_group);
}

/* q4h keys are stored rotated, so the attention dots rotated queries: out = the normalized Hadamard
 * transform of each row of q ([rows][D], D a power of two), one thread block a row (kv_hadamard's
 * butterflies, as the CPU's attention rotates its query) */
extern "C" __global__ void hr_k_hadamard_rows(float *out, const float *q, int D) {
    __shared__ float x[HR_K_ATT_MAX_D];
    const u64 row = (u64)ctaid_x() * (u64)D;
    for (int d = tid_x(); d < D; d += ntid_x()) x[d] = q[row + d];
    __syncthreads();
    hadamard_shared(x, D);
    for (int d = tid_x(); d < D; d += ntid_x()) out[row + d] = x[d];
}

/* ---- attention ------------------------------------------------------------------------------------- */

/* What a thread block of either split kernel works on: its query, the group of query heads [h0, h0 +
 * gn) of KV head kvh, its split's visible positions [s0, s1) (virtual indices, win_pos), the query's
 * table row and the layer's K and V head regions' offsets in a block. */
typedef struct attn_block {
    int qi, kvh, h0, gn, split, ws, off, s0, s1;
    const int *table;
    const u64 *mask; /* the token mask of (layer, kvh), NULL: every position kept */
    u64 k_off, v_off;
    kv_tail tail; /* a deferred format's partial last block, read from its stage */
} attn_block;

static __device__ inline attn_block attn_block_of(const hr_k_attn_shape &sh, const int *tables, const int *qrow,
                                                  const int *n_ctx, const int *win, const u8 *stages, const int *tails,
                                                  const int *tview, const u64 *masks, int layer) {
    attn_block a;
    const int G = sh.n_heads / sh.n_kv_heads, ng = (G + HR_K_ATT_G - 1) / HR_K_ATT_G;
    int idx = ctaid_x();
    const int hg = idx % ng;
    idx /= ng;
    a.kvh = idx % sh.n_kv_heads;
    a.qi = idx / sh.n_kv_heads;
    a.h0 = a.kvh * G + hg * HR_K_ATT_G;
    a.gn = G - hg * HR_K_ATT_G < HR_K_ATT_G ? G - hg * HR_K_ATT_G : HR_K_ATT_G;
    a.split = ctaid_y();
    win_of(win, a.qi, &a.ws, &a.off);
    const int n = n_ctx[a.qi] - a.off; /* visible positions */
    a.s0 = a.split * sh.chunk;
    a.s1 = n < a.s0 + sh.chunk ? n : a.s0 + sh.chunk; /* <= s0: nothing to see */
    a.table = tables + (u64)(qrow ? qrow[a.qi] : a.qi) * (u64)sh.max_blocks;
    a.mask = tok_mask_of(tview, masks, sh, a.qi, layer, a.kvh);
    const u64 layer_off = (u64)layer * (u64)sh.n_kv_heads * (sh.k_head_bytes + sh.v_head_bytes);
    a.k_off = layer_off + (u64)a.kvh * sh.k_head_bytes;
    a.v_off = layer_off + (u64)sh.n_kv_heads * sh.k_head_bytes + (u64)a.kvh * sh.v_head_bytes;
    a.tail = tail_of(stages, tails, a.qi, n_ctx[a.qi], layer, a.kvh, sh);
    return a;
}

/* o_part: [nq][H][n_splits][D] unnormalized P.V; ml_part: [nq][H][n_splits][2] (m, l). q: [nq][H][D]
 * with RoPE applied; query qi reads table row qrow[qi] (qrow NULL: row qi) of tables [rows][max_blocks]
 * (physical ids); n_ctx: [nq]; win: [nq][2] or NULL (above); stages, tails: a deferred format's
 * stages and each query's last block's (kv.cuh's tail_of), or NULL; tview, masks: the token masks, or
 * NULL (kv.cuh). */
extern "C" __global__ void hr_k_attn_split(float *o_part, float *ml_part, const float *q, const u8 *arena,
                                           const int *tables, const int *qrow, const int *n_ctx, const int *win,
                                           const u8 *stages, const int *tails, const int *tview, const u64 *masks,
                                           int layer, hr_k_attn_shape sh) {
    __shared__ float qs[HR_K_ATT_G * HR_K_ATT_MAX_D];
    __shared__ float sc[HR_K_ATT_G * HR_K_ATT_TILE];
    __shared__ float stat[3 * HR_K_ATT_G]; /* per head: running m, running l, this tile's rescale */
    __shared__ float red[32];
    const attn_block ab = attn_block_of(sh, tables, qrow, n_ctx, win, stages, tails, tview, masks, layer);
    const int H = sh.n_heads, D = sh.head_dim, B = sh.block_size, split = ab.split, qi = ab.qi, h0 = ab.h0, gn = ab.gn,
              ws = ab.ws, off = ab.off, s0 = ab.s0, s1 = ab.s1;
    /* the tail block's K and V (deferred roles only) from the stage, in f16 */
    const int k_tail = kv_deferred(sh.k_fmt) ? ab.tail.blk : -1, v_tail = kv_deferred(sh.v_fmt) ? ab.tail.blk : -1;
    const int *table = ab.table;
    const u64 k_off = ab.k_off, v_off = ab.v_off;

    for (int i = tid_x(); i < gn * D; i += ntid_x()) qs[i] = q[((u64)qi * (u64)H + (u64)(h0 + i / D)) * (u64)D + i % D];
    if (tid_x() < HR_K_ATT_G) stat[tid_x()] = -__builtin_inff(), stat[HR_K_ATT_G + tid_x()] = 0.0f;
    /* the P.V accumulators of this thread's output dimension d (D <= HR_K_ATT_MAX_D <= threads: one
     * dimension a thread, or none) */
    const int d = tid_x();
    float acc[HR_K_ATT_G];
    for (int g = 0; g < HR_K_ATT_G; g++) acc[g] = 0.0f;
    __syncthreads();
    for (int t0 = s0; t0 < s1; t0 += HR_K_ATT_TILE) {
        const int t1 = s1 < t0 + HR_K_ATT_TILE ? s1 : t0 + HR_K_ATT_TILE;
        /* 1. scores: one position per thread, its K row dequantized once for the group's heads */
        for (int t = t0 + tid_x(); t < t1; t += ntid_x()) {
            const int tp = win_pos(t, ws, off);
            const int blk = tok_kept(ab.mask, sh, tp) ? table[tp / B] : -1; /* masked: as a dropped block */
            float dot[HR_K_ATT_G];
            for (int g = 0; g < HR_K_ATT_G; g++) dot[g] = 0.0f;
            if (blk >= 0) {
                const bool st = tp / B == k_tail;
                const u8 *kh = st ? ab.tail.k : arena + (u64)blk * sh.block_bytes + k_off;
                const int kf = st ? HR_K_KV_F16 : sh.k_fmt;
                for (int c = 0; c < D; c++) {
                    const float kd = kv_elem(kh, kf, B, D, sh.k_group, tp % B, c);
                    for (int g = 0; g < gn; g++) dot[g] += qs[g * D + c] * kd;
                }
            }
            for (int g = 0; g < gn; g++) {
                float s = -__builtin_inff();
                if (blk >= 0) {
                    s = dot[g] * sh.scale;
                    if (sh.softcap > 0.0f) s = sh.softcap * hr_tanhf(s / sh.softcap);
                }
                sc[g * HR_K_ATT_TILE + (t - t0)] = s;
            }
        }
        __syncthreads();
        /* 2. per head: the new running max, the tile's weights e^(s - m) in place, the running sum */
        for (int g = 0; g < gn; g++) {
            float *sg = sc + g * HR_K_ATT_TILE;
            float m = -__builtin_inff();
            for (int t = tid_x(); t < t1 - t0; t += ntid_x()) m = sg[t] > m ? sg[t] : m;
            m = block_max(m, red);
            const float m_old = stat[g], m_new = m > m_old ? m : m_old;
            float l = 0.0f;
            for (int t = tid_x(); t < t1 - t0; t += ntid_x()) {
                const float w = m_new == -__builtin_inff() ? 0.0f : hr_expf(sg[t] - m_new);
                sg[t] = w;
                l += w;
            }
            l = block_sum(l, red);
            if (tid_x() == 0) {
                const float r = m_old == -__builtin_inff() ? 0.0f : hr_expf(m_old - m_new);
                stat[2 * HR_K_ATT_G + g] = r;
                stat[HR_K_ATT_G + g] = stat[HR_K_ATT_G + g] * r + l;
                stat[g] = m_new;
            }
        }
        __syncthreads();
        /* 3. the weighted V rows, one output dimension per thread, each V element read once for the group */
        if (d < D) {
            for (int g = 0; g < gn; g++) acc[g] *= stat[2 * HR_K_ATT_G + g];
            for (int t = t0; t < t1; t++) {
                const int tp = win_pos(t, ws, off);
                const int blk = table[tp / B];
                if (blk < 0) continue;
                const bool st = tp / B == v_tail;
                const u8 *vh = st ? ab.tail.v : arena + (u64)blk * sh.block_bytes + v_off;
                const float vd = kv_elem(vh, st ? HR_K_KV_F16 : sh.v_fmt, B, D, sh.v_group, tp % B, d);
                for (int g = 0; g < gn; g++) acc[g] += sc[g * HR_K_ATT_TILE + (t - t0)] * vd;
            }
        }
        __syncthreads(); /* the scores and the rescale are rewritten by the next tile */
    }
    if (d < D)
        for (int g = 0; g < gn; g++)
            o_part[(((u64)qi * (u64)H + (u64)(h0 + g)) * (u64)sh.n_splits + (u64)split) * (u64)D + d] = acc[g];
    if (tid_x() < gn) {
        float *ml = ml_part + (((u64)qi * (u64)H + (u64)(h0 + tid_x())) * (u64)sh.n_splits + (u64)split) * 2u;
        ml[0] = stat[tid_x()];
        ml[1] = stat[HR_K_ATT_G + tid_x()];
    }
}

/* ---- attention, rows: K and V read a whole row per group of lanes (coalesced) ---------------------- */

/* hr_k_attn_split_rows: the same grid, arguments, split, online softmax and partial results as
 * hr_k_attn_split (hr_k_attn_reduce combines either), laid out for the memory system instead:
 *   - a lane owns a chunk of 8 consecutive elements of a row (d0 = 8 r); a row is read by lpr lanes
 *     (lpr = the power of two >= D / 8, at least 8; lanes past D / 8 idle), so a warp reads 32 / lpr
 *     whole rows per load instruction: 16-byte loads (two for f32), 8-byte ones for q8 and fp8 codes;
 *   - each warp takes 32 consecutive positions of a tile and issues a batch of them (64 bytes per
 *     lane) before it uses any, so loads overlap;
 *   - scores: the lane's slice of each of the group's query heads is in registers (NG x 8 floats, NG
 *     the group rounded up to a power of two); its NG partial dots are reduced over the row's lanes by
 *     a reduce-scatter (NG/2 + NG/4 + ... + 1 shuffles leave one head's sum in each of NG lanes), then
 *     log2(lpr / NG) more; the scores go to shared memory as before;
 *   - softmax: one warp per query head (no block-wide reductions);
 *   - P.V: the same lane map over V; each lane accumulates its 8 dimensions for the NG heads over its
 *     rows in registers; at the end the 8 x 32 / lpr partial rows per head meet in shared memory.
 * q8 and fp8 codes are converted exactly (q8 through the 2^23 float trick) and their scale applied
 * once per chunk. Needs D % 8 == 0 (the host falls back to hr_k_attn_split otherwise) and, for q8, a
 * group G % 8 == 0 (kv_format's G is a power of two >= 8). The chunk reads (rows_fetch, rows_deq) are in
 * kv.cuh. */

/* where a lane sits: r its chunk within a row of lpr lanes, row its row within the warp's 32 / lpr */
struct rows_lane {
    int lane, warp, r, row, ppw, lpr, d0;
    bool on; /* r < D / 8 */
};

/* NG values a lane, summed over the lanes of bits 0 .. log2(NG) - 1 of the lane index, scattered: v[0]
 * ends as one head's sum, that head returned (NG/2 + NG/4 + ... + 1 shuffles) */
template <int NG> static __device__ inline int rows_reduce_scatter(float (&v)[NG], int lane) {
    int h = 0;
#pragma unroll
    for (int n = NG; n > 1; n /= 2) {
        const int o = NG / n;
        const bool up = (lane & o) != 0;
#pragma unroll
        for (int i = 0; i < n / 2; i++) {
            const float lo = v[i], hi = v[i + n / 2]; /* values, not addresses, selected: registers */
            v[i] = (up ? hi : lo) + hr_shfl_xor(up ? lo : hi, o);
        }
        if (up) h += n / 2;
    }
    return h;
}

/* 1. the tile's scores [t0, t0 + nt) into sc[h][p] for the group's gn heads */
template <int KF, int NG>
static __device__ void rows_scores(float *sc, const float (&qr)[NG][HR_K_ROWS_E], const u8 *arena, const int *table,
                                   u64 k_off, hr_k_attn_shape sh, int t0, int nt, int gn, int ws, int off,
                                   const u64 *mask, const kv_tail &tail, rows_lane L) {
    constexpr int U = rows_batch<KF>();
    const int B = sh.block_size, D = sh.head_dim, w0 = L.warp * HR_K_WARP;
    for (int i0 = 0; i0 < HR_K_WARP && w0 + i0 < nt; i0 += L.ppw * U) { /* warp-uniform */
        rows_raw raw[U];
        int blk[U];
        bool st[U]; /* a deferred K's tail position: its f16 row in the stage */
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int p = w0 + i0 + u * L.ppw + L.row;
            const int tp = win_pos(t0 + p, ws, off);
            blk[u] = p < nt && tok_kept(mask, sh, tp) ? table[tp / B] : -1; /* masked: as a dropped block */
            st[u] = kv_deferred(KF) && p < nt && tp / B == tail.blk;
            raw[u] = rows_raw{};
            if (L.on && st[u])
                raw[u] = rows_fetch<HR_K_KV_F16>(tail.k, B, D, 1, tp % B, L.d0);
            else if (L.on && blk[u] >= 0)
                raw[u] = rows_fetch<KF>(arena + (u64)blk[u] * sh.block_bytes + k_off, B, D, sh.k_group, tp % B, L.d0);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            float x[HR_K_ROWS_E], v[NG];
            const float f = kv_deferred(KF) && st[u] ? rows_deq<HR_K_KV_F16>(raw[u], x) : rows_deq<KF>(raw[u], x);
#pragma unroll
            for (int h = 0; h < NG; h++) {
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < HR_K_ROWS_E; j++) s += qr[h][j] * x[j];
                v[h] = s * f;
            }
            const int h = rows_reduce_scatter<NG>(v, L.lane);
            for (int o = NG; o < L.lpr; o <<= 1) v[0] += hr_shfl_xor(v[0], o);
            const int p = w0 + i0 + u * L.ppw + L.row;
            if (L.r < NG && h < gn && p < nt) {
                float s = -__builtin_inff();
                if (blk[u] >= 0) {
                    s = v[0] * sh.scale;
                    if (sh.softcap > 0.0f) s = sh.softcap * hr_tanhf(s / sh.softcap);
                }
                sc[h * HR_K_ATT_TILE + p] = s;
            }
        }
    }
}

/* 3. acc[h][j] += w[h][p] v[p][d0 + j] over the tile's positions this lane's row takes */
template <int VF, int NG>
static __device__ void rows_pv(float (&acc)[NG][HR_K_ROWS_E], const float *sc, const u8 *arena, const int *table,
                               u64 v_off, hr_k_attn_shape sh, int t0, int nt, int gn, int ws, int off,
                               const kv_tail &tail, rows_lane L) {
    constexpr int U = rows_batch<VF>();
    const int B = sh.block_size, D = sh.head_dim, w0 = L.warp * HR_K_WARP;
    for (int i0 = 0; i0 < HR_K_WARP && w0 + i0 < nt; i0 += L.ppw * U) {
        rows_raw raw[U];
        bool st[U]; /* a deferred V's tail position: its f16 row in the stage */
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int p = w0 + i0 + u * L.ppw + L.row;
            const int tp = win_pos(t0 + p, ws, off);
            const int blk = p < nt ? table[tp / B] : -1;
            st[u] = kv_deferred(VF) && p < nt && tp / B == tail.blk;
            raw[u] = rows_raw{};
            if (L.on && st[u])
                raw[u] = rows_fetch<HR_K_KV_F16>(tail.v, B, D, 1, tp % B, L.d0);
            else if (L.on && blk >= 0)
                raw[u] = rows_fetch<VF>(arena + (u64)blk * sh.block_bytes + v_off, B, D, sh.v_group, tp % B, L.d0);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int p = w0 + i0 + u * L.ppw + L.row;
            float x[HR_K_ROWS_E];
            const float f = kv_deferred(VF) && st[u] ? rows_deq<HR_K_KV_F16>(raw[u], x) : rows_deq<VF>(raw[u], x);
#pragma unroll
            for (int h = 0; h < NG; h++) {
                /* a dropped position's weight is 0 and its chunk zeros; past nt or gn nothing was written */
                const float w = p < nt && h < gn ? sc[h * HR_K_ATT_TILE + p] * f : 0.0f;
#pragma unroll
                for (int j = 0; j < HR_K_ROWS_E; j++) acc[h][j] += w * x[j];
            }
        }
    }
}

/* inlined into the kernel: its pointers stay known as global (ld.global), its shape in parameters */
template <int NG>
static __device__ __attribute__((always_inline)) inline void
rows_attend(float *sc, float *stat, float *o_part, float *ml_part, const float *q, const u8 *arena, const int *tables,
            const int *qrow, const int *n_ctx, const int *win, const u8 *stages, const int *tails, const int *tview,
            const u64 *masks, int layer, hr_k_attn_shape sh) {
    const attn_block ab = attn_block_of(sh, tables, qrow, n_ctx, win, stages, tails, tview, masks, layer);
    const int H = sh.n_heads, D = sh.head_dim, split = ab.split, qi = ab.qi, h0 = ab.h0, gn = ab.gn, ws = ab.ws,
              off = ab.off, s0 = ab.s0, s1 = ab.s1;
    const int *table = ab.table;
    const u64 k_off = ab.k_off, v_off = ab.v_off;

    rows_lane L;
    L.lane = tid_x() % HR_K_WARP;
    L.warp = tid_x() / HR_K_WARP;
    L.lpr = 8;
    while (L.lpr < D / HR_K_ROWS_E) L.lpr <<= 1;
    L.ppw = HR_K_WARP / L.lpr;
    L.r = L.lane % L.lpr;
    L.row = L.lane / L.lpr;
    L.d0 = L.r * HR_K_ROWS_E;
    L.on = L.d0 < D;

    /* the lane's slice of each query head, and its P.V accumulators */
    float qr[NG][HR_K_ROWS_E], acc[NG][HR_K_ROWS_E];
#pragma unroll
    for (int h = 0; h < NG; h++)
#pragma unroll
        for (int j = 0; j < HR_K_ROWS_E; j++) {
            acc[h][j] = 0.0f;
            qr[h][j] = L.on && h < gn ? q[((u64)qi * (u64)H + (u64)(h0 + h)) * (u64)D + (u64)(L.d0 + j)] : 0.0f;
        }
    if (tid_x() < HR_K_ATT_G) stat[tid_x()] = -__builtin_inff(), stat[HR_K_ATT_G + tid_x()] = 0.0f;
    __syncthreads();
    for (int t0 = s0; t0 < s1; t0 += HR_K_ATT_TILE) {
        const int nt = s1 - t0 < HR_K_ATT_TILE ? s1 - t0 : HR_K_ATT_TILE;
        kv_by_fmt(sh.k_fmt, [&](auto f) {
            rows_scores<decltype(f)::value, NG>(sc, qr, arena, table, k_off, sh, t0, nt, gn, ws, off, ab.mask, ab.tail,
                                                L);
        });
        __syncthreads();
        /* 2. warp h: head h's new running max, the tile's weights e^(s - m) in place, the running sum */
        if (L.warp < gn) {
            float *sg = sc + L.warp * HR_K_ATT_TILE;
            /* every lane's read of m_old feeds the shuffles lane 0 passes before it rewrites it */
            const float m_old = stat[L.warp];
            float m = m_old;
            for (int t = L.lane; t < nt; t += HR_K_WARP) m = sg[t] > m ? sg[t] : m;
            const float m_new = warp_max(m);
            float l = 0.0f;
            for (int t = L.lane; t < nt; t += HR_K_WARP) {
                const float w = m_new == -__builtin_inff() ? 0.0f : hr_expf(sg[t] - m_new);
                sg[t] = w;
                l += w;
            }
            l = warp_sum(l);
            if (L.lane == 0) {
                const float r = m_old == -__builtin_inff() ? 0.0f : hr_expf(m_old - m_new);
                stat[2 * HR_K_ATT_G + L.warp] = r;
                stat[HR_K_ATT_G + L.warp] = stat[HR_K_ATT_G + L.warp] * r + l;
                stat[L.warp] = m_new;
            }
        }
        __syncthreads();
#pragma unroll
        for (int h = 0; h < NG; h++) {
            const float r = h < gn ? stat[2 * HR_K_ATT_G + h] : 0.0f;
#pragma unroll
            for (int j = 0; j < HR_K_ROWS_E; j++) acc[h][j] *= r;
        }
        kv_by_fmt(sh.v_fmt, [&](auto f) {
            rows_pv<decltype(f)::value, NG>(acc, sc, arena, table, v_off, sh, t0, nt, gn, ws, off, ab.tail, L);
        });
        __syncthreads(); /* the scores and the rescale are rewritten by the next tile */
    }
    /* per head: the 8 x ppw partial rows (one per warp and row) through shared memory (8 ppw D <=
     * 8 x 256 floats: sc), summed by thread d */
#pragma unroll
    for (int h = 0; h < NG; h++) {
        if (h >= gn) break;
        if (L.on)
#pragma unroll
            for (int j = 0; j < HR_K_ROWS_E; j++) sc[(L.warp * L.ppw + L.row) * D + L.d0 + j] = acc[h][j];
        __syncthreads();
        if (tid_x() < D) {
            float s = 0.0f;
            for (int k = 0; k < HR_K_ATT_G * L.ppw; k++) s += sc[k * D + tid_x()];
            o_part[(((u64)qi * (u64)H + (u64)(h0 + h)) * (u64)sh.n_splits + (u64)split) * (u64)D + tid_x()] = s;
        }
        __syncthreads();
    }
    if (tid_x() < gn) {
        float *ml = ml_part + (((u64)qi * (u64)H + (u64)(h0 + tid_x())) * (u64)sh.n_splits + (u64)split) * 2u;
        ml[0] = stat[tid_x()];
        ml[1] = stat[HR_K_ATT_G + tid_x()];
    }
}

/* the arguments and grid of hr_k_attn_split (blockDim.x == 256: 8 warps, one per 32 positions of a tile) */
extern "C" __global__ void hr_k_attn_split_rows(float *o_part, float *ml_part, const float *q, const u8 *arena,
                                                const int *tables, const int *qrow, const int *n_ctx, const int *win,
                                                const u8 *stages, const int *tails, const int *tview, const u64 *masks,
                                                int layer, hr_k_attn_shape sh) {
    __shared__ float sc[HR_K_ATT_G * HR_K_ATT_TILE];
    __shared__ float stat[3 * HR_K_ATT_G]; /* per head: running m, running l, this tile's rescale */
    const int G = sh.n_heads / sh.n_kv_heads, ng = (G + HR_K_ATT_G - 1) / HR_K_ATT_G;
    const int hg = ctaid_x() % ng;
    const int gn = G - hg * HR_K_ATT_G < HR_K_ATT_G ? G - hg * HR_K_ATT_G : HR_K_ATT_G;
    if (gn > 4)
        rows_attend<8>(sc, stat, o_part, ml_part, q, arena, tables, qrow, n_ctx, win, stages, tails, tview, masks,
                       layer, sh);
    else if (gn > 2)
        rows_attend<4>(sc, stat, o_part, ml_part, q, arena, tables, qrow, n_ctx, win, stages, tails, tview, masks,
                       layer, sh);
    else if (gn > 1)
        rows_attend<2>(sc, stat, o_part, ml_part, q, arena, tables, qrow, n_ctx, win, stages, tails, tview, masks,
                       layer, sh);
    else
        rows_attend<1>(sc, stat, o_part, ml_part, q, arena, tables, qrow, n_ctx, win, stages, tails, tview, masks,
                       layer, sh);
}

/* out[q][h][D] from the splits' partial results (grid.x = n_queries, grid.y = H) */
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

/* ---- scores for the token-level policies ----------------------------------------------------------- */

/* For each query qi whose weights its policy accumulates (tview[2 qi + 1]; kv.cuh), every visible token
 * t of [0, n_ctx) gets, added to scores[row][t / B][layer][kvh][t % B] (row = tview[2 qi]; the layout of
 * the masks with B entries a (block, layer, KV head) in place of MW words), the sum over the query heads
 * h of KV head kvh of its normalized softmax weight e^(s_t - M_h) / L_h, M_h and L_h the splits' max and
 * sum combined as hr_k_attn_reduce combines them (from ml_part, so this runs after the split kernel).
 * Each head's weight is rounded to the manager's fixed point (2^-32) on its own before the sum, as the
 * CPU storage adds them; the scores are u64 and a sequence's rows share them: atomic adds. s_t is the
 * split kernel's score, recomputed (its q.k, c in order, times scale, then the soft-cap). One thread
 * block per (query, KV head) (grid.x = nq * Hkv), a position per thread; rows that do not accumulate
 * return at once. */
extern "C" __global__ void hr_k_attn_score(u64 *scores, const float *ml_part, const float *q, const u8 *arena,
                                           const int *tables, const int *qrow, const int *n_ctx, const int *win,
                                           const u8 *stages, const int *tails, const int *tview, const u64 *masks,
                                           int layer, hr_k_attn_shape sh) {
    __shared__ float qs[HR_K_ATT_G * HR_K_ATT_MAX_D];
    __shared__ float stat[2 * HR_K_ATT_G]; /* per head: M, 1 / L */
    const int qi = ctaid_x() / sh.n_kv_heads, kvh = ctaid_x() % sh.n_kv_heads;
    if (tview[2 * qi] < 0 || !tview[2 * qi + 1]) return;
    const int H = sh.n_heads, D = sh.head_dim, B = sh.block_size, G = H / sh.n_kv_heads, n = n_ctx[qi];
    const int *table = tables + (u64)(qrow ? qrow[qi] : qi) * (u64)sh.max_blocks;
    const u64 *mask = tok_mask_of(tview, masks, sh, qi, layer, kvh);
    const u64 per_block = (u64)sh.n_layers * (u64)sh.n_kv_heads * (u64)B;
    u64 *sc = scores + (u64)tview[2 * qi] * (u64)sh.max_blocks * per_block +
              ((u64)layer * (u64)sh.n_kv_heads + (u64)kvh) * (u64)B;
    const u64 k_off =
        (u64)layer * (u64)sh.n_kv_heads * (sh.k_head_bytes + sh.v_head_bytes) + (u64)kvh * sh.k_head_bytes;
    /* a deferred K's partial last block: its rows in the stage, f16 (as the split kernels read them) */
    const kv_tail tail = tail_of(stages, tails, qi, n, layer, kvh, sh);
    const int k_tail = kv_deferred(sh.k_fmt) ? tail.blk : -1;
    for (int g0 = 0; g0 < G; g0 += HR_K_ATT_G) {
        const int gn = G - g0 < HR_K_ATT_G ? G - g0 : HR_K_ATT_G, h0 = kvh * G + g0;
        for (int i = tid_x(); i < gn * D; i += ntid_x())
            qs[i] = q[((u64)qi * (u64)H + (u64)(h0 + i / D)) * (u64)D + i % D];
        if (tid_x() < gn) {
            const float *ml = ml_part + ((u64)qi * (u64)H + (u64)(h0 + tid_x())) * (u64)sh.n_splits * 2u;
            float M = -__builtin_inff(), L = 0.0f;
            for (int s = 0; s < sh.n_splits; s++) M = ml[2 * s] > M ? ml[2 * s] : M;
            for (int s = 0; s < sh.n_splits; s++)
                if (ml[2 * s] != -__builtin_inff()) L += ml[2 * s + 1] * hr_expf(ml[2 * s] - M);
            stat[tid_x()] = M;
            stat[HR_K_ATT_G + tid_x()] = L > 0.0f ? 1.0f / L : 0.0f;
        }
        __syncthreads();
        /* the positions the split kernels saw (a model's window too: M and L are theirs) */
        int ws, off;
        win_of(win, qi, &ws, &off);
        for (int t = tid_x(); t < n; t += ntid_x()) {
            if (t >= ws && t < ws + off) continue;
            const int blk = table[t / B];
            if (blk < 0 || !tok_kept(mask, sh, t)) continue; /* weight 0: nothing added, as on the CPU */
            const bool st = t / B == k_tail;
            const u8 *kh = st ? tail.k : arena + (u64)blk * sh.block_bytes + k_off;
            const int kf = st ? HR_K_KV_F16 : sh.k_fmt;
            float dot[HR_K_ATT_G];
            for (int g = 0; g < HR_K_ATT_G; g++) dot[g] = 0.0f;
            for (int c = 0; c < D; c++) {
                const float kd = kv_elem(kh, kf, B, D, sh.k_group, t % B, c);
                for (int g = 0; g < gn; g++) dot[g] += qs[g * D + c] * kd;
            }
            u64 add = 0;
            for (int g = 0; g < gn; g++) {
                float s = dot[g] * sh.scale;
                if (sh.softcap > 0.0f) s = sh.softcap * hr_tanhf(s / sh.softcap);
                const float w = hr_expf(s - stat[g]) * stat[HR_K_ATT_G + g];
                if (w > 0.0f) add += (u64)((double)w * 4294967296.0 + 0.5);
            }
            if (add) hr_atomic_add_u64(&sc[(u64)(t / B) * per_block + (u64)(t % B)], add);
        }
        __syncthreads(); /* qs and stat are rewritten by the next group of heads */
    }
}

/* kv.cuh: the KV storage's byte layout as the attention kernels read it (attention.cu's split
 * kernels, attn_prefill.cu's tensor-core prefill): the format codes, the shape the host passes, one
 * element's decoding (kv_elem), a query's window (win_of / win_pos), a deferred format's tail (the
 * partial last block read from its f16 stage: tail_of), and the coalesced reads of eight consecutive
 * elements of a row (rows_fetch / rows_deq: 16-byte loads, 8-byte ones for q8, fp8 and the low-bit
 * codes). The layout itself is described at the top of attention.cu. */
#ifndef HR_CUDA_KV_CUH
#define HR_CUDA_KV_CUH

#include "common.cuh"
enum {
    HR_K_KV_F16 = 0,
    HR_K_KV_Q8 = 1,
    HR_K_KV_F32 = 2,
    HR_K_KV_BF16 = 3,
    HR_K_KV_FP8 = 4,
    HR_K_KV_Q4H = 5,
    /* the deferred formats (encoded when a block fills, from an f16 stage; tokens of a partial block
     * are read from the stage): q4's and kivi2's K, per channel over the block (f16 scale [D], f16
     * min [D], then the codes), and their V, per token in groups (q4's V: q4h's layout unrotated) */
    HR_K_KV_Q4K = 6,
    HR_K_KV_Q2K = 7,
    HR_K_KV_Q4V = 8,
    HR_K_KV_Q2V = 9
}; /* the host's CUDA_KV_* */

static __device__ inline constexpr bool kv_deferred(int fmt) { return fmt >= HR_K_KV_Q4K; }
/* code bits of the low-bit formats (4 or 2), 0 for the others */
static __device__ inline constexpr int kv_bits(int fmt) {
    return fmt == HR_K_KV_Q4H || fmt == HR_K_KV_Q4K || fmt == HR_K_KV_Q4V ? 4
           : fmt == HR_K_KV_Q2K || fmt == HR_K_KV_Q2V                     ? 2
                                                                          : 0;
}
static __device__ inline constexpr bool kv_per_channel(int fmt) { return fmt == HR_K_KV_Q4K || fmt == HR_K_KV_Q2K; }
/* per-token (scale, min) pairs after the codes: q4h, q4's and kivi2's V */
static __device__ inline constexpr bool kv_token_pairs(int fmt) {
    return fmt == HR_K_KV_Q4H || fmt == HR_K_KV_Q4V || fmt == HR_K_KV_Q2V;
}

typedef struct hr_k_attn_shape {
    u64 block_bytes, k_head_bytes, v_head_bytes;
    int n_layers, n_kv_heads, n_heads, head_dim, block_size;
    int k_fmt, v_fmt, k_group, v_group; /* formats and q8 group sizes */
    int max_blocks, n_splits;           /* table row stride; splits (grid.y) */
    int chunk;                          /* positions per split, a multiple of HR_K_ATT_TILE */
    float scale, softcap;
} hr_k_attn_shape;
/* the host's attn_shape (backend/cuda/kv_storage_cuda.c) asserts the same size: the struct is passed
 * by value, byte for byte */
static_assert(sizeof(hr_k_attn_shape) == 80, "hr_k_attn_shape must match attn_shape in kv_storage_cuda.c");

/* where a head region's scales start: after the [B][D] codes (fp8's aligned to 4 bytes, the low-bit
 * formats' 8 / bits a byte); the per-channel formats' scales come first (at 0, their codes at 4 D) */
static __device__ inline u64 scale_off(int fmt, int B, int D) {
    const u64 bd = (u64)B * (u64)D;
    return fmt == HR_K_KV_FP8    ? (bd + 3u) & ~(u64)3u
           : kv_per_channel(fmt) ? 0u
           : kv_bits(fmt)        ? bd * kv_bits(fmt) / 8u
                                 : bd;
}
/* where a head region's codes start */
static __device__ inline u64 code_off(int fmt, int D) { return kv_per_channel(fmt) ? 4u * (u64)D : 0u; }

/* where channel c's code of `bits` sits in a token's D * bits / 8 bytes (kv_format.c's kv_code_byte):
 * chunks of 16 bytes (W = 128 / bits channels; a narrower last chunk of w channels in w * bits / 8),
 * byte k of a chunk of w holding channels k + i * w * bits / 8 at bit i * bits */
static __device__ inline int lowbit_code_byte(int D, int bits, int c, int *shift) {
    const int per = 8 / bits, W = 16 * per, base = c - c % W, w = D - base < W ? D - base : W, nb = w / per,
              r = c - base;
    *shift = r / nb * bits;
    return base / per + r % nb;
}
/* q4h's (4 bits) */
static __device__ inline int q4_code_byte(int D, int c, int *shift) { return lowbit_code_byte(D, 4, c, shift); }

/* A kernel templated on the format takes it from the run-time code through kv_by_fmt: fn(kv_fmt_tag<F>())
 * for the format F that fmt names (q8 for a code it does not list), so each format's instance is
 * compiled once and the switch is written once. */
template <int F> struct kv_fmt_tag { static constexpr int value = F; };
template <typename Fn> static __device__ __attribute__((always_inline)) inline void kv_by_fmt(int fmt, Fn &&fn) {
    switch (fmt) {
    case HR_K_KV_F16: fn(kv_fmt_tag<HR_K_KV_F16>()); break;
    case HR_K_KV_F32: fn(kv_fmt_tag<HR_K_KV_F32>()); break;
    case HR_K_KV_BF16: fn(kv_fmt_tag<HR_K_KV_BF16>()); break;
    case HR_K_KV_FP8: fn(kv_fmt_tag<HR_K_KV_FP8>()); break;
    case HR_K_KV_Q4H: fn(kv_fmt_tag<HR_K_KV_Q4H>()); break;
    case HR_K_KV_Q4K: fn(kv_fmt_tag<HR_K_KV_Q4K>()); break;
    case HR_K_KV_Q2K: fn(kv_fmt_tag<HR_K_KV_Q2K>()); break;
    case HR_K_KV_Q4V: fn(kv_fmt_tag<HR_K_KV_Q4V>()); break;
    case HR_K_KV_Q2V: fn(kv_fmt_tag<HR_K_KV_Q2V>()); break;
    default: fn(kv_fmt_tag<HR_K_KV_Q8>()); break;
    }
}

/* element d of token slot s in a head region of format fmt */
static __device__ inline float kv_elem(const u8 *head, int fmt, int B, int D, int G, int s, int d) {
    const u64 i = (u64)s * (u64)D + (u64)d;
    switch (fmt) {
    case HR_K_KV_F16: return hr_h2f(hr_ld_u16(head + 2u * i));
    case HR_K_KV_BF16: return hr_bf2f(hr_ld_u16(head + 2u * i));
    case HR_K_KV_F32: return hr_aligned<4>((const float *)head)[i];
    case HR_K_KV_FP8: return hr_e4m3_to_f(head[i]) * hr_aligned<4>((const float *)(head + scale_off(fmt, B, D)))[s];
    case HR_K_KV_Q4H:
    case HR_K_KV_Q4K:
    case HR_K_KV_Q2K:
    case HR_K_KV_Q4V:
    case HR_K_KV_Q2V: { /* code * scale + min: the channel's (K of q4, kivi2) or the token's group's */
        const int bits = kv_bits(fmt);
        int sh;
        const int byte = lowbit_code_byte(D, bits, d, &sh);
        const int code = (head[code_off(fmt, D) + (u64)s * (u64)(D * bits / 8) + (u64)byte] >> sh) & ((1 << bits) - 1);
        if (kv_per_channel(fmt))
            return hr_h2f(hr_ld_u16(head + 2u * (u64)d)) * (float)code + hr_h2f(hr_ld_u16(head + 2u * (u64)(D + d)));
        const u8 *pair = head + scale_off(fmt, B, D) + 4u * ((u64)s * (u64)(D / G) + (u64)(d / G));
        return hr_h2f(hr_ld_u16(pair)) * (float)code + hr_h2f(hr_ld_u16(pair + 2));
    }
    default: { /* q8 */
        const u8 *scales = head + scale_off(fmt, B, D);
        const float sc = hr_h2f(hr_ld_u16(scales + 2u * ((u64)s * (u64)(D / G) + (u64)(d / G))));
        return (float)(i8)head[i] * sc;
    }
    }
}

/* A query's window (a policy's sinks and window, a model's sliding window): win[2 qi] = sinks,
 * win[2 qi + 1] = lo: positions t < sinks and t >= lo take part (lo 0, or win NULL: all of [0, n_ctx)).
 * The kernels walk a virtual index v over the visible positions only, v < sinks being t = v and the
 * rest t = v + off (off = lo - sinks), so splits and tiles cover what is seen, not the whole context. */
static __device__ inline int win_pos(int v, int sinks, int off) { return v < sinks ? v : v + off; }
static __device__ inline void win_of(const int *win, int qi, int *sinks, int *off) {
    const int s = win ? win[2 * qi] : 0, lo = win ? win[2 * qi + 1] : 0;
    *sinks = lo > s ? s : 0;
    *off = lo > s ? lo - s : 0;
}

/* Token-level views (the h2o and snapkv policies): tview[2 qi] = the mask row of query qi's sequence (-1:
 * no token mask) and tview[2 qi + 1] = 1 where its softmax weights are added to the sequence's scores
 * (hr_k_attn_score). masks: [rows][max_blocks][L][Hkv][MW] words, MW = ceil(B / 64), the manager's
 * layout for the logical blocks (kv/kv_internal.h): bit t % 64 of word t / 64 set = token j B + t kept
 * in that layer and KV head. tok_mask_of: query qi's words for (block 0, layer, kvh), NULL when every
 * position is kept; tok_kept: whether position tp is. Token-level sequences have no window. */
static __device__ inline int tok_words(const hr_k_attn_shape &sh) { return (sh.block_size + 63) / 64; }
static __device__ inline const u64 *tok_mask_of(const int *tview, const u64 *masks, const hr_k_attn_shape &sh, int qi,
                                                int layer, int kvh) {
    const int row = tview ? tview[2 * qi] : -1;
    if (row < 0 || !masks) return nullptr;
    const u64 per_block = (u64)sh.n_layers * (u64)sh.n_kv_heads * (u64)tok_words(sh);
    return masks + (u64)row * (u64)sh.max_blocks * per_block +
           ((u64)layer * (u64)sh.n_kv_heads + (u64)kvh) * (u64)tok_words(sh);
}
static __device__ inline bool tok_kept(const u64 *m, const hr_k_attn_shape &sh, int tp) {
    if (!m) return true;
    const int B = sh.block_size, j = tp / B, t = tp % B;
    const u64 per_block = (u64)sh.n_layers * (u64)sh.n_kv_heads * (u64)tok_words(sh);
    return (m[(u64)j * per_block + (u64)(t / 64)] >> (t % 64)) & 1u;
}

/* A deferred format's tail (q4, kivi2): a query whose context ends inside a block (n_ctx % B != 0)
 * reads that block's positions, as the CPU storage does, from the block's stage (tails[qi]; -1 or
 * tails NULL: none) in f16, K where K is deferred and V where V is; its full blocks are encoded. A
 * stage is [L][K | V][Hkv][B][D] f16, stage s at stages + s * L * 2 * Hkv * B * D * 2. blk: the
 * logical block read so (-1: none); k, v: the KV head's [B][D] rows there. */
struct kv_tail {
    int blk;
    const u8 *k, *v;
};
static __device__ inline kv_tail tail_of(const u8 *stages, const int *tails, int qi, int n_ctx, int layer, int kvh,
                                         const hr_k_attn_shape &sh) {
    kv_tail t = {-1, nullptr, nullptr};
    const int B = sh.block_size, st = stages && tails ? tails[qi] : -1;
    if (st < 0 || n_ctx % B == 0) return t;
    const u64 head = (u64)B * (u64)sh.head_dim * 2u, layer_bytes = 2u * (u64)sh.n_kv_heads * head;
    const u8 *base = stages + ((u64)st * (u64)sh.n_layers + (u64)layer) * layer_bytes + (u64)kvh * head;
    t.blk = (n_ctx - 1) / B;
    t.k = base;
    t.v = base + (u64)sh.n_kv_heads * head;
    return t;
}

/* ---- rows: eight consecutive elements of a K or V row per lane (attention.cu's hr_k_attn_split_rows
 * and attn_prefill.cu's tile loads) -------------------------------------------------------------- */

#define HR_K_ROWS_E 8 /* elements per lane chunk */

/* a 16- and an 8-byte load from an address so aligned (ld.global.v4.u32 / .v2.u32) */
struct hr_k_w4 {
    u32 w[4];
};
struct hr_k_w2 {
    u32 w[2];
};
static __device__ inline hr_k_w4 ld_w4(const u8 *p) {
    hr_k_w4 v;
    __builtin_memcpy(&v, hr_aligned<16>(p), 16);
    return v;
}
static __device__ inline hr_k_w2 ld_w2(const u8 *p) {
    hr_k_w2 v;
    __builtin_memcpy(&v, hr_aligned<8>(p), 8);
    return v;
}
/* IEEE half -> float by the hardware's conversion (cvt.f32.f16; exact, as hr_h2f) */
static __device__ inline float h2f_cvt(u32 h) { return (float)__builtin_bit_cast(_Float16, (u16)h); }

/* one lane's chunk of a row as loaded: the words (f32: 8, f16 and bf16: 4, q8, fp8 and the low-bit
 * codes: 2) and the row's or group's scale (q8, fp8) and min (the per-token low-bit formats) */
struct rows_raw {
    u32 w[8];
    float sc, mn;
    u32 pc[8]; /* per-channel formats: the 8 channels' f16 scales (words 0..3) and mins (4..7) */
};

/* positions a lane loads before it uses them: 64 bytes a lane */
template <int F> static __device__ inline constexpr int rows_batch() {
    return F == HR_K_KV_F32 ? 2 : (F == HR_K_KV_F16 || F == HR_K_KV_BF16) ? 4 : 8;
}

/* elements d0 .. d0 + 7 of token slot s in a head region of format F */
template <int F> static __device__ inline rows_raw rows_fetch(const u8 *head, int B, int D, int G, int s, int d0) {
    rows_raw r = {};
    const u64 i = (u64)s * (u64)D + (u64)d0;
    if (F == HR_K_KV_F32) {
        const hr_k_w4 a = ld_w4(head + 4u * i), b = ld_w4(head + 4u * i + 16u);
        for (int j = 0; j < 4; j++) r.w[j] = a.w[j], r.w[4 + j] = b.w[j];
    } else if (F == HR_K_KV_F16 || F == HR_K_KV_BF16) {
        const hr_k_w4 a = ld_w4(head + 2u * i);
        for (int j = 0; j < 4; j++) r.w[j] = a.w[j];
    } else if (kv_bits(F)) { /* 8 channels of one chunk: one code of each of 8 bytes (4 bits: D % 16 == 0,
                                2 bits: D % 32 == 0) */
        constexpr int bits = kv_bits(F);
        constexpr u32 mask = bits == 4 ? 0x0f0f0f0fu : 0x03030303u;
        int sh;
        const int byte = lowbit_code_byte(D, bits, d0, &sh);
        const hr_k_w2 a = ld_w2(head + code_off(F, D) + (u64)s * (u64)(D * bits / 8) + (u64)byte);
        r.w[0] = (a.w[0] >> sh) & mask, r.w[1] = (a.w[1] >> sh) & mask;
        if (kv_per_channel(F)) {
            const hr_k_w4 sc = ld_w4(head + 2u * (u64)d0), mn = ld_w4(head + 2u * (u64)(D + d0));
            for (int j = 0; j < 4; j++) r.pc[j] = sc.w[j], r.pc[4 + j] = mn.w[j];
        } else {
            const u8 *pair = head + scale_off(F, B, D) + 4u * ((u64)s * (u64)(D / G) + (u64)(d0 / G));
            r.sc = h2f_cvt(hr_ld_u16(pair));
            r.mn = h2f_cvt(hr_ld_u16(pair + 2));
        }
    } else {
        const hr_k_w2 a = ld_w2(head + i);
        r.w[0] = a.w[0], r.w[1] = a.w[1];
        const u8 *scales = head + scale_off(F, B, D);
        if (F == HR_K_KV_FP8) {
            r.sc = hr_aligned<4>((const float *)scales)[s];
        } else {
            u16 h;
            __builtin_memcpy(&h, hr_aligned<2>(scales + 2u * ((u64)s * (u64)(D / G) + (u64)(d0 / G))), 2);
            r.sc = h2f_cvt(h);
        }
    }
    return r;
}

/* the chunk's 8 values, x[j] * (the returned factor) each: the factor is the scale of q8 and fp8
 * (applied once per chunk by the caller), 1 otherwise (the low-bit formats' code * scale + min in x) */
template <int F> static __device__ inline float rows_deq(const rows_raw &r, float (&x)[HR_K_ROWS_E]) {
    if (kv_per_channel(F)) { /* code * the channel's scale + its min */
        for (int j = 0; j < 8; j++) {
            const int h = 16 * (j % 2);
            x[j] = (float)((r.w[j / 4] >> (8 * (j % 4))) & 0xffu) * h2f_cvt((r.pc[j / 2] >> h) & 0xffffu) +
                   h2f_cvt((r.pc[4 + j / 2] >> h) & 0xffffu);
        }
        return 1.0f;
    }
    if (kv_bits(F)) {
        for (int j = 0; j < 8; j++) x[j] = (float)((r.w[j / 4] >> (8 * (j % 4))) & 0xffu) * r.sc + r.mn;
        return 1.0f;
    }
    if (F == HR_K_KV_F32) {
        for (int j = 0; j < 8; j++) x[j] = __builtin_bit_cast(float, r.w[j]);
        return 1.0f;
    }
    if (F == HR_K_KV_F16) {
        for (int j = 0; j < 4; j++) x[2 * j] = h2f_cvt(r.w[j] & 0xffffu), x[2 * j + 1] = h2f_cvt(r.w[j] >> 16);
        return 1.0f;
    }
    if (F == HR_K_KV_BF16) {
        for (int j = 0; j < 4; j++)
            x[2 * j] = __builtin_bit_cast(float, r.w[j] << 16),
                  x[2 * j + 1] = __builtin_bit_cast(float, r.w[j] & 0xffff0000u);
        return 1.0f;
    }
    if (F == HR_K_KV_FP8) { /* hr_e4m3_to_f: the magnitude at f32 bit 20, the sign at 31, times 2^120 */
        for (int j = 0; j < 8; j++) {
            const u32 b = (r.w[j / 4] >> (8 * (j % 4))) & 0xffu;
            x[j] = __builtin_bit_cast(float, ((b & 0x7fu) << 20) | ((b & 0x80u) << 24)) * 0x1p120f;
        }
        return r.sc;
    }
    /* q8: code + 128 as the low bits of 2^23's float, less 2^23 + 128: exact, no int -> float */
    for (int j = 0; j < 8; j++) {
        const u32 u = ((r.w[j / 4] ^ 0x80808080u) >> (8 * (j % 4))) & 0xffu;
        x[j] = __builtin_bit_cast(float, 0x4b000000u | u) - 8388736.0f;
    }
    return r.sc;
}

#endif

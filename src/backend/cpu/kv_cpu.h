/* kv_cpu.h: the CPU KV storage's insides, shared by its files only (kv_storage_cpu.c: memory and
 * whole-block copies; kv_attention.c: writes and attention; kv_format.c and kv_format_avx2.c: the
 * format kernels). What the manager sees is kv/kv_storage.h.
 *
 * Memory layout (why): for every layer there is a K arena and a V arena, each an array of blocks
 * indexed by physical block id. Inside a block the data is head-major: [Hkv][B tokens][D] in the
 * block's format, followed (per head) by that head's scales. One query head's q.K over a block then
 * streams one contiguous run of B*D elements plus its scales, and the P.V accumulation streams the
 * same way; GQA query heads that share a KV head read the same run while it is hot in cache.
 * Every head region starts on a 64-byte boundary, every block too.
 *
 * Formats that quantize per channel over a whole block (Q4, KIVI2: "deferred") cannot encode a block
 * until all of its tokens are written. Such a block is given an f16 tail buffer ("stage",
 * [L][K|V][Hkv][B][D]) by the manager when it is reserved, from a fixed set mapped after the blocks.
 * Writes go to the stage; a per-(stage, layer) atomic count of written slots lets the write that
 * completes a block encode it, whichever thread and order the writes come in. Attention reads a
 * block from its stage while the block is partial for that query, and encoded once full, so a
 * query's result depends only on n_ctx and the data, not on chunking or batch. */
#ifndef HR_BACKEND_CPU_KV_CPU_H
#define HR_BACKEND_CPU_KV_CPU_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "kv/kv_assert.h"
#include "kv/kv_storage.h"

/* ---- f16 / bf16 (private copies; tensor/ owns the public ones) ---------------------------------- */

static inline uint32_t kv_f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float kv_u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float kv_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    if (em >= 0x7c00u) return kv_u2f(sign | 0x7f800000u | ((em & 0x3ffu) << 13));
    if (em >= 0x0400u) return kv_u2f(sign | ((em << 13) + 0x38000000u));
    return kv_u2f(sign | kv_f2u((float)em * 5.9604644775390625e-8f)); /* subnormal: em * 2^-24 */
}

/* Round to nearest even; overflow gives inf, NaN stays NaN. */
static inline uint16_t kv_f32_to_f16(float f) {
    uint32_t x = kv_f2u(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) return (uint16_t)(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (x < 0x38800000u) { /* below 2^-14: f16 subnormal, the FPU rounds when adding 0.5 */
        float v = kv_u2f(x) + 0.5f;
        return (uint16_t)(sign | (kv_f2u(v) - 0x3f000000u));
    }
    uint32_t odd = (x >> 13) & 1u;
    x += 0xc8000fffu + odd; /* rebias exponent (-112 << 23) and round */
    return (uint16_t)(sign | (x >> 13));
}

static inline float kv_bf16_to_f32(uint16_t h) { return kv_u2f((uint32_t)h << 16); }
static inline uint16_t kv_f32_to_bf16(float f) {
    uint32_t x = kv_f2u(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* e4m3 (OCP FP8, no infinities, max 448): placing the 7 magnitude bits at f32 bit 20 reads them as
 * an f32 with bias 127; multiplying by 2^120 rebiases to 7 and is exact for subnormals too. */
static inline float kv_e4m3_to_f32(uint8_t b) {
    float v = kv_u2f((uint32_t)(b & 0x7fu) << 20) * 0x1p120f;
    return (b & 0x80u) ? -v : v;
}
uint8_t kv_f32_to_e4m3(float x); /* round to nearest even, saturating at 448 */

/* ---- format kernels --------------------------------------------------------------------------- */

/* Kernels for one format in one role. `head` points at a head region of one block.
 *   enc_token:   encode token t (x: D floats). NULL for deferred formats.
 *   enc_block:   encode a whole staged block (stage: [B][D] f16). NULL for immediate formats.
 *   dot:         scores[t] = q . k_t for t < n. row: D floats of private scratch.
 *   accum:       acc[:] += sum_t p[t] * v_t for t < n (acc: D floats).
 *   accum_first: the same for channels c < nc only (nc a multiple of 16 below D, or D), each with
 *                accum's bits: what a latent cache's V (the first v_from_k dims of K) reads. The
 *                token-wise formats (f32, f16, bf16, q8, fp8) only; NULL elsewhere.
 *   dot_heads:   dot for G query heads of one KV head at once (2 <= G <= HR_KV_ATTN_GROUP):
 *                scores[g][t] = q[g] . k_t, each with dot's bits. NULL where a format has none.
 *   accum_heads: accum for G heads at once: acc[g][:] += sum_t p[g][t] v_t, each with accum's bits.
 *                NULL where a format has none. */
typedef struct kv_fmt_ops {
    void (*enc_token)(const kv_fmt *f, uint8_t *head, int t, const float *x);
    void (*enc_block)(const kv_fmt *f, uint8_t *head, const uint16_t *stage);
    void (*dot)(const kv_fmt *f, const uint8_t *head, int n, const float *q, float *row, float *scores);
    void (*accum)(const kv_fmt *f, const uint8_t *head, int n, const float *p, float *acc);
    void (*accum_first)(const kv_fmt *f, const uint8_t *head, int n, const float *p, int nc, float *acc);
    void (*dot_heads)(const kv_fmt *f, const uint8_t *head, int n, const float *const *q, int G, float *const *scores);
    void (*accum_heads)(const kv_fmt *f, const uint8_t *head, int n, const float *const *p, int G, float *const *acc);
} kv_fmt_ops;

/* x <- H x / sqrt(n), the normalized Walsh-Hadamard transform (orthogonal and its own inverse); n a
 * power of two. Butterflies in a fixed order, so every caller gets the same bits. */
void kv_hadamard(float *x, int n);

void kv_fmt_ops_ref(const kv_fmt *f, kv_fmt_ops *ops);
/* Overwrites entries that have an AVX2 version (the reference's bits exactly: test_kv_isa_bits).
 * Only call where the CPU has AVX2+FMA+F16C. */
void kv_fmt_ops_avx2(const kv_fmt *f, kv_fmt_ops *ops);

/* s[t] = exp(scale * s[t] - max), returns the sum; the reduction order depends only on n, and the
 * two give the same bits (the scalar one runs the AVX2 one's exp and sum order). */
float kv_softmax_ref(float *s, int n, float scale);
float kv_softmax_avx2(float *s, int n, float scale);

/* x[t] = f16(x[t] * scale) (round to nearest even), kept as f32; the same bits on both paths. */
void kv_scale_round_f16_ref(float *x, int n, float scale);
void kv_scale_round_f16_avx2(float *x, int n, float scale);

/* ---- the storage ------------------------------------------------------------------------------ */

typedef struct kv_cpu {
    hr_kv_storage base; /* first: the manager holds &base */
    int L, Hkv, D, B;   /* layers, KV heads, head_dim, block_size */
    int n_blocks, n_stage;
    kv_fmt kf, vf, sf; /* sf: F16 at the same shape, to read staged blocks */
    kv_fmt_ops kops, vops, sops;
    float (*softmax)(float *s, int n, float scale);
    void (*scale_round_f16)(float *x, int n, float scale);
    bool avx2;

    size_t k_block_bytes, v_block_bytes; /* one layer, one block */
    uint64_t block_bytes;                /* all layers, K + V */
    uint8_t *arena;                      /* [L][K blocks | V blocks], then the stages */
    size_t arena_bytes;
    uint8_t *stage;            /* [n_stage][L][K|V][Hkv][B][D] f16; NULL without deferred formats */
    size_t stage_layer_bytes;  /* one stage, one layer, K and V */
    uint64_t stage_slot_bytes; /* one stage, all layers */
    atomic_ushort *filled;     /* [n_stage][L]: slots written in the stage's block (deferred formats) */
    int v_from_k; /* a latent cache: no V arena, V is the first v_from_k dims of the K block's rows (v_block_bytes
                     0); 0: V has its arena */
} kv_cpu;

static inline uint8_t *kv_block_ptr(const kv_cpu *p, int layer, int kind, int32_t block) {
    if (p->v_from_k) kind = KV_K; /* V's reads land on K's bytes; V's copies move 0 bytes */
    size_t layer_bytes = (size_t)p->n_blocks * (p->k_block_bytes + p->v_block_bytes);
    size_t off = (size_t)layer * layer_bytes;
    if (kind == KV_V) off += (size_t)p->n_blocks * p->k_block_bytes;
    off += (size_t)block * (kind == KV_K ? p->k_block_bytes : p->v_block_bytes);
    return p->arena + off;
}

static inline uint16_t *kv_stage_ptr(const kv_cpu *p, int32_t slot, int layer, int kind) {
    size_t half = p->stage_layer_bytes / 2;
    return (uint16_t *)(p->stage + (size_t)slot * p->stage_slot_bytes + (size_t)layer * p->stage_layer_bytes +
                        (size_t)kind * half);
}

/* kv_attention.c: the storage's write and attend entries */
void kv_cpu_write(hr_kv_storage *st, int layer, int32_t block, int t, int32_t stage, const float *k, const float *v);
void kv_cpu_attend(const hr_kv_storage *st, int layer, const hr_kv_attn_query *qs, int n, const hr_kv_attn_args *a,
                   float *scratch);

#endif

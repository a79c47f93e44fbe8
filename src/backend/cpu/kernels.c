/* kernels.c: the run-time choice of kernels (hr_kernels_init) from the ISA the dispatcher picks (isa.c).
 *
 * Invariants:
 *   1. Within one table every entry for a type uses one ISA, and its vec_dot_tile computes each
 *      element exactly as its vec_dot does (the x16 types, which have no lone-row dot: as tensor.h's
 *      one sequence), so results never depend on batch shape.
 *   2. Every table computes the same bits for the same input: the scalar dots (kernels_scalar.c)
 *      reduce in the AVX2 kernels' lane order, and the AVX-512 entries keep that order too (exact
 *      integer dot products per block, then the same float sequence). Which ISA runs is a speed
 *      choice only; test_tensor_simd compares every table with the scalar one bit for bit.
 *   3. On an AVX-512 CPU the default table is the AVX2 one except for the entries measured faster
 *      on AVX-512 (see hr_kernels_init); force_isa "avx512" takes every AVX-512 entry there is. */
#include <stdio.h>
#include <string.h>

#include "backend/cpu/kernels_internal.h"
#include "backend/cpu/ops.h"

/* Scalar tiles: each element is the type's vec_dot, so they are invariant by construction. */
#define HR_DEFINE_TILE(name, dot)                                                                                      \
    static void name(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,        \
                     float *y, size_t y_stride) {                                                                      \
        for (int t = 0; t < nt; t++)                                                                                   \
            for (int r = 0; r < nr; r++)                                                                               \
                y[(size_t)t * y_stride + (size_t)r] =                                                                  \
                    dot(k, (const char *)w + (size_t)r * w_stride, (const char *)a + (size_t)t * a_stride);            \
    }

HR_DEFINE_TILE(tile_scalar_f32, hr_scalar_dot_f32)
HR_DEFINE_TILE(tile_scalar_f16, hr_scalar_dot_f16)
HR_DEFINE_TILE(tile_scalar_bf16, hr_scalar_dot_bf16)
HR_DEFINE_TILE(tile_scalar_q8_0, hr_scalar_dot_q8_0)
HR_DEFINE_TILE(tile_scalar_q4_0, hr_scalar_dot_q4_0)
HR_DEFINE_TILE(tile_scalar_q4_K, hr_scalar_dot_q4_K)
HR_DEFINE_TILE(tile_scalar_q5_K, hr_scalar_dot_q5_K)
HR_DEFINE_TILE(tile_scalar_q6_K, hr_scalar_dot_q6_K)

static void set(hr_kernels *k, hr_dtype t, const char *isa, hr_quantize_row_fn q, hr_dequantize_row_fn dq,
                hr_vec_dot_fn dot, hr_vec_dot_tile_fn tile) {
    k->type[t] =
        (hr_type_kernels){.quantize_act = q, .dequantize = dq, .vec_dot = dot, .vec_dot_tile = tile, .isa = isa};
}

/* q4_0x16, q8_0x16 and q4_Kx16 entries have a tile but no lone-row dot or row dequantizer: their rows live in groups.
 */
static void init_scalar(hr_kernels *k) {
    const char *s = "scalar";
    set(k, HR_DTYPE_F32, s, hr_ref_copy_f32, hr_ref_dequantize_f32, hr_scalar_dot_f32, tile_scalar_f32);
    set(k, HR_DTYPE_F16, s, hr_ref_quantize_f16, hr_ref_dequantize_f16, hr_scalar_dot_f16, tile_scalar_f16);
    set(k, HR_DTYPE_BF16, s, hr_ref_copy_f32, hr_ref_dequantize_bf16, hr_scalar_dot_bf16, tile_scalar_bf16);
    set(k, HR_DTYPE_Q8_0, s, hr_ref_quantize_q8_0, hr_ref_dequantize_q8_0, hr_scalar_dot_q8_0, tile_scalar_q8_0);
    set(k, HR_DTYPE_Q4_0, s, hr_ref_quantize_q8_0, hr_ref_dequantize_q4_0, hr_scalar_dot_q4_0, tile_scalar_q4_0);
    set(k, HR_DTYPE_Q5_0, s, hr_ref_quantize_q8_0, hr_ref_dequantize_q5_0, hr_scalar_dot_q5_0, hr_scalar_tile_q5_0);
    set(k, HR_DTYPE_Q5_1, s, hr_ref_quantize_q8_0, hr_ref_dequantize_q5_1, hr_scalar_dot_q5_1, hr_scalar_tile_q5_1);
    set(k, HR_DTYPE_Q4_K, s, hr_ref_quantize_q8_K, hr_ref_dequantize_q4_K, hr_scalar_dot_q4_K, tile_scalar_q4_K);
    set(k, HR_DTYPE_Q5_K, s, hr_ref_quantize_q8_K, hr_ref_dequantize_q5_K, hr_scalar_dot_q5_K, tile_scalar_q5_K);
    set(k, HR_DTYPE_Q6_K, s, hr_ref_quantize_q8_K, hr_ref_dequantize_q6_K, hr_scalar_dot_q6_K, tile_scalar_q6_K);
    set(k, HR_DTYPE_MXFP4, s, hr_ref_quantize_q8_0, hr_ref_dequantize_mxfp4, hr_scalar_dot_mxfp4, hr_scalar_tile_mxfp4);
    set(k, HR_DTYPE_Q4_0X16, s, hr_ref_quantize_q8_0s, NULL, NULL, hr_scalar_tile_q4_0x16);
    set(k, HR_DTYPE_Q8_0X16, s, hr_ref_quantize_q8_0s, NULL, NULL, hr_scalar_tile_q8_0x16);
    set(k, HR_DTYPE_Q4_KX16, s, hr_ref_quantize_q8_Ks, NULL, NULL, hr_scalar_tile_q4_Kx16);
    set(k, HR_DTYPE_Q5_KX16, s, hr_ref_quantize_q8_Ks, NULL, NULL, hr_scalar_tile_q5_Kx16);
    set(k, HR_DTYPE_Q6_KX16, s, hr_ref_quantize_q8_K, NULL, NULL, hr_scalar_tile_q6_Kx16);
    set(k, HR_DTYPE_Q5_0X16, s, hr_ref_quantize_q8_0s, NULL, NULL, hr_scalar_tile_q5_0x16);
}

static void init_avx2(hr_kernels *k) {
    const char *s = "avx2";
    set(k, HR_DTYPE_F32, s, hr_ref_copy_f32, hr_ref_dequantize_f32, hr_avx2_dot_f32, hr_avx2_tile_f32);
    set(k, HR_DTYPE_F16, s, hr_avx2_quantize_f16, hr_ref_dequantize_f16, hr_avx2_dot_f16, hr_avx2_tile_f16);
    set(k, HR_DTYPE_BF16, s, hr_ref_copy_f32, hr_ref_dequantize_bf16, hr_avx2_dot_bf16, hr_avx2_tile_bf16);
    set(k, HR_DTYPE_Q8_0, s, hr_avx2_quantize_q8_0, hr_ref_dequantize_q8_0, hr_avx2_dot_q8_0, hr_avx2_tile_q8_0);
    set(k, HR_DTYPE_Q4_0, s, hr_avx2_quantize_q8_0, hr_ref_dequantize_q4_0, hr_avx2_dot_q4_0, hr_avx2_tile_q4_0);
    set(k, HR_DTYPE_Q5_0, s, hr_avx2_quantize_q8_0, hr_ref_dequantize_q5_0, hr_avx2_dot_q5_0, hr_avx2_tile_q5_0);
    set(k, HR_DTYPE_Q5_1, s, hr_avx2_quantize_q8_0, hr_ref_dequantize_q5_1, hr_avx2_dot_q5_1, hr_avx2_tile_q5_1);
    set(k, HR_DTYPE_Q4_K, s, hr_avx2_quantize_q8_K, hr_ref_dequantize_q4_K, hr_avx2_dot_q4_K, hr_avx2_tile_q4_K);
    set(k, HR_DTYPE_Q5_K, s, hr_avx2_quantize_q8_K, hr_ref_dequantize_q5_K, hr_avx2_dot_q5_K, hr_avx2_tile_q5_K);
    set(k, HR_DTYPE_Q6_K, s, hr_avx2_quantize_q8_K, hr_ref_dequantize_q6_K, hr_avx2_dot_q6_K, hr_avx2_tile_q6_K);
    set(k, HR_DTYPE_MXFP4, s, hr_avx2_quantize_q8_0, hr_ref_dequantize_mxfp4, hr_avx2_dot_mxfp4, hr_avx2_tile_mxfp4);
    set(k, HR_DTYPE_Q4_0X16, s, hr_avx2_quantize_q8_0s, NULL, NULL, hr_avx2_tile_q4_0x16);
    set(k, HR_DTYPE_Q8_0X16, s, hr_avx2_quantize_q8_0s, NULL, NULL, hr_avx2_tile_q8_0x16);
    set(k, HR_DTYPE_Q4_KX16, s, hr_avx2_quantize_q8_Ks, NULL, NULL, hr_avx2_tile_q4_Kx16);
    set(k, HR_DTYPE_Q5_KX16, s, hr_avx2_quantize_q8_Ks, NULL, NULL, hr_avx2_tile_q5_Kx16);
    set(k, HR_DTYPE_Q6_KX16, s, hr_avx2_quantize_q8_K, NULL, NULL, hr_avx2_tile_q6_Kx16);
    set(k, HR_DTYPE_Q5_0X16, s, hr_avx2_quantize_q8_0s, NULL, NULL, hr_avx2_tile_q5_0x16);
}

/* The AVX-512 entries over the AVX2 table: every one there is (all, for force_isa "avx512"), or only
 * those measured faster than AVX2 (the default). The former AVX-512 dots reduced in 16 lanes (other
 * bits than AVX2 and scalar) and ran per dot without register blocking (q4_0 prompt 32 tok/s
 * against AVX2's 71-91); the entries here are the AVX2 programs with VNNI integer dots. */
static void add_avx512(hr_kernels *k, hr_cpu_features f, bool all) {
    const char *s = "avx512";
    if (!f.avx512vnni) return;
    /* q8_0 and q4_0 (VNNI integer dots): measured faster than AVX2 on a 2-core AMD EPYC (Zen 4),
     * TinyLlama-1.1B shape, 2 threads, medians of 3 alternating rounds (docs/BENCHMARKS.md, "AVX2
     * vs AVX-512"): q4_0 prompt 1.11x, 1-stream generation 1.12x, 16-stream decode 1.10x; q8_0
     * 1.24x, 1.04x, 1.30x. Dispatched by default. */
    set(k, HR_DTYPE_Q8_0, s, hr_avx2_quantize_q8_0, hr_ref_dequantize_q8_0, hr_avx512_dot_q8_0, hr_avx512_tile_q8_0);
    set(k, HR_DTYPE_Q4_0, s, hr_avx2_quantize_q8_0, hr_ref_dequantize_q4_0, hr_avx512_dot_q4_0, hr_avx512_tile_q4_0);
    /* The x16 layouts (512-bit VNNI, 16 rows per register): measured faster than their AVX2 builds on
     * the same machine (docs/BENCHMARKS.md, "Interleaved weights"). bench_tile, 1 thread, 64 rows x
     * 64 tokens, k 2048, GF/s avx512 vs avx2: q4_0x16 594 vs 205, q8_0x16 580 vs 117, q4_Kx16 505-550
     * vs 148-184. bench_kernels, 2 threads, 32768 x 2048, T = 1, GB/s, medians of 5 alternating runs:
     * q4_0x16 76.6 vs 64.2, q8_0x16 65.1 vs 61.0, q4_Kx16 76.3 vs 51.0. Dispatched by default. */
    set(k, HR_DTYPE_Q4_0X16, s, hr_avx2_quantize_q8_0s, NULL, NULL, hr_avx512_tile_q4_0x16);
    set(k, HR_DTYPE_Q8_0X16, s, hr_avx2_quantize_q8_0s, NULL, NULL, hr_avx512_tile_q8_0x16);
    set(k, HR_DTYPE_Q4_KX16, s, hr_avx2_quantize_q8_Ks, NULL, NULL, hr_avx512_tile_q4_Kx16);
    /* q5_Kx16 and q6_Kx16: bench_tile, 1 thread, k 2048, in cache, GF/s avx512 vs avx2 (December 5,
     * a shared and loaded machine, medians of 15): 64 rows x 64 tokens q5_Kx16 241 vs 123, q6_Kx16
     * 166 vs 101; 64 rows x 1 token 117 vs 62 and 84 vs 73. One token from DRAM is bound by the
     * memory either way. Dispatched by default. */
    set(k, HR_DTYPE_Q5_KX16, s, hr_avx2_quantize_q8_Ks, NULL, NULL, hr_avx512_tile_q5_Kx16);
    set(k, HR_DTYPE_Q6_KX16, s, hr_avx2_quantize_q8_K, NULL, NULL, hr_avx512_tile_q6_Kx16);
    /* q5_0x16 (q4_0x16's program with the fifth bits from a mask register): bench_tile, 1 thread, 64 rows
     * x 16 tokens, k 1536, a loaded machine, GF/s avx512 vs avx2: 134 vs 54. Dispatched by default. */
    set(k, HR_DTYPE_Q5_0X16, s, hr_avx2_quantize_q8_0s, NULL, NULL, hr_avx512_tile_q5_0x16);
    /* MXFP4 (VNNI dots, 256-bit): `headroom run` on gpt-oss-small with MXFP4 experts (synth --type mxfp4),
     * 1 thread, --isa avx512 against avx2 (only this entry differs), 7 alternating rounds on the 2-core
     * EPYC under load 8-9 (December 6): medians prompt 640 vs 539 tok/s (avx512 ahead in 6 of 7 rounds),
     * generation 353 vs 341 (5 of 7). Dispatched by default. */
    set(k, HR_DTYPE_MXFP4, s, hr_avx2_quantize_q8_0, hr_ref_dequantize_mxfp4, hr_avx512_dot_mxfp4,
        hr_avx512_tile_mxfp4);
    /* An entry not (yet) measured faster goes here, set only when `all`. f32/f16/bf16 and the plain
     * K-quant rows have no AVX-512 build. */
    if (all) {
        /* q5_0 / q5_1 (VNNI dots, mask-register fifth bits): not measured against AVX2 yet */
        set(k, HR_DTYPE_Q5_0, s, hr_avx2_quantize_q8_0, hr_ref_dequantize_q5_0, hr_avx512_dot_q5_0,
            hr_avx512_tile_q5_0);
        set(k, HR_DTYPE_Q5_1, s, hr_avx2_quantize_q8_0, hr_ref_dequantize_q5_1, hr_avx512_dot_q5_1,
            hr_avx512_tile_q5_1);
    }
}

bool hr_kernels_isa_available(hr_cpu_features f, const char *isa) { return hr_cpu_isa_available(f, isa); }

void hr_kernels_init(hr_kernels *k, hr_cpu_features f, const char *force_isa) {
    memset(k, 0, sizeof *k);
    k->features = f;
    /* the one dispatcher's choice (isa.h), clamped to what f has */
    const hr_cpu_isa want = hr_cpu_isa_choose(f, force_isa);
    const bool all512 = force_isa && !strcmp(force_isa, "avx512");
    if (want >= HR_CPU_ISA_AVX2) {
        init_avx2(k);
        k->swiglu = hr_avx2_swiglu;
        if (want >= HR_CPU_ISA_AVX512) add_avx512(k, f, all512);
    } else {
        init_scalar(k);
        k->swiglu = hr_op_swiglu;
    }
    /* the table's name: its highest ISA (hr_kernels_describe gives the per-type picture) */
    k->isa = "scalar";
    for (size_t t = 0; t < sizeof k->type / sizeof k->type[0]; t++) {
        const char *isa = k->type[t].isa;
        if (!isa || !strcmp(k->isa, "avx512")) continue;
        if (!strcmp(isa, "avx512") || (!strcmp(isa, "avx2") && !strcmp(k->isa, "scalar"))) k->isa = isa;
    }
}

int hr_kernels_describe(const hr_kernels *k, char *buf, size_t n) {
    static const hr_dtype order[] = {
        HR_DTYPE_F32,     HR_DTYPE_F16,     HR_DTYPE_BF16,    HR_DTYPE_Q8_0,    HR_DTYPE_Q8_0X16, HR_DTYPE_Q4_0,
        HR_DTYPE_Q4_0X16, HR_DTYPE_Q5_0,    HR_DTYPE_Q5_0X16, HR_DTYPE_Q5_1,    HR_DTYPE_Q4_K,    HR_DTYPE_Q4_KX16,
        HR_DTYPE_Q5_K,    HR_DTYPE_Q5_KX16, HR_DTYPE_Q6_K,    HR_DTYPE_Q6_KX16, HR_DTYPE_MXFP4};
    int len = 0;
    if (n) buf[0] = '\0';
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        const hr_type_kernels *tk = &k->type[order[i]];
        if (!tk->isa) continue;
        const size_t off = (size_t)len < n ? (size_t)len : n;
        const int w =
            snprintf(buf + off, n - off, "%s%s %s", len ? ", " : "", hr_dtype_get_info(order[i])->name, tk->isa);
        if (w < 0) return w;
        len += w;
    }
    return len;
}

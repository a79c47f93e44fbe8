/* kernels.c: CPU feature detection and the run-time choice of kernels (hr_kernels_init).
 *
 * Invariant: within one hr_kernels table every entry for a type uses one ISA, and its vec_dot_tile
 * computes each element exactly as its vec_dot does, so results never depend on batch shape. */
#include <string.h>

#include "tensor/kernels_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static uint64_t read_xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

hr_cpu_features hr_cpu_detect(void) {
    hr_cpu_features f = {0};
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    const bool osxsave = (c >> 27) & 1;
    if (!osxsave) return f;
    const uint64_t xcr0 = read_xcr0();
    const bool os_avx = (xcr0 & 0x6) == 0x6;                /* XMM and YMM state */
    const bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0; /* opmask, ZMM_Hi256, Hi16_ZMM */
    const bool avx = (c >> 28) & 1;
    f.fma = os_avx && ((c >> 12) & 1);
    f.f16c = os_avx && ((c >> 29) & 1);
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        f.avx2 = os_avx && avx && ((b >> 5) & 1);
        f.avx512f = os_avx512 && ((b >> 16) & 1);
        f.avx512bw = os_avx512 && ((b >> 30) & 1);
        f.avx512vl = os_avx512 && ((b >> 31) & 1);
        f.avx512vnni = os_avx512 && ((c >> 11) & 1);
    }
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avxvnni = os_avx && ((a >> 4) & 1);
    return f;
}
#else
hr_cpu_features hr_cpu_detect(void) {
    hr_cpu_features f = {0};
    return f;
}
#endif

/* Scalar tiles: each element is the type's vec_dot, so they are invariant by construction. */
#define HR_DEFINE_TILE(name, dot)                                                                                      \
    static void name(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,        \
                     float *y, size_t y_stride) {                                                                      \
        for (int t = 0; t < nt; t++)                                                                                   \
            for (int r = 0; r < nr; r++)                                                                               \
                y[(size_t)t * y_stride + (size_t)r] =                                                                  \
                    dot(k, (const char *)w + (size_t)r * w_stride, (const char *)a + (size_t)t * a_stride);            \
    }

HR_DEFINE_TILE(tile_ref_f32, hr_ref_dot_f32)
HR_DEFINE_TILE(tile_ref_f16, hr_ref_dot_f16)
HR_DEFINE_TILE(tile_ref_bf16, hr_ref_dot_bf16)
HR_DEFINE_TILE(tile_ref_q8_0, hr_ref_dot_q8_0)
HR_DEFINE_TILE(tile_ref_q4_0, hr_ref_dot_q4_0)
HR_DEFINE_TILE(tile_ref_q4_K, hr_ref_dot_q4_K)
HR_DEFINE_TILE(tile_ref_q5_K, hr_ref_dot_q5_K)
HR_DEFINE_TILE(tile_ref_q6_K, hr_ref_dot_q6_K)
HR_DEFINE_TILE(tile_avx512_f32, hr_avx512_dot_f32)
HR_DEFINE_TILE(tile_avx512_f16, hr_avx512_dot_f16)
HR_DEFINE_TILE(tile_avx512_bf16, hr_avx512_dot_bf16)
HR_DEFINE_TILE(tile_avx512_q8_0, hr_avx512_dot_q8_0)
HR_DEFINE_TILE(tile_avx512_q4_0, hr_avx512_dot_q4_0)

static void set(hr_kernels *k, hr_dtype t, hr_quantize_row_fn q, hr_dequantize_row_fn dq, hr_vec_dot_fn dot,
                hr_vec_dot_tile_fn tile) {
    k->type[t] = (hr_type_kernels){.quantize_act = q, .dequantize = dq, .vec_dot = dot, .vec_dot_tile = tile};
}

static void init_scalar(hr_kernels *k) {
    set(k, HR_DTYPE_F32, hr_ref_copy_f32, hr_ref_dequantize_f32, hr_ref_dot_f32, tile_ref_f32);
    set(k, HR_DTYPE_F16, hr_ref_quantize_f16, hr_ref_dequantize_f16, hr_ref_dot_f16, tile_ref_f16);
    set(k, HR_DTYPE_BF16, hr_ref_copy_f32, hr_ref_dequantize_bf16, hr_ref_dot_bf16, tile_ref_bf16);
    set(k, HR_DTYPE_Q8_0, hr_ref_quantize_q8_0, hr_ref_dequantize_q8_0, hr_ref_dot_q8_0, tile_ref_q8_0);
    set(k, HR_DTYPE_Q4_0, hr_ref_quantize_q8_0, hr_ref_dequantize_q4_0, hr_ref_dot_q4_0, tile_ref_q4_0);
    set(k, HR_DTYPE_Q4_K, hr_ref_quantize_q8_K, hr_ref_dequantize_q4_K, hr_ref_dot_q4_K, tile_ref_q4_K);
    set(k, HR_DTYPE_Q5_K, hr_ref_quantize_q8_K, hr_ref_dequantize_q5_K, hr_ref_dot_q5_K, tile_ref_q5_K);
    set(k, HR_DTYPE_Q6_K, hr_ref_quantize_q8_K, hr_ref_dequantize_q6_K, hr_ref_dot_q6_K, tile_ref_q6_K);
}

/* The K-quants' AVX2 dots serve the AVX-512 table too (they are exact integer sums per super-block). */
static void init_k_avx2(hr_kernels *k) {
    set(k, HR_DTYPE_Q4_K, hr_ref_quantize_q8_K, hr_ref_dequantize_q4_K, hr_avx2_dot_q4_K, hr_avx2_tile_q4_K);
    set(k, HR_DTYPE_Q5_K, hr_ref_quantize_q8_K, hr_ref_dequantize_q5_K, hr_avx2_dot_q5_K, hr_avx2_tile_q5_K);
    set(k, HR_DTYPE_Q6_K, hr_ref_quantize_q8_K, hr_ref_dequantize_q6_K, hr_avx2_dot_q6_K, hr_avx2_tile_q6_K);
}

static void init_avx2(hr_kernels *k) {
    set(k, HR_DTYPE_F32, hr_ref_copy_f32, hr_ref_dequantize_f32, hr_avx2_dot_f32, hr_avx2_tile_f32);
    set(k, HR_DTYPE_F16, hr_avx2_quantize_f16, hr_ref_dequantize_f16, hr_avx2_dot_f16, hr_avx2_tile_f16);
    set(k, HR_DTYPE_BF16, hr_ref_copy_f32, hr_ref_dequantize_bf16, hr_avx2_dot_bf16, hr_avx2_tile_bf16);
    set(k, HR_DTYPE_Q8_0, hr_avx2_quantize_q8_0, hr_ref_dequantize_q8_0, hr_avx2_dot_q8_0, hr_avx2_tile_q8_0);
    set(k, HR_DTYPE_Q4_0, hr_avx2_quantize_q8_0, hr_ref_dequantize_q4_0, hr_avx2_dot_q4_0, hr_avx2_tile_q4_0);
    init_k_avx2(k);
}

static void init_avx512(hr_kernels *k) {
    set(k, HR_DTYPE_F32, hr_ref_copy_f32, hr_ref_dequantize_f32, hr_avx512_dot_f32, tile_avx512_f32);
    set(k, HR_DTYPE_F16, hr_avx2_quantize_f16, hr_ref_dequantize_f16, hr_avx512_dot_f16, tile_avx512_f16);
    set(k, HR_DTYPE_BF16, hr_ref_copy_f32, hr_ref_dequantize_bf16, hr_avx512_dot_bf16, tile_avx512_bf16);
    set(k, HR_DTYPE_Q8_0, hr_avx2_quantize_q8_0, hr_ref_dequantize_q8_0, hr_avx512_dot_q8_0, tile_avx512_q8_0);
    set(k, HR_DTYPE_Q4_0, hr_avx2_quantize_q8_0, hr_ref_dequantize_q4_0, hr_avx512_dot_q4_0, tile_avx512_q4_0);
    init_k_avx2(k);
}

void hr_kernels_init(hr_kernels *k, hr_cpu_features f, const char *force_isa) {
    memset(k, 0, sizeof *k);
    k->features = f;
    const bool has_avx2 = f.avx2 && f.fma && f.f16c;
    const bool has_avx512 = has_avx2 && f.avx512f && f.avx512bw && f.avx512vl;
    int want = 2; /* 0 scalar, 1 avx2, 2 avx512: best available unless forced lower */
    if (force_isa && !strcmp(force_isa, "scalar"))
        want = 0;
    else if (force_isa && !strcmp(force_isa, "avx2"))
        want = 1;
    if (want >= 2 && has_avx512) {
        k->isa = "avx512";
        init_avx512(k);
    } else if (want >= 1 && has_avx2) {
        k->isa = "avx2";
        init_avx2(k);
    } else {
        k->isa = "scalar";
        init_scalar(k);
    }
}

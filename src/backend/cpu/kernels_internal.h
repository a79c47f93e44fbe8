/* kernels_internal.h: the per-type, per-ISA kernel functions that hr_kernels_init puts in the table.
 * Private to src/backend/cpu (tests reach them only through hr_kernels); the reference routines the
 * tables also hold come from tensor/tensor_ref.h. */
#ifndef HR_BACKEND_CPU_KERNELS_INTERNAL_H
#define HR_BACKEND_CPU_KERNELS_INTERNAL_H

#include <math.h>

#include "backend/cpu/kernels.h"
#include "tensor/tensor_ref.h"

/* The scalar table's dots (kernels_scalar.c): portable C in the SIMD kernels' reduction order. */
float hr_scalar_dot_f32(int64_t k, const void *w, const void *a);
float hr_scalar_dot_f16(int64_t k, const void *w, const void *a);
float hr_scalar_dot_bf16(int64_t k, const void *w, const void *a);
float hr_scalar_dot_q8_0(int64_t k, const void *w, const void *a);
float hr_scalar_dot_q4_0(int64_t k, const void *w, const void *a);
float hr_scalar_dot_q4_K(int64_t k, const void *w, const void *a);
float hr_scalar_dot_q5_K(int64_t k, const void *w, const void *a);
float hr_scalar_dot_q6_K(int64_t k, const void *w, const void *a);

/* MXFP4 against q8_0 (kernels_mxfp4.c, kernels_mxfp4_avx2.c, kernels_mxfp4_avx512.c): the same bits in all. */
float hr_scalar_dot_mxfp4(int64_t k, const void *w, const void *a);
void hr_scalar_tile_mxfp4(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                          float *y, size_t y_stride);
float hr_avx2_dot_mxfp4(int64_t k, const void *w, const void *a);
void hr_avx2_tile_mxfp4(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                        float *y, size_t y_stride);
float hr_avx512_dot_mxfp4(int64_t k, const void *w, const void *a);
void hr_avx512_tile_mxfp4(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                          float *y, size_t y_stride);

/* q5_0 and q5_1 against q8_0 (kernels_q5.c, kernels_q5_avx2.c, kernels_q5_avx512.c): the same bits in all. */
#define HR_Q5_TILE_DECL(isa, t)                                                                                        \
    float hr_##isa##_dot_##t(int64_t k, const void *w, const void *a);                                                 \
    void hr_##isa##_tile_##t(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride,        \
                             int nt, float *y, size_t y_stride);
HR_Q5_TILE_DECL(scalar, q5_0)
HR_Q5_TILE_DECL(scalar, q5_1)
HR_Q5_TILE_DECL(avx2, q5_0)
HR_Q5_TILE_DECL(avx2, q5_1)
HR_Q5_TILE_DECL(avx512, q5_0)
HR_Q5_TILE_DECL(avx512, q5_1)

/* AVX2 kernels (kernels_avx2.c, kernels_q4_avx2.c, kernels_float_avx2.c, kernels_k_avx2.c); only called when the
 * CPU has AVX2+FMA+F16C. */
void hr_avx2_quantize_q8_0(const float *x, void *dst, int64_t k);
void hr_avx2_quantize_f16(const float *x, void *dst, int64_t k); /* F16C, round-to-nearest-even */
void hr_avx2_swiglu(float *gate, const float *up, int n);        /* hr_op_swiglu's bits (ops.h) */
float hr_avx2_dot_f32(int64_t k, const void *w, const void *a);
float hr_avx2_dot_f16(int64_t k, const void *w, const void *a);
float hr_avx2_dot_bf16(int64_t k, const void *w, const void *a);
void hr_avx2_tile_f32(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                      float *y, size_t y_stride);
void hr_avx2_tile_f16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                      float *y, size_t y_stride);
void hr_avx2_tile_bf16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                       float *y, size_t y_stride);
float hr_avx2_dot_q8_0(int64_t k, const void *w, const void *a);
float hr_avx2_dot_q4_0(int64_t k, const void *w, const void *a);
void hr_avx2_tile_q8_0(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                       float *y, size_t y_stride);
void hr_avx2_tile_q4_0(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                       float *y, size_t y_stride);
void hr_avx2_quantize_q8_K(const float *x, void *dst, int64_t k); /* the reference's bytes */
float hr_avx2_dot_q4_K(int64_t k, const void *w, const void *a);
float hr_avx2_dot_q5_K(int64_t k, const void *w, const void *a);
float hr_avx2_dot_q6_K(int64_t k, const void *w, const void *a);
void hr_avx2_tile_q4_K(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                       float *y, size_t y_stride);
void hr_avx2_tile_q5_K(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                       float *y, size_t y_stride);
void hr_avx2_tile_q6_K(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                       float *y, size_t y_stride);

/* AVX-512 VNNI builds of the q8_0 and q4_0 kernels (kernels_q8_avx512.c, kernels_q4_avx512.c); only
 * called when the CPU has AVX512F/BW/VL and AVX512_VNNI. Same bits as their AVX2 builds. */
float hr_avx512_dot_q8_0(int64_t k, const void *w, const void *a);
float hr_avx512_dot_q4_0(int64_t k, const void *w, const void *a);
void hr_avx512_tile_q8_0(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                         float *y, size_t y_stride);
void hr_avx512_tile_q4_0(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                         float *y, size_t y_stride);

/* q4_0x16, q8_0x16 and q4_Kx16 (kernels_x16_scalar.c, kernels_x16_avx2.c, kernels_x16_avx512.c): the tile of
 * each table and the q8_0s / q8_Ks activation quantizers; every one gives the scalar tile's bits. */
void hr_avx2_quantize_q8_0s(const float *x, void *dst, int64_t k);
void hr_scalar_tile_q4_0x16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                            float *y, size_t y_stride);
void hr_avx2_tile_q4_0x16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                          float *y, size_t y_stride);
void hr_avx512_tile_q4_0x16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                            float *y, size_t y_stride);
void hr_avx2_quantize_q8_Ks(const float *x, void *dst, int64_t k);
void hr_scalar_tile_q4_Kx16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                            float *y, size_t y_stride);
void hr_avx2_tile_q4_Kx16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                          float *y, size_t y_stride);
void hr_avx512_tile_q4_Kx16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                            float *y, size_t y_stride);
void hr_scalar_tile_q5_Kx16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                            float *y, size_t y_stride);
void hr_avx2_tile_q5_Kx16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                          float *y, size_t y_stride);
void hr_avx512_tile_q5_Kx16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                            float *y, size_t y_stride);
void hr_scalar_tile_q6_Kx16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                            float *y, size_t y_stride);
void hr_avx2_tile_q6_Kx16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                          float *y, size_t y_stride);
void hr_avx512_tile_q6_Kx16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                            float *y, size_t y_stride);
void hr_scalar_tile_q5_0x16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                            float *y, size_t y_stride);
void hr_avx2_tile_q5_0x16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                          float *y, size_t y_stride);
void hr_avx512_tile_q5_0x16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                            float *y, size_t y_stride);
void hr_scalar_tile_q8_0x16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                            float *y, size_t y_stride);
void hr_avx2_tile_q8_0x16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                          float *y, size_t y_stride);
void hr_avx512_tile_q8_0x16(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride, int nt,
                            float *y, size_t y_stride);

/* ---- how the AVX2 batch tiles (q8_0, q4_0, K-quants) split a call of nr rows x nt >= 2 tokens ----
 * Tokens: groups of HR_TILE_TC, then the rest in narrower tiles of 4, 3 and 2 tokens, so that no
 * token runs alone (hr_tile_rest_widths). Rows: chunks of at most max_rows rows and chunk_bytes of
 * weights (at least one row), of even size (hr_tile_chunk_rows). */
#define HR_TILE_TC 8 /* tokens of the widest batch tile */

/* The groups of HR_TILE_TC tokens of nt; *rest: the tokens after them (0..HR_TILE_TC + 1: a lone
 * last token joins the last group's tokens instead). */
static inline int hr_tile_groups(int nt, int *rest) {
    int ng = nt / HR_TILE_TC;
    *rest = nt % HR_TILE_TC;
    if (*rest == 1 && ng > 0) ng--, *rest += HR_TILE_TC;
    return ng;
}

/* The widths the rest splits into, 0-terminated (rest 0..9). */
static inline const signed char *hr_tile_rest_widths(int rest) {
    static const signed char widths[HR_TILE_TC + 2][4] = {{0},    {0},    {2},    {3}, {4},
                                                          {3, 2}, {4, 2}, {4, 3}, {0}, {4, 3, 2}};
    return widths[rest];
}

static inline int hr_tile_chunk_rows(int nr, size_t row_bytes, int max_rows, size_t chunk_bytes) {
    const size_t fit = chunk_bytes / row_bytes;
    const int rows = fit < 1 ? 1 : fit < (size_t)max_rows ? (int)fit : max_rows;
    const int nchunks = (nr + rows - 1) / rows;
    return (nr + nchunks - 1) / nchunks;
}

/* k = 0: every dot is hsum8 of zeros. */
static inline void hr_tile_zero(int nr, int nt, float *y, size_t ys) {
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < nr; r++) y[(size_t)t * ys + r] = 0.0f;
}

#endif

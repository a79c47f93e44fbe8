/* kernels.h: the CPU backend's kernel tables: per weight type, the activation quantizer, the row
 * dequantizer and the dot products (lone rows and tiles), for one ISA chosen at run time by the one
 * dispatcher (isa.h). The reference each entry is tested against is tensor.h's.
 *
 * A table of kernels for one CPU, chosen once from its features. Held by whoever needs it (the CPU
 * backend keeps one); no global dispatch pointer. Every SIMD entry is tested against the _ref one. */
#ifndef HR_BACKEND_CPU_KERNELS_H
#define HR_BACKEND_CPU_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/isa.h"
#include "tensor/tensor.h"

typedef void (*hr_quantize_row_fn)(const float *x, void *dst, int64_t k);
typedef void (*hr_dequantize_row_fn)(const void *src, float *y, int64_t k);
typedef float (*hr_vec_dot_fn)(int64_t k, const void *w_row, const void *act_row);

/* A tile of dot products: y[t * y_stride + r] = vec_dot(k, w + r * w_stride, a + t * a_stride) for
 * r < nr, t < nt (strides in bytes for w and a, in floats for y). Every result is bit-identical to
 * the vec_dot entry of the same table: same lanes, same block order, same horizontal sum. This is
 * what lets a batch of tokens give exactly the tokens each would give alone. */
/* For q4_0x16, q5_0x16 and q8_0x16 (row_group 16) there is no lone-row vec_dot: w is the first of nr / 16
 * whole groups (nr a multiple of 16, w_stride the plain row's bytes), and each element is the one
 * sequence
 *     acc = 0; for each block b in order: acc = fmaf(d_w[b] * d_a[b], (float)isum[b], acc)
 * with isum[b] the exact integer dot of the block's values (q4_0: nibble - 8; q5_0: 5-bit value - 16), in
 * every table.
 * q4_Kx16 (super-blocks of 8 sub-blocks s of 32) runs per super-block, in this order,
 *     acc = fmaf(d_w * d_a, (float)sum_s(sc[s] * qdot[s]), acc)
 *     acc = fmaf(-(dmin_w * d_a), (float)sum_s(m[s] * ys[s]), acc)
 * with qdot[s] the exact dot of the sub-block's nibbles (0..15) and values, sc and m its 6-bit
 * scale and min, ys[s] the sum of its 32 values, both sums exact (int32). q5_Kx16 is the same
 * sequence with its 5-bit values (0..31) in qdot. q6_Kx16 (against plain q8_K activations) runs per super-block
 *     acc = fmaf(d_w * d_a, (float)isum, acc)
 * with isum = sum over its 16 sub-blocks g of 16 of scale[g] * (sum of (q - 32) y), exact (int32). */
typedef void (*hr_vec_dot_tile_fn)(int64_t k, const void *w, size_t w_stride, int nr, const void *a, size_t a_stride,
                                   int nt, float *y, size_t y_stride);

typedef struct hr_type_kernels {
    hr_quantize_row_fn quantize_act; /* f32 -> vec_dot_type, for activations */
    hr_dequantize_row_fn dequantize; /* this type -> f32 */
    hr_vec_dot_fn vec_dot;           /* weight row (this type) . activation row (vec_dot_type) */
    hr_vec_dot_tile_fn vec_dot_tile; /* never NULL where vec_dot is set; see above */
    const char *isa;                 /* "scalar", "avx2" or "avx512": the code these entries run */
} hr_type_kernels;

typedef struct hr_kernels {
    hr_cpu_features features;
    const char *isa;                      /* the highest ISA of any entry: "scalar", "avx2", "avx512" */
    hr_type_kernels type[HR_DTYPE_TABLE]; /* indexed by hr_dtype; NULL entries for unsupported ids */
    /* gate[i] = silu(gate[i]) * up[i], i < n: ops.h's hr_op_swiglu, or its AVX2 lanes (the same bits) */
    void (*swiglu)(float *gate, const float *up, int n);
} hr_kernels;

/* Fills k for the given features. `force_isa` may be NULL (the fastest measured: on an AVX-512 CPU
 * the AVX2 kernels except the entries measured faster with AVX-512), "scalar", "avx2" or "avx512"
 * (every AVX-512 entry there is, AVX2 for the rest); clamped to what the CPU has.
 *
 * Every table gives the same bits for the same input (scalar, AVX2 and AVX-512 entries reduce in
 * one order per type: eight float lanes, one FMA per step, a fixed horizontal sum; for the x16 types
 * the one sequence above). The choice of ISA is a matter of speed only. No exceptions today; an entry that cannot keep
 * the order must be named here with the reason. */
void hr_kernels_init(hr_kernels *k, hr_cpu_features f, const char *force_isa);

/* hr_cpu_isa_available (isa.h), under the name the tests know. */
bool hr_kernels_isa_available(hr_cpu_features f, const char *isa);

/* Writes "f32 avx2, f16 avx2, ..., q4_0 avx512, ...": the ISA each weight type's kernels use. Returns
 * the length the whole text needs (as snprintf; the text is cut to fit n bytes, NUL included). */
int hr_kernels_describe(const hr_kernels *k, char *buf, size_t n);

#endif

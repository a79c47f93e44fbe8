/* matmul.h: weight-times-activation products on the CPU, the engine's one heavy kernel.
 *
 * Dimension letters: T = tokens in the call, n = output rows (weight rows), k = reduction length.
 *
 * Batch invariance (a hard promise): Y[t][i] is bit-identical whatever T is, whatever the other rows
 * of X hold and however many threads split the work, because every output element is produced by
 * the same per-pair reduction (the kernel table's vec_dot / vec_dot_tile contract in tensor.h) from
 * an activation row quantized on its own. */
#ifndef HR_BACKEND_CPU_MATMUL_H
#define HR_BACKEND_CPU_MATMUL_H

#include <stdint.h>

#include "backend/cpu/kernels.h"
#include "common/status.h"
#include "common/threadpool.h"

/* Kernel table + thread pool (both borrowed; they must outlive the context) + activation scratch
 * sized at create for up to max_tokens rows of max_k elements. */
typedef struct hr_matmul_ctx hr_matmul_ctx;

hr_status hr_matmul_ctx_create(const hr_kernels *k, hr_threadpool *tp, int64_t max_tokens, int64_t max_k,
                               hr_matmul_ctx **out, hr_error *err);
/* NULL is allowed. */
void hr_matmul_ctx_destroy(hr_matmul_ctx *m);
/* Bytes hr_matmul_ctx_create allocates (the context and max_tokens activation rows). Pure. */
uint64_t hr_matmul_ctx_bytes(int64_t max_tokens, int64_t max_k);

/* Y[t][i] = sum_j W[i][j] * X[t][j] for t < T, i < n.
 *   W: n rows of k elements of type wt, row stride hr_dtype_row_bytes(wt, k)   (n, k)
 *   X: T x k floats, row stride k                                              (T, k)
 *   Y: T x n floats, row stride n                                              (T, n)
 * k must be a multiple of wt's block size, n of its row group (16 for q4_0x16), T <= max_tokens, k <= max_k, and the
 * table must have kernels for wt (violations are bugs: asserted). Activations are converted to wt's vec_dot_type once
 * per call; rows are split over the pool's threads. Not reentrant on one context. */
void hr_matmul(hr_matmul_ctx *m, const void *W, hr_dtype wt, int64_t n, int64_t k, const float *X, int64_t T, float *Y);
/* The same with X's rows x_stride >= k floats apart (X: T x k floats, row stride x_stride), so a row
 * that sits inside a wider one (the gate half of a fused gate|up row) is read in place. */
void hr_matmul_strided(hr_matmul_ctx *m, const void *W, hr_dtype wt, int64_t n, int64_t k, const float *X,
                       int64_t x_stride, int64_t T, float *Y);

#endif

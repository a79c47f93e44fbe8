/* cuda_kernels_test.h: what the parts of test_gpu_cuda_kernels share (test_cuda_kernels.c: main and the
 * row kernels; cuda_kernels_matrix.c: embedding, GEMV, the tensor cores' GEMM; cuda_kernels_attn.c:
 * attention over the KV storages; cuda_kernels_prefill.c: prefill attention; cuda_kernels_limits.c: the
 * emulating driver's own rules). One program, private to these files. */
#ifndef HR_TESTS_GPU_CUDA_KERNELS_TEST_H
#define HR_TESTS_GPU_CUDA_KERNELS_TEST_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "harness.h"

/* The device every check launches on, and the one random sequence every check draws its inputs from:
 * main runs the parts in a fixed order over the same sequence, so each input, and each figure printed,
 * is the same from run to run. */
typedef struct {
    hr_cuda_device *dev;
    uint32_t rng; /* 2024 at the start */
} kt_ctx;

static inline float frand(kt_ctx *kt) { /* [-1, 1) */
    kt->rng = kt->rng * 1664525u + 1013904223u;
    return (float)(kt->rng >> 8) / 8388608.0f - 1.0f;
}
static inline void fill(kt_ctx *kt, float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = frand(kt) * scale;
}

/* max |a - b| / max(|b|, floor) over n */
static inline double max_rel(const float *a, const float *b, size_t n, double floor) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / fmax(fabs((double)b[i]), floor);
        if (!(d <= worst)) worst = d; /* NaN counts as worst */
    }
    return worst;
}

/* device copies of host arrays; freed by the caller */
static inline uint64_t up(kt_ctx *kt, const void *x, size_t bytes) {
    uint64_t p = 0;
    hr_error e;
    if (hr_cuda_alloc(kt->dev, bytes, &p, &e) || hr_cuda_upload(kt->dev, p, x, bytes, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        exit(1);
    }
    return p;
}
static inline void down(kt_ctx *kt, void *x, uint64_t p, size_t bytes) {
    hr_error e;
    if (hr_cuda_download(kt->dev, x, p, bytes, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        exit(1);
    }
}
static inline bool launch(kt_ctx *kt, const char *k, unsigned gx, unsigned gy, void **args) {
    hr_error e;
    hr_status st = hr_cuda_launch(kt->dev, k, gx, gy, 256, args, &e);
    CHECKF(st == HR_OK, "%s: %s", k, e.msg);
    return st == HR_OK;
}

/* cuda_kernels_attn.c's storages, which the prefill checks take too */
bool storage_pair(kt_ctx *kt, int L, int HKV, int D, int B, int NB, hr_kv_format fmt, hr_kv_storage_params *p,
                  hr_kv_storage **cpu, hr_kv_storage **gpu);
hr_kv_storage *switch_storage(kt_ctx *kt, const char *env, const char *bad);

/* the parts' checks, in the order main runs them (test_argmax_rows, test_cuda_kernels.c's own, last) */
void test_emulator(const char *lib); /* cuda_kernels_limits.c: the emulating driver only */
void test_embed_gemv(kt_ctx *kt);    /* cuda_kernels_matrix.c */
void test_moe_gemv(kt_ctx *kt);
void test_moe_route(kt_ctx *kt);
void test_mma_selftest(kt_ctx *kt);
void test_gemm(kt_ctx *kt);
void test_attention(kt_ctx *kt); /* cuda_kernels_attn.c */
void test_attention_masks(kt_ctx *kt);
void test_attention_deferred(kt_ctx *kt);
void test_prefill_runs(void); /* cuda_kernels_prefill.c */
void test_prefill_attention(kt_ctx *kt);

#endif

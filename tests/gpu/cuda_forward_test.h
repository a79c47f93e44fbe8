/* cuda_forward_test.h: what the parts of test_gpu_cuda_forward share (test_cuda_forward.c: main and the
 * runtime helpers below; cuda_forward_quality.c: ../shared's vectors, agreement with the CPU, the mixes,
 * the corpus, prefill attention on the tensor cores; cuda_forward_engine.c: the engine's paths, the
 * token-level policies, the refusals, windows; cuda_forward_memory.c: the device arena, the host's copy
 * of the weights; cuda_forward_graphs.c: CUDA graphs, greedy ids picked on the device). One program,
 * private to these files. */
#ifndef HR_TESTS_GPU_CUDA_FORWARD_TEST_H
#define HR_TESTS_GPU_CUDA_FORWARD_TEST_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "runtime/runtime.h"

/* What every check opens its runtimes and devices with: main sets it from argv[1], and nothing changes it
 * after. */
typedef struct {
    const char *driver; /* argv[1], or NULL: libcuda.so.1 */
} ft_ctx;

/* test_cuda_forward.c's runtime helpers (their comments there) */
hr_runtime_params rt_params(const ft_ctx *ft, const char *model, const char *device, hr_rt_kv_format kvf);
hr_runtime *open_rt(const ft_ctx *ft, const char *model, const char *device, hr_rt_kv_format kvf, hr_error *err);
int generate_top2(hr_runtime *rt, const int32_t *prompt, int np, int n, int32_t *out, int32_t *top_ids, float *top_lp);
int generate(hr_runtime *rt, const int32_t *prompt, int np, int n, int32_t *out);
/* `headroom synth --shape SHAPE --type f32` into the test's directory: path (n bytes), which it returns */
const char *ft_synth(const char *shape, char *path, size_t n);

/* the parts' checks: the "paths" half, in the order main runs them */
void test_refusals(const ft_ctx *ft); /* cuda_forward_engine.c */
void test_windows(const ft_ctx *ft);
void test_families(const ft_ctx *ft); /* qwen2, qwen3 (YaRN), phi3 against the CPU */
void test_arena(const ft_ctx *ft);    /* cuda_forward_memory.c */
void test_host_weights(const ft_ctx *ft);
void test_f32_vectors(const ft_ctx *ft);  /* cuda_forward_quality.c */
void test_engine_paths(const ft_ctx *ft); /* cuda_forward_engine.c */
void test_token_policies(const ft_ctx *ft);
void test_prefill_mma(const ft_ctx *ft); /* cuda_forward_quality.c */
void test_graph_api(const ft_ctx *ft);   /* cuda_forward_graphs.c */
void test_graph_decode(const ft_ctx *ft);
void test_device_argmax(const ft_ctx *ft);
void test_host_threads(const ft_ctx *ft);
/* the "quality" half, cuda_forward_quality.c's */
void agreement(const ft_ctx *ft, const char *model, hr_rt_kv_format kvf, const char *label);
void test_mixes(const ft_ctx *ft);
void test_corpus_agreement(const ft_ctx *ft, const char *model, const char *label, int n_fmts, double bar_scale,
                           int max_chunks);

#endif

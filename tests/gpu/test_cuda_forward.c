/* test_cuda_forward.c: the GPU forward pass (backend/cuda/backend_cuda.c) end to end through the
 * runtime, `--device cuda` with the emulating driver (argv[1]: the kernels' own source run on the CPU,
 * tests/cuda/emu_rt.c), against the CPU backend:
 *   1. ../shared's stories260K (F32 weights) with an f32 KV cache: the recorded greedy completions of
 *      ../shared/vectors/stories260K-greedy.jsonl, exactly (skipped without ../shared);
 *   2. the repository's stories260K-q8_0 (q8_0 matrices, an f16 ffn_down) with f16 and q8 KV caches,
 *      and tiny synthetic models in llama.cpp's Q4_K_M, Q5_K_M and Q6_K mixes and in bf16:
 *      teacher-forced, the GPU's greedy choice at every position of the CPU's own greedy completion
 *      equals the CPU's at >= 95% of them, and where it does not, the CPU's own top two were within
 *      0.1 log-probability (the GPU multiplies f32 activations, the CPU quantized ones, so near-ties
 *      may go either way: docs/GPU.md);
 *   3. the engine's paths over the device storage give the CPU's ids (F32 model, f32 KV: the two agree
 *      exactly): a pool too small for four sequences at once, so they are preempted by swap (blocks
 *      copied to the host tier and back) or by recompute, and a shared prompt prefix; and the token-level
 *      eviction policies, h2o and snapkv (the GPU's masks and accumulated scores);
 *   4. prefill attention on the tensor cores (HEADROOM_CUDA_PREFILL_ATTN=mma) against the split
 *      kernels: logits within a bound, the same greedy ids;
 *   5. what is refused says so in one line: a KV format the device storage lacks, a family the kernels
 *      do not cover (qwen3's Q/K norms), a weight type without a GEMV kernel (mxfp4);
 *   6. the host's copy of the weights: --device cuda maps the GGUF and gives back each matrix's pages
 *      once uploaded, as the memory plan counts them;
 *   7. decode steps as CUDA graphs (HEADROOM_CUDA_GRAPHS=1): the device API's capture rules (what the
 *      driver refuses inside a capture, a replay reading its buffers anew), then four sequences decoded
 *      at once, across a context bucket and with window policies among them, give the eager run's ids
 *      and log-probabilities bit for bit, with the graphs replayed more often than captured.
 * With a GPU, bench/gpu/check.sh runs the same with the real driver (no argv[1]).
 *
 * The checks are split by subject over this file (main and the runtime helpers every part opens and
 * generates with) and cuda_forward_quality.c (1, 2, 4 and ../shared's corpus), cuda_forward_engine.c
 * (3, 5 and windows), cuda_forward_memory.c (6 and the device arena) and cuda_forward_graphs.c (7,
 * greedy ids picked on the device and the backend's host threads), all in this one program (cuda_forward_test.h: what
 * they share); main says which half runs each. */
#include "cuda_forward_test.h"

#include "backend/cuda/cuda.h"
#include "rt_greedy.h"

/* the runtime these tests open: one thread, a 256-token context, 64-token steps */
hr_runtime_params rt_params(const ft_ctx *ft, const char *model, const char *device, hr_rt_kv_format kvf) {
    hr_runtime_params p = hr_runtime_default_params();
    p.model_path = model;
    p.device = device;
    p.cuda_driver = ft->driver;
    p.k_format = p.v_format = kvf;
    p.n_ctx = 256;
    p.max_batch_tokens = 64;
    p.max_running = 4;
    p.n_threads = 1;
    p.kv_budget = 8u << 20; /* the arena's KV part, whatever the GPU's memory (test_arena: without it) */
    return p;
}

hr_runtime *open_rt(const ft_ctx *ft, const char *model, const char *device, hr_rt_kv_format kvf, hr_error *err) {
    hr_runtime_params p = rt_params(ft, model, device, kvf);
    hr_runtime *rt = NULL;
    if (hr_runtime_open(&p, &rt, NULL, err) != HR_OK) return NULL;
    return rt;
}

int generate_top2(hr_runtime *rt, const int32_t *prompt, int np, int n, int32_t *out, int32_t *top_ids, float *top_lp) {
    return hr_test_greedy(rt, prompt, np, n, out, top_ids, top_lp);
}

const char *ft_synth(const char *shape, char *path, size_t n) {
    char cmd[1200];
    snprintf(path, n, "%s/%s.gguf", hr_test_tmpdir(), shape);
    snprintf(cmd, sizeof cmd, "'%s' synth --shape %s --type f32 -o '%s' > /dev/null 2>&1", HR_HEADROOM_BIN, shape,
             path);
    CHECKF(system(cmd) == 0, "synth: %s", cmd);
    return path;
}

int generate(hr_runtime *rt, const int32_t *prompt, int np, int n, int32_t *out) {
    return generate_top2(rt, prompt, np, n, out, NULL, NULL);
}

/* argv[1]: a driver library (the emulating one for ctest; none: libcuda.so.1, skipped without a GPU);
 * argv[2]: which half, "paths" (refusals, windows, the arena, the F32 vectors, the engine's paths, mma
 * prefill attention, the graphs, h2o and snapkv, the families beside llama's; "graphs", "policies",
 * "families": those alone) or
 * "quality" (agreement with the CPU: the q8_0 model's completions, the mixes, the corpus); both when
 * absent. ctest runs the halves as two tests so they run side by side. */
int main(int argc, char **argv) {
    const char *driver = argc > 1 && argv[1][0] ? argv[1] : NULL;
    const ft_ctx ctx = {.driver = driver}, *ft = &ctx;
    const char *part = argc > 2 ? argv[2] : "all";
    const bool paths = strcmp(part, "quality") != 0, quality = strcmp(part, "paths") != 0;
    hr_error e = {0};
    if (hr_cuda_probe(driver, 0, &e) != HR_OK) {
        if (driver) {
            CHECKF(false, "%s", e.msg);
            return hr_test_finish();
        }
        HR_SKIP("%s", e.msg);
    }
    if (!strcmp(part, "policies")) { /* the token-level policies alone (part of paths) */
        test_token_policies(ft);
        return hr_test_finish();
    }
    if (!strcmp(part, "families")) { /* the refusals and the other families alone (part of paths) */
        test_refusals(ft);
        test_families(ft);
        return hr_test_finish();
    }
    if (!strcmp(part, "graphs")) { /* the graphs' checks alone (they are part of paths) */
        test_graph_api(ft);
        test_graph_decode(ft);
        test_device_argmax(ft);
        test_host_threads(ft);
        return hr_test_finish();
    }
    if (paths) {
        test_refusals(ft);
        test_windows(ft);
        test_families(ft);
        test_arena(ft);
        test_host_weights(ft);
        test_f32_vectors(ft);
        test_engine_paths(ft);
        test_token_policies(ft);
        test_prefill_mma(ft);
        test_graph_api(ft);
        test_graph_decode(ft);
        test_device_argmax(ft);
        test_host_threads(ft);
    }
    if (quality) {
        agreement(ft, HR_SOURCE_DIR "/models/stories260K-q8_0.gguf", HR_RT_KV_F16, "stories260K q8_0, f16 KV");
        agreement(ft, HR_SOURCE_DIR "/models/stories260K-q8_0.gguf", HR_RT_KV_Q8, "stories260K q8_0, q8 KV");
        agreement(ft, HR_SOURCE_DIR "/models/stories260K-q8_0.gguf", HR_RT_KV_BF16, "stories260K q8_0, bf16 KV");
        agreement(ft, HR_SOURCE_DIR "/models/stories260K-q8_0.gguf", HR_RT_KV_FP8, "stories260K q8_0, fp8 KV");
        test_mixes(ft);
        /* the whole corpus on a GPU; through the emulator its first chunk */
        /* kivi2 (the list's last) on a GPU only: the emulator's time (test_cuda_kernels checks its bytes) */
        test_corpus_agreement(ft, hr_test_shared_path("models/stories260K.gguf"), "F32 model", driver ? 6 : 7, 1.0,
                              driver ? 1 : 0);
        /* the q8_0 model: a 256-token prefill multiplies on the tensor cores (x rounded to f16, where the
         * CPU quantizes it to q8_0): near-ties may part, so 97% (f16 KV) */
        test_corpus_agreement(ft, HR_SOURCE_DIR "/models/stories260K-q8_0.gguf", "q8_0 model", 1, 0.98, driver ? 1 : 0);
    }
    return hr_test_finish();
}

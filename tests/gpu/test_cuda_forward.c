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
 * With a GPU, bench/gpu/check.sh runs the same with the real driver (no argv[1]). */
#include <dlfcn.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/cuda.h"
#include "common/util.h"
#include "harness.h"
#include "plan/plan.h"
#include "runtime/runtime.h"
#include "runtime/runtime_parts.h"
#include "tokenizer/tokenizer.h"

#define NGEN 48
#define MAXP 8

static const char *driver; /* argv[1], or NULL: libcuda.so.1 */

/* the runtime these tests open: one thread, a 256-token context, 64-token steps */
static hr_runtime_params rt_params(const char *model, const char *device, hr_rt_kv_format kvf) {
    hr_runtime_params p = hr_runtime_default_params();
    p.model_path = model;
    p.device = device;
    p.cuda_driver = driver;
    p.k_format = p.v_format = kvf;
    p.n_ctx = 256;
    p.max_batch_tokens = 64;
    p.max_running = 4;
    p.n_threads = 1;
    p.kv_budget = 8u << 20; /* the arena's KV part, whatever the GPU's memory (test_arena: without it) */
    return p;
}

static hr_runtime *open_rt(const char *model, const char *device, hr_rt_kv_format kvf, hr_error *err) {
    hr_runtime_params p = rt_params(model, device, kvf);
    hr_runtime *rt = NULL;
    if (hr_runtime_open(&p, &rt, NULL, err) != HR_OK) return NULL;
    return rt;
}

/* greedy ids of `prompt` (ids, BOS first) on rt; with top2 (n x 2 ids and log-probabilities), the
 * two most likely tokens at each step */
static int generate_top2(hr_runtime *rt, const int32_t *prompt, int np, int n, int32_t *out, int32_t *top_ids,
                         float *top_lp) {
    hr_rt_request_params p = {.prompt_ids = prompt, .n_prompt_ids = np, .max_tokens = n, .ignore_eos = true};
    p.sampling = hr_rt_sampling_default();
    p.sampling.temperature = 0;
    p.logprobs = top_ids != NULL;
    p.top_logprobs = top_ids ? 2 : 0;
    hr_rt_request *r = NULL;
    hr_error err = {0};
    if (hr_runtime_submit(rt, &p, &r, &err) != HR_OK || hr_runtime_run_until_idle(rt, &err) != HR_OK) {
        CHECKF(false, "generate: %s", err.msg);
        if (r) hr_rt_request_release(rt, r);
        return 0;
    }
    hr_rt_result res;
    hr_rt_request_result(r, &res);
    int k = res.n_ids < n ? res.n_ids : n;
    memcpy(out, res.ids, sizeof(int32_t) * (size_t)k);
    if (top_ids) CHECK(hr_rt_request_logprobs(r, 0, k, NULL, top_ids, top_lp) == k);
    hr_rt_request_release(rt, r);
    return k;
}

static int generate(hr_runtime *rt, const int32_t *prompt, int np, int n, int32_t *out) {
    return generate_top2(rt, prompt, np, n, out, NULL, NULL);
}

typedef struct vec {
    int32_t p[64], c[NGEN];
    int np, nc;
} vec;

static int load_vectors(const char *path, vec *v) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[1 << 14];
    int n = 0;
    while (n < MAXP && fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        if (!o) continue;
        json_t *pt = json_object_get(o, "prompt_tokens"), *ct = json_object_get(o, "completion_tokens");
        v[n].np = (int)json_array_size(pt);
        v[n].nc = (int)json_array_size(ct);
        for (int i = 0; i < v[n].np && i < 64; i++) v[n].p[i] = (int32_t)json_integer_value(json_array_get(pt, i));
        for (int i = 0; i < v[n].nc && i < NGEN; i++) v[n].c[i] = (int32_t)json_integer_value(json_array_get(ct, i));
        json_decref(o);
        n++;
    }
    fclose(f);
    return n;
}

static void test_f32_vectors(void) {
    const char *model = hr_test_shared_path("models/stories260K.gguf");
    const char *vpath = hr_test_shared_path("vectors/stories260K-greedy.jsonl");
    if (!model || !vpath) {
        printf("F32 vectors: skipped (../shared is absent)\n");
        return;
    }
    static vec v[MAXP];
    int n = load_vectors(vpath, v);
    hr_error err = {0};
    hr_runtime *rt = open_rt(model, "cuda", HR_RT_KV_F32, &err);
    CHECKF(rt, "open on the GPU: %s", err.msg);
    if (!rt) return;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int32_t got[NGEN];
        int k = generate(rt, v[i].p, v[i].np, v[i].nc, got);
        bool ok = k == v[i].nc && !memcmp(got, v[i].c, sizeof(int32_t) * (size_t)k);
        if (!ok) {
            int at = 0;
            while (at < k && got[at] == v[i].c[at]) at++;
            fprintf(stderr, "prompt %d: first differs at completion index %d\n", i, at);
        }
        bad += !ok;
    }
    CHECKF(n == 8 && bad == 0, "F32 vectors on the GPU: %d of %d prompts differ", bad, n);
    printf("F32 vectors, f32 KV: %d of %d prompts give the recorded 48 ids\n", n - bad, n);
    hr_runtime_close(rt);
}

/* Greedy on both; where the GPU's completion leaves the CPU's, teacher-forced from there: the GPU's
 * argmax after each longer prefix of the CPU's completion (before it, the two agree by construction).
 * >= 95% of the positions must agree, and every disagreement must be a near-tie on the CPU: the GPU's
 * token the CPU's second choice, within 0.1 of its log-probability (the GPU multiplies f32
 * activations where the CPU quantizes them; a random-weight model's logits are flat, so such ties are
 * common there). fp8 KV: within 0.5, since its codes are 1/8 apart: a K or V element that differs
 * slightly before encoding (those activations) can land one code away, a 6-12% step, where the other
 * formats move by rounding; the device's fp8 bytes and attention are the CPU's exactly and within
 * 1e-3 for the same input (test_cuda_kernels). */
static void agreement(const char *model, hr_rt_kv_format kvf, const char *label) {
    const float tie_gap = kvf == HR_RT_KV_FP8 ? 0.5f : 0.1f;
    static const int32_t prompts[][5] = {{1, 403, 407, 261, 378}, {1, 291, 376, 400, 428}, {1, 423, 268, 329, 290}};
    enum { NP = 5, NG = 24 };
    hr_error err = {0};
    hr_runtime *cpu = open_rt(model, "cpu", kvf, &err);
    CHECKF(cpu, "%s: open on the CPU: %s", label, err.msg);
    hr_runtime *gpu = open_rt(model, "cuda", kvf, &err);
    CHECKF(gpu, "%s: open on the GPU: %s", label, err.msg);
    if (!cpu || !gpu) {
        hr_runtime_close(cpu);
        hr_runtime_close(gpu);
        return;
    }
    int agree = 0, total = 0, same_greedy = 0, ties = 0;
    float worst_gap = 0.0f;
    for (size_t i = 0; i < sizeof prompts / sizeof prompts[0]; i++) {
        int32_t ref[NG], greedy[NG], seq[NP + NG], one, top[NG * 2];
        float lp[NG * 2];
        CHECK(generate_top2(cpu, prompts[i], NP, NG, ref, top, lp) == NG);
        int k = generate(gpu, prompts[i], NP, NG, greedy), j = 0;
        while (j < k && greedy[j] == ref[j]) j++;
        same_greedy += j == NG;
        agree += j;
        total += j;
        memcpy(seq, prompts[i], sizeof(int32_t) * NP);
        memcpy(seq + NP, ref, sizeof(int32_t) * (size_t)j);
        for (; j < NG; j++) {
            bool same = generate(gpu, seq, NP + j, 1, &one) == 1 && one == ref[j];
            agree += same;
            total++;
            if (!same) { /* a near-tie on the CPU, or a fault */
                bool tie = one == top[2 * j + 1] && lp[2 * j] - lp[2 * j + 1] < tie_gap;
                ties += tie;
                if (one == top[2 * j + 1] && lp[2 * j] - lp[2 * j + 1] > worst_gap)
                    worst_gap = lp[2 * j] - lp[2 * j + 1];
                CHECKF(tie, "%s: prompt %zu step %d: the GPU chose %d, the CPU %d (its second choice %d, %.3f below)",
                       label, i, j, one, ref[j], top[2 * j + 1], (double)(lp[2 * j] - lp[2 * j + 1]));
            }
            seq[NP + j] = ref[j];
        }
    }
    CHECKF(total == 3 * NG && agree * 100 >= total * 95,
           "%s: the GPU's top-1 agrees with the CPU's at %d of %d positions", label, agree, total);
    printf("%s: teacher-forced top-1 agreement %d of %d (the rest %d near-ties, within %.3f of the CPU's "
           "log-probability); %d of 3 greedy completions identical\n",
           label, agree, total, ties, (double)worst_gap, same_greedy);
    hr_runtime_close(cpu);
    hr_runtime_close(gpu);
}

/* llama.cpp's mixes as `headroom synth` writes them (the tiny shape's rows are not whole 256-weight
 * super-blocks, so its K-quant mixes hold q5_0 / q5_1 where llama.cpp falls back to them, and q6_K /
 * q8_0 elsewhere), and bf16 matrices */
static void test_mixes(void) {
    static const char *const mixes[][2] = {
        {"--mix Q4_K_M", "Q4_K_M"}, {"--mix Q5_K_M", "Q5_K_M"}, {"--mix Q6_K", "Q6_K"}, {"--type bf16", "bf16"}};
    for (size_t i = 0; i < sizeof mixes / sizeof mixes[0]; i++) {
        char path[512], cmd[1200], label[64];
        snprintf(path, sizeof path, "%s/tiny-%s.gguf", hr_test_tmpdir(), mixes[i][1]);
        snprintf(cmd, sizeof cmd, "'%s' synth --shape tiny %s -o '%s' > /dev/null 2>&1", HR_HEADROOM_BIN, mixes[i][0],
                 path);
        CHECKF(system(cmd) == 0, "synth: %s", cmd);
        snprintf(label, sizeof label, "tiny %s, f16 KV", mixes[i][1]);
        agreement(path, HR_RT_KV_F16, label);
    }
}

/* Four 40-token completions of ../shared's prompts at once in a 7-block pool (16 tokens a block: two
 * sequences' worth), preempted as `mode` says, on the CPU and the GPU; then two requests sharing a
 * 20-token prompt prefix. Every id equal. */
static void run_paths(const char *model, const char *device, hr_rt_preempt mode, hr_rt_kv_format kvf,
                      int32_t out[5][40], hr_rt_engine_stats *st) {
    hr_runtime_params p = rt_params(model, device, kvf);
    p.n_ctx = 128;
    p.kv_blocks = 7;
    p.max_batch_tokens = 32;
    p.admission = HR_RT_ADMIT_OPTIMISTIC;
    p.preempt = mode;
    hr_runtime *rt = NULL;
    hr_error err = {0};
    CHECKF(hr_runtime_open(&p, &rt, NULL, &err) == HR_OK, "%s: %s", device, err.msg);
    if (!rt) return;
    static const int32_t prompts[4][5] = {
        {1, 403, 407, 261, 378}, {1, 291, 376, 400, 428}, {1, 423, 268, 329, 290}, {1, 403, 407, 291, 376}};
    hr_rt_request *r[5] = {0};
    for (int i = 0; i < 4; i++) {
        hr_rt_request_params q = {.prompt_ids = prompts[i], .n_prompt_ids = 5, .max_tokens = 40, .ignore_eos = true};
        q.sampling = hr_rt_sampling_default();
        q.sampling.temperature = 0;
        CHECKF(hr_runtime_submit(rt, &q, &r[i], &err) == HR_OK, "%s", err.msg);
    }
    CHECKF(hr_runtime_run_until_idle(rt, &err) == HR_OK, "%s", err.msg);
    for (int i = 0; i < 4; i++) {
        hr_rt_result res;
        hr_rt_request_result(r[i], &res);
        CHECKF(res.n_ids == 40, "%s: request %d gave %d ids", device, i, res.n_ids);
        memcpy(out[i], res.ids, sizeof(int32_t) * (size_t)(res.n_ids < 40 ? res.n_ids : 40));
        hr_rt_request_release(rt, r[i]);
    }
    hr_runtime_pool pool;
    hr_runtime_get_pool(rt, &pool);
    *st = pool.engine;
    /* a 20-token prompt twice, one after the other: the second shares the first's full block */
    int32_t shared[20];
    for (int i = 0; i < 20; i++) shared[i] = out[0][i];
    for (int k = 0; k < 2; k++) {
        hr_rt_request_params q = {.prompt_ids = shared, .n_prompt_ids = 20, .max_tokens = 8, .ignore_eos = true};
        q.sampling = hr_rt_sampling_default();
        q.sampling.temperature = 0;
        CHECK(hr_runtime_submit(rt, &q, &r[4], &err) == HR_OK && hr_runtime_run_until_idle(rt, &err) == HR_OK);
        hr_rt_result res;
        hr_rt_request_result(r[4], &res);
        CHECK(res.n_ids == 8);
        if (k == 1) memcpy(out[4], res.ids, sizeof(int32_t) * 8);
        hr_rt_request_release(rt, r[4]);
    }
    hr_runtime_get_pool(rt, &pool);
    st->prefix_hit_tokens = pool.engine.prefix_hit_tokens - st->prefix_hit_tokens;
    /* on the emulating driver: the swap tier is one page-locked allocation (not a file), given back
     * at close */
    void *lib = driver && !strcmp(device, "cuda") ? dlopen(driver, RTLD_NOW | RTLD_NOLOAD) : NULL;
    void *sym = lib ? dlsym(lib, "hr_fake_cuda_host_allocs") : NULL;
    int (*host_allocs)(void) = NULL;
    memcpy(&host_allocs, &sym, sizeof sym);
    if (host_allocs) CHECKF(host_allocs() == (mode == HR_RT_PREEMPT_SWAP), "%d page-locked tiers", host_allocs());
    hr_runtime_close(rt);
    if (host_allocs) CHECK(host_allocs() == 0);
    if (lib) dlclose(lib);
}

static void test_engine_paths(void) {
    const char *model = hr_test_shared_path("models/stories260K.gguf");
    if (!model) {
        printf("preemption and prefix sharing: skipped (../shared is absent)\n");
        return;
    }
    /* f32 KV both ways; q4 swapped: its sequences' partial blocks live in stages, which the swap tier
     * takes and gives back with their counts (the device's stage_read / stage_write) */
    static const struct {
        hr_rt_preempt mode;
        hr_rt_kv_format kvf;
        const char *name;
    } modes[] = {{HR_RT_PREEMPT_SWAP, HR_RT_KV_F32, "swap"},
                 {HR_RT_PREEMPT_RECOMPUTE, HR_RT_KV_F32, "recompute"},
                 {HR_RT_PREEMPT_SWAP, HR_RT_KV_Q4, "swap, q4 KV"}};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        static int32_t cpu[5][40], gpu[5][40];
        memset(cpu, 0, sizeof cpu);
        memset(gpu, 0, sizeof gpu);
        hr_rt_engine_stats sc = {0}, sg = {0};
        run_paths(model, "cpu", modes[m].mode, modes[m].kvf, cpu, &sc);
        run_paths(model, "cuda", modes[m].mode, modes[m].kvf, gpu, &sg);
        bool same = !memcmp(cpu, gpu, sizeof cpu);
        bool preempted = modes[m].mode == HR_RT_PREEMPT_SWAP ? sg.preempt_swap > 0 : sg.preempt_recompute > 0;
        CHECKF(same, "preempt %s: the GPU's ids differ from the CPU's", modes[m].name);
        CHECKF(preempted, "preempt %s: the GPU run was never preempted that way", modes[m].name);
        CHECKF(sg.prefix_hit_tokens >= 16, "prefix sharing on the GPU: %llu tokens hit",
               (unsigned long long)sg.prefix_hit_tokens);
        printf("preempt %s on the GPU: %llu preemptions (%llu swapped, %llu KiB), %llu prefix-hit tokens; ids %s "
               "the CPU's\n",
               modes[m].name, (unsigned long long)sg.preemptions, (unsigned long long)sg.preempt_swap,
               (unsigned long long)(sg.swapped_bytes >> 10), (unsigned long long)sg.prefix_hit_tokens,
               same ? "equal to" : "NOT equal to");
    }
}

/* Two 40-token prompts decoded 24 tokens at once under `pol` (each request's own when per_request, else
 * the runtime's default) on device: their ids, and per request the tokens its policy evicted from every
 * layer and KV head and the most tokens one of them still sees */
static void token_policy_run(const char *model, const char *device, const char *pol, bool per_request,
                             int32_t out[2][24], int evicted[2], int kept[2]) {
    hr_runtime_params p = rt_params(model, device, HR_RT_KV_F32);
    p.kv_policy = per_request ? NULL : pol;
    hr_runtime *rt = NULL;
    hr_error err = {0};
    CHECKF(hr_runtime_open(&p, &rt, NULL, &err) == HR_OK, "%s %s: %s", device, pol, err.msg);
    if (!rt) return;
    int32_t prompts[2][40];
    for (int i = 0; i < 40; i++)
        prompts[0][i] = i == 0 ? 1 : 3 + (i * 37) % 500, prompts[1][i] = i == 0 ? 1 : 3 + (i * 53 + 11) % 500;
    hr_rt_request *r[2] = {0};
    for (int i = 0; i < 2; i++) {
        hr_rt_request_params q = {.prompt_ids = prompts[i], .n_prompt_ids = 40, .max_tokens = 24, .ignore_eos = true};
        q.sampling = hr_rt_sampling_default();
        q.sampling.temperature = 0;
        q.kv_policy = per_request ? pol : NULL;
        CHECKF(hr_runtime_submit(rt, &q, &r[i], &err) == HR_OK, "%s %s: %s", device, pol, err.msg);
    }
    CHECKF(hr_runtime_run_until_idle(rt, &err) == HR_OK, "%s %s: %s", device, pol, err.msg);
    for (int i = 0; i < 2; i++) {
        if (!r[i]) continue;
        hr_rt_result res;
        hr_rt_request_result(r[i], &res);
        CHECKF(res.n_ids == 24, "%s %s: request %d gave %d ids", device, pol, i, res.n_ids);
        memcpy(out[i], res.ids, sizeof(int32_t) * (size_t)(res.n_ids < 24 ? res.n_ids : 24));
        /* tokens no layer and KV head sees any more; the most one of them still sees */
        evicted[i] = res.stats.kv.tokens_evicted;
        kept[i] = res.stats.kv.tokens_kept_max;
        hr_rt_request_release(rt, r[i]);
    }
    hr_runtime_close(rt);
}

/* The token-level policies on the GPU: two 40-token prompts decoded 24 tokens at once under h2o:16 (the
 * runtime's default, as --kv-policy sets it) and snapkv:24 (each request's own, as the server's
 * kv_policy field; its observation window the last 12 prompt positions), on the CPU and the GPU (F32
 * model, f32 KV: the two agree to float rounding). The GPU masks tokens in its attention kernels and
 * accumulates the softmax weights on the device; the manager adds them to its scores and the policy
 * decides at each commit as on the CPU. Every id equal (and not the full cache's), and each policy cut
 * what a layer and KV head sees on both (h2o: to 16 tokens; snapkv: 16 of the prompt's first 28 gone),
 * with the same count of tokens gone from every head. On the GPU,
 * HEADROOM_CUDA_TOKEN_SEQS=1: the device holds one such sequence's masks and scores, so a step with
 * both runs in two pieces. */
static void test_token_policies(void) {
    const char *model = hr_test_shared_path("models/stories260K.gguf");
    if (!model) {
        printf("h2o and snapkv on the GPU: skipped (../shared is absent)\n");
        return;
    }
    /* kept: the budget (h2o) or the budget and the 24 generated tokens less the last (snapkv); every
     * (layer, KV head) of stories260K keeps its own tokens, so few leave them all: h2o's do, snapkv's
     * 16-token cut of the prompt not */
    static const struct {
        const char *pol;
        bool per_request;
        int kept, min_evicted;
    } cases[] = {{"h2o:16", false, 16, 1}, {"snapkv:24", true, 47, 0}};
    int32_t full[2][24] = {{0}};
    int ev_full[2], kept_full[2];
    token_policy_run(model, "cpu", "full", true, full, ev_full, kept_full);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int32_t cpu[2][24] = {{0}}, gpu[2][24] = {{0}};
        int ev_cpu[2] = {0}, ev_gpu[2] = {0}, kept_cpu[2] = {0}, kept_gpu[2] = {0};
        token_policy_run(model, "cpu", cases[c].pol, cases[c].per_request, cpu, ev_cpu, kept_cpu);
        setenv("HEADROOM_CUDA_TOKEN_SEQS", "1", 1);
        token_policy_run(model, "cuda", cases[c].pol, cases[c].per_request, gpu, ev_gpu, kept_gpu);
        unsetenv("HEADROOM_CUDA_TOKEN_SEQS");
        const bool same = !memcmp(cpu, gpu, sizeof cpu);
        CHECKF(same, "%s on the GPU: ids differ from the CPU's", cases[c].pol);
        CHECKF(memcmp(cpu, full, sizeof cpu) != 0, "%s: the same ids as the full cache (no effect to compare)",
               cases[c].pol);
        for (int i = 0; i < 2; i++)
            CHECKF(kept_gpu[i] == cases[c].kept && kept_cpu[i] == cases[c].kept && ev_gpu[i] == ev_cpu[i] &&
                       ev_gpu[i] >= cases[c].min_evicted,
                   "%s request %d: %d tokens seen at most and %d evicted from every head on the GPU, %d and %d on "
                   "the CPU",
                   cases[c].pol, i, kept_gpu[i], ev_gpu[i], kept_cpu[i], ev_cpu[i]);
        printf("%s on the GPU: ids %s the CPU's; per request at most %d of 63 tokens seen by a layer and KV head, %d "
               "and %d evicted from all (CPU: %d, %d and %d)\n",
               cases[c].pol, same ? "equal to" : "NOT equal to", kept_gpu[0], ev_gpu[0], ev_gpu[1], kept_cpu[0],
               ev_cpu[0], ev_cpu[1]);
    }
}

/* a model at path made by `headroom synth ARGS`, opened on the GPU: its refusal contains want */
static void refused_model(const char *args, const char *name, const char *want) {
    char path[512], cmd[1200];
    snprintf(path, sizeof path, "%s/%s.gguf", hr_test_tmpdir(), name);
    snprintf(cmd, sizeof cmd, "'%s' synth %s -o '%s' > /dev/null 2>&1", HR_HEADROOM_BIN, args, path);
    CHECKF(system(cmd) == 0, "synth: %s", cmd);
    hr_error err = {0};
    hr_runtime *rt = open_rt(path, "cuda", HR_RT_KV_F16, &err);
    CHECKF(!rt && strstr(err.msg, want) && !strchr(err.msg, '\n'), "%s on the GPU: %s", name, err.msg);
    hr_runtime_close(rt);
}

static void test_refusals(void) {
    const char *model = HR_SOURCE_DIR "/models/stories260K-q8_0.gguf";
    hr_error err = {0};
    /* q4h's measurement-only variants are the CPU's alone */
    setenv("HEADROOM_KV_Q4H_VARIANT", "sym", 1);
    hr_runtime *rt = open_rt(model, "cuda", HR_RT_KV_Q4H, &err);
    unsetenv("HEADROOM_KV_Q4H_VARIANT");
    CHECKF(
        !rt &&
            strstr(err.msg,
                   "CUDA KV: the formats on the GPU are f32, f16, bf16, q8, fp8, q4, kivi2 and q4h (K q4h, V q4h)") &&
            !strchr(err.msg, '\n'),
        "q4h's sym variant on the GPU: %s", err.msg);
    hr_runtime_close(rt);
    /* the token-level KV policies are taken now (test_token_policies runs them) */
    hr_runtime_params pp = rt_params(model, "cuda", HR_RT_KV_F16);
    pp.kv_policy = "h2o:64";
    rt = NULL;
    CHECKF(hr_runtime_open(&pp, &rt, NULL, &err) == HR_OK && rt, "h2o on the GPU: %s", err.msg);
    hr_runtime_close(rt);
    /* a batch past what the GEMV's grid rows take (grid.y at most 65535 on a GPU) */
    pp = rt_params(model, "cuda", HR_RT_KV_F16);
    pp.max_batch_tokens = HR_CUDA_MAX_BATCH_TOKENS + 1;
    rt = NULL;
    CHECKF(hr_runtime_open(&pp, &rt, NULL, &err) != HR_OK && !rt &&
               strstr(err.msg, "max_batch_tokens 524281 is past 524280") && !strchr(err.msg, '\n'),
           "a batch of %d tokens on the GPU: %s", pp.max_batch_tokens, err.msg);
    hr_runtime_close(rt);
    /* a family the kernels do not cover, and a weight type without a GEMV kernel, each named */
    refused_model("--shape qwen3-tiny --type f32", "qwen3-tiny",
                  "has Q/K norms, which the GPU kernels do not cover yet");
    refused_model("--shape tiny --type mxfp4", "tiny-mxfp4",
                  "CUDA: blk.0.attn_q is mxfp4; the GPU's matrix kernels take");
}

/* Teacher-forced top-1 agreement with the CPU on ../shared's corpus (stories260K's own samples; with
 * the F32 model neither side quantizes activations): chunks of 256 tokens (BOS then the text),
 * each scored in one forward pass on both backends with the same KV format; every position's argmax
 * compared. The bar is >= 99% for f16, bf16 and q8; fp8 is reported too. On a GPU every
 * chunk of the corpus; through the emulator (slow: a fiber per GPU thread) the first max_chunks. */
static void test_corpus_agreement(const char *model, const char *label, int n_fmts, double bar_scale, int max_chunks) {
    const char *text = hr_test_shared_path("corpus/stories260K-samples.txt");
    if (!model || !text) {
        printf("corpus agreement: skipped (../shared is absent)\n");
        return;
    }
    static const struct {
        hr_rt_kv_format f;
        const char *name;
        double bar;
    } fmts[] = {{HR_RT_KV_F16, "f16", 0.99},    {HR_RT_KV_BF16, "bf16", 0.99}, {HR_RT_KV_Q8, "q8", 0.99},
                {HR_RT_KV_FP8, "fp8", 0.95},    {HR_RT_KV_Q4H, "q4h", 0.95},   {HR_RT_KV_Q4, "q4", 0.95},
                {HR_RT_KV_KIVI2, "kivi2", 0.95}};
    enum { CHUNK = 256 };
    FILE *f = fopen(text, "rb");
    char *buf = malloc(1 << 20);
    size_t len = f && buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    if (f) fclose(f);
    for (int fi = 0; fi < n_fmts && fi < (int)(sizeof fmts / sizeof fmts[0]) && buf && len; fi++) {
        hr_error err = {0};
        hr_runtime_params p = rt_params(model, "cpu", fmts[fi].f);
        p.max_batch_tokens = CHUNK;
        p.n_ctx = CHUNK;
        hr_runtime *cpu = NULL, *gpu = NULL;
        CHECKF(hr_runtime_open(&p, &cpu, NULL, &err) == HR_OK, "%s", err.msg);
        p.device = "cuda";
        CHECKF(hr_runtime_open(&p, &gpu, NULL, &err) == HR_OK, "%s", err.msg);
        int32_t *ids = NULL;
        size_t n_ids = 0;
        hr_tokenize_opts to = {.add_bos = false};
        if (cpu && gpu)
            CHECKF(hr_tokenizer_encode_alloc(hr_runtime_tokenizer(cpu), buf, len, &to, &ids, &n_ids, &err) == HR_OK,
                   "%s", err.msg);
        hr_runtime_info info;
        if (cpu) hr_runtime_describe(cpu, &info);
        const int V = cpu ? info.n_vocab : 0;
        float *lc = malloc(sizeof(float) * CHUNK * (size_t)(V > 0 ? V : 1));
        float *lg = malloc(sizeof(float) * CHUNK * (size_t)(V > 0 ? V : 1));
        long agree = 0, total = 0;
        double worst = 0;
        int chunks = 0;
        for (size_t at = 0; ids && lc && lg && at + CHUNK - 1 <= n_ids && (max_chunks <= 0 || chunks < max_chunks);
             at += CHUNK - 1, chunks++) {
            int32_t chunk[CHUNK];
            chunk[0] = 1; /* BOS */
            memcpy(chunk + 1, ids + at, sizeof(int32_t) * (CHUNK - 1));
            hr_rt_score sc;
            if (hr_runtime_score(cpu, NULL, chunk, CHUNK, lc, &sc, &err) != HR_OK ||
                hr_runtime_score(gpu, NULL, chunk, CHUNK, lg, &sc, &err) != HR_OK) {
                CHECKF(false, "corpus %s chunk %d: %s", fmts[fi].name, chunks, err.msg);
                break;
            }
            for (int t = 0; t < CHUNK; t++) {
                const float *a = lc + (size_t)t * V, *b = lg + (size_t)t * V;
                int ia = 0, ib = 0;
                for (int v = 1; v < V; v++) {
                    ia = a[v] > a[ia] ? v : ia;
                    ib = b[v] > b[ib] ? v : ib;
                }
                agree += ia == ib;
                total++;
                for (int v = 0; v < V; v++) worst = fmax(worst, fabs((double)a[v] - b[v]));
            }
        }
        CHECKF(total > 0 && (double)agree >= fmts[fi].bar * bar_scale * (double)total,
               "corpus, %s, %s KV: the GPU's top-1 agrees with the CPU's at %ld of %ld positions", label, fmts[fi].name,
               agree, total);
        printf("corpus, %s, %s KV: teacher-forced top-1 agreement %ld of %ld positions (%.2f%%; %d chunks of %d), "
               "largest logit difference %.4f\n",
               label, fmts[fi].name, agree, total, total ? 100.0 * (double)agree / (double)total : 0.0, chunks, CHUNK,
               worst);
        free(ids);
        free(lc);
        free(lg);
        hr_runtime_close(cpu);
        hr_runtime_close(gpu);
    }
    free(buf);
}

/* every position's logits of tokens[0..n) under policy on the CPU and the GPU (one model, f32
 * weights and KV: the two compute alike), the largest difference */
static double score_diff(const char *model, const char *policy, const char *gpu_policy, int n_ctx,
                         const int32_t *tokens, int n) {
    hr_error err = {0};
    hr_runtime_params p = rt_params(model, "cpu", HR_RT_KV_F32);
    p.n_ctx = n_ctx;
    p.max_batch_tokens = n;
    p.kv_budget = 0;
    p.kv_seqs = 1;
    hr_runtime *cpu = NULL, *gpu = NULL;
    CHECKF(hr_runtime_open(&p, &cpu, NULL, &err) == HR_OK, "%s", err.msg);
    p.device = "cuda";
    p.kv_budget = 16u << 20;
    CHECKF(hr_runtime_open(&p, &gpu, NULL, &err) == HR_OK, "%s", err.msg);
    double worst = -1;
    hr_runtime_info info;
    if (cpu && gpu) {
        hr_runtime_describe(cpu, &info);
        float *a = malloc(sizeof(float) * (size_t)n * info.n_vocab),
              *b = malloc(sizeof(float) * (size_t)n * info.n_vocab);
        hr_rt_score sc;
        if (a && b) {
            CHECKF(hr_runtime_score(cpu, policy, tokens, n, a, &sc, &err) == HR_OK, "%s", err.msg);
            CHECKF(hr_runtime_score(gpu, gpu_policy, tokens, n, b, &sc, &err) == HR_OK, "%s", err.msg);
            worst = 0;
            /* under a policy the first n / 2 positions' logits are not written (hr_runtime_score) */
            for (size_t i = (size_t)(policy ? n / 2 : 0) * info.n_vocab; i < (size_t)n * info.n_vocab; i++)
                worst = fmax(worst, fabs((double)a[i] - b[i]));
        }
        free(a);
        free(b);
    }
    hr_runtime_close(cpu);
    hr_runtime_close(gpu);
    return worst;
}

/* Windows on the GPU: window and sinks policies (their blocks dropped as they leave the window) and a
 * model's own sliding window (mistral-tiny's 256 tokens, passed over by a 400-token sequence) give the
 * CPU's logits at every position (f32 weights and KV, so within float rounding); the GPU scoring in
 * full differs from the CPU's window, so the window is what is checked. */
static void test_windows(void) {
    const char *f32 = hr_test_shared_path("models/stories260K.gguf");
    int32_t toks[400];
    for (int i = 0; i < 400; i++) toks[i] = i == 0 ? 1 : 3 + (i * 37) % 500;
    if (f32) {
        static const char *const pols[] = {"window:24", "sinks:4,window:24", "window:100"};
        /* the check can fail: the GPU in full against the CPU's window differs */
        double full = score_diff(f32, "window:24", "full", 256, toks, 160);
        CHECKF(full > 1e-2, "window:24 against full: logits only %g apart", full);
        for (size_t i = 0; i < sizeof pols / sizeof pols[0]; i++) {
            double d = score_diff(f32, pols[i], pols[i], 256, toks, 160);
            CHECKF(d >= 0 && d < 1e-3, "policy %s on the GPU: logits %g from the CPU's", pols[i], d);
            printf("policy %s on the GPU: every logit within %.2g of the CPU's (160 tokens, F32 model)\n", pols[i], d);
        }
    }
    char path[512], cmd[1200];
    snprintf(path, sizeof path, "%s/mistral-tiny.gguf", hr_test_tmpdir());
    snprintf(cmd, sizeof cmd, "'%s' synth --shape mistral-tiny --type f32 -o '%s' > /dev/null 2>&1", HR_HEADROOM_BIN,
             path);
    CHECKF(system(cmd) == 0, "synth: %s", cmd);
    double d = score_diff(path, NULL, NULL, 512, toks, 400);
    CHECKF(d >= 0 && d < 1e-3, "mistral-tiny's sliding window on the GPU: logits %g from the CPU's", d);
    printf("sliding window (mistral-tiny, 256 tokens) on the GPU: every logit of 400 positions within %.2g of the "
           "CPU's\n",
           d);
}

/* Prefill attention on the tensor cores (HEADROOM_CUDA_PREFILL_ATTN=mma, read when the runtime makes
 * its device storage) against the split kernels (the default), on a model: a 40-token prompt scored
 * in one forward pass (one run of 40 rows: hr_k_attn_prefill, in tiles of 64 / G rows) gives every
 * position's logits within `bound` of the split path's, and not all of them bit for bit (the tensor
 * cores ran); a 24-token prompt's greedy completion (a prefill run, then decode rows on the split
 * kernels) gives the same 16 ids. Where the two differ: Q, K and V in f16 and P rounded to f16 (each
 * attention output within about 2^-10 of max|v| plus K's rounding of the scores: test_cuda_kernels'
 * bound), carried through the model's 5 layers to the logits. The bound, 0.05 (3e-3 of these
 * models' largest logit, 17), is not derived through the layers: it is about 3.5x what the
 * emulator measures (0.014 on both models), the hardware's exp2 approximations aside. */
static void prefill_mma_case(const char *model, hr_rt_kv_format kvf, const char *label, double bound) {
    enum { NT = 40, NP = 24, NG = 16 };
    int32_t toks[NT];
    for (int i = 0; i < NT; i++) toks[i] = i == 0 ? 1 : 3 + (i * 37) % 500;
    hr_error err = {0};
    hr_runtime *rt[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        if (k) setenv("HEADROOM_CUDA_PREFILL_ATTN", "mma", 1);
        rt[k] = open_rt(model, "cuda", kvf, &err);
        unsetenv("HEADROOM_CUDA_PREFILL_ATTN");
        CHECKF(rt[k], "%s: open on the GPU (%s): %s", label, k ? "mma" : "split", err.msg);
    }
    hr_runtime_info info;
    if (rt[0] && rt[1]) {
        hr_runtime_describe(rt[0], &info);
        float *lg[2] = {malloc(sizeof(float) * NT * (size_t)info.n_vocab),
                        malloc(sizeof(float) * NT * (size_t)info.n_vocab)};
        hr_rt_score sc;
        bool ok = lg[0] && lg[1];
        for (int k = 0; k < 2 && ok; k++) {
            ok = hr_runtime_score(rt[k], NULL, toks, NT, lg[k], &sc, &err) == HR_OK;
            CHECKF(ok, "%s: score: %s", label, err.msg);
        }
        double worst = 0, big = 0;
        bool differ = false;
        for (size_t i = 0; ok && i < (size_t)NT * info.n_vocab; i++) {
            const double d = fabs((double)lg[1][i] - lg[0][i]);
            big = fmax(big, fabs((double)lg[0][i]));
            worst = d != d ? INFINITY : fmax(worst, d);
            differ |= lg[1][i] != lg[0][i];
        }
        CHECKF(ok && worst <= bound, "%s: mma prefill attention's logits %g from the split path's (bound %g)", label,
               worst, bound);
        CHECKF(ok && differ, "%s: the logits are the split path's bit for bit: the mma kernel did not run", label);
        int32_t ids[2][NG];
        int n[2];
        for (int k = 0; k < 2; k++) n[k] = generate(rt[k], toks, NP, NG, ids[k]);
        CHECKF(n[0] == NG && n[1] == NG && !memcmp(ids[0], ids[1], sizeof ids[0]),
               "%s: the greedy completions differ between the mma and split prefill attention", label);
        printf("%s: mma prefill attention, logits of a 40-token prefill (|logit| up to %.3g) within %.3g of the split "
               "path's (bound %g); the greedy ids the same\n",
               label, big, worst, bound);
        free(lg[0]);
        free(lg[1]);
    }
    hr_runtime_close(rt[0]);
    hr_runtime_close(rt[1]);
}

static void test_prefill_mma(void) {
    const char *f32 = hr_test_shared_path("models/stories260K.gguf");
    if (f32) prefill_mma_case(f32, HR_RT_KV_F32, "stories260K F32, f32 KV", 0.05);
    prefill_mma_case(HR_SOURCE_DIR "/models/stories260K-q8_0.gguf", HR_RT_KV_F16, "stories260K q8_0, f16 KV", 0.05);
}

/* The one device arena: what the runtime reserves is what hr_cuda_arena_plan_compute says and what
 * the planner says for the same device, every piece of it taken at open (weights, scratch, KV blocks)
 * and nothing more; the KV pool fills what gpu_util leaves; --kv-budget, a budget that leaves no room
 * and a GPU whose memory another holder took each get their pool or one line. */
static void test_arena(void) {
    const char *model = HR_SOURCE_DIR "/models/stories260K-q8_0.gguf";
    hr_error err = {0};
    hr_cuda_device *dev = NULL;
    uint64_t fr = 0, tot = 0;
    CHECKF(hr_cuda_device_open(driver, 0, &dev, &err) == HR_OK && hr_cuda_device_mem(dev, &fr, &tot, &err) == HR_OK,
           "%s", err.msg);
    if (!dev) return;
    /* about 1 GiB of whatever the GPU has (the emulated one has 1 GiB) */
    const double util = tot > (1ull << 30) ? (double)(1ull << 30) / (double)tot : 0.9;
    /* f16, then q4, whose f16 tail buffers the arena holds too */
    hr_runtime_params p;
    hr_runtime *rt = NULL;
    hr_rt_device_mem dm;
    for (int fi = 0; fi < 2; fi++) {
        const hr_rt_kv_format kvf = fi ? HR_RT_KV_Q4 : HR_RT_KV_F16;
        p = rt_params(model, "cuda", kvf);
        p.kv_budget = 0;
        p.gpu_util = util;
        rt = NULL;
        CHECKF(hr_runtime_open(&p, &rt, NULL, &err) == HR_OK, "%s", err.msg);
        if (rt && hr_runtime_device_mem(rt, &dm)) {
            const hr_kv_budget *kb = hr_runtime_budget(rt);
            CHECK(dm.total_bytes == tot && dm.util == util && dm.budget_bytes == (uint64_t)((double)tot * util));
            CHECK(dm.weight_bytes == hr_cuda_model_weight_bytes(hr_runtime_model(rt)));
            CHECK(dm.arena_bytes == dm.weight_bytes + dm.scratch_bytes + dm.kv_bytes &&
                  dm.arena_bytes <= dm.budget_bytes);
            CHECKF(dm.arena_used_bytes == dm.arena_bytes && dm.arena_peak_bytes == dm.arena_bytes,
                   "the arena holds %llu bytes in use of %llu planned", (unsigned long long)dm.arena_used_bytes,
                   (unsigned long long)dm.arena_bytes);
            /* the pool takes the rest of the budget: less than a block (and the last piece's rounding) left;
             * q4's tail buffers (hr_kv_fixed_bytes) are a piece of the arena beside the blocks */
            CHECKF(dm.budget_bytes - dm.arena_bytes < kb->block_bytes + 512, "%llu bytes of the budget unused",
                   (unsigned long long)(dm.budget_bytes - dm.arena_bytes));
            CHECK(hr_kv_pool_n_blocks(hr_runtime_kv(rt)) == kb->n_blocks && kb->n_blocks > 1000);
            /* the planner, for a GPU of this memory at this util: the same arena and pool */
            hr_plan_model pm;
            CHECKF(hr_plan_model_open(model, NULL, &pm, &err) == HR_OK, "%s", err.msg);
            hr_plan_device pd = {.gpu = true, .mem_bytes = tot, .util = util, .bw_gbps = 1000};
            hr_plan_params pp = {.n_ctx = p.n_ctx,
                                 .concurrency = 1,
                                 .k_format = kvf,
                                 .v_format = kvf,
                                 .max_batch_tokens = p.max_batch_tokens,
                                 .max_running = p.max_running};
            hr_plan *pl = calloc(1, sizeof *pl);
            CHECKF(pl && hr_plan_compute(&pm, &pd, &pp, pl, &err) == HR_OK && pl->gpu_planned && pl->gpu_ok, "%s",
                   pl ? pl->gpu_why : "");
            if (pl)
                CHECKF(pl->gpu.n_blocks == kb->n_blocks && pl->gpu.arena_bytes == dm.arena_bytes,
                       "planned %d blocks in %llu bytes; the runtime has %d in %llu", pl->gpu.n_blocks,
                       (unsigned long long)pl->gpu.arena_bytes, kb->n_blocks, (unsigned long long)dm.arena_bytes);
            printf(
                "arena, %s KV: %.1f MiB of a %.1f MiB budget (weights %.1f KiB, scratch %.1f KiB, %d KV blocks); the "
                "planner's: %d blocks\n",
                kvf == HR_RT_KV_Q4 ? "q4" : "f16", dm.arena_bytes / 1048576.0, dm.budget_bytes / 1048576.0,
                dm.weight_bytes / 1024.0, dm.scratch_bytes / 1024.0, kb->n_blocks, pl ? pl->gpu.n_blocks : -1);
            free(pl);
        }
        hr_runtime_close(rt);
    }
    p = rt_params(model, "cuda", HR_RT_KV_F16);
    p.gpu_util = util;
    rt = NULL;
    /* --kv-budget: that many bytes of blocks */
    p.kv_budget = 1u << 20;
    rt = NULL;
    CHECKF(hr_runtime_open(&p, &rt, NULL, &err) == HR_OK, "%s", err.msg);
    if (rt) {
        const hr_kv_budget *kb = hr_runtime_budget(rt);
        CHECK(kb->n_blocks == (int)((1u << 20) / kb->block_bytes));
        CHECK(hr_runtime_device_mem(rt, &dm) && dm.arena_used_bytes == dm.arena_bytes);
        /* the host's memory plan counts the GPU forward pass's host rows, not the CPU's activations: the
         * CPU's plan for the same parameters differs by exactly the two (the engine's buffers alike) */
        hr_runtime_params pc = p;
        pc.device = "cpu";
        pc.n_threads = 2;
        hr_runtime *cpu = NULL;
        CHECKF(hr_runtime_open(&pc, &cpu, NULL, &err) == HR_OK, "%s", err.msg);
        if (cpu) {
            const hr_hparams *hp = hr_model_hparams(hr_runtime_model(rt));
            const int T = p.max_batch_tokens > 0 ? p.max_batch_tokens : 512;
            const uint64_t host = hr_cuda_host_scratch_bytes(hp, T, p.n_ctx, 16, p.n_threads);
            const uint64_t cpu_fwd = hr_model_ctx_scratch_bytes(hp, T, p.n_ctx, 16, pc.n_threads);
            const hr_kv_budget *kc = hr_runtime_budget(cpu);
            CHECKF(kc->scratch_bytes - kb->scratch_bytes == cpu_fwd - host,
                   "host plan: scratch %llu on the GPU, %llu on the CPU (forward %llu vs %llu)",
                   (unsigned long long)kb->scratch_bytes, (unsigned long long)kc->scratch_bytes,
                   (unsigned long long)host, (unsigned long long)cpu_fwd);
        }
        hr_runtime_close(cpu);
    }
    hr_runtime_close(rt);
    /* a budget with no room for one context */
    p.kv_budget = 0;
    p.gpu_util = (double)(600u << 10) / (double)tot;
    rt = NULL;
    CHECK(hr_runtime_open(&p, &rt, NULL, &err) == HR_ERR_BUDGET && !rt);
    CHECKF(strstr(err.msg, "--gpu-util") && !strchr(err.msg, '\n'), "%s", err.msg);
    /* most of the GPU taken by another holder: the arena does not fit what is free */
    uint64_t hold = 0;
    CHECKF(hr_cuda_alloc(dev, (size_t)(fr - (fr >> 3)), &hold, &err) == HR_OK, "%s", err.msg);
    p.gpu_util = util;
    rt = NULL;
    CHECK(hr_runtime_open(&p, &rt, NULL, &err) == HR_ERR_BUDGET && !rt);
    CHECKF(strstr(err.msg, "free of") && strstr(err.msg, "lower --gpu-util"), "%s", err.msg);
    hr_cuda_free(dev, hold);
    hr_cuda_device_close(dev);
}

/* Resident bytes of this process's mappings of the file at path (/proc/self/smaps: the header line's
 * pathname, then its "Rss:" line); -1 where no mapping names it. */
static long long mapped_rss(const char *path) {
    char real[4096];
    if (!realpath(path, real)) return -1;
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[4608];
    long long rss = -1;
    bool ours = false;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (strchr(line, '-') && strchr(line, ' ') && strchr(line, '-') < strchr(line, ' ')) { /* a header */
            size_t n = strlen(line), m = strlen(real);
            if (n && line[n - 1] == '\n') line[--n] = '\0';
            ours = n >= m && !strcmp(line + n - m, real) && line[n - m - 1] == ' ';
            if (ours && rss < 0) rss = 0;
        } else if (ours && sscanf(line, "Rss: %llu kB", &kb) == 1) {
            rss += (long long)kb * 1024;
        }
    }
    fclose(f);
    return rss;
}

/* --device cuda maps the GGUF and gives back each matrix's host pages once it is uploaded: the process
 * holds no more of the file than the memory plan says (its metadata, the matrices' partial edge pages),
 * the plan counts exactly what the backend gave back, and the device's ids stay the CPU's (the tiny
 * f32 model: the two agree exactly). */
static void test_host_weights(void) {
    char path[512], cmd[1200];
    snprintf(path, sizeof path, "%s/host-weights-tiny-f32.gguf", hr_test_tmpdir());
    snprintf(cmd, sizeof cmd, "'%s' synth --shape tiny --type f32 -o '%s' > /dev/null 2>&1", HR_HEADROOM_BIN, path);
    CHECKF(system(cmd) == 0, "synth: %s", cmd);
    hr_error err = {0};
    hr_runtime *rt = open_rt(path, "cuda", HR_RT_KV_F32, &err), *cpu = open_rt(path, "cpu", HR_RT_KV_F32, &err);
    CHECKF(rt && cpu, "%s", err.msg);
    hr_rt_device_mem dm;
    if (!rt || !cpu || !hr_runtime_device_mem(rt, &dm)) {
        hr_runtime_close(rt);
        hr_runtime_close(cpu);
        return;
    }
    const hr_model *m = hr_runtime_model(rt);
    const uint64_t file = hr_model_file_bytes(m), loaded = hr_model_resident_bytes(hr_model_hparams(m), file);
    const uint64_t host = hr_cuda_host_weight_bytes(m);
    hr_runtime_memory mem;
    hr_runtime_get_memory(rt, &mem);
    const long long rss = mapped_rss(path);
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), whole = (file + page - 1) / page * page;
    /* most of the file is matrices: at least 80% of it given back */
    CHECKF(dm.host_released >= file / 10 * 8 && mem.weight_bytes == host &&
               host == hr_model_resident_bytes(hr_model_hparams(m), whole) - dm.host_released,
           "%llu of the file's %llu bytes given back; the plan counts %llu host weight bytes (loaded: %llu)",
           (unsigned long long)dm.host_released, (unsigned long long)file, (unsigned long long)mem.weight_bytes,
           (unsigned long long)loaded);
    /* the mapping's whole pages less those given back; within the plan's host weights */
    const uint64_t left = whole - dm.host_released;
    CHECKF(rss >= 0 && (uint64_t)rss <= left && (uint64_t)rss <= host,
           "the process holds %lld bytes of the file's mapping; its pages less those given back are %llu, the "
           "plan's host weights %llu",
           rss, (unsigned long long)left, (unsigned long long)host);
    /* the CPU's plan counts the whole file it reads */
    hr_runtime_memory cm;
    hr_runtime_get_memory(cpu, &cm);
    CHECK(cm.weight_bytes == loaded);
    const int32_t prompt[] = {1, 17, 42, 99, 7};
    int32_t a[16], b[16];
    int na = generate(rt, prompt, 5, 16, a), nb = generate(cpu, prompt, 5, 16, b);
    const bool same = na == 16 && nb == 16 && !memcmp(a, b, sizeof a);
    CHECKF(same, "after the host pages went: %d and %d ids, not the same", na, nb);
    printf("host weights under --device cuda: %.1f KiB of the %.1f KiB file given back, %.1f KiB of its mapping "
           "resident, %.1f KiB planned (the CPU: %.1f KiB); ids %s the CPU's\n",
           dm.host_released / 1024.0, file / 1024.0, rss / 1024.0, host / 1024.0, loaded / 1024.0,
           same ? "equal to" : "NOT equal to");
    hr_runtime_close(rt);
    hr_runtime_close(cpu);
}

/* ---- 5. CUDA graphs ------------------------------------------------------------------------------- */

/* the emulating driver's graph counters (captures ended well, graph launches, graphs alive), or
 * false where the driver is another */
static bool graph_counts(void *lib, int c[3]) {
    void *sym = lib ? dlsym(lib, "hr_fake_cuda_graph_counts") : NULL;
    void (*fn)(int *, int *, int *) = NULL;
    memcpy(&fn, &sym, sizeof sym);
    if (fn) fn(&c[0], &c[1], &c[2]);
    return fn != NULL;
}

/* The device API: inside a capture a synchronous copy, a synchronize and an allocation fail and the
 * capture with them (as the real driver's thread-local mode has it); the legacy stream cannot be
 * captured; a captured launch runs only when its graph is launched, and each launch reads the buffers
 * as they are then. */
static void test_graph_api(void) {
    hr_error err = {0};
    hr_cuda_device *dev = NULL;
    CHECKF(hr_cuda_device_open(driver, 0, &dev, &err) == HR_OK, "%s", err.msg);
    if (!dev) return;
    if (!hr_cuda_graphs_available(dev)) {
        CHECKF(!driver, "the emulating driver has no graphs");
        hr_cuda_device_close(dev);
        return;
    }
    enum { N = 300 };
    float g[N], u[N], out[N];
    for (int i = 0; i < N; i++) g[i] = (float)(i % 17) * 0.25f - 2.0f, u[i] = 1.0f + (float)i * 0.01f;
    uint64_t dg = 0, du = 0, dout = 0, extra = 0;
    CHECK(hr_cuda_alloc(dev, sizeof g, &dg, &err) == HR_OK && hr_cuda_alloc(dev, sizeof u, &du, &err) == HR_OK &&
          hr_cuda_alloc(dev, sizeof out, &dout, &err) == HR_OK);
    CHECK(hr_cuda_upload(dev, dg, g, sizeof g, &err) == HR_OK && hr_cuda_upload(dev, du, u, sizeof u, &err) == HR_OK);
    /* each refused call: the call fails, then the capture does */
    for (int k = 0; k < 3; k++) {
        hr_cuda_graph *gr = NULL;
        CHECK(hr_cuda_graph_begin(dev, &err) == HR_OK);
        hr_status st = k == 0   ? hr_cuda_upload(dev, dg, g, sizeof g, &err)
                       : k == 1 ? hr_cuda_sync(dev, &err)
                                : hr_cuda_alloc(dev, 64, &extra, &err);
        CHECKF(st != HR_OK, "call %d inside a capture was allowed", k);
        /* the emulator invalidates the capture with each (the driver does for the copy and the
         * synchronize; whether for the allocation too is not documented, so not asked of it) */
        const bool ended = hr_cuda_graph_end(dev, &gr, &err) == HR_OK;
        CHECKF(!driver || (!ended && !gr), "capture %d survived a refused call", k);
        hr_cuda_graph_free(dev, gr);
    }
    /* the legacy stream, asked of the driver directly */
    void *lib = driver ? dlopen(driver, RTLD_NOW | RTLD_NOLOAD) : NULL;
    void *sym = lib ? dlsym(lib, "cuStreamBeginCapture_v2") : NULL;
    int (*begin)(void *, int) = NULL;
    memcpy(&begin, &sym, sizeof sym);
    if (begin) CHECK(begin(NULL, 1) != 0);
    if (lib) dlclose(lib);
    /* out = silu(g) u, captured: nothing runs until the graph does */
    uint64_t n = N;
    void *a[] = {&dout, &dg, &du, &n};
    hr_cuda_graph *gr = NULL;
    CHECK(hr_cuda_graph_begin(dev, &err) == HR_OK);
    CHECK(hr_cuda_launch(dev, "hr_k_swiglu", 2, 1, 256, a, &err) == HR_OK);
    CHECKF(hr_cuda_graph_end(dev, &gr, &err) == HR_OK && gr, "%s", err.msg);
    CHECK(hr_cuda_download(dev, out, dout, sizeof out, &err) == HR_OK);
    bool zeros = true;
    for (int i = 0; i < N; i++) zeros &= out[i] == 0.0f;
    CHECKF(zeros, "a captured launch ran before its graph");
    for (int rep = 0; rep < 2 && gr; rep++) {
        if (rep == 1) { /* new inputs in the same buffers: the replay reads them */
            for (int i = 0; i < N; i++) u[i] = -u[i];
            CHECK(hr_cuda_upload(dev, du, u, sizeof u, &err) == HR_OK);
        }
        CHECK(hr_cuda_graph_launch(dev, gr, &err) == HR_OK && hr_cuda_download(dev, out, dout, sizeof out, &err) == 0);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            const float want = g[i] / (1.0f + expf(-g[i])) * u[i];
            bad += fabsf(out[i] - want) > 1e-5f * (1.0f + fabsf(want));
        }
        CHECKF(bad == 0, "graph launch %d: %d of %d results wrong", rep, bad, N);
    }
    hr_cuda_graph_free(dev, gr);
    hr_cuda_free(dev, dout), hr_cuda_free(dev, du), hr_cuda_free(dev, dg);
    hr_cuda_device_close(dev);
    printf("graphs, device API: copies, synchronizes and allocations refused inside a capture; a replay reads its "
           "buffers anew\n");
}

#define GN 4  /* sequences at once */
#define GT 12 /* the most tokens one generates */

/* the requests: a 250-token prompt that grows past 256 (the context bucket goes from 256 to 512)
 * beside shorter ones, two of them under window policies and done after half the steps, so that the
 * later steps pass no window to attention */
static const int g_plen_all[GN] = {250, 40, 30, 5}, g_ntok[GN] = {GT, GT / 2, GT / 2, GT};
/* q4's: short prompts (the emulator's time), three of the four filling a block while decoding (at
 * positions 15, 31 and 15), so the replayed encode launches see different fills step to step */
static const int g_plen_q4[GN] = {14, 40, 30, 5};
static const char *const g_pol[GN] = {NULL, "window:16", "sinks:4,window:16", NULL};

/* GN greedy requests at once on rt, request i's prompt BOS then plen[i] - 1 ids (3 + (k mul + i add) %
 * 500), g_ntok[i] tokens under policy pol[i] (pol NULL: none), log-probabilities for request lp_req
 * (GN: every one, the top 2 of each step into top and lp), run until idle: their ids */
static void run_gn(hr_runtime *rt, const int plen[GN], int mul, int add, const char *const *pol, int lp_req,
                   int32_t ids[GN][GT], int32_t top[GN][GT * 2], float lp[GN][GT * 2]) {
    static int32_t prompt[GN][256];
    hr_rt_request *r[GN] = {0};
    hr_error err = {0};
    for (int i = 0; i < GN; i++) {
        prompt[i][0] = 1;
        for (int k = 1; k < plen[i]; k++) prompt[i][k] = 3 + (k * mul + i * add) % 500;
        hr_rt_request_params q = {.prompt_ids = prompt[i],
                                  .n_prompt_ids = plen[i],
                                  .max_tokens = g_ntok[i],
                                  .ignore_eos = true,
                                  .kv_policy = pol ? pol[i] : NULL,
                                  .logprobs = lp_req == GN || i == lp_req,
                                  .top_logprobs = lp_req == GN ? 2 : 0};
        q.sampling = hr_rt_sampling_default();
        q.sampling.temperature = 0;
        CHECKF(hr_runtime_submit(rt, &q, &r[i], &err) == HR_OK, "%s", err.msg);
    }
    CHECKF(hr_runtime_run_until_idle(rt, &err) == HR_OK, "%s", err.msg);
    for (int i = 0; i < GN; i++) {
        hr_rt_result res;
        hr_rt_request_result(r[i], &res);
        CHECKF(res.n_ids == g_ntok[i], "request %d gave %d ids", i, res.n_ids);
        memcpy(ids[i], res.ids, sizeof(int32_t) * (size_t)(res.n_ids < g_ntok[i] ? res.n_ids : g_ntok[i]));
        if (lp_req == GN) CHECK(hr_rt_request_logprobs(r[i], 0, g_ntok[i], NULL, top[i], lp[i]) == g_ntok[i]);
        hr_rt_request_release(rt, r[i]);
    }
}

/* the requests above at once, greedy, on a fresh runtime (graphs on where `graphs`): their ids and
 * the top-2 log-probabilities of each step */
static void graph_decode(bool graphs, hr_rt_kv_format kvf, int32_t ids[GN][GT], int32_t top[GN][GT * 2],
                         float lp[GN][GT * 2]) {
    /* and the emulator refuses the first capture: that step runs eagerly, the next captures */
    if (graphs) setenv("HEADROOM_CUDA_GRAPHS", "1", 1), setenv("HR_FAKE_CUDA_CAPTURE_FAIL", "1", 1);
    hr_runtime_params p = rt_params(HR_SOURCE_DIR "/models/stories260K-q8_0.gguf", "cuda", kvf);
    p.n_ctx = 512;
    p.kv_budget = 16u << 20;
    hr_runtime *rt = NULL;
    hr_error err = {0};
    CHECKF(hr_runtime_open(&p, &rt, NULL, &err) == HR_OK, "%s", err.msg);
    unsetenv("HEADROOM_CUDA_GRAPHS");
    if (!rt) {
        unsetenv("HR_FAKE_CUDA_CAPTURE_FAIL");
        return;
    }
    run_gn(rt, kvf == HR_RT_KV_Q4 ? g_plen_q4 : g_plen_all, 31, 7, g_pol, GN, ids, top, lp);
    hr_runtime_close(rt);
    unsetenv("HR_FAKE_CUDA_CAPTURE_FAIL");
}

/* Decode steps replayed as graphs give the eager steps' results bit for bit: the same kernels on the
 * same inputs (a step whose capture failed ran eagerly among them). The bucket only adds splits past every query's
 * context (one attention tile each in both runs here: the small model's few heads leave the split at a tile), which the
 * reduction skips. f16 KV, and q4 (each layer's encode launch replayed while different blocks fill from
 * step to step; short prompts). */
static void test_graph_decode(void) {
    static int32_t ids[2][GN][GT], top[2][GN][GT * 2];
    static float lp[2][GN][GT * 2];
    static const hr_rt_kv_format fmts[] = {HR_RT_KV_F16, HR_RT_KV_Q4};
    for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++) {
        const char *name = fmts[fi] == HR_RT_KV_Q4 ? "q4" : "f16";
        memset(ids, 0, sizeof ids);
        memset(top, 0, sizeof top);
        memset(lp, 0, sizeof lp);
        /* the driver held loaded across the runtimes, so its counters are not reset between them */
        void *lib = driver ? dlopen(driver, RTLD_NOW) : NULL;
        int c0[3] = {0}, c1[3] = {0};
        const bool counted = graph_counts(lib, c0);
        graph_decode(false, fmts[fi], ids[0], top[0], lp[0]);
        graph_counts(lib, c1);
        CHECKF(c1[1] == c0[1], "graphs launched with HEADROOM_CUDA_GRAPHS unset");
        graph_decode(true, fmts[fi], ids[1], top[1], lp[1]);
        graph_counts(lib, c1);
        const int captures = c1[0] - c0[0], launches = c1[1] - c0[1];
        const bool same = !memcmp(ids[0], ids[1], sizeof ids[0]) && !memcmp(top[0], top[1], sizeof top[0]) &&
                          !memcmp(lp[0], lp[1], sizeof lp[0]);
        CHECKF(same, "graphs, %s KV: ids or log-probabilities differ from the eager run's", name);
        if (counted && fmts[fi] == HR_RT_KV_Q4) { /* q4's short prompts cross no bucket: replays, none left */
            CHECKF(launches >= GT - 3 && c1[2] == c0[2], "graphs, q4 KV: %d graph launches, %d graphs left alive",
                   launches, c1[2] - c0[2]);
        } else if (counted) {
            /* GT - 1 decode steps after the prompts' step, less the one whose capture was refused; a
             * capture per key (batch size, bucket, window): 4 tokens with windows, 2 without at bucket
             * 256, then 512 */
            CHECKF(launches >= GT - 2 && captures >= 3 && captures * 2 < launches,
                   "graphs, %s KV: %d captures, %d graph launches", name, captures, launches);
            CHECKF(c1[2] == c0[2], "%d graphs left alive after close", c1[2] - c0[2]);
        }
        if (lib) dlclose(lib);
        printf("graphs, %s KV (windows%s): %d decode steps replayed from %d captures; ids and "
               "log-probabilities %s the eager run's\n",
               name, fmts[fi] == HR_RT_KV_Q4 ? ", blocks filled while replayed" : ", a bucket crossed", launches,
               captures, same ? "bit for bit" : "NOT equal to");
    }
}

/* ---- 6. greedy ids picked on the device ------------------------------------------------------------ */

/* the emulating driver's page-locked allocations alive now, or -1 (another driver, or none loaded) */
static int host_allocs_now(void *lib) {
    void *sym = lib ? dlsym(lib, "hr_fake_cuda_host_allocs") : NULL;
    int (*fn)(void) = NULL;
    memcpy(&fn, &sym, sizeof sym);
    return fn ? fn() : -1;
}

/* GN requests at once on the q8_0 model, greedy (request `lp_req` also asks for log-probabilities;
 * -1: none does), with HEADROOM_CUDA_ARGMAX=`argmax` (NULL: unset), graphs where `graphs` and the
 * logits rows page-locked where `pinned` (HEADROOM_CUDA_PINNED_LOGITS=1; host_allocs: the emulator's
 * page-locked allocations while it ran and after close, -1 elsewhere): their ids, and the engine's steps
 * whose ids the device picked */
static uint64_t argmax_decode(const char *argmax, bool graphs, bool pinned, int lp_req, int32_t ids[GN][GT],
                              int host_allocs[2]) {
    if (argmax) setenv("HEADROOM_CUDA_ARGMAX", argmax, 1);
    if (graphs) setenv("HEADROOM_CUDA_GRAPHS", "1", 1);
    if (pinned) setenv("HEADROOM_CUDA_PINNED_LOGITS", "1", 1);
    hr_runtime_params p = rt_params(HR_SOURCE_DIR "/models/stories260K-q8_0.gguf", "cuda", HR_RT_KV_F16);
    hr_runtime *rt = NULL;
    hr_error err = {0};
    CHECKF(hr_runtime_open(&p, &rt, NULL, &err) == HR_OK, "%s", err.msg);
    unsetenv("HEADROOM_CUDA_ARGMAX");
    unsetenv("HEADROOM_CUDA_GRAPHS");
    unsetenv("HEADROOM_CUDA_PINNED_LOGITS");
    if (!rt) return 0;
    void *lib = driver ? dlopen(driver, RTLD_NOW | RTLD_NOLOAD) : NULL; /* held past close, to count then */
    if (host_allocs) host_allocs[0] = host_allocs_now(lib);
    static const int plen[GN] = {9, 30, 17, 5};
    run_gn(rt, plen, 29, 11, NULL, lp_req, ids, NULL, NULL);
    hr_runtime_pool pool;
    hr_runtime_get_pool(rt, &pool);
    hr_runtime_close(rt);
    if (host_allocs) host_allocs[1] = host_allocs_now(lib);
    if (lib) dlclose(lib);
    return pool.engine.argmax_steps;
}

/* HEADROOM_CUDA_ARGMAX=device: the ids of greedy requests are those the logits copied to the host give,
 * with the device picking every step's (eager and replayed as graphs); a request asking for
 * log-probabilities takes the logits for the steps it is in, and its ids and the others' stay the same.
 * Unset, the device picks none; a value other than host or device is refused at open. */
static void test_device_argmax(void) {
    static int32_t ids[5][GN][GT];
    memset(ids, 0, sizeof ids);
    int pinned_allocs[2] = {0}, plain_allocs[2] = {0};
    const uint64_t host = argmax_decode(NULL, false, false, -1, ids[0], plain_allocs);
    const uint64_t dev = argmax_decode("device", false, false, -1, ids[1], NULL);
    const uint64_t graphed = argmax_decode("device", true, false, -1, ids[2], NULL);
    const uint64_t mixed = argmax_decode("device", false, false, 1, ids[3], NULL);
    /* the logits rows page-locked, a log-probabilities request among them: the rows come down into them */
    const uint64_t pinned = argmax_decode(NULL, false, true, 1, ids[4], pinned_allocs);
    CHECKF(host == 0 && pinned == 0, "HEADROOM_CUDA_ARGMAX unset: %llu and %llu steps picked on the device",
           (unsigned long long)host, (unsigned long long)pinned);
    CHECKF(plain_allocs[0] < 0 || (pinned_allocs[0] == plain_allocs[0] + 1 && pinned_allocs[1] == 0),
           "HEADROOM_CUDA_PINNED_LOGITS=1: %d page-locked allocations, %d without, %d after close", pinned_allocs[0],
           plain_allocs[0], pinned_allocs[1]);
    /* one step for the prompts, then GT - 1 decode steps; request 1 (GT / 2 tokens, log-probabilities in
     * the mixed run) is in the first GT / 2 of them */
    CHECKF(dev == GT && graphed == dev && mixed == GT - GT / 2,
           "device argmax steps: %llu, with graphs %llu, mixed %llu", (unsigned long long)dev,
           (unsigned long long)graphed, (unsigned long long)mixed);
    bool same = true;
    for (int k = 1; k < 5; k++) same = same && !memcmp(ids[0], ids[k], sizeof ids[0]);
    CHECKF(same, "device argmax: ids differ from the logits' greedy choice");
    setenv("HEADROOM_CUDA_ARGMAX", "gpu", 1);
    hr_runtime_params p = rt_params(HR_SOURCE_DIR "/models/stories260K-q8_0.gguf", "cuda", HR_RT_KV_F16);
    hr_runtime *rt = NULL;
    hr_error err = {0};
    CHECKF(hr_runtime_open(&p, &rt, NULL, &err) != HR_OK && strstr(err.msg, "HEADROOM_CUDA_ARGMAX is 'gpu'") &&
               strstr(err.msg, "host or device"),
           "HEADROOM_CUDA_ARGMAX=gpu: %s", rt ? "opened" : err.msg);
    unsetenv("HEADROOM_CUDA_ARGMAX");
    hr_runtime_close(rt);
    printf("device argmax: %llu steps' ids picked on the device (%llu with graphs; %llu with a log-probabilities "
           "request in the first %d); the %d requests' ids %s the logits' (copied to malloc'd and to page-locked "
           "rows)\n",
           (unsigned long long)dev, (unsigned long long)graphed, (unsigned long long)mixed, GT / 2, GN,
           same ? "equal" : "NOT equal to");
}

/* argv[1]: a driver library (the emulating one for ctest; none: libcuda.so.1, skipped without a GPU);
 * argv[2]: which half, "paths" (refusals, windows, the arena, the F32 vectors, the engine's paths, mma
 * prefill attention, the graphs, h2o and snapkv; "graphs", "policies": those alone) or
 * "quality" (agreement with the CPU: the q8_0 model's completions, the mixes, the corpus); both when
 * absent. ctest runs the halves as two tests so they run side by side. */
int main(int argc, char **argv) {
    driver = argc > 1 && argv[1][0] ? argv[1] : NULL;
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
        test_token_policies();
        return hr_test_finish();
    }
    if (!strcmp(part, "graphs")) { /* the graphs' checks alone (they are part of paths) */
        test_graph_api();
        test_graph_decode();
        test_device_argmax();
        return hr_test_finish();
    }
    if (paths) {
        test_refusals();
        test_windows();
        test_arena();
        test_host_weights();
        test_f32_vectors();
        test_engine_paths();
        test_token_policies();
        test_prefill_mma();
        test_graph_api();
        test_graph_decode();
        test_device_argmax();
    }
    if (quality) {
        agreement(HR_SOURCE_DIR "/models/stories260K-q8_0.gguf", HR_RT_KV_F16, "stories260K q8_0, f16 KV");
        agreement(HR_SOURCE_DIR "/models/stories260K-q8_0.gguf", HR_RT_KV_Q8, "stories260K q8_0, q8 KV");
        agreement(HR_SOURCE_DIR "/models/stories260K-q8_0.gguf", HR_RT_KV_BF16, "stories260K q8_0, bf16 KV");
        agreement(HR_SOURCE_DIR "/models/stories260K-q8_0.gguf", HR_RT_KV_FP8, "stories260K q8_0, fp8 KV");
        test_mixes();
        /* the whole corpus on a GPU; through the emulator its first chunk */
        /* kivi2 (the list's last) on a GPU only: the emulator's time (test_cuda_kernels checks its bytes) */
        test_corpus_agreement(hr_test_shared_path("models/stories260K.gguf"), "F32 model", driver ? 6 : 7, 1.0,
                              driver ? 1 : 0);
        /* the q8_0 model: a 256-token prefill multiplies on the tensor cores (x rounded to f16, where the
         * CPU quantizes it to q8_0): near-ties may part, so 97% (f16 KV) */
        test_corpus_agreement(HR_SOURCE_DIR "/models/stories260K-q8_0.gguf", "q8_0 model", 1, 0.98, driver ? 1 : 0);
    }
    return hr_test_finish();
}

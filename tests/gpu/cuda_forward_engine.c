/* cuda_forward_engine.c: test_gpu_cuda_forward's engine over the device storage (test_cuda_forward.c says
 * what the program is): preemption by swap and by recompute and a shared prompt prefix, the token-level
 * policies h2o and snapkv, against the CPU's ids; what the GPU refuses, in one line; window policies and a
 * model's own sliding window against the CPU's logits. */
#include <dlfcn.h>
#include <math.h>

#include "cuda_forward_test.h"

#include "backend/cuda/cuda.h"

/* Four 40-token completions of ../shared's prompts at once in a 7-block pool (16 tokens a block: two
 * sequences' worth), preempted as `mode` says, on the CPU and the GPU; then two requests sharing a
 * 20-token prompt prefix. Every id equal. */
static void run_paths(const ft_ctx *ft, const char *model, const char *device, hr_rt_preempt mode, hr_rt_kv_format kvf,
                      int32_t out[5][40], hr_rt_engine_stats *st) {
    hr_runtime_params p = rt_params(ft, model, device, kvf);
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
    void *lib = ft->driver && !strcmp(device, "cuda") ? dlopen(ft->driver, RTLD_NOW | RTLD_NOLOAD) : NULL;
    void *sym = lib ? dlsym(lib, "hr_fake_cuda_host_allocs") : NULL;
    int (*host_allocs)(void) = NULL;
    memcpy(&host_allocs, &sym, sizeof sym);
    if (host_allocs) CHECKF(host_allocs() == (mode == HR_RT_PREEMPT_SWAP), "%d page-locked tiers", host_allocs());
    hr_runtime_close(rt);
    if (host_allocs) CHECK(host_allocs() == 0);
    if (lib) dlclose(lib);
}

void test_engine_paths(const ft_ctx *ft) {
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
        run_paths(ft, model, "cpu", modes[m].mode, modes[m].kvf, cpu, &sc);
        run_paths(ft, model, "cuda", modes[m].mode, modes[m].kvf, gpu, &sg);
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
static void token_policy_run(const ft_ctx *ft, const char *model, const char *device, const char *pol, bool per_request,
                             int32_t out[2][24], int evicted[2], int kept[2]) {
    hr_runtime_params p = rt_params(ft, model, device, HR_RT_KV_F32);
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
void test_token_policies(const ft_ctx *ft) {
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
    token_policy_run(ft, model, "cpu", "full", true, full, ev_full, kept_full);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int32_t cpu[2][24] = {{0}}, gpu[2][24] = {{0}};
        int ev_cpu[2] = {0}, ev_gpu[2] = {0}, kept_cpu[2] = {0}, kept_gpu[2] = {0};
        token_policy_run(ft, model, "cpu", cases[c].pol, cases[c].per_request, cpu, ev_cpu, kept_cpu);
        setenv("HEADROOM_CUDA_TOKEN_SEQS", "1", 1);
        token_policy_run(ft, model, "cuda", cases[c].pol, cases[c].per_request, gpu, ev_gpu, kept_gpu);
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
static void refused_model(const ft_ctx *ft, const char *args, const char *name, const char *want) {
    char path[512], cmd[1200];
    snprintf(path, sizeof path, "%s/%s.gguf", hr_test_tmpdir(), name);
    snprintf(cmd, sizeof cmd, "'%s' synth %s -o '%s' > /dev/null 2>&1", HR_HEADROOM_BIN, args, path);
    CHECKF(system(cmd) == 0, "synth: %s", cmd);
    hr_error err = {0};
    hr_runtime *rt = open_rt(ft, path, "cuda", HR_RT_KV_F16, &err);
    CHECKF(!rt && strstr(err.msg, want) && !strchr(err.msg, '\n'), "%s on the GPU: %s", name, err.msg);
    hr_runtime_close(rt);
}

void test_refusals(const ft_ctx *ft) {
    const char *model = HR_SOURCE_DIR "/models/stories260K-q8_0.gguf";
    hr_error err = {0};
    /* q4h's measurement-only variants are the CPU's alone */
    setenv("HEADROOM_KV_Q4H_VARIANT", "sym", 1);
    hr_runtime *rt = open_rt(ft, model, "cuda", HR_RT_KV_Q4H, &err);
    unsetenv("HEADROOM_KV_Q4H_VARIANT");
    CHECKF(
        !rt &&
            strstr(err.msg,
                   "CUDA KV: the formats on the GPU are f32, f16, bf16, q8, fp8, q4, kivi2 and q4h (K q4h, V q4h)") &&
            !strchr(err.msg, '\n'),
        "q4h's sym variant on the GPU: %s", err.msg);
    hr_runtime_close(rt);
    /* the token-level KV policies are taken now (test_token_policies runs them) */
    hr_runtime_params pp = rt_params(ft, model, "cuda", HR_RT_KV_F16);
    pp.kv_policy = "h2o:64";
    rt = NULL;
    CHECKF(hr_runtime_open(&pp, &rt, NULL, &err) == HR_OK && rt, "h2o on the GPU: %s", err.msg);
    hr_runtime_close(rt);
    /* a batch past what the GEMV's grid rows take (grid.y at most 65535 on a GPU) */
    pp = rt_params(ft, model, "cuda", HR_RT_KV_F16);
    pp.max_batch_tokens = HR_CUDA_MAX_BATCH_TOKENS + 1;
    rt = NULL;
    CHECKF(hr_runtime_open(&pp, &rt, NULL, &err) != HR_OK && !rt &&
               strstr(err.msg, "max_batch_tokens 524281 is past 524280") && !strchr(err.msg, '\n'),
           "a batch of %d tokens on the GPU: %s", pp.max_batch_tokens, err.msg);
    hr_runtime_close(rt);
    /* families the kernels do not cover, and a weight type without a GEMV kernel, each named */
    refused_model(ft, "--shape gpt-oss-tiny --type f32", "gpt-oss-tiny",
                  "has attention sinks, which the GPU kernels do not cover yet");
    refused_model(ft, "--shape deepseek2-tiny --type f32", "deepseek2-tiny",
                  "CUDA KV: a latent cache (V read from K: deepseek2) is not supported yet");
    refused_model(ft, "--shape tiny --type mxfp4", "tiny-mxfp4",
                  "CUDA: blk.0.attn_q is mxfp4; the GPU's matrix kernels take");
}

/* every position's logits of tokens[0..n) under policy on the CPU and the GPU (one model, f32
 * weights and KV: the two compute alike), the largest difference */
static double score_diff(const ft_ctx *ft, const char *model, const char *policy, const char *gpu_policy, int n_ctx,
                         const int32_t *tokens, int n) {
    hr_error err = {0};
    hr_runtime_params p = rt_params(ft, model, "cpu", HR_RT_KV_F32);
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
void test_windows(const ft_ctx *ft) {
    const char *f32 = hr_test_shared_path("models/stories260K.gguf");
    int32_t toks[400];
    for (int i = 0; i < 400; i++) toks[i] = i == 0 ? 1 : 3 + (i * 37) % 500;
    if (f32) {
        static const char *const pols[] = {"window:24", "sinks:4,window:24", "window:100"};
        /* the check can fail: the GPU in full against the CPU's window differs */
        double full = score_diff(ft, f32, "window:24", "full", 256, toks, 160);
        CHECKF(full > 1e-2, "window:24 against full: logits only %g apart", full);
        for (size_t i = 0; i < sizeof pols / sizeof pols[0]; i++) {
            double d = score_diff(ft, f32, pols[i], pols[i], 256, toks, 160);
            CHECKF(d >= 0 && d < 1e-3, "policy %s on the GPU: logits %g from the CPU's", pols[i], d);
            printf("policy %s on the GPU: every logit within %.2g of the CPU's (160 tokens, F32 model)\n", pols[i], d);
        }
    }
    char path[512], cmd[1200];
    snprintf(path, sizeof path, "%s/mistral-tiny.gguf", hr_test_tmpdir());
    snprintf(cmd, sizeof cmd, "'%s' synth --shape mistral-tiny --type f32 -o '%s' > /dev/null 2>&1", HR_HEADROOM_BIN,
             path);
    CHECKF(system(cmd) == 0, "synth: %s", cmd);
    double d = score_diff(ft, path, NULL, NULL, 512, toks, 400);
    CHECKF(d >= 0 && d < 1e-3, "mistral-tiny's sliding window on the GPU: logits %g from the CPU's", d);
    printf("sliding window (mistral-tiny, 256 tokens) on the GPU: every logit of 400 positions within %.2g of the "
           "CPU's\n",
           d);
}

/* The families beside llama's on the GPU, each against the CPU's logits at every one of 400 positions
 * (f32 weights and KV): qwen2's Q/K/V biases, qwen3's per-head Q/K norms (heads of 32 where E / H is
 * 16), qwen3 under YaRN past its original 128 positions, phi3's fused QKV and gate-up matrices with
 * LongRoPE's long factors and magnitude (its original context 64), and the mixtures of experts:
 * qwen3moe-tiny (8 experts, 2 a token, with qwen3's norms) and mixtral-tiny (4, 2 a token), and gemma:
 * gemma2-tiny (window layers of 16 beside full ones: two KV layer groups; post norms, GeGLU, a scaled
 * embedding, soft caps on the scores and the logits), gemma3-tiny (five window layers to one full, with
 * their own RoPE base; Q/K norms) and gemma3-tiny-scaled (its full layers' linear RoPE scaling). The check
 * can fail: a bias or a norm left out, a factor missed, one expert routed or weighed otherwise, or a
 * layer reading another group's blocks moves the logits by far more than the bound. */
void test_families(const ft_ctx *ft) {
    static const char *const shapes[] = {"qwen2-tiny",  "qwen3-tiny",    "qwen3-tiny-yarn",
                                         "phi3-tiny",   "qwen3moe-tiny", "mixtral-tiny",
                                         "gemma2-tiny", "gemma3-tiny",   "gemma3-tiny-scaled"};
    int32_t toks[400];
    for (int i = 0; i < 400; i++) toks[i] = i == 0 ? 1 : 3 + (i * 37) % 500;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        char path[512];
        ft_synth(shapes[i], path, sizeof path);
        const double d = score_diff(ft, path, NULL, NULL, 512, toks, 400);
        CHECKF(d >= 0 && d < 1e-3, "%s on the GPU: logits %g from the CPU's", shapes[i], d);
        printf("%s on the GPU: every logit of 400 positions within %.2g of the CPU's\n", shapes[i], d);
    }
    /* the expert GEMV's grid has a row per (token, expert): a batch past 65,535 of them is refused */
    char path[512];
    ft_synth("mixtral-tiny", path, sizeof path);
    hr_runtime_params pp = rt_params(ft, path, "cuda", HR_RT_KV_F16);
    pp.max_batch_tokens = 40000;
    hr_runtime *rt = NULL;
    hr_error err = {0};
    CHECKF(hr_runtime_open(&pp, &rt, NULL, &err) != HR_OK && !rt &&
               strstr(err.msg, "max_batch_tokens 40000 is past 32767 for 2 experts a token") && !strchr(err.msg, '\n'),
           "a batch of 40,000 tokens of 2 experts each: %s", err.msg);
    hr_runtime_close(rt);
    /* several KV layer groups take the formats written as they come, not q4 / kivi2 yet: one line */
    ft_synth("gemma3-tiny", path, sizeof path);
    pp = rt_params(ft, path, "cuda", HR_RT_KV_Q4);
    rt = NULL;
    CHECKF(hr_runtime_open(&pp, &rt, NULL, &err) != HR_OK && !rt && strstr(err.msg, "not q4 or kivi2 yet") &&
               !strchr(err.msg, '\n'),
           "gemma3-tiny with q4 KV on the GPU: %s", err.msg);
    hr_runtime_close(rt);
}

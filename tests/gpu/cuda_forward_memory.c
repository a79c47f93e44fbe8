/* cuda_forward_memory.c: test_gpu_cuda_forward's memory (test_cuda_forward.c says what the program is):
 * the one device arena against the runtime's plan and the planner's, with --kv-budget and the budgets it
 * refuses; the host's copy of the weights, each matrix's pages given back once uploaded. */
#include <unistd.h>

#include "cuda_forward_test.h"

#include "backend/cuda/cuda.h"
#include "plan/plan.h"
#include "runtime/runtime_parts.h"

/* The one device arena: what the runtime reserves is what hr_cuda_arena_plan_compute says and what
 * the planner says for the same device, every piece of it taken at open (weights, scratch, KV blocks)
 * and nothing more; the KV pool fills what gpu_util leaves; --kv-budget, a budget that leaves no room
 * and a GPU whose memory another holder took each get their pool or one line. */
void test_arena(const ft_ctx *ft) {
    const char *model = HR_SOURCE_DIR "/models/stories260K-q8_0.gguf";
    hr_error err = {0};
    hr_cuda_device *dev = NULL;
    uint64_t fr = 0, tot = 0;
    CHECKF(hr_cuda_device_open(ft->driver, 0, &dev, &err) == HR_OK && hr_cuda_device_mem(dev, &fr, &tot, &err) == HR_OK,
           "%s", err.msg);
    if (!dev) return;
    /* the planner's view of it (plan --device cuda), taken while nothing is allocated */
    hr_plan_device gpu = {0};
    CHECKF(hr_plan_device_cuda(0, ft->driver, &gpu, &err) == HR_OK && gpu.gpu && gpu.mem_bytes == tot &&
               strstr(gpu.name, hr_cuda_device_name(dev)),
           "plan's device: %s", err.msg);
    /* about 1 GiB of whatever the GPU has (the emulated one has 1 GiB) */
    const double util = tot > (1ull << 30) ? (double)(1ull << 30) / (double)tot : 0.9;
    /* f16, then q4, whose f16 tail buffers the arena holds too; then qwen2-tiny's biases,
     * mixtral-tiny's experts (their stacks, the routing's and the slots' buffers) and gemma3-tiny's two
     * RoPE tables and KV layer groups (a set of slots, tables and windows each) */
    hr_runtime_params p;
    hr_runtime *rt = NULL;
    hr_rt_device_mem dm;
    char qwen2[512], mixtral[512], gemma3[512];
    ft_synth("qwen2-tiny", qwen2, sizeof qwen2);
    ft_synth("mixtral-tiny", mixtral, sizeof mixtral);
    ft_synth("gemma3-tiny", gemma3, sizeof gemma3);
    const struct {
        const char *model;
        hr_rt_kv_format kvf;
    } cases[] = {{model, HR_RT_KV_F16},
                 {model, HR_RT_KV_Q4},
                 {qwen2, HR_RT_KV_F16},
                 {mixtral, HR_RT_KV_F16},
                 {gemma3, HR_RT_KV_Q8}};
    for (size_t fi = 0; fi < sizeof cases / sizeof cases[0]; fi++) {
        const hr_rt_kv_format kvf = cases[fi].kvf;
        p = rt_params(ft, cases[fi].model, "cuda", kvf);
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
            /* the planner, for this GPU as its driver reported it before the runtime took its arena (plan
             * --device cuda) at this util: the same arena and pool */
            hr_plan_model pm;
            CHECKF(hr_plan_model_open(cases[fi].model, NULL, &pm, &err) == HR_OK, "%s", err.msg);
            hr_plan_device pd = gpu;
            pd.util = util;
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
                "arena, %s, %s KV: %.1f MiB of a %.1f MiB budget (weights %.1f KiB, scratch %.1f KiB, %d KV blocks); "
                "the planner's: %d blocks\n",
                strrchr(cases[fi].model, '/') + 1, hr_rt_kv_format_name(kvf), dm.arena_bytes / 1048576.0,
                dm.budget_bytes / 1048576.0, dm.weight_bytes / 1024.0, dm.scratch_bytes / 1024.0, kb->n_blocks,
                pl ? pl->gpu.n_blocks : -1);
            free(pl);
        }
        hr_runtime_close(rt);
    }
    p = rt_params(ft, model, "cuda", HR_RT_KV_F16);
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
            const uint64_t host = hr_cuda_host_scratch_bytes(hp, T, p.n_ctx, 16, 1, p.n_threads);
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
void test_host_weights(const ft_ctx *ft) {
    char path[512], cmd[1200];
    snprintf(path, sizeof path, "%s/host-weights-tiny-f32.gguf", hr_test_tmpdir());
    snprintf(cmd, sizeof cmd, "'%s' synth --shape tiny --type f32 -o '%s' > /dev/null 2>&1", HR_HEADROOM_BIN, path);
    CHECKF(system(cmd) == 0, "synth: %s", cmd);
    hr_error err = {0};
    hr_runtime *rt = open_rt(ft, path, "cuda", HR_RT_KV_F32, &err), *cpu = open_rt(ft, path, "cpu", HR_RT_KV_F32, &err);
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

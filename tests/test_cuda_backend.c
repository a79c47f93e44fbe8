/* test_cuda_backend.c: the CUDA backend's host side on a machine without a GPU. What can be checked
 * here, is: the device names (--device), every refusal's one line (no driver, a library that is not
 * the driver, no GPU, a GPU of another generation, a build without kernels), the embedded PTX (every
 * kernel there by name), and, through a fake driver library (tests/cuda/fake_libcuda.c: device memory
 * in host memory, launches that run nothing), the device KV storage's bytes against the CPU storage's,
 * block for block, in f16 and q8. The kernels' results are not checked here: tests/gpu/test_cuda_kernels.c does that
 * on a GPU (bench/gpu/check.sh). The CLI's --device lines are checked at the end. */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kv_storage_cpu.h"
#include "backend/cuda/cuda.h"
#include "harness.h"
#include "runtime/runtime.h"

/* the kernels kernels/ defines: each must be in the embedded PTX */
static const char *const k_kernels[] = {
    "hr_k_rmsnorm",      "hr_k_add_rmsnorm",   "hr_k_softmax",       "hr_k_rope",          "hr_k_swiglu",
    "hr_k_embed",        "hr_k_gemv_q8_0",     "hr_k_gemv_q4_0",     "hr_k_gemv_f32",      "hr_k_gemv_f16",
    "hr_k_gemv_bf16",    "hr_k_gemv_q4_K",     "hr_k_gemv_q5_K",     "hr_k_gemv_q6_K",     "hr_k_gemv_q5_0",
    "hr_k_gemv_q5_1",    "hr_k_attn_split",    "hr_k_attn_reduce",   "hr_k_kv_write",      "hr_k_attn_split_rows",
    "hr_k_gemm_bf16",    "hr_k_gemm_f16",      "hr_k_gemm_q8_0",     "hr_k_gemm_q4_0",     "hr_k_mma_selftest",
    "hr_k_attn_prefill", "hr_k_gemv_moe_q8_0", "hr_k_gemv_moe_q4_K", "hr_k_gemv_moe_bf16", "hr_k_moe_route",
    "hr_k_moe_sum",      "hr_k_geglu",         "hr_k_scale",         "hr_k_softcap"};
#define N_KERNELS (int)(sizeof k_kernels / sizeof k_kernels[0])

static void test_device_names(void) {
    static const struct {
        const char *text;
        hr_status st;
        int ordinal;
    } cases[] = {{NULL, HR_OK, -1},
                 {"cpu", HR_OK, -1},
                 {"cuda", HR_OK, 0},
                 {"cuda:0", HR_OK, 0},
                 {"cuda:7", HR_OK, 7},
                 {"cuda:255", HR_OK, 255},
                 {"cuda:256", HR_ERR_INVALID_ARG, 0},
                 {"cuda:", HR_ERR_INVALID_ARG, 0},
                 {"cuda:-1", HR_ERR_INVALID_ARG, 0},
                 {"cuda:1x", HR_ERR_INVALID_ARG, 0},
                 {"gpu", HR_ERR_INVALID_ARG, 0},
                 {"CPU", HR_ERR_INVALID_ARG, 0},
                 {"cuda0", HR_ERR_INVALID_ARG, 0},
                 {"", HR_ERR_INVALID_ARG, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int ord = 12345;
        hr_error e = {0};
        hr_status st = hr_rt_device_parse(cases[i].text, &ord, &e);
        CHECKF(st == cases[i].st, "'%s': status %d", cases[i].text ? cases[i].text : "(null)", st);
        if (st == HR_OK)
            CHECKF(ord == cases[i].ordinal, "'%s': ordinal %d", cases[i].text ? cases[i].text : "(null)", ord);
        else
            CHECKF(ord == 12345 && strstr(e.msg, "unknown device"), "'%s': %s", cases[i].text, e.msg);
    }
}

/* the dlopen failures: the library is absent, or is not the driver */
static void test_no_driver(void) {
    hr_error e = {0};
    CHECK(hr_cuda_probe("libheadroom-no-such-driver.so.1", 0, &e) == HR_ERR_UNSUPPORTED);
    CHECKF(!strcmp(e.msg, "CUDA: libheadroom-no-such-driver.so.1 not found (the NVIDIA driver is not installed)"), "%s",
           e.msg);
    CHECK(hr_cuda_probe("libm.so.6", 0, &e) == HR_ERR_UNSUPPORTED);
    CHECKF(!strcmp(e.msg, "CUDA: libm.so.6 has no cuInit (not the NVIDIA driver, or one too old)"), "%s", e.msg);
    /* the backend's create says the same, and makes nothing */
    hr_cuda_backend_params cp = {.ordinal = 0, .driver_lib = "libheadroom-no-such-driver.so.1"};
    hr_model_ctx_params mp = {.backend = &hr_backend_cuda, .backend_user = &cp};
    hr_model_ctx *ctx = (hr_model_ctx *)&cp; /* untouched on failure */
    CHECK(hr_model_ctx_create(NULL, NULL, &mp, &ctx, &e) == HR_ERR_UNSUPPORTED);
    CHECK(ctx == (hr_model_ctx *)&cp);
    CHECKF(strstr(e.msg, "CUDA: libheadroom-no-such-driver.so.1 not found") == e.msg, "%s", e.msg);
}

static void test_embedded_ptx(void) {
    int n = hr_cuda_n_modules();
    CHECKF(n == HR_CUDA_BUILT_KERNELS, "%d modules embedded, the build compiled %d", n, HR_CUDA_BUILT_KERNELS);
    CHECK(hr_cuda_module_ptx(n, NULL) == NULL && hr_cuda_module_ptx(-1, NULL) == NULL);
    for (int k = 0; k < N_KERNELS && n > 0; k++) {
        char want[96];
        snprintf(want, sizeof want, ".entry %s(", k_kernels[k]);
        int found = 0;
        for (int i = 0; i < n; i++) {
            const char *name = NULL, *ptx = hr_cuda_module_ptx(i, &name);
            CHECK(ptx && name && strstr(ptx, ".target sm_90a"));
            found += ptx && strstr(ptx, want) != NULL;
        }
        CHECKF(found == 1, "kernel %s in %d modules", k_kernels[k], found);
    }
}

static void set_mode(const char *m) {
    if (m)
        setenv("HR_FAKE_CUDA_MODE", m, 1);
    else
        unsetenv("HR_FAKE_CUDA_MODE");
}

/* the device checks, through the fake driver */
static void test_fake_device(void) {
    hr_error e = {0};
    set_mode("nodev");
    CHECK(hr_cuda_probe(HR_FAKE_CUDA_LIB, 0, &e) == HR_ERR_UNSUPPORTED);
    CHECKF(!strcmp(e.msg, "CUDA: no GPU found by the NVIDIA driver"), "%s", e.msg);
    set_mode("cc80");
    CHECK(hr_cuda_probe(HR_FAKE_CUDA_LIB, 0, &e) == HR_ERR_UNSUPPORTED);
    CHECKF(!strcmp(e.msg, "CUDA: Fake H100 has compute capability 8.0; the kernels are built for sm_90a (9.0)"), "%s",
           e.msg);
    set_mode(NULL);
    CHECK(hr_cuda_probe(HR_FAKE_CUDA_LIB, 1, &e) == HR_ERR_UNSUPPORTED);
    CHECKF(!strcmp(e.msg, "CUDA: no GPU 1 (this machine has 1)"), "%s", e.msg);
    hr_status st = hr_cuda_probe(HR_FAKE_CUDA_LIB, 0, &e);
    if (hr_cuda_n_modules() == 0) {
        CHECK(st == HR_ERR_UNSUPPORTED);
        CHECKF(!strcmp(e.msg, "CUDA: this build has no GPU kernels (clang-19 was not installed when it was built)"),
               "%s", e.msg);
        return;
    }
    CHECKF(st == HR_OK, "%s", e.msg);
    /* a driver older than the PTX's ISA version (clang-19 writes 8.5: CUDA 12.5) is named before the
     * modules fail to load; the version check itself at the release history's steps */
    int ma = 0, mi = 0, need = hr_cuda_ptx_min_driver(hr_cuda_module_ptx(0, NULL), &ma, &mi);
    CHECKF(need >= 12000 && need <= 12080, "PTX ISA %d.%d needs driver %d", ma, mi, need);
    CHECK(hr_cuda_ptx_min_driver(".version 8.5\n", NULL, NULL) == 12050);
    CHECK(hr_cuda_ptx_min_driver(".version 8.6\n", NULL, NULL) == 12070);
    CHECK(hr_cuda_ptx_min_driver(".version 9.0\n", NULL, NULL) == 13000);
    CHECK(hr_cuda_ptx_min_driver("no header", NULL, NULL) == 0);
    char old_driver[16];
    snprintf(old_driver, sizeof old_driver, "%d", need - 10);
    setenv("HR_FAKE_CUDA_DRIVER", old_driver, 1);
    CHECK(hr_cuda_probe(HR_FAKE_CUDA_LIB, 0, &e) == HR_ERR_UNSUPPORTED);
    CHECKF(strstr(e.msg, "which needs a CUDA") && strstr(e.msg, "driver or newer; this one is CUDA"), "%s", e.msg);
    unsetenv("HR_FAKE_CUDA_DRIVER");
    /* the backend opens the device, then wants a model and a KV pool on it (tests/gpu/test_cuda_forward.c
     * runs the forward pass through the emulating driver) */
    hr_cuda_backend_params cp = {.ordinal = 0, .driver_lib = HR_FAKE_CUDA_LIB};
    hr_model_ctx_params mp = {.backend = &hr_backend_cuda, .backend_user = &cp, .max_batch_tokens = 8, .max_ctx = 64};
    hr_model_ctx *ctx = NULL;
    CHECK(hr_model_ctx_create(NULL, NULL, &mp, &ctx, &e) == HR_ERR_INVALID_ARG && ctx == NULL);
    CHECKF(!strcmp(e.msg, "CUDA: Fake H100 opened; the forward pass needs a model and a KV pool on the GPU"), "%s",
           e.msg);
    /* every kernel is found by name in the loaded modules; an unknown one is not */
    hr_cuda_device *dev = NULL;
    CHECK(hr_cuda_device_open(HR_FAKE_CUDA_LIB, 0, &dev, &e) == HR_OK);
    if (!dev) return;
    CHECK(!strcmp(hr_cuda_device_name(dev), "Fake H100"));
    for (int k = 0; k < N_KERNELS; k++)
        CHECKF(hr_cuda_launch(dev, k_kernels[k], 1, 1, 256, NULL, &e) == HR_OK, "%s: %s", k_kernels[k], e.msg);
    /* a launch past a compute capability 9.0 GPU's limits (65535 grid rows, 1024 threads) fails, named */
    CHECK(hr_cuda_launch(dev, k_kernels[0], 1, 65536, 256, NULL, &e) == HR_ERR_UNSUPPORTED);
    CHECKF(strstr(e.msg, k_kernels[0]) != NULL, "%s", e.msg);
    CHECK(hr_cuda_launch(dev, k_kernels[0], 1, 65535, 1025, NULL, &e) == HR_ERR_UNSUPPORTED);
    CHECK(hr_cuda_launch(dev, k_kernels[0], 1, 65535, 1024, NULL, &e) == HR_OK);
    CHECK(hr_cuda_launch(dev, "hr_k_no_such_kernel", 1, 1, 256, NULL, &e) == HR_ERR_NOT_FOUND);
    CHECKF(!strcmp(e.msg, "CUDA: no kernel named hr_k_no_such_kernel in this build"), "%s", e.msg);
    uint64_t fr = 0, tot = 0;
    CHECK(hr_cuda_device_mem(dev, &fr, &tot, &e) == HR_OK && tot == (uint64_t)80 << 30);
    hr_cuda_device_close(dev);
}

static uint32_t rng = 12345;
static float frand(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)(int32_t)(rng >> 8 & 0xffff) / 16384.0f - 2.0f;
}

/* The device KV storage in the fake's host memory: its footprint, a write and an attention call are
 * the launches they should be, and whole-block write, read and copy move bytes unchanged. */
static void test_fake_kv_storage(hr_kv_format fmt) {
    if (hr_cuda_n_modules() == 0) return; /* the device does not open without kernels (checked above) */
    hr_error e = {0};
    set_mode(NULL);
    hr_cuda_device *dev = NULL;
    CHECK(hr_cuda_device_open(HR_FAKE_CUDA_LIB, 0, &dev, &e) == HR_OK);
    if (!dev) return;
    enum { L = 2, HKV = 2, D = 32, B = 4, NB = 3 };
    hr_kv_storage_params p = {
        .n_layers = L, .n_kv_heads = HKV, .head_dim = D, .block_size = B, .n_blocks = NB, .isa = "scalar"};
    CHECK(kv_fmt_init(&p.k, fmt, KV_K, B, D, &e) == HR_OK && kv_fmt_init(&p.v, fmt, KV_V, B, D, &e) == HR_OK);
    hr_kv_storage *gpu = NULL, *cpu = NULL;
    CHECKF(hr_kv_storage_cuda_create(dev, &p, &gpu, &e) == HR_OK, "%s", e.msg);
    CHECKF(hr_kv_storage_cpu_create(&p, &cpu, &e) == HR_OK, "%s", e.msg);
    if (!gpu || !cpu) goto out;
    size_t bb = (size_t)L * HKV * (p.k.head_bytes + p.v.head_bytes);
    CHECK(gpu->ops->footprint(gpu) == (uint64_t)bb * NB);
    /* a write is one launch of the device encoder (its bytes against the CPU's: test_cuda_kernels,
     * where the emulating driver runs it) */
    void *fake = dlopen(HR_FAKE_CUDA_LIB, RTLD_NOW);
    int (*launches)(void) = NULL;
    void *sym = fake ? dlsym(fake, "hr_fake_cuda_launches") : NULL;
    memcpy(&launches, &sym, sizeof sym);
    if (launches) {
        int before = launches();
        float k[HKV * D], v[HKV * D];
        for (int i = 0; i < HKV * D; i++) k[i] = frand(), v[i] = frand();
        gpu->ops->write(gpu, 1, 2, 3, -1, k, v);
        CHECK(launches() == before + 1);
        CHECK(hr_kv_storage_cuda_check(gpu, &e) == HR_OK);
    }
    unsigned char *a = calloc(1, bb), *b = calloc(1, bb), *c = calloc(1, bb);
    if (a && b && c) {
        for (size_t i = 0; i < bb; i++) c[i] = (unsigned char)(i * 7 + 3);
        gpu->ops->write_block(gpu, 2, c);
        gpu->ops->copy_block(gpu, 2, 0);
        gpu->ops->read_block(gpu, 0, a);
        CHECK(memcmp(a, c, bb) == 0);
        gpu->ops->read_block(gpu, 1, a);
        cpu->ops->read_block(cpu, 1, b);
        CHECK(memcmp(a, b, bb) == 0); /* block 1 untouched by the copy */
    }
    free(a);
    free(b);
    free(c);
    /* attend launches hr_k_attn_split and hr_k_attn_reduce once each for the whole batch (the fake runs
     * nothing) */
    if (launches) {
        int before = launches();
        int32_t table[2] = {1, 0};
        float q[2][4 * D], o[2][4 * D];
        for (int i = 0; i < 4 * D; i++) q[0][i] = q[1][i] = frand(), o[0][i] = o[1][i] = 9.0f;
        hr_kv_attn_query qs[2] = {{.table = table, .n_ctx = 6, .tail_stage = -1, .q = q[0], .out = o[0]},
                                  {.table = table, .n_ctx = 3, .tail_stage = -1, .q = q[1], .out = o[1]}};
        hr_kv_attn_args args = {.n_heads = 4, .scale = 0.125f};
        gpu->ops->attend(gpu, 1, qs, 2, &args, NULL);
        CHECK(launches() == before + 2);
        CHECK(hr_kv_storage_cuda_check(gpu, &e) == HR_OK);
        CHECK(o[0][0] == 0.0f && o[1][4 * D - 1] == 0.0f); /* the fake's output memory: zeros, copied down */
        /* a batch of 18 rows whose 1..16 are one run: split, every row on the split kernels (2 launches);
         * mma, the stretches [0, 1) and [17, 18) on them (2 each) and the run on hr_k_attn_prefill (1) */
        int32_t qrow[18], pos[18], runs[4 * 18];
        for (int i = 0; i < 18; i++) qrow[i] = i >= 1 && i <= 16 ? 1 : i == 0 ? 0 : 2, pos[i] = i;
        const int n_runs = hr_cuda_attn_runs(qrow, pos, 18, hr_cuda_prefill_tile_rows(4, HKV), runs);
        CHECK(n_runs == 1 && runs[0] == 1 && runs[1] == 16 && runs[2] == 1 && runs[3] == 1);
        uint64_t buf = 0;
        CHECK(hr_cuda_alloc(dev, 1u << 16, &buf, &e) == HR_OK);
        for (int k = 0; k < 2 && buf; k++) {
            CHECK(hr_kv_storage_cuda_set_prefill_attn(gpu, k ? "mma" : "split", &e) == HR_OK);
            before = launches();
            CHECK(hr_kv_storage_cuda_attend_runs(gpu, 1, buf, buf, 8, buf, buf, 0, 0, 18, 32, 4, 0.125f, 0.0f, runs,
                                                 buf, n_runs, NULL, buf, buf, &e) == HR_OK);
            CHECKF(launches() == before + (k ? 5 : 2), "prefill attention %s: %d launches", k ? "mma" : "split",
                   launches() - before);
        }
        /* a tile of more rows than a block takes is refused, nothing launched */
        runs[1] = 65; /* G 2: 64 rows a tile at most */
        before = launches();
        CHECK(hr_kv_storage_cuda_attend_runs(gpu, 1, buf, buf, 8, buf, buf, 0, 0, 40, 32, 4, 0.125f, 0.0f, runs, buf, 1,
                                             NULL, buf, buf, &e) == HR_ERR_INVALID_ARG &&
              launches() == before);
        hr_cuda_free(dev, buf);
    }
    if (fake) dlclose(fake);
    /* a deferred format needs its tail buffers (stages), and only it has them */
    hr_kv_storage_params pq = p;
    CHECK(kv_fmt_init(&pq.k, HR_KV_Q4, KV_K, B, D, &e) == HR_OK);
    hr_kv_storage *bad = NULL;
    CHECK(hr_kv_storage_cuda_create(dev, &pq, &bad, &e) == HR_ERR_INVALID_ARG && !bad);
    CHECKF(strstr(e.msg, "q4 and kivi2 need stages"), "%s", e.msg);
    pq.n_stage = 2;
    CHECKF(hr_kv_storage_cuda_create(dev, &pq, &bad, &e) == HR_OK && bad, "%s", e.msg);
    if (bad) {
        CHECK(bad->ops->footprint(bad) ==
              (uint64_t)L * HKV * (pq.k.head_bytes + pq.v.head_bytes) * NB + 2ull * L * 2 * HKV * B * D * 2);
        bad->ops->destroy(bad);
    }
    bad = NULL;
    pq = p;
    pq.n_stage = 1;
    CHECK(hr_kv_storage_cuda_create(dev, &pq, &bad, &e) == HR_ERR_INVALID_ARG && !bad);
    CHECKF(strstr(e.msg, "stages are for q4 and kivi2"), "%s", e.msg);
    pq = p;
    /* q4h is taken, its measurement-only variants (unrotated keys) are not */
    CHECK(kv_fmt_init(&pq.k, HR_KV_Q4H, KV_K, B, D, &e) == HR_OK);
    CHECK(kv_fmt_init(&pq.v, HR_KV_Q4H, KV_V, B, D, &e) == HR_OK);
    CHECKF(hr_kv_storage_cuda_create(dev, &pq, &bad, &e) == HR_OK && bad, "%s", e.msg);
    if (bad) bad->ops->destroy(bad);
    bad = NULL;
    setenv("HEADROOM_KV_Q4H_VARIANT", "norot", 1);
    CHECK(kv_fmt_init(&pq.k, HR_KV_Q4H, KV_K, B, D, &e) == HR_OK);
    unsetenv("HEADROOM_KV_Q4H_VARIANT");
    CHECK(hr_kv_storage_cuda_create(dev, &pq, &bad, &e) == HR_ERR_UNSUPPORTED && !bad);
out:
    if (gpu) gpu->ops->destroy(gpu);
    if (cpu) cpu->ops->destroy(cpu);
    hr_cuda_device_close(dev);
}

/* exactly one line on stderr, equal to want (or, where a driver is installed, beginning with
 * want_prefix: a GPU machine gets further and is still refused today) */
static void check_cli(const char *args, int want_rc, const char *want, const char *want_prefix) {
    char *out = NULL, *err = NULL;
    int rc = hr_test_run_cli(args, &out, &err);
    CHECKF(rc == want_rc, "headroom %s: exit %d", args, rc);
    const char *nl = err ? strchr(err, '\n') : NULL;
    CHECKF(nl && nl[1] == '\0', "headroom %s: not one line: %s", args, err ? err : "(none)");
    if (want)
        CHECKF(err && !strncmp(err, want, strlen(want)) && nl == err + strlen(want), "headroom %s: %s", args, err);
    if (want_prefix) CHECKF(err && !strncmp(err, want_prefix, strlen(want_prefix)), "headroom %s: %s", args, err);
    CHECKF(out && !out[0], "headroom %s printed on stdout: %s", args, out);
    free(out);
    free(err);
}

/* kv_blocks of `headroom plan ARGS --json`'s GPU arena; -1 when absent */
static long plan_blocks(const char *args, char **name) {
    char cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, "plan -m %s/models/stories260K-q8_0.gguf --ctx 256 --json %s", HR_SOURCE_DIR, args);
    long blocks = -1;
    if (hr_test_run_cli(cmd, &out, NULL) == 0 && out) {
        const char *a = strstr(out, "\"gpu_arena\""), *k = a ? strstr(a, "\"kv_blocks\":") : NULL;
        if (k) blocks = strtol(k + strlen("\"kv_blocks\":"), NULL, 10);
        const char *n = strstr(out, "\"name\": \""), *e = n ? strchr(n + 9, '"') : NULL;
        if (name && e) *name = strndup(n + 9, (size_t)(e - n - 9));
    }
    free(out);
    return blocks;
}

/* plan --device cuda through the fake driver, given an H100's name and memory: the card's name and
 * profile (the driver's name picks h100-80gb's bandwidth), and the arena's blocks those of plan --device
 * h100-80gb, the same memory at the same util */
static void test_plan_fake_gpu(void) {
    setenv("HEADROOM_CUDA_DRIVER", HR_FAKE_CUDA_LIB, 1);
    setenv("HR_FAKE_CUDA_NAME", "NVIDIA H100 80GB HBM3", 1);
    setenv("HR_FAKE_CUDA_MEM", "85520809984", 1); /* 81,559 MiB: what nvidia-smi shows for the SXM part */
    char *name = NULL;
    const long here = plan_blocks("--device cuda", &name), prof = plan_blocks("--device h100-80gb", NULL);
    CHECKF(here > 0 && here == prof, "plan --device cuda: %ld blocks; --device h100-80gb: %ld", here, prof);
    CHECKF(name && !strcmp(name, "NVIDIA H100 80GB HBM3 (cuda:0)"), "plan --device cuda: device '%s'",
           name ? name : "(none)");
    free(name);
    char *out = NULL;
    CHECK(hr_test_run_cli("plan -m " HR_SOURCE_DIR "/models/stories260K-q8_0.gguf --device cuda", &out, NULL) == 0 &&
          out && strstr(out, "bandwidth 3350 GB/s"));
    free(out);
    setenv("HR_FAKE_CUDA_NAME", "NVIDIA H100 PCIe", 1); /* no profile: the memory, no bandwidth */
    out = NULL;
    CHECK(hr_test_run_cli("plan -m " HR_SOURCE_DIR "/models/stories260K-q8_0.gguf --device cuda", &out, NULL) == 0 &&
          out && strstr(out, "bandwidth unknown (--device-bw GBPS)"));
    free(out);
    printf("plan --device cuda (the fake driver as an H100): %ld blocks, as plan --device h100-80gb's\n", here);
    unsetenv("HR_FAKE_CUDA_NAME");
    unsetenv("HR_FAKE_CUDA_MEM");
    unsetenv("HEADROOM_CUDA_DRIVER");
}

static void test_cli(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    bool driver = h != NULL;
    if (h) dlclose(h);
    const char *no_driver = "CUDA: libcuda.so.1 not found (the NVIDIA driver is not installed)";
    char run[256], serve[256];
    snprintf(run, sizeof run, "headroom run: %s", no_driver);
    snprintf(serve, sizeof serve, "headroom serve: %s", no_driver);
    check_cli("run --device cuda -p hi", 1, driver ? NULL : run, driver ? "headroom run: CUDA: " : NULL);
    check_cli("run --device cuda:1 -p hi -n 2", 1, driver ? NULL : run, driver ? "headroom run: CUDA: " : NULL);
    check_cli("serve --device cuda --port 0", 1, driver ? NULL : serve, driver ? "headroom serve: CUDA: " : NULL);
    char ev[256];
    snprintf(ev, sizeof ev, "headroom eval: %s", no_driver);
    check_cli("eval --device cuda -m " HR_SOURCE_DIR "/models/stories260K-q8_0.gguf " HR_SOURCE_DIR "/README.md", 1,
              driver ? NULL : ev, driver ? "headroom eval: CUDA: " : NULL);
    check_cli("run --device tpu -p hi", 2, "headroom run: --device: unknown device 'tpu' (cpu, cuda or cuda:N)", NULL);
    /* plan --device cuda[:N]: this machine's GPU, through the driver */
    char pl[256];
    snprintf(pl, sizeof pl, "headroom plan: %s", no_driver);
    check_cli("plan --device cuda -m " HR_SOURCE_DIR "/models/stories260K-q8_0.gguf", 1, driver ? NULL : pl,
              driver ? "headroom plan: CUDA: " : NULL);
    check_cli("plan --device cuda:x -m " HR_SOURCE_DIR "/models/stories260K-q8_0.gguf", 2,
              "headroom plan: unknown device 'cuda:x' (cuda or cuda:N: this machine's GPU; --help lists the others)",
              NULL);
    test_plan_fake_gpu();
    /* --device cpu is the default, token for token */
    char *a = NULL, *b = NULL;
    CHECK(hr_test_run_cli("run -p 'Once upon' -n 12 --temp 0", &a, NULL) == 0);
    CHECK(hr_test_run_cli("run --device cpu -p 'Once upon' -n 12 --temp 0", &b, NULL) == 0);
    CHECKF(a && b && a[0] && !strcmp(a, b), "--device cpu: '%s' vs the default's '%s'", b, a);
    free(a);
    free(b);
    char *help = NULL;
    CHECK(hr_test_run_cli("run --help", &help, NULL) == 0 && help && strstr(help, "--device D"));
    free(help);
}

int main(void) {
    /* the CLI checks below are of a machine without the driver: a driver named in the environment
     * (bench/gpu/check.sh's dry run names the emulating one) must not reach them */
    unsetenv("HEADROOM_CUDA_DRIVER");
    test_device_names();
    test_no_driver();
    test_embedded_ptx();
    test_fake_device();
    test_fake_kv_storage(HR_KV_F16);
    test_fake_kv_storage(HR_KV_Q8);
    test_cli();
    return hr_test_finish();
}

/* cuda_kernels_limits.c: test_gpu_cuda_kernels's checks of the emulating driver itself (test_cuda_kernels.c
 * says what the program is), run only when argv[1] names it: its barriers and shuffles, the alignment it
 * enforces, the launch limits it refuses past, the PTX versions it takes. */
#include <dlfcn.h>

#include "cuda_kernels_test.h"

/* The driver's launch limits (fake_libcuda.c's, a compute capability 9.0 GPU's): each shape one past a
 * limit is refused with CUDA_ERROR_INVALID_VALUE (1) and its reason, and the same launch at the limit
 * runs (fn: the emulating driver's handle of a self-test kernel) */
static void test_launch_limits(void *h, void (*fn)(void **)) {
    void *l = dlsym(h, "cuLaunchKernel"), *s = dlsym(h, "cuGetErrorString");
    CHECKF(l && s, "the driver has no cuLaunchKernel / cuGetErrorString");
    if (!l || !s) return;
    int (*launch_k)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **,
                    void **);
    int (*err_str)(int, const char **);
    void *f;
    memcpy(&launch_k, &l, sizeof l), memcpy(&err_str, &s, sizeof s), memcpy(&f, &fn, sizeof fn);
    static const struct {
        unsigned g[3], b[3], shared;
        const char *why;
    } bad[] = {
        {{1, 1, 1}, {1025, 1, 1}, 0, "a block dimension"},
        {{1, 1, 1}, {32, 32, 2}, 0, "more than 1024 threads"},
        {{1, 1, 1}, {1, 1, 65}, 0, "a block dimension"},
        {{1, 65536, 1}, {64, 1, 1}, 0, "a grid dimension"},
        {{1, 1, 65536}, {64, 1, 1}, 0, "a grid dimension"},
        {{0x80000000u, 1, 1}, {64, 1, 1}, 0, "a grid dimension"},
        {{1, 0, 1}, {64, 1, 1}, 0, "a dimension is 0"},
        {{1, 1, 1}, {0, 1, 1}, 0, "a dimension is 0"},
        {{1, 1, 1}, {64, 1, 1}, (48u << 10) + 1, "48 KiB of dynamic shared"},
    };
    static float out[64 + 1024]; /* the self-test writes out[t] and out[64 + t] */
    float *o = out;
    void *args[] = {&o};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = launch_k(f, bad[i].g[0], bad[i].g[1], bad[i].g[2], bad[i].b[0], bad[i].b[1], bad[i].b[2],
                          bad[i].shared, NULL, args, NULL);
        const char *why = "";
        err_str(rc, &why);
        CHECKF(rc == 1 && strstr(why, bad[i].why), "launch limit %zu: rc %d, %s", i, rc, why);
    }
    /* at the limits that the emulator runs (1-D blocks): 1024 threads, a grid of 2 x 2, 48 KiB asked */
    int rc = launch_k(f, 2, 2, 1, 1024, 1, 1, 48u << 10, NULL, args, NULL);
    CHECKF(rc == 0, "a launch at the limits refused: rc %d", rc);
}

/* The emulating driver's own semantics, which the checks above rely on (its self-test kernels,
 * tests/cuda/emu_kernels.cc, launched directly): a barrier that can never open ends the launch with an
 * error naming it, lanes that leave count as arrived at their warp's shuffles, a misaligned vector load
 * fails the launch, and a launch past the hardware's limits is refused. */
void test_emulator(const char *lib) {
    void *h = dlopen(lib, RTLD_NOW);
    void *k = h ? dlsym(h, "hr_emu_kernel") : NULL, *l = h ? dlsym(h, "hr_emu_launch") : NULL;
    CHECKF(k && l, "%s has no hr_emu_kernel / hr_emu_launch", lib);
    if (!k || !l) {
        if (h) dlclose(h);
        return;
    }
    typedef void (*kernel_fn)(void **);
    kernel_fn (*find)(const char *);
    int (*emu_launch)(kernel_fn, void **, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, char *, size_t);
    memcpy(&find, &k, sizeof k);
    memcpy(&emu_launch, &l, sizeof l);
    float out[128] = {0}, *o = out;
    void *args[] = {&o};
    char why[256] = "";
    int rc = emu_launch(find("hr_emu_selftest_divergent"), args, 1, 1, 1, 32, 1, 1, why, sizeof why);
    CHECKF(rc == 1 && strstr(why, "16 threads wait at __syncthreads and 16 at a warp shuffle, 0 finished: a barrier "
                                  "that never opens"),
           "a divergent barrier: rc %d, %s", rc, why);
    rc = emu_launch(find("hr_emu_selftest_early_exit"), args, 1, 1, 1, 64, 1, 1, why, sizeof why);
    bool ok = rc == 0;
    for (int t = 0; t < 64; t++)
        if (t % 32 < 16) ok &= out[t] == (float)t && out[64 + t] == (float)(t ^ 1);
    CHECKF(ok, "lanes leaving a shuffle: rc %d, %s", rc, why);
    /* a 16-byte load 4 bytes past a 16-byte boundary fails the launch (a GPU's misaligned-address
     * fault); at the boundary it reads */
    static _Alignas(16) float buf[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    float *bp = buf;
    int off = 1;
    void *margs[] = {&bp, &off};
    rc = emu_launch(find("hr_emu_selftest_misaligned"), margs, 1, 1, 1, 32, 1, 1, why, sizeof why);
    CHECKF(rc == 2 && strstr(why, "a 16-byte access at") && strstr(why, "not 16-byte aligned"),
           "a misaligned load: rc %d, %s", rc, why);
    off = 4;
    rc = emu_launch(find("hr_emu_selftest_misaligned"), margs, 1, 1, 1, 32, 1, 1, why, sizeof why);
    CHECKF(rc == 0 && buf[0] == 4.0f && buf[3] == 7.0f, "an aligned load: rc %d, %s", rc, why);
    /* a float * argument 2 bytes off a float: refused as the launch starts, before any load */
    bp = (float *)(void *)((char *)buf + 2);
    off = 0;
    rc = emu_launch(find("hr_emu_selftest_misaligned"), margs, 1, 1, 1, 32, 1, 1, why, sizeof why);
    CHECKF(rc == 2 && strstr(why, "a 4-byte access at"), "a misaligned pointer argument: rc %d, %s", rc, why);
    test_launch_limits(h, find("hr_emu_selftest_early_exit"));
    /* PTX newer than the driver (the emulating one is CUDA 12.8: ISA 8.7 at most) is refused as a real
     * driver refuses it (CUDA_ERROR_UNSUPPORTED_PTX_VERSION) */
    void *ml = dlsym(h, "cuModuleLoadData");
    int (*load)(void **, const void *);
    memcpy(&load, &ml, sizeof ml);
    void *mod = NULL;
    CHECK(ml && load(&mod, ".version 8.8\n.target sm_90a\n.visible .entry hr_k_embed(\n") == 222);
    CHECK(ml && load(&mod, ".version 8.7\n.target sm_90a\n.visible .entry hr_k_embed(\n") == 0);
    dlclose(h);
}

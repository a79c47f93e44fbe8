/* fake_libcuda.c: a stand-in for the NVIDIA driver library (libcuda.so.1), built as a shared library
 * for test_cuda_backend, so the CUDA backend's host side (dlopen, symbol lookup, device checks,
 * module loading, kernel lookup by name, device memory) runs on a machine without a GPU. Device
 * memory is host memory (fresh mappings: zeros); a launch runs nothing and only counts. HR_FAKE_CUDA_MODE picks the
 * machine: unset: one compute capability 9.0 GPU; "nodev": the driver sees no GPU; "cc80": an 8.0 GPU. The ABI is the
 * driver API's documented one, as backend/cuda/cuda_driver.h declares it.
 *
 * Built with HR_FAKE_CUDA_EMU (the hr_emu_cuda library), a launch runs the kernel: the kernels' own
 * source compiled for the host (emu_kernels.cc), each GPU thread a fiber (emu_rt.c). A module whose
 * PTX has an entry with no emulation is refused, naming it. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#ifdef HR_FAKE_CUDA_EMU
#include "emu_rt.h"
static char emu_why[256]; /* the last emulation failure, for cuGetErrorString */
#endif

typedef unsigned long long ptr_t;

int cuInit(unsigned flags);
int cuDriverGetVersion(int *v);
int cuGetErrorString(int r, const char **s);
int cuDeviceGetCount(int *n);
int cuDeviceGet(int *d, int ordinal);
int cuDeviceGetName(char *name, int len, int d);
int cuDeviceGetAttribute(int *v, int attr, int d);
int cuCtxCreate_v2(void **c, unsigned flags, int d);
int cuCtxDestroy_v2(void *c);
int cuCtxSetCurrent(void *c);
int cuCtxSynchronize(void);
int cuModuleLoadData(void **m, const void *image);
int cuModuleUnload(void *m);
int cuModuleGetFunction(void **f, void *m, const char *name);
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void *stream, void **params, void **extra);
int cuMemAlloc_v2(ptr_t *p, size_t bytes);
int cuMemFree_v2(ptr_t p);
int cuMemcpyHtoD_v2(ptr_t dst, const void *src, size_t n);
int cuMemcpyDtoH_v2(void *dst, ptr_t src, size_t n);
int cuMemcpyDtoD_v2(ptr_t dst, ptr_t src, size_t n);
int cuMemsetD8_v2(ptr_t dst, unsigned char v, size_t n);
int cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes);
int cuMemHostAlloc(void **p, size_t bytes, unsigned flags);
int cuMemFreeHost(void *p);
int cuEventCreate(void **e, unsigned flags);
int cuEventDestroy_v2(void *e);
int cuEventRecord(void *e, void *stream);
int cuEventSynchronize(void *e);
int cuEventElapsedTime(float *ms, void *start, void *end);
int hr_fake_cuda_launches(void);

static int launches;

static const char *mode(void) {
    const char *m = getenv("HR_FAKE_CUDA_MODE");
    return m ? m : "";
}

int cuInit(unsigned flags) { return strcmp(mode(), "nodev") == 0 ? 100 : 0; /* CUDA_ERROR_NO_DEVICE */ }
int cuDriverGetVersion(int *v) {
    *v = 12040;
    return 0;
}
int cuGetErrorString(int r, const char **s) {
    *s = r == 500 ? "named symbol not found" : "fake driver error";
#ifdef HR_FAKE_CUDA_EMU
    if ((r == 200 || r == 719) && emu_why[0]) *s = emu_why; /* a module or a launch the emulator refused */
#endif
    return 0;
}
int cuDeviceGetCount(int *n) {
    *n = 1;
    return 0;
}
int cuDeviceGet(int *d, int ordinal) {
    *d = ordinal;
    return ordinal == 0 ? 0 : 101; /* CUDA_ERROR_INVALID_DEVICE */
}
int cuDeviceGetName(char *name, int len, int d) {
#ifdef HR_FAKE_CUDA_EMU
    strncpy(name, "CPU emulation of a compute capability 9.0 GPU", (size_t)len);
#else
    strncpy(name, "Fake H100", (size_t)len);
#endif
    return 0;
}
int cuDeviceGetAttribute(int *v, int attr, int d) {
    bool cc80 = strcmp(mode(), "cc80") == 0;
    *v = attr == 75 ? (cc80 ? 8 : 9) : 0;
    return 0;
}
int cuCtxCreate_v2(void **c, unsigned flags, int d) {
    *c = (void *)&launches;
    return 0;
}
int cuCtxDestroy_v2(void *c) { return 0; }
int cuCtxSetCurrent(void *c) { return 0; }
int cuCtxSynchronize(void) { return 0; }
/* a module is its PTX text; one with no kernel entry is refused as the driver refuses a bad image */
int cuModuleLoadData(void **m, const void *image) {
    if (!strstr(image, ".entry ")) return 200; /* CUDA_ERROR_INVALID_IMAGE */
#ifdef HR_FAKE_CUDA_EMU
    for (const char *e = strstr(image, ".entry "); e; e = strstr(e + 1, ".entry ")) {
        char name[128];
        if (sscanf(e, ".entry %127[A-Za-z0-9_]", name) == 1 && !hr_emu_kernel(name)) {
            snprintf(emu_why, sizeof emu_why, "kernel %s has no emulation (list it in tests/cuda/emu_kernels.cc)",
                     name);
            return 200;
        }
    }
#endif
    *m = (void *)image;
    return 0;
}
int cuModuleUnload(void *m) { return 0; }
int cuModuleGetFunction(void **f, void *m, const char *name) {
    char want[160];
    snprintf(want, sizeof want, ".entry %s(", name);
    if (!strstr(m, want)) return 500; /* CUDA_ERROR_NOT_FOUND */
#ifdef HR_FAKE_CUDA_EMU
    hr_emu_kernel_fn fn = hr_emu_kernel(name); /* a function's address as the handle */
    memcpy(f, &fn, sizeof fn);
#else
    *f = m;
#endif
    return 0;
}
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void *stream, void **params, void **extra) {
    launches++;
#ifdef HR_FAKE_CUDA_EMU
    /* CUDA_ERROR_LAUNCH_FAILED (719) for a launch the emulator cannot run or a barrier that hangs */
    hr_emu_kernel_fn fn;
    memcpy(&fn, &f, sizeof fn);
    if (hr_emu_launch(fn, params, gx, gy, gz, bx, by, bz, emu_why, sizeof emu_why)) return 719;
#endif
    return 0;
}
/* device memory from mmap, not malloc: the fault-injection build links every target with
 * --wrap=malloc,..., and this library is dlopen'ed where those wrappers are not exported. The
 * mapping's size is kept in its first 64 bytes. */
/* The device's memory: HR_FAKE_CUDA_MEM bytes (default 80 GiB, an H100's; the emulating driver's 1
 * GiB, so that a runtime's arena and KV pool on it stay small on the machines the tests run on), less
 * what is allocated, is what cuMemGetInfo reports free and what cuMemAlloc can still give. Mappings
 * are made without reserving swap: only the pages touched take memory, as on a GPU nothing is
 * host memory at all. */
static size_t allocated;
static size_t mem_total(void) {
    const char *m = getenv("HR_FAKE_CUDA_MEM");
#ifdef HR_FAKE_CUDA_EMU
    const size_t def = (size_t)1 << 30;
#else
    const size_t def = (size_t)80 << 30;
#endif
    return m && *m ? (size_t)strtoull(m, NULL, 10) : def;
}
int cuMemAlloc_v2(ptr_t *p, size_t bytes) {
    if (bytes > mem_total() - allocated) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    size_t n = bytes + 64;
    unsigned char *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return 2;
    memcpy(m, &n, sizeof n);
    allocated += bytes;
    *p = (ptr_t)(uintptr_t)(m + 64);
    return 0;
}
int cuMemFree_v2(ptr_t p) {
    unsigned char *m = (unsigned char *)(uintptr_t)p - 64;
    size_t n;
    memcpy(&n, m, sizeof n);
    allocated -= n - 64;
    munmap(m, n);
    return 0;
}
int cuMemcpyHtoD_v2(ptr_t dst, const void *src, size_t n) {
    memcpy((void *)(uintptr_t)dst, src, n);
    return 0;
}
int cuMemcpyDtoH_v2(void *dst, ptr_t src, size_t n) {
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return 0;
}
int cuMemcpyDtoD_v2(ptr_t dst, ptr_t src, size_t n) {
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return 0;
}
int cuMemsetD8_v2(ptr_t dst, unsigned char v, size_t n) {
    memset((void *)(uintptr_t)dst, v, n);
    return 0;
}
int cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    *total_bytes = mem_total();
    *free_bytes = *total_bytes - allocated;
    return 0;
}
/* page-locked host memory: a mapping, its size in its first 64 bytes as cuMemAlloc's */
static int host_allocs;
int cuMemHostAlloc(void **p, size_t bytes, unsigned flags) {
    size_t n = bytes + 64;
    unsigned char *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return 2;
    memcpy(m, &n, sizeof n);
    host_allocs++;
    *p = m + 64;
    return 0;
}
int cuMemFreeHost(void *p) {
    unsigned char *m = (unsigned char *)p - 64;
    size_t n;
    memcpy(&n, m, sizeof n);
    host_allocs--;
    munmap(m, n);
    return 0;
}
/* page-locked allocations alive now (tests: the swap tier's is given back) */
int hr_fake_cuda_host_allocs(void);
int hr_fake_cuda_host_allocs(void) { return host_allocs; }

/* an event is the host's monotonic time when recorded (launches run at once here); a fixed table of
 * them (no malloc: see cuMemAlloc_v2), slots reused once destroyed */
static double event_ms[256];
static bool event_used[256];
int cuEventCreate(void **e, unsigned flags) {
    for (int i = 0; i < 256; i++)
        if (!event_used[i]) {
            event_used[i] = true;
            *e = &event_ms[i];
            return 0;
        }
    return 2;
}
int cuEventDestroy_v2(void *e) {
    event_used[(double *)e - event_ms] = false;
    return 0;
}
int cuEventRecord(void *e, void *stream) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    *(double *)e = (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
    return 0;
}
int cuEventSynchronize(void *e) { return 0; }
int cuEventElapsedTime(float *ms, void *start, void *end) {
    *ms = (float)(*(double *)end - *(double *)start);
    return 0;
}
int hr_fake_cuda_launches(void) { return launches; }

/* fake_libcuda.c: a stand-in for the NVIDIA driver library (libcuda.so.1), built as a shared library
 * for test_cuda_backend, so the CUDA backend's host side (dlopen, symbol lookup, device checks,
 * module loading, kernel lookup by name, device memory) runs on a machine without a GPU. Device
 * memory is host memory (fresh mappings: zeros); a launch runs nothing and only counts. HR_FAKE_CUDA_MODE
 * picks the machine: unset: one compute capability 9.0 GPU; "nodev": the driver sees no GPU; "cc80": an
 * 8.0 GPU. The driver is CUDA 12.8's (HR_FAKE_CUDA_DRIVER: another) and refuses PTX newer than it, and
 * launches past the GPU's limits, as a real one does. The ABI is the driver API's documented one, as
 * backend/cuda/cuda_driver.h declares it.
 *
 * Built with HR_FAKE_CUDA_EMU (the hr_emu_cuda library), a launch runs the kernel: the kernels' own
 * source compiled for the host (emu_kernels.cc), each GPU thread a fiber (emu_rt.c). A module whose
 * PTX has an entry with no emulation is refused, naming it.
 *
 * Streams and graphs: a stream is a slot of a fixed table; while one captures (cuStreamBeginCapture_v2),
 * its launches are recorded, their arguments copied by value (their sizes from the emulator's kernel
 * table; the counting build keeps none), and cuGraphLaunch replays the instantiated copy in order. What
 * a real driver refuses during a capture is refused here too, so the tests see it: a capture on the
 * legacy NULL stream, and, while any stream captures, a synchronous copy or memset, a context
 * synchronize, an allocation or a launch on the NULL stream (each returns an error and invalidates
 * the capture: cuStreamEndCapture then fails as the driver's does). HR_FAKE_CUDA_CAPTURE_FAIL=N: the
 * first N captures begun while it is set end that way too (a driver refusing them: the fallback's test). */
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
int cuStreamCreate(void **s, unsigned flags);
int cuStreamDestroy_v2(void *s);
int cuStreamBeginCapture_v2(void *s, int mode);
int cuStreamEndCapture(void *s, void **graph);
int cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags);
int cuGraphLaunch(void *exec, void *s);
int cuGraphExecDestroy(void *exec);
int cuGraphDestroy(void *graph);
int hr_fake_cuda_launches(void);
void hr_fake_cuda_graph_counts(int *captures, int *graph_launches, int *graphs_alive);

static int launches;

/* the driver's errors for what a capture does not allow */
enum {
    CU_CAPTURE_UNSUPPORTED = 900, /* CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED */
    CU_CAPTURE_INVALIDATED = 901, /* CUDA_ERROR_STREAM_CAPTURE_INVALIDATED */
    CU_CAPTURE_IMPLICIT = 906,    /* CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: the legacy stream meets a capture */
};
static int capturing; /* streams capturing now */
static int refuse_in_capture(int why);
static int run_launch(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                      void **params);
static int record_launch(void *stream, void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                         unsigned bz, void **params);

static const char *mode(void) {
    const char *m = getenv("HR_FAKE_CUDA_MODE");
    return m ? m : "";
}

int cuInit(unsigned flags) { return strcmp(mode(), "nodev") == 0 ? 100 : 0; /* CUDA_ERROR_NO_DEVICE */ }
/* CUDA 12.8 (HR_FAKE_CUDA_DRIVER: another, as cuDriverGetVersion writes it, 1000 major + 10 minor) */
static int driver_version(void) {
    const char *v = getenv("HR_FAKE_CUDA_DRIVER");
    return v && *v ? atoi(v) : 12080;
}
int cuDriverGetVersion(int *v) {
    *v = driver_version();
    return 0;
}
int cuGetErrorString(int r, const char **s) {
    *s = r == 500 ? "named symbol not found" : "fake driver error";
#ifdef HR_FAKE_CUDA_EMU
    /* a module, a launch or a launch's shape the emulator refused */
    if ((r == 1 || r == 200 || r == 716 || r == 719) && emu_why[0]) *s = emu_why;
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
    const char *as = getenv("HR_FAKE_CUDA_NAME"); /* a card's name as its driver gives it (tests of plan) */
#ifdef HR_FAKE_CUDA_EMU
    strncpy(name, as && *as ? as : "CPU emulation of a compute capability 9.0 GPU", (size_t)len);
#else
    strncpy(name, as && *as ? as : "Fake H100", (size_t)len);
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
int cuCtxSynchronize(void) { return capturing ? refuse_in_capture(CU_CAPTURE_UNSUPPORTED) : 0; }
/* a module is its PTX text; one with no kernel entry is refused as the driver refuses a bad image */
int cuModuleLoadData(void **m, const void *image) {
    if (!strstr(image, ".entry ")) return 200; /* CUDA_ERROR_INVALID_IMAGE */
    /* PTX newer than the driver (ISA 8.0 to 8.5: CUDA 12.0 to 12.5, 8.6 on: 12.7 on, 9.x: 13.x) */
    const char *ver = strstr(image, ".version ");
    int M = 0, mi = 0;
    if (ver && sscanf(ver, ".version %d.%d", &M, &mi) == 2 &&
        (M > 9 || (M == 9 && 13000 + 10 * mi > driver_version()) ||
         (M == 8 && 12000 + 10 * (mi <= 5 ? mi : mi + 1) > driver_version())))
        return 222; /* CUDA_ERROR_UNSUPPORTED_PTX_VERSION */
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
static bool stream_capturing(void *stream);

/* A launch shape a compute capability 9.0 GPU refuses (CUDA_ERROR_INVALID_VALUE), as the CUDA
 * programming guide's table of per-capability limits gives them: at most 1024 threads a block,
 * blockDim.x and .y 1024, .z 64; gridDim.x 2^31 - 1, .y and .z 65535; no dimension 0; and dynamic
 * shared memory past 48 KiB without the opt-in attribute (cuFuncSetAttribute, which nothing here
 * calls). Checked before anything else, in a capture too, so a shape that only a large batch reaches
 * fails in the tests' launches as it would on the GPU; why: the reason, for cuGetErrorString. */
static bool launch_refused(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                           unsigned shared, char *why, size_t why_len) {
    const char *r = NULL;
    if (!gx || !gy || !gz || !bx || !by || !bz)
        r = "a dimension is 0";
    else if (bx > 1024 || by > 1024 || bz > 64)
        r = "a block dimension past its limit (x, y 1024, z 64)";
    else if ((unsigned long long)bx * by * bz > 1024)
        r = "more than 1024 threads a block";
    else if (gx > 0x7fffffffu || gy > 65535 || gz > 65535)
        r = "a grid dimension past its limit (x 2^31 - 1, y, z 65535)";
    else if (shared > 48u << 10)
        r = "more than 48 KiB of dynamic shared memory";
    if (r)
        snprintf(why, why_len, "launch grid (%u, %u, %u) block (%u, %u, %u) shared %u refused: %s", gx, gy, gz, bx, by,
                 bz, shared, r);
    return r != NULL;
}

int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shared, void *stream, void **params, void **extra) {
#ifdef HR_FAKE_CUDA_EMU
    if (launch_refused(gx, gy, gz, bx, by, bz, shared, emu_why, sizeof emu_why)) return 1;
#else
    char why[160];
    if (launch_refused(gx, gy, gz, bx, by, bz, shared, why, sizeof why)) return 1;
#endif
    if (stream_capturing(stream)) return record_launch(stream, f, gx, gy, gz, bx, by, bz, params);
    /* the legacy stream waits for every blocking stream: one that captures cannot be waited for */
    if (!stream && capturing) return refuse_in_capture(CU_CAPTURE_IMPLICIT);
    return run_launch(f, gx, gy, gz, bx, by, bz, params);
}
static int run_launch(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                      void **params) {
    launches++;
#ifdef HR_FAKE_CUDA_EMU
    /* CUDA_ERROR_LAUNCH_FAILED (719) for a launch the emulator cannot run or a barrier that hangs */
    hr_emu_kernel_fn fn;
    memcpy(&fn, &f, sizeof fn);
    /* CUDA_ERROR_MISALIGNED_ADDRESS (716) for an access the kernel promised aligned that was not */
    int rc = hr_emu_launch(fn, params, gx, gy, gz, bx, by, bz, emu_why, sizeof emu_why);
    if (rc) return rc == 2 ? 716 : 719;
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
    if (capturing) return refuse_in_capture(CU_CAPTURE_UNSUPPORTED);
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
    if (capturing) return refuse_in_capture(CU_CAPTURE_IMPLICIT); /* the legacy stream's */
    memcpy((void *)(uintptr_t)dst, src, n);
    return 0;
}
int cuMemcpyDtoH_v2(void *dst, ptr_t src, size_t n) {
    if (capturing) return refuse_in_capture(CU_CAPTURE_IMPLICIT); /* the legacy stream's */
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return 0;
}
int cuMemcpyDtoD_v2(ptr_t dst, ptr_t src, size_t n) {
    if (capturing) return refuse_in_capture(CU_CAPTURE_IMPLICIT); /* the legacy stream's */
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return 0;
}
int cuMemsetD8_v2(ptr_t dst, unsigned char v, size_t n) {
    if (capturing) return refuse_in_capture(CU_CAPTURE_IMPLICIT); /* the legacy stream's */
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

/* ---- streams and graphs ---------------------------------------------------------------------------- */

/* A graph: its launches in order, each with a copy of its arguments (mappings, not malloc: see
 * cuMemAlloc_v2). The exec an instantiation makes is another graph of the same nodes. */
#define NODE_ARGS   24
#define NODE_BYTES  512
#define MAX_STREAMS 16
typedef struct node {
    void *f;
    unsigned g[3], b[3];
    int n_args;
    size_t off[NODE_ARGS];
    _Alignas(16) unsigned char bytes[NODE_BYTES];
} node;
typedef struct graph {
    node *nodes;
    int n, cap;
    size_t map_bytes;
} graph;
static struct {
    bool used, capture, invalid;
    graph *g;
} streams[MAX_STREAMS];
static int n_captures, n_graph_launches, graphs_alive;

static void *map(size_t n) {
    void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return m == MAP_FAILED ? NULL : m;
}
static graph *graph_new(void) {
    graph *g = map(sizeof *g);
    if (g) graphs_alive++;
    return g;
}
static void graph_free(graph *g) {
    if (!g) return;
    if (g->nodes) munmap(g->nodes, g->map_bytes);
    munmap(g, sizeof *g);
    graphs_alive--;
}
static node *graph_add(graph *g) {
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 64;
        node *nn = map((size_t)cap * sizeof *nn);
        if (!nn) return NULL;
        if (g->nodes) {
            memcpy(nn, g->nodes, (size_t)g->n * sizeof *nn);
            munmap(g->nodes, g->map_bytes);
        }
        g->nodes = nn;
        g->cap = cap;
        g->map_bytes = (size_t)cap * sizeof *nn;
    }
    return &g->nodes[g->n++];
}

static int stream_slot(void *s) { return s ? (int)((char *)s - (char *)streams) / (int)sizeof streams[0] : -1; }
static bool stream_capturing(void *s) { return s && streams[stream_slot(s)].capture; }

/* something a capture does not allow: every capture under way is invalidated, as the driver's is */
static int refuse_in_capture(int why) {
    for (int i = 0; i < MAX_STREAMS; i++)
        if (streams[i].capture) streams[i].invalid = true;
    return why;
}

static int record_launch(void *stream, void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                         unsigned bz, void **params) {
    int i = stream_slot(stream);
    if (streams[i].invalid) return CU_CAPTURE_INVALIDATED;
    node *n = graph_add(streams[i].g);
    if (!n) return refuse_in_capture(2);
    *n = (node){.f = f, .g = {gx, gy, gz}, .b = {bx, by, bz}};
#ifdef HR_FAKE_CUDA_EMU
    hr_emu_kernel_fn fn;
    memcpy(&fn, &f, sizeof fn);
    const size_t *sizes = NULL;
    int na = hr_emu_kernel_params(fn, &sizes);
    size_t at = 0;
    if (na < 0 || na > NODE_ARGS) return refuse_in_capture(CU_CAPTURE_UNSUPPORTED);
    for (int a = 0; a < na; a++) {
        at = (at + 15) & ~(size_t)15; /* every argument 16-aligned: the widest any kernel takes */
        if (at + sizes[a] > NODE_BYTES) return refuse_in_capture(CU_CAPTURE_UNSUPPORTED);
        memcpy(n->bytes + at, params[a], sizes[a]);
        n->off[a] = at;
        at += sizes[a];
    }
    n->n_args = na;
#else
    (void)params;
#endif
    return 0;
}

int cuStreamCreate(void **s, unsigned flags) {
    for (int i = 0; i < MAX_STREAMS; i++)
        if (!streams[i].used) {
            streams[i].used = true;
            *s = &streams[i];
            return 0;
        }
    return 2;
}
int cuStreamDestroy_v2(void *s) {
    int i = stream_slot(s);
    if (streams[i].capture) capturing--;
    graph_free(streams[i].g);
    memset(&streams[i], 0, sizeof streams[i]);
    return 0;
}
int cuStreamBeginCapture_v2(void *s, int mode) {
    if (!s) return CU_CAPTURE_UNSUPPORTED; /* the legacy stream cannot be captured */
    int i = stream_slot(s);
    if (streams[i].capture) return 401; /* CUDA_ERROR_ILLEGAL_STATE */
    if (!(streams[i].g = graph_new())) return 2;
    streams[i].capture = true;
    static int refused; /* captures refused on HR_FAKE_CUDA_CAPTURE_FAIL's word so far */
    const char *fail = getenv("HR_FAKE_CUDA_CAPTURE_FAIL");
    streams[i].invalid = fail && refused < atoi(fail);
    refused += streams[i].invalid;
    capturing++;
    return 0;
}
int cuStreamEndCapture(void *s, void **out) {
    int i = s ? stream_slot(s) : -1;
    *out = NULL;
    if (i < 0 || !streams[i].capture) return 401;
    streams[i].capture = false;
    capturing--;
    graph *g = streams[i].g;
    streams[i].g = NULL;
    if (streams[i].invalid) {
        graph_free(g);
        return CU_CAPTURE_INVALIDATED;
    }
    n_captures++;
    *out = g;
    return 0;
}
int cuGraphInstantiateWithFlags(void **exec, void *graph_, unsigned long long flags) {
    const graph *g = graph_;
    graph *e = graph_new();
    if (!e) return 2;
    for (int k = 0; k < g->n; k++) {
        node *n = graph_add(e);
        if (!n) {
            graph_free(e);
            return 2;
        }
        *n = g->nodes[k];
    }
    *exec = e;
    return 0;
}
int cuGraphLaunch(void *exec, void *s) {
    if (stream_capturing(s)) return refuse_in_capture(CU_CAPTURE_UNSUPPORTED); /* no graphs within graphs here */
    const graph *g = exec;
    n_graph_launches++;
    for (int k = 0; k < g->n; k++) {
        node *n = &g->nodes[k];
        void *args[NODE_ARGS];
        for (int a = 0; a < n->n_args; a++) args[a] = n->bytes + n->off[a];
        int r = run_launch(n->f, n->g[0], n->g[1], n->g[2], n->b[0], n->b[1], n->b[2], args);
        if (r) return r;
    }
    return 0;
}
int cuGraphExecDestroy(void *exec) {
    graph_free(exec);
    return 0;
}
int cuGraphDestroy(void *g) {
    graph_free(g);
    return 0;
}
/* the tests' view: captures ended well, graph launches, graphs (captured or executable) not destroyed */
void hr_fake_cuda_graph_counts(int *captures, int *graph_launches, int *alive) {
    *captures = n_captures;
    *graph_launches = n_graph_launches;
    *alive = graphs_alive;
}

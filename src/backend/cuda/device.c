/* device.c: one GPU opened through the driver API: its context, the embedded PTX modules and the
 * kernels found in them, device memory and launches (cuda.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "backend/cuda/cuda_driver.h"
#include "backend/cuda/cuda_ptx.h"

#define HR_CUDA_MAX_MODULES 32

struct hr_cuda_device {
    hr_cuda_driver drv;
    hr_cu_device dev;
    hr_cu_ctx ctx;
    hr_cu_module mods[HR_CUDA_MAX_MODULES];
    int n_mods;
    char name[128];
    bool sync_each; /* HEADROOM_CUDA_SYNC=1: wait for every launch (a fault named after its kernel) */
    /* the arena (hr_cuda_arena_reserve): one allocation that hr_cuda_alloc then carves, a stack of
     * pieces whose top is given back when the pieces above it are freed */
    hr_cu_ptr arena;
    uint64_t arena_size, arena_top, arena_peak;
    struct arena_piece {
        uint64_t off, bytes;
        bool live;
    } * pieces;
    int n_pieces, cap_pieces;
    hr_cu_event t0, t1;  /* hr_cuda_time_begin / _end */
    hr_cu_stream stream; /* every launch and event (a graph needs a stream that is not the legacy one) */
    bool capturing;      /* between hr_cuda_graph_begin and _end: launches are recorded, not run */
};

struct hr_cuda_graph {
    hr_cu_graph_exec exec;
};

int hr_cuda_n_modules(void) { return hr_cuda_ptx_count; }

const char *hr_cuda_module_ptx(int i, const char **name) {
    if (i < 0 || i >= hr_cuda_ptx_count) return NULL;
    if (name) *name = hr_cuda_ptx_modules[i].name;
    return hr_cuda_ptx_modules[i].ptx;
}

/* The oldest driver (cuDriverGetVersion's 1000 major + 10 minor) that loads a PTX module, from its
 * .version directive: the PTX ISA's release history pairs ISA 7.x with CUDA 11.x, 8.0 to 8.5 with
 * 12.0 to 12.5, 8.6 on with 12.7 on (one minor ahead), 9.x with 13.x. A newer module fails to load
 * (CUDA_ERROR_UNSUPPORTED_PTX_VERSION); 0 where the header says nothing known (the driver decides). */
int hr_cuda_ptx_min_driver(const char *ptx, int *isa_major, int *isa_minor) {
    const char *v = ptx ? strstr(ptx, ".version ") : NULL;
    int M = 0, m = 0;
    if (!v || sscanf(v, ".version %d.%d", &M, &m) != 2) return 0;
    if (isa_major) *isa_major = M;
    if (isa_minor) *isa_minor = m;
    return M == 7 ? 11000 + 10 * m : M == 8 ? 12000 + 10 * (m <= 5 ? m : m + 1) : M == 9 ? 13000 + 10 * m : 0;
}

/* every failure of open: "CUDA: " then what is missing */
static hr_status open_fail(hr_cuda_device *d, hr_status st, hr_error *err) {
    hr_error_prefix(err, "CUDA");
    hr_cuda_device_close(d);
    return st;
}

hr_status hr_cuda_device_open(const char *driver_lib, int ordinal, hr_cuda_device **out, hr_error *err) {
    hr_cuda_device *d = calloc(1, sizeof *d);
    if (!d) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    hr_status st = hr_cuda_driver_open(driver_lib, &d->drv, err);
    if (st) return open_fail(d, st, err);
    hr_cu_result r = d->drv.cuInit(0);
    /* CUDA_ERROR_NO_DEVICE (100): the driver is there but sees no GPU (none, or all hidden) */
    if (r == 100) return open_fail(d, hr_error_set(err, HR_ERR_UNSUPPORTED, "no GPU found by the NVIDIA driver"), err);
    if (r) return open_fail(d, hr_cuda_fail(&d->drv, r, "the driver did not initialize (cuInit)", err), err);
    int n = 0;
    if ((r = d->drv.cuDeviceGetCount(&n)))
        return open_fail(d, hr_cuda_fail(&d->drv, r, "cannot count the GPUs", err), err);
    if (ordinal < 0 || ordinal >= n)
        return open_fail(d, hr_error_set(err, HR_ERR_UNSUPPORTED, "no GPU %d (this machine has %d)", ordinal, n), err);
    if ((r = d->drv.cuDeviceGet(&d->dev, ordinal)))
        return open_fail(d, hr_cuda_fail(&d->drv, r, "cannot open the GPU", err), err);
    if (d->drv.cuDeviceGetName(d->name, (int)sizeof d->name, d->dev))
        snprintf(d->name, sizeof d->name, "GPU %d", ordinal);
    int major = 0, minor = 0;
    d->drv.cuDeviceGetAttribute(&major, HR_CU_ATTR_CC_MAJOR, d->dev);
    d->drv.cuDeviceGetAttribute(&minor, HR_CU_ATTR_CC_MINOR, d->dev);
    /* the PTX targets sm_90a (its wgmma/TMA instructions need exactly a 9.0 part: H100, H200, GH200) */
    if (major != 9 || minor != 0)
        return open_fail(d,
                         hr_error_set(err, HR_ERR_UNSUPPORTED,
                                      "%s has compute capability %d.%d; the kernels are built for sm_90a (9.0)",
                                      d->name, major, minor),
                         err);
    if (hr_cuda_ptx_count == 0)
        return open_fail(d,
                         hr_error_set(err, HR_ERR_UNSUPPORTED,
                                      "this build has no GPU kernels (clang-19 was not installed when it was built)"),
                         err);
    if ((r = d->drv.cuCtxCreate(&d->ctx, 0, d->dev)))
        return open_fail(d, hr_cuda_fail(&d->drv, r, "cannot create a context", err), err);
    if ((r = d->drv.cuStreamCreate(&d->stream, 0)))
        return open_fail(d, hr_cuda_fail(&d->drv, r, "cannot create a stream", err), err);
    /* a driver older than the PTX refuses every module with an error that does not say which versions */
    int drv_version = 0, isa_major = 0, isa_minor = 0;
    const int need = hr_cuda_ptx_min_driver(hr_cuda_ptx_modules[0].ptx, &isa_major, &isa_minor);
    if (!d->drv.cuDriverGetVersion(&drv_version) && need && drv_version < need)
        return open_fail(d,
                         hr_error_set(err, HR_ERR_UNSUPPORTED,
                                      "the kernels are PTX ISA %d.%d, which needs a CUDA %d.%d driver or newer; "
                                      "this one is CUDA %d.%d",
                                      isa_major, isa_minor, need / 1000, need % 1000 / 10, drv_version / 1000,
                                      drv_version % 1000 / 10),
                         err);
    for (int i = 0; i < hr_cuda_ptx_count && i < HR_CUDA_MAX_MODULES; i++) {
        /* the driver JIT-compiles the PTX for this GPU here (cached by the driver across runs) */
        if ((r = d->drv.cuModuleLoadData(&d->mods[i], hr_cuda_ptx_modules[i].ptx))) {
            hr_cuda_fail(&d->drv, r, "the driver refused kernel module", err);
            hr_error_prefix(err, "%s", hr_cuda_ptx_modules[i].name);
            return open_fail(d, HR_ERR_UNSUPPORTED, err);
        }
        d->n_mods = i + 1;
    }
    const char *sync = getenv("HEADROOM_CUDA_SYNC");
    d->sync_each = sync && strcmp(sync, "0") != 0;
    *out = d;
    return HR_OK;
}

void hr_cuda_device_close(hr_cuda_device *d) {
    if (!d) return;
    if (d->ctx) {
        d->drv.cuCtxSetCurrent(d->ctx);
        for (int i = 0; i < d->n_mods; i++) d->drv.cuModuleUnload(d->mods[i]);
        if (d->arena) d->drv.cuMemFree(d->arena);
        if (d->t0) d->drv.cuEventDestroy(d->t0);
        if (d->t1) d->drv.cuEventDestroy(d->t1);
        if (d->stream) d->drv.cuStreamDestroy(d->stream);
        d->drv.cuCtxDestroy(d->ctx);
    }
    hr_cuda_driver_close(&d->drv);
    free(d->pieces);
    free(d);
}

const char *hr_cuda_device_name(const hr_cuda_device *d) { return d->name; }

/* the context on this thread: the driver's current context is per thread */
static hr_status current(hr_cuda_device *d, hr_error *err) {
    hr_cu_result r = d->drv.cuCtxSetCurrent(d->ctx);
    return r ? hr_cuda_fail(&d->drv, r, "CUDA: cannot make the context current", err) : HR_OK;
}

hr_status hr_cuda_device_mem(hr_cuda_device *d, uint64_t *free_bytes, uint64_t *total_bytes, hr_error *err) {
    hr_status st = current(d, err);
    if (st) return st;
    size_t f = 0, t = 0;
    hr_cu_result r = d->drv.cuMemGetInfo(&f, &t);
    if (r) return hr_cuda_fail(&d->drv, r, "CUDA: cannot read the device memory", err);
    *free_bytes = f;
    *total_bytes = t;
    return HR_OK;
}

/* pieces of the arena start at multiples of this (the driver's own allocations are 256-aligned) */
#define HR_CUDA_ARENA_ALIGN 256u

uint64_t hr_cuda_arena_piece_bytes(uint64_t bytes) {
    return (bytes + HR_CUDA_ARENA_ALIGN - 1) / HR_CUDA_ARENA_ALIGN * HR_CUDA_ARENA_ALIGN;
}

hr_status hr_cuda_arena_reserve(hr_cuda_device *d, uint64_t bytes, hr_error *err) {
    if (d->arena) return hr_error_set(err, HR_ERR_INVALID_ARG, "CUDA: the device arena is already reserved");
    hr_status st = current(d, err);
    if (st) return st;
    hr_cu_ptr p = 0;
    hr_cu_result r = d->drv.cuMemAlloc(&p, bytes ? (size_t)bytes : 1);
    if (r == 2) { /* CUDA_ERROR_OUT_OF_MEMORY */
        size_t f = 0, t = 0;
        d->drv.cuMemGetInfo(&f, &t);
        return hr_error_set(err, HR_ERR_BUDGET, "CUDA: %s cannot hold a %.2f GiB arena (%.2f GiB free of %.2f GiB)",
                            d->name, (double)bytes / (1 << 30), (double)f / (1 << 30), (double)t / (1 << 30));
    }
    if (r) return hr_cuda_fail(&d->drv, r, "CUDA: the device arena could not be allocated", err);
    d->arena = p;
    d->arena_size = bytes;
    d->arena_top = d->arena_peak = 0;
    return HR_OK;
}

void hr_cuda_arena_info(const hr_cuda_device *d, uint64_t *size, uint64_t *used, uint64_t *peak) {
    if (size) *size = d->arena_size;
    if (used) *used = d->arena_top;
    if (peak) *peak = d->arena_peak;
}

static hr_status arena_take(hr_cuda_device *d, size_t bytes, uint64_t *out, hr_error *err) {
    uint64_t n = hr_cuda_arena_piece_bytes(bytes ? bytes : 1);
    if (n > d->arena_size - d->arena_top)
        return hr_error_set(err, HR_ERR_BUDGET,
                            "CUDA: the device arena (%.2f GiB, %.2f GiB in use) cannot hold %zu more bytes",
                            (double)d->arena_size / (1 << 30), (double)d->arena_top / (1 << 30), bytes);
    if (d->n_pieces == d->cap_pieces) {
        int cap = d->cap_pieces ? 2 * d->cap_pieces : 64;
        struct arena_piece *np = realloc(d->pieces, (size_t)cap * sizeof *np);
        if (!np) return hr_error_set(err, HR_ERR_NOMEM, "out of memory for the device arena's table");
        d->pieces = np;
        d->cap_pieces = cap;
    }
    d->pieces[d->n_pieces++] = (struct arena_piece){.off = d->arena_top, .bytes = n, .live = true};
    *out = d->arena + d->arena_top;
    d->arena_top += n;
    if (d->arena_top > d->arena_peak) d->arena_peak = d->arena_top;
    return HR_OK;
}

/* a piece of the arena: freed, then the top comes down past every freed piece at the top */
static bool arena_give(hr_cuda_device *d, uint64_t p) {
    if (!d->arena || p < d->arena || p >= d->arena + d->arena_size) return false;
    for (int i = d->n_pieces - 1; i >= 0; i--)
        if (d->arena + d->pieces[i].off == p) {
            d->pieces[i].live = false;
            break;
        }
    while (d->n_pieces > 0 && !d->pieces[d->n_pieces - 1].live) d->arena_top = d->pieces[--d->n_pieces].off;
    return true;
}

hr_status hr_cuda_alloc(hr_cuda_device *d, size_t bytes, uint64_t *out, hr_error *err) {
    if (d->arena) return arena_take(d, bytes, out, err);
    hr_status st = current(d, err);
    if (st) return st;
    hr_cu_ptr p = 0;
    hr_cu_result r = d->drv.cuMemAlloc(&p, bytes ? bytes : 1);
    if (r == 2) /* CUDA_ERROR_OUT_OF_MEMORY */
        return hr_error_set(err, HR_ERR_BUDGET, "CUDA: the GPU cannot hold %zu more bytes", bytes);
    if (r) return hr_cuda_fail(&d->drv, r, "CUDA: device allocation failed", err);
    *out = p;
    return HR_OK;
}

void hr_cuda_free(hr_cuda_device *d, uint64_t p) {
    if (!p || arena_give(d, p) || current(d, NULL)) return;
    d->drv.cuMemFree(p);
}

void *hr_cuda_host_alloc(hr_cuda_device *d, size_t bytes, hr_error *err) {
    if (current(d, err)) return NULL;
    void *p = NULL;
    hr_cu_result r = d->drv.cuMemHostAlloc(&p, bytes ? bytes : 1, 0);
    if (r) {
        hr_cuda_fail(&d->drv, r, "CUDA: cannot allocate page-locked host memory", err);
        if (err) hr_error_prefix(err, "%.2f GiB", (double)bytes / (1u << 30));
        return NULL;
    }
    return p;
}

void hr_cuda_host_free(hr_cuda_device *d, void *p) {
    if (!p || current(d, NULL)) return;
    d->drv.cuMemFreeHost(p);
}

hr_status hr_cuda_upload(hr_cuda_device *d, uint64_t dst, const void *src, size_t bytes, hr_error *err) {
    hr_status st = current(d, err);
    if (st) return st;
    hr_cu_result r = bytes ? d->drv.cuMemcpyHtoD(dst, src, bytes) : 0;
    return r ? hr_cuda_fail(&d->drv, r, "CUDA: copy to the GPU failed", err) : HR_OK;
}

hr_status hr_cuda_download(hr_cuda_device *d, void *dst, uint64_t src, size_t bytes, hr_error *err) {
    hr_status st = current(d, err);
    if (st) return st;
    hr_cu_result r = bytes ? d->drv.cuMemcpyDtoH(dst, src, bytes) : 0;
    return r ? hr_cuda_fail(&d->drv, r, "CUDA: copy from the GPU failed", err) : HR_OK;
}

hr_status hr_cuda_copy(hr_cuda_device *d, uint64_t dst, uint64_t src, size_t bytes, hr_error *err) {
    hr_status st = current(d, err);
    if (st) return st;
    hr_cu_result r = bytes ? d->drv.cuMemcpyDtoD(dst, src, bytes) : 0;
    return r ? hr_cuda_fail(&d->drv, r, "CUDA: copy on the GPU failed", err) : HR_OK;
}

hr_status hr_cuda_launch(hr_cuda_device *d, const char *name, unsigned gx, unsigned gy, unsigned threads, void **args,
                         hr_error *err) {
    hr_status st = current(d, err);
    if (st) return st;
    hr_cu_function f = NULL;
    for (int i = 0; i < d->n_mods && !f; i++)
        if (d->drv.cuModuleGetFunction(&f, d->mods[i], name)) f = NULL;
    if (!f) return hr_error_set(err, HR_ERR_NOT_FOUND, "CUDA: no kernel named %s in this build", name);
    hr_cu_result r = d->drv.cuLaunchKernel(f, gx, gy, 1, threads, 1, 1, 0, d->stream, args, NULL);
    /* a kernel's fault shows here, named after it (not while capturing: nothing runs then, and a
     * synchronize would break the capture) */
    if (!r && d->sync_each && !d->capturing) r = d->drv.cuCtxSynchronize();
    if (r) {
        hr_cuda_fail(&d->drv, r, "CUDA: kernel failed", err);
        hr_error_prefix(err, "%s", name);
    }
    return r ? HR_ERR_UNSUPPORTED : HR_OK;
}

hr_status hr_cuda_sync(hr_cuda_device *d, hr_error *err) {
    hr_status st = current(d, err);
    if (st) return st;
    hr_cu_result r = d->drv.cuCtxSynchronize();
    return r ? hr_cuda_fail(&d->drv, r, "CUDA: a kernel failed (HEADROOM_CUDA_SYNC=1 names it)", err) : HR_OK;
}

hr_status hr_cuda_time_begin(hr_cuda_device *d, hr_error *err) {
    hr_status st = current(d, err);
    if (st) return st;
    hr_cu_result r = 0;
    if (!d->t0 && (r = d->drv.cuEventCreate(&d->t0, 0))) d->t0 = NULL;
    if (!r && !d->t1 && (r = d->drv.cuEventCreate(&d->t1, 0))) d->t1 = NULL;
    if (!r) r = d->drv.cuEventRecord(d->t0, d->stream);
    return r ? hr_cuda_fail(&d->drv, r, "CUDA: cannot record an event", err) : HR_OK;
}

hr_status hr_cuda_time_end(hr_cuda_device *d, double *ms, hr_error *err) {
    hr_status st = current(d, err);
    if (st) return st;
    if (!d->t0 || !d->t1) return hr_error_set(err, HR_ERR_INVALID_ARG, "CUDA: hr_cuda_time_end without a begin");
    float f = 0.0f;
    hr_cu_result r = d->drv.cuEventRecord(d->t1, d->stream);
    if (!r) r = d->drv.cuEventSynchronize(d->t1);
    if (!r) r = d->drv.cuEventElapsedTime(&f, d->t0, d->t1);
    if (r) return hr_cuda_fail(&d->drv, r, "CUDA: cannot time the work", err);
    *ms = f;
    return HR_OK;
}

bool hr_cuda_graphs_available(const hr_cuda_device *d) { return hr_cuda_driver_has_graphs(&d->drv); }

hr_status hr_cuda_graph_begin(hr_cuda_device *d, hr_error *err) {
    if (!hr_cuda_graphs_available(d))
        return hr_error_set(err, HR_ERR_UNSUPPORTED, "CUDA: this driver has no graphs (CUDA 11.4 or later)");
    if (d->capturing) return hr_error_set(err, HR_ERR_INVALID_ARG, "CUDA: a capture is already under way");
    hr_status st = current(d, err);
    if (st) return st;
    hr_cu_result r = d->drv.cuStreamBeginCapture(d->stream, HR_CU_CAPTURE_THREAD_LOCAL);
    if (r) return hr_cuda_fail(&d->drv, r, "CUDA: cannot begin a capture", err);
    d->capturing = true;
    return HR_OK;
}

hr_status hr_cuda_graph_end(hr_cuda_device *d, hr_cuda_graph **out, hr_error *err) {
    *out = NULL;
    if (!d->capturing) return hr_error_set(err, HR_ERR_INVALID_ARG, "CUDA: no capture to end");
    d->capturing = false;
    hr_status st = current(d, err);
    if (st) return st;
    hr_cu_graph g = NULL;
    hr_cu_graph_exec e = NULL;
    /* a capture the driver invalidated (something it refused in it) ends here with an error */
    hr_cu_result r = d->drv.cuStreamEndCapture(d->stream, &g);
    if (r) return hr_cuda_fail(&d->drv, r, "CUDA: the capture failed", err);
    r = d->drv.cuGraphInstantiateWithFlags(&e, g, 0);
    d->drv.cuGraphDestroy(g); /* the executable graph is a copy: the captured one is not needed again */
    if (r) return hr_cuda_fail(&d->drv, r, "CUDA: cannot instantiate the captured graph", err);
    hr_cuda_graph *h = malloc(sizeof *h);
    if (!h) {
        d->drv.cuGraphExecDestroy(e);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    }
    h->exec = e;
    *out = h;
    return HR_OK;
}

hr_status hr_cuda_graph_launch(hr_cuda_device *d, const hr_cuda_graph *g, hr_error *err) {
    hr_status st = current(d, err);
    if (st) return st;
    hr_cu_result r = d->drv.cuGraphLaunch(g->exec, d->stream);
    if (!r && d->sync_each) r = d->drv.cuCtxSynchronize();
    return r ? hr_cuda_fail(&d->drv, r, "CUDA: a graph launch failed", err) : HR_OK;
}

void hr_cuda_graph_free(hr_cuda_device *d, hr_cuda_graph *g) {
    if (!g) return;
    if (!current(d, NULL)) d->drv.cuGraphExecDestroy(g->exec);
    free(g);
}

hr_status hr_cuda_probe(const char *driver_lib, int ordinal, hr_error *err) {
    hr_cuda_device *d = NULL;
    hr_status st = hr_cuda_device_open(driver_lib, ordinal, &d, err);
    hr_cuda_device_close(d);
    return st;
}

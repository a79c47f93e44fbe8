/* cuda_driver.h: the part of the CUDA driver API headroom calls, loaded at run time with
 * dlopen("libcuda.so.1") so that the binary needs no CUDA SDK to build and only the NVIDIA driver to
 * run on a GPU. No CUDA header is used: the few types below are the driver API's documented ABI
 * (handles are pointers, CUdevice an int, CUdeviceptr 64 bits on 64-bit hosts, CUresult an int enum,
 * 0 = CUDA_SUCCESS), and the functions are looked up by their versioned symbol names (cuMemAlloc_v2,
 * ...), which are the ones the driver has exported since CUDA 3.2.
 *
 * Internal to backend/cuda/. */
#ifndef HR_BACKEND_CUDA_CUDA_DRIVER_H
#define HR_BACKEND_CUDA_CUDA_DRIVER_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"

typedef int hr_cu_result;             /* CUresult: 0 is CUDA_SUCCESS */
typedef int hr_cu_device;             /* CUdevice */
typedef unsigned long long hr_cu_ptr; /* CUdeviceptr */
typedef struct hr_cu_ctx_st *hr_cu_ctx;
typedef struct hr_cu_mod_st *hr_cu_module;
typedef struct hr_cu_func_st *hr_cu_function;
typedef struct hr_cu_stream_st *hr_cu_stream;
typedef struct hr_cu_event_st *hr_cu_event;
typedef struct hr_cu_graph_st *hr_cu_graph;           /* CUgraph */
typedef struct hr_cu_graph_exec_st *hr_cu_graph_exec; /* CUgraphExec */

enum {
    HR_CU_ATTR_CC_MAJOR = 75, /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
    HR_CU_ATTR_CC_MINOR = 76, /* ..._MINOR */
    /* CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: while this thread captures, the driver refuses the calls
     * that would escape the capture (a synchronous copy, an allocation) instead of running them */
    HR_CU_CAPTURE_THREAD_LOCAL = 1,
};

/* The driver's entry points, resolved by hr_cuda_driver_open. */
typedef struct hr_cuda_driver {
    void *lib; /* the dlopen handle */
    hr_cu_result (*cuInit)(unsigned flags);
    hr_cu_result (*cuDriverGetVersion)(int *version);
    hr_cu_result (*cuGetErrorString)(hr_cu_result r, const char **s);
    hr_cu_result (*cuDeviceGetCount)(int *n);
    hr_cu_result (*cuDeviceGet)(hr_cu_device *d, int ordinal);
    hr_cu_result (*cuDeviceGetName)(char *name, int len, hr_cu_device d);
    hr_cu_result (*cuDeviceGetAttribute)(int *v, int attr, hr_cu_device d);
    hr_cu_result (*cuCtxCreate)(hr_cu_ctx *c, unsigned flags, hr_cu_device d);
    hr_cu_result (*cuCtxDestroy)(hr_cu_ctx c);
    hr_cu_result (*cuCtxSetCurrent)(hr_cu_ctx c);
    hr_cu_result (*cuCtxSynchronize)(void);
    hr_cu_result (*cuModuleLoadData)(hr_cu_module *m, const void *image);
    hr_cu_result (*cuModuleUnload)(hr_cu_module m);
    hr_cu_result (*cuModuleGetFunction)(hr_cu_function *f, hr_cu_module m, const char *name);
    hr_cu_result (*cuLaunchKernel)(hr_cu_function f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                   unsigned bz, unsigned shared_bytes, hr_cu_stream s, void **params, void **extra);
    hr_cu_result (*cuMemAlloc)(hr_cu_ptr *p, size_t bytes);
    hr_cu_result (*cuMemFree)(hr_cu_ptr p);
    hr_cu_result (*cuMemcpyHtoD)(hr_cu_ptr dst, const void *src, size_t bytes);
    hr_cu_result (*cuMemcpyDtoH)(void *dst, hr_cu_ptr src, size_t bytes);
    hr_cu_result (*cuMemcpyDtoD)(hr_cu_ptr dst, hr_cu_ptr src, size_t bytes);
    hr_cu_result (*cuMemsetD8)(hr_cu_ptr dst, unsigned char v, size_t n);
    hr_cu_result (*cuMemGetInfo)(size_t *free_bytes, size_t *total_bytes);
    /* page-locked host memory (the swap tier's slots: DMA without a staging copy) */
    hr_cu_result (*cuMemHostAlloc)(void **p, size_t bytes, unsigned flags);
    hr_cu_result (*cuMemFreeHost)(void *p);
    /* events on the default stream: GPU time between two points */
    hr_cu_result (*cuEventCreate)(hr_cu_event *e, unsigned flags);
    hr_cu_result (*cuEventDestroy)(hr_cu_event e);
    hr_cu_result (*cuEventRecord)(hr_cu_event e, hr_cu_stream s);
    hr_cu_result (*cuEventSynchronize)(hr_cu_event e);
    hr_cu_result (*cuEventElapsedTime)(float *ms, hr_cu_event start, hr_cu_event end);
    /* the stream every launch and event goes to: created blocking (flags 0), so the synchronous copies,
     * which run on the legacy default stream, still wait for its work and it for theirs */
    hr_cu_result (*cuStreamCreate)(hr_cu_stream *s, unsigned flags);
    hr_cu_result (*cuStreamDestroy)(hr_cu_stream s);
    /* CUDA graphs (stream capture, CUDA 11.4+), optional: NULL where the driver lacks one (graphs off) */
    hr_cu_result (*cuStreamBeginCapture)(hr_cu_stream s, int mode);
    hr_cu_result (*cuStreamEndCapture)(hr_cu_stream s, hr_cu_graph *g);
    hr_cu_result (*cuGraphInstantiateWithFlags)(hr_cu_graph_exec *e, hr_cu_graph g, unsigned long long flags);
    hr_cu_result (*cuGraphLaunch)(hr_cu_graph_exec e, hr_cu_stream s);
    hr_cu_result (*cuGraphExecDestroy)(hr_cu_graph_exec e);
    hr_cu_result (*cuGraphDestroy)(hr_cu_graph g);
} hr_cuda_driver;

/* Loads the driver library `lib` (NULL: "libcuda.so.1") and resolves every entry point above (the
 * graph ones where the driver has them: hr_cuda_driver_has_graphs); does not call cuInit. HR_ERR_UNSUPPORTED with
 * "<lib> not found (the NVIDIA driver is not installed)" when it cannot be loaded, or "<lib> has no <symbol> (...)"
 * when a symbol is missing; nothing is left loaded then. */
hr_status hr_cuda_driver_open(const char *lib, hr_cuda_driver *out, hr_error *err);
void hr_cuda_driver_close(hr_cuda_driver *d); /* NULL or never opened allowed */
/* whether every graph entry point resolved */
bool hr_cuda_driver_has_graphs(const hr_cuda_driver *d);

/* err <- "<what>: <the driver's name for r>" as HR_ERR_UNSUPPORTED (a device or driver fault, not
 * the input's); returns that code. */
hr_status hr_cuda_fail(const hr_cuda_driver *d, hr_cu_result r, const char *what, hr_error *err);

#endif

/* cuda_driver.c: the CUDA driver API through dlopen (see cuda_driver.h). */
#include "backend/cuda/cuda_driver.h"

#include <dlfcn.h>
#include <string.h>

/* each entry point: its field and the symbol the driver exports for it (the _v2 ABI where one exists) */
#define HR_CU_SYMS(X)                                                                                                  \
    X(cuInit, "cuInit")                                                                                                \
    X(cuDriverGetVersion, "cuDriverGetVersion")                                                                        \
    X(cuGetErrorString, "cuGetErrorString")                                                                            \
    X(cuDeviceGetCount, "cuDeviceGetCount")                                                                            \
    X(cuDeviceGet, "cuDeviceGet")                                                                                      \
    X(cuDeviceGetName, "cuDeviceGetName")                                                                              \
    X(cuDeviceGetAttribute, "cuDeviceGetAttribute")                                                                    \
    X(cuCtxCreate, "cuCtxCreate_v2")                                                                                   \
    X(cuCtxDestroy, "cuCtxDestroy_v2")                                                                                 \
    X(cuCtxSetCurrent, "cuCtxSetCurrent")                                                                              \
    X(cuCtxSynchronize, "cuCtxSynchronize")                                                                            \
    X(cuModuleLoadData, "cuModuleLoadData")                                                                            \
    X(cuModuleUnload, "cuModuleUnload")                                                                                \
    X(cuModuleGetFunction, "cuModuleGetFunction")                                                                      \
    X(cuLaunchKernel, "cuLaunchKernel")                                                                                \
    X(cuMemAlloc, "cuMemAlloc_v2")                                                                                     \
    X(cuMemFree, "cuMemFree_v2")                                                                                       \
    X(cuMemcpyHtoD, "cuMemcpyHtoD_v2")                                                                                 \
    X(cuMemcpyDtoH, "cuMemcpyDtoH_v2")                                                                                 \
    X(cuMemcpyDtoD, "cuMemcpyDtoD_v2")                                                                                 \
    X(cuMemsetD8, "cuMemsetD8_v2")                                                                                     \
    X(cuMemGetInfo, "cuMemGetInfo_v2")                                                                                 \
    X(cuMemHostAlloc, "cuMemHostAlloc")                                                                                \
    X(cuMemFreeHost, "cuMemFreeHost")                                                                                  \
    X(cuEventCreate, "cuEventCreate")                                                                                  \
    X(cuEventDestroy, "cuEventDestroy_v2")                                                                             \
    X(cuEventRecord, "cuEventRecord")                                                                                  \
    X(cuEventSynchronize, "cuEventSynchronize")                                                                        \
    X(cuEventElapsedTime, "cuEventElapsedTime")                                                                        \
    X(cuStreamCreate, "cuStreamCreate")                                                                                \
    X(cuStreamDestroy, "cuStreamDestroy_v2")

/* the optional ones: a driver without them runs without graphs */
#define HR_CU_GRAPH_SYMS(X)                                                                                            \
    X(cuStreamBeginCapture, "cuStreamBeginCapture_v2")                                                                 \
    X(cuStreamEndCapture, "cuStreamEndCapture")                                                                        \
    X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags")                                                      \
    X(cuGraphLaunch, "cuGraphLaunch")                                                                                  \
    X(cuGraphExecDestroy, "cuGraphExecDestroy")                                                                        \
    X(cuGraphDestroy, "cuGraphDestroy")

hr_status hr_cuda_driver_open(const char *lib, hr_cuda_driver *out, hr_error *err) {
    if (!lib) lib = "libcuda.so.1";
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) return hr_error_set(err, HR_ERR_UNSUPPORTED, "%s not found (the NVIDIA driver is not installed)", lib);
    hr_cuda_driver d = {.lib = h};
    void *sym;
    /* a function pointer from dlsym's void *: POSIX guarantees the conversion; memcpy keeps -Wpedantic
     * builds quiet about it */
#define HR_CU_LOAD(field, name)                                                                                        \
    if (!(sym = dlsym(h, name))) {                                                                                     \
        dlclose(h);                                                                                                    \
        return hr_error_set(err, HR_ERR_UNSUPPORTED, "%s has no %s (not the NVIDIA driver, or one too old)", lib,      \
                            name);                                                                                     \
    }                                                                                                                  \
    memcpy(&d.field, &sym, sizeof sym);
    HR_CU_SYMS(HR_CU_LOAD)
#undef HR_CU_LOAD
#define HR_CU_LOAD_OPT(field, name)                                                                                    \
    if ((sym = dlsym(h, name))) memcpy(&d.field, &sym, sizeof sym);
    HR_CU_GRAPH_SYMS(HR_CU_LOAD_OPT)
#undef HR_CU_LOAD_OPT
    *out = d;
    return HR_OK;
}

void hr_cuda_driver_close(hr_cuda_driver *d) {
    if (!d || !d->lib) return;
    dlclose(d->lib);
    memset(d, 0, sizeof *d);
}

bool hr_cuda_driver_has_graphs(const hr_cuda_driver *d) {
    return d->cuStreamBeginCapture && d->cuStreamEndCapture && d->cuGraphInstantiateWithFlags && d->cuGraphLaunch &&
           d->cuGraphExecDestroy && d->cuGraphDestroy;
}

hr_status hr_cuda_fail(const hr_cuda_driver *d, hr_cu_result r, const char *what, hr_error *err) {
    const char *s = NULL;
    if (!d->cuGetErrorString || d->cuGetErrorString(r, &s) != 0 || !s) s = "unknown error";
    return hr_error_set(err, HR_ERR_UNSUPPORTED, "%s: %s (CUDA error %d)", what, s, r);
}

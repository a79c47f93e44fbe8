/* cuda_ptx.h: the PTX of the kernels/ .cu files embedded in the binary. The definitions are generated at build
 * time (CMakeLists.txt: embed_ptx.cmake writes cuda_ptx.c into the build folder); a build without
 * clang-19 gets a table of none. Internal to backend/cuda/. */
#ifndef HR_BACKEND_CUDA_CUDA_PTX_H
#define HR_BACKEND_CUDA_CUDA_PTX_H

typedef struct hr_cuda_ptx_module {
    const char *name; /* the .cu file's stem: "norm", "gemv", ... */
    const char *ptx;  /* NUL-terminated PTX text, as cuModuleLoadData takes it */
} hr_cuda_ptx_module;

extern const hr_cuda_ptx_module hr_cuda_ptx_modules[];
extern const int hr_cuda_ptx_count;

#endif

/* emu_rt.h: the CPU emulation of CUDA kernel launches (emu_rt.c) and the table of emulated kernels
 * (emu_kernels.cc), for the emulating test driver library (fake_libcuda.c with HR_FAKE_CUDA_EMU). */
#ifndef HR_TESTS_CUDA_EMU_RT_H
#define HR_TESTS_CUDA_EMU_RT_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* a kernel called with cuLaunchKernel's argument array: params[i] points at argument i */
typedef void (*hr_emu_kernel_fn)(void **params);

/* Runs fn over grid (gx, gy, gz) of blocks of (bx, by, bz) threads (1-D blocks, 2-D grids); 0 when
 * it ran, else 1 with why filled (an unsupported shape, a barrier that never opens), or 2 for a
 * misaligned access (hr_emu_misaligned). */
int hr_emu_launch(hr_emu_kernel_fn fn, void **params, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                  unsigned bz, char *why, size_t why_len);

/* What a kernel calls while it runs (common.cuh's HR_CUDA_EMU branch declares the same): the
 * running thread's index, the block's size, the block's index, the grid's width, the block barrier,
 * and the butterfly shuffle within a warp. */
int hr_emu_tid_x(void);
int hr_emu_ntid_x(void);
int hr_emu_ctaid_x(void);
int hr_emu_ctaid_y(void);
int hr_emu_nctaid_x(void);
void hr_emu_syncthreads(void);
float hr_emu_shfl_xor(float v, int lane_mask);
/* mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 (f16: 0 bf16, 1 f16): d += A B, a
 * barrier of the fiber's warp like the shuffle; a, b, d the lane's fragments as the PTX ISA lays them
 * out. A warp that is not whole at it (a lane gone, a partial warp, lanes that disagree on the type)
 * gets NaN. */
void hr_emu_mma_16816(float *d, const unsigned *a, const unsigned *b, int f16);

/* an A-byte access at p, p not a multiple of A: on a GPU a misaligned-address fault. The launch runs
 * on (x86 reads it) and then fails (hr_emu_launch returns 2) with the first such access named. */
__attribute__((cold)) void hr_emu_misaligned(const void *p, int align);

/* the emulated kernel named name (an extern "C" __global__ of src/backend/cuda/kernels), or NULL */
hr_emu_kernel_fn hr_emu_kernel(const char *name);
/* the byte sizes of an emulated kernel's arguments, in order (*sizes), and their count; -1 for a
 * function not in the table. What a graph copies of a captured launch's argument array. */
int hr_emu_kernel_params(hr_emu_kernel_fn fn, const size_t **sizes);

#ifdef __cplusplus
}
#endif

#endif

/* common.cuh: what every headroom CUDA kernel needs, without the CUDA SDK. The kernels are compiled
 * by clang's NVPTX target with -nocudainc -nocudalib (no cuda_runtime.h, no cuda_fp16.h, no
 * libdevice), so the attributes, thread indices, barriers, shuffles and the few math functions come
 * from clang's builtins, declared here once. Device code only; every kernel is extern "C" so that the
 * host finds it by its plain name (cuModuleGetFunction).
 *
 * Launch convention shared by the kernels: blockDim.x == HR_K_THREADS (256, 8 warps) unless a
 * kernel's comment says otherwise; the host launches them that way.
 *
 * Two builds read this file: the GPU's (the PTX above) and, with HR_CUDA_EMU, the CPU emulation the
 * tests run (tests/cuda/emu_rt.c: every GPU thread a fiber, one block at a time), where the same
 * names map to the emulator and libm. Kernels use only what is declared here (tid_x, __syncthreads,
 * hr_shfl_xor, hr_expf, ...), never a builtin directly, so both builds compile the same source.
 * tests/gpu/test_cuda_kernels.c checks every kernel against the CPU reference, on a GPU where there is
 * one and through the emulation in every test run; no kernel has yet run on a GPU. */
#ifndef HR_CUDA_COMMON_CUH
#define HR_CUDA_COMMON_CUH

#define HR_K_THREADS 256
#define HR_K_WARP    32

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#ifndef HR_CUDA_EMU
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))

static __device__ inline int tid_x(void) { return __nvvm_read_ptx_sreg_tid_x(); }
static __device__ inline int ntid_x(void) { return __nvvm_read_ptx_sreg_ntid_x(); }
static __device__ inline int ctaid_x(void) { return __nvvm_read_ptx_sreg_ctaid_x(); }
static __device__ inline int ctaid_y(void) { return __nvvm_read_ptx_sreg_ctaid_y(); }
static __device__ inline int nctaid_x(void) { return __nvvm_read_ptx_sreg_nctaid_x(); }
/* lane ^ lane_mask's v, every lane of the warp taking part */
static __device__ inline float hr_shfl_xor(float v, int lane_mask) {
    return __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, lane_mask, 0x1f);
}
/* e^x through the hardware's 2^x (ex2.approx: about 2 ulp); enough for softmax and SiLU, which the
 * CPU reference compares within a tolerance, not bit for bit. */
static __device__ inline float hr_exp2_approx(float x) { return __nvvm_ex2_approx_f(x); }
static __device__ inline float hr_rsqrtf(float x) { return __nvvm_rsqrt_approx_f(x); }
/* accurate only near 0: reduce the angle first */
static __device__ inline float hr_sin_approx(float x) { return __nvvm_sin_approx_f(x); }
static __device__ inline float hr_cos_approx(float x) { return __nvvm_cos_approx_f(x); }
/* *p += v for a u64 in global memory (atom.global.add.u64): the policies' scores */
static __device__ inline void hr_atomic_add_u64(u64 *p, u64 v) { __nvvm_atom_add_gen_ll((long long *)p, (long long)v); }
/* round to nearest even (cvt.rni), as the CPU's rintf in its default mode */
static __device__ inline float hr_rintf(float x) { return __builtin_rintf(x); }
/* correctly rounded (sqrt.rn.f32), as the CPU's sqrtf */
static __device__ inline float hr_sqrtf(float x) { return __builtin_sqrtf(x); }
/* d += A B on the tensor cores, one warp-wide m16n8k16 product (every lane of the warp takes part):
 * a, b the lane's fragments of A (16 x 16, row-major) and B (16 x 8, column-major), two 16-bit values
 * a word, d the lane's four f32 elements of D, as the PTX ISA lays them out for mma.m16n8k16 (gemm.cu
 * says which lane holds what). Inputs bf16 or f16, products and sums in f32. */
static __device__ inline void hr_mma_16816_bf16(float d[4], const u32 a[4], const u32 b[2]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
static __device__ inline void hr_mma_16816_f16(float d[4], const u32 a[4], const u32 b[2]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
/* p, promised A-byte aligned (the emulation checks it): what lets the compiler make an A-byte access
 * of a byte pointer; a T * is taken to be aligned to T already, so nothing is added for it */
template <int A, typename T> static __device__ inline T *hr_aligned(T *p) {
    if constexpr (A <= alignof(T))
        return p;
    else
        return (T *)__builtin_assume_aligned(p, A);
}
#else
/* The CPU emulation of the kernels (tests/cuda/emu_rt.c, for the test driver library: a kernel runs
 * as host code, each GPU thread a fiber, one thread block at a time). Shared memory is a static
 * local: one block runs at a time, so its threads share it as a block's do. The approximate
 * hardware functions become libm's. */
#define __global__
#define __device__
#define __shared__ static
#include "emu_rt.h" /* tests/cuda: the emulator's side of these (the emulation build's include path) */
extern "C" {
float exp2f(float);
float sqrtf(float);
float sinf(float);
float cosf(float);
float rintf(float);
}
static inline int tid_x(void) { return hr_emu_tid_x(); }
static inline int ntid_x(void) { return hr_emu_ntid_x(); }
static inline int ctaid_x(void) { return hr_emu_ctaid_x(); }
static inline int ctaid_y(void) { return hr_emu_ctaid_y(); }
static inline int nctaid_x(void) { return hr_emu_nctaid_x(); }
static inline void __syncthreads(void) { hr_emu_syncthreads(); }
static inline float hr_shfl_xor(float v, int lane_mask) { return hr_emu_shfl_xor(v, lane_mask); }
static inline float hr_exp2_approx(float x) { return exp2f(x); }
static inline float hr_rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float hr_sin_approx(float x) { return sinf(x); }
static inline float hr_cos_approx(float x) { return cosf(x); }
static inline void hr_atomic_add_u64(u64 *p, u64 v) { __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline float hr_rintf(float x) { return rintf(x); }
static inline float hr_sqrtf(float x) { return sqrtf(x); }
/* the warp's lanes meet in the emulator, which multiplies the gathered fragments (emu_rt.c) */
static inline void hr_mma_16816_bf16(float d[4], const u32 a[4], const u32 b[2]) { hr_emu_mma_16816(d, a, b, 0); }
static inline void hr_mma_16816_f16(float d[4], const u32 a[4], const u32 b[2]) { hr_emu_mma_16816(d, a, b, 1); }
/* A GPU faults on an access at an address that is not a multiple of its width
 * (CUDA_ERROR_MISALIGNED_ADDRESS); x86 does not. Every access wider than its byte pointer promises (the
 * 16- and 8-byte vector loads, a float or u16 read from a byte offset in a KV head) takes its pointer
 * through hr_aligned, which here checks the promise: a broken one fails the launch, naming the address. */
template <int A, typename T> static inline T *hr_aligned(T *p) {
    if (__builtin_expect((u64)p % A != 0, 0)) hr_emu_misaligned(p, A);
    return p;
}
#endif

static __device__ inline float hr_expf(float x) { return hr_exp2_approx(x * 1.4426950408889634f); }
static __device__ inline float hr_tanhf(float x) {
    /* 1 - 2 / (e^2x + 1): saturates to +-1 without overflow trouble (e^2x = inf gives 1) */
    return 1.0f - 2.0f / (hr_expf(2.0f * x) + 1.0f);
}

/* IEEE half -> float by its bits (exact, subnormals included): no cuda_fp16.h and no f16 type
 * needed, and the same values the CPU's conversion gives. */
static __device__ inline float hr_h2f(u16 h) {
    u32 sign = (u32)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13); /* inf, nan */
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: shift the mantissa up until its leading one is the implicit bit */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400u));
        bits = sign | ((u32)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    return __builtin_bit_cast(float, bits);
}

/* float -> IEEE half bits, round to nearest even (overflow to inf, NaN kept): the CPU storage's
 * kv_f32_to_f16 step for step, so a K/V row encoded on the device has the host's bytes. */
static __device__ inline u16 hr_f2h(float f) {
    u32 x = __builtin_bit_cast(u32, f);
    const u16 sign = (u16)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) return (u16)(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (x >= 0x477ff000u) return (u16)(sign | 0x7c00u);
    if (x < 0x38800000u) { /* an f16 subnormal: adding 0.5 rounds it (round to nearest even) */
        const float v = __builtin_bit_cast(float, x) + 0.5f;
        return (u16)(sign | (__builtin_bit_cast(u32, v) - 0x3f000000u));
    }
    x += 0xc8000fffu + ((x >> 13) & 1u); /* rebias the exponent and round */
    return (u16)(sign | (x >> 13));
}
/* float -> bfloat16 bits, round to nearest even (NaN kept quiet) */
static __device__ inline u16 hr_f2bf(float f) {
    u32 x = __builtin_bit_cast(u32, f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (u16)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (u16)(x >> 16);
}
static __device__ inline float hr_bf2f(u16 h) { return __builtin_bit_cast(float, (u32)h << 16); }
/* OCP FP8 e4m3 (no infinities, max 448): its 7 magnitude bits at f32 bit 20 read as an f32 of bias
 * 127; times 2^120 rebiases to 7 (exact, subnormals too) */
static __device__ inline float hr_e4m3_to_f(u8 b) {
    const float v = __builtin_bit_cast(float, (u32)(b & 0x7fu) << 20) * 0x1p120f;
    return (b & 0x80u) ? -v : v;
}
/* float -> e4m3, round to nearest even, saturating at 448: the CPU's kv_f32_to_e4m3 */
static __device__ inline u8 hr_f_to_e4m3(float x) {
    const u32 bits = __builtin_bit_cast(u32, x);
    const u8 sign = (bits & 0x80000000u) ? 0x80u : 0u;
    const float v = __builtin_bit_cast(float, bits & 0x7fffffffu);
    if (!(v == v)) return 0;
    if (v >= 448.0f) return (u8)(sign | 0x7eu);
    if (v < 0x1p-6f) return (u8)(sign | (int)hr_rintf(v * 512.0f)); /* subnormal: steps of 2^-9 */
    /* v = fr * 2^ex with fr in [0.5, 1): frexpf by the bits (v is a normal float here) */
    const int ex = (int)((bits >> 23) & 0xffu) - 126;
    const float fr = __builtin_bit_cast(float, (bits & 0x007fffffu) | (126u << 23));
    int E = ex - 1, q = (int)hr_rintf((fr * 2.0f - 1.0f) * 8.0f);
    if (q == 8) q = 0, E++;
    int code = ((E + 7) << 3) | q;
    return (u8)(sign | (code > 0x7e ? 0x7e : code));
}

/* a little-endian u16 at any byte address (q8_0/q4_0 blocks are 34 and 18 bytes: their scales are
 * only 2-byte aligned, and a KV head region's scales follow int8 codes) */
static __device__ inline u16 hr_ld_u16(const u8 *p) { return (u16)(p[0] | (p[1] << 8)); }

static __device__ inline float warp_sum(float v) {
    for (int o = HR_K_WARP / 2; o > 0; o >>= 1) v += hr_shfl_xor(v, o);
    return v;
}
static __device__ inline float warp_max(float v) {
    for (int o = HR_K_WARP / 2; o > 0; o >>= 1) {
        float w = hr_shfl_xor(v, o);
        v = w > v ? w : v;
    }
    return v;
}

/* (v, i) beats (w, j) in an argmax: i a candidate (j < 0: none yet), and a larger value or, equal, a
 * lower index. Indices travel as floats (the shuffles move floats): exact below 2^24. */
static __device__ inline bool argmax_beats(float v, float i, float w, float j) {
    return i >= 0.0f && (j < 0.0f || v > w || (v == w && i < j));
}

/* The warp's best (v, i) in every lane */
static __device__ inline void warp_argmax(float *v, float *i) {
    for (int o = HR_K_WARP / 2; o > 0; o >>= 1) {
        const float w = hr_shfl_xor(*v, o), j = hr_shfl_xor(*i, o);
        if (argmax_beats(w, j, *v, *i)) *v = w, *i = j;
    }
}

/* Block-wide sum / max of every thread's v (blockDim.x a multiple of 32, at most 1024); every thread
 * gets the result. red: 32 floats of shared memory, reused after a barrier. */
static __device__ inline float block_sum(float v, float *red) {
    int lane = tid_x() % HR_K_WARP, warp = tid_x() / HR_K_WARP, nw = ntid_x() / HR_K_WARP;
    v = warp_sum(v);
    __syncthreads(); /* red may still be read by a previous reduction */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return warp_sum(v);
}
static __device__ inline float block_max(float v, float *red) {
    int lane = tid_x() % HR_K_WARP, warp = tid_x() / HR_K_WARP, nw = ntid_x() / HR_K_WARP;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : -__builtin_inff();
    return warp_max(v);
}

#endif

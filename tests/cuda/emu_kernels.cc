/* emu_kernels.cc: every CUDA kernel of src/backend/cuda/kernels compiled as host C++ (clang-19
 * -DHR_CUDA_EMU: common.cuh's emulation branch), and the table the emulating driver finds them in by
 * name. Each kernel gets a trampoline that unpacks cuLaunchKernel's argument array (params[i] points
 * at argument i) into a typed call. The driver refuses a module with an entry this table lacks, so a
 * new kernel must be listed here for the emulated tests to run. */
#include "common.cuh"
#include "kv.cuh" /* outside the namespaces: attention.cu and attn_prefill.cu share it (its guard) */

namespace k_attention {
#include "attention.cu"
}
namespace k_attn_prefill {
#include "attn_prefill.cu"
}
namespace k_embed {
#include "embed.cu"
}
namespace k_gemm {
#include "gemm.cu"
}
namespace k_gemv {
#include "gemv.cu"
}
namespace k_moe {
#include "moe.cu"
}
namespace k_norm {
#include "norm.cu"
}
namespace k_rope {
#include "rope.cu"
}
namespace k_swiglu {
#include "swiglu.cu"
}

#include "emu_rt.h"

/* Kernels only the emulator's own check launches (tests/gpu/cuda_kernels_limits.c; no PTX has them): a
 * warp split between __syncthreads and a shuffle, which no barrier can release; lanes that leave while
 * the rest of their warp shuffles (finished lanes count as arrived; a partner that left gives a lane its
 * own value); and a vector load at an address it may not be aligned to. */
namespace k_selftest {
extern "C" void hr_emu_selftest_divergent(float *out) {
    if (tid_x() % 2)
        __syncthreads();
    else
        out[tid_x()] = hr_shfl_xor(1.0f, 1);
}
extern "C" void hr_emu_selftest_early_exit(float *out) {
    if (tid_x() % 32 >= 16) return;
    out[tid_x()] = hr_shfl_xor((float)tid_x(), 16);     /* the partner left: its own value */
    out[64 + tid_x()] = hr_shfl_xor((float)tid_x(), 1); /* the partner is there: its value */
}
/* a 16-byte load of out[off .. off + 3] into out[0 .. 3] (thread 0): misaligned unless off % 4 == 0
 * (out 16-byte aligned) */
extern "C" void hr_emu_selftest_misaligned(float *out, int off) {
    if (tid_x() != 0) return;
    float v[4];
    __builtin_memcpy(v, hr_aligned<16>(out + off), sizeof v);
    __builtin_memcpy(out, v, sizeof v);
}
} // namespace k_selftest

namespace {
template <int... I> struct seq {};
template <int N, int... I> struct make_seq : make_seq<N - 1, N - 1, I...> {};
template <int... I> struct make_seq<0, I...> { typedef seq<I...> type; };
/* A pointer argument not aligned to what it points at faults at its first access on a GPU: each is
 * checked as the launch's first thread starts (the host's offsets into the arena and its buffers) */
template <typename T> struct pointee {
    static void check(const T &) {}
};
template <typename T> struct pointee<T *> {
    static void check(T *p) { hr_aligned<alignof(T)>(p); }
};
template <> struct pointee<void *> {
    static void check(void *) {}
};
template <> struct pointee<const void *> {
    static void check(const void *) {}
};
template <typename... A, int... I> void call(void (*f)(A...), void **p, seq<I...>) {
    if (hr_emu_tid_x() == 0 && hr_emu_ctaid_x() == 0 && hr_emu_ctaid_y() == 0) /* once a launch */
        (pointee<A>::check(*(A *)p[I]), ...);
    f(*(A *)p[I]...);
}
template <typename... A> void invoke(void (*f)(A...), void **p) { call(f, p, typename make_seq<sizeof...(A)>::type()); }

/* each argument's size, from the kernel's own signature */
template <typename... A> struct arg_sizes {
    static constexpr size_t v[] = {sizeof(A)...};
};

struct entry {
    const char *name;
    hr_emu_kernel_fn fn;
    int n_params;
    const size_t *sizes;
};
template <typename... A> entry make_entry(const char *name, hr_emu_kernel_fn fn, void (*)(A...)) {
    return entry{name, fn, (int)sizeof...(A), arg_sizes<A...>::v};
}
#define K(ns, name)                                                                                                    \
    make_entry(                                                                                                        \
        #name, [](void **p) { invoke(ns::name, p); }, ns::name)
const entry kernels[] = {
    K(k_attention, hr_k_attn_split),
    K(k_attention, hr_k_attn_split_rows),
    K(k_attention, hr_k_attn_reduce),
    K(k_attention, hr_k_attn_score),
    K(k_attention, hr_k_kv_write),
    K(k_attention, hr_k_kv_encode),
    K(k_attention, hr_k_hadamard_rows),
    K(k_attn_prefill, hr_k_attn_prefill),
    K(k_embed, hr_k_embed),
    K(k_gemv, hr_k_gemv_q8_0),
    K(k_gemv, hr_k_gemv_q4_0),
    K(k_gemv, hr_k_gemv_f32),
    K(k_gemv, hr_k_gemv_f16),
    K(k_gemv, hr_k_gemv_bf16),
    K(k_gemv, hr_k_gemv_q4_K),
    K(k_gemv, hr_k_gemv_q5_K),
    K(k_gemv, hr_k_gemv_q6_K),
    K(k_gemv, hr_k_gemv_q5_0),
    K(k_gemv, hr_k_gemv_q5_1),
    K(k_gemv, hr_k_gemv_moe_q8_0),
    K(k_gemv, hr_k_gemv_moe_q4_0),
    K(k_gemv, hr_k_gemv_moe_f32),
    K(k_gemv, hr_k_gemv_moe_f16),
    K(k_gemv, hr_k_gemv_moe_bf16),
    K(k_gemv, hr_k_gemv_moe_q4_K),
    K(k_gemv, hr_k_gemv_moe_q5_K),
    K(k_gemv, hr_k_gemv_moe_q6_K),
    K(k_gemv, hr_k_gemv_moe_q5_0),
    K(k_gemv, hr_k_gemv_moe_q5_1),
    K(k_moe, hr_k_moe_route),
    K(k_moe, hr_k_moe_sum),
    K(k_gemm, hr_k_gemm_bf16),
    K(k_gemm, hr_k_gemm_f16),
    K(k_gemm, hr_k_gemm_q8_0),
    K(k_gemm, hr_k_gemm_q4_0),
    K(k_gemm, hr_k_mma_selftest),
    K(k_norm, hr_k_rmsnorm),
    K(k_norm, hr_k_add_rmsnorm),
    K(k_norm, hr_k_softmax),
    K(k_norm, hr_k_argmax_rows),
    K(k_rope, hr_k_rope),
    K(k_swiglu, hr_k_swiglu),
    K(k_swiglu, hr_k_geglu),
    K(k_swiglu, hr_k_scale),
    K(k_swiglu, hr_k_softcap),
    K(k_selftest, hr_emu_selftest_divergent),
    K(k_selftest, hr_emu_selftest_early_exit),
    K(k_selftest, hr_emu_selftest_misaligned),
};
} // namespace

extern "C" hr_emu_kernel_fn hr_emu_kernel(const char *name) {
    for (const entry &e : kernels) {
        const char *a = e.name, *b = name;
        while (*a && *a == *b) a++, b++;
        if (*a == *b) return e.fn;
    }
    return nullptr;
}

extern "C" int hr_emu_kernel_params(hr_emu_kernel_fn fn, const size_t **sizes) {
    for (const entry &e : kernels)
        if (e.fn == fn) {
            *sizes = e.sizes;
            return e.n_params;
        }
    return -1;
}

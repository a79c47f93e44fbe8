/* swiglu.cu: elementwise steps (any grid; grid-stride loops): the gated MLP's activations (SwiGLU,
 * gemma's GeGLU), a scale (gemma's embedding) and the logits' soft cap (gemma's). The residual add is
 * fused with the norm after it (norm.cu's hr_k_add_rmsnorm). */
#include "common.cuh"

#define HR_K_GRID_STRIDE(i, n)                                                                                         \
    for (u64 i = (u64)ctaid_x() * (u64)ntid_x() + (u64)tid_x(), stride_ = (u64)ntid_x() * (u64)nctaid_x(); i < (n);    \
         i += stride_)

/* out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + e^-g); out may be gate or up. */
extern "C" __global__ void hr_k_swiglu(float *out, const float *gate, const float *up, u64 n) {
    HR_K_GRID_STRIDE(i, n) {
        float g = gate[i];
        out[i] = g / (1.0f + hr_expf(-g)) * up[i];
    }
}

/* out[i] = gelu(gate[i]) * up[i] with the tanh approximation, the CPU's hr_op_geglu_tanh:
 * 0.5 g (1 + tanh(z)), z = sqrt(2 / pi) g (1 + 0.044715 g^2), computed as g / (1 + e^(-2z)) (the same
 * value: 0.5 (1 + tanh z) is the logistic of 2z), which keeps its relative precision where 1 + tanh z
 * is small (g below -3) instead of cancelling; out may be gate or up. */
extern "C" __global__ void hr_k_geglu(float *out, const float *gate, const float *up, u64 n) {
    HR_K_GRID_STRIDE(i, n) {
        const float g = gate[i], z = 0.7978845608028654f * g * (1.0f + 0.044715f * g * g);
        out[i] = g / (1.0f + hr_expf(-2.0f * z)) * up[i];
    }
}

/* x[i] *= s */
extern "C" __global__ void hr_k_scale(float *x, float s, u64 n) { HR_K_GRID_STRIDE(i, n) x[i] *= s; }

/* x[i] = cap tanh(x[i] / cap), the CPU's soft cap of the logits */
extern "C" __global__ void hr_k_softcap(float *x, float cap, u64 n) {
    HR_K_GRID_STRIDE(i, n) x[i] = cap * hr_tanhf(x[i] / cap);
}

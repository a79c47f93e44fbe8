/* swiglu.cu: the gated MLP's activation (any grid; a grid-stride loop). The residual add is fused with
 * the norm after it (norm.cu's hr_k_add_rmsnorm). */
#include "common.cuh"

/* out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + e^-g); out may be gate or up. */
extern "C" __global__ void hr_k_swiglu(float *out, const float *gate, const float *up, u64 n) {
    u64 stride = (u64)ntid_x() * (u64)nctaid_x();
    for (u64 i = (u64)ctaid_x() * (u64)ntid_x() + (u64)tid_x(); i < n; i += stride) {
        float g = gate[i];
        out[i] = g / (1.0f + hr_expf(-g)) * up[i];
    }
}

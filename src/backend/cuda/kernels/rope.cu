/* rope.cu: a batch's queries and keys made ready for attention: biases, per-head norms, RoPE. */
#include "common.cuh"

/* q: [T][n_q][head_dim], k and v: [T][n_k][head_dim] (k NULL with n_k 0: q alone), in place, one launch;
 * token t = blockIdx.x at position pos[t]. In the CPU forward pass's order (backend/cpu/forward.c):
 *   1. bias (qwen2's Q/K/V biases; NULL: none): [n_q D | n_k D | n_k D] floats added to q, k and v;
 *   2. qn, kn (qwen3's per-head RMSNorm weights, D each; NULL: none): each Q head, each K head,
 *      x / sqrt(mean(x^2) + eps) * w, a warp a head;
 *   3. RoPE: the first n_rot dimensions of each Q and K head rotate, the rest pass. inv_freq[i] for
 *      i < n_rot / 2 is the CPU backend's own table (model/rope_yarn.c: base^(-2i / n_rot) in double,
 *      divided by the model's frequency factors (Llama 3's rope_freqs, LongRoPE's set) and times YaRN's
 *      correction, then rounded to float), and the angle is the CPU's: (float)pos * pos_scale (linear
 *      RoPE scaling; 1 without) times inv_freq[i] in float, so both rotate by the same float angle even
 *      where its rounding is large (position 10^5: a few 1e-3 rad). neox: pairs are (i, i + n_rot/2)
 *      (GPT-NeoX, Qwen, ...); otherwise adjacent (2i, 2i + 1) (Llama's GGUF layout). The rotated
 *      dimensions are then multiplied by attn_factor (LongRoPE's and YaRN's magnitude; 1 without).
 * The steps whose inputs are NULL cost nothing but a branch (the llama family has neither). */
extern "C" __global__ void hr_k_rope(float *q, float *k, float *v, const int *pos, const float *inv_freq,
                                     const float *bias, const float *qn, const float *kn, int n_q, int n_k,
                                     int head_dim, int n_rot, int neox, float pos_scale, float attn_factor, float eps) {
    const int t = ctaid_x(), half = n_rot / 2, D = head_dim;
    float *qt = q + (u64)t * (u64)n_q * (u64)D, *kt = k + (u64)t * (u64)n_k * (u64)D;
    if (bias) {
        float *vt = v + (u64)t * (u64)n_k * (u64)D;
        const int nq = n_q * D, nk = n_k * D;
        for (int j = tid_x(); j < nq + 2 * nk; j += ntid_x()) {
            if (j < nq)
                qt[j] += bias[j];
            else if (j < nq + nk)
                kt[j - nq] += bias[j];
            else
                vt[j - nq - nk] += bias[j];
        }
        __syncthreads();
    }
    if (qn || kn) {
        const int lane = tid_x() % HR_K_WARP, nw = ntid_x() / HR_K_WARP;
        for (int h = tid_x() / HR_K_WARP; h < n_q + n_k; h += nw) {
            const float *w = h < n_q ? qn : kn;
            if (!w) continue;
            float *x = h < n_q ? qt + (u64)h * (u64)D : kt + (u64)(h - n_q) * (u64)D;
            float ss = 0.0f;
            for (int i = lane; i < D; i += HR_K_WARP) ss += x[i] * x[i];
            ss = warp_sum(ss);
            const float inv = hr_rsqrtf(ss / (float)D + eps);
            for (int i = lane; i < D; i += HR_K_WARP) x[i] = x[i] * inv * w[i];
        }
        __syncthreads();
    }
    const float p = (float)pos[t] * pos_scale;
    for (int j = tid_x(); j < (n_q + n_k) * half; j += ntid_x()) {
        const int h = j / half, i = j % half;
        float theta = p * inv_freq[i];
        /* reduced to [-pi, pi] in double (exact for a float theta to far below the approximations'
         * error): sin.approx/cos.approx are accurate only near 0 */
        double a = (double)theta;
        a -= 6.283185307179586 * __builtin_floor(a / 6.283185307179586 + 0.5);
        const float c = hr_cos_approx((float)a), s = hr_sin_approx((float)a);
        float *xh = h < n_q ? qt + (u64)h * (u64)D : kt + (u64)(h - n_q) * (u64)D;
        const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        const float x0 = xh[i0], x1 = xh[i1];
        xh[i0] = (x0 * c - x1 * s) * attn_factor;
        xh[i1] = (x0 * s + x1 * c) * attn_factor;
    }
}

/* rope.cu: rotary position embedding over a batch's queries or keys. */
#include "common.cuh"

/* q: [T][n_q][head_dim] and k: [T][n_k][head_dim] (k NULL with n_k 0: q alone), rotated in place in
 * one launch; token t = blockIdx.x at position pos[t]; the first n_rot dimensions of each head rotate,
 * the rest pass. inv_freq[i] for i < n_rot / 2 is the CPU backend's own table (backend/cpu/forward.c:
 * base^(-2i / n_rot) in double, divided by the model's frequency factor (Llama 3's rope_freqs,
 * LongRoPE's set) and YaRN's, then rounded to float), and the angle is the CPU's: (float)pos *
 * inv_freq[i] in float, so both rotate by the same float angle even where its rounding is large
 * (position 10^5: a few 1e-3 rad). neox: pairs are (i, i + n_rot/2) (GPT-NeoX, Qwen, ...); otherwise
 * adjacent (2i, 2i + 1) (Llama's GGUF layout). */
extern "C" __global__ void hr_k_rope(float *q, float *k, const int *pos, const float *inv_freq, int n_q, int n_k,
                                     int head_dim, int n_rot, int neox) {
    const int t = ctaid_x(), half = n_rot / 2;
    const float p = (float)pos[t];
    for (int j = tid_x(); j < (n_q + n_k) * half; j += ntid_x()) {
        const int h = j / half, i = j % half;
        float theta = p * inv_freq[i];
        /* reduced to [-pi, pi] in double (exact for a float theta to far below the approximations'
         * error): sin.approx/cos.approx are accurate only near 0 */
        double a = (double)theta;
        a -= 6.283185307179586 * __builtin_floor(a / 6.283185307179586 + 0.5);
        const float c = hr_cos_approx((float)a), s = hr_sin_approx((float)a);
        float *xh = h < n_q ? q + ((u64)t * (u64)n_q + (u64)h) * (u64)head_dim
                            : k + ((u64)t * (u64)n_k + (u64)(h - n_q)) * (u64)head_dim;
        const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        const float x0 = xh[i0], x1 = xh[i1];
        xh[i0] = x0 * c - x1 * s;
        xh[i1] = x0 * s + x1 * c;
    }
}

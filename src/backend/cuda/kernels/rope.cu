/* rope.cu: rotary position embedding over a batch's queries or keys. */
#include "common.cuh"

/* x: [T][n_heads][head_dim], rotated in place; token t = blockIdx.x at position pos[t]; the first
 * n_rot dimensions of each head rotate, the rest pass. inv_freq[i] = base^(-2i / n_rot) for
 * i < n_rot / 2, computed by the host in double exactly as the CPU backend does; factors (NULL: none)
 * are the model's per-pair frequency factors (Llama 3's rope_freqs, LongRoPE's short or long set):
 * the pair's frequency is divided by its factor, as the CPU does. neox: pairs are (i, i + n_rot/2)
 * (GPT-NeoX, Qwen, ...); otherwise adjacent (2i, 2i + 1) (Llama's GGUF layout). */
extern "C" __global__ void hr_k_rope(float *x, const int *pos, const float *inv_freq, const float *factors, int n_heads,
                                     int head_dim, int n_rot, int neox) {
    int t = ctaid_x(), half = n_rot / 2;
    float *xt = x + (u64)t * (u64)n_heads * (u64)head_dim;
    double p = (double)pos[t];
    for (int j = tid_x(); j < n_heads * half; j += ntid_x()) {
        int h = j / half, i = j % half;
        float f = inv_freq[i];
        if (factors) f /= factors[i];
        /* the angle is reduced to [-pi, pi] in double: sin.approx/cos.approx are accurate only near 0,
         * and positions reach 10^5 and more */
        double a = p * (double)f;
        a -= 6.283185307179586 * __builtin_floor(a / 6.283185307179586 + 0.5);
        float c = __nvvm_cos_approx_f((float)a), s = __nvvm_sin_approx_f((float)a);
        float *xh = xt + (u64)h * (u64)head_dim;
        int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        float x0 = xh[i0], x1 = xh[i1];
        xh[i0] = x0 * c - x1 * s;
        xh[i1] = x0 * s + x1 * c;
    }
}

/* ops.h: the element-wise and row-wise operations of a transformer layer on the CPU (norms, RoPE,
 * activations, softmax). Each works on one row so the result of a row never depends on the batch
 * around it. Dimension letters: E = embedding width, D = head dim, F = FFN width. */
#ifndef HR_BACKEND_CPU_OPS_H
#define HR_BACKEND_CPU_OPS_H

#include <stdint.h>

/* out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i], i < n. out may alias x. */
void hr_op_rmsnorm(float *out, const float *x, const float *w, int n, float eps);

/* Rotary position embedding of one head vector x[D] in place, over its first n_rot dims.
 * inv_freq[i] (i < n_rot/2) is the angle per position of pair i (already including any frequency
 * scaling); pos_scaled is the position times the linear scaling factor.
 * neox == 0: pairs are (x[2i], x[2i+1]) (llama/mistral GGUF layout);
 * neox != 0: pairs are (x[i], x[i + n_rot/2]) (qwen2). */
void hr_op_rope(float *x, int n_rot, const float *inv_freq, float pos_scaled, int neox);

/* hr_op_rope in two halves, for the heads of one token, which all turn by the same angles: cs[2i] =
 * cos(pos_scaled * inv_freq[i]) and cs[2i+1] = its sine (i < n_rot/2), computed once per token, then
 * each head rotated with them; the same bits as hr_op_rope on every head (the same cosf / sinf of the
 * same angles, the same products). */
void hr_op_rope_angles(float *cs, int n_rot, const float *inv_freq, float pos_scaled);
void hr_op_rope_cs(float *x, int n_rot, const float *cs, int neox);

/* e^x for x <= 0 (a softmax's scores after their max, SwiGLU's -|g|): Cody-Waite reduction by ln 2,
 * the degree-6 Cephes polynomial by fmaf, about 1 ulp; below -87.3 (and NaN) the value at -87.3. One
 * lane of simd_avx2.h's hr_exp_neg8, step for step: the same bits. */
float hr_exp_neg(float x);

/* gate[i] = silu(gate[i]) * up[i] (SwiGLU), i < n, as hr_op_swiglu1: g raised to -87.3 where below
 * (silu there is under 1e-36; NaN stays NaN), e = hr_exp_neg(-|g|), silu(g) = g x (g >= 0 ? 1 : e) /
 * (1 + e) (no overflow for any g), times u. The kernels' table (kernels.h: swiglu) gives the same bits
 * with AVX2. */
float hr_op_swiglu1(float g, float u);
void hr_op_swiglu(float *gate, const float *up, int n);

/* gpt-oss's gated activation (llama.cpp's swiglu_oai, alpha 1.702, limit 7): g = min(gate[i], 7),
 * u = clamp(up[i], -7, 7), gate[i] = g / (1 + e^(-1.702 g)) * (u + 1), i < n. */
void hr_op_swiglu_oai(float *gate, const float *up, int n);

/* gate[i] = gelu(gate[i]) * up[i] (GeGLU), gelu by its tanh approximation
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), i < n. */
void hr_op_geglu_tanh(float *gate, const float *up, int n);

/* y[i] += x[i] */
void hr_op_add(float *y, const float *x, int n);

/* Numerically stable softmax in place over x[n]; returns nothing. */
void hr_op_softmax(float *x, int n);

#endif

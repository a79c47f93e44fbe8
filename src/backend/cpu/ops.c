/* ops.c: row-wise transformer operations (see ops.h). Plain C on purpose: these are a small share
 * of a step's time next to the matrix products and attention, and the compiler vectorizes them. The
 * exception is SwiGLU's exponential (libm's expf a lane was 3% of a 16-stream step): hr_op_swiglu is
 * the reference the kernels' table runs in AVX2 lanes (kernels.h: swiglu), by fmaf here (a library
 * call where the build's target has no FMA: --isa scalar is the slow, exact path). */
#include "backend/cpu/ops.h"

#include <math.h>
#include <string.h>

void hr_op_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    double ss = 0.0; /* a double accumulator: the norm of a 4096-wide row in f32 loses digits */
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
}

void hr_op_rope(float *x, int n_rot, const float *inv_freq, float pos_scaled, int neox) {
    int half = n_rot / 2;
    for (int i = 0; i < half; i++) {
        float theta = pos_scaled * inv_freq[i];
        float c = cosf(theta), s = sinf(theta);
        int a = neox ? i : 2 * i;
        int b = neox ? i + half : 2 * i + 1;
        float x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

void hr_op_rope_angles(float *cs, int n_rot, const float *inv_freq, float pos_scaled) {
    for (int i = 0; i < n_rot / 2; i++) {
        float theta = pos_scaled * inv_freq[i];
        cs[2 * i] = cosf(theta);
        cs[2 * i + 1] = sinf(theta);
    }
}

void hr_op_rope_cs(float *x, int n_rot, const float *cs, int neox) {
    int half = n_rot / 2;
    for (int i = 0; i < half; i++) {
        float c = cs[2 * i], s = cs[2 * i + 1];
        int a = neox ? i : 2 * i;
        int b = neox ? i + half : 2 * i + 1;
        float x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

float hr_exp_neg(float x) {
    x = x > -87.3f ? x : -87.3f;
    const float n = rintf(x * 1.44269504088896341f);
    float r = fmaf(-n, 0.693359375f, x);
    r = fmaf(-n, -2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    const float y = fmaf(p * r, r, r) + 1.0f;
    const uint32_t bits = (uint32_t)((int)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

float hr_op_swiglu1(float g, float u) {
    g = g < -87.3f ? -87.3f : g; /* silu there is below 1e-36 (NaN passes) */
    const float e = hr_exp_neg(-fabsf(g));
    return g * ((g >= 0.0f ? 1.0f : e) / (1.0f + e)) * u;
}

void hr_op_swiglu(float *gate, const float *up, int n) {
    for (int i = 0; i < n; i++) gate[i] = hr_op_swiglu1(gate[i], up[i]);
}

void hr_op_swiglu_oai(float *gate, const float *up, int n) {
    const float alpha = 1.702f, limit = 7.0f;
    for (int i = 0; i < n; i++) {
        const float g = fminf(gate[i], limit), u = fminf(fmaxf(up[i], -limit), limit);
        gate[i] = g / (1.0f + expf(alpha * -g)) * (u + 1.0f);
    }
}

void hr_op_geglu_tanh(float *gate, const float *up, int n) {
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    for (int i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = 0.5f * g * (1.0f + tanhf(k * g * (1.0f + 0.044715f * g * g))) * up[i];
    }
}

void hr_op_add(float *y, const float *x, int n) {
    for (int i = 0; i < n; i++) y[i] += x[i];
}

void hr_op_softmax(float *x, int n) {
    if (n <= 0) return;
    float mx = x[0];
    for (int i = 1; i < n; i++)
        if (x[i] > mx) mx = x[i];
    float sum = 0.0f;
    for (int i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = 1.0f / sum;
    for (int i = 0; i < n; i++) x[i] *= inv;
}

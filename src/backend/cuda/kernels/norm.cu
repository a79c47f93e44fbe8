/* norm.cu: RMSNorm and softmax, one thread block per row (grid.x = rows, blockDim.x = 256). */
#include "common.cuh"

/* out[r][i] = x[r][i] / sqrt(mean(x[r]^2) + eps) * w[i] for row r = blockIdx.x; out may be x. */
extern "C" __global__ void hr_k_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    __shared__ float red[32];
    const float *xr = x + (u64)ctaid_x() * (u64)n;
    float *outr = out + (u64)ctaid_x() * (u64)n;
    float ss = 0.0f;
    for (int i = tid_x(); i < n; i += ntid_x()) ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    float inv = hr_rsqrtf(ss / (float)n + eps);
    for (int i = tid_x(); i < n; i += ntid_x()) outr[i] = xr[i] * inv * w[i];
}

/* The residual add and the next RMSNorm in one pass: for row r = rows[i] (rows NULL: r = i), i =
 * blockIdx.x: x[r] += add[r] (add NULL: none), then out[i] = x[r] / sqrt(mean(x[r]^2) + eps) * w, the
 * sum of squares taken over the updated row (each thread squares the elements it wrote). out rows are
 * compact (out[i]), so the final norm of the rows that want logits is one launch. */
extern "C" __global__ void hr_k_add_rmsnorm(float *out, float *x, const float *add, const float *w, const int *rows,
                                            int n, float eps) {
    __shared__ float red[32];
    const u64 r = (u64)(rows ? rows[ctaid_x()] : ctaid_x());
    float *xr = x + r * (u64)n;
    float *outr = out + (u64)ctaid_x() * (u64)n;
    float ss = 0.0f;
    for (int i = tid_x(); i < n; i += ntid_x()) {
        const float v = add ? xr[i] + add[r * (u64)n + (u64)i] : xr[i];
        if (add) xr[i] = v;
        ss += v * v;
    }
    ss = block_sum(ss, red);
    const float inv = hr_rsqrtf(ss / (float)n + eps);
    for (int i = tid_x(); i < n; i += ntid_x()) outr[i] = xr[i] * inv * w[i];
}

/* x[r] = softmax(x[r]) in place over n columns, row r = blockIdx.x. The maximum is subtracted first,
 * so large logits do not overflow. */
extern "C" __global__ void hr_k_softmax(float *x, int n) {
    __shared__ float red[32];
    float *xr = x + (u64)ctaid_x() * (u64)n;
    float m = -__builtin_inff();
    for (int i = tid_x(); i < n; i += ntid_x()) m = xr[i] > m ? xr[i] : m;
    m = block_max(m, red);
    float s = 0.0f;
    for (int i = tid_x(); i < n; i += ntid_x()) {
        float e = hr_expf(xr[i] - m);
        xr[i] = e;
        s += e;
    }
    s = block_sum(s, red);
    float inv = 1.0f / s;
    for (int i = tid_x(); i < n; i += ntid_x()) xr[i] *= inv;
}

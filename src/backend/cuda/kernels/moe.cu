/* moe.cu: a mixture of experts' routing and its weighted sum (qwen3moe, Mixtral), around the experts'
 * products (gemv.cu's hr_k_gemv_moe_*). The CPU's steps (backend/cpu/forward.c: moe_route, moe_ffn). */
#include "common.cuh"

/* One warp a token (blockDim.x = 32, grid.x = T): its router logits p[t][0..NE) become probabilities
 * (the largest subtracted, the sum over the warp in float), then the K largest (ties to the lower
 * expert id) in descending order go to sel[t][0..K), and their probabilities renormalized by their sum
 * (clamped below at f16's smallest normal, llama.cpp's norm_w) to w[t][0..K). Lane l owns experts l,
 * l + 32, ...; a chosen expert's probability is set to -1 by its owner, so the next round passes it.
 * K <= 32 (the host checks). The CPU sums in double and selects among its own rounding of the same
 * probabilities: the two can pick differently only at a near-tie. */
extern "C" __global__ void hr_k_moe_route(float *p, int *sel, float *w, int NE, int K) {
    float *pt = p + (u64)ctaid_x() * (u64)NE;
    const int lane = tid_x();
    float m = -__builtin_inff();
    for (int e = lane; e < NE; e += HR_K_WARP) m = pt[e] > m ? pt[e] : m;
    m = warp_max(m);
    float s = 0.0f;
    for (int e = lane; e < NE; e += HR_K_WARP) {
        const float v = hr_expf(pt[e] - m);
        pt[e] = v;
        s += v;
    }
    const float inv = 1.0f / warp_sum(s);
    for (int e = lane; e < NE; e += HR_K_WARP) pt[e] *= inv;
    float mine_v = 0.0f, wsum = 0.0f;
    int mine_e = 0;
    for (int k = 0; k < K; k++) {
        float bv = -__builtin_inff(), bi = -1.0f;
        for (int e = lane; e < NE; e += HR_K_WARP)
            if (pt[e] >= 0.0f && argmax_beats(pt[e], (float)e, bv, bi)) bv = pt[e], bi = (float)e;
        warp_argmax(&bv, &bi);                    /* every lane: the round's expert and its probability */
        const int best = bi < 0.0f ? 0 : (int)bi; /* a row of NaN: expert 0, never out of the stack */
        if (best % HR_K_WARP == lane) pt[best] = -1.0f;
        if (lane == k) mine_v = bv, mine_e = best;
        wsum += bv;
    }
    const float ws = wsum < 6.103515625e-5f ? 6.103515625e-5f : wsum;
    if (lane < K) {
        sel[(u64)ctaid_x() * (u64)K + (u64)lane] = mine_e;
        w[(u64)ctaid_x() * (u64)K + (u64)lane] = mine_v / ws;
    }
}

/* y[t] = sum over k of w[t][k] out[t K + k], in rank order (the CPU's: w[0] o[0], then + w[k] o[k]);
 * token t = blockIdx.x, its E columns over the block's threads. */
extern "C" __global__ void hr_k_moe_sum(float *y, const float *out, const float *w, int E, int K) {
    const u64 t = (u64)ctaid_x();
    const float *wt = w + t * (u64)K, *o = out + t * (u64)K * (u64)E;
    for (int j = tid_x(); j < E; j += ntid_x()) {
        float acc = wt[0] * o[j];
        for (int k = 1; k < K; k++) acc += wt[k] * o[(u64)k * (u64)E + (u64)j];
        y[t * (u64)E + (u64)j] = acc;
    }
}

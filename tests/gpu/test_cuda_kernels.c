/* test_cuda_kernels.c: every CUDA kernel (src/backend/cuda/kernels) against the CPU's reference at a
 * few shapes, on a real GPU. Built only where clang-19 compiled the kernels; exits 77 (skipped) when
 * the GPU cannot be opened (no driver, no GPU, not sm_90). Its first run on a GPU will be
 * bench/gpu/check.sh's (docs/GPU.md). With a driver library as argv[1] it uses that instead:
 * ctest's test_cuda_kernels_emulated runs the same checks through the emulating driver (the kernels'
 * source run on the CPU, tests/cuda/emu_rt.c), which tests their logic, not the GPU.
 *
 * Tolerances: the kernels use the hardware's approximate exp2/rsqrt/sin/cos and add in another order
 * than the CPU, so results are compared with a relative tolerance (stated per kernel), never bit for
 * bit; the f16 and q8 dequantization is exact on both sides.
 *
 * The checks are split by subject over this file (main, the row kernels: norms, softmax, RoPE, SwiGLU,
 * argmax) and cuda_kernels_matrix.c, cuda_kernels_attn.c, cuda_kernels_prefill.c and
 * cuda_kernels_limits.c, all in this one program (cuda_kernels_test.h: what they share). */
#include "cuda_kernels_test.h"

#include "backend/cpu/ops.h"
#include "sampler/sampler.h"

static void test_rmsnorm_softmax(kt_ctx *kt) {
    static const int ns[] = {1, 7, 64, 288, 4096, 5000};
    for (size_t si = 0; si < sizeof ns / sizeof ns[0]; si++) {
        int n = ns[si], rows = 3;
        float *x = malloc(sizeof(float) * n * rows), *w = malloc(sizeof(float) * n);
        float *ref = malloc(sizeof(float) * n * rows), *got = malloc(sizeof(float) * n * rows);
        fill(kt, x, (size_t)n * rows, 4.0f);
        fill(kt, w, (size_t)n, 1.0f);
        for (int r = 0; r < rows; r++) hr_op_rmsnorm(ref + r * n, x + r * n, w, n, 1e-5f);
        uint64_t dx = up(kt, x, sizeof(float) * n * rows), dw = up(kt, w, sizeof(float) * n),
                 dout = up(kt, x, sizeof(float) * n * rows);
        float eps = 1e-5f;
        void *a[] = {&dout, &dx, &dw, &n, &eps};
        if (launch(kt, "hr_k_rmsnorm", (unsigned)rows, 1, a)) {
            down(kt, got, dout, sizeof(float) * n * rows);
            double r = max_rel(got, ref, (size_t)n * rows, 1e-3);
            CHECKF(r < 1e-4, "rmsnorm n=%d: relative error %g", n, r);
        }
        /* the residual add and the norm in one launch, for rows 2 and 0 (compact out rows) */
        {
            float *add = malloc(sizeof(float) * n * rows), *xs = malloc(sizeof(float) * n * rows);
            fill(kt, add, (size_t)n * rows, 1.0f);
            int rows_idx[2] = {2, 0};
            for (size_t i = 0; i < (size_t)n * rows; i++) xs[i] = x[i];
            for (int j = 0; j < 2; j++) {
                float *xr = xs + (size_t)rows_idx[j] * n;
                for (int i = 0; i < n; i++) xr[i] += add[(size_t)rows_idx[j] * n + i];
                hr_op_rmsnorm(ref + (size_t)j * n, xr, w, n, 1e-5f);
            }
            uint64_t dx2 = up(kt, x, sizeof(float) * n * rows), dadd = up(kt, add, sizeof(float) * n * rows),
                     drows = up(kt, rows_idx, sizeof rows_idx);
            void *c[] = {&dout, &dx2, &dadd, &dw, &drows, &n, &eps};
            if (launch(kt, "hr_k_add_rmsnorm", 2, 1, c)) {
                down(kt, got, dout, sizeof(float) * n * 2);
                double r = max_rel(got, ref, (size_t)n * 2, 1e-3);
                CHECKF(r < 1e-4, "add_rmsnorm n=%d: relative error %g", n, r);
                down(kt, got, dx2, sizeof(float) * n * rows); /* the residual rows updated, row 1 not */
                CHECKF(max_rel(got, xs, (size_t)n * rows, 1e-6) < 1e-6, "add_rmsnorm n=%d: residual", n);
            }
            hr_cuda_free(kt->dev, dx2), hr_cuda_free(kt->dev, dadd), hr_cuda_free(kt->dev, drows);
            free(add), free(xs);
        }
        /* softmax in place on the device's copy of x, rows of n */
        for (int r = 0; r < rows; r++) {
            memcpy(ref + r * n, x + r * n, sizeof(float) * n);
            hr_op_softmax(ref + r * n, n);
        }
        void *b[] = {&dx, &n};
        if (launch(kt, "hr_k_softmax", (unsigned)rows, 1, b)) {
            down(kt, got, dx, sizeof(float) * n * rows);
            double r = max_rel(got, ref, (size_t)n * rows, 1e-6);
            CHECKF(r < 1e-4, "softmax n=%d: relative error %g", n, r);
        }
        hr_cuda_free(kt->dev, dx);
        hr_cuda_free(kt->dev, dw);
        hr_cuda_free(kt->dev, dout);
        free(x), free(w), free(ref), free(got);
    }
}

/* hr_k_argmax_rows against the CPU sampler's greedy choice (hr_argmax), which it must equal exactly, at
 * vocab sizes that are not a multiple of the block's 256 threads; and against the answer each made-up row
 * was built to have: ties (the lowest index), -inf rows, NaN (never chosen, but for hr_argmax's x[0]),
 * +inf twice, -0 tied with 0, the maximum in the last column. */
enum { AM_ROWS = 14 };
static int argmax_row(kt_ctx *kt, float *x, int n, int kind) {
    const float inf = INFINITY, nan = NAN;
    const int last = n - 1, mid = n / 2, late = n > 300 ? 300 : last; /* late: another thread and warp */
    fill(kt, x, (size_t)n, 8.0f);
    switch (kind) {
    case 0: return -1; /* random: hr_argmax's choice only */
    case 1:
        for (int i = 0; i < n; i++) x[i] = 1.5f;
        return 0;
    case 2: x[mid] = x[late] = x[last] = 9.0f; return mid < late ? mid : late; /* above fill's 8: the first */
    case 3:
        for (int i = 0; i < n; i++) x[i] = -inf;
        return 0;
    case 4:
        for (int i = 0; i < n; i++) x[i] = -inf;
        x[last] = -1e30f;
        return last;
    case 5:
        for (int i = 1; i < n; i += 3) x[i] = nan;
        x[last] = 9.0f;
        return last; /* NaN before it, not chosen */
    case 6:
        x[0] = nan;
        x[mid] = 9.0f;
        return 0; /* hr_argmax keeps x[0] when it is NaN */
    case 7:
        for (int i = 0; i < n; i++) x[i] = nan;
        return 0;
    case 8: x[late] = x[mid] = inf; return mid < late ? mid : late;
    case 9:
        for (int i = 0; i < n; i++) x[i] = -1.0f - (float)i;
        x[late] = 0.0f, x[mid] = -0.0f;
        return mid < late ? mid : late;
    case 10: x[last] = 9.0f; return last;
    case 11:
        for (int i = 1; i < n; i++) x[i] = nan;
        x[0] = -inf;
        return 0;
    case 12:
        for (int i = 1; i < n; i++) x[i] = i == late ? 9.0f : nan;
        x[0] = -inf;
        return late;
    default: return -1; /* random */
    }
}

static void test_argmax_rows(kt_ctx *kt) {
    static const int ns[] = {1, 5, 255, 257, 1000, 4099};
    for (size_t si = 0; si < sizeof ns / sizeof ns[0]; si++) {
        int n = ns[si];
        float *x = malloc(sizeof(float) * (size_t)n * AM_ROWS);
        int want[AM_ROWS], got[AM_ROWS], cpu[AM_ROWS];
        for (int r = 0; r < AM_ROWS; r++) {
            want[r] = argmax_row(kt, x + (size_t)r * n, n, r);
            cpu[r] = hr_argmax(x + (size_t)r * n, n);
            got[r] = -7;
        }
        uint64_t dx = up(kt, x, sizeof(float) * (size_t)n * AM_ROWS), dids = up(kt, got, sizeof got);
        void *a[] = {&dids, &dx, &n};
        if (launch(kt, "hr_k_argmax_rows", AM_ROWS, 1, a)) {
            down(kt, got, dids, sizeof got);
            for (int r = 0; r < AM_ROWS; r++) {
                CHECKF(got[r] == cpu[r], "argmax_rows n=%d row %d: %d, the CPU's %d", n, r, got[r], cpu[r]);
                if (want[r] >= 0)
                    CHECKF(cpu[r] == want[r], "argmax n=%d row %d: %d, built for %d", n, r, cpu[r], want[r]);
            }
        }
        hr_cuda_free(kt->dev, dx), hr_cuda_free(kt->dev, dids);
        free(x);
    }
}

/* RoPE with the CPU's own frequency table (factors applied in double, as forward.c does): the same
 * float angle on both sides, so only the sin/cos differ, even at position 131071. The same launch
 * first adds qwen2's Q/K/V biases and applies qwen3's per-head Q/K norms where it is given them, and
 * turns by a linear position scale and a magnitude (YaRN, LongRoPE): each variant against the CPU
 * forward pass's steps in its order (bias, hr_op_rmsnorm per head, hr_op_rope, the factor). */
static void test_rope(kt_ctx *kt) {
    for (int variant = 0; variant < 4; variant++) {
        int neox = variant & 1, qwen = variant >> 1;
        enum { T = 5, H = 4, HK = 2, D = 64 };
        int n_rot = qwen ? 48 : 64, heads = H, kheads = HK, hd = D; /* qwen: 16 dims of each head pass */
        float pos_scale = qwen ? 0.25f : 1.0f, factor = qwen ? 1.0625f : 1.0f, eps = 1e-6f;
        int pos[T] = {0, 1, 17, 4095, 131071};
        float inv[D / 2];
        for (int i = 0; i < n_rot / 2; i++) {
            double fac = i < 8 ? 1.0 : i < 24 ? 2.5 : 8.0; /* Llama 3's low/mid/high frequency bands, made up */
            inv[i] = (float)(pow(500000.0, -2.0 * i / n_rot) / fac);
        }
        /* queries (H heads), keys and values (HK heads) in one launch */
        static float x[T * H * D], ref[T * H * D], got[T * H * D], k[T * HK * D], kref[T * HK * D], kgot[T * HK * D],
            v[T * HK * D], vref[T * HK * D], vgot[T * HK * D], bias[(H + 2 * HK) * D], qn[D], kn[D];
        fill(kt, x, T * H * D, 2.0f);
        fill(kt, k, T * HK * D, 2.0f);
        fill(kt, v, T * HK * D, 2.0f);
        fill(kt, bias, (H + 2 * HK) * D, 4.0f);
        fill(kt, qn, D, 2.0f);
        fill(kt, kn, D, 2.0f);
        memcpy(ref, x, sizeof x);
        memcpy(kref, k, sizeof k);
        memcpy(vref, v, sizeof v);
        for (int t = 0; t < T; t++) {
            float *qt = ref + t * H * D, *kr = kref + t * HK * D, *vt = vref + t * HK * D;
            if (qwen) {
                for (int i = 0; i < H * D; i++) qt[i] += bias[i];
                for (int i = 0; i < HK * D; i++) kr[i] += bias[H * D + i], vt[i] += bias[(H + HK) * D + i];
                for (int h = 0; h < H; h++) hr_op_rmsnorm(qt + h * D, qt + h * D, qn, D, eps);
                for (int h = 0; h < HK; h++) hr_op_rmsnorm(kr + h * D, kr + h * D, kn, D, eps);
            }
            for (int h = 0; h < H + HK; h++) {
                float *xh = h < H ? qt + h * D : kr + (h - H) * D;
                hr_op_rope(xh, n_rot, inv, (float)pos[t] * pos_scale, neox);
                for (int i = 0; i < n_rot; i++) xh[i] *= factor;
            }
        }
        uint64_t dx = up(kt, x, sizeof x), dk = up(kt, k, sizeof k), dv = up(kt, v, sizeof v),
                 dpos = up(kt, pos, sizeof pos), dinv = up(kt, inv, sizeof inv);
        uint64_t dbias = qwen ? up(kt, bias, sizeof bias) : 0, dqn = qwen ? up(kt, qn, sizeof qn) : 0,
                 dkn = qwen ? up(kt, kn, sizeof kn) : 0;
        void *a[] = {&dx,    &dk,     &dv, &dpos,  &dinv, &dbias,     &dqn,    &dkn,
                     &heads, &kheads, &hd, &n_rot, &neox, &pos_scale, &factor, &eps};
        if (launch(kt, "hr_k_rope", T, 1, a)) {
            down(kt, got, dx, sizeof got);
            down(kt, kgot, dk, sizeof kgot);
            down(kt, vgot, dv, sizeof vgot);
            /* relative to |x| >= 1: sin.approx / cos.approx of the reduced angle (about 1e-6), the norm's
             * rsqrt.approx (2^-22) and its sum's order */
            double worst = 0;
            for (int i = 0; i < T * H * D; i++)
                worst = fmax(worst, fabs((double)got[i] - ref[i]) / fmax(1, fabs(ref[i])));
            for (int i = 0; i < T * HK * D; i++) {
                worst = fmax(worst, fabs((double)kgot[i] - kref[i]) / fmax(1, fabs(kref[i])));
                worst = fmax(worst, fabs((double)vgot[i] - vref[i]) / fmax(1, fabs(vref[i])));
            }
            CHECKF(worst < 2e-5, "rope neox=%d %s: error %g", neox, qwen ? "with biases, norms, scale" : "plain",
                   worst);
            if (qwen)
                printf("rope with biases, Q/K norms, position scale and magnitude (neox=%d): within %.2g\n", neox,
                       worst);
        }
        hr_cuda_free(kt->dev, dx), hr_cuda_free(kt->dev, dk), hr_cuda_free(kt->dev, dv), hr_cuda_free(kt->dev, dpos);
        hr_cuda_free(kt->dev, dinv), hr_cuda_free(kt->dev, dbias), hr_cuda_free(kt->dev, dqn),
            hr_cuda_free(kt->dev, dkn);
    }
}

/* The elementwise kernels against the CPU's: SwiGLU and gemma's GeGLU (relative: the hardware's exp
 * approximation), the embedding's scale (exact) and the logits' soft cap (absolute,
 * cap 30: tanh through the exp approximation near 0 loses a few ulps of 1) */
static void test_swiglu(kt_ctx *kt) {
    unsigned long long n = 100003;
    float *g = malloc(sizeof(float) * n), *u = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n),
          *ref = malloc(sizeof(float) * n);
    for (int kind = 0; kind < 4; kind++) {
        static const char *const names[] = {"hr_k_swiglu", "hr_k_geglu", "hr_k_scale", "hr_k_softcap"};
        fill(kt, g, n, kind == 3 ? 100.0f : 8.0f);
        fill(kt, u, n, 2.0f);
        memcpy(ref, g, sizeof(float) * n);
        uint64_t dg = up(kt, g, sizeof(float) * n), du = up(kt, u, sizeof(float) * n);
        float s = kind == 2 ? 45.254833995939045f : 30.0f; /* gemma's sqrt(2048); its final cap */
        void *act[] = {&dg, &dg, &du, &n}, *sc[] = {&dg, &s, &n};
        if (kind == 0) hr_op_swiglu(ref, u, (int)n);
        if (kind == 1) hr_op_geglu_tanh(ref, u, (int)n);
        for (unsigned long long i = 0; kind >= 2 && i < n; i++) ref[i] = kind == 2 ? ref[i] * s : s * tanhf(ref[i] / s);
        if (launch(kt, names[kind], 64, 1, kind < 2 ? act : sc)) {
            down(kt, got, dg, sizeof(float) * n);
            /* GeGLU's floor is 1: the CPU's 0.5 g (1 + tanh z) cancels where 1 + tanh z is small (g below
             * -3), an absolute error of a few ulps of 1 times |g u|, which the GPU's logistic form avoids */
            double r = kind < 2 ? max_rel(got, ref, n, kind == 1 ? 1.0 : 1e-3) : 0;
            for (unsigned long long i = 0; kind >= 2 && i < n; i++) r = fmax(r, fabs((double)got[i] - ref[i]));
            const double bound = kind < 2 ? 1e-4 : kind == 2 ? 0 : 3e-5;
            CHECKF(r <= bound, "%s: error %g (bound %g)", names[kind], r, bound);
        }
        hr_cuda_free(kt->dev, dg), hr_cuda_free(kt->dev, du);
    }
    free(g), free(u), free(got), free(ref);
}

int main(int argc, char **argv) {
    hr_error e = {0};
    kt_ctx ctx = {.rng = 2024}, *kt = &ctx;
    /* argv[1]: a driver library to use instead of libcuda.so.1 (ctest's test_cuda_kernels_emulated
     * names the emulating one; its failure to open is a failure, not a skip) */
    const char *driver = argc > 1 ? argv[1] : NULL;
    if (hr_cuda_device_open(driver, 0, &kt->dev, &e) != HR_OK) {
        if (driver) {
            CHECKF(false, "%s", e.msg);
            return hr_test_finish();
        }
        HR_SKIP("%s", e.msg);
    }
    printf("GPU: %s\n", hr_cuda_device_name(kt->dev));
    if (driver) test_emulator(driver);
    test_rmsnorm_softmax(kt);
    test_rope(kt);
    test_swiglu(kt);
    test_embed_gemv(kt);
    test_moe_gemv(kt);
    test_moe_route(kt);
    test_mma_selftest(kt);
    test_gemm(kt);
    test_attention(kt);
    test_attention_masks(kt);
    test_attention_deferred(kt);
    test_prefill_runs();
    test_prefill_attention(kt);
    test_argmax_rows(kt); /* last: its random rows leave the others' data as it was */
    hr_cuda_device_close(kt->dev);
    return hr_test_finish();
}

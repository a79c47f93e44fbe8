/* test_cuda_kernels.c: every CUDA kernel (src/backend/cuda/kernels) against the CPU's reference at a
 * few shapes, on a real GPU. Built only where clang-19 compiled the kernels; exits 77 (skipped) when
 * the GPU cannot be opened (no driver, no GPU, not sm_90). Its first run on a GPU will be
 * bench/gpu/check.sh's (docs/GPU.md). With a driver library as argv[1] it uses that instead:
 * ctest's test_cuda_kernels_emulated runs the same checks through the emulating driver (the kernels'
 * source run on the CPU, tests/cuda/emu_rt.c), which tests their logic, not the GPU.
 *
 * Tolerances: the kernels use the hardware's approximate exp2/rsqrt/sin/cos and add in another order
 * than the CPU, so results are compared with a relative tolerance (stated per kernel), never bit for
 * bit; the f16 and q8 dequantization is exact on both sides. */
#include <dlfcn.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kv_storage_cpu.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/cuda.h"
#include "harness.h"
#include "sampler/sampler.h"
#include "tensor/tensor.h"

static hr_cuda_device *dev;

static uint32_t rng = 2024;
static float frand(void) { /* [-1, 1) */
    rng = rng * 1664525u + 1013904223u;
    return (float)(rng >> 8) / 8388608.0f - 1.0f;
}
static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = frand() * scale;
}

/* max |a - b| / max(|b|, floor) over n */
static double max_rel(const float *a, const float *b, size_t n, double floor) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / fmax(fabs((double)b[i]), floor);
        if (!(d <= worst)) worst = d; /* NaN counts as worst */
    }
    return worst;
}

/* device copies of host arrays; freed by the caller */
static uint64_t up(const void *x, size_t bytes) {
    uint64_t p = 0;
    hr_error e;
    if (hr_cuda_alloc(dev, bytes, &p, &e) || hr_cuda_upload(dev, p, x, bytes, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        exit(1);
    }
    return p;
}
static void down(void *x, uint64_t p, size_t bytes) {
    hr_error e;
    if (hr_cuda_download(dev, x, p, bytes, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        exit(1);
    }
}
static bool launch(const char *k, unsigned gx, unsigned gy, void **args) {
    hr_error e;
    hr_status st = hr_cuda_launch(dev, k, gx, gy, 256, args, &e);
    CHECKF(st == HR_OK, "%s: %s", k, e.msg);
    return st == HR_OK;
}

static void test_rmsnorm_softmax(void) {
    static const int ns[] = {1, 7, 64, 288, 4096, 5000};
    for (size_t si = 0; si < sizeof ns / sizeof ns[0]; si++) {
        int n = ns[si], rows = 3;
        float *x = malloc(sizeof(float) * n * rows), *w = malloc(sizeof(float) * n);
        float *ref = malloc(sizeof(float) * n * rows), *got = malloc(sizeof(float) * n * rows);
        fill(x, (size_t)n * rows, 4.0f);
        fill(w, (size_t)n, 1.0f);
        for (int r = 0; r < rows; r++) hr_op_rmsnorm(ref + r * n, x + r * n, w, n, 1e-5f);
        uint64_t dx = up(x, sizeof(float) * n * rows), dw = up(w, sizeof(float) * n),
                 dout = up(x, sizeof(float) * n * rows);
        float eps = 1e-5f;
        void *a[] = {&dout, &dx, &dw, &n, &eps};
        if (launch("hr_k_rmsnorm", (unsigned)rows, 1, a)) {
            down(got, dout, sizeof(float) * n * rows);
            double r = max_rel(got, ref, (size_t)n * rows, 1e-3);
            CHECKF(r < 1e-4, "rmsnorm n=%d: relative error %g", n, r);
        }
        /* the residual add and the norm in one launch, for rows 2 and 0 (compact out rows) */
        {
            float *add = malloc(sizeof(float) * n * rows), *xs = malloc(sizeof(float) * n * rows);
            fill(add, (size_t)n * rows, 1.0f);
            int rows_idx[2] = {2, 0};
            for (size_t i = 0; i < (size_t)n * rows; i++) xs[i] = x[i];
            for (int j = 0; j < 2; j++) {
                float *xr = xs + (size_t)rows_idx[j] * n;
                for (int i = 0; i < n; i++) xr[i] += add[(size_t)rows_idx[j] * n + i];
                hr_op_rmsnorm(ref + (size_t)j * n, xr, w, n, 1e-5f);
            }
            uint64_t dx2 = up(x, sizeof(float) * n * rows), dadd = up(add, sizeof(float) * n * rows),
                     drows = up(rows_idx, sizeof rows_idx);
            void *c[] = {&dout, &dx2, &dadd, &dw, &drows, &n, &eps};
            if (launch("hr_k_add_rmsnorm", 2, 1, c)) {
                down(got, dout, sizeof(float) * n * 2);
                double r = max_rel(got, ref, (size_t)n * 2, 1e-3);
                CHECKF(r < 1e-4, "add_rmsnorm n=%d: relative error %g", n, r);
                down(got, dx2, sizeof(float) * n * rows); /* the residual rows updated, row 1 not */
                CHECKF(max_rel(got, xs, (size_t)n * rows, 1e-6) < 1e-6, "add_rmsnorm n=%d: residual", n);
            }
            hr_cuda_free(dev, dx2), hr_cuda_free(dev, dadd), hr_cuda_free(dev, drows);
            free(add), free(xs);
        }
        /* softmax in place on the device's copy of x, rows of n */
        for (int r = 0; r < rows; r++) {
            memcpy(ref + r * n, x + r * n, sizeof(float) * n);
            hr_op_softmax(ref + r * n, n);
        }
        void *b[] = {&dx, &n};
        if (launch("hr_k_softmax", (unsigned)rows, 1, b)) {
            down(got, dx, sizeof(float) * n * rows);
            double r = max_rel(got, ref, (size_t)n * rows, 1e-6);
            CHECKF(r < 1e-4, "softmax n=%d: relative error %g", n, r);
        }
        hr_cuda_free(dev, dx);
        hr_cuda_free(dev, dw);
        hr_cuda_free(dev, dout);
        free(x), free(w), free(ref), free(got);
    }
}

/* hr_k_argmax_rows against the CPU sampler's greedy choice (hr_argmax), which it must equal exactly, at
 * vocab sizes that are not a multiple of the block's 256 threads; and against the answer each made-up row
 * was built to have: ties (the lowest index), -inf rows, NaN (never chosen, but for hr_argmax's x[0]),
 * +inf twice, -0 tied with 0, the maximum in the last column. */
enum { AM_ROWS = 14 };
static int argmax_row(float *x, int n, int kind) {
    const float inf = INFINITY, nan = NAN;
    const int last = n - 1, mid = n / 2, late = n > 300 ? 300 : last; /* late: another thread and warp */
    fill(x, (size_t)n, 8.0f);
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

static void test_argmax_rows(void) {
    static const int ns[] = {1, 5, 255, 257, 1000, 4099};
    for (size_t si = 0; si < sizeof ns / sizeof ns[0]; si++) {
        int n = ns[si];
        float *x = malloc(sizeof(float) * (size_t)n * AM_ROWS);
        int want[AM_ROWS], got[AM_ROWS], cpu[AM_ROWS];
        for (int r = 0; r < AM_ROWS; r++) {
            want[r] = argmax_row(x + (size_t)r * n, n, r);
            cpu[r] = hr_argmax(x + (size_t)r * n, n);
            got[r] = -7;
        }
        uint64_t dx = up(x, sizeof(float) * (size_t)n * AM_ROWS), dids = up(got, sizeof got);
        void *a[] = {&dids, &dx, &n};
        if (launch("hr_k_argmax_rows", AM_ROWS, 1, a)) {
            down(got, dids, sizeof got);
            for (int r = 0; r < AM_ROWS; r++) {
                CHECKF(got[r] == cpu[r], "argmax_rows n=%d row %d: %d, the CPU's %d", n, r, got[r], cpu[r]);
                if (want[r] >= 0)
                    CHECKF(cpu[r] == want[r], "argmax n=%d row %d: %d, built for %d", n, r, cpu[r], want[r]);
            }
        }
        hr_cuda_free(dev, dx), hr_cuda_free(dev, dids);
        free(x);
    }
}

/* RoPE with the CPU's own frequency table (factors applied in double, as forward.c does): the same
 * float angle on both sides, so only the sin/cos differ, even at position 131071 */
static void test_rope(void) {
    for (int neox = 0; neox < 2; neox++) {
        enum { T = 5, H = 4, D = 64 };
        int n_rot = 64, heads = H, hd = D;
        int pos[T] = {0, 1, 17, 4095, 131071};
        float inv[D / 2];
        for (int i = 0; i < n_rot / 2; i++) {
            double fac = i < 8 ? 1.0 : i < 24 ? 2.5 : 8.0; /* Llama 3's low/mid/high frequency bands, made up */
            inv[i] = (float)(pow(500000.0, -2.0 * i / n_rot) / fac);
        }
        /* queries (H heads) and keys (HK heads) in one launch */
        enum { HK = 2 };
        int kheads = HK;
        float x[T * H * D], ref[T * H * D], got[T * H * D], k[T * HK * D], kref[T * HK * D], kgot[T * HK * D];
        fill(x, T * H * D, 2.0f);
        fill(k, T * HK * D, 2.0f);
        memcpy(ref, x, sizeof x);
        memcpy(kref, k, sizeof k);
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < H; h++) hr_op_rope(ref + (t * H + h) * D, n_rot, inv, (float)pos[t], neox);
            for (int h = 0; h < HK; h++) hr_op_rope(kref + (t * HK + h) * D, n_rot, inv, (float)pos[t], neox);
        }
        uint64_t dx = up(x, sizeof x), dk = up(k, sizeof k), dpos = up(pos, sizeof pos), dinv = up(inv, sizeof inv);
        void *a[] = {&dx, &dk, &dpos, &dinv, &heads, &kheads, &hd, &n_rot, &neox};
        if (launch("hr_k_rope", T, 1, a)) {
            down(got, dx, sizeof got);
            down(kgot, dk, sizeof kgot);
            /* absolute, |x| < 2: sin.approx / cos.approx of the reduced angle (about 1e-6) */
            double worst = 0;
            for (int i = 0; i < T * H * D; i++) worst = fmax(worst, fabs((double)got[i] - ref[i]));
            for (int i = 0; i < T * HK * D; i++) worst = fmax(worst, fabs((double)kgot[i] - kref[i]));
            CHECKF(worst < 2e-5, "rope neox=%d: absolute error %g", neox, worst);
        }
        hr_cuda_free(dev, dx), hr_cuda_free(dev, dk), hr_cuda_free(dev, dpos), hr_cuda_free(dev, dinv);
    }
}

static void test_swiglu(void) {
    unsigned long long n = 100003;
    float *g = malloc(sizeof(float) * n), *u = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    fill(g, n, 8.0f);
    fill(u, n, 2.0f);
    uint64_t dg = up(g, sizeof(float) * n), du = up(u, sizeof(float) * n);
    hr_op_swiglu(g, u, (int)n); /* g becomes the reference */
    void *a[] = {&dg, &dg, &du, &n};
    if (launch("hr_k_swiglu", 64, 1, a)) {
        down(got, dg, sizeof(float) * n);
        double r = max_rel(got, g, n, 1e-3);
        CHECKF(r < 1e-4, "swiglu: relative error %g", r);
    }
    hr_cuda_free(dev, dg), hr_cuda_free(dev, du);
    free(g), free(u), free(got);
}

/* embedding rows and GEMV over q8_0 / q4_0 matrices made by the CPU's reference quantizer */
static void test_embed_gemv(void) {
    static const struct {
        hr_dtype t;
        const char *gemv;
        int type;
    } types[] = {{HR_DTYPE_Q8_0, "hr_k_gemv_q8_0", 2},  {HR_DTYPE_Q4_0, "hr_k_gemv_q4_0", -1},
                 {HR_DTYPE_F16, "hr_k_gemv_f16", 1},    {HR_DTYPE_F32, "hr_k_gemv_f32", 0},
                 {HR_DTYPE_BF16, "hr_k_gemv_bf16", -1}, {HR_DTYPE_Q4_K, "hr_k_gemv_q4_K", -1},
                 {HR_DTYPE_Q5_K, "hr_k_gemv_q5_K", -1}, {HR_DTYPE_Q6_K, "hr_k_gemv_q6_K", -1},
                 {HR_DTYPE_Q5_0, "hr_k_gemv_q5_0", -1}, {HR_DTYPE_Q5_1, "hr_k_gemv_q5_1", -1}};
    /* rows, cols, tokens: 11 tokens cross the kernel's tile of 8; 172 columns (stories260K's FFN) end
     * in a short run for the float types */
    static const int shapes[][3] = {{1, 32, 1},   {7, 64, 11}, {33, 288, 3},   {3, 256, 11},
                                    {5, 172, 11}, {9, 768, 9}, {512, 4096, 1}, {100, 11008, 2}};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            int rows = shapes[si][0], cols = shapes[si][1], T = shapes[si][2];
            if (cols % hr_dtype_get_info(types[ti].t)->block_elems) continue; /* K-quants: rows of 256s */
            size_t rb = hr_dtype_row_bytes(types[ti].t, cols);
            unsigned char *W = malloc(rb * rows);
            float *wf = malloc(sizeof(float) * cols * rows), *x = malloc(sizeof(float) * cols * T);
            size_t out_n = (size_t)(rows > 4 ? rows : 4) * (size_t)(cols > T ? cols : T);
            float *ref = malloc(sizeof(float) * out_n), *got = malloc(sizeof(float) * out_n);
            fill(wf, (size_t)cols * rows, 1.0f);
            fill(x, (size_t)cols * T, 1.0f);
            for (int r = 0; r < rows; r++) {
                hr_quantize_row_ref(types[ti].t, wf + (size_t)r * cols, W + rb * r, cols);
                hr_dequantize_row_ref(types[ti].t, W + rb * r, wf + (size_t)r * cols, cols); /* what the GPU sees */
            }
            uint64_t dW = up(W, rb * rows), dx = up(x, sizeof(float) * cols * T), dy = up(ref, sizeof(float) * out_n);
            if (types[ti].gemv) {
                for (int t = 0; t < T; t++)
                    for (int r = 0; r < rows; r++) {
                        double s = 0;
                        for (int c = 0; c < cols; c++) s += (double)wf[(size_t)r * cols + c] * x[(size_t)t * cols + c];
                        ref[(size_t)t * rows + r] = (float)s;
                    }
                void *a[] = {&dy, &dW, &dx, &rows, &cols, &T};
                if (launch(types[ti].gemv, (unsigned)(rows + HR_CUDA_GEMV_ROWS - 1) / HR_CUDA_GEMV_ROWS,
                           (unsigned)(T + HR_CUDA_GEMV_TOKENS - 1) / HR_CUDA_GEMV_TOKENS, a)) {
                    down(got, dy, sizeof(float) * rows * T);
                    double worst = 0;
                    for (int i = 0; i < rows * T; i++)
                        worst = fmax(worst, fabs((double)got[i] - ref[i]) / sqrt((double)cols));
                    CHECKF(worst < 1e-5, "%s %dx%d, %d tokens: error / sqrt(cols) %g", types[ti].gemv, rows, cols, T,
                           worst);
                }
            }
            if (types[ti].type >= 0) { /* embedding: 4 ids, one repeated, the last row */
                int ids[4] = {0, rows - 1, rows / 2, 0}, type = types[ti].type;
                for (int i = 0; i < 4; i++)
                    memcpy(ref + (size_t)i * cols, wf + (size_t)ids[i] * cols, sizeof(float) * cols);
                uint64_t dids = up(ids, sizeof ids), dout = up(ref, sizeof(float) * 4 * cols);
                void *a[] = {&dout, &dW, &dids, &cols, &type};
                if (launch("hr_k_embed", 4, 1, a)) {
                    down(got, dout, sizeof(float) * 4 * cols);
                    CHECKF(memcmp(got, ref, sizeof(float) * 4 * cols) == 0, "embed type %d %dx%d: not exact", type,
                           rows, cols);
                }
                hr_cuda_free(dev, dids), hr_cuda_free(dev, dout);
            }
            hr_cuda_free(dev, dW), hr_cuda_free(dev, dx), hr_cuda_free(dev, dy);
            free(W), free(wf), free(x), free(ref), free(got);
        }
}

/* ---- tensor cores (kernels/gemm.cu) ---- */

/* a value as the mma's 16-bit input (f16: IEEE half, else bfloat16): its bits, and *v the value */
static uint16_t to16(float f, bool f16, float *v) {
    uint16_t h = f16 ? hr_f32_to_f16(f) : hr_f32_to_bf16(f);
    *v = f16 ? hr_f16_to_f32(h) : hr_bf16_to_f32(h);
    return h;
}

/* The mma wrappers themselves (common.cuh's hr_mma_16816_bf16 / _f16: mma.sync on a GPU, the emulator's
 * gather here): one 16 x 8 x 16 product D = C + A B from random A, B, C, the fragments laid out on the
 * host from the PTX ISA's formulas for m16n8k16 (lane l, g = l / 4, q = l % 4: A's element i at row g
 * for i in {0, 1, 4, 5}, else g + 8, column 2q + (i & 1) + 8 (i >= 4); B's element i at row
 * 2q + (i & 1) + 8 (i >= 2), column g; C's element i at row g + 8 (i >= 2), column 2q + (i & 1); two
 * elements a 32-bit register, the lower i in the low half), each element of D compared with the host's
 * double sum within f32 rounding. */
static void test_mma_selftest(void) {
    for (int f16 = 0; f16 < 2; f16++) {
        float A[16][16], B[16][8], C[16][8];
        uint16_t Ah[16][16], Bh[16][8];
        for (int r = 0; r < 16; r++)
            for (int k = 0; k < 16; k++) Ah[r][k] = to16(frand() * 4.0f, f16, &A[r][k]);
        for (int k = 0; k < 16; k++)
            for (int n = 0; n < 8; n++) Bh[k][n] = to16(frand() * 4.0f, f16, &B[k][n]);
        fill(&C[0][0], 16 * 8, 8.0f);
        uint32_t a[32][4], b[32][2];
        float cd[32][4];
        memset(a, 0, sizeof a), memset(b, 0, sizeof b);
        for (int lane = 0; lane < 32; lane++) {
            int g = lane >> 2, q = lane % 4;
            for (int i = 0; i < 8; i++) {
                int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8, col = q * 2 + (i & 1) + (i >= 4 ? 8 : 0);
                a[lane][i / 2] |= (uint32_t)Ah[row][col] << (16 * (i & 1));
            }
            for (int i = 0; i < 4; i++) {
                int row = q * 2 + (i & 1) + (i >= 2 ? 8 : 0), col = g;
                b[lane][i / 2] |= (uint32_t)Bh[row][col] << (16 * (i & 1));
            }
            for (int i = 0; i < 4; i++) cd[lane][i] = C[i < 2 ? g : g + 8][q * 2 + (i & 1)];
        }
        uint64_t dcd = up(cd, sizeof cd), da = up(a, sizeof a), db = up(b, sizeof b);
        void *args[] = {&dcd, &da, &db, &f16};
        hr_error e;
        hr_status st = hr_cuda_launch(dev, "hr_k_mma_selftest", 1, 1, 32, args, &e);
        CHECKF(st == HR_OK, "hr_k_mma_selftest: %s", e.msg);
        if (st == HR_OK) {
            float got[32][4];
            down(got, dcd, sizeof got);
            int bad = 0;
            for (int lane = 0; lane < 32; lane++)
                for (int i = 0; i < 4; i++) {
                    int g = lane >> 2, q = lane % 4, row = i < 2 ? g : g + 8, col = q * 2 + (i & 1);
                    double ref = C[row][col], mag = fabs(C[row][col]);
                    for (int k = 0; k < 16; k++) {
                        ref += (double)A[row][k] * B[k][col];
                        mag += fabs((double)A[row][k] * B[k][col]);
                    }
                    /* 17 additions in f32: each off by at most 2^-23 of the magnitude (truncation included) */
                    if (!(fabs(got[lane][i] - ref) <= 17.0 * 0x1p-23 * mag)) {
                        if (bad++ < 4)
                            fprintf(stderr, "mma %s: D[%d][%d] (lane %d, element %d) %g, want %g\n",
                                    f16 ? "f16" : "bf16", row, col, lane, i, got[lane][i], ref);
                    }
                }
            CHECKF(bad == 0, "mma.m16n8k16 %s: %d of 128 elements of D wrong", f16 ? "f16" : "bf16", bad);
        }
        hr_cuda_free(dev, dcd), hr_cuda_free(dev, da), hr_cuda_free(dev, db);
    }
}

/* Each tensor-core GEMM against a double-precision product of what it multiplies: the weights as
 * dequantized (exact), x rounded to the kernel's 16-bit type (bf16 for bf16 weights, f16 for the rest;
 * nearest even, as the kernel rounds it). So the only difference is f32 accumulation, bounded by
 * (cols + 64) 2^-23 sum |w x| (a rounding or truncation of at most 2^-23 per addition, the q8_0 / q4_0
 * block scales' products included). Shapes cross every edge: T 16, 17, 64, 100 against the block's 64
 * tokens, rows 64, 100, 4096 against its 128, cols 32 (one K-step), 288 (nine), 4096, and 72 (a half
 * K-step: bf16 and f16 take cols in 8s). Unwritten outputs (NaN) and writes past y (a guard) fail. */
static void test_gemm(void) {
    static const struct {
        hr_dtype t;
        const char *k;
        bool f16; /* the activations' type in the kernel */
    } types[] = {{HR_DTYPE_BF16, "hr_k_gemm_bf16", false},
                 {HR_DTYPE_F16, "hr_k_gemm_f16", true},
                 {HR_DTYPE_Q8_0, "hr_k_gemm_q8_0", true},
                 {HR_DTYPE_Q4_0, "hr_k_gemm_q4_0", true}};
    static const int shapes[][3] = {{16, 64, 32},    {17, 100, 288},  {100, 64, 288},
                                    {64, 100, 4096}, {17, 4096, 288}, {17, 33, 72}}; /* T, rows, cols */
    enum { GUARD = 64 };
    const float sentinel = 12345.0f;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        double worst_seen = 0;
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            int T = shapes[si][0], rows = shapes[si][1], cols = shapes[si][2];
            if (cols % hr_dtype_get_info(types[ti].t)->block_elems) continue;
            size_t rb = hr_dtype_row_bytes(types[ti].t, cols), ny = (size_t)T * rows;
            unsigned char *W = malloc(rb * rows);
            float *wf = malloc(sizeof(float) * cols * rows), *x = malloc(sizeof(float) * cols * T),
                  *xr = malloc(sizeof(float) * cols * T), *got = malloc(sizeof(float) * (ny + GUARD));
            double *ref = malloc(sizeof(double) * ny), *mag = malloc(sizeof(double) * ny);
            fill(wf, (size_t)cols * rows, 1.0f);
            fill(x, (size_t)cols * T, 2.0f);
            for (int r = 0; r < rows; r++) {
                hr_quantize_row_ref(types[ti].t, wf + (size_t)r * cols, W + rb * r, cols);
                hr_dequantize_row_ref(types[ti].t, W + rb * r, wf + (size_t)r * cols, cols);
            }
            for (size_t i = 0; i < (size_t)cols * T; i++) to16(x[i], types[ti].f16, &xr[i]);
            for (int t = 0; t < T; t++)
                for (int r = 0; r < rows; r++) {
                    double s = 0, m = 0;
                    for (int c = 0; c < cols; c++) {
                        double p = (double)wf[(size_t)r * cols + c] * xr[(size_t)t * cols + c];
                        s += p, m += fabs(p);
                    }
                    ref[(size_t)t * rows + r] = s, mag[(size_t)t * rows + r] = m;
                }
            memset(got, 0xff, sizeof(float) * ny); /* NaN: an output the kernel leaves stays NaN */
            for (int i = 0; i < GUARD; i++) got[ny + i] = sentinel;
            uint64_t dW = up(W, rb * rows), dx = up(x, sizeof(float) * cols * T),
                     dy = up(got, sizeof(float) * (ny + GUARD));
            void *a[] = {&dy, &dW, &dx, &rows, &cols, &T};
            if (launch(types[ti].k, (unsigned)(rows + 127) / 128, (unsigned)(T + 63) / 64, a)) {
                down(got, dy, sizeof(float) * (ny + GUARD));
                int bad = 0;
                for (size_t i = 0; i < ny; i++) {
                    double err = fabs(got[i] - ref[i]), bound = (cols + 64) * 0x1p-23 * mag[i];
                    if (mag[i] > 0) worst_seen = fmax(worst_seen, err / mag[i]);
                    if (!(err <= bound) && bad++ < 3)
                        fprintf(stderr, "%s T=%d %dx%d: y[%zu][%zu] %g, want %g (bound %g)\n", types[ti].k, T, rows,
                                cols, i / (size_t)rows, i % (size_t)rows, got[i], ref[i], bound);
                }
                bool guard = true;
                for (int i = 0; i < GUARD; i++) guard &= got[ny + i] == sentinel;
                CHECKF(bad == 0 && guard, "%s T=%d, %dx%d: %d outputs past the bound, guard %s", types[ti].k, T, rows,
                       cols, bad, guard ? "intact" : "overwritten");
            }
            hr_cuda_free(dev, dW), hr_cuda_free(dev, dx), hr_cuda_free(dev, dy);
            free(W), free(wf), free(x), free(xr), free(got), free(ref), free(mag);
        }
        printf("%s: worst error %.3g of sum |w x|\n", types[ti].k, worst_seen);
    }
}

/* A CPU and a CUDA storage of one shape with K and V in fmt (p: their parameters). False, nothing made,
 * when fmt cannot hold this head size (q4h: head_dim a power of two); a failed create is a failed
 * check, its storage NULL. */
static bool storage_pair(int L, int HKV, int D, int B, int NB, hr_kv_format fmt, hr_kv_storage_params *p,
                         hr_kv_storage **cpu, hr_kv_storage **gpu) {
    hr_error e = {0};
    *p = (hr_kv_storage_params){
        .n_layers = L, .n_kv_heads = HKV, .head_dim = D, .block_size = B, .n_blocks = NB, .isa = "scalar"};
    *cpu = *gpu = NULL;
    if (kv_fmt_init(&p->k, fmt, KV_K, B, D, &e) != HR_OK || kv_fmt_init(&p->v, fmt, KV_V, B, D, &e) != HR_OK)
        return false;
    CHECKF(hr_kv_storage_cpu_create(p, cpu, &e) == HR_OK, "%s", e.msg);
    CHECKF(hr_kv_storage_cuda_create(dev, p, gpu, &e) == HR_OK, "%s", e.msg);
    return true;
}

/* A one-block f16 device storage, after checking that env=bad refuses to make one (naming it); NULL
 * when it could not be made. */
static hr_kv_storage *switch_storage(const char *env, const char *bad) {
    hr_error e = {0};
    hr_kv_storage_params p = {
        .n_layers = 1, .n_kv_heads = 1, .head_dim = 64, .block_size = 16, .n_blocks = 1, .isa = "scalar"};
    kv_fmt_init(&p.k, HR_KV_F16, KV_K, 16, 64, &e);
    kv_fmt_init(&p.v, HR_KV_F16, KV_V, 16, 64, &e);
    hr_kv_storage *gpu = NULL;
    setenv(env, bad, 1);
    hr_status st = hr_kv_storage_cuda_create(dev, &p, &gpu, &e);
    unsetenv(env);
    char named[96];
    snprintf(named, sizeof named, "%s=%s", env, bad);
    CHECKF(st == HR_ERR_INVALID_ARG && !gpu && strstr(e.msg, named), "%s", e.msg);
    CHECKF(hr_kv_storage_cuda_create(dev, &p, &gpu, &e) == HR_OK, "%s", e.msg);
    return gpu;
}

/* paged attention: tokens written by the CPU storage, its blocks copied byte for byte into the
 * device storage, then both attend the same queries (GQA 12, tables in any order, one query over five
 * chunks of the split kernel, a softcap), through each attention kernel (hr_k_attn_split, the
 * default, and hr_k_attn_split_rows) */
/* one attention case on both storages: the GPU's within the format's bound of the CPU's (rel > 0: that
 * relative bound instead); qcpu: the CPU's queries where they differ (a table with a dropped block: the
 * CPU storage takes holes only with a view, so it gets the table without the hole and that many fewer
 * positions), or NULL */
static void check_attention(hr_kv_storage *cpu, hr_kv_storage *gpu, hr_kv_format fmt, const hr_kv_attn_query *qc,
                            const hr_kv_attn_query *qcpu, int nq, int H, int D, double rel_bound, const char *what) {
    enum { MAXQ = 4 };
    static float o_cpu[MAXQ][24 * 64], o_gpu[MAXQ][24 * 64];
    hr_kv_attn_query a_cpu[MAXQ], a_gpu[MAXQ];
    if (nq > MAXQ || H * D > 24 * 64) {
        CHECKF(false, "attention %s: %d queries of %d x %d are more than the check holds", what, nq, H, D);
        return;
    }
    for (int i = 0; i < nq; i++) {
        a_cpu[i] = qcpu ? qcpu[i] : qc[i];
        a_gpu[i] = qc[i];
        a_cpu[i].out = o_cpu[i];
        a_gpu[i].out = o_gpu[i];
    }
    hr_error e = {0};
    for (int softcap = 0; softcap < 2; softcap++) {
        hr_kv_attn_args a = {.n_heads = H, .scale = 0.125f, .softcap = softcap ? 30.0f : 0.0f};
        float *scratch = malloc(sizeof(float) << 20);
        cpu->ops->attend(cpu, 1, a_cpu, nq, &a, scratch);
        free(scratch);
        memset(o_gpu, 0xff, sizeof o_gpu); /* NaN: a head the kernel leaves out fails */
        gpu->ops->attend(gpu, 1, a_gpu, nq, &a, NULL);
        CHECKF(hr_kv_storage_cuda_check(gpu, &e) == HR_OK, "%s", e.msg);
        /* with an f16 V the CPU rounds each softmax weight to f16 before P.V (kv_attention.c's kv_weights),
         * the GPU keeps them in f32: each output moves by at most 2^-11 of the weights' sum (1) times max
         * |v| (25, the outlier), absolute. Otherwise the order of additions only. */
        double worst = 0; /* absolute for f16, relative (floor 1e-2) otherwise; a NaN is infinite */
        for (int i = 0; i < nq; i++)
            for (int j = 0; j < H * D; j++) {
                double d = fabs((double)o_gpu[i][j] - o_cpu[i][j]);
                if (fmt != HR_KV_F16) d /= fmax(fabs((double)o_cpu[i][j]), 1e-2);
                worst = d != d ? INFINITY : fmax(worst, d);
            }
        /* q4h: the CPU rounds its rotated query to int16 against the largest magnitude (kv_format.c's
         * dot_q4h_k), the GPU keeps it in f32: half a step, amax / 65534 (amax about 2 here), per element
         * moves a score by up to that times sum |k| (about 400 for the outlier token, rotated) times the
         * scale 0.125, 1.5e-3, and the outputs by as much relatively */
        const double rel = rel_bound > 0 ? rel_bound : fmt == HR_KV_Q4H ? 4e-3 : 1e-3;
        if (fmt == HR_KV_F16)
            CHECKF(worst < 25.0 * 0x1p-11 + 1e-5, "attention %s %s softcap %d: absolute error %g",
                   hr_kv_format_name(fmt), what, softcap, worst);
        else
            CHECKF(worst < rel, "attention %s %s softcap %d: relative error %g", hr_kv_format_name(fmt), what, softcap,
                   worst);
    }
}

/* Every format the device stores: the device's encoder (hr_k_kv_write, through the storage's write op
 * one token at a time and hr_kv_storage_cuda_write_dev for a batch) gives the CPU storage's bytes
 * exactly, and attention over them matches the CPU's, with the split count the storage picks and with
 * one split of many tiles (HEADROOM_CUDA_ATTN_BLOCKS=1: the online softmax across tiles), through both
 * kernels (the split variant: the default, then hr_kv_storage_cuda_set_attn_kernel "rows"; the
 * one-split variant: HEADROOM_CUDA_ATTN_KERNEL=rows at create, then "split"). The first shape is GQA
 * 12 (groups of 8 and 4) at D 64; the others reach the rows kernel's other lane maps, each with a
 * dropped block (-1) in a table: D 160 (32 lanes a row, 12 idle) with groups of 2, D 96 (16 lanes,
 * 4 idle, 2 rows a warp) with a group of 5 and B 32, D 32 (8 lanes, 4 idle, 4 rows a warp) without
 * GQA and B 8. */
static void test_attention(void) {
    static const hr_kv_format fmts[] = {HR_KV_F16, HR_KV_Q8, HR_KV_F32, HR_KV_BF16, HR_KV_FP8, HR_KV_Q4H};
    static const struct {
        int HKV, H, D, B, NB;
    } shapes[] = {{2, 24, 64, 16, 72}, {2, 4, 160, 16, 24}, {2, 10, 96, 32, 12}, {3, 3, 32, 8, 48}};
    enum { L = 2, NQ = 4 };
    hr_error e = {0};
    { /* a kernel name the storage does not have: refused, from the environment and the setter */
        hr_kv_storage *gpu = switch_storage("HEADROOM_CUDA_ATTN_KERNEL", "tiles");
        if (gpu) {
            CHECK(hr_kv_storage_cuda_set_attn_kernel(gpu, "tiles", &e) == HR_ERR_INVALID_ARG);
            CHECK(hr_kv_storage_cuda_set_attn_kernel(gpu, "rows", &e) == HR_OK);
            CHECK(hr_kv_storage_cuda_set_attn_kernel(gpu, "split", &e) == HR_OK);
            gpu->ops->destroy(gpu);
        }
    }
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++) {
            const int HKV = shapes[si].HKV, H = shapes[si].H, D = shapes[si].D, B = shapes[si].B, NB = shapes[si].NB;
            const hr_kv_format fmt = fmts[fi];
            hr_kv_storage_params p;
            hr_kv_storage *cpu, *gpu;
            if (!storage_pair(L, HKV, D, B, NB, fmt, &p, &cpu, &gpu)) continue; /* q4h: D 160, 96 no powers of 2 */
            float *kb = malloc(sizeof(float) * B * HKV * D), *vb = malloc(sizeof(float) * B * HKV * D);
            float *q = malloc(sizeof(float) * NQ * H * D);
            int32_t *tabs = malloc(sizeof(int32_t) * NQ * NB), *t3_cpu = malloc(sizeof(int32_t) * NB);
            if (!cpu || !gpu || !kb || !vb || !q || !tabs || !t3_cpu) {
                CHECKF(false, "attention: setup failed");
                return;
            }
            /* blocks 0..NB-2 one token at a time through the write op; the last block's tokens as one batch */
            for (int blk = 0; blk < NB; blk++)
                for (int l = 0; l < L; l++)
                    for (int t = 0; t < B; t++) {
                        float *k = kb + (size_t)t * HKV * D, *v = vb + (size_t)t * HKV * D;
                        fill(k, HKV * D, 1.5f);
                        fill(v, HKV * D, 1.0f);
                        if (t == 3) k[5] = 40.0f, v[7] = -25.0f; /* an outlier: its group's scale */
                        cpu->ops->write(cpu, l, blk, t, -1, k, v);
                        if (blk < NB - 1) gpu->ops->write(gpu, l, blk, t, -1, k, v);
                        if (blk == NB - 1 && t == B - 1) {
                            int32_t slots[64];
                            for (int i = 0; i < B; i++) slots[i] = blk * B + i;
                            size_t rows = sizeof(float) * B * HKV * D;
                            uint64_t dk = up(kb, rows), dv = up(vb, rows), ds = up(slots, sizeof(int32_t) * B);
                            CHECKF(hr_kv_storage_cuda_write_dev(gpu, l, dk, dv, ds, B, &e) == HR_OK, "%s", e.msg);
                            hr_cuda_free(dev, dk);
                            hr_cuda_free(dev, dv);
                            hr_cuda_free(dev, ds);
                        }
                    }
            size_t bb = (size_t)L * HKV * (p.k.head_bytes + p.v.head_bytes);
            unsigned char *bc = malloc(bb), *bg = malloc(bb);
            for (int blk = 0; blk < NB && bc && bg; blk++) {
                cpu->ops->read_block(cpu, blk, bc);
                gpu->ops->read_block(gpu, blk, bg);
                CHECKF(memcmp(bc, bg, bb) == 0, "%s block %d: the device's encoding differs from the CPU storage's",
                       hr_kv_format_name(fmt), blk);
            }
            free(bc);
            free(bg);
            int32_t *t0 = tabs, *t1 = tabs + NB, *t2 = tabs + 2 * NB, *t3 = tabs + 3 * NB;
            int n_ctx[NQ];
            if (si == 0) { /* tables in any order; the last one spans 70 blocks (1,117 positions: five tiles of 256) */
                static const int32_t a0[] = {3, 7, 1, 0, 11}, a1[] = {5, 4, 2};
                memcpy(t0, a0, sizeof a0);
                memcpy(t1, a1, sizeof a1);
                t2[0] = 9;
                for (int i = 0; i < 70; i++) t3[i] = 71 - i;
                n_ctx[0] = 5 * B - 3, n_ctx[1] = 3 * B, n_ctx[2] = 1, n_ctx[3] = 70 * B - 3;
            } else { /* the long one over every block but the batch's, backwards, its second block dropped */
                t0[0] = 2, t0[1] = 0;
                t1[0] = 5, t1[1] = 3;
                t2[0] = NB - 1;
                for (int i = 0; i < NB - 1; i++) t3[i] = i == 1 ? -1 : NB - 2 - i;
                for (int i = 0; i < NB - 2; i++) t3_cpu[i] = t3[i < 1 ? i : i + 1];
                n_ctx[0] = B + 3, n_ctx[1] = 2 * B, n_ctx[2] = 1, n_ctx[3] = (NB - 1) * B - 5;
            }
            fill(q, (size_t)NQ * H * D, 1.0f);
            hr_kv_attn_query qc[NQ];
            for (int i = 0; i < NQ; i++)
                qc[i] = (hr_kv_attn_query){
                    .table = tabs + (size_t)i * NB, .n_ctx = n_ctx[i], .tail_stage = -1, .q = q + (size_t)i * H * D};
            hr_kv_attn_query qc_cpu[NQ];
            memcpy(qc_cpu, qc, sizeof qc);
            qc_cpu[3].table = t3_cpu, qc_cpu[3].n_ctx = n_ctx[3] - B;
            const hr_kv_attn_query *qcpu = si == 0 ? NULL : qc_cpu;
            char what[64];
            snprintf(what, sizeof what, "D %d G %d: split", D, H / HKV);
            check_attention(cpu, gpu, fmt, qc, qcpu, NQ, H, D, 0, what);
            CHECKF(hr_kv_storage_cuda_set_attn_kernel(gpu, "rows", &e) == HR_OK, "%s", e.msg);
            snprintf(what, sizeof what, "D %d G %d: split, rows kernel", D, H / HKV);
            check_attention(cpu, gpu, fmt, qc, qcpu, NQ, H, D, 0, what);
            gpu->ops->destroy(gpu);
            /* one split for every query: each block walks all its tiles; the rows kernel from the environment */
            setenv("HEADROOM_CUDA_ATTN_BLOCKS", "1", 1);
            setenv("HEADROOM_CUDA_ATTN_KERNEL", "rows", 1);
            gpu = NULL;
            CHECKF(hr_kv_storage_cuda_create(dev, &p, &gpu, &e) == HR_OK, "%s", e.msg);
            unsetenv("HEADROOM_CUDA_ATTN_BLOCKS");
            unsetenv("HEADROOM_CUDA_ATTN_KERNEL");
            if (!gpu) return;
            unsigned char *blkbuf = malloc(bb);
            for (int blk = 0; blk < NB && blkbuf; blk++) {
                cpu->ops->read_block(cpu, blk, blkbuf);
                gpu->ops->write_block(gpu, blk, blkbuf);
            }
            free(blkbuf);
            snprintf(what, sizeof what, "D %d G %d: one split, rows kernel", D, H / HKV);
            check_attention(cpu, gpu, fmt, qc, qcpu, NQ, H, D, 0, what);
            CHECKF(hr_kv_storage_cuda_set_attn_kernel(gpu, "split", &e) == HR_OK, "%s", e.msg);
            snprintf(what, sizeof what, "D %d G %d: one split", D, H / HKV);
            check_attention(cpu, gpu, fmt, qc, qcpu, NQ, H, D, 0, what);
            gpu->ops->destroy(gpu);
            cpu->ops->destroy(cpu);
            free(kb), free(vb), free(q), free(tabs), free(t3_cpu);
        }
}

/* ---- token masks and scores (the h2o and snapkv policies) ------------------------------------------- */

/* The CUDA storage's attention under token-level views against the CPU storage's, the views' masks set
 * by hand (random bits, about 2 in 3 kept; one (block, layer, head) masked whole; a dropped block):
 * query 0 accumulates scores, query 1 is masked without accumulating (snapkv past its window), query 2
 * has no view, query 3 shares query 0's sequence (its table, masks and scores, at an earlier
 * position: two rows adding to one score array). Through both split kernels, for f32, f16 and q8.
 * Outputs: as check_attention's bounds. Scores (fixed point 2^-32, summed over a KV head's 3 query
 * heads, each head's weight rounded on its own): a masked or dropped token gets exactly 0 on both;
 * every other entry within 3 x 2^32 x (2e-6 + 2^-11 with an f16 V) of the CPU's: per head the two
 * weights differ by the exp's approximation (ex2.approx: 2 ulp) and the order of the sums (a few float
 * roundings of a weight <= 1, 1e-7 each; q8 and f32 measure under 6e-7 in the emulation), and
 * with an f16 V the CPU's weight is rounded to f16 (2^-11 of a weight <= 1) where the GPU's is not.
 * Layer 0's entries stay 0 (the queries are layer 1's), and each (layer 1, KV head) row of query 0's
 * and 3's scores sums to 2 x 3 x 2^32 (every head's weights sum to 1) within the same bound. */
static void test_attention_masks(void) {
    enum { L = 2, HKV = 2, H = 6, D = 32, B = 16, NB = 10, NQ = 4, MW = 1 };
    static const hr_kv_format fmts[] = {HR_KV_F32, HR_KV_F16, HR_KV_Q8};
    hr_error e = {0};
    for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++) {
        const hr_kv_format fmt = fmts[fi];
        hr_kv_storage_params p;
        hr_kv_storage *cpu, *gpu;
        storage_pair(L, HKV, D, B, NB, fmt, &p, &cpu, &gpu);
        if (!cpu || !gpu) return;
        float k[HKV * D], v[HKV * D];
        for (int blk = 0; blk < NB; blk++)
            for (int l = 0; l < L; l++)
                for (int t = 0; t < B; t++) {
                    fill(k, HKV * D, 1.5f);
                    fill(v, HKV * D, 1.0f);
                    cpu->ops->write(cpu, l, blk, t, -1, k, v);
                    gpu->ops->write(gpu, l, blk, t, -1, k, v);
                }
        /* sequence A (queries 0 and 3): 8 blocks, its block 2 dropped; sequence B (query 1): 4 blocks */
        static const int32_t ta[] = {6, 1, -1, 9, 0, 4, 8, 3}, tb[] = {2, 5, 7, 3};
        static uint64_t ma[8 * L * HKV * MW], mb[4 * L * HKV * MW];
        static atomic_uint_fast64_t sc_cpu[8 * L * HKV * B], sc_gpu[8 * L * HKV * B], sb[4 * L * HKV * B];
        for (size_t i = 0; i < sizeof ma / sizeof ma[0] + sizeof mb / sizeof mb[0]; i++) {
            uint64_t m = 0;
            for (int t = 0; t < B; t++) m |= (uint64_t)(frand() > -0.33f) << t;
            if (i < sizeof ma / sizeof ma[0])
                ma[i] = m;
            else
                mb[i - sizeof ma / sizeof ma[0]] = m;
        }
        ma[((3 * L + 1) * HKV + 1) * MW] = 0; /* block 3, layer 1, KV head 1: every token masked */
        for (size_t i = 0; i < sizeof sc_cpu / sizeof sc_cpu[0]; i++)
            atomic_init(&sc_cpu[i], 0), atomic_init(&sc_gpu[i], 0);
        for (size_t i = 0; i < sizeof sb / sizeof sb[0]; i++) atomic_init(&sb[i], 0);
        hr_kv_attn_view va_cpu = {.mask = ma, .score = sc_cpu}, va_gpu = {.mask = ma, .score = sc_gpu};
        hr_kv_attn_view vb = {.mask = mb};
        float q[NQ * H * D];
        static float o_cpu[NQ][H * D], o_gpu[NQ][H * D];
        fill(q, NQ * H * D, 1.0f);
        const int n_ctx[NQ] = {8 * B - 5, 4 * B - 1, 3 * B, 6 * B + 2};
        const int32_t *tabs[NQ] = {ta, tb, tb, ta};
        hr_kv_attn_query qc[NQ], qg[NQ];
        for (int i = 0; i < NQ; i++) {
            qc[i] = (hr_kv_attn_query){.table = tabs[i], .n_ctx = n_ctx[i], .tail_stage = -1, .q = q + i * H * D};
            qg[i] = qc[i];
            qc[i].out = o_cpu[i], qg[i].out = o_gpu[i];
        }
        qc[0].view = qc[3].view = &va_cpu, qg[0].view = qg[3].view = &va_gpu;
        qc[1].view = qg[1].view = &vb;
        /* the CPU takes a query without a view only over a table without holes: query 2's has none */
        hr_kv_attn_args a = {.n_heads = H, .scale = 0.125f};
        float *scratch = malloc(sizeof(float) << 16);
        cpu->ops->attend(cpu, 1, qc, NQ, &a, scratch);
        free(scratch);
        const double f16v = fmt == HR_KV_F16 ? 0x1p-11 : 0.0, bound = 3.0 * 4294967296.0 * (2e-6 + f16v);
        for (int kern = 0; kern < 2; kern++) {
            const char *kname = kern ? "rows" : "split";
            CHECKF(hr_kv_storage_cuda_set_attn_kernel(gpu, kname, &e) == HR_OK, "%s", e.msg);
            for (size_t i = 0; i < sizeof sc_gpu / sizeof sc_gpu[0]; i++) atomic_store(&sc_gpu[i], 0);
            memset(o_gpu, 0xff, sizeof o_gpu);
            gpu->ops->attend(gpu, 1, qg, NQ, &a, NULL);
            CHECKF(hr_kv_storage_cuda_check(gpu, &e) == HR_OK, "%s", e.msg);
            double worst = 0;
            for (int i = 0; i < NQ; i++)
                for (int j = 0; j < H * D; j++) {
                    double d = fabs((double)o_gpu[i][j] - o_cpu[i][j]);
                    if (fmt != HR_KV_F16) d /= fmax(fabs((double)o_cpu[i][j]), 1e-2);
                    worst = d != d ? INFINITY : fmax(worst, d);
                }
            CHECKF(worst < (fmt == HR_KV_F16 ? 0x1p-11 + 1e-5 : 1e-3), "masked attention %s %s: error %g",
                   hr_kv_format_name(fmt), kname, worst);
            double sworst = 0, sum_worst = 0;
            int bad_zero = 0;
            for (int j = 0; j < 8; j++)
                for (int l = 0; l < L; l++)
                    for (int kh = 0; kh < HKV; kh++) {
                        const size_t row = ((size_t)(j * L + l) * HKV + kh);
                        for (int t = 0; t < B; t++) {
                            const uint64_t c = atomic_load(&sc_cpu[row * B + t]), g = atomic_load(&sc_gpu[row * B + t]);
                            const bool kept = l == 1 && ta[j] >= 0 && (ma[row * MW] >> t & 1) && j * B + t < n_ctx[0];
                            bad_zero += !kept && (c != 0 || g != 0);
                            sworst = fmax(sworst, fabs((double)g - (double)c));
                        }
                    }
            for (int kh = 0; kh < HKV; kh++) {
                double sum = 0;
                for (int j = 0; j < 8; j++)
                    for (int t = 0; t < B; t++) sum += (double)atomic_load(&sc_gpu[((j * L + 1) * HKV + kh) * B + t]);
                sum_worst = fmax(sum_worst, fabs(sum - 2.0 * 3.0 * 4294967296.0));
            }
            printf("masked attention %s %s: output error %g, worst score difference %.0f (%.2g of the bound), sums "
                   "off by %.0f\n",
                   hr_kv_format_name(fmt), kname, worst, sworst, sworst / bound, sum_worst);
            CHECKF(bad_zero == 0, "masked attention %s %s: %d masked, dropped or layer-0 tokens with a score",
                   hr_kv_format_name(fmt), kname, bad_zero);
            CHECKF(sworst <= bound, "masked attention %s %s: a score differs by %g (bound %g)", hr_kv_format_name(fmt),
                   kname, sworst, bound);
            CHECKF(sum_worst <= 2.0 * bound, "masked attention %s %s: a head's weights sum off by %g",
                   hr_kv_format_name(fmt), kname, sum_worst);
            for (size_t i = 0; i < sizeof sb / sizeof sb[0]; i++)
                CHECKF(atomic_load(&sb[i]) == 0, "masked attention %s: a view without scores got some",
                       hr_kv_format_name(fmt));
        }
        gpu->ops->destroy(gpu);
        cpu->ops->destroy(cpu);
    }
}

/* The deferred formats (q4, kivi2: K per channel over a block, encoded when the block fills from its
 * f16 stage). Both storages take the same tokens: blocks 0..NB-3 one token at a time through the
 * write op (the write that fills a block encodes it), block NB-2 as one batch through
 * hr_kv_storage_cuda_stage_batch + write_dev (slots, stages, fills), block NB-1 partial (P tokens).
 * The encoded blocks must be the CPU storage's byte for byte (hr_k_kv_encode against encb_lowbit_k /
 * encb_lowbit_v), the stages' deferred halves and counts too, and a stage copy moves both. Then
 * attention on both kernels against the CPU's, queries ending in the partial block (read from its
 * stage), at a block's end (all encoded), and inside full blocks that still hold their stage (a
 * prefill batch's queries before the commit: read from the stage as the CPU does). D 64 and D 96
 * (kivi2's 2-bit rows: a last chunk of 32 channels); a mixed pair (q8 K, q4 V: only V staged). */
static void test_attention_deferred(void) {
    static const struct {
        int HKV, H, D, B, NB;
        hr_kv_format k, v;
    } cases[] = {{2, 8, 64, 16, 6, HR_KV_Q4, HR_KV_Q4},
                 {2, 8, 64, 16, 6, HR_KV_KIVI2, HR_KV_KIVI2},
                 {1, 3, 96, 8, 5, HR_KV_KIVI2, HR_KV_KIVI2},
                 {1, 3, 96, 8, 5, HR_KV_Q8, HR_KV_Q4}};
    enum { L = 2, NQ = 4 };
    hr_error e = {0};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int HKV = cases[ci].HKV, H = cases[ci].H, D = cases[ci].D, B = cases[ci].B, NB = cases[ci].NB;
        const int P = B / 2 + 3, NS = NB + 1; /* tokens of the partial block; a stage for each block and a spare */
        hr_kv_storage_params p = {.n_layers = L,
                                  .n_kv_heads = HKV,
                                  .head_dim = D,
                                  .block_size = B,
                                  .n_blocks = NB,
                                  .n_stage = NS,
                                  .isa = "scalar"};
        kv_fmt_init(&p.k, cases[ci].k, KV_K, B, D, &e);
        kv_fmt_init(&p.v, cases[ci].v, KV_V, B, D, &e);
        kv_fmt_init(&p.stage, HR_KV_F16, KV_K, B, D, &e);
        hr_kv_storage *cpu = NULL, *gpu = NULL;
        CHECKF(hr_kv_storage_cpu_create(&p, &cpu, &e) == HR_OK, "%s", e.msg);
        CHECKF(hr_kv_storage_cuda_create(dev, &p, &gpu, &e) == HR_OK, "%s", e.msg);
        const size_t row = (size_t)HKV * D;
        float *kb = malloc(sizeof(float) * B * row), *vb = malloc(sizeof(float) * B * row);
        float *q = malloc(sizeof(float) * NQ * H * D);
        const size_t bb = (size_t)L * HKV * (p.k.head_bytes + p.v.head_bytes), sb = (size_t)L * 2 * row * B * 2;
        unsigned char *bc = malloc(bb), *bg = malloc(bb), *sc = malloc(sb), *sg = malloc(sb);
        if (!cpu || !gpu || !kb || !vb || !q || !bc || !bg || !sc || !sg) {
            CHECKF(false, "deferred attention: setup failed");
            return;
        }
        for (int blk = 0; blk < NB; blk++) {
            cpu->ops->stage_reset(cpu, blk);
            gpu->ops->stage_reset(gpu, blk);
            const int n = blk == NB - 1 ? P : B;
            for (int t = 0; t < n; t++) { /* the block's tokens, one layer's rows each (the same in both layers) */
                fill(kb + (size_t)t * row, row, 1.5f);
                fill(vb + (size_t)t * row, row, 1.0f);
                if (t == 3) kb[(size_t)t * row + 5] = 40.0f, vb[(size_t)t * row + 7] = -25.0f; /* outliers */
            }
            for (int l = 0; l < L; l++)
                for (int t = 0; t < n; t++) {
                    cpu->ops->write(cpu, l, blk, t, blk, kb + (size_t)t * row, vb + (size_t)t * row);
                    if (blk != NB - 2) gpu->ops->write(gpu, l, blk, t, blk, kb + (size_t)t * row, vb + (size_t)t * row);
                }
            if (blk == NB - 2) { /* the forward pass's way: counted once for every layer, then each layer's batch */
                int32_t place[3 * 64];
                for (int t = 0; t < B; t++) place[t] = blk * B + t, place[B + t] = blk;
                CHECKF(hr_kv_storage_cuda_stage_batch(gpu, place, B, &e) == HR_OK, "%s", e.msg);
                int nf = 0;
                for (int t = 0; t < B; t++) nf += place[2 * B + t] != 0;
                CHECKF(nf == 1 && place[3 * B - 1], "the batch's fills: %d, the last token's %d", nf, place[3 * B - 1]);
                size_t rows = sizeof(float) * B * row;
                uint64_t dk = up(kb, rows), dv = up(vb, rows), ds = up(place, sizeof(int32_t) * 3 * B);
                for (int l = 0; l < L; l++)
                    CHECKF(hr_kv_storage_cuda_write_dev(gpu, l, dk, dv, ds, B, &e) == HR_OK, "%s", e.msg);
                hr_cuda_free(dev, dk);
                hr_cuda_free(dev, dv);
                hr_cuda_free(dev, ds);
            }
        }
        /* a stage already full is refused, nothing counted */
        int32_t again[3] = {0, 0, 0};
        CHECK(hr_kv_storage_cuda_stage_batch(gpu, again, 1, &e) == HR_ERR_INVALID_ARG &&
              gpu->ops->stage_filled(gpu, 0, 1) == B);
        CHECKF(hr_kv_storage_cuda_check(gpu, &e) == HR_OK, "%s", e.msg);
        const char *fk = hr_kv_format_name(cases[ci].k), *fv = hr_kv_format_name(cases[ci].v);
        for (int blk = 0; blk < NB - 1; blk++) {
            cpu->ops->read_block(cpu, blk, bc);
            gpu->ops->read_block(gpu, blk, bg);
            CHECKF(memcmp(bc, bg, bb) == 0, "%s/%s D %d block %d: the device's encoding differs from the CPU's", fk, fv,
                   D, blk);
        }
        /* the stages: the deferred roles' rows (the others' are never written) and the counts */
        gpu->ops->stage_copy(gpu, NB - 1, NB); /* the spare: a copy-on-write's */
        for (int st = 0; st <= NB; st++) {
            uint16_t fc[L], fg[L];
            cpu->ops->stage_read(cpu, st < NB ? st : NB - 1, sc, fc);
            gpu->ops->stage_read(gpu, st, sg, fg);
            for (int l = 0; l < L; l++) {
                CHECKF(fc[l] == fg[l], "%s/%s stage %d layer %d: %d slots written, the CPU's %d", fk, fv, st, l, fg[l],
                       fc[l]);
                for (int role = 0; role < 2; role++) {
                    if (!(role ? p.v.deferred : p.k.deferred)) continue;
                    const size_t half = row * (size_t)B * 2, at = (2 * (size_t)l + role) * half;
                    CHECKF(memcmp(sc + at, sg + at, half) == 0, "%s/%s stage %d layer %d role %d differs", fk, fv, st,
                           l, role);
                }
            }
        }
        /* the queries: over blocks in this order, the last one partial */
        int32_t tab[8];
        for (int j = 0; j < NB; j++) tab[j] = (j * 3 + 1) % (NB - 1);
        tab[NB - 1] = NB - 1;
        const int n_ctx[NQ] = {(NB - 1) * B + P, (NB - 1) * B, 2 * B + 5, 5};
        const int32_t tail[NQ] = {NB - 1, -1, tab[2], tab[0]};
        fill(q, (size_t)NQ * H * D, 1.0f);
        hr_kv_attn_query qc[NQ];
        for (int i = 0; i < NQ; i++)
            qc[i] =
                (hr_kv_attn_query){.table = tab, .n_ctx = n_ctx[i], .tail_stage = tail[i], .q = q + (size_t)i * H * D};
        /* The CPU rounds q times K's scale to int16 against its largest magnitude (kv_format.c's
         * dot_lowbit_k, dot_q8), the GPU keeps q . (code x scale + min) in f32: half a step, amax /
         * 65534, per channel moves a score by at most scale x D x the largest code x amax / 65534,
         * amax = |q| (<= 1) times the largest scale: the outlier channel's range (40 + 1.5) over the
         * code's levels, with a quarter more for the least-squares refit (q4, kivi2), or its group's
         * 40 / 127 (q8). A score moved by d moves a weight by up to 2 d relatively, the outputs by as
         * much; the order of additions takes 1e-3 as for the other formats. */
        const int levels = cases[ci].k == HR_KV_Q4 ? 15 : cases[ci].k == HR_KV_KIVI2 ? 3 : 127;
        const double kscale = levels == 127 ? 40.0 / 127.0 : 1.25 * 41.5 / levels;
        const double rel = 2.0 * 0.125 * D * levels * kscale / 65534.0 + 1e-3;
        char what[64];
        snprintf(what, sizeof what, "K %s V %s D %d: split", fk, fv, D);
        check_attention(cpu, gpu, cases[ci].k, qc, NULL, NQ, H, D, rel, what);
        CHECKF(hr_kv_storage_cuda_set_attn_kernel(gpu, "rows", &e) == HR_OK, "%s", e.msg);
        snprintf(what, sizeof what, "K %s V %s D %d: rows kernel", fk, fv, D);
        check_attention(cpu, gpu, cases[ci].k, qc, NULL, NQ, H, D, rel, what);
        gpu->ops->destroy(gpu);
        cpu->ops->destroy(cpu);
        free(kb), free(vb), free(q), free(bc), free(bg), free(sc), free(sg);
    }
}

/* ---- prefill attention on the tensor cores (kernels/attn_prefill.cu) -------------------------------- */

/* a value of [-m, m] on a grid of 1/64: exact in f16 and bf16, and a sum of 128 products of two such
 * values is a multiple of 2^-12 below 2^12, exact in f32 in any order */
static float grid64(float m) { return roundf(frand() * m * 64.0f) / 64.0f; }

/* The batch of test_prefill_attention, five sequences in rows of the storage's tables:
 *   row 0: A, one decode row at 50; rows 1..17: B, a run of 17 from b0; rows 18, 19: C at 5 and 6 (two
 *   rows: no run); rows 20..59: D, a run of 40 from d0, its table's block 1 dropped (-1); rows 60..75:
 *   E, a run of exactly 16 at 200..215 seeing 4 sinks and a window of 32 (lo = pos + 1 - 32: the tile
 *   of positions 64..127 is seen by no row, the kernel skips it).
 * b0, d0: 0 and 70 (B from the start, D a chunk after 70 cached positions), or 30 and 0. */
enum { PF_ROWS = 76, PF_SEQS = 5, PF_B = 16, PF_NB = 32, PF_MAXB = 14, PF_SINKS = 4, PF_WIN = 32 };
static void prefill_batch(int b0, int d0, int32_t *seq, int32_t *pos) {
    int r = 0;
    seq[r] = 0, pos[r++] = 50;
    for (int i = 0; i < 17; i++) seq[r] = 1, pos[r++] = b0 + i;
    for (int i = 0; i < 2; i++) seq[r] = 2, pos[r++] = 5 + i;
    for (int i = 0; i < 40; i++) seq[r] = 3, pos[r++] = d0 + i;
    for (int i = 0; i < 16; i++) seq[r] = 4, pos[r++] = 200 + i;
}

/* hr_cuda_attn_runs: the batch's runs and their tiles (even cuts), rows outside them left out */
static void test_prefill_runs(void) {
    int32_t seq[PF_ROWS], pos[PF_ROWS], runs[4 * PF_ROWS];
    prefill_batch(0, 70, seq, pos);
    static const int32_t g4[] = {1, 17, 1, 0, 20, 20, 3, 70, 40, 20, 3, 90, 60, 16, 4, 200};
    CHECK(hr_cuda_prefill_tile_rows(8, 2) == 32 && hr_cuda_prefill_tile_rows(2, 2) == 128 &&
          hr_cuda_prefill_tile_rows(24, 3) == 16 && hr_cuda_prefill_tile_rows(256, 1) == 0);
    CHECK(hr_cuda_attn_runs(seq, pos, PF_ROWS, 32, runs) == 4 && memcmp(runs, g4, sizeof g4) == 0);
    static const int32_t g1[] = {1, 17, 1, 0, 20, 40, 3, 70, 60, 16, 4, 200};
    CHECK(hr_cuda_attn_runs(seq, pos, PF_ROWS, 128, runs) == 3 && memcmp(runs, g1, sizeof g1) == 0);
    static const int32_t g16[] = {1, 9, 1, 0, 10, 8, 1, 9, 20, 14, 3, 70, 34, 13, 3, 84, 47, 13, 3, 97, 60, 16, 4, 200};
    CHECK(hr_cuda_attn_runs(seq, pos, PF_ROWS, 16, runs) == 6 && memcmp(runs, g16, sizeof g16) == 0);
    /* 15 rows at consecutive positions, a gap in positions, a repeated position: no run */
    int32_t q2[40], p2[40];
    for (int i = 0; i < 40; i++) q2[i] = 0, p2[i] = i < 15 ? i : i < 30 ? i + 1 : 29;
    CHECK(hr_cuda_attn_runs(q2, p2, 40, 32, runs) == 0);
}

/* The prefill kernel against the CPU storage's attention, for every device format, D 64 and 128, GQA
 * (H 8 over Hkv 2: tiles of 32 rows) and H = Hkv (tiles of 128), and the demo models' D 8 (H 8 over 4,
 * K padded to the mma's k16 with zeros), the batch above through
 * hr_kv_storage_cuda_attend_runs: its runs on hr_k_attn_prefill, rows 0 and 18..19 on the split
 * kernels. Softcap 30 on every other case.
 *
 * The bound. Q, K and V are written on a grid of 1/64 (grid64), so Q is exact in f16, and so are K and
 * V stored as f32, f16 or bf16: the scores are then exact on both sides (the sums exact in f32), and
 * what differs is the softmax weights: the kernel rounds each P = e^(s - m) to f16 before P.V (its sum
 * l taken before the rounding): sum p~ v / sum p moves by at most u max|v|, u = 2^-11 (P below f16's
 * normal range, 2^-14, rounds by at most 2^-25 absolute: 216 positions of it are under 1e-5 with
 * sum p >= 1); with an f16 V the CPU rounds its normalized weights to f16 too: another u max|v|.
 * q8 and fp8 values (codes times a scale) are not on f16's grid: K's f16 rounding moves a score by at
 * most eps = scale u sum_d |q_d| |k_d| <= scale u |q|_1 kmax (kmax 1.51: the data's 1.5 and the q8
 * scale's own rounding), which moves each normalized weight by a factor within e^(+-2 eps): the output
 * by at most (e^(2 eps) - 1) max|v|; V's rounding adds u max|v|. The softcap is 1-Lipschitz; exp and
 * tanh (the hardware's against libm's) and the f32 sums in another order add under 5e-5. So
 *   |mma - cpu| <= vmax (e^(2 eps) - 1 + u (1 + [V q8/fp8] + [V f16])) + 5e-5,  vmax = 1.001,
 * eps = 0 for K f32/f16/bf16. The split kernels' rows (f32 throughout) are held to the same bound and
 * are bit for bit the same whichever prefill kernel the storage has.
 * q4h (D 64 and 128; at D 8 its 8-channel reads do not fit and the rows stay on the split kernels):
 * both paths dot the rotated query Hq against the stored rotated keys, the CPU after rounding Hq to
 * int16 against its largest magnitude (half a step, amax / 65534, a component), so a score moves by
 * scale (amax / 65534 + u) |Hq|_1-or-D kmax with kmax the largest |code x scale + min| the blocks hold
 * (read from their (scale, min) pairs): eps = scale kmax (D amax / 65534 + u |Hq|_1); V's values
 * (4-bit codes) are not on f16's grid either, and |v| <= vmax 1.1 (a 4-bit step over the data's 1). */
/* the normalized Hadamard transform of x[0..n) (n a power of two), as the CPU's kv_hadamard */
static void hadamard_ref(float *x, int n) {
    for (int h = 1; h < n; h *= 2)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b, x[j + h] = a - b;
            }
    for (int i = 0; i < n; i++) x[i] /= sqrtf((float)n);
}

static void test_prefill_attention(void) {
    static const hr_kv_format fmts[] = {HR_KV_F16, HR_KV_Q8, HR_KV_F32, HR_KV_BF16, HR_KV_FP8, HR_KV_Q4H};
    static const struct { int HKV, H, D; } shapes[] = {{2, 8, 64}, {2, 8, 128}, {2, 2, 128}, {2, 2, 64}, {4, 8, 8}};
    enum { L = 2, N = PF_ROWS };
    hr_error e = {0};
    { /* the switch: a name it does not have is refused, from the environment and the setter */
        hr_kv_storage *gpu = switch_storage("HEADROOM_CUDA_PREFILL_ATTN", "wmma");
        if (gpu) {
            CHECK(!hr_kv_storage_cuda_prefill_on(gpu, 4)); /* split: the default */
            CHECK(hr_kv_storage_cuda_set_prefill_attn(gpu, "wmma", &e) == HR_ERR_INVALID_ARG);
            CHECK(hr_kv_storage_cuda_set_prefill_attn(gpu, "mma", &e) == HR_OK &&
                  hr_kv_storage_cuda_prefill_on(gpu, 4));
            CHECK(!hr_kv_storage_cuda_prefill_on(gpu, 256)); /* G 256: more heads than a block's 128 rows */
            CHECK(hr_kv_storage_cuda_set_prefill_attn(gpu, "split", &e) == HR_OK &&
                  !hr_kv_storage_cuda_prefill_on(gpu, 4));
            gpu->ops->destroy(gpu);
        }
    }
    const double u = 0x1p-11;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++) {
            const int HKV = shapes[si].HKV, H = shapes[si].H, D = shapes[si].D, B = PF_B, NB = PF_NB;
            const hr_kv_format fmt = fmts[fi];
            if (fmt == HR_KV_Q4H && D % 16 != 0) continue; /* stays on the split kernels (test_attention) */
            const bool softcap = (si + fi) % 2 == 1;
            const int b0 = si % 2 ? 30 : 0, d0 = si % 2 ? 0 : 70;
            hr_kv_storage_params p;
            hr_kv_storage *cpu, *gpu;
            storage_pair(L, HKV, D, B, NB, fmt, &p, &cpu, &gpu);
            const size_t qf = (size_t)N * H * D, bb = (size_t)L * HKV * (p.k.head_bytes + p.v.head_bytes);
            float *q = malloc(sizeof(float) * qf), *o_cpu = malloc(sizeof(float) * qf);
            float *o_split = malloc(sizeof(float) * qf), *o_mma = malloc(sizeof(float) * qf);
            float *kv = malloc(sizeof(float) * 2 * HKV * D), *scratch = malloc(sizeof(float) << 20);
            unsigned char *blk = malloc(bb);
            if (!cpu || !gpu || !q || !o_cpu || !o_split || !o_mma || !kv || !scratch || !blk) {
                CHECKF(false, "prefill attention: setup failed");
                return;
            }
            /* every slot of every block through the CPU's encoders, the blocks copied to the device */
            for (int b = 0; b < NB; b++)
                for (int l = 0; l < L; l++)
                    for (int t = 0; t < B; t++) {
                        for (int i = 0; i < HKV * D; i++) kv[i] = grid64(1.5f), kv[HKV * D + i] = grid64(1.0f);
                        cpu->ops->write(cpu, l, b, t, -1, kv, kv + HKV * D);
                    }
            double kmax = 1.51; /* q4h: the largest |code x scale + min| of a K head region */
            for (int b = 0; b < NB; b++) {
                cpu->ops->read_block(cpu, b, blk);
                gpu->ops->write_block(gpu, b, blk);
                for (int l = 0; fmt == HR_KV_Q4H && l < L; l++)
                    for (int h = 0; h < HKV; h++) {
                        const unsigned char *head = blk + (size_t)l * HKV * (p.k.head_bytes + p.v.head_bytes) +
                                                    (size_t)h * p.k.head_bytes + p.k.scale_off;
                        for (int i = 0; i < B * (D / p.k.G); i++) {
                            uint16_t sm[2];
                            memcpy(sm, head + 4 * (size_t)i, 4);
                            const double sc = hr_f16_to_f32(sm[0]), mn = hr_f16_to_f32(sm[1]);
                            kmax = fmax(kmax, fmax(fabs(mn), fabs(mn + 15.0 * sc)));
                        }
                    }
            }
            /* the batch: tables (the blocks in a scrambled order), rows, windows, runs */
            int32_t seq[N], pos[N], nctx[N], win[2 * N], tabs[PF_SEQS * PF_MAXB], runs[4 * N];
            prefill_batch(b0, d0, seq, pos);
            for (int i = 0; i < PF_SEQS * PF_MAXB; i++) tabs[i] = (i * 11 + 5) % NB; /* a sequence's 14 differ */
            tabs[3 * PF_MAXB + 1] = -1;
            hr_kv_attn_view views[N];
            hr_kv_attn_query qs[N];
            int max_vis = 1;
            fill(q, qf, 1.0f);
            for (size_t i = 0; i < qf; i++) q[i] = roundf(q[i] * 64.0f) / 64.0f;
            for (int r = 0; r < N; r++) {
                const int n = pos[r] + 1, lo = seq[r] == 4 ? n - PF_WIN : 0, sinks = lo > 0 ? PF_SINKS : 0;
                nctx[r] = n;
                win[2 * r] = sinks, win[2 * r + 1] = lo;
                const int vis = lo > 0 ? sinks + n - lo : n;
                max_vis = vis > max_vis ? vis : max_vis;
                /* the CPU storage takes a dropped block (D) or a window (E) through a view */
                views[r] = (hr_kv_attn_view){.sinks = sinks, .lo = lo};
                if (lo > 0) {
                    views[r].first_blk = lo / B;
                    views[r].sink_blocks = (sinks + B - 1) / B;
                }
                qs[r] = (hr_kv_attn_query){.table = tabs + seq[r] * PF_MAXB,
                                           .n_ctx = n,
                                           .tail_stage = -1,
                                           .view = seq[r] >= 3 ? &views[r] : NULL,
                                           .q = q + (size_t)r * H * D,
                                           .out = o_cpu + (size_t)r * H * D};
            }
            const int n_runs = hr_cuda_attn_runs(seq, pos, N, hr_cuda_prefill_tile_rows(H, HKV), runs);
            CHECK(n_runs == (hr_cuda_prefill_tile_rows(H, HKV) >= 40 ? 3 : 4));
            hr_kv_attn_args a = {.n_heads = H, .scale = 0.125f, .softcap = softcap ? 30.0f : 0.0f};
            cpu->ops->attend(cpu, 1, qs, N, &a, scratch);
            uint64_t dq = up(q, sizeof(float) * qf), dout = up(o_mma, sizeof(float) * qf);
            uint64_t dtab = up(tabs, sizeof tabs), dctx = up(nctx, sizeof nctx), dwin = up(win, sizeof win);
            uint64_t dseq = up(seq, sizeof seq), druns = up(runs, sizeof(int32_t) * 4 * (n_runs > 0 ? n_runs : 1));
            uint64_t dscr = 0;
            CHECKF(hr_cuda_alloc(dev, hr_kv_storage_cuda_attend_scratch(gpu, N, H, max_vis), &dscr, &e) == HR_OK, "%s",
                   e.msg);
            for (int k = 0; k < 2; k++) {
                float *o = k ? o_mma : o_split;
                CHECK(hr_kv_storage_cuda_set_prefill_attn(gpu, k ? "mma" : "split", &e) == HR_OK);
                memset(o, 0xff, sizeof(float) * qf); /* NaN: a row neither path writes fails */
                hr_cuda_upload(dev, dout, o, sizeof(float) * qf, &e);
                CHECKF(hr_kv_storage_cuda_attend_runs(gpu, 1, dq, dtab, PF_MAXB, dseq, dctx, dwin, 0, N, max_vis, H,
                                                      a.scale, a.softcap, runs, druns, n_runs, NULL, dout, dscr,
                                                      &e) == HR_OK,
                       "%s", e.msg);
                down(o, dout, sizeof(float) * qf);
            }
            const bool exact_k = fmt == HR_KV_F32 || fmt == HR_KV_F16 || fmt == HR_KV_BF16;
            const double uv = u * (1.0 + (exact_k ? 0.0 : 1.0) + (fmt == HR_KV_F16 ? 1.0 : 0.0));
            const double vmax = fmt == HR_KV_Q4H ? 1.1 : 1.001;
            double worst[2] = {0, 0}, worst_frac = 0; /* |err| / bound: split, mma */
            bool same_rest = true, mma_ran = false;
            for (int r = 0; r < N; r++) {
                bool in_run = false;
                for (int i = 0; i < n_runs; i++) in_run |= r >= runs[4 * i] && r < runs[4 * i] + runs[4 * i + 1];
                for (int h = 0; h < H; h++) {
                    const float *qh = q + ((size_t)r * H + h) * D;
                    double q1 = 0, amax = 0;
                    float hq[128];
                    memcpy(hq, qh, sizeof(float) * (size_t)D);
                    if (fmt == HR_KV_Q4H) hadamard_ref(hq, D);
                    for (int d = 0; d < D; d++) q1 += fabs(hq[d]), amax = fmax(amax, fabs(hq[d]));
                    const double eps = exact_k            ? 0.0
                                       : fmt == HR_KV_Q4H ? a.scale * kmax * (D * amax / 65534.0 + u * q1)
                                                          : a.scale * u * q1 * 1.51;
                    const double bound = vmax * (expm1(2.0 * eps) + uv) + 5e-5;
                    for (int d = 0; d < D; d++) {
                        const size_t i = ((size_t)r * H + h) * D + d;
                        for (int k = 0; k < 2; k++) {
                            const double err = fabs((double)(k ? o_mma : o_split)[i] - o_cpu[i]) / bound;
                            worst[k] = err != err ? INFINITY : fmax(worst[k], err);
                        }
                        if (in_run)
                            mma_ran |= o_mma[i] != o_split[i];
                        else
                            same_rest &= memcmp(&o_mma[i], &o_split[i], sizeof(float)) == 0;
                        worst_frac = fmax(worst_frac, fabs((double)o_mma[i] - o_cpu[i]));
                    }
                }
            }
            CHECKF(worst[0] <= 1.0 && worst[1] <= 1.0,
                   "prefill attention %s D %d H %d/%d softcap %d: error / bound split %g, mma %g",
                   hr_kv_format_name(fmt), D, H, HKV, softcap, worst[0], worst[1]);
            CHECKF(same_rest, "prefill attention %s D %d H %d: the rows outside runs differ between the paths",
                   hr_kv_format_name(fmt), D, H);
            CHECKF(mma_ran, "prefill attention %s D %d H %d: the runs' rows are the split path's bit for bit",
                   hr_kv_format_name(fmt), D, H);
            printf("prefill attention %s D %d G %d softcap %d: worst |mma - cpu| %.3g (%.2g of the bound)\n",
                   hr_kv_format_name(fmt), D, H / HKV, softcap, worst_frac, worst[1]);
            uint64_t bufs[] = {dq, dout, dtab, dctx, dwin, dseq, druns, dscr};
            for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) hr_cuda_free(dev, bufs[i]);
            gpu->ops->destroy(gpu);
            cpu->ops->destroy(cpu);
            free(q), free(o_cpu), free(o_split), free(o_mma), free(kv), free(scratch), free(blk);
        }
}

/* The driver's launch limits (fake_libcuda.c's, a compute capability 9.0 GPU's): each shape one past a
 * limit is refused with CUDA_ERROR_INVALID_VALUE (1) and its reason, and the same launch at the limit
 * runs (fn: the emulating driver's handle of a self-test kernel) */
static void test_launch_limits(void *h, void (*fn)(void **)) {
    void *l = dlsym(h, "cuLaunchKernel"), *s = dlsym(h, "cuGetErrorString");
    CHECKF(l && s, "the driver has no cuLaunchKernel / cuGetErrorString");
    if (!l || !s) return;
    int (*launch_k)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **,
                    void **);
    int (*err_str)(int, const char **);
    void *f;
    memcpy(&launch_k, &l, sizeof l), memcpy(&err_str, &s, sizeof s), memcpy(&f, &fn, sizeof fn);
    static const struct {
        unsigned g[3], b[3], shared;
        const char *why;
    } bad[] = {
        {{1, 1, 1}, {1025, 1, 1}, 0, "a block dimension"},
        {{1, 1, 1}, {32, 32, 2}, 0, "more than 1024 threads"},
        {{1, 1, 1}, {1, 1, 65}, 0, "a block dimension"},
        {{1, 65536, 1}, {64, 1, 1}, 0, "a grid dimension"},
        {{1, 1, 65536}, {64, 1, 1}, 0, "a grid dimension"},
        {{0x80000000u, 1, 1}, {64, 1, 1}, 0, "a grid dimension"},
        {{1, 0, 1}, {64, 1, 1}, 0, "a dimension is 0"},
        {{1, 1, 1}, {0, 1, 1}, 0, "a dimension is 0"},
        {{1, 1, 1}, {64, 1, 1}, (48u << 10) + 1, "48 KiB of dynamic shared"},
    };
    static float out[64 + 1024]; /* the self-test writes out[t] and out[64 + t] */
    float *o = out;
    void *args[] = {&o};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = launch_k(f, bad[i].g[0], bad[i].g[1], bad[i].g[2], bad[i].b[0], bad[i].b[1], bad[i].b[2],
                          bad[i].shared, NULL, args, NULL);
        const char *why = "";
        err_str(rc, &why);
        CHECKF(rc == 1 && strstr(why, bad[i].why), "launch limit %zu: rc %d, %s", i, rc, why);
    }
    /* at the limits that the emulator runs (1-D blocks): 1024 threads, a grid of 2 x 2, 48 KiB asked */
    int rc = launch_k(f, 2, 2, 1, 1024, 1, 1, 48u << 10, NULL, args, NULL);
    CHECKF(rc == 0, "a launch at the limits refused: rc %d", rc);
}

/* The emulating driver's own semantics, which the checks above rely on (its self-test kernels,
 * tests/cuda/emu_kernels.cc, launched directly): a barrier that can never open ends the launch with an
 * error naming it, lanes that leave count as arrived at their warp's shuffles, a misaligned vector load
 * fails the launch, and a launch past the hardware's limits is refused. */
static void test_emulator(const char *lib) {
    void *h = dlopen(lib, RTLD_NOW);
    void *k = h ? dlsym(h, "hr_emu_kernel") : NULL, *l = h ? dlsym(h, "hr_emu_launch") : NULL;
    CHECKF(k && l, "%s has no hr_emu_kernel / hr_emu_launch", lib);
    if (!k || !l) {
        if (h) dlclose(h);
        return;
    }
    typedef void (*kernel_fn)(void **);
    kernel_fn (*find)(const char *);
    int (*emu_launch)(kernel_fn, void **, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, char *, size_t);
    memcpy(&find, &k, sizeof k);
    memcpy(&emu_launch, &l, sizeof l);
    float out[128] = {0}, *o = out;
    void *args[] = {&o};
    char why[256] = "";
    int rc = emu_launch(find("hr_emu_selftest_divergent"), args, 1, 1, 1, 32, 1, 1, why, sizeof why);
    CHECKF(rc == 1 && strstr(why, "16 threads wait at __syncthreads and 16 at a warp shuffle, 0 finished: a barrier "
                                  "that never opens"),
           "a divergent barrier: rc %d, %s", rc, why);
    rc = emu_launch(find("hr_emu_selftest_early_exit"), args, 1, 1, 1, 64, 1, 1, why, sizeof why);
    bool ok = rc == 0;
    for (int t = 0; t < 64; t++)
        if (t % 32 < 16) ok &= out[t] == (float)t && out[64 + t] == (float)(t ^ 1);
    CHECKF(ok, "lanes leaving a shuffle: rc %d, %s", rc, why);
    /* a 16-byte load 4 bytes past a 16-byte boundary fails the launch (a GPU's misaligned-address
     * fault); at the boundary it reads */
    static _Alignas(16) float buf[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    float *bp = buf;
    int off = 1;
    void *margs[] = {&bp, &off};
    rc = emu_launch(find("hr_emu_selftest_misaligned"), margs, 1, 1, 1, 32, 1, 1, why, sizeof why);
    CHECKF(rc == 2 && strstr(why, "a 16-byte access at") && strstr(why, "not 16-byte aligned"),
           "a misaligned load: rc %d, %s", rc, why);
    off = 4;
    rc = emu_launch(find("hr_emu_selftest_misaligned"), margs, 1, 1, 1, 32, 1, 1, why, sizeof why);
    CHECKF(rc == 0 && buf[0] == 4.0f && buf[3] == 7.0f, "an aligned load: rc %d, %s", rc, why);
    /* a float * argument 2 bytes off a float: refused as the launch starts, before any load */
    bp = (float *)(void *)((char *)buf + 2);
    off = 0;
    rc = emu_launch(find("hr_emu_selftest_misaligned"), margs, 1, 1, 1, 32, 1, 1, why, sizeof why);
    CHECKF(rc == 2 && strstr(why, "a 4-byte access at"), "a misaligned pointer argument: rc %d, %s", rc, why);
    test_launch_limits(h, find("hr_emu_selftest_early_exit"));
    /* PTX newer than the driver (the emulating one is CUDA 12.8: ISA 8.7 at most) is refused as a real
     * driver refuses it (CUDA_ERROR_UNSUPPORTED_PTX_VERSION) */
    void *ml = dlsym(h, "cuModuleLoadData");
    int (*load)(void **, const void *);
    memcpy(&load, &ml, sizeof ml);
    void *mod = NULL;
    CHECK(ml && load(&mod, ".version 8.8\n.target sm_90a\n.visible .entry hr_k_embed(\n") == 222);
    CHECK(ml && load(&mod, ".version 8.7\n.target sm_90a\n.visible .entry hr_k_embed(\n") == 0);
    dlclose(h);
}

int main(int argc, char **argv) {
    hr_error e = {0};
    /* argv[1]: a driver library to use instead of libcuda.so.1 (ctest's test_cuda_kernels_emulated
     * names the emulating one; its failure to open is a failure, not a skip) */
    const char *driver = argc > 1 ? argv[1] : NULL;
    if (hr_cuda_device_open(driver, 0, &dev, &e) != HR_OK) {
        if (driver) {
            CHECKF(false, "%s", e.msg);
            return hr_test_finish();
        }
        HR_SKIP("%s", e.msg);
    }
    printf("GPU: %s\n", hr_cuda_device_name(dev));
    if (driver) test_emulator(driver);
    test_rmsnorm_softmax();
    test_rope();
    test_swiglu();
    test_embed_gemv();
    test_mma_selftest();
    test_gemm();
    test_attention();
    test_attention_masks();
    test_attention_deferred();
    test_prefill_runs();
    test_prefill_attention();
    test_argmax_rows(); /* last: its random rows leave the others' data as it was */
    hr_cuda_device_close(dev);
    return hr_test_finish();
}

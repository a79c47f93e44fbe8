/* cuda_kernels_matrix.c: test_gpu_cuda_kernels's matrix kernels (test_cuda_kernels.c says what the
 * program is): embedding rows and GEMV for every weight type, the tensor cores' mma wrappers and the
 * GEMMs built on them, each against a double-precision product on the host. */
#include "cuda_kernels_test.h"

#include "tensor/tensor.h"

/* embedding rows and GEMV over q8_0 / q4_0 matrices made by the CPU's reference quantizer */
void test_embed_gemv(kt_ctx *kt) {
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
            fill(kt, wf, (size_t)cols * rows, 1.0f);
            fill(kt, x, (size_t)cols * T, 1.0f);
            for (int r = 0; r < rows; r++) {
                hr_quantize_row_ref(types[ti].t, wf + (size_t)r * cols, W + rb * r, cols);
                hr_dequantize_row_ref(types[ti].t, W + rb * r, wf + (size_t)r * cols, cols); /* what the GPU sees */
            }
            uint64_t dW = up(kt, W, rb * rows), dx = up(kt, x, sizeof(float) * cols * T),
                     dy = up(kt, ref, sizeof(float) * out_n);
            if (types[ti].gemv) {
                for (int t = 0; t < T; t++)
                    for (int r = 0; r < rows; r++) {
                        double s = 0;
                        for (int c = 0; c < cols; c++) s += (double)wf[(size_t)r * cols + c] * x[(size_t)t * cols + c];
                        ref[(size_t)t * rows + r] = (float)s;
                    }
                void *a[] = {&dy, &dW, &dx, &rows, &cols, &T};
                if (launch(kt, types[ti].gemv, (unsigned)(rows + HR_CUDA_GEMV_ROWS - 1) / HR_CUDA_GEMV_ROWS,
                           (unsigned)(T + HR_CUDA_GEMV_TOKENS - 1) / HR_CUDA_GEMV_TOKENS, a)) {
                    down(kt, got, dy, sizeof(float) * rows * T);
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
                uint64_t dids = up(kt, ids, sizeof ids), dout = up(kt, ref, sizeof(float) * 4 * cols);
                void *a[] = {&dout, &dW, &dids, &cols, &type};
                if (launch(kt, "hr_k_embed", 4, 1, a)) {
                    down(kt, got, dout, sizeof(float) * 4 * cols);
                    CHECKF(memcmp(got, ref, sizeof(float) * 4 * cols) == 0, "embed type %d %dx%d: not exact", type,
                           rows, cols);
                }
                hr_cuda_free(kt->dev, dids), hr_cuda_free(kt->dev, dout);
            }
            hr_cuda_free(kt->dev, dW), hr_cuda_free(kt->dev, dx), hr_cuda_free(kt->dev, dy);
            free(W), free(wf), free(x), free(ref), free(got);
        }
}

/* ---- a mixture of experts (kernels/gemv.cu's hr_k_gemv_moe_*, kernels/moe.cu) ---- */

/* The expert GEMV of every weight type: a stack of 5 experts' 9 x 256 matrices, 3 tokens routed to 2
 * each (6 slots, an expert shared by two tokens), gate-style (a slot reads its token's row: x_div 2) and
 * down-style (its own: x_div 1), against a double product with each slot's expert's dequantized rows. */
void test_moe_gemv(kt_ctx *kt) {
    static const hr_dtype types[] = {HR_DTYPE_Q8_0, HR_DTYPE_Q4_0, HR_DTYPE_F16,  HR_DTYPE_F32,  HR_DTYPE_BF16,
                                     HR_DTYPE_Q4_K, HR_DTYPE_Q5_K, HR_DTYPE_Q6_K, HR_DTYPE_Q5_0, HR_DTYPE_Q5_1};
    enum { NE = 5, R = 9, C = 256, T = 3, K = 2 };
    static const int sel[T * K] = {4, 0, 1, 3, 0, 4};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const hr_dtype t = types[ti];
        char name[64];
        snprintf(name, sizeof name, "hr_k_gemv_moe_%s", hr_dtype_get_info(t)->name);
        const size_t rb = hr_dtype_row_bytes(t, C);
        unsigned char *W = malloc(rb * R * NE);
        float *wf = malloc(sizeof(float) * C * R * NE), *x = malloc(sizeof(float) * C * T * K);
        float ref[T * K * R], got[T * K * R];
        fill(kt, wf, (size_t)C * R * NE, 1.0f);
        fill(kt, x, (size_t)C * T * K, 1.0f);
        for (int r = 0; r < R * NE; r++) {
            hr_quantize_row_ref(t, wf + (size_t)r * C, W + rb * r, C);
            hr_dequantize_row_ref(t, W + rb * r, wf + (size_t)r * C, C);
        }
        uint64_t dW = up(kt, W, rb * R * NE), dx = up(kt, x, sizeof(float) * C * T * K), dsel = up(kt, sel, sizeof sel),
                 dy = up(kt, ref, sizeof ref);
        for (int x_div = 1; x_div <= K; x_div++) {
            for (int s = 0; s < T * K; s++)
                for (int r = 0; r < R; r++) {
                    double acc = 0;
                    for (int c = 0; c < C; c++)
                        acc += (double)wf[((size_t)sel[s] * R + r) * C + c] * x[(size_t)(s / x_div) * C + c];
                    ref[s * R + r] = (float)acc;
                }
            int rows = R, cols = C, div = x_div;
            uint64_t eb = (uint64_t)rb * R;
            void *a[] = {&dy, &dW, &dx, &rows, &cols, &dsel, &div, &eb};
            if (launch(kt, name, (R + HR_CUDA_GEMV_ROWS - 1) / HR_CUDA_GEMV_ROWS, T * K, a)) {
                down(kt, got, dy, sizeof got);
                double worst = 0;
                for (int i = 0; i < T * K * R; i++)
                    worst = fmax(worst, fabs((double)got[i] - ref[i]) / sqrt((double)C));
                CHECKF(worst < 1e-5, "%s x_div %d: error / sqrt(cols) %g", name, x_div, worst);
            }
        }
        hr_cuda_free(kt->dev, dW), hr_cuda_free(kt->dev, dx), hr_cuda_free(kt->dev, dsel), hr_cuda_free(kt->dev, dy);
        free(W), free(wf), free(x);
    }
}

/* The routing (hr_k_moe_route) against the CPU's steps in double: softmax over NE, the K largest in
 * descending order with ties to the lower id, renormalized; 8 experts (Mixtral's count) and 40 (more
 * than a warp's lanes, so a lane owns two), rows with ties, a row of one value (the first K ids), and a
 * row of NaN, whose choices must at least stay inside the stack. Then the weighted sum (hr_k_moe_sum)
 * against the CPU's order. */
void test_moe_route(kt_ctx *kt) {
    static const int cases[][2] = {{8, 2}, {40, 3}, {40, 8}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        enum { T = 5, MAXE = 40, MAXK = 8 };
        int NE = cases[ci][0], K = cases[ci][1];
        float p[T * MAXE], w[T * MAXK], wref[T * MAXK];
        int sel[T * MAXK], sref[T * MAXK];
        fill(kt, p, (size_t)T * NE, 4.0f);
        p[1 * NE + 3] = p[1 * NE + 5] = p[1 * NE + NE - 1] = 9.0f; /* row 1: a three-way tie at the top */
        for (int e = 0; e < NE; e++) p[2 * NE + e] = 0.5f;         /* row 2: all alike */
        for (int e = 0; e < NE; e++) p[4 * NE + e] = NAN;          /* row 4: NaN */
        for (int t = 0; t < 4; t++) {
            double mx = -INFINITY, sum = 0, pr[MAXE], ws = 0;
            for (int e = 0; e < NE; e++) mx = fmax(mx, p[t * NE + e]);
            for (int e = 0; e < NE; e++) sum += pr[e] = exp((double)p[t * NE + e] - mx);
            for (int k = 0; k < K; k++) {
                int best = -1;
                for (int e = 0; e < NE; e++) {
                    bool taken = false;
                    for (int j = 0; j < k; j++) taken |= sref[t * K + j] == e;
                    if (!taken && (best < 0 || pr[e] > pr[best])) best = e;
                }
                sref[t * K + k] = best;
                ws += pr[best] / sum;
            }
            for (int k = 0; k < K; k++) wref[t * K + k] = (float)(pr[sref[t * K + k]] / sum / ws);
        }
        uint64_t dp = up(kt, p, sizeof(float) * T * NE), ds = up(kt, sel, sizeof sel), dw = up(kt, w, sizeof w);
        void *a[] = {&dp, &ds, &dw, &NE, &K};
        hr_error e = {0};
        const hr_status st = hr_cuda_launch(kt->dev, "hr_k_moe_route", T, 1, 32, a, &e); /* a warp a token */
        CHECKF(st == HR_OK, "hr_k_moe_route NE %d K %d: %s", NE, K, e.msg);
        if (st == HR_OK) {
            down(kt, sel, ds, sizeof sel);
            down(kt, w, dw, sizeof w);
            double worst = 0;
            for (int i = 0; i < 4 * K; i++) {
                CHECKF(sel[i] == sref[i], "route NE %d K %d: token %d rank %d is expert %d, the CPU's %d", NE, K, i / K,
                       i % K, sel[i], sref[i]);
                worst = fmax(worst, fabs((double)w[i] - wref[i]));
            }
            CHECKF(worst < 2e-6, "route NE %d K %d: weights %g from the CPU's", NE, K, worst);
            for (int k = 0; k < K; k++)
                CHECKF(sel[4 * K + k] >= 0 && sel[4 * K + k] < NE, "route NE %d: a NaN row chose expert %d", NE,
                       sel[4 * K + k]);
        }
        hr_cuda_free(kt->dev, dp), hr_cuda_free(kt->dev, ds), hr_cuda_free(kt->dev, dw);
    }
    /* the weighted sum: y[t] = w0 o0 + w1 o1 + ..., the CPU's order, so the same floats */
    enum { T = 3, K = 3, E = 300 };
    float o[T * K * E], w[T * K], y[T * E], ref[T * E];
    fill(kt, o, sizeof o / sizeof o[0], 2.0f);
    fill(kt, w, sizeof w / sizeof w[0], 1.0f);
    for (int t = 0; t < T; t++)
        for (int j = 0; j < E; j++) {
            float acc = w[t * K] * o[(t * K) * E + j];
            for (int k = 1; k < K; k++) acc += w[t * K + k] * o[(t * K + k) * E + j];
            ref[t * E + j] = acc;
        }
    int e = E, k = K;
    uint64_t dy = up(kt, y, sizeof y), dO = up(kt, o, sizeof o), dw = up(kt, w, sizeof w);
    void *a[] = {&dy, &dO, &dw, &e, &k};
    if (launch(kt, "hr_k_moe_sum", T, 1, a)) {
        down(kt, y, dy, sizeof y);
        double worst = 0;
        for (int i = 0; i < T * E; i++) worst = fmax(worst, fabs((double)y[i] - ref[i]));
        CHECKF(worst < 1e-6, "moe_sum: %g from the CPU's order", worst);
    }
    hr_cuda_free(kt->dev, dy), hr_cuda_free(kt->dev, dO), hr_cuda_free(kt->dev, dw);
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
void test_mma_selftest(kt_ctx *kt) {
    for (int f16 = 0; f16 < 2; f16++) {
        float A[16][16], B[16][8], C[16][8];
        uint16_t Ah[16][16], Bh[16][8];
        for (int r = 0; r < 16; r++)
            for (int k = 0; k < 16; k++) Ah[r][k] = to16(frand(kt) * 4.0f, f16, &A[r][k]);
        for (int k = 0; k < 16; k++)
            for (int n = 0; n < 8; n++) Bh[k][n] = to16(frand(kt) * 4.0f, f16, &B[k][n]);
        fill(kt, &C[0][0], 16 * 8, 8.0f);
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
        uint64_t dcd = up(kt, cd, sizeof cd), da = up(kt, a, sizeof a), db = up(kt, b, sizeof b);
        void *args[] = {&dcd, &da, &db, &f16};
        hr_error e;
        hr_status st = hr_cuda_launch(kt->dev, "hr_k_mma_selftest", 1, 1, 32, args, &e);
        CHECKF(st == HR_OK, "hr_k_mma_selftest: %s", e.msg);
        if (st == HR_OK) {
            float got[32][4];
            down(kt, got, dcd, sizeof got);
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
        hr_cuda_free(kt->dev, dcd), hr_cuda_free(kt->dev, da), hr_cuda_free(kt->dev, db);
    }
}

/* Each tensor-core GEMM against a double-precision product of what it multiplies: the weights as
 * dequantized (exact), x rounded to the kernel's 16-bit type (bf16 for bf16 weights, f16 for the rest;
 * nearest even, as the kernel rounds it). So the only difference is f32 accumulation, bounded by
 * (cols + 64) 2^-23 sum |w x| (a rounding or truncation of at most 2^-23 per addition, the q8_0 / q4_0
 * block scales' products included). Shapes cross every edge: T 16, 17, 64, 100 against the block's 64
 * tokens, rows 64, 100, 4096 against its 128, cols 32 (one K-step), 288 (nine), 4096, and 72 (a half
 * K-step: bf16 and f16 take cols in 8s). Unwritten outputs (NaN) and writes past y (a guard) fail. */
void test_gemm(kt_ctx *kt) {
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
            fill(kt, wf, (size_t)cols * rows, 1.0f);
            fill(kt, x, (size_t)cols * T, 2.0f);
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
            uint64_t dW = up(kt, W, rb * rows), dx = up(kt, x, sizeof(float) * cols * T),
                     dy = up(kt, got, sizeof(float) * (ny + GUARD));
            void *a[] = {&dy, &dW, &dx, &rows, &cols, &T};
            if (launch(kt, types[ti].k, (unsigned)(rows + 127) / 128, (unsigned)(T + 63) / 64, a)) {
                down(kt, got, dy, sizeof(float) * (ny + GUARD));
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
            hr_cuda_free(kt->dev, dW), hr_cuda_free(kt->dev, dx), hr_cuda_free(kt->dev, dy);
            free(W), free(wf), free(x), free(xr), free(got), free(ref), free(mag);
        }
        printf("%s: worst error %.3g of sum |w x|\n", types[ti].k, worst_seen);
    }
}

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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kv_storage_cpu.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/cuda.h"
#include "harness.h"
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
        float x[T * H * D], ref[T * H * D], got[T * H * D];
        fill(x, T * H * D, 2.0f);
        memcpy(ref, x, sizeof x);
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) hr_op_rope(ref + (t * H + h) * D, n_rot, inv, (float)pos[t], neox);
        uint64_t dx = up(x, sizeof x), dpos = up(pos, sizeof pos), dinv = up(inv, sizeof inv);
        void *a[] = {&dx, &dpos, &dinv, &heads, &hd, &n_rot, &neox};
        if (launch("hr_k_rope", T, 1, a)) {
            down(got, dx, sizeof got);
            /* absolute, |x| < 2: sin.approx / cos.approx of the reduced angle (about 1e-6) */
            double worst = 0;
            for (int i = 0; i < T * H * D; i++) worst = fmax(worst, fabs((double)got[i] - ref[i]));
            CHECKF(worst < 2e-5, "rope neox=%d: absolute error %g", neox, worst);
        }
        hr_cuda_free(dev, dx), hr_cuda_free(dev, dpos), hr_cuda_free(dev, dinv);
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
    static const int shapes[][3] = {{1, 32, 1},   {7, 64, 11},    {33, 288, 3},    {3, 256, 11},
                                    {5, 172, 11}, {9, 768, 9},    {512, 4096, 1}, {100, 11008, 2}};
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
                        for (int c = 0; c < cols; c++)
                            s += (double)wf[(size_t)r * cols + c] * x[(size_t)t * cols + c];
                        ref[(size_t)t * rows + r] = (float)s;
                    }
                void *a[] = {&dy, &dW, &dx, &rows, &cols, &T};
                if (launch(types[ti].gemv, (unsigned)(rows + 7) / 8, (unsigned)(T + 7) / 8, a)) {
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

/* paged attention: tokens written by the CPU storage, its blocks copied byte for byte into the
 * device storage, then both attend the same queries (GQA 12, tables in any order, one query over five
 * chunks of the split kernel, a softcap) */
/* one attention case on both storages: the GPU's within the format's bound of the CPU's */
static void check_attention(hr_kv_storage *cpu, hr_kv_storage *gpu, hr_kv_format fmt, const hr_kv_attn_query *qc,
                            int nq, int H, int D, const char *what) {
    enum { MAXQ = 4 };
    static float o_cpu[MAXQ][24 * 64], o_gpu[MAXQ][24 * 64];
    hr_kv_attn_query a_cpu[MAXQ], a_gpu[MAXQ];
    for (int i = 0; i < nq; i++) {
        a_cpu[i] = a_gpu[i] = qc[i];
        a_cpu[i].out = o_cpu[i];
        a_gpu[i].out = o_gpu[i];
    }
    hr_error e = {0};
    for (int softcap = 0; softcap < 2; softcap++) {
        hr_kv_attn_args a = {.n_heads = H, .scale = 0.125f, .softcap = softcap ? 30.0f : 0.0f};
        float *scratch = malloc(sizeof(float) << 20);
        cpu->ops->attend(cpu, 1, a_cpu, nq, &a, scratch);
        free(scratch);
        gpu->ops->attend(gpu, 1, a_gpu, nq, &a, NULL);
        CHECKF(hr_kv_storage_cuda_check(gpu, &e) == HR_OK, "%s", e.msg);
        /* with an f16 V the CPU rounds each softmax weight to f16 before P.V (kv_attention.c's kv_weights),
         * the GPU keeps them in f32: each output moves by at most 2^-11 of the weights' sum (1) times max
         * |v| (25, the outlier), absolute. Otherwise the order of additions only. */
        const float *g = &o_gpu[0][0], *c = &o_cpu[0][0];
        if (fmt == HR_KV_F16) {
            double worst = 0;
            for (int i = 0; i < nq * H * D; i++) worst = fmax(worst, fabs((double)g[i] - c[i]));
            double bound = 25.0 * 0x1p-11 + 1e-5;
            CHECKF(worst < bound, "attention %s %s softcap %d: absolute error %g", hr_kv_format_name(fmt), what,
                   softcap, worst);
        } else {
            double r = max_rel(g, c, (size_t)nq * H * D, 1e-2);
            CHECKF(r < 1e-3, "attention %s %s softcap %d: relative error %g", hr_kv_format_name(fmt), what, softcap,
                   r);
        }
    }
}

/* Every format the device stores: the device's encoder (hr_k_kv_write, through the storage's write op
 * one token at a time and hr_kv_storage_cuda_write_dev for a batch) gives the CPU storage's bytes
 * exactly, and attention over them matches the CPU's, with the split count the storage picks and with
 * one split of many tiles (HEADROOM_CUDA_ATTN_BLOCKS=1: the online softmax across tiles). */
static void test_attention(void) {
    static const hr_kv_format fmts[] = {HR_KV_F16, HR_KV_Q8, HR_KV_F32, HR_KV_BF16, HR_KV_FP8};
    for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++) {
        enum {
            L = 2,
            HKV = 2,
            H = 24,
            D = 64,
            B = 16,
            NB = 72,
            NQ = 4
        }; /* 12 query heads a KV head: groups of 8 and 4 */
        const hr_kv_format fmt = fmts[fi];
        hr_error e = {0};
        hr_kv_storage_params p = {
            .n_layers = L, .n_kv_heads = HKV, .head_dim = D, .block_size = B, .n_blocks = NB, .isa = "scalar"};
        kv_fmt_init(&p.k, fmt, KV_K, B, D, &e);
        kv_fmt_init(&p.v, fmt, KV_V, B, D, &e);
        hr_kv_storage *cpu = NULL, *gpu = NULL;
        CHECKF(hr_kv_storage_cpu_create(&p, &cpu, &e) == HR_OK, "%s", e.msg);
        CHECKF(hr_kv_storage_cuda_create(dev, &p, &gpu, &e) == HR_OK, "%s", e.msg);
        if (!cpu || !gpu) return;
        /* blocks 0..NB-2 one token at a time through the write op; the last block's tokens as one batch */
        static float kb[B][HKV * D], vb[B][HKV * D];
        for (int blk = 0; blk < NB; blk++)
            for (int l = 0; l < L; l++)
                for (int t = 0; t < B; t++) {
                    float *k = kb[t], *v = vb[t];
                    fill(k, HKV * D, 1.5f);
                    fill(v, HKV * D, 1.0f);
                    if (t == 3) k[5] = 40.0f, v[7] = -25.0f; /* an outlier: its group's scale */
                    cpu->ops->write(cpu, l, blk, t, -1, k, v);
                    if (blk < NB - 1) gpu->ops->write(gpu, l, blk, t, -1, k, v);
                    if (blk == NB - 1 && t == B - 1) {
                        int32_t slots[B];
                        for (int i = 0; i < B; i++) slots[i] = blk * B + i;
                        uint64_t dk = up(kb, sizeof kb), dv = up(vb, sizeof vb), ds = up(slots, sizeof slots);
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
        /* tables in any order; the last one spans 70 blocks (1,117 positions: five tiles of 256) */
        int32_t t0[] = {3, 7, 1, 0, 11}, t1[] = {5, 4, 2}, t2[] = {9}, t3[70];
        for (int i = 0; i < 70; i++) t3[i] = 71 - i;
        static float q[NQ][H * D];
        fill(&q[0][0], NQ * H * D, 1.0f);
        hr_kv_attn_query qc[NQ] = {{.table = t0, .n_ctx = 5 * B - 3, .tail_stage = -1, .q = q[0]},
                                   {.table = t1, .n_ctx = 3 * B, .tail_stage = -1, .q = q[1]},
                                   {.table = t2, .n_ctx = 1, .tail_stage = -1, .q = q[2]},
                                   {.table = t3, .n_ctx = 70 * B - 3, .tail_stage = -1, .q = q[3]}};
        check_attention(cpu, gpu, fmt, qc, NQ, H, D, "split");
        gpu->ops->destroy(gpu);
        /* one split for every query: each block walks all its tiles */
        setenv("HEADROOM_CUDA_ATTN_BLOCKS", "1", 1);
        gpu = NULL;
        CHECKF(hr_kv_storage_cuda_create(dev, &p, &gpu, &e) == HR_OK, "%s", e.msg);
        unsetenv("HEADROOM_CUDA_ATTN_BLOCKS");
        if (!gpu) return;
        unsigned char *blkbuf = malloc(bb);
        for (int blk = 0; blk < NB && blkbuf; blk++) {
            cpu->ops->read_block(cpu, blk, blkbuf);
            gpu->ops->write_block(gpu, blk, blkbuf);
        }
        free(blkbuf);
        check_attention(cpu, gpu, fmt, qc, NQ, H, D, "one split");
        gpu->ops->destroy(gpu);
        cpu->ops->destroy(cpu);
    }
}

/* The emulating driver's own semantics, which the checks above rely on (its two self-test kernels,
 * tests/cuda/emu_kernels.cc, launched directly): a barrier that can never open ends the launch with an
 * error naming it, and lanes that leave count as arrived at their warp's shuffles. */
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
    test_attention();
    hr_cuda_device_close(dev);
    return hr_test_finish();
}

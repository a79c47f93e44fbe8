/* gpu_bench_kernels.c: gpu_bench's sections 1-3 (gpu_bench.c has what each measures): the device-to-device
 * copy, the reference bandwidth, and the logits' download at the e2e batches; each GEMV kernel at
 * Llama-3-8B's matrix shapes, one token; the same matrices at 512 tokens through the GEMV and the
 * tensor-core GEMM. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "gpu_bench.h"
#include "sampler/sampler.h"
#include "tensor/tensor.h"

/* ---- 1. copy bandwidth -------------------------------------------------------------------------------- */

typedef struct copy_ctx {
    hr_cuda_device *dev;
    uint64_t src, dst;
    size_t bytes;
} copy_ctx;

static hr_status copy_rep(void *p, int rep, hr_error *e) {
    copy_ctx *c = p;
    return hr_cuda_copy(c->dev, c->dst, c->src, c->bytes, e);
}

/* one "logits to host" row: B rows of n_vocab floats downloaded from dst (whose first bytes are h's)
 * into `to` (page-locked where `pinned`), host wall clock, median of 15; the median ms or NAN */
static double logits_row(gpu_bench *g, uint64_t dst, const unsigned char *h, void *to, size_t bytes, int B, int n_vocab,
                         bool pinned) {
    hr_error e = {0};
    const size_t lb = (size_t)B * (size_t)n_vocab * sizeof(float);
    row l = gb_new_row("copy", pinned ? "logits to pinned host" : "logits to host");
    snprintf(l.shape, sizeof l.shape, "%d x %d f32 (%.2f MiB)%s", B, n_vocab, lb / MIB,
             pinned ? ", page-locked" : ", pageable");
    snprintf(l.unit, sizeof l.unit, "ms");
    double v[15];
    int n = 0;
    bool ok = lb <= bytes;
    memset(to, 0, lb);
    for (int k = 0; ok && k < 15; k++) {
        double t0 = hr_time_now();
        if (hr_cuda_download(g->dev, to, dst, lb, &e)) ok = gb_dev_fail(g, &l, "download", &e);
        v[n++] = (hr_time_now() - t0) * 1e3;
    }
    double ms = NAN;
    if (ok && gb_verdict(g, &l, memcmp(h, to, lb) == 0, "bytes differ", 0.0)) {
        snprintf(l.check, sizeof l.check, "ok (bytes equal; host wall clock, median of %d)", n);
        ms = l.value = l.median_ms = gb_median(v, n);
        l.loops = n;
        l.reps = 1;
    }
    json_t *lj = json_object();
    json_object_set_new(lj, "rows", json_integer(B));
    json_object_set_new(lj, "n_vocab", json_integer(n_vocab));
    json_object_set_new(lj, "bytes", json_integer((json_int_t)lb));
    json_object_set_new(lj, "page_locked", json_boolean(pinned));
    gb_add_row(g, &l, lj);
    return ms;
}

void gb_bench_copy(gpu_bench *g) {
    size_t bytes = g->o.quick ? (size_t)1 << 20 : (size_t)1 << 30;
    row r = gb_new_row("copy", "device to device");
    snprintf(r.shape, sizeof r.shape, "%.0f MiB, read + write counted", bytes / MIB);
    snprintf(r.unit, sizeof r.unit, "GB/s");
    copy_ctx c = {g->dev, 0, 0, bytes};
    hr_error e = {0};
    unsigned char *h = malloc(bytes), *back = malloc(bytes);
    if (!h || !back) {
        fprintf(stderr, "gpu_bench: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < bytes; i++) h[i] = (unsigned char)(i * 131u + (i >> 12));
    timing t;
    if (hr_cuda_alloc(g->dev, bytes, &c.src, &e) || hr_cuda_alloc(g->dev, bytes, &c.dst, &e) ||
        hr_cuda_upload(g->dev, c.src, h, bytes, &e))
        gb_dev_fail(g, &r, "setup", &e);
    else if (hr_cuda_copy(g->dev, c.dst, c.src, bytes, &e) || hr_cuda_download(g->dev, back, c.dst, bytes, &e))
        gb_dev_fail(g, &r, "copy", &e);
    else if (gb_verdict(g, &r, memcmp(h, back, bytes) == 0, "bytes differ", 0.0)) {
        snprintf(r.check, sizeof r.check, "ok (bytes equal)");
        if (gb_time_reps(g, copy_rep, &c, 500.0, &t, &e))
            gb_dev_fail(g, &r, "timing", &e);
        else {
            gb_set_timing(&r, &t);
            r.value = 2.0 * (double)bytes / (t.median_ms * 1e-3) / 1e9;
            g->copy_gbs = r.value;
            r.pct_copy = 100.0;
            if (g->spec_gbs > 0) {
                snprintf(r.target, sizeof r.target, "(ref.; %.32s %.0f GB/s)", g->spec_card, g->spec_gbs);
                r.pct_target = gb_pct(r.value, g->spec_gbs);
            } else
                snprintf(r.target, sizeof r.target, "(reference; no datasheet figure)");
        }
    }
    json_t *x = json_object();
    json_object_set_new(x, "bytes", json_integer((json_int_t)bytes));
    json_object_set_new(x, "bytes_moved_per_rep", json_integer((json_int_t)(2 * bytes)));
    gb_add_row(g, &r, x);
    /* the logits' way to the host as the forward pass takes it (hr_cuda_download, waited for): Llama-3's
     * 128256 floats a row at the e2e batches, into pageable memory (malloc: the engine's rows by default)
     * and into page-locked memory (HEADROOM_CUDA_PINNED_LOGITS=1), and the first's time over the
     * second's; against the e2e step times they say what sampling on the device could save */
    static const int rows_full[] = {1, 16, 64}, rows_quick[] = {1, 4};
    const int n_vocab = g->o.quick ? 512 : 128256;
    const size_t most = (size_t)(g->o.quick ? 4 : 64) * (size_t)n_vocab * sizeof(float);
    void *pinned = c.src && most <= bytes ? hr_cuda_host_alloc(g->dev, most, &e) : NULL;
    for (int i = 0; i < (g->o.quick ? 2 : 3) && c.src; i++) {
        const int B = (g->o.quick ? rows_quick : rows_full)[i];
        const double pageable_ms = logits_row(g, c.dst, h, back, bytes, B, n_vocab, false);
        const double pinned_ms = pinned ? logits_row(g, c.dst, h, pinned, bytes, B, n_vocab, true) : NAN;
        if (!pinned) gb_skip_row(g, "copy", "logits to pinned host", "-", "no page-locked memory");
        char prefix[48];
        snprintf(prefix, sizeof prefix, "logits batch %d", B);
        json_t *xj = json_object();
        json_object_set_new(xj, "rows", json_integer(B));
        gb_add_ratio(g, gb_new_row("copy", "pageable/pinned"), prefix, "pageable", NULL, pageable_ms, "pinned", NULL,
                     pinned_ms, "download", xj);
    }
    hr_cuda_host_free(g->dev, pinned);
    hr_cuda_free(g->dev, c.src);
    hr_cuda_free(g->dev, c.dst);
    free(h);
    free(back);
}

/* ---- 1a. the greedy choice: argmax on the device against the logits copied ------------------------------ */

typedef struct argmax_ctx {
    hr_cuda_device *dev;
    uint64_t logits, ids;
    int rows, n;
} argmax_ctx;

static hr_status argmax_rep(void *p, int rep, hr_error *e) {
    argmax_ctx *c = p;
    void *a[] = {&c->ids, &c->logits, &c->n};
    return hr_cuda_launch(c->dev, "hr_k_argmax_rows", (unsigned)c->rows, 1, 256, a, e);
}

/* logit i of the measured rows: a hash of i in [-128, 128) on a 2^-16 grid (not gb_frand: the sections
 * after this one keep the data they had) */
static float argmax_logit(size_t i) {
    uint64_t h = (i + 1) * 0x9e3779b97f4a7c15ULL;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 32;
    return (float)(h >> 40) / 65536.0f - 128.0f;
}

/* the host's way, as the runtime samples today: the B x V logits downloaded (pageable memory, waited
 * for), then hr_argmax over each row; host wall clock, median of 15; ids: its choices */
static double argmax_host_ms(gpu_bench *g, const argmax_ctx *c, float *buf, int32_t *ids, row *r) {
    hr_error e = {0};
    double v[15];
    for (int k = 0; k < 15; k++) {
        double t0 = hr_time_now();
        if (hr_cuda_download(g->dev, buf, c->logits, sizeof(float) * (size_t)c->rows * (size_t)c->n, &e)) {
            gb_dev_fail(g, r, "download", &e);
            return NAN;
        }
        for (int i = 0; i < c->rows; i++) ids[i] = hr_argmax(buf + (size_t)i * (size_t)c->n, c->n);
        v[k] = (hr_time_now() - t0) * 1e3;
    }
    snprintf(r->check, sizeof r->check, "(the reference; host wall clock, median of 15)");
    return gb_median(v, 15);
}

/* the device's way: hr_k_argmax_rows over the B rows, then the B ids downloaded (which waits for the
 * kernel); host wall clock, median of 15. Checked first: the ids (over -1s, so an id the kernel does not
 * write fails) against the host's. *kernel_ms: the kernel alone (GPU events, gb_time_reps). */
static double argmax_dev_ms(gpu_bench *g, argmax_ctx *c, const int32_t *want, int32_t *ids, row *r, double *kernel_ms) {
    hr_error e = {0};
    const size_t bytes = sizeof(int32_t) * (size_t)c->rows;
    for (int i = 0; i < c->rows; i++) ids[i] = -1;
    if (hr_cuda_upload(g->dev, c->ids, ids, bytes, &e) || argmax_rep(c, 0, &e) ||
        hr_cuda_download(g->dev, ids, c->ids, bytes, &e)) {
        gb_dev_fail(g, r, "run", &e);
        return NAN;
    }
    int differ = 0;
    for (int i = 0; i < c->rows; i++) differ += ids[i] != want[i];
    if (!gb_verdict(g, r, differ == 0, "ids differing from hr_argmax's:", differ)) return NAN;
    snprintf(r->check, sizeof r->check, "ok (ids equal hr_argmax's; host wall clock, median of 15)");
    double v[15];
    for (int k = 0; k < 15; k++) {
        double t0 = hr_time_now();
        if (argmax_rep(c, 0, &e) || hr_cuda_download(g->dev, ids, c->ids, bytes, &e)) {
            gb_dev_fail(g, r, "run", &e);
            return NAN;
        }
        v[k] = (hr_time_now() - t0) * 1e3;
    }
    timing t;
    if (gb_time_reps(g, argmax_rep, c, 100.0, &t, &e)) {
        gb_dev_fail(g, r, "timing", &e);
        return NAN;
    }
    *kernel_ms = t.median_ms;
    return gb_median(v, 15);
}

/* Sampling on the device or the logits copied (docs/GPU.md): at each e2e batch B, a 128256-token
 * vocabulary, "logits + host argmax" (the logits' download and hr_argmax, what the runtime does) against
 * "argmax on device" (hr_k_argmax_rows, then B ids downloaded), and the first's time over the second's
 * (> 1: the device is faster). The engine keeps the logits' copy until a GPU measures this. */
void gb_bench_argmax(gpu_bench *g) {
    static const int rows_full[] = {1, 16, 64}, rows_quick[] = {1, 4};
    const int *batches = g->o.quick ? rows_quick : rows_full, n_b = g->o.quick ? 2 : 3;
    const int n_vocab = g->o.quick ? 512 : 128256, max_rows = batches[n_b - 1];
    const size_t n_all = (size_t)max_rows * (size_t)n_vocab;
    float *logits = malloc(sizeof(float) * n_all), *buf = malloc(sizeof(float) * n_all);
    int32_t *want = malloc(sizeof(int32_t) * (size_t)max_rows), *ids = malloc(sizeof(int32_t) * (size_t)max_rows);
    if (!logits || !buf || !want || !ids) {
        fprintf(stderr, "gpu_bench: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n_all; i++) logits[i] = argmax_logit(i);
    argmax_ctx c = {.dev = g->dev, .n = n_vocab};
    hr_error e = {0};
    const bool ok = !hr_cuda_alloc(g->dev, sizeof(float) * n_all, &c.logits, &e) &&
                    !hr_cuda_alloc(g->dev, sizeof(int32_t) * (size_t)max_rows, &c.ids, &e) &&
                    !hr_cuda_upload(g->dev, c.logits, logits, sizeof(float) * n_all, &e);
    for (int bi = 0; bi < n_b; bi++) {
        const int B = batches[bi];
        c.rows = B;
        row h = gb_new_row("copy", "logits + host argmax"), d = gb_new_row("copy", "argmax on device");
        snprintf(h.shape, sizeof h.shape, "%d x %d f32 downloaded, hr_argmax a row", B, n_vocab);
        snprintf(d.shape, sizeof d.shape, "%d x %d f32, hr_k_argmax_rows, %d id%s downloaded", B, n_vocab, B,
                 B > 1 ? "s" : "");
        snprintf(h.unit, sizeof h.unit, "ms");
        snprintf(d.unit, sizeof d.unit, "ms");
        double host_ms = NAN, dev_ms = NAN, kernel_ms = NAN;
        if (!ok)
            gb_dev_fail(g, &h, "setup", &e), gb_dev_fail(g, &d, "setup", &e);
        else if (gb_out_of_time(g)) {
            snprintf(h.check, sizeof h.check, "skipped: time budget (--max-seconds)");
            snprintf(d.check, sizeof d.check, "skipped: time budget (--max-seconds)");
        } else if (isfinite(host_ms = argmax_host_ms(g, &c, buf, want, &h)))
            dev_ms = argmax_dev_ms(g, &c, want, ids, &d, &kernel_ms);
        else
            snprintf(d.check, sizeof d.check, "skipped: the host's way failed");
        h.value = h.median_ms = host_ms;
        d.value = d.median_ms = dev_ms;
        h.loops = d.loops = 15;
        h.reps = d.reps = 1;
        json_t *hj = json_object(), *dj = json_object();
        json_object_set_new(hj, "rows", json_integer(B));
        json_object_set_new(hj, "n_vocab", json_integer(n_vocab));
        json_object_set_new(dj, "rows", json_integer(B));
        json_object_set_new(dj, "n_vocab", json_integer(n_vocab));
        json_object_set_new(dj, "kernel_ms", gb_jnum(kernel_ms));
        gb_add_row(g, &h, hj);
        gb_add_row(g, &d, dj);
        char prefix[32];
        snprintf(prefix, sizeof prefix, "batch %d", B);
        json_t *xj = json_object();
        json_object_set_new(xj, "rows", json_integer(B));
        gb_add_ratio(g, gb_new_row("copy", "host/device argmax"), prefix, "host", "logits + host argmax", host_ms,
                     "device", "argmax on device", dev_ms, "way", xj);
    }
    hr_cuda_free(g->dev, c.logits);
    hr_cuda_free(g->dev, c.ids);
    free(logits), free(buf), free(want), free(ids);
}

/* ---- 2, 3. GEMV ----------------------------------------------------------------------------------------- */

typedef struct wtype {
    hr_dtype t;
    const char *kernel;
    bool prefill;     /* measured at T = 512 too */
    bool target80;    /* the issue's >= 80% of copy bandwidth */
    const char *gemm; /* the tensor-core GEMM the forward pass uses from 16 tokens on (kernels/gemm.cu), or NULL */
    bool gemm_f16;    /* it rounds x to f16 (else bf16) */
} wtype;

static const wtype k_types[] = {
    {HR_DTYPE_F32, "hr_k_gemv_f32", false, false, NULL, false},
    {HR_DTYPE_F16, "hr_k_gemv_f16", true, false, "hr_k_gemm_f16", true},
    {HR_DTYPE_BF16, "hr_k_gemv_bf16", true, true, "hr_k_gemm_bf16", false},
    {HR_DTYPE_Q8_0, "hr_k_gemv_q8_0", true, true, "hr_k_gemm_q8_0", true},
    {HR_DTYPE_Q4_0, "hr_k_gemv_q4_0", true, true, "hr_k_gemm_q4_0", true},
    {HR_DTYPE_Q4_K, "hr_k_gemv_q4_K", true, false, NULL, false},
    {HR_DTYPE_Q5_K, "hr_k_gemv_q5_K", true, false, NULL, false},
    {HR_DTYPE_Q6_K, "hr_k_gemv_q6_K", true, false, NULL, false},
};

typedef struct mshape {
    int rows, cols;
    const char *role;
    bool prefill; /* measured at T = 512 */
    bool f32;     /* f32 measured (not the 2 GB output matrix) */
} mshape;

static const mshape k_shapes_full[] = {{4096, 4096, "attn_q, attn_output", true, true},
                                       {14336, 4096, "ffn_gate, ffn_up", true, true},
                                       {4096, 14336, "ffn_down", true, true},
                                       {128256, 4096, "output", false, false}};
static const mshape k_shapes_quick[] = {{60, 256, "quick", true, true}, {24, 512, "quick", true, true}};

enum { POOL_ROWS = 37 }; /* distinct rows: row r of a matrix is pool row r % POOL_ROWS */

typedef struct gemv_ctx {
    hr_cuda_device *dev;
    const char *kernel;
    uint64_t w, x, y;
    size_t stride; /* bytes between the copies of W */
    int copies, rows, cols, T;
    bool gemm;     /* kernel is a tensor-core GEMM (its grid) */
    bool gemm_f16; /* which rounds x to f16, else bf16 */
} gemv_ctx;

/* launched as backend_cuda.c's gemv(): args {y, W, x, rows, cols, T}, 256 threads a block; the GEMV 8
 * rows a block, a tile of up to HR_CUDA_GEMV_TOKENS tokens a grid row (cuda.h), the GEMM 128 rows a
 * block and 64 tokens a grid row */
static hr_status gemv_rep(void *p, int rep, hr_error *e) {
    gemv_ctx *c = p;
    uint64_t w = c->w + (uint64_t)(rep % c->copies) * c->stride;
    int rows = c->rows, cols = c->cols, T = c->T;
    void *a[] = {&c->y, &w, &c->x, &rows, &cols, &T};
    if (c->gemm)
        return hr_cuda_launch(c->dev, c->kernel, (unsigned)((rows + 127) / 128), (unsigned)((T + 63) / 64), 256, a, e);
    return hr_cuda_launch(c->dev, c->kernel, (unsigned)((rows + HR_CUDA_GEMV_ROWS - 1) / HR_CUDA_GEMV_ROWS),
                          (unsigned)((T + HR_CUDA_GEMV_TOKENS - 1) / HR_CUDA_GEMV_TOKENS), 256, a, e);
}

/* x as the GEMM multiplies it: rounded to f16 or bf16 */
static float round16(float v, bool f16) {
    return f16 ? hr_f16_to_f32(hr_f32_to_f16(v)) : hr_bf16_to_f32(hr_f32_to_bf16(v));
}

/* runs the kernel once on copy 0 at T tokens and checks y[t] for the tokens ts against the reference
 * (pool rows dequantized, in double; x rounded as a GEMM rounds it): |y - ref| / sqrt(cols) < 1e-5
 * (test_cuda_kernels' bound for the GEMV; the GEMM's f32 accumulation in another order stays as close) */
static bool gemv_check(gpu_bench *g, row *r, gemv_ctx *c, const float *poolf, int P, const float *x, const int *ts,
                       int n_ts) {
    hr_error e = {0};
    size_t ny = (size_t)c->T * (size_t)c->rows;
    float *y = malloc(sizeof(float) * ny);
    if (!y) return gb_dev_fail(g, r, "host memory", &e);
    memset(y, 0xff, sizeof(float) * ny); /* NaN: a row the kernel leaves unwritten fails */
    if (hr_cuda_upload(g->dev, c->y, y, sizeof(float) * ny, &e) || gemv_rep(c, 0, &e) ||
        hr_cuda_download(g->dev, y, c->y, sizeof(float) * ny, &e)) {
        free(y);
        return gb_dev_fail(g, r, "run", &e);
    }
    double worst = 0;
    for (int k = 0; k < n_ts; k++) {
        const float *xt = x + (size_t)ts[k] * (size_t)c->cols;
        for (int p = 0; p < P; p++) {
            double s = 0;
            for (int i = 0; i < c->cols; i++)
                s += (double)poolf[(size_t)p * c->cols + i] * (c->gemm ? round16(xt[i], c->gemm_f16) : xt[i]);
            for (int row_i = p; row_i < c->rows; row_i += P) {
                double d = fabs((double)y[(size_t)ts[k] * c->rows + row_i] - s) / sqrt((double)c->cols);
                if (!(d <= worst)) worst = d; /* NaN counts as worst */
            }
        }
    }
    free(y);
    return gb_verdict(g, r, worst < 1e-5, "err/sqrt(cols)", worst);
}

static void bench_gemv_one(gpu_bench *g, const wtype *wt, const mshape *ms, int T_prefill, size_t rot_bytes) {
    const hr_dtype_info *info = hr_dtype_get_info(wt->t);
    const int rows = ms->rows, cols = ms->cols, P = rows < POOL_ROWS ? rows : POOL_ROWS;
    const bool pre = wt->prefill && ms->prefill;
    const int T_max = pre ? T_prefill : 1;
    char shape[120];
    snprintf(shape, sizeof shape, "%dx%d (%s), T=1", rows, cols, ms->role);
    if (gb_out_of_time(g)) {
        gb_skip_row(g, "gemv", info->name, shape, "time budget (--max-seconds)");
        return;
    }
    size_t rb = hr_dtype_row_bytes(wt->t, cols), mat = rb * (size_t)rows, stride = (mat + 255) / 256 * 256;
    int copies = (int)((rot_bytes + mat - 1) / mat);
    copies = copies < 1 ? 1 : copies > 16 ? 16 : copies;
    uint64_t free_b = 0, total_b = 0;
    hr_error e = {0};
    if (!hr_cuda_device_mem(g->dev, &free_b, &total_b, &e))
        while (copies > 1 && (double)stride * copies > 0.5 * (double)free_b) copies--;
    row r = gb_new_row("gemv", info->name);
    snprintf(r.shape, sizeof r.shape, "%s", shape);
    snprintf(r.unit, sizeof r.unit, "GB/s");
    unsigned char *pool = malloc(rb * (size_t)P);
    float *poolf = malloc(sizeof(float) * (size_t)P * cols), *x = malloc(sizeof(float) * (size_t)T_max * cols);
    gemv_ctx c = {
        .dev = g->dev, .kernel = wt->kernel, .stride = stride, .copies = copies, .rows = rows, .cols = cols, .T = 1};
    if (!pool || !poolf || !x) {
        fprintf(stderr, "gpu_bench: out of memory\n");
        exit(1);
    }
    /* P random rows quantized by the project's reference quantizer (finite scales), dequantized back:
     * what the kernel multiplies */
    gb_fill(g, poolf, (size_t)P * cols, 1.0f);
    for (int p = 0; p < P; p++) {
        hr_quantize_row_ref(wt->t, poolf + (size_t)p * cols, pool + rb * (size_t)p, cols);
        hr_dequantize_row_ref(wt->t, pool + rb * (size_t)p, poolf + (size_t)p * cols, cols);
    }
    gb_fill(g, x, (size_t)T_max * cols, 1.0f);
    json_t *xj = json_object();
    json_object_set_new(xj, "type", json_string(info->name));
    json_object_set_new(xj, "rows", json_integer(rows));
    json_object_set_new(xj, "cols", json_integer(cols));
    json_object_set_new(xj, "tokens", json_integer(1));
    json_object_set_new(xj, "weight_bytes", json_integer((json_int_t)mat));
    json_object_set_new(xj, "weight_copies_rotated", json_integer(copies));
    bool ok = true;
    if (hr_cuda_alloc(g->dev, stride * (size_t)copies, &c.w, &e) ||
        hr_cuda_alloc(g->dev, sizeof(float) * (size_t)T_max * cols, &c.x, &e) ||
        hr_cuda_alloc(g->dev, sizeof(float) * (size_t)T_max * rows, &c.y, &e) ||
        hr_cuda_upload(g->dev, c.w, pool, rb * (size_t)P, &e) || gb_replicate(g, c.w, rb * (size_t)P, mat, &e) ||
        hr_cuda_upload(g->dev, c.x, x, sizeof(float) * (size_t)T_max * cols, &e))
        ok = gb_dev_fail(g, &r, "setup", &e);
    for (int k = 1; ok && k < copies; k++)
        if (hr_cuda_copy(g->dev, c.w + (uint64_t)k * stride, c.w, mat, &e)) ok = gb_dev_fail(g, &r, "setup", &e);
    int t0 = 0;
    if (ok && gemv_check(g, &r, &c, poolf, P, x, &t0, 1)) {
        timing t;
        if (gb_time_reps(g, gemv_rep, &c, 250.0, &t, &e))
            ok = gb_dev_fail(g, &r, "timing", &e);
        else {
            gb_set_timing(&r, &t);
            r.value = (double)mat / (t.median_ms * 1e-3) / 1e9;
            r.pct_copy = gb_pct(r.value, g->copy_gbs);
            if (wt->target80) {
                snprintf(r.target, sizeof r.target, ">= %.0f%% of copy", GEMV_TARGET_PCT);
                r.pct_target = gb_pct(r.pct_copy, GEMV_TARGET_PCT);
            }
        }
    } else
        ok = false;
    gb_add_row(g, &r, xj);

    /* 3. the same matrix at T tokens: FLOP = 2 rows cols T, through the GEMV and, where the type has one,
     * the tensor-core GEMM (what the forward pass runs at T >= 16) */
    for (int k = 0; pre && k < (wt->gemm ? 2 : 1); k++) {
        char what[40];
        snprintf(what, sizeof what, "%s %s", info->name, k ? "gemm" : "gemv");
        row q = gb_new_row("prefill", what);
        snprintf(q.shape, sizeof q.shape, "%dx%d (%s), T=%d", rows, cols, ms->role, T_prefill);
        snprintf(q.unit, sizeof q.unit, "TFLOP/s");
        if (!ok)
            snprintf(q.check, sizeof q.check, "skipped: the T=1 run failed");
        else if (gb_out_of_time(g))
            snprintf(q.check, sizeof q.check, "skipped: time budget (--max-seconds)");
        else {
            c.T = T_prefill;
            c.copies = 1;
            c.gemm = k == 1;
            c.gemm_f16 = wt->gemm_f16;
            c.kernel = k ? wt->gemm : wt->kernel;
            int ts[3] = {0, T_prefill / 2, T_prefill - 1};
            if (gemv_check(g, &q, &c, poolf, P, x, ts, 3)) {
                timing t;
                if (gb_time_reps(g, gemv_rep, &c, 400.0, &t, &e))
                    gb_dev_fail(g, &q, "timing", &e);
                else {
                    gb_set_timing(&q, &t);
                    q.value = 2.0 * rows * (double)cols * T_prefill / (t.median_ms * 1e-3) / 1e12;
                    snprintf(q.target, sizeof q.target, ">= %.0f%% of %.0f TFLOP/s (bf16)", PREFILL_TARGET_PCT,
                             H200_BF16_TFLOPS);
                    q.pct_target = gb_pct(q.value, PREFILL_TARGET_PCT / 100.0 * H200_BF16_TFLOPS);
                }
            }
        }
        json_t *qj = json_object();
        json_object_set_new(qj, "type", json_string(info->name));
        json_object_set_new(qj, "kernel", json_string(k ? wt->gemm : wt->kernel));
        json_object_set_new(qj, "rows", json_integer(rows));
        json_object_set_new(qj, "cols", json_integer(cols));
        json_object_set_new(qj, "tokens", json_integer(T_prefill));
        json_object_set_new(qj, "flop_per_call", json_real(2.0 * rows * (double)cols * T_prefill));
        gb_add_row(g, &q, qj);
    }
    hr_cuda_free(g->dev, c.w);
    hr_cuda_free(g->dev, c.x);
    hr_cuda_free(g->dev, c.y);
    free(pool);
    free(poolf);
    free(x);
}

void gb_bench_gemv(gpu_bench *g) {
    const mshape *shapes = g->o.quick ? k_shapes_quick : k_shapes_full;
    size_t n_shapes = g->o.quick ? HR_ARRAY_LEN(k_shapes_quick) : HR_ARRAY_LEN(k_shapes_full);
    int T_prefill = g->o.quick ? 20 : 512; /* --quick: three GEMV token tiles, the last short; one GEMM tile, short */
    /* T=1 reps rotate over copies of W totalling >= 256 MiB (the H200's L2 is 50 MB), so each rep reads
     * its matrix from HBM; --quick: 64 KiB, to run the rotation */
    size_t rot = g->o.quick ? (size_t)64 << 10 : (size_t)256 << 20;
    for (size_t si = 0; si < n_shapes; si++)
        for (size_t ti = 0; ti < HR_ARRAY_LEN(k_types); ti++) {
            if (k_types[ti].t == HR_DTYPE_F32 && !shapes[si].f32) continue;
            bench_gemv_one(g, &k_types[ti], &shapes[si], T_prefill, rot);
        }
}

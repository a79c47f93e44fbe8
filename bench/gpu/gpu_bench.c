/* gpu_bench.c: the GPU's measurements for bench/gpu/check.sh's step 5 (docs/GPU.md, "Measurements").
 *
 *   1. copy:      device-to-device copy bandwidth (hr_cuda_copy), the reference every "% of copy" is of;
 *                 and the logits' download at the e2e batches (what sampling on the device could save);
 *   2. gemv:      each GEMV kernel at Llama-3-8B's matrix shapes, one token: weight bytes / time;
 *   3. prefill:   the same matrices at 512 tokens, through the GEMV and the tensor-core GEMM (f16, bf16,
 *                 q8_0, q4_0): 2 rows cols T / time;
 *   4. attention: the device KV storage's decode attention (hr_kv_storage_cuda_attend_dev) per KV format
 *                 at 1K, 8K and 32K positions, 16 queries: K and V bytes read / time, through each
 *                 attention kernel on the same storage (hr_kv_storage_cuda_set_attn_kernel: "rows", then
 *                 "split", the default), each checked; then split's time over rows' per format and
 *                 context (which is faster); f16's time over q8's, q4h's and q4's;
 *   4a. attention under token masks (h2o, snapkv) at 8K positions, f16 KV: without masks, with every
 *                 mask bit set (checked bit for bit against the unmasked outputs) and with the scores
 *                 accumulated (hr_k_attn_score; each head's weights checked to sum to 1): ms each, and
 *                 the two masked times over the unmasked one;
 *   4b. prefill attention: a 512-token chunk at Llama-3-8B's shape (H 32/8, D 128) after 0 and 8K
 *                 positions, f16 KV, through the split kernels and through hr_k_attn_prefill (tensor
 *                 cores; kv_storage_cuda.c's HEADROOM_CUDA_PREFILL_ATTN), each checked: TFLOP/s, and
 *                 split's time over mma's (which is faster);
 *   5. e2e:       the runtime's decode steps at batch 1, 16, 64 and a 512-token prefill step on a
 *                 Llama-3-8B-shaped synthetic bf16 model (--e2e-layers of its 32 layers); each decode
 *                 batch launch by launch, then replayed as CUDA graphs (hr_cuda_backend_set_graphs), and
 *                 the two side by side ("eager/graphs": eager time / graphs time, > 1: graphs faster);
 *   6. capacity:  the engine's concurrent 8K sessions at one 16 GiB KV pool per KV format (f16, q8, fp8,
 *                 q4h, q4), each over f16's (run before 5, which takes what time is left).
 *
 * Every kernel's output is checked against the CPU before it is timed (GEMV: the reference
 * dequantization; attention: the CPU KV storage's), at the shape measured; a wrong one fails the run
 * (exit 1) and is not timed. Kernel timing: GPU events (hr_cuda_time_begin / _end) around a loop of R
 * back-to-back reps after a warm-up rep, R chosen so a loop lasts about 2 ms; the figure is the median
 * over the loops of (loop time / R). The e2e figures are host wall-clock time per engine step
 * (hr_runtime_step, logits download and sampling included), median over the steps.
 *
 * Usage: gpu_bench [--driver LIB] [--quick] [--json FILE] [--md FILE] [--commit C] [--driver-version V]
 *                  [--max-seconds S] [--e2e-layers N] [--no-e2e] [--only gemv,attention,capacity,e2e]
 *        gpu_bench --validate FILE.json [FILE.md]   (the files' shape: every expected key, every check ok)
 * --quick: tiny shapes for the emulating driver (seconds on a CPU). Exit 0 when every check passed, 1 when
 * one failed, 2 for usage, 77 when the GPU cannot be opened. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/kv_storage_cpu.h"
#include "backend/cuda/cuda.h"
#include "common/util.h"
#include "runtime/runtime.h"
#include "runtime/runtime_parts.h"
#include "tensor/tensor.h"

#define SCHEMA "headroom-gpu-bench/1"
/* the targets (H200) */
#define H200_SPEC_GBS        4800.0 /* HBM3e, the data sheet's peak */
#define H200_BF16_TFLOPS     790.0  /* dense bf16 tensor cores, about */
#define GEMV_TARGET_PCT      80.0   /* of copy bandwidth: bf16, q8_0, q4_0, one token */
#define PREFILL_TARGET_PCT   50.0   /* of H200_BF16_TFLOPS */
#define ATTN_TARGET_PCT      80.0   /* of copy bandwidth, f16 and q8 at 8K */
#define ATTN_Q8_F16_TARGET   1.7    /* q8's speed over f16's */
#define ATTN_4BIT_F16_TARGET 2.8    /* 4-bit (q4h)'s speed over f16's */
#define CAPACITY_Q8_TARGET   1.9    /* q8's concurrent sessions over f16's at one KV budget */
#define E2E_TARGET_PCT       70.0   /* of copy bandwidth: weight bytes per batch-1 step */
#define MIB                  (1024.0 * 1024.0)

/* ---- options and state ----------------------------------------------------------------------------- */

typedef struct opts {
    const char *driver, *json, *md, *commit, *driver_version;
    const char *only; /* --only gemv,attention,capacity,e2e (the copy always runs: the reference); NULL: all */
    bool quick, e2e;
    double max_seconds;
    int e2e_layers;
} opts;

static opts O;
static hr_cuda_device *dev;
static double t_start, deadline;
static int n_checked, n_failed;
static double copy_gbs = NAN; /* the reference */
static json_t *jroot;

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static float frand(void) { /* [-1, 1) */
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)(rng_state >> 40) / 8388608.0f - 1.0f;
}

static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = frand() * scale;
}

static double pct(double a, double b) { return isfinite(a) && isfinite(b) && b > 0 ? 100.0 * a / b : NAN; }

static json_t *jnum(double v) { return isfinite(v) ? json_real(v) : json_null(); }

/* ---- rows: one measured figure each, printed as it is made and kept for the markdown -------------- */

typedef struct row {
    char section[16];
    char what[40];
    char shape[120];
    double value;
    char unit[16];
    double median_ms;
    int loops, reps;
    double pct_copy;
    char target[64];
    double pct_target;
    char check[96];
} row;

static row *g_rows;
static int n_rows, cap_rows;

static void print_row(const row *r) {
    char val[32] = "-", ms[48] = "-", pc[16] = "-", pt[16] = "-";
    if (isfinite(r->value)) snprintf(val, sizeof val, "%.4g %s", r->value, r->unit);
    if (isfinite(r->median_ms)) snprintf(ms, sizeof ms, "%.4g ms (%dx%d)", r->median_ms, r->loops, r->reps);
    if (isfinite(r->pct_copy)) snprintf(pc, sizeof pc, "%.1f%%", r->pct_copy);
    if (isfinite(r->pct_target)) snprintf(pt, sizeof pt, "%.1f%%", r->pct_target);
    printf("  %-10s %-14s %-38s %-20s %-22s %-8s %-30s %-8s %s\n", r->section, r->what, r->shape, val, ms, pc,
           r->target[0] ? r->target : "-", pt, r->check);
    fflush(stdout);
}

/* adds a row to the table and its JSON object (the row's fields, then extra's: taken) to section's array */
static void add_row(const row *r, json_t *extra) {
    if (n_rows == cap_rows) {
        cap_rows = cap_rows ? 2 * cap_rows : 64;
        row *nr = realloc(g_rows, sizeof *g_rows * (size_t)cap_rows);
        if (!nr) {
            fprintf(stderr, "gpu_bench: out of memory\n");
            exit(1);
        }
        g_rows = nr;
    }
    g_rows[n_rows++] = *r;
    print_row(r);
    json_t *o = json_object();
    json_object_set_new(o, "what", json_string(r->what));
    json_object_set_new(o, "shape", json_string(r->shape));
    json_object_set_new(o, "value", jnum(r->value));
    json_object_set_new(o, "unit", json_string(r->unit));
    json_object_set_new(o, "median_ms", jnum(r->median_ms));
    json_object_set_new(o, "loops", json_integer(r->loops));
    json_object_set_new(o, "reps_per_loop", json_integer(r->reps));
    json_object_set_new(o, "pct_of_copy_bw", jnum(r->pct_copy));
    json_object_set_new(o, "target", r->target[0] ? json_string(r->target) : json_null());
    json_object_set_new(o, "pct_of_target", jnum(r->pct_target));
    json_object_set_new(o, "check", json_string(r->check));
    if (extra) json_object_update(o, extra);
    json_decref(extra);
    json_t *arr = json_object_get(jroot, r->section);
    if (!arr) {
        arr = json_array();
        json_object_set_new(jroot, r->section, arr);
    }
    json_array_append_new(arr, o);
}

static row new_row(const char *section, const char *what) {
    row r;
    memset(&r, 0, sizeof r);
    snprintf(r.section, sizeof r.section, "%s", section);
    snprintf(r.what, sizeof r.what, "%s", what);
    r.value = r.median_ms = r.pct_copy = r.pct_target = NAN;
    snprintf(r.check, sizeof r.check, "-");
    return r;
}

/* something not measured (a format the storage refuses, the time budget): a row saying why */
static void skip_row(const char *section, const char *what, const char *shape, const char *why) {
    row r = new_row(section, what);
    snprintf(r.shape, sizeof r.shape, "%s", shape);
    snprintf(r.check, sizeof r.check, "skipped: %.80s", why);
    add_row(&r, NULL);
}

static bool out_of_time(void) { return hr_time_now() > deadline; }

/* a check's outcome; false when it failed */
static bool verdict(row *r, bool ok, const char *fmt, double err) {
    n_checked++;
    if (!ok) n_failed++;
    snprintf(r->check, sizeof r->check, ok ? "ok (%s %.2g)" : "FAIL (%s %.2g)", fmt, err);
    return ok;
}

/* ---- device helpers --------------------------------------------------------------------------------- */

static bool dev_fail(row *r, const char *what, const hr_error *e) {
    n_checked++;
    n_failed++;
    snprintf(r->check, sizeof r->check, "FAIL: %.30s: %.50s", what, e->msg);
    return false;
}

/* fills [p, p + total) with copies of its first `have` bytes, doubling (have > 0) */
static hr_status replicate(uint64_t p, size_t have, size_t total, hr_error *e) {
    hr_status st = HR_OK;
    while (have < total && !st) {
        size_t m = have < total - have ? have : total - have;
        st = hr_cuda_copy(dev, p + have, p, m, e);
        have += m;
    }
    return st;
}

/* ---- timing ----------------------------------------------------------------------------------------- */

typedef hr_status (*rep_fn)(void *ctx, int rep, hr_error *err);

typedef struct timing {
    double median_ms;
    int loops, reps;
} timing;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* A warm-up rep (which also estimates a rep's time), then loops of R reps between GPU events, R making
 * a loop about 2 ms (launch gaps amortized), as many loops (3..15) as budget_ms allows. --quick: 3
 * loops of one rep. */
static hr_status time_reps(rep_fn f, void *ctx, double budget_ms, timing *t, hr_error *e) {
    double ms = 0;
    hr_status st = hr_cuda_time_begin(dev, e);
    if (!st) st = f(ctx, 0, e);
    if (!st) st = hr_cuda_time_end(dev, &ms, e);
    if (st) return st;
    int reps = 1, loops = 3, rep = 1;
    if (!O.quick) {
        double est = ms > 1e-3 ? ms : 1e-3;
        reps = (int)ceil(2.0 / est);
        reps = reps < 1 ? 1 : reps > 200 ? 200 : reps;
        loops = (int)(budget_ms / (est * reps));
        loops = loops < 3 ? 3 : loops > 15 ? 15 : loops;
    }
    double v[15];
    for (int l = 0; l < loops; l++) {
        st = hr_cuda_time_begin(dev, e);
        for (int r = 0; r < reps && !st; r++) st = f(ctx, rep++, e);
        if (!st) st = hr_cuda_time_end(dev, &ms, e);
        if (st) return st;
        v[l] = ms / reps;
    }
    t->median_ms = median(v, loops);
    t->loops = loops;
    t->reps = reps;
    return HR_OK;
}

static void set_timing(row *r, const timing *t) {
    r->median_ms = t->median_ms;
    r->loops = t->loops;
    r->reps = t->reps;
}

/* ---- 1. copy bandwidth -------------------------------------------------------------------------------- */

typedef struct copy_ctx {
    uint64_t src, dst;
    size_t bytes;
} copy_ctx;

static hr_status copy_rep(void *p, int rep, hr_error *e) {
    copy_ctx *c = p;
    return hr_cuda_copy(dev, c->dst, c->src, c->bytes, e);
}

static void bench_copy(void) {
    size_t bytes = O.quick ? (size_t)1 << 20 : (size_t)1 << 30;
    row r = new_row("copy", "device to device");
    snprintf(r.shape, sizeof r.shape, "%.0f MiB, read + write counted", bytes / MIB);
    snprintf(r.unit, sizeof r.unit, "GB/s");
    copy_ctx c = {0, 0, bytes};
    hr_error e = {0};
    unsigned char *h = malloc(bytes), *back = malloc(bytes);
    if (!h || !back) {
        fprintf(stderr, "gpu_bench: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < bytes; i++) h[i] = (unsigned char)(i * 131u + (i >> 12));
    timing t;
    if (hr_cuda_alloc(dev, bytes, &c.src, &e) || hr_cuda_alloc(dev, bytes, &c.dst, &e) ||
        hr_cuda_upload(dev, c.src, h, bytes, &e))
        dev_fail(&r, "setup", &e);
    else if (hr_cuda_copy(dev, c.dst, c.src, bytes, &e) || hr_cuda_download(dev, back, c.dst, bytes, &e))
        dev_fail(&r, "copy", &e);
    else if (verdict(&r, memcmp(h, back, bytes) == 0, "bytes differ", 0.0)) {
        snprintf(r.check, sizeof r.check, "ok (bytes equal)");
        if (time_reps(copy_rep, &c, 500.0, &t, &e))
            dev_fail(&r, "timing", &e);
        else {
            set_timing(&r, &t);
            r.value = 2.0 * (double)bytes / (t.median_ms * 1e-3) / 1e9;
            copy_gbs = r.value;
            r.pct_copy = 100.0;
            snprintf(r.target, sizeof r.target, "(reference; H200 spec %.0f GB/s)", H200_SPEC_GBS);
            r.pct_target = pct(r.value, H200_SPEC_GBS);
        }
    }
    json_t *x = json_object();
    json_object_set_new(x, "bytes", json_integer((json_int_t)bytes));
    json_object_set_new(x, "bytes_moved_per_rep", json_integer((json_int_t)(2 * bytes)));
    add_row(&r, x);
    /* the logits' way to the host as the forward pass takes it (hr_cuda_download into pageable memory,
     * waited for): Llama-3's 128256 floats a row at the e2e batches; against the e2e step times it says
     * what sampling on the device could save */
    static const int rows_full[] = {1, 16, 64}, rows_quick[] = {1, 4};
    const int n_vocab = O.quick ? 512 : 128256;
    for (int i = 0; i < (O.quick ? 2 : 3) && c.src; i++) {
        const int B = (O.quick ? rows_quick : rows_full)[i];
        const size_t lb = (size_t)B * (size_t)n_vocab * sizeof(float);
        row l = new_row("copy", "logits to host");
        snprintf(l.shape, sizeof l.shape, "%d x %d f32 (%.2f MiB)", B, n_vocab, lb / MIB);
        snprintf(l.unit, sizeof l.unit, "ms");
        double v[15];
        int n = 0;
        bool ok = lb <= bytes;
        for (int k = 0; ok && k < 15; k++) {
            double t0 = hr_time_now();
            if (hr_cuda_download(dev, back, c.dst, lb, &e)) ok = dev_fail(&l, "download", &e);
            v[n++] = (hr_time_now() - t0) * 1e3;
        }
        if (ok && verdict(&l, memcmp(h, back, lb) == 0, "bytes differ", 0.0)) {
            snprintf(l.check, sizeof l.check, "ok (bytes equal; host wall clock, median of %d)", n);
            l.value = l.median_ms = median(v, n);
            l.loops = n;
            l.reps = 1;
        }
        json_t *lj = json_object();
        json_object_set_new(lj, "rows", json_integer(B));
        json_object_set_new(lj, "n_vocab", json_integer(n_vocab));
        json_object_set_new(lj, "bytes", json_integer((json_int_t)lb));
        add_row(&l, lj);
    }
    hr_cuda_free(dev, c.src);
    hr_cuda_free(dev, c.dst);
    free(h);
    free(back);
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
        return hr_cuda_launch(dev, c->kernel, (unsigned)((rows + 127) / 128), (unsigned)((T + 63) / 64), 256, a, e);
    return hr_cuda_launch(dev, c->kernel, (unsigned)((rows + HR_CUDA_GEMV_ROWS - 1) / HR_CUDA_GEMV_ROWS),
                          (unsigned)((T + HR_CUDA_GEMV_TOKENS - 1) / HR_CUDA_GEMV_TOKENS), 256, a, e);
}

/* x as the GEMM multiplies it: rounded to f16 or bf16 */
static float round16(float v, bool f16) {
    return f16 ? hr_f16_to_f32(hr_f32_to_f16(v)) : hr_bf16_to_f32(hr_f32_to_bf16(v));
}

/* runs the kernel once on copy 0 at T tokens and checks y[t] for the tokens ts against the reference
 * (pool rows dequantized, in double; x rounded as a GEMM rounds it): |y - ref| / sqrt(cols) < 1e-5
 * (test_cuda_kernels' bound for the GEMV; the GEMM's f32 accumulation in another order stays as close) */
static bool gemv_check(row *r, gemv_ctx *c, const float *poolf, int P, const float *x, const int *ts, int n_ts) {
    hr_error e = {0};
    size_t ny = (size_t)c->T * (size_t)c->rows;
    float *y = malloc(sizeof(float) * ny);
    if (!y) return dev_fail(r, "host memory", &e);
    memset(y, 0xff, sizeof(float) * ny); /* NaN: a row the kernel leaves unwritten fails */
    if (hr_cuda_upload(dev, c->y, y, sizeof(float) * ny, &e) || gemv_rep(c, 0, &e) ||
        hr_cuda_download(dev, y, c->y, sizeof(float) * ny, &e)) {
        free(y);
        return dev_fail(r, "run", &e);
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
    return verdict(r, worst < 1e-5, "err/sqrt(cols)", worst);
}

static void bench_gemv_one(const wtype *wt, const mshape *ms, int T_prefill, size_t rot_bytes) {
    const hr_dtype_info *info = hr_dtype_get_info(wt->t);
    const int rows = ms->rows, cols = ms->cols, P = rows < POOL_ROWS ? rows : POOL_ROWS;
    const bool pre = wt->prefill && ms->prefill;
    const int T_max = pre ? T_prefill : 1;
    char shape[120];
    snprintf(shape, sizeof shape, "%dx%d (%s), T=1", rows, cols, ms->role);
    if (out_of_time()) {
        skip_row("gemv", info->name, shape, "time budget (--max-seconds)");
        return;
    }
    size_t rb = hr_dtype_row_bytes(wt->t, cols), mat = rb * (size_t)rows, stride = (mat + 255) / 256 * 256;
    int copies = (int)((rot_bytes + mat - 1) / mat);
    copies = copies < 1 ? 1 : copies > 16 ? 16 : copies;
    uint64_t free_b = 0, total_b = 0;
    hr_error e = {0};
    if (!hr_cuda_device_mem(dev, &free_b, &total_b, &e))
        while (copies > 1 && (double)stride * copies > 0.5 * (double)free_b) copies--;
    row r = new_row("gemv", info->name);
    snprintf(r.shape, sizeof r.shape, "%s", shape);
    snprintf(r.unit, sizeof r.unit, "GB/s");
    unsigned char *pool = malloc(rb * (size_t)P);
    float *poolf = malloc(sizeof(float) * (size_t)P * cols), *x = malloc(sizeof(float) * (size_t)T_max * cols);
    gemv_ctx c = {.kernel = wt->kernel, .stride = stride, .copies = copies, .rows = rows, .cols = cols, .T = 1};
    if (!pool || !poolf || !x) {
        fprintf(stderr, "gpu_bench: out of memory\n");
        exit(1);
    }
    /* P random rows quantized by the project's reference quantizer (finite scales), dequantized back:
     * what the kernel multiplies */
    fill(poolf, (size_t)P * cols, 1.0f);
    for (int p = 0; p < P; p++) {
        hr_quantize_row_ref(wt->t, poolf + (size_t)p * cols, pool + rb * (size_t)p, cols);
        hr_dequantize_row_ref(wt->t, pool + rb * (size_t)p, poolf + (size_t)p * cols, cols);
    }
    fill(x, (size_t)T_max * cols, 1.0f);
    json_t *xj = json_object();
    json_object_set_new(xj, "type", json_string(info->name));
    json_object_set_new(xj, "rows", json_integer(rows));
    json_object_set_new(xj, "cols", json_integer(cols));
    json_object_set_new(xj, "tokens", json_integer(1));
    json_object_set_new(xj, "weight_bytes", json_integer((json_int_t)mat));
    json_object_set_new(xj, "weight_copies_rotated", json_integer(copies));
    bool ok = true;
    if (hr_cuda_alloc(dev, stride * (size_t)copies, &c.w, &e) ||
        hr_cuda_alloc(dev, sizeof(float) * (size_t)T_max * cols, &c.x, &e) ||
        hr_cuda_alloc(dev, sizeof(float) * (size_t)T_max * rows, &c.y, &e) ||
        hr_cuda_upload(dev, c.w, pool, rb * (size_t)P, &e) || replicate(c.w, rb * (size_t)P, mat, &e) ||
        hr_cuda_upload(dev, c.x, x, sizeof(float) * (size_t)T_max * cols, &e))
        ok = dev_fail(&r, "setup", &e);
    for (int k = 1; ok && k < copies; k++)
        if (hr_cuda_copy(dev, c.w + (uint64_t)k * stride, c.w, mat, &e)) ok = dev_fail(&r, "setup", &e);
    int t0 = 0;
    if (ok && gemv_check(&r, &c, poolf, P, x, &t0, 1)) {
        timing t;
        if (time_reps(gemv_rep, &c, 250.0, &t, &e))
            ok = dev_fail(&r, "timing", &e);
        else {
            set_timing(&r, &t);
            r.value = (double)mat / (t.median_ms * 1e-3) / 1e9;
            r.pct_copy = pct(r.value, copy_gbs);
            if (wt->target80) {
                snprintf(r.target, sizeof r.target, ">= %.0f%% of copy", GEMV_TARGET_PCT);
                r.pct_target = pct(r.pct_copy, GEMV_TARGET_PCT);
            }
        }
    } else
        ok = false;
    add_row(&r, xj);

    /* 3. the same matrix at T tokens: FLOP = 2 rows cols T, through the GEMV and, where the type has one,
     * the tensor-core GEMM (what the forward pass runs at T >= 16) */
    for (int k = 0; pre && k < (wt->gemm ? 2 : 1); k++) {
        char what[40];
        snprintf(what, sizeof what, "%s %s", info->name, k ? "gemm" : "gemv");
        row q = new_row("prefill", what);
        snprintf(q.shape, sizeof q.shape, "%dx%d (%s), T=%d", rows, cols, ms->role, T_prefill);
        snprintf(q.unit, sizeof q.unit, "TFLOP/s");
        if (!ok)
            snprintf(q.check, sizeof q.check, "skipped: the T=1 run failed");
        else if (out_of_time())
            snprintf(q.check, sizeof q.check, "skipped: time budget (--max-seconds)");
        else {
            c.T = T_prefill;
            c.copies = 1;
            c.gemm = k == 1;
            c.gemm_f16 = wt->gemm_f16;
            c.kernel = k ? wt->gemm : wt->kernel;
            int ts[3] = {0, T_prefill / 2, T_prefill - 1};
            if (gemv_check(&q, &c, poolf, P, x, ts, 3)) {
                timing t;
                if (time_reps(gemv_rep, &c, 400.0, &t, &e))
                    dev_fail(&q, "timing", &e);
                else {
                    set_timing(&q, &t);
                    q.value = 2.0 * rows * (double)cols * T_prefill / (t.median_ms * 1e-3) / 1e12;
                    snprintf(q.target, sizeof q.target, ">= %.0f%% of %.0f TFLOP/s (bf16)", PREFILL_TARGET_PCT,
                             H200_BF16_TFLOPS);
                    q.pct_target = pct(q.value, PREFILL_TARGET_PCT / 100.0 * H200_BF16_TFLOPS);
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
        add_row(&q, qj);
    }
    hr_cuda_free(dev, c.w);
    hr_cuda_free(dev, c.x);
    hr_cuda_free(dev, c.y);
    free(pool);
    free(poolf);
    free(x);
}

static void bench_gemv(void) {
    const mshape *shapes = O.quick ? k_shapes_quick : k_shapes_full;
    size_t n_shapes = O.quick ? HR_ARRAY_LEN(k_shapes_quick) : HR_ARRAY_LEN(k_shapes_full);
    int T_prefill = O.quick ? 20 : 512; /* --quick: three GEMV token tiles, the last short; one GEMM tile, short */
    /* T=1 reps rotate over copies of W totalling >= 256 MiB (the H200's L2 is 50 MB), so each rep reads
     * its matrix from HBM; --quick: 64 KiB, to run the rotation */
    size_t rot = O.quick ? (size_t)64 << 10 : (size_t)256 << 20;
    for (size_t si = 0; si < n_shapes; si++)
        for (size_t ti = 0; ti < HR_ARRAY_LEN(k_types); ti++) {
            if (k_types[ti].t == HR_DTYPE_F32 && !shapes[si].f32) continue;
            bench_gemv_one(&k_types[ti], &shapes[si], T_prefill, rot);
        }
}

/* ---- 4. decode attention -------------------------------------------------------------------------------- */

typedef struct attn_ctx {
    hr_kv_storage *st;
    uint64_t q, tables, n_ctx, out, scratch;
    int copies, nq, nbq, ctx, H;
    float scale;
} attn_ctx;

static hr_status attn_rep(void *p, int rep, hr_error *e) {
    attn_ctx *c = p;
    uint64_t tab = c->tables + (uint64_t)(rep % c->copies) * (uint64_t)c->nq * (uint64_t)c->nbq * 4u;
    return hr_kv_storage_cuda_attend_dev(c->st, 0, c->q, tab, c->nbq, c->n_ctx, c->nq, c->ctx, c->H, c->scale, 0.0f,
                                         c->out, c->scratch, e);
}

typedef struct attn_shape_t {
    int H, Hkv, D, B, nq;
} attn_shape_t;

/* the attention kernels measured side by side (kv_storage_cuda.c's HEADROOM_CUDA_ATTN_KERNEL): rows
 * first, so that split, the default, is each format's and context's last row (torch_attn.py's f16
 * figure is the last one it reads per context) */
static const char *const k_attn_kernels[] = {"rows", "split"};
#define N_ATTN_KERNELS 2

/* one format at one context, each kernel on the same storage, checked then timed: ms[k] the median ms
 * of kernel k (NAN when not measured); *refused set when the storage refuses the format (the remaining
 * contexts are then skipped) */
static void bench_attn_one(hr_kv_format fmt, const attn_shape_t *as, int ctx, bool target, double *ms, bool *refused) {
    const int H = as->H, Hkv = as->Hkv, D = as->D, B = as->B, nq = as->nq, nbq = (ctx + B - 1) / B;
    hr_error e = {0};
    row r[N_ATTN_KERNELS];
    for (int k = 0; k < N_ATTN_KERNELS; k++) {
        char what[40];
        snprintf(what, sizeof what, "%s KV %s", hr_kv_format_name(fmt), k_attn_kernels[k]);
        r[k] = new_row("attention", what);
        snprintf(r[k].shape, sizeof r[k].shape, "ctx %d, %d queries, H %d/%d, D %d, B %d", ctx, nq, H, Hkv, D, B);
        snprintf(r[k].unit, sizeof r[k].unit, "GB/s");
        ms[k] = NAN;
    }
    /* a reason nothing is measured: each kernel's row says it */
    char skip[96] = "";
    if (out_of_time()) snprintf(skip, sizeof skip, "skipped: time budget (--max-seconds)");
    hr_kv_storage_params p = {.n_layers = 1, .n_kv_heads = Hkv, .head_dim = D, .block_size = B, .isa = "scalar"};
    if (!skip[0] && (kv_fmt_init(&p.k, fmt, KV_K, B, D, &e) || kv_fmt_init(&p.v, fmt, KV_V, B, D, &e))) {
        *refused = true;
        snprintf(skip, sizeof skip, "skipped: %.80s", e.msg);
    }
    /* q4, kivi2: one tail buffer each side, the pattern blocks filled through it; every pattern block is
     * whole and encoded, so attention reads codes only (no tail stage) whatever the context */
    const bool deferred = !skip[0] && (p.k.deferred || p.v.deferred);
    if (deferred) {
        p.n_stage = 1;
        kv_fmt_init(&p.stage, HR_KV_F16, KV_K, B, D, &e);
    }
    const uint64_t tok_bytes = (uint64_t)Hkv * (p.k.head_bytes + p.v.head_bytes) / (uint64_t)B;
    const uint64_t rep_bytes = (uint64_t)nq * (uint64_t)ctx * tok_bytes; /* K + V of every query's context */
    const uint64_t block_bytes = (uint64_t)Hkv * (p.k.head_bytes + p.v.head_bytes);
    size_t rot = O.quick ? (size_t)64 << 10 : (size_t)256 << 20;
    int copies = rep_bytes ? (int)((rot + rep_bytes - 1) / rep_bytes) : 1;
    copies = copies < 1 ? 1 : copies > 8 ? 8 : copies;
    p.n_blocks = copies * nq * nbq;
    hr_kv_storage *st = NULL, *cpu = NULL;
    if (!skip[0] && hr_kv_storage_cuda_create(dev, &p, &st, &e)) {
        *refused = true;
        snprintf(skip, sizeof skip, "skipped: %.80s", e.msg);
    }
    if (skip[0]) {
        for (int k = 0; k < N_ATTN_KERNELS; k++) {
            snprintf(r[k].check, sizeof r[k].check, "%s", skip);
            add_row(&r[k], NULL);
        }
        return;
    }
    /* Pb pattern blocks of real encoded K and V (the CPU storage's writes: random floats, its bytes),
     * uploaded, then copied over the whole arena: block b holds pattern block b % Pb */
    hr_kv_storage_params pc = p;
    const int Pb = p.n_blocks < 32 ? p.n_blocks : 32;
    pc.n_blocks = Pb;
    attn_ctx c = {.st = st, .copies = copies, .nq = nq, .nbq = nbq, .ctx = ctx, .H = H};
    c.scale = 1.0f / sqrtf((float)D);
    const size_t qf = (size_t)nq * H * D;
    float *kv = malloc(sizeof(float) * 2 * Hkv * D), *q = malloc(sizeof(float) * qf);
    float *o_gpu = malloc(sizeof(float) * qf), *o_cpu = malloc(sizeof(float) * (size_t)H * D);
    int32_t *tables = malloc(sizeof(int32_t) * (size_t)copies * nq * nbq), *ctxs = malloc(sizeof(int32_t) * nq);
    int32_t *t_cpu = malloc(sizeof(int32_t) * (size_t)nbq);
    size_t n_scratch = ((size_t)ctx + B) * HR_KV_ATTN_GROUP + (size_t)D + 64;
    float *scratch = malloc(sizeof(float) * n_scratch);
    unsigned char *pat = malloc((size_t)block_bytes * Pb);
    if (!kv || !q || !o_gpu || !o_cpu || !tables || !ctxs || !t_cpu || !scratch || !pat) {
        fprintf(stderr, "gpu_bench: out of memory\n");
        exit(1);
    }
    bool ok = true;
    const char *fail_what = "CPU storage";
    if (hr_kv_storage_cpu_create(&pc, &cpu, &e)) ok = false;
    for (int b = 0; ok && b < Pb; b++) {
        if (deferred) cpu->ops->stage_reset(cpu, 0);
        for (int t = 0; t < B; t++) {
            fill(kv, (size_t)Hkv * D, 1.5f);
            fill(kv + (size_t)Hkv * D, (size_t)Hkv * D, 1.0f);
            cpu->ops->write(cpu, 0, b, t, deferred ? 0 : -1, kv, kv + (size_t)Hkv * D);
        }
        cpu->ops->read_block(cpu, b, pat + (size_t)block_bytes * b);
    }
    for (int k = 0; k < copies; k++)
        for (int i = 0; i < nq; i++)
            for (int j = 0; j < nbq; j++)
                tables[((size_t)k * nq + i) * nbq + j] = (int32_t)(((size_t)k * nq + i) * nbq + j);
    for (int i = 0; i < nq; i++) ctxs[i] = ctx;
    fill(q, qf, 1.0f);
    uint64_t arena = hr_kv_storage_cuda_arena(st);
    if (ok && (hr_cuda_upload(dev, arena, pat, (size_t)block_bytes * Pb, &e) ||
               replicate(arena, (size_t)block_bytes * Pb, (size_t)block_bytes * p.n_blocks, &e) ||
               hr_cuda_alloc(dev, sizeof(float) * qf, &c.q, &e) || hr_cuda_alloc(dev, sizeof(float) * qf, &c.out, &e) ||
               hr_cuda_alloc(dev, sizeof(int32_t) * (size_t)copies * nq * nbq, &c.tables, &e) ||
               hr_cuda_alloc(dev, sizeof(int32_t) * nq, &c.n_ctx, &e) ||
               hr_cuda_alloc(dev, hr_kv_storage_cuda_attend_scratch(st, nq, H, ctx), &c.scratch, &e) ||
               hr_cuda_upload(dev, c.q, q, sizeof(float) * qf, &e) ||
               hr_cuda_upload(dev, c.tables, tables, sizeof(int32_t) * (size_t)copies * nq * nbq, &e) ||
               hr_cuda_upload(dev, c.n_ctx, ctxs, sizeof(int32_t) * nq, &e)))
        ok = false, fail_what = "setup";
    if (!ok)
        for (int k = 0; k < N_ATTN_KERNELS; k++) dev_fail(&r[k], fail_what, &e);
    /* the reference: the last copy's tables, the last query, through the CPU storage's attention over the
     * same bytes (its table: the pattern blocks the GPU's blocks hold) */
    if (ok) {
        const int32_t *tg = tables + ((size_t)(copies - 1) * nq + (nq - 1)) * nbq;
        for (int j = 0; j < nbq; j++) t_cpu[j] = tg[j] % Pb;
        hr_kv_attn_query qc = {
            .table = t_cpu, .n_ctx = ctx, .tail_stage = -1, .q = q + (size_t)(nq - 1) * H * D, .out = o_cpu};
        hr_kv_attn_args a = {.n_heads = H, .scale = c.scale};
        cpu->ops->attend(cpu, 0, &qc, 1, &a, scratch);
    }
    for (int k = 0; ok && k < N_ATTN_KERNELS; k++) {
        row *rk = &r[k];
        /* the check: this kernel's output against the CPU's */
        bool kok = true;
        memset(o_gpu, 0xff, sizeof(float) * qf);
        if (hr_kv_storage_cuda_set_attn_kernel(st, k_attn_kernels[k], &e) ||
            hr_cuda_upload(dev, c.out, o_gpu, sizeof(float) * qf, &e) || attn_rep(&c, copies - 1, &e) ||
            hr_cuda_download(dev, o_gpu, c.out, sizeof(float) * qf, &e))
            kok = dev_fail(rk, "run", &e);
        if (kok) {
            const float *g = o_gpu + (size_t)(nq - 1) * H * D;
            double worst = 0;
            /* the order of additions only: relative, floor 1e-2; q4h: the CPU's int16-rounded query too
             * (test_cuda_kernels' bound); q4, kivi2: that of q times K's per-channel scales (at most 3 /
             * levels for these keys, a quarter more for the refit), test_cuda_kernels' derivation */
            if (fmt == HR_KV_F32 || fmt == HR_KV_Q8 || fmt == HR_KV_Q4H || deferred) {
                for (int i = 0; i < H * D; i++) {
                    double d = fabs((double)g[i] - o_cpu[i]) / fmax(fabs((double)o_cpu[i]), 1e-2);
                    if (!(d <= worst)) worst = d;
                }
                const int levels = fmt == HR_KV_KIVI2 ? 3 : 15;
                const double bound = deferred ? 2.0 * c.scale * D * levels * (1.25 * 3.0 / levels) / 65534.0 + 1e-3
                                     : fmt == HR_KV_Q4H ? 4e-3
                                                        : 1e-3;
                kok = verdict(rk, worst < bound, "rel err", worst);
            } else { /* f16 (the CPU rounds softmax weights to f16 before P.V: 2^-11 absolute) and others */
                for (int i = 0; i < H * D; i++) {
                    double d = fabs((double)g[i] - o_cpu[i]);
                    if (!(d <= worst)) worst = d;
                }
                kok = verdict(rk, worst < 4.9e-4, "abs err", worst);
            }
        }
        if (kok) {
            timing t;
            if (time_reps(attn_rep, &c, 400.0, &t, &e))
                dev_fail(rk, "timing", &e);
            else if (hr_kv_storage_cuda_check(st, &e))
                dev_fail(rk, "storage", &e);
            else {
                set_timing(rk, &t);
                ms[k] = t.median_ms;
                rk->value = (double)rep_bytes / (t.median_ms * 1e-3) / 1e9;
                rk->pct_copy = pct(rk->value, copy_gbs);
                if (target) {
                    snprintf(rk->target, sizeof rk->target, ">= %.0f%% of copy", ATTN_TARGET_PCT);
                    rk->pct_target = pct(rk->pct_copy, ATTN_TARGET_PCT);
                }
            }
        }
    }
    for (int k = 0; k < N_ATTN_KERNELS; k++) {
        json_t *xj = json_object();
        json_object_set_new(xj, "format", json_string(hr_kv_format_name(fmt)));
        json_object_set_new(xj, "kernel", json_string(k_attn_kernels[k]));
        json_object_set_new(xj, "ctx", json_integer(ctx));
        json_object_set_new(xj, "queries", json_integer(nq));
        json_object_set_new(xj, "n_heads", json_integer(H));
        json_object_set_new(xj, "n_kv_heads", json_integer(Hkv));
        json_object_set_new(xj, "head_dim", json_integer(D));
        json_object_set_new(xj, "block_size", json_integer(B));
        json_object_set_new(xj, "bytes_per_rep", json_integer((json_int_t)rep_bytes));
        json_object_set_new(xj, "kv_bytes_per_token", json_integer((json_int_t)tok_bytes));
        json_object_set_new(xj, "arena_copies_rotated", json_integer(copies));
        add_row(&r[k], xj);
    }
    if (cpu) cpu->ops->destroy(cpu);
    st->ops->destroy(st);
    hr_cuda_free(dev, c.q);
    hr_cuda_free(dev, c.out);
    hr_cuda_free(dev, c.tables);
    hr_cuda_free(dev, c.n_ctx);
    hr_cuda_free(dev, c.scratch);
    free(kv), free(q), free(o_gpu), free(o_cpu), free(tables), free(ctxs), free(t_cpu), free(scratch), free(pat);
}

static void bench_attention(void) {
    static const hr_kv_format fmts[] = {HR_KV_F16, HR_KV_Q8,  HR_KV_F32, HR_KV_BF16,
                                        HR_KV_FP8, HR_KV_Q4H, HR_KV_Q4,  HR_KV_KIVI2};
    static const int ctx_full[] = {1024, 8192, 32768}, ctx_quick[] = {40, 300};
    const int *ctxs = O.quick ? ctx_quick : ctx_full;
    const int n_ctx = O.quick ? 2 : 3, target_ctx = O.quick ? 300 : 8192;
    attn_shape_t as = O.quick ? (attn_shape_t){8, 2, 64, 16, 3} : (attn_shape_t){32, 8, 128, 16, 16};
    double ms[8][3][N_ATTN_KERNELS];
    bool refused[8] = {false};
    for (size_t fi = 0; fi < HR_ARRAY_LEN(fmts); fi++) {
        for (int ci = 0; ci < n_ctx; ci++) {
            for (int k = 0; k < N_ATTN_KERNELS; k++) ms[fi][ci][k] = NAN;
            if (refused[fi]) continue;
            bool target = (fmts[fi] == HR_KV_F16 || fmts[fi] == HR_KV_Q8) && ctxs[ci] == target_ctx;
            bench_attn_one(fmts[fi], &as, ctxs[ci], target, ms[fi][ci], &refused[fi]);
        }
    }
    /* q8's, q4h's and q4's speed over f16's (fmts[1], fmts[5] and fmts[6] over fmts[0]), per kernel */
    static const struct {
        int fi;
        double target;
    } low[] = {{1, ATTN_Q8_F16_TARGET}, {5, ATTN_4BIT_F16_TARGET}, {6, ATTN_4BIT_F16_TARGET}};
    for (size_t li = 0; li < HR_ARRAY_LEN(low); li++)
        for (int k = 0; k < N_ATTN_KERNELS; k++)
            for (int ci = 0; ci < n_ctx; ci++) {
                const char *name = hr_kv_format_name(fmts[low[li].fi]);
                char what[40];
                snprintf(what, sizeof what, "%s / f16 speed", name);
                row r = new_row("attention", what);
                snprintf(r.shape, sizeof r.shape, "ctx %d, %d queries, %s kernel (f16 time / %s time)", ctxs[ci], as.nq,
                         k_attn_kernels[k], name);
                snprintf(r.unit, sizeof r.unit, "x");
                r.value = ms[0][ci][k] / ms[low[li].fi][ci][k];
                snprintf(r.target, sizeof r.target, ">= %.1fx", low[li].target);
                r.pct_target = pct(r.value, low[li].target);
                if (!isfinite(r.value)) snprintf(r.check, sizeof r.check, "skipped: f16 or %s not measured", name);
                json_t *xj = json_object();
                json_object_set_new(xj, "ctx", json_integer(ctxs[ci]));
                json_object_set_new(xj, "kernel", json_string(k_attn_kernels[k]));
                add_row(&r, xj);
            }
    /* the kernels side by side: split's time over rows' (> 1: rows is faster), per format measured and
     * context */
    for (size_t fi = 0; fi < HR_ARRAY_LEN(fmts); fi++) {
        if (refused[fi]) continue;
        for (int ci = 0; ci < n_ctx; ci++) {
            char what[40];
            snprintf(what, sizeof what, "%s split/rows", hr_kv_format_name(fmts[fi]));
            row r = new_row("attention", what);
            r.value = ms[fi][ci][1] / ms[fi][ci][0];
            const char *faster = !isfinite(r.value) ? "-" : r.value > 1.0 ? "rows" : "split";
            snprintf(r.shape, sizeof r.shape, "ctx %d, %d queries (split time / rows time): %s faster", ctxs[ci], as.nq,
                     faster);
            snprintf(r.unit, sizeof r.unit, "x");
            if (!isfinite(r.value)) snprintf(r.check, sizeof r.check, "skipped: a kernel not measured");
            json_t *xj = json_object();
            /* not "format": torch_attn.py reads the rows that have one as GB/s figures */
            json_object_set_new(xj, "kv_format", json_string(hr_kv_format_name(fmts[fi])));
            json_object_set_new(xj, "ctx", json_integer(ctxs[ci]));
            json_object_set_new(xj, "split_ms", jnum(ms[fi][ci][1]));
            json_object_set_new(xj, "rows_ms", jnum(ms[fi][ci][0]));
            json_object_set_new(xj, "faster", isfinite(r.value) ? json_string(faster) : json_null());
            add_row(&r, xj);
        }
    }
}

/* ---- 4a. decode attention under token masks (h2o, snapkv) -------------------------------------------- */

typedef struct tok_ctx {
    attn_ctx a;
    hr_kv_cuda_tokens tok;
    int mode; /* 0: no masks (full, window), 1: masks (snapkv after its window), 2: masks and scores (h2o) */
} tok_ctx;

static hr_status tok_rep(void *p, int rep, hr_error *e) {
    tok_ctx *c = p;
    hr_kv_cuda_tokens t = c->tok;
    if (c->mode < 2) t.scores = 0;
    return hr_kv_storage_cuda_attend_runs(c->a.st, 0, c->a.q, c->a.tables, c->a.nbq, 0, c->a.n_ctx, 0, 0, c->a.nq,
                                          c->a.ctx, c->a.H, c->a.scale, 0.0f, NULL, 0, 0, c->mode ? &t : NULL, c->a.out,
                                          c->a.scratch, e);
}

/* What a token-level policy costs decode attention (f16 KV, the default split kernel, the target
 * context): the same queries without masks, with every token's mask bit set (the kernels read each
 * bit; the output must equal the unmasked one bit for bit), and with the scores accumulated as h2o
 * does (hr_k_attn_score after the reduce: its q.K pass and the atomic adds; every head's weights must
 * sum to 1, so each (query, KV head) row of scores to G x 2^32 within 1e-4). Rows: each mode's time,
 * and its time over the unmasked one. */
static void bench_attn_tokens(void) {
    const attn_shape_t as = O.quick ? (attn_shape_t){8, 2, 64, 16, 3} : (attn_shape_t){32, 8, 128, 16, 16};
    const int ctx = O.quick ? 300 : 8192, H = as.H, Hkv = as.Hkv, D = as.D, B = as.B, nq = as.nq;
    const int nbq = (ctx + B - 1) / B, MW = (B + 63) / 64, G = H / Hkv;
    static const char *const modes[] = {"f16 KV no masks", "f16 KV masks", "f16 KV masks+scores"};
    row r[3];
    for (int m = 0; m < 3; m++) {
        r[m] = new_row("attention", modes[m]);
        snprintf(r[m].shape, sizeof r[m].shape, "ctx %d, %d queries, H %d/%d, D %d, B %d, split kernel", ctx, nq, H,
                 Hkv, D, B);
        snprintf(r[m].unit, sizeof r[m].unit, "ms");
    }
    hr_error e = {0};
    hr_kv_storage_params p = {
        .n_layers = 1, .n_kv_heads = Hkv, .head_dim = D, .block_size = B, .n_blocks = nq * nbq, .isa = "scalar"};
    kv_fmt_init(&p.k, HR_KV_F16, KV_K, B, D, &e);
    kv_fmt_init(&p.v, HR_KV_F16, KV_V, B, D, &e);
    tok_ctx c = {.a = {.nq = nq, .nbq = nbq, .ctx = ctx, .H = H, .copies = 1, .scale = 1.0f / sqrtf((float)D)}};
    const size_t qf = (size_t)nq * H * D, n_mask = (size_t)nq * nbq * Hkv * MW, n_sc = (size_t)nq * nbq * Hkv * B;
    float *q = malloc(sizeof(float) * qf), *o0 = malloc(sizeof(float) * qf), *o1 = malloc(sizeof(float) * qf);
    float *kv = malloc(sizeof(float) * 2 * Hkv * D);
    int32_t *tables = malloc(sizeof(int32_t) * (size_t)nq * nbq), ctxs[64], view[128];
    uint64_t *masks = malloc(sizeof(uint64_t) * n_mask), *sc = malloc(sizeof(uint64_t) * n_sc);
    if (!q || !o0 || !o1 || !kv || !tables || !masks || !sc || nq > 64) {
        fprintf(stderr, "gpu_bench: out of memory\n");
        exit(1);
    }
    bool ok = hr_kv_storage_cuda_create(dev, &p, &c.a.st, &e) == HR_OK;
    /* Pb blocks written (the host write: the device encoder), then copied over the rest */
    const int Pb = p.n_blocks < 32 ? p.n_blocks : 32;
    const size_t block_bytes = (size_t)Hkv * (p.k.head_bytes + p.v.head_bytes);
    for (int b = 0; ok && b < Pb; b++)
        for (int t = 0; t < B; t++) {
            fill(kv, (size_t)2 * Hkv * D, 1.0f);
            c.a.st->ops->write(c.a.st, 0, b, t, -1, kv, kv + (size_t)Hkv * D);
        }
    if (ok && replicate(hr_kv_storage_cuda_arena(c.a.st), block_bytes * Pb, block_bytes * p.n_blocks, &e)) ok = false;
    for (int i = 0; i < nq * nbq; i++) tables[i] = i;
    for (int i = 0; i < nq; i++) ctxs[i] = ctx, view[2 * i] = i, view[2 * i + 1] = 1;
    for (size_t i = 0; i < n_mask; i++) masks[i] = B >= 64 ? ~0ull : (1ull << B) - 1;
    memset(sc, 0, sizeof(uint64_t) * n_sc);
    fill(q, qf, 1.0f);
    if (ok && (hr_kv_storage_cuda_check(c.a.st, &e) || hr_cuda_alloc(dev, sizeof(float) * qf, &c.a.q, &e) ||
               hr_cuda_alloc(dev, sizeof(float) * qf, &c.a.out, &e) ||
               hr_cuda_alloc(dev, sizeof(int32_t) * (size_t)nq * nbq, &c.a.tables, &e) ||
               hr_cuda_alloc(dev, sizeof(int32_t) * nq, &c.a.n_ctx, &e) ||
               hr_cuda_alloc(dev, hr_kv_storage_cuda_attend_scratch(c.a.st, nq, H, ctx), &c.a.scratch, &e) ||
               hr_cuda_alloc(dev, sizeof(int32_t) * 2 * nq, &c.tok.view, &e) ||
               hr_cuda_alloc(dev, sizeof(uint64_t) * n_mask, &c.tok.masks, &e) ||
               hr_cuda_alloc(dev, sizeof(uint64_t) * n_sc, &c.tok.scores, &e) ||
               hr_cuda_upload(dev, c.a.q, q, sizeof(float) * qf, &e) ||
               hr_cuda_upload(dev, c.a.tables, tables, sizeof(int32_t) * (size_t)nq * nbq, &e) ||
               hr_cuda_upload(dev, c.a.n_ctx, ctxs, sizeof(int32_t) * nq, &e) ||
               hr_cuda_upload(dev, c.tok.view, view, sizeof(int32_t) * 2 * nq, &e) ||
               hr_cuda_upload(dev, c.tok.masks, masks, sizeof(uint64_t) * n_mask, &e)))
        ok = false;
    if (!ok)
        for (int m = 0; m < 3; m++) dev_fail(&r[m], "setup", &e);
    double ms[3] = {NAN, NAN, NAN};
    for (int m = 0; ok && m < 3; m++) {
        /* the check: one rep (scores zeroed first) */
        c.mode = m;
        if (hr_cuda_upload(dev, c.tok.scores, sc, sizeof(uint64_t) * n_sc, &e) || tok_rep(&c, 0, &e) ||
            hr_cuda_download(dev, m ? o1 : o0, c.a.out, sizeof(float) * qf, &e) ||
            (m == 2 && hr_cuda_download(dev, sc, c.tok.scores, sizeof(uint64_t) * n_sc, &e))) {
            dev_fail(&r[m], "run", &e);
            continue;
        }
        bool mok = true;
        int differ = 0; /* outputs not bit for bit the unmasked ones */
        for (size_t i = 0; m > 0 && i < qf; i++) differ += memcmp(&o0[i], &o1[i], sizeof(float)) != 0;
        if (m == 1) mok = verdict(&r[m], differ == 0, "outputs differing", differ);
        if (m == 2) {
            double worst = 0;
            for (int i = 0; i < nq; i++)
                for (int kh = 0; kh < Hkv; kh++) {
                    double sum = 0;
                    for (int j = 0; j < nbq; j++)
                        for (int t = 0; t < B; t++) sum += (double)sc[(((size_t)i * nbq + j) * Hkv + kh) * B + t];
                    worst = fmax(worst, fabs(sum / (G * 4294967296.0) - 1.0));
                }
            memset(sc, 0, sizeof(uint64_t) * n_sc);
            mok = verdict(&r[m], worst < 1e-4 && differ == 0, "weights' sum err", differ ? INFINITY : worst);
        }
        if (m == 0) snprintf(r[m].check, sizeof r[m].check, "(the reference)");
        timing t;
        if (mok && (time_reps(tok_rep, &c, 400.0, &t, &e) || hr_kv_storage_cuda_check(c.a.st, &e)))
            dev_fail(&r[m], "timing", &e);
        else if (mok) {
            set_timing(&r[m], &t);
            ms[m] = r[m].value = t.median_ms;
        }
    }
    for (int m = 0; m < 3; m++) {
        json_t *xj = json_object();
        json_object_set_new(xj, "kv_format", json_string("f16"));
        json_object_set_new(xj, "ctx", json_integer(ctx));
        json_object_set_new(xj, "queries", json_integer(nq));
        json_object_set_new(xj, "token_masks", json_boolean(m >= 1));
        json_object_set_new(xj, "scores", json_boolean(m == 2));
        add_row(&r[m], xj);
    }
    for (int m = 1; m < 3; m++) {
        char what[40];
        snprintf(what, sizeof what, "%s / none", m == 1 ? "masks" : "masks+scores");
        row x = new_row("attention", what);
        snprintf(x.shape, sizeof x.shape, "ctx %d, %d queries: time under the policy over the unmasked time", ctx, nq);
        snprintf(x.unit, sizeof x.unit, "x");
        x.value = ms[m] / ms[0];
        if (!isfinite(x.value)) snprintf(x.check, sizeof x.check, "skipped: a mode not measured");
        add_row(&x, NULL);
    }
    if (c.a.st) c.a.st->ops->destroy(c.a.st);
    uint64_t bufs[] = {c.a.q, c.a.out, c.a.tables, c.a.n_ctx, c.a.scratch, c.tok.view, c.tok.masks, c.tok.scores};
    for (size_t i = 0; i < HR_ARRAY_LEN(bufs); i++) hr_cuda_free(dev, bufs[i]);
    free(q), free(o0), free(o1), free(kv), free(tables), free(masks), free(sc);
}

/* ---- 4b. prefill attention: the split kernels against the tensor cores -------------------------------- */

typedef struct pfa_ctx {
    hr_kv_storage *st;
    uint64_t q, table, qrow, n_ctx, runs, out, scratch;
    const int32_t *h_runs;
    int n, n_runs, max_ctx, H;
    float scale;
} pfa_ctx;

static hr_status pfa_rep(void *p, int rep, hr_error *e) {
    pfa_ctx *c = p;
    return hr_kv_storage_cuda_attend_runs(c->st, 0, c->q, c->table, (c->max_ctx + 15) / 16, c->qrow, c->n_ctx, 0, 0,
                                          c->n, c->max_ctx, c->H, c->scale, 0.0f, c->h_runs, c->runs, c->n_runs, NULL,
                                          c->out, c->scratch, e);
}

/* One chunk of n rows of one sequence at positions ctx0 .. ctx0 + n - 1 (f16 KV, B 16), through
 * hr_kv_storage_cuda_attend_runs with the storage's prefill attention "split" then "mma" (the runs
 * the forward pass finds: hr_cuda_attn_runs), each checked against the CPU storage's attention on
 * three rows, then timed: FLOP = 4 H D (visible positions, summed over rows) (Q K^T and P V). The
 * check's bound (tests/gpu/test_cuda_kernels.c's derivation, Q now not on f16's grid): Q's f16
 * rounding moves a score by at most eps = scale 2^-11 |q|_1 kmax (kmax 1.5, K exact in f16), the
 * output by (e^(2 eps) - 1) max|v|; P's rounding and the CPU's f16 weights add 2^-10 max|v|. */
static void bench_prefill_attn_one(const attn_shape_t *as, int n, int ctx0, double *ms) {
    const int H = as->H, Hkv = as->Hkv, D = as->D, B = 16, max_ctx = ctx0 + n, nb = (max_ctx + B - 1) / B;
    static const char *const kernels[] = {"split", "mma"};
    hr_error e = {0};
    row r[2];
    for (int k = 0; k < 2; k++) {
        char what[40];
        snprintf(what, sizeof what, "prefill f16 %s", kernels[k]);
        r[k] = new_row("attention", what);
        snprintf(r[k].shape, sizeof r[k].shape, "%d rows at %d..%d, H %d/%d, D %d, B %d", n, ctx0, max_ctx - 1, H, Hkv,
                 D, B);
        snprintf(r[k].unit, sizeof r[k].unit, "TFLOP/s");
        ms[k] = NAN;
    }
    double flop = 0;
    for (int i = 0; i < n; i++) flop += 4.0 * H * D * (double)(ctx0 + i + 1);
    hr_kv_storage_params p = {
        .n_layers = 1, .n_kv_heads = Hkv, .head_dim = D, .block_size = B, .n_blocks = nb, .isa = "scalar"};
    kv_fmt_init(&p.k, HR_KV_F16, KV_K, B, D, &e);
    kv_fmt_init(&p.v, HR_KV_F16, KV_V, B, D, &e);
    hr_kv_storage_params pc = p;
    const int Pb = nb < 32 ? nb : 32; /* pattern blocks, block b holding pattern b % Pb */
    pc.n_blocks = Pb;
    const size_t qf = (size_t)n * H * D, bb = (size_t)Hkv * (p.k.head_bytes + p.v.head_bytes);
    float *kv = malloc(sizeof(float) * 2 * Hkv * D), *q = malloc(sizeof(float) * qf), *o = malloc(sizeof(float) * qf);
    float *o_cpu = malloc(sizeof(float) * (size_t)H * D), *scr = malloc(sizeof(float) * ((size_t)max_ctx + B) * 16);
    int32_t *tab = malloc(sizeof(int32_t) * nb), *t_cpu = malloc(sizeof(int32_t) * nb);
    int32_t *qrow = calloc((size_t)n, sizeof(int32_t)), *pos = malloc(sizeof(int32_t) * n),
            *nctx = malloc(sizeof(int32_t) * n), *runs = malloc(sizeof(int32_t) * 4 * n);
    unsigned char *pat = malloc(bb * Pb);
    if (!kv || !q || !o || !o_cpu || !scr || !tab || !t_cpu || !qrow || !pos || !nctx || !runs || !pat) {
        fprintf(stderr, "gpu_bench: out of memory\n");
        exit(1);
    }
    hr_kv_storage *st = NULL, *cpu = NULL;
    pfa_ctx c = {.n = n, .max_ctx = max_ctx, .H = H, .scale = 1.0f / sqrtf((float)D), .h_runs = runs};
    bool ok = hr_kv_storage_cuda_create(dev, &p, &st, &e) == HR_OK && hr_kv_storage_cpu_create(&pc, &cpu, &e) == HR_OK;
    for (int b = 0; ok && b < Pb; b++) {
        for (int t = 0; t < B; t++) {
            fill(kv, (size_t)Hkv * D, 1.5f);
            fill(kv + (size_t)Hkv * D, (size_t)Hkv * D, 1.0f);
            cpu->ops->write(cpu, 0, b, t, -1, kv, kv + (size_t)Hkv * D);
        }
        cpu->ops->read_block(cpu, b, pat + bb * b);
    }
    for (int j = 0; j < nb; j++) tab[j] = nb - 1 - j; /* the blocks backwards: the table is read */
    for (int i = 0; i < n; i++) pos[i] = ctx0 + i, nctx[i] = ctx0 + i + 1;
    c.n_runs = hr_cuda_attn_runs(qrow, pos, n, hr_cuda_prefill_tile_rows(H, Hkv), runs);
    fill(q, qf, 1.0f);
    c.st = st;
    const uint64_t arena = ok ? hr_kv_storage_cuda_arena(st) : 0;
    if (ok && (hr_cuda_upload(dev, arena, pat, bb * Pb, &e) || replicate(arena, bb * Pb, bb * nb, &e) ||
               hr_cuda_alloc(dev, sizeof(float) * qf, &c.q, &e) || hr_cuda_alloc(dev, sizeof(float) * qf, &c.out, &e) ||
               hr_cuda_alloc(dev, sizeof(int32_t) * nb, &c.table, &e) ||
               hr_cuda_alloc(dev, sizeof(int32_t) * n, &c.qrow, &e) ||
               hr_cuda_alloc(dev, sizeof(int32_t) * n, &c.n_ctx, &e) ||
               hr_cuda_alloc(dev, sizeof(int32_t) * 4 * n, &c.runs, &e) ||
               hr_cuda_alloc(dev, hr_kv_storage_cuda_attend_scratch(st, n, H, max_ctx), &c.scratch, &e) ||
               hr_cuda_upload(dev, c.q, q, sizeof(float) * qf, &e) ||
               hr_cuda_upload(dev, c.table, tab, sizeof(int32_t) * nb, &e) ||
               hr_cuda_upload(dev, c.qrow, qrow, sizeof(int32_t) * n, &e) ||
               hr_cuda_upload(dev, c.n_ctx, nctx, sizeof(int32_t) * n, &e) ||
               hr_cuda_upload(dev, c.runs, runs, sizeof(int32_t) * 4 * n, &e)))
        ok = false;
    for (int k = 0; k < 2; k++) {
        if (!ok) {
            dev_fail(&r[k], "setup", &e);
            continue;
        }
        bool kok = true;
        memset(o, 0xff, sizeof(float) * qf);
        if (hr_kv_storage_cuda_set_prefill_attn(st, kernels[k], &e) ||
            hr_cuda_upload(dev, c.out, o, sizeof(float) * qf, &e) || pfa_rep(&c, 0, &e) ||
            hr_cuda_download(dev, o, c.out, sizeof(float) * qf, &e))
            kok = dev_fail(&r[k], "run", &e);
        double worst = 0; /* |err| / bound over three rows' heads */
        for (int ri = 0; kok && ri < 3; ri++) {
            const int i = ri == 0 ? 0 : ri == 1 ? n / 2 : n - 1;
            for (int j = 0; j < nb; j++) t_cpu[j] = tab[j] % Pb;
            hr_kv_attn_query qc = {
                .table = t_cpu, .n_ctx = nctx[i], .tail_stage = -1, .q = q + (size_t)i * H * D, .out = o_cpu};
            hr_kv_attn_args a = {.n_heads = H, .scale = c.scale};
            cpu->ops->attend(cpu, 0, &qc, 1, &a, scr);
            for (int h = 0; h < H; h++) {
                double q1 = 0;
                for (int d = 0; d < D; d++) q1 += fabs(q[((size_t)i * H + h) * D + d]);
                const double bound = expm1(2.0 * c.scale * 0x1p-11 * q1 * 1.5) + 0x1p-10 + 5e-5;
                for (int d = 0; d < D; d++) {
                    const double err = fabs((double)o[((size_t)i * H + h) * D + d] - o_cpu[h * D + d]) / bound;
                    worst = err != err ? INFINITY : fmax(worst, err);
                }
            }
        }
        if (kok) kok = verdict(&r[k], worst <= 1.0, "err/bound", worst);
        timing t;
        if (kok && time_reps(pfa_rep, &c, 400.0, &t, &e))
            dev_fail(&r[k], "timing", &e);
        else if (kok) {
            set_timing(&r[k], &t);
            ms[k] = t.median_ms;
            r[k].value = flop / (t.median_ms * 1e-3) / 1e12;
        }
    }
    for (int k = 0; k < 2; k++) {
        json_t *xj = json_object();
        json_object_set_new(xj, "prefill_attn", json_string(kernels[k]));
        json_object_set_new(xj, "rows", json_integer(n));
        json_object_set_new(xj, "ctx_before", json_integer(ctx0));
        json_object_set_new(xj, "n_heads", json_integer(H));
        json_object_set_new(xj, "n_kv_heads", json_integer(Hkv));
        json_object_set_new(xj, "head_dim", json_integer(D));
        json_object_set_new(xj, "flop_per_call", json_real(flop));
        add_row(&r[k], xj);
    }
    if (cpu) cpu->ops->destroy(cpu);
    if (st) st->ops->destroy(st);
    uint64_t bufs[] = {c.q, c.out, c.table, c.qrow, c.n_ctx, c.runs, c.scratch};
    for (size_t i = 0; i < HR_ARRAY_LEN(bufs); i++) hr_cuda_free(dev, bufs[i]);
    free(kv), free(q), free(o), free(o_cpu), free(scr), free(tab), free(t_cpu), free(qrow), free(pos), free(nctx);
    free(runs), free(pat);
}

/* a 512-token chunk at Llama-3-8B's attention shape, at the start and after 8K positions (--quick: 24
 * rows at D 64, after 0 and 40), split then mma, and split's time over mma's (> 1: mma faster) */
static void bench_prefill_attn(void) {
    const attn_shape_t as = O.quick ? (attn_shape_t){8, 2, 64, 16, 0} : (attn_shape_t){32, 8, 128, 16, 0};
    const int n = O.quick ? 24 : 512, ctx0s[2] = {0, O.quick ? 40 : 8192};
    for (int ci = 0; ci < 2; ci++) {
        double ms[2] = {NAN, NAN};
        if (out_of_time()) {
            skip_row("attention", "prefill f16", "-", "time budget (--max-seconds)");
            continue;
        }
        bench_prefill_attn_one(&as, n, ctx0s[ci], ms);
        row r = new_row("attention", "prefill split/mma");
        r.value = ms[0] / ms[1];
        const char *faster = !isfinite(r.value) ? "-" : r.value > 1.0 ? "mma" : "split";
        snprintf(r.shape, sizeof r.shape, "%d rows after %d (split time / mma time): %s faster", n, ctx0s[ci], faster);
        snprintf(r.unit, sizeof r.unit, "x");
        if (!isfinite(r.value)) snprintf(r.check, sizeof r.check, "skipped: a kernel not measured");
        json_t *xj = json_object();
        json_object_set_new(xj, "ctx_before", json_integer(ctx0s[ci]));
        json_object_set_new(xj, "split_ms", jnum(ms[0]));
        json_object_set_new(xj, "mma_ms", jnum(ms[1]));
        json_object_set_new(xj, "faster", isfinite(r.value) ? json_string(faster) : json_null());
        add_row(&r, xj);
    }
}

/* ---- 5. end to end through the runtime ----------------------------------------------------------------- */

/* bytes one decode step streams: every layer's matrices and norms and the output matrix (the token
 * embedding is a lookup of the batch's rows, not counted) */
static uint64_t streamed_bytes(const hr_rt_shape *s, hr_dtype t, int n_layer) {
    uint64_t E = (uint64_t)s->n_embd, F = (uint64_t)s->n_ff, hd = (uint64_t)s->head_dim;
    uint64_t qd = (uint64_t)s->n_head * hd, kvd = (uint64_t)s->n_head_kv * hd;
    uint64_t re = hr_dtype_row_bytes(t, (int64_t)E), rf = hr_dtype_row_bytes(t, (int64_t)F),
             rq = hr_dtype_row_bytes(t, (int64_t)qd);
    uint64_t layer = qd * re + 2 * kvd * re + E * rq + 2 * F * re + E * rf + 2 * E * 4;
    return (uint64_t)n_layer * layer + (uint64_t)s->n_vocab * re + E * 4;
}

static void e2e_stats(hr_runtime *rt, hr_rt_engine_stats *s) {
    hr_runtime_pool pool;
    hr_runtime_get_pool(rt, &pool);
    *s = pool.engine;
}

/* one engine step, its wall-clock ms and the engine's counters before and after it */
static hr_status timed_step(hr_runtime *rt, int *left, double *ms, hr_rt_engine_stats *s0, hr_rt_engine_stats *s1,
                            hr_error *e) {
    e2e_stats(rt, s0);
    double t0 = hr_time_now();
    hr_status st = hr_runtime_step(rt, left, e);
    *ms = (hr_time_now() - t0) * 1e3;
    e2e_stats(rt, s1);
    return st;
}

/* a greedy request of `prompt` random ids (ids: room for them) */
static hr_status submit_random(hr_runtime *rt, int n_vocab, int32_t *ids, int prompt, int max_tokens,
                               hr_rt_request **req, hr_error *e) {
    for (int k = 0; k < prompt; k++) ids[k] = (int32_t)((frand() + 1.0f) * 0.5f * (float)(n_vocab - 1));
    hr_rt_request_params q = {.prompt_ids = ids, .n_prompt_ids = prompt, .max_tokens = max_tokens, .ignore_eos = true};
    q.sampling = hr_rt_sampling_default();
    q.sampling.temperature = 0;
    return hr_runtime_submit(rt, &q, req, e);
}

/* B requests of `prompt` random ids each, stepped until every one is decoding; then `steps` timed steps
 * that each decode exactly B tokens (warm-up steps first). Median wall-clock ms per step, or NAN. */
static double e2e_decode(hr_runtime *rt, int n_vocab, int B, int prompt, int warm, int steps, row *r) {
    hr_error e = {0};
    hr_rt_request **req = calloc((size_t)B, sizeof *req);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)prompt);
    double *v = malloc(sizeof(double) * (size_t)steps);
    if (!req || !ids || !v) {
        fprintf(stderr, "gpu_bench: out of memory\n");
        exit(1);
    }
    bool ok = true;
    for (int i = 0; i < B && ok; i++)
        if (submit_random(rt, n_vocab, ids, prompt, warm + steps + 8, &req[i], &e)) ok = dev_fail(r, "submit", &e);
    int n_timed = 0, n_warm = 0, guard = 0;
    while (ok && n_timed < steps && guard++ < 10000) {
        hr_rt_engine_stats s0, s1;
        int left = 0;
        double ms;
        if (timed_step(rt, &left, &ms, &s0, &s1, &e)) {
            ok = dev_fail(r, "step", &e);
            break;
        }
        if (s1.failed != s0.failed) {
            e.code = HR_ERR_UNSUPPORTED;
            snprintf(e.msg, sizeof e.msg, "a request failed");
            ok = dev_fail(r, "step", &e);
            break;
        }
        bool pure = s1.batch_tokens - s0.batch_tokens == (uint64_t)B && s1.prefill_tokens == s0.prefill_tokens;
        if (!pure) continue;
        if (n_warm < warm)
            n_warm++;
        else
            v[n_timed++] = ms;
        if (left == 0) break;
    }
    double med = NAN;
    if (ok && n_timed < steps) {
        e.code = HR_ERR_UNSUPPORTED;
        snprintf(e.msg, sizeof e.msg, "only %d decode steps of %d tokens", n_timed, B);
        dev_fail(r, "steps", &e);
    } else if (ok) {
        /* the check: every request still running or finished without failing, each with its ids */
        int bad = 0;
        for (int i = 0; i < B; i++) {
            hr_rt_result res;
            hr_rt_request_result(req[i], &res);
            if (res.status != HR_OK || res.n_ids < warm + steps) bad++;
        }
        if (verdict(r, bad == 0, "requests short or failed:", (double)bad)) {
            snprintf(r->check, sizeof r->check, "ok (%d requests, %d+ ids each)", B, warm + steps);
            med = median(v, n_timed);
            r->median_ms = med;
            r->loops = n_timed;
            r->reps = 1;
        }
    }
    for (int i = 0; i < B; i++)
        if (req[i]) hr_rt_request_release(rt, req[i]); /* cancels what is unfinished */
    free(req), free(ids), free(v);
    return med;
}

/* one request of `prompt` random ids, max_tokens 1: the wall-clock time of the step that computes its
 * whole prompt (max_batch_tokens >= prompt), median over reps; NAN if none */
static double e2e_prefill(hr_runtime *rt, int n_vocab, int prompt, int reps, row *r) {
    hr_error e = {0};
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)prompt);
    double v[8];
    int n = 0;
    bool ok = ids != NULL;
    for (int k = 0; k < reps && ok; k++) {
        hr_rt_request *req = NULL;
        if (submit_random(rt, n_vocab, ids, prompt, 1, &req, &e)) {
            ok = dev_fail(r, "submit", &e);
            break;
        }
        int left = 1, guard = 0;
        while (left > 0 && guard++ < 100) {
            hr_rt_engine_stats s0, s1;
            double ms;
            if (timed_step(rt, &left, &ms, &s0, &s1, &e)) {
                ok = dev_fail(r, "step", &e);
                break;
            }
            if (s1.prefill_tokens - s0.prefill_tokens == (uint64_t)prompt && n < 8) v[n++] = ms;
        }
        hr_rt_result res;
        hr_rt_request_result(req, &res);
        if (ok && (res.status != HR_OK || res.n_ids != 1)) {
            e.code = HR_ERR_UNSUPPORTED;
            snprintf(e.msg, sizeof e.msg, "the request ended with %d ids: %s", res.n_ids, res.error ? res.error : "?");
            ok = dev_fail(r, "prefill", &e);
        }
        hr_rt_request_release(rt, req);
    }
    free(ids);
    if (!ok) return NAN;
    if (!verdict(r, n == reps, "one-step prefills missing:", (double)(reps - n))) return NAN;
    snprintf(r->check, sizeof r->check, "ok (%d one-step prefills)", n);
    r->loops = n;
    r->reps = 1;
    return r->median_ms = median(v, n);
}

/* one decode row: batch B, launch by launch or (graphs) replayed as CUDA graphs; *ms its median step */
static void e2e_decode_row(hr_runtime *rt, const hr_runtime_info *info, int B, int prompt, int warm, int steps,
                           const char *desc, uint64_t bytes, uint64_t bytes_full, int layers, bool graphs,
                           double *ms_out) {
    char what[40];
    snprintf(what, sizeof what, "%s batch %d", graphs ? "graphs" : "decode", B);
    row r = new_row("e2e", what);
    snprintf(r.shape, sizeof r.shape, "%s, prompt %d%s", desc, prompt, graphs ? ", CUDA graphs" : "");
    snprintf(r.unit, sizeof r.unit, "tokens/s");
    json_t *xj = json_object();
    json_object_set_new(xj, "batch", json_integer(B));
    json_object_set_new(xj, "graphs", json_boolean(graphs));
    if (out_of_time())
        snprintf(r.check, sizeof r.check, "skipped: time budget (--max-seconds)");
    else {
        double ms = e2e_decode(rt, info->n_vocab, B, prompt, warm, steps, &r);
        *ms_out = ms;
        if (isfinite(ms)) {
            r.value = B / (ms * 1e-3);
            double gbs = (double)bytes / (ms * 1e-3) / 1e9;
            json_object_set_new(xj, "weight_gb_per_s", json_real(gbs));
            json_object_set_new(xj, "pct_weight_bw_of_copy", jnum(pct(gbs, copy_gbs)));
            if (layers != 32 && !O.quick) /* the whole model's step, if time scales with the bytes */
                json_object_set_new(xj, "projected_tokens_per_s_32_layers",
                                    json_real(B / (ms * 1e-3 * (double)bytes_full / (double)bytes)));
            if (B == 1) { /* the figure: weight bytes / batch-1 step time */
                r.pct_copy = pct(gbs, copy_gbs);
                snprintf(r.target, sizeof r.target, "weights >= %.0f%% of copy", E2E_TARGET_PCT);
                r.pct_target = pct(r.pct_copy, E2E_TARGET_PCT);
            }
        }
    }
    add_row(&r, xj);
}

static void bench_e2e(void) {
    const char *shape = O.quick ? "tiny" : "llama-3-8b";
    /* synthesis on the host dominates: about 3 s a layer there, by this machine's 12 ns a weight, and
     * 40 s for the rest (embedding, output, the runs); fewer layers than asked when the time left is short */
    int layers = O.quick ? 1 : O.e2e_layers;
    if (!O.quick) {
        int fit = (int)((deadline - hr_time_now() - 40.0) / 4.0);
        if (fit < layers) {
            printf("  (e2e: %d layers instead of %d: the time left (--max-seconds) holds no more)\n", fit, layers);
            layers = fit;
        }
    }
    static const int batches_full[] = {1, 16, 64}, batches_quick[] = {1, 4};
    const int *batches = O.quick ? batches_quick : batches_full;
    const int n_b = O.quick ? 2 : 3, prompt = O.quick ? 8 : 16, warm = O.quick ? 1 : 3, steps = O.quick ? 3 : 12;
    const int pre_prompt = O.quick ? 32 : 512, pre_reps = O.quick ? 2 : 3;
    char desc[80];
    snprintf(desc, sizeof desc, "%s bf16, %d of its layers, f16 KV", shape, layers);
    if (layers < 1) {
        skip_row("e2e", "decode", desc, "time budget (--max-seconds)");
        return;
    }
    hr_rt_synth sy = {.shape = shape, .weight_type = "bf16", .n_layer = layers, .seed = 7};
    hr_runtime_params p = hr_runtime_default_params();
    p.synth = &sy;
    p.device = "cuda";
    p.cuda_driver = O.driver;
    p.raw_ids = true;
    p.n_ctx = O.quick ? 128 : 1024;
    p.kv_seqs = batches[n_b - 1];
    p.max_running = batches[n_b - 1];
    p.max_batch_tokens = pre_prompt;
    p.k_format = p.v_format = HR_RT_KV_F16;
    hr_runtime *rt = NULL;
    hr_error e = {0};
    double t0 = hr_time_now();
    printf("  (e2e: synthesizing %s in memory and opening it on the GPU...)\n", desc);
    fflush(stdout);
    hr_status st = hr_runtime_open(&p, &rt, NULL, &e);
    double open_s = hr_time_now() - t0;
    json_t *e2e = json_object();
    json_object_set_new(jroot, "e2e_model", e2e);
    json_object_set_new(e2e, "shape", json_string(shape));
    json_object_set_new(e2e, "weight_type", json_string("bf16"));
    json_object_set_new(e2e, "n_layer", json_integer(layers));
    json_object_set_new(e2e, "n_layer_asked", json_integer(O.quick ? 1 : O.e2e_layers));
    json_object_set_new(e2e, "kv_format", json_string("f16"));
    json_object_set_new(e2e, "open_seconds", json_real(open_s));
    json_object_set_new(e2e, "timing",
                        json_string("host wall clock per hr_runtime_step (forward, logits download, "
                                    "sampling), median over the steps"));
    if (st) {
        row r = new_row("e2e", "open");
        snprintf(r.shape, sizeof r.shape, "%s", desc);
        dev_fail(&r, "open", &e);
        add_row(&r, NULL);
        return;
    }
    hr_runtime_info info;
    hr_runtime_describe(rt, &info);
    const uint64_t bytes = streamed_bytes(&info.shape, HR_DTYPE_BF16, layers);
    const uint64_t bytes_full = streamed_bytes(&info.shape, HR_DTYPE_BF16, O.quick ? layers : 32);
    json_object_set_new(e2e, "weight_bytes", json_integer((json_int_t)info.weight_bytes));
    json_object_set_new(e2e, "streamed_bytes_per_step", json_integer((json_int_t)bytes));
    json_object_set_new(e2e, "streamed_bytes_per_step_32_layers", json_integer((json_int_t)bytes_full));
    printf("  (e2e: opened in %.1f s; %.2f GB of weights streamed per step)\n", open_s, bytes / 1e9);
    for (int bi = 0; bi < n_b; bi++) {
        const int B = batches[bi];
        double ms_eager = NAN, ms_graphs = NAN;
        e2e_decode_row(rt, &info, B, prompt, warm, steps, desc, bytes, bytes_full, layers, false, &ms_eager);
        if (!hr_cuda_backend_set_graphs(hr_runtime_ctx(rt), true)) {
            char what[40];
            snprintf(what, sizeof what, "graphs batch %d", B);
            skip_row("e2e", what, desc, "the driver has no CUDA graphs");
            continue;
        }
        e2e_decode_row(rt, &info, B, prompt, warm, steps, desc, bytes, bytes_full, layers, true, &ms_graphs);
        hr_cuda_backend_set_graphs(hr_runtime_ctx(rt), false);
        /* the two side by side: > 1, the graphs are faster */
        row r = new_row("e2e", "eager/graphs");
        r.value = ms_eager / ms_graphs;
        const char *faster = !isfinite(r.value) ? "-" : r.value > 1.0 ? "graphs" : "eager";
        snprintf(r.shape, sizeof r.shape, "decode batch %d (eager time / graphs time): %s faster", B, faster);
        snprintf(r.unit, sizeof r.unit, "x");
        if (!isfinite(r.value)) snprintf(r.check, sizeof r.check, "skipped: a run not measured");
        json_t *xj = json_object();
        json_object_set_new(xj, "batch", json_integer(B));
        json_object_set_new(xj, "eager_ms", jnum(ms_eager));
        json_object_set_new(xj, "graphs_ms", jnum(ms_graphs));
        json_object_set_new(xj, "faster", isfinite(r.value) ? json_string(faster) : json_null());
        add_row(&r, xj);
    }
    row r = new_row("e2e", "prefill");
    snprintf(r.shape, sizeof r.shape, "%s, one %d-token prompt a step", desc, pre_prompt);
    snprintf(r.unit, sizeof r.unit, "tokens/s");
    json_t *xj = json_object();
    json_object_set_new(xj, "prompt", json_integer(pre_prompt));
    if (out_of_time())
        snprintf(r.check, sizeof r.check, "skipped: time budget (--max-seconds)");
    else {
        double ms = e2e_prefill(rt, info.n_vocab, pre_prompt, pre_reps, &r);
        if (isfinite(ms)) {
            r.value = pre_prompt / (ms * 1e-3);
            double flop = 2.0 * (double)pre_prompt * (double)bytes / 2.0; /* bf16: 2 bytes a weight */
            json_object_set_new(xj, "matmul_tflop_per_s", json_real(flop / (ms * 1e-3) / 1e12));
            if (layers != 32 && !O.quick)
                json_object_set_new(xj, "projected_tokens_per_s_32_layers",
                                    json_real(pre_prompt / (ms * 1e-3 * (double)bytes_full / (double)bytes)));
        }
    }
    add_row(&r, xj);
    hr_runtime_close(rt);
}

/* ---- 6. capacity: concurrent sessions at one KV budget --------------------------------------------------- */

/* One format: the runtime on the GPU with a KV pool of `budget` bytes, reserve admission (a request is
 * admitted only when its prompt + max_tokens fit, and never preempted), n_req requests that each claim
 * ctx positions (16 prompt tokens, ctx - 16 to generate). After a few steps the engine runs as many as
 * the pool holds: peak_running, checked against floor(blocks / blocks a session claims). Returns the
 * sessions, or -1. */
static int capacity_one(hr_rt_kv_format f, const char *shape, int ctx, uint64_t budget, int n_req, row *r, json_t *xj) {
    hr_rt_synth sy = {.shape = shape, .weight_type = "bf16", .seed = 7};
    hr_runtime_params p = hr_runtime_default_params();
    p.synth = &sy;
    p.device = "cuda";
    p.cuda_driver = O.driver;
    p.raw_ids = true;
    p.n_ctx = ctx;
    p.kv_budget = budget;
    p.admission = HR_RT_ADMIT_RESERVE;
    p.max_running = n_req;
    p.block_size = 16;
    p.k_format = p.v_format = f;
    hr_runtime *rt = NULL;
    hr_error e = {0};
    if (hr_runtime_open(&p, &rt, NULL, &e)) {
        dev_fail(r, "open", &e);
        return -1;
    }
    hr_runtime_info info;
    hr_runtime_describe(rt, &info);
    hr_rt_request **req = calloc((size_t)n_req, sizeof *req);
    int32_t ids[16];
    bool ok = req != NULL;
    for (int i = 0; ok && i < n_req; i++)
        if (submit_random(rt, info.n_vocab, ids, 16, ctx - 16, &req[i], &e)) ok = dev_fail(r, "submit", &e);
    hr_runtime_pool pool = {0};
    /* admissions and the prompts' prefill take a few steps (512 tokens a step); then every admitted
     * request decodes */
    for (int k = 0; ok && k < 4 + n_req * 16 / 512; k++) {
        int left = 0;
        if (hr_runtime_step(rt, &left, &e)) ok = dev_fail(r, "step", &e);
    }
    int sessions = -1;
    if (ok) {
        hr_runtime_get_pool(rt, &pool);
        const int per = (ctx - 1 + p.block_size - 1) / p.block_size; /* prompt + max_tokens - 1 positions */
        const int want = pool.ledger.blocks_total / per < n_req ? pool.ledger.blocks_total / per : n_req;
        sessions = pool.engine.peak_running;
        char why[64];
        snprintf(why, sizeof why, "want %d = %d blocks / %d; running", want, pool.ledger.blocks_total, per);
        if (verdict(r, sessions == want && pool.engine.failed == 0 && want < n_req, why, (double)sessions))
            snprintf(r->check, sizeof r->check, "ok (%d blocks / %d a session, %d requests waiting)",
                     pool.ledger.blocks_total, per, pool.engine.n_waiting);
        else
            sessions = -1;
        json_object_set_new(xj, "blocks", json_integer(pool.ledger.blocks_total));
        json_object_set_new(xj, "pool_bytes", json_integer((json_int_t)pool.ledger.bytes_total));
        json_object_set_new(xj, "blocks_per_session", json_integer(per));
    }
    for (int i = 0; req && i < n_req; i++)
        if (req[i]) hr_rt_request_release(rt, req[i]); /* cancels them */
    free(req);
    hr_runtime_close(rt);
    return sessions;
}

static void bench_capacity(void) {
    static const hr_rt_kv_format fmts[] = {HR_RT_KV_F16, HR_RT_KV_Q8, HR_RT_KV_FP8, HR_RT_KV_Q4H, HR_RT_KV_Q4};
    static const char *const names[] = {"f16", "q8", "fp8", "q4h", "q4"};
    /* the 8B's KV geometry at 8K and a 16 GiB pool (about 16 f16 sessions); --quick: tiny's at 64 */
    const char *shape = O.quick ? "tiny" : "llama-3-8b-kv";
    const int ctx = O.quick ? 64 : 8192, n_req = O.quick ? 14 : 72;
    const uint64_t budget = O.quick ? (uint64_t)64 << 10 : (uint64_t)16 << 30;
    int sessions[HR_ARRAY_LEN(fmts)];
    for (size_t fi = 0; fi < HR_ARRAY_LEN(fmts); fi++) {
        char what[40];
        snprintf(what, sizeof what, "%s sessions", names[fi]);
        row r = new_row("capacity", what);
        snprintf(r.shape, sizeof r.shape, "%s, ctx %d, KV pool %.4g MiB, reserve admission", shape, ctx,
                 (double)budget / MIB);
        snprintf(r.unit, sizeof r.unit, "sessions");
        json_t *xj = json_object();
        json_object_set_new(xj, "kv_format", json_string(names[fi]));
        json_object_set_new(xj, "ctx", json_integer(ctx));
        json_object_set_new(xj, "kv_budget_bytes", json_integer((json_int_t)budget));
        sessions[fi] = -1;
        if (out_of_time())
            snprintf(r.check, sizeof r.check, "skipped: time budget (--max-seconds)");
        else
            sessions[fi] = capacity_one(fmts[fi], shape, ctx, budget, n_req, &r, xj);
        if (sessions[fi] >= 0) r.value = sessions[fi];
        add_row(&r, xj);
    }
    /* each format's sessions over f16's; the target is q8's */
    for (size_t fi = 1; fi < HR_ARRAY_LEN(fmts); fi++) {
        char what[40];
        snprintf(what, sizeof what, "%s / f16 sessions", names[fi]);
        row r = new_row("capacity", what);
        snprintf(r.shape, sizeof r.shape, "%s, ctx %d, one KV budget", shape, ctx);
        snprintf(r.unit, sizeof r.unit, "x");
        r.value = sessions[0] > 0 && sessions[fi] >= 0 ? (double)sessions[fi] / sessions[0] : NAN;
        if (fmts[fi] == HR_RT_KV_Q8) {
            snprintf(r.target, sizeof r.target, ">= %.1fx", CAPACITY_Q8_TARGET);
            r.pct_target = pct(r.value, CAPACITY_Q8_TARGET);
        }
        if (!isfinite(r.value)) snprintf(r.check, sizeof r.check, "skipped: a format not measured");
        json_t *xj = json_object();
        json_object_set_new(xj, "kv_format", json_string(names[fi]));
        add_row(&r, xj);
    }
}

/* ---- output --------------------------------------------------------------------------------------------- */

static const char *k_sections[] = {"copy", "gemv", "prefill", "attention", "e2e", "capacity"};
static const char *k_titles[] = {
    "1. Device-to-device copy (the reference bandwidth)",
    "2. GEMV, one token (weight bytes / time)",
    "3. Prefill matrix products, GEMV and tensor-core GEMM (2 rows cols T / time)",
    "4. Decode attention, device KV storage (K+V bytes of every query's context / time)",
    "5. End to end through the runtime (wall clock per engine step)",
    "6. Capacity: concurrent sessions at one KV budget (the engine on the GPU)",
};

static void md_escape(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '|') fputc('\\', f);
        fputc(*s, f);
    }
}

static bool write_md(const char *path, const char *device, const char *date) {
    FILE *f = fopen(path, "w");
    if (!f) return false;
    fprintf(f, "# GPU measurements (bench/gpu/gpu_bench%s)\n\n", O.quick ? " --quick: the emulator's tiny shapes" : "");
    fprintf(f, "- device: %s\n- driver: %s\n- date: %s\n- commit: %s\n", device,
            O.driver_version ? O.driver_version : "unknown", date, O.commit ? O.commit : "unknown");
    fprintf(f, "- copy bandwidth (the reference of every %% of copy): %.1f GB/s\n", copy_gbs);
    fprintf(f, "- kernels: GPU events around loops of R reps after a warm-up, median over the loops of loop/R "
               "(shown as median (loops x R)); end to end: wall clock per engine step, median over the steps\n");
    fprintf(f, "- checks: %d, failed: %d\n", n_checked, n_failed);
    for (size_t s = 0; s < HR_ARRAY_LEN(k_sections); s++) {
        fprintf(f, "\n## %s\n\n", k_titles[s]);
        fprintf(f, "| what | shape | value | median (loops x reps) | %% of copy | target | %% of target | check |\n");
        fprintf(f, "| --- | --- | ---: | ---: | ---: | --- | ---: | --- |\n");
        for (int i = 0; i < n_rows; i++) {
            const row *r = &g_rows[i];
            if (strcmp(r->section, k_sections[s])) continue;
            fputs("| ", f);
            md_escape(f, r->what);
            fputs(" | ", f);
            md_escape(f, r->shape);
            if (isfinite(r->value))
                fprintf(f, " | %.4g %s", r->value, r->unit);
            else
                fputs(" | -", f);
            if (isfinite(r->median_ms))
                fprintf(f, " | %.4g ms (%dx%d)", r->median_ms, r->loops, r->reps);
            else
                fputs(" | -", f);
            if (isfinite(r->pct_copy))
                fprintf(f, " | %.1f%%", r->pct_copy);
            else
                fputs(" | -", f);
            fputs(" | ", f);
            md_escape(f, r->target[0] ? r->target : "-");
            if (isfinite(r->pct_target))
                fprintf(f, " | %.1f%%", r->pct_target);
            else
                fputs(" | -", f);
            fputs(" | ", f);
            md_escape(f, r->check);
            fputs(" |\n", f);
        }
    }
    return fclose(f) == 0;
}

/* --validate: the JSON as written, read back: every top-level key, every row's keys, sections present,
 * no failed check; the markdown (when given) has every section's title */
static int validate(const char *json_path, const char *md_path) {
    json_error_t je;
    json_t *root = json_load_file(json_path, 0, &je);
    int bad = 0;
    if (!root) {
        printf("validate: %s does not parse: %s (line %d)\n", json_path, je.text, je.line);
        return 1;
    }
    static const char *top[] = {"schema", "device",  "driver_version", "date",    "commit",
                                "quick",  "timing",  "checks",         "targets", "copy",
                                "gemv",   "prefill", "attention",      "e2e",     "capacity"};
    static const char *keys[] = {"what",          "shape",          "value",  "unit",          "median_ms", "loops",
                                 "reps_per_loop", "pct_of_copy_bw", "target", "pct_of_target", "check"};
    for (size_t i = 0; i < HR_ARRAY_LEN(top); i++)
        if (!json_object_get(root, top[i])) {
            printf("validate: no key '%s'\n", top[i]);
            bad++;
        }
    const bool quick = json_is_true(json_object_get(root, "quick"));
    const char *schema = json_string_value(json_object_get(root, "schema"));
    if (!schema || strcmp(schema, SCHEMA)) {
        printf("validate: schema is not %s\n", SCHEMA);
        bad++;
    }
    for (size_t s = 0; s < HR_ARRAY_LEN(k_sections); s++) {
        json_t *arr = json_object_get(root, k_sections[s]);
        if (!json_is_array(arr) || json_array_size(arr) == 0) {
            printf("validate: section '%s' is not a non-empty array\n", k_sections[s]);
            bad++;
            continue;
        }
        size_t i;
        json_t *o;
        int measured = 0;
        json_array_foreach(arr, i, o) {
            for (size_t k = 0; k < HR_ARRAY_LEN(keys); k++)
                if (!json_object_get(o, keys[k])) {
                    printf("validate: %s[%zu] has no '%s'\n", k_sections[s], i, keys[k]);
                    bad++;
                }
            const char *chk = json_string_value(json_object_get(o, "check"));
            if (!chk || !strncmp(chk, "FAIL", 4)) {
                printf("validate: %s[%zu] check: %s\n", k_sections[s], i, chk ? chk : "(none)");
                bad++;
            }
            json_t *v = json_object_get(o, "value");
            bool has = json_is_number(v) && isfinite(json_number_value(v)) && json_number_value(v) > 0;
            measured += has;
            if (!has && (!chk || strncmp(chk, "skipped", 7))) {
                printf("validate: %s[%zu] has neither a value nor a reason it was skipped\n", k_sections[s], i);
                bad++;
            }
        }
        if (!measured && quick) { /* a full run may skip (time budget, refused formats) */
            printf("validate: section '%s' has no measured value\n", k_sections[s]);
            bad++;
        }
    }
    json_t *checks = json_object_get(root, "checks");
    json_t *nf = json_object_get(checks, "failed"), *nc = json_object_get(checks, "passed");
    if (!json_is_integer(nf) || json_integer_value(nf) != 0 || !json_is_integer(nc) || json_integer_value(nc) < 1) {
        printf("validate: checks.passed >= 1 and checks.failed == 0 expected\n");
        bad++;
    }
    json_decref(root);
    if (md_path) {
        FILE *f = fopen(md_path, "r");
        char *text = NULL;
        long n = 0;
        if (f && !fseek(f, 0, SEEK_END) && (n = ftell(f)) > 0 && !fseek(f, 0, SEEK_SET) &&
            (text = calloc((size_t)n + 1, 1)) && fread(text, 1, (size_t)n, f) == (size_t)n) {
            for (size_t s = 0; s < HR_ARRAY_LEN(k_titles); s++)
                if (!strstr(text, k_titles[s])) {
                    printf("validate: %s lacks the section '%s'\n", md_path, k_titles[s]);
                    bad++;
                }
        } else {
            printf("validate: cannot read %s\n", md_path);
            bad++;
        }
        free(text);
        if (f) fclose(f);
    }
    printf("validate: %s%s%s: %s\n", json_path, md_path ? ", " : "", md_path ? md_path : "",
           bad ? "FAILED" : "every key present, every check ok");
    return bad ? 1 : 0;
}

/* --only's list names the section */
static bool wanted(const char *section) {
    if (!O.only) return true;
    size_t n = strlen(section);
    for (const char *p = O.only; (p = strstr(p, section)) != NULL; p += n)
        if ((p == O.only || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) return true;
    return false;
}

static void usage(void) {
    fprintf(stderr,
            "usage: gpu_bench [--driver LIB] [--quick] [--json FILE] [--md FILE] [--commit C] "
            "[--driver-version V] [--max-seconds S] [--e2e-layers N] [--no-e2e] [--only gemv,attention,capacity,e2e]\n"
            "       gpu_bench --validate FILE.json [FILE.md]\n");
    exit(2);
}

int main(int argc, char **argv) {
    O.max_seconds = 0;
    O.e2e = true;
    O.e2e_layers = 8;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--validate")) {
            if (!v) usage();
            return validate(v, i + 2 < argc ? argv[i + 2] : NULL);
        } else if (!strcmp(a, "--quick"))
            O.quick = true;
        else if (!strcmp(a, "--no-e2e"))
            O.e2e = false;
        else if (!v)
            usage();
        else if (!strcmp(a, "--driver"))
            O.driver = argv[++i];
        else if (!strcmp(a, "--json"))
            O.json = argv[++i];
        else if (!strcmp(a, "--md"))
            O.md = argv[++i];
        else if (!strcmp(a, "--only"))
            O.only = argv[++i];
        else if (!strcmp(a, "--commit"))
            O.commit = argv[++i];
        else if (!strcmp(a, "--driver-version"))
            O.driver_version = argv[++i];
        else if (!strcmp(a, "--max-seconds"))
            O.max_seconds = atof(argv[++i]);
        else if (!strcmp(a, "--e2e-layers")) {
            O.e2e_layers = atoi(argv[++i]);
            if (O.e2e_layers < 1 || O.e2e_layers > 32) usage();
        } else
            usage();
    }
    if (O.max_seconds <= 0) O.max_seconds = O.quick ? 120 : 300;
    t_start = hr_time_now();
    deadline = t_start + O.max_seconds;
    hr_error e = {0};
    if (hr_cuda_device_open(O.driver, 0, &dev, &e)) {
        printf("gpu_bench: %s\n", e.msg);
        return 77;
    }
    char device[256];
    snprintf(device, sizeof device, "%s", hr_cuda_device_name(dev));
    uint64_t mem_free = 0, mem_total = 0;
    (void)hr_cuda_device_mem(dev, &mem_free, &mem_total, &e);
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    printf("gpu_bench%s on %s (%.1f GiB), %s, commit %s\n", O.quick ? " --quick" : "", device,
           mem_total / (MIB * 1024.0), date, O.commit ? O.commit : "unknown");
    printf("  %-10s %-14s %-38s %-20s %-22s %-8s %-30s %-8s %s\n", "section", "what", "shape", "value",
           "median (loops x R)", "% copy", "target", "% tgt", "check");
    jroot = json_object();
    json_object_set_new(jroot, "schema", json_string(SCHEMA));
    json_object_set_new(jroot, "device", json_string(device));
    json_object_set_new(jroot, "device_memory_bytes", json_integer((json_int_t)mem_total));
    json_object_set_new(jroot, "driver_version", O.driver_version ? json_string(O.driver_version) : json_null());
    json_object_set_new(jroot, "driver_library", O.driver ? json_string(O.driver) : json_string("libcuda.so.1"));
    json_object_set_new(jroot, "date", json_string(date));
    json_object_set_new(jroot, "commit", O.commit ? json_string(O.commit) : json_null());
    json_object_set_new(jroot, "quick", json_boolean(O.quick));
    json_object_set_new(jroot, "timing",
                        json_string("kernels: GPU events (hr_cuda_time_begin/_end) around a loop of reps_per_loop "
                                    "back-to-back reps after one warm-up rep; median_ms is the median over `loops` "
                                    "loops of (loop time / reps_per_loop). e2e: host wall clock per engine step."));
    json_t *tg = json_object();
    json_object_set_new(tg, "gemv_pct_of_copy_bw_bf16_q8_0_q4_0", json_real(GEMV_TARGET_PCT));
    json_object_set_new(tg, "prefill_tflops_bf16", json_real(PREFILL_TARGET_PCT / 100.0 * H200_BF16_TFLOPS));
    json_object_set_new(tg, "attention_pct_of_copy_bw_f16_q8_at_8k", json_real(ATTN_TARGET_PCT));
    json_object_set_new(tg, "attention_q8_over_f16_speed", json_real(ATTN_Q8_F16_TARGET));
    json_object_set_new(tg, "e2e_batch1_weight_bw_pct_of_copy", json_real(E2E_TARGET_PCT));
    json_object_set_new(tg, "attention_4bit_over_f16_speed", json_real(ATTN_4BIT_F16_TARGET));
    json_object_set_new(tg, "capacity_q8_over_f16_sessions", json_real(CAPACITY_Q8_TARGET));
    json_object_set_new(jroot, "targets", tg);

    bench_copy();
    if (wanted("gemv"))
        bench_gemv();
    else
        skip_row("gemv", "-", "-", "--only"), skip_row("prefill", "-", "-", "--only");
    if (wanted("attention")) {
        bench_attention();
        bench_attn_tokens();
        bench_prefill_attn();
    } else
        skip_row("attention", "-", "-", "--only");
    hr_cuda_device_close(dev); /* the runtime opens its own */
    dev = NULL;
    /* capacity first: a few seconds, where the end-to-end model's synthesis takes what time is left */
    if (O.e2e && wanted("capacity"))
        bench_capacity();
    else
        skip_row("capacity", "sessions", "-", O.e2e ? "--only" : "--no-e2e");
    if (O.e2e && wanted("e2e"))
        bench_e2e();
    else
        skip_row("e2e", "decode", "-", O.e2e ? "--only" : "--no-e2e");

    json_t *ck = json_object();
    json_object_set_new(ck, "passed", json_integer(n_checked - n_failed));
    json_object_set_new(ck, "failed", json_integer(n_failed));
    json_object_set_new(jroot, "checks", ck);
    json_object_set_new(jroot, "seconds", json_real(hr_time_now() - t_start));
    int rc = n_failed ? 1 : 0;
    if (O.json && json_dump_file(jroot, O.json, JSON_INDENT(2) | JSON_PRESERVE_ORDER)) {
        fprintf(stderr, "gpu_bench: cannot write %s\n", O.json);
        rc = 1;
    }
    if (O.md && !write_md(O.md, device, date)) {
        fprintf(stderr, "gpu_bench: cannot write %s\n", O.md);
        rc = 1;
    }
    json_decref(jroot);
    free(g_rows);
    printf("gpu_bench: %d checks, %d failed, %.1f s%s%s%s%s\n", n_checked, n_failed, hr_time_now() - t_start,
           O.json ? "; " : "", O.json ? O.json : "", O.md ? ", " : "", O.md ? O.md : "");
    return rc;
}

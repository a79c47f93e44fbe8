/* gpu_bench.h: what gpu_bench's files share (gpu_bench.c has the sections and how they are measured):
 * the run's state, passed to every section as `gpu_bench *g`; the rows, one per figure; the checks;
 * the timing loop; each section's entry point.
 *
 *   gpu_bench.c          main: options, the JSON's header, the sections in order, the markdown, --validate
 *   gpu_bench_rows.c     rows (printed, kept, added to the JSON), checks, the time budget, timing, test data
 *   gpu_bench_kernels.c  1-3: the copy bandwidth, the logits' download and the greedy choice on the host or the
 *                        device; GEMV and GEMM at the model's shapes
 *   gpu_bench_attn.c     4: decode attention per KV format and kernel; under token masks; prefill attention
 *   gpu_bench_engine.c   5, 6: end to end through the runtime (eager and CUDA graphs); capacity per KV format */
#ifndef HR_GPU_BENCH_H
#define HR_GPU_BENCH_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/cuda.h"
#include "common/util.h"

/* the targets (H200; the copy row's datasheet reference is the card's own: gpu_bench.spec_gbs) */
#define H200_BF16_TFLOPS     790.0 /* dense bf16, as measured there (an H100: 798) */
#define GEMV_TARGET_PCT      80.0  /* of copy bandwidth: bf16, q8_0, q4_0, one token */
#define PREFILL_TARGET_PCT   50.0  /* of H200_BF16_TFLOPS */
#define ATTN_TARGET_PCT      80.0  /* of copy bandwidth, f16 and q8 at 8K */
#define ATTN_Q8_F16_TARGET   1.7   /* q8's speed over f16's */
#define ATTN_4BIT_F16_TARGET 2.8   /* 4-bit (q4h)'s speed over f16's */
#define CAPACITY_Q8_TARGET   1.9   /* q8's concurrent sessions over f16's at one KV budget */
#define E2E_TARGET_PCT       70.0  /* of copy bandwidth: weight bytes per batch-1 step */
#define MIB                  (1024.0 * 1024.0)

typedef struct gb_opts {
    const char *driver, *json, *md, *commit, *driver_version;
    const char *only; /* --only gemv,attention,capacity,e2e (the copy always runs: the reference); NULL: all */
    bool quick, e2e;
    double max_seconds;
    int e2e_layers;
} gb_opts;

/* one measured figure: printed as it is made, kept for the markdown, added to its section's JSON array */
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

typedef struct gpu_bench {
    gb_opts o;
    hr_cuda_device *dev; /* the kernel sections' device; closed (NULL) before the runtime opens its own */
    double t_start, deadline;
    int n_checked, n_failed;
    double copy_gbs;     /* the reference of every "% of copy"; NAN until measured */
    double spec_gbs;     /* the card's datasheet bandwidth (hr_plan_device_by_name on the driver's name), 0: none */
    char spec_card[128]; /* that profile's label */
    json_t *jroot;
    row *rows; /* every row so far, for the markdown */
    int n_rows, cap_rows;
    uint64_t rng; /* gb_frand's state: one sequence over the whole run, so every run draws the same data */
} gpu_bench;

/* ---- gpu_bench_rows.c ---- */

float gb_frand(gpu_bench *g); /* [-1, 1) */
void gb_fill(gpu_bench *g, float *x, size_t n, float scale);
double gb_pct(double a, double b);
json_t *gb_jnum(double v); /* null where not finite */

row gb_new_row(const char *section, const char *what);
/* adds a row to the table and its JSON object (the row's fields, then extra's: taken) to section's array */
void gb_add_row(gpu_bench *g, const row *r, json_t *extra);
/* something not measured (a format the storage refuses, the time budget): a row saying why */
void gb_skip_row(gpu_bench *g, const char *section, const char *what, const char *shape, const char *why);
/* Two ways of one thing side by side: the row a_ms / b_ms (> 1: b faster), shaped "PREFIX (A time / B
 * time): NAME faster" (a_desc, b_desc: the ways as the ratio names them; NULL: a, b), checked "skipped:
 * a NOUN not measured" where either is missing; its JSON extra's keys (NULL: none), then "A_ms", "B_ms"
 * and "faster" (a or b). */
void gb_add_ratio(gpu_bench *g, row r, const char *prefix, const char *a, const char *a_desc, double a_ms,
                  const char *b, const char *b_desc, double b_ms, const char *noun, json_t *extra);
bool gb_out_of_time(const gpu_bench *g);
/* a check's outcome; false when it failed */
bool gb_verdict(gpu_bench *g, row *r, bool ok, const char *fmt, double err);
/* a device call that failed: a failed check saying which; false */
bool gb_dev_fail(gpu_bench *g, row *r, const char *what, const hr_error *e);
/* fills [p, p + total) with copies of its first `have` bytes, doubling (have > 0) */
hr_status gb_replicate(gpu_bench *g, uint64_t p, size_t have, size_t total, hr_error *e);

typedef hr_status (*rep_fn)(void *ctx, int rep, hr_error *err);

typedef struct timing {
    double median_ms;
    int loops, reps;
} timing;

double gb_median(double *v, int n); /* sorts v */
/* a warm-up rep, then loops of reps between GPU events for about budget_ms: the median of loop / reps */
hr_status gb_time_reps(gpu_bench *g, rep_fn f, void *ctx, double budget_ms, timing *t, hr_error *e);
void gb_set_timing(row *r, const timing *t);

/* ---- the sections ---- */

void gb_bench_copy(gpu_bench *g);         /* 1 (gpu_bench_kernels.c) */
void gb_bench_argmax(gpu_bench *g);       /* 1a: the greedy choice on the device or the host */
void gb_bench_gemv(gpu_bench *g);         /* 2, 3 */
void gb_bench_attention(gpu_bench *g);    /* 4 (gpu_bench_attn.c) */
void gb_bench_attn_tokens(gpu_bench *g);  /* 4a */
void gb_bench_prefill_attn(gpu_bench *g); /* 4b */
void gb_bench_e2e(gpu_bench *g);          /* 5 (gpu_bench_engine.c) */
void gb_bench_capacity(gpu_bench *g);     /* 6 */

#endif

/* gpu_bench_rows.c: gpu_bench's rows (printed as made, kept for the markdown, added to the JSON), its
 * checks, its time budget, the timing loop and the test data's random numbers (gpu_bench.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_bench.h"

float gb_frand(gpu_bench *g) {
    g->rng = g->rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)(g->rng >> 40) / 8388608.0f - 1.0f;
}

void gb_fill(gpu_bench *g, float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = gb_frand(g) * scale;
}

double gb_pct(double a, double b) { return isfinite(a) && isfinite(b) && b > 0 ? 100.0 * a / b : NAN; }

json_t *gb_jnum(double v) { return isfinite(v) ? json_real(v) : json_null(); }

/* ---- rows: one measured figure each, printed as it is made and kept for the markdown -------------- */

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

void gb_add_row(gpu_bench *g, const row *r, json_t *extra) {
    if (g->n_rows == g->cap_rows) {
        g->cap_rows = g->cap_rows ? 2 * g->cap_rows : 64;
        row *nr = realloc(g->rows, sizeof *g->rows * (size_t)g->cap_rows);
        if (!nr) {
            fprintf(stderr, "gpu_bench: out of memory\n");
            exit(1);
        }
        g->rows = nr;
    }
    g->rows[g->n_rows++] = *r;
    print_row(r);
    json_t *o = json_object();
    json_object_set_new(o, "what", json_string(r->what));
    json_object_set_new(o, "shape", json_string(r->shape));
    json_object_set_new(o, "value", gb_jnum(r->value));
    json_object_set_new(o, "unit", json_string(r->unit));
    json_object_set_new(o, "median_ms", gb_jnum(r->median_ms));
    json_object_set_new(o, "loops", json_integer(r->loops));
    json_object_set_new(o, "reps_per_loop", json_integer(r->reps));
    json_object_set_new(o, "pct_of_copy_bw", gb_jnum(r->pct_copy));
    json_object_set_new(o, "target", r->target[0] ? json_string(r->target) : json_null());
    json_object_set_new(o, "pct_of_target", gb_jnum(r->pct_target));
    json_object_set_new(o, "check", json_string(r->check));
    if (extra) json_object_update(o, extra);
    json_decref(extra);
    json_t *arr = json_object_get(g->jroot, r->section);
    if (!arr) {
        arr = json_array();
        json_object_set_new(g->jroot, r->section, arr);
    }
    json_array_append_new(arr, o);
}

row gb_new_row(const char *section, const char *what) {
    row r;
    memset(&r, 0, sizeof r);
    snprintf(r.section, sizeof r.section, "%s", section);
    snprintf(r.what, sizeof r.what, "%s", what);
    r.value = r.median_ms = r.pct_copy = r.pct_target = NAN;
    snprintf(r.check, sizeof r.check, "-");
    return r;
}

void gb_add_ratio(gpu_bench *g, row r, const char *prefix, const char *a, const char *a_desc, double a_ms,
                  const char *b, const char *b_desc, double b_ms, const char *noun, json_t *extra) {
    r.value = a_ms / b_ms;
    const bool known = isfinite(r.value);
    const char *faster = !known ? "-" : r.value > 1.0 ? b : a;
    snprintf(r.shape, sizeof r.shape, "%s (%s time / %s time): %s faster", prefix, a_desc ? a_desc : a,
             b_desc ? b_desc : b, faster);
    snprintf(r.unit, sizeof r.unit, "x");
    if (!known) snprintf(r.check, sizeof r.check, "skipped: a %s not measured", noun);
    json_t *xj = extra ? extra : json_object();
    char key[48];
    snprintf(key, sizeof key, "%s_ms", a);
    json_object_set_new(xj, key, gb_jnum(a_ms));
    snprintf(key, sizeof key, "%s_ms", b);
    json_object_set_new(xj, key, gb_jnum(b_ms));
    json_object_set_new(xj, "faster", known ? json_string(faster) : json_null());
    gb_add_row(g, &r, xj);
}

void gb_skip_row(gpu_bench *g, const char *section, const char *what, const char *shape, const char *why) {
    row r = gb_new_row(section, what);
    snprintf(r.shape, sizeof r.shape, "%s", shape);
    snprintf(r.check, sizeof r.check, "skipped: %.80s", why);
    gb_add_row(g, &r, NULL);
}

bool gb_out_of_time(const gpu_bench *g) { return hr_time_now() > g->deadline; }

bool gb_verdict(gpu_bench *g, row *r, bool ok, const char *fmt, double err) {
    g->n_checked++;
    if (!ok) g->n_failed++;
    snprintf(r->check, sizeof r->check, ok ? "ok (%s %.2g)" : "FAIL (%s %.2g)", fmt, err);
    return ok;
}

/* ---- device helpers --------------------------------------------------------------------------------- */

bool gb_dev_fail(gpu_bench *g, row *r, const char *what, const hr_error *e) {
    g->n_checked++;
    g->n_failed++;
    snprintf(r->check, sizeof r->check, "FAIL: %.30s: %.50s", what, e->msg);
    return false;
}

hr_status gb_replicate(gpu_bench *g, uint64_t p, size_t have, size_t total, hr_error *e) {
    hr_status st = HR_OK;
    while (have < total && !st) {
        size_t m = have < total - have ? have : total - have;
        st = hr_cuda_copy(g->dev, p + have, p, m, e);
        have += m;
    }
    return st;
}

/* ---- timing ----------------------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double gb_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* A warm-up rep (which also estimates a rep's time), then loops of R reps between GPU events, R making
 * a loop about 2 ms (launch gaps amortized), as many loops (3..15) as budget_ms allows. --quick: 3
 * loops of one rep. */
hr_status gb_time_reps(gpu_bench *g, rep_fn f, void *ctx, double budget_ms, timing *t, hr_error *e) {
    double ms = 0;
    hr_status st = hr_cuda_time_begin(g->dev, e);
    if (!st) st = f(ctx, 0, e);
    if (!st) st = hr_cuda_time_end(g->dev, &ms, e);
    if (st) return st;
    int reps = 1, loops = 3, rep = 1;
    if (!g->o.quick) {
        double est = ms > 1e-3 ? ms : 1e-3;
        reps = (int)ceil(2.0 / est);
        reps = reps < 1 ? 1 : reps > 200 ? 200 : reps;
        loops = (int)(budget_ms / (est * reps));
        loops = loops < 3 ? 3 : loops > 15 ? 15 : loops;
    }
    double v[15];
    for (int l = 0; l < loops; l++) {
        st = hr_cuda_time_begin(g->dev, e);
        for (int r = 0; r < reps && !st; r++) st = f(ctx, rep++, e);
        if (!st) st = hr_cuda_time_end(g->dev, &ms, e);
        if (st) return st;
        v[l] = ms / reps;
    }
    t->median_ms = gb_median(v, loops);
    t->loops = loops;
    t->reps = reps;
    return HR_OK;
}

void gb_set_timing(row *r, const timing *t) {
    r->median_ms = t->median_ms;
    r->loops = t->loops;
    r->reps = t->reps;
}

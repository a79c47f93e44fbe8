/* svg.c: the run as one SVG, written by hand (no plotting dependency). Top panel: the KV pool's use
 * (% of the pool, left axis) and requests running / waiting (right axis) over time, with a tick at each
 * request's first token and a cross at each refusal or failure. Bottom panel: the latency CDF of
 * TTFT and end-to-end latency of the successful requests. Every axis has ticks, a label and units. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"

#define W       960
#define H       720
#define LEFT    80
#define RIGHT   80
#define TOP1    70
#define HEIGHT1 300
#define TOP2    450
#define HEIGHT2 200
#define PLOT_W  (W - LEFT - RIGHT)

#define C_POOL "#1f77b4"
#define C_RUN  "#2ca02c"
#define C_WAIT "#ff7f0e"
#define C_TTFT "#9467bd"
#define C_E2E  "#555555"
#define C_BAD  "#d62728"

/* A tick step of 1, 2 or 5 times a power of ten giving about n ticks over range. */
static double nice_step(double range, int n) {
    if (!(range > 0)) return 1;
    double raw = range / n, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

static double nice_max(double v, int n) {
    double s = nice_step(v, n);
    return v > 0 ? ceil(v / s) * s : 1;
}

typedef struct frame {
    double x0, y0, w, h; /* pixels: top-left and size */
    double xmax, ymax;   /* data range from 0 */
} frame;

static double px(const frame *f, double x) { return f->x0 + (f->xmax > 0 ? x / f->xmax : 0) * f->w; }
static double py(const frame *f, double y) { return f->y0 + f->h - (f->ymax > 0 ? y / f->ymax : 0) * f->h; }

static void axes(FILE *o, const frame *f, const char *xlabel, const char *ylabel) {
    fprintf(o, "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='none' stroke='#999'/>\n", f->x0, f->y0, f->w,
            f->h);
    double sx = nice_step(f->xmax, 8);
    for (double x = 0; x <= f->xmax * 1.0001; x += sx) {
        fprintf(o, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#eee'/>\n", px(f, x), f->y0, px(f, x),
                f->y0 + f->h);
        fprintf(o, "<text x='%.1f' y='%.1f' text-anchor='middle'>%g</text>\n", px(f, x), f->y0 + f->h + 16, x);
    }
    double sy = nice_step(f->ymax, 5);
    for (double y = 0; y <= f->ymax * 1.0001; y += sy)
        fprintf(o, "<text x='%.1f' y='%.1f' text-anchor='end'>%g</text>\n", f->x0 - 6, py(f, y) + 4, y);
    fprintf(o, "<text x='%.1f' y='%.1f' text-anchor='middle'>%s</text>\n", f->x0 + f->w / 2, f->y0 + f->h + 36, xlabel);
    fprintf(o, "<text transform='translate(%.1f,%.1f) rotate(-90)' text-anchor='middle'>%s</text>\n", f->x0 - 50,
            f->y0 + f->h / 2, ylabel);
}

static void legend(FILE *o, double x, double y, int i, const char *color, const char *dash, const char *label) {
    double yy = y + i * 18;
    fprintf(o, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='%s' stroke-width='2' stroke-dasharray='%s'/>\n",
            x, yy, x + 24, yy, color, dash);
    fprintf(o, "<text x='%.1f' y='%.1f'>%s</text>\n", x + 30, yy + 4, label);
}

/* A step line through samples: value v(i) for sample i, broken where v < 0 (no data then). */
static void step_line(FILE *o, const frame *f, const hr_bench_sample *s, int ns, int which, const char *color,
                      const char *dash) {
    bool open = false;
    for (int i = 0; i < ns; i++) {
        double v = which == 0   ? (s[i].has_pool && s[i].pool_total_bytes > 0
                                       ? 100.0 * (double)s[i].pool_used_bytes / (double)s[i].pool_total_bytes
                                       : -1)
                   : which == 1 ? s[i].server_running
                   : which == 2 ? s[i].server_waiting
                   : which == 3 ? s[i].client_streaming
                                : s[i].client_waiting;
        double x = px(f, s[i].t_s), y;
        if (v < 0) { /* no answer at this tick (the poll timed out): a gap, not a held value */
            if (open) fprintf(o, " H%.1f'/>\n", x);
            open = false;
            continue;
        }
        y = py(f, v);
        if (!open) {
            fprintf(o, "<path fill='none' stroke='%s' stroke-width='2' stroke-dasharray='%s' d='M%.1f,%.1f", color,
                    dash, x, y);
            open = true;
        } else {
            fprintf(o, " H%.1f V%.1f", x, y);
        }
    }
    if (open) fprintf(o, "'/>\n");
}

static void cdf(FILE *o, const frame *f, double *v, int n, const char *color) {
    if (n == 0) return;
    fprintf(o, "<path fill='none' stroke='%s' stroke-width='2' d='M%.1f,%.1f", color, px(f, v[0]), py(f, 0));
    for (int i = 0; i < n; i++) fprintf(o, " H%.1f V%.1f", px(f, v[i]), py(f, (i + 1.0) / n));
    fprintf(o, "'/>\n");
}

/* Text for an SVG element: &, <, >, ' and " escaped; control bytes dropped. */
static void put_text(FILE *o, const char *t) {
    for (; t && *t; t++) {
        switch (*t) {
        case '&': fputs("&amp;", o); break;
        case '<': fputs("&lt;", o); break;
        case '>': fputs("&gt;", o); break;
        case '\'': fputs("&apos;", o); break;
        case '"': fputs("&quot;", o); break;
        default:
            if ((unsigned char)*t >= 0x20) fputc(*t, o);
        }
    }
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

hr_status hr_bench_write_svg(FILE *o, const hr_bench_meta *m, const hr_bench_report *rep, const hr_bench_result *r,
                             int n, const hr_bench_sample *s, int ns, hr_error *err) {
    double tmax = 0;
    int max_count = 1;
    bool server_q = false;
    for (int i = 0; i < ns; i++) {
        if (s[i].t_s > tmax) tmax = s[i].t_s;
        server_q |= s[i].server_running >= 0;
        int c = HR_MAX(HR_MAX(s[i].server_running, s[i].server_waiting),
                       HR_MAX(s[i].client_streaming, s[i].client_waiting));
        if (c > max_count) max_count = c;
    }
    for (int i = 0; i < n; i++)
        if (r[i].t_end > tmax) tmax = r[i].t_end;
    fprintf(o,
            "<svg xmlns='http://www.w3.org/2000/svg' width='%d' height='%d' viewBox='0 0 %d %d' "
            "font-family='sans-serif' font-size='12'>\n<rect width='100%%' height='100%%' fill='white'/>\n",
            W, H, W, H);
    fprintf(o, "<text x='%d' y='24' font-size='16' font-weight='bold'>headroom bench: ", LEFT);
    put_text(o, m->pattern);
    fprintf(o, ", %d requests (%d ok, %d refused, %d failed, %d timed out)</text>\n", rep->n_sent, rep->n_ok,
            rep->n_refused, rep->n_failed, rep->n_timed_out);
    fprintf(o, "<text x='%d' y='44' fill='#555'>", LEFT);
    put_text(o, m->url);
    fprintf(o, ", seed %llu; TTFT p50 %.0f ms, p99 %.0f ms; %.1f output tok/s</text>\n", (unsigned long long)m->seed,
            rep->ttft_ms.p50, rep->ttft_ms.p99, rep->out_tok_per_s);

    /* top: the pool and the queues over time */
    frame pool = {LEFT, TOP1, PLOT_W, HEIGHT1, nice_max(tmax, 8), 100};
    frame cnt = pool;
    double sy = nice_step(max_count, 5);
    if (sy < 1) sy = 1; /* whole requests */
    cnt.ymax = ceil(max_count / sy) * sy;
    axes(o, &pool, "time since start (s)", rep->has_pool ? "KV pool used (% of pool)" : "KV pool used (not reported)");
    for (double y = 0; y <= cnt.ymax * 1.0001; y += sy)
        fprintf(o, "<text x='%.1f' y='%.1f'>%g</text>\n", cnt.x0 + cnt.w + 6, py(&cnt, y) + 4, y);
    fprintf(o, "<text transform='translate(%.1f,%.1f) rotate(90)' text-anchor='middle'>requests</text>\n",
            cnt.x0 + cnt.w + 50, cnt.y0 + cnt.h / 2);
    int li = 0;
    double lx = pool.x0 + pool.w - 230, ly = pool.y0 + 14;
    fprintf(o, "<rect x='%.1f' y='%.1f' width='226' height='%d' fill='white' fill-opacity='0.85' stroke='#ccc'/>\n",
            lx - 6, ly - 10, 5 * 18 + 4);
    if (rep->has_pool) {
        step_line(o, &pool, s, ns, 0, C_POOL, "none");
        legend(o, lx, ly, li++, C_POOL, "none", "KV pool used (%, left)");
    }
    if (server_q) {
        step_line(o, &cnt, s, ns, 1, C_RUN, "none");
        step_line(o, &cnt, s, ns, 2, C_WAIT, "none");
        legend(o, lx, ly, li++, C_RUN, "none", "running on the server (right)");
        legend(o, lx, ly, li++, C_WAIT, "none", "waiting on the server (right)");
    } else {
        step_line(o, &cnt, s, ns, 3, C_RUN, "6,3");
        step_line(o, &cnt, s, ns, 4, C_WAIT, "6,3");
        legend(o, lx, ly, li++, C_RUN, "6,3", "streaming, client view (right)");
        legend(o, lx, ly, li++, C_WAIT, "6,3", "no token yet, client view (right)");
    }
    for (int i = 0; i < n; i++) {
        if (r[i].t_first >= 0)
            fprintf(o, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='%s'/>\n", px(&pool, r[i].t_first),
                    pool.y0 + pool.h, px(&pool, r[i].t_first), pool.y0 + pool.h - 10, C_TTFT);
        if (r[i].status != HR_BENCH_OK && r[i].t_end >= 0) {
            double x = px(&pool, r[i].t_end), y = pool.y0 + pool.h - 18;
            fprintf(o, "<path d='M%.1f,%.1f l8,8 m0,-8 l-8,8' stroke='%s' stroke-width='2'/>\n", x - 4, y - 4, C_BAD);
        }
    }
    legend(o, lx, ly, li++, C_TTFT, "none", "| first token of a request");
    legend(o, lx, ly, li++, C_BAD, "none", "x refused / failed / timed out");

    /* bottom: latency CDF */
    double *tt = malloc((size_t)(n > 0 ? n : 1) * sizeof *tt), *ee = malloc((size_t)(n > 0 ? n : 1) * sizeof *ee);
    int nt = 0, ne = 0;
    double lmax = 0;
    for (int i = 0; tt && ee && i < n; i++) {
        if (r[i].status != HR_BENCH_OK) continue;
        if (r[i].ttft_s >= 0) tt[nt++] = r[i].ttft_s * 1000;
        ee[ne++] = r[i].e2e_s * 1000;
        if (r[i].e2e_s * 1000 > lmax) lmax = r[i].e2e_s * 1000;
    }
    if (tt) qsort(tt, (size_t)nt, sizeof *tt, cmp_d);
    if (ee) qsort(ee, (size_t)ne, sizeof *ee, cmp_d);
    frame lat = {LEFT, TOP2, PLOT_W, HEIGHT2, nice_max(lmax, 8), 1};
    axes(o, &lat, "latency (ms)", "fraction of ok requests");
    cdf(o, &lat, tt, nt, C_TTFT);
    cdf(o, &lat, ee, ne, C_E2E);
    double cx = lat.x0 + lat.w - 230, cy = lat.y0 + lat.h - 44;
    fprintf(o, "<rect x='%.1f' y='%.1f' width='226' height='40' fill='white' fill-opacity='0.85' stroke='#ccc'/>\n",
            cx - 6, cy - 10);
    legend(o, cx, cy, 0, C_TTFT, "none", "time to first token (CDF)");
    legend(o, cx, cy, 1, C_E2E, "none", "end-to-end latency (CDF)");
    free(tt);
    free(ee);
    fprintf(o, "</svg>\n");
    if (ferror(o)) return hr_error_set(err, HR_ERR_IO, "writing the SVG failed");
    return HR_OK;
}

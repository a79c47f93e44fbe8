/* top_view.c: draws one frame of `headroom top` from a /v1/kv answer (see top.h). Every line goes
 * through put(), which counts visible characters and cuts at the screen's width, so colours
 * (escape sequences, not counted) never wrap a line. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/top.h"

#define C_RESET  "\x1b[0m"
#define C_BOLD   "\x1b[1m"
#define C_DIM    "\x1b[2m"
#define C_USED   "\x1b[34m"
#define C_CACHED "\x1b[36m"
#define C_RED    "\x1b[31m"
#define C_YELLOW "\x1b[33m"
#define C_REV    "\x1b[7m"

static void raw(hr_top_frame *f, const char *s, size_t n) {
    if (f->failed) return;
    if (f->len + n + 1 > f->cap) {
        size_t cap = f->cap ? f->cap : 4096;
        while (cap < f->len + n + 1) cap *= 2;
        char *d = realloc(f->data, cap);
        if (!d) {
            f->failed = true;
            return;
        }
        f->data = d;
        f->cap = cap;
    }
    memcpy(f->data + f->len, s, n);
    f->len += n;
    f->data[f->len] = '\0';
}

/* Visible text: cut at the width (UTF-8 continuation bytes take no column). */
static void put(hr_top_frame *f, const char *s) {
    for (; *s; s++) {
        bool cont = ((unsigned char)*s & 0xC0) == 0x80;
        if (!cont && f->cols > 0 && f->col >= f->cols) continue;
        raw(f, s, 1);
        if (!cont) f->col++;
    }
}

static void putf(hr_top_frame *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(hr_top_frame *f, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    put(f, line);
}

static void color(hr_top_frame *f, const hr_top_view *v, const char *code) {
    if (v->color) raw(f, code, strlen(code));
}

static void newline(hr_top_frame *f, const hr_top_view *v) {
    color(f, v, C_RESET);
    if (v->color) raw(f, "\x1b[K", 3); /* clear what a longer previous frame left on this line */
    raw(f, "\n", 1);
    f->col = 0;
}

void hr_top_frame_free(hr_top_frame *f) {
    free(f->data);
    *f = (hr_top_frame){0};
}

void hr_top_bytes(double n, char *out, size_t cap) {
    static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    double a = fabs(n);
    while (a >= 1024 && i < 4) a /= 1024, i++;
    if (i == 0)
        snprintf(out, cap, "%s%.0f B", n < 0 ? "-" : "", a);
    else
        snprintf(out, cap, "%s%.1f %s", n < 0 ? "-" : "", a, u[i]);
}

/* ---- reading the answer ------------------------------------------------------------------------ */

static double num(const json_t *o, const char *k) {
    json_t *x = json_object_get(o, k);
    return json_is_number(x) ? json_number_value(x) : 0;
}

static const char *str(const json_t *o, const char *k) {
    json_t *x = json_object_get(o, k);
    return json_is_string(x) ? json_string_value(x) : "?";
}

static void fmt_secs(const json_t *o, const char *k, char *out, size_t cap) {
    json_t *x = json_object_get(o, k);
    if (!json_is_number(x))
        snprintf(out, cap, "-");
    else if (json_number_value(x) < 1)
        snprintf(out, cap, "%.1f ms", json_number_value(x) * 1000);
    else
        snprintf(out, cap, "%.2f s", json_number_value(x));
}

static double row_bytes(const json_t *row) { return num(row, "held_bytes"); }

static int by_bytes(const void *a, const void *b) {
    const json_t *x = *(const json_t *const *)a, *y = *(const json_t *const *)b;
    double bx = row_bytes(x), by = row_bytes(y);
    if (bx != by) return bx < by ? 1 : -1;
    double ix = num(x, "request_id"), iy = num(y, "request_id");
    return (ix > iy) - (ix < iy);
}

/* ---- the parts --------------------------------------------------------------------------------- */

static void header(const json_t *kv, const hr_top_view *v, hr_top_frame *f) {
    color(f, v, C_BOLD);
    put(f, "headroom top");
    color(f, v, C_RESET);
    putf(f, "  %s", v->url);
    if (kv) {
        const json_t *p = json_object_get(kv, "pool");
        char budget[32];
        hr_top_bytes(num(p, "budget_bytes"), budget, sizeof budget);
        time_t t = (time_t)num(kv, "time");
        struct tm tm;
        char clock[16] = "";
        if (localtime_r(&t, &tm)) strftime(clock, sizeof clock, "%H:%M:%S", &tm);
        putf(f, "  %s  KV %s/%s block %d  budget %s  %s", str(kv, "model"), str(p, "k_format"), str(p, "v_format"),
             (int)num(p, "block_size"), budget, clock);
    }
    newline(f, v);
    if (v->status) {
        color(f, v, C_RED C_BOLD);
        put(f, v->status);
        newline(f, v);
    }
}

static void pool_bar(const json_t *p, const hr_top_view *v, hr_top_frame *f) {
    double total = num(p, "total_bytes"), used = num(p, "used_bytes"), cached = num(p, "cached_bytes");
    int width = (v->cols > 0 ? v->cols : 100) - 12;
    if (width > 100) width = 100;
    if (width < 10) width = 10;
    int n_used = total > 0 ? (int)lround(used / total * width) : 0;
    int n_cached = total > 0 ? (int)lround((used + cached) / total * width) - n_used : 0;
    if (n_used + n_cached > width) n_cached = width - n_used;
    put(f, "pool [");
    color(f, v, C_USED);
    for (int i = 0; i < n_used; i++) put(f, "#");
    color(f, v, C_CACHED);
    for (int i = 0; i < n_cached; i++) put(f, "=");
    color(f, v, C_DIM);
    for (int i = n_used + n_cached; i < width; i++) put(f, ".");
    color(f, v, C_RESET);
    putf(f, "] %3.0f%%", total > 0 ? 100 * used / total : 0);
    newline(f, v);
    char s_used[32], s_cached[32], s_free[32], s_head[32], s_total[32], s_swap[32];
    hr_top_bytes(used, s_used, sizeof s_used);
    hr_top_bytes(cached, s_cached, sizeof s_cached);
    hr_top_bytes(num(p, "free_bytes"), s_free, sizeof s_free);
    hr_top_bytes(num(p, "headroom_bytes"), s_head, sizeof s_head);
    hr_top_bytes(total, s_total, sizeof s_total);
    hr_top_bytes(num(p, "swapped_bytes"), s_swap, sizeof s_swap);
    color(f, v, C_USED);
    putf(f, "used %s", s_used);
    color(f, v, C_RESET);
    put(f, "  ");
    color(f, v, C_CACHED);
    putf(f, "cached %s", s_cached);
    color(f, v, C_RESET);
    putf(f, "  free %s  of %s  ", s_free, s_total);
    color(f, v, num(p, "headroom_bytes") <= 0 ? C_RED : C_YELLOW);
    putf(f, "headroom %s", s_head);
    color(f, v, C_RESET);
    putf(f, "  swapped %s", s_swap);
    newline(f, v);
}

static void rates(const json_t *kv, const hr_top_view *v, hr_top_frame *f) {
    const json_t *p = json_object_get(kv, "pool"), *r = json_object_get(kv, "rates");
    const json_t *c = json_object_get(kv, "counters");
    putf(f, "requests %d running, %d waiting   preemptions %.0f   refusals %.0f   prefix hits %.0f tokens",
         (int)num(p, "requests_running"), (int)num(p, "requests_waiting"), num(p, "preemptions"), num(c, "refusals"),
         num(p, "prefix_hit_tokens_total"));
    newline(f, v);
    char t50[24], t99[24], i50[24], i99[24];
    fmt_secs(r, "ttft_p50_seconds", t50, sizeof t50);
    fmt_secs(r, "ttft_p99_seconds", t99, sizeof t99);
    fmt_secs(r, "itl_p50_seconds", i50, sizeof i50);
    fmt_secs(r, "itl_p99_seconds", i99, sizeof i99);
    putf(f,
         "rates (%.0f s)  %.2f req/s  prompt %.1f tok/s  generated %.1f tok/s  TTFT p50 %s p99 %s  ITL p50 %s p99 %s",
         num(r, "window_seconds"), num(r, "requests_per_s"), num(r, "prompt_tokens_per_s"),
         num(r, "generated_tokens_per_s"), t50, t99, i50, i99);
    newline(f, v);
}

static void events(const json_t *kv, const hr_top_view *v, hr_top_frame *f, int max) {
    const json_t *ev = json_object_get(kv, "events");
    size_t n = json_array_size(ev);
    put(f, "events:");
    if (n == 0) put(f, " none");
    for (size_t i = n > (size_t)max ? n - (size_t)max : 0; i < n; i++) {
        const json_t *e = json_array_get(ev, i);
        const char *kind = str(e, "kind");
        time_t t = (time_t)num(e, "time");
        struct tm tm;
        char clock[16] = "";
        if (localtime_r(&t, &tm)) strftime(clock, sizeof clock, "%H:%M:%S", &tm);
        newline(f, v);
        putf(f, "  %s ", clock);
        if (!strcmp(kind, "refusal")) {
            color(f, v, C_YELLOW);
            putf(f, "refusal %s (%d): %s", str(e, "reason"), (int)num(e, "http"), str(e, "message"));
        } else if (!strcmp(kind, "evict")) {
            putf(f, "evict #%.0f: %d tokens", num(e, "request_id"), (int)num(e, "tokens"));
        } else {
            char b[32];
            hr_top_bytes(num(e, "bytes"), b, sizeof b);
            color(f, v, C_RED);
            putf(f, "%s #%.0f: %d tokens, %s", kind, num(e, "request_id"), (int)num(e, "tokens"), b);
        }
        color(f, v, C_RESET);
    }
    newline(f, v);
}

static void table(const json_t *kv, const hr_top_view *v, hr_top_frame *f, int max_rows) {
    const json_t *reqs = json_object_get(kv, "requests");
    size_t n = json_array_size(reqs);
    const json_t **rows = n ? malloc(sizeof *rows * n) : NULL;
    if (n && !rows) {
        f->failed = true;
        return;
    }
    for (size_t i = 0; i < n; i++) rows[i] = json_array_get(reqs, i);
    if (n > 1) qsort(rows, n, sizeof *rows, by_bytes); /* qsort's base may not be NULL, even for 0 */
    color(f, v, C_REV);
    putf(f, "%7s %-9s %4s %7s %11s %10s %10s %10s %7s %-9s %-10s %4s", "ID", "STATE", "PRIO", "AGE", "TOKENS", "KV NOW",
         "PEAK", "SHARED", "EVICTED", "K/V", "POLICY", "PRE");
    newline(f, v);
    size_t shown = max_rows > 0 && n > (size_t)max_rows ? (size_t)(max_rows - 1) : n;
    for (size_t i = 0; i < shown; i++) {
        const json_t *r = rows[i], *k = json_object_get(r, "kv");
        char now[32], peak[32], shared[32], tokens[32], kvf[32], age[16];
        hr_top_bytes(row_bytes(r), now, sizeof now);
        hr_top_bytes(num(k, "bytes_peak"), peak, sizeof peak);
        hr_top_bytes(num(r, "shared_bytes"), shared, sizeof shared);
        snprintf(tokens, sizeof tokens, "%d+%d", (int)num(r, "prompt_tokens"), (int)num(r, "completion_tokens"));
        snprintf(kvf, sizeof kvf, "%s/%s", str(k, "k_format"), str(k, "v_format"));
        double a = num(r, "age_seconds");
        snprintf(age, sizeof age, a < 60 ? "%.1fs" : "%.1fm", a < 60 ? a : a / 60);
        const char *phase = str(r, "phase");
        bool hot = !strcmp(phase, "preempted") || !strcmp(phase, "swapped");
        putf(f, "%7.0f ", num(r, "request_id"));
        color(f, v, hot ? C_RED : !strcmp(phase, "decode") ? C_USED : !strcmp(phase, "prefill") ? C_CACHED : C_DIM);
        putf(f, "%-9s", phase);
        color(f, v, C_RESET);
        putf(f, " %4d %7s %11s %10s %10s %10s %7d %-9s %-10s %4d", (int)num(r, "priority"), age, tokens, now, peak,
             shared, (int)num(k, "evicted_tokens"), kvf, str(k, "policy"), (int)num(k, "preemptions"));
        newline(f, v);
    }
    if (shown < n) {
        double rest = 0;
        for (size_t i = shown; i < n; i++) rest += row_bytes(rows[i]);
        char b[32];
        hr_top_bytes(rest, b, sizeof b);
        color(f, v, C_DIM);
        putf(f, "... and %zu more holding %s", n - shown, b);
        newline(f, v);
    }
    if (n == 0) {
        color(f, v, C_DIM);
        put(f, "no active requests");
        newline(f, v);
    }
    free(rows);
}

void hr_top_render(const json_t *kv, const hr_top_view *v, hr_top_frame *f) {
    f->cols = v->cols;
    f->col = 0;
    header(kv, v, f);
    if (!kv) return;
    pool_bar(json_object_get(kv, "pool"), v, f);
    rates(kv, v, f);
    int used = 6 + (v->status ? 1 : 0); /* header, bar, bytes, two rate lines, the table's head */
    int n_events = v->rows > 0 ? (v->rows - used - 4 > 12 ? 3 : 1) : 5;
    events(kv, v, f, n_events);
    int rows_left = v->rows > 0 ? v->rows - used - n_events - 2 : 0;
    table(kv, v, f, v->rows > 0 ? (rows_left > 1 ? rows_left : 1) : 0);
    if (!v->interactive) return;
    color(f, v, C_DIM);
    put(f, "q quits");
    color(f, v, C_RESET);
    raw(f, "\x1b[J", 3); /* clear below */
}

/* stats.c: percentiles and the run's summary. Pure: every figure is derived from the per-request
 * results and the poll samples, nothing from the clock. Latency figures count successful requests
 * only (a refusal's latency says nothing about serving); goodput counts those that also met the SLO. */
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "common/util.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

hr_bench_dist hr_bench_dist_of(double *v, int n) {
    hr_bench_dist d = {.n = n, .mean = -1, .p50 = -1, .p90 = -1, .p99 = -1, .max = -1};
    if (n <= 0) return d;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += v[i];
    d.mean = sum / n;
    d.p50 = hr_percentile(v, n, 50);
    d.p90 = hr_percentile(v, n, 90);
    d.p99 = hr_percentile(v, n, 99);
    d.max = v[n - 1];
    return d;
}

/* Output tokens of a request: usage's count where the server gave one, else the text events. */
static int out_tokens(const hr_bench_result *r) {
    return r->completion_tokens >= 0 ? r->completion_tokens : r->n_text_events;
}

/* The most intervals [start, end] open at once (an end at the same instant as a start closes first). */
static int peak_overlap(double *starts, double *ends, int n) {
    qsort(starts, (size_t)n, sizeof *starts, cmp_double);
    qsort(ends, (size_t)n, sizeof *ends, cmp_double);
    int i = 0, j = 0, open = 0, peak = 0;
    while (i < n) {
        if (j < n && ends[j] <= starts[i]) {
            open--;
            j++;
        } else {
            open++;
            i++;
            if (open > peak) peak = open;
        }
    }
    return peak;
}

static void add_code(hr_bench_report *o, int code) {
    for (int k = 0; k < o->n_codes; k++)
        if (o->codes[k] == code) {
            o->code_counts[k]++;
            return;
        }
    if (o->n_codes == HR_BENCH_MAX_CODES) return;
    o->codes[o->n_codes] = code;
    o->code_counts[o->n_codes++] = 1;
}

static void scale_dist(hr_bench_dist *d, double k) {
    if (d->n == 0) return;
    d->mean *= k;
    d->p50 *= k;
    d->p90 *= k;
    d->p99 *= k;
    d->max *= k;
}

void hr_bench_report_compute(const hr_bench_result *r, int n, const hr_bench_sample *s, int ns, double slo_ttft_s,
                             double slo_itl_s, hr_bench_report *out) {
    hr_bench_report o = {.slo_ttft_s = slo_ttft_s,
                         .slo_itl_s = slo_itl_s,
                         .peak_server_running = -1,
                         .peak_server_waiting = -1,
                         .pool_total_bytes = -1,
                         .pool_peak_used_bytes = -1};
    int n_gaps = 0;
    for (int i = 0; i < n; i++) n_gaps += r[i].status == HR_BENCH_OK ? r[i].n_gaps : 0;
    size_t nn = (size_t)(n > 0 ? n : 1);
    double *ttft = malloc(nn * sizeof *ttft), *e2e = malloc(nn * sizeof *e2e), *kvb = malloc(nn * sizeof *kvb);
    double *itl = malloc((size_t)(n_gaps > 0 ? n_gaps : 1) * sizeof *itl);
    double *a = malloc(nn * sizeof *a), *b = malloc(nn * sizeof *b), *c = malloc(nn * sizeof *c),
           *d = malloc(nn * sizeof *d);
    int n_ttft = 0, n_e2e = 0, n_kv = 0, n_itl = 0, n_stream = 0;
    double t_lo = 0, t_hi = 0;
    int64_t good_tokens = 0;
    for (int i = 0; i < n; i++) {
        const hr_bench_result *q = &r[i];
        o.n_sent++;
        if (i == 0 || q->t_sched < t_lo) t_lo = q->t_sched;
        if (q->t_end > t_hi) t_hi = q->t_end;
        if (a && b) {
            a[i] = q->t_sched;
            b[i] = q->t_end >= 0 ? q->t_end : q->t_sched;
        }
        if (q->status == HR_BENCH_REFUSED) {
            o.n_refused++;
            add_code(&o, q->http_code);
        }
        o.n_failed += q->status == HR_BENCH_FAILED;
        o.n_timed_out += q->status == HR_BENCH_TIMED_OUT;
        if (q->has_kv) {
            o.has_kv = true;
            o.n_with_kv++;
            if (kvb) kvb[n_kv++] = (double)q->kv_bytes_peak;
            o.prefix_hit_tokens += q->kv_prefix_hit_tokens;
            o.preemptions += q->kv_preemptions;
        }
        if (q->has_cached) {
            o.n_with_cached++;
            o.cached_tokens += q->cached_tokens;
        }
        if (q->t_first >= 0 && c && d) {
            c[n_stream] = q->t_first;
            d[n_stream++] = q->t_end >= 0 ? q->t_end : q->t_first;
        }
        if (q->status != HR_BENCH_OK) continue;
        o.n_ok++;
        int toks = out_tokens(q);
        o.output_tokens += toks;
        o.text_events += q->n_text_events;
        if (q->prompt_tokens > 0) o.prompt_tokens += q->prompt_tokens;
        if (toks < q->max_tokens) o.n_truncated++;
        if (q->ttft_s >= 0 && ttft) ttft[n_ttft++] = q->ttft_s;
        if (e2e) e2e[n_e2e++] = q->e2e_s;
        for (int k = 0; k < q->n_gaps; k++)
            if (itl) itl[n_itl++] = q->gaps_s[k];
        /* the SLO on decode is time per output token after the first, which does not depend on how
           many tokens a server packs into one chunk */
        double tpot = toks > 1 && q->t_first >= 0 ? (q->t_end - q->t_first) / (toks - 1) : 0;
        bool good =
            (slo_ttft_s <= 0 || (q->ttft_s >= 0 && q->ttft_s <= slo_ttft_s)) && (slo_itl_s <= 0 || tpot <= slo_itl_s);
        if (good) {
            o.n_good++;
            good_tokens += toks;
        }
    }
    o.wall_s = t_hi > t_lo ? t_hi - t_lo : 0;
    if (o.wall_s > 0) {
        o.req_per_s = o.n_ok / o.wall_s;
        o.out_tok_per_s = (double)o.output_tokens / o.wall_s;
        o.goodput_req_per_s = o.n_good / o.wall_s;
        o.goodput_tok_per_s = (double)good_tokens / o.wall_s;
    }
    o.ttft_ms = hr_bench_dist_of(ttft, ttft ? n_ttft : 0);
    o.itl_ms = hr_bench_dist_of(itl, itl ? n_itl : 0);
    o.e2e_ms = hr_bench_dist_of(e2e, e2e ? n_e2e : 0);
    scale_dist(&o.ttft_ms, 1000);
    scale_dist(&o.itl_ms, 1000);
    scale_dist(&o.e2e_ms, 1000);
    o.kv_bytes = hr_bench_dist_of(kvb, kvb ? n_kv : 0);
    if (a && b) o.peak_in_flight = peak_overlap(a, b, n);
    if (c && d) o.peak_streaming = peak_overlap(c, d, n_stream);
    for (int i = 0; i < ns; i++) {
        if (s[i].server_running > o.peak_server_running) o.peak_server_running = s[i].server_running;
        if (s[i].server_waiting > o.peak_server_waiting) o.peak_server_waiting = s[i].server_waiting;
        if (!s[i].has_pool) continue;
        o.has_pool = true;
        if (s[i].pool_used_bytes > o.pool_peak_used_bytes) o.pool_peak_used_bytes = s[i].pool_used_bytes;
        o.pool_total_bytes = s[i].pool_total_bytes;
    }
    free(ttft);
    free(e2e);
    free(kvb);
    free(itl);
    free(a);
    free(b);
    free(c);
    free(d);
    *out = o;
}

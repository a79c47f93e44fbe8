/* report.c: the report in three shapes: a table for people, one JSON object for scripts (the
 * summary plus every request), a CSV of one row per request for spreadsheets. Figures a server did not
 * report are left out of the table and null in JSON, never printed as zero. */
#include <jansson.h>
#include <string.h>

#include "bench/bench.h"

const char *hr_bench_status_name(hr_bench_status s) {
    static const char *const names[] = {"ok", "refused", "failed", "timed_out"};
    return (unsigned)s < HR_ARRAY_LEN(names) ? names[s] : "?";
}

static void dist_row(FILE *f, const char *name, const hr_bench_dist *d) {
    if (d->n == 0) {
        fprintf(f, "  %-6s %9s %9s %9s %9s %9s %7d\n", name, "-", "-", "-", "-", "-", 0);
        return;
    }
    fprintf(f, "  %-6s %9.1f %9.1f %9.1f %9.1f %9.1f %7d\n", name, d->p50, d->p90, d->p99, d->mean, d->max, d->n);
}

hr_status hr_bench_write_table(FILE *f, const hr_bench_meta *m, const hr_bench_report *o, const hr_bench_result *r,
                               int n, hr_error *err) {
    char b1[32], b2[32], b3[32];
    fprintf(f, "headroom bench: %s against %s (%s%s%s), seed %llu, ", m->pattern, m->url, m->endpoint,
            m->model ? ", model " : "", m->model ? m->model : "", (unsigned long long)m->seed);
    if (m->concurrency > 0)
        fprintf(f, "closed loop, concurrency %d\n", m->concurrency);
    else if (m->rate > 0)
        fprintf(f, "open loop, %.3g req/s\n", m->rate);
    else
        fprintf(f, "open loop, the trace's times\n");
    fprintf(f, "requests    sent %d, ok %d, refused %d", o->n_sent, o->n_ok, o->n_refused);
    for (int k = 0; k < o->n_codes; k++)
        fprintf(f, "%s%d: %d%s", k ? ", " : " (", o->codes[k], o->code_counts[k], k + 1 == o->n_codes ? ")" : "");
    fprintf(f, ", failed %d, timed out %d, ok but short of max_tokens %d\n", o->n_failed, o->n_timed_out,
            o->n_truncated);
    for (int i = 0; i < n; i++) {
        if (r[i].status != HR_BENCH_FAILED && r[i].status != HR_BENCH_TIMED_OUT && r[i].status != HR_BENCH_REFUSED)
            continue;
        bool seen = false;
        for (int k = 0; k < i && !seen; k++) seen = r[k].status == r[i].status && !strcmp(r[k].reason, r[i].reason);
        if (seen) continue;
        int count = 0;
        for (int k = i; k < n; k++) count += r[k].status == r[i].status && !strcmp(r[k].reason, r[i].reason);
        fprintf(f, "  %d %s", count, hr_bench_status_name(r[i].status));
        if (r[i].status == HR_BENCH_REFUSED) fprintf(f, " (HTTP %d)", r[i].http_code);
        fprintf(f, ": %s\n", r[i].reason);
    }
    fprintf(f, "throughput  %.2f req/s, %.1f output tok/s over %.2f s; goodput %.2f req/s, %.1f tok/s (%d of %d ok",
            o->req_per_s, o->out_tok_per_s, o->wall_s, o->goodput_req_per_s, o->goodput_tok_per_s, o->n_good, o->n_ok);
    if (o->slo_ttft_s > 0) fprintf(f, ", TTFT <= %g ms", o->slo_ttft_s * 1000);
    if (o->slo_itl_s > 0) fprintf(f, ", time per output token <= %g ms", o->slo_itl_s * 1000);
    fprintf(f, "%s)\n", o->slo_ttft_s > 0 || o->slo_itl_s > 0 ? "" : ", no SLO given");
    fprintf(f, "tokens      prompt %lld, output %lld in %lld text chunks (ok requests)\n", (long long)o->prompt_tokens,
            (long long)o->output_tokens, (long long)o->text_events);
    fprintf(f, "latency ms  %9s %9s %9s %9s %9s %7s\n", "p50", "p90", "p99", "mean", "max", "n");
    dist_row(f, "TTFT", &o->ttft_ms);
    dist_row(f, "ITL", &o->itl_ms);
    dist_row(f, "E2E", &o->e2e_ms);
    fprintf(f, "concurrency peak in flight %d, streaming %d", o->peak_in_flight, o->peak_streaming);
    if (o->peak_server_running >= 0)
        fprintf(f, "; server running %d, waiting %d", o->peak_server_running, o->peak_server_waiting);
    fputc('\n', f);
    if (o->has_pool)
        fprintf(f, "KV pool     peak %s of %s (%.1f%%)\n",
                hr_format_size((uint64_t)o->pool_peak_used_bytes, b1, sizeof b1),
                hr_format_size((uint64_t)o->pool_total_bytes, b2, sizeof b2),
                o->pool_total_bytes > 0 ? 100.0 * (double)o->pool_peak_used_bytes / (double)o->pool_total_bytes : 0);
    if (o->has_kv) {
        fprintf(f, "KV/request  peak bytes p50 %s, p99 %s (%d requests reported usage.kv)\n",
                hr_format_size((uint64_t)o->kv_bytes.p50, b1, sizeof b1),
                hr_format_size((uint64_t)o->kv_bytes.p99, b3, sizeof b3), o->n_with_kv);
        fprintf(f, "KV events   prefix-cache hit tokens %lld, preemptions %lld\n", (long long)o->prefix_hit_tokens,
                (long long)o->preemptions);
    }
    if (o->n_with_cached > 0)
        fprintf(f,
                "cached      prompt tokens from the server's cache %lld (usage.prompt_tokens_details, %d requests)\n",
                (long long)o->cached_tokens, o->n_with_cached);
    if (!o->has_pool && !o->has_kv)
        fprintf(f, "KV          none reported (no usage.kv in a response, no pool from GET /v1/kv)\n");
    if (ferror(f)) return hr_error_set(err, HR_ERR_IO, "writing the report failed");
    return HR_OK;
}

static json_t *dist_json(const hr_bench_dist *d) {
    if (d->n == 0) return json_pack("{s:i, s:n, s:n, s:n, s:n, s:n}", "n", 0, "p50", "p90", "p99", "mean", "max");
    return json_pack("{s:i, s:f, s:f, s:f, s:f, s:f}", "n", d->n, "p50", d->p50, "p90", d->p90, "p99", d->p99, "mean",
                     d->mean, "max", d->max);
}

static json_t *maybe_int(bool has, int64_t v) { return has ? json_integer((json_int_t)v) : json_null(); }

static json_t *request_json(const hr_bench_result *q, int i) {
    json_t *o = json_pack("{s:i, s:s, s:i, s:i, s:f}", "index", i, "status", hr_bench_status_name(q->status),
                          "http_code", q->http_code, "max_tokens", q->max_tokens, "t_sched_s", q->t_sched);
    json_object_set_new(o, "reason", q->status == HR_BENCH_OK ? json_null() : json_string(q->reason));
    json_object_set_new(o, "ttft_ms", q->ttft_s >= 0 ? json_real(q->ttft_s * 1000) : json_null());
    json_object_set_new(o, "e2e_ms", q->e2e_s >= 0 ? json_real(q->e2e_s * 1000) : json_null());
    json_object_set_new(o, "text_events", json_integer(q->n_text_events));
    json_object_set_new(o, "prompt_tokens", maybe_int(q->prompt_tokens >= 0, q->prompt_tokens));
    json_object_set_new(o, "completion_tokens", maybe_int(q->completion_tokens >= 0, q->completion_tokens));
    json_object_set_new(o, "finish_reason", q->finish_reason[0] ? json_string(q->finish_reason) : json_null());
    json_object_set_new(o, "kv_bytes_peak", maybe_int(q->has_kv, q->kv_bytes_peak));
    json_object_set_new(o, "kv_prefix_hit_tokens", maybe_int(q->has_kv, q->kv_prefix_hit_tokens));
    json_object_set_new(o, "kv_preemptions", maybe_int(q->has_kv, q->kv_preemptions));
    json_object_set_new(o, "server_ttft_ms",
                        q->has_kv && q->kv_first_token_s > 0 ? json_real(q->kv_first_token_s * 1000) : json_null());
    return o;
}

hr_status hr_bench_write_json(FILE *f, const hr_bench_meta *m, const hr_bench_report *o, const hr_bench_result *r,
                              int n, hr_error *err) {
    json_t *root = json_object();
    json_object_set_new(root, "target",
                        json_pack("{s:s, s:s, s:o}", "url", m->url, "endpoint", m->endpoint, "model",
                                  m->model ? json_string(m->model) : json_null()));
    json_object_set_new(root, "run",
                        json_pack("{s:s, s:I, s:s, s:i, s:f, s:f, s:i, s:f}", "pattern", m->pattern, "seed",
                                  (json_int_t)m->seed, "loop", m->concurrency > 0 ? "closed" : "open", "concurrency",
                                  m->concurrency, "rate", m->rate, "scale", m->scale, "requests_bound", m->n_requests,
                                  "duration_bound_s", m->duration_s));
    json_t *codes = json_object();
    for (int k = 0; k < o->n_codes; k++) {
        char key[16];
        snprintf(key, sizeof key, "%d", o->codes[k]);
        json_object_set_new(codes, key, json_integer(o->code_counts[k]));
    }
    json_t *failures = json_object();
    for (int i = 0; i < n; i++) {
        if (r[i].status != HR_BENCH_FAILED && r[i].status != HR_BENCH_TIMED_OUT) continue;
        json_t *c = json_object_get(failures, r[i].reason);
        json_object_set_new(failures, r[i].reason, json_integer(c ? json_integer_value(c) + 1 : 1));
    }
    json_object_set_new(root, "requests",
                        json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:o, s:o}", "sent", o->n_sent, "ok", o->n_ok,
                                  "refused", o->n_refused, "failed", o->n_failed, "timed_out", o->n_timed_out,
                                  "short_of_max_tokens", o->n_truncated, "refusals_by_code", codes, "failure_reasons",
                                  failures));
    json_object_set_new(root, "throughput",
                        json_pack("{s:f, s:f, s:f, s:f, s:f, s:i, s:o, s:o}", "wall_s", o->wall_s, "requests_per_s",
                                  o->req_per_s, "output_tokens_per_s", o->out_tok_per_s, "goodput_requests_per_s",
                                  o->goodput_req_per_s, "goodput_tokens_per_s", o->goodput_tok_per_s, "good", o->n_good,
                                  "slo_ttft_ms", o->slo_ttft_s > 0 ? json_real(o->slo_ttft_s * 1000) : json_null(),
                                  "slo_itl_ms", o->slo_itl_s > 0 ? json_real(o->slo_itl_s * 1000) : json_null()));
    json_object_set_new(root, "tokens",
                        json_pack("{s:I, s:I, s:I}", "prompt", (json_int_t)o->prompt_tokens, "output",
                                  (json_int_t)o->output_tokens, "text_chunks", (json_int_t)o->text_events));
    json_object_set_new(root, "ttft_ms", dist_json(&o->ttft_ms));
    json_object_set_new(root, "itl_ms", dist_json(&o->itl_ms));
    json_object_set_new(root, "e2e_ms", dist_json(&o->e2e_ms));
    json_object_set_new(root, "concurrency",
                        json_pack("{s:i, s:i, s:o, s:o}", "peak_in_flight", o->peak_in_flight, "peak_streaming",
                                  o->peak_streaming, "peak_server_running",
                                  maybe_int(o->peak_server_running >= 0, o->peak_server_running), "peak_server_waiting",
                                  maybe_int(o->peak_server_waiting >= 0, o->peak_server_waiting)));
    json_t *kv = json_object();
    json_object_set_new(kv, "reported", json_boolean(o->has_kv || o->has_pool));
    json_object_set_new(kv, "requests_with_kv", json_integer(o->n_with_kv));
    json_object_set_new(kv, "pool_peak_used_bytes", maybe_int(o->has_pool, o->pool_peak_used_bytes));
    json_object_set_new(kv, "pool_total_bytes", maybe_int(o->has_pool, o->pool_total_bytes));
    json_object_set_new(kv, "bytes_per_request_p50", maybe_int(o->has_kv, (int64_t)o->kv_bytes.p50));
    json_object_set_new(kv, "bytes_per_request_p99", maybe_int(o->has_kv, (int64_t)o->kv_bytes.p99));
    json_object_set_new(kv, "prefix_hit_tokens", maybe_int(o->has_kv, o->prefix_hit_tokens));
    json_object_set_new(kv, "preemptions", maybe_int(o->has_kv, o->preemptions));
    json_object_set_new(kv, "openai_cached_tokens", maybe_int(o->n_with_cached > 0, o->cached_tokens));
    json_object_set_new(root, "kv", kv);
    json_t *per = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(per, request_json(&r[i], i));
    json_object_set_new(root, "per_request", per);
    int rc = json_dumpf(root, f, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    fputc('\n', f);
    if (rc != 0 || ferror(f)) return hr_error_set(err, HR_ERR_IO, "writing the JSON report failed");
    return HR_OK;
}

static void csv_text(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

hr_status hr_bench_write_csv(FILE *f, const hr_bench_result *r, int n, hr_error *err) {
    fprintf(f, "index,status,http_code,reason,max_tokens,prompt_tokens,completion_tokens,text_events,t_sched_s,"
               "ttft_ms,e2e_ms,itl_mean_ms,itl_max_ms,finish_reason,kv_bytes_peak,kv_prefix_hit_tokens,"
               "kv_preemptions\n");
    for (int i = 0; i < n; i++) {
        const hr_bench_result *q = &r[i];
        double sum = 0, mx = 0;
        for (int k = 0; k < q->n_gaps; k++) {
            sum += q->gaps_s[k];
            if (q->gaps_s[k] > mx) mx = q->gaps_s[k];
        }
        fprintf(f, "%d,%s,%d,", i, hr_bench_status_name(q->status), q->http_code);
        csv_text(f, q->status == HR_BENCH_OK ? "" : q->reason);
        fprintf(f, ",%d,", q->max_tokens);
        if (q->prompt_tokens >= 0) fprintf(f, "%d", q->prompt_tokens);
        fputc(',', f);
        if (q->completion_tokens >= 0) fprintf(f, "%d", q->completion_tokens);
        fprintf(f, ",%d,%.4f,", q->n_text_events, q->t_sched);
        if (q->ttft_s >= 0) fprintf(f, "%.3f", q->ttft_s * 1000);
        fputc(',', f);
        if (q->e2e_s >= 0) fprintf(f, "%.3f", q->e2e_s * 1000);
        fputc(',', f);
        if (q->n_gaps)
            fprintf(f, "%.3f,%.3f", sum / q->n_gaps * 1000, mx * 1000);
        else
            fputc(',', f);
        fprintf(f, ",%s,", q->finish_reason);
        if (q->has_kv)
            fprintf(f, "%lld,%lld,%lld", (long long)q->kv_bytes_peak, (long long)q->kv_prefix_hit_tokens,
                    (long long)q->kv_preemptions);
        else
            fputs(",,", f);
        fputc('\n', f);
    }
    if (ferror(f)) return hr_error_set(err, HR_ERR_IO, "writing the CSV failed");
    return HR_OK;
}

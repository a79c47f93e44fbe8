/* test_bench.c: the pure parts of `headroom bench`: patterns are a function of their seed and stay in
 * their documented ranges, arrivals, the trace line parser on every kind of bad line and the trace
 * loader's whole-file checks, percentiles, the SSE reader fed byte by byte (with garbage and error
 * events), and the report's counts, goodput and peak concurrency on hand-made results. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "common/util.h"
#include "harness.h"

static int n_words(const char *s) {
    int n = *s ? 1 : 0;
    for (; *s; s++) n += *s == ' ';
    return n;
}

static void test_pattern_names(void) {
    hr_bench_pattern p;
    hr_error err;
    const char *names[] = {"long-few", "short-burst", "prefill-heavy", "decode-heavy", "shared-prefix", "mixed"};
    for (int i = 0; i < 6; i++) {
        CHECK(hr_bench_pattern_parse(names[i], &p, &err) == HR_OK && (int)p == i);
        CHECK(!strcmp(hr_bench_pattern_name(p), names[i]));
    }
    CHECK(hr_bench_pattern_parse("long_few", &p, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "'long_few'"));
    CHECK(hr_bench_pattern_parse("", &p, &err) == HR_ERR_INVALID_ARG);
    CHECK(hr_bench_pattern_parse("trace", &p, &err) == HR_ERR_INVALID_ARG);
}

static void test_pattern_determinism(void) {
    static const int lo_w[] = {600, 8, 300, 8, 10}, hi_w[] = {1000, 32, 600, 32, 40};
    static const int lo_t[] = {128, 8, 4, 200, 16}, hi_t[] = {256, 32, 16, 400, 64};
    hr_error err;
    for (int p = 0; p <= HR_BENCH_MIXED; p++) {
        int differ = 0, kinds[6] = {0};
        for (int i = 0; i < 40; i++) {
            hr_bench_spec a, b, c;
            CHECK(hr_bench_pattern_spec((hr_bench_pattern)p, 7, i, 1, &a, &err) == HR_OK);
            CHECK(hr_bench_pattern_spec((hr_bench_pattern)p, 7, i, 1, &b, &err) == HR_OK);
            CHECK(hr_bench_pattern_spec((hr_bench_pattern)p, 8, i, 1, &c, &err) == HR_OK);
            CHECKF(!strcmp(a.prompt, b.prompt) && a.max_tokens == b.max_tokens && a.prefix_id == b.prefix_id,
                   "pattern %d request %d differs for one seed", p, i);
            differ += strcmp(a.prompt, c.prompt) != 0 || a.max_tokens != c.max_tokens;
            int k = a.kind;
            CHECK(k >= 0 && k < HR_BENCH_MIXED && (p == HR_BENCH_MIXED || k == p));
            kinds[k]++;
            int w = n_words(a.prompt);
            CHECKF(w >= lo_w[k] && w <= hi_w[k], "pattern %d kind %d: %d words", p, k, w);
            CHECKF(a.max_tokens >= lo_t[k] && a.max_tokens <= hi_t[k], "pattern %d kind %d: %d tokens", p, k,
                   a.max_tokens);
            if (k == HR_BENCH_SHARED_PREFIX) {
                CHECK(a.prefix && a.prefix_id >= 0 && a.prefix_id < HR_BENCH_N_SHARED_PREFIXES);
                CHECK(n_words(a.prefix) == 200);
                /* the system prompts are the same for every seed */
                if (c.prefix_id == a.prefix_id) CHECK(!strcmp(a.prefix, c.prefix));
            } else {
                CHECK(!a.prefix && a.prefix_id == -1);
            }
            hr_bench_spec_free(&a);
            hr_bench_spec_free(&b);
            hr_bench_spec_free(&c);
        }
        CHECKF(differ > 30, "pattern %d: seeds 7 and 8 gave %d different requests of 40", p, differ);
        if (p == HR_BENCH_MIXED) CHECK(kinds[HR_BENCH_SHORT_BURST] > 0 && kinds[HR_BENCH_SHARED_PREFIX] > 0);
    }
    /* four system prompts, all different, and a run of 40 uses each */
    char *seen[HR_BENCH_N_SHARED_PREFIXES] = {0};
    for (int i = 0; i < 40; i++) {
        hr_bench_spec s;
        CHECK(hr_bench_pattern_spec(HR_BENCH_SHARED_PREFIX, 3, i, 1, &s, &err) == HR_OK);
        if (!seen[s.prefix_id]) seen[s.prefix_id] = strdup(s.prefix);
        hr_bench_spec_free(&s);
    }
    for (int k = 0; k < HR_BENCH_N_SHARED_PREFIXES; k++) {
        CHECK(seen[k] != NULL);
        for (int j = 0; j < k; j++) CHECK(seen[k] && seen[j] && strcmp(seen[k], seen[j]));
    }
    for (int k = 0; k < HR_BENCH_N_SHARED_PREFIXES; k++) free(seen[k]);
    /* scale shrinks every length, never below 1 */
    hr_bench_spec s;
    CHECK(hr_bench_pattern_spec(HR_BENCH_LONG_FEW, 1, 0, 0.1, &s, &err) == HR_OK);
    CHECK(n_words(s.prompt) >= 60 && n_words(s.prompt) <= 100 && s.max_tokens >= 13 && s.max_tokens <= 26);
    hr_bench_spec_free(&s);
    CHECK(hr_bench_pattern_spec(HR_BENCH_PREFILL_HEAVY, 1, 0, 0.01, &s, &err) == HR_OK);
    CHECK(s.max_tokens == 1 && n_words(s.prompt) >= 3 && n_words(s.prompt) <= 6);
    hr_bench_spec_free(&s);
    CHECK(hr_bench_pattern_spec(HR_BENCH_TRACE, 1, 0, 1, &s, &err) == HR_ERR_INVALID_ARG);
    CHECK(hr_bench_pattern_spec(HR_BENCH_MIXED, 1, -1, 1, &s, &err) == HR_ERR_INVALID_ARG);
    CHECK(hr_bench_pattern_spec(HR_BENCH_MIXED, 1, 0, 0, &s, &err) == HR_ERR_INVALID_ARG);
}

/* hr_bench_fit_scale: at the scale it picks for a context, every request the pattern draws (checked
 * over 300 seeds' first requests) asks for at most the context at HR_BENCH_TOKENS_PER_WORD tokens a
 * word; the max lengths are the ranges' upper ends (some draw reaches them); no context: scale 1. */
static void test_fit_scale(void) {
    hr_error err = {0};
    CHECK(hr_bench_fit_scale(HR_BENCH_SHARED_PREFIX, 0) == 1);
    CHECK(hr_bench_fit_scale(HR_BENCH_SHORT_BURST, 4096) == 1);
    double f = hr_bench_fit_scale(HR_BENCH_SHARED_PREFIX, 512);
    CHECK(f > 0.62 && f < 0.621); /* 0.95 x 512 / (240 x 3 + 64) */
    const int ctxs[] = {128, 512, 2048};
    for (int p = 0; p < HR_BENCH_TRACE; p++) {
        int max_w = 0, max_o = 0, seen_w = 0, seen_o = 0;
        hr_bench_pattern_max_len((hr_bench_pattern)p, &max_w, &max_o);
        for (int c = 0; c < 3; c++) {
            double sc = hr_bench_fit_scale((hr_bench_pattern)p, ctxs[c]);
            bool fits = true;
            for (int seed = 0; seed < 300; seed++) {
                hr_bench_spec s;
                if (hr_bench_pattern_spec((hr_bench_pattern)p, (uint64_t)seed, 0, sc, &s, &err) != HR_OK) {
                    fits = false;
                    break;
                }
                int w = n_words(s.prompt) + (s.prefix ? n_words(s.prefix) : 0);
                if (w * HR_BENCH_TOKENS_PER_WORD + s.max_tokens > ctxs[c] && sc > 0.01) fits = false;
                hr_bench_spec_free(&s);
            }
            CHECK(fits);
        }
        for (int seed = 0; seed < 2000; seed++) {
            hr_bench_spec s;
            if (hr_bench_pattern_spec((hr_bench_pattern)p, (uint64_t)seed, 0, 1, &s, &err) != HR_OK) break;
            int w = n_words(s.prompt) + (s.prefix ? n_words(s.prefix) : 0);
            if (w > seen_w) seen_w = w;
            if (s.max_tokens > seen_o) seen_o = s.max_tokens;
            hr_bench_spec_free(&s);
        }
        CHECK(seen_w <= max_w && seen_o <= max_o && seen_w * 10 >= max_w * 9 && seen_o * 10 >= max_o * 9);
    }
}

static void test_arrivals(void) {
    hr_bench_arrivals a, b;
    hr_bench_arrivals_init(&a, HR_BENCH_DECODE_HEAVY, 5, 10);
    hr_bench_arrivals_init(&b, HR_BENCH_DECODE_HEAVY, 5, 10);
    double last = -1, t = 0;
    bool same = true, increasing = true;
    for (int i = 0; i < 5000; i++) {
        t = hr_bench_arrivals_next(&a);
        same &= t == hr_bench_arrivals_next(&b);
        increasing &= t > last;
        last = t;
    }
    CHECK(same && increasing);
    /* 5000 exponential gaps of mean 0.1 s: the sum is 500 s within a few percent (sd ~ 1.4%) */
    CHECKF(t > 450 && t < 550, "5000 Poisson arrivals at 10/s end at %g s", t);
    hr_bench_arrivals_init(&a, HR_BENCH_SHORT_BURST, 5, 10);
    int in_burst = 0;
    last = hr_bench_arrivals_next(&a);
    CHECK(last == 0);
    for (int i = 0; i < 5000; i++) {
        t = hr_bench_arrivals_next(&a);
        CHECK(t > last);
        in_burst += t - last < 0.0051;
        last = t;
    }
    /* bursts of 4..16 (mean 10): about 9 of 10 gaps are the 5 ms inside a burst */
    CHECKF(in_burst > 4000 && in_burst < 4800, "%d of 5000 gaps inside bursts", in_burst);
    CHECKF(t > 400 && t < 600, "short-burst at 10/s: 5000 arrivals end at %g s", t);
}

static hr_status parse(const char *line, hr_bench_line_kind *kind, hr_bench_spec *s, hr_error *err) {
    memset(s, 0, sizeof *s);
    return hr_bench_trace_parse_line(line, strlen(line), 9, kind, s, err);
}

static void test_trace_lines(void) {
    hr_bench_line_kind kind;
    hr_bench_spec s;
    hr_error err;
    CHECK(parse("{\"prompt\": \"hello there\", \"max_tokens\": 5}\n", &kind, &s, &err) == HR_OK);
    CHECK(kind == HR_BENCH_LINE_REQUEST && !strcmp(s.prompt, "hello there") && s.max_tokens == 5 && s.t_s == -1 &&
          !s.prefix);
    hr_bench_spec_free(&s);
    CHECK(parse("{\"prompt_words\": 12, \"max_tokens\": 1, \"t\": 2.5, \"system\": \"be brief\", \"x\": [1]}", &kind,
                &s, &err) == HR_OK);
    CHECK(kind == HR_BENCH_LINE_REQUEST && n_words(s.prompt) == 12 && s.t_s == 2.5 && !strcmp(s.prefix, "be brief"));
    hr_bench_spec_free(&s);
    CHECK(parse("", &kind, &s, &err) == HR_OK && kind == HR_BENCH_LINE_SKIP);
    CHECK(parse("  \t\r\n", &kind, &s, &err) == HR_OK && kind == HR_BENCH_LINE_SKIP);
    CHECK(parse("# a comment {", &kind, &s, &err) == HR_OK && kind == HR_BENCH_LINE_SKIP);
    CHECK(hr_bench_trace_parse_line(NULL, 5, 1, &kind, &s, &err) == HR_OK && kind == HR_BENCH_LINE_SKIP);
    /* every way a line can be wrong, with the word its message must contain */
    static const struct {
        const char *line;
        hr_status st;
        const char *says;
    } bad[] = {
        {"{\"prompt\": \"a\", \"max_tokens\": 5", HR_ERR_FORMAT, "not JSON"},
        {"prompt=a max_tokens=5", HR_ERR_FORMAT, "not JSON"},
        {"{\"prompt\": \"a\", \"max_tokens\": 5} trailing", HR_ERR_FORMAT, "not JSON"},
        {"[1, 2]", HR_ERR_FORMAT, "array"},
        {"42", HR_ERR_FORMAT, "object"},
        {"{\"prompt\": \"a\"}", HR_ERR_RANGE, "max_tokens"},
        {"{\"prompt\": \"a\", \"max_tokens\": \"5\"}", HR_ERR_FORMAT, "max_tokens"},
        {"{\"prompt\": \"a\", \"max_tokens\": 2.5}", HR_ERR_FORMAT, "max_tokens"},
        {"{\"prompt\": \"a\", \"max_tokens\": 0}", HR_ERR_RANGE, "max_tokens"},
        {"{\"prompt\": \"a\", \"max_tokens\": 1000001}", HR_ERR_RANGE, "max_tokens"},
        {"{\"max_tokens\": 3}", HR_ERR_RANGE, "prompt"},
        {"{\"prompt\": \"a\", \"prompt_words\": 3, \"max_tokens\": 3}", HR_ERR_RANGE, "not both"},
        {"{\"prompt\": 7, \"max_tokens\": 3}", HR_ERR_FORMAT, "prompt"},
        {"{\"prompt\": \"\", \"max_tokens\": 3}", HR_ERR_RANGE, "empty"},
        {"{\"prompt_words\": 0, \"max_tokens\": 3}", HR_ERR_RANGE, "prompt_words"},
        {"{\"prompt_words\": \"many\", \"max_tokens\": 3}", HR_ERR_FORMAT, "prompt_words"},
        {"{\"prompt\": \"a\", \"max_tokens\": 3, \"t\": -1}", HR_ERR_RANGE, "'t'"},
        {"{\"prompt\": \"a\", \"max_tokens\": 3, \"t\": \"soon\"}", HR_ERR_FORMAT, "'t'"},
        {"{\"prompt\": \"a\", \"max_tokens\": 3, \"system\": 1}", HR_ERR_FORMAT, "system"},
        {"{\"prompt\": \"a\", \"max_tokens\": 3, \"max_tokens\": 4}", HR_ERR_FORMAT, "duplicate"},
    };
    for (size_t i = 0; i < HR_ARRAY_LEN(bad); i++) {
        memset(&err, 0, sizeof err);
        hr_bench_spec untouched = {.max_tokens = -77};
        s = untouched;
        hr_status st = hr_bench_trace_parse_line(bad[i].line, strlen(bad[i].line), 1, &kind, &s, &err);
        CHECKF(st == bad[i].st && strstr(err.msg, bad[i].says) && s.max_tokens == -77 && !s.prompt,
               "line %s: status %d, message '%s'", bad[i].line, (int)st, err.msg);
    }
    /* a length that stops mid-line is what the parser reads, nothing past it */
    const char *two = "{\"prompt\": \"a\", \"max_tokens\": 3}{\"oops\"";
    CHECK(hr_bench_trace_parse_line(two, 32, 1, &kind, &s, &err) == HR_OK && kind == HR_BENCH_LINE_REQUEST);
    hr_bench_spec_free(&s);
}

static const char *write_trace(const char *name, const char *text) {
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", hr_test_tmpdir(), name);
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    return path;
}

static void test_trace_files(void) {
    hr_bench_spec *v = NULL;
    int n = -1;
    hr_error err;
    const char *p = write_trace("good.jsonl", "# recorded\n{\"prompt\": \"a b\", \"max_tokens\": 2, \"t\": 0}\n\n"
                                              "{\"prompt_words\": 4, \"max_tokens\": 3, \"t\": 0.5}\n");
    CHECK(hr_bench_trace_load(p, 1, &v, &n, &err) == HR_OK && n == 2);
    if (n == 2) CHECK(v[0].max_tokens == 2 && v[1].t_s == 0.5 && n_words(v[1].prompt) == 4);
    for (int i = 0; i < n; i++) hr_bench_spec_free(&v[i]);
    free(v);
    static const struct {
        const char *text, *says;
    } bad[] = {
        {"{\"prompt\": \"a\", \"max_tokens\": 2}\n{\"prompt\": \"a\"}\n", ":2: 'max_tokens' is missing"},
        {"{\"prompt\": \"a\", \"max_tokens\": 2, \"t\": 1}\n{\"prompt\": \"a\", \"max_tokens\": 2}\n", ":2: 't'"},
        {"{\"prompt\": \"a\", \"max_tokens\": 2}\n{\"prompt\": \"a\", \"max_tokens\": 2, \"t\": 1}\n", ":2: 't'"},
        {"{\"prompt\": \"a\", \"max_tokens\": 2, \"t\": 3}\n\n{\"prompt\": \"a\", \"max_tokens\": 2, \"t\": 1}\n",
         ":3: 't' is 1, before"},
        {"", "no request lines"},
        {"# only a comment\n\n", "no request lines"},
    };
    for (size_t i = 0; i < HR_ARRAY_LEN(bad); i++) {
        v = NULL;
        n = -1;
        p = write_trace("bad.jsonl", bad[i].text);
        hr_status st = hr_bench_trace_load(p, 1, &v, &n, &err);
        CHECKF(st != HR_OK && strstr(err.msg, bad[i].says) && !v && n == -1, "trace %zu: '%s'", i, err.msg);
    }
    CHECK(hr_bench_trace_load("/nonexistent/trace.jsonl", 1, &v, &n, &err) == HR_ERR_IO &&
          strstr(err.msg, "/nonexistent/trace.jsonl"));
}

static void test_percentiles(void) {
    double v[] = {4, 1, 3, 2};
    CHECK(hr_percentile(NULL, 0, 50) == -1);
    double one = 7;
    CHECK(hr_percentile(&one, 1, 0) == 7 && hr_percentile(&one, 1, 99) == 7);
    hr_bench_dist d = hr_bench_dist_of(v, 4);
    /* sorted 1 2 3 4: rank p/100 * 3 */
    CHECK(v[0] == 1 && v[3] == 4);
    CHECK(d.n == 4 && d.mean == 2.5 && d.p50 == 2.5 && d.max == 4);
    CHECKF(d.p90 > 3.7 - 1e-12 && d.p90 < 3.7 + 1e-12, "p90 %g", d.p90);
    CHECKF(d.p99 > 3.97 - 1e-12 && d.p99 < 3.97 + 1e-12, "p99 %g", d.p99);
    CHECK(hr_percentile(v, 4, 0) == 1 && hr_percentile(v, 4, 100) == 4);
    CHECK(hr_percentile(v, 4, 100.0 / 3) == 2);
    double many[101];
    for (int i = 0; i <= 100; i++) many[i] = 100 - i;
    d = hr_bench_dist_of(many, 101);
    CHECK(d.p50 == 50 && d.p90 == 90 && d.p99 == 99 && d.mean == 50);
    d = hr_bench_dist_of(NULL, 0);
    CHECK(d.n == 0 && d.p50 == -1 && d.mean == -1);
}

static const char stream[] =
    ": keep-alive\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"text\":\"Once\",\"finish_reason\":null}]}\r\n\r\n"
    "event: message\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" upon\"}}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}]}\n\n"
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2,\"kv\":{\"bytes_peak\":4096,"
    "\"blocks_peak\":1,\"prefix_hit_tokens\":16,\"preemptions\":1,\"queued_seconds\":0.5}}}\n\n"
    "data: [DONE]\n\n";

static void test_sse(void) {
    hr_bench_sse s = {0};
    /* byte by byte: every split point of every line */
    for (size_t i = 0; i < sizeof stream - 1; i++) CHECK(hr_bench_sse_feed(&s, stream + i, 1, (double)i));
    CHECK(s.done && s.n_events == 5 && s.n_bad_events == 0 && s.n_text_events == 2);
    CHECK(s.has_usage && s.prompt_tokens == 4 && s.completion_tokens == 2);
    CHECK(s.has_kv && s.kv_bytes_peak == 4096 && s.kv_prefix_hit_tokens == 16 && s.kv_preemptions == 1 &&
          s.kv_queued_s == 0.5);
    CHECK(!s.has_cached);
    CHECK(!strcmp(s.finish_reason, "length") && !s.error[0]);
    /* the text events are stamped when their line completed */
    const char *once = strstr(stream, "Once\"");
    size_t end_once = (size_t)(strchr(once, '\n') - stream);
    CHECK(s.t_text[0] == (double)end_once);
    hr_bench_sse_free(&s);

    /* without usage.kv: no KV; without usage: none */
    memset(&s, 0, sizeof s);
    const char *plain =
        "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":"
        "9,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\ndata: [DONE]\n\n";
    CHECK(hr_bench_sse_feed(&s, plain, strlen(plain), 1));
    CHECK(s.done && s.has_usage && !s.has_kv && s.n_text_events == 1);
    CHECK(s.has_cached && s.cached_tokens == 8 && s.prompt_tokens == 9);
    hr_bench_sse_free(&s);

    /* garbage: an HTML page, then JSON that is not an object */
    memset(&s, 0, sizeof s);
    const char *html = "<html>\n<body>Bad Gateway</body>\n";
    CHECK(hr_bench_sse_feed(&s, html, strlen(html), 1));
    CHECK(!s.done && s.n_events == 0 && s.n_bad_events == 2 && strstr(s.error, "<html>"));
    hr_bench_sse_free(&s);
    memset(&s, 0, sizeof s);
    const char *notobj = "data: [1,2\n\ndata: \"x\"\n\n";
    CHECK(hr_bench_sse_feed(&s, notobj, strlen(notobj), 1));
    CHECK(s.n_bad_events == 2 && s.n_events == 0 && strstr(s.error, "[1,2"));
    hr_bench_sse_free(&s);

    /* an error event (OpenAI's shape, mid-stream) */
    memset(&s, 0, sizeof s);
    const char *errev =
        "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"error\":{\"message\":\"engine failed\"}}\n\n";
    CHECK(hr_bench_sse_feed(&s, errev, strlen(errev), 1));
    CHECK(s.n_events == 2 && s.n_text_events == 1 && !strcmp(s.error, "engine failed") && !s.done);
    hr_bench_sse_free(&s);
}

static hr_bench_result ok_result(double t0, double ttft, double e2e, int tokens, int max_tokens) {
    hr_bench_result r = {.status = HR_BENCH_OK,
                         .http_code = 200,
                         .max_tokens = max_tokens,
                         .t_sched = t0,
                         .t_first = t0 + ttft,
                         .t_end = t0 + e2e,
                         .ttft_s = ttft,
                         .e2e_s = e2e,
                         .n_text_events = tokens,
                         .prompt_tokens = 10,
                         .completion_tokens = tokens};
    r.n_gaps = tokens - 1;
    r.gaps_s = malloc((size_t)(tokens > 1 ? tokens - 1 : 1) * sizeof *r.gaps_s);
    for (int k = 0; k < tokens - 1; k++) r.gaps_s[k] = (e2e - ttft) / (tokens - 1);
    return r;
}

static void test_report(void) {
    hr_bench_result *r = calloc(6, sizeof *r);
    r[0] = ok_result(0, 0.1, 1.1, 11, 11);   /* TPOT 100 ms */
    r[1] = ok_result(0, 0.5, 1.5, 11, 11);   /* TTFT over 200 ms */
    r[2] = ok_result(1.0, 0.1, 2.9, 11, 20); /* TPOT 280 ms, short of max_tokens */
    r[3] = (hr_bench_result){.status = HR_BENCH_REFUSED,
                             .http_code = 429,
                             .t_sched = 1,
                             .t_first = -1,
                             .t_end = 1.01,
                             .ttft_s = -1,
                             .e2e_s = 0.01,
                             .prompt_tokens = -1,
                             .completion_tokens = -1};
    r[4] = r[3];
    r[4].http_code = 401;
    r[5] = (hr_bench_result){.status = HR_BENCH_FAILED,
                             .t_sched = 2,
                             .t_first = -1,
                             .t_end = 4,
                             .ttft_s = -1,
                             .e2e_s = 2,
                             .prompt_tokens = -1,
                             .completion_tokens = -1};
    r[0].has_kv = r[1].has_kv = true;
    r[0].kv_bytes_peak = 1000;
    r[1].kv_bytes_peak = 3000;
    r[1].kv_prefix_hit_tokens = 32;
    r[0].kv_preemptions = 2;
    r[2].has_cached = true;
    r[2].cached_tokens = 7;
    hr_bench_sample s[2] = {{.t_s = 0,
                             .has_pool = true,
                             .pool_used_bytes = 10,
                             .pool_total_bytes = 100,
                             .server_running = 2,
                             .server_waiting = 0},
                            {.t_s = 1,
                             .has_pool = true,
                             .pool_used_bytes = 40,
                             .pool_total_bytes = 100,
                             .server_running = 1,
                             .server_waiting = 3}};
    hr_bench_report o;
    hr_bench_report_compute(r, 6, s, 2, 0.2, 0.15, &o);
    CHECK(o.n_sent == 6 && o.n_ok == 3 && o.n_refused == 2 && o.n_failed == 1 && o.n_timed_out == 0);
    CHECK(o.n_codes == 2 && o.codes[0] == 429 && o.code_counts[0] == 1 && o.codes[1] == 401);
    CHECK(o.n_truncated == 1 && o.output_tokens == 33 && o.prompt_tokens == 30 && o.text_events == 33);
    CHECK(o.n_good == 1); /* only r[0] meets TTFT <= 200 ms and TPOT <= 150 ms */
    CHECK(o.wall_s == 4 && o.req_per_s == 0.75 && o.goodput_req_per_s == 0.25 && o.goodput_tok_per_s == 11.0 / 4);
    CHECK(o.ttft_ms.n == 3 && o.ttft_ms.p50 > 99.99 && o.ttft_ms.p50 < 100.01 && o.e2e_ms.max > 2899.9);
    CHECK(o.itl_ms.n == 30);
    /* in flight: r0 [0,1.1] r1 [0,1.5] r2 [1,3.9] r3 r4 [1,1.01] r5 [2,4]: 5 at t = 1 */
    CHECK(o.peak_in_flight == 5);
    /* streaming: r0 [0.1,1.1], r1 [0.5,1.5], r2 [1.1,3.9]: r0 ends as r2 starts, so 2 at most */
    CHECK(o.peak_streaming == 2);
    CHECK(o.has_kv && o.n_with_kv == 2 && o.kv_bytes.p50 == 2000 && o.prefix_hit_tokens == 32 && o.preemptions == 2);
    CHECK(o.has_pool && o.pool_peak_used_bytes == 40 && o.pool_total_bytes == 100);
    CHECK(o.peak_server_running == 2 && o.peak_server_waiting == 3);
    CHECK(o.n_with_cached == 1 && o.cached_tokens == 7);
    /* no SLO: every ok request is good */
    hr_bench_report_compute(r, 6, NULL, 0, 0, 0, &o);
    CHECK(o.n_good == 3 && !o.has_pool && o.peak_server_running == -1);
    /* nothing reported about KV */
    for (int i = 0; i < 6; i++) r[i].has_kv = false;
    hr_bench_report_compute(r, 6, NULL, 0, 0, 0, &o);
    CHECK(!o.has_kv && o.n_with_kv == 0 && o.kv_bytes.n == 0);
    hr_bench_report_compute(NULL, 0, NULL, 0, 0, 0, &o);
    CHECK(o.n_sent == 0 && o.wall_s == 0 && o.ttft_ms.n == 0);
    hr_bench_results_free(r, 6);
}

int main(void) {
    test_pattern_names();
    test_pattern_determinism();
    test_fit_scale();
    test_arrivals();
    test_trace_lines();
    test_trace_files();
    test_percentiles();
    test_sse();
    test_report();
    return hr_test_finish();
}

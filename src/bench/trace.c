/* trace.c: replaying recorded traffic. One JSON object per line (the fields are in bench.h); the
 * line parser is pure so that a fuzzer can drive it, and the loader adds what needs the whole file:
 * line numbers, at least one request, and arrival times present on all lines or none, in order. */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/bench_internal.h"

static bool blank_or_comment(const char *s, size_t n) {
    size_t i = 0;
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n')) i++;
    return i == n || s[i] == '#';
}

/* An integer field in lo..hi; absent is HR_ERR_NOT_FOUND (the caller decides if that is an error). */
static hr_status int_field(json_t *o, const char *key, long long lo, long long hi, int *out, hr_error *err) {
    json_t *v = json_object_get(o, key);
    if (!v) return HR_ERR_NOT_FOUND;
    if (!json_is_integer(v)) return hr_error_set(err, HR_ERR_FORMAT, "'%s' must be an integer", key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return hr_error_set(err, HR_ERR_RANGE, "'%s' is %lld, expected %lld..%lld", key, x, lo, hi);
    *out = (int)x;
    return HR_OK;
}

hr_status hr_bench_trace_parse_line(const char *line, size_t len, uint64_t words_seed, hr_bench_line_kind *kind,
                                    hr_bench_spec *out, hr_error *err) {
    if (!line) len = 0;
    if (blank_or_comment(line, len)) {
        *kind = HR_BENCH_LINE_SKIP;
        return HR_OK;
    }
    json_error_t je;
    json_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!o) return hr_error_set(err, HR_ERR_FORMAT, "not JSON: %s (column %d)", je.text, je.column);
    hr_status st = HR_OK;
    hr_bench_spec s = {.prefix_id = -1, .kind = HR_BENCH_TRACE, .t_s = -1};
    if (!json_is_object(o)) {
        st = hr_error_set(err, HR_ERR_FORMAT, "a trace line must be a JSON object, found %s",
                          json_is_array(o) ? "an array" : "a scalar");
        goto done;
    }
    st = int_field(o, "max_tokens", 1, 1000000, &s.max_tokens, err);
    if (st == HR_ERR_NOT_FOUND) st = hr_error_set(err, HR_ERR_RANGE, "'max_tokens' is missing");
    if (st != HR_OK) goto done;
    json_t *prompt = json_object_get(o, "prompt");
    int n_words = 0;
    st = int_field(o, "prompt_words", 1, 100000, &n_words, err);
    if (st != HR_OK && st != HR_ERR_NOT_FOUND) goto done;
    if (prompt && st == HR_OK) {
        st = hr_error_set(err, HR_ERR_RANGE, "give 'prompt' or 'prompt_words', not both");
        goto done;
    }
    if (!prompt && st == HR_ERR_NOT_FOUND) {
        st = hr_error_set(err, HR_ERR_RANGE, "'prompt' (or 'prompt_words') is missing");
        goto done;
    }
    if (prompt && !json_is_string(prompt)) {
        st = hr_error_set(err, HR_ERR_FORMAT, "'prompt' must be a string");
        goto done;
    }
    if (prompt && json_string_length(prompt) == 0) {
        st = hr_error_set(err, HR_ERR_RANGE, "'prompt' is empty");
        goto done;
    }
    json_t *t = json_object_get(o, "t");
    if (t && (!json_is_number(t) || !(json_number_value(t) >= 0) || json_number_value(t) > 1e9)) {
        st = hr_error_set(err, json_is_number(t) ? HR_ERR_RANGE : HR_ERR_FORMAT,
                          "'t' must be a number of seconds, 0..1e9");
        goto done;
    }
    json_t *system = json_object_get(o, "system");
    if (system && !json_is_string(system)) {
        st = hr_error_set(err, HR_ERR_FORMAT, "'system' must be a string");
        goto done;
    }
    if (t) s.t_s = json_number_value(t);
    s.prompt = prompt ? strdup(json_string_value(prompt)) : hr_bench_words_text(words_seed, n_words);
    if (system) s.prefix = strdup(json_string_value(system));
    if (!s.prompt || (system && !s.prefix)) {
        hr_bench_spec_free(&s);
        st = hr_error_set(err, HR_ERR_NOMEM, "out of memory reading a trace line");
        goto done;
    }
    st = HR_OK;
    *kind = HR_BENCH_LINE_REQUEST;
    *out = s;
done:
    json_decref(o);
    return st;
}

static void free_specs(hr_bench_spec *v, int n) {
    for (int i = 0; i < n; i++) hr_bench_spec_free(&v[i]);
    free(v);
}

hr_status hr_bench_trace_load(const char *path, uint64_t seed, hr_bench_spec **out, int *n_out, hr_error *err) {
    FILE *f = fopen(path, "r");
    if (!f) return hr_error_set(err, HR_ERR_IO, "cannot open trace '%s': %s", path, strerror(errno));
    hr_bench_spec *v = NULL;
    int n = 0, cap = 0, lineno = 0;
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t got;
    hr_status st = HR_OK;
    while ((got = getline(&line, &line_cap, f)) >= 0) {
        lineno++;
        hr_bench_line_kind kind;
        hr_bench_spec s;
        st = hr_bench_trace_parse_line(line, (size_t)got, seed + (uint64_t)lineno, &kind, &s, err);
        if (st != HR_OK) {
            hr_error_prefix(err, "%s:%d", path, lineno);
            break;
        }
        if (kind == HR_BENCH_LINE_SKIP) continue;
        if (n > 0 && (s.t_s >= 0) != (v[0].t_s >= 0)) {
            hr_bench_spec_free(&s);
            st = hr_error_set(err, HR_ERR_RANGE, "%s:%d: 't' must be on every line or on none (line %d %s it)", path,
                              lineno, lineno, v[0].t_s >= 0 ? "lacks" : "has");
            break;
        }
        if (n > 0 && s.t_s >= 0 && s.t_s < v[n - 1].t_s) {
            st = hr_error_set(err, HR_ERR_RANGE, "%s:%d: 't' is %g, before the previous line's %g", path, lineno, s.t_s,
                              v[n - 1].t_s);
            hr_bench_spec_free(&s);
            break;
        }
        if (n == cap) {
            int ncap = cap ? cap * 2 : 64;
            hr_bench_spec *nv = realloc(v, (size_t)ncap * sizeof *nv);
            if (!nv) {
                hr_bench_spec_free(&s);
                st = hr_error_set(err, HR_ERR_NOMEM, "out of memory reading trace '%s'", path);
                break;
            }
            v = nv;
            cap = ncap;
        }
        v[n++] = s;
    }
    if (st == HR_OK && ferror(f)) st = hr_error_set(err, HR_ERR_IO, "reading trace '%s' failed", path);
    if (st == HR_OK && n == 0) st = hr_error_set(err, HR_ERR_RANGE, "trace '%s' holds no request lines", path);
    free(line);
    fclose(f);
    if (st != HR_OK) {
        free_specs(v, n);
        return st;
    }
    *out = v;
    *n_out = n;
    return HR_OK;
}

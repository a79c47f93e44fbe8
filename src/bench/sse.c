/* sse.c: reading an OpenAI streaming response as it arrives. Bytes are split into lines; each
 * `data:` line is one event (OpenAI servers send one JSON object per event), `data: [DONE]` ends the
 * stream. An event with text is a token arrival and gets a timestamp; the usage object (the last
 * chunk with stream_options.include_usage) gives token counts and, from headroom, usage.kv. Pure:
 * the caller supplies the clock. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"

static int64_t get_int(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : 0;
}

static bool push_time(hr_bench_sse *s, double t) {
    if (s->n_text_events == s->t_cap) {
        int ncap = s->t_cap ? s->t_cap * 2 : 64;
        double *nt = realloc(s->t_text, (size_t)ncap * sizeof *nt);
        if (!nt) return false;
        s->t_text = nt;
        s->t_cap = ncap;
    }
    s->t_text[s->n_text_events++] = t;
    return true;
}

static void note_error(hr_bench_sse *s, const char *msg, size_t n) {
    if (s->error[0]) return;
    if (n >= sizeof s->error) n = sizeof s->error - 1;
    memcpy(s->error, msg, n);
    s->error[n] = '\0';
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s->error[i] < 0x20) s->error[i] = ' ';
}

static void read_usage(hr_bench_sse *s, json_t *u) {
    s->has_usage = true;
    s->prompt_tokens = (int)get_int(u, "prompt_tokens");
    s->completion_tokens = (int)get_int(u, "completion_tokens");
    json_t *details = json_object_get(u, "prompt_tokens_details");
    if (json_is_integer(json_object_get(details, "cached_tokens"))) {
        s->has_cached = true;
        s->cached_tokens = get_int(details, "cached_tokens");
    }
    json_t *kv = json_object_get(u, "kv");
    if (!json_is_object(kv)) return;
    s->has_kv = true;
    s->kv_bytes_peak = get_int(kv, "bytes_peak");
    s->kv_blocks_peak = get_int(kv, "blocks_peak");
    s->kv_prefix_hit_tokens = get_int(kv, "prefix_hit_tokens");
    s->kv_preemptions = get_int(kv, "preemptions");
    json_t *q = json_object_get(kv, "queued_seconds");
    s->kv_queued_s = json_is_number(q) ? json_number_value(q) : 0;
    json_t *ft = json_object_get(kv, "first_token_seconds");
    s->kv_first_token_s = json_is_number(ft) ? json_number_value(ft) : -1;
}

/* Whether choice c carries generated text (a role-only or final empty chunk does not). */
static bool carries_text(json_t *c) {
    json_t *text = json_object_get(c, "text");
    json_t *delta = json_object_get(c, "delta");
    if (!json_is_string(text) && json_is_object(delta)) text = json_object_get(delta, "content");
    if (!json_is_string(text)) return false;
    if (json_string_length(text) > 0) return true;
    json_t *fr = json_object_get(c, "finish_reason");
    return (!fr || json_is_null(fr)) && !(json_is_object(delta) && json_object_get(delta, "role"));
}

static bool on_data(hr_bench_sse *s, const char *d, size_t n, double now) {
    if (n == 6 && !memcmp(d, "[DONE]", 6)) {
        s->done = true;
        return true;
    }
    json_t *o = json_loadb(d, n, 0, NULL);
    if (!json_is_object(o)) {
        s->n_bad_events++;
        note_error(s, d, n);
        json_decref(o);
        return true;
    }
    s->n_events++;
    bool ok = true;
    json_t *e = json_object_get(o, "error");
    if (e) {
        json_t *m = json_is_object(e) ? json_object_get(e, "message") : e;
        const char *msg = json_is_string(m) ? json_string_value(m) : "error event";
        note_error(s, msg, strlen(msg));
    }
    json_t *choices = json_object_get(o, "choices");
    json_t *c = json_array_get(choices, 0);
    if (json_is_object(c)) {
        if (carries_text(c)) ok = push_time(s, now);
        json_t *fr = json_object_get(c, "finish_reason");
        if (json_is_string(fr)) snprintf(s->finish_reason, sizeof s->finish_reason, "%s", json_string_value(fr));
    }
    json_t *u = json_object_get(o, "usage");
    if (json_is_object(u)) read_usage(s, u);
    json_decref(o);
    return ok;
}

static bool on_line(hr_bench_sse *s, const char *l, size_t n, double now) {
    if (n && l[n - 1] == '\r') n--;
    if (n == 0 || l[0] == ':') return true; /* event boundary or comment */
    if (n >= 5 && !memcmp(l, "data:", 5)) {
        size_t k = 5;
        if (k < n && l[k] == ' ') k++;
        return on_data(s, l + k, n - k, now);
    }
    if ((n >= 6 && !memcmp(l, "event:", 6)) || (n >= 3 && !memcmp(l, "id:", 3)) || (n >= 6 && !memcmp(l, "retry:", 6)))
        return true;
    s->n_bad_events++; /* not SSE: a plain JSON body, HTML, noise */
    note_error(s, l, n);
    return true;
}

bool hr_bench_sse_feed(hr_bench_sse *s, const char *data, size_t n, double now_s) {
    if (s->len + n + 1 > s->cap) {
        size_t ncap = s->cap ? s->cap : 4096;
        while (ncap < s->len + n + 1) ncap *= 2;
        char *nb = realloc(s->buf, ncap);
        if (!nb) return false;
        s->buf = nb;
        s->cap = ncap;
    }
    memcpy(s->buf + s->len, data, n);
    s->len += n;
    size_t start = 0;
    for (size_t i = 0; i < s->len; i++)
        if (s->buf[i] == '\n') {
            if (!on_line(s, s->buf + start, i - start, now_s)) return false;
            start = i + 1;
        }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
    return true;
}

void hr_bench_sse_free(hr_bench_sse *s) {
    free(s->buf);
    free(s->t_text);
    memset(s, 0, sizeof *s);
}

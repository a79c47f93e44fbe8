/* client.c: the load generator. One thread drives libcurl's multi interface: it starts requests
 * when they are due (closed loop: whenever fewer than `concurrency` are in flight; open loop: at
 * each arrival time, however many are in flight), reads every stream as it arrives (sse.c stamps
 * each token), polls GET /v1/kv on a timer while the server answers it, and records one sample per
 * tick. A request's outcome never stops the run: errors become its status and reason. Every request
 * has a timeout and no new one starts after the bounds, so the run always ends. */
#include <curl/curl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"

#define ERRBODY_MAX  2048
#define POLLBODY_MAX (4u << 20)

typedef struct xfer {
    CURL *h;
    struct curl_slist *hdrs;
    char *body;
    int idx; /* the result slot; -1 for the /v1/kv poll */
    double t0, t_sched;
    hr_bench_sse sse;
    char *raw; /* error bodies (first ERRBODY_MAX bytes) and the poll's JSON */
    size_t raw_len, raw_cap;
    bool nomem;
    struct xfer *prev, *next; /* the requests in flight */
} xfer;

typedef struct run {
    const hr_bench_run_params *p;
    CURLM *multi;
    char base[1024];
    double t0;
    hr_bench_result *res;
    int n_res, cap_res;
    hr_bench_sample *smp;
    int n_smp, cap_smp;
    int active;   /* requests in flight */
    xfer *live;   /* their list */
    xfer *poll;   /* the poll in flight, or NULL */
    int poll_smp; /* the sample it fills */
    bool pool_ok; /* the server answers /v1/kv */
    hr_bench_progress prog;
} run;

static double now_s(const run *r) { return hr_time_now() - r->t0; }

static bool raw_put(xfer *x, const char *d, size_t n, size_t limit) {
    if (x->raw_len + n > limit) n = limit > x->raw_len ? limit - x->raw_len : 0;
    if (x->raw_len + n + 1 > x->raw_cap) {
        size_t ncap = x->raw_cap ? x->raw_cap * 2 : 4096;
        while (ncap < x->raw_len + n + 1) ncap *= 2;
        char *nb = realloc(x->raw, ncap);
        if (!nb) return false;
        x->raw = nb;
        x->raw_cap = ncap;
    }
    memcpy(x->raw + x->raw_len, d, n);
    x->raw_len += n;
    x->raw[x->raw_len] = '\0';
    return true;
}

static size_t on_write(char *d, size_t size, size_t nmemb, void *user) {
    xfer *x = user;
    size_t n = size * nmemb;
    long code = 0;
    curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &code);
    bool ok;
    if (x->idx < 0) {
        ok = raw_put(x, d, n, POLLBODY_MAX);
    } else if (code != 200) {
        ok = raw_put(x, d, n, ERRBODY_MAX);
    } else {
        ok = hr_bench_sse_feed(&x->sse, d, n, hr_time_now() - x->t0);
    }
    if (!ok) {
        x->nomem = true;
        return 0; /* aborts this transfer */
    }
    return n;
}

static void xfer_free(xfer *x) {
    if (!x) return;
    if (x->h) curl_easy_cleanup(x->h);
    curl_slist_free_all(x->hdrs);
    free(x->body);
    free(x->raw);
    hr_bench_sse_free(&x->sse);
    free(x);
}

static xfer *xfer_new(run *r, const char *path, char *body, int idx) {
    xfer *x = calloc(1, sizeof *x);
    if (!x) {
        free(body);
        return NULL;
    }
    x->body = body;
    x->idx = idx;
    x->t0 = r->t0;
    x->h = curl_easy_init();
    char url[1200], auth[1100];
    snprintf(url, sizeof url, "%s%s", r->base, path);
    struct curl_slist *h = NULL;
    if (body) h = curl_slist_append(h, "Content-Type: application/json");
    if (body) h = curl_slist_append(h, "Accept: text/event-stream");
    if (r->p->api_key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", r->p->api_key);
        h = curl_slist_append(h, auth);
    }
    x->hdrs = h;
    if (!x->h || (body && !h)) {
        xfer_free(x);
        return NULL;
    }
    CURL *e = x->h;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, x->hdrs);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(e, CURLOPT_PRIVATE, x);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    double limit = idx < 0 ? 5 : r->p->timeout_s;
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(limit * 1000));
    /* only the URL given: no redirects to elsewhere */
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
    if (body) curl_easy_setopt(e, CURLOPT_POSTFIELDS, x->body);
    return x;
}

static char *request_body(const hr_bench_run_params *p, const hr_bench_spec *s) {
    json_t *o = json_object();
    if (p->model) json_object_set_new(o, "model", json_string(p->model));
    if (p->chat) {
        json_t *msgs = json_array();
        if (s->prefix) json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", s->prefix));
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", s->prompt));
        json_object_set_new(o, "messages", msgs);
    } else if (s->prefix) {
        size_t a = strlen(s->prefix), b = strlen(s->prompt);
        char *t = malloc(a + b + 2);
        if (!t) {
            json_decref(o);
            return NULL;
        }
        memcpy(t, s->prefix, a);
        t[a] = ' ';
        memcpy(t + a + 1, s->prompt, b + 1);
        json_object_set_new(o, "prompt", json_string(t));
        free(t);
    } else {
        json_object_set_new(o, "prompt", json_string(s->prompt));
    }
    json_object_set_new(o, "max_tokens", json_integer(s->max_tokens));
    json_object_set_new(o, "temperature", json_real(0));
    json_object_set_new(o, "stream", json_true());
    json_object_set_new(o, "stream_options", json_pack("{s:b}", "include_usage", 1));
    if (p->ignore_eos) json_object_set_new(o, "ignore_eos", json_true());
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return text;
}

static bool grow(void **v, int *cap, int need, size_t elem) {
    if (need <= *cap) return true;
    int ncap = *cap ? *cap * 2 : 64;
    while (ncap < need) ncap *= 2;
    void *nv = realloc(*v, (size_t)ncap * elem);
    if (!nv) return false;
    *v = nv;
    *cap = ncap;
    return true;
}

static hr_status start_request(run *r, int i, double t_sched, hr_error *err) {
    const hr_bench_run_params *p = r->p;
    hr_bench_spec own = {0};
    const hr_bench_spec *s = NULL;
    if (p->specs) {
        s = &p->specs[i % p->n_specs];
    } else {
        hr_status st = hr_bench_pattern_spec(p->pattern, p->seed, i, p->scale, &own, err);
        if (st != HR_OK) return st;
        s = &own;
    }
    char *body = request_body(p, s);
    int max_tokens = s->max_tokens;
    hr_bench_spec_free(&own);
    if (!body || !grow((void **)&r->res, &r->cap_res, r->n_res + 1, sizeof *r->res)) {
        free(body);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory starting request %d", i);
    }
    xfer *x = xfer_new(r, p->chat ? "/v1/chat/completions" : "/v1/completions", body, r->n_res);
    if (!x) return hr_error_set(err, HR_ERR_NOMEM, "out of memory starting request %d", i);
    x->t_sched = t_sched;
    hr_bench_result *res = &r->res[r->n_res++];
    memset(res, 0, sizeof *res);
    *res = (hr_bench_result){.max_tokens = max_tokens,
                             .t_sched = t_sched,
                             .t_first = -1,
                             .t_end = -1,
                             .ttft_s = -1,
                             .e2e_s = -1,
                             .prompt_tokens = -1,
                             .completion_tokens = -1};
    if (curl_multi_add_handle(r->multi, x->h) != CURLM_OK) {
        xfer_free(x);
        r->n_res--;
        return hr_error_set(err, HR_ERR_INTERNAL, "libcurl refused request %d", i);
    }
    x->next = r->live;
    if (r->live) r->live->prev = x;
    r->live = x;
    r->active++;
    r->prog.sent++;
    return HR_OK;
}

/* The error message of an OpenAI-shaped error body, else its first bytes. */
static void body_reason(const xfer *x, char *out, size_t cap) {
    json_t *o = x->raw ? json_loadb(x->raw, x->raw_len, 0, NULL) : NULL;
    json_t *e = json_object_get(o, "error");
    json_t *m = json_is_object(e) ? json_object_get(e, "message") : e;
    if (json_is_string(m)) {
        snprintf(out, cap, "%s", json_string_value(m));
    } else {
        snprintf(out, cap, "%.*s", (int)(x->raw_len < 120 ? x->raw_len : 120), x->raw ? x->raw : "");
    }
    json_decref(o);
    for (char *c = out; *c; c++)
        if ((unsigned char)*c < 0x20) *c = ' ';
}

static void finish_request(run *r, xfer *x, CURLcode rc, bool interrupted) {
    hr_bench_result *res = &r->res[x->idx];
    const hr_bench_sse *s = &x->sse;
    long code = 0;
    curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &code);
    res->http_code = (int)code;
    double t = now_s(r);
    if (interrupted) {
        res->status = HR_BENCH_FAILED;
        snprintf(res->reason, sizeof res->reason, "interrupted after %d tokens", s->n_text_events);
    } else if (x->nomem) {
        res->status = HR_BENCH_FAILED;
        snprintf(res->reason, sizeof res->reason, "the bench ran out of memory reading the response");
    } else if (rc == CURLE_OPERATION_TIMEDOUT) {
        res->status = HR_BENCH_TIMED_OUT;
        snprintf(res->reason, sizeof res->reason, "no end within %g s (%d tokens seen)", r->p->timeout_s,
                 s->n_text_events);
    } else if (code >= 400) {
        res->status = HR_BENCH_REFUSED;
        body_reason(x, res->reason, sizeof res->reason);
    } else if (rc != CURLE_OK) {
        res->status = HR_BENCH_FAILED;
        /* by libcurl's code, not its message (which carries the elapsed time): one cause reads as one
         * reason however long it took */
        snprintf(res->reason, sizeof res->reason, "%s (libcurl error %d)", curl_easy_strerror(rc), (int)rc);
    } else if (code != 200) {
        res->status = HR_BENCH_FAILED;
        snprintf(res->reason, sizeof res->reason, "unexpected HTTP %ld", code);
    } else if (s->error[0] && s->n_events > 0 && s->n_bad_events == 0) {
        res->status = HR_BENCH_FAILED;
        snprintf(res->reason, sizeof res->reason, "error event: %s", s->error);
    } else if (!s->done) {
        res->status = HR_BENCH_FAILED;
        if (s->n_events == 0)
            snprintf(res->reason, sizeof res->reason, "garbage response (no SSE data events): %.100s",
                     s->error[0] ? s->error : (s->len ? s->buf : "empty body"));
        else
            snprintf(res->reason, sizeof res->reason, "stream ended before [DONE] after %d tokens", s->n_text_events);
    } else {
        res->status = HR_BENCH_OK;
    }
    res->n_text_events = s->n_text_events;
    if (s->n_text_events > 0) {
        res->t_first = s->t_text[0];
        res->ttft_s = res->t_first - res->t_sched;
        if (s->n_text_events > 1) res->gaps_s = malloc((size_t)(s->n_text_events - 1) * sizeof *res->gaps_s);
        if (res->gaps_s) {
            for (int k = 1; k < s->n_text_events; k++) res->gaps_s[k - 1] = s->t_text[k] - s->t_text[k - 1];
            res->n_gaps = s->n_text_events - 1;
        }
    }
    res->t_end = t;
    res->e2e_s = t - res->t_sched;
    if (s->has_usage) {
        res->prompt_tokens = s->prompt_tokens;
        res->completion_tokens = s->completion_tokens;
    }
    snprintf(res->finish_reason, sizeof res->finish_reason, "%s", s->finish_reason);
    res->has_kv = s->has_kv;
    res->kv_bytes_peak = s->kv_bytes_peak;
    res->kv_prefix_hit_tokens = s->kv_prefix_hit_tokens;
    res->kv_preemptions = s->kv_preemptions;
    res->kv_first_token_s = s->has_kv ? s->kv_first_token_s : -1;
    res->has_cached = s->has_cached;
    res->cached_tokens = s->cached_tokens;
    if (x->prev)
        x->prev->next = x->next;
    else
        r->live = x->next;
    if (x->next) x->next->prev = x->prev;
    r->active--;
    r->prog.done++;
    int *counter[] = {&r->prog.ok, &r->prog.refused, &r->prog.failed, &r->prog.timed_out};
    (*counter[res->status])++;
}

static void finish_poll(run *r, xfer *x, CURLcode rc) {
    long code = 0;
    curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &code);
    json_t *o = rc == CURLE_OK && code == 200 && x->raw ? json_loadb(x->raw, x->raw_len, 0, NULL) : NULL;
    json_t *pool = json_object_get(o, "pool");
    json_t *used = json_object_get(pool, "used_bytes"), *total = json_object_get(pool, "total_bytes");
    if (!json_is_integer(used) || !json_is_integer(total)) {
        /* not headroom, or no KV endpoint: the KV columns stay empty; stop asking. A timeout while
         * the server is busy is not a verdict, so only a definite answer turns polling off. */
        if (rc == CURLE_OK) r->pool_ok = false;
    } else if (r->poll_smp < r->n_smp) {
        hr_bench_sample *s = &r->smp[r->poll_smp];
        s->has_pool = true;
        s->pool_used_bytes = json_integer_value(used);
        s->pool_total_bytes = json_integer_value(total);
        json_t *run_n = json_object_get(pool, "requests_running"), *wait_n = json_object_get(pool, "requests_waiting");
        s->server_running = json_is_integer(run_n) ? (int)json_integer_value(run_n) : -1;
        s->server_waiting = json_is_integer(wait_n) ? (int)json_integer_value(wait_n) : -1;
    }
    json_decref(o);
}

static void drain_messages(run *r) {
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(r->multi, &left))) {
        if (m->msg != CURLMSG_DONE) continue;
        xfer *x = NULL;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
        CURLcode rc = m->data.result;
        curl_multi_remove_handle(r->multi, x->h);
        if (x->idx < 0) {
            finish_poll(r, x, rc);
            r->poll = NULL;
        } else {
            finish_request(r, x, rc, false);
        }
        xfer_free(x);
    }
}

static hr_status take_sample(run *r, double t, hr_error *err) {
    if (!grow((void **)&r->smp, &r->cap_smp, r->n_smp + 1, sizeof *r->smp))
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory recording samples");
    hr_bench_sample *s = &r->smp[r->n_smp++];
    memset(s, 0, sizeof *s);
    s->t_s = t;
    s->server_running = s->server_waiting = -1;
    for (const xfer *x = r->live; x; x = x->next) {
        if (x->sse.n_text_events == 0)
            s->client_waiting++;
        else
            s->client_streaming++;
    }
    return HR_OK;
}

/* Ends every request in flight now (a second interrupt, or an error): each is FAILED, "interrupted". */
static void abandon_all(run *r) {
    while (r->live) {
        xfer *x = r->live;
        curl_multi_remove_handle(r->multi, x->h);
        finish_request(r, x, CURLE_OK, true);
        xfer_free(x);
    }
}

hr_status hr_bench_run(const hr_bench_run_params *p, hr_bench_result **results, int *n_results,
                       hr_bench_sample **samples, int *n_samples, hr_error *err) {
    if (!p->url || p->n_requests <= 0 || (p->concurrency <= 0 && p->rate <= 0 && !p->replay_times) ||
        p->timeout_s <= 0 || (!p->specs && !(p->scale > 0)) || (p->specs && p->n_specs <= 0))
        return hr_error_set(err, HR_ERR_INVALID_ARG, "bench: incomplete run parameters");
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return hr_error_set(err, HR_ERR_INTERNAL, "libcurl failed to initialize");
    run r = {.p = p, .pool_ok = p->poll_s > 0, .poll_smp = -1};
    snprintf(r.base, sizeof r.base, "%s", p->url);
    size_t bl = strlen(r.base);
    while (bl && r.base[bl - 1] == '/') r.base[--bl] = '\0';
    if (bl >= 3 && !strcmp(r.base + bl - 3, "/v1")) r.base[bl -= 3] = '\0';
    r.multi = curl_multi_init();
    if (!r.multi) {
        curl_global_cleanup();
        return hr_error_set(err, HR_ERR_INTERNAL, "libcurl could not create a multi handle");
    }
    r.prog.total = p->duration_s > 0 ? -1 : p->n_requests;
    hr_bench_arrivals arr;
    hr_bench_arrivals_init(&arr, p->pattern, p->seed, p->rate);
    bool open_loop = p->concurrency <= 0;
    double t_first_spec = p->specs ? p->specs[0].t_s : 0;
    double next_arrival = 0;
    if (open_loop) next_arrival = p->replay_times ? 0 : hr_bench_arrivals_next(&arr);
    double tick = p->poll_s > 0 ? p->poll_s : 0.25;
    double next_tick = 0, next_progress = 1;
    int next = 0;
    hr_status st = HR_OK;
    r.t0 = hr_time_now();
    for (;;) {
        double t = now_s(&r);
        int stop = p->stop ? (int)*p->stop : 0;
        bool no_more = stop > 0 || next >= p->n_requests || (p->duration_s > 0 && t >= p->duration_s);
        while (!no_more && st == HR_OK) {
            double due;
            if (!open_loop) {
                if (r.active >= p->concurrency) break;
                due = t;
            } else {
                if (next_arrival > t) break;
                due = next_arrival;
            }
            st = start_request(&r, next++, due, err);
            if (open_loop && next < p->n_requests)
                next_arrival =
                    p->replay_times ? p->specs[next % p->n_specs].t_s - t_first_spec : hr_bench_arrivals_next(&arr);
            no_more = next >= p->n_requests;
        }
        if (st != HR_OK) break;
        if (t >= next_tick) {
            next_tick = t + tick;
            if ((st = take_sample(&r, t, err)) != HR_OK) break;
            if (r.pool_ok && !r.poll) {
                r.poll = xfer_new(&r, "/v1/kv", NULL, -1);
                if (r.poll && curl_multi_add_handle(r.multi, r.poll->h) == CURLM_OK) {
                    r.poll_smp = r.n_smp - 1;
                } else {
                    xfer_free(r.poll);
                    r.poll = NULL;
                }
            }
        }
        int running = 0;
        curl_multi_perform(r.multi, &running);
        drain_messages(&r);
        if (stop >= 2) abandon_all(&r);
        if (no_more && r.active == 0) break;
        if (p->on_progress && t >= next_progress) {
            next_progress = t + 1;
            r.prog.t_s = t;
            r.prog.in_flight = r.active;
            p->on_progress(&r.prog, p->user);
        }
        double wait = next_tick - t;
        if (open_loop && !no_more && next_arrival - t < wait) wait = next_arrival - t;
        if (wait > 0.05) wait = 0.05;
        if (wait < 0) wait = 0;
        curl_multi_poll(r.multi, NULL, 0, (int)(wait * 1000), NULL);
    }
    abandon_all(&r);
    if (r.poll) {
        curl_multi_remove_handle(r.multi, r.poll->h);
        xfer_free(r.poll);
    }
    curl_multi_cleanup(r.multi);
    curl_global_cleanup();
    if (st != HR_OK) {
        hr_bench_results_free(r.res, r.n_res);
        free(r.smp);
        return st;
    }
    r.prog.t_s = now_s(&r);
    r.prog.in_flight = 0;
    if (p->on_progress) p->on_progress(&r.prog, p->user);
    *results = r.res;
    *n_results = r.n_res;
    *samples = r.smp;
    *n_samples = r.n_smp;
    return HR_OK;
}

void hr_bench_results_free(hr_bench_result *r, int n) {
    for (int i = 0; i < n; i++) free(r[i].gaps_s);
    free(r);
}

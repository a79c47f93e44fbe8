/* test_server_dashboard.c: what the dashboard and `headroom top` read, over loopback: GET / and
 * /dashboard serve the embedded page byte for byte without the API key, and the page fetches nothing
 * from elsewhere; /v1/kv keeps its fields and adds a growing snapshot number, the time, counters,
 * rates, events and the server's settings; live rows carry request_id, phase, priority, age and
 * shared bytes; a refusal becomes an event with its reason; after six long requests on a tight pool
 * the counters, latency percentiles and preemption events agree with the pool. Uses the repository's
 * demo model (models/stories260K-q8_0.gguf); bounded waits only. */
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "common/util.h"
#include "harness.h"
#include "runtime/runtime.h"
#include "server/dashboard.h"
#include "server/server.h"

#define KEY "dash-key"

typedef struct resp {
    int status;
    char *head, *body;
    size_t body_len;
} resp;

/* One request on a fresh connection (Connection: close); the server's answers here are not chunked. */
static resp call(int port, const char *method, const char *path, const char *auth, const char *body) {
    resp r = {0};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {.tv_sec = 30};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return r;
    }
    char head[1024];
    size_t blen = body ? strlen(body) : 0;
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s%s%sContent-Type: "
                     "application/json\r\nContent-Length: %zu\r\n\r\n",
                     method, path, auth ? "Authorization: Bearer " : "", auth ? auth : "", auth ? "\r\n" : "", blen);
    if (write(fd, head, (size_t)n) != n || (blen && write(fd, body, blen) != (ssize_t)blen)) {
        close(fd);
        return r;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 4096 > cap) buf = realloc(buf, cap *= 2);
        ssize_t got = read(fd, buf + len, cap - len - 1);
        if (got <= 0) break;
        len += (size_t)got;
    }
    close(fd);
    buf[len] = '\0';
    char *sep = strstr(buf, "\r\n\r\n");
    if (sep) {
        *sep = '\0';
        sscanf(buf, "HTTP/1.%*d %d", &r.status);
        r.body_len = len - (size_t)(sep + 4 - buf);
        r.body = malloc(r.body_len + 1);
        memcpy(r.body, sep + 4, r.body_len);
        r.body[r.body_len] = '\0';
    }
    r.head = buf;
    return r;
}

static void resp_free(resp *r) {
    free(r->head);
    free(r->body);
    *r = (resp){0};
}

static json_t *get_kv(int port) {
    resp r = call(port, "GET", "/v1/kv", KEY, NULL);
    json_t *o = r.status == 200 ? json_loads(r.body, 0, NULL) : NULL;
    CHECKF(o != NULL, "/v1/kv: %d", r.status);
    resp_free(&r);
    return o;
}

static double num(const json_t *o, const char *k) {
    json_t *x = json_object_get(o, k);
    return json_is_number(x) ? json_number_value(x) : -1;
}

static void test_page(int port) {
    const char *paths[] = {"/", "/dashboard"};
    for (int i = 0; i < 2; i++) {
        resp r = call(port, "GET", paths[i], NULL, NULL); /* no key: the page holds no data */
        CHECKF(r.status == 200 && strcasestr(r.head, "content-type: text/html"), "GET %s: %d", paths[i], r.status);
        CHECKF(r.body_len == hr_srv_dashboard_html_len && r.body &&
                   memcmp(r.body, hr_srv_dashboard_html, r.body_len) == 0,
               "GET %s: %zu bytes, the embedded page has %zu", paths[i], r.body_len, hr_srv_dashboard_html_len);
        resp_free(&r);
    }
    /* self-contained: no address of another host anywhere in it, and it reads /v1/kv */
    CHECK(strstr(hr_srv_dashboard_html, "://") == NULL);
    CHECK(strstr(hr_srv_dashboard_html, "<canvas") && strstr(hr_srv_dashboard_html, "'/v1/kv'"));
    resp r = call(port, "POST", "/", NULL, "{}");
    CHECKF(r.status == 405, "POST /: %d", r.status);
    resp_free(&r);
}

static void test_kv_fields(int port, hr_runtime *rt) {
    resp r = call(port, "GET", "/v1/kv", "wrong", NULL);
    CHECKF(r.status == 401, "/v1/kv with a wrong key: %d", r.status);
    resp_free(&r);
    json_t *a = get_kv(port), *b = get_kv(port);
    if (!a || !b) return;
    CHECK(num(b, "snapshot") == num(a, "snapshot") + 1);
    CHECK(num(a, "time") > 1.7e9 && num(a, "uptime_seconds") >= 0);
    const json_t *pool = json_object_get(a, "pool"), *srv = json_object_get(a, "server");
    /* the old fields stay */
    CHECK(num(pool, "used_bytes") >= 0 && num(pool, "headroom_bytes") > -1e18 &&
          json_is_array(json_object_get(a, "requests")));
    CHECK(num(srv, "kv_budget_bytes") == num(pool, "budget_bytes") && num(srv, "kv_budget_bytes") == 400 * 1024);
    CHECK(json_is_true(json_object_get(srv, "api_key")) &&
          !strcmp(json_string_value(json_object_get(srv, "admission")), "optimistic"));
    CHECK(!strcmp(json_string_value(json_object_get(srv, "model")), hr_runtime_model_name(rt)));
    const json_t *rates = json_object_get(a, "rates");
    CHECK(num(rates, "requests_per_s") == 0 && num(rates, "generated_tokens_per_s") == 0);
    CHECK(json_is_null(json_object_get(rates, "ttft_p50_seconds")) &&
          json_is_null(json_object_get(rates, "itl_p99_seconds")));
    /* the 401 above is an event with its reason */
    const json_t *ev = json_object_get(b, "events");
    bool seen = false;
    for (size_t i = 0; i < json_array_size(ev); i++) {
        const json_t *e = json_array_get(ev, i);
        if (!strcmp(json_string_value(json_object_get(e, "kind")), "refusal") &&
            !strcmp(json_string_value(json_object_get(e, "reason")), "unauthorized") && num(e, "http") == 401)
            seen = true;
    }
    CHECKF(seen, "the 401 is among %zu events", json_array_size(ev));
    CHECK(num(json_object_get(b, "counters"), "refusals") == 1);
    json_decref(a);
    json_decref(b);
}

typedef struct job {
    int port, status;
} job;

static void *post_long(void *arg) {
    job *j = arg;
    resp r = call(j->port, "POST", "/v1/completions", KEY,
                  "{\"prompt\": \"Once upon a time there was a little girl\", \"max_tokens\": 400, "
                  "\"temperature\": 0.8, \"ignore_eos\": true, \"priority\": 3}");
    j->status = r.status;
    resp_free(&r);
    return NULL;
}

static void test_rows_and_rates(int port) {
    enum { N = 6 };
    pthread_t th[N];
    job jobs[N];
    for (int i = 0; i < N; i++) {
        jobs[i] = (job){.port = port};
        pthread_create(&th[i], NULL, post_long, &jobs[i]);
    }
    /* rows while they run: seen at least once (the requests are long; the poll is tight and bounded) */
    int rows_seen = 0;
    double deadline = hr_time_now() + 60;
    while (rows_seen == 0 && hr_time_now() < deadline) {
        json_t *kv = get_kv(port);
        const json_t *reqs = json_object_get(kv, "requests");
        for (size_t i = 0; i < json_array_size(reqs); i++) {
            const json_t *row = json_array_get(reqs, i), *k = json_object_get(row, "kv");
            const char *phase = json_string_value(json_object_get(row, "phase"));
            CHECK(phase && strstr(" waiting prefill decode preempted swapped finished ", phase));
            CHECK(num(row, "request_id") >= 1 && num(row, "priority") == 3 && num(row, "age_seconds") >= 0);
            CHECK(num(row, "shared_bytes") >= 0 && num(row, "shared_bytes") <= num(row, "held_bytes"));
            CHECK(num(row, "computed_tokens") >= 0 && json_is_string(json_object_get(row, "state")));
            if (!strcmp(phase, "preempted") || !strcmp(phase, "waiting")) CHECK(num(k, "bytes_now") == 0);
            CHECK(num(row, "held_bytes") == (!strcmp(phase, "finished") ? 0 : num(k, "bytes_now")));
            rows_seen++;
        }
        json_decref(kv);
        if (rows_seen == 0) usleep(2000);
    }
    CHECK(rows_seen > 0);
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        CHECKF(jobs[i].status == 200, "request %d: %d", i, jobs[i].status);
    }
    /* the engine publishes its counters at the end of each step, after it has handed the last tokens
     * to the requests: a client may see its answer a step before the counters include it (bounded) */
    json_t *kv = get_kv(port);
    for (double until = hr_time_now() + 10; kv && hr_time_now() < until; usleep(5000)) {
        if (num(json_object_get(kv, "counters"), "generated_tokens") >= N * 400) break;
        json_decref(kv);
        kv = get_kv(port);
    }
    if (!kv) return;
    const json_t *c = json_object_get(kv, "counters"), *r = json_object_get(kv, "rates");
    const json_t *pool = json_object_get(kv, "pool");
    CHECK(json_array_size(json_object_get(kv, "requests")) == 0);
    CHECK(num(c, "requests_submitted") == N && num(c, "requests_finished") == N);
    CHECKF(num(c, "generated_tokens") >= N * 400, "generated %.0f", num(c, "generated_tokens"));
    CHECK(num(r, "requests_per_s") > 0 && num(r, "generated_tokens_per_s") > 0);
    CHECK(num(r, "ttft_p50_seconds") > 0 && num(r, "ttft_p99_seconds") >= num(r, "ttft_p50_seconds"));
    CHECK(num(r, "itl_p50_seconds") >= 0 && num(r, "itl_p99_seconds") >= num(r, "itl_p50_seconds"));
    /* 6 x 412 tokens in a pool of 640: preemptions, each one an event naming a request */
    double pre = num(pool, "preemptions");
    int n_pre = 0;
    const json_t *ev = json_object_get(kv, "events");
    for (size_t i = 0; i < json_array_size(ev); i++) {
        const json_t *e = json_array_get(ev, i);
        if (!strncmp(json_string_value(json_object_get(e, "kind")), "preempt_", 8)) {
            n_pre++;
            CHECK(num(e, "request_id") >= 1 && num(e, "bytes") >= 0 && num(e, "time") > 1.7e9);
        }
        if (i > 0) CHECK(num(e, "time") >= num(json_array_get(ev, i - 1), "time") - 1e-3);
    }
    CHECKF(pre > 0 && n_pre == (pre < 256 ? pre : 256), "%d preemption events for %.0f preemptions", n_pre, pre);
    printf("6 requests of 400 tokens in 400 KiB: %.0f preemptions, TTFT p50 %.1f ms, %d rows seen live\n", pre,
           num(r, "ttft_p50_seconds") * 1e3, rows_seen);
    json_decref(kv);
}

int main(void) {
    const char *model = HR_SOURCE_DIR "/models/stories260K-q8_0.gguf";
    if (access(model, R_OK) != 0) HR_SKIP("%s is absent", model);
    hr_runtime_params rp = hr_runtime_default_params();
    rp.model_path = model;
    rp.kv_budget = 400 * 1024;
    rp.admission = HR_RT_ADMIT_OPTIMISTIC;
    rp.n_threads = 1;
    rp.isa = hr_test_isa();
    hr_runtime *rt = NULL;
    hr_error err = {0};
    if (hr_runtime_open(&rp, &rt, NULL, &err) != HR_OK || hr_runtime_start(rt, &err) != HR_OK) {
        CHECKF(false, "runtime: %s", err.msg);
        hr_runtime_close(rt);
        return hr_test_finish();
    }
    hr_server_params sp = hr_server_default_params();
    sp.port = 0;
    sp.api_key = KEY;
    hr_server *srv = NULL;
    CHECKF(hr_server_create(rt, &sp, &srv, &err) == HR_OK, "server: %s", err.msg);
    if (srv) {
        int port = hr_server_port(srv);
        test_page(port);
        test_kv_fields(port, rt);
        test_rows_and_rates(port);
        hr_server_shutdown(srv);
    }
    hr_server_destroy(srv);
    hr_runtime_close(rt);
    return hr_test_finish();
}

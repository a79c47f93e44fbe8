/* test_bench_serve.c: `headroom bench` end to end. Starts `headroom serve` on the demo model (the
 * repository's models/stories260K-q8_0.gguf) on a free port with an API key, and checks the JSON report
 * of short bounded runs against what was sent: counts, each request's max_tokens and tokens, KV
 * figures; then the bad inputs: a wrong key (refused 401), an unreachable URL, a server that answers
 * garbage and one that closes mid-stream (a fake server on a thread here), a bad --pattern and a bad
 * trace line (exit 2). Asserts no timing; every wait is bounded. */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "harness.h"

#define KEY "bench-test-key"

static pid_t server_pid = -1;

static void stop_server(void) {
    if (server_pid <= 0) return;
    kill(server_pid, SIGTERM);
    for (int i = 0; i < 300; i++) { /* up to 30 s for the drain, then SIGKILL */
        if (waitpid(server_pid, NULL, WNOHANG) == server_pid) {
            server_pid = -1;
            return;
        }
        usleep(100000);
    }
    kill(server_pid, SIGKILL);
    waitpid(server_pid, NULL, 0);
    server_pid = -1;
}

static char step_log_path[64] = "/tmp/hr_test_steps_XXXXXX";

/* serve --step-log wrote one JSON object per computed step, a line each as it happened (the server
 * was killed without a chance to flush): the counts are consistent, and the steps sampled at least
 * one token for every request the bench completed. */
static void check_step_log(int min_rows) {
    FILE *f = fopen(step_log_path, "r");
    CHECKF(f != NULL, "no step log at %s", step_log_path);
    if (!f) return;
    char line[512];
    int n = 0, rows = 0;
    bool ok = true;
    while (fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        int T = (int)json_integer_value(json_object_get(o, "tokens"));
        int P = (int)json_integer_value(json_object_get(o, "prefill"));
        int R = (int)json_integer_value(json_object_get(o, "rows"));
        int S = (int)json_integer_value(json_object_get(o, "seqs"));
        double keys = json_number_value(json_object_get(o, "visible_keys"));
        double st = json_number_value(json_object_get(o, "step_s")),
               fw = json_number_value(json_object_get(o, "forward_s"));
        bool good = o && T >= 1 && P >= 0 && P <= T && R >= 0 && R <= T && S >= 1 && S <= T && keys >= T && fw >= 0 &&
                    st >= fw && json_number_value(json_object_get(o, "t")) > 0;
        CHECKF(good, "step log line %d: %s", n + 1, line);
        ok = ok && good;
        rows += R;
        n++;
        json_decref(o);
    }
    fclose(f);
    CHECKF(ok && n > 0 && rows >= min_rows, "step log: %d steps, %d sampled rows (want >= %d)", n, rows, min_rows);
    remove(step_log_path);
}

/* Starts headroom serve; returns its port (0 on failure). The banner line names it. */
static int start_server(const char *model) {
    int fds[2];
    if (pipe(fds) != 0) return 0;
    server_pid = fork();
    if (server_pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execl(HR_HEADROOM_BIN, HR_HEADROOM_BIN, "serve", "-m", model, "--port", "0", "--host", "127.0.0.1", "--api-key",
              KEY, "--kv-seqs", "4", "-t", "1", "--step-log", step_log_path, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    char buf[8192];
    size_t len = 0;
    int port = 0;
    for (int waited = 0; waited < 600 && !port; waited++) { /* up to 60 s */
        struct pollfd pf = {.fd = fds[0], .events = POLLIN};
        if (poll(&pf, 1, 100) <= 0) continue;
        ssize_t got = read(fds[0], buf + len, sizeof buf - 1 - len);
        if (got <= 0) break;
        len += (size_t)got;
        buf[len] = '\0';
        const char *l = strstr(buf, "listening on 127.0.0.1:");
        if (l && strchr(l, '\n')) port = atoi(l + strlen("listening on 127.0.0.1:"));
    }
    close(fds[0]);
    return port;
}

static size_t discard(char *d, size_t s, size_t n, void *u) {
    (void)d;
    (void)u;
    return s * n;
}

/* Waits (up to 60 s) for /health to answer 200: the model loads after the port opens. */
static bool wait_healthy(int port) {
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/health", port);
    for (int i = 0; i < 300; i++) {
        CURL *h = curl_easy_init();
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard);
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 2000L);
        long code = 0;
        if (curl_easy_perform(h) == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
        curl_easy_cleanup(h);
        if (code == 200) return true;
        usleep(200000);
    }
    return false;
}

/* A free port nobody listens on: bind to 0, read it, close. */
static int closed_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t al = sizeof a;
    bind(fd, (struct sockaddr *)&a, sizeof a);
    getsockname(fd, (struct sockaddr *)&a, &al);
    close(fd);
    return ntohs(a.sin_port);
}

/* ---- a misbehaving server ---------------------------------------------------------------------- */

typedef struct fake {
    int fd, port;
    const char *reply; /* written after the request's head, then the connection is closed */
    atomic_bool stop;
    pthread_t th;
} fake;

static void *fake_main(void *arg) {
    fake *f = arg;
    while (!atomic_load(&f->stop)) {
        struct pollfd pf = {.fd = f->fd, .events = POLLIN};
        if (poll(&pf, 1, 100) <= 0) continue;
        int c = accept(f->fd, NULL, NULL);
        if (c < 0) continue;
        char buf[8192];
        struct pollfd pc = {.fd = c, .events = POLLIN};
        if (poll(&pc, 1, 5000) > 0 && read(c, buf, sizeof buf) > 0) {
            ssize_t w = write(c, f->reply, strlen(f->reply));
            (void)w;
        }
        close(c);
    }
    return NULL;
}

static bool fake_start(fake *f, const char *reply) {
    memset(f, 0, sizeof *f);
    f->reply = reply;
    f->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t al = sizeof a;
    if (bind(f->fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(f->fd, 16) != 0) return false;
    getsockname(f->fd, (struct sockaddr *)&a, &al);
    f->port = ntohs(a.sin_port);
    return pthread_create(&f->th, NULL, fake_main, f) == 0;
}

static void fake_stop(fake *f) {
    atomic_store(&f->stop, true);
    pthread_join(f->th, NULL);
    close(f->fd);
}

/* ---- the runs ---------------------------------------------------------------------------------- */

static json_t *bench_json(const char *args, int *rc, char **err_text) {
    char *out = NULL, *err = NULL;
    *rc = hr_test_run_cli(args, &out, &err);
    json_t *j = out ? json_loads(out, 0, NULL) : NULL;
    if (!j) fprintf(stderr, "bench %s: rc %d, stdout '%s', stderr '%s'\n", args, *rc, out ? out : "", err ? err : "");
    free(out);
    if (err_text)
        *err_text = err;
    else
        free(err);
    return j;
}

static long long jint(json_t *root, const char *obj, const char *key) {
    json_t *v = json_object_get(obj ? json_object_get(root, obj) : root, key);
    return json_is_integer(v) ? (long long)json_integer_value(v) : -1;
}

static void test_good_run(int port) {
    char args[512];
    /* one at a time, so every request after the first with the same system prompt finds it cached */
    snprintf(args, sizeof args,
             "bench --url http://127.0.0.1:%d/v1 --api-key " KEY " --pattern shared-prefix --scale 0.3 --requests 6 "
             "--concurrency 1 --seed 3 --json -q --csv %s/run.csv --plot %s/run.svg --slo-ttft 600000",
             port, hr_test_tmpdir(), hr_test_tmpdir());
    int rc;
    json_t *j = bench_json(args, &rc, NULL);
    CHECKF(rc == 0, "rc %d", rc);
    CHECK(j != NULL);
    if (!j) return;
    CHECK(jint(j, "requests", "sent") == 6 && jint(j, "requests", "ok") == 6);
    CHECK(jint(j, "requests", "refused") == 0 && jint(j, "requests", "failed") == 0);
    json_t *per = json_object_get(j, "per_request");
    CHECK(json_array_size(per) == 6);
    long long out_sum = 0;
    int prefix_seen[HR_BENCH_N_SHARED_PREFIXES] = {0}, repeats = 0;
    for (size_t i = 0; i < json_array_size(per); i++) {
        json_t *q = json_array_get(per, i);
        hr_bench_spec s;
        hr_error e;
        CHECK(hr_bench_pattern_spec(HR_BENCH_SHARED_PREFIX, 3, (int)i, 0.3, &s, &e) == HR_OK);
        /* the request the CLI sent is the library's request i for this seed, and with ignore_eos the
           server generated all of it */
        CHECKF(jint(q, NULL, "max_tokens") == s.max_tokens, "request %zu max_tokens", i);
        CHECKF(jint(q, NULL, "completion_tokens") == s.max_tokens, "request %zu tokens %lld of %d", i,
               jint(q, NULL, "completion_tokens"), s.max_tokens);
        CHECK(jint(q, NULL, "prompt_tokens") > 0 && jint(q, NULL, "kv_bytes_peak") > 0);
        CHECK(json_is_number(json_object_get(q, "ttft_ms")) && json_is_number(json_object_get(q, "e2e_ms")));
        CHECK(!strcmp(json_string_value(json_object_get(q, "status")), "ok"));
        repeats += prefix_seen[s.prefix_id]++ > 0;
        out_sum += s.max_tokens;
        hr_bench_spec_free(&s);
    }
    CHECK(jint(j, "tokens", "output") == out_sum);
    CHECK(jint(j, "ttft_ms", "n") == 6 && jint(j, "e2e_ms", "n") == 6);
    CHECK(jint(j, "throughput", "good") == 6);
    json_t *kv = json_object_get(j, "kv");
    CHECK(json_is_true(json_object_get(kv, "reported")));
    CHECK(jint(j, "kv", "requests_with_kv") == 6);
    CHECK(jint(j, "kv", "bytes_per_request_p50") > 0 && jint(j, "kv", "bytes_per_request_p99") > 0);
    CHECK(jint(j, "kv", "pool_total_bytes") > 0 && jint(j, "kv", "pool_peak_used_bytes") >= 0);
    CHECK(jint(j, "kv", "preemptions") == 0);
    CHECKF(repeats == 0 || jint(j, "kv", "prefix_hit_tokens") > 0, "%d repeated prefixes, %lld hit tokens", repeats,
           jint(j, "kv", "prefix_hit_tokens"));
    CHECK(repeats > 0); /* 6 requests over 4 system prompts */
    json_decref(j);

    char path[1100];
    snprintf(path, sizeof path, "%s/run.csv", hr_test_tmpdir());
    char *csv = hr_test_slurp(path, NULL);
    int lines = 0;
    for (const char *c = csv; c && *c; c++) lines += *c == '\n';
    CHECK(csv && !strncmp(csv, "index,status,http_code", 22) && lines == 7);
    free(csv);
    snprintf(path, sizeof path, "%s/run.svg", hr_test_tmpdir());
    char *svg = hr_test_slurp(path, NULL);
    CHECK(svg && !strncmp(svg, "<svg", 4) && strstr(svg, "</svg>") && strstr(svg, "KV pool used") &&
          strstr(svg, "latency (ms)"));
    free(svg);
}

static void test_table_and_trace(int port) {
    char trace[1100], args[1400];
    snprintf(trace, sizeof trace, "%s/t.jsonl", hr_test_tmpdir());
    FILE *f = fopen(trace, "w");
    fputs(
        "{\"prompt\": \"Once upon a time\", \"max_tokens\": 4}\n# comment\n{\"prompt_words\": 5, \"max_tokens\": 3}\n",
        f);
    fclose(f);
    snprintf(args, sizeof args, "bench --url http://127.0.0.1:%d --api-key " KEY " --pattern %s --chat -q", port,
             trace);
    char *out = NULL;
    int rc = hr_test_run_cli(args, &out, NULL);
    CHECKF(rc == 0, "trace run rc %d: %s", rc, out ? out : "");
    CHECK(out && strstr(out, "sent 2, ok 2") && strstr(out, "TTFT") && strstr(out, "KV/request"));
    free(out);
}

static void test_wrong_key(int port) {
    char args[256];
    snprintf(args, sizeof args,
             "bench --url http://127.0.0.1:%d --api-key wrong --pattern short-burst --requests 3 "
             "--json -q",
             port);
    int rc;
    json_t *j = bench_json(args, &rc, NULL);
    CHECK(rc == 1 && j);
    CHECK(jint(j, "requests", "sent") == 3 && jint(j, "requests", "refused") == 3 && jint(j, "requests", "ok") == 0);
    json_t *codes = json_object_get(json_object_get(j, "requests"), "refusals_by_code");
    CHECK(json_integer_value(json_object_get(codes, "401")) == 3);
    json_t *q = json_array_get(json_object_get(j, "per_request"), 0);
    CHECK(jint(q, NULL, "http_code") == 401 && strstr(json_string_value(json_object_get(q, "reason")), "API key"));
    json_decref(j);
}

static void expect_failures(int port, int n, const char *reason_part, const char *what) {
    char args[256];
    snprintf(args, sizeof args,
             "bench --url http://127.0.0.1:%d --pattern decode-heavy --requests %d --concurrency 2 --poll-ms 0 "
             "--timeout 30 --json -q",
             port, n);
    int rc;
    json_t *j = bench_json(args, &rc, NULL);
    CHECKF(rc == 1 && j, "%s: rc %d", what, rc);
    CHECKF(jint(j, "requests", "sent") == n && jint(j, "requests", "failed") == n, "%s", what);
    CHECK(!json_is_true(json_object_get(json_object_get(j, "kv"), "reported")));
    /* one cause, one reason: the same failure of n requests is grouped however long each took */
    CHECKF(json_object_size(json_object_get(json_object_get(j, "requests"), "failure_reasons")) == 1, "%s", what);
    json_t *q = json_array_get(json_object_get(j, "per_request"), 0);
    const char *reason = json_string_value(json_object_get(q, "reason"));
    CHECKF(reason && strstr(reason, reason_part), "%s: reason '%s'", what, reason ? reason : "(none)");
    json_decref(j);
}

static void test_bad_servers(void) {
    expect_failures(closed_port(), 3, "onnect", "unreachable URL");
    fake f;
    CHECK(fake_start(&f, "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nConnection: close\r\n\r\n"
                         "<html><body>not an API</body></html>\n"));
    expect_failures(f.port, 2, "garbage", "garbage body");
    fake_stop(&f);
    CHECK(fake_start(&f, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
                         "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\n"));
    expect_failures(f.port, 2, "before [DONE] after 2 tokens", "closed mid-stream");
    fake_stop(&f);
    CHECK(fake_start(&f, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                         "20\r\ndata: {\"choices\":[{\"text\":\"a\"}]}\n\n"));
    expect_failures(f.port, 1, "", "chunked stream cut");
    fake_stop(&f);
}

static void test_usage_errors(void) {
    char *err = NULL;
    int rc = hr_test_run_cli("bench --url http://127.0.0.1:1 --pattern bursty", NULL, &err);
    CHECK(rc == 2 && err && strstr(err, "unknown pattern 'bursty'"));
    free(err);
    char trace[1100], args[1300];
    snprintf(trace, sizeof trace, "%s/bad.jsonl", hr_test_tmpdir());
    FILE *f = fopen(trace, "w");
    fputs("{\"prompt\": \"a\", \"max_tokens\": 4}\n{\"prompt\": \"a\", \"max_tokens\": -4}\n", f);
    fclose(f);
    snprintf(args, sizeof args, "bench --url http://127.0.0.1:1 --pattern %s", trace);
    rc = hr_test_run_cli(args, NULL, &err);
    CHECKF(rc == 2 && err && strstr(err, "bad.jsonl:2:") && strstr(err, "max_tokens"), "stderr '%s'", err);
    free(err);
    rc = hr_test_run_cli("bench --url http://127.0.0.1:1 --pattern /nonexistent.jsonl", NULL, &err);
    CHECK(rc == 2 && err && strstr(err, "/nonexistent.jsonl"));
    free(err);
    static const char *bad[] = {
        "bench --pattern mixed",
        "bench --url 127.0.0.1:1 --pattern mixed",
        "bench --url http://x --pattern mixed --rate 2 --concurrency 2",
        "bench --url http://x --pattern mixed --requests 2 --duration 3",
        "bench --url http://x --pattern mixed --requests 0",
        "bench --url http://x --pattern mixed --scale 0",
        "bench --url http://x --pattern mixed --bogus",
    };
    for (size_t i = 0; i < HR_ARRAY_LEN(bad); i++) {
        rc = hr_test_run_cli(bad[i], NULL, &err);
        CHECKF(rc == 2 && err && strchr(err, '\n') == err + strlen(err) - 1, "'%s': rc %d, '%s'", bad[i], rc, err);
        free(err);
    }
}

int main(void) {
    unsetenv("HEADROOM_API_KEY");
    signal(SIGPIPE, SIG_IGN);
    char model[1024];
    snprintf(model, sizeof model, "%s/models/stories260K-q8_0.gguf", HR_SOURCE_DIR);
    if (access(model, R_OK) != 0) HR_SKIP("%s is absent", model);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    test_usage_errors();
    test_bad_servers();
    int fd = mkstemp(step_log_path);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    int port = start_server(model);
    CHECKF(port > 0, "headroom serve did not print its port within 60 s");
    if (port > 0 && wait_healthy(port)) {
        test_good_run(port);
        test_table_and_trace(port);
        test_wrong_key(port);
    } else {
        CHECKF(false, "headroom serve on port %d never answered /health 200", port);
    }
    stop_server();
    check_step_log(6);
    curl_global_cleanup();
    return hr_test_finish();
}

/* test_server_hostile_req.c: the request layer against hostile clients (issue 28), in one server process:
 *   1. 12 concurrent 4 MiB bodies of "{}" elements (~290 MiB each to parse, unbounded) each get 413
 *      naming the parse limit, normal requests succeed meanwhile, and the process's peak RSS (VmHWM)
 *      stays under its memory plan (which counts the parse bound) plus a stated allowance for the raw
 *      bodies (2 x 4 MiB per connection) and 64 MiB of slack (thread stacks, malloc arenas). This runs first: VmHWM
 * only grows.
 *   2. Cache scopes: one prompt under two API keys gets 0 prefix-hit tokens across and full hits within;
 *      the same with two cache_salt values under one key; with --cache-scope shared, hits across.
 *   3. /v1/kv events never hold body text: an invalid-JSON body and a bad kv_policy carrying a secret.
 *   4. max_tokens: a window policy with max_tokens 2^30 ends at 4 contexts ("length"), with
 *      top_logprobs 20 too (200, not 500); --max-tokens-limit refuses above it under a window too. */
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"
#include "harness.h"
#include "http_client.h"
#include "runtime/runtime.h"
#include "server/server.h"

/* Under a sanitizer the process's RSS is mostly shadow memory and quarantine (as in test_plan_rss.c):
 * the RSS bound is checked in the plain build, the 413s everywhere. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define HR_RSS_MEANINGLESS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define HR_RSS_MEANINGLESS 1
#endif
#endif

/* ---- 1. amplification ---------------------------------------------------------------------------- */

#define N_HOSTILE  12
#define BODY_BYTES ((4u << 20) - 64) /* under --max-body 4 MiB (with its NUL: one 4 MiB buffer) */

typedef struct hostile_arg {
    int port;
    const char *body;
    int status;
    bool names_limit;
} hostile_arg;

static void *hostile_client(void *p) {
    hostile_arg *a = p;
    int fd = hr_http_dial(a->port);
    if (fd < 0) return NULL;
    hr_http_send(fd, "POST", "/v1/completions", NULL, a->body, strlen(a->body));
    hr_http_resp r;
    hr_http_read(fd, &r);
    close(fd);
    a->status = r.status;
    a->names_limit = r.body && strstr(r.body, "parse_memory_exceeded") && strstr(r.body, "JSON parse limit");
    hr_http_resp_free(&r);
    return NULL;
}

typedef struct normal_arg {
    int port, ok, tried;
} normal_arg;

static void *normal_client(void *p) {
    normal_arg *a = p;
    for (int i = 0; i < 4; i++) {
        hr_http_resp r = hr_http_call(a->port, "POST", "/v1/completions", NULL,
                                      "{\"prompt\":\"Once upon a time\",\"max_tokens\":4,\"temperature\":0}");
        a->tried++;
        a->ok += r.status == 200 && r.body && strstr(r.body, "\"choices\"");
        hr_http_resp_free(&r);
    }
    return NULL;
}

static void test_amplification(hr_runtime *rt, const hr_server_params *base) {
    hr_server_params sp = *base;
    sp.max_body_bytes = 4u << 20;
    hr_server *srv = NULL;
    hr_error err = {0};
    CHECKF(hr_server_create(rt, &sp, &srv, &err) == HR_OK, "server: %s", err.msg);
    if (!srv) return;
    int port = hr_server_port(srv);
    /* {"prompt":"hi","x":[{},{},...]} */
    char *body = malloc(BODY_BYTES + 1);
    size_t n = (size_t)sprintf(body, "{\"prompt\":\"hi\",\"x\":[{}");
    while (n + 5 < BODY_BYTES) memcpy(body + n, ",{}", 3), n += 3;
    memcpy(body + n, "]}", 3);
    hostile_arg ha[N_HOSTILE];
    pthread_t th[N_HOSTILE], nt;
    normal_arg na = {.port = port};
    for (int i = 0; i < N_HOSTILE; i++) {
        ha[i] = (hostile_arg){.port = port, .body = body};
        pthread_create(&th[i], NULL, hostile_client, &ha[i]);
    }
    pthread_create(&nt, NULL, normal_client, &na);
    for (int i = 0; i < N_HOSTILE; i++) pthread_join(th[i], NULL);
    pthread_join(nt, NULL);
    int refused = 0;
    for (int i = 0; i < N_HOSTILE; i++) {
        CHECKF(ha[i].status == 413 && ha[i].names_limit, "amplification body %d: status %d", i, ha[i].status);
        refused += ha[i].status == 413;
    }
    CHECKF(na.ok == na.tried && na.tried == 4, "normal requests meanwhile: %d of %d", na.ok, na.tried);
    hr_runtime_memory m;
    hr_runtime_get_memory(rt, &m);
    uint64_t allowance = (uint64_t)N_HOSTILE * 2 * sp.max_body_bytes + (64ull << 20);
    printf("amplification: %d/%d refused with 413; peak RSS %.1f MiB, plan %.1f MiB (parse bound %.0f MiB) + "
           "allowance %.0f MiB\n",
           refused, N_HOSTILE, m.peak_rss_bytes / 1048576.0, m.planned_bytes / 1048576.0, m.request_bytes / 1048576.0,
           allowance / 1048576.0);
    CHECK(m.request_bytes == sp.max_parse_bytes);
#ifdef HR_RSS_MEANINGLESS
    m.peak_rss_bytes = 0;
#endif
    if (m.peak_rss_bytes) /* /proc readable, no sanitizer */
        CHECKF(m.peak_rss_bytes < m.planned_bytes + allowance, "peak RSS %llu over plan %llu + %llu",
               (unsigned long long)m.peak_rss_bytes, (unsigned long long)m.planned_bytes,
               (unsigned long long)allowance);
    /* a real 3 MiB prompt still parses under the same bound */
    char *big = malloc(3u << 20);
    size_t k = (size_t)sprintf(big, "{\"prompt\":\"");
    while (k < (3u << 20) - 64) big[k++] = 'a';
    sprintf(big + k, "\",\"max_tokens\":1,\"temperature\":0}");
    hr_http_resp r = hr_http_call(port, "POST", "/tokenize", NULL, "{\"content\":\"hi\"}");
    CHECKF(r.status == 200, "tokenize after: %d", r.status);
    hr_http_resp_free(&r);
    int fd = hr_http_dial(port);
    hr_http_send(fd, "POST", "/v1/completions", NULL, big, strlen(big));
    hr_http_read(fd, &r);
    close(fd);
    /* parsed: refused for its length in tokens (context), not for memory */
    CHECKF(r.status == 400 && r.body && strstr(r.body, "context_length_exceeded"), "3 MiB prompt: %d %.200s", r.status,
           r.body ? r.body : "");
    hr_http_resp_free(&r);
    free(big);
    free(body);
    hr_server_destroy(srv);
}

/* ---- 2. cache scopes ---------------------------------------------------------------------------- */

static int hits(int port, const char *key, const char *salt) {
    char headers[128], body[1024];
    snprintf(headers, sizeof headers, "Authorization: Bearer %s\r\n", key);
    snprintf(body, sizeof body,
             "{\"prompt\":\"Once upon a time there was a little girl named Lily. She liked to play outside in the "
             "park with her big red ball and her little dog Max every day\",\"max_tokens\":1,\"temperature\":0%s%s%s}",
             salt ? ",\"cache_salt\":\"" : "", salt ? salt : "", salt ? "\"" : "");
    hr_http_resp r = hr_http_call(port, "POST", "/v1/completions", headers, body);
    json_t *j = hr_http_json(&r);
    json_t *kv = json_object_get(json_object_get(j, "usage"), "kv");
    int h = r.status == 200 && json_is_integer(json_object_get(kv, "prefix_hit_tokens"))
                ? (int)json_integer_value(json_object_get(kv, "prefix_hit_tokens"))
                : -1;
    CHECKF(h >= 0, "completion under key %s: %d %s", key, r.status, r.body);
    json_decref(j);
    hr_http_resp_free(&r);
    return h;
}

static void test_scopes(hr_runtime *rt, const hr_server_params *base) {
    hr_server_params sp = *base;
    sp.api_key = "key-a, key-b";
    hr_server *srv = NULL;
    hr_error err = {0};
    CHECKF(hr_server_create(rt, &sp, &srv, &err) == HR_OK, "server: %s", err.msg);
    if (!srv) return;
    int port = hr_server_port(srv);
    hr_http_resp r = hr_http_call(port, "GET", "/v1/models", "Authorization: Bearer key-b\r\n", NULL);
    CHECKF(r.status == 200, "second key accepted: %d", r.status);
    hr_http_resp_free(&r);
    r = hr_http_call(port, "GET", "/v1/models", "Authorization: Bearer key-a, key-b\r\n", NULL);
    CHECKF(r.status == 401, "the list itself is no key: %d", r.status);
    hr_http_resp_free(&r);
    int a1 = hits(port, "key-a", NULL), a2 = hits(port, "key-a", NULL);
    int b1 = hits(port, "key-b", NULL), b2 = hits(port, "key-b", NULL);
    printf("scopes by key: a %d then %d, b %d then %d\n", a1, a2, b1, b2);
    CHECKF(a1 == 0 && a2 >= 32 && a2 % 16 == 0, "key a: %d then %d", a1, a2);
    CHECKF(b1 == 0 && b2 == a2, "key b: %d then %d (a: %d)", b1, b2, a2);
    /* salts under one key */
    int s1 = hits(port, "key-a", "x"), s2 = hits(port, "key-a", "x"), s3 = hits(port, "key-a", "y");
    printf("scopes by salt: x %d then %d, y %d\n", s1, s2, s3);
    CHECKF(s1 == 0 && s2 == a2 && s3 == 0, "salts: x %d then %d, y %d", s1, s2, s3);
    hr_server_destroy(srv);

    /* shared: the same two keys see each other's blocks (the scope is what isolates); a salt still does */
    sp.cache_scope = HR_CACHE_SCOPE_SHARED;
    srv = NULL;
    CHECKF(hr_server_create(rt, &sp, &srv, &err) == HR_OK, "server: %s", err.msg);
    if (!srv) return;
    port = hr_server_port(srv);
    int c1 = hits(port, "key-a", NULL), c2 = hits(port, "key-b", NULL), c3 = hits(port, "key-b", "z");
    /* the first fills the shared scope (the blocks above were in key scopes) */
    CHECKF(c1 == 0 && c2 == a2 && c3 == 0, "shared: %d, %d, salted %d", c1, c2, c3);
    hr_server_destroy(srv);
}

/* ---- 3. events carry no body text ---------------------------------------------------------------- */

static void test_events(hr_runtime *rt, const hr_server_params *base) {
    hr_server_params sp = *base;
    hr_server *srv = NULL;
    hr_error err = {0};
    CHECKF(hr_server_create(rt, &sp, &srv, &err) == HR_OK, "server: %s", err.msg);
    if (!srv) return;
    int port = hr_server_port(srv);
    const char *bad[] = {
        "{\"prompt\":\"hi\",\"password\": hunter2SECRET}", "{\"prompt\":\"hi\",\"password\":\"hunter2SECRET\" \"x\":1}",
        "{\"prompt\":\"hi\",\"kv_policy\":\"hunter2SECRET\"}", "{\"prompt\":\"hi\",\"stop\":[\"hunter2SECRET\",7]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":\"hunter2SECRET\"}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *path = strstr(bad[i], "messages") ? "/v1/chat/completions" : "/v1/completions";
        hr_http_resp r = hr_http_call(port, "POST", path, NULL, bad[i]);
        CHECKF(r.status == 400, "bad body %zu: %d %s", i, r.status, r.body);
        if (i < 2) /* the client learns where, never an echo */
            CHECKF(r.body && strstr(r.body, "line 1 column") && !strstr(r.body, "hunter2"), "%s", r.body);
        hr_http_resp_free(&r);
    }
    hr_http_resp r = hr_http_call(port, "GET", "/v1/kv", NULL, NULL);
    json_t *j = hr_http_json(&r);
    json_t *ev = json_object_get(j, "events");
    int refusals = 0;
    for (size_t i = 0; i < json_array_size(ev); i++) {
        const char *kind = json_string_value(json_object_get(json_array_get(ev, i), "kind"));
        refusals += kind && !strcmp(kind, "refusal");
    }
    CHECKF(r.status == 200 && refusals >= 5, "/v1/kv lists the refusals: %d", refusals);
    CHECKF(r.body && !strstr(r.body, "hunter2"), "/v1/kv leaks body text: %s", r.body ? r.body : "");
    CHECKF(r.body && strstr(r.body, "'max_tokens'"), "field names stay in events: %s", r.body ? r.body : "");
    json_decref(j);
    hr_http_resp_free(&r);
    hr_server_destroy(srv);
}

/* ---- 4. unbounded work ------------------------------------------------------------------------- */

static void test_max_tokens(hr_runtime *rt, const hr_server_params *base) {
    hr_server_params sp = *base;
    hr_server *srv = NULL;
    hr_error err = {0};
    CHECKF(hr_server_create(rt, &sp, &srv, &err) == HR_OK, "server: %s", err.msg);
    if (!srv) return;
    int port = hr_server_port(srv);
    int n_ctx = hr_runtime_n_ctx(rt);
    const char *bodies[] = {
        "{\"prompt\":\"Once\",\"max_tokens\":1073741824,\"kv_policy\":\"window:64\",\"ignore_eos\":true,\"n\":2}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"Once\"}],\"max_tokens\":1073741824,\"kv_policy\":"
        "\"window:64\",\"ignore_eos\":true,\"logprobs\":true,\"top_logprobs\":20}"};
    for (int i = 0; i < 2; i++) {
        hr_http_resp r = hr_http_call(port, "POST", i ? "/v1/chat/completions" : "/v1/completions", NULL, bodies[i]);
        json_t *j = hr_http_json(&r);
        json_t *u = json_object_get(j, "usage");
        long long prompt = json_integer_value(json_object_get(u, "prompt_tokens"));
        long long done = json_integer_value(json_object_get(u, "completion_tokens"));
        const char *fin =
            json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "finish_reason"));
        CHECKF(r.status == 200 && fin && !strcmp(fin, "length"), "window, huge max_tokens %d: %d %.200s", i, r.status,
               r.body ? r.body : "");
        CHECKF(prompt + done / (i ? 1 : 2) == 4LL * n_ctx, "window run %d: %lld prompt + %lld output, want 4 x %d", i,
               prompt, done, n_ctx);
        json_decref(j);
        hr_http_resp_free(&r);
    }
    hr_server_destroy(srv);
    sp.max_tokens_limit = 100;
    srv = NULL;
    CHECKF(hr_server_create(rt, &sp, &srv, &err) == HR_OK, "server: %s", err.msg);
    if (!srv) return;
    port = hr_server_port(srv);
    hr_http_resp r = hr_http_call(port, "POST", "/v1/completions", NULL,
                                  "{\"prompt\":\"Once\",\"max_tokens\":101,\"kv_policy\":\"window:64\"}");
    CHECKF(r.status == 400 && r.body && strstr(r.body, "\"param\":\"max_tokens\"") && strstr(r.body, "100"),
           "over --max-tokens-limit under a window: %d %s", r.status, r.body);
    hr_http_resp_free(&r);
    r = hr_http_call(port, "POST", "/v1/chat/completions", NULL,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"Once\"}],\"kv_policy\":\"window:64\","
                     "\"ignore_eos\":true}");
    json_t *j = hr_http_json(&r);
    CHECKF(r.status == 200 &&
               json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")) == 100,
           "window without max_tokens stops at the limit: %d %s", r.status, r.body);
    json_decref(j);
    hr_http_resp_free(&r);
    hr_server_destroy(srv);
}

int main(void) {
    const char *model = hr_test_shared_path("models/stories260K.gguf");
    if (!model) printf("stories260K absent: the built-in demo model serves\n");
    hr_server_params sp = hr_server_default_params();
    sp.port = 0;
    hr_runtime_params rp = hr_runtime_default_params();
    rp.model_path = model;
    rp.n_ctx = 256;
    rp.kv_seqs = 4;
    rp.max_running = 4;
    rp.n_threads = 2;
    rp.isa = hr_test_isa();
    rp.request_bytes = sp.max_parse_bytes; /* as `headroom serve` plans */
    hr_runtime *rt = NULL;
    hr_error err = {0};
    CHECKF(hr_runtime_open(&rp, &rt, NULL, &err) == HR_OK, "runtime: %s", err.msg);
    if (!rt || hr_runtime_start(rt, &err) != HR_OK) {
        hr_runtime_close(rt);
        return hr_test_finish();
    }
    test_amplification(rt, &sp);
    test_scopes(rt, &sp);
    test_events(rt, &sp);
    test_max_tokens(rt, &sp);
    hr_runtime_close(rt);
    return hr_test_finish();
}

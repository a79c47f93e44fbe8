/* test_server_parse.c: the server's request validation without a socket (the functions the HTTP
 * handlers and fuzz/fuzz_http.c share): bodies, the security limits on n and max_tokens, tokenize and
 * detokenize fields. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "server/server_internal.h"

static json_t *body(const char *text) {
    hr_srv_error e = {0};
    json_t *root = hr_srv_parse_body(text, strlen(text), &e);
    CHECKF(root != NULL, "'%s': %s", text, e.msg);
    return root;
}

/* Parses a generation body with sp; returns the HTTP status (200 when accepted) and the field at
 * fault in *param. */
static int gen(const hr_server_params *sp, const char *text, int *max_tokens, const char **param) {
    json_t *root = body(text);
    hr_srv_gen g;
    hr_srv_error e = {0};
    bool ok = root && hr_srv_parse_gen(HR_SRV_COMPLETION, root, sp, 1, &g, &e);
    if (ok && max_tokens) *max_tokens = g.rp.max_tokens;
    if (param) *param = e.param;
    hr_srv_gen_free(&g);
    json_decref(root);
    return ok ? 200 : e.http;
}

static void test_bodies(void) {
    const char *bad[] = {"", "{", "[1]", "\"x\"", "{\"a\":1}x", "\xff{}", "{\"prompt\":\"\xed\xa0\x80\"}",
                         /* jansson quotes the bad escape, newline included: still one line */
                         "{\"m\\\n\":1}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        hr_srv_error e = {0};
        json_t *root = hr_srv_parse_body(bad[i], strlen(bad[i]), &e);
        CHECKF(!root && e.http == 400 && e.msg[0] && !strchr(e.msg, '\n'), "body %zu: %d %s", i, e.http, e.msg);
        /* bytes that are not UTF-8 are named as such, before any JSON parser sees them */
        bool utf8 = i == 5 || i == 6;
        CHECKF(e.code && !strcmp(e.code, utf8 ? "invalid_utf8" : "invalid_json"), "body %zu: code %s", i, e.code);
        json_decref(root);
    }
}

static void test_limits(void) {
    hr_server_params sp = hr_server_default_params();
    sp.max_choices = 2;
    sp.max_tokens_limit = 10;
    int mt = 0;
    const char *param = NULL;
    CHECK(gen(&sp, "{\"prompt\":\"a\",\"n\":2,\"max_tokens\":10}", &mt, NULL) == 200 && mt == 10);
    CHECK(gen(&sp, "{\"prompt\":\"a\",\"n\":3}", NULL, &param) == 400 && param && !strcmp(param, "n"));
    CHECK(gen(&sp, "{\"prompt\":\"a\",\"max_tokens\":11}", NULL, &param) == 400 && param &&
          !strcmp(param, "max_tokens"));
    CHECK(gen(&sp, "{\"prompt\":\"a\",\"max_completion_tokens\":11}", NULL, &param) == 400);
    /* an omitted max_tokens stops at the limit when the default is larger */
    sp.default_completion_tokens = 50;
    CHECK(gen(&sp, "{\"prompt\":\"a\"}", &mt, NULL) == 200 && mt == 10);
    sp.default_completion_tokens = 4;
    CHECK(gen(&sp, "{\"prompt\":\"a\"}", &mt, NULL) == 200 && mt == 4);
    /* no limit: the context bounds it (the runtime clamps), any positive value parses */
    sp.max_tokens_limit = 0;
    CHECK(gen(&sp, "{\"prompt\":\"a\",\"max_tokens\":100000}", &mt, NULL) == 200 && mt == 100000);
    CHECK(gen(&sp, "{\"prompt\":\"a\",\"max_tokens\":0}", NULL, &param) == 400);
}

static void test_tokenize_detokenize(void) {
    json_t *root = body("{\"content\":\"hi\",\"add_special\":true,\"with_pieces\":true}");
    hr_srv_tokenize q;
    hr_srv_error e = {0};
    CHECK(root && hr_srv_parse_tokenize(root, &q, &e) && q.len == 2 && q.opts.add_bos && q.opts.parse_special &&
          q.with_pieces);
    json_decref(root);
    root = body("{\"content\":3}");
    CHECK(root && !hr_srv_parse_tokenize(root, &q, &e) && e.http == 400 && !strcmp(e.param, "content"));
    json_decref(root);
    root = body("{\"content\":\"x\",\"with_pieces\":1}");
    CHECK(root && !hr_srv_parse_tokenize(root, &q, &e) && !strcmp(e.param, "with_pieces"));
    json_decref(root);

    int32_t *ids = NULL;
    size_t n = 0;
    root = body("{\"tokens\":[0,5,9]}");
    CHECK(root && hr_srv_parse_detokenize(root, 10, &ids, &n, &e) && n == 3 && ids[2] == 9);
    free(ids);
    json_decref(root);
    const char *bad[] = {"{\"tokens\":[10]}", "{\"tokens\":[-1]}", "{\"tokens\":[1.5]}", "{\"tokens\":\"1\"}", "{}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        root = body(bad[i]);
        ids = NULL;
        CHECKF(root && !hr_srv_parse_detokenize(root, 10, &ids, &n, &e) && e.http == 400 && ids == NULL &&
                   !strcmp(e.param, "tokens"),
               "%s", bad[i]);
        json_decref(root);
    }
}

static void test_retry_after(void) {
    CHECK(hr_srv_retry_after_secs(0) == 1 && hr_srv_retry_after_secs(0.2) == 1 && hr_srv_retry_after_secs(1) == 1);
    CHECK(hr_srv_retry_after_secs(1.01) == 2 && hr_srv_retry_after_secs(2.5) == 3 && hr_srv_retry_after_secs(7) == 7);
    CHECK(hr_srv_retry_after_secs(-3) == 1 && hr_srv_retry_after_secs(NAN) == 1);
    CHECK(hr_srv_retry_after_secs(1e12) == 86400);
}

/* Issue 28: bounded parsing, no echo of body text, cache scopes, key lists, out of memory as 503. */
static void test_hostile(void) {
    /* jansson's " near '...'" never reaches the message: the client learns line and column only */
    hr_srv_error e = {0};
    const char *secret = "{\"prompt\":\"hi\",\"password\": hunter2}";
    CHECK(!hr_srv_parse_body(secret, strlen(secret), &e) && e.http == 400 && strstr(e.msg, "line 1 column") &&
          !strstr(e.msg, "hunter2") && !strstr(e.msg, "near"));

    hr_srv_parse_pool *pool = hr_srv_parse_pool_create(4u << 20, 1u << 20);
    CHECK(pool && hr_srv_parse_pool_limit(pool) == (4u << 20) && hr_srv_parse_pool_per_request(pool) == (1u << 20));
    /* 64 KiB of {} elements: ~4.5 MiB unbounded; here past its bound of 64 x 64 KiB + 256 KiB... capped at 1 MiB */
    size_t n = 64u << 10;
    char *dense = malloc(n + 8);
    size_t k = (size_t)sprintf(dense, "{\"x\":[{}");
    while (k + 6 < n) memcpy(dense + k, ",{}", 3), k += 3;
    memcpy(dense + k, "]}", 3);
    size_t held = 1;
    json_t *root = hr_srv_parse_body_in(pool, dense, strlen(dense), &held, &e);
    CHECKF(!root && e.http == 413 && !strcmp(e.code, "parse_memory_exceeded") && strstr(e.msg, "JSON parse limit") &&
               held == 0 && hr_srv_parse_pool_held(pool) == 0,
           "dense body: %d %s, %zu held", e.http, e.msg, hr_srv_parse_pool_held(pool));
    /* 3 KiB of {} elements: within its bound (64 x 3 KiB + 256 KiB) */
    dense[3000] = 0;
    k = 3000;
    while (dense[k - 1] != '}' || dense[k - 2] != '{') k--;
    strcpy(dense + k, "]}");
    root = hr_srv_parse_body_in(pool, dense, strlen(dense), &held, &e);
    CHECKF(root && held > 0 && hr_srv_parse_pool_held(pool) == held, "small dense body: %s", e.msg);
    json_decref(root);
    hr_srv_parse_pool_release(pool, held);
    CHECK(hr_srv_parse_pool_held(pool) == 0 && hr_srv_parse_pool_peak(pool) >= held);
    /* a 600 KiB string: needs ~2 MiB while the lexer copies it, over the per-request 1 MiB */
    char *str = malloc(600u << 10);
    k = (size_t)sprintf(str, "{\"prompt\":\"");
    while (k < (600u << 10) - 8) str[k++] = 'a';
    strcpy(str + k, "\"}");
    root = hr_srv_parse_body_in(pool, str, strlen(str), &held, &e);
    CHECKF(!root && e.http == 413 && strstr(e.msg, "per-request") && hr_srv_parse_pool_held(pool) == 0, "%d %s", e.http,
           e.msg);
    /* 200 KiB: parses; while it is held, the rest of the pool still serves */
    str[200u << 10] = 0;
    strcpy(str + (200u << 10) - 2, "\"}");
    root = hr_srv_parse_body_in(pool, str, strlen(str), &held, &e);
    CHECKF(root && held >= (200u << 10) && held < (1u << 20), "200 KiB prompt: %s (%zu held)", e.msg, held);
    json_decref(root);
    hr_srv_parse_pool_release(pool, held);
    CHECK(hr_srv_parse_pool_held(pool) == 0);
    free(str);
    free(dense);
    hr_srv_parse_pool_destroy(pool);

    /* events: quoted client text and echoed values go; field names stay */
    char out[256];
    hr_srv_redact("'stop[0]' must be a string, got 7; 'max_tokens' must be between 1 and 5, got 1073741824", out,
                  sizeof out);
    CHECKF(!strcmp(out, "'stop[0]' must be a string, got ...; 'max_tokens' must be between 1 and 5, got ..."), "%s",
           out);
    hr_srv_redact("kv_policy: unknown policy 'hunter2' (known: \"full\")", out, sizeof out);
    CHECKF(!strstr(out, "hunter2") && strstr(out, "'...'"), "%s", out);
    hr_srv_redact("invalid JSON at line 1 column 9: '}' expected", out, sizeof out);
    CHECKF(!strcmp(out, "invalid JSON at line 1 column 9: '}' expected"), "%s", out);
    hr_srv_redact("'a", out, 4);
    CHECK(strlen(out) < 4);

    /* out of memory for a request's buffers: 503 naming max_tokens (from the error's code, as the engine
       sets it), never 500; without that code no field, whatever the text says */
    hr_error oom = {0};
    hr_error_set_param(&oom, HR_ERR_NOMEM, HR_PARAM_MAX_TOKENS, NULL, "out of memory creating a request");
    hr_srv_fail_status(&e, NULL, HR_ERR_NOMEM, &oom, "prompt", NULL);
    CHECK(e.http == 503 && !strcmp(e.code, "out_of_memory") && !strcmp(e.param, "max_tokens"));
    hr_error_set(&oom, HR_ERR_NOMEM, "out of memory creating a request");
    memset(&e, 0, sizeof e);
    hr_srv_fail_status(&e, NULL, HR_ERR_NOMEM, &oom, "prompt", NULL);
    CHECK(e.http == 503 && e.param == NULL);

    /* scopes */
    uint64_t none = hr_srv_cache_scope(NULL, NULL, 0), k0 = hr_srv_cache_scope("key-a", NULL, 0),
             k1 = hr_srv_cache_scope("key-b", NULL, 0), x = hr_srv_cache_scope("key-a", "x", 1),
             y = hr_srv_cache_scope("key-a", "y", 1), sx = hr_srv_cache_scope(NULL, "x", 1),
             empty = hr_srv_cache_scope(NULL, "", 0);
    CHECK(none == 0 && k0 && k1 && k0 != k1 && x != y && x != k0 && sx != x && sx && empty && empty != sx);
    CHECK(hr_srv_cache_scope("key-a", "x", 1) == x); /* the same tenant and salt: the same scope, every time */
    hr_server_params sp = hr_server_default_params();
    const char *param = NULL;
    CHECK(gen(&sp, "{\"prompt\":\"a\",\"cache_salt\":5}", NULL, &param) == 400 && param &&
          !strcmp(param, "cache_salt"));
    CHECK(gen(&sp, "{\"prompt\":\"a\",\"cache_salt\":\"s\"}", NULL, NULL) == 200);

    /* key lists */
    char **keys = NULL;
    int n_keys = 0;
    hr_error err = {0};
    CHECK(hr_server_keys_parse(" k1, k2 ,k3", &keys, &n_keys, &err) == HR_OK && n_keys == 3 && !strcmp(keys[0], "k1") &&
          !strcmp(keys[1], "k2") && !strcmp(keys[2], "k3"));
    CHECK(hr_server_keys_match(keys, n_keys, "k2") == 1 && hr_server_keys_match(keys, n_keys, "k") == -1 &&
          hr_server_keys_match(keys, n_keys, "k3 ") == -1 && hr_server_keys_match(keys, n_keys, "") == -1);
    hr_server_keys_free(keys, n_keys);
    CHECK(hr_server_keys_parse("a,,b", &keys, &n_keys, &err) == HR_ERR_INVALID_ARG && !keys && n_keys == 0);
    CHECK(hr_server_keys_parse("", &keys, &n_keys, &err) == HR_OK && !keys && n_keys == 0);
}

int main(void) {
    test_hostile();
    test_retry_after();
    test_bodies();
    test_limits();
    test_tokenize_detokenize();
    return hr_test_finish();
}

/* test_server_parse.c: the server's request validation without a socket (the functions the HTTP
 * handlers and fuzz/fuzz_http.c share): bodies, the security limits on n and max_tokens, tokenize and
 * detokenize fields. */
#include <math.h>
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

int main(void) {
    test_retry_after();
    test_bodies();
    test_limits();
    test_tokenize_detokenize();
    return hr_test_finish();
}

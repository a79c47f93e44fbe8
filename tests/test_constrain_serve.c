/* test_constrain_serve.c: constrained decoding over loopback HTTP (libcurl): response_format and every
 * guided_* field succeed on both routes; every bad input gets a 400 whose `param` names the field and
 * whose message gives the reason (a schema keyword not supported, a schema that does not compile, an
 * invalid regex, a grammar with an undefined rule, a bound passed, malformed shapes, two constraints
 * at once); a grammar that cannot finish within max_tokens ends "length". The repo's stories260K-q8_0
 * serves. A streamed answer whose characters are split across byte tokens is the whole answer, chunk
 * by chunk. Every wait is bounded (libcurl's timeout). */
#include <curl/curl.h>
#include <jansson.h>
#include <string.h>

#include "common/utf8.h"
#include "constrain/constrain.h"
#include "harness.h"
#include "runtime/runtime.h"
#include "server/server.h"

typedef struct body {
    char *s;
    size_t n;
} body;

static size_t on_data(char *p, size_t sz, size_t nm, void *u) {
    body *b = u;
    char *s = realloc(b->s, b->n + sz * nm + 1);
    if (!s) return 0;
    memcpy(s + b->n, p, sz * nm);
    b->s = s;
    b->n += sz * nm;
    b->s[b->n] = 0;
    return sz * nm;
}

/* POSTs json to route: the status, and the raw body in *b (the caller frees b->s). */
static long post_raw(int port, const char *route, const char *json, body *b) {
    CURL *c = curl_easy_init();
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, route);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, json);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    long status = 0;
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    return status;
}

/* POSTs json to route; returns the status and the parsed body in *out (NULL when not JSON). */
static long post(int port, const char *route, const char *json, json_t **out) {
    body b = {0};
    long status = post_raw(port, route, json, &b);
    *out = b.s ? json_loads(b.s, 0, NULL) : NULL;
    free(b.s);
    return status;
}

/* POSTs a streaming request; the text of choice 0's chunks joined into out[cap]. False when the
 * status is not 200, a chunk's text is not valid UTF-8 (a character split between chunks), or the
 * stream does not end with [DONE]. */
static bool stream_text(int port, const char *route, const char *json, char *out, size_t cap) {
    body b = {0};
    long status = post_raw(port, route, json, &b);
    bool ok = status == 200 && b.s, done = false;
    size_t o = 0;
    out[0] = 0;
    for (char *line = ok ? strtok(b.s, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "data: ", 6)) continue;
        if (!strcmp(line + 6, "[DONE]")) {
            done = true;
            continue;
        }
        json_t *ev = json_loads(line + 6, 0, NULL), *c0 = json_array_get(json_object_get(ev, "choices"), 0);
        json_t *t = json_object_get(c0, "text");
        if (!t) t = json_object_get(json_object_get(c0, "delta"), "content");
        const char *s = json_string_value(t);
        size_t n = s ? json_string_length(t) : 0;
        ok = ok && ev && hr_utf8_valid(s ? s : "", n, NULL) && o + n < cap;
        if (ok && n) memcpy(out + o, s, n), o += n, out[o] = 0;
        json_decref(ev);
    }
    free(b.s);
    return ok && done;
}

/* A 400 naming param, whose message holds `reason`. */
static void bad(int port, const char *route, const char *json, const char *param, const char *reason) {
    json_t *r = NULL;
    long st = post(port, route, json, &r);
    json_t *e = json_object_get(r, "error");
    const char *p = json_string_value(json_object_get(e, "param")),
               *m = json_string_value(json_object_get(e, "message"));
    CHECKF(st == 400 && p && !strcmp(p, param) && m && strstr(m, reason), "%s -> %ld param %s message %s", json, st,
           p ? p : "-", m ? m : "-");
    json_decref(r);
}

/* A 200 whose first choice ends `finish`; its text (or message content) into text[cap]. */
static void good(int port, const char *route, const char *json, const char *finish, char *text, size_t cap) {
    json_t *r = NULL;
    long st = post(port, route, json, &r);
    json_t *c = json_array_get(json_object_get(r, "choices"), 0);
    const char *f = json_string_value(json_object_get(c, "finish_reason"));
    json_t *t = json_object_get(c, "text");
    if (!t) t = json_object_get(json_object_get(c, "message"), "content");
    snprintf(text, cap, "%s", json_string_value(t) ? json_string_value(t) : "");
    CHECKF(st == 200 && f && !strcmp(f, finish), "%s -> %ld finish %s text '%s'", json, st, f ? f : "-", text);
    json_decref(r);
}

/* Whether s could still be completed into a JSON object (a one-token vocabulary suffices: the
 * recognizer is fed the bytes directly). */
static bool json_prefix_ok(const char *s) {
    const char *tok[1] = {"x"};
    uint32_t len[1] = {1};
    hr_cons_vocab *v = NULL;
    hr_cons_store *st = NULL;
    hr_grammar *g = NULL;
    hr_matcher *m = NULL;
    hr_error err;
    bool ok = hr_cons_vocab_create(1, tok, len, NULL, &v, &err) == HR_OK &&
              hr_cons_store_create(v, &st, &err) == HR_OK &&
              hr_grammar_compile(HR_CONS_JSON, "", 0, &g, &err) == HR_OK &&
              hr_matcher_create(st, g, &m, &err) == HR_OK && hr_matcher_accept_bytes(m, s, strlen(s));
    hr_matcher_destroy(m);
    hr_grammar_release(g);
    hr_cons_store_destroy(st);
    hr_cons_vocab_destroy(v);
    return ok;
}

int main(void) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    hr_runtime_params rp = hr_runtime_default_params();
    rp.model_path = HR_SOURCE_DIR "/models/stories260K-q8_0.gguf";
    rp.n_ctx = 1024;
    rp.ctx_extend = true;
    rp.n_threads = 1;
    hr_runtime *rt = NULL;
    hr_error err = {0};
    CHECKF(hr_runtime_open(&rp, &rt, NULL, &err) == HR_OK, "runtime: %s", err.msg);
    if (!rt) return hr_test_finish();
    CHECK(hr_runtime_start(rt, &err) == HR_OK);
    hr_server_params sp = hr_server_default_params();
    sp.port = 0;
    hr_server *srv = NULL;
    CHECKF(hr_server_create(rt, &sp, &srv, &err) == HR_OK, "server: %s", err.msg);
    if (!srv) {
        hr_runtime_close(rt);
        return hr_test_finish();
    }
    int port = hr_server_port(srv);
    const char *C = "/v1/completions", *CH = "/v1/chat/completions";
    char text[4096];

    /* ---- every field works ---- */
    good(port, C,
         "{\"prompt\":\"Hi\",\"max_tokens\":300,\"temperature\":1,\"seed\":1,\"response_format\":{\"type\":\"json_"
         "schema\","
         "\"json_schema\":{\"name\":\"p\",\"strict\":true,\"schema\":{\"type\":\"object\",\"properties\":{\"n\":{"
         "\"type\":\"integer\",\"minimum\":1,\"maximum\":5}},\"required\":[\"n\"],\"additionalProperties\":false}}}}",
         "stop", text, sizeof text);
    json_t *doc = json_loads(text, 0, NULL);
    json_t *nv = json_object_get(doc, "n");
    CHECKF(json_is_integer(nv) && json_integer_value(nv) >= 1 && json_integer_value(nv) <= 5, "'%s'", text);
    json_decref(doc);
    good(port, CH,
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":300,\"seed\":2,\"guided_json\":"
         "\"{\\\"type\\\":\\\"array\\\",\\\"items\\\":{\\\"type\\\":\\\"boolean\\\"},\\\"maxItems\\\":3}\"}",
         "stop", text, sizeof text);
    doc = json_loads(text, 0, NULL);
    CHECKF(json_is_array(doc) && json_array_size(doc) <= 3, "'%s'", text);
    json_decref(doc);
    good(port, C,
         "{\"prompt\":\"Hi\",\"max_tokens\":20,\"temperature\":1,\"seed\":3,\"guided_regex\":\"[a-c]{2}[0-9]\"}",
         "stop", text, sizeof text);
    CHECKF(strlen(text) == 3 && strchr("abc", text[0]) && strchr("abc", text[1]) && text[2] >= '0' && text[2] <= '9',
           "'%s'", text);
    good(port, CH,
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":20,\"guided_choice\":[\"yes\",\"no\"]}",
         "stop", text, sizeof text);
    CHECKF(!strcmp(text, "yes") || !strcmp(text, "no"), "'%s'", text);
    good(port, C,
         "{\"prompt\":\"Hi\",\"max_tokens\":20,\"temperature\":1,\"guided_grammar\":\"root ::= \\\"<\\\" [xy]{1,5} "
         "\\\">\\\"\"}",
         "stop", text, sizeof text);
    CHECKF(text[0] == '<' && text[strlen(text) - 1] == '>' && strspn(text + 1, "xy") == strlen(text) - 2, "'%s'", text);
    /* any object: unbounded, so a weak model may run out of tokens ("length"); five seeds, and every one
     * that stops parses as an object */
    int stops = 0;
    for (int seed = 0; seed < 5; seed++) {
        char req[256];
        snprintf(req, sizeof req,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":300,\"temperature\":1,"
                 "\"seed\":%d,\"response_format\":{\"type\":\"json_object\"}}",
                 seed);
        json_t *r = NULL;
        CHECK(post(port, CH, req, &r) == 200);
        json_t *c = json_array_get(json_object_get(r, "choices"), 0);
        const char *f = json_string_value(json_object_get(c, "finish_reason"));
        const char *t = json_string_value(json_object_get(json_object_get(c, "message"), "content"));
        CHECK(f && t && (!strcmp(f, "stop") || !strcmp(f, "length")));
        if (f && t && !strcmp(f, "length")) /* what it produced is a prefix of some JSON object */
            CHECKF(json_prefix_ok(t), "json_object prefix: '%s'", t);
        if (f && t && !strcmp(f, "stop")) {
            stops++;
            doc = json_loads(t, 0, NULL);
            CHECKF(json_is_object(doc), "json_object: '%s'", t);
            json_decref(doc);
        }
        json_decref(r);
    }
    printf("json_object: %d of 5 stopped (the rest ran to max_tokens)\n", stops);
    good(port, C, "{\"prompt\":\"Hi\",\"max_tokens\":5,\"response_format\":{\"type\":\"text\"}}", "length", text,
         sizeof text);
    /* cannot finish within max_tokens: "length", with what it produced */
    good(port, C, "{\"prompt\":\"Hi\",\"max_tokens\":4,\"temperature\":1,\"guided_regex\":\"(xy){30}\"}", "length",
         text, sizeof text);
    CHECKF(strlen(text) >= 4 && strspn(text, "xy") == strlen(text) && text[0] == 'x', "'%s'", text);

    /* ---- bad input: 400 naming the field, with the reason ---- */
    bad(port, C, "{\"prompt\":\"Hi\",\"guided_json\":{\"type\":\"object\",\"properties\":{\"a\":{\"not\":{}}}}}",
        "guided_json", "unsupported JSON Schema keyword 'not' at #/properties/a");
    bad(port, CH,
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":{\"type\":\"json_schema\",\"json_"
        "schema\":{"
        "\"name\":\"a\",\"schema\":{\"type\":\"string\",\"format\":\"email\"}}}}",
        "response_format", "format 'email'");
    bad(port, C, "{\"prompt\":\"Hi\",\"guided_json\":{\"$ref\":\"#/$defs/nope\"}}", "guided_json", "does not resolve");
    bad(port, C, "{\"prompt\":\"Hi\",\"guided_json\":\"{not json\"}", "guided_json", "not JSON");
    bad(port, C, "{\"prompt\":\"Hi\",\"guided_json\":{\"type\":\"integer\",\"minimum\":5,\"maximum\":1}}",
        "guided_json", "leave no integer");
    bad(port, C, "{\"prompt\":\"Hi\",\"guided_regex\":\"(ab\"}", "guided_regex", "expected ')'");
    bad(port, C, "{\"prompt\":\"Hi\",\"guided_regex\":\"a(?<=b)\"}", "guided_regex", "lookaround");
    bad(port, C, "{\"prompt\":\"Hi\",\"guided_regex\":\"[z-a]\"}", "guided_regex", "reversed");
    bad(port, CH, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"guided_grammar\":\"root ::= item+\"}",
        "guided_grammar", "undefined rule 'item'");
    bad(port, C, "{\"prompt\":\"Hi\",\"guided_grammar\":\"root ::= root \\\"a\\\" | \\\"b\\\"\"}", "guided_grammar",
        "left-recursive");
    bad(port, C, "{\"prompt\":\"Hi\",\"guided_grammar\":\"root ::= \\\"a\"}", "guided_grammar", "unterminated");
    /* bounds: repetition count, elements, source size */
    bad(port, C, "{\"prompt\":\"Hi\",\"guided_regex\":\"a{10001}\"}", "guided_regex", "bound on repetitions");
    bad(port, C, "{\"prompt\":\"Hi\",\"guided_json\":{\"type\":\"array\",\"maxItems\":100000}}", "guided_json",
        "bound on repetitions");
    char *big = malloc(300000);
    int o = snprintf(big, 300000, "{\"prompt\":\"Hi\",\"guided_grammar\":\"root ::=");
    for (int i = 0; i < 21; i++) o += snprintf(big + o, 300000 - (size_t)o, " \\\"x\\\"{10000}");
    snprintf(big + o, 300000 - (size_t)o, "\"}");
    bad(port, C, big, "guided_grammar", "bound on elements");
    free(big);
    /* shapes */
    bad(port, C, "{\"prompt\":\"Hi\",\"response_format\":{\"type\":\"xml\"}}", "response_format", "'xml'");
    bad(port, C, "{\"prompt\":\"Hi\",\"response_format\":{\"type\":\"json_schema\"}}", "response_format",
        "json_schema");
    bad(port, C, "{\"prompt\":\"Hi\",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\"}}}",
        "response_format", "schema' is required");
    bad(port, C, "{\"prompt\":\"Hi\",\"guided_choice\":[\"a\",1]}", "guided_choice", "guided_choice[1]");
    bad(port, C, "{\"prompt\":\"Hi\",\"guided_regex\":5}", "guided_regex", "must be a string");
    bad(port, C, "{\"prompt\":\"Hi\",\"guided_regex\":\"a\",\"guided_choice\":[\"a\"]}", "guided_choice", "give one");
    bad(port, C, "{\"prompt\":\"Hi\",\"response_format\":{\"type\":\"json_object\"},\"guided_json\":{}}", "guided_json",
        "give one");

    /* ---- characters the vocabulary spells in byte tokens (the emoji: four): the stream, decoded as it
       goes, gives the text of the whole answer, every chunk whole characters ---- */
    const char *want = "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80 na\xC3\xAFve \xC3\xBC";
    const char *head[] = {"{\"prompt\":\"Hi\",", "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],"},
               *tail = "\"max_tokens\":64,\"temperature\":0,"
                       "\"guided_choice\":[\"\\u00e9\\u20ac\\ud83d\\ude00 na\\u00efve \\u00fc\"]}";
    for (int r = 0; r < 2; r++) {
        char req[512], streamed[512];
        snprintf(req, sizeof req, "%s%s", head[r], tail);
        good(port, r ? CH : C, req, "stop", text, sizeof text);
        CHECKF(!strcmp(text, want), "whole: '%s'", text);
        snprintf(req, sizeof req, "%s\"stream\":true,\"logprobs\":%s,%s", head[r], r ? "true" : "2", tail);
        CHECKF(stream_text(port, r ? CH : C, req, streamed, sizeof streamed) && !strcmp(streamed, want),
               "streamed: '%s', whole '%s'", streamed, text);
    }

    hr_server_destroy(srv);
    hr_runtime_close(rt);
    curl_global_cleanup();
    return hr_test_finish();
}

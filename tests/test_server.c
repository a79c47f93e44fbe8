/* test_server.c: `headroom serve`'s HTTP server over loopback, with a tiny HTTP/1.1 client on plain
 * sockets: completions and chat (plain and SSE), logprobs in both shapes, usage.kv, /v1/kv, /metrics, tokenize, every
 * bad-input status with OpenAI's error shape, 401, 413, 429 with Retry-After, a client that hangs up
 * mid-stream (its blocks return to the pool), and the graceful shutdown. Uses stories260K from
 * ../shared when present, else the built-in demo model. Every wait is bounded. */
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
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

static const char *header(const hr_http_resp *r, const char *name, char *out, size_t cap) {
    char key[64];
    snprintf(key, sizeof key, "\r\n%s:", name);
    const char *h = r->head ? strcasestr(r->head, key) : NULL;
    if (!h) return NULL;
    h += strlen(key);
    while (*h == ':' || *h == ' ') h++;
    size_t n = strcspn(h, "\r\n");
    if (n >= cap) n = cap - 1;
    memcpy(out, h, n);
    out[n] = '\0';
    return out;
}

/* Checks an error response: status, OpenAI's shape, and the param it names (NULL: any). */
static void check_error(int port, const char *path, const char *body, int status, const char *param) {
    hr_http_resp r = hr_http_call(port, "POST", path, NULL, body);
    json_t *j = hr_http_json(&r);
    json_t *e = json_object_get(j, "error");
    CHECKF(r.status == status, "%s %.80s: status %d, want %d (%s)", path, body, r.status, status, r.body);
    CHECKF(json_is_string(json_object_get(e, "message")) && json_is_string(json_object_get(e, "type")) &&
               json_object_get(e, "param") && json_object_get(e, "code"),
           "error shape: %s", r.body);
    if (param) {
        const char *p = json_string_value(json_object_get(e, "param"));
        CHECKF(p && !strcmp(p, param), "%.80s: param %s, want %s", body, p ? p : "null", param);
    }
    json_decref(j);
    hr_http_resp_free(&r);
}

/* ---- helpers over the API ---------------------------------------------------------------------- */

static int pool_blocks_used(int port, int *n_requests) {
    hr_http_resp r = hr_http_call(port, "GET", "/v1/kv", NULL, NULL);
    json_t *j = hr_http_json(&r);
    int used = (int)json_integer_value(json_object_get(json_object_get(j, "pool"), "blocks_used"));
    if (n_requests) *n_requests = (int)json_array_size(json_object_get(j, "requests"));
    if (r.status != 200) used = -1;
    json_decref(j);
    hr_http_resp_free(&r);
    return used;
}

/* Polls until the pool holds no block and no request is in flight (at most ~10 s). */
static bool pool_drains(int port) {
    for (int i = 0; i < 1200; i++) { /* bounded: 60 s */
        int n_req = -1;
        if (pool_blocks_used(port, &n_req) == 0 && n_req == 0) return true;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return false;
}

static int engine_gauge(int port, const char *name) {
    hr_http_resp r = hr_http_call(port, "GET", "/metrics", NULL, NULL);
    int v = -1;
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = r.body ? strstr(r.body, key) : NULL;
    if (p) v = atoi(p + strlen(key));
    hr_http_resp_free(&r);
    return v;
}

/* Opens a stream that runs until cancelled (window policy, ignore_eos) and reads its first event. */
static int open_endless_stream(int port) {
    const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":1000000000,\"stream\":true,"
                       "\"kv_policy\":\"window:64\",\"ignore_eos\":true,\"temperature\":1}";
    int fd = hr_http_dial(port);
    hr_http_send(fd, "POST", "/v1/completions", NULL, body, strlen(body));
    char buf[4096];
    size_t len = 0;
    for (int guard = 0; guard < 1000 && len < sizeof buf - 1; guard++) {
        ssize_t got = read(fd, buf + len, sizeof buf - 1 - len);
        if (got <= 0) break;
        len += (size_t)got;
        buf[len] = '\0';
        if (strstr(buf, "data: {")) break;
    }
    CHECKF(len > 0 && strstr(buf, "200 OK") && strstr(buf, "data: {"), "endless stream opened: %.200s", buf);
    return fd;
}

/* ---- the tests --------------------------------------------------------------------------------- */

static void test_completions(int port, const char *model_name) {
    hr_http_resp r = hr_http_call(port, "GET", "/health", NULL, NULL);
    CHECKF(r.status == 200 && r.body && strstr(r.body, "\"ok\""), "health: %d %s", r.status, r.body);
    hr_http_resp_free(&r);

    r = hr_http_call(port, "GET", "/v1/models", NULL, NULL);
    json_t *j = hr_http_json(&r);
    const char *id = json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"));
    CHECKF(r.status == 200 && id && !strcmp(id, model_name), "models: %s", r.body);
    json_decref(j);
    hr_http_resp_free(&r);

    const char *req = "{\"model\":\"x\",\"prompt\":\"Once upon a time\",\"max_tokens\":12,\"temperature\":0,"
                      "\"unknown_field\":[1,2]}";
    r = hr_http_call(port, "POST", "/v1/completions", NULL, req);
    j = hr_http_json(&r);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    json_t *u = json_object_get(j, "usage"), *kv = json_object_get(u, "kv");
    const char *text = json_string_value(json_object_get(ch, "text"));
    char *plain = text ? strdup(text) : NULL;
    CHECKF(r.status == 200 && plain, "completion: %d %s", r.status, r.body);
    CHECK(!strcmp(json_string_value(json_object_get(j, "object")), "text_completion"));
    CHECK(json_integer_value(json_object_get(u, "prompt_tokens")) > 0);
    CHECK(json_integer_value(json_object_get(u, "completion_tokens")) > 0 &&
          json_integer_value(json_object_get(u, "completion_tokens")) <= 12);
    CHECK(json_integer_value(json_object_get(u, "total_tokens")) ==
          json_integer_value(json_object_get(u, "prompt_tokens")) +
              json_integer_value(json_object_get(u, "completion_tokens")));
    CHECKF(json_integer_value(json_object_get(kv, "bytes_peak")) > 0 &&
               json_integer_value(json_object_get(kv, "blocks_peak")) > 0 &&
               json_is_string(json_object_get(kv, "k_format")) && json_object_get(kv, "queued_seconds") &&
               json_object_get(kv, "preempt_swaps") && json_object_get(kv, "prefix_hit_tokens"),
           "usage.kv: %s", r.body);
    json_decref(j);
    hr_http_resp_free(&r);

    /* the same request streamed: the same greedy text in SSE chunks, then usage, then [DONE] */
    req = "{\"prompt\":\"Once upon a time\",\"max_tokens\":12,\"temperature\":0,\"stream\":true,"
          "\"stream_options\":{\"include_usage\":true}}";
    r = hr_http_call(port, "POST", "/v1/completions", NULL, req);
    char ctype[128];
    CHECKF(r.status == 200 && header(&r, "content-type", ctype, sizeof ctype) && strstr(ctype, "text/event-stream"),
           "stream: %d %s", r.status, r.head);
    char joined[4096] = "";
    int n_events = 0, n_usage = 0;
    bool done = false, shape_ok = true;
    for (char *line = r.body ? strtok(r.body, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "data: ", 6) != 0) {
            shape_ok = shape_ok && line[0] == ':';
            continue;
        }
        n_events++;
        if (!strcmp(line + 6, "[DONE]")) {
            done = true;
            continue;
        }
        shape_ok = shape_ok && !done;
        json_t *ev = json_loads(line + 6, 0, NULL);
        json_t *c0 = json_array_get(json_object_get(ev, "choices"), 0);
        if (json_is_string(json_object_get(c0, "text")))
            strncat(joined, json_string_value(json_object_get(c0, "text")), sizeof joined - strlen(joined) - 1);
        json_t *uu = json_object_get(ev, "usage");
        if (json_is_object(uu)) {
            n_usage++;
            CHECK(json_integer_value(json_object_get(json_object_get(uu, "kv"), "bytes_peak")) > 0);
        }
        shape_ok = shape_ok && ev;
        json_decref(ev);
    }
    CHECKF(done && shape_ok && n_events >= 3 && n_usage == 1, "SSE: done %d shape %d events %d usage %d", done,
           shape_ok, n_events, n_usage);
    CHECKF(plain && !strcmp(joined, plain), "streamed text '%s' != plain '%s'", joined, plain ? plain : "");
    free(plain);
    hr_http_resp_free(&r);

    /* n = 2 with a seed: two choices */
    r = hr_http_call(
        port, "POST", "/v1/completions", NULL,
        "{\"prompt\":[\"Once\"],\"max_tokens\":5,\"n\":2,\"seed\":7,\"stop\":[\"zzz\"],\"temperature\":0.9}");
    j = hr_http_json(&r);
    CHECKF(r.status == 200 && json_array_size(json_object_get(j, "choices")) == 2, "n=2: %s", r.body);
    json_decref(j);
    hr_http_resp_free(&r);
}

static void test_chat(int port) {
    const char *req = "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":"
                      "[{\"type\":\"text\",\"text\":\"Tell a story.\"}]}],\"max_completion_tokens\":8}";
    hr_http_resp r = hr_http_call(port, "POST", "/v1/chat/completions", NULL, req);
    json_t *j = hr_http_json(&r);
    json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    CHECKF(r.status == 200 && json_is_string(json_object_get(msg, "content")) &&
               !strcmp(json_string_value(json_object_get(msg, "role")), "assistant") &&
               !strcmp(json_string_value(json_object_get(j, "object")), "chat.completion"),
           "chat: %d %s", r.status, r.body);
    CHECK(json_integer_value(json_object_get(json_object_get(json_object_get(j, "usage"), "kv"), "bytes_peak")) > 0);
    json_decref(j);
    hr_http_resp_free(&r);

    r = hr_http_call(port, "POST", "/v1/chat/completions", NULL,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":6,\"stream\":true}");
    const char *first = r.body ? strstr(r.body, "data: ") : NULL;
    CHECKF(r.status == 200 && first && strstr(first, "\"role\":\"assistant\"") &&
               strstr(r.body, "chat.completion.chunk") && strstr(r.body, "data: [DONE]\n\n"),
           "chat stream: %s", r.body);
    hr_http_resp_free(&r);
}

/* ---- logprobs ---------------------------------------------------------------------------------- */

/* One position's figures, in either shape, for comparing streamed and plain answers. */
typedef struct lp_pos {
    char token[64];
    double logprob;
    double top[8];
    char top_token[64];
    int n_top;
} lp_pos;

#define LP_MAX 64

/* Checks one chat content entry (greedy): logprob <= 0, bytes = the token's UTF-8, top sorted
 * descending, the first top entry the chosen token; appends it to out. */
static void check_chat_entry(json_t *e, int k, lp_pos *out, int *n, char *joined, size_t cap) {
    const char *tok = json_string_value(json_object_get(e, "token"));
    json_t *bytes = json_object_get(e, "bytes"), *top = json_object_get(e, "top_logprobs");
    double lp = json_number_value(json_object_get(e, "logprob"));
    CHECKF(tok && json_is_number(json_object_get(e, "logprob")) && lp <= 0, "chat logprob entry");
    if (!tok) return;
    bool bytes_ok = json_array_size(bytes) == strlen(tok);
    for (size_t b = 0; bytes_ok && b < strlen(tok); b++)
        bytes_ok = json_integer_value(json_array_get(bytes, b)) == (unsigned char)tok[b];
    CHECKF(bytes_ok, "bytes of '%s'", tok);
    CHECKF((int)json_array_size(top) == k, "top_logprobs: %zu, want %d", json_array_size(top), k);
    for (size_t q = 1; q < json_array_size(top); q++)
        CHECK(json_number_value(json_object_get(json_array_get(top, q), "logprob")) <=
              json_number_value(json_object_get(json_array_get(top, q - 1), "logprob")));
    json_t *t0 = json_array_get(top, 0);
    const char *t0s = json_string_value(json_object_get(t0, "token"));
    CHECKF(k == 0 || (t0s && !strcmp(t0s, tok) && json_number_value(json_object_get(t0, "logprob")) == lp),
           "greedy: top[0] '%s' is the chosen '%s'", t0s ? t0s : "?", tok);
    CHECKF(k == 0 || json_is_array(json_object_get(t0, "bytes")), "top entries carry bytes");
    strncat(joined, tok, cap - strlen(joined) - 1);
    if (*n >= LP_MAX) return;
    lp_pos *p = &out[(*n)++];
    snprintf(p->token, sizeof p->token, "%s", tok);
    p->logprob = lp;
    p->n_top = (int)json_array_size(top) < 8 ? (int)json_array_size(top) : 8;
    for (int q = 0; q < p->n_top; q++)
        p->top[q] = json_number_value(json_object_get(json_array_get(top, q), "logprob"));
}

/* Checks one completions logprobs object over its positions; appends them to out. text_offset counts
 * characters from the start of the completion. */
static void check_cmpl_logprobs(json_t *l, int k, lp_pos *out, int *n, char *joined, size_t cap) {
    json_t *toks = json_object_get(l, "tokens"), *lps = json_object_get(l, "token_logprobs");
    json_t *tops = json_object_get(l, "top_logprobs"), *offs = json_object_get(l, "text_offset");
    size_t m = json_array_size(toks);
    CHECKF(json_array_size(lps) == m && json_array_size(tops) == m && json_array_size(offs) == m,
           "completions logprobs arrays of one length");
    for (size_t t = 0; t < m; t++) {
        const char *tok = json_string_value(json_array_get(toks, t));
        double lp = json_number_value(json_array_get(lps, t));
        json_t *alts = json_array_get(tops, t);
        CHECKF(tok && lp <= 0 && json_is_object(alts), "completions position %zu", t);
        if (!tok) continue;
        CHECKF(json_integer_value(json_array_get(offs, t)) == (json_int_t)strlen(joined), "text_offset %zu", t);
        CHECKF((int)json_object_size(alts) <= k && (k == 0 || json_object_size(alts) >= 1), "top_logprobs size");
        /* greedy: the chosen token is the likeliest alternative */
        json_t *mine = json_object_get(alts, tok);
        const char *key;
        json_t *v;
        double best = -1e30;
        json_object_foreach(alts, key, v) if (json_number_value(v) > best) best = json_number_value(v);
        CHECKF(k == 0 || (mine && json_number_value(mine) == lp && lp == best), "greedy: '%s' is the top", tok);
        strncat(joined, tok, cap - strlen(joined) - 1);
        if (*n >= LP_MAX) continue;
        lp_pos *p = &out[(*n)++];
        snprintf(p->token, sizeof p->token, "%s", tok);
        p->logprob = lp;
        p->n_top = 0;
    }
}

static bool same_positions(const lp_pos *a, int na, const lp_pos *b, int nb) {
    if (na != nb) return false;
    for (int i = 0; i < na; i++) {
        if (strcmp(a[i].token, b[i].token) || a[i].logprob != b[i].logprob || a[i].n_top != b[i].n_top) return false;
        for (int q = 0; q < a[i].n_top; q++)
            if (a[i].top[q] != b[i].top[q]) return false;
    }
    return true;
}

/* Greedy chat with logprobs + top_logprobs 3 and completions with logprobs 2, plain and streamed:
 * the tokens spell the text, the figures agree; then the 400s. */
static void test_logprobs(int port) {
    const char *greedy = "\"temperature\":0,\"presence_penalty\":0,\"frequency_penalty\":0,\"repetition_penalty\":1";
    char req[1024];
    for (int kind = 0; kind < 2; kind++) {
        bool chat = kind == 0;
        int k = chat ? 3 : 2;
        lp_pos plain[LP_MAX], streamed[LP_MAX];
        int n_plain = 0, n_streamed = 0;
        char text[4096] = "", joined[4096] = "", s_text[4096] = "", s_joined[4096] = "";
        for (int stream = 0; stream < 2; stream++) {
            if (chat)
                snprintf(req, sizeof req,
                         "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"max_tokens\":16,"
                         "\"logprobs\":true,\"top_logprobs\":%d,%s%s}",
                         k, greedy, stream ? ",\"stream\":true" : "");
            else
                snprintf(req, sizeof req, "{\"prompt\":\"Once upon a time\",\"max_tokens\":16,\"logprobs\":%d,%s%s}", k,
                         greedy, stream ? ",\"stream\":true" : "");
            hr_http_resp r = hr_http_call(port, "POST", chat ? "/v1/chat/completions" : "/v1/completions", NULL, req);
            CHECKF(r.status == 200, "logprobs %s stream %d: %d %s", chat ? "chat" : "completions", stream, r.status,
                   r.body);
            lp_pos *pos = stream ? streamed : plain;
            int *np = stream ? &n_streamed : &n_plain;
            char *t = stream ? s_text : text, *jn = stream ? s_joined : joined;
            if (!stream) {
                json_t *j = hr_http_json(&r);
                json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
                json_t *l = json_object_get(c0, "logprobs");
                const char *content =
                    chat ? json_string_value(json_object_get(json_object_get(c0, "message"), "content"))
                         : json_string_value(json_object_get(c0, "text"));
                snprintf(t, 4096, "%s", content ? content : "");
                if (chat) {
                    json_t *arr = json_object_get(l, "content");
                    CHECKF(json_array_size(arr) > 0, "chat logprobs.content: %s", r.body);
                    for (size_t q = 0; q < json_array_size(arr); q++)
                        check_chat_entry(json_array_get(arr, q), k, pos, np, jn, 4096);
                } else {
                    CHECKF(json_array_size(json_object_get(l, "tokens")) > 0, "completions logprobs: %s", r.body);
                    check_cmpl_logprobs(l, k, pos, np, jn, 4096);
                }
                json_decref(j);
            } else {
                for (char *line = r.body ? strtok(r.body, "\n") : NULL; line; line = strtok(NULL, "\n")) {
                    if (strncmp(line, "data: {", 7) != 0) continue;
                    json_t *ev = json_loads(line + 6, 0, NULL);
                    json_t *c0 = json_array_get(json_object_get(ev, "choices"), 0);
                    json_t *l = json_object_get(c0, "logprobs");
                    const char *piece =
                        chat ? json_string_value(json_object_get(json_object_get(c0, "delta"), "content"))
                             : json_string_value(json_object_get(c0, "text"));
                    if (piece) strncat(t, piece, 4096 - strlen(t) - 1);
                    if (chat && json_is_object(l)) {
                        json_t *arr = json_object_get(l, "content");
                        for (size_t q = 0; q < json_array_size(arr); q++)
                            check_chat_entry(json_array_get(arr, q), k, pos, np, jn, 4096);
                    } else if (json_is_object(l)) {
                        check_cmpl_logprobs(l, k, pos, np, jn, 4096);
                    }
                    json_decref(ev);
                }
            }
            hr_http_resp_free(&r);
        }
        const char *what = chat ? "chat" : "completions";
        CHECKF(n_plain > 0 && !strcmp(joined, text), "%s: tokens '%s' spell the text '%s'", what, joined, text);
        CHECKF(!strcmp(s_joined, s_text), "%s streamed: tokens '%s' spell the text '%s'", what, s_joined, s_text);
        CHECKF(!strcmp(text, s_text), "%s: streamed text = plain", what);
        CHECKF(same_positions(plain, n_plain, streamed, n_streamed), "%s: streamed logprobs = plain (%d vs %d)", what,
               n_plain, n_streamed);
    }

    /* without logprobs: null; logprobs true alone: empty top lists; completions 0: empty alternatives */
    hr_http_resp r = hr_http_call(port, "POST", "/v1/chat/completions", NULL,
                                  "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":3}");
    json_t *j = hr_http_json(&r);
    CHECKF(json_is_null(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs")),
           "no logprobs: null: %s", r.body);
    json_decref(j);
    hr_http_resp_free(&r);
    r = hr_http_call(port, "POST", "/v1/chat/completions", NULL,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":3,\"logprobs\":true}");
    j = hr_http_json(&r);
    json_t *e0 = json_array_get(
        json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"), "content"), 0);
    CHECKF(e0 && json_array_size(json_object_get(e0, "top_logprobs")) == 0 &&
               json_is_array(json_object_get(e0, "top_logprobs")),
           "logprobs alone: %s", r.body);
    json_decref(j);
    hr_http_resp_free(&r);
    r = hr_http_call(port, "POST", "/v1/completions", NULL, "{\"prompt\":\"Once\",\"max_tokens\":3,\"logprobs\":0}");
    j = hr_http_json(&r);
    json_t *l = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    CHECKF(json_array_size(json_object_get(l, "token_logprobs")) > 0 &&
               json_object_size(json_array_get(json_object_get(l, "top_logprobs"), 0)) == 0,
           "completions logprobs 0: %s", r.body);
    json_decref(j);
    hr_http_resp_free(&r);

    const char *chat_pre = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],";
    const struct {
        const char *path, *fields, *param;
    } bad[] = {
        {"/v1/chat/completions", "\"logprobs\":1}", "logprobs"},
        {"/v1/chat/completions", "\"logprobs\":\"yes\"}", "logprobs"},
        {"/v1/chat/completions", "\"logprobs\":true,\"top_logprobs\":21}", "top_logprobs"},
        {"/v1/chat/completions", "\"logprobs\":true,\"top_logprobs\":-1}", "top_logprobs"},
        {"/v1/chat/completions", "\"logprobs\":true,\"top_logprobs\":\"3\"}", "top_logprobs"},
        {"/v1/chat/completions", "\"top_logprobs\":3}", "top_logprobs"},
        {"/v1/chat/completions", "\"logprobs\":false,\"top_logprobs\":2}", "top_logprobs"},
        {"/v1/completions", "\"logprobs\":6}", "logprobs"},
        {"/v1/completions", "\"logprobs\":-1}", "logprobs"},
        {"/v1/completions", "\"logprobs\":true}", "logprobs"},
        {"/v1/completions", "\"logprobs\":1.5}", "logprobs"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        bool chat = strstr(bad[i].path, "chat") != NULL;
        snprintf(req, sizeof req, "%s%s", chat ? chat_pre : "{\"prompt\":\"Hi\",", bad[i].fields);
        check_error(port, bad[i].path, req, 400, bad[i].param);
    }
}

static void test_tokenize_kv_metrics(int port) {
    hr_http_resp r = hr_http_call(port, "POST", "/tokenize", NULL, "{\"content\":\"Once upon a time\"}");
    json_t *j = hr_http_json(&r);
    json_t *toks = json_object_get(j, "tokens");
    CHECKF(r.status == 200 && json_array_size(toks) > 0, "tokenize: %s", r.body);
    json_t *back = json_pack("{s:O}", "tokens", toks);
    char *dump = json_dumps(back, JSON_COMPACT);
    json_decref(back);
    json_decref(j);
    hr_http_resp_free(&r);
    r = hr_http_call(port, "POST", "/detokenize", NULL, dump);
    j = hr_http_json(&r);
    const char *content = json_string_value(json_object_get(j, "content"));
    CHECKF(r.status == 200 && content && strstr(content, "upon a time"), "detokenize: %s", r.body);
    free(dump);
    json_decref(j);
    hr_http_resp_free(&r);
    check_error(port, "/detokenize", "{\"tokens\":[-1]}", 400, "tokens");

    r = hr_http_call(port, "GET", "/v1/kv", NULL, NULL);
    j = hr_http_json(&r);
    json_t *pool = json_object_get(j, "pool");
    CHECKF(r.status == 200 && json_integer_value(json_object_get(pool, "blocks_total")) > 0 &&
               json_integer_value(json_object_get(pool, "budget_bytes")) > 0 &&
               json_object_get(pool, "headroom_bytes") && json_object_get(pool, "waste_bytes") &&
               json_is_array(json_object_get(j, "requests")),
           "/v1/kv: %s", r.body);
    json_decref(j);
    hr_http_resp_free(&r);

    r = hr_http_call(port, "GET", "/metrics", NULL, NULL);
    const char *names[] = {"headroom_kv_pool_bytes{state=\"used\"}",
                           "headroom_kv_pool_bytes{state=\"free\"}",
                           "headroom_kv_headroom_bytes",
                           "headroom_requests_running",
                           "headroom_requests_waiting",
                           "headroom_requests_refused_total{reason=\"queue_full\"}",
                           "headroom_preemptions_total{mode=\"swap\"}",
                           "headroom_prefix_cache_hit_tokens_total",
                           "headroom_prompt_tokens_total",
                           "headroom_generation_tokens_total",
                           "headroom_time_to_first_token_seconds_bucket",
                           "headroom_inter_token_latency_seconds_sum",
                           "headroom_e2e_request_latency_seconds_count",
                           "headroom_request_queue_time_seconds_bucket",
                           "headroom_request_kv_peak_bytes_bucket{le=\"+Inf\"}",
                           "vllm:num_requests_waiting",
                           "vllm:num_requests_running",
                           "vllm:kv_cache_usage_perc",
                           "vllm:gpu_cache_usage_perc",
                           "# TYPE headroom_e2e_request_latency_seconds histogram"};
    CHECKF(r.status == 200, "metrics: %d", r.status);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        CHECKF(r.body && strstr(r.body, names[i]), "/metrics lacks %s", names[i]);
    hr_http_resp_free(&r);
}

static void test_errors(int port, int n_ctx) {
    check_error(port, "/v1/completions", "{\"prompt\": ", 400, NULL);
    check_error(port, "/v1/completions", "{\"prompt\":\"a\xff\xfe\"}", 400, NULL);
    check_error(port, "/v1/completions", "[1,2]", 400, NULL);
    check_error(port, "/v1/completions", "{\"max_tokens\":4}", 400, "prompt");
    check_error(port, "/v1/completions", "{\"prompt\":\"\"}", 400, "prompt");
    check_error(port, "/v1/completions", "{\"prompt\":5}", 400, "prompt");
    check_error(port, "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":0}", 400, "max_tokens");
    check_error(port, "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":\"7\"}", 400, "max_tokens");
    check_error(port, "/v1/completions", "{\"prompt\":\"hi\",\"temperature\":-1}", 400, "temperature");
    check_error(port, "/v1/completions", "{\"prompt\":\"hi\",\"n\":9}", 400, "n");
    check_error(port, "/v1/completions", "{\"prompt\":\"hi\",\"stop\":3}", 400, "stop");
    check_error(port, "/v1/completions", "{\"prompt\":\"hi\",\"stream\":\"yes\"}", 400, "stream");
    check_error(port, "/v1/completions", "{\"prompt\":\"hi\",\"kv_policy\":\"bogus:1\"}", 400, "kv_policy");
    check_error(port, "/v1/chat/completions", "{\"prompt\":\"hi\"}", 400, "messages");
    check_error(port, "/v1/chat/completions", "{\"messages\":\"hi\"}", 400, "messages");
    check_error(port, "/v1/chat/completions", "{\"messages\":[]}", 400, "messages");
    check_error(port, "/v1/chat/completions", "{\"messages\":[{\"content\":\"x\"}]}", 400, "messages");
    /* a prompt past the context: 400 naming both lengths */
    size_t cap = (size_t)n_ctx * 16 + 64;
    char *big = malloc(cap);
    size_t off = (size_t)snprintf(big, cap, "{\"prompt\":\"");
    for (int i = 0; i < n_ctx * 2 && off + 16 < cap; i++) off += (size_t)snprintf(big + off, cap - off, "time ");
    snprintf(big + off, cap - off, "\"}");
    hr_http_resp r = hr_http_call(port, "POST", "/v1/completions", NULL, big);
    char ctx_text[32];
    snprintf(ctx_text, sizeof ctx_text, "%d", n_ctx);
    CHECKF(r.status == 400 && r.body && strstr(r.body, "context_length_exceeded") && strstr(r.body, ctx_text),
           "long prompt: %d %s", r.status, r.body);
    hr_http_resp_free(&r);
    free(big);
    /* 404, 405 */
    r = hr_http_call(port, "GET", "/v2/nothing", NULL, NULL);
    CHECKF(r.status == 404 && r.body && strstr(r.body, "\"error\""), "404: %d", r.status);
    hr_http_resp_free(&r);
    r = hr_http_call(port, "GET", "/v1/completions", NULL, NULL);
    char allow[32];
    CHECKF(r.status == 405 && header(&r, "allow", allow, sizeof allow) && !strcmp(allow, "POST"), "405: %d %s",
           r.status, r.head);
    hr_http_resp_free(&r);
    /* 413: the test server's body limit is 64 KiB */
    size_t n = 70000;
    char *huge = malloc(n + 1);
    memset(huge, ' ', n);
    huge[n] = '\0';
    huge[0] = '{', huge[n - 1] = '}';
    r = hr_http_call(port, "POST", "/v1/completions", NULL, huge);
    CHECKF(r.status == 413, "413: %d", r.status);
    hr_http_resp_free(&r);
    free(huge);
}

/* A client that hangs up mid-stream cancels its request: the pool gets its blocks back. */
static void test_disconnect(int port) {
    int fd = open_endless_stream(port);
    int n_req = 0;
    CHECKF(pool_blocks_used(port, &n_req) > 0 && n_req == 1, "the stream holds blocks while running");
    close(fd);
    CHECKF(pool_drains(port), "blocks back after the client hung up");

    /* the same for a non-streaming request (the server watches the socket while it waits) */
    const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":1000000000,\"kv_policy\":\"window:64\","
                       "\"ignore_eos\":true}";
    fd = hr_http_dial(port);
    hr_http_send(fd, "POST", "/v1/completions", NULL, body, strlen(body));
    bool running = false;
    for (int i = 0; i < 3000 && !running; i++) { /* bounded: 60 s (a loaded sanitizer build is slow) */
        running = pool_blocks_used(port, NULL) > 0;
        struct timespec ts = {0, 20 * 1000 * 1000};
        if (!running) nanosleep(&ts, NULL);
    }
    CHECKF(running, "the non-streaming request runs");
    close(fd);
    CHECKF(pool_drains(port), "blocks back after a non-streaming client hung up");
}

/* One running, one waiting (max_running 1, max_queue 1): the next gets 429 with Retry-After. Then a
 * graceful shutdown with both in flight ends within the drain timeout plus the cancellation. */
static void test_queue_and_shutdown(hr_server *srv, hr_runtime *rt) {
    int port = hr_server_port(srv);
    int a = open_endless_stream(port);
    const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":8}";
    int b = hr_http_dial(port);
    hr_http_send(b, "POST", "/v1/completions", NULL, body, strlen(body));
    bool queued = false;
    for (int i = 0; i < 3000 && !queued; i++) { /* bounded: 60 s */
        queued = engine_gauge(port, "headroom_requests_waiting") == 1;
        struct timespec ts = {0, 20 * 1000 * 1000};
        if (!queued) nanosleep(&ts, NULL);
    }
    CHECKF(queued, "the second request waits");
    hr_http_resp r = hr_http_call(port, "POST", "/v1/completions", NULL, body);
    char ra[32];
    json_t *j = hr_http_json(&r);
    CHECKF(r.status == 429 && header(&r, "retry-after", ra, sizeof ra) && atoi(ra) >= 1 && json_object_get(j, "error"),
           "429: %d %s", r.status, r.head);
    json_decref(j);
    hr_http_resp_free(&r);
    CHECK(engine_gauge(port, "headroom_requests_refused_total{reason=\"queue_full\"}") == 1);

    double t0 = hr_time_now();
    hr_server_shutdown(srv);
    double dt = hr_time_now() - t0;
    /* the drain timeout bounds it; the margin is for slow (sanitizer, loaded) machines, not a speed test */
    CHECKF(dt < 30, "shutdown took %.2f s", dt);
    CHECK(hr_server_n_inflight(srv) == 0);
    /* the listening socket is closed */
    int fd = hr_http_dial(port);
    CHECK(fd < 0);
    if (fd >= 0) close(fd);
    hr_runtime_pool p = {0};
    for (int i = 0; i < 3000; i++) { /* bounded: 60 s */
        hr_runtime_get_pool(rt, &p);
        if (p.ledger.blocks_used == 0 && p.engine.n_running == 0 && p.engine.n_waiting == 0) break;
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    CHECKF(p.ledger.blocks_used == 0, "blocks back after shutdown: %d", p.ledger.blocks_used);
    close(a);
    close(b);
}

static void test_auth(hr_runtime *rt) {
    hr_server_params sp = hr_server_default_params();
    sp.port = 0;
    sp.api_key = "s3cret";
    hr_server *srv = NULL;
    hr_error err = {0};
    CHECKF(hr_server_create(rt, &sp, &srv, &err) == HR_OK, "server with a key: %s", err.msg);
    if (!srv) return;
    int port = hr_server_port(srv);
    hr_http_resp r = hr_http_call(port, "GET", "/v1/models", NULL, NULL);
    char www[64];
    CHECKF(r.status == 401 && r.body && strstr(r.body, "invalid_api_key") &&
               header(&r, "www-authenticate", www, sizeof www),
           "no key: %d", r.status);
    hr_http_resp_free(&r);
    r = hr_http_call(port, "GET", "/v1/models", "Authorization: Bearer s3creT\r\n", NULL);
    CHECKF(r.status == 401, "wrong key: %d", r.status);
    hr_http_resp_free(&r);
    r = hr_http_call(port, "GET", "/v1/models", "Authorization: Bearer s3cret\r\n", NULL);
    CHECKF(r.status == 200, "right key: %d", r.status);
    hr_http_resp_free(&r);
    r = hr_http_call(port, "POST", "/v1/completions", NULL, "{\"prompt\":\"hi\"}");
    CHECKF(r.status == 401, "completions without a key: %d", r.status);
    hr_http_resp_free(&r);
    r = hr_http_call(port, "GET", "/health", NULL, NULL);
    CHECKF(r.status == 200, "health needs no key: %d", r.status);
    hr_http_resp_free(&r);
    hr_server_destroy(srv);
}

/* Before the runtime is attached: /health 503 "loading", the API 503; after: 200. */
static void test_loading(hr_runtime *rt) {
    hr_server_params sp = hr_server_default_params();
    sp.port = 0;
    hr_server *srv = NULL;
    hr_error err = {0};
    CHECKF(hr_server_create(NULL, &sp, &srv, &err) == HR_OK, "server without a runtime: %s", err.msg);
    if (!srv) return;
    int port = hr_server_port(srv);
    hr_http_resp r = hr_http_call(port, "GET", "/health", NULL, NULL);
    CHECKF(r.status == 503 && r.body && strstr(r.body, "loading"), "health while loading: %d %s", r.status, r.body);
    hr_http_resp_free(&r);
    r = hr_http_call(port, "POST", "/v1/completions", NULL, "{\"prompt\":\"hi\"}");
    CHECKF(r.status == 503 && r.body && strstr(r.body, "\"error\""), "completions while loading: %d", r.status);
    hr_http_resp_free(&r);
    r = hr_http_call(port, "GET", "/metrics", NULL, NULL);
    CHECKF(r.status == 200 && r.body && strstr(r.body, "headroom_up 0"), "metrics while loading: %d", r.status);
    hr_http_resp_free(&r);
    hr_server_set_runtime(srv, rt);
    r = hr_http_call(port, "GET", "/health", NULL, NULL);
    CHECKF(r.status == 200, "health once loaded: %d", r.status);
    hr_http_resp_free(&r);
    hr_server_destroy(srv);
}

static hr_runtime *open_runtime(const char *model, int max_running, int max_queue) {
    hr_runtime_params rp = hr_runtime_default_params();
    rp.model_path = model;
    rp.n_ctx = 256;
    rp.kv_seqs = 4;
    rp.max_running = max_running;
    rp.max_queue = max_queue;
    rp.n_threads = 2;
    rp.isa = hr_test_isa();
    hr_runtime *rt = NULL;
    hr_error err = {0};
    hr_status st = hr_runtime_open(&rp, &rt, NULL, &err);
    CHECKF(st == HR_OK, "runtime: %s", err.msg);
    if (st == HR_OK && hr_runtime_start(rt, &err) != HR_OK) {
        CHECKF(false, "engine thread: %s", err.msg);
        hr_runtime_close(rt);
        return NULL;
    }
    return rt;
}

int main(void) {
    const char *model = hr_test_shared_path("models/stories260K.gguf");
    if (!model) printf("stories260K absent: the built-in demo model serves\n");
    hr_runtime *rt = open_runtime(model, 4, 0);
    if (!rt) return hr_test_finish();

    hr_server_params sp = hr_server_default_params();
    sp.port = 0;
    sp.max_body_bytes = 64 * 1024;
    sp.metrics_compat = HR_METRICS_VLLM;
    hr_server *srv = NULL;
    hr_error err = {0};
    CHECKF(hr_server_create(rt, &sp, &srv, &err) == HR_OK, "server: %s", err.msg);
    if (srv) {
        int port = hr_server_port(srv);
        CHECK(port > 0);
        printf("serving %s on 127.0.0.1:%d\n", hr_runtime_model_name(rt), port);
        test_completions(port, hr_runtime_model_name(rt));
        test_chat(port);
        test_logprobs(port);
        test_tokenize_kv_metrics(port);
        test_errors(port, hr_runtime_n_ctx(rt));
        test_disconnect(port);
        /* binding a port in use fails with a reason */
        hr_server_params busy = hr_server_default_params();
        busy.port = port;
        hr_server *srv2 = NULL;
        CHECK(hr_server_create(rt, &busy, &srv2, &err) == HR_ERR_IO && strstr(err.msg, "in use"));
        hr_server_destroy(srv2);
        test_auth(rt);
        test_loading(rt);
        hr_server_destroy(srv);
    }
    hr_runtime_close(rt);

    /* a small engine for the queue and the shutdown */
    rt = open_runtime(model, 1, 1);
    if (!rt) return hr_test_finish();
    sp.drain_timeout_s = 0.5;
    srv = NULL;
    CHECKF(hr_server_create(rt, &sp, &srv, &err) == HR_OK, "server: %s", err.msg);
    if (srv) test_queue_and_shutdown(srv, rt);
    hr_server_destroy(srv);
    hr_runtime_close(rt);
    return hr_test_finish();
}

/* fuzz_http.c: libFuzzer target for the HTTP request path below the socket. The first byte picks the
 * route (completions, chat, tokenize, detokenize), the rest is the body. It goes through exactly the
 * server's validation (hr_srv_parse_body, then hr_srv_parse_gen / _tokenize / _detokenize); an
 * accepted generation is submitted to a real runtime on the demo model (max_tokens cut to 2 so each
 * run stays short) and stepped until final. Checked: every refusal is a 4xx/5xx with a one-line
 * message, every accepted request ends final with a finish reason, tokens stay in the vocabulary and
 * the pool is empty again after each input. Bodies are parsed within a small parse pool (256 KiB a
 * body, 1 MiB in all), as the server does, and the pool holds nothing again after each input; a
 * refusal's text for /v1/kv events (hr_srv_redact) is one line too.
 *
 * A first byte of 0x40..0x4f ('@', 'A'..'O') instead feeds the rest, as a raw request head, to the
 * gate's framing check (hr_srv_check_head, gate.c). Checked: the answer is 0 or 400/500 with a
 * one-line reason, and an accepted head, read again here line by line, has at most one
 * Content-Length (digits only), at most one Transfer-Encoding (exactly "chunked"), never both, no
 * NUL, no folded line and no whitespace before a colon. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "server/server_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* The fuzzer's one runtime: opened once (a model load per input would leave no time to fuzz). */
static hr_runtime *g_rt;
static hr_server_params g_sp;
static hr_srv_parse_pool *g_pool;

static void die(const char *what, const char *msg) {
    fprintf(stderr, "fuzz_http: %s: %s\n", what, msg);
    abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    hr_runtime_params p = hr_runtime_default_params();
    p.model_path = HR_SOURCE_DIR "/models/stories260K-q8_0.gguf";
    p.n_ctx = 128; /* short, so that "past the context" is reachable by small inputs */
    p.kv_seqs = 2;
    p.n_threads = 1;
    p.max_queue = 8;
    hr_error err = {0};
    if (hr_runtime_open(&p, &g_rt, NULL, &err) != HR_OK) die("open", err.msg);
    g_sp = hr_server_default_params();
    return 0;
}

static void check_error(const hr_srv_error *e) {
    if (e->http < 400 || e->http > 599) die("refusal", "HTTP status outside 4xx/5xx");
    if (!e->msg[0] || strchr(e->msg, '\n')) die("refusal", "message empty or more than one line");
    char clean[sizeof e->msg];
    hr_srv_redact(e->msg, clean, sizeof clean);
    if (strchr(clean, '\n') || !hr_utf8_valid(clean, strlen(clean), NULL)) die("refusal", "redacted message");
    char *body = hr_srv_error_body(e);
    if (!body) die("refusal", "no error body");
    free(body);
}

static void run_generation(hr_srv_kind kind, json_t *root) {
    hr_srv_gen g;
    hr_srv_error e = {0};
    if (!hr_srv_parse_gen(kind, root, &g_sp, 42, &g, &e)) {
        check_error(&e);
        hr_srv_gen_free(&g);
        return;
    }
    if (g.n < 1 || g.n > g_sp.max_choices) die("parse_gen", "n out of range");
    hr_rt_request *req[HR_SRV_MAX_CHOICES] = {0};
    int n = 0;
    for (int i = 0; i < g.n; i++) {
        hr_rt_request_params rp = g.rp;
        if (rp.max_tokens <= 0 || rp.max_tokens > 2) rp.max_tokens = 2;
        hr_error err = {0};
        hr_status st = hr_runtime_submit(g_rt, &rp, &req[i], &err);
        if (st != HR_OK) {
            hr_srv_fail_status(&e, g_rt, st, &err, g.prompt_field, g.rp.constraint.field);
            check_error(&e);
            break;
        }
        n = i + 1;
    }
    hr_error err = {0};
    if (hr_runtime_run_until_idle(g_rt, &err) != HR_OK) die("run_until_idle", err.msg);
    int32_t n_vocab = hr_tokenizer_n_vocab(hr_runtime_tokenizer(g_rt));
    for (int i = 0; i < n; i++) {
        hr_rt_result r;
        hr_rt_request_result(req[i], &r);
        if (r.state != HR_RT_COMPLETED && r.state != HR_RT_FAILED) die("request", "not final after idle");
        if (!r.finish_reason) die("request", "no finish reason");
        if (r.state == HR_RT_FAILED && (!r.error || !r.error[0])) die("request", "failed without a reason");
        for (int t = 0; t < r.n_ids; t++)
            if (r.ids[t] < 0 || r.ids[t] >= n_vocab) die("request", "token id outside the vocabulary");
        hr_rt_request_release(g_rt, req[i]);
    }
    hr_srv_gen_free(&g);
    hr_runtime_pool pool;
    hr_runtime_get_pool(g_rt, &pool);
    if (pool.engine.n_running != 0 || pool.engine.n_waiting != 0) die("pool", "requests left in the engine");
}

static void run_tokenize(json_t *root) {
    hr_srv_tokenize q;
    hr_srv_error e = {0};
    if (!hr_srv_parse_tokenize(root, &q, &e)) {
        check_error(&e);
        return;
    }
    const hr_tokenizer *tok = hr_runtime_tokenizer(g_rt);
    int32_t *ids = NULL;
    size_t n = 0;
    hr_error err = {0};
    if (hr_tokenizer_encode_alloc(tok, q.text, q.len, &q.opts, &ids, &n, &err) != HR_OK) return;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= hr_tokenizer_n_vocab(tok)) die("tokenize", "id outside the vocabulary");
    free(ids);
}

static void run_detokenize(json_t *root) {
    const hr_tokenizer *tok = hr_runtime_tokenizer(g_rt);
    int32_t *ids = NULL;
    size_t n = 0;
    hr_srv_error e = {0};
    if (!hr_srv_parse_detokenize(root, hr_tokenizer_n_vocab(tok), &ids, &n, &e)) {
        check_error(&e);
        return;
    }
    char *text = NULL;
    size_t len = 0;
    hr_error err = {0};
    if (hr_tokenizer_decode(tok, ids, n, false, &text, &len, &err) == HR_OK && !hr_utf8_valid(text, len, NULL))
        die("detokenize", "decoded text is not valid UTF-8");
    free(text);
    free(ids);
}

static bool name_is(const char *line, size_t name_len, const char *want) {
    return name_len == strlen(want) && !strncasecmp(line, want, name_len);
}

/* The head check's contract, re-read independently of gate.c's parser. */
static void run_head(const char *head, size_t n) {
    char why[200] = "";
    int st = hr_srv_check_head(head, n, why, sizeof why);
    if (st != 0 && st != 400 && st != 500) die("check_head", "status other than 0, 400, 500");
    if (st != 0) {
        if (!why[0] || strchr(why, '\n')) die("check_head", "reason empty or more than one line");
        return;
    }
    if (memchr(head, '\0', n)) die("check_head", "accepted a NUL");
    const char *p = memchr(head, '\n', n), *end = head + n;
    if (!p) return; /* no whole request line: left to libmicrohttpd */
    int n_cl = 0, n_te = 0;
    for (const char *line = p + 1; line < end;) {
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (!eol) break;
        size_t len = (size_t)(eol - line);
        if (len > 0 && line[len - 1] == '\r') len--;
        if (len == 0) break;
        if (line[0] == ' ' || line[0] == '\t') die("check_head", "accepted a folded line");
        const char *colon = memchr(line, ':', len);
        if (colon) {
            size_t nl = (size_t)(colon - line);
            if (nl == 0 || line[nl - 1] == ' ' || line[nl - 1] == '\t') die("check_head", "accepted a bad name");
            const char *v = colon + 1, *ve = line + len;
            while (v < ve && (*v == ' ' || *v == '\t')) v++;
            while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t')) ve--;
            if (name_is(line, nl, "Content-Length")) {
                n_cl++;
                if (ve == v) die("check_head", "accepted an empty Content-Length");
                for (const char *q = v; q < ve; q++)
                    if (!isdigit((unsigned char)*q)) die("check_head", "accepted a non-digit Content-Length");
            } else if (name_is(line, nl, "Transfer-Encoding")) {
                n_te++;
                if (ve - v != 7 || strncasecmp(v, "chunked", 7) != 0) die("check_head", "accepted a coding");
            }
        }
        line = eol + 1;
    }
    if (n_cl > 1 || n_te > 1 || (n_cl && n_te)) die("check_head", "accepted ambiguous framing");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if ((data[0] & 0xf0) == 0x40) {
        char *head = malloc(size - 1 ? size - 1 : 1); /* exact size: a read past the end is caught */
        if (!head) return 0;
        memcpy(head, data + 1, size - 1);
        run_head(head, size - 1);
        free(head);
        return 0;
    }
    int route = data[0] & 3;
    /* an exact-size copy of the body, so a read past its end is caught */
    char *body = malloc(size - 1 ? size - 1 : 1);
    if (!body) return 0;
    memcpy(body, data + 1, size - 1);
    hr_srv_error e = {0};
    if (!g_pool && !(g_pool = hr_srv_parse_pool_create(1u << 20, 256u << 10))) die("parse pool", "out of memory");
    size_t held = 0;
    json_t *root = hr_srv_parse_body_in(g_pool, body, size - 1, &held, &e);
    if (!root) {
        check_error(&e);
    } else if (route == 0 || route == 1) {
        run_generation(route == 0 ? HR_SRV_COMPLETION : HR_SRV_CHAT, root);
    } else if (route == 2) {
        run_tokenize(root);
    } else {
        run_detokenize(root);
    }
    json_decref(root);
    hr_srv_parse_pool_release(g_pool, held);
    if (hr_srv_parse_pool_held(g_pool) != 0) die("parse pool", "bytes still held after the document was freed");
    free(body);
    return 0;
}

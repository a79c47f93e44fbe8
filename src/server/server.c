/* server.c: the HTTP side of `headroom serve`: libmicrohttpd with one thread per connection, routing,
 * authentication, bodies, the registry of in-flight jobs and the graceful shutdown.
 *
 * Invariants:
 *   1. A job is in the registry from submission until its connection's request is completed (MHD's
 *      completed callback), and is freed only after leaving it, under the mutex: /v1/kv and the
 *      shutdown may read any registered job's requests.
 *   2. A job whose request did not complete normally (client gone, timeout, daemon stopping) has its
 *      runtime requests cancelled; their blocks go back to the pool at the engine's next step.
 *   3. After DRAINING no job enters the registry: a job that was submitted while the state changed
 *      cancels itself and answers 503.
 *
 *   4. Everything that can refuse a request without its body (route, method, API key, framing,
 *      a declared length past max_body_bytes) is decided on the first access-handler call, so that a
 *      refused client costs its headers and no body byte is read (MHD closes after answering).
 *
 * Request flow (each box runs on the connection's thread):
 *   first call: route, method, key, framing (guard.c), 413 from Content-Length; the watchdog's BODY
 *   upload calls: body appended up to max_body_bytes
 *   last call: handler -> response queued (non-streaming generation waits here, polling the socket:
 *              a client that closes its end is probed (probe_reader) to tell a half-close, which
 *              still gets its answer, from a hang-up, which cancels its request)
 *   streaming: MHD calls stream_reader (stream.c) until [DONE]
 *   completed: on_completed -> job_finish (cancel if aborted, metrics, unregister, release) */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/util.h"
#include "server/activity.h"
#include "server/dashboard.h"
#include "server/server_internal.h"

enum { ST_LOADING = 0, ST_READY = 1, ST_DRAINING = 2, ST_STOPPED = 3 };

struct hr_server {
    hr_server_params p;
    char *host, *api_key;
    char **keys; /* api_key split: each key a tenant (hr_server_keys_parse) */
    int n_keys;
    hr_srv_parse_pool *parse_pool; /* bounds the memory of request bodies being parsed */
    _Atomic(hr_runtime *) rt;
    struct MHD_Daemon *d;
    int port;
    long long started; /* unix seconds, the models' "created" */
    atomic_int state;
    atomic_bool abandon;         /* past the drain and the cancellations: stop waiting on channels */
    atomic_bool fallback_logged; /* the chat template's render-time fallback was logged (once) */
    pthread_mutex_t mu;          /* the registry */
    pthread_cond_t cv;           /* a job left the registry */
    hr_srv_job *jobs;
    int n_jobs;
    atomic_uint_fast64_t next_id;
    hr_srv_metrics *metrics;
    hr_srv_activity *activity; /* events and rates for the dashboard and `headroom top` */
    pthread_mutex_t shutdown_mu;
    bool shut_down;
    hr_srv_guard *guard; /* the slow-connection watchdog */
    hr_srv_gate *gate;   /* accepts, holds connections until their headers are in, hands them to MHD */
};

typedef enum {
    R_HEALTH,
    R_METRICS,
    R_MODELS,
    R_KV,
    R_COMPLETIONS,
    R_CHAT,
    R_TOKENIZE,
    R_DETOKENIZE,
    R_DASHBOARD,
    R_NONE
} route_id;

/* One HTTP request on a connection (MHD's con_cls). */
typedef struct conn {
    hr_server *s;
    hr_srv_buf body;
    bool too_large;
    int tenant;          /* the API key's index (0 without keys) */
    size_t parsed_bytes; /* the parsed body's bytes, reserved in the parse pool until drop_body */
    hr_srv_job *job;
    route_id route;
    struct MHD_Connection *mhd;
    hr_srv_sock *sock; /* the connection's watchdog entry (NULL: untracked) */
    /* a half-closed non-streaming request answered by probe_reader */
    char *answer;
    size_t answer_len, answer_off;
} conn;

hr_server_params hr_server_default_params(void) {
    hr_rt_sampling sp = hr_rt_sampling_default();
    sp.temperature = 0.8f; /* the CLI's default; a request's "temperature" overrides it */
    return (hr_server_params){.host = "127.0.0.1",
                              .port = 8080,
                              .max_body_bytes = 4u << 20,
                              .drain_timeout_s = 30,
                              .max_connections = 256,
                              .max_choices = HR_SRV_MAX_CHOICES,
                              .sampling = sp,
                              .default_completion_tokens = 16,
                              .metrics_compat = HR_METRICS_NATIVE,
                              .max_header_bytes = 32u << 10,
                              .max_tokens_limit = 0,
                              .max_parse_bytes = HR_SERVER_PARSE_BYTES,
                              .cache_scope = HR_CACHE_SCOPE_AUTO,
                              .header_timeout_s = 10,
                              .body_min_rate = 1024,
                              .max_conns_per_ip = 64,
                              .listen_backlog = 1024};
}

static hr_runtime *ready_runtime(hr_server *s) {
    return atomic_load(&s->state) == ST_READY ? atomic_load(&s->rt) : NULL;
}

/* ---- responses --------------------------------------------------------------------------------- */

/* Every response ends its connection: each request then passes the gate (gate.c), which checks its
 * framing before libmicrohttpd parses it. A kept-alive connection's next request would reach MHD
 * unchecked, and MHD 0.9.75 answers a malformed Content-Length there with its header written twice
 * and accepts obs-fold. The price is a connection and its thread per request (a whole GET /health
 * on a fresh connection: 0.16 ms median on loopback, docs/SECURITY.md), against milliseconds per
 * generated token. */
static enum MHD_Result queue_response(struct MHD_Connection *c, unsigned status, struct MHD_Response *r) {
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    return MHD_queue_response(c, status, r);
}

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *ctype, const char *text,
                                 size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)text, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    enum MHD_Result ok = queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_t *o) {
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text) return send_text(c, 500, "application/json", "{\"error\":{\"message\":\"out of memory\"}}", 38);
    enum MHD_Result ok = send_text(c, status, "application/json", text, strlen(text));
    free(text);
    return ok;
}

static enum MHD_Result send_error(hr_server *s, struct MHD_Connection *c, const hr_srv_error *e) {
    hr_srv_metrics_refused(s->metrics, e->refusal);
    hr_srv_activity_refused(s->activity, e);
    char *text = hr_srv_error_body(e);
    if (!text) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (e->http == 429) {
        char secs[32];
        snprintf(secs, sizeof secs, "%d", hr_srv_retry_after_secs(e->retry_after_s));
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, secs);
    }
    if (e->http == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (e->http == 503) MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "5");
    if (e->http == 405)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, e->code && !strcmp(e->code, "get") ? "GET" : "POST");
    enum MHD_Result ok = queue_response(c, (unsigned)e->http, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result fail(hr_server *s, struct MHD_Connection *c, int http, const char *param, const char *code,
                            const char *msg) {
    hr_srv_error e;
    hr_srv_fail(&e, http, param, code, "%s", msg);
    return send_error(s, c, &e);
}

/* ---- the registry ------------------------------------------------------------------------------ */

/* Adds j unless the server left READY (invariant 3). */
static bool job_register(hr_server *s, hr_srv_job *j) {
    pthread_mutex_lock(&s->mu);
    bool ok = atomic_load(&s->state) == ST_READY;
    if (ok) {
        j->next = s->jobs;
        if (s->jobs) s->jobs->prev = j;
        s->jobs = j;
        s->n_jobs++;
    }
    pthread_mutex_unlock(&s->mu);
    return ok;
}

static void job_record(hr_server *s, hr_srv_job *j, bool aborted) {
    if (j->recorded) return;
    j->recorded = true;
    for (int i = 0; i < j->n; i++) {
        hr_rt_result r;
        hr_rt_request_result(j->req[i], &r);
        /* a cancelled request may not have reached its final state yet: count it as what it will be */
        if (aborted && r.state != HR_RT_COMPLETED && r.state != HR_RT_FAILED) r.state = HR_RT_CANCELLED;
        float *gaps = r.n_ids > 1 ? malloc(sizeof(float) * (size_t)(r.n_ids - 1)) : NULL;
        int n_gaps = gaps ? hr_rt_request_token_gaps(j->req[i], gaps, r.n_ids - 1) : 0;
        hr_srv_metrics_finished(s->metrics, &r, gaps, n_gaps);
        hr_srv_activity_finished(s->activity, &r, gaps, n_gaps);
        free(gaps);
    }
}

/* Ends a job: cancels it when its HTTP request did not complete, records it, frees it. */
static void job_finish(hr_server *s, hr_srv_job *j, bool aborted, bool registered) {
    hr_runtime *rt = atomic_load(&s->rt);
    if (aborted)
        for (int i = 0; i < j->n; i++)
            if (j->req[i]) hr_rt_request_cancel(rt, j->req[i]);
    if (registered) {
        job_record(s, j, aborted);
        pthread_mutex_lock(&s->mu);
        if (j->prev)
            j->prev->next = j->next;
        else
            s->jobs = j->next;
        if (j->next) j->next->prev = j->prev;
        s->n_jobs--;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
    for (int i = 0; i < j->n; i++) hr_rt_request_release(rt, j->req[i]);
    hr_srv_buf_free(&j->pending);
    json_decref(j->tools.list);
    for (int i = 0; i < HR_SRV_MAX_CHOICES; i++) hr_srv_buf_free(&j->tool_text[i]);
    free(j);
}

int hr_server_n_inflight(hr_server *s) {
    pthread_mutex_lock(&s->mu);
    int n = s->n_jobs;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* ---- bodies ------------------------------------------------------------------------------------ */

/* The body within the server's parse bound; free it with drop_body. */
static json_t *parse_body(conn *k, hr_srv_error *e) {
    return hr_srv_parse_body_in(k->s->parse_pool, k->body.data, k->body.len, &k->parsed_bytes, e);
}

static void drop_body(conn *k, json_t *root) {
    json_decref(root);
    hr_srv_parse_pool_release(k->s->parse_pool, k->parsed_bytes); /* the document's bytes are free again */
    k->parsed_bytes = 0;
}

/* ---- generation -------------------------------------------------------------------------------- */

enum { CLIENT_HERE, CLIENT_CLOSED_END, CLIENT_GONE };

/* What the socket says about the client: CLOSED_END once it sent its FIN (poll's RDHUP; a pipelined
 * next request is not one), GONE on a reset or error. A FIN alone cannot tell a half-close
 * (shutdown(SHUT_WR), still reading) from a close: only a write can (probe_reader). */
static int client_state(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return CLIENT_HERE;
    struct pollfd pfd = {.fd = ci->connect_fd, .events = POLLRDHUP};
    if (poll(&pfd, 1, 0) <= 0) return CLIENT_HERE;
    if (pfd.revents & (POLLHUP | POLLERR)) return CLIENT_GONE;
    return pfd.revents & POLLRDHUP ? CLIENT_CLOSED_END : CLIENT_HERE;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    conn *k = cls;
    long n = hr_srv_stream_read(k->job, buf, max, &k->s->abandon);
    if (n < 0) {
        job_record(k->s, k->job, false);
        return k->job->done_sent ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
    }
    return (ssize_t)n;
}

static enum MHD_Result respond_stream(struct MHD_Connection *c, conn *k) {
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, k, NULL);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ok = queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ok;
}

enum { WAIT_DONE, WAIT_GONE, WAIT_CLOSED_END, WAIT_TIMEOUT };

/* Waits until every choice is final, the client goes (GONE), it closes its end (CLOSED_END, unless
 * probing: then only GONE counts) or deadline passes. The channels are read and dropped (the result
 * holds the whole output): unread output would keep hr_rt_request_wait from sleeping. */
static int wait_all(hr_server *s, struct MHD_Connection *c, hr_srv_job *j, bool probing, double deadline) {
    char text[4096];
    int32_t ids[256];
    for (int i = 0; i < j->n; i++) {
        hr_rt_request *h = j->req[i];
        for (;;) {
            hr_rt_delta d;
            hr_rt_request_read(h, ids, (int)(sizeof ids / sizeof ids[0]), text, sizeof text, &d);
            if (d.done) break;
            if (d.n_tokens > 0 || d.n_text > 0) continue;
            if (atomic_load(&s->abandon)) return WAIT_GONE;
            int cs = client_state(c);
            if (cs == CLIENT_GONE) return WAIT_GONE;
            if (cs == CLIENT_CLOSED_END && !probing) return WAIT_CLOSED_END;
            if (hr_time_now() > deadline) return WAIT_TIMEOUT;
            hr_rt_request_wait(h, 0.25);
        }
    }
    return WAIT_DONE;
}

/* The finished job's answer: the response JSON (200), or a 500 error body when a choice failed.
 * Malloc'd text; NULL when out of memory. */
static char *answer_text(hr_server *s, hr_srv_job *j, unsigned *status) {
    hr_rt_result res[HR_SRV_MAX_CHOICES];
    for (int i = 0; i < j->n; i++) hr_rt_request_result(j->req[i], &res[i]);
    for (int i = 0; i < j->n; i++)
        if (res[i].state == HR_RT_FAILED) {
            hr_srv_error e;
            hr_srv_fail(&e, 500, NULL, "generation_failed", "generation failed: %s", res[i].error ? res[i].error : "?");
            hr_srv_metrics_refused(s->metrics, e.refusal);
            hr_srv_activity_refused(s->activity, &e);
            *status = 500;
            return hr_srv_error_body(&e);
        }
    json_t *o = hr_srv_response_json(j, res);
    job_record(s, j, false);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    *status = MHD_HTTP_OK;
    return text;
}

/* The body of a non-streaming answer whose client closed its end while waiting: committed to 200,
 * it writes a space (JSON allows leading whitespace) at most every second until the answer is
 * ready. A client that only half-closed reads the spaces and then the answer; one that is gone makes
 * a write fail (the first is answered by a reset, the next fails), MHD ends the request as aborted
 * and on_completed cancels it. A failed choice has no status left to change: its error object comes
 * in the 200 body. */
static ssize_t probe_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    conn *k = cls;
    hr_server *s = k->s;
    if (!k->answer) {
        int w = wait_all(s, k->mhd, k->job, true, hr_time_now() + 1.0);
        if (w == WAIT_GONE) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (w == WAIT_TIMEOUT) {
            buf[0] = ' ';
            return 1;
        }
        unsigned status;
        k->answer = answer_text(s, k->job, &status);
        if (!k->answer) return MHD_CONTENT_READER_END_WITH_ERROR;
        k->answer_len = strlen(k->answer);
    }
    if (k->answer_off >= k->answer_len) return MHD_CONTENT_READER_END_OF_STREAM;
    size_t n = k->answer_len - k->answer_off < max ? k->answer_len - k->answer_off : max;
    memcpy(buf, k->answer + k->answer_off, n);
    k->answer_off += n;
    return (ssize_t)n;
}

static enum MHD_Result respond_probing(struct MHD_Connection *c, conn *k) {
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, probe_reader, k, NULL);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    enum MHD_Result ok = queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result handle_generate(hr_server *s, struct MHD_Connection *c, conn *k, hr_srv_kind kind) {
    hr_srv_error e = {0};
    hr_runtime *rt = ready_runtime(s);
    if (!rt)
        return fail(s, c, 503, NULL, "unavailable",
                    atomic_load(&s->state) == ST_LOADING ? "the model is loading" : "the server is shutting down");
    json_t *root = parse_body(k, &e);
    if (!root) return send_error(s, c, &e);
    hr_srv_gen g;
    uint64_t auto_seed = s->p.sampling.seed + atomic_fetch_add(&s->next_id, 1) * 0x9E3779B97F4A7C15ull;
    if (!hr_srv_parse_gen(kind, root, &s->p, auto_seed, &g, &e)) {
        hr_srv_gen_free(&g);
        drop_body(k, root);
        return send_error(s, c, &e);
    }
    hr_tool_format tool_format = hr_tool_format_for(hr_runtime_chat_family(rt));
    if (kind == HR_SRV_CHAT && !hr_srv_gen_apply_tools(&g, root, tool_format, hr_runtime_chat_native(rt), &e)) {
        hr_srv_gen_free(&g);
        drop_body(k, root);
        return send_error(s, c, &e);
    }
    hr_srv_job *j = calloc(1, sizeof *j);
    if (!j) {
        hr_srv_gen_free(&g);
        drop_body(k, root);
        return fail(s, c, 500, NULL, "nomem", "out of memory");
    }
    j->tools = g.tools;
    j->tools.list = json_incref(g.tools.list); /* the job outlives the request's JSON */
    j->tools.forced = NULL;
    j->tool_format = tool_format;
    j->tool_seed = (unsigned long long)auto_seed;
    snprintf(j->id, sizeof j->id, "%s-%llx%06llx", kind == HR_SRV_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)s->started, (unsigned long long)atomic_fetch_add(&s->next_id, 1));
    j->kind = kind;
    j->created = (long long)time(NULL);
    j->model = hr_runtime_model_name(rt);
    j->stream = g.stream;
    j->include_usage = g.stream && g.include_usage;
    j->logprobs = g.rp.logprobs;
    j->top_logprobs = g.rp.top_logprobs;
    j->tok = hr_runtime_tokenizer(rt);
    bool by_key = s->p.cache_scope == HR_CACHE_SCOPE_KEY ||
                  (s->p.cache_scope == HR_CACHE_SCOPE_AUTO && s->n_keys > 1); /* tenants apart */
    g.rp.cache_scope =
        hr_srv_cache_scope(by_key && s->keys ? s->keys[k->tenant] : NULL, g.cache_salt, g.cache_salt_len);
    hr_error err = {0};
    hr_status st = hr_runtime_submit_n(rt, &g.rp, g.n, j->req, &err);
    if (st != HR_OK)
        hr_srv_fail_status(&e, rt, st, &err, g.prompt_field, g.rp.constraint.field);
    else
        j->n = g.n;
    if (g.rp.n_messages && !atomic_load(&s->fallback_logged)) {
        const char *note = hr_runtime_chat_fallback_note(rt); /* once: the reason a template fell back */
        if (note[0] && !atomic_exchange(&s->fallback_logged, true))
            fprintf(stderr, "headroom serve: chat: the model's template fell back to the %s family renderer: %s\n",
                    hr_runtime_chat_family(rt), note);
    }
    hr_srv_gen_free(&g);
    drop_body(k, root);
    if (e.http) {
        job_finish(s, j, true, false);
        return send_error(s, c, &e);
    }
    int n_prompt = 0;
    hr_rt_request_prompt(j->req[0], &n_prompt);
    hr_srv_metrics_prompt_tokens(s->metrics, n_prompt * j->n);
    hr_srv_activity_submitted(s->activity, j->n, n_prompt);
    if (!job_register(s, j)) {
        job_finish(s, j, true, false);
        return fail(s, c, 503, NULL, "draining", "the server is shutting down");
    }
    k->job = j;
    if (j->stream) return respond_stream(c, k);
    int w = wait_all(s, c, j, false, 1e300);
    if (w == WAIT_GONE) return MHD_NO; /* closes the connection; on_completed cancels */
    if (w == WAIT_CLOSED_END) return respond_probing(c, k);
    unsigned status;
    char *text = answer_text(s, j, &status);
    if (!text) return send_text(c, 500, "application/json", "{\"error\":{\"message\":\"out of memory\"}}", 38);
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    enum MHD_Result ok = queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

/* ---- the other endpoints ----------------------------------------------------------------------- */

static enum MHD_Result handle_health(hr_server *s, struct MHD_Connection *c) {
    int st = atomic_load(&s->state);
    const char *what = st == ST_READY ? "ok" : st == ST_LOADING ? "loading" : "draining";
    json_t *o = json_pack("{s:s}", "status", what);
    return send_json(c, st == ST_READY ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, o);
}

static enum MHD_Result handle_models(hr_server *s, struct MHD_Connection *c, hr_runtime *rt) {
    const hr_runtime_params *rp = hr_runtime_get_params(rt);
    json_t *m = json_pack("{s:s, s:s, s:I, s:s, s:{s:i, s:s, s:s, s:i, s:I, s:b}}", "id", hr_runtime_model_name(rt),
                          "object", "model", "created", (json_int_t)s->started, "owned_by", "headroom", "meta", "n_ctx",
                          hr_runtime_n_ctx(rt), "k_format", hr_rt_kv_format_name(rp->k_format), "v_format",
                          hr_rt_kv_format_name(rp->v_format), "block_size", rp->block_size, "kv_budget_bytes",
                          (json_int_t)hr_runtime_budget(rt)->budget_bytes, "demo", hr_runtime_is_demo(rt));
    /* what clients read to size requests: vLLM's name, and the plain one */
    json_object_set_new(m, "max_model_len", json_integer(hr_runtime_n_ctx(rt)));
    json_object_set_new(m, "context_length", json_integer(hr_runtime_n_ctx(rt)));
    return send_json(c, MHD_HTTP_OK, json_pack("{s:s, s:[o]}", "object", "list", "data", m));
}

static json_t *pool_json(hr_runtime *rt) {
    hr_runtime_pool p;
    hr_runtime_get_pool(rt, &p);
    const hr_rt_pool_ledger *l = &p.ledger;
    const hr_runtime_params *rp = hr_runtime_get_params(rt);
    json_t *o = json_object();
    json_object_set_new(o, "k_format", json_string(hr_rt_kv_format_name(rp->k_format)));
    json_object_set_new(o, "v_format", json_string(hr_rt_kv_format_name(rp->v_format)));
    json_object_set_new(o, "block_size", json_integer(rp->block_size));
    json_object_set_new(o, "blocks_total", json_integer(l->blocks_total));
    json_object_set_new(o, "blocks_used", json_integer(l->blocks_used));
    json_object_set_new(o, "blocks_cached", json_integer(l->blocks_cached));
    json_object_set_new(o, "blocks_free", json_integer(l->blocks_free));
    json_object_set_new(o, "total_bytes", json_integer((json_int_t)l->bytes_total));
    json_object_set_new(o, "used_bytes", json_integer((json_int_t)l->bytes_used));
    json_object_set_new(o, "cached_bytes", json_integer((json_int_t)l->bytes_cached));
    json_object_set_new(o, "free_bytes", json_integer((json_int_t)l->bytes_free));
    json_object_set_new(o, "waste_bytes", json_integer((json_int_t)l->waste_bytes));
    json_object_set_new(o, "swapped_bytes", json_integer((json_int_t)l->bytes_swapped));
    json_object_set_new(o, "headroom_bytes", json_integer((json_int_t)p.headroom_bytes));
    json_object_set_new(o, "budget_bytes", json_integer((json_int_t)p.budget_bytes));
    json_object_set_new(o, "prefix_hit_tokens_total", json_integer((json_int_t)l->prefix_hit_tokens_total));
    json_object_set_new(o, "requests_running", json_integer(p.engine.n_running));
    json_object_set_new(o, "requests_waiting", json_integer(p.engine.n_waiting));
    json_object_set_new(o, "preemptions", json_integer((json_int_t)p.engine.preemptions));
    /* a hybrid pool: the layer groups and what each kind of layer holds (kv.h's layer groups) */
    if (l->n_groups > 1 || (l->n_kinds == 1 && l->kinds[0].latent)) { /* and a latent cache's one kind */
        json_object_set_new(o, "layer_groups", json_integer(l->n_groups));
        json_object_set_new(o, "groups", hr_srv_kv_kinds_json(l->kinds, l->n_kinds));
        json_object_set_new(o, "window_blocks_freed_total", json_integer((json_int_t)l->window_blocks_freed_total));
    }
    return o;
}

/* Planned against measured memory (docs/PLAN.md): the plan the pool was sized by, and this process's
 * resident set now and at its peak. */
static json_t *memory_json(hr_runtime *rt) {
    hr_runtime_memory m;
    hr_runtime_get_memory(rt, &m);
    return json_pack("{s:I, s:{s:I, s:I, s:I, s:I, s:I, s:I}, s:I, s:I}", "planned_bytes", (json_int_t)m.planned_bytes,
                     "planned", "weights_bytes", (json_int_t)m.weight_bytes, "kv_bytes", (json_int_t)m.kv_bytes,
                     "scratch_bytes", (json_int_t)m.scratch_bytes, "tables_bytes", (json_int_t)m.meta_bytes,
                     "overhead_bytes", (json_int_t)m.base_bytes, "requests_bytes", (json_int_t)m.request_bytes,
                     "rss_bytes", (json_int_t)m.rss_bytes, "peak_rss_bytes", (json_int_t)m.peak_rss_bytes);
}

/* --device cuda: the GPU's memory: the driver's report at start, the budget, the one arena by part and
 * in use now (null on the CPU) */
static json_t *device_json(hr_runtime *rt) {
    hr_rt_device_mem d;
    if (!hr_runtime_device_mem(rt, &d)) return json_null();
    return json_pack("{s:s, s:I, s:I, s:f, s:I, s:I, s:{s:I, s:I, s:I}, s:I, s:I}", "name", d.name, "total_bytes",
                     (json_int_t)d.total_bytes, "free_at_start_bytes", (json_int_t)d.free_bytes, "gpu_util", d.util,
                     "budget_bytes", (json_int_t)d.budget_bytes, "arena_bytes", (json_int_t)d.arena_bytes, "arena",
                     "weights_bytes", (json_int_t)d.weight_bytes, "scratch_bytes", (json_int_t)d.scratch_bytes,
                     "kv_bytes", (json_int_t)d.kv_bytes, "arena_used_bytes", (json_int_t)d.arena_used_bytes,
                     "arena_peak_bytes", (json_int_t)d.arena_peak_bytes);
}

static enum MHD_Result handle_kv(hr_server *s, struct MHD_Connection *c, hr_runtime *rt) {
    json_t *reqs = json_array();
    double now = hr_time_now();
    pthread_mutex_lock(&s->mu);
    for (hr_srv_job *j = s->jobs; j; j = j->next)
        for (int i = 0; i < j->n; i++) {
            hr_rt_result r;
            hr_rt_request_result(j->req[i], &r);
            json_t *o = json_pack("{s:s, s:i, s:s, s:i, s:i}", "id", j->id, "choice", i, "state",
                                  hr_rt_state_name(r.state), "prompt_tokens", r.n_prompt, "completion_tokens", r.n_ids);
            json_object_set_new(o, "kv", hr_srv_kv_usage_json(&r.kv));
            hr_srv_activity_row_json(&r, now, o);
            json_array_append_new(reqs, o);
        }
    pthread_mutex_unlock(&s->mu);
    json_t *o = json_object();
    json_object_set_new(o, "object", json_string("kv"));
    json_object_set_new(o, "model", json_string(hr_runtime_model_name(rt)));
    json_object_set_new(o, "pool", pool_json(rt));
    json_object_set_new(o, "memory", memory_json(rt));
    json_object_set_new(o, "device", device_json(rt));
    json_object_set_new(o, "requests", reqs);
    hr_srv_activity_add_json(s->activity, rt, &s->p, o);
    return send_json(c, MHD_HTTP_OK, o);
}

/* The connection guards' figures (gate.c, guard.c), after the request metrics. */
static void render_connections(hr_server *s, hr_srv_buf *b) {
    hr_server_stats st;
    hr_server_get_stats(s, &st);
    hr_srv_buf_printf(
        b,
        "# HELP headroom_connections_open TCP connections open: waiting for their request headers, or "
        "handed to an HTTP thread\n# TYPE headroom_connections_open gauge\n"
        "headroom_connections_open{state=\"waiting\"} %d\nheadroom_connections_open{state=\"served\"} %d\n",
        st.n_pending, st.n_connections - st.n_pending);
    hr_srv_buf_printf(b,
                      "# HELP headroom_connections_closed_total Connections the server closed on its own, by reason\n"
                      "# TYPE headroom_connections_closed_total counter\n"
                      "headroom_connections_closed_total{reason=\"slow_headers\"} %llu\n"
                      "headroom_connections_closed_total{reason=\"slow_body\"} %llu\n"
                      "headroom_connections_closed_total{reason=\"make_room\"} %llu\n"
                      "headroom_connections_closed_total{reason=\"bad_framing\"} %llu\n"
                      "headroom_connections_closed_total{reason=\"per_ip_cap\"} %llu\n",
                      (unsigned long long)st.n_cut_headers, (unsigned long long)st.n_cut_body,
                      (unsigned long long)st.n_evicted, (unsigned long long)st.n_refused_framing,
                      (unsigned long long)st.n_refused_per_ip);
}

static enum MHD_Result handle_metrics(hr_server *s, struct MHD_Connection *c) {
    hr_srv_buf b = {0};
    hr_srv_metrics_render(s->metrics, ready_runtime(s) ? atomic_load(&s->rt) : NULL, s->p.metrics_compat, &b);
    render_connections(s, &b);
    enum MHD_Result ok = b.failed
                             ? fail(s, c, 500, NULL, "nomem", "out of memory")
                             : send_text(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", b.data, b.len);
    hr_srv_buf_free(&b);
    return ok;
}

static enum MHD_Result handle_tokenize(hr_server *s, struct MHD_Connection *c, conn *k, hr_runtime *rt) {
    hr_srv_error e;
    json_t *root = parse_body(k, &e);
    if (!root) return send_error(s, c, &e);
    hr_srv_tokenize q;
    enum MHD_Result ok;
    if (!hr_srv_parse_tokenize(root, &q, &e)) {
        ok = send_error(s, c, &e);
    } else {
        const hr_tokenizer *tok = hr_runtime_tokenizer(rt);
        int32_t *ids = NULL;
        size_t n = 0;
        hr_error err;
        if (hr_tokenizer_encode_alloc(tok, q.text, q.len, &q.opts, &ids, &n, &err) != HR_OK) {
            ok = fail(s, c, 400, "content", "invalid_value", err.msg);
        } else {
            json_t *arr = json_array();
            for (size_t i = 0; i < n; i++) {
                if (q.with_pieces) {
                    const char *piece = hr_tokenizer_piece(tok, ids[i]);
                    json_array_append_new(arr, json_pack("{s:i, s:s}", "id", ids[i], "piece", piece ? piece : ""));
                } else {
                    json_array_append_new(arr, json_integer(ids[i]));
                }
            }
            free(ids);
            ok = send_json(c, MHD_HTTP_OK, json_pack("{s:o}", "tokens", arr));
        }
    }
    drop_body(k, root);
    return ok;
}

static enum MHD_Result handle_detokenize(hr_server *s, struct MHD_Connection *c, conn *k, hr_runtime *rt) {
    hr_srv_error e;
    json_t *root = parse_body(k, &e);
    if (!root) return send_error(s, c, &e);
    const hr_tokenizer *tok = hr_runtime_tokenizer(rt);
    int32_t *ids = NULL;
    size_t n = 0;
    enum MHD_Result ok;
    if (!hr_srv_parse_detokenize(root, hr_tokenizer_n_vocab(tok), &ids, &n, &e)) {
        ok = send_error(s, c, &e);
    } else {
        char *text = NULL;
        size_t len = 0;
        hr_error err;
        if (hr_tokenizer_decode(tok, ids, n, false, &text, &len, &err) != HR_OK)
            ok = fail(s, c, 500, NULL, "decode", err.msg);
        else
            ok = send_json(c, MHD_HTTP_OK, json_pack("{s:s%}", "content", text, len));
        free(text);
    }
    free(ids);
    drop_body(k, root);
    return ok;
}

/* ---- routing ----------------------------------------------------------------------------------- */

/* The framing headers (Content-Length, Transfer-Encoding), every occurrence: MHD keeps duplicates. */
typedef struct framing_headers {
    hr_srv_header *h;
    int n, cap;
    bool overflow;
} framing_headers;

static enum MHD_Result collect_framing(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    framing_headers *f = cls;
    if (!key || (strcasecmp(key, "Content-Length") != 0 && strcasecmp(key, "Transfer-Encoding") != 0)) return MHD_YES;
    if (f->n == f->cap) {
        f->overflow = true;
        return MHD_NO;
    }
    f->h[f->n++] = (hr_srv_header){.name = key, .value = value ? value : ""};
    return MHD_YES;
}

/* Whether the request carries one of the keys; *tenant receives its index in the list (0 without
 * keys). */
static bool authorized(hr_server *s, struct MHD_Connection *c, int *tenant) {
    *tenant = 0;
    if (!s->api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
    h += 7;
    while (*h == ' ') h++;
    *tenant = hr_server_keys_match(s->keys, s->n_keys, h);
    return *tenant >= 0;
}

static const struct {
    const char *path;
    bool post;
    route_id id;
} routes[] = {
    {"/health", false, R_HEALTH},
    {"/metrics", false, R_METRICS},
    {"/v1/models", false, R_MODELS},
    {"/v1/kv", false, R_KV},
    {"/v1/completions", true, R_COMPLETIONS},
    {"/v1/chat/completions", true, R_CHAT},
    {"/tokenize", true, R_TOKENIZE},
    {"/detokenize", true, R_DETOKENIZE},
    {"/", false, R_DASHBOARD},
    {"/dashboard", false, R_DASHBOARD},
};

/* Decides everything the headers can (invariant 4): route, method, key, framing, a declared length
 * past the limit. Returns MHD_YES with k->route set when the request may go on, else the queued
 * refusal's result (MHD answers and closes; the body is never read). The framing was checked by the
 * gate already; checking MHD's view of the headers again costs little. */
static enum MHD_Result admit(hr_server *s, struct MHD_Connection *c, conn *k, const char *url, const char *method,
                             const char *version) {
    hr_srv_error e;
    /* framing first: with an ambiguous length nothing after these headers can be trusted */
    hr_srv_header h[64];
    framing_headers fh = {.h = h, .cap = 64};
    MHD_get_connection_values(c, MHD_HEADER_KIND, collect_framing, &fh);
    char why[160];
    int bad =
        fh.overflow ? 400 : hr_srv_framing_check(h, fh.n, version && !strcmp(version, "HTTP/1.0"), why, sizeof why);
    if (fh.overflow) snprintf(why, sizeof why, "more than 64 Content-Length / Transfer-Encoding headers");
    if (bad) {
        hr_srv_fail(&e, bad, NULL, "bad_framing", "%s", why);
        e.refusal = HR_REFUSE_INVALID;
        return send_error(s, c, &e);
    }
    route_id id = R_NONE;
    bool post = false;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (!strcmp(url, routes[i].path)) {
            id = routes[i].id;
            post = routes[i].post;
        }
    if (id == R_NONE) {
        hr_srv_fail(&e, 404, NULL, "not_found", "no route %s %s", method, url);
        return send_error(s, c, &e);
    }
    bool is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (post ? strcmp(method, "POST") != 0 : !is_get) {
        hr_srv_fail(&e, 405, NULL, post ? "post" : "get", "%s takes %s, not %s", url, post ? "POST" : "GET", method);
        e.refusal = HR_REFUSE_NONE;
        return send_error(s, c, &e);
    }
    /* the dashboard page holds no data (it asks /v1/kv, with the key the user types) */
    if (id != R_HEALTH && id != R_METRICS && id != R_DASHBOARD && !authorized(s, c, &k->tenant)) {
        hr_srv_fail(&e, 401, NULL, "invalid_api_key", "missing or wrong API key (Authorization: Bearer KEY)");
        return send_error(s, c, &e);
    }
    /* a declared body over the limit is refused before it is read (framing made it 1*DIGIT) */
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtoull(cl, NULL, 10) > s->p.max_body_bytes) {
        k->too_large = true;
        hr_srv_fail(&e, 413, NULL, "request_too_large", "the body is larger than %zu bytes", s->p.max_body_bytes);
        return send_error(s, c, &e);
    }
    k->route = id;
    return MHD_YES;
}

/* The last access-handler call: the body is in, the request admitted. */
static enum MHD_Result dispatch(hr_server *s, struct MHD_Connection *c, conn *k) {
    route_id id = k->route;
    if (k->too_large) {
        hr_srv_error e;
        hr_srv_fail(&e, 413, NULL, "request_too_large", "the body is larger than %zu bytes", s->p.max_body_bytes);
        return send_error(s, c, &e);
    }
    if (id == R_HEALTH) return handle_health(s, c);
    if (id == R_METRICS) return handle_metrics(s, c);
    if (id == R_DASHBOARD)
        return send_text(c, MHD_HTTP_OK, "text/html; charset=utf-8", hr_srv_dashboard_html, hr_srv_dashboard_html_len);
    if (id == R_COMPLETIONS) return handle_generate(s, c, k, HR_SRV_COMPLETION);
    if (id == R_CHAT) return handle_generate(s, c, k, HR_SRV_CHAT);
    hr_runtime *rt = ready_runtime(s);
    if (!rt)
        return fail(s, c, 503, NULL, "unavailable",
                    atomic_load(&s->state) == ST_LOADING ? "the model is loading" : "the server is shutting down");
    if (id == R_MODELS) return handle_models(s, c, rt);
    if (id == R_KV) return handle_kv(s, c, rt);
    if (id == R_TOKENIZE) return handle_tokenize(s, c, k, rt);
    return handle_detokenize(s, c, k, rt);
}

static hr_srv_sock *sock_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    hr_server *s = cls;
    conn *k = *con_cls;
    if (!k) {
        k = calloc(1, sizeof *k);
        if (!k) return MHD_NO;
        k->s = s;
        k->mhd = c;
        k->route = R_NONE;
        k->sock = sock_of(c);
        *con_cls = k;
        hr_srv_guard_phase(s->guard, k->sock, HR_SOCK_BODY);
        return admit(s, c, k, url, method, version);
    }
    if (*upload_size > 0) {
        hr_srv_guard_body(s->guard, k->sock, *upload_size);
        if (!k->too_large && k->body.len + *upload_size > s->p.max_body_bytes) {
            k->too_large = true;
            hr_srv_buf_free(&k->body);
        }
        if (!k->too_large) hr_srv_buf_put(&k->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    hr_srv_guard_phase(s->guard, k->sock, HR_SOCK_BUSY);
    if (k->body.failed) return fail(s, c, 500, NULL, "nomem", "out of memory reading the body");
    return dispatch(s, c, k);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    hr_server *s = cls;
    conn *k = *con_cls;
    if (!k) return;
    if (k->job) job_finish(s, k->job, toe != MHD_REQUEST_TERMINATED_COMPLETED_OK, true);
    /* a kept-alive connection waits for its next request's headers from now */
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK) hr_srv_guard_phase(s->guard, k->sock, HR_SOCK_HEADERS);
    hr_srv_buf_free(&k->body);
    free(k->answer);
    free(k);
    *con_cls = NULL;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode what) {
    hr_server *s = cls;
    if (what == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        *socket_context = ci ? hr_srv_guard_open(s->guard, ci->connect_fd) : NULL;
    } else if (what == MHD_CONNECTION_NOTIFY_CLOSED) {
        hr_srv_guard_close(s->guard, *socket_context);
        *socket_context = NULL;
        hr_srv_gate_closed(s->gate);
    }
}

/* ---- lifecycle --------------------------------------------------------------------------------- */

/* Fills an IPv4 or IPv6 socket address for host:port. */
static bool make_addr(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len) {
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        *len = sizeof *a4;
        return true;
    }
    if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        *len = sizeof *a6;
        return true;
    }
    return false;
}

/* The listening socket (the gate accepts on it, not MHD): bound, listening, non-blocking; an error
 * says why (in use, not an address here). */
static hr_status open_listener(const struct sockaddr_storage *ss, socklen_t len, const char *host, int port,
                               int backlog, int *out, hr_error *err) {
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return hr_error_set(err, HR_ERR_IO, "cannot create a socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ss->ss_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd, (const struct sockaddr *)ss, len) != 0 || listen(fd, backlog) != 0) {
        int why = errno;
        close(fd);
        return hr_error_set(err, HR_ERR_IO, "cannot listen on %s:%d: %s%s", host, port, strerror(why),
                            why == EADDRINUSE ? " (another server? pick --port, or 0 for any free one)" : "");
    }
    *out = fd;
    return HR_OK;
}

static int bound_port(int fd) {
    struct sockaddr_storage a;
    socklen_t al = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &al) != 0) return 0;
    return ntohs(a.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&a)->sin6_port
                                         : ((struct sockaddr_in *)&a)->sin_port);
}

hr_status hr_server_create(hr_runtime *rt, const hr_server_params *p, hr_server **out, hr_error *err) {
    hr_server_params q = *p;
    if (!q.host || !*q.host) q.host = "127.0.0.1";
    if (q.port < 0 || q.port > 65535) return hr_error_set(err, HR_ERR_INVALID_ARG, "port %d is not 0..65535", q.port);
    if (q.max_body_bytes == 0) q.max_body_bytes = 4u << 20;
    if (q.drain_timeout_s < 0) q.drain_timeout_s = 0;
    if (q.max_connections <= 0) q.max_connections = 256;
    if (q.max_choices <= 0 || q.max_choices > HR_SRV_MAX_CHOICES) q.max_choices = HR_SRV_MAX_CHOICES;
    if (q.default_completion_tokens <= 0) q.default_completion_tokens = 16;
    if (q.max_header_bytes == 0) q.max_header_bytes = 32u << 10;
    if (q.max_header_bytes < (32u << 10)) q.max_header_bytes = 32u << 10; /* the SSE write buffer lives there too */
    if (q.max_tokens_limit < 0) q.max_tokens_limit = 0;
    if (q.max_parse_bytes == 0) q.max_parse_bytes = HR_SERVER_PARSE_BYTES;
    char **keys = NULL;
    int n_keys = 0;
    hr_status kst = hr_server_keys_parse(q.api_key, &keys, &n_keys, err);
    if (kst) return kst;
    hr_server_keys_free(keys, n_keys);
    if (!(q.header_timeout_s > 0)) q.header_timeout_s = 10;
    if (!(q.body_min_rate > 0)) q.body_min_rate = 0;
    if (q.max_conns_per_ip < 0) q.max_conns_per_ip = 0;
    if (q.listen_backlog <= 0) q.listen_backlog = 1024;
    struct sockaddr_storage ss;
    socklen_t slen;
    if (!make_addr(q.host, q.port, &ss, &slen))
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "host '%s' is not a numeric IPv4 or IPv6 address (e.g. 127.0.0.1, 0.0.0.0, ::1)", q.host);
    int lfd = -1;
    hr_status st = open_listener(&ss, slen, q.host, q.port, q.listen_backlog, &lfd, err);
    if (st) return st;
    hr_server *s = calloc(1, sizeof *s);
    if (!s) {
        close(lfd);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory for the server");
    }
    s->host = strdup(q.host);
    s->api_key = q.api_key && *q.api_key ? strdup(q.api_key) : NULL;
    bool keys_ok = hr_server_keys_parse(s->api_key, &s->keys, &s->n_keys, NULL) == HR_OK;
    s->parse_pool = hr_srv_parse_pool_create(q.max_parse_bytes, q.max_parse_bytes / 4);
    q.host = s->host;
    q.api_key = s->api_key;
    s->p = q;
    s->started = (long long)time(NULL);
    atomic_init(&s->rt, rt);
    atomic_init(&s->state, rt ? ST_READY : ST_LOADING);
    atomic_init(&s->abandon, false);
    atomic_init(&s->next_id, 1);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_mutex_init(&s->shutdown_mu, NULL);
    if (!s->host || (q.api_key && !s->api_key) || !keys_ok || !s->parse_pool ||
        hr_srv_metrics_create(&s->metrics, err) != HR_OK || hr_srv_activity_create(&s->activity, err) != HR_OK ||
        hr_srv_guard_create(q.header_timeout_s, q.body_min_rate, &s->guard, err) != HR_OK) {
        close(lfd);
        hr_server_destroy(s);
        return err && err->code ? err->code : hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    }
    /* MHD never sees the listening socket: the gate (gate.c) accepts, waits for a request's headers and
       hands the socket over. MHD's own limits sit above the gate's count (max_live), which is freed at
       the CLOSED notification a moment before MHD forgets the connection. The idle timeout (300 s)
       stays for a client that stops reading a response; the watchdog (guard.c) owns the header and
       body deadlines, which a byte every few seconds would keep an idle timeout from reaching. */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL | MHD_USE_ITC |
                     MHD_USE_NO_LISTEN_SOCKET;
    s->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)q.max_connections + 64, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                            (unsigned)q.max_conns_per_ip, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, q.max_header_bytes, MHD_OPTION_END);
    if (!s->d) {
        close(lfd);
        hr_server_destroy(s);
        return hr_error_set(err, HR_ERR_IO, "cannot start the HTTP server on %s:%d", q.host, q.port);
    }
    s->port = bound_port(lfd);
    /* pending connections cost a descriptor each, no thread: hold several times the served ones */
    hr_srv_gate_params gp = {.listen_fd = lfd,
                             .daemon = s->d,
                             .max_pending = 4 * q.max_connections,
                             .per_ip = q.max_conns_per_ip,
                             .max_live = q.max_connections,
                             .header_timeout_s = q.header_timeout_s,
                             .max_header_bytes = q.max_header_bytes};
    if ((st = hr_srv_gate_create(&gp, &s->gate, err)) != HR_OK) {
        close(lfd);
        hr_server_destroy(s);
        return st;
    }
    *out = s;
    return HR_OK;
}

void hr_server_set_runtime(hr_server *s, hr_runtime *rt) {
    pthread_mutex_lock(&s->mu);
    if (!atomic_load(&s->rt) && rt) {
        hr_rt_sampling builtin = hr_server_default_params().sampling; /* before READY: no request reads it */
        hr_runtime_generation_defaults(rt, &builtin, &s->p.sampling);
        atomic_store(&s->rt, rt);
        if (atomic_load(&s->state) == ST_LOADING) atomic_store(&s->state, ST_READY);
    }
    pthread_mutex_unlock(&s->mu);
}

int hr_server_port(const hr_server *s) { return s->port; }

void hr_server_get_stats(hr_server *s, hr_server_stats *st) {
    static const char *names[] = {"loading", "ready", "draining", "stopped"};
    hr_srv_guard_counts g = {0};
    hr_srv_gate_counts gc = {0};
    if (s->guard) hr_srv_guard_stats(s->guard, &g);
    if (s->gate) hr_srv_gate_stats(s->gate, &gc);
    *st = (hr_server_stats){.n_inflight = hr_server_n_inflight(s),
                            .n_connections = g.open + gc.pending,
                            .n_pending = gc.pending,
                            .n_accepted = g.accepted,
                            .n_cut_headers = g.cut_headers + gc.cut_headers,
                            .n_evicted = gc.evicted,
                            .n_refused_framing = gc.refused_framing,
                            .n_refused_per_ip = gc.refused_per_ip,
                            .n_cut_body = g.cut_body,
                            .state = names[atomic_load(&s->state) & 3]};
}

/* Waits (mutex held) until the registry is empty or deadline passes. */
static void wait_registry(hr_server *s, double deadline) {
    while (s->n_jobs > 0 && hr_time_now() < deadline) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
}

void hr_server_shutdown(hr_server *s) {
    pthread_mutex_lock(&s->shutdown_mu);
    if (s->shut_down) {
        pthread_mutex_unlock(&s->shutdown_mu);
        return;
    }
    s->shut_down = true;
    /* connections are still accepted while draining: /health says 503 "draining" to a load balancer
       instead of a refused connection, and new generation requests get 503 (invariant 3) */
    pthread_mutex_lock(&s->mu);
    atomic_store(&s->state, ST_DRAINING);
    wait_registry(s, hr_time_now() + s->p.drain_timeout_s);
    hr_runtime *rt = atomic_load(&s->rt);
    for (hr_srv_job *j = s->jobs; j; j = j->next)
        for (int i = 0; i < j->n; i++) hr_rt_request_cancel(rt, j->req[i]);
    /* cancelled streams send their last chunks and end; give them a moment, then stop waiting */
    wait_registry(s, hr_time_now() + 5);
    atomic_store(&s->abandon, true);
    pthread_mutex_unlock(&s->mu);
    hr_srv_gate_stop(s->gate); /* stops accepting: the listening socket closes */
    if (s->d) MHD_stop_daemon(s->d);
    s->d = NULL;
    atomic_store(&s->state, ST_STOPPED);
    pthread_mutex_unlock(&s->shutdown_mu);
}

void hr_server_destroy(hr_server *s) {
    if (!s) return;
    if (s->d) hr_server_shutdown(s);
    hr_srv_metrics_destroy(s->metrics);
    hr_srv_activity_destroy(s->activity);
    hr_srv_guard_destroy(s->guard);
    hr_srv_gate_destroy(s->gate);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->shutdown_mu);
    free(s->host);
    free(s->api_key);
    hr_server_keys_free(s->keys, s->n_keys);
    hr_srv_parse_pool_destroy(s->parse_pool);
    free(s);
}

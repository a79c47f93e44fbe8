/* stream.c: server-sent events for a streaming job. Runs on the connection's own thread (MHD thread
 * per connection), so it may block on the requests' channels; every wait is bounded so that a client
 * that went away is found out by the next write (MHD then ends the request and the server cancels the
 * job). Chunk order per choice: [role chunk (chat)], text chunks, one chunk with finish_reason; after
 * every choice: [usage chunk], then "data: [DONE]". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "server/server_internal.h"

#define STREAM_WAIT_S      0.25 /* one wait on a channel */
#define STREAM_KEEPALIVE_S 15.  /* silence before an SSE comment */

static void put_event(hr_srv_job *j, json_t *o) {
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!text) {
        j->pending.failed = true;
        return;
    }
    hr_srv_buf_put(&j->pending, "data: ", 6);
    hr_srv_buf_put(&j->pending, text, strlen(text));
    hr_srv_buf_put(&j->pending, "\n\n", 2);
    free(text);
}

/* Chat with tools: the text that can go out as content now (the rest may start a call and waits for
 * the end); at the end, the held text as content or as tool calls. Returns the finish reason to send. */
static size_t tools_release(hr_srv_job *j, int i, const char *text, size_t n, const char **out) {
    hr_srv_buf *b = &j->tool_text[i];
    hr_srv_buf_put(b, text, n);
    size_t safe = b->failed ? j->tool_sent[i] : hr_tools_stream_safe(j->tool_format, b->data, b->len);
    *out = b->data + j->tool_sent[i];
    size_t len = safe > j->tool_sent[i] ? safe - j->tool_sent[i] : 0;
    j->tool_sent[i] += len;
    return len;
}

static const char *tools_finish(hr_srv_job *j, int i, const char *finish) {
    hr_srv_buf *b = &j->tool_text[i];
    if (b->failed) {
        j->pending.failed = true;
        return finish;
    }
    hr_tool_call calls[HR_SRV_MAX_TOOL_CALLS];
    size_t content = b->len;
    int nc = b->len
                 ? hr_tools_extract(j->tool_format, &j->tools, b->data, b->len, &content, calls, HR_SRV_MAX_TOOL_CALLS)
                 : 0;
    if (content > j->tool_sent[i])
        put_event(j, hr_srv_chunk_json(j, i, b->data + j->tool_sent[i], content - j->tool_sent[i], NULL, false, NULL));
    j->tool_sent[i] = b->len;
    if (nc == 0) return finish;
    /* as OpenAI streams a call: its index, id and name with empty arguments, then the arguments */
    json_t *all = hr_srv_tool_calls_json(j, i, calls, j->tools.parallel ? nc : 1, true);
    for (size_t k = 0; k < json_array_size(all); k++) {
        json_t *head = json_deep_copy(json_array_get(all, k));
        json_t *fn = json_object_get(head, "function");
        json_t *args = json_incref(json_object_get(fn, "arguments"));
        json_object_set_new(fn, "arguments", json_string(""));
        json_t *tail = json_pack("{s:I, s:{s:o}}", "index", (json_int_t)k, "function", "arguments", args);
        json_t *parts[2] = {head, tail};
        for (int p = 0; p < 2; p++) {
            json_t *o = hr_srv_chunk_json(j, i, NULL, 0, NULL, false, NULL);
            json_t *delta = json_object_get(json_array_get(json_object_get(o, "choices"), 0), "delta");
            json_object_set_new(delta, "tool_calls", json_pack("[o]", parts[p]));
            put_event(j, o);
        }
    }
    json_decref(all);
    hr_tools_free_calls(calls, nc);
    return "tool_calls";
}

/* Drains what choice i has produced into SSE chunks. */
static void drain_choice(hr_srv_job *j, int i) {
    hr_rt_request *h = j->req[i];
    char text[8192];
    int32_t ids[256];
    for (int guard = 0; guard < 1024; guard++) { /* bounded: each round takes up to 8 KiB out */
        hr_rt_delta d;
        /* the ids are read too (unread ids would keep hr_rt_request_wait from blocking): with logprobs,
           a chunk carries those of the tokens read with it (text held back for a stop string or a
           split character comes in a later chunk) */
        hr_rt_request_read(h, ids, (int)(sizeof ids / sizeof ids[0]), text, sizeof text, &d);
        bool role = j->kind == HR_SRV_CHAT && !j->role_sent[i];
        bool lp = j->logprobs && d.n_tokens > 0;
        /* a chunk for every read that brought tokens, its text "" when they made none yet (a character
           split across tokens, text held back for a stop string, a token without text): the client
           sees each token when it is made, as vLLM sends them, so time to first token is the first
           token's time */
        if (role || d.n_text > 0 || d.n_tokens > 0) {
            json_t *lps = lp ? hr_srv_logprobs_json(j, i, j->lp_sent[i], ids, d.n_tokens, &j->lp_text_off[i]) : NULL;
            if (lp && !lps) j->pending.failed = true;
            j->lp_sent[i] += d.n_tokens;
            const char *t = d.n_text || d.n_tokens ? text : NULL; /* text is "" when nothing came */
            size_t n_t = d.n_text;
            if (hr_srv_job_tools(j)) n_t = tools_release(j, i, text, d.n_text, &t);
            put_event(j, hr_srv_chunk_json(j, i, t, n_t, NULL, role, lps));
            j->role_sent[i] = true;
        }
        if (d.done) {
            hr_rt_result r;
            hr_rt_request_result(j->req[i], &r);
            const char *finish = r.finish_reason ? r.finish_reason : "stop";
            if (hr_srv_job_tools(j)) finish = tools_finish(j, i, finish);
            put_event(j, hr_srv_chunk_json(j, i, NULL, 0, finish, false, NULL));
            j->finished[i] = true;
            return;
        }
        if (d.n_text == 0 && d.n_tokens == 0) return;
    }
}

static void finish_stream(hr_srv_job *j) {
    if (j->include_usage) {
        hr_rt_result res[HR_SRV_MAX_CHOICES];
        for (int i = 0; i < j->n; i++) hr_rt_request_result(j->req[i], &res[i]);
        put_event(j, hr_srv_usage_chunk_json(j, res));
    }
    hr_srv_buf_put(&j->pending, "data: [DONE]\n\n", 14);
    j->done_sent = true;
}

long hr_srv_stream_read(hr_srv_job *j, char *buf, size_t max, const atomic_bool *abandon) {
    if (j->t_last_out == 0) j->t_last_out = hr_time_now();
    for (;;) {
        if (j->pending_off < j->pending.len) {
            size_t n = j->pending.len - j->pending_off;
            if (n > max) n = max;
            memcpy(buf, j->pending.data + j->pending_off, n);
            j->pending_off += n;
            if (j->pending_off == j->pending.len) j->pending_off = j->pending.len = 0;
            j->t_last_out = hr_time_now();
            return (long)n;
        }
        if (j->pending.failed) return -1; /* out of memory: end the stream rather than send half an event */
        if (j->done_sent) return -1;
        /* the server gave up on the channels (the engine no longer answers): end without [DONE] */
        if (atomic_load(abandon)) return -1;
        int waiting = -1;
        for (int i = 0; i < j->n; i++)
            if (!j->finished[i]) {
                drain_choice(j, i);
                if (!j->finished[i] && waiting < 0) waiting = i;
            }
        if (waiting < 0) {
            finish_stream(j);
            continue;
        }
        if (j->pending.len > 0) continue;
        /* n > 1: waiting on one choice while another produces costs at most one STREAM_WAIT_S */
        hr_rt_request_wait(j->req[waiting], j->n > 1 ? STREAM_WAIT_S / 5 : STREAM_WAIT_S);
        if (hr_time_now() - j->t_last_out > STREAM_KEEPALIVE_S) hr_srv_buf_put(&j->pending, ": keepalive\n\n", 13);
    }
}

/* openai_response.c: OpenAI's response shapes: the whole answer, SSE chunks, usage (with the KV
 * accounting: `usage.kv`, and `n` > 1 counted once per shared block), logprobs in chat's and
 * completions' shapes, tool calls. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_internal.h"

/* ---- responses --------------------------------------------------------------------------------- */

static json_t *kv_json(const hr_rt_kv_usage *kv, bool live) {
    json_t *o = json_object();
    json_object_set_new(o, "k_format", json_string(hr_rt_kv_format_name(kv->k_format)));
    json_object_set_new(o, "v_format", json_string(hr_rt_kv_format_name(kv->v_format)));
    json_object_set_new(o, "block_size", json_integer(kv->block_size));
    json_object_set_new(o, "policy", json_string(kv->policy ? kv->policy : "full"));
    json_object_set_new(o, "blocks_peak", json_integer(kv->blocks_peak));
    json_object_set_new(o, "bytes_peak", json_integer((json_int_t)kv->bytes_peak));
    json_object_set_new(o, live ? "blocks_now" : "blocks_at_finish", json_integer(kv->blocks_now));
    json_object_set_new(o, live ? "bytes_now" : "bytes_at_finish", json_integer((json_int_t)kv->bytes_now));
    json_object_set_new(o, "prefix_hit_tokens", json_integer(kv->prefix_hit_tokens));
    json_object_set_new(o, "evicted_tokens", json_integer(kv->evicted_tokens));
    json_object_set_new(o, "preemptions", json_integer(kv->preemptions));
    json_object_set_new(o, "preempt_swaps", json_integer(kv->preempt_swaps));
    json_object_set_new(o, "preempt_recomputes", json_integer(kv->preempt_recomputes));
    json_object_set_new(o, "swapped_bytes", json_integer((json_int_t)kv->swapped_bytes));
    json_object_set_new(o, "queued_seconds", json_real(kv->queued_seconds));
    /* the server's own time to first token (the client's adds the network and its reading) */
    json_object_set_new(o, "first_token_seconds",
                        kv->first_token_seconds > 0 ? json_real(kv->first_token_seconds) : json_null());
    /* a hybrid pool (window layers beside full ones): what each layer kind holds */
    if (kv->n_kinds > 1 || (kv->n_kinds == 1 && kv->kinds[0].latent)) {
        json_object_set_new(o, "groups", hr_srv_kv_kinds_json(kv->kinds, kv->n_kinds));
        json_object_set_new(o, "window_blocks_freed", json_integer(kv->window_blocks_freed));
    }
    return o;
}

json_t *hr_srv_kv_kinds_json(const hr_rt_kv_kind *kinds, int n) {
    json_t *a = json_array();
    for (int k = 0; k < n; k++)
        json_array_append_new(a, json_pack("{s:s, s:i, s:i, s:i, s:I, s:I}", "kind",
                                           kinds[k].window > 0 ? "window"
                                           : kinds[k].latent   ? "latent"
                                                               : "full",
                                           "window", kinds[k].window, "layers", kinds[k].n_layers, "blocks",
                                           kinds[k].blocks, "bytes", (json_int_t)kinds[k].bytes, "token_bytes",
                                           (json_int_t)kinds[k].token_bytes));
    return a;
}

json_t *hr_srv_kv_usage_json(const hr_rt_kv_usage *kv) { return kv_json(kv, true); }

json_t *hr_srv_usage_json(const hr_rt_result *res, int n) {
    /* the n choices share one prompt: it counts once, as OpenAI counts it; its cached tokens are those
     * every choice took from the prefix cache */
    int completion = 0, cached = res[0].kv.prefix_hit_tokens;
    hr_rt_kv_usage kv = res[0].kv;
    for (int i = 0; i < n; i++) completion += res[i].n_ids;
    for (int i = 1; i < n; i++) cached = res[i].kv.prefix_hit_tokens < cached ? res[i].kv.prefix_hit_tokens : cached;
    for (int i = 1; i < n; i++) {
        const hr_rt_kv_usage *k = &res[i].kv;
        kv.blocks_now += k->blocks_now;
        kv.blocks_peak += k->blocks_peak;
        kv.bytes_now += k->bytes_now;
        kv.bytes_peak += k->bytes_peak;
        kv.prefix_hit_tokens += k->prefix_hit_tokens;
        kv.evicted_tokens += k->evicted_tokens;
        kv.preemptions += k->preemptions;
        kv.preempt_swaps += k->preempt_swaps;
        kv.preempt_recomputes += k->preempt_recomputes;
        kv.swapped_bytes += k->swapped_bytes;
        for (int g = 0; g < kv.n_kinds && g < k->n_kinds; g++) {
            kv.kinds[g].blocks += k->kinds[g].blocks;
            kv.kinds[g].bytes += k->kinds[g].bytes;
        }
        kv.window_blocks_freed += k->window_blocks_freed;
        if (k->queued_seconds > kv.queued_seconds) kv.queued_seconds = k->queued_seconds;
        if (k->first_token_seconds > kv.first_token_seconds) kv.first_token_seconds = k->first_token_seconds;
    }
    /* blocks the choices share (their prompt's) count once: the group's figures, not the sum */
    if (n > 1 && res[0].kv.grouped) {
        kv.blocks_peak = res[0].kv.group_blocks_peak;
        kv.blocks_now = res[0].kv.group_blocks_final;
        kv.bytes_peak = (uint64_t)kv.blocks_peak * kv.block_bytes;
        kv.bytes_now = (uint64_t)kv.blocks_now * kv.block_bytes;
    }
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(res[0].n_prompt));
    json_object_set_new(u, "completion_tokens", json_integer(completion));
    json_object_set_new(u, "total_tokens", json_integer(res[0].n_prompt + completion));
    json_object_set_new(u, "prompt_tokens_details", json_pack("{s:i}", "cached_tokens", cached));
    json_object_set_new(u, "kv", kv_json(&kv, false));
    return u;
}

static json_t *envelope(const hr_srv_job *j, const char *object) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(j->id));
    json_object_set_new(o, "object", json_string(object));
    json_object_set_new(o, "created", json_integer(j->created));
    json_object_set_new(o, "model", json_string(j->model));
    return o;
}

/* ---- logprobs ---------------------------------------------------------------------------------- */

/* The bytes token id stands for, as the detokenizer writes them (hr_tokenizer_token_bytes), into b
 * (reset first). */
static void token_bytes(const hr_tokenizer *t, int32_t id, hr_srv_buf *b) {
    b->len = 0;
    hr_srv_buf_put(b, "", 0);
    size_t n = 0;
    const char *s = t ? hr_tokenizer_token_bytes(t, id, &n) : NULL;
    if (s && n) hr_srv_buf_put(b, s, n);
}

/* The JSON string for a token's bytes: the text when it is valid UTF-8, else OpenAI's spelling for a
 * token that holds part of a character ("bytes:\\xe2\\x80"). */
static json_t *token_string(const char *s, size_t n) {
    if (hr_utf8_valid(s, n, NULL)) return json_stringn(s, n);
    hr_srv_buf b = {0};
    hr_srv_buf_put(&b, "bytes:", 6);
    for (size_t i = 0; i < n; i++) hr_srv_buf_printf(&b, "\\x%02x", (unsigned char)s[i]);
    json_t *o = b.failed ? NULL : json_stringn(b.data, b.len);
    hr_srv_buf_free(&b);
    return o;
}

static json_t *bytes_json(const char *s, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer((unsigned char)s[i]));
    return a;
}

/* A log-probability as JSON: -inf (a token the model rules out) as -9999, as OpenAI-compatible
 * servers write it (JSON has no infinity). */
static json_t *logprob_json(float lp) { return json_real(isfinite(lp) ? (double)lp : -9999.0); }

/* {"token", "logprob", "bytes"} for chat. */
static json_t *chat_entry(const hr_tokenizer *t, int32_t id, float lp, hr_srv_buf *b) {
    token_bytes(t, id, b);
    json_t *o = json_object();
    json_object_set_new(o, "token", token_string(b->data, b->len));
    json_object_set_new(o, "logprob", logprob_json(lp));
    json_object_set_new(o, "bytes", bytes_json(b->data, b->len));
    return o;
}

json_t *hr_srv_logprobs_json(const hr_srv_job *j, int i, int from, const int32_t *ids, int n, size_t *text_off) {
    int k = j->top_logprobs;
    float *lp = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    int32_t *top_id = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1) * (size_t)(k > 0 ? k : 1));
    float *top_lp = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1) * (size_t)(k > 0 ? k : 1));
    if (!lp || !top_id || !top_lp) {
        free(lp);
        free(top_id);
        free(top_lp);
        return NULL;
    }
    json_t *o = NULL;
    /* tokens are published after their logprobs: every id read has them */
    int got = n > 0 ? hr_rt_request_logprobs(j->req[i], from, n, lp, top_id, top_lp) : 0;
    hr_srv_buf b = {0};
    if (j->kind == HR_SRV_CHAT) {
        json_t *content = json_array();
        for (int t = 0; t < got; t++) {
            json_t *e = chat_entry(j->tok, ids[t], lp[t], &b);
            json_t *tops = json_array();
            for (int q = 0; q < k; q++)
                json_array_append_new(tops, chat_entry(j->tok, top_id[t * k + q], top_lp[t * k + q], &b));
            json_object_set_new(e, "top_logprobs", tops);
            json_array_append_new(content, e);
        }
        o = json_object();
        json_object_set_new(o, "content", content);
        json_object_set_new(o, "refusal", json_null());
    } else {
        json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
        for (int t = 0; t < got; t++) {
            token_bytes(j->tok, ids[t], &b);
            json_array_append_new(tokens, token_string(b.data, b.len));
            json_array_append_new(lps, logprob_json(lp[t]));
            json_array_append_new(offs, json_integer((json_int_t)*text_off));
            for (size_t c = 0; c < b.len; c++) *text_off += ((unsigned char)b.data[c] & 0xC0) != 0x80;
            json_t *alts = json_object();
            for (int q = 0; q < k; q++) {
                token_bytes(j->tok, top_id[t * k + q], &b);
                json_t *key = token_string(b.data, b.len);
                /* two tokens with one text keep the likelier (listed first) */
                if (key && !json_object_get(alts, json_string_value(key)))
                    json_object_set_new(alts, json_string_value(key), logprob_json(top_lp[t * k + q]));
                json_decref(key);
            }
            json_array_append_new(tops, alts);
        }
        o = json_object();
        json_object_set_new(o, "tokens", tokens);
        json_object_set_new(o, "token_logprobs", lps);
        json_object_set_new(o, "top_logprobs", tops);
        json_object_set_new(o, "text_offset", offs);
    }
    if (b.failed) {
        json_decref(o);
        o = NULL;
    }
    hr_srv_buf_free(&b);
    free(lp);
    free(top_id);
    free(top_lp);
    return o;
}

json_t *hr_srv_response_json(const hr_srv_job *j, const hr_rt_result *res) {
    bool chat = j->kind == HR_SRV_CHAT;
    json_t *o = envelope(j, chat ? "chat.completion" : "text_completion");
    json_t *choices = json_array();
    for (int i = 0; i < j->n; i++) {
        json_t *c = json_object();
        json_object_set_new(c, "index", json_integer(i));
        json_t *text = json_stringn(res[i].text ? res[i].text : "", res[i].text ? res[i].text_len : 0);
        const char *finish = res[i].finish_reason ? res[i].finish_reason : "stop";
        if (chat) {
            json_t *m = json_object();
            json_object_set_new(m, "role", json_string("assistant"));
            hr_tool_call calls[HR_SRV_MAX_TOOL_CALLS];
            size_t content = 0;
            int nc = hr_srv_job_tools(j) && res[i].text
                         ? hr_tools_extract(j->tool_format, &j->tools, res[i].text, res[i].text_len, &content, calls,
                                            HR_SRV_MAX_TOOL_CALLS)
                         : 0;
            if (nc > 0) {
                json_decref(text);
                json_object_set_new(m, "content", content ? json_stringn(res[i].text, content) : json_null());
                json_object_set_new(m, "tool_calls",
                                    hr_srv_tool_calls_json(j, i, calls, j->tools.parallel ? nc : 1, false));
                hr_tools_free_calls(calls, nc);
                finish = "tool_calls";
            } else {
                json_object_set_new(m, "content", text);
            }
            json_object_set_new(c, "message", m);
        } else {
            json_object_set_new(c, "text", text);
        }
        size_t text_off = 0;
        json_t *lp = j->logprobs ? hr_srv_logprobs_json(j, i, 0, res[i].ids, res[i].n_ids, &text_off) : NULL;
        json_object_set_new(c, "logprobs", lp ? lp : json_null());
        json_object_set_new(c, "finish_reason", json_string(finish));
        json_array_append_new(choices, c);
    }
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", hr_srv_usage_json(res, j->n));
    return o;
}

json_t *hr_srv_chunk_json(const hr_srv_job *j, int i, const char *text, size_t len, const char *finish, bool role,
                          json_t *logprobs) {
    bool chat = j->kind == HR_SRV_CHAT;
    json_t *o = envelope(j, chat ? "chat.completion.chunk" : "text_completion");
    json_t *c = json_object();
    json_object_set_new(c, "index", json_integer(i));
    if (chat) {
        json_t *d = json_object();
        if (role) json_object_set_new(d, "role", json_string("assistant"));
        if (text || role) json_object_set_new(d, "content", json_stringn(text ? text : "", text ? len : 0));
        json_object_set_new(c, "delta", d);
    } else {
        json_object_set_new(c, "text", json_stringn(text ? text : "", text ? len : 0));
    }
    if (logprobs && j->kind == HR_SRV_CHAT) json_object_del(logprobs, "refusal"); /* chunks carry content only */
    json_object_set_new(c, "logprobs", logprobs ? logprobs : json_null());
    json_object_set_new(c, "finish_reason", finish ? json_string(finish) : json_null());
    json_t *choices = json_array();
    json_array_append_new(choices, c);
    json_object_set_new(o, "choices", choices);
    if (j->include_usage) json_object_set_new(o, "usage", json_null());
    return o;
}

json_t *hr_srv_tool_calls_json(const hr_srv_job *j, int choice, const hr_tool_call *calls, int n, bool with_index) {
    json_t *a = json_array();
    for (int k = 0; k < n; k++) {
        char id[32];
        hr_tools_call_id(j->tool_seed + (unsigned long long)choice * 1000003ull, k, id);
        json_t *o = json_object();
        if (with_index) json_object_set_new(o, "index", json_integer(k));
        json_object_set_new(o, "id", json_string(id));
        json_object_set_new(o, "type", json_string("function"));
        json_object_set_new(o, "function",
                            json_pack("{s:s, s:s}", "name", calls[k].name, "arguments", calls[k].arguments));
        json_array_append_new(a, o);
    }
    return a;
}

json_t *hr_srv_usage_chunk_json(const hr_srv_job *j, const hr_rt_result *res) {
    json_t *o = envelope(j, j->kind == HR_SRV_CHAT ? "chat.completion.chunk" : "text_completion");
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", hr_srv_usage_json(res, j->n));
    return o;
}

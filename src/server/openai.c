/* openai.c: OpenAI's request shapes and errors. Parsing checks every field it knows (type and range,
 * naming the field in the 400), refuses the ones the server does not do and ignores the others, as
 * OpenAI-compatible servers do. The responses are openai_response.c's. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "server/openai_format.h"
#include "server/server_internal.h"

/* ---- errors ------------------------------------------------------------------------------------ */

bool hr_srv_fail(hr_srv_error *e, int http, const char *param, const char *code, const char *fmt, ...) {
    e->http = http;
    e->param = param;
    e->code = code;
    e->type = http == 401   ? "authentication_error"
              : http == 404 ? "not_found_error"
              : http == 429 ? "rate_limit_error"
              : http == 503 ? "service_unavailable"
              : http >= 500 ? "server_error"
                            : "invalid_request_error";
    e->refusal = http == 401   ? HR_REFUSE_AUTH
                 : http == 413 ? HR_REFUSE_TOO_LARGE
                 : http == 429 ? HR_REFUSE_QUEUE
                 : http == 503 ? HR_REFUSE_DRAINING
                 : http == 400 ? HR_REFUSE_INVALID
                               : HR_REFUSE_NONE;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    hr_error_oneline(e->msg); /* jansson's error text may quote a newline from the body */
    return false;
}

/* Request fields that messages quote by name ('max_tokens' must be ...): not client text. */
static bool is_field_name(const char *s, size_t n) {
    static const char *const names[] = {"model",
                                        "user",
                                        "prompt",
                                        "messages",
                                        "content",
                                        "role",
                                        "stop",
                                        "n",
                                        "stream",
                                        "stream_options",
                                        "max_tokens",
                                        "temperature",
                                        "top_p",
                                        "top_k",
                                        "min_p",
                                        "seed",
                                        "logprobs",
                                        "top_logprobs",
                                        "presence_penalty",
                                        "frequency_penalty",
                                        "kv_policy",
                                        "priority",
                                        "ignore_eos",
                                        "repetition_penalty",
                                        "max_completion_tokens",
                                        "tokens",
                                        "add_special",
                                        "with_pieces",
                                        "cache_salt",
                                        "include_usage",
                                        "logit_bias",
                                        "tools",
                                        "tool_choice",
                                        "parallel_tool_calls",
                                        "echo",
                                        "suffix",
                                        "best_of",
                                        "functions",
                                        "function_call",
                                        "response_format",
                                        "modalities",
                                        "audio",
                                        "prediction"};
    size_t base = 0; /* 'messages[3].content': the name before any index or member */
    while (base < n && s[base] != '[' && s[base] != '.') base++;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i]) == base && !memcmp(names[i], s, base)) return true;
    return false;
}

static void put_n(char *out, size_t cap, size_t *o, const char *s, size_t n) {
    for (size_t k = 0; k < n && *o + 1 < cap; k++) out[(*o)++] = s[k];
}

void hr_srv_redact(const char *msg, char *out, size_t cap) {
    size_t o = 0;
    if (cap == 0) return;
    for (size_t i = 0; msg[i];) {
        char q = msg[i];
        if (q == '\'' || q == '"') {
            const char *end = strchr(msg + i + 1, q);
            size_t n = end ? (size_t)(end - msg) - i - 1 : strlen(msg + i + 1);
            /* a field name, or one character of JSON syntax the parser expected ('}'): not client text */
            bool syntax = n == 1 && strchr("{}[],:", msg[i + 1]) != NULL;
            if (end && (syntax || is_field_name(msg + i + 1, n))) {
                put_n(out, cap, &o, msg + i, n + 2);
            } else {
                put_n(out, cap, &o, &q, 1);
                put_n(out, cap, &o, "...", 3);
                put_n(out, cap, &o, &q, 1);
            }
            i += n + 1 + (end ? 1 : 0);
            continue;
        }
        if (!strncmp(msg + i, "got ", 4) && (msg[i + 4] == '-' || (msg[i + 4] >= '0' && msg[i + 4] <= '9'))) {
            put_n(out, cap, &o, "got ...", 7);
            i += 5;
            while (msg[i] && msg[i] != ' ' && msg[i] != ',' && msg[i] != ';' && msg[i] != ')') i++;
            continue;
        }
        put_n(out, cap, &o, msg + i, 1);
        i++;
    }
    while (o > 0 && !hr_utf8_valid(out, o, NULL)) o--; /* a cut never splits a character */
    out[o] = '\0';
}

/* The request field that sets each parameter (see common/status.h): the server names its own field
 * from the code of a runtime refusal, never from the message's text. NULL: not a request field (a
 * server setting such as the KV budget). The prompt and the output format have per-request spellings
 * ("prompt" / "messages", "response_format" / "guided_json" / ...): hr_srv_fail_status picks those. */
static const char *const k_param_fields[HR_PARAM_COUNT] = {
    [HR_PARAM_MAX_TOKENS] = "max_tokens",
    [HR_PARAM_PROMPT] = "prompt",
    [HR_PARAM_KV_POLICY] = "kv_policy",
    [HR_PARAM_TEMPERATURE] = "temperature",
    [HR_PARAM_TOP_P] = "top_p",
    [HR_PARAM_TOP_K] = "top_k",
    [HR_PARAM_MIN_P] = "min_p",
    [HR_PARAM_REPEAT_PENALTY] = "repetition_penalty",
    [HR_PARAM_PRESENCE_PENALTY] = "presence_penalty",
    [HR_PARAM_FREQUENCY_PENALTY] = "frequency_penalty",
    [HR_PARAM_LOGIT_BIAS] = "logit_bias",
    [HR_PARAM_STOP] = "stop",
    [HR_PARAM_CHOICES] = "n",
    [HR_PARAM_TOP_LOGPROBS] = "top_logprobs",
    [HR_PARAM_OUTPUT_FORMAT] = "response_format",
};

const char *hr_srv_param_field(hr_param param) {
    return (unsigned)param < HR_PARAM_COUNT ? k_param_fields[param] : NULL;
}

/* The field of param in this request: its own spelling of the prompt and the output format. */
static const char *request_field(hr_param param, const char *prompt_field, const char *format_field) {
    if (param == HR_PARAM_PROMPT && prompt_field) return prompt_field;
    if (param == HR_PARAM_OUTPUT_FORMAT && format_field) return format_field;
    return hr_srv_param_field(param);
}

void hr_srv_fail_status(hr_srv_error *e, hr_runtime *rt, hr_status st, const hr_error *err, const char *prompt_field,
                        const char *format_field) {
    /* the message, then the request fields it is about where their names differ from the domain's
       words the message uses: "... lower max tokens (max tokens: 'max_tokens')" */
    char msg[HR_ERROR_MSG_MAX + 128];
    int n = snprintf(msg, sizeof msg, "%s", err->msg);
    const char *field = request_field(err->param, prompt_field, format_field);
    const hr_param about[2] = {err->param, err->also};
    int named = 0;
    for (int i = 0; i < 2; i++) {
        const char *f = request_field(about[i], prompt_field, format_field);
        if (!f || !strcmp(f, hr_param_name(about[i])) || (i == 1 && about[1] == about[0]) || n < 0 ||
            (size_t)n >= sizeof msg)
            continue;
        n += snprintf(msg + n, sizeof msg - (size_t)n, "%s%s: '%s'", named++ ? "; " : " (", hr_param_name(about[i]), f);
    }
    if (named && n >= 0 && (size_t)n < sizeof msg) snprintf(msg + n, sizeof msg - (size_t)n, ")");
    switch (st) {
    case HR_ERR_INVALID_ARG: hr_srv_fail(e, 400, field, "invalid_value", "%s", msg); break;
    /* a value this server cannot serve (a KV policy on the GPU): the client's to change */
    case HR_ERR_UNSUPPORTED: hr_srv_fail(e, 400, field, "unsupported_value", "%s", msg); break;
    case HR_ERR_RANGE:
        hr_srv_fail(e, 400, field ? field : prompt_field, "context_length_exceeded", "%s", msg);
        e->refusal = HR_REFUSE_CONTEXT;
        break;
    case HR_ERR_BUDGET:
        hr_srv_fail(e, 400, field ? field : prompt_field, "kv_budget_exceeded", "%s", msg);
        e->refusal = HR_REFUSE_BUDGET;
        break;
    case HR_ERR_FULL:
        hr_srv_fail(e, 429, NULL, "queue_full", "%s", msg);
        e->retry_after_s = rt ? hr_runtime_retry_after_s(rt) : 1;
        break;
    case HR_ERR_NOMEM: /* the request's buffers (they grow with max_tokens and top_logprobs): retry or ask less */
        hr_srv_fail(e, 503, field, "out_of_memory",
                    "%s: the server cannot hold this request's buffers now; lower max_tokens (or top_logprobs), "
                    "shorten the prompt, or retry",
                    msg);
        e->refusal = HR_REFUSE_BUDGET;
        break;
    default: hr_srv_fail(e, 500, NULL, hr_status_name(st), "%s", msg); break;
    }
}

char *hr_srv_error_body(const hr_srv_error *e) {
    json_t *err = json_object();
    json_object_set_new(err, "message", json_string(e->msg));
    json_object_set_new(err, "type", json_string(e->type ? e->type : "server_error"));
    json_object_set_new(err, "param", e->param ? json_string(e->param) : json_null());
    json_object_set_new(err, "code", e->code ? json_string(e->code) : json_null());
    json_t *root = json_object();
    json_object_set_new(root, "error", err);
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return text;
}

/* ---- field readers: absent or null leaves *out alone; a wrong type or range fails naming it ------ */

static const char *type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

static json_t *field(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return v && !json_is_null(v) ? v : NULL;
}

static bool read_number(json_t *o, const char *k, double lo, double hi, float *out, hr_srv_error *e) {
    json_t *v = field(o, k);
    if (!v) return true;
    if (!json_is_number(v))
        return hr_srv_fail(e, 400, k, "invalid_type", "'%s' must be a number, got %s", k, type_name(v));
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return hr_srv_fail(e, 400, k, "invalid_value", "'%s' must be between %g and %g, got %g", k, lo, hi, x);
    *out = (float)x;
    return true;
}

static bool read_int(json_t *o, const char *k, long long lo, long long hi, long long *out, hr_srv_error *e) {
    json_t *v = field(o, k);
    if (!v) return true;
    long long x;
    if (json_is_integer(v)) x = (long long)json_integer_value(v);
    /* 3.0 is an integer to JavaScript clients */
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 9e15)
        x = (long long)json_real_value(v);
    else
        return hr_srv_fail(e, 400, k, "invalid_type", "'%s' must be an integer, got %s", k, type_name(v));
    if (x < lo || x > hi)
        return hr_srv_fail(e, 400, k, "invalid_value", "'%s' must be between %lld and %lld, got %lld", k, lo, hi, x);
    *out = x;
    return true;
}

static bool read_bool(json_t *o, const char *k, bool *out, hr_srv_error *e) {
    json_t *v = field(o, k);
    if (!v) return true;
    if (!json_is_boolean(v))
        return hr_srv_fail(e, 400, k, "invalid_type", "'%s' must be a boolean, got %s", k, type_name(v));
    *out = json_is_true(v);
    return true;
}

static bool read_string(json_t *o, const char *k, const char **out, hr_srv_error *e) {
    json_t *v = field(o, k);
    if (!v) return true;
    if (!json_is_string(v))
        return hr_srv_fail(e, 400, k, "invalid_type", "'%s' must be a string, got %s", k, type_name(v));
    *out = json_string_value(v);
    return true;
}

/* ---- cache scope ------------------------------------------------------------------------------- */

static uint64_t fnv1a(const char *s, size_t n) {
    uint64_t f = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) f = (f ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return f;
}

uint64_t hr_srv_cache_scope(const char *tenant_key, const char *salt, size_t salt_len) {
    if (!tenant_key && !salt) return 0;
    /* the tenant by its key's text, not its place in the list: reordering --api-key keeps every
     * tenant's cache, and replicas that share the Redis tier agree on scopes whatever their order */
    uint64_t h = hr_mix64(0x74656e616e74ull ^ (tenant_key ? hr_mix64(fnv1a(tenant_key, strlen(tenant_key))) : 0));
    if (salt) /* "" is a salt too, apart from none */
        h = hr_mix64(h ^ hr_mix64(fnv1a(salt, salt_len) ^ 0x73616c74ull));
    return h ? h : 1; /* 0 is the shared scope */
}

/* ---- prompt and messages ----------------------------------------------------------------------- */

static bool keep_owned(hr_srv_gen *g, char *s) {
    char **o = realloc(g->owned, sizeof *o * (size_t)(g->n_owned + 1));
    if (!o) {
        free(s);
        return false;
    }
    g->owned = o;
    g->owned[g->n_owned++] = s;
    return true;
}

static bool parse_prompt(json_t *root, hr_srv_gen *g, hr_srv_error *e) {
    json_t *p = field(root, "prompt");
    if (!p) return hr_srv_fail(e, 400, "prompt", "missing_required_parameter", "'prompt' is required");
    if (json_is_array(p)) {
        size_t n = json_array_size(p);
        if (n == 0) return hr_srv_fail(e, 400, "prompt", "invalid_value", "'prompt' is empty");
        json_t *first = json_array_get(p, 0);
        if (json_is_string(first)) {
            /* a batch of prompts is several requests: one at a time here */
            if (n != 1)
                return hr_srv_fail(e, 400, "prompt", "invalid_value",
                                   "'prompt' as an array of strings must hold exactly one, got %zu", n);
            p = first;
        } else {
            /* token ids */
            g->prompt_ids = malloc(sizeof(int32_t) * n);
            if (!g->prompt_ids)
                return hr_srv_fail(e, 503, NULL, "out_of_memory", "out of memory parsing the request; retry");
            for (size_t i = 0; i < n; i++) {
                json_t *t = json_array_get(p, i);
                if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX)
                    return hr_srv_fail(e, 400, "prompt", "invalid_type",
                                       "'prompt' must be a string, an array of one string or an array of token ids; "
                                       "element %zu is %s",
                                       i, type_name(t));
                g->prompt_ids[i] = (int32_t)json_integer_value(t);
            }
            g->rp.prompt_ids = g->prompt_ids;
            g->rp.n_prompt_ids = (int)n;
            return true;
        }
    }
    if (!json_is_string(p))
        return hr_srv_fail(e, 400, "prompt", "invalid_type", "'prompt' must be a string, got %s", type_name(p));
    if (json_string_length(p) == 0) return hr_srv_fail(e, 400, "prompt", "invalid_value", "'prompt' is empty");
    g->rp.prompt = json_string_value(p);
    g->rp.prompt_len = json_string_length(p);
    return true;
}

/* content: a string, or an array of {"type":"text","text":...} parts (joined). Other parts (images,
 * audio, files) are refused: this server's models take text only. */
static bool message_content(hr_srv_gen *g, json_t *c, size_t i, const char **out, hr_srv_error *e) {
    if (!c) {
        *out = "";
        return true;
    }
    if (json_is_string(c)) {
        *out = json_string_value(c);
        return true;
    }
    if (!json_is_array(c))
        return hr_srv_fail(e, 400, "messages", "invalid_type", "'messages[%zu].content' must be a string, got %s", i,
                           type_name(c));
    hr_srv_buf b = {0};
    hr_srv_buf_put(&b, "", 0);
    for (size_t k = 0; k < json_array_size(c); k++) {
        json_t *part = json_array_get(c, k);
        json_t *type = json_is_object(part) ? json_object_get(part, "type") : NULL;
        if (json_is_string(type) && strcmp(json_string_value(type), "text") != 0) {
            hr_srv_buf_free(&b);
            hr_srv_fail(e, 400, "messages", "unsupported_content",
                        "'messages[%zu].content[%zu]' is a \"%.32s\" part: this model takes text only", i, k,
                        json_string_value(type));
            return false;
        }
        json_t *text = json_is_object(part) ? json_object_get(part, "text") : NULL;
        if (!json_is_string(text)) {
            hr_srv_buf_free(&b);
            return hr_srv_fail(e, 400, "messages", "invalid_type",
                               "'messages[%zu].content[%zu]' must be a {\"type\":\"text\",\"text\":...} part", i, k);
        }
        hr_srv_buf_put(&b, json_string_value(text), json_string_length(text));
    }
    if (b.failed || !keep_owned(g, b.data)) {
        if (b.failed) hr_srv_buf_free(&b);
        return hr_srv_fail(e, 503, NULL, "out_of_memory", "out of memory parsing the request; retry");
    }
    *out = b.data;
    return true;
}

static bool parse_messages(json_t *root, hr_srv_gen *g, hr_srv_error *e) {
    json_t *m = field(root, "messages");
    if (!m) return hr_srv_fail(e, 400, "messages", "missing_required_parameter", "'messages' is required");
    if (!json_is_array(m))
        return hr_srv_fail(e, 400, "messages", "invalid_type", "'messages' must be an array, got %s", type_name(m));
    size_t n = json_array_size(m);
    if (n == 0) return hr_srv_fail(e, 400, "messages", "invalid_value", "'messages' is empty");
    g->messages = calloc(n, sizeof *g->messages);
    if (!g->messages) return hr_srv_fail(e, 503, NULL, "out_of_memory", "out of memory parsing the request; retry");
    for (size_t i = 0; i < n; i++) {
        json_t *msg = json_array_get(m, i);
        if (!json_is_object(msg))
            return hr_srv_fail(e, 400, "messages", "invalid_type", "'messages[%zu]' must be an object, got %s", i,
                               type_name(msg));
        json_t *role = json_object_get(msg, "role");
        if (!json_is_string(role))
            return hr_srv_fail(e, 400, "messages", "invalid_type", "'messages[%zu].role' must be a string", i);
        const char *r = json_string_value(role);
        static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
        bool known = false;
        for (size_t k = 0; k < sizeof roles / sizeof roles[0]; k++) known = known || !strcmp(r, roles[k]);
        if (!known)
            return hr_srv_fail(e, 400, "messages", "invalid_value",
                               "'messages[%zu].role' must be system, developer, user, assistant or tool", i);
        /* OpenAI's newer name for the system role */
        g->messages[i].role = !strcmp(r, "developer") ? "system" : r;
        if (!message_content(g, field(msg, "content"), i, &g->messages[i].content, e)) return false;
    }
    g->rp.messages = g->messages;
    g->rp.n_messages = n;
    return true;
}

static bool parse_stop(json_t *root, hr_srv_gen *g, hr_srv_error *e) {
    json_t *s = field(root, "stop");
    if (!s) return true;
    if (json_is_string(s)) {
        g->stop[0] = json_string_value(s);
        g->rp.n_stop = json_string_length(s) > 0 ? 1 : 0;
    } else if (json_is_array(s)) {
        size_t n = json_array_size(s);
        if (n > HR_SRV_MAX_STOP)
            return hr_srv_fail(e, 400, "stop", "invalid_value", "'stop' holds at most %d strings, got %zu",
                               HR_SRV_MAX_STOP, n);
        int k = 0;
        for (size_t i = 0; i < n; i++) {
            json_t *v = json_array_get(s, i);
            if (!json_is_string(v))
                return hr_srv_fail(e, 400, "stop", "invalid_type", "'stop[%zu]' must be a string, got %s", i,
                                   type_name(v));
            if (json_string_length(v) > 0) g->stop[k++] = json_string_value(v);
        }
        g->rp.n_stop = k;
    } else {
        return hr_srv_fail(e, 400, "stop", "invalid_type", "'stop' must be a string or an array of strings, got %s",
                           type_name(s));
    }
    g->rp.stop = g->stop;
    return true;
}

/* "logit_bias": {"TOKEN_ID": BIAS, ...}, ids as decimal strings, biases -100..100 (OpenAI's shape); the
 * ids are checked against the vocabulary when the request is submitted. */
static bool parse_logit_bias(json_t *root, hr_srv_gen *g, hr_srv_error *e) {
    json_t *b = field(root, "logit_bias");
    if (!b) return true;
    if (!json_is_object(b))
        return hr_srv_fail(e, 400, "logit_bias", "invalid_type", "'logit_bias' must be an object, got %s",
                           type_name(b));
    size_t n = json_object_size(b);
    if (n == 0) return true;
    if (n > HR_RT_MAX_BIAS)
        return hr_srv_fail(e, 400, "logit_bias", "invalid_value", "'logit_bias' holds at most %d tokens, got %zu",
                           HR_RT_MAX_BIAS, n);
    g->bias_ids = malloc(sizeof(int32_t) * n);
    g->bias_values = malloc(sizeof(float) * n);
    if (!g->bias_ids || !g->bias_values) return hr_srv_fail(e, 500, NULL, NULL, "out of memory");
    const char *key;
    json_t *v;
    int k = 0;
    json_object_foreach(b, key, v) {
        char *end = NULL;
        long id = strtol(key, &end, 10);
        if (!*key || *end || id < 0 || id > INT32_MAX || (key[0] == '0' && key[1]))
            return hr_srv_fail(e, 400, "logit_bias", "invalid_value",
                               "'logit_bias' keys must be token ids (decimal strings such as \"50256\")");
        if (!json_is_number(v) || !(json_number_value(v) >= -100 && json_number_value(v) <= 100))
            return hr_srv_fail(e, 400, "logit_bias", "invalid_value",
                               "'logit_bias' values must be numbers from -100 to 100 (token %ld)", id);
        g->bias_ids[k] = (int32_t)id;
        g->bias_values[k++] = (float)json_number_value(v);
    }
    g->rp.sampling.bias_ids = g->bias_ids;
    g->rp.sampling.bias_values = g->bias_values;
    g->rp.sampling.n_bias = k;
    return true;
}

/* Chat: "logprobs" (bool) and "top_logprobs" (0..20, only with logprobs true). Completions: "logprobs"
 * (0..5 alternatives, null: none). */
static bool parse_logprobs(json_t *root, hr_srv_gen *g, hr_srv_error *e) {
    long long top = -1;
    if (g->kind == HR_SRV_CHAT) {
        if (!read_bool(root, "logprobs", &g->rp.logprobs, e) ||
            !read_int(root, "top_logprobs", 0, HR_SRV_MAX_TOP, &top, e))
            return false;
        if (top >= 0 && !g->rp.logprobs)
            return hr_srv_fail(e, 400, "top_logprobs", "invalid_value",
                               "'top_logprobs' requires 'logprobs' to be true");
    } else {
        if (!read_int(root, "logprobs", 0, 5, &top, e)) return false;
        g->rp.logprobs = top >= 0;
    }
    g->rp.top_logprobs = top > 0 ? (int)top : 0;
    return true;
}

/* OpenAI fields this server knows but does not do: a request that asks for them is refused, naming
 * the field, rather than answered as if it had not asked (fields it does not know are ignored, as
 * OpenAI-compatible servers do). A field at its "off" value (echo false, an empty suffix, best_of equal
 * to n, modalities ["text"]) asks for nothing. */
static bool refuse_unsupported(hr_srv_kind kind, json_t *root, long long n, hr_srv_error *e) {
    static const struct {
        const char *name;
        const char *what;
    } fields[] = {
        {"echo", "echoing the prompt"},
        {"suffix", "a suffix (insertion)"},
        {"best_of", "best_of other than n"},
        {"tools", "tool calling on /v1/completions (use /v1/chat/completions)"},
        {"tool_choice", "tool calling on /v1/completions (use /v1/chat/completions)"},
        {"parallel_tool_calls", "tool calling on /v1/completions (use /v1/chat/completions)"},
        {"functions", "function calling"},
        {"function_call", "function calling"},
        {"audio", "audio output"},
        {"modalities", "output modalities other than text"},
        {"prediction", "predicted outputs"},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        const char *k = fields[i].name;
        json_t *v = field(root, k);
        if (!v) continue;
        bool off = (json_is_false(v)) || (json_is_string(v) && json_string_length(v) == 0) ||
                   (json_is_array(v) && json_array_size(v) == 0) || (json_is_object(v) && json_object_size(v) == 0);
        if (!strcmp(k, "best_of")) off = json_is_integer(v) && json_integer_value(v) == n;
        if (!strcmp(k, "tool_choice") || !strcmp(k, "function_call"))
            off = json_is_string(v) && !strcmp(json_string_value(v), "none");
        if (!strcmp(k, "modalities"))
            off = json_is_array(v) && json_array_size(v) == 1 && json_is_string(json_array_get(v, 0)) &&
                  !strcmp(json_string_value(json_array_get(v, 0)), "text");
        if (!strcmp(k, "echo") && kind == HR_SRV_CHAT) continue; /* not a chat field */
        if (!strncmp(k, "tool", 4) || !strcmp(k, "parallel_tool_calls")) {
            if (kind == HR_SRV_CHAT) continue; /* chat reads them (hr_tools_read) */
            if (!strcmp(k, "parallel_tool_calls")) off = true;
        }
        if (!off)
            return hr_srv_fail(e, 400, k, "unsupported_parameter", "'%s': %s is not supported by this server", k,
                               fields[i].what);
    }
    return true;
}

bool hr_srv_parse_gen(hr_srv_kind kind, json_t *root, const hr_server_params *sp, uint64_t auto_seed, hr_srv_gen *g,
                      hr_srv_error *e) {
    memset(g, 0, sizeof *g);
    g->kind = kind;
    g->n = 1;
    g->rp.sampling = sp->sampling;
    g->rp.sampling.seed = auto_seed;
    g->rp.max_tokens = kind == HR_SRV_COMPLETION ? sp->default_completion_tokens : 0;
    if (!json_is_object(root))
        return hr_srv_fail(e, 400, NULL, "invalid_type", "the body must be a JSON object, got %s", type_name(root));
    const char *model = NULL, *user = NULL;
    if (!read_string(root, "model", &model, e) || !read_string(root, "user", &user, e)) return false;
    g->prompt_field = kind == HR_SRV_CHAT ? "messages" : "prompt";
    if (!hr_srv_parse_format(root, g, e)) return false; /* response_format, guided_* (openai_format.c) */
    if (!(kind == HR_SRV_CHAT ? parse_messages(root, g, e) : parse_prompt(root, g, e))) return false;

    long long max_tokens = -1, n = 1, top_k = g->rp.sampling.top_k, seed = 0, priority = 0;
    long long cap = sp->max_tokens_limit > 0 ? sp->max_tokens_limit : 1 << 30;
    if (!read_int(root, "max_tokens", 1, cap, &max_tokens, e) ||
        !read_int(root, "max_completion_tokens", 1, cap, &max_tokens, e))
        return false;
    if (max_tokens > 0) g->rp.max_tokens = (int)max_tokens;
    if (sp->max_tokens_limit > 0 && (g->rp.max_tokens <= 0 || g->rp.max_tokens > sp->max_tokens_limit))
        g->rp.max_tokens = sp->max_tokens_limit; /* an omitted max_tokens stops at the limit too */
    hr_rt_sampling *s = &g->rp.sampling;
    if (!read_number(root, "temperature", 0, 100, &s->temperature, e) ||
        !read_number(root, "top_p", 0, 1, &s->top_p, e) || !read_number(root, "min_p", 0, 1, &s->min_p, e) ||
        !read_number(root, "presence_penalty", -2, 2, &s->presence_penalty, e) ||
        !read_number(root, "frequency_penalty", -2, 2, &s->frequency_penalty, e) ||
        !read_number(root, "repetition_penalty", 1e-3, 100, &s->repeat_penalty, e) ||
        !read_int(root, "top_k", -1, 1 << 24, &top_k, e) || !read_int(root, "n", 1, sp->max_choices, &n, e) ||
        !read_int(root, "priority", -1000000, 1000000, &priority, e))
        return false;
    if (field(root, "seed")) {
        if (!read_int(root, "seed", INT64_MIN, INT64_MAX, &seed, e)) return false;
        s->seed = (uint64_t)seed;
    }
    /* top_p 0 would keep nothing: the smallest nucleus is the top token */
    if (s->top_p <= 0) s->top_p = 1e-6f;
    s->top_k = top_k < 0 ? 0 : (int)top_k;
    g->n = (int)n;
    if (!refuse_unsupported(kind, root, n, e)) return false;
    if (kind == HR_SRV_CHAT) {
        const char *param = NULL;
        char msg[256];
        if (!hr_tools_read(root, &g->tools, &param, msg, sizeof msg))
            return hr_srv_fail(e, 400, param, "invalid_value", "%s", msg);
    }
    g->rp.priority = (int)priority;
    if (!read_string(root, "kv_policy", &g->rp.kv_policy, e) || !read_bool(root, "ignore_eos", &g->rp.ignore_eos, e) ||
        !read_bool(root, "stream", &g->stream, e) || !parse_stop(root, g, e))
        return false;
    if (!parse_logprobs(root, g, e) || !parse_logit_bias(root, g, e)) return false;
    json_t *salt = field(root, "cache_salt");
    if (salt && !json_is_string(salt))
        return hr_srv_fail(e, 400, "cache_salt", "invalid_type", "'cache_salt' must be a string, got %s",
                           type_name(salt));
    if (salt) {
        g->cache_salt = json_string_value(salt);
        g->cache_salt_len = json_string_length(salt);
    }
    json_t *so = field(root, "stream_options");
    if (so) {
        if (!json_is_object(so))
            return hr_srv_fail(e, 400, "stream_options", "invalid_type", "'stream_options' must be an object, got %s",
                               type_name(so));
        if (!read_bool(so, "include_usage", &g->include_usage, e)) {
            e->param = "stream_options.include_usage";
            return false;
        }
    }
    return true;
}

bool hr_srv_keep_owned(hr_srv_gen *g, char *s) { return keep_owned(g, s); } /* openai_format.c's */

/* The template takes them as they are (hr_srv_gen_apply_tools with native). */
static bool tools_native(hr_srv_gen *g, json_t *msgs, hr_srv_error *e) {
    for (size_t i = 0; i < g->rp.n_messages; i++) {
        json_t *m = json_array_get(msgs, i);
        json_t *calls = json_object_get(m, "tool_calls");
        if (json_array_size(calls) > 0) {
            if (strcmp(g->messages[i].role, "assistant") != 0)
                return hr_srv_fail(e, 400, "messages", "invalid_value",
                                   "'messages[%zu].tool_calls' belongs on an assistant message", i);
            char *text = hr_tools_call_text(HR_TOOLS_JSON, calls); /* checks every call's shape */
            bool ok = text != NULL;
            free(text);
            char *dump = ok ? json_dumps(calls, JSON_COMPACT) : NULL;
            if (!ok)
                return hr_srv_fail(e, 400, "messages", "invalid_value",
                                   "'messages[%zu].tool_calls' must be [{\"id\", \"type\": \"function\", "
                                   "\"function\": {\"name\", \"arguments\": a JSON object as a string}}]",
                                   i);
            if (!dump || !keep_owned(g, dump)) return hr_srv_fail(e, 500, NULL, NULL, "out of memory");
            g->messages[i].tool_calls_json = dump;
        }
        g->messages[i].tool_call_id = json_string_value(json_object_get(m, "tool_call_id"));
        g->messages[i].name = json_string_value(json_object_get(m, "name"));
    }
    if (g->tools.n > 0 && !g->tools.none) {
        char *dump = json_dumps(g->tools.list, JSON_COMPACT);
        if (!dump || !keep_owned(g, dump)) return hr_srv_fail(e, 500, NULL, NULL, "out of memory");
        g->rp.tools_json = dump;
    }
    return true;
}

bool hr_srv_gen_apply_tools(hr_srv_gen *g, json_t *root, hr_tool_format f, bool native, hr_srv_error *e) {
    json_t *msgs = field(root, "messages");
    if (g->tools.required) { /* the answer must be calls: constrain it to them */
        if (g->rp.constraint.kind != HR_RT_CONS_NONE)
            return hr_srv_fail(e, 400, "tool_choice", "invalid_value",
                               "'tool_choice' asks for a tool call, which cannot be combined with '%s'",
                               g->rp.constraint.field ? g->rp.constraint.field : "response_format");
        char msg[256];
        char *gbnf = hr_tools_grammar(f, &g->tools, msg, sizeof msg);
        if (!gbnf) return hr_srv_fail(e, 400, "tools", "invalid_value", "%s", msg);
        if (!keep_owned(g, gbnf)) return hr_srv_fail(e, 500, NULL, NULL, "out of memory");
        g->rp.constraint =
            (hr_rt_constraint){.kind = HR_RT_CONS_GRAMMAR, .src = gbnf, .len = strlen(gbnf), .field = "tool_choice"};
    }
    if (native) return tools_native(g, msgs, e);
    size_t n = g->rp.n_messages;
    bool any = g->tools.n > 0 && !g->tools.none;
    for (size_t i = 0; i < n && !any; i++) {
        json_t *m = json_array_get(msgs, i);
        any = !strcmp(g->messages[i].role, "tool") || json_array_size(json_object_get(m, "tool_calls")) > 0;
    }
    if (!any) return true;
    hr_rt_chat_msg *out = calloc(n + 1, sizeof *out);
    if (!out) return hr_srv_fail(e, 500, NULL, NULL, "out of memory");
    size_t k = 0;
    bool prev_tool = false;
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(msgs, i);
        hr_rt_chat_msg msg = g->messages[i];
        char *owned = NULL;
        bool is_tool = !strcmp(msg.role, "tool");
        json_t *calls = json_object_get(m, "tool_calls");
        if (is_tool) {
            owned = hr_tools_result_text(f, msg.content, json_string_value(json_object_get(m, "tool_call_id")));
            msg.role = f == HR_TOOLS_LLAMA3 ? "ipython" : "user";
        } else if (json_array_size(calls) > 0) {
            if (strcmp(msg.role, "assistant") != 0) {
                free(out);
                return hr_srv_fail(e, 400, "messages", "invalid_value",
                                   "'messages[%zu].tool_calls' belongs on an assistant message", i);
            }
            char *text = hr_tools_call_text(f, calls);
            if (!text) {
                free(out);
                return hr_srv_fail(e, 400, "messages", "invalid_value",
                                   "'messages[%zu].tool_calls' must be [{\"id\", \"type\": \"function\", "
                                   "\"function\": {\"name\", \"arguments\": a JSON object as a string}}]",
                                   i);
            }
            size_t lc = strlen(msg.content), lt = strlen(text);
            owned = malloc(lc + lt + 2);
            if (owned) snprintf(owned, lc + lt + 2, "%s%s%s", msg.content, lc ? "\n" : "", text);
            free(text);
        }
        if ((is_tool || json_array_size(calls) > 0) && !owned) {
            free(out);
            return hr_srv_fail(e, 500, NULL, NULL, "out of memory");
        }
        if (owned) {
            if (!keep_owned(g, owned)) {
                free(out);
                return hr_srv_fail(e, 500, NULL, NULL, "out of memory");
            }
            msg.content = owned;
        }
        if (is_tool && prev_tool) { /* one turn for consecutive results */
            size_t la = strlen(out[k - 1].content), lb = strlen(msg.content);
            char *both = malloc(la + lb + 2);
            if (!both || !keep_owned(g, both)) {
                free(out);
                return hr_srv_fail(e, 500, NULL, NULL, "out of memory");
            }
            snprintf(both, la + lb + 2, "%s\n%s", out[k - 1].content, msg.content);
            out[k - 1].content = both;
        } else {
            out[k++] = msg;
        }
        prev_tool = is_tool;
    }
    if (g->tools.n > 0 && !g->tools.none) {
        char *desc = hr_tools_prompt(f, &g->tools);
        if (!desc || !keep_owned(g, desc)) {
            free(out);
            return hr_srv_fail(e, 500, NULL, NULL, "out of memory");
        }
        if (k > 0 && !strcmp(out[0].role, "system")) {
            size_t la = strlen(out[0].content), lb = strlen(desc);
            char *both = malloc(la + lb + 1);
            if (!both || !keep_owned(g, both)) {
                free(out);
                return hr_srv_fail(e, 500, NULL, NULL, "out of memory");
            }
            snprintf(both, la + lb + 1, "%s%s", out[0].content, la ? desc : desc + strspn(desc, "\n"));
            out[0].content = both;
        } else {
            memmove(out + 1, out, sizeof *out * k++);
            out[0] = (hr_rt_chat_msg){.role = "system", .content = desc + strspn(desc, "\n")};
        }
    }
    free(g->messages);
    g->messages = out;
    g->rp.messages = out;
    g->rp.n_messages = k;
    return true;
}

void hr_srv_gen_free(hr_srv_gen *g) {
    for (int i = 0; i < g->n_owned; i++) free(g->owned[i]);
    free(g->owned);
    free(g->messages);
    free(g->prompt_ids);
    free(g->bias_ids);
    free(g->bias_values);
    memset(g, 0, sizeof *g);
}

/* ---- bodies of every route (the server and fuzz/fuzz_http.c share these) ---------------------- */

/* What is wrong with a body jansson refused, from its error code (never from its text, which quotes
 * the input near the error: a body may hold a password). */
static const char *json_problem(const json_error_t *je) {
    switch (json_error_code(je)) {
    case json_error_premature_end_of_input: return "the body ends inside a value";
    case json_error_end_of_input_expected: return "text follows the JSON value";
    case json_error_invalid_utf8: return "invalid UTF-8";
    case json_error_null_character: return "a NUL character in a string";
    case json_error_null_byte_in_key: return "a NUL character in a key";
    case json_error_numeric_overflow: return "a number too large";
    case json_error_stack_overflow: return "values nested too deep";
    case json_error_duplicate_key: return "a key given twice";
    case json_error_out_of_memory: return "out of memory";
    default: return "invalid syntax";
    }
}

json_t *hr_srv_parse_body(const char *data, size_t len, hr_srv_error *e) {
    size_t held;
    return hr_srv_parse_body_in(NULL, data, len, &held, e);
}

json_t *hr_srv_parse_body_in(hr_srv_parse_pool *pool, const char *data, size_t len, size_t *held, hr_srv_error *e) {
    *held = 0;
    size_t bad;
    if (!hr_utf8_valid(data ? data : "", len, &bad)) {
        hr_srv_fail(e, 400, NULL, "invalid_utf8", "the body is not valid UTF-8 (byte %zu)", bad);
        return NULL;
    }
    if (len == 0) {
        hr_srv_fail(e, 400, NULL, "invalid_json", "the body is empty; expected a JSON object");
        return NULL;
    }
    json_error_t je;
    hr_srv_parse_fail why;
    json_t *root = hr_srv_parse_pool_load(pool, data, len, &je, &why, held);
    if (!root && why != HR_SRV_PARSE_OK) {
        char lim[32], all[32];
        size_t per = hr_srv_parse_pool_per_request(pool);
        hr_format_size(hr_srv_parse_pool_limit(pool), all, sizeof all);
        if (why == HR_SRV_PARSE_BUSY) {
            hr_srv_fail(e, 503, NULL, "parse_memory_busy",
                        "the server's memory for parsing request bodies (--max-parse-memory %s) stayed in use for "
                        "5 s; retry",
                        all);
            e->refusal = HR_REFUSE_QUEUE;
        } else if (why == HR_SRV_PARSE_TOO_DENSE) {
            hr_srv_fail(e, 413, NULL, "parse_memory_exceeded",
                        "parsing the body needs more memory than its bound of 64 x its %zu bytes + 256 KiB (the "
                        "per-request JSON parse limit, at most %s): too many JSON values for its size",
                        len, hr_format_size(per, lim, sizeof lim));
        } else {
            hr_srv_fail(e, 413, NULL, "parse_memory_exceeded",
                        "parsing the body needs more than %s (the per-request JSON parse limit: a quarter of "
                        "--max-parse-memory %s)",
                        hr_format_size(per, lim, sizeof lim), all);
        }
        return NULL;
    }
    if (!root) {
        hr_srv_fail(e, 400, NULL, "invalid_json", "invalid JSON at line %d column %d: %s", je.line, je.column,
                    json_problem(&je));
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        hr_srv_parse_pool_release(pool, *held);
        *held = 0;
        hr_srv_fail(e, 400, NULL, "invalid_json", "the body must be a JSON object");
        return NULL;
    }
    return root;
}

bool hr_srv_parse_tokenize(json_t *root, hr_srv_tokenize *t, hr_srv_error *e) {
    memset(t, 0, sizeof *t);
    json_t *content = json_object_get(root, "content");
    json_t *special = json_object_get(root, "add_special");
    json_t *pieces = json_object_get(root, "with_pieces");
    if (!json_is_string(content))
        return hr_srv_fail(e, 400, "content", content ? "invalid_type" : "missing_required_parameter",
                           "'content' must be a string");
    if ((special && !json_is_boolean(special)) || (pieces && !json_is_boolean(pieces)))
        return hr_srv_fail(e, 400, special && !json_is_boolean(special) ? "add_special" : "with_pieces", "invalid_type",
                           "'add_special' and 'with_pieces' must be booleans");
    t->text = json_string_value(content);
    t->len = json_string_length(content);
    t->opts = (hr_tokenize_opts){.add_bos = json_is_true(special), .parse_special = json_is_true(special)};
    t->with_pieces = json_is_true(pieces);
    return true;
}

bool hr_srv_parse_detokenize(json_t *root, int32_t n_vocab, int32_t **ids, size_t *n_ids, hr_srv_error *e) {
    *ids = NULL;
    *n_ids = 0;
    json_t *arr = json_object_get(root, "tokens");
    if (!json_is_array(arr))
        return hr_srv_fail(e, 400, "tokens", arr ? "invalid_type" : "missing_required_parameter",
                           "'tokens' must be an array of token ids");
    size_t n = json_array_size(arr);
    int32_t *v = malloc(sizeof(int32_t) * (n ? n : 1));
    if (!v) return hr_srv_fail(e, 503, NULL, "out_of_memory", "out of memory; retry");
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(arr, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= n_vocab) {
            free(v);
            return hr_srv_fail(e, 400, "tokens", "invalid_value",
                               "'tokens[%zu]' is not a token id of this vocabulary (0..%d)", i, n_vocab - 1);
        }
        v[i] = (int32_t)json_integer_value(t);
    }
    *ids = v;
    *n_ids = n;
    return true;
}

int hr_srv_retry_after_secs(double s) {
    if (!(s > 1.0)) return 1;                   /* also NaN: never "0", which means "now" */
    return s >= 86400.0 ? 86400 : (int)ceil(s); /* rounded up: a client never comes back early */
}

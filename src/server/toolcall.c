/* toolcall.c: tools into the prompt, tool calls out of the output (see toolcall.h for the formats). */
#include "server/toolcall.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "server/server_internal.h"

#define MAX_TOOLS 128

hr_tool_format hr_tool_format_for(const char *family) {
    if (!family) return HR_TOOLS_JSON;
    if (!strcmp(family, "chatml")) return HR_TOOLS_HERMES;
    if (!strcmp(family, "llama3")) return HR_TOOLS_LLAMA3;
    if (!strcmp(family, "mistral")) return HR_TOOLS_MISTRAL;
    return HR_TOOLS_JSON;
}

const char *hr_tool_format_name(hr_tool_format f) {
    static const char *const names[] = {"json", "hermes", "llama3", "mistral"};
    return (unsigned)f < sizeof names / sizeof names[0] ? names[f] : "json";
}

/* ---- the request ------------------------------------------------------------------------------- */

static bool fail(const char **param, char *msg, size_t cap, const char *p, const char *text) {
    *param = p;
    snprintf(msg, cap, "%s", text);
    return false;
}

static bool name_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 64) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
              c == '.'))
            return false;
    }
    return true;
}

static const char *tool_name(const hr_tools *t, int i) {
    json_t *fn = json_object_get(json_array_get(t->list, (size_t)i), "function");
    return json_string_value(json_object_get(fn, "name"));
}

static int tool_index(const hr_tools *t, const char *name) {
    for (int i = 0; name && i < t->n; i++)
        if (!strcmp(tool_name(t, i), name)) return i;
    return -1;
}

bool hr_tools_read(json_t *root, hr_tools *out, const char **param, char *msg, size_t cap) {
    memset(out, 0, sizeof *out);
    out->parallel = true;
    json_t *list = json_object_get(root, "tools");
    if (list && !json_is_null(list)) {
        if (!json_is_array(list)) return fail(param, msg, cap, "tools", "'tools' must be an array of tools");
        if (json_array_size(list) > MAX_TOOLS) {
            *param = "tools";
            snprintf(msg, cap, "'tools' holds %zu tools: at most %d", json_array_size(list), MAX_TOOLS);
            return false;
        }
        out->list = list;
        out->n = (int)json_array_size(list);
        for (int i = 0; i < out->n; i++) {
            json_t *tool = json_array_get(list, (size_t)i);
            json_t *type = json_is_object(tool) ? json_object_get(tool, "type") : NULL;
            json_t *fn = json_is_object(tool) ? json_object_get(tool, "function") : NULL;
            const char *name = json_string_value(json_object_get(fn, "name"));
            json_t *params = json_object_get(fn, "parameters");
            json_t *desc = json_object_get(fn, "description");
            *param = "tools";
            if (!json_is_object(tool) ||
                (type && !(json_is_string(type) && !strcmp(json_string_value(type), "function"))))
                return snprintf(msg, cap, "'tools[%d]' must be {\"type\": \"function\", \"function\": {...}}", i),
                       false;
            if (!json_is_object(fn) || !name || !name_ok(name))
                return snprintf(msg, cap, "'tools[%d].function.name' must be 1-64 of a-z, A-Z, 0-9, _ . -", i), false;
            if (params && !json_is_null(params) && !json_is_object(params))
                return snprintf(msg, cap, "'tools[%d].function.parameters' must be a JSON Schema object", i), false;
            if (desc && !json_is_null(desc) && !json_is_string(desc))
                return snprintf(msg, cap, "'tools[%d].function.description' must be a string", i), false;
            for (int k = 0; k < i; k++)
                if (!strcmp(tool_name(out, k), name))
                    return snprintf(msg, cap, "'tools' names the function '%s' twice", name), false;
        }
    }
    json_t *choice = json_object_get(root, "tool_choice");
    if (choice && !json_is_null(choice)) {
        const char *s = json_string_value(choice);
        if (s && !strcmp(s, "none")) {
            out->none = true;
        } else if (s && !strcmp(s, "auto")) {
        } else if (s && !strcmp(s, "required")) {
            out->required = true;
        } else if (json_is_object(choice)) {
            json_t *fn = json_object_get(choice, "function");
            out->forced = json_string_value(json_object_get(fn, "name"));
            out->required = true;
            if (!out->forced)
                return fail(param, msg, cap, "tool_choice",
                            "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                            "\"function\": {\"name\": ...}}");
            if (tool_index(out, out->forced) < 0) {
                *param = "tool_choice";
                snprintf(msg, cap, "'tool_choice' names the function '%.64s', which is not in 'tools'", out->forced);
                return false;
            }
        } else {
            return fail(param, msg, cap, "tool_choice",
                        "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                        "\"function\": {\"name\": ...}}");
        }
        if (out->required && out->n == 0)
            return fail(param, msg, cap, "tool_choice", "'tool_choice' asks for a tool call but 'tools' is empty");
    }
    json_t *par = json_object_get(root, "parallel_tool_calls");
    if (par && !json_is_null(par)) {
        if (!json_is_boolean(par))
            return fail(param, msg, cap, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
        out->parallel = json_is_true(par);
    }
    return true;
}

/* ---- into the prompt --------------------------------------------------------------------------- */

static char *take(hr_srv_buf *b) {
    if (b->failed) {
        hr_srv_buf_free(b);
        return NULL;
    }
    hr_srv_buf_put(b, "", 1); /* NUL */
    if (b->failed) {
        hr_srv_buf_free(b);
        return NULL;
    }
    return b->data;
}

static void put_json(hr_srv_buf *b, json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    if (!s) {
        b->failed = true;
        return;
    }
    hr_srv_buf_put(b, s, strlen(s));
    free(s);
}

static void put_str(hr_srv_buf *b, const char *s) { hr_srv_buf_put(b, s, strlen(s)); }

char *hr_tools_prompt(hr_tool_format f, const hr_tools *t) {
    hr_srv_buf b = {0};
    switch (f) {
    case HR_TOOLS_HERMES:
        put_str(&b, "\n\n# Tools\n\nYou may call one or more of the functions below. Their signatures, one per "
                    "line, inside <tools></tools>:\n<tools>");
        for (int i = 0; i < t->n; i++) {
            put_str(&b, "\n");
            put_json(&b, json_array_get(t->list, (size_t)i));
        }
        put_str(&b, "\n</tools>\n\nTo call one, answer with a JSON object of its name and arguments inside "
                    "<tool_call></tool_call>:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                    "<args-json-object>}\n</tool_call>");
        break;
    case HR_TOOLS_LLAMA3:
        put_str(&b, "\n\nYou can call the functions below. To call one, answer with only a JSON object "
                    "{\"name\": function name, \"parameters\": object of argument names and values}.\n");
        for (int i = 0; i < t->n; i++) {
            put_str(&b, "\n");
            put_json(&b, json_array_get(t->list, (size_t)i));
        }
        break;
    case HR_TOOLS_MISTRAL:
        put_str(&b, "\n\nAvailable tools: ");
        put_json(&b, t->list);
        put_str(&b, "\nTo call tools, answer with only a JSON array [{\"name\": ..., \"arguments\": {...}}].");
        break;
    default:
        put_str(&b, "\n\nYou can call these tools: ");
        put_json(&b, t->list);
        put_str(&b, "\nTo call them, answer with only {\"tool_calls\": [{\"name\": ..., \"arguments\": {...}}]}.");
        break;
    }
    return take(&b);
}

/* {"name": F, KEY: ARGS} with ARGS the parsed arguments (an object). */
static json_t *call_object(hr_tool_format f, const char *name, json_t *args) {
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(name));
    json_object_set(o, f == HR_TOOLS_LLAMA3 ? "parameters" : "arguments", args);
    return o;
}

char *hr_tools_call_text(hr_tool_format f, json_t *tool_calls) {
    if (!json_is_array(tool_calls)) return NULL;
    json_t *objs = json_array();
    for (size_t i = 0; i < json_array_size(tool_calls); i++) {
        json_t *fn = json_object_get(json_array_get(tool_calls, i), "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        json_t *a = json_object_get(fn, "arguments");
        json_t *args = json_is_string(a) ? json_loads(json_string_value(a), 0, NULL) : json_incref(a);
        if (!name || !json_is_object(args)) {
            json_decref(args);
            json_decref(objs);
            return NULL;
        }
        json_array_append_new(objs, call_object(f, name, args));
        json_decref(args);
    }
    hr_srv_buf b = {0};
    if (f == HR_TOOLS_MISTRAL) {
        put_json(&b, objs);
    } else if (f == HR_TOOLS_JSON) {
        json_t *w = json_pack("{s:O}", "tool_calls", objs);
        put_json(&b, w);
        json_decref(w);
    } else {
        for (size_t i = 0; i < json_array_size(objs); i++) {
            if (i) put_str(&b, "\n");
            if (f == HR_TOOLS_HERMES) put_str(&b, "<tool_call>\n");
            put_json(&b, json_array_get(objs, i));
            if (f == HR_TOOLS_HERMES) put_str(&b, "\n</tool_call>");
        }
    }
    json_decref(objs);
    return take(&b);
}

char *hr_tools_result_text(hr_tool_format f, const char *content, const char *tool_call_id) {
    hr_srv_buf b = {0};
    if (f == HR_TOOLS_HERMES) {
        put_str(&b, "<tool_response>\n");
        put_str(&b, content ? content : "");
        put_str(&b, "\n</tool_response>");
    } else {
        put_str(&b, "Result of tool call");
        if (tool_call_id) {
            put_str(&b, " ");
            put_str(&b, tool_call_id);
        }
        put_str(&b, ": ");
        put_str(&b, content ? content : "");
    }
    return take(&b);
}

/* ---- out of the output ------------------------------------------------------------------------- */

static size_t skip_ws(const char *s, size_t i, size_t n) {
    while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) i++;
    return i;
}

/* One JSON value at s[*i..n) (the value only: text after it is left); advances *i past it. */
static json_t *json_at(const char *s, size_t *i, size_t n) {
    json_error_t je;
    json_t *v = json_loadb(s + *i, n - *i, JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY, &je);
    if (v) *i += (size_t)je.position;
    return v;
}

/* A call object of format f naming one of t's tools into *c. */
static bool take_call(hr_tool_format f, const hr_tools *t, json_t *o, hr_tool_call *c) {
    const char *name = json_string_value(json_object_get(o, "name"));
    json_t *args = json_object_get(o, f == HR_TOOLS_LLAMA3 ? "parameters" : "arguments");
    if (!args && f == HR_TOOLS_LLAMA3) args = json_object_get(o, "arguments");
    if (!name || tool_index(t, name) < 0 || !json_is_object(args)) return false;
    c->name = strdup(name);
    c->arguments = json_dumps(args, JSON_COMPACT);
    if (!c->name || !c->arguments) {
        free(c->name);
        free(c->arguments);
        return false;
    }
    return true;
}

void hr_tools_free_calls(hr_tool_call *calls, int n) {
    for (int i = 0; i < n; i++) {
        free(calls[i].name);
        free(calls[i].arguments);
        calls[i].name = calls[i].arguments = NULL;
    }
}

static const char k_open[] = "<tool_call>", k_close[] = "</tool_call>";

static int extract_hermes(const hr_tools *t, const char *s, size_t n, size_t *content_len, hr_tool_call *calls,
                          int cap) {
    const char *at = memmem(s, n, k_open, sizeof k_open - 1);
    if (!at) return 0;
    size_t i = (size_t)(at - s);
    size_t content = i;
    while (content > 0 && (s[content - 1] == '\n' || s[content - 1] == ' ')) content--;
    int k = 0;
    while (i < n) {
        if (n - i < sizeof k_open - 1 || memcmp(s + i, k_open, sizeof k_open - 1) != 0) break;
        i = skip_ws(s, i + sizeof k_open - 1, n);
        json_t *o = json_at(s, &i, n);
        bool ok = o && k < cap && take_call(HR_TOOLS_HERMES, t, o, &calls[k]);
        json_decref(o);
        i = skip_ws(s, i, n);
        if (!ok || n - i < sizeof k_close - 1 || memcmp(s + i, k_close, sizeof k_close - 1) != 0) {
            if (ok) k++;
            hr_tools_free_calls(calls, k);
            return 0;
        }
        k++;
        i = skip_ws(s, i + sizeof k_close - 1, n);
    }
    if (i < n || k == 0) { /* text after the calls: not a call answer */
        hr_tools_free_calls(calls, k);
        return 0;
    }
    *content_len = content;
    return k;
}

/* llama3: objects separated by whitespace or ';'; mistral: one array; json: {"tool_calls": [...]}. */
static int extract_json(hr_tool_format f, const hr_tools *t, const char *s, size_t n, hr_tool_call *calls, int cap) {
    size_t i = skip_ws(s, 0, n);
    int k = 0;
    bool ok = true;
    if (f == HR_TOOLS_LLAMA3) {
        while (ok && i < n) {
            json_t *o = s[i] == '{' ? json_at(s, &i, n) : NULL;
            ok = o && k < cap && take_call(f, t, o, &calls[k]);
            k += ok;
            json_decref(o);
            i = skip_ws(s, i, n);
            if (i < n && s[i] == ';') i = skip_ws(s, i + 1, n);
        }
    } else {
        json_t *v = i < n && (s[i] == '[' || s[i] == '{') ? json_at(s, &i, n) : NULL;
        json_t *arr = f == HR_TOOLS_MISTRAL ? v : json_object_get(v, "tool_calls");
        ok = json_is_array(arr) && json_array_size(arr) > 0 && (f == HR_TOOLS_MISTRAL || json_object_size(v) == 1);
        for (size_t a = 0; ok && a < json_array_size(arr); a++) {
            ok = k < cap && take_call(f, t, json_array_get(arr, a), &calls[k]);
            k += ok;
        }
        json_decref(v);
        i = skip_ws(s, i, n);
    }
    if (!ok || i < n) {
        hr_tools_free_calls(calls, k);
        return 0;
    }
    return k;
}

int hr_tools_extract(hr_tool_format f, const hr_tools *t, const char *text, size_t len, size_t *content_len,
                     hr_tool_call *calls, int cap) {
    *content_len = len;
    if (!t || t->n == 0 || t->none || !text) return 0;
    if (f == HR_TOOLS_HERMES) return extract_hermes(t, text, len, content_len, calls, cap);
    int k = extract_json(f, t, text, len, calls, cap);
    if (k > 0) *content_len = 0;
    return k;
}

size_t hr_tools_stream_safe(hr_tool_format f, const char *s, size_t n) {
    if (f == HR_TOOLS_HERMES) {
        const char *at = memmem(s, n, k_open, sizeof k_open - 1);
        if (at) return (size_t)(at - s);
        /* a tail that may grow into "<tool_call>" stays back */
        for (size_t keep = sizeof k_open - 2; keep > 0; keep--)
            if (n >= keep && !memcmp(s + n - keep, k_open, keep)) return n - keep;
        return n;
    }
    size_t i = skip_ws(s, 0, n);
    if (i == n) return 0; /* nothing but whitespace yet */
    return s[i] == '{' || s[i] == '[' ? 0 : n;
}

json_t *hr_tools_call_schema(hr_tool_format f, const hr_tools *t, int i) {
    json_t *fn = json_object_get(json_array_get(t->list, (size_t)i), "function");
    json_t *params = json_object_get(fn, "parameters");
    json_t *p = json_is_object(params) ? json_incref(params) : json_pack("{s:s}", "type", "object");
    const char *key = f == HR_TOOLS_LLAMA3 ? "parameters" : "arguments";
    return json_pack("{s:s, s:{s:{s:s}, s:o}, s:[s,s], s:b}", "type", "object", "properties", "name", "const",
                     tool_name(t, i), key, p, "required", "name", key, "additionalProperties", 0);
}

void hr_tools_call_id(unsigned long long seed, int k, char out[32]) {
    static const char alpha[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    uint64_t h = hr_mix64(hr_mix64(seed + 0x63616c6c5f6964ull) + (uint64_t)k); /* "call_id" */
    memcpy(out, "call_", 5);
    for (int i = 0; i < 24; i++) {
        if (i % 8 == 0) h = hr_mix64(h + (uint64_t)i);
        out[5 + i] = alpha[h % (sizeof alpha - 1)];
        h /= sizeof alpha - 1;
    }
    out[29] = '\0';
}

/* ---- constraining the answer to calls ----------------------------------------------------------- */

/* gbnf with every rule name `root` (the definition and any reference) renamed `tool-call`; quoted
 * strings, character classes and /regex/ atoms are left as they are. */
static bool rename_root(const char *g, hr_srv_buf *b) {
    size_t n = strlen(g);
    for (size_t i = 0; i < n;) {
        char c = g[i];
        if (c == '"' || c == '[' || c == '/') {
            char close = c == '[' ? ']' : c;
            size_t j = i + 1;
            while (j < n && g[j] != close) j += g[j] == '\\' ? 2 : 1;
            j = j < n ? j + 1 : n;
            hr_srv_buf_put(b, g + i, j - i);
            i = j;
            continue;
        }
        bool ident = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
        if (!ident) {
            hr_srv_buf_put(b, g + i, 1);
            i++;
            continue;
        }
        size_t j = i;
        while (j < n && ((g[j] >= 'a' && g[j] <= 'z') || (g[j] >= 'A' && g[j] <= 'Z') || (g[j] >= '0' && g[j] <= '9') ||
                         g[j] == '-' || g[j] == '_'))
            j++;
        if (j - i == 4 && !memcmp(g + i, "root", 4))
            put_str(b, "tool-call");
        else
            hr_srv_buf_put(b, g + i, j - i);
        i = j;
    }
    return !b->failed;
}

char *hr_tools_grammar(hr_tool_format f, const hr_tools *t, char *msg, size_t cap) {
    json_t *any = json_array();
    for (int i = 0; i < t->n; i++)
        if (!t->forced || !strcmp(tool_name(t, i), t->forced))
            json_array_append_new(any, hr_tools_call_schema(f, t, i));
    json_t *schema = json_array_size(any) == 1 ? json_incref(json_array_get(any, 0)) : json_pack("{s:O}", "anyOf", any);
    json_decref(any);
    char *text = schema ? json_dumps(schema, JSON_COMPACT) : NULL;
    json_decref(schema);
    char *gbnf = NULL;
    hr_error err = {0};
    if (!text || hr_rt_schema_to_gbnf(text, strlen(text), &gbnf, &err) != HR_OK) {
        snprintf(msg, cap, "a tool's parameters cannot constrain the answer: %s", text ? err.msg : "out of memory");
        free(text);
        return NULL;
    }
    free(text);
    hr_srv_buf b = {0};
    /* the calls in the format's framing; "tool-call" is one call object (the schema's root, renamed) */
    static const struct {
        const char *open, *sep, *close;
    } frame[] = {
        [HR_TOOLS_JSON] = {"\"{\\\"tool_calls\\\": [\"", "\", \"", "\"]}\""},
        [HR_TOOLS_HERMES] = {"\"<tool_call>\\n\"", "\"\\n</tool_call>\\n<tool_call>\\n\"", "\"\\n</tool_call>\""},
        [HR_TOOLS_LLAMA3] = {"\"\"", "\"; \"", "\"\""},
        [HR_TOOLS_MISTRAL] = {"\"[\"", "\", \"", "\"]\""},
    };
    put_str(&b, "root ::= ");
    put_str(&b, frame[f].open);
    put_str(&b, " tool-call");
    if (t->parallel) {
        put_str(&b, " ( ");
        put_str(&b, frame[f].sep);
        put_str(&b, " tool-call )*");
    }
    put_str(&b, " ");
    put_str(&b, frame[f].close);
    put_str(&b, "\n");
    bool ok = rename_root(gbnf, &b);
    free(gbnf);
    if (!ok) {
        hr_srv_buf_free(&b);
        snprintf(msg, cap, "out of memory");
        return NULL;
    }
    return take(&b);
}

/* chat.c: chat template recognition and rendering (see chat.h). Each renderer follows its family's
 * reference Jinja template statement by statement; the comment above each quotes what it reproduces.
 * Jinja's `trim` filter and Python's str.strip() are both implemented by strip() (ASCII whitespace). */
#include "tokenizer/chat.h"

#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "tokenizer/tokenizer.h"

/* ---- names ------------------------------------------------------------------------------------- */

static const struct {
    const char *name;
    hr_chat_template tpl;
} k_names[] = {
    {"chatml", HR_CHAT_CHATML},
    {"qwen", HR_CHAT_CHATML},
    {"qwen2", HR_CHAT_CHATML},
    {"llama2", HR_CHAT_LLAMA2},
    {"llama-2", HR_CHAT_LLAMA2},
    {"llama3", HR_CHAT_LLAMA3},
    {"llama-3", HR_CHAT_LLAMA3},
    {"mistral", HR_CHAT_MISTRAL},
    {"mixtral", HR_CHAT_MISTRAL},
    {"mistral-v1", HR_CHAT_MISTRAL_V1},
    {"phi3", HR_CHAT_PHI3},
    {"phi-3", HR_CHAT_PHI3},
    {"gemma", HR_CHAT_GEMMA},
    {"zephyr", HR_CHAT_ZEPHYR},
    {"deepseek", HR_CHAT_DEEPSEEK},
    {"deepseek2", HR_CHAT_DEEPSEEK},
    {"deepseek-llm", HR_CHAT_DEEPSEEK},
};

const char *hr_chat_template_name(hr_chat_template tpl) {
    switch (tpl) {
    case HR_CHAT_CHATML: return "chatml";
    case HR_CHAT_LLAMA2: return "llama2";
    case HR_CHAT_LLAMA3: return "llama3";
    case HR_CHAT_MISTRAL: return "mistral";
    case HR_CHAT_MISTRAL_V1: return "mistral-v1";
    case HR_CHAT_PHI3: return "phi3";
    case HR_CHAT_GEMMA: return "gemma";
    case HR_CHAT_ZEPHYR: return "zephyr";
    case HR_CHAT_DEEPSEEK: return "deepseek";
    case HR_CHAT_UNKNOWN: break;
    }
    return "unknown";
}

hr_chat_template hr_chat_template_by_name(const char *name) {
    if (!name) return HR_CHAT_UNKNOWN;
    for (size_t i = 0; i < HR_ARRAY_LEN(k_names); i++)
        if (strcmp(name, k_names[i].name) == 0) return k_names[i].tpl;
    return HR_CHAT_UNKNOWN;
}

const char *hr_chat_template_names(void) {
    return "chatml (qwen), llama2, llama3, mistral (mixtral), mistral-v1, phi3, gemma, zephyr, deepseek";
}

/* ---- recognition ------------------------------------------------------------------------------- */

static bool has(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

hr_chat_template hr_chat_template_detect(const char *jinja, char *warning, size_t warning_len) {
    if (warning && warning_len) warning[0] = '\0';
    if (!jinja) jinja = "";
    hr_chat_template by_name = hr_chat_template_by_name(jinja);
    if (by_name != HR_CHAT_UNKNOWN) return by_name;
    if (has(jinja, "<|im_start|>")) return HR_CHAT_CHATML;
    if (has(jinja, "<|start_header_id|>") && has(jinja, "<|end_header_id|>")) return HR_CHAT_LLAMA3;
    if (has(jinja, "<start_of_turn>")) return HR_CHAT_GEMMA;
    if (has(jinja, "<|assistant|>") && has(jinja, "<|end|>")) return HR_CHAT_PHI3;
    if (has(jinja, "<|assistant|>") && (has(jinja, "<|user|>") || has(jinja, "<|system|>"))) return HR_CHAT_ZEPHYR;
    if (has(jinja, "[INST]")) {
        if (has(jinja, "<<SYS>>")) return HR_CHAT_LLAMA2;
        if (has(jinja, "' [INST] '")) return HR_CHAT_MISTRAL_V1;
        return HR_CHAT_MISTRAL;
    }
    if (has(jinja, "'Assistant: '") && (has(jinja, "'User: '") || has(jinja, "eos_token"))) return HR_CHAT_DEEPSEEK;
    if (warning && warning_len) {
        snprintf(warning, warning_len,
                 "chat template not recognized (%.40s%s); using %s. Pick one with --chat-template NAME (%s)", jinja,
                 strlen(jinja) > 40 ? "..." : "", hr_chat_template_name(HR_CHAT_FALLBACK), hr_chat_template_names());
        for (char *p = warning; *p; p++)
            if (*p == '\n' || *p == '\r') *p = ' '; /* one line */
    }
    return HR_CHAT_FALLBACK;
}

hr_chat_template hr_chat_template_from_gguf(const hr_gguf *g, char *warning, size_t warning_len) {
    hr_gguf_str s;
    if (!g || hr_gguf_get_str(g, "tokenizer.chat_template", &s, NULL) != HR_OK) {
        if (warning && warning_len)
            snprintf(warning, warning_len,
                     "the model has no tokenizer.chat_template; using %s (override with "
                     "--chat-template NAME: %s)",
                     hr_chat_template_name(HR_CHAT_FALLBACK), hr_chat_template_names());
        return HR_CHAT_FALLBACK;
    }
    char *text = malloc(s.len + 1);
    if (!text) {
        if (warning && warning_len) snprintf(warning, warning_len, "out of memory reading the chat template");
        return HR_CHAT_FALLBACK;
    }
    memcpy(text, s.ptr, s.len);
    text[s.len] = '\0';
    hr_chat_template tpl = hr_chat_template_detect(text, warning, warning_len);
    free(text);
    return tpl;
}

/* ---- a string builder ---------------------------------------------------------------------------- */

typedef struct sb {
    char *s;
    size_t n, cap;
    bool oom;
    hr_chat_span *spans; /* where message content went (NULL: not recorded) */
    size_t n_spans, cap_spans;
    bool record;
} sb;

static void sb_putn(sb *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->oom = true;
            return;
        }
        b->s = ns, b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void sb_put(sb *b, const char *s) { sb_putn(b, s, strlen(s)); }

/* Appends message content (text a client wrote, not the template's): its byte range is recorded so
 * that the tokenizer can leave special-token text in it as plain text. */
static void sb_put_content_n(sb *b, const char *s, size_t n) {
    size_t at = b->n;
    sb_putn(b, s, n);
    if (!b->record || b->oom || n == 0) return;
    if (b->n_spans > 0 && b->spans[b->n_spans - 1].off + b->spans[b->n_spans - 1].len == at) {
        b->spans[b->n_spans - 1].len += n; /* adjacent content: one range */
        return;
    }
    if (b->n_spans == b->cap_spans) {
        size_t cap = b->cap_spans ? b->cap_spans * 2 : 16;
        hr_chat_span *ns = realloc(b->spans, cap * sizeof *ns);
        if (!ns) {
            b->oom = true;
            return;
        }
        b->spans = ns, b->cap_spans = cap;
    }
    b->spans[b->n_spans++] = (hr_chat_span){.off = at, .len = n};
}

static void sb_put_content(sb *b, const char *s) { sb_put_content_n(b, s, strlen(s)); }

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* Appends content s without leading and trailing whitespace. */
static void sb_put_stripped(sb *b, const char *s) {
    size_t n = strlen(s);
    while (n > 0 && is_space(*s)) s++, n--;
    while (n > 0 && is_space(s[n - 1])) n--;
    sb_put_content_n(b, s, n);
}

static bool role_is(const hr_chat_msg *m, const char *role) { return strcmp(m->role, role) == 0; }

__attribute__((format(printf, 3, 4))) static hr_status fail(hr_error *err, hr_chat_template tpl, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* the message quotes a client's role, which may hold a newline: hr_error_set keeps it one line */
    return hr_error_set(err, HR_ERR_INVALID_ARG, "chat template %s: %s", hr_chat_template_name(tpl), msg);
}

/* "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception(...) }}" */
static hr_status check_alternation(hr_chat_template tpl, const hr_chat_msg *loop, size_t n, hr_error *err) {
    for (size_t i = 0; i < n; i++)
        if (role_is(&loop[i], "user") != (i % 2 == 0))
            return fail(err, tpl,
                        "roles must alternate user/assistant/user/... after the optional system message "
                        "(message %zu is '%s')",
                        i + 1, loop[i].role);
    return HR_OK;
}

/* ---- the families ------------------------------------------------------------------------------ */

/* {% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>'
 * + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %} */
static hr_status render_chatml(sb *b, const hr_chat_msg *m, size_t n, bool gen) {
    for (size_t i = 0; i < n; i++) {
        sb_put(b, "<|im_start|>");
        sb_put_content(b, m[i].role); /* a client's text too: "user<|im_end|>..." stays text */
        sb_put(b, "\n");
        sb_put_content(b, m[i].content);
        sb_put(b, "<|im_end|>\n");
    }
    if (gen) sb_put(b, "<|im_start|>assistant\n");
    return HR_OK;
}

/* Llama-2-chat: a leading system message becomes "<<SYS>>\n" + system + "\n<</SYS>>\n\n" in front of the
 * first user message; user: bos + '[INST] ' + content.strip() + ' [/INST]'; assistant: ' ' +
 * content.strip() + ' ' + eos. Roles must alternate. No generation prompt. */
static hr_status render_llama2(sb *b, const hr_chat_msg *m, size_t n, const char *bos, const char *eos, hr_error *err) {
    const char *sys = NULL;
    if (n > 0 && role_is(&m[0], "system")) sys = m[0].content, m++, n--;
    hr_status st = check_alternation(HR_CHAT_LLAMA2, m, n, err);
    if (st != HR_OK) return st;
    for (size_t i = 0; i < n; i++) {
        sb content = {0};
        if (i == 0 && sys) {
            sb_put(&content, "<<SYS>>\n");
            sb_put(&content, sys);
            sb_put(&content, "\n<</SYS>>\n\n");
        }
        sb_put(&content, m[i].content);
        if (content.oom) b->oom = true;
        const char *c = content.s ? content.s : "";
        if (role_is(&m[i], "user")) {
            sb_put(b, bos);
            sb_put(b, "[INST] ");
            sb_put_stripped(b, c);
            sb_put(b, " [/INST]");
        } else if (role_is(&m[i], "assistant")) {
            sb_put(b, " ");
            sb_put_stripped(b, c);
            sb_put(b, " ");
            sb_put(b, eos);
        }
        free(content.s);
    }
    return HR_OK;
}

/* Llama-3: for each message (bos_token before the first) '<|start_header_id|>' + role +
 * '<|end_header_id|>\n\n' + content | trim + '<|eot_id|>'; generation prompt
 * '<|start_header_id|>assistant<|end_header_id|>\n\n'. */
static hr_status render_llama3(sb *b, const hr_chat_msg *m, size_t n, bool gen, const char *bos) {
    for (size_t i = 0; i < n; i++) {
        if (i == 0) sb_put(b, bos);
        sb_put(b, "<|start_header_id|>");
        sb_put_content(b, m[i].role);
        sb_put(b, "<|end_header_id|>\n\n");
        sb_put_stripped(b, m[i].content);
        sb_put(b, "<|eot_id|>");
    }
    if (gen) sb_put(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return HR_OK;
}

/* Mistral / Mixtral instruct (v0.1, v0.2): bos, then user: '[INST] ' + content + ' [/INST]', assistant:
 * content + eos; roles must alternate; other roles are rejected. The reference template also rejects a
 * system message; headroom instead folds a leading one into the first user turn as system + "\n\n" +
 * user, which is what Mistral's own later ("v1") template does. */
static hr_status render_mistral(sb *b, const hr_chat_msg *m, size_t n, const char *bos, const char *eos, bool v1,
                                hr_error *err) {
    hr_chat_template tpl = v1 ? HR_CHAT_MISTRAL_V1 : HR_CHAT_MISTRAL;
    const char *sys = NULL;
    if (n > 0 && role_is(&m[0], "system")) sys = m[0].content, m++, n--;
    hr_status st = check_alternation(tpl, m, n, err);
    if (st != HR_OK) return st;
    sb_put(b, bos);
    for (size_t i = 0; i < n; i++) {
        if (role_is(&m[i], "user")) {
            sb_put(b, v1 ? " [INST] " : "[INST] ");
            if (i == 0 && sys) {
                sb_put_content(b, sys);
                sb_put(b, "\n\n");
            }
            sb_put_content(b, m[i].content);
            sb_put(b, " [/INST]");
        } else if (role_is(&m[i], "assistant")) {
            if (v1) sb_put(b, " ");
            sb_put_content(b, m[i].content);
            sb_put(b, eos);
        } else {
            return fail(err, tpl,
                        "only user and assistant roles are supported after an optional system message "
                        "(message %zu is '%s')",
                        i + 1 + (sys ? 1 : 0), m[i].role);
        }
    }
    return HR_OK;
}

/* Phi-3: '<|system|>\n', '<|user|>\n' or '<|assistant|>\n' + content + '<|end|>\n' (other roles are
 * skipped); then '<|assistant|>\n' when asked for a generation prompt, else eos. */
static hr_status render_phi3(sb *b, const hr_chat_msg *m, size_t n, bool gen, const char *eos) {
    for (size_t i = 0; i < n; i++) {
        if (!role_is(&m[i], "system") && !role_is(&m[i], "user") && !role_is(&m[i], "assistant")) continue;
        sb_put(b, "<|");
        sb_put(b, m[i].role);
        sb_put(b, "|>\n");
        sb_put_content(b, m[i].content);
        sb_put(b, "<|end|>\n");
    }
    sb_put(b, gen ? "<|assistant|>\n" : eos);
    return HR_OK;
}

/* Gemma: bos, then per message '<start_of_turn>' + role ('assistant' -> 'model') + '\n' + content | trim +
 * '<end_of_turn>\n'; generation prompt '<start_of_turn>model\n'; roles must alternate. Gemma 1/2
 * templates reject a system message; headroom folds a leading one into the first user turn as
 * system + '\n\n' (untrimmed) in front of the trimmed content, as the Gemma 3 template does. */
static hr_status render_gemma(sb *b, const hr_chat_msg *m, size_t n, bool gen, const char *bos, hr_error *err) {
    const char *sys = NULL;
    if (n > 0 && role_is(&m[0], "system")) sys = m[0].content, m++, n--;
    hr_status st = check_alternation(HR_CHAT_GEMMA, m, n, err);
    if (st != HR_OK) return st;
    sb_put(b, bos);
    for (size_t i = 0; i < n; i++) {
        sb_put(b, "<start_of_turn>");
        sb_put_content(b, role_is(&m[i], "assistant") ? "model" : m[i].role);
        sb_put(b, "\n");
        if (i == 0 && sys) {
            sb_put_content(b, sys);
            sb_put(b, "\n\n");
        }
        sb_put_stripped(b, m[i].content);
        sb_put(b, "<end_of_turn>\n");
    }
    if (gen) sb_put(b, "<start_of_turn>model\n");
    return HR_OK;
}

/* Zephyr (rendered with trim_blocks, as Hugging Face does): '<|user|>\n', '<|system|>\n' or
 * '<|assistant|>\n' + content + eos + '\n' (other roles skipped); after the last message, when asked,
 * '<|assistant|>\n'. */
static hr_status render_zephyr(sb *b, const hr_chat_msg *m, size_t n, bool gen, const char *eos) {
    for (size_t i = 0; i < n; i++) {
        if (role_is(&m[i], "system") || role_is(&m[i], "user") || role_is(&m[i], "assistant")) {
            sb_put(b, "<|");
            sb_put(b, m[i].role);
            sb_put(b, "|>\n");
            sb_put_content(b, m[i].content);
            sb_put(b, eos);
            sb_put(b, "\n");
        }
        if (i + 1 == n && gen) sb_put(b, "<|assistant|>\n");
    }
    return HR_OK;
}

/* DeepSeek LLM / V2 chat: bos, then user: 'User: ' + content + '\n\n'; assistant: 'Assistant: ' + content
 * + eos; system: content + '\n\n'; generation prompt 'Assistant:'. */
static hr_status render_deepseek(sb *b, const hr_chat_msg *m, size_t n, bool gen, const char *bos, const char *eos) {
    sb_put(b, bos);
    for (size_t i = 0; i < n; i++) {
        if (role_is(&m[i], "user")) {
            sb_put(b, "User: ");
            sb_put_content(b, m[i].content);
            sb_put(b, "\n\n");
        } else if (role_is(&m[i], "assistant")) {
            sb_put(b, "Assistant: ");
            sb_put_content(b, m[i].content);
            sb_put(b, eos);
        } else if (role_is(&m[i], "system")) {
            sb_put_content(b, m[i].content);
            sb_put(b, "\n\n");
        }
    }
    if (gen) sb_put(b, "Assistant:");
    return HR_OK;
}

hr_status hr_chat_render(hr_chat_template tpl, const hr_chat_msg *msgs, size_t n, bool add_generation_prompt,
                         const char *bos, const char *eos, char **out, hr_error *err) {
    return hr_chat_render_spans(tpl, msgs, n, add_generation_prompt, bos, eos, out, NULL, NULL, err);
}

hr_status hr_chat_render_spans(hr_chat_template tpl, const hr_chat_msg *msgs, size_t n, bool add_generation_prompt,
                               const char *bos, const char *eos, char **out, hr_chat_span **spans, size_t *n_spans,
                               hr_error *err) {
    if (!out || (!msgs && n > 0)) return hr_error_set(err, HR_ERR_INVALID_ARG, "hr_chat_render: NULL argument");
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return hr_error_set(err, HR_ERR_INVALID_ARG, "hr_chat_render: message %zu has a NULL %s", i + 1,
                                msgs[i].role ? "content" : "role");
    if (!bos) bos = "";
    if (!eos) eos = "";
    sb b = {.record = spans != NULL};
    sb_put(&b, ""); /* an empty conversation still yields a valid string */
    hr_status st;
    switch (tpl) {
    case HR_CHAT_CHATML: st = render_chatml(&b, msgs, n, add_generation_prompt); break;
    case HR_CHAT_LLAMA2: st = render_llama2(&b, msgs, n, bos, eos, err); break;
    case HR_CHAT_LLAMA3: st = render_llama3(&b, msgs, n, add_generation_prompt, bos); break;
    case HR_CHAT_MISTRAL: st = render_mistral(&b, msgs, n, bos, eos, false, err); break;
    case HR_CHAT_MISTRAL_V1: st = render_mistral(&b, msgs, n, bos, eos, true, err); break;
    case HR_CHAT_PHI3: st = render_phi3(&b, msgs, n, add_generation_prompt, eos); break;
    case HR_CHAT_GEMMA: st = render_gemma(&b, msgs, n, add_generation_prompt, bos, err); break;
    case HR_CHAT_ZEPHYR: st = render_zephyr(&b, msgs, n, add_generation_prompt, eos); break;
    case HR_CHAT_DEEPSEEK: st = render_deepseek(&b, msgs, n, add_generation_prompt, bos, eos); break;
    default: st = hr_error_set(err, HR_ERR_INVALID_ARG, "hr_chat_render: unknown template id %d", (int)tpl); break;
    }
    if (st == HR_OK && b.oom) st = hr_error_set(err, HR_ERR_NOMEM, "chat template: out of memory");
    if (st != HR_OK) {
        free(b.s);
        free(b.spans);
        return st;
    }
    *out = b.s;
    if (spans) {
        *spans = b.spans;
        *n_spans = b.n_spans;
    }
    return HR_OK;
}

/* ---- rendering and tokenizing ------------------------------------------------------------------- */

hr_status hr_chat_tokenize_family(hr_chat_template tpl, const hr_tokenizer *tok, const hr_chat_msg *msgs, size_t n,
                                  bool special_in_content, int32_t **ids, size_t *n_ids, hr_error *err) {
    int32_t bos = hr_tokenizer_bos(tok), eos = hr_tokenizer_eos(tok);
    char *text = NULL;
    hr_chat_span *spans = NULL;
    size_t n_spans = 0;
    hr_status st = hr_chat_render_spans(tpl, msgs, n, true, bos >= 0 ? hr_tokenizer_piece(tok, bos) : NULL,
                                        eos >= 0 ? hr_tokenizer_piece(tok, eos) : NULL, &text, &spans, &n_spans, err);
    if (st) return st;
    /* markers and contents alternate: at most 2 * n_spans + 1 segments */
    hr_tok_segment *seg = malloc(sizeof *seg * (2 * n_spans + 1));
    if (!seg) {
        free(text);
        free(spans);
        return hr_error_set(err, HR_ERR_NOMEM, "chat template: out of memory");
    }
    size_t n_seg = 0, at = 0, len = strlen(text);
    for (size_t i = 0; i <= n_spans; i++) {
        size_t end = i < n_spans ? spans[i].off : len;
        if (end > at) seg[n_seg++] = (hr_tok_segment){.text = text + at, .len = end - at, .special = true};
        if (i == n_spans) break;
        seg[n_seg++] = (hr_tok_segment){.text = text + spans[i].off, .len = spans[i].len, .special = false};
        at = spans[i].off + spans[i].len;
    }
    /* the template writes BOS text itself: none is added */
    hr_tokenize_opts to = {.add_bos = false, .parse_special = special_in_content};
    st = hr_tokenizer_encode_segments(tok, seg, n_seg, &to, ids, n_ids, err);
    free(seg);
    free(spans);
    free(text);
    return st;
}
/* ---- the model's own template (the interpreter, with a family as the fallback) ------------------- */

struct hr_chat {
    hr_chat_template family; /* the fallback, and the renderer when jinja is NULL */
    hr_jinja *jinja;         /* the model's template, parsed; NULL when absent, named away or refused */
    hr_jinja *jinja_tools;   /* its tool_use template, for requests with tools; NULL when none or refused */
    hr_jinja_limits limits;
    pthread_mutex_t note_lock;
    char note[1024]; /* the first render-time fallback's reason */
};

/* The context a template sees, as JSON: messages, tools, add_generation_prompt, bos/eos_token, and
 * the extra variables. Tool-call arguments given as a JSON string holding an object become the
 * object (templates such as Llama 3.x print them with tojson; Qwen's print a string as it is). */
static hr_status build_context(const hr_chat_render_params *p, char **out, hr_error *err) {
    json_t *ctx = json_object(), *msgs = json_array();
    hr_status st = HR_OK;
    if (!ctx || !msgs) goto nomem;
    if (p->vars_json) { /* first: what follows (messages, tools, the tokens) cannot be overridden */
        json_t *vars = json_loads(p->vars_json, 0, NULL);
        if (!json_is_object(vars)) {
            json_decref(vars);
            json_decref(msgs); /* not in ctx yet */
            st = hr_error_set(err, HR_ERR_INVALID_ARG, "the template variables are not a JSON object");
            goto fail;
        }
        json_object_update(ctx, vars);
        json_decref(vars);
    }
    json_object_set_new(ctx, "messages", msgs);
    for (size_t i = 0; i < p->n_msgs; i++) {
        const hr_chat_msg *m = &p->msgs[i];
        if (!m->role) {
            st = hr_error_set(err, HR_ERR_INVALID_ARG, "chat message %zu has no role", i + 1);
            goto fail;
        }
        json_t *o = json_object();
        if (!o || json_array_append_new(msgs, o)) goto nomem;
        json_object_set_new(o, "role", json_string(m->role));
        json_object_set_new(o, "content", m->content ? json_string(m->content) : json_null());
        if (m->tool_calls_json) {
            json_error_t je;
            json_t *calls = json_loads(m->tool_calls_json, JSON_DECODE_ANY, &je);
            if (!calls || !json_is_array(calls)) {
                json_decref(calls);
                st = hr_error_set(err, HR_ERR_INVALID_ARG, "chat message %zu: tool_calls is not a JSON array", i + 1);
                goto fail;
            }
            size_t k;
            json_t *call;
            json_array_foreach(calls, k, call) {
                json_t *fn = json_object_get(call, "function"), *args = fn ? json_object_get(fn, "arguments") : NULL;
                if (json_is_string(args)) {
                    json_t *parsed = json_loads(json_string_value(args), 0, NULL);
                    if (json_is_object(parsed)) json_object_set(fn, "arguments", parsed);
                    json_decref(parsed);
                }
            }
            json_object_set_new(o, "tool_calls", calls);
        }
        if (m->tool_call_id) json_object_set_new(o, "tool_call_id", json_string(m->tool_call_id));
        if (m->name) json_object_set_new(o, "name", json_string(m->name));
    }
    if (p->tools_json) {
        json_t *tools = json_loads(p->tools_json, JSON_DECODE_ANY, NULL);
        if (!json_is_array(tools)) {
            json_decref(tools);
            st = hr_error_set(err, HR_ERR_INVALID_ARG, "tools is not a JSON array");
            goto fail;
        }
        json_object_set_new(ctx, "tools", tools);
    }
    if (p->bos) json_object_set_new(ctx, "bos_token", json_string(p->bos));
    if (p->eos) json_object_set_new(ctx, "eos_token", json_string(p->eos));
    if (!p->bos) json_object_del(ctx, "bos_token"); /* nor from the variables */
    if (!p->eos) json_object_del(ctx, "eos_token");
    json_object_set_new(ctx, "add_generation_prompt", json_boolean(p->add_generation_prompt));
    /* json_string refuses invalid UTF-8 (returns NULL, so the key is missing): say so */
    size_t i;
    json_t *o;
    json_array_foreach(msgs, i, o) {
        if (!json_object_get(o, "role") || !json_object_get(o, "content") ||
            (p->msgs[i].tool_call_id && !json_object_get(o, "tool_call_id")) ||
            (p->msgs[i].name && !json_object_get(o, "name"))) {
            st = hr_error_set(err, HR_ERR_INVALID_ARG, "chat message %zu is not valid UTF-8", i + 1);
            goto fail;
        }
    }
    /* (a BOS/EOS text that is not valid UTF-8 stays undefined, as a vocabulary without one) */
    *out = json_dumps(ctx, JSON_COMPACT);
    json_decref(ctx);
    return *out ? HR_OK : hr_error_set(err, HR_ERR_NOMEM, "out of memory");
nomem:
    st = hr_error_set(err, HR_ERR_NOMEM, "out of memory");
fail:
    json_decref(ctx);
    if (!ctx) json_decref(msgs);
    return st;
}

/* Renders with the interpreter; HR_ERR_UNSUPPORTED / HR_ERR_RANGE / HR_ERR_FORMAT mean "fall back". */
static hr_status render_jinja(const hr_chat *c, const hr_jinja *t, const hr_chat_render_params *p, char **out,
                              hr_error *err) {
    char *ctx = NULL;
    hr_status st = build_context(p, &ctx, err);
    if (st) return st;
    st = hr_jinja_render(t, ctx, &c->limits, out, NULL, err);
    free(ctx);
    return st;
}

static bool is_refusal(hr_status st) { return st == HR_ERR_UNSUPPORTED || st == HR_ERR_RANGE || st == HR_ERR_FORMAT; }

hr_status hr_chat_create(const hr_chat_params *p, hr_chat **out, char *warning, size_t warning_len, hr_error *err) {
    if (warning && warning_len) warning[0] = '\0';
    if (!p || !out) return hr_error_set(err, HR_ERR_INVALID_ARG, "hr_chat_create: NULL argument");
    hr_chat *c = calloc(1, sizeof *c);
    if (!c) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&c->note_lock, NULL);
    c->limits = p->limits;
    if (p->name) {
        c->family = hr_chat_template_by_name(p->name);
        if (c->family == HR_CHAT_UNKNOWN) {
            hr_chat_destroy(c);
            return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_CHAT_TEMPLATE, p->name,
                                      "unknown chat template '%s' (known: %s)", p->name, hr_chat_template_names());
        }
        *out = c;
        return HR_OK;
    }
    if (!p->template_text) {
        if (warning && warning_len)
            snprintf(warning, warning_len,
                     "the model has no tokenizer.chat_template; using %s (override with --chat-template NAME: %s)",
                     hr_chat_template_name(HR_CHAT_FALLBACK), hr_chat_template_names());
        c->family = HR_CHAT_FALLBACK;
        *out = c;
        return HR_OK;
    }
    size_t len = p->template_len ? p->template_len : strlen(p->template_text);
    char *text = strndup(p->template_text, len);
    if (!text) {
        hr_chat_destroy(c);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    }
    char family_warning[384];
    c->family = hr_chat_template_detect(text, family_warning, sizeof family_warning);
    free(text);
    hr_error perr = {0};
    hr_status st = hr_jinja_parse(p->template_text, len, &c->limits, &c->jinja, &perr);
    if (st == HR_OK) { /* a trial render finds what only shows when a branch runs (a filter, a method) */
        static const hr_chat_msg probe[] = {{.role = "system", .content = "You are a helpful assistant."},
                                            {.role = "user", .content = "Hello"},
                                            {.role = "assistant", .content = "Hi"},
                                            {.role = "user", .content = "How are you?"}};
        hr_chat_render_params rp = {
            .msgs = probe, .n_msgs = 4, .add_generation_prompt = true, .bos = "<s>", .eos = "</s>"};
        char *o = NULL;
        st = render_jinja(c, c->jinja, &rp, &o, &perr);
        free(o);
        if (!is_refusal(st)) st = HR_OK; /* a template may reject the probe (no system role, say): its right */
    }
    if (st == HR_ERR_NOMEM) {
        hr_chat_destroy(c);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    }
    if (st != HR_OK) {
        hr_jinja_destroy(c->jinja);
        c->jinja = NULL;
        if (warning && warning_len)
            snprintf(warning, warning_len,
                     "the chat template interpreter refused the model's template (%s); using %s%s%s", perr.msg,
                     hr_chat_template_name(c->family), family_warning[0] ? ": " : "", family_warning);
    }
    if (p->tool_use_text) { /* refused: requests with tools use the main template (or family) */
        size_t tlen = p->tool_use_len ? p->tool_use_len : strlen(p->tool_use_text);
        hr_error terr = {0};
        if (hr_jinja_parse(p->tool_use_text, tlen, &c->limits, &c->jinja_tools, &terr) != HR_OK && warning &&
            warning_len && !warning[0])
            snprintf(warning, warning_len, "the chat template interpreter refused the model's tool_use template (%s)",
                     terr.msg);
    }
    *out = c;
    return HR_OK;
}

hr_status hr_chat_create_from_gguf(const hr_gguf *g, const char *name, const hr_jinja_limits *limits, hr_chat **out,
                                   char *warning, size_t warning_len, hr_error *err) {
    hr_chat_params p = {.name = name};
    if (limits) p.limits = *limits;
    hr_gguf_str s;
    /* an empty template would render nothing: it counts as none */
    if (!name && g && hr_gguf_get_str(g, "tokenizer.chat_template", &s, NULL) == HR_OK && s.len > 0) {
        p.template_text = s.ptr;
        p.template_len = s.len;
    }
    if (!name && g && hr_gguf_get_str(g, "tokenizer.chat_template.tool_use", &s, NULL) == HR_OK && s.len > 0) {
        p.tool_use_text = s.ptr;
        p.tool_use_len = s.len;
    }
    return hr_chat_create(&p, out, warning, warning_len, err);
}

/* bos_token / eos_token in a tokenizer_config.json: a string, or an AddedToken object's "content". */
static char *config_token(json_t *v) {
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? strdup(json_string_value(v)) : NULL;
}

hr_status hr_chat_template_from_config(const char *config_json, const char *name, char **tpl, char **bos, char **eos,
                                       hr_error *err) {
    if (!config_json || !tpl)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "hr_chat_template_from_config: NULL argument");
    json_error_t je;
    json_t *cfg = json_loads(config_json, 0, &je);
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        return hr_error_set(err, HR_ERR_FORMAT, "tokenizer_config.json is not a JSON object (line %d: %s)", je.line,
                            je.text);
    }
    if (!name) name = "default";
    json_t *t = json_object_get(cfg, "chat_template"), *found = NULL;
    if (json_is_string(t)) found = t;
    size_t i;
    json_t *entry;
    if (json_is_array(t)) json_array_foreach(t, i, entry) {
            const char *n = json_string_value(json_object_get(entry, "name"));
            json_t *body = json_object_get(entry, "template");
            if (n && !strcmp(n, name) && json_is_string(body)) found = body;
        }
    if (!found) {
        bool named = json_is_array(t);
        json_decref(cfg); /* t goes with it */
        return hr_error_set(err, HR_ERR_NOT_FOUND, "tokenizer_config.json has no chat template%s%s",
                            named ? " named " : "", named ? name : "");
    }
    char *text = strdup(json_string_value(found));
    char *b = bos ? config_token(json_object_get(cfg, "bos_token")) : NULL;
    char *e = eos ? config_token(json_object_get(cfg, "eos_token")) : NULL;
    json_decref(cfg);
    if (!text) {
        free(b);
        free(e);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    }
    *tpl = text;
    if (bos) *bos = b;
    if (eos) *eos = e;
    return HR_OK;
}

void hr_chat_destroy(hr_chat *c) {
    if (!c) return;
    hr_jinja_destroy(c->jinja);
    hr_jinja_destroy(c->jinja_tools);
    pthread_mutex_destroy(&c->note_lock);
    free(c);
}

const char *hr_chat_describe(const hr_chat *c) {
    return !c ? "none" : c->jinja ? "the model's chat template" : hr_chat_template_name(c->family);
}

const char *hr_chat_fallback_note(const hr_chat *c) {
    if (!c) return "";
    pthread_mutex_lock((pthread_mutex_t *)&c->note_lock);
    const char *n = c->note;
    pthread_mutex_unlock((pthread_mutex_t *)&c->note_lock);
    return n;
}

hr_status hr_chat_apply(hr_chat *c, const hr_chat_render_params *p, char **out, hr_error *err) {
    if (!c || !p || !out || (!p->msgs && p->n_msgs))
        return hr_error_set(err, HR_ERR_INVALID_ARG, "hr_chat_apply: NULL argument");
    const hr_jinja *t = p->tools_json && c->jinja_tools ? c->jinja_tools : c->jinja;
    if (t) {
        hr_error jerr = {0};
        hr_status st = render_jinja(c, t, p, out, &jerr);
        if (!is_refusal(st)) {
            if (st && err) *err = jerr;
            return st;
        }
        pthread_mutex_lock(&c->note_lock);
        if (!c->note[0])
            snprintf(c->note, sizeof c->note,
                     "the chat template interpreter gave up on a conversation (%s); rendered with %s", jerr.msg,
                     hr_chat_template_name(c->family));
        pthread_mutex_unlock(&c->note_lock);
    }
    return hr_chat_render(c->family, p->msgs, p->n_msgs, p->add_generation_prompt, p->bos, p->eos, out, err);
}

/* ---- tokenizing the model's template's output ----------------------------------------------------- */

#define FENCE_OPEN  "\xEF\xA3\xB0" /* U+F8F0 */
#define FENCE_CLOSE "\xEF\xA3\xB1" /* U+F8F1 */

static bool is_fence(const char *s, size_t n) {
    return n >= 3 && (!memcmp(s, FENCE_OPEN, 3) || !memcmp(s, FENCE_CLOSE, 3));
}

/* text with every control-token text fenced and any fence character a client sent dropped (malloc'd). */
static char *fence_specials(const hr_tokenizer *tok, const char *text) {
    size_t n = strlen(text), cap = n + 1, o = 0;
    char *out = malloc(cap);
    if (!out) return NULL;
    for (size_t i = 0; i < n;) {
        if (is_fence(text + i, n - i)) {
            i += 3;
            continue;
        }
        size_t m = hr_tokenizer_control_match(tok, text + i, n - i);
        size_t need = o + (m ? m + 6 : 1) + 1;
        if (need > cap) {
            cap = need * 2;
            char *g = realloc(out, cap);
            if (!g) {
                free(out);
                return NULL;
            }
            out = g;
        }
        if (m) {
            memcpy(out + o, FENCE_OPEN, 3);
            memcpy(out + o + 3, text + i, m);
            memcpy(out + o + 3 + m, FENCE_CLOSE, 3);
            o += m + 6;
            i += m;
        } else {
            out[o++] = text[i++];
        }
    }
    out[o] = '\0';
    return out;
}

/* The rendered text as segments: fenced ranges plain, the rest special; the fences themselves out. */
static hr_status encode_fenced(const hr_tokenizer *tok, const char *text, int32_t **ids, size_t *n_ids, hr_error *err) {
    size_t n = strlen(text), n_seg = 0;
    hr_tok_segment *seg = malloc(sizeof *seg * (n / 3 + 2));
    if (!seg) return hr_error_set(err, HR_ERR_NOMEM, "chat template: out of memory");
    bool fenced = false;
    size_t at = 0;
    for (size_t i = 0; i <= n;) {
        bool end = i == n, fence = !end && is_fence(text + i, n - i);
        if (!end && !fence) {
            i++;
            continue;
        }
        if (i > at) seg[n_seg++] = (hr_tok_segment){.text = text + at, .len = i - at, .special = !fenced};
        if (end) break;
        fenced = !memcmp(text + i, FENCE_OPEN, 3);
        i += 3;
        at = i;
    }
    hr_tokenize_opts to = {.add_bos = false, .parse_special = false};
    hr_status st = hr_tokenizer_encode_segments(tok, seg, n_seg, &to, ids, n_ids, err);
    free(seg);
    return st;
}

hr_chat_template hr_chat_family(const hr_chat *c) { return c->family; }

hr_status hr_chat_tokenize(hr_chat *c, const hr_tokenizer *tok, const hr_chat_render_params *p, bool special_in_content,
                           int32_t **ids, size_t *n_ids, hr_error *err) {
    if (!c->jinja && !special_in_content)
        return hr_chat_tokenize_family(c->family, tok, p->msgs, p->n_msgs, false, ids, n_ids, err);
    hr_chat_render_params q = *p;
    hr_chat_msg *msgs = NULL;
    char **owned = NULL;
    hr_status st = HR_OK;
    if (!special_in_content && p->n_msgs > 0) {
        msgs = calloc(p->n_msgs, sizeof *msgs);
        owned = calloc(p->n_msgs, sizeof *owned);
        if (!msgs || !owned) st = hr_error_set(err, HR_ERR_NOMEM, "chat template: out of memory");
        for (size_t i = 0; st == HR_OK && i < p->n_msgs; i++) {
            msgs[i] = p->msgs[i];
            if (!p->msgs[i].content) continue;
            if (!(owned[i] = fence_specials(tok, p->msgs[i].content)))
                st = hr_error_set(err, HR_ERR_NOMEM, "chat template: out of memory");
            msgs[i].content = owned[i];
        }
        q.msgs = msgs;
    }
    char *text = NULL;
    if (st == HR_OK) st = hr_chat_apply(c, &q, &text, err);
    if (st == HR_OK) {
        if (special_in_content) {
            hr_tokenize_opts to = {.add_bos = false, .parse_special = true};
            st = hr_tokenizer_encode_alloc(tok, text, strlen(text), &to, ids, n_ids, err);
        } else {
            st = encode_fenced(tok, text, ids, n_ids, err);
        }
    }
    free(text);
    for (size_t i = 0; owned && i < p->n_msgs; i++) free(owned[i]);
    free(owned);
    free(msgs);
    return st;
}

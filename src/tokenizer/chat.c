/* chat.c: chat template recognition and rendering (see chat.h). Each renderer follows its family's
 * reference Jinja template statement by statement; the comment above each quotes what it reproduces.
 * Jinja's `trim` filter and Python's str.strip() are both implemented by strip() (ASCII whitespace). */
#include "tokenizer/chat.h"

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

hr_status hr_chat_tokenize(hr_chat_template tpl, const hr_tokenizer *tok, const hr_chat_msg *msgs, size_t n,
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

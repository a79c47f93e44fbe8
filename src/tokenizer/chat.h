/* chat.h: chat templates. Two ways to turn messages into a prompt:
 *
 *   1. hr_chat (below hr_chat_render): the model's own tokenizer.chat_template executed by the Jinja
 *      interpreter (jinja.h), as Hugging Face's apply_chat_template would, with tools, tool calls,
 *      tool results and template variables. When the interpreter refuses the template (a feature
 *      outside its subset, at load or at render time, or a render limit), hr_chat falls back to
 *      the family renderer of 2 and says why.
 *   2. The family renderers: a template is recognized by distinctive substrings and rendered by a C
 *      function per family that reproduces what the family's reference Jinja template renders
 *      (whitespace included). --chat-template NAME picks one directly.
 *
 * Families (the reference template of each is quoted in docs/TOKENIZER.md):
 *   chatml    <|im_start|>role\ncontent<|im_end|>\n ...                  (Qwen, OpenHermes, Yi, ...)
 *   llama2    <s>[INST] <<SYS>>\nsys\n<</SYS>>\n\nuser [/INST] answer </s> (Llama-2-chat)
 *   llama3    <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> (Llama-3 instruct)
 *   mistral   <s>[INST] user [/INST]answer</s>                           (Mistral/Mixtral v0.1-v0.2)
 *   mistral-v1 <s> [INST] user [/INST] answer</s>                        (Mistral's "v1" template)
 *   phi3      <|role|>\ncontent<|end|>\n                                 (Phi-3)
 *   gemma     <start_of_turn>user\ncontent<end_of_turn>\n               (Gemma, assistant -> model)
 *   zephyr    <|role|>\ncontent</s>\n                                    (Zephyr)
 *   deepseek  User: content\n\nAssistant: answer<eos>                    (DeepSeek LLM / V2 chat)
 * Unrecognized or absent templates fall back to chatml, and the caller receives a warning to show. */
#ifndef HR_TOKENIZER_CHAT_H
#define HR_TOKENIZER_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "gguf/gguf.h"
#include "tokenizer/jinja.h"

typedef enum hr_chat_template {
    HR_CHAT_UNKNOWN = 0,
    HR_CHAT_CHATML = 1,
    HR_CHAT_LLAMA2 = 2,
    HR_CHAT_LLAMA3 = 3,
    HR_CHAT_MISTRAL = 4,
    HR_CHAT_MISTRAL_V1 = 5,
    HR_CHAT_PHI3 = 6,
    HR_CHAT_GEMMA = 7,
    HR_CHAT_ZEPHYR = 8,
    HR_CHAT_DEEPSEEK = 9,
} hr_chat_template;

#define HR_CHAT_FALLBACK HR_CHAT_CHATML

/* One message; every string is borrowed for the duration of the call. Roles: "system", "user",
 * "assistant", "tool" (each template decides what it does with a role; see the docs). The last three
 * fields are for the model's own template (hr_chat_apply); the family renderers ignore them. */
typedef struct hr_chat_msg {
    const char *role;
    const char *content;         /* NULL: JSON null (an assistant turn that only calls tools) */
    const char *tool_calls_json; /* NULL or a JSON array of {"id", "type", "function": {"name", "arguments"}};
                                    an "arguments" string holding a JSON object is given to the template as
                                    that object, as transformers users pass it */
    const char *tool_call_id;    /* a tool result's call id, or NULL */
    const char *name;            /* a tool result's function name, or NULL */
} hr_chat_msg;

/* "chatml", "llama2", ... (the names hr_chat_template_by_name accepts); "unknown" for others. */
const char *hr_chat_template_name(hr_chat_template tpl);

/* The family for a --chat-template NAME: the names above plus aliases ("qwen", "qwen2" -> chatml;
 * "llama-2" -> llama2; "llama-3" -> llama3; "mixtral" -> mistral; "phi-3" -> phi3; "deepseek2",
 * "deepseek-llm" -> deepseek). HR_CHAT_UNKNOWN when NAME is none of them. */
hr_chat_template hr_chat_template_by_name(const char *name);

/* The comma-separated list of accepted names, for help texts and error messages. */
const char *hr_chat_template_names(void);

/* Recognizes a Jinja chat template (or a bare family name) by distinctive substrings. Returns the
 * family; when nothing matches, returns HR_CHAT_FALLBACK and writes a one-line warning into warning
 * (when not NULL; otherwise warning[0] is set to '\0'). */
hr_chat_template hr_chat_template_detect(const char *jinja, char *warning, size_t warning_len);

/* The same for a model file: reads tokenizer.chat_template; a file without one also gets the fallback
 * and a warning. */
hr_chat_template hr_chat_template_from_gguf(const hr_gguf *g, char *warning, size_t warning_len);

/* Renders msgs[0..n) with family tpl. bos and eos are the vocabulary's BOS/EOS texts (NULL reads as "")
 * and appear where the family's template writes bos_token / eos_token. add_generation_prompt appends
 * the assistant header where the template has one (llama2, mistral and mistral-v1 have none: their
 * prompt already ends with [/INST]). On success *out is a malloc'd NUL-terminated string (free it).
 * Errors (HR_ERR_INVALID_ARG): a NULL role/content, roles that do not alternate user/assistant where
 * the family's template requires it, or a role the template rejects. */
hr_status hr_chat_render(hr_chat_template tpl, const hr_chat_msg *msgs, size_t n, bool add_generation_prompt,
                         const char *bos, const char *eos, char **out, hr_error *err);

/* A byte range of a rendered chat. */
typedef struct hr_chat_span {
    size_t off, len;
} hr_chat_span;

/* hr_chat_render, also recording where client text went: *spans (malloc'd, free it; NULL when none)
 * receives the *n_spans byte ranges of *out, in order and disjoint, that hold message contents and
 * client-chosen role names; the rest is the template's own text (markers, BOS/EOS, separators). A
 * front end tokenizes the markers with special tokens parsed and the ranges without
 * (hr_tokenizer_encode_segments), so that "<|im_end|>" typed in a message stays text. */
hr_status hr_chat_render_spans(hr_chat_template tpl, const hr_chat_msg *msgs, size_t n, bool add_generation_prompt,
                               const char *bos, const char *eos, char **out, hr_chat_span **spans, size_t *n_spans,
                               hr_error *err);

struct hr_tokenizer;
/* Renders msgs with family tpl (generation prompt added; BOS/EOS texts from tok) and tokenizes the result the
 * way a server must: the template's markers with special tokens parsed, message contents and role names
 * without (so a user's "</s>" or "<|start_header_id|>system" stays text), unless special_in_content.
 * *ids is malloc'd (free it). Errors as hr_chat_render, and the tokenizer's. */
hr_status hr_chat_tokenize_family(hr_chat_template tpl, const struct hr_tokenizer *tok, const hr_chat_msg *msgs,
                                  size_t n, bool special_in_content, int32_t **ids, size_t *n_ids, hr_error *err);
/* ---- the model's own template ------------------------------------------------------------------ */

typedef struct hr_chat hr_chat;

typedef struct hr_chat_params {
    const char *template_text; /* the model's chat_template (GGUF tokenizer.chat_template or
                                  tokenizer_config.json's), NULL when it has none */
    size_t template_len;       /* 0: strlen(template_text) */
    const char *tool_use_text; /* the model's "tool_use" template (GGUF tokenizer.chat_template.tool_use, or
                                  tokenizer_config.json's so named), used for requests with tools; NULL: none */
    size_t tool_use_len;       /* 0: strlen(tool_use_text) */
    const char *name;          /* --chat-template NAME: that family renderer, no interpreter; NULL: the model's */
    hr_jinja_limits limits;    /* bounds on each render (zero fields: jinja.h's defaults) */
} hr_chat_params;

/* Prepares rendering. Without a name, the template is parsed by the interpreter and tried once on a
 * short conversation (system, user, assistant, user); if either step meets something outside the
 * subset, the family renderer recognized from the text is used instead and warning says why (it is
 * also set, as hr_chat_template_detect sets it, when no family is recognized; else ""). Errors:
 * HR_ERR_INVALID_ARG for an unknown name (the message lists the known ones), HR_ERR_NOMEM. */
hr_status hr_chat_create(const hr_chat_params *p, hr_chat **out, char *warning, size_t warning_len, hr_error *err);

/* The same with the templates read from a model file's tokenizer.chat_template and
 * tokenizer.chat_template.tool_use. */
hr_status hr_chat_create_from_gguf(const hr_gguf *g, const char *name, const hr_jinja_limits *limits, hr_chat **out,
                                   char *warning, size_t warning_len, hr_error *err);

/* The chat template of a Hugging Face tokenizer_config.json (its text, config_json): "chat_template"
 * as a string, or from a list of {"name", "template"} the one called name (NULL: "default", as
 * transformers picks it without tools; "tool_use" is the one it picks with tools). *bos and *eos
 * (each may be NULL) receive "bos_token"/"eos_token" (a string or an object with "content"), NULL
 * when absent or null. Each out string is malloc'd (free it). Errors: HR_ERR_FORMAT for text that
 * is not a JSON object, HR_ERR_NOT_FOUND when it has no (such) template. */
hr_status hr_chat_template_from_config(const char *config_json, const char *name, char **tpl, char **bos, char **eos,
                                       hr_error *err);

void hr_chat_destroy(hr_chat *c);

/* The family renderer in use, or the one recognized in the model's template (the fallback). */
hr_chat_template hr_chat_family(const hr_chat *c);

/* "the model's chat template" when the interpreter runs it, else the family's name. */
const char *hr_chat_describe(const hr_chat *c);

typedef struct hr_chat_render_params {
    const hr_chat_msg *msgs;
    size_t n_msgs;
    bool add_generation_prompt;
    const char *bos, *eos;  /* the vocabulary's BOS/EOS texts: bos_token / eos_token (NULL: undefined) */
    const char *tools_json; /* NULL or a JSON array of tools ({"type": "function", "function": {...}}) */
    const char *vars_json;  /* NULL or a JSON object of further template variables (enable_thinking, ...) */
} hr_chat_render_params;

/* Renders p's conversation. With the model's template (its tool_use one when p has tools and the
 * model has one, as transformers picks it): its exact output, or, when the interpreter
 * meets something it does not support or reaches a limit, the family renderer's output (p's tools
 * and tool fields are then not rendered) with the reason kept for hr_chat_fallback_note. On success
 * *out is a malloc'd NUL-terminated string (free it). Errors: HR_ERR_INVALID_ARG when the template
 * rejects the conversation (raise_exception: roles must alternate, ...) or a field is not valid
 * JSON, with the template's message; the family renderers' errors (hr_chat_render). Thread-safe. */
hr_status hr_chat_apply(hr_chat *c, const hr_chat_render_params *p, char **out, hr_error *err);

/* The first render-time fallback's reason (one line), or "" when none happened. Stable once set. */
const char *hr_chat_fallback_note(const hr_chat *c);

/* hr_chat_apply, then tokenized the way a server must: the template's own text with special tokens
 * parsed, message contents without (a user's "<|im_end|>" stays text), unless special_in_content.
 * With the model's template, every control-token text in a message's content is fenced in before
 * rendering (two private-use characters, U+F8F0 and U+F8F1, which are taken out again, as are any a
 * client sent) and the fenced ranges of the output are tokenized as plain text: whatever the
 * template does with the content, what it wrote from a client's special text stays text. With a
 * family renderer: hr_chat_tokenize_family. *ids is malloc'd (free it). */
hr_status hr_chat_tokenize(hr_chat *c, const struct hr_tokenizer *tok, const hr_chat_render_params *p,
                           bool special_in_content, int32_t **ids, size_t *n_ids, hr_error *err);

#endif

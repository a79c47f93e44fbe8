/* chat.h: chat templates. A GGUF's tokenizer.chat_template (Jinja text) is recognized by distinctive
 * substrings and rendered by a C function per family that reproduces what the family's reference
 * Jinja template renders (whitespace included); no Jinja interpreter is involved.
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

/* One message; both strings are borrowed for the duration of the call. Roles: "system", "user",
 * "assistant" (each family's template decides what it does with other roles; see the docs). */
typedef struct hr_chat_msg {
    const char *role;
    const char *content;
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
/* Renders msgs with tpl (generation prompt added; BOS/EOS texts from tok) and tokenizes the result the
 * way a server must: the template's markers with special tokens parsed, message contents and role names
 * without (so a user's "</s>" or "<|start_header_id|>system" stays text), unless special_in_content.
 * *ids is malloc'd (free it). Errors as hr_chat_render, and the tokenizer's. */
hr_status hr_chat_tokenize(hr_chat_template tpl, const struct hr_tokenizer *tok, const hr_chat_msg *msgs, size_t n,
                           bool special_in_content, int32_t **ids, size_t *n_ids, hr_error *err);

#endif

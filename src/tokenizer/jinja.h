/* jinja.h: an interpreter for the subset of Jinja that chat templates use, so that a model's own
 * tokenizer.chat_template renders a conversation the way Hugging Face's apply_chat_template does
 * (Jinja2 with trim_blocks and lstrip_blocks, autoescape off, HF's tojson and raise_exception).
 *
 * Supported (docs/TOKENIZER.md lists it in full): {{ }}, {% %}, {# #} with -/+ whitespace control;
 * statements if/elif/else, for (tuple targets, `if` filter, else, loop.*), set (also ns.attr and
 * block set), macro (defaults, caller), call, filter blocks, break/continue, generation; expressions
 * with Python's arithmetic, comparison, `in`, `~`, ternaries, slicing, lists, dicts, tuples; the
 * filters and tests and the string/dict methods that chat templates call; the globals range,
 * namespace, raise_exception and strftime_now.
 *
 * Rendering is bounded: a step count, an output size, a memory total and a nesting depth, each a
 * clean error (HR_ERR_RANGE) rather than a stall. A template that uses something outside the
 * subset fails with HR_ERR_UNSUPPORTED (at parse time where it can be seen then); a template that
 * calls raise_exception fails with HR_ERR_INVALID_ARG and its message. */
#ifndef HR_TOKENIZER_JINJA_H
#define HR_TOKENIZER_JINJA_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef struct hr_jinja hr_jinja;

/* Bounds on one render; a zero field takes the default in brackets. */
typedef struct hr_jinja_limits {
    uint64_t max_steps;      /* evaluation steps (nodes, loop turns, scanned bytes / 64) [2,000,000] */
    size_t max_output_bytes; /* the rendered text [4 MiB] */
    size_t max_memory_bytes; /* every value a render creates, together [64 MiB] */
    int max_depth;           /* nesting of expressions, statements and macro calls [200] */
    int64_t now_unix;        /* the clock strftime_now reads (local time); 0 = time(NULL) */
} hr_jinja_limits;

/* Parses template text src[0..len) (need not be NUL-terminated). On success *out owns a copy of
 * everything it needs. Errors: HR_ERR_FORMAT for a syntax error (message with the line number),
 * HR_ERR_UNSUPPORTED for a statement, filter, test or global outside the subset, HR_ERR_RANGE when
 * the template nests deeper than limits->max_depth (limits may be NULL). */
hr_status hr_jinja_parse(const char *src, size_t len, const hr_jinja_limits *limits, hr_jinja **out, hr_error *err);

void hr_jinja_destroy(hr_jinja *t);

/* Renders t with the variables of context_json, a JSON object (its keys become the template's
 * globals: messages, tools, add_generation_prompt, bos_token, ...). On success *out is a malloc'd
 * NUL-terminated string (free it) and *out_len (when not NULL) its length. Errors: HR_ERR_FORMAT for
 * context_json that is not a JSON object; HR_ERR_INVALID_ARG when the template raised an exception
 * or failed on the data (a type error, an undefined variable's attribute); HR_ERR_UNSUPPORTED for a
 * filter, method or test outside the subset met at run time; HR_ERR_RANGE for a limit reached;
 * HR_ERR_NOMEM. A render never changes t: one template may be rendered from several threads. */
hr_status hr_jinja_render(const hr_jinja *t, const char *context_json, const hr_jinja_limits *limits, char **out,
                          size_t *out_len, hr_error *err);

#endif

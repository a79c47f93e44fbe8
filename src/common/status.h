/* status.h: status codes and the error record every fallible headroom call fills.
 *
 * Contract used across the code base: a fallible function returns hr_status; on HR_OK it has set its
 * out-parameters, on any other code it has set none of them and (when `err` is not NULL) has written
 * one readable line into err->msg saying what was expected, what was found, and a hint. Library code
 * never prints and never exits; the CLI prints err->msg, the server turns the code into HTTP.
 *
 * Messages speak of the domain ("the KV budget", "max tokens"), never of a front end's spelling of it
 * (a CLI flag, a JSON field): when one setting or request value is at fault, err->param says which
 * (and err->value what it was), and the front end names its own flag or field from that code
 * (cli/errors.c, server/openai.c). Nothing ever searches the text of a message. */
#ifndef HR_COMMON_STATUS_H
#define HR_COMMON_STATUS_H

#include <stddef.h>

typedef enum hr_status {
    HR_OK = 0,
    HR_ERR_IO = 1,          /* open/read/write/mmap failed */
    HR_ERR_FORMAT = 2,      /* malformed input (file, text, request) */
    HR_ERR_UNSUPPORTED = 3, /* well-formed but not something headroom handles */
    HR_ERR_NOMEM = 4,       /* an allocation failed */
    HR_ERR_INVALID_ARG = 5, /* a caller passed a bad value (flag, option, request field) */
    HR_ERR_RANGE = 6,       /* a value is outside what is allowed (prompt longer than ctx, ...) */
    HR_ERR_BUDGET = 7,      /* the memory budget cannot hold what was asked, now or ever */
    HR_ERR_NOT_FOUND = 8,   /* a key, tensor or name is absent */
    HR_ERR_FULL = 9,        /* a bounded queue or pool is full right now; retry later */
    HR_ERR_CANCELLED = 10,  /* the work was cancelled */
    HR_ERR_INTERNAL = 11,   /* an invariant broke: a bug */
} hr_status;

/* What an error is about: a setting or a request value, in the domain's terms. Front ends map each
 * to their own name for it (a flag, a JSON field). Explicit values; only grows at the end. */
typedef enum hr_param {
    HR_PARAM_NONE = 0,               /* not one setting (a file, an invariant, memory, ...) */
    HR_PARAM_KV_BUDGET = 1,          /* bytes for the KV cache */
    HR_PARAM_MEM_LIMIT = 2,          /* bytes for the whole process */
    HR_PARAM_CONTEXT = 3,            /* the context length, in tokens */
    HR_PARAM_CONTEXT_EXTEND = 4,     /* leave to run past the model's trained context */
    HR_PARAM_MAX_TOKENS = 5,         /* the most tokens a request may generate */
    HR_PARAM_PROMPT = 6,             /* the prompt (its tokens, text or messages) */
    HR_PARAM_KV_FORMAT = 7,          /* the K/V storage formats */
    HR_PARAM_BLOCK_SIZE = 8,         /* tokens per KV block */
    HR_PARAM_KV_POLICY = 9,          /* the KV retention policy */
    HR_PARAM_SWAP_SPACE = 10,        /* host bytes for swapped-out KV blocks */
    HR_PARAM_STEP_LOG = 11,          /* the per-step log file */
    HR_PARAM_TEMPERATURE = 12,       /* sampling temperature */
    HR_PARAM_TOP_P = 13,             /* nucleus sampling mass */
    HR_PARAM_TOP_K = 14,             /* top-k cut */
    HR_PARAM_MIN_P = 15,             /* min-p cut */
    HR_PARAM_REPEAT_PENALTY = 16,    /* multiplicative repetition penalty */
    HR_PARAM_PRESENCE_PENALTY = 17,  /* additive presence penalty */
    HR_PARAM_FREQUENCY_PENALTY = 18, /* additive frequency penalty */
    HR_PARAM_PENALTY_WINDOW = 19,    /* how many recent tokens the penalties look at */
    HR_PARAM_LOGIT_BIAS = 20,        /* per-token logit bias */
    HR_PARAM_STOP = 21,              /* stop strings */
    HR_PARAM_CHOICES = 22,           /* completions per request */
    HR_PARAM_TOP_LOGPROBS = 23,      /* alternatives reported per token */
    HR_PARAM_OUTPUT_FORMAT = 24,     /* a constraint on the output (JSON Schema, regex, grammar, choice) */
    HR_PARAM_CHAT_TEMPLATE = 25,     /* the chat template */
    HR_PARAM_MAX_RUNNING = 26,       /* sequences run at once */
    HR_PARAM_QUEUE = 27,             /* the waiting queue's bound */
    HR_PARAM_QUANT_MIX = 28,         /* a model's per-tensor quantization mix */
    HR_PARAM_COUNT                   /* not a parameter: how many codes there are */
} hr_param;

#define HR_ERROR_MSG_MAX   512
#define HR_ERROR_VALUE_MAX 64

typedef struct hr_error {
    hr_status code;
    hr_param param;                 /* what was at fault; HR_PARAM_NONE when not one setting */
    hr_param also;                  /* a second setting the message offers as the other remedy, or NONE */
    char value[HR_ERROR_VALUE_MAX]; /* the offending value as text ("40.0 KiB", "0"), "" when none */
    char msg[HR_ERROR_MSG_MAX];
} hr_error;

/* Records code and a printf-style message in err (NULL allowed) and returns code, so that
 * `return hr_error_set(err, HR_ERR_FORMAT, "...")` reads naturally. The error is about no parameter. */
hr_status hr_error_set(hr_error *err, hr_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* As hr_error_set, for an error about `param` whose offending value is `value` (NULL or "": none). */
hr_status hr_error_set_param(hr_error *err, hr_status code, hr_param param, const char *value, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* As hr_error_set_param, when the message offers a second setting (`also`) as the other remedy
 * ("raise the KV budget or lower the context length"). */
hr_status hr_error_set_params(hr_error *err, hr_status code, hr_param param, hr_param also, const char *value,
                              const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* Says which parameter (and value) an error set by a lower layer is about, keeping its code and
 * message: a caller that knows the context (the runtime parsing a policy it was given) names it. */
void hr_error_about(hr_error *err, hr_param param, const char *value);

/* Messages are one line: control characters (a newline in quoted input, say) become '?'.
 * hr_error_set and hr_error_prefix apply it; the server's own error records too. */
void hr_error_oneline(char *msg);

/* Prefixes the message already in err with "prefix: " (for adding context while unwinding). */
void hr_error_prefix(hr_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void hr_error_clear(hr_error *err);

/* Short stable name of a code: "io", "format", "unsupported", ... */
const char *hr_status_name(hr_status code);

/* The domain's name of a parameter, as messages write it ("KV budget", "max tokens"); "" for
 * HR_PARAM_NONE and unknown codes. */
const char *hr_param_name(hr_param param);

#endif

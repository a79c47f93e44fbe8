/* session.h: the command-line layer over the runtime (src/runtime): the flags shared by run, eval and
 * serve, a runtime opened from them, and running any number of prompts concurrently through it on
 * this thread (streaming output for a single prompt), with the CLI's printing and JSON. */
#ifndef HR_CLI_SESSION_H
#define HR_CLI_SESSION_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "cli/errors.h"
#include "runtime/runtime.h"
#include "tokenizer/tokenizer.h"

#define HR_SESSION_MAX_STOP 8

typedef struct hr_session_opts {
    hr_runtime_params rt; /* what the runtime opens: the option table (cli/options.c) writes the flags
                             into it directly; kv_seqs and prefault are set at open */
    hr_rt_sampling sampling;
    int n_predict;
    bool no_bos, ignore_eos;
    const char *stop[HR_SESSION_MAX_STOP];
    int n_stop;
    int n_prompts_hint; /* prompts this run will submit: sizes the default budget */
    bool chat;          /* each prompt is a user message rendered with the chat template */
    const char *system; /* --system: a system message before it (chat mode) */
    const char *cmd;    /* the command's name for messages ("run") */
    FILE *warn;         /* where warnings found while submitting prompts go (a -n clamped by the
                           context), one line each, before any output; NULL: nowhere */
} hr_session_opts;

/* The runtime's and the sampler's defaults; the option table's (hr_opts_defaults) go on top. */
hr_session_opts hr_session_default_opts(void);

/* The runtime's parameters of these options (run and serve open it the same way); kv_seqs: the
 * sequences of --ctx the default budget holds. */
hr_runtime_params hr_session_runtime_params(const hr_session_opts *o, int kv_seqs);

typedef struct hr_session hr_session;

/* On failure *bad_option (when not NULL) tells whether an option value is at fault (one this model
 * cannot use: --ctx past the trained context, --kv-type with --block-size, --kv-budget, --kv-policy,
 * --chat-template...: exit 2) rather than a file, memory or the machine (exit 1). */
hr_status hr_session_open(const hr_session_opts *o, hr_session **out, bool *bad_option, hr_error *err);
void hr_session_close(hr_session *s); /* NULL allowed */

hr_runtime *hr_session_runtime(hr_session *s); /* the runtime underneath (the server opens its own) */
const hr_session_opts *hr_session_options(const hr_session *s);
/* Startup warnings for the user (an unrecognized chat template and the fallback used, --ctx past the
 * trained context), one per line ('\n'-separated, no trailing newline), or "". */
const char *hr_session_warning(const hr_session *s);
int hr_session_n_ctx(const hr_session *s); /* the context in use (--ctx, or the model's capped at 4096) */

typedef struct hr_generation {
    hr_status status; /* HR_OK, or why this prompt was refused or failed (error holds the message) */
    char error[HR_CLI_ERROR_MAX];
    int32_t *prompt_ids;
    int n_prompt;
    int32_t *ids; /* completion ids */
    int n_ids;
    char *text; /* completion text (stop string removed) */
    size_t text_len;
    const char *finish_reason;          /* "stop" (EOS or stop string), "length", "cancelled", "error" */
    const char *limit;                  /* with "length": "context" (the context ended it before -n) or
                                           "max_tokens" (-n); NULL otherwise */
    int max_tokens;                     /* completion tokens allowed: -n, or less when the context is shorter */
    bool ctx_limited;                   /* max_tokens < -n because prompt + -n exceed the context */
    uint64_t seed;                      /* the sampler seed of this prompt (hr_prompt_seed of --seed) */
    double prompt_seconds, gen_seconds; /* submit -> first token, first token -> finish */
    uint64_t kv_bytes_peak;
    hr_rt_seq_ledger ledger;
    hr_rt_request_stats stats;
} hr_generation;

/* Runs every prompt concurrently through the engine until all are final; g[i] receives prompt i's
 * result; prompt i samples with hr_prompt_seed(--seed, i). With one prompt and out != NULL, its text streams to out as
 * it is generated. Returns non-OK only when the run as a whole cannot proceed; with a single prompt, also when that
 * prompt was refused or failed (err then holds its message). */
hr_status hr_session_generate_many(hr_session *s, const char *const *prompts, int n, FILE *out, hr_generation *g,
                                   hr_error *err);
/* One prompt (the single-prompt form of the above). */
hr_status hr_session_generate(hr_session *s, const char *prompt, FILE *out, hr_generation *g, hr_error *err);
void hr_generation_free(hr_generation *g);
void hr_generation_print_stats(const hr_session *s, const hr_generation *g, FILE *f);
/* Aggregate figures of a multi-prompt run: requests/s, tokens/s, peak concurrency, preemptions. */
void hr_session_print_engine_stats(hr_session *s, const hr_generation *g, int n, double seconds, FILE *f);
json_t *hr_generation_to_json(const hr_session *s, const hr_generation *g);
json_t *hr_session_engine_json(hr_session *s, double seconds);
void hr_session_print_ledger(hr_session *s, FILE *f);

#endif

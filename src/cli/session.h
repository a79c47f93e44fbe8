/* session.h: what `headroom run` and `headroom eval` share: loading a model (or the built-in demo),
 * its tokenizer, a KV pool sized from --kv-budget/--ctx, a forward context, and a one-sequence
 * generation loop with streaming output and stop strings. */
#ifndef HR_CLI_SESSION_H
#define HR_CLI_SESSION_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kv/kv.h"
#include "model/model.h"
#include "sampler/sampler.h"
#include "tokenizer/tokenizer.h"

#define HR_SESSION_MAX_STOP 8

typedef struct hr_session_opts {
    const char *model_path; /* NULL: the built-in demo model */
    int n_ctx;              /* 0: the model's, capped at 4096 */
    uint64_t kv_budget;     /* 0: what one n_ctx sequence needs */
    hr_kv_format k_format, v_format;
    int block_size;
    int n_batch;
    int n_threads;
    const char *isa;
    hr_sampler_params sampling;
    int n_predict;
    bool no_bos, ignore_eos;
    const char *stop[HR_SESSION_MAX_STOP];
    int n_stop;
} hr_session_opts;

hr_session_opts hr_session_default_opts(void);

/* Parses the flags shared by run and eval at argv[*i]. Returns false when argv[*i] is not one of them.
 * When it is: on success *value is non-NULL, on a bad value it prints one line and sets *value NULL. */
bool hr_session_parse_common(hr_session_opts *o, const char *cmd, int argc, char **argv, int *i, const char **value);

typedef struct hr_session hr_session;

hr_status hr_session_open(const hr_session_opts *o, hr_session **out, hr_error *err);
void hr_session_close(hr_session *s);

const hr_model *hr_session_model(const hr_session *s);
const hr_tokenizer *hr_session_tokenizer(const hr_session *s);
hr_kv_pool *hr_session_kv(hr_session *s);
hr_model_ctx *hr_session_ctx(hr_session *s);
const hr_session_opts *hr_session_options(const hr_session *s);

typedef struct hr_generation {
    int32_t *prompt_ids;
    int n_prompt;
    int32_t *ids; /* completion ids */
    int n_ids;
    char *text;   /* completion text (stop string removed) */
    size_t text_len;
    const char *finish_reason; /* "stop" (EOS or stop string) or "length" */
    double prompt_seconds, gen_seconds;
    uint64_t kv_bytes_peak;
    hr_kv_seq_ledger ledger;
} hr_generation;

/* Generates a completion of prompt; streams text to out when not NULL. */
hr_status hr_session_generate(hr_session *s, const char *prompt, FILE *out, hr_generation *g, hr_error *err);
void hr_generation_free(hr_generation *g);
void hr_generation_print_stats(const hr_session *s, const hr_generation *g, FILE *f);
json_t *hr_generation_to_json(const hr_session *s, const hr_generation *g);
void hr_session_print_ledger(hr_session *s, FILE *f);

#endif

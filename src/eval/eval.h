/* eval.h: what a KV format (and an eviction policy) does to quality on a text, measured on the
 * runtime: `headroom eval`'s method, apart from its flags and printing.
 *
 * Method (teacher-forced, as llama.cpp's perplexity tool): the text is tokenized once (BOS first) and
 * cut into chunks of n_ctx tokens; each chunk's first token is replaced by BOS, the chunk is scored by
 * the runtime (hr_runtime_score: one forward pass under the full policy; under another policy the
 * first half as a prompt, then one token per pass so the policy acts between them), and the second
 * half of its positions counts (each predicts the next token with at least n_ctx / 2 tokens of
 * context). Arm 0 is an f32 cache under the full policy (the reference); arms 1.. are every format
 * asked for under every policy asked for (format-major). Each arm is a runtime of its own on the one
 * loaded model (hr_runtime_open_sibling), so all of them hold their pools at once.
 *
 * Usage: hr_eval_create (parses the lists), hr_eval_open (loads, reads, tokenizes, opens the arms),
 * hr_eval_run_chunk for chunks 0..hr_eval_n_chunks-1 in order, hr_eval_get_arm, hr_eval_destroy. */
#ifndef HR_EVAL_EVAL_H
#define HR_EVAL_EVAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define HR_EVAL_MAX_FORMATS  16
#define HR_EVAL_MAX_POLICIES 16

typedef struct hr_eval_params {
    const char *model_path;      /* a GGUF model */
    const char *formats;         /* "f16,q8", "q4/f16" (K/V), "all" (every format; one the shape cannot use
                                    is then reported unavailable instead of refused) */
    const char *const *policies; /* each one policy or several separated by ';' (NULL / 0: full) */
    int n_policies;
    int n_ctx;          /* chunk length in tokens (at most the model's trained context) */
    int max_chunks;     /* 0: the whole text */
    int block_size;     /* 0: 16 */
    int n_threads;      /* 0: every core */
    const char *device; /* hr_runtime_params.device: NULL, "cpu", "cuda", "cuda:N" */
} hr_eval_params;

typedef struct hr_eval hr_eval;

/* Parses the format and policy lists (nothing is loaded). HR_ERR_INVALID_ARG with a message naming
 * the flag ("--kv-type: ...", "--policy: ...", "at most 16 formats"); HR_ERR_NOMEM. The strings of p
 * are borrowed until hr_eval_destroy. */
hr_status hr_eval_create(const hr_eval_params *p, hr_eval **out, hr_error *err);
void hr_eval_destroy(hr_eval *ev); /* NULL allowed */

/* Loads the model, reads and tokenizes text_path, cuts the chunks and opens every arm. On failure
 * *bad_option tells whether a parameter is at fault (n_ctx past the trained context, a listed format
 * or policy the model cannot use) rather than a file, memory or the machine. An arm that cannot open
 * when formats is "all" is kept as unavailable (hr_eval_arm.error) instead. */
hr_status hr_eval_open(hr_eval *ev, const char *text_path, bool *bad_option, hr_error *err);

const char *hr_eval_model_name(const hr_eval *ev); /* the model's own name (its metadata) */
size_t hr_eval_n_tokens(const hr_eval *ev);        /* the text's tokens */
int hr_eval_n_chunks(const hr_eval *ev);
int hr_eval_n_arms(const hr_eval *ev); /* the reference included */

/* Scores chunk c (0..n_chunks-1, in order) on every arm; after each arm, when on_arm is given, calls it
 * with the arm's index and label (progress). A failure of the reference fails the call; another arm's
 * failure makes that arm unavailable from then on. */
hr_status hr_eval_run_chunk(hr_eval *ev, int c, void (*on_arm)(void *ctx, int arm, const char *label), void *ctx,
                            hr_error *err);

/* An arm's figures so far: sums, so that a front end divides as it prints. */
typedef struct hr_eval_arm {
    const char *label;               /* "f16", "q4/f16", "f32 (ref)" */
    const char *k_format, *v_format; /* the formats' names */
    const char *policy;              /* canonical ("full", "window:256", ...) */
    const char *error;               /* "" or why the arm is unavailable */
    const hr_error *why;             /* that error whole (its parameter code), NULL when none */
    double nll;                      /* sum of -log p(next token) over the scored positions */
    double kl;                       /* sum of KL(P_ref || P_arm) (0 for the reference) */
    long agree, n;                   /* top-1 agreements with the reference, positions scored */
    double kv_bytes_per_token;       /* every layer's K and V, scales included */
    uint64_t seq_bytes;              /* the most KV bytes the sequence held at the end of a chunk */
    int kept;                        /* the most tokens one layer and KV head kept then */
} hr_eval_arm;

void hr_eval_get_arm(const hr_eval *ev, int arm, hr_eval_arm *out);

#endif

/* sampler.h: choosing the next token from logits: greedy, temperature, top-k, top-p, min-p,
 * repetition/presence/frequency penalties, a per-sampler seed. Deterministic: the same seed, logits
 * and history give the same token on any machine and in any batch.
 *
 * Order of operations (as in llama.cpp's default chain): penalties over the last `penalty_last_n`
 * tokens -> logit bias -> (temperature 0: argmax) -> top-k -> top-p -> min-p -> temperature -> softmax -> draw. */
#ifndef HR_SAMPLER_SAMPLER_H
#define HR_SAMPLER_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

typedef struct hr_sampler_params {
    float temperature;       /* 0: greedy; 0..100 (negative or NaN is refused) */
    int top_k;               /* <= 0: off */
    float top_p;             /* >= 1: off */
    float min_p;             /* <= 0: off */
    float repeat_penalty;    /* 1: off; >1 divides positive logits of recent tokens (multiplies negative) */
    float presence_penalty;  /* subtracted once from each recent token's logit */
    float frequency_penalty; /* subtracted per occurrence */
    int penalty_last_n;      /* window of recent tokens the penalties look at (0: off, -1: all) */
    uint64_t seed;
    /* logit bias (OpenAI's logit_bias): bias_values[i] (-100..100) is added to token bias_ids[i]'s logit
     * after the penalties; -100 bans the token outright. Copied by hr_sampler_create. */
    const int32_t *bias_ids;
    const float *bias_values;
    int n_bias; /* 0..HR_SAMPLER_MAX_BIAS */
    /* the portable passes over the logits even where the CPU has AVX2 (the tests and bench/sampler.c
     * compare the two): the same choices either way, only the time differs */
    bool portable;
} hr_sampler_params;

#define HR_SAMPLER_MAX_BIAS 1024

/* Defaults: greedy (temperature 0), top_k 40, top_p 0.95, min_p 0.05, no penalties, last_n 64, seed 0. */
hr_sampler_params hr_sampler_default_params(void);

typedef struct hr_sampler hr_sampler;

/* n_vocab sets the size of the internal buffers (allocated once here). */
hr_status hr_sampler_create(const hr_sampler_params *p, int n_vocab, hr_sampler **out, hr_error *err);
void hr_sampler_destroy(hr_sampler *s); /* NULL allowed */
/* Bytes hr_sampler_create allocates for these parameters (candidates, penalized logits and counts per
 * vocabulary entry, the penalty window, the logit bias). The sizes create allocates. Pure. */
uint64_t hr_sampler_bytes(const hr_sampler_params *p, int n_vocab);

/* Validates parameters (ranges) with a message naming the field (bias ids are checked against the
 * vocabulary by hr_sampler_create). */
hr_status hr_sampler_params_check(const hr_sampler_params *p, hr_error *err);

/* Adds a token to the history the penalties see (prompt tokens too, when the caller wants). */
void hr_sampler_accept(hr_sampler *s, int32_t token);
void hr_sampler_reset(hr_sampler *s); /* clears history and re-seeds */

/* Picks a token from logits[n_vocab] (not modified) and accepts it into the history. */
int32_t hr_sampler_sample(hr_sampler *s, const float *logits);
/* True when hr_sampler_sample's choice is hr_argmax of the logits as given: greedy, no penalties, no
 * logit bias. A caller holding only that argmax (a GPU's, model.h's hr_batch.argmax) passes it to
 * hr_sampler_accept instead, with the same result. */
bool hr_sampler_is_argmax(const hr_sampler *s);

/* The same over the tokens allowed by mask (bit i of mask[i / 64]: token i allowed; at least one must
 * be): the others are removed before anything else looks at the logits (greedy picks the best
 * allowed token; top-k, top-p and min-p see only allowed tokens), so every mode stays a distribution
 * over allowed tokens. Constrained decoding's hook (constrain/constrain.h fills the mask). */
int32_t hr_sampler_sample_masked(hr_sampler *s, const float *logits, const uint64_t *mask);

/* log(sum over the row of exp(logit)), computed from its largest logit: the normalizer of log-
 * probabilities (logit - it). With AVX2 where the CPU has it (a float exp, summed in double: within
 * about 1e-7 relative of the portable double one). NaN logits count as nothing; a row with no finite
 * maximum gives that maximum (-inf, or +inf). */
float hr_logsumexp(const float *logits, int n);

/* The k largest logits of logits[0, n) (k <= HR_TOP_LOGITS_MAX), best first, the lower index first on
 * ties, NaN never among them, into ids and vals; returns how many (k, or fewer where the row has fewer
 * that are not NaN). logprobs' top alternatives: one pass over the row with a heap of k, the next
 * logit above its worst found 32 at a time with AVX2 where the CPU has it (the same ids either way). */
#define HR_TOP_LOGITS_MAX 64
int hr_top_logits(const float *logits, int n, int k, int32_t *ids, float *vals);

/* The index of the largest logit (lowest index on ties; NaN never chosen; 0 where logits[0] is NaN).
 * With AVX2 where the CPU has it: the same index as the portable loop, several times sooner. */
int32_t hr_argmax(const float *logits, int n);

#endif

/* engine.h: requests and the step loop. Many sequences share one paged KV pool and one forward pass
 * per step: decode tokens and prefill chunks are mixed in one ragged batch (chunked prefill under
 * max_batch_tokens), admission is decided in bytes of KV, and when the pool runs out the scheduler
 * preempts a victim (recompute, or swap where the KV pool offers a swap tier).
 *
 * One idea covers prefill, chunked prefill, prefix-cache hits and recompute after preemption: each
 * request has `known` tokens (prompt + sampled output) and `computed` tokens (K/V in the cache); a
 * step moves computed toward known, and when they meet the last row's logits sample the next token.
 *
 * Threads: the engine thread (hr_engine_start) or the caller of hr_engine_step owns the scheduler,
 * the KV pool and the model context; nothing else may touch them meanwhile. hr_engine_submit,
 * hr_engine_cancel, hr_engine_get_stats and every hr_request_* call are thread-safe. Outputs stream
 * through each request's channel: a consumer polls (hr_request_read) or blocks (hr_request_wait).
 *
 * Lifecycle of a request (see docs/ENGINE.md for the diagram):
 *   submit -> WAITING -> RUNNING -> COMPLETED
 *                 ^          |  \-> CANCELLED (hr_engine_cancel) / FAILED (a forward error)
 *                 +- PREEMPTED <-+
 * Every accepted request ends in exactly one of COMPLETED, CANCELLED, FAILED. The engine never spins:
 * two steps in a row that compute nothing with requests unfinished fail the head of the queue with
 * the reason (see docs/ENGINE.md, "Progress"). */
#ifndef HR_ENGINE_ENGINE_H
#define HR_ENGINE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "constrain/constrain.h"
#include "kv/kv.h"
#include "model/model.h"
#include "sampler/sampler.h"
#include "tokenizer/tokenizer.h"

/* How a waiting request is judged to fit in the KV pool. */
typedef enum hr_admission {
    HR_ADMIT_ADAPTIVE = 0,   /* prompt + predicted output (p90 of completions seen, <= max_tokens) */
    HR_ADMIT_RESERVE = 1,    /* prompt + max_tokens must fit; never preempts */
    HR_ADMIT_OPTIMISTIC = 2, /* the prompt must fit; grow; preempt on exhaustion */
} hr_admission;

/* What preemption does to the victim's KV. */
typedef enum hr_preempt_mode {
    HR_PREEMPT_AUTO = 0,      /* swap when moving its bytes is cheaper than recomputing, else recompute */
    HR_PREEMPT_RECOMPUTE = 1, /* drop its blocks; re-prefill later (cached prefix blocks are reused) */
    HR_PREEMPT_SWAP = 2,      /* copy its blocks to the swap tier (recompute when there is none, or it is full) */
} hr_preempt_mode;

/* How KV is laid out per sequence. */
typedef enum hr_kv_layout {
    HR_LAYOUT_PAGED = 0,      /* blocks on demand, prefix sharing */
    HR_LAYOUT_CONTIGUOUS = 1, /* each admitted sequence reserves n_ctx slots up front (llama.cpp slots) */
} hr_kv_layout;

const char *hr_admission_name(hr_admission a);
hr_status hr_admission_parse(const char *name, hr_admission *out, hr_error *err);
const char *hr_preempt_mode_name(hr_preempt_mode m);
hr_status hr_preempt_mode_parse(const char *name, hr_preempt_mode *out, hr_error *err);
const char *hr_kv_layout_name(hr_kv_layout l);
hr_status hr_kv_layout_parse(const char *name, hr_kv_layout *out, hr_error *err);

/* The step executor: computes one ragged batch's K/V into the pool (hr_kv_write for every token in
 * every layer) and the logits of the rows that want them ([rows][n_vocab], in batch order). The
 * default is the model's forward pass; a simulator (the planner's) passes its own to drive the real
 * scheduler and KV pool without a model. */
typedef hr_status (*hr_engine_forward_fn)(void *user, const hr_batch *batch, float *logits, hr_error *err);

/* One step that computed, as it ran (serve --step-log; the planner's check of its cost model). */
typedef struct hr_engine_step_info {
    double t_begin;      /* hr_time_now() when the step began (before the inbox and the scheduler) */
    double forward_s;    /* the forward pass */
    double step_s;       /* the whole step: inbox, scheduling, forward, K/V commit, sampling, stats */
    int n_tokens;        /* tokens in the batch */
    int n_prefill;       /* of them, prompt or recomputed tokens (the rest: one decode token per sequence) */
    int n_rows;          /* rows that sampled */
    int n_seqs;          /* sequences in the batch */
    double visible_keys; /* over the batch's tokens, the keys each one attends to (its position + 1) */
} hr_engine_step_info;
/* Called on the engine's thread after each step that computed; must not call into the engine. */
typedef void (*hr_engine_step_fn)(void *user, const hr_engine_step_info *s);

typedef struct hr_engine_params {
    const hr_model *model;        /* borrowed, for the engine's lifetime; NULL only with `forward` */
    hr_model_ctx *ctx;            /* borrowed: its max_batch_tokens must be >= max_batch_tokens; NULL only
                                     with `forward` */
    hr_engine_forward_fn forward; /* NULL: hr_model_forward on ctx */
    void *forward_user;           /* passed to forward */
    int n_vocab;                  /* without a model: the logits' row length */
    hr_kv_pool *kv;               /* borrowed: the pool ctx writes to */
    hr_kv_swap *swap;             /* borrowed, optional: the tier swap preemption moves blocks to */
    const hr_tokenizer *tok;      /* borrowed, optional: end-of-generation tokens, text, stop strings */
    int n_ctx;                    /* longest sequence (prompt + output); 0: the model's training context */
    int max_batch_tokens;         /* tokens per step (0: 512) */
    int max_running;              /* sequences in flight (0: the pool's max_seqs) */
    int max_queue;                /* waiting requests before submit answers HR_ERR_FULL (0: 1024) */
    int prefill_chunk;            /* most prompt tokens of one request per step (0: max_batch_tokens) */
    hr_admission admission;
    hr_preempt_mode preempt;
    hr_kv_layout layout;
    float predict_percentile;  /* adaptive: the percentile of completion lengths (0: 0.9) */
    hr_engine_step_fn on_step; /* optional: each step that computed (see hr_engine_step_info) */
    void *on_step_user;
    /* optional: where the step's logits rows live (max_running x n_vocab floats, the bytes
     * hr_engine_buffer_bytes counts for them), e.g. a GPU's page-locked host memory, into which the
     * forward pass's download is one DMA; NULL: malloc. rows_free gives them back at destroy. */
    void *(*rows_alloc)(void *user, size_t bytes);
    void (*rows_free)(void *user, void *p);
    void *rows_user;
} hr_engine_params;

typedef struct hr_engine hr_engine;
typedef struct hr_request hr_request;

/* Checks the parameters and that the parts fit (a contiguous slot fits the pool; a q4/kivi2 pool has
 * at least max_running + 1 tail buffers), and allocates every per-step buffer. */
hr_status hr_engine_create(const hr_engine_params *p, hr_engine **out, hr_error *err);
/* Stops the thread if running; requests not yet finished end FAILED ("engine destroyed"). NULL ok. */
void hr_engine_destroy(hr_engine *e);
/* Bytes hr_engine_create allocates for its step buffers with these (defaulted) parameters: the engine
 * itself, the batch rows (token, position, sequence, wants-logits) of max_batch_tokens, a sampling slot
 * and an n_vocab logits row per running sequence. The sizes create allocates. Pure. */
uint64_t hr_engine_buffer_bytes(int max_batch_tokens, int max_running, int n_vocab);

/* ---- requests ---------------------------------------------------------------------------------- */

typedef struct hr_request_params {
    const int32_t *prompt; /* copied */
    int n_prompt;
    int max_tokens; /* tokens to generate at most (>= 1) */
    hr_sampler_params sampling;
    int priority; /* higher runs first and is preempted last; FCFS within a priority */
    bool ignore_eos;
    const char *const *stop; /* stop strings (copied; need a tokenizer); the text ends before the first */
    int n_stop;
    const hr_kv_policy *kv_policy; /* eviction/window policy of this request (copied); NULL: the pool's
                                      default (hr_kv_pool_set_default_policy) */
    bool logprobs;                 /* record each output token's log-probability under the model (log-softmax of
                                      the raw logits, before penalties and temperature) */
    int top_logprobs;              /* with logprobs: also the n most likely tokens at each position (0..20) */
    uint64_t cache_scope;          /* prefix-cache scope (hr_kv_seq_set_scope: a tenant); 0: shared */
    hr_grammar *grammar;           /* NULL, or the grammar the output must follow (constrained decoding; needs
                                      the tokenizer): the engine holds a reference until the request ends.
                                      Each step masks the tokens that cannot continue a valid output (an
                                      end-of-generation token only once the output is complete); the request
                                      ends "stop" when the output is complete and nothing can follow, and
                                      "length" when no token can continue it (or at max_tokens) */
} hr_request_params;

#define HR_ENGINE_MAX_GROUP 16

/* Bytes a request with these parameters allocates when submitted to an engine of n_vocab: the
 * request, its prompt and output ids, per-token gaps, log-probabilities when asked for, the first
 * size of its text (which then grows with the output), its sampler (hr_sampler_bytes). The sizes
 * submission allocates (stop strings and a choice group aside). Pure. */
uint64_t hr_request_buffer_bytes(const hr_request_params *p, int n_vocab);

#define HR_ENGINE_MAX_TOP_LOGPROBS 20

/* A request whose policy bounds its span (hr_kv_policy_span: window, sinks) may run past n_ctx
 * (positions keep growing; keys keep their original RoPE positions, see docs/POLICIES.md); its claim
 * on the pool is bounded by the span. */

/* Accepts a request or refuses it with a reason, setting *out only on HR_OK:
 *   HR_ERR_INVALID_ARG  empty prompt, max_tokens < 1, token ids outside the vocabulary, bad sampling,
 *                       a KV policy the pool cannot use
 *   HR_ERR_RANGE        prompt + max_tokens is beyond the context (n_ctx), unless its policy is a window
 *                       or sinks (then only the prompt must fit)
 *   HR_ERR_BUDGET       prompt + max_tokens can never fit in the whole KV pool
 *   HR_ERR_FULL         the waiting queue holds max_queue requests; the message says when to retry
 * The caller owns one reference to *out and drops it with hr_request_release. Any thread. */
hr_status hr_engine_submit(hr_engine *e, const hr_request_params *p, hr_request **out, hr_error *err);
/* n requests from one set of parameters (the n choices of one client request), request i with seed
 * p->sampling.seed + i: checked once and queued together (all or none: HR_ERR_FULL when the queue lacks
 * room for n), so they are admitted in one step when the pool allows, and accounted as a group
 * (hr_request_group_kv: the blocks they share counted once). n is 1..HR_ENGINE_MAX_GROUP; out[0..n) is
 * set only on HR_OK, each holding one reference. */
hr_status hr_engine_submit_n(hr_engine *e, const hr_request_params *p, int n, hr_request **out, hr_error *err);

/* Asks the engine to cancel r; its blocks return to the pool at the next step. A finished request
 * is left as it is. Any thread. */
void hr_engine_cancel(hr_engine *e, hr_request *r);

typedef enum hr_request_state {
    HR_REQ_WAITING = 0,
    HR_REQ_RUNNING = 1,
    HR_REQ_PREEMPTED = 2, /* waiting again after preemption */
    HR_REQ_COMPLETED = 3,
    HR_REQ_CANCELLED = 4,
    HR_REQ_FAILED = 5,
} hr_request_state;

typedef enum hr_finish_reason {
    HR_FINISH_NONE = 0,
    HR_FINISH_LENGTH = 1, /* max_tokens (or the context) reached */
    HR_FINISH_EOG = 2,    /* an end-of-generation token */
    HR_FINISH_STOP = 3,   /* a stop string */
    HR_FINISH_CANCELLED = 4,
    HR_FINISH_ERROR = 5,
} hr_finish_reason;

const char *hr_request_state_name(hr_request_state s);
const char *hr_finish_reason_name(hr_finish_reason f); /* "length", "stop" (EOG and stop strings), ... */

/* New output since the last read, copied out under the channel's lock. */
typedef struct hr_request_delta {
    int n_tokens;  /* token ids copied into tokens */
    size_t n_text; /* bytes copied into text (NUL-terminated when text_cap > 0) */
    bool done;     /* the request is final and everything has been read */
} hr_request_delta;

/* Copies up to tokens_cap new ids and up to text_cap - 1 new text bytes (either buffer may be NULL
 * with cap 0: that stream is then left unread). Text is held back while it could still become part
 * of a stop string, and always ends on a UTF-8 character boundary. */
void hr_request_read(hr_request *r, int32_t *tokens, int tokens_cap, char *text, size_t text_cap, hr_request_delta *d);
/* Blocks until there is unread output or the request is final, at most timeout_s seconds (< 0:
 * forever). Returns true when there is something to read or the request is final. */
bool hr_request_wait(hr_request *r, double timeout_s);
/* Blocks until final. */
void hr_request_wait_done(hr_request *r);

typedef struct hr_request_stats {
    hr_request_state state;
    hr_finish_reason finish;
    hr_status error_code; /* HR_OK unless FAILED or CANCELLED */
    char error[256];      /* why it failed or was cancelled */
    int n_prompt, n_output;
    int prefix_hit_tokens; /* prompt tokens whose K/V came from the prefix cache (all admissions) */
    int n_preemptions;
    int n_preempt_swap, n_preempt_recompute; /* of which by each mode */
    int recomputed_tokens;                   /* tokens computed again after preemption */
    uint64_t swapped_bytes;                  /* bytes moved to the swap tier */
    int priority;
    hr_kv_seq_ledger kv; /* the sequence's ledger, refreshed after every step that computed for it and at
                            release or swap-out (bytes_peak over its whole life) */
    double t_submit, t_admit, t_first_token, t_finish; /* hr_time_now() seconds; 0 when not reached
                                                          (t_admit: the first admission) */
    uint64_t id;    /* the engine's number for it (1, 2, ... in submission order; events name it) */
    int n_computed; /* tokens whose K/V are in the cache (below prompt + output: prefill or recompute) */
    bool swapped;   /* its KV is in the swap tier now */
} hr_request_stats;

void hr_request_get_stats(hr_request *r, hr_request_stats *out);

/* The KV blocks r's group (hr_engine_submit_n with n > 1) holds together, each block counted once:
 * the most at the end of any step (*blocks_peak) and the most its members held when one of them
 * finished (*blocks_final; before the first finish, the latest step's). False (nothing set) for a
 * request in no group. Any thread. */
bool hr_request_group_kv(hr_request *r, int *blocks_peak, int *blocks_final);

/* Log-probabilities of output tokens [from, from + n) (a request submitted with logprobs), as far as
 * they are published: lp[i] for output token from + i; with top_logprobs = K, top_ids / top_lp
 * [i * K + j] the j-th most likely token there (either array may be NULL). Returns how many were
 * copied (0 without logprobs). Any thread. */
int hr_request_logprobs(hr_request *r, int from, int n, float *lp, int32_t *top_ids, float *top_lp);

/* The inter-token gaps of the output so far (seconds between output tokens i and i + 1, as published
 * to the channel), at most cap of them; returns how many. Any thread. */
int hr_request_token_gaps(hr_request *r, float *gaps, int cap);

/* The whole output so far (ids and text). The pointers stay valid until hr_request_release and stop
 * changing once the request is final; before that, use hr_request_read. */
const int32_t *hr_request_output(hr_request *r, int *n_tokens);
const char *hr_request_text(hr_request *r, size_t *n_bytes);

void hr_request_release(hr_request *r); /* NULL allowed */

/* ---- running ----------------------------------------------------------------------------------- */

/* One scheduler step on the calling thread: take submissions and cancellations, schedule, one
 * forward, sample, stream, finish. *n_unfinished (may be NULL) receives the requests not yet final.
 * HR_ERR_INVALID_ARG while the engine thread runs. Request failures do not fail the step. */
hr_status hr_engine_step(hr_engine *e, int *n_unfinished, hr_error *err);
/* Steps until every submitted request is final. */
hr_status hr_engine_run_until_idle(hr_engine *e, hr_error *err);

/* Starts / stops the engine thread (which steps while there is work and sleeps otherwise). Stopping
 * leaves unfinished requests where they are; hr_engine_step or a new start continues them. */
hr_status hr_engine_start(hr_engine *e, hr_error *err);
void hr_engine_stop(hr_engine *e);

typedef struct hr_engine_stats {
    uint64_t steps;
    uint64_t batch_tokens;     /* tokens through the forward pass */
    uint64_t prefill_tokens;   /* of which were prompt (or recompute) tokens */
    uint64_t generated_tokens; /* tokens sampled */
    uint64_t submitted, refused_full, refused_budget, refused_other;
    uint64_t completed, cancelled, failed;
    uint64_t preemptions, preempt_recompute, preempt_swap;
    uint64_t recomputed_tokens, swapped_bytes, prefix_hit_tokens;
    uint64_t prefix_query_tokens; /* tokens looked up in the prefix cache at admissions (hits included) */
    int n_waiting, n_running, peak_running;
    int predicted_output; /* adaptive admission's current prediction (0: none yet) */
    double forward_seconds;
    /* steady-state generation: steps whose batch held no prompt (or recompute) token, the tokens
     * they sampled and their seconds (forward and sampling); decode_tokens / decode_seconds is the
     * aggregate generation rate with prefill left out */
    uint64_t decode_steps, decode_tokens;
    double decode_seconds;
    bool swap_available;
    int headroom_blocks; /* free + evictable blocks minus what running requests may still claim */
    /* constrained decoding: token masks computed and their seconds (inside the steps' sampling) */
    uint64_t masks;
    double mask_seconds;
    /* steps whose rows' ids the backend picked (hr_batch.argmax: the GPU with HEADROOM_CUDA_ARGMAX=device,
     * every row plain greedy), their logits never copied to the host */
    uint64_t argmax_steps;
    /* the steps' sampling on the host (every row's sampler, logprobs and grammar mask: part of
     * decode_seconds), and the steps whose rows were sampled on the model context's threads
     * (hr_model_ctx_run_items, from hr_model_ctx_run_items_min logits) */
    double sample_seconds;
    uint64_t threaded_sample_steps;
} hr_engine_stats;

/* ---- events ------------------------------------------------------------------------------------ */

/* What the scheduler did to a request's KV, kept in a bounded ring the engine owns (the newest
 * HR_ENGINE_EVENTS), for dashboards: recorded when it happens, read only when someone asks. */
typedef enum hr_engine_event_kind {
    HR_EVENT_PREEMPT_RECOMPUTE = 0, /* blocks released; it re-prefills later */
    HR_EVENT_PREEMPT_SWAP = 1,      /* blocks moved to the swap tier */
    HR_EVENT_EVICT = 2,             /* its policy evicted tokens (coalesced: one event per request per 0.5 s) */
} hr_engine_event_kind;

#define HR_ENGINE_EVENTS 1024

typedef struct hr_engine_event {
    uint64_t seq; /* 1, 2, ... in the order they happened */
    double t;     /* hr_time_now() seconds */
    hr_engine_event_kind kind;
    uint64_t request; /* hr_request_stats.id */
    int tokens;       /* preemption: tokens it had computed; eviction: tokens evicted since its last event */
    uint64_t bytes;   /* preemption: KV bytes it held (released or swapped out); eviction: 0 */
} hr_engine_event;

const char *hr_engine_event_kind_name(hr_engine_event_kind k); /* "preempt_recompute", "preempt_swap", "evict" */
/* Copies the events with seq > after, oldest first; when more than cap are there, the newest cap of
 * them. Returns how many. Any thread. */
int hr_engine_events(hr_engine *e, uint64_t after, hr_engine_event *out, int cap);

/* Seconds a client refused with HR_ERR_FULL should wait: the queue drains at the measured
 * completion rate (1..60). Any thread. */
double hr_engine_retry_after_s(hr_engine *e);

/* A snapshot taken at the end of the last step. Any thread. */
void hr_engine_get_stats(hr_engine *e, hr_engine_stats *out);

#endif

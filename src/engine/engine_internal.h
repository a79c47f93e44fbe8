/* engine_internal.h: the bodies of hr_engine and hr_request, shared by the engine's files:
 *   request.c   request creation, the output channel (lock + condition), stats, release
 *   scheduler.c admission, scheduling running requests, preemption, building the batch
 *   engine.c    create/destroy, submit/cancel, the step (forward, sample, stream, finish), the thread
 *
 * Ownership: the engine thread (or hr_engine_step's caller) alone reads and writes the scheduler
 * fields of requests (state, computed, seq, ...) and the engine's queues. The channel fields (out,
 * text, published lengths, final state) are written by the engine under r->mu and read by consumers
 * under r->mu. The inbox is guarded by e->mu. */
#ifndef HR_ENGINE_INTERNAL_H
#define HR_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "common/util.h"
#include "engine/engine.h"

#define HR_ENGINE_MAX_STOP 8
#define HR_ENGINE_OBS      512 /* completion lengths the adaptive predictor remembers */

/* The requests accounted together (the n choices of one client request). Members are added at
 * creation and leave when freed, under mu; the figures are written by the engine thread under mu. */
typedef struct hr_req_group {
    atomic_int refs; /* one per member */
    pthread_mutex_t mu;
    hr_request *members[HR_ENGINE_MAX_GROUP];
    int n_members;
    uint64_t epoch; /* the engine step (hr_engine.group_epoch) its figures were last taken at */
    int blocks_now, blocks_peak, blocks_final;
} hr_req_group;

struct hr_request {
    atomic_int refs;   /* one for the engine (until final), one for the submitter */
    atomic_int cancel; /* set by hr_engine_cancel */
    uint64_t arrival;  /* submission order, for FCFS */
    int priority;

    /* scheduler state (engine thread only) */
    hr_request_state state;
    int32_t *tokens; /* [n_prompt + max_tokens]: prompt, then sampled output */
    int n_prompt, max_tokens;
    int n_known;     /* n_prompt + sampled tokens */
    int n_computed;  /* tokens whose K/V are committed in seq */
    int n_hw;        /* most tokens ever computed (to count recompute) */
    int n_slots;     /* KV slots held by seq (shared prefix + reserved) */
    int n_sched;     /* tokens scheduled in this step */
    hr_kv_seq seq;   /* -1 when the request holds no sequence */
    bool swapped;    /* its KV is in the swap tier (seq kept) */
    bool has_policy; /* policy applies to its sequence (else the pool's default) */
    hr_kv_policy policy;
    uint64_t cache_scope; /* its sequence's prefix-cache scope (0: shared) */
    int span;             /* window/sinks: the most positions its cache keeps (it may run past n_ctx); 0: unbounded */
    hr_sampler *sampler;
    hr_grammar *grammar; /* constrained decoding: a reference (NULL: none) */
    hr_matcher *matcher; /* its recognizer, made at the first sample and destroyed when the request
                            finishes (engine thread: it uses the engine's hr_cons_store) */
    bool ignore_eos;
    char *stop[HR_ENGINE_MAX_STOP];
    int n_stop;
    size_t max_stop_len;
    hr_detok detok;
    float *gap;      /* [max_tokens] seconds between output token i - 1 and i (gap[0] = 0) */
    double t_last;   /* when the last output token was published */
    float *lp;       /* [max_tokens] output tokens' log-probabilities (logprobs only; else NULL) */
    int32_t *top_id; /* [max_tokens][n_top] */
    float *top_lp;   /* [max_tokens][n_top] */
    int n_top;
    _Atomic(hr_req_group *) group; /* NULL: accounted alone; set once, before the engine can see the group */
    int evict_pending;             /* evicted tokens not yet reported as an event */
    double t_evict_event;          /* when its last eviction event was recorded */

    /* channel (r->mu) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_out;  /* output ids published (tokens + n_prompt) */
    char *text; /* full text so far, NUL-terminated */
    size_t text_len, text_cap;
    size_t text_pub; /* bytes consumers may read (held back for stop strings) */
    int read_tokens; /* consumer cursors */
    size_t read_text;
    bool final;
    hr_request_stats stats;
};

/* A sorted list of requests: by priority (high first), then arrival (early first). */
typedef struct hr_req_list {
    hr_request **v;
    int n, cap;
} hr_req_list;

struct hr_engine {
    hr_engine_params p;
    int n_vocab, block_size, n_blocks;
    bool swap_ok; /* the KV pool offers a swap tier */

    /* inbox and thread (e->mu) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    hr_req_list inbox;
    bool kick;           /* a submit or cancel arrived since the thread last looked */
    atomic_int n_queued; /* inbox + waiting */
    atomic_int running_thread;
    bool stop_flag;
    pthread_t thread;
    uint64_t next_arrival;
    hr_engine_stats pub; /* stats published at the end of each step */
    double done_rate;    /* completions per second (EMA), for retry hints */
    double last_done_t;

    /* scheduler (engine thread only) */
    hr_req_list waiting, running;
    int budget_left; /* tokens left in this step's batch */
    bool preempted_this_step;
    int n_stalled;       /* consecutive steps that computed nothing while requests were unfinished */
    char stall_msg[512]; /* why the scheduler last could not place a request (for the failure) */
    hr_engine_stats st;
    int obs[HR_ENGINE_OBS]; /* completion lengths, a ring */
    int n_obs;
    int predicted;           /* p-th percentile of obs, 0 until enough observations */
    double swap_bytes_per_s; /* measured swap bandwidth (EMA), 0 until the first swap */
    uint64_t group_epoch;    /* steps committed: when each group's figures were last taken */

    /* events (ev_mu): a ring of the newest HR_ENGINE_EVENTS; ev_next is the newest seq (0: none yet) */
    pthread_mutex_t ev_mu;
    hr_engine_event ev[HR_ENGINE_EVENTS];
    uint64_t ev_next;

    /* per-step buffers, sized at create */
    int32_t *b_tokens, *b_pos;
    hr_kv_seq *b_seq;
    uint8_t *b_want;
    hr_request **b_sample; /* [max_running]: the request of each logits row */
    int32_t *b_ids;        /* [max_running]: each row's chosen id: the backend's (hr_batch.argmax) or its sampler's */
    float *logits;         /* [max_running][V] */

    /* constrained decoding (engine thread), made at the first constrained request */
    hr_cons_vocab *cvocab;
    hr_cons_store *cstore;
    uint64_t *mask; /* [words for max(V, the tokenizer's vocabulary)] */
};

/* ---- request.c ---- */
/* group_with: NULL, or an earlier request of the same submission to be accounted with (hr_req_group). */
hr_status req_create(hr_engine *e, const hr_request_params *p, hr_request *group_with, hr_request **out, hr_error *err);
void req_unref(hr_request *r);
/* Appends a sampled token to the output and the text; returns true when a stop string ended it. */
bool req_push_token(hr_request *r, const hr_tokenizer *tok, int32_t token);
/* Makes the request final: flushes text, records the finish, wakes waiters. Engine thread. */
void req_finish(hr_request *r, const hr_tokenizer *tok, hr_request_state state, hr_finish_reason why, hr_status code,
                const char *msg);

/* ---- events.c ---- */
/* Records one event (engine thread). */
void ev_push(hr_engine *e, hr_engine_event_kind kind, uint64_t request, int tokens, uint64_t bytes);
/* Reports r's evictions not yet recorded when `force` or half a second passed since its last report. */
void ev_flush_evictions(hr_engine *e, hr_request *r, bool force);

/* ---- list helpers (request.c) ---- */
bool req_before(const hr_request *a, const hr_request *b);
hr_status list_insert(hr_req_list *l, hr_request *r); /* sorted */
void list_remove_at(hr_req_list *l, int i);
int list_find(const hr_req_list *l, const hr_request *r);

/* ---- scheduler.c ---- */
/* Plans this step: schedules running requests (decodes first, then prefill chunks), preempting
 * victims when the pool runs out, then admits waiting requests while budget and headroom allow.
 * Afterwards every running request with n_sched > 0 is part of the batch. */
void sched_plan(hr_engine *e);
/* Fills the batch arrays from the plan; returns the number of tokens; *n_rows receives the number of
 * logits rows (b_sample[i] is the request of row i). */
int sched_build_batch(hr_engine *e, int *n_rows);
/* Records the sequence's ledger into the request's stats (the peak kept over its whole life). */
void sched_snapshot_ledger(hr_engine *e, hr_request *r);
/* Free + evictable blocks minus what running requests may still claim. */
int sched_headroom_blocks(const hr_engine *e);
/* Releases a request's sequence (if any), caching its full blocks; used when it becomes final. */
void sched_release_seq(hr_engine *e, hr_request *r);
/* The KV slots admission promises r. */
int sched_claim_slots(const hr_engine *e, const hr_request *r);
/* Takes the figures of r's group (if any) once per step, or at once when `finishing` (r is about to
 * release its sequence). Engine thread. */
void sched_group_account(hr_engine *e, hr_request *r, bool finishing);

#endif

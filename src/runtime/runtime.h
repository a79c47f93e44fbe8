/* runtime.h: the one composition root under every front end (the CLI's run, the server, the benches
 * and the tests): the model (or the built-in demo), its tokenizer, a KV pool sized from a byte budget,
 * the swap tier, the forward context and the engine, opened from one parameter struct and checked to
 * fit together; then requests as text, chat messages or token ids, with the chat template, the
 * context check and the max_tokens clamp applied here, and results as plain structs (no JSON here:
 * front ends format them).
 *
 * The boundary: this header speaks only the runtime's own vocabulary (runtime_types.h) and hands out
 * none of the objects it composes; front ends (src/cli, src/server, src/eval) need nothing below it
 * but the tokenizer's header, for text (tests/layering.sh). runtime_parts.h lends the objects to the
 * tests; budget.h holds the budget arithmetic the planner shares.
 *
 * Threads: hr_runtime_submit, hr_rt_request_* and hr_runtime_get_* may be called from any thread.
 * Either the engine thread runs (hr_runtime_start; a server) or one caller steps it
 * (hr_runtime_run_until_idle / hr_runtime_step; the CLI, eval), never both. */
#ifndef HR_RUNTIME_RUNTIME_H
#define HR_RUNTIME_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "runtime/runtime_types.h"

/* ---- the KV budget the pool was sized by (runtime/budget.h: the arithmetic) ---------------------- */

typedef struct hr_kv_budget {
    uint64_t budget_bytes; /* the budget (given, or computed) */
    uint64_t block_bytes;  /* one block, every layer, K and V, scales included */
    uint64_t fixed_bytes;  /* taken before any block: q4/kivi2 tail buffers */
    uint64_t token_bytes;  /* block_bytes / block_size */
    int n_blocks;          /* blocks the budget holds */
    int64_t n_tokens;      /* n_blocks * block_size */
    int ctx_blocks;        /* blocks one n_ctx sequence needs */
    int n_seqs_at_ctx;     /* whole n_ctx sequences that fit at once */
    /* the whole process (0 without mem.model): total = weights + budget + scratch + meta + base +
       request */
    uint64_t weight_bytes;  /* mem.weight_bytes */
    uint64_t scratch_bytes; /* forward scratch at max_batch_tokens, matmul activations, attention scores
                               per thread, the engine's batch and logits buffers */
    uint64_t meta_bytes;    /* the pool's per-block and per-sequence tables, requests' token buffers,
                               the tokenizer's tables */
    uint64_t base_bytes;    /* the process before the model */
    uint64_t request_bytes; /* mem.request_bytes */
    uint64_t total_bytes;
} hr_kv_budget;

/* ---- opening ----------------------------------------------------------------------------------- */

typedef struct hr_runtime_params {
    const char *model_path; /* NULL: the built-in demo model (random weights: say so to the user) */
    const hr_model *model;  /* or a model already loaded (borrowed; outlives the runtime): benches and
                               tests with in-memory synthetic models; model_path then only names it */
    bool mmap_weights;      /* map the file instead of reading it into huge-page memory */
    const char *quantize;   /* a checkpoint directory's matrices quantized at load: "q8_0", "q4_0", "q4_K"; NULL */
    int n_ctx;              /* 0: the model's trained context, capped at 4096 */
    bool ctx_extend;        /* allow n_ctx past the trained context (a warning; else an error) */
    uint64_t kv_budget;     /* bytes for the KV pool; 0: kv_seqs sequences of n_ctx */
    int kv_seqs;            /* sequences of n_ctx the default budget holds (0: 1) */
    hr_rt_kv_format k_format, v_format;
    int block_size;       /* 0: 16 */
    int max_batch_tokens; /* tokens per engine step (0: 512) */
    int prefill_chunk;    /* 0: max_batch_tokens */
    int max_running;      /* sequences in flight = KV sequence slots (0: 64) */
    int max_queue;        /* 0: the engine's default */
    hr_rt_admission admission;
    hr_rt_preempt preempt;
    hr_rt_layout layout;
    uint64_t swap_space;       /* bytes of the swap tier; 0: none (with preempt swap: as large as the pool) */
    int n_threads;             /* 0: every core */
    const char *isa;           /* NULL: the best measured; "scalar", "avx2", "avx512" */
    const char *device;        /* where the forward pass runs: NULL or "cpu"; "cuda" or "cuda:N" (GPU N;
                                  docs/GPU.md: opened before the model is read) */
    const char *cuda_driver;   /* the driver library for "cuda" (NULL: $HEADROOM_CUDA_DRIVER, else
                                  libcuda.so.1; the tests name the emulating one) */
    double gpu_util;           /* "cuda": the fraction of the GPU's memory the one device arena (weights,
                                  scratch, KV blocks) may take (0: 0.9, vLLM's default); the KV pool is
                                  what it leaves unless kv_budget says */
    const char *kv_policy;     /* every request's default eviction/window policy (NULL: full) */
    const char *chat_template; /* NULL: the model's own (or a guess from its metadata, with a warning) */
    bool prefault;             /* make the pool resident at open (RSS = budget from the start) */
    const char *step_log;      /* a file to write one JSON line per computed engine step (NULL: none) */
    uint64_t mem_limit;        /* > 0 without kv_budget: the pool is what this process limit leaves after
                                  the weights, scratch and the rest (hr_kv_budget_compute's plan) */
    bool special_in_content;   /* chat: parse special-token text inside message contents too (default
                                  false: only the template's own markers are control tokens) */
    uint64_t request_bytes;    /* memory a front end holds for requests besides the engine's (the
                                  server's JSON parsing bound): part of the plan, left out of the pool */

    /* For tests, simulators and the planner (the CLI and server leave these 0): */
    int kv_blocks;       /* > 0: the pool holds exactly this many blocks (overrides kv_budget; it may
                            hold less than one context: requests that can never fit are refused at
                            submit with HR_ERR_BUDGET) */
    int forward_max_ctx; /* > 0: the forward context's longest sequence, below n_ctx: forward passes
                            past it fail (fault injection) */
    bool raw_ids;        /* the engine runs without the tokenizer: no end-of-generation stop, no text,
                            no stop strings (random-weight models whose ids are compared as ids) */
    /* The backend the forward pass runs on (backend/backend.h's hr_backend_ops; NULL: the CPU) and its
       own state (hr_model_ctx_params.backend_user). */
    const struct hr_backend_ops *backend;
    void *backend_user;
    const hr_rt_shape *shape; /* instead of a model: its shape alone (no weights, no tokenizer, no chat
                                 template; prompts as token ids only, raw_ids implied), with a backend
                                 that needs no weights (the planner's simulator, hr_backend_sim) */
    const hr_rt_synth *synth; /* instead of a model file: a synthetic model built in memory */
} hr_runtime_params;

/* The defaults: f16 K and V, block 16, 512 tokens a step, 64 running, adaptive admission, auto
 * preemption, paged. */
hr_runtime_params hr_runtime_default_params(void);

/* hr_runtime_params.device: *ordinal = -1 for the CPU (NULL, "cpu"), N for "cuda:N" ("cuda": 0).
 * HR_ERR_INVALID_ARG for anything else. */
hr_status hr_rt_device_parse(const char *text, int *ordinal, hr_error *err);

typedef struct hr_runtime hr_runtime;

/* Opens everything and checks the parts fit. On failure *bad_option (when not NULL) tells whether a
 * parameter value is at fault (one this model cannot use: exit 2 / HTTP 400 at startup) rather than
 * a file, memory or the machine. */
hr_status hr_runtime_open(const hr_runtime_params *p, hr_runtime **out, bool *bad_option, hr_error *err);
/* Stops the engine thread if running; unfinished requests end FAILED. NULL allowed. */
void hr_runtime_close(hr_runtime *rt);

/* Another runtime on base's model: the weights and the tokenizer's file are shared, not loaded again
 * (base must outlive it); p->model_path and p->model are ignored (and p->shape: a base on a shape alone
 * gives its shape). Each arm of `headroom eval` is one, with its own KV formats and pool. Same failures
 * as hr_runtime_open. */
hr_status hr_runtime_open_sibling(const hr_runtime *base, const hr_runtime_params *p, hr_runtime **out,
                                  bool *bad_option, hr_error *err);

const hr_runtime_params *hr_runtime_get_params(const hr_runtime *rt); /* defaults filled in */
/* The vocabulary, for text only (tokenizer/tokenizer.h: encode, decode, pieces, token bytes): the one
 * part the runtime lends, since front ends may use the tokenizer's public header. Borrowed. */
const hr_tokenizer *hr_runtime_tokenizer(const hr_runtime *rt);
int hr_runtime_n_ctx(const hr_runtime *rt);
bool hr_runtime_is_demo(const hr_runtime *rt);
const char *hr_runtime_model_name(const hr_runtime *rt); /* the file's base name, or "demo" */
/* Startup warnings ('\n'-separated, no trailing newline), or "". */
const char *hr_runtime_warnings(const hr_runtime *rt);
/* When the model's chat template was not recognized: a one-line warning naming the template used
 * instead (print it when serving chat), else "". */
const char *hr_runtime_chat_warning(const hr_runtime *rt);
/* The chat template family in use ("chatml", "llama3", ...). */
const char *hr_runtime_chat_family(const hr_runtime *rt);
/* Whether chat renders through the model's own template (the Jinja interpreter), which takes tools and
 * tool calls as they are; else a family renderer, which knows nothing of tools. */
bool hr_runtime_chat_native(const hr_runtime *rt);
/* When the model's own template met something the interpreter does not support (or a limit) while
 * rendering a request, which then got the family renderer's text: the first such reason, one line;
 * else "". Stable once set (front ends log it once). Any thread. */
const char *hr_runtime_chat_fallback_note(const hr_runtime *rt);
/* The KV budget the pool was sized by. */
const hr_kv_budget *hr_runtime_budget(const hr_runtime *rt);
/* --device cuda: the GPU's memory as planned at open and as the arena holds it now; false (and *out
 * zeroed) on the CPU. Any thread (the arena's figures are read without a lock: a moment's). */
bool hr_runtime_device_mem(const hr_runtime *rt, hr_rt_device_mem *out);
/* A Hugging Face checkpoint's generation_config.json sampling defaults (temperature, top_p, top_k, min_p,
 * repetition_penalty), as vLLM applies them: each field of *sp that still equals builtin's (the front
 * end's own default: no flag set it) takes the model's value where the checkpoint gives one. A request's
 * own fields override the result. Models without one leave *sp as it is. */
void hr_runtime_generation_defaults(const hr_runtime *rt, const hr_rt_sampling *builtin, hr_rt_sampling *sp);

/* What the runtime runs, for a front end to show (the model's own name, the kernels chosen). */
typedef struct hr_runtime_info {
    const char *model;     /* the model's name from its metadata ("stories260K", ...) */
    const char *arch;      /* its architecture ("llama", "qwen3", ...) */
    int n_ctx_train;       /* the context it was trained for */
    int n_vocab;           /* rows of its logits */
    const char *isa;       /* the kernels in use ("avx2", ...) */
    int n_threads;         /* the forward pass's threads */
    hr_rt_shape shape;     /* its shape (what a cost model counts flops and bytes with); given back as
                              hr_runtime_params.shape it makes a pool of the same groups and bytes */
    uint64_t weight_bytes; /* its weights as the backend holds them: what one forward pass streams */
    /* each layer's kind in order, one letter a layer (n_layer of them): 'F' full attention, 'W' a
     * sliding window (shape.sliding_window where every layer has one, else shape.swa_window), 'L' a
     * latent cache's (shape.kv_lora_rank). gemma2: "WFWF..."; a shape alone: its first n_window_layers
     * 'W'. The runtime's (valid until it closes). */
    const char *layer_kinds;
} hr_runtime_info;
void hr_runtime_describe(const hr_runtime *rt, hr_runtime_info *out);

/* The engine thread (a server): start once, stop before close (close also stops it). */
hr_status hr_runtime_start(hr_runtime *rt, hr_error *err);
void hr_runtime_stop(hr_runtime *rt);
/* Steps on the calling thread until every submitted request is final (when no thread runs). */
hr_status hr_runtime_run_until_idle(hr_runtime *rt, hr_error *err);
/* One engine step on the calling thread (take submissions and cancellations, schedule, one forward,
 * sample, stream). *n_unfinished (may be NULL) receives the requests not yet final. HR_ERR_INVALID_ARG
 * while the engine thread runs. A request's failure does not fail the step. */
hr_status hr_runtime_step(hr_runtime *rt, int *n_unfinished, hr_error *err);

/* ---- scoring (teacher forcing: `headroom eval`) ------------------------------------------------ */

typedef struct hr_rt_score {
    uint64_t kv_bytes; /* KV bytes the sequence held after the last token (after its policy) */
    int tokens_kept;   /* the most tokens one layer and KV head kept then */
} hr_rt_score;

/* Checks a KV policy's text ("full", "window:W", "sinks:S,window:W", "h2o:B", "snapkv:B[,window:W]")
 * for its syntax only and writes its canonical form to label (cap bytes). No runtime needed. */
hr_status hr_rt_policy_parse(const char *policy, char *label, size_t cap, hr_error *err);
/* Whether this runtime's pool can use the policy (a window within its model's limits, ...). */
hr_status hr_runtime_check_policy(const hr_runtime *rt, const char *policy, hr_error *err);

/* Runs tokens[0..n) (n <= the context and max_batch_tokens) as one new sequence under policy (NULL:
 * full) and writes every position's logits to logits (n x hr_runtime_info.n_vocab). Under the full
 * policy the tokens go through one forward pass; under any
 * other the first n / 2 go as a prompt in one pass and the rest one per pass, so that the policy acts
 * between them (the logits of the first n / 2 positions are then left as they were). The sequence is
 * freed before returning. On the calling thread, never while the engine thread runs or requests are
 * in flight (it uses the pool and forward context the engine steps with). */
hr_status hr_runtime_score(hr_runtime *rt, const char *policy, const int32_t *tokens, int n, float *logits,
                           hr_rt_score *out, hr_error *err);

/* Times forward passes (the planner's calibration): one new sequence computes past[0..n_past) first,
 * untimed, 128 tokens a pass, then tokens[0..n) at positions n_past .. n_past + n - 1 reps times (the
 * same work each time), with logits for every token (all) or the last only, into logits (n x
 * hr_runtime_info.n_vocab); seconds[i] is pass i's wall time. Nothing is committed; the sequence is
 * freed. n <= max_batch_tokens, n_past + n <= the context. Same thread rules as hr_runtime_score. */
hr_status hr_runtime_time_forward(hr_runtime *rt, const int32_t *past, int n_past, const int32_t *tokens, int n,
                                  bool all, int reps, float *logits, double *seconds, hr_error *err);

/* ---- replicas: KV events and the shared KV tier ------------------------------------------------ */

/* The runtime's observer hook for the prefix cache: KV events published in vLLM's format (src/events)
 * and blocks shared through Redis (src/remote), both fed by the pool's one observer. */
typedef struct hr_rt_cluster_params {
    const char *kv_events;                        /* tcp://HOST:PORT to publish on (NULL: no events) */
    const char *kv_events_replay;                 /* a replay ROUTER endpoint (NULL: none) */
    const char *kv_events_topic;                  /* the first frame of every message (NULL: empty) */
    const char *kv_remote;                        /* redis://HOST:PORT (NULL: no shared tier) */
    const char *model_id;                         /* the model's identity in the shared tier (NULL: its name) */
    void (*log)(void *log_ctx, const char *line); /* one line per thing started, refused or counted */
    void *log_ctx;
} hr_rt_cluster_params;

typedef struct hr_rt_cluster hr_rt_cluster;

/* Call after hr_runtime_open and before hr_runtime_start. Never fails: what cannot start is logged
 * (log) and left out; NULL when nothing was asked for or nothing started. */
hr_rt_cluster *hr_runtime_cluster_start(hr_runtime *rt, const hr_rt_cluster_params *p);
/* Call after hr_runtime_stop, before hr_runtime_close: flushes, logs the counters, detaches. NULL ok. */
void hr_runtime_cluster_stop(hr_runtime *rt, hr_rt_cluster *c);

/* ---- requests ---------------------------------------------------------------------------------- */

/* Constrained decoding (docs/CONSTRAIN.md): the output follows src, compiled through the runtime's
 * cache of grammars (keyed by kind and content: a schema sent with every request compiles once).
 * A source that does not compile, or passes a compile bound, is refused at submit with
 * HR_ERR_INVALID_ARG, err->param HR_PARAM_OUTPUT_FORMAT and a message that starts "output format: "
 * ("output format: unsupported JSON Schema keyword 'not' at #/properties/a"). */
typedef struct hr_rt_constraint {
    hr_rt_cons_kind kind;
    const char *src; /* borrowed until submit returns */
    size_t len;
    const char *field; /* the request field it came from, for the front end's own use (NULL: none) */
} hr_rt_constraint;

/* A JSON Schema as the GBNF grammar constrained decoding compiles it to (tool calling frames its
 * calls' schemas in a grammar of its own): malloc'd text (free it) on success; HR_ERR_INVALID_ARG
 * names what the schema uses that cannot be constrained. */
hr_status hr_rt_schema_to_gbnf(const char *json, size_t len, char **out, hr_error *err);

typedef struct hr_rt_request hr_rt_request;

typedef struct hr_rt_request_params {
    /* exactly one of: */
    const char *prompt;             /* text (BOS added as the vocabulary says, unless no_bos) */
    size_t prompt_len;              /* 0: strlen(prompt) */
    const hr_rt_chat_msg *messages; /* chat: rendered with the runtime's template; special-token text is
                                    parsed in the template's markers only (see special_in_content) */
    size_t n_messages;
    /* a text prompt's special-token text ("</s>") stays text, unless special_in_content is set: a
       client that wants control tokens in a raw prompt gives ids */
    const int32_t *prompt_ids; /* token ids as they are */
    int n_prompt_ids;

    bool no_bos;
    int max_tokens; /* 0: up to the context (with a window policy: give one; it is clamped to
                       HR_RT_WINDOW_CTX_MULT contexts) */
    hr_rt_sampling sampling;
    const char *const *stop; /* copied */
    int n_stop;
    int priority;
    bool ignore_eos;
    const char *kv_policy;       /* this request's policy ("window:256", ...); NULL: the runtime's default */
    bool logprobs;               /* record each output token's log-probability (hr_rt_request_logprobs) */
    int top_logprobs;            /* and the n most likely alternatives (0..20) */
    const char *tools_json;      /* chat: NULL or a JSON array of tools, for a model's own template to render
                                    (hr_runtime_chat_native; messages carry their tool_calls_json / tool_call_id) */
    uint64_t cache_scope;        /* prefix-cache scope: requests share cached blocks (and report hits) only
                                    within one scope (a tenant: a hash of its API key or cache salt); 0: shared */
    hr_rt_constraint constraint; /* constrained decoding (kind HR_RT_CONS_NONE: free text) */
} hr_rt_request_params;

/* A request under a window or sinks policy may run past the context, but not forever: it generates at
 * most this many contexts (prompt included); a larger max_tokens is clamped (finish_reason "length",
 * limit "context"), as a full-policy request is clamped to one context. Its per-token buffers (ids,
 * gaps, logprobs) are allocated at submit and grow with max_tokens. */
#define HR_RT_WINDOW_CTX_MULT 4

/* Tokenizes (rendering chat first), checks the prompt against the context, clamps max_tokens to it
 * and submits. On refusal returns the engine's code with its reason (HR_ERR_INVALID_ARG a bad field,
 * HR_ERR_RANGE past the context: the message names both lengths, HR_ERR_BUDGET can never fit the
 * pool: the message says so in bytes, HR_ERR_FULL queue full: see hr_runtime_retry_after_s) and sets
 * *out only on HR_OK. Any thread. */
hr_status hr_runtime_submit(hr_runtime *rt, const hr_rt_request_params *p, hr_rt_request **out, hr_error *err);

#define HR_RT_MAX_CHOICES 16
/* n choices of one prompt (1..HR_RT_MAX_CHOICES), choice i sampled with seed p->sampling.seed + i:
 * tokenized once and queued together (all or none), so they are admitted together when the pool
 * allows and share the prompt's blocks through the prefix cache; their KV is accounted as a group
 * (hr_rt_kv_usage.group_*). Sets out[0..n) only on HR_OK. Any thread. */
hr_status hr_runtime_submit_n(hr_runtime *rt, const hr_rt_request_params *p, int n, hr_rt_request **out, hr_error *err);

/* New output since the last read, copied out under the request's lock. */
typedef struct hr_rt_delta {
    int n_tokens;  /* token ids copied into tokens */
    size_t n_text; /* bytes copied into text (NUL-terminated when text_cap > 0) */
    bool done;     /* the request is final and everything has been read */
} hr_rt_delta;

/* Copies up to tokens_cap new ids and up to text_cap - 1 new text bytes (either buffer may be NULL
 * with cap 0: that stream is then left unread). Text is held back while it could still become part of
 * a stop string, and always ends on a UTF-8 character boundary. Any thread. */
void hr_rt_request_read(hr_rt_request *r, int32_t *tokens, int tokens_cap, char *text, size_t text_cap, hr_rt_delta *d);
/* Blocks until there is unread output or the request is final, at most timeout_s seconds (< 0:
 * forever); true when there is something to read or it is final. It returns at once while any output,
 * ids or text, is unread: a reader that wants only the text must still read the ids (or pass a token
 * buffer), or it spins. Any thread. */
bool hr_rt_request_wait(hr_rt_request *r, double timeout_s);
/* Log-probabilities of output tokens [from, from + n) (a request submitted with logprobs), as far as
 * they are published: lp[i] for output token from + i; with top_logprobs = K, top_ids / top_lp
 * [i * K + j] the j-th most likely token there (either may be NULL). Returns how many. Any thread. */
int hr_rt_request_logprobs(hr_rt_request *r, int from, int n, float *lp, int32_t *top_ids, float *top_lp);
/* Seconds between output tokens i and i + 1 so far, at most cap of them; returns how many. Any thread. */
int hr_rt_request_token_gaps(hr_rt_request *r, float *gaps, int cap);
const int32_t *hr_rt_request_prompt(const hr_rt_request *r, int *n_prompt);
int hr_rt_request_max_tokens(const hr_rt_request *r);   /* after the clamp */
bool hr_rt_request_ctx_limited(const hr_rt_request *r); /* max_tokens was clamped by the context */
void hr_rt_request_cancel(hr_runtime *rt, hr_rt_request *r);
/* Drops the caller's reference (cancels it first when not final). NULL allowed. */
void hr_rt_request_release(hr_runtime *rt, hr_rt_request *r);

/* What a request used of the KV cache: every response carries it. */
typedef struct hr_rt_kv_usage {
    hr_rt_kv_format k_format, v_format;
    int block_size;
    uint64_t block_bytes;        /* one block of every layer's K and V */
    int blocks_now, blocks_peak; /* blocks_now: held after its last step (once final: at finish,
                                    before its blocks went back to the pool or the prefix cache) */
    uint64_t bytes_now, bytes_peak;
    int prefix_hit_tokens; /* prompt tokens served from the shared prefix cache */
    int evicted_tokens;    /* tokens its policy evicted */
    int preemptions, preempt_swaps, preempt_recomputes;
    uint64_t swapped_bytes;
    double queued_seconds;      /* submit -> first admission */
    double first_token_seconds; /* submit -> first output token, as the engine made it (0: none yet) */
    const char *policy;         /* "full", "window", ... */
    bool grouped;               /* one of n > 1 choices (hr_runtime_submit_n) */
    int group_blocks_peak;      /* grouped: the most blocks the group held together at a step's end, each
                                   shared block once (never more than the pool) */
    int group_blocks_final;     /* grouped: the most the group held together when one of them finished */
    /* a hybrid pool (a model mixing window and full layers): what it holds per layer kind now (once
     * final: at its last step), and the blocks its window groups gave back; n_kinds 1 otherwise */
    int n_kinds;
    hr_rt_kv_kind kinds[HR_RT_KV_MAX_KINDS];
    int window_blocks_freed;
} hr_rt_kv_usage;

typedef struct hr_rt_result {
    hr_rt_state state;
    hr_status status; /* HR_OK unless failed or cancelled */
    const char *error;
    const int32_t *ids; /* completion ids (valid until release) */
    int n_ids;
    const char *text; /* completion text, stop string removed (valid until release) */
    size_t text_len;
    const char *finish_reason; /* "stop" (EOS or stop string), "length", "cancelled", "error" */
    const char *limit;         /* with "length": "context" or "max_tokens"; else NULL */
    int n_prompt, max_tokens;
    double t_submit, t_first_token, t_finish; /* hr_time_now() seconds; 0 when not reached */
    hr_rt_kv_usage kv;
    hr_rt_request_stats stats;
} hr_rt_result;

/* A snapshot of the request now (final or not). Any thread. `error` points into out->stats, `ids` and
 * `text` into the request: a copy of *out keeps pointers into the original. */
void hr_rt_request_result(hr_rt_request *r, hr_rt_result *out);

/* ---- the whole picture (any thread) ------------------------------------------------------------ */

typedef struct hr_runtime_pool {
    hr_rt_pool_ledger ledger;
    uint64_t budget_bytes;
    int64_t headroom_bytes; /* budget (free + evictable blocks) minus what admitted requests may still
                               claim: the number that must never go negative */
    hr_rt_engine_stats engine;
} hr_runtime_pool;

void hr_runtime_get_pool(hr_runtime *rt, hr_runtime_pool *out);

/* What the scheduler did to requests' KV (preemptions, evictions), the newest HR_RT_EVENTS kept. */
typedef struct hr_rt_event {
    uint64_t seq;     /* 1, 2, ... in the order they happened */
    double t;         /* hr_time_now() seconds */
    const char *kind; /* "preempt_recompute", "preempt_swap", "evict" (static) */
    uint64_t request; /* the request's number (hr_rt_result.stats.id) */
    int tokens;       /* preemption: tokens it had computed; eviction: tokens evicted since its last event */
    uint64_t bytes;   /* preemption: KV bytes it held (released or swapped out); eviction: 0 */
} hr_rt_event;
#define HR_RT_EVENTS 1024
/* Copies the events with seq > after, oldest first (the newest cap when more). Returns how many. */
int hr_runtime_events(hr_runtime *rt, uint64_t after, hr_rt_event *out, int cap);

/* Planned against measured memory: the plan the pool was sized by (hr_kv_budget_compute with the
 * model) and the process's resident set now and at its peak (/proc/self/status VmRSS and VmHWM; 0
 * where unreadable). Any thread. */
typedef struct hr_runtime_memory {
    uint64_t planned_bytes; /* the plan's total */
    uint64_t weight_bytes, kv_bytes, scratch_bytes, meta_bytes, base_bytes;
    uint64_t request_bytes; /* the front end's request parsing bound (hr_runtime_params.request_bytes) */
    uint64_t rss_bytes, peak_rss_bytes;
} hr_runtime_memory;

void hr_runtime_get_memory(const hr_runtime *rt, hr_runtime_memory *out);
/* This process's VmRSS and VmHWM in bytes (0 where /proc/self/status cannot be read). */
void hr_mem_rss(uint64_t *rss_bytes, uint64_t *peak_bytes);

/* Seconds a client refused with HR_ERR_FULL should wait (from the measured drain rate). */
double hr_runtime_retry_after_s(hr_runtime *rt);

#endif

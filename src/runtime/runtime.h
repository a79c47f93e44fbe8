/* runtime.h: the one composition root under every front end (the CLI's run, the server, the benches
 * and the tests): the model (or the built-in demo), its tokenizer, a KV pool sized from a byte budget,
 * the swap tier, the forward context and the engine, opened from one parameter struct and checked to
 * fit together; then requests as text, chat messages or token ids, with the chat template, the
 * context check and the max_tokens clamp applied here, and results as plain structs (no JSON here:
 * front ends format them).
 *
 * Threads: hr_runtime_submit, hr_rt_request_* and hr_runtime_get_* may be called from any thread.
 * Either the engine thread runs (hr_runtime_start; a server) or one caller steps it
 * (hr_runtime_run_until_idle / hr_engine_step on hr_runtime_engine; the CLI), never both. */
#ifndef HR_RUNTIME_RUNTIME_H
#define HR_RUNTIME_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "constrain/constrain.h"
#include "engine/engine.h"
#include "kv/kv.h"
#include "model/model.h"
#include "sampler/sampler.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

/* ---- the KV budget, as arithmetic -------------------------------------------------------------- */

/* The rest of the process around the pool, for a whole-process budget (docs/PLAN.md). With model
 * NULL the budget is the KV pool's alone (the fields below are ignored). */
typedef struct hr_mem_query {
    const hr_hparams *model;  /* the shape: forward scratch, engine buffers, tokenizer */
    uint64_t weight_bytes;    /* what the loader holds: the GGUF file (read resident, or mapped and
                                 touched) plus the norm vectors it copies to f32 */
    int max_batch_tokens;     /* rows of the forward scratch (0: 512) */
    int n_threads;            /* attention scratch is per thread (0: 1) */
    uint64_t base_bytes;      /* the process before the model: code, libraries, thread stacks, the HTTP
                                 server (0: HR_MEM_BASE_BYTES, measured on this machine) */
    uint64_t mem_limit;       /* > 0 with kv.budget_bytes 0: the KV budget is what the limit leaves after
                                 everything else; with a budget given: the total must fit under it */
    uint64_t request_bytes;   /* a front end's memory for requests in flight besides the engine's (serve:
                                 the bound on JSON parsing, --max-parse-memory); planned like scratch */
    uint64_t unplanned_bytes; /* of mem_limit, left out of the pool when sizing it from the limit (serve:
                                 mem_limit / HR_MEM_LIMIT_MARGIN_DIV; the planner: 0, a device's reserved
                                 memory being part of its profile) */
    uint64_t tokenizer_bytes; /* the loaded tokenizer's tables (hr_tokenizer_table_bytes); 0: estimated
                                 from the vocabulary size (hr_tokenizer_table_bytes_for) */
} hr_mem_query;

/* The process's resident bytes besides the planned parts: code and data of headroom and its libraries
 * (libc, jansson, pcre2, libmicrohttpd, libcurl and its TLS stack), thread stacks and per-thread malloc
 * arenas, the HTTP server. Measured: an idle `headroom serve -t 2` of stories260K holds 15.0 MiB, of
 * which its planned parts (weights, scratch, tables) are 3.3 MiB (docs/PLAN.md). */
#define HR_MEM_BASE_BYTES (12ull << 20)

/* Serve sizing the pool from --mem-limit leaves limit / HR_MEM_LIMIT_MARGIN_DIV (3.1%) unplanned: the
 * measured peak RSS has been up to +2.6% over the plan (then every HTTP connection thread carried 1 MiB
 * of the kernels' thread-local scratch, since moved to the kernels' stack; allocator slack remains),
 * and the limit is a promise the process stays under. */
#define HR_MEM_LIMIT_MARGIN_DIV 32

/* What a pool of this shape holds for a budget, or which budget holds n_seqs sequences of n_ctx
 * tokens, and (with mem.model) what the whole process then holds. Pure: no allocation, no model
 * loaded; the planner calls the same function. */
typedef struct hr_kv_budget_query {
    hr_kv_config kv; /* shape, formats, block size, max_seqs, max_step_tokens; budget_bytes:
                        0 to size it for n_seqs sequences of n_ctx tokens (or from mem.mem_limit) */
    int n_ctx;       /* the longest sequence */
    int n_seqs;      /* sequences of n_ctx the default budget holds (>= 1) */
    hr_mem_query mem;
} hr_kv_budget_query;

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

/* HR_ERR_INVALID_ARG (a format or block size this shape cannot use: the message names both) or
 * HR_ERR_BUDGET (the budget, or mem.mem_limit, holds no n_ctx sequence: the message says what would:
 * the budget or limit one sequence needs, and the longest context that fits) on failure; *out is
 * filled in both cases where it can be. */
hr_status hr_kv_budget_compute(const hr_kv_budget_query *q, hr_kv_budget *out, hr_error *err);

/* What the loader keeps resident for a GGUF file of file_bytes with this shape (mem.weight_bytes). */
uint64_t hr_mem_weight_bytes(const hr_hparams *hp, uint64_t file_bytes);

/* ---- opening ----------------------------------------------------------------------------------- */

typedef struct hr_runtime_params {
    const char *model_path; /* NULL: the built-in demo model (random weights: say so to the user) */
    const hr_model *model;  /* or a model already loaded (borrowed; outlives the runtime): benches and
                               tests with in-memory synthetic models; model_path then only names it */
    bool mmap_weights;      /* map the file instead of reading it into huge-page memory */
    int n_ctx;              /* 0: the model's trained context, capped at 4096 */
    bool ctx_extend;        /* allow n_ctx past the trained context (a warning; else an error) */
    uint64_t kv_budget;     /* bytes for the KV pool; 0: kv_seqs sequences of n_ctx */
    int kv_seqs;            /* sequences of n_ctx the default budget holds (0: 1) */
    hr_kv_format k_format, v_format;
    int block_size;       /* 0: 16 */
    int max_batch_tokens; /* tokens per engine step (0: 512) */
    int prefill_chunk;    /* 0: max_batch_tokens */
    int max_running;      /* sequences in flight = KV sequence slots (0: 64) */
    int max_queue;        /* 0: the engine's default */
    hr_admission admission;
    hr_preempt_mode preempt;
    hr_kv_layout layout;
    uint64_t swap_space;       /* bytes of the swap tier; 0: none (with preempt swap: as large as the pool) */
    int n_threads;             /* 0: every core */
    const char *isa;           /* NULL: the best measured; "scalar", "avx2", "avx512" */
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
} hr_runtime_params;

/* The defaults: f16 K and V, block 16, 512 tokens a step, 64 running, adaptive admission, auto
 * preemption, paged. */
hr_runtime_params hr_runtime_default_params(void);

typedef struct hr_runtime hr_runtime;

/* Opens everything and checks the parts fit. On failure *bad_option (when not NULL) tells whether a
 * parameter value is at fault (one this model cannot use: exit 2 / HTTP 400 at startup) rather than
 * a file, memory or the machine. */
hr_status hr_runtime_open(const hr_runtime_params *p, hr_runtime **out, bool *bad_option, hr_error *err);
/* Stops the engine thread if running; unfinished requests end FAILED. NULL allowed. */
void hr_runtime_close(hr_runtime *rt);

const hr_runtime_params *hr_runtime_get_params(const hr_runtime *rt); /* defaults filled in */
const hr_model *hr_runtime_model(const hr_runtime *rt);
const hr_tokenizer *hr_runtime_tokenizer(const hr_runtime *rt);
hr_kv_pool *hr_runtime_kv(hr_runtime *rt);
hr_kv_swap *hr_runtime_swap(hr_runtime *rt); /* NULL when there is no tier */
hr_model_ctx *hr_runtime_ctx(hr_runtime *rt);
hr_engine *hr_runtime_engine(hr_runtime *rt);
int hr_runtime_n_ctx(const hr_runtime *rt);
bool hr_runtime_is_demo(const hr_runtime *rt);
const char *hr_runtime_model_name(const hr_runtime *rt); /* the file's base name, or "demo" */
/* Startup warnings ('\n'-separated, no trailing newline), or "". */
const char *hr_runtime_warnings(const hr_runtime *rt);
/* When the model's chat template was not recognized: a one-line warning naming the template used
 * instead (print it when serving chat), else "". */
const char *hr_runtime_chat_warning(const hr_runtime *rt);
/* The chat template family in use ("chatml", "llama3", ...: hr_chat_template_name). */
const char *hr_runtime_chat_family(const hr_runtime *rt);
/* Whether chat renders through the model's own template (the Jinja interpreter), which takes tools and
 * tool calls as they are; else a family renderer, which knows nothing of tools. */
bool hr_runtime_chat_native(const hr_runtime *rt);
/* The KV budget the pool was sized by. */
const hr_kv_budget *hr_runtime_budget(const hr_runtime *rt);

/* The engine thread (a server): start once, stop before close (close also stops it). */
hr_status hr_runtime_start(hr_runtime *rt, hr_error *err);
void hr_runtime_stop(hr_runtime *rt);
/* Steps on the calling thread until every submitted request is final (when no thread runs). */
hr_status hr_runtime_run_until_idle(hr_runtime *rt, hr_error *err);

/* ---- requests ---------------------------------------------------------------------------------- */

/* Constrained decoding (docs/CONSTRAIN.md): the output follows src, compiled through the runtime's
 * cache of grammars (keyed by kind and content: a schema sent with every request compiles once).
 * A source that does not compile, or passes a compile bound, is refused at submit with
 * HR_ERR_INVALID_ARG and a message that starts with `field` ("response_format: unsupported JSON Schema
 * keyword 'not' at #/properties/a"). */
typedef struct hr_rt_constraint {
    hr_cons_kind kind;
    const char *src; /* borrowed until submit returns */
    size_t len;
    const char *field; /* the request field it came from (NULL: "constraint") */
} hr_rt_constraint;

typedef struct hr_rt_request hr_rt_request;

typedef struct hr_rt_request_params {
    /* exactly one of: */
    const char *prompt;          /* text (BOS added as the vocabulary says, unless no_bos) */
    size_t prompt_len;           /* 0: strlen(prompt) */
    const hr_chat_msg *messages; /* chat: rendered with the runtime's template; special-token text is
                                    parsed in the template's markers only (see special_in_content) */
    size_t n_messages;
    /* a text prompt's special-token text ("</s>") stays text, unless special_in_content is set: a
       client that wants control tokens in a raw prompt gives ids */
    const int32_t *prompt_ids; /* token ids as they are */
    int n_prompt_ids;

    bool no_bos;
    int max_tokens; /* 0: up to the context (with a window policy: give one; it is clamped to
                       HR_RT_WINDOW_CTX_MULT contexts) */
    hr_sampler_params sampling;
    const char *const *stop; /* copied */
    int n_stop;
    int priority;
    bool ignore_eos;
    const char *kv_policy;       /* this request's policy ("window:256", ...); NULL: the runtime's default */
    bool logprobs;               /* record each output token's log-probability (hr_request_logprobs) */
    int top_logprobs;            /* and the n most likely alternatives (0..20) */
    const char *tools_json;      /* chat: NULL or a JSON array of tools, for a model's own template to render
                                    (hr_runtime_chat_native; messages carry their tool_calls_json / tool_call_id) */
    uint64_t cache_scope;        /* prefix-cache scope: requests share cached blocks (and report hits) only
                                    within one scope (a tenant: a hash of its API key or cache salt); 0: shared */
    hr_rt_constraint constraint; /* constrained decoding (kind HR_CONS_NONE: free text) */
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

/* The engine's request (read its stream with hr_request_read / hr_request_wait). Borrowed. Note that
 * hr_request_wait returns at once while any output, ids or text, is unread: a reader that wants only
 * the text must still read the ids (or pass a token buffer), or it spins. */
hr_request *hr_rt_request_handle(hr_rt_request *r);
const int32_t *hr_rt_request_prompt(const hr_rt_request *r, int *n_prompt);
int hr_rt_request_max_tokens(const hr_rt_request *r);   /* after the clamp */
bool hr_rt_request_ctx_limited(const hr_rt_request *r); /* max_tokens was clamped by the context */
void hr_rt_request_cancel(hr_runtime *rt, hr_rt_request *r);
/* Drops the caller's reference (cancels it first when not final). NULL allowed. */
void hr_rt_request_release(hr_runtime *rt, hr_rt_request *r);

/* What a request used of the KV cache: every response carries it. */
typedef struct hr_rt_kv_usage {
    hr_kv_format k_format, v_format;
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
} hr_rt_kv_usage;

typedef struct hr_rt_result {
    hr_request_state state;
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
    hr_request_stats stats;
} hr_rt_result;

/* A snapshot of the request now (final or not). Any thread. `error` points into out->stats, `ids` and
 * `text` into the request: a copy of *out keeps pointers into the original. */
void hr_rt_request_result(hr_rt_request *r, hr_rt_result *out);

/* ---- the whole picture (any thread) ------------------------------------------------------------ */

typedef struct hr_runtime_pool {
    hr_kv_pool_ledger ledger;
    uint64_t budget_bytes;
    int64_t headroom_bytes; /* budget (free + evictable blocks) minus what admitted requests may still
                               claim: the number that must never go negative */
    hr_engine_stats engine;
} hr_runtime_pool;

void hr_runtime_get_pool(hr_runtime *rt, hr_runtime_pool *out);

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

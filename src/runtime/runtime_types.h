/* runtime_types.h: the runtime's vocabulary, what a front end names when it configures a runtime and
 * reads its results: KV formats, admission, preemption and layout modes, request states, constraint
 * kinds, sampling parameters, chat messages, and the plain snapshots of a request, the engine and
 * the pool. Plain values only (and two opaque handles): a front end includes runtime.h and never the
 * engine's, the KV pool's, the model's or the chat templates' headers.
 *
 * Each enum has the same numbers as the layer's own (engine/engine.h, kv/kv.h, constrain/constrain.h)
 * and each snapshot the same fields; runtime/vocab.c checks the numbers at compile time and copies the
 * snapshots field by field, so the layers below may change their insides without a front end
 * noticing. Enums only grow at the end. */
#ifndef HR_RUNTIME_RUNTIME_TYPES_H
#define HR_RUNTIME_RUNTIME_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Opaque handles (C11 allows the layers' own headers to repeat these typedefs). */
typedef struct hr_model hr_model;         /* a model a test or bench loaded itself (hr_runtime_params.model) */
typedef struct hr_tokenizer hr_tokenizer; /* the vocabulary: tokenizer/tokenizer.h, for text only */

/* A model's shape without its weights (hr_runtime_params.shape): what the KV pool, the engine's
 * logits and the budget need, for a backend that computes nothing from weights (the planner's
 * simulator). */
/* The GPU's memory for a runtime on one (hr_runtime_device_mem): the driver's report at open, the
 * budget (gpu_util x total), and the one arena carved into weights, scratch and KV blocks. */
typedef struct hr_rt_device_mem {
    char name[128];            /* the GPU's */
    uint64_t total_bytes;      /* the driver's total */
    uint64_t free_bytes;       /* free when the runtime opened, before the arena */
    double util;               /* gpu_util as applied */
    uint64_t budget_bytes;     /* util x total */
    uint64_t arena_bytes;      /* the one allocation: weights + scratch + kv */
    uint64_t weight_bytes;     /* the model's matrices, norms and tables on the device */
    uint64_t scratch_bytes;    /* the forward pass's buffers */
    uint64_t kv_bytes;         /* the KV blocks and the storage's staging rows */
    uint64_t arena_used_bytes; /* in use now */
    uint64_t arena_peak_bytes; /* most in use so far */
    uint64_t host_released;    /* host pages of the uploaded weights given back (a mapped GGUF's) */
} hr_rt_device_mem;

typedef struct hr_rt_shape {
    int n_vocab;     /* rows of the logits the backend writes */
    int n_ctx_train; /* 0: none (no trained-context check) */
    int n_embd, n_ff, n_head, n_head_kv, n_layer, head_dim;
    int sliding_window; /* every layer's window (0: full attention) */
    /* a hybrid model (gemma2/3, gpt-oss: window layers beside full ones; sliding_window 0): the first
     * n_window_layers layers have a window of swa_window tokens, the others none; the pool groups them
     * as a model's own (kv.h's layer groups: only the counts shape the groups). 0: none */
    int swa_window, n_window_layers;
    /* a latent cache (deepseek2's multi-head latent attention): one KV head of head_dim = kv_lora_rank
     * latent dims + the roped key, V read from its first kv_lora_rank dims (kv.h's v_from_k); the full
     * layers' kind is then "latent". 0: none */
    int kv_lora_rank;
    bool attn_sinks; /* gpt-oss: a learned logit per query head joins each softmax (no cache of its own) */
} hr_rt_shape;

/* A model of random weights built in memory (hr_runtime_params.synth), for measurements that need a
 * model's compute but not its weights' values (the planner's calibration). */
typedef struct hr_rt_synth {
    const char *shape;       /* `headroom synth`'s shape names: "tinyllama-1.1b", "tiny", ... */
    const char *weight_type; /* the matrices' type ("q4_0", "q8_0", "f16", ...; NULL: f32) */
    int n_layer;             /* > 0: this many layers instead of the shape's */
    uint64_t seed;
} hr_rt_synth;

/* ---- KV formats ---------------------------------------------------------------------------------- */

typedef enum hr_rt_kv_format {
    HR_RT_KV_F32 = 0,
    HR_RT_KV_F16 = 1,
    HR_RT_KV_BF16 = 2,
    HR_RT_KV_Q8 = 3,    /* int8, per token and head, groups of <= 64 with an f16 scale */
    HR_RT_KV_Q4 = 4,    /* 4-bit, robust to outlier key channels */
    HR_RT_KV_FP8 = 5,   /* e4m3 with per-head scales */
    HR_RT_KV_KIVI2 = 6, /* 2-bit KIVI: K per channel over a full block, V per token, tail block in f16 */
    HR_RT_KV_Q4H = 7,   /* 4-bit per token, K rotated per head by a Hadamard transform */
} hr_rt_kv_format;

#define HR_RT_KV_FORMAT_COUNT 8

const char *hr_rt_kv_format_name(hr_rt_kv_format f); /* "f32", "f16", ... */
/* HR_ERR_INVALID_ARG naming the formats there are. */
hr_status hr_rt_kv_format_parse(const char *name, hr_rt_kv_format *out, hr_error *err);

/* ---- the scheduler's modes --------------------------------------------------------------------- */

typedef enum hr_rt_admission {
    HR_RT_ADMIT_ADAPTIVE = 0,   /* prompt + predicted output (p90 of completions seen, <= max_tokens) */
    HR_RT_ADMIT_RESERVE = 1,    /* prompt + max_tokens must fit; never preempts */
    HR_RT_ADMIT_OPTIMISTIC = 2, /* the prompt must fit; grow; preempt on exhaustion */
} hr_rt_admission;

typedef enum hr_rt_preempt {
    HR_RT_PREEMPT_AUTO = 0,      /* swap when moving its bytes is cheaper than recomputing, else recompute */
    HR_RT_PREEMPT_RECOMPUTE = 1, /* drop its blocks; re-prefill later */
    HR_RT_PREEMPT_SWAP = 2,      /* copy its blocks to the swap tier */
} hr_rt_preempt;

typedef enum hr_rt_layout {
    HR_RT_LAYOUT_PAGED = 0,      /* blocks on demand, prefix sharing */
    HR_RT_LAYOUT_CONTIGUOUS = 1, /* each admitted sequence reserves n_ctx slots up front */
} hr_rt_layout;

const char *hr_rt_admission_name(hr_rt_admission a);
hr_status hr_rt_admission_parse(const char *name, hr_rt_admission *out, hr_error *err);
const char *hr_rt_preempt_name(hr_rt_preempt m);
hr_status hr_rt_preempt_parse(const char *name, hr_rt_preempt *out, hr_error *err);
const char *hr_rt_layout_name(hr_rt_layout l);
hr_status hr_rt_layout_parse(const char *name, hr_rt_layout *out, hr_error *err);

/* ---- requests ---------------------------------------------------------------------------------- */

typedef enum hr_rt_state {
    HR_RT_WAITING = 0,
    HR_RT_RUNNING = 1,
    HR_RT_PREEMPTED = 2, /* waiting again after preemption */
    HR_RT_COMPLETED = 3,
    HR_RT_CANCELLED = 4,
    HR_RT_FAILED = 5,
} hr_rt_state;

const char *hr_rt_state_name(hr_rt_state s); /* "waiting", "running", ... */

/* Constrained decoding's source kinds (docs/CONSTRAIN.md). */
typedef enum hr_rt_cons_kind {
    HR_RT_CONS_NONE = 0,
    HR_RT_CONS_JSON = 1,
    HR_RT_CONS_JSON_SCHEMA = 2,
    HR_RT_CONS_REGEX = 3,
    HR_RT_CONS_GRAMMAR = 4,
    HR_RT_CONS_CHOICE = 5,
} hr_rt_cons_kind;

/* Sampling (the sampler's parameters). */
typedef struct hr_rt_sampling {
    float temperature;       /* 0: greedy; 0..100 */
    int top_k;               /* <= 0: off */
    float top_p;             /* >= 1: off */
    float min_p;             /* <= 0: off */
    float repeat_penalty;    /* 1: off */
    float presence_penalty;  /* subtracted once from each recent token's logit */
    float frequency_penalty; /* subtracted per occurrence */
    int penalty_last_n;      /* recent tokens the penalties look at (0: off, -1: all) */
    uint64_t seed;
    const int32_t *bias_ids; /* logit bias: bias_values[i] (-100..100) added to token bias_ids[i] */
    const float *bias_values;
    int n_bias; /* 0..HR_RT_MAX_BIAS */
} hr_rt_sampling;

#define HR_RT_MAX_BIAS 1024

/* Greedy (temperature 0), top_k 40, top_p 0.95, min_p 0.05, no penalties, last_n 64, seed 0. */
hr_rt_sampling hr_rt_sampling_default(void);
/* The index of the largest of n logits (the first on ties): greedy decoding's choice (the sampler's). */
int32_t hr_rt_argmax(const float *logits, int n);
/* Ranges, with a message naming the field (bias ids are checked against the vocabulary at submit). */
hr_status hr_rt_sampling_check(const hr_rt_sampling *p, hr_error *err);

/* One chat message: role "system", "user", "assistant", "tool". The last three fields are for the
 * model's own template; the family renderers ignore them. */
typedef struct hr_rt_chat_msg {
    const char *role;
    const char *content;         /* NULL: JSON null (an assistant turn that only calls tools) */
    const char *tool_calls_json; /* NULL or a JSON array of {"id", "type", "function": {"name", "arguments"}} */
    const char *tool_call_id;    /* a tool result's call id, or NULL */
    const char *name;            /* a tool result's function name, or NULL */
} hr_rt_chat_msg;

/* ---- snapshots --------------------------------------------------------------------------------- */

/* A sequence's KV ledger. */
/* Blocks and bytes held by the layers of one kind (a hybrid pool's groups: kv.h's layer groups). */
typedef struct hr_rt_kv_kind {
    int window;   /* 0: full attention; > 0: sliding window of this many tokens */
    int n_layers; /* layers of the kind */
    int blocks;   /* blocks its groups hold */
    uint64_t bytes;
    bool latent;          /* a latent cache's layers (MLA: kind "latent", not "full") */
    uint64_t token_bytes; /* one token in every layer of the kind */
} hr_rt_kv_kind;

#define HR_RT_KV_MAX_KINDS 4

typedef struct hr_rt_seq_ledger {
    int blocks_own;     /* blocks only this sequence holds */
    int blocks_shared;  /* blocks held together with other sequences or the prefix cache */
    uint64_t bytes_now; /* bytes of the blocks it holds */
    uint64_t bytes_peak;
    int tokens_resident; /* committed tokens in the pool, less those its policy evicted */
    int tokens_total;
    hr_rt_kv_format k_format, v_format;
    uint64_t bytes_swapped; /* bytes of this sequence now in the swap tier */
    int prefix_hit_tokens;  /* tokens whose K/V came from the prefix cache */
    int tokens_evicted;     /* committed tokens no later query can see in any layer and KV head */
    int blocks_evicted;     /* blocks the policy took out of the table over the sequence's life */
    int tokens_kept_max;    /* the most committed tokens the next query sees in one layer and KV head */
    int n_kinds;            /* layer kinds: 1 for a one-kind model; more for a hybrid pool */
    hr_rt_kv_kind kinds[HR_RT_KV_MAX_KINDS];
    int blocks_window_freed; /* blocks its window groups gave back as it grew (hybrid pools) */
} hr_rt_seq_ledger;

/* A request's figures. */
typedef struct hr_rt_request_stats {
    hr_rt_state state;
    hr_status error_code; /* HR_OK unless FAILED or CANCELLED */
    char error[256];      /* why it failed or was cancelled */
    int n_prompt, n_output;
    int prefix_hit_tokens; /* prompt tokens whose K/V came from the prefix cache (all admissions) */
    int n_preemptions;
    int n_preempt_swap, n_preempt_recompute;
    int recomputed_tokens; /* tokens computed again after preemption */
    uint64_t swapped_bytes;
    int priority;
    hr_rt_seq_ledger kv; /* refreshed after every step that computed for it and at release or swap-out */
    double t_submit, t_admit, t_first_token, t_finish; /* hr_time_now() seconds; 0 when not reached */
    uint64_t id;    /* the engine's number for it (1, 2, ... in submission order; events name it) */
    int n_computed; /* tokens whose K/V are in the cache */
    bool swapped;   /* its KV is in the swap tier now */
} hr_rt_request_stats;

/* The pool's ledger. */
typedef struct hr_rt_pool_ledger {
    int blocks_total, blocks_used, blocks_cached, blocks_free;
    uint64_t bytes_total, bytes_used, bytes_cached, bytes_free;
    uint64_t waste_slots; /* slots in used blocks not yet filled */
    uint64_t waste_bytes;
    uint64_t prefix_hit_tokens_total;
    uint64_t blocks_evicted_total;        /* cached blocks reclaimed for new work */
    uint64_t bytes_swapped;               /* bytes of the pool's sequences now in the swap tier */
    uint64_t policy_blocks_evicted_total; /* blocks sequences' policies took out of their tables */
    uint64_t fetched_tokens_total;        /* prefix tokens whose K/V came from the shared tier */
    int n_groups;                         /* layer groups: 1, or several for a hybrid pool (gemma2/3) */
    int n_kinds;
    hr_rt_kv_kind kinds[HR_RT_KV_MAX_KINDS]; /* blocks in use by layer kind */
    uint64_t window_blocks_freed_total;      /* blocks window groups gave back (hybrid pools) */
} hr_rt_pool_ledger;

/* The engine's counters, as published at the end of its last step. */
typedef struct hr_rt_engine_stats {
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
    uint64_t decode_steps, decode_tokens; /* steps with no prompt token in the batch, and their tokens */
    double decode_seconds;
    bool swap_available;
    int headroom_blocks; /* free + evictable blocks minus what running requests may still claim */
    uint64_t masks;      /* constrained decoding: token masks computed, and their seconds */
    double mask_seconds;
    uint64_t argmax_steps;          /* steps whose ids the GPU picked, no logits copied (HEADROOM_CUDA_ARGMAX=device) */
    double sample_seconds;          /* host sampling (samplers, logprobs, masks): part of decode_seconds */
    uint64_t threaded_sample_steps; /* steps whose rows were sampled on several threads */
} hr_rt_engine_stats;

#endif

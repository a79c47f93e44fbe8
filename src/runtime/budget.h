/* budget.h: the KV budget as arithmetic: what a pool of a shape holds for a budget, or which budget
 * holds n sequences, and what the whole process then holds. Pure (no allocation, no model loaded):
 * the runtime sizes its pool with it and the planner (src/plan) plans with the same function. It
 * speaks of the KV pool's configuration and the model's shape, so it lives beside runtime.h rather
 * than in it: front ends read the result (hr_kv_budget, runtime.h) through hr_runtime_budget. */
#ifndef HR_RUNTIME_BUDGET_H
#define HR_RUNTIME_BUDGET_H

#include <stdint.h>

#include "common/status.h"
#include "kv/kv.h"
#include "model/model.h"
#include "runtime/runtime.h"

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
    bool device;              /* the forward pass runs on a GPU (--device cuda): its activations are in the
                                 device arena, the host holds the batch's rows and its pool of host threads
                                 (hr_cuda_host_scratch_bytes) */
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

/* HR_ERR_INVALID_ARG (a format or block size this shape cannot use: the message names both) or
 * HR_ERR_BUDGET (the budget, or mem.mem_limit, holds no n_ctx sequence: the message says what would:
 * the budget or limit one sequence needs, and the longest context that fits) on failure; *out is
 * filled in both cases where it can be. */
hr_status hr_kv_budget_compute(const hr_kv_budget_query *q, hr_kv_budget *out, hr_error *err);

/* What the loader keeps resident for a GGUF file of file_bytes with this shape (mem.weight_bytes). */
uint64_t hr_mem_weight_bytes(const hr_hparams *hp, uint64_t file_bytes);

#endif

/* plan.h: the memory planner behind `headroom plan`: a model's shape and weights (from a GGUF file, or
 * a Hugging Face config.json of a model not downloaded), a device (this machine, a GPU profile, or
 * memory and bandwidth by hand), and the whole-process budget for a context x concurrency at every KV
 * format, computed by the runtime's own hr_kv_budget_compute (the function that sizes the pool when
 * the server starts), so the plan and the running process cannot drift apart. No JSON and no printing
 * here: the CLI formats. docs/PLAN.md explains each figure and its sources. */
#ifndef HR_PLAN_PLAN_H
#define HR_PLAN_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/cuda.h"
#include "common/status.h"
#include "runtime/budget.h"
#include "runtime/runtime.h"

/* ---- the model --------------------------------------------------------------------------------- */

#define HR_PLAN_MAX_WEIGHT_ROWS 16

typedef struct hr_plan_weight_row {
    char type[16]; /* ggml type name ("bf16", "q4_0", "f32", ...) */
    int n_tensors;
    uint64_t n_elements;
    uint64_t bytes;
} hr_plan_weight_row;

typedef struct hr_plan_model {
    hr_hparams hp;        /* shape (arch, layers, heads, head_dim, GQA, window, tied output) */
    bool from_config;     /* a config.json (no weights): bytes computed from the shape */
    char weight_type[16]; /* config: the matrices' type; GGUF: the most common matrix type */
    hr_plan_weight_row rows[HR_PLAN_MAX_WEIGHT_ROWS]; /* tensors by type, largest first */
    int n_rows;
    uint64_t tensor_bytes;     /* sum of rows */
    uint64_t file_bytes;       /* GGUF: the file; config: tensors + the metadata a GGUF of it would carry */
    uint64_t resident_bytes;   /* what the loader holds: hr_mem_weight_bytes(hp, file_bytes) */
    uint64_t gpu_weight_bytes; /* on a GPU: what the backend uploads (GGUF: hr_cuda_model_weight_bytes
                                  exactly; config: every tensor, rounded to the arena's pieces) */
    char gpu_refused[512];     /* "" where `--device cuda` takes the model, else its one line of refusal
                                  (hr_cuda_check_model; a config: hr_cuda_check_hparams) */
} hr_plan_model;

/* A Hugging Face config.json, read by the loader's own conversion (hr_model_config_hparams, model/hf.c:
 * every architecture a checkpoint directory loads; "model_type" or "architectures"). weight_type
 * NULL: from "torch_dtype" (or "dtype"); else f32, f16, bf16, q8_0, q4_0, q4_K, q5_K, q6_K (matrices;
 * rows a block type cannot hold are f16, norms f32, as `headroom synth` writes them). Errors: a
 * missing or ill-typed field names it (HR_ERR_FORMAT); an unknown architecture names it and the known
 * ones (HR_ERR_UNSUPPORTED); a bad weight type lists the known (HR_ERR_INVALID_ARG). */
hr_status hr_plan_model_from_config(const char *json_text, size_t len, const char *weight_type, hr_plan_model *out,
                                    hr_error *err);
/* path: a GGUF file (tensor directory read, weights mapped but not touched), a config.json, or a Hugging
 * Face checkpoint directory (its config.json). */
hr_status hr_plan_model_open(const char *path, const char *weight_type, hr_plan_model *out, hr_error *err);

/* ---- the device -------------------------------------------------------------------------------- */

typedef struct hr_plan_device {
    char name[128];
    bool gpu;
    uint64_t mem_bytes; /* what the driver (or /proc/meminfo MemAvailable) reports */
    double util;        /* the fraction of mem_bytes the plan may use (GPUs: 0.9, as vLLM's default) */
    double bw_gbps;     /* memory bandwidth, GB/s (datasheet, or measured here) */
    double tflops;      /* dense bf16 tensor TFLOP/s (datasheet; 0 on host: calibrate) */
    bool bw_measured;
    uint64_t reserved_bytes; /* taken before the model: the runtime itself (GPU: CUDA context, library
                                workspaces; host: HR_MEM_BASE_BYTES) */
    const char *source;      /* where the figures come from (docs/PLAN.md has the links) */
    bool from_driver;        /* mem_bytes and reserved_bytes (in use now) read from this machine's driver
                                (hr_plan_device_cuda) */
} hr_plan_device;

/* "h200", "h100-80gb", "a100-80gb", "a100-40gb", "l40s", "l4", "rtx4090", or the name the driver gives
 * that card ("NVIDIA H200", "NVIDIA H100 80GB HBM3": nvidia-smi's, cuDeviceGetName's), case-insensitive;
 * "host" is this machine: hr_plan_device_host. Unknown: HR_ERR_NOT_FOUND listing the names and how to give
 * --device-mem / --device-bw by hand. */
hr_status hr_plan_device_by_name(const char *name, hr_plan_device *out, hr_error *err);
const char *hr_plan_device_names(void);
/* GPU `ordinal` of this machine through its driver (driver_lib; NULL: libcuda.so.1), as `serve --device
 * cuda:N` will find it: the driver's total memory, what is in use already (other processes and this
 * process's own CUDA context) as reserved, and the bandwidth and bf16 rate of the profile the driver's
 * name for the card picks (0 for a card without one: --device-bw gives it). The device is closed
 * again. A machine without the driver or the GPU: HR_ERR_UNSUPPORTED, one line beginning "CUDA: ". */
hr_status hr_plan_device_cuda(int ordinal, const char *driver_lib, hr_plan_device *out, hr_error *err);
/* This machine: MemAvailable from /proc/meminfo; bandwidth measured by streaming 256 MiB twice (about
 * 0.2 s) when measure_bw, else 0. */
hr_status hr_plan_device_host(bool measure_bw, hr_plan_device *out, hr_error *err);
/* Streaming read bandwidth of this machine in GB/s (one thread; bench/membw.c's method). */
double hr_plan_measure_bw(size_t bytes);

/* ---- the plan ---------------------------------------------------------------------------------- */

typedef struct hr_plan_params {
    int n_ctx;                          /* 0: the model's trained context, capped at 4096 (the runtime's default) */
    int concurrency;                    /* sequences of n_ctx at once (0: 1) */
    hr_rt_kv_format k_format, v_format; /* the format the budget row is for (the table covers every one) */
    int block_size;                     /* 0: 16 */
    int max_batch_tokens;               /* 0: 512 */
    int max_running;                    /* 0: max(concurrency, the runtime's 64) */
    int n_threads;                      /* host attention scratch (0: this machine's cores; GPUs: 1) */
} hr_plan_params;

typedef struct hr_plan_format_row {
    hr_rt_kv_format k_format, v_format;
    bool usable;          /* the format can hold this shape (head_dim, block size) */
    uint64_t token_bytes; /* every layer, K and V, scales included */
    hr_kv_budget need;    /* n_ctx x concurrency: the whole process */
    bool fits;            /* need.total_bytes <= the device's usable bytes */
    hr_kv_budget most;    /* the pool the usable bytes leave (mem_limit = usable) */
    int max_concurrency;  /* sequences of n_ctx the usable bytes hold */
    int64_t max_ctx;      /* the longest context each of `concurrency` sequences can have */
} hr_plan_format_row;

typedef struct hr_plan {
    hr_plan_params p;      /* defaults filled in */
    uint64_t usable_bytes; /* mem_bytes x util */
    int held_ctx;          /* tokens one sequence holds at most: n_ctx, or the sliding window (+ one
                              block) when the model has one */
    int n_full_layers, n_window_layers;
    uint64_t layer_token_bytes; /* one layer, one token, K and V, in the chosen format */
    /* the pool's layer groups at the chosen format (kv.h): one for a one-kind model; a model mixing
     * window and full layers (gemma2/3) has window groups that hold at most their window */
    hr_kv_groups groups;
    uint64_t kind_token_bytes[HR_KV_MAX_KINDS]; /* per kind: bytes per token, all its layers */
    uint64_t kind_seq_bytes[HR_KV_MAX_KINDS];   /* per kind: one sequence at n_ctx, at most */
    uint64_t seq_bytes;                         /* one sequence at n_ctx, every group: the worst case */
    hr_plan_format_row rows[HR_RT_KV_FORMAT_COUNT];
    int chosen; /* index of the chosen format's row */
    /* decode roofline at the chosen row: one step reads the weights once and every sequence's KV */
    double step_s, decode_tok_s;
    /* a GPU device: the one arena `serve --device cuda` reserves there (hr_cuda_arena_plan_compute,
     * the function the runtime sizes it with: total = the profile's memory, util = its util), at the
     * chosen format, the context and max_batch_tokens; gpu_ok false with gpu_why when it does not fit */
    bool gpu_planned, gpu_ok;
    hr_cuda_arena_plan gpu;
    char gpu_why[512];
} hr_plan;

/* Fills the plan for every KV format. HR_ERR_INVALID_ARG when the chosen format cannot hold this shape;
 * otherwise HR_OK even when nothing fits (the rows say). */
/* Each layer's window as the pool will be told it (w holds n_layer entries): a model mixing window and
 * full layers gets its first n_window_layers layers windowed to swa_window (only the counts shape the
 * groups and their bytes); NULL for a one-kind model. */
const int32_t *hr_plan_layer_windows(const hr_hparams *hp, int32_t *w);

hr_status hr_plan_compute(const hr_plan_model *m, const hr_plan_device *d, const hr_plan_params *p, hr_plan *out,
                          hr_error *err);

/* ---- traffic ----------------------------------------------------------------------------------- */

/* One request of a traffic: when it arrives, its prompt and output lengths, and an optional shared
 * prefix (requests with the same prefix_id start with the same n_prefix tokens, so the engine's prefix
 * cache sees them as a chat history, a system prompt or a RAG document). */
typedef struct hr_traffic_req {
    double t_arrival; /* seconds from the start */
    int n_prompt, n_output;
    int prefix_id; /* -1: none */
    int n_prefix;  /* tokens shared with the prefix's other requests (<= n_prompt) */
} hr_traffic_req;

typedef struct hr_traffic {
    char name[64];
    hr_traffic_req *reqs; /* by arrival */
    int n;
} hr_traffic;

/* A preset (chat, rag, agent, burst, long: docs/PLAN.md gives each distribution) of n requests
 * (0: the preset's own count) from seed, lengths clipped so prompt + output fits n_ctx. */
hr_status hr_traffic_preset(const char *name, int n, int n_ctx, uint64_t seed, hr_traffic *out, hr_error *err);
/* A trace: JSON lines {"t": seconds, "prompt": tokens, "output": tokens, "prefix": id, "prefix_tokens": n}
 * ("prefix" and "prefix_tokens" optional). Errors name the line and the field. */
hr_status hr_traffic_load(const char *path, int n_ctx, hr_traffic *out, hr_error *err);
void hr_traffic_free(hr_traffic *t);
const char *hr_traffic_preset_names(void);

/* ---- the step-time cost model -------------------------------------------------------------------- */

/* A step reads the weights once and every token's visible KV, and computes 2 x matrix parameters flops
 * per token in the layers, 2 x the output projection's per row that samples, and attention per
 * visible key. Its time is
 *   max(bytes / bw, layer flops / rate(tokens) + head flops / head rate(rows)) + attention flops / attn
 *   rate + overhead + rows x row_s
 * where rate(T) is the layers' matrix rate at T tokens a step and head rate(R) the output projection's
 * at R rows: on a CPU a small batch runs its matrices far below the large-batch rate (a decode step of
 * 16 rows here: ~0.6x of a 512-token prefill's) and the one large output matrix runs faster than the
 * layers' smaller ones, so the calibration measures both at 1 .. 512 (curve); a roofline has one rate
 * for everything and counts attention with the matrices. overhead and row_s are what the engine's own decode steps take
 * beyond the kernels (scheduling, bookkeeping; sampling per row). */
#define HR_COST_CURVE 12
typedef struct hr_cost_model {
    double bw_gbps;                     /* bytes a step streams, GB/s */
    double gflops;                      /* matrix flops, GFLOP/s, at large batches (and any without a curve) */
    int n_curve;                        /* 0: gflops at every batch size */
    int curve_tokens[HR_COST_CURVE];    /* tokens in a step, ascending */
    double curve_gflops[HR_COST_CURVE]; /* the layers' matrix rate measured at that many tokens */
    double curve_head[HR_COST_CURVE];   /* the output projection's rate at that many rows */
    double attn_gflops;                 /* attention's rate (0: attention counts as matrix flops) */
    double overhead_s;                  /* per step */
    double row_s;                       /* per row that samples (0: not calibrated; a roofline has none) */
    char source[256];                   /* "calibrated on this machine ...", "roofline: NVIDIA H100 ..." */
} hr_cost_model;

/* What one step does, for hr_cost_step_s. */
typedef struct hr_cost_step {
    double bytes;       /* weights once + every token's visible KV */
    double layer_flops; /* 2 x the layers' matrix parameters x n_tokens */
    int n_tokens;
    double head_flops; /* 2 x the output projection's parameters x n_rows */
    int n_rows;        /* rows that produce logits and sample */
    double attn_flops; /* 4 x layers x heads x head_dim per visible key, over the batch */
} hr_cost_step;

/* The layers' matrix rate at n tokens a step (head: the output projection's at n rows), GFLOP/s: the
 * curve interpolated linearly in log(n), its end points beyond it; gflops without a curve. */
double hr_cost_rate(const hr_cost_model *c, int n, bool head);
/* The cost model's time for one step. */
double hr_cost_step_s(const hr_cost_model *c, const hr_cost_step *s);

/* The per-step overhead and per-row cost from two timed decode steps of rows_a < rows_b sampled rows,
 * given each step's time left over after the kernels' share (resid = measured - the step's time without
 * overhead and row_s): the line through both points, its slope (row_s) and intercept (overhead_s)
 * clamped at 0 (timing noise can make either negative; a negative cost would make the simulator faster
 * than the kernels). */
void hr_cost_fit_rows(double resid_a, int rows_a, double resid_b, int rows_b, double *overhead_s, double *row_s);

/* Measures this machine's kernels once, on a runtime (runtime/runtime.h) opened on a synthetic
 * (hr_runtime_params.synth) TinyLlama-shaped layer stack in weight_type
 * ("q4_0", "q8_0", "f16", ...): forward passes of T = 1 (bandwidth) and T = 2 .. 512 tokens, once with
 * the last token's logits and once with every token's (the two rate curves: the layers', and from the
 * difference the output projection's; the layers' at 512 is gflops), 64 tokens after 768 cached ones
 * against after none (attention's rate),
 * and two decode steps of 4 and 16 sequences run by the real engine (hr_runtime_step, every row sampling
 * greedily; what those take beyond the kernels: overhead_s and row_s, hr_cost_fit_rows), on n_threads
 * (0: every core). Takes a few seconds. */
hr_status hr_cost_calibrate(const char *weight_type, int n_threads, hr_cost_model *out, hr_error *err);
hr_status hr_cost_save(const hr_cost_model *c, const char *path, hr_error *err);
hr_status hr_cost_load(const char *path, hr_cost_model *out, hr_error *err);
/* A device's roofline (datasheet bandwidth and dense bf16 flops). */
void hr_cost_roofline(const hr_plan_device *d, hr_cost_model *out);

/* ---- simulation ---------------------------------------------------------------------------------- */

typedef struct hr_sim_candidate {
    hr_rt_kv_format format; /* K and V */
    int window;             /* 0: full attention; > 0: every request under window:W (kv/ policy) */
    hr_rt_admission admission;
    int max_running;
} hr_sim_candidate;

typedef struct hr_sim_result {
    hr_sim_candidate c;
    int n_blocks;           /* the pool the device holds for this candidate (the plan's) */
    int completed, refused; /* refused: can never fit the pool, past the context, queue full */
    uint64_t preemptions;
    int peak_blocks;        /* most blocks in use (used + cached by the prefix cache excluded) */
    uint64_t peak_kv_bytes; /* peak_blocks x the real format's block bytes */
    uint64_t output_tokens;
    double makespan_s;         /* virtual seconds from the first arrival to the last finish */
    double throughput_tok_s;   /* output tokens / makespan */
    double ttft_p50, ttft_p99; /* virtual seconds, arrival -> first token */
    double itl_p50, itl_p99;   /* virtual seconds between a request's tokens */
} hr_sim_result;

/* The simulator as a backend (backend/backend.h): a runtime opened on a shape alone with this as
 * hr_runtime_params.backend and the pricing state as backend_user (sim.c). */
extern const struct hr_backend_ops hr_backend_sim;

/* Runs the traffic through the engine's real scheduler and block manager (a runtime stepping the "sim"
 * backend, hr_backend_sim, through the backend seam: it computes nothing, writes zero K/V into a pool
 * of the candidate's block count and returns fixed logits) in virtual time: each step advances the
 * clock by the cost model's time for that batch. Nothing waits in real time; results depend only on
 * the inputs (deterministic). The pool has the candidate's format on a one-layer, one-head stand-in
 * shape with the block count the plan gives the real model on the device (hr_kv_budget_compute with
 * the device's usable bytes). */
hr_status hr_sim_run(const hr_plan_model *m, const hr_plan *pl, const hr_plan_device *d, const hr_cost_model *cost,
                     const hr_traffic *t, const hr_sim_candidate *c, hr_sim_result *out, hr_error *err);

/* ---- the sweep and the recommendation --------------------------------------------------------- */

typedef struct hr_sim_sweep_params {
    const hr_rt_kv_format *formats; /* candidates: every combination of these */
    int n_formats;
    const int *windows; /* 0: full attention */
    int n_windows;
    const hr_rt_admission *admissions;
    int n_admissions;
    const int *max_running;
    int n_max_running;
    double slo_ttft_s, slo_itl_s; /* p99 bounds (0: none) */
    const char *eval_path;        /* a `headroom eval --json` result: each candidate's perplexity change */
    double max_ppl_increase_pct;  /* with eval_path: the quality bound (a candidate without a figure fails) */
} hr_sim_sweep_params;

typedef struct hr_sim_row {
    hr_sim_result r;
    bool ran; /* false: the format cannot hold this shape */
    bool ppl_known;
    double ppl_increase_pct;
    bool meets;   /* every request completed, the SLOs and the quality bound hold */
    char why[96]; /* when not: the first bound it misses */
} hr_sim_row;

/* Runs every candidate; *rows (n_rows) is malloc'd (free it); *best is the row that meets every bound
 * with the highest throughput, or -1; among rows within 2% of that throughput the least lossy (the eval
 * result's perplexity change, else f16 < q8 < fp8 < q4h < q4 < kivi2, full attention before a window),
 * then the lowest TTFT p99. */
hr_status hr_sim_sweep(const hr_plan_model *m, const hr_plan *pl, const hr_plan_device *d, const hr_cost_model *cost,
                       const hr_traffic *t, const hr_sim_sweep_params *sp, hr_sim_row **rows, int *n_rows, int *best,
                       hr_error *err);

/* ggml type id of a weight type name (case-insensitive), or -1. */
int hr_plan_weight_type_id(const char *name);

#endif

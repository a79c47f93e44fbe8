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

#include "common/status.h"
#include "kv/kv.h"
#include "model/model.h"
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
    uint64_t tensor_bytes;   /* sum of rows */
    uint64_t file_bytes;     /* GGUF: the file; config: tensors + the metadata a GGUF of it would carry */
    uint64_t resident_bytes; /* what the loader holds: hr_mem_weight_bytes(hp, file_bytes) */
} hr_plan_model;

/* A Hugging Face config.json (llama, mistral, qwen2; "architectures" or "model_type"). weight_type
 * NULL: from "torch_dtype" (or "dtype"); else f32, f16, bf16, q8_0, q4_0, q4_K, q5_K, q6_K (matrices;
 * rows a block type cannot hold are f16, norms f32, as `headroom synth` writes them). Errors: a
 * missing or ill-typed field names it (HR_ERR_FORMAT); an unknown architecture names it and the known
 * ones (HR_ERR_UNSUPPORTED); a bad weight type lists the known (HR_ERR_INVALID_ARG). */
hr_status hr_plan_model_from_config(const char *json_text, size_t len, const char *weight_type, hr_plan_model *out,
                                    hr_error *err);
/* path: a GGUF file (tensor directory read, weights mapped but not touched) or a config.json. */
hr_status hr_plan_model_open(const char *path, const char *weight_type, hr_plan_model *out, hr_error *err);

/* ---- the device -------------------------------------------------------------------------------- */

typedef struct hr_plan_device {
    char name[48];
    bool gpu;
    uint64_t mem_bytes; /* what the driver (or /proc/meminfo MemAvailable) reports */
    double util;        /* the fraction of mem_bytes the plan may use (GPUs: 0.9, as vLLM's default) */
    double bw_gbps;     /* memory bandwidth, GB/s (datasheet, or measured here) */
    bool bw_measured;
    uint64_t reserved_bytes; /* taken before the model: the runtime itself (GPU: CUDA context, library
                                workspaces; host: HR_MEM_BASE_BYTES) */
    const char *source;      /* where the figures come from (docs/PLAN.md has the links) */
} hr_plan_device;

/* "h200", "h100-80gb", "a100-80gb", "a100-40gb", "l40s", "l4", "rtx4090" (case-insensitive; "host" is
 * this machine: hr_plan_device_host). Unknown: HR_ERR_NOT_FOUND listing the names and how to give
 * --device-mem / --device-bw by hand. */
hr_status hr_plan_device_by_name(const char *name, hr_plan_device *out, hr_error *err);
const char *hr_plan_device_names(void);
/* This machine: MemAvailable from /proc/meminfo; bandwidth measured by streaming 256 MiB twice (about
 * 0.2 s) when measure_bw, else 0. */
hr_status hr_plan_device_host(bool measure_bw, hr_plan_device *out, hr_error *err);
/* Streaming read bandwidth of this machine in GB/s (one thread; bench/membw.c's method). */
double hr_plan_measure_bw(size_t bytes);

/* ---- the plan ---------------------------------------------------------------------------------- */

typedef struct hr_plan_params {
    int n_ctx;                       /* 0: the model's trained context, capped at 4096 (the runtime's default) */
    int concurrency;                 /* sequences of n_ctx at once (0: 1) */
    hr_kv_format k_format, v_format; /* the format the budget row is for (the table covers every one) */
    int block_size;                  /* 0: 16 */
    int max_batch_tokens;            /* 0: 512 */
    int max_running;                 /* 0: max(concurrency, the runtime's 64) */
    int n_threads;                   /* host attention scratch (0: this machine's cores; GPUs: 1) */
} hr_plan_params;

typedef struct hr_plan_format_row {
    hr_kv_format k_format, v_format;
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
    hr_plan_format_row rows[HR_KV_FORMAT_COUNT];
    int chosen; /* index of the chosen format's row */
    /* decode roofline at the chosen row: one step reads the weights once and every sequence's KV */
    double step_s, decode_tok_s;
} hr_plan;

/* Fills the plan for every KV format. HR_ERR_INVALID_ARG when the chosen format cannot hold this shape;
 * otherwise HR_OK even when nothing fits (the rows say). */
hr_status hr_plan_compute(const hr_plan_model *m, const hr_plan_device *d, const hr_plan_params *p, hr_plan *out,
                          hr_error *err);

/* ggml type id of a weight type name (case-insensitive), or -1. */
int hr_plan_weight_type_id(const char *name);

#endif

/* model.h: llama-family architectures (llama, mistral, qwen2) as hyper-parameters read from GGUF
 * metadata, their weights (views into the mapped file), and a forward pass over a ragged batch: T
 * tokens from any number of sequences, prefill chunks and decode steps mixed, writing K/V into the
 * paged cache (kv/) and returning logits only for the tokens that ask for them.
 *
 * Dimension letters: T = tokens in the batch, E = embedding width, H = query heads, Hkv = KV heads,
 * D = head dim, F = FFN width, V = vocabulary, L = layers. */
#ifndef HR_MODEL_MODEL_H
#define HR_MODEL_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "gguf/gguf.h"
#include "kv/kv.h"
#include "tensor/tensor.h"

typedef enum hr_arch {
    HR_ARCH_LLAMA = 0,
    HR_ARCH_MISTRAL = 1,
    HR_ARCH_QWEN2 = 2,
} hr_arch;

typedef struct hr_hparams {
    hr_arch arch;
    char arch_name[32];
    char name[128]; /* general.name, or "" */
    int n_vocab;
    int n_ctx_train; /* {arch}.context_length */
    int n_embd;      /* E */
    int n_ff;        /* F */
    int n_head;      /* H */
    int n_head_kv;   /* Hkv */
    int n_layer;     /* L */
    int head_dim;    /* D */
    int n_rot;       /* dims RoPE rotates (<= D) */
    int rope_neox;   /* 0: adjacent pairs (llama, mistral); 1: halves (qwen2) */
    float norm_eps;
    float rope_base;
    float rope_linear_scale; /* positions are multiplied by this (1 / rope.scaling.factor for "linear") */
    bool has_rope_freqs;     /* Llama-3 style per-pair frequency factors (rope_freqs.weight) */
    int sliding_window;      /* 0 = none */
    bool tied_output;        /* output projection shares token_embd */
    bool has_qkv_bias;
} hr_hparams;

typedef struct hr_model hr_model;

/* Opens and validates path (GGUF), reads every hyper-parameter from metadata and binds every tensor,
 * checking shapes and types. Errors name the architecture, key or tensor (and the supported list).
 * The model keeps the file mapped until hr_model_destroy. */
hr_status hr_model_load(const char *path, hr_model **out, hr_error *err);
/* The same, choosing how the weights are held (gguf.h: mapped, or resident in huge pages) and
 * whether q4_0 / q8_0 / q4_K matrices are repacked into q4_0x16 / q8_0x16 / q4_Kx16 (tensor.h; hr_model_load and
 * hr_model_load_gguf repack): in place, so the model's memory does not grow, but a mapped file's pages then become
 * private copies; `repack` false leaves the data as in the file (shared pages, the plain kernels). */
hr_status hr_model_load_hold(const char *path, hr_gguf_hold hold, bool repack, hr_model **out, hr_error *err);
/* The same from an already opened GGUF (repacking where hr_gguf_edit_begin allows); the model takes
 * ownership of g (closing it on destroy, and on failure). */
hr_status hr_model_load_gguf(hr_gguf *g, hr_model **out, hr_error *err);
void hr_model_destroy(hr_model *m); /* NULL allowed */

const hr_hparams *hr_model_hparams(const hr_model *m);
const hr_gguf *hr_model_gguf(const hr_model *m);
/* Bytes of all weight tensors (what a decode step streams from memory). */
uint64_t hr_model_weight_bytes(const hr_model *m);
/* The most common weight type of the matrices as in the file ("q4_0", "f16", ...). */
const char *hr_model_type_name(const hr_model *m);
/* The type the model computes tensor t of its GGUF in: t->type, or an x16 type where the load
 * repacked it (then t->data holds interleaved groups, not the file's rows). */
hr_dtype hr_model_tensor_type(const hr_model *m, const hr_gguf_tensor *t);
/* Matrices repacked at load, and their bytes. */
int hr_model_packed_tensors(const hr_model *m, uint64_t *bytes);

/* A ragged batch: token i belongs to sequence seq[i] at position pos[i]. Within one sequence the
 * tokens must be consecutive positions continuing its cache (pos == tokens already cached, and
 * hr_kv_seq_reserve must have made room). want_logits[i] != 0 asks for token i's logits; NULL asks
 * for none. */
typedef struct hr_batch {
    int n_tokens;
    const int32_t *tokens;
    const int32_t *pos;
    const hr_kv_seq *seq;
    const uint8_t *want_logits;
} hr_batch;

/* Per-run state of the forward pass: thread pool, kernels, scratch sized once for max_tokens, the KV
 * pool it writes to (borrowed). */
typedef struct hr_model_ctx hr_model_ctx;

typedef struct hr_model_ctx_params {
    int n_threads;         /* 0 = number of online CPUs */
    int max_batch_tokens;  /* the largest T a forward call may get */
    int max_ctx;           /* the longest sequence attention must handle */
    const char *force_isa; /* NULL, "scalar", "avx2", "avx512" */
} hr_model_ctx_params;

hr_status hr_model_ctx_create(const hr_model *m, hr_kv_pool *kv, const hr_model_ctx_params *p, hr_model_ctx **out,
                              hr_error *err);
void hr_model_ctx_destroy(hr_model_ctx *c); /* NULL allowed */
/* Bytes hr_model_ctx_create allocates for this shape (every scratch buffer, the matmul activation
 * rows, attention scores for max_ctx per thread): what the memory planner counts. Pure. */
uint64_t hr_model_ctx_scratch_bytes(const hr_hparams *hp, int max_batch_tokens, int max_ctx, int block_size,
                                    int n_threads);
const char *hr_model_ctx_isa(const hr_model_ctx *c);
int hr_model_ctx_n_threads(const hr_model_ctx *c);

/* Runs the batch; logits receives one row of n_vocab floats per token with want_logits set, in batch
 * order. Commits nothing to the KV ledger: the caller calls hr_kv_seq_commit afterwards. */
hr_status hr_model_forward(hr_model_ctx *c, const hr_batch *b, float *logits, hr_error *err);

#endif

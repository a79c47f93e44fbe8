/* model.h: decoder-only architectures (llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3, qwen3moe, gpt-oss) as
 * hyper-parameters read from GGUF metadata (keys and tensor names as llama.cpp's converter writes them), their weights
 * (views into the mapped file), and a forward pass over a ragged batch: T tokens from any number of sequences, prefill
 * chunks and decode steps mixed, writing K/V into the paged cache (kv/) and returning logits only for the tokens that
 * ask for them.
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
    HR_ARCH_QWEN3 = 3,  /* per-head RMSNorm of Q and K before RoPE */
    HR_ARCH_GEMMA2 = 4, /* scaled embeddings, post-norms, GeGLU, soft-capping, alternating window/full layers */
    HR_ARCH_GEMMA3 = 5, /* gemma2 without attention soft-capping, with Q/K norm, 5 window : 1 full layers */
    HR_ARCH_PHI3 = 6,   /* fused Q|K|V and gate|up matrices, LongRoPE frequency factors */
    /* qwen3's attention, a mixture-of-experts FFN in every layer */
    HR_ARCH_QWEN3MOE = 7,
    /* DeepSeek-V2/V3: multi-head latent attention (one latent + decoupled RoPE key cached per token),
     * DeepSeek's MoE (softmax or sigmoid gates, shared experts, leading dense layers) */
    HR_ARCH_DEEPSEEK2 = 8,
    /* gpt-oss (llama.cpp's LLM_ARCH_OPENAI_MOE): Q/K/V/O biases, learned attention sinks, window (128) and
     * full layers alternating, YaRN, a MoE FFN in every layer (router and expert biases, softmax over the
     * top-k router logits, swiglu_oai), experts usually MXFP4 */
    HR_ARCH_GPT_OSS = 9,
} hr_arch;

/* How a DeepSeek router turns logits into gates (llama.cpp's expert_gating_func numbers). */
typedef enum hr_moe_gating {
    HR_MOE_GATING_SOFTMAX = 1, /* V2 */
    HR_MOE_GATING_SIGMOID = 2, /* V3: selection adds exp_probs_b, the weights do not */
} hr_moe_gating;

/* "llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3, qwen3moe, gpt-oss, deepseek2": what the loader accepts (llama
 * with {arch}.expert_count > 0 is Mixtral). */
const char *hr_arch_supported_list(void);

/* The FFN's gated activation: act(x W_gate^T) * (x W_up^T). */
typedef enum hr_ffn_act {
    HR_FFN_SILU = 0,      /* SwiGLU */
    HR_FFN_GELU_TANH = 1, /* GeGLU, GELU by its tanh approximation (gemma) */
    /* gpt-oss's experts: g = min(gate, 7), u = clamp(up, -7, 7), g sigmoid(1.702 g) (u + 1) */
    HR_FFN_SWIGLU_OAI = 2,
} hr_ffn_act;

/* What one layer's attention sees and how it rotates positions: what a KV manager groups layers by
 * (layers of one kind and window can share a block table and its freeing rule). */
typedef enum hr_attn_kind {
    HR_ATTN_FULL = 0,   /* every earlier position */
    HR_ATTN_WINDOW = 1, /* a query at p sees positions > p - window (itself included) */
} hr_attn_kind;

typedef struct hr_layer_attn {
    hr_attn_kind kind;
    int window;              /* HR_ATTN_WINDOW: tokens seen, else 0 */
    float rope_base;         /* this layer's RoPE base (gemma3: 10000 on window layers, rope.freq_base on full) */
    float rope_linear_scale; /* positions are multiplied by this on this layer */
} hr_layer_attn;

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
    int rope_neox;   /* 0: adjacent pairs (llama, mistral); 1: halves (qwen2, qwen3, gemma, phi3) */
    float norm_eps;
    float rope_base;
    float rope_linear_scale; /* positions are multiplied by this (1 / rope.scaling.factor for "linear") */
    bool has_rope_freqs;     /* Llama-3 style per-pair frequency factors (rope_freqs.weight) */
    int sliding_window;      /* the window of every layer (mistral); 0 where any layer attends in full
                                (per layer: hr_model_layer_attn) */
    bool tied_output;        /* output projection shares token_embd */
    bool has_qkv_bias;
    /* the families past llama's (0 / false for llama, mistral, qwen2) */
    bool qk_norm;           /* RMSNorm over each head of Q and K (weights of D) before RoPE: qwen3, gemma3 */
    bool post_norms;        /* RMSNorm of the attention and FFN outputs before their residual adds: gemma */
    hr_ffn_act ffn_act;     /* SwiGLU, or GeGLU (gemma) */
    float embd_scale;       /* the embedding rows are multiplied by this (gemma: sqrt(E)); 0 = 1 */
    float attn_scale;       /* q.k multiplier (1/sqrt(D); gemma's 27B shapes 1/sqrt(E/H)) */
    float attn_softcap;     /* scores become c tanh(s / c) before the softmax; 0 = none (gemma2: 50) */
    float final_softcap;    /* the same on the logits (gemma2: 30; gemma3 where the file says) */
    int n_window_layers;    /* layers attending through a window (of n_layer) */
    int swa_window;         /* those layers' window (gemma's beside full layers too), 0 = none */
    bool has_longrope;      /* rope_factors_short/long.weight (phi3): long where max_ctx > n_ctx_orig */
    int n_ctx_orig;         /* {arch}.rope.scaling.original_context_length (phi3), else n_ctx_train */
    float rope_attn_factor; /* {arch}.rope.scaling.attn_factor: cos and sin are multiplied by it; 0 = 1 */
    bool fused_qkv;         /* one blk.N.attn_qkv matrix (Q rows, then K, then V): phi3 */
    bool fused_gate_up;     /* one blk.N.ffn_up matrix of 2F rows (gate, then up): phi3 */
    /* mixture of experts (qwen3moe; llama with experts: Mixtral); 0 = a dense FFN. Each token's router
     * logits (blk.N.ffn_gate_inp) go through a softmax over all n_expert, the n_expert_used largest are
     * kept and renormalized to sum 1 (llama.cpp's build_moe_ffn with norm_w, as both families run it),
     * and the token's FFN output is the weighted sum of those experts' SwiGLU FFNs, in rank order. */
    int n_expert;      /* {arch}.expert_count */
    int n_expert_used; /* {arch}.expert_used_count (k) */
    int n_ff_exp;      /* one expert's FFN width: qwen3moe's expert_feed_forward_length (default
                          F / k, as llama.cpp), Mixtral's feed_forward_length */
    /* DeepSeek-V2/V3 (deepseek2; 0 elsewhere). Multi-head latent attention: the KV cache holds per layer
     * and token one vector [kv_lora_rank normalized latent | n_rot roped key] (head_dim wide, one KV
     * head), V is its first kv_lora_rank dims; a query head is [q_nope W_UK (kv_lora_rank) | q_pe]. */
    int q_lora_rank;          /* {arch}.attention.q_lora_rank: 0 = one attn_q matrix (V2-Lite) */
    int kv_lora_rank;         /* {arch}.attention.kv_lora_rank (d_c): also V's dims within K (hr_kv_config.v_from_k) */
    int qk_nope_dim;          /* a head's non-rotated Q/K dims: key_length_mla - n_rot */
    int v_head_dim;           /* {arch}.attention.value_length_mla: a head's output after W_UV */
    int n_layer_dense;        /* {arch}.leading_dense_block_count: layers [0, n) have a dense FFN */
    int n_expert_shared;      /* {arch}.expert_shared_count: ffn_*_shexp of n_expert_shared x n_ff_exp, always added */
    hr_moe_gating moe_gating; /* {arch}.expert_gating_func */
    bool moe_norm;            /* {arch}.expert_weights_norm: the k weights renormalized to sum 1 */
    float moe_scale;          /* {arch}.expert_weights_scale: the weights multiplied by it; 0 = 1 */
    int n_expert_groups;      /* {arch}.expert_group_count: > 1 limits top-k to the best groups */
    int n_group_used;         /* {arch}.expert_group_used_count */
    /* gpt-oss (false / 0 elsewhere) */
    bool attn_sinks;       /* blk.N.attn_sinks: per query head a learned logit s_h joins each softmax's
                              denominator (weights e^(x_t - m) / (sum_t e^(x_t - m) + e^(s_h - m))) */
    bool moe_softmax_topk; /* routing by the router logits (plus blk.N.ffn_gate_inp.bias): the k largest,
                              then a softmax over those k alone (llama.cpp's SOFTMAX_WEIGHT gating) */
    /* YaRN ({arch}.rope.scaling.type "yarn"; gpt-oss, DeepSeek-V2/V3): positions are not scaled; pair i of
     * a rotation of base b turns b^(-2i/n_rot) * hr_rope_yarn_freq_factor(hp, b, i) per position, and
     * the rotated dims are multiplied by rope_attn_factor (llama.cpp's mscale: {arch}.rope.scaling.
     * attn_factor x (1 + 0.1 ln factor), after its cancelling of get_mscale), as llama.cpp computes them */
    float yarn_factor;                    /* rope.scaling.factor s (position interpolation 1/s); 0 = no YaRN */
    float yarn_ext_factor;                /* extrapolation mix: 1 (llama.cpp's default for yarn) */
    float yarn_beta_fast, yarn_beta_slow; /* correction range in rotations: 32 and 1 (llama.cpp's) */
    /* deepseek2: {arch}.rope.scaling.yarn_log_multiplier / 0.1 (the converter writes 0.1 mscale_all_dim:
     * 0.707 for V2 and V2-Lite, 1 for V3), 0 = absent. YaRN's temperature then leaves the rotation (its
     * magnitude is rope.scaling.attn_factor alone) for the attention scale, which becomes
     * mscale^2 / sqrt(key_length_mla), mscale = that magnitude x (1 + 0.1 yarn_log_mul ln s): llama.cpp's
     * deepseek2 kq_scale */
    float yarn_log_mul;
    bool kv_b_split; /* a file from before llama.cpp's MLA converter: W_UK | W_UV in one attn_kv_b,
                        split into f32 copies at load */
} hr_hparams;

/* YaRN's factor on pair i's frequency (of n_rot / 2) for a rotation of base `base`, as ggml's rope
 * computes theta = theta_interp (1 - r) + theta_extrap r with theta_interp = theta_extrap / s:
 * (1 - r_i) / s + r_i, r_i = ext_factor (1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1)), lo and hi
 * ggml's correction dims from beta_fast / beta_slow over n_ctx_orig (floor / ceil, in float as ggml
 * does, so the same pairs are mixed). 1 where hp has no YaRN. Pure (model/rope_yarn.c). */
double hr_rope_yarn_freq_factor(const hr_hparams *hp, double base, int i);
/* llama.cpp's YaRN attn_factor, what it passes to its rope (cparams.yarn_attn_factor): m / (1 + 0.1 ln s)
 * times attn_factor (rope.scaling.attn_factor, 1 when absent), in float in that order, where
 * m = get_mscale(s, mscale) / get_mscale(s, mscale_all_dims) when mscale_all_dims != 0 (DeepSeek's
 * yarn_log_multiplier / 0.1; llama.cpp sets mscale = mscale_all_dims for deepseek2, so m = 1) and
 * get_mscale(s, 1) otherwise; get_mscale(s, x) = 0.1 x ln s + 1 (1 for s <= 1). */
float hr_rope_yarn_attn_factor(float factor, float attn_factor, float mscale, float mscale_all_dims);
/* The magnitude the rotation applies: hr_rope_yarn_attn_factor times (1 + 0.1 ln s), as ggml's rope
 * multiplies it back in (1.3466 for gpt-oss's s = 32; 1 up to rounding for DeepSeek's files). */
float hr_rope_yarn_mscale(float factor, float attn_factor, float mscale, float mscale_all_dims);

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
/* A Hugging Face checkpoint directory (config.json, model.safetensors or shards with
 * model.safetensors.index.json, tokenizer.json, tokenizer_config.json, generation_config.json; model/hf.c):
 * the same architectures, the same in-memory model as its GGUF conversion. quantize NULL keeps the
 * weights as stored (bf16/f16/f32, mapped, never copied; llama/mistral Q and K pages become private where
 * their rows are permuted); "q8_0", "q4_0" or "q4_K" quantizes every matrix at load. hr_model_load and
 * hr_model_load_hold take a directory too (quantize NULL). Errors name the file and tensor or key. */
hr_status hr_model_load_dir(const char *dir, const char *quantize, bool repack, hr_model **out, hr_error *err);
/* The shape a Hugging Face config.json (its text) gives, through the same config.json -> metadata
 * conversion the directory loader uses (hf.c; a multimodal wrapper's text_config): the hyper-parameters
 * as hr_model_hparams would give them for the loaded checkpoint, tensor-derived ones (tied output,
 * fused QKV, biases, RoPE factor tensors) from what the architecture stores. Reads no weights. */
hr_status hr_model_config_hparams(const char *json_text, size_t len, hr_hparams *out, hr_error *err);
void hr_model_destroy(hr_model *m); /* NULL allowed */

const hr_hparams *hr_model_hparams(const hr_model *m);
/* n_layer entries: each layer's attention kind, window and RoPE base (valid while m lives). */
const hr_layer_attn *hr_model_layer_attn(const hr_model *m);
const hr_gguf *hr_model_gguf(const hr_model *m);
/* The weights as the loader holds them for a GGUF file of file_bytes with this shape: the file (read
 * resident, or mapped and touched) and the vectors (norms, biases, RoPE factors) it copies to f32
 * (load.c, beside the copying). Pure. */
uint64_t hr_model_resident_bytes(const hr_hparams *hp, uint64_t file_bytes);
/* The rest the loader allocates: the model and its per-layer tables. Pure. */
uint64_t hr_model_table_bytes(const hr_hparams *hp);
/* Query heads per KV head as attention takes them together (hr_kv_config.q_per_kv): n_head / n_head_kv,
 * 1 for a latent cache (deepseek2), whose attention reads one head at a time. Pure. */
int hr_model_q_per_kv(const hr_hparams *hp);
/* The n_rot / 2 RoPE frequencies the forward pass turns pair i by per position, in double then
 * rounded to float, the same for every backend: base^(-2i / n_rot) over the model's frequency factors
 * (Llama 3's rope_freqs; LongRoPE's long set where max_ctx passes the original context, else the short
 * one) times YaRN's factor. inv: the full-attention layers' (every layer's where all have a window);
 * inv_swa (NULL: not wanted): the window layers' base where a model mixes the two (gemma). */
void hr_model_rope_inv_freq(const hr_model *m, int max_ctx, float *inv, float *inv_swa);
/* Bytes of all weight tensors (what a decode step streams from memory). */
uint64_t hr_model_weight_bytes(const hr_model *m);
/* Bytes the weights' file(s) hold as loaded: the GGUF file, or a checkpoint's tensors (mapped or quantized)
 * and its metadata. */
uint64_t hr_model_file_bytes(const hr_model *m);
/* For a backend that keeps its own copy of some weights (the GPU's arena): the host pages of [p, p + n),
 * data of one of m's tensors, given back to the system where they are the mapped file's, never written
 * (a GGUF opened with HR_GGUF_MMAP, not repacked: hr_gguf_release; a checkpoint's safetensors shard,
 * less the Q/K rows permuted in place: hr_hf_release). A later read faults them in from the file:
 * nothing changes but the process's memory. Returns the bytes given back, 0 for weights held any other
 * way. hr_model_releasable: the bytes that call would give back, without giving them. */
uint64_t hr_model_release_host(const hr_model *m, const void *p, uint64_t n);
uint64_t hr_model_releasable(const hr_model *m, const void *p, uint64_t n);
/* For a backend that has uploaded [p, p + n) and will never read the host's copy again: where the
 * loader made those bytes itself (a checkpoint's tensors quantized at load, converted, or stacked into
 * experts: hr_hf_drop), their whole pages unmapped, for good: a later read faults. The file's pages are
 * hr_model_release_host's. Returns the bytes dropped, 0 for weights held any other way;
 * hr_model_droppable: the bytes it would drop. */
uint64_t hr_model_drop_host(const hr_model *m, const void *p, uint64_t n);
uint64_t hr_model_droppable(const hr_model *m, const void *p, uint64_t n);
/* Tensor `name` (GGUF naming) as m holds it (a checkpoint's: converted or mapped), or NULL. */
const hr_gguf_tensor *hr_model_find_tensor(const hr_model *m, const char *name);
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
    /* Optional, only where hr_model_ctx_argmax(c) says so: the argmax of each row that wants logits
     * (hr_argmax's choice: the largest, the lowest index on ties), in batch order, in place of its
     * logits, which are then not written. NULL: logits. */
    int32_t *argmax;
} hr_batch;

/* Per-run state of the forward pass on one backend (backend/backend.h: the CPU's thread pool,
 * kernels and scratch sized once for max_tokens; the KV pool it writes to, borrowed). The functions
 * below dispatch to the backend the context was made for (defined in backend/backend.c). */
typedef struct hr_model_ctx hr_model_ctx;
struct hr_backend_ops;

typedef struct hr_model_ctx_params {
    int n_threads;                        /* 0 = number of online CPUs */
    int max_batch_tokens;                 /* the largest T a forward call may get */
    int max_ctx;                          /* the longest sequence attention must handle */
    const char *force_isa;                /* NULL, "scalar", "avx2", "avx512" */
    const struct hr_backend_ops *backend; /* NULL: the CPU backend (hr_backend_cpu) */
    void *backend_user;                   /* the backend's own (the simulator's cost model and shape) */
} hr_model_ctx_params;

hr_status hr_model_ctx_create(const hr_model *m, hr_kv_pool *kv, const hr_model_ctx_params *p, hr_model_ctx **out,
                              hr_error *err);
void hr_model_ctx_destroy(hr_model_ctx *c); /* NULL allowed */
/* Bytes hr_model_ctx_create allocates for this shape (the context, every scratch buffer, the matmul
 * activation rows, attention scores for max_ctx per thread, the thread pool's bookkeeping), computed
 * by the sizes create allocates, for a model whose layers all keep gate and up alike (together or
 * apart; one that mixes the two takes T x F floats more): what the memory planner counts. Pure.
 * (hr_backend_scratch_bytes in backend.h: the same for any backend.) */
uint64_t hr_model_ctx_scratch_bytes(const hr_hparams *hp, int max_batch_tokens, int max_ctx, int block_size,
                                    int n_threads);
const char *hr_model_ctx_isa(const hr_model_ctx *c);
int hr_model_ctx_n_threads(const hr_model_ctx *c);
/* True where c's forward fills hr_batch.argmax itself (the GPU's, with HEADROOM_CUDA_ARGMAX=device:
 * the ids come back instead of the rows of logits). The CPU's is false: its logits are in memory. */
bool hr_model_ctx_argmax(const hr_model_ctx *c);

/* Calls fn(user, item, ith) exactly once for every item in [0, n) on c's host threads (the CPU
 * backend's kernel pool; the GPU backend's pool of host threads), the items handed out in increasing
 * order, and returns when all have returned, their writes visible to the caller; ith (0: the caller,
 * < hr_model_ctx_n_threads) only picks per-thread scratch: fn's result must not depend on it. A
 * backend without threads runs them in order on this thread. Driven by the thread that drives
 * forward, never during one. The engine samples a step's rows through it. */
typedef void (*hr_model_item_fn)(void *user, int64_t item, int ith);
void hr_model_ctx_run_items(hr_model_ctx *c, hr_model_item_fn fn, void *user, int64_t n);
/* The least work, in row elements (a step's rows x the vocabulary, the engine's sampling), that c's
 * threads finish sooner than this thread alone, by bench_sampler's measurements: the CPU's pool is
 * awake after the forward pass, the GPU backend's has slept through the GPU's (its wake-up costs tens
 * of microseconds). INT64_MAX where c has one thread. */
int64_t hr_model_ctx_run_items_min(const hr_model_ctx *c);

/* Runs the batch; logits receives one row of n_vocab floats per token with want_logits set, in batch
 * order. Commits nothing to the KV ledger: the caller calls hr_kv_seq_commit afterwards. */
hr_status hr_model_forward(hr_model_ctx *c, const hr_batch *b, float *logits, hr_error *err);

#endif

/* synth.h: deterministic random-weight models of real shapes, written as GGUF. Speed does not
 * depend on weight values, so these stand in for TinyLlama-1.1B, Llama-3.2-1B, Qwen2.5-0.5B in
 * benchmarks; tiny shapes serve tests and the built-in demo model. Each file carries a working
 * vocabulary (SentencePiece-style for llama-2 shapes, byte-level BPE for llama-3/qwen2 shapes). */
#ifndef HR_MODEL_SYNTH_H
#define HR_MODEL_SYNTH_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "tensor/tensor.h"

typedef enum hr_synth_vocab {
    HR_SYNTH_VOCAB_SPM = 0, /* tokenizer.ggml.model = llama */
    HR_SYNTH_VOCAB_BPE = 1, /* tokenizer.ggml.model = gpt2 */
} hr_synth_vocab;

typedef struct hr_synth_shape {
    const char *name;
    const char *arch; /* "llama", "mistral", "qwen2"; "qwen3", "gemma2", "gemma3", "phi3" (synth_arch.c) */
    int n_vocab, n_embd, n_ff, n_head, n_head_kv, n_layer, n_ctx;
    float rope_base;
    bool tied_output;
    bool qkv_bias;      /* qwen2 */
    bool llama3_rope;   /* write rope_freqs.weight with Llama-3 frequency factors */
    int sliding_window; /* mistral: 0 = none; gemma2/gemma3: the window layers' window */
    hr_synth_vocab vocab;
    /* the families past llama's (qwen3, gemma2, gemma3, phi3: synth_arch.c); 0 = the family's own */
    int head_dim;        /* {arch}.attention.key_length; 0 = n_embd / n_head */
    float attn_softcap;  /* gemma2: {arch}.attn_logit_softcapping */
    float final_softcap; /* gemma2, gemma3: {arch}.final_logit_softcapping (gemma3: 0 = key absent) */
    int n_ctx_orig;      /* phi3: LongRoPE factors and original context; 0 = no LongRoPE */
    float rope_linear;   /* {arch}.rope.scaling.type linear with this factor (gemma3 4B+: 8); 0 = none */
    /* mixture of experts (qwen3moe; llama with experts: Mixtral; synth_arch.c): 0 = a dense FFN */
    int n_expert, n_expert_used;
    int n_ff_exp; /* qwen3moe: {arch}.expert_feed_forward_length (Mixtral's experts are n_ff wide) */
    /* deepseek2 (synth_arch.c): multi-head latent attention (head_dim = kv_lora_rank + qk_rope_dim, one KV
     * head) and DeepSeek's MoE (experts from layer n_layer_dense on) */
    int q_lora_rank, kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim;
    int n_layer_dense, n_expert_shared, n_expert_groups, n_group_used;
    bool moe_sigmoid; /* V3: sigmoid gates with a selection bias (exp_probs_b); else V2's softmax */
    bool moe_norm;    /* {arch}.expert_weights_norm */
    float moe_scale;  /* {arch}.expert_weights_scale */
    /* gpt-oss, deepseek2: rope.scaling.type yarn with this factor over original context n_ctx_orig; 0 = none */
    float rope_yarn;
    float yarn_log_mul; /* deepseek2 with YaRN: rope.scaling.yarn_log_multiplier (0.1 mscale_all_dim); 0 = absent */
    bool legacy_kv_b;   /* as llama.cpp's converter wrote deepseek2 before MLA: one attn_kv_b, key_length and
                           value_length a head's (head_dim = qk_nope + rope, n_head_kv = n_head), no *_mla keys */
} hr_synth_shape;

/* Looks up a named shape: "tiny", "tinyllama-1.1b", "llama-3.2-1b", "llama-3-8b", "qwen2.5-0.5b",
 * "mistral-tiny", "qwen2-tiny", and the families of synth_arch.c: "qwen3-tiny", "qwen3-0.6b", "gemma2-tiny",
 * "gemma2-2b", "gemma3-tiny", "gemma3-tiny-scaled", "gemma3-1b", "gemma3-4b", "phi3-tiny",
 * "phi3.5-mini", "qwen3moe-tiny", "qwen3moe-small",
 * "qwen3moe-30b-a3b", "mixtral-tiny", "gpt-oss-tiny", "gpt-oss-small", "gpt-oss-20b", "deepseek2-tiny",
 * "deepseek2-tiny-yarn", "deepseek2-tiny-kvb", "deepseek3-tiny", "deepseek-v2-lite". On error the message lists the
 * names. */
hr_status hr_synth_shape_by_name(const char *name, hr_synth_shape *out, hr_error *err);
/* "tiny, tinyllama-1.1b, ..." */
const char *hr_synth_shape_names(void);

/* Builds the model into a writer (caller writes and destroys it). Matrices are stored in `type`
 * (f32, f16, bf16, q8_0, q4_0, q4_K, q5_K, q6_K where the row length allows; norms stay f32). mxfp4
 * (gpt-oss shapes): the experts in MXFP4 and every other matrix in q8_0, as gpt-oss's files hold them.
 * Weights are N(0, 1/sqrt(fan_in)) from seed, so logits stay in a sane range. */
hr_status hr_synth_build(const hr_synth_shape *shape, hr_dtype type, uint64_t seed, hr_gguf_writer **out,
                         hr_error *err);

/* llama.cpp's quantization mixes (llama-quantize's ftype names), tensor by tensor as its quantizer
 * (llama_tensor_get_type, llama family, no imatrix, no overrides) assigns them:
 *   base        q4_0 | q8_0 | q4_K (Q4_K_M) | q5_K (Q5_K_M) | q6_K
 *   output      q8_0 for Q8_0, else q6_K (q8_0 where the row length is not a multiple of 256);
 *               a tied token embedding takes the output's type
 *   attn_v, ffn_down of layer i (Q4_K_M, Q5_K_M only): q6_K where i < n/8, i >= 7n/8 or
 *               (i - n/8) % 3 == 2 (llama.cpp's use_more_bits), else the base
 *   everything else (token_embd, attn_q/k/output, ffn_gate/up): the base; norms f32.
 * A row length that does not fit the chosen type's block falls back as llama.cpp does
 * (hr_synth_fallback). PURE: every matrix in the one type given (hr_synth_build). */
typedef enum hr_synth_mix {
    HR_SYNTH_PURE = 0,
    HR_SYNTH_MIX_Q4_0,
    HR_SYNTH_MIX_Q8_0,
    HR_SYNTH_MIX_Q4_K_M,
    HR_SYNTH_MIX_Q5_K_M,
    HR_SYNTH_MIX_Q6_K,
} hr_synth_mix;

/* The type a matrix of type t whose rows have `cols` elements is stored in, for --type and --mix alike:
 * t where the row is whole blocks, else llama.cpp's fallback (llama-quant.cpp's tensor_type_fallback):
 * q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0, then f16 where that does not fit either; the 32-element
 * types (q8_0, q4_0, q5_0, q5_1, mxfp4), for which llama.cpp defines none, go to f16. */
hr_dtype hr_synth_fallback(hr_dtype t, int64_t cols);
/* "Q4_K_M" etc., case-insensitive; on error the message lists the names. */
hr_status hr_synth_mix_by_name(const char *name, hr_synth_mix *out, hr_error *err);
/* "Q4_0, Q8_0, Q4_K_M, Q5_K_M, Q6_K" */
const char *hr_synth_mix_names(void);
/* The type the mix gives the matrix `name` ("token_embd.weight", "output.weight",
 * "blk.3.ffn_down.weight", ...) of shape s whose rows have `cols` elements (after the fallbacks). */
hr_dtype hr_synth_mix_type(hr_synth_mix mix, const hr_synth_shape *s, const char *name, int64_t cols);
/* hr_synth_build with the mix's types; the file also says general.file_type (llama.cpp's ftype:
 * 2, 7, 15, 17, 18), which llama.cpp prints as the model's type. */
hr_status hr_synth_build_mix(const hr_synth_shape *shape, hr_synth_mix mix, uint64_t seed, hr_gguf_writer **out,
                             hr_error *err);

/* Builds the model in memory and loads it: *out is ready to run, and *file receives the GGUF image
 * it reads (free it after hr_model_destroy). On error nothing is left allocated. For the built-in
 * demo model and for tests. */
hr_status hr_synth_model(const hr_synth_shape *shape, hr_dtype type, uint64_t seed, hr_model **out, void **file,
                         hr_error *err);
/* The same with a mix's types. */
hr_status hr_synth_model_mix(const hr_synth_shape *shape, hr_synth_mix mix, uint64_t seed, hr_model **out, void **file,
                             hr_error *err);

#endif

/* model_internal.h: the model's weights, shared by load.c and forward.c only. */
#ifndef HR_MODEL_INTERNAL_H
#define HR_MODEL_INTERNAL_H

#include "model/model.h"

/* A weight matrix as stored: rows (output features) of cols (input features) elements of `type`;
 * `data` points into the mapped file. */
typedef struct hr_weight {
    const void *data;
    hr_dtype type;
    int64_t rows, cols;
    size_t row_bytes;
} hr_weight;

typedef struct hr_layer {
    float *attn_norm;       /* (E) owned f32 copy */
    hr_weight wq;           /* (H*D, E) */
    hr_weight wk;           /* (Hkv*D, E) */
    hr_weight wv;           /* (Hkv*D, E) */
    hr_weight wo;           /* (E, H*D) */
    float *bq, *bk, *bv;    /* (H*D), (Hkv*D), (Hkv*D) owned, qwen2 only, else NULL */
    float *q_norm, *k_norm; /* (D) owned: qwen3, gemma3, else NULL */
    float *attn_post_norm;  /* (E) owned: gemma, else NULL */
    float *ffn_norm;        /* (E) */
    hr_weight w_gate;       /* (F, E) */
    hr_weight w_up;         /* (F, E) */
    hr_weight w_down;       /* (E, F) */
    float *ffn_post_norm;   /* (E) owned: gemma, else NULL */
    /* mixture of experts (hp.n_expert > 0; w_gate, w_up, w_down then unused): the router, and each
     * stack as expert 0's matrix, expert e's at data + e * rows * row_bytes (the 3-D tensors
     * blk.N.ffn_{gate,up,down}_exps, experts outermost) */
    hr_weight w_router; /* (n_expert, E) blk.N.ffn_gate_inp */
    hr_weight exp_gate; /* (Fe, E) of n_expert */
    hr_weight exp_up;   /* (Fe, E) of n_expert */
    hr_weight exp_down; /* (E, Fe) of n_expert */
    /* DeepSeek (hp.kv_lora_rank > 0; wq, wk, wv then unused unless q_lora_rank is 0: wq). R = n_rot,
     * Dn = qk_nope_dim, Dv = v_head_dim, C = kv_lora_rank, Cq = q_lora_rank, Fs = n_expert_shared x Fe */
    hr_weight wq_a;           /* (Cq, E) attn_q_a */
    float *q_a_norm;          /* (Cq) owned */
    hr_weight wq_b;           /* (H*(Dn+R), Cq) attn_q_b */
    hr_weight wkv_a;          /* (C+R, E) attn_kv_a_mqa: the latent, then the RoPE key */
    float *kv_a_norm;         /* (C) owned */
    hr_weight wk_b;           /* (C, Dn) of H: W_UK per head, attn_k_b */
    hr_weight wv_b;           /* (Dv, C) of H: W_UV per head, attn_v_b */
    float *exp_probs_b;       /* (n_expert) owned: selection bias (V3), or NULL */
    float *kv_b_f32;          /* owned where hp.kv_b_split: wk_b's then wv_b's f32 data, else NULL */
    hr_weight sh_gate, sh_up; /* (Fs, E) ffn_gate_shexp, ffn_up_shexp */
    hr_weight sh_down;        /* (E, Fs) ffn_down_shexp */
    /* gpt-oss, owned f32 copies (else NULL): the attention output's bias, each query head's sink logit,
     * the router's bias and each expert's biases (expert e's row at e * width) */
    float *bo;                    /* (E) attn_output.bias */
    float *sinks;                 /* (H) attn_sinks.weight */
    float *b_router;              /* (n_expert) ffn_gate_inp.bias */
    float *b_exp_gate, *b_exp_up; /* (n_expert, Fe) ffn_{gate,up}_exps.bias */
    float *b_exp_down;            /* (n_expert, E) ffn_down_exps.bias */
} hr_layer;
/* phi3 stores Q|K|V in one matrix (blk.N.attn_qkv) and gate|up in one (blk.N.ffn_up): wq, wk, wv
 * (w_gate, w_up) are then row ranges of it, back to back, which the forward pass multiplies as one. */

struct hr_model {
    hr_gguf *gguf; /* owned; weights point into its mapping */
    hr_hparams hp;
    hr_weight tok_embd;            /* (V, E) */
    float *output_norm;            /* (E) */
    hr_weight output;              /* (V, E); equals tok_embd when tied */
    float *rope_freqs;             /* (n_rot/2) owned, or NULL */
    float *rope_short, *rope_long; /* (n_rot/2) owned LongRoPE factors (phi3), or NULL */
    hr_layer_attn *layer_attn;     /* (L) owned */
    hr_layer *layers;              /* (L) */
    uint64_t weight_bytes;
    const char *type_name;
    struct hr_hf *hf; /* owned: a Hugging Face checkpoint's shards (gguf then holds metadata only), or NULL */
};

/* The hyper-parameters of a metadata-only GGUF, as load_gguf reads them (load.c; hf.c's config.json). */
hr_status hr_model_hparams_of_meta(const hr_gguf *g, hr_hparams *hp, hr_error *err);

#endif

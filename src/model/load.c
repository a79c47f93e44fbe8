/* load.c: hyper-parameters from GGUF metadata and weight binding with shape/type checks. Every
 * failure names the key or tensor and what was expected. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>

#include "common/util.h"
#include "model/hf.h"
#include "model/model_internal.h"

/* What the loader knows of each family: its name in general.architecture, its RoPE pairing and the
 * base llama.cpp assumes where the file gives none. */
typedef struct arch_info {
    const char *name;
    hr_arch arch;
    bool rope_neox;
    double rope_base;
} arch_info;

static const arch_info k_archs[] = {
    {"llama", HR_ARCH_LLAMA, false, 10000.0},
    {"mistral", HR_ARCH_MISTRAL, false, 10000.0},
    {"qwen2", HR_ARCH_QWEN2, true, 1000000.0},
    {"qwen3", HR_ARCH_QWEN3, true, 10000.0},
    {"gemma2", HR_ARCH_GEMMA2, true, 10000.0},
    {"gemma3", HR_ARCH_GEMMA3, true, 10000.0},
    {"phi3", HR_ARCH_PHI3, true, 10000.0},
    {"qwen3moe", HR_ARCH_QWEN3MOE, true, 10000.0},
    {"deepseek2", HR_ARCH_DEEPSEEK2, false, 10000.0},
    {"gpt-oss", HR_ARCH_GPT_OSS, true, 10000.0},
};

const char *hr_arch_supported_list(void) {
    return "llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3, qwen3moe, gpt-oss, deepseek2";
}

static bool is_gemma(hr_arch a) { return a == HR_ARCH_GEMMA2 || a == HR_ARCH_GEMMA3; }

static hr_status get_int_key(const hr_gguf *g, const char *arch, const char *suffix, bool required, int64_t dflt,
                             int64_t lo, int64_t hi, int *out, hr_error *err) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t v = dflt;
    hr_status st = hr_gguf_get_int(g, key, &v, err);
    if (st == HR_ERR_NOT_FOUND) {
        if (required)
            return hr_error_set(err, HR_ERR_FORMAT, "model metadata lacks the required key '%s' (architecture %s)", key,
                                arch);
        v = dflt;
    } else if (st != HR_OK) {
        return st;
    }
    if (v < lo || v > hi)
        return hr_error_set(err, HR_ERR_FORMAT, "metadata '%s' = %lld is outside the valid range [%lld, %lld]", key,
                            (long long)v, (long long)lo, (long long)hi);
    *out = (int)v;
    return HR_OK;
}

static hr_status get_float_key_req(const hr_gguf *g, const char *arch, const char *suffix, bool required, double dflt,
                                   double *out, hr_error *err) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    double v;
    hr_status st = hr_gguf_get_float(g, key, &v, err);
    if (st == HR_ERR_NOT_FOUND) {
        if (required)
            return hr_error_set(err, HR_ERR_FORMAT, "model metadata lacks the required key '%s' (architecture %s)", key,
                                arch);
        v = dflt;
    } else if (st != HR_OK) {
        return st;
    }
    if (!isfinite(v)) return hr_error_set(err, HR_ERR_FORMAT, "metadata '%s' is not a finite number", key);
    *out = v;
    return HR_OK;
}

static hr_status get_float_key(const hr_gguf *g, const char *arch, const char *suffix, double dflt, double *out,
                               hr_error *err) {
    return get_float_key_req(g, arch, suffix, false, dflt, out, err);
}

/* The keys of the families past llama's: norms, activations, soft-capping, the attention scale,
 * LongRoPE's original context and attention factor. */
static hr_status read_family_hparams(const hr_gguf *g, hr_hparams *hp, hr_error *err) {
    const char *a = hp->arch_name;
    hr_status st;
    const bool gemma = is_gemma(hp->arch);
    hp->qk_norm = hp->arch == HR_ARCH_QWEN3 || hp->arch == HR_ARCH_QWEN3MOE || hp->arch == HR_ARCH_GEMMA3;
    hp->post_norms = gemma;
    hp->ffn_act = gemma ? HR_FFN_GELU_TANH : HR_FFN_SILU;
    hp->embd_scale = gemma ? sqrtf((float)hp->n_embd) : 0.0f;
    /* gemma's 27B shapes scale queries by 1/sqrt(E/H) (its query_pre_attn_scalar), the others by
     * 1/sqrt(D); llama.cpp tells them apart by layer count, as here */
    bool g27 = (hp->arch == HR_ARCH_GEMMA2 && hp->n_layer == 46) || (hp->arch == HR_ARCH_GEMMA3 && hp->n_layer == 62);
    hp->attn_scale = 1.0f / sqrtf(g27 ? (float)(hp->n_embd / hp->n_head) : (float)hp->head_dim);
    double cap = 0;
    if (hp->arch == HR_ARCH_GEMMA2 && (st = get_float_key(g, a, "attn_logit_softcapping", 50.0, &cap, err))) return st;
    if (cap < 0) return hr_error_set(err, HR_ERR_FORMAT, "metadata '%s.attn_logit_softcapping' = %g < 0", a, cap);
    hp->attn_softcap = (float)cap;
    cap = 0;
    if (gemma &&
        (st = get_float_key(g, a, "final_logit_softcapping", hp->arch == HR_ARCH_GEMMA2 ? 30.0 : 0.0, &cap, err)))
        return st;
    if (cap < 0) return hr_error_set(err, HR_ERR_FORMAT, "metadata '%s.final_logit_softcapping' = %g < 0", a, cap);
    hp->final_softcap = (float)cap;
    if ((st = get_int_key(g, a, "rope.scaling.original_context_length", false, hp->n_ctx_train, 1, 1 << 30,
                          &hp->n_ctx_orig, err)))
        return st;
    double attn_factor = 1.0;
    if ((st = get_float_key(g, a, "rope.scaling.attn_factor", 1.0, &attn_factor, err))) return st;
    if (!(attn_factor > 0))
        return hr_error_set(err, HR_ERR_FORMAT, "metadata '%s.rope.scaling.attn_factor' = %g is not positive", a,
                            attn_factor);
    hp->rope_attn_factor = attn_factor == 1.0 ? 0.0f : (float)attn_factor;
    if (hp->arch == HR_ARCH_DEEPSEEK2) { /* DeepSeek's mscale_all_dim x 0.1, as its converter writes it */
        double log_mul = 0;
        if ((st = get_float_key(g, a, "rope.scaling.yarn_log_multiplier", 0.0, &log_mul, err))) return st;
        if (log_mul < 0)
            return hr_error_set(err, HR_ERR_FORMAT, "metadata '%s.rope.scaling.yarn_log_multiplier' = %g < 0", a,
                                log_mul);
        hp->yarn_log_mul = (float)log_mul / 0.1f; /* llama.cpp cancels the converter's 0.1 so, in float */
    }
    if (hp->yarn_factor > 0.0f) { /* YaRN's magnitude scale joins the attention factor (model.h) */
        /* llama.cpp takes mscale = mscale_all_dims for deepseek2 (1 elsewhere; only deepseek2 reads the key) */
        const float mall = hp->yarn_log_mul, msc = mall != 0.0f && mall != 1.0f ? mall : 1.0f;
        const float ms = hr_rope_yarn_mscale(hp->yarn_factor, (float)attn_factor, msc, mall);
        hp->rope_attn_factor = ms == 1.0f ? 0.0f : ms;
    }
    if (hp->arch == HR_ARCH_GPT_OSS) { /* llama.cpp's openai-moe graph */
        hp->attn_scale = 1.0f / sqrtf((float)hp->n_rot);
        hp->attn_sinks = true;
        hp->moe_softmax_topk = true;
        hp->ffn_act = HR_FFN_SWIGLU_OAI;
    }
    return HR_OK;
}

/* Each layer's attention: gemma2 alternates window and full layers (pattern 2: even layers windowed),
 * gemma3 has five window layers to one full (pattern 6) with RoPE base 10000 on window layers
 * (rope.freq_base_swa) and rope.freq_base on full ones; mistral windows every layer. A layer il is a
 * window layer when pattern is 0 or il % pattern < pattern - 1 (llama.cpp's rule). */
static hr_status plan_layers(const hr_gguf *g, hr_model *m, hr_error *err) {
    hr_hparams *hp = &m->hp;
    const char *a = hp->arch_name;
    hr_status st;
    m->layer_attn = calloc((unsigned)hp->n_layer, sizeof *m->layer_attn);
    if (!m->layer_attn) return hr_error_set(err, HR_ERR_NOMEM, "out of memory loading the model");
    int window = hp->sliding_window, pattern = 0;
    double base_swa = hp->rope_base;
    float scale_swa = hp->rope_linear_scale;
    if ((is_gemma(hp->arch) || hp->arch == HR_ARCH_GPT_OSS) && window > 0) { /* gpt-oss: as gemma2, same base */
        if ((st = get_int_key(g, a, "attention.sliding_window_pattern", false, hp->arch == HR_ARCH_GEMMA3 ? 6 : 2, 0,
                              1 << 20, &pattern, err)))
            return st;
        if (hp->arch == HR_ARCH_GEMMA3) base_swa = 10000.0, scale_swa = 1.0f;
        if ((st = get_float_key(g, a, "rope.freq_base_swa", base_swa, &base_swa, err))) return st;
        if (!(base_swa > 1))
            return hr_error_set(err, HR_ERR_FORMAT, "metadata '%s.rope.freq_base_swa' = %g is not > 1", a, base_swa);
    }
    /* a window the file declares past its own context is a broken file (gemma2's default of 4096 where
     * the key is absent is llama.cpp's, and harmless: full attention on a shorter context) */
    char key[160];
    snprintf(key, sizeof key, "%s.attention.sliding_window", a);
    if (window > hp->n_ctx_train && hp->arch >= HR_ARCH_QWEN3 && hr_gguf_find_key(g, key) >= 0)
        return hr_error_set(err, HR_ERR_FORMAT,
                            "metadata '%s.attention.sliding_window' = %d is larger than the context "
                            "('%s.context_length' = %d)",
                            a, window, a, hp->n_ctx_train);
    hp->n_window_layers = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        hr_layer_attn *la = &m->layer_attn[il];
        bool win = window > 0 && (pattern == 0 || il % pattern < pattern - 1);
        la->kind = win ? HR_ATTN_WINDOW : HR_ATTN_FULL;
        la->window = win ? window : 0;
        la->rope_base = win ? (float)base_swa : hp->rope_base;
        la->rope_linear_scale = win ? scale_swa : hp->rope_linear_scale;
        hp->n_window_layers += win;
    }
    hp->swa_window = hp->n_window_layers > 0 ? window : 0; /* the KV pool's window groups, the planner */
    /* hp->sliding_window keeps its meaning for the planner: the window of every layer, or none */
    if (hp->n_window_layers < hp->n_layer) hp->sliding_window = 0;
    return HR_OK;
}

/* The experts' counts (llama.cpp's keys): qwen3moe requires both counts > 0 (as llama.cpp does); llama has
 * experts where expert_count > 0 (Mixtral), each of feed_forward_length. Other families: none. */
static hr_status read_moe_hparams(const hr_gguf *g, hr_hparams *hp, hr_error *err) {
    const char *a = hp->arch_name;
    const bool q3moe = hp->arch == HR_ARCH_QWEN3MOE || hp->arch == HR_ARCH_GPT_OSS; /* both counts required */
    hr_status st;
    if (!q3moe && hp->arch != HR_ARCH_LLAMA) return HR_OK;
    if ((st = get_int_key(g, a, "expert_count", q3moe, 0, q3moe ? 1 : 0, 4096, &hp->n_expert, err))) return st;
    if (hp->n_expert == 0) return HR_OK;
    if ((st = get_int_key(g, a, "expert_used_count", true, 0, 1, hp->n_expert, &hp->n_expert_used, err))) return st;
    hp->n_ff_exp = hp->n_ff;
    if (q3moe && (st = get_int_key(g, a, "expert_feed_forward_length", hp->arch == HR_ARCH_GPT_OSS,
                                   hp->n_ff / hp->n_expert_used, 1, 1 << 24, &hp->n_ff_exp, err)))
        return st;
    if (hp->n_ff_exp < 1)
        return hr_error_set(err, HR_ERR_FORMAT, "metadata gives no expert FFN width ('%s.expert_feed_forward_length')",
                            a);
    return HR_OK;
}

/* DeepSeek-V2/V3 (deepseek2), as llama.cpp's MLA converter writes them: key_length is the cached vector
 * (kv_lora_rank + rope dims) of one KV head, value_length the latent, key_length_mla / value_length_mla a
 * head's Q/K and V widths before absorption. Files from before that converter (no *_mla keys: key_length and
 * value_length a head's, W_UK and W_UV in one attn_kv_b) load too, attn_kv_b split at bind. Then DeepSeek's
 * MoE keys. */
static hr_status read_mla_hparams(const hr_gguf *g, hr_hparams *hp, hr_error *err) {
    const char *a = hp->arch_name;
    const int64_t big = 1 << 24;
    hr_status st;
    int k_mla = 0, v_len = 0, gating = HR_MOE_GATING_SOFTMAX;
    char key[160];
    if ((st = get_int_key(g, a, "attention.q_lora_rank", false, 0, 0, big, &hp->q_lora_rank, err)) ||
        (st = get_int_key(g, a, "attention.kv_lora_rank", true, 0, 1, 4096, &hp->kv_lora_rank, err)) ||
        (st = get_int_key(g, a, "attention.key_length_mla", false, 0, 0, 4096, &k_mla, err)))
        return st;
    if (k_mla == 0) { /* before the MLA converter: key_length and value_length are a head's; attn_kv_b */
        if (hr_gguf_find_tensor(g, "blk.0.attn_k_b.weight"))
            return hr_error_set(err, HR_ERR_FORMAT,
                                "model metadata lacks the required key '%s.attention.key_length_mla' (the file has "
                                "'blk.0.attn_k_b.weight', as llama.cpp's MLA converter writes it)",
                                a);
        k_mla = hp->head_dim;
        if ((st = get_int_key(g, a, "attention.value_length", false, hp->n_embd / hp->n_head, 1, 4096, &hp->v_head_dim,
                              err)))
            return st;
        hp->kv_b_split = true;
        hp->n_head_kv = 1; /* the cache is the latent's, whatever head_count_kv the file gives */
        hp->head_dim = hp->kv_lora_rank + hp->n_rot;
        v_len = hp->kv_lora_rank;
    } else if ((st = get_int_key(g, a, "attention.value_length_mla", true, 0, 1, 4096, &hp->v_head_dim, err)) ||
               (st = get_int_key(g, a, "attention.value_length", false, hp->kv_lora_rank, 1, 4096, &v_len, err))) {
        return st;
    }
    if (hp->n_head_kv != 1 || hp->head_dim != hp->kv_lora_rank + hp->n_rot || v_len != hp->kv_lora_rank)
        return hr_error_set(err, HR_ERR_FORMAT,
                            "metadata '%s.attention.key_length' = %d, value_length = %d, head_count_kv = %d: a "
                            "latent-attention cache needs key_length = kv_lora_rank + rope.dimension_count (%d + %d), "
                            "value_length = kv_lora_rank and one KV head",
                            a, hp->head_dim, v_len, hp->n_head_kv, hp->kv_lora_rank, hp->n_rot);
    if (k_mla <= hp->n_rot)
        return hr_error_set(err, HR_ERR_FORMAT,
                            "metadata '%s.attention.key_length_mla' = %d leaves no non-rotated dims (rope %d)", a,
                            k_mla, hp->n_rot);
    hp->qk_nope_dim = k_mla - hp->n_rot;
    /* a head's q.k before absorption has key_length_mla terms; llama.cpp's deepseek2 graph multiplies in
     * YaRN's temperature squared (model.h's yarn_log_mul): the rotation's magnitude (its attn_factor with
     * the rope's (1 + 0.1 ln s) put back, computed as ggml does) times 1 + 0.1 yarn_log_mul ln s. Without
     * YaRN s = 1 / the linear scale and the magnitude is rope.scaling.attn_factor. */
    const float freq_scale = hp->yarn_factor > 0.0f ? 1.0f / hp->yarn_factor : hp->rope_linear_scale;
    const float rot = hp->rope_attn_factor > 0.0f ? hp->rope_attn_factor : 1.0f;
    const float af = hp->yarn_factor > 0.0f ? rot : rot * (1.0f + 0.1f * logf(1.0f / freq_scale));
    const float mscale = af * (1.0f + 0.1f * hp->yarn_log_mul * logf(1.0f / freq_scale));
    hp->attn_scale = 1.0f * mscale * mscale / sqrtf((float)k_mla);
    if ((st = get_int_key(g, a, "leading_dense_block_count", false, 0, 0, hp->n_layer, &hp->n_layer_dense, err)))
        return st;
    if (hp->n_layer_dense == hp->n_layer) return HR_OK; /* no experts */
    if ((st = get_int_key(g, a, "expert_count", true, 0, 1, 4096, &hp->n_expert, err)) ||
        (st = get_int_key(g, a, "expert_used_count", true, 0, 1, hp->n_expert, &hp->n_expert_used, err)) ||
        (st = get_int_key(g, a, "expert_feed_forward_length", true, 0, 1, big, &hp->n_ff_exp, err)) ||
        (st = get_int_key(g, a, "expert_shared_count", true, 0, 0, 64, &hp->n_expert_shared, err)) ||
        (st = get_int_key(g, a, "expert_gating_func", false, HR_MOE_GATING_SOFTMAX, 0, 16, &gating, err)) ||
        (st = get_int_key(g, a, "expert_group_count", false, 0, 0, 64, &hp->n_expert_groups, err)) ||
        (st = get_int_key(g, a, "expert_group_used_count", false, 0, 0, hp->n_expert, &hp->n_group_used, err)))
        return st;
    if (gating == 0) gating = HR_MOE_GATING_SOFTMAX; /* llama.cpp's "none": V2 files before the key */
    if (gating != HR_MOE_GATING_SOFTMAX && gating != HR_MOE_GATING_SIGMOID)
        return hr_error_set(err, HR_ERR_UNSUPPORTED,
                            "metadata '%s.expert_gating_func' = %d is not supported (1 softmax, 2 sigmoid)", a, gating);
    hp->moe_gating = (hr_moe_gating)gating;
    /* llama.cpp picks each group's best two experts for its score: groups need two */
    if (hp->n_expert_groups > 1 && (hp->n_expert % hp->n_expert_groups || hp->n_expert / hp->n_expert_groups < 2 ||
                                    hp->n_group_used < 1 || hp->n_group_used > hp->n_expert_groups ||
                                    hp->n_group_used * (hp->n_expert / hp->n_expert_groups) < hp->n_expert_used))
        return hr_error_set(err, HR_ERR_FORMAT,
                            "metadata '%s.expert_group_count' = %d, expert_group_used_count = %d do not split %d "
                            "experts into groups of two or more that hold the %d used",
                            a, hp->n_expert_groups, hp->n_group_used, hp->n_expert, hp->n_expert_used);
    double scale = 0;
    if ((st = get_float_key(g, a, "expert_weights_scale", 0.0, &scale, err))) return st;
    if (scale < 0) return hr_error_set(err, HR_ERR_FORMAT, "metadata '%s.expert_weights_scale' = %g < 0", a, scale);
    hp->moe_scale = (float)scale;
    snprintf(key, sizeof key, "%s.expert_weights_norm", a);
    bool norm = false;
    st = hr_gguf_get_bool(g, key, &norm, err);
    if (st && st != HR_ERR_NOT_FOUND) return st;
    hp->moe_norm = st == HR_OK && norm;
    return HR_OK;
}

static hr_status read_hparams(const hr_gguf *g, hr_hparams *hp, hr_error *err) {
    memset(hp, 0, sizeof *hp);
    hr_status st = hr_gguf_get_cstr(g, "general.architecture", hp->arch_name, sizeof hp->arch_name, err);
    if (st == HR_ERR_NOT_FOUND)
        return hr_error_set(err, HR_ERR_FORMAT, "not a model file: metadata lacks 'general.architecture'");
    if (st != HR_OK) return st;
    const arch_info *ai = NULL;
    for (size_t i = 0; i < HR_ARRAY_LEN(k_archs); i++)
        if (!strcmp(hp->arch_name, k_archs[i].name)) ai = &k_archs[i];
    if (!ai)
        return hr_error_set(err, HR_ERR_UNSUPPORTED, "architecture '%s' is not supported (supported: %s)",
                            hp->arch_name, hr_arch_supported_list());
    hp->arch = ai->arch;
    /* the families added after llama's: keys llama.cpp requires are required here too */
    const bool newer = hp->arch >= HR_ARCH_QWEN3;
    if (hr_gguf_get_cstr(g, "general.name", hp->name, sizeof hp->name, NULL) != HR_OK) hp->name[0] = '\0';
    const char *a = hp->arch_name;
    const int64_t big = 1 << 24;
    if ((st = get_int_key(g, a, "embedding_length", true, 0, 1, big, &hp->n_embd, err))) return st;
    if ((st = get_int_key(g, a, "feed_forward_length", true, 0, 1, big, &hp->n_ff, err))) return st;
    if ((st = get_int_key(g, a, "attention.head_count", true, 0, 1, 4096, &hp->n_head, err))) return st;
    if ((st = get_int_key(g, a, "attention.head_count_kv", false, hp->n_head, 1, 4096, &hp->n_head_kv, err))) return st;
    if ((st = get_int_key(g, a, "block_count", true, 0, 1, 4096, &hp->n_layer, err))) return st;
    if ((st = get_int_key(g, a, "context_length", true, 0, 1, 1 << 30, &hp->n_ctx_train, err))) return st;
    if (hp->n_head % hp->n_head_kv)
        return hr_error_set(err, HR_ERR_FORMAT, "attention.head_count %d is not a multiple of head_count_kv %d",
                            hp->n_head, hp->n_head_kv);
    if ((st = get_int_key(g, a, "attention.key_length", false, hp->n_embd / hp->n_head, 1, 4096, &hp->head_dim, err)))
        return st;
    if ((st = get_int_key(g, a, "rope.dimension_count", false, hp->head_dim, 2, hp->head_dim, &hp->n_rot, err)))
        return st;
    if (hp->n_rot % 2) return hr_error_set(err, HR_ERR_FORMAT, "rope.dimension_count %d is odd", hp->n_rot);
    /* llama.cpp reads no window for qwen3 (and qwen3moe) and turns phi3's off (its converters' values are
     * unreliable) */
    if (hp->arch != HR_ARCH_QWEN3 && hp->arch != HR_ARCH_QWEN3MOE && hp->arch != HR_ARCH_PHI3 &&
        (st = get_int_key(g, a, "attention.sliding_window", hp->arch == HR_ARCH_GPT_OSS,
                          hp->arch == HR_ARCH_GEMMA2 ? 4096 : 0, 0, 1 << 30, &hp->sliding_window, err)))
        return st;
    double eps, base, factor = 1.0;
    if ((st = get_float_key_req(g, a, "attention.layer_norm_rms_epsilon", newer, 1e-5, &eps, err))) return st;
    if (!(eps >= 0 && eps < 1))
        return hr_error_set(err, HR_ERR_FORMAT, "metadata '%s.attention.layer_norm_rms_epsilon' = %g is not in [0, 1)",
                            a, eps);
    if ((st = get_float_key(g, a, "rope.freq_base", ai->rope_base, &base, err))) return st;
    if (!(base > 1)) return hr_error_set(err, HR_ERR_FORMAT, "metadata '%s.rope.freq_base' = %g is not > 1", a, base);
    hp->norm_eps = (float)eps;
    hp->rope_base = (float)base;
    hp->rope_linear_scale = 1.0f;
    char key[160], stype[32];
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    if (hr_gguf_get_cstr(g, key, stype, sizeof stype, NULL) == HR_OK && strcmp(stype, "none")) {
        if ((st = get_float_key(g, a, "rope.scaling.factor", 1.0, &factor, err))) return st;
        if (!strcmp(stype, "linear")) {
            if (!(factor > 0))
                return hr_error_set(err, HR_ERR_FORMAT, "rope.scaling.factor %g is not positive", factor);
            hp->rope_linear_scale = (float)(1.0 / factor);
        } else if (!strcmp(stype, "yarn")) { /* llama.cpp's defaults: ext 1, beta 32 / 1; factor 0 = 1 */
            if (!(factor >= 0)) return hr_error_set(err, HR_ERR_FORMAT, "rope.scaling.factor %g is negative", factor);
            hp->yarn_factor = factor == 0 ? 1.0f : (float)factor;
            hp->yarn_ext_factor = 1.0f, hp->yarn_beta_fast = 32.0f, hp->yarn_beta_slow = 1.0f;
        } else if (strcmp(stype, "llama3") && !(hp->arch == HR_ARCH_PHI3 && !strcmp(stype, "longrope"))) {
            return hr_error_set(err, HR_ERR_UNSUPPORTED,
                                "%s.rope.scaling.type '%s' is not supported (supported: none, linear, yarn, llama3%s)",
                                a, stype, hp->arch == HR_ARCH_PHI3 ? ", longrope" : "");
        }
    }
    hp->rope_neox = ai->rope_neox;
    if ((st = read_moe_hparams(g, hp, err))) return st;
    if ((st = read_family_hparams(g, hp, err))) return st;
    return hp->arch == HR_ARCH_DEEPSEEK2 ? read_mla_hparams(g, hp, err) : HR_OK;
}

/* A tensor by GGUF name: from the file, or from a Hugging Face checkpoint's shards (hf.c). */
static const hr_gguf_tensor *find_tensor(const hr_model *m, const char *name) {
    return m->hf ? hr_hf_find_tensor(m->hf, name) : hr_gguf_find_tensor(m->gguf, name);
}

/* An MXFP4 tensor of rows x cols: no block's E8M0 scale is 0xFF (NaN; llama.cpp's validation refuses it
 * too). Reads one byte of every 17 (the whole mapping's pages, once, at load). */
static hr_status check_mxfp4(const hr_gguf_tensor *t, const char *name, int64_t rows, int64_t cols, hr_error *err) {
    if (t->type != HR_DTYPE_MXFP4) return HR_OK;
    const int64_t nb = rows * (cols / HR_QK_MXFP4);
    const int64_t bad = hr_mxfp4_find_nan_scale(t->data, nb * HR_QK_MXFP4);
    if (bad < 0) return HR_OK;
    return hr_error_set(err, HR_ERR_FORMAT,
                        "tensor '%s': MXFP4 block %lld (row %lld) has the scale byte 0xFF, E8M0's NaN", name,
                        (long long)bad, (long long)(bad / (cols / HR_QK_MXFP4)));
}

/* Binds a matrix tensor, checking type support and shape (cols x rows as GGUF ne[0], ne[1]). */
static hr_status bind_matrix(hr_model *m, const char *name, int64_t cols, int64_t rows, bool optional, hr_weight *w,
                             hr_error *err) {
    const hr_gguf_tensor *t = find_tensor(m, name);
    if (!t) {
        if (optional) return HR_ERR_NOT_FOUND;
        return hr_error_set(err, HR_ERR_FORMAT, "model (architecture %s) lacks the tensor '%s'", m->hp.arch_name, name);
    }
    if (!hr_dtype_supported(t->type) || t->type == HR_DTYPE_Q8_K)
        return hr_error_set(err, HR_ERR_UNSUPPORTED,
                            "tensor '%s' has type %s, which headroom does not support (supported: %s)", name,
                            hr_gguf_tensor_type_name(t->type), hr_dtype_supported_list());
    if (t->n_dims != 2 || t->ne[0] != cols || t->ne[1] != rows)
        return hr_error_set(err, HR_ERR_FORMAT, "tensor '%s' has shape [%lld, %lld] (%u dims), expected [%lld, %lld]",
                            name, (long long)t->ne[0], (long long)t->ne[1], t->n_dims, (long long)cols,
                            (long long)rows);
    const hr_dtype_info *info = hr_dtype_get_info((hr_dtype)t->type);
    if (cols % info->block_elems)
        return hr_error_set(err, HR_ERR_FORMAT, "tensor '%s': row length %lld is not a multiple of %s's block of %d",
                            name, (long long)cols, info->name, info->block_elems);
    hr_status st = check_mxfp4(t, name, rows * (t->n_dims > 2 ? t->ne[2] : 1), cols, err);
    if (st) return st;
    w->data = t->data;
    w->type = (hr_dtype)t->type;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = hr_dtype_row_bytes(w->type, cols);
    m->weight_bytes += t->size_bytes;
    return HR_OK;
}

/* Binds a stack of n matrices (a 3-D tensor [cols, rows, n]: the experts) as its first matrix; matrix e
 * lies at data + e * rows * row_bytes. */
static hr_status bind_stack(hr_model *m, const char *name, int64_t cols, int64_t rows, int64_t n, hr_weight *w,
                            hr_error *err) {
    const hr_gguf_tensor *t = find_tensor(m, name);
    if (!t)
        return hr_error_set(err, HR_ERR_FORMAT, "model (architecture %s) lacks the tensor '%s'", m->hp.arch_name, name);
    if (!hr_dtype_supported(t->type) || t->type == HR_DTYPE_Q8_K)
        return hr_error_set(err, HR_ERR_UNSUPPORTED,
                            "tensor '%s' has type %s, which headroom does not support (supported: %s)", name,
                            hr_gguf_tensor_type_name(t->type), hr_dtype_supported_list());
    if (t->n_dims != 3 || t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != n)
        return hr_error_set(err, HR_ERR_FORMAT,
                            "tensor '%s' has shape [%lld, %lld, %lld] (%u dims), expected [%lld, %lld, %lld]", name,
                            (long long)t->ne[0], (long long)t->ne[1], (long long)(t->n_dims > 2 ? t->ne[2] : 1),
                            t->n_dims, (long long)cols, (long long)rows, (long long)n);
    const hr_dtype_info *info = hr_dtype_get_info((hr_dtype)t->type);
    if (cols % info->block_elems)
        return hr_error_set(err, HR_ERR_FORMAT, "tensor '%s': row length %lld is not a multiple of %s's block of %d",
                            name, (long long)cols, info->name, info->block_elems);
    hr_status st = check_mxfp4(t, name, rows * (t->n_dims > 2 ? t->ne[2] : 1), cols, err);
    if (st) return st;
    w->data = t->data;
    w->type = (hr_dtype)t->type;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = hr_dtype_row_bytes(w->type, cols);
    m->weight_bytes += t->size_bytes;
    return HR_OK;
}

uint64_t hr_model_resident_bytes(const hr_hparams *hp, uint64_t file_bytes) {
    uint64_t E = (uint64_t)hp->n_embd, L = (uint64_t)hp->n_layer, D = (uint64_t)hp->head_dim;
    uint64_t qkv = ((uint64_t)hp->n_head + 2ull * (uint64_t)hp->n_head_kv) * D, rot = (uint64_t)hp->n_rot / 2;
    /* the vectors bind_vector copies to f32: output_norm; per layer attn_norm and ffn_norm, Q/K/V
     * biases (qwen2), per-head Q/K norms (qwen3, gemma3), post-attention and post-FFN norms (gemma);
     * rope_freqs (llama 3); LongRoPE's long and short factors (phi3) */
    uint64_t floats =
        E + L * (2 * E + (hp->has_qkv_bias ? qkv : 0) + (hp->qk_norm ? 2 * D : 0) + (hp->post_norms ? 2 * E : 0)) +
        (hp->has_rope_freqs ? rot : 0) + (hp->has_longrope ? 2 * rot : 0) +
        /* deepseek2: the Q and KV low-rank norms, and the experts' selection bias */
        (hp->kv_lora_rank > 0 ? L * ((uint64_t)hp->q_lora_rank + (uint64_t)hp->kv_lora_rank + (uint64_t)hp->n_expert)
                              : 0) +
        /* a legacy deepseek2 file's attn_kv_b, split into f32 W_UK and W_UV */
        (hp->kv_b_split
             ? L * (uint64_t)hp->n_head * (uint64_t)hp->kv_lora_rank * (uint64_t)(hp->qk_nope_dim + hp->v_head_dim)
             : 0);
    if (hp->arch == HR_ARCH_GPT_OSS) /* bind_gptoss: output bias, sinks, router and expert biases */
        floats += L * (E + (uint64_t)hp->n_head + (uint64_t)hp->n_expert * (1 + 2 * (uint64_t)hp->n_ff_exp + E));
    return file_bytes + floats * sizeof(float);
}

int hr_model_q_per_kv(const hr_hparams *hp) {
    return hp->kv_lora_rank > 0 || hp->n_head_kv < 1 ? 1 : hp->n_head / hp->n_head_kv;
}

uint64_t hr_model_table_bytes(const hr_hparams *hp) {
    return sizeof(hr_model) + (uint64_t)hp->n_layer * (sizeof(hr_layer) + sizeof(hr_layer_attn));
}

/* Copies a 1-D f32/f16/bf16 tensor of n elements into a new f32 array. */
static hr_status bind_vector(hr_model *m, const char *name, int64_t n, bool optional, float **out, hr_error *err) {
    const hr_gguf_tensor *t = find_tensor(m, name);
    if (!t) {
        if (optional) return HR_ERR_NOT_FOUND;
        return hr_error_set(err, HR_ERR_FORMAT, "model (architecture %s) lacks the tensor '%s'", m->hp.arch_name, name);
    }
    if (t->n_dims != 1 || t->ne[0] != n)
        return hr_error_set(err, HR_ERR_FORMAT, "tensor '%s' has %u dims and %lld elements, expected a vector of %lld",
                            name, t->n_dims, (long long)t->ne[0], (long long)n);
    float *v = malloc(sizeof(float) * (size_t)n);
    if (!v) return hr_error_set(err, HR_ERR_NOMEM, "out of memory copying '%s'", name);
    if (t->type == HR_DTYPE_F32) {
        memcpy(v, t->data, sizeof(float) * (size_t)n);
    } else if (t->type == HR_DTYPE_F16 || t->type == HR_DTYPE_BF16) {
        const uint16_t *h = t->data;
        for (int64_t i = 0; i < n; i++) v[i] = t->type == HR_DTYPE_F16 ? hr_f16_to_f32(h[i]) : hr_bf16_to_f32(h[i]);
    } else {
        free(v);
        return hr_error_set(err, HR_ERR_UNSUPPORTED, "vector tensor '%s' has type %s (expected f32, f16 or bf16)", name,
                            hr_gguf_tensor_type_name(t->type));
    }
    m->weight_bytes += t->size_bytes;
    *out = v;
    return HR_OK;
}

/* Rows [r0, r0 + n) of w, as a matrix of its own (phi3's fused tensors). */
static hr_weight row_slice(const hr_weight *w, int64_t r0, int64_t n) {
    hr_weight s = *w;
    s.data = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
    s.rows = n;
    return s;
}

/* A file from before llama.cpp's MLA converter: blk.N.attn_kv_b ([C, H x (Dn + Dv)], per head Dn rows of
 * K's up-projection then Dv of V's) becomes the W_UK stack ([Dn, C, H]: its K rows transposed) and the
 * W_UV stack ([C, Dv, H]) in one owned f32 buffer, whatever the file's type (rows dequantized), so the
 * forward pass sees the split file's layer. */
static hr_status split_kv_b(hr_model *m, int il, hr_error *err) {
    const hr_hparams *hp = &m->hp;
    hr_layer *L = &m->layers[il];
    const int64_t H = hp->n_head, C = hp->kv_lora_rank, Dn = hp->qk_nope_dim, Dv = hp->v_head_dim;
    char name[96], kb[96];
    snprintf(name, sizeof name, "blk.%d.attn_kv_b.weight", il);
    snprintf(kb, sizeof kb, "blk.%d.attn_k_b.weight", il);
    if (!find_tensor(m, name) && find_tensor(m, kb))
        return hr_error_set(err, HR_ERR_FORMAT,
                            "model metadata lacks the required key '%s.attention.key_length_mla' (the file has "
                            "'%s', as llama.cpp's MLA converter writes it)",
                            hp->arch_name, kb);
    hr_weight w;
    hr_status st = bind_matrix(m, name, C, H * (Dn + Dv), false, &w, err);
    if (st) return st;
    float *buf = malloc(sizeof(float) * (size_t)(H * C * (Dn + Dv))), *row = malloc(sizeof(float) * (size_t)C);
    if (!buf || !row) {
        free(buf);
        free(row);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory splitting '%s'", name);
    }
    float *wk = buf, *wv = buf + H * C * Dn;
    for (int64_t h = 0; h < H; h++)
        for (int64_t j = 0; j < Dn + Dv; j++) {
            hr_dequantize_row_ref(w.type, (const uint8_t *)w.data + (size_t)(h * (Dn + Dv) + j) * w.row_bytes, row, C);
            if (j < Dn)
                for (int64_t r = 0; r < C; r++) wk[(h * C + r) * Dn + j] = row[r];
            else
                memcpy(wv + (h * Dv + (j - Dn)) * C, row, sizeof(float) * (size_t)C);
        }
    free(row);
    L->kv_b_f32 = buf;
    L->wk_b =
        (hr_weight){.data = wk, .type = HR_DTYPE_F32, .rows = C, .cols = Dn, .row_bytes = sizeof(float) * (size_t)Dn};
    L->wv_b =
        (hr_weight){.data = wv, .type = HR_DTYPE_F32, .rows = Dv, .cols = C, .row_bytes = sizeof(float) * (size_t)C};
    return HR_OK;
}

/* A DeepSeek layer (deepseek2): the latent attention's matrices (Q directly or through its low-rank
 * pair, the joint KV down-projection with the RoPE key, W_UK and W_UV per head as llama.cpp's converter
 * splits attn_kv_b), then a dense FFN on the leading layers and the router, experts and shared experts
 * on the rest. Shapes as ggml writes them: [cols, rows(, heads)]. */
static hr_status bind_mla_layer(hr_model *m, int il, hr_error *err) {
    hr_hparams *hp = &m->hp;
    hr_layer *L = &m->layers[il];
    const int64_t E = hp->n_embd, H = hp->n_head, R = hp->n_rot, Dn = hp->qk_nope_dim, Dv = hp->v_head_dim,
                  C = hp->kv_lora_rank, Cq = hp->q_lora_rank, qd = H * (Dn + R);
    char name[96];
    hr_status st;
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, il), name)
    if ((st = bind_vector(m, NAME("attn_norm.weight"), E, false, &L->attn_norm, err))) return st;
    if (Cq > 0) {
        if ((st = bind_matrix(m, NAME("attn_q_a.weight"), E, Cq, false, &L->wq_a, err)) ||
            (st = bind_vector(m, NAME("attn_q_a_norm.weight"), Cq, false, &L->q_a_norm, err)) ||
            (st = bind_matrix(m, NAME("attn_q_b.weight"), Cq, qd, false, &L->wq_b, err)))
            return st;
    } else if ((st = bind_matrix(m, NAME("attn_q.weight"), E, qd, false, &L->wq, err))) {
        return st;
    }
    if ((st = bind_matrix(m, NAME("attn_kv_a_mqa.weight"), E, C + R, false, &L->wkv_a, err)) ||
        (st = bind_vector(m, NAME("attn_kv_a_norm.weight"), C, false, &L->kv_a_norm, err)))
        return st;
    if (hp->kv_b_split) {
        if ((st = split_kv_b(m, il, err))) return st;
    } else if ((st = bind_stack(m, NAME("attn_k_b.weight"), Dn, C, H, &L->wk_b, err)) ||
               (st = bind_stack(m, NAME("attn_v_b.weight"), C, Dv, H, &L->wv_b, err))) {
        return st;
    }
    if ((st = bind_matrix(m, NAME("attn_output.weight"), H * Dv, E, false, &L->wo, err)) ||
        (st = bind_vector(m, NAME("ffn_norm.weight"), E, false, &L->ffn_norm, err)))
        return st;
    if (il < hp->n_layer_dense) {
        if ((st = bind_matrix(m, NAME("ffn_gate.weight"), E, hp->n_ff, false, &L->w_gate, err)) ||
            (st = bind_matrix(m, NAME("ffn_up.weight"), E, hp->n_ff, false, &L->w_up, err)) ||
            (st = bind_matrix(m, NAME("ffn_down.weight"), hp->n_ff, E, false, &L->w_down, err)))
            return st;
        return HR_OK;
    }
    const int64_t Fe = hp->n_ff_exp, NE = hp->n_expert, Fs = (int64_t)hp->n_expert_shared * Fe;
    if ((st = bind_matrix(m, NAME("ffn_gate_inp.weight"), E, NE, false, &L->w_router, err)) ||
        (st = bind_stack(m, NAME("ffn_gate_exps.weight"), E, Fe, NE, &L->exp_gate, err)) ||
        (st = bind_stack(m, NAME("ffn_up_exps.weight"), E, Fe, NE, &L->exp_up, err)) ||
        (st = bind_stack(m, NAME("ffn_down_exps.weight"), Fe, E, NE, &L->exp_down, err)))
        return st;
    st = bind_vector(m, NAME("exp_probs_b.bias"), NE, true, &L->exp_probs_b, err);
    if (st && st != HR_ERR_NOT_FOUND) return st;
    if (Fs > 0 && ((st = bind_matrix(m, NAME("ffn_gate_shexp.weight"), E, Fs, false, &L->sh_gate, err)) ||
                   (st = bind_matrix(m, NAME("ffn_up_shexp.weight"), E, Fs, false, &L->sh_up, err)) ||
                   (st = bind_matrix(m, NAME("ffn_down_shexp.weight"), Fs, E, false, &L->sh_down, err))))
        return st;
#undef NAME
    return HR_OK;
}

/* Copies an f32/f16/bf16 tensor of n rows x cols (a 2-D [cols, n]: the experts' biases) into a new f32
 * array. */
static hr_status bind_rows(hr_model *m, const char *name, int64_t cols, int64_t n, float **out, hr_error *err) {
    const hr_gguf_tensor *t = find_tensor(m, name);
    if (!t)
        return hr_error_set(err, HR_ERR_FORMAT, "model (architecture %s) lacks the tensor '%s'", m->hp.arch_name, name);
    if (t->n_dims != 2 || t->ne[0] != cols || t->ne[1] != n)
        return hr_error_set(err, HR_ERR_FORMAT, "tensor '%s' has shape [%lld, %lld] (%u dims), expected [%lld, %lld]",
                            name, (long long)t->ne[0], (long long)(t->n_dims > 1 ? t->ne[1] : 1), t->n_dims,
                            (long long)cols, (long long)n);
    if (t->type != HR_DTYPE_F32 && t->type != HR_DTYPE_F16 && t->type != HR_DTYPE_BF16)
        return hr_error_set(err, HR_ERR_UNSUPPORTED, "bias tensor '%s' has type %s (expected f32, f16 or bf16)", name,
                            hr_gguf_tensor_type_name(t->type));
    float *v = malloc(sizeof(float) * (size_t)(cols * n));
    if (!v) return hr_error_set(err, HR_ERR_NOMEM, "out of memory copying '%s'", name);
    hr_dequantize_row_ref((hr_dtype)t->type, t->data, v, cols * n);
    m->weight_bytes += t->size_bytes;
    *out = v;
    return HR_OK;
}

/* gpt-oss's own tensors past the experts (llama.cpp requires each): the attention output's bias, the
 * sinks, the router's bias and the experts' biases. */
static hr_status bind_gptoss(hr_model *m, int il, hr_error *err) {
    const hr_hparams *hp = &m->hp;
    hr_layer *L = &m->layers[il];
    const int64_t E = hp->n_embd, NE = hp->n_expert, Fe = hp->n_ff_exp;
    char name[96];
    hr_status st;
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, il), name)
    if ((st = bind_vector(m, NAME("attn_output.bias"), E, false, &L->bo, err))) return st;
    if ((st = bind_vector(m, NAME("attn_sinks.weight"), hp->n_head, false, &L->sinks, err))) return st;
    if ((st = bind_vector(m, NAME("ffn_gate_inp.bias"), NE, false, &L->b_router, err))) return st;
    if ((st = bind_rows(m, NAME("ffn_gate_exps.bias"), Fe, NE, &L->b_exp_gate, err))) return st;
    if ((st = bind_rows(m, NAME("ffn_up_exps.bias"), Fe, NE, &L->b_exp_up, err))) return st;
    if ((st = bind_rows(m, NAME("ffn_down_exps.bias"), E, NE, &L->b_exp_down, err))) return st;
#undef NAME
    return HR_OK;
}

static hr_status bind_layer(hr_model *m, int il, hr_error *err) {
    if (m->hp.arch == HR_ARCH_DEEPSEEK2) return bind_mla_layer(m, il, err);
    hr_hparams *hp = &m->hp;
    hr_layer *L = &m->layers[il];
    int64_t E = hp->n_embd, F = hp->n_ff, D = hp->head_dim, qd = (int64_t)hp->n_head * hp->head_dim,
            kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    char name[96];
    hr_status st;
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, il), name)
    if ((st = bind_vector(m, NAME("attn_norm.weight"), E, false, &L->attn_norm, err))) return st;
    /* Q|K|V in one matrix where the file has blk.N.attn_qkv (phi3; llama.cpp accepts it for every family) */
    hr_weight qkv;
    const bool qkv_optional = hp->arch != HR_ARCH_PHI3 || find_tensor(m, NAME("attn_q.weight"));
    st = bind_matrix(m, NAME("attn_qkv.weight"), E, qd + 2 * kvd, qkv_optional, &qkv, err);
    if (st == HR_OK) {
        if (find_tensor(m, NAME("attn_qkv.bias")))
            return hr_error_set(err, HR_ERR_UNSUPPORTED, "tensor '%s' (a fused Q|K|V bias) is not supported", name);
        L->wq = row_slice(&qkv, 0, qd);
        L->wk = row_slice(&qkv, qd, kvd);
        L->wv = row_slice(&qkv, qd + kvd, kvd);
        hp->fused_qkv = true;
    } else if (st != HR_ERR_NOT_FOUND) {
        return st;
    } else {
        if ((st = bind_matrix(m, NAME("attn_q.weight"), E, qd, false, &L->wq, err))) return st;
        if ((st = bind_matrix(m, NAME("attn_k.weight"), E, kvd, false, &L->wk, err))) return st;
        if ((st = bind_matrix(m, NAME("attn_v.weight"), E, kvd, false, &L->wv, err))) return st;
        bool need_bias = hp->arch == HR_ARCH_QWEN2;
        st = bind_vector(m, NAME("attn_q.bias"), qd, !need_bias, &L->bq, err);
        if (st && st != HR_ERR_NOT_FOUND) return st;
        st = bind_vector(m, NAME("attn_k.bias"), kvd, !need_bias, &L->bk, err);
        if (st && st != HR_ERR_NOT_FOUND) return st;
        st = bind_vector(m, NAME("attn_v.bias"), kvd, !need_bias, &L->bv, err);
        if (st && st != HR_ERR_NOT_FOUND) return st;
        if (L->bq || L->bk || L->bv) hp->has_qkv_bias = true;
    }
    if ((st = bind_matrix(m, NAME("attn_output.weight"), qd, E, false, &L->wo, err))) return st;
    if (hp->qk_norm) {
        if ((st = bind_vector(m, NAME("attn_q_norm.weight"), D, false, &L->q_norm, err))) return st;
        if ((st = bind_vector(m, NAME("attn_k_norm.weight"), D, false, &L->k_norm, err))) return st;
    }
    if (hp->post_norms &&
        ((st = bind_vector(m, NAME("post_attention_norm.weight"), E, false, &L->attn_post_norm, err)) ||
         (st = bind_vector(m, NAME("post_ffw_norm.weight"), E, false, &L->ffn_post_norm, err))))
        return st;
    /* gpt-oss's FFN input norm is stored as blk.N.post_attention_norm (the converter's name for it) */
    if ((st = bind_vector(m, hp->arch == HR_ARCH_GPT_OSS ? NAME("post_attention_norm.weight") : NAME("ffn_norm.weight"),
                          E, false, &L->ffn_norm, err)))
        return st;
    if (hp->n_expert > 0) { /* the router and the experts' stacks (qwen3moe, Mixtral) */
        const int64_t Fe = hp->n_ff_exp, NE = hp->n_expert;
        if ((st = bind_matrix(m, NAME("ffn_gate_inp.weight"), E, NE, false, &L->w_router, err))) return st;
        if ((st = bind_stack(m, NAME("ffn_gate_exps.weight"), E, Fe, NE, &L->exp_gate, err))) return st;
        if ((st = bind_stack(m, NAME("ffn_up_exps.weight"), E, Fe, NE, &L->exp_up, err))) return st;
        if ((st = bind_stack(m, NAME("ffn_down_exps.weight"), Fe, E, NE, &L->exp_down, err))) return st;
        return hp->arch == HR_ARCH_GPT_OSS ? bind_gptoss(m, il, err) : HR_OK;
    }
    if (hp->arch == HR_ARCH_PHI3) { /* gate and up in one matrix of 2F rows, gate first */
        hr_weight gu;
        if ((st = bind_matrix(m, NAME("ffn_up.weight"), E, 2 * F, false, &gu, err))) return st;
        L->w_gate = row_slice(&gu, 0, F);
        L->w_up = row_slice(&gu, F, F);
        hp->fused_gate_up = true;
    } else {
        if ((st = bind_matrix(m, NAME("ffn_gate.weight"), E, F, false, &L->w_gate, err))) return st;
        if ((st = bind_matrix(m, NAME("ffn_up.weight"), E, F, false, &L->w_up, err))) return st;
    }
    if ((st = bind_matrix(m, NAME("ffn_down.weight"), F, E, false, &L->w_down, err))) return st;
#undef NAME
    return HR_OK;
}

static const char *dominant_type(const hr_model *m) {
    uint64_t bytes[HR_DTYPE_TABLE] = {0};
    for (int il = 0; il < m->hp.n_layer; il++) {
        const hr_layer *L = &m->layers[il];
        const hr_weight *ws[] = {&L->wq,   &L->wk,     &L->wv,       &L->wo,     &L->w_gate,
                                 &L->w_up, &L->w_down, &L->exp_gate, &L->exp_up, &L->exp_down};
        for (size_t i = 0; i < HR_ARRAY_LEN(ws); i++) { /* named as in the file (q4_0, not q4_0x16) */
            if (!ws[i]->data) continue;                 /* a MoE layer's dense FFN, a dense layer's experts */
            const uint64_t n = i >= 7 ? (uint64_t)m->hp.n_expert : 1;
            bytes[hr_dtype_get_info(ws[i]->type)->file_type] += ws[i]->row_bytes * (uint64_t)ws[i]->rows * n;
        }
        const hr_weight *mla[] = {&L->wq_a,  &L->wq_b,    &L->wkv_a, &L->sh_gate,
                                  &L->sh_up, &L->sh_down, &L->wk_b,  &L->wv_b};
        for (size_t i = 0; i < HR_ARRAY_LEN(mla); i++) /* deepseek2's; W_UK and W_UV per head */
            if (mla[i]->data)
                bytes[hr_dtype_get_info(mla[i]->type)->file_type] +=
                    mla[i]->row_bytes * (uint64_t)mla[i]->rows * (i >= 6 ? (uint64_t)m->hp.n_head : 1);
    }
    int best = 0;
    for (int t = 0; t < HR_DTYPE_TABLE; t++)
        if (bytes[t] > bytes[best]) best = t;
    const hr_dtype_info *info = hr_dtype_get_info((hr_dtype)best);
    return info ? info->name : "?";
}

/* Repacks the q4_0, q5_0, q8_0, q4_K, q5_K and q6_K matrices the layers and an untied output multiply with (rows a
 * multiple of 16) into their x16 layouts (q4_0x16 ... q6_Kx16), in place: the same bytes, interleaved so that
 * the tiles compute 16 rows per register (tensor.h, kernels_x16.h). The token embedding is left as
 * it is (its rows are looked up one by one). Where the data cannot be written (memory lent
 * read-only) or a tmp cannot be had, the weights stay plain: slower, results within rounding of the
 * packed ones. */
/* (An expert stack repacks as one matrix of n_expert x rows rows: with rows a multiple of 16 no group
 * straddles two experts, so each expert's slice is its own x16 matrix.) */
static bool packable(const hr_weight *w) {
    return w->data && hr_dtype_x16(w->type) != w->type && w->rows % HR_X16 == 0;
}

/* Visits the matrices pack_weights may repack: the untied output, then every layer's seven (and its
 * three expert stacks; deepseek2's eight), with n the matrices w stands for (n_expert for a stack, else 1). */
#define FOR_PACKABLE(m, w, n, ...)                                                                                     \
    do {                                                                                                               \
        if (!(m)->hp.tied_output) {                                                                                    \
            hr_weight *w = &(m)->output;                                                                               \
            const int64_t n = 1;                                                                                       \
            __VA_ARGS__                                                                                                \
        }                                                                                                              \
        for (int il_ = 0; il_ < (m)->hp.n_layer; il_++) {                                                              \
            hr_layer *L_ = &(m)->layers[il_];                                                                          \
            hr_weight *lw_[] = {&L_->wq,   &L_->wk,     &L_->wv,       &L_->wo,     &L_->w_gate,                       \
                                &L_->w_up, &L_->w_down, &L_->exp_gate, &L_->exp_up, &L_->exp_down};                    \
            for (size_t i_ = 0; i_ < HR_ARRAY_LEN(lw_); i_++) {                                                        \
                hr_weight *w = lw_[i_];                                                                                \
                const int64_t n = i_ >= 7 ? (int64_t)(m)->hp.n_expert : 1;                                             \
                if (!w->data) continue;                                                                                \
                __VA_ARGS__                                                                                            \
            }                                                                                                          \
            /* deepseek2's: W_UK and W_UV are stacks of n_head */                                                      \
            hr_weight *mw_[] = {&L_->wq_a,  &L_->wq_b,    &L_->wkv_a, &L_->sh_gate,                                    \
                                &L_->sh_up, &L_->sh_down, &L_->wk_b,  &L_->wv_b};                                      \
            for (size_t i_ = 0; i_ < HR_ARRAY_LEN(mw_); i_++) {                                                        \
                hr_weight *w = mw_[i_];                                                                                \
                const int64_t n = i_ >= 6 ? (int64_t)(m)->hp.n_head : 1;                                               \
                if (!w->data) continue;                                                                                \
                __VA_ARGS__                                                                                            \
            }                                                                                                          \
        }                                                                                                              \
    } while (0)

static void pack_weights(hr_model *m) {
    size_t tmp_bytes = 0;
    FOR_PACKABLE(m, w, n, {
        (void)n;
        if (packable(w)) tmp_bytes = HR_MAX(tmp_bytes, w->row_bytes * HR_X16);
    });
    /* a checkpoint's quantized matrices are the loader's own buffers (hf.c): writable as they are */
    if (!tmp_bytes || (!m->hf && !hr_gguf_edit_begin(m->gguf))) return;
    void *tmp = malloc(tmp_bytes);
    if (tmp)
        FOR_PACKABLE(m, w, n, {
            if (packable(w)) {
                const hr_dtype x16 = hr_dtype_x16(w->type);
                hr_x16_repack(x16, (void *)(uintptr_t)w->data, w->rows * n, w->cols, tmp); /* in the edit window */
                w->type = x16;
            }
        });
    free(tmp);
    if (!m->hf) hr_gguf_edit_end(m->gguf);
}

/* phi3's LongRoPE factors: both or neither (llama.cpp stores them once, as these names). */
static hr_status bind_longrope(hr_model *m, hr_error *err) {
    if (m->hp.arch != HR_ARCH_PHI3) return HR_OK;
    int n = m->hp.n_rot / 2;
    hr_status st = bind_vector(m, "rope_factors_long.weight", n, true, &m->rope_long, err);
    if (st && st != HR_ERR_NOT_FOUND) return st;
    st = bind_vector(m, "rope_factors_short.weight", n, m->rope_long == NULL, &m->rope_short, err);
    if (st && st != HR_ERR_NOT_FOUND) return st;
    if (m->rope_short && !m->rope_long)
        return hr_error_set(err, HR_ERR_FORMAT,
                            "model (architecture phi3) lacks the tensor 'rope_factors_long.weight'");
    for (int i = 0; m->rope_long && i < n; i++)
        if (!(m->rope_long[i] > 0) || !(m->rope_short[i] > 0))
            return hr_error_set(err, HR_ERR_FORMAT, "LongRoPE factor %d is not positive (rope_factors_long/short)", i);
    m->hp.has_longrope = m->rope_long != NULL;
    return HR_OK;
}

static hr_status load_gguf(hr_gguf *g, hr_hf *hf, bool repack, hr_model **out, hr_error *err);
hr_status hr_model_load_gguf(hr_gguf *g, hr_model **out, hr_error *err) { return load_gguf(g, NULL, true, out, err); }

/* Takes g and hf (NULL: the tensors are g's), closing both on failure. */
static hr_status load_gguf(hr_gguf *g, hr_hf *hf, bool repack, hr_model **out, hr_error *err) {
    hr_model *m = calloc(1, sizeof *m);
    if (!m) {
        hr_gguf_close(g);
        hr_hf_destroy(hf);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory loading the model");
    }
    m->gguf = g;
    m->hf = hf;
    hr_status st = read_hparams(g, &m->hp, err);
    if (st) goto fail;
    const hr_gguf_tensor *te = find_tensor(m, "token_embd.weight");
    if (!te) {
        st = hr_error_set(err, HR_ERR_FORMAT, "model (architecture %s) lacks the tensor 'token_embd.weight'",
                          m->hp.arch_name);
        goto fail;
    }
    if (te->n_dims != 2 || te->ne[1] < 1 || te->ne[1] > (1 << 24)) {
        st = hr_error_set(err, HR_ERR_FORMAT, "tensor 'token_embd.weight' has an invalid shape");
        goto fail;
    }
    m->hp.n_vocab = (int)te->ne[1];
    if ((st = bind_matrix(m, "token_embd.weight", m->hp.n_embd, m->hp.n_vocab, false, &m->tok_embd, err))) goto fail;
    if ((st = bind_vector(m, "output_norm.weight", m->hp.n_embd, false, &m->output_norm, err))) goto fail;
    st = bind_matrix(m, "output.weight", m->hp.n_embd, m->hp.n_vocab, m->hp.arch != HR_ARCH_GPT_OSS, &m->output, err);
    if (st == HR_ERR_NOT_FOUND) {
        m->output = m->tok_embd;
        m->hp.tied_output = true;
    } else if (st) {
        goto fail;
    }
    st = bind_vector(m, "rope_freqs.weight", m->hp.n_rot / 2, true, &m->rope_freqs, err);
    if (st == HR_OK)
        m->hp.has_rope_freqs = true;
    else if (st != HR_ERR_NOT_FOUND)
        goto fail;
    if ((st = bind_longrope(m, err))) goto fail;
    if ((st = plan_layers(g, m, err))) goto fail;
    m->layers = calloc((unsigned)m->hp.n_layer, sizeof *m->layers); /* n_layer >= 1: read_hparams */
    if (!m->layers) {
        st = hr_error_set(err, HR_ERR_NOMEM, "out of memory loading the model");
        goto fail;
    }
    for (int il = 0; il < m->hp.n_layer; il++)
        if ((st = bind_layer(m, il, err))) goto fail;
    if (repack) pack_weights(m);
    m->type_name = dominant_type(m);
    *out = m;
    return HR_OK;
fail:
    hr_model_destroy(m);
    return st;
}

/* The hyper-parameters a metadata-only GGUF gives (a checkpoint's config.json converted by hf.c, for
 * the planner): what load_gguf reads before binding, window layers included. */
hr_status hr_model_hparams_of_meta(const hr_gguf *g, hr_hparams *hp, hr_error *err) {
    hr_model m = {0};
    hr_status st = read_hparams(g, &m.hp, err);
    if (st == HR_OK) st = plan_layers(g, &m, err);
    free(m.layer_attn);
    if (st == HR_OK) *hp = m.hp;
    return st;
}

hr_status hr_model_load(const char *path, hr_model **out, hr_error *err) {
    return hr_model_load_hold(path, HR_GGUF_MMAP, true, out, err);
}

static bool is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

hr_status hr_model_load_dir(const char *dir, const char *quantize, bool repack, hr_model **out, hr_error *err) {
    if (!is_dir(dir))
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "'%s' is not a directory: --quantize applies to a Hugging Face checkpoint directory "
                            "(a GGUF file keeps its own types)",
                            dir);
    hr_hf *hf = NULL;
    hr_gguf *g = NULL;
    hr_status st = hr_hf_open(dir, quantize, &hf, &g, err); /* its messages name the file */
    if (st) return st;
    st = load_gguf(g, hf, repack, out, err);
    if (st) hr_error_prefix(err, "%s", dir);
    return st;
}

hr_status hr_model_load_hold(const char *path, hr_gguf_hold hold, bool repack, hr_model **out, hr_error *err) {
    if (is_dir(path)) return hr_model_load_dir(path, NULL, repack, out, err); /* always mapped */
    hr_gguf *g = NULL;
    hr_status st = hr_gguf_open_hold(path, hold, &g, err);
    if (st) return st;
    st = load_gguf(g, NULL, repack, out, err);
    if (st) hr_error_prefix(err, "%s", path);
    return st;
}

void hr_model_destroy(hr_model *m) {
    if (!m) return;
    if (m->layers) {
        for (int il = 0; il < m->hp.n_layer; il++) {
            hr_layer *L = &m->layers[il];
            free(L->attn_norm);
            free(L->ffn_norm);
            free(L->bq);
            free(L->bk);
            free(L->bv);
            free(L->q_norm);
            free(L->k_norm);
            free(L->attn_post_norm);
            free(L->ffn_post_norm);
            free(L->q_a_norm);
            free(L->kv_a_norm);
            free(L->exp_probs_b);
            free(L->bo);
            free(L->sinks);
            free(L->b_router);
            free(L->b_exp_gate);
            free(L->b_exp_up);
            free(L->b_exp_down);
            free(L->kv_b_f32);
        }
        free(m->layers);
    }
    free(m->output_norm);
    free(m->rope_freqs);
    free(m->rope_short);
    free(m->rope_long);
    free(m->layer_attn);
    hr_gguf_close(m->gguf);
    hr_hf_destroy(m->hf); /* after the GGUF: it reads the metadata image hf owns */
    free(m);
}

const hr_hparams *hr_model_hparams(const hr_model *m) { return &m->hp; }
const hr_layer_attn *hr_model_layer_attn(const hr_model *m) { return m->layer_attn; }
const hr_gguf *hr_model_gguf(const hr_model *m) { return m->gguf; }
uint64_t hr_model_weight_bytes(const hr_model *m) { return m->weight_bytes; }
uint64_t hr_model_file_bytes(const hr_model *m) { return m->hf ? hr_hf_bytes(m->hf) : hr_gguf_file_size(m->gguf); }
const char *hr_model_type_name(const hr_model *m) { return m->type_name; }

/* the checkpoint's shards or the GGUF give back (give) or count the pages of [p, p + n) */
static uint64_t release(const hr_model *m, const void *p, uint64_t n, bool give) {
    return m->hf ? hr_hf_release(m->hf, p, n, give) : hr_gguf_release(m->gguf, p, n, give);
}

uint64_t hr_model_release_host(const hr_model *m, const void *p, uint64_t n) { return release(m, p, n, true); }
uint64_t hr_model_releasable(const hr_model *m, const void *p, uint64_t n) { return release(m, p, n, false); }
uint64_t hr_model_drop_host(const hr_model *m, const void *p, uint64_t n) {
    return m->hf ? hr_hf_drop(m->hf, p, n, true) : 0;
}
uint64_t hr_model_droppable(const hr_model *m, const void *p, uint64_t n) {
    return m->hf ? hr_hf_drop(m->hf, p, n, false) : 0;
}

const hr_gguf_tensor *hr_model_find_tensor(const hr_model *m, const char *name) {
    return m->hf ? hr_hf_find_tensor(m->hf, name) : hr_gguf_find_tensor(m->gguf, name);
}

hr_dtype hr_model_tensor_type(const hr_model *m, const hr_gguf_tensor *t) {
    hr_dtype type = (hr_dtype)t->type;
    FOR_PACKABLE((hr_model *)m, w, n, {
        (void)n;
        if (w->data == t->data && hr_dtype_get_info(w->type)->row_group > 1) type = w->type;
    });
    return type;
}

int hr_model_packed_tensors(const hr_model *m, uint64_t *bytes) {
    int n = 0;
    uint64_t b = 0;
    FOR_PACKABLE((hr_model *)m, w, nm, {
        if (hr_dtype_get_info(w->type)->row_group > 1) n++, b += (uint64_t)(w->rows * nm) * w->row_bytes;
    });
    if (bytes) *bytes = b;
    return n;
}

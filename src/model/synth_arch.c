/* synth_arch.c: synthetic models of the families past llama's (qwen3, gemma2, gemma3, phi3, qwen3moe, and
 * llama with experts: Mixtral), with the
 * metadata keys and tensor names llama.cpp's converter writes for each (so that llama.cpp loads the
 * same file: the independent check of tests/test_model_arch.c). Kept apart from synth.c, which builds
 * the llama family; the weights are drawn the same way (uniform, variance 1/fan_in, per tensor name
 * and seed), so a shape's values depend only on (shape, type, seed). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/synth_internal.h"

/* tiny shapes for tests (windows far smaller than a 64-token generation, heads whose dim is not
 * E / H, soft-caps low enough to bend the scores), and the published shapes of one model of each
 * family for benchmarks */
static const hr_synth_shape k_arch_shapes[] = {
    {.name = "qwen3-tiny",
     .arch = "qwen3",
     .n_vocab = 2048,
     .n_embd = 64,
     .n_ff = 128,
     .n_head = 4,
     .n_head_kv = 2,
     .n_layer = 2,
     .n_ctx = 512,
     .rope_base = 1000000.0f,
     .vocab = HR_SYNTH_VOCAB_BPE,
     .head_dim = 32},
    /* qwen3-tiny with YaRN as Qwen3's model card turns it on (factor 4 over its original context; here
     * 128 positions, so a 400-token sequence runs past it) */
    {.name = "qwen3-tiny-yarn",
     .arch = "qwen3",
     .n_vocab = 2048,
     .n_embd = 64,
     .n_ff = 128,
     .n_head = 4,
     .n_head_kv = 2,
     .n_layer = 2,
     .n_ctx = 512,
     .rope_base = 1000000.0f,
     .vocab = HR_SYNTH_VOCAB_BPE,
     .head_dim = 32,
     .n_ctx_orig = 128,
     .rope_yarn = 4.0f},
    {.name = "qwen3-0.6b",
     .arch = "qwen3",
     .n_vocab = 151936,
     .n_embd = 1024,
     .n_ff = 3072,
     .n_head = 16,
     .n_head_kv = 8,
     .n_layer = 28,
     .n_ctx = 40960,
     .rope_base = 1000000.0f,
     .tied_output = true,
     .vocab = HR_SYNTH_VOCAB_BPE,
     .head_dim = 128},
    {.name = "gemma2-tiny",
     .arch = "gemma2",
     .n_vocab = 512,
     .n_embd = 64,
     .n_ff = 128,
     .n_head = 4,
     .n_head_kv = 2,
     .n_layer = 4,
     .n_ctx = 512,
     .rope_base = 10000.0f,
     .tied_output = true,
     .sliding_window = 16,
     .vocab = HR_SYNTH_VOCAB_SPM,
     .head_dim = 16,
     .attn_softcap = 5.0f,
     .final_softcap = 10.0f},
    {.name = "gemma2-2b",
     .arch = "gemma2",
     .n_vocab = 256000,
     .n_embd = 2304,
     .n_ff = 9216,
     .n_head = 8,
     .n_head_kv = 4,
     .n_layer = 26,
     .n_ctx = 8192,
     .rope_base = 10000.0f,
     .tied_output = true,
     .sliding_window = 4096,
     .vocab = HR_SYNTH_VOCAB_SPM,
     .head_dim = 256,
     .attn_softcap = 50.0f,
     .final_softcap = 30.0f},
    {.name = "gemma3-tiny",
     .arch = "gemma3",
     .n_vocab = 512,
     .n_embd = 64,
     .n_ff = 128,
     .n_head = 4,
     .n_head_kv = 1,
     .n_layer = 6,
     .n_ctx = 512,
     .rope_base = 1000000.0f,
     .tied_output = true,
     .sliding_window = 16,
     .vocab = HR_SYNTH_VOCAB_SPM,
     .head_dim = 32},
    {.name = "gemma3-1b",
     .arch = "gemma3",
     .n_vocab = 262144,
     .n_embd = 1152,
     .n_ff = 6912,
     .n_head = 4,
     .n_head_kv = 1,
     .n_layer = 26,
     .n_ctx = 32768,
     .rope_base = 1000000.0f,
     .tied_output = true,
     .sliding_window = 512,
     .vocab = HR_SYNTH_VOCAB_SPM,
     .head_dim = 256},
    {.name = "gemma3-tiny-scaled", /* gemma3-tiny with Gemma 3 4B+'s linear RoPE scaling (full layers only) */
     .arch = "gemma3",
     .n_vocab = 512,
     .n_embd = 64,
     .n_ff = 128,
     .n_head = 4,
     .n_head_kv = 1,
     .n_layer = 6,
     .n_ctx = 512,
     .rope_base = 1000000.0f,
     .tied_output = true,
     .sliding_window = 16,
     .vocab = HR_SYNTH_VOCAB_SPM,
     .head_dim = 32,
     .rope_linear = 8.0f},
    {.name = "gemma3-4b",
     .arch = "gemma3",
     .n_vocab = 262208,
     .n_embd = 2560,
     .n_ff = 10240,
     .n_head = 8,
     .n_head_kv = 4,
     .n_layer = 34,
     .n_ctx = 131072,
     .rope_base = 1000000.0f,
     .tied_output = true,
     .sliding_window = 1024,
     .vocab = HR_SYNTH_VOCAB_SPM,
     .head_dim = 256,
     .rope_linear = 8.0f},
    {.name = "phi3-tiny",
     .arch = "phi3",
     .n_vocab = 512,
     .n_embd = 64,
     .n_ff = 128,
     .n_head = 4,
     .n_head_kv = 2,
     .n_layer = 2,
     .n_ctx = 512,
     .rope_base = 10000.0f,
     .vocab = HR_SYNTH_VOCAB_SPM,
     .n_ctx_orig = 64},
    {.name = "phi3.5-mini",
     .arch = "phi3",
     .n_vocab = 32064,
     .n_embd = 3072,
     .n_ff = 8192,
     .n_head = 32,
     .n_head_kv = 32,
     .n_layer = 32,
     .n_ctx = 131072,
     .rope_base = 10000.0f,
     .vocab = HR_SYNTH_VOCAB_SPM,
     .n_ctx_orig = 4096},
    /* experts: 8 of width 32, 2 used (qwen3moe); 4 of width 64, 2 used (Mixtral's 2 of 8, smaller) */
    {.name = "qwen3moe-tiny",
     .arch = "qwen3moe",
     .n_vocab = 2048,
     .n_embd = 64,
     .n_ff = 128,
     .n_head = 4,
     .n_head_kv = 2,
     .n_layer = 2,
     .n_ctx = 512,
     .rope_base = 1000000.0f,
     .vocab = HR_SYNTH_VOCAB_BPE,
     .head_dim = 32,
     .n_expert = 8,
     .n_expert_used = 2,
     .n_ff_exp = 32},
    /* rows of 256: every expert matrix quantizes to q4_K and q8_0 (the tiny shape's go f16 for q4_K) */
    {.name = "qwen3moe-small",
     .arch = "qwen3moe",
     .n_vocab = 2048,
     .n_embd = 256,
     .n_ff = 768,
     .n_head = 4,
     .n_head_kv = 2,
     .n_layer = 2,
     .n_ctx = 512,
     .rope_base = 1000000.0f,
     .vocab = HR_SYNTH_VOCAB_BPE,
     .head_dim = 64,
     .n_expert = 16,
     .n_expert_used = 4,
     .n_ff_exp = 256},
    {.name = "qwen3moe-30b-a3b", /* Qwen3-30B-A3B's published widths (benchmarks: cut with --layers) */
     .arch = "qwen3moe",
     .n_vocab = 151936,
     .n_embd = 2048,
     .n_ff = 6144,
     .n_head = 32,
     .n_head_kv = 4,
     .n_layer = 48,
     .n_ctx = 40960,
     .rope_base = 1000000.0f,
     .vocab = HR_SYNTH_VOCAB_BPE,
     .head_dim = 128,
     .n_expert = 128,
     .n_expert_used = 8,
     .n_ff_exp = 768},
    {.name = "mixtral-tiny",
     .arch = "llama",
     .n_vocab = 512,
     .n_embd = 64,
     .n_ff = 64,
     .n_head = 4,
     .n_head_kv = 2,
     .n_layer = 2,
     .n_ctx = 512,
     .rope_base = 1000000.0f,
     .vocab = HR_SYNTH_VOCAB_SPM,
     .n_expert = 4,
     .n_expert_used = 2},
    /* DeepSeek (deepseek2): latent attention (cache 32 + 16 = 48 floats a token and layer), a leading
     * dense layer, shared experts. V2-Lite-like: Q directly, softmax gates, weights unnormalized; V3-like:
     * Q through its low-rank pair, sigmoid gates with a selection bias, 4 groups of which 2 are searched,
     * normalized weights scaled by 2.5 */
    {.name = "deepseek2-tiny",
     .arch = "deepseek2",
     .n_vocab = 2048,
     .n_embd = 64,
     .n_ff = 128,
     .n_head = 4,
     .n_head_kv = 1,
     .n_layer = 3,
     .n_ctx = 512,
     .rope_base = 10000.0f,
     .vocab = HR_SYNTH_VOCAB_BPE,
     .head_dim = 48,
     .n_expert = 8,
     .n_expert_used = 2,
     .n_ff_exp = 32,
     .kv_lora_rank = 32,
     .qk_nope_dim = 16,
     .qk_rope_dim = 16,
     .v_head_dim = 16,
     .n_layer_dense = 1,
     .n_expert_shared = 2,
     .moe_scale = 1.0f},
    /* deepseek2-tiny's weights with YaRN as DeepSeek-V2 files carry it (factor, original context,
     * yarn_log_multiplier 0.1 x mscale_all_dim 0.707): DeepSeek's factor 40, over 128 tokens */
    {.name = "deepseek2-tiny-yarn",
     .arch = "deepseek2",
     .n_vocab = 2048,
     .n_embd = 64,
     .n_ff = 128,
     .n_head = 4,
     .n_head_kv = 1,
     .n_layer = 3,
     .n_ctx = 512,
     .rope_base = 10000.0f,
     .vocab = HR_SYNTH_VOCAB_BPE,
     .head_dim = 48,
     .n_expert = 8,
     .n_expert_used = 2,
     .n_ff_exp = 32,
     .kv_lora_rank = 32,
     .qk_nope_dim = 16,
     .qk_rope_dim = 16,
     .v_head_dim = 16,
     .n_layer_dense = 1,
     .n_expert_shared = 2,
     .moe_scale = 1.0f,
     .n_ctx_orig = 128,
     .rope_yarn = 40.0f,
     .yarn_log_mul = 0.0707f},
    /* deepseek2-tiny as a GGUF from before llama.cpp's MLA converter: the same weights, W_UK and W_UV in
     * one attn_kv_b (the loader splits it back) */
    {.name = "deepseek2-tiny-kvb",
     .arch = "deepseek2",
     .n_vocab = 2048,
     .n_embd = 64,
     .n_ff = 128,
     .n_head = 4,
     .n_head_kv = 4,
     .n_layer = 3,
     .n_ctx = 512,
     .rope_base = 10000.0f,
     .vocab = HR_SYNTH_VOCAB_BPE,
     .head_dim = 32,
     .n_expert = 8,
     .n_expert_used = 2,
     .n_ff_exp = 32,
     .kv_lora_rank = 32,
     .qk_nope_dim = 16,
     .qk_rope_dim = 16,
     .v_head_dim = 16,
     .n_layer_dense = 1,
     .n_expert_shared = 2,
     .moe_scale = 1.0f,
     .legacy_kv_b = true},
    {.name = "deepseek3-tiny",
     .arch = "deepseek2",
     .n_vocab = 2048,
     .n_embd = 64,
     .n_ff = 128,
     .n_head = 4,
     .n_head_kv = 1,
     .n_layer = 3,
     .n_ctx = 512,
     .rope_base = 10000.0f,
     .vocab = HR_SYNTH_VOCAB_BPE,
     .head_dim = 48,
     .n_expert = 16,
     .n_expert_used = 4,
     .n_ff_exp = 32,
     .q_lora_rank = 48,
     .kv_lora_rank = 32,
     .qk_nope_dim = 16,
     .qk_rope_dim = 16,
     .v_head_dim = 24,
     .n_layer_dense = 1,
     .n_expert_shared = 1,
     .n_expert_groups = 4,
     .n_group_used = 2,
     .moe_sigmoid = true,
     .moe_norm = true,
     .moe_scale = 2.5f},
    {.name = "deepseek-v2-lite", /* DeepSeek-V2-Lite's published widths and YaRN (config.json's rope_scaling) */
     .arch = "deepseek2",
     .n_vocab = 102400,
     .n_embd = 2048,
     .n_ff = 10944,
     .n_head = 16,
     .n_head_kv = 1,
     .n_layer = 27,
     .n_ctx = 163840,
     .rope_base = 10000.0f,
     .vocab = HR_SYNTH_VOCAB_BPE,
     .head_dim = 576,
     .n_expert = 64,
     .n_expert_used = 6,
     .n_ff_exp = 1408,
     .kv_lora_rank = 512,
     .qk_nope_dim = 128,
     .qk_rope_dim = 64,
     .v_head_dim = 128,
     .n_layer_dense = 1,
     .n_expert_shared = 2,
     .moe_scale = 1.0f,
     .n_ctx_orig = 4096,
     .rope_yarn = 40.0f,
     .yarn_log_mul = 0.0707f},
    /* gpt-oss: window layers (16 tokens here, so 64-token generations cross them) alternating with full
     * ones, 8 experts of width 32 with 4 used, YaRN 32 over 4096 as gpt-oss-20b; head dim 32 (H x D = 128
     * != E, as gpt-oss's 64 x 64 != 2880) */
    {.name = "gpt-oss-tiny",
     .arch = "gpt-oss",
     .n_vocab = 2048,
     .n_embd = 64,
     .n_ff = 32,
     .n_head = 4,
     .n_head_kv = 2,
     .n_layer = 2,
     .n_ctx = 131072,
     .rope_base = 150000.0f,
     .sliding_window = 16,
     .vocab = HR_SYNTH_VOCAB_BPE,
     .head_dim = 32,
     .n_expert = 8,
     .n_expert_used = 4,
     .n_ff_exp = 32,
     .n_ctx_orig = 4096,
     .rope_yarn = 32.0f},
    /* rows of 512: benchmarks of the MoE FFN at moderate widths (mxfp4 experts) */
    {.name = "gpt-oss-small",
     .arch = "gpt-oss",
     .n_vocab = 2048,
     .n_embd = 512,
     .n_ff = 512,
     .n_head = 8,
     .n_head_kv = 2,
     .n_layer = 4,
     .n_ctx = 131072,
     .rope_base = 150000.0f,
     .sliding_window = 128,
     .vocab = HR_SYNTH_VOCAB_BPE,
     .head_dim = 64,
     .n_expert = 32,
     .n_expert_used = 4,
     .n_ff_exp = 512,
     .n_ctx_orig = 4096,
     .rope_yarn = 32.0f},
    {.name = "gpt-oss-20b", /* gpt-oss-20b's published shape (config.json) */
     .arch = "gpt-oss",
     .n_vocab = 201088,
     .n_embd = 2880,
     .n_ff = 2880,
     .n_head = 64,
     .n_head_kv = 8,
     .n_layer = 24,
     .n_ctx = 131072,
     .rope_base = 150000.0f,
     .sliding_window = 128,
     .vocab = HR_SYNTH_VOCAB_BPE,
     .head_dim = 64,
     .n_expert = 32,
     .n_expert_used = 4,
     .n_ff_exp = 2880,
     .n_ctx_orig = 4096,
     .rope_yarn = 32.0f},
};

bool hr_synth_arch_shape_by_name(const char *name, hr_synth_shape *out) {
    for (size_t i = 0; i < HR_ARRAY_LEN(k_arch_shapes); i++)
        if (!strcmp(name, k_arch_shapes[i].name)) {
            *out = k_arch_shapes[i];
            return true;
        }
    return false;
}

bool hr_synth_arch_builds(const char *arch) {
    return !strcmp(arch, "qwen3") || !strcmp(arch, "gemma2") || !strcmp(arch, "gemma3") || !strcmp(arch, "phi3") ||
           !strcmp(arch, "qwen3moe") || !strcmp(arch, "gpt-oss") || !strcmp(arch, "deepseek2");
}

/* A stack of n matrices of rows x cols (a 3-D tensor [cols, rows, n]: the experts), drawn as
 * hr_synth_add_matrix draws one (uniform, variance scale^2 / cols, seeded by the name), stored in t or
 * its fallback (hr_synth_fallback) where a row does not fill t's blocks. */
static hr_status add_stack(hr_gguf_writer *w, const char *name, int64_t n, int64_t rows, int64_t cols, hr_dtype t,
                           uint64_t seed, float scale, hr_error *err) {
    t = hr_synth_fallback(t, cols);
    const size_t row_bytes = hr_dtype_row_bytes(t, cols);
    uint8_t *data = malloc(row_bytes * (size_t)(rows * n));
    float *row = malloc(sizeof(float) * (size_t)cols);
    if (!data || !row) {
        free(data);
        free(row);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory synthesizing '%s'", name);
    }
    uint64_t h = 1469598103934665603ULL ^ (seed * 0x9e3779b97f4a7c15ULL); /* FNV-1a of the name */
    for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    hr_rng rng;
    hr_rng_seed(&rng, h);
    const float a = scale * sqrtf(3.0f / (float)cols);
    for (int64_t r = 0; r < rows * n; r++) {
        for (int64_t c = 0; c < cols; c++) row[c] = (float)(2.0 * hr_rng_uniform(&rng) - 1.0) * a;
        hr_quantize_row_ref(t, row, data + (size_t)r * row_bytes, cols);
    }
    free(row);
    int64_t ne[3] = {cols, rows, n};
    hr_gguf_writer_add_tensor(w, name, (uint32_t)t, 3, ne, data, row_bytes * (size_t)(rows * n), false);
    free(data);
    return HR_OK;
}

/* The router (f32, as llama.cpp's quantizer leaves ffn_gate_inp) and the experts of layer il. */
static hr_status add_experts(hr_gguf_writer *w, const hr_synth_shape *s, int il, hr_dtype type, uint64_t seed,
                             hr_error *err) {
    const int64_t E = s->n_embd, NE = s->n_expert, Fe = s->n_ff_exp > 0 ? s->n_ff_exp : s->n_ff;
    char n[96];
    hr_status st;
#define T(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, il), n)
    /* scale 4: router logits spread over a few units, so the top-k choice is not a near tie */
    if ((st = hr_synth_add_matrix(w, T("ffn_gate_inp.weight"), NE, E, HR_DTYPE_F32, seed, 4.0f, err))) return st;
    if ((st = add_stack(w, T("ffn_gate_exps.weight"), NE, Fe, E, type, seed, 1.0f, err))) return st;
    if ((st = add_stack(w, T("ffn_up_exps.weight"), NE, Fe, E, type, seed, 1.0f, err))) return st;
    return add_stack(w, T("ffn_down_exps.weight"), NE, E, Fe, type, seed, 0.5f, err);
#undef T
}

/* gpt-oss's attention extras of layer il: Q/K/V biases (optional in llama.cpp, present in gpt-oss),
 * the output's bias and one sink logit per query head (spread over [-1, 3], so some heads' sinks take
 * a large share of the softmax and others little). */
static hr_status add_gptoss_attn(hr_gguf_writer *w, const hr_synth_shape *s, int il, uint64_t seed, hr_error *err) {
    const int64_t D = s->head_dim > 0 ? s->head_dim : s->n_embd / s->n_head;
    char n[96];
    hr_status st;
#define T(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, il), n)
    if ((st = hr_synth_add_vector(w, T("attn_q.bias"), s->n_head * D, 0.0f, 0.2f, seed, err))) return st;
    if ((st = hr_synth_add_vector(w, T("attn_k.bias"), s->n_head_kv * D, 0.0f, 0.2f, seed, err))) return st;
    if ((st = hr_synth_add_vector(w, T("attn_v.bias"), s->n_head_kv * D, 0.0f, 0.2f, seed, err))) return st;
    if ((st = hr_synth_add_vector(w, T("attn_output.bias"), s->n_embd, 0.0f, 0.1f, seed, err))) return st;
    return hr_synth_add_vector(w, T("attn_sinks.weight"), s->n_head, 1.0f, 2.0f, seed, err);
#undef T
}

/* gpt-oss's router bias and experts' biases ([Fe, NE] and [E, NE], f32) of layer il. */
static hr_status add_gptoss_ffn_biases(hr_gguf_writer *w, const hr_synth_shape *s, int il, uint64_t seed,
                                       hr_error *err) {
    const int64_t E = s->n_embd, NE = s->n_expert, Fe = s->n_ff_exp > 0 ? s->n_ff_exp : s->n_ff;
    char n[96];
    hr_status st;
#define T(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, il), n)
    if ((st = hr_synth_add_vector(w, T("ffn_gate_inp.bias"), NE, 0.0f, 0.5f, seed, err))) return st;
    if ((st = hr_synth_add_matrix(w, T("ffn_gate_exps.bias"), NE, Fe, HR_DTYPE_F32, seed, 1.0f, err))) return st;
    if ((st = hr_synth_add_matrix(w, T("ffn_up_exps.bias"), NE, Fe, HR_DTYPE_F32, seed, 1.0f, err))) return st;
    return hr_synth_add_matrix(w, T("ffn_down_exps.bias"), NE, E, HR_DTYPE_F32, seed, 1.0f, err);
#undef T
}

/* LongRoPE factors (phi3): short ones near 1, long ones growing from 1 to 1 + ctx / ctx_orig along
 * the pairs (low frequencies stretched most, as in the published factors). */
static hr_status add_longrope(hr_gguf_writer *w, const hr_synth_shape *s, int n_rot, hr_error *err) {
    int n = n_rot / 2;
    float *f = malloc(sizeof(float) * 2 * (size_t)n);
    if (!f) return hr_error_set(err, HR_ERR_NOMEM, "out of memory synthesizing the LongRoPE factors");
    double stretch = (double)s->n_ctx / s->n_ctx_orig;
    for (int i = 0; i < n; i++) {
        double x = n > 1 ? (double)i / (n - 1) : 0;
        f[i] = (float)(1.0 + (stretch - 1.0) * x * x); /* long */
        f[n + i] = (float)(1.0 + 0.25 * x);            /* short */
    }
    int64_t ne[1] = {n};
    hr_gguf_writer_add_tensor(w, "rope_factors_long.weight", HR_DTYPE_F32, 1, ne, f, sizeof(float) * (size_t)n, false);
    hr_gguf_writer_add_tensor(w, "rope_factors_short.weight", HR_DTYPE_F32, 1, ne, f + n, sizeof(float) * (size_t)n,
                              false);
    free(f);
    return HR_OK;
}

/* deepseek2's keys as llama.cpp's converter writes them (key_length and value_length: write_keys). */
static void write_mla_keys(hr_gguf_writer *w, const hr_synth_shape *s) {
    char key[128];
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, s->arch), key)
    hr_gguf_writer_set_u32(w, KEY("attention.q_lora_rank"), (uint32_t)s->q_lora_rank);
    hr_gguf_writer_set_u32(w, KEY("attention.kv_lora_rank"), (uint32_t)s->kv_lora_rank);
    if (!s->legacy_kv_b) {
        hr_gguf_writer_set_u32(w, KEY("attention.key_length_mla"), (uint32_t)(s->qk_nope_dim + s->qk_rope_dim));
        hr_gguf_writer_set_u32(w, KEY("attention.value_length_mla"), (uint32_t)s->v_head_dim);
    }
    hr_gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)s->qk_rope_dim);
    hr_gguf_writer_set_u32(w, KEY("leading_dense_block_count"), (uint32_t)s->n_layer_dense);
    hr_gguf_writer_set_u32(w, KEY("expert_shared_count"), (uint32_t)s->n_expert_shared);
    hr_gguf_writer_set_f32(w, KEY("expert_weights_scale"), s->moe_scale);
    if (s->moe_norm) hr_gguf_writer_set_bool(w, KEY("expert_weights_norm"), true);
    hr_gguf_writer_set_u32(w, KEY("expert_gating_func"), s->moe_sigmoid ? 2 : 1);
    if (s->n_expert_groups > 1) {
        hr_gguf_writer_set_u32(w, KEY("expert_group_count"), (uint32_t)s->n_expert_groups);
        hr_gguf_writer_set_u32(w, KEY("expert_group_used_count"), (uint32_t)s->n_group_used);
    }
#undef KEY
}

static void write_keys(hr_gguf_writer *w, const hr_synth_shape *s, hr_dtype type, uint64_t seed, int head_dim) {
    const char *a = s->arch;
    char key[128], name[160];
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, a), key)
    hr_gguf_writer_set_str(w, "general.architecture", a);
    /* llama.cpp's vocabulary loader looks for Phi-3's special tokens (<|endoftext|>) in any model whose
     * name says phi3, and the synthetic vocabulary has none: the name says "phi" */
    const char *shape = s->name, *p3 = strstr(shape, "phi3");
    snprintf(name, sizeof name, "headroom-synth %.*s%s %s seed %llu", p3 ? (int)(p3 - shape) + 3 : (int)strlen(shape),
             shape, p3 ? p3 + 4 : "", hr_dtype_get_info(type)->name, (unsigned long long)seed);
    hr_gguf_writer_set_str(w, "general.name", name);
    hr_gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)s->n_ctx);
    hr_gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)s->n_embd);
    hr_gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)s->n_ff);
    hr_gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)s->n_head);
    hr_gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)s->n_head_kv);
    hr_gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)s->n_layer);
    hr_gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)head_dim);
    hr_gguf_writer_set_u32(w, KEY("attention.value_length"),
                           (uint32_t)(s->kv_lora_rank > 0 ? (s->legacy_kv_b ? s->v_head_dim : s->kv_lora_rank)
                                                          : head_dim)); /* deepseek2: the latent */
    hr_gguf_writer_set_f32(w, KEY("rope.freq_base"), s->rope_base);
    hr_gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-6f);
    if (!strcmp(a, "gemma2")) {
        hr_gguf_writer_set_f32(w, KEY("attn_logit_softcapping"), s->attn_softcap > 0 ? s->attn_softcap : 50.0f);
        hr_gguf_writer_set_f32(w, KEY("final_logit_softcapping"), s->final_softcap > 0 ? s->final_softcap : 30.0f);
    }
    if (!strcmp(a, "gemma3") && s->final_softcap > 0)
        hr_gguf_writer_set_f32(w, KEY("final_logit_softcapping"), s->final_softcap);
    if ((!strcmp(a, "gemma2") || !strcmp(a, "gemma3") || !strcmp(a, "gpt-oss")) && s->sliding_window > 0)
        hr_gguf_writer_set_u32(w, KEY("attention.sliding_window"), (uint32_t)s->sliding_window);
    if (s->kv_lora_rank > 0) write_mla_keys(w, s);
    if (s->n_expert > 0) {
        hr_gguf_writer_set_u32(w, KEY("expert_count"), (uint32_t)s->n_expert);
        hr_gguf_writer_set_u32(w, KEY("expert_used_count"), (uint32_t)s->n_expert_used);
        if (s->n_ff_exp > 0) hr_gguf_writer_set_u32(w, KEY("expert_feed_forward_length"), (uint32_t)s->n_ff_exp);
    }
    if (!strcmp(a, "llama")) hr_gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)head_dim);
    if (s->rope_yarn > 0) { /* the converter's keys for rope_scaling {rope_type: yarn} */
        hr_gguf_writer_set_str(w, KEY("rope.scaling.type"), "yarn");
        hr_gguf_writer_set_f32(w, KEY("rope.scaling.factor"), s->rope_yarn);
        hr_gguf_writer_set_u32(w, KEY("rope.scaling.original_context_length"), (uint32_t)s->n_ctx_orig);
        if (s->yarn_log_mul > 0) hr_gguf_writer_set_f32(w, KEY("rope.scaling.yarn_log_multiplier"), s->yarn_log_mul);
    }
    if (s->rope_linear > 0) {
        hr_gguf_writer_set_str(w, KEY("rope.scaling.type"), "linear");
        hr_gguf_writer_set_f32(w, KEY("rope.scaling.factor"), s->rope_linear);
    }
    if (!strcmp(a, "phi3")) {
        hr_gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)head_dim);
        if (s->n_ctx_orig > 0) {
            hr_gguf_writer_set_u32(w, KEY("rope.scaling.original_context_length"), (uint32_t)s->n_ctx_orig);
            /* the converter's LongRoPE attention factor: sqrt(1 + ln(ctx / orig) / ln(orig)) */
            double scale = (double)s->n_ctx / s->n_ctx_orig;
            if (scale > 1.0)
                hr_gguf_writer_set_f32(w, KEY("rope.scaling.attn_factor"),
                                       (float)sqrt(1.0 + log(scale) / log((double)s->n_ctx_orig)));
        }
    }
#undef KEY
}

/* n matrices of rows x cols in f32, drawn as add_stack draws the stack of that name. NULL: no memory. */
static float *draw_stack(const char *name, int64_t n, int64_t rows, int64_t cols, uint64_t seed, float scale) {
    float *v = malloc(sizeof(float) * (size_t)(n * rows * cols));
    if (!v) return NULL;
    uint64_t h = 1469598103934665603ULL ^ (seed * 0x9e3779b97f4a7c15ULL); /* FNV-1a of the name */
    for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    hr_rng rng;
    hr_rng_seed(&rng, h);
    const float a = scale * sqrtf(3.0f / (float)cols);
    for (int64_t i = 0; i < n * rows * cols; i++) v[i] = (float)(2.0 * hr_rng_uniform(&rng) - 1.0) * a;
    return v;
}

/* A legacy file's blk.N.attn_kv_b ([C, H x (Dn + Dv)]: per head Dn rows of K's up-projection, then Dv of
 * V's), made of the very values the split file's attn_k_b ([Dn, C, H], transposed here) and attn_v_b
 * ([C, Dv, H]) hold, so that the two files are one model. */
static hr_status add_kv_b(hr_gguf_writer *w, const hr_synth_shape *s, int il, hr_dtype t, uint64_t seed,
                          hr_error *err) {
    const int64_t H = s->n_head, C = s->kv_lora_rank, Dn = s->qk_nope_dim, Dv = s->v_head_dim, rows = H * (Dn + Dv);
    char nk[96], nv[96], n[96];
    snprintf(nk, sizeof nk, "blk.%d.attn_k_b.weight", il);
    snprintf(nv, sizeof nv, "blk.%d.attn_v_b.weight", il);
    snprintf(n, sizeof n, "blk.%d.attn_kv_b.weight", il);
    t = hr_synth_fallback(t, C);
    const size_t row_bytes = hr_dtype_row_bytes(t, C);
    float *kb = draw_stack(nk, H, C, Dn, seed, 1.0f), *vb = draw_stack(nv, H, Dv, C, seed, 1.0f);
    float *row = malloc(sizeof(float) * (size_t)C);
    uint8_t *data = malloc(row_bytes * (size_t)rows);
    if (!kb || !vb || !row || !data) {
        free(kb), free(vb), free(row), free(data);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory synthesizing '%s'", n);
    }
    for (int64_t h = 0; h < H; h++)
        for (int64_t j = 0; j < Dn + Dv; j++) {
            for (int64_t r = 0; r < C; r++)
                row[r] = j < Dn ? kb[(h * C + r) * Dn + j] : vb[(h * Dv + (j - Dn)) * C + r];
            hr_quantize_row_ref(t, row, data + (size_t)(h * (Dn + Dv) + j) * row_bytes, C);
        }
    int64_t ne[2] = {C, rows};
    hr_gguf_writer_add_tensor(w, n, (uint32_t)t, 2, ne, data, row_bytes * (size_t)rows, false);
    free(kb), free(vb), free(row), free(data);
    return HR_OK;
}

/* deepseek2's tensors: the latent attention's (W_UK and W_UV per head, as the converter splits
 * kv_b_proj), a dense FFN on the leading layers, then the router (and V3's selection bias), the experts
 * and the shared experts. */
static hr_status build_mla(hr_gguf_writer *w, const hr_synth_shape *s, hr_dtype type, uint64_t seed, hr_error *err) {
    const int64_t E = s->n_embd, H = s->n_head, R = s->qk_rope_dim, Dn = s->qk_nope_dim, Dv = s->v_head_dim,
                  C = s->kv_lora_rank, Cq = s->q_lora_rank, Fs = (int64_t)s->n_expert_shared * s->n_ff_exp;
    hr_status st;
    const bool legacy = s->legacy_kv_b;
    if (Dn < 1 || R < 2 || R % 2 || Dv < 1 || s->head_dim != (legacy ? Dn + R : C + R) ||
        s->n_head_kv != (legacy ? H : 1) || (s->n_layer_dense < s->n_layer && (s->n_expert < 1 || s->n_ff_exp < 1)))
        return hr_error_set(err, HR_ERR_INVALID_ARG, "shape '%s': an inconsistent latent-attention shape", s->name);
    if ((st = hr_synth_add_matrix(w, "token_embd.weight", s->n_vocab, E, type, seed, sqrtf((float)E), err)) ||
        (st = hr_synth_add_vector(w, "output_norm.weight", E, 1.0f, 0.1f, seed, err)) ||
        (!s->tied_output && (st = hr_synth_add_matrix(w, "output.weight", s->n_vocab, E, type, seed, 4.0f, err))))
        return st;
    for (int il = 0; il < s->n_layer; il++) {
        char n[96];
#define T(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, il), n)
        if ((st = hr_synth_add_vector(w, T("attn_norm.weight"), E, 1.0f, 0.1f, seed, err))) return st;
        if (Cq > 0) {
            if ((st = hr_synth_add_matrix(w, T("attn_q_a.weight"), Cq, E, type, seed, 1.0f, err)) ||
                (st = hr_synth_add_vector(w, T("attn_q_a_norm.weight"), Cq, 1.0f, 0.1f, seed, err)) ||
                (st = hr_synth_add_matrix(w, T("attn_q_b.weight"), H * (Dn + R), Cq, type, seed, 1.0f, err)))
                return st;
        } else if ((st = hr_synth_add_matrix(w, T("attn_q.weight"), H * (Dn + R), E, type, seed, 1.0f, err))) {
            return st;
        }
        if ((st = hr_synth_add_matrix(w, T("attn_kv_a_mqa.weight"), C + R, E, type, seed, 1.0f, err)) ||
            (st = hr_synth_add_vector(w, T("attn_kv_a_norm.weight"), C, 1.0f, 0.1f, seed, err)) ||
            (legacy && (st = add_kv_b(w, s, il, type, seed, err))) ||
            (!legacy && (st = add_stack(w, T("attn_k_b.weight"), H, C, Dn, type, seed, 1.0f, err))) ||
            (!legacy && (st = add_stack(w, T("attn_v_b.weight"), H, Dv, C, type, seed, 1.0f, err))) ||
            (st = hr_synth_add_matrix(w, T("attn_output.weight"), E, H * Dv, type, seed, 0.5f, err)) ||
            (st = hr_synth_add_vector(w, T("ffn_norm.weight"), E, 1.0f, 0.1f, seed, err)))
            return st;
        if (il < s->n_layer_dense) {
            if ((st = hr_synth_add_matrix(w, T("ffn_gate.weight"), s->n_ff, E, type, seed, 1.0f, err)) ||
                (st = hr_synth_add_matrix(w, T("ffn_up.weight"), s->n_ff, E, type, seed, 1.0f, err)) ||
                (st = hr_synth_add_matrix(w, T("ffn_down.weight"), E, s->n_ff, type, seed, 0.5f, err)))
                return st;
            continue;
        }
        if ((st = add_experts(w, s, il, type, seed, err))) return st;
        /* V3's selection bias: spread like the gates, so it changes which experts win */
        if (s->moe_sigmoid && (st = hr_synth_add_vector(w, T("exp_probs_b.bias"), s->n_expert, 0.0f, 0.3f, seed, err)))
            return st;
        if (Fs > 0 && ((st = hr_synth_add_matrix(w, T("ffn_gate_shexp.weight"), Fs, E, type, seed, 1.0f, err)) ||
                       (st = hr_synth_add_matrix(w, T("ffn_up_shexp.weight"), Fs, E, type, seed, 1.0f, err)) ||
                       (st = hr_synth_add_matrix(w, T("ffn_down_shexp.weight"), E, Fs, type, seed, 0.5f, err))))
            return st;
#undef T
    }
    return HR_OK;
}

hr_status hr_synth_build_arch(const hr_synth_shape *s, hr_dtype type, uint64_t seed, hr_gguf_writer **out,
                              hr_error *err) {
    const int head_dim = s->head_dim > 0 ? s->head_dim : (s->n_head > 0 ? s->n_embd / s->n_head : 0);
    if (s->n_head <= 0 || s->n_head_kv <= 0 || s->n_head % s->n_head_kv || head_dim <= 0 || head_dim % 2)
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "shape '%s': heads %d / kv heads %d / head dim %d are inconsistent", s->name, s->n_head,
                            s->n_head_kv, head_dim);
    const bool gemma = !strcmp(s->arch, "gemma2") || !strcmp(s->arch, "gemma3");
    const bool qk_norm = !strcmp(s->arch, "qwen3") || !strcmp(s->arch, "qwen3moe") || !strcmp(s->arch, "gemma3");
    const bool phi3 = !strcmp(s->arch, "phi3");
    const bool oss = !strcmp(s->arch, "gpt-oss");
    /* mxfp4: gpt-oss's files hold only the experts in MXFP4 (the rest here in q8_0) */
    const hr_dtype exp_type = type;
    if (type == HR_DTYPE_MXFP4) type = HR_DTYPE_Q8_0;
    hr_gguf_writer *w = hr_gguf_writer_create(3);
    if (!w) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    write_keys(w, s, type, seed, head_dim);
    hr_status st = s->vocab == HR_SYNTH_VOCAB_SPM ? hr_synth_vocab_spm(w, s->n_vocab, err)
                                                  : hr_synth_vocab_bpe(w, s->n_vocab, "qwen2", err);
    if (!st && s->n_expert > 0 && (s->n_expert_used < 1 || s->n_expert_used > s->n_expert))
        st = hr_error_set(err, HR_ERR_INVALID_ARG, "shape '%s': %d experts used of %d", s->name, s->n_expert_used,
                          s->n_expert);
    if (st) goto fail;
    if (s->kv_lora_rank > 0) { /* deepseek2 */
        if ((st = build_mla(w, s, type, seed, err))) goto fail;
        *out = w;
        return HR_OK;
    }
    int64_t E = s->n_embd, F = s->n_ff, D = head_dim, qd = (int64_t)s->n_head * D, kvd = (int64_t)s->n_head_kv * D;
    /* gemma multiplies its embeddings by sqrt(E) itself; the others get unit-scale rows here */
    if ((st = hr_synth_add_matrix(w, "token_embd.weight", s->n_vocab, E, type, seed, gemma ? 1.0f : sqrtf((float)E),
                                  err)))
        goto fail;
    if ((st = hr_synth_add_vector(w, "output_norm.weight", E, 1.0f, 0.1f, seed, err))) goto fail;
    if ((!s->tied_output || oss) &&
        (st = hr_synth_add_matrix(w, "output.weight", s->n_vocab, E, type, seed, 4.0f, err)))
        goto fail;
    if (phi3 && s->n_ctx_orig > 0 && (st = add_longrope(w, s, (int)D, err))) goto fail;
    for (int il = 0; il < s->n_layer; il++) {
        char n[96];
#define T(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, il), n)
        if ((st = hr_synth_add_vector(w, T("attn_norm.weight"), E, 1.0f, 0.1f, seed, err))) goto fail;
        if (phi3) {
            if ((st = hr_synth_add_matrix(w, T("attn_qkv.weight"), qd + 2 * kvd, E, type, seed, 1.0f, err))) goto fail;
        } else {
            if ((st = hr_synth_add_matrix(w, T("attn_q.weight"), qd, E, type, seed, 1.0f, err))) goto fail;
            if ((st = hr_synth_add_matrix(w, T("attn_k.weight"), kvd, E, type, seed, 1.0f, err))) goto fail;
            if ((st = hr_synth_add_matrix(w, T("attn_v.weight"), kvd, E, type, seed, 1.0f, err))) goto fail;
        }
        if (qk_norm) {
            if ((st = hr_synth_add_vector(w, T("attn_q_norm.weight"), D, 1.0f, 0.2f, seed, err))) goto fail;
            if ((st = hr_synth_add_vector(w, T("attn_k_norm.weight"), D, 1.0f, 0.2f, seed, err))) goto fail;
        }
        if ((st = hr_synth_add_matrix(w, T("attn_output.weight"), E, qd, type, seed, 0.5f, err))) goto fail;
        if (oss && (st = add_gptoss_attn(w, s, il, seed, err))) goto fail;
        if (gemma && (st = hr_synth_add_vector(w, T("post_attention_norm.weight"), E, 1.0f, 0.1f, seed, err)))
            goto fail;
        if ((st = hr_synth_add_vector(w, oss ? T("post_attention_norm.weight") : T("ffn_norm.weight"), E, 1.0f, 0.1f,
                                      seed, err)))
            goto fail;
        if (s->n_expert > 0) {
            if ((st = add_experts(w, s, il, exp_type, seed, err))) goto fail;
            if (oss && (st = add_gptoss_ffn_biases(w, s, il, seed, err))) goto fail;
        } else if (phi3) { /* gate rows, then up rows */
            if ((st = hr_synth_add_matrix(w, T("ffn_up.weight"), 2 * F, E, type, seed, 1.0f, err))) goto fail;
        } else {
            if ((st = hr_synth_add_matrix(w, T("ffn_gate.weight"), F, E, type, seed, 1.0f, err))) goto fail;
            if ((st = hr_synth_add_matrix(w, T("ffn_up.weight"), F, E, type, seed, 1.0f, err))) goto fail;
        }
        if (s->n_expert == 0 && (st = hr_synth_add_matrix(w, T("ffn_down.weight"), E, F, type, seed, 0.5f, err)))
            goto fail;
        if (gemma && (st = hr_synth_add_vector(w, T("post_ffw_norm.weight"), E, 1.0f, 0.1f, seed, err))) goto fail;
#undef T
    }
    *out = w;
    return HR_OK;
fail:
    hr_gguf_writer_destroy(w);
    return st;
}

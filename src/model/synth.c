/* synth.c: named real shapes and the random-weight model builder (see synth.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/util.h"
#include "model/synth_internal.h"

static const hr_synth_shape k_shapes[] = {
    {.name = "tiny",
     .arch = "llama",
     .n_vocab = 512,
     .n_embd = 64,
     .n_ff = 192,
     .n_head = 4,
     .n_head_kv = 2,
     .n_layer = 2,
     .n_ctx = 512,
     .rope_base = 10000.0f,
     .vocab = HR_SYNTH_VOCAB_SPM},
    {.name = "tinyllama-1.1b",
     .arch = "llama",
     .n_vocab = 32000,
     .n_embd = 2048,
     .n_ff = 5632,
     .n_head = 32,
     .n_head_kv = 4,
     .n_layer = 22,
     .n_ctx = 2048,
     .rope_base = 10000.0f,
     .vocab = HR_SYNTH_VOCAB_SPM},
    {.name = "llama-3.2-1b",
     .arch = "llama",
     .n_vocab = 128256,
     .n_embd = 2048,
     .n_ff = 8192,
     .n_head = 32,
     .n_head_kv = 8,
     .n_layer = 16,
     .n_ctx = 131072,
     .rope_base = 500000.0f,
     .tied_output = true,
     .llama3_rope = true,
     .vocab = HR_SYNTH_VOCAB_BPE},
    /* Llama-3-8B: GQA 32/8, head_dim 128, an untied 128,256-row output, rope_freqs as llama-3.2-1b's (speed does
       not depend on them); the GPU measurements' end-to-end model (bench/gpu/gpu_bench_engine.c) */
    {.name = "llama-3-8b",
     .arch = "llama",
     .n_vocab = 128256,
     .n_embd = 4096,
     .n_ff = 14336,
     .n_head = 32,
     .n_head_kv = 8,
     .n_layer = 32,
     .n_ctx = 131072,
     .rope_base = 500000.0f,
     .llama3_rope = true,
     .vocab = HR_SYNTH_VOCAB_BPE},
    /* Llama-3-8B's KV cache (32 layers, 8 KV heads of 128: 128 KiB a token in f16) on a small body (8
       query heads, n_embd 1024, ff 1024, vocab 512): what a KV budget holds of the 8B's sessions, at a
       fraction of its weights (bench/gpu/gpu_bench_engine.c's capacity measurement) */
    {.name = "llama-3-8b-kv",
     .arch = "llama",
     .n_vocab = 512,
     .n_embd = 1024,
     .n_ff = 1024,
     .n_head = 8,
     .n_head_kv = 8,
     .n_layer = 32,
     .n_ctx = 131072,
     .rope_base = 500000.0f,
     .llama3_rope = true,
     .vocab = HR_SYNTH_VOCAB_SPM},
    {.name = "qwen2.5-0.5b",
     .arch = "qwen2",
     .n_vocab = 151936,
     .n_embd = 896,
     .n_ff = 4864,
     .n_head = 14,
     .n_head_kv = 2,
     .n_layer = 24,
     .n_ctx = 32768,
     .rope_base = 1000000.0f,
     .tied_output = true,
     .qkv_bias = true,
     .vocab = HR_SYNTH_VOCAB_BPE},
    {.name = "mistral-tiny",
     .arch = "mistral",
     .n_vocab = 512,
     .n_embd = 128,
     .n_ff = 256,
     .n_head = 8,
     .n_head_kv = 2,
     .n_layer = 2,
     .n_ctx = 1024,
     .rope_base = 10000.0f,
     .sliding_window = 256,
     .vocab = HR_SYNTH_VOCAB_SPM},
    {.name = "qwen2-tiny",
     .arch = "qwen2",
     .n_vocab = 2048,
     .n_embd = 64,
     .n_ff = 128,
     .n_head = 4,
     .n_head_kv = 1,
     .n_layer = 2,
     .n_ctx = 512,
     .rope_base = 1000000.0f,
     .tied_output = true,
     .qkv_bias = true,
     .vocab = HR_SYNTH_VOCAB_BPE},
};

const char *hr_synth_shape_names(void) {
    return "tiny, tinyllama-1.1b, llama-3.2-1b, llama-3-8b, llama-3-8b-kv, qwen2.5-0.5b, mistral-tiny, "
           "qwen2-tiny, " HR_SYNTH_ARCH_SHAPE_NAMES;
}

hr_status hr_synth_shape_by_name(const char *name, hr_synth_shape *out, hr_error *err) {
    for (size_t i = 0; i < HR_ARRAY_LEN(k_shapes); i++)
        if (!strcmp(name, k_shapes[i].name)) {
            *out = k_shapes[i];
            return HR_OK;
        }
    if (hr_synth_arch_shape_by_name(name, out)) return HR_OK;
    return hr_error_set(err, HR_ERR_INVALID_ARG, "unknown shape '%s' (known: %s)", name, hr_synth_shape_names());
}

static uint64_t name_hash(const char *s, uint64_t seed) {
    uint64_t h = 1469598103934665603ULL ^ seed;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

/* ---- llama.cpp's mixes (synth.h) ---- */

static const struct {
    const char *name;
    hr_synth_mix mix;
    hr_dtype base;
    uint32_t ftype; /* llama.cpp's llama_ftype, written as general.file_type */
} k_mixes[] = {
    {"Q4_0", HR_SYNTH_MIX_Q4_0, HR_DTYPE_Q4_0, 2},      {"Q8_0", HR_SYNTH_MIX_Q8_0, HR_DTYPE_Q8_0, 7},
    {"Q4_K_M", HR_SYNTH_MIX_Q4_K_M, HR_DTYPE_Q4_K, 15}, {"Q5_K_M", HR_SYNTH_MIX_Q5_K_M, HR_DTYPE_Q5_K, 17},
    {"Q6_K", HR_SYNTH_MIX_Q6_K, HR_DTYPE_Q6_K, 18},
};

const char *hr_synth_mix_names(void) { return "Q4_0, Q8_0, Q4_K_M, Q5_K_M, Q6_K"; }

hr_status hr_synth_mix_by_name(const char *name, hr_synth_mix *out, hr_error *err) {
    for (size_t i = 0; i < HR_ARRAY_LEN(k_mixes); i++)
        if (!strcasecmp(name, k_mixes[i].name)) {
            *out = k_mixes[i].mix;
            return HR_OK;
        }
    return hr_error_set(err, HR_ERR_INVALID_ARG, "unknown mix '%s' (known: %s)", name, hr_synth_mix_names());
}

static size_t mix_index(hr_synth_mix mix) {
    for (size_t i = 0; i < HR_ARRAY_LEN(k_mixes); i++)
        if (k_mixes[i].mix == mix) return i;
    return 0;
}

/* llama.cpp's use_more_bits: the first and last eighth of the layers and every third between. */
static bool more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

hr_dtype hr_synth_mix_type(hr_synth_mix mix, const hr_synth_shape *s, const char *name, int64_t cols) {
    const hr_dtype base = k_mixes[mix_index(mix)].base;
    const bool k_m = mix == HR_SYNTH_MIX_Q4_K_M || mix == HR_SYNTH_MIX_Q5_K_M;
    const bool output = !strcmp(name, "output.weight") || (s->tied_output && !strcmp(name, "token_embd.weight"));
    hr_dtype t = base;
    int layer = -1, used = 0;
    if (output) {
        /* the output matrix: q6_K unless the base is q8_0, q8_0 where a row is not whole super-blocks */
        t = base == HR_DTYPE_Q8_0 || cols % HR_QK_K ? HR_DTYPE_Q8_0 : HR_DTYPE_Q6_K;
    } else if (k_m && sscanf(name, "blk.%d.%n", &layer, &used) == 1 && used > 0 &&
               (!strcmp(name + used, "attn_v.weight") || !strcmp(name + used, "ffn_down.weight"))) {
        /* the llama family has one attn_v and one ffn_down per layer, so llama.cpp's running counters
         * of them are the layer index */
        if (more_bits(layer, s->n_layer)) t = HR_DTYPE_Q6_K;
    }
    return hr_synth_fallback(t, cols);
}

hr_dtype hr_synth_fallback(hr_dtype t, int64_t cols) {
    const hr_dtype_info *info = hr_dtype_get_info(t);
    if (!info || cols % info->block_elems == 0) return t;
    switch (t) { /* llama.cpp's tensor_type_fallback for the types headroom writes */
    case HR_DTYPE_Q4_K: t = HR_DTYPE_Q5_0; break;
    case HR_DTYPE_Q5_K: t = HR_DTYPE_Q5_1; break;
    case HR_DTYPE_Q6_K: t = HR_DTYPE_Q8_0; break;
    default: return HR_DTYPE_F16; /* llama.cpp defines none for the 32-element types: f16 as before */
    }
    return cols % hr_dtype_get_info(t)->block_elems ? HR_DTYPE_F16 : t;
}

/* Fills rows x cols values uniform in [-a, a] with a = sqrt(3 / cols) (variance 1/cols) and stores them
 * in type t (or its fallback, hr_synth_fallback, when the row length does not fit t's block). */
hr_status hr_synth_add_matrix(hr_gguf_writer *w, const char *name, int64_t rows, int64_t cols, hr_dtype t,
                              uint64_t seed, float scale, hr_error *err) {
    const hr_dtype_info *info = hr_dtype_get_info(t);
    if (!info || t == HR_DTYPE_Q8_K)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "type %d cannot store weights", (int)t);
    t = hr_synth_fallback(t, cols);
    size_t row_bytes = hr_dtype_row_bytes(t, cols);
    uint8_t *data = malloc(row_bytes * (size_t)rows);
    float *row = malloc(sizeof(float) * (size_t)cols);
    if (!data || !row) {
        free(data);
        free(row);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory synthesizing '%s'", name);
    }
    hr_rng rng;
    hr_rng_seed(&rng, name_hash(name, seed));
    float a = scale * sqrtf(3.0f / (float)cols);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++) row[c] = (float)(2.0 * hr_rng_uniform(&rng) - 1.0) * a;
        hr_quantize_row_ref(t, row, data + (size_t)r * row_bytes, cols);
    }
    free(row);
    int64_t ne[2] = {cols, rows};
    hr_gguf_writer_add_tensor(w, name, (uint32_t)t, 2, ne, data, row_bytes * (size_t)rows, false);
    free(data);
    return HR_OK;
}

hr_status hr_synth_add_vector(hr_gguf_writer *w, const char *name, int64_t n, float base, float jitter, uint64_t seed,
                              hr_error *err) {
    float *v = malloc(sizeof(float) * (size_t)n);
    if (!v) return hr_error_set(err, HR_ERR_NOMEM, "out of memory synthesizing '%s'", name);
    hr_rng rng;
    hr_rng_seed(&rng, name_hash(name, seed));
    for (int64_t i = 0; i < n; i++) v[i] = base + jitter * (float)(2.0 * hr_rng_uniform(&rng) - 1.0);
    int64_t ne[1] = {n};
    hr_gguf_writer_add_tensor(w, name, HR_DTYPE_F32, 1, ne, v, sizeof(float) * (size_t)n, false);
    free(v);
    return HR_OK;
}

static void add_llama3_rope_freqs(hr_gguf_writer *w, int n_rot, float base) {
    /* Llama 3.1/3.2 frequency scaling: factor 32, low/high frequency factors 1 and 4, original
     * context 8192 (published in the models' config.json). */
    const double factor = 32.0, low = 1.0, high = 4.0, old_ctx = 8192.0;
    float f[512];
    for (int i = 0; i < n_rot / 2 && i < 512; i++) {
        double freq = pow(base, -2.0 * i / n_rot);
        double wavelen = 2.0 * M_PI / freq;
        double s;
        if (wavelen < old_ctx / high)
            s = 1.0;
        else if (wavelen > old_ctx / low)
            s = factor;
        else {
            double smooth = (old_ctx / wavelen - low) / (high - low);
            s = 1.0 / ((1.0 - smooth) / factor + smooth);
        }
        f[i] = (float)s;
    }
    int64_t ne[1] = {n_rot / 2};
    hr_gguf_writer_add_tensor(w, "rope_freqs.weight", HR_DTYPE_F32, 1, ne, f, sizeof(float) * (size_t)(n_rot / 2),
                              false);
}

/* A matrix in the one type, or the mix's type for it. */
static hr_status matrix(hr_gguf_writer *w, const char *name, int64_t rows, int64_t cols, hr_synth_mix mix,
                        hr_dtype type, const hr_synth_shape *s, uint64_t seed, float scale, hr_error *err) {
    const hr_dtype t = mix == HR_SYNTH_PURE ? type : hr_synth_mix_type(mix, s, name, cols);
    return hr_synth_add_matrix(w, name, rows, cols, t, seed, scale, err);
}

static hr_status build(const hr_synth_shape *s, hr_synth_mix mix, hr_dtype type, uint64_t seed, hr_gguf_writer **out,
                       hr_error *err) {
    if (hr_synth_arch_builds(s->arch) || s->n_expert > 0) { /* past llama's, and experts (synth_arch.c) */
        if (mix != HR_SYNTH_PURE)
            return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_QUANT_MIX, NULL,
                                      "a quantization mix is llama.cpp's mixes for the llama family; %s takes one type",
                                      s->arch);
        return hr_synth_build_arch(s, type, seed, out, err);
    }
    if (s->n_head <= 0 || s->n_head_kv <= 0 || s->n_head % s->n_head_kv || s->n_embd % s->n_head)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "shape '%s': heads %d / kv heads %d / width %d are inconsistent",
                            s->name, s->n_head, s->n_head_kv, s->n_embd);
    hr_gguf_writer *w = hr_gguf_writer_create(3);
    if (!w) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    const char *a = s->arch;
    char key[128];
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, a), key)
    hr_gguf_writer_set_str(w, "general.architecture", a);
    char name[160];
    snprintf(name, sizeof name, "headroom-synth %s %s seed %llu", s->name,
             mix == HR_SYNTH_PURE ? hr_dtype_get_info(type)->name : k_mixes[mix_index(mix)].name,
             (unsigned long long)seed);
    hr_gguf_writer_set_str(w, "general.name", name);
    if (mix != HR_SYNTH_PURE) hr_gguf_writer_set_u32(w, "general.file_type", k_mixes[mix_index(mix)].ftype);
    hr_gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)s->n_ctx);
    hr_gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)s->n_embd);
    hr_gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)s->n_ff);
    hr_gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)s->n_head);
    hr_gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)s->n_head_kv);
    hr_gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)s->n_layer);
    int head_dim = s->n_embd / s->n_head;
    hr_gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)head_dim);
    hr_gguf_writer_set_f32(w, KEY("rope.freq_base"), s->rope_base);
    hr_gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
    if (s->sliding_window) hr_gguf_writer_set_u32(w, KEY("attention.sliding_window"), (uint32_t)s->sliding_window);
    if (s->llama3_rope) {
        hr_gguf_writer_set_str(w, KEY("rope.scaling.type"), "llama3");
        hr_gguf_writer_set_f32(w, KEY("rope.scaling.factor"), 32.0f);
    }
#undef KEY
    hr_status st = s->vocab == HR_SYNTH_VOCAB_SPM
                       ? hr_synth_vocab_spm(w, s->n_vocab, err)
                       : hr_synth_vocab_bpe(w, s->n_vocab, !strcmp(a, "qwen2") ? "qwen2" : "llama-bpe", err);
    if (st) goto fail;

    int64_t E = s->n_embd, F = s->n_ff, qd = (int64_t)s->n_head * head_dim, kvd = (int64_t)s->n_head_kv * head_dim;
    /* token_embd at scale ~1 per element so the first RMSNorm sees unit-scale input */
    if ((st = matrix(w, "token_embd.weight", s->n_vocab, E, mix, type, s, seed, sqrtf((float)E), err))) goto fail;
    (void)hr_synth_add_vector(w, "output_norm.weight", E, 1.0f, 0.1f, seed, NULL);
    if (!s->tied_output && (st = matrix(w, "output.weight", s->n_vocab, E, mix, type, s, seed, 4.0f, err))) goto fail;
    if (s->llama3_rope) add_llama3_rope_freqs(w, head_dim, s->rope_base);
    for (int il = 0; il < s->n_layer; il++) {
        char n[96];
#define T(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, il), n)
        (void)hr_synth_add_vector(w, T("attn_norm.weight"), E, 1.0f, 0.1f, seed, NULL);
        if ((st = matrix(w, T("attn_q.weight"), qd, E, mix, type, s, seed, 1.0f, err))) goto fail;
        if ((st = matrix(w, T("attn_k.weight"), kvd, E, mix, type, s, seed, 1.0f, err))) goto fail;
        if ((st = matrix(w, T("attn_v.weight"), kvd, E, mix, type, s, seed, 1.0f, err))) goto fail;
        if ((st = matrix(w, T("attn_output.weight"), E, qd, mix, type, s, seed, 0.5f, err))) goto fail;
        if (s->qkv_bias) {
            (void)hr_synth_add_vector(w, T("attn_q.bias"), qd, 0.0f, 0.1f, seed, NULL);
            (void)hr_synth_add_vector(w, T("attn_k.bias"), kvd, 0.0f, 0.1f, seed, NULL);
            (void)hr_synth_add_vector(w, T("attn_v.bias"), kvd, 0.0f, 0.1f, seed, NULL);
        }
        (void)hr_synth_add_vector(w, T("ffn_norm.weight"), E, 1.0f, 0.1f, seed, NULL);
        if ((st = matrix(w, T("ffn_gate.weight"), F, E, mix, type, s, seed, 1.0f, err))) goto fail;
        if ((st = matrix(w, T("ffn_up.weight"), F, E, mix, type, s, seed, 1.0f, err))) goto fail;
        if ((st = matrix(w, T("ffn_down.weight"), E, F, mix, type, s, seed, 0.5f, err))) goto fail;
#undef T
    }
    *out = w;
    return HR_OK;
fail:
    hr_gguf_writer_destroy(w);
    return st;
}

hr_status hr_synth_build(const hr_synth_shape *s, hr_dtype type, uint64_t seed, hr_gguf_writer **out, hr_error *err) {
    return build(s, HR_SYNTH_PURE, type, seed, out, err);
}

hr_status hr_synth_build_mix(const hr_synth_shape *s, hr_synth_mix mix, uint64_t seed, hr_gguf_writer **out,
                             hr_error *err) {
    if (mix == HR_SYNTH_PURE) return hr_error_set(err, HR_ERR_INVALID_ARG, "no mix given");
    return build(s, mix, k_mixes[mix_index(mix)].base, seed, out, err);
}

static hr_status model_of(const hr_synth_shape *shape, hr_synth_mix mix, hr_dtype type, uint64_t seed, hr_model **out,
                          void **file, hr_error *err) {
    hr_gguf_writer *w = NULL;
    void *mem = NULL;
    size_t size = 0;
    hr_gguf *g = NULL;
    hr_status st = build(shape, mix, type, seed, &w, err);
    if (!st) st = hr_gguf_writer_write_memory(w, &mem, &size, err);
    hr_gguf_writer_destroy(w);
    if (!st) st = hr_gguf_open_memory_mut(mem, size, &g, err);
    if (!st) st = hr_model_load_gguf(g, out, err); /* takes g, closing it on failure */
    if (st) {
        free(mem);
        return st;
    }
    *file = mem;
    return HR_OK;
}

hr_status hr_synth_model(const hr_synth_shape *shape, hr_dtype type, uint64_t seed, hr_model **out, void **file,
                         hr_error *err) {
    return model_of(shape, HR_SYNTH_PURE, type, seed, out, file, err);
}

hr_status hr_synth_model_mix(const hr_synth_shape *shape, hr_synth_mix mix, uint64_t seed, hr_model **out, void **file,
                             hr_error *err) {
    if (mix == HR_SYNTH_PURE) return hr_error_set(err, HR_ERR_INVALID_ARG, "no mix given");
    return model_of(shape, mix, k_mixes[mix_index(mix)].base, seed, out, file, err);
}

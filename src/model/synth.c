/* synth.c: named real shapes and the random-weight model builder (see synth.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    return "tiny, tinyllama-1.1b, llama-3.2-1b, qwen2.5-0.5b, mistral-tiny, qwen2-tiny, " HR_SYNTH_ARCH_SHAPE_NAMES;
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

/* Fills rows x cols values uniform in [-a, a] with a = sqrt(3 / cols) (variance 1/cols) and stores them
 * in type t (or f16 when the row length does not fit t's block). Returns the type used. */
static hr_status add_matrix(hr_gguf_writer *w, const char *name, int64_t rows, int64_t cols, hr_dtype t, uint64_t seed,
                            float scale, hr_error *err) {
    const hr_dtype_info *info = hr_dtype_get_info(t);
    if (!info || t == HR_DTYPE_Q8_K)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "type %d cannot store weights", (int)t);
    if (cols % info->block_elems) t = HR_DTYPE_F16;
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

static void add_vector(hr_gguf_writer *w, const char *name, int64_t n, float base, float jitter, uint64_t seed) {
    float *v = malloc(sizeof(float) * (size_t)n);
    if (!v) return; /* the writer reports the missing tensor as a size mismatch below */
    hr_rng rng;
    hr_rng_seed(&rng, name_hash(name, seed));
    for (int64_t i = 0; i < n; i++) v[i] = base + jitter * (float)(2.0 * hr_rng_uniform(&rng) - 1.0);
    int64_t ne[1] = {n};
    hr_gguf_writer_add_tensor(w, name, HR_DTYPE_F32, 1, ne, v, sizeof(float) * (size_t)n, false);
    free(v);
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

hr_status hr_synth_build(const hr_synth_shape *s, hr_dtype type, uint64_t seed, hr_gguf_writer **out, hr_error *err) {
    if (hr_synth_arch_builds(s->arch)) return hr_synth_build_arch(s, type, seed, out, err);
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
    snprintf(name, sizeof name, "headroom-synth %s %s seed %llu", s->name, hr_dtype_get_info(type)->name,
             (unsigned long long)seed);
    hr_gguf_writer_set_str(w, "general.name", name);
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
    if ((st = add_matrix(w, "token_embd.weight", s->n_vocab, E, type, seed, sqrtf((float)E), err))) goto fail;
    add_vector(w, "output_norm.weight", E, 1.0f, 0.1f, seed);
    if (!s->tied_output && (st = add_matrix(w, "output.weight", s->n_vocab, E, type, seed, 4.0f, err))) goto fail;
    if (s->llama3_rope) add_llama3_rope_freqs(w, head_dim, s->rope_base);
    for (int il = 0; il < s->n_layer; il++) {
        char n[96];
#define T(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, il), n)
        add_vector(w, T("attn_norm.weight"), E, 1.0f, 0.1f, seed);
        if ((st = add_matrix(w, T("attn_q.weight"), qd, E, type, seed, 1.0f, err))) goto fail;
        if ((st = add_matrix(w, T("attn_k.weight"), kvd, E, type, seed, 1.0f, err))) goto fail;
        if ((st = add_matrix(w, T("attn_v.weight"), kvd, E, type, seed, 1.0f, err))) goto fail;
        if ((st = add_matrix(w, T("attn_output.weight"), E, qd, type, seed, 0.5f, err))) goto fail;
        if (s->qkv_bias) {
            add_vector(w, T("attn_q.bias"), qd, 0.0f, 0.1f, seed);
            add_vector(w, T("attn_k.bias"), kvd, 0.0f, 0.1f, seed);
            add_vector(w, T("attn_v.bias"), kvd, 0.0f, 0.1f, seed);
        }
        add_vector(w, T("ffn_norm.weight"), E, 1.0f, 0.1f, seed);
        if ((st = add_matrix(w, T("ffn_gate.weight"), F, E, type, seed, 1.0f, err))) goto fail;
        if ((st = add_matrix(w, T("ffn_up.weight"), F, E, type, seed, 1.0f, err))) goto fail;
        if ((st = add_matrix(w, T("ffn_down.weight"), E, F, type, seed, 0.5f, err))) goto fail;
#undef T
    }
    *out = w;
    return HR_OK;
fail:
    hr_gguf_writer_destroy(w);
    return st;
}

hr_status hr_synth_model(const hr_synth_shape *shape, hr_dtype type, uint64_t seed, hr_model **out, void **file,
                         hr_error *err) {
    hr_gguf_writer *w = NULL;
    void *mem = NULL;
    size_t size = 0;
    hr_gguf *g = NULL;
    hr_status st = hr_synth_build(shape, type, seed, &w, err);
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

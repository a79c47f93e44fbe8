/* hf.c: a Hugging Face checkpoint directory as the model loader's GGUF view (see hf.h).
 *
 * The mapping follows llama.cpp's convert_hf_to_gguf.py: config.json keys become {arch}.* metadata,
 * "model.layers.N.self_attn.q_proj.weight" becomes "blk.N.attn_q.weight" and so on, llama and mistral
 * Q/K rows are permuted from HF's rotate-half layout to the adjacent pairs the GGUF forward rotates,
 * gemma's norms are stored as 1 + w, Llama-3 rope scaling becomes a rope_freqs tensor and phi3's
 * LongRoPE lists rope_factors_short/long. Every tensor is checked against the shape config.json
 * implies and against its torch_dtype before anything is bound. */
#include "model/hf.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "common/util.h"
#include "model/model.h"
#include "model/model_internal.h"
#include "model/safetensors.h"
#include "tensor/tensor.h"
#include "tokenizer/tokenizer.h"

#define PATH_CAP 4096

struct hr_hf {
    hr_safetensors **shards;
    size_t n_shards;
    hr_gguf_tensor *tensors; /* GGUF-named views; names owned (name.ptr) */
    size_t n_tensors, cap_tensors;
    /* quantized / converted / stacked buffers; from a page on each its own anonymous mapping, so that
     * hr_hf_drop can hand its pages back to the system (a malloc'd one may never leave the heap) */
    struct hf_owned {
        void *p;
        size_t bytes;
        bool mapped;
    } * owned;
    size_t n_owned, cap_owned;
    void *meta_image; /* the metadata GGUF's bytes */
    size_t meta_size;
    /* the experts' stacks (MoE): HF stores one matrix per expert, the GGUF (and the loader's binding)
     * one 3-D tensor per layer and kind; each is copied into an owned stack as its experts arrive */
    struct hf_stack {
        size_t tensor; /* index into tensors */
        int filled;    /* experts copied */
        uint8_t *seen; /* n_expert flags */
    } * stacks;
    size_t n_stacks, cap_stacks;
};

/* What the tensor checks need of config.json. */
typedef struct hf_cfg {
    const char *dir;
    char cfg_path[PATH_CAP];
    const char *arch; /* headroom's (GGUF) architecture name */
    hr_arch arch_id;
    int64_t E, F, H, Hkv, L, D, V;
    int64_t NE, Fe; /* experts (0: dense) and one expert's FFN width */
    bool tied, permute_qk, gemma, mixtral;
    int torch_dtype; /* HR_DTYPE_F32/F16/BF16, or -1 when config.json does not say */
    char torch_name[16];
    int quant; /* --quantize's type, or -1 */
} hf_cfg;

/* ---- bookkeeping -------------------------------------------------------------------------------- */

static bool grow(void **p, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return true;
    size_t nc = *cap ? *cap * 2 : 64;
    void *q = realloc(*p, nc * elem);
    if (!q) return false;
    *p = q;
    *cap = nc;
    return true;
}

static void *own(hr_hf *h, size_t bytes) {
    if (!grow((void **)&h->owned, &h->cap_owned, h->n_owned, sizeof *h->owned)) return NULL;
    struct hf_owned o = {.bytes = bytes, .mapped = bytes >= 4096};
    if (o.mapped) {
        void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        o.p = m == MAP_FAILED ? NULL : m;
    } else {
        o.p = malloc(bytes ? bytes : 1);
    }
    if (o.p) h->owned[h->n_owned++] = o;
    return o.p;
}

void hr_hf_destroy(hr_hf *h) {
    if (!h) return;
    for (size_t i = 0; i < h->n_shards; i++) hr_safetensors_close(h->shards[i]);
    free(h->shards);
    for (size_t i = 0; i < h->n_tensors; i++) free((char *)h->tensors[i].name.ptr);
    free(h->tensors);
    for (size_t i = 0; i < h->n_owned; i++) /* a dropped range is unmapped already: munmap takes holes */
        if (h->owned[i].mapped)
            munmap(h->owned[i].p, h->owned[i].bytes);
        else
            free(h->owned[i].p);
    free(h->owned);
    free(h->meta_image);
    for (size_t i = 0; i < h->n_stacks; i++) free(h->stacks[i].seen);
    free(h->stacks);
    free(h);
}

const hr_gguf_tensor *hr_hf_find_tensor(const hr_hf *h, const char *name) {
    size_t n = strlen(name);
    for (size_t i = 0; i < h->n_tensors; i++)
        if (h->tensors[i].name.len == n && !memcmp(h->tensors[i].name.ptr, name, n)) return &h->tensors[i];
    return NULL;
}

uint64_t hr_hf_release(hr_hf *h, const void *p, uint64_t n, bool give) {
    uint64_t b = 0;
    for (size_t i = 0; i < h->n_shards && !b; i++) b = hr_safetensors_release(h->shards[i], p, n, give);
    return b; /* an owned (converted) buffer is in no shard: 0 */
}

uint64_t hr_hf_drop(hr_hf *h, const void *p, uint64_t n, bool give) {
    const uint8_t *a = p;
    for (size_t i = 0; i < h->n_owned; i++) {
        const struct hf_owned *o = &h->owned[i];
        const uint8_t *b = o->p;
        if (!o->mapped || a < b || n > o->bytes || (uint64_t)(a - b) > o->bytes - n) continue;
        uintptr_t lo;
        const uint64_t bytes = hr_page_span(p, n, &lo);
        if (!bytes || !give) return bytes;
        return munmap((void *)lo, (size_t)bytes) == 0 ? bytes : 0;
    }
    return 0;
}

uint64_t hr_hf_bytes(const hr_hf *h) {
    uint64_t b = h->meta_size;
    for (size_t i = 0; i < h->n_tensors; i++) b += h->tensors[i].size_bytes;
    return b;
}

int hr_hf_quantize_type(const char *name) {
    if (!strcasecmp(name, "q8_0")) return HR_DTYPE_Q8_0;
    if (!strcasecmp(name, "q4_0")) return HR_DTYPE_Q4_0;
    if (!strcasecmp(name, "q4_K")) return HR_DTYPE_Q4_K;
    return -1;
}

/* Adds a GGUF-named tensor: ne in GGUF order (ne[0] contiguous). */
static hr_status add_tensor(hr_hf *h, const char *name, uint32_t type, int n_dims, int64_t ne0, int64_t ne1,
                            const void *data, uint64_t bytes, hr_error *err) {
    if (hr_hf_find_tensor(h, name))
        return hr_error_set(err, HR_ERR_FORMAT, "tensor '%s' appears twice in the checkpoint", name);
    if (!grow((void **)&h->tensors, &h->cap_tensors, h->n_tensors, sizeof *h->tensors))
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    char *nm = strdup(name);
    if (!nm) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    hr_gguf_tensor *t = &h->tensors[h->n_tensors++];
    memset(t, 0, sizeof *t);
    t->name = (hr_gguf_str){nm, strlen(nm)};
    t->n_dims = (uint32_t)n_dims;
    t->ne[0] = ne0;
    t->ne[1] = n_dims > 1 ? ne1 : 1;
    t->ne[2] = t->ne[3] = 1; /* an experts' stack sets ne[2] */
    t->type = type;
    t->size_bytes = bytes;
    t->data = data;
    return HR_OK;
}

/* ---- config.json -------------------------------------------------------------------------------- */

static json_t *load_json(const char *path, bool required, hr_error *err, hr_status *st) {
    *st = HR_OK;
    struct stat sb;
    if (stat(path, &sb) != 0) {
        if (required) *st = hr_error_set(err, HR_ERR_NOT_FOUND, "%s: no such file", path);
        return NULL;
    }
    json_error_t je;
    json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!j || !json_is_object(j)) {
        *st = j ? hr_error_set(err, HR_ERR_FORMAT, "%s: not a JSON object", path)
                : hr_error_set(err, HR_ERR_FORMAT, "%s: not JSON: %s (line %d)", path, je.text, je.line);
        json_decref(j);
        return NULL;
    }
    return j;
}

static hr_status cfg_int(const hf_cfg *c, json_t *root, const char *key, bool required, int64_t dflt, int64_t lo,
                         int64_t *out, hr_error *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (required) return hr_error_set(err, HR_ERR_FORMAT, "%s lacks the required key '%s'", c->cfg_path, key);
        *out = dflt;
        return HR_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > (1 << 30))
        return hr_error_set(err, HR_ERR_FORMAT, "%s: '%s' must be an integer in [%lld, %d]", c->cfg_path, key,
                            (long long)lo, 1 << 30);
    *out = json_integer_value(v);
    return HR_OK;
}

/* A number key, or dflt when absent or null; *present tells which. */
static hr_status cfg_num(const hf_cfg *c, json_t *root, const char *key, double dflt, double *out, bool *present,
                         hr_error *err) {
    json_t *v = json_object_get(root, key);
    if (present) *present = v && !json_is_null(v);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return HR_OK;
    }
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return hr_error_set(err, HR_ERR_FORMAT, "%s: '%s' must be a number", c->cfg_path, key);
    *out = json_number_value(v);
    return HR_OK;
}

static const struct {
    const char *model_type, *class_name, *arch;
    hr_arch id;
    bool permute_qk, tied;
} k_hf_archs[] = {
    {"llama", "LlamaForCausalLM", "llama", HR_ARCH_LLAMA, true, false},
    {"mistral", "MistralForCausalLM", "mistral", HR_ARCH_MISTRAL, true, false},
    {"qwen2", "Qwen2ForCausalLM", "qwen2", HR_ARCH_QWEN2, false, false},
    {"qwen3", "Qwen3ForCausalLM", "qwen3", HR_ARCH_QWEN3, false, false},
    {"gemma2", "Gemma2ForCausalLM", "gemma2", HR_ARCH_GEMMA2, false, true},
    {"gemma3_text", "Gemma3ForCausalLM", "gemma3", HR_ARCH_GEMMA3, false, true},
    {"phi3", "Phi3ForCausalLM", "phi3", HR_ARCH_PHI3, false, false},
    {"qwen3_moe", "Qwen3MoeForCausalLM", "qwen3moe", HR_ARCH_QWEN3MOE, false, false},
    {"mixtral", "MixtralForCausalLM", "llama", HR_ARCH_LLAMA, true, false}, /* llama with experts, as in GGUF */
};

static hr_status cfg_arch(hf_cfg *c, json_t *root, hr_error *err) {
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    json_t *classes = json_object_get(root, "architectures");
    const char *cls = json_is_array(classes) ? json_string_value(json_array_get(classes, 0)) : NULL;
    if (!mt && !cls)
        return hr_error_set(err, HR_ERR_FORMAT, "%s lacks the required key 'model_type' (and 'architectures')",
                            c->cfg_path);
    for (size_t i = 0; i < HR_ARRAY_LEN(k_hf_archs); i++)
        if ((mt && !strcmp(mt, k_hf_archs[i].model_type)) || (!mt && !strcmp(cls, k_hf_archs[i].class_name))) {
            c->arch = k_hf_archs[i].arch;
            c->arch_id = k_hf_archs[i].id;
            c->permute_qk = k_hf_archs[i].permute_qk;
            c->tied = k_hf_archs[i].tied;
            c->gemma = c->arch_id == HR_ARCH_GEMMA2 || c->arch_id == HR_ARCH_GEMMA3;
            c->mixtral = !strcmp(k_hf_archs[i].model_type, "mixtral");
            return HR_OK;
        }
    return hr_error_set(err, HR_ERR_UNSUPPORTED,
                        "%s: architecture '%.64s' is not supported (supported model_type: llama, mistral, qwen2, "
                        "qwen3, gemma2, gemma3_text, phi3, qwen3_moe, mixtral)",
                        c->cfg_path, mt ? mt : cls);
}

/* Llama 3.1's frequency factors (rope_scaling rope_type "llama3"), as convert_hf_to_gguf.py computes
 * them into rope_freqs.weight. */
static hr_status llama3_freqs(hr_hf *h, const hf_cfg *c, json_t *rs, double base, hr_error *err) {
    double factor, low, high, old_ctx;
    hr_status st;
    if ((st = cfg_num(c, rs, "factor", 8.0, &factor, NULL, err)) ||
        (st = cfg_num(c, rs, "low_freq_factor", 1.0, &low, NULL, err)) ||
        (st = cfg_num(c, rs, "high_freq_factor", 4.0, &high, NULL, err)) ||
        (st = cfg_num(c, rs, "original_max_position_embeddings", 8192.0, &old_ctx, NULL, err)))
        return st;
    if (!(factor > 0) || !(high > low) || !(old_ctx > 0))
        return hr_error_set(err, HR_ERR_FORMAT, "%s: rope_scaling (llama3) has factors out of range", c->cfg_path);
    int n = (int)c->D / 2;
    float *f = own(h, sizeof(float) * (size_t)n);
    if (!f) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        double freq = pow(base, -2.0 * i / (double)c->D);
        double wavelen = 2.0 * M_PI / freq, s;
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
    return add_tensor(h, "rope_freqs.weight", HR_DTYPE_F32, 1, n, 1, f, sizeof(float) * (size_t)n, err);
}

/* phi3's LongRoPE: short_factor and long_factor lists of n_rot/2 become rope_factors_short/long. */
static hr_status longrope(hr_hf *h, const hf_cfg *c, json_t *root, json_t *rs, int n_rot, hr_gguf_writer *w, double ctx,
                          hr_error *err) {
    const char *names[2] = {"short_factor", "long_factor"},
               *gg[2] = {"rope_factors_short.weight", "rope_factors_long.weight"};
    int n = n_rot / 2;
    for (int k = 0; k < 2; k++) {
        json_t *a = json_object_get(rs, names[k]);
        if (!json_is_array(a) || json_array_size(a) != (size_t)n)
            return hr_error_set(err, HR_ERR_FORMAT, "%s: rope_scaling.%s must be a list of %d numbers", c->cfg_path,
                                names[k], n);
        float *f = own(h, sizeof(float) * (size_t)n);
        if (!f) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
        for (int i = 0; i < n; i++) {
            json_t *x = json_array_get(a, (size_t)i);
            if (!json_is_number(x))
                return hr_error_set(err, HR_ERR_FORMAT, "%s: rope_scaling.%s[%d] is not a number", c->cfg_path,
                                    names[k], i);
            f[i] = (float)json_number_value(x);
        }
        hr_status st = add_tensor(h, gg[k], HR_DTYPE_F32, 1, n, 1, f, sizeof(float) * (size_t)n, err);
        if (st) return st;
    }
    char key[96];
    int64_t orig = 0;
    /* Phi-3's configs keep it at the top level; newer ones inside rope_scaling */
    json_t *where = json_object_get(root, "original_max_position_embeddings") ? root : rs;
    hr_status st = cfg_int(c, where, "original_max_position_embeddings", false, 0, 0, &orig, err);
    if (st) return st;
    if (orig > 0) {
        snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", c->arch);
        hr_gguf_writer_set_u32(w, key, (uint32_t)orig);
        double scale = ctx / (double)orig;
        double attn = scale > 1.0 ? sqrt(1.0 + log(scale) / log((double)orig)) : 1.0;
        snprintf(key, sizeof key, "%s.rope.scaling.attn_factor", c->arch);
        hr_gguf_writer_set_f32(w, key, (float)attn);
    }
    return HR_OK;
}

/* The experts: Qwen3-MoE's num_experts, num_experts_per_tok, moe_intermediate_size (every layer sparse:
 * decoder_sparse_step 1, no mlp_only_layers) and norm_topk_prob (the forward renormalizes the chosen
 * experts' weights, as Qwen3-30B-A3B sets); Mixtral's num_local_experts and num_experts_per_tok, each
 * expert of intermediate_size (Mixtral always renormalizes). */
static hr_status read_moe(hf_cfg *c, json_t *root, hr_error *err) {
    const bool q3 = c->arch_id == HR_ARCH_QWEN3MOE;
    hr_status st;
    c->NE = 0;
    c->Fe = c->F;
    if (!q3 && !c->mixtral) return HR_OK;
    int64_t used, step = 1;
    if ((st = cfg_int(c, root, q3 ? "num_experts" : "num_local_experts", true, 0, 1, &c->NE, err)) ||
        (st = cfg_int(c, root, "num_experts_per_tok", true, 0, 1, &used, err)))
        return st;
    if (c->NE > 4096 || used > c->NE)
        return hr_error_set(err, HR_ERR_FORMAT, "%s: num_experts_per_tok %lld of %lld experts (at most 4096)",
                            c->cfg_path, (long long)used, (long long)c->NE);
    if (!q3) return HR_OK;
    if ((st = cfg_int(c, root, "moe_intermediate_size", true, 0, 1, &c->Fe, err)) ||
        (st = cfg_int(c, root, "decoder_sparse_step", false, 1, 1, &step, err)))
        return st;
    json_t *dense = json_object_get(root, "mlp_only_layers");
    if (step != 1 || (json_is_array(dense) && json_array_size(dense) > 0))
        return hr_error_set(err, HR_ERR_UNSUPPORTED,
                            "%s: dense layers among the experts' (decoder_sparse_step %lld, mlp_only_layers) are not "
                            "supported",
                            c->cfg_path, (long long)step);
    json_t *norm = json_object_get(root, "norm_topk_prob");
    if (json_is_boolean(norm) && !json_is_true(norm))
        return hr_error_set(err, HR_ERR_UNSUPPORTED,
                            "%s: norm_topk_prob false is not supported (the chosen experts' weights are renormalized)",
                            c->cfg_path);
    return HR_OK;
}

/* config.json -> {arch}.* metadata (and the rope tensors it implies). */
static hr_status read_config(hr_hf *h, hf_cfg *c, json_t *root, hr_gguf_writer *w, hr_error *err) {
    hr_status st;
    if ((st = cfg_arch(c, root, err))) return st;
    int64_t ctx;
    if ((st = cfg_int(c, root, "hidden_size", true, 0, 1, &c->E, err)) ||
        (st = cfg_int(c, root, "intermediate_size", true, 0, 1, &c->F, err)) ||
        (st = cfg_int(c, root, "num_attention_heads", true, 0, 1, &c->H, err)) ||
        (st = cfg_int(c, root, "num_hidden_layers", true, 0, 1, &c->L, err)) ||
        (st = cfg_int(c, root, "vocab_size", true, 0, 1, &c->V, err)) ||
        (st = cfg_int(c, root, "max_position_embeddings", true, 0, 1, &ctx, err)) ||
        (st = cfg_int(c, root, "num_key_value_heads", false, c->H, 1, &c->Hkv, err)) ||
        (st = cfg_int(c, root, "head_dim", false, c->E / c->H, 1, &c->D, err)))
        return st;
    if (c->H % c->Hkv)
        return hr_error_set(err, HR_ERR_FORMAT,
                            "%s: num_attention_heads %lld is not a multiple of "
                            "num_key_value_heads %lld",
                            c->cfg_path, (long long)c->H, (long long)c->Hkv);
    if (c->D % 2 || c->D > 4096)
        return hr_error_set(err, HR_ERR_FORMAT, "%s: head_dim %lld must be even and at most 4096", c->cfg_path,
                            (long long)c->D);
    if ((st = read_moe(c, root, err))) return st;
    json_t *tie = json_object_get(root, "tie_word_embeddings");
    if (json_is_boolean(tie)) c->tied = json_is_true(tie);
    const char *td = json_string_value(json_object_get(root, "torch_dtype"));
    if (!td) td = json_string_value(json_object_get(root, "dtype"));
    c->torch_dtype = !td                                              ? -1
                     : !strcmp(td, "bfloat16")                        ? HR_DTYPE_BF16
                     : !strcmp(td, "float16") || !strcmp(td, "half")  ? HR_DTYPE_F16
                     : !strcmp(td, "float32") || !strcmp(td, "float") ? HR_DTYPE_F32
                                                                      : -2;
    if (td) snprintf(c->torch_name, sizeof c->torch_name, "%s", td);
    if (c->torch_dtype == -2)
        return hr_error_set(err, HR_ERR_UNSUPPORTED,
                            "%s: torch_dtype '%.32s' is not supported (bfloat16, float16, "
                            "float32)",
                            c->cfg_path, td);

    const char *a = c->arch;
    char key[128];
#define KEY(s) (snprintf(key, sizeof key, "%s." s, a), key)
    hr_gguf_writer_set_str(w, "general.architecture", a);
    const char *nm = json_string_value(json_object_get(root, "_name_or_path"));
    if (nm && *nm) hr_gguf_writer_set_str(w, "general.name", nm);
    hr_gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)ctx);
    hr_gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)c->E);
    hr_gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)c->F);
    hr_gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)c->H);
    hr_gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)c->Hkv);
    hr_gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)c->L);
    hr_gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)c->D);
    hr_gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)c->D);
    if (c->NE > 0) {
        int64_t used = 0;
        cfg_int(c, root, "num_experts_per_tok", true, 0, 1, &used, err); /* checked in read_moe */
        hr_gguf_writer_set_u32(w, KEY("expert_count"), (uint32_t)c->NE);
        hr_gguf_writer_set_u32(w, KEY("expert_used_count"), (uint32_t)used);
        if (c->arch_id == HR_ARCH_QWEN3MOE)
            hr_gguf_writer_set_u32(w, KEY("expert_feed_forward_length"), (uint32_t)c->Fe);
    }
    double prf = 1.0, eps, theta;
    if ((st = cfg_num(c, root, "partial_rotary_factor", 1.0, &prf, NULL, err))) return st;
    int n_rot = (int)((double)c->D * prf);
    if (n_rot < 2 || n_rot > c->D || n_rot % 2)
        return hr_error_set(err, HR_ERR_FORMAT, "%s: partial_rotary_factor %g gives %d rotated dims of %lld",
                            c->cfg_path, prf, n_rot, (long long)c->D);
    hr_gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)n_rot);
    bool has_theta;
    if ((st = cfg_num(c, root, "rope_theta", 10000.0, &theta, &has_theta, err))) return st;
    if (!(theta > 1)) return hr_error_set(err, HR_ERR_FORMAT, "%s: rope_theta %g is not > 1", c->cfg_path, theta);
    hr_gguf_writer_set_f32(w, KEY("rope.freq_base"), (float)theta);
    if ((st = cfg_num(c, root, "rms_norm_eps", c->arch_id == HR_ARCH_PHI3 ? 1e-5 : 1e-6, &eps, NULL, err))) return st;
    hr_gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), (float)eps);

    /* sliding windows: mistral every layer; qwen2 only with use_sliding_window; gemma by pattern */
    int64_t sw = 0;
    bool sw_on = c->arch_id == HR_ARCH_MISTRAL || c->gemma ||
                 (c->arch_id == HR_ARCH_QWEN2 && json_is_true(json_object_get(root, "use_sliding_window")));
    if (sw_on && (st = cfg_int(c, root, "sliding_window", false, 0, 0, &sw, err))) return st;
    if (sw > 0) hr_gguf_writer_set_u32(w, KEY("attention.sliding_window"), (uint32_t)sw);
    if (c->gemma) {
        double cap;
        bool present;
        if (c->arch_id == HR_ARCH_GEMMA2) {
            if ((st = cfg_num(c, root, "attn_logit_softcapping", 0.0, &cap, &present, err))) return st;
            hr_gguf_writer_set_f32(w, KEY("attn_logit_softcapping"), (float)cap);
        }
        if ((st = cfg_num(c, root, "final_logit_softcapping", 0.0, &cap, &present, err))) return st;
        if (present || c->arch_id == HR_ARCH_GEMMA2)
            hr_gguf_writer_set_f32(w, KEY("final_logit_softcapping"), (float)cap);
        if (c->arch_id == HR_ARCH_GEMMA3) {
            int64_t pattern;
            double local;
            if ((st = cfg_int(c, root, "sliding_window_pattern", false, 6, 0, &pattern, err))) return st;
            hr_gguf_writer_set_u32(w, KEY("attention.sliding_window_pattern"), (uint32_t)pattern);
            if ((st = cfg_num(c, root, "rope_local_base_freq", 10000.0, &local, NULL, err))) return st;
            hr_gguf_writer_set_f32(w, KEY("rope.freq_base_swa"), (float)local);
        }
    }
    json_t *rs = json_object_get(root, "rope_scaling");
    if (rs && !json_is_null(rs)) {
        const char *type = json_string_value(json_object_get(rs, "rope_type"));
        if (!type) type = json_string_value(json_object_get(rs, "type"));
        if (!json_is_object(rs) || !type)
            return hr_error_set(err, HR_ERR_FORMAT, "%s: rope_scaling must be an object with a rope_type", c->cfg_path);
        double factor;
        if (!strcmp(type, "default")) {
        } else if (!strcmp(type, "linear")) {
            if ((st = cfg_num(c, rs, "factor", 1.0, &factor, NULL, err))) return st;
            hr_gguf_writer_set_str(w, KEY("rope.scaling.type"), "linear");
            hr_gguf_writer_set_f32(w, KEY("rope.scaling.factor"), (float)factor);
        } else if (!strcmp(type, "llama3") && (c->arch_id == HR_ARCH_LLAMA || c->arch_id == HR_ARCH_MISTRAL)) {
            if ((st = llama3_freqs(h, c, rs, theta, err))) return st;
        } else if ((!strcmp(type, "longrope") || !strcmp(type, "su")) && c->arch_id == HR_ARCH_PHI3) {
            hr_gguf_writer_set_str(w, KEY("rope.scaling.type"), "longrope");
            if ((st = longrope(h, c, root, rs, n_rot, w, (double)ctx, err))) return st;
        } else {
            return hr_error_set(err, HR_ERR_UNSUPPORTED,
                                "%s: rope_scaling type '%.32s' is not supported for %s (supported: default, linear%s)",
                                c->cfg_path, type, a,
                                c->arch_id == HR_ARCH_PHI3 ? ", longrope"
                                : c->permute_qk            ? ", llama3"
                                                           : "");
        }
    }
#undef KEY
    return HR_OK;
}

/* generation_config.json: the sampling defaults vLLM applies when a request does not set them, and the
 * end-of-generation ids (metadata headroom.generation.*; the tokenizer stops on the ids). */
static hr_status read_generation(const char *dir, hr_gguf_writer *w, hr_error *err) {
    char path[PATH_CAP];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    hr_status st;
    json_t *g = load_json(path, false, err, &st);
    if (!g) return st;
    static const char *const keys[] = {"temperature", "top_p", "top_k", "min_p", "repetition_penalty"};
    for (size_t i = 0; i < HR_ARRAY_LEN(keys); i++) {
        json_t *v = json_object_get(g, keys[i]);
        if (!v || json_is_null(v)) continue;
        if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < 0) {
            json_decref(g);
            return hr_error_set(err, HR_ERR_FORMAT, "%s: '%s' must be a non-negative number", path, keys[i]);
        }
        char key[96];
        snprintf(key, sizeof key, "headroom.generation.%s", keys[i]);
        hr_gguf_writer_set_f32(w, key, (float)json_number_value(v));
    }
    json_t *eos = json_object_get(g, "eos_token_id");
    int32_t ids[64];
    size_t n = 0;
    if (json_is_integer(eos)) {
        ids[n++] = (int32_t)json_integer_value(eos);
    } else if (json_is_array(eos)) {
        size_t i;
        json_t *x;
        json_array_foreach(eos, i, x) if (json_is_integer(x) && n < HR_ARRAY_LEN(ids) && json_integer_value(x) >= 0 &&
                                          json_integer_value(x) < (1 << 30)) ids[n++] = (int32_t)json_integer_value(x);
    }
    if (n) hr_gguf_writer_set_array(w, "headroom.generation.eos_token_ids", HR_GGUF_I32, ids, n);
    json_decref(g);
    return HR_OK;
}

/* ---- tensors ------------------------------------------------------------------------------------ */

/* HF's per-layer names and the GGUF names llama.cpp gives them. */
static const struct {
    const char *hf, *gguf;
} k_layer_names[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.qkv_proj.weight", "attn_qkv.weight"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"}, /* gemma: post_attention_norm (below) */
    {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
    {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    {"mlp.gate_up_proj.weight", "ffn_up.weight"}, /* phi3: gate rows, then up rows */
};

/* An expert's matrix: Qwen3-MoE's mlp.experts.X.{gate,up,down}_proj, Mixtral's
 * block_sparse_moe.experts.X.{w1,w3,w2}; the stack it goes into (GGUF name suffix), or NULL. */
static const char *expert_stack(const char *rest, int64_t n_expert, int *expert) {
    static const struct {
        const char *prefix, *kind, *stack;
    } kinds[] = {{"mlp.experts.", "gate_proj.weight", "ffn_gate_exps.weight"},
                 {"mlp.experts.", "up_proj.weight", "ffn_up_exps.weight"},
                 {"mlp.experts.", "down_proj.weight", "ffn_down_exps.weight"},
                 {"block_sparse_moe.experts.", "w1.weight", "ffn_gate_exps.weight"},
                 {"block_sparse_moe.experts.", "w3.weight", "ffn_up_exps.weight"},
                 {"block_sparse_moe.experts.", "w2.weight", "ffn_down_exps.weight"}};
    for (size_t i = 0; i < HR_ARRAY_LEN(kinds); i++) {
        size_t n = strlen(kinds[i].prefix);
        if (strncmp(rest, kinds[i].prefix, n)) continue;
        int x = -1, used = 0;
        if (sscanf(rest + n, "%d.%n", &x, &used) != 1 || used == 0 || x < 0 || x >= n_expert) return NULL;
        if (!strcmp(rest + n + used, kinds[i].kind)) return *expert = x, kinds[i].stack;
    }
    return NULL;
}

/* The GGUF name of an HF tensor (false: unknown), whether it is to be ignored, and for an expert's
 * matrix its expert (*expert >= 0; out then names the stack). */
static bool map_name(const hf_cfg *c, const char *hf, char *out, size_t cap, bool *ignore, int *expert) {
    *ignore = false;
    *expert = -1;
    /* a multimodal checkpoint: the language model's tensors, the vision tower's left out (as the
     * converter does for the text model) */
    if (!strncmp(hf, "vision_tower.", 13) || !strncmp(hf, "multi_modal_projector.", 22) ||
        !strncmp(hf, "model.vision_tower.", 19) || !strncmp(hf, "model.multi_modal_projector.", 28))
        return *ignore = true, true;
    char buf[256];
    if (!strncmp(hf, "language_model.", 15)) hf += 15;
    if (!strncmp(hf, "model.language_model.", 21) && strlen(hf) < sizeof buf - 8) /* newer transformers */
        hf = (snprintf(buf, sizeof buf, "model.%s", hf + 21), buf);
    if (!strcmp(hf, "model.embed_tokens.weight")) return snprintf(out, cap, "token_embd.weight"), true;
    if (!strcmp(hf, "model.norm.weight")) return snprintf(out, cap, "output_norm.weight"), true;
    if (!strcmp(hf, "lm_head.weight")) {
        *ignore = c->tied; /* a tied checkpoint may still carry the copy */
        return snprintf(out, cap, "output.weight"), true;
    }
    int il = -1, used = 0;
    if (sscanf(hf, "model.layers.%d.%n", &il, &used) != 1 || used == 0 || il < 0 || il >= c->L) return false;
    const char *rest = hf + used;
    if (!strcmp(rest, "self_attn.rotary_emb.inv_freq")) return *ignore = true, true; /* recomputed */
    if (c->NE > 0) {
        const char *stack = expert_stack(rest, c->NE, expert);
        if (stack) return snprintf(out, cap, "blk.%d.%s", il, stack), true;
        if (!strcmp(rest, c->mixtral ? "block_sparse_moe.gate.weight" : "mlp.gate.weight"))
            return snprintf(out, cap, "blk.%d.ffn_gate_inp.weight", il), true;
        if (strstr(rest, "mlp.")) return false; /* no dense FFN in a MoE layer */
    }
    for (size_t i = 0; i < HR_ARRAY_LEN(k_layer_names); i++)
        if (!strcmp(rest, k_layer_names[i].hf)) {
            const char *g = k_layer_names[i].gguf;
            if (c->gemma && !strcmp(rest, "post_attention_layernorm.weight")) g = "post_attention_norm.weight";
            snprintf(out, cap, "blk.%d.%s", il, g);
            return true;
        }
    return false;
}

/* The HF shape ([rows, cols], or [n] with *rows 0) config.json implies for a GGUF name. */
static bool expect_shape(const hf_cfg *c, const char *g, int64_t *rows, int64_t *cols) {
    const char *s = g;
    if (!strncmp(g, "blk.", 4)) s = strchr(g + 4, '.') + 1;
    int64_t E = c->E, F = c->F, qd = c->H * c->D, kvd = c->Hkv * c->D;
    *rows = 0;
    if (!strcmp(s, "token_embd.weight") || !strcmp(s, "output.weight")) return *rows = c->V, *cols = E, true;
    if (!strcmp(s, "attn_q.weight")) return *rows = qd, *cols = E, true;
    if (!strcmp(s, "attn_k.weight") || !strcmp(s, "attn_v.weight")) return *rows = kvd, *cols = E, true;
    if (!strcmp(s, "attn_qkv.weight")) return *rows = qd + 2 * kvd, *cols = E, true;
    if (!strcmp(s, "attn_output.weight")) return *rows = E, *cols = qd, true;
    if (!strcmp(s, "ffn_gate.weight")) return *rows = F, *cols = E, true;
    if (!strcmp(s, "ffn_up.weight")) return *rows = c->arch_id == HR_ARCH_PHI3 ? 2 * F : F, *cols = E, true;
    if (!strcmp(s, "ffn_down.weight")) return *rows = E, *cols = F, true;
    /* an expert's matrix (one slice of its stack) and the router */
    if (!strcmp(s, "ffn_gate_exps.weight") || !strcmp(s, "ffn_up_exps.weight")) return *rows = c->Fe, *cols = E, true;
    if (!strcmp(s, "ffn_down_exps.weight")) return *rows = E, *cols = c->Fe, true;
    if (!strcmp(s, "ffn_gate_inp.weight")) return *rows = c->NE, *cols = E, true;
    if (!strcmp(s, "attn_q.bias")) return *cols = qd, true;
    if (!strcmp(s, "attn_k.bias") || !strcmp(s, "attn_v.bias")) return *cols = kvd, true;
    if (!strcmp(s, "attn_q_norm.weight") || !strcmp(s, "attn_k_norm.weight")) return *cols = c->D, true;
    return *cols = E, true; /* the other norms */
}

static float to_f32(int dtype, const void *p, int64_t i) {
    if (dtype == HR_DTYPE_F32) return ((const float *)p)[i];
    const uint16_t v = ((const uint16_t *)p)[i];
    return dtype == HR_DTYPE_F16 ? hr_f16_to_f32(v) : hr_bf16_to_f32(v);
}

/* convert_hf_to_gguf.py's permute for llama-family Q/K: within each of n_head heads of hd rows, GGUF row
 * 2i + j is HF row j * hd/2 + i (HF rotates halves, the GGUF forward rotates adjacent pairs). */
static int64_t permuted_src(int64_t r, int64_t n_head, int64_t rows) {
    int64_t hd = rows / n_head, h = r / hd, k = r % hd;
    return h * hd + (k % 2) * (hd / 2) + k / 2;
}

static hr_status permute_in_place(hr_safetensors *sh, const hr_st_tensor *t, int64_t n_head, hr_error *err) {
    int64_t rows = t->shape[0];
    size_t rb = (size_t)(t->size_bytes / (uint64_t)rows), hd = (size_t)(rows / n_head);
    uint8_t *tmp = malloc(rb * hd);
    if (!tmp) return hr_error_set(err, HR_ERR_NOMEM, "out of memory permuting '%s'", t->name);
    if (!hr_safetensors_edit_begin(sh, t->data, t->size_bytes)) {
        free(tmp);
        return hr_error_set(err, HR_ERR_IO, "%s: cannot make '%s' writable to permute it", hr_safetensors_name(sh),
                            t->name);
    }
    uint8_t *d = (uint8_t *)(uintptr_t)t->data;
    for (int64_t h = 0; h < n_head; h++) {
        uint8_t *head = d + (size_t)h * hd * rb;
        memcpy(tmp, head, hd * rb);
        for (size_t k = 0; k < hd; k++) memcpy(head + k * rb, tmp + ((k % 2) * (hd / 2) + k / 2) * rb, rb);
    }
    hr_safetensors_edit_end(sh);
    free(tmp);
    return HR_OK;
}

/* Quantizes an HF matrix [rows, cols] into `into`, or (NULL) an owned buffer, permuting rows where asked
 * (n_head > 0). */
static hr_status quantize(hr_hf *h, const hr_st_tensor *t, int qtype, int64_t n_head, uint8_t *into, void **out,
                          uint64_t *bytes, hr_error *err) {
    int64_t rows = t->shape[0], cols = t->shape[1];
    size_t rb = hr_dtype_row_bytes((hr_dtype)qtype, cols);
    uint8_t *dst = into ? into : own(h, rb * (size_t)rows);
    float *row = malloc(sizeof(float) * (size_t)cols);
    if (!dst || !row) {
        free(row);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory quantizing '%s'", t->name);
    }
    for (int64_t r = 0; r < rows; r++) {
        int64_t src = n_head > 0 ? permuted_src(r, n_head, rows) : r;
        for (int64_t i = 0; i < cols; i++) row[i] = to_f32(t->dtype_id, t->data, src * cols + i);
        hr_quantize_row_ref((hr_dtype)qtype, row, dst + (size_t)r * rb, cols);
    }
    free(row);
    *out = dst;
    *bytes = rb * (uint64_t)rows;
    return HR_OK;
}

/* Copies expert x's matrix t (HF [rows, cols]) into slice x of the stack g ([cols, rows, n_expert]),
 * quantized to q (>= 0) or as stored, creating the stack at its first expert. One allocation per stack
 * rather than a per-expert pointer table in the binding: the forward and the repacking see one
 * contiguous 3-D tensor as from a GGUF, at the cost of a copy (counted in hr_hf_bytes). */
static hr_status stack_expert(hr_hf *h, const hf_cfg *c, const char *g, const hr_st_tensor *t, int q, int x,
                              const char *file, hr_error *err) {
    const int64_t rows = t->shape[0], cols = t->shape[1];
    const uint32_t type = q >= 0 ? (uint32_t)q : (uint32_t)t->dtype_id;
    const size_t slice = hr_dtype_row_bytes((hr_dtype)type, cols) * (size_t)rows;
    struct hf_stack *sk = NULL;
    for (size_t i = 0; i < h->n_stacks && !sk; i++)
        if (!strcmp(h->tensors[h->stacks[i].tensor].name.ptr, g)) sk = &h->stacks[i];
    if (!sk) {
        if (!grow((void **)&h->stacks, &h->cap_stacks, h->n_stacks, sizeof *h->stacks))
            return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
        uint8_t *data = own(h, slice * (size_t)c->NE);
        uint8_t *seen = calloc((size_t)c->NE, 1);
        hr_status st = data && seen ? add_tensor(h, g, type, 3, cols, rows, data, slice * (uint64_t)c->NE, err)
                                    : hr_error_set(err, HR_ERR_NOMEM, "out of memory stacking the experts of '%s'", g);
        if (st) {
            free(seen);
            return st;
        }
        h->tensors[h->n_tensors - 1].ne[2] = c->NE;
        sk = &h->stacks[h->n_stacks++];
        *sk = (struct hf_stack){.tensor = h->n_tensors - 1, .seen = seen};
    }
    hr_gguf_tensor *st_t = &h->tensors[sk->tensor];
    if (st_t->type != type)
        return hr_error_set(err, HR_ERR_FORMAT, "%s: tensor '%s' has dtype %s, unlike the other experts of its layer",
                            file, t->name, t->dtype);
    if (sk->seen[x]) return hr_error_set(err, HR_ERR_FORMAT, "tensor '%s' appears twice in the checkpoint", t->name);
    sk->seen[x] = 1;
    sk->filled++;
    uint8_t *dst = (uint8_t *)(uintptr_t)st_t->data + (size_t)x * slice;
    if (q >= 0) {
        void *unused;
        uint64_t bytes;
        return quantize(h, t, q, 0, dst, &unused, &bytes, err);
    }
    memcpy(dst, t->data, slice);
    return HR_OK;
}

static hr_status bind_one(hr_hf *h, const hf_cfg *c, hr_safetensors *sh, const hr_st_tensor *t, hr_error *err) {
    char g[128];
    bool ignore;
    int expert;
    const char *file = hr_safetensors_name(sh);
    if (!map_name(c, t->name, g, sizeof g, &ignore, &expert))
        return hr_error_set(err, HR_ERR_UNSUPPORTED, "%s: tensor '%.96s' is not one the %s architecture has", file,
                            t->name, c->arch);
    if (ignore) return HR_OK;
    int64_t rows, cols;
    expect_shape(c, g, &rows, &cols);
    bool matrix = rows > 0;
    if (t->dtype_id < 0)
        return hr_error_set(err, HR_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s (supported: BF16, F16, F32)", file,
                            t->name, t->dtype);
    if (matrix && c->torch_dtype >= 0 && t->dtype_id != c->torch_dtype)
        return hr_error_set(err, HR_ERR_FORMAT, "%s: tensor '%s' has dtype %s but config.json says torch_dtype %s",
                            file, t->name, t->dtype, c->torch_name);
    bool shape_ok =
        matrix ? t->n_dims == 2 && t->shape[0] == rows && t->shape[1] == cols : t->n_dims == 1 && t->shape[0] == cols;
    if (!shape_ok) {
        char got[96] = "[", want[64];
        for (int d = 0; d < t->n_dims && strlen(got) < 64; d++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        strcat(got, "]");
        if (matrix)
            snprintf(want, sizeof want, "[%lld, %lld]", (long long)rows, (long long)cols);
        else
            snprintf(want, sizeof want, "[%lld]", (long long)cols);
        return hr_error_set(err, HR_ERR_FORMAT, "%s: tensor '%s' has shape %s but config.json implies %s", file,
                            t->name, got, want);
    }
    const char *s = !strncmp(g, "blk.", 4) ? strchr(g + 4, '.') + 1 : g;
    int64_t n_head = 0; /* > 0: rows to permute as convert_hf_to_gguf.py does */
    if (c->permute_qk && !strcmp(s, "attn_q.weight")) n_head = c->H;
    if (c->permute_qk && !strcmp(s, "attn_k.weight")) n_head = c->Hkv;
    if (!matrix) {
        if (c->gemma && strstr(s, "norm.weight")) { /* the converter stores gemma's norms as 1 + w */
            float *v = own(h, sizeof(float) * (size_t)cols);
            if (!v) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
            for (int64_t i = 0; i < cols; i++) v[i] = 1.0f + to_f32(t->dtype_id, t->data, i);
            return add_tensor(h, g, HR_DTYPE_F32, 1, cols, 1, v, sizeof(float) * (size_t)cols, err);
        }
        return add_tensor(h, g, (uint32_t)t->dtype_id, 1, cols, 1, t->data, t->size_bytes, err);
    }
    int q = c->quant;
    if (!strcmp(s, "ffn_gate_inp.weight")) { /* the router in f32, as convert_hf_to_gguf.py writes it */
        if (t->dtype_id == HR_DTYPE_F32)
            return add_tensor(h, g, HR_DTYPE_F32, 2, cols, rows, t->data, t->size_bytes, err);
        float *v = own(h, sizeof(float) * (size_t)(rows * cols));
        if (!v) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
        for (int64_t i = 0; i < rows * cols; i++) v[i] = to_f32(t->dtype_id, t->data, i);
        return add_tensor(h, g, HR_DTYPE_F32, 2, cols, rows, v, sizeof(float) * (uint64_t)(rows * cols), err);
    }
    /* a row the block does not divide stays as stored for q8_0/q4_0; q4_K falls back to q8_0 (synth.h) */
    if (q == HR_DTYPE_Q4_K && cols % 256) q = HR_DTYPE_Q8_0;
    if (q >= 0 && cols % hr_dtype_get_info((hr_dtype)q)->block_elems) q = -1;
    if (expert >= 0) return stack_expert(h, c, g, t, q, expert, file, err);
    if (q >= 0) {
        void *data = NULL;
        uint64_t bytes = 0;
        hr_status st = quantize(h, t, q, n_head, NULL, &data, &bytes, err);
        if (st) return st;
        return add_tensor(h, g, (uint32_t)q, 2, cols, rows, data, bytes, err);
    }
    if (n_head > 0) {
        if (rows % n_head || (rows / n_head) % 2)
            return hr_error_set(err, HR_ERR_FORMAT,
                                "%s: tensor '%s': %lld rows do not split into %lld heads of even "
                                "size",
                                file, t->name, (long long)rows, (long long)n_head);
        hr_status st = permute_in_place(sh, t, n_head, err);
        if (st) return st;
    }
    return add_tensor(h, g, (uint32_t)t->dtype_id, 2, cols, rows, t->data, t->size_bytes, err);
}

/* model.safetensors, or the shards model.safetensors.index.json names (each opened once; every tensor
 * the index lists must be in the shard it names). */
static hr_status open_shards(hr_hf *h, const char *dir, hr_error *err) {
    char path[PATH_CAP], idx_path[PATH_CAP];
    snprintf(idx_path, sizeof idx_path, "%s/model.safetensors.index.json", dir);
    hr_status st;
    json_t *idx = load_json(idx_path, false, err, &st);
    if (st) return st;
    if (!idx) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        struct stat sb;
        if (stat(path, &sb) != 0)
            return hr_error_set(err, HR_ERR_NOT_FOUND,
                                "%s: neither model.safetensors nor model.safetensors.index.json is there", dir);
        if (!(h->shards = calloc(1, sizeof *h->shards))) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
        if ((st = hr_safetensors_open(path, &h->shards[0], err))) return st;
        h->n_shards = 1;
        return HR_OK;
    }
    json_t *map = json_object_get(idx, "weight_map");
    if (!json_is_object(map) || !json_object_size(map)) {
        json_decref(idx);
        return hr_error_set(err, HR_ERR_FORMAT, "%s: \"weight_map\" must be a non-empty object", idx_path);
    }
    h->shards = calloc(json_object_size(map), sizeof *h->shards);
    char **names = calloc(json_object_size(map), sizeof *names);
    if (!h->shards || !names) {
        free(names);
        json_decref(idx);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    }
    const char *tname;
    json_t *v;
    json_object_foreach(map, tname, v) {
        const char *file = json_string_value(v);
        if (!file || !*file || strchr(file, '/')) {
            st = hr_error_set(err, HR_ERR_FORMAT, "%s: tensor '%.96s' maps to no plain file name", idx_path, tname);
            break;
        }
        size_t k = 0;
        while (k < h->n_shards && strcmp(names[k], file)) k++;
        if (k == h->n_shards) {
            snprintf(path, sizeof path, "%s/%s", dir, file);
            if (!(names[k] = strdup(file))) {
                st = hr_error_set(err, HR_ERR_NOMEM, "out of memory");
                break;
            }
            h->n_shards++;
            struct stat sb;
            if (stat(path, &sb) != 0) {
                st = hr_error_set(err, HR_ERR_NOT_FOUND,
                                  "%s: missing shard (model.safetensors.index.json lists tensor '%.96s' in it)", path,
                                  tname);
                break;
            }
            if ((st = hr_safetensors_open(path, &h->shards[k], err))) break;
        }
        if (!hr_safetensors_find(h->shards[k], tname)) {
            st = hr_error_set(err, HR_ERR_FORMAT,
                              "%s/%s: lacks tensor '%.96s' (model.safetensors.index.json puts it there)", dir, file,
                              tname);
            break;
        }
    }
    for (size_t k = 0; k < h->n_shards; k++) free(names[k]);
    free(names);
    json_decref(idx);
    return st;
}

/* A multimodal wrapper's language model (its text_config, with the wrapper's torch_dtype), else root;
 * takes root's reference. NULL: out of memory. */
static json_t *text_model(json_t *root) {
    json_t *text = json_object_get(root, "text_config");
    if (!json_is_object(text) || !json_object_get(text, "hidden_size")) return root;
    json_t *inner = json_deep_copy(text);
    if (inner && !json_object_get(inner, "torch_dtype") && json_object_get(root, "torch_dtype"))
        json_object_set(inner, "torch_dtype", json_object_get(root, "torch_dtype"));
    json_decref(root);
    return inner;
}

hr_status hr_model_config_hparams(const char *json_text, size_t len, hr_hparams *out, hr_error *err) {
    hf_cfg c = {.dir = ".", .quant = -1};
    snprintf(c.cfg_path, sizeof c.cfg_path, "config.json");
    json_error_t je;
    json_t *root = json_loadb(json_text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return hr_error_set(err, HR_ERR_FORMAT, "config.json: not JSON: %s (line %d)", je.text, je.line);
    if (!json_is_object(root)) {
        json_decref(root);
        return hr_error_set(err, HR_ERR_FORMAT, "config.json: not a JSON object");
    }
    hr_hf *h = calloc(1, sizeof *h); /* holds the RoPE factor tensors read_config makes */
    hr_gguf_writer *w = hr_gguf_writer_create(3);
    hr_gguf *g = NULL;
    hr_status st = HR_OK;
    if (!(root = text_model(root)) || !h || !w)
        st = hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    else if ((st = read_config(h, &c, root, w, err)) == HR_OK &&
             (st = hr_gguf_writer_write_memory(w, &h->meta_image, &h->meta_size, err)) == HR_OK &&
             (st = hr_gguf_open_memory(h->meta_image, h->meta_size, &g, err)) == HR_OK &&
             (st = hr_model_hparams_of_meta(g, out, err)) == HR_OK) {
        /* what load.c learns from the tensors, from what this architecture's checkpoints store */
        out->n_vocab = (int)c.V;
        out->tied_output = c.tied;
        out->has_rope_freqs = hr_hf_find_tensor(h, "rope_freqs.weight") != NULL;
        out->has_longrope = hr_hf_find_tensor(h, "rope_factors_long.weight") != NULL;
        out->fused_qkv = c.arch_id == HR_ARCH_PHI3;
        out->has_qkv_bias = c.arch_id == HR_ARCH_QWEN2;
    }
    hr_gguf_close(g);
    hr_gguf_writer_destroy(w);
    json_decref(root);
    hr_hf_destroy(h);
    return st;
}

hr_status hr_hf_open(const char *dir, const char *quantize_name, hr_hf **hf, hr_gguf **meta, hr_error *err) {
    hf_cfg c = {.dir = dir, .quant = -1};
    if (quantize_name && (c.quant = hr_hf_quantize_type(quantize_name)) < 0)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "--quantize '%s' is not one of q8_0, q4_0, q4_K", quantize_name);
    snprintf(c.cfg_path, sizeof c.cfg_path, "%s/config.json", dir);
    hr_hf *h = calloc(1, sizeof *h);
    hr_gguf_writer *w = hr_gguf_writer_create(3);
    hr_status st = HR_OK;
    json_t *root = NULL;
    if (!h || !w) {
        st = hr_error_set(err, HR_ERR_NOMEM, "out of memory");
        goto fail;
    }
    struct stat sb;
    if (stat(c.cfg_path, &sb) != 0) {
        st = hr_error_set(err, HR_ERR_NOT_FOUND,
                          "'%s' is a directory without config.json: not a Hugging Face checkpoint (-m takes a GGUF "
                          "file or a checkpoint directory)",
                          dir);
        goto fail;
    }
    if (!(root = load_json(c.cfg_path, true, err, &st))) goto fail;
    if (!(root = text_model(root))) {
        st = hr_error_set(err, HR_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = read_config(h, &c, root, w, err))) goto fail;
    if ((st = read_generation(dir, w, err))) goto fail;
    if ((st = hr_tokenizer_json_to_gguf(dir, w, err))) goto fail;
    if ((st = open_shards(h, dir, err))) goto fail;
    for (size_t k = 0; k < h->n_shards; k++) {
        hr_safetensors *sh = h->shards[k];
        for (size_t i = 0; i < hr_safetensors_n_tensors(sh); i++)
            if ((st = bind_one(h, &c, sh, hr_safetensors_tensor_at(sh, i), err))) goto fail;
    }
    for (size_t i = 0; i < h->n_stacks; i++)
        if (h->stacks[i].filled != c.NE) {
            const char *g = h->tensors[h->stacks[i].tensor].name.ptr;
            int x = 0;
            while (x < c.NE && h->stacks[i].seen[x]) x++;
            st = hr_error_set(err, HR_ERR_FORMAT, "%s: lacks expert %d of '%s' (%d of %lld experts present)", dir, x, g,
                              h->stacks[i].filled, (long long)c.NE);
            goto fail;
        }
    /* quantized, the model no longer reads the stored matrices: their pages need not stay resident */
    for (size_t k = 0; c.quant >= 0 && k < h->n_shards; k++) hr_safetensors_release_pages(h->shards[k]);
    if ((st = hr_gguf_writer_write_memory(w, &h->meta_image, &h->meta_size, err))) goto fail;
    if ((st = hr_gguf_open_memory(h->meta_image, h->meta_size, meta, err))) goto fail;
    hr_gguf_writer_destroy(w);
    json_decref(root);
    *hf = h;
    return HR_OK;
fail:
    hr_gguf_writer_destroy(w);
    json_decref(root);
    hr_hf_destroy(h);
    return st;
}

/* test_model_hf.c: Hugging Face checkpoint directories (issue 27, point 4).
 *
 * A synthetic llama-shaped model (GQA, Llama-3 rope scaling, untied output) is built as GGUF by the
 * project's synth; the test writes the same weights as a checkpoint directory the way a Hugging Face
 * model holds them (config.json, safetensors in HF names, Q and K rows in HF's rotate-half order:
 * the inverse of convert_hf_to_gguf.py's permute, written here from its definition), plus a byte-level
 * BPE tokenizer.json, tokenizer_config.json and generation_config.json. Then:
 *   - f32 and f16: the directory and the GGUF give the same logits bit for bit over a prefill and
 *     greedy decode steps, hence the same greedy ids;
 *   - two shards with model.safetensors.index.json: the same;
 *   - --quantize q8_0 on the f32 directory: the same ids (and logits) as the q8_0 GGUF synth makes
 *     from the same f32 values;
 *   - the runtime opens the directory: tokenizer.json's vocabulary, tokenizer_config.json's template
 *     through the interpreter, generation_config.json's eos ids as end-of-generation tokens;
 *   - bad input, each one line naming the file (and the tensor or key). */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "harness.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/synth.h"
#include "plan/plan.h"
#include "rt_greedy.h"
#include "runtime/runtime.h"
#include "runtime/runtime_parts.h"
#include "tensor/tensor.h"
#include "tokenizer/tokenizer.h"

/* ---- the synthetic model ------------------------------------------------------------------------ */

static hr_synth_shape shape(void) {
    hr_synth_shape s;
    hr_error err;
    if (hr_synth_shape_by_name("tiny", &s, &err)) exit(1);
    s.llama3_rope = true; /* rope_freqs from config.json's rope_scaling */
    s.n_head = 4, s.n_head_kv = 2;
    return s;
}

/* The synth GGUF of shape s (type) opened from memory (*mem to free after the gguf is closed). */
static hr_gguf *synth_gguf_of(const hr_synth_shape *sp, hr_dtype type, void **mem) {
    hr_synth_shape s = *sp;
    hr_gguf_writer *w = NULL;
    size_t size = 0;
    hr_gguf *g = NULL;
    hr_error err = {0};
    if (hr_synth_build(&s, type, 7, &w, &err) || hr_gguf_writer_write_memory(w, mem, &size, &err) ||
        hr_gguf_open_memory_mut(*mem, size, &g, &err)) {
        fprintf(stderr, "synth: %s\n", err.msg);
        exit(1);
    }
    hr_gguf_writer_destroy(w);
    return g;
}

static hr_gguf *synth_gguf(hr_dtype type, void **mem) {
    hr_synth_shape s = shape();
    return synth_gguf_of(&s, type, mem);
}

/* ---- writing a checkpoint ----------------------------------------------------------------------- */

typedef struct st_entry {
    char name[96];
    const char *dtype;
    int64_t rows, cols; /* rows 0: a vector of cols */
    void *data;         /* owned */
    size_t bytes;
} st_entry;

typedef enum corrupt {
    OK = 0,
    BAD_DTYPE,      /* one matrix stored F16 while config.json says float32 */
    BAD_SHAPE,      /* layer 1's k_proj holds q_proj's [64, 64] where [32, 64] belongs */
    TWO_SHARDS,     /* model-0000{1,2}-of-00002.safetensors with the index */
    MISSING_EXPERT, /* a MoE checkpoint without layer 1's gate_proj of expert 3 */
    MULTIMODAL,     /* gemma3 as Gemma3ForConditionalGeneration: text_config, model.language_model.*, a vision tower */
} corrupt;

static void write_text(const char *dir, const char *file, const char *text) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "w");
    if (!f) exit(1);
    fputs(text, f);
    fclose(f);
}

/* A safetensors file of entries [from, to): header padded with spaces to 8 bytes, as the library does. */
static void write_st(const char *path, st_entry *e, int from, int to) {
    json_t *h = json_object();
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    size_t off = 0;
    for (int i = from; i < to; i++) {
        json_t *shp = e[i].rows ? json_pack("[I,I]", (json_int_t)e[i].rows, (json_int_t)e[i].cols)
                                : json_pack("[I]", (json_int_t)e[i].cols);
        json_object_set_new(h, e[i].name,
                            json_pack("{s:s,s:o,s:[I,I]}", "dtype", e[i].dtype, "shape", shp, "data_offsets",
                                      (json_int_t)off, (json_int_t)(off + e[i].bytes)));
        off += e[i].bytes;
    }
    char *text = json_dumps(h, JSON_COMPACT);
    size_t n = strlen(text), padded = (n + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    uint8_t len[8];
    for (int b = 0; b < 8; b++) len[b] = (uint8_t)(padded >> (8 * b));
    fwrite(len, 1, 8, f);
    fwrite(text, 1, n, f);
    for (size_t i = n; i < padded; i++) fputc(' ', f);
    for (int i = from; i < to; i++) fwrite(e[i].data, 1, e[i].bytes, f);
    fclose(f);
    free(text);
    json_decref(h);
}

/* Rows of a GGUF matrix in HF order: HF row h*hd + j*hd/2 + i is GGUF row h*hd + 2i + j (the converter's
 * permute reshapes to (heads, 2, hd/2, cols) and swaps the middle axes; this is its inverse). */
static void *unpermute(const uint8_t *src, int64_t rows, size_t row_bytes, int n_head) {
    uint8_t *dst = malloc((size_t)rows * row_bytes);
    int64_t hd = rows / n_head;
    for (int64_t r = 0; r < rows; r++) {
        int64_t h = r / hd, k = r % hd, j = k / (hd / 2), i = k % (hd / 2);
        memcpy(dst + (size_t)r * row_bytes, src + (size_t)(h * hd + 2 * i + j) * row_bytes, row_bytes);
    }
    return dst;
}

static void add_entry(st_entry *e, int *n, const hr_gguf *g, const char *gguf_name, const char *hf_name,
                      int permute_heads);

/* A gemma norm: HF holds w where the GGUF holds 1 + w (f32; g - 1 is exact for g in [0.5, 2]). */
static void add_gemma_norm(st_entry *e, int *n, const hr_gguf *g, const char *gguf_name, const char *hf_name) {
    add_entry(e, n, g, gguf_name, hf_name, 0);
    float *v = e[*n - 1].data;
    for (size_t i = 0; i < e[*n - 1].bytes / 4; i++) v[i] -= 1.0f;
}

static void add_entry(st_entry *e, int *n, const hr_gguf *g, const char *gguf_name, const char *hf_name,
                      int permute_heads) {
    const hr_gguf_tensor *t = hr_gguf_find_tensor(g, gguf_name);
    if (!t) {
        fprintf(stderr, "no %s\n", gguf_name);
        exit(1);
    }
    st_entry *x = &e[(*n)++];
    snprintf(x->name, sizeof x->name, "%s", hf_name);
    x->dtype = t->type == HR_DTYPE_F32 ? "F32" : t->type == HR_DTYPE_F16 ? "F16" : "BF16";
    x->rows = t->n_dims == 2 ? t->ne[1] : 0;
    x->cols = t->ne[0];
    x->bytes = t->size_bytes;
    if (permute_heads)
        x->data = unpermute(t->data, t->ne[1], t->size_bytes / (size_t)t->ne[1], permute_heads);
    else {
        x->data = malloc(t->size_bytes);
        memcpy(x->data, t->data, t->size_bytes);
    }
}

static const char k_tok_cfg[] =
    "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_bos_token\": true, \"add_eos_token\": false,"
    " \"chat_template\": \"{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}\"}";

/* A byte-level BPE tokenizer.json: the 256 byte characters (ids 0..255), "ab" (258), "<s>" (256) and
 * "</s>" (257) as special added tokens. */
static void write_tokenizer(const char *dir) {
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        char ch[4];
        hr_test_gpt2_byte_char(b, ch);
        json_object_set_new(vocab, ch, json_integer(b));
    }
    json_object_set_new(vocab, "<s>", json_integer(256));
    json_object_set_new(vocab, "</s>", json_integer(257));
    json_object_set_new(vocab, "ab", json_integer(258));
    json_t *tok = json_pack("{s:n,s:{s:s,s:b,s:b,s:b},s:{s:s},s:[{s:i,s:s,s:b},{s:i,s:s,s:b}],s:{s:s,s:o,s:[[s,s]]}}",
                            "normalizer", "pre_tokenizer", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets",
                            1, "use_regex", 1, "decoder", "type", "ByteLevel", "added_tokens", "id", 256, "content",
                            "<s>", "special", 1, "id", 257, "content", "</s>", "special", 1, "model", "type", "BPE",
                            "vocab", vocab, "merges", "a", "b");
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    json_dump_file(tok, path, 0);
    json_decref(tok);
    write_text(dir, "tokenizer_config.json", k_tok_cfg);
    write_text(dir, "generation_config.json",
               "{\"bos_token_id\": 256, \"eos_token_id\": [257, 5], \"temperature\": 0.6, \"top_p\": 0.9}");
}

/* config.json for shape s as its Hugging Face model would have it. */
static void write_config(const char *dir, const hr_synth_shape *s, const hr_gguf *g, const char *torch_dtype) {
    char cfg[4096];
    int hd = s->head_dim > 0 ? s->head_dim : s->n_embd / s->n_head;
    const char *mt = !strcmp(s->arch, "gemma3")     ? "gemma3_text"
                     : !strcmp(s->arch, "qwen3moe") ? "qwen3_moe"
                     : s->n_expert > 0              ? "mixtral"
                                                    : s->arch;
    char extra[2048] = "";
    if (s->llama3_rope)
        snprintf(extra, sizeof extra,
                 ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 32.0, \"low_freq_factor\": 1.0,"
                 " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}");
    else if (!strcmp(s->arch, "gemma2"))
        snprintf(extra, sizeof extra,
                 ", \"sliding_window\": %d, \"attn_logit_softcapping\": %.1f, \"final_logit_softcapping\": %.1f",
                 s->sliding_window, (double)s->attn_softcap, (double)s->final_softcap);
    else if (!strcmp(s->arch, "gemma3"))
        snprintf(extra, sizeof extra,
                 ", \"sliding_window\": %d, \"sliding_window_pattern\": 6, \"rope_local_base_freq\": 10000.0,"
                 " \"final_logit_softcapping\": null, \"rope_scaling\": null",
                 s->sliding_window);
    else if (!strcmp(s->arch, "phi3") && s->n_ctx_orig > 0) { /* LongRoPE lists from the GGUF's factors */
        size_t o = (size_t)snprintf(extra, sizeof extra,
                                    ", \"original_max_position_embeddings\": %d, \"rope_scaling\": {\"type\": "
                                    "\"longrope\"",
                                    s->n_ctx_orig);
        static const char *const lists[2][2] = {{"short_factor", "rope_factors_short.weight"},
                                                {"long_factor", "rope_factors_long.weight"}};
        for (int k = 0; k < 2; k++) {
            const hr_gguf_tensor *t = hr_gguf_find_tensor(g, lists[k][1]);
            o += (size_t)snprintf(extra + o, sizeof extra - o, ", \"%s\": [", lists[k][0]);
            for (int64_t i = 0; t && i < t->ne[0]; i++)
                o += (size_t)snprintf(extra + o, sizeof extra - o, "%s%.9g", i ? ", " : "",
                                      (double)((const float *)t->data)[i]);
            o += (size_t)snprintf(extra + o, sizeof extra - o, "]");
        }
        snprintf(extra + o, sizeof extra - o, "}");
    } else if (!strcmp(s->arch, "qwen2"))
        snprintf(extra, sizeof extra, ", \"use_sliding_window\": false, \"sliding_window\": 4096");
    else if (!strcmp(s->arch, "qwen3moe"))
        snprintf(extra, sizeof extra,
                 ", \"num_experts\": %d, \"num_experts_per_tok\": %d, \"moe_intermediate_size\": %d,"
                 " \"norm_topk_prob\": true, \"decoder_sparse_step\": 1, \"mlp_only_layers\": []",
                 s->n_expert, s->n_expert_used, s->n_ff_exp);
    else if (s->n_expert > 0)
        snprintf(extra, sizeof extra,
                 ", \"num_local_experts\": %d, \"num_experts_per_tok\": %d, \"sliding_window\": null", s->n_expert,
                 s->n_expert_used);
    bool synth_llama_path =
        s->n_expert == 0 && (!strcmp(s->arch, "llama") || !strcmp(s->arch, "mistral") || !strcmp(s->arch, "qwen2"));
    snprintf(cfg, sizeof cfg,
             "{\"model_type\": \"%s\", \"hidden_size\": %d, \"intermediate_size\": %d,"
             " \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d,"
             " \"num_hidden_layers\": %d, \"vocab_size\": %d, \"max_position_embeddings\": %d,"
             " \"rms_norm_eps\": %s, \"rope_theta\": %.1f, \"tie_word_embeddings\": %s,"
             " \"torch_dtype\": \"%s\"%s}",
             mt, s->n_embd, s->n_ff, s->n_head, s->n_head_kv, hd, s->n_layer, s->n_vocab, s->n_ctx,
             synth_llama_path ? "1e-05" : "1e-06", (double)s->rope_base, s->tied_output ? "true" : "false", torch_dtype,
             extra);
    write_text(dir, "config.json", cfg);
}

/* The checkpoint of g's weights (shape s) in dir (created). */
static void write_checkpoint_of(const char *dir, const hr_gguf *g, const hr_synth_shape *sp, const char *torch_dtype,
                                corrupt how) {
    mkdir(dir, 0700);
    const hr_synth_shape s = *sp;
    write_config(dir, &s, g, torch_dtype);
    write_tokenizer(dir);
    const bool gemma = !strcmp(s.arch, "gemma2") || !strcmp(s.arch, "gemma3");
    const bool qk_norm = !strcmp(s.arch, "qwen3") || !strcmp(s.arch, "qwen3moe") || !strcmp(s.arch, "gemma3");
    const bool moe = s.n_expert > 0, mixtral = moe && !strcmp(s.arch, "llama");
    const bool permute = !strcmp(s.arch, "llama") || !strcmp(s.arch, "mistral");
    const bool phi3 = !strcmp(s.arch, "phi3");
    st_entry e[160];
    int n = 0;
    add_entry(e, &n, g, "token_embd.weight", "model.embed_tokens.weight", 0);
    for (int il = 0; il < s.n_layer; il++) {
        char gn[96], hn[96];
        static const struct {
            const char *gguf, *hf;
            int heads; /* 1: q (n_head), 2: k (n_head_kv) */
            int when;  /* 0 always, 1 qkv bias, 2 Q/K norms, 3 not gemma, 4 gemma (a norm stored as w),
                          5 phi3 (fused), 6 not phi3 */
        } names[] = {{"attn_norm.weight", "input_layernorm.weight", 0, 0},
                     {"attn_q.weight", "self_attn.q_proj.weight", 1, 6},
                     {"attn_k.weight", "self_attn.k_proj.weight", 2, 6},
                     {"attn_v.weight", "self_attn.v_proj.weight", 0, 6},
                     {"attn_qkv.weight", "self_attn.qkv_proj.weight", 0, 5},
                     {"ffn_up.weight", "mlp.gate_up_proj.weight", 0, 5},
                     {"attn_q.bias", "self_attn.q_proj.bias", 0, 1},
                     {"attn_k.bias", "self_attn.k_proj.bias", 0, 1},
                     {"attn_v.bias", "self_attn.v_proj.bias", 0, 1},
                     {"attn_q_norm.weight", "self_attn.q_norm.weight", 0, 2},
                     {"attn_k_norm.weight", "self_attn.k_norm.weight", 0, 2},
                     {"attn_output.weight", "self_attn.o_proj.weight", 0, 0},
                     {"ffn_norm.weight", "post_attention_layernorm.weight", 0, 3},
                     {"post_attention_norm.weight", "post_attention_layernorm.weight", 0, 4},
                     {"ffn_norm.weight", "pre_feedforward_layernorm.weight", 0, 4},
                     {"post_ffw_norm.weight", "post_feedforward_layernorm.weight", 0, 4},
                     {"ffn_gate.weight", "mlp.gate_proj.weight", 0, 6},
                     {"ffn_up.weight", "mlp.up_proj.weight", 0, 6},
                     {"ffn_down.weight", "mlp.down_proj.weight", 0, 0}};
        for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
            int when = names[k].when;
            if (moe && strstr(names[k].gguf, "ffn_") && strcmp(names[k].gguf, "ffn_norm.weight")) continue;
            if ((when == 1 && !s.qkv_bias) || (when == 2 && !qk_norm) || (when == 3 && gemma) ||
                (when == 4 && !gemma) || (when == 5 && !phi3) || (when == 6 && phi3))
                continue;
            snprintf(gn, sizeof gn, "blk.%d.%s", il, names[k].gguf);
            snprintf(hn, sizeof hn, "model.layers.%d.%s", il, names[k].hf);
            const char *src = gn;
            char qn[96];
            int heads = !permute ? 0 : names[k].heads == 1 ? s.n_head : names[k].heads == 2 ? s.n_head_kv : 0;
            if (how == BAD_SHAPE && il == 1 && names[k].heads == 2) { /* q's data under k's name */
                snprintf(qn, sizeof qn, "blk.%d.attn_q.weight", il);
                src = qn;
                heads = s.n_head;
            }
            if (gemma && strstr(names[k].gguf, "norm.weight"))
                add_gemma_norm(e, &n, g, src, hn);
            else
                add_entry(e, &n, g, src, hn, heads);
        }
        if (moe) { /* the router, and each expert's matrices cut from the GGUF's stacks */
            snprintf(gn, sizeof gn, "blk.%d.ffn_gate_inp.weight", il);
            snprintf(hn, sizeof hn, "model.layers.%d.%s", il,
                     mixtral ? "block_sparse_moe.gate.weight" : "mlp.gate.weight");
            add_entry(e, &n, g, gn, hn, 0);
            static const char *const stacks[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
            static const char *const q3[3] = {"gate_proj", "up_proj", "down_proj"}, *mx[3] = {"w1", "w3", "w2"};
            for (int k = 0; k < 3; k++) {
                snprintf(gn, sizeof gn, "blk.%d.%s.weight", il, stacks[k]);
                const hr_gguf_tensor *t = hr_gguf_find_tensor(g, gn);
                size_t slice = t->size_bytes / (size_t)t->ne[2];
                for (int x = 0; x < s.n_expert; x++) {
                    if (how == MISSING_EXPERT && il == 1 && k == 0 && x == 3) continue;
                    st_entry *y = &e[n++];
                    if (mixtral)
                        snprintf(y->name, sizeof y->name, "model.layers.%d.block_sparse_moe.experts.%d.%s.weight", il,
                                 x, mx[k]);
                    else
                        snprintf(y->name, sizeof y->name, "model.layers.%d.mlp.experts.%d.%s.weight", il, x, q3[k]);
                    y->dtype = t->type == HR_DTYPE_F32 ? "F32" : t->type == HR_DTYPE_F16 ? "F16" : "BF16";
                    y->rows = t->ne[1];
                    y->cols = t->ne[0];
                    y->bytes = slice;
                    y->data = malloc(slice);
                    memcpy(y->data, (const uint8_t *)t->data + (size_t)x * slice, slice);
                }
            }
        }
    }
    if (gemma)
        add_gemma_norm(e, &n, g, "output_norm.weight", "model.norm.weight");
    else
        add_entry(e, &n, g, "output_norm.weight", "model.norm.weight", 0);
    if (!s.tied_output) add_entry(e, &n, g, "output.weight", "lm_head.weight", 0);
    if (how == MULTIMODAL) {
        for (int i = 0; i < n; i++) {
            char nm[96];
            snprintf(nm, sizeof nm, "model.language_model.%s", e[i].name + 6);
            snprintf(e[i].name, sizeof e[i].name, "%s", nm);
        }
        st_entry *v = &e[n++]; /* the vision tower's: left out */
        snprintf(v->name, sizeof v->name, "model.vision_tower.vision_model.post_layernorm.weight");
        v->dtype = "F32", v->rows = 0, v->cols = 4, v->bytes = 16, v->data = calloc(4, sizeof(float));
        char path[4200];
        snprintf(path, sizeof path, "%s/config.json", dir);
        char *text = hr_test_slurp(path, NULL);
        char *wrapped = malloc(strlen(text) + 256);
        sprintf(wrapped,
                "{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"model_type\": \"gemma3\","
                " \"text_config\": %s, \"vision_config\": {\"hidden_size\": 4}}",
                text);
        write_text(dir, "config.json", wrapped);
        free(text);
        free(wrapped);
    }
    if (how == BAD_DTYPE) { /* layer 0's up_proj in f16 */
        for (int i = 0; i < n; i++)
            if (!strcmp(e[i].name, "model.layers.0.mlp.up_proj.weight")) {
                size_t cnt = e[i].bytes / 4;
                uint16_t *h = malloc(cnt * 2);
                for (size_t k = 0; k < cnt; k++) h[k] = hr_f32_to_f16(((float *)e[i].data)[k]);
                free(e[i].data);
                e[i].data = h;
                e[i].bytes = cnt * 2;
                e[i].dtype = "F16";
            }
    }
    char path[4200];
    if (how == TWO_SHARDS) {
        int half = n / 2;
        snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
        write_st(path, e, 0, half);
        snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
        write_st(path, e, half, n);
        json_t *map = json_object();
        for (int i = 0; i < n; i++)
            json_object_set_new(
                map, e[i].name,
                json_string(i < half ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors"));
        json_t *idx = json_pack("{s:{s:i},s:o}", "metadata", "total_size", 0, "weight_map", map);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        json_dump_file(idx, path, 0);
        json_decref(idx);
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        write_st(path, e, 0, n);
    }
    for (int i = 0; i < n; i++) free(e[i].data);
}

static void write_checkpoint(const char *dir, const hr_gguf *g, const char *torch_dtype, corrupt how) {
    hr_synth_shape s = shape();
    write_checkpoint_of(dir, g, &s, torch_dtype, how);
}

/* ---- running both ------------------------------------------------------------------------------- */

#define N_PROMPT 12
#define N_GEN    10

/* The prompt's logits (every position), then N_GEN greedy steps: ids[] and every step's logits. */
typedef struct trace {
    int32_t ids[N_GEN];
    float *logits; /* (N_PROMPT + N_GEN) x V */
    int V;
} trace;

static trace run(const hr_model *m) {
    const hr_hparams *hp = hr_model_hparams(m);
    trace tr = {.V = hp->n_vocab};
    tr.logits = calloc((size_t)(N_PROMPT + N_GEN) * (size_t)hp->n_vocab, sizeof(float));
    hr_kv_config kc = {.n_layers = hp->n_layer,
                       .n_kv_heads = hp->n_head_kv,
                       .head_dim = hp->head_dim,
                       .block_size = 16,
                       .k_format = HR_KV_F32,
                       .v_format = HR_KV_F32,
                       .max_seqs = 4};
    kc.budget_bytes = hr_kv_block_bytes(&kc) * 8;
    hr_kv_pool *kv = NULL;
    hr_model_ctx *ctx = NULL;
    hr_error err = {0};
    hr_model_ctx_params mp = {.n_threads = 2, .max_batch_tokens = 32, .max_ctx = 64, .force_isa = hr_test_isa()};
    if (hr_kv_pool_create(&kc, &kv, &err) || hr_model_ctx_create(m, kv, &mp, &ctx, &err)) {
        fprintf(stderr, "run: %s\n", err.msg);
        exit(1);
    }
    hr_kv_seq sq;
    hr_kv_seq_create(kv, &sq, &err);
    int32_t toks[N_PROMPT], pos[N_PROMPT];
    hr_kv_seq seqs[N_PROMPT];
    uint8_t want[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) toks[i] = (i * 37 + 11) % 259, pos[i] = i, seqs[i] = sq, want[i] = 1;
    hr_kv_seq_reserve(kv, sq, N_PROMPT, &err);
    hr_batch b = {.n_tokens = N_PROMPT, .tokens = toks, .pos = pos, .seq = seqs, .want_logits = want};
    CHECKF(hr_model_forward(ctx, &b, tr.logits, &err) == HR_OK, "%s", err.msg);
    hr_kv_seq_commit(kv, sq, toks, N_PROMPT);
    float *last = tr.logits + (size_t)(N_PROMPT - 1) * (size_t)tr.V;
    for (int s = 0; s < N_GEN; s++) {
        int32_t t = hr_argmax(last, tr.V), p = N_PROMPT + s;
        tr.ids[s] = t;
        uint8_t w1 = 1;
        hr_kv_seq_reserve(kv, sq, p + 1, &err);
        hr_batch d = {.n_tokens = 1, .tokens = &t, .pos = &p, .seq = &sq, .want_logits = &w1};
        last = tr.logits + (size_t)(N_PROMPT + s) * (size_t)tr.V;
        CHECKF(hr_model_forward(ctx, &d, last, &err) == HR_OK, "%s", err.msg);
        hr_kv_seq_commit(kv, sq, &t, 1);
    }
    hr_model_ctx_destroy(ctx);
    hr_kv_pool_destroy(kv);
    return tr;
}

/* Loads dir (quantize NULL or a type) and the GGUF, and compares their traces. */
static void compare(const char *what, const char *dir, const char *quantize, hr_gguf *g_ref) {
    hr_model *a = NULL, *b = NULL;
    hr_error err = {0};
    hr_status st = quantize ? hr_model_load_dir(dir, quantize, true, &a, &err) : hr_model_load(dir, &a, &err);
    CHECKF(st == HR_OK, "%s: %s", what, err.msg);
    CHECKF(hr_model_load_gguf(g_ref, &b, &err) == HR_OK, "%s: %s", what, err.msg);
    if (!a || !b) {
        hr_model_destroy(a);
        hr_model_destroy(b);
        return;
    }
    const hr_hparams *ha = hr_model_hparams(a), *hb = hr_model_hparams(b);
    CHECK(ha->n_vocab == hb->n_vocab && ha->n_layer == hb->n_layer && ha->n_head_kv == hb->n_head_kv);
    CHECKF(ha->has_rope_freqs == hb->has_rope_freqs && ha->tied_output == hb->tied_output &&
               ha->has_longrope == hb->has_longrope && ha->n_ctx_orig == hb->n_ctx_orig &&
               ha->rope_attn_factor == hb->rope_attn_factor && ha->fused_qkv == hb->fused_qkv &&
               ha->has_qkv_bias == hb->has_qkv_bias && ha->qk_norm == hb->qk_norm &&
               ha->n_window_layers == hb->n_window_layers && ha->attn_softcap == hb->attn_softcap &&
               ha->final_softcap == hb->final_softcap && ha->norm_eps == hb->norm_eps && ha->rope_base == hb->rope_base,
           "%s: hyper-parameters differ", what);
    CHECKF(!strcmp(hr_model_type_name(a), hr_model_type_name(b)), "%s: %s vs %s", what, hr_model_type_name(a),
           hr_model_type_name(b));
    trace ta = run(a), tb = run(b);
    CHECKF(!memcmp(ta.ids, tb.ids, sizeof ta.ids), "%s: greedy ids differ", what);
    size_t n = (size_t)(N_PROMPT + N_GEN) * (size_t)ta.V;
    size_t first = n;
    for (size_t i = 0; i < n && first == n; i++)
        if (memcmp(&ta.logits[i], &tb.logits[i], sizeof(float))) first = i;
    CHECKF(first == n, "%s: logits differ first at %zu (%g vs %g)", what, first, first < n ? ta.logits[first] : 0.0,
           first < n ? tb.logits[first] : 0.0);
    /* the ids are not one repeated token: the comparison sees the model work (a tied random model soon
     * repeats the token whose embedding wins: there the logits carry the check) */
    int distinct = 0;
    for (int i = 0; i < N_GEN; i++) distinct += i == 0 || ta.ids[i] != ta.ids[i - 1];
    CHECKF(ha->tied_output || distinct >= 2, "%s: greedy ids too uniform to compare", what);
    printf("%s: %d greedy ids and %zu logits identical (first ids %d %d %d)\n", what, N_GEN, n, ta.ids[0], ta.ids[1],
           ta.ids[2]);
    free(ta.logits);
    free(tb.logits);
    hr_model_destroy(a);
    hr_model_destroy(b);
}

static char *dir_of(const char *name) {
    static char buf[8][4200];
    static int k;
    char *d = buf[k++ % 8];
    snprintf(d, 4200, "%s/%s", hr_test_tmpdir(), name);
    return d;
}

/* `headroom plan -m DIR` and `plan -m FILE.gguf` (hr_plan_model_open, which the command calls) on a
 * checkpoint and the GGUF it was written from: the same shape (every hyper-parameter the planner reads)
 * and the same weight rows (tensors, elements, bytes by type). The file sizes differ (a config.json
 * plans the GGUF it would convert to, estimated), the tensors do not. */
static void plan_same(const char *what, const char *dir, const hr_synth_shape *sp, hr_dtype type) {
    hr_synth_shape s = *sp;
    hr_gguf_writer *w = NULL;
    hr_error err = {0};
    char path[4400];
    snprintf(path, sizeof path, "%s.gguf", dir);
    CHECKF(hr_synth_build(&s, type, 7, &w, &err) == HR_OK && hr_gguf_writer_write_file(w, path, &err) == HR_OK,
           "%s: %s", what, err.msg);
    hr_gguf_writer_destroy(w);
    hr_plan_model a, b;
    CHECKF(hr_plan_model_open(dir, NULL, &a, &err) == HR_OK, "%s: plan of the directory: %s", what, err.msg);
    CHECKF(hr_plan_model_open(path, NULL, &b, &err) == HR_OK, "%s: plan of the GGUF: %s", what, err.msg);
    const hr_hparams *x = &a.hp, *y = &b.hp;
    CHECKF(x->arch == y->arch && x->n_embd == y->n_embd && x->n_ff == y->n_ff && x->n_head == y->n_head &&
               x->n_head_kv == y->n_head_kv && x->head_dim == y->head_dim && x->n_layer == y->n_layer &&
               x->n_vocab == y->n_vocab && x->n_rot == y->n_rot && x->n_ctx_train == y->n_ctx_train &&
               x->sliding_window == y->sliding_window && x->n_window_layers == y->n_window_layers &&
               x->tied_output == y->tied_output && x->fused_qkv == y->fused_qkv && x->qk_norm == y->qk_norm &&
               x->post_norms == y->post_norms && x->has_qkv_bias == y->has_qkv_bias &&
               x->has_longrope == y->has_longrope && x->has_rope_freqs == y->has_rope_freqs &&
               x->n_expert == y->n_expert && x->n_expert_used == y->n_expert_used && x->n_ff_exp == y->n_ff_exp &&
               x->rope_base == y->rope_base && x->norm_eps == y->norm_eps,
           "%s: plan shapes differ", what);
    CHECKF(a.n_rows == b.n_rows && a.tensor_bytes == b.tensor_bytes && !strcmp(a.weight_type, b.weight_type),
           "%s: %d rows, %llu bytes, %s vs %d rows, %llu bytes, %s", what, a.n_rows, (unsigned long long)a.tensor_bytes,
           a.weight_type, b.n_rows, (unsigned long long)b.tensor_bytes, b.weight_type);
    for (int i = 0; i < a.n_rows && i < b.n_rows; i++)
        CHECKF(!strcmp(a.rows[i].type, b.rows[i].type) && a.rows[i].n_tensors == b.rows[i].n_tensors &&
                   a.rows[i].n_elements == b.rows[i].n_elements && a.rows[i].bytes == b.rows[i].bytes,
               "%s: row %d: %s %d tensors %llu elements vs %s %d tensors %llu elements", what, i, a.rows[i].type,
               a.rows[i].n_tensors, (unsigned long long)a.rows[i].n_elements, b.rows[i].type, b.rows[i].n_tensors,
               (unsigned long long)b.rows[i].n_elements);
    printf("%s: plan of the directory = plan of the GGUF (%d layers, %d KV heads, %llu weight bytes)\n", what,
           x->n_layer, x->n_head_kv, (unsigned long long)a.tensor_bytes);
    unlink(path);
}

static void test_equivalence(void) {
    void *m32 = NULL, *m16 = NULL, *mq = NULL;
    hr_gguf *g32 = synth_gguf(HR_DTYPE_F32, &m32);
    const char *d32 = dir_of("ckpt-f32");
    write_checkpoint(d32, g32, "float32", OK);
    compare("f32", d32, NULL, g32); /* takes g32 */

    hr_gguf *g16 = synth_gguf(HR_DTYPE_F16, &m16);
    const char *d16 = dir_of("ckpt-f16");
    write_checkpoint(d16, g16, "float16", OK);
    compare("f16", d16, NULL, g16);

    void *m32b = NULL;
    hr_gguf *g32b = synth_gguf(HR_DTYPE_F32, &m32b);
    const char *dsh = dir_of("ckpt-sharded");
    write_checkpoint(dsh, g32b, "float32", TWO_SHARDS);
    compare("f32, 2 shards", dsh, NULL, g32b);

    hr_gguf *gq = synth_gguf(HR_DTYPE_Q8_0, &mq);
    compare("--quantize q8_0", d32, "q8_0", gq);

    void *m4 = NULL;
    hr_gguf *g4 = synth_gguf(HR_DTYPE_Q4_0, &m4);
    compare("--quantize q4_0", d32, "q4_0", g4);
    free(m4);
    /* q4_K's 256-value blocks do not divide rows of 64 or 192: q8_0 then, as synth.h falls back */
    hr_model *mk = NULL;
    hr_error kerr = {0};
    CHECKF(hr_model_load_dir(d32, "q4_K", true, &mk, &kerr) == HR_OK && !strcmp(hr_model_type_name(mk), "q8_0"),
           "q4_K: %s", kerr.msg);
    hr_model_destroy(mk);
    /* and q4_K itself on rows of 256 */
    hr_synth_shape wide = shape();
    wide.n_embd = 256, wide.n_ff = 512;
    void *mw = NULL, *mwk = NULL;
    hr_gguf *gw = synth_gguf_of(&wide, HR_DTYPE_F32, &mw), *gwk = synth_gguf_of(&wide, HR_DTYPE_Q4_K, &mwk);
    const char *dw = dir_of("ckpt-wide");
    write_checkpoint_of(dw, gw, &wide, "float32", OK);
    hr_gguf_close(gw);
    compare("--quantize q4_K (E 256)", dw, "q4_K", gwk);
    free(mw);
    free(mwk);

    void *mb = NULL;
    hr_gguf *gb = synth_gguf(HR_DTYPE_BF16, &mb);
    const char *db = dir_of("ckpt-bf16");
    write_checkpoint(db, gb, "bfloat16", OK);
    compare("bf16", db, NULL, gb);
    free(mb);

    /* the other families: biases and tied output (qwen2), Q/K norms (qwen3), gemma's 1 + w norms,
     * post-norms, soft-caps and window patterns */
    static const char *const others[] = {"qwen2-tiny", "qwen3-tiny",    "gemma2-tiny", "gemma3-tiny",
                                         "phi3-tiny",  "qwen3moe-tiny", "mixtral-tiny"};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        hr_synth_shape sh;
        hr_error err;
        CHECK(hr_synth_shape_by_name(others[i], &sh, &err) == HR_OK);
        void *mo = NULL;
        hr_gguf *go = synth_gguf_of(&sh, HR_DTYPE_F32, &mo);
        const char *d = dir_of(others[i]);
        write_checkpoint_of(d, go, &sh, "float32", OK);
        compare(others[i], d, NULL, go);
        plan_same(others[i], d, &sh, HR_DTYPE_F32);
        free(mo);
    }
    /* the experts quantized at load: the same as the q8_0 GGUF synth makes (the router stays f32) */
    hr_synth_shape moe;
    hr_error err;
    CHECK(hr_synth_shape_by_name("qwen3moe-tiny", &moe, &err) == HR_OK);
    void *mq8 = NULL;
    hr_gguf *gq8 = synth_gguf_of(&moe, HR_DTYPE_Q8_0, &mq8);
    compare("qwen3moe-tiny --quantize q8_0", dir_of("qwen3moe-tiny"), "q8_0", gq8);
    free(mq8);
    hr_synth_shape g3;
    CHECK(hr_synth_shape_by_name("gemma3-tiny", &g3, &err) == HR_OK);
    void *mm = NULL;
    hr_gguf *gm = synth_gguf_of(&g3, HR_DTYPE_F32, &mm);
    const char *dm = dir_of("gemma3-multimodal");
    write_checkpoint_of(dm, gm, &g3, "float32", MULTIMODAL);
    compare("gemma3 (Gemma3ForConditionalGeneration, text part)", dm, NULL, gm);
    free(mm);
    free(m32);
    free(m16);
    free(m32b);
    free(mq);
}

/* The runtime and the CLI on a checkpoint directory. */
static void test_runtime(void) {
    const char *dir = dir_of("ckpt-f32");
    hr_runtime_params p = hr_runtime_default_params();
    p.model_path = dir;
    p.n_ctx = 128;
    p.max_running = 2;
    p.kv_seqs = 1;
    hr_runtime *rt = NULL;
    hr_error err = {0};
    CHECKF(hr_runtime_open(&p, &rt, NULL, &err) == HR_OK, "%s", err.msg);
    if (rt) {
        const hr_tokenizer *t = hr_runtime_tokenizer(rt);
        CHECK(hr_tokenizer_n_vocab(t) == 259);
        CHECK(hr_tokenizer_is_eog(t, 257));                             /* </s>: tokenizer_config.json's eos */
        CHECK(hr_tokenizer_is_eog(t, 5) && !hr_tokenizer_is_eog(t, 6)); /* generation_config.json's list */
        CHECK(hr_runtime_chat_native(rt)); /* tokenizer_config.json's template, interpreted */
        int32_t ids[8];
        size_t n = 0;
        hr_tokenize_opts o = {.add_bos = true};
        CHECK(hr_tokenizer_encode(t, "abc", 3, &o, ids, 8, &n, &err) == HR_OK && n == 3 && ids[0] == 256 &&
              ids[1] == 258 && ids[2] == 'c'); /* <s>, the merge "ab", "c" */
        double temp = 0;
        CHECK(hr_gguf_get_float(hr_model_gguf(hr_runtime_model(rt)), "headroom.generation.temperature", &temp, NULL) ==
                  HR_OK &&
              temp > 0.59 && temp < 0.61);
        /* generation_config.json's temperature and top_p where the front end's defaults stand */
        hr_rt_sampling builtin = hr_rt_sampling_default(), sp = builtin, mine = builtin;
        mine.temperature = 0.3f; /* a flag set it */
        hr_runtime_generation_defaults(rt, &builtin, &sp);
        hr_runtime_generation_defaults(rt, &builtin, &mine);
        CHECK(sp.temperature == 0.6f && sp.top_p == 0.9f && sp.top_k == builtin.top_k);
        CHECK(mine.temperature == 0.3f && mine.top_p == 0.9f);
        hr_runtime_close(rt);
    }
    /* the CLI: run on the directory, quantized; a type it does not take is one line */
    char args[4400], *out = NULL, *errs = NULL;
    snprintf(args, sizeof args, "run -m %s --quantize q8_0 -p abc -n 4 --temp 0 --json -t 2", dir);
    int rc = hr_test_run_cli(args, &out, &errs);
    CHECKF(rc == 0 && out && strstr(out, "\"completion\""), "rc %d: %s", rc, errs ? errs : "");
    free(out);
    free(errs);
    snprintf(args, sizeof args, "run -m %s --quantize q5_0 -p abc -n 4", dir);
    rc = hr_test_run_cli(args, NULL, &errs);
    CHECKF(rc != 0 && errs && strstr(errs, "q5_0") && strstr(errs, "q8_0"), "rc %d: %s", rc, errs ? errs : "");
    free(errs);
    /* plan reads the directory's config.json */
    hr_plan_model pm;
    CHECKF(hr_plan_model_open(dir, NULL, &pm, &err) == HR_OK && pm.hp.n_layer == 2 && pm.hp.n_head_kv == 2 &&
               !strcmp(pm.weight_type, "f32"),
           "plan: %s", err.msg);
}

/* What --device cuda does to a checkpoint once it has uploaded a matrix: its host pages given back
 * (hr_model_release_host). On the CPU afterwards the given-back pages fault in again from the file, so
 * the same model gives the same logits bit for bit, which also says the Q/K rows permuted in place
 * (private pages, the only copy of the permuted bytes) were kept: given back, they would read HF's
 * unpermuted rows. Both shards of the two-shard checkpoint; every layer's seven matrices, the output. */
static void test_release(void) {
    const char *dir = dir_of("ckpt-sharded");
    hr_model *m = NULL;
    hr_error err = {0};
    CHECKF(hr_model_load_dir(dir, NULL, false, &m, &err) == HR_OK, "%s", err.msg);
    if (!m) return;
    trace before = run(m);
    static const char *const mats[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
    const int L = hr_model_hparams(m)->n_layer, n_mats = (int)HR_ARRAY_LEN(mats);
    uint64_t given = 0, kept_qk = 0;
    int n_given = 0;
    for (int k = 0; k <= L * n_mats; k++) { /* every layer's matrices, then the output */
        char name[64];
        if (k == L * n_mats)
            snprintf(name, sizeof name, "output.weight");
        else
            snprintf(name, sizeof name, "blk.%d.%s.weight", k / n_mats, mats[k % n_mats]);
        const hr_gguf_tensor *t = hr_model_find_tensor(m, name);
        CHECKF(t != NULL, "%s: not found", name);
        if (!t) continue;
        const uint64_t can = hr_model_releasable(m, t->data, t->size_bytes);
        const uint64_t got = hr_model_release_host(m, t->data, t->size_bytes);
        const bool qk = k < L * n_mats && k % n_mats < 2;
        CHECKF(got == can, "%s: %llu given back, %llu counted", name, (unsigned long long)got, (unsigned long long)can);
        CHECKF(!qk || got == 0, "%s, permuted in place, gave back %llu bytes", name, (unsigned long long)got);
        if (qk) kept_qk += t->size_bytes;
        given += got, n_given += got > 0;
    }
    CHECKF(given > 0 && n_given >= 8, "%llu bytes of %d matrices given back", (unsigned long long)given, n_given);
    trace after = run(m);
    const size_t n = (size_t)(N_PROMPT + N_GEN) * (size_t)before.V;
    CHECKF(!memcmp(before.ids, after.ids, sizeof before.ids) && !memcmp(before.logits, after.logits, n * sizeof(float)),
           "the logits changed after the host pages were given back");
    printf("host pages given back: %llu bytes of %d matrices (the permuted Q/K's %llu kept); logits identical "
           "afterwards\n",
           (unsigned long long)given, n_given, (unsigned long long)kept_qk);
    free(before.logits);
    free(after.logits);
    hr_model_destroy(m);
}

/* ---- bad input ---------------------------------------------------------------------------------- */

static void expect_fail(const char *what, const char *dir, const char *needle1, const char *needle2) {
    hr_model *m = NULL;
    hr_error err = {0};
    hr_status st = hr_model_load(dir, &m, &err);
    CHECKF(st != HR_OK && m == NULL, "%s: loaded", what);
    CHECKF(strstr(err.msg, needle1) && (!needle2 || strstr(err.msg, needle2)) && !strchr(err.msg, '\n'),
           "%s: message '%s' lacks '%s' / '%s'", what, err.msg, needle1, needle2 ? needle2 : "");
    printf("%s: %s\n", what, err.msg);
    hr_model_destroy(m);
}

static void copy_file(const char *from, const char *to, long keep) {
    size_t n = 0;
    char *b = hr_test_slurp(from, &n);
    FILE *f = fopen(to, "wb");
    fwrite(b, 1, keep >= 0 && (size_t)keep < n ? (size_t)keep : n, f);
    fclose(f);
    free(b);
}

/* A safetensors image in buf: the header padded with spaces to 8 bytes, zeroed data after it. Returns
 * the header length. */
static size_t mem_st(uint64_t *buf, const char *header) {
    size_t n = strlen(header), hl = (n + 7) / 8 * 8;
    memset(buf, 0, 32 * sizeof *buf);
    uint8_t *b = (uint8_t *)buf;
    b[0] = (uint8_t)hl;
    memcpy(b + 8, header, n);
    memset(b + 8 + n, ' ', hl - n);
    return hl;
}

static void test_bad_input(void) {
    void *mem = NULL;
    hr_gguf *g = synth_gguf(HR_DTYPE_F32, &mem);
    char path[4400], src[4400];

    const char *d = dir_of("bad-dtype");
    write_checkpoint(d, g, "float32", BAD_DTYPE);
    expect_fail("dtype disagrees", d, "model.layers.0.mlp.up_proj.weight", "torch_dtype");

    d = dir_of("bad-shape");
    write_checkpoint(d, g, "float32", BAD_SHAPE);
    expect_fail("shape disagrees", d, "model.layers.1.self_attn.k_proj.weight", "[64, 64]");

    d = dir_of("bad-trunc");
    write_checkpoint(d, g, "float32", OK);
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    snprintf(src, sizeof src, "%s/model.safetensors", dir_of("ckpt-f32"));
    copy_file(src, path, 5);
    expect_fail("truncated header", d, "model.safetensors", "truncated safetensors header");

    uint8_t hdr[16] = {0x40, 0x42, 0x0f, 0, 0, 0, 0, 0, '{', '}'}; /* 1,000,000 bytes of header declared */
    FILE *f = fopen(path, "wb");
    fwrite(hdr, 1, sizeof hdr, f);
    fclose(f);
    expect_fail("header length past the file", d, "model.safetensors", "declares 1000000 bytes");

    copy_file(src, path, -1);
    size_t n = 0;
    free(hr_test_slurp(path, &n));
    copy_file(src, path, (long)n - 100); /* the last tensor (lm_head) loses its tail */
    expect_fail("data offsets outside the file", d, "model.safetensors", "'lm_head.weight'");

    d = dir_of("bad-shard");
    write_checkpoint(d, g, "float32", TWO_SHARDS);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", d);
    unlink(path);
    expect_fail("missing shard", d, "model-00002-of-00002.safetensors", "missing shard");

    hr_synth_shape moe;
    hr_error merr;
    CHECK(hr_synth_shape_by_name("qwen3moe-tiny", &moe, &merr) == HR_OK);
    void *mm = NULL;
    hr_gguf *gm = synth_gguf_of(&moe, HR_DTYPE_F32, &mm);
    d = dir_of("moe-missing");
    write_checkpoint_of(d, gm, &moe, "float32", MISSING_EXPERT);
    expect_fail("an expert missing", d, "lacks expert 3 of 'blk.1.ffn_gate_exps.weight'", "7 of 8");
    snprintf(path, sizeof path, "%s/config.json", d);
    char *cfg = hr_test_slurp(path, NULL), *at = cfg ? strstr(cfg, "\"norm_topk_prob\": true") : NULL;
    CHECK(at != NULL);
    if (at) {
        memcpy(at, "\"norm_topk_prob\":false", 22); /* same length: the rest of the text unchanged */
        write_text(d, "config.json", cfg);
        expect_fail("norm_topk_prob false", d, "config.json", "norm_topk_prob false is not supported");
    }
    free(cfg);
    hr_gguf_close(gm);
    free(mm);

    d = dir_of("empty-dir");
    mkdir(d, 0700);
    expect_fail("a directory without config.json", d, "empty-dir", "directory without config.json");

    d = dir_of("bad-key");
    write_checkpoint(d, g, "float32", OK);
    write_text(d, "config.json",
               "{\"model_type\": \"llama\", \"intermediate_size\": 192, \"num_attention_heads\": 4,"
               " \"num_hidden_layers\": 2, \"vocab_size\": 512, \"max_position_embeddings\": 512}");
    expect_fail("missing config key", d, "config.json", "'hidden_size'");
    write_text(d, "config.json", "{\"model_type\": \"gpt_neox\", \"hidden_size\": 64}");
    expect_fail("unsupported architecture", d, "config.json", "'gpt_neox' is not supported");

    /* the reader alone: a header entry whose offsets run past the data, and overlapping tensors */
    uint64_t buf[32];
    size_t hl = mem_st(buf, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}");
    hr_safetensors *s = NULL;
    hr_error err = {0};
    CHECK(hr_safetensors_open_memory(buf, 8 + hl + 4, "mem.safetensors", &s, &err) == HR_ERR_FORMAT &&
          strstr(err.msg, "mem.safetensors: tensor 'w'") && strstr(err.msg, "outside"));
    CHECKF(hr_safetensors_open_memory(buf, 8 + hl + 8, "mem.safetensors", &s, &err) == HR_OK &&
               hr_safetensors_n_tensors(s) == 1 && hr_safetensors_find(s, "w")->size_bytes == 8,
           "%s", err.msg);
    hr_safetensors_close(s);
    hl = mem_st(buf, "{\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]},"
                     "\"b\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[2,6]}}");
    CHECK(hr_safetensors_open_memory(buf, 8 + hl + 8, "mem", &s, &err) == HR_ERR_FORMAT && strstr(err.msg, "overlap"));
    hr_gguf_close(g);
    free(mem);
}

/* The loader's own buffers dropped once a backend holds its copy (hr_model_drop_host, the GPU's upload):
 * qwen3moe-tiny quantized at load (q8_0), every matrix and stack of experts it made: their whole pages
 * unmapped (mincore finds them mapped before and not after), as many bytes as hr_model_droppable said;
 * the f32 router, a view of the shard, is none of them; destroying the model afterwards is clean. */
static void test_drop(void) {
    hr_model *m = NULL;
    hr_error err = {0};
    CHECKF(hr_model_load_dir(dir_of("qwen3moe-tiny"), "q8_0", false, &m, &err) == HR_OK, "%s", err.msg);
    if (!m) return;
    static const char *const mats[] = {"attn_q",       "attn_k",        "attn_v",      "attn_output",
                                       "ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    const int L = hr_model_hparams(m)->n_layer, n_mats = (int)HR_ARRAY_LEN(mats);
    const long page = sysconf(_SC_PAGESIZE);
    uint64_t dropped = 0;
    int n_dropped = 0;
    for (int k = 0; k < L * n_mats; k++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.%s.weight", k / n_mats, mats[k % n_mats]);
        const hr_gguf_tensor *t = hr_model_find_tensor(m, name);
        CHECKF(t != NULL, "%s: not found", name);
        if (!t) continue;
        const uint64_t can = hr_model_droppable(m, t->data, t->size_bytes);
        const bool router = k % n_mats == 4;
        CHECKF(router ? can == 0 : can >= t->size_bytes / (uint64_t)page * (uint64_t)page && can > 0,
               "%s: %llu of %llu bytes droppable", name, (unsigned long long)can, (unsigned long long)t->size_bytes);
        if (!can) continue;
        uintptr_t lo;
        CHECK(hr_page_span(t->data, t->size_bytes, &lo) == can);
        unsigned char vec[64];
        const size_t pages = (size_t)(can / (uint64_t)page);
        CHECK(pages <= sizeof vec && mincore((void *)lo, (size_t)can, vec) == 0); /* mapped */
        const uint64_t got = hr_model_drop_host(m, t->data, t->size_bytes);
        CHECKF(got == can, "%s: %llu dropped, %llu counted", name, (unsigned long long)got, (unsigned long long)can);
        CHECKF(mincore((void *)lo, (size_t)can, vec) == -1 && errno == ENOMEM, "%s: still mapped after the drop", name);
        dropped += got, n_dropped++;
    }
    CHECKF(n_dropped == L * (n_mats - 1), "%d of %d matrices dropped", n_dropped, L * (n_mats - 1));
    printf("qwen3moe-tiny quantized at load: %llu bytes of %d matrices and expert stacks dropped (unmapped)\n",
           (unsigned long long)dropped, n_dropped);
    hr_model_destroy(m);
}

#ifdef HR_EMU_CUDA_LIB
/* The same checkpoint on the emulated GPU: the expert stacks the loader made are dropped once uploaded
 * (mincore: unmapped), and the GPU's greedy ids are the CPU's. */
static void test_gpu_drop(void) {
    hr_runtime_params p = hr_runtime_default_params();
    p.model_path = dir_of("qwen3moe-tiny");
    p.n_ctx = 128;
    p.max_batch_tokens = 64;
    p.max_running = 2;
    p.n_threads = 1;
    hr_runtime *cpu = NULL, *gpu = NULL;
    hr_error err = {0};
    CHECKF(hr_runtime_open(&p, &cpu, NULL, &err) == HR_OK, "%s", err.msg);
    p.device = "cuda";
    p.cuda_driver = HR_EMU_CUDA_LIB;
    p.kv_budget = 4u << 20;
    CHECKF(hr_runtime_open(&p, &gpu, NULL, &err) == HR_OK, "%s", err.msg);
    if (cpu && gpu) {
        const hr_model *m = hr_runtime_model(gpu);
        int gone = 0;
        for (int il = 0; il < hr_model_hparams(m)->n_layer; il++)
            for (int k = 0; k < 3; k++) {
                char name[64];
                snprintf(name, sizeof name, "blk.%d.ffn_%s_exps.weight", il, k == 0 ? "gate" : k == 1 ? "up" : "down");
                const hr_gguf_tensor *t = hr_model_find_tensor(m, name);
                uintptr_t lo;
                const uint64_t span = t ? hr_page_span(t->data, t->size_bytes, &lo) : 0;
                unsigned char vec[256];
                gone += span > 0 && span / 4096 <= sizeof vec && mincore((void *)lo, (size_t)span, vec) == -1 &&
                        errno == ENOMEM;
            }
        CHECKF(gone == 3 * hr_model_hparams(m)->n_layer, "%d expert stacks dropped from the host after the upload",
               gone);
        int32_t a[16], b[16];
        static const int32_t prompt[] = {1, 40, 77, 114, 151};
        const int na = hr_test_greedy(cpu, prompt, 5, 16, a, NULL, NULL),
                  nb = hr_test_greedy(gpu, prompt, 5, 16, b, NULL, NULL);
        CHECKF(na == 16 && nb == 16 && !memcmp(a, b, sizeof a), "the GPU's ids differ from the CPU's");
        printf(
            "qwen3moe-tiny checkpoint on the emulated GPU: %d expert stacks dropped from the host, the CPU's 16 ids\n",
            gone);
    }
    hr_runtime_close(cpu);
    hr_runtime_close(gpu);
}
#endif

int main(void) {
    test_equivalence();
    test_release();
    test_drop();
#ifdef HR_EMU_CUDA_LIB
    test_gpu_drop();
#endif
    test_runtime();
    test_bad_input();
    return hr_test_finish();
}

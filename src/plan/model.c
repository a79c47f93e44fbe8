/* model.c: a model's shape and weight bytes for the planner, from a GGUF file (its tensor directory:
 * what the loader will hold) or from a Hugging Face config.json (the tensors the loader would bind for
 * that shape, in the weight type asked for). */
#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "backend/cuda/cuda.h"
#include "common/util.h"
#include "gguf/gguf.h"
#include "plan/plan.h"
#include "tensor/tensor.h"

int hr_plan_weight_type_id(const char *name) {
    static const char *const known[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_K", "q5_K", "q6_K"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (strcasecmp(name, known[i])) continue;
        for (uint32_t id = 0; id < 64; id++)
            if (!strcasecmp(hr_gguf_tensor_type_name(id), known[i])) return (int)id;
    }
    return -1;
}

/* Adds n_tensors tensors of rows x cols to the row of their type (a block type whose block does not
 * divide cols stores the rows as f16, as `headroom synth` does). */
static void add_tensor(hr_plan_model *m, uint32_t type, uint64_t rows, uint64_t cols, int n_tensors) {
    uint32_t blk = 0, blk_bytes = 0;
    if (!hr_gguf_tensor_type_block(type, &blk, &blk_bytes) || cols % blk) type = HR_DTYPE_F16;
    uint64_t bytes = 0;
    hr_gguf_tensor_type_size(type, rows * cols, &bytes);
    const char *name = hr_gguf_tensor_type_name(type);
    int i = 0;
    while (i < m->n_rows && strcmp(m->rows[i].type, name)) i++;
    if (i == m->n_rows) {
        if (m->n_rows == HR_PLAN_MAX_WEIGHT_ROWS)
            i = m->n_rows - 1; /* folded into the last: never in practice */
        else {
            snprintf(m->rows[i].type, sizeof m->rows[i].type, "%s", name);
            m->n_rows++;
        }
    }
    m->rows[i].n_tensors += n_tensors;
    m->rows[i].n_elements += rows * cols * (uint64_t)n_tensors;
    m->rows[i].bytes += bytes * (uint64_t)n_tensors;
    m->tensor_bytes += bytes * (uint64_t)n_tensors;
}

static int row_cmp(const void *a, const void *b) {
    const hr_plan_weight_row *x = a, *y = b;
    return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : strcmp(x->type, y->type);
}

static void finish(hr_plan_model *m) {
    qsort(m->rows, (size_t)m->n_rows, sizeof m->rows[0], row_cmp);
    m->resident_bytes = hr_mem_weight_bytes(&m->hp, m->file_bytes);
    if (!m->gpu_weight_bytes) { /* no tensors read (a config.json): every tensor, each piece rounded up */
        uint64_t n = 1;
        for (int i = 0; i < m->n_rows; i++) n += (uint64_t)m->rows[i].n_tensors;
        m->gpu_weight_bytes = m->tensor_bytes + n * 256u;
    }
}

/* ---- config.json --------------------------------------------------------------------------------- */

static const char *dtype_from_torch(const char *t) {
    if (!strcmp(t, "bfloat16")) return "bf16";
    if (!strcmp(t, "float16") || !strcmp(t, "half")) return "f16";
    if (!strcmp(t, "float32") || !strcmp(t, "float")) return "f32";
    return NULL;
}

/* The tensors model/load.c binds for this shape, in `type` (norms, biases and RoPE factors f32), as a
 * GGUF conversion of the checkpoint holds them. */
static void config_tensors(hr_plan_model *m, uint32_t type) {
    const hr_hparams *hp = &m->hp;
    uint64_t E = (uint64_t)hp->n_embd, F = (uint64_t)hp->n_ff, V = (uint64_t)hp->n_vocab;
    uint64_t qd = (uint64_t)hp->n_head * (uint64_t)hp->head_dim, kvd = (uint64_t)hp->n_head_kv * (uint64_t)hp->head_dim;
    int L = hp->n_layer;
    add_tensor(m, type, V, E, 1); /* token_embd (V, E) */
    if (!hp->tied_output) add_tensor(m, type, V, E, 1);
    if (hp->fused_qkv) {
        add_tensor(m, type, qd + 2 * kvd, E, L); /* attn_qkv (phi3) */
    } else {
        add_tensor(m, type, qd, E, L);  /* attn_q */
        add_tensor(m, type, kvd, E, L); /* attn_k */
        add_tensor(m, type, kvd, E, L); /* attn_v */
    }
    add_tensor(m, type, E, qd, L); /* attn_output */
    if (hp->n_expert > 0) {
        uint64_t X = (uint64_t)hp->n_expert, FX = (uint64_t)hp->n_ff_exp;
        add_tensor(m, HR_DTYPE_F32, X, E, L);  /* ffn_gate_inp: the router */
        add_tensor(m, type, X * FX, E, 2 * L); /* ffn_gate_exps, ffn_up_exps (X stacked matrices) */
        add_tensor(m, type, X * E, FX, L);     /* ffn_down_exps */
    } else if (hp->arch == HR_ARCH_PHI3) {
        add_tensor(m, type, 2 * F, E, L); /* ffn_up: gate rows, then up rows */
        add_tensor(m, type, E, F, L);     /* ffn_down */
    } else {
        add_tensor(m, type, F, E, 2 * L); /* ffn_gate, ffn_up */
        add_tensor(m, type, E, F, L);     /* ffn_down */
    }
    add_tensor(m, HR_DTYPE_F32, 1, E, 2 * L + 1); /* attn_norm, ffn_norm per layer; output_norm */
    if (hp->post_norms) add_tensor(m, HR_DTYPE_F32, 1, E, 2 * L);
    if (hp->qk_norm) add_tensor(m, HR_DTYPE_F32, 1, (uint64_t)hp->head_dim, 2 * L);
    if (hp->has_qkv_bias) {
        add_tensor(m, HR_DTYPE_F32, 1, qd, L);
        add_tensor(m, HR_DTYPE_F32, 1, kvd, 2 * L);
    }
    if (hp->has_rope_freqs) add_tensor(m, HR_DTYPE_F32, 1, (uint64_t)hp->n_rot / 2, 1);
    if (hp->has_longrope) add_tensor(m, HR_DTYPE_F32, 1, (uint64_t)hp->n_rot / 2, 2);
}

hr_status hr_plan_model_from_config(const char *text, size_t len, const char *weight_type, hr_plan_model *out,
                                    hr_error *err) {
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!root) return hr_error_set(err, HR_ERR_FORMAT, "config.json is not JSON: %s (line %d)", je.text, je.line);
    if (!json_is_object(root)) {
        json_decref(root);
        return hr_error_set(err, HR_ERR_FORMAT, "config.json is not a JSON object");
    }
    hr_plan_model m = {.from_config = true};
    /* the shape: the loader's own config.json conversion (model/hf.c), every architecture it loads; a
     * config without max_position_embeddings (the loader requires it) plans with 4096 */
    if (!json_object_get(root, "max_position_embeddings") &&
        !json_object_get(json_object_get(root, "text_config"), "max_position_embeddings")) {
        json_t *tc = json_object_get(root, "text_config");
        json_object_set_new(json_is_object(tc) ? tc : root, "max_position_embeddings", json_integer(4096));
    }
    char *shape_text = json_dumps(root, JSON_COMPACT);
    hr_status st = shape_text ? hr_model_config_hparams(shape_text, strlen(shape_text), &m.hp, err)
                              : hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    free(shape_text);
    const char *wt = weight_type;
    if (st == HR_OK && !wt) {
        json_t *d = json_object_get(root, "torch_dtype");
        if (!d) d = json_object_get(root, "dtype");
        if (!d)
            st =
                hr_error_set(err, HR_ERR_FORMAT,
                             "config.json lacks the field \"torch_dtype\" (give the weights' type with --weight-type)");
        else if (!json_is_string(d) || !(wt = dtype_from_torch(json_string_value(d))))
            st = hr_error_set(err, HR_ERR_FORMAT,
                              "config.json field \"torch_dtype\" must be \"bfloat16\", \"float16\" or \"float32\" "
                              "(or give --weight-type)");
    }
    if (st == HR_OK) {
        int id = hr_plan_weight_type_id(wt);
        if (id < 0) {
            st = hr_error_set(err, HR_ERR_INVALID_ARG,
                              "unknown weight type '%s' (known: f32, f16, bf16, q8_0, q4_0, q4_K, q5_K, q6_K)", wt);
        } else {
            snprintf(m.weight_type, sizeof m.weight_type, "%s", hr_gguf_tensor_type_name((uint32_t)id));
            config_tensors(&m, (uint32_t)id);
            const char *name = json_string_value(json_object_get(root, "_name_or_path"));
            snprintf(m.hp.name, sizeof m.hp.name, "%s", name ? name : "");
            hr_error ge = {0};
            if (hr_cuda_check_hparams(&m.hp, &ge) != HR_OK) snprintf(m.gpu_refused, sizeof m.gpu_refused, "%s", ge.msg);
            /* a GGUF of it also carries the vocabulary (pieces, scores, types: about 32 bytes an entry) */
            m.file_bytes = m.tensor_bytes + (uint64_t)m.hp.n_vocab * 32 + 65536;
            finish(&m);
            *out = m;
        }
    }
    json_decref(root);
    return st;
}

/* ---- GGUF ---------------------------------------------------------------------------------------- */

static hr_status from_gguf(const char *path, hr_plan_model *out, hr_error *err) {
    hr_model *model = NULL;
    hr_status st = hr_model_load_hold(path, HR_GGUF_MMAP, false, &model, err); /* metadata only */
    if (st) return st;
    hr_plan_model m = {.hp = *hr_model_hparams(model)};
    const hr_gguf *g = hr_model_gguf(model);
    for (uint64_t i = 0; i < hr_gguf_n_tensors(g); i++) {
        const hr_gguf_tensor *t = hr_gguf_tensor_at(g, i);
        const char *name = hr_gguf_tensor_type_name(t->type);
        int r = 0;
        while (r < m.n_rows && strcmp(m.rows[r].type, name)) r++;
        if (r == m.n_rows && m.n_rows < HR_PLAN_MAX_WEIGHT_ROWS) snprintf(m.rows[m.n_rows++].type, 16, "%s", name);
        if (r == HR_PLAN_MAX_WEIGHT_ROWS) r--;
        uint64_t n = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) n *= (uint64_t)t->ne[d];
        m.rows[r].n_tensors++;
        m.rows[r].n_elements += n;
        m.rows[r].bytes += t->size_bytes;
        m.tensor_bytes += t->size_bytes;
    }
    snprintf(m.weight_type, sizeof m.weight_type, "%s", hr_model_type_name(model));
    m.file_bytes = hr_gguf_file_size(g);
    m.gpu_weight_bytes = hr_cuda_model_weight_bytes(model); /* what the GPU backend would upload */
    hr_error ge = {0};
    if (hr_cuda_check_model(model, &ge) != HR_OK) snprintf(m.gpu_refused, sizeof m.gpu_refused, "%s", ge.msg);
    hr_model_destroy(model);
    finish(&m);
    *out = m;
    return HR_OK;
}

hr_status hr_plan_model_open(const char *path, const char *weight_type, hr_plan_model *out, hr_error *err) {
    char cfg[4096]; /* a Hugging Face checkpoint directory: its config.json (the weights are not read) */
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode) && snprintf(cfg, sizeof cfg, "%s/config.json", path) > 0)
        path = cfg;
    FILE *f = fopen(path, "rb");
    if (!f) return hr_error_set(err, HR_ERR_IO, "cannot open '%s'", path);
    char magic[4] = {0};
    size_t got = fread(magic, 1, 4, f);
    if (got == 4 && !memcmp(magic, "GGUF", 4)) {
        fclose(f);
        if (weight_type)
            return hr_error_set(err, HR_ERR_INVALID_ARG,
                                "--weight-type applies to a config.json; '%s' is a GGUF file whose tensors have "
                                "their types",
                                path);
        return from_gguf(path, out, err);
    }
    /* a config.json is small: read it whole (1 MiB is far more than any) */
    size_t cap = 1 << 20, n = got;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    }
    memcpy(buf, magic, got);
    n += fread(buf + n, 1, cap - 1 - n, f);
    buf[n] = 0;
    bool more = !feof(f);
    fclose(f);
    hr_status st;
    if (more)
        st = hr_error_set(err, HR_ERR_FORMAT, "'%s' is neither a GGUF file nor a config.json (over 1 MiB)", path);
    else if (buf[strspn(buf, " \t\r\n")] != '{')
        st = hr_error_set(err, HR_ERR_FORMAT, "'%s' is neither a GGUF file nor a JSON config.json", path);
    else
        st = hr_plan_model_from_config(buf, n, weight_type, out, err);
    free(buf);
    return st;
}

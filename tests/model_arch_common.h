/* model_arch_common.h: what the family tests against llama.cpp and float64 references share
 * (test_model_arch, test_model_mla): greedy generation in an f16 cache against llama.cpp's recorded ids,
 * a synthetic model by shape, f32 tensors read from the file, float64 matvec / RMS norm, a forward rig
 * of several sequences, a shape's GGUF image, and the CLI's one-line failure. Include after harness.h
 * (static inline: each test uses what it needs; -Wunused-function stays quiet). */
#ifndef HR_TESTS_MODEL_ARCH_COMMON_H
#define HR_TESTS_MODEL_ARCH_COMMON_H

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "harness.h"
#include "kv/kv.h"
#include "model/model.h"
#include "model/synth.h"
#include "model_images.h"

#define N_GEN 64

/* Greedy generation of one prompt in a fresh f16 cache: the prompt as one batch, then one token a
 * step, as llama.cpp ran it. */
static inline void greedy(const hr_model *m, const int32_t *prompt, int n_prompt, int n_ctx, int32_t *out,
                          float *kept) {
    const hr_hparams *hp = hr_model_hparams(m);
    hr_kv_config kc = {.n_layers = hp->n_layer,
                       .n_kv_heads = hp->n_head_kv,
                       .head_dim = hp->head_dim,
                       .v_from_k = hp->kv_lora_rank, /* deepseek2: the latent cache */
                       .block_size = 16,
                       .k_format = HR_KV_F16,
                       .v_format = HR_KV_F16,
                       .max_seqs = 1};
    kc.budget_bytes = hr_kv_block_bytes(&kc) * (uint64_t)(n_ctx / 16 + 1);
    hr_kv_pool *kv = NULL;
    hr_model_ctx *c = NULL;
    hr_model_ctx_params mp = {.n_threads = 2, .max_batch_tokens = 16, .max_ctx = n_ctx};
    hr_error err = {0};
    hr_kv_seq s;
    CHECK(hr_kv_pool_create(&kc, &kv, &err) == HR_OK && hr_model_ctx_create(m, kv, &mp, &c, &err) == HR_OK &&
          hr_kv_seq_create(kv, &s, &err) == HR_OK);
    if (!c) return;
    float *logits = malloc(sizeof(float) * (size_t)hp->n_vocab);
    int32_t toks[16], pos[16];
    hr_kv_seq seq[16];
    uint8_t want[16] = {0};
    int n = n_prompt, at = 0;
    memcpy(toks, prompt, sizeof(int32_t) * (size_t)n);
    for (int g = 0; g < N_GEN; g++) {
        for (int i = 0; i < n; i++) pos[i] = at + i, seq[i] = s, want[i] = i == n - 1;
        hr_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .seq = seq, .want_logits = want};
        CHECK(hr_kv_seq_reserve(kv, s, at + n, &err) == HR_OK);
        CHECKF(hr_model_forward(c, &b, logits, &err) == HR_OK, "%s", err.msg);
        hr_kv_seq_commit(kv, s, toks, n);
        at += n;
        int best = 0;
        for (int v = 1; v < hp->n_vocab; v++)
            if (logits[v] > logits[best]) best = v;
        out[g] = toks[0] = best;
        if (g % 21 == 0) memcpy(kept + (size_t)(g / 21) * hp->n_vocab, logits, sizeof(float) * (size_t)hp->n_vocab);
        n = 1;
    }
    free(logits);
    hr_model_ctx_destroy(c);
    hr_kv_pool_destroy(kv);
}

/* file: under tests/vectors/, n_expected lines of 8 per model */
static inline void check_llamacpp_ids(const char *file, int n_expected) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/vectors/%s", HR_SOURCE_DIR, file);
    FILE *f = fopen(path, "r");
    CHECKF(f != NULL, "cannot open %s", path);
    if (!f) return;
    char line[8192], loaded[96] = "";
    hr_model *m = NULL;
    void *mem = NULL;
    int n_lines = 0, n_equal = 0;
    double worst_logit = 0;
    while (fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        CHECK(o != NULL);
        if (!o) continue;
        const char *shape = json_string_value(json_object_get(o, "shape"));
        json_t *pt = json_object_get(o, "prompt_tokens"), *ct = json_object_get(o, "completion_tokens");
        CHECK(shape && json_array_size(pt) <= 16 && json_array_size(ct) == N_GEN);
        /* "layers": the shape's first N layers, as `headroom synth --layers N` writes it */
        const int layers = (int)json_integer_value(json_object_get(o, "layers"));
        char key[96];
        snprintf(key, sizeof key, "%s:%d", shape ? shape : "", layers);
        if (shape && strcmp(key, loaded)) {
            hr_model_destroy(m);
            free(mem);
            hr_synth_shape s;
            hr_error err = {0};
            CHECK(hr_synth_shape_by_name(shape, &s, &err) == HR_OK);
            if (layers > 0) s.n_layer = layers;
            CHECKF(hr_synth_model(&s, HR_DTYPE_F32, 1, &m, &mem, &err) == HR_OK, "%s", err.msg);
            snprintf(loaded, sizeof loaded, "%s", key);
        }
        int32_t prompt[16], ids[N_GEN];
        int np = (int)json_array_size(pt), first_diff = -1;
        const int V = m ? hr_model_hparams(m)->n_vocab : 1;
        float *kept = calloc((size_t)4 * V, sizeof(float));
        for (int i = 0; i < np && i < 16; i++) prompt[i] = (int32_t)json_integer_value(json_array_get(pt, i));
        greedy(m, prompt, np, (int)json_integer_value(json_object_get(o, "n_ctx")), ids, kept);
        /* llama.cpp's 8 largest logits at steps 0, 21, 42, 63: headroom's at those ids, relative to
         * the largest (its GELU goes through an f16 table, headroom's does not) */
        json_t *tops = json_object_get(o, "top_logits");
        CHECK(json_array_size(tops) == 4);
        for (size_t k = 0; k < json_array_size(tops); k++) {
            json_t *tk = json_array_get(tops, k), *tid = json_object_get(tk, "ids"),
                   *tl = json_object_get(tk, "logits");
            double top = fabs(json_real_value(json_array_get(tl, 0)));
            for (size_t r = 0; r < json_array_size(tid); r++) {
                int64_t id = json_integer_value(json_array_get(tid, r));
                CHECK(id >= 0 && id < V);
                if (id < 0 || id >= V) continue;
                double d = fabs(kept[k * (size_t)V + (size_t)id] - json_real_value(json_array_get(tl, r))) / top;
                if (d > worst_logit) worst_logit = d;
            }
        }
        free(kept);
        for (int g = N_GEN - 1; g >= 0; g--)
            if (ids[g] != json_integer_value(json_array_get(ct, g))) first_diff = g;
        CHECKF(first_diff < 0, "%s prompt %d: id %d is %d, llama.cpp's %lld", key, n_lines % 8, first_diff,
               first_diff < 0 ? 0 : ids[first_diff],
               first_diff < 0 ? 0 : json_integer_value(json_array_get(ct, first_diff)));
        n_equal += first_diff < 0;
        n_lines++;
        json_decref(o);
    }
    fclose(f);
    hr_model_destroy(m);
    free(mem);
    CHECK(n_lines == n_expected);
    CHECKF(worst_logit < 2e-3, "logits %.3g (relative to the largest) from llama.cpp's", worst_logit);
    printf("llama.cpp greedy ids (%s): %d of %d prompts (%d models x 8, 64 tokens each) equal; its top-8 logits at "
           "4 steps each within %.2e of the largest (bound 2e-3)\n",
           file, n_equal, n_lines, n_lines / 8, worst_logit);
}

static inline hr_model *synth(const char *shape, int layers, hr_dtype type, void **mem) {
    hr_synth_shape s;
    hr_model *m = NULL;
    hr_error err = {0};
    CHECK(hr_synth_shape_by_name(shape, &s, &err) == HR_OK);
    if (layers > 0) s.n_layer = layers;
    CHECKF(hr_synth_model(&s, type, 1, &m, mem, &err) == HR_OK, "%s: %s", shape, err.msg);
    return m;
}

static inline const float *f32_tensor(const hr_model *m, const char *name) {
    const hr_gguf_tensor *t = hr_gguf_find_tensor(hr_model_gguf(m), name);
    CHECKF(t && t->type == HR_DTYPE_F32, "%s: absent or not f32", name);
    return t && t->type == HR_DTYPE_F32 ? t->data : NULL;
}

/* y[r] = sum_c W[r][c] x[c], W in f32, in double */
static inline void matvec64(const float *W, const double *x, int rows, int cols, double *y) {
    for (int r = 0; r < rows; r++) {
        double acc = 0;
        for (int c = 0; c < cols; c++) acc += (double)W[(size_t)r * cols + c] * x[c];
        y[r] = acc;
    }
}

static inline void rmsnorm64(double *out, const double *x, const float *w, int n, double eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const double inv = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * inv * w[i];
}

/* A forward rig: an f16 (or f32) pool for n_seqs sequences of up to 64 tokens, T up to 32. */
typedef struct moe_rig {
    hr_kv_pool *kv;
    hr_model_ctx *c;
    hr_kv_seq seq[8];
} moe_rig;

static inline moe_rig rig_open(const hr_model *m, hr_kv_format fmt, int n_seqs, int n_threads) {
    const hr_hparams *hp = hr_model_hparams(m);
    moe_rig r = {0};
    hr_kv_config kc = {.n_layers = hp->n_layer,
                       .n_kv_heads = hp->n_head_kv,
                       .head_dim = hp->head_dim,
                       .v_from_k = hp->kv_lora_rank, /* deepseek2: the latent cache */
                       .block_size = 16,
                       .k_format = fmt,
                       .v_format = fmt,
                       .max_seqs = n_seqs};
    kc.budget_bytes = hr_kv_block_bytes(&kc) * (uint64_t)(4 * n_seqs + 4);
    hr_model_ctx_params mp = {.n_threads = n_threads, .max_batch_tokens = 32, .max_ctx = 64};
    hr_error err = {0};
    CHECKF(hr_kv_pool_create(&kc, &r.kv, &err) == HR_OK && hr_model_ctx_create(m, r.kv, &mp, &r.c, &err) == HR_OK, "%s",
           err.msg);
    for (int i = 0; r.c && i < n_seqs; i++) CHECK(hr_kv_seq_create(r.kv, &r.seq[i], &err) == HR_OK);
    return r;
}

static inline void rig_close(moe_rig *r) {
    hr_model_ctx_destroy(r->c);
    hr_kv_pool_destroy(r->kv);
}

/* One forward of n tokens: token i to sequence si[i] at the sequence's next position, logits for all. */
static inline void rig_step(moe_rig *r, const int32_t *toks, const int *si, int n, int *at, float *logits) {
    int32_t pos[32];
    hr_kv_seq seq[32];
    uint8_t want[32];
    int first[8];
    hr_error err = {0};
    memcpy(first, at, sizeof first);
    for (int i = 0; i < n; i++) pos[i] = at[si[i]]++, seq[i] = r->seq[si[i]], want[i] = 1;
    for (int q = 0; q < 8; q++)
        if (at[q] > first[q]) CHECK(hr_kv_seq_reserve(r->kv, r->seq[q], at[q], &err) == HR_OK);
    hr_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .seq = seq, .want_logits = want};
    CHECKF(hr_model_forward(r->c, &b, logits, &err) == HR_OK, "%s", err.msg);
    for (int q = 0; q < 8; q++) { /* each sequence's tokens are consecutive in toks (the callers' batches) */
        int i0 = -1, cnt = 0;
        for (int i = 0; i < n; i++)
            if (si[i] == q) i0 = i0 < 0 ? i : i0, cnt++;
        if (cnt) hr_kv_seq_commit(r->kv, r->seq[q], toks + i0, cnt);
    }
}

/* Six sequences (prompts of 2..7 tokens, then 3 decode steps): each run alone, then all six in one
 * batch per step (27 prompt tokens, then 6 a step). Every logit equal bit for bit: the experts' grouped
 * products and the rank-order sums do not depend on the batch. Returns the last step's logits of
 * sequence 0 (alone) in keep (V floats) for the type comparison. */
static inline void check_moe_batch_invariance(const char *shape, hr_dtype type, float *keep) {
    void *mem = NULL;
    hr_model *m = synth(shape, 0, type, &mem);
    if (!m) return;
    const int V = hr_model_hparams(m)->n_vocab, NS = 6, STEPS = 3;
    float *alone = malloc(sizeof(float) * (size_t)V * NS * (STEPS + 1));
    float *batched = malloc(sizeof(float) * (size_t)V * 32);
    int32_t prompts[6][8];
    for (int q = 0; q < NS; q++)
        for (int i = 0; i < 2 + q; i++) prompts[q][i] = 3 + (q * 211 + i * 53) % (V - 3);
    const int32_t dec[3] = {17, 401, 99};
    /* alone: sequence q in a rig of its own */
    for (int q = 0; q < NS; q++) {
        moe_rig r = rig_open(m, HR_KV_F16, 1, 2);
        if (!r.c) break;
        int at[8] = {0}, si[8] = {0};
        rig_step(&r, prompts[q], si, 2 + q, at, batched);
        memcpy(alone + ((size_t)q * (STEPS + 1)) * V, batched + (size_t)(1 + q) * V, sizeof(float) * (size_t)V);
        for (int s = 0; s < STEPS; s++) {
            int32_t t = dec[s] + q;
            rig_step(&r, &t, si, 1, at, batched);
            memcpy(alone + ((size_t)q * (STEPS + 1) + 1 + s) * V, batched, sizeof(float) * (size_t)V);
        }
        rig_close(&r);
    }
    memcpy(keep, alone + (size_t)STEPS * V, sizeof(float) * (size_t)V);
    moe_rig r = rig_open(m, HR_KV_F16, NS, 2);
    int n_diff = 0;
    if (r.c) {
        int32_t toks[32];
        int si[32], at[8] = {0}, n = 0, last[6];
        for (int q = 0; q < NS; q++) {
            for (int i = 0; i < 2 + q; i++) toks[n] = prompts[q][i], si[n++] = q;
            last[q] = n - 1;
        }
        rig_step(&r, toks, si, n, at, batched);
        for (int q = 0; q < NS; q++)
            n_diff += memcmp(batched + (size_t)last[q] * V, alone + ((size_t)q * (STEPS + 1)) * V,
                             sizeof(float) * (size_t)V) != 0;
        for (int s = 0; s < STEPS; s++) {
            for (int q = 0; q < NS; q++) toks[q] = dec[s] + q, si[q] = q;
            rig_step(&r, toks, si, NS, at, batched);
            for (int q = 0; q < NS; q++)
                n_diff += memcmp(batched + (size_t)q * V, alone + ((size_t)q * (STEPS + 1) + 1 + s) * V,
                                 sizeof(float) * (size_t)V) != 0;
        }
        rig_close(&r);
    }
    CHECKF(n_diff == 0, "%s %s: %d of %d logit rows differ batched from alone", shape, hr_dtype_get_info(type)->name,
           n_diff, NS * (STEPS + 1));
    printf("%s %s: %d logit rows bit-identical alone and batched (6 sequences, 27-token prefill, 3 steps)\n", shape,
           hr_dtype_get_info(type)->name, NS * (STEPS + 1) - n_diff);
    free(alone);
    free(batched);
    hr_model_destroy(m);
    free(mem);
}

/* The synthetic model of `shape` as a GGUF image (f32, seed 1), with sliding_window overridden when
 * window >= 0. */
static inline void *image(const char *shape, int window, size_t *size) {
    hr_synth_shape s;
    hr_error err = {0};
    hr_gguf_writer *w = NULL;
    void *mem = NULL;
    CHECK(hr_synth_shape_by_name(shape, &s, &err) == HR_OK);
    if (window >= 0) s.sliding_window = window;
    CHECK(hr_synth_build(&s, HR_DTYPE_F32, 1, &w, &err) == HR_OK);
    CHECK(hr_gguf_writer_write_memory(w, &mem, size, &err) == HR_OK);
    hr_gguf_writer_destroy(w);
    return mem;
}

/* `headroom ARGS` exits 1 with one line on stderr containing needle (and the server never listens). */
static inline void expect_cli_failure(const char *args, const char *needle) {
    char *out = NULL, *err = NULL;
    int rc = hr_test_run_cli(args, &out, &err);
    CHECKF(rc == 1, "'%s' exited %d", args, rc);
    CHECKF(count_lines(err) == 1 && strstr(err, needle), "'%s': stderr '%s' lacks '%s' or is not one line", args,
           err ? err : "", needle);
    free(out);
    free(err);
}

#if HR_FAULT
#include "model_faults.h"
/* Fault build: each synthetic shape's f32 image through check_model_alloc_faults. */
static inline void check_shapes_alloc_faults(const char *const *shapes, size_t count) {
    for (size_t i = 0; i < count; i++) {
        size_t n;
        void *mem = image(shapes[i], -1, &n);
        check_model_alloc_faults(mem, n, shapes[i]);
        free(mem);
    }
}
#endif

#endif

/* test_stories.c: the correctness bar. On ../shared/models/stories260K.gguf every prompt in
 * ../shared/vectors/stories260K-greedy.jsonl must give exactly the recorded prompt token ids and the
 * recorded 48 greedy completion ids; on its q8_0 variant, exactly llama.cpp's own q8_0 completions
 * (../shared/vectors/stories260K-q8_0-greedy.jsonl; tests/vectors/stories260K-q8_0-llamacpp.jsonl
 * must hold the same ids). Run with the reference engine's f16 KV cache, each prompt alone and all
 * prompts together in one ragged batch per step (which must change nothing), with the kernels of
 * $HEADROOM_ISA (tests/harness.h; unset: the default table). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "model/model.h"
#include "sampler/sampler.h"
#include "tokenizer/tokenizer.h"

#define MAXP 16
#define NGEN 48

typedef struct vec {
    char *prompt;
    int32_t ptoks[64], ctoks[NGEN];
    int np, nc;
} vec;

static int load_vectors(const char *path, vec *v) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[1 << 14];
    int n = 0;
    while (n < MAXP && fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        if (!o) continue;
        v[n].prompt = strdup(json_string_value(json_object_get(o, "prompt")));
        json_t *pt = json_object_get(o, "prompt_tokens"), *ct = json_object_get(o, "completion_tokens");
        v[n].np = (int)json_array_size(pt);
        v[n].nc = (int)json_array_size(ct);
        for (int i = 0; i < v[n].np && i < 64; i++) v[n].ptoks[i] = (int32_t)json_integer_value(json_array_get(pt, i));
        for (int i = 0; i < v[n].nc && i < NGEN; i++)
            v[n].ctoks[i] = (int32_t)json_integer_value(json_array_get(ct, i));
        json_decref(o);
        n++;
    }
    fclose(f);
    return n;
}

/* Greedy-decodes every prompt, all sequences stepping together when `together`, else one by one.
 * `exact` demands the reference completions; otherwise they are reported and the caller checks
 * teacher-forced agreement. The decoded ids are left in got (for comparing runs). */
static int32_t got[MAXP][NGEN];
static const char *g_isa; /* force_isa for every model context: $HEADROOM_ISA or NULL */

static int run_model(const char *model_path, vec *v, int n, bool together, bool exact, hr_kv_format kvf) {
    hr_error err = {0};
    hr_model *m = NULL;
    hr_tokenizer *tok = NULL;
    if (hr_model_load(model_path, &m, &err) || hr_tokenizer_load(hr_model_gguf(m), &tok, &err)) {
        fprintf(stderr, "%s: %s\n", model_path, err.msg);
        hr_test_failed++;
        return 0;
    }
    const hr_hparams *hp = hr_model_hparams(m);
    hr_kv_config kc = {.n_layers = hp->n_layer,
                       .n_kv_heads = hp->n_head_kv,
                       .head_dim = hp->head_dim,
                       .block_size = 16,
                       .k_format = kvf,
                       .v_format = kvf,
                       .max_seqs = MAXP};
    kc.budget_bytes = hr_kv_block_bytes(&kc) * 8 * MAXP;
    hr_kv_pool *kv = NULL;
    hr_model_ctx *ctx = NULL;
    hr_model_ctx_params mp = {
        .n_threads = 2, .max_batch_tokens = 64 * MAXP, .max_ctx = hp->n_ctx_train, .force_isa = g_isa};
    if (hr_kv_pool_create(&kc, &kv, &err) || hr_model_ctx_create(m, kv, &mp, &ctx, &err)) {
        fprintf(stderr, "setup: %s\n", err.msg);
        exit(1);
    }
    int V = hp->n_vocab;
    float *logits = malloc(sizeof(float) * (size_t)V * MAXP);
    int32_t toks[64 * MAXP], pos[64 * MAXP];
    hr_kv_seq seqs[64 * MAXP], sid[MAXP];
    uint8_t want[64 * MAXP];
    int pass_ids = 0;
    for (int i = 0; i < n; i++) {
        size_t cnt = 0;
        hr_tokenize_opts to = {.add_bos = true};
        hr_tokenizer_encode(tok, v[i].prompt, strlen(v[i].prompt), &to, toks, 64, &cnt, &err);
        int same = (int)cnt == v[i].np && !memcmp(toks, v[i].ptoks, sizeof(int32_t) * cnt);
        CHECKF(same, "prompt %d ('%s') tokenizes differently", i, v[i].prompt);
        pass_ids += same;
    }
    int groups = together ? 1 : n, per = together ? n : 1;
    for (int gi = 0; gi < groups; gi++) {
        int first = gi * per;
        /* prefill: every prompt of the group in one batch */
        int T = 0;
        for (int i = first; i < first + per; i++) {
            hr_kv_seq_create(kv, &sid[i], &err);
            hr_kv_seq_reserve(kv, sid[i], v[i].np, &err);
            for (int j = 0; j < v[i].np; j++) {
                toks[T] = v[i].ptoks[j], pos[T] = j, seqs[T] = sid[i], want[T] = j == v[i].np - 1;
                T++;
            }
        }
        hr_batch b = {.n_tokens = T, .tokens = toks, .pos = pos, .seq = seqs, .want_logits = want};
        CHECK(hr_model_forward(ctx, &b, logits, &err) == HR_OK);
        for (int i = first, o = 0; i < first + per; i++, o++) {
            hr_kv_seq_commit(kv, sid[i], v[i].ptoks, v[i].np);
            got[i][0] = hr_argmax(logits + (size_t)o * V, V);
        }
        for (int k = 1; k < NGEN; k++) {
            T = 0;
            for (int i = first; i < first + per; i++) {
                hr_kv_seq_reserve(kv, sid[i], v[i].np + k, &err);
                toks[T] = got[i][k - 1], pos[T] = v[i].np + k - 1, seqs[T] = sid[i], want[T] = 1;
                T++;
            }
            b = (hr_batch){.n_tokens = T, .tokens = toks, .pos = pos, .seq = seqs, .want_logits = want};
            CHECK(hr_model_forward(ctx, &b, logits, &err) == HR_OK);
            for (int i = first, o = 0; i < first + per; i++, o++) {
                hr_kv_seq_commit(kv, sid[i], &got[i][k - 1], 1);
                got[i][k] = hr_argmax(logits + (size_t)o * V, V);
            }
        }
        for (int i = first; i < first + per; i++) hr_kv_seq_free(kv, sid[i]);
    }
    int pass = 0;
    for (int i = 0; i < n; i++) {
        int same = !memcmp(got[i], v[i].ctoks, sizeof(int32_t) * NGEN);
        if (exact)
            CHECKF(same, "%s: prompt %d ('%s') greedy completion differs from the reference", model_path, i,
                   v[i].prompt);
        pass += same;
    }
    printf("%s (%s KV, %s): prompt ids %d/%d, completions %d/%d exact\n", strrchr(model_path, '/') + 1,
           hr_kv_format_name(kvf), together ? "all prompts batched" : "one at a time", pass_ids, n, pass, n);
    free(logits);
    hr_model_ctx_destroy(ctx);
    hr_kv_pool_destroy(kv);
    hr_tokenizer_destroy(tok);
    hr_model_destroy(m);
    return pass;
}

/* Teacher-forced agreement: feed prompt + reference completion in one pass and count the positions
 * whose argmax is the reference's next token (no cascading after a first difference). */
static double teacher_forced_agreement(const char *model_path, vec *v, int n, hr_kv_format kvf) {
    hr_error err = {0};
    hr_model *m = NULL;
    if (hr_model_load(model_path, &m, &err)) return 0;
    const hr_hparams *hp = hr_model_hparams(m);
    hr_kv_config kc = {.n_layers = hp->n_layer,
                       .n_kv_heads = hp->n_head_kv,
                       .head_dim = hp->head_dim,
                       .block_size = 16,
                       .k_format = kvf,
                       .v_format = kvf,
                       .max_seqs = 1};
    kc.budget_bytes = hr_kv_fixed_bytes(&kc) + hr_kv_block_bytes(&kc) * 16;
    hr_kv_pool *kv = NULL;
    hr_model_ctx *ctx = NULL;
    hr_model_ctx_params mp = {.n_threads = 2, .max_batch_tokens = 128, .max_ctx = 256, .force_isa = g_isa};
    if (hr_kv_pool_create(&kc, &kv, &err) || hr_model_ctx_create(m, kv, &mp, &ctx, &err)) exit(1);
    int V = hp->n_vocab;
    float *logits = malloc(sizeof(float) * (size_t)V * 128);
    long agree = 0, total = 0;
    for (int i = 0; i < n; i++) {
        int32_t toks[128], pos[128];
        hr_kv_seq seq[128], s;
        uint8_t want[128];
        int T = v[i].np + NGEN - 1;
        memcpy(toks, v[i].ptoks, sizeof(int32_t) * v[i].np);
        memcpy(toks + v[i].np, v[i].ctoks, sizeof(int32_t) * NGEN);
        hr_kv_seq_create(kv, &s, &err);
        hr_kv_seq_reserve(kv, s, T, &err);
        for (int j = 0; j < T; j++) pos[j] = j, seq[j] = s, want[j] = j >= v[i].np - 1;
        hr_batch b = {.n_tokens = T, .tokens = toks, .pos = pos, .seq = seq, .want_logits = want};
        CHECK(hr_model_forward(ctx, &b, logits, &err) == HR_OK);
        for (int k = 0; k < NGEN; k++) agree += hr_argmax(logits + (size_t)k * V, V) == v[i].ctoks[k];
        total += NGEN;
        hr_kv_seq_free(kv, s);
    }
    free(logits);
    hr_model_ctx_destroy(ctx);
    hr_kv_pool_destroy(kv);
    hr_model_destroy(m);
    return (double)agree / (double)total;
}

int main(void) {
    g_isa = hr_test_isa();
    const char *vpath = hr_test_shared_path("vectors/stories260K-greedy.jsonl");
    const char *v8path = hr_test_shared_path("vectors/stories260K-q8_0-greedy.jsonl");
    const char *m32 = hr_test_shared_path("models/stories260K.gguf");
    const char *m8 = hr_test_shared_path("models/stories260K-q8_0.gguf");
    if (!vpath || !v8path || !m32 || !m8) HR_SKIP("../shared (stories260K models and vectors) is absent");
    vec v[MAXP], v8[MAXP];
    int n = load_vectors(vpath, v);
    CHECK(n >= 8);
    /* f32: the hard bar, every completion exact, alone and batched, with the reference engine's f16
     * KV cache (llama.cpp's default) and with an f32 one */
    run_model(m32, v, n, false, true, HR_KV_F16);
    run_model(m32, v, n, true, true, HR_KV_F16);
    run_model(m32, v, n, false, true, HR_KV_F32);
    CHECK(teacher_forced_agreement(m32, v, n, HR_KV_F16) == 1.0);
    /* q8_0: exactly what llama.cpp outputs for it (f16 KV, non-flash attention). That differs from the
     * F32 model's completions on prompts 3, 4 and 7: the q8_0 weights move near-tie logits of this
     * 64-wide model (tests/vectors/README.md), so against those only teacher-forced agreement is
     * checked (>= 98%). */
    int n8 = load_vectors(v8path, v8);
    CHECK(n8 == n);
    vec vt[MAXP];
    memset(vt, 0, sizeof vt); /* the in-tree copy of llama.cpp's q8_0 ids must be the shared file's */
    const int nt = load_vectors(HR_SOURCE_DIR "/tests/vectors/stories260K-q8_0-llamacpp.jsonl", vt);
    CHECK(nt == n8);
    for (int i = 0; i < nt && i < n8; i++) {
        CHECK(vt[i].np == v8[i].np && vt[i].nc == v8[i].nc &&
              !memcmp(vt[i].ptoks, v8[i].ptoks, sizeof(int32_t) * (size_t)vt[i].np) &&
              !memcmp(vt[i].ctoks, v8[i].ctoks, sizeof vt[i].ctoks));
        free(vt[i].prompt);
    }
    for (int i = 0; i < n8 && i < n; i++)
        CHECK(v8[i].np == v[i].np && !memcmp(v8[i].ptoks, v[i].ptoks, sizeof(int32_t) * (size_t)v[i].np));
    int32_t alone[MAXP][NGEN];
    run_model(m8, v8, n8, false, true, HR_KV_F16);
    memcpy(alone, got, sizeof alone);
    run_model(m8, v8, n8, true, true, HR_KV_F16);
    CHECK(!memcmp(alone, got, sizeof alone));
    int exact_f32ref = run_model(m8, v, n, false, false, HR_KV_F16);
    double agree8 = teacher_forced_agreement(m8, v, n, HR_KV_F16);
    printf("stories260K-q8_0.gguf: %d/%d F32-model completions exact, teacher-forced top-1 agreement %.2f%%\n",
           exact_f32ref, n, 100.0 * agree8);
    CHECK(agree8 >= 0.98);
    for (int i = 0; i < n; i++) free(v[i].prompt);
    for (int i = 0; i < n8; i++) free(v8[i].prompt);
    return hr_test_finish();
}

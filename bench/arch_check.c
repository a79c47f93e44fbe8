/* arch_check.c: headroom's greedy ids and logits on a GGUF for the 8 prompts of the architecture
 * check, optionally compared with llama.cpp's (bench/llamacpp/arch_greedy.c writes them):
 *   bench_arch_check MODEL.gguf N_CTX [LLAMACPP.bin]
 * Prompt p (0..7) has 5 + p ids, id i = 3 + (p * 131 + i * 37) % (V - 3); each runs alone (prompt as
 * one batch, then 64 greedy steps) with an f16 KV cache and one thread. Prints the ids per prompt and,
 * given llama.cpp's logits, the first step where the ids part, and the largest |difference| of the
 * logits over all steps up to there relative to the largest |logit| (the bound docs/MODELS.md states). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "model/model.h"

#define N_PROMPTS 8
#define N_GEN     64

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_arch_check MODEL.gguf N_CTX [LLAMACPP.bin]\n");
        return 2;
    }
    hr_error err = {0};
    hr_model *m = NULL;
    if (hr_model_load(argv[1], &m, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    const hr_hparams *hp = hr_model_hparams(m);
    const int V = hp->n_vocab, n_ctx = atoi(argv[2]);
    FILE *ref = argc > 3 ? fopen(argv[3], "rb") : NULL;
    float *lg = malloc(sizeof(float) * (size_t)V), *rl = malloc(sizeof(float) * (size_t)V);
    double worst = 0;
    int n_equal = 0;
    for (int p = 0; p < N_PROMPTS; p++) {
        hr_kv_config kc = {.n_layers = hp->n_layer,
                           .n_kv_heads = hp->n_head_kv,
                           .head_dim = hp->head_dim,
                           .block_size = 16,
                           .k_format = HR_KV_F16,
                           .v_format = HR_KV_F16,
                           .max_seqs = 1};
        kc.budget_bytes = hr_kv_block_bytes(&kc) * (uint64_t)((n_ctx + 15) / 16 + 1);
        hr_kv_pool *kv = NULL;
        hr_model_ctx *c = NULL;
        hr_model_ctx_params mp = {.n_threads = 1, .max_batch_tokens = 16, .max_ctx = n_ctx};
        hr_kv_seq s;
        if (hr_kv_pool_create(&kc, &kv, &err) || hr_model_ctx_create(m, kv, &mp, &c, &err) ||
            hr_kv_seq_create(kv, &s, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        int32_t toks[16], pos[16];
        hr_kv_seq seq[16];
        uint8_t want[16] = {0};
        int n = 5 + p, at = 0, parted = -1;
        for (int i = 0; i < n; i++) toks[i] = 3 + (p * 131 + i * 37) % (V - 3), pos[i] = i, seq[i] = s;
        want[n - 1] = 1;
        printf("prompt %d: ", p);
        for (int g = 0; g < N_GEN; g++) {
            static const uint8_t one = 1;
            hr_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .seq = seq, .want_logits = n == 1 ? &one : want};
            if (hr_kv_seq_reserve(kv, s, at + n, &err) || hr_model_forward(c, &b, lg, &err)) {
                fprintf(stderr, "%s\n", err.msg);
                return 1;
            }
            hr_kv_seq_commit(kv, s, toks, n);
            at += n;
            int best = 0;
            for (int v = 1; v < V; v++)
                if (lg[v] > lg[best]) best = v;
            if (ref && fread(rl, sizeof(float), (size_t)V, ref) == (size_t)V) {
                int rbest = 0;
                double md = 0, mx = 0;
                for (int v = 1; v < V; v++)
                    if (rl[v] > rl[rbest]) rbest = v;
                for (int v = 0; v < V; v++) md = fmax(md, fabs(lg[v] - rl[v])), mx = fmax(mx, fabs(rl[v]));
                if (parted < 0) worst = fmax(worst, md / mx);
                if (parted < 0 && rbest != best) parted = g;
            }
            printf("%d%s", best, g + 1 < N_GEN ? "," : "\n");
            toks[0] = best, pos[0] = at, n = 1;
        }
        if (ref) {
            if (parted < 0)
                n_equal++;
            else
                printf("prompt %d: ids part from llama.cpp's at step %d\n", p, parted);
        }
        hr_model_ctx_destroy(c);
        hr_kv_pool_destroy(kv);
    }
    if (ref) printf("ids equal on %d of %d prompts; max |logit diff| / max |logit| %.3g\n", n_equal, N_PROMPTS, worst);
    free(lg), free(rl);
    if (ref) fclose(ref);
    hr_model_destroy(m);
    return 0;
}

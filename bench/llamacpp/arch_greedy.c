/* arch_greedy.c: llama.cpp's greedy ids and logits on a GGUF, for the architecture check
 * (docs/MODELS.md). Built against a llama.cpp build by arch_check.sh, never by CMake:
 *   arch_greedy MODEL.gguf N_CTX OUT.bin
 * Runs the 8 prompts of bench/arch_check.c (prompt p: 5 + p ids, id i = 3 + (p * 131 + i * 37) %
 * (V - 3)), each in a fresh context (f16 K and V, flash attention off, one thread), prompt as one
 * batch, then 64 greedy steps; prints one line per prompt with the 64 ids, then for steps 0, 21, 42
 * and 63 a line with the 8 largest logits (id:value), and writes the 8 x 64 x V f32 logits the ids
 * were chosen from to OUT.bin. */
#include <stdio.h>
#include <stdlib.h>

#include "llama.h"

#define N_PROMPTS 8
#define N_GEN     64

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: arch_greedy MODEL.gguf N_CTX OUT.bin\n");
        return 2;
    }
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    const int V = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE *out = fopen(argv[3], "wb");
    if (!out) return 1;
    for (int p = 0; p < N_PROMPTS; p++) {
        struct llama_context_params cp = llama_context_default_params();
        cp.n_ctx = (uint32_t)atoi(argv[2]);
        cp.n_batch = cp.n_ubatch = 64;
        cp.n_seq_max = 1;
        cp.n_threads = cp.n_threads_batch = 1;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
        cp.type_k = cp.type_v = GGML_TYPE_F16;
        struct llama_context *ctx = llama_init_from_model(model, cp);
        if (!ctx) return 1;
        int32_t toks[16];
        int n = 5 + p;
        for (int i = 0; i < n; i++) toks[i] = 3 + (p * 131 + i * 37) % (V - 3);
        printf("prompt %d: ", p);
        struct llama_batch b = llama_batch_get_one(toks, n);
        char tops[4][512];
        for (int g = 0; g < N_GEN; g++) {
            if (llama_decode(ctx, b)) return 1;
            const float *lg = llama_get_logits_ith(ctx, -1);
            fwrite(lg, sizeof(float), (size_t)V, out);
            if (g % 21 == 0) { /* the 8 largest, by repeated selection */
                int top[8], len = 0;
                for (int r = 0; r < 8; r++) {
                    top[r] = -1;
                    for (int v = 0; v < V; v++) {
                        int taken = 0;
                        for (int q = 0; q < r; q++) taken |= top[q] == v;
                        if (!taken && (top[r] < 0 || lg[v] > lg[top[r]])) top[r] = v;
                    }
                    len += snprintf(tops[g / 21] + len, sizeof tops[0] - (size_t)len, "%s%d:%.9g", r ? " " : "", top[r],
                                    lg[top[r]]);
                }
            }
            int best = 0;
            for (int v = 1; v < V; v++)
                if (lg[v] > lg[best]) best = v;
            printf("%d%s", best, g + 1 < N_GEN ? "," : "\n");
            static int32_t next;
            next = best;
            b = llama_batch_get_one(&next, 1);
        }
        for (int k = 0; k < 4; k++) printf("top %d step %d: %s\n", p, 21 * k, tops[k]);
        llama_free(ctx);
    }
    fclose(out);
    llama_model_free(model);
    return 0;
}

/* kv_memory.c: how many sequences a KV byte budget holds, per format, against contiguous
 * per-sequence allocation of the maximum context (llama.cpp's slots), and the waste paging leaves
 * under a mixed-length workload. Pure accounting through the real block pool: no model runs.
 *
 * usage: bench_kv_memory [BUDGET] [SEQ_TOKENS] [MAX_CTX]    (defaults 1GiB 1024 2048)
 *        bench_kv_memory --fill BUDGET FORMAT [none]    create a pool and write every slot of every
 *        block through hr_kv_write ("none": create only), then print the budget and VmHWM (peak RSS);
 *        bench/kv_bench.sh runs it under /usr/bin/time -v.
 * Shape: TinyLlama-1.1B (22 layers, 4 KV heads, head dim 64), block size 16. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "kv/kv.h"

static bool kv_fmt_stage(hr_kv_format f) { return f == HR_KV_Q4 || f == HR_KV_KIVI2; }

static hr_kv_config shape(hr_kv_format k, hr_kv_format v, uint64_t budget, int max_seqs) {
    return (hr_kv_config){.n_layers = 22,
                          .n_kv_heads = 4,
                          .head_dim = 64,
                          .block_size = 16,
                          .k_format = k,
                          .v_format = v,
                          .budget_bytes = budget,
                          .max_seqs = max_seqs};
}

/* Concurrent sequences of n_tokens each that fit, as in decode: every sequence has n_tokens
 * committed and one more slot reserved for the token it generates next. Sequences are built the way
 * the engine builds them (reserve a block, commit it), so for q4/kivi2 a block holds its f16 tail
 * buffer only while it is being filled: a decoding sequence holds exactly one, and the pool is
 * created with one per sequence (stage_blocks): the buffers come out of the same budget, so start
 * from the analytic count and lower stage_blocks to what fits until it is stable. Accounting only: commits without
 * hr_kv_write, so run a Release build (debug builds assert that every layer was written). */
static int fit_sequences(hr_kv_format f, uint64_t budget, int n_tokens, uint64_t *fixed_out) {
    hr_kv_config c = shape(f, f, budget, 1);
    uint64_t blocks_per_seq = (uint64_t)n_tokens / 16 + 1; /* n_tokens + 1 slots */
    uint64_t per_seq = blocks_per_seq * hr_kv_block_bytes(&c) + hr_kv_stage_block_bytes(&c);
    int guess = (int)(budget / per_seq) + 1;
    int32_t *toks = calloc((size_t)n_tokens, sizeof *toks);
    int n = 0;
    for (int iter = 0; iter < 4 && toks; iter++) {
        c = shape(f, f, budget, guess + 1);
        if (kv_fmt_stage(f)) c.stage_blocks = guess;
        hr_kv_pool *p = NULL;
        hr_error err;
        if (hr_kv_pool_create(&c, &p, &err) != HR_OK) {
            fprintf(stderr, "%s: %s\n", hr_kv_format_name(f), err.msg);
            free(toks);
            return -1;
        }
        n = 0;
        for (bool ok = true; ok;) {
            hr_kv_seq s;
            if (hr_kv_seq_create(p, &s, NULL) != HR_OK) break;
            for (int t = 0; ok && t < n_tokens; t += 16) {
                int m = n_tokens - t < 16 ? n_tokens - t : 16;
                ok = hr_kv_seq_reserve(p, s, t + m, NULL) == HR_OK;
                if (ok) hr_kv_seq_commit(p, s, toks + t, m);
            }
            ok = ok && hr_kv_seq_reserve(p, s, n_tokens + 1, NULL) == HR_OK; /* the next token's slot */
            if (ok) n++;
        }
        *fixed_out = hr_kv_fixed_bytes(&c);
        hr_kv_pool_destroy(p);
        /* with one buffer per sequence that fits, fewer buffers leave room for more blocks */
        if (!kv_fmt_stage(f) || n >= guess || n < 1) break;
        guess = n;
    }
    free(toks);
    return n;
}

/* Peak RSS of a process holding one pool of `budget` bytes, filled (every block written) or not. */
static int fill_pool(const char *budget_s, const char *fmt_s, bool fill) {
    uint64_t budget;
    hr_kv_format f;
    hr_error err;
    if (hr_parse_size(budget_s, &budget, &err) != HR_OK || hr_kv_format_parse(fmt_s, &f, &err) != HR_OK) {
        fprintf(stderr, "bench_kv_memory: %s\n", err.msg);
        return 2;
    }
    hr_kv_config c = shape(f, f, budget, 4096);
    if (kv_fmt_stage(f)) c.stage_blocks = 4;
    hr_kv_pool *p = NULL;
    if (hr_kv_pool_create(&c, &p, &err) != HR_OK) {
        fprintf(stderr, "bench_kv_memory: %s\n", err.msg);
        return 1;
    }
    long tokens = 0;
    float kv[4 * 64];
    for (int i = 0; i < 4 * 64; i++) kv[i] = (float)(i % 13) - 6.0f;
    for (int32_t tok = 0; fill;) { /* sequences of up to 2048 tokens, a block at a time, until full */
        hr_kv_seq s;
        if (hr_kv_seq_create(p, &s, NULL) != HR_OK) break;
        int n = 0;
        for (; n < 2048; n += 16) {
            if (hr_kv_seq_reserve(p, s, n + 16, NULL) != HR_OK) break;
            for (int t = n; t < n + 16; t++)
                for (int l = 0; l < 22; l++) hr_kv_write(p, l, s, t, kv, kv);
            int32_t toks[16];
            for (int t = 0; t < 16; t++) toks[t] = tok++;
            hr_kv_seq_commit(p, s, toks, 16);
        }
        tokens += n;
        if (n < 2048) break;
    }
    char b1[32], b2[32], b3[32];
    hr_kv_pool_ledger l;
    hr_kv_pool_get_ledger(p, &l);
    printf("format %s, budget %s, pool %s in %d blocks (+ %s tail buffers), %ld tokens written\n", fmt_s,
           hr_format_size(budget, b1, sizeof b1), hr_format_size(l.bytes_total, b2, sizeof b2), l.blocks_total,
           hr_format_size(hr_kv_fixed_bytes(&c), b3, sizeof b3), tokens);
    FILE *st = fopen("/proc/self/status", "r");
    char line[256];
    while (st && fgets(line, sizeof line, st))
        if (!strncmp(line, "VmHWM:", 6) || !strncmp(line, "VmRSS:", 6)) printf("%s", line);
    if (st) fclose(st);
    hr_kv_pool_destroy(p);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "--fill"))
        return fill_pool(argv[2], argv[3], !(argc > 4 && !strcmp(argv[4], "none")));
    uint64_t budget = 1ull << 30;
    int seq_tokens = argc > 2 ? atoi(argv[2]) : 1024, max_ctx = argc > 3 ? atoi(argv[3]) : 2048;
    hr_error err;
    if (argc > 1 && hr_parse_size(argv[1], &budget, &err) != HR_OK) {
        fprintf(stderr, "bench_kv_memory: %s\n", err.msg);
        return 2;
    }
    if (seq_tokens < 1 || max_ctx < seq_tokens) {
        fprintf(stderr, "usage: bench_kv_memory [BUDGET] [SEQ_TOKENS] [MAX_CTX >= SEQ_TOKENS]\n");
        return 2;
    }
    char b[32];
    printf("budget %s, TinyLlama-1.1B shape (22 layers x 4 KV heads x 64), block 16, %d-token sequences\n\n",
           hr_format_size(budget, b, sizeof b), seq_tokens);
    /* contiguous: every admitted sequence reserves max_ctx tokens of f16 up front */
    hr_kv_config f16c = shape(HR_KV_F16, HR_KV_F16, budget, 1);
    double f16_token = (double)hr_kv_block_bytes(&f16c) / 16.0;
    int contiguous = (int)(budget / (uint64_t)(f16_token * max_ctx));
    printf("%-26s %14s %12s %10s %18s\n", "layout / format", "bytes/token", "sequences", "vs contig",
           "contig same format");
    printf("%-26s %14.0f %12d %9.2fx\n", "contiguous f16 (max ctx)", f16_token, contiguous, 1.0);
    static const hr_kv_format fmts[] = {HR_KV_F16, HR_KV_BF16, HR_KV_Q8, HR_KV_FP8, HR_KV_Q4, HR_KV_KIVI2};
    for (size_t i = 0; i < HR_ARRAY_LEN(fmts); i++) {
        uint64_t fixed = 0;
        int n = fit_sequences(fmts[i], budget, seq_tokens, &fixed);
        hr_kv_config c = shape(fmts[i], fmts[i], budget, 1);
        char label[48];
        snprintf(label, sizeof label, "paged %s", hr_kv_format_name(fmts[i]));
        double tok_bytes = (double)hr_kv_block_bytes(&c) / 16.0;
        printf("%-26s %14.1f %12d %9.2fx %18d", label, tok_bytes, n, contiguous ? (double)n / contiguous : 0.0,
               (int)((double)budget / (tok_bytes * max_ctx)));
        if (fixed) printf("   (incl. %s of f16 tail buffers)", hr_format_size(fixed, b, sizeof b));
        printf("\n");
    }

    /* waste under a mixed workload: sequences of 64..2048 tokens admitted until the pool is full */
    hr_kv_config c = shape(HR_KV_F16, HR_KV_F16, budget, 4096);
    hr_kv_pool *p = NULL;
    if (hr_kv_pool_create(&c, &p, &err) != HR_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    hr_rng rng;
    hr_rng_seed(&rng, 1);
    long tokens = 0;
    int n = 0;
    for (;;) {
        int len = 64 + (int)(hr_rng_uniform(&rng) * (2048 - 64 + 1));
        hr_kv_seq s;
        if (hr_kv_seq_create(p, &s, NULL) != HR_OK) break;
        if (hr_kv_seq_reserve(p, s, len, NULL) != HR_OK) {
            hr_kv_seq_free(p, s);
            break;
        }
        /* fill the slots as a real run would: commit every token */
        int32_t *toks = malloc(sizeof(int32_t) * (size_t)len);
        for (int t = 0; t < len; t++) toks[t] = (int32_t)(hr_rng_next(&rng) % 32000);
        hr_kv_seq_commit(p, s, toks, len);
        free(toks);
        tokens += len;
        n++;
    }
    hr_kv_pool_ledger l;
    hr_kv_pool_get_ledger(p, &l);
    double slots = (double)l.blocks_used * 16.0;
    printf("\nmixed workload (lengths uniform in 64..2048, f16): %d sequences, %ld tokens in %d of %d blocks\n", n,
           tokens, l.blocks_used, l.blocks_total);
    printf("waste (allocated slots not filled): %llu slots = %.2f%% of used slots, %.2f%% of the pool (%s)\n",
           (unsigned long long)l.waste_slots, 100.0 * (double)l.waste_slots / slots,
           100.0 * (double)l.waste_bytes / (double)l.bytes_total, hr_format_size(l.waste_bytes, b, sizeof b));
    printf("contiguous slots of %d tokens would hold %d of these sequences, wasting %.1f%% of their reservation\n",
           max_ctx, contiguous, 100.0 * (1.0 - (double)(64 + 2048) / 2.0 / (double)max_ctx));
    hr_kv_pool_destroy(p);
    return 0;
}

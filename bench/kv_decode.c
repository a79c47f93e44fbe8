/* kv_decode.c: decode attention time per token for every KV format, through the real pool API
 * (hr_kv_pool_create, hr_kv_seq_*, hr_kv_write, hr_kv_attention), on a TinyLlama-1.1B-shaped cache:
 * 22 layers, 32 query heads over 4 KV heads, head_dim 64, block 16.
 *
 * One pool per format holds one sequence of MAX_CTX tokens (random K/V with a few outlier key
 * channels). A "token" is one query of 32 heads attending in each of the 22 layers, at n_ctx 1024 and
 * MAX_CTX. Rounds visit every (format, context) in turn, so load from other processes falls on all of
 * them alike; each figure is the median over rounds, printed beside its ratio to f16 from the same
 * rounds. GB/s counts the cache bytes a token reads once (n_ctx x bytes/token). The pools are configured
 * as the runtime configures them (q_per_kv = 8: a KV head's query heads together where the format has
 * group kernels); "apart" is the same token with the heads asked one at a time
 * (hr_kv_attention_heads per head: each query head reads its KV head's blocks again, from cache), as
 * its time over the grouped one in the same rounds. One thread. Also printed: hr_kv_write time per
 * token (all layers), where the encoders show up.
 *
 * usage: bench_kv_decode [ROUNDS] [MAX_CTX] [--scalar]    (defaults 9 4096) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/util.h"
#include "kv/kv.h"

enum { L = 22, H = 32, HKV = 4, D = 64, BS = 16, N_CTX = 2 };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct bench_fmt {
    hr_kv_format f;
    hr_kv_pool *pool;
    hr_kv_seq seq;
    double bytes_per_token;
    double write_ms; /* hr_kv_write, all layers, per token */
} bench_fmt;

enum { N_NORMALS = 1 << 16 };
static float normals[N_NORMALS + 2 * HKV * D]; /* N(0,1) samples; K/V rows are windows into them */

/* A pool holding exactly one sequence of max_ctx tokens, filled with deterministic random data. */
static int fill(bench_fmt *b, int max_ctx, bool scalar, hr_rng *rng) {
    hr_kv_config c = {.n_layers = L,
                      .n_kv_heads = HKV,
                      .head_dim = D,
                      .block_size = BS,
                      .k_format = b->f,
                      .v_format = b->f,
                      .max_seqs = 1,
                      .q_per_kv = H / HKV,
                      .force_scalar = scalar,
                      .stage_blocks = 2};
    uint64_t n_blocks = (uint64_t)(max_ctx + BS - 1) / BS;
    c.budget_bytes = hr_kv_fixed_bytes(&c) + n_blocks * hr_kv_block_bytes(&c);
    b->bytes_per_token = (double)hr_kv_block_bytes(&c) / BS;
    hr_error err = {0};
    if (hr_kv_pool_create(&c, &b->pool, &err) != HR_OK || hr_kv_seq_create(b->pool, &b->seq, &err) != HR_OK) {
        fprintf(stderr, "bench_kv_decode: %s: %s\n", hr_kv_format_name(b->f), err.msg);
        return -1;
    }
    float k[HKV * D], v[HKV * D];
    double t_write = 0.0;
    for (int pos = 0; pos < max_ctx; pos++) {
        if (hr_kv_seq_reserve(b->pool, b->seq, pos + 1, &err) != HR_OK) {
            fprintf(stderr, "bench_kv_decode: %s: %s\n", hr_kv_format_name(b->f), err.msg);
            return -1;
        }
        for (int layer = 0; layer < L; layer++) {
            const float *x = normals + hr_rng_next(rng) % N_NORMALS;
            for (int i = 0; i < HKV * D; i++) {
                float off = (i % D) % 17 == 3 ? 4.0f : 0.0f; /* outlier key channels */
                k[i] = off + x[i];
                v[i] = x[HKV * D + i];
            }
            double t0 = now_s();
            hr_kv_write(b->pool, layer, b->seq, pos, k, v);
            t_write += now_s() - t0;
        }
        int32_t tok = pos % 32000;
        hr_kv_seq_commit(b->pool, b->seq, &tok, 1);
    }
    b->write_ms = 1e3 * t_write / max_ctx;
    return 0;
}

/* One decode token: attention of 32 query heads at n_ctx in every layer, the heads in one call or
 * (apart) one call each. Returns seconds. */
static double decode_token(const bench_fmt *b, int n_ctx, const float *q, float *out, float *scratch, bool apart) {
    double t0 = now_s();
    for (int layer = 0; layer < L; layer++) {
        const float *ql = q + (size_t)layer * H * D;
        if (!apart)
            hr_kv_attention(b->pool, layer, b->seq, n_ctx, ql, H, 0.125f, out, scratch);
        else
            for (int h = 0; h < H; h++)
                hr_kv_attention_heads(b->pool, layer, b->seq, n_ctx, ql, H, h, h + 1, 0.125f, NULL, out, scratch);
    }
    return now_s() - t0;
}

int main(int argc, char **argv) {
    int rounds = 9, max_ctx = 4096;
    bool scalar = false;
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--scalar") == 0)
            scalar = true;
        else if (npos++ == 0)
            rounds = atoi(argv[i]);
        else
            max_ctx = atoi(argv[i]);
    }
    if (rounds < 1 || max_ctx < 1024) {
        fprintf(stderr, "usage: bench_kv_decode [ROUNDS >= 1] [MAX_CTX >= 1024] [--scalar]\n");
        return 2;
    }
    static const hr_kv_format fmts[] = {HR_KV_F16, HR_KV_F32, HR_KV_BF16,  HR_KV_Q8,
                                        HR_KV_FP8, HR_KV_Q4,  HR_KV_KIVI2, HR_KV_Q4H};
    enum { NF = sizeof fmts / sizeof fmts[0] };
    const int ctxs[N_CTX] = {1024, max_ctx};
    bench_fmt bf[NF];
    hr_rng rng;
    hr_rng_seed(&rng, 4);
    for (int i = 0; i < N_NORMALS + 2 * HKV * D; i++) normals[i] = hr_rng_normal(&rng);
    for (int i = 0; i < NF; i++) {
        bf[i] = (bench_fmt){.f = fmts[i]};
        if (fill(&bf[i], max_ctx, scalar, &rng) != 0) return 1;
    }
    float *q = malloc(sizeof(float) * L * H * D), *out = malloc(sizeof(float) * H * D);
    size_t n_scratch = hr_kv_attention_scratch_floats(bf[0].pool, max_ctx);
    for (int i = 1; i < NF; i++) {
        size_t s = hr_kv_attention_scratch_floats(bf[i].pool, max_ctx);
        if (s > n_scratch) n_scratch = s;
    }
    float *scratch = malloc(sizeof(float) * n_scratch);
    double *t = malloc(sizeof(double) * (size_t)rounds * NF * N_CTX);
    double *ratio = malloc(sizeof(double) * (size_t)rounds * NF * N_CTX);
    double *apart = malloc(sizeof(double) * (size_t)rounds * NF * N_CTX);
    if (!q || !out || !scratch || !t || !ratio || !apart) return 1;
    for (int i = 0; i < L * H * D; i++) q[i] = hr_rng_normal(&rng);

    /* tokens per measurement: enough for ~10 ms of work at the largest context */
    int reps[N_CTX];
    for (int ci = 0; ci < N_CTX; ci++) reps[ci] = ci == 0 ? 4 * max_ctx / 1024 : 2;
    for (int i = 0; i < NF; i++) decode_token(&bf[i], max_ctx, q, out, scratch, false); /* warm up */
    for (int r = 0; r < rounds; r++)
        for (int ci = 0; ci < N_CTX; ci++)
            for (int i = 0; i < NF; i++) {
                double s = 0.0, sa = 0.0;
                for (int k = 0; k < reps[ci]; k++) {
                    s += decode_token(&bf[i], ctxs[ci], q, out, scratch, false);
                    sa += decode_token(&bf[i], ctxs[ci], q, out, scratch, true);
                }
                t[((size_t)ci * NF + i) * rounds + r] = s / reps[ci];
                apart[((size_t)ci * NF + i) * rounds + r] = sa / s;
            }
    for (int r = 0; r < rounds; r++)
        for (int ci = 0; ci < N_CTX; ci++)
            for (int i = 0; i < NF; i++)
                ratio[((size_t)ci * NF + i) * rounds + r] =
                    t[((size_t)ci * NF + i) * rounds + r] / t[((size_t)ci * NF + 0) * rounds + r];

    printf("decode attention, TinyLlama-1.1B shape (%d layers, %d query / %d KV heads, head_dim %d, block %d),\n"
           "one thread, %s kernels, medians of %d rounds; ratio = time / f16 time in the same round;\n"
           "apart = time with the query heads one at a time / time with a KV head's heads together\n\n",
           L, H, HKV, D, BS, hr_kv_pool_isa(bf[0].pool), rounds);
    printf("%-6s %9s %9s", "format", "B/token", "write us");
    for (int ci = 0; ci < N_CTX; ci++) printf(" | %5d: ms/tok   GB/s  vs f16  apart", ctxs[ci]);
    printf("\n");
    for (int i = 0; i < NF; i++) {
        printf("%-6s %9.0f %9.1f", hr_kv_format_name(bf[i].f), bf[i].bytes_per_token, 1e3 * bf[i].write_ms);
        for (int ci = 0; ci < N_CTX; ci++) {
            double ms = 1e3 * median(t + ((size_t)ci * NF + i) * rounds, rounds);
            double rt = median(ratio + ((size_t)ci * NF + i) * rounds, rounds);
            double gbs = bf[i].bytes_per_token * ctxs[ci] / (ms * 1e-3) / 1e9;
            double ap = median(apart + ((size_t)ci * NF + i) * rounds, rounds);
            printf(" |        %7.3f %6.1f %6.2fx %5.2fx", ms, gbs, rt, ap);
        }
        printf("\n");
    }
    for (int i = 0; i < NF; i++) hr_kv_pool_destroy(bf[i].pool);
    free(q);
    free(out);
    free(scratch);
    free(t);
    free(ratio);
    free(apart);
    return 0;
}

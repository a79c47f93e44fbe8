/* kv_remote_bw.c: GB/s of the Redis KV tier's own path (src/remote) to and from a Redis server:
 * a pool of a real model's KV shape (Llama-3-8B by default: 32 layers, 8 KV heads of 128, f16, blocks
 * of 16 tokens = 2 MiB per block) commits N full blocks, the tier writes them (timed from the first
 * block queued to the last acknowledged), then a second pool takes the same prefix with
 * hr_kv_seq_share_prefix, which fetches and checks every block (timed). The K/V bytes are whatever
 * the arena holds (zeros): speed does not depend on them.
 *
 *   bench_kv_remote_bw redis://127.0.0.1:PORT [n_blocks (64)] [layers (32)] [kv_heads (8)] [head_dim (128)] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv/kv.h"
#include "remote/kv_remote.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static hr_kv_pool *make_pool(const hr_kv_config *c) {
    hr_kv_pool *p = NULL;
    hr_error err = {0};
    if (hr_kv_pool_create(c, &p, &err) != HR_OK) {
        fprintf(stderr, "bench_kv_remote_bw: %s\n", err.msg);
        exit(1);
    }
    return p;
}

static hr_kv_remote *make_remote(const char *url, hr_kv_pool *pool) {
    hr_kv_remote_params rp = {
        .url = url, .model_id = "bench", .pool = pool, .timeout_ms = 5000, .queue_bytes = 4ull << 30};
    hr_kv_remote *r = NULL;
    hr_error err = {0};
    if (hr_kv_remote_create(&rp, &r, &err) != HR_OK) {
        fprintf(stderr, "bench_kv_remote_bw: %s\n", err.msg);
        exit(1);
    }
    return r;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_kv_remote_bw redis://HOST:PORT [n_blocks] [layers] [kv_heads] [head_dim]\n");
        return 2;
    }
    int n_blocks = argc > 2 ? atoi(argv[2]) : 64;
    hr_kv_config c = {.n_layers = argc > 3 ? atoi(argv[3]) : 32,
                      .n_kv_heads = argc > 4 ? atoi(argv[4]) : 8,
                      .head_dim = argc > 5 ? atoi(argv[5]) : 128,
                      .block_size = 16,
                      .k_format = HR_KV_F16,
                      .v_format = HR_KV_F16,
                      .max_seqs = 2};
    uint64_t bb = hr_kv_block_bytes(&c);
    c.budget_bytes = bb * (uint64_t)(n_blocks + 2) + hr_kv_fixed_bytes(&c);
    int n_tokens = n_blocks * c.block_size + 1;
    int32_t *tokens = malloc(sizeof *tokens * (size_t)n_tokens);
    for (int i = 0; i < n_tokens; i++) tokens[i] = (int32_t)(i * 7919 % 32000) + (int32_t)time(NULL) % 1000;
    hr_error err = {0};

    /* write: one pool commits the blocks; the observer queues them; flush waits for the acks */
    hr_kv_pool *a = make_pool(&c);
    hr_kv_remote *ra = make_remote(argv[1], a);
    hr_kv_observer oa = hr_kv_remote_observer(ra);
    oa.fetch = NULL;
    hr_kv_pool_set_observer(a, &oa, &err);
    hr_kv_seq s;
    hr_kv_seq_create(a, &s, &err);
    if (hr_kv_seq_reserve(a, s, n_tokens, &err) != HR_OK) {
        fprintf(stderr, "bench_kv_remote_bw: %s\n", err.msg);
        return 1;
    }
    double t0 = now_s();
    hr_kv_seq_commit(a, s, tokens, n_tokens);
    hr_kv_remote_flush(ra, 600000);
    double t_write = now_s() - t0;
    hr_kv_remote_stats sa;
    hr_kv_remote_get_stats(ra, &sa);

    /* read: a second pool takes the prefix; every block is fetched and checked */
    hr_kv_pool *b = make_pool(&c);
    hr_kv_remote *rb = make_remote(argv[1], b);
    hr_kv_observer ob = hr_kv_remote_observer(rb);
    ob.stored = NULL;
    hr_kv_pool_set_observer(b, &ob, &err);
    hr_kv_seq sb;
    hr_kv_seq_create(b, &sb, &err);
    int cached = 0;
    t0 = now_s();
    hr_kv_seq_share_prefix(b, sb, tokens, n_tokens, &cached, &err);
    double t_read = now_s() - t0;
    hr_kv_remote_stats st;
    hr_kv_remote_get_stats(rb, &st);

    double gb = (double)bb * n_blocks / 1e9;
    printf("block %.2f MiB (%d layers x %d KV heads x %d, f16, 16 tokens), %d blocks = %.3f GB\n", bb / 1048576.0,
           c.n_layers, c.n_kv_heads, c.head_dim, n_blocks, gb);
    printf("write: %llu blocks stored in %.3f s = %.2f GB/s (queue on the engine thread, SET data then meta)\n",
           (unsigned long long)sa.stored, t_write, (double)sa.stored * bb / 1e9 / t_write);
    printf("read:  %llu blocks fetched and checked in %.3f s = %.2f GB/s (MGET meta+data per block)\n",
           (unsigned long long)st.fetched, t_read, (double)st.fetched * bb / 1e9 / t_read);
    int rc = (sa.stored == (uint64_t)n_blocks && st.fetched == (uint64_t)n_blocks && cached == n_blocks * 16) ? 0 : 1;
    if (rc)
        fprintf(stderr, "bench_kv_remote_bw: not every block went through (stored %llu, fetched %llu)\n",
                (unsigned long long)sa.stored, (unsigned long long)st.fetched);
    hr_kv_pool_set_observer(a, NULL, NULL);
    hr_kv_pool_set_observer(b, NULL, NULL);
    hr_kv_remote_destroy(ra);
    hr_kv_remote_destroy(rb);
    hr_kv_pool_destroy(a);
    hr_kv_pool_destroy(b);
    free(tokens);
    return rc;
}

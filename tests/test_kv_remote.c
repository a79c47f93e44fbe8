/* test_kv_remote.c: the Redis KV tier against a real redis-server started here (loopback, a free port,
 * maxmemory + allkeys-lru, no persistence; skipped with 77 when redis-server is absent). On the demo
 * model, greedy:
 *   - a warm runtime writes its prompt's full blocks; a cold one (its own pool) fetches them and gives
 *     exactly the tokens a runtime without the tier gives;
 *   - blocks whose bytes were altered, or whose data and metadata were swapped with another block's,
 *     are rejected and recomputed (same tokens, nothing fetched);
 *   - a pool with another K/V format finds nothing to use;
 *   - Redis killed in the middle of a prefix (after 3 fetched blocks) degrades to recompute: the
 *     request completes with the same tokens;
 *   - a bad URL and an unreachable Redis are errors naming them.
 *   - a hybrid pool (gemma2-tiny, f32: a 16-token window group beside a full one): the warm runtime
 *     writes both groups' blocks (10 each), the cold one fetches the full group's 9 prompt blocks and
 *     only the window group's block its window still sees (10 blocks, not 18: the holes stay holes),
 *     the pool's per-group invariants hold, and the tokens equal a runtime's without the tier. */
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "remote/kv_remote.h"
#include "runtime/runtime_parts.h"

enum { N_PROMPT = 150, N_OUT = 12, BS = 16 };

static pid_t redis_pid = -1;
static int redis_port;

static void redis_kill(void) {
    if (redis_pid > 0) {
        kill(redis_pid, SIGKILL);
        waitpid(redis_pid, NULL, 0);
        redis_pid = -1;
    }
}

static const hr_rt_synth *rig_synth; /* a synthetic model instead of the demo one (the hybrid case) */

static bool redis_start(void) {
    redis_port = hr_test_free_port();
    char port[16];
    snprintf(port, sizeof port, "%d", redis_port);
    fflush(stdout); /* the child's freopen would write what is buffered a second time */
    redis_pid = fork();
    if (redis_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* gone with this test, even when it crashes: no orphan holds ctest's pipe */
        freopen("/dev/null", "w", stdout);
        execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly",
               "no", "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 100; i++) { /* up to 10 s for it to answer */
        struct timeval tv = {0, 200000};
        redisContext *c = redisConnectWithTimeout("127.0.0.1", redis_port, tv);
        bool ok = c && !c->err;
        if (c) redisFree(c);
        if (ok) return true;
        int st;
        if (waitpid(redis_pid, &st, WNOHANG) == redis_pid) {
            redis_pid = -1;
            return false;
        }
        struct timespec d = {0, 100000000};
        nanosleep(&d, NULL);
    }
    return false;
}

/* ---- a runtime with (or without) the tier -------------------------------------------------------- */

typedef struct rig {
    hr_runtime *rt;
    hr_kv_remote *remote;
    int fetch_calls, kill_after; /* kill Redis when this many fetches succeeded (0: never) */
} rig;

static bool rig_fetch(void *ctx, const hr_kv_block_info *b, void *out, uint64_t n) {
    rig *g = ctx;
    bool ok = hr_kv_remote_fetch(g->remote, b, out, n);
    if (ok && g->kill_after && ++g->fetch_calls == g->kill_after) redis_kill(); /* mid-transfer */
    return ok;
}
static void rig_stored(void *ctx, const hr_kv_block_info *b) { hr_kv_remote_on_stored(((rig *)ctx)->remote, b); }

/* the device the rigs open on: NULL (the CPU), or "cuda" through rig_driver */
static const char *rig_device, *rig_driver;

static bool rig_open(rig *g, bool tier, hr_kv_format fmt, const char *model_id) {
    memset(g, 0, sizeof *g);
    hr_runtime_params p = hr_runtime_default_params();
    p.device = rig_device;
    p.cuda_driver = rig_driver;
    if (rig_device) p.kv_budget = 4u << 20; /* the arena's KV part: the GPU's size does not matter here */
    p.n_ctx = 256;
    p.block_size = BS;
    p.k_format = p.v_format = (hr_rt_kv_format)fmt;
    p.synth = rig_synth;
    p.raw_ids = rig_synth != NULL; /* its tokenizer is not the point: the ids go in as they are */
    hr_error err = {0};
    bool bad = false;
    CHECKF(hr_runtime_open(&p, &g->rt, &bad, &err) == HR_OK, "%s", err.msg);
    if (!g->rt || !tier) return g->rt != NULL;
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", redis_port);
    hr_kv_remote_params rp = {.url = url, .model_id = model_id, .pool = hr_runtime_kv(g->rt)};
    CHECKF(hr_kv_remote_create(&rp, &g->remote, &err) == HR_OK, "%s", err.msg);
    if (!g->remote) return false;
    hr_kv_observer obs = {.stored = rig_stored, .fetch = rig_fetch, .ctx = g};
    CHECK(hr_kv_pool_set_observer(hr_runtime_kv(g->rt), &obs, &err) == HR_OK);
    return true;
}

static void rig_close(rig *g) {
    if (g->rt) hr_kv_pool_set_observer(hr_runtime_kv(g->rt), NULL, NULL);
    hr_kv_remote_destroy(g->remote);
    hr_runtime_close(g->rt);
}

/* Greedy completion of the shared prompt; out gets N_OUT ids. Returns the fetched prompt tokens. */
static uint64_t rig_run(rig *g, int32_t *out) {
    int32_t prompt[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = 3 + (i * 37) % 200;
    hr_rt_request_params rp = {.prompt_ids = prompt, .n_prompt_ids = N_PROMPT, .max_tokens = N_OUT, .ignore_eos = true};
    rp.sampling = hr_rt_sampling_default();
    rp.sampling.temperature = 0;
    hr_rt_request *r = NULL;
    hr_error err = {0};
    CHECKF(hr_runtime_submit(g->rt, &rp, &r, &err) == HR_OK, "%s", err.msg);
    if (!r) return 0;
    CHECKF(hr_runtime_run_until_idle(g->rt, &err) == HR_OK, "%s", err.msg);
    hr_rt_result res;
    hr_rt_request_result(r, &res);
    CHECKF(res.state == HR_RT_COMPLETED && res.n_ids == N_OUT, "state %d, %d ids", (int)res.state, res.n_ids);
    for (int i = 0; i < N_OUT; i++) out[i] = i < res.n_ids ? res.ids[i] : -1;
    hr_rt_request_release(g->rt, r);
    if (g->remote) CHECK(hr_kv_remote_flush(g->remote, 10000));
    hr_kv_pool_ledger led;
    hr_kv_pool_get_ledger(hr_runtime_kv(g->rt), &led);
    return led.fetched_tokens_total;
}

static void redis_each(const char *pattern, void (*fn)(redisContext *c, char **keys, size_t n)) {
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", redis_port, tv);
    if (!c || c->err) {
        CHECK(false);
        if (c) redisFree(c);
        return;
    }
    redisReply *r = redisCommand(c, "KEYS %s", pattern);
    if (r && r->type == REDIS_REPLY_ARRAY) {
        char **keys = calloc(r->elements + 1, sizeof *keys);
        for (size_t i = 0; i < r->elements; i++) keys[i] = r->element[i]->str;
        fn(c, keys, r->elements);
        free(keys);
    }
    if (r) freeReplyObject(r);
    redisFree(c);
}

static void flip_bytes(redisContext *c, char **keys, size_t n) { /* one byte of every block's data */
    for (size_t i = 0; i < n; i++) {
        redisReply *r = redisCommand(c, "GET %s", keys[i]);
        if (r && r->type == REDIS_REPLY_STRING && r->len > 100) {
            r->str[100] ^= 0x40;
            redisReply *w = redisCommand(c, "SET %s %b", keys[i], r->str, r->len);
            if (w) freeReplyObject(w);
        }
        if (r) freeReplyObject(r);
    }
}

static void swap_blocks(redisContext *c, char **keys, size_t n) { /* block i takes block i+1's keys' values */
    CHECK(n >= 2);
    for (size_t i = 0; i + 1 < n; i += 2) {
        char a[64], b[64];
        for (int k = 0; k < 2; k++) {
            const char *suffix = k ? "d" : "m";
            snprintf(a, sizeof a, "%.*s:%s", (int)strlen(keys[i]) - 2, keys[i], suffix);
            snprintf(b, sizeof b, "%.*s:%s", (int)strlen(keys[i + 1]) - 2, keys[i + 1], suffix);
            redisReply *r = redisCommand(c, "RENAME %s hrtest:tmp", a);
            if (r) freeReplyObject(r);
            r = redisCommand(c, "RENAME %s %s", b, a);
            if (r) freeReplyObject(r);
            r = redisCommand(c, "RENAME hrtest:tmp %s", b);
            if (r) freeReplyObject(r);
        }
    }
}

static void flush_all(redisContext *c, char **keys, size_t n) {
    (void)keys, (void)n;
    redisReply *r = redisCommand(c, "FLUSHALL");
    if (r) freeReplyObject(r);
}

int main(void) {
    if (system("command -v redis-server > /dev/null 2>&1") != 0)
        HR_SKIP("redis-server is absent (apt-get install redis-server)");
    hr_error err = {0};
    hr_kv_remote *bad = NULL;
    rig probe;
    CHECK(rig_open(&probe, false, HR_KV_F16, NULL));
    hr_kv_remote_params bp = {.url = "http://127.0.0.1:6379", .pool = hr_runtime_kv(probe.rt)};
    CHECK(hr_kv_remote_create(&bp, &bad, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "http://127.0.0.1:6379"));
    char unreachable[64];
    snprintf(unreachable, sizeof unreachable, "redis://127.0.0.1:%d", hr_test_free_port());
    bp.url = unreachable;
    CHECK(hr_kv_remote_create(&bp, &bad, &err) == HR_ERR_IO && strstr(err.msg, unreachable) && !bad);
    int32_t want[N_OUT], got[N_OUT];
    rig_run(&probe, want); /* the single process, no tier */
    rig_close(&probe);

    if (!redis_start()) {
        redis_kill();
        HR_SKIP("redis-server did not start");
    }
    rig warm, cold;
    /* warm writes, cold fetches: the same tokens */
    CHECK(rig_open(&warm, true, HR_KV_F16, "demo-model"));
    CHECK(rig_run(&warm, got) == 0);
    CHECK(!memcmp(got, want, sizeof want));
    hr_kv_remote_stats st;
    hr_kv_remote_get_stats(warm.remote, &st);
    CHECKF(st.stored == (N_PROMPT + N_OUT - 1) / BS, "stored %llu blocks", (unsigned long long)st.stored);
    rig_close(&warm);
    CHECK(rig_open(&cold, true, HR_KV_F16, "demo-model"));
    uint64_t fetched = rig_run(&cold, got);
    CHECKF(fetched == (uint64_t)((N_PROMPT - 1) / BS) * BS, "fetched %llu prompt tokens", (unsigned long long)fetched);
    CHECK(!memcmp(got, want, sizeof want));
    hr_kv_remote_get_stats(cold.remote, &st);
    CHECK(st.fetched == (N_PROMPT - 1) / BS && st.rejected == 0 && st.stored <= 1);
    rig_close(&cold);

    /* another model id or another K/V format: nothing to use */
    CHECK(rig_open(&cold, true, HR_KV_F16, "another-model"));
    CHECK(rig_run(&cold, got) == 0 && !memcmp(got, want, sizeof want));
    rig_close(&cold);
    int32_t want_q8[N_OUT];
    CHECK(rig_open(&cold, true, HR_KV_Q8, "demo-model"));
    CHECK(rig_run(&cold, want_q8) == 0);
    rig_close(&cold);

    /* altered bytes: rejected, recomputed, same tokens */
    redis_each("hrkv:*:d", flush_all);
    CHECK(rig_open(&warm, true, HR_KV_F16, "demo-model"));
    rig_run(&warm, got);
    rig_close(&warm);
    redis_each("hrkv:*:d", flip_bytes);
    CHECK(rig_open(&cold, true, HR_KV_F16, "demo-model"));
    CHECK(rig_run(&cold, got) == 0 && !memcmp(got, want, sizeof want));
    hr_kv_remote_get_stats(cold.remote, &st);
    CHECKF(st.rejected == 1 && st.fetched == 0, "rejected %llu fetched %llu", (unsigned long long)st.rejected,
           (unsigned long long)st.fetched);
    rig_close(&cold);

    /* blocks under each other's keys (data and metadata both moved): rejected */
    redis_each("*", flush_all);
    CHECK(rig_open(&warm, true, HR_KV_F16, "demo-model"));
    rig_run(&warm, got);
    rig_close(&warm);
    redis_each("hrkv:*:d", swap_blocks);
    CHECK(rig_open(&cold, true, HR_KV_F16, "demo-model"));
    uint64_t f2 = rig_run(&cold, got);
    CHECK(!memcmp(got, want, sizeof want));
    hr_kv_remote_get_stats(cold.remote, &st);
    CHECKF(st.rejected >= 1 && f2 < (uint64_t)((N_PROMPT - 1) / BS) * BS, "rejected %llu, fetched %llu tokens",
           (unsigned long long)st.rejected, (unsigned long long)f2);
    rig_close(&cold);

    /* a hybrid pool: both groups written, the full group's blocks and the window's last one fetched */
    hr_rt_synth g2 = {.shape = "gemma2-tiny", .weight_type = "f32", .seed = 1};
    rig_synth = &g2;
    int32_t want_h[N_OUT];
    CHECK(rig_open(&probe, false, HR_KV_F16, NULL));
    CHECK(hr_kv_pool_groups(hr_runtime_kv(probe.rt))->n_groups == 2);
    rig_run(&probe, want_h);
    rig_close(&probe);
    redis_each("*", flush_all);
    CHECK(rig_open(&warm, true, HR_KV_F16, "gemma2-tiny"));
    CHECK(rig_run(&warm, got) == 0 && !memcmp(got, want_h, sizeof want_h));
    hr_kv_remote_get_stats(warm.remote, &st);
    CHECKF(st.stored == 2 * ((N_PROMPT + N_OUT - 1) / BS), "hybrid: stored %llu blocks", (unsigned long long)st.stored);
    rig_close(&warm);
    CHECK(rig_open(&cold, true, HR_KV_F16, "gemma2-tiny"));
    uint64_t fh = rig_run(&cold, got);
    CHECK(!memcmp(got, want_h, sizeof want_h));
    hr_kv_remote_get_stats(cold.remote, &st);
    CHECKF(fh == (uint64_t)((N_PROMPT - 1) / BS) * BS && st.fetched == (N_PROMPT - 1) / BS + 1 && st.rejected == 0,
           "hybrid: fetched %llu tokens in %llu blocks (%llu rejected)", (unsigned long long)fh,
           (unsigned long long)st.fetched, (unsigned long long)st.rejected);
    CHECK(hr_kv_pool_check(hr_runtime_kv(cold.rt), &err) == HR_OK);
    printf("kv remote, hybrid pool: %llu blocks written, a cold replica fetched %llu prompt tokens in %llu blocks "
           "(window holes not fetched), same %d tokens\n",
           (unsigned long long)(2 * ((N_PROMPT + N_OUT - 1) / BS)), (unsigned long long)fh,
           (unsigned long long)st.fetched, N_OUT);
    rig_close(&cold);
    rig_synth = NULL;

    /* Redis killed after the third fetched block: the rest is recomputed, the request completes */
    redis_each("*", flush_all);
    CHECK(rig_open(&warm, true, HR_KV_F16, "demo-model"));
    rig_run(&warm, got);
    rig_close(&warm);
    CHECK(rig_open(&cold, true, HR_KV_F16, "demo-model"));
    cold.kill_after = 3;
    uint64_t f3 = rig_run(&cold, got);
    CHECKF(f3 == 3 * BS, "fetched %llu tokens before the kill", (unsigned long long)f3);
    CHECK(!memcmp(got, want, sizeof want));
    hr_kv_remote_get_stats(cold.remote, &st);
    CHECK(st.fetch_errors == 1 && st.fetched == 3);
    printf("kv remote: cold replica fetched %llu prompt tokens of %d; corrupt blocks rejected; Redis killed after "
           "%llu fetched tokens: recomputed, same %d tokens\n",
           (unsigned long long)fetched, N_PROMPT, (unsigned long long)f3, N_OUT);
    rig_close(&cold); /* its writer's queued blocks fail or drop, bounded by the timeout */
#ifdef HR_EMU_CUDA_LIB
    /* The tier with a GPU's KV storage (the emulated one): the same block bytes as the CPU's layout, so
     * a GPU replica reads what a CPU replica wrote and the other way round. redis_start again: the kill
     * above took it down. */
    if (redis_start()) {
        rig_driver = HR_EMU_CUDA_LIB;
        int32_t want_gpu[N_OUT];
        rig_device = "cuda";
        CHECK(rig_open(&probe, false, HR_KV_F16, NULL));
        rig_run(&probe, want_gpu); /* the GPU alone, no tier */
        rig_close(&probe);
        /* a GPU replica writes, a cold GPU replica fetches every full prompt block: the same tokens */
        CHECK(rig_open(&warm, true, HR_KV_F16, "demo-model"));
        CHECK(rig_run(&warm, got) == 0 && !memcmp(got, want_gpu, sizeof want_gpu));
        rig_close(&warm);
        CHECK(rig_open(&cold, true, HR_KV_F16, "demo-model"));
        uint64_t fg = rig_run(&cold, got);
        CHECKF(fg == (uint64_t)((N_PROMPT - 1) / BS) * BS, "GPU from GPU: fetched %llu prompt tokens",
               (unsigned long long)fg);
        CHECK(!memcmp(got, want_gpu, sizeof want_gpu));
        CHECK(hr_kv_pool_check(hr_runtime_kv(cold.rt), &err) == HR_OK);
        rig_close(&cold);
        /* a CPU replica writes, a GPU replica fetches them (its own K/V would differ by the CPU's
         * activation rounding, so its tokens are checked for completing, not against either side) */
        redis_each("*", flush_all);
        rig_device = NULL;
        CHECK(rig_open(&warm, true, HR_KV_F16, "demo-model"));
        rig_run(&warm, got);
        rig_close(&warm);
        rig_device = "cuda";
        CHECK(rig_open(&cold, true, HR_KV_F16, "demo-model"));
        uint64_t fc = rig_run(&cold, got);
        CHECKF(fc == (uint64_t)((N_PROMPT - 1) / BS) * BS, "GPU from CPU: fetched %llu prompt tokens",
               (unsigned long long)fc);
        rig_close(&cold);
        rig_device = NULL;
        printf("kv remote, GPU KV storage (emulated): a cold GPU replica fetched %llu prompt tokens from a GPU "
               "replica (same %d tokens as the GPU alone) and %llu from a CPU replica\n",
               (unsigned long long)fg, N_OUT, (unsigned long long)fc);
    } else {
        CHECKF(false, "redis-server did not start again for the GPU part");
    }
#endif
    redis_kill();
    return hr_test_finish();
}

/* cuda_forward_graphs.c: test_gpu_cuda_forward's decode steps as CUDA graphs (test_cuda_forward.c says what
 * the program is): the device API's capture rules; decode replayed as graphs against the eager run, bit for
 * bit; greedy ids picked on the device (HEADROOM_CUDA_ARGMAX=device) against the logits'; the host threads
 * the engine samples a step's rows on. */
#include <dlfcn.h>
#include <math.h>
#include <stdatomic.h>

#include "cuda_forward_test.h"

#include "backend/cuda/cuda.h"
#include "runtime/runtime_parts.h"

/* ---- CUDA graphs ---------------------------------------------------------------------------------- */

/* the emulating driver's graph counters (captures ended well, graph launches, graphs alive), or
 * false where the driver is another */
static bool graph_counts(void *lib, int c[3]) {
    void *sym = lib ? dlsym(lib, "hr_fake_cuda_graph_counts") : NULL;
    void (*fn)(int *, int *, int *) = NULL;
    memcpy(&fn, &sym, sizeof sym);
    if (fn) fn(&c[0], &c[1], &c[2]);
    return fn != NULL;
}

/* The device API: inside a capture a synchronous copy, a synchronize and an allocation fail and the
 * capture with them (as the real driver's thread-local mode has it); the legacy stream cannot be
 * captured; a captured launch runs only when its graph is launched, and each launch reads the buffers
 * as they are then. */
void test_graph_api(const ft_ctx *ft) {
    hr_error err = {0};
    hr_cuda_device *dev = NULL;
    CHECKF(hr_cuda_device_open(ft->driver, 0, &dev, &err) == HR_OK, "%s", err.msg);
    if (!dev) return;
    if (!hr_cuda_graphs_available(dev)) {
        CHECKF(!ft->driver, "the emulating driver has no graphs");
        hr_cuda_device_close(dev);
        return;
    }
    enum { N = 300 };
    float g[N], u[N], out[N];
    for (int i = 0; i < N; i++) g[i] = (float)(i % 17) * 0.25f - 2.0f, u[i] = 1.0f + (float)i * 0.01f;
    uint64_t dg = 0, du = 0, dout = 0, extra = 0;
    CHECK(hr_cuda_alloc(dev, sizeof g, &dg, &err) == HR_OK && hr_cuda_alloc(dev, sizeof u, &du, &err) == HR_OK &&
          hr_cuda_alloc(dev, sizeof out, &dout, &err) == HR_OK);
    CHECK(hr_cuda_upload(dev, dg, g, sizeof g, &err) == HR_OK && hr_cuda_upload(dev, du, u, sizeof u, &err) == HR_OK);
    /* each refused call: the call fails, then the capture does */
    for (int k = 0; k < 3; k++) {
        hr_cuda_graph *gr = NULL;
        CHECK(hr_cuda_graph_begin(dev, &err) == HR_OK);
        hr_status st = k == 0   ? hr_cuda_upload(dev, dg, g, sizeof g, &err)
                       : k == 1 ? hr_cuda_sync(dev, &err)
                                : hr_cuda_alloc(dev, 64, &extra, &err);
        CHECKF(st != HR_OK, "call %d inside a capture was allowed", k);
        /* the emulator invalidates the capture with each (the driver does for the copy and the
         * synchronize; whether for the allocation too is not documented, so not asked of it) */
        const bool ended = hr_cuda_graph_end(dev, &gr, &err) == HR_OK;
        CHECKF(!ft->driver || (!ended && !gr), "capture %d survived a refused call", k);
        hr_cuda_graph_free(dev, gr);
    }
    /* the legacy stream, asked of the driver directly */
    void *lib = ft->driver ? dlopen(ft->driver, RTLD_NOW | RTLD_NOLOAD) : NULL;
    void *sym = lib ? dlsym(lib, "cuStreamBeginCapture_v2") : NULL;
    int (*begin)(void *, int) = NULL;
    memcpy(&begin, &sym, sizeof sym);
    if (begin) CHECK(begin(NULL, 1) != 0);
    if (lib) dlclose(lib);
    /* out = silu(g) u, captured: nothing runs until the graph does */
    uint64_t n = N;
    void *a[] = {&dout, &dg, &du, &n};
    hr_cuda_graph *gr = NULL;
    CHECK(hr_cuda_graph_begin(dev, &err) == HR_OK);
    CHECK(hr_cuda_launch(dev, "hr_k_swiglu", 2, 1, 256, a, &err) == HR_OK);
    CHECKF(hr_cuda_graph_end(dev, &gr, &err) == HR_OK && gr, "%s", err.msg);
    CHECK(hr_cuda_download(dev, out, dout, sizeof out, &err) == HR_OK);
    bool zeros = true;
    for (int i = 0; i < N; i++) zeros &= out[i] == 0.0f;
    CHECKF(zeros, "a captured launch ran before its graph");
    for (int rep = 0; rep < 2 && gr; rep++) {
        if (rep == 1) { /* new inputs in the same buffers: the replay reads them */
            for (int i = 0; i < N; i++) u[i] = -u[i];
            CHECK(hr_cuda_upload(dev, du, u, sizeof u, &err) == HR_OK);
        }
        CHECK(hr_cuda_graph_launch(dev, gr, &err) == HR_OK && hr_cuda_download(dev, out, dout, sizeof out, &err) == 0);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            const float want = g[i] / (1.0f + expf(-g[i])) * u[i];
            bad += fabsf(out[i] - want) > 1e-5f * (1.0f + fabsf(want));
        }
        CHECKF(bad == 0, "graph launch %d: %d of %d results wrong", rep, bad, N);
    }
    hr_cuda_graph_free(dev, gr);
    hr_cuda_free(dev, dout), hr_cuda_free(dev, du), hr_cuda_free(dev, dg);
    hr_cuda_device_close(dev);
    printf("graphs, device API: copies, synchronizes and allocations refused inside a capture; a replay reads its "
           "buffers anew\n");
}

#define GN 4  /* sequences at once */
#define GT 12 /* the most tokens one generates */

/* the requests: a 250-token prompt that grows past 256 (the context bucket goes from 256 to 512)
 * beside shorter ones, two of them under window policies and done after half the steps, so that the
 * later steps pass no window to attention */
static const int g_plen_all[GN] = {250, 40, 30, 5}, g_ntok[GN] = {GT, GT / 2, GT / 2, GT};
/* q4's: short prompts (the emulator's time), three of the four filling a block while decoding (at
 * positions 15, 31 and 15), so the replayed encode launches see different fills step to step */
static const int g_plen_q4[GN] = {14, 40, 30, 5};
static const char *const g_pol[GN] = {NULL, "window:16", "sinks:4,window:16", NULL};

/* GN greedy requests at once on rt, request i's prompt BOS then plen[i] - 1 ids (3 + (k mul + i add) %
 * 500), g_ntok[i] tokens under policy pol[i] (pol NULL: none), log-probabilities for request lp_req
 * (GN: every one, the top 2 of each step into top and lp), run until idle: their ids */
static void run_gn(hr_runtime *rt, const int plen[GN], int mul, int add, const char *const *pol, int lp_req,
                   int32_t ids[GN][GT], int32_t top[GN][GT * 2], float lp[GN][GT * 2]) {
    static int32_t prompt[GN][256];
    hr_rt_request *r[GN] = {0};
    hr_error err = {0};
    for (int i = 0; i < GN; i++) {
        prompt[i][0] = 1;
        for (int k = 1; k < plen[i]; k++) prompt[i][k] = 3 + (k * mul + i * add) % 500;
        hr_rt_request_params q = {.prompt_ids = prompt[i],
                                  .n_prompt_ids = plen[i],
                                  .max_tokens = g_ntok[i],
                                  .ignore_eos = true,
                                  .kv_policy = pol ? pol[i] : NULL,
                                  .logprobs = lp_req == GN || i == lp_req,
                                  .top_logprobs = lp_req == GN ? 2 : 0};
        q.sampling = hr_rt_sampling_default();
        q.sampling.temperature = 0;
        CHECKF(hr_runtime_submit(rt, &q, &r[i], &err) == HR_OK, "%s", err.msg);
    }
    CHECKF(hr_runtime_run_until_idle(rt, &err) == HR_OK, "%s", err.msg);
    for (int i = 0; i < GN; i++) {
        hr_rt_result res;
        hr_rt_request_result(r[i], &res);
        CHECKF(res.n_ids == g_ntok[i], "request %d gave %d ids", i, res.n_ids);
        memcpy(ids[i], res.ids, sizeof(int32_t) * (size_t)(res.n_ids < g_ntok[i] ? res.n_ids : g_ntok[i]));
        if (lp_req == GN) CHECK(hr_rt_request_logprobs(r[i], 0, g_ntok[i], NULL, top[i], lp[i]) == g_ntok[i]);
        hr_rt_request_release(rt, r[i]);
    }
}

/* the requests above at once, greedy, on a fresh runtime (graphs on where `graphs`): their ids and
 * the top-2 log-probabilities of each step */
static void graph_decode(const ft_ctx *ft, bool graphs, hr_rt_kv_format kvf, int32_t ids[GN][GT],
                         int32_t top[GN][GT * 2], float lp[GN][GT * 2]) {
    /* and the emulator refuses the first capture: that step runs eagerly, the next captures */
    if (graphs) setenv("HEADROOM_CUDA_GRAPHS", "1", 1), setenv("HR_FAKE_CUDA_CAPTURE_FAIL", "1", 1);
    hr_runtime_params p = rt_params(ft, HR_SOURCE_DIR "/models/stories260K-q8_0.gguf", "cuda", kvf);
    p.n_ctx = 512;
    p.kv_budget = 16u << 20;
    hr_runtime *rt = NULL;
    hr_error err = {0};
    CHECKF(hr_runtime_open(&p, &rt, NULL, &err) == HR_OK, "%s", err.msg);
    unsetenv("HEADROOM_CUDA_GRAPHS");
    if (!rt) {
        unsetenv("HR_FAKE_CUDA_CAPTURE_FAIL");
        return;
    }
    run_gn(rt, kvf == HR_RT_KV_Q4 ? g_plen_q4 : g_plen_all, 31, 7, g_pol, GN, ids, top, lp);
    hr_runtime_close(rt);
    unsetenv("HR_FAKE_CUDA_CAPTURE_FAIL");
}

/* Decode steps replayed as graphs give the eager steps' results bit for bit: the same kernels on the
 * same inputs (a step whose capture failed ran eagerly among them). The bucket only adds splits past every query's
 * context (one attention tile each in both runs here: the small model's few heads leave the split at a tile), which the
 * reduction skips. f16 KV, and q4 (each layer's encode launch replayed while different blocks fill from
 * step to step; short prompts). */
void test_graph_decode(const ft_ctx *ft) {
    static int32_t ids[2][GN][GT], top[2][GN][GT * 2];
    static float lp[2][GN][GT * 2];
    static const hr_rt_kv_format fmts[] = {HR_RT_KV_F16, HR_RT_KV_Q4};
    for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++) {
        const char *name = fmts[fi] == HR_RT_KV_Q4 ? "q4" : "f16";
        memset(ids, 0, sizeof ids);
        memset(top, 0, sizeof top);
        memset(lp, 0, sizeof lp);
        /* the driver held loaded across the runtimes, so its counters are not reset between them */
        void *lib = ft->driver ? dlopen(ft->driver, RTLD_NOW) : NULL;
        int c0[3] = {0}, c1[3] = {0};
        const bool counted = graph_counts(lib, c0);
        graph_decode(ft, false, fmts[fi], ids[0], top[0], lp[0]);
        graph_counts(lib, c1);
        CHECKF(c1[1] == c0[1], "graphs launched with HEADROOM_CUDA_GRAPHS unset");
        graph_decode(ft, true, fmts[fi], ids[1], top[1], lp[1]);
        graph_counts(lib, c1);
        const int captures = c1[0] - c0[0], launches = c1[1] - c0[1];
        const bool same = !memcmp(ids[0], ids[1], sizeof ids[0]) && !memcmp(top[0], top[1], sizeof top[0]) &&
                          !memcmp(lp[0], lp[1], sizeof lp[0]);
        CHECKF(same, "graphs, %s KV: ids or log-probabilities differ from the eager run's", name);
        if (counted && fmts[fi] == HR_RT_KV_Q4) { /* q4's short prompts cross no bucket: replays, none left */
            CHECKF(launches >= GT - 3 && c1[2] == c0[2], "graphs, q4 KV: %d graph launches, %d graphs left alive",
                   launches, c1[2] - c0[2]);
        } else if (counted) {
            /* GT - 1 decode steps after the prompts' step, less the one whose capture was refused; a
             * capture per key (batch size, bucket, window): 4 tokens with windows, 2 without at bucket
             * 256, then 512 */
            CHECKF(launches >= GT - 2 && captures >= 3 && captures * 2 < launches,
                   "graphs, %s KV: %d captures, %d graph launches", name, captures, launches);
            CHECKF(c1[2] == c0[2], "%d graphs left alive after close", c1[2] - c0[2]);
        }
        if (lib) dlclose(lib);
        printf("graphs, %s KV (windows%s): %d decode steps replayed from %d captures; ids and "
               "log-probabilities %s the eager run's\n",
               name, fmts[fi] == HR_RT_KV_Q4 ? ", blocks filled while replayed" : ", a bucket crossed", launches,
               captures, same ? "bit for bit" : "NOT equal to");
    }
}

/* ---- greedy ids picked on the device --------------------------------------------------------------- */

/* the emulating driver's page-locked allocations alive now, or -1 (another driver, or none loaded) */
static int host_allocs_now(void *lib) {
    void *sym = lib ? dlsym(lib, "hr_fake_cuda_host_allocs") : NULL;
    int (*fn)(void) = NULL;
    memcpy(&fn, &sym, sizeof sym);
    return fn ? fn() : -1;
}

/* GN requests at once on the q8_0 model, greedy (request `lp_req` also asks for log-probabilities;
 * -1: none does), with HEADROOM_CUDA_ARGMAX=`argmax` (NULL: unset), graphs where `graphs` and the
 * logits rows page-locked where `pinned` (HEADROOM_CUDA_PINNED_LOGITS=1; host_allocs: the emulator's
 * page-locked allocations while it ran and after close, -1 elsewhere): their ids, and the engine's steps
 * whose ids the device picked */
static uint64_t argmax_decode(const ft_ctx *ft, const char *argmax, bool graphs, bool pinned, int lp_req,
                              int32_t ids[GN][GT], int host_allocs[2]) {
    if (argmax) setenv("HEADROOM_CUDA_ARGMAX", argmax, 1);
    if (graphs) setenv("HEADROOM_CUDA_GRAPHS", "1", 1);
    if (pinned) setenv("HEADROOM_CUDA_PINNED_LOGITS", "1", 1);
    hr_runtime_params p = rt_params(ft, HR_SOURCE_DIR "/models/stories260K-q8_0.gguf", "cuda", HR_RT_KV_F16);
    hr_runtime *rt = NULL;
    hr_error err = {0};
    CHECKF(hr_runtime_open(&p, &rt, NULL, &err) == HR_OK, "%s", err.msg);
    unsetenv("HEADROOM_CUDA_ARGMAX");
    unsetenv("HEADROOM_CUDA_GRAPHS");
    unsetenv("HEADROOM_CUDA_PINNED_LOGITS");
    if (!rt) return 0;
    void *lib = ft->driver ? dlopen(ft->driver, RTLD_NOW | RTLD_NOLOAD) : NULL; /* held past close, to count then */
    if (host_allocs) host_allocs[0] = host_allocs_now(lib);
    static const int plen[GN] = {9, 30, 17, 5};
    run_gn(rt, plen, 29, 11, NULL, lp_req, ids, NULL, NULL);
    hr_runtime_pool pool;
    hr_runtime_get_pool(rt, &pool);
    hr_runtime_close(rt);
    if (host_allocs) host_allocs[1] = host_allocs_now(lib);
    if (lib) dlclose(lib);
    return pool.engine.argmax_steps;
}

/* HEADROOM_CUDA_ARGMAX=device: the ids of greedy requests are those the logits copied to the host give,
 * with the device picking every step's (eager and replayed as graphs); a request asking for
 * log-probabilities takes the logits for the steps it is in, and its ids and the others' stay the same.
 * Unset, the device picks none; a value other than host or device is refused at open. */
void test_device_argmax(const ft_ctx *ft) {
    static int32_t ids[5][GN][GT];
    memset(ids, 0, sizeof ids);
    int pinned_allocs[2] = {0}, plain_allocs[2] = {0};
    const uint64_t host = argmax_decode(ft, NULL, false, false, -1, ids[0], plain_allocs);
    const uint64_t dev = argmax_decode(ft, "device", false, false, -1, ids[1], NULL);
    const uint64_t graphed = argmax_decode(ft, "device", true, false, -1, ids[2], NULL);
    const uint64_t mixed = argmax_decode(ft, "device", false, false, 1, ids[3], NULL);
    /* the logits rows page-locked, a log-probabilities request among them: the rows come down into them */
    const uint64_t pinned = argmax_decode(ft, NULL, false, true, 1, ids[4], pinned_allocs);
    CHECKF(host == 0 && pinned == 0, "HEADROOM_CUDA_ARGMAX unset: %llu and %llu steps picked on the device",
           (unsigned long long)host, (unsigned long long)pinned);
    CHECKF(plain_allocs[0] < 0 || (pinned_allocs[0] == plain_allocs[0] + 1 && pinned_allocs[1] == 0),
           "HEADROOM_CUDA_PINNED_LOGITS=1: %d page-locked allocations, %d without, %d after close", pinned_allocs[0],
           plain_allocs[0], pinned_allocs[1]);
    /* one step for the prompts, then GT - 1 decode steps; request 1 (GT / 2 tokens, log-probabilities in
     * the mixed run) is in the first GT / 2 of them */
    CHECKF(dev == GT && graphed == dev && mixed == GT - GT / 2,
           "device argmax steps: %llu, with graphs %llu, mixed %llu", (unsigned long long)dev,
           (unsigned long long)graphed, (unsigned long long)mixed);
    bool same = true;
    for (int k = 1; k < 5; k++) same = same && !memcmp(ids[0], ids[k], sizeof ids[0]);
    CHECKF(same, "device argmax: ids differ from the logits' greedy choice");
    setenv("HEADROOM_CUDA_ARGMAX", "gpu", 1);
    hr_runtime_params p = rt_params(ft, HR_SOURCE_DIR "/models/stories260K-q8_0.gguf", "cuda", HR_RT_KV_F16);
    hr_runtime *rt = NULL;
    hr_error err = {0};
    CHECKF(hr_runtime_open(&p, &rt, NULL, &err) != HR_OK && strstr(err.msg, "HEADROOM_CUDA_ARGMAX is 'gpu'") &&
               strstr(err.msg, "host or device"),
           "HEADROOM_CUDA_ARGMAX=gpu: %s", rt ? "opened" : err.msg);
    unsetenv("HEADROOM_CUDA_ARGMAX");
    hr_runtime_close(rt);
    printf("device argmax: %llu steps' ids picked on the device (%llu with graphs; %llu with a log-probabilities "
           "request in the first %d); the %d requests' ids %s the logits' (copied to malloc'd and to page-locked "
           "rows)\n",
           (unsigned long long)dev, (unsigned long long)graphed, (unsigned long long)mixed, GT / 2, GN,
           same ? "equal" : "NOT equal to");
}

/* one count per item, the largest thread index seen (hr_model_ctx_run_items) */
typedef struct items_seen {
    _Atomic int count[1000];
    _Atomic int max_ith;
} items_seen;

static void count_item(void *user, int64_t item, int ith) {
    items_seen *s = user;
    atomic_fetch_add(&s->count[item], 1);
    int m = atomic_load(&s->max_ith);
    while (ith > m && !atomic_compare_exchange_weak(&s->max_ith, &m, ith)) {
    }
}

/* The GPU backend's host threads (the engine's sampling of a step's rows): -t 3 gives a pool of three
 * that runs every item once, used by the engine only from its run_items_min logits (64 rows of 128,256:
 * stories260K's steps stay on one thread); -t 1 none. */
void test_host_threads(const ft_ctx *ft) {
    for (int t = 1; t <= 3; t += 2) {
        hr_runtime_params p = rt_params(ft, HR_SOURCE_DIR "/models/stories260K-q8_0.gguf", "cuda", HR_RT_KV_F16);
        p.n_threads = t;
        hr_runtime *rt = NULL;
        hr_error err = {0};
        CHECKF(hr_runtime_open(&p, &rt, NULL, &err) == HR_OK, "%s", err.msg);
        if (!rt) return;
        hr_model_ctx *ctx = hr_runtime_ctx(rt);
        CHECKF(hr_model_ctx_n_threads(ctx) == t, "-t %d: %d host threads", t, hr_model_ctx_n_threads(ctx));
        CHECK(hr_model_ctx_run_items_min(ctx) == (t > 1 ? 64 * 128000 : INT64_MAX));
        static items_seen seen;
        memset(&seen, 0, sizeof seen);
        hr_model_ctx_run_items(ctx, count_item, &seen, 1000);
        int once = 0;
        for (int i = 0; i < 1000; i++) once += atomic_load(&seen.count[i]) == 1;
        CHECKF(once == 1000 && atomic_load(&seen.max_ith) < t, "-t %d: %d of 1000 items run once, thread %d", t, once,
               atomic_load(&seen.max_ith));
        /* four sampled requests over stories260K's 512 logits: one thread samples each step */
        static const int32_t prompt[] = {1, 403, 407, 261};
        hr_rt_request *rq[4] = {0};
        for (int i = 0; i < 4; i++) {
            hr_rt_request_params rp = {.prompt_ids = prompt, .n_prompt_ids = 4, .max_tokens = 8, .ignore_eos = true};
            rp.sampling = hr_rt_sampling_default();
            rp.sampling.temperature = 0.8f;
            rp.sampling.seed = (uint64_t)i;
            CHECKF(hr_runtime_submit(rt, &rp, &rq[i], &err) == HR_OK, "%s", err.msg);
        }
        CHECKF(hr_runtime_run_until_idle(rt, &err) == HR_OK, "%s", err.msg);
        for (int i = 0; i < 4; i++) hr_rt_request_release(rt, rq[i]);
        hr_runtime_pool pool;
        hr_runtime_get_pool(rt, &pool);
        CHECKF(pool.engine.steps > 0 && pool.engine.threaded_sample_steps == 0 && pool.engine.sample_seconds > 0,
               "-t %d: %llu steps, %llu sampled on several threads", t, (unsigned long long)pool.engine.steps,
               (unsigned long long)pool.engine.threaded_sample_steps);
        hr_runtime_close(rt);
    }
    printf("host threads: -t 3 gives the GPU backend three, every item run once; stories260K's steps sampled on "
           "one\n");
}

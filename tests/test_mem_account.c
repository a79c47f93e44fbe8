/* test_mem_account.c: each module's reported bytes against what it allocates. The memory plan
 * (hr_kv_budget_compute) adds up figures the modules export: the KV pool's tables and a sequence's
 * block table (kv/), the engine's step buffers and a request's buffers (engine/), the forward scratch
 * (model/forward.c with the matmul context and thread pool of backend/cpu), the loader's f32 copies
 * and tables (model/load.c), the tokenizer's tables, a request's sampler (sampler/). Here every malloc, calloc,
 * realloc, aligned_alloc and free headroom's code makes on this thread is counted (the linker routes them through the
 * wrappers below: -Wl,--wrap=..., CMakeLists.txt), and the bytes live after each create must equal
 * the module's figure exactly, for several configurations. The fault build wraps the same calls for
 * fault injection, so there this test skips. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul.h"
#include "common/util.h"
#include "engine/engine.h"
#include "harness.h"
#include "kv/kv.h"
#include "model/model.h"
#include "model/synth.h"
#include "tokenizer/tokenizer.h"

#if !HR_FAULT
/* ---- the counting allocator ------------------------------------------------------------------ */

/* Live allocations made while counting, by address (open addressing; a freed slot becomes a
 * tombstone). Allocations made on other threads (the thread pool's workers) are not counted. */
#define TRACK_CAP (1u << 18)
#define TOMB      ((void *)1)
static struct {
    void *p;
    size_t n;
} g_track[TRACK_CAP];
static unsigned g_used; /* slots ever taken (tombstones included) */
static long long g_live;
static bool g_overflow;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local bool g_counting;

static unsigned slot_of(const void *p) { return (unsigned)(((uintptr_t)p >> 4) * 0x9E3779B1u) & (TRACK_CAP - 1); }

static void track_add(void *p, size_t n) {
    pthread_mutex_lock(&g_mu);
    if (g_used + 1 >= TRACK_CAP / 2) {
        g_overflow = true;
    } else {
        unsigned i = slot_of(p);
        while (g_track[i].p && g_track[i].p != TOMB) i = (i + 1) & (TRACK_CAP - 1);
        if (!g_track[i].p) g_used++;
        g_track[i].p = p;
        g_track[i].n = n;
        g_live += (long long)n;
    }
    pthread_mutex_unlock(&g_mu);
}

/* Forgets p if it is tracked; its size, or 0. */
static size_t track_remove(void *p) {
    size_t n = 0;
    pthread_mutex_lock(&g_mu);
    if (g_used) {
        for (unsigned i = slot_of(p), k = 0; g_track[i].p && k < TRACK_CAP; i = (i + 1) & (TRACK_CAP - 1), k++) {
            if (g_track[i].p == p) {
                n = g_track[i].n;
                g_track[i].p = TOMB;
                g_live -= (long long)n;
                break;
            }
        }
    }
    pthread_mutex_unlock(&g_mu);
    return n;
}

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t align, size_t n);
void __real_free(void *p);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);
void *__wrap_aligned_alloc(size_t align, size_t n);
void __wrap_free(void *p);

void *__wrap_malloc(size_t n) {
    void *p = __real_malloc(n);
    if (p && g_counting) track_add(p, n);
    return p;
}
void *__wrap_calloc(size_t n, size_t size) {
    void *p = __real_calloc(n, size);
    if (p && g_counting) track_add(p, n * size);
    return p;
}
void *__wrap_aligned_alloc(size_t align, size_t n) {
    void *p = __real_aligned_alloc(align, n);
    if (p && g_counting) track_add(p, n);
    return p;
}
void *__wrap_realloc(void *p, size_t n) {
    size_t old = p ? track_remove(p) : 0;
    void *q = __real_realloc(p, n);
    if (!q && p && old) track_add(p, old); /* failed: p is still there */
    if (q && (g_counting || old)) track_add(q, n);
    return q;
}
void __wrap_free(void *p) {
    if (p) track_remove(p);
    __real_free(p);
}

/* Starts counting on this thread; returns the live bytes now. */
static long long count_begin(void) {
    g_counting = true;
    pthread_mutex_lock(&g_mu);
    long long n = g_live;
    pthread_mutex_unlock(&g_mu);
    return n;
}
/* Stops counting; the live bytes added since `from`. */
static long long count_end(long long from) {
    g_counting = false;
    pthread_mutex_lock(&g_mu);
    long long n = g_live - from;
    pthread_mutex_unlock(&g_mu);
    CHECK(!g_overflow);
    return n;
}

/* ---- kv/ -------------------------------------------------------------------------------------- */

static hr_kv_config kv_cfg(int L, int Hkv, int D, int B, hr_kv_format kf, hr_kv_format vf, int S, int n_blocks) {
    hr_kv_config c = {.n_layers = L,
                      .n_kv_heads = Hkv,
                      .head_dim = D,
                      .block_size = B,
                      .k_format = kf,
                      .v_format = vf,
                      .max_seqs = S};
    c.budget_bytes = hr_kv_fixed_bytes(&c) + (uint64_t)n_blocks * hr_kv_block_bytes(&c);
    return c;
}

/* The pool's tables at create, and one sequence's block table as it grows to n_ctx. */
static void test_kv(void) {
    hr_kv_config cfgs[] = {
        kv_cfg(2, 2, 64, 16, HR_KV_F16, HR_KV_F16, 4, 40),
        kv_cfg(4, 1, 32, 32, HR_KV_Q4, HR_KV_Q4, 8, 100), /* staged: tail buffers and their counts */
        kv_cfg(3, 4, 128, 8, HR_KV_Q8, HR_KV_FP8, 64, 1000),
        kv_cfg(1, 8, 16, 256, HR_KV_KIVI2, HR_KV_F32, 2, 7),
    };
    const int ctxs[] = {1, 100, 1000, 4096};
    for (size_t i = 0; i < HR_ARRAY_LEN(cfgs); i++) {
        hr_kv_config *c = &cfgs[i];
        hr_kv_pool *pool = NULL;
        hr_error err;
        long long at = count_begin();
        hr_status st = hr_kv_pool_create(c, &pool, &err);
        long long got = count_end(at);
        CHECKF(st == HR_OK, "%s", err.msg);
        if (st) continue;
        uint64_t want = hr_kv_pool_meta_bytes(c, hr_kv_pool_n_blocks(pool));
        CHECKF(got == (long long)want, "pool %zu (%d blocks): allocated %lld, reported %llu", i,
               hr_kv_pool_n_blocks(pool), got, (unsigned long long)want);
        for (size_t k = 0; k < HR_ARRAY_LEN(ctxs); k++) {
            int n = ctxs[k];
            if ((n + c->block_size - 1) / c->block_size > hr_kv_pool_n_blocks(pool)) continue;
            hr_kv_seq s;
            CHECK(hr_kv_seq_create(pool, &s, &err) == HR_OK);
            at = count_begin();
            for (int t = 1; t <= n; t += c->block_size) /* grown as a sequence grows: block by block */
                CHECKF(hr_kv_seq_reserve_ahead(pool, s, t, &err) == HR_OK, "%s", err.msg);
            CHECK(hr_kv_seq_reserve_ahead(pool, s, n, &err) == HR_OK);
            got = count_end(at);
            want = hr_kv_seq_table_bytes(c, n);
            CHECKF(got == (long long)want, "pool %zu, a sequence of %d: table %lld bytes, reported %llu", i, n, got,
                   (unsigned long long)want);
            hr_kv_seq_free(pool, s);
            /* the slot keeps its table for the next sequence (hr_kv_seq_create): drop it by freeing
             * the pool below rather than counting it twice */
            hr_kv_pool_destroy(pool);
            pool = NULL;
            CHECK(hr_kv_pool_create(c, &pool, &err) == HR_OK);
        }
        hr_kv_pool_destroy(pool);
    }
    /* a config the pool refuses reports 0, and its check says why without making a pool */
    hr_kv_config bad = kv_cfg(2, 2, 12, 16, HR_KV_Q4H, HR_KV_Q4H, 4, 1);
    hr_error err = {0};
    CHECK(hr_kv_pool_meta_bytes(&bad, 10) == 0);
    long long at = count_begin();
    CHECK(hr_kv_config_check(&bad, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "q4h"));
    CHECK(count_end(at) == 0);
}

/* ---- engine/ ---------------------------------------------------------------------------------- */

static hr_status no_forward(void *user, const hr_batch *b, float *logits, hr_error *err) {
    (void)user, (void)b, (void)logits, (void)err;
    return HR_OK;
}

static void test_engine(void) {
    const struct { int T, S, V; } cases[] = {{512, 4, 32000}, {64, 1, 1000}, {2048, 64, 151936}, {1, 3, 7}};
    for (size_t i = 0; i < HR_ARRAY_LEN(cases); i++) {
        hr_kv_config c = kv_cfg(2, 2, 64, 16, HR_KV_F16, HR_KV_F16, cases[i].S, 64);
        hr_kv_pool *pool = NULL;
        hr_error err;
        CHECK(hr_kv_pool_create(&c, &pool, &err) == HR_OK);
        hr_engine_params ep = {.kv = pool,
                               .forward = no_forward,
                               .n_ctx = 256,
                               .n_vocab = cases[i].V,
                               .max_batch_tokens = cases[i].T,
                               .max_running = cases[i].S};
        hr_engine *e = NULL;
        long long at = count_begin();
        hr_status st = hr_engine_create(&ep, &e, &err);
        long long got = count_end(at);
        CHECKF(st == HR_OK, "%s", err.msg);
        uint64_t want = hr_engine_buffer_bytes(cases[i].T, cases[i].S, cases[i].V);
        CHECKF(got == (long long)want, "engine T %d S %d V %d: allocated %lld, reported %llu", cases[i].T, cases[i].S,
               cases[i].V, got, (unsigned long long)want);

        /* a request: its buffers and its sampler's, at several sizes and sampling settings */
        const int32_t bias_ids[3] = {0, 1, 2};
        const float bias_values[3] = {1, -1, -100};
        const struct {
            int n_prompt, max_tokens;
            bool logprobs;
            int top, penalty_last_n, n_bias;
        } reqs[] = {{1, 255, false, 0, 64, 0}, {100, 20, true, 0, -1, 3}, {10, 50, true, 5, 0, 1}};
        for (size_t k = 0; st == HR_OK && k < HR_ARRAY_LEN(reqs); k++) {
            int32_t prompt[100];
            for (int t = 0; t < reqs[k].n_prompt; t++) prompt[t] = t % cases[i].V;
            hr_request_params rp = {.prompt = prompt,
                                    .n_prompt = reqs[k].n_prompt,
                                    .max_tokens = reqs[k].max_tokens,
                                    .sampling = hr_sampler_default_params(),
                                    .logprobs = reqs[k].logprobs,
                                    .top_logprobs = reqs[k].top};
            rp.sampling.penalty_last_n = reqs[k].penalty_last_n;
            rp.sampling.n_bias = HR_MIN(reqs[k].n_bias, cases[i].V);
            rp.sampling.bias_ids = bias_ids;
            rp.sampling.bias_values = bias_values;
            hr_sampler *smp = NULL;
            at = count_begin();
            CHECK(hr_sampler_create(&rp.sampling, cases[i].V, &smp, &err) == HR_OK);
            got = count_end(at);
            CHECKF(got == (long long)hr_sampler_bytes(&rp.sampling, cases[i].V), "sampler: %lld vs %llu", got,
                   (unsigned long long)hr_sampler_bytes(&rp.sampling, cases[i].V));
            hr_sampler_destroy(smp);
            /* the engine's inbox grows on the first submission: submit once outside the count */
            hr_request *warm = NULL, *r = NULL;
            CHECK(hr_engine_submit(e, &rp, &warm, &err) == HR_OK);
            at = count_begin();
            CHECKF(hr_engine_submit(e, &rp, &r, &err) == HR_OK, "%s", err.msg);
            got = count_end(at);
            want = hr_request_buffer_bytes(&rp, cases[i].V);
            CHECKF(got == (long long)want, "request %d+%d (logprobs %d, top %d): allocated %lld, reported %llu",
                   reqs[k].n_prompt, reqs[k].max_tokens, reqs[k].logprobs, reqs[k].top, got, (unsigned long long)want);
            hr_engine_cancel(e, warm);
            hr_engine_cancel(e, r);
            CHECK(hr_engine_run_until_idle(e, &err) == HR_OK);
            hr_request_release(warm);
            hr_request_release(r);
        }
        hr_engine_destroy(e);
        hr_kv_pool_destroy(pool);
    }
}

/* ---- model/: the loader, the forward scratch; tokenizer/ ---------------------------------------- */

static void test_model(const char *shape_name, hr_dtype type) {
    hr_synth_shape shape;
    hr_error err;
    CHECK(hr_synth_shape_by_name(shape_name, &shape, &err) == HR_OK);
    if (shape.n_layer > 4) shape.n_layer = 4;
    if (shape.n_vocab > 8192) shape.n_vocab = 8192; /* the figures are per entry: a full vocabulary adds seconds */
    hr_gguf_writer *w = NULL;
    void *mem = NULL;
    size_t size = 0;
    hr_gguf *g = NULL;
    CHECK(hr_synth_build(&shape, type, 7, &w, &err) == HR_OK);
    CHECK(hr_gguf_writer_write_memory(w, &mem, &size, &err) == HR_OK);
    hr_gguf_writer_destroy(w);
    CHECK(hr_gguf_open_memory_mut(mem, size, &g, &err) == HR_OK);

    /* the loader: the f32 copies of the vectors and its own tables (the file is the caller's) */
    hr_model *m = NULL;
    long long at = count_begin();
    hr_status st = hr_model_load_gguf(g, &m, &err);
    long long got = count_end(at);
    CHECKF(st == HR_OK, "%s: %s", shape_name, err.msg);
    if (st) {
        free(mem);
        return;
    }
    const hr_hparams *hp = hr_model_hparams(m);
    uint64_t want = hr_model_resident_bytes(hp, 0) + hr_model_table_bytes(hp);
    CHECKF(got == (long long)want, "%s: the loader allocated %lld, reported %llu", shape_name, got,
           (unsigned long long)want);
    CHECK(hr_model_resident_bytes(hp, 1000) == hr_model_resident_bytes(hp, 0) + 1000);

    /* the tokenizer's tables */
    hr_tokenizer *tok = NULL;
    at = count_begin();
    st = hr_tokenizer_load(hr_model_gguf(m), &tok, &err);
    got = count_end(at);
    CHECKF(st == HR_OK, "%s: %s", shape_name, err.msg);
    if (st == HR_OK) {
        want = hr_tokenizer_table_bytes(tok);
        CHECKF(got == (long long)want, "%s: the tokenizer allocated %lld, reported %llu (%d entries)", shape_name, got,
               (unsigned long long)want, hr_tokenizer_n_vocab(tok));
        printf("%s: tokenizer %.1f bytes an entry (%d entries)\n", shape_name, (double)want / hr_tokenizer_n_vocab(tok),
               hr_tokenizer_n_vocab(tok));
    }
    hr_tokenizer_destroy(tok);

    /* the forward scratch, at a few batch sizes, contexts, block sizes and thread counts */
    const struct { int T, ctx, B, threads; } cases[] = {{512, 256, 16, 1}, {64, 1000, 32, 2}, {7, 4096, 8, 3}};
    for (size_t i = 0; i < HR_ARRAY_LEN(cases); i++) {
        hr_kv_config c = kv_cfg(hp->n_layer, hp->n_head_kv, hp->head_dim, cases[i].B, HR_KV_F16, HR_KV_F16, 2, 8);
        c.q_per_kv = hr_model_q_per_kv(hp); /* as the runtime configures the pool: attention's head groups */
        hr_kv_pool *pool = NULL;
        CHECK(hr_kv_pool_create(&c, &pool, &err) == HR_OK);
        hr_model_ctx_params mp = {
            .n_threads = cases[i].threads, .max_batch_tokens = cases[i].T, .max_ctx = cases[i].ctx};
        hr_model_ctx *ctx = NULL;
        at = count_begin();
        st = hr_model_ctx_create(m, pool, &mp, &ctx, &err);
        got = count_end(at);
        CHECKF(st == HR_OK, "%s: %s", shape_name, err.msg);
        want = hr_model_ctx_scratch_bytes(hp, cases[i].T, cases[i].ctx, cases[i].B, cases[i].threads);
        CHECKF(got == (long long)want, "%s T %d ctx %d B %d threads %d: scratch allocated %lld, reported %llu",
               shape_name, cases[i].T, cases[i].ctx, cases[i].B, cases[i].threads, got, (unsigned long long)want);
        hr_model_ctx_destroy(ctx);
        hr_kv_pool_destroy(pool);
    }
    hr_model_destroy(m);
    free(mem);
}

/* The matmul context alone, for widths whose widest activation row differs (f16, q8_0s, q8_K). */
static void test_matmul(void) {
    const int64_t ks[] = {32, 256, 2048, 5632, 100};
    const int64_t ts[] = {1, 512, 3};
    hr_kernels k;
    hr_kernels_init(&k, hr_cpu_detect(), NULL);
    hr_threadpool *tp = NULL;
    hr_error err;
    CHECK(hr_threadpool_create(1, &tp, &err) == HR_OK);
    for (size_t i = 0; i < HR_ARRAY_LEN(ks); i++)
        for (size_t j = 0; j < HR_ARRAY_LEN(ts); j++) {
            hr_matmul_ctx *mm = NULL;
            long long at = count_begin();
            CHECK(hr_matmul_ctx_create(&k, tp, ts[j], ks[i], &mm, &err) == HR_OK);
            long long got = count_end(at);
            CHECKF(got == (long long)hr_matmul_ctx_bytes(ts[j], ks[i]), "matmul %lld x %lld: %lld vs %llu",
                   (long long)ts[j], (long long)ks[i], got, (unsigned long long)hr_matmul_ctx_bytes(ts[j], ks[i]));
            hr_matmul_ctx_destroy(mm);
        }
    hr_threadpool_destroy(tp);
}
#endif

int main(void) {
#if HR_FAULT
    HR_SKIP("the fault build wraps the allocator itself (fault.c); this test counts through its own wrappers");
#else
    test_kv();
    test_engine();
    test_matmul();
    test_model("tiny", HR_DTYPE_F32);         /* llama, SPM vocabulary */
    test_model("qwen2-tiny", HR_DTYPE_Q8_0);  /* Q/K/V biases, BPE vocabulary */
    test_model("qwen3-tiny", HR_DTYPE_F16);   /* per-head Q/K norms */
    test_model("gemma2-tiny", HR_DTYPE_F32);  /* post norms, window layers */
    test_model("gemma3-tiny", HR_DTYPE_Q4_0); /* window and full layers: two RoPE tables */
    test_model("phi3-tiny", HR_DTYPE_F32);    /* fused Q/K/V and gate/up, LongRoPE */
    /* experts (the router, the grouping scratch): qwen3moe, llama with experts */
    test_model("qwen3moe-tiny", HR_DTYPE_Q8_0);
    test_model("mixtral-tiny", HR_DTYPE_F32);
    test_model("llama-3.2-1b", HR_DTYPE_Q4_0); /* rope_freqs; 128k vocabulary */
    return hr_test_finish();
#endif
}

/* engine_bench.c: the engine under load, driven through its public API on a synthetic model built in
 * memory (no file, no download):
 *
 *   engine_bench mixed [--requests N] [--budget-mib M] [--repeats R] [--seed S] [--threads T]
 *       the same KV byte budget, a mixed workload (prompts 64-2048 tokens, outputs 16-512), all
 *       submitted at once: completed requests per minute, peak concurrency, preemptions and
 *       recomputed tokens for paged x {reserve, optimistic, adaptive} and contiguous; medians of R.
 *   engine_bench burst [--mult K] [--budget-mib M] [--threads T]
 *       K x the concurrency the budget holds, submitted at once to the engine thread from this
 *       thread: every request must complete or be refused with a reason; none lost; max RSS is
 *       printed next to the pool size (run it under /usr/bin/time -v for the kernel's figure).
 *
 * The model: llama, E=128, F=344, H=4, Hkv=2, L=2, V=512, f32 weights, f16 KV (512 B per token): small enough that a
 * 2-core machine runs a few hundred thousand tokens in minutes, with real attention cost at 2k
 * context. Build: see bench/engine_bench.sh. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "common/util.h"
#include "engine/engine.h"
#include "model/synth.h"
#include "runtime/runtime_parts.h"

typedef struct bench {
    hr_model *m;
    void *mem;
    int threads;
    uint64_t budget;
    int n_ctx;
} bench;

static void die(const char *what, const hr_error *err) {
    fprintf(stderr, "engine_bench: %s: %s\n", what, err ? err->msg : "");
    exit(1);
}

static hr_model *build_model(void **mem) {
    hr_synth_shape shape = {.name = "bench-small",
                            .arch = "llama",
                            .n_vocab = 512,
                            .n_embd = 128,
                            .n_ff = 344,
                            .n_head = 4,
                            .n_head_kv = 2,
                            .n_layer = 2,
                            .n_ctx = 4096,
                            .rope_base = 10000.0f,
                            .vocab = HR_SYNTH_VOCAB_SPM};
    hr_error err = {0};
    hr_gguf_writer *w = NULL;
    size_t size;
    hr_gguf *g = NULL;
    hr_model *m = NULL;
    if (hr_synth_build(&shape, HR_DTYPE_F32, 3, &w, &err) || hr_gguf_writer_write_memory(w, mem, &size, &err) ||
        hr_gguf_open_memory(*mem, size, &g, &err) || hr_model_load_gguf(g, &m, &err))
        die("model", &err);
    hr_gguf_writer_destroy(w);
    return m;
}

/* The engine through the runtime (src/runtime), as every front end opens it. */
typedef struct rig {
    hr_runtime *rt;
    hr_engine *e;
} rig;

static rig rig_open(const bench *b, hr_admission adm, hr_kv_layout layout, int max_seqs, int max_queue) {
    hr_runtime_params p = hr_runtime_default_params();
    p.model = b->m;
    p.n_ctx = b->n_ctx;
    p.kv_budget = b->budget;
    p.max_running = max_seqs;
    p.max_queue = max_queue;
    p.admission = (hr_rt_admission)adm;
    p.preempt = HR_RT_PREEMPT_RECOMPUTE;
    p.layout = (hr_rt_layout)layout;
    p.n_threads = b->threads;
    rig r = {0};
    hr_error err = {0};
    if (hr_runtime_open(&p, &r.rt, NULL, &err)) die("runtime", &err);
    r.e = hr_runtime_engine(r.rt);
    return r;
}

static void rig_close(rig *r) { hr_runtime_close(r->rt); }

typedef struct work {
    int32_t *prompt;
    int n_prompt, max_tokens;
} work;

static work *make_work(int n, uint64_t seed, int pmin, int pmax, int omin, int omax) {
    hr_rng rng;
    hr_rng_seed(&rng, seed);
    work *w = calloc((size_t)n, sizeof *w);
    for (int i = 0; i < n; i++) {
        w[i].n_prompt = pmin + (int)(hr_rng_next(&rng) % (uint64_t)(pmax - pmin + 1));
        w[i].max_tokens = omin + (int)(hr_rng_next(&rng) % (uint64_t)(omax - omin + 1));
        w[i].prompt = malloc(sizeof(int32_t) * (size_t)w[i].n_prompt);
        for (int j = 0; j < w[i].n_prompt; j++) w[i].prompt[j] = 3 + (int32_t)(hr_rng_next(&rng) % 509);
    }
    return w;
}

static hr_request_params params_of(const work *w) {
    hr_request_params p = {
        .prompt = w->prompt, .n_prompt = w->n_prompt, .max_tokens = w->max_tokens, .ignore_eos = true};
    p.sampling = hr_sampler_default_params();
    return p;
}

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_dbl);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

/* ---- mixed ------------------------------------------------------------------------------------- */

typedef struct mixed_result {
    double cpu_seconds; /* user + system time of this process during the run */
    double seconds, per_minute, tok_s, ttft_p50;
    int peak, completed;
    double preempt, recomputed;
} mixed_result;

static mixed_result run_mixed(const bench *b, const work *w, int n, hr_admission adm, hr_kv_layout layout) {
    rig r = rig_open(b, adm, layout, 64, n + 1);
    double cpu0 = cpu_seconds();
    hr_request **h = calloc((size_t)n, sizeof *h);
    hr_error err = {0};
    double t0 = hr_time_now();
    for (int i = 0; i < n; i++) {
        hr_request_params p = params_of(&w[i]);
        if (hr_engine_submit(r.e, &p, &h[i], &err) != HR_OK) die("submit", &err);
    }
    if (hr_engine_run_until_idle(r.e, &err) != HR_OK) die("run", &err);
    mixed_result res = {.seconds = hr_time_now() - t0, .cpu_seconds = cpu_seconds() - cpu0};
    hr_engine_stats st;
    hr_engine_get_stats(r.e, &st);
    double *ttft = calloc((size_t)n, sizeof *ttft);
    for (int i = 0; i < n; i++) {
        hr_request_stats s;
        hr_request_get_stats(h[i], &s);
        res.completed += s.state == HR_REQ_COMPLETED;
        ttft[i] = s.t_first_token > 0 ? s.t_first_token - s.t_submit : 0;
        hr_request_release(h[i]);
    }
    res.ttft_p50 = median(ttft, n);
    res.per_minute = res.completed * 60.0 / res.seconds;
    res.tok_s = (double)st.generated_tokens / res.seconds;
    res.peak = st.peak_running;
    res.preempt = (double)st.preemptions;
    res.recomputed = (double)st.recomputed_tokens;
    free(ttft);
    free(h);
    rig_close(&r);
    return res;
}

static void bench_mixed(bench *b, int n, int repeats, uint64_t seed) {
    work *w = make_work(n, seed, 64, 2048, 16, 512);
    long ptok = 0, otok = 0;
    for (int i = 0; i < n; i++) ptok += w[i].n_prompt, otok += w[i].max_tokens;
    char bs[32];
    printf("mixed workload: %d requests, prompts 64-2048 (%ld tokens), outputs 16-512 (%ld tokens); KV budget %s "
           "(f16, %d threads), context %d; medians of %d runs\n\n",
           n, ptok, otok, hr_format_size(b->budget, bs, sizeof bs), b->threads, b->n_ctx, repeats);
    static const struct {
        hr_admission adm;
        hr_kv_layout layout;
        const char *name;
    } cfg[] = {
        {HR_ADMIT_RESERVE, HR_LAYOUT_CONTIGUOUS, "contiguous (slots of n_ctx)"},
        {HR_ADMIT_RESERVE, HR_LAYOUT_PAGED, "paged, reserve"},
        {HR_ADMIT_OPTIMISTIC, HR_LAYOUT_PAGED, "paged, optimistic"},
        {HR_ADMIT_ADAPTIVE, HR_LAYOUT_PAGED, "paged, adaptive"},
    };
    /* repeats outside, configurations inside: a load change on a shared machine hits all of them */
    enum { NC = 4, MAXR = 9 };
    mixed_result res[NC][MAXR];
    for (int k = 0; k < repeats; k++) {
        for (int c = 0; c < NC; c++) {
            res[c][k] = run_mixed(b, w, n, cfg[c].adm, cfg[c].layout);
            if (res[c][k].completed != n)
                fprintf(stderr, "warning: %s: %d of %d completed\n", cfg[c].name, res[c][k].completed, n);
        }
    }
    printf("| layout, admission | req/min | vs contiguous | gen tok/s | TTFT p50 s | peak running | preemptions | "
           "recomputed tokens | wall s | CPU s |\n|---|---|---|---|---|---|---|---|---|---|\n");
    double base = 0;
    for (int c = 0; c < NC; c++) {
        double v[10][MAXR];
        for (int k = 0; k < repeats; k++) {
            const mixed_result *r = &res[c][k];
            double row[10] = {r->per_minute, r->tok_s,      r->ttft_p50, r->peak,
                              r->preempt,    r->recomputed, r->seconds,  r->cpu_seconds};
            for (int f = 0; f < 8; f++) v[f][k] = row[f];
        }
        double md[8];
        for (int f = 0; f < 8; f++) md[f] = median(v[f], repeats);
        if (c == 0) base = md[0];
        printf("| %s | %.1f | %.2fx | %.0f | %.2f | %.0f | %.0f | %.0f | %.1f | %.1f |\n", cfg[c].name, md[0],
               base > 0 ? md[0] / base : 0, md[1], md[2], md[3], md[4], md[5], md[6], md[7]);
    }
    for (int i = 0; i < n; i++) free(w[i].prompt);
    free(w);
}

/* ---- burst ------------------------------------------------------------------------------------- */

static long max_rss_kib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

static void bench_burst(bench *b, int mult) {
    /* requests of 256 prompt + 128 output tokens: how many the budget holds at once (reserve) */
    const hr_hparams *hp = hr_model_hparams(b->m);
    hr_kv_config kc = {.n_layers = hp->n_layer,
                       .n_kv_heads = hp->n_head_kv,
                       .head_dim = hp->head_dim,
                       .block_size = 16,
                       .k_format = HR_KV_F16,
                       .v_format = HR_KV_F16,
                       .max_seqs = 64};
    int per_req_blocks = (256 + 128 - 1 + 15) / 16;
    int holds = (int)(b->budget / hr_kv_block_bytes(&kc)) / per_req_blocks;
    int n = holds * mult, max_queue = holds * mult / 2;
    work *w = make_work(n, 99, 256, 256, 128, 128);
    long rss0 = max_rss_kib();
    rig r = rig_open(b, HR_ADMIT_ADAPTIVE, HR_LAYOUT_PAGED, 64, max_queue);
    long rss1 = max_rss_kib();
    hr_error err = {0};
    if (hr_engine_start(r.e, &err) != HR_OK) die("start", &err);
    hr_request **h = calloc((size_t)n, sizeof *h);
    int refused_full = 0, refused_other = 0;
    char reason[HR_ERROR_MSG_MAX] = "";
    double t0 = hr_time_now();
    for (int i = 0; i < n; i++) {
        hr_request_params p = params_of(&w[i]);
        hr_status st = hr_engine_submit(r.e, &p, &h[i], &err);
        if (st == HR_ERR_FULL) {
            refused_full++;
            if (!reason[0]) snprintf(reason, sizeof reason, "%s", err.msg);
        } else if (st != HR_OK) {
            refused_other++;
        }
    }
    int completed = 0, cancelled = 0, failed = 0;
    for (int i = 0; i < n; i++) {
        if (!h[i]) continue;
        hr_request_wait_done(h[i]);
        hr_request_stats s;
        hr_request_get_stats(h[i], &s);
        completed += s.state == HR_REQ_COMPLETED;
        cancelled += s.state == HR_REQ_CANCELLED;
        failed += s.state == HR_REQ_FAILED;
        hr_request_release(h[i]);
    }
    double secs = hr_time_now() - t0;
    hr_engine_stop(r.e);
    hr_engine_stats st;
    hr_engine_get_stats(r.e, &st);
    hr_kv_pool_ledger l;
    hr_kv_pool_get_ledger(hr_runtime_kv(r.rt), &l);
    long rss2 = max_rss_kib();
    char pb[32];
    int lost = n - (completed + cancelled + failed + refused_full + refused_other);
    printf("burst: %d requests (%d x the %d the budget holds at once: 256 prompt + 128 output tokens each), "
           "max_queue %d, KV pool %s, engine thread + this submitting thread\n",
           n, mult, holds, max_queue, hr_format_size(l.bytes_total, pb, sizeof pb));
    printf("  accepted %d: completed %d, cancelled %d, failed %d | refused %d (queue full) + %d (other) | lost %d\n",
           n - refused_full - refused_other, completed, cancelled, failed, refused_full, refused_other, lost);
    printf("  first refusal: \"%s\"\n", reason);
    printf("  %.1f s, peak %d running, %llu preemptions; pool after: %d used, %d cached, %d free of %d\n", secs,
           st.peak_running, (unsigned long long)st.preemptions, l.blocks_used, l.blocks_cached, l.blocks_free,
           l.blocks_total);
    printf("  max RSS: %ld KiB after the model, %ld KiB after the pool (+%ld; pool %llu KiB), %ld KiB after the burst "
           "(+%ld during the burst)\n",
           rss0, rss1, rss1 - rss0, (unsigned long long)(l.bytes_total / 1024), rss2, rss2 - rss1);
    for (int i = 0; i < n; i++) free(w[i].prompt);
    free(w);
    free(h);
    rig_close(&r);
}

int main(int argc, char **argv) {
    if (argc < 2 || (strcmp(argv[1], "mixed") && strcmp(argv[1], "burst"))) {
        fprintf(stderr, "usage: engine_bench mixed|burst [--requests N] [--repeats R] [--budget-mib M] [--mult K] "
                        "[--seed S] [--threads T]\n");
        return 2;
    }
    bench b = {.threads = 2, .budget = 4ull << 20, .n_ctx = 2560};
    int n = 24, repeats = 3, mult = 10;
    uint64_t seed = 1;
    for (int i = 2; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--requests"))
            n = atoi(v);
        else if (!strcmp(a, "--repeats"))
            repeats = HR_MAX(1, HR_MIN(9, atoi(v)));
        else if (!strcmp(a, "--budget-mib"))
            b.budget = (uint64_t)atoi(v) << 20;
        else if (!strcmp(a, "--mult"))
            mult = atoi(v);
        else if (!strcmp(a, "--seed"))
            seed = (uint64_t)atoll(v);
        else if (!strcmp(a, "--threads"))
            b.threads = atoi(v);
        else {
            fprintf(stderr, "engine_bench: unknown option %s\n", a);
            return 2;
        }
    }
    b.m = build_model(&b.mem);
    if (!strcmp(argv[1], "mixed"))
        bench_mixed(&b, n, repeats, seed);
    else
        bench_burst(&b, mult);
    hr_model_destroy(b.m);
    free(b.mem);
    return 0;
}

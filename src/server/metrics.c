/* metrics.c: the Prometheus exposition (text format 0.0.4) of /metrics. Gauges of the pool and the
 * engine are read from the runtime at scrape time; counters of refusals and histograms of latencies
 * and KV bytes are kept here, under one mutex (a handful of additions per finished request). Names
 * carry the headroom_ prefix and their unit; --metrics-compat vllm adds the vllm: gauges dashboards
 * built for vLLM read. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_internal.h"

#define HIST_MAX_BUCKETS 24

typedef struct hist {
    const char *name, *help;
    const double *le; /* upper bounds, ascending; +Inf implied */
    int n_le;
    uint64_t counts[HIST_MAX_BUCKETS + 1]; /* per bucket (not cumulative); [n_le] is +Inf */
    uint64_t count;
    double sum;
} hist;

static const double le_ttft[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                 0.75,  1,     2.5,  5,    7.5,  10,   20,   40,  80};
static const double le_itl[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                                0.15,  0.2,    0.3,   0.4,  0.5,   0.75, 1,     2.5};
static const double le_e2e[] = {0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 300};
static const double le_queue[] = {0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
static const double le_kv[] = {4096.,     16384.,    65536.,     262144.,     1048576.,   4194304.,
                               16777216., 67108864., 268435456., 1073741824., 4294967296.};

#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

enum { FIN_STOP, FIN_LENGTH, FIN_CANCELLED, FIN_ERROR, FIN_COUNT };
static const char *const fin_names[FIN_COUNT] = {"stop", "length", "cancelled", "error"};
static const char *const refusal_names[HR_REFUSE_COUNT] = {"none",       "invalid",  "context",      "kv_budget",
                                                           "queue_full", "draining", "unauthorized", "too_large"};

struct hr_srv_metrics {
    pthread_mutex_t mu;
    hist ttft, itl, e2e, queue, kv;
    uint64_t refused[HR_REFUSE_COUNT];
    uint64_t prompt_tokens;
    uint64_t finished[FIN_COUNT];
};

static void hist_init(hist *h, const char *name, const char *help, const double *le, int n_le) {
    *h = (hist){.name = name, .help = help, .le = le, .n_le = n_le};
}

/* Observes value `count` times (a request's mean inter-token gap stands for each of its gaps). */
static void hist_observe(hist *h, double v, uint64_t count) {
    int b = 0;
    while (b < h->n_le && v > h->le[b]) b++;
    h->counts[b] += count;
    h->count += count;
    h->sum += v * (double)count;
}

hr_status hr_srv_metrics_create(hr_srv_metrics **out, hr_error *err) {
    hr_srv_metrics *m = calloc(1, sizeof *m);
    if (!m) return hr_error_set(err, HR_ERR_NOMEM, "out of memory for the server's metrics");
    pthread_mutex_init(&m->mu, NULL);
    hist_init(&m->ttft, "headroom_time_to_first_token_seconds", "Submit to first generated token.", le_ttft,
              N_OF(le_ttft));
    hist_init(&m->itl, "headroom_inter_token_latency_seconds",
              "Gap between consecutive generated tokens of a request, as published to its stream.", le_itl,
              N_OF(le_itl));
    hist_init(&m->e2e, "headroom_e2e_request_latency_seconds", "Submit to finish.", le_e2e, N_OF(le_e2e));
    hist_init(&m->queue, "headroom_request_queue_time_seconds", "Submit to first admission into the KV pool.", le_queue,
              N_OF(le_queue));
    hist_init(&m->kv, "headroom_request_kv_peak_bytes", "KV bytes a request held at its peak, observed at finish.",
              le_kv, N_OF(le_kv));
    *out = m;
    return HR_OK;
}

void hr_srv_metrics_destroy(hr_srv_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void hr_srv_metrics_refused(hr_srv_metrics *m, hr_srv_refusal why) {
    if ((int)why <= 0 || (int)why >= HR_REFUSE_COUNT) return;
    pthread_mutex_lock(&m->mu);
    m->refused[why]++;
    pthread_mutex_unlock(&m->mu);
}

void hr_srv_metrics_prompt_tokens(hr_srv_metrics *m, int n) {
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += (uint64_t)(n > 0 ? n : 0);
    pthread_mutex_unlock(&m->mu);
}

void hr_srv_metrics_finished(hr_srv_metrics *m, const hr_rt_result *r, const float *gaps, int n_gaps) {
    int fin = FIN_ERROR;
    if (r->state == HR_RT_CANCELLED)
        fin = FIN_CANCELLED;
    else if (r->state == HR_RT_COMPLETED)
        fin = r->finish_reason && !strcmp(r->finish_reason, "length") ? FIN_LENGTH : FIN_STOP;
    pthread_mutex_lock(&m->mu);
    m->finished[fin]++;
    if (r->t_first_token > 0 && r->t_submit > 0) hist_observe(&m->ttft, r->t_first_token - r->t_submit, 1);
    for (int i = 0; i < n_gaps; i++) hist_observe(&m->itl, gaps[i], 1);
    if (r->t_finish > 0 && r->t_submit > 0) hist_observe(&m->e2e, r->t_finish - r->t_submit, 1);
    if (r->kv.queued_seconds > 0 || r->t_first_token > 0) hist_observe(&m->queue, r->kv.queued_seconds, 1);
    hist_observe(&m->kv, (double)r->kv.bytes_peak, 1);
    pthread_mutex_unlock(&m->mu);
}

/* ---- rendering --------------------------------------------------------------------------------- */

static void family(hr_srv_buf *b, const char *name, const char *type, const char *help) {
    hr_srv_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sample_u(hr_srv_buf *b, const char *name, const char *labels, uint64_t v) {
    hr_srv_buf_printf(b, "%s%s %llu\n", name, labels ? labels : "", (unsigned long long)v);
}

static void sample_d(hr_srv_buf *b, const char *name, const char *labels, double v) {
    hr_srv_buf_printf(b, "%s%s %.17g\n", name, labels ? labels : "", v);
}

static void hist_render(hr_srv_buf *b, const hist *h) {
    family(b, h->name, "histogram", h->help);
    uint64_t cum = 0;
    for (int i = 0; i < h->n_le; i++) {
        cum += h->counts[i];
        hr_srv_buf_printf(b, "%s_bucket{le=\"%.17g\"} %llu\n", h->name, h->le[i], (unsigned long long)cum);
    }
    hr_srv_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", h->name, (unsigned long long)h->count);
    sample_d(b, h->name, "_sum", h->sum); /* "_sum" rides in the label slot: name_sum value */
    sample_u(b, h->name, "_count", h->count);
}

/* A label value with \, " and newline escaped as the format asks. */
static void label_value(const char *s, char *out, size_t cap) {
    size_t k = 0;
    for (; *s && k + 3 < cap; s++) {
        if (*s == '\\' || *s == '"') out[k++] = '\\';
        if (*s == '\n') {
            out[k++] = '\\';
            out[k++] = 'n';
            continue;
        }
        out[k++] = *s;
    }
    out[k] = '\0';
}

static void render_runtime(hr_runtime *rt, hr_metrics_compat compat, const uint64_t *prompt_tokens, hr_srv_buf *b) {
    hr_runtime_pool p;
    hr_runtime_get_pool(rt, &p);
    const hr_rt_pool_ledger *l = &p.ledger;
    family(b, "headroom_kv_pool_bytes", "gauge", "KV pool bytes by block state.");
    sample_u(b, "headroom_kv_pool_bytes", "{state=\"used\"}", l->bytes_used);
    sample_u(b, "headroom_kv_pool_bytes", "{state=\"cached\"}", l->bytes_cached);
    sample_u(b, "headroom_kv_pool_bytes", "{state=\"free\"}", l->bytes_free);
    family(b, "headroom_kv_pool_blocks", "gauge", "KV pool blocks by state.");
    sample_u(b, "headroom_kv_pool_blocks", "{state=\"used\"}", (uint64_t)l->blocks_used);
    sample_u(b, "headroom_kv_pool_blocks", "{state=\"cached\"}", (uint64_t)l->blocks_cached);
    sample_u(b, "headroom_kv_pool_blocks", "{state=\"free\"}", (uint64_t)l->blocks_free);
    family(b, "headroom_kv_pool_total_bytes", "gauge", "Bytes of all KV blocks.");
    sample_u(b, "headroom_kv_pool_total_bytes", NULL, l->bytes_total);
    family(b, "headroom_kv_budget_bytes", "gauge", "The KV budget the pool was sized by.");
    sample_u(b, "headroom_kv_budget_bytes", NULL, p.budget_bytes);
    hr_runtime_memory m;
    hr_runtime_get_memory(rt, &m);
    family(b, "headroom_memory_planned_bytes", "gauge", "The memory plan the pool was sized by, by part.");
    sample_u(b, "headroom_memory_planned_bytes", "{part=\"weights\"}", m.weight_bytes);
    sample_u(b, "headroom_memory_planned_bytes", "{part=\"kv\"}", m.kv_bytes);
    sample_u(b, "headroom_memory_planned_bytes", "{part=\"scratch\"}", m.scratch_bytes);
    sample_u(b, "headroom_memory_planned_bytes", "{part=\"tables\"}", m.meta_bytes);
    sample_u(b, "headroom_memory_planned_bytes", "{part=\"overhead\"}", m.base_bytes);
    sample_u(b, "headroom_memory_planned_bytes", "{part=\"requests\"}", m.request_bytes);
    sample_u(b, "headroom_memory_planned_bytes", "{part=\"total\"}", m.planned_bytes);
    hr_rt_device_mem d;
    if (hr_runtime_device_mem(rt, &d)) { /* --device cuda: the GPU's memory, the arena by part */
        family(b, "headroom_device_memory_bytes", "gauge",
               "GPU memory: the driver's total, free at start, the budget (gpu_util x total), the arena and its "
               "parts, and the arena in use now.");
        const struct {
            const char *label;
            uint64_t v;
        } parts[] = {{"{part=\"total\"}", d.total_bytes},    {"{part=\"free_at_start\"}", d.free_bytes},
                     {"{part=\"budget\"}", d.budget_bytes},  {"{part=\"arena\"}", d.arena_bytes},
                     {"{part=\"weights\"}", d.weight_bytes}, {"{part=\"scratch\"}", d.scratch_bytes},
                     {"{part=\"kv\"}", d.kv_bytes},          {"{part=\"arena_used\"}", d.arena_used_bytes}};
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
            sample_u(b, "headroom_device_memory_bytes", parts[i].label, parts[i].v);
    }
    family(b, "headroom_memory_rss_bytes", "gauge", "Resident bytes of this process now (VmRSS).");
    sample_u(b, "headroom_memory_rss_bytes", NULL, m.rss_bytes);
    family(b, "headroom_memory_peak_rss_bytes", "gauge", "Peak resident bytes of this process (VmHWM).");
    sample_u(b, "headroom_memory_peak_rss_bytes", NULL, m.peak_rss_bytes);
    family(b, "headroom_kv_headroom_bytes", "gauge",
           "Free and evictable KV bytes minus what admitted requests may still claim.");
    sample_d(b, "headroom_kv_headroom_bytes", NULL, (double)p.headroom_bytes);
    family(b, "headroom_kv_waste_bytes", "gauge", "Bytes of unfilled slots in used blocks.");
    sample_u(b, "headroom_kv_waste_bytes", NULL, l->waste_bytes);
    family(b, "headroom_kv_swapped_bytes", "gauge", "Bytes of this pool's sequences in the swap tier.");
    sample_u(b, "headroom_kv_swapped_bytes", NULL, l->bytes_swapped);
    const hr_rt_engine_stats *e = &p.engine;
    family(b, "headroom_requests_running", "gauge", "Requests holding KV and generating.");
    sample_u(b, "headroom_requests_running", NULL, (uint64_t)e->n_running);
    family(b, "headroom_requests_waiting", "gauge", "Requests queued for admission (preempted ones included).");
    sample_u(b, "headroom_requests_waiting", NULL, (uint64_t)e->n_waiting);
    family(b, "headroom_preemptions_total", "counter", "Preemptions by mode.");
    sample_u(b, "headroom_preemptions_total", "{mode=\"swap\"}", e->preempt_swap);
    sample_u(b, "headroom_preemptions_total", "{mode=\"recompute\"}", e->preempt_recompute);
    family(b, "headroom_prefix_cache_hit_tokens_total", "counter", "Prompt tokens served from the prefix cache.");
    sample_u(b, "headroom_prefix_cache_hit_tokens_total", NULL, e->prefix_hit_tokens);
    family(b, "headroom_prompt_tokens_total", "counter", "Prompt tokens of accepted requests.");
    sample_u(b, "headroom_prompt_tokens_total", NULL, *prompt_tokens);
    family(b, "headroom_generation_tokens_total", "counter", "Tokens generated.");
    sample_u(b, "headroom_generation_tokens_total", NULL, e->generated_tokens);
    if (compat == HR_METRICS_VLLM) {
        char name[256], lab[300];
        label_value(hr_runtime_model_name(rt), name, sizeof name);
        snprintf(lab, sizeof lab, "{model_name=\"%s\"}", name);
        double usage = l->blocks_total > 0 ? (double)l->blocks_used / l->blocks_total : 0;
        family(b, "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.");
        sample_u(b, "vllm:num_requests_running", lab, (uint64_t)e->n_running);
        family(b, "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.");
        sample_u(b, "vllm:num_requests_waiting", lab, (uint64_t)e->n_waiting);
        family(b, "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.");
        sample_d(b, "vllm:kv_cache_usage_perc", lab, usage);
        family(b, "vllm:gpu_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.");
        sample_d(b, "vllm:gpu_cache_usage_perc", lab, usage);
        /* the counters routers and autoscalers read (vLLM's names and types; prefix-cache figures in
         * tokens, as vLLM counts them) */
        family(b, "vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.");
        sample_u(b, "vllm:num_preemptions_total", lab, e->preemptions);
        family(b, "vllm:prefix_cache_queries_total", "counter",
               "Prefix cache queries, in terms of number of queried tokens.");
        sample_u(b, "vllm:prefix_cache_queries_total", lab, e->prefix_query_tokens);
        family(b, "vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.");
        sample_u(b, "vllm:prefix_cache_hits_total", lab, e->prefix_hit_tokens);
    }
}

void hr_srv_metrics_render(hr_srv_metrics *m, hr_runtime *rt, hr_metrics_compat compat, hr_srv_buf *b) {
    pthread_mutex_lock(&m->mu);
    hr_srv_metrics snap = *m; /* render without holding the lock across runtime calls */
    pthread_mutex_unlock(&m->mu);
    family(b, "headroom_up", "gauge", "1 once the model is loaded.");
    sample_u(b, "headroom_up", NULL, rt ? 1 : 0);
    if (rt) render_runtime(rt, compat, &snap.prompt_tokens, b);
    family(b, "headroom_requests_refused_total", "counter", "Requests refused, by reason.");
    for (int i = 1; i < HR_REFUSE_COUNT; i++) {
        char lab[64];
        snprintf(lab, sizeof lab, "{reason=\"%s\"}", refusal_names[i]);
        sample_u(b, "headroom_requests_refused_total", lab, snap.refused[i]);
    }
    family(b, "headroom_requests_finished_total", "counter", "Requests (choices) finished, by finish reason.");
    for (int i = 0; i < FIN_COUNT; i++) {
        char lab[64];
        snprintf(lab, sizeof lab, "{finish_reason=\"%s\"}", fin_names[i]);
        sample_u(b, "headroom_requests_finished_total", lab, snap.finished[i]);
    }
    hist_render(b, &snap.ttft);
    hist_render(b, &snap.itl);
    hist_render(b, &snap.e2e);
    hist_render(b, &snap.queue);
    hist_render(b, &snap.kv);
}

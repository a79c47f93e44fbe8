/* activity.c: the server's side of the live view (see activity.h): a ring of refusals, rings of
 * recent latencies, and counter samples from which rates over the last minute are computed when
 * someone asks.
 *
 * Invariants (under mu):
 *   1. Each ring keeps its newest entries: entry k of a ring with `n` appended lives at k % CAP and is
 *      valid for k >= n - CAP.
 *   2. Samples are appended at most every SAMPLE_GAP_S, only from hr_srv_activity_add_json, so an
 *      unwatched server takes none. The first one is the start (all counters 0). */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/util.h"
#include "server/activity.h"

#define REFUSALS     256   /* refusal events kept */
#define TTFTS        4096  /* finished requests' first-token latencies kept */
#define GAPS         32768 /* inter-token gaps kept */
#define SAMPLES      1024  /* counter samples (4 a second at most: over 4 minutes) */
#define ENGINE_EVS   256   /* engine events a /v1/kv answer carries at most */
#define WINDOW_S     60.0  /* rates and percentiles cover this much */
#define SAMPLE_GAP_S 0.25

typedef struct refusal {
    uint64_t seq;
    double t;
    int http;
    hr_srv_refusal why;
    char msg[160];
} refusal;

typedef struct stamp {
    double t; /* hr_time_now() */
    float v;  /* seconds */
} stamp;

typedef struct sample {
    double t;
    uint64_t submitted, finished, prompt_tokens, generated_tokens;
} sample;

struct hr_srv_activity {
    pthread_mutex_t mu;
    double t_start;
    uint64_t snapshot;
    uint64_t submitted, finished, prompt_tokens; /* cumulative */
    refusal ref[REFUSALS];
    uint64_t n_ref;
    stamp ttft[TTFTS];
    uint64_t n_ttft;
    stamp gap[GAPS];
    uint64_t n_gap;
    sample smp[SAMPLES];
    uint64_t n_smp;
};

static const char *const refusal_names[HR_REFUSE_COUNT] = {"none",       "invalid",  "context",      "kv_budget",
                                                           "queue_full", "draining", "unauthorized", "too_large"};

hr_status hr_srv_activity_create(hr_srv_activity **out, hr_error *err) {
    hr_srv_activity *a = calloc(1, sizeof *a);
    if (!a) return hr_error_set(err, HR_ERR_NOMEM, "out of memory for the server's activity window");
    pthread_mutex_init(&a->mu, NULL);
    a->t_start = hr_time_now();
    a->smp[0] = (sample){.t = a->t_start};
    a->n_smp = 1;
    *out = a;
    return HR_OK;
}

void hr_srv_activity_destroy(hr_srv_activity *a) {
    if (!a) return;
    pthread_mutex_destroy(&a->mu);
    free(a);
}

void hr_srv_activity_submitted(hr_srv_activity *a, int n, int n_prompt) {
    pthread_mutex_lock(&a->mu);
    a->submitted += (uint64_t)(n > 0 ? n : 0);
    a->prompt_tokens += (uint64_t)(n_prompt > 0 ? n_prompt : 0) * (uint64_t)(n > 0 ? n : 0);
    pthread_mutex_unlock(&a->mu);
}

void hr_srv_activity_refused(hr_srv_activity *a, const hr_srv_error *e) {
    if ((int)e->refusal <= 0 || (int)e->refusal >= HR_REFUSE_COUNT) return;
    pthread_mutex_lock(&a->mu);
    refusal *r = &a->ref[a->n_ref % REFUSALS];
    a->n_ref++;
    *r = (refusal){.seq = a->n_ref, .t = hr_time_now(), .http = e->http, .why = e->refusal};
    /* events are read by whoever holds a key (and the dashboard): never a client's text, which may
       be another tenant's secret */
    char clean[sizeof e->msg];
    hr_srv_redact(e->msg, clean, sizeof clean);
    size_t len = strnlen(clean, sizeof r->msg - 1);
    while (len > 0 && len < strlen(clean) && ((unsigned char)clean[len] & 0xC0) == 0x80)
        len--; /* cut on a UTF-8 character boundary: JSON strings must stay valid */
    memcpy(r->msg, clean, len);
    r->msg[len] = '\0';
    pthread_mutex_unlock(&a->mu);
}

void hr_srv_activity_finished(hr_srv_activity *a, const hr_rt_result *r, const float *gaps, int n_gaps) {
    double now = hr_time_now();
    pthread_mutex_lock(&a->mu);
    a->finished++;
    if (r->t_first_token > 0 && r->t_submit > 0)
        a->ttft[a->n_ttft++ % TTFTS] = (stamp){.t = now, .v = (float)(r->t_first_token - r->t_submit)};
    for (int i = n_gaps > GAPS ? n_gaps - GAPS : 0; i < n_gaps; i++)
        a->gap[a->n_gap++ % GAPS] = (stamp){.t = now, .v = gaps[i]};
    pthread_mutex_unlock(&a->mu);
}

/* ---- reading (only when asked) ----------------------------------------------------------------- */

static int cmp_float(const void *x, const void *y) {
    float a = *(const float *)x, b = *(const float *)y;
    return (a > b) - (a < b);
}

/* p50 and p99 (nearest rank) of the entries of ring newer than since, or null when there are none. */
static void percentiles(const stamp *ring, uint64_t n, uint64_t cap, double since, float *scratch, json_t *o,
                        const char *k50, const char *k99) {
    size_t m = 0;
    for (uint64_t k = n > cap ? n - cap : 0; k < n; k++)
        if (ring[k % cap].t >= since) scratch[m++] = ring[k % cap].v;
    if (m == 0) {
        json_object_set_new(o, k50, json_null());
        json_object_set_new(o, k99, json_null());
        return;
    }
    qsort(scratch, m, sizeof *scratch, cmp_float);
    size_t i50 = (size_t)ceil(0.50 * (double)m) - 1, i99 = (size_t)ceil(0.99 * (double)m) - 1;
    json_object_set_new(o, k50, json_real(scratch[i50]));
    json_object_set_new(o, k99, json_real(scratch[i99]));
}

static json_t *rates_json(const sample *base, const sample *now) {
    double dt = now->t - base->t;
    json_t *o = json_object();
    json_object_set_new(o, "window_seconds", json_real(dt));
    if (dt <= 0) dt = 1; /* no interval yet: the counters are all 0 here */
    json_object_set_new(o, "requests_per_s", json_real((double)(now->finished - base->finished) / dt));
    json_object_set_new(o, "arrivals_per_s", json_real((double)(now->submitted - base->submitted) / dt));
    json_object_set_new(o, "prompt_tokens_per_s", json_real((double)(now->prompt_tokens - base->prompt_tokens) / dt));
    json_object_set_new(o, "generated_tokens_per_s",
                        json_real((double)(now->generated_tokens - base->generated_tokens) / dt));
    return o;
}

static json_t *server_json(hr_runtime *rt, const hr_server_params *sp) {
    const hr_runtime_params *p = hr_runtime_get_params(rt);
    const hr_kv_budget *b = hr_runtime_budget(rt);
    json_t *o = json_object();
    json_object_set_new(o, "model", json_string(hr_runtime_model_name(rt)));
    json_object_set_new(o, "demo", json_boolean(hr_runtime_is_demo(rt)));
    json_object_set_new(o, "n_ctx", json_integer(hr_runtime_n_ctx(rt)));
    json_object_set_new(o, "kv_budget_bytes", json_integer((json_int_t)b->budget_bytes));
    json_object_set_new(o, "kv_blocks", json_integer(b->n_blocks));
    json_object_set_new(o, "block_bytes", json_integer((json_int_t)b->block_bytes));
    json_object_set_new(o, "k_format", json_string(hr_rt_kv_format_name(p->k_format)));
    json_object_set_new(o, "v_format", json_string(hr_rt_kv_format_name(p->v_format)));
    json_object_set_new(o, "block_size", json_integer(p->block_size));
    json_object_set_new(o, "kv_policy", json_string(p->kv_policy ? p->kv_policy : "full"));
    json_object_set_new(o, "layout", json_string(hr_rt_layout_name(p->layout)));
    json_object_set_new(o, "admission", json_string(hr_rt_admission_name(p->admission)));
    json_object_set_new(o, "preempt", json_string(hr_rt_preempt_name(p->preempt)));
    json_object_set_new(o, "swap_space_bytes", json_integer((json_int_t)p->swap_space));
    json_object_set_new(o, "max_batch_tokens", json_integer(p->max_batch_tokens));
    json_object_set_new(o, "prefill_chunk", json_integer(p->prefill_chunk));
    json_object_set_new(o, "max_running", json_integer(p->max_running));
    json_object_set_new(o, "max_queue", json_integer(p->max_queue));
    json_object_set_new(o, "threads", json_integer(p->n_threads));
    json_object_set_new(o, "api_key", json_boolean(sp->api_key != NULL));
    json_object_set_new(o, "max_body_bytes", json_integer((json_int_t)sp->max_body_bytes));
    json_object_set_new(o, "drain_timeout_s", json_real(sp->drain_timeout_s));
    json_object_set_new(o, "metrics_compat", json_string(sp->metrics_compat == HR_METRICS_VLLM ? "vllm" : "native"));
    return o;
}

/* Engine events (newest ENGINE_EVS) and refusals, merged in time order. */
static json_t *events_json(hr_runtime *rt, const refusal *ref, int n_ref, double mono_now, double unix_now) {
    hr_rt_event *ev = malloc(sizeof *ev * ENGINE_EVS);
    int n_ev = ev ? hr_runtime_events(rt, 0, ev, ENGINE_EVS) : 0;
    json_t *arr = json_array();
    int i = 0, k = 0;
    while (i < n_ev || k < n_ref) {
        json_t *o;
        if (k >= n_ref || (i < n_ev && ev[i].t <= ref[k].t)) {
            const hr_rt_event *x = &ev[i++];
            o = json_pack("{s:I, s:s, s:f, s:I, s:i, s:I}", "seq", (json_int_t)x->seq, "kind", x->kind, "time",
                          unix_now - (mono_now - x->t), "request_id", (json_int_t)x->request, "tokens", x->tokens,
                          "bytes", (json_int_t)x->bytes);
        } else {
            const refusal *x = &ref[k++];
            o = json_pack("{s:I, s:s, s:f, s:s, s:i, s:s}", "seq", (json_int_t)x->seq, "kind", "refusal", "time",
                          unix_now - (mono_now - x->t), "reason", refusal_names[x->why], "http", x->http, "message",
                          x->msg);
        }
        if (o) json_array_append_new(arr, o);
    }
    free(ev);
    return arr;
}

void hr_srv_activity_add_json(hr_srv_activity *a, hr_runtime *rt, const hr_server_params *sp, json_t *kv) {
    hr_runtime_pool pool;
    hr_runtime_get_pool(rt, &pool);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double unix_now = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    double now = hr_time_now();
    float *scratch = malloc(sizeof(float) * GAPS);
    refusal *ref = malloc(sizeof(refusal) * REFUSALS);
    json_t *rates;
    int n_ref = 0;

    pthread_mutex_lock(&a->mu);
    uint64_t snap = ++a->snapshot;
    sample cur = {.t = now,
                  .submitted = a->submitted,
                  .finished = a->finished,
                  .prompt_tokens = a->prompt_tokens,
                  .generated_tokens = pool.engine.generated_tokens};
    const sample *last = &a->smp[(a->n_smp - 1) % SAMPLES];
    if (now - last->t >= SAMPLE_GAP_S) a->smp[a->n_smp++ % SAMPLES] = cur;
    /* the base of the rates: the oldest earlier sample inside the window, else the newest before it */
    const sample *inside = NULL, *older = NULL;
    for (uint64_t k = a->n_smp > SAMPLES ? a->n_smp - SAMPLES : 0; k < a->n_smp; k++) {
        const sample *s = &a->smp[k % SAMPLES];
        if (s->t >= now) break;
        if (s->t < now - WINDOW_S)
            older = s;
        else if (!inside)
            inside = s;
    }
    sample b = inside ? *inside : older ? *older : cur;
    rates = rates_json(&b, &cur);
    if (scratch) {
        percentiles(a->ttft, a->n_ttft, TTFTS, now - WINDOW_S, scratch, rates, "ttft_p50_seconds", "ttft_p99_seconds");
        percentiles(a->gap, a->n_gap, GAPS, now - WINDOW_S, scratch, rates, "itl_p50_seconds", "itl_p99_seconds");
    }
    if (ref)
        for (uint64_t k = a->n_ref > REFUSALS ? a->n_ref - REFUSALS : 0; k < a->n_ref; k++)
            ref[n_ref++] = a->ref[k % REFUSALS];
    json_t *counters =
        json_pack("{s:I, s:I, s:I, s:I, s:I}", "requests_submitted", (json_int_t)a->submitted, "requests_finished",
                  (json_int_t)a->finished, "prompt_tokens", (json_int_t)a->prompt_tokens, "generated_tokens",
                  (json_int_t)pool.engine.generated_tokens, "refusals", (json_int_t)a->n_ref);
    double t_start = a->t_start;
    pthread_mutex_unlock(&a->mu);

    json_object_set_new(kv, "snapshot", json_integer((json_int_t)snap));
    json_object_set_new(kv, "time", json_real(unix_now));
    json_object_set_new(kv, "uptime_seconds", json_real(now - t_start));
    json_object_set_new(kv, "counters", counters);
    json_object_set_new(kv, "rates", rates);
    json_object_set_new(kv, "events", events_json(rt, ref, n_ref, now, unix_now));
    json_object_set_new(kv, "server", server_json(rt, sp));
    free(scratch);
    free(ref);
}

void hr_srv_activity_row_json(const hr_rt_result *r, double now, json_t *row) {
    const hr_rt_request_stats *s = &r->stats;
    const char *phase = "finished";
    if (s->state == HR_RT_WAITING)
        phase = "waiting";
    else if (s->state == HR_RT_PREEMPTED)
        phase = s->swapped ? "swapped" : "preempted";
    else if (s->state == HR_RT_RUNNING)
        phase = s->n_computed < s->n_prompt + s->n_output - 1 || s->n_output == 0 ? "prefill" : "decode";
    int blocks = s->kv.blocks_own + s->kv.blocks_shared;
    uint64_t shared = blocks > 0 && s->state == HR_RT_RUNNING
                          ? s->kv.bytes_now / (uint64_t)blocks * (uint64_t)s->kv.blocks_shared
                          : 0;
    json_object_set_new(row, "request_id", json_integer((json_int_t)s->id));
    json_object_set_new(row, "phase", json_string(phase));
    json_object_set_new(row, "priority", json_integer(s->priority));
    json_object_set_new(row, "age_seconds", json_real(s->t_submit > 0 ? now - s->t_submit : 0));
    json_object_set_new(row, "computed_tokens", json_integer(s->n_computed));
    json_object_set_new(row, "shared_blocks", json_integer(s->kv.blocks_shared));
    json_object_set_new(row, "shared_bytes", json_integer((json_int_t)shared));
    /* kv.bytes_now of a final request is what it held at its last step (its usage); it holds none now */
    bool final = s->state == HR_RT_COMPLETED || s->state == HR_RT_CANCELLED || s->state == HR_RT_FAILED;
    json_object_set_new(row, "held_bytes", json_integer(final ? 0 : (json_int_t)s->kv.bytes_now));
}

/* cluster.c: see runtime.h (replicas). The pool has one observer; the runtime fans its callbacks out
 * to the KV event publisher (src/events) and the shared tier on Redis (src/remote), whichever started,
 * so that a front end asks for them by endpoint and never holds the pool. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "events/kv_events.h"
#include "remote/kv_remote.h"
#include "runtime/runtime_parts.h"

struct hr_rt_cluster {
    hr_kv_events *events;
    hr_kv_remote *remote;
    hr_kv_observer ev_obs, rm_obs;
    void (*log)(void *log_ctx, const char *line);
    void *log_ctx;
};

__attribute__((format(printf, 2, 3))) static void cl_logf(const hr_rt_cluster *c, const char *fmt, ...) {
    if (!c->log) return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    c->log(c->log_ctx, line);
}

static void cl_stored(void *ctx, const hr_kv_block_info *b) {
    hr_rt_cluster *c = ctx;
    if (c->events) c->ev_obs.stored(c->ev_obs.ctx, b);
    if (c->remote) c->rm_obs.stored(c->rm_obs.ctx, b);
}
static void cl_removed(void *ctx, uint64_t hash, int group) {
    hr_rt_cluster *c = ctx;
    if (c->events) c->ev_obs.removed(c->ev_obs.ctx, hash, group);
}
static bool cl_fetch(void *ctx, const hr_kv_block_info *b, void *out, uint64_t n) {
    hr_rt_cluster *c = ctx;
    return c->remote && c->rm_obs.fetch(c->rm_obs.ctx, b, out, n);
}

hr_rt_cluster *hr_runtime_cluster_start(hr_runtime *rt, const hr_rt_cluster_params *p) {
    hr_rt_cluster tmp = {.log = p->log, .log_ctx = p->log_ctx};
    if (!p->kv_events && p->kv_events_replay) cl_logf(&tmp, "--kv-events-replay without --kv-events: no KV events");
    if (!p->kv_events && !p->kv_remote) return NULL;
    hr_rt_cluster *c = calloc(1, sizeof *c);
    if (!c) {
        cl_logf(&tmp, "out of memory: serving without KV events or a KV tier");
        return NULL;
    }
    *c = tmp;
    hr_error err = {0};
    if (p->kv_events) {
        hr_kv_events_params ep = hr_kv_events_default_params();
        ep.endpoint = p->kv_events;
        ep.replay_endpoint = p->kv_events_replay;
        ep.topic = p->kv_events_topic;
        ep.groups = hr_kv_pool_groups(hr_runtime_kv(rt)); /* a hybrid pool's events name their group */
        if (hr_kv_events_create(&ep, &c->events, &err) != HR_OK) {
            cl_logf(c, "%s: serving without KV events", err.msg);
        } else {
            /* the first batch tells subscribers to forget what an earlier process on this endpoint held */
            hr_kv_events_all_cleared(c->events);
            c->ev_obs = hr_kv_events_observer(c->events);
            cl_logf(c, "KV events on %s%s%s", p->kv_events, p->kv_events_replay ? ", replay on " : "",
                    p->kv_events_replay ? p->kv_events_replay : "");
        }
    }
    if (p->kv_remote) {
        const char *id = p->model_id ? p->model_id : hr_runtime_model_name(rt);
        hr_kv_remote_params rp = {
            .url = p->kv_remote, .model_id = id, .pool = hr_runtime_kv(rt), .log = p->log, .log_ctx = p->log_ctx};
        if (hr_kv_remote_create(&rp, &c->remote, &err) != HR_OK) {
            cl_logf(c, "%s: serving without the shared KV tier", err.msg);
        } else {
            c->rm_obs = hr_kv_remote_observer(c->remote);
            cl_logf(c, "shared KV tier on %s (model id %s)", p->kv_remote, id);
        }
    }
    hr_kv_observer obs = {.stored = cl_stored, .removed = cl_removed, .fetch = c->remote ? cl_fetch : NULL, .ctx = c};
    if ((!c->events && !c->remote) || hr_kv_pool_set_observer(hr_runtime_kv(rt), &obs, &err) != HR_OK) {
        if (c->events || c->remote) cl_logf(c, "%s: serving without them", err.msg);
        hr_kv_events_destroy(c->events);
        hr_kv_remote_destroy(c->remote);
        free(c);
        return NULL;
    }
    return c;
}

void hr_runtime_cluster_stop(hr_runtime *rt, hr_rt_cluster *c) {
    if (!c) return;
    hr_kv_pool_set_observer(hr_runtime_kv(rt), NULL, NULL);
    if (c->events) {
        hr_kv_events_all_cleared(c->events); /* the pool goes away with this process */
        hr_kv_events_stats st;
        hr_kv_events_flush(c->events, 1000);
        hr_kv_events_get_stats(c->events, &st);
        cl_logf(c, "KV events: %llu batches, %llu events, %llu dropped (queue full), %llu replays",
                (unsigned long long)st.batches, (unsigned long long)st.events, (unsigned long long)st.dropped,
                (unsigned long long)st.replays);
        hr_kv_events_destroy(c->events);
    }
    if (c->remote) {
        hr_kv_remote_flush(c->remote, 5000);
        hr_kv_remote_stats st;
        hr_kv_remote_get_stats(c->remote, &st);
        cl_logf(c,
                "KV tier: fetched %llu blocks (%llu missed, %llu rejected, %llu errors), stored %llu "
                "(%llu errors, %llu dropped), %.1f MiB in, %.1f MiB out",
                (unsigned long long)st.fetched, (unsigned long long)st.missed, (unsigned long long)st.rejected,
                (unsigned long long)st.fetch_errors, (unsigned long long)st.stored, (unsigned long long)st.store_errors,
                (unsigned long long)st.dropped, st.bytes_in / 1048576.0, st.bytes_out / 1048576.0);
        hr_kv_remote_destroy(c->remote);
    }
    free(c);
}

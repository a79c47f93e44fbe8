/* serve_cluster.c: see serve_cluster.h. The pool has one observer; this file fans its callbacks out
 * to the KV event publisher and the Redis tier, whichever started. */
#include "cli/serve_cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/args.h"
#include "events/kv_events.h"
#include "remote/kv_remote.h"

struct hr_serve_cluster {
    hr_kv_events *events;
    hr_kv_remote *remote;
    hr_kv_observer ev_obs, rm_obs;
};

bool hr_serve_cluster_option(hr_serve_cluster_opts *o, int argc, char **argv, int *i, bool *ok) {
    const char *a = argv[*i];
    const char **dst = !strcmp(a, "--kv-events")          ? &o->kv_events
                       : !strcmp(a, "--kv-events-replay") ? &o->kv_events_replay
                       : !strcmp(a, "--kv-events-topic")  ? &o->kv_events_topic
                       : !strcmp(a, "--kv-remote")        ? &o->kv_remote
                                                          : NULL;
    if (!dst) return false;
    *ok = (*dst = hr_arg_value("serve", argc, argv, i)) != NULL;
    return true;
}

static void cl_stored(void *ctx, const hr_kv_block_info *b) {
    hr_serve_cluster *c = ctx;
    if (c->events) c->ev_obs.stored(c->ev_obs.ctx, b);
    if (c->remote) c->rm_obs.stored(c->rm_obs.ctx, b);
}
static void cl_removed(void *ctx, uint64_t hash) {
    hr_serve_cluster *c = ctx;
    if (c->events) c->ev_obs.removed(c->ev_obs.ctx, hash);
}
static bool cl_fetch(void *ctx, const hr_kv_block_info *b, void *out, uint64_t n) {
    hr_serve_cluster *c = ctx;
    return c->remote && c->rm_obs.fetch(c->rm_obs.ctx, b, out, n);
}

static void cl_log(void *ctx, const char *line) {
    (void)ctx;
    fprintf(stderr, "headroom serve: %s\n", line);
}

/* The model's identity for the shared tier: two replicas share blocks only when it is equal. A GGUF
 * is named by its size and a hash of its first and last MiB and of 64 KiB every 64 MiB (its
 * metadata, tensor directory and samples of every region of the weights); the demo model by name. */
static void cl_model_id(hr_runtime *rt, char *out, size_t n) {
    const char *path = hr_runtime_get_params(rt)->model_path;
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f) {
        snprintf(out, n, "name:%s", hr_runtime_model_name(rt));
        return;
    }
    struct stat sb;
    uint64_t size = fstat(fileno(f), &sb) == 0 ? (uint64_t)sb.st_size : 0;
    uint64_t h = 1469598103934665603ull;
    static const uint64_t MiB = 1u << 20;
    uint8_t *buf = malloc(MiB);
    for (uint64_t off = 0; buf && off < size; off += 64 * MiB) {
        size_t want = off == 0 ? MiB : 64u << 10;
        if (fseeko(f, (off_t)off, SEEK_SET) != 0) break;
        size_t got = fread(buf, 1, want, f);
        for (size_t i = 0; i < got; i++) h = (h ^ buf[i]) * 1099511628211ull;
    }
    if (buf && size > MiB && fseeko(f, (off_t)(size - MiB), SEEK_SET) == 0) {
        size_t got = fread(buf, 1, MiB, f);
        for (size_t i = 0; i < got; i++) h = (h ^ buf[i]) * 1099511628211ull;
    }
    free(buf);
    fclose(f);
    snprintf(out, n, "gguf:%llu:%016llx", (unsigned long long)size, (unsigned long long)h);
}

hr_serve_cluster *hr_serve_cluster_start(const hr_serve_cluster_opts *o, hr_runtime *rt) {
    if (!o->kv_events && o->kv_events_replay)
        fprintf(stderr, "headroom serve: --kv-events-replay without --kv-events: no KV events\n");
    if (!o->kv_events && !o->kv_remote) return NULL;
    hr_serve_cluster *c = calloc(1, sizeof *c);
    if (!c) {
        fprintf(stderr, "headroom serve: out of memory: serving without KV events or a KV tier\n");
        return NULL;
    }
    hr_error err = {0};
    if (o->kv_events) {
        hr_kv_events_params p = hr_kv_events_default_params();
        p.endpoint = o->kv_events;
        p.replay_endpoint = o->kv_events_replay;
        p.topic = o->kv_events_topic;
        if (hr_kv_events_create(&p, &c->events, &err) != HR_OK) {
            fprintf(stderr, "headroom serve: %s: serving without KV events\n", err.msg);
        } else {
            /* the first batch tells subscribers to forget what an earlier process on this endpoint held */
            hr_kv_events_all_cleared(c->events);
            c->ev_obs = hr_kv_events_observer(c->events);
            fprintf(stderr, "headroom serve: KV events on %s%s%s\n", o->kv_events,
                    o->kv_events_replay ? ", replay on " : "", o->kv_events_replay ? o->kv_events_replay : "");
        }
    }
    if (o->kv_remote) {
        char id[128];
        cl_model_id(rt, id, sizeof id);
        hr_kv_remote_params p = {
            .url = o->kv_remote, .model_id = id, .pool = hr_runtime_kv(rt), .log = cl_log, .log_ctx = NULL};
        if (hr_kv_remote_create(&p, &c->remote, &err) != HR_OK) {
            fprintf(stderr, "headroom serve: %s: serving without the shared KV tier\n", err.msg);
        } else {
            c->rm_obs = hr_kv_remote_observer(c->remote);
            fprintf(stderr, "headroom serve: shared KV tier on %s (model id %s)\n", o->kv_remote, id);
        }
    }
    hr_kv_observer obs = {.stored = cl_stored, .removed = cl_removed, .fetch = c->remote ? cl_fetch : NULL, .ctx = c};
    if ((!c->events && !c->remote) || hr_kv_pool_set_observer(hr_runtime_kv(rt), &obs, &err) != HR_OK) {
        if (c->events || c->remote) fprintf(stderr, "headroom serve: %s: serving without them\n", err.msg);
        hr_kv_events_destroy(c->events);
        hr_kv_remote_destroy(c->remote);
        free(c);
        return NULL;
    }
    return c;
}

void hr_serve_cluster_stop(hr_serve_cluster *c, hr_runtime *rt) {
    if (!c) return;
    hr_kv_pool_set_observer(hr_runtime_kv(rt), NULL, NULL);
    if (c->events) {
        hr_kv_events_all_cleared(c->events); /* the pool goes away with this process */
        hr_kv_events_stats st;
        hr_kv_events_flush(c->events, 1000);
        hr_kv_events_get_stats(c->events, &st);
        fprintf(stderr,
                "headroom serve: KV events: %llu batches, %llu events, %llu dropped (queue full), %llu replays\n",
                (unsigned long long)st.batches, (unsigned long long)st.events, (unsigned long long)st.dropped,
                (unsigned long long)st.replays);
        hr_kv_events_destroy(c->events);
    }
    if (c->remote) {
        hr_kv_remote_flush(c->remote, 5000);
        hr_kv_remote_stats st;
        hr_kv_remote_get_stats(c->remote, &st);
        fprintf(stderr,
                "headroom serve: KV tier: fetched %llu blocks (%llu missed, %llu rejected, %llu errors), stored %llu "
                "(%llu errors, %llu dropped), %.1f MiB in, %.1f MiB out\n",
                (unsigned long long)st.fetched, (unsigned long long)st.missed, (unsigned long long)st.rejected,
                (unsigned long long)st.fetch_errors, (unsigned long long)st.stored, (unsigned long long)st.store_errors,
                (unsigned long long)st.dropped, st.bytes_in / 1048576.0, st.bytes_out / 1048576.0);
        hr_kv_remote_destroy(c->remote);
    }
    free(c);
}

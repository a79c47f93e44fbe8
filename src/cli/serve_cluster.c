/* serve_cluster.c: see serve_cluster.h. */
#include "cli/serve_cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "events/kv_events.h"

struct hr_serve_cluster {
    hr_kv_events *events;
};

bool hr_serve_cluster_option(hr_serve_cluster_opts *o, int argc, char **argv, int *i, bool *ok) {
    const char *a = argv[*i];
    const char **dst = !strcmp(a, "--kv-events")          ? &o->kv_events
                       : !strcmp(a, "--kv-events-replay") ? &o->kv_events_replay
                       : !strcmp(a, "--kv-events-topic")  ? &o->kv_events_topic
                                                          : NULL;
    if (!dst) return false;
    *ok = (*dst = hr_arg_value("serve", argc, argv, i)) != NULL;
    return true;
}

hr_serve_cluster *hr_serve_cluster_start(const hr_serve_cluster_opts *o, hr_runtime *rt) {
    if (!o->kv_events) {
        if (o->kv_events_replay)
            fprintf(stderr, "headroom serve: --kv-events-replay without --kv-events: no KV events\n");
        return NULL;
    }
    hr_serve_cluster *c = calloc(1, sizeof *c);
    if (!c) {
        fprintf(stderr, "headroom serve: out of memory: serving without KV events\n");
        return NULL;
    }
    hr_kv_events_params p = hr_kv_events_default_params();
    p.endpoint = o->kv_events;
    p.replay_endpoint = o->kv_events_replay;
    p.topic = o->kv_events_topic;
    hr_error err = {0};
    if (hr_kv_events_create(&p, &c->events, &err) != HR_OK) {
        fprintf(stderr, "headroom serve: %s: serving without KV events\n", err.msg);
        free(c);
        return NULL;
    }
    /* the first batch tells subscribers to forget what an earlier process on this endpoint held */
    hr_kv_events_all_cleared(c->events);
    hr_kv_observer obs = hr_kv_events_observer(c->events);
    hr_kv_pool_set_observer(hr_runtime_kv(rt), &obs);
    fprintf(stderr, "headroom serve: KV events on %s%s%s\n", o->kv_events, o->kv_events_replay ? ", replay on " : "",
            o->kv_events_replay ? o->kv_events_replay : "");
    return c;
}

void hr_serve_cluster_stop(hr_serve_cluster *c, hr_runtime *rt) {
    if (!c) return;
    hr_kv_pool_set_observer(hr_runtime_kv(rt), NULL);
    hr_kv_events_all_cleared(c->events); /* the pool goes away with this process */
    hr_kv_events_stats st;
    hr_kv_events_flush(c->events, 1000);
    hr_kv_events_get_stats(c->events, &st);
    fprintf(stderr, "headroom serve: KV events: %llu batches, %llu events, %llu dropped (queue full), %llu replays\n",
            (unsigned long long)st.batches, (unsigned long long)st.events, (unsigned long long)st.dropped,
            (unsigned long long)st.replays);
    hr_kv_events_destroy(c->events);
    free(c);
}

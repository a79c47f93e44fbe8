/* serve_cluster.c: see serve_cluster.h. The runtime wires the KV event publisher and the Redis tier
 * to its pool (hr_runtime_cluster_start); this file gives it the flags, the model's identity and a
 * log that prints. */
#include "cli/serve_cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/args.h"

struct hr_serve_cluster {
    hr_rt_cluster *rt;
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
    char id[128];
    if (o->kv_remote) cl_model_id(rt, id, sizeof id);
    hr_rt_cluster_params p = {.kv_events = o->kv_events,
                              .kv_events_replay = o->kv_events_replay,
                              .kv_events_topic = o->kv_events_topic,
                              .kv_remote = o->kv_remote,
                              .model_id = o->kv_remote ? id : NULL,
                              .log = cl_log};
    hr_rt_cluster *rc = hr_runtime_cluster_start(rt, &p);
    if (!rc) return NULL;
    hr_serve_cluster *c = calloc(1, sizeof *c);
    if (!c) {
        hr_runtime_cluster_stop(rt, rc);
        fprintf(stderr, "headroom serve: out of memory: serving without KV events or a KV tier\n");
        return NULL;
    }
    c->rt = rc;
    return c;
}

void hr_serve_cluster_stop(hr_serve_cluster *c, hr_runtime *rt) {
    if (!c) return;
    hr_runtime_cluster_stop(rt, c->rt);
    free(c);
}

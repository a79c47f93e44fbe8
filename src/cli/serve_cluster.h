/* serve_cluster.h: the `headroom serve` options for running as one replica of many: KV events
 * (src/events) published from the pool's prefix cache, and the shared KV tier on Redis (src/remote). Kept out of
 * cmd_serve.c so that file stays about HTTP; everything here degrades to "serve without it" with one log line, never a
 * failed start. */
#ifndef HR_CLI_SERVE_CLUSTER_H
#define HR_CLI_SERVE_CLUSTER_H

#include <stdbool.h>

#include "runtime/runtime.h"

typedef struct hr_serve_cluster_opts {
    const char *kv_events;        /* --kv-events tcp://HOST:PORT */
    const char *kv_events_replay; /* --kv-events-replay tcp://HOST:PORT */
    const char *kv_events_topic;  /* --kv-events-topic T */
    const char *kv_remote;        /* --kv-remote redis://HOST:PORT */
} hr_serve_cluster_opts;

#define HR_SERVE_CLUSTER_HELP                                                                                          \
    "replicas:\n"                                                                                                      \
    "      --kv-events tcp://HOST:PORT  publish the prefix cache's BlockStored/BlockRemoved/AllBlocksCleared\n"        \
    "                         events in vLLM's wire format (ZeroMQ PUB: topic, 8-byte big-endian sequence,\n"          \
    "                         msgpack [ts, events, dp_rank]); HOST is an address or *. If it cannot bind,\n"           \
    "                         serve logs why and runs without events\n"                                                \
    "      --kv-events-replay tcp://HOST:PORT  a ROUTER socket that resends kept batches from a sequence\n"            \
    "                         number (the newest 10000 batches / 64MiB)\n"                                             \
    "      --kv-events-topic T  the first frame of every event message (default empty, as vLLM)\n"                     \
    "      --kv-remote redis://HOST:PORT  share full prefix blocks through Redis: computed blocks are written,\n"      \
    "                         a prompt's missing prefix blocks are fetched (checked against model, format,\n"          \
    "                         shape and checksum) before computing; run Redis as a cache (maxmemory +\n"               \
    "                         allkeys-lru). Unreachable: serve logs it and runs without the tier\n"

/* Consumes argv[*i] (and its value) when it is one of the options above: returns true and sets *ok
 * (false after a usage error, already printed). Returns false for other options. */
bool hr_serve_cluster_option(hr_serve_cluster_opts *o, int argc, char **argv, int *i, bool *ok);

typedef struct hr_serve_cluster hr_serve_cluster;

/* Call after hr_runtime_open and before hr_runtime_start. Never fails: what cannot start is logged
 * on stderr and left out (NULL when nothing was asked for or nothing started). */
hr_serve_cluster *hr_serve_cluster_start(const hr_serve_cluster_opts *o, hr_runtime *rt);

/* Call after hr_runtime_stop, before hr_runtime_close. NULL allowed. */
void hr_serve_cluster_stop(hr_serve_cluster *c, hr_runtime *rt);

#endif

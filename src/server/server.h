/* server.h: `headroom serve`, an OpenAI-compatible HTTP server over one runtime (libmicrohttpd, one
 * thread per connection). HTTP threads only parse, route and format: requests go to the runtime with
 * hr_runtime_submit and their tokens come back through each request's channel; JSON never leaves
 * src/server.
 *
 * Endpoints: GET /health, /metrics, /v1/models, /v1/kv; POST /v1/completions, /v1/chat/completions,
 * /tokenize, /detokenize. With an api_key, everything except /health and /metrics needs
 * "Authorization: Bearer KEY" (401 otherwise).
 *
 * Lifecycle:
 *   hr_server_create(rt or NULL) --> LOADING (/health 503) --hr_server_set_runtime--> READY
 *   READY --hr_server_shutdown--> DRAINING (connections still accepted: /health answers 503
 *   "draining", new generation requests 503; in-flight ones run up to drain_timeout_s, then are
 *   cancelled) --> STOPPED (listening socket closed) --hr_server_destroy
 *
 * Hostile clients (guard.c): a connection has header_timeout_s to send a request's headers and must
 * then send its body at body_min_rate, else it is closed; one address holds at most max_conns_per_ip
 * connections; past max_connections new ones wait in the listen backlog. Route, method, API key and
 * message framing are decided on the headers, before any body byte is read: a refusal answers and
 * closes without reading the body.
 *
 * Threads: every call here may come from any thread except that hr_server_destroy must be the last.
 * The server borrows the runtime; the caller starts its engine thread (hr_runtime_start) and closes it
 * after hr_server_shutdown has returned. */
#ifndef HR_SERVER_SERVER_H
#define HR_SERVER_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "runtime/runtime.h"

/* Which extra metric families /metrics carries besides headroom_*. */
typedef enum hr_metrics_compat {
    HR_METRICS_NATIVE = 0,
    HR_METRICS_VLLM = 1, /* adds vllm:num_requests_waiting/running, vllm:kv_cache_usage_perc, ... */
} hr_metrics_compat;

/* Which requests share the prefix cache (a hit reveals that someone sent the same prefix). */
typedef enum hr_cache_scope_mode {
    HR_CACHE_SCOPE_AUTO = 0,   /* per API key when several keys are configured, else shared */
    HR_CACHE_SCOPE_KEY = 1,    /* per API key always */
    HR_CACHE_SCOPE_SHARED = 2, /* one cache for all keys */
} hr_cache_scope_mode;
/* In every mode a request's "cache_salt" (a string, as vLLM has) narrows its scope further: only
 * requests with the same key scope and the same salt share cached blocks. */

typedef struct hr_server_params {
    const char *host;              /* numeric IPv4 or IPv6 address to bind (NULL: "127.0.0.1"); copied */
    int port;                      /* 0: any free port (hr_server_port tells which) */
    const char *api_key;           /* NULL or "": no authentication; else a comma-separated list of keys
                                      (hr_server_keys_parse), each a tenant; copied */
    size_t max_body_bytes;         /* request bodies above this get 413 (0: 4 MiB) */
    double drain_timeout_s;        /* hr_server_shutdown waits this long for in-flight requests (< 0: 0) */
    int max_connections;           /* concurrent connections = HTTP threads (0: 256) */
    int max_choices;               /* largest "n" a request may ask for (0: 8) */
    hr_rt_sampling sampling;       /* defaults for fields a request omits (its seed is the base of the
                                         per-request seeds when a request gives none) */
    int default_completion_tokens; /* /v1/completions max_tokens when omitted (0: 16, OpenAI's) */
    hr_metrics_compat metrics_compat;
    size_t max_header_bytes; /* per-connection memory for the request line, headers and I/O buffers
                                (libmicrohttpd's connection memory limit); larger headers get 431 (0: 32 KiB,
                                at least 32 KiB) */
    int max_tokens_limit;    /* largest max_tokens a request may ask for (400 above) and the default when it
                                gives none (0: only the context bounds it) */
    size_t max_parse_bytes;  /* memory all request bodies being parsed (and their parsed documents) may hold
                                at once; one parse gets a quarter (0: HR_SERVER_PARSE_BYTES). Part of the
                                memory plan: pass it as hr_runtime_params.request_bytes */
    hr_cache_scope_mode cache_scope;
    double header_timeout_s; /* a connection must deliver a request's headers this long after it opened
                                or its previous response ended, else it is closed; also the grace before
                                body_min_rate applies (<= 0: 10 s) */
    double body_min_rate;    /* bytes per second a request body must keep up past that grace, else the
                                connection is closed (0: no rate check) */
    int max_conns_per_ip;    /* concurrent connections from one client address; more are closed at once
                                (0: no cap) */
    int listen_backlog;      /* connections the kernel holds while all max_connections are busy (0: 1024;
                                the kernel caps it at net.core.somaxconn) */
} hr_server_params;

#define HR_SERVER_PARSE_BYTES (64ull << 20)

/* The API-key list: "k1,k2" (blanks around a key ignored) into *keys (malloc'd; free with
 * hr_server_keys_free). NULL or "" gives none. HR_ERR_INVALID_ARG for an empty key in the list. */
hr_status hr_server_keys_parse(const char *list, char ***keys, int *n_keys, hr_error *err);
void hr_server_keys_free(char **keys, int n_keys);
/* Index of the key equal to presented, or -1; every key is compared in constant time. */
int hr_server_keys_match(char *const *keys, int n_keys, const char *presented);

hr_server_params hr_server_default_params(void);

typedef struct hr_server hr_server;

/* Binds and starts serving. rt may be NULL (the model still loading: /health answers 503 and the
 * generation endpoints 503 until hr_server_set_runtime). HR_ERR_INVALID_ARG for a bad host or port,
 * HR_ERR_IO when the address cannot be bound (in use: the message says so). */
hr_status hr_server_create(hr_runtime *rt, const hr_server_params *p, hr_server **out, hr_error *err);
/* Attaches the runtime once loaded (borrowed until hr_server_destroy); at most once. */
void hr_server_set_runtime(hr_server *s, hr_runtime *rt);
/* The bound port (the one picked when params.port was 0). */
int hr_server_port(const hr_server *s);
/* Requests in flight now (being generated or streamed). */
int hr_server_n_inflight(hr_server *s);
/* Connection counters for a log line (SIGUSR1). */
typedef struct hr_server_stats {
    int n_inflight;             /* generation requests in flight */
    int n_connections;          /* TCP connections open now (served and pending) */
    int n_pending;              /* of those, waiting for their first request's headers */
    uint64_t n_accepted;        /* connections handed to the HTTP threads since start */
    uint64_t n_evicted;         /* closed while waiting for headers: a new connection needed the room */
    uint64_t n_refused_framing; /* requests refused for their framing (one 400, closed) */
    uint64_t n_refused_per_ip;  /* connections closed at once: their address held max_conns_per_ip */
    uint64_t n_cut_headers;     /* closed by the watchdog: headers too slow (header_timeout_s) */
    uint64_t n_cut_body;        /* closed by the watchdog: body below body_min_rate */
    const char *state;          /* "loading", "ready", "draining", "stopped" */
} hr_server_stats;
void hr_server_get_stats(hr_server *s, hr_server_stats *st);
/* Graceful stop: answers 503 to new requests (connections are still accepted so that /health can say
 * "draining"), waits up to drain_timeout_s for in-flight requests, cancels what remains, closes the
 * listening socket and stops the HTTP threads. Blocks until done; idempotent. */
void hr_server_shutdown(hr_server *s);
/* Shuts down if still running and frees. NULL allowed. */
void hr_server_destroy(hr_server *s);

#endif

/* server_internal.h: what the server's files share: a growable text buffer, the HTTP error record,
 * parsed generation requests and jobs (openai.c), the SSE stream (stream.c) and the metrics
 * (metrics.c). Nothing here is visible outside src/server. */
#ifndef HR_SERVER_INTERNAL_H
#define HR_SERVER_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/utf8.h"
#include "runtime/runtime.h"
#include "server/server.h"
#include "server/toolcall.h"
#include "tokenizer/tokenizer.h"

#define HR_SRV_MAX_CHOICES    8  /* hard cap on "n" whatever max_choices says */
#define HR_SRV_MAX_TOOL_CALLS 16 /* calls parsed out of one answer */
#define HR_SRV_MAX_STOP       8  /* stop strings per request */
#define HR_SRV_MAX_TOP        20 /* chat's top_logprobs at most (completions' logprobs: 5) */

/* ---- text buffer ------------------------------------------------------------------------------- */

typedef struct hr_srv_buf {
    char *data; /* NUL-terminated while ok */
    size_t len, cap;
    bool failed; /* an allocation failed: the content is incomplete */
} hr_srv_buf;

void hr_srv_buf_put(hr_srv_buf *b, const char *s, size_t n);
void hr_srv_buf_printf(hr_srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void hr_srv_buf_free(hr_srv_buf *b);

/* ---- errors as HTTP ---------------------------------------------------------------------------- */

/* Refusal reasons counted by /metrics (headroom_requests_refused_total{reason=...}). */
typedef enum hr_srv_refusal {
    HR_REFUSE_NONE = 0,
    HR_REFUSE_INVALID = 1,   /* a bad field or body */
    HR_REFUSE_CONTEXT = 2,   /* prompt past the context */
    HR_REFUSE_BUDGET = 3,    /* can never fit the KV pool */
    HR_REFUSE_QUEUE = 4,     /* waiting queue full (429) */
    HR_REFUSE_DRAINING = 5,  /* shutting down or loading (503) */
    HR_REFUSE_AUTH = 6,      /* 401 */
    HR_REFUSE_TOO_LARGE = 7, /* 413 */
} hr_srv_refusal;
#define HR_REFUSE_COUNT 8

typedef struct hr_srv_error {
    int http;          /* 400, 401, 404, 405, 413, 429, 500, 503 */
    const char *type;  /* OpenAI's error type: "invalid_request_error", ... */
    const char *code;  /* NULL or a stable code ("context_length_exceeded", ...) */
    const char *param; /* NULL or the request field at fault */
    char msg[HR_ERROR_MSG_MAX + 160];
    double retry_after_s; /* 429: the Retry-After header */
    hr_srv_refusal refusal;
} hr_srv_error;

/* Fills e and returns false, so a validator can `return hr_srv_fail(...)`. */
bool hr_srv_fail(hr_srv_error *e, int http, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* A runtime refusal as HTTP: INVALID_ARG/RANGE/BUDGET 400, FULL 429 (Retry-After from the runtime),
 * NOMEM 503, anything else 500. The error's param is the field it names (hr_srv_param_field), spelt as
 * this request spells it: prompt_field ("prompt", "messages") for the prompt, and for RANGE and BUDGET
 * refusals about a server setting; format_field for the output format ("response_format",
 * "guided_json", "tool_choice"; NULL: "response_format"). */
void hr_srv_fail_status(hr_srv_error *e, hr_runtime *rt, hr_status st, const hr_error *err, const char *prompt_field,
                        const char *format_field);
/* The request field that sets param (common/status.h), NULL when none does (a server setting). */
const char *hr_srv_param_field(hr_param param);
/* The Retry-After header's whole seconds for a wait of s seconds: rounded up, at least 1, at most a
 * day. */
int hr_srv_retry_after_secs(double s);
/* {"error":{"message","type","param","code"}} (malloc'd compact JSON). */
char *hr_srv_error_body(const hr_srv_error *e);

/* ---- generation requests (openai.c) ------------------------------------------------------------ */

typedef enum hr_srv_kind { HR_SRV_COMPLETION = 0, HR_SRV_CHAT = 1 } hr_srv_kind;

/* A parsed /v1/completions or /v1/chat/completions body. Strings in rp borrow from the JSON document
 * it was parsed from (keep it alive until submitted: the runtime copies what it keeps). */
typedef struct hr_srv_gen {
    hr_srv_kind kind;
    hr_rt_request_params rp;
    hr_rt_chat_msg *messages; /* owned */
    char **owned;             /* owned strings (content parts joined), n_owned of them */
    int n_owned;
    int32_t *prompt_ids; /* owned (a prompt given as token ids) */
    int32_t *bias_ids;   /* owned: logit_bias's tokens and values (rp.sampling points at them) */
    float *bias_values;
    const char *stop[HR_SRV_MAX_STOP];
    int n;
    bool stream, include_usage;
    const char *prompt_field; /* "prompt" or "messages" */
    hr_tools tools;           /* chat: the request's tools (borrowed from its JSON) */
    const char *cache_salt;   /* "cache_salt" (borrowed), NULL when absent */
    size_t cache_salt_len;
    /* rp.logprobs / rp.top_logprobs: chat's "logprobs" and "top_logprobs", or completions' "logprobs" (K:
       logprobs true with K alternatives) */
} hr_srv_gen;

/* Validates every known field (unknown ones are ignored) and fills g; false with e set (400 naming
 * the field) otherwise. auto_seed is used when the request gives no seed. */
bool hr_srv_parse_gen(hr_srv_kind kind, json_t *root, const hr_server_params *sp, uint64_t auto_seed, hr_srv_gen *g,
                      hr_srv_error *e);
/* Chat with tools. native (the model's own template renders the chat): the tools, each assistant
 * message's `tool_calls` and each tool message's `tool_call_id` / `name` go to the template as they
 * are. Else, for a model whose tool calls take format f: the tools described at the end of the
 * system message (one is added when there is none), assistant `tool_calls` written as the model
 * writes them, `tool` messages as the model reads results (consecutive ones joined in one turn).
 * False with e set (400 naming `messages`) for a malformed tool call in the history. A no-op without
 * tools in the request or history. */
bool hr_srv_gen_apply_tools(hr_srv_gen *g, json_t *root, hr_tool_format f, bool native, hr_srv_error *e);
void hr_srv_gen_free(hr_srv_gen *g);

/* The prefix-cache scope of a request (hr_rt_request_params.cache_scope): tenant_key is the request's
 * API key when the cache is scoped by key (NULL: not), salt the request's cache_salt (NULL: none). 0
 * (the shared scope) only for neither; different (key, salt) pairs give different scopes, the same pair
 * the same scope on every server. */
uint64_t hr_srv_cache_scope(const char *tenant_key, const char *salt, size_t salt_len);

/* ---- bounded JSON parsing (jsonmem.c) ----------------------------------------------------------- */

/* The server's bound on memory held by request bodies being parsed or parsed: every jansson block a
 * parse allocates is charged to it until freed. Any thread. */
typedef struct hr_srv_parse_pool hr_srv_parse_pool;
typedef enum hr_srv_parse_fail {
    HR_SRV_PARSE_OK = 0,
    HR_SRV_PARSE_TOO_LARGE = 1, /* the parse needed more than the per-request bound */
    HR_SRV_PARSE_TOO_DENSE = 2, /* more than the bound for its length (64 x bytes + 256 KiB) */
    HR_SRV_PARSE_BUSY = 3,      /* the pool stayed full for 5 s (other parses) */
} hr_srv_parse_fail;

/* limit: all parses at once; per_request: one parse (at most limit). NULL when out of memory. */
hr_srv_parse_pool *hr_srv_parse_pool_create(size_t limit, size_t per_request);
/* After every document parsed in it was freed. NULL allowed. */
void hr_srv_parse_pool_destroy(hr_srv_parse_pool *p);
size_t hr_srv_parse_pool_limit(const hr_srv_parse_pool *p);
size_t hr_srv_parse_pool_per_request(const hr_srv_parse_pool *p);
size_t hr_srv_parse_pool_peak(hr_srv_parse_pool *p); /* most bytes reserved at once */
size_t hr_srv_parse_pool_held(hr_srv_parse_pool *p); /* reserved now */
/* json_loadb within the pool's bounds (p NULL: unbounded). NULL on a JSON error (je) or a bound
 * (*why says which). *held: the document's bytes, still reserved in the pool: give them back with
 * hr_srv_parse_pool_release after freeing the document. */
json_t *hr_srv_parse_pool_load(hr_srv_parse_pool *p, const char *data, size_t len, json_error_t *je,
                               hr_srv_parse_fail *why, size_t *held);
void hr_srv_parse_pool_release(hr_srv_parse_pool *p, size_t bytes); /* p NULL: nothing */

/* A request body as the server takes it: valid UTF-8, JSON, an object, parsed within pool's bounds
 * (NULL: unbounded). NULL with e set otherwise: 400 (the message gives line and column, never the
 * body's text), 413 past a parse bound, 503 while the pool stays full; each names its limit. The
 * caller owns the returned document and, once it is freed, gives *held back to the pool. Every POST
 * route starts here. */
json_t *hr_srv_parse_body_in(hr_srv_parse_pool *pool, const char *data, size_t len, size_t *held, hr_srv_error *e);
json_t *hr_srv_parse_body(const char *data, size_t len, hr_srv_error *e); /* unbounded */

/* msg with client text taken out, for events and logs: quoted runs other than request field names
 * become '…', values after "got " become …. out holds cap bytes (NUL included). */
void hr_srv_redact(const char *msg, char *out, size_t cap);

/* POST /tokenize: {"content": string, "add_special"?: bool, "with_pieces"?: bool}. text borrows from
 * root. */
typedef struct hr_srv_tokenize {
    const char *text;
    size_t len;
    hr_tokenize_opts opts;
    bool with_pieces;
} hr_srv_tokenize;
bool hr_srv_parse_tokenize(json_t *root, hr_srv_tokenize *t, hr_srv_error *e);

/* POST /detokenize: {"tokens": [ids in 0..n_vocab-1]}. *ids is malloc'd (free it) on success. */
bool hr_srv_parse_detokenize(json_t *root, int32_t n_vocab, int32_t **ids, size_t *n_ids, hr_srv_error *e);

/* One accepted generation request: n runtime requests (the choices) and how to answer. Registered in
 * the server while in flight so that /v1/kv can list the live ledgers. */
typedef struct hr_srv_job {
    struct hr_srv_job *prev, *next; /* the server's registry (under its mutex) */
    char id[48];
    hr_srv_kind kind;
    long long created; /* unix seconds */
    const char *model; /* the runtime's model name (borrowed) */
    int n;
    hr_rt_request *req[HR_SRV_MAX_CHOICES];
    bool stream, include_usage;
    bool logprobs;           /* answer with choices[i].logprobs (else null) */
    int top_logprobs;        /* alternatives per position */
    const hr_tokenizer *tok; /* token text for logprobs (the runtime's, borrowed) */
    /* streaming state (touched only by the connection's thread) */
    bool role_sent[HR_SRV_MAX_CHOICES], finished[HR_SRV_MAX_CHOICES];
    bool done_sent;
    int lp_sent[HR_SRV_MAX_CHOICES];        /* output tokens whose logprobs went out */
    size_t lp_text_off[HR_SRV_MAX_CHOICES]; /* completions: characters of text before the next token */
    hr_srv_buf pending;                     /* SSE bytes produced but not yet handed to MHD */
    size_t pending_off;
    double t_last_out;
    bool recorded; /* metrics taken */
    /* tool calls (chat with tools and tool_choice other than none): the output is split into content and
       calls at the end; while streaming, text that may start a call is held back */
    hr_tools tools; /* list: a reference the job owns; forced: NULL */
    hr_tool_format tool_format;
    unsigned long long tool_seed;             /* call ids */
    hr_srv_buf tool_text[HR_SRV_MAX_CHOICES]; /* streaming: the choice's text so far */
    size_t tool_sent[HR_SRV_MAX_CHOICES];     /* streaming: bytes of it sent as content */
} hr_srv_job;

/* Whether the job's chat answers may hold tool calls. */
static inline bool hr_srv_job_tools(const hr_srv_job *j) { return j->tools.n > 0 && !j->tools.none; }

/* usage: prompt/completion/total tokens and the kv object, summed over n results. */
json_t *hr_srv_usage_json(const hr_rt_result *res, int n);
/* One request's KV usage as JSON (also each live request in /v1/kv). */
json_t *hr_srv_kv_usage_json(const hr_rt_kv_usage *kv);
/* [{"kind": "window"|"full", "window", "layers", "blocks", "bytes"}] for a hybrid pool's layer kinds. */
json_t *hr_srv_kv_kinds_json(const hr_rt_kv_kind *kinds, int n);
/* The whole non-streaming response. */
json_t *hr_srv_response_json(const hr_srv_job *j, const hr_rt_result *res);
/* choices[i].logprobs for output tokens [from, from + n) of choice i (ids: those tokens), in the shape
 * of the job's kind: chat {"content": [{token, logprob, bytes, top_logprobs}...]}, completions
 * {tokens, token_logprobs, top_logprobs, text_offset} with text offsets from *text_off (characters
 * of the completion text before token `from`; advanced past these tokens). NULL when out of memory. */
json_t *hr_srv_logprobs_json(const hr_srv_job *j, int i, int from, const int32_t *ids, int n, size_t *text_off);
/* One SSE chunk object: text (may be NULL) for choice i, finish (NULL while running), role chunk,
 * logprobs (taken over; NULL: null). */
json_t *hr_srv_chunk_json(const hr_srv_job *j, int i, const char *text, size_t len, const char *finish, bool role,
                          json_t *logprobs);
/* Tool calls for a chat message or delta: [{"index"?, "id", "type": "function", "function": {"name",
 * "arguments"}}] (index: with_index, as stream deltas carry it). */
json_t *hr_srv_tool_calls_json(const hr_srv_job *j, int choice, const hr_tool_call *calls, int n, bool with_index);
/* The final usage chunk (choices: []). */
json_t *hr_srv_usage_chunk_json(const hr_srv_job *j, const hr_rt_result *res);

/* ---- SSE (stream.c) ---------------------------------------------------------------------------- */

/* MHD's content reader for a streaming job: blocks on the job's channels (thread per connection) and
 * hands out "data: {...}\n\n" chunks, a usage chunk when asked, then "data: [DONE]\n\n". Returns the
 * bytes written to buf (> 0), or -1 once everything, [DONE] included, was handed out. Waits are
 * bounded: with no output for 15 s it sends an SSE comment (": keepalive"), which also finds out
 * whether the client is still there. */
long hr_srv_stream_read(hr_srv_job *j, char *buf, size_t max, const atomic_bool *abandon);

/* ---- metrics (metrics.c) ----------------------------------------------------------------------- */

typedef struct hr_srv_metrics hr_srv_metrics;

hr_status hr_srv_metrics_create(hr_srv_metrics **out, hr_error *err);
void hr_srv_metrics_destroy(hr_srv_metrics *m); /* NULL allowed */
void hr_srv_metrics_refused(hr_srv_metrics *m, hr_srv_refusal why);
void hr_srv_metrics_prompt_tokens(hr_srv_metrics *m, int n);
/* Observes one finished choice: latencies, queue time, KV bytes, finish reason. */
void hr_srv_metrics_finished(hr_srv_metrics *m, const hr_rt_result *r, const float *gaps, int n_gaps);
/* The Prometheus text (format 0.0.4) into b. rt may be NULL (still loading). */
void hr_srv_metrics_render(hr_srv_metrics *m, hr_runtime *rt, hr_metrics_compat compat, hr_srv_buf *b);

/* ---- the connection guard (guard.c) ------------------------------------------------------------ */

/* One request header as the framing check reads it (name and value NUL-terminated, value trimmed or
 * not). */
typedef struct hr_srv_header {
    const char *name, *value;
} hr_srv_header;

/* RFC 9112 message framing of a request's headers: 0 when it is unambiguous, else the HTTP status to
 * answer (400) with why[] saying what is wrong; the connection must then close (the body's end is
 * unknown). Refused: a Content-Length that is not 1*DIGIT (at most 19 digits), more than one
 * Content-Length (identical values too), Content-Length with Transfer-Encoding, more than one
 * Transfer-Encoding, a coding other than exactly "chunked", Transfer-Encoding in HTTP/1.0. */
int hr_srv_framing_check(const hr_srv_header *h, int n, bool http10, char *why, size_t cap);

typedef enum hr_sock_phase {
    HR_SOCK_HEADERS = 0, /* waiting for a request's headers (deadline) */
    HR_SOCK_BODY = 1,    /* reading its body (minimum rate) */
    HR_SOCK_BUSY = 2,    /* routed: handling, waiting on the engine, answering (no deadline) */
} hr_sock_phase;

/* One TCP connection as the watchdog sees it (MHD's socket_context). Fields under the guard's mutex. */
typedef struct hr_srv_sock {
    struct hr_srv_sock *prev, *next;
    int fd;
    hr_sock_phase phase;
    double t0; /* when the phase began (hr_time_now) */
    uint64_t body_bytes;
    bool cut; /* the watchdog shut it down */
} hr_srv_sock;

typedef struct hr_srv_guard hr_srv_guard;

typedef struct hr_srv_guard_counts {
    int open;                                 /* connections tracked now */
    uint64_t accepted, cut_headers, cut_body; /* since start */
} hr_srv_guard_counts;

/* Starts the watchdog thread: a connection in HEADERS longer than header_timeout_s, or in BODY for
 * longer than header_timeout_s + body bytes / body_min_rate (0: no rate check), is shut down. */
hr_status hr_srv_guard_create(double header_timeout_s, double body_min_rate, hr_srv_guard **out, hr_error *err);
/* Stops the thread and frees (after MHD_stop_daemon). NULL allowed. */
void hr_srv_guard_destroy(hr_srv_guard *g);
/* Tracks a new connection (HEADERS from now); NULL when out of memory (then untracked). */
hr_srv_sock *hr_srv_guard_open(hr_srv_guard *g, int fd);
/* Forgets it (MHD's CLOSED, before the descriptor is closed). NULL allowed. */
void hr_srv_guard_close(hr_srv_guard *g, hr_srv_sock *k);
/* Moves it to phase from now (body bytes back to 0). NULL allowed. */
void hr_srv_guard_phase(hr_srv_guard *g, hr_srv_sock *k, hr_sock_phase phase);
/* Counts n more body bytes. NULL allowed. */
void hr_srv_guard_body(hr_srv_guard *g, hr_srv_sock *k, size_t n);
void hr_srv_guard_stats(hr_srv_guard *g, hr_srv_guard_counts *c);

/* ---- the front door (gate.c) ------------------------------------------------------------------- */

/* A request head (request line, headers, the empty line: buf[0..n)) as the gate checks it: 0 when it
 * may go on to libmicrohttpd, else the status to answer once before closing (400; 500 out of memory)
 * with why[] saying what is wrong. Adds to hr_srv_framing_check: a NUL byte anywhere, obs-fold lines,
 * an empty header name and whitespace before a header's colon (RFC 9110 5.5, RFC 9112 5.1, 5.2).
 * Lines without a colon are left to libmicrohttpd (one 400). */
int hr_srv_check_head(const char *buf, size_t n, char *why, size_t cap);

struct MHD_Daemon;
typedef struct hr_srv_gate_params {
    int listen_fd;             /* listening, non-blocking; the gate owns it once created (closes it when it
                                  stops); on failure the caller still does */
    struct MHD_Daemon *daemon; /* started with MHD_USE_NO_LISTEN_SOCKET */
    int max_pending;           /* connections held waiting for their headers (when full, a new one takes
                                  the place of the one waiting longest) */
    int per_ip;                /* of those, at most this many from one address (0: no cap) */
    int max_live;              /* connections handed to MHD and not yet closed */
    double header_timeout_s;   /* a pending connection's first request headers must be whole by then */
    size_t max_header_bytes;   /* how much is peeked (more: MHD answers 431) */
} hr_srv_gate_params;

typedef struct hr_srv_gate hr_srv_gate;

typedef struct hr_srv_gate_counts {
    int live, pending;
    uint64_t cut_headers, evicted, refused_framing, refused_per_ip;
} hr_srv_gate_counts;

/* Starts the gate's thread. */
hr_status hr_srv_gate_create(const hr_srv_gate_params *p, hr_srv_gate **out, hr_error *err);
/* Stops accepting: joins the thread, closes the pending connections and the listening socket. */
void hr_srv_gate_stop(hr_srv_gate *g);
/* Stops if running and frees. NULL allowed. */
void hr_srv_gate_destroy(hr_srv_gate *g);
/* A handed-off connection closed (MHD's CLOSED notification): its live slot is free. NULL allowed. */
void hr_srv_gate_closed(hr_srv_gate *g);
void hr_srv_gate_stats(hr_srv_gate *g, hr_srv_gate_counts *c);

#endif

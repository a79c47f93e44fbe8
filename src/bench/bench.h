/* bench.h: `headroom bench`'s library: traffic patterns and the trace reader (what to send), the
 * streaming client on libcurl's multi interface (send it, time every token), statistics and the
 * report (table, JSON, CSV, SVG). Everything except hr_bench_run and the writers is pure: no I/O,
 * no clock, no globals, so the patterns, the trace line parser, the SSE parser and the percentiles
 * are unit-tested and fuzzed on their own.
 *
 * Data flow: pattern or trace -> hr_bench_spec per request (prompt text, max_tokens, arrival
 * offset) -> hr_bench_run (one libcurl easy handle per request, one for polling GET /v1/kv) ->
 * hr_bench_result per request + hr_bench_sample time series -> hr_bench_report_compute ->
 * table / JSON / CSV / SVG. */
#ifndef HR_BENCH_BENCH_H
#define HR_BENCH_BENCH_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"
#include "common/util.h"

/* ---- patterns ---------------------------------------------------------------------------------- */

/* The built-in traffic shapes. Lengths are in words for prompts (built from a fixed word list, so a
 * word is one to three tokens with common vocabularies) and tokens for outputs, each drawn uniformly
 * in the range below and multiplied by the run's scale (default 1):
 *   long-few       prompt 600..1000 words, output 128..256 tokens: a few long conversations
 *   short-burst    prompt 8..32 words, output 8..32 tokens; open-loop arrivals come in bursts of
 *                  4..16 requests 5 ms apart, burst starts Poisson so the mean rate is --rate
 *   prefill-heavy  prompt 300..600 words, output 4..16 tokens
 *   decode-heavy   prompt 8..32 words, output 200..400 tokens
 *   shared-prefix  one of 4 fixed system prompts of 200 words (the same for every seed), then
 *                  10..40 words of question, output 16..64 tokens
 *   mixed          each request draws one of the five above: long-few 5%, short-burst 40%,
 *                  prefill-heavy 20%, decode-heavy 15%, shared-prefix 20%
 * Open-loop arrivals other than short-burst's are Poisson (exponential gaps, mean 1/rate). */
typedef enum hr_bench_pattern {
    HR_BENCH_LONG_FEW = 0,
    HR_BENCH_SHORT_BURST = 1,
    HR_BENCH_PREFILL_HEAVY = 2,
    HR_BENCH_DECODE_HEAVY = 3,
    HR_BENCH_SHARED_PREFIX = 4,
    HR_BENCH_MIXED = 5,
    HR_BENCH_TRACE = 6, /* requests come from a JSONL file */
} hr_bench_pattern;

#define HR_BENCH_N_SHARED_PREFIXES 4

/* The pattern named by text, or HR_ERR_INVALID_ARG naming it and listing the valid names. */
hr_status hr_bench_pattern_parse(const char *text, hr_bench_pattern *out, hr_error *err);
const char *hr_bench_pattern_name(hr_bench_pattern p);

/* The longest prompt (words) and output (tokens) pattern p draws at scale 1. */
void hr_bench_pattern_max_len(hr_bench_pattern p, int *max_words, int *max_output);
/* A word of the pattern text is at most about this many tokens (3 with a 512-token vocabulary such
 * as the demo model's; 1.3 to 2 with 32k-150k vocabularies). */
#define HR_BENCH_TOKENS_PER_WORD 3.0
/* The largest scale (<= 1, >= 0.01) at which pattern p's longest prompt and output fit in n_ctx
 * tokens with 5% to spare, counting HR_BENCH_TOKENS_PER_WORD tokens a word; 1 when n_ctx <= 0. */
double hr_bench_fit_scale(hr_bench_pattern p, int n_ctx);
/* The context length a server reports in GET /v1/models (headroom's data[0].meta.n_ctx, vLLM's
 * data[0].max_model_len, llama-server's data[0].meta.n_ctx_train) into *n_ctx, or 0 when it reports
 * none or cannot be asked; never fails the run (the bench's own requests report the problem). */
void hr_bench_probe_context(const char *url, const char *api_key, double timeout_s, int *n_ctx);

/* One request to send. */
typedef struct hr_bench_spec {
    char *prefix;          /* shared system prompt (malloc'd) or NULL; sent before prompt (chat: as system) */
    char *prompt;          /* malloc'd */
    int max_tokens;        /* > 0 */
    int prefix_id;         /* 0..HR_BENCH_N_SHARED_PREFIXES-1 for shared-prefix requests, else -1 */
    hr_bench_pattern kind; /* for mixed: the class drawn; for traces HR_BENCH_TRACE */
    double t_s;            /* trace arrival offset in seconds, or -1 when the trace line has none */
} hr_bench_spec;

void hr_bench_spec_free(hr_bench_spec *s);

/* Request i of pattern p for seed (i >= 0, scale in (0, 16]): a pure function of (p, seed, i, scale),
 * so a run of N requests is a prefix of a run of N + 1, and --duration runs draw as many as they
 * need. p must not be HR_BENCH_TRACE. HR_ERR_NOMEM or HR_ERR_INVALID_ARG. */
hr_status hr_bench_pattern_spec(hr_bench_pattern p, uint64_t seed, int i, double scale, hr_bench_spec *out,
                                hr_error *err);

/* Open-loop arrival times: a seeded stream of offsets in seconds, increasing. */
typedef struct hr_bench_arrivals {
    hr_rng rng;
    hr_bench_pattern pattern;
    double rate; /* requests per second, > 0 */
    double t;    /* the last offset handed out */
    int burst_left;
} hr_bench_arrivals;

void hr_bench_arrivals_init(hr_bench_arrivals *a, hr_bench_pattern p, uint64_t seed, double rate);
/* The next arrival offset (the first is 0 for short-burst, one exponential gap for the others). */
double hr_bench_arrivals_next(hr_bench_arrivals *a);

/* ---- traces ------------------------------------------------------------------------------------ */

/* One line of a trace file (JSONL): an object with
 *   "prompt": string  or  "prompt_words": integer 1..100000 (text built from the word list),
 *   "max_tokens": integer 1..1000000 (required),
 *   "t": number >= 0 (optional arrival offset in seconds, replayed when neither --rate nor
 *        --concurrency is given),
 *   "system": string (optional shared prefix);
 * other fields are ignored. Blank lines and lines starting with '#' are not requests. */
typedef enum hr_bench_line_kind {
    HR_BENCH_LINE_REQUEST = 0,
    HR_BENCH_LINE_SKIP = 1, /* blank or comment */
} hr_bench_line_kind;

/* Parses one line (len bytes, no NUL needed, a trailing newline is allowed). Pure: no I/O. On
 * HR_OK sets *kind and, for a request, fills *out (the caller frees it with hr_bench_spec_free);
 * words_seed seeds the text of "prompt_words" lines. On HR_ERR_FORMAT (not JSON, not an object, a
 * field of the wrong type) or HR_ERR_RANGE (a value out of range, a missing or doubled field) sets
 * err naming the field and sets nothing else. */
hr_status hr_bench_trace_parse_line(const char *line, size_t len, uint64_t words_seed, hr_bench_line_kind *kind,
                                    hr_bench_spec *out, hr_error *err);

/* Reads a whole trace file: every request line, in order, into a malloc'd array. A bad line, a file
 * with no requests, or "t" present on some lines and not others, or decreasing, fails with the line
 * number in err and nothing allocated. */
hr_status hr_bench_trace_load(const char *path, uint64_t seed, hr_bench_spec **out, int *n_out, hr_error *err);

/* ---- streaming responses ----------------------------------------------------------------------- */

/* What the bench reads from one SSE stream: fed bytes as they arrive, it finds the `data:` events,
 * times the ones that carry text, and keeps the last usage (with headroom's usage.kv). */
typedef struct hr_bench_sse {
    char *buf; /* bytes not yet split into events */
    size_t len, cap;
    int n_events;      /* data events parsed as JSON */
    int n_bad_events;  /* data events that were not JSON objects */
    int n_text_events; /* events carrying text: the tokens timed */
    bool done;         /* saw data: [DONE] */
    bool has_usage;
    int prompt_tokens, completion_tokens;
    bool has_kv;
    int64_t kv_bytes_peak, kv_blocks_peak, kv_prefix_hit_tokens, kv_preemptions;
    double kv_queued_s;
    double kv_first_token_s; /* usage.kv.first_token_seconds (headroom: the server's own TTFT); -1 absent */
    bool has_cached;         /* OpenAI's usage.prompt_tokens_details.cached_tokens (llama-server, vLLM, ...) */
    int64_t cached_tokens;
    char finish_reason[32];
    char error[160]; /* an error event's message, or the first bytes of a non-SSE body */
    double *t_text;  /* time of each text event (malloc'd, n_text_events of them) */
    int t_cap;
} hr_bench_sse;

/* Feeds n bytes that arrived at time now_s. Returns false only when memory ran out. */
bool hr_bench_sse_feed(hr_bench_sse *s, const char *data, size_t n, double now_s);
void hr_bench_sse_free(hr_bench_sse *s);

/* ---- running a bench ----------------------------------------------------------------------------- */

typedef enum hr_bench_status {
    HR_BENCH_OK = 0,
    HR_BENCH_REFUSED = 1,   /* the server answered with HTTP >= 400 (http_code) */
    HR_BENCH_FAILED = 2,    /* transport error, garbage, or a stream cut before [DONE] (reason) */
    HR_BENCH_TIMED_OUT = 3, /* past the per-request timeout */
} hr_bench_status;

const char *hr_bench_status_name(hr_bench_status s);

/* One request's measurements. Times are seconds from the start of the run. */
typedef struct hr_bench_result {
    hr_bench_status status;
    int http_code;    /* 0 when no response */
    char reason[192]; /* for REFUSED / FAILED / TIMED_OUT */
    int max_tokens;
    double t_sched; /* when it was due (open loop: its arrival; closed loop: when a slot freed) */
    double t_first; /* first text event, or -1 */
    double t_end;   /* done, or -1 */
    double ttft_s;  /* t_first - t_sched, or -1 */
    double e2e_s;   /* t_end - t_sched, or -1 */
    double *gaps_s; /* inter-token gaps (malloc'd, n_gaps) */
    int n_gaps;
    int n_text_events;
    int prompt_tokens, completion_tokens; /* from usage, or -1 (then output counts text events) */
    char finish_reason[32];
    bool has_kv;
    int64_t kv_bytes_peak, kv_prefix_hit_tokens, kv_preemptions;
    double kv_first_token_s; /* the server's own time to first token (usage.kv.first_token_seconds), -1 absent */
    bool has_cached;
    int64_t cached_tokens; /* usage.prompt_tokens_details.cached_tokens */
} hr_bench_result;

void hr_bench_results_free(hr_bench_result *r, int n);

/* One poll tick: what the client sees (in flight, streaming) and, when the server has GET /v1/kv,
 * the pool and its queues. */
typedef struct hr_bench_sample {
    double t_s;
    int client_waiting;   /* sent, no token yet */
    int client_streaming; /* first token seen, not done */
    bool has_pool;
    int64_t pool_used_bytes, pool_total_bytes;
    int server_running, server_waiting;
} hr_bench_sample;

typedef struct hr_bench_progress {
    double t_s;
    int sent, in_flight, done, ok, refused, failed, timed_out, total; /* total -1: a --duration run */
} hr_bench_progress;

typedef struct hr_bench_run_params {
    const char *url;     /* base URL, e.g. http://127.0.0.1:8080 (a trailing / or /v1 is dropped) */
    const char *api_key; /* NULL: no Authorization header */
    const char *model;   /* NULL: no "model" field */
    bool chat;           /* /v1/chat/completions instead of /v1/completions */
    bool ignore_eos;     /* send "ignore_eos": true so outputs run to max_tokens */
    int n_requests;      /* > 0; with duration_s > 0 the bound on requests */
    double duration_s;   /* > 0: stop starting requests after this many seconds */
    int concurrency;     /* > 0: closed loop */
    double rate;         /* > 0: open loop, Poisson (or the pattern's bursts) */
    bool replay_times;   /* open loop at the specs' t_s (a trace with times) */
    hr_bench_pattern pattern;
    uint64_t seed;
    double timeout_s; /* per request, > 0 */
    double poll_s;    /* GET /v1/kv every poll_s (0: never) */
    /* where the requests come from: specs (n_specs of them, a trace, reused cyclically in a
     * --duration run) or, when specs is NULL, hr_bench_pattern_spec(pattern, seed, i, scale) */
    const hr_bench_spec *specs;
    int n_specs;
    double scale;
    void (*on_progress)(const hr_bench_progress *p, void *user); /* about once a second */
    void *user;
    /* may be NULL; a signal handler counts into it: 1 stops starting requests (those in flight finish
     * within the timeout), 2 or more also abandons those in flight (FAILED, "interrupted") */
    volatile sig_atomic_t *stop;
} hr_bench_run_params;

/* The whole run: returns HR_OK when it ran (whatever each request's status) with *results
 * (*n_results entries, the requests started, in start order) and *samples (*n_samples poll ticks)
 * malloc'd; HR_ERR_NOMEM / HR_ERR_INTERNAL (libcurl could not start) / HR_ERR_INVALID_ARG with err. */
hr_status hr_bench_run(const hr_bench_run_params *p, hr_bench_result **results, int *n_results,
                       hr_bench_sample **samples, int *n_samples, hr_error *err);

/* ---- statistics and the report ------------------------------------------------------------------ */

typedef struct hr_bench_dist {
    int n;
    double mean, p50, p90, p99, max; /* -1 when n == 0 */
} hr_bench_dist;

/* Sorts values in place and summarizes them. */
hr_bench_dist hr_bench_dist_of(double *values, int n);

#define HR_BENCH_MAX_CODES 16

typedef struct hr_bench_report {
    int n_sent, n_ok, n_refused, n_failed, n_timed_out, n_truncated;         /* truncated: ok, fewer tokens */
    int codes[HR_BENCH_MAX_CODES], code_counts[HR_BENCH_MAX_CODES], n_codes; /* refusals by code */
    double wall_s;                                                           /* first scheduled to last done */
    double req_per_s, out_tok_per_s;                                         /* ok requests only */
    double slo_ttft_s, slo_itl_s;                                            /* <= 0: none */
    int n_good;                                                              /* ok and within both SLOs */
    double goodput_req_per_s, goodput_tok_per_s;                             /* n_good's */
    int64_t prompt_tokens, output_tokens; /* over ok requests, usage where reported */
    int64_t text_events;                  /* their text chunks (a chunk may carry several tokens) */
    /* ITL: every gap between text chunks of every ok request, as a client sees them; goodput's
     * --slo-itl is on time per output token after the first, (E2E - TTFT) / (tokens - 1) */
    hr_bench_dist ttft_ms, itl_ms, e2e_ms;
    int peak_streaming, peak_in_flight;           /* client side */
    int peak_server_running, peak_server_waiting; /* -1 without /v1/kv */
    /* KV (has_kv false: the server reported none; the figures below are then 0 / -1) */
    bool has_kv, has_pool;
    int n_with_kv;
    int64_t pool_peak_used_bytes, pool_total_bytes; /* from GET /v1/kv polls */
    hr_bench_dist kv_bytes;                         /* usage.kv.bytes_peak per request */
    int64_t prefix_hit_tokens, preemptions;
    /* prompt tokens served from a cache as OpenAI's usage reports them (any server that fills
     * usage.prompt_tokens_details.cached_tokens); n_with_cached 0: none did */
    int n_with_cached;
    int64_t cached_tokens;
} hr_bench_report;

/* Summarizes a run. slo_* <= 0 means no SLO on that figure. */
void hr_bench_report_compute(const hr_bench_result *r, int n, const hr_bench_sample *s, int ns, double slo_ttft_s,
                             double slo_itl_s, hr_bench_report *out);

/* What the run was, printed with the report. */
typedef struct hr_bench_meta {
    const char *url, *model, *pattern, *endpoint;
    uint64_t seed;
    int concurrency;
    double rate, scale, duration_s;
    int n_requests;
} hr_bench_meta;

/* The report as a table (stdout), one JSON object (with a per-request array), a CSV of one row per
 * request, and an SVG of the run. Each returns HR_ERR_IO when writing failed. */
hr_status hr_bench_write_table(FILE *f, const hr_bench_meta *m, const hr_bench_report *rep, const hr_bench_result *r,
                               int n, hr_error *err);
hr_status hr_bench_write_json(FILE *f, const hr_bench_meta *m, const hr_bench_report *rep, const hr_bench_result *r,
                              int n, hr_error *err);
hr_status hr_bench_write_csv(FILE *f, const hr_bench_result *r, int n, hr_error *err);
hr_status hr_bench_write_svg(FILE *f, const hr_bench_meta *m, const hr_bench_report *rep, const hr_bench_result *r,
                             int n, const hr_bench_sample *s, int ns, hr_error *err);

#endif

/* cmd_bench.c: `headroom bench`: replays a traffic pattern or a trace against an OpenAI-compatible
 * server and reports latency, throughput, goodput, refusals and what the KV cache did. Everything the
 * command line can get wrong is checked (and the trace read) before the first request leaves. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "cli/args.h"
#include "cli/commands.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: headroom bench --url URL --pattern PATTERN [--requests N | --duration S]\n"
            "                      [--concurrency C | --rate R] [options]\n\n"
            "A load generator for any OpenAI-compatible server: streams every request (SSE with\n"
            "stream_options.include_usage), times the first token and every inter-token gap, and reports\n"
            "throughput, goodput, TTFT/ITL/E2E percentiles, refusals by HTTP code and, from servers that report\n"
            "it (headroom's usage.kv and GET /v1/kv), the KV cache: pool peak, bytes per request, prefix hits,\n"
            "preemptions (other servers: OpenAI's usage.prompt_tokens_details.cached_tokens where they fill it;\n"
            "else the KV lines stay empty). Only URL is contacted; no redirect is followed.\n\n"
            "  --url URL            the server, e.g. http://127.0.0.1:8080 (a trailing /v1 is allowed)\n"
            "  --api-key K          sent as Authorization: Bearer K (default: $HEADROOM_API_KEY if set)\n"
            "  --model M            the request's \"model\" field (default: none sent)\n"
            "  --pattern P          long-few | short-burst | prefill-heavy | decode-heavy | shared-prefix | mixed,\n"
            "                       or FILE.jsonl, a trace (one object a line: \"prompt\" or \"prompt_words\",\n"
            "                       \"max_tokens\", optional \"t\" seconds and \"system\"). Patterns (prompt words,\n"
            "                       output tokens, uniform): long-few 600-1000/128-256, short-burst 8-32/8-32 in\n"
            "                       open-loop bursts of 4-16, prefill-heavy 300-600/4-16, decode-heavy\n"
            "                       8-32/200-400, shared-prefix one of 4 fixed 200-word system prompts +\n"
            "                       10-40/16-64, mixed draws each request from those five\n"
            "  --requests N         send N requests (default 16)\n"
            "  --duration S         start requests for S seconds instead (those in flight then finish)\n"
            "  --concurrency C      closed loop: keep C requests in flight (default 4)\n"
            "  --rate R             open loop: R requests/s, Poisson arrivals (short-burst: bursts); a trace\n"
            "                       with \"t\" and neither flag replays its times\n"
            "  --seed S             the pattern's seed (default 1): same seed, same requests\n"
            "  --scale F            multiply every pattern length by F (0.01..16). Default: 1, or less when\n"
            "                       the server reports its context (GET /v1/models) and the pattern's\n"
            "                       longest request (3 tokens a word) would not fit it; the run says so\n"
            "  --chat               use /v1/chat/completions (system prompt as a system message) instead of\n"
            "                       /v1/completions\n"
            "  --no-ignore-eos      do not send \"ignore_eos\": true (sent by default so outputs run to\n"
            "                       max_tokens; servers that reject unknown fields need this flag)\n"
            "  --timeout S          per-request limit in seconds (default 120): past it, \"timed out\"\n"
            "  --poll-ms MS         poll GET /v1/kv every MS ms (default 250; 0: never); stops by itself when\n"
            "                       the server does not answer it with a pool\n"
            "  --slo-ttft MS        goodput counts requests whose TTFT <= MS ...\n"
            "  --slo-itl MS         ... and whose time per output token after the first, (E2E - TTFT) /\n"
            "                       (tokens - 1), <= MS (default: no SLO). ITL percentiles are the gaps\n"
            "                       between text chunks as the client sees them (a chunk may carry tokens)\n"
            "  --json               print the report as one JSON object (with every request) instead of a table\n"
            "  --csv FILE           also write one CSV row per request to FILE\n"
            "  --plot FILE.svg      also write an SVG: KV pool use and running/waiting requests over time with\n"
            "                       a mark at each first token, and the TTFT / end-to-end latency CDF\n"
            "  -q, --quiet          no progress line on stderr\n\n"
            "Each request ends ok, refused (the server answered HTTP >= 400; counted by code), failed (no\n"
            "connection, a garbage body, a stream cut before [DONE]; with the reason) or timed out, and the run\n"
            "goes on. Ctrl-C stops starting requests; a second one abandons those in flight.\n\n"
            "exit status: 0 every request ok; 1 the run finished but some request was not ok (or an output\n"
            "file could not be written); 2 a usage error, a bad --pattern or trace line (nothing was sent)\n");
}

static volatile sig_atomic_t interrupts;

static void on_sigint(int sig) {
    (void)sig;
    interrupts++;
}

typedef struct progress_ctx {
    bool tty;
    int calls;
} progress_ctx;

static void on_progress(const hr_bench_progress *p, void *user) {
    progress_ctx *c = user;
    /* on a terminal the line rewrites itself each second; into a file, a line every 5 s and the last */
    bool last = p->in_flight == 0 && p->done == p->sent && p->sent > 0 && p->t_s > 0 && c->calls > 0;
    if (!c->tty && c->calls++ % 5 != 0 && !last) return;
    char total[24] = "";
    if (p->total >= 0) snprintf(total, sizeof total, "/%d", p->total);
    fprintf(stderr, "%sbench: %.0f s, sent %d%s, in flight %d, done %d (ok %d, refused %d, failed %d, timed out %d)%s",
            c->tty ? "\r" : "", p->t_s, p->sent, total, p->in_flight, p->done, p->ok, p->refused, p->failed,
            p->timed_out, c->tty ? "   " : "\n");
    fflush(stderr);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

static bool write_file(const char *path, const char *what, int kind, const hr_bench_meta *m, const hr_bench_report *rep,
                       const hr_bench_result *r, int n, const hr_bench_sample *s, int ns) {
    FILE *f = fopen(path, "w");
    hr_error err = {0};
    hr_status st = HR_ERR_IO;
    if (f) {
        st = kind == 0 ? hr_bench_write_csv(f, r, n, &err) : hr_bench_write_svg(f, m, rep, r, n, s, ns, &err);
        if (fclose(f) != 0 && st == HR_OK) st = HR_ERR_IO;
    }
    if (st != HR_OK) fprintf(stderr, "headroom bench: cannot write %s '%s'\n", what, path);
    return st == HR_OK;
}

int hr_cmd_bench(int argc, char **argv) {
    const char *url = NULL, *pattern = NULL, *csv = NULL, *plot = NULL;
    hr_bench_run_params p = {.api_key = getenv("HEADROOM_API_KEY"),
                             .ignore_eos = true,
                             .n_requests = 16,
                             .seed = 1,
                             .scale = 1,
                             .timeout_s = 120,
                             .poll_s = 0.25};
    bool json = false, quiet = false, has_requests = false, has_scale = false;
    float duration = 0, rate = 0, scale = 1, timeout = 120, slo_ttft = 0, slo_itl = 0;
    int poll_ms = 250;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        bool ok = true;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return HR_EXIT_OK;
        } else if (!strcmp(a, "--url")) {
            ok = (url = hr_arg_value("bench", argc, argv, &i)) != NULL;
        } else if (!strcmp(a, "--api-key")) {
            ok = (p.api_key = hr_arg_value("bench", argc, argv, &i)) != NULL;
        } else if (!strcmp(a, "--model")) {
            ok = (p.model = hr_arg_value("bench", argc, argv, &i)) != NULL;
        } else if (!strcmp(a, "--pattern")) {
            ok = (pattern = hr_arg_value("bench", argc, argv, &i)) != NULL;
        } else if (!strcmp(a, "--requests")) {
            ok = (v = hr_arg_value("bench", argc, argv, &i)) && hr_arg_int("bench", a, v, 1, 1000000, &p.n_requests);
            has_requests = true;
        } else if (!strcmp(a, "--duration")) {
            ok = (v = hr_arg_value("bench", argc, argv, &i)) && hr_arg_float("bench", a, v, 0.001, 86400, &duration);
        } else if (!strcmp(a, "--concurrency")) {
            ok = (v = hr_arg_value("bench", argc, argv, &i)) && hr_arg_int("bench", a, v, 1, 100000, &p.concurrency);
        } else if (!strcmp(a, "--rate")) {
            ok = (v = hr_arg_value("bench", argc, argv, &i)) && hr_arg_float("bench", a, v, 0.001, 1e6, &rate);
        } else if (!strcmp(a, "--seed")) {
            ok = (v = hr_arg_value("bench", argc, argv, &i)) && hr_arg_u64("bench", a, v, &p.seed);
        } else if (!strcmp(a, "--scale")) {
            ok = (v = hr_arg_value("bench", argc, argv, &i)) && hr_arg_float("bench", a, v, 0.01, 16, &scale);
            has_scale = true;
        } else if (!strcmp(a, "--timeout")) {
            ok = (v = hr_arg_value("bench", argc, argv, &i)) && hr_arg_float("bench", a, v, 0.1, 86400, &timeout);
        } else if (!strcmp(a, "--poll-ms")) {
            ok = (v = hr_arg_value("bench", argc, argv, &i)) && hr_arg_int("bench", a, v, 0, 3600000, &poll_ms);
        } else if (!strcmp(a, "--slo-ttft")) {
            ok = (v = hr_arg_value("bench", argc, argv, &i)) && hr_arg_float("bench", a, v, 0.001, 1e9, &slo_ttft);
        } else if (!strcmp(a, "--slo-itl")) {
            ok = (v = hr_arg_value("bench", argc, argv, &i)) && hr_arg_float("bench", a, v, 0.001, 1e9, &slo_itl);
        } else if (!strcmp(a, "--csv")) {
            ok = (csv = hr_arg_value("bench", argc, argv, &i)) != NULL;
        } else if (!strcmp(a, "--plot")) {
            ok = (plot = hr_arg_value("bench", argc, argv, &i)) != NULL;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--chat")) {
            p.chat = true;
        } else if (!strcmp(a, "--no-ignore-eos")) {
            p.ignore_eos = false;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = true;
        } else {
            fprintf(stderr, "headroom bench: unknown flag '%s' (see headroom bench --help)\n", a);
            return HR_EXIT_USAGE;
        }
        if (!ok) return HR_EXIT_USAGE;
    }
    if (!url || !pattern) {
        fprintf(stderr, "headroom bench: %s is required (see headroom bench --help)\n", !url ? "--url" : "--pattern");
        return HR_EXIT_USAGE;
    }
    if (strncmp(url, "http://", 7) && strncmp(url, "https://", 8)) {
        fprintf(stderr, "headroom bench: --url expects http://HOST:PORT or https://..., got '%s'\n", url);
        return HR_EXIT_USAGE;
    }
    if (has_requests && duration > 0) {
        fprintf(stderr, "headroom bench: give --requests or --duration, not both\n");
        return HR_EXIT_USAGE;
    }
    if (p.concurrency > 0 && rate > 0) {
        fprintf(stderr, "headroom bench: give --concurrency or --rate, not both\n");
        return HR_EXIT_USAGE;
    }
    hr_error err = {0};
    hr_bench_spec *specs = NULL;
    int n_specs = 0;
    if (hr_bench_pattern_parse(pattern, &p.pattern, &err) != HR_OK) {
        if (!ends_with(pattern, ".jsonl")) {
            fprintf(stderr, "headroom bench: --pattern: %s\n", err.msg);
            return HR_EXIT_USAGE;
        }
        if (hr_bench_trace_load(pattern, p.seed, &specs, &n_specs, &err) != HR_OK) {
            fprintf(stderr, "headroom bench: --pattern: %s\n", err.msg);
            return HR_EXIT_USAGE;
        }
        p.pattern = HR_BENCH_TRACE;
        p.specs = specs;
        p.n_specs = n_specs;
        if (!has_requests && duration <= 0) p.n_requests = n_specs;
        p.replay_times = p.concurrency <= 0 && rate <= 0 && specs[0].t_s >= 0;
    }
    if (p.concurrency <= 0 && rate <= 0 && !p.replay_times) p.concurrency = 4;
    if (!has_scale && !specs) { /* fit the pattern to a small model rather than have it refuse them all */
        int n_ctx = 0;
        hr_bench_probe_context(url, p.api_key, timeout < 10 ? timeout : 10, &n_ctx);
        double fit = hr_bench_fit_scale(p.pattern, n_ctx);
        if (fit < 1) {
            scale = (float)fit;
            fprintf(stderr,
                    "headroom bench: the server's context is %d tokens: %s's lengths scaled by %.2f to fit "
                    "(--scale to choose)\n",
                    n_ctx, pattern, fit);
        }
    }
    p.url = url;
    p.rate = rate;
    p.scale = scale;
    p.timeout_s = timeout;
    p.poll_s = poll_ms / 1000.0;
    if (duration > 0) {
        p.duration_s = duration;
        p.n_requests = 1000000;
    }
    progress_ctx pc = {.tty = isatty(2) == 1};
    if (!quiet) {
        p.on_progress = on_progress;
        p.user = &pc;
    }
    interrupts = 0;
    p.stop = &interrupts;
    struct sigaction sa = {.sa_handler = on_sigint}, old_int, old_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    signal(SIGPIPE, SIG_IGN);

    hr_bench_result *res = NULL;
    hr_bench_sample *smp = NULL;
    int n = 0, ns = 0;
    hr_status st = hr_bench_run(&p, &res, &n, &smp, &ns, &err);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (!quiet && pc.tty) fputc('\n', stderr);
    for (int i = 0; i < n_specs; i++) hr_bench_spec_free(&specs[i]);
    free(specs);
    if (st != HR_OK) {
        fprintf(stderr, "headroom bench: %s\n", err.msg);
        return HR_EXIT_FAIL;
    }
    hr_bench_report rep;
    hr_bench_report_compute(res, n, smp, ns, slo_ttft / 1000.0, slo_itl / 1000.0, &rep);
    hr_bench_meta m = {.url = url,
                       .model = p.model,
                       .pattern = pattern,
                       .endpoint = p.chat ? "chat" : "completions",
                       .seed = p.seed,
                       .concurrency = p.concurrency,
                       .rate = rate,
                       .scale = scale,
                       .duration_s = duration,
                       .n_requests = p.n_requests};
    bool ok = (json ? hr_bench_write_json(stdout, &m, &rep, res, n, &err)
                    : hr_bench_write_table(stdout, &m, &rep, res, n, &err)) == HR_OK;
    if (!ok) fprintf(stderr, "headroom bench: %s\n", err.msg);
    if (csv) ok &= write_file(csv, "the CSV", 0, &m, &rep, res, n, smp, ns);
    if (plot) ok &= write_file(plot, "the plot", 1, &m, &rep, res, n, smp, ns);
    hr_bench_results_free(res, n);
    free(smp);
    return ok && rep.n_ok == rep.n_sent ? HR_EXIT_OK : HR_EXIT_FAIL;
}

/* cmd_serve.c: `headroom serve`: an OpenAI-compatible HTTP server (src/server) over one runtime. The
 * port opens first (/health answers 503 "loading" while the model loads), then the runtime's engine
 * thread starts; SIGINT or SIGTERM drains in-flight requests (up to --drain-timeout) and exits. SIGHUP,
 * SIGUSR1, SIGUSR2 and SIGALRM are never fatal: each is one log line (SIGUSR1's is the server's state). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/serve_cluster.h"
#include "cli/session.h"
#include "common/util.h"
#include "runtime/runtime.h"
#include "server/server.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: headroom serve [-m FILE.gguf] [--host H] [--port P] [--api-key K] [options]\n\n"
            "Serves the model over HTTP with OpenAI's API: POST /v1/completions, /v1/chat/completions (stream\n"
            "true/false; every usage carries a \"kv\" object: the request's KV blocks and bytes, prefix-cache\n"
            "hits, evictions, preemptions, queue time), GET /v1/models, GET /v1/kv (the pool, every running\n"
            "request's ledger, rates and events), GET / or /dashboard (a live dashboard of it in the browser;\n"
            "`headroom top` shows it in a terminal), GET /metrics (Prometheus), GET /health, POST /tokenize,\n"
            "/detokenize. Request extensions: \"kv_policy\" (e.g. \"window:256\"), \"priority\" (int),\n"
            "\"ignore_eos\" (bool), \"cache_salt\" (string: only requests with the same salt share cached\n"
            "prefix blocks). Constrained output (docs/CONSTRAIN.md): \"response_format\" (json_object,\n"
            "json_schema), \"guided_json\", \"guided_regex\", \"guided_grammar\" (GBNF), \"guided_choice\".\n"
            "Without -m, the built-in demo model (random weights: its text is noise).\n\n"
            "server:\n"
            "      --host H           numeric address to bind (default 127.0.0.1; 0.0.0.0 or :: for all)\n"
            "      --port P           TCP port (default 8080; 0 picks a free one, printed at start)\n"
            "      --api-key K        require \"Authorization: Bearer K\" on /v1/*, /tokenize, /detokenize (401\n"
            "                         otherwise; /health, /metrics and the dashboard page stay open: the page asks\n"
            "                         for the key); default: $HEADROOM_API_KEY. Repeat it, or give K1,K2,..., for\n"
            "                         several keys: each is a tenant (see --cache-scope)\n"
            "      --cache-scope M    who shares the prefix cache (a hit tells a prompt's prefix was seen): auto\n"
            "                         (default: per API key when several are given, else shared), key, shared. A\n"
            "                         request's \"cache_salt\" string narrows its scope further in every mode\n"
            "      --special-in-content  parse special-token text (\"<|im_end|>\", \"</s>\") inside chat message\n"
            "                         contents and raw prompts as control tokens; default: it stays text, and only\n"
            "                         the chat template's own markers are control tokens (send ids for control\n"
            "                         tokens in a raw prompt)\n"
            "      --max-parse-memory SIZE  memory all request bodies being parsed may hold at once (default\n"
            "                         64MiB, part of the memory plan); one body may take a quarter, and at most\n"
            "                         64 x its size + 256KiB (413 above; 503 while others hold it all for 5 s)\n"
            "      --drain-timeout S  on SIGINT/SIGTERM, seconds in-flight requests may still run (default 30;\n"
            "                         meanwhile /health answers 503 \"draining\"). SIGUSR1 logs a state line;\n"
            "                         SIGHUP, SIGUSR2 and SIGALRM are logged and ignored\n"
            "      --metrics-compat vllm  also export vllm:num_requests_running/waiting, vllm:kv_cache_usage_perc,\n"
            "                         vllm:gpu_cache_usage_perc, vllm:num_preemptions_total,\n"
            "                         vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total (tokens)\n"
            "      --max-body SIZE    largest request body (default 4MiB; 413 above)\n"
            "      --max-connections N  requests served at once, one thread each (default 256); a connection\n"
            "                         waits without a thread until its request headers are in (up to 4 x N of\n"
            "                         them; when full, the one waiting longest makes room), then for a thread\n"
            "      --listen-backlog N connections the kernel holds when every waiting one is ready for a thread\n"
            "                         (default 1024, capped by net.core.somaxconn)\n"
            "      --max-conns-per-ip N  connections one client address may have waiting, and as many served\n"
            "                         (default 64; more are closed at once; 0: no cap; behind a proxy every\n"
            "                         client has the proxy's address)\n"
            "      --header-timeout S seconds a connection has to send its request headers (default 10; then it\n"
            "                         is closed)\n"
            "      --body-min-rate SIZE  bytes per second a request body must keep up after --header-timeout's\n"
            "                         grace (default 1KiB; slower connections are closed; 0: no check). Streams\n"
            "                         and requests waiting on the engine have no deadline; every response\n"
            "                         closes its connection\n"
            "      --max-header SIZE  per-connection memory for the request line and headers (default 32KiB,\n"
            "                         at least 32KiB; 431 above)\n"
            "      --max-n N          largest \"n\" (choices) a request may ask for, 1..8 (default 8)\n"
            "      --max-tokens-limit N  largest max_tokens a request may ask for (400 above; also the default\n"
            "                         when it gives none); default 0: only the context bounds it. A prompt\n"
            "                         longer than the context (-c) is a 400. A request under a window policy\n"
            "                         (kv_policy) may run past the context, up to 4 contexts\n" HR_SERVE_CLUSTER_HELP
            "model, cache and engine (as in `headroom run`; see its --help):\n"
            "  -m, --model FILE, -c, --ctx N, --ctx-extend, --kv-budget SIZE, --kv-type F, --kv-type-k F,\n"
            "  --kv-type-v F, --kv-policy P, --block-size N, --kv-layout L, -b, --max-batch-tokens N,\n"
            "  --prefill-chunk N, --max-running N, --max-queue N (429 with Retry-After when full), --admission M,\n"
            "  --preempt M, --swap-space SIZE, -t, --threads N, --mmap, --isa NAME, --chat-template NAME\n"
            "      --kv-seqs N        without --kv-budget, the pool holds N sequences of --ctx (default 4)\n"
            "      --mem-limit SIZE   size the pool from the memory plan so the whole process stays under SIZE\n"
            "                         (weights, scratch and the rest first; `headroom plan` shows the parts);\n"
            "                         the plan is logged at start, the measured peak RSS at exit\n"
            "      --step-log FILE    write one JSON line per engine step that computed: start time, seconds in\n"
            "                         the step and its forward pass, tokens, prompt tokens, sampled rows, sequences,\n"
            "                         keys attended (to check `headroom plan`'s cost model against this machine)\n"
            "sampling defaults (a request's own fields override them):\n"
            "  --temp T (0.8), --top-k K (40), --top-p P (0.95), --min-p P (0.05), --repeat-penalty X,\n"
            "  --presence-penalty X, --frequency-penalty X, --repeat-last-n N, --seed S (requests without a seed\n"
            "  get S mixed with a request counter)\n"
            "\n" HR_EXIT_HELP);
}

static void print_banner(hr_runtime *rt, const hr_server_params *sp, int port) {
    const hr_runtime_params *p = hr_runtime_get_params(rt);
    const hr_kv_budget *b = hr_runtime_budget(rt);
    char size[32];
    printf("headroom serve: %s%s, context %d, KV %s/%s block %d, budget %s = %lld tokens (%d sequences of the "
           "context)\n",
           hr_runtime_model_name(rt), hr_runtime_is_demo(rt) ? " (demo model, random weights: its text is noise)" : "",
           hr_runtime_n_ctx(rt), hr_rt_kv_format_name(p->k_format), hr_rt_kv_format_name(p->v_format), p->block_size,
           hr_format_size(b->budget_bytes, size, sizeof size), (long long)b->n_tokens, b->n_seqs_at_ctx);
    bool v6 = strchr(sp->host, ':') != NULL;
    const char *host = !strcmp(sp->host, "0.0.0.0") ? "127.0.0.1" : !strcmp(sp->host, "::") ? "::1" : sp->host;
    char url[128];
    snprintf(url, sizeof url, "http://%s%s%s:%d", v6 ? "[" : "", host, v6 ? "]" : "", port);
    printf("listening on %s:%d (OpenAI API at %s/v1)\n", sp->host, port, url);
    printf("try: curl %s/v1/completions -H 'Content-Type: application/json'%s -d '{\"prompt\": \"Once upon a time\", "
           "\"max_tokens\": 32}'\n",
           url, sp->api_key && *sp->api_key ? " -H \"Authorization: Bearer $HEADROOM_API_KEY\"" : "");
    hr_runtime_memory m;
    hr_runtime_get_memory(rt, &m);
    char w[32], k[32], sc[32], t[32], lim[32], now[32];
    char rq[32];
    printf("memory plan: weights %s + KV %s + scratch %s + request parsing %s + tables and overhead %s = %s%s%s "
           "(measured RSS now %s)\n",
           hr_format_size(m.weight_bytes, w, sizeof w), hr_format_size(m.kv_bytes, k, sizeof k),
           hr_format_size(m.scratch_bytes, sc, sizeof sc), hr_format_size(m.request_bytes, rq, sizeof rq),
           hr_format_size(m.meta_bytes + m.base_bytes, t, sizeof t), hr_format_size(m.planned_bytes, size, sizeof size),
           p->mem_limit ? " under --mem-limit " : "", p->mem_limit ? hr_format_size(p->mem_limit, lim, sizeof lim) : "",
           hr_format_size(m.rss_bytes, now, sizeof now));
    fflush(stdout);
}

/* Waits for SIGINT or SIGTERM; the other signals in sigs are logged and waited past. */
static int wait_for_stop(const sigset_t *sigs, hr_server *srv) {
    for (;;) {
        int sig = 0;
        if (sigwait(sigs, &sig) != 0) continue;
        if (sig == SIGINT || sig == SIGTERM) return sig;
        hr_server_stats st;
        hr_server_get_stats(srv, &st);
        const char *name = sig == SIGHUP    ? "SIGHUP"
                           : sig == SIGUSR1 ? "SIGUSR1"
                           : sig == SIGUSR2 ? "SIGUSR2"
                                            : "SIGALRM";
        if (sig == SIGUSR1)
            fprintf(stderr,
                    "headroom serve: SIGUSR1: state %s, %d request(s) in flight, %d connection(s) open (%d waiting "
                    "for headers), %llu served, closed: %llu slow headers, %llu slow body, %llu to make room, %llu "
                    "bad framing, %llu over the per-address cap\n",
                    st.state, st.n_inflight, st.n_connections, st.n_pending, (unsigned long long)st.n_accepted,
                    (unsigned long long)st.n_cut_headers, (unsigned long long)st.n_cut_body,
                    (unsigned long long)st.n_evicted, (unsigned long long)st.n_refused_framing,
                    (unsigned long long)st.n_refused_per_ip);
        else
            fprintf(stderr, "headroom serve: %s: ignored (%s; SIGUSR1 logs the state, SIGINT/SIGTERM drain and stop)\n",
                    name, sig == SIGHUP ? "nothing to reload: flags are read at start" : "no action");
        fflush(stderr);
    }
}

/* keys_out: the joined --api-key list, freed by the caller whatever the return. */
static int serve(int argc, char **argv, char **keys_out) {
    hr_session_opts o = hr_session_default_opts();
    o.cmd = "serve";
    hr_server_params sp = hr_server_default_params();
    sp.api_key = getenv("HEADROOM_API_KEY");
    int kv_seqs = 4;
    uint64_t mem_limit = 0;
    const char *step_log = NULL;
    bool special_in_content = false;
    char *keys = NULL; /* --api-key values joined by commas (mirrored in *keys_out) */
    hr_serve_cluster_opts cluster = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return HR_EXIT_OK;
        }
        if (hr_session_parse_common(&o, "serve", argc, argv, &i, &v)) {
            if (!v) return HR_EXIT_USAGE;
            continue;
        }
        bool ok = true;
        if (hr_serve_cluster_option(&cluster, argc, argv, &i, &ok)) {
        } else if (!strcmp(a, "--host")) {
            ok = (sp.host = hr_arg_value("serve", argc, argv, &i)) != NULL;
        } else if (!strcmp(a, "--port")) {
            ok = (v = hr_arg_value("serve", argc, argv, &i)) && hr_arg_int("serve", a, v, 0, 65535, &sp.port);
        } else if (!strcmp(a, "--api-key")) {
            ok = (v = hr_arg_value("serve", argc, argv, &i)) != NULL;
            char *joined = ok ? malloc((keys ? strlen(keys) + 1 : 0) + strlen(v) + 1) : NULL;
            if (joined) sprintf(joined, "%s%s%s", keys ? keys : "", keys ? "," : "", v); /* repeated: a list */
            free(keys);
            sp.api_key = keys = *keys_out = joined;
            ok = ok && joined;
        } else if (!strcmp(a, "--cache-scope")) {
            ok = (v = hr_arg_value("serve", argc, argv, &i)) != NULL;
            if (ok && !strcmp(v, "auto"))
                sp.cache_scope = HR_CACHE_SCOPE_AUTO;
            else if (ok && !strcmp(v, "key"))
                sp.cache_scope = HR_CACHE_SCOPE_KEY;
            else if (ok && !strcmp(v, "shared"))
                sp.cache_scope = HR_CACHE_SCOPE_SHARED;
            else if (ok) {
                fprintf(stderr, "headroom serve: --cache-scope expects auto, key or shared, got '%s'\n", v);
                ok = false;
            }
        } else if (!strcmp(a, "--special-in-content")) {
            special_in_content = true;
        } else if (!strcmp(a, "--max-parse-memory")) {
            uint64_t n = 0;
            ok = (v = hr_arg_value("serve", argc, argv, &i)) && hr_arg_size("serve", a, v, &n);
            if (ok && (n < (1u << 20) || n > (64ull << 30))) {
                fprintf(stderr, "headroom serve: --max-parse-memory must be 1MiB..64GiB, got '%s'\n", v);
                ok = false;
            }
            sp.max_parse_bytes = (size_t)n;
        } else if (!strcmp(a, "--drain-timeout")) {
            float s = 0;
            ok = (v = hr_arg_value("serve", argc, argv, &i)) && hr_arg_float("serve", a, v, 0, 86400, &s);
            sp.drain_timeout_s = s;
        } else if (!strcmp(a, "--metrics-compat")) {
            ok = (v = hr_arg_value("serve", argc, argv, &i)) != NULL;
            if (ok && !strcmp(v, "vllm"))
                sp.metrics_compat = HR_METRICS_VLLM;
            else if (ok && !strcmp(v, "none"))
                sp.metrics_compat = HR_METRICS_NATIVE;
            else if (ok) {
                fprintf(stderr, "headroom serve: --metrics-compat expects vllm or none, got '%s'\n", v);
                ok = false;
            }
        } else if (!strcmp(a, "--max-body")) {
            uint64_t n = 0;
            ok = (v = hr_arg_value("serve", argc, argv, &i)) && hr_arg_size("serve", a, v, &n);
            sp.max_body_bytes = (size_t)n;
        } else if (!strcmp(a, "--max-connections")) {
            ok =
                (v = hr_arg_value("serve", argc, argv, &i)) && hr_arg_int("serve", a, v, 1, 65536, &sp.max_connections);
        } else if (!strcmp(a, "--listen-backlog")) {
            ok = (v = hr_arg_value("serve", argc, argv, &i)) && hr_arg_int("serve", a, v, 1, 65535, &sp.listen_backlog);
        } else if (!strcmp(a, "--max-conns-per-ip")) {
            ok = (v = hr_arg_value("serve", argc, argv, &i)) &&
                 hr_arg_int("serve", a, v, 0, 65536, &sp.max_conns_per_ip);
        } else if (!strcmp(a, "--header-timeout")) {
            float t = 0;
            ok = (v = hr_arg_value("serve", argc, argv, &i)) && hr_arg_float("serve", a, v, 0.1, 3600, &t);
            sp.header_timeout_s = t;
        } else if (!strcmp(a, "--body-min-rate")) {
            uint64_t n = 0;
            ok = (v = hr_arg_value("serve", argc, argv, &i)) && hr_arg_size("serve", a, v, &n);
            sp.body_min_rate = (double)n;
        } else if (!strcmp(a, "--max-header")) {
            uint64_t n = 0;
            ok = (v = hr_arg_value("serve", argc, argv, &i)) && hr_arg_size("serve", a, v, &n);
            if (ok && (n < (32u << 10) || n > (16u << 20))) {
                fprintf(stderr, "headroom serve: --max-header must be 32KiB..16MiB, got '%s'\n", v);
                ok = false;
            }
            sp.max_header_bytes = (size_t)n;
        } else if (!strcmp(a, "--max-n")) {
            ok = (v = hr_arg_value("serve", argc, argv, &i)) && hr_arg_int("serve", a, v, 1, 8, &sp.max_choices);
        } else if (!strcmp(a, "--max-tokens-limit")) {
            ok = (v = hr_arg_value("serve", argc, argv, &i)) &&
                 hr_arg_int("serve", a, v, 0, 1 << 30, &sp.max_tokens_limit);
        } else if (!strcmp(a, "--mem-limit")) {
            ok = (v = hr_arg_value("serve", argc, argv, &i)) && hr_arg_size("serve", a, v, &mem_limit);
        } else if (!strcmp(a, "--step-log")) {
            ok = (step_log = hr_arg_value("serve", argc, argv, &i)) != NULL;
        } else if (!strcmp(a, "--kv-seqs")) {
            ok = (v = hr_arg_value("serve", argc, argv, &i)) && hr_arg_int("serve", a, v, 1, 4096, &kv_seqs);
        } else if (!strcmp(a, "--kv-policy")) {
            ok = (o.kv_policy = hr_arg_value("serve", argc, argv, &i)) != NULL;
            hr_error perr;
            if (ok && hr_rt_policy_parse(o.kv_policy, NULL, 0, &perr) != HR_OK) {
                fprintf(stderr, "headroom serve: --kv-policy: %s\n", perr.msg);
                ok = false;
            }
        } else if (!strcmp(a, "--chat-template")) {
            ok = (o.chat_template = hr_arg_value("serve", argc, argv, &i)) != NULL;
        } else {
            fprintf(stderr, "headroom serve: unknown option '%s' (see headroom serve --help)\n", a);
            ok = false;
        }
        if (!ok) return HR_EXIT_USAGE;
    }
    if (o.model_path && !hr_arg_regular_file("serve", "-m", o.model_path)) return HR_EXIT_USAGE;
    hr_error err = {0};
    if (hr_rt_sampling_check(&o.sampling, &err) != HR_OK) {
        fprintf(stderr, "headroom serve: %s\n", err.msg);
        return HR_EXIT_USAGE;
    }
    sp.sampling = o.sampling;

    /* SIGINT/SIGTERM (drain) and SIGHUP/SIGUSR1/SIGUSR2/SIGALRM (a log line: their default action
     * would kill the server with its in-flight requests) are taken by sigwait below: blocked here,
     * before any thread starts, so that every thread inherits the mask and none of them is interrupted */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGHUP);
    sigaddset(&sigs, SIGUSR1);
    sigaddset(&sigs, SIGUSR2);
    sigaddset(&sigs, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN); /* a client gone mid-write is an error return, not a signal */
    /* every connection is a descriptor, up to 5 x --max-connections of them (those waiting for their
       headers, those served): the soft limit (often 1024) goes up to the hard one */
    struct rlimit nofile;
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
        nofile.rlim_cur = nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nofile);
    }

    hr_server *srv = NULL;
    hr_status st = hr_server_create(NULL, &sp, &srv, &err);
    if (st != HR_OK) {
        fprintf(stderr, "headroom serve: %s\n", err.msg);
        return st == HR_ERR_INVALID_ARG ? HR_EXIT_USAGE : HR_EXIT_FAIL;
    }
    hr_runtime_params rp = hr_session_runtime_params(&o, kv_seqs);
    rp.mem_limit = mem_limit;
    rp.step_log = step_log;
    rp.special_in_content = special_in_content;
    rp.request_bytes = sp.max_parse_bytes; /* the server's parse bound is part of the plan */
    hr_runtime *rt = NULL;
    bool bad_option = false;
    st = hr_runtime_open(&rp, &rt, &bad_option, &err);
    hr_serve_cluster *cl = st == HR_OK ? hr_serve_cluster_start(&cluster, rt) : NULL;
    if (st == HR_OK && (st = hr_runtime_start(rt, &err)) != HR_OK) bad_option = false;
    if (st != HR_OK) {
        fprintf(stderr, "headroom serve: %s\n", err.msg);
        hr_server_destroy(srv);
        hr_serve_cluster_stop(cl, rt);
        hr_runtime_close(rt);
        return bad_option ? HR_EXIT_USAGE : HR_EXIT_FAIL;
    }
    if (hr_runtime_warnings(rt)[0]) fprintf(stderr, "headroom serve: warning: %s\n", hr_runtime_warnings(rt));
    if (hr_runtime_chat_warning(rt)[0]) fprintf(stderr, "headroom serve: warning: %s\n", hr_runtime_chat_warning(rt));
    hr_server_set_runtime(srv, rt);
    print_banner(rt, &sp, hr_server_port(srv));

    int sig = wait_for_stop(&sigs, srv);
    fprintf(stderr, "headroom serve: %s: draining %d request(s) (up to %.0f s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
            hr_server_n_inflight(srv), sp.drain_timeout_s);
    hr_server_shutdown(srv);
    hr_server_destroy(srv);
    hr_runtime_stop(rt);
    hr_serve_cluster_stop(cl, rt);
    hr_runtime_memory mem;
    hr_runtime_get_memory(rt, &mem);
    hr_runtime_close(rt);
    char peak[32], plan[32];
    fprintf(stderr, "headroom serve: memory: measured peak RSS %s, planned %s (%+.1f%%)\n",
            hr_format_size(mem.peak_rss_bytes, peak, sizeof peak), hr_format_size(mem.planned_bytes, plan, sizeof plan),
            mem.planned_bytes ? 100.0 * ((double)mem.peak_rss_bytes / (double)mem.planned_bytes - 1) : 0.0);
    fprintf(stderr, "headroom serve: stopped\n");
    return HR_EXIT_OK;
}

int hr_cmd_serve(int argc, char **argv) {
    char *keys = NULL;
    int rc = serve(argc, argv, &keys);
    free(keys);
    return rc;
}

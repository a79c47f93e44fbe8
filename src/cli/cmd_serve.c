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
#include <sys/stat.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/errors.h"
#include "cli/options.h"
#include "cli/serve_cluster.h"
#include "cli/session.h"
#include "common/util.h"
#include "runtime/runtime.h"
#include "server/server.h"

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
    hr_rt_device_mem d;
    if (hr_runtime_device_mem(rt, &d)) {
        char tot[32], bud[32], ar[32], dw[32], ds[32], dk[32], rel[32];
        printf("GPU: %s: arena %s of a %s budget (--gpu-util %.2f of %s): weights %s + scratch %s + KV %s; host "
               "copies of the uploaded weights given back: %s\n",
               d.name, hr_format_size(d.arena_bytes, ar, sizeof ar), hr_format_size(d.budget_bytes, bud, sizeof bud),
               d.util, hr_format_size(d.total_bytes, tot, sizeof tot), hr_format_size(d.weight_bytes, dw, sizeof dw),
               hr_format_size(d.scratch_bytes, ds, sizeof ds), hr_format_size(d.kv_bytes, dk, sizeof dk),
               hr_format_size(d.host_released, rel, sizeof rel));
    }
    printf("memory plan%s: weights %s + KV %s + scratch %s + request parsing %s + tables and overhead %s = %s%s%s "
           "(measured RSS now %s)\n",
           d.arena_bytes ? " (host)" : "", hr_format_size(m.weight_bytes, w, sizeof w),
           hr_format_size(m.kv_bytes, k, sizeof k), hr_format_size(m.scratch_bytes, sc, sizeof sc),
           hr_format_size(m.request_bytes, rq, sizeof rq), hr_format_size(m.meta_bytes + m.base_bytes, t, sizeof t),
           hr_format_size(m.planned_bytes, size, sizeof size), p->mem_limit ? " under --mem-limit " : "",
           p->mem_limit ? hr_format_size(p->mem_limit, lim, sizeof lim) : "",
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
    hr_opt_dsts dst = {.p[HR_DST_SESSION] = &o, .p[HR_DST_SERVER] = &sp};
    hr_opts_defaults(HR_CMD_SERVE, &dst);
    sp.api_key = getenv("HEADROOM_API_KEY");
    char *keys = NULL; /* --api-key values joined by commas (mirrored in *keys_out) */
    hr_serve_cluster_opts cluster = {0};
    for (int i = 1; i < argc; i++) {
        const hr_opt *row;
        const char *a = argv[i], *v = NULL;
        bool ok = true;
        switch (hr_opts_parse(HR_CMD_SERVE, "serve", &dst, argc, argv, &i, &row, &v)) {
        case HR_OPT_STORED: continue;
        case HR_OPT_BAD: return HR_EXIT_USAGE; /* the parser printed the problem */
        case HR_OPT_HELP: hr_opts_print_help(HR_CMD_SERVE, stdout); return HR_EXIT_OK;
        case HR_OPT_UNKNOWN:
            if (!hr_serve_cluster_option(&cluster, argc, argv, &i, &ok)) {
                fprintf(stderr, "headroom serve: unknown option '%s' (see headroom serve --help)\n", a);
                ok = false;
            }
            break;
        case HR_OPT_CALLER: { /* --api-key: repeated, a list */
            char *joined = malloc((keys ? strlen(keys) + 1 : 0) + strlen(v) + 1);
            if (joined) sprintf(joined, "%s%s%s", keys ? keys : "", keys ? "," : "", v);
            free(keys);
            sp.api_key = keys = *keys_out = joined;
            ok = joined != NULL;
            break;
        }
        }
        if (!ok) return HR_EXIT_USAGE;
    }
    struct stat mst; /* a directory is a Hugging Face checkpoint: the loader checks what it holds */
    if (o.rt.model_path && !(stat(o.rt.model_path, &mst) == 0 && S_ISDIR(mst.st_mode)) &&
        !hr_arg_regular_file("serve", "-m", o.rt.model_path))
        return HR_EXIT_USAGE;
    hr_error err = {0};
    if (hr_rt_sampling_check(&o.sampling, &err) != HR_OK) {
        fprintf(stderr, "headroom serve: %s\n", HR_CLI_ERROR(&err));
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
        fprintf(stderr, "headroom serve: %s\n", HR_CLI_ERROR(&err));
        return st == HR_ERR_INVALID_ARG ? HR_EXIT_USAGE : HR_EXIT_FAIL;
    }
    hr_runtime_params rp = hr_session_runtime_params(&o, o.rt.kv_seqs);
    rp.request_bytes = sp.max_parse_bytes; /* the server's parse bound is part of the plan */
    hr_runtime *rt = NULL;
    bool bad_option = false;
    st = hr_runtime_open(&rp, &rt, &bad_option, &err);
    hr_serve_cluster *cl = st == HR_OK ? hr_serve_cluster_start(&cluster, rt) : NULL;
    if (st == HR_OK && (st = hr_runtime_start(rt, &err)) != HR_OK) bad_option = false;
    if (st != HR_OK) {
        fprintf(stderr, "headroom serve: %s\n", HR_CLI_ERROR(&err));
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

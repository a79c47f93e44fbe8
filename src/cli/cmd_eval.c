/* cmd_eval.c: `headroom eval`: what a KV format does to quality, on the user's own text. The flags
 * and the printing are here; the method (chunks, the f32 reference, policy arms, the sums) is the eval
 * module's (src/eval/eval.h), which runs on the runtime. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/errors.h"
#include "cli/options.h"
#include "common/util.h"
#include "eval/eval.h"

_Static_assert(HR_EVAL_MAX_POLICY_ARGS <= HR_EVAL_MAX_POLICIES, "eval takes every --policy flag the CLI parses");

/* Progress on stderr. On a terminal one line rewritten in place per chunk; otherwise (a log file, a
 * pipe, CI) whole lines: one at start, one at least every PROGRESS_EVERY_S seconds while a long chunk
 * or many formats run, and one at the end, so that a long eval is never silent. */
#define PROGRESS_EVERY_S 5.0

typedef struct progress {
    bool tty, quiet;
    int n_chunks, n_arms; /* arms including the f32 reference */
    int chunk;            /* the chunk running now */
    double t0, last;
} progress;

static void progress_start(progress *p, size_t n_tok, int n_ctx) {
    p->t0 = p->last = hr_time_now();
    if (p->quiet || p->tty) return;
    fprintf(stderr, "headroom eval: %zu tokens, %d chunks of %d, %d caches each (f32 reference included)\n", n_tok,
            p->n_chunks, n_ctx, p->n_arms);
}

/* After arm i_arm (0-based) of chunk `c` (0-based) ran. */
static void progress_note(progress *p, int c, int i_arm, const char *label) {
    if (p->quiet) return;
    double now = hr_time_now();
    if (p->tty || now - p->last < PROGRESS_EVERY_S) return;
    p->last = now;
    fprintf(stderr, "headroom eval: chunk %d/%d, cache %d/%d (%s) done, %.0f s elapsed\n", c + 1, p->n_chunks,
            i_arm + 1, p->n_arms, label, now - p->t0);
}

/* hr_eval_run_chunk's callback: arm i_arm of the chunk running now is done. */
static void progress_arm(void *ctx, int i_arm, const char *label) {
    progress *p = ctx;
    progress_note(p, p->chunk, i_arm, label);
}

/* After every arm ran chunk c. */
static void progress_chunk(const progress *p, int c) {
    if (!p->quiet && p->tty) fprintf(stderr, "\rchunk %d/%d", c + 1, p->n_chunks);
}

static void progress_end(progress *p) {
    if (p->quiet) return;
    if (p->tty)
        fprintf(stderr, "\n");
    else
        fprintf(stderr, "headroom eval: %d/%d chunks done in %.1f s\n", p->n_chunks, p->n_chunks,
                hr_time_now() - p->t0);
}

int hr_cmd_eval(int argc, char **argv) {
    hr_eval_cli_opts eo = {0};
    hr_opt_dsts dst = {.p[HR_DST_EVAL] = &eo};
    hr_opts_defaults(HR_CMD_EVAL, &dst);
    const char *text_path = NULL;
    for (int i = 1; i < argc; i++) {
        const hr_opt *row;
        const char *a = argv[i], *v;
        switch (hr_opts_parse(HR_CMD_EVAL, "eval", &dst, argc, argv, &i, &row, &v)) {
        case HR_OPT_STORED: continue;
        case HR_OPT_CALLER: continue; /* eval has no such row */
        case HR_OPT_BAD: return HR_EXIT_USAGE;
        case HR_OPT_HELP: hr_opts_print_help(HR_CMD_EVAL, stdout); return HR_EXIT_OK;
        case HR_OPT_UNKNOWN: break;
        }
        if (a[0] == '-' && a[1]) {
            fprintf(stderr, "headroom eval: unknown option '%s' (see headroom eval --help)\n", a);
            return HR_EXIT_USAGE;
        } else if (!text_path) {
            text_path = a;
        } else {
            fprintf(stderr, "headroom eval: more than one text file ('%s' and '%s')\n", text_path, a);
            return HR_EXIT_USAGE;
        }
    }
    const char *model_path = eo.model_path;
    bool json = eo.json, quiet = eo.quiet;
    int n_ctx = eo.n_ctx;
    if (!model_path || !text_path) {
        fprintf(stderr, "headroom eval: needs -m FILE.gguf and a TEXT_FILE (see headroom eval --help)\n");
        return HR_EXIT_USAGE;
    }
    hr_error err = {0};
    hr_eval_params ep = {.model_path = model_path,
                         .formats = eo.formats,
                         .policies = eo.policy_args,
                         .n_policies = eo.n_policy_args,
                         .n_ctx = n_ctx,
                         .max_chunks = eo.max_chunks,
                         .block_size = eo.block_size,
                         .n_threads = eo.n_threads,
                         .device = eo.device};
    hr_eval *ev = NULL;
    if (hr_eval_create(&ep, &ev, &err)) {
        fprintf(stderr, "headroom eval: %s\n", HR_CLI_ERROR(&err));
        return HR_EXIT_USAGE;
    }
    if (!hr_arg_regular_file("eval", "TEXT_FILE", text_path)) {
        hr_eval_destroy(ev);
        return HR_EXIT_FAIL;
    }
    bool bad_option = false;
    if (hr_eval_open(ev, text_path, &bad_option, &err)) {
        fprintf(stderr, "headroom eval: %s\n", HR_CLI_ERROR(&err));
        hr_eval_destroy(ev);
        return bad_option ? HR_EXIT_USAGE : HR_EXIT_FAIL;
    }
    int n_chunks = hr_eval_n_chunks(ev), n_arms = hr_eval_n_arms(ev) - 1;
    progress prog = {
        .tty = isatty(2), .quiet = quiet || (json && isatty(2)), .n_chunks = n_chunks, .n_arms = n_arms + 1};
    progress_start(&prog, hr_eval_n_tokens(ev), n_ctx);
    for (int c = 0; c < n_chunks; c++) {
        prog.chunk = c;
        if (hr_eval_run_chunk(ev, c, progress_arm, &prog, &err)) {
            fprintf(stderr, "headroom eval: %s\n", HR_CLI_ERROR(&err));
            hr_eval_destroy(ev);
            return HR_EXIT_FAIL;
        }
        progress_chunk(&prog, c);
    }
    progress_end(&prog);
    hr_eval_arm ref;
    hr_eval_get_arm(ev, 0, &ref);
    double ref_ppl = exp(ref.nll / (double)ref.n);
    if (json) {
        json_t *root = json_object(), *res = json_array();
        json_object_set_new(root, "model", json_string(hr_eval_model_name(ev)));
        json_object_set_new(root, "text", json_string(text_path));
        json_object_set_new(root, "chunk_tokens", json_integer(n_ctx));
        json_object_set_new(root, "chunks", json_integer(n_chunks));
        json_object_set_new(root, "tokens_scored", json_integer(ref.n));
        json_object_set_new(root, "perplexity_f32", json_real(ref_ppl));
        for (int i = 0; i <= n_arms; i++) {
            hr_eval_arm a;
            hr_eval_get_arm(ev, i, &a);
            json_t *o = json_object();
            json_object_set_new(o, "kv_type", json_string(i == 0 ? "f32" : a.label));
            json_object_set_new(o, "kv_type_k", json_string(a.k_format));
            json_object_set_new(o, "kv_type_v", json_string(a.v_format));
            json_object_set_new(o, "policy", json_string(a.policy));
            if (a.error[0]) {
                json_object_set_new(o, "error", json_string(a.why ? HR_CLI_ERROR(a.why) : a.error));
            } else {
                double ppl = exp(a.nll / (double)a.n);
                json_object_set_new(o, "perplexity", json_real(ppl));
                json_object_set_new(o, "perplexity_change_pct", json_real(100.0 * (ppl / ref_ppl - 1.0)));
                json_object_set_new(o, "kl_mean", json_real(i == 0 ? 0.0 : a.kl / (double)a.n));
                json_object_set_new(o, "top1_agreement", json_real(i == 0 ? 1.0 : (double)a.agree / (double)a.n));
                json_object_set_new(o, "kv_bytes_per_token", json_real(a.kv_bytes_per_token));
                json_object_set_new(o, "kv_bytes_per_seq", json_integer((json_int_t)a.seq_bytes));
                json_object_set_new(o, "tokens_kept", json_integer(a.kept));
            }
            json_array_append_new(res, o);
        }
        json_object_set_new(root, "results", res);
        char *s = json_dumps(root, JSON_INDENT(1));
        printf("%s\n", s);
        free(s);
        json_decref(root);
    } else {
        printf("%s: %d chunks of %d tokens, %ld tokens scored\n", text_path, n_chunks, n_ctx, ref.n);
        printf("%-12s %-20s %12s %10s %6s %11s %9s %11s %10s\n", "kv type", "policy", "bytes/token", "bytes/seq",
               "kept", "perplexity", "change", "mean KL", "top-1 agree");
        for (int i = 0; i <= n_arms; i++) {
            hr_eval_arm a;
            hr_eval_get_arm(ev, i, &a);
            if (a.error[0]) {
                printf("%-12s %-20s unavailable: %s\n", a.label, a.policy, a.why ? HR_CLI_ERROR(a.why) : a.error);
                continue;
            }
            double ppl = exp(a.nll / (double)a.n);
            printf("%-12s %-20s %12.1f %10llu %6d %11.4f %+8.2f%% %11.6f %9.2f%%\n", a.label, a.policy,
                   a.kv_bytes_per_token, (unsigned long long)a.seq_bytes, a.kept, ppl, 100.0 * (ppl / ref_ppl - 1.0),
                   i == 0 ? 0.0 : a.kl / (double)a.n, i == 0 ? 100.0 : 100.0 * (double)a.agree / (double)a.n);
        }
    }
    hr_eval_destroy(ev);
    return HR_EXIT_OK;
}

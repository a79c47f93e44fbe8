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
#include "common/util.h"
#include "eval/eval.h"

#define MAX_POLICIES HR_EVAL_MAX_POLICIES

static void usage(FILE *f) {
    fprintf(f, "usage: headroom eval -m FILE.gguf [--kv-type LIST] [options] TEXT_FILE\n\n"
               "Measures what each KV cache format does to quality on TEXT_FILE, against an f32 cache.\n"
               "Scoring: chunks of --ctx tokens, the first replaced by BOS, the second half of each chunk\n"
               "scored (the method of llama.cpp's perplexity tool, so figures compare with its own).\n\n"
               "  -m FILE          GGUF model\n"
               "  --kv-type LIST   formats to measure, comma-separated: f32, f16, bf16, q8, q4, fp8, kivi2, q4h;\n"
               "                   K/V for different K and V formats (e.g. q4/f16); 'all' for every format\n"
               "                   (default: f16,q8)\n"
               "  -c, --ctx N      chunk length in tokens (default 256, at most the model's trained context:\n"
               "                   positions past it are out of distribution for RoPE)\n"
               "  --chunks N       score at most N chunks (default: the whole text)\n"
               "  --policy P       KV eviction policy to measure; repeat the flag (or separate with ';') for\n"
               "                   several: full, window:W, sinks:S,window:W, h2o:B, snapkv:B[,window:W]\n"
               "                   (default: full). Each format runs under each policy; policy runs score\n"
               "                   the second half of a chunk one token at a time after a first-half prompt\n"
               "  --block-size N   KV block size, 8..256 (default 16); a format listed in --kv-type that the\n"
               "                   model's head size cannot use with it is a startup error naming both ('all'\n"
               "                   lists such a format as unavailable instead)\n"
               "  -t, --threads N  worker threads, 1..1024 (default: all cores); more than the online cores\n"
               "                   warns and uses the online cores\n"
               "  --json           one JSON object instead of the table\n"
               "  -q, --quiet      no progress on stderr (default: a line rewritten per chunk on a terminal;\n"
               "                   otherwise one line at start, one at least every 5 s, and one at the end)\n"
               "Output columns: KV bytes per token (all layers, K and V), KV bytes one sequence holds at the\n"
               "end of a chunk (after its policy), the most tokens one layer and KV head keeps then,\n"
               "perplexity, its change against the f32 full-cache run,\n"
               "mean KL divergence from that run (nats), top-1 agreement with it.\n"
               "TEXT_FILE must be a regular file (a directory is an error).\n\n" HR_EXIT_HELP);
}

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
    const char *model_path = NULL, *text_path = NULL, *formats = "f16,q8";
    int n_ctx = 256, max_chunks = 0, block_size = 16, n_threads = 0;
    bool json = false, quiet = false;
    char *policy_args[MAX_POLICIES];
    int n_policy_args = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return HR_EXIT_OK;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = true;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(model_path = hr_arg_value("eval", argc, argv, &i))) return HR_EXIT_USAGE;
        } else if (!strcmp(a, "--policy")) {
            if (!(v = hr_arg_value("eval", argc, argv, &i))) return HR_EXIT_USAGE;
            if (n_policy_args == MAX_POLICIES) {
                fprintf(stderr, "headroom eval: at most %d --policy flags\n", MAX_POLICIES);
                return HR_EXIT_USAGE;
            }
            policy_args[n_policy_args++] = (char *)v;
        } else if (!strcmp(a, "--kv-type")) {
            if (!(formats = hr_arg_value("eval", argc, argv, &i))) return HR_EXIT_USAGE;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) {
            if (!(v = hr_arg_value("eval", argc, argv, &i)) || !hr_arg_int("eval", a, v, 8, 1 << 20, &n_ctx))
                return HR_EXIT_USAGE;
        } else if (!strcmp(a, "--chunks")) {
            if (!(v = hr_arg_value("eval", argc, argv, &i)) || !hr_arg_int("eval", a, v, 1, 1 << 30, &max_chunks))
                return HR_EXIT_USAGE;
        } else if (!strcmp(a, "--block-size")) {
            if (!(v = hr_arg_value("eval", argc, argv, &i)) || !hr_arg_int("eval", a, v, 8, 256, &block_size))
                return HR_EXIT_USAGE;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!(v = hr_arg_value("eval", argc, argv, &i)) || !hr_arg_int("eval", a, v, 1, 1024, &n_threads))
                return HR_EXIT_USAGE;
            n_threads = hr_arg_threads_cap("eval", n_threads);
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "headroom eval: unknown option '%s' (see headroom eval --help)\n", a);
            return HR_EXIT_USAGE;
        } else if (!text_path) {
            text_path = a;
        } else {
            fprintf(stderr, "headroom eval: more than one text file ('%s' and '%s')\n", text_path, a);
            return HR_EXIT_USAGE;
        }
    }
    if (!model_path || !text_path) {
        fprintf(stderr, "headroom eval: needs -m FILE.gguf and a TEXT_FILE (see headroom eval --help)\n");
        return HR_EXIT_USAGE;
    }
    hr_error err = {0};
    hr_eval_params ep = {.model_path = model_path,
                         .formats = formats,
                         .policies = (const char *const *)policy_args,
                         .n_policies = n_policy_args,
                         .n_ctx = n_ctx,
                         .max_chunks = max_chunks,
                         .block_size = block_size,
                         .n_threads = n_threads};
    hr_eval *ev = NULL;
    if (hr_eval_create(&ep, &ev, &err)) {
        fprintf(stderr, "headroom eval: %s\n", err.msg);
        return HR_EXIT_USAGE;
    }
    if (!hr_arg_regular_file("eval", "TEXT_FILE", text_path)) {
        hr_eval_destroy(ev);
        return HR_EXIT_FAIL;
    }
    bool bad_option = false;
    if (hr_eval_open(ev, text_path, &bad_option, &err)) {
        fprintf(stderr, "headroom eval: %s\n", err.msg);
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
            fprintf(stderr, "headroom eval: %s\n", err.msg);
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
                json_object_set_new(o, "error", json_string(a.error));
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
                printf("%-12s %-20s unavailable: %s\n", a.label, a.policy, a.error);
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

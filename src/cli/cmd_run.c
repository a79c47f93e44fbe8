/* cmd_run.c: `headroom run`: load a model (or the built-in demo) and run one or many prompts through
 * the engine (continuous batching over the paged KV cache, chunked prefill, admission by bytes,
 * preemption). One prompt streams its text to stdout; several run concurrently and print in input
 * order. Statistics go to stderr, or everything into one JSON object with --json. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/errors.h"
#include "cli/options.h"
#include "cli/session.h"
#include "common/util.h"

/* The prompts of one run: -p values (borrowed from argv) and --prompts file lines (owned). */
typedef struct prompt_list {
    const char **v;
    char **owned;
    int n, n_owned, cap;
} prompt_list;

static bool prompts_add(prompt_list *l, const char *p, bool owned) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 8;
        const char **v = realloc(l->v, sizeof *v * (size_t)cap);
        char **o = realloc(l->owned, sizeof *o * (size_t)cap);
        if (v) l->v = v;
        if (o) l->owned = o;
        if (!v || !o) return false;
        l->cap = cap;
    }
    l->v[l->n++] = p;
    if (owned) l->owned[l->n_owned++] = (char *)p;
    return true;
}

static void prompts_free(prompt_list *l) {
    for (int i = 0; i < l->n_owned; i++) free(l->owned[i]);
    free(l->owned);
    free(l->v);
}

/* Reads one prompt per line (CR/LF stripped, blank lines skipped). */
static bool prompts_read_file(prompt_list *l, const char *path) {
    if (!hr_arg_regular_file("run", "--prompts", path)) return false;
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "headroom run: --prompts %s: cannot open it\n", path);
        return false;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    bool ok = true;
    while (ok && (n = getline(&line, &cap, f)) >= 0) {
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
        if (n == 0) continue;
        char *dup = strdup(line);
        ok = dup && prompts_add(l, dup, true);
        if (!ok) free(dup);
    }
    free(line);
    fclose(f);
    if (!ok) fprintf(stderr, "headroom run: --prompts %s: out of memory\n", path);
    return ok;
}

static void print_json(json_t *root) {
    char *text = json_dumps(root, JSON_COMPACT | JSON_ENSURE_ASCII);
    printf("%s\n", text ? text : "{}");
    free(text);
    json_decref(root);
}

/* Prints the results of several prompts in input order; returns the number that did not complete. */
static int print_many(hr_session *s, hr_generation *g, int n, double seconds, bool json) {
    int bad = 0;
    for (int i = 0; i < n; i++) bad += g[i].status != HR_OK;
    if (json) {
        json_t *root = json_object(), *arr = json_array();
        for (int i = 0; i < n; i++) json_array_append_new(arr, hr_generation_to_json(s, &g[i]));
        json_object_set_new(root, "results", arr);
        json_object_set_new(root, "engine", hr_session_engine_json(s, seconds));
        hr_runtime_info info;
        hr_runtime_describe(hr_session_runtime(s), &info);
        json_object_set_new(root, "model", json_string(info.model));
        print_json(root);
        return bad;
    }
    /* a header line per prompt: completions may span several lines */
    for (int i = 0; i < n; i++) {
        if (g[i].status != HR_OK) {
            printf("--- [%d/%d] error: %s ---\n", i + 1, n, g[i].error);
            fprintf(stderr, "headroom run: prompt %d/%d: %s\n", i + 1, n, g[i].error);
            continue;
        }
        bool nl = g[i].text_len > 0 && g[i].text[g[i].text_len - 1] == '\n';
        printf("--- [%d/%d] ---\n%.*s%s", i + 1, n, (int)g[i].text_len, g[i].text, nl ? "" : "\n");
    }
    int n_ctx_limited = 0;
    for (int i = 0; i < n; i++) n_ctx_limited += g[i].limit && !strcmp(g[i].limit, "context");
    if (n_ctx_limited)
        fprintf(stderr, "headroom run: %d of %d prompts stopped at the context (--ctx %d), before -n\n", n_ctx_limited,
                n, hr_session_n_ctx(s));
    fflush(stdout);
    hr_session_print_engine_stats(s, g, n, seconds, stderr);
    return bad;
}

int hr_cmd_run(int argc, char **argv) {
    hr_session_opts o = hr_session_default_opts();
    hr_opt_dsts dst = {.p[HR_DST_SESSION] = &o};
    hr_opts_defaults(HR_CMD_RUN, &dst);
    prompt_list pl = {0};
    bool json = false, verbose = false;
    int rc = HR_EXIT_USAGE;
    for (int i = 1; i < argc; i++) {
        const hr_opt *row;
        const char *a = argv[i], *v;
        switch (hr_opts_parse(HR_CMD_RUN, "run", &dst, argc, argv, &i, &row, &v)) {
        case HR_OPT_STORED: continue;
        case HR_OPT_BAD: goto out; /* the parser printed the problem */
        case HR_OPT_HELP:
            hr_opts_print_help(HR_CMD_RUN, stdout);
            rc = HR_EXIT_OK;
            goto out;
        case HR_OPT_UNKNOWN:
            fprintf(stderr, "headroom run: unknown option '%s' (see headroom run --help)\n", a);
            goto out;
        case HR_OPT_CALLER: break;
        }
        if (!strcmp(row->names[0], "--json")) {
            json = true;
        } else if (!strcmp(row->names[0], "-v")) {
            verbose = true;
        } else if (!strcmp(row->names[0], "--prompts")) {
            if (!prompts_read_file(&pl, v)) {
                rc = HR_EXIT_FAIL; /* a file problem, as for -m */
                goto out;
            }
        } else if (!prompts_add(&pl, v, false)) { /* -p */
            goto out;
        }
    }
    if (o.system || o.rt.chat_template) o.chat = true; /* both imply --chat */
    if (pl.n == 0) {
        fprintf(stderr, "headroom run: no prompt: give one with -p TEXT or --prompts FILE (see headroom run --help)\n");
        goto out;
    }
    o.n_prompts_hint = pl.n;
    o.cmd = "run";
    o.warn = stderr;
    hr_error err = {0};
    hr_session *s = NULL;
    bool bad_option = false;
    if (hr_session_open(&o, &s, &bad_option, &err) != HR_OK) {
        fprintf(stderr, "headroom run: %s\n", HR_CLI_ERROR(&err));
        rc = bad_option ? HR_EXIT_USAGE : HR_EXIT_FAIL;
        goto out;
    }
    rc = HR_EXIT_FAIL;
    for (const char *w = hr_session_warning(s); *w;) { /* one line each */
        size_t len = strcspn(w, "\n");
        fprintf(stderr, "headroom run: warning: %.*s\n", (int)len, w);
        w += len + (w[len] == '\n');
    }
    if (!o.rt.model_path && !json)
        fprintf(stderr,
                "headroom: no -m given: using the built-in demo model (tiny, random weights: its text is noise)\n");
    hr_generation *g = calloc((size_t)pl.n, sizeof *g);
    if (!g) {
        fprintf(stderr, "headroom run: out of memory\n");
        hr_session_close(s);
        goto out;
    }
    double t0 = hr_time_now();
    hr_status st = hr_session_generate_many(s, pl.v, pl.n, json || pl.n > 1 ? NULL : stdout, g, &err);
    double seconds = hr_time_now() - t0;
    if (st != HR_OK) {
        fprintf(stderr, "headroom run: %s\n", HR_CLI_ERROR(&err));
    } else if (pl.n > 1) {
        rc = print_many(s, g, pl.n, seconds, json) ? HR_EXIT_FAIL : HR_EXIT_OK;
    } else if (json) {
        json_t *root = hr_generation_to_json(s, &g[0]);
        json_object_set_new(root, "engine", hr_session_engine_json(s, seconds));
        print_json(root);
        rc = HR_EXIT_OK;
    } else {
        printf("\n");
        fflush(stdout);
        hr_generation_print_stats(s, &g[0], stderr);
        rc = HR_EXIT_OK;
    }
    if (verbose && st == HR_OK) hr_session_print_ledger(s, stderr);
    for (int i = 0; i < pl.n; i++) hr_generation_free(&g[i]);
    free(g);
    hr_session_close(s);
out:
    prompts_free(&pl);
    return rc;
}

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
#include "cli/session.h"
#include "common/util.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: headroom run [-m FILE.gguf] -p PROMPT [-p PROMPT ...] [--prompts FILE] [options]\n\n"
            "Generates a completion of each PROMPT. Several prompts run concurrently through the engine and\n"
            "print in input order. Without -m, a built-in tiny demo model with random weights is used (its\n"
            "text is noise; it shows the pipeline works).\n\n"
            "model and prompt:\n"
            "  -m, --model FILE       GGUF model (llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3;\n"
            "                         f32/f16/bf16/q8_0/q4_0/q4_K/q5_K/q6_K)\n"
            "  -p, --prompt TEXT      a prompt (repeatable: all run concurrently)\n"
            "      --prompts FILE     more prompts, one per line (blank lines skipped)\n"
            "      --no-bos           do not prepend the BOS token\n"
            "      --chat             treat each prompt as a user message and render it with the model's chat\n"
            "                         template (tokenizer.chat_template, run by the Jinja interpreter; one it\n"
            "                         refuses warns and uses the family recognized from it, else chatml)\n"
            "      --system TEXT      a system message before the user's (implies --chat)\n"
            "      --chat-template NAME  use this template family instead of the model's own (implies --chat):\n"
            "                         chatml, llama2, llama3, mistral, mistral-v1, phi3, gemma, zephyr, deepseek\n"
            "generation:\n"
            "  -n, --n-predict N      tokens to generate (default 128)\n"
            "      --temp T           temperature, 0 = greedy (default 0.8)\n"
            "      --top-k K          (default 40, 0 = off)\n"
            "      --top-p P          (default 0.95, 1 = off)\n"
            "      --min-p P          (default 0.05, 0 = off)\n"
            "      --repeat-penalty X (default 1.0 = off)\n"
            "      --presence-penalty X, --frequency-penalty X (default 0)\n"
            "      --repeat-last-n N  tokens the penalties look back over (default 64)\n"
            "      --seed S           sampler seed (default 0); same seed, same output. With several prompts,\n"
            "                         prompt 1 uses S and prompt i > 1 splitmix64(S ^ splitmix64(i - 1)) >> 1, so\n"
            "                         repeats of one prompt differ (--json reports each prompt's \"seed\")\n"
            "      --stop TEXT        stop when TEXT appears (repeatable; TEXT is not printed)\n"
            "      --ignore-eos       keep generating past end-of-generation tokens\n"
            "cache and compute:\n"
            "  -c, --ctx N            context length (default: the model's, at most 4096). Prompt + -n must fit:\n"
            "                         a longer -n is clamped (a warning; finish \"length\", limit \"context\").\n"
            "                         Above the model's trained context it needs --ctx-extend\n"
            "      --ctx-extend       allow --ctx past the trained context: positions past it are out of\n"
            "                         distribution for RoPE and quality degrades (docs/POLICIES.md); a\n"
            "                         window policy (--kv-policy window:W) runs past the context without that\n"
            "      --kv-budget SIZE   KV pool size > 0, e.g. 256MiB; allocated once, never grows (default, when\n"
            "                         omitted: one --ctx sequence per prompt that can run at once)\n"
            "      --kv-type F        KV format for K and V: f32, f16, bf16, q8, q4, fp8, kivi2, q4h (default f16)\n"
            "      --kv-type-k F, --kv-type-v F  the format of K or V alone\n"
            "      --kv-policy P      what stays resident: full (default), window:W, sinks:S,window:W,\n"
            "                         h2o:B, snapkv:B (docs/POLICIES.md); a model's own sliding window\n"
            "                         (Mistral; Gemma's window layers) always applies\n"
            "      --block-size N     tokens per KV block, 8..256 (default 16); a --kv-type the model's head\n"
            "                         size cannot use with it is a startup error naming both\n"
            "      --kv-layout L      paged (blocks on demand, prefix sharing; default) or contiguous (each\n"
            "                         sequence reserves --ctx slots up front, like llama.cpp slots)\n"
            "engine (continuous batching):\n"
            "  -b, --max-batch-tokens N  tokens per engine step, decodes and prefill chunks mixed (default 512;\n"
            "                         --batch is the same flag)\n"
            "      --prefill-chunk N  most prompt tokens of one sequence per step (default: --max-batch-tokens)\n"
            "      --max-running N    sequences in flight at once (default 64)\n"
            "      --max-queue N      waiting requests before new ones are refused (default 1024)\n"
            "      --admission M      adaptive (default: reserve prompt + p90 of completion lengths seen),\n"
            "                         reserve (prompt + -n must fit; never preempts), optimistic (prompt must\n"
            "                         fit; preempt when the pool runs out)\n"
            "      --preempt M        recompute (drop blocks, re-prefill later; cached prefix blocks reused),\n"
            "                         swap (move its blocks to the swap tier and back), auto (default: swap when\n"
            "                         moving the bytes is cheaper than recomputing, given a --swap-space)\n"
            "      --swap-space SIZE  swap tier size (an anonymous temp file; default none, or the KV budget\n"
            "                         with --preempt swap)\n"
            "  -t, --threads N        worker threads, 1..1024 (default: all cores); more than the online cores\n"
            "                         warns and uses the online cores\n"
            "      --mmap             map the model file (pages shared with the page cache, read as touched;\n"
            "                         q4_0, q8_0, q4_K, q5_K, q6_K weights then stay in the file's layout)\n"
            "                         instead of reading it at start into private memory backed by 2 MiB\n"
            "                         huge pages where the kernel allows (faster weight streaming)\n"
            "      --isa NAME         force kernels: scalar, avx2, avx512 (default: best available)\n"
            "output:\n"
            "      --json             print one JSON object (completion, token ids and counts, finish_reason and,\n"
            "                         for \"length\", limit: \"max_tokens\" or \"context\", seed, speeds, KV bytes;\n"
            "                         with several prompts a \"results\" array in input order and \"engine\" figures)\n"
            "  -v, --verbose          print the KV ledger after the run\n"
            "One prompt streams its completion to stdout. Several print in input order, each after a header\n"
            "line `--- [i/N] ---` (an error: `--- [i/N] error: MESSAGE ---`).\n"
            "\n" HR_EXIT_HELP);
}

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
    prompt_list pl = {0};
    bool json = false, verbose = false;
    int rc = HR_EXIT_USAGE;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            rc = HR_EXIT_OK;
            goto out;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            verbose = true;
        } else if (!strcmp(a, "--no-bos")) {
            o.no_bos = true;
        } else if (!strcmp(a, "--ignore-eos")) {
            o.ignore_eos = true;
        } else if (!strcmp(a, "--kv-policy")) {
            if (!(o.kv_policy = hr_arg_value("run", argc, argv, &i))) goto out;
            hr_error perr; /* the syntax is checked here (a usage error); the session checks it fits */
            if (hr_rt_policy_parse(o.kv_policy, NULL, 0, &perr) != HR_OK) {
                fprintf(stderr, "headroom run: --kv-policy: %s\n", perr.msg);
                goto out;
            }
        } else if (!strcmp(a, "--chat")) {
            o.chat = true;
        } else if (!strcmp(a, "--system")) {
            if (!(o.system = hr_arg_value("run", argc, argv, &i))) goto out;
            o.chat = true;
        } else if (!strcmp(a, "--chat-template")) {
            if (!(o.chat_template = hr_arg_value("run", argc, argv, &i))) goto out;
            o.chat = true;
        } else if (hr_session_parse_common(&o, "run", argc, argv, &i, &v)) {
            if (!v) goto out; /* the parser printed the problem */
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (!(v = hr_arg_value("run", argc, argv, &i))) goto out;
            if (!prompts_add(&pl, v, false)) goto out;
        } else if (!strcmp(a, "--prompts")) {
            if (!(v = hr_arg_value("run", argc, argv, &i))) goto out;
            if (!prompts_read_file(&pl, v)) {
                rc = HR_EXIT_FAIL; /* a file problem, as for -m */
                goto out;
            }
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            if (!(v = hr_arg_value("run", argc, argv, &i)) || !hr_arg_int("run", a, v, 0, 1 << 24, &o.n_predict))
                goto out;
        } else if (!strcmp(a, "--stop")) {
            if (!(v = hr_arg_value("run", argc, argv, &i))) goto out;
            if (o.n_stop == HR_SESSION_MAX_STOP) {
                fprintf(stderr, "headroom run: at most %d --stop strings\n", HR_SESSION_MAX_STOP);
                goto out;
            }
            if (!*v) {
                fprintf(stderr, "headroom run: --stop needs a non-empty string\n");
                goto out;
            }
            o.stop[o.n_stop++] = v;
        } else {
            fprintf(stderr, "headroom run: unknown option '%s' (see headroom run --help)\n", a);
            goto out;
        }
    }
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
        fprintf(stderr, "headroom run: %s\n", err.msg);
        rc = bad_option ? HR_EXIT_USAGE : HR_EXIT_FAIL;
        goto out;
    }
    rc = HR_EXIT_FAIL;
    for (const char *w = hr_session_warning(s); *w;) { /* one line each */
        size_t len = strcspn(w, "\n");
        fprintf(stderr, "headroom run: warning: %.*s\n", (int)len, w);
        w += len + (w[len] == '\n');
    }
    if (!o.model_path && !json)
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
        fprintf(stderr, "headroom run: %s\n", err.msg);
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

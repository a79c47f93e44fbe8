/* cmd_run.c: `headroom run`: load a model (or the built-in demo), tokenize a prompt, prefill it in
 * chunks through the paged KV cache, then decode token by token with the chosen sampler, streaming
 * text to stdout and statistics to stderr (or one JSON object with --json). */
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
            "usage: headroom run [-m FILE.gguf] -p PROMPT [options]\n\n"
            "Generates a completion of PROMPT. Without -m, a built-in tiny demo model with random weights is\n"
            "used (its text is noise; it shows the pipeline works).\n\n"
            "model and prompt:\n"
            "  -m, --model FILE       GGUF model (llama, mistral, qwen2; f32/f16/bf16/q8_0/q4_0/q4_K/q5_K/q6_K)\n"
            "  -p, --prompt TEXT      the prompt\n"
            "      --no-bos           do not prepend the BOS token\n"
            "generation:\n"
            "  -n, --n-predict N      tokens to generate (default 128)\n"
            "      --temp T           temperature, 0 = greedy (default 0.8)\n"
            "      --top-k K          (default 40, 0 = off)\n"
            "      --top-p P          (default 0.95, 1 = off)\n"
            "      --min-p P          (default 0.05, 0 = off)\n"
            "      --repeat-penalty X (default 1.0 = off)\n"
            "      --presence-penalty X, --frequency-penalty X (default 0)\n"
            "      --repeat-last-n N  tokens the penalties look back over (default 64)\n"
            "      --seed S           sampler seed (default 0); same seed, same output\n"
            "      --stop TEXT        stop when TEXT appears (repeatable; TEXT is not printed)\n"
            "      --ignore-eos       keep generating past end-of-generation tokens\n"
            "cache and compute:\n"
            "  -c, --ctx N            context length (default: the model's, at most 4096)\n"
            "      --kv-budget SIZE   KV pool size, e.g. 256MiB (default: what one --ctx sequence needs)\n"
            "      --kv-type F        KV format for K and V: f32, f16 (default f16)\n"
            "      --block-size N     tokens per KV block, 8..256 (default 16)\n"
            "  -b, --batch N          prompt tokens per forward step (default 512)\n"
            "  -t, --threads N        worker threads (default: all cores)\n"
            "      --isa NAME         force kernels: scalar, avx2, avx512 (default: best available)\n"
            "output:\n"
            "      --json             print one JSON object (completion, token ids and counts, speeds, KV bytes)\n"
            "  -v, --verbose          print the KV ledger after the run\n");
}

int hr_cmd_run(int argc, char **argv) {
    hr_session_opts o = hr_session_default_opts();
    const char *prompt = NULL;
    bool json = false, verbose = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            verbose = true;
        } else if (!strcmp(a, "--no-bos")) {
            o.no_bos = true;
        } else if (!strcmp(a, "--ignore-eos")) {
            o.ignore_eos = true;
        } else if (hr_session_parse_common(&o, "run", argc, argv, &i, &v)) {
            if (!v) return 2; /* the parser printed the problem */
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (!(prompt = hr_arg_value("run", argc, argv, &i))) return 2;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            if (!(v = hr_arg_value("run", argc, argv, &i)) || !hr_arg_int("run", a, v, 0, 1 << 24, &o.n_predict))
                return 2;
        } else if (!strcmp(a, "--stop")) {
            if (!(v = hr_arg_value("run", argc, argv, &i))) return 2;
            if (o.n_stop == HR_SESSION_MAX_STOP) {
                fprintf(stderr, "headroom run: at most %d --stop strings\n", HR_SESSION_MAX_STOP);
                return 2;
            }
            if (!*v) {
                fprintf(stderr, "headroom run: --stop needs a non-empty string\n");
                return 2;
            }
            o.stop[o.n_stop++] = v;
        } else {
            fprintf(stderr, "headroom run: unknown option '%s' (see headroom run --help)\n", a);
            return 2;
        }
    }
    if (!prompt) {
        fprintf(stderr, "headroom run: no prompt: give one with -p TEXT (see headroom run --help)\n");
        return 2;
    }
    hr_error err = {0};
    hr_session *s = NULL;
    if (hr_session_open(&o, &s, &err) != HR_OK) {
        fprintf(stderr, "headroom run: %s\n", err.msg);
        return 1;
    }
    if (!o.model_path && !json) fprintf(stderr, "headroom: no -m given: using the built-in demo model (tiny, random weights: its text is noise)\n");
    hr_generation g;
    hr_status st = hr_session_generate(s, prompt, json ? NULL : stdout, &g, &err);
    if (st != HR_OK) {
        fprintf(stderr, "headroom run: %s\n", err.msg);
        hr_session_close(s);
        return 1;
    }
    if (json) {
        json_t *root = hr_generation_to_json(s, &g);
        char *text = json_dumps(root, JSON_COMPACT | JSON_ENSURE_ASCII);
        printf("%s\n", text ? text : "{}");
        free(text);
        json_decref(root);
    } else {
        printf("\n");
        fflush(stdout);
        hr_generation_print_stats(s, &g, stderr);
    }
    if (verbose) hr_session_print_ledger(s, stderr);
    hr_generation_free(&g);
    hr_session_close(s);
    return 0;
}

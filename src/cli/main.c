/* main.c: `headroom <command> [options]`: dispatches to the subcommands in commands.h; `headroom
 * --version` (or `headroom version`) prints the version and the kernels this CPU selects. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "cli/commands.h"

#ifndef HR_VERSION
#define HR_VERSION "unknown" /* CMakeLists.txt defines it */
#endif

static void usage(FILE *f) {
    fprintf(f, "usage: headroom <command> [options]\n\n"
               "commands:\n"
               "  run       generate text from a prompt (built-in demo model when no -m is given)\n"
               "  synth     write a deterministic random-weight model of a real shape\n"
               "  tokenize  print a prompt's token ids and pieces\n"
               "  eval      perplexity and agreement of KV formats on a text file\n"
               "  serve     an OpenAI-compatible HTTP server (completions, chat, KV accounting, metrics)\n"
               "  top       a live terminal view of a server's KV cache and requests\n"
               "  bench     replay a traffic pattern against an OpenAI-compatible server and report\n"
               "  plan      the memory budget for a model and device, and a configuration for a traffic\n"
               "  version   the version and the kernels this CPU selects (also --version)\n\n"
               "`headroom <command> --help` describes each command's options.\n" HR_EXIT_HELP);
}

int hr_cmd_version(int argc, char **argv) {
    if (argc > 1) {
        bool help = argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"));
        if (!help) {
            fprintf(stderr, "headroom version: unknown option '%s' (it takes none)\n", argv[1]);
            return HR_EXIT_USAGE;
        }
        printf("usage: headroom version (or headroom --version)\n\n"
               "Prints the version, the kernels chosen for this CPU (what --isa picks by default), the CPU\n"
               "features they were chosen from, and the ISA each weight type's kernels use.\n\n" HR_EXIT_HELP);
        return HR_EXIT_OK;
    }
    hr_cpu_features f = hr_cpu_detect();
    hr_kernels k;
    hr_kernels_init(&k, f, NULL);
    const struct {
        const char *name;
        bool on;
    } feats[] = {{"avx2", f.avx2},
                 {"fma", f.fma},
                 {"f16c", f.f16c},
                 {"avx512f", f.avx512f},
                 {"avx512bw", f.avx512bw},
                 {"avx512vl", f.avx512vl},
                 {"avx512vnni", f.avx512vnni},
                 {"avxvnni", f.avxvnni}};
    char list[256] = "";
    size_t n = 0;
    for (size_t i = 0; i < sizeof feats / sizeof feats[0] && n < sizeof list; i++)
        if (feats[i].on) n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", n ? " " : "", feats[i].name);
    char per_type[512];
    hr_kernels_describe(&k, per_type, sizeof per_type);
    printf("headroom %s\n", HR_VERSION);
    printf("kernels: %s (cpu features: %s)\n", k.isa, n ? list : "none of avx2, fma, f16c, avx512");
    printf("weight types: %s\n", per_type);
    return fflush(stdout) == 0 ? HR_EXIT_OK : HR_EXIT_FAIL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return HR_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return HR_EXIT_OK;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V") || !strcmp(cmd, "version"))
        return hr_cmd_version(argc - 1, argv + 1);
    if (!strcmp(cmd, "run")) return hr_cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "synth")) return hr_cmd_synth(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return hr_cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return hr_cmd_eval(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return hr_cmd_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "top")) return hr_cmd_top(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return hr_cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan")) return hr_cmd_plan(argc - 1, argv + 1);
    fprintf(stderr, "headroom: unknown command '%s' (see headroom --help)\n", cmd);
    return HR_EXIT_USAGE;
}

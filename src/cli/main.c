/* main.c: `headroom <command> [options]`: dispatches to the subcommands in commands.h. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

static void usage(FILE *f) {
    fprintf(f, "usage: headroom <command> [options]\n\n"
               "commands:\n"
               "  run       generate text from a prompt (built-in demo model when no -m is given)\n"
               "  synth     write a deterministic random-weight model of a real shape\n"
               "  tokenize  print a prompt's token ids and pieces\n"
               "  eval      perplexity and agreement of KV formats on a text file\n\n"
               "`headroom <command> --help` describes each command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "run")) return hr_cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "synth")) return hr_cmd_synth(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return hr_cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return hr_cmd_eval(argc - 1, argv + 1);
    fprintf(stderr, "headroom: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}

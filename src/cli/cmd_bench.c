/* cmd_bench.c: `headroom bench`: a load generator against an OpenAI-compatible server (not yet written). */
#include <stdio.h>

#include "cli/commands.h"

int hr_cmd_bench(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "headroom bench: not available in this build\n");
    return HR_EXIT_FAIL;
}

/* cmd_top.c: `headroom top`: a live terminal view of a server's KV cache (not yet written). */
#include <stdio.h>

#include "cli/commands.h"

int hr_cmd_top(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "headroom top: not available in this build\n");
    return HR_EXIT_FAIL;
}

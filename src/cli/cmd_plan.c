/* cmd_plan.c: `headroom plan`: the memory budget and a recommended configuration (not yet written). */
#include <stdio.h>

#include "cli/commands.h"

int hr_cmd_plan(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "headroom plan: not available in this build\n");
    return HR_EXIT_FAIL;
}

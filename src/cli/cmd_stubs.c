/* cmd_stubs.c: commands not built yet. Each file that implements a command deletes its stub here. */
#include <stdio.h>

#include "cli/commands.h"

int hr_cmd_tokenize(int argc, char **argv) {
    fprintf(stderr, "headroom tokenize: not built yet\n");
    return 1;
}

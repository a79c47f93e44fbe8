/* cmd_stubs.c: commands not built yet. Each file that implements a command deletes its stub here. */
#include <stdio.h>

#include "cli/commands.h"


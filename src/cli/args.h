/* args.h: small helpers for the subcommands' flag parsing: numeric flags with range checks that print
 * one readable line on error. */
#ifndef HR_CLI_ARGS_H
#define HR_CLI_ARGS_H

#include <stdbool.h>
#include <stdint.h>

/* Each returns false after printing "headroom CMD: FLAG expects ..." to stderr. */
bool hr_arg_int(const char *cmd, const char *flag, const char *text, long lo, long hi, int *out);
bool hr_arg_u64(const char *cmd, const char *flag, const char *text, uint64_t *out);
bool hr_arg_float(const char *cmd, const char *flag, const char *text, double lo, double hi, float *out);
bool hr_arg_size(const char *cmd, const char *flag, const char *text, uint64_t *out);

/* Fetches the value after argv[*i] (advancing *i), or prints "FLAG needs a value" and returns NULL. */
const char *hr_arg_value(const char *cmd, int argc, char **argv, int *i);

#endif

/* args.h: small helpers for the subcommands' flag parsing: numeric flags with range checks that print
 * one readable line on error, input files that must be regular files, the thread-count cap and the
 * per-prompt seed. */
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

/* True when path names a regular file that exists. Otherwise prints one line, "headroom CMD: WHAT
 * 'PATH' is a directory, not a file" (or: does not exist, is not a regular file), and returns false:
 * reading a directory would otherwise look like an empty or one-token text. */
bool hr_arg_regular_file(const char *cmd, const char *what, const char *path);

/* Cores online (at least 1). */
int hr_online_cores(void);

/* The thread count to use for `-t n` (0: the default, all cores): n itself, or the online cores with a
 * one-line warning when n exceeds them (more threads than cores only wait on each other). */
int hr_arg_threads_cap(const char *cmd, int n);

/* The sampler seed of prompt i of a run given --seed seed: prompt 0 uses seed itself (so a single
 * prompt means exactly what --seed says); prompt i > 0 uses splitmix64(seed ^ splitmix64(i)) >> 1, so
 * that several samples of one prompt differ, and rerunning that prompt alone with --seed set to this
 * value reproduces it. */
uint64_t hr_prompt_seed(uint64_t seed, int i);

#endif

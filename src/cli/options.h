/* options.h: the one table of command-line options. Each flag of `run`, `serve`, `eval` and `plan` is one
 * row: its names, the commands that take it, its type and range (or the values it accepts), its default,
 * its help and the field it lands in. The commands parse through it and print their --help from it, so
 * adding a flag is the row, the field it fills and the code that uses the field.
 *
 * Invariants (checked by tests/test_cli_options.c): every row has help and a range (numeric rows a
 * min and max, enumerations their values); a row's default, parsed by the row itself, equals the
 * default of the struct it fills (hr_runtime_default_params, hr_server_default_params) where that
 * struct has one; `headroom CMD --help` names exactly the rows of CMD. */
#ifndef HR_CLI_OPTIONS_H
#define HR_CLI_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cli/session.h"
#include "plan/plan.h"
#include "server/server.h"

/* The commands a row belongs to (a bit set). */
enum {
    HR_CMD_RUN = 1u << 0,
    HR_CMD_SERVE = 1u << 1,
    HR_CMD_EVAL = 1u << 2,
    HR_CMD_PLAN = 1u << 3,
};

#define HR_EVAL_MAX_POLICY_ARGS 16

/* eval's flags (cmd_eval.c reads them). */
typedef struct hr_eval_cli_opts {
    const char *model_path, *formats;
    int n_ctx, max_chunks, block_size, n_threads;
    bool json, quiet;
    const char *device;                               /* --device */
    const char *policy_args[HR_EVAL_MAX_POLICY_ARGS]; /* --policy values, in order */
    int n_policy_args;
} hr_eval_cli_opts;

/* plan's flags (cmd_plan.c reads them). */
typedef struct hr_plan_cli_opts {
    const char *model, *weight_type, *device;
    uint64_t device_mem;
    float device_bw, util;
    bool json;
    hr_plan_params p;
    /* traffic simulation */
    const char *traffic, *cost_file, *calibrate_file, *eval_file;
    int n_requests;
    uint64_t seed;
    float slo_ttft, slo_itl, max_ppl;
    int run_list[8], n_run_list;
} hr_plan_cli_opts;

/* The structs a row's field can live in; a command passes those it has (NULL: none). */
typedef enum hr_opt_dst {
    HR_DST_NONE = 0, /* the command handles the flag itself (hr_opts_parse returns HR_OPT_CALLER) */
    HR_DST_SESSION,  /* hr_session_opts: the runtime's parameters (.rt), sampling and the session's own */
    HR_DST_SERVER,   /* hr_server_params */
    HR_DST_EVAL,     /* hr_eval_cli_opts */
    HR_DST_PLAN,     /* hr_plan_cli_opts */
    HR_DST_COUNT
} hr_opt_dst;

typedef enum hr_opt_type {
    HR_OPT_FLAG,      /* no value: sets a bool */
    HR_OPT_INT,       /* int in [min, max] */
    HR_OPT_U64,       /* uint64_t, any non-negative integer */
    HR_OPT_FLOAT,     /* float in [min, max] */
    HR_OPT_DOUBLE,    /* double in [min, max] */
    HR_OPT_SIZE,      /* uint64_t bytes ("256MiB"), in [min, max] */
    HR_OPT_SIZE_T,    /* size_t bytes, in [min, max] */
    HR_OPT_RATE,      /* double bytes per second, written as a size */
    HR_OPT_STR,       /* const char *, borrowed from argv (or the row's default) */
    HR_OPT_ENUM,      /* int: the index of its value in .values, or what .parse_enum says */
    HR_OPT_KV_FORMAT, /* hr_rt_kv_format at .off (and .off2 with HR_OPTF_KV_BOTH) */
    HR_OPT_CUSTOM,    /* .custom checks and stores the value */
} hr_opt_type;

/* Where a row prints in its command's --help (hr_opts_print_help's pages group rows by section). */
typedef enum hr_opt_section {
    HR_SEC_MODEL = 1, /* run: model and prompt */
    HR_SEC_GEN,       /* run: generation; serve: sampling defaults */
    HR_SEC_CACHE,     /* run: cache and compute */
    HR_SEC_ENGINE,    /* run: engine */
    HR_SEC_OUTPUT,    /* run: output */
    HR_SEC_SERVER,    /* serve: server */
    HR_SEC_SERVE_RT,  /* serve: its runtime flags printed in full */
    HR_SEC_MAIN,      /* eval, plan: the flags */
    HR_SEC_SIM,       /* plan: traffic simulation */
} hr_opt_section;

enum {
    HR_OPTF_JOINED = 1u << 0,      /* --help: listed on the previous row's line ("--kv-type-k F, --kv-type-v F") */
    HR_OPTF_INLINE = 1u << 1,      /* --help: named inside the previous row's help text */
    HR_OPTF_OWN_DEFAULT = 1u << 2, /* the default is the command's own, not the runtime's (--kv-seqs 4) */
    HR_OPTF_CORES = 1u << 3,       /* a thread count: capped at the online cores with a warning */
    HR_OPTF_KV_BOTH = 1u << 4,     /* --kv-type: the format goes to .off (K) and .off2 (V) */
};

typedef struct hr_opt hr_opt;
struct hr_opt {
    unsigned cmds;
    const char *names[3]; /* what the user types: "-b", "--max-batch-tokens", "--batch" */
    const char *syn;      /* as --help shows it: "-b, --max-batch-tokens N" */
    hr_opt_type type;
    double min, max;           /* numeric types */
    const char *const *values; /* HR_OPT_ENUM: the accepted words, NULL-terminated (index = value) */
    const int *ids;            /* HR_OPT_ENUM with .values: the value each word stores (NULL: its index) */
    int n_values;              /* or, with .value_name, how many values value_name(0 .. n-1) names */
    const char *(*value_name)(int v);
    hr_status (*parse_enum)(const char *text, int *out, hr_error *err); /* NULL: match .values */
    bool (*custom)(const hr_opt *row, const char *cmd, const char *flag, const char *v, void *dst);
    const char *range; /* range words when the type has none of its own (a STR row's accepted form) */
    const char *bad;   /* a range error's text after "headroom CMD: FLAG " (then ", got 'V'" when
                          bad_got); NULL: the type's own message */
    bool bad_got;
    const char *def; /* the default as the user would type it (NULL: none, or prose in the help) */
    hr_opt_dst dst;
    size_t off, off2;
    hr_opt_section sec;
    unsigned flags;
    const char *help;  /* the help text after the synopsis column; "{default}" is .def; lines after the
                          first are indented to the column */
    const char *brief; /* serve's compact lists: a note after the synopsis ("(429 with Retry-After when full)") */
};

/* The table and its length. */
extern const hr_opt hr_opts[];
extern const int hr_n_opts;

/* The structs one command parses into (unused ones NULL). */
typedef struct hr_opt_dsts {
    void *p[HR_DST_COUNT];
} hr_opt_dsts;

typedef enum hr_opt_result {
    HR_OPT_STORED,  /* the value is in its field */
    HR_OPT_BAD,     /* a missing or bad value: one line printed */
    HR_OPT_HELP,    /* -h or --help */
    HR_OPT_UNKNOWN, /* not a row of this command (nothing printed; argv[*i] untouched) */
    HR_OPT_CALLER,  /* a row the command handles itself: *row and *value are set (value NULL for a flag) */
} hr_opt_result;

/* Parses argv[*i] (and its value, advancing *i) for command cmd (one HR_CMD_* bit, named cmd_name in
 * messages). */
hr_opt_result hr_opts_parse(unsigned cmd, const char *cmd_name, const hr_opt_dsts *d, int argc, char **argv, int *i,
                            const hr_opt **row, const char **value);

/* Stores every default of cmd's rows into their fields (after the structs' own defaults). */
void hr_opts_defaults(unsigned cmd, const hr_opt_dsts *d);

/* The row of cmd that name (any of its names) selects, or NULL. */
const hr_opt *hr_opts_find(unsigned cmd, const char *name);

/* Prints cmd's --help. */
void hr_opts_print_help(unsigned cmd, FILE *f);

/* Stores text into row's field of d as the command would (prints the problem and returns false);
 * tests use it to read a default back. */
bool hr_opts_store(const hr_opt *row, const char *cmd_name, const char *flag, const char *text, const hr_opt_dsts *d);

#endif

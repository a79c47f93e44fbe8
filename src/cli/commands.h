/* commands.h: the CLI's subcommands. Each takes the arguments after its name (argv[0] is the
 * subcommand name), prints its own output and errors, and returns the process exit code. */
#ifndef HR_CLI_COMMANDS_H
#define HR_CLI_COMMANDS_H

/* Exit codes, the same for every command (each --help repeats them). */
enum {
    HR_EXIT_OK = 0,
    HR_EXIT_FAIL = 1,  /* the run failed: a file cannot be read or is not a model, memory, a prompt */
    HR_EXIT_USAGE = 2, /* fix the command line: an unknown flag, a malformed value, or a value this
                          model cannot use (--ctx, --kv-type with --block-size, --kv-policy, ...) */
};

/* The exit-code paragraph every --help ends with. */
#define HR_EXIT_HELP                                                                                                   \
    "exit status: 0 success; 1 the run failed (a file, memory, a prompt); 2 a usage error (fix the flag\n"             \
    "the message names)\n"

int hr_cmd_run(int argc, char **argv);
int hr_cmd_synth(int argc, char **argv);
int hr_cmd_tokenize(int argc, char **argv);
int hr_cmd_eval(int argc, char **argv);
int hr_cmd_serve(int argc, char **argv);
int hr_cmd_version(int argc, char **argv);
int hr_cmd_top(int argc, char **argv);
int hr_cmd_bench(int argc, char **argv);
int hr_cmd_plan(int argc, char **argv);

#endif

/* commands.h: the CLI's subcommands. Each takes the arguments after its name (argv[0] is the
 * subcommand name), prints its own output and errors, and returns the process exit code. */
#ifndef HR_CLI_COMMANDS_H
#define HR_CLI_COMMANDS_H

int hr_cmd_run(int argc, char **argv);
int hr_cmd_synth(int argc, char **argv);
int hr_cmd_tokenize(int argc, char **argv);
int hr_cmd_eval(int argc, char **argv);

#endif

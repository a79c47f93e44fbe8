/* errors.h: the CLI's names for what an error is about. Lower layers say which parameter was at fault
 * (hr_error.param, .also: see common/status.h) in the domain's words; the CLI names the flag that sets
 * it, from this table, never from the message's text. */
#ifndef HR_CLI_ERRORS_H
#define HR_CLI_ERRORS_H

#include <stddef.h>

#include "common/status.h"

/* Room for a message and its flags. */
#define HR_CLI_ERROR_MAX (HR_ERROR_MSG_MAX + 160)

/* The flag that sets param ("--kv-budget"), NULL when no flag does (a request's logit bias). */
const char *hr_cli_param_flag(hr_param param);

/* err's message followed by the flags of the parameters it is about, written into out[cap]:
 * "the KV budget 40.0 KiB holds ... (KV budget: --kv-budget; context length: --ctx)". Returns out. */
const char *hr_cli_error_text(const hr_error *err, char *out, size_t cap);

/* hr_cli_error_text into a buffer that lives until the end of the enclosing block:
 * fprintf(stderr, "headroom run: %s\n", HR_CLI_ERROR(&err)). */
#define HR_CLI_ERROR(err) hr_cli_error_text((err), (char[HR_CLI_ERROR_MAX]){0}, HR_CLI_ERROR_MAX)

#endif

/* errors.c: parameter code -> the CLI flag that sets it (see errors.h). One row per hr_param; the
 * test (test_cli_errors) checks every code has a row and that each flag named is one the CLI accepts. */
#include "cli/errors.h"

#include <stdio.h>

static const char *const k_flags[HR_PARAM_COUNT] = {
    [HR_PARAM_NONE] = NULL,
    [HR_PARAM_KV_BUDGET] = "--kv-budget",
    [HR_PARAM_MEM_LIMIT] = "--mem-limit",
    [HR_PARAM_CONTEXT] = "--ctx",
    [HR_PARAM_CONTEXT_EXTEND] = "--ctx-extend",
    [HR_PARAM_MAX_TOKENS] = "-n",
    [HR_PARAM_PROMPT] = "-p",
    [HR_PARAM_KV_FORMAT] = "--kv-type",
    [HR_PARAM_BLOCK_SIZE] = "--block-size",
    [HR_PARAM_KV_POLICY] = "--kv-policy",
    [HR_PARAM_SWAP_SPACE] = "--swap-space",
    [HR_PARAM_STEP_LOG] = "--step-log",
    [HR_PARAM_TEMPERATURE] = "--temp",
    [HR_PARAM_TOP_P] = "--top-p",
    [HR_PARAM_TOP_K] = "--top-k",
    [HR_PARAM_MIN_P] = "--min-p",
    [HR_PARAM_REPEAT_PENALTY] = "--repeat-penalty",
    [HR_PARAM_PRESENCE_PENALTY] = "--presence-penalty",
    [HR_PARAM_FREQUENCY_PENALTY] = "--frequency-penalty",
    [HR_PARAM_PENALTY_WINDOW] = "--repeat-last-n",
    [HR_PARAM_LOGIT_BIAS] = NULL, /* requests only (the server's logit_bias) */
    [HR_PARAM_STOP] = "--stop",
    [HR_PARAM_CHOICES] = NULL,       /* requests only (the server's n) */
    [HR_PARAM_TOP_LOGPROBS] = NULL,  /* requests only */
    [HR_PARAM_OUTPUT_FORMAT] = NULL, /* requests only (response_format, guided_*) */
    [HR_PARAM_CHAT_TEMPLATE] = "--chat-template",
    [HR_PARAM_MAX_RUNNING] = "--max-running",
    [HR_PARAM_QUEUE] = "--max-queue",
    [HR_PARAM_QUANT_MIX] = "--mix",
};

const char *hr_cli_param_flag(hr_param param) { return (unsigned)param < HR_PARAM_COUNT ? k_flags[param] : NULL; }

const char *hr_cli_error_text(const hr_error *err, char *out, size_t cap) {
    if (cap == 0) return out;
    int n = snprintf(out, cap, "%s", err->msg);
    const hr_param about[2] = {err->param, err->also};
    int named = 0;
    for (int i = 0; i < 2; i++) {
        const char *flag = hr_cli_param_flag(about[i]);
        if (!flag || (i == 1 && about[1] == about[0]) || n < 0 || (size_t)n >= cap) continue;
        n += snprintf(out + n, cap - (size_t)n, "%s%s: %s", named ? "; " : " (", hr_param_name(about[i]), flag);
        named++;
    }
    if (named && n >= 0 && (size_t)n < cap) snprintf(out + n, cap - (size_t)n, ")");
    return out;
}

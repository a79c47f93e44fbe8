/* status.c: error records (see status.h for the contract). */
#include "common/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void set_value(hr_error *err, const char *value) {
    snprintf(err->value, sizeof err->value, "%s", value ? value : "");
    hr_error_oneline(err->value);
}

__attribute__((format(printf, 6, 0))) static hr_status
vset(hr_error *err, hr_status code, hr_param param, hr_param also, const char *value, const char *fmt, va_list ap) {
    if (!err) return code;
    err->code = code;
    err->param = param;
    err->also = also;
    set_value(err, value);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    hr_error_oneline(err->msg);
    return code;
}

hr_status hr_error_set(hr_error *err, hr_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vset(err, code, HR_PARAM_NONE, HR_PARAM_NONE, NULL, fmt, ap);
    va_end(ap);
    return code;
}

hr_status hr_error_set_param(hr_error *err, hr_status code, hr_param param, const char *value, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vset(err, code, param, HR_PARAM_NONE, value, fmt, ap);
    va_end(ap);
    return code;
}

hr_status hr_error_set_params(hr_error *err, hr_status code, hr_param param, hr_param also, const char *value,
                              const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vset(err, code, param, also, value, fmt, ap);
    va_end(ap);
    return code;
}

void hr_error_about(hr_error *err, hr_param param, const char *value) {
    if (!err) return;
    err->param = param;
    set_value(err, value);
}

void hr_error_oneline(char *msg) {
    for (char *c = msg; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7F) *c = '?';
}

void hr_error_prefix(hr_error *err, const char *fmt, ...) {
    if (!err) return;
    char prefix[HR_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char joined[HR_ERROR_MSG_MAX];
    size_t n = strlen(prefix);
    if (n > sizeof joined - 3) n = sizeof joined - 3;
    memcpy(joined, prefix, n);
    joined[n] = ':';
    joined[n + 1] = ' ';
    size_t room = sizeof joined - (n + 2) - 1;
    size_t m = strnlen(err->msg, sizeof err->msg);
    if (m > room) m = room;
    memcpy(joined + n + 2, err->msg, m);
    joined[n + 2 + m] = '\0';
    memcpy(err->msg, joined, sizeof joined);
    hr_error_oneline(err->msg);
}

void hr_error_clear(hr_error *err) {
    if (!err) return;
    err->code = HR_OK;
    err->param = err->also = HR_PARAM_NONE;
    err->value[0] = '\0';
    err->msg[0] = '\0';
}

const char *hr_status_name(hr_status code) {
    switch (code) {
    case HR_OK: return "ok";
    case HR_ERR_IO: return "io";
    case HR_ERR_FORMAT: return "format";
    case HR_ERR_UNSUPPORTED: return "unsupported";
    case HR_ERR_NOMEM: return "nomem";
    case HR_ERR_INVALID_ARG: return "invalid_argument";
    case HR_ERR_RANGE: return "range";
    case HR_ERR_BUDGET: return "budget";
    case HR_ERR_NOT_FOUND: return "not_found";
    case HR_ERR_FULL: return "full";
    case HR_ERR_CANCELLED: return "cancelled";
    case HR_ERR_INTERNAL: return "internal";
    }
    return "unknown";
}

const char *hr_param_name(hr_param param) {
    switch (param) {
    case HR_PARAM_NONE: return "";
    case HR_PARAM_KV_BUDGET: return "KV budget";
    case HR_PARAM_MEM_LIMIT: return "memory limit";
    case HR_PARAM_CONTEXT: return "context length";
    case HR_PARAM_CONTEXT_EXTEND: return "context extension";
    case HR_PARAM_MAX_TOKENS: return "max tokens";
    case HR_PARAM_PROMPT: return "prompt";
    case HR_PARAM_KV_FORMAT: return "KV format";
    case HR_PARAM_BLOCK_SIZE: return "KV block size";
    case HR_PARAM_KV_POLICY: return "KV policy";
    case HR_PARAM_SWAP_SPACE: return "swap space";
    case HR_PARAM_STEP_LOG: return "step log";
    case HR_PARAM_TEMPERATURE: return "temperature";
    case HR_PARAM_TOP_P: return "top-p";
    case HR_PARAM_TOP_K: return "top-k";
    case HR_PARAM_MIN_P: return "min-p";
    case HR_PARAM_REPEAT_PENALTY: return "repeat penalty";
    case HR_PARAM_PRESENCE_PENALTY: return "presence penalty";
    case HR_PARAM_FREQUENCY_PENALTY: return "frequency penalty";
    case HR_PARAM_PENALTY_WINDOW: return "penalty window";
    case HR_PARAM_LOGIT_BIAS: return "logit bias";
    case HR_PARAM_STOP: return "stop strings";
    case HR_PARAM_CHOICES: return "choices";
    case HR_PARAM_TOP_LOGPROBS: return "top logprobs";
    case HR_PARAM_OUTPUT_FORMAT: return "output format";
    case HR_PARAM_CHAT_TEMPLATE: return "chat template";
    case HR_PARAM_MAX_RUNNING: return "running sequences";
    case HR_PARAM_QUEUE: return "waiting queue";
    case HR_PARAM_QUANT_MIX: return "quantization mix";
    case HR_PARAM_COUNT: break;
    }
    return "";
}

/* status.c: error records (see status.h for the contract). */
#include "common/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

hr_status hr_error_set(hr_error *err, hr_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        hr_error_oneline(err->msg);
    }
    return code;
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

/* status.h: status codes and the error record every fallible headroom call fills.
 *
 * Contract used across the code base: a fallible function returns hr_status; on HR_OK it has set its
 * out-parameters, on any other code it has set none of them and (when `err` is not NULL) has written
 * one readable line into err->msg saying what was expected, what was found, and a hint. Library code
 * never prints and never exits; the CLI prints err->msg, the server turns the code into HTTP. */
#ifndef HR_COMMON_STATUS_H
#define HR_COMMON_STATUS_H

#include <stddef.h>

typedef enum hr_status {
    HR_OK = 0,
    HR_ERR_IO = 1,          /* open/read/write/mmap failed */
    HR_ERR_FORMAT = 2,      /* malformed input (file, text, request) */
    HR_ERR_UNSUPPORTED = 3, /* well-formed but not something headroom handles */
    HR_ERR_NOMEM = 4,       /* an allocation failed */
    HR_ERR_INVALID_ARG = 5, /* a caller passed a bad value (flag, option, request field) */
    HR_ERR_RANGE = 6,       /* a value is outside what is allowed (prompt longer than ctx, ...) */
    HR_ERR_BUDGET = 7,      /* the memory budget cannot hold what was asked, now or ever */
    HR_ERR_NOT_FOUND = 8,   /* a key, tensor or name is absent */
    HR_ERR_FULL = 9,        /* a bounded queue or pool is full right now; retry later */
    HR_ERR_CANCELLED = 10,  /* the work was cancelled */
    HR_ERR_INTERNAL = 11,   /* an invariant broke: a bug */
} hr_status;

#define HR_ERROR_MSG_MAX 512

typedef struct hr_error {
    hr_status code;
    char msg[HR_ERROR_MSG_MAX];
} hr_error;

/* Records code and a printf-style message in err (NULL allowed) and returns code, so that
 * `return hr_error_set(err, HR_ERR_FORMAT, "...")` reads naturally. */
hr_status hr_error_set(hr_error *err, hr_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Messages are one line: control characters (a newline in quoted input, say) become '?'.
 * hr_error_set and hr_error_prefix apply it; the server's own error records too. */
void hr_error_oneline(char *msg);

/* Prefixes the message already in err with "prefix: " (for adding context while unwinding). */
void hr_error_prefix(hr_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void hr_error_clear(hr_error *err);

/* Short stable name of a code: "io", "format", "unsupported", ... */
const char *hr_status_name(hr_status code);

#endif

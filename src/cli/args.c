/* args.c: see args.h. */
#include "cli/args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/util.h"

bool hr_arg_int(const char *cmd, const char *flag, const char *text, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        fprintf(stderr, "headroom %s: %s expects an integer in [%ld, %ld], got '%s'\n", cmd, flag, lo, hi, text);
        return false;
    }
    *out = (int)v;
    return true;
}

bool hr_arg_u64(const char *cmd, const char *flag, const char *text, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || *end || text[0] == '-') {
        fprintf(stderr, "headroom %s: %s expects a non-negative integer, got '%s'\n", cmd, flag, text);
        return false;
    }
    *out = v;
    return true;
}

bool hr_arg_float(const char *cmd, const char *flag, const char *text, double lo, double hi, float *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "headroom %s: %s expects a number in [%g, %g], got '%s'\n", cmd, flag, lo, hi, text);
        return false;
    }
    *out = (float)v;
    return true;
}

bool hr_arg_size(const char *cmd, const char *flag, const char *text, uint64_t *out) {
    hr_error err;
    if (hr_parse_size(text, out, &err) != HR_OK) {
        fprintf(stderr, "headroom %s: %s: %s\n", cmd, flag, err.msg);
        return false;
    }
    return true;
}

const char *hr_arg_value(const char *cmd, int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "headroom %s: %s needs a value\n", cmd, argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

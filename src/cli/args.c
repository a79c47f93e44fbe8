/* args.c: see args.h. */
#include "cli/args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

bool hr_arg_regular_file(const char *cmd, const char *what, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "headroom %s: %s '%s': %s\n", cmd, what, path, strerror(errno));
        return false;
    }
    if (S_ISDIR(st.st_mode)) {
        fprintf(stderr, "headroom %s: %s '%s' is a directory, not a file: name a file inside it\n", cmd, what, path);
        return false;
    }
    if (!S_ISREG(st.st_mode)) {
        fprintf(stderr, "headroom %s: %s '%s' is not a regular file (a device, pipe or socket): give a file\n", cmd,
                what, path);
        return false;
    }
    return true;
}

int hr_online_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN); /* what the forward pass uses by default */
    return n < 1 ? 1 : n > 1024 ? 1024 : (int)n;
}

int hr_arg_threads_cap(const char *cmd, int n) {
    int cores = hr_online_cores();
    if (n <= cores) return n;
    fprintf(stderr,
            "headroom %s: warning: -t %d exceeds the %d online cores; using %d threads (more threads than cores only "
            "wait on each other)\n",
            cmd, n, cores, cores);
    return cores;
}

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

uint64_t hr_prompt_seed(uint64_t seed, int i) {
    /* 63 bits: JSON integers are signed, and the value must read back as a --seed */
    return i == 0 ? seed : splitmix64(seed ^ splitmix64((uint64_t)i)) >> 1;
}

/* fuzz_trace.c: libFuzzer target for `headroom bench`'s trace line parser (hr_bench_trace_parse_line,
 * pure: no I/O). The input is one line. Checked: a request line yields a spec inside the documented
 * ranges (max_tokens 1..1000000, a non-empty prompt, t absent (-1) or finite and >= 0); a refusal is
 * HR_ERR_FORMAT or HR_ERR_RANGE with a one-line message; nothing leaks (ASan). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void die(const char *what) {
    fprintf(stderr, "fuzz_trace: %s\n", what);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* an exact-size copy, so a read past the line's end is caught */
    char *line = malloc(size ? size : 1);
    if (!line) return 0;
    memcpy(line, data, size);
    hr_bench_line_kind kind = HR_BENCH_LINE_SKIP;
    hr_bench_spec s;
    hr_error err = {0};
    hr_status st = hr_bench_trace_parse_line(line, size, 7, &kind, &s, &err);
    if (st == HR_OK && kind == HR_BENCH_LINE_REQUEST) {
        if (s.max_tokens < 1 || s.max_tokens > 1000000) die("max_tokens out of range");
        if (!s.prompt || !s.prompt[0]) die("empty prompt accepted");
        if (s.t_s != -1 && !(isfinite(s.t_s) && s.t_s >= 0)) die("t negative or not finite");
        hr_bench_spec_free(&s);
    } else if (st != HR_OK) {
        if (st != HR_ERR_FORMAT && st != HR_ERR_RANGE) die("refusal with an undocumented status");
        if (!err.msg[0] || strchr(err.msg, '\n')) die("refusal message empty or more than one line");
    }
    free(line);
    return 0;
}

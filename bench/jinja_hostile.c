/* jinja_hostile.c: how long a hostile chat template runs before a render limit stops it.
 * Each template below loops 100,000 turns or more doing something expensive (endless nested loops,
 * doubling a string, big outputs, unbounded recursion, searches and comparisons over megabytes,
 * million-item lists, JSON of a 10,000-item list); each must end with HR_ERR_RANGE. Prints, per
 * template, the median of REPS renders at the default limits (jinja.h) in seconds.
 *   build/bench_jinja_hostile [REPS=3] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/jinja.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    static const char *const k_templates[] = {
        "{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}",
        ("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor "
         "%}"),
        "{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "{% set s = 'a' * 3000000 %}{% for i in range(100000) %}{{ 'b' in s }}{% endfor %}",
        "{% set s = 'a' * 1000000 %}{% for i in range(100000) %}{% set t = s.split('a') %}{% endfor %}",
        "{% set s = 'ab' * 1000000 %}{% for i in range(100000) %}{% set t = s|list %}{% endfor %}",
        "{% set l = range(1000000)|list %}{% for i in range(100000) %}{% set t = l + l %}{% endfor %}",
        "{% set l = range(10000)|list %}{% for i in range(100000) %}{{ l|tojson }}{% endfor %}",
        "{% set l = range(100000)|list %}{% for i in range(100000) %}{{ 99999 in l }}{% endfor %}",
        "{% set l = range(100000)|list %}{% for i in range(100000) %}{{ l == l }}{% endfor %}",
    };
    int reps = argc > 1 ? atoi(argv[1]) : 3;
    if (reps < 1 || reps > 100) reps = 3;
    int bad = 0;
    for (size_t k = 0; k < sizeof k_templates / sizeof k_templates[0]; k++) {
        hr_jinja *t = NULL;
        hr_error err = {0};
        if (hr_jinja_parse(k_templates[k], strlen(k_templates[k]), NULL, &t, &err) != HR_OK) {
            fprintf(stderr, "template %zu: %s\n", k, err.msg);
            return 1;
        }
        double times[100];
        hr_status st = HR_OK;
        for (int r = 0; r < reps; r++) {
            char *out = NULL;
            double t0 = now_s();
            st = hr_jinja_render(t, "{}", NULL, &out, NULL, &err);
            times[r] = now_s() - t0;
            free(out);
        }
        qsort(times, (size_t)reps, sizeof times[0], cmp_double);
        printf("%2zu  %.3f s  %s\n", k, times[reps / 2], st == HR_ERR_RANGE ? err.msg : "NOT STOPPED BY A LIMIT");
        bad += st != HR_ERR_RANGE;
        hr_jinja_destroy(t);
    }
    return bad ? 1 : 0;
}

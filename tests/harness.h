/* harness.h: a tiny test harness. A check that fails prints file:line and the expression and makes
 * the test exit 1; HR_SKIP exits 77 (ctest's "skipped") with a reason. Every test ends with
 * hr_test_finish(), which prints "N passed, N failed" and returns the exit code. */
#ifndef HR_TESTS_HARNESS_H
#define HR_TESTS_HARNESS_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

extern int hr_test_passed, hr_test_failed;

#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (cond) {                                                                                                    \
            hr_test_passed++;                                                                                          \
        } else {                                                                                                       \
            hr_test_failed++;                                                                                          \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                                   \
        }                                                                                                              \
    } while (0)

#define CHECKF(cond, ...)                                                                                              \
    do {                                                                                                               \
        if (cond) {                                                                                                    \
            hr_test_passed++;                                                                                          \
        } else {                                                                                                       \
            hr_test_failed++;                                                                                          \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);                                   \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fputc('\n', stderr);                                                                                       \
        }                                                                                                              \
    } while (0)

#define HR_SKIP(...)                                                                                                   \
    do {                                                                                                               \
        fprintf(stdout, "SKIP: ");                                                                                     \
        fprintf(stdout, __VA_ARGS__);                                                                                  \
        fputc('\n', stdout);                                                                                           \
        exit(77);                                                                                                      \
    } while (0)

/* Path to a file under ../shared, or NULL when it is absent. */
const char *hr_test_shared_path(const char *rel);

/* A fresh scratch directory for this test (under the build tree); files go inside it. */
const char *hr_test_tmpdir(void);

/* The whole file as a NUL-terminated malloc'd buffer (length in *n when n is not NULL), or NULL. */
char *hr_test_slurp(const char *path, size_t *n);

/* Runs the built `headroom` with args (a shell-quoted string), stdin from /dev/null. Returns the exit
 * code (128 when it did not exit normally); *out and *err (each may be NULL) receive malloc'd copies
 * of what it printed on stdout and stderr. */
int hr_test_run_cli(const char *args, char **out, char **err);

/* The kernel ISA this run is pinned to: $HEADROOM_ISA ("scalar", "avx2", "avx512"; read here, in
 * the tests, never by the library), or NULL when unset or empty (every ISA the CPU has / the default
 * table). Exits 77 (skipped) when this CPU lacks the named ISA, 2 for an unknown name. */
const char *hr_test_isa(void);
/* A loopback TCP port that was free a moment ago (bound and released), or -1. */
int hr_test_free_port(void);
/* Runs a shell command (popen); returns its exit status (128 when it did not exit) or -1 when it
 * cannot start; *out gets its stdout, NUL-terminated (malloc'd; may be NULL on no memory). */
int hr_test_run_sh(const char *cmd, char **out);

/* GPT-2's byte-level character for byte b, as UTF-8 into out (NUL-terminated): the printable bytes are
 * themselves, the other 68 U+0100.. in order. The tests' own copy of the map, to build vocabularies
 * independently of the tokenizer's. */
void hr_test_gpt2_byte_char(int b, char out[4]);

int hr_test_finish(void);

#endif

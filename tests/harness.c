/* harness.c: see harness.h. */
#include "harness.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int hr_test_passed, hr_test_failed;

const char *hr_test_shared_path(const char *rel) {
    static char buf[8][4096];
    static int next;
    char *p = buf[next++ % 8];
    const char *env = getenv("HR_SHARED_DIR");
    snprintf(p, 4096, "%s/%s", env && *env ? env : HR_SHARED_DIR, rel);
    return access(p, R_OK) == 0 ? p : NULL;
}

const char *hr_test_tmpdir(void) {
    static char dir[4096];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "hr-test-tmp-%d", (int)getpid());
        mkdir(dir, 0700);
    }
    return dir;
}

int hr_test_finish(void) {
    printf("%d passed, %d failed\n", hr_test_passed, hr_test_failed);
    return hr_test_failed ? 1 : (hr_test_passed ? 0 : 1);
}

/* harness.c: see harness.h. */
#include "harness.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/cpu/kernels.h"

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

char *hr_test_slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (!b) {
        fclose(f);
        return NULL;
    }
    size_t got = fread(b, 1, (size_t)len, f);
    b[got] = 0;
    fclose(f);
    if (n) *n = got;
    return b;
}

int hr_test_run_cli(const char *args, char **out, char **err) {
#ifdef HR_HEADROOM_BIN
    static char out_path[4200], err_path[4200];
    snprintf(out_path, sizeof out_path, "%s/cli-stdout", hr_test_tmpdir());
    snprintf(err_path, sizeof err_path, "%s/cli-stderr", hr_test_tmpdir());
    size_t len = strlen(args) + 2 * sizeof out_path + 4096;
    char *cmd = malloc(len);
    if (!cmd) return 128;
    snprintf(cmd, len, "%s %s >%s 2>%s </dev/null", HR_HEADROOM_BIN, args, out_path, err_path);
    int rc = system(cmd);
    free(cmd);
    if (out) *out = hr_test_slurp(out_path, NULL);
    if (err) *err = hr_test_slurp(err_path, NULL);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
#else
    (void)args;
    if (out) *out = NULL;
    if (err) *err = NULL;
    return 128;
#endif
}

const char *hr_test_isa(void) {
    const char *isa = getenv("HEADROOM_ISA");
    if (!isa || !*isa) return NULL;
    if (strcmp(isa, "scalar") && strcmp(isa, "avx2") && strcmp(isa, "avx512")) {
        fprintf(stderr, "HEADROOM_ISA=%s: expected scalar, avx2 or avx512\n", isa);
        exit(2);
    }
    if (!hr_kernels_isa_available(hr_cpu_detect(), isa)) HR_SKIP("HEADROOM_ISA=%s: this CPU does not have it", isa);
    printf("kernels pinned to %s (HEADROOM_ISA)\n", isa);
    return isa;
}

int hr_test_finish(void) {
    printf("%d passed, %d failed\n", hr_test_passed, hr_test_failed);
    return hr_test_failed ? 1 : (hr_test_passed ? 0 : 1);
}

int hr_test_free_port(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    int port = -1;
    if (s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(s, (struct sockaddr *)&a, &n) == 0)
        port = ntohs(a.sin_port);
    if (s >= 0) close(s);
    return port;
}

int hr_test_run_sh(const char *cmd, char **out) {
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (cap - n < 4096) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) break;
            buf = nb;
            cap *= 2;
        }
    }
    if (buf) buf[n] = 0;
    *out = buf;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

void hr_test_gpt2_byte_char(int b, char out[4]) {
    int direct = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    unsigned cp = (unsigned)b;
    if (!direct) {
        int k = 0;
        for (int i = 0; i < b; i++) k += !((i >= 0x21 && i <= 0x7E) || (i >= 0xA1 && i <= 0xAC) || i >= 0xAE);
        cp = 0x100u + (unsigned)k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp, out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = 0;
    }
}

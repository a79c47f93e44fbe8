/* test_readme.c: the README's curl examples, run exactly as printed (every line of README.md that
 * starts with four spaces and "curl "), against `headroom serve` on the shipped demo model at
 * 127.0.0.1:8080 as `make run` starts it. Each must exit 0 and print what it promises (a completion
 * with usage.kv, an SSE stream ending in [DONE], the pool, the metrics) and no error. Skipped when
 * curl is missing or port 8080 is taken. The server is then stopped with SIGTERM and must exit 0. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define MAX_LINES 32

int main(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/README.md", HR_SOURCE_DIR);
    char *readme = hr_test_slurp(path, NULL);
    CHECK(readme != NULL);
    if (!readme) return hr_test_finish();
    char *lines[MAX_LINES];
    int n = 0;
    for (char *save = NULL, *l = strtok_r(readme, "\n", &save); l && n < MAX_LINES; l = strtok_r(NULL, "\n", &save))
        if (!strncmp(l, "    curl ", 9)) lines[n++] = l + 4;
    CHECKF(n >= 4, "the README shows %d curl lines", n);
    char *tmp = NULL;
    if (hr_test_run_sh("command -v curl >/dev/null && echo yes", &tmp) != 0) HR_SKIP("curl is not installed");
    free(tmp);
    if (hr_test_run_sh("curl -s -o /dev/null http://127.0.0.1:8080/health", &tmp) == 0)
        HR_SKIP("something already listens on 127.0.0.1:8080");
    free(tmp);

    char model[1024];
    snprintf(model, sizeof model, "%s/models/stories260K-q8_0.gguf", HR_SOURCE_DIR);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stdout)) _exit(127);
        execl(HR_HEADROOM_BIN, "headroom", "serve", "-m", model, "--host", "127.0.0.1", "--port", "8080", "-t", "1",
              (char *)NULL);
        _exit(127);
    }
    bool up = false;
    for (int i = 0; i < 300 && !up; i++) { /* at most 30 s for the model to load */
        up = hr_test_run_sh("curl -s -o /dev/null -f http://127.0.0.1:8080/health", &tmp) == 0;
        free(tmp);
        if (!up) usleep(100 * 1000);
    }
    CHECKF(up, "the server did not answer /health on 127.0.0.1:8080 within 30 s");
    for (int i = 0; up && i < n; i++) {
        /* exactly as printed: the line goes to sh as it is (its own quoting intact) */
        char *out = NULL;
        int rc = hr_test_run_sh(lines[i], &out);
        CHECKF(rc == 0 && out && out[0], "README line %d exited %d: %s", i + 1, rc, lines[i]);
        if (!out) continue;
        if (!strstr(lines[i], "/metrics")) /* JSON answers: none is an error object */
            CHECKF(!strstr(out, "{\"error\""), "README line %d answered an error: %.300s", i + 1, out);
        if (strstr(lines[i], "/v1/completions") || strstr(lines[i], "/v1/chat/completions")) {
            CHECKF(strstr(out, "\"kv\"") && strstr(out, "\"bytes_peak\""), "line %d: no usage.kv: %.300s", i + 1, out);
            if (strstr(lines[i], "\"stream\": true"))
                CHECKF(strstr(out, "data: [DONE]"), "line %d: the stream did not end with [DONE]", i + 1);
            else
                CHECKF(strstr(out, "\"choices\""), "line %d: no choices: %.300s", i + 1, out);
        }
        if (strstr(lines[i], "/v1/kv")) CHECKF(strstr(out, "\"pool\""), "line %d: %.300s", i + 1, out);
        if (strstr(lines[i], "/metrics")) CHECKF(strstr(out, "headroom_"), "line %d: no headroom_ metrics", i + 1);
        /* the demo model tells stories: a greedy completion of "Once upon a time" is English */
        if (strstr(lines[i], "Once upon a time") && strstr(lines[i], "\"temperature\": 0"))
            CHECKF(strstr(out, "there was"), "line %d: not the story the model tells: %.300s", i + 1, out);
        free(out);
    }
    if (pid > 0) {
        kill(pid, SIGTERM);
        int st = 0;
        for (int i = 0; i < 400; i++) { /* up to 40 s: the drain timeout is 30 s */
            pid_t w = waitpid(pid, &st, WNOHANG);
            if (w == pid) break;
            if (w < 0 && errno != EINTR) break;
            usleep(100 * 1000);
        }
        CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the server did not exit 0 on SIGTERM (status %d)", st);
    }
    free(readme);
    return hr_test_finish();
}

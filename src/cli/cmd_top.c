/* cmd_top.c: `headroom top`: a server's KV cache and requests live in a terminal, for people on a
 * machine over SSH. Fetches /v1/kv with libcurl every second, draws it (top_view.c) with plain ANSI
 * escapes on the alternate screen, and reads keys in raw mode.
 *
 * Invariants:
 *   1. Once the terminal is changed (raw mode, alternate screen, hidden cursor), every way out goes
 *      through restore_terminal: `q`, SIGINT, SIGTERM, SIGHUP, SIGQUIT (taken through a signalfd, so
 *      no handler runs at an arbitrary point and no global flag is needed) and a terminal that is gone.
 *   2. The first fetch decides whether to start: an unreachable server, a refused key or an answer
 *      that is not /v1/kv ends with one line on stderr and exit 1. After that a failure only puts
 *      "disconnected, retrying" above the last picture, and the next tick tries again. */
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/top.h"

#define MAX_ANSWER (256u << 20) /* a /v1/kv answer larger than this is refused (1,000 requests: ~1 MiB) */

static const char *const k_help =
    "usage: headroom top [--url URL] [--api-key K] [--interval S] [--timeout S] [--once]\n\n"
    "A live view of a running `headroom serve` in the terminal: the KV pool as a bar (used, cached,\n"
    "free) with the headroom, the rates of the last minute (requests, prompt and generated tokens per\n"
    "second, time to first token and inter-token latency p50/p99), the newest events (preemptions,\n"
    "evictions, refusals) and the requests sorted by the KV bytes they hold (state, priority, age,\n"
    "tokens, bytes now and at peak, shared-prefix bytes, evicted tokens, K/V format, policy,\n"
    "preemptions), as many as the screen holds. It reads GET URL/v1/kv every second; q (or Ctrl-C)\n"
    "quits. When the server goes away it says \"disconnected, retrying\" and keeps trying.\n\n"
    "      --url URL      the server (default http://127.0.0.1:8080)\n"
    "      --api-key K    the server's --api-key (default: $HEADROOM_API_KEY)\n"
    "      --interval S   seconds between refreshes, 0.2..60 (default 1)\n"
    "      --timeout S    seconds one fetch may take, connecting included, 1..300 (default 5; a\n"
    "                     slow or far server, or a machine under heavy load, may need more)\n"
    "      --once         print one frame (no colours unless stdout is a terminal) and exit\n\n"
    "An unreachable server, a refused key (401) or an answer that is not /v1/kv at start: one line on\n"
    "stderr and exit 1.\n" HR_EXIT_HELP;

typedef struct top {
    CURL *curl;
    struct curl_slist *headers;
    char *kv_url;
    char errbuf[CURL_ERROR_SIZE];
    char *body;
    size_t len, cap;
    bool too_big;
} top;

typedef enum { FETCH_OK, FETCH_UNREACHABLE, FETCH_AUTH, FETCH_HTTP, FETCH_BAD } fetch_result;

static size_t on_body(char *data, size_t size, size_t n, void *user) {
    top *t = user;
    size_t k = size * n;
    if (t->len + k + 1 > MAX_ANSWER) {
        t->too_big = true;
        return 0; /* aborts the transfer */
    }
    if (t->len + k + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 65536;
        while (cap < t->len + k + 1) cap *= 2;
        char *b = realloc(t->body, cap);
        if (!b) return 0;
        t->body = b;
        t->cap = cap;
    }
    memcpy(t->body + t->len, data, k);
    t->len += k;
    t->body[t->len] = '\0';
    return k;
}

static bool top_open(top *t, const char *url, const char *api_key, double timeout_s) {
    size_t n = strlen(url);
    while (n > 0 && url[n - 1] == '/') n--;
    t->kv_url = malloc(n + sizeof "/v1/kv");
    t->curl = curl_easy_init();
    if (!t->kv_url || !t->curl) return false;
    memcpy(t->kv_url, url, n);
    memcpy(t->kv_url + n, "/v1/kv", sizeof "/v1/kv");
    if (api_key && *api_key) {
        char *h = malloc(strlen(api_key) + 32);
        if (!h) return false;
        sprintf(h, "Authorization: Bearer %s", api_key);
        t->headers = curl_slist_append(NULL, h);
        free(h);
        if (!t->headers) return false;
        curl_easy_setopt(t->curl, CURLOPT_HTTPHEADER, t->headers);
    }
    curl_easy_setopt(t->curl, CURLOPT_URL, t->kv_url);
    curl_easy_setopt(t->curl, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(t->curl, CURLOPT_WRITEDATA, t);
    curl_easy_setopt(t->curl, CURLOPT_ERRORBUFFER, t->errbuf);
    const long total_ms = (long)(timeout_s * 1000.0);
    curl_easy_setopt(t->curl, CURLOPT_CONNECTTIMEOUT_MS, total_ms < 2000L ? total_ms : 2000L);
    curl_easy_setopt(t->curl, CURLOPT_TIMEOUT_MS, total_ms);
    curl_easy_setopt(t->curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(t->curl, CURLOPT_PROTOCOLS_STR, "http,https");
    return true;
}

static void top_close(top *t) {
    if (t->curl) curl_easy_cleanup(t->curl);
    curl_slist_free_all(t->headers);
    free(t->kv_url);
    free(t->body);
}

/* One GET of /v1/kv: *out (owned by the caller) on FETCH_OK, else why (one line). */
static fetch_result fetch_kv(top *t, json_t **out, char *why, size_t cap) {
    t->len = 0;
    t->too_big = false;
    t->errbuf[0] = '\0';
    CURLcode rc = curl_easy_perform(t->curl);
    if (rc != CURLE_OK) {
        if (t->too_big) {
            snprintf(why, cap, "%s answered more than %u MiB", t->kv_url, MAX_ANSWER >> 20);
            return FETCH_BAD;
        }
        snprintf(why, cap, "cannot reach %s: %s", t->kv_url, t->errbuf[0] ? t->errbuf : curl_easy_strerror(rc));
        return FETCH_UNREACHABLE;
    }
    long code = 0;
    curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &code);
    if (code == 401) {
        snprintf(why, cap, "%s refused the API key (401): pass the server's key with --api-key or $HEADROOM_API_KEY",
                 t->kv_url);
        return FETCH_AUTH;
    }
    json_error_t je;
    json_t *o = t->len ? json_loadb(t->body, t->len, 0, &je) : NULL;
    if (code != 200) {
        json_t *msg = json_object_get(json_object_get(o, "error"), "message");
        snprintf(why, cap, "%s answered HTTP %ld%s%s", t->kv_url, code, json_is_string(msg) ? ": " : "",
                 json_is_string(msg) ? json_string_value(msg) : "");
        json_decref(o);
        return FETCH_HTTP;
    }
    if (!json_is_object(o) || !json_is_object(json_object_get(o, "pool")) ||
        !json_is_array(json_object_get(o, "requests"))) {
        snprintf(why, cap, "%s is not a headroom server's /v1/kv (no pool and requests in its answer)", t->kv_url);
        json_decref(o);
        return FETCH_BAD;
    }
    *out = o;
    return FETCH_OK;
}

/* ---- the terminal ------------------------------------------------------------------------------ */

typedef struct term {
    struct termios saved;
    bool raw;
    int sfd; /* signalfd for the signals that end or resize */
    sigset_t old_mask;
} term;

static bool write_all(const char *s, size_t n) {
    while (n > 0) {
        ssize_t k = write(STDOUT_FILENO, s, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        s += k;
        n -= (size_t)k;
    }
    return true;
}

static void screen_size(int *cols, int *rows) {
    struct winsize ws;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
        *cols = ws.ws_col;
        *rows = ws.ws_row;
    } else {
        *cols = 100;
        *rows = 30;
    }
}

static bool enter_terminal(term *tm) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGQUIT);
    sigaddset(&set, SIGWINCH);
    if (sigprocmask(SIG_BLOCK, &set, &tm->old_mask) != 0) return false;
    tm->sfd = signalfd(-1, &set, SFD_CLOEXEC);
    if (tm->sfd < 0 || tcgetattr(STDIN_FILENO, &tm->saved) != 0) return false;
    struct termios r = tm->saved;
    r.c_lflag &= (tcflag_t) ~(ICANON | ECHO);
    r.c_cc[VMIN] = 0;
    r.c_cc[VTIME] = 0;
    if (tcsetattr(STDIN_FILENO, TCSANOW, &r) != 0) return false;
    tm->raw = true;
    const char *enter = "\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J"; /* alternate screen, hide the cursor */
    return write_all(enter, strlen(enter));
}

static void restore_terminal(term *tm) {
    if (tm->raw) {
        const char *leave = "\x1b[0m\x1b[?25h\x1b[?1049l";
        write_all(leave, strlen(leave));
        tcsetattr(STDIN_FILENO, TCSANOW, &tm->saved);
        tm->raw = false;
    }
    if (tm->sfd >= 0) close(tm->sfd);
    tm->sfd = -1;
    sigprocmask(SIG_SETMASK, &tm->old_mask, NULL);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static bool draw(const json_t *kv, const char *url, const char *status) {
    hr_top_view v = {.url = url, .color = true, .interactive = true, .status = status};
    screen_size(&v.cols, &v.rows);
    hr_top_frame f = {0};
    hr_top_render(kv, &v, &f);
    bool ok = !f.failed && write_all("\x1b[H", 3) && write_all(f.data, f.len);
    hr_top_frame_free(&f);
    return ok;
}

/* The live loop; returns the exit code. kv: the first answer (taken over). */
static int live(top *t, json_t *kv, const char *url, double interval) {
    term tm = {.sfd = -1};
    if (!enter_terminal(&tm)) {
        restore_terminal(&tm);
        json_decref(kv);
        fprintf(stderr, "headroom top: cannot set up the terminal: %s\n", strerror(errno));
        return HR_EXIT_FAIL;
    }
    char status[600] = "";
    int code = HR_EXIT_OK;
    double next = now_s() + interval;
    for (bool quit = false; !quit;) {
        if (!draw(kv, url, status[0] ? status : NULL)) { /* the terminal is gone */
            code = HR_EXIT_FAIL;
            break;
        }
        for (bool redraw = false; !quit && !redraw;) {
            double wait = next - now_s();
            if (wait <= 0) break;
            struct pollfd pf[2] = {{.fd = STDIN_FILENO, .events = POLLIN}, {.fd = tm.sfd, .events = POLLIN}};
            int n = poll(pf, 2, (int)(wait * 1000) + 1);
            if (n < 0 && errno != EINTR) quit = true;
            if (n <= 0) continue;
            if (pf[0].revents & (POLLHUP | POLLERR)) quit = true;
            if (pf[0].revents & POLLIN) {
                char keys[64];
                ssize_t k = read(STDIN_FILENO, keys, sizeof keys);
                if (k == 0) quit = true; /* end of input */
                for (ssize_t i = 0; i < k; i++)
                    if (keys[i] == 'q' || keys[i] == 'Q') quit = true;
            }
            if (pf[1].revents & POLLIN) {
                struct signalfd_siginfo si;
                if (read(tm.sfd, &si, sizeof si) == (ssize_t)sizeof si) {
                    if (si.ssi_signo == SIGWINCH)
                        redraw = true;
                    else
                        quit = true;
                }
            }
        }
        if (quit || now_s() < next) continue;
        next = now_s() + interval;
        json_t *fresh = NULL;
        char why[512];
        if (fetch_kv(t, &fresh, why, sizeof why) == FETCH_OK) {
            json_decref(kv);
            kv = fresh;
            status[0] = '\0';
        } else {
            snprintf(status, sizeof status, "disconnected, retrying: %s", why);
        }
    }
    restore_terminal(&tm);
    json_decref(kv);
    return code;
}

int hr_cmd_top(int argc, char **argv) {
    const char *url = "http://127.0.0.1:8080", *api_key = getenv("HEADROOM_API_KEY");
    bool once = false;
    float interval = 1, timeout = 5;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(k_help, stdout);
            return HR_EXIT_OK;
        } else if (!strcmp(a, "--url")) {
            if (!(url = hr_arg_value("top", argc, argv, &i))) return HR_EXIT_USAGE;
        } else if (!strcmp(a, "--api-key")) {
            if (!(api_key = hr_arg_value("top", argc, argv, &i))) return HR_EXIT_USAGE;
        } else if (!strcmp(a, "--interval")) {
            const char *v = hr_arg_value("top", argc, argv, &i);
            if (!v || !hr_arg_float("top", "--interval", v, 0.2, 60, &interval)) return HR_EXIT_USAGE;
        } else if (!strcmp(a, "--timeout")) {
            const char *v = hr_arg_value("top", argc, argv, &i);
            if (!v || !hr_arg_float("top", "--timeout", v, 1, 300, &timeout)) return HR_EXIT_USAGE;
        } else if (!strcmp(a, "--once")) {
            once = true;
        } else {
            fprintf(stderr, "headroom top: unknown option '%s' (see headroom top --help)\n", a);
            return HR_EXIT_USAGE;
        }
    }
    if (!*url) {
        fprintf(stderr, "headroom top: --url is empty (e.g. --url http://127.0.0.1:8080)\n");
        return HR_EXIT_USAGE;
    }
    if (!once && (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO))) {
        fprintf(stderr, "headroom top: the live view needs a terminal; use --once for one frame\n");
        return HR_EXIT_USAGE;
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fprintf(stderr, "headroom top: cannot initialize libcurl\n");
        return HR_EXIT_FAIL;
    }
    top t = {0};
    int code = HR_EXIT_FAIL;
    json_t *kv = NULL;
    char why[512];
    if (!top_open(&t, url, api_key, timeout)) {
        fprintf(stderr, "headroom top: out of memory\n");
    } else if (fetch_kv(&t, &kv, why, sizeof why) != FETCH_OK) {
        fprintf(stderr, "headroom top: %s\n", why);
    } else if (once) {
        hr_top_view v = {.url = url, .color = isatty(STDOUT_FILENO) && !getenv("NO_COLOR")};
        if (isatty(STDOUT_FILENO)) screen_size(&v.cols, &v.rows);
        v.rows = 0;
        hr_top_frame f = {0};
        hr_top_render(kv, &v, &f);
        json_decref(kv);
        if (f.failed) {
            fprintf(stderr, "headroom top: out of memory\n");
        } else {
            fwrite(f.data, 1, f.len, stdout);
            code = fflush(stdout) == 0 ? HR_EXIT_OK : HR_EXIT_FAIL;
        }
        hr_top_frame_free(&f);
    } else {
        code = live(&t, kv, url, interval);
    }
    top_close(&t);
    curl_global_cleanup();
    return code;
}

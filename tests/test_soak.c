/* test_soak.c: a bounded soak of `headroom serve` on loopback (in process, the demo model, a pool far
 * too small for the traffic: preemption by swap all the time). Client threads each run
 * HR_SOAK_ROUNDS rounds (default 30; bench/soak.sh runs many more) of a seeded mix: plain and
 * streamed completions, chat, streams dropped after the first chunk, requests abandoned before the
 * answer, malformed JSON, bad fields, prompts past the context, bodies over --max-body, headers over
 * the header limit, requests without the API key (some with an oversized body), and slow clients that
 * stall in their headers or their body until the server's deadlines close them; one more client
 * starts a long stream and never reads it. At the end:
 *   - every request the server accepted is accounted for: finished_total (stop + length + cancelled +
 *     error) plus the 429 refusals equals the valid requests the clients sent; none ended in error;
 *     every complete answer the clients read is a finished stop/length one, and there are no more
 *     cancellations than clients that hung up;
 *   - refusals match the clients' tallies reason by reason (400 invalid, 400 context, 413, 401; 429 at
 *     least those the clients saw); every slow client was closed without an answer;
 *   - the server still answers, and greedy text streamed equals greedy text whole (no SSE chunk lost);
 *     the pool holds no blocks, nothing is left in the swap tier and the
 *     pool's invariants hold;
 *   - RSS after the run is within 32 MiB of RSS after the warm-up round (not in sanitizer builds,
 *     whose allocators keep freed memory in quarantine).
 * Nothing here depends on timing: every wait is bounded, no speed is asserted. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <jansson.h>

#include "harness.h"
#include "runtime/runtime_parts.h"
#include "server/server.h"

#define N_CLIENTS 6
#define MAX_BODY  (64u << 10)

enum { T_OK, T_DROPPED, T_400, T_400_CTX, T_413, T_429, T_431, T_401, T_SLOW, T_OTHER, T_SENT_VALID, T_N };
static const char *const k_tally_names[T_N] = {"ok",  "dropped", "400",         "400-context", "413",       "429",
                                               "431", "401",     "slow-closed", "other",       "sent-valid"};
#define AUTH "Authorization: Bearer soak-key\r\n"

typedef struct client {
    int port, id, rounds;
    long tally[T_N];
    char detail[256]; /* the first unexpected answer */
} client;

static atomic_int g_warm_rounds; /* clients past their warm-up round (test-only state) */

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static int dial(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct timeval tv = {.tv_sec = 120};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static bool write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) return false;
        p += w, n -= (size_t)w;
    }
    return true;
}

/* With the server's key unless auth is false. */
static bool send_req_as(int fd, bool auth, const char *path, const char *extra_headers, const char *body,
                        size_t body_len) {
    static _Thread_local char head[64 << 10]; /* room for the oversized header case */
    int n = snprintf(head, sizeof head,
                     "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n"
                     "%s%sContent-Length: %zu\r\n\r\n",
                     path, auth ? AUTH : "", extra_headers ? extra_headers : "", body_len);
    return write_all(fd, head, (size_t)n) && write_all(fd, body, body_len);
}

static bool send_req(int fd, const char *path, const char *extra_headers, const char *body, size_t body_len) {
    return send_req_as(fd, true, path, extra_headers, body, body_len);
}

/* Reads until EOF (bounded by the socket timeout and cap); returns the status, or 0. *complete: the
 * answer ends as a finished response should (a JSON body with finish_reason, or SSE up to [DONE]). */
static int read_all(int fd, char *buf, size_t cap, bool *complete) {
    size_t len = 0;
    ssize_t r;
    while (len + 1 < cap && (r = read(fd, buf + len, cap - 1 - len)) > 0) len += (size_t)r;
    buf[len] = '\0';
    int status = 0;
    sscanf(buf, "HTTP/1.%*d %d", &status);
    *complete = status == 200 && (strstr(buf, "data: [DONE]") || strstr(buf, "\"finish_reason\": \"") ||
                                  strstr(buf, "\"finish_reason\":\""));
    return status;
}

static void tally_status(client *c, int kind, int status, bool complete, const char *buf) {
    int t = status == 200 && complete ? T_OK
            : status == 400           ? (strstr(buf, "context_length_exceeded") ? T_400_CTX : T_400)
            : status == 413           ? T_413
            : status == 429           ? T_429
            : status == 431           ? T_431
            : status == 401           ? T_401
                                      : T_OTHER;
    c->tally[t]++;
    size_t len = strlen(buf);
    if (t == T_OTHER && !c->detail[0]) /* the status and the answer's end, where it went wrong */
        snprintf(c->detail, sizeof c->detail, "kind %d: status %d, %zu bytes ending: %s", kind, status, len,
                 buf + (len > 160 ? len - 160 : 0));
}

/* Reads the answer and tallies it (read first: the status and completeness come from the same read). */
static void answer(client *c, int kind, int fd, char *buf, size_t cap) {
    bool complete = false;
    int status = read_all(fd, buf, cap, &complete);
    tally_status(c, kind, status, complete, buf);
}

static void one_round(client *c, uint64_t *rng) {
    static _Thread_local char big[MAX_BODY + 4096]; /* per client thread */
    char body[2048], buf[1 << 16];
    int kind = (int)(rng_next(rng) % 12);
    int max_tokens = 1 + (int)(rng_next(rng) % 64);
    const char *temp = rng_next(rng) % 2 ? "0" : "0.8";
    bool complete = false;
    int fd = dial(c->port);
    if (fd < 0) {
        c->tally[T_OTHER]++;
        return;
    }
    switch (kind) {
    case 0: /* plain completion */
    case 1: /* streamed completion */
    case 2: /* chat */
        if (kind == 2)
            snprintf(body, sizeof body,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"Tell me about the cat %d\"}],\"max_tokens\":%d,"
                     "\"temperature\":%s}",
                     c->id, max_tokens, temp);
        else
            snprintf(body, sizeof body,
                     "{\"prompt\":\"Once upon a time, there was a little dog named %d\",\"max_tokens\":%d,"
                     "\"temperature\":%s,\"stream\":%s}",
                     c->id, max_tokens, temp, kind == 1 ? "true" : "false");
        c->tally[T_SENT_VALID]++;
        send_req(fd, kind == 2 ? "/v1/chat/completions" : "/v1/completions", NULL, body, strlen(body));
        answer(c, kind, fd, buf, sizeof buf);
        break;
    case 3: /* a stream dropped after its first bytes */
    case 4: /* a request abandoned before any answer */
        snprintf(body, sizeof body, "{\"prompt\":\"The long road went on and on\",\"max_tokens\":64,\"stream\":%s}",
                 kind == 3 ? "true" : "false");
        c->tally[T_SENT_VALID]++;
        send_req(fd, "/v1/completions", NULL, body, strlen(body));
        if (kind == 3 && read(fd, buf, 64) > 0 && !strncmp(buf, "HTTP/1.1 429", 12)) {
            c->tally[T_429]++; /* refused before it could be dropped */
            break;
        }
        if (kind == 4) {
            /* a 429 may already be on its way: look without waiting */
            struct timeval tv = {.tv_usec = 1000};
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            if (read(fd, buf, 64) > 0 && !strncmp(buf, "HTTP/1.1 429", 12)) {
                c->tally[T_429]++;
                break;
            }
        }
        c->tally[T_DROPPED]++;
        break;
    case 5: /* malformed JSON */
        send_req(fd, "/v1/completions", NULL, "{\"prompt\": \"x\",", 15);
        answer(c, kind, fd, buf, sizeof buf);
        break;
    case 6: /* a bad field */
        snprintf(body, sizeof body, "{\"prompt\":\"x\",\"temperature\":\"hot\",\"max_tokens\":%d}", max_tokens);
        send_req(fd, "/v1/completions", NULL, body, strlen(body));
        answer(c, kind, fd, buf, sizeof buf);
        break;
    case 7: { /* a prompt past the context */
        size_t n = (size_t)snprintf(big, sizeof big, "{\"prompt\":\"");
        for (int i = 0; i < 400; i++) n += (size_t)snprintf(big + n, sizeof big - n, "cat ");
        n += (size_t)snprintf(big + n, sizeof big - n, "\",\"max_tokens\":4}");
        send_req(fd, "/v1/completions", NULL, big, n);
        answer(c, kind, fd, buf, sizeof buf);
        break;
    }
    case 8: /* a body over the limit */
        memset(big, ' ', sizeof big);
        send_req(fd, "/v1/completions", NULL, big, MAX_BODY + 1024);
        answer(c, kind, fd, buf, sizeof buf);
        break;
    case 10: /* no key, or a wrong one; half of them with a body over the limit (401: the key is checked first) */
        if (rng_next(rng) % 2) {
            memset(big, ' ', sizeof big);
            send_req_as(fd, false, "/v1/completions", NULL, big, MAX_BODY + 1024);
        } else {
            snprintf(body, sizeof body, "{\"prompt\":\"no key %d\",\"max_tokens\":4}", c->id);
            send_req_as(fd, false, "/v1/completions", rng_next(rng) % 2 ? "Authorization: Bearer wrong\r\n" : NULL,
                        body, strlen(body));
        }
        answer(c, kind, fd, buf, sizeof buf);
        break;
    case 11: { /* slow: stalls in its headers or, once they are in, in its body; the deadlines close it */
        const char *part = rng_next(rng) % 2 ? "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
                                             : "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n" AUTH
                                               "Content-Length: 4000\r\n\r\n{\"prompt\":";
        write_all(fd, part, strlen(part));
        int st = read_all(fd, buf, sizeof buf, &complete); /* bounded by the socket timeout */
        if (st == 0 && !buf[0]) {
            c->tally[T_SLOW]++;
        } else {
            c->tally[T_OTHER]++;
            if (!c->detail[0]) snprintf(c->detail, sizeof c->detail, "slow client: status %d: %.200s", st, buf);
        }
        break;
    }
    default: { /* headers over the limit (libmicrohttpd answers 431 or closes; the server never sees them) */
        static _Thread_local char hdr[48 << 10];
        memcpy(hdr, "X-Big: ", 7);
        memset(hdr + 7, 'a', sizeof hdr - 10);
        memcpy(hdr + sizeof hdr - 3, "\r\n", 3);
        send_req(fd, "/v1/completions", hdr, "{}", 2);
        int st = read_all(fd, buf, sizeof buf, &complete);
        /* 431, or the connection closed without an answer: either way refused before parsing */
        /* 431, or the connection closed without an answer: refused before the server parses it */
        int t = st == 0 || st == 431 ? T_431 : T_OTHER;
        c->tally[t]++;
        if (t == T_OTHER && !c->detail[0])
            snprintf(c->detail, sizeof c->detail, "big header: status %d: %.200s", st, buf);
        break;
    }
    }
    close(fd);
}

static void *client_main(void *arg) {
    client *c = arg;
    uint64_t rng = 0x9E3779B97F4A7C15ull * (uint64_t)(c->id + 1);
    for (int r = 0; r < c->rounds; r++) {
        one_round(c, &rng);
        if (r == 0) atomic_fetch_add(&g_warm_rounds, 1);
    }
    return NULL;
}

/* The completion text of a greedy request, plain (JSON) or streamed (SSE chunks joined). HTTP/1.0, so
 * the stream is not chunk-encoded. */
static bool greedy_text(int port, const char *prompt, bool stream, char *out, size_t cap) {
    char body[512], req[1024];
    static _Thread_local char buf[1 << 17];
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":48,\"temperature\":0,\"stream\":%s}", prompt,
             stream ? "true" : "false");
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n" AUTH
                     "Content-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    int fd = dial(port);
    bool complete = false;
    if (fd < 0 || !write_all(fd, req, (size_t)n) || read_all(fd, buf, sizeof buf, &complete) != 200) {
        if (fd >= 0) close(fd);
        return false;
    }
    close(fd);
    out[0] = '\0';
    size_t len = 0;
    const char *head_end = strstr(buf, "\r\n\r\n");
    if (!head_end) return false;
    /* plain: the one JSON body; streamed: each "data: {...}" line after the headers */
    const char *p = stream ? strstr(head_end, "\ndata: {") : head_end + 4;
    while (p) {
        json_t *j = json_loads(strchr(p, '{'), JSON_DISABLE_EOF_CHECK, NULL);
        const char *t = json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
        if (t) len += (size_t)snprintf(out + len, len < cap ? cap - len : 0, "%s", t);
        json_decref(j);
        if (len >= cap) return false;
        p = stream ? strstr(p + 1, "\ndata: {") : NULL;
    }
    return true;
}

static long rss_kib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, res = 0;
    if (f && fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
    if (f) fclose(f);
    return res * (sysconf(_SC_PAGESIZE) / 1024);
}

/* The value of one /metrics sample (0 when absent). */
static long long metric(int port, const char *sample) {
    int fd = dial(port);
    static char buf[1 << 17];
    long long v = 0;
    if (fd < 0) return -1;
    const char *req = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    bool complete;
    if (write_all(fd, req, strlen(req))) read_all(fd, buf, sizeof buf, &complete);
    close(fd);
    char key[256];
    snprintf(key, sizeof key, "\n%s ", sample);
    const char *p = strstr(buf, key);
    if (p) v = atoll(p + strlen(key));
    return v;
}

int main(void) {
    const char *model = HR_SOURCE_DIR "/models/stories260K-q8_0.gguf";
    FILE *f = fopen(model, "rb");
    if (!f) HR_SKIP("%s is missing", model);
    fclose(f);
    signal(SIGPIPE, SIG_IGN);
    int rounds = getenv("HR_SOAK_ROUNDS") ? atoi(getenv("HR_SOAK_ROUNDS")) : 30;
    hr_runtime_params p = hr_runtime_default_params();
    p.model_path = model;
    p.n_ctx = 256;
    p.block_size = 16;
    p.kv_blocks = 12; /* 192 tokens for 4 running requests of up to ~80 tokens and a 100-token stream */
    p.max_running = 4;
    p.max_queue = 6;
    p.admission = HR_RT_ADMIT_OPTIMISTIC;
    p.preempt = HR_RT_PREEMPT_SWAP;
    p.swap_space = 4u << 20;
    p.n_threads = 1;
    hr_runtime *rt = NULL;
    hr_error err = {0};
    if (hr_runtime_open(&p, &rt, NULL, &err) != HR_OK || hr_runtime_start(rt, &err) != HR_OK) {
        CHECKF(false, "runtime: %s", err.msg);
        return hr_test_finish();
    }
    hr_server_params sp = hr_server_default_params();
    sp.port = 0;
    sp.max_body_bytes = MAX_BODY;
    sp.drain_timeout_s = 10;
    sp.api_key = "soak-key";
    sp.header_timeout_s = 0.5; /* the slow clients' wait: short, so rounds stay quick */
    hr_server *srv = NULL;
    if (hr_server_create(rt, &sp, &srv, &err) != HR_OK) {
        CHECKF(false, "server: %s", err.msg);
        hr_runtime_close(rt);
        return hr_test_finish();
    }
    int port = hr_server_port(srv);

    /* the client that never reads: a long stream left unread until the end */
    int lazy = dial(port);
    int small = 4096;
    setsockopt(lazy, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    const char *lazy_body = "{\"prompt\":\"Once\",\"max_tokens\":100,\"stream\":true,\"ignore_eos\":true}";
    CHECK(lazy >= 0 && send_req(lazy, "/v1/completions", NULL, lazy_body, strlen(lazy_body)));

    client cl[N_CLIENTS];
    pthread_t th[N_CLIENTS];
    for (int i = 0; i < N_CLIENTS; i++) {
        cl[i] = (client){.port = port, .id = i, .rounds = rounds};
        pthread_create(&th[i], NULL, client_main, &cl[i]);
    }
    long rss_warm = 0;
    for (int t = 0; t < 6000 && atomic_load(&g_warm_rounds) < N_CLIENTS; t++) usleep(10 * 1000);
    rss_warm = rss_kib();
    for (int i = 0; i < N_CLIENTS; i++) pthread_join(th[i], NULL);
    close(lazy);
    for (int t = 0; t < 1200 && hr_server_n_inflight(srv) > 0; t++) usleep(50 * 1000); /* bounded: 60 s */
    CHECKF(hr_server_n_inflight(srv) == 0, "%d requests still in flight", hr_server_n_inflight(srv));
    long rss_end = rss_kib();

    long tot[T_N] = {0};
    for (int i = 0; i < N_CLIENTS; i++) {
        for (int t = 0; t < T_N; t++) tot[t] += cl[i].tally[t];
        CHECKF(!cl[i].detail[0], "client %d got an unexpected answer: %s", i, cl[i].detail);
    }
    long long fin_stop = metric(port, "headroom_requests_finished_total{finish_reason=\"stop\"}");
    long long fin_len = metric(port, "headroom_requests_finished_total{finish_reason=\"length\"}");
    long long fin_cancel = metric(port, "headroom_requests_finished_total{finish_reason=\"cancelled\"}");
    long long fin_err = metric(port, "headroom_requests_finished_total{finish_reason=\"error\"}");
    long long ref_inv = metric(port, "headroom_requests_refused_total{reason=\"invalid\"}");
    long long ref_ctx = metric(port, "headroom_requests_refused_total{reason=\"context\"}");
    long long ref_big = metric(port, "headroom_requests_refused_total{reason=\"too_large\"}");
    long long ref_queue = metric(port, "headroom_requests_refused_total{reason=\"queue_full\"}");
    long long ref_auth = metric(port, "headroom_requests_refused_total{reason=\"unauthorized\"}");
    long long preempt = metric(port, "headroom_preemptions_total{mode=\"swap\"}");
    long long preempt_re = metric(port, "headroom_preemptions_total{mode=\"recompute\"}");
    /* every valid request was either refused for a full queue or accepted and finished (a client that
       hung up at once may not have seen its 429, so the server's count of those is the one used) */
    long sent = tot[T_SENT_VALID] + 1; /* + the never-reading client */
    long long finished = fin_stop + fin_len + fin_cancel + fin_err;
    printf("clients: %d x %d rounds; ", N_CLIENTS, rounds);
    for (int t = 0; t < T_N; t++) printf("%s %ld%s", k_tally_names[t], tot[t], t + 1 < T_N ? ", " : "\n");
    printf("server: finished stop %lld, length %lld, cancelled %lld, error %lld; refused invalid %lld, context %lld, "
           "too_large %lld, queue %lld, unauthorized %lld; preemptions by swap %lld, by recompute %lld\n",
           fin_stop, fin_len, fin_cancel, fin_err, ref_inv, ref_ctx, ref_big, ref_queue, ref_auth, preempt, preempt_re);
    printf("rss after warm-up %ld KiB, at the end %ld KiB\n", rss_warm, rss_end);
    CHECKF(finished + ref_queue == sent, "server finished %lld and refused %lld as queue full of %ld valid requests",
           finished, ref_queue, sent);
    CHECKF(fin_err == 0, "%lld requests ended in error", fin_err);
    CHECKF(fin_stop + fin_len >= tot[T_OK], "clients read %ld complete answers, server completed %lld", tot[T_OK],
           fin_stop + fin_len);
    CHECKF(fin_cancel <= tot[T_DROPPED] + 1, "more cancellations (%lld) than dropped clients (%ld)", fin_cancel,
           tot[T_DROPPED] + 1);
    CHECKF(ref_inv == tot[T_400], "refused invalid: server %lld, clients %ld", ref_inv, tot[T_400]);
    CHECKF(ref_ctx == tot[T_400_CTX], "refused context: server %lld, clients %ld", ref_ctx, tot[T_400_CTX]);
    CHECKF(ref_big == tot[T_413], "refused too large: server %lld, clients %ld", ref_big, tot[T_413]);
    CHECKF(ref_queue >= tot[T_429], "refused queue: server %lld, clients saw %ld", ref_queue, tot[T_429]);
    CHECKF(ref_auth == tot[T_401], "refused unauthorized: server %lld, clients %ld", ref_auth, tot[T_401]);
    CHECK(tot[T_OK] > 0 && tot[T_400] > 0 && tot[T_413] > 0 && tot[T_431] > 0 && tot[T_401] > 0 && tot[T_SLOW] > 0);
    CHECKF(preempt > 0, "no preemption by swap: the soak did not press the pool");
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    CHECKF(rss_end - rss_warm < 32 * 1024, "RSS grew %ld KiB after warm-up", rss_end - rss_warm);
#endif
    /* a chunked upload (no Content-Length) over the body limit is cut off while it arrives: 413 */
    {
        int fd = dial(port);
        static char chunk[8192], answer_buf[4096];
        memset(chunk, ' ', sizeof chunk);
        const char *head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" AUTH
                           "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
        bool ok = fd >= 0 && write_all(fd, head, strlen(head));
        for (size_t up = 0; ok && up < MAX_BODY + 16384; up += sizeof chunk)
            ok = write_all(fd, "2000\r\n", 6) && write_all(fd, chunk, sizeof chunk) && write_all(fd, "\r\n", 2);
        if (ok) write_all(fd, "0\r\n\r\n", 5);
        bool complete;
        int st = fd >= 0 ? read_all(fd, answer_buf, sizeof answer_buf, &complete) : -1;
        CHECKF(st == 413, "chunked upload over the limit: status %d", st);
        if (fd >= 0) close(fd);
    }
    /* after all that, greedy text streamed equals greedy text whole (no SSE chunk lost or doubled) */
    for (int i = 0; i < 6; i++) {
        static char plain[8192], streamed[8192];
        char prompt[64];
        snprintf(prompt, sizeof prompt, "Once upon a time, a cat named %d", i);
        CHECK(greedy_text(port, prompt, false, plain, sizeof plain) &&
              greedy_text(port, prompt, true, streamed, sizeof streamed));
        CHECKF(plain[0] && !strcmp(plain, streamed), "prompt %d: plain '%s', streamed '%s'", i, plain, streamed);
    }
    hr_server_shutdown(srv);
    hr_server_destroy(srv);
    hr_runtime_stop(rt);
    hr_kv_pool_ledger l;
    hr_kv_pool_get_ledger(hr_runtime_kv(rt), &l);
    CHECKF(l.blocks_used == 0, "%d blocks still used", l.blocks_used);
    CHECKF(l.bytes_swapped == 0, "%llu bytes still swapped", (unsigned long long)l.bytes_swapped);
    CHECKF(hr_kv_pool_check(hr_runtime_kv(rt), &err) == HR_OK, "pool invariants: %s", err.msg);
    hr_runtime_close(rt);
    return hr_test_finish();
}

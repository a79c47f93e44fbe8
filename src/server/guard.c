/* guard.c: the connection guard: HTTP/1.1 message framing checks on a request's headers (RFC 9112
 * 6.1-6.3) and the watchdog that closes connections too slow to deliver their headers or body.
 *
 * Invariants:
 *   1. A tracked socket is in the list from libmicrohttpd's STARTED notification to its CLOSED one;
 *      MHD closes the descriptor only after CLOSED has returned, and CLOSED takes the list's mutex,
 *      so a descriptor the watchdog shuts down under that mutex is still the connection's own (never
 *      a reused number).
 *   2. Only the phases that wait on the client have a deadline: HEADERS (from accept, or from the end
 *      of the previous response on a kept-alive connection) and BODY (the request's headers are in,
 *      its body is arriving). BUSY (routing, waiting on the engine, streaming) is never cut here.
 *   3. The watchdog never calls into MHD: shutdown(2) wakes the connection's own thread, whose read
 *      then fails and which closes the connection the ordinary way (the request is cancelled as for
 *      a client that went away).
 *
 *   accept --STARTED--> HEADERS --first access call--> BODY --last access call--> BUSY
 *   BUSY --on_completed (kept alive)--> HEADERS;  any --CLOSED--> gone
 *   HEADERS past header_timeout_s, or BODY behind body_min_rate by more than header_timeout_s: cut */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "common/util.h"
#include "server/server_internal.h"

/* ---- framing ----------------------------------------------------------------------------------- */

/* Whether v is 1*DIGIT of at most 19 digits (fits in 63 bits). */
static bool plain_length(const char *v, size_t n) {
    if (n == 0 || n > 19) return false;
    for (size_t i = 0; i < n; i++)
        if (!isdigit((unsigned char)v[i])) return false;
    return true;
}

static void trim(const char **v, size_t *n) {
    while (*n > 0 && (**v == ' ' || **v == '\t')) (*v)++, (*n)--;
    while (*n > 0 && ((*v)[*n - 1] == ' ' || (*v)[*n - 1] == '\t')) (*n)--;
}

int hr_srv_framing_check(const hr_srv_header *h, int n, bool http10, char *why, size_t cap) {
    int n_cl = 0, n_te = 0;
    const char *cl = NULL, *te = NULL;
    size_t cl_len = 0, te_len = 0;
    for (int i = 0; i < n; i++) {
        if (!h[i].name) continue;
        if (!strcasecmp(h[i].name, "Content-Length")) {
            n_cl++;
            cl = h[i].value ? h[i].value : "";
            cl_len = strlen(cl);
            trim(&cl, &cl_len);
            if (!plain_length(cl, cl_len)) {
                snprintf(why, cap, "Content-Length must be a decimal number of at most 19 digits");
                return 400;
            }
        } else if (!strcasecmp(h[i].name, "Transfer-Encoding")) {
            n_te++;
            te = h[i].value ? h[i].value : "";
            te_len = strlen(te);
            trim(&te, &te_len);
        }
    }
    /* RFC 9112 6.3 lets a recipient merge identical duplicates; refusing them all is simpler and
       leaves no field for a proxy in front to have read differently */
    if (n_cl > 1) return snprintf(why, cap, "more than one Content-Length header"), 400;
    if (n_te > 0 && n_cl > 0)
        return snprintf(why, cap, "both Content-Length and Transfer-Encoding (ambiguous framing)"), 400;
    if (n_te > 1) return snprintf(why, cap, "more than one Transfer-Encoding header"), 400;
    if (n_te == 1 && http10) return snprintf(why, cap, "Transfer-Encoding in an HTTP/1.0 request"), 400;
    if (n_te == 1 && !(te_len == 7 && !strncasecmp(te, "chunked", 7)))
        return snprintf(why, cap, "Transfer-Encoding must be exactly \"chunked\" (no other coding is supported)"), 400;
    return 0;
}

/* ---- the watchdog ------------------------------------------------------------------------------ */

struct hr_srv_guard {
    double header_timeout_s;
    double body_min_rate; /* bytes per second; 0: no rate check */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* stop */
    hr_srv_sock *socks;
    int n_socks;
    bool stop;
    pthread_t thread;
    bool started;
    atomic_uint_fast64_t n_cut_headers, n_cut_body, n_accepted;
};

static bool late(const hr_srv_guard *g, const hr_srv_sock *k, double now) {
    double age = now - k->t0;
    if (k->phase == HR_SOCK_HEADERS) return age > g->header_timeout_s;
    if (k->phase == HR_SOCK_BODY && g->body_min_rate > 0)
        return age > g->header_timeout_s + (double)k->body_bytes / g->body_min_rate;
    return false;
}

static void *watch(void *arg) {
    hr_srv_guard *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        double now = hr_time_now();
        for (hr_srv_sock *k = g->socks; k; k = k->next) {
            if (k->cut || !late(g, k, now)) continue;
            k->cut = true; /* invariant 1: the fd is still this connection's */
            shutdown(k->fd, SHUT_RDWR);
            atomic_fetch_add(k->phase == HR_SOCK_HEADERS ? &g->n_cut_headers : &g->n_cut_body, 1);
        }
        /* a quarter of a second: deadlines are whole seconds, the scan is a short list walk */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

hr_status hr_srv_guard_create(double header_timeout_s, double body_min_rate, hr_srv_guard **out, hr_error *err) {
    hr_srv_guard *g = calloc(1, sizeof *g);
    if (!g) return hr_error_set(err, HR_ERR_NOMEM, "out of memory for the connection guard");
    g->header_timeout_s = header_timeout_s;
    g->body_min_rate = body_min_rate;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    if (pthread_create(&g->thread, NULL, watch, g) != 0) {
        hr_srv_guard_destroy(g);
        return hr_error_set(err, HR_ERR_IO, "cannot start the connection watchdog: %s", strerror(errno));
    }
    g->started = true;
    *out = g;
    return HR_OK;
}

void hr_srv_guard_destroy(hr_srv_guard *g) {
    if (!g) return;
    if (g->started) {
        pthread_mutex_lock(&g->mu);
        g->stop = true;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
        pthread_join(g->thread, NULL);
    }
    /* MHD_stop_daemon has sent CLOSED for every connection by now; anything left is freed anyway */
    while (g->socks) {
        hr_srv_sock *k = g->socks;
        g->socks = k->next;
        free(k);
    }
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

hr_srv_sock *hr_srv_guard_open(hr_srv_guard *g, int fd) {
    hr_srv_sock *k = calloc(1, sizeof *k);
    if (!k) return NULL; /* untracked: MHD's idle timeout still bounds it */
    k->fd = fd;
    k->phase = HR_SOCK_HEADERS;
    k->t0 = hr_time_now();
    pthread_mutex_lock(&g->mu);
    k->next = g->socks;
    if (g->socks) g->socks->prev = k;
    g->socks = k;
    g->n_socks++;
    pthread_mutex_unlock(&g->mu);
    atomic_fetch_add(&g->n_accepted, 1);
    return k;
}

void hr_srv_guard_close(hr_srv_guard *g, hr_srv_sock *k) {
    if (!k) return;
    pthread_mutex_lock(&g->mu);
    if (k->prev)
        k->prev->next = k->next;
    else
        g->socks = k->next;
    if (k->next) k->next->prev = k->prev;
    g->n_socks--;
    pthread_mutex_unlock(&g->mu);
    free(k);
}

void hr_srv_guard_phase(hr_srv_guard *g, hr_srv_sock *k, hr_sock_phase phase) {
    if (!k) return;
    pthread_mutex_lock(&g->mu);
    k->phase = phase;
    k->t0 = hr_time_now();
    k->body_bytes = 0;
    pthread_mutex_unlock(&g->mu);
}

void hr_srv_guard_body(hr_srv_guard *g, hr_srv_sock *k, size_t n) {
    if (!k) return;
    pthread_mutex_lock(&g->mu);
    k->body_bytes += n;
    pthread_mutex_unlock(&g->mu);
}

void hr_srv_guard_stats(hr_srv_guard *g, hr_srv_guard_counts *c) {
    pthread_mutex_lock(&g->mu);
    c->open = g->n_socks;
    pthread_mutex_unlock(&g->mu);
    c->accepted = atomic_load(&g->n_accepted);
    c->cut_headers = atomic_load(&g->n_cut_headers);
    c->cut_body = atomic_load(&g->n_cut_body);
}

/* gate.c: the server's front door: one thread that accepts connections and holds each one until its
 * first request's headers have arrived whole, checks their framing, and only then hands the socket
 * to libmicrohttpd (MHD_add_connection).
 *
 * Why: a connection that trickles its headers, or sends nothing, would otherwise hold one of MHD's
 * max_connections threads; here it holds a descriptor and a slot in one poll set. And libmicrohttpd
 * 0.9.75 answers a malformed Content-Length itself, before the access handler runs, with its status
 * line and headers written twice (parse_connection_headers queues the error, then its state machine
 * builds the header again): the gate refuses those first requests with exactly one 400.
 *
 * Invariants:
 *   1. The gate reads nothing: it peeks (MSG_PEEK), so MHD receives every byte of a request it
 *      accepts. A refused connection gets one response and is closed by the gate.
 *   2. Pending connections number at most max_pending, and at most per_ip from one address (past
 *      per_ip a new one is closed at once). When all max_pending are taken, a new connection takes
 *      the place of the one that has waited longest without whole headers (idle connections cannot
 *      lock the door); when every pending one is ready (waiting for a live slot), the listening
 *      socket is not polled and new connections wait in the kernel's backlog.
 *   3. At most max_live handed-off connections are open (counted up at hand-off, down at MHD's
 *      CLOSED notification, hr_srv_gate_closed); a ready connection waits in the gate for a slot.
 *   4. A pending connection whose headers are not whole header_timeout_s after it was accepted is
 *      closed.
 *
 *   accept --> pending --headers whole, framing ok, a live slot--> MHD_add_connection
 *   pending --framing bad--> one 400, closed;  --late / peer closed--> closed */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/util.h"
#include "server/server_internal.h"

typedef struct pending {
    int fd;
    struct sockaddr_storage addr;
    socklen_t addr_len;
    double t0;
    bool ready; /* headers whole and sound: waiting for a live slot */
} pending;

struct hr_srv_gate {
    hr_srv_gate_params p;
    int wake[2]; /* a pipe: stop */
    pending *pend;
    int n_pend;
    char *peek; /* max_header_bytes */
    atomic_int n_live, n_pend_now;
    atomic_bool stop;
    pthread_t thread;
    bool started;
    double pause_until; /* out of descriptors: the listening socket is left alone until then */
    atomic_uint_fast64_t n_cut, n_evicted, n_refused_framing, n_refused_ip;
};

/* ---- the header check -------------------------------------------------------------------------- */

/* Where the header block of buf[0..n) ends (just past its empty line), or 0 when not yet whole. */
static size_t head_end(const char *buf, size_t n) {
    for (size_t i = 0; i + 1 < n; i++) {
        if (buf[i] != '\n') continue;
        if (buf[i + 1] == '\n') return i + 2;
        if (i + 2 < n && buf[i + 1] == '\r' && buf[i + 2] == '\n') return i + 3;
    }
    return 0;
}

int hr_srv_check_head(const char *buf, size_t n, char *why, size_t cap) {
    /* RFC 9110 5.5: a NUL in a field is rejected; libmicrohttpd would read a length up to it, another
       parser past it */
    if (memchr(buf, '\0', n)) return snprintf(why, cap, "a NUL byte in the request head"), 400;
    char *copy = malloc(n + 1);
    if (!copy) return snprintf(why, cap, "out of memory"), 500;
    memcpy(copy, buf, n);
    copy[n] = '\0';
    hr_srv_header h[64];
    int nh = 0, status = 0;
    char *line = copy, *end = copy + n;
    char *eol = memchr(line, '\n', (size_t)(end - line));
    if (!eol) {
        free(copy);
        return 0; /* not a whole request line: MHD judges it */
    }
    *eol = '\0';
    if (eol > line && eol[-1] == '\r') eol[-1] = '\0';
    size_t ll = strlen(line);
    bool http10 = ll >= 8 && !strcmp(line + ll - 8, "HTTP/1.0");
    for (line = eol + 1; line < end && !status; line = eol + 1) {
        eol = memchr(line, '\n', (size_t)(end - line));
        if (!eol) break;
        *eol = '\0';
        if (eol > line && eol[-1] == '\r') eol[-1] = '\0';
        if (!*line) break; /* the empty line */
        if (*line == ' ' || *line == '\t') {
            /* obs-fold: RFC 9112 5.2 lets a server reject it; a folded framing header is a smuggling tool */
            status = 400;
            snprintf(why, cap, "a folded header line (obs-fold)");
            break;
        }
        char *colon = strchr(line, ':');
        if (!colon) continue; /* MHD judges malformed lines */
        size_t name_len = (size_t)(colon - line);
        if (name_len == 0) {
            status = 400;
            snprintf(why, cap, "a header without a name");
            break;
        }
        if (line[name_len - 1] == ' ' || line[name_len - 1] == '\t') {
            /* RFC 9112 5.1: whitespace between a field name and its colon MUST be rejected with 400 */
            status = 400;
            snprintf(why, cap, "whitespace between a header name and its colon");
            break;
        }
        *colon = '\0';
        if (strcasecmp(line, "Content-Length") != 0 && strcasecmp(line, "Transfer-Encoding") != 0) continue;
        if (nh == 64) {
            status = 400;
            snprintf(why, cap, "more than 64 Content-Length / Transfer-Encoding headers");
            break;
        }
        h[nh++] = (hr_srv_header){.name = line, .value = colon + 1};
    }
    if (!status) status = hr_srv_framing_check(h, nh, http10, why, cap);
    free(copy);
    return status;
}

/* ---- the thread -------------------------------------------------------------------------------- */

static bool same_ip(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
    if (a->ss_family != b->ss_family) return false;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
                       sizeof(struct in6_addr));
    return false;
}

static void drop(hr_srv_gate *g, int i) {
    close(g->pend[i].fd);
    g->pend[i] = g->pend[--g->n_pend];
}

/* Exactly one response, then the end: what was peeked is read away first so that closing does not
 * reset the connection (a reset can destroy the answer before the client reads it). */
static void refuse(hr_srv_gate *g, int i, int status, const char *why) {
    int fd = g->pend[i].fd;
    hr_srv_error e;
    hr_srv_fail(&e, status, NULL, "bad_framing", "%s", why);
    char *body = hr_srv_error_body(&e);
    size_t bl = body ? strlen(body) : 0;
    char head[256];
    int hl = snprintf(head, sizeof head,
                      "HTTP/1.1 %d %s\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: "
                      "%zu\r\n\r\n",
                      status, status == 400 ? "Bad Request" : "Internal Server Error", bl);
    /* bounded: a client pouring a body in must not hold the gate */
    for (int k = 0; k < 16 && recv(fd, g->peek, g->p.max_header_bytes, MSG_DONTWAIT) > 0; k++) {
    }
    if (send(fd, head, (size_t)hl, MSG_NOSIGNAL | MSG_DONTWAIT) == hl && body)
        (void)!send(fd, body, bl, MSG_NOSIGNAL | MSG_DONTWAIT);
    free(body);
    shutdown(fd, SHUT_WR);
    atomic_fetch_add(&g->n_refused_framing, 1);
    drop(g, i);
}

/* Index of the pending connection that has waited longest without whole headers, or -1. */
static int oldest_unready(const hr_srv_gate *g) {
    int best = -1;
    for (int i = 0; i < g->n_pend; i++)
        if (!g->pend[i].ready && (best < 0 || g->pend[i].t0 < g->pend[best].t0)) best = i;
    return best;
}

static void accept_some(hr_srv_gate *g) {
    for (int k = 0; k < 64; k++) {
        if (g->n_pend == g->p.max_pending) {
            int old = oldest_unready(g);
            if (old < 0) return;
            atomic_fetch_add(&g->n_evicted, 1);
            drop(g, old);
        }
        pending q = {.addr_len = sizeof q.addr};
        q.fd = accept4(g->p.listen_fd, (struct sockaddr *)&q.addr, &q.addr_len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (q.fd < 0) {
            /* out of descriptors (or kernel memory): the listening socket stays readable, so polling
               it again at once would spin; leave the connection in the backlog a moment */
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                g->pause_until = hr_time_now() + 0.1;
            return;
        }
        if (g->p.per_ip > 0) {
            int same = 0;
            for (int i = 0; i < g->n_pend; i++) same += same_ip(&g->pend[i].addr, &q.addr);
            if (same >= g->p.per_ip) {
                atomic_fetch_add(&g->n_refused_ip, 1);
                close(q.fd);
                continue;
            }
        }
        q.t0 = hr_time_now();
        g->pend[g->n_pend++] = q;
    }
}

/* Looks at pending connection i's bytes; returns false when it left the list. */
static bool look(hr_srv_gate *g, int i) {
    ssize_t n = recv(g->pend[i].fd, g->peek, g->p.max_header_bytes, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        drop(g, i);
        return false;
    }
    if (n <= 0) return true;
    size_t end = head_end(g->peek, (size_t)n);
    if (!end) {
        /* past the header limit: MHD answers that (431) */
        if ((size_t)n >= g->p.max_header_bytes) g->pend[i].ready = true;
        return true;
    }
    char why[200];
    int status = hr_srv_check_head(g->peek, end, why, sizeof why);
    if (status) {
        refuse(g, i, status, why);
        return false;
    }
    g->pend[i].ready = true;
    return true;
}

static void *gate_main(void *arg) {
    hr_srv_gate *g = arg;
    struct pollfd *pf = calloc((size_t)g->p.max_pending + 2, sizeof *pf);
    int *who = calloc((size_t)g->p.max_pending + 2, sizeof *who);
    if (!pf || !who) {
        free(pf);
        free(who);
        return NULL;
    }
    while (!atomic_load(&g->stop)) {
        int n = 0, n_ready = 0;
        pf[n++] = (struct pollfd){.fd = g->wake[0], .events = POLLIN};
        bool listening = g->p.listen_fd >= 0 && hr_time_now() >= g->pause_until &&
                         (g->n_pend < g->p.max_pending || oldest_unready(g) >= 0);
        if (listening) pf[n++] = (struct pollfd){.fd = g->p.listen_fd, .events = POLLIN};
        int first = n;
        for (int i = 0; i < g->n_pend; i++) {
            if (g->pend[i].ready) {
                n_ready++;
                continue;
            }
            who[n] = i;
            pf[n++] = (struct pollfd){.fd = g->pend[i].fd, .events = POLLIN | POLLRDHUP};
        }
        /* ready ones wait for a live slot: look again soon */
        poll(pf, (nfds_t)n, n_ready || hr_time_now() < g->pause_until ? 20 : 250);
        if (pf[0].revents) {
            char b[16];
            while (read(g->wake[0], b, sizeof b) > 0) {
            }
        }
        /* newest first, so that indexes of the ones not yet looked at stay valid when one is dropped
           (drop moves the last into the hole) */
        for (int k = n - 1; k >= first; k--)
            if (pf[k].revents) look(g, who[k]);
        double now = hr_time_now();
        for (int i = g->n_pend - 1; i >= 0; i--) {
            pending *q = &g->pend[i];
            if (q->ready) {
                if (atomic_load(&g->n_live) >= g->p.max_live) continue;
                atomic_fetch_add(&g->n_live, 1);
                int fd = q->fd;
                struct sockaddr_storage a = q->addr;
                socklen_t al = q->addr_len;
                g->pend[i] = g->pend[--g->n_pend];
                /* MHD closes the socket itself when it cannot take it (and then never notifies) */
                if (MHD_add_connection(g->p.daemon, fd, (struct sockaddr *)&a, al) != MHD_YES)
                    atomic_fetch_sub(&g->n_live, 1);
            } else if (now - q->t0 > g->p.header_timeout_s) {
                atomic_fetch_add(&g->n_cut, 1);
                drop(g, i);
            }
        }
        if (listening && pf[1].revents) accept_some(g);
        atomic_store(&g->n_pend_now, g->n_pend);
    }
    free(pf);
    free(who);
    return NULL;
}

hr_status hr_srv_gate_create(const hr_srv_gate_params *p, hr_srv_gate **out, hr_error *err) {
    hr_srv_gate *g = calloc(1, sizeof *g);
    if (!g) return hr_error_set(err, HR_ERR_NOMEM, "out of memory for the connection gate");
    g->p = *p;
    g->wake[0] = g->wake[1] = -1;
    g->pend = calloc((size_t)p->max_pending, sizeof *g->pend);
    g->peek = malloc(p->max_header_bytes);
    if (!g->pend || !g->peek || pipe2(g->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
        g->p.listen_fd = -1; /* the caller keeps it on failure */
        hr_srv_gate_destroy(g);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory for the connection gate");
    }
    /* *out is set before the thread starts: connections it hands over may close (and reach
       hr_srv_gate_closed through the caller's copy) at once */
    *out = g;
    g->started = true;
    if (pthread_create(&g->thread, NULL, gate_main, g) != 0) {
        *out = NULL;
        g->started = false;
        g->p.listen_fd = -1;
        hr_srv_gate_destroy(g);
        return hr_error_set(err, HR_ERR_IO, "cannot start the connection gate: %s", strerror(errno));
    }
    return HR_OK;
}

void hr_srv_gate_stop(hr_srv_gate *g) {
    if (!g || !g->started) return;
    atomic_store(&g->stop, true);
    (void)!write(g->wake[1], "x", 1);
    pthread_join(g->thread, NULL);
    g->started = false;
    for (int i = g->n_pend - 1; i >= 0; i--) drop(g, i);
    if (g->p.listen_fd >= 0) close(g->p.listen_fd);
    g->p.listen_fd = -1;
}

void hr_srv_gate_destroy(hr_srv_gate *g) {
    if (!g) return;
    hr_srv_gate_stop(g);
    if (g->p.listen_fd >= 0) close(g->p.listen_fd);
    if (g->wake[0] >= 0) close(g->wake[0]);
    if (g->wake[1] >= 0) close(g->wake[1]);
    free(g->pend);
    free(g->peek);
    free(g);
}

void hr_srv_gate_closed(hr_srv_gate *g) {
    if (!g) return;
    atomic_fetch_sub(&g->n_live, 1);
    (void)!write(g->wake[1], "x", 1); /* a ready connection may take the slot now */
}

void hr_srv_gate_stats(hr_srv_gate *g, hr_srv_gate_counts *c) {
    c->live = atomic_load(&g->n_live);
    c->pending = atomic_load(&g->n_pend_now);
    c->cut_headers = atomic_load(&g->n_cut);
    c->evicted = atomic_load(&g->n_evicted);
    c->refused_framing = atomic_load(&g->n_refused_framing);
    c->refused_per_ip = atomic_load(&g->n_refused_ip);
}

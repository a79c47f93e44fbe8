/* jsonmem.c: request bodies are parsed within a memory bound. A 4 MiB body of "{}" elements would
 * otherwise cost ~290 MiB to parse. jansson allocates through one process-wide pair of functions
 * (json_set_alloc_funcs); the pair installed here is malloc and free themselves, except that on a
 * thread running a bounded parse each block's usable size (malloc_usable_size: glibc, musl) is charged
 * to that parse. Blocks carry no header, so text from json_dumps is still released with free().
 *
 * Invariants:
 *   1. A parse first reserves its bound from the server's pool (waiting, up to a deadline, while other
 *      parses hold it), so the bodies parsed at once never hold more than the pool's limit: the
 *      server's plan counts that limit (hr_runtime_params.request_bytes).
 *   2. While a parse runs, its thread's jansson allocations are charged to it (and its frees, all of
 *      its own blocks, credited); one that would pass the reservation fails, and jansson gives up and
 *      frees what it built.
 *   3. After the parse the reservation shrinks to the document's bytes, which the caller gives back
 *      (hr_srv_parse_pool_release) once it has freed the document.
 * The per-thread parse state is the one mutable global here; it exists because jansson's allocator
 * is process-wide. */
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server_internal.h"

struct hr_srv_parse_pool {
    size_t limit;       /* bytes all parses and parsed bodies may hold at once */
    size_t per_request; /* bytes one parse may reach */
    atomic_size_t reserved;
    atomic_size_t peak;
};

/* The parse running on this thread, if any. */
static _Thread_local struct {
    bool active;
    size_t used, cap;
    bool exceeded;
} tls_parse;

static void *counted_malloc(size_t n) {
    void *p = malloc(n);
    if (!p || !tls_parse.active) return p;
    size_t got = malloc_usable_size(p);
    if (got > tls_parse.cap - tls_parse.used) { /* used <= cap always */
        free(p);
        tls_parse.exceeded = true;
        return NULL;
    }
    tls_parse.used += got;
    return p;
}

static void counted_free(void *p) {
    if (p && tls_parse.active) tls_parse.used -= malloc_usable_size(p); /* a block of this parse (2.) */
    free(p);
}

static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static void install_allocator(void) { json_set_alloc_funcs(counted_malloc, counted_free); }

hr_srv_parse_pool *hr_srv_parse_pool_create(size_t limit, size_t per_request) {
    pthread_once(&install_once, install_allocator);
    hr_srv_parse_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->limit = limit;
    p->per_request = per_request < limit ? per_request : limit;
    atomic_init(&p->reserved, 0);
    atomic_init(&p->peak, 0);
    return p;
}

void hr_srv_parse_pool_destroy(hr_srv_parse_pool *p) { free(p); }

size_t hr_srv_parse_pool_limit(const hr_srv_parse_pool *p) { return p->limit; }
size_t hr_srv_parse_pool_per_request(const hr_srv_parse_pool *p) { return p->per_request; }
size_t hr_srv_parse_pool_peak(hr_srv_parse_pool *p) { return atomic_load(&p->peak); }
size_t hr_srv_parse_pool_held(hr_srv_parse_pool *p) { return atomic_load(&p->reserved); }

/* What a body of len bytes may need: plenty for real requests (a long string costs ~3x its text while
 * the lexer copies it; an array of small integers ~25x), not the ~70x of "{}" elements; capped by the
 * per-request bound. */
static size_t bound_for(const hr_srv_parse_pool *p, size_t len) {
    size_t want = len > (SIZE_MAX - (256u << 10)) / 64 ? SIZE_MAX : (256u << 10) + 64 * len;
    return want < p->per_request ? want : p->per_request;
}

static bool reserve(hr_srv_parse_pool *p, size_t n, double wait_s) {
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int tries = 0;; tries++) {
        size_t cur = atomic_load(&p->reserved);
        while (cur + n <= p->limit) {
            if (atomic_compare_exchange_weak(&p->reserved, &cur, cur + n)) {
                size_t peak = atomic_load(&p->peak);
                while (cur + n > peak && !atomic_compare_exchange_weak(&p->peak, &peak, cur + n)) {
                }
                return true;
            }
        }
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double waited = (double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec);
        if (waited >= wait_s) return false;
        /* parses take milliseconds: poll rather than make every free signal */
        nanosleep(&(struct timespec){.tv_nsec = 2 * 1000 * 1000}, NULL);
    }
}

void hr_srv_parse_pool_release(hr_srv_parse_pool *p, size_t bytes) {
    if (p && bytes) atomic_fetch_sub(&p->reserved, bytes);
}

json_t *hr_srv_parse_pool_load(hr_srv_parse_pool *p, const char *data, size_t len, json_error_t *je,
                               hr_srv_parse_fail *why, size_t *held) {
    *why = HR_SRV_PARSE_OK;
    *held = 0;
    if (!p) return json_loadb(data, len, 0, je);
    size_t cap = bound_for(p, len);
    if (!reserve(p, cap, 5.0)) {
        *why = HR_SRV_PARSE_BUSY;
        return NULL;
    }
    tls_parse.active = true;
    tls_parse.used = 0;
    tls_parse.cap = cap;
    tls_parse.exceeded = false;
    json_t *root = json_loadb(data, len, 0, je);
    bool exceeded = tls_parse.exceeded;
    size_t live = root ? tls_parse.used : 0; /* a failed parse freed everything it built */
    tls_parse.active = false;
    /* keep what the document holds until the caller frees it (3.) */
    atomic_fetch_sub(&p->reserved, cap - live);
    *held = live;
    if (!root && exceeded) *why = cap < p->per_request ? HR_SRV_PARSE_TOO_DENSE : HR_SRV_PARSE_TOO_LARGE;
    return root;
}

/* jsonmem.c: request bodies are parsed within a memory bound. jansson allocates through one process-wide
 * pair of functions (json_set_alloc_funcs), installed here before main() runs so that every jansson
 * block, from the first, carries a 16-byte header: its size and the parse pool it was charged to (NULL:
 * not a request body's). A 4 MiB body of "{}" elements would otherwise cost ~290 MiB to parse.
 *
 * Invariants:
 *   1. A parse first reserves its bound from the server's pool (waiting, up to a deadline, while other
 *      parses hold it), so the bodies parsed at once never hold more than the pool's limit: the
 *      server's plan counts that limit (hr_runtime_params.request_bytes).
 *   2. While a parse runs, its thread's allocations are charged to it; one that would pass the
 *      reservation fails (jansson then gives up and frees what it built).
 *   3. After the parse the reservation shrinks to the document's live bytes, which are released block by
 *      block as the document is freed; a pool is destroyed only after its documents.
 * The per-thread state is the one mutable global besides the allocator pair, and both exist because
 * jansson's allocator is process-wide. */
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

typedef struct block_header {
    size_t size;              /* bytes asked for */
    hr_srv_parse_pool *owner; /* charged to (NULL: not a request body's) */
} block_header;
#define HEADER_BYTES (sizeof(block_header) < 16 ? 16 : sizeof(block_header)) /* keeps malloc's alignment */

/* The parse running on this thread, if any. */
static _Thread_local struct {
    hr_srv_parse_pool *pool;
    size_t used, cap;
    bool exceeded;
} tls_parse;

static void *counted_malloc(size_t n) {
    size_t total = n + HEADER_BYTES;
    hr_srv_parse_pool *owner = tls_parse.pool;
    if (owner) {
        if (total > tls_parse.cap - tls_parse.used) { /* used <= cap always */
            tls_parse.exceeded = true;
            return NULL;
        }
    }
    block_header *h = malloc(total);
    if (!h) return NULL;
    h->size = total;
    h->owner = owner;
    if (owner) tls_parse.used += total;
    return (char *)h + HEADER_BYTES;
}

static void counted_free(void *p) {
    if (!p) return;
    block_header *h = (block_header *)(void *)((char *)p - HEADER_BYTES);
    if (h->owner) {
        if (h->owner == tls_parse.pool) /* freed while parsing: the reservation still covers it */
            tls_parse.used -= h->size;
        else
            atomic_fetch_sub(&h->owner->reserved, h->size);
    }
    free(h);
}

/* Before main: no jansson block may exist without a header when these take over. */
__attribute__((constructor)) static void install_allocator(void) { json_set_alloc_funcs(counted_malloc, counted_free); }

hr_srv_parse_pool *hr_srv_parse_pool_create(size_t limit, size_t per_request) {
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

json_t *hr_srv_parse_pool_load(hr_srv_parse_pool *p, const char *data, size_t len, json_error_t *je,
                               hr_srv_parse_fail *why) {
    *why = HR_SRV_PARSE_OK;
    if (!p) return json_loadb(data, len, 0, je);
    size_t cap = bound_for(p, len);
    if (!reserve(p, cap, 5.0)) {
        *why = HR_SRV_PARSE_BUSY;
        return NULL;
    }
    tls_parse.pool = p;
    tls_parse.used = 0;
    tls_parse.cap = cap;
    tls_parse.exceeded = false;
    json_t *root = json_loadb(data, len, 0, je);
    bool exceeded = tls_parse.exceeded;
    size_t live = tls_parse.used;
    tls_parse.pool = NULL;
    /* keep what the document holds; its blocks give it back as they are freed */
    atomic_fetch_sub(&p->reserved, cap - live);
    if (!root && exceeded) *why = cap < p->per_request ? HR_SRV_PARSE_TOO_DENSE : HR_SRV_PARSE_TOO_LARGE;
    return root;
}

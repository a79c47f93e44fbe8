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
 * Which thread is parsing: a process-wide table of parse slots (no thread-local storage: every HTTP
 * thread would carry a copy, tests/no_tls.sh). It and the allocator pair are the mutable globals here,
 * both because jansson's allocator is process-wide; a thread finds its slot by its id, and with no
 * parse running the allocator is malloc/free plus one atomic load. */
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

/* One parse in progress. state: SLOT_FREE -> SLOT_CLAIMED (the owner fills tid and the counts) ->
 * SLOT_ACTIVE (others may read tid) -> SLOT_FREE. used, cap, exceeded: the owner thread's only. */
enum { SLOT_FREE = 0, SLOT_CLAIMED = 1, SLOT_ACTIVE = 2 };
#define PARSE_SLOTS 64 /* parses at once, process-wide; more wait for a slot */
typedef struct parse_slot {
    atomic_int state;
    _Atomic(pthread_t) tid; /* read by every allocating thread while a parse runs */
    size_t used, cap;
    bool exceeded;
} parse_slot;

static struct {
    atomic_int n_active; /* slots not free: 0 is the allocator's fast path */
    parse_slot slot[PARSE_SLOTS];
} g_parses;

/* The calling thread's parse, or NULL. */
static parse_slot *my_parse(void) {
    if (atomic_load_explicit(&g_parses.n_active, memory_order_acquire) == 0) return NULL;
    pthread_t self = pthread_self();
    for (int i = 0; i < PARSE_SLOTS; i++) {
        parse_slot *sl = &g_parses.slot[i];
        if (atomic_load_explicit(&sl->state, memory_order_acquire) == SLOT_ACTIVE &&
            pthread_equal(atomic_load_explicit(&sl->tid, memory_order_relaxed), self))
            return sl;
    }
    return NULL;
}

static void *counted_malloc(size_t n) {
    void *p = malloc(n);
    parse_slot *sl = p ? my_parse() : NULL;
    if (!sl) return p;
    size_t got = malloc_usable_size(p);
    if (got > sl->cap - sl->used) { /* used <= cap always */
        free(p);
        sl->exceeded = true;
        return NULL;
    }
    sl->used += got;
    return p;
}

static void counted_free(void *p) {
    parse_slot *sl = p ? my_parse() : NULL;
    if (sl) sl->used -= malloc_usable_size(p); /* a block of this parse (2.) */
    free(p);
}

static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static void install_allocator(void) { json_set_alloc_funcs(counted_malloc, counted_free); }

static parse_slot *claim_slot(size_t cap) {
    for (int i = 0; i < PARSE_SLOTS; i++) {
        parse_slot *sl = &g_parses.slot[i];
        int expect = SLOT_FREE;
        if (!atomic_compare_exchange_strong(&sl->state, &expect, SLOT_CLAIMED)) continue;
        atomic_store_explicit(&sl->tid, pthread_self(), memory_order_relaxed);
        sl->used = 0;
        sl->cap = cap;
        sl->exceeded = false;
        atomic_fetch_add(&g_parses.n_active, 1);
        atomic_store_explicit(&sl->state, SLOT_ACTIVE, memory_order_release);
        return sl;
    }
    return NULL;
}

static void free_slot(parse_slot *sl) {
    atomic_store_explicit(&sl->state, SLOT_FREE, memory_order_release);
    atomic_fetch_sub(&g_parses.n_active, 1);
}

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
    for (;;) {
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
    parse_slot *sl = NULL;
    for (int tries = 0; !(sl = claim_slot(cap)) && tries < 2500; tries++) /* 5 s */
        nanosleep(&(struct timespec){.tv_nsec = 2 * 1000 * 1000}, NULL);
    if (!sl) {
        atomic_fetch_sub(&p->reserved, cap);
        *why = HR_SRV_PARSE_BUSY;
        return NULL;
    }
    json_t *root = json_loadb(data, len, 0, je);
    bool exceeded = sl->exceeded;
    size_t live = root ? sl->used : 0; /* a failed parse freed everything it built */
    free_slot(sl);
    /* keep what the document holds until the caller frees it (3.) */
    atomic_fetch_sub(&p->reserved, cap - live);
    *held = live;
    if (!root && exceeded) *why = cap < p->per_request ? HR_SRV_PARSE_TOO_DENSE : HR_SRV_PARSE_TOO_LARGE;
    return root;
}

/* test_threadpool.c: every thread runs once per run with its own index; writes are visible after
 * run returns; many back-to-back runs (the spin path) and runs after a sleep (the futex path).
 * Item runs: every item runs exactly once whatever the pool size and item count, its plain writes
 * are visible after the run, and item runs interleave with static runs (late workers skip). */
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "common/threadpool.h"
#include "common/util.h"
#include "harness.h"

typedef struct {
    int n;
    int hits[64];
    long sum[64];
    _Atomic int calls;
    int round;
} ctx_t;

static void task(void *arg, int ith, int nth) {
    ctx_t *c = arg;
    if (nth != c->n || ith < 0 || ith >= nth) return;
    c->hits[ith]++;
    c->sum[ith] += c->round; /* plain writes: run() must publish them */
    atomic_fetch_add(&c->calls, 1);
}

static void check_pool(int n) {
    hr_threadpool *tp = NULL;
    hr_error err;
    CHECK(hr_threadpool_create(n, &tp, &err) == HR_OK);
    if (!tp) return;
    CHECK(hr_threadpool_size(tp) == n);
    ctx_t c;
    memset(&c, 0, sizeof c);
    c.n = n;
    const int rounds = 3000;
    for (int r = 0; r < rounds; r++) {
        c.round = r;
        hr_threadpool_run(tp, task, &c);
        if (r == 100 || r == 101) { /* let the workers fall asleep on the futex */
            struct timespec ts = {0, 30 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    CHECK(atomic_load(&c.calls) == rounds * n);
    int bad = 0;
    for (int i = 0; i < n; i++) bad += c.hits[i] != rounds || c.sum[i] != (long)rounds * (rounds - 1) / 2;
    CHECKF(bad == 0, "%d of %d threads saw the wrong runs", bad, n);
    hr_threadpool_destroy(tp);
}

enum { MAX_ITEMS = 5000 };

typedef struct {
    int n_threads;
    int64_t n_items;
    int value[MAX_ITEMS]; /* plain writes */
    _Atomic int runs[MAX_ITEMS];
    _Atomic int bad_ith;
} items_t;

static void item_task(void *arg, int64_t item, int ith) {
    items_t *c = arg;
    if (item < 0 || item >= c->n_items || ith < 0 || ith >= c->n_threads) {
        atomic_fetch_add(&c->bad_ith, 1);
        return;
    }
    c->value[item] = (int)item * 3 + 1;
    atomic_fetch_add(&c->runs[item], 1);
}

static void check_items(int n) {
    hr_threadpool *tp = NULL;
    hr_error err;
    CHECK(hr_threadpool_create(n, &tp, &err) == HR_OK);
    if (!tp) return;
    static items_t c;
    static const int64_t counts[] = {0, 1, 2, 3, 7, 64, 1000, MAX_ITEMS};
    ctx_t s;
    memset(&s, 0, sizeof s);
    s.n = n;
    int bad = 0, static_runs = 0;
    for (int round = 0; round < 400; round++) {
        memset(&c, 0, sizeof c);
        c.n_threads = n;
        c.n_items = counts[round % HR_ARRAY_LEN(counts)];
        hr_threadpool_run_items(tp, item_task, &c, c.n_items);
        for (int64_t i = 0; i < c.n_items; i++) bad += atomic_load(&c.runs[i]) != 1 || c.value[i] != (int)i * 3 + 1;
        bad += atomic_load(&c.bad_ith) != 0;
        if (round % 3 == 0) { /* a static run right after an item run that some workers skipped */
            hr_threadpool_run(tp, task, &s);
            static_runs++;
        }
        if (round == 200) {
            struct timespec ts = {0, 30 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    CHECKF(bad == 0, "%d item checks failed with %d threads", bad, n);
    CHECKF(atomic_load(&s.calls) == static_runs * n, "static runs between item runs: %d calls, want %d",
           atomic_load(&s.calls), static_runs * n);
    hr_threadpool_destroy(tp);
}

int main(void) {
    check_items(1);
    check_items(2);
    check_items(3);
    check_items(7);
    check_pool(1);
    check_pool(2);
    check_pool(4);
    check_pool(7); /* more threads than this machine may have cores */
    hr_threadpool *tp = (hr_threadpool *)&tp;
    hr_error err;
    CHECK(hr_threadpool_create(0, &tp, &err) == HR_ERR_INVALID_ARG);
    CHECK(tp == (hr_threadpool *)&tp); /* untouched on error */
    hr_threadpool_destroy(NULL);
    return hr_test_finish();
}

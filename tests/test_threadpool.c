/* test_threadpool.c: every thread runs once per run with its own index; writes are visible after
 * run returns; many back-to-back runs (the spin path) and runs after a sleep (the futex path). */
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/threadpool.h"
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

int main(void) {
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

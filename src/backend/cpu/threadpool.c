/* threadpool.c: fork/join pool (see threadpool.h).
 *
 * Protocol, one run:
 *   caller: store fn/ctx, n_done = 0, gen++ (release)  -> workers see the new gen, run fn, n_done++
 *   caller: runs fn as thread 0, then waits until n_done == n - 1 (acquire).
 * Sleeping uses Dekker-style flags with seq_cst atomics: a waiter announces itself (n_sleepers++)
 * before futex_wait re-checks the word, and a waker reads n_sleepers after changing the word, so
 * either the waiter sees the change or the waker sees the waiter. */
#include "backend/cpu/threadpool.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HR_CPU_RELAX() _mm_pause()
#else
#define HR_CPU_RELAX() ((void)0)
#endif

/* Spin iterations before sleeping: long enough to bridge the gap between the kernels of one step.
 * Every HR_SPIN_YIELD iterations the spinner yields, so a pool larger than the free cores still
 * makes progress instead of spinning against the thread it waits for. */
#define HR_SPIN_ITERS 20000
#define HR_SPIN_YIELD 256

static inline void spin_pause(int i) {
    if (i % HR_SPIN_YIELD == HR_SPIN_YIELD - 1)
        sched_yield();
    else
        HR_CPU_RELAX();
}

typedef struct worker {
    hr_threadpool *tp;
    int ith;
    pthread_t thread;
} worker;

struct hr_threadpool {
    int n;
    worker *workers; /* n - 1 of them */
    hr_task_fn fn;
    void *ctx;
    _Atomic uint32_t gen;    /* bumped once per run (futex word for workers) */
    _Atomic uint32_t n_done; /* workers finished with this run (futex word for the caller) */
    _Atomic int gen_sleepers;
    _Atomic int done_sleeper;
    _Atomic int stop;
};

static void futex_wait(_Atomic uint32_t *addr, uint32_t expected) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr, int count) {
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, count, NULL, NULL, 0);
}

/* Waits until *word != seen; returns the new value. */
static uint32_t wait_change(_Atomic uint32_t *word, uint32_t seen, _Atomic int *sleepers) {
    for (int i = 0; i < HR_SPIN_ITERS; i++) {
        uint32_t v = atomic_load_explicit(word, memory_order_acquire);
        if (v != seen) return v;
        spin_pause(i);
    }
    for (;;) {
        atomic_fetch_add(sleepers, 1);
        uint32_t v = atomic_load(word);
        if (v == seen) futex_wait(word, seen);
        atomic_fetch_sub(sleepers, 1);
        v = atomic_load_explicit(word, memory_order_acquire);
        if (v != seen) return v;
    }
}

static void *worker_main(void *arg) {
    worker *w = arg;
    hr_threadpool *tp = w->tp;
    uint32_t seen = 0;
    for (;;) {
        seen = wait_change(&tp->gen, seen, &tp->gen_sleepers);
        if (atomic_load_explicit(&tp->stop, memory_order_acquire)) break;
        tp->fn(tp->ctx, w->ith, tp->n);
        uint32_t done = atomic_fetch_add(&tp->n_done, 1) + 1; /* seq_cst: pairs with done_sleeper */
        if (done == (uint32_t)(tp->n - 1) && atomic_load(&tp->done_sleeper)) futex_wake(&tp->n_done, 1);
    }
    return NULL;
}

static void start_gen(hr_threadpool *tp) {
    atomic_fetch_add(&tp->gen, 1); /* seq_cst: also publishes fn/ctx/n_done */
    if (atomic_load(&tp->gen_sleepers) > 0) futex_wake(&tp->gen, INT_MAX);
}

hr_status hr_threadpool_create(int n_threads, hr_threadpool **out, hr_error *err) {
    if (n_threads < 1 || n_threads > 1024)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "thread count %d is out of range (expected 1..1024)", n_threads);
    hr_threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return hr_error_set(err, HR_ERR_NOMEM, "out of memory for the thread pool");
    tp->n = n_threads;
    if (n_threads > 1) {
        tp->workers = calloc((size_t)n_threads - 1, sizeof *tp->workers);
        if (!tp->workers) {
            free(tp);
            return hr_error_set(err, HR_ERR_NOMEM, "out of memory for %d workers", n_threads - 1);
        }
    }
    for (int i = 1; i < n_threads; i++) {
        worker *w = &tp->workers[i - 1];
        w->tp = tp;
        w->ith = i;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            tp->n = i; /* join the ones started */
            hr_threadpool_destroy(tp);
            return hr_error_set(err, HR_ERR_INTERNAL, "could not start worker thread %d of %d", i, n_threads);
        }
    }
    *out = tp;
    return HR_OK;
}

void hr_threadpool_destroy(hr_threadpool *tp) {
    if (!tp) return;
    atomic_store(&tp->stop, 1);
    start_gen(tp);
    for (int i = 1; i < tp->n; i++) pthread_join(tp->workers[i - 1].thread, NULL);
    free(tp->workers);
    free(tp);
}

int hr_threadpool_size(const hr_threadpool *tp) { return tp->n; }

void hr_threadpool_run(hr_threadpool *tp, hr_task_fn fn, void *ctx) {
    if (tp->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    tp->fn = fn;
    tp->ctx = ctx;
    atomic_store_explicit(&tp->n_done, 0, memory_order_relaxed);
    start_gen(tp);
    fn(ctx, 0, tp->n);
    const uint32_t want = (uint32_t)(tp->n - 1);
    for (int i = 0; i < HR_SPIN_ITERS; i++) {
        if (atomic_load_explicit(&tp->n_done, memory_order_acquire) == want) return;
        spin_pause(i);
    }
    for (;;) {
        atomic_store(&tp->done_sleeper, 1);
        uint32_t v = atomic_load(&tp->n_done);
        if (v != want) futex_wait(&tp->n_done, v);
        atomic_store(&tp->done_sleeper, 0);
        if (atomic_load_explicit(&tp->n_done, memory_order_acquire) == want) return;
    }
}

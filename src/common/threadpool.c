/* threadpool.c: fork/join pool (see threadpool.h).
 *
 * Every run, static or of items, is a set of numbered items handed out by one counter (a static run
 * is n items, item i being fn(ctx, i, n)). Protocol, one run:
 *   caller: write the job, next_item = 0, entry = 0 (open, nobody inside), gen++ (wakes workers)
 *   worker: sees the new gen; joins by a CAS entry -> entry + 1 that fails once the closed bit is
 *           set; takes items until none are left; leaves (entry - 1, waking a sleeping caller)
 *   caller: takes items too; out of items, sets the closed bit and waits until nobody is inside.
 * So a worker that arrives late (asleep, or descheduled on a loaded machine) skips the run instead
 * of holding it up, and the job is never rewritten while a worker can read it: workers read it
 * only after joining, and the caller starts the next run only when nobody is inside.
 * Sleeping uses Dekker-style flags with seq_cst atomics: a waiter announces itself before futex_wait
 * re-checks the word, and a waker reads the flag after changing the word, so either the waiter sees
 * the change or the waker sees the waiter. */
#include "common/threadpool.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
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

#define HR_ENTRY_CLOSED (1u << 31)
#define HR_ENTRY_COUNT  (HR_ENTRY_CLOSED - 1)

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
    /* the job of the run in progress (written by the caller while nobody is inside) */
    hr_task_fn fn;      /* static run: item i is fn(ctx, i, n) */
    hr_item_fn item_fn; /* item run: item i is item_fn(ctx, i, ith) */
    void *ctx;
    int64_t n_items;
    _Atomic int64_t next_item;
    _Atomic uint32_t entry; /* closed bit | workers inside (futex word for the caller) */
    _Atomic uint32_t gen;   /* bumped once per run (futex word for workers) */
    _Atomic int gen_sleepers;
    _Atomic int entry_sleeper;
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

/* Enters the open run; false once it is closed. */
static bool join_run(hr_threadpool *tp) {
    uint32_t e = atomic_load(&tp->entry);
    for (;;) {
        if (e & HR_ENTRY_CLOSED) return false;
        if (atomic_compare_exchange_weak(&tp->entry, &e, e + 1)) return true;
    }
}

static void take_items(hr_threadpool *tp, int ith) {
    for (;;) {
        const int64_t i = atomic_fetch_add_explicit(&tp->next_item, 1, memory_order_relaxed);
        if (i >= tp->n_items) return;
        if (tp->item_fn)
            tp->item_fn(tp->ctx, i, ith);
        else
            tp->fn(tp->ctx, (int)i, tp->n);
    }
}

static void *worker_main(void *arg) {
    worker *w = arg;
    hr_threadpool *tp = w->tp;
    uint32_t seen = 0;
    for (;;) {
        seen = wait_change(&tp->gen, seen, &tp->gen_sleepers);
        if (atomic_load_explicit(&tp->stop, memory_order_acquire)) break;
        if (!join_run(tp)) continue; /* too late for that run */
        take_items(tp, w->ith);
        const uint32_t e = atomic_fetch_sub(&tp->entry, 1) - 1; /* seq_cst: publishes the items' writes */
        if (e == HR_ENTRY_CLOSED && atomic_load(&tp->entry_sleeper)) futex_wake(&tp->entry, 1);
    }
    return NULL;
}

static void start_gen(hr_threadpool *tp) {
    atomic_fetch_add(&tp->gen, 1); /* seq_cst: also publishes the job */
    if (atomic_load(&tp->gen_sleepers) > 0) futex_wake(&tp->gen, INT_MAX);
}

uint64_t hr_threadpool_bytes(int n_threads) {
    return sizeof(hr_threadpool) + (n_threads > 1 ? (uint64_t)(n_threads - 1) * sizeof(worker) : 0);
}

hr_status hr_threadpool_create(int n_threads, hr_threadpool **out, hr_error *err) {
    if (n_threads < 1 || n_threads > 1024)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "thread count %d is out of range (expected 1..1024)", n_threads);
    hr_threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return hr_error_set(err, HR_ERR_NOMEM, "out of memory for the thread pool");
    tp->n = n_threads;
    atomic_store(&tp->entry, HR_ENTRY_CLOSED);
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

/* One run of n_items items (the job fields set by the caller). */
static void run(hr_threadpool *tp, int64_t n_items) {
    tp->n_items = n_items;
    atomic_store_explicit(&tp->next_item, 0, memory_order_relaxed);
    atomic_store(&tp->entry, 0); /* open */
    start_gen(tp);
    take_items(tp, 0);
    /* out of items: close the run to latecomers, then wait for those inside */
    uint32_t e = atomic_fetch_or(&tp->entry, HR_ENTRY_CLOSED) | HR_ENTRY_CLOSED;
    for (int i = 0; e != HR_ENTRY_CLOSED && i < HR_SPIN_ITERS; i++) {
        spin_pause(i);
        e = atomic_load(&tp->entry);
    }
    while (e != HR_ENTRY_CLOSED) {
        atomic_store(&tp->entry_sleeper, 1);
        e = atomic_load(&tp->entry);
        if (e != HR_ENTRY_CLOSED) futex_wait(&tp->entry, e);
        atomic_store(&tp->entry_sleeper, 0);
        e = atomic_load(&tp->entry);
    }
}

void hr_threadpool_run(hr_threadpool *tp, hr_task_fn fn, void *ctx) {
    if (tp->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    tp->fn = fn;
    tp->item_fn = NULL;
    tp->ctx = ctx;
    run(tp, tp->n);
}

void hr_threadpool_run_items(hr_threadpool *tp, hr_item_fn fn, void *ctx, int64_t n_items) {
    if (n_items <= 0) return;
    if (tp->n == 1 || n_items == 1) {
        for (int64_t i = 0; i < n_items; i++) fn(ctx, i, 0);
        return;
    }
    tp->fn = NULL;
    tp->item_fn = fn;
    tp->ctx = ctx;
    run(tp, n_items);
}

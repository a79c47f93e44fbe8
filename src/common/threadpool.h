/* threadpool.h: a fork/join pool: the CPU backend's kernels run on one, and a backend's host work
 * outside its kernels (the engine's sampling of a step's rows: model.h's hr_model_ctx_run_items) on
 * the backend's own, the GPU's included. One run hands out numbered shares of work
 * (n shares to hr_threadpool_run, any number of items to hr_threadpool_run_items) to the caller and
 * to whichever workers join, and returns when all have finished; nothing is allocated per run.
 * Workers spin briefly on a generation counter after each run, then sleep on a futex, so a step's
 * many small runs start without a wake-up while an idle pool costs no CPU.
 *
 * A pool is driven by one thread at a time (the engine thread); runs do not nest. */
#ifndef HR_COMMON_THREADPOOL_H
#define HR_COMMON_THREADPOOL_H

#include <stdint.h>

#include "common/status.h"

typedef struct hr_threadpool hr_threadpool;

/* n_threads counts all threads including the caller (1 = no workers; fn runs inline). On error
 * *out is untouched and err says why (n_threads < 1 or > 1024, thread creation failed). */
hr_status hr_threadpool_create(int n_threads, hr_threadpool **out, hr_error *err);
/* Joins the workers and frees the pool. NULL is allowed. */
void hr_threadpool_destroy(hr_threadpool *tp);
/* Bytes hr_threadpool_create allocates (the workers' stacks are the system's, not counted). */
uint64_t hr_threadpool_bytes(int n_threads);
int hr_threadpool_size(const hr_threadpool *tp);

/* Share ith of nth (0 <= ith < nth). */
typedef void (*hr_task_fn)(void *ctx, int ith, int nth);
/* Calls fn(ctx, i, n) exactly once for every i in [0, n) (n = the pool size) and returns when all
 * calls have returned; everything written by fn is visible to the caller afterwards. The calls run
 * concurrently on the pool's threads, at most one at a time per i, but share i need not run on
 * worker i: a worker that is late (asleep, or descheduled on a loaded machine) leaves its share to
 * whoever is free, so one lagging thread does not hold up the run. Index per-share scratch by i. */
void hr_threadpool_run(hr_threadpool *tp, hr_task_fn fn, void *ctx);

/* Work item `item` (0 <= item < n_items), run on thread ith (0 = the caller). */
typedef void (*hr_item_fn)(void *ctx, int64_t item, int ith);
/* Calls fn(ctx, item, ith) exactly once for every item, the items handed out one at a time in
 * increasing order to the caller and to the workers that join in; returns when all have returned,
 * with their writes visible to the caller. A worker that arrives after the caller has taken the
 * last item skips the run, so a descheduled worker (a loaded machine) delays a run by at most the
 * item it is inside, never by its wake-up. Which thread runs an item is not fixed: fn's result must
 * not depend on ith (use ith only to pick per-thread scratch). */
void hr_threadpool_run_items(hr_threadpool *tp, hr_item_fn fn, void *ctx, int64_t n_items);

#endif

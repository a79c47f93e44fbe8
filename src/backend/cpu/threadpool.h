/* threadpool.h: a fork/join pool for the CPU kernels. One run hands the same function to every
 * thread (the caller is thread 0) and returns when all have finished; nothing is allocated per run.
 * Workers spin briefly on a generation counter after each run, then sleep on a futex, so a step's
 * many small runs start in well under a microsecond-scale wake-up while an idle pool costs no CPU.
 *
 * A pool is driven by one thread at a time (the engine thread); runs do not nest. */
#ifndef HR_BACKEND_CPU_THREADPOOL_H
#define HR_BACKEND_CPU_THREADPOOL_H

#include "common/status.h"

typedef struct hr_threadpool hr_threadpool;

/* n_threads counts all threads including the caller (1 = no workers; fn runs inline). On error
 * *out is untouched and err says why (n_threads < 1 or > 1024, thread creation failed). */
hr_status hr_threadpool_create(int n_threads, hr_threadpool **out, hr_error *err);
/* Joins the workers and frees the pool. NULL is allowed. */
void hr_threadpool_destroy(hr_threadpool *tp);
int hr_threadpool_size(const hr_threadpool *tp);

/* Work for thread ith of nth (0 <= ith < nth). */
typedef void (*hr_task_fn)(void *ctx, int ith, int nth);
/* Calls fn(ctx, i, n) once on every thread of the pool (the caller is thread 0) and returns when all
 * calls have returned. Everything written by fn on any thread is visible to the caller afterwards. */
void hr_threadpool_run(hr_threadpool *tp, hr_task_fn fn, void *ctx);

#endif

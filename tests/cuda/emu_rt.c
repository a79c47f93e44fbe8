/* emu_rt.c: runs a CUDA kernel on the CPU, for the emulating test driver (fake_libcuda.c built with
 * HR_FAKE_CUDA_EMU). The kernels' own source (the .cu files of src/backend/cuda/kernels) is compiled as host C++
 * (tests/cuda/emu_kernels.cc, common.cuh's HR_CUDA_EMU branch); this file is the GPU they run on:
 *
 * - One thread block at a time, in grid order; each of its threads is a fiber (ucontext) on its own
 *   stack, all on the launching thread. A fiber runs until it finishes or reaches a barrier.
 * - __syncthreads: a fiber waits until every thread of the block that has not finished waits there
 *   too (finished threads count as arrived, as on the GPU).
 * - A warp shuffle (hr_emu_shfl_xor) is a barrier of the fiber's warp: each lane leaves its value in
 *   a slot, and once the warp's live lanes have all arrived each reads its partner's. Slots alternate
 *   between two sets by the lane's shuffle count, so a lane that runs ahead to its next shuffle does
 *   not overwrite a value another lane has still to read.
 * - A block whose live threads wait at barriers that can never open (some at __syncthreads, others of
 *   a warp at a shuffle; a divergent barrier, a hang on the GPU) ends the launch with an error instead
 *   of hanging.
 *
 * What it does not model: threads running at once (no races are found here), memory spaces (device
 * addresses are host addresses), timing, and the hardware's approximate math (libm's instead).
 * Launches are serialized by one lock; nothing here calls malloc (the fault-injection build wraps it
 * in the test programs, not in this dlopen'ed library): stacks come from mmap. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

#include "emu_rt.h"

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

#define EMU_MAX_THREADS 1024
#define EMU_STACK       (128u << 10)
#define EMU_WARP        32

enum { F_RUN, F_SYNC, F_SHFL, F_DONE };

typedef struct fiber {
    ucontext_t ctx;
    int state;
    unsigned shuffles; /* shuffles this lane has done: its slot set is shuffles & 1 */
#ifdef EMU_ASAN
    void *fake_stack;
#endif
} fiber;

static struct emu {
    pthread_mutex_t mu;
    hr_emu_kernel_fn fn;
    void **params;
    int n, cur;              /* threads of a block; the fiber running */
    unsigned gx, bx, cx, cy; /* grid width, block size, the block running */
    ucontext_t sched;
    fiber f[EMU_MAX_THREADS];
    float slot[2][EMU_MAX_THREADS];
    unsigned slot_of[2][EMU_MAX_THREADS]; /* which shuffle wrote the slot */
    unsigned char *stacks;
#ifdef EMU_ASAN
    void *sched_fake_stack;
    const void *sched_bottom;
    size_t sched_size;
#endif
} E = {.mu = PTHREAD_MUTEX_INITIALIZER};

int hr_emu_tid_x(void) { return E.cur; }
int hr_emu_ntid_x(void) { return (int)E.bx; }
int hr_emu_ctaid_x(void) { return (int)E.cx; }
int hr_emu_ctaid_y(void) { return (int)E.cy; }
int hr_emu_nctaid_x(void) { return (int)E.gx; }

/* the running fiber gives the CPU back to the scheduler in state s */
static void yield(int s) {
    fiber *me = &E.f[E.cur];
    me->state = s;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(&me->fake_stack, E.sched_bottom, E.sched_size);
#endif
    swapcontext(&me->ctx, &E.sched);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(me->fake_stack, NULL, NULL);
#endif
}

void hr_emu_syncthreads(void) { yield(F_SYNC); }

float hr_emu_shfl_xor(float v, int lane_mask) {
    int t = E.cur;
    fiber *me = &E.f[t];
    unsigned set = me->shuffles & 1u;
    E.slot[set][t] = v;
    E.slot_of[set][t] = me->shuffles;
    yield(F_SHFL);
    int src = (t & ~(EMU_WARP - 1)) | ((t & (EMU_WARP - 1)) ^ (lane_mask & (EMU_WARP - 1)));
    /* a partner past the block or one that left before this shuffle gave nothing: keep v */
    float r = src < E.n && E.slot_of[set][src] == me->shuffles ? E.slot[set][src] : v;
    me->shuffles++;
    return r;
}

static void fiber_main(void) {
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(NULL, &E.sched_bottom, &E.sched_size);
#endif
    E.fn(E.params);
    E.f[E.cur].state = F_DONE;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(NULL, E.sched_bottom, E.sched_size); /* this fiber is over */
#endif
    setcontext(&E.sched);
}

/* Opens the barriers whose every live thread has arrived; false when none could open. */
static bool release(void) {
    int live = 0, at_sync = 0;
    for (int i = 0; i < E.n; i++) {
        live += E.f[i].state != F_DONE;
        at_sync += E.f[i].state == F_SYNC;
    }
    bool opened = false;
    if (live > 0 && at_sync == live) {
        for (int i = 0; i < E.n; i++)
            if (E.f[i].state == F_SYNC) E.f[i].state = F_RUN;
        opened = true;
    }
    for (int w = 0; w < E.n; w += EMU_WARP) {
        int end = w + EMU_WARP < E.n ? w + EMU_WARP : E.n, wl = 0, at = 0;
        for (int i = w; i < end; i++) {
            wl += E.f[i].state != F_DONE;
            at += E.f[i].state == F_SHFL;
        }
        if (wl > 0 && at == wl) {
            for (int i = w; i < end; i++) E.f[i].state = F_RUN;
            opened = true;
        }
    }
    return opened;
}

/* Runs block (cx, cy); false on a barrier that can never open. */
static bool run_block(char *why, size_t why_len) {
    for (int i = 0; i < E.n; i++) {
        fiber *f = &E.f[i];
        getcontext(&f->ctx);
        f->ctx.uc_stack.ss_sp = E.stacks + (size_t)i * EMU_STACK;
        f->ctx.uc_stack.ss_size = EMU_STACK;
        f->ctx.uc_link = NULL;
        makecontext(&f->ctx, fiber_main, 0);
        f->state = F_RUN;
        f->shuffles = 0;
        E.slot_of[0][i] = E.slot_of[1][i] = ~0u;
    }
    for (;;) {
        bool ran = false;
        for (int i = 0; i < E.n; i++) {
            if (E.f[i].state != F_RUN) continue;
            E.cur = i;
            ran = true;
#ifdef EMU_ASAN
            __sanitizer_start_switch_fiber(&E.sched_fake_stack, E.stacks + (size_t)i * EMU_STACK, EMU_STACK);
#endif
            swapcontext(&E.sched, &E.f[i].ctx);
#ifdef EMU_ASAN
            __sanitizer_finish_switch_fiber(E.sched_fake_stack, NULL, NULL);
#endif
        }
        int done = 0;
        for (int i = 0; i < E.n; i++) done += E.f[i].state == F_DONE;
        if (done == E.n) return true;
        if (!release() && !ran) {
            int s = 0, w = 0;
            for (int i = 0; i < E.n; i++) {
                s += E.f[i].state == F_SYNC;
                w += E.f[i].state == F_SHFL;
            }
            snprintf(why, why_len,
                     "block (%u, %u): %d threads wait at __syncthreads and %d at a warp shuffle, %d finished: "
                     "a barrier that never opens",
                     E.cx, E.cy, s, w, done);
            return false;
        }
    }
}

int hr_emu_launch(hr_emu_kernel_fn fn, void **params, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                  unsigned bz, char *why, size_t why_len) {
    if (by != 1 || bz != 1 || gz != 1 || bx == 0 || bx > EMU_MAX_THREADS || gx == 0 || gy == 0) {
        snprintf(why, why_len, "launch shape grid (%u, %u, %u) block (%u, %u, %u) is not emulated", gx, gy, gz, bx, by,
                 bz);
        return 1;
    }
    pthread_mutex_lock(&E.mu);
    if (!E.stacks) {
        void *m = mmap(NULL, (size_t)EMU_MAX_THREADS * EMU_STACK, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) {
            pthread_mutex_unlock(&E.mu);
            snprintf(why, why_len, "no memory for the emulated threads' stacks");
            return 1;
        }
        E.stacks = m;
    }
    E.fn = fn;
    E.params = params;
    E.n = (int)bx;
    E.bx = bx;
    E.gx = gx;
    int rc = 0;
    for (unsigned y = 0; y < gy && !rc; y++)
        for (unsigned x = 0; x < gx && !rc; x++) {
            E.cx = x;
            E.cy = y;
            if (!run_block(why, why_len)) rc = 1;
        }
    pthread_mutex_unlock(&E.mu);
    return rc;
}

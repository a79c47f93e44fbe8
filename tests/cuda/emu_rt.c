/* emu_rt.c: runs a CUDA kernel on the CPU, for the emulating test driver (fake_libcuda.c built with
 * HR_FAKE_CUDA_EMU). The kernels' own source (the .cu files of src/backend/cuda/kernels) is compiled as host C++
 * (tests/cuda/emu_kernels.cc, common.cuh's HR_CUDA_EMU branch); this file is the GPU they run on:
 *
 * - One thread block at a time, in grid order; each of its threads is a fiber on its own stack, all on
 *   the launching thread. A fiber runs until it finishes or reaches a barrier. On x86-64 a fiber
 *   switch is a few instructions (emu_switch below: the callee-saved registers and the stack);
 *   glibc's swapcontext makes a system call per switch, which made a stories260K token take seconds.
 *   Elsewhere ucontext does it.
 * - __syncthreads: a fiber waits until every thread of the block that has not finished waits there
 *   too (finished threads count as arrived, as on the GPU).
 * - A warp shuffle (hr_emu_shfl_xor) is a barrier of the fiber's warp: each lane leaves its value in
 *   a slot, and once the warp's live lanes have all arrived each reads its partner's. Slots alternate
 *   between two sets by the lane's shuffle count, so a lane that runs ahead to its next shuffle does
 *   not overwrite a value another lane has still to read.
 * - A tensor-core mma (hr_emu_mma_16816, m16n8k16) is the same warp barrier: each lane leaves its A
 *   and B fragments in its slot; once the warp is there each computes its own D elements from the
 *   fragments of the lanes that hold its rows of A and columns of B, in f32, as the PTX ISA lays them
 *   out. Every lane of the warp must take part (mma.sync.aligned): otherwise D is NaN.
 * - A block whose live threads wait at barriers that can never open (some at __syncthreads, others of
 *   a warp at a shuffle; a divergent barrier, a hang on the GPU) ends the launch with an error instead
 *   of hanging.
 * - An access the kernel promised aligned (common.cuh's hr_aligned: the vector loads and stores) at an
 *   address that is not ends the launch with an error after its block, as the GPU's fault would.
 *
 * What it does not model: threads running at once (no races are found here), memory spaces (device
 * addresses are host addresses), timing, and the hardware's approximate math (libm's instead).
 * Launches are serialized by one lock; nothing here calls malloc (the fault-injection build wraps it
 * in the test programs, not in this dlopen'ed library): stacks come from mmap. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
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
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#define EMU_MAX_THREADS 1024
#define EMU_STACK       (64u << 10)
#define EMU_WARP        32

enum { F_RUN, F_SYNC, F_SHFL, F_DONE };

/* ---- the context switch ---------------------------------------------------------------------------- */

#if defined(__x86_64__)
/* emu_switch(&from_sp, to_sp): saves the callee-saved registers on the current stack, stores its
 * pointer in *from_sp, and resumes the context whose pointer is to_sp (SysV ABI). MXCSR and the x87
 * control word are not switched: every fiber runs with the launching thread's, and kernels never
 * change them. */
void hr_emu_switch(void **from_sp, void *to_sp);
__asm__(".text\n"
        ".globl hr_emu_switch\n"
        ".hidden hr_emu_switch\n"
        ".type hr_emu_switch, @function\n"
        "hr_emu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size hr_emu_switch, .-hr_emu_switch\n");
typedef struct emu_ctx {
    void *sp;
} emu_ctx;
#else
typedef ucontext_t emu_ctx;
#endif

typedef struct fiber {
    emu_ctx ctx;
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
    int n, cur;          /* threads of a block; the fiber running */
    unsigned gx, cx, cy; /* grid width, the block running */
    emu_ctx sched;
    fiber f[EMU_MAX_THREADS];
    float slot[2][EMU_MAX_THREADS];
    unsigned slot_of[2][EMU_MAX_THREADS]; /* which shuffle (or mma) wrote the slot */
    /* an mma's fragments and input type, by slot set */
    uint32_t mma_a[2][EMU_MAX_THREADS][4], mma_b[2][EMU_MAX_THREADS][2];
    int mma_f16[2][EMU_MAX_THREADS];
    int rq[EMU_MAX_THREADS], rq_head, rq_len; /* runnable fibers, in order */
    int live, at_sync;                        /* the block's threads not finished, at __syncthreads */
    int warp_live[EMU_MAX_THREADS / EMU_WARP], warp_at[EMU_MAX_THREADS / EMU_WARP]; /* per warp: live, at a shuffle */
    unsigned char *stacks;
    char misaligned[160]; /* the launch's first misaligned access ("": none) */
    bool misaligned_said; /* printed (once a launch) */
#ifdef EMU_ASAN
    void *sched_fake_stack;
    const void *sched_bottom;
    size_t sched_size;
#endif
} E = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void fiber_main(void);
#ifdef EMU_ASAN
#define FAKE_STACK(f) (&(f)->fake_stack)
#else
#define FAKE_STACK(f) NULL
#endif

#if defined(__x86_64__)
/* A fresh context on stack [lo, lo + size) that emu_switch resumes into fiber_main: below the 16-byte
 * aligned top, a zero (fiber_main never returns), fiber_main's address for emu_switch's ret (at an
 * address == 0 mod 16, so fiber_main starts as if called), and six zero registers. */
static void ctx_make(emu_ctx *c, unsigned char *lo, size_t size) {
    uintptr_t top = ((uintptr_t)(lo + size)) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)top;
    *--sp = 0;
    *--sp = (uint64_t)(uintptr_t)fiber_main;
    for (int i = 0; i < 6; i++) *--sp = 0;
    c->sp = sp;
}
static void ctx_swap(emu_ctx *from, emu_ctx *to) { hr_emu_switch(&from->sp, to->sp); }
#else
static void ctx_make(emu_ctx *c, unsigned char *lo, size_t size) {
    getcontext(c);
    c->uc_stack.ss_sp = lo;
    c->uc_stack.ss_size = size;
    c->uc_link = NULL;
    makecontext(c, fiber_main, 0);
}
static void ctx_swap(emu_ctx *from, emu_ctx *to) { swapcontext(from, to); }
#endif

int hr_emu_tid_x(void) { return E.cur; }
int hr_emu_ntid_x(void) { return E.n; }
int hr_emu_ctaid_x(void) { return (int)E.cx; }
int hr_emu_ctaid_y(void) { return (int)E.cy; }
int hr_emu_nctaid_x(void) { return (int)E.gx; }

/* the running fiber gives the CPU back to the scheduler in state s */
/* ---- scheduling: a queue of runnable fibers; a fiber that waits or finishes hands the CPU straight
 * to the next one (the scheduler's own context only when none is runnable) ---------------------------- */

static void rq_push(int i) {
    E.rq[(E.rq_head + E.rq_len) % E.n] = i;
    E.rq_len++;
}
/* at the front: released threads run next, so a warp that shuffles runs to its end before the next
 * warp starts, and the stacks being switched between stay in the cache */
static void rq_push_front(int i) {
    E.rq_head = (E.rq_head + E.n - 1) % E.n;
    E.rq[E.rq_head] = i;
    E.rq_len++;
}
static int rq_pop(void) {
    if (E.rq_len == 0) return -1;
    int i = E.rq[E.rq_head];
    E.rq_head = (E.rq_head + 1) % E.n;
    E.rq_len--;
    return i;
}

/* the barrier(s) i's arrival or exit may have completed: every live thread of the block at
 * __syncthreads, or every live lane of i's warp at a shuffle; their threads go back to the queue */
static void release(int i) {
    if (E.live > 0 && E.at_sync == E.live) {
        for (int j = 0; j < E.n; j++)
            if (E.f[j].state == F_SYNC) E.f[j].state = F_RUN, rq_push(j);
        E.at_sync = 0;
    }
    int w = i / EMU_WARP;
    if (E.warp_live[w] > 0 && E.warp_at[w] == E.warp_live[w]) {
        int end = (w + 1) * EMU_WARP < E.n ? (w + 1) * EMU_WARP : E.n;
        for (int j = end - 1; j >= w * EMU_WARP; j--) /* lane order at the front */
            if (E.f[j].state == F_SHFL) E.f[j].state = F_RUN, rq_push_front(j);
        E.warp_at[w] = 0;
    }
}

/* from the running fiber (save: where its context goes; NULL for one that is over) to the next runnable,
 * or to the scheduler when none is */
static void switch_away(emu_ctx *save, void **fake_stack) {
    int next = rq_pop();
    emu_ctx *to = next >= 0 ? &E.f[next].ctx : &E.sched;
#ifdef EMU_ASAN
    if (next >= 0)
        __sanitizer_start_switch_fiber(fake_stack, E.stacks + (size_t)next * EMU_STACK, EMU_STACK);
    else
        __sanitizer_start_switch_fiber(fake_stack, E.sched_bottom, E.sched_size);
#else
    (void)fake_stack;
#endif
    if (next >= 0) E.cur = next;
    emu_ctx dead;
    ctx_swap(save ? save : &dead, to);
}

static void yield(int s) {
    int i = E.cur;
    fiber *me = &E.f[i];
    me->state = s;
    if (s == F_SYNC)
        E.at_sync++;
    else
        E.warp_at[i / EMU_WARP]++;
    release(i);
    switch_away(&me->ctx, FAKE_STACK(me));
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

/* a 16-bit input of the mma as f32, exactly: bf16 is f32's upper half; f16 by its fields */
static float mma_in(uint32_t h, int f16) {
    if (!f16) {
        uint32_t bits = h << 16;
        float f;
        memcpy(&f, &bits, sizeof f);
        return f;
    }
    const int e = (int)((h >> 10) & 0x1fu), m = (int)(h & 0x3ffu);
    float v = e == 0x1f ? (m ? NAN : INFINITY) : e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m | 0x400), e - 25);
    return (h & 0x8000u) ? -v : v;
}

/* mma.m16n8k16 with 16-bit inputs, as the PTX ISA lays out its fragments (g = lane / 4, q = lane % 4):
 * A (16 x 16): register i of lane l holds row g + 8 (i % 2), k 2q + 8 (i / 2), the low half the even k;
 * B (16 x 8): register i holds k 2q + 8i (low half) and 2q + 8i + 1, column g; D (16 x 8 f32): element i
 * is row g + 8 (i / 2), column 2q + i % 2. Each lane deposits its A and B and waits for its warp (the
 * shuffle's slots and barrier); then it reads the rows and columns its D needs from the lanes that
 * hold them and adds their products to d in f32, k in order (the products are exact in f32). */
void hr_emu_mma_16816(float *d, const unsigned *a, const unsigned *b, int f16) {
    int t = E.cur;
    fiber *me = &E.f[t];
    unsigned set = me->shuffles & 1u;
    memcpy(E.mma_a[set][t], a, sizeof E.mma_a[set][t]);
    memcpy(E.mma_b[set][t], b, sizeof E.mma_b[set][t]);
    E.mma_f16[set][t] = f16;
    E.slot_of[set][t] = me->shuffles;
    yield(F_SHFL);
    const int w0 = t & ~(EMU_WARP - 1), lane = t - w0, g = lane / 4, q = lane % 4;
    bool whole = w0 + EMU_WARP <= E.n;
    for (int l = 0; whole && l < EMU_WARP; l++)
        whole = E.slot_of[set][w0 + l] == me->shuffles && E.mma_f16[set][w0 + l] == f16;
    me->shuffles++;
    if (!whole) {
        for (int i = 0; i < 4; i++) d[i] = NAN;
        return;
    }
    float A[2][16], B[2][16]; /* rows g, g + 8 of A; columns 2q, 2q + 1 of B */
    for (int k = 0; k < 16; k++) {
        const int kq = (k % 8) / 2, half = 16 * (k % 2);
        for (int r = 0; r < 2; r++) { /* row g + 8r: lane 4g + kq, register r + 2 (k / 8) */
            uint32_t word = E.mma_a[set][w0 + 4 * g + kq][r + 2 * (k / 8)];
            A[r][k] = mma_in((word >> half) & 0xffffu, f16);
        }
        for (int c = 0; c < 2; c++) { /* column n = 2q + c: lane 4n + kq, register k / 8 */
            uint32_t word = E.mma_b[set][w0 + 4 * (2 * q + c) + kq][k / 8];
            B[c][k] = mma_in((word >> half) & 0xffffu, f16);
        }
    }
    for (int i = 0; i < 4; i++) {
        float s = d[i];
        for (int k = 0; k < 16; k++) s += A[i / 2][k] * B[i % 2][k];
        d[i] = s;
    }
}

void hr_emu_misaligned(const void *p, int align) {
    if (!E.misaligned[0])
        snprintf(E.misaligned, sizeof E.misaligned,
                 "block (%u, %u) thread %d: a %d-byte access at %p, not %d-byte aligned (a GPU faults: misaligned "
                 "address)",
                 E.cx, E.cy, E.cur, align, p, align);
    /* said at once too: a typed vector access (the GEMM's f32x4) may fault on the host itself next */
    if (!E.misaligned_said) fprintf(stderr, "emulated CUDA launch: %s\n", E.misaligned), E.misaligned_said = true;
}

static void fiber_main(void) {
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(NULL, NULL, NULL);
#endif
    E.fn(E.params);
    int i = E.cur;
    E.f[i].state = F_DONE;
    E.live--;
    E.warp_live[i / EMU_WARP]--;
    release(i);              /* finished threads count as arrived */
    switch_away(NULL, NULL); /* never resumed */
}

/* Runs block (cx, cy); false on a barrier that can never open. */
static bool run_block(char *why, size_t why_len) {
    E.rq_head = E.rq_len = 0;
    E.live = E.n;
    E.at_sync = 0;
    for (int w = 0; w * EMU_WARP < E.n; w++) {
        E.warp_at[w] = 0;
        E.warp_live[w] = (w + 1) * EMU_WARP < E.n ? EMU_WARP : E.n - w * EMU_WARP;
    }
    for (int i = 0; i < E.n; i++) {
        fiber *f = &E.f[i];
        /* the tops staggered by 64 bytes times a spread of i: stacks a power of two apart would put every
         * fiber's top in one cache set */
#ifdef EMU_ASAN
        /* a fiber that finished never returned through its frames: their redzones are still poisoned
         * where the next block's fiber builds its own (a write there would be a false report) */
        ASAN_UNPOISON_MEMORY_REGION(E.stacks + (size_t)i * EMU_STACK, EMU_STACK);
#endif
        ctx_make(&f->ctx, E.stacks + (size_t)i * EMU_STACK, EMU_STACK - (size_t)((i * 37) % 64) * 64);
        f->state = F_RUN;
        f->shuffles = 0;
        E.slot_of[0][i] = E.slot_of[1][i] = ~0u;
        rq_push(i);
    }
    /* the fibers run one another until none is runnable: then every one is done, or they wait at
     * barriers that cannot open */
    E.cur = rq_pop();
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(&E.sched_fake_stack, E.stacks + (size_t)E.cur * EMU_STACK, EMU_STACK);
#endif
    ctx_swap(&E.sched, &E.f[E.cur].ctx);
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(E.sched_fake_stack, &E.sched_bottom, &E.sched_size);
#endif
    if (E.live == 0) return true;
    int s = 0, w = 0;
    for (int i = 0; i < E.n; i++) {
        s += E.f[i].state == F_SYNC;
        w += E.f[i].state == F_SHFL;
    }
    snprintf(why, why_len,
             "block (%u, %u): %d threads wait at __syncthreads and %d at a warp shuffle, %d finished: a barrier "
             "that never opens",
             E.cx, E.cy, s, w, E.n - E.live);
    return false;
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
    E.gx = gx;
    E.misaligned[0] = 0;
    E.misaligned_said = false;
    int rc = 0;
    for (unsigned y = 0; y < gy && !rc; y++)
        for (unsigned x = 0; x < gx && !rc; x++) {
            E.cx = x;
            E.cy = y;
            if (!run_block(why, why_len))
                rc = 1;
            else if (E.misaligned[0]) /* the block ran; the GPU's would have stopped at the fault */
                rc = 2, snprintf(why, why_len, "%s", E.misaligned);
        }
    pthread_mutex_unlock(&E.mu);
    return rc;
}

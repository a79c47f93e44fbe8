/* fault.c: the fault build's counters and the wrappers that consult them (see fault.h). Compiled to
 * nothing unless HR_FAULT is set. */
#include "common/fault.h"

#if HR_FAULT
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/types.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

/* The one mutable global state in the code base, fault build only: per point, whether armed, the
 * calls counted and the call that fails. */
static struct {
    atomic_bool armed;
    atomic_long calls, nth;
    atomic_bool fired;
} g_fault[HR_FAULT_N_POINTS];

void hr_fault_arm(hr_fault_point p, long nth) {
    atomic_store(&g_fault[p].armed, false);
    atomic_store(&g_fault[p].calls, 0);
    atomic_store(&g_fault[p].nth, nth);
    atomic_store(&g_fault[p].fired, false);
    atomic_store(&g_fault[p].armed, true);
}

void hr_fault_disarm(hr_fault_point p) { atomic_store(&g_fault[p].armed, false); }
long hr_fault_calls(hr_fault_point p) { return atomic_load(&g_fault[p].calls); }
bool hr_fault_fired(hr_fault_point p) { return atomic_load(&g_fault[p].fired); }

bool hr_fault_hit(hr_fault_point p) {
    if (!atomic_load(&g_fault[p].armed)) return false;
    long n = atomic_fetch_add(&g_fault[p].calls, 1) + 1;
    if (n != atomic_load(&g_fault[p].nth)) return false;
    atomic_store(&g_fault[p].fired, true);
#if defined(__SANITIZE_ADDRESS__)
    /* HR_FAULT_TRACE=1: where the failed call came from (to find what mishandled it) */
    if (getenv("HR_FAULT_TRACE")) __sanitizer_print_stack_trace();
#endif
    return true;
}

const char *hr_fault_point_name(hr_fault_point p) {
    static const char *const names[HR_FAULT_N_POINTS] = {"alloc", "swap-write", "swap-read", "socket-write"};
    return (unsigned)p < HR_FAULT_N_POINTS ? names[p] : "?";
}

/* ---- allocation: the linker sends headroom's calls here (-Wl,--wrap=malloc,...) --------------- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t align, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);
void *__wrap_aligned_alloc(size_t align, size_t n);

void *__wrap_malloc(size_t n) { return hr_fault_hit(HR_FAULT_ALLOC) ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t size) { return hr_fault_hit(HR_FAULT_ALLOC) ? NULL : __real_calloc(n, size); }
void *__wrap_realloc(void *p, size_t n) { return hr_fault_hit(HR_FAULT_ALLOC) ? NULL : __real_realloc(p, n); }
void *__wrap_aligned_alloc(size_t align, size_t n) {
    return hr_fault_hit(HR_FAULT_ALLOC) ? NULL : __real_aligned_alloc(align, n);
}

/* ---- socket writes: these definitions interpose libc's for libmicrohttpd too ------------------ */

ssize_t send(int fd, const void *buf, size_t n, int flags) {
    static ssize_t (*real)(int, const void *, size_t, int);
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "send");
    if (hr_fault_hit(HR_FAULT_SOCKET_WRITE)) {
        errno = EIO;
        return -1;
    }
    return real(fd, buf, n, flags);
}

ssize_t sendmsg(int fd, const struct msghdr *msg, int flags) {
    static ssize_t (*real)(int, const struct msghdr *, int);
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "sendmsg");
    if (hr_fault_hit(HR_FAULT_SOCKET_WRITE)) {
        errno = EIO;
        return -1;
    }
    return real(fd, msg, flags);
}
#endif

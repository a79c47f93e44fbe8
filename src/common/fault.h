/* fault.h: fault injection for the fault build (cmake -DHR_FAULT=ON, `make faults`). It fails the Nth
 * call at one of four points so that a test can walk N over every call a workload makes:
 *   HR_FAULT_ALLOC        malloc, calloc, realloc, aligned_alloc made by headroom's code (the linker
 *                         wraps them: -Wl,--wrap=...; libc's own and shared libraries' are not counted)
 *   HR_FAULT_SWAP_WRITE   a block write to the swap tier's file (kv/swap.c)
 *   HR_FAULT_SWAP_READ    a block read back from it
 *   HR_FAULT_SOCKET_WRITE send/sendmsg, as libmicrohttpd writes responses (interposed by symbol)
 * A failed allocation returns NULL; a failed swap or socket write returns -1 with errno EIO.
 *
 * The counters are process-wide: this module is THE one place that owns mutable global state, and it
 * exists only in the fault build (HR_FAULT=1); in every other build the hooks compile to nothing and
 * the functions below are absent. Counting and arming are atomic (any thread). */
#ifndef HR_COMMON_FAULT_H
#define HR_COMMON_FAULT_H

#include <stdbool.h>

typedef enum hr_fault_point {
    HR_FAULT_ALLOC = 0,
    HR_FAULT_SWAP_WRITE = 1,
    HR_FAULT_SWAP_READ = 2,
    HR_FAULT_SOCKET_WRITE = 3,
} hr_fault_point;
#define HR_FAULT_N_POINTS 4

#if HR_FAULT
/* Starts counting calls at point p from zero; the nth one (1-based) fails, and only that one. nth 0
 * counts without failing. */
void hr_fault_arm(hr_fault_point p, long nth);
/* Stops counting at p (calls pass and are not counted). */
void hr_fault_disarm(hr_fault_point p);
/* Calls counted at p since it was armed; whether the armed call has failed. */
long hr_fault_calls(hr_fault_point p);
bool hr_fault_fired(hr_fault_point p);
/* Counts one call at p; true when this call must fail. */
bool hr_fault_hit(hr_fault_point p);
const char *hr_fault_point_name(hr_fault_point p);
#define HR_FAULT_HIT(p) hr_fault_hit(p)
#else
#define HR_FAULT_HIT(p) false
#endif

#endif

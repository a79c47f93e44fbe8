/* watchdog.h: no-progress watchdogs for the tests that run the engine on its own thread, so a hang
 * fails the test in seconds with what it was waiting for, instead of running into ctest's timeout.
 * Header-only (static functions). */
#ifndef HR_TESTS_WATCHDOG_H
#define HR_TESTS_WATCHDOG_H

#include <stdio.h>
#include <unistd.h>

#include "common/util.h"
#include "engine/engine.h"

/* Seconds without a new token or a final state after which a request counts as hung. */
#define HR_WATCHDOG_S 30.0

/* Waits until r has output to read or is final; a request that shows neither for HR_WATCHDOG_S
 * seconds ends the test process (exit 1) with `what` named. */
static inline void hr_watchdog_wait(hr_request *r, const char *what) {
    if (hr_request_wait(r, HR_WATCHDOG_S)) return;
    fprintf(stderr, "watchdog: %s made no progress for %.0f s (no token, not final): the engine hangs\n", what,
            HR_WATCHDOG_S);
    fflush(stderr);
    _exit(1);
}

/* Waits until r is final (polling its stats every 2 ms, without reading its output); each new token
 * resets the watchdog. */
static inline void hr_watchdog_wait_done(hr_request *r, const char *what) {
    int last = -1;
    double t0 = hr_time_now();
    for (;;) {
        hr_request_stats s;
        hr_request_get_stats(r, &s);
        if (s.state == HR_REQ_COMPLETED || s.state == HR_REQ_CANCELLED || s.state == HR_REQ_FAILED) return;
        if (s.n_output != last) last = s.n_output, t0 = hr_time_now();
        if (hr_time_now() - t0 > HR_WATCHDOG_S) {
            fprintf(stderr, "watchdog: %s made no progress for %.0f s (state %s, %d tokens): the engine hangs\n", what,
                    HR_WATCHDOG_S, hr_request_state_name(s.state), s.n_output);
            fflush(stderr);
            _exit(1);
        }
        usleep(2000);
    }
}

#endif

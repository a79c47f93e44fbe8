/* util.h: small helpers every module may use: sizes with units, a seeded RNG held by its owner,
 * a monotonic clock, checked allocation arithmetic. No global state. */
#ifndef HR_COMMON_UTIL_H
#define HR_COMMON_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Parses "123", "64K", "64KiB", "1.5G", "512MiB" (K/M/G/T are powers of 1024, as in --kv-budget;
 * "KB"/"MB"/"GB" are also read as powers of 1024 because that is what users of llama.cpp/vLLM mean).
 * On error sets err naming the text. */
hr_status hr_parse_size(const char *text, uint64_t *out_bytes, hr_error *err);

/* Writes "1.50 GiB", "64.0 MiB", "512 B" into buf. Returns buf. */
char *hr_format_size(uint64_t bytes, char *buf, size_t buf_len);

/* A small deterministic RNG (SplitMix64 seeding a xoshiro256**). The owner keeps the state. */
typedef struct hr_rng {
    uint64_t s[4];
} hr_rng;
void hr_rng_seed(hr_rng *rng, uint64_t seed);
uint64_t hr_rng_next(hr_rng *rng);
double hr_rng_uniform(hr_rng *rng); /* in [0, 1) with 53 bits */
float hr_rng_normal(hr_rng *rng);   /* standard normal (Box-Muller) */

/* Seconds from a monotonic clock. */
double hr_time_now(void);
/* The CLOCK_REALTIME instant timeout_ms from now, for pthread_cond_timedwait. */
struct timespec hr_deadline_after_ms(int timeout_ms);

/* SplitMix64's finalizer: a bijective 64-bit mix (every input bit reaches every output bit), for
 * hashes (the prefix cache's chain, the Redis tier's keys) and the RNG's seeding. */
static inline uint64_t hr_mix64(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The p-th percentile (0..100) of sorted[0..n-1] (ascending), interpolating linearly between the
 * closest ranks (rank = p/100 * (n - 1), numpy's default); n == 0 gives -1. `headroom bench` and the
 * planner's simulator both use it, so that their figures compare. */
double hr_percentile(const double *sorted, int n, double p);

/* The whole memory pages inside [p, p + n): the first one's address in *first, their bytes returned (0:
 * the range holds no whole page). What madvise may give back of a range without touching its ends. */
uint64_t hr_page_span(const void *p, uint64_t n, uintptr_t *first);

/* a*b and a+b that report overflow instead of wrapping. */
static inline bool hr_mul_overflows(uint64_t a, uint64_t b, uint64_t *out) { return __builtin_mul_overflow(a, b, out); }
static inline bool hr_add_overflows(uint64_t a, uint64_t b, uint64_t *out) { return __builtin_add_overflow(a, b, out); }

#define HR_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define HR_MIN(a, b)    ((a) < (b) ? (a) : (b))
#define HR_MAX(a, b)    ((a) > (b) ? (a) : (b))

#endif

/* util.c: sizes, RNG, clock (see util.h). */
#include "common/util.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

hr_status hr_parse_size(const char *text, uint64_t *out_bytes, hr_error *err) {
    if (!text || !*text) return hr_error_set(err, HR_ERR_INVALID_ARG, "empty size (expected e.g. 512MiB)");
    char *end = NULL;
    double v = strtod(text, &end);
    if (end == text || !(v >= 0) || !isfinite(v))
        return hr_error_set(err, HR_ERR_INVALID_ARG, "size '%s' is not a number (expected e.g. 512MiB, 2G)", text);
    double mult = 1;
    const char *suf = end;
    if (*suf) {
        char c = (char)toupper((unsigned char)*suf);
        int power = 0;
        switch (c) {
        case 'B': power = 0; break;
        case 'K': power = 1; break;
        case 'M': power = 2; break;
        case 'G': power = 3; break;
        case 'T': power = 4; break;
        default: power = -1;
        }
        const char *rest = suf + 1;
        if (power > 0) {
            if (strcasecmp(rest, "") && strcasecmp(rest, "iB") && strcasecmp(rest, "B")) power = -1;
        } else if (power == 0 && *rest) {
            power = -1;
        }
        if (power < 0)
            return hr_error_set(err, HR_ERR_INVALID_ARG,
                                "size '%s' has an unknown unit '%s' (use B, K, M, G, T, KiB, MiB, GiB)", text, suf);
        for (int i = 0; i < power; i++) mult *= 1024.0;
    }
    double bytes = v * mult;
    if (bytes >= 18446744073709551615.0) return hr_error_set(err, HR_ERR_RANGE, "size '%s' is too large", text);
    *out_bytes = (uint64_t)bytes;
    return HR_OK;
}

char *hr_format_size(uint64_t bytes, char *buf, size_t buf_len) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, buf_len, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, buf_len, "%.*f %s", v < 10 ? 2 : 1, v, units[u]);
    return buf;
}

static uint64_t splitmix64(uint64_t *x) { return hr_mix64(*x += 0x9e3779b97f4a7c15ULL); }

void hr_rng_seed(hr_rng *rng, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t hr_rng_next(hr_rng *rng) {
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double hr_rng_uniform(hr_rng *rng) { return (double)(hr_rng_next(rng) >> 11) * 0x1.0p-53; }

float hr_rng_normal(hr_rng *rng) {
    double u1 = hr_rng_uniform(rng), u2 = hr_rng_uniform(rng);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

struct timespec hr_deadline_after_ms(int timeout_ms) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += timeout_ms / 1000;
    t.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) t.tv_sec++, t.tv_nsec -= 1000000000L;
    return t;
}

double hr_percentile(const double *sorted, int n, double p) {
    if (n <= 0) return -1;
    if (p <= 0) return sorted[0];
    if (p >= 100) return sorted[n - 1];
    double rank = p / 100.0 * (double)(n - 1);
    int lo = (int)rank;
    double frac = rank - (double)lo;
    if (lo + 1 >= n) return sorted[n - 1];
    return sorted[lo] + (sorted[lo + 1] - sorted[lo]) * frac;
}

double hr_time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint64_t hr_page_span(const void *p, uint64_t n, uintptr_t *first) {
    long ps = sysconf(_SC_PAGESIZE);
    uintptr_t page = ps > 0 ? (uintptr_t)ps : 4096u, a = (uintptr_t)p;
    uintptr_t lo = (a + page - 1) / page * page, end = (a + (uintptr_t)n) / page * page;
    *first = lo;
    return end > lo ? (uint64_t)(end - lo) : 0;
}

/* scan.c: scan.h's portable passes, and whether the AVX2 ones can run here. */
#include "sampler/scan.h"

#include <math.h>
#include <stddef.h>

/* The best value is kept in a register: comparing against logits[best] made each step wait for the
 * load through the previous step's index, ~3 ns an element (0.7 ms a token over gpt-oss's 201088). */
int32_t hr_scan_argmax_ref(const float *x, int n) {
    int best = 0;
    float bv = n > 0 ? x[0] : 0.0f;
    for (int i = 1; i < n; i++)
        if (x[i] > bv) bv = x[i], best = i;
    return best;
}

int hr_scan_above_ref(const float *x, int from, int n, float t) {
    for (int i = from; i < n; i++)
        if (x[i] > t) return i;
    return n;
}

float hr_scan_chunk_floor_ref(const float *x, int k, int cs) {
    float floor = 0.0f;
    for (int c = 0; c < k; c++) {
        const float m = hr_scan_max_ref(x + (size_t)c * (size_t)cs, cs);
        if (c == 0 || m < floor) floor = m;
    }
    return floor;
}

int hr_scan_collect_ref(const float *x, int n, float t, hr_scan_cand *out) {
    int m = 0;
    for (int i = 0; i < n; i++)
        if (x[i] >= t) out[m++] = (hr_scan_cand){.logit = x[i], .id = i};
    return m;
}

float hr_scan_max_ref(const float *x, int n) {
    float m = -INFINITY;
    for (int i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

double hr_scan_sum_exp_ref(const float *x, int n, float m) {
    double sum = 0;
    for (int i = 0; i < n; i++)
        if (x[i] == x[i]) sum += exp((double)x[i] - m);
    return sum;
}

bool hr_scan_has_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); /* the exp's fmadd */
#else
    return false;
#endif
}

/* scan.c: scan.h's portable passes, and whether the AVX2 ones can run here. */
#include "sampler/scan.h"

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

bool hr_scan_has_avx2(void) {
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_cpu_supports("avx2");
#else
    return false;
#endif
}

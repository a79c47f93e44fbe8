/* scan.h: the sampler's two passes over a row of logits, portable and AVX2 (scan_avx2.c), with the same
 * results: which index, never a rounding (they only compare). sampler.c picks AVX2 where the CPU has
 * it; the tests compare both on the same rows. Private to src/sampler. */
#ifndef HR_SAMPLER_SCAN_H
#define HR_SAMPLER_SCAN_H

#include <stdbool.h>
#include <stdint.h>

/* hr_argmax's contract (sampler.h): the lowest index of the largest value, NaN never chosen, 0 where
 * x[0] is NaN (the running maximum starts there and no comparison beats it) or n < 1 */
int32_t hr_scan_argmax_ref(const float *x, int n);
int32_t hr_scan_argmax_avx2(const float *x, int n);

/* The first i in [from, n) with x[i] > t (NaN never is), or n: top-k's "does this logit enter the
 * heap" test, whose threshold t (the heap's worst) only rises between calls */
int hr_scan_above_ref(const float *x, int from, int n, float t);
int hr_scan_above_avx2(const float *x, int from, int n, float t);

/* Whether this CPU runs the AVX2 builds (and the OS saves their registers). */
bool hr_scan_has_avx2(void);

#endif

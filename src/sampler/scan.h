/* scan.h: the sampler's passes over a row of logits, portable and AVX2 (scan_avx2.c): the ones that
 * choose (argmax, max, top-k's floor, collection and next entrant) only compare, so both builds give
 * the same results; the sum of exp for logprobs differs in its last bits (stated below). sampler.c
 * picks AVX2 where the CPU has it; the tests compare both on the same rows. Private to src/sampler. */
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

/* A candidate token: top-k's unit (sampler.c orders them by logit, then id). */
typedef struct hr_scan_cand {
    float logit;
    int32_t id;
} hr_scan_cand;

/* The smallest of the maxima of k chunks of cs floats (x[c cs, (c + 1) cs) for c < k; cs a multiple of
 * 8, k cs <= n), NaN left out of each maximum (a chunk of NaN alone: -inf). Each maximum is an element
 * of its own chunk, so k elements are >= it and so is x's k-th largest value: top-k needs no element
 * below it. */
float hr_scan_chunk_floor_ref(const float *x, int k, int cs);
float hr_scan_chunk_floor_avx2(const float *x, int k, int cs);

/* (x[i], i) for every i in [0, n) with x[i] >= t (NaN never), in order of i, into out; how many */
int hr_scan_collect_ref(const float *x, int n, float t, hr_scan_cand *out);
int hr_scan_collect_avx2(const float *x, int n, float t, hr_scan_cand *out);

/* The largest of x[0, n), NaN left out (-inf where there is none but NaN, or n < 1) */
float hr_scan_max_ref(const float *x, int n);
float hr_scan_max_avx2(const float *x, int n);

/* The sum over x[0, n) of exp(x[i] - m), m finite and >= each x[i] (hr_scan_max's): logprobs'
 * normalizer. NaN adds nothing. The portable one in double; the AVX2 one with common/exp_avx2.h's float
 * exp (about 1 ulp a term; a term below exp(-87.3), and NaN, as exp(-87.3), 1.2e-38, against a sum of
 * at least 1) summed in double: the same sum to about 1e-7 relative, not bit for bit. */
double hr_scan_sum_exp_ref(const float *x, int n, float m);
double hr_scan_sum_exp_avx2(const float *x, int n, float m);

/* Whether this CPU runs the AVX2 builds: AVX2 and FMA (and the OS saves their registers). */
bool hr_scan_has_avx2(void);

#endif

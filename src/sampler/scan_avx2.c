/* scan_avx2.c: scan.h's passes with 8-float compares. argmax: the largest value first (max_ps keeps
 * its second operand where the first is NaN, so NaN never enters the maximum), then the first index
 * holding it: two reads of a row that stays in L2 (512 KiB at 128256 floats), against the scalar
 * loop's one compare-and-branch chain through every element. above: 32 floats a compare, the scalar
 * tail for the rest. */
#include <immintrin.h>
#include <math.h>

#include "common/exp_avx2.h"
#include "sampler/scan.h"

static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

int32_t hr_scan_argmax_avx2(const float *x, int n) {
    if (n < 1 || x[0] != x[0]) return 0;
    const float best = hr_scan_max_avx2(x, n); /* x[0] is a number: the maximum is one of the elements */
    /* the first index equal to it (+0 and -0 are equal, as they are to the scalar loop's >) */
    const __m256 b = _mm256_set1_ps(best);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const int mk = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), b, _CMP_EQ_OQ));
        if (mk) return i + __builtin_ctz((unsigned)mk);
    }
    for (; i < n; i++)
        if (x[i] == best) return i;
    return 0; /* not reached: best is one of the elements */
}

int hr_scan_above_avx2(const float *x, int from, int n, float t) {
    const __m256 tv = _mm256_set1_ps(t);
    int i = from;
    for (; i + 32 <= n; i += 32) {
        const __m256 a = _mm256_cmp_ps(_mm256_loadu_ps(x + i), tv, _CMP_GT_OQ),
                     b = _mm256_cmp_ps(_mm256_loadu_ps(x + i + 8), tv, _CMP_GT_OQ),
                     c = _mm256_cmp_ps(_mm256_loadu_ps(x + i + 16), tv, _CMP_GT_OQ),
                     d = _mm256_cmp_ps(_mm256_loadu_ps(x + i + 24), tv, _CMP_GT_OQ);
        if (_mm256_movemask_ps(_mm256_or_ps(_mm256_or_ps(a, b), _mm256_or_ps(c, d))) == 0) continue;
        const __m256 v[4] = {a, b, c, d};
        for (int k = 0; k < 4; k++) {
            const int mk = _mm256_movemask_ps(v[k]);
            if (mk) return i + 8 * k + __builtin_ctz((unsigned)mk);
        }
    }
    for (; i + 8 <= n; i += 8) {
        const int mk = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), tv, _CMP_GT_OQ));
        if (mk) return i + __builtin_ctz((unsigned)mk);
    }
    for (; i < n; i++)
        if (x[i] > t) return i;
    return n;
}

float hr_scan_chunk_floor_avx2(const float *x, int k, int cs) {
    float floor = 0.0f;
    for (int c = 0; c < k; c++) {
        const float m = hr_scan_max_avx2(x + (size_t)c * (size_t)cs, cs);
        if (c == 0 || m < floor) floor = m;
    }
    return floor;
}

int hr_scan_collect_avx2(const float *x, int n, float t, hr_scan_cand *out) {
    const __m256 tv = _mm256_set1_ps(t);
    int m = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        unsigned mk = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), tv, _CMP_GE_OQ));
        while (mk) {
            const int j = i + __builtin_ctz(mk);
            out[m++] = (hr_scan_cand){.logit = x[j], .id = j};
            mk &= mk - 1;
        }
    }
    for (; i < n; i++)
        if (x[i] >= t) out[m++] = (hr_scan_cand){.logit = x[i], .id = i};
    return m;
}

float hr_scan_max_avx2(const float *x, int n) {
    __m256 m0 = _mm256_set1_ps(-__builtin_inff()), m1 = m0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0); /* NaN in x: m0 kept */
        m1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), m1);
    }
    float m = hmax8(_mm256_max_ps(m0, m1));
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

double hr_scan_sum_exp_avx2(const float *x, int n, float m) {
    const __m256 mv = _mm256_set1_ps(m);
    __m256d s0 = _mm256_setzero_pd(), s1 = s0;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = hr_exp_neg8(_mm256_sub_ps(_mm256_loadu_ps(x + i), mv));
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, _mm256_add_pd(s0, s1));
    double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for (; i < n; i++)
        if (x[i] == x[i]) sum += exp((double)x[i] - m);
    return sum;
}

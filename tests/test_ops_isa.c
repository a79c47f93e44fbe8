/* test_ops_isa.c: the row-wise operations the kernels' table dispatches (today SwiGLU) give the
 * scalar reference's bits on AVX2, and the reference is the function it names. hr_avx2_swiglu against
 * hr_op_swiglu bit for bit for every length 0..70 (the 8-lane body and every tail) over random gates
 * of several scales and the edge values (+-0, the exp clamp at -87.3 and past it, +-inf, NaN); the
 * kernels' table picks it for AVX2 and AVX-512, the reference for --isa scalar; and hr_op_swiglu1 is
 * silu(g) u within 4 ulp-sized relative errors (2.5e-7 x 4) of the double formula g u / (1 + e^-g)
 * for |g| up to 80, no overflow to inf or NaN for finite gates down to -1e30 (and about 0 below -87.3,
 * -inf too), NaN kept. hr_exp_neg against
 * exp in double, 2 ulp relative, over [-87, 0]. Skipped (77) where the CPU lacks AVX2 for the bit
 * comparison only; the accuracy checks run everywhere. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backend/cpu/isa.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/kernels_internal.h"
#include "backend/cpu/ops.h"
#include "common/util.h"
#include "harness.h"

enum { NMAX = 70 };

static double rel(double got, double want) { return fabs(got - want) / (fabs(want) > 1e-30 ? fabs(want) : 1e-30); }

static void test_accuracy(hr_rng *rng) {
    double worst_exp = 0.0, worst_silu = 0.0;
    for (int i = 0; i <= 87000; i++) {
        const float x = -(float)i / 1000.0f;
        worst_exp = fmax(worst_exp, rel(hr_exp_neg(x), exp((double)x)));
    }
    CHECKF(worst_exp < 2.5e-7, "hr_exp_neg: worst relative error %g", worst_exp);
    for (int i = 0; i < 200000; i++) {
        const float g = (float)(hr_rng_uniform(rng) * 160.0 - 80.0), u = hr_rng_normal(rng);
        const double want = (double)g * u / (1.0 + exp(-(double)g));
        if (fabs(want) < 1e-30) continue;
        worst_silu = fmax(worst_silu, rel(hr_op_swiglu1(g, u), want));
    }
    CHECKF(worst_silu < 1e-6, "hr_op_swiglu1: worst relative error %g", worst_silu);
    const float big[] = {-1e30f, -1e6f, -1000.0f, -88.0f, -87.3f, -20.0f, 20.0f, 88.0f, 1e6f, 1e30f};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        const float v = hr_op_swiglu1(big[i], 1.0f);
        CHECKF(isfinite(v), "hr_op_swiglu1(%g) = %g", (double)big[i], (double)v);
        if (big[i] > 0.0f) CHECKF(v == big[i], "silu(%g) = %g, not g", (double)big[i], (double)v);
        if (big[i] < -90.0f) CHECKF(v <= 0.0f && v > -1e-35f, "silu(%g) = %g, not ~0", (double)big[i], (double)v);
    }
    CHECK(isnan(hr_op_swiglu1(NAN, 1.0f)) && isnan(hr_op_swiglu1(1.0f, NAN)));
    CHECK(hr_op_swiglu1(-INFINITY, 1.0f) <= 0.0f && hr_op_swiglu1(-INFINITY, 1.0f) > -1e-35f);
    CHECK(hr_op_swiglu1(0.0f, 3.0f) == 0.0f);
    CHECK(hr_op_swiglu1(1.0f, 1.0f) == (float)(1.0 / (1.0 + exp(-1.0))));
}

static void test_bits(hr_rng *rng) {
    static const float edge[] = {0.0f,   -0.0f,    -87.3f,    -87.29f, -87.31f, -88.0f,  -100.0f, 87.3f,
                                 100.0f, INFINITY, -INFINITY, NAN,     1e-30f,  -1e-30f, 3.4e38f, -3.4e38f};
    const float scales[] = {1e-3f, 1.0f, 8.0f, 40.0f};
    long compared = 0, bad = 0;
    for (int n = 0; n <= NMAX; n++)
        for (int rep = 0; rep < 12; rep++) {
            float g[NMAX] = {0}, u[NMAX] = {0}, a[NMAX], b[NMAX];
            for (int i = 0; i < n; i++) {
                g[i] = hr_rng_normal(rng) * scales[rep % 4];
                u[i] = hr_rng_normal(rng);
                if (rep >= 8 && i % 3 == 0) g[i] = edge[(i / 3 + rep) % (int)(sizeof edge / sizeof edge[0])];
            }
            memcpy(a, g, sizeof a);
            memcpy(b, g, sizeof b);
            hr_op_swiglu(a, u, n);
            hr_avx2_swiglu(b, u, n);
            compared += n;
            if (memcmp(a, b, (size_t)n * sizeof *a)) {
                bad++;
                for (int i = 0; i < n; i++)
                    if (memcmp(&a[i], &b[i], sizeof a[i]))
                        fprintf(stderr, "n=%d i=%d g=%a: scalar %a avx2 %a\n", n, i, (double)g[i], (double)a[i],
                                (double)b[i]);
            }
        }
    CHECKF(bad == 0, "hr_avx2_swiglu differs from hr_op_swiglu in %ld of the cases", bad);
    printf("swiglu: %ld values compared bit for bit\n", compared);

    hr_kernels k;
    const hr_cpu_features f = hr_cpu_detect();
    hr_kernels_init(&k, f, "scalar");
    CHECK(k.swiglu == hr_op_swiglu);
    hr_kernels_init(&k, f, "avx2");
    CHECK(k.swiglu == hr_avx2_swiglu);
    hr_kernels_init(&k, f, NULL);
    CHECK(k.swiglu == hr_avx2_swiglu);
}

int main(void) {
    hr_rng rng;
    hr_rng_seed(&rng, 29);
    test_accuracy(&rng);
    if (!hr_cpu_isa_has_avx2(hr_cpu_isa_select(NULL))) {
        printf("no AVX2+FMA+F16C here: no bits to compare (accuracy checked)\n");
        hr_test_finish();
        return 77;
    }
    test_bits(&rng);
    return hr_test_finish();
}

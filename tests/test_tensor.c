/* test_tensor.c: the type table, exact f16/bf16 conversions, and the reference quantizers and dots
 * on hand-computed blocks (values worked out from ggml's formulas). */
#include <math.h>
#include <string.h>

#include "common/util.h"
#include "harness.h"
#include "tensor/tensor.h"

static float bits_f(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void test_info(void) {
    CHECK(hr_dtype_get_info(HR_DTYPE_Q4_0)->block_bytes == 18);
    CHECK(hr_dtype_get_info(HR_DTYPE_Q8_0)->block_bytes == 34);
    CHECK(hr_dtype_get_info(HR_DTYPE_Q4_K)->block_bytes == 144);
    CHECK(hr_dtype_get_info(HR_DTYPE_Q5_K)->block_bytes == 176);
    CHECK(hr_dtype_get_info(HR_DTYPE_Q6_K)->block_bytes == 210);
    CHECK(hr_dtype_get_info(HR_DTYPE_Q8_K)->block_bytes == 292);
    CHECK(hr_dtype_get_info(HR_DTYPE_BF16)->block_bytes == 2);
    CHECK(hr_dtype_get_info(HR_DTYPE_F16)->vec_dot_type == HR_DTYPE_F32);
    CHECK(hr_dtype_get_info(HR_DTYPE_Q4_0)->vec_dot_type == HR_DTYPE_Q8_0);
    CHECK(hr_dtype_get_info(HR_DTYPE_Q6_K)->vec_dot_type == HR_DTYPE_Q8_K);
    CHECK(!strcmp(hr_dtype_get_info(HR_DTYPE_Q5_K)->name, "q5_K"));
    CHECK(hr_dtype_get_info((hr_dtype)3) == NULL); /* q4_1: not ours */
    CHECK(hr_dtype_get_info((hr_dtype)99) == NULL);
    CHECK(hr_dtype_supported(2) && hr_dtype_supported(30) && !hr_dtype_supported(15) && !hr_dtype_supported(7));
    CHECK(hr_dtype_row_bytes(HR_DTYPE_Q4_0, 4096) == 128 * 18);
    CHECK(hr_dtype_row_bytes(HR_DTYPE_F32, 7) == 28);
    CHECK(hr_dtype_row_bytes(HR_DTYPE_Q6_K, 512) == 420);
}

static void test_f16(void) {
    /* every non-nan half survives a round trip through f32 */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = hr_f16_to_f32((hr_f16)h);
        if (isnan(f)) {
            bad += !isnan(hr_f16_to_f32(hr_f32_to_f16(f)));
            continue;
        }
        bad += hr_f32_to_f16(f) != h;
    }
    CHECKF(bad == 0, "%d halves did not round-trip", bad);
    CHECK(hr_f16_to_f32(0x3C00) == 1.0f);
    CHECK(hr_f16_to_f32(0x0001) == ldexpf(1, -24));
    CHECK(hr_f16_to_f32(0xC000) == -2.0f);
    CHECK(hr_f32_to_f16(1.0f) == 0x3C00);
    CHECK(hr_f32_to_f16(65504.0f) == 0x7BFF);
    CHECK(hr_f32_to_f16(65519.99f) == 0x7BFF);
    CHECK(hr_f32_to_f16(65520.0f) == 0x7C00); /* halfway to the next (absent) value: to even = inf */
    CHECK(hr_f32_to_f16(-INFINITY) == 0xFC00);
    CHECK((hr_f32_to_f16(NAN) & 0x7C00) == 0x7C00 && (hr_f32_to_f16(NAN) & 0x3FF) != 0);
    CHECK(hr_f32_to_f16(1.0f + ldexpf(1, -11)) == 0x3C00);     /* tie -> even */
    CHECK(hr_f32_to_f16(1.0f + 3 * ldexpf(1, -11)) == 0x3C02); /* tie -> even (up) */
    CHECK(hr_f32_to_f16(1.0f + ldexpf(1, -11) + ldexpf(1, -20)) == 0x3C01);
    CHECK(hr_f32_to_f16(ldexpf(1, -25)) == 0x0000); /* subnormal tie -> even 0 */
    CHECK(hr_f32_to_f16(1.5f * ldexpf(1, -25)) == 0x0001);
    CHECK(hr_f32_to_f16(3 * ldexpf(1, -25)) == 0x0002);                 /* 1.5 ulp tie -> even 2 */
    CHECK(hr_f32_to_f16(-ldexpf(1, -14)) == 0x8400);                    /* smallest normal */
    CHECK(hr_f32_to_f16(ldexpf(1023, -24) + ldexpf(1, -25)) == 0x0400); /* rounds up into normal */
    CHECK(hr_f32_to_f16(1e-10f) == 0 && hr_f32_to_f16(-1e-10f) == 0x8000);
}

static void test_bf16(void) {
    CHECK(hr_f32_to_bf16(1.0f) == 0x3F80);
    CHECK(hr_f32_to_bf16(bits_f(0x3F808000)) == 0x3F80); /* tie -> even */
    CHECK(hr_f32_to_bf16(bits_f(0x3F818000)) == 0x3F82);
    CHECK(hr_f32_to_bf16(bits_f(0x3F808001)) == 0x3F81);
    CHECK(hr_f32_to_bf16(bits_f(0x7F7FFFFF)) == 0x7F80); /* max float rounds to inf */
    CHECK(hr_f32_to_bf16(NAN) != 0x7F80 && (hr_f32_to_bf16(NAN) & 0x7F80) == 0x7F80);
    CHECK(hr_bf16_to_f32(0xC040) == -3.0f);
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = hr_bf16_to_f32((hr_bf16)h);
        if (!isnan(f)) bad += hr_f32_to_bf16(f) != h;
    }
    CHECK(bad == 0);
}

static void test_q8_0_block(void) {
    float x[32], y[32];
    for (int j = 0; j < 32; j++) x[j] = (float)(j - 16);
    hr_block_q8_0 b;
    hr_quantize_row_ref(HR_DTYPE_Q8_0, x, &b, 32);
    /* amax 16: d = 16/127 = 0.125984..., as f16 0.125 * (1 + 8/1024) = 0x3008; q = round(x * 127/16) */
    CHECK(b.d == 0x3008);
    CHECK(b.qs[0] == -127 && b.qs[16] == 0 && b.qs[17] == 8 && b.qs[18] == 16 && b.qs[31] == 119);
    CHECK(b.qs[15] == -8 && b.qs[14] == -16);
    hr_dequantize_row_ref(HR_DTYPE_Q8_0, &b, y, 32);
    CHECK(y[0] == -127 * hr_f16_to_f32(0x3008) && y[17] == 8 * hr_f16_to_f32(0x3008));
    /* a tie: x = 2.5 * d with d = 1 exactly (amax 127) rounds away from zero */
    for (int j = 0; j < 32; j++) x[j] = 0;
    x[0] = 127;
    x[1] = 2.5f;
    x[2] = -2.5f;
    hr_quantize_row_ref(HR_DTYPE_Q8_0, x, &b, 32);
    CHECK(b.d == 0x3C00 && b.qs[0] == 127 && b.qs[1] == 3 && b.qs[2] == -3 && b.qs[3] == 0);
    /* all zero: d = 0, q = 0 */
    memset(x, 0, sizeof x);
    hr_quantize_row_ref(HR_DTYPE_Q8_0, x, &b, 32);
    CHECK(b.d == 0 && b.qs[7] == 0);
}

static void test_q4_0_block(void) {
    float x[32], y[32];
    /* x[0..15] = j - 8 (max magnitude -8: d = -8/-8 = 1), x[16+j] = j/2 - 4 */
    for (int j = 0; j < 16; j++) {
        x[j] = (float)(j - 8);
        x[16 + j] = 0.5f * (float)j - 4.0f;
    }
    hr_block_q4_0 b;
    hr_quantize_row_ref(HR_DTYPE_Q4_0, x, &b, 32);
    CHECK(b.d == 0x3C00);
    /* low nibble: trunc(j - 8 + 8.5) = j; high: trunc(j/2 + 4.5) */
    static const uint8_t hi[16] = {4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12};
    int bad = 0;
    for (int j = 0; j < 16; j++) bad += b.qs[j] != (uint8_t)(j | (hi[j] << 4));
    CHECK(bad == 0);
    hr_dequantize_row_ref(HR_DTYPE_Q4_0, &b, y, 32);
    CHECK(y[0] == -8 && y[15] == 7 && y[16] == -4 && y[17] == -3 && y[18] == -3 && y[31] == 4);

    /* positive max: x[5] = 16 comes first, so d = 16/-8 = -2; -16 clamps to q = 15 -> -14 */
    memset(x, 0, sizeof x);
    x[5] = 16;
    x[6] = -16;
    x[7] = -14;
    x[20] = 3;
    hr_quantize_row_ref(HR_DTYPE_Q4_0, x, &b, 32);
    CHECK(b.d == 0xC000); /* -2 */
    CHECK((b.qs[5] & 15) == 0 && (b.qs[6] & 15) == 15 && (b.qs[7] & 15) == 15 && (b.qs[0] & 15) == 8);
    CHECK((b.qs[4] >> 4) == 7); /* x[20] = 3: trunc(3 * -0.5 + 8.5) = 7 */
    hr_dequantize_row_ref(HR_DTYPE_Q4_0, &b, y, 32);
    CHECK(y[5] == 16 && y[6] == -14 && y[7] == -14 && y[0] == 0);
    /* zero block: d = 0 / -8 = -0 (0x8000, as ggml writes it) and every nibble 8 */
    memset(x, 0, sizeof x);
    hr_quantize_row_ref(HR_DTYPE_Q4_0, x, &b, 32);
    CHECK(b.d == 0x8000 && b.qs[0] == 0x88 && b.qs[15] == 0x88);
}

/* Round trips on random rows stay within half a step; ref dots equal the dot of dequantized rows. */
static void test_round_trip_and_dot(void) {
    hr_rng rng;
    hr_rng_seed(&rng, 7);
    enum { K = 256 };
    float x[K], y[K], a[K], aq[K];
    for (int i = 0; i < K; i++) x[i] = hr_rng_normal(&rng);
    for (int i = 0; i < K; i++) a[i] = hr_rng_normal(&rng);
    static const hr_dtype types[] = {HR_DTYPE_F32, HR_DTYPE_F16, HR_DTYPE_BF16, HR_DTYPE_Q8_0, HR_DTYPE_Q4_0};
    _Alignas(64) unsigned char wq[K * 4], act[K * 4];
    for (size_t ti = 0; ti < HR_ARRAY_LEN(types); ti++) {
        const hr_dtype t = types[ti];
        const hr_dtype_info *info = hr_dtype_get_info(t);
        hr_quantize_row_ref(t, x, wq, K);
        hr_dequantize_row_ref(t, wq, y, K);
        double max_err = 0, amax = 0;
        for (int i = 0; i < K; i++) {
            max_err = fmax(max_err, fabs(x[i] - y[i]));
            amax = fmax(amax, fabs(x[i]));
        }
        const double step = t == HR_DTYPE_Q8_0   ? amax / 127
                            : t == HR_DTYPE_Q4_0 ? amax / 8
                            : t == HR_DTYPE_BF16 ? amax * 0x1p-7
                            : t == HR_DTYPE_F16  ? amax * 0x1p-10
                                                 : 0;
        CHECKF(max_err <= 0.5 * step * 1.01 + 1e-7, "%s round trip error %g (step %g)", info->name, max_err, step);
        hr_quantize_row_ref(info->vec_dot_type, a, act, K);
        hr_dequantize_row_ref(info->vec_dot_type, act, aq, K);
        double want = 0, mag = 0;
        for (int i = 0; i < K; i++) {
            want += (double)y[i] * aq[i];
            mag += fabs((double)y[i] * aq[i]);
        }
        const float got = hr_vec_dot_ref(t, K, wq, act);
        CHECKF(fabs(got - want) <= 1e-5 * mag, "%s dot %g want %g", info->name, got, want);
    }
}

int main(void) {
    test_info();
    test_f16();
    test_bf16();
    test_q8_0_block();
    test_q4_0_block();
    test_round_trip_and_dot();
    return hr_test_finish();
}

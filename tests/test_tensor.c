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
    CHECK(hr_dtype_get_info(HR_DTYPE_F16)->vec_dot_type == HR_DTYPE_F16);
    CHECK(hr_dtype_get_info(HR_DTYPE_Q4_0)->vec_dot_type == HR_DTYPE_Q8_0);
    CHECK(hr_dtype_get_info(HR_DTYPE_Q6_K)->vec_dot_type == HR_DTYPE_Q8_K);
    CHECK(!strcmp(hr_dtype_get_info(HR_DTYPE_Q5_K)->name, "q5_K"));
    CHECK(hr_dtype_get_info((hr_dtype)3) == NULL); /* q4_1: not ours */
    CHECK(hr_dtype_get_info((hr_dtype)99) == NULL);
    CHECK(hr_dtype_supported(2) && hr_dtype_supported(30) && !hr_dtype_supported(15) && !hr_dtype_supported(3));
    /* q5_0 and q5_1: llama.cpp's fallbacks for q4_K / q5_K rows that are not whole super-blocks */
    CHECK(hr_dtype_supported(6) && hr_dtype_supported(7));
    CHECK(hr_dtype_get_info(HR_DTYPE_Q5_0)->block_bytes == 22 && hr_dtype_get_info(HR_DTYPE_Q5_1)->block_bytes == 24);
    CHECK(hr_dtype_get_info(HR_DTYPE_Q5_0)->vec_dot_type == HR_DTYPE_Q8_0 &&
          hr_dtype_get_info(HR_DTYPE_Q5_1)->vec_dot_type == HR_DTYPE_Q8_0);
    CHECK(hr_dtype_row_bytes(HR_DTYPE_Q5_0, 1408) == 44 * 22 && hr_dtype_row_bytes(HR_DTYPE_Q5_1, 896) == 28 * 24);
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

/* q5_0 / q5_1 blocks with known bytes, written from the format: element j < 16 is qs[j]'s low nibble
 * with qh bit j, element j + 16 the high nibble with qh bit j + 16. */
static void test_q5_blocks(void) {
    float x[32], y[32];
    /* q5_0: x[j] = j - 16 (max magnitude -16: d = 1), x[16 + j] = j: q = trunc(x + 16.5) = j, j + 16 */
    for (int j = 0; j < 16; j++) {
        x[j] = (float)(j - 16);
        x[16 + j] = (float)j;
    }
    hr_block_q5_0 b0;
    hr_quantize_row_ref(HR_DTYPE_Q5_0, x, &b0, 32);
    CHECK(b0.d == 0x3C00);
    CHECK(b0.qh[0] == 0 && b0.qh[1] == 0 && b0.qh[2] == 0xFF && b0.qh[3] == 0xFF);
    int bad = 0;
    for (int j = 0; j < 16; j++) bad += b0.qs[j] != (uint8_t)(j | j << 4);
    CHECK(bad == 0);
    hr_dequantize_row_ref(HR_DTYPE_Q5_0, &b0, y, 32);
    CHECK(!memcmp(x, y, sizeof x));
    /* positive max first: d = 32 / -16 = -2; -32 clamps to q = 31 -> -30; 3 -> trunc(-1.5 + 16.5) = 15 */
    memset(x, 0, sizeof x);
    x[3] = 32;
    x[4] = -32;
    x[20] = 3;
    hr_quantize_row_ref(HR_DTYPE_Q5_0, x, &b0, 32);
    CHECK(b0.d == 0xC000);
    CHECK((b0.qs[3] & 15) == 0 && (b0.qs[4] & 15) == 15 && (b0.qh[0] & 0x18) == 0x10 && (b0.qs[4] >> 4) == 15);
    hr_dequantize_row_ref(HR_DTYPE_Q5_0, &b0, y, 32);
    CHECK(y[3] == 32 && y[4] == -30 && y[20] == 2 && y[0] == 0);
    /* q5_1: x[j] = j / 2 - 1: m = -1, d = 15.5 / 31 = 0.5, q = j; exact round trip */
    for (int j = 0; j < 32; j++) x[j] = 0.5f * (float)j - 1.0f;
    hr_block_q5_1 b1;
    hr_quantize_row_ref(HR_DTYPE_Q5_1, x, &b1, 32);
    CHECK(b1.d == 0x3800 && b1.m == 0xBC00);
    CHECK(b1.qh[0] == 0 && b1.qh[1] == 0 && b1.qh[2] == 0xFF && b1.qh[3] == 0xFF);
    bad = 0;
    for (int j = 0; j < 16; j++) bad += b1.qs[j] != (uint8_t)(j | j << 4);
    CHECK(bad == 0);
    hr_dequantize_row_ref(HR_DTYPE_Q5_1, &b1, y, 32);
    CHECK(!memcmp(x, y, sizeof x));
    /* the dots against q8_0 activations of all 127s (d = 1): q5_1 sum (j / 2 - 1) x 127 = (248 - 32) x 127,
     * q5_0 of the first block: sum over j < 16 of (j - 16) + j = -16 (x 127) */
    hr_block_q8_0 a = {.d = 0x3C00};
    for (int j = 0; j < 32; j++) a.qs[j] = 127;
    CHECK(hr_vec_dot_ref(HR_DTYPE_Q5_1, 32, &b1, &a) == 216.0f * 127.0f);
    for (int j = 0; j < 16; j++) {
        x[j] = (float)(j - 16);
        x[16 + j] = (float)j;
    }
    hr_quantize_row_ref(HR_DTYPE_Q5_0, x, &b0, 32);
    CHECK(hr_vec_dot_ref(HR_DTYPE_Q5_0, 32, &b0, &a) == -16.0f * 127.0f);
}

/* q4_K / q5_K scales for the hand-built blocks: sc = {1,2,3,4,5,6,7,63}, m = {0,1,2,3,4,5,6,40},
 * packed by hand from the format: bytes 0-3 = sc[0..3] | (sc[4..7] >> 4) << 6, bytes 4-7 =
 * m[0..3] | (m[4..7] >> 4) << 6, bytes 8-11 = (sc[4..7] & 15) | (m[4..7] & 15) << 4. */
static const uint8_t k4_scales[12] = {
    1, 2, 3, 4 | (3 << 6), 0, 1, 2, 3 | (2 << 6), 5 | (4 << 4), 6 | (5 << 4), 7 | (6 << 4), 15 | (8 << 4)};
static const int k4_sc[8] = {1, 2, 3, 4, 5, 6, 7, 63}, k4_m[8] = {0, 1, 2, 3, 4, 5, 6, 40};

static void test_q4_K_block(void) {
    hr_block_q4_K b;
    b.d = 0x3C00;    /* 1.0 */
    b.dmin = 0x3800; /* 0.5 */
    memcpy(b.scales, k4_scales, 12);
    for (int l = 0; l < 128; l++) b.qs[l] = (uint8_t)((l & 15) | ((15 - (l & 15)) << 4));
    float y[256];
    hr_dequantize_row_ref(HR_DTYPE_Q4_K, &b, y, 256);
    /* element e: chunk c = e / 64, l = e % 32, high nibble when e % 64 >= 32, sub-block 2c + high */
    CHECK(y[0] == 0);                         /* sub-block 0: 1 * 0 - 0.5 * 0 */
    CHECK(y[1] == 1);                         /* q = 1 */
    CHECK(y[32] == 2 * 15 - 0.5f);            /* sub-block 1, high nibble of qs[0] = 15 */
    CHECK(y[70] == 3 * 6 - 1);                /* sub-block 2 (sc 3, m 2), qs[38] low = 6 */
    CHECK(y[224] == 63 * 15 - 20);            /* sub-block 7 (sc 63, m 40), high nibble of qs[96] = 15 */
    CHECK(y[255] == -20);                     /* q = 15 - 15 = 0 */
    CHECK(y[200] == 7 * (200 % 32 & 15) - 3); /* sub-block 6 (sc 7, m 6), low nibble of qs[104] */
    int bad = 0;
    for (int e = 0; e < 256; e++) {
        const int c = e / 64, l = e % 32, high = (e % 64) >= 32, j = 2 * c + high;
        const int q = high ? 15 - (l & 15) : (l & 15);
        bad += y[e] != (float)(k4_sc[j] * q) - 0.5f * (float)k4_m[j];
    }
    CHECK(bad == 0);
}

static void test_q5_K_block(void) {
    hr_block_q5_K b;
    b.d = 0x3C00;
    b.dmin = 0x3800;
    memcpy(b.scales, k4_scales, 12);
    for (int l = 0; l < 128; l++) b.qs[l] = (uint8_t)((l & 15) | ((15 - (l & 15)) << 4));
    for (int l = 0; l < 32; l++) b.qh[l] = (l % 2) ? 0xFF : 0x00; /* odd l: every fifth bit set */
    float y[256];
    hr_dequantize_row_ref(HR_DTYPE_Q5_K, &b, y, 256);
    CHECK(y[0] == 0);
    CHECK(y[1] == 17);             /* q = 1 + 16 */
    CHECK(y[224] == 63 * 15 - 20); /* l = 0: no fifth bit */
    CHECK(y[255] == 63 * 16 - 20); /* l = 31: 0 + 16 */
    CHECK(y[33] == 2 * (14 + 16) - 0.5f);
    int bad = 0;
    for (int e = 0; e < 256; e++) {
        const int c = e / 64, l = e % 32, high = (e % 64) >= 32, j = 2 * c + high;
        const int q = (high ? 15 - (l & 15) : (l & 15)) + ((l % 2) ? 16 : 0);
        bad += y[e] != (float)(k4_sc[j] * q) - 0.5f * (float)k4_m[j];
    }
    CHECK(bad == 0);
}

static void test_q6_K_block(void) {
    hr_block_q6_K b;
    b.d = 0x3400; /* 0.25 */
    for (int g = 0; g < 16; g++) b.scales[g] = (int8_t)(g - 8);
    for (int i = 0; i < 128; i++) b.ql[i] = (uint8_t)i;
    for (int i = 0; i < 64; i++) b.qh[i] = 0xE4; /* bit pairs 00 01 10 11 from the bottom */
    float y[256];
    hr_dequantize_row_ref(HR_DTYPE_Q6_K, &b, y, 256);
    CHECK(y[0] == 64);                             /* ql[0] low = 0, high bits 0: q = 0 - 32; 0.25 * -8 * -32 */
    CHECK(y[40] == 12);                            /* ql[40] low = 8, bits 01: q = 24 - 32 = -8; scale[2] = -6 */
    CHECK(y[69] == 0);                             /* ql[5] high = 0, bits 10: q = 32 - 32 */
    CHECK(y[255] == 40.25f);                       /* ql[127] high = 7, bits 11: q = 55 - 32 = 23; scale[15] = 7 */
    CHECK(y[130] == 0.25f * 0 * (2 - 32));         /* scale[8] = 0 */
    CHECK(y[150] == 0.25f * 1 * ((86 & 15) - 32)); /* e = 128 + 22: scale[9] = 1, ql[64 + 22] low, bits 00 */
}

/* Round trips on random rows stay within half a step; ref dots equal the dot of dequantized rows. */
/* MXFP4: the doubled E2M1 table at half the E8M0 scale, so e = 128 gives the table's values halved
 * times 2 (E2M1 x 2^(128 - 127)); e = 0 and 1 the subnormal scales; the quantizer's exponent choice
 * (largest magnitude in [4, 8) x 2^(e - 127)), nearest codes and the NaN scale finder. */
static void test_mxfp4_block(void) {
    CHECK(hr_dtype_get_info(HR_DTYPE_MXFP4)->block_bytes == 17 && hr_dtype_get_info(HR_DTYPE_MXFP4)->block_elems == 32);
    CHECK(hr_dtype_get_info(HR_DTYPE_MXFP4)->vec_dot_type == HR_DTYPE_Q8_0 && hr_dtype_supported(39));
    static const float e2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
    hr_block_mxfp4 b;
    float y[32];
    b.e = 128;
    for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | (15 - j) << 4);
    hr_dequantize_row_ref(HR_DTYPE_MXFP4, &b, y, 32);
    int bad = 0;
    for (int j = 0; j < 16; j++) {
        const float lo = (j < 8 ? 1 : -1) * e2m1[j & 7] * 2, hi = (15 - j < 8 ? 1 : -1) * e2m1[(15 - j) & 7] * 2;
        bad += y[j] != lo || y[16 + j] != hi;
    }
    CHECK(bad == 0);
    CHECK(hr_mxfp4_half_scale(127) == 0.5f && hr_mxfp4_half_scale(254) == 0x1p126f);
    CHECK(hr_mxfp4_half_scale(0) == 0x1p-128f && hr_mxfp4_half_scale(1) == 0x1p-127f &&
          hr_mxfp4_half_scale(2) == 0x1p-126f);
    /* amax 5: floor(log2 5) = 2, e = 127, scale 1, values = E2M1: 5 -> 4 or 6 (a tie: the lower code, 4),
     * 2.9 -> 3, -0.7 -> -0.5, 0.26 -> 0.5, 0.24 -> 0 */
    float x[32] = {5, 2.9f, -0.7f, 0.26f, 0.24f, -6.5f};
    hr_quantize_row_ref(HR_DTYPE_MXFP4, x, &b, 32);
    CHECK(b.e == 127);
    hr_dequantize_row_ref(HR_DTYPE_MXFP4, &b, y, 32);
    CHECKF(y[0] == 4 && y[1] == 3 && y[2] == -0.5f && y[3] == 0.5f && y[4] == 0 && y[5] == -6 && y[31] == 0,
           "%g %g %g %g %g %g", y[0], y[1], y[2], y[3], y[4], y[5]);
    memset(x, 0, sizeof x);
    hr_quantize_row_ref(HR_DTYPE_MXFP4, x, &b, 32);
    CHECK(b.e == 0 && b.qs[0] == 0);
    hr_block_mxfp4 row[3] = {{.e = 1}, {.e = 254}, {.e = 0xFF}};
    CHECK(hr_mxfp4_find_nan_scale(row, 96) == 2 && hr_mxfp4_find_nan_scale(row, 64) == -1);
}

static void test_round_trip_and_dot(void) {
    hr_rng rng;
    hr_rng_seed(&rng, 7);
    enum { K = 512 };
    float x[K], y[K], a[K], aq[K];
    for (int i = 0; i < K; i++) x[i] = hr_rng_normal(&rng);
    for (int i = 0; i < K; i++) a[i] = hr_rng_normal(&rng);
    static const hr_dtype types[] = {HR_DTYPE_F32,  HR_DTYPE_F16,  HR_DTYPE_BF16, HR_DTYPE_Q8_0,
                                     HR_DTYPE_Q4_0, HR_DTYPE_Q5_0, HR_DTYPE_Q5_1, HR_DTYPE_Q4_K,
                                     HR_DTYPE_Q5_K, HR_DTYPE_Q6_K, HR_DTYPE_MXFP4};
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
        const double step = t == HR_DTYPE_Q8_0    ? amax / 127
                            : t == HR_DTYPE_Q4_0  ? amax / 8
                            : t == HR_DTYPE_Q5_0  ? amax / 16
                            : t == HR_DTYPE_Q5_1  ? amax / 14 /* range / 31 <= 2 amax / 31, plus d and m in f16 */
                            : t == HR_DTYPE_BF16  ? amax * 0x1p-7
                            : t == HR_DTYPE_F16   ? amax * 0x1p-10
                            : t == HR_DTYPE_Q4_K  ? amax / 5 /* range / 15 plus scale rounding */
                            : t == HR_DTYPE_Q5_K  ? amax / 10
                            : t == HR_DTYPE_Q6_K  ? amax / 20
                            : t == HR_DTYPE_MXFP4 ? amax /* a block's top in [4, 8) x its scale, E2M1's top 6 */
                                                  : 0;
        /* q4_0's top value is 7d (q5_0's 15d) while its bottom is -8d = -amax, so the clamped end errs up to d */
        const double bound = (t == HR_DTYPE_Q4_0 || t == HR_DTYPE_Q5_0 ? 1.0 : 0.5) * step * 1.01 + 1e-7;
        CHECKF(max_err <= bound, "%s round trip error %g (step %g)", info->name, max_err, step);
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
    test_q5_blocks();
    test_q4_K_block();
    test_q5_K_block();
    test_q6_K_block();
    test_mxfp4_block();
    test_round_trip_and_dot();
    return hr_test_finish();
}

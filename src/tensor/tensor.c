/* tensor.c: the type table and the exact scalar conversions between f32 and f16/bf16.
 *
 * Conversions are written with integer operations so they give the same bits on every compiler and
 * CPU (and equal F16C's vcvtps2ph with round-to-nearest-even, which the SIMD tests check). */
#include "tensor/tensor.h"

#include <string.h>

_Static_assert(sizeof(hr_block_q8_0) == 34, "q8_0 block must match ggml");
_Static_assert(sizeof(hr_block_q4_0) == 18, "q4_0 block must match ggml");
_Static_assert(sizeof(hr_block_q5_0) == 22, "q5_0 block must match ggml");
_Static_assert(sizeof(hr_block_q5_1) == 24, "q5_1 block must match ggml");
_Static_assert(sizeof(hr_block_q4_K) == 144, "q4_K block must match ggml");
_Static_assert(sizeof(hr_block_q5_K) == 176, "q5_K block must match ggml");
_Static_assert(sizeof(hr_block_q6_K) == 210, "q6_K block must match ggml");
_Static_assert(sizeof(hr_block_q8_K) == 292, "q8_K block must match ggml");
_Static_assert(sizeof(hr_block_mxfp4) == 17, "mxfp4 block must match ggml");
_Static_assert(sizeof(hr_block_q4_0x16) == HR_X16 * sizeof(hr_block_q4_0), "a q4_0x16 block is 16 q4_0 blocks");
_Static_assert(sizeof(hr_block_q8_0s) == 44, "q8_0s block: f32 scale, two int32 sums, 32 values");
_Static_assert(sizeof(hr_block_q5_0x16) == HR_X16 * sizeof(hr_block_q5_0), "a q5_0x16 block is 16 q5_0 blocks");
_Static_assert(sizeof(hr_block_q8_0x16) == HR_X16 * sizeof(hr_block_q8_0), "a q8_0x16 block is 16 q8_0 blocks");
_Static_assert(sizeof(hr_block_q4_Kx16) == HR_X16 * sizeof(hr_block_q4_K), "a q4_Kx16 block is 16 q4_K blocks");
_Static_assert(sizeof(hr_block_q5_Kx16) == HR_X16 * sizeof(hr_block_q5_K), "a q5_Kx16 block is 16 q5_K blocks");
_Static_assert(sizeof(hr_block_q6_Kx16) == HR_X16 * sizeof(hr_block_q6_K), "a q6_Kx16 block is 16 q6_K blocks");
_Static_assert(sizeof(hr_block_q8_Ks) == 276, "q8_Ks block: f32 scale, 256 values, 4 paired sums");

/* Indexed by hr_dtype (= ggml type id); name == NULL marks an id headroom does not compute with. */
static const hr_dtype_info dtype_table[HR_DTYPE_TABLE] = {
    [HR_DTYPE_F32] = {"f32", 1, 4, HR_DTYPE_F32, 1, HR_DTYPE_F32},
    [HR_DTYPE_F16] = {"f16", 1, 2, HR_DTYPE_F16, 1, HR_DTYPE_F16}, /* activations rounded to f16, as ggml does */
    [HR_DTYPE_BF16] = {"bf16", 1, 2, HR_DTYPE_F32, 1, HR_DTYPE_BF16},
    [HR_DTYPE_Q8_0] = {"q8_0", HR_QK8_0, sizeof(hr_block_q8_0), HR_DTYPE_Q8_0, 1, HR_DTYPE_Q8_0},
    [HR_DTYPE_Q4_0] = {"q4_0", HR_QK4_0, sizeof(hr_block_q4_0), HR_DTYPE_Q8_0, 1, HR_DTYPE_Q4_0},
    [HR_DTYPE_Q5_0] = {"q5_0", HR_QK5_0, sizeof(hr_block_q5_0), HR_DTYPE_Q8_0, 1, HR_DTYPE_Q5_0},
    [HR_DTYPE_Q5_1] = {"q5_1", HR_QK5_1, sizeof(hr_block_q5_1), HR_DTYPE_Q8_0, 1, HR_DTYPE_Q5_1},
    [HR_DTYPE_Q4_K] = {"q4_K", HR_QK_K, sizeof(hr_block_q4_K), HR_DTYPE_Q8_K, 1, HR_DTYPE_Q4_K},
    [HR_DTYPE_Q5_K] = {"q5_K", HR_QK_K, sizeof(hr_block_q5_K), HR_DTYPE_Q8_K, 1, HR_DTYPE_Q5_K},
    [HR_DTYPE_Q6_K] = {"q6_K", HR_QK_K, sizeof(hr_block_q6_K), HR_DTYPE_Q8_K, 1, HR_DTYPE_Q6_K},
    [HR_DTYPE_Q8_K] = {"q8_K", HR_QK_K, sizeof(hr_block_q8_K), HR_DTYPE_Q8_K, 1, HR_DTYPE_Q8_K},
    [HR_DTYPE_MXFP4] = {"mxfp4", HR_QK_MXFP4, sizeof(hr_block_mxfp4), HR_DTYPE_Q8_0, 1, HR_DTYPE_MXFP4},
    /* per row: a q4_0 row's bytes (a group of 16 rows is 16 q4_0 rows, interleaved) */
    [HR_DTYPE_Q4_0X16] = {"q4_0x16", HR_QK4_0, sizeof(hr_block_q4_0), HR_DTYPE_Q8_0S, HR_X16, HR_DTYPE_Q4_0},
    [HR_DTYPE_Q8_0S] = {"q8_0s", HR_QK8_0, sizeof(hr_block_q8_0s), HR_DTYPE_Q8_0S, 1, HR_DTYPE_Q8_0S},
    [HR_DTYPE_Q8_0X16] = {"q8_0x16", HR_QK8_0, sizeof(hr_block_q8_0), HR_DTYPE_Q8_0S, HR_X16, HR_DTYPE_Q8_0},
    [HR_DTYPE_Q4_KX16] = {"q4_Kx16", HR_QK_K, sizeof(hr_block_q4_K), HR_DTYPE_Q8_KS, HR_X16, HR_DTYPE_Q4_K},
    [HR_DTYPE_Q8_KS] = {"q8_Ks", HR_QK_K, sizeof(hr_block_q8_Ks), HR_DTYPE_Q8_KS, 1, HR_DTYPE_Q8_KS},
    [HR_DTYPE_Q5_KX16] = {"q5_Kx16", HR_QK_K, sizeof(hr_block_q5_K), HR_DTYPE_Q8_KS, HR_X16, HR_DTYPE_Q5_K},
    [HR_DTYPE_Q5_0X16] = {"q5_0x16", HR_QK5_0, sizeof(hr_block_q5_0), HR_DTYPE_Q8_0S, HR_X16, HR_DTYPE_Q5_0},
    [HR_DTYPE_Q6_KX16] = {"q6_Kx16", HR_QK_K, sizeof(hr_block_q6_K), HR_DTYPE_Q8_K, HR_X16, HR_DTYPE_Q6_K},
};

const hr_dtype_info *hr_dtype_get_info(hr_dtype t) {
    if ((unsigned)t >= sizeof dtype_table / sizeof dtype_table[0] || !dtype_table[t].name) return NULL;
    return &dtype_table[t];
}

bool hr_dtype_supported(uint32_t ggml_type) {
    /* Q8_K is an activation format only; a file holding Q8_K weights is not one we load, nor one that
     * claims headroom's own layouts (ids 40 and up are ggml's to give) */
    if (ggml_type == HR_DTYPE_Q8_K || ggml_type >= HR_DTYPE_Q4_0X16) return false;
    return hr_dtype_get_info((hr_dtype)ggml_type) != NULL;
}

const char *hr_dtype_supported_list(void) { return "f32, f16, bf16, q8_0, q4_0, q5_0, q5_1, q4_K, q5_K, q6_K, mxfp4"; }

size_t hr_dtype_row_bytes(hr_dtype t, int64_t k) {
    const hr_dtype_info *info = hr_dtype_get_info(t);
    if (!info || k < 0) return 0;
    return (size_t)(k / info->block_elems) * (size_t)info->block_bytes;
}

/* ---- f16 ---- */

float hr_f16_to_f32(hr_f16 h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000 | (mant << 13); /* inf / nan (payload kept) */
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else {
        /* subnormal: mant * 2^-24, renormalised */
        int e = -1;
        do {
            mant <<= 1;
            e++;
        } while (!(mant & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Rounds m >> shift to nearest, ties to even. */
static uint32_t shift_rne(uint32_t m, int shift) {
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return q;
}

hr_f16 hr_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffff;
    if (ax > 0x7f800000) return (hr_f16)(sign | 0x7e00 | ((ax >> 13) & 0x3ff)); /* quiet nan */
    if (ax >= 0x477ff000) return (hr_f16)(sign | 0x7c00);                       /* >= 65520 (and inf) rounds to inf */
    if (ax >= 0x38800000) {                                                     /* normal half: |f| >= 2^-14 */
        uint32_t e16 = (ax >> 23) - 112;
        /* rounding may carry into the exponent, which is the correct encoding */
        return (hr_f16)(sign | shift_rne((e16 << 23) | (ax & 0x7fffff), 13));
    }
    if (ax < 0x33000000) return (hr_f16)sign; /* < 2^-25 (ties at 2^-25 go to even 0) */
    uint32_t e = ax >> 23;
    uint32_t m = (ax & 0x7fffff) | 0x800000;
    return (hr_f16)(sign | shift_rne(m, (int)(126 - e))); /* in units of 2^-24 */
}

/* ---- bf16 ---- */

float hr_bf16_to_f32(hr_bf16 h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

hr_bf16 hr_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffff) > 0x7f800000) return (hr_bf16)((x >> 16) | 0x40); /* quiet nan */
    return (hr_bf16)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

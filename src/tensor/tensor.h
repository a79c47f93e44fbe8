/* tensor.h: element types and their block layouts, conversions, and the per-type reference row
 * routines (quantize, dequantize, dot product): the definition of correct that every backend's
 * kernels are tested against (the CPU's, chosen at run time: backend/cpu/kernels.h).
 *
 * Block layouts are byte-identical to GGUF/ggml's so files made by other tools load unchanged.
 * Type ids equal ggml's type ids. Dimension letters: K = elements in a row (the reduction length). */
#ifndef HR_TENSOR_TENSOR_H
#define HR_TENSOR_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

typedef enum hr_dtype {
    HR_DTYPE_F32 = 0,
    HR_DTYPE_F16 = 1,
    HR_DTYPE_Q4_0 = 2,
    HR_DTYPE_Q5_0 = 6, /* llama.cpp's fallback for q4_K where a row is not whole super-blocks */
    HR_DTYPE_Q5_1 = 7, /* ... and for q5_K */
    HR_DTYPE_Q8_0 = 8,
    HR_DTYPE_Q4_K = 12,
    HR_DTYPE_Q5_K = 13,
    HR_DTYPE_Q6_K = 14,
    HR_DTYPE_Q8_K = 15, /* activations only (the partner of the K-quants in dot products) */
    HR_DTYPE_BF16 = 30,
    HR_DTYPE_MXFP4 = 39, /* OCP microscaling FP4: E2M1 values, one E8M0 scale per 32 (gpt-oss experts) */
    /* headroom's own layouts, never read from a file (hr_dtype_supported is false for them): */
    HR_DTYPE_Q4_0X16 = 40, /* q4_0 weights repacked at load, 16 rows interleaved (hr_block_q4_0x16) */
    HR_DTYPE_Q8_0S = 41,   /* activations for q4_0x16 and q8_0x16: q8_0 with the scale in f32 and sums */
    HR_DTYPE_Q8_0X16 = 42, /* q8_0 weights repacked at load, 16 rows interleaved (hr_block_q8_0x16) */
    HR_DTYPE_Q4_KX16 = 43, /* q4_K weights repacked at load, 16 rows interleaved (hr_block_q4_Kx16) */
    HR_DTYPE_Q8_KS = 44,   /* activations for q4_Kx16: q8_K with its sub-block sums paired (hr_block_q8_Ks) */
    HR_DTYPE_Q5_KX16 = 45, /* q5_K weights repacked at load, 16 rows interleaved (hr_block_q5_Kx16) */
    HR_DTYPE_Q6_KX16 = 46, /* q6_K weights repacked at load, 16 rows interleaved (hr_block_q6_Kx16) */
    HR_DTYPE_Q5_0X16 = 47, /* q5_0 weights repacked at load, 16 rows interleaved (hr_block_q5_0x16) */
} hr_dtype;

#define HR_DTYPE_TABLE 48 /* ids below this index the type and kernel tables */

typedef uint16_t hr_f16;  /* IEEE half, bit pattern */
typedef uint16_t hr_bf16; /* bfloat16, bit pattern */

#define HR_QK8_0        32
#define HR_QK4_0        32
#define HR_QK_K         256
#define HR_K_SCALE_SIZE 12

typedef struct {
    hr_f16 d;
    int8_t qs[HR_QK8_0];
} hr_block_q8_0; /* 34 bytes */
typedef struct {
    hr_f16 d;
    uint8_t qs[HR_QK4_0 / 2];
} hr_block_q4_0; /* 18 bytes: low nibbles = x[0..15] */
/* q5_0 (ggml type 6): element j (0..15) is the low nibble of qs[j] with bit j of qh (read as a
 * little-endian uint32) as its fifth bit, element j + 16 the high nibble with bit j + 16; q, 0..31,
 * stands for d (q - 16). q5_1 (type 7): the same bits for d q + m. */
#define HR_QK5_0 32
#define HR_QK5_1 32
typedef struct {
    hr_f16 d;
    uint8_t qh[4];
    uint8_t qs[HR_QK5_0 / 2];
} hr_block_q5_0; /* 22 bytes */
typedef struct {
    hr_f16 d, m;
    uint8_t qh[4];
    uint8_t qs[HR_QK5_1 / 2];
} hr_block_q5_1; /* 24 bytes */
typedef struct { /* 144 bytes */
    hr_f16 d, dmin;
    uint8_t scales[HR_K_SCALE_SIZE];
    uint8_t qs[HR_QK_K / 2];
} hr_block_q4_K;
typedef struct { /* 176 bytes */
    hr_f16 d, dmin;
    uint8_t scales[HR_K_SCALE_SIZE];
    uint8_t qh[HR_QK_K / 8];
    uint8_t qs[HR_QK_K / 2];
} hr_block_q5_K;
typedef struct { /* 210 bytes */
    uint8_t ql[HR_QK_K / 2];
    uint8_t qh[HR_QK_K / 4];
    int8_t scales[HR_QK_K / 16];
    hr_f16 d;
} hr_block_q6_K;
typedef struct { /* 292 bytes */
    float d;
    int8_t qs[HR_QK_K];
    int16_t bsums[HR_QK_K / 16];
} hr_block_q8_K;

/* MXFP4 (OCP Microscaling Formats v1.0; ggml type 39): 32 values as 4-bit E2M1 codes and one shared
 * E8M0 scale byte e. Code c (sign bit 3, then 3 magnitude bits) stands for HR_MXFP4_VALUES[c] / 2 (the
 * table holds the E2M1 values doubled: 0, 0.5, 1, 1.5, 2, 3, 4, 6 -> 0, 1, 2, 3, 4, 6, 8, 12, so they
 * are integers); the scale is 2^(e - 127), so element j = HR_MXFP4_VALUES[c_j] * 2^(e - 128) exactly
 * (hr_mxfp4_half_scale). qs[j] holds element j in its low nibble and j + 16 in its high, as q4_0.
 * e = 0xFF is E8M0's NaN: no valid block has it (the loader refuses such a tensor). */
#define HR_QK_MXFP4 32
typedef struct {
    uint8_t e;
    uint8_t qs[HR_QK_MXFP4 / 2];
} hr_block_mxfp4; /* 17 bytes */
extern const int8_t HR_MXFP4_VALUES[16];
/* 2^(e - 128) (half the E8M0 scale: the table's values are doubled), exact, e < 0xFF; e = 0 and 1 give
 * the subnormals 2^-128 and 2^-127. */
static inline float hr_mxfp4_half_scale(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    __builtin_memcpy(&f, &bits, sizeof f);
    return f;
}
/* The first block of an MXFP4 row of k elements whose scale is 0xFF (NaN), or -1 when none. */
int64_t hr_mxfp4_find_nan_scale(const void *row, int64_t k);

/* Block b of 16 q4_0 rows, interleaved so that one 64-byte load holds 4 bytes of each row: d[r] is
 * row r's scale, and byte i (0..3) of lane r of chunk v (0..3), qs[64 v + 4 r + i], is row r's
 * qs[4 v + i] (elements 4 v + i in the low nibble, 16 + 4 v + i in the high). A group of 16 rows
 * holds its blocks in order, so it takes exactly the bytes of the 16 plain rows (16 x 18 per block)
 * and a matrix is repacked in place, group after group (hr_x16_repack). */
#define HR_X16 16 /* rows of an interleaved group */
typedef struct {
    hr_f16 d[HR_X16];
    uint8_t qs[HR_X16 * HR_QK4_0 / 2];
} hr_block_q4_0x16; /* 288 bytes */

/* Block b of 16 q5_0 rows: d[r], then the fifth bits as one dword per row (qh[4 r + i] = row r's
 * qh[i]: lane r of a 512-bit load holds row r's 32 bits), then the nibbles as q4_0x16's 4 chunks
 * (qs[64 v + 4 r + i] = row r's qs[4 v + i]); 16 x 22 bytes, repacked in place likewise. */
typedef struct {
    hr_f16 d[HR_X16];
    uint8_t qh[HR_X16 * 4];
    uint8_t qs[HR_X16 * HR_QK5_0 / 2];
} hr_block_q5_0x16; /* 352 bytes */

/* Block b of 16 q8_0 rows, interleaved the same way over 8 chunks: qs[64 v + 4 r + i] is row r's
 * qs[4 v + i] + 128 (v 0..7; stored as x ^ 0x80: unsigned, the operand VNNI's vpdpbusd takes
 * unsigned); 16 x 34 bytes, repacked in place likewise. */
typedef struct {
    hr_f16 d[HR_X16];
    uint8_t qs[HR_X16 * HR_QK8_0];
} hr_block_q8_0x16; /* 544 bytes */

/* Super-block b of 16 q4_K rows: the scales, each row's 12 bytes as 3 dwords over 3 chunks of 64
 * bytes (scales[64 c + 4 r + i] = row r's scales[4 c + i]), and the nibbles as 4 x 8 chunks,
 * qs[512 j + 64 v + 4 r + i] = row r's qs[32 j + 4 v + i] (low nibbles: elements 64 j + 4 v + i of
 * sub-block 2 j, high: 64 j + 32 + 4 v + i of sub-block 2 j + 1); 16 x 144 bytes, in place. */
typedef struct {
    hr_f16 d[HR_X16], dmin[HR_X16];
    uint8_t scales[HR_X16 * HR_K_SCALE_SIZE];
    uint8_t qs[HR_X16 * HR_QK_K / 2];
} hr_block_q4_Kx16; /* 2304 bytes */

/* Super-block b of 16 q5_K rows: q4_Kx16's layout (d, dmin, scales, qs in the same places relative
 * to each other) with the fifth bits between scales and qs, 8 chunks of 64 bytes: qh[64 v + 4 r + i]
 * = row r's qh[4 v + i] (bit s: element 4 v + i of sub-block s); 16 x 176 bytes, in place. */
typedef struct {
    hr_f16 d[HR_X16], dmin[HR_X16];
    uint8_t scales[HR_X16 * HR_K_SCALE_SIZE];
    uint8_t qh[HR_X16 * HR_QK_K / 8];
    uint8_t qs[HR_X16 * HR_QK_K / 2];
} hr_block_q5_Kx16; /* 2816 bytes */

/* Super-block b of 16 q6_K rows: d[r], the int8 scales as 4 chunks (scales[64 c + 4 r + i] = row r's
 * scales[4 c + i]), then the 6-bit values as 4 segments of 12 chunks of 64 bytes, in the order the
 * tiles read them (one forward pass: the hardware prefetcher lost track of the former ql-then-qh
 * order, 9-14 vs 20-25 GB/s for one token from DRAM). Segment s = 2 h + e (half h of the
 * super-block, e = which 16 of each 32 values) holds, for vv = 0..3, the ql chunks 16 h + 4 e + vv
 * (at 64 vv) and 16 h + 8 + 4 e + vv (at 256 + 64 vv) and the qh chunk 8 h + 4 e + vv (at 512 + 64
 * vv), where ql chunk v holds row r's ql[4 v + i] at lane 4 r + i, qh chunk v likewise
 * (hr_q6x16_ql_at / hr_q6x16_qh_at), re-coded within each lane: the file's bytes a = ql[64 h + l], b =
 * ql[64 h + 32 + l] and c = qh[32 h + l] carry element 128 h + 32 q + l's 6-bit value u_q for the 4
 * quarters q, and the lanes hold a' = u_0 | (u_3 & 3) << 6, b' = u_1 | (u_3 >> 2 & 3) << 6 and c' =
 * u_2 | (u_3 >> 4) << 6 in their places, so three quarters are one AND each (u & 63) and the
 * fourth gathers the top two bits of the three (11 vector instructions per four chunks of values,
 * where the file's nibbles and 2-bit fields took 17; AVX2's one-token path 33.8 -> 40.4 GB/s in L2).
 * The repack is exact both ways (hr_x16_unpack gives the file's bytes back); 16 x 210 bytes, in place. */
typedef struct {
    hr_f16 d[HR_X16];
    int8_t scales[HR_X16 * HR_QK_K / 16];
    uint8_t q[HR_X16 * (HR_QK_K / 2 + HR_QK_K / 4)];
} hr_block_q6_Kx16; /* 3360 bytes */

/* Where ql chunk v (0..31) and qh chunk v (0..15) of a q6_Kx16 super-block start in its q[]. */
static inline int hr_q6x16_ql_at(int v) {
    return 768 * (2 * (v >> 4) + ((v >> 2) & 1)) + 256 * ((v >> 3) & 1) + 64 * (v & 3);
}
static inline int hr_q6x16_qh_at(int v) { return 768 * (2 * (v >> 3) + ((v >> 2) & 1)) + 512 + 64 * (v & 3); }
/* The 6-bit value of quarter q (0..3) from a lane's three re-coded bytes: a (ql chunk 16 h + v), b (ql
 * chunk 16 h + 8 + v), c (qh chunk 8 h + v). */
static inline int hr_q6x16_value(int a, int b, int c, int q) {
    return q == 0 ? a & 63 : q == 1 ? b & 63 : q == 2 ? c & 63 : a >> 6 | (b >> 6) << 2 | (c >> 6) << 4;
}

/* The activation block q4_Kx16 multiplies: q8_K's scale and values (the same quantization), and the
 * sums of its 8 sub-blocks of 32, ys[s], paired as 16-bit halves of 4 dwords for vpmaddwd:
 * ysp = {ys0 | ys2 << 16, ys1 | ys3 << 16, ys4 | ys6 << 16, ys5 | ys7 << 16}. */
typedef struct { /* 276 bytes */
    float d;
    int8_t qs[HR_QK_K];
    int32_t ysp[4];
} hr_block_q8_Ks;

/* The activation block q4_0x16 and q8_0x16 multiply: a q8_0 block (same quantization, same values)
 * with its scale already in f32 and the corrections for the weights' unsigned storage, -8 and -128
 * times the sum of qs (q4_0's nibbles are x + 8, q8_0x16's bytes x + 128). */
typedef struct { /* 44 bytes */
    float d;
    int32_t s8, s128;
    int8_t qs[HR_QK8_0];
} hr_block_q8_0s;

/* Static facts about a type. */
typedef struct hr_dtype_info {
    const char *name;      /* "f32", "q4_0", ... */
    int block_elems;       /* elements per block (1 for f32/f16/bf16) */
    int block_bytes;       /* bytes per block */
    hr_dtype vec_dot_type; /* the activation type this weight type's dot product consumes */
    int row_group;         /* rows that are stored together (HR_X16 for q4_0x16, else 1): a matrix of
                            * such a type is cut into row ranges only at multiples of it */
    hr_dtype file_type;    /* the type it is stored as in a GGUF file (itself, or q4_0 for q4_0x16) */
} hr_dtype_info;

/* NULL when `t` is not a type headroom computes with. */
const hr_dtype_info *hr_dtype_get_info(hr_dtype t);
bool hr_dtype_supported(uint32_t ggml_type);
/* "f32, f16, bf16, q8_0, q4_0, q5_0, q5_1, q4_K, q5_K, q6_K, mxfp4": for error messages. */
const char *hr_dtype_supported_list(void);
/* Bytes of a row of k elements (k must be a multiple of block_elems). For q4_0x16 the bytes a row
 * takes in its group (the same as a q4_0 row). */
size_t hr_dtype_row_bytes(hr_dtype t, int64_t k);

/* The interleaved layout of type t (q4_0x16 for q4_0, q8_0x16 for q8_0, q4_Kx16 for q4_K, q5_Kx16
 * for q5_K, q6_Kx16 for q6_K, q5_0x16 for q5_0), or t itself when it has none. */
hr_dtype hr_dtype_x16(hr_dtype t);
/* Repacks rows rows of k elements of x16's file type (rows a multiple of HR_X16) in place into x16
 * groups; tmp holds HR_X16 rows (HR_X16 x the file type's row bytes). hr_x16_unpack, with the same
 * arguments, is the inverse (tests and tools). Other types: nothing is done. */
void hr_x16_repack(hr_dtype x16, void *rows_data, int64_t rows, int64_t k, void *tmp);
void hr_x16_unpack(hr_dtype x16, void *rows_data, int64_t rows, int64_t k, void *tmp);
/* The q8_Ks block of a q8_K block. */
void hr_q8_Ks_from_q8_K(const hr_block_q8_K *x, hr_block_q8_Ks *y);
/* The q8_0s block of a q8_0 block: the same values, the scale widened, -8 and -128 x their sum. */
void hr_q8_0s_from_q8_0(const hr_block_q8_0 *x, hr_block_q8_0s *y);

/* ---- scalar conversions (exact, round-to-nearest-even) ---- */
float hr_f16_to_f32(hr_f16 h);
hr_f16 hr_f32_to_f16(float f);
float hr_bf16_to_f32(hr_bf16 h);
hr_bf16 hr_f32_to_bf16(float f);

/* ---- reference row routines (plain C; the definition of correct) ---- */
/* x: k floats -> dst in type t (k a multiple of the block). For f16, bf16, q8_0, q4_0 and q8_K this
 * matches ggml's reference quantizers byte for byte (q5_0 and q5_1 too). For q4_K, q5_K and q6_K it is a simpler
 * min/max quantizer (same format, decodes exactly as ggml would; bytes may differ from llama.cpp's
 * search-based quantizer). */
void hr_quantize_row_ref(hr_dtype t, const float *x, void *dst, int64_t k);
void hr_dequantize_row_ref(hr_dtype t, const void *src, float *y, int64_t k);
/* Dot of a weight row of type t with an activation row already in info(t)->vec_dot_type. Returns
 * the sum in f32. Activation types: f32/bf16 weights -> f32; f16 -> f16; q8_0/q4_0 -> q8_0;
 * mxfp4, q5_0, q5_1 -> q8_0 (q5_1's min term takes the sum of each activation block, formed from its
 * values: no separate activation type); q4_K/q5_K/q6_K -> q8_K (converted or quantized on the fly, as llama.cpp does:
 * ggml's vec_dot_type for f16 is f16, so its f16 matmuls see activations rounded to f16). */
float hr_vec_dot_ref(hr_dtype t, int64_t k, const void *w_row, const void *act_row);

#endif

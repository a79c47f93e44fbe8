/* kv_format.h: the KV formats as vocabulary: the enum, names and parsing, and each format's byte
 * layout of one head region (what a block of B tokens x D channels of one KV head takes, where its
 * codes and scales sit). The KV manager (kv/) sizes blocks and budgets from these; the planner
 * prices formats with them; a KV storage (kv_storage.h, e.g. backend/cpu/kv_storage_cpu.c) lays
 * its bytes out by them and owns the kernels that encode and read them. Nothing here touches bytes.
 *
 * Dimension letters: B = block_size (tokens per block), D = head_dim, G = group of a per-token scale. */
#ifndef HR_KV_KV_FORMAT_H
#define HR_KV_KV_FORMAT_H

#include <stdbool.h>
#include <stddef.h>

#include "common/status.h"

/* Storage formats of K or V. */
typedef enum hr_kv_format {
    HR_KV_F32 = 0,
    HR_KV_F16 = 1,
    HR_KV_BF16 = 2,
    HR_KV_Q8 = 3,    /* int8, per token and head, groups of <=64 with an f16 scale */
    HR_KV_Q4 = 4,    /* 4-bit, robust to outlier key channels */
    HR_KV_FP8 = 5,   /* e4m3 with per-head scales */
    HR_KV_KIVI2 = 6, /* 2-bit KIVI: K per channel over a full block, V per token, tail block in f16 */
    HR_KV_Q4H = 7,   /* 4-bit per token: K rotated per head by a Hadamard transform (head_dim a power of
                        two), V as q4's V; encoded at write time, no tail buffer */
} hr_kv_format;

#define HR_KV_FORMAT_COUNT 8

const char *hr_kv_format_name(hr_kv_format f);
/* Parses a format name ("f16", "q8", "kivi2", "q4h", ...; also fp32, fp16, q8_0, int8, q4_0, int4,
 * e4m3, fp8_e4m3, q4_hadamard). On error the message lists the valid names. */
hr_status hr_kv_format_parse(const char *name, hr_kv_format *out, hr_error *err);

#define KV_MAX_HEAD_DIM 1024 /* what hr_kv_pool_create accepts */

/* ---- layouts (shared by kv/ and the KV storages; not for other modules) ------------------------- */

enum { KV_K = 0, KV_V = 1 };

/* One format in one role (K or V) at one shape. Offsets are within a head region. */
typedef struct kv_fmt {
    hr_kv_format format;
    int role;         /* KV_K or KV_V */
    int B, D;         /* tokens per block, head_dim */
    int G;            /* group size for per-token group scales (Q8, Q4-V, KIVI2-V, Q4H) */
    int bits;         /* code bits for Q4 / KIVI2 / Q4H */
    bool deferred;    /* encoded when the block fills (Q4, KIVI2) */
    bool per_channel; /* K of Q4/KIVI2: scale and min per channel over the block's tokens */
    bool rotate;      /* K of Q4H: keys are stored Hadamard-rotated; attention passes dot a rotated q */
    bool sym;         /* Q4H test variant: symmetric codes (min fixed at -8 * scale) */
    size_t code_off;  /* where the element codes start */
    size_t scale_off; /* where the scales start */
    size_t head_bytes;
} kv_fmt;

/* Fills f for a format/role/shape. HR_ERR_INVALID_ARG when the head size cannot use the format. */
hr_status kv_fmt_init(kv_fmt *f, hr_kv_format format, int role, int B, int D, hr_error *err);

#endif

/* gguf_types.c: names of metadata types and the block layout of every ggml tensor type id.
 *
 * The tensor table is a fact of the file format: a type stores `block_elems` values in `block_bytes`
 * bytes, and a row (ne[0] values) must hold a whole number of blocks. Ids the format no longer (or never)
 * assigned have block_elems == 0 and read as "unknown". */
#include "gguf/gguf.h"

#include "common/util.h"

typedef struct type_info {
    const char *name;
    uint32_t block_elems; /* values per block; 0 = id not defined */
    uint32_t block_bytes; /* bytes per block */
} type_info;

/* Indexed by ggml type id. Block sizes follow the block structs of ggml (e.g. q8_0: an f16 scale and
 * 32 int8 values = 34 bytes; the k-quants and most iq types use 256-value super-blocks). */
static const type_info k_tensor_types[] = {
    [0] = {"f32", 1, 4},
    [1] = {"f16", 1, 2},
    [2] = {"q4_0", 32, 18},
    [3] = {"q4_1", 32, 20},
    /* 4, 5: q4_2 and q4_3, removed from the format */
    [6] = {"q5_0", 32, 22},
    [7] = {"q5_1", 32, 24},
    [8] = {"q8_0", 32, 34},
    [9] = {"q8_1", 32, 36},
    [10] = {"q2_k", 256, 84},
    [11] = {"q3_k", 256, 110},
    [12] = {"q4_k", 256, 144},
    [13] = {"q5_k", 256, 176},
    [14] = {"q6_k", 256, 210},
    [15] = {"q8_k", 256, 292},
    [16] = {"iq2_xxs", 256, 66},
    [17] = {"iq2_xs", 256, 74},
    [18] = {"iq3_xxs", 256, 98},
    [19] = {"iq1_s", 256, 50},
    [20] = {"iq4_nl", 32, 18},
    [21] = {"iq3_s", 256, 110},
    [22] = {"iq2_s", 256, 82},
    [23] = {"iq4_xs", 256, 136},
    [24] = {"i8", 1, 1},
    [25] = {"i16", 1, 2},
    [26] = {"i32", 1, 4},
    [27] = {"i64", 1, 8},
    [28] = {"f64", 1, 8},
    [29] = {"iq1_m", 256, 56},
    [30] = {"bf16", 1, 2},
    /* 31-33: q4_0_4_4, q4_0_4_8, q4_0_8_8 (repacked layouts), removed from GGUF files */
    [34] = {"tq1_0", 256, 54},
    [35] = {"tq2_0", 256, 66},
    /* 36-38: iq4_nl_4_4, iq4_nl_4_8, iq4_nl_8_8, removed from GGUF files */
    [39] = {"mxfp4", 32, 17},
};

static const type_info *tensor_type(uint32_t ggml_type) {
    if (ggml_type >= HR_ARRAY_LEN(k_tensor_types)) return NULL;
    const type_info *t = &k_tensor_types[ggml_type];
    return t->block_elems ? t : NULL;
}

const char *hr_gguf_tensor_type_name(uint32_t ggml_type) {
    const type_info *t = tensor_type(ggml_type);
    return t ? t->name : "unknown";
}

bool hr_gguf_tensor_type_block(uint32_t ggml_type, uint32_t *out_block_elems, uint32_t *out_block_bytes) {
    const type_info *t = tensor_type(ggml_type);
    if (!t) return false;
    if (out_block_elems) *out_block_elems = t->block_elems;
    if (out_block_bytes) *out_block_bytes = t->block_bytes;
    return true;
}

bool hr_gguf_tensor_type_size(uint32_t ggml_type, uint64_t n_elements, uint64_t *out_bytes) {
    const type_info *t = tensor_type(ggml_type);
    if (!t || n_elements % t->block_elems != 0) return false;
    uint64_t bytes;
    if (hr_mul_overflows(n_elements / t->block_elems, t->block_bytes, &bytes)) return false;
    *out_bytes = bytes;
    return true;
}

const char *hr_gguf_type_name(hr_gguf_type t) {
    switch (t) {
    case HR_GGUF_U8: return "u8";
    case HR_GGUF_I8: return "i8";
    case HR_GGUF_U16: return "u16";
    case HR_GGUF_I16: return "i16";
    case HR_GGUF_U32: return "u32";
    case HR_GGUF_I32: return "i32";
    case HR_GGUF_F32: return "f32";
    case HR_GGUF_BOOL: return "bool";
    case HR_GGUF_STRING: return "string";
    case HR_GGUF_ARRAY: return "array";
    case HR_GGUF_U64: return "u64";
    case HR_GGUF_I64: return "i64";
    case HR_GGUF_F64: return "f64";
    }
    return "invalid";
}

size_t hr_gguf_type_size(hr_gguf_type t) {
    switch (t) {
    case HR_GGUF_U8:
    case HR_GGUF_I8:
    case HR_GGUF_BOOL: return 1;
    case HR_GGUF_U16:
    case HR_GGUF_I16: return 2;
    case HR_GGUF_U32:
    case HR_GGUF_I32:
    case HR_GGUF_F32: return 4;
    case HR_GGUF_U64:
    case HR_GGUF_I64:
    case HR_GGUF_F64: return 8;
    case HR_GGUF_STRING:
    case HR_GGUF_ARRAY: return 0;
    }
    return 0;
}

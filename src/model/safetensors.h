/* safetensors.h: reading one .safetensors file (the Hugging Face weight format): an 8-byte little-endian
 * header length, a JSON header {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
 * {...}}, then the data section the offsets are relative to. The file is mapped (MAP_PRIVATE): tensor
 * data is handed out as pointers into the mapping, never copied.
 *
 * Invariants once hr_safetensors_open* has returned HR_OK:
 *   1. every tensor's [begin, end) lies inside the data section, and end - begin is its shape's
 *      element count times its dtype's size (checked arithmetic);
 *   2. no two tensors share a byte; names are unique and non-empty;
 *   3. every tensor's data is aligned to its element size in memory.
 * Every refusal is one line naming the file (and the tensor, where one is at fault). */
#ifndef HR_MODEL_SAFETENSORS_H
#define HR_MODEL_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define HR_ST_MAX_DIMS        8
#define HR_ST_MAX_HEADER_SIZE (100u << 20) /* the format's own limit on the JSON header */

typedef struct hr_safetensors hr_safetensors;

typedef struct hr_st_tensor {
    const char *name;              /* NUL-terminated, owned by the reader */
    char dtype[12];                /* as in the header: "BF16", "F16", "F32", "I8", ... */
    int dtype_id;                  /* HR_DTYPE_F32 / F16 / BF16 (tensor.h), or -1 for any other dtype */
    int n_dims;                    /* 0 (a scalar) .. HR_ST_MAX_DIMS */
    int64_t shape[HR_ST_MAX_DIMS]; /* row-major, as torch writes it: shape[n_dims - 1] is contiguous */
    uint64_t size_bytes;
    const void *data; /* into the mapping */
} hr_st_tensor;

/* Maps and validates path. */
hr_status hr_safetensors_open(const char *path, hr_safetensors **out, hr_error *err);
/* Validates a file held in memory (borrowed: it must outlive the handle); name is used in messages.
 * For tests and the fuzzer; such a handle cannot be edited. */
hr_status hr_safetensors_open_memory(const void *data, size_t size, const char *name, hr_safetensors **out,
                                     hr_error *err);
void hr_safetensors_close(hr_safetensors *s); /* NULL allowed */

const char *hr_safetensors_name(const hr_safetensors *s); /* the path (or name) it was opened with */
uint64_t hr_safetensors_file_size(const hr_safetensors *s);
size_t hr_safetensors_n_tensors(const hr_safetensors *s);
const hr_st_tensor *hr_safetensors_tensor_at(const hr_safetensors *s, size_t i);
const hr_st_tensor *hr_safetensors_find(const hr_safetensors *s, const char *name); /* NULL if absent */

/* A window in which the tensor data [p, p + n) may be written (the HF loader permutes llama's Q/K rows
 * in place): the touched pages become private copies, the file never changes, and the range is kept
 * (hr_safetensors_release never gives back its pages). begin returns false for memory lent read-only
 * (or a range outside the file); end makes the mapping read-only again. */
bool hr_safetensors_edit_begin(hr_safetensors *s, const void *p, uint64_t n);
void hr_safetensors_edit_end(hr_safetensors *s);
/* Drops the mapping's resident pages (after the loader quantized from them: what stays mapped is read
 * again from the file if touched). Does nothing once the data was edited, or for lent memory. */
void hr_safetensors_release_pages(hr_safetensors *s);
/* The whole pages of [p, p + n), tensor data of s, given back where s is a mapping of its file and none
 * of them was written (edit_begin's ranges): a later read faults the file's bytes in again. With give
 * false, only counts them. Returns those bytes, 0 for lent memory, a range outside s or one written. */
uint64_t hr_safetensors_release(hr_safetensors *s, const void *p, uint64_t n, bool give);

#endif

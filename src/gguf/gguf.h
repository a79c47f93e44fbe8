/* gguf.h: reading (mmap) and writing GGUF v2/v3 files: metadata, tensor directory, validation.
 *
 * The reader validates the whole file at open: after hr_gguf_open returns HR_OK, every accessor below
 * is safe (strings and arrays lie inside the file, tensor data lies inside the file, aligned, with a
 * size that matches its type and shape). Strings in a GGUF are not NUL-terminated, so they are
 * returned as (pointer, length) views into the mapping; they live until hr_gguf_close.
 *
 * This module knows the byte size of every ggml tensor type (a fact of the file format), so it can
 * check data extents; which types a model can compute with is the model/tensor modules' business. */
#ifndef HR_GGUF_GGUF_H
#define HR_GGUF_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

/* Metadata value types, numbered as in the GGUF specification. */
typedef enum hr_gguf_type {
    HR_GGUF_U8 = 0,
    HR_GGUF_I8 = 1,
    HR_GGUF_U16 = 2,
    HR_GGUF_I16 = 3,
    HR_GGUF_U32 = 4,
    HR_GGUF_I32 = 5,
    HR_GGUF_F32 = 6,
    HR_GGUF_BOOL = 7,
    HR_GGUF_STRING = 8,
    HR_GGUF_ARRAY = 9,
    HR_GGUF_U64 = 10,
    HR_GGUF_I64 = 11,
    HR_GGUF_F64 = 12,
} hr_gguf_type;

#define HR_GGUF_MAX_DIMS          4
#define HR_GGUF_DEFAULT_ALIGNMENT 32
#define HR_GGUF_MAX_ARRAY_DEPTH   8     /* an array of arrays of ... nests at most this deep (reader and writer) */
#define HR_GGUF_MAX_KEY_BYTES     65535 /* the specification's limit on a metadata key */

typedef struct hr_gguf hr_gguf; /* an open, validated file */

/* A string view into the file. Not NUL-terminated. */
typedef struct hr_gguf_str {
    const char *ptr;
    uint64_t len;
} hr_gguf_str;

/* An array value. For fixed-size element types `data` points at n packed little-endian elements.
 * For strings and nested arrays use hr_gguf_array_str / hr_gguf_array_sub (O(1): the reader keeps an
 * offset table built during validation). */
typedef struct hr_gguf_array {
    hr_gguf_type type; /* element type */
    uint64_t n;
    const void *data; /* fixed-size element types only */
    const void *priv; /* reader's bookkeeping; do not touch */
} hr_gguf_array;

/* One entry of the tensor directory. `data` points into the mapping. */
typedef struct hr_gguf_tensor {
    hr_gguf_str name;
    uint32_t n_dims;
    int64_t ne[HR_GGUF_MAX_DIMS]; /* ne[0] is the contiguous (row) dimension; unused dims are 1 */
    uint32_t type;                /* ggml type id (0 = F32, 1 = F16, 2 = Q4_0, 8 = Q8_0, 30 = BF16, ...) */
    uint64_t offset;              /* relative to the start of the data section */
    uint64_t size_bytes;
    const void *data;
} hr_gguf_tensor;

/* ---- reading ---------------------------------------------------------------------------------- */

/* Maps and validates `path`. Errors name the path and the problem (missing file, directory, empty,
 * bad magic, truncated, ...). */
hr_status hr_gguf_open(const char *path, hr_gguf **out, hr_error *err);

/* How the file's bytes are held:
 *   HR_GGUF_MMAP: mapped from the file (pages shared with the page cache, read in as first touched);
 *   HR_GGUF_RESIDENT: read once into private, read-only memory that the kernel is asked to back with
 *     2 MiB transparent huge pages (madvise; used where /sys/kernel/mm/transparent_hugepage allows).
 *     Streaming the weights then takes one TLB entry per 2 MiB instead of per 4 KiB, and the
 *     hardware prefetcher is not stopped at every 4 KiB page. Costs one read of the file at open. */
typedef enum hr_gguf_hold { HR_GGUF_MMAP = 0, HR_GGUF_RESIDENT = 1 } hr_gguf_hold;
hr_status hr_gguf_open_hold(const char *path, hr_gguf_hold hold, hr_gguf **out, hr_error *err);

/* Validates a GGUF held in memory (borrowed: it must outlive the returned handle). For tests and the
 * fuzzer. */
hr_status hr_gguf_open_memory(const void *data, size_t size, hr_gguf **out, hr_error *err);
/* The same for memory the lender lets the handle write (hr_gguf_edit_begin). */
hr_status hr_gguf_open_memory_mut(void *data, size_t size, hr_gguf **out, hr_error *err);

/* A window in which the tensors' data may be written (the model loader repacks weights in place,
 * model/load.c): begin returns false, and nothing may be written, for memory lent read-only; a file
 * held by hr_gguf_open* becomes private copy-on-write pages (the file never changes). end makes a
 * file's pages read-only again. */
bool hr_gguf_edit_begin(hr_gguf *g);
void hr_gguf_edit_end(hr_gguf *g);

/* Memory for a backend that keeps its own copy of the weights (the GPU's, uploaded at start): gives back
 * the whole pages of [p, p + n), tensor data of g (hr_page_span): the process stops holding them and a
 * later read faults them in from the file again, so no byte anyone reads changes. It acts only on a file
 * mapping never edited (opened with HR_GGUF_MMAP, no hr_gguf_edit_begin), where the file is the pages'
 * other copy; anywhere else (memory read from the file, lent memory, repacked weights) it gives back
 * nothing. With give false, only counts them. Returns those bytes (as hr_safetensors_release). */
uint64_t hr_gguf_release(const hr_gguf *g, const void *p, uint64_t n, bool give);

void hr_gguf_close(hr_gguf *g); /* NULL allowed */

uint32_t hr_gguf_version(const hr_gguf *g);
uint64_t hr_gguf_alignment(const hr_gguf *g);
uint64_t hr_gguf_file_size(const hr_gguf *g);
uint64_t hr_gguf_data_offset(const hr_gguf *g); /* where the tensor data section starts in the file */

/* Metadata by index. An index >= hr_gguf_n_kv is a caller bug: the key reads as empty, the type as
 * HR_GGUF_U8, and the by-index value getters below return HR_ERR_INVALID_ARG. */
uint64_t hr_gguf_n_kv(const hr_gguf *g);
hr_gguf_str hr_gguf_kv_key(const hr_gguf *g, uint64_t i);
hr_gguf_type hr_gguf_kv_type(const hr_gguf *g, uint64_t i);

/* Index of `key` (NUL-terminated), or -1. */
int64_t hr_gguf_find_key(const hr_gguf *g, const char *key);

/* Typed getters by key. Each returns HR_ERR_NOT_FOUND when the key is absent and HR_ERR_FORMAT when
 * it has an incompatible type (the message names key, expected and found type).
 * get_int accepts any integer type (and bool); get_float accepts f32/f64 and integers. */
hr_status hr_gguf_get_int(const hr_gguf *g, const char *key, int64_t *out, hr_error *err);
hr_status hr_gguf_get_float(const hr_gguf *g, const char *key, double *out, hr_error *err);
hr_status hr_gguf_get_bool(const hr_gguf *g, const char *key, bool *out, hr_error *err);
hr_status hr_gguf_get_str(const hr_gguf *g, const char *key, hr_gguf_str *out, hr_error *err);
hr_status hr_gguf_get_array(const hr_gguf *g, const char *key, hr_gguf_array *out, hr_error *err);

/* Convenience: copies a string value into buf as a NUL-terminated string (truncating safely). */
hr_status hr_gguf_get_cstr(const hr_gguf *g, const char *key, char *buf, size_t buf_len, hr_error *err);

/* Scalar value by index, for listing metadata: the value as int64/double/bool/str per its type.
 * kv_int accepts integer types and bool (a u64 above INT64_MAX gives HR_ERR_RANGE); kv_float accepts
 * f32/f64 and integers; a value of another type gives HR_ERR_FORMAT. */
hr_status hr_gguf_kv_int(const hr_gguf *g, uint64_t i, int64_t *out);
hr_status hr_gguf_kv_float(const hr_gguf *g, uint64_t i, double *out);
hr_status hr_gguf_kv_str(const hr_gguf *g, uint64_t i, hr_gguf_str *out);
hr_status hr_gguf_kv_array(const hr_gguf *g, uint64_t i, hr_gguf_array *out);

/* Element access for arrays (i < arr->n). A wrong type or index gives an empty string / empty array /
 * 0 rather than a crash. array_int reads bool as 0/1 and a u64 above INT64_MAX wrapped. */
hr_gguf_str hr_gguf_array_str(const hr_gguf_array *arr, uint64_t i);   /* type STRING */
hr_gguf_array hr_gguf_array_sub(const hr_gguf_array *arr, uint64_t i); /* type ARRAY */
int64_t hr_gguf_array_int(const hr_gguf_array *arr, uint64_t i);       /* integer types */
double hr_gguf_array_float(const hr_gguf_array *arr, uint64_t i);      /* f32/f64/ints */

/* Tensor directory. */
uint64_t hr_gguf_n_tensors(const hr_gguf *g);
const hr_gguf_tensor *hr_gguf_tensor_at(const hr_gguf *g, uint64_t i);
const hr_gguf_tensor *hr_gguf_find_tensor(const hr_gguf *g, const char *name); /* NULL if absent */

/* Name of a metadata type ("u32", "string", ...) and of a ggml tensor type ("f32", "q4_0", ...;
 * "unknown" for ids the format does not define). */
const char *hr_gguf_type_name(hr_gguf_type t);
const char *hr_gguf_tensor_type_name(uint32_t ggml_type);

/* Bytes taken by n_elements of a ggml tensor type; false when the type id is unknown or n_elements
 * is not a multiple of the type's block. */
bool hr_gguf_tensor_type_size(uint32_t ggml_type, uint64_t n_elements, uint64_t *out_bytes);

/* Block layout of a ggml tensor type (values per block, bytes per block); false for unknown ids. */
bool hr_gguf_tensor_type_block(uint32_t ggml_type, uint32_t *out_block_elems, uint32_t *out_block_bytes);

/* Bytes of one value of a fixed-size metadata type; 0 for STRING, ARRAY and invalid types. */
size_t hr_gguf_type_size(hr_gguf_type t);

/* ---- writing ---------------------------------------------------------------------------------- */

typedef struct hr_gguf_writer hr_gguf_writer;

/* version 2 or 3 (anything else is reported by write_*). Values are copied at the time of the call;
 * setting a key again replaces its value in place. Returns NULL only when allocation fails; every
 * setter accepts a NULL writer and does nothing. */
hr_gguf_writer *hr_gguf_writer_create(uint32_t version);
void hr_gguf_writer_destroy(hr_gguf_writer *w); /* NULL allowed */

void hr_gguf_writer_set_alignment(hr_gguf_writer *w, uint32_t alignment); /* also writes general.alignment */
void hr_gguf_writer_set_u32(hr_gguf_writer *w, const char *key, uint32_t v);
void hr_gguf_writer_set_i32(hr_gguf_writer *w, const char *key, int32_t v);
void hr_gguf_writer_set_u64(hr_gguf_writer *w, const char *key, uint64_t v);
void hr_gguf_writer_set_f32(hr_gguf_writer *w, const char *key, float v);
void hr_gguf_writer_set_bool(hr_gguf_writer *w, const char *key, bool v);
void hr_gguf_writer_set_str(hr_gguf_writer *w, const char *key, const char *v);
/* An array of fixed-size elements (type must not be STRING or ARRAY). */
void hr_gguf_writer_set_array(hr_gguf_writer *w, const char *key, hr_gguf_type type, const void *data, uint64_t n);
void hr_gguf_writer_set_str_array(hr_gguf_writer *w, const char *key, const char *const *strs, uint64_t n);

/* The remaining scalar types. */
void hr_gguf_writer_set_u8(hr_gguf_writer *w, const char *key, uint8_t v);
void hr_gguf_writer_set_i8(hr_gguf_writer *w, const char *key, int8_t v);
void hr_gguf_writer_set_u16(hr_gguf_writer *w, const char *key, uint16_t v);
void hr_gguf_writer_set_i16(hr_gguf_writer *w, const char *key, int16_t v);
void hr_gguf_writer_set_i64(hr_gguf_writer *w, const char *key, int64_t v);
void hr_gguf_writer_set_f64(hr_gguf_writer *w, const char *key, double v);
/* A string with an explicit length (may hold any bytes, including NUL). */
void hr_gguf_writer_set_strn(hr_gguf_writer *w, const char *key, const char *v, uint64_t len);

/* Any array, including arrays of arrays, described by an hr_gguf_array tree (priv is ignored):
 * fixed-size element types: `data` points at n packed elements;
 * HR_GGUF_STRING: `data` is a `const char *const *` of n NUL-terminated strings;
 * HR_GGUF_ARRAY: `data` is a `const hr_gguf_array *` of n inner arrays described the same way.
 * Nesting deeper than HR_GGUF_MAX_ARRAY_DEPTH is reported by write_*. */
void hr_gguf_writer_set_nested_array(hr_gguf_writer *w, const char *key, const hr_gguf_array *arr);

/* Adds a tensor; `data` (size_bytes, must match type and shape) is copied unless `borrow` is true, in
 * which case it must stay valid until the file is written. */
void hr_gguf_writer_add_tensor(hr_gguf_writer *w, const char *name, uint32_t ggml_type, uint32_t n_dims,
                               const int64_t *ne, const void *data, uint64_t size_bytes, bool borrow);

/* Writes the file. Reports the first misuse recorded by the setters (e.g. a size mismatch) here. */
hr_status hr_gguf_writer_write_file(hr_gguf_writer *w, const char *path, hr_error *err);
/* Writes to a malloc'd buffer the caller frees. */
hr_status hr_gguf_writer_write_memory(hr_gguf_writer *w, void **out_data, size_t *out_size, hr_error *err);

#endif

/* gguf_write.c: builds a GGUF v2/v3 file from metadata and tensors set one call at a time.
 *
 * Layout written (little-endian): header; metadata entries in the order first set; the tensor
 * directory with offsets relative to the data section; zero padding to the alignment; each tensor's
 * data followed by zero padding to the alignment. That is what llama.cpp's own writer produces, so
 * its reader (which wants each tensor exactly where the previous one's padding ends) accepts it.
 *
 * Setters never fail visibly: the first misuse (bad key, size mismatch, allocation failure) is kept
 * and reported by write_*, so a caller can chain setters and check once. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "gguf/gguf.h"
#include "gguf/gguf_internal.h"

#define TENSOR_NAME_MAX 63 /* llama.cpp's limit (GGML_MAX_NAME 64 with the NUL) */

typedef struct bytes {
    uint8_t *p;
    size_t len, cap;
    bool failed; /* an allocation failed; p holds a prefix */
} bytes;

typedef struct wkv {
    char *key;
    hr_gguf_type type;
    bytes value; /* the encoded value, without its type */
} wkv;

typedef struct wtensor {
    char *name;
    uint32_t type, n_dims;
    int64_t ne[HR_GGUF_MAX_DIMS];
    const void *data;
    void *owned; /* the copy when not borrowed */
    uint64_t size_bytes;
    uint64_t offset; /* assigned at write time */
} wtensor;

struct hr_gguf_writer {
    uint32_t version;
    wkv *kvs;
    size_t n_kv, cap_kv;
    wtensor *tensors;
    size_t n_tensors, cap_tensors;
    hr_error first; /* first misuse; code HR_OK while none */
};

/* ---- byte buffers ------------------------------------------------------------------------------- */

static void put(bytes *b, const void *src, size_t n) {
    if (b->failed || n == 0) return;
    if (n > SIZE_MAX - b->len) {
        b->failed = true;
        return;
    }
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n) cap = cap > SIZE_MAX / 2 ? b->len + n : cap * 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->failed = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (src)
        memcpy(b->p + b->len, src, n);
    else
        memset(b->p + b->len, 0, n);
    b->len += n;
}

static void put_u32(bytes *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(b, x, 4);
}

static void put_u64(bytes *b, uint64_t v) {
    put_u32(b, (uint32_t)v);
    put_u32(b, (uint32_t)(v >> 32));
}

static void put_str(bytes *b, const char *s, uint64_t len) {
    put_u64(b, len);
    put(b, s, (size_t)len);
}

/* Fixed-size values go out little-endian whatever the host order. */
static void put_elems(bytes *b, hr_gguf_type type, const void *data, uint64_t n) {
    size_t esz = hr_gguf_type_size(type);
    const uint8_t *p = data;
    for (uint64_t i = 0; i < n && !b->failed; i++, p += esz) {
        if (esz == 1) {
            put(b, p, 1);
        } else if (esz == 2) {
            uint16_t v;
            memcpy(&v, p, 2);
            uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
            put(b, x, 2);
        } else if (esz == 4) {
            uint32_t v;
            memcpy(&v, p, 4);
            put_u32(b, v);
        } else {
            uint64_t v;
            memcpy(&v, p, 8);
            put_u64(b, v);
        }
    }
}

/* ---- misuse ------------------------------------------------------------------------------------- */

__attribute__((format(printf, 3, 4))) static void misuse(hr_gguf_writer *w, hr_status code, const char *fmt, ...) {
    if (w->first.code != HR_OK) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->first.msg, sizeof w->first.msg, fmt, ap);
    va_end(ap);
    w->first.code = code;
}

static bool key_ok(hr_gguf_writer *w, const char *key) {
    if (!key || !*key) {
        misuse(w, HR_ERR_INVALID_ARG, "GGUF writer: empty or NULL metadata key");
        return false;
    }
    size_t len = strlen(key);
    if (len > HR_GGUF_MAX_KEY_BYTES) {
        misuse(w, HR_ERR_INVALID_ARG, "GGUF writer: key of %zu bytes is longer than the %d allowed", len,
               HR_GGUF_MAX_KEY_BYTES);
        return false;
    }
    if (hr_gguf_utf8_invalid_at((const uint8_t *)key, len) < len) {
        misuse(w, HR_ERR_INVALID_ARG, "GGUF writer: key '%.64s' is not valid UTF-8", key);
        return false;
    }
    return true;
}

/* ---- create / destroy --------------------------------------------------------------------------- */

hr_gguf_writer *hr_gguf_writer_create(uint32_t version) {
    hr_gguf_writer *w = calloc(1, sizeof *w);
    if (w) w->version = version;
    return w;
}

void hr_gguf_writer_destroy(hr_gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kvs[i].key);
        free(w->kvs[i].value.p);
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].owned);
    }
    free(w->kvs);
    free(w->tensors);
    free(w);
}

/* ---- metadata ----------------------------------------------------------------------------------- */

/* Stores key = (type, value), taking value's buffer. Replaces an existing value in place. */
static void set_value(hr_gguf_writer *w, const char *key, hr_gguf_type type, bytes *value) {
    if (value->failed) {
        misuse(w, HR_ERR_NOMEM, "GGUF writer: out of memory encoding '%.64s'", key);
        free(value->p);
        return;
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, key) == 0) {
            free(w->kvs[i].value.p);
            w->kvs[i].type = type;
            w->kvs[i].value = *value;
            return;
        }
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? w->cap_kv * 2 : 16;
        wkv *kvs = realloc(w->kvs, cap * sizeof *kvs);
        if (!kvs) {
            misuse(w, HR_ERR_NOMEM, "GGUF writer: out of memory adding '%.64s'", key);
            free(value->p);
            return;
        }
        w->kvs = kvs;
        w->cap_kv = cap;
    }
    char *k = strdup(key);
    if (!k) {
        misuse(w, HR_ERR_NOMEM, "GGUF writer: out of memory adding '%.64s'", key);
        free(value->p);
        return;
    }
    w->kvs[w->n_kv++] = (wkv){.key = k, .type = type, .value = *value};
}

static void set_scalar(hr_gguf_writer *w, const char *key, hr_gguf_type type, const void *v) {
    if (!w || !key_ok(w, key)) return;
    bytes b = {0};
    put_elems(&b, type, v, 1);
    set_value(w, key, type, &b);
}

void hr_gguf_writer_set_u8(hr_gguf_writer *w, const char *key, uint8_t v) { set_scalar(w, key, HR_GGUF_U8, &v); }
void hr_gguf_writer_set_i8(hr_gguf_writer *w, const char *key, int8_t v) { set_scalar(w, key, HR_GGUF_I8, &v); }
void hr_gguf_writer_set_u16(hr_gguf_writer *w, const char *key, uint16_t v) { set_scalar(w, key, HR_GGUF_U16, &v); }
void hr_gguf_writer_set_i16(hr_gguf_writer *w, const char *key, int16_t v) { set_scalar(w, key, HR_GGUF_I16, &v); }
void hr_gguf_writer_set_u32(hr_gguf_writer *w, const char *key, uint32_t v) { set_scalar(w, key, HR_GGUF_U32, &v); }
void hr_gguf_writer_set_i32(hr_gguf_writer *w, const char *key, int32_t v) { set_scalar(w, key, HR_GGUF_I32, &v); }
void hr_gguf_writer_set_u64(hr_gguf_writer *w, const char *key, uint64_t v) { set_scalar(w, key, HR_GGUF_U64, &v); }
void hr_gguf_writer_set_i64(hr_gguf_writer *w, const char *key, int64_t v) { set_scalar(w, key, HR_GGUF_I64, &v); }
void hr_gguf_writer_set_f32(hr_gguf_writer *w, const char *key, float v) { set_scalar(w, key, HR_GGUF_F32, &v); }
void hr_gguf_writer_set_f64(hr_gguf_writer *w, const char *key, double v) { set_scalar(w, key, HR_GGUF_F64, &v); }

void hr_gguf_writer_set_bool(hr_gguf_writer *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    set_scalar(w, key, HR_GGUF_BOOL, &b);
}

void hr_gguf_writer_set_alignment(hr_gguf_writer *w, uint32_t alignment) {
    if (!w) return;
    if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
        misuse(w, HR_ERR_INVALID_ARG, "GGUF writer: alignment %" PRIu32 " is not a nonzero power of two", alignment);
        return;
    }
    hr_gguf_writer_set_u32(w, "general.alignment", alignment);
}

void hr_gguf_writer_set_strn(hr_gguf_writer *w, const char *key, const char *v, uint64_t len) {
    if (!w || !key_ok(w, key)) return;
    if (!v && len) {
        misuse(w, HR_ERR_INVALID_ARG, "GGUF writer: NULL string for '%.64s'", key);
        return;
    }
    bytes b = {0};
    put_str(&b, v, len);
    set_value(w, key, HR_GGUF_STRING, &b);
}

void hr_gguf_writer_set_str(hr_gguf_writer *w, const char *key, const char *v) {
    if (!w) return;
    if (!v) {
        misuse(w, HR_ERR_INVALID_ARG, "GGUF writer: NULL string for '%.64s'", key ? key : "(null)");
        return;
    }
    hr_gguf_writer_set_strn(w, key, v, strlen(v));
}

/* Encodes arr (element type, count, elements) after checking it; false (with a misuse) if bad. */
static bool encode_array(hr_gguf_writer *w, const char *key, bytes *b, const hr_gguf_array *arr, unsigned depth) {
    if (depth > HR_GGUF_MAX_ARRAY_DEPTH) {
        misuse(w, HR_ERR_INVALID_ARG, "GGUF writer: array '%.64s' nests deeper than %d levels", key,
               HR_GGUF_MAX_ARRAY_DEPTH);
        return false;
    }
    if ((unsigned)arr->type > HR_GGUF_F64) {
        misuse(w, HR_ERR_INVALID_ARG, "GGUF writer: array '%.64s' has invalid element type %d", key, (int)arr->type);
        return false;
    }
    if (arr->n && !arr->data) {
        misuse(w, HR_ERR_INVALID_ARG, "GGUF writer: array '%.64s' has %" PRIu64 " elements but no data", key, arr->n);
        return false;
    }
    put_u32(b, (uint32_t)arr->type);
    put_u64(b, arr->n);
    if (arr->type == HR_GGUF_STRING) {
        const char *const *strs = arr->data;
        for (uint64_t i = 0; i < arr->n; i++) {
            if (!strs[i]) {
                misuse(w, HR_ERR_INVALID_ARG, "GGUF writer: string %" PRIu64 " of array '%.64s' is NULL", i, key);
                return false;
            }
            put_str(b, strs[i], strlen(strs[i]));
        }
    } else if (arr->type == HR_GGUF_ARRAY) {
        const hr_gguf_array *subs = arr->data;
        for (uint64_t i = 0; i < arr->n; i++)
            if (!encode_array(w, key, b, &subs[i], depth + 1)) return false;
    } else {
        put_elems(b, arr->type, arr->data, arr->n);
    }
    return true;
}

void hr_gguf_writer_set_nested_array(hr_gguf_writer *w, const char *key, const hr_gguf_array *arr) {
    if (!w || !key_ok(w, key)) return;
    if (!arr) {
        misuse(w, HR_ERR_INVALID_ARG, "GGUF writer: NULL array for '%.64s'", key);
        return;
    }
    bytes b = {0};
    if (!encode_array(w, key, &b, arr, 1)) {
        free(b.p);
        return;
    }
    set_value(w, key, HR_GGUF_ARRAY, &b);
}

void hr_gguf_writer_set_array(hr_gguf_writer *w, const char *key, hr_gguf_type type, const void *data, uint64_t n) {
    if (!w) return;
    if (type == HR_GGUF_STRING || type == HR_GGUF_ARRAY) {
        misuse(w, HR_ERR_INVALID_ARG,
               "GGUF writer: set_array('%.64s') takes fixed-size elements; use set_str_array or set_nested_array",
               key ? key : "(null)");
        return;
    }
    hr_gguf_array arr = {.type = type, .n = n, .data = data};
    hr_gguf_writer_set_nested_array(w, key, &arr);
}

void hr_gguf_writer_set_str_array(hr_gguf_writer *w, const char *key, const char *const *strs, uint64_t n) {
    hr_gguf_array arr = {.type = HR_GGUF_STRING, .n = n, .data = strs};
    hr_gguf_writer_set_nested_array(w, key, &arr);
}

/* ---- tensors ------------------------------------------------------------------------------------ */

void hr_gguf_writer_add_tensor(hr_gguf_writer *w, const char *name, uint32_t ggml_type, uint32_t n_dims,
                               const int64_t *ne, const void *data, uint64_t size_bytes, bool borrow) {
    if (!w) return;
    if (!name || !*name || strlen(name) > TENSOR_NAME_MAX) {
        misuse(w, HR_ERR_INVALID_ARG, "GGUF writer: tensor name '%.64s' must have 1..%d bytes", name ? name : "(null)",
               TENSOR_NAME_MAX);
        return;
    }
    for (size_t i = 0; i < w->n_tensors; i++) {
        if (strcmp(w->tensors[i].name, name) == 0) {
            misuse(w, HR_ERR_INVALID_ARG, "GGUF writer: duplicate tensor name '%s'", name);
            return;
        }
    }
    if (n_dims == 0 || n_dims > HR_GGUF_MAX_DIMS || !ne) {
        misuse(w, HR_ERR_INVALID_ARG, "GGUF writer: tensor '%s' has n_dims %" PRIu32 ", expected 1..%d", name, n_dims,
               HR_GGUF_MAX_DIMS);
        return;
    }
    wtensor t = {.type = ggml_type, .n_dims = n_dims, .size_bytes = size_bytes};
    uint64_t n_elems = 1;
    for (uint32_t d = 0; d < HR_GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] <= 0 || hr_mul_overflows(n_elems, (uint64_t)t.ne[d], &n_elems) || n_elems > (uint64_t)INT64_MAX) {
            misuse(w, HR_ERR_INVALID_ARG,
                   "GGUF writer: tensor '%s' has a bad shape (dimension %" PRIu32 " = %" PRId64 ")", name, d, t.ne[d]);
            return;
        }
    }
    uint32_t blck;
    uint64_t expect;
    if (!hr_gguf_tensor_type_block(ggml_type, &blck, NULL)) {
        misuse(w, HR_ERR_INVALID_ARG, "GGUF writer: tensor '%s' has unknown ggml type id %" PRIu32, name, ggml_type);
        return;
    }
    if ((uint64_t)t.ne[0] % blck != 0 || !hr_gguf_tensor_type_size(ggml_type, n_elems, &expect)) {
        misuse(w, HR_ERR_INVALID_ARG,
               "GGUF writer: tensor '%s' rows of %" PRId64 " are not a multiple of %s's block of %" PRIu32, name,
               t.ne[0], hr_gguf_tensor_type_name(ggml_type), blck);
        return;
    }
    if (expect != size_bytes || (!data && size_bytes)) {
        misuse(w, HR_ERR_INVALID_ARG,
               "GGUF writer: tensor '%s' (%s) needs %" PRIu64 " bytes of data, got %" PRIu64 "%s", name,
               hr_gguf_tensor_type_name(ggml_type), expect, size_bytes, data ? "" : " (NULL data)");
        return;
    }
    if (w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? w->cap_tensors * 2 : 16;
        wtensor *ts = realloc(w->tensors, cap * sizeof *ts);
        if (!ts) {
            misuse(w, HR_ERR_NOMEM, "GGUF writer: out of memory adding tensor '%s'", name);
            return;
        }
        w->tensors = ts;
        w->cap_tensors = cap;
    }
    t.name = strdup(name);
    if (!borrow && size_bytes) {
        t.owned = size_bytes <= SIZE_MAX ? malloc((size_t)size_bytes) : NULL;
        if (t.owned) memcpy(t.owned, data, (size_t)size_bytes);
    }
    if (!t.name || (!borrow && size_bytes && !t.owned)) {
        free(t.name);
        free(t.owned);
        misuse(w, HR_ERR_NOMEM, "GGUF writer: out of memory copying tensor '%s'", name);
        return;
    }
    t.data = borrow ? data : t.owned;
    w->tensors[w->n_tensors++] = t;
}

/* ---- writing ------------------------------------------------------------------------------------ */

static uint64_t pad_to(uint64_t n, uint64_t align) { return (align - n % align) % align; }

/* Checks the writer and encodes everything before the tensor data (padded to the alignment) into
 * meta; sets *out_align and *out_data_bytes (the padded data section). */
static hr_status build_meta(hr_gguf_writer *w, bytes *meta, uint64_t *out_align, uint64_t *out_data_bytes,
                            hr_error *err) {
    if (!w) return hr_error_set(err, HR_ERR_INVALID_ARG, "GGUF writer is NULL (creation failed?)");
    if (w->first.code != HR_OK) return hr_error_set(err, w->first.code, "%s", w->first.msg);
    if (w->version != 2 && w->version != 3)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "GGUF writer: version %" PRIu32 " requested, expected 2 or 3",
                            w->version);
    uint64_t align = HR_GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, "general.alignment") != 0) continue;
        const uint8_t *v = w->kvs[i].value.p;
        uint32_t a = w->kvs[i].type == HR_GGUF_U32
                         ? (uint32_t)v[0] | (uint32_t)v[1] << 8 | (uint32_t)v[2] << 16 | (uint32_t)v[3] << 24
                         : 0;
        if (a == 0 || (a & (a - 1)) != 0)
            return hr_error_set(err, HR_ERR_INVALID_ARG,
                                "GGUF writer: general.alignment must be a u32 nonzero power of two (type %s)",
                                hr_gguf_type_name(w->kvs[i].type));
        align = a;
    }

    put(meta, "GGUF", 4);
    put_u32(meta, w->version);
    put_u64(meta, w->n_tensors);
    put_u64(meta, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        put_str(meta, w->kvs[i].key, strlen(w->kvs[i].key));
        put_u32(meta, (uint32_t)w->kvs[i].type);
        put(meta, w->kvs[i].value.p, w->kvs[i].value.len);
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        wtensor *t = &w->tensors[i];
        t->offset = offset;
        put_str(meta, t->name, strlen(t->name));
        put_u32(meta, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) put_u64(meta, (uint64_t)t->ne[d]);
        put_u32(meta, t->type);
        put_u64(meta, t->offset);
        if (hr_add_overflows(offset, t->size_bytes, &offset) ||
            hr_add_overflows(offset, pad_to(offset, align), &offset))
            return hr_error_set(err, HR_ERR_RANGE, "GGUF writer: tensor data exceeds 2^64 bytes");
    }
    put(meta, NULL, (size_t)pad_to(meta->len, align));
    if (meta->failed) return hr_error_set(err, HR_ERR_NOMEM, "GGUF writer: out of memory encoding the metadata");
    *out_align = align;
    *out_data_bytes = offset;
    return HR_OK;
}

hr_status hr_gguf_writer_write_memory(hr_gguf_writer *w, void **out_data, size_t *out_size, hr_error *err) {
    if (!out_data || !out_size) return hr_error_set(err, HR_ERR_INVALID_ARG, "GGUF writer: NULL output pointer");
    bytes meta = {0};
    uint64_t align, data_bytes, total;
    hr_status rc = build_meta(w, &meta, &align, &data_bytes, err);
    if (rc != HR_OK) {
        free(meta.p);
        return rc;
    }
    uint8_t *out = NULL;
    if (!hr_add_overflows(meta.len, data_bytes, &total) && total <= SIZE_MAX) out = calloc(1, (size_t)total);
    if (!out) {
        free(meta.p);
        return hr_error_set(err, HR_ERR_NOMEM, "GGUF writer: cannot allocate %" PRIu64 " bytes for the file", total);
    }
    memcpy(out, meta.p, meta.len);
    for (size_t i = 0; i < w->n_tensors; i++)
        if (w->tensors[i].size_bytes)
            memcpy(out + meta.len + w->tensors[i].offset, w->tensors[i].data, (size_t)w->tensors[i].size_bytes);
    free(meta.p);
    *out_data = out;
    *out_size = (size_t)total;
    return HR_OK;
}

hr_status hr_gguf_writer_write_file(hr_gguf_writer *w, const char *path, hr_error *err) {
    if (!path) return hr_error_set(err, HR_ERR_INVALID_ARG, "GGUF writer: NULL path");
    bytes meta = {0};
    uint64_t align, data_bytes;
    hr_status rc = build_meta(w, &meta, &align, &data_bytes, err);
    if (rc != HR_OK) {
        free(meta.p);
        return rc;
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(meta.p);
        char ebuf[128];
        return hr_error_set(err, HR_ERR_IO, "cannot create '%s': %s", path, strerror_r(errno, ebuf, sizeof ebuf));
    }
    static const uint8_t zeros[256];
    bool ok = fwrite(meta.p, 1, meta.len, f) == meta.len;
    for (size_t i = 0; ok && i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        ok = fwrite(t->data, 1, (size_t)t->size_bytes, f) == t->size_bytes;
        for (uint64_t pad = pad_to(t->size_bytes, align); ok && pad > 0;) {
            size_t n = (size_t)HR_MIN(pad, (uint64_t)sizeof zeros);
            ok = fwrite(zeros, 1, n, f) == n;
            pad -= n;
        }
    }
    int saved = errno;
    if (fclose(f) != 0 && ok) {
        ok = false;
        saved = errno;
    }
    free(meta.p);
    if (!ok) {
        unlink(path);
        char ebuf[128];
        return hr_error_set(err, HR_ERR_IO, "cannot write '%s': %s", path, strerror_r(saved, ebuf, sizeof ebuf));
    }
    return HR_OK;
}

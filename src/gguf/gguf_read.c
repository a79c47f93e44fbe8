/* gguf_read.c: opens a GGUF v2/v3 file (mmap, or memory the caller lends) and validates all of it.
 *
 * Invariants once hr_gguf_open* has returned HR_OK:
 *   1. every key, string, array and tensor extent lies inside [base, base + size);
 *   2. every array value has an arr_node whose tables locate each string / inner array in O(1);
 *   3. keys are unique, non-empty, valid UTF-8; tensor names are unique and non-empty;
 *   4. tensor data is aligned to the file's alignment, sized by its type and shape, and no two tensors
 *      share a byte.
 * During validation every read of file bytes goes through the bounds-checked cursor below, and every
 * size computed from file fields uses checked arithmetic; the accessors afterwards rely on 1-4. */
#include "gguf/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "gguf/gguf_internal.h"

#define GGUF_HEADER_BYTES 24 /* magic, u32 version, u64 tensor count, u64 metadata count */
#define MIN_KV_BYTES      14 /* u64 key length, >= 1 key byte, u32 value type, >= 1 value byte */
#define MIN_TENSOR_BYTES  33 /* u64 name length, >= 1 name byte, u32 n_dims, >= 1 u64 dim, u32 type, u64 offset */
#define MIN_STRING_BYTES  8  /* the u64 length of an empty string */
#define MIN_ARRAY_BYTES   12 /* u32 element type + u64 count of an empty array */
#define NAME_SHOW_MAX     64 /* bytes of a key or tensor name quoted in a message */

/* ---- structures --------------------------------------------------------------------------------- */

/* Where the elements of one array value lie. Inner arrays of an array of arrays are nodes too. */
typedef struct arr_node {
    hr_gguf_type type;      /* element type */
    uint64_t n;             /* element count */
    const uint8_t *data;    /* first element */
    const uint8_t **str_at; /* STRING: the length prefix of each element (n entries) */
    struct arr_node *sub;   /* ARRAY: the n inner arrays */
} arr_node;

typedef struct kv_entry {
    hr_gguf_str key; /* first member: name_index reads names at offset 0 */
    hr_gguf_type type;
    const uint8_t *value; /* the value's bytes, just after its type */
    arr_node *arr;        /* ARRAY values */
} kv_entry;

/* An open-addressing hash set of entry indices, keyed by the hr_gguf_str at offset 0 of each entry
 * (kv_entry and hr_gguf_tensor both start with their name). Slots hold index + 1; 0 is empty. */
typedef struct name_index {
    uint64_t *slots;
    uint64_t mask;
    const void *entries;
    size_t stride;
} name_index;

struct hr_gguf {
    const uint8_t *base;
    uint64_t size;
    bool mapped;   /* base is our mmap (else borrowed memory) */
    bool file_map; /* that mmap is the file's (HR_GGUF_MMAP), not memory read from it */
    bool edited;   /* hr_gguf_edit_begin made the mapping writable: its pages may be the only copy */
    bool writable; /* borrowed memory the lender lets us write (hr_gguf_open_memory_mut) */
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    uint64_t n_kv;
    kv_entry *kvs;
    name_index key_index;
    uint64_t n_tensors;
    hr_gguf_tensor *tensors;
    name_index tensor_index;
};

/* ---- little-endian decoding --------------------------------------------------------------------- */

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | ((uint64_t)le32(p + 4) << 32); }

/* ---- message helpers ---------------------------------------------------------------------------- */

/* Writes a name for a one-line message: printable ASCII as is, other bytes as \xNN, cut at
 * NAME_SHOW_MAX bytes with "...". Returns buf. */
static const char *show_name(const uint8_t *p, uint64_t len, char *buf, size_t cap) {
    size_t o = 0;
    uint64_t n = HR_MIN(len, (uint64_t)NAME_SHOW_MAX);
    for (uint64_t i = 0; i < n && o + 5 < cap; i++) {
        uint8_t ch = p[i];
        if (ch >= 0x20 && ch < 0x7f && ch != '\\') {
            buf[o++] = (char)ch;
        } else {
            snprintf(buf + o, cap - o, "\\x%02x", ch);
            o += 4;
        }
    }
    if (len > n && o + 4 < cap) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o] = '\0';
    return buf;
}

#define SHOW_BUF       (NAME_SHOW_MAX * 4 + 8)
#define SHOW(str, buf) show_name((const uint8_t *)(str).ptr, (str).len, buf, sizeof buf)

/* ---- the bounds-checked cursor ------------------------------------------------------------------ */

#define NO_INDEX UINT64_MAX

typedef struct cursor {
    const uint8_t *base;
    uint64_t size, pos;
    hr_error *err;
    const char *section; /* what is being read, for messages: "header", "metadata entry", "tensor" */
    uint64_t index;      /* which one, or NO_INDEX */
} cursor;

static uint64_t cur_left(const cursor *c) { return c->size - c->pos; }

static hr_status cur_truncated(const cursor *c, const char *item, uint64_t need) {
    if (c->index == NO_INDEX)
        return hr_error_set(c->err, HR_ERR_FORMAT,
                            "truncated: %s of the %s at offset %" PRIu64 " needs %" PRIu64 " bytes but only %" PRIu64
                            " remain (file is %" PRIu64 " bytes)",
                            item, c->section, c->pos, need, cur_left(c), c->size);
    return hr_error_set(c->err, HR_ERR_FORMAT,
                        "truncated: %s of %s %" PRIu64 " at offset %" PRIu64 " needs %" PRIu64
                        " bytes but only %" PRIu64 " remain (file is %" PRIu64 " bytes)",
                        item, c->section, c->index, c->pos, need, cur_left(c), c->size);
}

static hr_status cur_u32(cursor *c, const char *item, uint32_t *out) {
    if (cur_left(c) < 4) return cur_truncated(c, item, 4);
    *out = le32(c->base + c->pos);
    c->pos += 4;
    return HR_OK;
}

static hr_status cur_u64(cursor *c, const char *item, uint64_t *out) {
    if (cur_left(c) < 8) return cur_truncated(c, item, 8);
    *out = le64(c->base + c->pos);
    c->pos += 8;
    return HR_OK;
}

static hr_status cur_skip(cursor *c, const char *item, uint64_t n) {
    if (cur_left(c) < n) return cur_truncated(c, item, n);
    c->pos += n;
    return HR_OK;
}

/* A GGUF string: u64 length, then that many bytes. A length larger than the whole file is reported
 * as absurd (a corrupt or foreign field) rather than as truncation. */
static hr_status cur_str(cursor *c, const char *item, hr_gguf_str *out) {
    uint64_t len = 0;
    hr_status rc = cur_u64(c, item, &len);
    if (rc != HR_OK) return rc;
    if (len > c->size) {
        const char *sec = c->section;
        if (c->index == NO_INDEX)
            return hr_error_set(c->err, HR_ERR_FORMAT,
                                "absurd string length %" PRIu64 " for %s of the %s at offset %" PRIu64
                                " (the whole file is %" PRIu64 " bytes)",
                                len, item, sec, c->pos - 8, c->size);
        return hr_error_set(c->err, HR_ERR_FORMAT,
                            "absurd string length %" PRIu64 " for %s of %s %" PRIu64 " at offset %" PRIu64
                            " (the whole file is %" PRIu64 " bytes)",
                            len, item, sec, c->index, c->pos - 8, c->size);
    }
    if (cur_left(c) < len) return cur_truncated(c, item, len);
    out->ptr = (const char *)(c->base + c->pos);
    out->len = len;
    c->pos += len;
    return HR_OK;
}

/* ---- name index --------------------------------------------------------------------------------- */

static uint64_t hash_bytes(const void *p, uint64_t len) {
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a */
    for (uint64_t i = 0; i < len; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

static const hr_gguf_str *index_name(const name_index *ix, uint64_t i) {
    return (const hr_gguf_str *)((const char *)ix->entries + i * ix->stride);
}

static hr_status index_init(name_index *ix, uint64_t n, const void *entries, size_t stride) {
    uint64_t cap = 16;
    while (cap < 2 * n) cap *= 2; /* n is bounded by file size / 14, so this cannot overflow */
    ix->slots = calloc(cap, sizeof *ix->slots);
    if (!ix->slots) return HR_ERR_NOMEM;
    ix->mask = cap - 1;
    ix->entries = entries;
    ix->stride = stride;
    return HR_OK;
}

/* Finds name; returns its entry index or -1. */
static int64_t index_find(const name_index *ix, const void *name, uint64_t len) {
    if (!ix->slots) return -1;
    for (uint64_t s = hash_bytes(name, len) & ix->mask;; s = (s + 1) & ix->mask) {
        uint64_t v = ix->slots[s];
        if (v == 0) return -1;
        const hr_gguf_str *e = index_name(ix, v - 1);
        if (e->len == len && memcmp(e->ptr, name, len) == 0) return (int64_t)(v - 1);
    }
}

/* Adds entry i (its name already stored); returns -1, or the index of an earlier entry of that name. */
static int64_t index_insert(name_index *ix, uint64_t i) {
    const hr_gguf_str *name = index_name(ix, i);
    for (uint64_t s = hash_bytes(name->ptr, name->len) & ix->mask;; s = (s + 1) & ix->mask) {
        uint64_t v = ix->slots[s];
        if (v == 0) {
            ix->slots[s] = i + 1;
            return -1;
        }
        const hr_gguf_str *e = index_name(ix, v - 1);
        if (e->len == name->len && memcmp(e->ptr, name->ptr, name->len) == 0) return (int64_t)(v - 1);
    }
}

/* ---- metadata values ---------------------------------------------------------------------------- */

static bool valid_type(uint32_t t) { return t <= HR_GGUF_F64; }

static void free_node(arr_node *node) {
    if (!node) return;
    if (node->sub) {
        for (uint64_t i = 0; i < node->n; i++) free_node(&node->sub[i]);
        free(node->sub);
    }
    free(node->str_at);
}

/* Reads an array (element type, count, elements) at the cursor into node. depth counts this array:
 * a top-level array is 1. On error node may hold partial tables; free_node releases them. */
static hr_status parse_array(cursor *c, unsigned depth, arr_node *node) {
    if (depth > HR_GGUF_MAX_ARRAY_DEPTH)
        return hr_error_set(c->err, HR_ERR_FORMAT,
                            "array in %s %" PRIu64 " at offset %" PRIu64 " is nested deeper than %d levels", c->section,
                            c->index, c->pos, HR_GGUF_MAX_ARRAY_DEPTH);
    uint32_t type = 0;
    uint64_t n = 0;
    hr_status rc = cur_u32(c, "array element type", &type);
    if (rc != HR_OK) return rc;
    if (!valid_type(type))
        return hr_error_set(c->err, HR_ERR_FORMAT,
                            "invalid array element type %" PRIu32 " in %s %" PRIu64 " at offset %" PRIu64
                            " (expected 0..12)",
                            type, c->section, c->index, c->pos - 4);
    if ((rc = cur_u64(c, "array length", &n)) != HR_OK) return rc;
    node->type = (hr_gguf_type)type;
    node->data = c->base + c->pos;

    size_t esz = hr_gguf_type_size(node->type);
    uint64_t min_elem = esz ? esz : (type == HR_GGUF_STRING ? MIN_STRING_BYTES : MIN_ARRAY_BYTES);
    if (n > cur_left(c) / min_elem)
        return hr_error_set(c->err, HR_ERR_FORMAT,
                            "truncated: array of %" PRIu64 " %s elements in %s %" PRIu64 " at offset %" PRIu64
                            " needs at least %" PRIu64 " bytes per element but only %" PRIu64 " remain",
                            n, hr_gguf_type_name(node->type), c->section, c->index, c->pos, min_elem, cur_left(c));
    if (esz) {
        node->n = n;
        c->pos += n * esz; /* fits: checked just above */
        return HR_OK;
    }
    if (type == HR_GGUF_STRING) {
        node->str_at = malloc(n ? n * sizeof *node->str_at : 1);
        if (!node->str_at) return hr_error_set(c->err, HR_ERR_NOMEM, "out of memory for a %" PRIu64 "-string array", n);
        node->n = n;
        /* The hot loop for vocabularies (150k strings): one bounds check per string. */
        for (uint64_t i = 0; i < n; i++) {
            if (cur_left(c) < 8) return cur_truncated(c, "string length in array", 8);
            uint64_t len = le64(c->base + c->pos);
            if (len > cur_left(c) - 8) {
                if (len > c->size)
                    return hr_error_set(c->err, HR_ERR_FORMAT,
                                        "absurd string length %" PRIu64 " for element %" PRIu64
                                        " of a string array in %s %" PRIu64 " (the whole file is %" PRIu64 " bytes)",
                                        len, i, c->section, c->index, c->size);
                c->pos += 8;
                return cur_truncated(c, "string in array", len);
            }
            node->str_at[i] = c->base + c->pos;
            c->pos += 8 + len;
        }
        return HR_OK;
    }
    node->sub = calloc(n ? n : 1, sizeof *node->sub);
    if (!node->sub) return hr_error_set(c->err, HR_ERR_NOMEM, "out of memory for a %" PRIu64 "-array array", n);
    node->n = n;
    for (uint64_t i = 0; i < n; i++)
        if ((rc = parse_array(c, depth + 1, &node->sub[i])) != HR_OK) return rc;
    return HR_OK;
}

static hr_status parse_kvs(hr_gguf *g, cursor *c) {
    char name[SHOW_BUF];
    c->section = "metadata entry";
    for (uint64_t i = 0; i < g->n_kv; i++) {
        kv_entry *kv = &g->kvs[i];
        c->index = i;
        uint64_t at = c->pos;
        hr_status rc = cur_str(c, "key", &kv->key);
        if (rc != HR_OK) return rc;
        if (kv->key.len == 0)
            return hr_error_set(c->err, HR_ERR_FORMAT,
                                "empty key in metadata entry %" PRIu64 " at offset %" PRIu64 " (expected a name)", i,
                                at);
        if (kv->key.len > HR_GGUF_MAX_KEY_BYTES)
            return hr_error_set(c->err, HR_ERR_FORMAT,
                                "key of metadata entry %" PRIu64 " is %" PRIu64 " bytes, longer than the %d allowed", i,
                                kv->key.len, HR_GGUF_MAX_KEY_BYTES);
        uint64_t bad = hr_gguf_utf8_invalid_at((const uint8_t *)kv->key.ptr, kv->key.len);
        if (bad < kv->key.len)
            return hr_error_set(c->err, HR_ERR_FORMAT,
                                "key '%s' of metadata entry %" PRIu64 " is not valid UTF-8 (byte %" PRIu64
                                " is 0x%02x)",
                                SHOW(kv->key, name), i, bad, (unsigned)(uint8_t)kv->key.ptr[bad]);
        uint32_t type;
        if ((rc = cur_u32(c, "value type", &type)) != HR_OK) return rc;
        if (!valid_type(type))
            return hr_error_set(c->err, HR_ERR_FORMAT,
                                "invalid metadata value type %" PRIu32 " for key '%s' (expected 0..12)", type,
                                SHOW(kv->key, name));
        kv->type = (hr_gguf_type)type;
        kv->value = c->base + c->pos;
        if (type == HR_GGUF_STRING) {
            hr_gguf_str s;
            rc = cur_str(c, "string value", &s);
        } else if (type == HR_GGUF_ARRAY) {
            kv->arr = calloc(1, sizeof *kv->arr);
            if (!kv->arr) return hr_error_set(c->err, HR_ERR_NOMEM, "out of memory for metadata arrays");
            rc = parse_array(c, 1, kv->arr);
        } else {
            rc = cur_skip(c, "value", hr_gguf_type_size(kv->type));
        }
        if (rc != HR_OK) return rc;
        int64_t prev = index_insert(&g->key_index, i);
        if (prev >= 0)
            return hr_error_set(c->err, HR_ERR_FORMAT,
                                "duplicate metadata key '%s' (entries %" PRId64 " and %" PRIu64 ")",
                                SHOW(kv->key, name), prev, i);
    }
    return HR_OK;
}

static hr_status read_alignment(hr_gguf *g, hr_error *err) {
    g->alignment = HR_GGUF_DEFAULT_ALIGNMENT;
    int64_t i = hr_gguf_find_key(g, "general.alignment");
    if (i < 0) return HR_OK;
    const kv_entry *kv = &g->kvs[i];
    if (kv->type != HR_GGUF_U32)
        return hr_error_set(err, HR_ERR_FORMAT, "general.alignment has type %s, expected u32",
                            hr_gguf_type_name(kv->type));
    uint32_t a = le32(kv->value);
    if (a == 0 || (a & (a - 1)) != 0)
        return hr_error_set(err, HR_ERR_FORMAT, "general.alignment is %" PRIu32 ", expected a nonzero power of two", a);
    g->alignment = a;
    return HR_OK;
}

/* ---- tensor directory --------------------------------------------------------------------------- */

static hr_status parse_tensor_info(hr_gguf *g, cursor *c, uint64_t i) {
    char name[SHOW_BUF];
    hr_gguf_tensor *t = &g->tensors[i];
    c->index = i;
    uint64_t at = c->pos;
    hr_status rc = cur_str(c, "name", &t->name);
    if (rc != HR_OK) return rc;
    if (t->name.len == 0)
        return hr_error_set(c->err, HR_ERR_FORMAT,
                            "empty tensor name for tensor %" PRIu64 " at offset %" PRIu64 " (expected a name)", i, at);
    SHOW(t->name, name);
    if ((rc = cur_u32(c, "n_dims", &t->n_dims)) != HR_OK) return rc;
    if (t->n_dims == 0 || t->n_dims > HR_GGUF_MAX_DIMS)
        return hr_error_set(c->err, HR_ERR_FORMAT, "tensor '%s' has n_dims %" PRIu32 ", expected 1..%d", name,
                            t->n_dims, HR_GGUF_MAX_DIMS);
    uint64_t n_elems = 1;
    for (uint32_t d = 0; d < HR_GGUF_MAX_DIMS; d++) {
        uint64_t v = 1;
        if (d < t->n_dims) {
            if ((rc = cur_u64(c, "dimension", &v)) != HR_OK) return rc;
            if (v == 0 || v > (uint64_t)INT64_MAX)
                return hr_error_set(c->err, HR_ERR_FORMAT,
                                    "tensor '%s' dimension %" PRIu32 " is %" PRId64 ", expected >= 1", name, d,
                                    (int64_t)v);
            if (hr_mul_overflows(n_elems, v, &n_elems) || n_elems > (uint64_t)INT64_MAX)
                return hr_error_set(c->err, HR_ERR_FORMAT,
                                    "tensor '%s' element count overflows int64 (dimension %" PRIu32 " is %" PRIu64 ")",
                                    name, d, v);
        }
        t->ne[d] = (int64_t)v;
    }
    if ((rc = cur_u32(c, "type", &t->type)) != HR_OK) return rc;
    uint32_t blck, bbytes;
    if (!hr_gguf_tensor_type_block(t->type, &blck, &bbytes))
        return hr_error_set(c->err, HR_ERR_FORMAT, "tensor '%s' has unknown ggml type id %" PRIu32, name, t->type);
    if ((rc = cur_u64(c, "data offset", &t->offset)) != HR_OK) return rc;
    if ((uint64_t)t->ne[0] % blck != 0)
        return hr_error_set(c->err, HR_ERR_FORMAT,
                            "tensor '%s' (%s) has rows of %" PRId64
                            " values, not a multiple of the type's block of %" PRIu32,
                            name, hr_gguf_tensor_type_name(t->type), t->ne[0], blck);
    if (!hr_gguf_tensor_type_size(t->type, n_elems, &t->size_bytes))
        return hr_error_set(c->err, HR_ERR_FORMAT, "tensor '%s' byte size overflows (%" PRIu64 " %s values)", name,
                            n_elems, hr_gguf_tensor_type_name(t->type));
    int64_t prev = index_insert(&g->tensor_index, i);
    if (prev >= 0)
        return hr_error_set(c->err, HR_ERR_FORMAT, "duplicate tensor name '%s' (tensors %" PRId64 " and %" PRIu64 ")",
                            name, prev, i);
    return HR_OK;
}

typedef struct extent {
    uint64_t begin, end, index;
} extent;

static int cmp_extent(const void *a, const void *b) {
    const extent *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

/* Places every tensor's data in the file: aligned, inside, and apart from the others. */
static hr_status check_extents(hr_gguf *g, hr_error *err) {
    char name[SHOW_BUF], other[SHOW_BUF];
    if (g->n_tensors == 0) return HR_OK;
    extent *ex = malloc(g->n_tensors * sizeof *ex);
    if (!ex) return hr_error_set(err, HR_ERR_NOMEM, "out of memory for %" PRIu64 " tensor extents", g->n_tensors);
    hr_status rc = HR_OK;
    for (uint64_t i = 0; i < g->n_tensors && rc == HR_OK; i++) {
        hr_gguf_tensor *t = &g->tensors[i];
        uint64_t begin, end;
        if (t->offset % g->alignment != 0) {
            rc = hr_error_set(err, HR_ERR_FORMAT,
                              "tensor '%s' data offset %" PRIu64 " is not aligned to %" PRIu64 " bytes",
                              SHOW(t->name, name), t->offset, g->alignment);
        } else if (hr_add_overflows(g->data_offset, t->offset, &begin) ||
                   hr_add_overflows(begin, t->size_bytes, &end)) {
            rc = hr_error_set(err, HR_ERR_FORMAT,
                              "tensor '%s' data extent overflows (data section at %" PRIu64 " + offset %" PRIu64
                              " + %" PRIu64 " bytes)",
                              SHOW(t->name, name), g->data_offset, t->offset, t->size_bytes);
        } else if (end > g->size) {
            rc = hr_error_set(err, HR_ERR_FORMAT,
                              "tensor '%s' data (%" PRIu64 " bytes at file offset %" PRIu64
                              ") extends beyond the end of the file (%" PRIu64 " bytes); truncated download?",
                              SHOW(t->name, name), t->size_bytes, begin, g->size);
        } else {
            t->data = g->base + begin;
            ex[i] = (extent){begin, end, i};
        }
    }
    if (rc == HR_OK) {
        qsort(ex, g->n_tensors, sizeof *ex, cmp_extent);
        for (uint64_t k = 1; k < g->n_tensors; k++) {
            if (ex[k].begin < ex[k - 1].end) {
                const hr_gguf_tensor *a = &g->tensors[ex[k - 1].index], *b = &g->tensors[ex[k].index];
                rc = hr_error_set(err, HR_ERR_FORMAT,
                                  "tensor '%s' data [%" PRIu64 ", %" PRIu64 ") overlaps tensor '%s' data [%" PRIu64
                                  ", %" PRIu64 ")",
                                  SHOW(b->name, name), b->offset, b->offset + b->size_bytes, SHOW(a->name, other),
                                  a->offset, a->offset + a->size_bytes);
                break;
            }
        }
    }
    free(ex);
    return rc;
}

/* ---- the whole file ----------------------------------------------------------------------------- */

static hr_status parse_header(hr_gguf *g, cursor *c) {
    const uint8_t *b = g->base;
    if (g->size < 4)
        return hr_error_set(c->err, HR_ERR_FORMAT, "file is %" PRIu64 " bytes, shorter than the %d-byte GGUF header",
                            g->size, GGUF_HEADER_BYTES);
    if (memcmp(b, "GGUF", 4) != 0) {
        char shown[4 * 4 + 1];
        show_name(b, 4, shown, sizeof shown);
        return hr_error_set(c->err, HR_ERR_FORMAT,
                            "bad magic: expected \"GGUF\" (47 47 55 46), found %02x %02x %02x %02x (\"%s\"); not a "
                            "GGUF file",
                            b[0], b[1], b[2], b[3], shown);
    }
    if (g->size < 8)
        return hr_error_set(c->err, HR_ERR_FORMAT, "file is %" PRIu64 " bytes, shorter than the %d-byte GGUF header",
                            g->size, GGUF_HEADER_BYTES);
    uint32_t v = le32(b + 4);
    uint32_t swapped = __builtin_bswap32(v);
    if (v == 1)
        return hr_error_set(c->err, HR_ERR_UNSUPPORTED,
                            "GGUF version 1 is not supported (expected 2 or 3); v1 used 32-bit counts, "
                            "re-convert the model with a current llama.cpp");
    if (v == 0) return hr_error_set(c->err, HR_ERR_FORMAT, "invalid GGUF version 0 (expected 2 or 3)");
    if (swapped >= 1 && swapped <= 3)
        return hr_error_set(c->err, HR_ERR_UNSUPPORTED,
                            "GGUF version field reads 0x%08" PRIx32 ", which is version %" PRIu32
                            " in the other byte order: a big-endian file? headroom reads little-endian GGUF only",
                            v, swapped);
    if (v > 3)
        return hr_error_set(c->err, HR_ERR_UNSUPPORTED,
                            "unsupported GGUF version %" PRIu32 " (expected 2 or 3); newer than this reader", v);
    if (g->size < GGUF_HEADER_BYTES)
        return hr_error_set(c->err, HR_ERR_FORMAT, "file is %" PRIu64 " bytes, shorter than the %d-byte GGUF header",
                            g->size, GGUF_HEADER_BYTES);
    g->version = v;
    g->n_tensors = le64(b + 8);
    g->n_kv = le64(b + 16);
    c->pos = GGUF_HEADER_BYTES;
    uint64_t left = cur_left(c);
    if (g->n_tensors > (uint64_t)INT64_MAX)
        return hr_error_set(c->err, HR_ERR_FORMAT, "tensor count %" PRIu64 " overflows int64 (corrupt header)",
                            g->n_tensors);
    if (g->n_kv > (uint64_t)INT64_MAX)
        return hr_error_set(c->err, HR_ERR_FORMAT, "metadata count %" PRIu64 " overflows int64 (corrupt header)",
                            g->n_kv);
    if (g->n_kv > left / MIN_KV_BYTES)
        return hr_error_set(c->err, HR_ERR_FORMAT,
                            "metadata count %" PRIu64
                            " cannot fit: each entry takes at least %d bytes and only %" PRIu64
                            " bytes follow the header",
                            g->n_kv, MIN_KV_BYTES, left);
    if (g->n_tensors > left / MIN_TENSOR_BYTES)
        return hr_error_set(c->err, HR_ERR_FORMAT,
                            "tensor count %" PRIu64 " cannot fit: each tensor takes at least %d bytes and only %" PRIu64
                            " bytes follow the header",
                            g->n_tensors, MIN_TENSOR_BYTES, left);
    return HR_OK;
}

static hr_status parse_file(hr_gguf *g, hr_error *err) {
    cursor c = {.base = g->base, .size = g->size, .pos = 0, .err = err, .section = "header", .index = NO_INDEX};
    hr_status rc = parse_header(g, &c);
    if (rc != HR_OK) return rc;

    g->kvs = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kvs);
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    if (!g->kvs || !g->tensors || index_init(&g->key_index, g->n_kv, g->kvs, sizeof *g->kvs) != HR_OK ||
        index_init(&g->tensor_index, g->n_tensors, g->tensors, sizeof *g->tensors) != HR_OK)
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory for %" PRIu64 " metadata entries and %" PRIu64 " tensors",
                            g->n_kv, g->n_tensors);

    if ((rc = parse_kvs(g, &c)) != HR_OK) return rc;
    if ((rc = read_alignment(g, err)) != HR_OK) return rc;
    c.section = "tensor";
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if ((rc = parse_tensor_info(g, &c, i)) != HR_OK) return rc;
    /* The data section starts at the next multiple of the alignment. A file without tensors may end
     * before it (writers differ on trailing padding), so only tensors' extents are checked. */
    uint64_t padded;
    if (hr_add_overflows(c.pos, g->alignment - 1, &padded))
        return hr_error_set(err, HR_ERR_FORMAT, "data section offset overflows");
    g->data_offset = padded / g->alignment * g->alignment;
    return check_extents(g, err);
}

static void gguf_free(hr_gguf *g) {
    if (!g) return;
    if (g->kvs) {
        for (uint64_t i = 0; i < g->n_kv; i++) {
            free_node(g->kvs[i].arr);
            free(g->kvs[i].arr);
        }
    }
    free(g->kvs);
    free(g->tensors);
    free(g->key_index.slots);
    free(g->tensor_index.slots);
    if (g->mapped) munmap((void *)g->base, g->size);
    free(g);
}

static hr_status open_bytes(const void *data, uint64_t size, bool mapped, hr_gguf **out, hr_error *err) {
    hr_gguf *g = calloc(1, sizeof *g);
    if (!g) {
        if (mapped) munmap((void *)data, size);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory opening a GGUF");
    }
    g->base = data;
    g->size = size;
    g->mapped = mapped;
    hr_status rc = parse_file(g, err);
    if (rc != HR_OK) {
        gguf_free(g);
        return rc;
    }
    *out = g;
    return HR_OK;
}

/* ---- public: opening ---------------------------------------------------------------------------- */

hr_status hr_gguf_open_memory_mut(void *data, size_t size, hr_gguf **out, hr_error *err) {
    hr_status st = hr_gguf_open_memory(data, size, out, err);
    if (st == HR_OK) (*out)->writable = true;
    return st;
}

bool hr_gguf_edit_begin(hr_gguf *g) {
    if (!g) return false;
    if (!g->mapped) return g->writable;
    /* our own private mapping (a file's, or anonymous memory read from it): pages become private
     * copies as they are written; the file is never changed */
    g->edited = true;
    return mprotect((void *)g->base, g->size, PROT_READ | PROT_WRITE) == 0;
}

void hr_gguf_edit_end(hr_gguf *g) {
    if (g && g->mapped) (void)mprotect((void *)g->base, g->size, PROT_READ);
}

uint64_t hr_gguf_release(const hr_gguf *g, const void *p, uint64_t n, bool give) {
    const uint8_t *b = p;
    if (!g || !g->mapped || !g->file_map || g->edited || !b || b < g->base || n > g->size ||
        (uint64_t)(b - g->base) > g->size - n)
        return 0;
    uintptr_t lo;
    uint64_t bytes = hr_page_span(p, n, &lo);
    if (!bytes || !give) return bytes;
    /* a private file mapping never written: MADV_DONTNEED drops the process's hold on the pages, and a
     * later read faults them in from the file again, the same bytes */
    return madvise((void *)lo, (size_t)bytes, MADV_DONTNEED) == 0 ? bytes : 0;
}

hr_status hr_gguf_open_memory(const void *data, size_t size, hr_gguf **out, hr_error *err) {
    if (!out) return hr_error_set(err, HR_ERR_INVALID_ARG, "hr_gguf_open_memory: out is NULL");
    if (!data && size) return hr_error_set(err, HR_ERR_INVALID_ARG, "hr_gguf_open_memory: data is NULL");
    static const uint8_t empty[1];
    if (size == 0) return hr_error_set(err, HR_ERR_FORMAT, "GGUF data is empty (0 bytes)");
    return open_bytes(data ? data : empty, size, false, out, err);
}

/* Reads the n bytes of fd into fresh private memory that asks for huge pages, then makes it
 * read-only; NULL with errno set on failure. */
static void *read_resident(int fd, size_t n) {
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, n, MADV_HUGEPAGE); /* advice only: without THP the pages are 4 KiB */
#endif
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)p + done, n - done, (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO; /* 0: the file shrank under us */
            munmap(p, n);
            errno = e;
            return NULL;
        }
        done += (size_t)r;
    }
    if (mprotect(p, n, PROT_READ) != 0) {
        int e = errno;
        munmap(p, n);
        errno = e;
        return NULL;
    }
    return p;
}

hr_status hr_gguf_open(const char *path, hr_gguf **out, hr_error *err) {
    return hr_gguf_open_hold(path, HR_GGUF_MMAP, out, err);
}

hr_status hr_gguf_open_hold(const char *path, hr_gguf_hold hold, hr_gguf **out, hr_error *err) {
    if (!path || !out) return hr_error_set(err, HR_ERR_INVALID_ARG, "hr_gguf_open: path or out is NULL");
    char ebuf[128];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return hr_error_set(err, HR_ERR_IO, "cannot open GGUF file '%s': %s", path,
                            strerror_r(errno, ebuf, sizeof ebuf));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        hr_status rc = hr_error_set(err, HR_ERR_IO, "cannot stat '%s': %s", path, strerror_r(errno, ebuf, sizeof ebuf));
        close(fd);
        return rc;
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return hr_error_set(err, HR_ERR_IO, "'%s' is a directory, expected a GGUF file", path);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return hr_error_set(err, HR_ERR_IO, "'%s' is not a regular file, expected a GGUF file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return hr_error_set(err, HR_ERR_FORMAT, "'%s' is empty (0 bytes), expected a GGUF file", path);
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return hr_error_set(err, HR_ERR_IO, "'%s' is too large to map on this machine", path);
    }
    void *map;
    if (hold == HR_GGUF_RESIDENT) {
        map = read_resident(fd, (size_t)st.st_size);
        int read_errno = errno;
        close(fd);
        if (!map)
            return hr_error_set(err, HR_ERR_IO, "cannot read '%s' (%lld bytes) into memory: %s", path,
                                (long long)st.st_size, strerror_r(read_errno, ebuf, sizeof ebuf));
    } else {
        map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        int map_errno = errno;
        close(fd);
        if (map == MAP_FAILED)
            return hr_error_set(err, HR_ERR_IO, "cannot mmap '%s' (%lld bytes): %s", path, (long long)st.st_size,
                                strerror_r(map_errno, ebuf, sizeof ebuf));
    }
    hr_status rc = open_bytes(map, (uint64_t)st.st_size, true, out, err);
    if (rc != HR_OK) {
        hr_error_prefix(err, "%s", path);
        return rc;
    }
    (*out)->file_map = hold != HR_GGUF_RESIDENT; /* hr_gguf_release's pages come back from the file */
    return HR_OK;
}

void hr_gguf_close(hr_gguf *g) { gguf_free(g); }

uint32_t hr_gguf_version(const hr_gguf *g) { return g->version; }
uint64_t hr_gguf_alignment(const hr_gguf *g) { return g->alignment; }
uint64_t hr_gguf_file_size(const hr_gguf *g) { return g->size; }
uint64_t hr_gguf_data_offset(const hr_gguf *g) { return g->data_offset; }

/* ---- public: metadata --------------------------------------------------------------------------- */

uint64_t hr_gguf_n_kv(const hr_gguf *g) { return g->n_kv; }

hr_gguf_str hr_gguf_kv_key(const hr_gguf *g, uint64_t i) {
    if (i >= g->n_kv) return (hr_gguf_str){"", 0};
    return g->kvs[i].key;
}

hr_gguf_type hr_gguf_kv_type(const hr_gguf *g, uint64_t i) { return i < g->n_kv ? g->kvs[i].type : HR_GGUF_U8; }

int64_t hr_gguf_find_key(const hr_gguf *g, const char *key) {
    if (!key) return -1;
    return index_find(&g->key_index, key, strlen(key));
}

static bool is_int_type(hr_gguf_type t) {
    switch (t) {
    case HR_GGUF_U8:
    case HR_GGUF_I8:
    case HR_GGUF_U16:
    case HR_GGUF_I16:
    case HR_GGUF_U32:
    case HR_GGUF_I32:
    case HR_GGUF_U64:
    case HR_GGUF_I64:
    case HR_GGUF_BOOL: return true;
    default: return false;
    }
}

/* The integer at p of type t (an integer type or bool), as uint64 bits with sign extension. */
static uint64_t int_bits(hr_gguf_type t, const uint8_t *p) {
    switch (t) {
    case HR_GGUF_U8: return p[0];
    case HR_GGUF_BOOL: return p[0] != 0;
    case HR_GGUF_I8: return (uint64_t)(int64_t)(int8_t)p[0];
    case HR_GGUF_U16: return le16(p);
    case HR_GGUF_I16: return (uint64_t)(int64_t)(int16_t)le16(p);
    case HR_GGUF_U32: return le32(p);
    case HR_GGUF_I32: return (uint64_t)(int64_t)(int32_t)le32(p);
    case HR_GGUF_U64:
    case HR_GGUF_I64: return le64(p);
    default: return 0;
    }
}

static double float_of(hr_gguf_type t, const uint8_t *p) {
    if (t == HR_GGUF_F32) {
        uint32_t u = le32(p);
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    if (t == HR_GGUF_F64) {
        uint64_t u = le64(p);
        double d;
        memcpy(&d, &u, sizeof d);
        return d;
    }
    if (t == HR_GGUF_U64) return (double)le64(p);
    return (double)(int64_t)int_bits(t, p);
}

static hr_status value_int(hr_gguf_type t, const uint8_t *p, int64_t *out) {
    if (!is_int_type(t)) return HR_ERR_FORMAT;
    uint64_t v = int_bits(t, p);
    if (t == HR_GGUF_U64 && v > (uint64_t)INT64_MAX) return HR_ERR_RANGE;
    *out = (int64_t)v;
    return HR_OK;
}

static hr_status value_float(hr_gguf_type t, const uint8_t *p, double *out) {
    if (t != HR_GGUF_F32 && t != HR_GGUF_F64 && (!is_int_type(t) || t == HR_GGUF_BOOL)) return HR_ERR_FORMAT;
    *out = float_of(t, p);
    return HR_OK;
}

static hr_gguf_array array_of(const arr_node *node) {
    hr_gguf_array a = {.type = node->type, .n = node->n, .data = NULL, .priv = node};
    if (hr_gguf_type_size(node->type)) a.data = node->data;
    return a;
}

static hr_gguf_str string_at(const uint8_t *p) { return (hr_gguf_str){(const char *)p + 8, le64(p)}; }

static hr_status find_typed(const hr_gguf *g, const char *key, const char *expected, bool (*ok)(hr_gguf_type),
                            const kv_entry **out, hr_error *err) {
    int64_t i = hr_gguf_find_key(g, key);
    if (i < 0) return hr_error_set(err, HR_ERR_NOT_FOUND, "metadata key '%s' not found", key ? key : "(null)");
    const kv_entry *kv = &g->kvs[i];
    if (!ok(kv->type))
        return hr_error_set(err, HR_ERR_FORMAT, "metadata key '%s' has type %s, expected %s", key,
                            hr_gguf_type_name(kv->type), expected);
    *out = kv;
    return HR_OK;
}

static bool ok_int(hr_gguf_type t) { return is_int_type(t); }
static bool ok_float(hr_gguf_type t) {
    return t == HR_GGUF_F32 || t == HR_GGUF_F64 || (is_int_type(t) && t != HR_GGUF_BOOL);
}
static bool ok_bool(hr_gguf_type t) { return t == HR_GGUF_BOOL; }
static bool ok_str(hr_gguf_type t) { return t == HR_GGUF_STRING; }
static bool ok_array(hr_gguf_type t) { return t == HR_GGUF_ARRAY; }

hr_status hr_gguf_get_int(const hr_gguf *g, const char *key, int64_t *out, hr_error *err) {
    const kv_entry *kv;
    hr_status rc = find_typed(g, key, "an integer or bool", ok_int, &kv, err);
    if (rc != HR_OK) return rc;
    int64_t v;
    if (value_int(kv->type, kv->value, &v) != HR_OK)
        return hr_error_set(err, HR_ERR_RANGE, "metadata key '%s' holds u64 %" PRIu64 ", larger than INT64_MAX", key,
                            le64(kv->value));
    *out = v;
    return HR_OK;
}

hr_status hr_gguf_get_float(const hr_gguf *g, const char *key, double *out, hr_error *err) {
    const kv_entry *kv;
    hr_status rc = find_typed(g, key, "a float or an integer", ok_float, &kv, err);
    if (rc != HR_OK) return rc;
    *out = float_of(kv->type, kv->value);
    return HR_OK;
}

hr_status hr_gguf_get_bool(const hr_gguf *g, const char *key, bool *out, hr_error *err) {
    const kv_entry *kv;
    hr_status rc = find_typed(g, key, "bool", ok_bool, &kv, err);
    if (rc != HR_OK) return rc;
    *out = kv->value[0] != 0;
    return HR_OK;
}

hr_status hr_gguf_get_str(const hr_gguf *g, const char *key, hr_gguf_str *out, hr_error *err) {
    const kv_entry *kv;
    hr_status rc = find_typed(g, key, "string", ok_str, &kv, err);
    if (rc != HR_OK) return rc;
    *out = string_at(kv->value);
    return HR_OK;
}

hr_status hr_gguf_get_array(const hr_gguf *g, const char *key, hr_gguf_array *out, hr_error *err) {
    const kv_entry *kv;
    hr_status rc = find_typed(g, key, "array", ok_array, &kv, err);
    if (rc != HR_OK) return rc;
    *out = array_of(kv->arr);
    return HR_OK;
}

hr_status hr_gguf_get_cstr(const hr_gguf *g, const char *key, char *buf, size_t buf_len, hr_error *err) {
    if (!buf || buf_len == 0) return hr_error_set(err, HR_ERR_INVALID_ARG, "hr_gguf_get_cstr: empty buffer");
    hr_gguf_str s;
    hr_status rc = hr_gguf_get_str(g, key, &s, err);
    if (rc != HR_OK) return rc;
    size_t n = (size_t)HR_MIN(s.len, (uint64_t)(buf_len - 1));
    memcpy(buf, s.ptr, n);
    buf[n] = '\0';
    return HR_OK;
}

hr_status hr_gguf_kv_int(const hr_gguf *g, uint64_t i, int64_t *out) {
    if (i >= g->n_kv) return HR_ERR_INVALID_ARG;
    return value_int(g->kvs[i].type, g->kvs[i].value, out);
}

hr_status hr_gguf_kv_float(const hr_gguf *g, uint64_t i, double *out) {
    if (i >= g->n_kv) return HR_ERR_INVALID_ARG;
    return value_float(g->kvs[i].type, g->kvs[i].value, out);
}

hr_status hr_gguf_kv_str(const hr_gguf *g, uint64_t i, hr_gguf_str *out) {
    if (i >= g->n_kv) return HR_ERR_INVALID_ARG;
    if (g->kvs[i].type != HR_GGUF_STRING) return HR_ERR_FORMAT;
    *out = string_at(g->kvs[i].value);
    return HR_OK;
}

hr_status hr_gguf_kv_array(const hr_gguf *g, uint64_t i, hr_gguf_array *out) {
    if (i >= g->n_kv) return HR_ERR_INVALID_ARG;
    if (g->kvs[i].type != HR_GGUF_ARRAY) return HR_ERR_FORMAT;
    *out = array_of(g->kvs[i].arr);
    return HR_OK;
}

/* ---- public: array elements --------------------------------------------------------------------- */

hr_gguf_str hr_gguf_array_str(const hr_gguf_array *arr, uint64_t i) {
    const arr_node *node = arr ? arr->priv : NULL;
    if (!node || node->type != HR_GGUF_STRING || i >= node->n) return (hr_gguf_str){"", 0};
    return string_at(node->str_at[i]);
}

hr_gguf_array hr_gguf_array_sub(const hr_gguf_array *arr, uint64_t i) {
    const arr_node *node = arr ? arr->priv : NULL;
    if (!node || node->type != HR_GGUF_ARRAY || i >= node->n) {
        static const uint8_t none[1];
        return (hr_gguf_array){.type = HR_GGUF_U8, .n = 0, .data = none, .priv = NULL};
    }
    return array_of(&node->sub[i]);
}

int64_t hr_gguf_array_int(const hr_gguf_array *arr, uint64_t i) {
    const arr_node *node = arr ? arr->priv : NULL;
    if (!node || !is_int_type(node->type) || i >= node->n) return 0;
    return (int64_t)int_bits(node->type, node->data + i * hr_gguf_type_size(node->type));
}

double hr_gguf_array_float(const hr_gguf_array *arr, uint64_t i) {
    const arr_node *node = arr ? arr->priv : NULL;
    double v = 0;
    if (!node || i >= node->n) return 0;
    if (value_float(node->type, node->data + i * hr_gguf_type_size(node->type), &v) != HR_OK) return 0;
    return v;
}

/* ---- public: tensors ---------------------------------------------------------------------------- */

uint64_t hr_gguf_n_tensors(const hr_gguf *g) { return g->n_tensors; }

const hr_gguf_tensor *hr_gguf_tensor_at(const hr_gguf *g, uint64_t i) {
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const hr_gguf_tensor *hr_gguf_find_tensor(const hr_gguf *g, const char *name) {
    if (!name) return NULL;
    int64_t i = index_find(&g->tensor_index, name, strlen(name));
    return i < 0 ? NULL : &g->tensors[i];
}

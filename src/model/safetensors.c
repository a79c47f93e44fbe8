/* safetensors.c: opens a .safetensors file (mmap, or memory the caller lends) and validates all of it
 * (see safetensors.h for the invariants). Sizes read from the file go through checked arithmetic; the
 * header is parsed by jansson, bounded by the format's 100 MiB limit and by the file's own size. */
#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "tensor/tensor.h"

struct hr_safetensors {
    char *name;
    const uint8_t *base;
    uint64_t size;
    bool mapped;
    bool edited;          /* pages were written (private copies now): never dropped */
    uint64_t (*edits)[2]; /* the byte ranges written ([begin, end) offsets): those pages are the only copy */
    size_t n_edits, cap_edits;
    uint64_t data_offset; /* 8 + header length */
    size_t n;
    hr_st_tensor *tensors;
};

/* The dtypes of the format and their element sizes; only the float ones map to a computable type. */
static const struct {
    const char *name;
    unsigned bytes;
    int dtype_id;
} k_dtypes[] = {
    {"F32", 4, HR_DTYPE_F32},
    {"F16", 2, HR_DTYPE_F16},
    {"BF16", 2, HR_DTYPE_BF16},
    {"F64", 8, -1},
    {"I64", 8, -1},
    {"U64", 8, -1},
    {"I32", 4, -1},
    {"U32", 4, -1},
    {"I16", 2, -1},
    {"U16", 2, -1},
    {"I8", 1, -1},
    {"U8", 1, -1},
    {"BOOL", 1, -1},
    {"F8_E4M3", 1, -1},
    {"F8_E5M2", 1, -1},
};

/* A tensor name for a one-line message: at most 80 bytes, control bytes as '?'. */
static const char *show(const char *s, char *buf, size_t cap) {
    size_t i = 0;
    for (; s[i] && i + 4 < cap && i < 80; i++) buf[i] = (unsigned char)s[i] < 0x20 ? '?' : s[i];
    if (s[i] && i + 4 < cap) buf[i++] = '.', buf[i++] = '.', buf[i++] = '.';
    buf[i] = '\0';
    return buf;
}

static void st_free(hr_safetensors *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) free((char *)s->tensors[i].name);
    free(s->tensors);
    if (s->mapped && s->base) munmap((void *)s->base, s->size);
    free(s->edits);
    free(s->name);
    free(s);
}

static int cmp_begin(const void *a, const void *b) {
    const hr_st_tensor *x = *(const hr_st_tensor *const *)a, *y = *(const hr_st_tensor *const *)b;
    return x->data < y->data ? -1 : x->data > y->data;
}

/* One header entry: dtype, shape, offsets, checked against the data section of data_len bytes. */
static hr_status parse_entry(hr_safetensors *s, const char *key, json_t *v, uint64_t data_len, hr_st_tensor *t,
                             hr_error *err) {
    char nb[96];
    const char *f = s->name;
    if (!json_is_object(v))
        return hr_error_set(err, HR_ERR_FORMAT, "%s: tensor '%s': header entry is not a JSON object", f,
                            show(key, nb, sizeof nb));
    const char *dt = json_string_value(json_object_get(v, "dtype"));
    json_t *shape = json_object_get(v, "shape"), *offs = json_object_get(v, "data_offsets");
    if (!dt || !json_is_array(shape) || !json_is_array(offs))
        return hr_error_set(err, HR_ERR_FORMAT,
                            "%s: tensor '%s': header entry lacks \"dtype\", \"shape\" or "
                            "\"data_offsets\"",
                            f, show(key, nb, sizeof nb));
    unsigned elem = 0;
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++)
        if (!strcmp(dt, k_dtypes[i].name)) elem = k_dtypes[i].bytes, t->dtype_id = k_dtypes[i].dtype_id;
    if (!elem)
        return hr_error_set(err, HR_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%.16s'", f, show(key, nb, sizeof nb),
                            dt);
    snprintf(t->dtype, sizeof t->dtype, "%s", dt);
    size_t nd = json_array_size(shape);
    if (nd > HR_ST_MAX_DIMS)
        return hr_error_set(err, HR_ERR_FORMAT, "%s: tensor '%s': %zu dimensions (at most %d)", f,
                            show(key, nb, sizeof nb), nd, HR_ST_MAX_DIMS);
    uint64_t count = 1;
    for (size_t d = 0; d < nd; d++) {
        json_t *x = json_array_get(shape, d);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return hr_error_set(err, HR_ERR_FORMAT, "%s: tensor '%s': shape[%zu] is not a non-negative integer", f,
                                show(key, nb, sizeof nb), d);
        uint64_t e = (uint64_t)json_integer_value(x);
        if (e && count > UINT64_MAX / e)
            return hr_error_set(err, HR_ERR_FORMAT, "%s: tensor '%s': the shape's element count overflows", f,
                                show(key, nb, sizeof nb));
        count *= e;
        t->shape[d] = (int64_t)e;
    }
    t->n_dims = (int)nd;
    if (count > UINT64_MAX / elem)
        return hr_error_set(err, HR_ERR_FORMAT, "%s: tensor '%s': the shape's byte size overflows", f,
                            show(key, nb, sizeof nb));
    json_t *b = json_array_get(offs, 0), *e = json_array_get(offs, 1);
    if (json_array_size(offs) != 2 || !json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
        json_integer_value(e) < json_integer_value(b))
        return hr_error_set(err, HR_ERR_FORMAT,
                            "%s: tensor '%s': \"data_offsets\" must be [begin, end] with 0 <= "
                            "begin <= end",
                            f, show(key, nb, sizeof nb));
    uint64_t begin = (uint64_t)json_integer_value(b), end = (uint64_t)json_integer_value(e);
    if (end > data_len)
        return hr_error_set(err, HR_ERR_FORMAT,
                            "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 ") lie outside the data section "
                            "of %" PRIu64 " bytes (the file is truncated or the header is wrong)",
                            f, show(key, nb, sizeof nb), begin, end, data_len);
    if (end - begin != count * elem)
        return hr_error_set(err, HR_ERR_FORMAT,
                            "%s: tensor '%s': data_offsets span %" PRIu64 " bytes but %s of this shape needs %" PRIu64,
                            f, show(key, nb, sizeof nb), end - begin, t->dtype, count * elem);
    t->size_bytes = end - begin;
    t->data = s->base + s->data_offset + begin;
    if ((uintptr_t)t->data % elem)
        return hr_error_set(err, HR_ERR_UNSUPPORTED,
                            "%s: tensor '%s': data at file offset %" PRIu64 " is not aligned to its %u-byte elements",
                            f, show(key, nb, sizeof nb), s->data_offset + begin, elem);
    if (!(t->name = strdup(key))) return hr_error_set(err, HR_ERR_NOMEM, "%s: out of memory", f);
    return HR_OK;
}

static hr_status parse(hr_safetensors *s, hr_error *err) {
    const char *f = s->name;
    if (s->size < 8)
        return hr_error_set(err, HR_ERR_FORMAT,
                            "%s: truncated safetensors header: the file has %" PRIu64 " bytes, the header length "
                            "alone needs 8",
                            f, s->size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | s->base[i];
    if (n > s->size - 8)
        return hr_error_set(err, HR_ERR_FORMAT,
                            "%s: truncated safetensors header: it declares %" PRIu64 " bytes but only %" PRIu64
                            " follow the length",
                            f, n, s->size - 8);
    if (n > HR_ST_MAX_HEADER_SIZE)
        return hr_error_set(err, HR_ERR_FORMAT, "%s: safetensors header of %" PRIu64 " bytes (the format allows %u)", f,
                            n, HR_ST_MAX_HEADER_SIZE);
    if (n < 2 || s->base[8] != '{')
        return hr_error_set(err, HR_ERR_FORMAT, "%s: not a safetensors file (the header is not a JSON object)", f);
    s->data_offset = 8 + n;
    json_error_t je;
    json_t *root = json_loadb((const char *)s->base + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        hr_error_set(err, HR_ERR_FORMAT, "%s: safetensors header is not valid JSON: %s (at byte %d)", f, je.text,
                     je.position);
        return HR_ERR_FORMAT;
    }
    hr_status st = HR_OK;
    if (!json_is_object(root)) {
        st = hr_error_set(err, HR_ERR_FORMAT, "%s: not a safetensors file (the header is not a JSON object)", f);
        goto out;
    }
    size_t cap = json_object_size(root);
    s->tensors = calloc(cap ? cap : 1, sizeof *s->tensors);
    if (!s->tensors) {
        st = hr_error_set(err, HR_ERR_NOMEM, "%s: out of memory", f);
        goto out;
    }
    const char *key;
    json_t *v;
    uint64_t data_len = s->size - s->data_offset;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) continue;
        if (!key[0]) {
            st = hr_error_set(err, HR_ERR_FORMAT, "%s: a tensor has an empty name", f);
            goto out;
        }
        if ((st = parse_entry(s, key, v, data_len, &s->tensors[s->n], err))) goto out;
        s->n++;
    }
    /* no two tensors share a byte (empty tensors share nothing) */
    const hr_st_tensor **by = malloc((s->n ? s->n : 1) * sizeof *by);
    if (!by) {
        st = hr_error_set(err, HR_ERR_NOMEM, "%s: out of memory", f);
        goto out;
    }
    size_t m = 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->tensors[i].size_bytes) by[m++] = &s->tensors[i];
    qsort(by, m, sizeof *by, cmp_begin);
    for (size_t i = 1; i < m; i++)
        if ((const uint8_t *)by[i - 1]->data + by[i - 1]->size_bytes > (const uint8_t *)by[i]->data) {
            char a[96], b[96];
            st = hr_error_set(err, HR_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap in the data section", f,
                              show(by[i - 1]->name, a, sizeof a), show(by[i]->name, b, sizeof b));
            break;
        }
    free(by);
out:
    json_decref(root);
    return st;
}

static hr_status open_bytes(const void *data, uint64_t size, bool mapped, const char *name, hr_safetensors **out,
                            hr_error *err) {
    hr_safetensors *s = calloc(1, sizeof *s);
    if (!s || !(s->name = strdup(name ? name : "safetensors"))) {
        if (s) free(s);
        if (mapped) munmap((void *)data, size);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory opening '%s'", name ? name : "safetensors");
    }
    s->base = data;
    s->size = size;
    s->mapped = mapped;
    hr_status st = parse(s, err);
    if (st) {
        st_free(s);
        return st;
    }
    *out = s;
    return HR_OK;
}

hr_status hr_safetensors_open_memory(const void *data, size_t size, const char *name, hr_safetensors **out,
                                     hr_error *err) {
    static const uint8_t empty[1];
    return open_bytes(size ? data : empty, size, false, name, out, err);
}

hr_status hr_safetensors_open(const char *path, hr_safetensors **out, hr_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return hr_error_set(err, HR_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return hr_error_set(err, HR_ERR_IO, "%s: not a regular file", path);
    }
    if (sb.st_size < 8) {
        close(fd);
        return hr_error_set(err, HR_ERR_FORMAT,
                            "%s: truncated safetensors header: the file has %lld bytes, the header length alone "
                            "needs 8",
                            path, (long long)sb.st_size);
    }
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return hr_error_set(err, HR_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
    return open_bytes(p, (uint64_t)sb.st_size, true, path, out, err);
}

void hr_safetensors_close(hr_safetensors *s) { st_free(s); }

const char *hr_safetensors_name(const hr_safetensors *s) { return s->name; }
uint64_t hr_safetensors_file_size(const hr_safetensors *s) { return s->size; }
size_t hr_safetensors_n_tensors(const hr_safetensors *s) { return s->n; }
const hr_st_tensor *hr_safetensors_tensor_at(const hr_safetensors *s, size_t i) {
    return i < s->n ? &s->tensors[i] : NULL;
}

const hr_st_tensor *hr_safetensors_find(const hr_safetensors *s, const char *name) {
    for (size_t i = 0; i < s->n; i++) /* a few hundred names per shard, looked up once each at load */
        if (!strcmp(s->tensors[i].name, name)) return &s->tensors[i];
    return NULL;
}

/* Whether [p, p + n) lies in s's bytes. */
static bool st_holds(const hr_safetensors *s, const void *p, uint64_t n) {
    const uint8_t *b = p;
    return b && b >= s->base && n <= s->size && (uint64_t)(b - s->base) <= s->size - n;
}

bool hr_safetensors_edit_begin(hr_safetensors *s, const void *p, uint64_t n) {
    if (!s->mapped || !st_holds(s, p, n)) return false;
    if (s->n_edits == s->cap_edits) { /* the range is kept first: a write nobody knows of is never given back */
        size_t cap = s->cap_edits ? 2 * s->cap_edits : 8;
        uint64_t(*e)[2] = realloc(s->edits, cap * sizeof *e);
        if (!e) return false;
        s->edits = e, s->cap_edits = cap;
    }
    if (mprotect((void *)s->base, s->size, PROT_READ | PROT_WRITE) != 0) return false;
    const uint64_t off = (uint64_t)((const uint8_t *)p - s->base);
    s->edits[s->n_edits][0] = off, s->edits[s->n_edits][1] = off + n;
    s->n_edits++;
    s->edited = true;
    return true;
}

void hr_safetensors_edit_end(hr_safetensors *s) {
    if (s->mapped) mprotect((void *)s->base, s->size, PROT_READ);
}

uint64_t hr_safetensors_release(hr_safetensors *s, const void *p, uint64_t n, bool give) {
    if (!s->mapped || !st_holds(s, p, n)) return 0;
    uintptr_t lo;
    const uint64_t bytes = hr_page_span(p, n, &lo), off = (uint64_t)(lo - (uintptr_t)s->base);
    for (size_t i = 0; bytes && i < s->n_edits; i++) /* a written page is the only copy of its bytes */
        if (s->edits[i][0] < off + bytes && off < s->edits[i][1]) return 0;
    if (!bytes || !give) return bytes;
    /* never written: the process lets go of the pages, and a read faults the file's bytes in again */
    return madvise((void *)lo, (size_t)bytes, MADV_DONTNEED) == 0 ? bytes : 0;
}

void hr_safetensors_release_pages(hr_safetensors *s) {
    if (s->mapped && !s->edited) madvise((void *)s->base, s->size, MADV_DONTNEED);
}

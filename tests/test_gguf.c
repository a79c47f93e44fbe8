/* test_gguf.c: the GGUF writer and reader agree (every metadata type, nested and string arrays,
 * tensors of several types, alignments 32/64, v2/v3, memory and file paths); getters convert and
 * refuse as documented; the type table; a 150k-string vocabulary; and the real files in ../shared. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "gguf/gguf.h"
#include "harness.h"

static bool str_eq(hr_gguf_str s, const char *c) { return s.len == strlen(c) && memcmp(s.ptr, c, s.len) == 0; }

/* ---- the sample file -------------------------------------------------------------------------- */

enum { N_TENSORS = 6 };

typedef struct sample_tensor {
    const char *name;
    uint32_t type, n_dims;
    int64_t ne[4];
    uint64_t size_bytes;
    uint8_t *data;
} sample_tensor;

static sample_tensor g_tensors[N_TENSORS] = {
    {"f32.matrix", 0, 2, {4, 3, 1, 1}, 48, NULL},
    {"f16.vector", 1, 1, {8, 1, 1, 1}, 16, NULL},
    {"q8_0.rows", 8, 2, {64, 2, 1, 1}, 2 * 2 * 34, NULL},
    {"i8.odd", 24, 1, {5, 1, 1, 1}, 5, NULL}, /* 5 bytes: the next tensor needs padding */
    {"q4_k.block", 12, 2, {256, 1, 1, 1}, 144, NULL},
    {"bf16.4d", 30, 4, {3, 2, 2, 1}, 24, NULL},
};

static const uint8_t k_u8s[] = {0, 1, 255};
static const int8_t k_i8s[] = {-128, -1, 0, 127};
static const uint16_t k_u16s[] = {0, 65535, 258};
static const int16_t k_i16s[] = {-32768, 32767, -2};
static const uint32_t k_u32s[] = {0, 4294967295u, 16909060};
static const int32_t k_i32s[] = {INT32_MIN, -1, 0, INT32_MAX};
static const uint64_t k_u64s[] = {0, UINT64_MAX, 0x0102030405060708ULL};
static const int64_t k_i64s[] = {INT64_MIN, -1, INT64_MAX};
static const float k_f32s[] = {0.5f, -1.25f, 3.0e38f};
static const double k_f64s[] = {1.0 / 3.0, -2.5e-300};
static const uint8_t k_bools[] = {1, 0, 1};
static const char *const k_strs[] = {"", "hello", "\xe2\x96\x81world", "tab\there"};

/* [[1, 2, 3], [], [-4]] */
static const int32_t k_row0[] = {1, 2, 3}, k_row2[] = {-4};
static const hr_gguf_array k_rows[] = {
    {.type = HR_GGUF_I32, .n = 3, .data = k_row0},
    {.type = HR_GGUF_I32, .n = 0, .data = NULL},
    {.type = HR_GGUF_I32, .n = 1, .data = k_row2},
};
/* [["a", "bc"], ["hello"]] */
static const char *const k_sa0[] = {"a", "bc"}, *const k_sa1[] = {"hello"};
static const hr_gguf_array k_str_rows[] = {
    {.type = HR_GGUF_STRING, .n = 2, .data = k_sa0},
    {.type = HR_GGUF_STRING, .n = 1, .data = k_sa1},
};

static void fill_tensors(void) {
    hr_rng rng;
    hr_rng_seed(&rng, 42);
    for (int i = 0; i < N_TENSORS; i++) {
        g_tensors[i].data = malloc(g_tensors[i].size_bytes);
        for (uint64_t b = 0; b < g_tensors[i].size_bytes; b++) g_tensors[i].data[b] = (uint8_t)hr_rng_next(&rng);
    }
}

static hr_gguf_writer *sample_writer(uint32_t version, uint32_t alignment) {
    hr_gguf_writer *w = hr_gguf_writer_create(version);
    if (alignment) hr_gguf_writer_set_alignment(w, alignment);
    hr_gguf_writer_set_str(w, "general.architecture", "llama");
    hr_gguf_writer_set_u8(w, "t.u8", 200);
    hr_gguf_writer_set_i8(w, "t.i8", -100);
    hr_gguf_writer_set_u16(w, "t.u16", 60000);
    hr_gguf_writer_set_i16(w, "t.i16", -30000);
    hr_gguf_writer_set_u32(w, "t.u32", 4000000000u);
    hr_gguf_writer_set_i32(w, "t.i32", -2000000000);
    hr_gguf_writer_set_u64(w, "t.u64", 0xfedcba9876543210ULL);
    hr_gguf_writer_set_i64(w, "t.i64", INT64_MIN + 7);
    hr_gguf_writer_set_f32(w, "t.f32", 1.5e-7f);
    hr_gguf_writer_set_f64(w, "t.f64", 3.141592653589793);
    hr_gguf_writer_set_bool(w, "t.bool", true);
    hr_gguf_writer_set_bool(w, "t.bool_false", false);
    hr_gguf_writer_set_str(w, "t.str", "h\xc3\xa9llo");
    hr_gguf_writer_set_strn(w, "t.strn", "a\0b", 3);
    hr_gguf_writer_set_str(w, "t.empty_str", "");
    hr_gguf_writer_set_u32(w, "t.replaced", 1);
    hr_gguf_writer_set_u32(w, "t.replaced", 2); /* replaces in place */
    hr_gguf_writer_set_array(w, "a.u8", HR_GGUF_U8, k_u8s, HR_ARRAY_LEN(k_u8s));
    hr_gguf_writer_set_array(w, "a.i8", HR_GGUF_I8, k_i8s, HR_ARRAY_LEN(k_i8s));
    hr_gguf_writer_set_array(w, "a.u16", HR_GGUF_U16, k_u16s, HR_ARRAY_LEN(k_u16s));
    hr_gguf_writer_set_array(w, "a.i16", HR_GGUF_I16, k_i16s, HR_ARRAY_LEN(k_i16s));
    hr_gguf_writer_set_array(w, "a.u32", HR_GGUF_U32, k_u32s, HR_ARRAY_LEN(k_u32s));
    hr_gguf_writer_set_array(w, "a.i32", HR_GGUF_I32, k_i32s, HR_ARRAY_LEN(k_i32s));
    hr_gguf_writer_set_array(w, "a.u64", HR_GGUF_U64, k_u64s, HR_ARRAY_LEN(k_u64s));
    hr_gguf_writer_set_array(w, "a.i64", HR_GGUF_I64, k_i64s, HR_ARRAY_LEN(k_i64s));
    hr_gguf_writer_set_array(w, "a.f32", HR_GGUF_F32, k_f32s, HR_ARRAY_LEN(k_f32s));
    hr_gguf_writer_set_array(w, "a.f64", HR_GGUF_F64, k_f64s, HR_ARRAY_LEN(k_f64s));
    hr_gguf_writer_set_array(w, "a.bool", HR_GGUF_BOOL, k_bools, HR_ARRAY_LEN(k_bools));
    hr_gguf_writer_set_array(w, "a.empty", HR_GGUF_F32, NULL, 0);
    hr_gguf_writer_set_str_array(w, "a.str", k_strs, HR_ARRAY_LEN(k_strs));
    hr_gguf_array rows = {.type = HR_GGUF_ARRAY, .n = HR_ARRAY_LEN(k_rows), .data = k_rows};
    hr_gguf_writer_set_nested_array(w, "a.nested_i32", &rows);
    hr_gguf_array str_rows = {.type = HR_GGUF_ARRAY, .n = HR_ARRAY_LEN(k_str_rows), .data = k_str_rows};
    hr_gguf_writer_set_nested_array(w, "a.nested_str", &str_rows);
    /* Nested HR_GGUF_MAX_ARRAY_DEPTH deep, innermost [7]: the deepest the format allows here. */
    static const uint8_t seven[] = {7};
    hr_gguf_array levels[HR_GGUF_MAX_ARRAY_DEPTH];
    levels[HR_GGUF_MAX_ARRAY_DEPTH - 1] = (hr_gguf_array){.type = HR_GGUF_U8, .n = 1, .data = seven};
    for (int d = HR_GGUF_MAX_ARRAY_DEPTH - 2; d >= 0; d--)
        levels[d] = (hr_gguf_array){.type = HR_GGUF_ARRAY, .n = 1, .data = &levels[d + 1]};
    hr_gguf_writer_set_nested_array(w, "a.deep", &levels[0]);
    for (int i = 0; i < N_TENSORS; i++) {
        const sample_tensor *t = &g_tensors[i];
        hr_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, t->size_bytes, i % 2 == 0);
    }
    return w;
}

static void check_fixed_array(const hr_gguf *g, const char *key, hr_gguf_type type, const void *want, uint64_t n) {
    hr_gguf_array a;
    CHECKF(hr_gguf_get_array(g, key, &a, NULL) == HR_OK, "%s", key);
    CHECKF(a.type == type && a.n == n, "%s: type %d n %" PRIu64, key, (int)a.type, a.n);
    if (a.type != type || a.n != n) return;
    size_t esz = hr_gguf_type_size(type);
    CHECKF(n == 0 || memcmp(a.data, want, n * esz) == 0, "%s bytes", key); /* host is little-endian */
    for (uint64_t i = 0; i < n; i++) {
        const uint8_t *p = (const uint8_t *)want + i * esz;
        if (type == HR_GGUF_F32) {
            float f;
            memcpy(&f, p, 4);
            CHECK(hr_gguf_array_float(&a, i) == (double)f);
        } else if (type == HR_GGUF_F64) {
            double d;
            memcpy(&d, p, 8);
            CHECK(hr_gguf_array_float(&a, i) == d);
        } else {
            int64_t v = 0;
            switch (type) {
            case HR_GGUF_U8: v = *p; break;
            case HR_GGUF_BOOL: v = *p != 0; break;
            case HR_GGUF_I8: v = (int8_t)*p; break;
            case HR_GGUF_U16: v = ((const uint16_t *)want)[i]; break;
            case HR_GGUF_I16: v = ((const int16_t *)want)[i]; break;
            case HR_GGUF_U32: v = ((const uint32_t *)want)[i]; break;
            case HR_GGUF_I32: v = ((const int32_t *)want)[i]; break;
            case HR_GGUF_U64: v = (int64_t)((const uint64_t *)want)[i]; break;
            case HR_GGUF_I64: v = ((const int64_t *)want)[i]; break;
            default: break;
            }
            CHECKF(hr_gguf_array_int(&a, i) == v, "%s[%" PRIu64 "]", key, i);
        }
    }
}

static void check_sample(const hr_gguf *g, uint32_t version, uint32_t alignment) {
    uint64_t align = alignment ? alignment : HR_GGUF_DEFAULT_ALIGNMENT;
    hr_error err = {0};
    CHECK(hr_gguf_version(g) == version);
    CHECK(hr_gguf_alignment(g) == align);
    CHECK(hr_gguf_data_offset(g) % align == 0);

    int64_t v;
    double d;
    bool b;
    hr_gguf_str s;
    CHECK(hr_gguf_get_int(g, "t.u8", &v, NULL) == HR_OK && v == 200);
    CHECK(hr_gguf_get_int(g, "t.i8", &v, NULL) == HR_OK && v == -100);
    CHECK(hr_gguf_get_int(g, "t.u16", &v, NULL) == HR_OK && v == 60000);
    CHECK(hr_gguf_get_int(g, "t.i16", &v, NULL) == HR_OK && v == -30000);
    CHECK(hr_gguf_get_int(g, "t.u32", &v, NULL) == HR_OK && v == 4000000000LL);
    CHECK(hr_gguf_get_int(g, "t.i32", &v, NULL) == HR_OK && v == -2000000000);
    CHECK(hr_gguf_get_int(g, "t.i64", &v, NULL) == HR_OK && v == INT64_MIN + 7);
    CHECK(hr_gguf_get_int(g, "t.bool", &v, NULL) == HR_OK && v == 1);
    CHECK(hr_gguf_get_int(g, "t.replaced", &v, NULL) == HR_OK && v == 2);
    CHECK(hr_gguf_get_float(g, "t.f32", &d, NULL) == HR_OK && d == (double)1.5e-7f);
    CHECK(hr_gguf_get_float(g, "t.f64", &d, NULL) == HR_OK && d == 3.141592653589793);
    CHECK(hr_gguf_get_float(g, "t.i16", &d, NULL) == HR_OK && d == -30000.0);
    CHECK(hr_gguf_get_bool(g, "t.bool", &b, NULL) == HR_OK && b);
    CHECK(hr_gguf_get_bool(g, "t.bool_false", &b, NULL) == HR_OK && !b);
    CHECK(hr_gguf_get_str(g, "t.str", &s, NULL) == HR_OK && str_eq(s, "h\xc3\xa9llo"));
    CHECK(hr_gguf_get_str(g, "t.strn", &s, NULL) == HR_OK && s.len == 3 && memcmp(s.ptr, "a\0b", 3) == 0);
    CHECK(hr_gguf_get_str(g, "t.empty_str", &s, NULL) == HR_OK && s.len == 0);
    CHECK(hr_gguf_get_str(g, "general.architecture", &s, NULL) == HR_OK && str_eq(s, "llama"));

    /* u64 above INT64_MAX: a range error for get_int, exact through the index API's float. */
    CHECK(hr_gguf_get_int(g, "t.u64", &v, &err) == HR_ERR_RANGE && strstr(err.msg, "larger than INT64_MAX"));
    int64_t iu = hr_gguf_find_key(g, "t.u64");
    CHECK(iu >= 0 && hr_gguf_kv_type(g, (uint64_t)iu) == HR_GGUF_U64);
    CHECK(hr_gguf_kv_float(g, (uint64_t)iu, &d) == HR_OK && d == (double)0xfedcba9876543210ULL);

    /* Refusals name key, expected and found type. */
    CHECK(hr_gguf_get_int(g, "t.str", &v, &err) == HR_ERR_FORMAT && strstr(err.msg, "'t.str' has type string"));
    CHECK(hr_gguf_get_float(g, "t.bool", &d, &err) == HR_ERR_FORMAT && strstr(err.msg, "expected a float"));
    CHECK(hr_gguf_get_bool(g, "t.u8", &b, &err) == HR_ERR_FORMAT && strstr(err.msg, "expected bool"));
    CHECK(hr_gguf_get_str(g, "t.u8", &s, &err) == HR_ERR_FORMAT && strstr(err.msg, "has type u8"));
    hr_gguf_array a;
    CHECK(hr_gguf_get_array(g, "t.u8", &a, &err) == HR_ERR_FORMAT && strstr(err.msg, "expected array"));
    CHECK(hr_gguf_get_int(g, "no.such.key", &v, &err) == HR_ERR_NOT_FOUND &&
          strstr(err.msg, "'no.such.key' not found"));
    CHECK(hr_gguf_find_key(g, "no.such.key") == -1);
    CHECK(hr_gguf_find_key(g, "t.u") == -1);

    char buf[4];
    CHECK(hr_gguf_get_cstr(g, "general.architecture", buf, sizeof buf, NULL) == HR_OK && strcmp(buf, "lla") == 0);

    check_fixed_array(g, "a.u8", HR_GGUF_U8, k_u8s, HR_ARRAY_LEN(k_u8s));
    check_fixed_array(g, "a.i8", HR_GGUF_I8, k_i8s, HR_ARRAY_LEN(k_i8s));
    check_fixed_array(g, "a.u16", HR_GGUF_U16, k_u16s, HR_ARRAY_LEN(k_u16s));
    check_fixed_array(g, "a.i16", HR_GGUF_I16, k_i16s, HR_ARRAY_LEN(k_i16s));
    check_fixed_array(g, "a.u32", HR_GGUF_U32, k_u32s, HR_ARRAY_LEN(k_u32s));
    check_fixed_array(g, "a.i32", HR_GGUF_I32, k_i32s, HR_ARRAY_LEN(k_i32s));
    check_fixed_array(g, "a.u64", HR_GGUF_U64, k_u64s, HR_ARRAY_LEN(k_u64s));
    check_fixed_array(g, "a.i64", HR_GGUF_I64, k_i64s, HR_ARRAY_LEN(k_i64s));
    check_fixed_array(g, "a.f32", HR_GGUF_F32, k_f32s, HR_ARRAY_LEN(k_f32s));
    check_fixed_array(g, "a.f64", HR_GGUF_F64, k_f64s, HR_ARRAY_LEN(k_f64s));
    check_fixed_array(g, "a.bool", HR_GGUF_BOOL, k_bools, HR_ARRAY_LEN(k_bools));
    check_fixed_array(g, "a.empty", HR_GGUF_F32, NULL, 0);

    CHECK(hr_gguf_get_array(g, "a.str", &a, NULL) == HR_OK && a.type == HR_GGUF_STRING && a.n == 4);
    for (uint64_t i = 0; i < HR_ARRAY_LEN(k_strs) && i < a.n; i++) CHECK(str_eq(hr_gguf_array_str(&a, i), k_strs[i]));
    CHECK(hr_gguf_array_str(&a, 99).len == 0); /* out of range: empty, no crash */
    CHECK(hr_gguf_array_int(&a, 0) == 0);      /* wrong type: 0 */
    CHECK(hr_gguf_array_sub(&a, 0).n == 0);    /* not an array of arrays */

    CHECK(hr_gguf_get_array(g, "a.nested_i32", &a, NULL) == HR_OK && a.type == HR_GGUF_ARRAY && a.n == 3);
    for (uint64_t r = 0; r < 3 && r < a.n; r++) {
        hr_gguf_array row = hr_gguf_array_sub(&a, r);
        CHECK(row.type == HR_GGUF_I32 && row.n == k_rows[r].n);
        for (uint64_t i = 0; i < row.n && i < k_rows[r].n; i++)
            CHECK(hr_gguf_array_int(&row, i) == ((const int32_t *)k_rows[r].data)[i]);
    }
    CHECK(hr_gguf_get_array(g, "a.nested_str", &a, NULL) == HR_OK && a.n == 2);
    hr_gguf_array r0 = hr_gguf_array_sub(&a, 0), r1 = hr_gguf_array_sub(&a, 1);
    CHECK(r0.type == HR_GGUF_STRING && r0.n == 2 && str_eq(hr_gguf_array_str(&r0, 1), "bc"));
    CHECK(r1.type == HR_GGUF_STRING && r1.n == 1 && str_eq(hr_gguf_array_str(&r1, 0), "hello"));

    CHECK(hr_gguf_get_array(g, "a.deep", &a, NULL) == HR_OK);
    for (int depth = 1; depth < HR_GGUF_MAX_ARRAY_DEPTH; depth++) {
        CHECK(a.type == HR_GGUF_ARRAY && a.n == 1);
        a = hr_gguf_array_sub(&a, 0);
    }
    CHECK(a.type == HR_GGUF_U8 && a.n == 1 && hr_gguf_array_int(&a, 0) == 7);

    /* Listing by index sees every key exactly once, in the order written. */
    CHECK(hr_gguf_n_kv(g) == (alignment ? 34u : 33u));
    CHECK(str_eq(hr_gguf_kv_key(g, alignment ? 1 : 0), "general.architecture"));
    CHECK(hr_gguf_kv_key(g, hr_gguf_n_kv(g)).len == 0);
    CHECK(hr_gguf_kv_int(g, hr_gguf_n_kv(g), &v) == HR_ERR_INVALID_ARG);
    if (alignment) CHECK(hr_gguf_get_int(g, "general.alignment", &v, NULL) == HR_OK && v == alignment);

    CHECK(hr_gguf_n_tensors(g) == N_TENSORS);
    for (uint64_t i = 0; i < N_TENSORS && i < hr_gguf_n_tensors(g); i++) {
        const sample_tensor *want = &g_tensors[i];
        const hr_gguf_tensor *t = hr_gguf_tensor_at(g, i);
        CHECK(t == hr_gguf_find_tensor(g, want->name));
        CHECKF(str_eq(t->name, want->name), "tensor %" PRIu64, i);
        CHECK(t->type == want->type && t->n_dims == want->n_dims);
        CHECK(memcmp(t->ne, want->ne, sizeof t->ne) == 0);
        CHECK(t->size_bytes == want->size_bytes);
        CHECKF(t->offset % align == 0, "offset %" PRIu64 " align %" PRIu64, t->offset, align);
        CHECK(memcmp(t->data, want->data, want->size_bytes) == 0);
    }
    CHECK(hr_gguf_tensor_at(g, N_TENSORS) == NULL);
    CHECK(hr_gguf_find_tensor(g, "missing") == NULL);
}

static void test_round_trip(void) {
    static const uint32_t versions[] = {2, 3}, aligns[] = {0, 32, 64};
    for (size_t vi = 0; vi < HR_ARRAY_LEN(versions); vi++) {
        for (size_t ai = 0; ai < HR_ARRAY_LEN(aligns); ai++) {
            hr_error err = {0};
            hr_gguf_writer *w = sample_writer(versions[vi], aligns[ai]);
            void *data = NULL;
            size_t size = 0;
            CHECKF(hr_gguf_writer_write_memory(w, &data, &size, &err) == HR_OK, "%s", err.msg);
            hr_gguf *g = NULL;
            CHECKF(hr_gguf_open_memory(data, size, &g, &err) == HR_OK, "v%u align %u: %s", versions[vi], aligns[ai],
                   err.msg);
            if (g) check_sample(g, versions[vi], aligns[ai]);
            hr_gguf_close(g);

            /* The file path (mmap) gives the same bytes and the same view. */
            char path[4200];
            snprintf(path, sizeof path, "%s/rt-v%u-a%u.gguf", hr_test_tmpdir(), versions[vi], aligns[ai]);
            CHECKF(hr_gguf_writer_write_file(w, path, &err) == HR_OK, "%s", err.msg);
            FILE *f = fopen(path, "rb");
            uint8_t *back = malloc(size + 1);
            size_t got = f ? fread(back, 1, size + 1, f) : 0;
            if (f) fclose(f);
            CHECK(got == size && memcmp(back, data, size) == 0);
            free(back);
            g = NULL;
            CHECKF(hr_gguf_open(path, &g, &err) == HR_OK, "%s", err.msg);
            if (g) {
                check_sample(g, versions[vi], aligns[ai]);
                CHECK(hr_gguf_file_size(g) == size);
            }
            hr_gguf_close(g);
            /* Read resident (private huge-page memory): the same view again. */
            g = NULL;
            CHECKF(hr_gguf_open_hold(path, HR_GGUF_RESIDENT, &g, &err) == HR_OK, "%s", err.msg);
            if (g) {
                check_sample(g, versions[vi], aligns[ai]);
                CHECK(hr_gguf_file_size(g) == size);
            }
            hr_gguf_close(g);
            free(data);
            hr_gguf_writer_destroy(w);
        }
    }
}

/* hr_gguf_release: a file mapping gives back a tensor's whole pages and still reads the same bytes
 * (they come back from the file); memory read from the file, an edited mapping and lent memory give
 * back nothing (their pages are the only copy). */
static void test_release(void) {
    enum { N = 5 * 4096 / 4 + 77 }; /* a tensor over several pages, not a whole number of them */
    static float v[N];
    for (int i = 0; i < N; i++) v[i] = (float)i * 0.25f - 3.0f;
    hr_gguf_writer *w = hr_gguf_writer_create(3);
    const int64_t ne[] = {N};
    hr_gguf_writer_add_tensor(w, "big", 0, 1, ne, v, sizeof v, true);
    char path[4200];
    snprintf(path, sizeof path, "%s/release.gguf", hr_test_tmpdir());
    hr_error err = {0};
    CHECKF(hr_gguf_writer_write_file(w, path, &err) == HR_OK, "%s", err.msg);
    hr_gguf_writer_destroy(w);
    const long page = sysconf(_SC_PAGESIZE);
    for (int hold = 0; hold < 3; hold++) { /* mapped, resident, mapped then edited */
        hr_gguf *g = NULL;
        CHECKF(hr_gguf_open_hold(path, hold == 1 ? HR_GGUF_RESIDENT : HR_GGUF_MMAP, &g, &err) == HR_OK, "%s", err.msg);
        if (!g) continue;
        if (hold == 2) {
            CHECK(hr_gguf_edit_begin(g));
            hr_gguf_edit_end(g);
        }
        const hr_gguf_tensor *t = hr_gguf_find_tensor(g, "big");
        uintptr_t first;
        uint64_t interior = hr_page_span(t->data, t->size_bytes, &first);
        /* whole pages only: at least 4 of the tensor's 5-6, none past its ends */
        CHECK(interior % (uint64_t)page == 0 && interior >= 4 * (uint64_t)page && interior <= t->size_bytes);
        CHECK((hr_gguf_release(g, t->data, t->size_bytes, false) == interior) == (hold == 0));
        uint64_t gone = hr_gguf_release(g, t->data, t->size_bytes, true);
        CHECKF(gone == (hold == 0 ? interior : 0), "hold %d: %llu bytes given back of %llu", hold,
               (unsigned long long)gone, (unsigned long long)interior);
        CHECK(!memcmp(t->data, v, sizeof v)); /* every byte as written, the given-back pages too */
        /* a range outside the file's bytes is refused */
        CHECK(hr_gguf_release(g, (const uint8_t *)t->data + 8, t->size_bytes + (uint64_t)page * 64, true) == 0);
        CHECK(hr_gguf_release(g, v, sizeof v, true) == 0);
        hr_gguf_close(g);
    }
    hr_gguf *g = NULL; /* lent memory */
    void *data = NULL;
    size_t size = 0;
    w = hr_gguf_writer_create(3);
    hr_gguf_writer_add_tensor(w, "big", 0, 1, ne, v, sizeof v, true);
    CHECKF(hr_gguf_writer_write_memory(w, &data, &size, &err) == HR_OK, "%s", err.msg);
    hr_gguf_writer_destroy(w);
    CHECKF(hr_gguf_open_memory(data, size, &g, &err) == HR_OK, "%s", err.msg);
    if (g) {
        const hr_gguf_tensor *t = hr_gguf_find_tensor(g, "big");
        CHECK(hr_gguf_release(g, t->data, t->size_bytes, false) == 0 &&
              hr_gguf_release(g, t->data, t->size_bytes, true) == 0 && !memcmp(t->data, v, sizeof v));
    }
    hr_gguf_close(g);
    free(data);
}

/* Errors of the resident read name the file as the mapped open does. */
static void test_resident_errors(void) {
    hr_error err = {0};
    hr_gguf *g = NULL;
    CHECK(hr_gguf_open_hold("/nonexistent/x.gguf", HR_GGUF_RESIDENT, &g, &err) == HR_ERR_IO && !g);
    CHECKF(strstr(err.msg, "/nonexistent/x.gguf") != NULL, "%s", err.msg);
    char path[4200];
    snprintf(path, sizeof path, "%s/resident-bad.gguf", hr_test_tmpdir());
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        fputs("GGUX not a gguf file at all", f);
        fclose(f);
    }
    CHECK(hr_gguf_open_hold(path, HR_GGUF_RESIDENT, &g, &err) == HR_ERR_FORMAT && !g);
    CHECKF(strstr(err.msg, "resident-bad.gguf") != NULL && strstr(err.msg, "magic") != NULL, "%s", err.msg);
}

/* A file with no metadata and no tensors is still a valid GGUF. */
static void test_empty_file(void) {
    hr_gguf_writer *w = hr_gguf_writer_create(3);
    void *data;
    size_t size;
    hr_gguf *g = NULL;
    CHECK(hr_gguf_writer_write_memory(w, &data, &size, NULL) == HR_OK);
    CHECK(hr_gguf_open_memory(data, size, &g, NULL) == HR_OK);
    CHECK(g && hr_gguf_n_kv(g) == 0 && hr_gguf_n_tensors(g) == 0 && hr_gguf_alignment(g) == 32);
    CHECK(g && hr_gguf_find_key(g, "x") == -1 && hr_gguf_find_tensor(g, "x") == NULL);
    hr_gguf_close(g);
    /* The 24-byte header alone, without trailing padding, too. */
    CHECK(hr_gguf_open_memory(data, 24, &g, NULL) == HR_OK);
    hr_gguf_close(g);
    free(data);
    hr_gguf_writer_destroy(w);
    hr_gguf_close(NULL);
    hr_gguf_writer_destroy(NULL);
}

/* Misuse is recorded by the setters and reported, with its own message, by write_*. */
static void expect_writer_error(hr_gguf_writer *w, hr_status code, const char *substr) {
    hr_error err = {0};
    void *data = NULL;
    size_t size = 0;
    hr_status rc = hr_gguf_writer_write_memory(w, &data, &size, &err);
    CHECKF(rc == code && strstr(err.msg, substr), "want %s '%s', got %s '%s'", hr_status_name(code), substr,
           hr_status_name(rc), err.msg);
    CHECK(data == NULL);
    hr_gguf_writer_destroy(w);
}

static void test_writer_misuse(void) {
    static const float four[4] = {0};
    const int64_t ne4[] = {4}, ne33[] = {33}, ne0[] = {0};
    hr_gguf_writer *w = hr_gguf_writer_create(3);
    hr_gguf_writer_add_tensor(w, "t", 0, 1, ne4, four, 15, false);
    expect_writer_error(w, HR_ERR_INVALID_ARG, "needs 16 bytes of data, got 15");

    w = hr_gguf_writer_create(3);
    hr_gguf_writer_add_tensor(w, "t", 0, 1, ne4, four, 16, false);
    hr_gguf_writer_add_tensor(w, "t", 0, 1, ne4, four, 16, false);
    expect_writer_error(w, HR_ERR_INVALID_ARG, "duplicate tensor name 't'");

    w = hr_gguf_writer_create(3);
    hr_gguf_writer_add_tensor(w, "t", 5, 1, ne4, four, 16, false);
    expect_writer_error(w, HR_ERR_INVALID_ARG, "unknown ggml type id 5");

    w = hr_gguf_writer_create(3);
    hr_gguf_writer_add_tensor(w, "t", 8, 1, ne33, four, 16, false);
    expect_writer_error(w, HR_ERR_INVALID_ARG, "not a multiple of q8_0's block of 32");

    w = hr_gguf_writer_create(3);
    hr_gguf_writer_add_tensor(w, "t", 0, 1, ne0, four, 0, false);
    expect_writer_error(w, HR_ERR_INVALID_ARG, "bad shape");

    w = hr_gguf_writer_create(3);
    hr_gguf_writer_add_tensor(w, "t", 0, 5, ne4, four, 16, false);
    expect_writer_error(w, HR_ERR_INVALID_ARG, "n_dims 5");

    w = hr_gguf_writer_create(3);
    hr_gguf_writer_set_alignment(w, 48);
    expect_writer_error(w, HR_ERR_INVALID_ARG, "alignment 48 is not a nonzero power of two");

    w = hr_gguf_writer_create(3);
    hr_gguf_writer_set_i32(w, "general.alignment", 64);
    expect_writer_error(w, HR_ERR_INVALID_ARG, "general.alignment must be a u32");

    w = hr_gguf_writer_create(1);
    expect_writer_error(w, HR_ERR_INVALID_ARG, "version 1 requested");

    w = hr_gguf_writer_create(3);
    hr_gguf_writer_set_u32(w, "", 1);
    expect_writer_error(w, HR_ERR_INVALID_ARG, "empty or NULL metadata key");

    w = hr_gguf_writer_create(3);
    hr_gguf_writer_set_u32(w, "bad\xff", 1);
    expect_writer_error(w, HR_ERR_INVALID_ARG, "not valid UTF-8");

    w = hr_gguf_writer_create(3);
    hr_gguf_writer_set_array(w, "k", HR_GGUF_STRING, NULL, 0);
    expect_writer_error(w, HR_ERR_INVALID_ARG, "takes fixed-size elements");

    /* One level more than allowed. */
    static const uint8_t one[] = {1};
    hr_gguf_array levels[HR_GGUF_MAX_ARRAY_DEPTH + 1];
    levels[HR_GGUF_MAX_ARRAY_DEPTH] = (hr_gguf_array){.type = HR_GGUF_U8, .n = 1, .data = one};
    for (int d = HR_GGUF_MAX_ARRAY_DEPTH - 1; d >= 0; d--)
        levels[d] = (hr_gguf_array){.type = HR_GGUF_ARRAY, .n = 1, .data = &levels[d + 1]};
    w = hr_gguf_writer_create(3);
    hr_gguf_writer_set_nested_array(w, "deep", &levels[0]);
    expect_writer_error(w, HR_ERR_INVALID_ARG, "nests deeper than 8 levels");

    /* NULL writer: setters are no-ops, writing reports it. */
    hr_gguf_writer_set_u32(NULL, "k", 1);
    hr_error err = {0};
    void *data;
    size_t size;
    CHECK(hr_gguf_writer_write_memory(NULL, &data, &size, &err) == HR_ERR_INVALID_ARG);
}

static void test_type_table(void) {
    uint64_t bytes = 0;
    CHECK(hr_gguf_tensor_type_size(0, 10, &bytes) && bytes == 40);
    CHECK(hr_gguf_tensor_type_size(1, 10, &bytes) && bytes == 20);
    CHECK(hr_gguf_tensor_type_size(8, 64, &bytes) && bytes == 68);
    CHECK(hr_gguf_tensor_type_size(2, 32, &bytes) && bytes == 18);
    CHECK(hr_gguf_tensor_type_size(14, 512, &bytes) && bytes == 420);
    CHECK(hr_gguf_tensor_type_size(30, 3, &bytes) && bytes == 6);
    CHECK(hr_gguf_tensor_type_size(28, 2, &bytes) && bytes == 16);
    CHECK(hr_gguf_tensor_type_size(34, 256, &bytes) && bytes == 54);
    CHECK(hr_gguf_tensor_type_size(35, 256, &bytes) && bytes == 66);
    CHECK(hr_gguf_tensor_type_size(29, 256, &bytes) && bytes == 56);
    CHECK(!hr_gguf_tensor_type_size(8, 33, &bytes));              /* not whole blocks */
    CHECK(!hr_gguf_tensor_type_size(28, UINT64_MAX / 4, &bytes)); /* overflows */
    static const uint32_t unknown[] = {4, 5, 31, 32, 33, 36, 37, 38, 40, 1000, UINT32_MAX};
    for (size_t i = 0; i < HR_ARRAY_LEN(unknown); i++) {
        CHECK(!hr_gguf_tensor_type_size(unknown[i], 256, &bytes));
        CHECK(strcmp(hr_gguf_tensor_type_name(unknown[i]), "unknown") == 0);
    }
    /* Every defined id from 0 to 35 except the removed ones has a name and a block. */
    int defined = 0;
    for (uint32_t id = 0; id <= 35; id++) {
        uint32_t be = 0, bb = 0;
        if (hr_gguf_tensor_type_block(id, &be, &bb)) {
            defined++;
            CHECK(be >= 1 && bb >= 1 && strcmp(hr_gguf_tensor_type_name(id), "unknown") != 0);
        }
    }
    CHECK(defined == 31);
    CHECK(strcmp(hr_gguf_tensor_type_name(12), "q4_k") == 0);
    CHECK(strcmp(hr_gguf_tensor_type_name(30), "bf16") == 0);
    CHECK(strcmp(hr_gguf_tensor_type_name(16), "iq2_xxs") == 0);
    CHECK(strcmp(hr_gguf_type_name(HR_GGUF_STRING), "string") == 0);
    CHECK(strcmp(hr_gguf_type_name((hr_gguf_type)13), "invalid") == 0);
    CHECK(hr_gguf_type_size(HR_GGUF_F64) == 8 && hr_gguf_type_size(HR_GGUF_ARRAY) == 0);
}

/* A 150k-token vocabulary: every token readable in O(1) by index. (No timing assertion; the time is
 * printed for the record.) */
static void test_big_vocab(void) {
    enum { N = 150000 };
    char **toks = malloc(N * sizeof *toks);
    for (int i = 0; i < N; i++) {
        toks[i] = malloc(16);
        snprintf(toks[i], 16, "tok%d", i);
    }
    float *scores = malloc(N * sizeof *scores);
    for (int i = 0; i < N; i++) scores[i] = (float)-i;
    hr_gguf_writer *w = hr_gguf_writer_create(3);
    hr_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", (const char *const *)toks, N);
    hr_gguf_writer_set_str_array(w, "tokenizer.ggml.merges", (const char *const *)toks, N);
    hr_gguf_writer_set_array(w, "tokenizer.ggml.scores", HR_GGUF_F32, scores, N);
    void *data;
    size_t size;
    hr_error err = {0};
    CHECK(hr_gguf_writer_write_memory(w, &data, &size, &err) == HR_OK);
    hr_gguf *g = NULL;
    double t0 = hr_time_now();
    CHECKF(hr_gguf_open_memory(data, size, &g, &err) == HR_OK, "%s", err.msg);
    double ms = (hr_time_now() - t0) * 1e3;
    printf("opened a %d-token vocabulary (%zu bytes) in %.2f ms\n", N, size, ms);
    hr_gguf_array a;
    if (g && hr_gguf_get_array(g, "tokenizer.ggml.tokens", &a, NULL) == HR_OK) {
        CHECK(a.n == N);
        int bad = 0;
        for (int i = N - 1; i >= 0; i -= 7) bad += !str_eq(hr_gguf_array_str(&a, (uint64_t)i), toks[i]);
        CHECK(bad == 0);
    }
    if (g && hr_gguf_get_array(g, "tokenizer.ggml.scores", &a, NULL) == HR_OK)
        CHECK(a.n == N && hr_gguf_array_float(&a, N - 1) == -(double)(N - 1));
    hr_gguf_close(g);
    free(data);
    hr_gguf_writer_destroy(w);
    for (int i = 0; i < N; i++) free(toks[i]);
    free(toks);
    free(scores);
}

/* ---- ../shared -------------------------------------------------------------------------------- */

/* Re-encodes every key and tensor of g with the writer, in the same order; returns the writer. */
static hr_gguf_writer *reencode(const hr_gguf *g) {
    hr_gguf_writer *w = hr_gguf_writer_create(hr_gguf_version(g));
    for (uint64_t i = 0; i < hr_gguf_n_kv(g); i++) {
        hr_gguf_str k = hr_gguf_kv_key(g, i), s;
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)k.len, k.ptr);
        hr_gguf_type type = hr_gguf_kv_type(g, i);
        int64_t v = 0;
        double d = 0;
        hr_gguf_kv_int(g, i, &v);
        hr_gguf_kv_float(g, i, &d);
        hr_gguf_array a;
        switch (type) {
        case HR_GGUF_U8: hr_gguf_writer_set_u8(w, key, (uint8_t)v); break;
        case HR_GGUF_I8: hr_gguf_writer_set_i8(w, key, (int8_t)v); break;
        case HR_GGUF_U16: hr_gguf_writer_set_u16(w, key, (uint16_t)v); break;
        case HR_GGUF_I16: hr_gguf_writer_set_i16(w, key, (int16_t)v); break;
        case HR_GGUF_U32: hr_gguf_writer_set_u32(w, key, (uint32_t)v); break;
        case HR_GGUF_I32: hr_gguf_writer_set_i32(w, key, (int32_t)v); break;
        case HR_GGUF_U64: hr_gguf_writer_set_u64(w, key, (uint64_t)v); break;
        case HR_GGUF_I64: hr_gguf_writer_set_i64(w, key, v); break;
        case HR_GGUF_F32: hr_gguf_writer_set_f32(w, key, (float)d); break;
        case HR_GGUF_F64: hr_gguf_writer_set_f64(w, key, d); break;
        case HR_GGUF_BOOL: hr_gguf_writer_set_bool(w, key, v != 0); break;
        case HR_GGUF_STRING:
            hr_gguf_kv_str(g, i, &s);
            hr_gguf_writer_set_strn(w, key, s.ptr, s.len);
            break;
        case HR_GGUF_ARRAY:
            hr_gguf_kv_array(g, i, &a);
            if (a.type == HR_GGUF_STRING) {
                char **strs = malloc((a.n ? a.n : 1) * sizeof *strs);
                for (uint64_t j = 0; j < a.n; j++) {
                    hr_gguf_str e = hr_gguf_array_str(&a, j);
                    strs[j] = malloc(e.len + 1);
                    memcpy(strs[j], e.ptr, e.len);
                    strs[j][e.len] = '\0';
                }
                hr_gguf_writer_set_str_array(w, key, (const char *const *)strs, a.n);
                for (uint64_t j = 0; j < a.n; j++) free(strs[j]);
                free(strs);
            } else {
                hr_gguf_writer_set_array(w, key, a.type, a.data, a.n); /* nested arrays: not in these files */
            }
            break;
        }
    }
    for (uint64_t i = 0; i < hr_gguf_n_tensors(g); i++) {
        const hr_gguf_tensor *t = hr_gguf_tensor_at(g, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        hr_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, t->size_bytes, true);
    }
    return w;
}

/* The writer reproduces a file written by llama.cpp's tools byte for byte (up to trailing padding). */
static void check_reencode(const hr_gguf *g, const char *path) {
    hr_gguf_writer *w = reencode(g);
    void *data = NULL;
    size_t size = 0;
    hr_error err = {0};
    CHECKF(hr_gguf_writer_write_memory(w, &data, &size, &err) == HR_OK, "%s", err.msg);
    FILE *f = fopen(path, "rb");
    uint8_t *orig = malloc(hr_gguf_file_size(g));
    size_t got = f ? fread(orig, 1, hr_gguf_file_size(g), f) : 0;
    if (f) fclose(f);
    size_t common = HR_MIN(size, got);
    size_t at = 0;
    while (at < common && ((uint8_t *)data)[at] == orig[at]) at++;
    CHECKF(at == common && size >= got && size - got < hr_gguf_alignment(g),
           "%s: re-encoded %zu bytes, original %zu, first difference at %zu", path, size, got, at);
    free(orig);
    free(data);
    hr_gguf_writer_destroy(w);
}

static bool test_shared_model(void) {
    const char *path = hr_test_shared_path("models/stories260K.gguf");
    if (!path) {
        printf("SKIP part: models/stories260K.gguf is absent\n");
        return false;
    }
    hr_error err = {0};
    hr_gguf *g = NULL;
    CHECKF(hr_gguf_open(path, &g, &err) == HR_OK, "%s", err.msg);
    if (!g) return true;
    char arch[32];
    int64_t v;
    CHECK(hr_gguf_get_cstr(g, "general.architecture", arch, sizeof arch, NULL) == HR_OK && strcmp(arch, "llama") == 0);
    CHECK(hr_gguf_get_int(g, "llama.block_count", &v, NULL) == HR_OK && v == 5);
    const hr_gguf_tensor *t = hr_gguf_find_tensor(g, "token_embd.weight");
    CHECK(t && t->ne[0] == 64 && t->ne[1] == 512 && t->type == 0 && t->n_dims == 2);
    hr_gguf_array toks;
    CHECK(hr_gguf_get_array(g, "tokenizer.ggml.tokens", &toks, NULL) == HR_OK && toks.n == 512);
    check_reencode(g, path);
    hr_gguf_close(g);

    path = hr_test_shared_path("models/stories260K-q8_0.gguf");
    if (path) {
        CHECKF(hr_gguf_open(path, &g, &err) == HR_OK, "%s", err.msg);
        if (g) {
            t = hr_gguf_find_tensor(g, "token_embd.weight");
            CHECK(t && t->type == 8 && t->size_bytes == 512 * 2 * 34);
            check_reencode(g, path);
            hr_gguf_close(g);
        }
    }
    return true;
}

static int test_shared_vocabs(void) {
    static const char *const names[] = {
        "ggml-vocab-bert-bge.gguf", "ggml-vocab-deepseek-coder.gguf", "ggml-vocab-deepseek-llm.gguf",
        "ggml-vocab-falcon.gguf",   "ggml-vocab-gpt-2.gguf",          "ggml-vocab-llama-spm.gguf",
        "ggml-vocab-refact.gguf",   "ggml-vocab-starcoder.gguf",
    };
    int opened = 0;
    for (size_t i = 0; i < HR_ARRAY_LEN(names); i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "vectors/tokenizer/%s", names[i]);
        const char *path = hr_test_shared_path(rel);
        if (!path) continue;
        hr_error err = {0};
        hr_gguf *g = NULL;
        CHECKF(hr_gguf_open(path, &g, &err) == HR_OK, "%s", err.msg);
        if (!g) continue;
        opened++;
        hr_gguf_array toks;
        CHECKF(hr_gguf_get_array(g, "tokenizer.ggml.tokens", &toks, NULL) == HR_OK && toks.type == HR_GGUF_STRING &&
                   toks.n > 1000,
               "%s", names[i]);
        hr_gguf_str model;
        CHECK(hr_gguf_get_str(g, "tokenizer.ggml.model", &model, NULL) == HR_OK && model.len > 0);
        check_reencode(g, path);
        hr_gguf_close(g);
    }
    if (!opened) printf("SKIP part: no vocabularies under vectors/tokenizer\n");
    return opened;
}

int main(void) {
    test_resident_errors();
    fill_tensors();
    test_round_trip();
    test_release();
    test_empty_file();
    test_writer_misuse();
    test_type_table();
    test_big_vocab();
    bool model = test_shared_model();
    int vocabs = test_shared_vocabs();
    printf("shared: model %s, %d vocabularies\n", model ? "checked" : "absent", vocabs);
    for (int i = 0; i < N_TENSORS; i++) free(g_tensors[i].data);
    return hr_test_finish();
}

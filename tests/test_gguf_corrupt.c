/* test_gguf_corrupt.c: the GGUF reader refuses each way a file can be wrong, with its own message.
 *
 * Each case builds a small file byte by byte (so the fault sits exactly where intended), opens it
 * from a buffer of exactly its size (ASan catches any read past it), and asserts the status and a
 * substring only that check's message contains. Then: bad paths through hr_gguf_open, a valid file
 * truncated at every length, and seeded random byte mutations that must never crash. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/util.h"
#include "gguf/gguf.h"
#include "harness.h"

/* ---- a byte builder --------------------------------------------------------------------------- */

typedef struct fb {
    uint8_t p[1 << 16];
    size_t len;
} fb;

static void b_raw(fb *b, const void *src, size_t n) {
    memcpy(b->p + b->len, src, n);
    b->len += n;
}
static void b_u32(fb *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b->p[b->len++] = (uint8_t)(v >> (8 * i));
}
static void b_u64(fb *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b->p[b->len++] = (uint8_t)(v >> (8 * i));
}
static void b_str(fb *b, const char *s) {
    b_u64(b, strlen(s));
    b_raw(b, s, strlen(s));
}
static void b_header(fb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    b->len = 0;
    b_raw(b, "GGUF", 4);
    b_u32(b, version);
    b_u64(b, n_tensors);
    b_u64(b, n_kv);
}
static void b_kv_u32(fb *b, const char *key, uint32_t v) {
    b_str(b, key);
    b_u32(b, HR_GGUF_U32);
    b_u32(b, v);
}
/* A tensor directory entry with up to 4 dims. */
static void b_tensor(fb *b, const char *name, uint32_t n_dims, const uint64_t *dims, uint32_t type, uint64_t offset) {
    b_str(b, name);
    b_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) b_u64(b, dims[d]);
    b_u32(b, type);
    b_u64(b, offset);
}
static void b_pad(fb *b, size_t align) {
    while (b->len % align) b->p[b->len++] = 0;
}
static void b_zeros(fb *b, size_t n) {
    memset(b->p + b->len, 0, n);
    b->len += n;
}

/* Opens b from an exact-size heap copy; checks the status and that the message holds `substr`. */
static void expect_fail_at(int line, const fb *b, hr_status code, const char *substr) {
    uint8_t *copy = malloc(b->len ? b->len : 1);
    memcpy(copy, b->p, b->len);
    hr_gguf *g = NULL;
    hr_error err = {0};
    hr_status rc = hr_gguf_open_memory(copy, b->len, &g, &err);
    CHECKF(rc == code && g == NULL && strstr(err.msg, substr) != NULL, "line %d: want %s '%s', got %s '%s'", line,
           hr_status_name(code), substr, hr_status_name(rc), err.msg);
    CHECKF(strchr(err.msg, '\n') == NULL, "line %d: message is not one line", line);
    hr_gguf_close(g);
    free(copy);
}
#define EXPECT_FAIL(b, code, substr) expect_fail_at(__LINE__, b, code, substr)

static void expect_ok_at(int line, const fb *b) {
    hr_gguf *g = NULL;
    hr_error err = {0};
    CHECKF(hr_gguf_open_memory(b->p, b->len, &g, &err) == HR_OK, "line %d: %s", line, err.msg);
    hr_gguf_close(g);
}
#define EXPECT_OK(b) expect_ok_at(__LINE__, b)

/* A valid base with one f32 tensor of 8 values; `dims`, `type`, `offset` vary per case. */
static void one_tensor(fb *b, uint32_t n_dims, const uint64_t *dims, uint32_t type, uint64_t offset, size_t data) {
    b_header(b, 3, 1, 0);
    b_tensor(b, "w", n_dims, dims, type, offset);
    b_pad(b, 32);
    b_zeros(b, data);
}

static fb g_b; /* 64 KiB: kept off the stack */

static void test_header_cases(void) {
    fb *b = &g_b;
    b->len = 0;
    b_raw(b, "GGU", 3);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "file is 3 bytes, shorter than the 24-byte GGUF header");

    b_header(b, 3, 0, 0);
    memcpy(b->p, "GGML", 4);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "bad magic: expected \"GGUF\"");

    b_header(b, 0, 0, 0);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "invalid GGUF version 0");
    b_header(b, 1, 0, 0);
    EXPECT_FAIL(b, HR_ERR_UNSUPPORTED, "GGUF version 1 is not supported");
    b_header(b, 4, 0, 0);
    EXPECT_FAIL(b, HR_ERR_UNSUPPORTED, "unsupported GGUF version 4");
    b_header(b, 0x03000000u, 0, 0); /* version 3 written big-endian */
    EXPECT_FAIL(b, HR_ERR_UNSUPPORTED, "big-endian");

    b_header(b, 3, 0, 0);
    b->len = 20;
    EXPECT_FAIL(b, HR_ERR_FORMAT, "file is 20 bytes, shorter than the 24-byte");

    b_header(b, 3, (1ULL << 63) + 1, 0);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "tensor count 9223372036854775809 overflows");
    b_header(b, 3, 0, UINT64_MAX);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "metadata count 18446744073709551615 overflows");
    b_header(b, 3, 1000, 0);
    b_zeros(b, 100);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "tensor count 1000 cannot fit");
    b_header(b, 3, 0, 1000);
    b_zeros(b, 100);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "metadata count 1000 cannot fit");

    /* The smallest valid file, v2 and v3. */
    b_header(b, 2, 0, 0);
    EXPECT_OK(b);
    b_header(b, 3, 0, 0);
    EXPECT_OK(b);
}

static void test_metadata_cases(void) {
    fb *b = &g_b;
    b_header(b, 3, 0, 1);
    b_u64(b, 30); /* key length 30, 10 bytes follow */
    b_raw(b, "general.ar", 10);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "truncated: key of metadata entry 0");

    b_header(b, 3, 0, 1);
    b_u64(b, 1ULL << 62);
    b_zeros(b, 16);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "absurd string length 4611686018427387904 for key");

    b_header(b, 3, 0, 1);
    b_str(b, "k");
    b_u32(b, HR_GGUF_STRING);
    b_u64(b, 50);
    b_raw(b, "short", 5);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "truncated: string value of metadata entry 0");

    b_header(b, 3, 0, 1);
    b_str(b, "k");
    b_u32(b, 13);
    b_u32(b, 0);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "invalid metadata value type 13 for key 'k'");

    b_header(b, 3, 0, 1);
    b_str(b, "k");
    b_u32(b, HR_GGUF_ARRAY);
    b_u32(b, 99);
    b_u64(b, 0);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "invalid array element type 99");

    b_header(b, 3, 0, 1);
    b_str(b, "k");
    b_u32(b, HR_GGUF_ARRAY);
    b_u32(b, HR_GGUF_STRING);
    b_u64(b, 3); /* three strings promised, one present */
    b_str(b, "abc");
    b_u64(b, 60); /* the second claims 60 bytes, 30 follow */
    b_zeros(b, 30);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "string in array of metadata entry 0");

    b_header(b, 3, 0, 1);
    b_str(b, "k");
    b_u32(b, HR_GGUF_ARRAY);
    b_u32(b, HR_GGUF_U64);
    b_u64(b, 1ULL << 61); /* n * 8 overflows 64 bits */
    b_zeros(b, 16);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "truncated: array of 2305843009213693952 u64 elements");

    /* 9 nested arrays (one more than allowed), and exactly 8 (accepted). */
    for (int levels = 9; levels >= 8; levels--) {
        b_header(b, 3, 0, 1);
        b_str(b, "k");
        b_u32(b, HR_GGUF_ARRAY);
        for (int d = 0; d < levels - 1; d++) {
            b_u32(b, HR_GGUF_ARRAY);
            b_u64(b, 1);
        }
        b_u32(b, HR_GGUF_U8);
        b_u64(b, 1);
        b_raw(b, "x", 1);
        if (levels == 9)
            EXPECT_FAIL(b, HR_ERR_FORMAT, "is nested deeper than 8 levels");
        else
            EXPECT_OK(b);
    }

    b_header(b, 3, 0, 3);
    b_kv_u32(b, "a.b", 1);
    b_kv_u32(b, "c", 2);
    b_kv_u32(b, "a.b", 3);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "duplicate metadata key 'a.b' (entries 0 and 2)");

    b_header(b, 3, 0, 1);
    b_kv_u32(b, "", 1);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "empty key in metadata entry 0");

    b_header(b, 3, 0, 1);
    b_kv_u32(b, "ab\xc3(", 1); /* a lead byte followed by a non-continuation byte */
    EXPECT_FAIL(b, HR_ERR_FORMAT, "is not valid UTF-8 (byte 2 is 0xc3)");
    b_header(b, 3, 0, 1);
    b_kv_u32(b, "\xed\xa0\x80", 1); /* an encoded surrogate */
    EXPECT_FAIL(b, HR_ERR_FORMAT, "not valid UTF-8");
    b_header(b, 3, 0, 1);
    b_kv_u32(b, "caf\xc3\xa9.\xe2\x96\x81", 1); /* valid multi-byte UTF-8 is fine */
    EXPECT_OK(b);

    /* A key of 65536 bytes (one more than the format allows), complete in the file. */
    {
        static uint8_t big[24 + 8 + 65536 + 5];
        b_header(b, 3, 0, 1);
        memcpy(big, b->p, 24);
        size_t n = 24;
        for (int i = 0; i < 8; i++) big[n++] = (uint8_t)(65536ULL >> (8 * i));
        memset(big + n, 'k', 65536);
        n += 65536;
        memset(big + n, 0, 5); /* value type u8, value 0 */
        n += 5;
        hr_gguf *g = NULL;
        hr_error err = {0};
        CHECKF(hr_gguf_open_memory(big, n, &g, &err) == HR_ERR_FORMAT && strstr(err.msg, "longer than the 65535"), "%s",
               err.msg);
        hr_gguf_close(g);
    }

    b_header(b, 3, 0, 1);
    b_str(b, "general.alignment");
    b_u32(b, HR_GGUF_I32);
    b_u32(b, 64);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "general.alignment has type i32, expected u32");
    b_header(b, 3, 0, 1);
    b_kv_u32(b, "general.alignment", 48);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "general.alignment is 48, expected a nonzero power of two");
    b_header(b, 3, 0, 1);
    b_kv_u32(b, "general.alignment", 0);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "general.alignment is 0");
}

static void test_tensor_cases(void) {
    fb *b = &g_b;
    const uint64_t d8[] = {8}, d2x4[] = {2, 4}, d0[] = {0}, dneg[] = {UINT64_MAX}, dbig[] = {1ULL << 32, 1ULL << 32},
                   d33[] = {33}, dhuge[] = {1ULL << 62}, d5[] = {1, 1, 1, 1, 1};

    one_tensor(b, 1, d8, 0, 0, 32);
    EXPECT_OK(b);
    one_tensor(b, 2, d2x4, 0, 0, 32);
    EXPECT_OK(b);

    b_header(b, 3, 1, 0);
    b_tensor(b, "", 1, d8, 0, 0);
    b_pad(b, 32);
    b_zeros(b, 32);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "empty tensor name for tensor 0");

    one_tensor(b, 0, d8, 0, 0, 32);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "tensor 'w' has n_dims 0, expected 1..4");
    one_tensor(b, 5, d5, 0, 0, 32);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "tensor 'w' has n_dims 5, expected 1..4");
    one_tensor(b, 1, d0, 0, 0, 32);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "tensor 'w' dimension 0 is 0, expected >= 1");
    one_tensor(b, 1, dneg, 0, 0, 32);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "tensor 'w' dimension 0 is -1, expected >= 1");
    one_tensor(b, 2, dbig, 0, 0, 32);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "tensor 'w' element count overflows int64");
    one_tensor(b, 1, dhuge, 28, 0, 32); /* 2^62 f64 values: 2^65 bytes */
    EXPECT_FAIL(b, HR_ERR_FORMAT, "tensor 'w' byte size overflows");
    one_tensor(b, 1, d8, 4, 0, 32);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "tensor 'w' has unknown ggml type id 4");
    one_tensor(b, 1, d8, 31, 0, 32);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "unknown ggml type id 31");
    one_tensor(b, 1, d33, 8, 0, 64);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "tensor 'w' (q8_0) has rows of 33 values, not a multiple of the type's block of 32");
    one_tensor(b, 1, d8, 0, 4, 64);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "tensor 'w' data offset 4 is not aligned to 32 bytes");
    one_tensor(b, 1, d8, 0, 0, 31);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "tensor 'w' data (32 bytes at file offset 64) extends beyond the end of the file");
    one_tensor(b, 1, d8, 0, 32, 32);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "extends beyond the end of the file");
    one_tensor(b, 1, d8, 0, UINT64_MAX - 31, 32);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "tensor 'w' data extent overflows");

    b_header(b, 3, 1, 0);
    b_tensor(b, "w", 2, d2x4, 0, 0);
    b->len -= 3; /* cut inside the offset */
    EXPECT_FAIL(b, HR_ERR_FORMAT, "truncated: data offset of tensor 0");

    b_header(b, 3, 2, 0);
    b_tensor(b, "w", 1, d8, 0, 0);
    b_tensor(b, "w", 1, d8, 0, 32);
    b_pad(b, 32);
    b_zeros(b, 64);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "duplicate tensor name 'w' (tensors 0 and 1)");

    /* Overlap: b's 64 bytes at offset 0 cover a at offset 32. Apart (32 then 0) is fine. */
    const uint64_t d16[] = {16};
    b_header(b, 3, 2, 0);
    b_tensor(b, "a", 1, d8, 0, 32);
    b_tensor(b, "b", 1, d16, 0, 0);
    b_pad(b, 32);
    b_zeros(b, 64);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "tensor 'a' data [32, 64) overlaps tensor 'b' data [0, 64)");
    b_header(b, 3, 2, 0);
    b_tensor(b, "a", 1, d8, 0, 32);
    b_tensor(b, "b", 1, d8, 0, 0);
    b_pad(b, 32);
    b_zeros(b, 64);
    EXPECT_OK(b);

    /* A name with control bytes is quoted escaped, keeping the message one line. */
    b_header(b, 3, 1, 0);
    b_tensor(b, "bad\nname", 0, d8, 0, 0);
    b_zeros(b, 32);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "tensor 'bad\\x0aname' has n_dims 0");

    /* With general.alignment = 64, a 32-aligned offset is refused. */
    b_header(b, 3, 2, 1);
    b_kv_u32(b, "general.alignment", 64);
    b_tensor(b, "a", 1, d8, 0, 0);
    b_tensor(b, "b", 1, d8, 0, 32);
    b_pad(b, 64);
    b_zeros(b, 128);
    EXPECT_FAIL(b, HR_ERR_FORMAT, "tensor 'b' data offset 32 is not aligned to 64 bytes");
}

/* ---- paths ------------------------------------------------------------------------------------ */

static void expect_open_fail(const char *path, hr_status code, const char *substr) {
    hr_gguf *g = NULL;
    hr_error err = {0};
    hr_status rc = hr_gguf_open(path, &g, &err);
    CHECKF(rc == code && g == NULL && strstr(err.msg, substr) && strstr(err.msg, path), "%s: want %s '%s', got %s '%s'",
           path, hr_status_name(code), substr, hr_status_name(rc), err.msg);
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (n) fwrite(p, 1, n, f);
    fclose(f);
}

static void test_paths(void) {
    char path[4200];
    const char *dir = hr_test_tmpdir();
    snprintf(path, sizeof path, "%s/does-not-exist.gguf", dir);
    expect_open_fail(path, HR_ERR_IO, "No such file or directory");
    snprintf(path, sizeof path, "%s/a-directory.gguf", dir);
    mkdir(path, 0700);
    expect_open_fail(path, HR_ERR_IO, "is a directory, expected a GGUF file");
    snprintf(path, sizeof path, "%s/empty.gguf", dir);
    write_bytes(path, "", 0);
    expect_open_fail(path, HR_ERR_FORMAT, "is empty (0 bytes)");
    snprintf(path, sizeof path, "%s/magic.gguf", dir);
    write_bytes(path, "PK\x03\x04 this is a zip file, not a model", 37);
    expect_open_fail(path, HR_ERR_FORMAT, "bad magic");
    snprintf(path, sizeof path, "%s/short.gguf", dir);
    write_bytes(path, "GGUF\x03\0\0\0", 8);
    expect_open_fail(path, HR_ERR_FORMAT, "shorter than the 24-byte GGUF header");
    hr_gguf *g = NULL;
    CHECK(hr_gguf_open(NULL, &g, NULL) == HR_ERR_INVALID_ARG);
    CHECK(hr_gguf_open_memory(NULL, 0, &g, NULL) == HR_ERR_FORMAT);
}

/* ---- truncation and mutation ------------------------------------------------------------------ */

/* A valid file whose every byte matters: the last tensor's data ends the file exactly. */
static void valid_file(void **data, size_t *size) {
    static const float vals[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    static const char *const strs[] = {"<s>", "</s>", "\xe2\x96\x81the", ""};
    static const int32_t ints[] = {1, -2, 3};
    static const hr_gguf_array inner[] = {{.type = HR_GGUF_I32, .n = 3, .data = ints},
                                          {.type = HR_GGUF_STRING, .n = 4, .data = strs}};
    hr_gguf_writer *w = hr_gguf_writer_create(3);
    hr_gguf_writer_set_alignment(w, 32);
    hr_gguf_writer_set_str(w, "general.architecture", "llama");
    hr_gguf_writer_set_u32(w, "llama.block_count", 5);
    hr_gguf_writer_set_f64(w, "x.f64", 0.25);
    hr_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", strs, 4);
    hr_gguf_array nested = {.type = HR_GGUF_ARRAY, .n = 2, .data = inner};
    hr_gguf_writer_set_nested_array(w, "x.nested", &nested);
    const int64_t ne_a[] = {8}, ne_b[] = {4, 2};
    hr_gguf_writer_add_tensor(w, "a", 0, 1, ne_a, vals, 32, false);
    hr_gguf_writer_add_tensor(w, "b", 0, 2, ne_b, vals + 8, 32, false);
    CHECK(hr_gguf_writer_write_memory(w, data, size, NULL) == HR_OK);
    hr_gguf_writer_destroy(w);
}

/* Reads everything a caller could, so ASan sees any bad pointer the reader handed out. */
static uint64_t walk(const hr_gguf *g) {
    uint64_t sum = 0;
    for (uint64_t i = 0; i < hr_gguf_n_kv(g); i++) {
        hr_gguf_str k = hr_gguf_kv_key(g, i), s;
        sum += k.len ? (uint8_t)k.ptr[k.len - 1] : 0;
        int64_t v;
        double d;
        hr_gguf_array a;
        if (hr_gguf_kv_int(g, i, &v) == HR_OK) sum += (uint64_t)v;
        if (hr_gguf_kv_float(g, i, &d) == HR_OK) sum += d == d;
        if (hr_gguf_kv_str(g, i, &s) == HR_OK && s.len) sum += (uint8_t)s.ptr[s.len - 1];
        if (hr_gguf_kv_array(g, i, &a) == HR_OK) {
            for (uint64_t j = 0; j < a.n; j++) {
                hr_gguf_str e = hr_gguf_array_str(&a, j);
                hr_gguf_array sub = hr_gguf_array_sub(&a, j);
                sum += e.len ? (uint8_t)e.ptr[e.len - 1] : 0;
                sum += (uint64_t)hr_gguf_array_int(&a, j) + sub.n;
            }
        }
    }
    for (uint64_t i = 0; i < hr_gguf_n_tensors(g); i++) {
        const hr_gguf_tensor *t = hr_gguf_tensor_at(g, i);
        sum += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->size_bytes - 1];
    }
    return sum;
}

static void test_truncation_sweep(void) {
    void *data;
    size_t size;
    valid_file(&data, &size);
    hr_gguf *g = NULL;
    CHECK(hr_gguf_open_memory(data, size, &g, NULL) == HR_OK);
    if (g) walk(g);
    hr_gguf_close(g);
    int accepted = 0;
    for (size_t len = 0; len < size; len++) {
        uint8_t *copy = malloc(len ? len : 1);
        memcpy(copy, data, len);
        hr_error err = {0};
        g = NULL;
        if (hr_gguf_open_memory(copy, len, &g, &err) == HR_OK) {
            accepted++;
            fprintf(stderr, "truncated to %zu of %zu bytes and accepted\n", len, size);
        }
        hr_gguf_close(g);
        free(copy);
    }
    CHECKF(accepted == 0, "%d truncations accepted", accepted);
    printf("truncation sweep: %zu lengths, all refused\n", size);
    free(data);
}

static void test_mutations(void) {
    void *data;
    size_t size;
    valid_file(&data, &size);
    hr_rng rng;
    hr_rng_seed(&rng, 7);
    uint8_t *copy = malloc(size);
    int opened = 0, refused = 0;
    for (int iter = 0; iter < 20000; iter++) {
        memcpy(copy, data, size);
        int n_flips = 1 + (int)(hr_rng_next(&rng) % 4);
        for (int k = 0; k < n_flips; k++) {
            size_t at = (size_t)(hr_rng_next(&rng) % size);
            uint64_t r = hr_rng_next(&rng);
            copy[at] = (r & 1) ? (uint8_t)(r >> 8) : (uint8_t)(copy[at] ^ (1u << ((r >> 8) % 8)));
        }
        hr_gguf *g = NULL;
        hr_error err = {0};
        if (hr_gguf_open_memory(copy, size, &g, &err) == HR_OK) {
            opened++;
            walk(g);
        } else {
            refused++;
            CHECKF(err.msg[0] != '\0' && strchr(err.msg, '\n') == NULL, "empty or multi-line message");
        }
        hr_gguf_close(g);
    }
    printf("mutations: %d opened, %d refused, none crashed\n", opened, refused);
    free(copy);
    free(data);
}

int main(void) {
    test_header_cases();
    test_metadata_cases();
    test_tensor_cases();
    test_paths();
    test_truncation_sweep();
    test_mutations();
    return hr_test_finish();
}

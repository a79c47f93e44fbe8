/* fuzz_gguf.c: libFuzzer target for the GGUF reader. Any input must be refused with a one-line
 * message or accepted; when accepted, every accessor is walked so the sanitizers see any pointer the
 * reader hands out that strays outside the input. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t g_sink; /* keeps the reads from being optimised away */

static uint64_t walk_array(const hr_gguf_array *a, int depth) {
    uint64_t sum = a->n;
    for (uint64_t j = 0; j < a->n; j++) {
        if (a->type == HR_GGUF_STRING) {
            hr_gguf_str s = hr_gguf_array_str(a, j);
            if (s.len) sum += (uint8_t)s.ptr[0] + (uint8_t)s.ptr[s.len - 1];
        } else if (a->type == HR_GGUF_ARRAY) {
            hr_gguf_array sub = hr_gguf_array_sub(a, j);
            if (depth < 16) sum += walk_array(&sub, depth + 1);
        } else {
            sum += (uint64_t)hr_gguf_array_int(a, j);
            double d = hr_gguf_array_float(a, j);
            sum += d == d;
        }
    }
    return sum;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* An exact-size copy, so reading one byte past the input is caught. */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    hr_gguf *g = NULL;
    hr_error err = {0};
    if (hr_gguf_open_memory(copy, size, &g, &err) != HR_OK) {
        if (err.msg[0] == '\0' || strchr(err.msg, '\n')) abort(); /* every refusal says why, in one line */
        free(copy);
        return 0;
    }
    uint64_t sum = hr_gguf_version(g) + hr_gguf_alignment(g) + hr_gguf_file_size(g) + hr_gguf_data_offset(g);
    for (uint64_t i = 0; i < hr_gguf_n_kv(g); i++) {
        hr_gguf_str k = hr_gguf_kv_key(g, i), s;
        char key[256];
        size_t n = k.len < sizeof key - 1 ? (size_t)k.len : sizeof key - 1;
        memcpy(key, k.ptr, n);
        key[n] = '\0';
        if (strlen(key) == k.len && hr_gguf_find_key(g, key) != (int64_t)i) abort(); /* keys are unique */
        int64_t v;
        double d;
        bool b;
        hr_gguf_array a;
        char buf[16];
        sum += hr_gguf_kv_type(g, i);
        if (hr_gguf_kv_int(g, i, &v) == HR_OK) sum += (uint64_t)v;
        if (hr_gguf_kv_float(g, i, &d) == HR_OK) sum += d == d;
        if (hr_gguf_kv_str(g, i, &s) == HR_OK && s.len) sum += (uint8_t)s.ptr[s.len - 1];
        if (hr_gguf_kv_array(g, i, &a) == HR_OK) sum += walk_array(&a, 0);
        if (hr_gguf_get_int(g, key, &v, NULL) == HR_OK) sum += (uint64_t)v;
        if (hr_gguf_get_float(g, key, &d, NULL) == HR_OK) sum += d == d;
        if (hr_gguf_get_bool(g, key, &b, NULL) == HR_OK) sum += b;
        if (hr_gguf_get_cstr(g, key, buf, sizeof buf, NULL) == HR_OK) sum += strlen(buf);
        if (hr_gguf_get_array(g, key, &a, NULL) == HR_OK) sum += a.n;
    }
    for (uint64_t i = 0; i < hr_gguf_n_tensors(g); i++) {
        const hr_gguf_tensor *t = hr_gguf_tensor_at(g, i);
        const uint8_t *p = t->data;
        sum += p[0] + p[t->size_bytes - 1] + t->type + (uint64_t)t->ne[0];
        if ((uint64_t)(p - copy) % hr_gguf_alignment(g) != 0) abort(); /* aligned within the file */
        char name[256];
        if (t->name.len < sizeof name) {
            memcpy(name, t->name.ptr, (size_t)t->name.len);
            name[t->name.len] = '\0';
            if (strlen(name) == t->name.len && hr_gguf_find_tensor(g, name) != t) abort();
        }
    }
    g_sink = sum;
    hr_gguf_close(g);
    free(copy);
    return 0;
}

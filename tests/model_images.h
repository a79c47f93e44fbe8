/* model_images.h: what the family tests do to a model's GGUF image in memory to make it bad (a
 * renamed key or tensor, a wrong dimension) and how they check the load refuses it with one message.
 * Shared by test_model_arch, test_model_mla and test_model_gptoss; include after harness.h (static inline: each test
 * uses what it needs). The including file defines _GNU_SOURCE (memmem). */
#ifndef HR_TESTS_MODEL_IMAGES_H
#define HR_TESTS_MODEL_IMAGES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "harness.h"
#include "model/model.h"

/* Overwrites the first occurrence of `from` (a key or tensor name) with `to`, of the same length. */
static inline void rename_in(void *mem, size_t size, const char *from, const char *to) {
    char *p = memmem(mem, size, from, strlen(from));
    CHECKF(p != NULL, "'%s' not in the image", from);
    if (p) memcpy(p, to, strlen(to));
}

/* Sets dimension `dim` of tensor `name` in the image's directory (after the name: n_dims u32, then
 * ne[] u64), making its shape wrong while its data stays inside the file. */
static inline void reshape_in(void *mem, size_t size, const char *name, int dim, uint64_t ne) {
    char *p = memmem(mem, size, name, strlen(name));
    CHECKF(p != NULL, "'%s' not in the image", name);
    if (p) memcpy(p + strlen(name) + 4 + 8 * dim, &ne, 8);
}

/* Loading the image fails, its message containing `needle`; also written to dir/file for the CLI.
 * Frees mem. */
static inline void expect_load_error(void *mem, size_t size, const char *needle, const char *dir, const char *file) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(mem, 1, size, f) == size);
    if (f) fclose(f);
    hr_gguf *g = NULL;
    hr_model *m = NULL;
    hr_error err = {0};
    CHECK(hr_gguf_open_memory(mem, size, &g, &err) == HR_OK);
    hr_status st = hr_model_load_gguf(g, &m, &err);
    CHECKF(st != HR_OK && m == NULL && strstr(err.msg, needle), "%s: status %d, message '%s' lacks '%s'", file, st,
           err.msg, needle);
    printf("%-22s -> %s\n", file, err.msg);
    free(mem);
}

static inline int count_lines(const char *s) {
    int n = 0;
    for (; s && *s; s++) n += *s == '\n';
    return n;
}

#endif

/* greedy_vectors.h: the reference greedy vectors in ../shared/vectors/ (the *-greedy.jsonl files: one JSON
 * object a line with prompt_tokens and 48 completion_tokens), read for the engine tests. Header-only. */
#ifndef HR_TESTS_GREEDY_VECTORS_H
#define HR_TESTS_GREEDY_VECTORS_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#define HR_VEC_NGEN   48 /* completion ids per vector */
#define HR_VEC_PROMPT 64 /* prompt ids kept per vector */

typedef struct vec {
    int32_t ptoks[HR_VEC_PROMPT], ctoks[HR_VEC_NGEN];
    int np;
} vec;

/* Reads up to max vectors from path into v; returns how many (0 when the file is absent). */
static inline int load_vectors(const char *path, vec *v, int max) {
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return 0;
    char line[1 << 14];
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        if (!o) continue;
        json_t *pt = json_object_get(o, "prompt_tokens"), *ct = json_object_get(o, "completion_tokens");
        size_t np = json_array_size(pt);
        v[n].np = (int)(np < HR_VEC_PROMPT ? np : HR_VEC_PROMPT);
        for (int i = 0; i < v[n].np; i++) v[n].ptoks[i] = (int32_t)json_integer_value(json_array_get(pt, i));
        for (int i = 0; i < HR_VEC_NGEN; i++) v[n].ctoks[i] = (int32_t)json_integer_value(json_array_get(ct, i));
        json_decref(o);
        n++;
    }
    fclose(f);
    return n;
}

#endif

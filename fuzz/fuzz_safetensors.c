/* fuzz_safetensors.c: libFuzzer target for the safetensors reader (model/safetensors.c). Any input must
 * be refused with a one-line message or accepted; when accepted, every tensor's extent is read end to
 * end so the sanitizers see any pointer the reader hands out that strays outside the input. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile uint64_t g_sink; /* keeps the reads from being optimised away */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* an exact-size copy (8-byte aligned by malloc), so reading one byte past the input is caught */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    if (size) memcpy(copy, data, size);
    hr_safetensors *s = NULL;
    hr_error err = {0};
    if (hr_safetensors_open_memory(copy, size, "fuzz.safetensors", &s, &err) != HR_OK) {
        if (err.msg[0] == '\0' || strchr(err.msg, '\n')) abort(); /* every refusal says why, in one line */
        free(copy);
        return 0;
    }
    uint64_t sum = 0;
    for (size_t i = 0; i < hr_safetensors_n_tensors(s); i++) {
        const hr_st_tensor *t = hr_safetensors_tensor_at(s, i);
        if (hr_safetensors_find(s, t->name) != t) abort(); /* names are unique */
        const uint8_t *p = t->data;
        if (t->size_bytes) sum += p[0] + p[t->size_bytes - 1];
        for (int d = 0; d < t->n_dims; d++) sum += (uint64_t)t->shape[d];
    }
    g_sink = sum;
    hr_safetensors_close(s);
    free(copy);
    return 0;
}

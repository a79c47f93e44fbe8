/* fuzz_grammar.c: libFuzzer target for constrained decoding's compilers and recognizer. Input: a kind
 * byte (grammar, regex, JSON Schema, choice) + the source. Checked: a refusal is INVALID_ARG or RANGE
 * with a one-line message, or NOMEM; a compiled grammar runs: a matcher over a small vocabulary fills
 * masks and takes allowed tokens for a bounded number of steps, every token it takes was in the mask
 * and every token in the mask is taken by a fresh copy of the path (the mask never admits a token the
 * recognizer refuses); nothing leaks (ASan). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "constrain/constrain.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void die(const char *what) {
    fprintf(stderr, "fuzz_grammar: %s\n", what);
    abort();
}

static const char *const k_toks[] = {"a", "b", "ab",   "{",    "}",   "\"", ":", ",",    " ",    "0",  "12", "-",
                                     "[", "]", "true", "null", "x\"", "\\", "é", "\xC3", "\xA9", "\n", "a1", "}]"};
#define N_TOKS ((int)(sizeof k_toks / sizeof k_toks[0]))

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const hr_cons_kind kinds[] = {HR_CONS_GRAMMAR, HR_CONS_REGEX, HR_CONS_JSON_SCHEMA, HR_CONS_CHOICE};
    hr_cons_kind kind = kinds[data[0] % 4];
    char *src = malloc(size); /* an exact-size copy: a read past the end is caught */
    if (!src) return 0;
    memcpy(src, data + 1, size - 1);
    hr_grammar *g = NULL;
    hr_error err = {0};
    hr_status st = hr_grammar_compile(kind, src, size - 1, &g, &err);
    if (st != HR_OK) {
        if (st != HR_ERR_INVALID_ARG && st != HR_ERR_RANGE && st != HR_ERR_NOMEM) die("unexpected status");
        if (!err.msg[0] || strchr(err.msg, '\n')) die("refusal without a one-line message");
        free(src);
        return 0;
    }
    uint32_t lens[N_TOKS + 1];
    const char *b[N_TOKS + 1];
    bool eog[N_TOKS + 1] = {0};
    for (int i = 0; i < N_TOKS; i++) b[i] = k_toks[i], lens[i] = (uint32_t)strlen(k_toks[i]);
    b[N_TOKS] = "", lens[N_TOKS] = 0, eog[N_TOKS] = true;
    hr_cons_vocab *v = NULL;
    hr_cons_store *s = NULL;
    hr_matcher *m = NULL;
    if (hr_cons_vocab_create(N_TOKS + 1, b, lens, eog, &v, &err) != HR_OK ||
        hr_cons_store_create(v, &s, &err) != HR_OK || hr_matcher_create(s, g, &m, &err) != HR_OK)
        die("setup failed");
    char path[256];
    size_t plen = 0;
    uint64_t mask[1];
    for (int step = 0; step < 16; step++) {
        int n = hr_matcher_fill_mask(m, mask);
        if (n == 0) break;
        for (int t = 0; t < N_TOKS; t++) { /* the mask against the recognizer, token by token */
            if (!((mask[0] >> t) & 1)) continue;
            hr_matcher *r = NULL;
            if (hr_matcher_create(s, g, &r, &err) != HR_OK) die("matcher");
            if (!hr_matcher_accept_bytes(r, path, plen) || !hr_matcher_accept_bytes(r, k_toks[t], lens[t]))
                die("the mask admits a token the recognizer refuses");
            hr_matcher_destroy(r);
        }
        int pick = (int)((step * 7 + (size > 1 ? data[1] : 0)) % (unsigned)n), t = 0;
        for (; t <= N_TOKS; t++)
            if (((mask[0] >> t) & 1) && pick-- == 0) break;
        if (t == N_TOKS) break; /* the end */
        if (!hr_matcher_accept_token(m, t)) die("an allowed token was refused");
        if (plen + lens[t] > sizeof path) break;
        memcpy(path + plen, k_toks[t], lens[t]);
        plen += lens[t];
    }
    hr_matcher_destroy(m);
    hr_cons_store_destroy(s);
    hr_cons_vocab_destroy(v);
    hr_grammar_release(g);
    free(src);
    return 0;
}

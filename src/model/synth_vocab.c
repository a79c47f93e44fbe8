/* synth_vocab.c: small deterministic vocabularies that really tokenize text, for synthetic models.
 *   SPM: <unk> <s> </s>, the 256 byte-fallback tokens, then "▁", letters, "▁"+letter, letter pairs,
 *        "▁"+pairs, ... scored so longer pieces win; padded with <unused_i>.
 *   BPE: the 256 byte symbols (GPT-2 byte-to-unicode), merges that build letter pairs and triples
 *        with and without the leading "Ġ", then reserved special tokens up to the vocabulary size. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/synth_internal.h"

typedef struct strlist {
    char **v;
    int n, cap;
} strlist;

static int push(strlist *l, const char *s) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 1024;
        char **v = realloc(l->v, sizeof(char *) * (size_t)cap);
        if (!v) return -1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n] = strdup(s);
    return l->v[l->n] ? l->n++ : -1;
}

static void strlist_free(strlist *l) {
    for (int i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
}

static const char k_letters[] = "etaoinshrdlucmfwygpbvkxqjz";
#define SP "\xe2\x96\x81" /* U+2581, SentencePiece's space */
#define GB "\xc4\xa0"     /* U+0120 'Ġ', GPT-2's byte 0x20 */

hr_status hr_synth_vocab_spm(hr_gguf_writer *w, int n_vocab, hr_error *err) {
    if (n_vocab < 300) return hr_error_set(err, HR_ERR_INVALID_ARG, "an SPM vocabulary needs at least 300 tokens");
    strlist t = {0};
    float *scores = malloc(sizeof(float) * (size_t)n_vocab);
    int32_t *types = malloc(sizeof(int32_t) * (size_t)n_vocab);
    if (!scores || !types) goto nomem;
    push(&t, "<unk>");
    push(&t, "<s>");
    push(&t, "</s>");
    types[0] = 2;            /* unknown */
    types[1] = types[2] = 3; /* control */
    scores[0] = scores[1] = scores[2] = 0.0f;
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        types[t.n] = 6; /* byte */
        scores[t.n] = 0.0f;
        push(&t, s);
    }
    /* normal pieces, shortest first; score = -index so the merge order prefers earlier pieces */
    char buf[32];
    const char *singles[] = {SP,  ".", ",", "!", "?", "'", "\"", "-", ":", ";", "0",
                             "1", "2", "3", "4", "5", "6", "7",  "8", "9", "\n"};
    int normal = 0;
#define ADD(str)                                                                                                       \
    do {                                                                                                               \
        if (t.n >= n_vocab) goto pad;                                                                                  \
        types[t.n] = 1;                                                                                                \
        scores[t.n] = -(float)(normal++);                                                                              \
        if (push(&t, (str)) < 0) goto nomem;                                                                           \
    } while (0)
    for (size_t i = 0; i < sizeof singles / sizeof *singles; i++) ADD(singles[i]);
    for (int i = 0; i < 26; i++) {
        snprintf(buf, sizeof buf, "%c", k_letters[i]);
        ADD(buf);
        snprintf(buf, sizeof buf, "%c", k_letters[i] - 32);
        ADD(buf);
    }
    for (int i = 0; i < 26; i++) {
        snprintf(buf, sizeof buf, SP "%c", k_letters[i]);
        ADD(buf);
        snprintf(buf, sizeof buf, SP "%c", k_letters[i] - 32);
        ADD(buf);
    }
    for (int i = 0; i < 26; i++)
        for (int j = 0; j < 26; j++) {
            snprintf(buf, sizeof buf, "%c%c", k_letters[i], k_letters[j]);
            ADD(buf);
        }
    for (int i = 0; i < 26; i++)
        for (int j = 0; j < 26; j++) {
            snprintf(buf, sizeof buf, SP "%c%c", k_letters[i], k_letters[j]);
            ADD(buf);
        }
    for (int i = 0; i < 26; i++)
        for (int j = 0; j < 26; j++)
            for (int k = 0; k < 26; k++) {
                snprintf(buf, sizeof buf, SP "%c%c%c", k_letters[i], k_letters[j], k_letters[k]);
                ADD(buf);
            }
#undef ADD
pad:
    for (int i = 0; t.n < n_vocab; i++) {
        snprintf(buf, sizeof buf, "<unused_%d>", i);
        types[t.n] = 5; /* unused */
        scores[t.n] = -1e9f;
        if (push(&t, buf) < 0) goto nomem;
    }
    hr_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    hr_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", (const char *const *)t.v, (uint64_t)t.n);
    hr_gguf_writer_set_array(w, "tokenizer.ggml.scores", HR_GGUF_F32, scores, (uint64_t)t.n);
    hr_gguf_writer_set_array(w, "tokenizer.ggml.token_type", HR_GGUF_I32, types, (uint64_t)t.n);
    hr_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    hr_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    hr_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    hr_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    strlist_free(&t);
    free(scores);
    free(types);
    return HR_OK;
nomem:
    strlist_free(&t);
    free(scores);
    free(types);
    return hr_error_set(err, HR_ERR_NOMEM, "out of memory building a vocabulary");
}

/* GPT-2's reversible byte -> printable code point map, written as UTF-8 into out (<= 3 bytes). */
static void byte_symbol(int b, char *out) {
    int cp;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
        cp = b;
    } else {
        int n = 0; /* index of b among the bytes not mapped to themselves */
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

hr_status hr_synth_vocab_bpe(hr_gguf_writer *w, int n_vocab, const char *pre, hr_error *err) {
    if (n_vocab < 1000) return hr_error_set(err, HR_ERR_INVALID_ARG, "a BPE vocabulary needs at least 1000 tokens");
    strlist t = {0}, merges = {0};
    int32_t *types = malloc(sizeof(int32_t) * (size_t)n_vocab);
    if (!types) goto nomem;
    char a[32], b[32], m[80];
    for (int x = 0; x < 256; x++) {
        byte_symbol(x, a);
        types[t.n] = 1;
        if (push(&t, a) < 0) goto nomem;
    }
    int n_normal = n_vocab - 8; /* keep room for the special tokens below */
#define MERGE(l, r)                                                                                                    \
    do {                                                                                                               \
        if (t.n >= n_normal) goto specials;                                                                            \
        snprintf(m, sizeof m, "%s %s", (l), (r));                                                                      \
        if (push(&merges, m) < 0) goto nomem;                                                                          \
        snprintf(m, sizeof m, "%s%s", (l), (r));                                                                       \
        types[t.n] = 1;                                                                                                \
        if (push(&t, m) < 0) goto nomem;                                                                               \
    } while (0)
    for (int i = 0; i < 26; i++) {
        snprintf(b, sizeof b, "%c", k_letters[i]);
        MERGE(GB, b);
    }
    for (int i = 0; i < 26; i++)
        for (int j = 0; j < 26; j++) {
            snprintf(a, sizeof a, "%c", k_letters[i]);
            snprintf(b, sizeof b, "%c", k_letters[j]);
            MERGE(a, b);
        }
    for (int i = 0; i < 26; i++)
        for (int j = 0; j < 26; j++) {
            snprintf(a, sizeof a, GB "%c", k_letters[i]);
            snprintf(b, sizeof b, "%c", k_letters[j]);
            MERGE(a, b);
        }
    for (int i = 0; i < 26; i++)
        for (int j = 0; j < 26; j++)
            for (int k = 0; k < 26; k++) {
                snprintf(a, sizeof a, GB "%c%c", k_letters[i], k_letters[j]);
                snprintf(b, sizeof b, "%c", k_letters[k]);
                MERGE(a, b);
            }
    for (int i = 0; i < 26; i++)
        for (int j = 0; j < 26; j++)
            for (int k = 0; k < 26; k++) {
                snprintf(a, sizeof a, "%c%c", k_letters[i], k_letters[j]);
                snprintf(b, sizeof b, "%c", k_letters[k]);
                MERGE(a, b);
            }
#undef MERGE
specials:;
    int bos = t.n;
    types[t.n] = 3;
    push(&t, "<|begin_of_text|>");
    int eos = t.n;
    types[t.n] = 3;
    push(&t, "<|end_of_text|>");
    int eot = t.n;
    types[t.n] = 3;
    push(&t, "<|eot_id|>");
    for (int i = 0; t.n < n_vocab; i++) {
        snprintf(m, sizeof m, "<|reserved_special_token_%d|>", i);
        types[t.n] = 3;
        if (push(&t, m) < 0) goto nomem;
    }
    hr_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    hr_gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    hr_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", (const char *const *)t.v, (uint64_t)t.n);
    hr_gguf_writer_set_array(w, "tokenizer.ggml.token_type", HR_GGUF_I32, types, (uint64_t)t.n);
    hr_gguf_writer_set_str_array(w, "tokenizer.ggml.merges", (const char *const *)merges.v, (uint64_t)merges.n);
    hr_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
    hr_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    hr_gguf_writer_set_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)eot);
    hr_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    strlist_free(&t);
    strlist_free(&merges);
    free(types);
    return HR_OK;
nomem:
    strlist_free(&t);
    strlist_free(&merges);
    free(types);
    return hr_error_set(err, HR_ERR_NOMEM, "out of memory building a vocabulary");
}

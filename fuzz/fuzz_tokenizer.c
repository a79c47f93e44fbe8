/* fuzz_tokenizer.c: libFuzzer target for both tokenizers on arbitrary bytes. The vocabularies are the
 * synthetic ones the demo model uses (src/model/synth_vocab.c): one SentencePiece and one BPE per
 * pre-tokenizer, built once. Input: byte 0 picks the vocabulary, byte 1 the mode, the rest is text
 * (or, in mode 3, little-endian token ids, some out of range). Checked:
 *   - encode succeeds and every id is in the vocabulary;
 *   - decoding yields valid UTF-8, and the streaming decoder (hr_detok, one id at a time) yields
 *     exactly what hr_tokenizer_decode does;
 *   - for valid UTF-8 text without special parsing or BOS, decode(encode(text)) == text (both
 *     vocabularies fall back to bytes, so nothing may be lost; SentencePiece text holding U+2581, its
 *     space marker, is the one documented exception).
 * Byte 0 = 0xFF instead: the rest is a tokenizer.json document, a NUL, then text. The loader must accept it
 * or refuse it with a message (never crash); a vocabulary it accepts must encode the text into ids inside
 * the vocabulary and decode them into valid UTF-8. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "model/synth_internal.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static const char *const k_pres[] = {"default",     "llama-bpe", "qwen2",     "deepseek-llm", "deepseek-coder",
                                     "deepseek-v3", "falcon",    "starcoder", "refact",       "smollm",
                                     "phi-2",       "tekken",    "bloom",     "viking",       "command-r"};
#define N_PRES (sizeof k_pres / sizeof k_pres[0])

/* The fuzzer's vocabularies: [0] SentencePiece, [1 + i] BPE with k_pres[i]. Built once. */
static hr_tokenizer *g_tok[1 + N_PRES];

static void die(const char *what, const char *msg) {
    fprintf(stderr, "fuzz_tokenizer: %s: %s\n", what, msg);
    abort();
}

static hr_tokenizer *build(const char *pre) {
    hr_gguf_writer *w = hr_gguf_writer_create(3);
    hr_error err = {0};
    hr_status st = pre ? hr_synth_vocab_bpe(w, 2048, pre, &err) : hr_synth_vocab_spm(w, 2048, &err);
    if (st != HR_OK) die("vocabulary", err.msg);
    void *file = NULL;
    size_t size = 0;
    if (hr_gguf_writer_write_memory(w, &file, &size, &err) != HR_OK) die("write", err.msg);
    hr_gguf_writer_destroy(w);
    hr_gguf *g = NULL;
    hr_tokenizer *t = NULL;
    if (hr_gguf_open_memory(file, size, &g, &err) != HR_OK || hr_tokenizer_load(g, &t, &err) != HR_OK)
        die("load", err.msg);
    hr_gguf_close(g);
    free(file);
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    g_tok[0] = build(NULL);
    for (size_t i = 0; i < N_PRES; i++) g_tok[1 + i] = build(k_pres[i]);
    return 0;
}

/* Whether s[0..n) is well-formed UTF-8 (no overlongs, surrogates, or code points past U+10FFFF). */
static bool utf8_ok(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (!len || i + len > n) return false;
        uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1Fu : len == 3 ? c & 0x0Fu : c & 0x07u;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3Fu);
        }
        static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += len;
    }
    return true;
}

/* Decodes ids both ways and checks they agree and are valid UTF-8; returns the text (free it). */
static char *decode_checked(const hr_tokenizer *t, const int32_t *ids, size_t n, bool show_special, size_t *len) {
    char *text = NULL;
    hr_error err = {0};
    if (hr_tokenizer_decode(t, ids, n, show_special, &text, len, &err) != HR_OK) die("decode", err.msg);
    if (!utf8_ok((const uint8_t *)text, *len)) die("decode", "invalid UTF-8 out");
    size_t cap = hr_detok_max_bytes(t);
    char *piece = malloc(cap);
    char *joined = malloc(*len + 1);
    if (!piece || !joined) die("decode", "out of memory");
    hr_detok d;
    hr_detok_init(&d);
    d.show_special = show_special;
    size_t at = 0;
    for (size_t i = 0; i <= n; i++) {
        size_t k = i < n ? hr_detok_push(t, &d, ids[i], piece, cap) : hr_detok_flush(t, &d, piece, cap);
        if (at + k > *len) die("detok", "streaming decode longer than decode");
        memcpy(joined + at, piece, k);
        at += k;
    }
    if (at != *len || memcmp(joined, text, at) != 0) die("detok", "streaming decode differs from decode");
    free(piece);
    free(joined);
    return text;
}

/* Byte 0 = 0xFF: tokenizer.json, NUL, text. */
static int fuzz_json(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t json_len = nul ? (size_t)(nul - data) : size;
    hr_tokenizer *t = NULL;
    hr_error err = {0};
    if (hr_tokenizer_load_json_text((const char *)data, json_len, &t, &err) != HR_OK) {
        if (!err.msg[0]) die("json", "refused without a message");
        return 0;
    }
    size_t n = nul ? size - json_len - 1 : 0;
    char *text = malloc(n ? n : 1);
    if (!text) die("json", "out of memory");
    if (n) memcpy(text, nul + 1, n);
    hr_tokenize_opts opts = {.parse_special = true};
    int32_t *ids = NULL;
    size_t n_ids = 0, len = 0;
    if (hr_tokenizer_encode_alloc(t, text, n, &opts, &ids, &n_ids, &err) != HR_OK) die("json encode", err.msg);
    for (size_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= hr_tokenizer_n_vocab(t)) die("json encode", "id outside the vocabulary");
    free(decode_checked(t, ids, n_ids, true, &len));
    free(ids);
    free(text);
    hr_tokenizer_destroy(t);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size >= 1 && data[0] == 0xFF) return fuzz_json(data + 1, size - 1);
    if (size < 2) return 0;
    const hr_tokenizer *t = g_tok[data[0] % (1 + N_PRES)];
    int mode = data[1] & 3;
    const uint8_t *rest = data + 2;
    size_t n = size - 2;
    int32_t n_vocab = hr_tokenizer_n_vocab(t);
    if (mode == 3) { /* ids: decode anything, out-of-range ids included */
        size_t n_ids = n / 2;
        int32_t *ids = malloc(sizeof(int32_t) * (n_ids ? n_ids : 1));
        if (!ids) return 0;
        for (size_t i = 0; i < n_ids; i++) ids[i] = (int32_t)(rest[2 * i] | (rest[2 * i + 1] << 8)) - 16;
        size_t len = 0;
        free(decode_checked(t, ids, n_ids, (data[1] & 4) != 0, &len));
        free(ids);
        return 0;
    }
    /* an exact-size copy, so a read past the text's end is caught */
    char *text = malloc(n ? n : 1);
    if (!text) return 0;
    memcpy(text, rest, n);
    hr_tokenize_opts opts = {.add_bos = mode == 1, .parse_special = mode == 2};
    int32_t *ids = NULL;
    size_t n_ids = 0;
    hr_error err = {0};
    if (hr_tokenizer_encode_alloc(t, text, n, &opts, &ids, &n_ids, &err) != HR_OK) die("encode", err.msg);
    for (size_t i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= n_vocab) die("encode", "id outside the vocabulary");
    size_t len = 0;
    char *back = decode_checked(t, ids, n_ids, false, &len);
    /* SentencePiece writes a space as U+2581 and decodes U+2581 as a space: text that already holds
       U+2581 cannot come back byte for byte (by design, in every SentencePiece tokenizer) */
    bool lossy = !strcmp(hr_tokenizer_kind_name(t), "spm") && memmem(text, n, "\xe2\x96\x81", 3);
    if (mode == 0 && !lossy && utf8_ok(rest, n) && (len != n || memcmp(back, text, n) != 0)) {
        fprintf(stderr, "fuzz_tokenizer: %s/%s: round trip of %zu bytes gave %zu bytes\n", hr_tokenizer_kind_name(t),
                hr_tokenizer_pre_name(t), n, len);
        abort();
    }
    free(back);
    free(ids);
    free(text);
    return 0;
}

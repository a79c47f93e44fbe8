/* test_tokenizer_stream.c: the streaming decoder (hr_detok, what the server streams through) gives
 * the text that decoding the whole sequence at once gives, for characters split across byte tokens
 * (SentencePiece's <0xNN> and byte-level BPE's byte symbols), multi-byte pieces and invalid bytes,
 * with the stream cut after every token: after k tokens it has written exactly the whole-sequence
 * decode of those k tokens less an incomplete character it holds back, every chunk is valid UTF-8,
 * and what it wrote is never taken back. Also the one UTF-8 validator (common/utf8.h) against
 * hand-checked cases. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/utf8.h"
#include "gguf/gguf.h"
#include "harness.h"
#include "tokenizer/tokenizer.h"

#define SP "\xE2\x96\x81" /* U+2581, SentencePiece's space */

static hr_tokenizer *load(hr_gguf_writer *w) {
    void *data = NULL;
    size_t size = 0;
    hr_error err = {0};
    hr_gguf *g = NULL;
    hr_tokenizer *t = NULL;
    CHECKF(hr_gguf_writer_write_memory(w, &data, &size, &err) == HR_OK, "%s", err.msg);
    hr_gguf_writer_destroy(w);
    CHECKF(data && hr_gguf_open_memory(data, size, &g, &err) == HR_OK, "%s", err.msg);
    CHECKF(g && hr_tokenizer_load(g, &t, &err) == HR_OK, "%s", err.msg);
    hr_gguf_close(g);
    free(data);
    return t;
}

/* SPM: 0 <unk>, 1 <s>, 2 </s>, 3..258 <0x00>..<0xFF>, then the pieces. */
enum { S_SP = 259, S_A, S_SPA, S_EACUTE, S_EURO_A, S_N };
#define SB(b) (3 + (b)) /* the byte token of byte b */

static hr_tokenizer *spm(void) {
    static char names[256][8];
    const char *tok[S_N] = {"<unk>", "<s>", "</s>"};
    int32_t type[S_N] = {2, 3, 3};
    float score[S_N] = {0};
    for (int b = 0; b < 256; b++) {
        snprintf(names[b], sizeof names[b], "<0x%02X>", b);
        tok[SB(b)] = names[b];
        type[SB(b)] = 6;
    }
    /* é as one piece; "€a" a piece holding a whole 3-byte character and more */
    const char *pieces[] = {SP, "a", SP "a", "\xC3\xA9", "\xE2\x82\xAC\x61"}; /* \x61: 'a' */
    for (int i = 0; i < S_N - S_SP; i++) tok[S_SP + i] = pieces[i], type[S_SP + i] = 1, score[S_SP + i] = -1.0f;
    hr_gguf_writer *w = hr_gguf_writer_create(3);
    hr_gguf_writer_set_str(w, "general.architecture", "llama");
    hr_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    hr_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", tok, S_N);
    hr_gguf_writer_set_array(w, "tokenizer.ggml.scores", HR_GGUF_F32, score, S_N);
    hr_gguf_writer_set_array(w, "tokenizer.ggml.token_type", HR_GGUF_I32, type, S_N);
    hr_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    hr_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    hr_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    return load(w);
}

/* BPE: ids 0..255 the GPT-2 symbols of bytes 0..255, then "é" (its two byte symbols) as one token. */
enum { B_EACUTE = 256, B_N };

static hr_tokenizer *bpe(void) {
    static char names[256][4];
    static char eacute[8];
    const char *tok[B_N];
    int32_t type[B_N];
    for (int b = 0; b < 256; b++) {
        hr_test_gpt2_byte_char(b, names[b]);
        tok[b] = names[b];
        type[b] = 1;
    }
    snprintf(eacute, sizeof eacute, "%s%s", names[0xC3], names[0xA9]);
    tok[B_EACUTE] = eacute, type[B_EACUTE] = 1;
    const char *merges[] = {"\xC3\x83 \xC2\xA9"}; /* GPT-2's symbols of bytes C3 and A9 */
    hr_gguf_writer *w = hr_gguf_writer_create(3);
    hr_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    hr_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", tok, B_N);
    hr_gguf_writer_set_array(w, "tokenizer.ggml.token_type", HR_GGUF_I32, type, B_N);
    hr_gguf_writer_set_str_array(w, "tokenizer.ggml.merges", merges, 1);
    return load(w);
}

/* The whole-sequence decode of ids[0..n) (the non-streamed text). */
static char *whole(const hr_tokenizer *t, const int32_t *ids, size_t n, size_t *len) {
    char *s = NULL;
    hr_error err = {0};
    CHECKF(hr_tokenizer_decode(t, ids, n, false, &s, len, &err) == HR_OK, "%s", err.msg);
    return s;
}

/* Streams ids one at a time and checks, after every token k, that the text written so far plus what
 * a flush of a copy of the state would write is the whole decode of ids[0..k), that each chunk is
 * valid UTF-8, and at the end that the stream equals the whole decode of all of them. */
static bool stream_matches(const hr_tokenizer *t, const int32_t *ids, size_t n, const char *want, size_t want_len) {
    char out[1024], chunk[256], tail[64];
    size_t o = 0;
    bool ok = hr_detok_max_bytes(t) <= sizeof chunk;
    hr_detok d;
    hr_detok_init(&d);
    for (size_t k = 0; k <= n && ok; k++) {
        if (k > 0) {
            size_t c = hr_detok_push(t, &d, ids[k - 1], chunk, sizeof chunk);
            ok = ok && hr_utf8_valid(chunk, c, NULL) && o + c < sizeof out;
            if (!ok) break;
            memcpy(out + o, chunk, c);
            o += c;
        }
        hr_detok cut = d; /* the stream ended here */
        size_t f = hr_detok_flush(t, &cut, tail, sizeof tail);
        size_t pl = 0;
        char *prefix = whole(t, ids, k, &pl);
        ok = ok && prefix && hr_utf8_valid(tail, f, NULL) && pl == o + f && !memcmp(prefix, out, o) &&
             !memcmp(prefix + o, tail, f);
        free(prefix);
    }
    size_t f = ok ? hr_detok_flush(t, &d, tail, sizeof tail) : 0;
    memcpy(out + o, tail, f);
    o += f;
    size_t al = 0;
    char *all = whole(t, ids, n, &al);
    ok = ok && all && al == o && !memcmp(all, out, o) && (!want || (want_len == o && !memcmp(want, out, o)));
    if (!ok) fprintf(stderr, "stream '%.*s' vs whole '%.*s'\n", (int)o, out, all ? (int)al : 0, all ? all : "");
    free(all);
    return ok;
}

#define STREAM(t, want, ...)                                                                                           \
    stream_matches(t, (const int32_t[]){__VA_ARGS__}, sizeof((int32_t[]){__VA_ARGS__}) / sizeof(int32_t), want,        \
                   sizeof(want) - 1)

static void test_spm_stream(void) {
    hr_tokenizer *t = spm();
    if (!t) return;
    /* é as two byte tokens, then as one piece; € as three byte tokens; 😀 as four */
    CHECK(STREAM(t, "\xC3\xA9", SB(0xC3), SB(0xA9)));
    CHECK(STREAM(t, "\xC3\xA9\xC3\xA9", SB(0xC3), SB(0xA9), S_EACUTE));
    CHECK(STREAM(t,
                 "a\xE2\x82\xAC"
                 " a",
                 S_A, SB(0xE2), SB(0x82), SB(0xAC), S_SPA));
    CHECK(STREAM(t, "\xF0\x9F\x98\x80", SB(0xF0), SB(0x9F), SB(0x98), SB(0x80)));
    /* the leading space of the first piece goes (dummy prefix), BOS in front does not change that */
    CHECK(STREAM(t, "a\xF0\x9F\x98\x80", 1, S_SPA, SB(0xF0), SB(0x9F), SB(0x98), SB(0x80)));
    /* a piece holding a whole character after bytes of another */
    CHECK(STREAM(t,
                 "\xC3\xA9\xE2\x82\xAC"
                 "a",
                 SB(0xC3), SB(0xA9), S_EURO_A));
    /* a character cut by a piece: each byte of the cut sequence is one U+FFFD, then the piece */
    CHECK(STREAM(t, "\xEF\xBF\xBD\xEF\xBF\xBD\xC3\xA9", SB(0xF0), SB(0x9F), S_EACUTE));
    /* cut by the end: held back, then U+FFFD per byte at the flush */
    CHECK(STREAM(t, "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", S_A, SB(0xF0), SB(0x9F), SB(0x98)));
    /* never-valid bytes: a stray continuation, an overlong lead, a surrogate, 0xFF */
    CHECK(STREAM(t,
                 "\xEF\xBF\xBD"
                 "a",
                 SB(0x80), S_A));
    CHECK(STREAM(t, "\xEF\xBF\xBD\xEF\xBF\xBD", SB(0xC0), SB(0xAF)));
    CHECK(STREAM(t, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", SB(0xED), SB(0xA0), SB(0x80)));
    CHECK(STREAM(t, "\xEF\xBF\xBD", SB(0xFF)));
    /* every sequence of up to 5 tokens over bytes that start, continue or break characters, and the
       pieces: about 12^5 = 250k streams would be slow under ASan, so a fixed pseudo-random sample */
    const int32_t alphabet[] = {SB(0xC3), SB(0xA9), SB(0xE2), SB(0x82), SB(0xAC), SB(0xF0),
                                SB(0x9F), SB(0x80), SB(0xED), SB(0xFF), S_A,      S_EACUTE};
    const size_t n_alpha = sizeof alphabet / sizeof alphabet[0];
    uint64_t x = 0x9E3779B97F4A7C15ull;
    int bad = 0;
    for (int i = 0; i < 3000; i++) {
        int32_t ids[8];
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t n = 1 + (size_t)(x % 8);
        for (size_t k = 0; k < n; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            ids[k] = alphabet[x % n_alpha];
        }
        if (!stream_matches(t, ids, n, NULL, 0)) bad++;
    }
    CHECKF(bad == 0, "%d random streams differ from their whole decode", bad);
    hr_tokenizer_destroy(t);
}

static void test_bpe_stream(void) {
    hr_tokenizer *t = bpe();
    if (!t) return;
    CHECK(STREAM(t, "\xC3\xA9", 0xC3, 0xA9));
    CHECK(STREAM(t, "a\xC3\xA9\xC3\xA9", 'a', 0xC3, 0xA9, B_EACUTE));
    CHECK(STREAM(t, "\xE2\x82\xAC\xF0\x9F\x98\x80", 0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0x98, 0x80));
    CHECK(STREAM(t, "\xEF\xBF\xBD\xC3\xA9", 0xE2, B_EACUTE));
    CHECK(STREAM(t, " \xEF\xBF\xBD", ' ', 0xC3)); /* no SentencePiece space rule in BPE */
    hr_tokenizer_destroy(t);
}

/* The validator against hand-checked cases (RFC 3629 table 3 edges). */
static void test_validator(void) {
    static const struct {
        const char *s;
        size_t n, bad_at;
        bool ok;
    } cases[] = {
        {"", 0, 0, true},
        {"abc", 3, 3, true},
        {"\xC2\x80", 2, 2, true},          /* U+0080, the first 2-byte */
        {"\xDF\xBF", 2, 2, true},          /* U+07FF */
        {"\xE0\xA0\x80", 3, 3, true},      /* U+0800 */
        {"\xED\x9F\xBF", 3, 3, true},      /* U+D7FF, below the surrogates */
        {"\xEE\x80\x80", 3, 3, true},      /* U+E000, above them */
        {"\xF0\x90\x80\x80", 4, 4, true},  /* U+10000 */
        {"\xF4\x8F\xBF\xBF", 4, 4, true},  /* U+10FFFF */
        {"a\xC0\x80", 3, 1, false},        /* overlong NUL */
        {"ab\xE0\x9F\xBF", 5, 2, false},   /* overlong 3-byte */
        {"\xED\xA0\x80", 3, 0, false},     /* U+D800 */
        {"\xF4\x90\x80\x80", 4, 0, false}, /* past U+10FFFF */
        {"\xF5\x80\x80\x80", 4, 0, false}, /* no such lead */
        {"a\x80", 2, 1, false},            /* a stray continuation */
        {"\xC3\xA9\xE2\x82", 4, 2, false}, /* cut by the end */
        {"\xE2\x28\xA1", 3, 0, false},     /* a bad continuation */
        {"a\0b", 3, 3, true},              /* NUL is a character */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t at = 99;
        bool ok = hr_utf8_valid(cases[i].s, cases[i].n, &at);
        CHECKF(ok == cases[i].ok && at == cases[i].bad_at, "case %zu: valid %d at %zu, want %d at %zu", i, ok, at,
               cases[i].ok, cases[i].bad_at);
    }
    /* a prefix that can still complete, and ones that cannot */
    CHECK(hr_utf8_prefix_ok((const uint8_t *)"\xF0\x9F\x98", 3) && hr_utf8_prefix_ok((const uint8_t *)"\xE2", 1));
    CHECK(!hr_utf8_prefix_ok((const uint8_t *)"\xED\xA0", 2) && !hr_utf8_prefix_ok((const uint8_t *)"\xF0\x8F", 2));
    CHECK(!hr_utf8_prefix_ok((const uint8_t *)"\xC0", 1) && !hr_utf8_prefix_ok((const uint8_t *)"\x80", 1));
    /* encode and decode round-trip at every length edge */
    const uint32_t cps[] = {0, 0x7F, 0x80, 0x7FF, 0x800, 0xD7FF, 0xE000, 0xFFFF, 0x10000, 0x10FFFF};
    for (size_t i = 0; i < sizeof cps / sizeof cps[0]; i++) {
        char b[4];
        size_t n = hr_utf8_encode(cps[i], b);
        int len = 0;
        CHECKF(hr_utf8_len((const uint8_t *)b, n) == (int)n && hr_utf8_decode(b, &len) == cps[i] && len == (int)n,
               "U+%X", cps[i]);
    }
}

int main(void) {
    test_validator();
    test_spm_stream();
    test_bpe_stream();
    return hr_test_finish();
}

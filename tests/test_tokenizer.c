/* test_tokenizer.c: the tokenizer on tiny vocabularies this test writes itself (GGUF writer, in
 * memory): exact ids of a hand-checked SentencePiece-style vocabulary and a byte-level BPE one, byte
 * fallback, special-token parsing on and off, the invalid-UTF-8 rule, streaming decode of a character
 * split across byte tokens, load errors, and 1 MB inputs (which only finish if encoding is not
 * quadratic; nothing here measures time). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "harness.h"
#include "tokenizer/tokenizer.h"

#define SP "\xE2\x96\x81" /* U+2581, SentencePiece's space */

/* ---- building vocabularies ------------------------------------------------------------------------ */

static hr_tokenizer *load_from_writer(hr_gguf_writer *w, hr_status want, const char *want_msg) {
    void *data = NULL;
    size_t size = 0;
    hr_error err = {0};
    CHECKF(hr_gguf_writer_write_memory(w, &data, &size, &err) == HR_OK, "%s", err.msg);
    hr_gguf_writer_destroy(w);
    hr_gguf *g = NULL;
    CHECKF(hr_gguf_open_memory(data, size, &g, &err) == HR_OK, "%s", err.msg);
    hr_tokenizer *t = NULL;
    hr_status st = g ? hr_tokenizer_load(g, &t, &err) : HR_ERR_IO;
    CHECKF(st == want, "load: want %s, got %s: %s", hr_status_name(want), hr_status_name(st), err.msg);
    if (want_msg) CHECKF(strstr(err.msg, want_msg) != NULL, "message '%s' lacks '%s'", err.msg, want_msg);
    hr_gguf_close(g); /* the tokenizer copies what it needs */
    free(data);
    return t;
}

/* SPM: 0 <unk>, 1 <s>, 2 </s>, 3..258 <0x00>..<0xFF>, then the pieces below. */
enum { SPM_SP = 259, SPM_A, SPM_B, SPM_C, SPM_AB, SPM_SPAB, SPM_BC, SPM_SPA, SPM_EOT, SPM_EACUTE, SPM_N };

static hr_gguf_writer *spm_writer(void) {
    static char names[SPM_N][16];
    const char *tok[SPM_N];
    float score[SPM_N];
    int32_t type[SPM_N];
    tok[0] = "<unk>", tok[1] = "<s>", tok[2] = "</s>";
    type[0] = 2, type[1] = 3, type[2] = 3;
    for (int b = 0; b < 256; b++) {
        snprintf(names[3 + b], sizeof names[0], "<0x%02X>", b);
        tok[3 + b] = names[3 + b];
        type[3 + b] = 6;
    }
    const struct {
        const char *text;
        float score;
        int type;
    } pieces[] = {{SP, -1.0f, 1},       {"a", -2.0f, 1},       {"b", -3.0f, 1},  {"c", -4.0f, 1},
                  {"ab", -1.5f, 1},     {SP "ab", -0.5f, 1},   {"bc", -1.2f, 1}, {SP "a", -2.5f, 1},
                  {"<|eot|>", 0.0f, 3}, {"\xC3\xA9", -5.0f, 1}};
    for (int i = 0; i < SPM_N; i++) score[i] = 0.0f;
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) {
        tok[SPM_SP + i] = pieces[i].text;
        score[SPM_SP + i] = pieces[i].score;
        type[SPM_SP + i] = pieces[i].type;
    }
    hr_gguf_writer *w = hr_gguf_writer_create(3);
    hr_gguf_writer_set_str(w, "general.architecture", "llama");
    hr_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    hr_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", tok, SPM_N);
    hr_gguf_writer_set_array(w, "tokenizer.ggml.scores", HR_GGUF_F32, score, SPM_N);
    hr_gguf_writer_set_array(w, "tokenizer.ggml.token_type", HR_GGUF_I32, type, SPM_N);
    hr_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    hr_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    hr_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    hr_gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", 0xFFFFFFFFu); /* "none" */
    return w;
}

/* BPE: ids 0..255 are the GPT-2-mapped characters of bytes 0..255, then merged tokens and specials. */
enum { BPE_HE = 256, BPE_LL, BPE_HELL, BPE_HELLO, BPE_GW, BPE_GWO, BPE_EOT, BPE_USER, BPE_XYZ, BPE_N };

static hr_gguf_writer *bpe_writer(const char *pre) {
    static char names[256][4];
    const char *tok[BPE_N];
    int32_t type[BPE_N];
    for (int b = 0; b < 256; b++) {
        hr_test_gpt2_byte_char(b, names[b]);
        tok[b] = names[b];
        type[b] = 1;
    }
    tok[BPE_HE] = "he", tok[BPE_LL] = "ll", tok[BPE_HELL] = "hell", tok[BPE_HELLO] = "hello";
    tok[BPE_GW] = "\xC4\xA0w", tok[BPE_GWO] = "\xC4\xA0wo", tok[BPE_EOT] = "<|endoftext|>", tok[BPE_USER] = "<tool>";
    tok[BPE_XYZ] = "xyz";
    for (int i = BPE_HE; i < BPE_N; i++) type[i] = 1;
    type[BPE_EOT] = 3, type[BPE_USER] = 4;
    const char *merges[] = {"h e", "l l", "he ll", "hell o", "\xC4\xA0 w", "\xC4\xA0w o"};
    hr_gguf_writer *w = hr_gguf_writer_create(3);
    hr_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    if (pre) hr_gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    hr_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", tok, BPE_N);
    hr_gguf_writer_set_array(w, "tokenizer.ggml.token_type", HR_GGUF_I32, type, BPE_N);
    hr_gguf_writer_set_str_array(w, "tokenizer.ggml.merges", merges, sizeof merges / sizeof merges[0]);
    hr_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", BPE_EOT);
    hr_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", BPE_EOT);
    return w;
}

/* ---- helpers -------------------------------------------------------------------------------------- */

static bool enc_eq(const hr_tokenizer *t, const char *text, size_t len, hr_tokenize_opts o, const int32_t *want,
                   size_t n_want) {
    int32_t got[256];
    size_t n = 0;
    hr_error err = {0};
    if (hr_tokenizer_encode(t, text, len, &o, got, 256, &n, &err) != HR_OK) {
        fprintf(stderr, "encode failed: %s\n", err.msg);
        return false;
    }
    bool same = n == n_want && memcmp(got, want, n * sizeof(int32_t)) == 0;
    if (!same) {
        fprintf(stderr, "encode '%.*s': got", (int)len, text);
        for (size_t i = 0; i < n && i < 256; i++) fprintf(stderr, " %d", got[i]);
        fprintf(stderr, ", want");
        for (size_t i = 0; i < n_want; i++) fprintf(stderr, " %d", want[i]);
        fputc('\n', stderr);
    }
    return same;
}
#define ENC(t, text, o, ...)                                                                                           \
    enc_eq(t, text, strlen(text), o, (const int32_t[]){__VA_ARGS__}, sizeof((int32_t[]){__VA_ARGS__}) / sizeof(int32_t))

static const hr_tokenize_opts k_plain = {.add_bos = false, .add_eos = false, .parse_special = false};
static const hr_tokenize_opts k_special = {.add_bos = false, .add_eos = false, .parse_special = true};
static const hr_tokenize_opts k_bos_eos = {.add_bos = true, .add_eos = true, .parse_special = false};

/* ---- tests ---------------------------------------------------------------------------------------- */

static void test_spm(void) {
    hr_tokenizer *t = load_from_writer(spm_writer(), HR_OK, NULL);
    if (!t) return;
    CHECK(hr_tokenizer_n_vocab(t) == SPM_N);
    CHECK(hr_tokenizer_bos(t) == 1 && hr_tokenizer_eos(t) == 2 && hr_tokenizer_unk(t) == 0);
    CHECK(hr_tokenizer_pad(t) == -1); /* 0xFFFFFFFF means none */
    CHECK(hr_tokenizer_add_bos_default(t));
    /* EOS ends a generation, and so does a generated BOS (llama2.c models end a story with it) */
    CHECK(hr_tokenizer_is_eog(t, 2) && hr_tokenizer_is_eog(t, 1) && !hr_tokenizer_is_eog(t, SPM_A));
    CHECK(strcmp(hr_tokenizer_piece(t, SPM_SPAB), SP "ab") == 0 && hr_tokenizer_piece(t, SPM_N) == NULL);
    CHECK(hr_tokenizer_token_type(t, 5) == 6 && hr_tokenizer_token_type(t, SPM_EOT) == 3);

    /* "▁ab": "ab" (-1.5) beats "▁a" (-2.5), then "▁ab" (-0.5) */
    CHECK(ENC(t, "ab", k_plain, SPM_SPAB));
    /* "▁abc": "bc" (-1.2) first, then "▁a"; "▁abc" is no token */
    CHECK(ENC(t, "abc", k_plain, SPM_SPA, SPM_BC));
    CHECK(ENC(t, "ca", k_plain, SPM_SP, SPM_C, SPM_A));
    CHECK(ENC(t, " ab", k_plain, SPM_SP, SPM_SPAB)); /* dummy prefix + the text's own space */
    int32_t dummy[1];
    size_t n = 99;
    CHECK(hr_tokenizer_encode(t, "", 0, &k_plain, dummy, 1, &n, NULL) == HR_OK && n == 0);
    CHECK(hr_tokenizer_encode(t, "", 0, &k_bos_eos, dummy, 1, &n, NULL) == HR_OK && n == 2 && dummy[0] == 1);
    CHECK(ENC(t, "ab", k_bos_eos, 1, SPM_SPAB, 2));
    /* byte fallback: ü (C3 BC) is no piece; é is */
    CHECK(ENC(t, "\xC3\xBC", k_plain, SPM_SP, 3 + 0xC3, 3 + 0xBC));
    CHECK(ENC(t, "\xC3\xA9", k_plain, SPM_SP, SPM_EACUTE));
    /* special tokens: parsed only when asked; the text after one gets the dummy prefix again */
    CHECK(ENC(t, "a<|eot|>b", k_special, SPM_SPA, SPM_EOT, SPM_SP, SPM_B));
    CHECK(ENC(t, "a<|eot|>b", k_plain, SPM_SPA, 3 + '<', 3 + '|', 3 + 'e', 3 + 'o', 3 + 't', 3 + '|', 3 + '>', SPM_B));
    CHECK(ENC(t, "<s>", k_special, 1));
    /* invalid UTF-8: the stray byte becomes U+FFFD (EF BF BD, spelled as byte tokens here) */
    CHECK(ENC(t,
              "a\xFF"
              "b",
              k_plain, SPM_SPA, 3 + 0xEF, 3 + 0xBF, 3 + 0xBD, SPM_B));
    CHECK(ENC(t, "a\xC3", k_plain, SPM_SPA, 3 + 0xEF, 3 + 0xBF, 3 + 0xBD)); /* truncated sequence */
    CHECK(
        ENC(t, "\xC0\xAF", k_plain, SPM_SP, 3 + 0xEF, 3 + 0xBF, 3 + 0xBD, 3 + 0xEF, 3 + 0xBF, 3 + 0xBD)); /* overlong */

    /* a short output buffer reports the full count */
    int32_t two[2];
    CHECK(hr_tokenizer_encode(t, "ca", 2, &k_plain, two, 2, &n, NULL) == HR_OK && n == 3 && two[0] == SPM_SP);

    /* streaming decode: BOS and the dummy space vanish; a character split over byte tokens waits */
    hr_detok d;
    hr_detok_init(&d);
    char buf[256];
    CHECK(hr_detok_max_bytes(t) <= sizeof buf);
    CHECK(hr_detok_push(t, &d, 1, buf, sizeof buf) == 0);
    CHECK(hr_detok_push(t, &d, SPM_SP, buf, sizeof buf) == 0);
    CHECK(hr_detok_push(t, &d, 3 + 0xC3, buf, sizeof buf) == 0 && buf[0] == 0);
    CHECK(hr_detok_push(t, &d, 3 + 0xBC, buf, sizeof buf) == 2 && strcmp(buf, "\xC3\xBC") == 0);
    CHECK(hr_detok_push(t, &d, SPM_SPAB, buf, sizeof buf) == 3 && strcmp(buf, " ab") == 0);
    CHECK(hr_detok_push(t, &d, SPM_EOT, buf, sizeof buf) == 0);
    d.show_special = true;
    CHECK(hr_detok_push(t, &d, SPM_EOT, buf, sizeof buf) == 7 && strcmp(buf, "<|eot|>") == 0);
    /* an invalid continuation: the held lead byte becomes U+FFFD, the next byte goes through */
    CHECK(hr_detok_push(t, &d, 3 + 0xC3, buf, sizeof buf) == 0);
    CHECK(hr_detok_push(t, &d, SPM_C, buf, sizeof buf) == 4 && strcmp(buf, "\xEF\xBF\xBD"
                                                                           "c") == 0);
    /* end of stream with bytes pending */
    CHECK(hr_detok_push(t, &d, 3 + 0xE2, buf, sizeof buf) == 0);
    CHECK(hr_detok_push(t, &d, 3 + 0x96, buf, sizeof buf) == 0);
    CHECK(hr_detok_flush(t, &d, buf, sizeof buf) == 6 && strcmp(buf, "\xEF\xBF\xBD\xEF\xBF\xBD") == 0);
    CHECK(hr_detok_push(t, &d, -5, buf, sizeof buf) == 0 && hr_detok_push(t, &d, SPM_N, buf, sizeof buf) == 0);
    /* a tiny buffer cuts at a character boundary and stays NUL-terminated */
    hr_detok_init(&d);
    d.at_start = false;
    CHECK(hr_detok_push(t, &d, SPM_SPAB, buf, 3) == 2 && strcmp(buf, " a") == 0);

    /* whole-sequence decode inverts encode */
    const char *text = "ab c\xC3\xBC abc";
    int32_t *ids = NULL;
    char *back = NULL;
    size_t n_ids = 0, back_len = 0;
    CHECK(hr_tokenizer_encode_alloc(t, text, strlen(text), NULL, &ids, &n_ids, NULL) == HR_OK);
    CHECK(n_ids > 0 && ids[0] == 1); /* opts NULL: the vocabulary's default adds BOS */
    CHECK(hr_tokenizer_decode(t, ids, n_ids, false, &back, &back_len, NULL) == HR_OK);
    CHECK(back && strcmp(back, text) == 0 && back_len == strlen(text));
    free(ids);
    free(back);

    /* 1 MB of text in one fragment: O(n log n), so this finishes in well under a second */
    size_t big = 1 << 20;
    char *s = malloc(big + 1);
    for (size_t i = 0; i < big; i++) s[i] = "abc ab\xC3\xA9 "[i % 10];
    s[big] = 0;
    CHECK(hr_tokenizer_encode_alloc(t, s, big, &k_plain, &ids, &n_ids, NULL) == HR_OK && n_ids > big / 10);
    CHECK(hr_tokenizer_decode(t, ids, n_ids, false, &back, &back_len, NULL) == HR_OK);
    CHECK(back_len == big && memcmp(back, s, big) == 0);
    free(ids);
    free(back);
    free(s);
    hr_tokenizer_destroy(t);
}

/* A vocabulary with a token that spans a word start ("a▁b"): the encoder must then merge across words
 * (its word-by-word shortcut is only valid when no token contains U+2581 after another character). */
static void test_spm_cross_word(void) {
    const char *tok[] = {"<unk>", "<s>", "</s>", SP, "a", "b", "a" SP, "a" SP "b"};
    float score[] = {0, 0, 0, -3, -3, -3, -1, 0};
    int32_t type[] = {2, 3, 3, 1, 1, 1, 1, 1};
    hr_gguf_writer *w = hr_gguf_writer_create(3);
    hr_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    hr_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", tok, 8);
    hr_gguf_writer_set_array(w, "tokenizer.ggml.scores", HR_GGUF_F32, score, 8);
    hr_gguf_writer_set_array(w, "tokenizer.ggml.token_type", HR_GGUF_I32, type, 8);
    hr_tokenizer *t = load_from_writer(w, HR_OK, NULL);
    if (!t) return;
    CHECK(ENC(t, "a b", k_plain, 3, 7)); /* ▁ + "a▁b" */
    CHECK(ENC(t, "a b a b", k_plain, 3, 7, 3, 7));
    hr_tokenizer_destroy(t);
}

/* Phi-3 (by general.name, as llama.cpp): a parsed special token eats the whitespace after it, except
 * <s>, <unk> and <|endoftext|>. */
static void test_phi3_rstrip(void) {
    for (int phi = 0; phi < 2; phi++) {
        hr_gguf_writer *w = spm_writer();
        hr_gguf_writer_set_str(w, "general.name", phi ? "Phi-3-mini-4k-instruct" : "tiny");
        hr_tokenizer *t = load_from_writer(w, HR_OK, NULL);
        if (!t) return;
        if (phi) {
            CHECK(ENC(t, "<|eot|> \n a", k_special, SPM_EOT, SPM_SPA)); /* " \n " eaten, then the prefix */
            CHECK(ENC(t, "<s> a", k_special, 1, SPM_SP, SPM_SPA));      /* <s> keeps it */
            /* not parsed as a token: nothing is stripped */
            CHECK(ENC(t, "<|eot|> a", k_plain, SPM_SP, 3 + '<', 3 + '|', 3 + 'e', 3 + 'o', 3 + 't', 3 + '|', 3 + '>',
                      SPM_SPA));
        } else {
            /* other models keep the whitespace: dummy prefix + ' ' + '\n', then "▁a" */
            CHECK(ENC(t, "<|eot|> \n a", k_special, SPM_EOT, SPM_SP, SPM_SP, 3 + '\n', SPM_SPA));
        }
        hr_tokenizer_destroy(t);
    }
}

static void test_bpe(void) {
    hr_tokenizer *t = load_from_writer(bpe_writer("gpt-2"), HR_OK, NULL);
    if (!t) return;
    CHECK(!hr_tokenizer_add_bos_default(t)); /* gpt2 vocabularies add no BOS unless the file says so */
    CHECK(hr_tokenizer_is_eog(t, BPE_EOT));
    CHECK(ENC(t, "hello world", k_plain, BPE_HELLO, BPE_GWO, 'r', 'l', 'd'));
    CHECK(ENC(t, "hell", k_plain, BPE_HELL));
    CHECK(ENC(t, "ohell", k_plain, 'o', BPE_HELL)); /* merges apply inside the word by rank */
    CHECK(ENC(t, "xyz", k_plain, 'x', 'y', 'z'));   /* a token no merge reaches is not used by gpt-2 BPE */
    CHECK(ENC(t, "hi<|endoftext|>", k_special, 'h', 'i', BPE_EOT));
    CHECK(
        ENC(t, "hi<|endoftext|>", k_plain, 'h', 'i', '<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't', '|', '>'));
    /* user-defined tokens are split out even without parse_special (as Hugging Face does) */
    CHECK(ENC(t, "a<tool>b", k_plain, 'a', BPE_USER, 'b'));
    /* the é of "\xC3\xA9" is two byte tokens; ids of bytes >= 0x80 equal the byte here */
    CHECK(ENC(t, "\xC3\xA9", k_plain, 0xC3, 0xA9));
    /* invalid byte -> U+FFFD; ' ?[^\s\p{L}\p{N}]+' keeps the space with it; ids of bytes equal the byte */
    CHECK(ENC(t, " \xFF", k_plain, ' ', 0xEF, 0xBF, 0xBD));

    hr_detok d;
    hr_detok_init(&d);
    char buf[256];
    CHECK(hr_detok_max_bytes(t) <= sizeof buf);
    CHECK(hr_detok_push(t, &d, BPE_HELLO, buf, sizeof buf) == 5 && strcmp(buf, "hello") == 0);
    CHECK(hr_detok_push(t, &d, BPE_GWO, buf, sizeof buf) == 3 && strcmp(buf, " wo") == 0); /* no SPM stripping */
    CHECK(hr_detok_push(t, &d, 0xC3, buf, sizeof buf) == 0);
    CHECK(hr_detok_push(t, &d, 0xA9, buf, sizeof buf) == 2 && strcmp(buf, "\xC3\xA9") == 0);
    CHECK(hr_detok_push(t, &d, BPE_EOT, buf, sizeof buf) == 0);
    CHECK(hr_detok_push(t, &d, BPE_USER, buf, sizeof buf) == 6 && strcmp(buf, "<tool>") == 0);

    /* one 1 MB "word" (no spaces) and 1 MB of words: neither may be quadratic */
    size_t big = 1 << 20;
    char *s = malloc(big + 1);
    int32_t *ids = NULL;
    char *back = NULL;
    size_t n_ids = 0, back_len = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < big; i++) s[i] = pass == 0 ? "hello"[i % 5] : "hello world "[i % 12];
        s[big] = 0;
        CHECK(hr_tokenizer_encode_alloc(t, s, big, &k_plain, &ids, &n_ids, NULL) == HR_OK);
        CHECK(hr_tokenizer_decode(t, ids, n_ids, false, &back, &back_len, NULL) == HR_OK);
        CHECK(back_len == big && memcmp(back, s, big) == 0);
        free(ids);
        free(back);
    }
    free(s);
    hr_tokenizer_destroy(t);

    /* every pre-tokenizer name the docs list loads; an unknown one is refused by name */
    const char *pres[] = {"default",     "llama-bpe", "qwen2",     "deepseek-llm", "deepseek-coder",
                          "deepseek-v3", "falcon",    "starcoder", "refact",       "smollm",
                          "phi-2",       "tekken",    "bloom",     "viking",       "command-r"};
    for (size_t i = 0; i < sizeof pres / sizeof pres[0]; i++) {
        t = load_from_writer(bpe_writer(pres[i]), HR_OK, NULL);
        CHECKF(t && ENC(t, "hello world", k_plain, BPE_HELLO, BPE_GWO, 'r', 'l', 'd'), "pre %s", pres[i]);
        hr_tokenizer_destroy(t);
    }
    t = load_from_writer(bpe_writer(NULL), HR_OK, NULL); /* absent .pre: "default" */
    hr_tokenizer_destroy(t);
    t = load_from_writer(bpe_writer("no-such-pre"), HR_ERR_UNSUPPORTED, "no-such-pre");
    hr_tokenizer_destroy(t);
}

static void test_llama3_style(void) {
    /* llama-bpe: BOS by default, and a word that is itself a token is taken whole (ignore_merges) */
    hr_gguf_writer *w = bpe_writer("llama-bpe");
    hr_tokenizer *t = load_from_writer(w, HR_OK, NULL);
    if (!t) return;
    CHECK(hr_tokenizer_add_bos_default(t));
    CHECK(ENC(t, "xyz", k_plain, BPE_XYZ));
    /* the llama-3 regex: digits in groups of up to three, the space before them stands alone */
    CHECK(ENC(t, "hello 123456", k_plain, BPE_HELLO, ' ', '1', '2', '3', '4', '5', '6'));
    hr_tokenizer_destroy(t);
}

static void test_load_errors(void) {
    hr_gguf_writer *w = hr_gguf_writer_create(3);
    hr_gguf_writer_set_str(w, "general.architecture", "llama");
    hr_tokenizer *t = load_from_writer(w, HR_ERR_NOT_FOUND, "tokenizer.ggml.model");
    CHECK(t == NULL);
    w = hr_gguf_writer_create(3);
    hr_gguf_writer_set_str(w, "tokenizer.ggml.model", "bert");
    t = load_from_writer(w, HR_ERR_UNSUPPORTED, "bert");
    w = hr_gguf_writer_create(3);
    hr_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    t = load_from_writer(w, HR_ERR_NOT_FOUND, "tokenizer.ggml.tokens");
    w = hr_gguf_writer_create(3);
    const char *toks[] = {"a", "b"};
    hr_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    hr_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", toks, 2);
    t = load_from_writer(w, HR_ERR_FORMAT, "scores");
    w = hr_gguf_writer_create(3);
    float sc[1] = {0};
    hr_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    hr_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", toks, 2);
    hr_gguf_writer_set_array(w, "tokenizer.ggml.scores", HR_GGUF_F32, sc, 1);
    t = load_from_writer(w, HR_ERR_FORMAT, "tokenizer.ggml.scores");
    w = hr_gguf_writer_create(3);
    hr_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    hr_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", toks, 2);
    t = load_from_writer(w, HR_ERR_NOT_FOUND, "merges");
    w = hr_gguf_writer_create(3);
    const char *bad_merges[] = {"ab"};
    hr_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    hr_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", toks, 2);
    hr_gguf_writer_set_str_array(w, "tokenizer.ggml.merges", bad_merges, 1);
    t = load_from_writer(w, HR_ERR_FORMAT, "merges[0]");
    CHECK(t == NULL);
}

/* One tokenizer, several threads encoding at once: every thread must get the single-thread result. */
typedef struct thread_job {
    const hr_tokenizer *t;
    const char *text;
    size_t len;
    int32_t *ids;
    size_t n;
    hr_status st;
} thread_job;

static void *encode_job(void *arg) {
    thread_job *j = arg;
    hr_tokenize_opts o = {.add_bos = true, .parse_special = true};
    j->st = hr_tokenizer_encode_alloc(j->t, j->text, j->len, &o, &j->ids, &j->n, NULL);
    return NULL;
}

static void test_threads(void) {
    size_t len = 200000;
    char *text = malloc(len + 1);
    static const char unit[] = "hello world ab<|eot|> c\xC3\xA9 xyz 123\n";
    for (size_t i = 0; i < len; i++) text[i] = unit[i % (sizeof unit - 1)];
    text[len] = 0;
    for (int v = 0; v < 2; v++) {
        hr_tokenizer *t = load_from_writer(v ? bpe_writer("llama-bpe") : spm_writer(), HR_OK, NULL);
        if (!t) continue;
        thread_job ref = {t, text, len, NULL, 0, HR_OK}, jobs[4];
        encode_job(&ref);
        CHECK(ref.st == HR_OK);
        pthread_t th[4];
        for (int i = 0; i < 4; i++) {
            jobs[i] = (thread_job){t, text, len, NULL, 0, HR_OK};
            CHECK(pthread_create(&th[i], NULL, encode_job, &jobs[i]) == 0);
        }
        for (int i = 0; i < 4; i++) {
            pthread_join(th[i], NULL);
            CHECK(jobs[i].st == HR_OK && jobs[i].n == ref.n && memcmp(jobs[i].ids, ref.ids, ref.n * 4) == 0);
            free(jobs[i].ids);
        }
        free(ref.ids);
        hr_tokenizer_destroy(t);
    }
    free(text);
}

int main(void) {
    test_threads();
    test_spm();
    test_spm_cross_word();
    test_phi3_rstrip();
    test_bpe();
    test_llama3_style();
    test_load_errors();
    return hr_test_finish();
}

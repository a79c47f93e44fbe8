/* encode.c: text -> ids. The pipeline: sanitize UTF-8 (each byte that does not start a well-formed
 * sequence becomes U+FFFD), split on special-token texts (special.c), then run each raw fragment through
 * the vocabulary's algorithm: SentencePiece (dummy-prefix space, ' ' -> U+2581, spm.c) or byte-level BPE
 * (regex pre-tokenizer, pretok.c, then per-word merges, bpe.c). BOS/EOS are added around the result as
 * the options say. All scratch memory belongs to the call. */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tokenizer/tok_internal.h"

typedef struct bpe_ctx {
    const hr_tokenizer *t;
    hr_ivec *out;
    hr_bpe_scratch *scratch;
} bpe_ctx;

static hr_status bpe_piece(void *ctx, const char *piece, size_t len) {
    bpe_ctx *c = ctx;
    return hr_bpe_encode_word(c->t, (const uint8_t *)piece, len, c->out, c->scratch);
}

/* Whether the U+2581 at buf[i] (i > 0) may start a new word: the character before it is no U+2581 and no
 * "glue" character (see tok_internal.h). */
static bool cut_before(const hr_tokenizer *t, const char *buf, size_t i) {
    size_t j = i - 1;
    while (j > 0 && ((uint8_t)buf[j] & 0xC0) == 0x80) j--;
    int cl;
    uint32_t cp = hr_utf8_decode(buf + j, &cl);
    if (cp == 0x2581) return false;
    for (int k = 0; k < t->n_spm_glue; k++)
        if (t->spm_glue[k] == cp) return false;
    return true;
}

/* SentencePiece: optional leading space, then ' ' -> U+2581, then the merge algorithm (by score, or by rank
 * for vocabularies that carry merges). */
static hr_status spm_fragment(const hr_tokenizer *t, const char *text, size_t len, bool prefix, hr_ivec *out,
                              hr_bpe_scratch *scratch) {
    if (prefix && t->metaspace_prefix && len > 0 && text[0] == ' ') prefix = false; /* Metaspace: no second one */
    size_t spaces = prefix ? 1 : 0;
    for (size_t i = 0; i < len; i++) spaces += text[i] == ' ';
    size_t n = len + (prefix ? 1 : 0) + 2 * spaces;
    char *buf = malloc(n + 1);
    if (!buf) return HR_ERR_NOMEM;
    size_t o = 0;
    if (prefix) memcpy(buf + o, "\xE2\x96\x81", 3), o += 3;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(buf + o, "\xE2\x96\x81", 3);
            o += 3;
        } else {
            buf[o++] = text[i];
        }
    }
    hr_status st = HR_OK;
    size_t start = 0;
    if (t->spm_split_words || t->split_metaspace) {
        /* cut before each U+2581 that follows another character (see tok_internal.h); Metaspace with split
         * cuts before every U+2581 */
        for (size_t i = 3; i + 3 <= o && st == HR_OK; i++) {
            if (memcmp(buf + i, "\xE2\x96\x81", 3) == 0 && i > start && (t->split_metaspace || cut_before(t, buf, i))) {
                st = t->spm_merges ? hr_bpe_encode_chars(t, buf + start, i - start, out, scratch)
                                   : hr_spm_encode_fragment(t, buf + start, i - start, out);
                start = i;
            }
        }
    }
    if (st == HR_OK)
        st = t->spm_merges ? hr_bpe_encode_chars(t, buf + start, o - start, out, scratch)
                           : hr_spm_encode_fragment(t, buf + start, o - start, out);
    free(buf);
    return st;
}

/* Unicode normalization of one raw fragment (tokenizer.json's normalizer). *out is malloc'd, or NULL when
 * the text is already normalized. */
static hr_status normalize(const hr_tokenizer *t, const char *text, size_t len, char **out, size_t *out_len) {
    static const utf8proc_option_t opts[] = {
        [HR_NORM_NFC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE,
        [HR_NORM_NFKC] = UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
        [HR_NORM_NFD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
        [HR_NORM_NFKD] = UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT,
    };
    /* Text that cannot change: ASCII under every form; under NFC also text below U+0300 (no lead byte from
     * 0xCC up: nothing there decomposes into something that recomposes differently, nothing combines). */
    uint8_t limit = t->normalizer == HR_NORM_NFC ? 0xCC : 0x80;
    size_t k = 0;
    while (k < len && (uint8_t)text[k] < limit) k++;
    if (k == len) {
        *out = NULL;
        *out_len = len;
        return HR_OK;
    }
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len, &dst, opts[t->normalizer]);
    if (n < 0) return n == UTF8PROC_ERROR_NOMEM ? HR_ERR_NOMEM : HR_ERR_INTERNAL; /* the text is valid UTF-8 */
    *out = (char *)dst;
    *out_len = (size_t)n;
    return HR_OK;
}

/* Encodes clean (sanitized) text; allow as in hr_special_partition. Takes clean and allow over. */
static hr_status encode_clean(const hr_tokenizer *t, char *clean, size_t clean_len, uint8_t *allow, size_t len,
                              const hr_tokenize_opts *o, hr_ivec *out, hr_error *err) {
    hr_fragment *frags = NULL;
    size_t n_frags = 0;
    hr_status st = hr_special_partition(t, clean, clean_len, o->parse_special || allow, allow, &frags, &n_frags);
    free(allow);
    hr_bpe_scratch *scratch = NULL;
    hr_pretok_scratch *pre = NULL;
    if (st == HR_OK && (t->kind == HR_VOCAB_BPE || t->spm_merges) && !(scratch = hr_bpe_scratch_create()))
        st = HR_ERR_NOMEM;
    if (st == HR_OK && t->kind == HR_VOCAB_BPE && !(pre = hr_pretok_scratch_create(t))) st = HR_ERR_NOMEM;
    if (st == HR_OK && o->add_bos && t->bos >= 0 && !hr_ivec_push(out, t->bos)) st = HR_ERR_NOMEM;
    bool prev_special = true; /* SentencePiece: a fragment at the start or after a special token gets the prefix */
    for (size_t i = 0; i < n_frags && st == HR_OK; i++) {
        const hr_fragment *f = &frags[i];
        if (f->id >= 0) {
            if (!hr_ivec_push(out, f->id)) st = HR_ERR_NOMEM;
            prev_special = true;
            continue;
        }
        const char *frag = clean + f->start;
        size_t frag_len = f->len;
        char *normed = NULL;
        if (t->normalizer != HR_NORM_NONE) {
            st = normalize(t, frag, frag_len, &normed, &frag_len);
            if (st != HR_OK) break;
            if (normed) frag = normed;
        }
        if (t->kind == HR_VOCAB_SPM) {
            bool prefix = t->add_space_prefix && (t->prefix_first ? i == 0 : prev_special);
            st = spm_fragment(t, frag, frag_len, prefix, out, scratch);
        } else {
            bpe_ctx ctx = {t, out, scratch};
            st = hr_pretok_split(t, pre, frag, frag_len, bpe_piece, &ctx, err);
        }
        free(normed);
        prev_special = false;
    }
    if (st == HR_OK && o->add_eos && t->eos >= 0 && !hr_ivec_push(out, t->eos)) st = HR_ERR_NOMEM;
    hr_bpe_scratch_destroy(scratch);
    hr_pretok_scratch_destroy(pre);
    free(frags);
    free(clean);
    if (st == HR_ERR_NOMEM)
        hr_error_set(err, st, "tokenizer: out of memory (%zu bytes of text)", len);
    else if (st == HR_ERR_INTERNAL)
        hr_error_set(err, st, "tokenizer: Unicode normalization failed");
    else if (st == HR_ERR_RANGE)
        hr_error_set(err, st, "tokenizer: a text fragment of %zu bytes is too long", len);
    return st;
}

static hr_status encode_ivec(const hr_tokenizer *t, const char *text, size_t len, const hr_tokenize_opts *o,
                             hr_ivec *out, hr_error *err) {
    size_t clean_len;
    char *clean = hr_utf8_sanitize(text, len, &clean_len);
    if (!clean) return hr_error_set(err, HR_ERR_NOMEM, "tokenizer: out of memory (%zu bytes of text)", len);
    return encode_clean(t, clean, clean_len, NULL, len, o, out, err);
}

hr_status hr_tokenizer_encode_segments(const hr_tokenizer *t, const hr_tok_segment *segs, size_t n_segs,
                                       const hr_tokenize_opts *opts, int32_t **out, size_t *n_out, hr_error *err) {
    if (!t || (!segs && n_segs > 0) || !opts || !out || !n_out)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "hr_tokenizer_encode_segments: NULL argument");
    /* each segment is sanitized alone (replacement changes lengths), then the texts are joined with a
     * byte mask saying where control tokens may match */
    size_t total = 0, len = 0;
    char **clean = calloc(n_segs ? n_segs : 1, sizeof *clean);
    size_t *clen = calloc(n_segs ? n_segs : 1, sizeof *clen);
    hr_status st = clean && clen ? HR_OK : HR_ERR_NOMEM;
    for (size_t i = 0; i < n_segs && st == HR_OK; i++) {
        if (!segs[i].text && segs[i].len > 0) {
            st = HR_ERR_INVALID_ARG;
            break;
        }
        clean[i] = hr_utf8_sanitize(segs[i].text ? segs[i].text : "", segs[i].len, &clen[i]);
        if (!clean[i]) st = HR_ERR_NOMEM;
        total += clen[i];
        len += segs[i].len;
    }
    char *text = st == HR_OK ? malloc(total + 1) : NULL;
    uint8_t *allow = st == HR_OK ? malloc(total + 1) : NULL;
    if (st == HR_OK && (!text || !allow)) st = HR_ERR_NOMEM;
    size_t at = 0;
    for (size_t i = 0; i < n_segs && st == HR_OK; i++) {
        memcpy(text + at, clean[i], clen[i]);
        memset(allow + at, segs[i].special || opts->parse_special ? 1 : 0, clen[i]);
        at += clen[i];
    }
    for (size_t i = 0; clean && i < n_segs; i++) free(clean[i]);
    free(clean);
    free(clen);
    if (st != HR_OK) {
        free(text);
        free(allow);
        return st == HR_ERR_INVALID_ARG ? hr_error_set(err, st, "hr_tokenizer_encode_segments: a segment has NULL text")
                                        : hr_error_set(err, st, "tokenizer: out of memory (%zu bytes of text)", len);
    }
    text[total] = '\0';
    hr_ivec iv = {0};
    st = encode_clean(t, text, total, allow, len, opts, &iv, err);
    if (st == HR_OK && !iv.v && !(iv.v = malloc(sizeof(int32_t)))) /* a valid pointer even for zero tokens */
        st = hr_error_set(err, HR_ERR_NOMEM, "tokenizer: out of memory");
    if (st != HR_OK) {
        hr_ivec_free(&iv);
        return st;
    }
    *out = iv.v;
    *n_out = iv.n;
    return HR_OK;
}

hr_status hr_tokenizer_encode(const hr_tokenizer *t, const char *text, size_t len, const hr_tokenize_opts *opts,
                              int32_t *out, size_t cap, size_t *n_out, hr_error *err) {
    if (!t || (!text && len > 0) || !n_out || (!out && cap > 0))
        return hr_error_set(err, HR_ERR_INVALID_ARG, "hr_tokenizer_encode: NULL argument");
    hr_tokenize_opts dflt = {.add_bos = t->add_bos, .add_eos = t->add_eos, .parse_special = false};
    hr_ivec iv = {0};
    hr_status st = encode_ivec(t, text ? text : "", len, opts ? opts : &dflt, &iv, err);
    if (st == HR_OK) {
        if (iv.n > 0 && cap > 0) memcpy(out, iv.v, (iv.n < cap ? iv.n : cap) * sizeof(int32_t));
        *n_out = iv.n;
    }
    hr_ivec_free(&iv);
    return st;
}

hr_status hr_tokenizer_encode_alloc(const hr_tokenizer *t, const char *text, size_t len, const hr_tokenize_opts *opts,
                                    int32_t **out, size_t *n_out, hr_error *err) {
    if (!t || (!text && len > 0) || !out || !n_out)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "hr_tokenizer_encode_alloc: NULL argument");
    hr_tokenize_opts dflt = {.add_bos = t->add_bos, .add_eos = t->add_eos, .parse_special = false};
    hr_ivec iv = {0};
    hr_status st = encode_ivec(t, text ? text : "", len, opts ? opts : &dflt, &iv, err);
    if (st != HR_OK) {
        hr_ivec_free(&iv);
        return st;
    }
    if (!iv.v) iv.v = malloc(sizeof(int32_t)); /* a valid pointer even for zero tokens */
    if (!iv.v) return hr_error_set(err, HR_ERR_NOMEM, "tokenizer: out of memory");
    *out = iv.v;
    *n_out = iv.n;
    return HR_OK;
}

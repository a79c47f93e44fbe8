/* decode.c: token ids back to text. At load, every token's decoded bytes are precomputed (so decoding
 * is a table lookup); the streaming decoder then only has to hold back an incomplete UTF-8 sequence
 * until its last byte arrives and turn bytes that can never form a character into U+FFFD, so that
 * whatever it hands out is complete, valid UTF-8. */
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "tokenizer/tok_internal.h"

static const char k_fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

/* Writes the decoded bytes of token i into out (room for 3 * len bytes) and returns their count. */
static size_t decode_token(const hr_tokenizer *t, int32_t i, char *out) {
    const char *s = t->blob + t->off[i];
    size_t n = t->len[i], o = 0;
    uint8_t ty = t->types[i];
    if (ty == HR_TOKTYPE_CONTROL || ty == HR_TOKTYPE_UNKNOWN || ty == HR_TOKTYPE_UNUSED) return 0;
    if (ty == HR_TOKTYPE_USER_DEFINED) {
        memcpy(out, s, n);
        return n;
    }
    if (t->kind == HR_VOCAB_SPM) {
        if (ty == HR_TOKTYPE_BYTE && n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>') {
            out[0] = (char)strtoul((char[3]){s[3], s[4], 0}, NULL, 16);
            return 1;
        }
        for (size_t j = 0; j < n;) {
            if (j + 3 <= n && memcmp(s + j, "\xE2\x96\x81", 3) == 0) {
                out[o++] = ' ';
                j += 3;
            } else {
                out[o++] = s[j++];
            }
        }
        return o;
    }
    /* byte-level BPE: each character of the piece stands for one byte */
    for (size_t j = 0; j < n;) {
        int cl = hr_utf8_len((const uint8_t *)s + j, n - j);
        if (cl == 0) { /* malformed piece text: keep the byte */
            out[o++] = s[j++];
            continue;
        }
        int len;
        int b = hr_bpe_cp_to_byte(hr_utf8_decode(s + j, &len));
        if (b >= 0) {
            out[o++] = (char)b;
        } else {
            memcpy(out + o, s + j, (size_t)cl);
            o += (size_t)cl;
        }
        j += (size_t)cl;
    }
    return o;
}

/* The most bytes the streaming decoder can write for s[0..n): valid characters as they are, every other
 * byte possibly widened to the 3-byte U+FFFD. */
static size_t worst_output(const char *s, size_t n) {
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        int len = hr_utf8_len((const uint8_t *)s + i, n - i);
        w += len ? (size_t)len : 3;
        i += len ? (size_t)len : 1;
    }
    return w;
}

hr_status hr_decode_setup(hr_tokenizer *t) {
    size_t total = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) total += t->len[i];
    t->dec_blob = malloc(total + 1);
    t->dec_off = malloc((size_t)t->n_vocab * sizeof(uint32_t));
    t->dec_len = malloc((size_t)t->n_vocab * sizeof(uint32_t));
    if (!t->dec_blob || !t->dec_off || !t->dec_len) return HR_ERR_NOMEM;
    size_t at = 0, worst = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        t->dec_off[i] = (uint32_t)at;
        /* decoded bytes never outnumber the text's bytes */
        size_t n = decode_token(t, i, t->dec_blob + at);
        t->dec_len[i] = (uint32_t)n;
        size_t w = worst_output(t->dec_blob + at, n), w_text = worst_output(t->blob + t->off[i], t->len[i]);
        worst = HR_MAX(worst, HR_MAX(w, w_text)); /* w_text: control tokens shown with show_special */
        at += n;
    }
    /* + up to 3 held-back bytes, each possibly a U+FFFD, + the NUL */
    t->max_detok = worst + 9 + 1;
    return HR_OK;
}

const char *hr_tokenizer_token_bytes(const hr_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) {
        *len = 0;
        return NULL;
    }
    *len = t->dec_len[id];
    return t->dec_blob + t->dec_off[id];
}

void hr_detok_init(hr_detok *d) {
    memset(d, 0, sizeof(*d));
    d->at_start = true;
}

size_t hr_detok_max_bytes(const hr_tokenizer *t) { return t->max_detok; }

typedef struct sink {
    char *out;
    size_t cap, n;
} sink;

static void put(sink *k, const char *s, size_t n) {
    if (k->cap == 0 || k->n + n > k->cap - 1) return; /* cut at a character boundary */
    memcpy(k->out + k->n, s, n);
    k->n += n;
}

/* Emits complete characters of buf[0..n), keeps an incomplete tail in d->pending. */
static void drain(hr_detok *d, const uint8_t *buf, size_t n, sink *k) {
    size_t i = 0;
    while (i < n) {
        if (buf[i] < 0x80) {
            put(k, (const char *)buf + i, 1);
            i++;
            continue;
        }
        uint8_t c = buf[i];
        size_t want = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
        if (n - i < want && hr_utf8_prefix_ok(buf + i, n - i)) {
            d->n_pending = (int)(n - i);
            memcpy(d->pending, buf + i, n - i);
            return;
        }
        int len = hr_utf8_len(buf + i, n - i);
        if (len > 0) {
            put(k, (const char *)buf + i, (size_t)len);
            i += (size_t)len;
        } else {
            put(k, k_fffd, 3);
            i++;
        }
    }
    d->n_pending = 0;
}

size_t hr_detok_push(const hr_tokenizer *t, hr_detok *d, int32_t id, char *out, size_t cap) {
    sink k = {out, cap, 0};
    if (cap > 0) out[0] = '\0';
    if (id < 0 || id >= t->n_vocab) return 0;
    const char *s = t->dec_blob + t->dec_off[id];
    size_t n = t->dec_len[id];
    uint8_t ty = t->types[id];
    if (d->show_special && (ty == HR_TOKTYPE_CONTROL || ty == HR_TOKTYPE_UNKNOWN)) {
        s = t->blob + t->off[id];
        n = t->len[id];
    }
    if (n == 0) return 0;
    if (d->at_start) {
        if (t->kind == HR_VOCAB_SPM && t->add_space_prefix && s[0] == ' ') s++, n--;
        d->at_start = false;
    }
    /* pending (<= 3 bytes) + the piece, drained in bounded chunks so no large buffer is needed */
    uint8_t buf[64];
    size_t m = (size_t)d->n_pending;
    memcpy(buf, d->pending, m);
    d->n_pending = 0;
    while (n > 0) {
        size_t take = sizeof(buf) - m < n ? sizeof(buf) - m : n;
        memcpy(buf + m, s, take);
        s += take, n -= take;
        drain(d, buf, m + take, &k);
        m = (size_t)d->n_pending;
        memcpy(buf, d->pending, m);
    }
    if (cap > 0) out[k.n] = '\0';
    return k.n;
}

size_t hr_detok_flush(const hr_tokenizer *t, hr_detok *d, char *out, size_t cap) {
    (void)t;
    sink k = {out, cap, 0};
    for (int i = 0; i < d->n_pending; i++) put(&k, k_fffd, 3);
    d->n_pending = 0;
    if (cap > 0) out[k.n] = '\0';
    return k.n;
}

hr_status hr_tokenizer_decode(const hr_tokenizer *t, const int32_t *ids, size_t n, bool show_special, char **out,
                              size_t *out_len, hr_error *err) {
    size_t step = t->max_detok, cap = step * 2 + 64, len = 0;
    char *s = malloc(cap);
    if (!s) return hr_error_set(err, HR_ERR_NOMEM, "tokenizer: out of memory");
    hr_detok d;
    hr_detok_init(&d);
    d.show_special = show_special;
    for (size_t i = 0; i <= n; i++) {
        if (cap - len < step) {
            cap = cap * 2 + step;
            char *ns = realloc(s, cap);
            if (!ns) {
                free(s);
                return hr_error_set(err, HR_ERR_NOMEM, "tokenizer: out of memory");
            }
            s = ns;
        }
        len += i < n ? hr_detok_push(t, &d, ids[i], s + len, cap - len) : hr_detok_flush(t, &d, s + len, cap - len);
    }
    *out = s;
    if (out_len) *out_len = len;
    return HR_OK;
}

/* utf8.c: UTF-8 validation, encoding and decoding, and the invalid-input rule (each byte that does
 * not start a well-formed sequence becomes U+FFFD). See utf8.h. */
#include "common/utf8.h"

#include <stdlib.h>
#include <string.h>

int hr_utf8_len(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    int len;
    uint32_t min;
    if ((c & 0xE0) == 0xC0) {
        len = 2, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        len = 3, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        len = 4, min = 0x10000;
    } else {
        return 0;
    }
    if ((size_t)len > n) return 0;
    uint32_t cp = c & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0; /* overlong, range, surrogate */
    return len;
}

bool hr_utf8_valid(const char *text, size_t len, size_t *bad_at) {
    const uint8_t *s = (const uint8_t *)text;
    size_t i = 0;
    while (i < len) {
        int n = s[i] < 0x80 ? 1 : hr_utf8_len(s + i, len - i);
        if (n == 0) break;
        i += (size_t)n;
    }
    if (bad_at) *bad_at = i;
    return i == len;
}

bool hr_utf8_prefix_ok(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    if (c < 0xC2 || c > 0xF4) return false; /* ASCII, a continuation byte, an overlong or out-of-range lead */
    if (n >= 2) {                           /* the second byte's range depends on the lead (RFC 3629) */
        uint8_t lo = 0x80, hi = 0xBF;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
        if (s[1] < lo || s[1] > hi) return false;
    }
    for (size_t i = 2; i < n; i++)
        if ((s[i] & 0xC0) != 0x80) return false;
    return true;
}

size_t hr_utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decodes one code point from valid UTF-8 (the caller has validated it). */
uint32_t hr_utf8_decode(const char *s, int *len) {
    const uint8_t *u = (const uint8_t *)s;
    if (u[0] < 0x80) {
        *len = 1;
        return u[0];
    }
    int n = (u[0] & 0xE0) == 0xC0 ? 2 : (u[0] & 0xF0) == 0xE0 ? 3 : 4;
    uint32_t cp = u[0] & (0x7F >> n);
    for (int i = 1; i < n; i++) cp = (cp << 6) | (u[i] & 0x3F);
    *len = n;
    return cp;
}

char *hr_utf8_sanitize(const char *text, size_t len, size_t *out_len) {
    /* Worst case every byte becomes the 3-byte U+FFFD. */
    if (len > (SIZE_MAX - 1) / 3) return NULL;
    char *out = malloc(len * 3 + 1);
    if (!out) return NULL;
    const uint8_t *s = (const uint8_t *)text;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        if (s[i] < 0x80) {
            out[o++] = (char)s[i++];
            continue;
        }
        int n = hr_utf8_len(s + i, len - i);
        if (n == 0) {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += 1;
        } else {
            memcpy(out + o, s + i, (size_t)n);
            o += (size_t)n;
            i += (size_t)n;
        }
    }
    out[o] = '\0';
    *out_len = o;
    return out;
}

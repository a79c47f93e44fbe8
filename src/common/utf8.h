/* utf8.h: the one UTF-8 validator, encoder and decoder of the tree (RFC 3629: no overlong forms, no
 * surrogates, nothing past U+10FFFF). The tokenizer, the streaming decoder, the server's body and
 * token checks, the grammar compiler and the template engine all call these. */
#ifndef HR_COMMON_UTF8_H
#define HR_COMMON_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Length (1..4) of the well-formed sequence at s[0..n), 0 when it is malformed or cut short. */
int hr_utf8_len(const uint8_t *s, size_t n);

/* True when text[0..len) is all well-formed; else false with *bad_at (if not NULL) the offset of the
 * first byte that does not start a well-formed sequence (a sequence cut by the end counts as bad). */
bool hr_utf8_valid(const char *text, size_t len, size_t *bad_at);

/* True when s[0..n), shorter than the sequence its first byte announces, can still become a
 * well-formed sequence with more bytes (a streaming decoder holds such a tail back). */
bool hr_utf8_prefix_ok(const uint8_t *s, size_t n);

/* Writes code point cp (at most U+10FFFF) as 1..4 bytes into out; returns the count. */
size_t hr_utf8_encode(uint32_t cp, char *out);

/* The code point at s, which the caller has validated (hr_utf8_len > 0); *len its byte count. */
uint32_t hr_utf8_decode(const char *s, int *len);

/* A malloc'd copy of text[0..len) where each byte that does not start a well-formed sequence
 * becomes U+FFFD (NUL-terminated, *out_len its length); NULL when out of memory. */
char *hr_utf8_sanitize(const char *text, size_t len, size_t *out_len);

#endif

/* gguf_internal.h: helpers shared by the reader and the writer; not part of the module's interface. */
#ifndef HR_GGUF_INTERNAL_H
#define HR_GGUF_INTERNAL_H

#include <stdint.h>

/* Returns the byte offset of the first invalid sequence, or len when all of p is valid UTF-8 (no
 * overlong forms, no surrogates, nothing above U+10FFFF). */
static inline uint64_t hr_gguf_utf8_invalid_at(const uint8_t *p, uint64_t len) {
    uint64_t i = 0;
    while (i < len) {
        uint8_t b = p[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        uint32_t cp, min;
        unsigned extra;
        if ((b & 0xe0) == 0xc0) {
            cp = b & 0x1f, extra = 1, min = 0x80;
        } else if ((b & 0xf0) == 0xe0) {
            cp = b & 0x0f, extra = 2, min = 0x800;
        } else if ((b & 0xf8) == 0xf0) {
            cp = b & 0x07, extra = 3, min = 0x10000;
        } else {
            return i;
        }
        if (len - i <= extra) return i;
        for (unsigned k = 1; k <= extra; k++) {
            if ((p[i + k] & 0xc0) != 0x80) return i;
            cp = (cp << 6) | (p[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
        i += extra + 1;
    }
    return len;
}

#endif

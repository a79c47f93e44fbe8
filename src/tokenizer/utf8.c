/* utf8.c: GPT-2's reversible byte <-> code point mapping (UTF-8 itself is common/utf8.c). */
#include <stdint.h>

#include "tokenizer/tok_internal.h"

/* GPT-2 maps the printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') to themselves and the other 68 bytes,
 * in increasing order, to U+0100, U+0101, ... so that every byte is a visible character. */
static bool bpe_byte_is_direct(int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; }

uint32_t hr_bpe_byte_to_cp(uint8_t b) {
    if (bpe_byte_is_direct(b)) return b;
    uint32_t k = 0;
    for (int i = 0; i < b; i++)
        if (!bpe_byte_is_direct(i)) k++;
    return 0x100 + k;
}

int hr_bpe_cp_to_byte(uint32_t cp) {
    if (cp < 0x100) return bpe_byte_is_direct((int)cp) ? (int)cp : -1;
    if (cp >= 0x100 + 68) return -1;
    uint32_t k = cp - 0x100;
    for (int i = 0; i < 256; i++) {
        if (!bpe_byte_is_direct(i)) {
            if (k == 0) return i;
            k--;
        }
    }
    return -1;
}

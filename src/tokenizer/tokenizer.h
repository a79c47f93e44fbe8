/* tokenizer.h: vocabularies from GGUF metadata (SentencePiece-style `llama`, byte-level BPE `gpt2`),
 * special tokens, encoding, streaming-safe decoding.
 *
 * A tokenizer is immutable after load and may be used from several threads at once; per-stream
 * decoding state lives in hr_detok, owned by the caller. */
#ifndef HR_TOKENIZER_TOKENIZER_H
#define HR_TOKENIZER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "gguf/gguf.h"

typedef struct hr_tokenizer hr_tokenizer;

/* Reads tokenizer.ggml.* from g (which may be closed afterwards: everything is copied). Errors name
 * the missing or malformed key, or the unsupported tokenizer.ggml.model / .pre value. */
hr_status hr_tokenizer_load(const hr_gguf *g, hr_tokenizer **out, hr_error *err);
void hr_tokenizer_destroy(hr_tokenizer *t); /* NULL allowed */

int32_t hr_tokenizer_n_vocab(const hr_tokenizer *t);
int32_t hr_tokenizer_bos(const hr_tokenizer *t); /* -1 when the vocabulary has none */
int32_t hr_tokenizer_eos(const hr_tokenizer *t);
bool hr_tokenizer_add_bos_default(const hr_tokenizer *t); /* tokenizer.ggml.add_bos_token, else the model type's default */
/* True for tokens that end a generation (EOS, EOT, and other end-of-generation ids). */
bool hr_tokenizer_is_eog(const hr_tokenizer *t, int32_t id);

typedef struct hr_tokenize_opts {
    bool add_bos;       /* prepend BOS (if the vocabulary has one) */
    bool add_eos;
    bool parse_special; /* map special-token text such as "<|eot_id|>" to its id (off for user text) */
} hr_tokenize_opts;

/* Encodes text[0..len). Writes up to cap ids to out and the full count to *n_out; when *n_out > cap
 * nothing useful was written past cap and the caller retries with a larger buffer.
 * Invalid UTF-8 is handled by the documented rule (see the module docs). */
hr_status hr_tokenizer_encode(const hr_tokenizer *t, const char *text, size_t len, const hr_tokenize_opts *opts,
                              int32_t *out, size_t cap, size_t *n_out, hr_error *err);

/* The token's text as stored in the vocabulary (e.g. "▁Hello", "<0x0A>", "Ġworld"). */
const char *hr_tokenizer_piece(const hr_tokenizer *t, int32_t id);

/* Streaming decoder: feed ids one at a time, receive UTF-8 text that is always complete and valid
 * (a multi-byte character split across tokens is held back until complete; invalid bytes become
 * U+FFFD). */
typedef struct hr_detok {
    uint8_t pending[8];
    int n_pending;
    bool at_start; /* for SentencePiece's leading-space rule */
} hr_detok;

void hr_detok_init(hr_detok *d);
/* Appends the text for `id` to out (cap bytes, NUL-terminated when cap > 0) and returns the number of
 * bytes written (excluding NUL). At most 64 bytes per call are ever needed. */
size_t hr_detok_push(const hr_tokenizer *t, hr_detok *d, int32_t id, char *out, size_t cap);
/* Flushes held-back bytes at end of stream (as U+FFFD if incomplete). */
size_t hr_detok_flush(const hr_tokenizer *t, hr_detok *d, char *out, size_t cap);

#endif

/* tokenizer.h: vocabularies from GGUF metadata (SentencePiece-style `llama`, byte-level BPE `gpt2`),
 * special tokens, encoding, streaming-safe decoding. docs/TOKENIZER.md has the rules in full
 * (pre-tokenizers, special-token policy, invalid UTF-8, decoding) and the conformance figures.
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
 * the missing or malformed key (HR_ERR_NOT_FOUND / HR_ERR_FORMAT), or the unsupported
 * tokenizer.ggml.model / .pre value (HR_ERR_UNSUPPORTED: e.g. WordPiece `bert`). */
hr_status hr_tokenizer_load(const hr_gguf *g, hr_tokenizer **out, hr_error *err);
void hr_tokenizer_destroy(hr_tokenizer *t); /* NULL allowed */
/* Bytes the tokenizer's tables hold beside the GGUF (its strings and their index, the lookup map,
 * types and scores, merges, decoded bytes, the special-token trie), read from the sizes they were
 * allocated with; the compiled pre-tokenizer regexes (pcre2's own memory) are not counted. */
uint64_t hr_tokenizer_table_bytes(const hr_tokenizer *t);
/* An estimate before a vocabulary of n_vocab entries is loaded (the planner from a config.json): 64
 * bytes an entry (a synthetic 32,000-entry SPM vocabulary of TinyLlama's shape measures 59.6; a BPE
 * vocabulary's merges and many special tokens take more: the runtime counts the loaded one). */
uint64_t hr_tokenizer_table_bytes_for(int32_t n_vocab);

/* Hugging Face tokenizer.json: `path` is the file or a directory holding it (tokenizer_config.json beside it
 * supplies the special tokens and add_bos/add_eos). Writes the tokenizer.ggml.* keys llama.cpp's converter
 * would write (plus headroom.tokenizer.* for what those keys cannot say) into w; docs/TOKENIZER.md lists
 * the supported models, normalizers, pre-tokenizers and decoders. Anything else is HR_ERR_UNSUPPORTED with
 * one line naming the component (e.g. "tokenizer.json: model type Unigram is not supported"). */
hr_status hr_tokenizer_json_to_gguf(const char *path, hr_gguf_writer *w, hr_error *err);
/* Loads a tokenizer.json (file or directory) directly: the conversion above, loaded from memory. */
hr_status hr_tokenizer_load_json(const char *path, hr_tokenizer **out, hr_error *err);
/* The same from tokenizer.json text in memory, without a tokenizer_config.json (used by the fuzzer). */
hr_status hr_tokenizer_load_json_text(const char *json, size_t len, hr_tokenizer **out, hr_error *err);
/* A GGUF file, a tokenizer.json, or a directory holding one (a checkpoint directory needs no GGUF). */
hr_status hr_tokenizer_load_path(const char *path, hr_tokenizer **out, hr_error *err);

int32_t hr_tokenizer_n_vocab(const hr_tokenizer *t);
int32_t hr_tokenizer_bos(const hr_tokenizer *t); /* -1 when the vocabulary has none */
int32_t hr_tokenizer_eos(const hr_tokenizer *t);
/* tokenizer.ggml.add_bos_token, else the vocabulary type's default (SPM and llama-3-style BPE: true);
 * false when the vocabulary has no BOS. */
bool hr_tokenizer_add_bos_default(const hr_tokenizer *t);
/* True for tokens that end a generation (EOS, EOT, and other end-of-generation ids). */
bool hr_tokenizer_is_eog(const hr_tokenizer *t, int32_t id);

typedef struct hr_tokenize_opts {
    bool add_bos; /* prepend BOS (if the vocabulary has one) */
    bool add_eos;
    bool parse_special; /* map special-token text such as "<|eot_id|>" to its id (off for user text) */
} hr_tokenize_opts;

/* Encodes text[0..len). Writes up to cap ids to out and the full count to *n_out; when *n_out > cap
 * only the first cap ids were written and the caller retries with a larger buffer. opts NULL means
 * {add_bos = add_bos_default, add_eos = tokenizer.ggml.add_eos_token, parse_special = false}.
 * Invalid UTF-8: each byte that does not start a well-formed UTF-8 sequence (stray continuation bytes,
 * truncated sequences, overlongs, surrogates, > U+10FFFF) is replaced by U+FFFD before tokenizing.
 * Cost is O(n log n) in the text length; the call allocates its own scratch (thread-safe). */
hr_status hr_tokenizer_encode(const hr_tokenizer *t, const char *text, size_t len, const hr_tokenize_opts *opts,
                              int32_t *out, size_t cap, size_t *n_out, hr_error *err);
/* The same, returning a malloc'd array (free it) of *n_out ids. */
hr_status hr_tokenizer_encode_alloc(const hr_tokenizer *t, const char *text, size_t len, const hr_tokenize_opts *opts,
                                    int32_t **out, size_t *n_out, hr_error *err);

/* The length of the longest control or unknown token text ("<|im_end|>", "</s>") that text[0..len)
 * starts with, 0 when none does: what special-token parsing would turn into a control id there. */
size_t hr_tokenizer_control_match(const hr_tokenizer *t, const char *text, size_t len);

/* One piece of a text assembled from parts of different trust: a chat template's markers (special:
 * true, control-token texts such as "<|im_end|>" become their ids) and a client's message content
 * (special: false, such texts stay plain text). */
typedef struct hr_tok_segment {
    const char *text;
    size_t len;
    bool special;
} hr_tok_segment;

/* Encodes the concatenation of segs[0..n_segs) as one text (the same ids hr_tokenizer_encode_alloc gives
 * for it, merges across segment boundaries included), except that control and unknown token texts
 * match only where they lie wholly inside segments with special set (or everywhere when
 * opts->parse_special is set); user-defined tokens match everywhere as always. Each segment's invalid
 * UTF-8 is replaced on its own. *out is malloc'd (free it). */
hr_status hr_tokenizer_encode_segments(const hr_tokenizer *t, const hr_tok_segment *segs, size_t n_segs,
                                       const hr_tokenize_opts *opts, int32_t **out, size_t *n_out, hr_error *err);

/* The token's text as stored in the vocabulary (e.g. "▁Hello", "<0x0A>", "Ġworld"), NUL-terminated and
 * valid until destroy; NULL for ids out of range. */
const char *hr_tokenizer_piece(const hr_tokenizer *t, int32_t id);

/* The bytes token id decodes to in a continuation (what hr_detok_push appends, before UTF-8 is held
 * back or repaired): SentencePiece's U+2581 as ' ' and <0xNN> as the byte, byte-level BPE's byte map
 * undone, user-defined tokens verbatim, control/unknown/unused tokens none. Not NUL-terminated;
 * valid until destroy. NULL (and *len 0) for ids out of range. */
const char *hr_tokenizer_token_bytes(const hr_tokenizer *t, int32_t id, size_t *len);

/* Token type as stored in tokenizer.ggml.token_type: 1 normal, 2 unknown, 3 control, 4 user-defined,
 * 5 unused, 6 byte (0 for ids out of range). */
int hr_tokenizer_token_type(const hr_tokenizer *t, int32_t id);
/* Other special ids (-1 when absent): end of turn (tokenizer.ggml.eot_token_id, else detected by text),
 * unknown, padding. */
int32_t hr_tokenizer_eot(const hr_tokenizer *t);
int32_t hr_tokenizer_unk(const hr_tokenizer *t);
int32_t hr_tokenizer_pad(const hr_tokenizer *t);
/* Id of the token whose text is exactly text[0..len), or -1. */
int32_t hr_tokenizer_find(const hr_tokenizer *t, const char *text, size_t len);
/* "spm" or "bpe", and the pre-tokenizer in use (tokenizer.ggml.pre, "default" when absent; "none" for
 * SPM, which has no pre-tokenizer). */
const char *hr_tokenizer_kind_name(const hr_tokenizer *t);
const char *hr_tokenizer_pre_name(const hr_tokenizer *t);

/* Streaming decoder: feed ids one at a time, receive UTF-8 text that is always complete and valid
 * (a multi-byte character split across tokens is held back until complete; invalid bytes become
 * U+FFFD). */
typedef struct hr_detok {
    uint8_t pending[8];
    int n_pending;
    bool at_start;     /* for SentencePiece's leading-space rule (see below) */
    bool show_special; /* render control/unknown tokens as their text ("<s>", "<|eot_id|>"); default false */
} hr_detok;

/* Starts a stream: nothing pending, at_start = true, show_special = false.
 * Piece rules: normal tokens decode to their text (SPM: U+2581 -> ' '; BPE: GPT-2 byte map inverted);
 * byte tokens <0xNN> to the raw byte; user-defined tokens to their text verbatim; control and unknown
 * tokens (BOS, EOS, <|eot_id|>, <unk>) to nothing unless show_special; unused tokens to nothing.
 * Leading space: for SentencePiece vocabularies with the dummy prefix, the first token that produces
 * text while at_start is set loses one leading ' ' (control tokens such as BOS do not clear at_start).
 * To decode a continuation (tokens that follow a prompt), set d->at_start = false after init. */
void hr_detok_init(hr_detok *d);
/* The most bytes (NUL included) that one hr_detok_push or hr_detok_flush call can need for this
 * vocabulary: the longest piece, plus held-back bytes, each possibly widened to U+FFFD. */
size_t hr_detok_max_bytes(const hr_tokenizer *t);
/* Appends the text for `id` to out (cap bytes, NUL-terminated when cap > 0) and returns the number of
 * bytes written (excluding NUL). With cap >= hr_detok_max_bytes(t) nothing is ever cut; a smaller cap
 * cuts the text (at a character boundary) and the cut part is lost. Ids out of range produce nothing. */
size_t hr_detok_push(const hr_tokenizer *t, hr_detok *d, int32_t id, char *out, size_t cap);
/* Flushes held-back bytes at end of stream (each as U+FFFD: they never formed a character). */
size_t hr_detok_flush(const hr_tokenizer *t, hr_detok *d, char *out, size_t cap);

/* Decodes a whole id sequence (a fresh hr_detok, then flush) into a malloc'd NUL-terminated string. */
hr_status hr_tokenizer_decode(const hr_tokenizer *t, const int32_t *ids, size_t n, bool show_special, char **out,
                              size_t *out_len, hr_error *err);

#endif

/* tok_internal.h: the tokenizer's private state, shared by the files of this module only.
 *
 * Invariants (hold from the end of hr_tokenizer_load until destroy; nothing is mutated after load, which
 * is what makes one tokenizer usable from many threads at once):
 *   1. Entry i < n_vocab of the string table is vocabulary token i; entries n_vocab..n_strings-1 are
 *      "virtual" strings that occur in BPE merges but are not tokens (they can be merge inputs/outputs
 *      and are spelled out byte by byte at the end, as llama.cpp does).
 *   2. Every string is NUL-terminated in `blob`, so hr_tokenizer_piece can hand out a pointer.
 *   3. The text given to the SPM/BPE cores is valid UTF-8 (encode sanitizes it first), so the cores and
 *      PCRE2 (called with PCRE2_NO_UTF_CHECK) never see a malformed sequence. */
#ifndef HR_TOKENIZER_TOK_INTERNAL_H
#define HR_TOKENIZER_TOK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/utf8.h"
#include "tokenizer/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* Token types as stored in tokenizer.ggml.token_type (llama.cpp / GGUF numbering). */
enum {
    HR_TOKTYPE_UNDEFINED = 0,
    HR_TOKTYPE_NORMAL = 1,
    HR_TOKTYPE_UNKNOWN = 2,
    HR_TOKTYPE_CONTROL = 3,
    HR_TOKTYPE_USER_DEFINED = 4,
    HR_TOKTYPE_UNUSED = 5,
    HR_TOKTYPE_BYTE = 6,
};

/* Special-token attributes llama.cpp sets by model name (phi-3: specials eat the whitespace after them). */
enum { HR_STRIP_LEFT = 1, HR_STRIP_RIGHT = 2 };

enum { HR_NORM_NONE = 0, HR_NORM_NFC, HR_NORM_NFKC, HR_NORM_NFD, HR_NORM_NFKD };

typedef enum hr_vocab_kind { HR_VOCAB_SPM = 1, HR_VOCAB_BPE = 2 } hr_vocab_kind;

#define HR_PRETOK_MAX_REGEX 8
#define HR_SPM_GLUE_MAX     8

/* ---- a growable int32 vector (encode output and scratch) --------------------------------------- */
typedef struct hr_ivec {
    int32_t *v;
    size_t n, cap;
} hr_ivec;
bool hr_ivec_push(hr_ivec *iv, int32_t x);
void hr_ivec_free(hr_ivec *iv);

/* ---- string -> id hash (open addressing over the string table) --------------------------------- */
typedef struct hr_strmap {
    int32_t *slots; /* string index or -1 */
    uint32_t mask;
} hr_strmap;

/* ---- BPE merge map: (left id, right id) -> (rank, merged id) ------------------------------------ */
typedef struct hr_merge_slot {
    uint64_t key; /* (left << 32) | right, UINT64_MAX when empty */
    int32_t rank;
    int32_t merged;
} hr_merge_slot;

/* ---- special-token trie (byte edges in a hash) ------------------------------------------------- */
typedef struct hr_trie_edge {
    uint64_t key; /* (node << 8) | byte, UINT64_MAX when empty */
    int32_t child;
} hr_trie_edge;

struct hr_tokenizer {
    hr_vocab_kind kind;
    int32_t n_vocab;

    /* string table: entry i is blob[off[i] .. off[i]+len[i]) */
    int32_t n_strings, str_cap;
    size_t blob_len, blob_cap;
    char *blob;
    uint32_t *off;
    uint32_t *len;
    hr_strmap map;

    float *scores;  /* n_vocab (SPM), NULL for BPE vocabularies without scores */
    uint8_t *types; /* n_vocab, HR_TOKTYPE_* */
    uint8_t *is_eog;

    /* decoded bytes of each token (▁ -> ' ' for SPM, inverse byte map for BPE, raw byte for <0xNN>) */
    char *dec_blob;
    uint32_t *dec_off;
    uint32_t *dec_len;
    size_t max_detok; /* the most bytes one hr_detok_push can write, NUL included */

    int32_t bos, eos, eot, eom, unk, pad;
    bool add_bos, add_eos, add_space_prefix, ignore_merges;
    /* SPM: no token contains U+2581 right after another character, so no merge can cross the point
     * before a U+2581 that follows a non-U+2581 character: the text can be encoded word by word with
     * exactly the same result, and far better cache locality than one heap over the whole text. */
    bool spm_split_words;
    /* ... except before a U+2581 that follows one of these characters: some string has that character
     * right before a U+2581 (Gemma-3 has one such token, ">▁</"). At most HR_SPM_GLUE_MAX of them. */
    int n_spm_glue;
    uint32_t spm_glue[8];
    /* SPM vocabularies that carry tokenizer.ggml.merges (made from a tokenizer.json byte-fallback BPE): the
     * merges are applied by rank over characters, as Hugging Face's BPE does, instead of by score. */
    bool spm_merges;
    /* From tokenizer.json's Metaspace pre-tokenizer (headroom.tokenizer.*): split before every U+2581;
     * the prefix space only for the first fragment (prepend_scheme "first") and only when the fragment
     * does not start with a space already (Metaspace never doubles it, Prepend does). */
    bool split_metaspace, prefix_first, metaspace_prefix;
    /* Unicode normalization of raw-text fragments before tokenizing (tokenizer.json's NFC/NFKC/NFD/NFKD). */
    int normalizer;

    /* SPM: id of <0xNN> for each byte (-1 when absent). BPE: id (or virtual id) of the byte's mapped char. */
    int32_t byte_tok[256];

    /* BPE */
    hr_merge_slot *merges;
    uint32_t merge_mask;
    char pre_name[64];
    int n_regex;
    pcre2_code *regex[HR_PRETOK_MAX_REGEX];

    /* special tokens (control, user-defined, unknown) for the partition pass */
    int32_t n_special;
    int32_t *special_ids;  /* sorted by text length descending, then id */
    int32_t *special_rank; /* n_vocab: position in special_ids, or -1 */
    hr_trie_edge *trie;
    uint32_t trie_mask;
    int32_t *trie_term; /* node -> token id ending here, or -1 */
    int32_t trie_nodes;
    uint8_t *strip;          /* NULL, or per token HR_STRIP_*: whitespace a matched special token eats */
    bool special_first[256]; /* bytes that begin some special token */
    bool user_first[256];    /* bytes that begin some user-defined token (parsed even without parse_special) */
};

/* vocab.c */
uint32_t hr_tok_hash_bytes(const char *s, size_t n);
int32_t hr_tok_lookup(const hr_tokenizer *t, const char *s, size_t n); /* string index or -1 */
/* Appends a string to the table (the map then resolves its text to this new index). -1 on NOMEM. */
int32_t hr_tok_intern(hr_tokenizer *t, const char *s, size_t n);

/* utf8.c (UTF-8 itself: common/utf8.h) */
/* GPT-2's byte -> code point table and its inverse (-1 for code points that are no byte). */
uint32_t hr_bpe_byte_to_cp(uint8_t b);
int hr_bpe_cp_to_byte(uint32_t cp);

/* spm.c: appends the ids of one raw-text fragment (already escaped: ' ' -> U+2581) to out. */
hr_status hr_spm_encode_fragment(const hr_tokenizer *t, const char *text, size_t len, hr_ivec *out);

/* bpe.c */
hr_status hr_bpe_build_merges(hr_tokenizer *t, const hr_gguf_array *merges, hr_error *err);
typedef struct hr_bpe_scratch hr_bpe_scratch;
hr_status hr_bpe_encode_word(const hr_tokenizer *t, const uint8_t *word, size_t len, hr_ivec *out,
                             hr_bpe_scratch *scratch);
/* SPM vocabularies with merges: one fragment (already U+2581-escaped) as characters, merged by rank; symbols
 * that end up not being tokens are spelled as <0xNN> byte tokens (UNK when absent). */
hr_status hr_bpe_encode_chars(const hr_tokenizer *t, const char *text, size_t len, hr_ivec *out,
                              hr_bpe_scratch *scratch);
hr_bpe_scratch *hr_bpe_scratch_create(void);
void hr_bpe_scratch_destroy(hr_bpe_scratch *s);

/* pretok.c */
hr_status hr_pretok_setup(hr_tokenizer *t, const char *pre, hr_error *err);
/* The same from explicit regexes (headroom.tokenizer.pre_regex: a tokenizer.json's Split patterns). */
hr_status hr_pretok_setup_regex(hr_tokenizer *t, const hr_gguf_array *regex, hr_error *err);
void hr_pretok_free(hr_tokenizer *t);
/* Per-call matching state (match data per regex, match context, JIT stack, piece lists). */
typedef struct hr_pretok_scratch hr_pretok_scratch;
hr_pretok_scratch *hr_pretok_scratch_create(const hr_tokenizer *t); /* NULL when out of memory */
void hr_pretok_scratch_destroy(hr_pretok_scratch *s);               /* NULL allowed */
/* Splits text[0..len) with the tokenizer's regex sequence and calls fn for each piece in order. */
typedef hr_status (*hr_piece_fn)(void *ctx, const char *piece, size_t len);
hr_status hr_pretok_split(const hr_tokenizer *t, hr_pretok_scratch *s, const char *text, size_t len, hr_piece_fn fn,
                          void *ctx, hr_error *err);

/* special.c */
hr_status hr_special_setup(hr_tokenizer *t, const char *model_name);
void hr_special_free(hr_tokenizer *t);
/* A fragment of the input: either raw text [start, start+len) or a special token id. */
typedef struct hr_fragment {
    size_t start, len;
    int32_t id; /* -1 for raw text */
} hr_fragment;
/* allow (NULL: everywhere) limits where control and unknown token texts may match when parse_special is
 * set: only occurrences whose every byte has allow[i] != 0 (user-defined tokens match everywhere). */
hr_status hr_special_partition(const hr_tokenizer *t, const char *text, size_t len, bool parse_special,
                               const uint8_t *allow, hr_fragment **out, size_t *n_out);

/* decode.c */
hr_status hr_decode_setup(hr_tokenizer *t);

#endif

/* constrain.h: constrained decoding. A request's output is held to a grammar: every sampling step
 * masks the tokens whose bytes cannot continue a valid output, so what comes out always parses.
 *
 * Everything compiles to one grammar IR (docs/CONSTRAIN.md has the syntax): a context-free grammar
 * over bytes, rules of alternatives of sequences of byte classes and rule references. The sources:
 *   HR_CONS_GRAMMAR      GBNF text (llama.cpp's dialect, plus /regex/ atoms)
 *   HR_CONS_REGEX        a regular expression (the whole output must match it)
 *   HR_CONS_JSON_SCHEMA  a JSON Schema (JSON text) of the subset listed in docs/CONSTRAIN.md; any
 *                        other keyword is refused with its name
 *   HR_CONS_JSON         any JSON object (the source is ignored)
 *   HR_CONS_CHOICE       a JSON array of strings: the output is exactly one of them
 *
 * Running it: a recognizer whose state is a set of stacks of grammar positions (each stack one way
 * the bytes so far parse; the top is the byte class to match next; an empty stack: the output is
 * complete). The vocabulary's byte strings (hr_cons_vocab) are walked in sorted order so a shared
 * prefix is advanced once. Per grammar position the tokens that are accepted or rejected whatever
 * lies below on the stack are computed once and kept (hr_cons_store); only the few tokens that run
 * past the position's rule are walked at each step, and whole masks are kept per recognizer state.
 *
 * Threads: a compiled hr_grammar is immutable and reference counted (any thread); a grammar cache is
 * locked inside; an hr_cons_store and its matchers belong to one thread (the engine's). */
#ifndef HR_CONSTRAIN_CONSTRAIN_H
#define HR_CONSTRAIN_CONSTRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "tokenizer/tokenizer.h"

typedef enum hr_cons_kind {
    HR_CONS_NONE = 0,
    HR_CONS_JSON = 1,
    HR_CONS_JSON_SCHEMA = 2,
    HR_CONS_REGEX = 3,
    HR_CONS_GRAMMAR = 4,
    HR_CONS_CHOICE = 5,
} hr_cons_kind;

const char *hr_cons_kind_name(hr_cons_kind k); /* "json", "json_schema", "regex", "grammar", "choice" */

/* Compile bounds: a grammar past one of them is refused (HR_ERR_RANGE, the message names the bound),
 * never compiled for long. */
#define HR_CONS_MAX_ELEMENTS  200000 /* grammar elements after repetitions are expanded */
#define HR_CONS_MAX_RULES     50000
#define HR_CONS_MAX_SOURCE    (1u << 20) /* bytes of source text */
#define HR_CONS_MAX_COMPILE_S 1.0        /* seconds of compile time */
#define HR_CONS_MAX_REPEAT    10000      /* n in x{m,n} */

typedef struct hr_grammar hr_grammar;

/* Compiles src[0..len) of the given kind. HR_ERR_INVALID_ARG with the reason (line and column for
 * text, the keyword and its path for a schema: "unsupported JSON Schema keyword 'not' at #/properties/a"),
 * HR_ERR_RANGE past a bound. */
hr_status hr_grammar_compile(hr_cons_kind kind, const char *src, size_t len, hr_grammar **out, hr_error *err);
hr_grammar *hr_grammar_retain(hr_grammar *g);
void hr_grammar_release(hr_grammar *g); /* NULL allowed */
/* The GBNF text the grammar was compiled from (a schema, regex or choice list translated). */
const char *hr_grammar_text(const hr_grammar *g);
int hr_grammar_n_rules(const hr_grammar *g);
int hr_grammar_n_elements(const hr_grammar *g);

/* The translations, for tests and docs: malloc'd GBNF text (free it) on success. */
hr_status hr_cons_schema_to_gbnf(const char *json, size_t len, char **out, hr_error *err);

/* ---- a cache of compiled grammars, keyed by (kind, source bytes) ------------------------------- */

typedef struct hr_grammar_cache hr_grammar_cache;
hr_status hr_grammar_cache_create(int capacity, hr_grammar_cache **out, hr_error *err);
void hr_grammar_cache_destroy(hr_grammar_cache *c); /* NULL allowed; grammars handed out stay valid */
/* The cached grammar for this source or a new compile (inserted, the least recently used dropped).
 * *out holds a reference: release it. Any thread. */
hr_status hr_grammar_cache_get(hr_grammar_cache *c, hr_cons_kind kind, const char *src, size_t len, hr_grammar **out,
                               hr_error *err);
void hr_grammar_cache_stats(hr_grammar_cache *c, uint64_t *hits, uint64_t *misses);

/* ---- the vocabulary as bytes --------------------------------------------------------------------- */

typedef struct hr_cons_vocab hr_cons_vocab;

/* Each token's bytes as the detokenizer writes them (byte-level BPE's byte map and SentencePiece's
 * U+2581 / <0xNN> undone); end-of-generation tokens apart; control, unknown and unused tokens (no
 * bytes) are never allowed. */
hr_status hr_cons_vocab_from_tokenizer(const hr_tokenizer *tok, hr_cons_vocab **out, hr_error *err);
/* The same from plain arrays (tests, benches): bytes[i][0..lens[i]), eog[i] (eog may be NULL). */
hr_status hr_cons_vocab_create(int n_vocab, const char *const *bytes, const uint32_t *lens, const bool *eog,
                               hr_cons_vocab **out, hr_error *err);
void hr_cons_vocab_destroy(hr_cons_vocab *v); /* NULL allowed */
int hr_cons_vocab_size(const hr_cons_vocab *v);
/* The end-of-generation ids (*n of them); valid until destroy. */
const int32_t *hr_cons_vocab_eog(const hr_cons_vocab *v, int *n);

/* ---- per-thread tables and matchers ------------------------------------------------------------ */

/* The per-grammar tables for one vocabulary (per-position token sets, masks per state), kept for the
 * most recently used grammars. Borrows v for its lifetime. */
typedef struct hr_cons_store hr_cons_store;
hr_status hr_cons_store_create(const hr_cons_vocab *v, hr_cons_store **out, hr_error *err);
void hr_cons_store_destroy(hr_cons_store *s); /* NULL allowed; destroy its matchers first */

typedef struct hr_cons_store_stats {
    uint64_t masks;           /* hr_matcher_fill_mask calls */
    uint64_t mask_cache_hits; /* answered from the per-state mask cache */
    uint64_t positions;       /* per-position token sets computed */
    uint64_t walked_tokens;   /* tokens walked at mask time (the context-dependent ones) */
} hr_cons_store_stats;
void hr_cons_store_get_stats(const hr_cons_store *s, hr_cons_store_stats *out);
/* Turns the per-position sets and the per-state mask cache off or on (benchmarks: the plain walk). */
void hr_cons_store_set_caching(hr_cons_store *s, bool position_sets, bool state_masks);

/* One request's recognizer. Holds a reference to g. */
typedef struct hr_matcher hr_matcher;
hr_status hr_matcher_create(hr_cons_store *s, hr_grammar *g, hr_matcher **out, hr_error *err);
void hr_matcher_destroy(hr_matcher *m); /* NULL allowed */

/* Words of a mask for n_vocab tokens (bit i of word i / 64: token i allowed). */
static inline size_t hr_cons_mask_words(int n_vocab) { return ((size_t)n_vocab + 63) / 64; }

/* Fills mask[hr_cons_mask_words(n_vocab)] with the tokens that can continue the output (an
 * end-of-generation token only when the output is complete) and returns how many there are (0: none
 * can: the caller ends the request). */
int hr_matcher_fill_mask(hr_matcher *m, uint64_t *mask);
/* Advances by a token's bytes (an end-of-generation token: allowed only when complete, no bytes).
 * False, with the state unchanged, when the token cannot continue the output. */
bool hr_matcher_accept_token(hr_matcher *m, int32_t id);
/* Advances by raw bytes (tests). False, state unchanged, when they cannot continue the output. */
bool hr_matcher_accept_bytes(hr_matcher *m, const char *bytes, size_t n);
/* The output so far is a complete sentence of the grammar. */
bool hr_matcher_is_complete(const hr_matcher *m);
/* Complete, and no byte can follow: nothing but the end is left. */
bool hr_matcher_is_done(const hr_matcher *m);
/* Whether byte b may come next (tests). */
bool hr_matcher_allows_byte(const hr_matcher *m, uint8_t b);

#endif

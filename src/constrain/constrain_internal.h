/* constrain_internal.h: the compiled grammar's layout, shared by the compiler (grammar.c), the cache
 * (cache.c) and the recognizer (match.c).
 *
 * Layout: every rule's alternatives are runs of elements in one array, each run ended by an END
 * element. A grammar position is an index into that array. Invariants after compile: every REF names a
 * defined rule, no rule is left-recursive (so expanding references always ends), every rule can finish
 * (so a stack can always be completed: the recognizer never reaches a dead end), class 0..n_cls-1 are
 * non-empty. */
#ifndef HR_CONSTRAIN_INTERNAL_H
#define HR_CONSTRAIN_INTERNAL_H

#include <stdatomic.h>

#include "constrain/constrain.h"

enum { HR_GE_END = 0, HR_GE_CLASS = 1, HR_GE_REF = 2 };

/* An element: kind in the low 2 bits, the class or rule index above. */
#define HR_GE_KIND(e)         ((int)((uint32_t)(e)&3u))
#define HR_GE_ARG(e)          ((int32_t)((uint32_t)(e) >> 2))
#define HR_GE_MAKE(kind, arg) ((int32_t)(((uint32_t)(arg) << 2) | (uint32_t)(kind)))

struct hr_grammar {
    atomic_int refs;
    hr_cons_kind kind;
    char *src; /* the source as given (the cache's key) */
    size_t src_len;
    uint64_t hash; /* of kind and src */
    char *text;    /* the GBNF text compiled */
    int32_t *el;   /* [n_el] elements */
    int n_el;
    int32_t *alt;       /* [n_alt] start position of each alternative, rule after rule */
    int32_t *rule_alt0; /* [n_rules] first alternative of the rule */
    int32_t *rule_nalt; /* [n_rules] */
    int n_alt, n_rules;
    uint64_t (*cls)[4]; /* [n_cls] 256-bit byte sets */
    int n_cls;
    int root;
};

/* GBNF text -> grammar (grammar.c). */
hr_status hr_cons_compile_gbnf(const char *text, size_t len, bool regex_only, hr_grammar **out, hr_error *err);
uint64_t hr_cons_hash(hr_cons_kind kind, const char *src, size_t len);

/* A growable string (schema.c's output). */
typedef struct hr_sbuf {
    char *s;
    size_t n, cap;
    bool oom;
} hr_sbuf;
void hr_sbuf_put(hr_sbuf *b, const char *s, size_t n);
void hr_sbuf_puts(hr_sbuf *b, const char *s);
void hr_sbuf_printf(hr_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* s[0..n) as a GBNF string literal (quotes included). */
void hr_sbuf_literal(hr_sbuf *b, const char *s, size_t n);

#endif

/* grammar.c: GBNF text (and plain regular expressions) -> the byte-level grammar IR.
 *
 * One recursive-descent parser reads both: in GBNF mode atoms are "literals", [classes], rule names,
 * (groups), '.', and /regex/ atoms; in regex mode bare characters are literals and there are no
 * names. Character classes are sets of code points; a set past ASCII becomes a rule whose alternatives
 * are the UTF-8 byte sequences that spell it (ranges split where the encoding's lead bytes change), so
 * the IR only ever matches single bytes. Repetition becomes right-recursive helper rules (x* is
 * R ::= x R | "") so a stack never grows with the count. Then the checks the recognizer relies on:
 * every referenced rule defined, none left-recursive, every rule able to finish. Each bound (elements,
 * rules, repetition count, compile time) refuses with its name. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/utf8.h"
#include "common/util.h"
#include "constrain/constrain_internal.h"

/* ---- small growable arrays ----------------------------------------------------------------------- */

typedef struct ivec {
    int32_t *v;
    int n, cap;
} ivec;

static bool ivec_push(ivec *a, int32_t x) {
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 8;
        int32_t *v = realloc(a->v, sizeof *v * (size_t)cap);
        if (!v) return false;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return true;
}

/* A set of code points as sorted, disjoint, non-adjacent ranges. */
typedef struct cpset {
    uint32_t (*r)[2];
    int n, cap;
} cpset;

static bool cpset_add(cpset *s, uint32_t lo, uint32_t hi) {
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 8;
        uint32_t(*r)[2] = realloc(s->r, sizeof *r * (size_t)cap);
        if (!r) return false;
        s->r = r;
        s->cap = cap;
    }
    s->r[s->n][0] = lo;
    s->r[s->n][1] = hi;
    s->n++;
    return true;
}

static int range_cmp(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return (x[0] > y[0]) - (x[0] < y[0]);
}

static void cpset_norm(cpset *s) {
    if (s->n == 0) return;
    qsort(s->r, (size_t)s->n, sizeof *s->r, range_cmp);
    int o = 0;
    for (int i = 1; i < s->n; i++) {
        if (s->r[i][0] <= s->r[o][1] + 1) {
            if (s->r[i][1] > s->r[o][1]) s->r[o][1] = s->r[i][1];
        } else {
            o++;
            s->r[o][0] = s->r[i][0];
            s->r[o][1] = s->r[i][1];
        }
    }
    s->n = o + 1;
}

/* s := [0, 0x10FFFF] minus s. */
static bool cpset_negate(cpset *s) {
    cpset_norm(s);
    cpset t = {0};
    uint32_t at = 0;
    bool ok = true;
    for (int i = 0; i < s->n; i++) {
        if (s->r[i][0] > at) ok &= cpset_add(&t, at, s->r[i][0] - 1);
        at = s->r[i][1] + 1;
    }
    if (at <= 0x10FFFF) ok &= cpset_add(&t, at, 0x10FFFF);
    free(s->r);
    *s = t;
    return ok;
}

/* s := s minus [lo, hi]. */
static bool cpset_sub(cpset *s, uint32_t lo, uint32_t hi) {
    cpset t = {0};
    bool ok = true;
    for (int i = 0; i < s->n; i++) {
        uint32_t a = s->r[i][0], b = s->r[i][1];
        if (b < lo || a > hi) {
            ok &= cpset_add(&t, a, b);
            continue;
        }
        if (a < lo) ok &= cpset_add(&t, a, lo - 1);
        if (b > hi) ok &= cpset_add(&t, hi + 1, b);
    }
    free(s->r);
    *s = t;
    return ok;
}

/* ---- the builder --------------------------------------------------------------------------------- */

typedef struct brule {
    ivec *alts;
    int n_alts, cap_alts;
    char *name; /* NULL for helper rules */
    bool defined;
    size_t ref_at; /* the source offset where it was first referenced (for "undefined rule") */
} brule;

typedef struct cls_key {
    char *key; /* the code-point set's ranges, as text */
    int32_t elem;
} cls_key;

typedef struct builder {
    const char *s;
    size_t n, i;
    bool regex;     /* bare characters are literals (inside /.../ or a whole regex) */
    bool json_str;  /* /.../j: characters limited to what a JSON string holds unescaped */
    bool top_regex; /* the whole input is one regular expression */
    brule *rules;
    int n_rules, cap_rules;
    uint64_t (*cls)[4];
    int n_cls, cap_cls;
    cls_key *keys;
    int n_keys, cap_keys;
    int32_t *names; /* [names_cap] open-addressed rule ids by name (-1 free): lookups stay O(1) */
    int names_cap, n_names;
    long n_elems;
    double t0;
    hr_status st;
    hr_error *err;
} builder;

static void where(const builder *b, size_t at, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t k = 0; k < at && k < b->n; k++) {
        if (b->s[k] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

__attribute__((format(printf, 3, 4))) static bool fail(builder *b, hr_status code, const char *fmt, ...) {
    if (b->st != HR_OK) return false;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    where(b, b->i, &line, &col);
    if (b->top_regex)
        b->st = hr_error_set(b->err, code, "at offset %zu: %s", b->i, msg);
    else
        b->st = hr_error_set(b->err, code, "line %d column %d: %s", line, col, msg);
    return false;
}

static bool oom(builder *b) { return fail(b, HR_ERR_NOMEM, "out of memory compiling the grammar"); }

static int new_rule(builder *b, const char *name) {
    if (b->n_rules >= HR_CONS_MAX_RULES) {
        fail(b, HR_ERR_RANGE, "the grammar needs more than %d rules (the bound on rules)", HR_CONS_MAX_RULES);
        return -1;
    }
    if (b->n_rules == b->cap_rules) {
        int cap = b->cap_rules ? b->cap_rules * 2 : 32;
        brule *r = realloc(b->rules, sizeof *r * (size_t)cap);
        if (!r) return oom(b), -1;
        b->rules = r;
        b->cap_rules = cap;
    }
    brule *r = &b->rules[b->n_rules];
    memset(r, 0, sizeof *r);
    if (name && !(r->name = strdup(name))) return oom(b), -1;
    return b->n_rules++;
}

static ivec *new_alt(builder *b, int rule) {
    brule *r = &b->rules[rule];
    if (r->n_alts == r->cap_alts) {
        int cap = r->cap_alts ? r->cap_alts * 2 : 4;
        ivec *a = realloc(r->alts, sizeof *a * (size_t)cap);
        if (!a) return oom(b), NULL;
        r->alts = a;
        r->cap_alts = cap;
    }
    ivec *a = &r->alts[r->n_alts++];
    memset(a, 0, sizeof *a);
    return a;
}

static bool budget(builder *b, long more) {
    b->n_elems += more;
    if (b->n_elems > HR_CONS_MAX_ELEMENTS)
        return fail(b, HR_ERR_RANGE, "the grammar expands to more than %d elements (the bound on elements)",
                    HR_CONS_MAX_ELEMENTS);
    if ((b->n_elems & 1023) == 0 && hr_time_now() - b->t0 > HR_CONS_MAX_COMPILE_S)
        return fail(b, HR_ERR_RANGE, "compiling took more than %.1f s (the bound on compile time)",
                    HR_CONS_MAX_COMPILE_S);
    return true;
}

static bool push_el(builder *b, ivec *seq, int32_t e) {
    if (!budget(b, 1)) return false;
    return ivec_push(seq, e) || oom(b);
}

static int32_t class_elem(builder *b, const uint64_t bits[4]) {
    for (int i = 0; i < b->n_cls; i++)
        if (!memcmp(b->cls[i], bits, sizeof b->cls[i])) return HR_GE_MAKE(HR_GE_CLASS, i);
    if (b->n_cls == b->cap_cls) {
        int cap = b->cap_cls ? b->cap_cls * 2 : 32;
        uint64_t(*c)[4] = realloc(b->cls, sizeof *c * (size_t)cap);
        if (!c) return oom(b), -1;
        b->cls = c;
        b->cap_cls = cap;
    }
    memcpy(b->cls[b->n_cls], bits, sizeof b->cls[0]);
    return HR_GE_MAKE(HR_GE_CLASS, b->n_cls++);
}

static int32_t byte_range_elem(builder *b, unsigned lo, unsigned hi) {
    uint64_t bits[4] = {0};
    for (unsigned c = lo; c <= hi; c++) bits[c >> 6] |= 1ull << (c & 63);
    return class_elem(b, bits);
}

static int utf8_len_of(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

/* Adds to rule `r` one alternative per byte-range sequence spelling [lo, hi] (same encoded length):
 * split until every byte position is an independent range. */
static bool utf8_split(builder *b, int r, uint32_t lo, uint32_t hi) {
    int n = utf8_len_of(lo);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) return utf8_split(b, r, lo, lo | m) && utf8_split(b, r, (lo | m) + 1, hi);
            if ((hi & m) != m) return utf8_split(b, r, lo, (hi & ~m) - 1) && utf8_split(b, r, hi & ~m, hi);
        }
    }
    uint8_t a[4], z[4];
    hr_utf8_encode(lo, (char *)a);
    hr_utf8_encode(hi, (char *)z);
    ivec *alt = new_alt(b, r);
    if (!alt) return false;
    for (int k = 0; k < n; k++) {
        int32_t e = byte_range_elem(b, a[k], z[k]);
        if (e < 0 || !push_el(b, alt, e)) return false;
    }
    return true;
}

/* The element matching one code point of s: a byte class for ASCII-only sets, else a helper rule of
 * UTF-8 byte sequences (the same set twice reuses its rule). Surrogates are never matched. */
static int32_t cpset_elem(builder *b, cpset *s) {
    if (b->json_str) {
        if (!cpset_sub(s, 0, 0x1F) || !cpset_sub(s, '"', '"') || !cpset_sub(s, '\\', '\\')) return oom(b), -1;
    }
    if (!cpset_sub(s, 0xD800, 0xDFFF)) return oom(b), -1;
    cpset_norm(s);
    if (s->n == 0) {
        fail(b, HR_ERR_INVALID_ARG,
             b->json_str ? "a character class matches nothing a JSON string holds unescaped"
                         : "a character class matches nothing");
        return -1;
    }
    if (s->r[s->n - 1][1] < 0x80) {
        uint64_t bits[4] = {0};
        for (int i = 0; i < s->n; i++)
            for (uint32_t c = s->r[i][0]; c <= s->r[i][1]; c++) bits[c >> 6] |= 1ull << (c & 63);
        return class_elem(b, bits);
    }
    char key[64 * 20];
    size_t kn = 0;
    bool keyed = s->n <= 64;
    for (int i = 0; keyed && i < s->n; i++)
        kn += (size_t)snprintf(key + kn, sizeof key - kn, "%x-%x,", s->r[i][0], s->r[i][1]);
    if (keyed)
        for (int i = 0; i < b->n_keys; i++)
            if (!strcmp(b->keys[i].key, key)) return b->keys[i].elem;
    int r = new_rule(b, NULL);
    if (r < 0) return -1;
    uint64_t ascii[4] = {0};
    bool any_ascii = false;
    for (int i = 0; i < s->n; i++) {
        uint32_t lo = s->r[i][0], hi = s->r[i][1];
        for (; lo <= hi && lo < 0x80; lo++) {
            ascii[lo >> 6] |= 1ull << (lo & 63);
            any_ascii = true;
        }
        static const uint32_t edge[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
        for (int k = 1; k < 4 && lo <= hi; k++) {
            if (lo > edge[k]) continue;
            uint32_t top = hi < edge[k] ? hi : edge[k];
            if (!utf8_split(b, r, lo, top)) return -1;
            lo = top + 1;
        }
    }
    if (any_ascii) {
        ivec *alt = new_alt(b, r);
        int32_t e = alt ? class_elem(b, ascii) : -1;
        if (e < 0 || !push_el(b, alt, e)) return -1;
    }
    int32_t elem = HR_GE_MAKE(HR_GE_REF, r);
    if (keyed) {
        if (b->n_keys == b->cap_keys) {
            int cap = b->cap_keys ? b->cap_keys * 2 : 16;
            cls_key *k = realloc(b->keys, sizeof *k * (size_t)cap);
            if (!k) return oom(b), -1;
            b->keys = k;
            b->cap_keys = cap;
        }
        if (!(b->keys[b->n_keys].key = strdup(key))) return oom(b), -1;
        b->keys[b->n_keys++].elem = elem;
    }
    return elem;
}

static int32_t cp_elem(builder *b, uint32_t cp) {
    cpset s = {0};
    if (!cpset_add(&s, cp, cp)) return oom(b), -1;
    int32_t e = cpset_elem(b, &s);
    free(s.r);
    return e;
}

/* ---- lexing -------------------------------------------------------------------------------------- */

static int peek(const builder *b) { return b->i < b->n ? (unsigned char)b->s[b->i] : -1; }
static int peek_at(const builder *b, size_t k) { return b->i + k < b->n ? (unsigned char)b->s[b->i + k] : -1; }

/* GBNF: spaces, newlines and # comments between elements. */
static void skip_space(builder *b) {
    for (;;) {
        int c = peek(b);
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            b->i++;
        } else if (c == '#') {
            while (b->i < b->n && b->s[b->i] != '\n') b->i++;
        } else {
            return;
        }
    }
}

static bool is_name_char(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

/* One UTF-8 code point of the source (a malformed byte is an error). */
static bool read_cp(builder *b, uint32_t *cp) {
    size_t left = b->n - b->i;
    if (left == 0) return fail(b, HR_ERR_INVALID_ARG, "unexpected end of input");
    int len = hr_utf8_len((const uint8_t *)b->s + b->i, left);
    if (len == 0) return fail(b, HR_ERR_INVALID_ARG, "malformed UTF-8 in the source");
    *cp = hr_utf8_decode(b->s + b->i, &len);
    b->i += (size_t)len;
    return true;
}

static bool read_hex(builder *b, int digits, uint32_t *cp) {
    uint32_t v = 0;
    for (int k = 0; k < digits; k++) {
        int c = peek(b);
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return fail(b, HR_ERR_INVALID_ARG, "expected %d hex digits in an escape", digits);
        v = v * 16 + (uint32_t)d;
        b->i++;
    }
    if (v > 0x10FFFF) return fail(b, HR_ERR_INVALID_ARG, "escape U+%X is past U+10FFFF", v);
    *cp = v;
    return true;
}

/* Regex shorthand classes \d \w \s and their negations, into s. */
static bool shorthand(builder *b, int c, cpset *s) {
    cpset t = {0};
    bool ok = true;
    switch (c | 0x20) {
    case 'd': ok = cpset_add(&t, '0', '9'); break;
    case 'w':
        ok = cpset_add(&t, '0', '9') && cpset_add(&t, 'A', 'Z') && cpset_add(&t, 'a', 'z') && cpset_add(&t, '_', '_');
        break;
    case 's': ok = cpset_add(&t, '\t', '\r') && cpset_add(&t, ' ', ' '); break;
    }
    if (ok && c >= 'A' && c <= 'Z') ok = cpset_negate(&t);
    for (int i = 0; ok && i < t.n; i++) ok = cpset_add(s, t.r[i][0], t.r[i][1]);
    free(t.r);
    return ok || oom(b);
}

/* After a backslash: the code point an escape stands for. */
static bool escape_cp(builder *b, uint32_t *cp) {
    int c = peek(b);
    if (c < 0) return fail(b, HR_ERR_INVALID_ARG, "a backslash at the end of the input");
    b->i++;
    switch (c) {
    case 'n': *cp = '\n'; return true;
    case 't': *cp = '\t'; return true;
    case 'r': *cp = '\r'; return true;
    case 'f': *cp = '\f'; return true;
    case 'v': *cp = '\v'; return true;
    case '0': *cp = 0; return true;
    case 'x': return read_hex(b, 2, cp);
    case 'u': return read_hex(b, 4, cp);
    case 'U': return read_hex(b, 8, cp);
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '1' && c <= '9')) {
        b->i--;
        if (c >= '1' && c <= '9') return fail(b, HR_ERR_INVALID_ARG, "back-references (\\%c) are not supported", c);
        if (c == 'b' || c == 'B') return fail(b, HR_ERR_INVALID_ARG, "word boundaries (\\%c) are not supported", c);
        return fail(b, HR_ERR_INVALID_ARG, "unknown escape \\%c", c);
    }
    b->i--;
    return read_cp(b, cp); /* \" \\ \] \- \. \/ ...: the character itself */
}

/* [ ... ] after the '['. */
static int32_t parse_class(builder *b) {
    cpset s = {0};
    bool neg = false, ok = true;
    if (peek(b) == '^') {
        neg = true;
        b->i++;
    }
    bool first = true;
    for (;;) {
        int c = peek(b);
        if (c < 0) {
            fail(b, HR_ERR_INVALID_ARG, "unterminated character class (missing ']')");
            ok = false;
            break;
        }
        if (c == ']' && !(first && b->regex)) {
            b->i++;
            break;
        }
        first = false;
        uint32_t lo;
        if (c == '\\') {
            b->i++;
            int d = peek(b);
            if (b->regex && (d == 'd' || d == 'D' || d == 'w' || d == 'W' || d == 's' || d == 'S')) {
                b->i++;
                if (!(ok = shorthand(b, d, &s))) break;
                continue;
            }
            if (!(ok = escape_cp(b, &lo))) break;
        } else if (!(ok = read_cp(b, &lo))) {
            break;
        }
        uint32_t hi = lo;
        if (peek(b) == '-' && peek_at(b, 1) != ']' && peek_at(b, 1) >= 0) {
            b->i++;
            if (peek(b) == '\\') {
                b->i++;
                ok = escape_cp(b, &hi);
            } else {
                ok = read_cp(b, &hi);
            }
            if (!ok) break;
            if (hi < lo) {
                ok = fail(b, HR_ERR_INVALID_ARG, "class range U+%04X-U+%04X is reversed", lo, hi);
                break;
            }
        }
        if (!(ok = cpset_add(&s, lo, hi) || oom(b))) break;
    }
    int32_t e = -1;
    if (ok && (!neg || cpset_negate(&s) || oom(b))) e = cpset_elem(b, &s);
    free(s.r);
    return e;
}

/* ---- parsing ------------------------------------------------------------------------------------- */

static bool parse_alts(builder *b, int rule, int close);

/* A unit (an atom's elements) as one element: itself, or a helper rule holding the sequence. */
static int32_t as_one(builder *b, ivec *unit) {
    if (unit->n == 1) return unit->v[0];
    int r = new_rule(b, NULL);
    ivec *alt = r >= 0 ? new_alt(b, r) : NULL;
    if (!alt) return -1;
    for (int k = 0; k < unit->n; k++)
        if (!push_el(b, alt, unit->v[k])) return -1;
    return HR_GE_MAKE(HR_GE_REF, r);
}

/* R ::= x R | "" (more = -1), or the chain R_k ::= x R_(k-1) | "" for up to `more` copies. */
static int32_t repeat_rule(builder *b, int32_t x, long more) {
    if (more < 0) {
        int r = new_rule(b, NULL);
        if (r < 0) return -1;
        ivec *a1 = new_alt(b, r);
        if (!a1 || !push_el(b, a1, x) || !push_el(b, a1, HR_GE_MAKE(HR_GE_REF, r)) || !new_alt(b, r)) return -1;
        return HR_GE_MAKE(HR_GE_REF, r);
    }
    int32_t prev = -1;
    for (long k = 0; k < more; k++) {
        int r = new_rule(b, NULL);
        if (r < 0) return -1;
        ivec *a1 = new_alt(b, r);
        if (!a1 || !push_el(b, a1, x) || (prev >= 0 && !push_el(b, a1, prev)) || !new_alt(b, r)) return -1;
        prev = HR_GE_MAKE(HR_GE_REF, r);
    }
    return prev;
}

static bool read_count(builder *b, long *v) {
    if (!(peek(b) >= '0' && peek(b) <= '9')) return fail(b, HR_ERR_INVALID_ARG, "expected a number in {m,n}");
    long x = 0;
    while (peek(b) >= '0' && peek(b) <= '9') {
        x = x * 10 + (peek(b) - '0');
        b->i++;
        if (x > HR_CONS_MAX_REPEAT)
            return fail(b, HR_ERR_RANGE, "a repetition count is above %d (the bound on repetitions)",
                        HR_CONS_MAX_REPEAT);
    }
    *v = x;
    return true;
}

/* Applies a postfix operator (if any) to unit, appending the result to seq. */
static bool postfix(builder *b, ivec *unit, ivec *seq) {
    if (!b->regex) skip_space(b);
    int c = peek(b);
    long lo = 1, hi = 1;
    if (c == '*') {
        lo = 0, hi = -1;
        b->i++;
    } else if (c == '+') {
        lo = 1, hi = -1;
        b->i++;
    } else if (c == '?') {
        lo = 0, hi = 1;
        b->i++;
    } else if (c == '{' && (!b->regex || (peek_at(b, 1) >= '0' && peek_at(b, 1) <= '9'))) {
        b->i++;
        if (!b->regex) skip_space(b);
        if (!read_count(b, &lo)) return false;
        hi = lo;
        if (!b->regex) skip_space(b);
        if (peek(b) == ',') {
            b->i++;
            if (!b->regex) skip_space(b);
            hi = -1;
            if (peek(b) != '}' && !read_count(b, &hi)) return false;
        }
        if (!b->regex) skip_space(b);
        if (peek(b) != '}') return fail(b, HR_ERR_INVALID_ARG, "expected '}' closing a repetition");
        b->i++;
        if (hi >= 0 && hi < lo) return fail(b, HR_ERR_INVALID_ARG, "repetition {%ld,%ld} has max below min", lo, hi);
    } else {
        for (int k = 0; k < unit->n; k++)
            if (!push_el(b, seq, unit->v[k])) return false;
        return true;
    }
    if (b->regex && peek(b) == '?') b->i++; /* lazy: the same language */
    if (b->regex && peek(b) == '+') return fail(b, HR_ERR_INVALID_ARG, "possessive quantifiers are not supported");
    if (!b->regex) {
        skip_space(b);
        int d = peek(b);
        if (d == '*' || d == '+' || d == '?') return fail(b, HR_ERR_INVALID_ARG, "two repetition operators in a row");
    }
    if (unit->n == 0) return true; /* "" repeated is still "" */
    int32_t x = as_one(b, unit);
    if (x < 0) return false;
    for (long k = 0; k < lo; k++)
        if (!push_el(b, seq, x)) return false;
    if (hi == lo) return true;
    int32_t rest = repeat_rule(b, x, hi < 0 ? -1 : hi - lo);
    return rest >= 0 && push_el(b, seq, rest);
}

/* At a GBNF name: is it the start of the next rule ("name ::=")? */
static bool at_rule_start(builder *b) {
    size_t k = b->i;
    while (k < b->n && is_name_char((unsigned char)b->s[k])) k++;
    if (k == b->i) return false;
    while (k < b->n && (b->s[k] == ' ' || b->s[k] == '\t' || b->s[k] == '\n' || b->s[k] == '\r')) k++;
    return k + 3 <= b->n && !memcmp(b->s + k, "::=", 3);
}

static uint32_t name_hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

/* The rule named name[0..len), created (undefined yet) on first mention. */
static int rule_by_name(builder *b, const char *name, size_t len) {
    if (b->n_names * 2 >= b->names_cap) { /* grow and rehash */
        int cap = b->names_cap ? b->names_cap * 2 : 64;
        int32_t *t = malloc(sizeof *t * (size_t)cap);
        if (!t) return oom(b), -1;
        for (int i = 0; i < cap; i++) t[i] = -1;
        for (int i = 0; i < b->names_cap; i++) {
            if (b->names[i] < 0) continue;
            const char *nm = b->rules[b->names[i]].name;
            uint32_t h = name_hash(nm, strlen(nm)) & (uint32_t)(cap - 1);
            while (t[h] >= 0) h = (h + 1) & (uint32_t)(cap - 1);
            t[h] = b->names[i];
        }
        free(b->names);
        b->names = t;
        b->names_cap = cap;
    }
    uint32_t h = name_hash(name, len) & (uint32_t)(b->names_cap - 1);
    for (; b->names[h] >= 0; h = (h + 1) & (uint32_t)(b->names_cap - 1)) {
        const char *nm = b->rules[b->names[h]].name;
        if (strlen(nm) == len && !memcmp(nm, name, len)) return b->names[h];
    }
    char tmp[128];
    if (len >= sizeof tmp) return fail(b, HR_ERR_INVALID_ARG, "a rule name is longer than %zu", sizeof tmp - 1), -1;
    memcpy(tmp, name, len);
    tmp[len] = 0;
    int r = new_rule(b, tmp);
    if (r >= 0) {
        b->rules[r].ref_at = b->i; /* the line is counted only if an error needs it */
        b->names[h] = r;
        b->n_names++;
    }
    return r;
}

/* A regex atom or a GBNF atom into unit; false at an error. *none: nothing here (end of sequence). */
static bool parse_atom(builder *b, ivec *unit, bool *none) {
    *none = false;
    int c = peek(b);
    if (c == '(') {
        b->i++;
        if (b->regex && peek(b) == '?') {
            int d = peek_at(b, 1);
            if (d == ':') {
                b->i += 2;
            } else if (d == 'P' && peek_at(b, 2) == '<') {
                b->i += 3;
                while (is_name_char(peek(b))) b->i++;
                if (peek(b) != '>') return fail(b, HR_ERR_INVALID_ARG, "malformed group name");
                b->i++;
            } else if (d == '<' && peek_at(b, 2) != '=' && peek_at(b, 2) != '!') {
                b->i += 2;
                while (is_name_char(peek(b))) b->i++;
                if (peek(b) != '>') return fail(b, HR_ERR_INVALID_ARG, "malformed group name");
                b->i++;
            } else {
                return fail(b, HR_ERR_INVALID_ARG, "lookaround and inline flags (?%c...) are not supported", d);
            }
        }
        int r = new_rule(b, NULL);
        if (r < 0 || !parse_alts(b, r, ')')) return false;
        if (peek(b) != ')') return fail(b, HR_ERR_INVALID_ARG, "expected ')'");
        b->i++;
        return ivec_push(unit, HR_GE_MAKE(HR_GE_REF, r)) || oom(b);
    }
    if (c == '[') {
        b->i++;
        int32_t e = parse_class(b);
        return e >= 0 && (ivec_push(unit, e) || oom(b));
    }
    if (c == '.') {
        b->i++;
        cpset s = {0};
        bool ok = cpset_add(&s, 0, 0x10FFFF) && (!b->regex || cpset_sub(&s, '\n', '\n'));
        int32_t e = ok ? cpset_elem(b, &s) : (oom(b), -1);
        free(s.r);
        return e >= 0 && (ivec_push(unit, e) || oom(b));
    }
    if (b->regex) {
        if (c == '\\') {
            b->i++;
            int d = peek(b);
            if (d == 'd' || d == 'D' || d == 'w' || d == 'W' || d == 's' || d == 'S') {
                b->i++;
                cpset s = {0};
                int32_t e = shorthand(b, d, &s) ? cpset_elem(b, &s) : -1;
                free(s.r);
                return e >= 0 && (ivec_push(unit, e) || oom(b));
            }
            if (d == 'A' || d == 'z' || d == 'Z')
                return fail(b, HR_ERR_INVALID_ARG, "anchors (\\%c) are not supported", d);
            uint32_t cp;
            if (!escape_cp(b, &cp)) return false;
            int32_t e = cp_elem(b, cp);
            return e >= 0 && (ivec_push(unit, e) || oom(b));
        }
        if (c == ')') {
            *none = true;
            return true;
        }
        if (c == '*' || c == '+' || c == '?' || c == '{')
            return fail(b, HR_ERR_INVALID_ARG, "a repetition operator '%c' with nothing before it", c);
        if (c == '^' || c == '$')
            return fail(b, HR_ERR_INVALID_ARG, "anchors ('%c') are supported only at the ends", c);
        uint32_t cp;
        if (!read_cp(b, &cp)) return false;
        int32_t e = cp_elem(b, cp);
        return e >= 0 && (ivec_push(unit, e) || oom(b));
    }
    if (c == '"') {
        b->i++;
        for (;;) {
            int d = peek(b);
            if (d < 0 || d == '\n') return fail(b, HR_ERR_INVALID_ARG, "unterminated string literal");
            if (d == '"') {
                b->i++;
                return true;
            }
            uint32_t cp;
            if (d == '\\') {
                b->i++;
                if (!escape_cp(b, &cp)) return false;
            } else if (!read_cp(b, &cp)) {
                return false;
            }
            int32_t e = cp_elem(b, cp);
            if (e < 0 || !(ivec_push(unit, e) || oom(b))) return false;
        }
    }
    if (c == '/') {
        b->i++;
        size_t start = b->i;
        bool saved = b->regex;
        b->regex = true;
        /* find the closing '/' first, to know whether the j flag applies */
        size_t k = start;
        bool in_class = false;
        while (k < b->n && (b->s[k] != '/' || in_class)) {
            if (b->s[k] == '\\')
                k++;
            else if (b->s[k] == '[')
                in_class = true;
            else if (b->s[k] == ']')
                in_class = false;
            k++;
        }
        if (k >= b->n) return fail(b, HR_ERR_INVALID_ARG, "unterminated /regex/");
        b->json_str = k + 1 < b->n && b->s[k + 1] == 'j' && !(k + 2 < b->n && is_name_char((unsigned char)b->s[k + 2]));
        int r = new_rule(b, NULL);
        bool ok = r >= 0 && parse_alts(b, r, '/');
        b->regex = saved;
        bool js = b->json_str;
        b->json_str = false;
        if (!ok) return false;
        if (peek(b) != '/') return fail(b, HR_ERR_INVALID_ARG, "expected '/' closing a regex");
        b->i += js ? 2 : 1;
        return ivec_push(unit, HR_GE_MAKE(HR_GE_REF, r)) || oom(b);
    }
    if (is_name_char(c)) {
        if (at_rule_start(b)) {
            *none = true;
            return true;
        }
        size_t s0 = b->i;
        while (is_name_char(peek(b))) b->i++;
        int r = rule_by_name(b, b->s + s0, b->i - s0);
        return r >= 0 && (ivec_push(unit, HR_GE_MAKE(HR_GE_REF, r)) || oom(b));
    }
    *none = true;
    return true;
}

/* A sequence into rule's new alternative, up to '|', close, or (GBNF) the next rule. */
static bool parse_seq(builder *b, int rule, int close) {
    ivec *alt = new_alt(b, rule);
    if (!alt) return false;
    ivec seq = {0}, unit = {0};
    bool ok = true;
    for (;;) {
        if (!b->regex) skip_space(b);
        int c = peek(b);
        if (c < 0 || c == '|' || c == close) break;
        if (b->regex && b->top_regex && c == '$' && b->i + 1 == b->n) {
            b->i++;
            break;
        }
        if (!b->regex && c == ')') {
            ok = fail(b, HR_ERR_INVALID_ARG, "unexpected '%c'", c);
            break;
        }
        bool none;
        unit.n = 0;
        if (!(ok = parse_atom(b, &unit, &none))) break;
        if (none) {
            if (!b->regex && !at_rule_start(b)) ok = fail(b, HR_ERR_INVALID_ARG, "unexpected character '%c'", c);
            break;
        }
        if (!(ok = postfix(b, &unit, &seq))) break;
        if ((b->n_elems & 255) == 0 && !(ok = budget(b, 0))) break;
    }
    free(unit.v);
    /* the builder's rule array may have moved while parsing nested groups: look the alt up again */
    alt = &b->rules[rule].alts[b->rules[rule].n_alts - 1];
    free(alt->v);
    *alt = seq;
    return ok;
}

static bool parse_alts(builder *b, int rule, int close) {
    for (;;) {
        if (!parse_seq(b, rule, close)) return false;
        if (peek(b) != '|') return true;
        b->i++;
    }
}

static bool parse_gbnf(builder *b) {
    skip_space(b);
    if (b->i >= b->n) return fail(b, HR_ERR_INVALID_ARG, "the grammar is empty (a rule 'root ::= ...' is needed)");
    while (b->i < b->n) {
        size_t s0 = b->i;
        while (is_name_char(peek(b))) b->i++;
        if (b->i == s0) return fail(b, HR_ERR_INVALID_ARG, "expected a rule name");
        size_t s1 = b->i;
        skip_space(b);
        if (b->i + 3 > b->n || memcmp(b->s + b->i, "::=", 3))
            return fail(b, HR_ERR_INVALID_ARG, "expected '::=' after the rule name '%.*s'", (int)(s1 - s0), b->s + s0);
        b->i += 3;
        int r = rule_by_name(b, b->s + s0, s1 - s0);
        if (r < 0) return false;
        if (b->rules[r].defined) return fail(b, HR_ERR_INVALID_ARG, "rule '%s' is defined twice", b->rules[r].name);
        b->rules[r].defined = true;
        if (!parse_alts(b, r, -2)) return false;
        skip_space(b);
    }
    return true;
}

/* ---- checks and flattening ----------------------------------------------------------------------- */

static bool check(builder *b) {
    b->i = b->n;
    for (int r = 0; r < b->n_rules; r++)
        if (b->rules[r].name && !b->rules[r].defined) {
            int line, col;
            where(b, b->rules[r].ref_at, &line, &col);
            return fail(b, HR_ERR_INVALID_ARG, "undefined rule '%s' (referenced on line %d)", b->rules[r].name, line);
        }
    int n = b->n_rules;
    bool *nullable = calloc((size_t)n, 1), *productive = calloc((size_t)n, 1);
    uint8_t *color = calloc((size_t)n, 1);
    int *stack = malloc(sizeof(int) * (size_t)n * 2 + 8);
    bool ok = nullable && productive && color && stack;
    if (!ok) oom(b);
    /* fixpoints: nullable (some alternative of nullable elements), productive (some alternative of
     * productive elements) */
    for (bool changed = ok; changed;) {
        changed = false;
        /* a pass per level of a chain of rules: bounded by the compile-time bound, not by hope */
        if (hr_time_now() - b->t0 > HR_CONS_MAX_COMPILE_S) {
            ok = fail(b, HR_ERR_RANGE, "compiling took more than %.1f s (the bound on compile time)",
                      HR_CONS_MAX_COMPILE_S);
            break;
        }
        for (int r = n - 1; r >= 0; r--) { /* rules appear caller first: callees first settles chains in a pass */
            for (int a = 0; a < b->rules[r].n_alts; a++) {
                ivec *al = &b->rules[r].alts[a];
                bool nul = true, prod = true;
                for (int k = 0; k < al->n; k++) {
                    int32_t e = al->v[k];
                    if (HR_GE_KIND(e) == HR_GE_CLASS) {
                        nul = false;
                    } else {
                        nul &= nullable[HR_GE_ARG(e)];
                        prod &= productive[HR_GE_ARG(e)];
                    }
                }
                if (nul && !nullable[r]) nullable[r] = changed = true;
                if (prod && !productive[r]) productive[r] = changed = true;
            }
        }
    }
    for (int r = 0; ok && r < n; r++)
        if (!productive[r])
            ok = fail(b, HR_ERR_INVALID_ARG, "rule '%s' can never finish (every alternative recurses forever)",
                      b->rules[r].name ? b->rules[r].name : "(a group or repetition)");
    /* left recursion: a cycle in "A may start with B" (B after only nullable elements) */
    for (int s = 0; ok && s < n; s++) {
        if (color[s]) continue;
        /* iterative DFS: stack holds (rule, next alt*65536 + element cursor) pairs */
        int sp = 0;
        stack[sp++] = s;
        stack[sp++] = 0;
        color[s] = 1;
        while (ok && sp > 0) {
            int r = stack[sp - 2], cur = stack[sp - 1];
            int a = cur >> 16, k = cur & 0xFFFF;
            int next = -1;
            while (a < b->rules[r].n_alts) {
                ivec *al = &b->rules[r].alts[a];
                if (k < al->n && HR_GE_KIND(al->v[k]) == HR_GE_REF) {
                    bool prefix_nullable = true;
                    for (int j = 0; j < k; j++)
                        prefix_nullable &= HR_GE_KIND(al->v[j]) == HR_GE_REF && nullable[HR_GE_ARG(al->v[j])];
                    int t = HR_GE_ARG(al->v[k]);
                    k++;
                    if (!prefix_nullable) {
                        a++, k = 0;
                        continue;
                    }
                    if (color[t] == 1) {
                        ok = fail(b, HR_ERR_INVALID_ARG,
                                  "rule '%s' is left-recursive (not supported: rewrite it with repetition)",
                                  b->rules[t].name ? b->rules[t].name : "(a group or repetition)");
                        break;
                    }
                    if (color[t] == 0) {
                        next = t;
                        break;
                    }
                } else {
                    a++, k = 0;
                }
                if (a > 0xFFFF || k > 0xFFFF) break;
            }
            if (!ok) break;
            stack[sp - 1] = (a << 16) | k;
            if (next >= 0) {
                color[next] = 1;
                stack[sp++] = next;
                stack[sp++] = 0;
            } else {
                color[r] = 2;
                sp -= 2;
            }
        }
    }
    free(nullable);
    free(productive);
    free(color);
    free(stack);
    return ok;
}

static hr_status flatten(builder *b, int root, hr_grammar *g) {
    long n_el = 0, n_alt = 0;
    for (int r = 0; r < b->n_rules; r++) {
        n_alt += b->rules[r].n_alts;
        for (int a = 0; a < b->rules[r].n_alts; a++) n_el += b->rules[r].alts[a].n + 1;
    }
    g->el = malloc(sizeof(int32_t) * (size_t)n_el);
    g->alt = malloc(sizeof(int32_t) * (size_t)(n_alt + 1));
    g->rule_alt0 = malloc(sizeof(int32_t) * (size_t)b->n_rules);
    g->rule_nalt = malloc(sizeof(int32_t) * (size_t)b->n_rules);
    g->cls = malloc(sizeof *g->cls * (size_t)(b->n_cls + 1));
    if (!g->el || !g->alt || !g->rule_alt0 || !g->rule_nalt || !g->cls)
        return hr_error_set(b->err, HR_ERR_NOMEM, "out of memory compiling the grammar");
    int at = 0, ai = 0;
    for (int r = 0; r < b->n_rules; r++) {
        g->rule_alt0[r] = ai;
        g->rule_nalt[r] = b->rules[r].n_alts;
        for (int a = 0; a < b->rules[r].n_alts; a++) {
            g->alt[ai++] = at;
            ivec *al = &b->rules[r].alts[a];
            if (al->n) memcpy(g->el + at, al->v, sizeof(int32_t) * (size_t)al->n);
            at += al->n;
            g->el[at++] = HR_GE_MAKE(HR_GE_END, 0);
        }
    }
    if (b->n_cls) memcpy(g->cls, b->cls, sizeof *g->cls * (size_t)b->n_cls);
    g->n_el = at;
    g->n_alt = ai;
    g->n_rules = b->n_rules;
    g->n_cls = b->n_cls;
    g->root = root;
    return HR_OK;
}

static void builder_free(builder *b) {
    for (int r = 0; r < b->n_rules; r++) {
        for (int a = 0; a < b->rules[r].n_alts; a++) free(b->rules[r].alts[a].v);
        free(b->rules[r].alts);
        free(b->rules[r].name);
    }
    free(b->rules);
    free(b->cls);
    for (int i = 0; i < b->n_keys; i++) free(b->keys[i].key);
    free(b->keys);
    free(b->names);
}

void hr_grammar_release(hr_grammar *g) {
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1) return;
    free(g->src);
    free(g->text);
    free(g->el);
    free(g->alt);
    free(g->rule_alt0);
    free(g->rule_nalt);
    free(g->cls);
    free(g);
}

hr_grammar *hr_grammar_retain(hr_grammar *g) {
    if (g) atomic_fetch_add(&g->refs, 1);
    return g;
}

hr_status hr_cons_compile_gbnf(const char *text, size_t len, bool regex_only, hr_grammar **out, hr_error *err) {
    if (len > HR_CONS_MAX_SOURCE)
        return hr_error_set(err, HR_ERR_RANGE, "the source has %zu bytes: above %u (the bound on source size)", len,
                            HR_CONS_MAX_SOURCE);
    builder b = {.s = text, .n = len, .regex = regex_only, .top_regex = regex_only, .t0 = hr_time_now(), .err = err};
    int root = -1;
    if (regex_only) {
        if (peek(&b) == '^') b.i++;
        root = new_rule(&b, "root");
        if (root >= 0) {
            b.rules[root].defined = true;
            if (parse_alts(&b, root, -2) && b.i < b.n) fail(&b, HR_ERR_INVALID_ARG, "unbalanced ')'");
        }
    } else if (parse_gbnf(&b)) {
        for (int r = 0; r < b.n_rules; r++)
            if (b.rules[r].name && !strcmp(b.rules[r].name, "root")) root = r;
        if (root < 0) fail(&b, HR_ERR_INVALID_ARG, "no rule named 'root' (the start rule)");
    }
    if (b.st == HR_OK) check(&b);
    hr_grammar *g = NULL;
    if (b.st == HR_OK) {
        g = calloc(1, sizeof *g);
        if (!g) {
            b.st = hr_error_set(err, HR_ERR_NOMEM, "out of memory compiling the grammar");
        } else {
            atomic_init(&g->refs, 1);
            b.st = flatten(&b, root, g);
        }
    }
    builder_free(&b);
    if (b.st != HR_OK) {
        hr_grammar_release(g);
        return b.st;
    }
    *out = g;
    return HR_OK;
}

const char *hr_grammar_text(const hr_grammar *g) { return g->text ? g->text : ""; }
int hr_grammar_n_rules(const hr_grammar *g) { return g->n_rules; }
int hr_grammar_n_elements(const hr_grammar *g) { return g->n_el; }

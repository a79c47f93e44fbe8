/* jinja_value.c: the Jinja interpreter's arena and values (see jinja_internal.h): construction,
 * Python's truthiness and equality, str()/repr(), json.dumps as HF's tojson calls it, and a JSON
 * parser for the render context. Output formats follow CPython's exactly (float repr, string
 * quoting, JSON escapes), since templates print values with them and the output must match. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/jinja_internal.h"

/* ---- arena ------------------------------------------------------------------------------------ */

struct jchunk {
    jchunk *next;
    size_t size, used;
    _Alignas(16) unsigned char mem[];
};

#define JA_CHUNK (64 * 1024)

void *ja_alloc(jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (a->over || n > a->cap || a->used > a->cap - n) {
        a->over = true;
        return NULL;
    }
    jchunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t size = n > JA_CHUNK / 4 ? n : JA_CHUNK; /* big blocks get a chunk of their own */
        c = malloc(sizeof *c + size);
        if (!c) {
            a->over = a->nomem = true;
            return NULL;
        }
        c->size = size, c->used = 0;
        if (a->head && size != JA_CHUNK) { /* keep the current small chunk in front */
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
    }
    void *p = c->mem + c->used;
    c->used += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

void ja_free(jarena *a) {
    for (jchunk *c = a->head, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    a->head = NULL;
    a->used = 0;
}

/* ---- construction ----------------------------------------------------------------------------- */

jstr *js_new(jarena *a, const char *p, size_t n) {
    if (n > SIZE_MAX / 2) return NULL;
    jstr *s = ja_alloc(a, sizeof *s + n + 1);
    if (!s) return NULL;
    s->n = n;
    if (n) memcpy(s->p, p, n);
    s->p[n] = '\0';
    return s;
}

jv jv_str(jarena *a, const char *p, size_t n) {
    jv v = {.t = JV_STR};
    v.u.s = js_new(a, p, n);
    if (!v.u.s) v.t = JV_UNDEF;
    return v;
}

jv jv_strz(jarena *a, const char *p) { return jv_str(a, p, strlen(p)); }
jv jv_int(int64_t i) { return (jv){.t = JV_INT, .u.i = i}; }
jv jv_bool(bool b) { return (jv){.t = JV_BOOL, .u.b = b}; }
jv jv_none(void) { return (jv){.t = JV_NONE}; }
jv jv_undef(jstr *name) { return (jv){.t = JV_UNDEF, .u.s = name}; }

jlist *jl_new(jarena *a, size_t cap) {
    jlist *l = ja_alloc(a, sizeof *l);
    if (!l) return NULL;
    if (cap) {
        l->v = ja_alloc(a, cap * sizeof(jv));
        if (!l->v) return NULL;
        l->cap = cap;
    }
    return l;
}

bool jl_push(jarena *a, jlist *l, jv v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        jv *nv = ja_alloc(a, cap * sizeof(jv));
        if (!nv) return false;
        if (l->n) memcpy(nv, l->v, l->n * sizeof(jv));
        l->v = nv, l->cap = cap;
    }
    l->v[l->n++] = v;
    return true;
}

jdict *jd_new(jarena *a, size_t cap) {
    jdict *d = ja_alloc(a, sizeof *d);
    if (!d) return NULL;
    if (cap) {
        d->k = ja_alloc(a, cap * sizeof(jv));
        d->v = ja_alloc(a, cap * sizeof(jv));
        if (!d->k || !d->v) return NULL;
        d->cap = cap;
    }
    return d;
}

/* Lookups scan from the newest entry: a JSON object read with a repeated key answers with the last
 * one, as Python's json.loads does (the reader appends without looking, to stay linear). */
const jv *jd_get(const jdict *d, jv k) {
    for (size_t i = d->n; i-- > 0;)
        if (jv_equal(d->k[i], k)) return &d->v[i];
    return NULL;
}

const jv *jd_gets(const jdict *d, const char *key, size_t n) {
    for (size_t i = d->n; i-- > 0;)
        if (d->k[i].t == JV_STR && d->k[i].u.s->n == n && memcmp(d->k[i].u.s->p, key, n) == 0) return &d->v[i];
    return NULL;
}

static bool jd_append(jarena *a, jdict *d, jv k, jv v) {
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        jv *nk = ja_alloc(a, cap * sizeof(jv)), *nv = ja_alloc(a, cap * sizeof(jv));
        if (!nk || !nv) return false;
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof(jv));
            memcpy(nv, d->v, d->n * sizeof(jv));
        }
        d->k = nk, d->v = nv, d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
    return true;
}

bool jd_set(jarena *a, jdict *d, jv k, jv v) {
    for (size_t i = 0; i < d->n; i++)
        if (jv_equal(d->k[i], k)) {
            d->v[i] = v;
            return true;
        }
    return jd_append(a, d, k, v);
}

/* ---- Python semantics ------------------------------------------------------------------------- */

bool jv_truthy(jv v) {
    switch (v.t) {
    case JV_UNDEF:
    case JV_NONE: return false;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0.0;
    case JV_STR: return v.u.s->n != 0;
    case JV_LIST: return v.u.l->n != 0;
    case JV_DICT: return v.u.d->n != 0;
    default: return true;
    }
}

static bool is_num(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static double num_of(jv v) { return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : (double)v.u.b; }

/* Python's ==: 1 == 1.0 == True; containers compare element by element; undefined equals undefined. */
bool jv_equal(jv a, jv b) {
    uint64_t work = 0;
    return jv_equal_work(a, b, &work, JV_EQUAL_WORK_CAP, 0);
}

bool jv_equal_work(jv a, jv b, uint64_t *work, uint64_t cap, int depth) {
    if (*work == UINT64_MAX) return false;
    if (depth > 200) {
        *work = UINT64_MAX;
        return false;
    }
    /* past the cap, stop: two lists that each hold one list twice, 40 deep, have 2^40 leaves */
    if (++*work > cap) return false;
    if (is_num(a) && is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
            int64_t x = a.t == JV_INT ? a.u.i : a.u.b, y = b.t == JV_INT ? b.u.i : b.u.b;
            return x == y;
        }
        return num_of(a) == num_of(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case JV_UNDEF:
    case JV_NONE: return true;
    case JV_STR:
        if (a.u.s->n != b.u.s->n) return false;
        *work += a.u.s->n / 64;
        return memcmp(a.u.s->p, b.u.s->p, a.u.s->n) == 0;
    case JV_LIST:
        /* the same list: equal, as Python finds an object equal to itself without comparing */
        if (a.u.l == b.u.l) return true;
        if (a.u.l->n != b.u.l->n) return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jv_equal_work(a.u.l->v[i], b.u.l->v[i], work, cap, depth + 1)) return false;
        return true;
    case JV_DICT:
    case JV_NS:
        if (a.u.d == b.u.d) return true;
        if (a.u.d->n != b.u.d->n) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            *work += b.u.d->n; /* the key lookup scans */
            const jv *o = jd_get(b.u.d, a.u.d->k[i]);
            if (!o || !jv_equal_work(a.u.d->v[i], *o, work, cap, depth + 1)) return false;
        }
        return true;
    default: return a.u.m == b.u.m;
    }
}

const char *jv_type_name(jv v) {
    static const char *names[] = {"undefined", "none",      "bool",  "int",    "float",    "str", "list",
                                  "dict",      "namespace", "macro", "method", "function", "loop"};
    return v.t < sizeof names / sizeof names[0] ? names[v.t] : "?";
}

/* ---- buffers and text forms ------------------------------------------------------------------- */

void jb_put(jbuf *b, const char *p, size_t n) {
    if (b->over || n == 0) return;
    if (n > b->limit || b->n > b->limit - n) {
        b->over = true;
        return;
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *np = ja_alloc(b->a, cap);
        if (!np) {
            b->over = true;
            return;
        }
        if (b->n) memcpy(np, b->p, b->n);
        b->p = np, b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = '\0';
}

void jb_puts(jbuf *b, const char *s) { jb_put(b, s, strlen(s)); }

/* CPython's float repr: the shortest digits that read back the same, in fixed notation for
 * exponents -4..15 (with ".0" when integral), else d.ddde+XX. */
void jv_write_float(jbuf *b, double f) {
    if (isnan(f)) return jb_puts(b, "nan");
    if (isinf(f)) return jb_puts(b, f < 0 ? "-inf" : "inf");
    char digits[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(digits, sizeof digits, "%.*e", prec - 1, f);
        if (strtod(digits, NULL) == f) break;
    }
    /* digits = [-]d.ddde[+-]XX: split mantissa digits and exponent */
    char mant[32];
    size_t nm = 0;
    const char *p = digits;
    bool neg = false;
    if (*p == '-') neg = true, p++;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') mant[nm++] = *p;
    mant[nm] = '\0';
    int exp = atoi(p + 1);
    while (nm > 1 && mant[nm - 1] == '0') mant[--nm] = '\0';
    char out[64];
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (exp >= -5 + 1 && exp < 16) { /* CPython: repr uses 'r' format: fixed when -4 <= exp < 16 */
        if (exp < 0) {
            out[o++] = '0', out[o++] = '.';
            for (int i = 0; i < -exp - 1; i++) out[o++] = '0';
            for (size_t i = 0; i < nm; i++) out[o++] = mant[i];
        } else {
            for (int i = 0; i <= exp; i++) out[o++] = (size_t)i < nm ? mant[i] : '0';
            out[o++] = '.';
            if ((size_t)exp + 1 < nm)
                for (size_t i = (size_t)exp + 1; i < nm; i++) out[o++] = mant[i];
            else
                out[o++] = '0';
        }
        out[o] = '\0';
    } else {
        out[o++] = mant[0];
        if (nm > 1) {
            out[o++] = '.';
            for (size_t i = 1; i < nm; i++) out[o++] = mant[i];
        }
        out[o] = '\0';
        char e[16];
        snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        strcat(out, e);
    }
    jb_puts(b, out);
}

static void write_int(jbuf *b, int64_t i) {
    char t[32];
    snprintf(t, sizeof t, "%lld", (long long)i);
    jb_puts(b, t);
}

/* repr of a str: single quotes unless the text holds ' and no ", escapes as CPython writes them
 * (non-ASCII printable text stays as it is; other control bytes as \xNN). */
static void write_str_repr(jbuf *b, const jstr *s) {
    bool has_sq = memchr(s->p, '\'', s->n) != NULL, has_dq = memchr(s->p, '"', s->n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jb_put(b, &q, 1);
    for (size_t i = 0; i < s->n; i++) {
        unsigned char c = (unsigned char)s->p[i];
        char t[8];
        if (c == (unsigned char)q || c == '\\') {
            t[0] = '\\', t[1] = (char)c;
            jb_put(b, t, 2);
        } else if (c == '\n')
            jb_puts(b, "\\n");
        else if (c == '\r')
            jb_puts(b, "\\r");
        else if (c == '\t')
            jb_puts(b, "\\t");
        else if (c < 0x20 || c == 0x7f) {
            snprintf(t, sizeof t, "\\x%02x", c);
            jb_puts(b, t);
        } else
            jb_put(b, (const char *)&c, 1);
    }
    jb_put(b, &q, 1);
}

static void write_repr(jbuf *b, jv v, int depth);

static void write_str_depth(jbuf *b, jv v, int depth);

void jv_write_repr(jbuf *b, jv v) { write_repr(b, v, 0); }
void jv_write_str(jbuf *b, jv v) { write_str_depth(b, v, 0); }

static void write_repr(jbuf *b, jv v, int depth) {
    /* once over, stop walking: a list that holds the same list twice, nested 40 deep, has 2^40
       leaves, and visiting them all would take hours even with nothing written */
    if (b->over) return;
    if (depth > 200) {
        b->over = b->too_deep = true;
        return;
    }
    switch (v.t) {
    case JV_STR: write_str_repr(b, v.u.s); return;
    case JV_LIST:
        jb_puts(b, v.u.l->tuple ? "(" : "[");
        for (size_t i = 0; i < v.u.l->n && !b->over; i++) {
            if (i) jb_puts(b, ", ");
            write_repr(b, v.u.l->v[i], depth + 1);
        }
        jb_puts(b, !v.u.l->tuple ? "]" : v.u.l->n == 1 ? ",)" : ")");
        return;
    case JV_DICT:
        jb_puts(b, "{");
        for (size_t i = 0; i < v.u.d->n && !b->over; i++) {
            if (i) jb_puts(b, ", ");
            write_repr(b, v.u.d->k[i], depth + 1);
            jb_puts(b, ": ");
            write_repr(b, v.u.d->v[i], depth + 1);
        }
        jb_puts(b, "}");
        return;
    default: write_str_depth(b, v, depth); return;
    }
}

static void write_str_depth(jbuf *b, jv v, int depth) {
    switch (v.t) {
    case JV_UNDEF: return;
    case JV_NONE: jb_puts(b, "None"); return;
    case JV_BOOL: jb_puts(b, v.u.b ? "True" : "False"); return;
    case JV_INT: write_int(b, v.u.i); return;
    case JV_FLOAT: jv_write_float(b, v.u.f); return;
    case JV_STR: jb_put(b, v.u.s->p, v.u.s->n); return;
    case JV_LIST:
    case JV_DICT: write_repr(b, v, depth); return;
    case JV_NS: jb_puts(b, "<Namespace>"); return;
    case JV_MACRO: jb_puts(b, "<Macro>"); return;
    default: jb_puts(b, "<function>"); return;
    }
}

/* json.dumps string escapes with ensure_ascii=False: ", \, and the C0 controls. */
static void write_json_str(jbuf *b, const char *p, size_t n) {
    jb_puts(b, "\"");
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        const char *esc = NULL;
        char t[8];
        if (c == '"')
            esc = "\\\"";
        else if (c == '\\')
            esc = "\\\\";
        else if (c == '\n')
            esc = "\\n";
        else if (c == '\r')
            esc = "\\r";
        else if (c == '\t')
            esc = "\\t";
        else if (c == '\b')
            esc = "\\b";
        else if (c == '\f')
            esc = "\\f";
        else if (c < 0x20) {
            snprintf(t, sizeof t, "\\u%04x", c);
            esc = t;
        }
        if (esc) {
            jb_put(b, p + run, i - run);
            jb_puts(b, esc);
            run = i + 1;
        }
    }
    jb_put(b, p + run, n - run);
    jb_puts(b, "\"");
}

static void json_newline(jbuf *b, int indent, int depth) {
    jb_puts(b, "\n");
    for (int i = 0; i < indent * depth; i++) jb_puts(b, " ");
}

bool jv_write_json(jbuf *b, jv v, int indent, int depth) {
    if (b->over) return false; /* stop walking, as write_repr does */
    if (depth > 200) return false;
    switch (v.t) {
    case JV_NONE: jb_puts(b, "null"); return true;
    case JV_BOOL: jb_puts(b, v.u.b ? "true" : "false"); return true;
    case JV_INT: write_int(b, v.u.i); return true;
    case JV_FLOAT:
        if (isnan(v.u.f))
            jb_puts(b, "NaN");
        else if (isinf(v.u.f))
            jb_puts(b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else
            jv_write_float(b, v.u.f);
        return true;
    case JV_STR: write_json_str(b, v.u.s->p, v.u.s->n); return true;
    case JV_LIST:
        if (v.u.l->n == 0) {
            jb_puts(b, "[]");
            return true;
        }
        jb_puts(b, "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) jb_puts(b, indent >= 0 ? "," : ", ");
            if (indent >= 0) json_newline(b, indent, depth + 1);
            if (!jv_write_json(b, v.u.l->v[i], indent, depth + 1)) return false;
        }
        if (indent >= 0) json_newline(b, indent, depth);
        jb_puts(b, "]");
        return true;
    case JV_DICT:
    case JV_NS:
        if (v.u.d->n == 0) {
            jb_puts(b, "{}");
            return true;
        }
        jb_puts(b, "{");
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) jb_puts(b, indent >= 0 ? "," : ", ");
            if (indent >= 0) json_newline(b, indent, depth + 1);
            jv k = v.u.d->k[i];
            /* json.dumps turns int, float, bool and None keys into strings */
            if (k.t == JV_STR)
                write_json_str(b, k.u.s->p, k.u.s->n);
            else if (k.t == JV_INT || k.t == JV_FLOAT || k.t == JV_BOOL || k.t == JV_NONE) {
                jbuf kb = {.a = b->a, .limit = b->limit};
                jv_write_json(&kb, k, -1, depth);
                if (kb.over) return b->over = true, false;
                jb_puts(b, "\"");
                jb_put(b, kb.p, kb.n);
                jb_puts(b, "\"");
            } else
                return false;
            jb_puts(b, ": ");
            if (!jv_write_json(b, v.u.d->v[i], indent, depth + 1)) return false;
        }
        if (indent >= 0) json_newline(b, indent, depth);
        jb_puts(b, "}");
        return true;
    default: return false;
    }
}

/* ---- JSON input ------------------------------------------------------------------------------- */

typedef struct jp {
    jarena *a;
    const char *s;
    size_t n, i;
    int max_depth;
    char *err;
    size_t errlen;
} jp;

static bool jp_fail(jp *p, const char *what) {
    if (p->err && p->errlen) snprintf(p->err, p->errlen, "%s at byte %zu", what, p->i);
    return false;
}

static void jp_ws(jp *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r')) p->i++;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool jp_hex4(jp *p, uint32_t *out) {
    if (p->n - p->i < 4) return false;
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(p->s[p->i + (size_t)k]);
        if (h < 0) return false;
        v = v << 4 | (uint32_t)h;
    }
    p->i += 4;
    *out = v;
    return true;
}

static bool jp_string(jp *p, jv *out) {
    p->i++; /* the opening quote */
    size_t start = p->i;
    while (p->i < p->n && p->s[p->i] != '"' && p->s[p->i] != '\\') p->i++;
    if (p->i < p->n && p->s[p->i] == '"') { /* the common case: no escapes */
        *out = jv_str(p->a, p->s + start, p->i - start);
        p->i++;
        return out->t == JV_STR || jp_fail(p, "out of memory");
    }
    jbuf b = {.a = p->a, .limit = SIZE_MAX};
    jb_put(&b, p->s + start, p->i - start);
    while (p->i < p->n && p->s[p->i] != '"') {
        char c = p->s[p->i++];
        if ((unsigned char)c < 0x20) return jp_fail(p, "control character in a string");
        if (c != '\\') {
            jb_put(&b, &c, 1);
            continue;
        }
        if (p->i >= p->n) break;
        char e = p->s[p->i++];
        char t[4];
        switch (e) {
        case '"': jb_puts(&b, "\""); break;
        case '\\': jb_puts(&b, "\\"); break;
        case '/': jb_puts(&b, "/"); break;
        case 'b': jb_puts(&b, "\b"); break;
        case 'f': jb_puts(&b, "\f"); break;
        case 'n': jb_puts(&b, "\n"); break;
        case 'r': jb_puts(&b, "\r"); break;
        case 't': jb_puts(&b, "\t"); break;
        case 'u': {
            uint32_t cp;
            if (!jp_hex4(p, &cp)) return jp_fail(p, "bad \\u escape");
            if (cp >= 0xD800 && cp < 0xDC00 && p->n - p->i >= 6 && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
                size_t save = p->i;
                p->i += 2;
                uint32_t lo;
                if (jp_hex4(p, &lo) && lo >= 0xDC00 && lo < 0xE000)
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                else
                    p->i = save;
            }
            if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD; /* a lone surrogate has no UTF-8 form */
            jb_put(&b, t, hr_utf8_encode(cp, t));
            break;
        }
        default: return jp_fail(p, "bad escape");
        }
    }
    if (p->i >= p->n) return jp_fail(p, "unterminated string");
    p->i++;
    if (b.over) return jp_fail(p, "out of memory");
    *out = jv_str(p->a, b.p ? b.p : "", b.n);
    return out->t == JV_STR || jp_fail(p, "out of memory");
}

static bool jp_value(jp *p, jv *out, int depth);

static bool jp_number(jp *p, jv *out) {
    size_t start = p->i;
    bool is_float = false;
    if (p->s[p->i] == '-') p->i++;
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return jp_fail(p, "bad number");
    while (p->i < p->n && ((p->s[p->i] >= '0' && p->s[p->i] <= '9') || p->s[p->i] == '.' || p->s[p->i] == 'e' ||
                           p->s[p->i] == 'E' || p->s[p->i] == '+' || p->s[p->i] == '-')) {
        if (p->s[p->i] == '.' || p->s[p->i] == 'e' || p->s[p->i] == 'E') is_float = true;
        p->i++;
    }
    char t[64];
    size_t n = p->i - start;
    if (n >= sizeof t) return jp_fail(p, "number too long");
    memcpy(t, p->s + start, n);
    t[n] = '\0';
    char *end;
    if (!is_float) {
        long long v = strtoll(t, &end, 10);
        if (*end == '\0') {
            *out = jv_int(v);
            return true;
        }
    }
    double f = strtod(t, &end);
    if (*end) return jp_fail(p, "bad number");
    *out = (jv){.t = JV_FLOAT, .u.f = f};
    return true;
}

static bool jp_word(jp *p, const char *w) {
    size_t n = strlen(w);
    if (p->n - p->i < n || memcmp(p->s + p->i, w, n) != 0) return false;
    p->i += n;
    return true;
}

static bool jp_value(jp *p, jv *out, int depth) {
    if (depth > p->max_depth) return jp_fail(p, "nested too deeply");
    jp_ws(p);
    if (p->i >= p->n) return jp_fail(p, "unexpected end");
    char c = p->s[p->i];
    if (c == '"') return jp_string(p, out);
    if (c == '{') {
        p->i++;
        jdict *d = jd_new(p->a, 0);
        if (!d) return jp_fail(p, "out of memory");
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == '}') {
            p->i++;
            *out = (jv){.t = JV_DICT, .u.d = d};
            return true;
        }
        for (;;) {
            jp_ws(p);
            if (p->i >= p->n || p->s[p->i] != '"') return jp_fail(p, "expected a key");
            jv k, v;
            if (!jp_string(p, &k)) return false;
            jp_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') return jp_fail(p, "expected ':'");
            p->i++;
            if (!jp_value(p, &v, depth + 1)) return false;
            if (!jd_append(p->a, d, k, v)) return jp_fail(p, "out of memory");
            jp_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                continue;
            }
            if (p->i < p->n && p->s[p->i] == '}') {
                p->i++;
                break;
            }
            return jp_fail(p, "expected ',' or '}'");
        }
        *out = (jv){.t = JV_DICT, .u.d = d};
        return true;
    }
    if (c == '[') {
        p->i++;
        jlist *l = jl_new(p->a, 0);
        if (!l) return jp_fail(p, "out of memory");
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == ']') {
            p->i++;
            *out = (jv){.t = JV_LIST, .u.l = l};
            return true;
        }
        for (;;) {
            jv v;
            if (!jp_value(p, &v, depth + 1)) return false;
            if (!jl_push(p->a, l, v)) return jp_fail(p, "out of memory");
            jp_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                continue;
            }
            if (p->i < p->n && p->s[p->i] == ']') {
                p->i++;
                break;
            }
            return jp_fail(p, "expected ',' or ']'");
        }
        *out = (jv){.t = JV_LIST, .u.l = l};
        return true;
    }
    if (jp_word(p, "true")) return *out = jv_bool(true), true;
    if (jp_word(p, "false")) return *out = jv_bool(false), true;
    if (jp_word(p, "null")) return *out = jv_none(), true;
    if (c == '-' || (c >= '0' && c <= '9')) return jp_number(p, out);
    return jp_fail(p, "unexpected character");
}

bool jv_parse_json(jarena *a, const char *s, size_t n, jv *out, int max_depth, char *errbuf, size_t errlen) {
    jp p = {.a = a, .s = s, .n = n, .max_depth = max_depth, .err = errbuf, .errlen = errlen};
    if (!jp_value(&p, out, 0)) return false;
    jp_ws(&p);
    if (p.i != p.n) return jp_fail(&p, "trailing characters");
    return true;
}

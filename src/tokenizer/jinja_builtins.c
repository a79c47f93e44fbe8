/* jinja_builtins.c: the builtins of the Jinja subset (see jinja.h): tests, filters, string and dict
 * methods and the globals range/namespace/dict/raise_exception/strftime_now, with Python's and
 * Jinja2's semantics, and the Unicode string helpers (code points, Python's whitespace and strip,
 * case mapping) they and the evaluator use. The evaluator (jinja_eval.c) calls in through
 * jinja_eval_internal.h; every function here charges its work and allocates from the render's arena
 * like the evaluator's own. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/jinja_eval_internal.h"

/* ---- strings: UTF-8 aware where Python counts code points ------------------------------------- */

bool je_is_ascii(const jstr *s) {
    for (size_t i = 0; i < s->n; i++)
        if ((unsigned char)s->p[i] >= 0x80) return false;
    return true;
}

/* The byte length of the UTF-8 sequence that starts with byte c (1 for a stray continuation byte). */
size_t je_u8len(unsigned char c) { return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

static size_t n_codepoints(const jstr *s) {
    size_t n = 0;
    for (size_t i = 0; i < s->n; i += je_u8len((unsigned char)s->p[i])) n++;
    return n;
}

/* Byte offsets of each code point, plus s->n at the end (count+1 entries). */
size_t *je_cp_offsets(ctx *c, const jstr *s, size_t *count, int line) {
    size_t n = n_codepoints(s);
    size_t *off = ja_alloc(&c->a, (n + 1) * sizeof *off);
    if (!off) return oom(c, line), NULL;
    size_t k = 0;
    for (size_t i = 0; i < s->n; i += je_u8len((unsigned char)s->p[i])) off[k++] = i;
    off[n] = s->n;
    *count = n;
    return off;
}

static uint32_t decode_at(const char *p, size_t n, size_t *len) {
    unsigned char c = (unsigned char)p[0];
    size_t l = je_u8len(c);
    if (l > n) l = 1;
    *len = l;
    if (l == 1) return c;
    uint32_t cp = c & (0xFF >> (l + 1));
    for (size_t i = 1; i < l; i++) cp = cp << 6 | ((unsigned char)p[i] & 0x3F);
    return cp;
}

/* Python's str.isspace() for one code point. */
static bool py_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

/* Python's str.strip/lstrip/rstrip: whitespace, or any code point of chars. */
static bool strip_hit(const char *p, size_t len, const jstr *chars) {
    size_t l;
    uint32_t cp = decode_at(p, len, &l);
    if (!chars) return py_space(cp);
    for (size_t i = 0; i < chars->n;) {
        size_t cl;
        uint32_t cc = decode_at(chars->p + i, chars->n - i, &cl);
        if (cc == cp) return true;
        i += cl;
    }
    return false;
}

static void strip_range(const jstr *s, const jstr *chars, bool left, bool right, size_t *b, size_t *e) {
    size_t i = 0, j = s->n;
    if (left)
        while (i < j) {
            size_t l;
            decode_at(s->p + i, j - i, &l);
            if (!strip_hit(s->p + i, j - i, chars)) break;
            i += l;
        }
    if (right)
        while (j > i) {
            size_t k = j - 1;
            while (k > i && ((unsigned char)s->p[k] & 0xC0) == 0x80) k--;
            if (!strip_hit(s->p + k, j - k, chars)) break;
            j = k;
        }
    *b = i, *e = j;
}

/* glibc's memmem is linear (two-way), so a search costs what its charge (bytes / 64) says. */
const char *je_memfind(const char *h, size_t hn, const char *n, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    return memmem(h, hn, n, nn);
}

/* The simple (one to one) case pairs of ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic: the
 * scripts chat text mostly uses. Returns cp when it has no pair in that direction; *cased says
 * whether cp is a letter with case at all (title() starts words after uncased characters). */
static uint32_t case_of(uint32_t cp, bool up, bool *cased) {
    uint32_t lo = cp, hi = cp;
    *cased = true;
    if ((cp >= 'a' && cp <= 'z') || (cp >= 0xE0 && cp <= 0xFE && cp != 0xF7) ||
        (cp >= 0x3B1 && cp <= 0x3C9 && cp != 0x3C2) || (cp >= 0x430 && cp <= 0x44F))
        hi = cp - 0x20;
    else if ((cp >= 'A' && cp <= 'Z') || (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7) ||
             (cp >= 0x391 && cp <= 0x3A9 && cp != 0x3A2) || (cp >= 0x410 && cp <= 0x42F))
        lo = cp + 0x20;
    else if (cp >= 0x450 && cp <= 0x45F)
        hi = cp - 0x50;
    else if (cp >= 0x400 && cp <= 0x40F)
        lo = cp + 0x50;
    else if (cp >= 0x100 && cp <= 0x17F && cp != 0x130 && cp != 0x131 && cp != 0x138 && cp != 0x149 && cp != 0x17F) {
        /* pairs (even upper, odd lower) except 0x139..0x148 and 0x179..0x17E (odd upper, even lower) */
        bool odd_upper = (cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E);
        bool is_upper = odd_upper ? (cp & 1) : !(cp & 1);
        if (cp == 0x178) return up ? cp : 0xFF;
        if (is_upper)
            lo = cp + 1;
        else
            hi = cp - 1;
    } else if (cp == 0xFF)
        hi = 0x178;
    else if (cp == 0x3C2)
        hi = 0x3A3; /* final sigma */
    else if (cp == 0xDF || cp == 0xAA || cp == 0xBA || cp == 0xB5)
        return cp; /* cased, no simple pair here */
    else {
        static const uint32_t greek_tonos[][2] = {{0x386, 0x3AC}, {0x388, 0x3AD}, {0x389, 0x3AE}, {0x38A, 0x3AF},
                                                  {0x38C, 0x3CC}, {0x38E, 0x3CD}, {0x38F, 0x3CE}};
        for (size_t k = 0; k < sizeof greek_tonos / sizeof greek_tonos[0]; k++) {
            if (cp == greek_tonos[k][0]) return up ? cp : greek_tonos[k][1];
            if (cp == greek_tonos[k][1]) return up ? greek_tonos[k][0] : cp;
        }
        *cased = false;
    }
    return up ? hi : lo;
}

/* Python's str.upper/lower/title/capitalize with the case pairs of case_of (other text is kept). */
static bool case_map(ctx *c, const jstr *s, int mode, jv *out, int line) {
    jbuf b = new_buf(c);
    jb_put(&b, "", 0);
    bool prev_cased = false;
    for (size_t i = 0; i < s->n;) {
        size_t len;
        uint32_t cp = decode_at(s->p + i, s->n - i, &len);
        bool up, cased;
        if (mode == 'u')
            up = true;
        else if (mode == 'l')
            up = false;
        else if (mode == 't')
            up = !prev_cased;
        else
            up = i == 0;
        uint32_t m = case_of(cp, up, &cased);
        if (cp == 0x3A3 && !up && prev_cased) { /* Python's final sigma: no cased letter follows */
            bool next_cased = false;
            if (i + len < s->n) {
                size_t l2;
                uint32_t nx = decode_at(s->p + i + len, s->n - i - len, &l2);
                case_of(nx, true, &next_cased);
            }
            if (!next_cased) m = 0x3C2;
        }
        if (cp == 0xDF && up) { /* ß upper-cases to SS (title: Ss) */
            jb_puts(&b, mode == 'u' ? "SS" : "Ss");
            prev_cased = true;
            i += len;
            continue;
        }
        if (m == cp || (len == 1 && cp >= 0x80))
            jb_put(&b, s->p + i, len); /* unchanged (or a stray byte) */
        else {
            char t[4];
            jb_put(&b, t, hr_utf8_encode(m, t));
        }
        prev_cased = cased;
        i += len;
    }
    return buf_to_str(c, &b, out, line);
}

/* ---- tests ------------------------------------------------------------------------------------ */

bool je_run_test(ctx *c, const char *name, jv v, jv *args, size_t n, bool *res, int line) {
    const jv *a0 = n > 0 ? &args[0] : NULL;
    if (!strcmp(name, "defined"))
        *res = v.t != JV_UNDEF;
    else if (!strcmp(name, "undefined"))
        *res = v.t == JV_UNDEF;
    else if (!strcmp(name, "none"))
        *res = v.t == JV_NONE;
    else if (!strcmp(name, "boolean"))
        *res = v.t == JV_BOOL;
    else if (!strcmp(name, "true"))
        *res = v.t == JV_BOOL && v.u.b;
    else if (!strcmp(name, "false"))
        *res = v.t == JV_BOOL && !v.u.b;
    else if (!strcmp(name, "integer"))
        *res = v.t == JV_INT;
    else if (!strcmp(name, "float"))
        *res = v.t == JV_FLOAT;
    else if (!strcmp(name, "number"))
        *res = is_numeric(v);
    else if (!strcmp(name, "string"))
        *res = v.t == JV_STR;
    else if (!strcmp(name, "mapping"))
        *res = v.t == JV_DICT || v.t == JV_NS;
    else if (!strcmp(name, "iterable"))
        *res = v.t == JV_LIST || v.t == JV_DICT || v.t == JV_STR || v.t == JV_NS;
    else if (!strcmp(name, "sequence"))
        *res = v.t == JV_LIST || v.t == JV_DICT || v.t == JV_STR;
    else if (!strcmp(name, "callable"))
        *res = v.t == JV_MACRO || v.t == JV_METHOD || v.t == JV_FUNC;
    else if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        bool up = name[0] == 'u', any = false, ok = v.t == JV_STR;
        if (ok && !charge(c, v.u.s->n, line)) return false;
        for (size_t i = 0; ok && i < v.u.s->n;) { /* Python: some cased letter, none of the other case */
            size_t len;
            bool cased;
            uint32_t cp = decode_at(v.u.s->p + i, v.u.s->n - i, &len);
            uint32_t other = case_of(cp, up, &cased); /* a partner in the tested case: the other case */
            if (cased) {
                any = true;
                if (other != cp) ok = false;
            }
            i += len;
        }
        *res = ok && any;
    } else if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        if (v.t != JV_INT && v.t != JV_BOOL) return fail(c, HR_ERR_INVALID_ARG, line, "'%s' needs an integer", name);
        int64_t x = as_int(v), d = name[0] == 'd' ? (a0 && (a0->t == JV_INT) ? a0->u.i : 0) : 2;
        if (d == 0) return fail(c, HR_ERR_INVALID_ARG, line, "divisibleby needs a non-zero integer");
        bool div = x % d == 0;
        *res = name[0] == 'o' ? !div : div;
    } else if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "==") || !strcmp(name, "sameas")) {
        if (!a0) return fail(c, HR_ERR_INVALID_ARG, line, "'%s' needs an argument", name);
        if (!je_equal(c, v, *a0, res, line)) return false;
        if (name[0] == 's') *res = *res && v.t == a0->t;
    } else if (!strcmp(name, "ne") || !strcmp(name, "!=")) {
        if (!a0) return fail(c, HR_ERR_INVALID_ARG, line, "'%s' needs an argument", name);
        if (!je_equal(c, v, *a0, res, line)) return false;
        *res = !*res;
    } else if (!strcmp(name, "lt") || !strcmp(name, "<") || !strcmp(name, "le") || !strcmp(name, "<=") ||
               !strcmp(name, "gt") || !strcmp(name, ">") || !strcmp(name, "ge") || !strcmp(name, ">=") ||
               !strcmp(name, "lessthan") || !strcmp(name, "greaterthan")) {
        if (!a0) return fail(c, HR_ERR_INVALID_ARG, line, "'%s' needs an argument", name);
        int op = (name[0] == 'l' || name[0] == '<') ? (strchr(name, 'e') && name[1] == 'e' ? JOP_LE : JOP_LT)
                                                    : (name[1] == 'e' ? JOP_GE : JOP_GT);
        if (!strcmp(name, "<=")) op = JOP_LE;
        if (!strcmp(name, ">=")) op = JOP_GE;
        if (!strcmp(name, "<")) op = JOP_LT;
        if (!strcmp(name, ">")) op = JOP_GT;
        if (!strcmp(name, "lessthan")) op = JOP_LT;
        if (!strcmp(name, "greaterthan")) op = JOP_GT;
        return je_compare(c, op, v, *a0, res, line);
    } else if (!strcmp(name, "in")) {
        if (!a0) return fail(c, HR_ERR_INVALID_ARG, line, "'in' needs an argument");
        return je_contains(c, *a0, v, res, line);
    } else if (!strcmp(name, "escaped"))
        *res = false;
    else
        return fail(c, HR_ERR_UNSUPPORTED, line, "the test '%s' is not supported", name);
    return true;
}

/* ---- filters ---------------------------------------------------------------------------------- */

bool je_apply_filter(ctx *c, frame *f, const char *name, jv v, jv *args, size_t n, jstr **kw, jv *kv, size_t nk,
                     jv *out, int line);

/* select/reject/selectattr/rejectattr: keep the items whose (attribute's) test result is want. */
static bool filter_select(ctx *c, jv v, jv *args, size_t n, bool attr, bool want, jv *out, int line) {
    jlist *items, *res;
    if (!je_iter_items(c, v, &items, line)) return false;
    if (!(res = jl_new(&c->a, 0))) return oom(c, line);
    size_t first = 0;
    const jv *attr_name = NULL;
    if (attr) {
        if (n < 1 || args[0].t != JV_STR)
            return fail(c, HR_ERR_INVALID_ARG, line, "selectattr needs an attribute name");
        attr_name = &args[0];
        first = 1;
    }
    const char *test = n > first && args[first].t == JV_STR ? args[first].u.s->p : NULL;
    for (size_t i = 0; i < items->n; i++) {
        if (!step(c, 1, line)) return false;
        jv x = items->v[i];
        if (attr_name) {
            /* attribute paths like "function.name" walk one dot at a time */
            const char *p = attr_name->u.s->p, *end = p + attr_name->u.s->n;
            while (p <= end) {
                const char *dot = memchr(p, '.', (size_t)(end - p));
                size_t len = dot ? (size_t)(dot - p) : (size_t)(end - p);
                jv key;
                if (!mkstr(c, p, len, &key, line)) return false;
                if (x.t == JV_UNDEF) break;
                if (!je_get_item(c, x, key, &x, line)) return false;
                if (!dot) break;
                p = dot + 1;
            }
        }
        bool r;
        if (test) {
            if (!je_run_test(c, test, x, args + first + 1, n > first + 1 ? n - first - 1 : 0, &r, line)) return false;
        } else {
            r = jv_truthy(x);
        }
        if (r == want && !jl_push(&c->a, res, items->v[i])) return oom(c, line);
    }
    *out = (jv){.t = JV_LIST, .u.l = res};
    return true;
}

static bool filter_tojson(ctx *c, jv v, const jv *indent, jv *out, int line) {
    int ind = -1;
    if (indent && indent->t != JV_NONE) {
        if (indent->t != JV_INT || indent->u.i < 0 || indent->u.i > 64)
            return fail(c, HR_ERR_UNSUPPORTED, line, "tojson indent must be an integer 0..64");
        ind = (int)indent->u.i;
    }
    jbuf b = new_buf(c);
    jb_put(&b, "", 0);
    if (!jv_write_json(&b, v, ind, 0)) {
        if (b.over) return buf_ok(c, &b, line);
        return fail(c, HR_ERR_INVALID_ARG, line, "a %s cannot be written as JSON", jv_type_name(v));
    }
    if (!charge(c, b.n, line)) return false;
    return buf_to_str(c, &b, out, line);
}

static bool filter_join(ctx *c, jv v, const jv *sep, const jv *attr, jv *out, int line) {
    jlist *items;
    if (!je_iter_items(c, v, &items, line)) return false;
    jbuf b = new_buf(c);
    jb_put(&b, "", 0);
    for (size_t i = 0; i < items->n; i++) {
        if (!step(c, 1, line)) return false;
        if (i && sep) jv_write_str(&b, *sep);
        jv x = items->v[i];
        if (attr && attr->t == JV_STR && !je_get_item(c, x, *attr, &x, line)) return false;
        jv_write_str(&b, x);
    }
    if (!charge(c, b.n, line)) return false;
    return buf_to_str(c, &b, out, line);
}

static bool filter_map(ctx *c, frame *f, jv v, jv *args, size_t n, jstr **kw, jv *kv, size_t nk, jv *out, int line) {
    jlist *items, *res;
    if (!je_iter_items(c, v, &items, line)) return false;
    if (!(res = jl_new(&c->a, items->n))) return oom(c, line);
    const jv *attr = arg(NULL, 0, kw, kv, nk, 0, "attribute");
    const jv *def = arg(NULL, 0, kw, kv, nk, 0, "default");
    if (!attr && (n < 1 || args[0].t != JV_STR))
        return fail(c, HR_ERR_INVALID_ARG, line, "map needs a filter name or attribute=");
    for (size_t i = 0; i < items->n; i++) {
        if (!step(c, 1, line)) return false;
        jv x = items->v[i], r;
        if (attr) {
            if (!je_get_item(c, x, *attr, &r, line)) return false;
            if (r.t == JV_UNDEF && def) r = *def;
        } else if (!je_apply_filter(c, f, args[0].u.s->p, x, args + 1, n - 1, NULL, NULL, 0, &r, line)) {
            return false;
        }
        res->v[res->n++] = r;
    }
    *out = (jv){.t = JV_LIST, .u.l = res};
    return true;
}

static bool filter_indent(ctx *c, jv v, jv *args, size_t n, jstr **kw, jv *kv, size_t nk, jv *out, int line) {
    jv s;
    if (!to_str(c, v, &s, line)) return false;
    const jv *w = arg(args, n, kw, kv, nk, 0, "width"), *first = arg(args, n, kw, kv, nk, 1, "first"),
             *blank = arg(args, n, kw, kv, nk, 2, "blank");
    jbuf pad = new_buf(c);
    jb_put(&pad, "", 0);
    if (!w || w->t == JV_INT) {
        int64_t width = w ? w->u.i : 4;
        if (width < 0 || width > 256) return fail(c, HR_ERR_UNSUPPORTED, line, "indent width must be 0..256");
        for (int64_t i = 0; i < width; i++) jb_put(&pad, " ", 1);
    } else if (w->t == JV_STR) {
        jb_put(&pad, w->u.s->p, w->u.s->n);
    }
    bool do_first = first && jv_truthy(*first), do_blank = blank && jv_truthy(*blank);
    jbuf b = new_buf(c);
    jb_put(&b, "", 0);
    const char *p = s.u.s->p, *end = p + s.u.s->n;
    bool line_start = true, first_line = true;
    for (; p < end; p++) {
        if (line_start) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            bool is_blank = (nl ? nl : end) == p;
            if ((!first_line || do_first) && (!is_blank || do_blank)) jb_put(&b, pad.p, pad.n);
            line_start = false;
        }
        jb_put(&b, p, 1);
        if (*p == '\n') line_start = true, first_line = false;
    }
    if (!charge(c, b.n, line)) return false;
    return buf_to_str(c, &b, out, line);
}

static bool filter_replace(ctx *c, const jstr *s, const jv *old, const jv *new_, const jv *count, jv *out, int line) {
    if (!old || !new_ || old->t != JV_STR || new_->t != JV_STR)
        return fail(c, HR_ERR_INVALID_ARG, line, "replace needs two strings");
    int64_t limit = count && count->t == JV_INT ? count->u.i : -1;
    if (!charge(c, s->n, line)) return false;
    jbuf b = new_buf(c);
    jb_put(&b, "", 0);
    const char *p = s->p, *end = s->p + s->n;
    int64_t done = 0;
    if (old->u.s->n == 0) { /* Python inserts the replacement between every character */
        for (size_t i = 0; i <= s->n; i += i < s->n ? je_u8len((unsigned char)s->p[i]) : 1) {
            if (limit < 0 || done < limit) jb_put(&b, new_->u.s->p, new_->u.s->n), done++;
            if (i < s->n)
                jb_put(&b, s->p + i,
                       je_u8len((unsigned char)s->p[i]) <= s->n - i ? je_u8len((unsigned char)s->p[i]) : s->n - i);
            if (!buf_ok(c, &b, line)) return false;
        }
        return buf_to_str(c, &b, out, line);
    }
    while (p < end) {
        const char *hit =
            (limit < 0 || done < limit) ? je_memfind(p, (size_t)(end - p), old->u.s->p, old->u.s->n) : NULL;
        if (!hit) {
            jb_put(&b, p, (size_t)(end - p));
            break;
        }
        jb_put(&b, p, (size_t)(hit - p));
        jb_put(&b, new_->u.s->p, new_->u.s->n);
        p = hit + old->u.s->n;
        done++;
        if (!buf_ok(c, &b, line)) return false;
    }
    if (!charge(c, b.n, line)) return false;
    return buf_to_str(c, &b, out, line);
}

static bool list_of(ctx *c, jv v, jv *out, int line) {
    jlist *items;
    if (!je_iter_items(c, v, &items, line)) return false;
    *out = (jv){.t = JV_LIST, .u.l = items};
    return true;
}

bool je_apply_filter(ctx *c, frame *f, const char *name, jv v, jv *args, size_t n, jstr **kw, jv *kv, size_t nk,
                     jv *out, int line) {
    if (!step(c, 1, line)) return false;
    const jv *a0 = arg(args, n, NULL, NULL, 0, 0, "");
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        const jv *def = arg(args, n, kw, kv, nk, 0, "default_value"), *boolean = arg(args, n, kw, kv, nk, 1, "boolean");
        bool use = v.t == JV_UNDEF || (boolean && jv_truthy(*boolean) && !jv_truthy(v));
        if (!use) return *out = v, true;
        if (def) return *out = *def, true;
        return mkstr(c, "", 0, out, line);
    }
    if (!strcmp(name, "tojson")) return filter_tojson(c, v, arg(args, n, kw, kv, nk, 0, "indent"), out, line);
    if (!strcmp(name, "safe")) return *out = v, true;
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        if (v.t == JV_STR) {
            if (!charge(c, v.u.s->n, line)) return false;
            *out = jv_int((int64_t)n_codepoints(v.u.s));
        } else if (v.t == JV_LIST)
            *out = jv_int((int64_t)v.u.l->n);
        else if (v.t == JV_DICT || v.t == JV_NS)
            *out = jv_int((int64_t)v.u.d->n);
        else if (v.t == JV_UNDEF)
            *out = jv_int(0);
        else
            return fail(c, HR_ERR_INVALID_ARG, line, "a %s has no length", jv_type_name(v));
        return true;
    }
    if (!strcmp(name, "string")) return to_str(c, v, out, line);
    if (!strcmp(name, "list")) return list_of(c, v, out, line);
    if (!strcmp(name, "items")) {
        if (v.t == JV_UNDEF) return list_of(c, v, out, line);
        if (v.t != JV_DICT && v.t != JV_NS) return fail(c, HR_ERR_INVALID_ARG, line, "items needs a mapping");
        jlist *l = jl_new(&c->a, v.u.d->n);
        if (!l) return oom(c, line);
        for (size_t i = 0; i < v.u.d->n; i++) {
            jlist *pair = jl_new(&c->a, 2);
            if (!pair) return oom(c, line);
            pair->v[0] = v.u.d->k[i], pair->v[1] = v.u.d->v[i], pair->n = 2, pair->tuple = true;
            l->v[l->n++] = (jv){.t = JV_LIST, .u.l = pair};
        }
        *out = (jv){.t = JV_LIST, .u.l = l};
        return true;
    }
    if (!strcmp(name, "join"))
        return filter_join(c, v, arg(args, n, kw, kv, nk, 0, "d"), arg(args, n, kw, kv, nk, 1, "attribute"), out, line);
    if (!strcmp(name, "map")) return filter_map(c, f, v, args, n, kw, kv, nk, out, line);
    if (!strcmp(name, "select") || !strcmp(name, "reject"))
        return filter_select(c, v, args, n, false, name[0] == 's', out, line);
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr"))
        return filter_select(c, v, args, n, true, name[0] == 's', out, line);
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        jlist *items;
        if (!je_iter_items(c, v, &items, line)) return false;
        *out = items->n ? items->v[name[0] == 'f' ? 0 : items->n - 1] : jv_undef(NULL);
        return true;
    }
    if (!strcmp(name, "reverse")) {
        jv none = jv_none(), neg = jv_int(-1);
        if (v.t == JV_STR || v.t == JV_LIST) return je_do_slice(c, v, &none, &none, &neg, out, line);
        jlist *items;
        if (!list_of(c, v, out, line)) return false;
        items = out->u.l;
        return je_do_slice(c, (jv){.t = JV_LIST, .u.l = items}, &none, &none, &neg, out, line);
    }
    if (!strcmp(name, "int")) {
        const jv *def = arg(args, n, kw, kv, nk, 0, "default");
        if (v.t == JV_INT || v.t == JV_BOOL) return *out = jv_int(as_int(v)), true;
        if (v.t == JV_FLOAT && isfinite(v.u.f) && fabs(v.u.f) < 9.2e18) return *out = jv_int((int64_t)v.u.f), true;
        if (v.t == JV_STR) {
            char *end;
            long long x = strtoll(v.u.s->p, &end, 10);
            if (end != v.u.s->p && *end == '\0') return *out = jv_int(x), true;
        }
        return *out = def ? *def : jv_int(0), true;
    }
    if (!strcmp(name, "float")) {
        if (is_numeric(v)) return *out = (jv){.t = JV_FLOAT, .u.f = as_double(v)}, true;
        if (v.t == JV_STR) {
            char *end;
            double x = strtod(v.u.s->p, &end);
            if (end != v.u.s->p && *end == '\0') return *out = (jv){.t = JV_FLOAT, .u.f = x}, true;
        }
        return *out = (jv){.t = JV_FLOAT, .u.f = 0.0}, true;
    }
    if (!strcmp(name, "abs")) {
        if (v.t == JV_INT) return *out = jv_int(v.u.i < 0 && v.u.i != INT64_MIN ? -v.u.i : v.u.i), true;
        if (v.t == JV_FLOAT) return *out = (jv){.t = JV_FLOAT, .u.f = fabs(v.u.f)}, true;
        return fail(c, HR_ERR_INVALID_ARG, line, "abs needs a number");
    }
    if (!strcmp(name, "indent")) return filter_indent(c, v, args, n, kw, kv, nk, out, line);
    /* the rest work on str(v) */
    jv s;
    if (!to_str(c, v, &s, line)) return false;
    if (!charge(c, s.u.s->n, line)) return false;
    if (!strcmp(name, "trim")) {
        size_t b, e;
        const jv *chars = arg(args, n, kw, kv, nk, 0, "chars");
        strip_range(s.u.s, chars && chars->t == JV_STR ? chars->u.s : NULL, true, true, &b, &e);
        return mkstr(c, s.u.s->p + b, e - b, out, line);
    }
    if (!strcmp(name, "upper")) return case_map(c, s.u.s, 'u', out, line);
    if (!strcmp(name, "lower")) return case_map(c, s.u.s, 'l', out, line);
    if (!strcmp(name, "title")) return case_map(c, s.u.s, 't', out, line);
    if (!strcmp(name, "capitalize")) {
        jv low;
        if (!case_map(c, s.u.s, 'l', &low, line)) return false;
        return case_map(c, low.u.s, 'c', out, line);
    }
    if (!strcmp(name, "replace"))
        return filter_replace(c, s.u.s, a0, arg(args, n, kw, kv, nk, 1, "new"), arg(args, n, kw, kv, nk, 2, "count"),
                              out, line);
    if (!strcmp(name, "escape") || !strcmp(name, "e")) {
        jbuf b = new_buf(c);
        jb_put(&b, "", 0);
        for (size_t i = 0; i < s.u.s->n; i++) {
            char ch = s.u.s->p[i];
            const char *r = ch == '&'    ? "&amp;"
                            : ch == '<'  ? "&lt;"
                            : ch == '>'  ? "&gt;"
                            : ch == '"'  ? "&#34;"
                            : ch == '\'' ? "&#39;"
                                         : NULL;
            if (r)
                jb_puts(&b, r);
            else
                jb_put(&b, &ch, 1);
        }
        return buf_to_str(c, &b, out, line);
    }
    (void)a0;
    return fail(c, HR_ERR_UNSUPPORTED, line, "the filter '%s' is not supported", name);
}

/* ---- methods and globals ---------------------------------------------------------------------- */

static bool str_split(ctx *c, const jstr *s, const jv *sep, const jv *maxsplit, jv *out, int line) {
    int64_t max = maxsplit && maxsplit->t == JV_INT ? maxsplit->u.i : -1;
    jlist *l = jl_new(&c->a, 0);
    if (!l) return oom(c, line);
    jv part;
    if (!sep || sep->t == JV_NONE) { /* runs of whitespace; no empty strings */
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            while (i < s->n) {
                size_t len;
                uint32_t cp = decode_at(s->p + i, s->n - i, &len);
                if (!py_space(cp)) break;
                i += len;
            }
            if (i >= s->n) break;
            size_t st = i;
            if (max >= 0 && done >= max) {
                size_t b, e;
                jstr tail = {0};
                (void)tail;
                strip_range(s, NULL, false, true, &b, &e);
                if (!mkstr(c, s->p + st, e - st, &part, line) || !jl_push(&c->a, l, part)) return oom(c, line);
                break;
            }
            while (i < s->n) {
                size_t len;
                uint32_t cp = decode_at(s->p + i, s->n - i, &len);
                if (py_space(cp)) break;
                i += len;
            }
            if (!mkstr(c, s->p + st, i - st, &part, line) || !jl_push(&c->a, l, part)) return oom(c, line);
            done++;
        }
    } else {
        if (sep->t != JV_STR || sep->u.s->n == 0)
            return fail(c, HR_ERR_INVALID_ARG, line, "split needs a non-empty separator");
        const char *p = s->p, *end = s->p + s->n;
        int64_t done = 0;
        for (;;) {
            const char *hit =
                (max < 0 || done < max) ? je_memfind(p, (size_t)(end - p), sep->u.s->p, sep->u.s->n) : NULL;
            if (!hit) {
                if (!mkstr(c, p, (size_t)(end - p), &part, line) || !jl_push(&c->a, l, part)) return oom(c, line);
                break;
            }
            if (!mkstr(c, p, (size_t)(hit - p), &part, line) || !jl_push(&c->a, l, part)) return oom(c, line);
            p = hit + sep->u.s->n;
            done++;
            if (!step(c, 1, line)) return false;
        }
    }
    *out = (jv){.t = JV_LIST, .u.l = l};
    return true;
}

static bool affix(ctx *c, const jstr *s, const jv *a, bool start, bool *res, int line) {
    if (!a) return fail(c, HR_ERR_INVALID_ARG, line, "%s needs an argument", start ? "startswith" : "endswith");
    if (a->t == JV_LIST) {
        *res = false;
        for (size_t i = 0; i < a->u.l->n && !*res; i++)
            if (!affix(c, s, &a->u.l->v[i], start, res, line)) return false;
        return true;
    }
    if (a->t != JV_STR)
        return fail(c, HR_ERR_INVALID_ARG, line, "%s needs a string", start ? "startswith" : "endswith");
    size_t k = a->u.s->n;
    *res = k <= s->n && memcmp(start ? s->p : s->p + s->n - k, a->u.s->p, k) == 0;
    return true;
}

bool je_call_method(ctx *c, frame *f, struct jmethod *m, jv *args, size_t n, jstr **kw, jv *kv, size_t nk, jv *out,
                    int line) {
    const char *name = m->name;
    jv self = m->self;
    const jv *a0 = arg(args, n, NULL, NULL, 0, 0, ""), *a1 = arg(args, n, NULL, NULL, 0, 1, "");
    if (self.t == JV_LOOP) { /* loop.cycle(a, b, ...) */
        if (n == 0) return fail(c, HR_ERR_INVALID_ARG, line, "loop.cycle needs arguments");
        return *out = args[self.u.loop->i % n], true;
    }
    if (self.t == JV_DICT) {
        if (!strcmp(name, "get")) {
            if (!a0) return fail(c, HR_ERR_INVALID_ARG, line, "get needs a key");
            if (!charge(c, self.u.d->n * 8, line)) return false;
            const jv *v = jd_get(self.u.d, *a0);
            *out = v ? *v : a1 ? *a1 : jv_none();
            return true;
        }
        jlist *l = jl_new(&c->a, self.u.d->n);
        if (!l) return oom(c, line);
        for (size_t i = 0; i < self.u.d->n; i++) {
            if (name[0] == 'k')
                l->v[i] = self.u.d->k[i];
            else if (name[0] == 'v')
                l->v[i] = self.u.d->v[i];
            else {
                jlist *pair = jl_new(&c->a, 2);
                if (!pair) return oom(c, line);
                pair->v[0] = self.u.d->k[i], pair->v[1] = self.u.d->v[i], pair->n = 2, pair->tuple = true;
                l->v[i] = (jv){.t = JV_LIST, .u.l = pair};
            }
        }
        l->n = self.u.d->n;
        *out = (jv){.t = JV_LIST, .u.l = l};
        return step(c, l->n / 8, line);
    }
    /* string methods */
    const jstr *s = self.u.s;
    if (!charge(c, s->n, line)) return false;
    bool r;
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        if (!affix(c, s, a0, name[0] == 's', &r, line)) return false;
        return *out = jv_bool(r), true;
    }
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
        size_t b, e;
        const jstr *chars = a0 && a0->t == JV_STR ? a0->u.s : NULL;
        strip_range(s, chars, name[0] != 'r', name[0] != 'l', &b, &e);
        return mkstr(c, s->p + b, e - b, out, line);
    }
    if (!strcmp(name, "split"))
        return str_split(c, s, arg(args, n, kw, kv, nk, 0, "sep"), arg(args, n, kw, kv, nk, 1, "maxsplit"), out, line);
    if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "title") || !strcmp(name, "capitalize"))
        return je_apply_filter(c, f, name, self, NULL, 0, NULL, NULL, 0, out, line);
    if (!strcmp(name, "replace")) return filter_replace(c, s, a0, a1, arg(args, n, NULL, NULL, 0, 2, ""), out, line);
    if (!strcmp(name, "find") || !strcmp(name, "count")) {
        if (!a0 || a0->t != JV_STR) return fail(c, HR_ERR_INVALID_ARG, line, "%s needs a string", name);
        if (name[0] == 'f') {
            const char *hit = je_memfind(s->p, s->n, a0->u.s->p, a0->u.s->n);
            if (!hit) return *out = jv_int(-1), true;
            jstr pre = {0};
            (void)pre;
            size_t cps = 0;
            for (const char *q = s->p; q < hit; q += je_u8len((unsigned char)*q)) cps++;
            return *out = jv_int((int64_t)cps), true;
        }
        int64_t cnt = 0;
        if (a0->u.s->n == 0) return *out = jv_int((int64_t)n_codepoints(s) + 1), true;
        for (const char *q = s->p, *hit; (hit = je_memfind(q, (size_t)(s->p + s->n - q), a0->u.s->p, a0->u.s->n));
             q = hit + a0->u.s->n)
            cnt++;
        return *out = jv_int(cnt), true;
    }
    if (!strcmp(name, "join")) {
        if (!a0) return fail(c, HR_ERR_INVALID_ARG, line, "join needs an iterable");
        return filter_join(c, *a0, &self, NULL, out, line);
    }
    if (!strcmp(name, "isdigit") || !strcmp(name, "isalpha") || !strcmp(name, "isspace")) {
        bool ok = s->n > 0;
        for (size_t i = 0; ok && i < s->n; i++) {
            char ch = s->p[i];
            ok = name[2] == 'd'   ? (ch >= '0' && ch <= '9')
                 : name[2] == 'a' ? ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'))
                                  : (ch == ' ' || (ch >= '\t' && ch <= '\r'));
        }
        return *out = jv_bool(ok), true;
    }
    return fail(c, HR_ERR_UNSUPPORTED, line, "the string method '%s' is not supported", name);
}

static bool strftime_now(ctx *c, const jv *fmt, jv *out, int line) {
    if (!fmt || fmt->t != JV_STR) return fail(c, HR_ERR_INVALID_ARG, line, "strftime_now needs a format string");
    time_t now = c->lim.now_unix ? (time_t)c->lim.now_unix : time(NULL);
    struct tm tm;
    if (!localtime_r(&now, &tm)) return fail(c, HR_ERR_INVALID_ARG, line, "strftime_now: no local time");
    char buf[256];
    if (fmt->u.s->n > 64) return fail(c, HR_ERR_UNSUPPORTED, line, "strftime_now format too long");
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    size_t n = strftime(buf, sizeof buf, fmt->u.s->p, &tm); /* the template's format, as Python's strftime */
#pragma GCC diagnostic pop
    return mkstr(c, buf, n, out, line);
}

bool je_call_func(ctx *c, int fn, jv *args, size_t n, jstr **kw, jv *kv, size_t nk, jv *out, int line) {
    if (fn == FN_RAISE) {
        jbuf b = new_buf(c);
        if (n) jv_write_str(&b, args[0]);
        return fail(c, HR_ERR_INVALID_ARG, line, "the template raised an error: %s", b.p && !b.over ? b.p : "");
    }
    if (fn == FN_STRFTIME) return strftime_now(c, n ? &args[0] : NULL, out, line);
    if (fn == FN_NAMESPACE || fn == FN_DICT) {
        jdict *d = jd_new(&c->a, 0);
        if (!d) return oom(c, line);
        if (n > 0) {
            if (n > 1 || (args[0].t != JV_DICT && args[0].t != JV_NS))
                return fail(c, HR_ERR_INVALID_ARG, line, "%s takes a mapping and keywords",
                            fn == FN_DICT ? "dict" : "namespace");
            for (size_t i = 0; i < args[0].u.d->n; i++) /* jd_set scans: charge it */
                if (!step(c, d->n / 8 + 1, line) || !jd_set(&c->a, d, args[0].u.d->k[i], args[0].u.d->v[i]))
                    return c->st ? false : oom(c, line);
        }
        for (size_t i = 0; i < nk; i++)
            if (!jd_set(&c->a, d, (jv){.t = JV_STR, .u.s = kw[i]}, kv[i])) return oom(c, line);
        *out = (jv){.t = fn == FN_DICT ? JV_DICT : JV_NS, .u.d = d};
        return true;
    }
    /* range */
    int64_t start = 0, stop, stp = 1;
    for (size_t i = 0; i < n; i++)
        if (args[i].t != JV_INT) return fail(c, HR_ERR_INVALID_ARG, line, "range needs integers");
    if (n == 1)
        stop = args[0].u.i;
    else if (n == 2 || n == 3)
        start = args[0].u.i, stop = args[1].u.i, stp = n == 3 ? args[2].u.i : 1;
    else
        return fail(c, HR_ERR_INVALID_ARG, line, "range takes 1 to 3 arguments");
    if (stp == 0) return fail(c, HR_ERR_INVALID_ARG, line, "range step cannot be zero");
    /* the exact count in unsigned arithmetic (start + k * step may not pass INT64_MAX on the way:
       range(0, 2**63 - 1, 2**62) has two items, not an overflow) */
    uint64_t span = stp > 0 ? (stop > start ? (uint64_t)stop - (uint64_t)start : 0)
                            : (start > stop ? (uint64_t)start - (uint64_t)stop : 0);
    uint64_t ustep = stp > 0 ? (uint64_t)stp : (uint64_t)0 - (uint64_t)stp;
    uint64_t cnt = span ? (span - 1) / ustep + 1 : 0;
    /* charge the items up front: a huge range stops at the step limit before it takes memory */
    if (cnt > c->lim.max_steps || (cnt > 0 && !step(c, cnt, line)))
        return fail(c, HR_ERR_RANGE, line, "range longer than the step limit (%llu)",
                    (unsigned long long)c->lim.max_steps);
    jlist *l = jl_new(&c->a, 0);
    if (!l) return oom(c, line);
    for (uint64_t k = 0; k < cnt; k++) {
        uint64_t u = (uint64_t)start + k * (uint64_t)stp; /* wraps as two's complement, lands in range */
        if (!jl_push(&c->a, l, jv_int(u <= INT64_MAX ? (int64_t)u : -(int64_t)(UINT64_MAX - u) - 1)))
            return oom(c, line);
    }
    *out = (jv){.t = JV_LIST, .u.l = l};
    return true;
}

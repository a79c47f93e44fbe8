/* jinja_eval.c: renders a parsed template (see jinja.h): scopes, expressions with Python's
 * semantics, statements, and the filters, tests, methods and globals of the subset.
 *
 * Invariants: every allocation comes from the render's arena (capped: limits.max_memory_bytes);
 * every node evaluated, loop turn taken and 64 bytes scanned costs a step (capped:
 * limits.max_steps); output buffers are capped at limits.max_output_bytes; expression, statement
 * and macro nesting at limits.max_depth. Reaching any cap stops the render with HR_ERR_RANGE. The
 * first error wins: once ctx->st is set every evaluator returns false without doing more. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/jinja_internal.h"

/* ---- context ---------------------------------------------------------------------------------- */

typedef struct frame frame;
struct frame {
    frame *parent;
    jstr **names;
    jv *vals;
    size_t n, cap;
};

struct jmacro {
    const jnode *def; /* JN_MACRO, or JN_CALLBLOCK for a caller */
    frame *closure;
};

struct jmethod {
    jv self;
    const char *name;
};

struct jloop {
    jlist *items;
    size_t i;
};

enum { FN_RANGE = 1, FN_NAMESPACE, FN_RAISE, FN_STRFTIME, FN_DICT };

typedef struct ctx {
    jarena a;
    hr_jinja_limits lim;
    uint64_t steps;
    int depth;
    jbuf *out;
    jdict *globals;
    hr_status st;
    hr_error *err;
    int brk;        /* 1 = break, 2 = continue pending */
    jv block_value; /* the rendered body a filter block or block set feeds its first filter */
    jv pending_caller;
} ctx;

__attribute__((format(printf, 4, 5))) static bool fail(ctx *c, hr_status code, int line, const char *fmt, ...) {
    if (c->st != HR_OK) return false;
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->st = hr_error_set(c->err, code, "template line %d: %s", line, msg);
    return false;
}

static bool oom(ctx *c, int line) {
    if (c->a.over && !c->a.nomem)
        return fail(c, HR_ERR_RANGE, line, "the render needs more than the memory limit (%zu bytes)", c->a.cap);
    return fail(c, HR_ERR_NOMEM, line, "out of memory");
}

static bool step(ctx *c, uint64_t n, int line) {
    if (c->st != HR_OK) return false;
    c->steps += n;
    if (c->steps > c->lim.max_steps)
        return fail(c, HR_ERR_RANGE, line, "the render took more than the step limit (%llu)",
                    (unsigned long long)c->lim.max_steps);
    return true;
}

static bool charge(ctx *c, size_t bytes, int line) { return step(c, bytes / 64, line); }

static bool buf_ok(ctx *c, jbuf *b, int line) {
    if (!b->over) return true;
    if (b->too_deep) return fail(c, HR_ERR_RANGE, line, "a value nested deeper than the limit cannot be printed");
    if (c->a.over) return oom(c, line);
    return fail(c, HR_ERR_RANGE, line, "the output grew past the limit (%zu bytes)", c->lim.max_output_bytes);
}

static jbuf new_buf(ctx *c) { return (jbuf){.a = &c->a, .limit = c->lim.max_output_bytes}; }

static bool mkstr(ctx *c, const char *p, size_t n, jv *out, int line) {
    *out = jv_str(&c->a, p, n);
    return out->t == JV_STR || oom(c, line);
}

static bool buf_to_str(ctx *c, jbuf *b, jv *out, int line) {
    if (!buf_ok(c, b, line)) return false;
    if (!b->p) return mkstr(c, "", 0, out, line);
    *out = (jv){.t = JV_STR};
    /* the buffer already lives in the arena: wrap it without a copy when it fits a jstr */
    return mkstr(c, b->p, b->n, out, line);
}

static bool to_str(ctx *c, jv v, jv *out, int line) {
    if (v.t == JV_STR) return *out = v, true;
    jbuf b = new_buf(c);
    jv_write_str(&b, v);
    return buf_to_str(c, &b, out, line);
}

/* ---- scopes ----------------------------------------------------------------------------------- */

static frame *push_frame(ctx *c, frame *parent) {
    frame *f = ja_alloc(&c->a, sizeof *f);
    if (f) f->parent = parent;
    return f;
}

static bool frame_set(ctx *c, frame *f, jstr *name, jv v, int line) {
    for (size_t i = 0; i < f->n; i++)
        if (f->names[i]->n == name->n && memcmp(f->names[i]->p, name->p, name->n) == 0) {
            f->vals[i] = v;
            return true;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        jstr **nn = ja_alloc(&c->a, cap * sizeof *nn);
        jv *nv = ja_alloc(&c->a, cap * sizeof *nv);
        if (!nn || !nv) return oom(c, line);
        if (f->n) {
            memcpy(nn, f->names, f->n * sizeof *nn);
            memcpy(nv, f->vals, f->n * sizeof *nv);
        }
        f->names = nn, f->vals = nv, f->cap = cap;
    }
    f->names[f->n] = name;
    f->vals[f->n++] = v;
    return true;
}

static bool frame_setz(ctx *c, frame *f, const char *name, jv v, int line) {
    jstr *s = js_new(&c->a, name, strlen(name));
    if (!s) return oom(c, line);
    return frame_set(c, f, s, v, line);
}

static jv lookup(ctx *c, frame *f, jstr *name) {
    for (; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (f->names[i]->n == name->n && memcmp(f->names[i]->p, name->p, name->n) == 0) return f->vals[i];
    const jv *g = jd_gets(c->globals, name->p, name->n);
    if (g) return *g;
    static const struct {
        const char *name;
        int fn;
    } builtins[] = {{"range", FN_RANGE},
                    {"namespace", FN_NAMESPACE},
                    {"raise_exception", FN_RAISE},
                    {"strftime_now", FN_STRFTIME},
                    {"dict", FN_DICT}};
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++)
        if (!strcmp(name->p, builtins[i].name)) return (jv){.t = JV_FUNC, .u.fn = builtins[i].fn};
    return jv_undef(name);
}

/* ---- strings: UTF-8 aware where Python counts code points ------------------------------------- */

static bool is_ascii(const jstr *s) {
    for (size_t i = 0; i < s->n; i++)
        if ((unsigned char)s->p[i] >= 0x80) return false;
    return true;
}

/* The byte length of the UTF-8 sequence that starts with byte c (1 for a stray continuation byte). */
static size_t u8len(unsigned char c) { return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

static size_t n_codepoints(const jstr *s) {
    size_t n = 0;
    for (size_t i = 0; i < s->n; i += u8len((unsigned char)s->p[i])) n++;
    return n;
}

/* Byte offsets of each code point, plus s->n at the end (count+1 entries). */
static size_t *cp_offsets(ctx *c, const jstr *s, size_t *count, int line) {
    size_t n = n_codepoints(s);
    size_t *off = ja_alloc(&c->a, (n + 1) * sizeof *off);
    if (!off) return oom(c, line), NULL;
    size_t k = 0;
    for (size_t i = 0; i < s->n; i += u8len((unsigned char)s->p[i])) off[k++] = i;
    off[n] = s->n;
    *count = n;
    return off;
}

static uint32_t decode_at(const char *p, size_t n, size_t *len) {
    unsigned char c = (unsigned char)p[0];
    size_t l = u8len(c);
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
static const char *memfind(const char *h, size_t hn, const char *n, size_t nn) {
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
            size_t k;
            if (m < 0x80)
                t[0] = (char)m, k = 1;
            else if (m < 0x800)
                t[0] = (char)(0xC0 | m >> 6), t[1] = (char)(0x80 | (m & 0x3F)), k = 2;
            else
                t[0] = (char)(0xE0 | m >> 12), t[1] = (char)(0x80 | ((m >> 6) & 0x3F)),
                t[2] = (char)(0x80 | (m & 0x3F)), k = 3;
            jb_put(&b, t, k);
        }
        prev_cased = cased;
        i += len;
    }
    return buf_to_str(c, &b, out, line);
}

/* ---- evaluation ------------------------------------------------------------------------------- */

static bool eval(ctx *c, frame *f, const jnode *nd, jv *out);
static bool exec_body(ctx *c, frame *f, jnode *const *body, size_t n);
static bool call_value(ctx *c, frame *f, jv callee, jv *args, size_t n_args, jstr **kw, jv *kw_vals, size_t n_kw,
                       jv *out, int line);

static bool require_defined(ctx *c, jv v, int line) {
    if (v.t != JV_UNDEF) return true;
    return fail(c, HR_ERR_INVALID_ARG, line, "'%s' is undefined", v.u.s ? v.u.s->p : "value");
}

static bool get_attr(ctx *c, jv obj, const char *name, size_t n, jv *out, int line);

static const char *const k_str_methods[] = {
    "startswith", "endswith", "strip", "lstrip", "rstrip", "split",   "upper",   "lower",   "title", "capitalize",
    "replace",    "find",     "count", "join",   "rsplit", "isdigit", "isalpha", "isspace", NULL};
static const char *const k_dict_methods[] = {"items", "keys", "values", "get", NULL};

static const char *method_name(const char *const *names, const char *name, size_t n) {
    for (; *names; names++)
        if (strlen(*names) == n && memcmp(*names, name, n) == 0) return *names;
    return NULL;
}

static bool bind_method(ctx *c, jv self, const char *name, jv *out, int line) {
    struct jmethod *m = ja_alloc(&c->a, sizeof *m);
    if (!m) return oom(c, line);
    m->self = self, m->name = name;
    *out = (jv){.t = JV_METHOD, .u.bm = m};
    return true;
}

static bool loop_attr(ctx *c, struct jloop *l, const char *name, jv *out, int line) {
    size_t n = l->items->n, i = l->i;
    if (!strcmp(name, "index"))
        *out = jv_int((int64_t)i + 1);
    else if (!strcmp(name, "index0"))
        *out = jv_int((int64_t)i);
    else if (!strcmp(name, "revindex"))
        *out = jv_int((int64_t)(n - i));
    else if (!strcmp(name, "revindex0"))
        *out = jv_int((int64_t)(n - i - 1));
    else if (!strcmp(name, "first"))
        *out = jv_bool(i == 0);
    else if (!strcmp(name, "last"))
        *out = jv_bool(i + 1 == n);
    else if (!strcmp(name, "length"))
        *out = jv_int((int64_t)n);
    else if (!strcmp(name, "depth"))
        *out = jv_int(1);
    else if (!strcmp(name, "depth0"))
        *out = jv_int(0);
    else if (!strcmp(name, "previtem"))
        *out = i > 0 ? l->items->v[i - 1] : jv_undef(NULL);
    else if (!strcmp(name, "nextitem"))
        *out = i + 1 < n ? l->items->v[i + 1] : jv_undef(NULL);
    else if (!strcmp(name, "cycle"))
        return bind_method(c, (jv){.t = JV_LOOP, .u.loop = l}, "cycle", out, line);
    else
        *out = jv_undef(NULL);
    return true;
}

/* Jinja's getattr: an object's attribute (a method) first, then its item. */
static bool get_attr(ctx *c, jv obj, const char *name, size_t n, jv *out, int line) {
    const char *m;
    switch (obj.t) {
    case JV_UNDEF:
        return fail(c, HR_ERR_INVALID_ARG, line, "'%s' is undefined (reading its attribute '%.*s')",
                    obj.u.s ? obj.u.s->p : "value", (int)n, name);
    case JV_DICT:
        if ((m = method_name(k_dict_methods, name, n))) return bind_method(c, obj, m, out, line);
        /* fall through */
    case JV_NS: {
        if (!charge(c, obj.u.d->n * 8, line)) return false;
        const jv *v = jd_gets(obj.u.d, name, n);
        *out = v ? *v : jv_undef(NULL);
        return true;
    }
    case JV_STR:
        if ((m = method_name(k_str_methods, name, n))) return bind_method(c, obj, m, out, line);
        break;
    case JV_LOOP: {
        char nm[32];
        if (n >= sizeof nm) break;
        memcpy(nm, name, n);
        nm[n] = '\0';
        return loop_attr(c, obj.u.loop, nm, out, line);
    }
    default: break;
    }
    *out = jv_undef(NULL);
    return true;
}

/* Python's index rules: negative counts from the end; false when out of range. */
static bool norm_index(int64_t i, size_t n, size_t *out) {
    if (i < 0) i += (int64_t)n;
    if (i < 0 || (uint64_t)i >= n) return false;
    *out = (size_t)i;
    return true;
}

static bool get_item(ctx *c, jv obj, jv key, jv *out, int line) {
    if (obj.t == JV_UNDEF) return require_defined(c, obj, line);
    if ((obj.t == JV_LIST || obj.t == JV_STR) && (key.t == JV_INT || key.t == JV_BOOL)) {
        int64_t i = key.t == JV_INT ? key.u.i : key.u.b;
        size_t k;
        if (obj.t == JV_LIST) {
            *out = norm_index(i, obj.u.l->n, &k) ? obj.u.l->v[k] : jv_undef(NULL);
            return true;
        }
        if (!charge(c, obj.u.s->n, line)) return false;
        size_t cnt, *off = cp_offsets(c, obj.u.s, &cnt, line);
        if (!off) return false;
        if (!norm_index(i, cnt, &k)) return *out = jv_undef(NULL), true;
        return mkstr(c, obj.u.s->p + off[k], off[k + 1] - off[k], out, line);
    }
    if (obj.t == JV_DICT || obj.t == JV_NS) {
        if (!charge(c, obj.u.d->n * 8, line)) return false;
        const jv *v = jd_get(obj.u.d, key);
        if (v) return *out = *v, true;
    }
    if (key.t == JV_STR) return get_attr(c, obj, key.u.s->p, key.u.s->n, out, line);
    *out = jv_undef(NULL);
    return true;
}

/* Python's slice of n items: the indices taken, in order, into idx (caller frees nothing: arena). */
static bool slice_indices(ctx *c, size_t n, const jv *lo, const jv *hi, const jv *st, size_t **idx, size_t *count,
                          int line) {
    int64_t stride = 1;
    if (st && st->t != JV_NONE) {
        if (st->t != JV_INT) return fail(c, HR_ERR_INVALID_ARG, line, "slice step must be an integer");
        stride = st->u.i;
        if (stride == 0) return fail(c, HR_ERR_INVALID_ARG, line, "slice step cannot be zero");
    }
    int64_t N = (int64_t)n, start, stop;
    for (int k = 0; k < 2; k++) {
        const jv *b = k ? hi : lo;
        int64_t *dst = k ? &stop : &start;
        if (!b || b->t == JV_NONE) {
            *dst = stride > 0 ? (k ? N : 0) : (k ? -1 : N - 1);
            continue;
        }
        if (b->t != JV_INT) return fail(c, HR_ERR_INVALID_ARG, line, "slice indices must be integers");
        int64_t v = b->u.i;
        if (v < 0) v += N;
        if (stride > 0)
            v = v < 0 ? 0 : v > N ? N : v;
        else
            v = v < -1 ? -1 : v > N - 1 ? N - 1 : v;
        *dst = v;
    }
    /* counted in unsigned arithmetic: a step near 2**63 (either sign) must not overflow */
    uint64_t span = stride > 0 ? (stop > start ? (uint64_t)(stop - start) : 0)
                               : (start > stop ? (uint64_t)(start - stop) : 0);
    uint64_t ustride = stride > 0 ? (uint64_t)stride : (uint64_t)0 - (uint64_t)stride;
    size_t cnt = span ? (size_t)((span - 1) / ustride + 1) : 0;
    size_t *ix = ja_alloc(&c->a, (cnt + 1) * sizeof *ix);
    if (!ix) return oom(c, line);
    for (size_t i = 0; i < cnt; i++) ix[i] = (size_t)(start + (int64_t)i * stride);
    *idx = ix, *count = cnt;
    return step(c, cnt / 8, line);
}

static bool do_slice(ctx *c, jv obj, const jv *lo, const jv *hi, const jv *st, jv *out, int line) {
    size_t *ix, cnt;
    if (obj.t == JV_LIST) {
        if (!slice_indices(c, obj.u.l->n, lo, hi, st, &ix, &cnt, line)) return false;
        jlist *l = jl_new(&c->a, cnt);
        if (!l) return oom(c, line);
        for (size_t i = 0; i < cnt; i++) l->v[i] = obj.u.l->v[ix[i]];
        l->n = cnt;
        *out = (jv){.t = JV_LIST, .u.l = l};
        return true;
    }
    if (obj.t == JV_STR) {
        if (!charge(c, obj.u.s->n, line)) return false;
        size_t n, *off = is_ascii(obj.u.s) ? NULL : cp_offsets(c, obj.u.s, &n, line);
        if (!off) {
            if (c->st) return false;
            n = obj.u.s->n;
        }
        if (!slice_indices(c, n, lo, hi, st, &ix, &cnt, line)) return false;
        jbuf b = new_buf(c);
        jb_put(&b, "", 0);
        for (size_t i = 0; i < cnt; i++) {
            size_t s0 = off ? off[ix[i]] : ix[i], s1 = off ? off[ix[i] + 1] : ix[i] + 1;
            jb_put(&b, obj.u.s->p + s0, s1 - s0);
        }
        return buf_to_str(c, &b, out, line);
    }
    if (obj.t == JV_UNDEF) return require_defined(c, obj, line);
    return fail(c, HR_ERR_INVALID_ARG, line, "cannot slice a %s", jv_type_name(obj));
}

/* The items a for loop, join, map, ... walk: a list's items, a dict's keys, a string's characters. */
static bool iter_items(ctx *c, jv v, jlist **out, int line) {
    if (v.t == JV_LIST) return *out = v.u.l, true;
    if (v.t == JV_UNDEF) {
        *out = jl_new(&c->a, 0);
        return *out || oom(c, line);
    }
    if (v.t == JV_DICT || v.t == JV_NS) {
        jlist *l = jl_new(&c->a, v.u.d->n);
        if (!l) return oom(c, line);
        if (v.u.d->n) memcpy(l->v, v.u.d->k, v.u.d->n * sizeof(jv));
        l->n = v.u.d->n;
        return *out = l, true;
    }
    if (v.t == JV_STR) {
        if (!charge(c, v.u.s->n * 8, line)) return false;
        jlist *l = jl_new(&c->a, 0);
        if (!l) return oom(c, line);
        for (size_t i = 0; i < v.u.s->n;) {
            size_t len = u8len((unsigned char)v.u.s->p[i]);
            if (len > v.u.s->n - i) len = v.u.s->n - i;
            jv ch;
            if (!mkstr(c, v.u.s->p + i, len, &ch, line)) return false;
            if (!jl_push(&c->a, l, ch)) return oom(c, line);
            i += len;
        }
        return *out = l, true;
    }
    return fail(c, HR_ERR_INVALID_ARG, line, "a %s is not iterable", jv_type_name(v));
}

static bool is_numeric(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static double as_double(jv v) { return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : (double)v.u.b; }
static int64_t as_int(jv v) { return v.t == JV_INT ? v.u.i : v.u.b; }

/* <, <=, >, >= on numbers or strings (bytewise order of UTF-8 is code point order). */
static bool compare(ctx *c, int op, jv a, jv b, bool *res, int line) {
    int cmp;
    if (is_numeric(a) && is_numeric(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
            int64_t x = as_int(a), y = as_int(b);
            cmp = x < y ? -1 : x > y;
        } else {
            double x = as_double(a), y = as_double(b);
            cmp = x < y ? -1 : x > y;
        }
    } else if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = a.u.s->n < b.u.s->n ? a.u.s->n : b.u.s->n;
        if (!charge(c, n, line)) return false;
        cmp = memcmp(a.u.s->p, b.u.s->p, n);
        if (cmp == 0) cmp = a.u.s->n < b.u.s->n ? -1 : a.u.s->n > b.u.s->n;
    } else {
        return fail(c, HR_ERR_INVALID_ARG, line, "cannot compare a %s with a %s", jv_type_name(a), jv_type_name(b));
    }
    *res = op == JOP_LT ? cmp < 0 : op == JOP_LE ? cmp <= 0 : op == JOP_GT ? cmp > 0 : cmp >= 0;
    return true;
}

/* Python's == with its work charged: deep lists and long strings cost what they take. */
static bool equal(ctx *c, jv a, jv b, bool *res, int line) {
    uint64_t work = 0, left = c->lim.max_steps > c->steps ? c->lim.max_steps - c->steps : 0;
    uint64_t cap = left > UINT64_MAX / 16 ? UINT64_MAX / 2 : left * 8 + 8; /* what the step limit leaves */
    *res = jv_equal_work(a, b, &work, cap, 0);
    if (work == UINT64_MAX) return fail(c, HR_ERR_RANGE, line, "values nested deeper than the limit");
    return step(c, (work + 7) / 8, line); /* at least one step: a list scan is never free */
}

static bool contains(ctx *c, jv hay, jv needle, bool *res, int line) {
    if (hay.t == JV_STR) {
        if (needle.t != JV_STR) return fail(c, HR_ERR_INVALID_ARG, line, "'in <string>' needs a string on the left");
        if (!charge(c, hay.u.s->n, line)) return false;
        *res = memfind(hay.u.s->p, hay.u.s->n, needle.u.s->p, needle.u.s->n) != NULL;
        return true;
    }
    if (hay.t == JV_LIST) {
        *res = false;
        for (size_t i = 0; i < hay.u.l->n && !*res; i++)
            if (!equal(c, hay.u.l->v[i], needle, res, line)) return false;
        return true;
    }
    if (hay.t == JV_DICT || hay.t == JV_NS) {
        if (!step(c, hay.u.d->n / 8, line)) return false;
        *res = jd_get(hay.u.d, needle) != NULL;
        return true;
    }
    if (hay.t == JV_UNDEF) return require_defined(c, hay, line);
    return fail(c, HR_ERR_INVALID_ARG, line, "'in' needs a string, list or dict, not a %s", jv_type_name(hay));
}

static bool repeat(ctx *c, jv seq, int64_t times, jv *out, int line) {
    if (times < 0) times = 0;
    size_t n = seq.t == JV_STR ? seq.u.s->n : seq.u.l->n;
    if (n == 0) times = 0; /* '' * 2**62 is '' at once, not 2**62 turns of a loop */
    if (seq.t == JV_STR) {
        if (n && (uint64_t)times > c->lim.max_output_bytes / n)
            return fail(c, HR_ERR_RANGE, line, "string repetition past the output limit");
        if (!charge(c, seq.u.s->n * (size_t)times, line)) return false;
        jbuf b = new_buf(c);
        jb_put(&b, "", 0);
        for (int64_t i = 0; i < times; i++) jb_put(&b, seq.u.s->p, seq.u.s->n);
        return buf_to_str(c, &b, out, line);
    }
    if (n && (uint64_t)times > c->lim.max_steps / n) /* divided: the product may not fit */
        return fail(c, HR_ERR_RANGE, line, "list repetition longer than the step limit");
    jlist *l = jl_new(&c->a, seq.u.l->n * (size_t)times);
    if (!l) return oom(c, line);
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < seq.u.l->n; k++) l->v[l->n++] = seq.u.l->v[k];
    *out = (jv){.t = JV_LIST, .u.l = l};
    return step(c, l->n / 8, line);
}

static bool arith(ctx *c, int op, jv a, jv b, jv *out, int line) {
    if (op == JOP_CONCAT) {
        jbuf buf = new_buf(c);
        jb_put(&buf, "", 0);
        jv_write_str(&buf, a);
        jv_write_str(&buf, b);
        if (!charge(c, buf.n, line)) return false;
        return buf_to_str(c, &buf, out, line);
    }
    if (a.t == JV_UNDEF) return require_defined(c, a, line);
    if (b.t == JV_UNDEF) return require_defined(c, b, line);
    if (op == JOP_ADD && a.t == JV_STR && b.t == JV_STR) {
        if (!charge(c, a.u.s->n + b.u.s->n, line)) return false;
        jbuf buf = new_buf(c);
        jb_put(&buf, "", 0);
        jb_put(&buf, a.u.s->p, a.u.s->n);
        jb_put(&buf, b.u.s->p, b.u.s->n);
        return buf_to_str(c, &buf, out, line);
    }
    if (op == JOP_ADD && a.t == JV_LIST && b.t == JV_LIST) {
        jlist *l = jl_new(&c->a, a.u.l->n + b.u.l->n);
        if (!l) return oom(c, line);
        if (a.u.l->n) memcpy(l->v, a.u.l->v, a.u.l->n * sizeof(jv));
        if (b.u.l->n) memcpy(l->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof(jv));
        l->n = a.u.l->n + b.u.l->n;
        *out = (jv){.t = JV_LIST, .u.l = l};
        return step(c, l->n / 8, line);
    }
    if (op == JOP_MUL && (a.t == JV_STR || a.t == JV_LIST) && (b.t == JV_INT || b.t == JV_BOOL))
        return repeat(c, a, as_int(b), out, line);
    if (op == JOP_MUL && (b.t == JV_STR || b.t == JV_LIST) && (a.t == JV_INT || a.t == JV_BOOL))
        return repeat(c, b, as_int(a), out, line);
    if (!is_numeric(a) || !is_numeric(b))
        return fail(c, HR_ERR_INVALID_ARG, line, "unsupported operand types: %s and %s", jv_type_name(a),
                    jv_type_name(b));
    bool ints = a.t != JV_FLOAT && b.t != JV_FLOAT;
    if (ints && op != JOP_DIV && op != JOP_POW) {
        int64_t x = as_int(a), y = as_int(b), r = 0;
        switch (op) {
        case JOP_ADD:
            if (__builtin_add_overflow(x, y, &r)) return fail(c, HR_ERR_RANGE, line, "integer overflow");
            break;
        case JOP_SUB:
            if (__builtin_sub_overflow(x, y, &r)) return fail(c, HR_ERR_RANGE, line, "integer overflow");
            break;
        case JOP_MUL:
            if (__builtin_mul_overflow(x, y, &r)) return fail(c, HR_ERR_RANGE, line, "integer overflow");
            break;
        case JOP_FLOORDIV:
        case JOP_MOD:
            if (y == 0) return fail(c, HR_ERR_INVALID_ARG, line, "division by zero");
            if (x == INT64_MIN && y == -1) return fail(c, HR_ERR_RANGE, line, "integer overflow");
            r = op == JOP_FLOORDIV ? x / y : x % y;
            if (op == JOP_FLOORDIV && (x % y != 0) && ((x < 0) != (y < 0))) r--;
            if (op == JOP_MOD && r != 0 && ((r < 0) != (y < 0))) r += y;
            break;
        default: break;
        }
        *out = jv_int(r);
        return true;
    }
    if (ints && op == JOP_POW && as_int(b) >= 0) {
        int64_t x = as_int(a), e = as_int(b), r = 1;
        for (int64_t i = 0; i < e; i++) {
            if (__builtin_mul_overflow(r, x, &r)) return fail(c, HR_ERR_RANGE, line, "integer overflow");
            if (r == 0 || r == 1) break;
            if (i > 64 && (x == 1 || x == -1 || x == 0)) break;
        }
        if ((x == -1) && (e % 2 == 0))
            r = 1;
        else if (x == -1)
            r = -1;
        *out = jv_int(r);
        return true;
    }
    double x = as_double(a), y = as_double(b), r;
    switch (op) {
    case JOP_ADD: r = x + y; break;
    case JOP_SUB: r = x - y; break;
    case JOP_MUL: r = x * y; break;
    case JOP_DIV:
        if (y == 0) return fail(c, HR_ERR_INVALID_ARG, line, "division by zero");
        r = x / y;
        break;
    case JOP_FLOORDIV:
        if (y == 0) return fail(c, HR_ERR_INVALID_ARG, line, "division by zero");
        r = floor(x / y);
        break;
    case JOP_MOD:
        if (y == 0) return fail(c, HR_ERR_INVALID_ARG, line, "division by zero");
        r = fmod(x, y);
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        break;
    default:
        /* Python: 0 ** -1 (int or float) raises ZeroDivisionError, where C's pow gives inf */
        if (x == 0 && y < 0) return fail(c, HR_ERR_INVALID_ARG, line, "zero to a negative power");
        r = pow(x, y);
        break;
    }
    *out = (jv){.t = JV_FLOAT, .u.f = r};
    return true;
}

/* Evaluates a call's arguments into arena arrays. */
static bool eval_args(ctx *c, frame *f, const jnode *nd, jv **args, jv **kw_vals) {
    *args = nd->n_items ? ja_alloc(&c->a, nd->n_items * sizeof(jv)) : NULL;
    *kw_vals = nd->n_kw ? ja_alloc(&c->a, nd->n_kw * sizeof(jv)) : NULL;
    if ((nd->n_items && !*args) || (nd->n_kw && !*kw_vals)) return oom(c, nd->line);
    for (size_t i = 0; i < nd->n_items; i++)
        if (!eval(c, f, nd->items[i], &(*args)[i])) return false;
    for (size_t i = 0; i < nd->n_kw; i++)
        if (!eval(c, f, nd->kw_vals[i], &(*kw_vals)[i])) return false;
    return true;
}

/* Argument i, or keyword name, or NULL. */
static const jv *arg(jv *args, size_t n, jstr **kw, jv *kv, size_t nk, size_t i, const char *name) {
    if (i < n) return &args[i];
    for (size_t k = 0; k < nk; k++)
        if (!strcmp(kw[k]->p, name)) return &kv[k];
    return NULL;
}

/* ---- tests ------------------------------------------------------------------------------------ */

static bool run_test(ctx *c, const char *name, jv v, jv *args, size_t n, bool *res, int line) {
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
        if (!equal(c, v, *a0, res, line)) return false;
        if (name[0] == 's') *res = *res && v.t == a0->t;
    } else if (!strcmp(name, "ne") || !strcmp(name, "!=")) {
        if (!a0) return fail(c, HR_ERR_INVALID_ARG, line, "'%s' needs an argument", name);
        if (!equal(c, v, *a0, res, line)) return false;
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
        return compare(c, op, v, *a0, res, line);
    } else if (!strcmp(name, "in")) {
        if (!a0) return fail(c, HR_ERR_INVALID_ARG, line, "'in' needs an argument");
        return contains(c, *a0, v, res, line);
    } else if (!strcmp(name, "escaped"))
        *res = false;
    else
        return fail(c, HR_ERR_UNSUPPORTED, line, "the test '%s' is not supported", name);
    return true;
}

/* ---- filters ---------------------------------------------------------------------------------- */

static bool apply_filter(ctx *c, frame *f, const char *name, jv v, jv *args, size_t n, jstr **kw, jv *kv, size_t nk,
                         jv *out, int line);

/* select/reject/selectattr/rejectattr: keep the items whose (attribute's) test result is want. */
static bool filter_select(ctx *c, jv v, jv *args, size_t n, bool attr, bool want, jv *out, int line) {
    jlist *items, *res;
    if (!iter_items(c, v, &items, line)) return false;
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
                if (!get_item(c, x, key, &x, line)) return false;
                if (!dot) break;
                p = dot + 1;
            }
        }
        bool r;
        if (test) {
            if (!run_test(c, test, x, args + first + 1, n > first + 1 ? n - first - 1 : 0, &r, line)) return false;
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
    if (!iter_items(c, v, &items, line)) return false;
    jbuf b = new_buf(c);
    jb_put(&b, "", 0);
    for (size_t i = 0; i < items->n; i++) {
        if (!step(c, 1, line)) return false;
        if (i && sep) jv_write_str(&b, *sep);
        jv x = items->v[i];
        if (attr && attr->t == JV_STR && !get_item(c, x, *attr, &x, line)) return false;
        jv_write_str(&b, x);
    }
    if (!charge(c, b.n, line)) return false;
    return buf_to_str(c, &b, out, line);
}

static bool filter_map(ctx *c, frame *f, jv v, jv *args, size_t n, jstr **kw, jv *kv, size_t nk, jv *out, int line) {
    jlist *items, *res;
    if (!iter_items(c, v, &items, line)) return false;
    if (!(res = jl_new(&c->a, items->n))) return oom(c, line);
    const jv *attr = arg(NULL, 0, kw, kv, nk, 0, "attribute");
    const jv *def = arg(NULL, 0, kw, kv, nk, 0, "default");
    if (!attr && (n < 1 || args[0].t != JV_STR))
        return fail(c, HR_ERR_INVALID_ARG, line, "map needs a filter name or attribute=");
    for (size_t i = 0; i < items->n; i++) {
        if (!step(c, 1, line)) return false;
        jv x = items->v[i], r;
        if (attr) {
            if (!get_item(c, x, *attr, &r, line)) return false;
            if (r.t == JV_UNDEF && def) r = *def;
        } else if (!apply_filter(c, f, args[0].u.s->p, x, args + 1, n - 1, NULL, NULL, 0, &r, line)) {
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
        for (size_t i = 0; i <= s->n; i += i < s->n ? u8len((unsigned char)s->p[i]) : 1) {
            if (limit < 0 || done < limit) jb_put(&b, new_->u.s->p, new_->u.s->n), done++;
            if (i < s->n)
                jb_put(&b, s->p + i,
                       u8len((unsigned char)s->p[i]) <= s->n - i ? u8len((unsigned char)s->p[i]) : s->n - i);
            if (!buf_ok(c, &b, line)) return false;
        }
        return buf_to_str(c, &b, out, line);
    }
    while (p < end) {
        const char *hit = (limit < 0 || done < limit) ? memfind(p, (size_t)(end - p), old->u.s->p, old->u.s->n) : NULL;
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
    if (!iter_items(c, v, &items, line)) return false;
    *out = (jv){.t = JV_LIST, .u.l = items};
    return true;
}

static bool apply_filter(ctx *c, frame *f, const char *name, jv v, jv *args, size_t n, jstr **kw, jv *kv, size_t nk,
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
        if (!iter_items(c, v, &items, line)) return false;
        *out = items->n ? items->v[name[0] == 'f' ? 0 : items->n - 1] : jv_undef(NULL);
        return true;
    }
    if (!strcmp(name, "reverse")) {
        jv none = jv_none(), neg = jv_int(-1);
        if (v.t == JV_STR || v.t == JV_LIST) return do_slice(c, v, &none, &none, &neg, out, line);
        jlist *items;
        if (!list_of(c, v, out, line)) return false;
        items = out->u.l;
        return do_slice(c, (jv){.t = JV_LIST, .u.l = items}, &none, &none, &neg, out, line);
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
            const char *hit = (max < 0 || done < max) ? memfind(p, (size_t)(end - p), sep->u.s->p, sep->u.s->n) : NULL;
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

static bool call_method(ctx *c, frame *f, struct jmethod *m, jv *args, size_t n, jstr **kw, jv *kv, size_t nk, jv *out,
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
        return apply_filter(c, f, name, self, NULL, 0, NULL, NULL, 0, out, line);
    if (!strcmp(name, "replace")) return filter_replace(c, s, a0, a1, arg(args, n, NULL, NULL, 0, 2, ""), out, line);
    if (!strcmp(name, "find") || !strcmp(name, "count")) {
        if (!a0 || a0->t != JV_STR) return fail(c, HR_ERR_INVALID_ARG, line, "%s needs a string", name);
        if (name[0] == 'f') {
            const char *hit = memfind(s->p, s->n, a0->u.s->p, a0->u.s->n);
            if (!hit) return *out = jv_int(-1), true;
            jstr pre = {0};
            (void)pre;
            size_t cps = 0;
            for (const char *q = s->p; q < hit; q += u8len((unsigned char)*q)) cps++;
            return *out = jv_int((int64_t)cps), true;
        }
        int64_t cnt = 0;
        if (a0->u.s->n == 0) return *out = jv_int((int64_t)n_codepoints(s) + 1), true;
        for (const char *q = s->p, *hit; (hit = memfind(q, (size_t)(s->p + s->n - q), a0->u.s->p, a0->u.s->n));
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

static bool call_func(ctx *c, int fn, jv *args, size_t n, jstr **kw, jv *kv, size_t nk, jv *out, int line) {
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

/* Calls a macro: a new scope over the macro's own, its parameters bound from the arguments. */
static bool call_macro(ctx *c, struct jmacro *m, jv *args, size_t n, jstr **kw, jv *kv, size_t nk, jv caller, jv *out,
                       int line) {
    const jnode *def = m->def;
    if (++c->depth > c->lim.max_depth) return fail(c, HR_ERR_RANGE, line, "macro calls nested deeper than the limit");
    if (n > def->n_items)
        return fail(c, HR_ERR_INVALID_ARG, line, "a macro got %zu arguments for %zu parameters", n, def->n_items);
    frame *mf = push_frame(c, m->closure);
    if (!mf) return oom(c, line);
    for (size_t i = 0; i < def->n_items; i++) {
        jstr *pname = def->items[i]->name;
        const jv *v = i < n ? &args[i] : NULL;
        for (size_t k = 0; !v && k < nk; k++)
            if (kw[k]->n == pname->n && !memcmp(kw[k]->p, pname->p, pname->n)) v = &kv[k];
        jv val;
        if (v)
            val = *v;
        else if (def->items2 && def->items2[i]) {
            if (!eval(c, mf, def->items2[i], &val)) return false;
        } else
            val = jv_undef(pname);
        if (!frame_set(c, mf, pname, val, line)) return false;
    }
    if (caller.t == JV_MACRO && !frame_setz(c, mf, "caller", caller, line)) return false;
    jbuf b = new_buf(c);
    jb_put(&b, "", 0);
    jbuf *saved = c->out;
    int saved_brk = c->brk;
    c->out = &b;
    bool ok = exec_body(c, mf, def->body, def->n_body);
    c->out = saved;
    c->brk = saved_brk;
    c->depth--;
    if (!ok) return false;
    return buf_to_str(c, &b, out, line);
}

static bool call_value(ctx *c, frame *f, jv callee, jv *args, size_t n, jstr **kw, jv *kv, size_t nk, jv *out,
                       int line) {
    if (!step(c, 1, line)) return false;
    jv caller = c->pending_caller;
    c->pending_caller = jv_undef(NULL);
    switch (callee.t) {
    case JV_MACRO: return call_macro(c, callee.u.m, args, n, kw, kv, nk, caller, out, line);
    case JV_METHOD: return call_method(c, f, callee.u.bm, args, n, kw, kv, nk, out, line);
    case JV_FUNC: return call_func(c, callee.u.fn, args, n, kw, kv, nk, out, line);
    case JV_UNDEF:
        return fail(c, HR_ERR_UNSUPPORTED, line, "'%s' is undefined and cannot be called",
                    callee.u.s ? callee.u.s->p : "value");
    default: return fail(c, HR_ERR_INVALID_ARG, line, "a %s cannot be called", jv_type_name(callee));
    }
}

/* ---- expressions ------------------------------------------------------------------------------ */

static bool eval_inner(ctx *c, frame *f, const jnode *nd, jv *out) {
    jv a, b;
    int line = nd->line;
    switch (nd->kind) {
    case JN_LIT: *out = nd->lit; return true;
    case JN_NAME: *out = lookup(c, f, nd->name); return true;
    case JN_LIST:
    case JN_TUPLE: {
        jlist *l = jl_new(&c->a, nd->n_items);
        if (!l) return oom(c, line);
        for (size_t i = 0; i < nd->n_items; i++)
            if (!eval(c, f, nd->items[i], &l->v[i])) return false;
        l->n = nd->n_items;
        l->tuple = nd->kind == JN_TUPLE;
        *out = (jv){.t = JV_LIST, .u.l = l};
        return true;
    }
    case JN_DICT: {
        jdict *d = jd_new(&c->a, nd->n_items);
        if (!d) return oom(c, line);
        for (size_t i = 0; i < nd->n_items; i++) {
            if (!eval(c, f, nd->items[i], &a) || !eval(c, f, nd->items2[i], &b)) return false;
            if (!jd_set(&c->a, d, a, b)) return oom(c, line);
        }
        *out = (jv){.t = JV_DICT, .u.d = d};
        return true;
    }
    case JN_ATTR:
        if (!eval(c, f, nd->a, &a)) return false;
        return get_attr(c, a, nd->name->p, nd->name->n, out, line);
    case JN_ITEM:
        if (!eval(c, f, nd->a, &a) || !eval(c, f, nd->b, &b)) return false;
        return get_item(c, a, b, out, line);
    case JN_SLICE: {
        jv lo = jv_none(), hi = jv_none(), st = jv_none();
        if (!eval(c, f, nd->a, &a)) return false;
        if (nd->b && !eval(c, f, nd->b, &lo)) return false;
        if (nd->c && !eval(c, f, nd->c, &hi)) return false;
        if (nd->d && !eval(c, f, nd->d, &st)) return false;
        return do_slice(c, a, &lo, &hi, &st, out, line);
    }
    case JN_CALL: {
        jv *args, *kv;
        jv caller = c->pending_caller;
        c->pending_caller = jv_undef(NULL);
        if (!eval(c, f, nd->a, &a) || !eval_args(c, f, nd, &args, &kv)) return false;
        c->pending_caller = caller;
        return call_value(c, f, a, args, nd->n_items, nd->kw, kv, nd->n_kw, out, line);
    }
    case JN_FILTER: {
        jv *args, *kv;
        if (nd->a) {
            if (!eval(c, f, nd->a, &a)) return false;
        } else {
            a = c->block_value;
        }
        if (!eval_args(c, f, nd, &args, &kv)) return false;
        return apply_filter(c, f, nd->name->p, a, args, nd->n_items, nd->kw, kv, nd->n_kw, out, line);
    }
    case JN_TEST: {
        jv *args, *kv;
        bool r;
        if (!eval(c, f, nd->a, &a) || !eval_args(c, f, nd, &args, &kv)) return false;
        if (!run_test(c, nd->name->p, a, args, nd->n_items, &r, line)) return false;
        *out = jv_bool(nd->neg ? !r : r);
        return true;
    }
    case JN_UNARY:
        if (!eval(c, f, nd->a, &a)) return false;
        if (nd->op == 'n') return *out = jv_bool(!jv_truthy(a)), true;
        if (a.t == JV_INT || a.t == JV_BOOL) {
            int64_t x = as_int(a);
            if (nd->op == '-' && x == INT64_MIN) return fail(c, HR_ERR_RANGE, line, "integer overflow");
            return *out = jv_int(nd->op == '-' ? -x : x), true;
        }
        if (a.t == JV_FLOAT) return *out = (jv){.t = JV_FLOAT, .u.f = nd->op == '-' ? -a.u.f : a.u.f}, true;
        if (a.t == JV_UNDEF) return require_defined(c, a, line);
        return fail(c, HR_ERR_INVALID_ARG, line, "bad operand for unary %c: %s", nd->op, jv_type_name(a));
    case JN_AND:
        if (!eval(c, f, nd->a, &a)) return false;
        if (!jv_truthy(a)) return *out = a, true;
        return eval(c, f, nd->b, out);
    case JN_OR:
        if (!eval(c, f, nd->a, &a)) return false;
        if (jv_truthy(a)) return *out = a, true;
        return eval(c, f, nd->b, out);
    case JN_COND:
        if (!eval(c, f, nd->a, &a)) return false;
        if (jv_truthy(a)) return eval(c, f, nd->b, out);
        if (nd->c) return eval(c, f, nd->c, out);
        return *out = jv_undef(NULL), true;
    case JN_BINARY: {
        if (!eval(c, f, nd->a, &a) || !eval(c, f, nd->b, &b)) return false;
        bool r;
        switch (nd->op) {
        case JOP_EQ:
        case JOP_NE:
            if (!equal(c, a, b, &r, line)) return false;
            return *out = jv_bool(nd->op == JOP_EQ ? r : !r), true;
        case JOP_LT:
        case JOP_LE:
        case JOP_GT:
        case JOP_GE:
            if (!compare(c, nd->op, a, b, &r, line)) return false;
            return *out = jv_bool(r), true;
        case JOP_IN:
        case JOP_NOTIN:
            if (!contains(c, b, a, &r, line)) return false;
            return *out = jv_bool(nd->op == JOP_IN ? r : !r), true;
        default: return arith(c, nd->op, a, b, out, line);
        }
    }
    default: return fail(c, HR_ERR_INTERNAL, line, "bad expression node %d", nd->kind);
    }
}

static bool eval(ctx *c, frame *f, const jnode *nd, jv *out) {
    if (!step(c, 1, nd->line)) return false;
    if (++c->depth > c->lim.max_depth) return fail(c, HR_ERR_RANGE, nd->line, "nested deeper than the limit");
    bool ok = eval_inner(c, f, nd, out);
    c->depth--;
    return ok;
}

/* ---- statements ------------------------------------------------------------------------------- */

static bool emit(ctx *c, jv v, int line) {
    if (!step(c, 1, line)) return false;
    jv_write_str(c->out, v);
    return buf_ok(c, c->out, line);
}

static bool assign(ctx *c, frame *f, jnode *const *targets, size_t n, jv v, int line) {
    if (n == 1) return frame_set(c, f, targets[0]->name, v, line);
    jlist *items;
    if (v.t != JV_LIST) {
        if (!iter_items(c, v, &items, line)) return false;
    } else
        items = v.u.l;
    if (items->n != n) return fail(c, HR_ERR_INVALID_ARG, line, "cannot unpack %zu values into %zu names", items->n, n);
    for (size_t i = 0; i < n; i++)
        if (!frame_set(c, f, targets[i]->name, items->v[i], line)) return false;
    return true;
}

/* Renders body into a new string (block set, filter block, caller). */
static bool capture(ctx *c, frame *f, jnode *const *body, size_t n, jv *out, int line) {
    jbuf b = new_buf(c);
    jb_put(&b, "", 0);
    jbuf *saved = c->out;
    c->out = &b;
    bool ok = exec_body(c, f, body, n);
    c->out = saved;
    if (!ok) return false;
    return buf_to_str(c, &b, out, line);
}

static bool exec_for(ctx *c, frame *f, const jnode *nd) {
    jv it;
    jlist *items;
    if (!eval(c, f, nd->a, &it)) return false;
    if (it.t == JV_NONE) return fail(c, HR_ERR_INVALID_ARG, nd->line, "'NoneType' object is not iterable");
    if (!iter_items(c, it, &items, nd->line)) return false;
    frame *lf = push_frame(c, f);
    if (!lf) return oom(c, nd->line);
    if (nd->b) { /* {% for x in xs if cond %}: filter first, so loop.* count the kept items */
        jlist *kept = jl_new(&c->a, 0);
        if (!kept) return oom(c, nd->line);
        for (size_t i = 0; i < items->n; i++) {
            jv cond;
            if (!assign(c, lf, nd->items, nd->n_items, items->v[i], nd->line) || !eval(c, lf, nd->b, &cond))
                return false;
            if (jv_truthy(cond) && !jl_push(&c->a, kept, items->v[i])) return oom(c, nd->line);
        }
        items = kept;
    }
    struct jloop *loop = ja_alloc(&c->a, sizeof *loop);
    if (!loop) return oom(c, nd->line);
    loop->items = items;
    if (!frame_setz(c, lf, "loop", (jv){.t = JV_LOOP, .u.loop = loop}, nd->line)) return false;
    /* each turn has its own scope: what the body sets is gone at the next turn, as in Jinja2; the
       frame is emptied and reused, so a long loop takes no more memory per turn */
    frame *tf = push_frame(c, lf);
    if (!tf) return oom(c, nd->line);
    for (size_t i = 0; i < items->n; i++) {
        if (!step(c, 1, nd->line)) return false;
        loop->i = i;
        tf->n = 0;
        if (!assign(c, tf, nd->items, nd->n_items, items->v[i], nd->line)) return false;
        if (!exec_body(c, tf, nd->body, nd->n_body)) return false;
        int brk = c->brk;
        c->brk = 0;
        if (brk == 1) break;
    }
    if (items->n == 0 && nd->n_else) return exec_body(c, f, nd->else_body, nd->n_else);
    return true;
}

static bool exec_set(ctx *c, frame *f, const jnode *nd) {
    jv v;
    if (nd->a) {
        if (!eval(c, f, nd->a, &v)) return false;
    } else {
        if (!capture(c, f, nd->body, nd->n_body, &v, nd->line)) return false;
        if (nd->d) {
            jv saved = c->block_value;
            c->block_value = v;
            bool ok = eval(c, f, nd->d, &v);
            c->block_value = saved;
            if (!ok) return false;
        }
    }
    if (nd->c) { /* ns.attr = v */
        jv ns = lookup(c, f, nd->c->a->name);
        if (ns.t != JV_NS)
            return fail(c, HR_ERR_INVALID_ARG, nd->line, "cannot assign an attribute of a %s (only a namespace)",
                        jv_type_name(ns));
        jv key = {.t = JV_STR, .u.s = nd->c->name};
        if (!jd_set(&c->a, ns.u.d, key, v)) return oom(c, nd->line);
        return true;
    }
    return assign(c, f, nd->items, nd->n_items, v, nd->line);
}

static bool exec_stmt(ctx *c, frame *f, const jnode *nd) {
    jv v;
    switch (nd->kind) {
    case JN_TEXT: return emit(c, nd->lit, nd->line);
    case JN_OUTPUT: return eval(c, f, nd->a, &v) && emit(c, v, nd->line);
    case JN_IF:
        if (!eval(c, f, nd->a, &v)) return false;
        return jv_truthy(v) ? exec_body(c, f, nd->body, nd->n_body) : exec_body(c, f, nd->else_body, nd->n_else);
    case JN_FOR: return exec_for(c, f, nd);
    case JN_SET: return exec_set(c, f, nd);
    case JN_MACRO: {
        struct jmacro *m = ja_alloc(&c->a, sizeof *m);
        if (!m) return oom(c, nd->line);
        m->def = nd, m->closure = f;
        return frame_set(c, f, nd->name, (jv){.t = JV_MACRO, .u.m = m}, nd->line);
    }
    case JN_CALLBLOCK: {
        struct jmacro *m = ja_alloc(&c->a, sizeof *m);
        if (!m) return oom(c, nd->line);
        m->def = nd, m->closure = f;
        c->pending_caller = (jv){.t = JV_MACRO, .u.m = m};
        bool ok = eval(c, f, nd->a, &v);
        c->pending_caller = jv_undef(NULL);
        return ok && emit(c, v, nd->line);
    }
    case JN_FILTERBLOCK: {
        jv body;
        if (!capture(c, f, nd->body, nd->n_body, &body, nd->line)) return false;
        jv saved = c->block_value;
        c->block_value = body;
        bool ok = eval(c, f, nd->a, &v);
        c->block_value = saved;
        return ok && emit(c, v, nd->line);
    }
    case JN_BREAK: c->brk = 1; return true;
    case JN_CONTINUE: c->brk = 2; return true;
    default: return fail(c, HR_ERR_INTERNAL, nd->line, "bad statement node %d", nd->kind);
    }
}

static bool exec_body(ctx *c, frame *f, jnode *const *body, size_t n) {
    if (++c->depth > c->lim.max_depth)
        return fail(c, HR_ERR_RANGE, n ? body[0]->line : 0, "nested deeper than the limit");
    bool ok = true;
    for (size_t i = 0; i < n && ok && !c->brk; i++) ok = exec_stmt(c, f, body[i]);
    c->depth--;
    return ok;
}

/* ---- entry ------------------------------------------------------------------------------------ */

hr_status hr_jinja_render(const hr_jinja *t, const char *context_json, const hr_jinja_limits *limits, char **out,
                          size_t *out_len, hr_error *err) {
    if (!t || !out) return hr_error_set(err, HR_ERR_INVALID_ARG, "hr_jinja_render: NULL argument");
    ctx c = {.lim = limits ? jinja_limits_or_default(limits) : t->limits, .err = err, .st = HR_OK};
    c.a.cap = c.lim.max_memory_bytes;
    c.pending_caller = jv_undef(NULL);
    c.block_value = jv_undef(NULL);
    jv root;
    char jerr[128] = "";
    const char *js = context_json ? context_json : "{}";
    hr_status st;
    if (!jv_parse_json(&c.a, js, strlen(js), &root, c.lim.max_depth, jerr, sizeof jerr) || root.t != JV_DICT) {
        st = c.a.nomem  ? hr_error_set(err, HR_ERR_NOMEM, "out of memory")
             : c.a.over ? hr_error_set(err, HR_ERR_RANGE, "the template context is larger than the memory limit")
                        : hr_error_set(err, HR_ERR_FORMAT, "the template context is not a JSON object (%s)",
                                       root.t != JV_DICT && !jerr[0] ? "another value" : jerr);
        ja_free(&c.a);
        return st;
    }
    c.globals = root.u.d;
    jbuf b = new_buf(&c);
    jb_put(&b, "", 0);
    c.out = &b;
    frame *top = push_frame(&c, NULL);
    bool ok = top && exec_body(&c, top, t->body, t->n_body);
    if (!top) oom(&c, 0);
    if (ok && !buf_ok(&c, &b, 0)) ok = false;
    if (!ok) {
        st = c.st != HR_OK ? c.st : hr_error_set(err, HR_ERR_NOMEM, "out of memory");
        ja_free(&c.a);
        return st;
    }
    char *s = malloc(b.n + 1);
    if (!s) {
        ja_free(&c.a);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    }
    memcpy(s, b.p ? b.p : "", b.n);
    s[b.n] = '\0';
    ja_free(&c.a);
    *out = s;
    if (out_len) *out_len = b.n;
    return HR_OK;
}

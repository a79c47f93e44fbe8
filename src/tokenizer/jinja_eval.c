/* jinja_eval.c: renders a parsed template (see jinja.h): scopes, expressions with Python's
 * semantics, statements (the filters, tests, methods and globals: jinja_builtins.c).
 *
 * Invariants: every allocation comes from the render's arena (capped: limits.max_memory_bytes);
 * every node evaluated, loop turn taken and 64 bytes scanned costs a step (capped:
 * limits.max_steps); output buffers are capped at limits.max_output_bytes; expression, statement
 * and macro nesting at limits.max_depth. Reaching any cap stops the render with HR_ERR_RANGE. The
 * first error wins: once ctx->st is set every evaluator returns false without doing more. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/jinja_eval_internal.h"

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

bool je_get_item(ctx *c, jv obj, jv key, jv *out, int line) {
    if (obj.t == JV_UNDEF) return require_defined(c, obj, line);
    if ((obj.t == JV_LIST || obj.t == JV_STR) && (key.t == JV_INT || key.t == JV_BOOL)) {
        int64_t i = key.t == JV_INT ? key.u.i : key.u.b;
        size_t k;
        if (obj.t == JV_LIST) {
            *out = norm_index(i, obj.u.l->n, &k) ? obj.u.l->v[k] : jv_undef(NULL);
            return true;
        }
        if (!charge(c, obj.u.s->n, line)) return false;
        size_t cnt, *off = je_cp_offsets(c, obj.u.s, &cnt, line);
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
    uint64_t span =
        stride > 0 ? (stop > start ? (uint64_t)(stop - start) : 0) : (start > stop ? (uint64_t)(start - stop) : 0);
    uint64_t ustride = stride > 0 ? (uint64_t)stride : (uint64_t)0 - (uint64_t)stride;
    size_t cnt = span ? (size_t)((span - 1) / ustride + 1) : 0;
    size_t *ix = ja_alloc(&c->a, (cnt + 1) * sizeof *ix);
    if (!ix) return oom(c, line);
    for (size_t i = 0; i < cnt; i++) ix[i] = (size_t)(start + (int64_t)i * stride);
    *idx = ix, *count = cnt;
    return step(c, cnt / 8, line);
}

bool je_do_slice(ctx *c, jv obj, const jv *lo, const jv *hi, const jv *st, jv *out, int line) {
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
        size_t n, *off = je_is_ascii(obj.u.s) ? NULL : je_cp_offsets(c, obj.u.s, &n, line);
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
bool je_iter_items(ctx *c, jv v, jlist **out, int line) {
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
            size_t len = je_u8len((unsigned char)v.u.s->p[i]);
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

/* <, <=, >, >= on numbers or strings (bytewise order of UTF-8 is code point order). */
bool je_compare(ctx *c, int op, jv a, jv b, bool *res, int line) {
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
bool je_equal(ctx *c, jv a, jv b, bool *res, int line) {
    uint64_t work = 0, left = c->lim.max_steps > c->steps ? c->lim.max_steps - c->steps : 0;
    uint64_t cap = left > UINT64_MAX / 16 ? UINT64_MAX / 2 : left * 8 + 8; /* what the step limit leaves */
    *res = jv_equal_work(a, b, &work, cap, 0);
    if (work == UINT64_MAX) return fail(c, HR_ERR_RANGE, line, "values nested deeper than the limit");
    return step(c, (work + 7) / 8, line); /* at least one step: a list scan is never free */
}

bool je_contains(ctx *c, jv hay, jv needle, bool *res, int line) {
    if (hay.t == JV_STR) {
        if (needle.t != JV_STR) return fail(c, HR_ERR_INVALID_ARG, line, "'in <string>' needs a string on the left");
        if (!charge(c, hay.u.s->n, line)) return false;
        *res = je_memfind(hay.u.s->p, hay.u.s->n, needle.u.s->p, needle.u.s->n) != NULL;
        return true;
    }
    if (hay.t == JV_LIST) {
        *res = false;
        for (size_t i = 0; i < hay.u.l->n && !*res; i++)
            if (!je_equal(c, hay.u.l->v[i], needle, res, line)) return false;
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
    case JV_METHOD: return je_call_method(c, f, callee.u.bm, args, n, kw, kv, nk, out, line);
    case JV_FUNC: return je_call_func(c, callee.u.fn, args, n, kw, kv, nk, out, line);
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
        return je_get_item(c, a, b, out, line);
    case JN_SLICE: {
        jv lo = jv_none(), hi = jv_none(), st = jv_none();
        if (!eval(c, f, nd->a, &a)) return false;
        if (nd->b && !eval(c, f, nd->b, &lo)) return false;
        if (nd->c && !eval(c, f, nd->c, &hi)) return false;
        if (nd->d && !eval(c, f, nd->d, &st)) return false;
        return je_do_slice(c, a, &lo, &hi, &st, out, line);
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
        return je_apply_filter(c, f, nd->name->p, a, args, nd->n_items, nd->kw, kv, nd->n_kw, out, line);
    }
    case JN_TEST: {
        jv *args, *kv;
        bool r;
        if (!eval(c, f, nd->a, &a) || !eval_args(c, f, nd, &args, &kv)) return false;
        if (!je_run_test(c, nd->name->p, a, args, nd->n_items, &r, line)) return false;
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
            if (!je_equal(c, a, b, &r, line)) return false;
            return *out = jv_bool(nd->op == JOP_EQ ? r : !r), true;
        case JOP_LT:
        case JOP_LE:
        case JOP_GT:
        case JOP_GE:
            if (!je_compare(c, nd->op, a, b, &r, line)) return false;
            return *out = jv_bool(r), true;
        case JOP_IN:
        case JOP_NOTIN:
            if (!je_contains(c, b, a, &r, line)) return false;
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
        if (!je_iter_items(c, v, &items, line)) return false;
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
    if (!je_iter_items(c, it, &items, nd->line)) return false;
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

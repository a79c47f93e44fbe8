/* jinja_eval_internal.h: what the evaluator (jinja_eval.c: scopes, expressions, statements) and its
 * builtins (jinja_builtins.c: the filters, tests, string and dict methods, globals, and the Unicode
 * string helpers both use) share: the render context, its error and limit helpers, and the few
 * functions each file calls in the other (prefixed je_).
 *
 * Invariants (jinja_eval.c's): every allocation comes from the render's arena; every unit of work
 * is charged with step()/charge(); the first error wins (once ctx->st is set, every helper returns
 * false without doing more). */
#ifndef HR_TOKENIZER_JINJA_EVAL_INTERNAL_H
#define HR_TOKENIZER_JINJA_EVAL_INTERNAL_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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

__attribute__((format(printf, 4, 5))) static inline bool fail(ctx *c, hr_status code, int line, const char *fmt, ...) {
    if (c->st != HR_OK) return false;
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->st = hr_error_set(c->err, code, "template line %d: %s", line, msg);
    return false;
}

static inline bool oom(ctx *c, int line) {
    if (c->a.over && !c->a.nomem)
        return fail(c, HR_ERR_RANGE, line, "the render needs more than the memory limit (%zu bytes)", c->a.cap);
    return fail(c, HR_ERR_NOMEM, line, "out of memory");
}

static inline bool step(ctx *c, uint64_t n, int line) {
    if (c->st != HR_OK) return false;
    c->steps += n;
    if (c->steps > c->lim.max_steps)
        return fail(c, HR_ERR_RANGE, line, "the render took more than the step limit (%llu)",
                    (unsigned long long)c->lim.max_steps);
    return true;
}

static inline bool charge(ctx *c, size_t bytes, int line) { return step(c, bytes / 64, line); }

static inline bool buf_ok(ctx *c, jbuf *b, int line) {
    if (!b->over) return true;
    if (b->too_deep) return fail(c, HR_ERR_RANGE, line, "a value nested deeper than the limit cannot be printed");
    if (c->a.over) return oom(c, line);
    return fail(c, HR_ERR_RANGE, line, "the output grew past the limit (%zu bytes)", c->lim.max_output_bytes);
}

static inline jbuf new_buf(ctx *c) { return (jbuf){.a = &c->a, .limit = c->lim.max_output_bytes}; }

static inline bool mkstr(ctx *c, const char *p, size_t n, jv *out, int line) {
    *out = jv_str(&c->a, p, n);
    return out->t == JV_STR || oom(c, line);
}

static inline bool buf_to_str(ctx *c, jbuf *b, jv *out, int line) {
    if (!buf_ok(c, b, line)) return false;
    if (!b->p) return mkstr(c, "", 0, out, line);
    *out = (jv){.t = JV_STR};
    /* the buffer already lives in the arena: wrap it without a copy when it fits a jstr */
    return mkstr(c, b->p, b->n, out, line);
}

static inline bool to_str(ctx *c, jv v, jv *out, int line) {
    if (v.t == JV_STR) return *out = v, true;
    jbuf b = new_buf(c);
    jv_write_str(&b, v);
    return buf_to_str(c, &b, out, line);
}

static inline bool is_numeric(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static inline double as_double(jv v) { return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : (double)v.u.b; }
static inline int64_t as_int(jv v) { return v.t == JV_INT ? v.u.i : v.u.b; }

/* Argument i, or keyword name, or NULL. */
static inline const jv *arg(jv *args, size_t n, jstr **kw, jv *kv, size_t nk, size_t i, const char *name) {
    if (i < n) return &args[i];
    for (size_t k = 0; k < nk; k++)
        if (!strcmp(kw[k]->p, name)) return &kv[k];
    return NULL;
}

/* ---- the evaluator's, for the builtins (jinja_eval.c) ------------------------------------------ */

bool je_get_item(ctx *c, jv obj, jv key, jv *out, int line);
bool je_do_slice(ctx *c, jv obj, const jv *lo, const jv *hi, const jv *st, jv *out, int line);
bool je_iter_items(ctx *c, jv v, jlist **out, int line);
bool je_compare(ctx *c, int op, jv a, jv b, bool *res, int line);
bool je_equal(ctx *c, jv a, jv b, bool *res, int line);
bool je_contains(ctx *c, jv hay, jv needle, bool *res, int line);

/* ---- the builtins', for the evaluator (jinja_builtins.c) ---------------------------------------- */

bool je_run_test(ctx *c, const char *name, jv v, jv *args, size_t n, bool *res, int line);
bool je_apply_filter(ctx *c, frame *f, const char *name, jv v, jv *args, size_t n, jstr **kw, jv *kv, size_t nk,
                     jv *out, int line);
bool je_call_method(ctx *c, frame *f, struct jmethod *m, jv *args, size_t n, jstr **kw, jv *kv, size_t nk, jv *out,
                    int line);
bool je_call_func(ctx *c, int fn, jv *args, size_t n, jstr **kw, jv *kv, size_t nk, jv *out, int line);
bool je_is_ascii(const jstr *s);
size_t je_u8len(unsigned char c);
size_t *je_cp_offsets(ctx *c, const jstr *s, size_t *count, int line);
const char *je_memfind(const char *h, size_t hn, const char *n, size_t nn);

#endif

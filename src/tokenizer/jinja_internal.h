/* jinja_internal.h: what the Jinja interpreter's three files share (see jinja.h): the arena every
 * value and node lives in, the value model (Python's none/bool/int/float/str/list/dict plus
 * Jinja's undefined, namespace, macro, loop and bound method), and the syntax tree.
 *
 * Invariants: values are immutable except a namespace's dict (Jinja's `set ns.x`); nothing a render
 * allocates outlives its arena, which is dropped whole when the render ends; the arena counts every
 * byte against a cap, which is how memory (and with it the work of copying) stays bounded. */
#ifndef HR_TOKENIZER_JINJA_INTERNAL_H
#define HR_TOKENIZER_JINJA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/utf8.h"
#include "tokenizer/jinja.h"

/* ---- arena ------------------------------------------------------------------------------------ */

typedef struct jchunk jchunk;
typedef struct jarena {
    jchunk *head;
    size_t used, cap; /* bytes handed out so far; the most allowed */
    bool over;        /* the cap or malloc refused an allocation */
    bool nomem;       /* it was malloc */
} jarena;

void *ja_alloc(jarena *a, size_t n); /* zeroed, 16-byte aligned; NULL (and a->over) past the cap */
void ja_free(jarena *a);

/* ---- values ----------------------------------------------------------------------------------- */

typedef enum jtype {
    JV_UNDEF = 0, /* s: the name that was looked up (NULL when unknown) */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST, /* lists and tuples alike */
    JV_DICT,
    JV_NS,     /* namespace(): a dict whose entries `set ns.x = ...` may change */
    JV_MACRO,  /* a macro, or the caller of a call block */
    JV_METHOD, /* a bound method: self + name, called later */
    JV_FUNC,   /* a global function: range, namespace, raise_exception, strftime_now */
    JV_LOOP,   /* the loop variable of a for statement */
} jtype;

typedef struct jstr {
    size_t n;
    char p[]; /* n bytes and a NUL */
} jstr;

typedef struct jv jv;
typedef struct jlist jlist;
typedef struct jdict jdict;
struct jmacro;
struct jmethod;
struct jloop;

struct jv {
    uint8_t t;
    union {
        bool b;
        int64_t i;
        double f;
        jstr *s;
        jlist *l;
        jdict *d;
        struct jmacro *m;
        struct jmethod *bm;
        struct jloop *loop;
        int fn;
    } u;
};

struct jlist {
    size_t n, cap;
    jv *v;
    bool tuple; /* prints as (a, b): tuple literals and the pairs of items() */
};

struct jdict {
    size_t n, cap;
    jv *k, *v; /* insertion order, as Python's dict */
};

jstr *js_new(jarena *a, const char *p, size_t n);
jv jv_str(jarena *a, const char *p, size_t n); /* JV_UNDEF when the arena is spent */
jv jv_strz(jarena *a, const char *p);
jv jv_int(int64_t i);
jv jv_bool(bool b);
jv jv_none(void);
jv jv_undef(jstr *name);
jlist *jl_new(jarena *a, size_t cap);
bool jl_push(jarena *a, jlist *l, jv v);
jdict *jd_new(jarena *a, size_t cap);
bool jd_set(jarena *a, jdict *d, jv k, jv v); /* replaces an equal key's value */
const jv *jd_get(const jdict *d, jv k);
const jv *jd_gets(const jdict *d, const char *key, size_t n);

bool jv_truthy(jv v);
/* Python's ==, its work capped at JV_EQUAL_WORK_CAP (dict keys: past it, keys count as different). */
bool jv_equal(jv a, jv b);
#define JV_EQUAL_WORK_CAP ((uint64_t)1 << 20)
/* The same, adding the work done to *work (one per item, one per 64 string bytes); past nesting
 * depth 200 it stops and sets *work to UINT64_MAX; once *work passes cap it stops (answering
 * false), so the caller sees *work > cap and can report a limit. */
bool jv_equal_work(jv a, jv b, uint64_t *work, uint64_t cap, int depth);
const char *jv_type_name(jv v);

/* A growing byte buffer in an arena (for str(), repr() and tojson). */
typedef struct jbuf {
    jarena *a;
    char *p;
    size_t n, cap;
    size_t limit; /* SIZE_MAX or the output bound; going past sets over */
    bool over;
    bool too_deep; /* (with over) a value nested past depth 200 was to be written */
} jbuf;
void jb_put(jbuf *b, const char *p, size_t n);
void jb_puts(jbuf *b, const char *s);

/* Python's str(v) (strings as they are, containers through repr) and repr(v); a value nested past
 * depth 200 sets b->over and b->too_deep (Python would hit its recursion limit). */
void jv_write_str(jbuf *b, jv v);
void jv_write_repr(jbuf *b, jv v);
/* Python's json.dumps(v, ensure_ascii=False, indent=indent) as HF's tojson calls it; indent < 0 means
 * none (separators ", " and ": "), else newline + indent spaces per level (separators "," and ": ").
 * false when v holds something JSON cannot (a macro, undefined). */
bool jv_write_json(jbuf *b, jv v, int indent, int depth);
void jv_write_float(jbuf *b, double f); /* Python's repr of a float */

/* Parses one JSON text into values in a; NULL-terminated error text in errbuf on failure. */
bool jv_parse_json(jarena *a, const char *s, size_t n, jv *out, int max_depth, char *errbuf, size_t errlen);

/* ---- syntax tree ------------------------------------------------------------------------------ */

typedef enum jkind {
    /* expressions */
    JN_LIT = 1, /* lit */
    JN_NAME,    /* name */
    JN_LIST,    /* items */
    JN_TUPLE,   /* items */
    JN_DICT,    /* items (keys), items2 (values) */
    JN_ATTR,    /* a.name */
    JN_ITEM,    /* a[b] */
    JN_SLICE,   /* a[b:c:d] (each may be NULL) -> a, b, c, d */
    JN_CALL,    /* a(items..., kw...) */
    JN_FILTER,  /* a | name(items..., kw...); a NULL = the body of a filter block */
    JN_TEST,    /* a is [not] name(items...) */
    JN_UNARY,   /* op a: '-', '+', 'n' (not) */
    JN_BINARY,  /* a op b */
    JN_AND,
    JN_OR,
    JN_COND, /* b if a else c */
    /* statements */
    JN_TEXT,        /* lit */
    JN_OUTPUT,      /* {{ a }} */
    JN_IF,          /* if a: body else: else_body (elif nests) */
    JN_FOR,         /* for targets(items, names) in a [if b]: body else: else_body */
    JN_SET,         /* set targets = a | set name.attr = a | set name %}body{% endset */
    JN_MACRO,       /* macro name(params: items as names, defaults in items2): body */
    JN_CALLBLOCK,   /* call(params) a: body is the caller */
    JN_FILTERBLOCK, /* filter a (JN_FILTER chain over the body): body */
    JN_BREAK,
    JN_CONTINUE,
} jkind;

/* binary operators (JN_BINARY op) */
enum {
    JOP_ADD = 1,
    JOP_SUB,
    JOP_MUL,
    JOP_DIV,
    JOP_FLOORDIV,
    JOP_MOD,
    JOP_POW,
    JOP_CONCAT,
    JOP_EQ,
    JOP_NE,
    JOP_LT,
    JOP_LE,
    JOP_GT,
    JOP_GE,
    JOP_IN,
    JOP_NOTIN
};

typedef struct jnode jnode;
struct jnode {
    uint8_t kind;
    uint8_t op;
    bool neg; /* JN_TEST: `is not` */
    int line;
    jv lit;
    jstr *name; /* name, attribute, filter/test/macro name; JN_SET with attr: the attribute */
    jnode *a, *b, *c, *d;
    jnode **items, **items2;
    size_t n_items;
    jstr **kw; /* keyword argument names (calls, filters) */
    jnode **kw_vals;
    size_t n_kw;
    jnode **body, **else_body;
    size_t n_body, n_else;
};

struct hr_jinja {
    jarena arena; /* every node and literal */
    jnode **body;
    size_t n_body;
    hr_jinja_limits limits;
};

/* Fills in the defaults of jinja.h. */
hr_jinja_limits jinja_limits_or_default(const hr_jinja_limits *l);

#endif

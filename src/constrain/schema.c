/* schema.c: a JSON Schema (the subset strict structured-output servers accept) -> GBNF text.
 *
 * Each (sub)schema becomes one rule "sN ::= ..."; $ref targets one rule each, so recursive schemas are
 * recursive rules. Objects emit their properties in the schema's order (required ones always,
 * optional ones maybe: two rules per property, "first" and "after a comma"); integers with bounds
 * become digit-range alternatives; the formats date, time, date-time and uuid have exact grammars;
 * a string pattern becomes a /regex/j atom (characters limited to what a JSON string holds
 * unescaped). Every keyword is either used, an annotation (title, description, ...), or refused with
 * its name and path: nothing is dropped silently. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "constrain/constrain_internal.h"

/* The generic JSON rules. Whitespace between tokens is one space or a newline and up to 12 spaces or
 * tabs of indentation, so a model cannot pad forever; numbers are bounded in digits so every one is finite (no
 * "1e999"); \u escapes exclude surrogates and NUL (a strict parser refuses them). */
const char hr_cons_json_rules[] =
    "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object ::= \"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws \":\" ws value ws )* )? \"}\"\n"
    "array ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" uhex )\n"
    "uhex ::= [1-9a-cA-Ce-fE-F] hex hex hex | [dD] [0-7] hex hex | \"0\" ( [1-9a-fA-F] hex hex | \"0\" ( [1-9a-fA-F] "
    "hex "
    "| \"0\" [1-9a-fA-F] ) )\n"
    "hex ::= [0-9a-fA-F]\n"
    "number ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,2} )?\n"
    "integer ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} )\n"
    "boolean ::= \"true\" | \"false\"\n"
    "null ::= \"null\"\n"
    "ws ::= ( \" \" | \"\\n\" [ \\t]{0,12} )?\n"
    "date ::= [0-9]{4} \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" d31 | ( \"0\" [469] | \"11\" ) \"-\" d30 | \"02-\" "
    "d28 )\n"
    "d28 ::= \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]\n"
    "d30 ::= d28 | \"29\" | \"30\"\n"
    "d31 ::= d30 | \"31\"\n"
    "time ::= ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,6} )? ( \"Z\" | [+-] ( "
    "[01] "
    "[0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )\n"
    "uuid ::= hex{8} \"-\" hex{4} \"-\" hex{4} \"-\" hex{4} \"-\" hex{12}\n";

#define JS_MAX_INT 999999999999999LL /* an unbounded side of an integer range: 15 digits */

typedef struct ref_ent {
    char *ref;
    char name[24];
} ref_ent;

typedef struct sctx {
    hr_sbuf rules;
    json_t *root;
    int n;
    ref_ent *refs;
    int n_refs, cap_refs;
    int depth;
    hr_status st;
    hr_error *err;
} sctx;

__attribute__((format(printf, 3, 4))) static bool sfail(sctx *c, hr_status code, const char *fmt, ...) {
    if (c->st != HR_OK) return false;
    char msg[480];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->st = hr_error_set(c->err, code, "%s", msg);
    return false;
}

static const char *const k_annotations[] = {"title",    "description", "default",  "examples",
                                            "$schema",  "$id",         "$comment", "deprecated",
                                            "readOnly", "writeOnly",   "$defs",    "definitions"};
static const char *const k_used[] = {"type",
                                     "properties",
                                     "required",
                                     "additionalProperties",
                                     "enum",
                                     "const",
                                     "items",
                                     "minItems",
                                     "maxItems",
                                     "anyOf",
                                     "allOf",
                                     "format",
                                     "minimum",
                                     "maximum",
                                     "exclusiveMinimum",
                                     "exclusiveMaximum",
                                     "minLength",
                                     "maxLength",
                                     "pattern",
                                     "$ref"};

static bool in_list(const char *k, const char *const *l, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(k, l[i])) return true;
    return false;
}

static bool gen(sctx *c, json_t *s, const char *path, char *name);

/* A new rule name. */
static void new_name(sctx *c, char *name) { snprintf(name, 24, "s%d", c->n++); }

/* A piece built in its own buffer ran out of memory: the whole translation fails (a partial rule would
 * be a different grammar). */
static bool sb_ok(sctx *c, const hr_sbuf *b) { return !b->oom || sfail(c, HR_ERR_NOMEM, "out of memory"); }

static void emit_rule(sctx *c, const char *name, const hr_sbuf *body) {
    hr_sbuf_printf(&c->rules, "%s ::= ", name);
    hr_sbuf_put(&c->rules, body->s ? body->s : "\"\"", body->s ? body->n : 2);
    hr_sbuf_puts(&c->rules, "\n");
}

static void json_literal(hr_sbuf *b, json_t *v) {
    char *d = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!d) {
        b->oom = true;
        return;
    }
    hr_sbuf_literal(b, d, strlen(d));
    free(d);
}

static bool all_of(const char *x, int n, char c) {
    for (int i = 0; i < n; i++)
        if (x[i] != c) return false;
    return true;
}

/* Digits: x[0..n) and y[0..n), x <= y, as an expression. Full tails ("0..0" to "9..9") become one
 * [0-9]{k}, so the text grows linearly with the digits (three branches per digit would be 3^n). */
static void same_len(hr_sbuf *b, const char *x, const char *y, int n) {
    if (all_of(x, n, '0') && all_of(y, n, '9')) {
        hr_sbuf_printf(b, n == 1 ? "[0-9]" : "[0-9]{%d}", n);
        return;
    }
    if (n == 1) {
        hr_sbuf_printf(b, "[%c-%c]", x[0], y[0]);
        return;
    }
    if (x[0] == y[0]) {
        hr_sbuf_printf(b, "\"%c\" ", x[0]);
        same_len(b, x + 1, y + 1, n - 1);
        return;
    }
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    hr_sbuf_puts(b, "( ");
    bool any = false;
    char lo = x[0], hi = y[0];
    if (!all_of(x + 1, n - 1, '0')) { /* x0 followed by x's tail .. 9..9 */
        hr_sbuf_printf(b, "\"%c\" ", x[0]);
        same_len(b, x + 1, nines, n - 1);
        any = true;
        lo++;
    }
    bool y_tail = !all_of(y + 1, n - 1, '9');
    if (y_tail) hi--;
    if (lo <= hi) {
        hr_sbuf_printf(b, "%s[%c-%c] [0-9]{%d}", any ? " | " : "", lo, hi, n - 1);
        any = true;
    }
    if (y_tail) { /* y0 followed by 0..0 .. y's tail */
        hr_sbuf_printf(b, "%s\"%c\" ", any ? " | " : "", y[0]);
        same_len(b, zeros, y + 1, n - 1);
    }
    hr_sbuf_puts(b, " )");
}

/* 0 <= a <= b: the decimal spellings (no leading zeros) of [a, b]. */
static void pos_range(hr_sbuf *b, long long a, long long z) {
    hr_sbuf_puts(b, "( ");
    long long p10 = 1;
    bool first = true;
    for (int len = 1; len <= 18; len++, p10 *= 10) {
        long long lo = len == 1 ? 0 : p10, hi = p10 * 10 - 1;
        if (hi < a || lo > z) continue;
        lo = HR_MAX(lo, a);
        hi = HR_MIN(hi, z);
        char x[24], y[24];
        snprintf(x, sizeof x, "%lld", lo);
        snprintf(y, sizeof y, "%lld", hi);
        if (!first) hr_sbuf_puts(b, " | ");
        first = false;
        same_len(b, x, y, len);
    }
    hr_sbuf_puts(b, " )");
}

static bool read_bound(sctx *c, json_t *s, const char *k, const char *path, bool *has, double *v) {
    json_t *x = json_object_get(s, k);
    *has = false;
    if (!x) return true;
    if (!json_is_number(x)) return sfail(c, HR_ERR_INVALID_ARG, "'%s' at %s must be a number", k, path);
    *has = true;
    *v = json_number_value(x);
    return true;
}

static bool read_count(sctx *c, json_t *s, const char *k, const char *path, long long *v) {
    json_t *x = json_object_get(s, k);
    if (!x) return true;
    if (!json_is_integer(x) || json_integer_value(x) < 0)
        return sfail(c, HR_ERR_INVALID_ARG, "'%s' at %s must be a non-negative integer", k, path);
    *v = json_integer_value(x);
    if (*v > HR_CONS_MAX_REPEAT)
        return sfail(c, HR_ERR_RANGE, "'%s' at %s is %lld: above %d (the bound on repetitions)", k, path, *v,
                     HR_CONS_MAX_REPEAT);
    return true;
}

static bool gen_integer(sctx *c, json_t *s, const char *path, hr_sbuf *b) {
    bool hmin, hmax, hxmin, hxmax;
    double vmin = 0, vmax = 0, vxmin = 0, vxmax = 0;
    if (!read_bound(c, s, "minimum", path, &hmin, &vmin) || !read_bound(c, s, "maximum", path, &hmax, &vmax) ||
        !read_bound(c, s, "exclusiveMinimum", path, &hxmin, &vxmin) ||
        !read_bound(c, s, "exclusiveMaximum", path, &hxmax, &vxmax))
        return false;
    if (!hmin && !hmax && !hxmin && !hxmax) {
        hr_sbuf_puts(b, "integer");
        return true;
    }
    double lo = -(double)JS_MAX_INT, hi = (double)JS_MAX_INT;
    if (hmin) lo = HR_MAX(lo, __builtin_ceil(vmin));
    if (hxmin) lo = HR_MAX(lo, __builtin_floor(vxmin) + 1);
    if (hmax) hi = HR_MIN(hi, __builtin_floor(vmax));
    if (hxmax) hi = HR_MIN(hi, __builtin_ceil(vxmax) - 1);
    if (lo > hi) return sfail(c, HR_ERR_INVALID_ARG, "the bounds at %s leave no integer", path);
    long long a = (long long)lo, z = (long long)hi;
    hr_sbuf_puts(b, "( ");
    bool any = false;
    if (a < 0) {
        hr_sbuf_puts(b, "\"-\" ");
        pos_range(b, z < 0 ? -z : 1, -a);
        any = true;
    }
    if (z >= 0) {
        if (any) hr_sbuf_puts(b, " | ");
        pos_range(b, HR_MAX(a, 0), z);
    }
    hr_sbuf_puts(b, " )");
    return true;
}

static bool gen_string(sctx *c, json_t *s, const char *path, hr_sbuf *b) {
    json_t *fmt = json_object_get(s, "format"), *pat = json_object_get(s, "pattern");
    long long mn = 0, mx = -1;
    if (!read_count(c, s, "minLength", path, &mn) || !read_count(c, s, "maxLength", path, &mx)) return false;
    bool lengths = json_object_get(s, "minLength") || json_object_get(s, "maxLength");
    if (fmt) {
        if (!json_is_string(fmt)) return sfail(c, HR_ERR_INVALID_ARG, "'format' at %s must be a string", path);
        const char *f = json_string_value(fmt);
        if (pat || lengths)
            return sfail(c, HR_ERR_INVALID_ARG, "'format' together with 'pattern' or a length at %s is not supported",
                         path);
        if (!strcmp(f, "date") || !strcmp(f, "time") || !strcmp(f, "uuid")) {
            hr_sbuf_printf(b, "\"\\\"\" %s \"\\\"\"", f);
            return true;
        }
        if (!strcmp(f, "date-time")) {
            hr_sbuf_puts(b, "\"\\\"\" date \"T\" time \"\\\"\"");
            return true;
        }
        return sfail(c, HR_ERR_INVALID_ARG,
                     "unsupported JSON Schema format '%s' at %s (supported: date, time, date-time, uuid)", f, path);
    }
    if (pat) {
        if (!json_is_string(pat)) return sfail(c, HR_ERR_INVALID_ARG, "'pattern' at %s must be a string", path);
        if (lengths)
            return sfail(c, HR_ERR_INVALID_ARG, "'pattern' together with minLength/maxLength at %s is not supported",
                         path);
        const char *p = json_string_value(pat);
        size_t n = json_string_length(pat);
        /* the whole string matches: a match is also a match anywhere, as JSON Schema asks */
        if (n && p[0] == '^') p++, n--;
        if (n && p[n - 1] == '$' && !(n >= 2 && p[n - 2] == '\\')) n--;
        for (size_t i = 0; i < n; i++)
            if (p[i] == '/' && (i == 0 || p[i - 1] != '\\'))
                return sfail(c, HR_ERR_INVALID_ARG, "'pattern' at %s: write '/' as '\\/'", path);
        hr_sbuf_puts(b, "\"\\\"\" /");
        hr_sbuf_put(b, p, n);
        hr_sbuf_puts(b, "/j \"\\\"\"");
        return true;
    }
    if (mx >= 0 && mx < mn) return sfail(c, HR_ERR_INVALID_ARG, "maxLength is below minLength at %s", path);
    if (!lengths) {
        hr_sbuf_puts(b, "string");
        return true;
    }
    if (mx >= 0)
        hr_sbuf_printf(b, "\"\\\"\" char{%lld,%lld} \"\\\"\"", mn, mx);
    else
        hr_sbuf_printf(b, "\"\\\"\" char{%lld,} \"\\\"\"", mn);
    return true;
}

static bool gen_array(sctx *c, json_t *s, const char *path, hr_sbuf *b) {
    long long mn = 0, mx = -1;
    if (!read_count(c, s, "minItems", path, &mn) || !read_count(c, s, "maxItems", path, &mx)) return false;
    if (mx >= 0 && mx < mn) return sfail(c, HR_ERR_INVALID_ARG, "maxItems is below minItems at %s", path);
    json_t *items = json_object_get(s, "items");
    char item[24] = "value";
    if (items) {
        char sub[512];
        snprintf(sub, sizeof sub, "%s/items", path);
        if (json_is_array(items))
            return sfail(c, HR_ERR_INVALID_ARG, "'items' as an array (tuple) at %s is not supported", path);
        if (!gen(c, items, sub, item)) return false;
    }
    if (mx == 0) {
        hr_sbuf_puts(b, "\"[\" ws \"]\"");
        return true;
    }
    hr_sbuf_printf(b, "\"[\" ws ( %s ws ( \",\" ws %s ws )", item, item);
    long long lo = mn > 0 ? mn - 1 : 0;
    if (mx < 0)
        hr_sbuf_printf(b, "{%lld,}", lo);
    else
        hr_sbuf_printf(b, "{%lld,%lld}", lo, mx - 1);
    hr_sbuf_printf(b, " )%s \"]\"", mn > 0 ? "" : "?");
    return true;
}

static bool gen_object(sctx *c, json_t *s, const char *path, hr_sbuf *b) {
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return sfail(c, HR_ERR_INVALID_ARG, "'properties' at %s must be an object", path);
    if (req && !json_is_array(req)) return sfail(c, HR_ERR_INVALID_ARG, "'required' at %s must be an array", path);
    if (addl && !json_is_boolean(addl) && !json_is_object(addl))
        return sfail(c, HR_ERR_INVALID_ARG, "'additionalProperties' at %s must be a boolean or a schema", path);
    for (size_t i = 0; req && i < json_array_size(req); i++) {
        json_t *k = json_array_get(req, i);
        if (!json_is_string(k)) return sfail(c, HR_ERR_INVALID_ARG, "'required' at %s must hold strings", path);
        if (!props || !json_object_get(props, json_string_value(k)))
            return sfail(c, HR_ERR_INVALID_ARG, "required property '%s' at %s is not in 'properties' (not supported)",
                         json_string_value(k), path);
    }
    if (addl && json_is_object(addl)) {
        if (props && json_object_size(props) > 0)
            return sfail(c, HR_ERR_INVALID_ARG,
                         "'additionalProperties' as a schema beside 'properties' at %s is not supported", path);
        char val[24], sub[512];
        snprintf(sub, sizeof sub, "%s/additionalProperties", path);
        if (!gen(c, addl, sub, val)) return false;
        hr_sbuf_printf(b, "\"{\" ws ( string ws \":\" ws %s ws ( \",\" ws string ws \":\" ws %s ws )* )? \"}\"", val,
                       val);
        return true;
    }
    /* properties in order; "first" (no comma before) and "next" (a comma before) rules per index */
    size_t n = props ? json_object_size(props) : 0;
    if (n == 0) {
        hr_sbuf_puts(b, "\"{\" ws \"}\"");
        return true;
    }
    const char **keys = malloc(sizeof(char *) * n);
    char(*val)[24] = malloc(sizeof *val * n);
    bool *required = calloc(n, 1);
    if (!keys || !val || !required) {
        free(keys), free(val), free(required);
        return sfail(c, HR_ERR_NOMEM, "out of memory");
    }
    size_t i = 0;
    const char *k;
    json_t *ps;
    bool ok = true;
    json_object_foreach(props, k, ps) {
        keys[i] = k;
        for (size_t j = 0; req && j < json_array_size(req); j++)
            if (!strcmp(json_string_value(json_array_get(req, j)), k)) required[i] = true;
        char sub[512];
        snprintf(sub, sizeof sub, "%s/properties/%s", path, k);
        if (!(ok = gen(c, ps, sub, val[i]))) break;
        i++;
    }
    int base = c->n;
    c->n += (int)(2 * n + 2);
    for (size_t j = 0; ok && j <= n; j++) {
        hr_sbuf first = {0}, next = {0};
        char fname[24], nname[24];
        snprintf(fname, sizeof fname, "s%d", base + (int)(2 * j));
        snprintf(nname, sizeof nname, "s%d", base + (int)(2 * j + 1));
        if (j == n) {
            hr_sbuf_puts(&first, "\"\"");
            hr_sbuf_puts(&next, "\"\"");
        } else {
            json_t *ks = json_string(keys[j]);
            hr_sbuf kv = {0};
            if (ks) json_literal(&kv, ks);
            kv.oom |= !ks;
            json_decref(ks);
            ok = sb_ok(c, &kv);
            hr_sbuf_printf(&first, "%s ws \":\" ws %s ws s%d", kv.s ? kv.s : "\"\"", val[j], base + (int)(2 * j + 3));
            hr_sbuf_printf(&next, "\",\" ws %s ws \":\" ws %s ws s%d", kv.s ? kv.s : "\"\"", val[j],
                           base + (int)(2 * j + 3));
            if (!required[j]) {
                hr_sbuf_printf(&first, " | s%d", base + (int)(2 * j + 2));
                hr_sbuf_printf(&next, " | s%d", base + (int)(2 * j + 3));
            }
            free(kv.s);
        }
        ok = ok && sb_ok(c, &first) && sb_ok(c, &next);
        if (ok) emit_rule(c, fname, &first);
        if (ok) emit_rule(c, nname, &next);
        free(first.s);
        free(next.s);
    }
    if (ok) hr_sbuf_printf(b, "\"{\" ws s%d \"}\"", base);
    free(keys);
    free(val);
    free(required);
    return ok;
}

/* "#", "#/$defs/x" or "#/definitions/x" (JSON pointer escapes ~0 ~1). */
static json_t *resolve(sctx *c, const char *ref) {
    if (!strcmp(ref, "#")) return c->root;
    const char *pre[] = {"#/$defs/", "#/definitions/"};
    for (int p = 0; p < 2; p++) {
        size_t n = strlen(pre[p]);
        if (strncmp(ref, pre[p], n)) continue;
        json_t *defs = json_object_get(c->root, p == 0 ? "$defs" : "definitions");
        char key[256];
        size_t o = 0;
        for (const char *q = ref + n; *q && o + 1 < sizeof key; q++) {
            if (*q == '/') return NULL;
            if (q[0] == '~' && (q[1] == '0' || q[1] == '1')) {
                key[o++] = q[1] == '0' ? '~' : '/';
                q++;
            } else {
                key[o++] = *q;
            }
        }
        key[o] = 0;
        return defs ? json_object_get(defs, key) : NULL;
    }
    return NULL;
}

static bool gen_ref(sctx *c, json_t *s, const char *path, char *name) {
    json_t *r = json_object_get(s, "$ref");
    if (!json_is_string(r)) return sfail(c, HR_ERR_INVALID_ARG, "'$ref' at %s must be a string", path);
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        if (strcmp(k, "$ref") && !in_list(k, k_annotations, HR_ARRAY_LEN(k_annotations)))
            return sfail(c, HR_ERR_INVALID_ARG, "keyword '%s' beside '$ref' at %s is not supported", k, path);
    }
    const char *ref = json_string_value(r);
    for (int i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i].ref, ref)) {
            snprintf(name, 24, "%s", c->refs[i].name);
            return true;
        }
    json_t *target = resolve(c, ref);
    if (!target)
        return sfail(c, HR_ERR_INVALID_ARG,
                     "'$ref' '%s' at %s does not resolve (only #, #/$defs/NAME and #/definitions/NAME)", ref, path);
    if (c->n_refs == c->cap_refs) {
        int cap = c->cap_refs ? c->cap_refs * 2 : 8;
        ref_ent *e = realloc(c->refs, sizeof *e * (size_t)cap);
        if (!e) return sfail(c, HR_ERR_NOMEM, "out of memory");
        c->refs = e;
        c->cap_refs = cap;
    }
    ref_ent *e = &c->refs[c->n_refs];
    if (!(e->ref = strdup(ref))) return sfail(c, HR_ERR_NOMEM, "out of memory");
    new_name(c, e->name);
    c->n_refs++;
    char rname[24], tname[24];
    snprintf(rname, sizeof rname, "%s", e->name); /* c->refs may move while generating */
    if (!gen(c, target, ref, tname)) return false;
    hr_sbuf body = {0};
    hr_sbuf_puts(&body, tname);
    bool ok = sb_ok(c, &body);
    if (ok) emit_rule(c, rname, &body);
    free(body.s);
    snprintf(name, 24, "%s", rname);
    return ok;
}

static bool type_one(sctx *c, json_t *s, const char *t, const char *path, hr_sbuf *b) {
    if (!strcmp(t, "string")) return gen_string(c, s, path, b);
    if (!strcmp(t, "integer")) return gen_integer(c, s, path, b);
    if (!strcmp(t, "number")) {
        const char *bk[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
        for (int i = 0; i < 4; i++)
            if (json_object_get(s, bk[i]))
                return sfail(c, HR_ERR_INVALID_ARG,
                             "unsupported JSON Schema keyword '%s' on type number at %s (bounds are supported on "
                             "integer)",
                             bk[i], path);
        hr_sbuf_puts(b, "number");
        return true;
    }
    if (!strcmp(t, "boolean")) return hr_sbuf_puts(b, "boolean"), true;
    if (!strcmp(t, "null")) return hr_sbuf_puts(b, "null"), true;
    if (!strcmp(t, "object")) return gen_object(c, s, path, b);
    if (!strcmp(t, "array")) return gen_array(c, s, path, b);
    return sfail(c, HR_ERR_INVALID_ARG, "unknown type '%s' at %s", t, path);
}

/* Generates the rule for schema s (at path) and writes its name to name[24]. */
static bool gen(sctx *c, json_t *s, const char *path, char *name) {
    if (c->st != HR_OK) return false;
    if (++c->depth > 64)
        return sfail(c, HR_ERR_RANGE, "the schema nests deeper than 64 (the bound on depth) at %s", path);
    bool ok = true;
    hr_sbuf b = {0};
    if (json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0)) {
        snprintf(name, 24, "value");
        c->depth--;
        return true;
    }
    if (json_is_false(s)) return sfail(c, HR_ERR_INVALID_ARG, "the schema at %s is false: nothing is valid", path);
    if (!json_is_object(s))
        return sfail(c, HR_ERR_INVALID_ARG, "the schema at %s must be an object or a boolean", path);
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        if (!in_list(k, k_used, HR_ARRAY_LEN(k_used)) && !in_list(k, k_annotations, HR_ARRAY_LEN(k_annotations)))
            return sfail(c, HR_ERR_INVALID_ARG, "unsupported JSON Schema keyword '%s' at %s", k, path);
    }
    if (json_object_get(s, "$ref")) {
        ok = gen_ref(c, s, path, name);
        c->depth--;
        return ok;
    }
    new_name(c, name);
    char sub[512];
    json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const"), *any = json_object_get(s, "anyOf"),
           *all = json_object_get(s, "allOf"), *ty = json_object_get(s, "type");
    if (cn) {
        json_literal(&b, cn);
    } else if (en) {
        if (!json_is_array(en) || json_array_size(en) == 0)
            ok = sfail(c, HR_ERR_INVALID_ARG, "'enum' at %s must be a non-empty array", path);
        for (size_t i = 0; ok && i < json_array_size(en); i++) {
            if (i) hr_sbuf_puts(&b, " | ");
            json_literal(&b, json_array_get(en, i));
        }
    } else if (any || all) {
        json_t *arr = any ? any : all;
        const char *kw = any ? "anyOf" : "allOf";
        if (any && all) ok = sfail(c, HR_ERR_INVALID_ARG, "'anyOf' together with 'allOf' at %s is not supported", path);
        if (ok && (!json_is_array(arr) || json_array_size(arr) == 0))
            ok = sfail(c, HR_ERR_INVALID_ARG, "'%s' at %s must be a non-empty array", kw, path);
        if (ok && all && json_array_size(all) > 1)
            ok = sfail(c, HR_ERR_INVALID_ARG, "'allOf' with more than one schema at %s is not supported", path);
        if (ok && ty) ok = sfail(c, HR_ERR_INVALID_ARG, "'type' beside '%s' at %s is not supported", kw, path);
        for (size_t i = 0; ok && i < json_array_size(arr); i++) {
            char alt[24];
            snprintf(sub, sizeof sub, "%s/%s/%zu", path, kw, i);
            if (!(ok = gen(c, json_array_get(arr, i), sub, alt))) break;
            hr_sbuf_printf(&b, "%s%s", i ? " | " : "", alt);
        }
    } else {
        const char *types[8];
        int nt = 0;
        if (json_is_string(ty)) {
            types[nt++] = json_string_value(ty);
        } else if (json_is_array(ty)) {
            for (size_t i = 0; i < json_array_size(ty) && nt < 8; i++) {
                if (!json_is_string(json_array_get(ty, i)))
                    return sfail(c, HR_ERR_INVALID_ARG, "'type' at %s must hold strings", path);
                types[nt++] = json_string_value(json_array_get(ty, i));
            }
        } else if (ty) {
            return sfail(c, HR_ERR_INVALID_ARG, "'type' at %s must be a string or an array", path);
        } else if (json_object_get(s, "properties") || json_object_get(s, "required") ||
                   json_object_get(s, "additionalProperties")) {
            types[nt++] = "object";
        } else if (json_object_get(s, "items") || json_object_get(s, "minItems") || json_object_get(s, "maxItems")) {
            types[nt++] = "array";
        } else if (json_object_get(s, "pattern") || json_object_get(s, "format") || json_object_get(s, "minLength") ||
                   json_object_get(s, "maxLength")) {
            types[nt++] = "string";
        } else if (json_object_get(s, "minimum") || json_object_get(s, "maximum") ||
                   json_object_get(s, "exclusiveMinimum") || json_object_get(s, "exclusiveMaximum")) {
            types[nt++] = "integer"; /* bounds are supported on integers only: a subset of the numbers */
        }
        if (nt == 0) hr_sbuf_puts(&b, "value");
        for (int i = 0; ok && i < nt; i++) {
            if (i) hr_sbuf_puts(&b, " | ");
            ok = type_one(c, s, types[i], path, &b);
        }
    }
    if (ok) ok = sb_ok(c, &b);
    if (ok) emit_rule(c, name, &b);
    free(b.s);
    c->depth--;
    return ok && c->st == HR_OK;
}

hr_status hr_cons_schema_to_gbnf(const char *json, size_t len, char **out, hr_error *err) {
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_DECODE_ANY, &je);
    if (!root) return hr_error_set(err, HR_ERR_INVALID_ARG, "the schema is not JSON: %s", je.text);
    sctx c = {.root = root, .err = err};
    char name[24];
    if (gen(&c, root, "#", name)) {
        hr_sbuf_printf(&c.rules, "root ::= ws %s\n", name);
        hr_sbuf_puts(&c.rules, hr_cons_json_rules);
    }
    if (c.st == HR_OK && c.rules.oom) c.st = hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    for (int i = 0; i < c.n_refs; i++) free(c.refs[i].ref);
    free(c.refs);
    json_decref(root);
    if (c.st != HR_OK) {
        free(c.rules.s);
        return c.st;
    }
    *out = c.rules.s;
    return HR_OK;
}

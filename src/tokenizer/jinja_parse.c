/* jinja_parse.c: template text -> syntax tree (see jinja_internal.h).
 *
 * The lexer applies Jinja2's whitespace rules as Hugging Face configures them while it cuts the
 * text: `{%-`/`-%}` strip all whitespace on that side; trim_blocks drops the first newline after a
 * block or comment tag; lstrip_blocks drops spaces and tabs between a line's start and a block or
 * comment tag (`{%+` keeps them); one trailing newline of the template is dropped
 * (keep_trailing_newline=False). The parser is recursive descent with Jinja2's precedence:
 * if-else < or < and < not < comparisons/in < + - < ~ < * / // % < ** < unary < postfix, filters and
 * `is` tests. Nesting is bounded by limits.max_depth. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/jinja_internal.h"

/* ---- tokens ----------------------------------------------------------------------------------- */

typedef enum ttype {
    T_EOF = 0,
    T_TEXT,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING,
    T_INT,
    T_FLOAT,
    T_OP, /* op holds the operator text */
} ttype;

typedef struct tok {
    ttype t;
    int line;
    char op[3];
    jstr *s; /* text, name or string value */
    int64_t i;
    double f;
} tok;

typedef struct parser {
    jarena *a;
    tok *toks;
    size_t n, cap, pos;
    int max_depth, depth;
    hr_error *err;
    hr_status st;
} parser;

__attribute__((format(printf, 4, 5))) static hr_status perr(parser *p, hr_status code, int line, const char *fmt, ...) {
    if (p->st != HR_OK) return p->st;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    p->st = hr_error_set(p->err, code, "template line %d: %s", line, msg);
    return p->st;
}

static bool push_tok(parser *p, tok t) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 256;
        tok *nt = ja_alloc(p->a, cap * sizeof(tok));
        if (!nt) return false;
        if (p->n) memcpy(nt, p->toks, p->n * sizeof(tok));
        p->toks = nt, p->cap = cap;
    }
    p->toks[p->n++] = t;
    return true;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
static bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static int count_lines(const char *s, size_t from, size_t to) {
    int n = 0;
    for (size_t i = from; i < to; i++) n += s[i] == '\n';
    return n;
}

/* A string literal's body with Python's escapes (\n \t \r \\ \' \" \xNN \uNNNN \UNNNNNNNN; others kept). */
static jstr *unescape(jarena *a, const char *s, size_t n) {
    jbuf b = {.a = a, .limit = SIZE_MAX};
    jb_put(&b, "", 0);
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) {
            jb_put(&b, s + i, 1);
            continue;
        }
        char e = s[++i], t[4];
        int hex = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (hex && i + (size_t)hex < n) {
            uint32_t cp = 0;
            bool ok = true;
            for (int k = 1; k <= hex; k++) {
                char c = s[i + (size_t)k];
                int h = is_digit(c)              ? c - '0'
                        : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                        : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                                 : -1;
                if (h < 0) ok = false;
                cp = cp << 4 | (uint32_t)(h & 15);
            }
            if (ok && cp < 0x110000 && !(cp >= 0xD800 && cp < 0xE000)) {
                jb_put(&b, t, hr_utf8_encode(cp, t));
                i += (size_t)hex;
                continue;
            }
        }
        const char *r = NULL;
        switch (e) {
        case 'n': r = "\n"; break;
        case 't': r = "\t"; break;
        case 'r': r = "\r"; break;
        case '\\': r = "\\"; break;
        case '\'': r = "'"; break;
        case '"': r = "\""; break;
        case 'a': r = "\a"; break;
        case 'b': r = "\b"; break;
        case 'f': r = "\f"; break;
        case 'v': r = "\v"; break;
        case '0':
            r = "";
            jb_put(&b, "\0", 1);
            break;
        case '\n': r = ""; break; /* a backslash-newline continues the literal */
        default: break;
        }
        if (r)
            jb_puts(&b, r);
        else
            jb_put(&b, s + i - 1, 2);
    }
    if (b.over) return NULL;
    return js_new(a, b.p, b.n);
}

/* Cuts the expression tokens of one tag, from *ip up to its end delimiter ("}}" or "%}"), which it
 * consumes; *strip_after tells whether it was "-}}"/"-%}". */
static bool lex_tag(parser *p, const char *s, size_t n, size_t *ip, int *line, char close, bool *strip_after) {
    size_t i = *ip;
    for (;;) {
        while (i < n && is_ws(s[i])) {
            if (s[i] == '\n') (*line)++;
            i++;
        }
        if (i >= n) return perr(p, HR_ERR_FORMAT, *line, "unclosed tag"), false;
        if (s[i] == '-' && i + 2 < n + 0 && s[i + 1] == close && s[i + 2] == '}') {
            *strip_after = true;
            *ip = i + 3;
            return true;
        }
        if (s[i] == close && i + 1 < n && s[i + 1] == '}') {
            *strip_after = false;
            *ip = i + 2;
            return true;
        }
        tok t = {.line = *line};
        char c = s[i];
        if (is_alpha(c)) {
            size_t st = i;
            while (i < n && (is_alpha(s[i]) || is_digit(s[i]))) i++;
            t.t = T_NAME;
            t.s = js_new(p->a, s + st, i - st);
        } else if (is_digit(c)) {
            size_t st = i;
            bool fl = false;
            while (i < n && (is_digit(s[i]) || s[i] == '_')) i++;
            if (i + 1 < n && s[i] == '.' && is_digit(s[i + 1])) {
                fl = true;
                i++;
                while (i < n && (is_digit(s[i]) || s[i] == '_')) i++;
            }
            if (i < n && (s[i] == 'e' || s[i] == 'E')) {
                size_t j = i + 1;
                if (j < n && (s[j] == '+' || s[j] == '-')) j++;
                if (j < n && is_digit(s[j])) {
                    fl = true;
                    i = j;
                    while (i < n && is_digit(s[i])) i++;
                }
            }
            char num[64];
            size_t k = 0;
            for (size_t j = st; j < i && k + 1 < sizeof num; j++)
                if (s[j] != '_') num[k++] = s[j];
            num[k] = '\0';
            if (fl)
                t.t = T_FLOAT, t.f = strtod(num, NULL);
            else
                t.t = T_INT, t.i = strtoll(num, NULL, 10);
            t.s = js_new(p->a, "", 0);
        } else if (c == '\'' || c == '"') {
            size_t st = ++i;
            while (i < n && s[i] != c) {
                if (s[i] == '\\' && i + 1 < n) i++;
                i++;
            }
            if (i >= n) return perr(p, HR_ERR_FORMAT, *line, "unterminated string literal"), false;
            t.t = T_STRING;
            t.s = unescape(p->a, s + st, i - st);
            *line += count_lines(s, st, i);
            i++;
        } else {
            static const char *ops2[] = {"//", "**", "==", "!=", "<=", ">="};
            t.t = T_OP;
            for (size_t k = 0; k < sizeof ops2 / sizeof ops2[0]; k++)
                if (i + 1 < n && s[i] == ops2[k][0] && s[i + 1] == ops2[k][1]) {
                    memcpy(t.op, ops2[k], 2);
                    break;
                }
            if (t.op[0])
                i += 2;
            else if (strchr("+-*/%~<>=.,:|()[]{}", c))
                t.op[0] = c, i++;
            else {
                char what[8] = {c, 0};
                return perr(p, HR_ERR_FORMAT, *line, "unexpected character '%s'", what), false;
            }
            t.s = js_new(p->a, "", 0);
        }
        if (!t.s || !push_tok(p, t)) return perr(p, HR_ERR_NOMEM, *line, "out of memory"), false;
    }
}

static bool lex(parser *p, const char *s, size_t n) {
    if (n > 0 && s[n - 1] == '\n') n--; /* keep_trailing_newline=False */
    size_t i = 0;
    int line = 1;
    bool line_starting = true;
    while (i < n) {
        size_t t = i;
        while (t + 1 < n && !(s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#'))) t++;
        if (t + 1 >= n) t = n;
        size_t text_end = t;
        char kind = t < n ? s[t + 1] : 0, sign = t + 2 < n ? s[t + 2] : 0;
        if (t < n) {
            if (sign == '-') {
                while (text_end > i && is_ws(s[text_end - 1])) text_end--;
            } else if (sign != '+' && kind != '{') { /* lstrip_blocks */
                size_t l = text_end;
                while (l > i && (s[l - 1] == ' ' || s[l - 1] == '\t' || s[l - 1] == '\r' || s[l - 1] == '\v' ||
                                 s[l - 1] == '\f'))
                    l--;
                bool at_line_start = l > i ? s[l - 1] == '\n' : line_starting;
                if (at_line_start) text_end = l;
            }
        }
        if (text_end > i) {
            tok tt = {.t = T_TEXT, .line = line, .s = js_new(p->a, s + i, text_end - i)};
            if (!tt.s || !push_tok(p, tt)) return perr(p, HR_ERR_NOMEM, line, "out of memory"), false;
        }
        line += count_lines(s, i, t);
        if (t >= n) break;
        size_t j = t + 2 + (sign == '-' || sign == '+');
        bool strip_after = false;
        if (kind == '#') {
            size_t e = j;
            while (e + 1 < n && !(s[e] == '#' && s[e + 1] == '}')) e++;
            if (e + 1 >= n) return perr(p, HR_ERR_FORMAT, line, "unclosed comment"), false;
            strip_after = e > j && s[e - 1] == '-';
            line += count_lines(s, j, e);
            j = e + 2;
        } else {
            tok bt = {.t = kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, .line = line, .s = NULL};
            if (!push_tok(p, bt)) return perr(p, HR_ERR_NOMEM, line, "out of memory"), false;
            /* {% raw %}: everything up to {% endraw %} is text */
            size_t k = j;
            while (k < n && is_ws(s[k])) k++;
            if (kind == '%' && n - k >= 3 && memcmp(s + k, "raw", 3) == 0 && (k + 3 >= n || !is_alpha(s[k + 3]))) {
                p->n--; /* drop the block start */
                size_t e = k + 3;
                while (e < n && is_ws(s[e])) e++;
                if (e < n && s[e] == '-') e++;
                if (e + 1 >= n || s[e] != '%' || s[e + 1] != '}')
                    return perr(p, HR_ERR_FORMAT, line, "malformed raw tag"), false;
                size_t body = e + 2, q = body;
                for (; q + 1 < n; q++) {
                    if (s[q] != '{' || s[q + 1] != '%') continue;
                    size_t r = q + 2;
                    if (r < n && (s[r] == '-' || s[r] == '+')) r++;
                    while (r < n && is_ws(s[r])) r++;
                    if (n - r >= 6 && memcmp(s + r, "endraw", 6) == 0) break;
                }
                if (q + 1 >= n) return perr(p, HR_ERR_FORMAT, line, "raw without endraw"), false;
                size_t body_end = q;
                if (q + 2 < n && s[q + 2] == '-')
                    while (body_end > body && is_ws(s[body_end - 1])) body_end--;
                tok tt = {.t = T_TEXT, .line = line, .s = js_new(p->a, s + body, body_end - body)};
                if (!tt.s || !push_tok(p, tt)) return perr(p, HR_ERR_NOMEM, line, "out of memory"), false;
                size_t e2 = q + 2;
                while (e2 + 1 < n && !(s[e2] == '%' && s[e2 + 1] == '}')) e2++;
                if (e2 + 1 >= n) return perr(p, HR_ERR_FORMAT, line, "unclosed endraw"), false;
                strip_after = e2 > q + 2 && s[e2 - 1] == '-';
                line += count_lines(s, j, e2);
                j = e2 + 2;
            } else {
                if (!lex_tag(p, s, n, &j, &line, kind == '{' ? '}' : '%', &strip_after)) return false;
                tok et = {.t = kind == '{' ? T_VAR_END : T_BLOCK_END, .line = line};
                if (!push_tok(p, et)) return perr(p, HR_ERR_NOMEM, line, "out of memory"), false;
            }
        }
        size_t after = j;
        if (strip_after) {
            while (after < n && is_ws(s[after])) after++;
        } else if (kind != '{' && after < n && s[after] == '\n') { /* trim_blocks */
            after++;
        }
        line += count_lines(s, j, after);
        line_starting = after > t && s[after - 1] == '\n';
        i = after;
    }
    tok e = {.t = T_EOF, .line = line};
    if (!push_tok(p, e)) return perr(p, HR_ERR_NOMEM, line, "out of memory"), false;
    return true;
}

/* ---- parser helpers --------------------------------------------------------------------------- */

static tok *cur(parser *p) { return &p->toks[p->pos]; }
static tok *peek(parser *p, size_t k) { return &p->toks[p->pos + k < p->n ? p->pos + k : p->n - 1]; }
static bool is_op(const tok *t, const char *op) { return t->t == T_OP && strcmp(t->op, op) == 0; }
static bool is_name(const tok *t, const char *name) { return t->t == T_NAME && strcmp(t->s->p, name) == 0; }

static bool accept_op(parser *p, const char *op) {
    if (!is_op(cur(p), op)) return false;
    p->pos++;
    return true;
}

static bool expect_op(parser *p, const char *op) {
    if (accept_op(p, op)) return true;
    perr(p, HR_ERR_FORMAT, cur(p)->line, "expected '%s'", op);
    return false;
}

static bool accept_name(parser *p, const char *name) {
    if (!is_name(cur(p), name)) return false;
    p->pos++;
    return true;
}

static jnode *mk(parser *p, jkind kind, int line) {
    jnode *nd = ja_alloc(p->a, sizeof *nd);
    if (!nd) {
        perr(p, HR_ERR_NOMEM, line, "out of memory");
        return NULL;
    }
    nd->kind = (uint8_t)kind;
    nd->line = line;
    return nd;
}

/* A growing array of node pointers, copied into the arena at the end. */
typedef struct nvec {
    jnode **v;
    size_t n, cap;
} nvec;

static bool nv_push(parser *p, nvec *v, jnode *nd) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 8;
        jnode **nn = ja_alloc(p->a, cap * sizeof *nn);
        if (!nn) return perr(p, HR_ERR_NOMEM, 0, "out of memory"), false;
        if (v->n) memcpy(nn, v->v, v->n * sizeof *nn);
        v->v = nn, v->cap = cap;
    }
    v->v[v->n++] = nd;
    return true;
}

static bool enter(parser *p) {
    if (++p->depth > p->max_depth) {
        perr(p, HR_ERR_RANGE, cur(p)->line, "nested deeper than the limit");
        return false;
    }
    return true;
}

/* ---- expressions ------------------------------------------------------------------------------ */

static jnode *parse_expr(parser *p);
static jnode *parse_or(parser *p);
static jnode *parse_unary(parser *p, bool with_filter);
static jnode *parse_primary(parser *p);

/* (args...) after the '(' is consumed: positional args and name=value keywords. */
static bool parse_args(parser *p, jnode *call) {
    nvec pos = {0}, kwv = {0};
    jstr **kw = NULL;
    size_t kwcap = 0;
    while (!is_op(cur(p), ")")) {
        if (pos.n + kwv.n > 0 && !expect_op(p, ",")) return false;
        if (is_op(cur(p), ")")) break; /* trailing comma */
        if (cur(p)->t == T_NAME && is_op(peek(p, 1), "=")) {
            jstr *name = cur(p)->s;
            p->pos += 2;
            jnode *v = parse_expr(p);
            if (!v || !nv_push(p, &kwv, v)) return false;
            if (kwv.n > kwcap) {
                size_t cap = kwcap ? kwcap * 2 : 4;
                jstr **nk = ja_alloc(p->a, cap * sizeof *nk);
                if (!nk) return perr(p, HR_ERR_NOMEM, 0, "out of memory"), false;
                if (kwv.n > 1) memcpy(nk, kw, (kwv.n - 1) * sizeof *nk);
                kw = nk, kwcap = cap;
            }
            kw[kwv.n - 1] = name;
        } else {
            if (kwv.n) return perr(p, HR_ERR_FORMAT, cur(p)->line, "positional argument after a keyword"), false;
            jnode *v = parse_expr(p);
            if (!v || !nv_push(p, &pos, v)) return false;
        }
    }
    p->pos++;
    call->items = pos.v, call->n_items = pos.n;
    call->kw = kw, call->kw_vals = kwv.v, call->n_kw = kwv.n;
    return true;
}

static jnode *parse_postfix(parser *p, jnode *nd) {
    for (;;) {
        tok *t = cur(p);
        if (is_op(t, ".")) {
            p->pos++;
            tok *nt = cur(p);
            jnode *at = mk(p, JN_ATTR, nt->line);
            if (!at) return NULL;
            at->a = nd;
            if (nt->t == T_NAME)
                at->name = nt->s;
            else if (nt->t == T_INT) { /* foo.0 is foo[0] */
                at->kind = JN_ITEM;
                at->b = mk(p, JN_LIT, nt->line);
                if (!at->b) return NULL;
                at->b->lit = jv_int(nt->i);
            } else
                return perr(p, HR_ERR_FORMAT, nt->line, "expected a name after '.'"), NULL;
            p->pos++;
            nd = at;
        } else if (is_op(t, "[")) {
            p->pos++;
            jnode *parts[3] = {0};
            int n_colon = 0;
            for (;;) {
                if (is_op(cur(p), "]")) break;
                if (is_op(cur(p), ":")) {
                    if (++n_colon > 2) return perr(p, HR_ERR_FORMAT, cur(p)->line, "bad slice"), NULL;
                    p->pos++;
                    continue;
                }
                if (parts[n_colon]) return perr(p, HR_ERR_FORMAT, cur(p)->line, "expected ']'"), NULL;
                parts[n_colon] = parse_expr(p);
                if (!parts[n_colon]) return NULL;
            }
            p->pos++;
            jnode *it = mk(p, n_colon ? JN_SLICE : JN_ITEM, t->line);
            if (!it) return NULL;
            it->a = nd;
            if (n_colon)
                it->b = parts[0], it->c = parts[1], it->d = parts[2];
            else if (!parts[0])
                return perr(p, HR_ERR_FORMAT, t->line, "empty subscript"), NULL;
            else
                it->b = parts[0];
            nd = it;
        } else if (is_op(t, "(")) {
            p->pos++;
            jnode *c = mk(p, JN_CALL, t->line);
            if (!c) return NULL;
            c->a = nd;
            if (!parse_args(p, c)) return NULL;
            nd = c;
        } else {
            return nd;
        }
    }
}

/* | name [(args)] ..., and `is [not] test [arg]` */
static jnode *parse_filters_tests(parser *p, jnode *nd) {
    for (;;) {
        tok *t = cur(p);
        if (is_op(t, "|")) {
            p->pos++;
            if (cur(p)->t != T_NAME) return perr(p, HR_ERR_FORMAT, cur(p)->line, "expected a filter name"), NULL;
            jnode *f = mk(p, JN_FILTER, t->line);
            if (!f) return NULL;
            f->a = nd;
            f->name = cur(p)->s;
            p->pos++;
            while (accept_op(p, ".")) { /* dotted filter names are not in the subset */
                return perr(p, HR_ERR_UNSUPPORTED, t->line, "dotted filter name"), NULL;
            }
            if (accept_op(p, "(") && !parse_args(p, f)) return NULL;
            nd = f;
        } else if (is_name(t, "is")) {
            p->pos++;
            jnode *te = mk(p, JN_TEST, t->line);
            if (!te) return NULL;
            te->a = nd;
            if (accept_name(p, "not")) te->neg = true;
            tok *nt = cur(p);
            if (nt->t == T_NAME)
                te->name = nt->s;
            else if (nt->t == T_OP && (is_op(nt, "==") || is_op(nt, "!=") || is_op(nt, "<") || is_op(nt, ">") ||
                                       is_op(nt, "<=") || is_op(nt, ">="))) {
                te->name = js_new(p->a, nt->op, strlen(nt->op));
                if (!te->name) return perr(p, HR_ERR_NOMEM, nt->line, "out of memory"), NULL;
            } else
                return perr(p, HR_ERR_FORMAT, nt->line, "expected a test name"), NULL;
            /* none/true/false are test names here, not literals */
            p->pos++;
            if (accept_op(p, "(")) {
                if (!parse_args(p, te)) return NULL;
            } else {
                tok *at = cur(p);
                bool starts_arg =
                    at->t == T_STRING || at->t == T_INT || at->t == T_FLOAT ||
                    (at->t == T_NAME && !is_name(at, "else") && !is_name(at, "or") && !is_name(at, "and") &&
                     !is_name(at, "is") && !is_name(at, "if") && !is_name(at, "in") && !is_name(at, "not")) ||
                    is_op(at, "[") || is_op(at, "{");
                if (starts_arg) {
                    jnode *arg = parse_primary(p);
                    if (!arg) return NULL;
                    arg = parse_postfix(p, arg);
                    if (!arg) return NULL;
                    te->items = ja_alloc(p->a, sizeof(jnode *));
                    if (!te->items) return perr(p, HR_ERR_NOMEM, 0, "out of memory"), NULL;
                    te->items[0] = arg;
                    te->n_items = 1;
                }
            }
            nd = te;
        } else if (is_op(t, "(")) { /* a call after a filter: (x|f)() is rare but legal */
            nd = parse_postfix(p, nd);
            if (!nd) return NULL;
        } else {
            return nd;
        }
    }
}

static jnode *parse_primary(parser *p) {
    if (!enter(p)) return NULL;
    tok *t = cur(p);
    jnode *nd = NULL;
    if (t->t == T_NAME) {
        p->pos++;
        const char *s = t->s->p;
        if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "false") || !strcmp(s, "False")) {
            nd = mk(p, JN_LIT, t->line);
            if (nd) nd->lit = jv_bool(s[0] == 't' || s[0] == 'T');
        } else if (!strcmp(s, "none") || !strcmp(s, "None")) {
            nd = mk(p, JN_LIT, t->line);
            if (nd) nd->lit = jv_none();
        } else {
            nd = mk(p, JN_NAME, t->line);
            if (nd) nd->name = t->s;
        }
    } else if (t->t == T_STRING) {
        /* adjacent literals concatenate */
        jbuf b = {.a = p->a, .limit = SIZE_MAX};
        jb_put(&b, "", 0);
        while (cur(p)->t == T_STRING) {
            jb_put(&b, cur(p)->s->p, cur(p)->s->n);
            p->pos++;
        }
        nd = mk(p, JN_LIT, t->line);
        if (nd) {
            nd->lit = b.over ? jv_undef(NULL) : jv_str(p->a, b.p, b.n);
            if (nd->lit.t != JV_STR) return perr(p, HR_ERR_NOMEM, t->line, "out of memory"), NULL;
        }
    } else if (t->t == T_INT || t->t == T_FLOAT) {
        p->pos++;
        nd = mk(p, JN_LIT, t->line);
        if (nd) nd->lit = t->t == T_INT ? jv_int(t->i) : (jv){.t = JV_FLOAT, .u.f = t->f};
    } else if (is_op(t, "(")) {
        p->pos++;
        if (accept_op(p, ")")) {
            nd = mk(p, JN_TUPLE, t->line);
        } else {
            jnode *first = parse_expr(p);
            if (!first) return NULL;
            if (is_op(cur(p), ",")) {
                nvec v = {0};
                if (!nv_push(p, &v, first)) return NULL;
                while (accept_op(p, ",")) {
                    if (is_op(cur(p), ")")) break;
                    jnode *e = parse_expr(p);
                    if (!e || !nv_push(p, &v, e)) return NULL;
                }
                nd = mk(p, JN_TUPLE, t->line);
                if (nd) nd->items = v.v, nd->n_items = v.n;
            } else {
                nd = first;
            }
            if (!expect_op(p, ")")) return NULL;
        }
    } else if (is_op(t, "[")) {
        p->pos++;
        nvec v = {0};
        while (!accept_op(p, "]")) {
            if (v.n && !expect_op(p, ",")) return NULL;
            if (accept_op(p, "]")) break;
            jnode *e = parse_expr(p);
            if (!e || !nv_push(p, &v, e)) return NULL;
        }
        nd = mk(p, JN_LIST, t->line);
        if (nd) nd->items = v.v, nd->n_items = v.n;
    } else if (is_op(t, "{")) {
        p->pos++;
        nvec k = {0}, v = {0};
        while (!accept_op(p, "}")) {
            if (k.n && !expect_op(p, ",")) return NULL;
            if (accept_op(p, "}")) break;
            jnode *ke = parse_expr(p);
            if (!ke || !expect_op(p, ":")) return NULL;
            jnode *ve = parse_expr(p);
            if (!ve || !nv_push(p, &k, ke) || !nv_push(p, &v, ve)) return NULL;
        }
        nd = mk(p, JN_DICT, t->line);
        if (nd) nd->items = k.v, nd->items2 = v.v, nd->n_items = k.n;
    } else if (t->t == T_VAR_END || t->t == T_BLOCK_END || t->t == T_EOF) {
        perr(p, HR_ERR_FORMAT, t->line, "expected an expression");
    } else {
        perr(p, HR_ERR_FORMAT, t->line, "unexpected '%s'", t->t == T_OP ? t->op : t->s ? t->s->p : "?");
    }
    p->depth--;
    return nd;
}

static jnode *parse_unary(parser *p, bool with_filter) {
    if (!enter(p)) return NULL;
    tok *t = cur(p);
    jnode *nd;
    if (is_op(t, "-") || is_op(t, "+")) {
        p->pos++;
        jnode *a = parse_unary(p, false);
        if (!a) return NULL;
        nd = mk(p, JN_UNARY, t->line);
        if (!nd) return NULL;
        nd->op = (uint8_t)t->op[0];
        nd->a = a;
    } else {
        nd = parse_primary(p);
        if (!nd) return NULL;
        nd = parse_postfix(p, nd);
    }
    if (nd && with_filter) nd = parse_filters_tests(p, nd);
    p->depth--;
    return nd;
}

static jnode *binary(parser *p, int op, jnode *a, jnode *b, int line) {
    if (!a || !b) return NULL;
    jnode *nd = mk(p, JN_BINARY, line);
    if (!nd) return NULL;
    nd->op = (uint8_t)op;
    nd->a = a, nd->b = b;
    return nd;
}

static jnode *parse_pow(parser *p) {
    jnode *a = parse_unary(p, true);
    while (a && is_op(cur(p), "**")) {
        int line = cur(p)->line;
        p->pos++;
        a = binary(p, JOP_POW, a, parse_unary(p, true), line);
    }
    return a;
}

static jnode *parse_mul(parser *p) {
    jnode *a = parse_pow(p);
    for (;;) {
        tok *t = cur(p);
        int op = is_op(t, "*")    ? JOP_MUL
                 : is_op(t, "/")  ? JOP_DIV
                 : is_op(t, "//") ? JOP_FLOORDIV
                 : is_op(t, "%")  ? JOP_MOD
                                  : 0;
        if (!a || !op) return a;
        p->pos++;
        a = binary(p, op, a, parse_pow(p), t->line);
    }
}

static jnode *parse_concat(parser *p) {
    jnode *a = parse_mul(p);
    while (a && is_op(cur(p), "~")) {
        int line = cur(p)->line;
        p->pos++;
        a = binary(p, JOP_CONCAT, a, parse_mul(p), line);
    }
    return a;
}

static jnode *parse_add(parser *p) {
    jnode *a = parse_concat(p);
    for (;;) {
        tok *t = cur(p);
        int op = is_op(t, "+") ? JOP_ADD : is_op(t, "-") ? JOP_SUB : 0;
        if (!a || !op) return a;
        p->pos++;
        a = binary(p, op, a, parse_concat(p), t->line);
    }
}

static jnode *parse_compare(parser *p) {
    jnode *a = parse_add(p);
    for (;;) {
        tok *t = cur(p);
        int op = is_op(t, "==")     ? JOP_EQ
                 : is_op(t, "!=")   ? JOP_NE
                 : is_op(t, "<")    ? JOP_LT
                 : is_op(t, "<=")   ? JOP_LE
                 : is_op(t, ">")    ? JOP_GT
                 : is_op(t, ">=")   ? JOP_GE
                 : is_name(t, "in") ? JOP_IN
                                    : 0;
        if (!op && is_name(t, "not") && is_name(peek(p, 1), "in")) {
            op = JOP_NOTIN;
            p->pos++;
        }
        if (!a || !op) return a;
        p->pos++;
        a = binary(p, op, a, parse_add(p), t->line);
    }
}

static jnode *parse_not(parser *p) {
    tok *t = cur(p);
    if (is_name(t, "not")) {
        p->pos++;
        if (!enter(p)) return NULL;
        jnode *a = parse_not(p);
        p->depth--;
        if (!a) return NULL;
        jnode *nd = mk(p, JN_UNARY, t->line);
        if (!nd) return NULL;
        nd->op = 'n';
        nd->a = a;
        return nd;
    }
    return parse_compare(p);
}

static jnode *parse_and(parser *p) {
    jnode *a = parse_not(p);
    while (a && is_name(cur(p), "and")) {
        int line = cur(p)->line;
        p->pos++;
        jnode *b = parse_not(p);
        if (!b) return NULL;
        jnode *nd = mk(p, JN_AND, line);
        if (!nd) return NULL;
        nd->a = a, nd->b = b;
        a = nd;
    }
    return a;
}

static jnode *parse_or(parser *p) {
    jnode *a = parse_and(p);
    while (a && is_name(cur(p), "or")) {
        int line = cur(p)->line;
        p->pos++;
        jnode *b = parse_and(p);
        if (!b) return NULL;
        jnode *nd = mk(p, JN_OR, line);
        if (!nd) return NULL;
        nd->a = a, nd->b = b;
        a = nd;
    }
    return a;
}

static jnode *parse_expr(parser *p) {
    if (!enter(p)) return NULL;
    jnode *a = parse_or(p);
    while (a && is_name(cur(p), "if")) {
        int line = cur(p)->line;
        p->pos++;
        jnode *cond = parse_or(p);
        if (!cond) return NULL;
        jnode *els = NULL;
        if (accept_name(p, "else")) {
            els = parse_or(p);
            if (!els) return NULL;
        }
        jnode *nd = mk(p, JN_COND, line);
        if (!nd) return NULL;
        nd->a = cond, nd->b = a, nd->c = els;
        a = nd;
    }
    p->depth--;
    return a;
}

/* ---- statements ------------------------------------------------------------------------------- */

static bool parse_body(parser *p, nvec *out, const char *const *ends, const char **found);

static bool expect_block_end(parser *p) {
    if (cur(p)->t == T_BLOCK_END) {
        p->pos++;
        return true;
    }
    perr(p, HR_ERR_FORMAT, cur(p)->line, "expected '%%}'");
    return false;
}

/* A block that closes with {% NAME %} (after its body), e.g. endfor. */
static bool parse_block_body(parser *p, nvec *body, const char *const *ends, const char **found) {
    if (!enter(p)) return false;
    bool ok = parse_body(p, body, ends, found);
    p->depth--;
    return ok;
}

/* Names for a for/set target: a, or a, b, or (a, b). */
static bool parse_targets(parser *p, nvec *names) {
    bool paren = accept_op(p, "(");
    do {
        tok *t = cur(p);
        if (t->t != T_NAME) return perr(p, HR_ERR_FORMAT, t->line, "expected a name"), false;
        jnode *nd = mk(p, JN_NAME, t->line);
        if (!nd) return false;
        nd->name = t->s;
        p->pos++;
        if (!nv_push(p, names, nd)) return false;
    } while (accept_op(p, ","));
    if (paren && !expect_op(p, ")")) return false;
    return true;
}

static jnode *parse_if(parser *p, int line) {
    jnode *nd = mk(p, JN_IF, line);
    if (!nd) return NULL;
    nd->a = parse_expr(p);
    if (!nd->a || !expect_block_end(p)) return NULL;
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    nvec body = {0};
    const char *found = NULL;
    if (!parse_block_body(p, &body, ends, &found)) return NULL;
    nd->body = body.v, nd->n_body = body.n;
    if (!strcmp(found, "elif")) {
        jnode *el = parse_if(p, cur(p)->line); /* consumes through endif */
        if (!el) return NULL;
        nd->else_body = ja_alloc(p->a, sizeof(jnode *));
        if (!nd->else_body) return perr(p, HR_ERR_NOMEM, line, "out of memory"), NULL;
        nd->else_body[0] = el;
        nd->n_else = 1;
        return nd;
    }
    if (!expect_block_end(p)) return NULL;
    if (!strcmp(found, "else")) {
        static const char *const ends2[] = {"endif", NULL};
        nvec eb = {0};
        if (!parse_block_body(p, &eb, ends2, &found) || !expect_block_end(p)) return NULL;
        nd->else_body = eb.v, nd->n_else = eb.n;
    }
    return nd;
}

static jnode *parse_for(parser *p, int line) {
    jnode *nd = mk(p, JN_FOR, line);
    if (!nd) return NULL;
    nvec names = {0};
    if (!parse_targets(p, &names)) return NULL;
    nd->items = names.v, nd->n_items = names.n;
    if (!accept_name(p, "in")) return perr(p, HR_ERR_FORMAT, cur(p)->line, "expected 'in'"), NULL;
    nd->a = parse_or(p); /* not parse_expr: a trailing `if` filters the loop */
    if (!nd->a) return NULL;
    if (accept_name(p, "if")) {
        nd->b = parse_expr(p);
        if (!nd->b) return NULL;
    }
    if (accept_name(p, "recursive")) return perr(p, HR_ERR_UNSUPPORTED, line, "recursive loops"), NULL;
    if (!expect_block_end(p)) return NULL;
    static const char *const ends[] = {"else", "endfor", NULL};
    nvec body = {0};
    const char *found = NULL;
    if (!parse_block_body(p, &body, ends, &found) || !expect_block_end(p)) return NULL;
    nd->body = body.v, nd->n_body = body.n;
    if (!strcmp(found, "else")) {
        static const char *const ends2[] = {"endfor", NULL};
        nvec eb = {0};
        if (!parse_block_body(p, &eb, ends2, &found) || !expect_block_end(p)) return NULL;
        nd->else_body = eb.v, nd->n_else = eb.n;
    }
    return nd;
}

static jnode *parse_set(parser *p, int line) {
    jnode *nd = mk(p, JN_SET, line);
    if (!nd) return NULL;
    tok *t = cur(p);
    if (t->t == T_NAME && is_op(peek(p, 1), ".")) { /* set ns.attr = value */
        if (peek(p, 2)->t != T_NAME) return perr(p, HR_ERR_FORMAT, line, "expected an attribute name"), NULL;
        jnode *target = mk(p, JN_ATTR, line);
        if (!target) return NULL;
        target->a = mk(p, JN_NAME, line);
        if (!target->a) return NULL;
        target->a->name = t->s;
        target->name = peek(p, 2)->s;
        p->pos += 3;
        nd->c = target;
    } else {
        nvec names = {0};
        if (!parse_targets(p, &names)) return NULL;
        nd->items = names.v, nd->n_items = names.n;
    }
    if (accept_op(p, "=")) {
        jnode *v = parse_expr(p);
        if (v && is_op(cur(p), ",")) { /* set a, b = 1, 2 */
            nvec tv = {0};
            if (!nv_push(p, &tv, v)) return NULL;
            while (accept_op(p, ",")) {
                jnode *e = parse_expr(p);
                if (!e || !nv_push(p, &tv, e)) return NULL;
            }
            v = mk(p, JN_TUPLE, line);
            if (v) v->items = tv.v, v->n_items = tv.n;
        }
        nd->a = v;
        if (!nd->a || !expect_block_end(p)) return NULL;
        return nd;
    }
    /* block set: {% set x %}...{% endset %} (also with a filter: {% set x | trim %}) */
    if (nd->c || nd->n_items != 1) return perr(p, HR_ERR_FORMAT, line, "expected '='"), NULL;
    if (is_op(cur(p), "|")) {
        jnode *f = parse_filters_tests(p, NULL);
        if (!f) return NULL;
        nd->d = f; /* a filter chain whose innermost input is NULL: the body */
    }
    if (!expect_block_end(p)) return NULL;
    static const char *const ends[] = {"endset", NULL};
    nvec body = {0};
    const char *found = NULL;
    if (!parse_block_body(p, &body, ends, &found) || !expect_block_end(p)) return NULL;
    nd->body = body.v, nd->n_body = body.n;
    return nd;
}

/* (a, b=default, ...) of a macro or a call block's caller. */
static bool parse_params(parser *p, jnode *nd) {
    nvec names = {0}, defs = {0};
    if (accept_op(p, "(")) {
        while (!accept_op(p, ")")) {
            if (names.n && !expect_op(p, ",")) return false;
            if (accept_op(p, ")")) break;
            tok *t = cur(p);
            if (t->t != T_NAME) return perr(p, HR_ERR_FORMAT, t->line, "expected a parameter name"), false;
            jnode *nm = mk(p, JN_NAME, t->line);
            if (!nm) return false;
            nm->name = t->s;
            p->pos++;
            jnode *def = NULL;
            if (accept_op(p, "=")) {
                def = parse_expr(p);
                if (!def) return false;
            }
            if (!nv_push(p, &names, nm) || !nv_push(p, &defs, def)) return false;
        }
    }
    nd->items = names.v, nd->items2 = defs.v, nd->n_items = names.n;
    return true;
}

static jnode *parse_macro(parser *p, int line) {
    jnode *nd = mk(p, JN_MACRO, line);
    if (!nd) return NULL;
    if (cur(p)->t != T_NAME) return perr(p, HR_ERR_FORMAT, line, "expected a macro name"), NULL;
    nd->name = cur(p)->s;
    p->pos++;
    if (!is_op(cur(p), "(")) return perr(p, HR_ERR_FORMAT, line, "expected '('"), NULL;
    if (!parse_params(p, nd) || !expect_block_end(p)) return NULL;
    static const char *const ends[] = {"endmacro", NULL};
    nvec body = {0};
    const char *found = NULL;
    if (!parse_block_body(p, &body, ends, &found)) return NULL;
    if (cur(p)->t == T_NAME) p->pos++; /* {% endmacro name %} */
    if (!expect_block_end(p)) return NULL;
    nd->body = body.v, nd->n_body = body.n;
    return nd;
}

static jnode *parse_call_block(parser *p, int line) {
    jnode *nd = mk(p, JN_CALLBLOCK, line);
    if (!nd) return NULL;
    if (is_op(cur(p), "(") && !parse_params(p, nd)) return NULL;
    nd->a = parse_expr(p);
    if (!nd->a) return NULL;
    if (nd->a->kind != JN_CALL) return perr(p, HR_ERR_FORMAT, line, "expected a call after 'call'"), NULL;
    if (!expect_block_end(p)) return NULL;
    static const char *const ends[] = {"endcall", NULL};
    nvec body = {0};
    const char *found = NULL;
    if (!parse_block_body(p, &body, ends, &found) || !expect_block_end(p)) return NULL;
    nd->body = body.v, nd->n_body = body.n;
    return nd;
}

static jnode *parse_filter_block(parser *p, int line) {
    jnode *nd = mk(p, JN_FILTERBLOCK, line);
    if (!nd) return NULL;
    /* `filter upper | trim`: the same chain as after a '|', its first input the body */
    if (cur(p)->t != T_NAME) return perr(p, HR_ERR_FORMAT, line, "expected a filter name"), NULL;
    jnode *f = mk(p, JN_FILTER, line);
    if (!f) return NULL;
    f->name = cur(p)->s;
    p->pos++;
    if (accept_op(p, "(") && !parse_args(p, f)) return NULL;
    f = parse_filters_tests(p, f);
    if (!f || !expect_block_end(p)) return NULL;
    nd->a = f;
    static const char *const ends[] = {"endfilter", NULL};
    nvec body = {0};
    const char *found = NULL;
    if (!parse_block_body(p, &body, ends, &found) || !expect_block_end(p)) return NULL;
    nd->body = body.v, nd->n_body = body.n;
    return nd;
}

/* Statements up to one of ends (a NULL-terminated list; NULL = the end of the template). On
 * success *found is the end keyword met (its tag's name consumed, not the '%}'). */
static bool parse_body(parser *p, nvec *out, const char *const *ends, const char **found) {
    for (;;) {
        tok *t = cur(p);
        if (t->t == T_EOF) {
            if (ends) {
                const char *const *last = ends;
                while (last[1]) last++;
                return perr(p, HR_ERR_FORMAT, t->line, "missing {%% %s %%}", *last), false;
            }
            return true;
        }
        if (t->t == T_TEXT) {
            jnode *nd = mk(p, JN_TEXT, t->line);
            if (!nd) return false;
            nd->lit = (jv){.t = JV_STR, .u.s = t->s};
            p->pos++;
            if (!nv_push(p, out, nd)) return false;
            continue;
        }
        if (t->t == T_VAR_BEGIN) {
            p->pos++;
            jnode *nd = mk(p, JN_OUTPUT, t->line);
            if (!nd) return false;
            nd->a = parse_expr(p);
            if (!nd->a) return false;
            if (cur(p)->t != T_VAR_END) return perr(p, HR_ERR_FORMAT, cur(p)->line, "expected '}}'"), false;
            p->pos++;
            if (!nv_push(p, out, nd)) return false;
            continue;
        }
        if (t->t != T_BLOCK_BEGIN) return perr(p, HR_ERR_FORMAT, t->line, "unexpected token"), false;
        tok *kw = peek(p, 1);
        if (kw->t != T_NAME) return perr(p, HR_ERR_FORMAT, kw->line, "expected a statement name"), false;
        const char *name = kw->s->p;
        for (const char *const *e = ends; e && *e; e++)
            if (!strcmp(name, *e)) {
                p->pos += 2;
                *found = *e;
                return true;
            }
        p->pos += 2;
        jnode *nd = NULL;
        int line = kw->line;
        if (!strcmp(name, "if"))
            nd = parse_if(p, line);
        else if (!strcmp(name, "for"))
            nd = parse_for(p, line);
        else if (!strcmp(name, "set"))
            nd = parse_set(p, line);
        else if (!strcmp(name, "macro"))
            nd = parse_macro(p, line);
        else if (!strcmp(name, "call"))
            nd = parse_call_block(p, line);
        else if (!strcmp(name, "filter"))
            nd = parse_filter_block(p, line);
        else if (!strcmp(name, "break") || !strcmp(name, "continue")) {
            nd = mk(p, name[0] == 'b' ? JN_BREAK : JN_CONTINUE, line);
            if (nd && !expect_block_end(p)) return false;
        } else if (!strcmp(name, "generation") || !strcmp(name, "endgeneration")) {
            /* HF's assistant-mask markers: they render nothing themselves */
            if (!expect_block_end(p)) return false;
            continue;
        } else if (!strcmp(name, "elif") || !strcmp(name, "else") || !strncmp(name, "end", 3)) {
            return perr(p, HR_ERR_FORMAT, line, "unexpected {%% %s %%}", name), false;
        } else {
            return perr(p, HR_ERR_UNSUPPORTED, line, "the '%s' statement is not supported", name), false;
        }
        if (!nd || !nv_push(p, out, nd)) return false;
    }
}

/* ---- entry ------------------------------------------------------------------------------------ */

hr_jinja_limits jinja_limits_or_default(const hr_jinja_limits *l) {
    hr_jinja_limits d = l ? *l : (hr_jinja_limits){0};
    if (!d.max_steps) d.max_steps = 2000000;
    if (!d.max_output_bytes) d.max_output_bytes = (size_t)4 << 20;
    if (!d.max_memory_bytes) d.max_memory_bytes = (size_t)64 << 20;
    if (d.max_depth <= 0) d.max_depth = 200;
    return d;
}

hr_status hr_jinja_parse(const char *src, size_t len, const hr_jinja_limits *limits, hr_jinja **out, hr_error *err) {
    if (!out || (!src && len)) return hr_error_set(err, HR_ERR_INVALID_ARG, "hr_jinja_parse: NULL argument");
    hr_jinja *t = calloc(1, sizeof *t);
    if (!t) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    t->limits = jinja_limits_or_default(limits);
    /* a template's tree is a small multiple of its text; the cap only stops a runaway */
    t->arena.cap = len > (SIZE_MAX - (64u << 20)) / 64 ? SIZE_MAX : 64 * len + (64u << 20);
    parser p = {.a = &t->arena, .max_depth = t->limits.max_depth, .err = err, .st = HR_OK};
    nvec body = {0};
    if (lex(&p, src ? src : "", len) && parse_body(&p, &body, NULL, NULL)) {
        t->body = body.v, t->n_body = body.n;
        *out = t;
        return HR_OK;
    }
    hr_status st = p.st != HR_OK ? p.st : hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    if (t->arena.over && p.st == HR_OK) st = hr_error_set(err, HR_ERR_NOMEM, "template too large");
    ja_free(&t->arena);
    free(t);
    return st;
}

void hr_jinja_destroy(hr_jinja *t) {
    if (!t) return;
    ja_free(&t->arena);
    free(t);
}

/* compile.c: every source kind to GBNF text, then to the IR (grammar.c); and the cache of compiled
 * grammars keyed by (kind, source bytes), so a schema sent with every request compiles once. */
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "constrain/constrain_internal.h"

/* ---- a growable string ---------------------------------------------------------------------------- */

void hr_sbuf_put(hr_sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = HR_MAX(b->cap * 2, b->n + n + 256);
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

void hr_sbuf_puts(hr_sbuf *b, const char *s) { hr_sbuf_put(b, s, strlen(s)); }

void hr_sbuf_printf(hr_sbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        hr_sbuf_put(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    hr_sbuf_put(b, big, (size_t)n);
    free(big);
}

void hr_sbuf_literal(hr_sbuf *b, const char *s, size_t n) {
    hr_sbuf_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            hr_sbuf_put(b, e, 2);
        } else if (c < 0x20 || c == 0x7F) {
            hr_sbuf_printf(b, "\\x%02X", c);
        } else {
            hr_sbuf_put(b, (const char *)&c, 1);
        }
    }
    hr_sbuf_put(b, "\"", 1);
}

/* ---- kinds ---------------------------------------------------------------------------------------- */

const char *hr_cons_kind_name(hr_cons_kind k) {
    static const char *n[] = {"none", "json", "json_schema", "regex", "grammar", "choice"};
    return (unsigned)k < HR_ARRAY_LEN(n) ? n[k] : "?";
}

uint64_t hr_cons_hash(hr_cons_kind kind, const char *src, size_t len) {
    uint64_t h = hr_mix64(0x636F6E73ull ^ (uint64_t)kind);
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, src + i, 8);
        h = hr_mix64(h ^ w);
    }
    uint64_t tail = 0;
    memcpy(&tail, src + i, len - i);
    return hr_mix64(h ^ tail ^ ((uint64_t)len << 56));
}

/* Any JSON object: the generic JSON rules (schema.c's value rules are the same text). */
extern const char hr_cons_json_rules[];

static hr_status choice_text(const char *src, size_t len, hr_sbuf *out, hr_error *err) {
    json_error_t je;
    json_t *a = json_loadb(src, len, JSON_DECODE_ANY, &je);
    hr_status st = HR_OK;
    if (!a || !json_is_array(a) || json_array_size(a) == 0) {
        st = hr_error_set(err, HR_ERR_INVALID_ARG, "the choices must be a non-empty array of strings");
    } else {
        hr_sbuf_puts(out, "root ::= ");
        for (size_t i = 0; i < json_array_size(a) && st == HR_OK; i++) {
            json_t *s = json_array_get(a, i);
            if (!json_is_string(s)) {
                st = hr_error_set(err, HR_ERR_INVALID_ARG, "choice %zu is not a string", i);
                break;
            }
            if (i) hr_sbuf_puts(out, " | ");
            hr_sbuf_literal(out, json_string_value(s), json_string_length(s));
        }
        hr_sbuf_puts(out, "\n");
    }
    json_decref(a);
    return st;
}

hr_status hr_grammar_compile(hr_cons_kind kind, const char *src, size_t len, hr_grammar **out, hr_error *err) {
    if (len > HR_CONS_MAX_SOURCE)
        return hr_error_set(err, HR_ERR_RANGE, "the source has %zu bytes: above %u (the bound on source size)", len,
                            HR_CONS_MAX_SOURCE);
    hr_sbuf text = {0};
    hr_status st = HR_OK;
    switch (kind) {
    case HR_CONS_GRAMMAR:
    case HR_CONS_REGEX: hr_sbuf_put(&text, src ? src : "", src ? len : 0); break;
    case HR_CONS_JSON:
        hr_sbuf_puts(&text, "root ::= ws object\n");
        hr_sbuf_puts(&text, hr_cons_json_rules);
        break;
    case HR_CONS_CHOICE: st = choice_text(src, len, &text, err); break;
    case HR_CONS_JSON_SCHEMA: {
        char *t = NULL;
        st = hr_cons_schema_to_gbnf(src, len, &t, err);
        if (st == HR_OK) hr_sbuf_puts(&text, t);
        free(t);
        break;
    }
    default: st = hr_error_set(err, HR_ERR_INVALID_ARG, "unknown constraint kind %d", (int)kind);
    }
    if (st == HR_OK && text.oom) st = hr_error_set(err, HR_ERR_NOMEM, "out of memory compiling the grammar");
    if (st == HR_OK && !text.s) hr_sbuf_put(&text, "", 0);
    hr_grammar *g = NULL;
    if (st == HR_OK) st = hr_cons_compile_gbnf(text.s, text.n, kind == HR_CONS_REGEX, &g, err);
    if (st == HR_OK) {
        g->kind = kind;
        g->text = text.s;
        text.s = NULL;
        g->src = malloc(len + 1);
        if (!g->src) {
            hr_grammar_release(g);
            st = hr_error_set(err, HR_ERR_NOMEM, "out of memory compiling the grammar");
        } else {
            if (len) memcpy(g->src, src, len);
            g->src[len] = 0;
            g->src_len = len;
            g->hash = hr_cons_hash(kind, src ? src : "", len);
        }
    }
    free(text.s);
    if (st == HR_OK) *out = g;
    return st;
}

/* ---- the cache ------------------------------------------------------------------------------------- */

struct hr_grammar_cache {
    pthread_mutex_t mu;
    hr_grammar **g; /* [cap], most recently used first */
    int n, cap;
    uint64_t hits, misses;
};

hr_status hr_grammar_cache_create(int capacity, hr_grammar_cache **out, hr_error *err) {
    hr_grammar_cache *c = calloc(1, sizeof *c);
    if (c) c->g = calloc((size_t)HR_MAX(capacity, 1), sizeof *c->g);
    if (!c || !c->g) {
        free(c);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory creating the grammar cache");
    }
    c->cap = HR_MAX(capacity, 1);
    pthread_mutex_init(&c->mu, NULL);
    *out = c;
    return HR_OK;
}

void hr_grammar_cache_destroy(hr_grammar_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) hr_grammar_release(c->g[i]);
    free(c->g);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static hr_grammar *cache_find(hr_grammar_cache *c, hr_cons_kind kind, const char *src, size_t len, uint64_t h) {
    for (int i = 0; i < c->n; i++) {
        hr_grammar *g = c->g[i];
        if (g->hash == h && g->kind == kind && g->src_len == len && (len == 0 || !memcmp(g->src, src, len))) {
            memmove(c->g + 1, c->g, sizeof *c->g * (size_t)i);
            c->g[0] = g;
            return hr_grammar_retain(g);
        }
    }
    return NULL;
}

hr_status hr_grammar_cache_get(hr_grammar_cache *c, hr_cons_kind kind, const char *src, size_t len, hr_grammar **out,
                               hr_error *err) {
    uint64_t h = hr_cons_hash(kind, src ? src : "", len);
    pthread_mutex_lock(&c->mu);
    hr_grammar *g = cache_find(c, kind, src, len, h);
    if (g) c->hits++;
    pthread_mutex_unlock(&c->mu);
    if (g) {
        *out = g;
        return HR_OK;
    }
    /* compiled outside the lock: a slow compile (bounded by HR_CONS_MAX_COMPILE_S) blocks no one */
    hr_status st = hr_grammar_compile(kind, src, len, &g, err);
    if (st != HR_OK) return st;
    pthread_mutex_lock(&c->mu);
    c->misses++;
    hr_grammar *twin = cache_find(c, kind, src, len, h);
    if (twin) { /* compiled twice at once: keep the cached one */
        hr_grammar_release(g);
        g = twin;
    } else {
        if (c->n == c->cap) hr_grammar_release(c->g[--c->n]);
        memmove(c->g + 1, c->g, sizeof *c->g * (size_t)c->n);
        c->g[0] = hr_grammar_retain(g);
        c->n++;
    }
    pthread_mutex_unlock(&c->mu);
    *out = g;
    return HR_OK;
}

void hr_grammar_cache_stats(hr_grammar_cache *c, uint64_t *hits, uint64_t *misses) {
    pthread_mutex_lock(&c->mu);
    *hits = c->hits;
    *misses = c->misses;
    pthread_mutex_unlock(&c->mu);
}

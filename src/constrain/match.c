/* match.c: the recognizer and the token masks.
 *
 * State: a set of stacks of grammar positions (each a way the output so far parses). After expansion
 * the top of every stack is a byte class; an empty stack means the output is complete. Matching a
 * byte replaces the top by the next position of its sequence (or pops when the sequence ends) and
 * expands rule references at the top, one stack per alternative. Stacks are deduplicated and at most
 * MAX_STACKS are kept: dropping one only narrows what is allowed, never admits an invalid byte, and
 * since every rule can finish (grammar.c checks it) every kept stack can still be completed.
 *
 * Masks. The vocabulary's byte strings are sorted once (hr_cons_vocab), so a walk advances a shared
 * prefix once and skips every token below a prefix that died. Per pair (c, p) of a stack's two top
 * frames (p the top, c its caller's continuation) the walk from the single stack [SENTINEL, c, p]
 * splits the vocabulary in three: tokens accepted whatever lies below on a real stack, tokens rejected
 * whatever lies below, and tokens that ran past c's rule into the sentinel (they need the real stack).
 * The first set is a bitmask ORed in directly; only the third set (for a JSON string's body: the
 * tokens holding a closing quote and more) is walked at each step. Whole masks are also kept per state (a small LRU),
 * as repeated structure revisits the same states. Both caches live in an hr_cons_store (one per engine thread) per
 * grammar. */
/* qsort_r: _GNU_SOURCE comes from the build */
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "constrain/constrain_internal.h"

#define SENTINEL          (-1)
#define MAX_STACKS        256         /* stacks kept per state */
#define MAX_DEPTH         4096        /* positions per stack */
#define POS_CACHE_MAX     4096        /* per-position token sets kept per grammar */
#define POS_SLOTS         8192        /* their hash table (a power of two, twice the most) */
#define POS_BYTES_MAX     (64u << 20) /* and their bytes in a store, all grammars together */
#define STATE_CACHE_MAX   1024        /* whole masks kept per grammar, at most */
#define STATE_CACHE_BYTES (4u << 20)  /* and at most this many bytes of them (256 masks of 128K tokens) */
#define STORE_GRAMMARS    16          /* grammars whose tables a store keeps */

/* ---- the vocabulary ------------------------------------------------------------------------------ */

struct hr_cons_vocab {
    int n_vocab;
    char *blob;
    uint32_t *off, *len; /* [n_vocab] */
    int32_t *sorted;     /* ids with bytes and not end-of-generation, by bytes */
    int n_sorted;
    int32_t *eog; /* end-of-generation ids */
    int n_eog;
    int max_len;
};

static int vocab_cmp(const void *a, const void *b, void *ctx) {
    const hr_cons_vocab *v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->len[x], ly = v->len[y];
    int c = memcmp(v->blob + v->off[x], v->blob + v->off[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return (x > y) - (x < y);
}

hr_status hr_cons_vocab_create(int n_vocab, const char *const *bytes, const uint32_t *lens, const bool *eog,
                               hr_cons_vocab **out, hr_error *err) {
    if (n_vocab < 1) return hr_error_set(err, HR_ERR_INVALID_ARG, "vocabulary size %d", n_vocab);
    hr_cons_vocab *v = calloc(1, sizeof *v);
    size_t total = 0;
    for (int i = 0; i < n_vocab; i++) total += lens[i];
    if (v) {
        v->n_vocab = n_vocab;
        v->blob = malloc(total + 1);
        v->off = malloc(sizeof(uint32_t) * (size_t)n_vocab);
        v->len = malloc(sizeof(uint32_t) * (size_t)n_vocab);
        v->sorted = malloc(sizeof(int32_t) * (size_t)n_vocab);
        v->eog = malloc(sizeof(int32_t) * (size_t)n_vocab);
    }
    if (!v || !v->blob || !v->off || !v->len || !v->sorted || !v->eog) {
        hr_cons_vocab_destroy(v);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory building the vocabulary's byte table");
    }
    size_t at = 0;
    for (int i = 0; i < n_vocab; i++) {
        v->off[i] = (uint32_t)at;
        v->len[i] = lens[i];
        if (lens[i]) memcpy(v->blob + at, bytes[i], lens[i]);
        at += lens[i];
        if (eog && eog[i])
            v->eog[v->n_eog++] = i;
        else if (lens[i] > 0)
            v->sorted[v->n_sorted++] = i;
        if ((int)lens[i] > v->max_len) v->max_len = (int)lens[i];
    }
    qsort_r(v->sorted, (size_t)v->n_sorted, sizeof(int32_t), vocab_cmp, v);
    *out = v;
    return HR_OK;
}

hr_status hr_cons_vocab_from_tokenizer(const hr_tokenizer *tok, hr_cons_vocab **out, hr_error *err) {
    int n = hr_tokenizer_n_vocab(tok);
    const char **bytes = malloc(sizeof(char *) * (size_t)n);
    uint32_t *lens = malloc(sizeof(uint32_t) * (size_t)n);
    bool *eog = malloc((size_t)n);
    hr_status st;
    if (!bytes || !lens || !eog) {
        st = hr_error_set(err, HR_ERR_NOMEM, "out of memory building the vocabulary's byte table");
    } else {
        for (int i = 0; i < n; i++) {
            size_t len;
            bytes[i] = hr_tokenizer_token_bytes(tok, i, &len);
            lens[i] = (uint32_t)len;
            eog[i] = hr_tokenizer_is_eog(tok, i);
        }
        st = hr_cons_vocab_create(n, bytes, lens, eog, out, err);
    }
    free(bytes);
    free(lens);
    free(eog);
    return st;
}

void hr_cons_vocab_destroy(hr_cons_vocab *v) {
    if (!v) return;
    free(v->blob);
    free(v->off);
    free(v->len);
    free(v->sorted);
    free(v->eog);
    free(v);
}

int hr_cons_vocab_size(const hr_cons_vocab *v) { return v->n_vocab; }

const int32_t *hr_cons_vocab_eog(const hr_cons_vocab *v, int *n) {
    *n = v->n_eog;
    return v->eog;
}

/* ---- recognizer states --------------------------------------------------------------------------- */

typedef struct rstate {
    int32_t *pool; /* stacks' positions, one after the other */
    int pool_n, pool_cap;
    int32_t *off, *len; /* [n] */
    uint64_t *hash;     /* [n] */
    int n, cap;
    bool hit; /* (per-position walks) a stack reached the sentinel with bytes left */
} rstate;

static void rs_free(rstate *s) {
    free(s->pool);
    free(s->off);
    free(s->len);
    free(s->hash);
    memset(s, 0, sizeof *s);
}

static void rs_clear(rstate *s) {
    s->n = s->pool_n = 0;
    s->hit = false;
}

/* One multiply per position and a final mix: this runs for every stack of every state a walk makes. */
static uint64_t stack_hash(const int32_t *w, int len) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)len;
    for (int i = 0; i < len; i++) h = (h ^ (uint32_t)w[i]) * 0xff51afd7ed558ccdull;
    return hr_mix64(h);
}

/* Adds stack w[0..len) unless already present. False only when out of memory. */
static bool rs_add(rstate *s, const int32_t *w, int len) {
    uint64_t h = stack_hash(w, len);
    for (int i = 0; i < s->n; i++)
        if (s->hash[i] == h && s->len[i] == len &&
            (len == 0 || !memcmp(s->pool + s->off[i], w, sizeof(int32_t) * (size_t)len)))
            return true;
    if (s->n >= MAX_STACKS) return true; /* narrowing only: see the file comment */
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 8;
        int32_t *o = realloc(s->off, sizeof *o * (size_t)cap), *l = o ? realloc(s->len, sizeof *l * (size_t)cap) : NULL;
        if (o) s->off = o;
        if (l) s->len = l;
        uint64_t *hh = l ? realloc(s->hash, sizeof *hh * (size_t)cap) : NULL;
        if (!hh) return false;
        s->hash = hh;
        s->cap = cap;
    }
    if (s->pool_n + len > s->pool_cap) {
        int cap = HR_MAX(s->pool_cap * 2, s->pool_n + len + 64);
        int32_t *p = realloc(s->pool, sizeof *p * (size_t)cap);
        if (!p) return false;
        s->pool = p;
        s->pool_cap = cap;
    }
    if (len) memcpy(s->pool + s->pool_n, w, sizeof(int32_t) * (size_t)len);
    s->off[s->n] = s->pool_n;
    s->len[s->n] = len;
    s->hash[s->n] = h;
    s->pool_n += len;
    s->n++;
    return true;
}

static bool rs_copy(rstate *d, const rstate *s) {
    rs_clear(d);
    for (int i = 0; i < s->n; i++)
        if (!rs_add(d, s->len[i] ? s->pool + s->off[i] : NULL, s->len[i])) return false;
    d->hit = s->hit;
    return true;
}

static bool rs_complete(const rstate *s) {
    for (int i = 0; i < s->n; i++)
        if (s->len[i] == 0) return true;
    return false;
}

/* Adds w[0..len) with its top expanded until it is a byte class (or the sentinel, or empty). w has
 * room for MAX_DEPTH positions; w[len - 1] is restored before returning. */
static bool expand(const hr_grammar *g, rstate *s, int32_t *w, int len) {
    if (len == 0) return rs_add(s, w, 0);
    int32_t p = w[len - 1];
    if (p == SENTINEL || HR_GE_KIND(g->el[p]) == HR_GE_CLASS) return rs_add(s, w, len);
    /* a reference: the continuation replaces it, then each alternative goes on top */
    int r = HR_GE_ARG(g->el[p]);
    int base = len - 1;
    if (HR_GE_KIND(g->el[p + 1]) != HR_GE_END) w[base++] = p + 1;
    bool ok = true;
    for (int a = 0; ok && a < g->rule_nalt[r]; a++) {
        int32_t start = g->alt[g->rule_alt0[r] + a];
        if (HR_GE_KIND(g->el[start]) == HR_GE_END) {
            ok = expand(g, s, w, base);
        } else if (base < MAX_DEPTH) {
            w[base] = start;
            ok = expand(g, s, w, base + 1);
        }
    }
    w[len - 1] = p;
    return ok;
}

/* d := s advanced by byte c. */
static bool advance(const hr_grammar *g, const rstate *s, uint8_t c, rstate *d, int32_t *w) {
    rs_clear(d);
    d->hit = s->hit;
    for (int i = 0; i < s->n; i++) {
        int len = s->len[i];
        if (len == 0) continue;
        const int32_t *st = s->pool + s->off[i];
        int32_t p = st[len - 1];
        if (p == SENTINEL) {
            d->hit = true;
            continue;
        }
        const uint64_t *cls = g->cls[HR_GE_ARG(g->el[p])];
        if (!((cls[c >> 6] >> (c & 63)) & 1)) continue;
        memcpy(w, st, sizeof(int32_t) * (size_t)len);
        bool ok;
        if (HR_GE_KIND(g->el[p + 1]) != HR_GE_END) {
            w[len - 1] = p + 1;
            ok = expand(g, d, w, len);
        } else {
            ok = expand(g, d, w, len - 1);
        }
        if (!ok) return false;
    }
    return true;
}

/* ---- per-grammar tables --------------------------------------------------------------------------- */

typedef struct pos_set {
    uint64_t *accept; /* [words] tokens accepted whatever is below */
    int32_t *walk;    /* ids (in sorted order) that need the real stack */
    int n_walk;
} pos_set;

typedef struct state_mask {
    uint64_t hash; /* state_key(&key) */
    rstate key;
    uint64_t *mask;
    int n_allowed;
    uint64_t used; /* LRU clock */
} state_mask;

typedef struct gtable {
    int refs;
    hr_grammar *g;
    struct pos_slot {
        uint64_t key; /* (the frame below the top, the top) */
        pos_set *ps;  /* NULL: a free slot */
    } * pos;          /* [POS_SLOTS], open addressing */
    int n_pos;
    size_t pos_bytes;
    state_mask *cache; /* [cache_cap] */
    int n_cache, cache_cap;
    uint64_t clock, used;
} gtable;

struct hr_cons_store {
    const hr_cons_vocab *v;
    size_t words;
    gtable *t[STORE_GRAMMARS];
    uint64_t clock;
    size_t pos_bytes; /* held by per-position sets (a bound: past it positions are walked each time) */
    bool use_pos, use_states;
    hr_cons_store_stats st;
    /* walk scratch */
    rstate *depth; /* [v->max_len + 1] */
    int32_t *w;    /* [MAX_DEPTH] */
    rstate tmp;
};

static void gtable_unref(gtable *t) {
    if (!t || --t->refs > 0) return;
    for (int i = 0; t->pos && i < POS_SLOTS; i++) {
        if (!t->pos[i].ps) continue;
        free(t->pos[i].ps->accept);
        free(t->pos[i].ps->walk);
        free(t->pos[i].ps);
    }
    free(t->pos);
    for (int i = 0; i < t->n_cache; i++) {
        rs_free(&t->cache[i].key);
        free(t->cache[i].mask);
    }
    free(t->cache);
    hr_grammar_release(t->g);
    free(t);
}

hr_status hr_cons_store_create(const hr_cons_vocab *v, hr_cons_store **out, hr_error *err) {
    hr_cons_store *s = calloc(1, sizeof *s);
    if (s) {
        s->v = v;
        s->words = hr_cons_mask_words(v->n_vocab);
        s->use_pos = s->use_states = true;
        s->depth = calloc((size_t)v->max_len + 2, sizeof(rstate));
        s->w = malloc(sizeof(int32_t) * (MAX_DEPTH + 1));
    }
    if (!s || !s->depth || !s->w) {
        hr_cons_store_destroy(s);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory creating a constraint store");
    }
    *out = s;
    return HR_OK;
}

void hr_cons_store_destroy(hr_cons_store *s) {
    if (!s) return;
    for (int i = 0; i < STORE_GRAMMARS; i++) gtable_unref(s->t[i]);
    for (int d = 0; s->depth && d <= s->v->max_len + 1; d++) rs_free(&s->depth[d]);
    free(s->depth);
    free(s->w);
    rs_free(&s->tmp);
    free(s);
}

void hr_cons_store_get_stats(const hr_cons_store *s, hr_cons_store_stats *out) { *out = s->st; }

void hr_cons_store_set_caching(hr_cons_store *s, bool position_sets, bool state_masks) {
    s->use_pos = position_sets;
    s->use_states = state_masks;
}

/* The store's table for g (made, or the least recently used one replaced), with a reference. */
static gtable *store_table(hr_cons_store *s, hr_grammar *g) {
    int lru = 0;
    for (int i = 0; i < STORE_GRAMMARS; i++) {
        if (s->t[i] && s->t[i]->g == g) {
            s->t[i]->used = ++s->clock;
            s->t[i]->refs++;
            return s->t[i];
        }
        if (!s->t[i] || (s->t[lru] && s->t[i]->used < s->t[lru]->used)) lru = i;
    }
    gtable *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->pos = calloc(POS_SLOTS, sizeof *t->pos);
    t->cache_cap = (int)HR_MAX(1, HR_MIN(STATE_CACHE_MAX, STATE_CACHE_BYTES / (s->words * sizeof(uint64_t))));
    t->cache = calloc((size_t)t->cache_cap, sizeof *t->cache);
    if (!t->pos || !t->cache) {
        free(t->pos);
        free(t->cache);
        free(t);
        return NULL;
    }
    t->refs = 2; /* the store's and the caller's */
    t->g = hr_grammar_retain(g);
    t->used = ++s->clock;
    if (s->t[lru]) s->pos_bytes -= s->t[lru]->pos_bytes;
    gtable_unref(s->t[lru]);
    s->t[lru] = t;
    return t;
}

/* ---- walks ----------------------------------------------------------------------------------------- */

enum { TOK_REJECT = 0, TOK_ACCEPT = 1, TOK_UNSURE = 2 };

typedef void (*walk_fn)(void *user, int32_t id, int outcome);

/* Walks ids[0..n) (in sorted byte order) from `start`, reporting each token's outcome: accepted (all
 * its bytes matched), unsure (a stack reached the sentinel with bytes left, none matched them all),
 * rejected. Tokens under a dead prefix are reported without being walked. Returns false when out of
 * memory. */
static bool walk(hr_cons_store *s, const hr_grammar *g, const rstate *start, const int32_t *ids, int n, walk_fn fn,
                 void *user) {
    const hr_cons_vocab *v = s->v;
    rstate *D = s->depth;
    if (!rs_copy(&D[0], start)) return false;
    int valid = 0;                /* D[0..valid] hold the states of the previous token's first bytes */
    int dead_at = v->max_len + 1; /* the depth at which the previous token's prefix died */
    const uint8_t *prev = NULL;
    int prev_len = 0;
    for (int k = 0; k < n; k++) {
        int32_t id = ids[k];
        const uint8_t *t = (const uint8_t *)v->blob + v->off[id];
        int len = (int)v->len[id];
        int l = 0;
        if (prev) {
            int m = len < prev_len ? len : prev_len;
            while (l < m && t[l] == prev[l]) l++;
        }
        prev = t;
        prev_len = len;
        if (dead_at <= l) { /* below a dead prefix: the same outcome as it */
            fn(user, id, D[dead_at].hit ? TOK_UNSURE : TOK_REJECT);
            valid = HR_MIN(valid, l);
            continue;
        }
        valid = HR_MIN(valid, l);
        dead_at = v->max_len + 1;
        int d = valid;
        for (; d < len; d++) {
            if (!advance(g, &D[d], t[d], &D[d + 1], s->w)) return false;
            if (D[d + 1].n == 0) {
                dead_at = d + 1;
                break;
            }
        }
        valid = dead_at <= len ? dead_at : len;
        if (dead_at <= len)
            fn(user, id, D[dead_at].hit ? TOK_UNSURE : TOK_REJECT);
        else
            fn(user, id, TOK_ACCEPT);
    }
    return true;
}

typedef struct pos_build {
    pos_set *ps;
    int cap;
    bool oom;
} pos_build;

static void pos_collect(void *user, int32_t id, int outcome) {
    pos_build *b = user;
    if (outcome == TOK_ACCEPT) {
        b->ps->accept[id >> 6] |= 1ull << (id & 63);
    } else if (outcome == TOK_UNSURE) {
        if (b->ps->n_walk == b->cap) {
            int cap = b->cap ? b->cap * 2 : 64;
            int32_t *w = realloc(b->ps->walk, sizeof *w * (size_t)cap);
            if (!w) {
                b->oom = true;
                return;
            }
            b->ps->walk = w;
            b->cap = cap;
        }
        b->ps->walk[b->ps->n_walk++] = id;
    }
}

/* The token sets of top position p with `below` under it (-2: nothing under it), computed on first
 * use (NULL when out of memory or past the bounds). Keyed by the two top frames, not the top alone:
 * a small rule (a UTF-8 character, optional whitespace) ends after a byte or two, and with its
 * caller's continuation in the key most tokens still resolve without the real stack. */
static pos_set *position_set(hr_cons_store *s, gtable *t, int32_t below, int32_t p) {
    uint64_t key = ((uint64_t)(uint32_t)below << 32) | (uint32_t)p;
    uint32_t h = (uint32_t)hr_mix64(key) & (POS_SLOTS - 1);
    while (t->pos[h].ps && t->pos[h].key != key) h = (h + 1) & (POS_SLOTS - 1);
    if (t->pos[h].ps) return t->pos[h].ps;
    if (t->n_pos >= POS_CACHE_MAX || s->pos_bytes >= POS_BYTES_MAX) return NULL;
    pos_set *ps = calloc(1, sizeof *ps);
    if (!ps || !(ps->accept = calloc(s->words, sizeof(uint64_t)))) {
        free(ps);
        return NULL;
    }
    rstate *start = &s->tmp;
    rs_clear(start);
    int32_t w[3] = {SENTINEL, below, p};
    pos_build b = {.ps = ps};
    bool ok = below == -2 ? rs_add(start, (int32_t[2]){SENTINEL, p}, 2) : rs_add(start, w, 3);
    if (!ok || !walk(s, t->g, start, s->v->sorted, s->v->n_sorted, pos_collect, &b) || b.oom) {
        free(ps->accept);
        free(ps->walk);
        free(ps);
        return NULL;
    }
    s->st.positions++;
    size_t bytes = s->words * sizeof(uint64_t) + sizeof(int32_t) * (size_t)ps->n_walk;
    s->pos_bytes += bytes;
    t->pos_bytes += bytes;
    t->n_pos++;
    t->pos[h].key = key;
    t->pos[h].ps = ps;
    return ps;
}

typedef struct mask_fill {
    uint64_t *mask;
} mask_fill;

static void mask_set(void *user, int32_t id, int outcome) {
    if (outcome == TOK_ACCEPT) ((mask_fill *)user)->mask[id >> 6] |= 1ull << (id & 63);
}

/* ---- matchers -------------------------------------------------------------------------------------- */

struct hr_matcher {
    hr_cons_store *s;
    gtable *t;
    rstate cur, next;
    int32_t *w;
};

hr_status hr_matcher_create(hr_cons_store *s, hr_grammar *g, hr_matcher **out, hr_error *err) {
    hr_matcher *m = calloc(1, sizeof *m);
    if (m) {
        m->s = s;
        m->t = store_table(s, g);
        m->w = malloc(sizeof(int32_t) * (MAX_DEPTH + 1));
    }
    bool ok = m && m->t && m->w;
    if (ok) {
        /* the start: each of root's alternatives on an otherwise empty stack */
        for (int a = 0; ok && a < g->rule_nalt[g->root]; a++) {
            int32_t start = g->alt[g->rule_alt0[g->root] + a];
            if (HR_GE_KIND(g->el[start]) == HR_GE_END) {
                ok = expand(g, &m->cur, m->w, 0);
            } else {
                m->w[0] = start;
                ok = expand(g, &m->cur, m->w, 1);
            }
        }
    }
    if (!ok) {
        hr_matcher_destroy(m);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory creating a matcher");
    }
    *out = m;
    return HR_OK;
}

void hr_matcher_destroy(hr_matcher *m) {
    if (!m) return;
    gtable_unref(m->t);
    rs_free(&m->cur);
    rs_free(&m->next);
    free(m->w);
    free(m);
}

bool hr_matcher_is_complete(const hr_matcher *m) { return rs_complete(&m->cur); }

bool hr_matcher_is_done(const hr_matcher *m) { return m->cur.n == 1 && m->cur.len[0] == 0; }

bool hr_matcher_allows_byte(const hr_matcher *m, uint8_t c) {
    const hr_grammar *g = m->t->g;
    for (int i = 0; i < m->cur.n; i++) {
        if (m->cur.len[i] == 0) continue;
        int32_t p = m->cur.pool[m->cur.off[i] + m->cur.len[i] - 1];
        const uint64_t *cls = g->cls[HR_GE_ARG(g->el[p])];
        if ((cls[c >> 6] >> (c & 63)) & 1) return true;
    }
    return false;
}

bool hr_matcher_accept_bytes(hr_matcher *m, const char *bytes, size_t n) {
    if (n == 0) return true;
    rstate a = {0}, b = {0};
    bool ok = rs_copy(&a, &m->cur);
    for (size_t i = 0; ok && i < n; i++) {
        ok = advance(m->t->g, &a, (uint8_t)bytes[i], &b, m->w) && b.n > 0;
        rstate t = a;
        a = b;
        b = t;
    }
    if (ok) {
        rstate t = m->cur;
        m->cur = a;
        a = t;
    }
    rs_free(&a);
    rs_free(&b);
    return ok;
}

bool hr_matcher_accept_token(hr_matcher *m, int32_t id) {
    const hr_cons_vocab *v = m->s->v;
    if (id < 0 || id >= v->n_vocab) return false;
    for (int i = 0; i < v->n_eog; i++)
        if (v->eog[i] == id) return hr_matcher_is_complete(m);
    if (v->len[id] == 0) return false;
    return hr_matcher_accept_bytes(m, v->blob + v->off[id], v->len[id]);
}

/* Order-independent: the same set of stacks built in another order finds the same entry. */
static uint64_t state_key(const rstate *s) {
    uint64_t h = (uint64_t)s->n;
    for (int i = 0; i < s->n; i++) h += hr_mix64(s->hash[i]);
    return h;
}

static bool same_state(const rstate *a, const rstate *b) {
    if (a->n != b->n) return false;
    for (int i = 0; i < a->n; i++) {
        bool found = false;
        for (int j = 0; j < b->n && !found; j++)
            found = a->hash[i] == b->hash[j] && a->len[i] == b->len[j] &&
                    (a->len[i] == 0 ||
                     !memcmp(a->pool + a->off[i], b->pool + b->off[j], sizeof(int32_t) * (size_t)a->len[i]));
        if (!found) return false;
    }
    return true;
}

static int popcount_mask(const uint64_t *mask, size_t words) {
    int n = 0;
    for (size_t i = 0; i < words; i++) n += __builtin_popcountll(mask[i]);
    return n;
}

int hr_matcher_fill_mask(hr_matcher *m, uint64_t *mask) {
    hr_cons_store *s = m->s;
    gtable *t = m->t;
    const hr_cons_vocab *v = s->v;
    s->st.masks++;
    uint64_t key = state_key(&m->cur);
    if (s->use_states) {
        for (int i = 0; i < t->n_cache; i++) {
            state_mask *e = &t->cache[i];
            if (e->hash == key && same_state(&e->key, &m->cur)) {
                memcpy(mask, e->mask, sizeof(uint64_t) * s->words);
                e->used = ++t->clock;
                s->st.mask_cache_hits++;
                return e->n_allowed;
            }
        }
    }
    memset(mask, 0, sizeof(uint64_t) * s->words);
    mask_fill mf = {.mask = mask};
    rstate *one = &m->next;
    for (int i = 0; i < m->cur.n; i++) {
        int len = m->cur.len[i];
        if (len == 0) continue;
        const int32_t *st = m->cur.pool + m->cur.off[i];
        rs_clear(one);
        if (!rs_add(one, st, len)) return 0;
        pos_set *ps = s->use_pos ? position_set(s, t, len >= 2 ? st[len - 2] : -2, st[len - 1]) : NULL;
        if (ps) {
            for (size_t k = 0; k < s->words; k++) mask[k] |= ps->accept[k];
            s->st.walked_tokens += (uint64_t)ps->n_walk;
            if (!walk(s, t->g, one, ps->walk, ps->n_walk, mask_set, &mf)) return 0;
        } else {
            s->st.walked_tokens += (uint64_t)v->n_sorted;
            if (!walk(s, t->g, one, v->sorted, v->n_sorted, mask_set, &mf)) return 0;
        }
    }
    if (rs_complete(&m->cur))
        for (int i = 0; i < v->n_eog; i++) mask[v->eog[i] >> 6] |= 1ull << (v->eog[i] & 63);
    int n = popcount_mask(mask, s->words);
    if (s->use_states) {
        int slot = t->n_cache;
        if (slot == t->cache_cap) {
            slot = 0;
            for (int i = 1; i < t->n_cache; i++)
                if (t->cache[i].used < t->cache[slot].used) slot = i;
        } else {
            memset(&t->cache[slot], 0, sizeof t->cache[slot]);
            if (!(t->cache[slot].mask = malloc(sizeof(uint64_t) * s->words))) return n;
            t->n_cache++;
        }
        state_mask *e = &t->cache[slot];
        if (rs_copy(&e->key, &m->cur)) {
            e->hash = key;
            memcpy(e->mask, mask, sizeof(uint64_t) * s->words);
            e->n_allowed = n;
            e->used = ++t->clock;
        } else {
            rs_clear(&e->key);
            e->hash = 0;
            memset(e->mask, 0, sizeof(uint64_t) * s->words);
            e->n_allowed = -1; /* never matches: key.n 0 only equals an empty state, which is never masked */
        }
    }
    return n;
}

/* spm.c: SentencePiece-style BPE-by-score (tokenizer.ggml.model = llama), as llama.cpp implements it.
 *
 * The fragment (already space-escaped to U+2581 and, where due, given the dummy-prefix space) starts as
 * one symbol per UTF-8 character. Every adjacent pair whose concatenation is a vocabulary token goes
 * into a max-heap keyed by that token's score (ties: leftmost). Popping the best pair merges it unless an
 * earlier merge has consumed either side (then the stored size no longer matches and the entry is
 * skipped). Symbols that end up not being tokens (characters outside the vocabulary) are spelled as
 * <0xNN> byte tokens, or UNK when the vocabulary has no byte tokens. O(n log n) in the fragment length. */
#include <stdlib.h>

#include "tokenizer/tok_internal.h"

typedef struct spm_sym {
    uint32_t start, n; /* byte span in the fragment; n == 0 once merged away */
    int32_t prev, next;
} spm_sym;

typedef struct spm_pair {
    float score;
    int32_t left, right;
    uint32_t size; /* bytes of left + right when queued */
} spm_pair;

typedef struct spm_heap {
    spm_pair *v;
    size_t n, cap;
} spm_heap;

/* a ranks before b: higher score first, then the leftmost pair */
static bool pair_before(const spm_pair *a, const spm_pair *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static bool heap_push(spm_heap *h, spm_pair p) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 256;
        spm_pair *v = realloc(h->v, cap * sizeof(*v));
        if (!v) return false;
        h->v = v, h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!pair_before(&p, &h->v[parent])) break;
        h->v[i] = h->v[parent];
        i = parent;
    }
    h->v[i] = p;
    return true;
}

static spm_pair heap_pop(spm_heap *h) {
    spm_pair top = h->v[0], last = h->v[--h->n];
    size_t i = 0, n = h->n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && pair_before(&h->v[c + 1], &h->v[c])) c++;
        if (!pair_before(&h->v[c], &last)) break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (n > 0) h->v[i] = last;
    return top;
}

static bool try_pair(const hr_tokenizer *t, const char *text, const spm_sym *sym, spm_heap *h, int32_t left,
                     int32_t right) {
    if (left < 0 || right < 0) return true;
    uint32_t size = sym[left].n + sym[right].n;
    int32_t id = hr_tok_lookup(t, text + sym[left].start, size);
    if (id < 0 || id >= t->n_vocab) return true;
    spm_pair p = {t->scores[id], left, right, size};
    return heap_push(h, p);
}

static bool emit_symbol(const hr_tokenizer *t, const char *text, const spm_sym *s, hr_ivec *out) {
    int32_t id = hr_tok_lookup(t, text + s->start, s->n);
    if (id >= 0 && id < t->n_vocab) return hr_ivec_push(out, id);
    for (uint32_t j = 0; j < s->n; j++) {
        int32_t b = t->byte_tok[(uint8_t)text[s->start + j]];
        if (b < 0) b = t->unk;
        if (b >= 0 && !hr_ivec_push(out, b)) return false;
    }
    return true;
}

hr_status hr_spm_encode_fragment(const hr_tokenizer *t, const char *text, size_t len, hr_ivec *out) {
    if (len == 0) return HR_OK;
    if (len > INT32_MAX / 2) return HR_ERR_RANGE;
    spm_sym *sym = malloc(len * sizeof(*sym)); /* at most one symbol per byte */
    if (!sym) return HR_ERR_NOMEM;
    int32_t n = 0;
    for (size_t off = 0; off < len;) {
        int cl;
        hr_utf8_decode(text + off, &cl);
        if ((size_t)cl > len - off) cl = (int)(len - off);
        sym[n] = (spm_sym){(uint32_t)off, (uint32_t)cl, n - 1, -1};
        if (n > 0) sym[n - 1].next = n;
        n++;
        off += (size_t)cl;
    }
    spm_heap h = {0};
    hr_status st = HR_OK;
    for (int32_t i = 1; i < n && st == HR_OK; i++)
        if (!try_pair(t, text, sym, &h, i - 1, i)) st = HR_ERR_NOMEM;
    while (st == HR_OK && h.n > 0) {
        spm_pair p = heap_pop(&h);
        spm_sym *l = &sym[p.left], *r = &sym[p.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = p.left;
        if (!try_pair(t, text, sym, &h, l->prev, p.left) || !try_pair(t, text, sym, &h, p.left, l->next))
            st = HR_ERR_NOMEM;
    }
    for (int32_t i = 0; st == HR_OK && i != -1; i = sym[i].next)
        if (!emit_symbol(t, text, &sym[i], out)) st = HR_ERR_NOMEM;
    free(h.v);
    free(sym);
    return st;
}

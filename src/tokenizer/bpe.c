/* bpe.c: byte-level BPE (tokenizer.ggml.model = gpt2): the merge table and the per-word merge loop.
 *
 * A word (one pre-token piece, raw bytes) starts as one symbol per byte, each the id of the byte's
 * GPT-2-mapped character. The merge loop repeatedly applies the lowest-ranked merge among adjacent
 * pairs (ties: leftmost), found through a min-heap of candidate pairs whose stale entries are skipped
 * when popped; merge lookups are one hash probe on (left id, right id). O(k log k) for k bytes.
 * Strings that occur in merges but are not tokens get "virtual" ids >= n_vocab (see tok_internal.h),
 * so the loop works on ids only and still reproduces llama.cpp's string-based algorithm exactly. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

#define EMPTY_KEY UINT64_MAX

static uint32_t merge_hash(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (uint32_t)key;
}

static const hr_merge_slot *merge_find(const hr_tokenizer *t, int32_t left, int32_t right) {
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    uint32_t i = merge_hash(key) & t->merge_mask;
    for (;;) {
        const hr_merge_slot *s = &t->merges[i];
        if (s->key == key) return s;
        if (s->key == EMPTY_KEY) return NULL;
        i = (i + 1) & t->merge_mask;
    }
}

hr_status hr_bpe_build_merges(hr_tokenizer *t, const hr_gguf_array *merges, hr_error *err) {
    if (merges->type != HR_GGUF_STRING || merges->n > INT32_MAX / 4)
        return hr_error_set(err, HR_ERR_FORMAT, "tokenizer.ggml.merges: expected a string array, found %s[%llu]",
                            hr_gguf_type_name(merges->type), (unsigned long long)merges->n);
    uint32_t n_slots = 1024;
    while ((uint64_t)n_slots < merges->n * 2 + 2) n_slots *= 2;
    t->merges = malloc((size_t)n_slots * sizeof(hr_merge_slot));
    if (!t->merges) return hr_error_set(err, HR_ERR_NOMEM, "tokenizer: out of memory");
    for (uint32_t i = 0; i < n_slots; i++) t->merges[i].key = EMPTY_KEY;
    t->merge_mask = n_slots - 1;

    char *buf = NULL;
    size_t buf_cap = 0;
    for (uint64_t r = 0; r < merges->n; r++) {
        hr_gguf_str m = hr_gguf_array_str(merges, r);
        /* "left right": the separator is the first space after the first byte (as llama.cpp splits) */
        const char *sp = m.len > 1 ? memchr(m.ptr + 1, ' ', m.len - 1) : NULL;
        if (!sp) {
            free(buf);
            return hr_error_set(err, HR_ERR_FORMAT, "tokenizer.ggml.merges[%llu] = '%.*s': expected 'left right'",
                                (unsigned long long)r, (int)(m.len > 60 ? 60 : m.len), m.ptr);
        }
        size_t nl = (size_t)(sp - m.ptr), nr = m.len - nl - 1;
        if (nl + nr > buf_cap) {
            buf_cap = (nl + nr) * 2 + 64;
            char *nb = realloc(buf, buf_cap);
            if (!nb) {
                free(buf);
                return hr_error_set(err, HR_ERR_NOMEM, "tokenizer: out of memory");
            }
            buf = nb;
        }
        int32_t l = hr_tok_lookup(t, m.ptr, nl);
        if (l < 0) l = hr_tok_intern(t, m.ptr, nl);
        int32_t rr = hr_tok_lookup(t, sp + 1, nr);
        if (rr < 0) rr = hr_tok_intern(t, sp + 1, nr);
        memcpy(buf, m.ptr, nl);
        memcpy(buf + nl, sp + 1, nr);
        int32_t merged = hr_tok_lookup(t, buf, nl + nr);
        if (merged < 0) merged = hr_tok_intern(t, buf, nl + nr);
        if (l < 0 || rr < 0 || merged < 0) {
            free(buf);
            return hr_error_set(err, HR_ERR_NOMEM, "tokenizer: out of memory");
        }
        uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)rr;
        uint32_t i = merge_hash(key) & t->merge_mask;
        while (t->merges[i].key != EMPTY_KEY && t->merges[i].key != key) i = (i + 1) & t->merge_mask;
        if (t->merges[i].key == EMPTY_KEY) { /* the first (lowest) rank of a repeated pair wins */
            t->merges[i].key = key;
            t->merges[i].rank = (int32_t)r;
            t->merges[i].merged = merged;
        }
    }
    free(buf);
    return HR_OK;
}

/* ---- per-call scratch ---------------------------------------------------------------------------- */

typedef struct bpe_pair {
    int32_t rank;
    int32_t left, right;       /* symbol indices */
    int32_t left_id, right_id; /* the ids when the pair was queued, to detect stale entries */
    int32_t merged;
} bpe_pair;

struct hr_bpe_scratch {
    int32_t *id, *prev, *next;
    uint32_t *pos; /* hr_bpe_encode_chars: byte offset of each symbol */
    size_t cap;
    bpe_pair *heap;
    size_t heap_n, heap_cap;
    char *mapped;
    size_t mapped_cap;
};

hr_bpe_scratch *hr_bpe_scratch_create(void) { return calloc(1, sizeof(hr_bpe_scratch)); }

void hr_bpe_scratch_destroy(hr_bpe_scratch *s) {
    if (!s) return;
    free(s->id);
    free(s->prev);
    free(s->next);
    free(s->pos);
    free(s->heap);
    free(s->mapped);
    free(s);
}

static bool pair_less(const bpe_pair *a, const bpe_pair *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static bool heap_push(hr_bpe_scratch *s, bpe_pair p) {
    if (s->heap_n == s->heap_cap) {
        size_t cap = s->heap_cap ? s->heap_cap * 2 : 64;
        bpe_pair *h = realloc(s->heap, cap * sizeof(*h));
        if (!h) return false;
        s->heap = h, s->heap_cap = cap;
    }
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!pair_less(&p, &s->heap[parent])) break;
        s->heap[i] = s->heap[parent];
        i = parent;
    }
    s->heap[i] = p;
    return true;
}

static bpe_pair heap_pop(hr_bpe_scratch *s) {
    bpe_pair top = s->heap[0];
    bpe_pair last = s->heap[--s->heap_n];
    size_t i = 0, n = s->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && pair_less(&s->heap[c + 1], &s->heap[c])) c++;
        if (!pair_less(&s->heap[c], &last)) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n > 0) s->heap[i] = last;
    return top;
}

static bool try_pair(const hr_tokenizer *t, hr_bpe_scratch *s, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return true;
    const hr_merge_slot *m = merge_find(t, s->id[left], s->id[right]);
    if (!m) return true;
    bpe_pair p = {m->rank, left, right, s->id[left], s->id[right], m->merged};
    return heap_push(s, p);
}

static bool reserve(hr_bpe_scratch *s, size_t n) {
    if (n <= s->cap) return true;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < n) cap *= 2;
    int32_t *a = realloc(s->id, cap * sizeof(int32_t));
    if (!a) return false;
    s->id = a;
    a = realloc(s->prev, cap * sizeof(int32_t));
    if (!a) return false;
    s->prev = a;
    a = realloc(s->next, cap * sizeof(int32_t));
    if (!a) return false;
    s->next = a;
    uint32_t *p = realloc(s->pos, cap * sizeof(uint32_t));
    if (!p) return false;
    s->pos = p;
    s->cap = cap;
    return true;
}

/* Emits a final symbol: a token id, or for a virtual string its single-byte pieces that are tokens
 * (llama.cpp's fallback; with a complete byte alphabet this never happens). */
static bool emit(const hr_tokenizer *t, int32_t id, hr_ivec *out) {
    if (id < t->n_vocab) return hr_ivec_push(out, id);
    const char *p = t->blob + t->off[id];
    for (uint32_t i = 0; i < t->len[id]; i++) {
        int32_t b = hr_tok_lookup(t, p + i, 1);
        if (b >= 0 && b < t->n_vocab && !hr_ivec_push(out, b)) return false;
    }
    return true;
}

/* Symbols 0..n-1 (ids in s->id, linked by the caller through prev/next): applies the lowest-ranked merge
 * among adjacent pairs until none applies (ties: leftmost). */
static bool merge_loop(const hr_tokenizer *t, hr_bpe_scratch *s, int32_t n) {
    s->heap_n = 0;
    for (int32_t i = 1; i < n; i++)
        if (!try_pair(t, s, i - 1, i)) return false;
    while (s->heap_n > 0) {
        bpe_pair p = heap_pop(s);
        if (s->id[p.left] != p.left_id || s->id[p.right] != p.right_id || s->next[p.left] != p.right) continue;
        /* merge right into left and unlink right */
        s->id[p.left] = p.merged;
        s->id[p.right] = -1;
        int32_t nx = s->next[p.right];
        s->next[p.left] = nx;
        if (nx >= 0) s->prev[nx] = p.left;
        s->next[p.right] = -2; /* removed */
        if (!try_pair(t, s, s->prev[p.left], p.left) || !try_pair(t, s, p.left, nx)) return false;
    }
    return true;
}

hr_status hr_bpe_encode_word(const hr_tokenizer *t, const uint8_t *word, size_t len, hr_ivec *out, hr_bpe_scratch *s) {
    if (len == 0) return HR_OK;
    if (len > INT32_MAX / 2) return HR_ERR_RANGE;
    if (t->ignore_merges) { /* llama-3 style: a word that is itself a token is taken whole */
        if (s->mapped_cap < len * 2) {
            char *m = realloc(s->mapped, len * 2);
            if (!m) return HR_ERR_NOMEM;
            s->mapped = m, s->mapped_cap = len * 2;
        }
        size_t n = 0;
        for (size_t i = 0; i < len; i++) n += hr_utf8_encode(hr_bpe_byte_to_cp(word[i]), s->mapped + n);
        int32_t id = hr_tok_lookup(t, s->mapped, n);
        if (id >= 0 && id < t->n_vocab) return hr_ivec_push(out, id) ? HR_OK : HR_ERR_NOMEM;
    }
    if (len == 1) return emit(t, t->byte_tok[word[0]], out) ? HR_OK : HR_ERR_NOMEM;
    if (!reserve(s, len)) return HR_ERR_NOMEM;
    int32_t n = (int32_t)len;
    for (int32_t i = 0; i < n; i++) {
        s->id[i] = t->byte_tok[word[i]];
        s->prev[i] = i - 1;
        s->next[i] = i + 1;
    }
    s->next[n - 1] = -1;
    if (!merge_loop(t, s, n)) return HR_ERR_NOMEM;
    for (int32_t i = 0; i != -1; i = s->next[i])
        if (!emit(t, s->id[i], out)) return HR_ERR_NOMEM;
    return HR_OK;
}

/* Spells text[a..b) as byte tokens (<0xNN>), or UNK for bytes the vocabulary has no token for. */
static bool emit_bytes(const hr_tokenizer *t, const char *text, size_t a, size_t b, hr_ivec *out) {
    for (size_t j = a; j < b; j++) {
        int32_t id = t->byte_tok[(uint8_t)text[j]];
        if (id < 0 || id >= t->n_vocab) id = t->unk;
        if (id >= 0 && !hr_ivec_push(out, id)) return false;
    }
    return true;
}

hr_status hr_bpe_encode_chars(const hr_tokenizer *t, const char *text, size_t len, hr_ivec *out, hr_bpe_scratch *s) {
    if (len == 0) return HR_OK;
    if (len > INT32_MAX / 2) return HR_ERR_RANGE;
    if (!reserve(s, len + 1)) return HR_ERR_NOMEM;
    /* one symbol per character; s->pos holds where each starts (a symbol spans up to the next live one) */
    int32_t n = 0;
    for (size_t off = 0; off < len;) {
        int cl;
        hr_utf8_decode(text + off, &cl);
        if ((size_t)cl > len - off) cl = (int)(len - off);
        s->pos[n] = (uint32_t)off;
        int32_t id = hr_tok_lookup(t, text + off, (size_t)cl);
        /* a character that is no string of the table: an id no merge has (>= n_vocab: spelled as bytes) */
        s->id[n] = id >= 0 ? id : INT32_MAX;
        s->prev[n] = n - 1;
        s->next[n] = n + 1;
        n++;
        off += (size_t)cl;
    }
    s->pos[n] = (uint32_t)len;
    s->next[n - 1] = -1;
    if (!merge_loop(t, s, n)) return HR_ERR_NOMEM;
    for (int32_t i = 0; i != -1; i = s->next[i]) {
        int32_t id = s->id[i];
        if (id >= 0 && id < t->n_vocab) {
            if (!hr_ivec_push(out, id)) return HR_ERR_NOMEM;
        } else if (!emit_bytes(t, text, s->pos[i], s->next[i] >= 0 ? s->pos[s->next[i]] : len, out)) {
            return HR_ERR_NOMEM;
        }
    }
    return HR_OK;
}

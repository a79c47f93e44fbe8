/* special.c: splitting input text on special-token texts before the vocabulary's own algorithm runs.
 *
 * Which tokens: control (3) and unknown (2) tokens only when parse_special is set; user-defined (4)
 * tokens always (as llama.cpp and Hugging Face do: added tokens such as deepseek's "ø" are matched in
 * plain text too). Which matches win: exactly llama.cpp's order, which is "longest token text first
 * across the whole input, then left to right" rather than leftmost-longest: tokens are ranked by text
 * length (descending, ties by id) and an occurrence is taken when it overlaps no occurrence taken
 * before it in (rank, position) order. Occurrences are found with a byte trie in one pass, so the cost
 * is O(text length x trie depth) instead of one full scan per special token. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

#define EMPTY_KEY UINT64_MAX

static uint32_t edge_hash(uint64_t k) {
    k ^= k >> 31;
    k *= 0x9E3779B97F4A7C15ULL;
    return (uint32_t)(k >> 29);
}

static int32_t trie_child(const hr_tokenizer *t, int32_t node, uint8_t b) {
    uint64_t key = ((uint64_t)node << 8) | b;
    uint32_t i = edge_hash(key) & t->trie_mask;
    for (;;) {
        if (t->trie[i].key == key) return t->trie[i].child;
        if (t->trie[i].key == EMPTY_KEY) return -1;
        i = (i + 1) & t->trie_mask;
    }
}

typedef struct len_id {
    uint32_t len;
    int32_t id;
} len_id;

static int cmp_special(const void *a, const void *b) {
    const len_id *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static bool is_special_type(uint8_t ty) {
    return ty == HR_TOKTYPE_CONTROL || ty == HR_TOKTYPE_USER_DEFINED || ty == HR_TOKTYPE_UNKNOWN;
}

/* Phi-3's Hugging Face tokenizer strips the whitespace that follows its special tokens (rstrip), except
 * after <unk>, <s> and <|endoftext|>; llama.cpp applies this by model name, and so does headroom. */
static hr_status setup_strip(hr_tokenizer *t, const char *model_name) {
    char lower[128];
    size_t n = 0;
    for (; model_name[n] && n + 1 < sizeof lower; n++)
        lower[n] = (char)(model_name[n] >= 'A' && model_name[n] <= 'Z' ? model_name[n] + 32 : model_name[n]);
    lower[n] = '\0';
    if (!strstr(lower, "phi-3") && !strstr(lower, "phi3")) return HR_OK;
    t->strip = calloc((size_t)t->n_vocab, 1);
    if (!t->strip) return HR_ERR_NOMEM;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (is_special_type(t->types[i])) t->strip[i] = HR_STRIP_RIGHT;
    static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
    for (size_t k = 0; k < sizeof keep / sizeof keep[0]; k++) {
        int32_t id = hr_tok_lookup(t, keep[k], strlen(keep[k]));
        if (id >= 0 && id < t->n_vocab) t->strip[id] = 0;
    }
    int32_t eos_text = hr_tok_lookup(t, "</s>", 4);
    if (eos_text >= 0 && eos_text < t->n_vocab) t->strip[eos_text] = HR_STRIP_RIGHT;
    return HR_OK;
}

hr_status hr_special_setup(hr_tokenizer *t, const char *model_name) {
    hr_status st = setup_strip(t, model_name ? model_name : "");
    if (st != HR_OK) return st;
    size_t total = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (is_special_type(t->types[i]) && t->len[i] > 0) {
            t->n_special++;
            total += t->len[i];
        }
    }
    if (t->n_special == 0) return HR_OK;
    t->special_ids = malloc((size_t)t->n_special * sizeof(int32_t));
    t->special_rank = malloc((size_t)t->n_vocab * sizeof(int32_t));
    t->trie_term = malloc((total + 1) * sizeof(int32_t));
    uint32_t slots = 64;
    while (slots < total * 2 + 2) slots *= 2;
    t->trie = malloc((size_t)slots * sizeof(hr_trie_edge));
    if (!t->special_ids || !t->special_rank || !t->trie_term || !t->trie) return HR_ERR_NOMEM;
    t->trie_mask = slots - 1;
    for (uint32_t i = 0; i < slots; i++) t->trie[i].key = EMPTY_KEY;
    len_id *order = malloc((size_t)t->n_special * sizeof(*order));
    if (!order) return HR_ERR_NOMEM;
    int32_t k = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (is_special_type(t->types[i]) && t->len[i] > 0) order[k++] = (len_id){t->len[i], i};
    qsort(order, (size_t)t->n_special, sizeof(*order), cmp_special);
    for (k = 0; k < t->n_special; k++) t->special_ids[k] = order[k].id;
    free(order);
    memset(t->special_rank, 0xFF, (size_t)t->n_vocab * sizeof(int32_t));
    t->trie_nodes = 1;
    t->trie_term[0] = -1;
    for (int32_t r = 0; r < t->n_special; r++) {
        int32_t id = t->special_ids[r];
        t->special_rank[id] = r;
        const uint8_t *s = (const uint8_t *)t->blob + t->off[id];
        t->special_first[s[0]] = true;
        if (t->types[id] == HR_TOKTYPE_USER_DEFINED) t->user_first[s[0]] = true;
        int32_t node = 0;
        for (uint32_t j = 0; j < t->len[id]; j++) {
            int32_t c = trie_child(t, node, s[j]);
            if (c < 0) {
                c = t->trie_nodes++;
                t->trie_term[c] = -1;
                uint64_t key = ((uint64_t)node << 8) | s[j];
                uint32_t i = edge_hash(key) & t->trie_mask;
                while (t->trie[i].key != EMPTY_KEY) i = (i + 1) & t->trie_mask;
                t->trie[i].key = key;
                t->trie[i].child = c;
            }
            node = c;
        }
        if (t->trie_term[node] < 0) t->trie_term[node] = id; /* duplicate texts: the first-ranked id */
    }
    return HR_OK;
}

void hr_special_free(hr_tokenizer *t) {
    free(t->strip);
    free(t->special_ids);
    free(t->special_rank);
    free(t->trie_term);
    free(t->trie);
}

size_t hr_tokenizer_control_match(const hr_tokenizer *t, const char *text, size_t len) {
    const uint8_t *s = (const uint8_t *)text;
    if (t->n_special == 0 || len == 0 || !t->special_first[s[0]]) return 0;
    size_t best = 0;
    int32_t node = 0;
    for (size_t j = 0; j < len; j++) {
        node = trie_child(t, node, s[j]);
        if (node < 0) break;
        int32_t id = t->trie_term[node];
        if (id >= 0 && t->types[id] != HR_TOKTYPE_USER_DEFINED) best = j + 1;
    }
    return best;
}

typedef struct cand {
    int32_t rank;
    int32_t id;
    size_t pos, len;
} cand;

static int cmp_cand(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static bool is_c_space(char ch) {
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\v' || ch == '\f' || ch == '\r';
}

static int cmp_pos(const void *a, const void *b) {
    const cand *x = a, *y = b;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

hr_status hr_special_partition(const hr_tokenizer *t, const char *text, size_t len, bool parse_special,
                               const uint8_t *allow, hr_fragment **out, size_t *n_out) {
    const bool *first = parse_special ? t->special_first : t->user_first;
    cand *c = NULL;
    size_t nc = 0, cap = 0;
    const uint8_t *s = (const uint8_t *)text;
    for (size_t pos = 0; t->n_special > 0 && pos < len; pos++) {
        if (!first[s[pos]]) continue;
        int32_t node = 0;
        for (size_t j = pos; j < len; j++) {
            node = trie_child(t, node, s[j]);
            if (node < 0) break;
            int32_t id = t->trie_term[node];
            if (id < 0) continue;
            if (t->types[id] != HR_TOKTYPE_USER_DEFINED &&
                (!parse_special || (allow && memchr(allow + pos, 0, j + 1 - pos) != NULL)))
                continue; /* a control token's text in client content (see hr_tokenizer_encode_segments) */
            if (nc == cap) {
                cap = cap ? cap * 2 : 64;
                cand *nv = realloc(c, cap * sizeof(*c));
                if (!nv) {
                    free(c);
                    return HR_ERR_NOMEM;
                }
                c = nv;
            }
            c[nc++] = (cand){t->special_rank[id], id, pos, j + 1 - pos};
        }
    }
    size_t n_taken = 0;
    if (nc > 0) {
        uint8_t *used = calloc(len, 1);
        if (!used) {
            free(c);
            return HR_ERR_NOMEM;
        }
        qsort(c, nc, sizeof(*c), cmp_cand);
        for (size_t i = 0; i < nc; i++) {
            bool free_span = memchr(used + c[i].pos, 1, c[i].len) == NULL;
            if (!free_span) continue;
            memset(used + c[i].pos, 1, c[i].len);
            c[n_taken++] = c[i];
        }
        free(used);
        qsort(c, n_taken, sizeof(*c), cmp_pos);
    }
    hr_fragment *f = malloc((2 * n_taken + 1) * sizeof(*f));
    if (!f) {
        free(c);
        return HR_ERR_NOMEM;
    }
    size_t nf = 0, at = 0;
    for (size_t i = 0; i <= n_taken; i++) {
        size_t end = i < n_taken ? c[i].pos : len;
        /* the raw text between two matches, minus the whitespace an adjacent token strips (C isspace) */
        if (i > 0 && t->strip && (t->strip[c[i - 1].id] & HR_STRIP_RIGHT))
            while (at < end && is_c_space(text[at])) at++;
        if (i < n_taken && t->strip && (t->strip[c[i].id] & HR_STRIP_LEFT))
            while (end > at && is_c_space(text[end - 1])) end--;
        if (end > at) f[nf++] = (hr_fragment){at, end - at, -1};
        if (i == n_taken) break;
        f[nf++] = (hr_fragment){c[i].pos, c[i].len, c[i].id};
        at = c[i].pos + c[i].len;
    }
    free(c);
    *out = f;
    *n_out = nf;
    return HR_OK;
}

/* vocab.c: loading a vocabulary from GGUF metadata (tokenizer.ggml.*) into an immutable hr_tokenizer:
 * the string table and its hash map, scores and token types, special ids and flags, end-of-generation
 * ids. The SPM/BPE specifics (merges, regexes), the special-token trie and the decode table are built by
 * the files that use them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "tokenizer/tok_internal.h"

/* ---- int vector ---------------------------------------------------------------------------------- */

bool hr_ivec_push(hr_ivec *iv, int32_t x) {
    if (iv->n == iv->cap) {
        size_t cap = iv->cap ? iv->cap * 2 : 64;
        int32_t *v = realloc(iv->v, cap * sizeof(*v));
        if (!v) return false;
        iv->v = v, iv->cap = cap;
    }
    iv->v[iv->n++] = x;
    return true;
}

void hr_ivec_free(hr_ivec *iv) {
    free(iv->v);
    iv->v = NULL, iv->n = iv->cap = 0;
}

/* ---- string table and map ------------------------------------------------------------------------ */

uint32_t hr_tok_hash_bytes(const char *s, size_t n) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

int32_t hr_tok_lookup(const hr_tokenizer *t, const char *s, size_t n) {
    if (!t->map.slots) return -1;
    uint32_t i = hr_tok_hash_bytes(s, n) & t->map.mask;
    for (;;) {
        int32_t k = t->map.slots[i];
        if (k < 0) return -1;
        if (t->len[k] == n && memcmp(t->blob + t->off[k], s, n) == 0) return k;
        i = (i + 1) & t->map.mask;
    }
}

static bool map_insert(hr_strmap *m, const hr_tokenizer *t, int32_t k) {
    uint32_t i = hr_tok_hash_bytes(t->blob + t->off[k], t->len[k]) & m->mask;
    for (;;) {
        int32_t j = m->slots[i];
        if (j < 0) {
            m->slots[i] = k;
            return true;
        }
        if (t->len[j] == t->len[k] && memcmp(t->blob + t->off[j], t->blob + t->off[k], t->len[k]) == 0) {
            m->slots[i] = k; /* a later duplicate wins, as in llama.cpp's token_to_id */
            return true;
        }
        i = (i + 1) & m->mask;
    }
}

static bool map_rebuild(hr_tokenizer *t, uint32_t n_slots) {
    hr_strmap m = {.slots = malloc(n_slots * sizeof(int32_t)), .mask = n_slots - 1};
    if (!m.slots) return false;
    memset(m.slots, 0xFF, n_slots * sizeof(int32_t));
    for (int32_t k = 0; k < t->n_strings; k++) map_insert(&m, t, k);
    free(t->map.slots);
    t->map = m;
    return true;
}

int32_t hr_tok_intern(hr_tokenizer *t, const char *s, size_t n) {
    if (n > UINT32_MAX / 2 || t->n_strings == INT32_MAX) return -1;
    if (t->n_strings == t->str_cap) {
        int32_t cap = t->str_cap ? t->str_cap * 2 : 1024;
        uint32_t *off = realloc(t->off, (size_t)cap * sizeof(uint32_t));
        if (!off) return -1;
        t->off = off;
        uint32_t *len = realloc(t->len, (size_t)cap * sizeof(uint32_t));
        if (!len) return -1;
        t->len = len;
        t->str_cap = cap;
    }
    if (t->blob_len + n + 1 > t->blob_cap) {
        size_t cap = t->blob_cap ? t->blob_cap : 4096;
        while (cap < t->blob_len + n + 1) cap *= 2;
        if (cap > UINT32_MAX) return -1;
        char *b = realloc(t->blob, cap);
        if (!b) return -1;
        t->blob = b, t->blob_cap = cap;
    }
    int32_t k = t->n_strings;
    memcpy(t->blob + t->blob_len, s, n);
    t->blob[t->blob_len + n] = '\0';
    t->off[k] = (uint32_t)t->blob_len;
    t->len[k] = (uint32_t)n;
    t->blob_len += n + 1;
    t->n_strings++;
    /* keep the load factor under 1/2 */
    if (!t->map.slots || (uint64_t)t->n_strings * 2 > (uint64_t)t->map.mask + 1) {
        uint32_t slots = t->map.slots ? (t->map.mask + 1) * 2 : 2048;
        while ((uint64_t)t->n_strings * 2 > slots) slots *= 2;
        if (!map_rebuild(t, slots)) {
            t->n_strings--;
            return -1;
        }
    } else {
        map_insert(&t->map, t, k);
    }
    return k;
}

/* ---- loading ------------------------------------------------------------------------------------- */

static int32_t get_id(const hr_gguf *g, const char *key, int32_t dflt, int32_t n_vocab) {
    int64_t v;
    if (hr_gguf_get_int(g, key, &v, NULL) != HR_OK) return dflt;
    if (v < 0 || v >= n_vocab) return -1; /* e.g. 0xFFFFFFFF written for "none" */
    return (int32_t)v;
}

static bool get_flag(const hr_gguf *g, const char *key, bool dflt) {
    bool b;
    if (hr_gguf_get_bool(g, key, &b, NULL) == HR_OK) return b;
    int64_t v;
    if (hr_gguf_get_int(g, key, &v, NULL) == HR_OK) return v != 0;
    return dflt;
}

static bool pre_is_llama3(const char *pre) {
    static const char *const names[] = {"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "tekken"};
    for (size_t i = 0; i < HR_ARRAY_LEN(names); i++)
        if (strcmp(pre, names[i]) == 0) return true;
    return false;
}

/* Texts that end a turn in common chat formats; such tokens join the end-of-generation set (as in
 * llama.cpp, which also detects them by text because converters rarely record them). */
static const char *const k_eog_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                          "<|eom_id|>", "<EOT>",      "_<EOT>",  "<|EOT|>"};

static hr_status load_tokens(hr_tokenizer *t, const hr_gguf *g, hr_error *err) {
    hr_gguf_array toks;
    hr_status st = hr_gguf_get_array(g, "tokenizer.ggml.tokens", &toks, err);
    if (st != HR_OK) return st;
    if (toks.type != HR_GGUF_STRING || toks.n == 0 || toks.n > INT32_MAX / 4)
        return hr_error_set(err, HR_ERR_FORMAT,
                            "tokenizer.ggml.tokens: expected a non-empty string array, found %s[%llu]",
                            hr_gguf_type_name(toks.type), (unsigned long long)toks.n);
    t->n_vocab = (int32_t)toks.n;
    for (uint64_t i = 0; i < toks.n; i++) {
        hr_gguf_str s = hr_gguf_array_str(&toks, i);
        if (hr_tok_intern(t, s.ptr, s.len) < 0) return hr_error_set(err, HR_ERR_NOMEM, "tokenizer: out of memory");
    }
    t->types = malloc((size_t)t->n_vocab);
    t->is_eog = calloc((size_t)t->n_vocab, 1);
    if (!t->types || !t->is_eog) return hr_error_set(err, HR_ERR_NOMEM, "tokenizer: out of memory");
    memset(t->types, HR_TOKTYPE_NORMAL, (size_t)t->n_vocab);
    hr_gguf_array arr;
    if (hr_gguf_get_array(g, "tokenizer.ggml.token_type", &arr, NULL) == HR_OK) {
        if (arr.n != toks.n || arr.type == HR_GGUF_STRING || arr.type == HR_GGUF_ARRAY || arr.type == HR_GGUF_F32 ||
            arr.type == HR_GGUF_F64)
            return hr_error_set(err, HR_ERR_FORMAT, "tokenizer.ggml.token_type: expected %llu integers, found %s[%llu]",
                                (unsigned long long)toks.n, hr_gguf_type_name(arr.type), (unsigned long long)arr.n);
        for (uint64_t i = 0; i < arr.n; i++) {
            int64_t v = hr_gguf_array_int(&arr, i);
            t->types[i] = (uint8_t)((v >= 0 && v <= HR_TOKTYPE_BYTE) ? v : HR_TOKTYPE_NORMAL);
        }
    }
    if (hr_gguf_get_array(g, "tokenizer.ggml.scores", &arr, NULL) == HR_OK) {
        if (arr.n != toks.n || (arr.type != HR_GGUF_F32 && arr.type != HR_GGUF_F64))
            return hr_error_set(err, HR_ERR_FORMAT, "tokenizer.ggml.scores: expected %llu floats, found %s[%llu]",
                                (unsigned long long)toks.n, hr_gguf_type_name(arr.type), (unsigned long long)arr.n);
        t->scores = malloc((size_t)t->n_vocab * sizeof(float));
        if (!t->scores) return hr_error_set(err, HR_ERR_NOMEM, "tokenizer: out of memory");
        for (uint64_t i = 0; i < arr.n; i++) t->scores[i] = (float)hr_gguf_array_float(&arr, i);
    }
    return HR_OK;
}

static void load_specials(hr_tokenizer *t, const hr_gguf *g) {
    bool spm = t->kind == HR_VOCAB_SPM;
    int32_t n = t->n_vocab;
    t->bos = get_id(g, "tokenizer.ggml.bos_token_id", spm && n > 1 ? 1 : -1, n);
    t->eos = get_id(g, "tokenizer.ggml.eos_token_id", spm && n > 2 ? 2 : -1, n);
    t->unk = get_id(g, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, n);
    t->pad = get_id(g, "tokenizer.ggml.padding_token_id", -1, n);
    t->eot = get_id(g, "tokenizer.ggml.eot_token_id", -1, n);
    t->eom = get_id(g, "tokenizer.ggml.eom_token_id", -1, n);
    bool llama3 = !spm && pre_is_llama3(t->pre_name);
    t->add_bos = get_flag(g, "tokenizer.ggml.add_bos_token", spm || llama3);
    t->add_eos = get_flag(g, "tokenizer.ggml.add_eos_token", false);
    t->add_space_prefix = spm && get_flag(g, "tokenizer.ggml.add_space_prefix", true);
    t->ignore_merges = llama3;

    if (t->eot < 0) {
        static const char *const eot_texts[] = {"<|eot_id|>",    "<|im_end|>",           "<|end|>",
                                                "<end_of_turn>", "<|endoftext|>",        "<EOT>",
                                                "_<EOT>",        "<｜end▁of▁sentence｜>" /* DeepSeek */};
        for (size_t i = 0; i < HR_ARRAY_LEN(eot_texts) && t->eot < 0; i++) {
            int32_t id = hr_tok_lookup(t, eot_texts[i], strlen(eot_texts[i]));
            if (id >= 0 && id < n && t->types[id] != HR_TOKTYPE_NORMAL) t->eot = id;
        }
    }
    for (size_t i = 0; i < HR_ARRAY_LEN(k_eog_texts); i++) {
        int32_t id = hr_tok_lookup(t, k_eog_texts[i], strlen(k_eog_texts[i]));
        if (id >= 0 && id < n && t->types[id] != HR_TOKTYPE_NORMAL) t->is_eog[id] = 1;
    }
    if (t->eos >= 0) t->is_eog[t->eos] = 1;
    if (t->eot >= 0) t->is_eog[t->eot] = 1;
    if (t->eom >= 0) t->is_eog[t->eom] = 1;
    hr_gguf_array gen; /* a checkpoint's generation_config.json eos_token_id list (model/hf.c) */
    if (hr_gguf_get_array(g, "headroom.generation.eos_token_ids", &gen, NULL) == HR_OK)
        for (uint64_t i = 0; i < gen.n; i++)
            if (hr_gguf_array_int(&gen, i) >= 0 && hr_gguf_array_int(&gen, i) < n)
                t->is_eog[hr_gguf_array_int(&gen, i)] = 1;
    /* A generated BOS starts a new document, so it ends this one: llama2.c-trained models (stories260K)
     * end a story by emitting BOS rather than EOS. */
    if (t->bos >= 0) t->is_eog[t->bos] = 1;
}

static hr_status setup_bytes(hr_tokenizer *t, hr_error *err) {
    for (int b = 0; b < 256; b++) {
        char buf[8];
        int32_t id;
        if (t->kind == HR_VOCAB_SPM) {
            static const char hex[] = "0123456789ABCDEF";
            memcpy(buf, "<0x", 3);
            buf[3] = hex[b >> 4], buf[4] = hex[b & 15], buf[5] = '>';
            id = hr_tok_lookup(t, buf, 6);
            if (id < 0 && b < 0x80) id = hr_tok_lookup(t, buf, hr_utf8_encode((uint32_t)b, buf));
        } else {
            size_t n = hr_utf8_encode(hr_bpe_byte_to_cp((uint8_t)b), buf);
            id = hr_tok_lookup(t, buf, n);
            if (id < 0) id = hr_tok_intern(t, buf, n); /* a virtual string: spelled out (dropped) at the end */
            if (id < 0) return hr_error_set(err, HR_ERR_NOMEM, "tokenizer: out of memory");
        }
        t->byte_tok[b] = id;
    }
    return HR_OK;
}

/* headroom.tokenizer.*: what a tokenizer.json says and llama.cpp's keys cannot (written by hfjson.c). */
static hr_status load_extensions(hr_tokenizer *t, const hr_gguf *g, hr_error *err) {
    char norm[16];
    if (hr_gguf_get_cstr(g, "headroom.tokenizer.normalizer", norm, sizeof norm, NULL) == HR_OK) {
        static const char *const names[] = {"nfc", "nfkc", "nfd", "nfkd"};
        for (size_t i = 0; i < HR_ARRAY_LEN(names) && !t->normalizer; i++)
            if (!strcmp(norm, names[i])) t->normalizer = HR_NORM_NFC + (int)i;
        if (!t->normalizer)
            return hr_error_set(err, HR_ERR_UNSUPPORTED, "headroom.tokenizer.normalizer = '%s' is not supported", norm);
    }
    if (t->kind == HR_VOCAB_SPM) {
        t->split_metaspace = get_flag(g, "headroom.tokenizer.split_metaspace", false);
        t->prefix_first = get_flag(g, "headroom.tokenizer.prefix_first", false);
        t->metaspace_prefix = get_flag(g, "headroom.tokenizer.metaspace_prefix", false);
    }
    return HR_OK;
}

/* headroom.tokenizer.token_strip: id * 4 + (1 lstrip, 2 rstrip) for added tokens that eat the whitespace
 * beside them (tokenizer.json's lstrip/rstrip). */
static hr_status load_strip(hr_tokenizer *t, const hr_gguf *g) {
    hr_gguf_array arr;
    if (hr_gguf_get_array(g, "headroom.tokenizer.token_strip", &arr, NULL) != HR_OK) return HR_OK;
    if (arr.type == HR_GGUF_STRING || arr.type == HR_GGUF_ARRAY || arr.type == HR_GGUF_F32 || arr.type == HR_GGUF_F64)
        return HR_OK;
    if (!t->strip && !(t->strip = calloc((size_t)t->n_vocab, 1))) return HR_ERR_NOMEM;
    for (uint64_t i = 0; i < arr.n; i++) {
        int64_t v = hr_gguf_array_int(&arr, i);
        if (v >= 0 && v / 4 < t->n_vocab) t->strip[v / 4] = (uint8_t)(v & 3);
    }
    return HR_OK;
}

hr_status hr_tokenizer_load(const hr_gguf *g, hr_tokenizer **out, hr_error *err) {
    if (!g || !out) return hr_error_set(err, HR_ERR_INVALID_ARG, "hr_tokenizer_load: NULL argument");
    char model[64] = "", pre[64] = "";
    hr_status st = hr_gguf_get_cstr(g, "tokenizer.ggml.model", model, sizeof(model), err);
    if (st != HR_OK) {
        if (st == HR_ERR_NOT_FOUND)
            hr_error_set(err, st, "tokenizer.ggml.model is missing: the file carries no vocabulary");
        return st;
    }
    hr_vocab_kind kind;
    if (strcmp(model, "llama") == 0) {
        kind = HR_VOCAB_SPM;
    } else if (strcmp(model, "gpt2") == 0) {
        kind = HR_VOCAB_BPE;
    } else {
        return hr_error_set(err, HR_ERR_UNSUPPORTED,
                            "tokenizer.ggml.model = '%s' is not supported (supported: 'llama' SentencePiece-style, "
                            "'gpt2' byte-level BPE)",
                            model);
    }
    if (hr_gguf_get_cstr(g, "tokenizer.ggml.pre", pre, sizeof(pre), NULL) != HR_OK) strcpy(pre, "default");

    hr_tokenizer *t = calloc(1, sizeof(*t));
    if (!t) return hr_error_set(err, HR_ERR_NOMEM, "tokenizer: out of memory");
    t->kind = kind;
    snprintf(t->pre_name, sizeof(t->pre_name), "%s", pre);
    st = load_tokens(t, g, err);
    if (st == HR_OK && kind == HR_VOCAB_SPM && !t->scores)
        st = hr_error_set(err, HR_ERR_FORMAT,
                          "tokenizer.ggml.scores is missing (required for tokenizer.ggml.model = llama)");
    if (st == HR_OK && kind == HR_VOCAB_BPE) {
        hr_gguf_array merges;
        st = hr_gguf_get_array(g, "tokenizer.ggml.merges", &merges, err);
        if (st == HR_ERR_NOT_FOUND)
            hr_error_set(err, st, "tokenizer.ggml.merges is missing (required for tokenizer.ggml.model = gpt2)");
        if (st == HR_OK) st = setup_bytes(t, err);
        if (st == HR_OK) st = hr_bpe_build_merges(t, &merges, err);
        hr_gguf_array rx;
        if (st == HR_OK && hr_gguf_get_array(g, "headroom.tokenizer.pre_regex", &rx, NULL) == HR_OK)
            st = hr_pretok_setup_regex(t, &rx, err);
        else if (st == HR_OK)
            st = hr_pretok_setup(t, pre, err);
    }
    if (st == HR_OK) st = load_extensions(t, g, err);
    if (st == HR_OK && kind == HR_VOCAB_SPM) {
        st = setup_bytes(t, err);
        hr_gguf_array merges;
        if (st == HR_OK && hr_gguf_get_array(g, "tokenizer.ggml.merges", &merges, NULL) == HR_OK) {
            /* a tokenizer.json byte-fallback BPE: merges by rank (see tok_internal.h) */
            st = hr_bpe_build_merges(t, &merges, err);
            t->spm_merges = true;
        }
        /* Can the text be cut before a U+2581 that follows another character? Only where no string has that
         * character right before a U+2581; collect those characters (the "glue"), give up past a few. */
        t->spm_split_words = true;
        for (int32_t i = 0; i < t->n_strings && t->spm_split_words; i++) {
            const char *s = t->blob + t->off[i], *end = s + t->len[i], *hit = s;
            while (hit + 1 < end && (hit = memmem(hit + 1, (size_t)(end - hit - 1), "\xE2\x96\x81", 3)) != NULL) {
                const char *c = hit - 1;
                while (c > s && ((uint8_t)*c & 0xC0) == 0x80) c--;
                int cl;
                uint32_t cp = hr_utf8_decode(c, &cl);
                if (cp == 0x2581) continue; /* U+2581 after U+2581: never cut anyway */
                bool known = false;
                for (int k = 0; k < t->n_spm_glue && !known; k++) known = t->spm_glue[k] == cp;
                if (known) continue;
                if (t->n_spm_glue == HR_SPM_GLUE_MAX) {
                    t->spm_split_words = false;
                    break;
                }
                t->spm_glue[t->n_spm_glue++] = cp;
            }
        }
    }
    if (st == HR_OK) {
        load_specials(t, g);
        char name[128] = "";
        if (hr_gguf_get_cstr(g, "general.name", name, sizeof name, NULL) != HR_OK) name[0] = '\0';
        st = hr_special_setup(t, name);
        if (st == HR_OK) st = load_strip(t, g);
        if (st == HR_OK) st = hr_decode_setup(t);
        if (st != HR_OK) hr_error_set(err, st, "tokenizer: out of memory");
    }
    if (st != HR_OK) {
        hr_tokenizer_destroy(t);
        return st;
    }
    *out = t;
    return HR_OK;
}

void hr_tokenizer_destroy(hr_tokenizer *t) {
    if (!t) return;
    hr_pretok_free(t);
    hr_special_free(t);
    free(t->merges);
    free(t->dec_blob);
    free(t->dec_off);
    free(t->dec_len);
    free(t->scores);
    free(t->types);
    free(t->is_eog);
    free(t->map.slots);
    free(t->blob);
    free(t->off);
    free(t->len);
    free(t);
}

/* Read from the capacities the tables were allocated with (destroy above frees the same list), so
 * a table added without its line here shows in test_mem_account. */
uint64_t hr_tokenizer_table_bytes(const hr_tokenizer *t) {
    uint64_t V = (uint64_t)t->n_vocab, n = sizeof *t + (uint64_t)t->str_cap * (sizeof *t->off + sizeof *t->len) +
                                           t->blob_cap + V * (sizeof *t->types + sizeof *t->is_eog);
    if (t->map.slots) n += ((uint64_t)t->map.mask + 1) * sizeof *t->map.slots;
    if (t->scores) n += V * sizeof *t->scores;
    if (t->merges) n += ((uint64_t)t->merge_mask + 1) * sizeof *t->merges;
    if (t->dec_blob) { /* every token's text decoded, never longer than the text (decode.c) */
        uint64_t text = 0;
        for (int32_t i = 0; i < t->n_vocab; i++) text += t->len[i];
        n += text + 1 + V * (sizeof *t->dec_off + sizeof *t->dec_len);
    }
    if (t->strip) n += V;
    if (t->n_special > 0) { /* special.c: ids by length, rank per token, the trie over their texts */
        uint64_t text = 0;
        for (int32_t i = 0; i < t->n_special; i++) text += t->len[t->special_ids[i]];
        n += (uint64_t)t->n_special * sizeof *t->special_ids + V * sizeof *t->special_rank +
             (text + 1) * sizeof *t->trie_term + ((uint64_t)t->trie_mask + 1) * sizeof *t->trie;
    }
    return n;
}

uint64_t hr_tokenizer_table_bytes_for(int32_t n_vocab) { return (uint64_t)(n_vocab > 0 ? n_vocab : 0) * 64; }

/* ---- accessors ----------------------------------------------------------------------------------- */

int32_t hr_tokenizer_n_vocab(const hr_tokenizer *t) { return t->n_vocab; }
int32_t hr_tokenizer_bos(const hr_tokenizer *t) { return t->bos; }
int32_t hr_tokenizer_eos(const hr_tokenizer *t) { return t->eos; }
bool hr_tokenizer_add_bos_default(const hr_tokenizer *t) { return t->add_bos && t->bos >= 0; }
bool hr_tokenizer_is_eog(const hr_tokenizer *t, int32_t id) { return id >= 0 && id < t->n_vocab && t->is_eog[id]; }

const char *hr_tokenizer_piece(const hr_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    return t->blob + t->off[id];
}

int hr_tokenizer_token_type(const hr_tokenizer *t, int32_t id) { return id >= 0 && id < t->n_vocab ? t->types[id] : 0; }
int32_t hr_tokenizer_eot(const hr_tokenizer *t) { return t->eot; }
int32_t hr_tokenizer_unk(const hr_tokenizer *t) { return t->unk; }
int32_t hr_tokenizer_pad(const hr_tokenizer *t) { return t->pad; }
int32_t hr_tokenizer_find(const hr_tokenizer *t, const char *text, size_t len) {
    int32_t id = hr_tok_lookup(t, text, len);
    return id < t->n_vocab ? id : -1;
}
const char *hr_tokenizer_kind_name(const hr_tokenizer *t) { return t->kind == HR_VOCAB_SPM ? "spm" : "bpe"; }
const char *hr_tokenizer_pre_name(const hr_tokenizer *t) { return t->kind == HR_VOCAB_SPM ? "none" : t->pre_name; }

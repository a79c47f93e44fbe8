/* hfjson.c: Hugging Face tokenizer.json (with tokenizer_config.json beside it) -> GGUF tokenizer metadata.
 *
 * One conversion serves both uses: `headroom vocab` writes the metadata to a vocab-only GGUF file, and
 * hr_tokenizer_load_json writes it to memory and loads that with hr_tokenizer_load, so a checkpoint
 * directory needs no GGUF and both paths tokenize identically by construction.
 *
 * The keys are those llama.cpp's converter (convert_hf_to_gguf.py) writes:
 *   byte-level BPE (a ByteLevel pre-tokenizer): tokenizer.ggml.model "gpt2", tokenizer.ggml.pre named after
 *     the Split regexes as the converter names them ("llama-bpe", "qwen2", "deepseek-v3", "gpt-2"), tokens,
 *     token types (added tokens: CONTROL when special or when they look special, else USER_DEFINED), merges;
 *   byte-fallback BPE over U+2581-escaped text (Gemma, Llama-2-style tokenizer.json): model "llama" (the
 *     converter's SentencePiece form, as for Gemma 3's tokenizer.model), add_space_prefix from the
 *     normalizer / Metaspace, token types (<0xNN> BYTE, the unk token UNKNOWN), scores made from the merge
 *     ranks (earlier merge, higher score; there is no tokenizer.model to read them from) and, beyond what
 *     llama.cpp writes, the merges themselves: with them hr_tokenizer_load applies the merges by rank, which
 *     is exactly Hugging Face's BPE, instead of SentencePiece's merge-by-score;
 *   special ids and add_bos/add_eos from tokenizer_config.json (else from the TemplateProcessing
 *   post-processor), and tokenizer.chat_template.
 * What llama.cpp has no key for is written under headroom.tokenizer.*: the normalizer ("nfc", "nfkc", "nfd",
 * "nfkd"), Split regexes that match no known pre-tokenizer name (pre_regex), lstrip/rstrip of added tokens
 * (token_strip: id * 4 + 1 lstrip + 2 rstrip), Metaspace's split and prepend_scheme "first".
 * Anything else is refused with one line naming the component (HR_ERR_UNSUPPORTED). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "common/util.h"
#include "tokenizer/tok_internal.h"

/* The Split regexes of the pre-tokenizers llama.cpp names, as tokenizer.json spells them. */
#define HF_CONTRACTIONS "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
static const char k_hf_llama3[] =
    HF_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char k_hf_qwen2[] = HF_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                                                 "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char k_hf_dsv3_0[] = "\\p{N}{1,3}";
static const char k_hf_dsv3_1[] = "[一-龥぀-ゟ゠-ヿ]+";
static const char k_hf_dsv3_2[] =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
    "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
/* ByteLevel's own regex (use_regex: true): GPT-2's */
static const char k_hf_gpt2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

#define MAX_REGEX HR_PRETOK_MAX_REGEX

typedef struct conv {
    hr_error *err;
    const char *file; /* for messages */
    json_t *tok, *cfg;
    /* what the analysis found */
    bool spm; /* byte-fallback BPE over U+2581 (else byte-level BPE) */
    bool replace_space, prefix, prefix_first, split_metaspace, metaspace_prefix;
    const char *norm; /* NULL or "nfc", ... */
    int n_regex;
    const char *regex[MAX_REGEX];
    bool regex_gpt2; /* ByteLevel use_regex: GPT-2's regex */
} conv;

static hr_status unsupported(conv *c, const char *what, const char *detail) {
    return hr_error_set(c->err, HR_ERR_UNSUPPORTED, "%s: %s%s%s is not supported", c->file, what, detail ? " " : "",
                        detail ? detail : "");
}

static const char *jstr(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static bool jbool(const json_t *o, const char *key, bool dflt) {
    const json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* ---- normalizer ------------------------------------------------------------------------------------ */

static hr_status parse_normalizer(conv *c, const json_t *n) {
    if (!n || json_is_null(n)) return HR_OK;
    const char *type = jstr(n, "type");
    if (!type) return unsupported(c, "a normalizer without a type", NULL);
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(n, "normalizers");
        size_t i;
        const json_t *x;
        json_array_foreach(list, i, x) {
            hr_status st = parse_normalizer(c, x);
            if (st != HR_OK) return st;
        }
        return HR_OK;
    }
    static const char *const forms[][2] = {{"NFC", "nfc"}, {"NFKC", "nfkc"}, {"NFD", "nfd"}, {"NFKD", "nfkd"}};
    for (size_t i = 0; i < HR_ARRAY_LEN(forms); i++) {
        if (!strcmp(type, forms[i][0])) {
            if (c->norm && strcmp(c->norm, forms[i][1]))
                return unsupported(c, "normalizer: two Unicode normalization forms", NULL);
            c->norm = forms[i][1];
            return HR_OK;
        }
    }
    if (!strcmp(type, "Replace")) {
        const char *from = jstr(json_object_get(n, "pattern"), "String"), *to = jstr(n, "content");
        if (from && to && !strcmp(from, " ") && !strcmp(to, "\xE2\x96\x81")) {
            c->replace_space = true;
            return HR_OK;
        }
        return unsupported(c, "normalizer Replace", "other than ' ' -> U+2581");
    }
    if (!strcmp(type, "Prepend")) {
        const char *p = jstr(n, "prepend");
        if (p && !strcmp(p, "\xE2\x96\x81")) {
            c->prefix = true;
            return HR_OK;
        }
        return unsupported(c, "normalizer Prepend", "other than U+2581");
    }
    return unsupported(c, "normalizer", type);
}

/* ---- pre-tokenizer --------------------------------------------------------------------------------- */

static hr_status parse_pretok(conv *c, const json_t *p, bool *byte_level) {
    if (!p || json_is_null(p)) return HR_OK;
    const char *type = jstr(p, "type");
    if (!type) return unsupported(c, "a pre_tokenizer without a type", NULL);
    if (!strcmp(type, "Sequence")) {
        const json_t *list = json_object_get(p, "pretokenizers");
        size_t i;
        const json_t *x;
        json_array_foreach(list, i, x) {
            hr_status st = parse_pretok(c, x, byte_level);
            if (st != HR_OK) return st;
        }
        return HR_OK;
    }
    if (*byte_level) return unsupported(c, "pre_tokenizer after ByteLevel:", type);
    if (!strcmp(type, "ByteLevel")) {
        if (jbool(p, "add_prefix_space", false)) return unsupported(c, "pre_tokenizer ByteLevel", "add_prefix_space");
        *byte_level = true;
        c->regex_gpt2 = jbool(p, "use_regex", true);
        return HR_OK;
    }
    if (!strcmp(type, "Split")) {
        const json_t *pat = json_object_get(p, "pattern");
        const char *re = jstr(pat, "Regex"), *s = jstr(pat, "String"), *beh = jstr(p, "behavior");
        if (re && beh && !strcmp(beh, "Isolated") && !jbool(p, "invert", false)) {
            if (c->n_regex == MAX_REGEX) return unsupported(c, "pre_tokenizer", "with more than 8 Split regexes");
            c->regex[c->n_regex++] = re;
            return HR_OK;
        }
        /* Gemma: Split on ' ' after the normalizer has turned every ' ' into U+2581 matches nothing */
        if (s && !strcmp(s, " ") && c->replace_space) return HR_OK;
        return unsupported(c, "pre_tokenizer Split", re ? "with a behavior other than Isolated" : "on a String");
    }
    if (!strcmp(type, "Metaspace")) {
        const char *rep = jstr(p, "replacement"), *scheme = jstr(p, "prepend_scheme");
        if (rep && strcmp(rep, "\xE2\x96\x81")) return unsupported(c, "pre_tokenizer Metaspace", "replacement");
        c->replace_space = true;
        bool add = jbool(p, "add_prefix_space", true);
        if (scheme) add = strcmp(scheme, "never") != 0;
        if (add) c->prefix = c->metaspace_prefix = true;
        if (scheme && !strcmp(scheme, "first")) c->prefix_first = true;
        c->split_metaspace = jbool(p, "split", true);
        return HR_OK;
    }
    return unsupported(c, "pre_tokenizer", type);
}

static hr_status check_decoder(conv *c, const json_t *d) {
    if (!d || json_is_null(d)) return HR_OK;
    const char *type = jstr(d, "type");
    if (!type) return unsupported(c, "a decoder without a type", NULL);
    if (!strcmp(type, "Sequence")) {
        size_t i;
        const json_t *x;
        json_array_foreach(json_object_get(d, "decoders"), i, x) {
            hr_status st = check_decoder(c, x);
            if (st != HR_OK) return st;
        }
        return HR_OK;
    }
    static const char *const spm_ok[] = {"Replace", "ByteFallback", "Fuse", "Strip", "Metaspace"};
    if (!c->spm) return !strcmp(type, "ByteLevel") ? HR_OK : unsupported(c, "decoder", type);
    for (size_t i = 0; i < HR_ARRAY_LEN(spm_ok); i++)
        if (!strcmp(type, spm_ok[i])) return HR_OK;
    return unsupported(c, "decoder", type);
}

/* The name llama.cpp's converter gives this regex sequence, or NULL. */
static const char *known_pre(const conv *c) {
    if (c->regex_gpt2 && c->n_regex == 0) return "gpt-2";
    if (c->regex_gpt2) return NULL;
    if (c->n_regex == 1 && !strcmp(c->regex[0], k_hf_llama3)) return "llama-bpe";
    if (c->n_regex == 1 && !strcmp(c->regex[0], k_hf_qwen2)) return "qwen2";
    if (c->n_regex == 3 && !strcmp(c->regex[0], k_hf_dsv3_0) && !strcmp(c->regex[1], k_hf_dsv3_1) &&
        !strcmp(c->regex[2], k_hf_dsv3_2))
        return "deepseek-v3";
    return NULL;
}

/* ---- tokens ---------------------------------------------------------------------------------------- */

/* llama.cpp's does_token_look_special: added tokens that are control tokens though not marked special. */
static bool looks_special(const char *s) {
    size_t n = strlen(s);
    if (!strcmp(s, "<pad>") || !strcmp(s, "<mask>") || !strcmp(s, "<2mass>") || !strcmp(s, "[@BOS@]")) return true;
    if (n >= 4 && !strncmp(s, "<|", 2) && !strcmp(s + n - 2, "|>")) return true;
    if (n >= 6 && !strncmp(s, "<\xEF\xBD\x9C", 4) && !strcmp(s + n - 4, "\xEF\xBD\x9C>")) return true; /* <｜ ... ｜> */
    return n >= 8 && !strncmp(s, "<unused", 7) && s[n - 1] == '>';
}

static bool is_byte_token(const char *s) {
    return strlen(s) == 6 && !strncmp(s, "<0x", 3) && s[5] == '>' && strchr("0123456789ABCDEF", s[3]) &&
           strchr("0123456789ABCDEF", s[4]) && s[3] && s[4];
}

typedef struct vocab {
    int32_t n;
    const char **text; /* borrowed from the JSON, or owned when `owned[i]` */
    char **owned;
    int32_t *type;
    float *score;
    int32_t *strip; /* id * 4 + flags */
    size_t n_strip;
} vocab;

static void vocab_free(vocab *v) {
    if (v->owned)
        for (int32_t i = 0; i < v->n; i++) free(v->owned[i]);
    free(v->owned);
    free(v->text);
    free(v->type);
    free(v->score);
    free(v->strip);
}

/* Ids past 16M are refused: no vocabulary is that large, and the tables are sized by the largest id. */
#define MAX_ID (1 << 24)

static int32_t id_of(const json_t *v) {
    if (!json_is_integer(v)) return -1;
    json_int_t i = json_integer_value(v);
    return i >= 0 && i < MAX_ID ? (int32_t)i : -1;
}

/* a copy of s with every U+2581 replaced by ' ' (llama.cpp pre-normalizes user-defined tokens so) */
static char *unescape_spaces(const char *s) {
    size_t n = strlen(s);
    char *o = malloc(n + 1), *q = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n;) {
        if (!strncmp(s + i, "\xE2\x96\x81", 3)) {
            *q++ = ' ';
            i += 3;
        } else {
            *q++ = s[i++];
        }
    }
    *q = '\0';
    return o;
}

static hr_status build_vocab(conv *c, const json_t *model, vocab *v) {
    const json_t *jv = json_object_get(model, "vocab"), *added = json_object_get(c->tok, "added_tokens");
    if (!json_is_object(jv)) return hr_error_set(c->err, HR_ERR_FORMAT, "%s: model.vocab is not an object", c->file);
    int32_t n = 0;
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)jv, key, val) {
        int32_t id = id_of(val);
        if (id < 0)
            return hr_error_set(c->err, HR_ERR_FORMAT, "%s: model.vocab['%.40s'] is not an id below %d", c->file, key,
                                MAX_ID);
        if (id + 1 > n) n = id + 1;
    }
    size_t i;
    json_array_foreach(added, i, val) {
        int32_t id = id_of(json_object_get(val, "id"));
        if (id < 0 || !jstr(val, "content"))
            return hr_error_set(c->err, HR_ERR_FORMAT, "%s: added_tokens[%zu] needs an id and a content", c->file, i);
        if (id + 1 > n) n = id + 1;
    }
    if (n == 0) return hr_error_set(c->err, HR_ERR_FORMAT, "%s: the vocabulary is empty", c->file);
    v->n = n;
    v->text = calloc((size_t)n, sizeof(char *));
    v->owned = calloc((size_t)n, sizeof(char *));
    v->type = malloc((size_t)n * sizeof(int32_t));
    v->score = c->spm ? malloc((size_t)n * sizeof(float)) : NULL;
    v->strip = malloc((json_array_size(added) + 1) * sizeof(int32_t));
    if (!v->text || !v->owned || !v->type || (c->spm && !v->score) || !v->strip)
        return hr_error_set(c->err, HR_ERR_NOMEM, "%s: out of memory", c->file);
    const char *unk = jstr(model, "unk_token");
    json_object_foreach((json_t *)jv, key, val) {
        int32_t id = id_of(val);
        v->text[id] = key;
        v->type[id] = HR_TOKTYPE_NORMAL;
        if (c->spm && is_byte_token(key)) v->type[id] = HR_TOKTYPE_BYTE;
        if (unk && !strcmp(key, unk)) v->type[id] = HR_TOKTYPE_UNKNOWN;
    }
    json_array_foreach(added, i, val) {
        int32_t id = id_of(json_object_get(val, "id"));
        const char *s = jstr(val, "content");
        v->text[id] = s;
        if (unk && !strcmp(s, unk)) {
            v->type[id] = HR_TOKTYPE_UNKNOWN;
        } else if (jbool(val, "special", false) || looks_special(s)) {
            v->type[id] = HR_TOKTYPE_CONTROL;
        } else {
            v->type[id] = HR_TOKTYPE_USER_DEFINED;
            if (c->spm && strstr(s, "\xE2\x96\x81")) { /* as llama.cpp: "pre-normalize user-defined spaces" */
                if (!(v->owned[id] = unescape_spaces(s)))
                    return hr_error_set(c->err, HR_ERR_NOMEM, "%s: out of memory", c->file);
                v->text[id] = v->owned[id];
            }
        }
        int flags =
            (jbool(val, "lstrip", false) ? HR_STRIP_LEFT : 0) | (jbool(val, "rstrip", false) ? HR_STRIP_RIGHT : 0);
        if (flags) v->strip[v->n_strip++] = id * 4 + flags;
        if (jbool(val, "single_word", false)) return unsupported(c, "added token", "with single_word");
    }
    for (int32_t id = 0; id < n; id++) {
        if (!v->text[id]) { /* a hole in the ids: the converter's [PAD{id}] */
            char buf[32];
            snprintf(buf, sizeof buf, "[PAD%d]", id);
            if (!(v->owned[id] = strdup(buf))) return hr_error_set(c->err, HR_ERR_NOMEM, "%s: out of memory", c->file);
            v->text[id] = v->owned[id];
            v->type[id] = HR_TOKTYPE_UNUSED;
        }
    }
    return HR_OK;
}

/* Merges as "left right" strings (GGUF's form); scores from their ranks for SentencePiece-form vocabularies. */
static hr_status build_merges(conv *c, const json_t *model, vocab *v, char ***out, size_t *n_out) {
    const json_t *jm = json_object_get(model, "merges");
    if (!json_is_array(jm)) return hr_error_set(c->err, HR_ERR_FORMAT, "%s: model.merges is not an array", c->file);
    size_t n = json_array_size(jm);
    char **m = calloc(n + 1, sizeof(char *));
    if (!m) return hr_error_set(c->err, HR_ERR_NOMEM, "%s: out of memory", c->file);
    *out = m;
    *n_out = n;
    const json_t *jv = json_object_get(model, "vocab");
    if (v->score) {
        /* tokens no merge produces rank after every merge */
        for (int32_t i = 0; i < v->n; i++) v->score[i] = -(float)n - 1.0f;
    }
    for (size_t r = 0; r < n; r++) {
        const json_t *e = json_array_get(jm, r);
        const char *a = NULL, *b = NULL;
        char *joined = NULL;
        if (json_is_string(e)) {
            joined = strdup(json_string_value(e));
        } else if (json_is_array(e) && json_array_size(e) == 2) {
            a = json_string_value(json_array_get(e, 0));
            b = json_string_value(json_array_get(e, 1));
            if (a && b) {
                if (strchr(a, ' ') || strchr(b, ' '))
                    return hr_error_set(c->err, HR_ERR_UNSUPPORTED,
                                        "%s: merge %zu has a space inside a token: not representable as GGUF merges",
                                        c->file, r);
                size_t la = strlen(a), lb = strlen(b);
                if ((joined = malloc(la + lb + 2))) {
                    memcpy(joined, a, la);
                    joined[la] = ' ';
                    memcpy(joined + la + 1, b, lb + 1);
                }
            }
        }
        if (!joined && (json_is_string(e) || (a && b)))
            return hr_error_set(c->err, HR_ERR_NOMEM, "%s: out of memory", c->file);
        if (!joined) return hr_error_set(c->err, HR_ERR_FORMAT, "%s: model.merges[%zu] is malformed", c->file, r);
        m[r] = joined;
        if (v->score) {
            /* score of the merged token: minus the rank of the first merge that makes it */
            const char *sp = strchr(joined + 1, ' ');
            if (sp) {
                size_t la = (size_t)(sp - joined), lb = strlen(sp + 1);
                char stack[256], *buf = la + lb < sizeof stack ? stack : malloc(la + lb + 1);
                if (!buf) return hr_error_set(c->err, HR_ERR_NOMEM, "%s: out of memory", c->file);
                memcpy(buf, joined, la);
                memcpy(buf + la, sp + 1, lb + 1);
                int32_t id = id_of(json_object_get(jv, buf));
                if (id >= 0 && id < v->n && v->score[id] < -(float)r) v->score[id] = -(float)r;
                if (buf != stack) free(buf);
            }
        }
    }
    return HR_OK;
}

/* ---- special ids from tokenizer_config.json / the post-processor ---------------------------------- */

static int32_t find_id(const vocab *v, const char *s) {
    if (!s) return -1;
    for (int32_t i = 0; i < v->n; i++)
        if (!strcmp(v->text[i], s)) return i;
    return -1;
}

static const char *cfg_token(const json_t *cfg, const char *key) {
    const json_t *x = json_object_get(cfg, key);
    if (json_is_string(x)) return json_string_value(x);
    return json_is_object(x) ? jstr(x, "content") : NULL;
}

static void write_specials(conv *c, const vocab *v, hr_gguf_writer *w) {
    static const char *const keys[][2] = {{"bos_token", "tokenizer.ggml.bos_token_id"},
                                          {"eos_token", "tokenizer.ggml.eos_token_id"},
                                          {"unk_token", "tokenizer.ggml.unknown_token_id"},
                                          {"pad_token", "tokenizer.ggml.padding_token_id"}};
    int32_t ids[4] = {-1, -1, -1, -1};
    for (size_t k = 0; k < 4; k++) ids[k] = find_id(v, cfg_token(c->cfg, keys[k][0]));
    if (ids[2] < 0) ids[2] = find_id(v, jstr(json_object_get(c->tok, "model"), "unk_token"));
    /* TemplateProcessing: a special token before $A is the BOS the tokenizer adds, one after it the EOS */
    bool tp_bos = false, tp_eos = false, seen_a = false;
    const json_t *post = json_object_get(c->tok, "post_processor");
    const char *ptype = jstr(post, "type");
    if (ptype && !strcmp(ptype, "TemplateProcessing")) {
        size_t i;
        const json_t *x;
        json_array_foreach(json_object_get(post, "single"), i, x) {
            const json_t *sp = json_object_get(x, "SpecialToken");
            if (json_object_get(x, "Sequence")) seen_a = true;
            if (!sp) continue;
            const json_t *st =
                json_object_get(json_object_get(json_object_get(post, "special_tokens"), jstr(sp, "id")), "ids");
            int32_t id = id_of(json_array_get(st, 0));
            if (id < 0) id = find_id(v, jstr(sp, "id"));
            if (!seen_a) tp_bos = true, ids[0] = ids[0] < 0 ? id : ids[0];
            if (seen_a) tp_eos = true, ids[1] = ids[1] < 0 ? id : ids[1];
        }
    }
    for (size_t k = 0; k < 4; k++)
        if (ids[k] >= 0) hr_gguf_writer_set_u32(w, keys[k][1], (uint32_t)ids[k]);
    const json_t *ab = json_object_get(c->cfg, "add_bos_token"), *ae = json_object_get(c->cfg, "add_eos_token");
    hr_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", json_is_boolean(ab) ? json_is_true(ab) : tp_bos);
    hr_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", json_is_boolean(ae) ? json_is_true(ae) : tp_eos);
    const json_t *tmpl = json_object_get(c->cfg, "chat_template");
    if (json_is_string(tmpl)) {
        hr_gguf_writer_set_str(w, "tokenizer.chat_template", json_string_value(tmpl));
    } else if (json_is_array(tmpl)) { /* named templates: the "default" one */
        size_t i;
        const json_t *x;
        json_array_foreach(tmpl, i, x) {
            const char *name = jstr(x, "name"), *t = jstr(x, "template");
            if (name && t && !strcmp(name, "default")) hr_gguf_writer_set_str(w, "tokenizer.chat_template", t);
        }
    }
}

/* ---- files ----------------------------------------------------------------------------------------- */

/* path: tokenizer.json itself, or a directory holding it. Fills the two file names. */
static hr_status resolve(const char *path, char *json_path, char *cfg_path, size_t cap, hr_error *err) {
    struct stat sb;
    if (stat(path, &sb) != 0) return hr_error_set(err, HR_ERR_IO, "%s: %s", path, strerror(errno));
    int n;
    if (S_ISDIR(sb.st_mode)) {
        n = snprintf(json_path, cap, "%s/tokenizer.json", path);
        if (n < 0 || (size_t)n >= cap) return hr_error_set(err, HR_ERR_INVALID_ARG, "%s: path too long", path);
        snprintf(cfg_path, cap, "%s/tokenizer_config.json", path);
        if (stat(json_path, &sb) != 0)
            return hr_error_set(err, HR_ERR_NOT_FOUND, "%s: the directory holds no tokenizer.json", path);
        return HR_OK;
    }
    n = snprintf(json_path, cap, "%s", path);
    if (n < 0 || (size_t)n >= cap) return hr_error_set(err, HR_ERR_INVALID_ARG, "%s: path too long", path);
    const char *slash = strrchr(path, '/');
    size_t dir = slash ? (size_t)(slash - path) + 1 : 0;
    snprintf(cfg_path, cap, "%.*stokenizer_config.json", (int)dir, path);
    return HR_OK;
}

/* The conversion proper, on parsed documents (cfg may be NULL); `file` names the source in messages. */
static hr_status convert(json_t *tok, json_t *cfg, const char *file, hr_gguf_writer *w, hr_error *err) {
    conv c = {.err = err, .file = file, .tok = tok, .cfg = cfg};
    hr_status st = HR_OK;
    vocab v = {0};
    char **merges = NULL;
    size_t n_merges = 0;
    const json_t *model = json_object_get(c.tok, "model");
    const char *mtype = jstr(model, "type");
    bool byte_level = false;
    if (!json_is_object(c.tok) || !json_is_object(model)) {
        st = hr_error_set(err, HR_ERR_FORMAT, "%s: no 'model' object: not a tokenizer.json", file);
    } else if (mtype ? strcmp(mtype, "BPE") != 0 : !json_object_get(model, "merges")) {
        st = unsupported(&c, "model type", mtype ? mtype : "(none)");
    } else if ((jstr(model, "continuing_subword_prefix") && *jstr(model, "continuing_subword_prefix")) ||
               (jstr(model, "end_of_word_suffix") && *jstr(model, "end_of_word_suffix"))) {
        st = unsupported(&c, "BPE", "with continuing_subword_prefix/end_of_word_suffix");
    } else {
        st = parse_normalizer(&c, json_object_get(c.tok, "normalizer"));
        if (st == HR_OK) st = parse_pretok(&c, json_object_get(c.tok, "pre_tokenizer"), &byte_level);
        bool fallback = jbool(model, "byte_fallback", false);
        if (st == HR_OK && byte_level && (fallback || c.replace_space || c.prefix))
            st = unsupported(&c, "ByteLevel", "combined with byte_fallback or U+2581 escaping");
        if (st == HR_OK && !byte_level && !(fallback || c.replace_space))
            st = unsupported(&c, "BPE", "without ByteLevel, byte_fallback or Metaspace");
        if (st == HR_OK && !byte_level && c.n_regex > 0) st = unsupported(&c, "Split regexes", "without ByteLevel");
        c.spm = !byte_level;
        if (st == HR_OK) st = check_decoder(&c, json_object_get(c.tok, "decoder"));
    }
    if (st == HR_OK) st = build_vocab(&c, model, &v);
    if (st == HR_OK) st = build_merges(&c, model, &v, &merges, &n_merges);
    if (st == HR_OK) {
        hr_gguf_writer_set_str(w, "tokenizer.ggml.model", c.spm ? "llama" : "gpt2");
        const char *pre = c.spm ? "default" : known_pre(&c);
        hr_gguf_writer_set_str(w, "tokenizer.ggml.pre", pre ? pre : "custom");
        if (!pre) {
            const char *rx[MAX_REGEX + 1];
            int n = 0;
            for (int i = 0; i < c.n_regex; i++) rx[n++] = c.regex[i];
            if (c.regex_gpt2) rx[n++] = k_hf_gpt2;
            if (n == 0) rx[n++] = "(?s).+"; /* no pre-tokenizer at all: the whole text is one word */
            hr_gguf_writer_set_str_array(w, "headroom.tokenizer.pre_regex", rx, (uint64_t)n);
        }
        hr_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", v.text, (uint64_t)v.n);
        hr_gguf_writer_set_array(w, "tokenizer.ggml.token_type", HR_GGUF_I32, v.type, (uint64_t)v.n);
        hr_gguf_writer_set_str_array(w, "tokenizer.ggml.merges", (const char *const *)merges, n_merges);
        if (c.spm) {
            hr_gguf_writer_set_array(w, "tokenizer.ggml.scores", HR_GGUF_F32, v.score, (uint64_t)v.n);
            hr_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", c.prefix);
            if (c.prefix_first) hr_gguf_writer_set_bool(w, "headroom.tokenizer.prefix_first", true);
            if (c.split_metaspace) hr_gguf_writer_set_bool(w, "headroom.tokenizer.split_metaspace", true);
            if (c.metaspace_prefix) hr_gguf_writer_set_bool(w, "headroom.tokenizer.metaspace_prefix", true);
        }
        if (c.norm) hr_gguf_writer_set_str(w, "headroom.tokenizer.normalizer", c.norm);
        if (v.n_strip) hr_gguf_writer_set_array(w, "headroom.tokenizer.token_strip", HR_GGUF_I32, v.strip, v.n_strip);
        write_specials(&c, &v, w);
    }
    for (size_t i = 0; merges && i < n_merges; i++) free(merges[i]);
    free(merges);
    vocab_free(&v);
    return st;
}

hr_status hr_tokenizer_json_to_gguf(const char *path, hr_gguf_writer *w, hr_error *err) {
    if (!path || !w) return hr_error_set(err, HR_ERR_INVALID_ARG, "hr_tokenizer_json_to_gguf: NULL argument");
    char json_path[4096], cfg_path[4096];
    hr_status st = resolve(path, json_path, cfg_path, sizeof json_path, err);
    if (st != HR_OK) return st;
    json_error_t jerr;
    json_t *tok = json_load_file(json_path, 0, &jerr);
    if (!tok)
        return hr_error_set(err,
                            json_error_code(&jerr) == json_error_cannot_open_file ? HR_ERR_NOT_FOUND : HR_ERR_FORMAT,
                            "%s: %s (line %d)", json_path, jerr.text, jerr.line);
    json_t *cfg = json_load_file(cfg_path, 0, &jerr); /* optional */
    st = convert(tok, cfg, json_path, w, err);
    json_decref(tok);
    json_decref(cfg);
    return st;
}

/* Writes the metadata to memory and loads it (both entry points below end here). */
static hr_status load_converted(hr_gguf_writer *w, hr_status st, hr_tokenizer **out, hr_error *err) {
    void *data = NULL;
    size_t size = 0;
    hr_gguf *g = NULL;
    if (st == HR_OK) st = hr_gguf_writer_write_memory(w, &data, &size, err);
    hr_gguf_writer_destroy(w);
    if (st == HR_OK) st = hr_gguf_open_memory(data, size, &g, err);
    if (st == HR_OK) st = hr_tokenizer_load(g, out, err);
    hr_gguf_close(g);
    free(data);
    return st;
}

hr_status hr_tokenizer_load_json_text(const char *json, size_t len, hr_tokenizer **out, hr_error *err) {
    if (!json || !out) return hr_error_set(err, HR_ERR_INVALID_ARG, "hr_tokenizer_load_json_text: NULL argument");
    json_error_t jerr;
    json_t *tok = json_loadb(json, len, 0, &jerr);
    if (!tok) return hr_error_set(err, HR_ERR_FORMAT, "tokenizer.json: %s (line %d)", jerr.text, jerr.line);
    hr_gguf_writer *w = hr_gguf_writer_create(3);
    hr_status st = w ? convert(tok, NULL, "tokenizer.json", w, err) : hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    json_decref(tok);
    return w ? load_converted(w, st, out, err) : st;
}

hr_status hr_tokenizer_load_json(const char *path, hr_tokenizer **out, hr_error *err) {
    if (!path || !out) return hr_error_set(err, HR_ERR_INVALID_ARG, "hr_tokenizer_load_json: NULL argument");
    hr_gguf_writer *w = hr_gguf_writer_create(3);
    if (!w) return hr_error_set(err, HR_ERR_NOMEM, "tokenizer: out of memory");
    return load_converted(w, hr_tokenizer_json_to_gguf(path, w, err), out, err);
}

hr_status hr_tokenizer_load_path(const char *path, hr_tokenizer **out, hr_error *err) {
    if (!path || !out) return hr_error_set(err, HR_ERR_INVALID_ARG, "hr_tokenizer_load_path: NULL argument");
    struct stat sb;
    size_t n = strlen(path);
    bool json = (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) || (n >= 5 && !strcmp(path + n - 5, ".json"));
    if (json) return hr_tokenizer_load_json(path, out, err);
    hr_gguf *g = NULL;
    hr_status st = hr_gguf_open(path, &g, err);
    if (st == HR_OK) st = hr_tokenizer_load(g, out, err);
    hr_gguf_close(g);
    return st;
}

/* pretok.c: the pre-tokenizer of byte-level BPE vocabularies: the regex sequence chosen by
 * tokenizer.ggml.pre, run on PCRE2 (UTF + Unicode properties, JIT when available).
 *
 * Semantics (those of llama.cpp's unicode_regex_split, which the conformance vectors pin down): the text
 * starts as one piece; each regex of the sequence splits every current piece into its matches and the
 * unmatched gaps between them (gaps are pieces too, nothing is dropped), the piece's end acting as the
 * subject's end for `$` and lookaheads. Compiled patterns are shared read-only; match data, the match
 * context and the JIT stack live in a scratch object that each encode call creates for itself, so
 * encoding is thread-safe. */
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "tokenizer/tok_internal.h"

/* The regex sets (facts taken from llama.cpp's llm_tokenizer_bpe; written here as C strings). In the
 * deepseek-llm letter class, code points that Unicode normalization would fold into other characters
 * (U+1F7D, U+1FBE, U+1FD3, U+1FDB, U+2126, U+212A) are written as \x{...} so that an editor or tool that
 * normalizes the source cannot silently change the ranges. */
#define RX_GPT2            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RX_CONTRACTIONS_CI "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RX_LLAMA3                                                                                                      \
    RX_CONTRACTIONS_CI "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"      \
                       "\\s+(?!\\S)|\\s+"
#define RX_QWEN2                                                                                                       \
    RX_CONTRACTIONS_CI "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"           \
                       "\\s+(?!\\S)|\\s+"
#define RX_TEKKEN                                                                                                      \
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z])" \
    ")+"                                                                                                               \
    "((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RX_BLOOM " ?[^(\\s|.,!?…。，、।۔،)]+"
#define RX_CJK   "[一-龥ࠀ-一가-퟿]+"
/* the Unicode letter table below aligns by bytes, not characters: kept out of clang-format */
// clang-format off
#define RX_DEEPSEEK_LETTERS                                                                                                                                                                        \
    "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-"                                           \
    "ᶚḀ-"                                                                                                                                                                                      \
    "ἕἘ-"                                                                                                                                                                                      \
    "Ἕἠ-"                                                                                                                                                                                      \
    "ὅὈ-"                                                                                                                                                                                      \
    "Ὅὐ-ὗὙὛὝὟ-\\x{1F7D}ᾀ-ᾴᾶ-ᾼ\\x{1FBE}ῂ-ῄῆ-ῌῐ-\\x{1FD3}ῖ-\\x{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\\x{2126}ℨ\\x{212A}-ℭℯ-ℴℹℼ-ℿⅅ-" \
    "ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-"                                                         \
    "𐓻𐲀-"                                                                                                                                                                                    \
    "𐲲𐳀-"                                                                                                                                                                                    \
    "𐳲𑢠-"                                                                                                                                                                                    \
    "𑣟𞤀-"                                                                                                                                                                                    \
    "𞥃]+"

typedef struct pre_set {
    const char *names; /* '|'-separated tokenizer.ggml.pre values */
    const char *regex[HR_PRETOK_MAX_REGEX];
} pre_set;

// clang-format on
static const pre_set k_sets[] = {
    {"default", {"[\\p{P}\\$\\+<=>\\^~\\|]+", RX_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}},
    {"gpt-2|phi-2|mpt|olmo|jais|trillion|roberta-bpe|jina-es|jina-de|jina-v1-en|jina-v2-es|jina-v2-de|jina-v2-code|"
     "gigachat|granite-docling",
     {RX_GPT2}},
    {"llama3|llama-v3|llama-bpe|falcon3|pixtral|dbrx|smaug-bpe|chatglm-bpe", {RX_LLAMA3}},
    {"qwen2|deepseek-r1-qwen|stablelm2|megrez|hunyuan", {RX_QWEN2}},
    {"deepseek-llm", {"[\r\n]", RX_DEEPSEEK_LETTERS, "\\s?[!-/:-~！-／：-～‘-‟　-。]+", "\\s+$", RX_CJK, "\\p{N}+"}},
    {"deepseek-coder", {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RX_CJK, "\\p{N}"}},
    {"deepseek-v3",
     {"\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
      "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}},
    {"falcon", {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RX_GPT2, "[0-9][0-9][0-9]"}},
    {"starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b", {"\\p{N}", RX_GPT2}},
    {"tekken", {RX_TEKKEN}},
    {"poro-chat|bloom|gpt3-finnish", {RX_BLOOM}},
    {"viking", {RX_BLOOM, "\\p{N}"}},
};

static bool name_in(const char *names, const char *pre) {
    size_t n = strlen(pre);
    for (const char *p = names; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && memcmp(p, pre, n) == 0) return true;
        if (!bar) break;
        p = bar + 1;
    }
    return false;
}

static hr_status compile_one(hr_tokenizer *t, const char *pre, const char *rx, size_t len, hr_error *err) {
    int code;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)rx, len, PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &code, &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(code, msg, sizeof(msg));
        return hr_error_set(err, HR_ERR_UNSUPPORTED, "pre-tokenizer '%s' regex %d does not compile at %zu: %s", pre,
                            t->n_regex, (size_t)at, (const char *)msg);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter is the fallback */
    t->regex[t->n_regex++] = re;
    return HR_OK;
}

hr_status hr_pretok_setup(hr_tokenizer *t, const char *pre, hr_error *err) {
    const pre_set *set = NULL;
    for (size_t i = 0; i < HR_ARRAY_LEN(k_sets) && !set; i++)
        if (name_in(k_sets[i].names, pre)) set = &k_sets[i];
    if (!set)
        return hr_error_set(err, HR_ERR_UNSUPPORTED,
                            "tokenizer.ggml.pre = '%s' is not a known pre-tokenizer (known: default, gpt-2, llama-bpe, "
                            "qwen2, deepseek-llm, deepseek-coder, deepseek-v3, falcon, starcoder, refact, smollm, "
                            "tekken, bloom, ...; see docs/TOKENIZER.md)",
                            pre);
    for (int i = 0; i < HR_PRETOK_MAX_REGEX && set->regex[i]; i++) {
        hr_status st = compile_one(t, pre, set->regex[i], strlen(set->regex[i]), err);
        if (st != HR_OK) return st;
    }
    return HR_OK;
}

hr_status hr_pretok_setup_regex(hr_tokenizer *t, const hr_gguf_array *regex, hr_error *err) {
    if (regex->type != HR_GGUF_STRING || regex->n == 0 || regex->n > HR_PRETOK_MAX_REGEX)
        return hr_error_set(err, HR_ERR_FORMAT, "headroom.tokenizer.pre_regex: expected 1..%d strings, found %s[%llu]",
                            HR_PRETOK_MAX_REGEX, hr_gguf_type_name(regex->type), (unsigned long long)regex->n);
    for (uint64_t i = 0; i < regex->n; i++) {
        hr_gguf_str s = hr_gguf_array_str(regex, i);
        hr_status st = compile_one(t, "custom", s.ptr, s.len, err);
        if (st != HR_OK) return st;
    }
    return HR_OK;
}

void hr_pretok_free(hr_tokenizer *t) {
    for (int i = 0; i < t->n_regex; i++) pcre2_code_free(t->regex[i]);
    t->n_regex = 0;
}

typedef struct span {
    size_t start, len;
} span;

typedef struct span_vec {
    span *v;
    size_t n, cap;
} span_vec;

static bool span_push(span_vec *sv, size_t start, size_t len) {
    if (len == 0) return true;
    if (sv->n == sv->cap) {
        size_t cap = sv->cap ? sv->cap * 2 : 256;
        span *v = realloc(sv->v, cap * sizeof(*v));
        if (!v) return false;
        sv->v = v, sv->cap = cap;
    }
    sv->v[sv->n++] = (span){start, len};
    return true;
}

/* Splits each piece of `in` with `re` into matches and gaps, appending to `out`. */
static hr_status split_one(const pcre2_code *re, const char *text, const span_vec *in, span_vec *out,
                           pcre2_match_data *md, pcre2_match_context *mctx, hr_error *err) {
    for (size_t p = 0; p < in->n; p++) {
        const char *sub = text + in->v[p].start;
        size_t n = in->v[p].len, pos = 0, gap = 0;
        while (pos < n) {
            int rc = pcre2_match(re, (PCRE2_SPTR)sub, n, pos, PCRE2_NO_UTF_CHECK, md, mctx);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                PCRE2_UCHAR msg[160];
                pcre2_get_error_message(rc, msg, sizeof(msg));
                return hr_error_set(err, HR_ERR_INTERNAL, "pre-tokenizer regex failed: %s", (const char *)msg);
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t m0 = ov[0], m1 = ov[1];
            if (m1 <= m0) { /* an empty match splits nothing: step over one character */
                int cl;
                hr_utf8_decode(sub + m0, &cl);
                pos = m0 + (size_t)cl;
                continue;
            }
            if (!span_push(out, in->v[p].start + gap, m0 - gap) || !span_push(out, in->v[p].start + m0, m1 - m0))
                return hr_error_set(err, HR_ERR_NOMEM, "tokenizer: out of memory");
            gap = pos = m1;
        }
        if (!span_push(out, in->v[p].start + gap, n - gap))
            return hr_error_set(err, HR_ERR_NOMEM, "tokenizer: out of memory");
    }
    return HR_OK;
}

struct hr_pretok_scratch {
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit;
    pcre2_match_data *md[HR_PRETOK_MAX_REGEX];
    span_vec a, b;
};

hr_pretok_scratch *hr_pretok_scratch_create(const hr_tokenizer *t) {
    hr_pretok_scratch *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->mctx = pcre2_match_context_create(NULL);
    s->jit = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    bool ok = s->mctx && s->jit;
    for (int r = 0; r < t->n_regex && ok; r++)
        ok = (s->md[r] = pcre2_match_data_create_from_pattern(t->regex[r], NULL));
    if (!ok) {
        hr_pretok_scratch_destroy(s);
        return NULL;
    }
    pcre2_jit_stack_assign(s->mctx, NULL, s->jit);
    return s;
}

void hr_pretok_scratch_destroy(hr_pretok_scratch *s) {
    if (!s) return;
    for (int r = 0; r < HR_PRETOK_MAX_REGEX; r++) pcre2_match_data_free(s->md[r]);
    pcre2_jit_stack_free(s->jit);
    pcre2_match_context_free(s->mctx);
    free(s->a.v);
    free(s->b.v);
    free(s);
}

hr_status hr_pretok_split(const hr_tokenizer *t, hr_pretok_scratch *s, const char *text, size_t len, hr_piece_fn fn,
                          void *ctx, hr_error *err) {
    if (len == 0) return HR_OK;
    s->a.n = 0;
    if (!span_push(&s->a, 0, len)) return hr_error_set(err, HR_ERR_NOMEM, "tokenizer: out of memory");
    hr_status st = HR_OK;
    for (int r = 0; r < t->n_regex && st == HR_OK; r++) {
        s->b.n = 0;
        st = split_one(t->regex[r], text, &s->a, &s->b, s->md[r], s->mctx, err);
        span_vec tmp = s->a;
        s->a = s->b, s->b = tmp;
    }
    for (size_t i = 0; i < s->a.n && st == HR_OK; i++) st = fn(ctx, text + s->a.v[i].start, s->a.v[i].len);
    return st;
}

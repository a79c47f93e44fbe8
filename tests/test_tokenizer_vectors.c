/* test_tokenizer_vectors.c: conformance against llama.cpp's vocabulary test vectors in
 * ../shared/vectors/tokenizer (see FORMAT.md there): every case's ids must equal the reference exactly
 * (no BOS/EOS, parse_special off), and decode(encode(x)) must give x back for every case of the
 * vocabularies whose decoding is lossless (all of those supported here; see k_vocabs). Skips (77) when the
 * shared folder is absent. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "gguf/gguf.h"
#include "harness.h"
#include "tokenizer/tokenizer.h"

typedef struct vocab_case {
    const char *name;
    bool supported;         /* false: a WordPiece vocabulary, outside this module's scope */
    int roundtrip_expected; /* cases whose decode(encode(x)) must equal x; -1 = all */
} vocab_case;

static const vocab_case k_vocabs[] = {
    {"llama-spm", true, -1}, {"gpt-2", true, -1},        {"falcon", true, -1},         {"starcoder", true, -1},
    {"refact", true, -1},    {"deepseek-llm", true, -1}, {"deepseek-coder", true, -1}, {"bert-bge", false, 0},
};

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = '\0', *len = (size_t)n;
    return buf;
}

static const char k_sep[] = "\n__ggml_vocab_test__\n";

/* Runs one vocabulary; returns false when its files are missing. */
static bool run_vocab(const vocab_case *vc, int *n_pass_total, int *n_cases_total) {
    char rel[256];
    snprintf(rel, sizeof rel, "vectors/tokenizer/ggml-vocab-%s.gguf", vc->name);
    const char *p = hr_test_shared_path(rel);
    if (!p) return false;
    char gguf_path[4096], inp_path[4200], out_path[4200];
    snprintf(gguf_path, sizeof gguf_path, "%s", p);
    snprintf(inp_path, sizeof inp_path, "%s.inp", gguf_path);
    snprintf(out_path, sizeof out_path, "%s.out", gguf_path);

    hr_error err = {0};
    hr_gguf *g = NULL;
    hr_tokenizer *t = NULL;
    CHECKF(hr_gguf_open(gguf_path, &g, &err) == HR_OK, "%s", err.msg);
    if (!g) return true;
    hr_status st = hr_tokenizer_load(g, &t, &err);
    hr_gguf_close(g);
    if (!vc->supported) {
        CHECKF(st == HR_ERR_UNSUPPORTED, "%s: expected 'unsupported', got %s", vc->name, hr_status_name(st));
        printf("%-15s skipped: WordPiece vocabulary, not implemented (load says: %s)\n", vc->name, err.msg);
        return true;
    }
    CHECKF(st == HR_OK, "%s: %s", vc->name, err.msg);
    if (!t) return true;

    size_t inp_len = 0, out_len = 0;
    char *inp = read_file(inp_path, &inp_len), *outs = read_file(out_path, &out_len);
    CHECK(inp && outs);
    int n_cases = 0, n_pass = 0, n_rt = 0;
    char *cur = inp, *line = outs;
    hr_tokenize_opts opts = {.add_bos = false, .add_eos = false, .parse_special = false};
    while (inp && outs && cur < inp + inp_len) {
        char *sep = strstr(cur, k_sep);
        if (!sep) break;
        size_t case_len = (size_t)(sep - cur);
        char *nl = strchr(line, '\n');
        CHECKF(nl != NULL, "%s: .out has fewer lines than .inp has cases", vc->name);
        if (!nl) break;
        *nl = '\0';
        int32_t want[1024];
        size_t n_want = 0;
        for (char *q = line; *q && n_want < 1024;) {
            while (*q == ' ') q++;
            if (!*q) break;
            want[n_want++] = (int32_t)strtol(q, &q, 10);
        }
        int32_t *got = NULL;
        size_t n_got = 0;
        st = hr_tokenizer_encode_alloc(t, cur, case_len, &opts, &got, &n_got, &err);
        CHECKF(st == HR_OK, "%s case %d: %s", vc->name, n_cases, err.msg);
        bool same = st == HR_OK && n_got == n_want && memcmp(got, want, n_want * sizeof(int32_t)) == 0;
        if (same) {
            n_pass++;
        } else {
            fprintf(stderr, "%s case %d '%.*s':\n  want:", vc->name, n_cases, (int)case_len, cur);
            for (size_t i = 0; i < n_want; i++) fprintf(stderr, " %d", want[i]);
            fprintf(stderr, "\n  got: ");
            for (size_t i = 0; i < n_got; i++) fprintf(stderr, " %d", got[i]);
            fprintf(stderr, "\n");
        }
        CHECK(same);
        char *text = NULL;
        size_t text_len = 0;
        if (st == HR_OK && hr_tokenizer_decode(t, got, n_got, false, &text, &text_len, &err) == HR_OK) {
            bool rt = text_len == case_len && memcmp(text, cur, case_len) == 0;
            n_rt += rt;
            if (!rt && vc->roundtrip_expected < 0)
                fprintf(stderr, "%s case %d: round trip gave '%s' for '%.*s'\n", vc->name, n_cases, text, (int)case_len,
                        cur);
        }
        free(text);
        free(got);
        n_cases++;
        cur = sep + strlen(k_sep);
        line = nl + 1;
    }
    CHECKF(line == outs + out_len, "%s: .out has more lines than .inp has cases", vc->name);
    int rt_want = vc->roundtrip_expected < 0 ? n_cases : vc->roundtrip_expected;
    CHECKF(n_rt >= rt_want, "%s: round trip %d/%d, expected %d", vc->name, n_rt, n_cases, rt_want);
    printf("%-15s %-4s pre=%-15s ids %d/%d exact, round trip %d/%d\n", vc->name, hr_tokenizer_kind_name(t),
           hr_tokenizer_pre_name(t), n_pass, n_cases, n_rt, n_cases);
    *n_pass_total += n_pass;
    *n_cases_total += n_cases;
    free(inp);
    free(outs);
    hr_tokenizer_destroy(t);
    return true;
}

/* stories260K: prompt ids (BOS + SentencePiece with the dummy prefix) and the decoded completions. */
static void run_stories(void) {
    const char *model = hr_test_shared_path("models/stories260K.gguf");
    const char *vec = hr_test_shared_path("vectors/stories260K-greedy.jsonl");
    if (!model || !vec) {
        printf("stories260K: not present in ../shared\n");
        return;
    }
    hr_error err = {0};
    hr_gguf *g = NULL;
    hr_tokenizer *t = NULL;
    CHECKF(hr_gguf_open(model, &g, &err) == HR_OK, "%s", err.msg);
    CHECKF(g && hr_tokenizer_load(g, &t, &err) == HR_OK, "%s", err.msg);
    hr_gguf_close(g);
    if (!t) return;
    CHECK(hr_tokenizer_add_bos_default(t) && hr_tokenizer_bos(t) == 1);
    FILE *f = fopen(vec, "r");
    char line[16384];
    int n_prompts = 0, n_ok = 0, n_text_ok = 0;
    while (f && fgets(line, sizeof line, f)) {
        json_error_t jerr;
        json_t *o = json_loads(line, 0, &jerr);
        CHECKF(o != NULL, "jsonl: %s", jerr.text);
        if (!o) continue;
        const char *prompt = json_string_value(json_object_get(o, "prompt"));
        const char *completion = json_string_value(json_object_get(o, "completion_text"));
        json_t *want = json_object_get(o, "prompt_tokens"), *comp = json_object_get(o, "completion_tokens");
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK(prompt && hr_tokenizer_encode_alloc(t, prompt, strlen(prompt), NULL, &ids, &n, &err) == HR_OK);
        bool same = ids && n == json_array_size(want);
        for (size_t i = 0; same && i < n; i++) same = ids[i] == json_integer_value(json_array_get(want, i));
        CHECKF(same, "stories260K prompt '%s'", prompt);
        n_ok += same;
        /* the completion decoded as a continuation of the prompt (no leading-space stripping) */
        hr_detok d;
        hr_detok_init(&d);
        d.at_start = false;
        char text[8192] = "", piece[256];
        size_t len = 0;
        for (size_t i = 0; i < json_array_size(comp); i++) {
            size_t k = hr_detok_push(t, &d, (int32_t)json_integer_value(json_array_get(comp, i)), piece, sizeof piece);
            if (len + k < sizeof text) memcpy(text + len, piece, k), len += k;
        }
        len += hr_detok_flush(t, &d, text + len, sizeof text - len);
        text[len] = 0;
        bool text_same = completion && strcmp(text, completion) == 0;
        CHECKF(text_same, "stories260K completion: got '%s', want '%s'", text, completion);
        n_text_ok += text_same;
        n_prompts++;
        free(ids);
        json_decref(o);
    }
    if (f) fclose(f);
    CHECK(n_prompts > 0);
    printf("stories260K    spm  prompt ids %d/%d exact, completion text %d/%d exact\n", n_ok, n_prompts, n_text_ok,
           n_prompts);
    hr_tokenizer_destroy(t);
}

int main(void) {
    if (!hr_test_shared_path("vectors/tokenizer/FORMAT.md"))
        HR_SKIP("../shared/vectors/tokenizer is absent (set HR_SHARED_DIR to run the conformance vectors)");
    int n_pass = 0, n_cases = 0, n_found = 0;
    for (size_t i = 0; i < sizeof(k_vocabs) / sizeof(k_vocabs[0]); i++) {
        if (run_vocab(&k_vocabs[i], &n_pass, &n_cases)) {
            n_found++;
        } else {
            printf("%-15s not present in ../shared\n", k_vocabs[i].name);
        }
    }
    CHECK(n_found > 0);
    run_stories();
    printf("total: %d/%d cases exact\n", n_pass, n_cases);
    return hr_test_finish();
}

/* test_tokenizer_cli.c: `headroom tokenize` through the built binary, on a tiny SentencePiece-style
 * vocabulary this test writes: the default table, --ids, --pieces, --count, --no-bos,
 * --parse-special, -f FILE and `--` before a text that starts with '-'; every usage error exits 2
 * with one line on stderr, and a missing or unsupported model exits 1 naming the problem. Also a tiny
 * Hugging Face tokenizer.json: -m DIR, --to-gguf, and the GGUF it writes giving the same ids. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "gguf/gguf.h"
#include "harness.h"

/* Runs `headroom tokenize ARGS`; returns the exit code, stdout and stderr. */
static int run(const char *args, char **out, char **err) {
    size_t len = strlen(args) + 16;
    char *full = malloc(len);
    snprintf(full, len, "tokenize %s", args);
    int rc = hr_test_run_cli(full, out, err);
    free(full);
    return rc;
}

static void expect(const char *args, int want_rc, const char *want_out, const char *err_has) {
    char *out = NULL, *err = NULL;
    int rc = run(args, &out, &err);
    CHECKF(rc == want_rc, "'%s' exited %d, want %d (stderr: %s)", args, rc, want_rc, err ? err : "");
    if (want_out) CHECKF(out && strcmp(out, want_out) == 0, "'%s' printed [%s], want [%s]", args, out, want_out);
    if (err_has) {
        CHECKF(err && strstr(err, err_has), "'%s' stderr [%s] lacks '%s'", args, err ? err : "", err_has);
        /* one line */
        CHECKF(err && strchr(err, '\n') == err + strlen(err) - 1, "'%s' stderr is not one line: [%s]", args, err);
    }
    free(out);
    free(err);
}

/* tokens: <unk> <s> </s> ▁ a b ▁a ▁b ab <|eot|>(control) <0x2D> ("-") */
static void write_vocab(const char *path) {
    const char *tok[] = {"<unk>",
                         "<s>",
                         "</s>",
                         "\xE2\x96\x81",
                         "a",
                         "b",
                         "\xE2\x96\x81"
                         "a",
                         "\xE2\x96\x81"
                         "b",
                         "ab",
                         "<|eot|>",
                         "<0x2D>",
                         "<0x0A>"};
    float score[] = {0, 0, 0, -1, -2, -2, -1.5f, -1.5f, -0.5f, 0, 0, 0};
    int32_t type[] = {2, 3, 3, 1, 1, 1, 1, 1, 1, 3, 6, 6};
    hr_gguf_writer *w = hr_gguf_writer_create(3);
    hr_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    hr_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", tok, 12);
    hr_gguf_writer_set_array(w, "tokenizer.ggml.scores", HR_GGUF_F32, score, 12);
    hr_gguf_writer_set_array(w, "tokenizer.ggml.token_type", HR_GGUF_I32, type, 12);
    hr_error err = {0};
    CHECKF(hr_gguf_writer_write_file(w, path, &err) == HR_OK, "%s", err.msg);
    hr_gguf_writer_destroy(w);
}

int main(void) {
    FILE *probe = fopen(HR_HEADROOM_BIN, "rb");
    if (!probe) HR_SKIP("the headroom binary is not built (%s)", HR_HEADROOM_BIN);
    fclose(probe);
    const char *dir = hr_test_tmpdir();
    char vocab[4200], text[4200], bert[4200], args[16384];
    snprintf(vocab, sizeof vocab, "%s/spm.gguf", dir);
    snprintf(text, sizeof text, "%s/text.txt", dir);
    snprintf(bert, sizeof bert, "%s/bert.gguf", dir);
    write_vocab(vocab);
    FILE *f = fopen(text, "wb");
    fputs("ab b\n", f);
    fclose(f);
    hr_gguf_writer *w = hr_gguf_writer_create(3);
    hr_gguf_writer_set_str(w, "tokenizer.ggml.model", "bert");
    CHECK(hr_gguf_writer_write_file(w, bert, NULL) == HR_OK);
    hr_gguf_writer_destroy(w);

    /* "▁ab" -> ▁ + ab (ab, -0.5, beats ▁a); " b" -> ▁b */
    snprintf(args, sizeof args, "-m %s 'ab b'", vocab);
    expect(args, 0,
           "1\t'<s>'\n3\t'\xE2\x96\x81'\n8\t'ab'\n7\t'\xE2\x96\x81"
           "b'\n",
           NULL);
    snprintf(args, sizeof args, "-m %s --ids 'ab b'", vocab);
    expect(args, 0, "1 3 8 7\n", NULL);
    snprintf(args, sizeof args, "-m %s --ids --no-bos 'ab b'", vocab);
    expect(args, 0, "3 8 7\n", NULL);
    snprintf(args, sizeof args, "-m %s --pieces --no-bos -f %s", vocab, text); /* the newline: byte token */
    expect(args, 0,
           "'\xE2\x96\x81'\n'ab'\n'\xE2\x96\x81"
           "b'\n'<0x0A>'\n",
           NULL);
    snprintf(args, sizeof args, "-m %s --count -f %s", vocab, text);
    expect(args, 0, "5\n", NULL);
    snprintf(args, sizeof args, "-m %s --ids --no-bos 'a<|eot|>'", vocab); /* plain text: bytes/unk */
    char *out = NULL;
    int rc = run(args, &out, NULL);
    CHECKF(rc == 0 && out && !strstr(out, " 9"), "control token parsed without --parse-special: %s", out);
    free(out);
    snprintf(args, sizeof args, "-m %s --ids --no-bos --parse-special 'a<|eot|>'", vocab);
    expect(args, 0, "6 9\n", NULL);
    snprintf(args, sizeof args, "-m %s --ids --no-bos -- -a", vocab); /* "▁-a": ▁, <0x2D>, a */
    expect(args, 0, "3 10 4\n", NULL);
    snprintf(args, sizeof args, "-m %s --ids --stats a", vocab);
    expect(args, 0, "1 6\n", "tokens in");

    expect("--help", 0, NULL, NULL);
    expect("'x'", 2, "", "-m MODEL is required");
    snprintf(args, sizeof args, "-m %s", vocab);
    expect(args, 2, "", "neither");
    snprintf(args, sizeof args, "-m %s -f %s x", vocab, text);
    expect(args, 2, "", "both");
    snprintf(args, sizeof args, "-m %s a b", vocab);
    expect(args, 2, "", "exactly one TEXT");
    snprintf(args, sizeof args, "-m %s --frobnicate x", vocab);
    expect(args, 2, "", "unknown option '--frobnicate'");
    expect("-m", 2, "", "-m");
    snprintf(args, sizeof args, "-m %s/absent.gguf x", dir);
    expect(args, 1, "", "absent.gguf");
    snprintf(args, sizeof args, "-m %s x", bert);
    expect(args, 1, "", "'bert' is not supported");
    snprintf(args, sizeof args, "-m %s -f %s/absent.txt", vocab, dir);
    expect(args, 1, "", "absent.txt");

    /* tokenizer.json: bytes a b c and space (U+0120), merges (a b) then (ab c); the GPT-2 regex */
    char hf[4200], json[4300], conv[4300];
    snprintf(hf, sizeof hf, "%s/hf", dir);
    snprintf(json, sizeof json, "%s/tokenizer.json", hf);
    snprintf(conv, sizeof conv, "%s/hf.gguf", dir);
    CHECK(mkdir(hf, 0700) == 0);
    f = fopen(json, "wb");
    fputs("{\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false},"
          " \"decoder\": {\"type\": \"ByteLevel\"},"
          " \"added_tokens\": [{\"id\": 7, \"content\": \"<|end|>\", \"special\": true}],"
          " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"\\u0120\": 3, \"ab\": 4,"
          " \"abc\": 5, \"\\u0120abc\": 6}, \"merges\": [\"a b\", \"ab c\", \"\\u0120 abc\"]}}",
          f);
    fclose(f);
    snprintf(args, sizeof args, "-m %s --ids --parse-special 'abc abc<|end|>'", hf); /* no BOS: none defined */
    expect(args, 0, "5 6 7\n", NULL);
    snprintf(args, sizeof args, "-m %s --ids 'abc abc<|end|>'", json);
    out = NULL;
    rc = run(args, &out, NULL);
    CHECKF(rc == 0 && out && !strncmp(out, "5 6", 3) && !strstr(out, " 7"), "special text as plain text: %s", out);
    free(out);
    snprintf(args, sizeof args, "-m %s --to-gguf %s", hf, conv);
    expect(args, 0, "", NULL);
    snprintf(args, sizeof args, "-m %s --ids --parse-special 'abc abc<|end|>'", conv);
    expect(args, 0, "5 6 7\n", NULL);
    snprintf(args, sizeof args, "-m %s --to-gguf %s x", hf, conv);
    expect(args, 2, "", "--to-gguf takes no TEXT");
    f = fopen(json, "wb");
    fputs("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", f);
    fclose(f);
    snprintf(args, sizeof args, "-m %s x", hf);
    expect(args, 1, "", "model type Unigram is not supported");
    snprintf(args, sizeof args, "-m %s --to-gguf %s", hf, conv);
    expect(args, 1, "", "model type Unigram is not supported");
    return hr_test_finish();
}

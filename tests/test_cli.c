/* test_cli.c: `headroom run` and `headroom synth` end to end, through the built binary: bad input
 * (missing file, directory, empty file, truncated download, unsupported architecture, prompt longer
 * than the context, bad flags, too small a budget) gives a non-zero exit, one line on stderr and
 * nothing on stdout; good input gives the reference tokens, stop strings, seeded determinism. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gguf/gguf.h"
#include "harness.h"

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* A failing run: non-zero exit, exactly one line on stderr containing `needle`, empty stdout. */
static void expect_failure(const char *args, const char *needle) {
    char *out = NULL, *err = NULL;
    int rc = hr_test_run_cli(args, &out, &err);
    CHECKF(rc != 0, "'%s' exited 0", args);
    CHECKF(out && out[0] == 0, "'%s' printed to stdout: %s", args, out ? out : "");
    CHECKF(err && count_lines(err) == 1, "'%s' printed %d stderr lines: %s", args, err ? count_lines(err) : -1,
           err ? err : "");
    CHECKF(err && strstr(err, needle), "'%s': stderr lacks '%s': %s", args, needle, err ? err : "");
    free(out);
    free(err);
}

static json_t *run_json(const char *args) {
    char *out = NULL;
    int rc = hr_test_run_cli(args, &out, NULL);
    CHECKF(rc == 0, "'%s' exited %d", args, rc);
    json_error_t je;
    json_t *j = out ? json_loads(out, 0, &je) : NULL;
    CHECKF(j != NULL, "'%s' did not print JSON: %s", args, out ? out : "");
    free(out);
    return j;
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

int main(void) {
    const char *dir = hr_test_tmpdir();
    char args[16384], path[4200], path2[4200];

    /* bad files */
    expect_failure("run -m /nonexistent/model.gguf -p hi", "/nonexistent/model.gguf");
    snprintf(args, sizeof args, "run -m %s -p hi", dir);
    expect_failure(args, "directory");
    snprintf(path, sizeof path, "%s/empty.gguf", dir);
    write_file(path, "", 0);
    snprintf(args, sizeof args, "run -m %s -p hi", path);
    expect_failure(args, "empty");
    /* a truncated download: a real model cut in half */
    snprintf(path, sizeof path, "%s/tiny.gguf", dir);
    snprintf(args, sizeof args, "synth --shape tiny --type q8_0 -o %s", path);
    CHECK(hr_test_run_cli(args, NULL, NULL) == 0);
    size_t n = 0;
    char *full = hr_test_slurp(path, &n);
    CHECK(full && n > 1000);
    snprintf(path2, sizeof path2, "%s/truncated.gguf", dir);
    write_file(path2, full, n / 2);
    snprintf(args, sizeof args, "run -m %s -p hi", path2);
    expect_failure(args, "truncated.gguf");
    free(full);
    /* an architecture headroom does not run */
    hr_gguf_writer *w = hr_gguf_writer_create(3);
    hr_gguf_writer_set_str(w, "general.architecture", "mamba");
    hr_error e;
    snprintf(path2, sizeof path2, "%s/mamba.gguf", dir);
    CHECK(hr_gguf_writer_write_file(w, path2, &e) == HR_OK);
    hr_gguf_writer_destroy(w);
    snprintf(args, sizeof args, "run -m %s -p hi", path2);
    expect_failure(args, "mamba");

    /* bad requests */
    snprintf(args, sizeof args, "run -m %s --ctx 8 -p 'a prompt that is certainly longer than eight tokens'", path);
    expect_failure(args, "context");
    expect_failure("run -p hi --bogus", "--bogus");
    expect_failure("run -p hi -n many", "-n");
    expect_failure("run -p hi --kv-type q9", "f16");
    expect_failure("run -p hi --kv-budget 1KiB", "--kv-budget");
    expect_failure("run", "prompt");
    expect_failure("synth --shape giant --type f16 -o x.gguf", "tinyllama-1.1b");

    /* the synthesized model runs; --json reports counts */
    snprintf(args, sizeof args, "run -m %s -p 'the cat' -n 5 --temp 0 --json --ignore-eos", path);
    json_t *j = run_json(args);
    CHECK(j && json_integer_value(json_object_get(j, "completion_tokens")) == 5);
    CHECK(j && json_array_size(json_object_get(j, "completion_token_ids")) == 5);
    CHECK(j && json_integer_value(json_object_get(j, "kv_bytes")) > 0);
    json_decref(j);
    /* chat mode: the prompt is rendered with the template (ChatML here) and tokenized with special
     * tokens parsed, so its token count equals that of the rendered text */
    char qwen[4200];
    snprintf(qwen, sizeof qwen, "%s/qwen2-tiny.gguf", dir);
    snprintf(args, sizeof args, "synth --shape qwen2-tiny --type f32 -o %s", qwen);
    CHECK(hr_test_run_cli(args, NULL, NULL) == 0);
    snprintf(args, sizeof args,
             "run -m %s --chat-template chatml --system 'Be brief.' -p 'Hi there' -n 1 --temp 0 --json --ignore-eos",
             qwen);
    j = run_json(args);
    long chat_tokens = j ? (long)json_integer_value(json_object_get(j, "prompt_tokens")) : -1;
    json_decref(j);
    static const char rendered[] = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
                                   "<|im_start|>assistant\n";
    snprintf(path2, sizeof path2, "%s/chat.txt", dir);
    write_file(path2, rendered, sizeof rendered - 1);
    snprintf(args, sizeof args, "tokenize -m %s --count --no-bos --parse-special -f %s", qwen, path2);
    char *count = NULL;
    CHECK(hr_test_run_cli(args, &count, NULL) == 0);
    CHECKF(count && chat_tokens == atol(count), "chat prompt has %ld tokens, the rendered text %s", chat_tokens,
           count ? count : "?");
    free(count);
    snprintf(args, sizeof args, "run -m %s --chat-template bogus -p hi", qwen);
    expect_failure(args, "chatml");

    /* the demo model: no -m */
    j = run_json("run -p hello -n 3 --json --ignore-eos --seed 3");
    CHECK(j && json_integer_value(json_object_get(j, "completion_tokens")) == 3);
    json_decref(j);

    const char *stories = hr_test_shared_path("models/stories260K.gguf");
    if (!stories) {
        printf("note: ../shared absent: the stories260K CLI checks are skipped\n");
        return hr_test_finish();
    }
    /* greedy matches the reference ids of "Once upon a time" */
    snprintf(args, sizeof args, "run -m %s -p 'Once upon a time' -n 48 --temp 0 --json", stories);
    j = run_json(args);
    static const int ref[12] = {432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338};
    json_t *ids = json_object_get(j, "completion_token_ids");
    int ok = json_array_size(ids) == 48;
    for (int i = 0; ok && i < 12; i++) ok = json_integer_value(json_array_get(ids, i)) == ref[i];
    CHECK(ok);
    CHECK(!strncmp(json_string_value(json_object_get(j, "completion")), ", there was a little girl named Lily.", 37));
    json_decref(j);
    /* a stop string ends the completion before it, and is not part of the text */
    snprintf(args, sizeof args, "run -m %s -p 'Once upon a time' -n 48 --temp 0 --json --stop Lily", stories);
    j = run_json(args);
    CHECK(j && !strcmp(json_string_value(json_object_get(j, "completion")), ", there was a little girl named "));
    CHECK(j && !strcmp(json_string_value(json_object_get(j, "finish_reason")), "stop"));
    json_decref(j);
    /* sampling: same seed, same tokens; another seed, other tokens */
    char *texts[3];
    for (int i = 0; i < 3; i++) {
        snprintf(args, sizeof args, "run -m %s -p 'Once upon a time' -n 40 --temp 1.0 --seed %d --json", stories,
                 i == 2 ? 99 : 5);
        j = run_json(args);
        texts[i] = json_dumps(json_object_get(j, "completion_token_ids"), JSON_COMPACT);
        json_decref(j);
    }
    CHECK(texts[0] && texts[1] && !strcmp(texts[0], texts[1]));
    CHECK(texts[0] && texts[2] && strcmp(texts[0], texts[2]));
    for (int i = 0; i < 3; i++) free(texts[i]);
    /* a window policy runs past the 512-token context and keeps at most the window resident */
    snprintf(args, sizeof args,
             "run -m %s -p 'Once upon a time' -n 700 --temp 0 --ignore-eos --kv-policy window:64 --json", stories);
    j = run_json(args);
    CHECK(j && json_integer_value(json_object_get(j, "completion_tokens")) == 700);
    CHECK(j && json_integer_value(json_object_get(j, "kv_bytes")) <= 6 * 16 * 640); /* <= 6 f16 blocks */
    json_decref(j);
    /* plain output: the completion on stdout, statistics on stderr */
    snprintf(args, sizeof args, "run -m %s -p 'Once upon a time' -n 8 --temp 0", stories);
    char *out = NULL, *err = NULL;
    CHECK(hr_test_run_cli(args, &out, &err) == 0);
    CHECK(out && !strncmp(out, ", there was a little girl\n", 26));
    CHECK(err && strstr(err, "tok/s") && strstr(err, "kv cache"));
    free(out);
    free(err);
    return hr_test_finish();
}

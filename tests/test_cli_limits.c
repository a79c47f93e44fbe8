/* test_cli_limits.c: the CLI never hits a limit silently (issue 11). Through the built binary, on
 * models written here (no ../shared needed): -n clamped by the context warns once and reports
 * finish "length" with limit "context"; --ctx past the trained context needs --ctx-extend and names
 * RoPE; --kv-budget 0, a directory as an input file, a --kv-type the head size cannot use with a
 * --block-size, and a block size outside 8..256 each fail with one stderr line and the documented
 * exit code (2: usage, 1: the run failed); -t past the online cores warns; several prompts get
 * distinct seeds (the first keeps --seed) and a header line each; eval prints progress lines when
 * stderr is not a terminal; --version prints the version and the kernels. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "harness.h"
#include "model/synth.h"

static int count_lines(const char *s) {
    int n = 0;
    for (; s && *s; s++) n += *s == '\n';
    return n;
}

/* Runs args; checks the exit code, empty stdout, exactly one stderr line holding each of the needles
 * (needle2 may be NULL). */
static void expect_error(const char *args, int want_rc, const char *needle, const char *needle2) {
    char *out = NULL, *err = NULL;
    int rc = hr_test_run_cli(args, &out, &err);
    CHECKF(rc == want_rc, "'%s' exited %d, not %d: %s", args, rc, want_rc, err ? err : "");
    CHECKF(out && out[0] == 0, "'%s' printed to stdout: %s", args, out ? out : "");
    CHECKF(count_lines(err) == 1, "'%s' printed %d stderr lines: %s", args, count_lines(err), err ? err : "");
    CHECKF(err && strstr(err, needle), "'%s': stderr lacks '%s': %s", args, needle, err ? err : "");
    if (needle2) CHECKF(err && strstr(err, needle2), "'%s': stderr lacks '%s': %s", args, needle2, err ? err : "");
    free(out);
    free(err);
}

/* Runs args, expects exit 0 and JSON on stdout; *err_out (if not NULL) gets stderr. */
static json_t *run_json(const char *args, char **err_out) {
    char *out = NULL, *err = NULL;
    int rc = hr_test_run_cli(args, &out, &err);
    CHECKF(rc == 0, "'%s' exited %d: %s", args, rc, err ? err : "");
    json_error_t je;
    json_t *j = out ? json_loads(out, 0, &je) : NULL;
    CHECKF(j != NULL, "'%s' did not print JSON: %s", args, out ? out : "");
    free(out);
    if (err_out)
        *err_out = err;
    else
        free(err);
    return j;
}

/* A random-weight llama of the tiny shape but another head size (n_embd / n_head). */
static void write_model(const char *path, int n_embd, int n_head, int n_head_kv) {
    hr_synth_shape sh;
    hr_error e;
    CHECK(hr_synth_shape_by_name("tiny", &sh, &e) == HR_OK);
    sh.n_embd = n_embd, sh.n_head = n_head, sh.n_head_kv = n_head_kv;
    hr_gguf_writer *w = NULL;
    CHECKF(hr_synth_build(&sh, HR_DTYPE_F32, 1, &w, &e) == HR_OK && hr_gguf_writer_write_file(w, path, &e) == HR_OK,
           "%s", e.msg);
    hr_gguf_writer_destroy(w);
}

static const char *k_formats[] = {"f32", "f16", "bf16", "q8", "q4", "fp8", "kivi2", "q4h"};
static const int k_blocks[] = {1, 7, 8, 16, 32, 64, 256, 512};
/* a prompt of more than 32 tokens, run in chunks of 16 (tail buffers of q4/kivi2 across chunks) */
static const char k_long[] = "the cat sat on the mat and the dog ran to the park with a red ball and a blue kite "
                             "while the sun was high and the birds sang in the old green tree";

/* Every format at every block size: 0, or 2 with one line naming the flag(s) at fault. `bad_fmt`
 * says which formats the model's head size cannot use (with `why` in the message). */
static void format_matrix(const char *model, bool (*bad_fmt)(const char *), const char *why) {
    int named = 0;
    char args[8192];
    for (size_t f = 0; f < sizeof k_formats / sizeof *k_formats; f++) {
        for (size_t b = 0; b < sizeof k_blocks / sizeof *k_blocks; b++) {
            int bs = k_blocks[b];
            snprintf(args, sizeof args,
                     "run -m %s -p '%s' -n 4 --temp 0 --ignore-eos --prefill-chunk 16 --kv-type %s --block-size %d",
                     model, k_long, k_formats[f], bs);
            if (bs < 8 || bs > 256) {
                expect_error(args, 2, "--block-size expects an integer in [8, 256]", NULL);
            } else if (bad_fmt(k_formats[f])) {
                char both[64];
                snprintf(both, sizeof both, "KV format %s with block size %d", k_formats[f], bs);
                expect_error(args, 2, both, why);
                if (!named++) /* the CLI names its flags for both (checked once: each run costs) */
                    expect_error(args, 2, both, "(KV format: --kv-type; KV block size: --block-size)");
            } else {
                char *err = NULL;
                int rc = hr_test_run_cli(args, NULL, &err);
                CHECKF(rc == 0, "'%s' exited %d: %s", args, rc, err ? err : "");
                free(err);
            }
        }
    }
}

static bool none_bad(const char *f) {
    (void)f;
    return false;
}
static bool q4h_bad(const char *f) { return !strcmp(f, "q4h"); }
static bool quant_bad(const char *f) { return strcmp(f, "f32") && strcmp(f, "f16") && strcmp(f, "bf16"); }

int main(void) {
    const char *dir = hr_test_tmpdir();
    char model[4200], args[16384], path[4200];
    char *out = NULL, *err = NULL;
    snprintf(model, sizeof model, "%s/tiny.gguf", dir);
    snprintf(args, sizeof args, "synth --shape tiny --type f32 -o %s", model);
    CHECK(hr_test_run_cli(args, NULL, NULL) == 0);

    /* --version / version */
    CHECK(hr_test_run_cli("--version", &out, NULL) == 0);
    CHECKF(out && !strncmp(out, "headroom " HR_VERSION "\n", strlen("headroom " HR_VERSION "\n")) &&
               strstr(out, "\nkernels: ") && strstr(out, "cpu features"),
           "%s", out ? out : "");
    free(out);
    CHECK(hr_test_run_cli("version", &out, NULL) == 0);
    CHECK(out && !strncmp(out, "headroom " HR_VERSION "\n", strlen("headroom " HR_VERSION "\n")));
    free(out);
    expect_error("version --bogus", 2, "--bogus", NULL);

    /* 1. -n past the context: one warning up front, finish "length", limit "context" */
    snprintf(args, sizeof args, "run -m %s --ctx 32 -p 'the cat' -n 100 --temp 0 --ignore-eos --json", model);
    json_t *j = run_json(args, &err);
    int n_prompt = (int)json_integer_value(json_object_get(j, "prompt_tokens"));
    CHECK(n_prompt > 0 && json_integer_value(json_object_get(j, "completion_tokens")) == 32 - n_prompt);
    CHECK(json_integer_value(json_object_get(j, "max_tokens")) == 32 - n_prompt);
    CHECK(!strcmp(json_string_value(json_object_get(j, "finish_reason")), "length"));
    CHECK(!strcmp(json_string_value(json_object_get(j, "limit")), "context"));
    CHECK(json_integer_value(json_object_get(j, "n_ctx")) == 32);
    CHECKF(count_lines(err) == 1 && strstr(err, "warning: -n 100 is clamped to ") && strstr(err, "--ctx 32") &&
               strstr(err, "raise --ctx"),
           "%s", err ? err : "");
    json_decref(j);
    free(err);
    /* within the context: limit "max_tokens", no warning */
    snprintf(args, sizeof args, "run -m %s --ctx 32 -p 'the cat' -n 5 --temp 0 --ignore-eos --json", model);
    j = run_json(args, &err);
    CHECK(!strcmp(json_string_value(json_object_get(j, "limit")), "max_tokens"));
    CHECKF(err && !err[0], "%s", err ? err : "");
    json_decref(j);
    free(err);
    /* the text form says so on the statistics line */
    snprintf(args, sizeof args, "run -m %s --ctx 32 -p 'the cat' -n 100 --temp 0 --ignore-eos", model);
    CHECK(hr_test_run_cli(args, NULL, &err) == 0);
    CHECKF(err && strstr(err, "finish: length (stopped at the context: 32 tokens, --ctx)"), "%s", err ? err : "");
    free(err);
    /* several prompts: one warning line for all of them */
    snprintf(args, sizeof args, "run -m %s --ctx 32 -p 'the cat' -p 'a dog' -n 100 --temp 0 --ignore-eos --json",
             model);
    j = run_json(args, &err);
    CHECKF(count_lines(err) == 1 && strstr(err, "for 2 of 2 prompts"), "%s", err ? err : "");
    json_decref(j);
    free(err);

    /* 2. --ctx past the trained context (512) */
    snprintf(args, sizeof args, "run -m %s --ctx 100000 -p hi", model);
    expect_error(args, 2, "--ctx-extend", "out of distribution for RoPE");
    snprintf(args, sizeof args, "run -m %s --ctx 600 --ctx-extend -p hi -n 2 --json", model);
    j = run_json(args, &err);
    CHECKF(count_lines(err) == 1 && strstr(err, "warning: --ctx 600 exceeds the model's trained context (512)") &&
               strstr(err, "RoPE"),
           "%s", err ? err : "");
    json_decref(j);
    free(err);

    /* 3. --kv-budget 0 */
    snprintf(args, sizeof args, "run -m %s --kv-budget 0 -p hi", model);
    expect_error(args, 2, "--kv-budget must be > 0; omit it for the default", NULL);

    /* 4. -t: above the hard limit an error, above the online cores a warning */
    snprintf(args, sizeof args, "run -m %s -t 5000 -p hi", model);
    expect_error(args, 2, "-t expects an integer in [1, 1024]", NULL);
    if (sysconf(_SC_NPROCESSORS_ONLN) < 1024) {
        snprintf(args, sizeof args, "run -m %s -t 1024 -p hi -n 2 --json", model);
        j = run_json(args, &err);
        CHECKF(count_lines(err) == 1 && strstr(err, "warning: -t 1024 exceeds the "), "%s", err ? err : "");
        CHECK(json_integer_value(json_object_get(j, "threads")) == sysconf(_SC_NPROCESSORS_ONLN));
        json_decref(j);
        free(err);
    }

    /* 5. a directory or a device as an input file: exit 1, one line */
    snprintf(args, sizeof args, "eval -m %s %s", model, dir);
    expect_error(args, 1, "is a directory, not a file", NULL);
    snprintf(args, sizeof args, "run -m %s --prompts %s", model, dir);
    expect_error(args, 1, "is a directory, not a file", NULL);
    snprintf(args, sizeof args, "tokenize -m %s -f %s", model, dir);
    expect_error(args, 1, "is a directory, not a file", NULL);
    snprintf(args, sizeof args, "tokenize -m %s -f /dev/null", model);
    expect_error(args, 1, "not a regular file", NULL);

    /* 6. one exit code per kind of error, in run and eval alike */
    snprintf(path, sizeof path, "%s/text.txt", dir);
    FILE *f = fopen(path, "w");
    for (int i = 0; i < 40; i++) fprintf(f, "the cat sat on the mat and the dog ran to the park. ");
    fclose(f);
    snprintf(args, sizeof args, "run -m %s -p hi --kv-policy window:0", model);
    expect_error(args, 2, "window:0", NULL);
    snprintf(args, sizeof args, "eval -m %s --policy window:0 %s", model, path);
    expect_error(args, 2, "window:0", NULL);
    snprintf(args, sizeof args, "eval -m %s --ctx 1024 %s", model, path);
    expect_error(args, 2, "trained context (512)", "RoPE");
    expect_error("run -p hi --bogus", 2, "--bogus", NULL);
    expect_error("eval --bogus", 2, "--bogus", NULL);
    expect_error("tokenize --bogus", 2, "--bogus", NULL);
    static const char *helps[] = {"run --help", "eval --help", "tokenize --help", "synth --help", "--help"};
    for (size_t i = 0; i < sizeof helps / sizeof *helps; i++) {
        CHECK(hr_test_run_cli(helps[i], &out, NULL) == 0);
        CHECKF(out && strstr(out, "exit status: 0 success; 1 the run failed"), "'%s' lacks the exit codes", helps[i]);
        free(out);
    }
    CHECK(hr_test_run_cli("run --help", &out, NULL) == 0);
    CHECK(out && strstr(out, "--ctx-extend") && strstr(out, "splitmix64") && strstr(out, "--- [i/N] ---"));
    free(out);

    /* 7. eval off a terminal: a line at start and one at the end; --quiet: none */
    snprintf(args, sizeof args, "eval -m %s --ctx 32 --chunks 2 --kv-type f16 %s", model, path);
    CHECK(hr_test_run_cli(args, &out, &err) == 0);
    CHECKF(err && !strchr(err, '\r') && strstr(err, "headroom eval: ") && strstr(err, "chunks of 32") &&
               strstr(err, "headroom eval: 2/2 chunks done in "),
           "%s", err ? err : "");
    CHECK(out && strstr(out, "perplexity"));
    free(out);
    free(err);
    snprintf(args, sizeof args, "eval -m %s --ctx 32 --chunks 1 --kv-type f16 -q %s", model, path);
    CHECK(hr_test_run_cli(args, NULL, &err) == 0);
    CHECKF(err && !err[0], "%s", err ? err : "");
    free(err);

    /* 8. per-prompt seeds: the first keeps --seed, the others differ, each reproducible alone */
    snprintf(args, sizeof args,
             "run -m %s -p 'the cat' -p 'the cat' -p 'the cat' -n 16 --temp 1.5 --seed 7 --ignore-eos --json", model);
    j = run_json(args, NULL);
    json_t *res = json_object_get(j, "results");
    CHECK(json_array_size(res) == 3);
    json_int_t seeds[3];
    char *ids[3];
    for (int i = 0; i < 3; i++) {
        seeds[i] = json_integer_value(json_object_get(json_array_get(res, (size_t)i), "seed"));
        ids[i] = json_dumps(json_object_get(json_array_get(res, (size_t)i), "completion_token_ids"), JSON_COMPACT);
    }
    CHECK(seeds[0] == 7 && seeds[1] != 7 && seeds[2] != 7 && seeds[1] != seeds[2]);
    CHECKF(ids[0] && ids[1] && ids[2] && (strcmp(ids[0], ids[1]) || strcmp(ids[1], ids[2])),
           "three samples of one prompt are identical: %s", ids[0] ? ids[0] : "");
    snprintf(args, sizeof args, "run -m %s -p 'the cat' -n 16 --temp 1.5 --seed %lld --ignore-eos --json", model,
             (long long)seeds[2]);
    json_t *alone = run_json(args, NULL);
    char *alone_ids = json_dumps(json_object_get(alone, "completion_token_ids"), JSON_COMPACT);
    CHECK(alone_ids && ids[2] && !strcmp(alone_ids, ids[2]));
    free(alone_ids);
    json_decref(alone);
    for (int i = 0; i < 3; i++) free(ids[i]);
    json_decref(j);

    /* 9. text output: a header line per prompt; a single prompt has none */
    snprintf(args, sizeof args, "run -m %s -p 'the cat' -p 'a dog' -n 4 --temp 0", model);
    CHECK(hr_test_run_cli(args, &out, NULL) == 0);
    CHECKF(out && !strncmp(out, "--- [1/2] ---\n", 14) && strstr(out, "\n--- [2/2] ---\n"), "%s", out ? out : "");
    free(out);
    snprintf(args, sizeof args, "run -m %s -p 'the cat' -n 4 --temp 0", model);
    CHECK(hr_test_run_cli(args, &out, NULL) == 0);
    CHECK(out && !strstr(out, "---"));
    free(out);

    /* 11. every KV format at every block size: it runs or fails at startup with one line */
    format_matrix(model, none_bad, NULL); /* head_dim 16 */
    snprintf(path, sizeof path, "%s/hd24.gguf", dir);
    write_model(path, 96, 4, 2); /* head_dim 24: a multiple of 8, not a power of two */
    format_matrix(path, q4h_bad, "power of two");
    snprintf(args, sizeof args, "eval -m %s --ctx 32 --chunks 1 --kv-type q8,q4h %s/text.txt", path, dir);
    expect_error(args, 2, "KV format q4h with block size 16", "power of two");
    snprintf(args, sizeof args, "eval -m %s --ctx 32 --chunks 1 --kv-type all -q %s/text.txt", path, dir);
    CHECK(hr_test_run_cli(args, &out, NULL) == 0);
    CHECKF(out && strstr(out, "unavailable: KV format q4h with block size 16") &&
               strstr(out, "(KV format: --kv-type; KV block size: --block-size)"),
           "%s", out ? out : "");
    free(out);
    snprintf(path, sizeof path, "%s/hd12.gguf", dir);
    write_model(path, 48, 4, 2); /* head_dim 12: no quantized format */
    format_matrix(path, quant_bad, "multiple of 8");
    return hr_test_finish();
}

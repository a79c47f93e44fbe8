/* test_engine_cli.c: `headroom run` with several prompts, through the built binary: results come back
 * in input order, each identical to the same prompt run alone (greedy), for -p repeated and for
 * --prompts FILE, under every admission mode, both KV layouts and a budget small enough to preempt;
 * a prompt that can never fit is reported with its reason while the others complete; --help lists
 * the engine's flags; bad engine flag values fail with one line. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"

static char out_path[4200], err_path[4200];

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    size_t got = fread(b, 1, (size_t)len, f);
    b[got] = 0;
    fclose(f);
    return b;
}

static int run(const char *args) {
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>%s </dev/null", HR_HEADROOM_BIN, args, out_path, err_path);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static json_t *run_json(const char *args, int want_rc) {
    int rc = run(args);
    char *out = slurp(out_path);
    CHECKF(rc == want_rc, "'%s' exited %d", args, rc);
    json_error_t je;
    json_t *j = out ? json_loads(out, 0, &je) : NULL;
    CHECKF(j != NULL, "'%s' did not print JSON: %s", args, out ? out : "");
    free(out);
    return j;
}

static const char *k_prompts[] = {"Once upon a time",       "Lily went to the park",  "The dog",
                                  "Tom had a big red ball", "One day, a little bird", "She was happy"};
#define NPR 6

/* completion_token_ids of a JSON object as a compact string (caller frees) */
static char *ids_of(json_t *o) { return json_dumps(json_object_get(o, "completion_token_ids"), JSON_COMPACT); }

int main(void) {
    const char *dir = hr_test_tmpdir();
    snprintf(out_path, sizeof out_path, "%s/stdout", dir);
    snprintf(err_path, sizeof err_path, "%s/stderr", dir);
    char model[4200], args[16384];
    const char *stories = hr_test_shared_path("models/stories260K.gguf");
    if (stories) {
        snprintf(model, sizeof model, "%s", stories);
    } else { /* no ../shared: a synthetic model written here */
        snprintf(model, sizeof model, "%s/tiny.gguf", dir);
        snprintf(args, sizeof args, "synth --shape tiny --type f32 -o %s", model);
        CHECK(run(args) == 0);
    }
    /* each prompt alone */
    char *solo[NPR];
    for (int i = 0; i < NPR; i++) {
        snprintf(args, sizeof args, "run -m %s -p '%s' -n 40 --temp 0 --ignore-eos --json", model, k_prompts[i]);
        json_t *j = run_json(args, 0);
        solo[i] = j ? ids_of(j) : NULL;
        CHECK(j && json_object_get(j, "completion") && !json_object_get(j, "results"));
        json_decref(j);
    }
    /* all together, in every engine configuration */
    static const char *configs[] = {
        "",
        "--admission reserve",
        "--admission optimistic --ctx 64 --kv-budget 60KiB --max-batch-tokens 32",
        "--admission adaptive --ctx 64 --kv-budget 60KiB --prefill-chunk 3",
        "--kv-layout contiguous --ctx 64 --kv-budget 100KiB",
        "--admission optimistic --preempt recompute --ctx 64 --kv-budget 50KiB --max-running 4",
        "--admission optimistic --preempt swap --ctx 64 --kv-budget 50KiB --max-running 4",
    };
    char pfile[4300];
    snprintf(pfile, sizeof pfile, "%s/prompts.txt", dir);
    FILE *f = fopen(pfile, "w");
    for (int i = 3; i < NPR; i++) fprintf(f, "%s\n%s", k_prompts[i], i == 4 ? "\n" : ""); /* a blank line too */
    fclose(f);
    for (size_t c = 0; c < sizeof configs / sizeof *configs; c++) {
        int n = snprintf(args, sizeof args, "run -m %s -n 40 --temp 0 --ignore-eos --json %s", model, configs[c]);
        for (int i = 0; i < 3; i++) n += snprintf(args + n, sizeof args - (size_t)n, " -p '%s'", k_prompts[i]);
        snprintf(args + n, sizeof args - (size_t)n, " --prompts %s", pfile);
        json_t *j = run_json(args, 0);
        json_t *res = json_object_get(j, "results");
        CHECKF(json_array_size(res) == NPR, "%s: %zu results", configs[c], json_array_size(res));
        int same = 0;
        for (int i = 0; i < NPR && i < (int)json_array_size(res); i++) {
            char *ids = ids_of(json_array_get(res, i));
            same += ids && solo[i] && !strcmp(ids, solo[i]);
            free(ids);
        }
        json_t *eng = json_object_get(j, "engine");
        CHECKF(same == NPR, "'%s': %d of %d completions equal their solo run", configs[c], same, NPR);
        CHECK(json_integer_value(json_object_get(eng, "completed")) == NPR);
        printf("%-70s %d/%d identical, peak %lld running, %lld preemptions\n",
               configs[c][0] ? configs[c] : "(defaults)", same, NPR,
               json_integer_value(json_object_get(eng, "peak_running")),
               json_integer_value(json_object_get(eng, "preemptions")));
        /* stories260K: 10 KiB per 16-token block; 6 x ~48 tokens do not fit 50-60 KiB at once */
        if (stories && c == 6) CHECK(json_integer_value(json_object_get(eng, "preempt_swap")) > 0);
        if (stories && (c == 2 || c == 5 || c == 6)) CHECK(json_integer_value(json_object_get(eng, "preemptions")) > 0);
        if (stories && c == 4) CHECK(json_integer_value(json_object_get(eng, "peak_running")) == 2);
        json_decref(j);
    }
    /* a budget that cannot hold one --ctx sequence is a startup error that says what fits (a value this
     * model cannot use: a usage error, exit 2) */
    snprintf(args, sizeof args,
             "run -m %s -n 300 --ctx 512 --kv-budget 40KiB --temp 0 --json -p 'Once upon a time' -p 'The dog'", model);
    CHECK(run(args) == 2);
    char *berr = slurp(err_path);
    CHECKF(berr && strstr(berr, "the KV budget 40.0 KiB holds ") && strstr(berr, "the context is 512") &&
               strstr(berr, "raise the KV budget to ") &&
               strstr(berr, "(KV budget: --kv-budget; context length: --ctx)"),
           "%s", berr ? berr : "");
    free(berr);
    /* a prompt longer than the context next to one that fits: reported with its reason, the other
     * completes, exit 1 */
    char longp[1024] = "";
    for (int i = 0; i < 70; i++) strcat(longp, i % 2 ? "dog " : "cat ");
    snprintf(args, sizeof args, "run -m %s -n 40 --ctx 48 --temp 0 --json -p 'Once upon a time' -p '%s'", model, longp);
    json_t *j = run_json(args, 1);
    json_t *res = json_object_get(j, "results");
    CHECK(json_array_size(res) == 2);
    const char *code0 = json_string_value(json_object_get(json_array_get(res, 0), "error_code"));
    const char *code1 = json_string_value(json_object_get(json_array_get(res, 1), "error_code"));
    CHECKF(!code0 && code1 && !strcmp(code1, "range"), "error codes %s / %s", code0 ? code0 : "-", code1 ? code1 : "-");
    json_decref(j);
    /* plain text: one block per prompt, in order, each after a header line */
    snprintf(args, sizeof args, "run -m %s -n 8 --temp 0 -p 'Once upon a time' -p 'The dog'", model);
    CHECK(run(args) == 0);
    char *out = slurp(out_path), *err = slurp(err_path);
    CHECK(out && !strncmp(out, "--- [1/2] ---\n", 14) && strstr(out, "\n--- [2/2] ---\n"));
    CHECK(err && strstr(err, "tok/s aggregate") && strstr(err, "preemptions"));
    free(out);
    free(err);
    /* --help documents the engine's flags; bad values fail with one line */
    CHECK(run("run --help") == 0);
    out = slurp(out_path);
    static const char *flags[] = {"--kv-budget", "--kv-type",   "--max-batch-tokens", "--admission",
                                  "--preempt",   "--max-queue", "--kv-layout",        "--prompts"};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++)
        CHECKF(out && strstr(out, flags[i]), "--help lacks %s", flags[i]);
    free(out);
    CHECK(run("run -p hi --admission greedy") == 2);
    err = slurp(err_path);
    CHECK(err && strstr(err, "reserve") && strchr(err, '\n') == strrchr(err, '\n'));
    free(err);
    CHECK(run("run -p hi --kv-layout ring") == 2);
    for (int i = 0; i < NPR; i++) free(solo[i]);
    return hr_test_finish();
}

/* test_cli_errors.c: structured errors (common/status.h) and the front ends' names for them. Table-
 * driven over every hr_param code: each has a domain name, and a CLI flag (cli/errors.c) that the
 * CLI's --help really lists, or a request field (server/openai.c) that the server really knows, or
 * both; the CLI's error line names the flags of both parameters an error is about; the server's
 * refusal names the field from the code (the prompt and output format as the request spelt them) and
 * never from the message's text. */
#include <stdlib.h>
#include <string.h>

#include "cli/errors.h"
#include "common/status.h"
#include "harness.h"
#include "server/server_internal.h"

/* Does text list flag as a word of its own ("-n" in "  -n, --n-predict N", not in "--n-predict")? */
static bool lists_flag(const char *text, const char *flag) {
    size_t n = strlen(flag);
    for (const char *p = strstr(text, flag); p; p = strstr(p + 1, flag)) {
        bool start = p == text || p[-1] == ' ' || p[-1] == '\n' || p[-1] == '[' || p[-1] == '(' || p[-1] == ',';
        char e = p[n];
        bool end = !(e == '-' || (e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9'));
        if (start && end) return true;
    }
    return false;
}

static void test_table(void) {
    /* the --help of every command that takes these settings */
    static const char *const cmds[] = {"run --help", "serve --help", "eval --help", "plan --help", "synth --help"};
    char *help = calloc(1, 1);
    size_t len = 0;
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char *out = NULL;
        CHECKF(hr_test_run_cli(cmds[i], &out, NULL) == 0 && out && out[0], "headroom %s", cmds[i]);
        size_t n = out ? strlen(out) : 0;
        char *h = realloc(help, len + n + 2);
        if (h) {
            help = h;
            memcpy(help + len, out ? out : "", n);
            len += n;
            help[len++] = '\n';
            help[len] = 0;
        }
        free(out);
    }
    CHECK(hr_param_name(HR_PARAM_NONE)[0] == 0 && hr_cli_param_flag(HR_PARAM_NONE) == NULL &&
          hr_srv_param_field(HR_PARAM_NONE) == NULL);
    CHECK(hr_cli_param_flag(HR_PARAM_COUNT) == NULL && hr_srv_param_field(HR_PARAM_COUNT) == NULL &&
          hr_param_name(HR_PARAM_COUNT)[0] == 0);
    int n_flags = 0, n_fields = 0;
    for (int p = 1; p < HR_PARAM_COUNT; p++) {
        const char *name = hr_param_name((hr_param)p), *flag = hr_cli_param_flag((hr_param)p),
                   *field = hr_srv_param_field((hr_param)p);
        CHECKF(name[0], "param %d has no name", p);
        for (int q = 1; q < p; q++)
            CHECKF(strcmp(name, hr_param_name((hr_param)q)), "params %d and %d: '%s'", q, p, name);
        /* a domain name is no front end's spelling */
        CHECKF(name[0] != '-' && !strchr(name, '_'), "param %d's name '%s' looks like a flag or a field", p, name);
        CHECKF(flag || field, "param %d (%s) is named by neither the CLI nor the server", p, name);
        if (flag) {
            n_flags++;
            CHECKF(lists_flag(help, flag), "param %d (%s): the CLI's --help lists no %s", p, name, flag);
        }
        if (field) {
            n_fields++;
            /* a field the server knows: its redaction keeps known field names, masks anything else */
            char quoted[64], kept[64];
            snprintf(quoted, sizeof quoted, "'%s'", field);
            hr_srv_redact(quoted, kept, sizeof kept);
            CHECKF(!strcmp(kept, quoted), "param %d (%s): '%s' is no request field the server knows", p, name, field);
            /* a refusal about it names it */
            hr_error err = {0};
            hr_error_set_param(&err, HR_ERR_INVALID_ARG, (hr_param)p, "7", "%s 7 is wrong", name);
            hr_srv_error e = {0};
            hr_srv_fail_status(&e, NULL, HR_ERR_INVALID_ARG, &err, "messages", "guided_regex");
            const char *want = p == HR_PARAM_PROMPT ? "messages" : p == HR_PARAM_OUTPUT_FORMAT ? "guided_regex" : field;
            CHECKF(e.http == 400 && e.param && !strcmp(e.param, want) && strstr(e.msg, "is wrong"),
                   "param %d: http %d param %s, want %s: %s", p, e.http, e.param ? e.param : "-", want, e.msg);
        }
    }
    CHECK(n_flags >= 20 && n_fields >= 14);
    free(help);
}

static void test_cli_line(void) {
    hr_error err = {0};
    /* the runtime's budget refusal, as it sets it: the CLI names both flags after the domain text */
    hr_error_set_params(&err, HR_ERR_BUDGET, HR_PARAM_KV_BUDGET, HR_PARAM_CONTEXT, "40.0 KiB",
                        "the KV budget 40.0 KiB holds 320 tokens; raise the KV budget or lower the context length");
    CHECK(err.code == HR_ERR_BUDGET && err.param == HR_PARAM_KV_BUDGET && err.also == HR_PARAM_CONTEXT &&
          !strcmp(err.value, "40.0 KiB"));
    char line[HR_CLI_ERROR_MAX];
    CHECKF(!strcmp(hr_cli_error_text(&err, line, sizeof line),
                   "the KV budget 40.0 KiB holds 320 tokens; raise the KV budget or lower the context length "
                   "(KV budget: --kv-budget; context length: --ctx)"),
           "%s", line);
    /* a parameter no flag sets (the server's logit_bias) adds nothing; neither does an error about none */
    hr_error_set_param(&err, HR_ERR_INVALID_ARG, HR_PARAM_LOGIT_BIAS, "101", "logit bias 101 is out of range");
    CHECK(!strcmp(HR_CLI_ERROR(&err), "logit bias 101 is out of range"));
    hr_error_set(&err, HR_ERR_IO, "cannot open 'x'");
    CHECK(err.param == HR_PARAM_NONE && err.also == HR_PARAM_NONE && err.value[0] == 0);
    CHECK(!strcmp(HR_CLI_ERROR(&err), "cannot open 'x'"));
    /* hr_error_about names what a lower layer's error is about, keeping its code and text; prefixing
       keeps the parameter */
    hr_error_set(&err, HR_ERR_INVALID_ARG, "KV policy 'window:0': keeps nothing");
    hr_error_about(&err, HR_PARAM_KV_POLICY, "window:0");
    hr_error_prefix(&err, "request 3");
    CHECK(err.code == HR_ERR_INVALID_ARG && err.param == HR_PARAM_KV_POLICY && !strcmp(err.value, "window:0"));
    CHECK(!strcmp(HR_CLI_ERROR(&err), "request 3: KV policy 'window:0': keeps nothing (KV policy: --kv-policy)"));
    /* a value is one line, and cut to its room */
    char longv[200];
    memset(longv, 'x', sizeof longv - 1);
    longv[sizeof longv - 1] = 0;
    longv[3] = '\n';
    hr_error_set_param(&err, HR_ERR_INVALID_ARG, HR_PARAM_STOP, longv, "bad stop string");
    CHECK(strlen(err.value) == HR_ERROR_VALUE_MAX - 1 && err.value[3] == '?');
    hr_error_clear(&err);
    CHECK(err.code == HR_OK && err.param == HR_PARAM_NONE && err.value[0] == 0 && err.msg[0] == 0);
}

static void test_server_by_code(void) {
    hr_srv_error e = {0};
    hr_error err = {0};
    /* a message that mentions a field but is about none: no param (the text is never searched) */
    hr_error_set(&err, HR_ERR_INVALID_ARG, "max_tokens and temperature and kv_policy and penalty");
    hr_srv_fail_status(&e, NULL, HR_ERR_INVALID_ARG, &err, "prompt", NULL);
    CHECK(e.http == 400 && e.param == NULL);
    /* the engine's budget refusal: about a server setting, so the prompt, and the message names the
       request field it offers as the other remedy */
    memset(&e, 0, sizeof e);
    hr_error_set_params(&err, HR_ERR_BUDGET, HR_PARAM_KV_BUDGET, HR_PARAM_MAX_TOKENS, NULL,
                        "the request needs 9 KV blocks: raise the KV budget or lower max tokens");
    hr_srv_fail_status(&e, NULL, HR_ERR_BUDGET, &err, "messages", NULL);
    CHECKF(e.http == 400 && !strcmp(e.param, "messages") && !strcmp(e.code, "kv_budget_exceeded") &&
               !strcmp(e.msg, "the request needs 9 KV blocks: raise the KV budget or lower max tokens "
                              "(max tokens: 'max_tokens')") &&
               !strstr(e.msg, "--"),
           "%s", e.msg);
    /* the output format: the field the request used; its name in the message too */
    memset(&e, 0, sizeof e);
    hr_error_set_param(&err, HR_ERR_INVALID_ARG, HR_PARAM_OUTPUT_FORMAT, NULL, "output format: expected ')'");
    hr_srv_fail_status(&e, NULL, HR_ERR_INVALID_ARG, &err, "prompt", "guided_regex");
    CHECKF(!strcmp(e.param, "guided_regex") && strstr(e.msg, "(output format: 'guided_regex')"), "%s", e.msg);
    /* a field spelt as its domain name (temperature) is not repeated */
    memset(&e, 0, sizeof e);
    hr_error_set_param(&err, HR_ERR_INVALID_ARG, HR_PARAM_TEMPERATURE, "200", "temperature 200 is outside [0, 100]");
    hr_srv_fail_status(&e, NULL, HR_ERR_INVALID_ARG, &err, "prompt", NULL);
    CHECKF(!strcmp(e.param, "temperature") && !strcmp(e.msg, "temperature 200 is outside [0, 100]"), "%s", e.msg);
}

int main(void) {
    test_cli_line();
    test_server_by_code();
    test_table();
    return hr_test_finish();
}

/* fuzz_jinja.c: libFuzzer target for the Jinja interpreter (tokenizer/jinja.h) and the hr_chat
 * layer over it. Input: template text, then a 0x00 byte, then the render context as JSON (when the
 * part after the 0x00 is absent or not a JSON object, a fixed conversation with a system prompt, a
 * tool call and a tool result is used, so that mutated templates still meet realistic data).
 * Checked: parse and render either succeed (a NUL-terminated string no longer than the output limit)
 * or fail with a one-line, non-empty message and one of the documented codes; the small limits
 * set here must hold (no run takes more than a few milliseconds whatever the template does); and
 * hr_chat over the same template (the JSON part as its template variables) renders or fails cleanly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/chat.h"
#include "tokenizer/jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char k_default_ctx[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi\"},"
    " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"call12345\", \"type\": \"function\","
    " \"function\": {\"name\": \"f\", \"arguments\": {\"x\": 1.5, \"y\": [true, null]}}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"call12345\", \"content\": \"ok\"}, {\"role\": \"user\", \"content\": "
    "\"é\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

static void check_error(hr_status st, const hr_error *err) {
    bool known = st == HR_ERR_FORMAT || st == HR_ERR_UNSUPPORTED || st == HR_ERR_RANGE || st == HR_ERR_INVALID_ARG ||
                 st == HR_ERR_NOMEM;
    if (!known || !err->msg[0] || strchr(err->msg, '\n')) {
        fprintf(stderr, "fuzz_jinja: bad failure %d '%s'\n", (int)st, err->msg);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t tpl_len = nul ? (size_t)(nul - data) : size;
    char *ctx = NULL;
    if (nul) {
        size_t n = size - tpl_len - 1;
        ctx = malloc(n + 1);
        if (!ctx) return 0;
        memcpy(ctx, nul + 1, n);
        ctx[n] = '\0';
    }
    hr_jinja_limits lim = {.max_steps = 20000,
                           .max_output_bytes = 1 << 16,
                           .max_memory_bytes = 8 << 20,
                           .max_depth = 64,
                           .now_unix = 1796472000};
    hr_jinja *t = NULL;
    hr_error err = {0};
    hr_status st = hr_jinja_parse((const char *)data, tpl_len, &lim, &t, &err);
    if (st != HR_OK) {
        check_error(st, &err);
    } else {
        for (int pass = 0; pass < 2; pass++) {
            const char *c = pass == 0 && ctx ? ctx : k_default_ctx;
            char *out = NULL;
            size_t n = 0;
            hr_error rerr = {0};
            st = hr_jinja_render(t, c, &lim, &out, &n, &rerr);
            if (st == HR_OK) {
                if (!out || strlen(out) > n || n > lim.max_output_bytes) abort(); /* NULs inside are allowed */
                free(out);
            } else {
                if (out) abort();
                if (!(pass == 0 && st == HR_ERR_FORMAT))
                    check_error(st, &rerr); /* the context may be junk */
                else if (!rerr.msg[0])
                    abort();
            }
            if (!ctx) break;
        }
        hr_jinja_destroy(t);
    }
    /* hr_chat over the same text: load (parse + trial render) and one render with tools */
    char *text = malloc(tpl_len + 1);
    if (text) {
        memcpy(text, data, tpl_len);
        text[tpl_len] = '\0';
        hr_chat *chat = NULL;
        char warning[512];
        hr_chat_params p = {.template_text = text, .template_len = tpl_len, .limits = lim};
        if (tpl_len && hr_chat_create(&p, &chat, warning, sizeof warning, &err) == HR_OK) {
            const hr_chat_msg msgs[] = {
                {.role = "user", .content = "Hi"},
                {.role = "assistant",
                 .content = NULL,
                 .tool_calls_json =
                     "[{\"id\":\"call12345\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]"},
                {.role = "tool", .content = "ok", .tool_call_id = "call12345"}};
            hr_chat_render_params rp = {.msgs = msgs,
                                        .n_msgs = 3,
                                        .add_generation_prompt = true,
                                        .vars_json = ctx, /* the JSON part as template variables */
                                        .bos = "<s>",
                                        .eos = "</s>",
                                        .tools_json = "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]"};
            char *out = NULL;
            hr_error rerr = {0};
            st = hr_chat_apply(chat, &rp, &out, &rerr);
            if (st == HR_OK)
                free(out);
            else
                check_error(st, &rerr);
            hr_chat_destroy(chat);
        }
        free(text);
    }
    free(ctx);
    return 0;
}

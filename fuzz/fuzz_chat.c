/* fuzz_chat.c: libFuzzer target for chat-template rendering and detection with arbitrary messages.
 * Input: byte 0 picks the family (1..9, and 0 for an unknown one) and add_generation_prompt; the rest
 * is split at 0xFF bytes into role, content, role, content, ... (so roles are arbitrary too, empty
 * and unknown ones included). The whole rest is also given to hr_chat_template_detect as a Jinja text.
 * Checked: a render either succeeds with a NUL-terminated string containing every user and assistant
 * message's content (no family drops a turn) or fails with a one-line message; the render with
 * client-text ranges (hr_chat_render_spans) gives the same text and ordered, disjoint ranges inside
 * it; detection always names a family. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/chat.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_MSGS 16

/* The whitespace a family's strip() removes (Python's str.strip over ASCII, as the Jinja templates do). */
static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    hr_chat_template tpl = (hr_chat_template)((data[0] & 0x0F) % 10);
    bool gen_prompt = (data[0] & 0x10) != 0;
    /* NUL-terminated copies of each field, split at 0xFF */
    char *buf = malloc(size);
    if (!buf) return 0;
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = '\0';
    const char *field[2 * MAX_MSGS];
    int n_fields = 0;
    field[n_fields++] = buf;
    for (size_t i = 0; i + 1 < size && n_fields < 2 * MAX_MSGS; i++) {
        if ((uint8_t)buf[i] == 0xFF) {
            buf[i] = '\0';
            field[n_fields++] = buf + i + 1;
        }
    }
    hr_chat_msg msgs[MAX_MSGS];
    size_t n = (size_t)n_fields / 2;
    for (size_t i = 0; i < n; i++) msgs[i] = (hr_chat_msg){.role = field[2 * i], .content = field[2 * i + 1]};
    char *out = NULL;
    hr_error err = {0};
    hr_status st = hr_chat_render(tpl, msgs, n, gen_prompt, "<s>", "</s>", &out, &err);
    if (st == HR_OK) {
        if (!out) abort();
        for (size_t i = 0; i < n; i++) {
            /* the families render user and assistant turns always; what they do with other roles is
               each one's own (llama2's template drops an unknown role, as its Jinja does) */
            if (strcmp(msgs[i].role, "user") != 0 && strcmp(msgs[i].role, "assistant") != 0) continue;
            /* leading/trailing spaces may be trimmed by a family: look for the content's core */
            const char *c = msgs[i].content;
            while (is_ws(*c)) c++;
            size_t len = strlen(c);
            while (len && is_ws(c[len - 1])) len--;
            char *core = strndup(c, len);
            if (!core) abort();
            if (len && !strstr(out, core)) {
                fprintf(stderr, "fuzz_chat: %s dropped message %zu (role '%s')\n", hr_chat_template_name(tpl), i,
                        msgs[i].role);
                abort();
            }
            free(core);
        }
        /* the same render with the client-text ranges: the same text, ranges in order, disjoint, inside */
        char *out2 = NULL;
        hr_chat_span *sp = NULL;
        size_t n_sp = 0, end = 0, len = strlen(out);
        if (hr_chat_render_spans(tpl, msgs, n, gen_prompt, "<s>", "</s>", &out2, &sp, &n_sp, &err) != HR_OK ||
            strcmp(out, out2) != 0)
            abort();
        for (size_t i = 0; i < n_sp; i++) {
            if (sp[i].len == 0 || sp[i].off < end || sp[i].off + sp[i].len > len) abort();
            end = sp[i].off + sp[i].len;
        }
        free(sp);
        free(out2);
        free(out);
    } else if (!err.msg[0] || strchr(err.msg, '\n')) {
        abort(); /* every refusal says why, in one line */
    }
    char warning[256];
    hr_chat_template found = hr_chat_template_detect(field[0], warning, sizeof warning);
    if (found == HR_CHAT_UNKNOWN || strlen(warning) >= sizeof warning) abort();
    free(buf);
    return 0;
}

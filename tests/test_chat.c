/* test_chat.c: chat templates. Each family renders a multi-turn conversation with a system prompt
 * (and, where it matters, without one); the expected strings were written by hand from each family's
 * reference Jinja template (quoted in src/tokenizer/chat.c). Recognition is checked on the templates'
 * own Jinja text, names and aliases, the fallback and its warning, and templates read from a GGUF. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "harness.h"
#include "tokenizer/chat.h"

static const hr_chat_msg k_conv[] = {
    {.role = "system", .content = "You are a helpful assistant"},
    {.role = "user", .content = "Hello"},
    {.role = "assistant", .content = "Hi there"},
    {.role = "user", .content = "Who are you"},
    {.role = "assistant", .content = "   I am an assistant   "},
    {.role = "user", .content = "Another question"},
};
#define N_CONV (sizeof k_conv / sizeof k_conv[0])

static bool render_eq(hr_chat_template tpl, const hr_chat_msg *m, size_t n, bool gen, const char *bos, const char *eos,
                      const char *want) {
    char *out = NULL;
    hr_error err = {0};
    if (hr_chat_render(tpl, m, n, gen, bos, eos, &out, &err) != HR_OK) {
        fprintf(stderr, "%s: render failed: %s\n", hr_chat_template_name(tpl), err.msg);
        return false;
    }
    bool same = strcmp(out, want) == 0;
    if (!same) fprintf(stderr, "%s:\n got: [%s]\nwant: [%s]\n", hr_chat_template_name(tpl), out, want);
    free(out);
    return same;
}

static void test_render(void) {
    CHECK(render_eq(HR_CHAT_CHATML, k_conv, N_CONV, true, "<s>", "</s>",
                    "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
                    "<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n"
                    "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother "
                    "question<|im_end|>\n<|im_start|>assistant\n"));
    CHECK(render_eq(HR_CHAT_CHATML, k_conv + 1, 1, false, "", "", "<|im_start|>user\nHello<|im_end|>\n"));

    CHECK(render_eq(HR_CHAT_LLAMA2, k_conv, N_CONV, true, "<s>", "</s>",
                    "<s>[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST] Hi there </s>"
                    "<s>[INST] Who are you [/INST] I am an assistant </s><s>[INST] Another question [/INST]"));
    CHECK(render_eq(HR_CHAT_LLAMA2, k_conv + 1, 3, true, "<s>", "</s>",
                    "<s>[INST] Hello [/INST] Hi there </s><s>[INST] Who are you [/INST]"));

    CHECK(render_eq(HR_CHAT_LLAMA3, k_conv, N_CONV, true, "<|begin_of_text|>", "<|end_of_text|>",
                    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant"
                    "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>"
                    "assistant<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
                    "Who are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant"
                    "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n"));
    CHECK(render_eq(HR_CHAT_LLAMA3, k_conv + 1, 1, false, "<|begin_of_text|>", "",
                    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"));

    CHECK(render_eq(HR_CHAT_MISTRAL, k_conv, N_CONV, true, "<s>", "</s>",
                    "<s>[INST] You are a helpful assistant\n\nHello [/INST]Hi there</s>[INST] Who are you [/INST]"
                    "   I am an assistant   </s>[INST] Another question [/INST]"));
    CHECK(render_eq(HR_CHAT_MISTRAL_V1, k_conv, N_CONV, true, "<s>", "</s>",
                    "<s> [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you [/INST]"
                    "    I am an assistant   </s> [INST] Another question [/INST]"));
    CHECK(render_eq(HR_CHAT_MISTRAL, k_conv + 1, 1, true, "<s>", "</s>", "<s>[INST] Hello [/INST]"));

    CHECK(render_eq(HR_CHAT_PHI3, k_conv, N_CONV, true, "<s>", "<|endoftext|>",
                    "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi there"
                    "<|end|>\n<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   <|end|>\n<|user|>\n"
                    "Another question<|end|>\n<|assistant|>\n"));
    CHECK(render_eq(HR_CHAT_PHI3, k_conv + 1, 2, false, "<s>", "<|endoftext|>",
                    "<|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n<|endoftext|>"));

    CHECK(render_eq(HR_CHAT_GEMMA, k_conv, N_CONV, true, "<bos>", "<eos>",
                    "<bos><start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>"
                    "model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>"
                    "model\nI am an assistant<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n"
                    "<start_of_turn>model\n"));
    CHECK(render_eq(HR_CHAT_GEMMA, k_conv + 1, 1, false, "<bos>", "<eos>",
                    "<bos><start_of_turn>user\nHello<end_of_turn>\n"));

    CHECK(render_eq(HR_CHAT_ZEPHYR, k_conv, N_CONV, true, "<s>", "</s>",
                    "<|system|>\nYou are a helpful assistant</s>\n<|user|>\nHello</s>\n<|assistant|>\nHi there</s>\n"
                    "<|user|>\nWho are you</s>\n<|assistant|>\n   I am an assistant   </s>\n<|user|>\nAnother "
                    "question</s>\n<|assistant|>\n"));
    CHECK(render_eq(HR_CHAT_ZEPHYR, NULL, 0, true, "<s>", "</s>", "")); /* the prompt sits inside the loop */

    CHECK(render_eq(HR_CHAT_DEEPSEEK, k_conv, N_CONV, true, "<bos>", "<eos>",
                    "<bos>You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi there<eos>User: Who are you\n\n"
                    "Assistant:    I am an assistant   <eos>User: Another question\n\nAssistant:"));
    CHECK(render_eq(HR_CHAT_DEEPSEEK, k_conv + 1, 1, false, NULL, NULL, "User: Hello\n\n"));
}

static void test_errors(void) {
    char *out = NULL;
    hr_error err = {0};
    const hr_chat_msg two_users[] = {{.role = "user", .content = "a"}, {.role = "user", .content = "b"}};
    hr_chat_template strict[] = {HR_CHAT_LLAMA2, HR_CHAT_MISTRAL, HR_CHAT_MISTRAL_V1, HR_CHAT_GEMMA};
    for (size_t i = 0; i < sizeof strict / sizeof strict[0]; i++) {
        CHECK(hr_chat_render(strict[i], two_users, 2, true, "", "", &out, &err) == HR_ERR_INVALID_ARG);
        CHECKF(strstr(err.msg, "alternate") && strstr(err.msg, hr_chat_template_name(strict[i])), "%s", err.msg);
        CHECK(out == NULL);
    }
    CHECK(hr_chat_render(HR_CHAT_CHATML, two_users, 2, true, "", "", &out, &err) == HR_OK); /* chatml does not care */
    free(out);
    out = NULL;
    const hr_chat_msg tool[] = {{.role = "user", .content = "a"}, {.role = "tool", .content = "b"}};
    CHECK(hr_chat_render(HR_CHAT_MISTRAL, tool, 2, true, "", "", &out, &err) == HR_ERR_INVALID_ARG);
    CHECKF(strstr(err.msg, "'tool'") != NULL, "%s", err.msg);
    /* a refused role is quoted on one line, whatever it holds (fuzz/corpus/chat/regress-role-newline) */
    const hr_chat_msg nl_role[] = {{.role = "user", .content = "a"}, {.role = "sys\ntem\r", .content = "b"}};
    CHECK(hr_chat_render(HR_CHAT_MISTRAL, nl_role, 2, true, "", "", &out, &err) == HR_ERR_INVALID_ARG);
    CHECKF(!strchr(err.msg, '\n') && !strchr(err.msg, '\r') && strstr(err.msg, "sys?tem?"), "%s", err.msg);
    const hr_chat_msg null_content[] = {{.role = "user", .content = NULL}};
    CHECK(hr_chat_render(HR_CHAT_CHATML, null_content, 1, true, "", "", &out, &err) == HR_ERR_INVALID_ARG);
    CHECK(hr_chat_render((hr_chat_template)99, k_conv, 1, true, "", "", &out, &err) == HR_ERR_INVALID_ARG);
    CHECK(out == NULL);
}

/* Reference templates (the Jinja text as the models ship it). */
static const char k_jinja_chatml[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
static const char k_jinja_llama2[] =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif "
    "%}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if "
    "message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] "
    "== 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";
static const char k_jinja_llama3[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 "
    "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
static const char k_jinja_mistral[] =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles "
    "are supported!') }}{% endif %}{% endfor %}";
static const char k_jinja_mistral_v1[] =
    "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n    {%- set "
    "loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n\n{{- "
    "bos_token }}\n{%- for message in loop_messages %}\n    {%- if message['role'] == 'user' %}\n        {%- if "
    "loop.first and system_message is defined %}\n            {{- ' [INST] ' + system_message + '\\n\\n' + "
    "message['content'] + ' [/INST]' }}\n        {%- else %}\n            {{- ' [INST] ' + message['content'] + ' "
    "[/INST]' }}\n        {%- endif %}\n    {%- elif message['role'] == 'assistant' %}\n        {{- ' ' + "
    "message['content'] + eos_token}}\n    {%- endif %}\n{%- endfor %}\n";
static const char k_jinja_phi3[] =
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\\n' + message['content'] + "
    "'<|end|>\\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}{% elif "
    "message['role'] == 'assistant' %}{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}{% endfor "
    "%}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}";
static const char k_jinja_gemma[] =
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% "
    "endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "(message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif "
    "%}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if "
    "add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}";
static const char k_jinja_zephyr[] =
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\\n' + message['content'] + "
    "eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\\n' + message['content'] + eos_token "
    "}}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\\n'  + message['content'] + eos_token }}\n{% "
    "endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";
static const char k_jinja_deepseek[] =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}{{ bos_token "
    "}}{% for message in messages %}{% if message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\\n\\n' "
    "}}{% elif message['role'] == 'assistant' %}{{ 'Assistant: ' + message['content'] + eos_token }}{% elif "
    "message['role'] == 'system' %}{{ message['content'] + '\\n\\n' }}{% endif %}{% endfor %}{% if "
    "add_generation_prompt %}{{ 'Assistant:' }}{% endif %}";

static void test_detect(void) {
    const struct {
        const char *jinja;
        hr_chat_template want;
    } cases[] = {
        {k_jinja_chatml, HR_CHAT_CHATML},
        {k_jinja_llama2, HR_CHAT_LLAMA2},
        {k_jinja_llama3, HR_CHAT_LLAMA3},
        {k_jinja_mistral, HR_CHAT_MISTRAL},
        {k_jinja_mistral_v1, HR_CHAT_MISTRAL_V1},
        {k_jinja_phi3, HR_CHAT_PHI3},
        {k_jinja_gemma, HR_CHAT_GEMMA},
        {k_jinja_zephyr, HR_CHAT_ZEPHYR},
        {k_jinja_deepseek, HR_CHAT_DEEPSEEK},
        {"llama3", HR_CHAT_LLAMA3},
        {"gemma", HR_CHAT_GEMMA},
    };
    char warn[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        hr_chat_template got = hr_chat_template_detect(cases[i].jinja, warn, sizeof warn);
        CHECKF(got == cases[i].want, "case %zu: got %s, want %s", i, hr_chat_template_name(got),
               hr_chat_template_name(cases[i].want));
        CHECKF(warn[0] == '\0', "case %zu: unexpected warning %s", i, warn);
    }
    hr_chat_template got = hr_chat_template_detect("{{ messages | tojson }}\n{% raw %}", warn, sizeof warn);
    CHECK(got == HR_CHAT_FALLBACK && got == HR_CHAT_CHATML);
    CHECKF(strstr(warn, "not recognized") && strstr(warn, "chatml") && !strchr(warn, '\n'), "%s", warn);
    CHECK(hr_chat_template_detect(NULL, NULL, 0) == HR_CHAT_FALLBACK);

    CHECK(hr_chat_template_by_name("qwen") == HR_CHAT_CHATML && hr_chat_template_by_name("mixtral") == HR_CHAT_MISTRAL);
    CHECK(hr_chat_template_by_name("deepseek2") == HR_CHAT_DEEPSEEK);
    CHECK(hr_chat_template_by_name("vicuna") == HR_CHAT_UNKNOWN && hr_chat_template_by_name(NULL) == HR_CHAT_UNKNOWN);
    for (int t = HR_CHAT_CHATML; t <= HR_CHAT_DEEPSEEK; t++) { /* every family's name maps back to it */
        CHECK(hr_chat_template_by_name(hr_chat_template_name((hr_chat_template)t)) == (hr_chat_template)t);
        CHECK(strstr(hr_chat_template_names(), hr_chat_template_name((hr_chat_template)t)) != NULL);
    }
}

static void test_from_gguf(void) {
    for (int with = 0; with < 2; with++) {
        hr_gguf_writer *w = hr_gguf_writer_create(3);
        hr_gguf_writer_set_str(w, "general.architecture", "llama");
        if (with) hr_gguf_writer_set_str(w, "tokenizer.chat_template", k_jinja_llama3);
        void *data = NULL;
        size_t size = 0;
        hr_error err = {0};
        CHECKF(hr_gguf_writer_write_memory(w, &data, &size, &err) == HR_OK, "%s", err.msg);
        hr_gguf_writer_destroy(w);
        hr_gguf *g = NULL;
        CHECKF(hr_gguf_open_memory(data, size, &g, &err) == HR_OK, "%s", err.msg);
        char warn[512];
        hr_chat_template tpl = hr_chat_template_from_gguf(g, warn, sizeof warn);
        if (with) {
            CHECK(tpl == HR_CHAT_LLAMA3 && warn[0] == '\0');
        } else {
            CHECK(tpl == HR_CHAT_CHATML);
            CHECKF(strstr(warn, "no tokenizer.chat_template") != NULL, "%s", warn);
        }
        hr_gguf_close(g);
        free(data);
    }
}

/* hr_chat: the model's own template through the interpreter, and the family fallback. */

static hr_chat *make_chat(const char *tpl, const char *name, char *warn, size_t warn_len) {
    hr_chat *c = NULL;
    hr_error err = {0};
    hr_chat_params p = {.template_text = tpl, .name = name};
    CHECKF(hr_chat_create(&p, &c, warn, warn_len, &err) == HR_OK, "%s", err.msg);
    return c;
}

static char *apply(hr_chat *c, const hr_chat_render_params *p, hr_status *st, hr_error *err) {
    char *out = NULL;
    *st = hr_chat_apply(c, p, &out, err);
    return out;
}

static void test_model_template(void) {
    /* the real Llama 3.2 template with a tool call whose arguments come as a JSON string (as an
       OpenAI client sends them): the same bytes as the reference's render with arguments as an
       object (tests/jinja/expected/llama-3.2/tool_call_result.txt) */
    char *tpl = hr_test_slurp(HR_SOURCE_DIR "/tests/jinja/templates/llama-3.2.jinja", NULL);
    char *want = hr_test_slurp(HR_SOURCE_DIR "/tests/jinja/expected/llama-3.2/tool_call_result.txt", NULL);
    CHECK(tpl && want);
    if (!tpl || !want) return;
    char warn[1024];
    hr_chat *c = make_chat(tpl, NULL, warn, sizeof warn);
    CHECKF(c && warn[0] == '\0' && strcmp(hr_chat_describe(c), "the model's chat template") == 0, "%s", warn);
    const char *weather =
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Get the current weather in a "
        "city\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"description\":"
        "\"The "
        "city name, e.g. Paris\"},\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\",\"fahrenheit\"]}},\"required\":["
        "\"city\"]}}}]";
    const hr_chat_msg msgs[] = {
        {.role = "system", .content = "You are a concise assistant."},
        {.role = "user", .content = "Weather in Paris?"},
        {.role = "assistant",
         .content = "",
         .tool_calls_json = "[{\"id\":\"call12345\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                            "\"arguments\":\"{\\\"city\\\": \\\"Paris\\\", \\\"unit\\\": \\\"celsius\\\"}\"}}]"},
        {.role = "tool",
         .content = "{\"temperature\": 21, \"sky\": \"clear\"}",
         .tool_call_id = "call12345",
         .name = "get_weather"},
        {.role = "assistant", .content = "It is 21 degrees and clear in Paris."},
    };
    hr_chat_render_params p = {.msgs = msgs,
                               .n_msgs = 5,
                               .bos = "<|begin_of_text|>",
                               .eos = "<|eot_id|>",
                               .tools_json = weather,
                               .vars_json = "{\"date_string\": \"05 Dec 2026\"}"};
    hr_status st;
    hr_error err = {0};
    char *out = apply(c, &p, &st, &err);
    CHECKF(st == HR_OK && out && strcmp(out, want) == 0, "%s\n--- got\n%s\n--- want\n%s", err.msg, out ? out : "",
           want);
    free(out);
    /* the template's own refusal reaches the caller (no fallback): two tool calls at once */
    const hr_chat_msg two[] = {{.role = "user", .content = "x"},
                               {.role = "assistant",
                                .tool_calls_json = "[{\"function\":{\"name\":\"a\",\"arguments\":{}}},"
                                                   "{\"function\":{\"name\":\"b\",\"arguments\":{}}}]"}};
    p = (hr_chat_render_params){.msgs = two, .n_msgs = 2};
    out = apply(c, &p, &st, &err);
    CHECKF(!out && st == HR_ERR_INVALID_ARG && strstr(err.msg, "single tool-calls"), "%s", err.msg);
    p = (hr_chat_render_params){.msgs = msgs, .n_msgs = 2, .tools_json = "{\"not\": \"an array\"}"};
    out = apply(c, &p, &st, &err);
    CHECKF(!out && st == HR_ERR_INVALID_ARG && strstr(err.msg, "tools"), "%s", err.msg);
    CHECK(hr_chat_fallback_note(c)[0] == '\0');
    hr_chat_destroy(c);

    /* --chat-template NAME wins over the model's template */
    c = make_chat(tpl, "chatml", warn, sizeof warn);
    CHECK(c && strcmp(hr_chat_describe(c), "chatml") == 0);
    p = (hr_chat_render_params){.msgs = msgs + 1, .n_msgs = 1, .add_generation_prompt = true};
    out = apply(c, &p, &st, &err);
    CHECK(out && strcmp(out, "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n") == 0);
    free(out);
    hr_chat_destroy(c);
    CHECK(hr_chat_create(&(hr_chat_params){.name = "nope"}, &c, warn, sizeof warn, &err) == HR_ERR_INVALID_ARG &&
          strstr(err.msg, "known"));
    free(tpl);
    free(want);

    /* refused at load (a statement outside the subset): the family recognized from the text, the
       reason in the warning */
    c = make_chat("{% include 'x.jinja' %}<|start_header_id|><|end_header_id|>", NULL, warn, sizeof warn);
    CHECKF(c && strcmp(hr_chat_describe(c), "llama3") == 0 && strstr(warn, "refused") && strstr(warn, "include") &&
               strstr(warn, "llama3"),
           "%s", warn);
    hr_chat_destroy(c);
    /* a template that never ends is refused at load by the step limit, not run forever per request */
    c = make_chat("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}<|im_start|>", NULL,
                  warn, sizeof warn);
    CHECKF(c && strcmp(hr_chat_describe(c), "chatml") == 0 && strstr(warn, "step limit"), "%s", warn);
    hr_chat_destroy(c);
    /* refused at render time (an unsupported filter on the tools path only): this request gets the
       family's rendering, and the reason is kept once */
    c = make_chat("{% if tools %}{{ tools|wordwrap }}{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n"
                  "{{ m.content }}<|im_end|>\n{% endfor %}",
                  NULL, warn, sizeof warn);
    CHECKF(c && warn[0] == '\0' && strcmp(hr_chat_describe(c), "the model's chat template") == 0, "%s", warn);
    p = (hr_chat_render_params){.msgs = msgs + 1, .n_msgs = 1, .tools_json = "[]"};
    out = apply(c, &p, &st, &err);
    CHECK(st == HR_OK && out && strcmp(out, "<|im_start|>user\nWeather in Paris?<|im_end|>\n") == 0);
    free(out);
    CHECK(hr_chat_fallback_note(c)[0] == '\0'); /* [] is falsy: no fallback */
    p.tools_json = weather;
    out = apply(c, &p, &st, &err);
    CHECK(st == HR_OK && out && strcmp(out, "<|im_start|>user\nWeather in Paris?<|im_end|>\n") == 0);
    free(out);
    CHECKF(strstr(hr_chat_fallback_note(c), "wordwrap") && strstr(hr_chat_fallback_note(c), "chatml"), "%s",
           hr_chat_fallback_note(c));
    hr_chat_destroy(c);
    /* template variables add to the context but cannot replace messages, tools or the tokens */
    c = make_chat("{{ messages|length }}{{ enable_thinking }}{{ bos_token is defined }}{{ add_generation_prompt }}",
                  NULL, warn, sizeof warn);
    p = (hr_chat_render_params){.msgs = msgs + 1,
                                .n_msgs = 1,
                                .vars_json =
                                    "{\"messages\": [1, 2, 3], \"enable_thinking\": false, \"bos_token\": \"X\", "
                                    "\"add_generation_prompt\": true}"};
    out = apply(c, &p, &st, &err);
    CHECKF(out && !strcmp(out, "1FalseFalseFalse"), "%s", out ? out : err.msg);
    free(out);
    p.vars_json = "[1]";
    out = apply(c, &p, &st, &err);
    CHECK(!out && st == HR_ERR_INVALID_ARG && strstr(err.msg, "variables"));
    hr_chat_destroy(c);
    /* a tool_use template (as a GGUF's tokenizer.chat_template.tool_use) serves requests with tools */
    hr_chat_params tp = {.template_text = "plain:{{ messages[0].content }}",
                         .tool_use_text = "tools:{{ tools|length }}:{{ messages[0].content }}"};
    CHECK(hr_chat_create(&tp, &c, warn, sizeof warn, &err) == HR_OK && warn[0] == '\0');
    p = (hr_chat_render_params){.msgs = msgs + 1, .n_msgs = 1};
    out = apply(c, &p, &st, &err);
    CHECK(out && !strcmp(out, "plain:Weather in Paris?"));
    free(out);
    p.tools_json = weather;
    out = apply(c, &p, &st, &err);
    CHECK(out && !strcmp(out, "tools:1:Weather in Paris?"));
    free(out);
    hr_chat_destroy(c);
    /* the same read from a model file */
    hr_gguf_writer *w = hr_gguf_writer_create(3);
    hr_gguf_writer_set_str(w, "general.architecture", "llama");
    hr_gguf_writer_set_str(w, "tokenizer.chat_template", tp.template_text);
    hr_gguf_writer_set_str(w, "tokenizer.chat_template.tool_use", tp.tool_use_text);
    void *data = NULL;
    size_t size = 0;
    CHECK(hr_gguf_writer_write_memory(w, &data, &size, &err) == HR_OK);
    hr_gguf_writer_destroy(w);
    hr_gguf *g = NULL;
    CHECK(hr_gguf_open_memory(data, size, &g, &err) == HR_OK);
    CHECK(hr_chat_create_from_gguf(g, NULL, NULL, &c, warn, sizeof warn, &err) == HR_OK);
    out = apply(c, &p, &st, &err);
    CHECK(out && !strcmp(out, "tools:1:Weather in Paris?"));
    free(out);
    hr_chat_destroy(c);
    hr_gguf_close(g);
    free(data);
    /* no template at all: the fallback family and its warning, as before */
    c = make_chat(NULL, NULL, warn, sizeof warn);
    CHECK(c && strcmp(hr_chat_describe(c), "chatml") == 0 && strstr(warn, "no tokenizer.chat_template"));
    hr_chat_destroy(c);
}

/* Every real template of tests/jinja loads into the interpreter (none refused at load, no warning). */
static void test_real_templates_load(void) {
    static const char *const names[] = {"llama-3",      "llama-3.2",         "qwen3",  "gemma-3", "deepseek-v3",
                                        "mistral-nemo", "mistral-small-3.1", "phi-3.5"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[512], warn[1024];
        snprintf(path, sizeof path, HR_SOURCE_DIR "/tests/jinja/templates/%s.jinja", names[i]);
        char *tpl = hr_test_slurp(path, NULL);
        CHECKF(tpl != NULL, "%s", path);
        if (!tpl) continue;
        hr_chat *c = make_chat(tpl, NULL, warn, sizeof warn);
        CHECKF(c && warn[0] == '\0' && !strcmp(hr_chat_describe(c), "the model's chat template"), "%s: %s", names[i],
               warn);
        hr_chat_destroy(c);
        free(tpl);
    }
}

/* tokenizer_config.json: the template as a string or a named list, the tokens as strings or
 * AddedToken objects; the template read from it renders as the same text from a file does. */
static void test_config(void) {
    char *file = hr_test_slurp(HR_SOURCE_DIR "/tests/jinja/templates/gemma-3.jinja", NULL);
    CHECK(file != NULL);
    if (!file) return;
    json_t *cfg = json_object();
    json_object_set_new(cfg, "chat_template", json_string(file));
    json_object_set_new(cfg, "bos_token", json_string("<bos>"));
    json_t *eos = json_object();
    json_object_set_new(eos, "__type", json_string("AddedToken"));
    json_object_set_new(eos, "content", json_string("<end_of_turn>"));
    json_object_set_new(cfg, "eos_token", eos);
    char *text = json_dumps(cfg, 0);
    char *tpl = NULL, *bos = NULL, *eos_s = NULL;
    hr_error err = {0};
    CHECKF(hr_chat_template_from_config(text, NULL, &tpl, &bos, &eos_s, &err) == HR_OK, "%s", err.msg);
    CHECK(tpl && !strcmp(tpl, file) && bos && !strcmp(bos, "<bos>") && eos_s && !strcmp(eos_s, "<end_of_turn>"));
    free(tpl);
    free(bos);
    free(eos_s);
    free(text);
    /* a named list: default without tools, tool_use by name */
    json_t *list = json_array(), *d = json_object(), *tu = json_object();
    json_object_set_new(d, "name", json_string("default"));
    json_object_set_new(d, "template", json_string("D"));
    json_object_set_new(tu, "name", json_string("tool_use"));
    json_object_set_new(tu, "template", json_string("T"));
    json_array_append_new(list, d);
    json_array_append_new(list, tu);
    json_object_set_new(cfg, "chat_template", list);
    json_object_set_new(cfg, "bos_token", json_null());
    text = json_dumps(cfg, 0);
    CHECK(hr_chat_template_from_config(text, NULL, &tpl, &bos, NULL, &err) == HR_OK && !strcmp(tpl, "D") && !bos);
    free(tpl);
    CHECK(hr_chat_template_from_config(text, "tool_use", &tpl, NULL, NULL, &err) == HR_OK && !strcmp(tpl, "T"));
    free(tpl);
    CHECK(hr_chat_template_from_config(text, "rag", &tpl, NULL, NULL, &err) == HR_ERR_NOT_FOUND &&
          strstr(err.msg, "rag"));
    free(text);
    json_decref(cfg);
    CHECK(hr_chat_template_from_config("{\"model_max_length\": 8}", NULL, &tpl, NULL, NULL, &err) == HR_ERR_NOT_FOUND);
    CHECK(hr_chat_template_from_config("[1]", NULL, &tpl, NULL, NULL, &err) == HR_ERR_FORMAT);
    free(file);
}

int main(void) {
    test_render();
    test_errors();
    test_detect();
    test_from_gguf();
    test_model_template();
    test_config();
    test_real_templates_load();
    return hr_test_finish();
}

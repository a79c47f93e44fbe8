/* test_toolcall.c: tool calling's text formats (src/server/toolcall.c): reading `tools` /
 * `tool_choice` with every refusal, and for each format the round trip calls -> text -> calls, content
 * before a hermes call, texts that are not calls, what streaming holds back, and the call schema. */
#include <string.h>

#include "harness.h"
#include "server/toolcall.h"

static const char *k_tools =
    "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}},"
    " \"required\": [\"city\"]}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"add\", \"parameters\": {\"type\": \"object\"}}}]}";

static json_t *load(const char *s) { return json_loads(s, 0, NULL); }

static void test_read(void) {
    json_t *root = load(k_tools);
    hr_tools t;
    const char *param = NULL;
    char msg[256];
    CHECK(hr_tools_read(root, &t, &param, msg, sizeof msg) && t.n == 2 && !t.required && !t.none && t.parallel);
    json_object_set_new(root, "tool_choice",
                        json_pack("{s:s, s:{s:s}}", "type", "function", "function", "name", "add"));
    json_object_set_new(root, "parallel_tool_calls", json_false());
    CHECK(hr_tools_read(root, &t, &param, msg, sizeof msg) && t.required && t.forced && !strcmp(t.forced, "add") &&
          !t.parallel);
    json_object_set_new(root, "tool_choice", json_string("required"));
    CHECK(hr_tools_read(root, &t, &param, msg, sizeof msg) && t.required && !t.forced);
    json_object_set_new(root, "tool_choice", json_string("none"));
    CHECK(hr_tools_read(root, &t, &param, msg, sizeof msg) && t.none);
    json_decref(root);

    static const struct {
        const char *body, *param, *says;
    } bad[] = {
        {"{\"tools\": {}}", "tools", "array"},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {}}]}", "tools", "name"},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}]}", "tools", "name"},
        {"{\"tools\": [{\"type\": \"retrieval\"}]}", "tools", "function"},
        {"{\"tools\": [{\"function\": {\"name\": \"f\", \"parameters\": 3}}]}", "tools", "parameters"},
        {"{\"tools\": [{\"function\": {\"name\": \"f\"}}, {\"function\": {\"name\": \"f\"}}]}", "tools", "twice"},
        {"{\"tools\": [{\"function\": {\"name\": \"f\"}}], \"tool_choice\": {\"type\": \"function\", \"function\": "
         "{\"name\": \"g\"}}}",
         "tool_choice", "not in 'tools'"},
        {"{\"tools\": [{\"function\": {\"name\": \"f\"}}], \"tool_choice\": \"sometimes\"}", "tool_choice", "auto"},
        {"{\"tool_choice\": \"required\"}", "tool_choice", "empty"},
        {"{\"tools\": [{\"function\": {\"name\": \"f\"}}], \"parallel_tool_calls\": 1}", "parallel_tool_calls",
         "boolean"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        root = load(bad[i].body);
        param = NULL;
        msg[0] = 0;
        bool ok = hr_tools_read(root, &t, &param, msg, sizeof msg);
        CHECKF(!ok && param && !strcmp(param, bad[i].param) && strstr(msg, bad[i].says), "%s: %s %s", bad[i].body,
               param ? param : "-", msg);
        json_decref(root);
    }
}

static void test_round_trip(void) {
    json_t *root = load(k_tools);
    hr_tools t;
    const char *param;
    char msg[256];
    CHECK(hr_tools_read(root, &t, &param, msg, sizeof msg));
    json_t *calls = load("[{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\","
                         " \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}},"
                         " {\"id\": \"call_2\", \"type\": \"function\", \"function\": {\"name\": \"add\","
                         " \"arguments\": \"{\\\"a\\\": 1, \\\"b\\\": [2, {\\\"c\\\": \\\"}]\\\"}]}\"}}]");
    for (int f = HR_TOOLS_JSON; f <= HR_TOOLS_MISTRAL; f++) {
        char *text = hr_tools_call_text((hr_tool_format)f, calls);
        CHECKF(text != NULL, "%s: call text", hr_tool_format_name((hr_tool_format)f));
        if (!text) continue;
        hr_tool_call got[4];
        size_t content = 99;
        int n = hr_tools_extract((hr_tool_format)f, &t, text, strlen(text), &content, got, 4);
        CHECKF(n == 2 && content == 0, "%s: %d calls from %s", hr_tool_format_name((hr_tool_format)f), n, text);
        if (n == 2) {
            CHECK(!strcmp(got[0].name, "get_weather") && !strcmp(got[0].arguments, "{\"city\":\"Paris\"}"));
            CHECK(!strcmp(got[1].name, "add") && !strcmp(got[1].arguments, "{\"a\":1,\"b\":[2,{\"c\":\"}]\"}]}"));
        }
        hr_tools_free_calls(got, n);
        /* streaming holds back every byte of a call */
        CHECKF(hr_tools_stream_safe((hr_tool_format)f, text, strlen(text)) == 0, "%s: stream holds the call",
               hr_tool_format_name((hr_tool_format)f));
        /* cut short, it is not a call: all content */
        n = hr_tools_extract((hr_tool_format)f, &t, text, strlen(text) - 3, &content, got, 4);
        CHECKF(n == 0 && content == strlen(text) - 3, "%s: a truncated call is content",
               hr_tool_format_name((hr_tool_format)f));
        /* with tool_choice none nothing is parsed */
        t.none = true;
        CHECK(hr_tools_extract((hr_tool_format)f, &t, text, strlen(text), &content, got, 4) == 0);
        t.none = false;
        /* a cap below the calls found is no answer either (never a silent drop) */
        CHECK(hr_tools_extract((hr_tool_format)f, &t, text, strlen(text), &content, got, 1) == 0);
        free(text);
    }
    json_decref(calls);

    /* hermes: content before the calls; a name not in tools or text after the calls: no calls */
    const char *s = "Let me check.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2}}\n</tool_call>\n";
    hr_tool_call got[2];
    size_t content;
    int n = hr_tools_extract(HR_TOOLS_HERMES, &t, s, strlen(s), &content, got, 2);
    CHECK(n == 1 && content == strlen("Let me check.") && !strcmp(got[0].arguments, "{\"a\":2}"));
    hr_tools_free_calls(got, n);
    s = "<tool_call>{\"name\": \"sub\", \"arguments\": {}}</tool_call>";
    CHECK(hr_tools_extract(HR_TOOLS_HERMES, &t, s, strlen(s), &content, got, 2) == 0 && content == strlen(s));
    s = "<tool_call>{\"name\": \"add\", \"arguments\": {}}</tool_call> and more";
    CHECK(hr_tools_extract(HR_TOOLS_HERMES, &t, s, strlen(s), &content, got, 2) == 0);
    s = "{\"name\": \"add\", \"arguments\": {}}";
    CHECK(hr_tools_extract(HR_TOOLS_LLAMA3, &t, s, strlen(s), &content, got, 2) == 1 && content == 0);
    hr_tools_free_calls(got, 1);
    s = "{\"tool_calls\": [{\"name\": \"add\", \"arguments\": {}}], \"x\": 1}";
    CHECK(hr_tools_extract(HR_TOOLS_JSON, &t, s, strlen(s), &content, got, 2) == 0);
    s = "Plain words.";
    for (int f = HR_TOOLS_JSON; f <= HR_TOOLS_MISTRAL; f++) {
        CHECK(hr_tools_extract((hr_tool_format)f, &t, s, strlen(s), &content, got, 2) == 0 && content == strlen(s));
        CHECK(hr_tools_stream_safe((hr_tool_format)f, s, strlen(s)) == strlen(s));
    }
    /* hermes streaming: a tail that may become <tool_call> waits */
    CHECK(hr_tools_stream_safe(HR_TOOLS_HERMES, "abc <tool_c", 11) == 4);
    CHECK(hr_tools_stream_safe(HR_TOOLS_HERMES, "abc <", 5) == 4);
    CHECK(hr_tools_stream_safe(HR_TOOLS_HERMES, "a < b", 5) == 5);
    CHECK(hr_tools_stream_safe(HR_TOOLS_JSON, "  ", 2) == 0);

    /* the schema of a call: name fixed, arguments the tool's parameters */
    json_t *sch = hr_tools_call_schema(HR_TOOLS_LLAMA3, &t, 0);
    CHECK(!strcmp(
        json_string_value(json_object_get(json_object_get(json_object_get(sch, "properties"), "name"), "const")),
        "get_weather"));
    CHECK(json_object_get(json_object_get(json_object_get(sch, "properties"), "parameters"), "required") != NULL);
    CHECK(json_is_false(json_object_get(sch, "additionalProperties")));
    json_decref(sch);
    json_decref(root);

    /* prompts name every tool; ids are OpenAI's shape and stable */
    root = load(k_tools);
    CHECK(hr_tools_read(root, &t, &param, msg, sizeof msg));
    for (int f = HR_TOOLS_JSON; f <= HR_TOOLS_MISTRAL; f++) {
        char *p = hr_tools_prompt((hr_tool_format)f, &t);
        CHECK(p && strstr(p, "get_weather") && strstr(p, "\"add\""));
        free(p);
    }
    json_decref(root);
    char id1[32], id2[32], id3[32];
    hr_tools_call_id(7, 0, id1);
    hr_tools_call_id(7, 0, id2);
    hr_tools_call_id(7, 1, id3);
    CHECK(strlen(id1) == 29 && !strncmp(id1, "call_", 5) && !strcmp(id1, id2) && strcmp(id1, id3) != 0);
    char *r = hr_tools_result_text(HR_TOOLS_HERMES, "22 C", "call_1");
    CHECK(r && !strcmp(r, "<tool_response>\n22 C\n</tool_response>"));
    free(r);
}

int main(void) {
    test_read();
    test_round_trip();
    return hr_test_finish();
}

/* toolcall.h: OpenAI's tool calling on top of plain text generation (internal to the server).
 *
 * A request's `tools` are checked and rendered into the prompt in the model's own wire format; the
 * model's output is split back into content and `tool_calls`. The formats, by chat template family:
 *   hermes   (chatml / Qwen2.5 / Qwen3 / Hermes):  <tool_call>\n{"name": F, "arguments": {...}}\n</tool_call>
 *   llama3   (Llama-3.1/3.2/3.3 JSON tool calls):  {"name": F, "parameters": {...}}  (one per line or ';')
 *   mistral  ([TOOL_CALLS], a control token the text does not show):  [{"name": F, "arguments": {...}}, ...]
 *   json     (the generic fallback for the other families):  {"tool_calls": [{"name": F, "arguments": {...}}]}
 * Invariant: hr_tools_extract(f, text) recovers exactly the calls hr_tools_call_text(f, calls) wrote, and
 * hr_tools_call_schema(f, ...) describes exactly the texts hr_tools_extract accepts as calls. */
#ifndef HR_SERVER_TOOLCALL_H
#define HR_SERVER_TOOLCALL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef enum hr_tool_format {
    HR_TOOLS_JSON = 0,
    HR_TOOLS_HERMES = 1,
    HR_TOOLS_LLAMA3 = 2,
    HR_TOOLS_MISTRAL = 3,
} hr_tool_format;

/* The format for a chat template family name (hr_chat_template_name: "chatml" -> hermes, "llama3" ->
 * llama3, "mistral" -> mistral, anything else -> json). */
hr_tool_format hr_tool_format_for(const char *family);
const char *hr_tool_format_name(hr_tool_format f);

/* A request's tools, checked (borrowed from the request's JSON, valid while it lives). */
typedef struct hr_tools {
    json_t *list;       /* the `tools` array: each {"type":"function","function":{"name",...}}; NULL: none */
    int n;              /* tools in list */
    bool none;          /* tool_choice "none": the tools are shown but no call is parsed */
    bool required;      /* tool_choice "required" or a named function: the output must be calls */
    const char *forced; /* the named function (tool_choice {"type":"function","function":{"name":F}}) */
    bool parallel;      /* parallel_tool_calls (default true): more than one call allowed */
} hr_tools;

/* Reads `tools`, `tool_choice` and `parallel_tool_calls` from a request. A tool without a name (or with
 * one that is not [A-Za-z0-9_.-]{1,64}), two tools with one name, `parameters` that is not an object, a
 * tool_choice naming a tool not in `tools` or of an unknown shape: false with *param and msgbuf (the field
 * and a one-line reason). */
bool hr_tools_read(json_t *root, hr_tools *out, const char **param, char *msgbuf, size_t cap);

/* The text that tells the model about the tools, in format f, for the end of the system message
 * (malloc'd; NULL on no memory). */
char *hr_tools_prompt(hr_tool_format f, const hr_tools *t);

/* An assistant message's `tool_calls` (OpenAI's array: {"id","type","function":{"name","arguments"}}
 * with arguments a JSON string) as format f writes them (malloc'd; NULL when a call is malformed or
 * on no memory). */
char *hr_tools_call_text(hr_tool_format f, json_t *tool_calls);

/* A `tool` message's content as the model expects to read it (malloc'd). */
char *hr_tools_result_text(hr_tool_format f, const char *content, const char *tool_call_id);

/* One call the model made. */
typedef struct hr_tool_call {
    char *name;      /* malloc'd */
    char *arguments; /* malloc'd: the arguments object as compact JSON text */
} hr_tool_call;

/* Splits a finished output: *content_len bytes of content (the text before the first call), then the
 * calls (at most cap into calls; returns how many were found, 0 when the text holds none: then
 * *content_len is len). A call whose name is not one of t's tools, or whose JSON does not parse, is
 * not a call (the text stays content). Free the calls with hr_tools_free_calls. */
int hr_tools_extract(hr_tool_format f, const hr_tools *t, const char *text, size_t len, size_t *content_len,
                     hr_tool_call *calls, int cap);
void hr_tools_free_calls(hr_tool_call *calls, int n);

/* While streaming: how many bytes of text (the output so far) can go out as content now; the rest may
 * be the start of a call and is held until the output ends. */
size_t hr_tools_stream_safe(hr_tool_format f, const char *text, size_t len);

/* The JSON Schema of one call's object in format f ({"name": const, "arguments"/"parameters": the tool's
 * parameters}) for tool i, for constrained decoding (new reference). */
json_t *hr_tools_call_schema(hr_tool_format f, const hr_tools *t, int i);

/* A GBNF grammar (docs/CONSTRAIN.md) whose outputs are exactly the answers that are calls in format f
 * of t's tools (t->forced: that one only), each call's arguments following its tool's `parameters`
 * schema, more than one call only when t->parallel: what tool_choice "required" or a named function
 * constrains the output to (malloc'd; NULL with msg set when a tool's parameters are a schema the
 * constraint compiler refuses, or on no memory). */
char *hr_tools_grammar(hr_tool_format f, const hr_tools *t, char *msg, size_t cap);

/* OpenAI's id for call k of a response ("call_" + 24 characters from seed and k). */
void hr_tools_call_id(unsigned long long seed, int k, char out[32]);

#endif

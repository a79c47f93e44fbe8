/* openai_format.h: the request fields that constrain the output (docs/CONSTRAIN.md) into the runtime's
 * hr_rt_constraint: OpenAI's response_format ({"type":"json_object"}, {"type":"json_schema",
 * "json_schema":{"name","schema","strict"}}) and vLLM's guided_json, guided_regex, guided_grammar and
 * guided_choice. Only the shapes are checked here; compiling (and its 400s: a schema keyword that is
 * not supported, a bad regex, an undefined rule, a bound) happens at submit, through the runtime's
 * cache, as refusals about the output format (HR_PARAM_OUTPUT_FORMAT) that the server names by the
 * field the request used (g->rp.constraint.field). */
#ifndef HR_SERVER_OPENAI_FORMAT_H
#define HR_SERVER_OPENAI_FORMAT_H

#include <jansson.h>
#include <stdbool.h>

#include "server/server_internal.h"

/* Fills g->rp.constraint from root (borrowing strings from it; a schema object is serialized into a
 * string g owns). False with e set (400 naming the field) for a malformed shape or two constraints. */
bool hr_srv_parse_format(json_t *root, hr_srv_gen *g, hr_srv_error *e);

/* g keeps s (malloc'd) until hr_srv_gen_free; false (s freed) when out of memory. openai.c. */
bool hr_srv_keep_owned(hr_srv_gen *g, char *s);

#endif

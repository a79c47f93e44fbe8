/* openai_format.c: response_format and vLLM's guided_* fields -> hr_rt_constraint (see
 * openai_format.h). */
#include "server/openai_format.h"

#include <stdlib.h>
#include <string.h>

static const char *const k_fields[] = {"response_format", "guided_json", "guided_regex", "guided_grammar",
                                       "guided_choice"};

static const char *kind_of(const json_t *v) {
    return json_is_object(v)    ? "an object"
           : json_is_array(v)   ? "an array"
           : json_is_string(v)  ? "a string"
           : json_is_number(v)  ? "a number"
           : json_is_boolean(v) ? "a boolean"
                                : "null";
}

/* A schema given as an object, a boolean or (guided_json) a JSON string: as compact JSON text. */
static bool schema_text(json_t *v, const char *field, bool string_ok, hr_srv_gen *g, hr_srv_error *e) {
    hr_rt_constraint *c = &g->rp.constraint;
    if (string_ok && json_is_string(v)) {
        c->src = json_string_value(v);
        c->len = json_string_length(v);
        return true;
    }
    if (!json_is_object(v) && !json_is_boolean(v))
        return hr_srv_fail(e, 400, field, "invalid_type", "'%s' must be a JSON Schema (an object), got %s", field,
                           kind_of(v));
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!t || !hr_srv_keep_owned(g, t)) return hr_srv_fail(e, 500, NULL, "nomem", "out of memory");
    c->src = t;
    c->len = strlen(t);
    return true;
}

static bool response_format(json_t *rf, hr_srv_gen *g, hr_srv_error *e) {
    const char *f = "response_format";
    if (!json_is_object(rf))
        return hr_srv_fail(e, 400, f, "invalid_type", "'response_format' must be an object, got %s", kind_of(rf));
    json_t *type = json_object_get(rf, "type");
    if (!json_is_string(type)) return hr_srv_fail(e, 400, f, "invalid_type", "'response_format.type' must be a string");
    const char *t = json_string_value(type);
    if (!strcmp(t, "text")) return true;
    g->rp.constraint.field = f;
    if (!strcmp(t, "json_object")) {
        g->rp.constraint.kind = HR_RT_CONS_JSON;
        g->rp.constraint.src = "";
        return true;
    }
    if (strcmp(t, "json_schema"))
        return hr_srv_fail(e, 400, f, "invalid_value",
                           "'response_format.type' is '%s': expected 'text', 'json_object' or 'json_schema'", t);
    json_t *js = json_object_get(rf, "json_schema");
    if (!json_is_object(js))
        return hr_srv_fail(e, 400, f, "invalid_type", "'response_format.json_schema' must be an object");
    json_t *name = json_object_get(js, "name"), *strict = json_object_get(js, "strict");
    if (name && !json_is_string(name))
        return hr_srv_fail(e, 400, f, "invalid_type", "'response_format.json_schema.name' must be a string");
    if (strict && !json_is_boolean(strict) && !json_is_null(strict))
        return hr_srv_fail(e, 400, f, "invalid_type", "'response_format.json_schema.strict' must be a boolean");
    json_t *schema = json_object_get(js, "schema");
    if (!schema)
        return hr_srv_fail(e, 400, f, "missing_required_parameter", "'response_format.json_schema.schema' is required");
    g->rp.constraint.kind = HR_RT_CONS_JSON_SCHEMA;
    return schema_text(schema, f, false, g, e);
}

bool hr_srv_parse_format(json_t *root, hr_srv_gen *g, hr_srv_error *e) {
    const char *given = NULL;
    for (size_t i = 0; i < sizeof k_fields / sizeof k_fields[0]; i++) {
        json_t *v = json_object_get(root, k_fields[i]);
        if (!v || json_is_null(v)) continue;
        if (i == 0 && json_is_object(v) && json_is_string(json_object_get(v, "type")) &&
            !strcmp(json_string_value(json_object_get(v, "type")), "text"))
            continue; /* plain text constrains nothing */
        if (given)
            return hr_srv_fail(e, 400, k_fields[i], "invalid_value",
                               "'%s' and '%s' both constrain the output: give one", given, k_fields[i]);
        given = k_fields[i];
    }
    if (!given) return true;
    json_t *v = json_object_get(root, given);
    hr_rt_constraint *c = &g->rp.constraint;
    c->field = given;
    if (!strcmp(given, "response_format")) return response_format(v, g, e);
    if (!strcmp(given, "guided_json")) {
        c->kind = HR_RT_CONS_JSON_SCHEMA;
        return schema_text(v, given, true, g, e);
    }
    if (!strcmp(given, "guided_choice")) {
        if (!json_is_array(v) || json_array_size(v) == 0)
            return hr_srv_fail(e, 400, given, "invalid_type", "'guided_choice' must be a non-empty array of strings");
        for (size_t i = 0; i < json_array_size(v); i++)
            if (!json_is_string(json_array_get(v, i)))
                return hr_srv_fail(e, 400, given, "invalid_type", "'guided_choice[%zu]' must be a string", i);
        c->kind = HR_RT_CONS_CHOICE;
        char *t = json_dumps(v, JSON_COMPACT);
        if (!t || !hr_srv_keep_owned(g, t)) return hr_srv_fail(e, 500, NULL, "nomem", "out of memory");
        c->src = t;
        c->len = strlen(t);
        return true;
    }
    if (!json_is_string(v))
        return hr_srv_fail(e, 400, given, "invalid_type", "'%s' must be a string, got %s", given, kind_of(v));
    c->kind = !strcmp(given, "guided_regex") ? HR_RT_CONS_REGEX : HR_RT_CONS_GRAMMAR;
    c->src = json_string_value(v);
    c->len = json_string_length(v);
    return true;
}

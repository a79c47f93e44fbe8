/* test_constrain_engine.c: constrained decoding through the runtime and the engine, on a real SPM
 * vocabulary (the repo's stories260K-q8_0) and a synthetic byte-level BPE one (qwen2-tiny): many
 * seeds at temperature 1, constrained requests batched with unconstrained ones; every constrained
 * output ends "stop" and parses with jansson (JSON Schema cases; `ajv` validates the same shapes in
 * tests/server/constrain.test.mjs), matches its regex with PCRE2 (regex and GBNF cases), or is one of
 * the choices; greedy is deterministic; a bound max_tokens ends "length" with a valid prefix; a bad
 * source is refused at submit naming the field. Every schema's longest output (whitespace included)
 * fits max_tokens, so "stop" is the only right ending. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <string.h>

#include "harness.h"
#include "model/synth.h"
#include "runtime/runtime.h"
#include "tokenizer/tokenizer.h"

#define N_SEEDS 8

static const char *const k_schemas[] = {
    /* objects, bounded strings, integer range, pattern, enum items, date */
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":130},"
    "\"email\":{\"type\":\"string\",\"pattern\":\"^[a-z]{1,8}@[a-z]{1,8}\\\\.com$\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"enum\":[\"a\",\"b\",\"c\"]},\"minItems\":1,"
    "\"maxItems\":3},\"ok\":{\"type\":\"boolean\"},\"when\":{\"type\":\"string\",\"format\":\"date\"}},"
    "\"required\":[\"name\",\"age\",\"tags\",\"ok\"],\"additionalProperties\":false}",
    /* $ref to $defs, const, anyOf with null, uuid, date-time, numbers */
    "{\"$defs\":{\"pt\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\",\"minimum\":-50,"
    "\"maximum\":50},\"y\":{\"type\":\"number\"}},\"required\":[\"x\",\"y\"],\"additionalProperties\":false}},"
    "\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"shape\"},\"points\":{\"type\":\"array\",\"items\":{"
    "\"$ref\":\"#/$defs/pt\"},\"maxItems\":2},\"label\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":8},{"
    "\"type\":\"null\"}]},\"id\":{\"type\":\"string\",\"format\":\"uuid\"},\"at\":{\"type\":\"string\","
    "\"format\":\"date-time\"}},\"required\":[\"kind\",\"points\",\"label\",\"id\",\"at\"],"
    "\"additionalProperties\":false}",
    /* an array at the root */
    "{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":9},\"minItems\":2,\"maxItems\":5}",
    /* an enum of mixed values */
    "{\"enum\":[\"red\",\"green\",3,null,{\"a\":[1,2]}]}",
};

typedef struct kase {
    hr_rt_cons_kind kind;
    const char *src;
    const char *check_re; /* for regex / grammar: the anchored PCRE2 pattern the output must match */
} kase;

static const kase k_text_cases[] = {
    {HR_RT_CONS_REGEX, "[0-9]{3}-[a-z]{2,5}( (yes|no))?", "^[0-9]{3}-[a-z]{2,5}( (yes|no))?$"},
    {HR_RT_CONS_GRAMMAR,
     "root ::= item (\", \" item){1,3}\nitem ::= num | word\nnum ::= [1-9] [0-9]{0,2}\nword ::= /[a-z]{1,6}/\n",
     "^([1-9][0-9]{0,2}|[a-z]{1,6})(, ([1-9][0-9]{0,2}|[a-z]{1,6})){1,3}$"},
    {HR_RT_CONS_CHOICE, "[\"yes\",\"no\",\"maybe so\"]", "^(yes|no|maybe so)$"},
};

static bool re_full(const char *pattern, const char *s, size_t n) {
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &ec, &eo, NULL);
    if (!re) return false;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc >= 0;
}

static hr_rt_request *submit(hr_runtime *rt, hr_rt_cons_kind kind, const char *src, float temp, uint64_t seed,
                             int max_tokens) {
    hr_rt_request_params p = {.prompt = "Once upon a time", .max_tokens = max_tokens};
    p.sampling = hr_rt_sampling_default();
    p.sampling.temperature = temp;
    p.sampling.top_k = 0;
    p.sampling.top_p = 1.0f;
    p.sampling.min_p = 0.0f;
    p.sampling.seed = seed;
    p.constraint = (hr_rt_constraint){.kind = kind, .src = src, .len = src ? strlen(src) : 0, .field = "test"};
    hr_rt_request *r = NULL;
    hr_error err;
    if (hr_runtime_submit(rt, &p, &r, &err) != HR_OK) fprintf(stderr, "submit: %s\n", err.msg);
    return r;
}

static void run_model(hr_runtime *rt, const char *label) {
    hr_error err;
    /* schemas: N_SEEDS each, all in one batch with two unconstrained requests */
    int n_sch = (int)(sizeof k_schemas / sizeof k_schemas[0]);
    int n_txt = (int)(sizeof k_text_cases / sizeof k_text_cases[0]);
    int total = (n_sch + n_txt) * N_SEEDS + 2;
    hr_rt_request **req = calloc((size_t)total, sizeof *req);
    int k = 0;
    for (int s = 0; s < n_sch; s++)
        for (int i = 0; i < N_SEEDS; i++)
            req[k++] = submit(rt, HR_RT_CONS_JSON_SCHEMA, k_schemas[s], 1.0f, 100 + i, 1400);
    for (int s = 0; s < n_txt; s++)
        for (int i = 0; i < N_SEEDS; i++)
            req[k++] = submit(rt, k_text_cases[s].kind, k_text_cases[s].src, 1.0f, 200 + i, 200);
    req[k++] = submit(rt, HR_RT_CONS_NONE, NULL, 1.0f, 7, 40);
    req[k++] = submit(rt, HR_RT_CONS_NONE, NULL, 1.0f, 8, 40);
    CHECK(k == total);
    CHECK(hr_runtime_run_until_idle(rt, &err) == HR_OK);
    hr_runtime_pool pool;
    hr_runtime_get_pool(rt, &pool);
    CHECKF(pool.engine.peak_running >= 8, "%s: constrained and free requests ran batched (peak %d)", label,
           pool.engine.peak_running);
    k = 0;
    int parsed = 0, matched = 0;
    for (int s = 0; s < n_sch; s++) {
        for (int i = 0; i < N_SEEDS; i++, k++) {
            hr_rt_result res;
            if (!req[k]) continue;
            hr_rt_request_result(req[k], &res);
            CHECKF(!strcmp(res.finish_reason, "stop"), "%s schema %d seed %d: finish %s after %d tokens: %.*s", label,
                   s, i, res.finish_reason, res.n_ids, (int)res.text_len, res.text);
            json_error_t je;
            json_t *doc = json_loadb(res.text, res.text_len, JSON_DECODE_ANY, &je);
            CHECKF(doc != NULL, "%s schema %d seed %d: '%.*s' does not parse: %s", label, s, i, (int)res.text_len,
                   res.text, je.text);
            if (doc) parsed++;
            if (i == 0) printf("%s schema %d: %.*s\n", label, s, (int)res.text_len, res.text);
            if (doc && s == 0) { /* spot checks a parser cannot make: bounds and required keys */
                json_t *age = json_object_get(doc, "age");
                CHECK(json_is_integer(age) && json_integer_value(age) >= 0 && json_integer_value(age) <= 130);
                CHECK(json_is_string(json_object_get(doc, "name")) && json_is_boolean(json_object_get(doc, "ok")));
                json_t *tags = json_object_get(doc, "tags");
                CHECK(json_is_array(tags) && json_array_size(tags) >= 1 && json_array_size(tags) <= 3);
            }
            if (doc && s == 2) {
                CHECK(json_is_array(doc) && json_array_size(doc) >= 2 && json_array_size(doc) <= 5);
                for (size_t j = 0; j < json_array_size(doc); j++) {
                    json_t *x = json_array_get(doc, j);
                    CHECK(json_is_integer(x) && json_integer_value(x) >= 1 && json_integer_value(x) <= 9);
                }
            }
            json_decref(doc);
        }
    }
    for (int s = 0; s < n_txt; s++) {
        for (int i = 0; i < N_SEEDS; i++, k++) {
            hr_rt_result res;
            if (!req[k]) continue;
            hr_rt_request_result(req[k], &res);
            CHECKF(!strcmp(res.finish_reason, "stop"), "%s case %d seed %d: finish %s: %.*s", label, s, i,
                   res.finish_reason, (int)res.text_len, res.text);
            bool ok = re_full(k_text_cases[s].check_re, res.text, res.text_len);
            CHECKF(ok, "%s case %d seed %d: '%.*s' does not match", label, s, i, (int)res.text_len, res.text);
            matched += ok;
            if (i == 0) printf("%s case %d: %.*s\n", label, s, (int)res.text_len, res.text);
        }
    }
    for (; k < total; k++) {
        hr_rt_result res;
        hr_rt_request_result(req[k], &res);
        CHECK(res.state == HR_RT_COMPLETED && res.n_ids > 0);
    }
    printf("%s: %d JSON outputs parsed, %d text outputs matched\n", label, parsed, matched);
    for (int i = 0; i < total; i++) hr_rt_request_release(rt, req[i]);
    free(req);

    /* greedy: the same output twice, and it is valid */
    hr_rt_request *a = submit(rt, HR_RT_CONS_JSON_SCHEMA, k_schemas[0], 0.0f, 1, 1400);
    hr_rt_request *b = submit(rt, HR_RT_CONS_JSON_SCHEMA, k_schemas[0], 0.0f, 2, 1400);
    CHECK(hr_runtime_run_until_idle(rt, &err) == HR_OK);
    hr_rt_result ra, rb;
    hr_rt_request_result(a, &ra);
    hr_rt_request_result(b, &rb);
    CHECK(ra.text_len == rb.text_len && !memcmp(ra.text, rb.text, ra.text_len) && !strcmp(ra.finish_reason, "stop"));
    json_t *doc = json_loadb(ra.text, ra.text_len, 0, NULL);
    CHECK(doc != NULL);
    json_decref(doc);
    hr_rt_request_release(rt, a);
    hr_rt_request_release(rt, b);

    /* a grammar that cannot finish within max_tokens ends "length" with a valid prefix */
    a = submit(rt, HR_RT_CONS_REGEX, "(ab){40}", 1.0f, 3, 5);
    CHECK(hr_runtime_run_until_idle(rt, &err) == HR_OK);
    hr_rt_request_result(a, &ra);
    CHECK(!strcmp(ra.finish_reason, "length") && ra.n_ids == 5 && ra.text_len >= 5 &&
          re_full("^(ab)*a?$", ra.text, ra.text_len));
    hr_rt_request_release(rt, a);

    /* refusals at submit, about the output format (the code; the front end names its field) */
    hr_rt_request_params p = {.prompt = "Hi", .max_tokens = 4, .sampling = hr_rt_sampling_default()};
    p.constraint = (hr_rt_constraint){.kind = HR_RT_CONS_JSON_SCHEMA,
                                      .src = "{\"type\":\"object\",\"patternProperties\":{}}",
                                      .field = "guided_json"};
    p.constraint.len = strlen(p.constraint.src);
    hr_rt_request *r = NULL;
    CHECK(hr_runtime_submit(rt, &p, &r, &err) == HR_ERR_INVALID_ARG && r == NULL &&
          !strncmp(err.msg, "output format: ", 15) && strstr(err.msg, "'patternProperties'") &&
          err.param == HR_PARAM_OUTPUT_FORMAT && !strstr(err.msg, "guided_json"));
    p.constraint = (hr_rt_constraint){.kind = HR_RT_CONS_REGEX, .src = "a{99999}", .len = 8, .field = "guided_regex"};
    CHECK(hr_runtime_submit(rt, &p, &r, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "bound on repetitions") &&
          err.param == HR_PARAM_OUTPUT_FORMAT);
}

static hr_runtime *open_rt(const char *path, const hr_model *m) {
    hr_runtime_params p = hr_runtime_default_params();
    p.model_path = path;
    p.model = m;
    p.n_ctx = 2048; /* past the tiny models' trained context: room for the longest outputs */
    p.ctx_extend = true;
    p.kv_seqs = 4;
    p.n_threads = 1;
    p.max_running = 64;
    hr_runtime *rt = NULL;
    hr_error err;
    if (hr_runtime_open(&p, &rt, NULL, &err) != HR_OK) {
        fprintf(stderr, "open: %s\n", err.msg);
        return NULL;
    }
    return rt;
}

int main(void) {
    hr_runtime *rt = open_rt(HR_SOURCE_DIR "/models/stories260K-q8_0.gguf", NULL);
    CHECK(rt != NULL);
    if (rt) {
        CHECK(!strcmp(hr_tokenizer_kind_name(hr_runtime_tokenizer(rt)), "spm"));
        run_model(rt, "stories260K (spm)");
        hr_runtime_close(rt);
    }
    hr_synth_shape shape;
    hr_error err;
    hr_model *m = NULL;
    void *mem = NULL;
    CHECK(hr_synth_shape_by_name("qwen2-tiny", &shape, &err) == HR_OK);
    CHECK(hr_synth_model(&shape, HR_DTYPE_F32, 5, &m, &mem, &err) == HR_OK);
    rt = m ? open_rt("qwen2-tiny", m) : NULL;
    CHECK(rt != NULL);
    if (rt) {
        CHECK(!strcmp(hr_tokenizer_kind_name(hr_runtime_tokenizer(rt)), "bpe"));
        run_model(rt, "qwen2-tiny (bpe)");
        hr_runtime_close(rt);
    }
    hr_model_destroy(m);
    free(mem);
    return hr_test_finish();
}

/* test_jinja.c: the Jinja interpreter (src/tokenizer/jinja.h).
 *
 * Conformance: every template in tests/jinja/templates (the real chat_template of each model, see
 * templates.json) over every conversation in tests/jinja/conversations.json must print exactly the
 * bytes the reference renderer printed (tests/jinja/expected/T/C.txt, written by gen_expected.mjs
 * with @huggingface/jinja and cross-checked against Python's Jinja2 by check_python.py), or fail
 * where the reference raised (T/C.error), unless Jinja2 rendered it (T/C.jinja2.txt wins then).
 * snippets.txt adds small templates with Python's Jinja2 as their reference.
 * Then hand-written cases pin the semantics the templates rely on (whitespace control, scoping,
 * Python formatting of values, filters, tests, methods), the refusals (unsupported statements and
 * filters, syntax errors) and the limits (steps, output, memory, depth), each a clean error. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "tokenizer/jinja.h"

#define JINJA_DIR HR_SOURCE_DIR "/tests/jinja"

/* Renders src with context json; returns the output (malloc'd) or NULL with *st set. */
static char *render(const char *src, const char *json, hr_status *st_out, hr_error *err) {
    hr_jinja *t = NULL;
    hr_error e0 = {0};
    if (!err) err = &e0;
    hr_status st = hr_jinja_parse(src, strlen(src), NULL, &t, err);
    char *out = NULL;
    if (st == HR_OK) {
        hr_jinja_limits lim = {.now_unix = 1796472000};
        st = hr_jinja_render(t, json, &lim, &out, NULL, err);
    }
    hr_jinja_destroy(t);
    if (st_out) *st_out = st;
    return out;
}

/* src renders to want with context json. */
static void expect(const char *src, const char *json, const char *want, int line) {
    hr_status st;
    hr_error err = {0};
    char *got = render(src, json, &st, &err);
    CHECKF(got && strcmp(got, want) == 0, "line %d: %s\n  want [%s]\n  got  [%s] (%s)", line, src, want,
           got ? got : "(error)", got ? "" : err.msg);
    free(got);
}
#define EXPECT(src, json, want) expect(src, json, want, __LINE__)

/* src fails with code (and its message contains what, when not NULL). */
static void expect_fail(const char *src, const char *json, hr_status code, const char *what, int line) {
    hr_status st = HR_OK;
    hr_error err = {0};
    char *got = render(src, json, &st, &err);
    CHECKF(!got && st == code && (!what || strstr(err.msg, what)) && !strchr(err.msg, '\n'),
           "line %d: %s: want %s containing '%s', got status %s '%s' output [%s]", line, src, hr_status_name(code),
           what ? what : "", hr_status_name(st), err.msg, got ? got : "");
    free(got);
}
#define EXPECT_FAIL(src, json, code, what) expect_fail(src, json, code, what, __LINE__)

static void test_conformance(void) {
    json_error_t jerr;
    json_t *tpls = json_load_file(JINJA_DIR "/templates.json", 0, &jerr);
    json_t *cases = json_load_file(JINJA_DIR "/conversations.json", 0, &jerr);
    CHECK(tpls && cases);
    if (!tpls || !cases) return;
    json_int_t now = json_integer_value(json_object_get(cases, "now_unix"));
    const char *tname;
    json_t *meta;
    int n_same = 0, n_refused = 0, n_pairs = 0;
    json_object_foreach(tpls, tname, meta) {
        char path[512];
        snprintf(path, sizeof path, JINJA_DIR "/templates/%s.jinja", tname);
        size_t n = 0;
        char *src = hr_test_slurp(path, &n);
        CHECKF(src != NULL, "%s", path);
        if (!src) continue;
        hr_jinja *t = NULL;
        hr_error err = {0};
        hr_status st = hr_jinja_parse(src, n, NULL, &t, &err);
        CHECKF(st == HR_OK, "%s: %s", tname, err.msg);
        size_t i;
        json_t *conv;
        json_array_foreach(json_object_get(cases, "conversations"), i, conv) {
            const char *cid = json_string_value(json_object_get(conv, "id"));
            json_t *ctxj = json_deep_copy(json_object_get(conv, "context"));
            json_t *bos = json_object_get(meta, "bos_token"), *eos = json_object_get(meta, "eos_token");
            if (bos) json_object_set(ctxj, "bos_token", bos);
            if (eos) json_object_set(ctxj, "eos_token", eos);
            char *ctx = json_dumps(ctxj, JSON_COMPACT);
            char *want = NULL;
            size_t want_n = 0;
            const char *exts[] = {"jinja2.txt", "txt"};
            for (int k = 0; k < 2 && !want; k++) {
                snprintf(path, sizeof path, JINJA_DIR "/expected/%s/%s.%s", tname, cid, exts[k]);
                want = hr_test_slurp(path, &want_n);
            }
            char *got = NULL;
            size_t got_n = 0;
            hr_jinja_limits lim = {.now_unix = now};
            hr_error rerr = {0};
            hr_status rst = t ? hr_jinja_render(t, ctx, &lim, &got, &got_n, &rerr) : HR_ERR_FORMAT;
            n_pairs++;
            if (want) {
                bool same = rst == HR_OK && got_n == want_n && memcmp(got, want, want_n) == 0;
                CHECKF(same, "%s / %s: differs from the reference (%s)\n--- want\n%s\n--- got\n%s", tname, cid,
                       rst == HR_OK ? "output" : rerr.msg, want, got ? got : "");
                n_same += same;
            } else {
                /* the reference raised: so must we, as a template error (not a limit or a refusal) */
                CHECKF(rst == HR_ERR_INVALID_ARG, "%s / %s: the reference raised, we gave %s '%s'", tname, cid,
                       hr_status_name(rst), rerr.msg);
                n_refused += rst == HR_ERR_INVALID_ARG;
            }
            free(got);
            free(want);
            free(ctx);
            json_decref(ctxj);
        }
        hr_jinja_destroy(t);
        free(src);
    }
    printf("conformance: %d pairs, %d byte-identical, %d raised as the reference did\n", n_pairs, n_same, n_refused);
    CHECK(n_pairs >= 100);
    json_decref(tpls);
    json_decref(cases);
}

/* tests/jinja/snippets.txt: small templates whose reference is Python's Jinja2 (check_python.py
 * --write), over snippets_context.json: scoping per loop turn, number/container/tuple printing,
 * Unicode case, whitespace control, errors. */
static void test_snippets(void) {
    char *all = hr_test_slurp(JINJA_DIR "/snippets.txt", NULL);
    char *ctx = hr_test_slurp(JINJA_DIR "/snippets_context.json", NULL);
    CHECK(all && ctx);
    if (!all || !ctx) return;
    int k = 0, n_same = 0;
    for (char *p = all; p && *p; k++) {
        char *sep = strstr(p, "\n=====\n");
        if (sep) *sep = '\0';
        char path[512], *want;
        snprintf(path, sizeof path, JINJA_DIR "/expected/snippets/%02d.txt", k);
        want = hr_test_slurp(path, NULL);
        hr_status st;
        hr_error err = {0};
        char *got = render(p, ctx, &st, &err);
        if (want) {
            CHECKF(got && !strcmp(got, want), "snippet %d: %s\n  want [%s]\n  got  [%s] %s", k, p, want, got ? got : "",
                   err.msg);
            n_same += got && !strcmp(got, want);
        } else {
            CHECKF(!got && st == HR_ERR_INVALID_ARG, "snippet %d: Jinja2 raised, we gave %s [%s]", k,
                   hr_status_name(st), got ? got : "");
            n_same += !got && st == HR_ERR_INVALID_ARG;
        }
        free(got);
        free(want);
        p = sep ? sep + 7 : NULL;
    }
    printf("snippets: %d of %d as Jinja2\n", n_same, k);
    CHECK(k >= 30);
    free(all);
    free(ctx);
}

static void test_whitespace(void) {
    /* trim_blocks: the newline after a block tag goes; lstrip_blocks: indentation before one goes */
    EXPECT("{% if true %}\n  yes\n{% endif %}\n", "{}", "  yes\n");
    EXPECT("a\n    {% if true %}\nb\n    {% endif %}\nc", "{}", "a\nb\nc");
    EXPECT("a  {%- if true -%}  b  {%- endif -%}  c", "{}", "abc");
    EXPECT("x {{ 1 }} y", "{}", "x 1 y");
    EXPECT("x\n  {{ 1 }}\n", "{}", "x\n  1"); /* variables are not lstripped; one trailing newline dropped */
    EXPECT("a {{- 1 -}} b", "{}", "a1b");
    EXPECT("  {%+ if true %}x{% endif %}", "{}", "  x");
    EXPECT("{# comment #}\nA{#- c -#}  B", "{}", "AB");
    EXPECT("{% raw %}{{ x }}{% endraw %}", "{}", "{{ x }}");
    EXPECT("a\n\n", "{}", "a\n");
}

static void test_values(void) {
    EXPECT("{{ none }}|{{ true }}|{{ 3 }}|{{ 1.5 }}|{{ 2.0 }}|{{ 1e-5 }}|{{ 1e16 }}", "{}",
           "None|True|3|1.5|2.0|1e-05|1e+16");
    EXPECT("{{ [1, 'a', none, true] }}", "{}", "[1, 'a', None, True]");
    EXPECT("{{ {'k': \"it's\"} }}", "{}", "{'k': \"it's\"}");
    EXPECT("{{ x.a }}{{ x['b'] }}{{ x.c }}", "{\"x\": {\"a\": 1, \"b\": \"two\"}}", "1two");
    EXPECT("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 'ab' * 3 }}", "{}",
           "3 -4 2 3.5 1024 ababab");
    EXPECT("{{ 'a' ~ 1 ~ none }}", "{}", "a1None");
    EXPECT("{{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ 'b' in 'abc' }} {{ 2 not in [1] }} {{ 'k' in {'k': 1} }}", "{}",
           "True True True True True");
    EXPECT("{{ 'x' if false }}|{{ 'y' if 0 else 'z' }}|{{ 0 or 'd' }}|{{ 1 and 2 }}", "{}", "|z|d|2");
    EXPECT("{{ 'héllo'[1] }}{{ 'héllo'[::-1] }}{{ 'héllo'[1:3] }}{{ [1,2,3][-1] }}{{ [1,2,3][:-1] }}", "{}",
           "éolléhél3[1, 2]");
    EXPECT("{{ x is defined }}{{ y is none }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is iterable }}"
           "{{ 3 is divisibleby 3 }}{{ 2 is even }}{{ 1 is number }}",
           "{\"y\": null}", "FalseTrueTrueTrueTrueTrueTrueTrue");
    EXPECT("{{ not x is defined }}", "{}", "True");
    EXPECT("{{ messages|length - 1 }}", "{\"messages\": [1, 2, 3]}", "2");
    EXPECT("{{ [] + [1] }}{{ [] + [] }}{{ {}|list }}", "{}", "[1][][]");
}

static void test_statements(void) {
    EXPECT("{% for x in [1,2,3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}"
           "{{ loop.length }}{{ loop.revindex }},{% endfor %}",
           "{}", "10TrueFalse33,21FalseFalse32,32FalseTrue31,");
    EXPECT("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", "{\"d\": {\"b\": 1, \"a\": 2}}", "b=1;a=2;");
    EXPECT("{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}", "{}", "2242");
    EXPECT("{% for x in [] %}x{% else %}empty{% endfor %}", "{}", "empty");
    EXPECT("{% for x in [1,2,3] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}"
           "{% endfor %}",
           "{}", "1");
    /* set inside a loop does not leak out; a namespace carries state across turns */
    EXPECT("{% set y = 0 %}{% for x in [1,2] %}{% set y = x %}{% endfor %}{{ y }}", "{}", "0");
    EXPECT("{% set ns = namespace(total=0) %}{% for x in [1,2,3] %}{% set ns.total = ns.total + x %}{% endfor %}"
           "{{ ns.total }}",
           "{}", "6");
    EXPECT("{% set a, b = 1, 2 %}{{ a }}{{ b }}", "{}", "12");
    EXPECT("{% set s %}  body {{ 1 }} {% endset %}[{{ s }}]{% set t | trim %}  x  {% endset %}[{{ t }}]", "{}",
           "[  body 1 ][x]");
    EXPECT("{% if 0 %}a{% elif 1 %}b{% else %}c{% endif %}", "{}", "b");
    EXPECT(
        "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }}"
        " {{ greet(name='C', punct='.') }}",
        "{}", "Hi A! Hi B? Hi C.");
    EXPECT("{% macro box() %}[{{ caller() }}]{% endmacro %}{% call box() %}inside{% endcall %}", "{}", "[inside]");
    EXPECT("{% filter upper %}shout {{ 'it' }}{% endfilter %}", "{}", "SHOUT IT");
    EXPECT("{% generation %}kept{% endgeneration %}", "{}", "kept");
}

static void test_filters_methods(void) {
    EXPECT(
        "{{ '  a b \\n'|trim }}|{{ 'Ab'|upper }}|{{ 'Ab'|lower }}|{{ 'hello world'|title }}|{{ 'hELLO'|capitalize }}",
        "{}", "a b|AB|ab|Hello World|Hello");
    EXPECT("{{ [1,2]|join(', ') }}|{{ x|default('d') }}|{{ ''|default('e', true) }}|{{ [3,4]|first }}{{ [3,4]|last }}",
           "{}", "1, 2|d|e|34");
    EXPECT("{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='c')|join }}",
           "{\"msgs\": [{\"role\": \"user\", \"c\": \"a\"}, {\"role\": \"bot\", \"c\": \"b\"}, {\"role\": \"user\", "
           "\"c\": \"c\"}]}",
           "ac");
    EXPECT("{{ msgs|rejectattr('x')|list|length }}", "{\"msgs\": [{\"x\": 1}, {\"x\": 0}, {}]}", "2");
    EXPECT("{{ d|items|list }}", "{\"d\": {\"a\": 1}}", "[('a', 1)]"); /* pairs are tuples */
    EXPECT("{{ v|tojson }}", "{\"v\": {\"a\": [1, 2.5, \"é\\n\\\"\"], \"b\": null, \"c\": true}}",
           "{\"a\": [1, 2.5, \"é\\n\\\"\"], \"b\": null, \"c\": true}");
    EXPECT("{{ v|tojson(indent=2) }}", "{\"v\": {\"a\": [1], \"b\": {}}}",
           "{\n  \"a\": [\n    1\n  ],\n  \"b\": {}\n}");
    EXPECT("{{ 'a,b,,c'.split(',') }}{{ '  x  y '.split() }}{{ 'a-b-c'.split('-', 1) }}", "{}",
           "['a', 'b', '', 'c']['x', 'y']['a', 'b-c']");
    EXPECT("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}{{ '\\nx\\n'.strip('\\n') }}{{ "
           "'xxa'.lstrip('x') }}"
           "{{ 'a  '.rstrip() }}|{{ 'a-b'.replace('-', '+') }}{{ 'abcb'.find('b') }}{{ ', '.join(['p', 'q']) }}",
           "{}", "TrueTruexaa|a+b1p, q");
    EXPECT("{{ d.get('a') }}{{ d.get('z', 'no') }}{{ d.keys()|list }}{{ d.values()|list }}", "{\"d\": {\"a\": 1}}",
           "1no['a'][1]");
    EXPECT("{{ range(3)|list }}{{ range(1, 7, 2)|list }}", "{}", "[0, 1, 2][1, 3, 5]");
    EXPECT("{{ 'x\\ny'|indent(2) }}|{{ 'x\\ny'|indent(2, true) }}", "{}", "x\n  y|  x\n  y");
    EXPECT("{{ strftime_now('%Y-%m-%d') }}", "{}", "2026-12-05");
}

static void test_refusals(void) {
    EXPECT_FAIL("{% include 'x' %}", "{}", HR_ERR_UNSUPPORTED, "include");
    EXPECT_FAIL("{{ x|wordwrap }}", "{\"x\": 1}", HR_ERR_UNSUPPORTED, "wordwrap");
    EXPECT_FAIL("{{ x is fancy }}", "{}", HR_ERR_UNSUPPORTED, "fancy");
    EXPECT_FAIL("{{ undefined_fn() }}", "{}", HR_ERR_UNSUPPORTED, "undefined_fn");
    EXPECT_FAIL("{% if x %}", "{}", HR_ERR_FORMAT, "endif");
    EXPECT_FAIL("{{ 1 + }}", "{}", HR_ERR_FORMAT, "line 1");
    EXPECT_FAIL("a\n{% endfor %}", "{}", HR_ERR_FORMAT, "line 2");
    EXPECT_FAIL("{{ 'x' + 1 }}", "{}", HR_ERR_INVALID_ARG, "operand");
    EXPECT_FAIL("{{ missing.attr }}", "{}", HR_ERR_INVALID_ARG, "missing");
    EXPECT_FAIL("{{ raise_exception('roles must alternate') }}", "{}", HR_ERR_INVALID_ARG, "roles must alternate");
    EXPECT_FAIL("{{ 1 }}", "[1]", HR_ERR_FORMAT, "JSON object");
    EXPECT_FAIL("{{ 1 }}", "{\"a\": ", HR_ERR_FORMAT, "JSON object");
}

static void test_limits(void) {
    /* an endless amount of work stops at the step limit, an exploding string at the output or memory
       limit, deep nesting at the depth limit: each a clean HR_ERR_RANGE, never a stall or a crash */
    EXPECT_FAIL("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}", "{}",
                HR_ERR_RANGE, "step limit");
    EXPECT_FAIL("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
                "{% endfor %}{{ ns.s|length }}",
                "{}", HR_ERR_RANGE, NULL);
    EXPECT_FAIL("{{ 'x' * 100000000 }}", "{}", HR_ERR_RANGE, "limit");
    EXPECT_FAIL("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "{}", HR_ERR_RANGE, "limit");
    /* work that allocates nothing is charged too: long comparisons and searches, deep values */
    EXPECT_FAIL("{% set l = range(100000)|list %}{% set m = range(100000)|list %}{% for i in range(100000) %}"
                "{{ l == m }}{% endfor %}",
                "{}", HR_ERR_RANGE, "step limit");
    EXPECT_FAIL("{% set s = 'a' * 1000000 %}{% set n = 'a' * 1000 ~ 'b' %}{% for i in range(100000) %}{{ n in s }}"
                "{% endfor %}",
                "{}", HR_ERR_RANGE, "step limit");
    EXPECT_FAIL("{% set ns = namespace(l=[]) %}{% for i in range(300) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}",
                "{}", HR_ERR_RANGE, "nested");
    EXPECT_FAIL("{% set ns = namespace(l=[], m=[]) %}{% for i in range(300) %}{% set ns.l = [ns.l] %}"
                "{% set ns.m = [ns.m] %}{% endfor %}{{ ns.l == ns.m }}",
                "{}", HR_ERR_RANGE, "nested");
    /* a list is equal to itself without a walk, as in Python (its == finds identical items equal) */
    EXPECT("{% set ns = namespace(l=[]) %}{% for i in range(300) %}{% set ns.l = [ns.l] %}{% endfor %}"
           "{{ ns.l == ns.l }}",
           "{}", "True");
    /* a JSON object with a repeated key answers with the last value, as Python's json.loads */
    EXPECT("{{ d.k }}", "{\"d\": {\"k\": 1, \"k\": 2}}", "2");
    char deep[2200];
    size_t k = 0;
    k += (size_t)snprintf(deep + k, sizeof deep - k, "{{ ");
    for (int i = 0; i < 500; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 500; i++) deep[k++] = ')';
    snprintf(deep + k, sizeof deep - k, " }}");
    EXPECT_FAIL(deep, "{}", HR_ERR_RANGE, "nested");

    hr_jinja *t = NULL;
    const char *src = "{% for i in range(100) %}0123456789{% endfor %}";
    CHECK(hr_jinja_parse(src, strlen(src), NULL, &t, NULL) == HR_OK);
    char *out = NULL;
    hr_error err = {0};
    hr_jinja_limits small = {.max_output_bytes = 999};
    CHECK(hr_jinja_render(t, "{}", &small, &out, NULL, &err) == HR_ERR_RANGE && !out && strstr(err.msg, "output"));
    hr_jinja_limits enough = {.max_output_bytes = 1000};
    size_t n = 0;
    CHECK(hr_jinja_render(t, "{}", &enough, &out, &n, &err) == HR_OK && n == 1000);
    free(out);
    hr_jinja_limits few = {.max_steps = 50};
    CHECK(hr_jinja_render(t, "{}", &few, &out, NULL, &err) == HR_ERR_RANGE && strstr(err.msg, "step"));
    hr_jinja_destroy(t);
}

/* Hostile templates at the default limits (what the server renders with): each must stop with
 * HR_ERR_RANGE, a limit named in one line, and quickly. The wall-clock bound is generous (300 s for
 * all, where a release build takes about 3 s and the ASan build about 20 s) so that only a stall
 * (the 2^40-leaf walks these once made took hours), never a busy machine or a sanitizer, fails it. */
static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void test_hostile(void) {
    static const char *const k_hostile[] = {
        /* endless loops: nested ranges, three deep with output, exponential macro fan-out */
        "{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}",
        "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}{{ c }}{% endfor %}"
        "{% endfor %}{% endfor %}",
        "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}",
        "{% macro m() %}{{ caller() }}{{ caller() }}{% endmacro %}{% macro r(n) %}{% if n %}{% call m() %}"
        "{{ r(n - 1) }}{% endcall %}{% endif %}x{% endmacro %}{{ r(60) }}",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        /* exponential growth of strings and lists */
        "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor "
        "%}",
        "{% set ns = namespace(s='x') %}{% for i in range(200) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        "{% set ns = namespace(s='x') %}{% for i in range(200) %}{% set ns.s = ns.s * 2 %}{% endfor %}",
        "{% set ns = namespace(s='xy') %}{% for i in range(60) %}{% set ns.s = ns.s.replace('y', ns.s) %}{% endfor %}",
        "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = (ns.s|indent(2, true)) ~ ns.s %}"
        "{% endfor %}",
        "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
        /* a value that holds another twice, 200 deep: 2^200 leaves when printed, dumped or joined */
        "{% set ns = namespace(s='x') %}{% for i in range(200) %}{% set ns.s = [ns.s, ns.s] %}{% endfor %}{{ ns.s }}",
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = [ns.s, ns.s] %}{% endfor %}"
        "{{ ns.s|tojson }}",
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = {'a': ns.s, 'b': ns.s} %}{% endfor %}"
        "{{ ns.s|string|length }}",
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = [ns.s, ns.s] %}{% endfor %}"
        "{{ ns.s|join(',') }}",
        "{% set ns = namespace(a='x', b='x') %}{% for i in range(40) %}{% set ns.a = [ns.a, ns.a] %}"
        "{% set ns.b = [ns.b, ns.b] %}{% endfor %}{{ ns.a == ns.b }}",
        /* big outputs and big intermediate values */
        "{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}",
        "{{ 'x' * 4611686018427387904 }}",
        "{{ [0, 1] * 4611686018427387904 }}",
        "{{ [0, 1, 2, 3, 4, 5, 6, 7] * 2305843009213693952 }}", /* 8 * 2^61 wraps to 0 in 64 bits */
        "{{ range(-9223372036854775807 - 1, 9223372036854775807)|list }}",
        /* work that allocates little: searches, splits, copies and comparisons over megabytes */
        "{% set s = 'a' * 3000000 %}{% for i in range(100000) %}{{ 'b' in s }}{% endfor %}",
        "{% set s = 'a' * 1000000 %}{% for i in range(100000) %}{% set t = s.split('a') %}{% endfor %}",
        "{% set s = 'ab' * 1000000 %}{% for i in range(100000) %}{% set t = s|list %}{% endfor %}",
        "{% set l = range(1000000)|list %}{% for i in range(100000) %}{% set t = l + l %}{% endfor %}",
        "{% set l = range(10000)|list %}{% for i in range(100000) %}{{ l|tojson }}{% endfor %}",
        "{% set l = range(100000)|list %}{% for i in range(100000) %}{{ 99999 in l }}{% endfor %}",
    };
    double t0 = now_s(), worst = 0;
    size_t n = sizeof k_hostile / sizeof k_hostile[0], n_stopped = 0;
    for (size_t k = 0; k < n; k++) {
        hr_jinja *t = NULL;
        hr_error err = {0};
        char *out = NULL;
        double t1 = now_s();
        hr_status st = hr_jinja_parse(k_hostile[k], strlen(k_hostile[k]), NULL, &t, &err);
        if (st == HR_OK) st = hr_jinja_render(t, "{}", NULL, &out, NULL, &err);
        double dt = now_s() - t1;
        worst = dt > worst ? dt : worst;
        CHECKF(st == HR_ERR_RANGE && !out && strstr(err.msg, "limit") && !strchr(err.msg, '\n'),
               "hostile %zu: %s '%s' after %.2f s: %s", k, hr_status_name(st), err.msg, dt, k_hostile[k]);
        n_stopped += st == HR_ERR_RANGE;
        free(out);
        hr_jinja_destroy(t);
    }
    double total = now_s() - t0;
    printf("hostile: %zu of %zu templates stopped at a limit, %.2f s in all, slowest %.2f s\n", n_stopped, n, total,
           worst);
    CHECKF(total < 300, "hostile templates took %.1f s", total);
}

/* Integers at the edges of int64 count and index as Python's do, or fail as a limit (an overflow
 * is never undefined behaviour: UBSan runs this). */
static void test_int_edges(void) {
    EXPECT("{{ range(0, 9223372036854775807, 4611686018427387904)|list }}", "{}", "[0, 4611686018427387904]");
    EXPECT("{{ range(9223372036854775807, -9223372036854775807 - 1, -9223372036854775807 - 1)|list }}", "{}",
           "[9223372036854775807, -1]");
    EXPECT("{{ range(5, -1, -2)|list }}{{ range(-3)|list }}{{ range(10, 0)|list }}", "{}", "[5, 3, 1][][]");
    EXPECT("{{ 'abc'[::-9223372036854775807 - 1] }}|{{ 'abcdef'[::9223372036854775807] }}|{{ 'abcdef'[5:1:-2] }}", "{}",
           "c|a|fd");
    EXPECT_FAIL("{{ 9223372036854775807 + 1 }}", "{}", HR_ERR_RANGE, "overflow");
    EXPECT_FAIL("{{ (-9223372036854775807 - 1) // -1 }}", "{}", HR_ERR_RANGE, "overflow");
    EXPECT_FAIL("{{ 2 ** 63 }}", "{}", HR_ERR_RANGE, "overflow");
    EXPECT_FAIL("{{ 0 ** -1 }}", "{}", HR_ERR_INVALID_ARG, "negative power");
    EXPECT("{{ 2 ** -2 }}|{{ 0 ** 0 }}", "{}", "0.25|1");
    /* empty sequences repeated 2^63-1 times: empty, at once */
    EXPECT("[{{ '' * 9223372036854775807 }}]{{ [] * 9223372036854775807 }}{{ 9223372036854775807 * [] }}", "{}",
           "[][][]");
}

#if HR_FAULT
#include "common/fault.h"

/* Fault build: the Nth allocation of a parse + render of a real template (Llama 3.2 with tools and
 * a tool call) fails, for every N; each run must give the clean run's bytes or HR_ERR_NOMEM, and
 * LeakSanitizer (at exit) finds nothing. */
static void test_alloc_faults(void) {
    char *src = hr_test_slurp(JINJA_DIR "/templates/llama-3.2.jinja", NULL);
    CHECK(src != NULL);
    if (!src) return;
    const char *ctx =
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
        "\"content\": \"Weather?\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": "
        "[{\"function\": {\"name\": \"w\", \"arguments\": {\"city\": \"Paris\"}}}]}, {\"role\": \"tool\", "
        "\"content\": \"21\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"w\"}}], "
        "\"add_generation_prompt\": true, \"bos_token\": \"<s>\"}";
    char *clean = NULL;
    long calls = 0;
    for (long n = 0; n == 0 || n <= calls; n++) {
        hr_fault_arm(HR_FAULT_ALLOC, n);
        hr_jinja *t = NULL;
        char *out = NULL;
        hr_error err = {0};
        hr_status st = hr_jinja_parse(src, strlen(src), NULL, &t, &err);
        if (st == HR_OK) st = hr_jinja_render(t, ctx, NULL, &out, NULL, &err);
        hr_jinja_destroy(t);
        if (n == 0) calls = hr_fault_calls(HR_FAULT_ALLOC);
        hr_fault_disarm(HR_FAULT_ALLOC);
        if (n == 0) {
            CHECKF(st == HR_OK && out, "%s", err.msg);
            clean = out;
            continue;
        }
        CHECKF((st == HR_OK && out && clean && !strcmp(out, clean)) || (st == HR_ERR_NOMEM && !out),
               "allocation %ld of %ld failed: %s '%s'", n, calls, hr_status_name(st), err.msg);
        free(out);
    }
    printf("alloc faults: %ld allocations, each failed in turn: clean\n", calls);
    CHECK(calls > 3);
    free(clean);
    free(src);
}
#endif

int main(void) {
    setenv("TZ", "UTC", 1); /* strftime_now reads local time; the fixtures were made in UTC */
    test_conformance();
    test_snippets();
    test_whitespace();
    test_values();
    test_statements();
    test_filters_methods();
    test_refusals();
    test_limits();
    test_hostile();
    test_int_edges();
#if HR_FAULT
    test_alloc_faults();
#endif
    return hr_test_finish();
}

/* test_constrain.c: the grammar compiler, the recognizer and the token masks on small vocabularies
 * (in the fault build, first every allocation of a compile and a matcher's run failed in turn):
 * exact allowed sets on a hand-made grammar; masks equal a brute-force check of every token at every
 * step of random walks (JSON, a schema, a regex), with the per-position sets and the per-state cache
 * on and off; regex and GBNF acceptance; integer ranges and formats exactly; the errors (undefined
 * rule, left recursion, bad regex, unsupported schema keywords, bounds) with their messages. */
#include <stdint.h>
#include <string.h>

#include "common/fault.h"
#include "common/util.h"
#include "constrain/constrain.h"
#include "constrain/constrain_internal.h"
#include "harness.h"

static hr_grammar *compile(hr_cons_kind k, const char *src) {
    hr_grammar *g = NULL;
    hr_error err;
    if (hr_grammar_compile(k, src, strlen(src), &g, &err) != HR_OK) {
        fprintf(stderr, "compile %s: %s\n", src, err.msg);
        return NULL;
    }
    return g;
}

static hr_status compile_err(hr_cons_kind k, const char *src, char *msg) {
    hr_grammar *g = NULL;
    hr_error err = {0};
    hr_status st = hr_grammar_compile(k, src, strlen(src), &g, &err);
    hr_grammar_release(g);
    snprintf(msg, HR_ERROR_MSG_MAX, "%s", err.msg);
    return st;
}

/* A vocabulary of the given strings; the last id is an end-of-generation token (no bytes). */
static hr_cons_vocab *vocab_of(const char *const *toks, int n) {
    uint32_t lens[512];
    bool eog[512] = {0};
    for (int i = 0; i < n; i++) lens[i] = (uint32_t)strlen(toks[i]);
    lens[n] = 0;
    eog[n] = true;
    const char *b[513];
    for (int i = 0; i < n; i++) b[i] = toks[i];
    b[n] = "";
    hr_cons_vocab *v = NULL;
    hr_error err;
    if (hr_cons_vocab_create(n + 1, b, lens, eog, &v, &err) != HR_OK) return NULL;
    return v;
}

/* Does the whole string s match g (from the start, to completion)? */
static bool matches(hr_cons_store *st, hr_grammar *g, const char *s) {
    hr_matcher *m = NULL;
    hr_error err;
    if (hr_matcher_create(st, g, &m, &err) != HR_OK) return false;
    bool ok = hr_matcher_accept_bytes(m, s, strlen(s)) && hr_matcher_is_complete(m);
    hr_matcher_destroy(m);
    return ok;
}

/* Random walk: at each step the mask must equal a brute-force check (replay the output, then try the
 * token), then one allowed token is taken. Returns the number of mismatches. */
static int walk_check(hr_cons_store *st, hr_grammar *g, const char *const *toks, int n, uint64_t seed, int steps,
                      char *out, size_t cap) {
    hr_matcher *m = NULL;
    hr_error err;
    if (hr_matcher_create(st, g, &m, &err) != HR_OK) return 1000;
    hr_rng rng;
    hr_rng_seed(&rng, seed);
    uint64_t mask[16];
    size_t len = 0;
    out[0] = 0;
    int bad = 0;
    for (int step = 0; step < steps; step++) {
        int allowed = hr_matcher_fill_mask(m, mask);
        int count = 0, pick = -1;
        for (int t = 0; t <= n; t++) {
            bool want;
            if (t == n) {
                want = hr_matcher_is_complete(m);
            } else {
                hr_matcher *r = NULL;
                hr_matcher_create(st, g, &r, &err);
                want = hr_matcher_accept_bytes(r, out, len) && hr_matcher_accept_bytes(r, toks[t], strlen(toks[t]));
                hr_matcher_destroy(r);
            }
            bool got = (mask[t >> 6] >> (t & 63)) & 1;
            if (want != got) {
                if (bad < 5)
                    fprintf(stderr, "step %d after '%s': token '%s' mask %d brute %d\n", step, out,
                            t == n ? "<eos>" : toks[t], got, want);
                bad++;
            }
            if (got) count++;
        }
        if (count != allowed) bad++;
        if (allowed == 0) break;
        int k = (int)(hr_rng_next(&rng) % (uint64_t)allowed);
        for (int t = 0; t <= n && pick < 0; t++)
            if (((mask[t >> 6] >> (t & 63)) & 1) && k-- == 0) pick = t;
        if (pick == n) break; /* end of generation */
        if (!hr_matcher_accept_token(m, pick)) bad++;
        size_t tl = strlen(toks[pick]);
        if (len + tl + 1 >= cap) break;
        memcpy(out + len, toks[pick], tl + 1);
        len += tl;
    }
    hr_matcher_destroy(m);
    return bad;
}

static const char *const k_json_toks[] = {
    "{",        "}",    "[",      "]",   "\"",        ",",     ":",    " ",    "\n",   "0",   "1",   "12",    "-",
    ".",        "5e",   "e",      "E+",  "true",      "false", "null", "tr",   "ue",   "nu",  "ll",  "a",     "b",
    "ab",       "\\",   "\\n",    "\\u", "00",        "0a",    "d8",   "\":",  "\",",  "\"}", "{\"", "\"a\"", "name",
    "\"name\"", ": \"", "\": \"", "age", "\"age\": ", "x",     "é",    "\xC3", "\xA9", "ok",  "[{",  "}]",    "},",
    "\"]",      "2024", "-0",     "3-",  "T",         "Z",     ":0",   "00:",  "-12-", "1\"", "42",  "  ",    "\t"};

#if HR_FAULT
/* Compiles src and runs a matcher over the JSON test vocabulary for a few steps; every failure must
 * be a clean one (a status, an empty mask, a refused token), never a crash or a leak (ASan). */
static void fault_workload(hr_cons_kind kind, const char *src) {
    hr_grammar *g = NULL;
    hr_error err;
    hr_status st = hr_grammar_compile(kind, src, strlen(src), &g, &err);
    if (st != HR_OK) {
        CHECKF(st == HR_ERR_NOMEM, "status %d: %s", st, err.msg);
        return;
    }
    int nj = (int)(sizeof k_json_toks / sizeof k_json_toks[0]);
    hr_cons_vocab *v = vocab_of(k_json_toks, nj);
    hr_cons_store *s = NULL;
    hr_matcher *m = NULL;
    if (v && hr_cons_store_create(v, &s, &err) == HR_OK && hr_matcher_create(s, g, &m, &err) == HR_OK) {
        uint64_t mask[2];
        for (int step = 0; step < 12; step++) {
            if (hr_matcher_fill_mask(m, mask) == 0) break;
            int t = 0;
            while (t < nj && !((mask[t >> 6] >> (t & 63)) & 1)) t++;
            if (t == nj || !hr_matcher_accept_token(m, t)) break;
        }
    }
    hr_matcher_destroy(m);
    hr_cons_store_destroy(s);
    hr_cons_vocab_destroy(v);
    hr_grammar_release(g);
}

/* Fails each allocation of the workload in turn. */
static void fault_walk(hr_cons_kind kind, const char *src) {
    hr_fault_arm(HR_FAULT_ALLOC, 0);
    fault_workload(kind, src);
    long calls = hr_fault_calls(HR_FAULT_ALLOC);
    hr_fault_disarm(HR_FAULT_ALLOC);
    int fired = 0;
    for (long n = 1; n <= calls; n++) {
        hr_fault_arm(HR_FAULT_ALLOC, n);
        fault_workload(kind, src);
        fired += hr_fault_fired(HR_FAULT_ALLOC);
        hr_fault_disarm(HR_FAULT_ALLOC);
    }
    printf("kind %s: %ld allocations, each failed in turn (%d fired)\n", hr_cons_kind_name(kind), calls, fired);
    CHECK(calls > 0 && fired > 0);
}
#endif

int main(void) {
    hr_error err;
#if HR_FAULT
    fault_walk(HR_CONS_JSON_SCHEMA, "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"maximum\":99},"
                                    "\"b\":{\"type\":\"string\",\"pattern\":\"[a-z]+\"}},\"required\":[\"a\"]}");
    fault_walk(HR_CONS_GRAMMAR, "root ::= \"{\" [a-zé]{1,3} x*\nx ::= /[0-9]+/ | \"}\"\n");
#endif
    /* ---- exact allowed sets on a hand-made grammar ---- */
    const char *const toks[] = {"a", "b", "ab", "ba", "c", "abc", "bc", "cc", "x"};
    int nt = 9;
    hr_cons_vocab *v = vocab_of(toks, nt);
    hr_cons_store *st = NULL;
    CHECK(v && hr_cons_store_create(v, &st, &err) == HR_OK);
    hr_grammar *g = compile(HR_CONS_GRAMMAR, "root ::= \"a\" \"b\"* \"c\"  # a comment\n");
    CHECK(g != NULL);
    hr_matcher *m = NULL;
    CHECK(hr_matcher_create(st, g, &m, &err) == HR_OK);
    uint64_t mask[4];
    CHECK(hr_matcher_fill_mask(m, mask) == 3);
    CHECK(mask[0] == ((1u << 0) | (1u << 2) | (1u << 5))); /* a, ab, abc */
    CHECK(hr_matcher_accept_token(m, 0));                  /* "a" */
    CHECK(hr_matcher_fill_mask(m, mask) == 3);
    CHECK(mask[0] == ((1u << 1) | (1u << 4) | (1u << 6))); /* b, c, bc */
    CHECK(!hr_matcher_accept_token(m, 3));                 /* "ba" */
    CHECK(!hr_matcher_is_complete(m));
    CHECK(hr_matcher_accept_token(m, 6)); /* "bc" */
    CHECK(hr_matcher_is_complete(m) && hr_matcher_is_done(m));
    CHECK(hr_matcher_fill_mask(m, mask) == 1 && mask[0] == (1u << 9)); /* only the end */
    hr_matcher_destroy(m);
    /* a grammar whose next byte no token holds: an empty mask, not even the end (the engine then ends
     * the request "length") */
    hr_grammar *gz = compile(HR_CONS_REGEX, "a[yz]");
    CHECK(gz && hr_matcher_create(st, gz, &m, &err) == HR_OK);
    CHECK(hr_matcher_fill_mask(m, mask) == 1 && hr_matcher_accept_token(m, 0));
    CHECK(hr_matcher_fill_mask(m, mask) == 0 && mask[0] == 0 && !hr_matcher_is_complete(m));
    hr_matcher_destroy(m);
    hr_grammar_release(gz);
    /* the same masks again come from the per-state cache */
    hr_cons_store_stats ss;
    CHECK(hr_matcher_create(st, g, &m, &err) == HR_OK);
    CHECK(hr_matcher_fill_mask(m, mask) == 3);
    hr_cons_store_get_stats(st, &ss);
    CHECK(ss.mask_cache_hits == 1);
    hr_matcher_destroy(m);
    hr_grammar_release(g);
    hr_cons_store_destroy(st);
    hr_cons_vocab_destroy(v);

    /* ---- masks equal brute force: JSON, a schema, a regex; caches on and off ---- */
    int nj = (int)(sizeof k_json_toks / sizeof k_json_toks[0]);
    v = vocab_of(k_json_toks, nj);
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},"
                         "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},"
                         "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\",1]},\"maxItems\":3},"
                         "\"when\":{\"type\":\"string\",\"format\":\"date\"}},"
                         "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";
    struct {
        hr_cons_kind k;
        const char *src;
    } cases[] = {{HR_CONS_JSON, ""},
                 {HR_CONS_JSON_SCHEMA, schema},
                 {HR_CONS_REGEX, "(ab|[0-9]{1,3}(-[a-z]+)?)+"},
                 {HR_CONS_GRAMMAR, "root ::= item (\",\" item)*\nitem ::= /[0-9]+/ | \"\\\"\" [a-z]* \"\\\"\"\n"}};
    for (int c = 0; c < 4; c++) {
        hr_grammar *gc = compile(cases[c].k, cases[c].src);
        CHECKF(gc != NULL, "case %d", c);
        if (!gc) continue;
        for (int mode = 0; mode < 3; mode++) {
            CHECK(hr_cons_store_create(v, &st, &err) == HR_OK);
            hr_cons_store_set_caching(st, mode != 1, mode != 2);
            int bad = 0;
            for (int seed = 0; seed < 12; seed++) {
                char out[512];
                bad += walk_check(st, gc, k_json_toks, nj, (uint64_t)(seed * 7 + c), 40, out, sizeof out);
            }
            CHECKF(bad == 0, "case %d mode %d: %d mismatches", c, mode, bad);
            hr_cons_store_destroy(st);
        }
        hr_grammar_release(gc);
    }

    /* ---- acceptance of whole strings ---- */
    CHECK(hr_cons_store_create(v, &st, &err) == HR_OK);
    g = compile(HR_CONS_JSON_SCHEMA, schema);
    CHECK(matches(st, g, "{\"name\":\"bo\",\"age\":7}"));
    CHECK(
        matches(st, g, " { \"name\" : \"\" , \"age\" : 120 , \"tags\" : [ \"a\" , 1 ] , \"when\" : \"2024-12-31\" }"));
    CHECK(!matches(st, g, "{\"name\":\"bo\",\"age\":121}"));
    CHECK(!matches(st, g, "{\"age\":7,\"name\":\"bo\"}"));        /* order of the schema */
    CHECK(!matches(st, g, "{\"name\":\"bo\"}"));                  /* age is required */
    CHECK(!matches(st, g, "{\"name\":\"bobobob\",\"age\":1}"));   /* maxLength 6 */
    CHECK(!matches(st, g, "{\"name\":\"b\",\"age\":1,\"x\":1}")); /* additionalProperties false */
    CHECK(!matches(st, g, "{\"name\":\"b\",\"age\":1,\"tags\":[1,1,1,1]}"));
    CHECK(!matches(st, g, "{\"name\":\"b\",\"age\":1,\"when\":\"2023-02-29\"}"));
    CHECK(!matches(st, g, "{\"name\":\"b\",\"age\":1,\"when\":\"2023-04-31\"}"));
    hr_grammar_release(g);
    /* integer ranges, exactly */
    g = compile(HR_CONS_JSON_SCHEMA, "{\"type\":\"integer\",\"minimum\":-15,\"exclusiveMaximum\":124}");
    int wrong = 0;
    for (int x = -300; x <= 300; x++) {
        char s[16];
        snprintf(s, sizeof s, "%d", x);
        if (matches(st, g, s) != (x >= -15 && x < 124)) wrong++;
    }
    CHECK(wrong == 0);
    CHECK(!matches(st, g, "007") && !matches(st, g, "-0"));
    hr_grammar_release(g);
    /* an open side runs to 15 digits: the digit-range text stays linear in the digits */
    g = compile(HR_CONS_JSON_SCHEMA, "{\"type\":\"integer\",\"maximum\":99}");
    CHECKF(g && strlen(hr_grammar_text(g)) < 4000, "%zu bytes of GBNF", g ? strlen(hr_grammar_text(g)) : 0);
    CHECK(matches(st, g, "99") && matches(st, g, "-999999999999999") && !matches(st, g, "100") &&
          !matches(st, g, "-1000000000000000"));
    hr_grammar_release(g);
    wrong = 0;
    g = compile(HR_CONS_JSON_SCHEMA, "{\"type\":\"integer\",\"minimum\":1999,\"maximum\":30500}");
    for (int x = 1000; x <= 40000; x += 7) {
        char s[16];
        snprintf(s, sizeof s, "%d", x);
        if (matches(st, g, s) != (x >= 1999 && x <= 30500)) wrong++;
    }
    CHECK(wrong == 0 && matches(st, g, "1999") && matches(st, g, "30500") && !matches(st, g, "30501"));
    hr_grammar_release(g);
    g = compile(HR_CONS_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"date-time\"}");
    CHECK(matches(st, g, "\"2024-01-31T23:59:59.123Z\"") && matches(st, g, "\"1999-11-30T00:00:00+05:30\""));
    CHECK(!matches(st, g, "\"2024-01-31T24:00:00Z\"") && !matches(st, g, "\"2024-01-31T23:59:59\""));
    hr_grammar_release(g);
    g = compile(HR_CONS_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"uuid\"}");
    CHECK(matches(st, g, "\"123e4567-e89b-12d3-a456-426614174000\"") && !matches(st, g, "\"123e4567\""));
    hr_grammar_release(g);
    g = compile(HR_CONS_JSON_SCHEMA,
                "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{"
                "\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"]}},"
                "\"$ref\":\"#/$defs/node\"}");
    CHECK(matches(st, g, "{\"v\":1,\"next\":{\"v\":2,\"next\":null}}") && !matches(st, g, "{\"v\":1,\"next\":{}}"));
    hr_grammar_release(g);
    g = compile(HR_CONS_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3}$\"}");
    CHECK(g && matches(st, g, "\"AB-123\"") && !matches(st, g, "\"AB-12\"") && !matches(st, g, "\"ab-123\""));
    hr_grammar_release(g);
    g = compile(HR_CONS_CHOICE, "[\"yes\",\"no\",\"maybe \\\"so\\\"\"]");
    CHECK(matches(st, g, "yes") && matches(st, g, "maybe \"so\"") && !matches(st, g, "ye") && !matches(st, g, "yesno"));
    hr_grammar_release(g);
    g = compile(HR_CONS_REGEX, "^\\w+@[a-z]+\\.(com|org)$");
    CHECK(matches(st, g, "a_1@x.org") && !matches(st, g, "a@x.net") && !matches(st, g, "@x.com"));
    hr_grammar_release(g);
    g = compile(HR_CONS_REGEX, "[α-ω]+é?"); /* classes past ASCII: UTF-8 byte sequences */
    CHECK(matches(st, g, "αβω") && matches(st, g, "λé") && !matches(st, g, "é") && !matches(st, g, "a"));
    hr_grammar_release(g);
    g = compile(HR_CONS_GRAMMAR, "root ::= [^a-z\\n]{2,3} | \"x\"?\n");
    CHECK(matches(st, g, "AB") && matches(st, g, "€€€") && !matches(st, g, "ABCD") && !matches(st, g, "aB"));
    CHECK(matches(st, g, "") && matches(st, g, "x"));
    hr_grammar_release(g);
    hr_cons_store_destroy(st);
    hr_cons_vocab_destroy(v);

    /* ---- errors ---- */
    char msg[HR_ERROR_MSG_MAX];
    CHECK(compile_err(HR_CONS_GRAMMAR, "root ::= foo \"a\"\n", msg) == HR_ERR_INVALID_ARG &&
          strstr(msg, "undefined rule 'foo'"));
    CHECK(compile_err(HR_CONS_GRAMMAR, "root ::= root \"a\" | \"b\"\n", msg) == HR_ERR_INVALID_ARG &&
          strstr(msg, "left-recursive"));
    CHECK(compile_err(HR_CONS_GRAMMAR, "start ::= \"a\"\n", msg) == HR_ERR_INVALID_ARG && strstr(msg, "root"));
    CHECK(compile_err(HR_CONS_GRAMMAR, "root ::= \"a\" root\n", msg) == HR_ERR_INVALID_ARG &&
          strstr(msg, "never finish"));
    CHECK(compile_err(HR_CONS_REGEX, "(ab", msg) == HR_ERR_INVALID_ARG && strstr(msg, "expected ')'"));
    CHECK(compile_err(HR_CONS_REGEX, "(a)\\1", msg) == HR_ERR_INVALID_ARG && strstr(msg, "back-references"));
    CHECK(compile_err(HR_CONS_REGEX, "a(?=b)", msg) == HR_ERR_INVALID_ARG && strstr(msg, "lookaround"));
    CHECK(compile_err(HR_CONS_REGEX, "a{20000}", msg) == HR_ERR_RANGE && strstr(msg, "bound on repetitions"));
    CHECK(compile_err(HR_CONS_JSON_SCHEMA, "{\"type\":\"object\",\"properties\":{\"a\":{\"not\":{}}}}", msg) ==
              HR_ERR_INVALID_ARG &&
          strstr(msg, "'not'") && strstr(msg, "#/properties/a"));
    CHECK(compile_err(HR_CONS_JSON_SCHEMA, "{\"oneOf\":[{\"type\":\"string\"}]}", msg) == HR_ERR_INVALID_ARG &&
          strstr(msg, "'oneOf'"));
    CHECK(compile_err(HR_CONS_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"email\"}", msg) == HR_ERR_INVALID_ARG &&
          strstr(msg, "'email'"));
    CHECK(compile_err(HR_CONS_JSON_SCHEMA, "{\"type\":\"number\",\"minimum\":1}", msg) == HR_ERR_INVALID_ARG &&
          strstr(msg, "'minimum'"));
    CHECK(compile_err(HR_CONS_JSON_SCHEMA, "{\"type\":\"array\",\"uniqueItems\":true}", msg) == HR_ERR_INVALID_ARG &&
          strstr(msg, "'uniqueItems'"));
    CHECK(compile_err(HR_CONS_JSON_SCHEMA, "{\"$ref\":\"#/$defs/missing\"}", msg) == HR_ERR_INVALID_ARG &&
          strstr(msg, "does not resolve"));
    CHECK(compile_err(HR_CONS_JSON_SCHEMA, "{\"type\":", msg) == HR_ERR_INVALID_ARG && strstr(msg, "not JSON"));
    CHECK(compile_err(HR_CONS_CHOICE, "[1]", msg) == HR_ERR_INVALID_ARG);
    /* the element bound: 21 runs of 10000 */
    hr_sbuf big = {0};
    hr_sbuf_puts(&big, "root ::=");
    for (int i = 0; i < 21; i++) hr_sbuf_puts(&big, " \"x\"{10000}");
    CHECK(compile_err(HR_CONS_GRAMMAR, big.s, msg) == HR_ERR_RANGE && strstr(msg, "bound on elements"));
    free(big.s);

    /* ---- the cache: by content ---- */
    hr_grammar_cache *cache = NULL;
    CHECK(hr_grammar_cache_create(4, &cache, &err) == HR_OK);
    hr_grammar *a = NULL, *b = NULL;
    CHECK(hr_grammar_cache_get(cache, HR_CONS_JSON_SCHEMA, schema, strlen(schema), &a, &err) == HR_OK);
    char *copy = strdup(schema);
    CHECK(hr_grammar_cache_get(cache, HR_CONS_JSON_SCHEMA, copy, strlen(copy), &b, &err) == HR_OK);
    CHECK(a == b);
    uint64_t hits, misses;
    hr_grammar_cache_stats(cache, &hits, &misses);
    CHECK(hits == 1 && misses == 1);
    free(copy);
    hr_grammar_release(a);
    hr_grammar_release(b);
    hr_grammar_cache_destroy(cache);
    return hr_test_finish();
}

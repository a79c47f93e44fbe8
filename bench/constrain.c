/* constrain.c: what constrained decoding costs next to a decode step at batch 1.
 *
 *   bench_constrain [MODEL.gguf] [--tokens N] [--threads T] [--schema FILE.json]
 *       MODEL omitted: the built-in demo model.
 *
 * Steps: (1) an unconstrained request of N tokens alone (batch 1, temperature 1): the median gap between
 * its tokens is the decode step; (2) a constrained request (the JSON Schema below, or FILE, temperature 1)
 * alone: its median gap is a constrained step, mask included; (3) its output ids replayed through a
 * fresh matcher, timing every hr_matcher_fill_mask: "cold" (new tables: per-position sets computed on
 * first use), "warm" (a second constrained output, another seed, on the tables the first left: what a
 * server sees once a schema has been used) and "plain" (both caches off: a sorted-vocabulary walk at
 * every step). Medians, p90 and max in ms; the
 * ratio is mask median / decode-step median. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "constrain/constrain.h"
#include "runtime/runtime.h"

static const char *k_schema =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":24},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":130},\"email\":{\"type\":\"string\",\"maxLength\":32},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":12},\"maxItems\":4},"
    "\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\",\"maxLength\":32},\"zip\":{"
    "\"type\":\"string\","
    "\"pattern\":\"^[0-9]{5}$\"}},\"required\":[\"street\",\"zip\"],\"additionalProperties\":false},"
    "\"active\":{\"type\":\"boolean\"},\"joined\":{\"type\":\"string\",\"format\":\"date\"}},"
    "\"required\":[\"name\",\"age\",\"email\",\"tags\",\"address\",\"active\",\"joined\"],\"additionalProperties\":"
    "false}";

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void stats(double *v, int n, double *med, double *p90, double *mx) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    *med = hr_percentile(v, n, 50);
    *p90 = hr_percentile(v, n, 90);
    *mx = n ? v[n - 1] : 0;
}

/* Runs one request alone; returns its median inter-token gap (s) and copies its output ids. */
static double run_one(hr_runtime *rt, const hr_rt_request_params *p, int32_t **ids, int *n_ids, const char **finish) {
    hr_rt_request *r = NULL;
    hr_error err;
    if (hr_runtime_submit(rt, p, &r, &err) != HR_OK) {
        fprintf(stderr, "submit: %s\n", err.msg);
        exit(1);
    }
    if (hr_runtime_run_until_idle(rt, &err) != HR_OK) {
        fprintf(stderr, "run: %s\n", err.msg);
        exit(1);
    }
    hr_rt_result res;
    hr_rt_request_result(r, &res);
    float gaps[8192];
    int ng = hr_rt_request_token_gaps(r, gaps, 8192);
    double *g = malloc(sizeof(double) * (size_t)(ng + 1));
    int k = 0;
    for (int i = 1; i < ng; i++) g[k++] = gaps[i]; /* gap 0 is the prefill */
    double med, p90, mx;
    stats(g, k, &med, &p90, &mx);
    free(g);
    if (ids) {
        *ids = malloc(sizeof(int32_t) * (size_t)(res.n_ids + 1));
        memcpy(*ids, res.ids, sizeof(int32_t) * (size_t)res.n_ids);
        *n_ids = res.n_ids;
    }
    if (finish) *finish = strcmp(res.finish_reason, "stop") == 0 ? "stop" : "length";
    hr_rt_request_release(rt, r);
    return med;
}

/* Replays ids through a matcher of store s, timing each mask (ms into t). */
static int replay(hr_cons_store *s, hr_grammar *g, const int32_t *ids, int n, uint64_t *mask, double *t) {
    hr_matcher *m = NULL;
    hr_error err;
    if (hr_matcher_create(s, g, &m, &err) != HR_OK) return 0;
    int k = 0;
    for (int i = 0; i < n; i++) {
        double t0 = hr_time_now();
        int allowed = hr_matcher_fill_mask(m, mask);
        t[k++] = (hr_time_now() - t0) * 1e3;
        if (allowed == 0 || !((mask[ids[i] >> 6] >> (ids[i] & 63)) & 1) || !hr_matcher_accept_token(m, ids[i])) {
            fprintf(stderr, "replay: token %d at %d not allowed\n", ids[i], i);
            break;
        }
    }
    hr_matcher_destroy(m);
    return k;
}

int main(int argc, char **argv) {
    const char *model = NULL, *schema_file = NULL;
    int tokens = 128, threads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--schema") && i + 1 < argc)
            schema_file = argv[++i];
        else if (argv[i][0] != '-')
            model = argv[i];
        else {
            fprintf(stderr, "usage: bench_constrain [MODEL.gguf] [--tokens N] [--threads T] [--schema FILE.json]\n");
            return 2;
        }
    }
    const char *schema = k_schema;
    char *file = NULL;
    if (schema_file) {
        FILE *f = fopen(schema_file, "rb");
        if (!f) return fprintf(stderr, "cannot open %s\n", schema_file), 1;
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        file = calloc(1, (size_t)n + 1);
        if (fread(file, 1, (size_t)n, f) != (size_t)n) return 1;
        fclose(f);
        schema = file;
    }
    hr_runtime_params rp = hr_runtime_default_params();
    rp.model_path = model;
    rp.n_threads = threads;
    rp.n_ctx = 2048;
    rp.ctx_extend = true;
    rp.kv_seqs = 1;
    hr_runtime *rt = NULL;
    hr_error err;
    if (hr_runtime_open(&rp, &rt, NULL, &err) != HR_OK) return fprintf(stderr, "open: %s\n", err.msg), 1;
    const hr_tokenizer *tok = hr_runtime_tokenizer(rt);
    printf("model %s: vocabulary %d (%s), %d threads\n", hr_runtime_model_name(rt), hr_tokenizer_n_vocab(tok),
           hr_tokenizer_kind_name(tok), hr_runtime_get_params(rt)->n_threads);

    /* the same sampling (temperature 1 over the whole vocabulary) with and without the constraint */
    hr_rt_request_params p = {.prompt = "Here is the user record as JSON:", .max_tokens = tokens, .ignore_eos = true};
    p.sampling = hr_rt_sampling_default();
    p.sampling.temperature = 1.0f;
    p.sampling.top_k = 0;
    p.sampling.top_p = 1.0f;
    p.sampling.min_p = 0.0f;
    p.sampling.seed = 42;
    double step = run_one(rt, &p, NULL, NULL, NULL);
    p.ignore_eos = false;
    p.max_tokens = 1000;
    p.constraint = (hr_rt_constraint){.kind = HR_RT_CONS_JSON_SCHEMA, .src = schema, .len = strlen(schema)};
    int32_t *ids = NULL;
    int n_ids = 0;
    const char *finish = NULL;
    double t0 = hr_time_now();
    hr_grammar *g = NULL;
    if (hr_grammar_compile(HR_CONS_JSON_SCHEMA, schema, strlen(schema), &g, &err) != HR_OK)
        return fprintf(stderr, "schema: %s\n", err.msg), 1;
    double compile_ms = (hr_time_now() - t0) * 1e3;
    double cstep = run_one(rt, &p, &ids, &n_ids, &finish);
    int32_t *ids2 = NULL;
    int n_ids2 = 0;
    p.sampling.seed = 43;
    run_one(rt, &p, &ids2, &n_ids2, NULL);

    t0 = hr_time_now();
    hr_cons_vocab *v = NULL;
    if (hr_cons_vocab_from_tokenizer(tok, &v, &err) != HR_OK) return fprintf(stderr, "%s\n", err.msg), 1;
    double vocab_ms = (hr_time_now() - t0) * 1e3;
    uint64_t *mask = calloc(hr_cons_mask_words(hr_cons_vocab_size(v)), sizeof(uint64_t));
    double *t = malloc(sizeof(double) * (size_t)(HR_MAX(n_ids, n_ids2) + 1));
    hr_cons_store *s = NULL;
    hr_cons_store_create(v, &s, &err);
    const char *names[3] = {"cold", "warm", "plain"};
    double med[3], p90[3], mx[3];
    for (int mode = 0; mode < 3; mode++) {
        if (mode == 2) {
            hr_cons_store_destroy(s);
            hr_cons_store_create(v, &s, &err);
            hr_cons_store_set_caching(s, false, false);
        }
        int k = mode == 1 ? replay(s, g, ids2, n_ids2, mask, t) : replay(s, g, ids, n_ids, mask, t);
        stats(t, k, &med[mode], &p90[mode], &mx[mode]);
    }
    hr_cons_store_stats ss;
    hr_cons_store_get_stats(s, &ss);
    printf("schema: %d rules, %d elements, compiled in %.2f ms; vocabulary bytes table %.1f ms\n",
           hr_grammar_n_rules(g), hr_grammar_n_elements(g), compile_ms, vocab_ms);
    printf("decode step at batch 1 (median gap, %d tokens): %.3f ms\n", tokens, step * 1e3);
    printf("constrained step at batch 1 (median gap, %d tokens, finish %s): %.3f ms\n", n_ids, finish, cstep * 1e3);
    printf("%-6s %10s %10s %10s %12s\n", "mask", "median ms", "p90 ms", "max ms", "median/step");
    for (int mode = 0; mode < 3; mode++)
        printf("%-6s %10.3f %10.3f %10.3f %11.2f%%\n", names[mode], med[mode], p90[mode], mx[mode],
               100.0 * med[mode] / (step * 1e3));
    free(t);
    free(mask);
    free(ids);
    free(ids2);
    free(file);
    hr_cons_store_destroy(s);
    hr_cons_vocab_destroy(v);
    hr_grammar_release(g);
    hr_runtime_close(rt);
    return 0;
}

/* traffic.c: request streams for the simulator: five presets (documented distributions, seeded) and
 * JSON-lines traces. Every length is clipped so that prompt + output fits the context. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "plan/plan.h"

const char *hr_traffic_preset_names(void) { return "chat, rag, agent, burst, long"; }

void hr_traffic_free(hr_traffic *t) {
    if (!t) return;
    free(t->reqs);
    t->reqs = NULL;
    t->n = 0;
}

/* A log-normal draw with this median and log-space sigma, clipped to [lo, hi]. */
static int lognormal(hr_rng *r, double median, double sigma, int lo, int hi) {
    double v = median * exp(sigma * hr_rng_normal(r));
    return (int)HR_MAX((double)lo, HR_MIN((double)hi, v));
}

/* Seconds to the next arrival of a Poisson process of `rate` per second. */
static double poisson_gap(hr_rng *r, double rate) { return -log(1.0 - hr_rng_uniform(r)) / rate; }

static void clip(hr_traffic_req *q, int n_ctx) {
    q->n_prompt = HR_MAX(1, HR_MIN(q->n_prompt, n_ctx - 8));
    q->n_output = HR_MAX(1, HR_MIN(q->n_output, n_ctx - q->n_prompt));
    q->n_prefix = HR_MAX(0, HR_MIN(q->n_prefix, q->n_prompt - 1));
    if (q->n_prefix == 0) q->prefix_id = -1;
}

static int by_arrival(const void *a, const void *b) {
    const hr_traffic_req *x = a, *y = b;
    return x->t_arrival < y->t_arrival ? -1 : x->t_arrival > y->t_arrival;
}

hr_status hr_traffic_preset(const char *name, int n, int n_ctx, uint64_t seed, hr_traffic *out, hr_error *err) {
    memset(out, 0, sizeof *out);
    static const struct {
        const char *name;
        int n;
    } presets[] = {{"chat", 200}, {"rag", 100}, {"agent", 200}, {"burst", 256}, {"long", 16}};
    int k = -1;
    for (int i = 0; i < 5; i++)
        if (!strcmp(name, presets[i].name)) k = i;
    if (k < 0)
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "unknown traffic '%s' (presets: %s; or a trace file of JSON lines)", name,
                            hr_traffic_preset_names());
    if (n <= 0) n = presets[k].n;
    hr_traffic_req *q = calloc((size_t)n, sizeof *q);
    if (!q) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    hr_rng r;
    hr_rng_seed(&r, seed);
    double t = 0;
    for (int i = 0; i < n; i++) {
        hr_traffic_req *x = &q[i];
        x->prefix_id = -1;
        switch (k) {
        case 0: /* chat: Poisson 4/s; prompt ~400, output ~200; a 64-token system prompt shared by all */
            t += poisson_gap(&r, 4.0);
            x->n_prompt = lognormal(&r, 400, 0.8, 16, n_ctx / 2);
            x->n_output = lognormal(&r, 200, 0.6, 8, 1024);
            x->prefix_id = 0;
            x->n_prefix = 64;
            break;
        case 1: /* rag: Poisson 2/s; a 2,048-token document (one of 8) + question ~300; answer ~128 */
            t += poisson_gap(&r, 2.0);
            x->prefix_id = (int)(hr_rng_next(&r) % 8);
            x->n_prefix = HR_MIN(2048, n_ctx / 2);
            x->n_prompt = x->n_prefix + lognormal(&r, 300, 0.5, 16, 2048);
            x->n_output = lognormal(&r, 128, 0.5, 8, 512);
            break;
        case 2: { /* agent: 40 sessions (Poisson 1/s) of 5 turns 2 s apart; each turn's prompt is the last
                     turn's prompt and output plus ~200 new tokens (tool results); output ~100 */
            int session = i / 5, turn = i % 5;
            if (turn == 0) {
                t += poisson_gap(&r, 1.0);
                x->n_prompt = lognormal(&r, 800, 0.4, 64, n_ctx / 2);
            } else {
                const hr_traffic_req *prev = &q[i - 1];
                x->n_prefix = prev->n_prompt + prev->n_output;
                x->n_prompt = x->n_prefix + lognormal(&r, 200, 0.5, 8, 1024);
            }
            x->t_arrival = t + 2.0 * turn;
            x->prefix_id = session;
            x->n_output = lognormal(&r, 100, 0.5, 8, 512);
            break;
        }
        case 3: /* burst: bursts of 64 at t = 0, 20, 40, ...; prompt ~256, output ~128 */
            x->t_arrival = 20.0 * (i / 64);
            x->n_prompt = lognormal(&r, 256, 0.5, 16, n_ctx / 2);
            x->n_output = lognormal(&r, 128, 0.5, 8, 512);
            break;
        default: /* long: Poisson 0.2/s; prompt uniform in [ctx/2, 3 ctx/4]; output ~512 */
            t += poisson_gap(&r, 0.2);
            x->n_prompt = n_ctx / 2 + (int)(hr_rng_uniform(&r) * (n_ctx / 4));
            x->n_output = lognormal(&r, 512, 0.3, 64, 2048);
            break;
        }
        if (k != 2 && k != 3) x->t_arrival = t;
        clip(x, n_ctx);
    }
    qsort(q, (size_t)n, sizeof *q, by_arrival);
    snprintf(out->name, sizeof out->name, "%s", presets[k].name);
    out->reqs = q;
    out->n = n;
    return HR_OK;
}

static hr_status field_int(json_t *o, const char *key, bool required, int def, int *out, int line, hr_error *err) {
    json_t *v = json_object_get(o, key);
    if (!v) {
        if (required) return hr_error_set(err, HR_ERR_FORMAT, "trace line %d lacks \"%s\"", line, key);
        *out = def;
        return HR_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (1 << 24))
        return hr_error_set(err, HR_ERR_FORMAT, "trace line %d: \"%s\" must be a non-negative integer", line, key);
    *out = (int)json_integer_value(v);
    return HR_OK;
}

hr_status hr_traffic_load(const char *path, int n_ctx, hr_traffic *out, hr_error *err) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f) return hr_error_set(err, HR_ERR_IO, "cannot open trace '%s'", path);
    int cap = 256, n = 0, line_no = 0;
    hr_traffic_req *q = malloc(sizeof *q * (size_t)cap);
    char line[4096];
    hr_status st = q ? HR_OK : hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    while (st == HR_OK && fgets(line, sizeof line, f)) {
        line_no++;
        if (strspn(line, " \t\r\n") == strlen(line)) continue;
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        if (!json_is_object(o)) {
            json_decref(o);
            st = hr_error_set(err, HR_ERR_FORMAT, "trace line %d is not a JSON object", line_no);
            break;
        }
        if (n == cap) {
            hr_traffic_req *nq = realloc(q, sizeof *q * (size_t)(cap *= 2));
            if (!nq) {
                json_decref(o);
                st = hr_error_set(err, HR_ERR_NOMEM, "out of memory");
                break;
            }
            q = nq;
        }
        hr_traffic_req *x = &q[n];
        json_t *t = json_object_get(o, "t");
        if (!json_is_number(t) || json_number_value(t) < 0)
            st = hr_error_set(err, HR_ERR_FORMAT, "trace line %d: \"t\" (arrival seconds, >= 0) is missing or bad",
                              line_no);
        else
            x->t_arrival = json_number_value(t);
        if (st == HR_OK) st = field_int(o, "prompt", true, 0, &x->n_prompt, line_no, err);
        if (st == HR_OK) st = field_int(o, "output", true, 0, &x->n_output, line_no, err);
        if (st == HR_OK) st = field_int(o, "prefix", false, -1, &x->prefix_id, line_no, err);
        if (st == HR_OK) st = field_int(o, "prefix_tokens", false, 0, &x->n_prefix, line_no, err);
        if (st == HR_OK && (x->n_prompt < 1 || x->n_output < 1))
            st = hr_error_set(err, HR_ERR_FORMAT, "trace line %d: prompt and output must be >= 1", line_no);
        json_decref(o);
        if (st == HR_OK) {
            if (x->prefix_id < 0) x->n_prefix = 0;
            clip(x, n_ctx);
            n++;
        }
    }
    fclose(f);
    if (st == HR_OK && n == 0) st = hr_error_set(err, HR_ERR_FORMAT, "trace '%s' holds no request", path);
    if (st) {
        free(q);
        return st;
    }
    qsort(q, (size_t)n, sizeof *q, by_arrival);
    const char *base = strrchr(path, '/');
    snprintf(out->name, sizeof out->name, "%s", base ? base + 1 : path);
    out->reqs = q;
    out->n = n;
    return HR_OK;
}

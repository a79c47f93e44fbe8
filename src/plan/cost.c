/* cost.c: how long one engine step takes, for the simulator: measured once on this machine (the real
 * forward pass of a synthetic TinyLlama-shaped model at T = 1 .. 512 tokens, attention after 768 cached
 * tokens, and engine decode steps of 4 and 16 sequences with sampling), saved as JSON, or a GPU's
 * roofline from its datasheet. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "gguf/gguf.h"
#include "plan/plan.h"
#include "runtime/runtime.h"

double hr_cost_rate(const hr_cost_model *c, int n_tokens, bool head) {
    int n = c->n_curve;
    if (n <= 0) return c->gflops;
    const double *g = head ? c->curve_head : c->curve_gflops;
    if (n_tokens <= c->curve_tokens[0]) return g[0];
    if (n_tokens >= c->curve_tokens[n - 1]) return g[n - 1];
    int i = 0;
    while (i + 2 < n && c->curve_tokens[i + 1] <= n_tokens) i++;
    double x0 = log((double)c->curve_tokens[i]), x1 = log((double)c->curve_tokens[i + 1]);
    double f = (log((double)n_tokens) - x0) / (x1 - x0);
    return g[i] + f * (g[i + 1] - g[i]);
}

/* Seconds for `flops` at `gflops` (none when there is no rate: a model without compute figures). */
static double at_rate(double flops, double gflops) { return gflops > 0 ? flops / (gflops * 1e9) : 0; }

double hr_cost_step_s(const hr_cost_model *c, const hr_cost_step *s) {
    double mem_s = c->bw_gbps > 0 ? s->bytes / (c->bw_gbps * 1e9) : 0;
    double cmp_s = 0, attn_s = 0;
    if (s->n_tokens > 0) cmp_s += at_rate(s->layer_flops, hr_cost_rate(c, s->n_tokens, false));
    if (s->n_rows > 0) cmp_s += at_rate(s->head_flops, hr_cost_rate(c, s->n_rows, true));
    if (c->attn_gflops > 0) /* measured apart: on a CPU attention runs after the matrices, not beside them */
        attn_s = at_rate(s->attn_flops, c->attn_gflops);
    else
        cmp_s += at_rate(s->attn_flops, hr_cost_rate(c, HR_MAX(1, s->n_tokens), false));
    return HR_MAX(mem_s, cmp_s) + attn_s + c->overhead_s + (double)s->n_rows * c->row_s;
}

void hr_cost_fit_rows(double resid_a, int rows_a, double resid_b, int rows_b, double *overhead_s, double *row_s) {
    double slope = rows_b > rows_a ? (resid_b - resid_a) / (double)(rows_b - rows_a) : 0;
    if (slope < 0) slope = 0;
    double icpt = resid_a - slope * (double)rows_a;
    if (icpt < 0) { /* the line meets zero before one row: keep the slope's share of what was measured */
        icpt = 0;
        slope = HR_MAX(0.0, resid_b) / (double)rows_b;
    }
    *overhead_s = icpt;
    *row_s = slope;
}

void hr_cost_roofline(const hr_plan_device *d, hr_cost_model *out) {
    memset(out, 0, sizeof *out);
    out->bw_gbps = d->bw_gbps;
    out->gflops = d->tflops > 0 ? d->tflops * 1e3 : 0;
    snprintf(out->source, sizeof out->source, "roofline: %.0f GB/s, %.0f TFLOP/s (%s)", d->bw_gbps, d->tflops, d->name);
}

/* The mean of three timings, not the median: the simulator adds step times up, so it needs their
 * expected value, and the interruptions a shared machine adds to some steps are part of it (served
 * steps here: mean 1.01-1.06x their median). */
static double mean3(const double t[3]) { return (t[0] + t[1] + t[2]) / 3; }

#define CAL_MAX_T     512 /* the largest step timed: the engine's default tokens per step */
#define CAL_ATTN_PAST 768
#define CAL_ATTN_T    64

/* Mean of three timings of one forward pass of T tokens of one sequence at positions past ..
 * past + T - 1, the last token producing logits or (all) every one; the `past` cached tokens are
 * computed first, untimed (hr_runtime_time_forward). */
static double time_forward(hr_runtime *rt, int T, int past, bool all, float *logits, hr_error *err, hr_status *st) {
    int32_t tok[CAL_MAX_T], hist[CAL_ATTN_PAST];
    double t[3] = {0};
    if (*st) return 0;
    for (int i = 0; i < past && i < CAL_ATTN_PAST; i++) hist[i] = 3 + i % 97;
    for (int i = 0; i < T; i++) tok[i] = 3 + i % 97;
    *st = hr_runtime_time_forward(rt, hist, HR_MIN(past, CAL_ATTN_PAST), tok, T, all, 3, logits, t, err);
    return mean3(t);
}

#define CAL_PAST 16 /* cached tokens each sequence of a timed decode step has */
#define CAL_SEQS 16

/* Mean of three decode steps of n sequences, each with CAL_PAST cached tokens and every row sampling
 * greedily (temperature 0, what `headroom bench` asks for), run by the runtime's engine
 * (hr_runtime_step: scheduling, block bookkeeping, the forward pass, sampling, each token appended to
 * its request) so that the per-step work a served step does beyond the kernels is in the time. */
static double time_decode(hr_runtime *rt, int n, hr_error *err, hr_status *st) {
    hr_rt_request *rq[CAL_SEQS] = {0};
    int32_t prompt[CAL_PAST];
    double t[3] = {0};
    for (int i = 0; i < n && *st == HR_OK; i++) {
        for (int k = 0; k < CAL_PAST; k++) prompt[k] = 3 + (i * 31 + k * 7) % 97;
        hr_rt_request_params rp = {.prompt_ids = prompt, .n_prompt_ids = CAL_PAST, .max_tokens = 8, .ignore_eos = true};
        rp.sampling = hr_rt_sampling_default();
        rp.sampling.temperature = 0;
        *st = hr_runtime_submit(rt, &rp, &rq[i], err);
    }
    int left = 0;
    if (*st == HR_OK) *st = hr_runtime_step(rt, &left, err); /* the prompts: every one samples its first token */
    for (int rep = 0; rep < 3 && *st == HR_OK; rep++) {
        double t0 = hr_time_now();
        *st = hr_runtime_step(rt, &left, err);
        t[rep] = hr_time_now() - t0;
    }
    for (int i = 0; i < n; i++) hr_rt_request_release(rt, rq[i]);
    /* the rest of their tokens: the next decode starts from an idle engine and a pool without them */
    if (*st == HR_OK) *st = hr_runtime_run_until_idle(rt, err);
    return mean3(t);
}

hr_status hr_cost_calibrate(const char *weight_type, int n_threads, hr_cost_model *out, hr_error *err) {
    memset(out, 0, sizeof *out);
    int type = hr_plan_weight_type_id(weight_type ? weight_type : "q4_0");
    if (type < 0) return hr_error_set(err, HR_ERR_INVALID_ARG, "unknown weight type '%s'", weight_type);
    /* two layers: large enough to leave the caches, quick to build */
    hr_rt_synth synth = {
        .shape = "tinyllama-1.1b", .weight_type = hr_gguf_tensor_type_name((uint32_t)type), .n_layer = 2, .seed = 7};
    hr_runtime_params p = hr_runtime_default_params();
    p.synth = &synth;
    p.raw_ids = true;
    p.n_threads = n_threads;
    p.n_ctx = 1024;
    p.max_batch_tokens = CAL_MAX_T;
    p.max_running = CAL_SEQS;
    p.max_queue = CAL_SEQS;
    p.admission = HR_RT_ADMIT_RESERVE;
    p.kv_blocks = (CAL_ATTN_PAST + CAL_ATTN_T) / 16 + 2 + 2 * CAL_SEQS;
    hr_runtime *rt = NULL;
    hr_status st = hr_runtime_open(&p, &rt, NULL, err);
    if (st) return st;
    hr_runtime_info info;
    hr_runtime_describe(rt, &info);
    const hr_rt_shape *hp = &info.shape;
    float *logits = malloc(sizeof(float) * (size_t)CAL_MAX_T * (size_t)hp->n_vocab);
    if (!logits) st = hr_error_set(err, HR_ERR_NOMEM, "out of memory for the calibration's logits");
    if (st == HR_OK) {
        /* matrix parameters every token goes through (the layers); the output projection's per row */
        double layer =
            (double)hp->n_layer * ((double)hp->n_embd * (hp->n_head + 2 * hp->n_head_kv) * hp->head_dim +
                                   (double)hp->n_head * hp->head_dim * hp->n_embd + 3.0 * hp->n_embd * hp->n_ff);
        double head = (double)hp->n_vocab * hp->n_embd;
        double key_flops = 4.0 * hp->n_layer * hp->n_head * hp->head_dim; /* per query per visible key */
        time_forward(rt, 1, 0, false, logits, err, &st);                  /* warm-up: pages, thread pool */
        time_forward(rt, CAL_MAX_T, 0, true, logits, err, &st);           /* and the largest step's scratch */
        double t1 = time_forward(rt, 1, 0, false, logits, err, &st);
        double bytes = (double)info.weight_bytes;
        out->bw_gbps = t1 > 0 ? bytes / t1 / 1e9 : 0;
        /* attention: the same step after many cached tokens against after none */
        double ta0 = time_forward(rt, CAL_ATTN_T, 0, false, logits, err, &st);
        double ta1 = time_forward(rt, CAL_ATTN_T, CAL_ATTN_PAST, false, logits, err, &st);
        double dkeys = (double)CAL_ATTN_T * CAL_ATTN_PAST;
        out->attn_gflops = ta1 > ta0 ? dkeys * key_flops / (ta1 - ta0) / 1e9 : 0;
        /* one token streams every weight once: the output projection's share of that time is its share
         * of the bytes */
        double head_bytes = bytes * head / (layer + 2.0 * head); /* the layers, the head, the embedding */
        double head1 = t1 * head_bytes / bytes;
        for (int T = 1; T <= CAL_MAX_T && st == HR_OK; T *= 2) {
            double last = T == 1 ? t1 : time_forward(rt, T, 0, false, logits, err, &st);
            double all = T == 1 ? t1 : time_forward(rt, T, 0, true, logits, err, &st);
            double keys = (double)T * (T + 1) / 2;
            double attn_s = out->attn_gflops > 0 ? keys * key_flops / (out->attn_gflops * 1e9) : 0;
            double layers_s = HR_MAX(last - attn_s - head1, 0.25 * last); /* noise cannot make it vanish */
            double head_s = HR_MAX(all - last + head1, 0.25 * head1);
            out->curve_tokens[out->n_curve] = T;
            out->curve_gflops[out->n_curve] = 2.0 * layer * T / layers_s / 1e9;
            out->curve_head[out->n_curve++] = 2.0 * head * T / head_s / 1e9;
        }
        out->gflops = out->n_curve ? out->curve_gflops[out->n_curve - 1] : 0;
        double t4 = time_decode(rt, 4, err, &st);
        double t16 = time_decode(rt, CAL_SEQS, err, &st);
        if (st == HR_OK) {
            /* the decode steps as the simulator prices them (sim.c); what they took beyond that is the
             * per-step and per-row cost */
            double tok_kv = (double)hr_runtime_budget(rt)->token_bytes;
            double r[2];
            int rows[2] = {4, CAL_SEQS};
            double meas[2] = {t4, t16};
            for (int k = 0; k < 2; k++) {
                hr_cost_step s = {.bytes = bytes + rows[k] * (CAL_PAST + 1) * tok_kv,
                                  .layer_flops = 2.0 * layer * rows[k],
                                  .n_tokens = rows[k],
                                  .head_flops = 2.0 * head * rows[k],
                                  .n_rows = rows[k],
                                  .attn_flops = key_flops * rows[k] * (CAL_PAST + 1)};
                r[k] = meas[k] - hr_cost_step_s(out, &s);
            }
            hr_cost_fit_rows(r[0], rows[0], r[1], rows[1], &out->overhead_s, &out->row_s);
            snprintf(out->source, sizeof out->source,
                     "calibrated here: %s, %d threads, %.1f GB/s; GFLOP/s at 1, 16 and %d tokens: layers %.0f, %.0f, "
                     "%.0f, output %.0f, %.0f, %.0f, attention %.0f; %.2f ms/step + %.2f ms/row",
                     hr_gguf_tensor_type_name((uint32_t)type), info.n_threads, out->bw_gbps, CAL_MAX_T,
                     hr_cost_rate(out, 1, false), hr_cost_rate(out, 16, false), out->gflops, hr_cost_rate(out, 1, true),
                     hr_cost_rate(out, 16, true), hr_cost_rate(out, CAL_MAX_T, true), out->attn_gflops,
                     out->overhead_s * 1e3, out->row_s * 1e3);
        }
    }
    hr_runtime_close(rt);
    free(logits);
    return st;
}

hr_status hr_cost_save(const hr_cost_model *c, const char *path, hr_error *err) {
    json_t *curve = json_array();
    for (int i = 0; curve && i < c->n_curve; i++)
        json_array_append_new(curve, json_pack("[i,f,f]", c->curve_tokens[i], c->curve_gflops[i], c->curve_head[i]));
    json_t *o = json_pack("{s:f,s:f,s:o,s:f,s:f,s:f,s:s}", "bw_gbps", c->bw_gbps, "gflops", c->gflops,
                          "gflops_at_tokens", curve, "attn_gflops", c->attn_gflops, "overhead_s", c->overhead_s,
                          "row_s", c->row_s, "source", c->source);
    int rc = o ? json_dump_file(o, path, JSON_INDENT(2)) : -1;
    json_decref(o);
    return rc == 0 ? HR_OK : hr_error_set(err, HR_ERR_IO, "cannot write the calibration to '%s'", path);
}

/* A number >= 0 from the object, 0 when absent (older files) or not a number. */
static double opt_number(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? HR_MAX(0.0, json_number_value(v)) : 0;
}

hr_status hr_cost_load(const char *path, hr_cost_model *out, hr_error *err) {
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o) return hr_error_set(err, HR_ERR_IO, "cannot read the calibration '%s': %s", path, je.text);
    json_t *bw = json_object_get(o, "bw_gbps"), *fl = json_object_get(o, "gflops");
    json_t *curve = json_object_get(o, "gflops_at_tokens");
    hr_status st = HR_OK;
    if (!json_is_number(bw) || json_number_value(bw) <= 0 || !json_is_number(fl) || json_number_value(fl) <= 0)
        st = hr_error_set(err, HR_ERR_FORMAT,
                          "calibration '%s' lacks positive \"bw_gbps\" and \"gflops\" (write it with headroom plan "
                          "--calibrate FILE)",
                          path);
    else if (curve && (!json_is_array(curve) || json_array_size(curve) > HR_COST_CURVE))
        st = hr_error_set(err, HR_ERR_FORMAT,
                          "calibration '%s': \"gflops_at_tokens\" must be an array of at most %d [tokens, layers "
                          "GFLOP/s, output GFLOP/s]",
                          path, HR_COST_CURVE);
    else {
        out->bw_gbps = json_number_value(bw);
        out->gflops = json_number_value(fl);
        out->overhead_s = opt_number(o, "overhead_s");
        out->row_s = opt_number(o, "row_s"); /* older files: none */
        out->attn_gflops = opt_number(o, "attn_gflops");
        size_t i;
        json_t *pt;
        json_array_foreach(curve, i, pt) {
            json_t *n = json_array_get(pt, 0), *g = json_array_get(pt, 1), *h = json_array_get(pt, 2);
            int prev = out->n_curve ? out->curve_tokens[out->n_curve - 1] : 0;
            if (!json_is_array(pt) || json_array_size(pt) != 3 || !json_is_integer(n) || !json_is_number(g) ||
                !json_is_number(h) || json_integer_value(n) <= prev || json_integer_value(n) > (1 << 20) ||
                json_number_value(g) <= 0 || json_number_value(h) <= 0) {
                st = hr_error_set(err, HR_ERR_FORMAT,
                                  "calibration '%s': \"gflops_at_tokens\" entry %zu is not [tokens, layers GFLOP/s, "
                                  "output GFLOP/s] with tokens ascending and all positive",
                                  path, i);
                break;
            }
            out->curve_tokens[out->n_curve] = (int)json_integer_value(n);
            out->curve_gflops[out->n_curve] = json_number_value(g);
            out->curve_head[out->n_curve++] = json_number_value(h);
        }
        const char *src = json_string_value(json_object_get(o, "source"));
        snprintf(out->source, sizeof out->source, "%s", src ? src : path);
    }
    json_decref(o);
    return st;
}

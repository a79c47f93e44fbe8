/* cost.c: how long one engine step takes, for the simulator: measured once on this machine (the real
 * forward pass of a synthetic TinyLlama-shaped model at T = 1 and T = 128, and engine decode steps of
 * 4 and 16 sequences with sampling), saved as JSON, or a GPU's roofline from its datasheet. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "engine/engine.h"
#include "model/synth.h"
#include "plan/plan.h"
#include "sampler/sampler.h"

double hr_cost_step_s(const hr_cost_model *c, double bytes, double flops, int n_rows) {
    double mem_s = c->bw_gbps > 0 ? bytes / (c->bw_gbps * 1e9) : 0;
    double cmp_s = c->gflops > 0 ? flops / (c->gflops * 1e9) : 0;
    return HR_MAX(mem_s, cmp_s) + c->overhead_s + (double)n_rows * c->row_s;
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

/* Median of three timings of one forward pass of T tokens (positions after `past` cached ones). */
static double time_forward(hr_model_ctx *ctx, hr_kv_pool *kv, int T, hr_error *err, hr_status *st) {
    int32_t tok[128], pos[128];
    hr_kv_seq seq[128];
    uint8_t want[128];
    hr_kv_seq s;
    double t[3] = {0};
    for (int rep = 0; rep < 3 && *st == HR_OK; rep++) {
        if ((*st = hr_kv_seq_create(kv, &s, err))) break;
        if ((*st = hr_kv_seq_reserve(kv, s, T, err))) break;
        for (int i = 0; i < T; i++) tok[i] = 3 + i, pos[i] = i, seq[i] = s, want[i] = i == T - 1;
        hr_batch b = {.n_tokens = T, .tokens = tok, .pos = pos, .seq = seq, .want_logits = want};
        static float logits[32000];
        double t0 = hr_time_now();
        *st = hr_model_forward(ctx, &b, logits, err);
        t[rep] = hr_time_now() - t0;
        hr_kv_seq_free(kv, s);
    }
    double a = t[0], b = t[1], c = t[2];
    return a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
}

#define CAL_PAST 16 /* cached tokens each sequence of a timed decode step has */
#define CAL_SEQS 16

/* Median of three decode steps of n sequences, each with CAL_PAST cached tokens and every row sampling
 * greedily (temperature 0, what `headroom bench` asks for), run by the real engine (hr_engine_step:
 * scheduling, block bookkeeping, the forward pass, sampling, each token appended to its request) so
 * that the per-step work a served step does beyond the kernels is in the time. */
static double time_decode(const hr_model *model, hr_model_ctx *ctx, hr_kv_pool *kv, int n, hr_error *err,
                          hr_status *st) {
    hr_engine_params ep = {.model = model,
                           .ctx = ctx,
                           .kv = kv,
                           .n_ctx = 256,
                           .max_batch_tokens = CAL_SEQS * CAL_PAST,
                           .max_running = CAL_SEQS,
                           .max_queue = CAL_SEQS,
                           .admission = HR_ADMIT_RESERVE};
    hr_engine *e = NULL;
    hr_request *rq[CAL_SEQS] = {0};
    int32_t prompt[CAL_PAST];
    double t[3] = {0};
    if (*st == HR_OK) *st = hr_engine_create(&ep, &e, err);
    for (int i = 0; i < n && *st == HR_OK; i++) {
        for (int k = 0; k < CAL_PAST; k++) prompt[k] = 3 + (i * 31 + k * 7) % 97;
        hr_request_params rp = {.prompt = prompt, .n_prompt = CAL_PAST, .max_tokens = 8, .ignore_eos = true};
        rp.sampling = hr_sampler_default_params();
        rp.sampling.temperature = 0;
        *st = hr_engine_submit(e, &rp, &rq[i], err);
    }
    int left = 0;
    if (*st == HR_OK) *st = hr_engine_step(e, &left, err); /* the prompts: every one samples its first token */
    for (int rep = 0; rep < 3 && *st == HR_OK; rep++) {
        double t0 = hr_time_now();
        *st = hr_engine_step(e, &left, err);
        t[rep] = hr_time_now() - t0;
    }
    for (int i = 0; i < n; i++) hr_request_release(rq[i]);
    hr_engine_destroy(e);
    double a = t[0], b = t[1], c = t[2];
    return a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
}

hr_status hr_cost_calibrate(const char *weight_type, int n_threads, hr_cost_model *out, hr_error *err) {
    memset(out, 0, sizeof *out);
    int type = hr_plan_weight_type_id(weight_type ? weight_type : "q4_0");
    if (type < 0) return hr_error_set(err, HR_ERR_INVALID_ARG, "unknown weight type '%s'", weight_type);
    hr_synth_shape shape;
    hr_status st = hr_synth_shape_by_name("tinyllama-1.1b", &shape, err);
    if (st) return st;
    shape.n_layer = 2; /* two layers: large enough to leave the caches, quick to build */
    hr_model *model = NULL;
    void *file = NULL;
    if ((st = hr_synth_model(&shape, (hr_dtype)type, 7, &model, &file, err))) return st;
    const hr_hparams *hp = hr_model_hparams(model);
    hr_kv_config kc = {.n_layers = hp->n_layer,
                       .n_kv_heads = hp->n_head_kv,
                       .head_dim = hp->head_dim,
                       .block_size = 16,
                       .k_format = HR_KV_F16,
                       .v_format = HR_KV_F16,
                       .max_seqs = CAL_SEQS,
                       .budget_bytes = 0};
    kc.budget_bytes = hr_kv_fixed_bytes(&kc) + hr_kv_block_bytes(&kc) * (16 + 2 * CAL_SEQS);
    hr_kv_pool *kv = NULL;
    hr_model_ctx *ctx = NULL;
    hr_model_ctx_params mp = {.n_threads = n_threads, .max_batch_tokens = CAL_SEQS * CAL_PAST, .max_ctx = 256};
    if ((st = hr_kv_pool_create(&kc, &kv, err)) == HR_OK &&
        (st = hr_model_ctx_create(model, kv, &mp, &ctx, err)) == HR_OK) {
        time_forward(ctx, kv, 1, err, &st); /* warm-up: pages, thread pool */
        double t1 = time_forward(ctx, kv, 1, err, &st);
        double t128 = time_forward(ctx, kv, 128, err, &st);
        double t4 = time_decode(model, ctx, kv, 4, err, &st);
        double t16 = time_decode(model, ctx, kv, CAL_SEQS, err, &st);
        if (st == HR_OK) {
            double bytes = (double)hr_model_weight_bytes(model);
            /* matrix parameters every token goes through (the layers); the output projection runs
             * only for the rows that want logits */
            double layer =
                (double)hp->n_layer * ((double)hp->n_embd * (hp->n_head + 2 * hp->n_head_kv) * hp->head_dim +
                                       (double)hp->n_head * hp->head_dim * hp->n_embd + 3.0 * hp->n_embd * hp->n_ff);
            double head = (double)hp->n_vocab * hp->n_embd;
            out->bw_gbps = bytes / t1 / 1e9;
            out->gflops = 2.0 * (layer * 128 + head) / t128 / 1e9;
            /* the decode steps as the simulator prices them (sim.c: weights once, each row's visible
             * KV, 2 flops per parameter and 4 per head dimension per visible key); what the kernels
             * took beyond that is the per-step and per-row cost */
            double tok_kv = (double)hr_kv_block_bytes(&kc) / kc.block_size;
            double attn = 4.0 * hp->n_layer * hp->n_head * hp->head_dim * (CAL_PAST + 1);
            double r[2];
            int rows[2] = {4, CAL_SEQS};
            double meas[2] = {t4, t16};
            for (int k = 0; k < 2; k++)
                r[k] = meas[k] - hr_cost_step_s(out, bytes + rows[k] * (CAL_PAST + 1) * tok_kv,
                                                rows[k] * (2.0 * (layer + head) + attn), 0);
            hr_cost_fit_rows(r[0], rows[0], r[1], rows[1], &out->overhead_s, &out->row_s);
            snprintf(out->source, sizeof out->source,
                     "calibrated here: %s, %d threads, %.1f GB/s, %.1f GFLOP/s, %.2f ms/step + %.2f ms/row",
                     hr_gguf_tensor_type_name((uint32_t)type), hr_model_ctx_n_threads(ctx), out->bw_gbps, out->gflops,
                     out->overhead_s * 1e3, out->row_s * 1e3);
        }
    }
    hr_model_ctx_destroy(ctx);
    hr_kv_pool_destroy(kv);
    hr_model_destroy(model);
    free(file);
    return st;
}

hr_status hr_cost_save(const hr_cost_model *c, const char *path, hr_error *err) {
    json_t *o = json_pack("{s:f,s:f,s:f,s:f,s:s}", "bw_gbps", c->bw_gbps, "gflops", c->gflops, "overhead_s",
                          c->overhead_s, "row_s", c->row_s, "source", c->source);
    int rc = o ? json_dump_file(o, path, JSON_INDENT(2)) : -1;
    json_decref(o);
    return rc == 0 ? HR_OK : hr_error_set(err, HR_ERR_IO, "cannot write the calibration to '%s'", path);
}

hr_status hr_cost_load(const char *path, hr_cost_model *out, hr_error *err) {
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o) return hr_error_set(err, HR_ERR_IO, "cannot read the calibration '%s': %s", path, je.text);
    json_t *bw = json_object_get(o, "bw_gbps"), *fl = json_object_get(o, "gflops");
    hr_status st = HR_OK;
    if (!json_is_number(bw) || json_number_value(bw) <= 0 || !json_is_number(fl) || json_number_value(fl) <= 0)
        st = hr_error_set(err, HR_ERR_FORMAT,
                          "calibration '%s' lacks positive \"bw_gbps\" and \"gflops\" (write it with headroom plan "
                          "--calibrate FILE)",
                          path);
    else {
        out->bw_gbps = json_number_value(bw);
        out->gflops = json_number_value(fl);
        json_t *oh = json_object_get(o, "overhead_s");
        json_t *rw = json_object_get(o, "row_s");
        out->overhead_s = json_is_number(oh) ? HR_MAX(0.0, json_number_value(oh)) : 0;
        out->row_s = json_is_number(rw) ? HR_MAX(0.0, json_number_value(rw)) : 0; /* older files: none */
        const char *src = json_string_value(json_object_get(o, "source"));
        snprintf(out->source, sizeof out->source, "%s", src ? src : path);
    }
    json_decref(o);
    return st;
}

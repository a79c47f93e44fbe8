/* cost.c: how long one engine step takes, for the simulator: measured once on this machine (the real
 * forward pass of a synthetic TinyLlama-shaped model at T = 1 and T = 128), saved as JSON, or a GPU's
 * roofline from its datasheet. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "common/util.h"
#include "model/synth.h"
#include "plan/plan.h"

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
                       .max_seqs = 2,
                       .budget_bytes = 0};
    kc.budget_bytes = hr_kv_block_bytes(&kc) * 16;
    hr_kv_pool *kv = NULL;
    hr_model_ctx *ctx = NULL;
    hr_model_ctx_params mp = {.n_threads = n_threads, .max_batch_tokens = 128, .max_ctx = 256};
    if ((st = hr_kv_pool_create(&kc, &kv, err)) == HR_OK &&
        (st = hr_model_ctx_create(model, kv, &mp, &ctx, err)) == HR_OK) {
        time_forward(ctx, kv, 1, err, &st); /* warm-up: pages, thread pool */
        double t1 = time_forward(ctx, kv, 1, err, &st);
        double t128 = time_forward(ctx, kv, 128, err, &st);
        if (st == HR_OK) {
            double bytes = (double)hr_model_weight_bytes(model);
            /* matrix parameters every token goes through (the layers); the output projection runs
             * only for the one row that wants logits */
            double layer =
                (double)hp->n_layer * ((double)hp->n_embd * (hp->n_head + 2 * hp->n_head_kv) * hp->head_dim +
                                       (double)hp->n_head * hp->head_dim * hp->n_embd + 3.0 * hp->n_embd * hp->n_ff);
            double head = (double)hp->n_vocab * hp->n_embd;
            out->bw_gbps = bytes / t1 / 1e9;
            out->gflops = 2.0 * (layer * 128 + head) / t128 / 1e9;
            out->overhead_s = 0;
            snprintf(out->source, sizeof out->source, "calibrated here: %s, %d threads, %.1f GB/s, %.1f GFLOP/s",
                     hr_gguf_tensor_type_name((uint32_t)type), hr_model_ctx_n_threads(ctx), out->bw_gbps, out->gflops);
        }
    }
    hr_model_ctx_destroy(ctx);
    hr_kv_pool_destroy(kv);
    hr_model_destroy(model);
    free(file);
    return st;
}

hr_status hr_cost_save(const hr_cost_model *c, const char *path, hr_error *err) {
    json_t *o = json_pack("{s:f,s:f,s:f,s:s}", "bw_gbps", c->bw_gbps, "gflops", c->gflops, "overhead_s", c->overhead_s,
                          "source", c->source);
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
        out->overhead_s = json_is_number(oh) ? json_number_value(oh) : 0;
        const char *src = json_string_value(json_object_get(o, "source"));
        snprintf(out->source, sizeof out->source, "%s", src ? src : path);
    }
    json_decref(o);
    return st;
}

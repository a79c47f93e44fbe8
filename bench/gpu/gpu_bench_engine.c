/* gpu_bench_engine.c: gpu_bench's sections 5 and 6 (gpu_bench.c has what each measures), which drive the
 * runtime on the GPU (it opens its own device): decode and prefill steps end to end on a synthetic
 * Llama-3-8B-shaped model, launch by launch and as CUDA graphs; the engine's concurrent sessions at one KV
 * budget per KV format. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "gpu_bench.h"
#include "runtime/runtime.h"
#include "runtime/runtime_parts.h"
#include "tensor/tensor.h"

/* ---- 5. end to end through the runtime ----------------------------------------------------------------- */

/* bytes one decode step streams: every layer's matrices and norms and the output matrix (the token
 * embedding is a lookup of the batch's rows, not counted) */
static uint64_t streamed_bytes(const hr_rt_shape *s, hr_dtype t, int n_layer) {
    uint64_t E = (uint64_t)s->n_embd, F = (uint64_t)s->n_ff, hd = (uint64_t)s->head_dim;
    uint64_t qd = (uint64_t)s->n_head * hd, kvd = (uint64_t)s->n_head_kv * hd;
    uint64_t re = hr_dtype_row_bytes(t, (int64_t)E), rf = hr_dtype_row_bytes(t, (int64_t)F),
             rq = hr_dtype_row_bytes(t, (int64_t)qd);
    uint64_t layer = qd * re + 2 * kvd * re + E * rq + 2 * F * re + E * rf + 2 * E * 4;
    return (uint64_t)n_layer * layer + (uint64_t)s->n_vocab * re + E * 4;
}

static void e2e_stats(hr_runtime *rt, hr_rt_engine_stats *s) {
    hr_runtime_pool pool;
    hr_runtime_get_pool(rt, &pool);
    *s = pool.engine;
}

/* one engine step, its wall-clock ms and the engine's counters before and after it */
static hr_status timed_step(hr_runtime *rt, int *left, double *ms, hr_rt_engine_stats *s0, hr_rt_engine_stats *s1,
                            hr_error *e) {
    e2e_stats(rt, s0);
    double t0 = hr_time_now();
    hr_status st = hr_runtime_step(rt, left, e);
    *ms = (hr_time_now() - t0) * 1e3;
    e2e_stats(rt, s1);
    return st;
}

/* a greedy request of `prompt` random ids (ids: room for them) */
static hr_status submit_random(gpu_bench *g, hr_runtime *rt, int n_vocab, int32_t *ids, int prompt, int max_tokens,
                               hr_rt_request **req, hr_error *e) {
    for (int k = 0; k < prompt; k++) ids[k] = (int32_t)((gb_frand(g) + 1.0f) * 0.5f * (float)(n_vocab - 1));
    hr_rt_request_params q = {.prompt_ids = ids, .n_prompt_ids = prompt, .max_tokens = max_tokens, .ignore_eos = true};
    q.sampling = hr_rt_sampling_default();
    q.sampling.temperature = 0;
    return hr_runtime_submit(rt, &q, req, e);
}

/* B requests of `prompt` random ids each, stepped until every one is decoding; then `steps` timed steps
 * that each decode exactly B tokens (warm-up steps first). Median wall-clock ms per step, or NAN. */
static double e2e_decode(gpu_bench *g, hr_runtime *rt, int n_vocab, int B, int prompt, int warm, int steps, row *r) {
    hr_error e = {0};
    hr_rt_request **req = calloc((size_t)B, sizeof *req);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)prompt);
    double *v = malloc(sizeof(double) * (size_t)steps);
    if (!req || !ids || !v) {
        fprintf(stderr, "gpu_bench: out of memory\n");
        exit(1);
    }
    bool ok = true;
    for (int i = 0; i < B && ok; i++)
        if (submit_random(g, rt, n_vocab, ids, prompt, warm + steps + 8, &req[i], &e))
            ok = gb_dev_fail(g, r, "submit", &e);
    int n_timed = 0, n_warm = 0, guard = 0;
    while (ok && n_timed < steps && guard++ < 10000) {
        hr_rt_engine_stats s0, s1;
        int left = 0;
        double ms;
        if (timed_step(rt, &left, &ms, &s0, &s1, &e)) {
            ok = gb_dev_fail(g, r, "step", &e);
            break;
        }
        if (s1.failed != s0.failed) {
            e.code = HR_ERR_UNSUPPORTED;
            snprintf(e.msg, sizeof e.msg, "a request failed");
            ok = gb_dev_fail(g, r, "step", &e);
            break;
        }
        bool pure = s1.batch_tokens - s0.batch_tokens == (uint64_t)B && s1.prefill_tokens == s0.prefill_tokens;
        if (!pure) continue;
        if (n_warm < warm)
            n_warm++;
        else
            v[n_timed++] = ms;
        if (left == 0) break;
    }
    double med = NAN;
    if (ok && n_timed < steps) {
        e.code = HR_ERR_UNSUPPORTED;
        snprintf(e.msg, sizeof e.msg, "only %d decode steps of %d tokens", n_timed, B);
        gb_dev_fail(g, r, "steps", &e);
    } else if (ok) {
        /* the check: every request still running or finished without failing, each with its ids */
        int bad = 0;
        for (int i = 0; i < B; i++) {
            hr_rt_result res;
            hr_rt_request_result(req[i], &res);
            if (res.status != HR_OK || res.n_ids < warm + steps) bad++;
        }
        if (gb_verdict(g, r, bad == 0, "requests short or failed:", (double)bad)) {
            snprintf(r->check, sizeof r->check, "ok (%d requests, %d+ ids each)", B, warm + steps);
            med = gb_median(v, n_timed);
            r->median_ms = med;
            r->loops = n_timed;
            r->reps = 1;
        }
    }
    for (int i = 0; i < B; i++)
        if (req[i]) hr_rt_request_release(rt, req[i]); /* cancels what is unfinished */
    free(req), free(ids), free(v);
    return med;
}

/* one request of `prompt` random ids, max_tokens 1: the wall-clock time of the step that computes its
 * whole prompt (max_batch_tokens >= prompt), median over reps; NAN if none */
static double e2e_prefill(gpu_bench *g, hr_runtime *rt, int n_vocab, int prompt, int reps, row *r) {
    hr_error e = {0};
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)prompt);
    double v[8];
    int n = 0;
    bool ok = ids != NULL;
    for (int k = 0; k < reps && ok; k++) {
        hr_rt_request *req = NULL;
        if (submit_random(g, rt, n_vocab, ids, prompt, 1, &req, &e)) {
            ok = gb_dev_fail(g, r, "submit", &e);
            break;
        }
        int left = 1, guard = 0;
        while (left > 0 && guard++ < 100) {
            hr_rt_engine_stats s0, s1;
            double ms;
            if (timed_step(rt, &left, &ms, &s0, &s1, &e)) {
                ok = gb_dev_fail(g, r, "step", &e);
                break;
            }
            if (s1.prefill_tokens - s0.prefill_tokens == (uint64_t)prompt && n < 8) v[n++] = ms;
        }
        hr_rt_result res;
        hr_rt_request_result(req, &res);
        if (ok && (res.status != HR_OK || res.n_ids != 1)) {
            e.code = HR_ERR_UNSUPPORTED;
            snprintf(e.msg, sizeof e.msg, "the request ended with %d ids: %s", res.n_ids, res.error ? res.error : "?");
            ok = gb_dev_fail(g, r, "prefill", &e);
        }
        hr_rt_request_release(rt, req);
    }
    free(ids);
    if (!ok) return NAN;
    if (!gb_verdict(g, r, n == reps, "one-step prefills missing:", (double)(reps - n))) return NAN;
    snprintf(r->check, sizeof r->check, "ok (%d one-step prefills)", n);
    r->loops = n;
    r->reps = 1;
    return r->median_ms = gb_median(v, n);
}

/* how a decode row runs: launch by launch, replayed as CUDA graphs, or as graphs with the greedy ids
 * picked on the device (hr_cuda_backend_set_argmax: the ids come down, not the logits) */
enum { E2E_EAGER, E2E_GRAPHS, E2E_ARGMAX };

/* one decode row: batch B run as `mode` says; *ms its median step */
static void e2e_decode_row(gpu_bench *g, hr_runtime *rt, const hr_runtime_info *info, int B, int prompt, int warm,
                           int steps, const char *desc, uint64_t bytes, uint64_t bytes_full, int layers, int mode,
                           double *ms_out) {
    static const char *const names[] = {"decode", "graphs", "argmax"};
    static const char *const how[] = {"", ", CUDA graphs", ", CUDA graphs, argmax on the device"};
    char what[40];
    snprintf(what, sizeof what, "%s batch %d", names[mode], B);
    row r = gb_new_row("e2e", what);
    snprintf(r.shape, sizeof r.shape, "%s, prompt %d%s", desc, prompt, how[mode]);
    snprintf(r.unit, sizeof r.unit, "tokens/s");
    json_t *xj = json_object();
    json_object_set_new(xj, "batch", json_integer(B));
    json_object_set_new(xj, "graphs", json_boolean(mode != E2E_EAGER));
    json_object_set_new(xj, "device_argmax", json_boolean(mode == E2E_ARGMAX));
    if (gb_out_of_time(g))
        snprintf(r.check, sizeof r.check, "skipped: time budget (--max-seconds)");
    else {
        double ms = e2e_decode(g, rt, info->n_vocab, B, prompt, warm, steps, &r);
        *ms_out = ms;
        if (isfinite(ms)) {
            r.value = B / (ms * 1e-3);
            double gbs = (double)bytes / (ms * 1e-3) / 1e9;
            json_object_set_new(xj, "weight_gb_per_s", json_real(gbs));
            json_object_set_new(xj, "pct_weight_bw_of_copy", gb_jnum(gb_pct(gbs, g->copy_gbs)));
            if (layers != 32 && !g->o.quick) /* the whole model's step, if time scales with the bytes */
                json_object_set_new(xj, "projected_tokens_per_s_32_layers",
                                    json_real(B / (ms * 1e-3 * (double)bytes_full / (double)bytes)));
            if (B == 1) { /* the figure: weight bytes / batch-1 step time */
                r.pct_copy = gb_pct(gbs, g->copy_gbs);
                snprintf(r.target, sizeof r.target, "weights >= %.0f%% of copy", E2E_TARGET_PCT);
                r.pct_target = gb_pct(r.pct_copy, E2E_TARGET_PCT);
            }
        }
    }
    gb_add_row(g, &r, xj);
}

void gb_bench_e2e(gpu_bench *g) {
    const char *shape = g->o.quick ? "tiny" : "llama-3-8b";
    /* synthesis on the host dominates: about 3 s a layer there, by this machine's 12 ns a weight, and
     * 40 s for the rest (embedding, output, the runs); fewer layers than asked when the time left is short */
    int layers = g->o.quick ? 1 : g->o.e2e_layers;
    if (!g->o.quick) {
        int fit = (int)((g->deadline - hr_time_now() - 40.0) / 4.0);
        if (fit < layers) {
            printf("  (e2e: %d layers instead of %d: the time left (--max-seconds) holds no more)\n", fit, layers);
            layers = fit;
        }
    }
    static const int batches_full[] = {1, 16, 64}, batches_quick[] = {1, 4};
    const int *batches = g->o.quick ? batches_quick : batches_full;
    const int n_b = g->o.quick ? 2 : 3, prompt = g->o.quick ? 8 : 16, warm = g->o.quick ? 1 : 3,
              steps = g->o.quick ? 3 : 12;
    const int pre_prompt = g->o.quick ? 32 : 512, pre_reps = g->o.quick ? 2 : 3;
    char desc[80];
    snprintf(desc, sizeof desc, "%s bf16, %d of its layers, f16 KV", shape, layers);
    if (layers < 1) {
        gb_skip_row(g, "e2e", "decode", desc, "time budget (--max-seconds)");
        return;
    }
    hr_rt_synth sy = {.shape = shape, .weight_type = "bf16", .n_layer = layers, .seed = 7};
    hr_runtime_params p = hr_runtime_default_params();
    p.synth = &sy;
    p.device = "cuda";
    p.cuda_driver = g->o.driver;
    p.raw_ids = true;
    p.n_ctx = g->o.quick ? 128 : 1024;
    p.kv_seqs = batches[n_b - 1];
    p.max_running = batches[n_b - 1];
    p.max_batch_tokens = pre_prompt;
    p.k_format = p.v_format = HR_RT_KV_F16;
    hr_runtime *rt = NULL;
    hr_error e = {0};
    double t0 = hr_time_now();
    printf("  (e2e: synthesizing %s in memory and opening it on the GPU...)\n", desc);
    fflush(stdout);
    hr_status st = hr_runtime_open(&p, &rt, NULL, &e);
    double open_s = hr_time_now() - t0;
    json_t *e2e = json_object();
    json_object_set_new(g->jroot, "e2e_model", e2e);
    json_object_set_new(e2e, "shape", json_string(shape));
    json_object_set_new(e2e, "weight_type", json_string("bf16"));
    json_object_set_new(e2e, "n_layer", json_integer(layers));
    json_object_set_new(e2e, "n_layer_asked", json_integer(g->o.quick ? 1 : g->o.e2e_layers));
    json_object_set_new(e2e, "kv_format", json_string("f16"));
    json_object_set_new(e2e, "open_seconds", json_real(open_s));
    json_object_set_new(e2e, "timing",
                        json_string("host wall clock per hr_runtime_step (forward, logits download, "
                                    "sampling), median over the steps"));
    if (st) {
        row r = gb_new_row("e2e", "open");
        snprintf(r.shape, sizeof r.shape, "%s", desc);
        gb_dev_fail(g, &r, "open", &e);
        gb_add_row(g, &r, NULL);
        return;
    }
    hr_runtime_info info;
    hr_runtime_describe(rt, &info);
    const uint64_t bytes = streamed_bytes(&info.shape, HR_DTYPE_BF16, layers);
    const uint64_t bytes_full = streamed_bytes(&info.shape, HR_DTYPE_BF16, g->o.quick ? layers : 32);
    json_object_set_new(e2e, "weight_bytes", json_integer((json_int_t)info.weight_bytes));
    json_object_set_new(e2e, "streamed_bytes_per_step", json_integer((json_int_t)bytes));
    json_object_set_new(e2e, "streamed_bytes_per_step_32_layers", json_integer((json_int_t)bytes_full));
    printf("  (e2e: opened in %.1f s; %.2f GB of weights streamed per step)\n", open_s, bytes / 1e9);
    for (int bi = 0; bi < n_b; bi++) {
        const int B = batches[bi];
        double ms_eager = NAN, ms_graphs = NAN, ms_argmax = NAN;
        e2e_decode_row(g, rt, &info, B, prompt, warm, steps, desc, bytes, bytes_full, layers, E2E_EAGER, &ms_eager);
        if (!hr_cuda_backend_set_graphs(hr_runtime_ctx(rt), true)) {
            char what[40];
            snprintf(what, sizeof what, "graphs batch %d", B);
            gb_skip_row(g, "e2e", what, desc, "the driver has no CUDA graphs");
            continue;
        }
        e2e_decode_row(g, rt, &info, B, prompt, warm, steps, desc, bytes, bytes_full, layers, E2E_GRAPHS, &ms_graphs);
        hr_cuda_backend_set_argmax(hr_runtime_ctx(rt), true);
        e2e_decode_row(g, rt, &info, B, prompt, warm, steps, desc, bytes, bytes_full, layers, E2E_ARGMAX, &ms_argmax);
        hr_cuda_backend_set_argmax(hr_runtime_ctx(rt), false);
        hr_cuda_backend_set_graphs(hr_runtime_ctx(rt), false);
        /* the two side by side: > 1, the graphs are faster */
        char prefix[32];
        snprintf(prefix, sizeof prefix, "decode batch %d", B);
        json_t *xj = json_object();
        json_object_set_new(xj, "batch", json_integer(B));
        gb_add_ratio(g, gb_new_row("e2e", "eager/graphs"), prefix, "eager", NULL, ms_eager, "graphs", NULL, ms_graphs,
                     "run", xj);
        /* > 1: picking the ids on the device beats copying the logits down (HEADROOM_CUDA_ARGMAX=device) */
        xj = json_object();
        json_object_set_new(xj, "batch", json_integer(B));
        gb_add_ratio(g, gb_new_row("e2e", "logits/argmax"), prefix, "logits", NULL, ms_graphs, "argmax", NULL,
                     ms_argmax, "run", xj);
    }
    row r = gb_new_row("e2e", "prefill");
    snprintf(r.shape, sizeof r.shape, "%s, one %d-token prompt a step", desc, pre_prompt);
    snprintf(r.unit, sizeof r.unit, "tokens/s");
    json_t *xj = json_object();
    json_object_set_new(xj, "prompt", json_integer(pre_prompt));
    if (gb_out_of_time(g))
        snprintf(r.check, sizeof r.check, "skipped: time budget (--max-seconds)");
    else {
        double ms = e2e_prefill(g, rt, info.n_vocab, pre_prompt, pre_reps, &r);
        if (isfinite(ms)) {
            r.value = pre_prompt / (ms * 1e-3);
            double flop = 2.0 * (double)pre_prompt * (double)bytes / 2.0; /* bf16: 2 bytes a weight */
            json_object_set_new(xj, "matmul_tflop_per_s", json_real(flop / (ms * 1e-3) / 1e12));
            if (layers != 32 && !g->o.quick)
                json_object_set_new(xj, "projected_tokens_per_s_32_layers",
                                    json_real(pre_prompt / (ms * 1e-3 * (double)bytes_full / (double)bytes)));
        }
    }
    gb_add_row(g, &r, xj);
    hr_runtime_close(rt);
}

/* ---- 6. capacity: concurrent sessions at one KV budget --------------------------------------------------- */

/* One format: the runtime on the GPU with a KV pool of `budget` bytes, reserve admission (a request is
 * admitted only when its prompt + max_tokens fit, and never preempted), n_req requests that each claim
 * ctx positions (16 prompt tokens, ctx - 16 to generate). After a few steps the engine runs as many as
 * the pool holds: peak_running, checked against floor(blocks / blocks a session claims). Returns the
 * sessions, or -1. */
static int capacity_one(gpu_bench *g, hr_rt_kv_format f, const char *shape, int ctx, uint64_t budget, int n_req, row *r,
                        json_t *xj) {
    hr_rt_synth sy = {.shape = shape, .weight_type = "bf16", .seed = 7};
    hr_runtime_params p = hr_runtime_default_params();
    p.synth = &sy;
    p.device = "cuda";
    p.cuda_driver = g->o.driver;
    p.raw_ids = true;
    p.n_ctx = ctx;
    p.kv_budget = budget;
    p.admission = HR_RT_ADMIT_RESERVE;
    p.max_running = n_req;
    p.block_size = 16;
    p.k_format = p.v_format = f;
    hr_runtime *rt = NULL;
    hr_error e = {0};
    if (hr_runtime_open(&p, &rt, NULL, &e)) {
        gb_dev_fail(g, r, "open", &e);
        return -1;
    }
    hr_runtime_info info;
    hr_runtime_describe(rt, &info);
    hr_rt_request **req = calloc((size_t)n_req, sizeof *req);
    int32_t ids[16];
    bool ok = req != NULL;
    for (int i = 0; ok && i < n_req; i++)
        if (submit_random(g, rt, info.n_vocab, ids, 16, ctx - 16, &req[i], &e)) ok = gb_dev_fail(g, r, "submit", &e);
    hr_runtime_pool pool = {0};
    /* admissions and the prompts' prefill take a few steps (512 tokens a step); then every admitted
     * request decodes */
    for (int k = 0; ok && k < 4 + n_req * 16 / 512; k++) {
        int left = 0;
        if (hr_runtime_step(rt, &left, &e)) ok = gb_dev_fail(g, r, "step", &e);
    }
    int sessions = -1;
    if (ok) {
        hr_runtime_get_pool(rt, &pool);
        const int per = (ctx - 1 + p.block_size - 1) / p.block_size; /* prompt + max_tokens - 1 positions */
        const int want = pool.ledger.blocks_total / per < n_req ? pool.ledger.blocks_total / per : n_req;
        sessions = pool.engine.peak_running;
        char why[64];
        snprintf(why, sizeof why, "want %d = %d blocks / %d; running", want, pool.ledger.blocks_total, per);
        if (gb_verdict(g, r, sessions == want && pool.engine.failed == 0 && want < n_req, why, (double)sessions))
            snprintf(r->check, sizeof r->check, "ok (%d blocks / %d a session, %d requests waiting)",
                     pool.ledger.blocks_total, per, pool.engine.n_waiting);
        else
            sessions = -1;
        json_object_set_new(xj, "blocks", json_integer(pool.ledger.blocks_total));
        json_object_set_new(xj, "pool_bytes", json_integer((json_int_t)pool.ledger.bytes_total));
        json_object_set_new(xj, "blocks_per_session", json_integer(per));
    }
    for (int i = 0; req && i < n_req; i++)
        if (req[i]) hr_rt_request_release(rt, req[i]); /* cancels them */
    free(req);
    hr_runtime_close(rt);
    return sessions;
}

void gb_bench_capacity(gpu_bench *g) {
    static const hr_rt_kv_format fmts[] = {HR_RT_KV_F16, HR_RT_KV_Q8, HR_RT_KV_FP8, HR_RT_KV_Q4H, HR_RT_KV_Q4};
    static const char *const names[] = {"f16", "q8", "fp8", "q4h", "q4"};
    /* the 8B's KV geometry at 8K and a 16 GiB pool (about 16 f16 sessions); --quick: tiny's at 64 */
    const char *shape = g->o.quick ? "tiny" : "llama-3-8b-kv";
    const int ctx = g->o.quick ? 64 : 8192, n_req = g->o.quick ? 14 : 72;
    const uint64_t budget = g->o.quick ? (uint64_t)64 << 10 : (uint64_t)16 << 30;
    int sessions[HR_ARRAY_LEN(fmts)];
    for (size_t fi = 0; fi < HR_ARRAY_LEN(fmts); fi++) {
        char what[40];
        snprintf(what, sizeof what, "%s sessions", names[fi]);
        row r = gb_new_row("capacity", what);
        snprintf(r.shape, sizeof r.shape, "%s, ctx %d, KV pool %.4g MiB, reserve admission", shape, ctx,
                 (double)budget / MIB);
        snprintf(r.unit, sizeof r.unit, "sessions");
        json_t *xj = json_object();
        json_object_set_new(xj, "kv_format", json_string(names[fi]));
        json_object_set_new(xj, "ctx", json_integer(ctx));
        json_object_set_new(xj, "kv_budget_bytes", json_integer((json_int_t)budget));
        sessions[fi] = -1;
        if (gb_out_of_time(g))
            snprintf(r.check, sizeof r.check, "skipped: time budget (--max-seconds)");
        else
            sessions[fi] = capacity_one(g, fmts[fi], shape, ctx, budget, n_req, &r, xj);
        if (sessions[fi] >= 0) r.value = sessions[fi];
        gb_add_row(g, &r, xj);
    }
    /* each format's sessions over f16's; the target is q8's */
    for (size_t fi = 1; fi < HR_ARRAY_LEN(fmts); fi++) {
        char what[40];
        snprintf(what, sizeof what, "%s / f16 sessions", names[fi]);
        row r = gb_new_row("capacity", what);
        snprintf(r.shape, sizeof r.shape, "%s, ctx %d, one KV budget", shape, ctx);
        snprintf(r.unit, sizeof r.unit, "x");
        r.value = sessions[0] > 0 && sessions[fi] >= 0 ? (double)sessions[fi] / sessions[0] : NAN;
        if (fmts[fi] == HR_RT_KV_Q8) {
            snprintf(r.target, sizeof r.target, ">= %.1fx", CAPACITY_Q8_TARGET);
            r.pct_target = gb_pct(r.value, CAPACITY_Q8_TARGET);
        }
        if (!isfinite(r.value)) snprintf(r.check, sizeof r.check, "skipped: a format not measured");
        json_t *xj = json_object();
        json_object_set_new(xj, "kv_format", json_string(names[fi]));
        gb_add_row(g, &r, xj);
    }
}

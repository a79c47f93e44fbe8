/* test_plan_sim.c: the traffic simulator (src/plan/sim.c) drives the engine's real scheduler and block
 * manager in virtual time. Checked: presets and results are the same for the same seed; a trace file
 * loads and its bad lines are named; refusals and preemptions agree with the pool the plan gives (a
 * request larger than the pool is refused; reserve admission never preempts; optimistic admission on a
 * tight pool does; the peak never exceeds the pool); the CLI's JSON carries a recommendation; the cost
 * model's step time and the per-step / per-row fit of the calibration (pure arithmetic). No timing is
 * asserted: the clock is virtual. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "plan/plan.h"

static const char *const tinyllama_json =
    "{\"model_type\":\"llama\",\"hidden_size\":2048,\"intermediate_size\":5632,\"num_attention_heads\":32,"
    "\"num_hidden_layers\":22,\"num_key_value_heads\":4,\"vocab_size\":32000,\"max_position_embeddings\":2048,"
    "\"torch_dtype\":\"bfloat16\"}";

static const hr_cost_model cost = {.bw_gbps = 100, .gflops = 1000, .overhead_s = 0.001, .source = "test"};

/* A plan whose device holds exactly what `seqs` sequences of `pool_ctx` need (the pool then has
 * seqs x pool_ctx / 16 blocks) while requests may be `ctx` long. */
static void tight_plan(const hr_plan_model *m, int ctx, int pool_ctx, int seqs, int max_running, hr_plan_device *d,
                       hr_plan *pl) {
    hr_error err;
    *d = (hr_plan_device){.mem_bytes = 1ull << 40, .util = 1, .bw_gbps = 100, .reserved_bytes = 1 << 20};
    hr_plan_params p = {.n_ctx = pool_ctx, .concurrency = seqs, .max_running = max_running, .n_threads = 1};
    CHECK(hr_plan_compute(m, d, &p, pl, &err) == HR_OK);
    d->mem_bytes = pl->rows[HR_KV_F16].need.total_bytes;
    p.n_ctx = ctx;
    CHECK(hr_plan_compute(m, d, &p, pl, &err) == HR_OK);
}

static hr_traffic trace(const hr_traffic_req *reqs, int n) {
    hr_traffic t = {.n = n, .reqs = malloc(sizeof *reqs * (size_t)n)};
    memcpy(t.reqs, reqs, sizeof *reqs * (size_t)n);
    snprintf(t.name, sizeof t.name, "test");
    return t;
}

static void test_determinism(const hr_plan_model *m) {
    hr_error err;
    hr_traffic a, b, c;
    CHECK(hr_traffic_preset("chat", 40, 2048, 5, &a, &err) == HR_OK);
    CHECK(hr_traffic_preset("chat", 40, 2048, 5, &b, &err) == HR_OK);
    CHECK(hr_traffic_preset("chat", 40, 2048, 6, &c, &err) == HR_OK);
    CHECK(a.n == 40 && !memcmp(a.reqs, b.reqs, sizeof *a.reqs * 40) && memcmp(a.reqs, c.reqs, sizeof *a.reqs * 40));
    bool ok = true;
    for (int i = 0; i < a.n; i++)
        ok = ok && a.reqs[i].n_prompt + a.reqs[i].n_output <= 2048 &&
             (i == 0 || a.reqs[i].t_arrival >= a.reqs[i - 1].t_arrival);
    CHECK(ok);
    hr_plan_device d;
    hr_plan *pl = calloc(1, sizeof *pl);
    tight_plan(m, 2048, 2048, 3, 8, &d, pl);
    hr_sim_candidate cand = {.format = HR_RT_KV_F16, .admission = HR_RT_ADMIT_ADAPTIVE, .max_running = 8};
    hr_sim_result r1, r2;
    CHECK(hr_sim_run(m, pl, &d, &cost, &a, &cand, &r1, &err) == HR_OK);
    CHECK(hr_sim_run(m, pl, &d, &cost, &a, &cand, &r2, &err) == HR_OK);
    CHECKF(r1.completed == 40 && r1.output_tokens == r2.output_tokens && r1.makespan_s == r2.makespan_s &&
               r1.ttft_p99 == r2.ttft_p99 && r1.itl_p50 == r2.itl_p50 && r1.preemptions == r2.preemptions &&
               r1.peak_blocks == r2.peak_blocks,
           "runs differ: completed %d, makespan %g vs %g", r1.completed, r1.makespan_s, r2.makespan_s);
    uint64_t want = 0;
    for (int i = 0; i < a.n; i++) want += (uint64_t)a.reqs[i].n_output;
    CHECK(r1.output_tokens == want && r1.ttft_p50 > 0 && r1.ttft_p50 <= r1.ttft_p99 && r1.itl_p50 > 0);
    CHECK(r1.peak_blocks <= r1.n_blocks);
    /* every preset draws */
    const char *names[] = {"rag", "agent", "burst", "long"};
    for (int i = 0; i < 4; i++) {
        hr_traffic t;
        CHECK(hr_traffic_preset(names[i], 0, 4096, 1, &t, &err) == HR_OK && t.n > 0);
        hr_traffic_free(&t);
    }
    hr_traffic_free(&c);
    CHECK(hr_traffic_preset("storm", 0, 4096, 1, &c, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "agent"));
    hr_traffic_free(&a);
    hr_traffic_free(&b);
    free(pl);
}

/* The pool holds 2 sequences of 1024 tokens (128 blocks); 8 requests of 500 + 500 tokens (63 blocks
 * each) arrive at once. */
static void test_pool_consistency(const hr_plan_model *m) {
    hr_error err;
    hr_plan_device d;
    hr_plan *pl = calloc(1, sizeof *pl);
    tight_plan(m, 1024, 1024, 2, 8, &d, pl);
    hr_traffic_req reqs[8];
    for (int i = 0; i < 8; i++)
        reqs[i] = (hr_traffic_req){.t_arrival = 0, .n_prompt = 500, .n_output = 500, .prefix_id = -1};
    hr_traffic t = trace(reqs, 8);
    hr_sim_candidate cand = {.format = HR_RT_KV_F16, .admission = HR_RT_ADMIT_RESERVE, .max_running = 8};
    hr_sim_result r;
    CHECK(hr_sim_run(m, pl, &d, &cost, &t, &cand, &r, &err) == HR_OK);
    CHECKF(r.n_blocks >= 128 && r.n_blocks < 128 + 8, "pool of %d blocks", r.n_blocks);
    CHECKF(r.completed == 8 && r.refused == 0 && r.preemptions == 0, "reserve: %d completed, %llu preemptions",
           r.completed, (unsigned long long)r.preemptions);
    CHECK(r.peak_blocks <= r.n_blocks && r.peak_blocks >= 2 * 63 - 2);
    CHECK(r.peak_kv_bytes == (uint64_t)r.peak_blocks * 16 * 22528);
    cand.admission = HR_RT_ADMIT_OPTIMISTIC;
    CHECK(hr_sim_run(m, pl, &d, &cost, &t, &cand, &r, &err) == HR_OK);
    CHECKF(r.completed == 8 && r.preemptions > 0 && r.peak_blocks <= r.n_blocks,
           "optimistic: %d completed, %llu preemptions", r.completed, (unsigned long long)r.preemptions);
    /* q8 holds about twice the blocks: fewer waits, no more preemptions */
    hr_sim_result q;
    cand.format = HR_RT_KV_Q8;
    CHECK(hr_sim_run(m, pl, &d, &cost, &t, &cand, &q, &err) == HR_OK);
    CHECK(q.n_blocks > r.n_blocks * 3 / 2 && q.preemptions <= r.preemptions && q.completed == 8);
    hr_traffic_free(&t);
    /* a pool smaller than the context (about 32 blocks): the request of 900 tokens (57 blocks) can never
     * fit and is refused; the one of 450 (29 blocks) runs */
    tight_plan(m, 1024, 512, 1, 8, &d, pl);
    hr_traffic_req two[2] = {{.t_arrival = 0, .n_prompt = 400, .n_output = 50, .prefix_id = -1},
                             {.t_arrival = 0.5, .n_prompt = 800, .n_output = 100, .prefix_id = -1}};
    t = trace(two, 2);
    cand = (hr_sim_candidate){.format = HR_RT_KV_F16, .admission = HR_RT_ADMIT_ADAPTIVE, .max_running = 8};
    CHECK(hr_sim_run(m, pl, &d, &cost, &t, &cand, &r, &err) == HR_OK);
    CHECKF(r.n_blocks >= 29 && r.n_blocks < 57 && r.completed == 1 && r.refused == 1,
           "blocks %d, completed %d, refused %d", r.n_blocks, r.completed, r.refused);
    hr_traffic_free(&t);
    free(pl);
}

static void test_trace_file(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/trace.jsonl", hr_test_tmpdir());
    FILE *f = fopen(path, "w");
    fputs("{\"t\": 1.5, \"prompt\": 100, \"output\": 20, \"prefix\": 3, \"prefix_tokens\": 64}\n\n"
          "{\"t\": 0, \"prompt\": 50, \"output\": 10}\n",
          f);
    fclose(f);
    hr_traffic t;
    hr_error err;
    CHECK(hr_traffic_load(path, 2048, &t, &err) == HR_OK && t.n == 2);
    CHECK(t.reqs[0].t_arrival == 0 && t.reqs[0].prefix_id == -1 && t.reqs[1].prefix_id == 3 &&
          t.reqs[1].n_prefix == 64);
    hr_traffic_free(&t);
    f = fopen(path, "w");
    fputs("{\"t\": 0, \"prompt\": 50, \"output\": 10}\n{\"t\": 1, \"output\": 10}\n", f);
    fclose(f);
    CHECK(hr_traffic_load(path, 2048, &t, &err) == HR_ERR_FORMAT && strstr(err.msg, "line 2") &&
          strstr(err.msg, "\"prompt\""));
    f = fopen(path, "w");
    fputs("not json\n", f);
    fclose(f);
    CHECK(hr_traffic_load(path, 2048, &t, &err) == HR_ERR_FORMAT && strstr(err.msg, "line 1"));
}

static void test_cli(void) {
    FILE *probe = fopen(HR_HEADROOM_BIN, "rb");
    if (!probe) {
        printf("the headroom binary is not built: CLI checks skipped\n");
        return;
    }
    fclose(probe);
    char args[1024], *out = NULL, *errs = NULL;
    snprintf(args, sizeof args,
             "plan -m %s/tests/plan/llama-3-8b.config.json --device h100-80gb --ctx 4096 --traffic burst --requests 64 "
             "--max-running 32 --slo-ttft 30 --json",
             HR_SOURCE_DIR);
    CHECK(hr_test_run_cli(args, &out, &errs) == 0);
    json_t *j = out ? json_loads(out, 0, NULL) : NULL;
    json_t *tr = json_object_get(j, "traffic");
    CHECKF(tr != NULL, "%s", errs ? errs : "");
    CHECK(json_integer_value(json_object_get(tr, "requests")) == 64);
    CHECK(json_array_size(json_object_get(tr, "candidates")) == 6 * 2 * 3);
    json_t *rec = json_object_get(tr, "recommended");
    CHECK(json_is_object(rec) && json_is_true(json_object_get(rec, "meets")) &&
          json_integer_value(json_object_get(rec, "completed")) == 64);
    /* nothing meets an impossible TTFT bound: exit 1 */
    json_decref(j);
    free(out);
    free(errs);
    snprintf(args, sizeof args,
             "plan -m %s/tests/plan/llama-3-8b.config.json --device h100-80gb --ctx 4096 --traffic burst --requests 64 "
             "--max-running 32 --slo-ttft 0.000001",
             HR_SOURCE_DIR);
    CHECK(hr_test_run_cli(args, &out, &errs) == 1);
    CHECK(out && strstr(out, "no candidate meets every bound") && strstr(out, "TTFT p99"));
    free(out);
    free(errs);
    snprintf(args, sizeof args, "plan -m %s/tests/plan/llama-3-8b.config.json --device h100-80gb --traffic storm",
             HR_SOURCE_DIR);
    CHECK(hr_test_run_cli(args, &out, &errs) == 2);
    CHECK(errs && strstr(errs, "unknown traffic 'storm'"));
    free(out);
    free(errs);
    snprintf(args, sizeof args,
             "plan -m %s/tests/plan/llama-3-8b.config.json --device h100-80gb --traffic chat --max-ppl-increase 1",
             HR_SOURCE_DIR);
    CHECK(hr_test_run_cli(args, &out, &errs) == 2);
    CHECK(errs && strstr(errs, "--eval"));
    free(out);
    free(errs);
}

static bool near(double a, double b) { return fabs(a - b) <= 1e-12 + 1e-9 * fabs(b); }

static void test_cost_arithmetic(const hr_plan_model *m) {
    hr_cost_model c = {.bw_gbps = 100, .gflops = 1000, .overhead_s = 0.001, .row_s = 0.0005};
    hr_cost_step cb = {.bytes = 1e9, .layer_flops = 1e12, .n_tokens = 3, .n_rows = 3};
    CHECK(near(hr_cost_step_s(&c, &cb), 1.0 + 0.001 + 3 * 0.0005)); /* compute-bound */
    hr_cost_step mb = {.bytes = 1e10, .layer_flops = 1e9, .n_tokens = 1};
    CHECK(near(hr_cost_step_s(&c, &mb), 0.1 + 0.001)); /* memory-bound, no row */
    double oh = -1, row = -1;
    hr_cost_fit_rows(0.002 + 4 * 0.0005, 4, 0.002 + 16 * 0.0005, 16, &oh, &row); /* an exact line */
    CHECKF(near(oh, 0.002) && near(row, 0.0005), "overhead %g row %g", oh, row);
    hr_cost_fit_rows(0.010, 4, 0.005, 16, &oh, &row); /* falls with rows: noise, no per-row cost */
    CHECKF(near(oh, 0.010) && row == 0, "overhead %g row %g", oh, row);
    hr_cost_fit_rows(0.001, 4, 0.016, 16, &oh, &row); /* meets zero past one row: all per row */
    CHECKF(oh == 0 && near(row, 0.001), "overhead %g row %g", oh, row);
    hr_cost_fit_rows(-0.001, 4, -0.002, 16, &oh, &row); /* faster than the roofline: nothing added */
    CHECKF(oh == 0 && row == 0, "overhead %g row %g", oh, row);
    /* the measured curve: rates interpolated in log(tokens), flat beyond its ends; the output projection
     * priced at its own curve by rows; attention apart (after the matrices, not beside them) */
    hr_cost_model cv = {.bw_gbps = 100, .gflops = 300, .n_curve = 3, .attn_gflops = 10, .row_s = 0.0005};
    const int toks[3] = {1, 16, 256};
    const double lay[3] = {100, 200, 300}, hd[3] = {150, 250, 400};
    for (int i = 0; i < 3; i++) cv.curve_tokens[i] = toks[i], cv.curve_gflops[i] = lay[i], cv.curve_head[i] = hd[i];
    CHECK(near(hr_cost_rate(&cv, 1, false), 100) && near(hr_cost_rate(&cv, 4, false), 150)); /* halfway in log */
    CHECK(near(hr_cost_rate(&cv, 64, false), 250) && near(hr_cost_rate(&cv, 4096, false), 300));
    CHECK(near(hr_cost_rate(&cv, 4, true), 200) && near(hr_cost_rate(&cv, 256, true), 400));
    CHECK(near(hr_cost_rate(&c, 4, false), 1000) && near(hr_cost_rate(&c, 4, true), 1000)); /* no curve: gflops */
    hr_cost_step st = {
        .bytes = 1e8, .layer_flops = 3e11, .n_tokens = 64, .head_flops = 4e10, .n_rows = 4, .attn_flops = 1e9};
    CHECKF(near(hr_cost_step_s(&cv, &st), 3e11 / 250e9 + 4e10 / 200e9 + 1e9 / 10e9 + 4 * 0.0005), "step %g",
           hr_cost_step_s(&cv, &st));
    st.bytes = 1e12; /* streaming 1 TB at 100 GB/s: memory-bound, attention still added */
    CHECK(near(hr_cost_step_s(&cv, &st), 10.0 + 0.1 + 4 * 0.0005));
    hr_cost_model c_attn = c; /* a roofline counts attention with the matrices, inside the max */
    hr_cost_step sa = {.bytes = 1e9, .layer_flops = 1e12, .n_tokens = 2, .attn_flops = 1e12};
    CHECK(near(hr_cost_step_s(&c_attn, &sa), 2.0 + 0.001));
    /* an older calibration file without row_s loads with none; a saved one keeps it */
    hr_error err;
    char path[] = "/tmp/hr_test_cost_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("{\"bw_gbps\": 10, \"gflops\": 20, \"overhead_s\": 0.003}", f);
    fclose(f);
    hr_cost_model l;
    CHECK(hr_cost_load(path, &l, &err) == HR_OK && l.overhead_s == 0.003 && l.row_s == 0);
    CHECK(hr_cost_save(&c, path, &err) == HR_OK && hr_cost_load(path, &l, &err) == HR_OK);
    CHECK(near(l.row_s, 0.0005) && near(l.overhead_s, 0.001) && near(l.gflops, 1000) && l.n_curve == 0);
    CHECK(hr_cost_save(&cv, path, &err) == HR_OK && hr_cost_load(path, &l, &err) == HR_OK);
    CHECK(l.n_curve == 3 && l.curve_tokens[1] == 16 && near(l.curve_gflops[2], 300) && near(l.curve_head[0], 150) &&
          near(l.attn_gflops, 10) && near(hr_cost_step_s(&l, &st), hr_cost_step_s(&cv, &st)));
    /* a curve out of order is named */
    f = fopen(path, "w");
    fputs("{\"bw_gbps\": 10, \"gflops\": 20, \"gflops_at_tokens\": [[16, 1, 1], [4, 2, 2]]}", f);
    fclose(f);
    CHECKF(hr_cost_load(path, &l, &err) == HR_ERR_FORMAT && strstr(err.msg, "gflops_at_tokens") &&
               strstr(err.msg, "entry 1"),
           "%s", err.msg);
    remove(path);
    /* the simulator charges the per-row cost: the same traffic takes longer with it */
    hr_traffic t;
    CHECK(hr_traffic_preset("chat", 20, 2048, 5, &t, &err) == HR_OK);
    hr_plan_device d;
    hr_plan *pl = calloc(1, sizeof *pl);
    tight_plan(m, 2048, 2048, 3, 8, &d, pl);
    hr_sim_candidate cand = {.format = HR_RT_KV_F16, .admission = HR_RT_ADMIT_ADAPTIVE, .max_running = 8};
    hr_cost_model c0 = c;
    c0.row_s = 0;
    hr_sim_result r0, r1;
    CHECK(hr_sim_run(m, pl, &d, &c0, &t, &cand, &r0, &err) == HR_OK);
    CHECK(hr_sim_run(m, pl, &d, &c, &t, &cand, &r1, &err) == HR_OK);
    CHECKF(r0.completed == 20 && r1.completed == 20 && r1.itl_p50 > r0.itl_p50 && r1.ttft_p50 >= r0.ttft_p50,
           "itl %g vs %g, ttft %g vs %g", r1.itl_p50, r0.itl_p50, r1.ttft_p50, r0.ttft_p50);
    free(pl);
    hr_traffic_free(&t);
}

int main(void) {
    hr_plan_model m;
    hr_error err;
    CHECK(hr_plan_model_from_config(tinyllama_json, strlen(tinyllama_json), NULL, &m, &err) == HR_OK);
    test_determinism(&m);
    test_pool_consistency(&m);
    test_trace_file();
    test_cli();
    test_cost_arithmetic(&m);
    return hr_test_finish();
}

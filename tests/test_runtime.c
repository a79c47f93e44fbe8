/* test_runtime.c: the composition root every front end uses. The KV budget arithmetic against
 * numbers worked by hand; opening checks (a format the head cannot use, a budget that holds no
 * context, --ctx past the trained context); requests as text, chat and ids with the context clamp
 * and refusals naming both lengths; per-request KV usage (live while running, peak at the end); a
 * per-request window policy; max_running reaching the engine; the pool's headroom. On stories260K
 * (skipped without ../shared) the text path gives the reference ids. */
#include <jansson.h>
#include <string.h>

#include "common/util.h"
#include "harness.h"
#include "runtime/runtime_parts.h"

static void test_budget_arithmetic(void) {
    /* llama-ish: 2 layers, 2 KV heads, head 64, f16: a token is 2 * 2 * 2 * 64 * 2 = 1024 bytes, a
     * block of 16 is 16 KiB */
    hr_kv_budget_query q = {.kv = {.n_layers = 2,
                                   .n_kv_heads = 2,
                                   .head_dim = 64,
                                   .block_size = 16,
                                   .k_format = HR_KV_F16,
                                   .v_format = HR_KV_F16,
                                   .max_seqs = 4},
                            .n_ctx = 100,
                            .n_seqs = 3};
    hr_kv_budget b;
    hr_error err = {0};
    CHECK(hr_kv_budget_compute(&q, &b, &err) == HR_OK);
    CHECK(b.block_bytes == 16384 && b.token_bytes == 1024 && b.fixed_bytes == 0);
    CHECK(b.ctx_blocks == 7 && b.n_blocks == 21 && b.budget_bytes == 21ull * 16384 && b.n_seqs_at_ctx == 3);
    CHECK(b.n_tokens == 21 * 16);
    /* a given budget: what it holds */
    q.kv.budget_bytes = 10 * 16384 + 100;
    CHECK(hr_kv_budget_compute(&q, &b, &err) == HR_OK && b.n_blocks == 10 && b.n_seqs_at_ctx == 1);
    /* too small for one context: refused, saying what would do */
    q.kv.budget_bytes = 6 * 16384;
    CHECK(hr_kv_budget_compute(&q, &b, &err) == HR_ERR_BUDGET && strstr(err.msg, "raise the KV budget to "));
    /* about the KV budget, the context length the other remedy; the runtime names no flag */
    CHECK(err.param == HR_PARAM_KV_BUDGET && err.also == HR_PARAM_CONTEXT && !strcmp(err.value, "96.0 KiB"));
    CHECKF(!strstr(err.msg, "--"), "%s", err.msg);
    CHECK(b.n_blocks == 6);
    /* q4 takes tail buffers first: ceil(512 / 16) + 4 + 1 of them, 2 * 2 * 2 * 16 * 64 * 2 bytes each */
    q.kv.budget_bytes = 0;
    q.kv.k_format = q.kv.v_format = HR_KV_Q4;
    CHECK(hr_kv_budget_compute(&q, &b, &err) == HR_OK);
    CHECK(b.fixed_bytes == 37ull * 2 * 2 * 2 * 16 * 64 * 2);
    CHECK(b.budget_bytes == b.fixed_bytes + 21 * b.block_bytes);
    /* a format the head cannot use names both */
    q.kv.head_dim = 12;
    q.kv.k_format = q.kv.v_format = HR_KV_Q4H;
    CHECK(hr_kv_budget_compute(&q, &b, &err) == HR_ERR_INVALID_ARG);
    CHECKF(strstr(err.msg, "KV format q4h with block size 16") && !strstr(err.msg, "--"), "%s", err.msg);
    CHECK(err.param == HR_PARAM_KV_FORMAT && err.also == HR_PARAM_BLOCK_SIZE && !strcmp(err.value, "q4h"));
}

#define CTX 160 /* the demo model's context in this test (its chat rendering alone is ~76 tokens) */

static hr_rt_request *submit_text(hr_runtime *rt, const char *text, int max_tokens, hr_status want) {
    hr_rt_request_params p = {.prompt = text, .max_tokens = max_tokens, .ignore_eos = true};
    p.sampling = hr_rt_sampling_default();
    p.sampling.temperature = 0;
    hr_rt_request *r = NULL;
    hr_error err = {0};
    hr_status st = hr_runtime_submit(rt, &p, &r, &err);
    CHECKF(st == want, "submit '%.20s': %s", text, err.msg);
    return r;
}

static void test_demo(void) {
    hr_runtime_params p = hr_runtime_default_params();
    p.n_ctx = CTX;
    p.max_running = 3;
    hr_runtime *rt = NULL;
    hr_error err = {0};
    bool bad = false;
    CHECKF(hr_runtime_open(&p, &rt, &bad, &err) == HR_OK, "%s", err.msg);
    if (!rt) return;
    CHECK(hr_runtime_is_demo(rt) && !strcmp(hr_runtime_model_name(rt), "demo"));
    CHECK(hr_runtime_n_ctx(rt) == CTX);
    /* the default pool holds one context (a server has no prompt count) */
    CHECK(hr_runtime_budget(rt)->n_seqs_at_ctx == 1);
    hr_engine_stats st;
    hr_engine_get_stats(hr_runtime_engine(rt), &st);
    /* max_running reaches the engine: 3 sequence slots */
    CHECK(hr_kv_pool_config(hr_runtime_kv(rt))->max_seqs == 3);

    /* the context clamp: -n 500 on a CTX context */
    hr_rt_request *a = submit_text(rt, "the cat sat", 500, HR_OK);
    hr_rt_request *too_long = NULL;
    char big[2048];
    memset(big, 'a', sizeof big - 1);
    for (size_t i = 1; i < sizeof big - 1; i += 2) big[i] = ' ';
    big[sizeof big - 1] = 0;
    hr_rt_request_params bp = {.prompt = big, .max_tokens = 4};
    bp.sampling = hr_rt_sampling_default();
    CHECK(hr_runtime_submit(rt, &bp, &too_long, &err) == HR_ERR_RANGE && !too_long);
    CHECKF(strstr(err.msg, "tokens") && strstr(err.msg, "160"), "%s", err.msg);
    /* exactly one prompt form */
    bp.prompt_ids = (const int32_t[]){1, 2};
    bp.n_prompt_ids = 2;
    CHECK(hr_runtime_submit(rt, &bp, &too_long, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "exactly one"));
    bp.prompt = NULL;
    bp.prompt_ids = NULL;
    CHECK(hr_runtime_submit(rt, &bp, &too_long, &err) == HR_ERR_INVALID_ARG);
    /* ids and chat */
    int32_t ids[3] = {1, 20, 30};
    hr_rt_request_params ip = {.prompt_ids = ids, .n_prompt_ids = 3, .max_tokens = 5, .ignore_eos = true};
    ip.sampling = hr_rt_sampling_default();
    hr_rt_request *b = NULL;
    CHECK(hr_runtime_submit(rt, &ip, &b, &err) == HR_OK);
    hr_rt_chat_msg msgs[2] = {{.role = "system", .content = "be brief"}, {.role = "user", .content = "hello"}};
    hr_rt_request_params cp = {.messages = msgs, .n_messages = 2, .max_tokens = 3, .ignore_eos = true};
    cp.sampling = hr_rt_sampling_default();
    hr_rt_request *c = NULL;
    CHECKF(hr_runtime_submit(rt, &cp, &c, &err) == HR_OK, "%s", err.msg);
    if (!c) return;
    int n_chat = 0;
    hr_rt_request_prompt(c, &n_chat);
    CHECK(n_chat > 2);
    /* a window policy per request; a bad one is refused, about the KV policy (its code and value) */
    hr_rt_request_params wp = ip;
    wp.kv_policy = "window:0";
    hr_rt_request *w = NULL;
    CHECK(hr_runtime_submit(rt, &wp, &w, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "KV policy") && !w &&
          err.param == HR_PARAM_KV_POLICY && !strcmp(err.value, "window:0"));
    wp.kv_policy = "window:16";
    wp.max_tokens = CTX + 40; /* past the context: allowed with a window */
    CHECKF(hr_runtime_submit(rt, &wp, &w, &err) == HR_OK, "%s", err.msg);

    /* live usage: step until the first request has computed something, then it shows bytes now */
    hr_engine *e = hr_runtime_engine(rt);
    hr_rt_result res;
    int left = 1;
    bool saw_live = false;
    for (int steps = 0; left > 0 && steps < 10000; steps++) {
        CHECK(hr_engine_step(e, &left, &err) == HR_OK);
        hr_rt_request_result(a, &res);
        if (res.state == HR_RT_RUNNING && res.kv.bytes_now > 0) saw_live = true;
        if (steps == 1) {
            hr_runtime_pool pool;
            hr_runtime_get_pool(rt, &pool);
            CHECK(pool.budget_bytes == hr_runtime_budget(rt)->budget_bytes && pool.ledger.blocks_used > 0);
            CHECK(pool.headroom_bytes <= (int64_t)pool.budget_bytes);
        }
    }
    CHECK(saw_live);
    hr_rt_request_result(a, &res);
    CHECK(res.state == HR_RT_COMPLETED && res.n_prompt > 0 && res.n_ids == CTX - res.n_prompt);
    CHECK(res.max_tokens == CTX - res.n_prompt && hr_rt_request_ctx_limited(a));
    CHECK(!strcmp(res.finish_reason, "length") && !strcmp(res.limit, "context"));
    CHECK(res.kv.bytes_peak > 0 && res.kv.bytes_now == res.kv.bytes_peak && res.kv.blocks_peak == CTX / 16);
    CHECK(res.kv.blocks_now == CTX / 16 && res.kv.block_size == 16);
    CHECK(res.kv.k_format == HR_RT_KV_F16 && !strcmp(res.kv.policy, "full"));
    CHECK(res.t_submit > 0 && res.t_finish >= res.t_submit && res.kv.queued_seconds >= 0);
    hr_rt_request_result(b, &res);
    CHECK(res.state == HR_RT_COMPLETED && res.n_ids == 5 && !strcmp(res.limit, "max_tokens"));
    hr_rt_request_result(w, &res);
    CHECK(res.state == HR_RT_COMPLETED && res.n_ids == CTX + 40 && !strcmp(res.kv.policy, "window"));
    CHECK(res.kv.evicted_tokens > 0);
    hr_rt_request_release(rt, a);
    hr_rt_request_release(rt, b);
    hr_rt_request_release(rt, c);
    hr_rt_request_release(rt, w);
    hr_kv_pool_ledger l;
    hr_kv_pool_get_ledger(hr_runtime_kv(rt), &l);
    CHECK(l.blocks_used == 0);
    hr_runtime_close(rt);

    /* open-time checks: a parameter at fault says so */
    p.kv_budget = 1000;
    CHECK(hr_runtime_open(&p, &rt, &bad, &err) == HR_ERR_BUDGET && bad);
    p.kv_budget = 0;
    p.n_ctx = 1 << 20;
    CHECK(hr_runtime_open(&p, &rt, &bad, &err) == HR_ERR_RANGE && bad && strstr(err.msg, "RoPE"));
    p.n_ctx = CTX;
    p.model_path = "/nonexistent/model.gguf";
    CHECK(hr_runtime_open(&p, &rt, &bad, &err) != HR_OK && !bad);
}

/* The text path on the real model gives the reference ids (BOS and the SentencePiece space applied by
 * the runtime's tokenization). */
static void test_stories(void) {
    const char *mpath = hr_test_shared_path("models/stories260K.gguf");
    const char *vpath = hr_test_shared_path("vectors/stories260K-greedy.jsonl");
    if (!mpath || !vpath) {
        printf("stories260K check skipped: ../shared is absent\n");
        return;
    }
    hr_runtime_params p = hr_runtime_default_params();
    p.model_path = mpath;
    p.isa = hr_test_isa();
    hr_runtime *rt = NULL;
    hr_error err = {0};
    CHECKF(hr_runtime_open(&p, &rt, NULL, &err) == HR_OK, "%s", err.msg);
    if (!rt) return;
    CHECK(!strcmp(hr_runtime_model_name(rt), "stories260K"));
    FILE *f = fopen(vpath, "r");
    char line[1 << 14];
    int n = 0, bad = 0;
    while (f && n < 8 && fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        if (!o) continue;
        const char *prompt = json_string_value(json_object_get(o, "prompt"));
        json_t *ct = json_object_get(o, "completion_tokens");
        hr_rt_request *r = submit_text(rt, prompt, 48, HR_OK);
        CHECK(hr_runtime_run_until_idle(rt, &err) == HR_OK);
        hr_rt_result res;
        hr_rt_request_result(r, &res);
        bool ok = res.n_ids == 48;
        for (int i = 0; ok && i < 48; i++) ok = res.ids[i] == (int32_t)json_integer_value(json_array_get(ct, i));
        bad += !ok;
        hr_rt_request_release(rt, r);
        json_decref(o);
        n++;
    }
    if (f) fclose(f);
    CHECKF(n == 8 && bad == 0, "%d of %d prompts differ from the reference ids", bad, n);
    hr_runtime_close(rt);
}

int main(void) {
    test_budget_arithmetic();
    test_demo();
    test_stories();
    return hr_test_finish();
}

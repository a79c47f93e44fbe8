/* test_runtime_api.c: the runtime as a front end sees it: this file includes runtime.h, the
 * tokenizer's header and eval.h only (what tests/layering.sh allows src/cli and src/server), and
 * drives a request's stream, stepping, describing, scoring, the vocabulary and the eval module
 * through them.
 *
 * Scoring: a sibling runtime on the same model with the same formats gives the same logits bit for
 * bit; scoring leaves the pool as it found it; a window policy writes only the second half's logits
 * and ends holding fewer KV bytes than the full policy. Eval (on stories260K when ../shared holds
 * it): the f32 arm is the reference again (KL exactly 0, every top-1 agrees, the same NLL). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eval/eval.h"
#include "harness.h"
#include "runtime/runtime.h"
#include "tokenizer/tokenizer.h"

#define CTX 64

static hr_runtime *open_demo(hr_rt_kv_format f, hr_runtime *base) {
    hr_runtime_params p = hr_runtime_default_params();
    p.n_ctx = CTX;
    p.max_batch_tokens = CTX;
    p.max_running = 1;
    p.k_format = p.v_format = f;
    p.n_threads = 2;
    hr_runtime *rt = NULL;
    hr_error err = {0};
    hr_status st = base ? hr_runtime_open_sibling(base, &p, &rt, NULL, &err) : hr_runtime_open(&p, &rt, NULL, &err);
    CHECKF(st == HR_OK, "%s", err.msg);
    return rt;
}

static void test_vocabulary(void) {
    for (int f = 0; f < HR_RT_KV_FORMAT_COUNT; f++) {
        hr_rt_kv_format back = HR_RT_KV_F32;
        hr_error err = {0};
        CHECK(hr_rt_kv_format_parse(hr_rt_kv_format_name((hr_rt_kv_format)f), &back, &err) == HR_OK && (int)back == f);
    }
    hr_rt_kv_format kf;
    hr_error err = {0};
    CHECK(hr_rt_kv_format_parse("q9", &kf, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "q9"));
    hr_rt_admission a;
    CHECK(hr_rt_admission_parse(hr_rt_admission_name(HR_RT_ADMIT_RESERVE), &a, &err) == HR_OK &&
          a == HR_RT_ADMIT_RESERVE);
    hr_rt_preempt m;
    CHECK(hr_rt_preempt_parse(hr_rt_preempt_name(HR_RT_PREEMPT_SWAP), &m, &err) == HR_OK && m == HR_RT_PREEMPT_SWAP);
    hr_rt_layout l;
    CHECK(hr_rt_layout_parse(hr_rt_layout_name(HR_RT_LAYOUT_CONTIGUOUS), &l, &err) == HR_OK &&
          l == HR_RT_LAYOUT_CONTIGUOUS);
    CHECK(!strcmp(hr_rt_state_name(HR_RT_COMPLETED), "completed"));
    hr_rt_sampling s = hr_rt_sampling_default();
    CHECK(s.temperature == 0 && s.top_k == 40 && hr_rt_sampling_check(&s, &err) == HR_OK);
    s.temperature = -1;
    CHECK(hr_rt_sampling_check(&s, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "temperature"));
    char label[48];
    CHECK(hr_rt_policy_parse("sinks:4,window:16", label, sizeof label, &err) == HR_OK && strstr(label, "window"));
    CHECK(hr_rt_policy_parse("window:0", label, sizeof label, &err) == HR_ERR_INVALID_ARG);
}

/* A request read through its stream while the caller steps: the ids read are the result's ids. */
static void test_stream(hr_runtime *rt) {
    hr_rt_request_params p = {.prompt = "Once upon a time", .max_tokens = 12, .ignore_eos = true};
    p.sampling = hr_rt_sampling_default();
    hr_rt_request *r = NULL;
    hr_error err = {0};
    CHECKF(hr_runtime_submit(rt, &p, &r, &err) == HR_OK, "%s", err.msg);
    if (!r) return;
    int32_t ids[64];
    int n = 0;
    char text[512];
    size_t n_text = 0;
    bool done = false;
    for (int step = 0; step < 200 && !done; step++) {
        int pending = 0;
        CHECK(hr_runtime_step(rt, &pending, &err) == HR_OK);
        hr_rt_delta d;
        hr_rt_request_read(r, ids + n, (int)(sizeof ids / sizeof ids[0]) - n, text + n_text, sizeof text - n_text, &d);
        n += d.n_tokens;
        n_text += d.n_text;
        done = d.done;
    }
    CHECK(done && hr_rt_request_wait(r, 0));
    hr_rt_result res;
    hr_rt_request_result(r, &res);
    CHECK(res.state == HR_RT_COMPLETED && res.n_ids == 12 && n == 12);
    CHECK(n == res.n_ids && !memcmp(ids, res.ids, sizeof(int32_t) * (size_t)n));
    CHECK(n_text == res.text_len && !memcmp(text, res.text, n_text));
    float gaps[16];
    CHECK(hr_rt_request_token_gaps(r, gaps, 16) == 11);
    CHECK(hr_rt_request_logprobs(r, 0, 4, gaps, NULL, NULL) == 0); /* not asked for */
    hr_rt_request_release(rt, r);
    hr_rt_event ev[4];
    CHECK(hr_runtime_events(rt, 0, ev, 4) == 0); /* nothing was preempted or evicted */
}

static void test_score(void) {
    hr_runtime *base = open_demo(HR_RT_KV_F32, NULL);
    hr_runtime *sib = base ? open_demo(HR_RT_KV_F32, base) : NULL;
    if (!sib) {
        hr_runtime_close(base);
        return;
    }
    hr_runtime_info info;
    hr_runtime_describe(base, &info);
    CHECK(info.n_vocab > 0 && info.n_ctx_train > 0 && info.isa && info.isa[0] && info.n_threads == 2);
    test_stream(base);
    int32_t toks[CTX];
    size_t n = 0;
    hr_error err = {0};
    hr_tokenize_opts to = {.add_bos = true};
    const char *text = "Once upon a time there was a little dog who liked to run in the park.";
    CHECKF(hr_tokenizer_encode(hr_runtime_tokenizer(base), text, strlen(text), &to, toks, CTX, &n, &err) == HR_OK, "%s",
           err.msg);
    int N = (int)n;
    CHECKF(N >= 16 && N <= CTX, "%d tokens", N);
    if (N < 16 || N > CTX) N = 16; /* a failed check above; keeps the buffers' bounds */
    size_t V = (size_t)info.n_vocab;
    float *a = malloc(sizeof(float) * V * CTX), *b = malloc(sizeof(float) * V * CTX);
    hr_rt_score sa = {0}, sb = {0};
    CHECKF(hr_runtime_score(base, NULL, toks, N, a, &sa, &err) == HR_OK, "%s", err.msg);
    CHECKF(hr_runtime_score(sib, NULL, toks, N, b, &sb, &err) == HR_OK, "%s", err.msg);
    CHECK(!memcmp(a, b, sizeof(float) * V * (size_t)N));
    CHECK(sa.kv_bytes == sb.kv_bytes && sa.kv_bytes > 0 && sa.tokens_kept == N);
    /* again: the same logits, and the pool back where it was */
    CHECK(hr_runtime_score(base, NULL, toks, N, b, NULL, &err) == HR_OK &&
          !memcmp(a, b, sizeof(float) * V * (size_t)N));
    hr_runtime_pool pool;
    hr_runtime_get_pool(base, &pool);
    CHECK(pool.ledger.blocks_used == 0);
    /* a window: the first half's rows are left alone, the rest written, fewer bytes kept */
    for (size_t i = 0; i < V * (size_t)N; i++) b[i] = NAN;
    hr_rt_score sw = {0};
    CHECKF(hr_runtime_score(base, "window:16", toks, N, b, &sw, &err) == HR_OK, "%s", err.msg);
    bool first_untouched = true, rest_finite = true;
    for (size_t i = 0; i < V * (size_t)(N / 2); i++) first_untouched &= isnan(b[i]);
    for (size_t i = V * (size_t)(N / 2); i < V * (size_t)N; i++) rest_finite &= isfinite(b[i]);
    CHECK(first_untouched && rest_finite);
    CHECK(sw.kv_bytes < sa.kv_bytes && sw.tokens_kept < N);
    CHECK(hr_runtime_check_policy(base, "window:16", &err) == HR_OK);
    CHECK(hr_runtime_score(base, NULL, toks, CTX + 1, a, NULL, &err) == HR_ERR_INVALID_ARG);
    free(a);
    free(b);
    hr_runtime_close(sib);
    hr_runtime_close(base);
}

static void test_eval(void) {
    hr_eval *ev = NULL;
    hr_error err = {0};
    hr_eval_params p = {.model_path = "unused", .formats = "f16,q9", .n_ctx = 32};
    CHECK(hr_eval_create(&p, &ev, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "--kv-type") && !ev);
    const char *bad[] = {"full;h2o:x"};
    p.formats = "f16";
    p.policies = bad;
    p.n_policies = 1;
    CHECK(hr_eval_create(&p, &ev, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "--policy") && !ev);

    char model[512], text[512];
    snprintf(model, sizeof model, "%s/models/stories260K.gguf", HR_SHARED_DIR);
    snprintf(text, sizeof text, "%s/corpus/stories260K-samples.txt", HR_SHARED_DIR);
    FILE *f = fopen(model, "rb");
    if (!f) {
        printf("eval on stories260K skipped: %s not found\n", model);
        return;
    }
    fclose(f);
    const char *pols[] = {"full;window:16"};
    p = (hr_eval_params){.model_path = model,
                         .formats = "f32,q8",
                         .policies = pols,
                         .n_policies = 1,
                         .n_ctx = 64,
                         .max_chunks = 2,
                         .n_threads = 2};
    CHECKF(hr_eval_create(&p, &ev, &err) == HR_OK, "%s", err.msg);
    bool bad_option = true;
    CHECKF(ev && hr_eval_open(ev, text, &bad_option, &err) == HR_OK, "%s", err.msg);
    if (!ev || bad_option) {
        hr_eval_destroy(ev);
        return;
    }
    CHECK(hr_eval_n_arms(ev) == 5 && hr_eval_n_chunks(ev) == 2 && hr_eval_n_tokens(ev) >= 128);
    for (int c = 0; c < hr_eval_n_chunks(ev); c++)
        CHECKF(hr_eval_run_chunk(ev, c, NULL, NULL, &err) == HR_OK, "%s", err.msg);
    hr_eval_arm ref, f32, win;
    hr_eval_get_arm(ev, 0, &ref);
    hr_eval_get_arm(ev, 1, &f32); /* f32 under full */
    hr_eval_get_arm(ev, 2, &win); /* f32 under window:16 */
    CHECK(ref.n == 2 * 31 && f32.n == ref.n && f32.nll == ref.nll && f32.kl == 0 && f32.agree == f32.n);
    CHECK(!strcmp(f32.policy, "full") && !strcmp(win.policy, "window:16") && !strcmp(win.k_format, "f32"));
    CHECK(win.seq_bytes < f32.seq_bytes && win.kl > 0 && !win.error[0]);
    hr_eval_arm q8;
    hr_eval_get_arm(ev, 3, &q8);
    CHECK(!strcmp(q8.label, "q8") && q8.kv_bytes_per_token < ref.kv_bytes_per_token && q8.n == ref.n);
    hr_eval_destroy(ev);
}

int main(void) {
    test_vocabulary();
    test_score();
    test_eval();
    return hr_test_finish();
}

/* test_engine_policy.c: per-request KV policies through the engine. Two requests with the same
 * prompt run side by side: one with the pool's default (full), one with window:32. The windowed one
 * drops blocks (its ledger says so) while the full one keeps all; with a window wider than the whole
 * sequence the tokens equal the full run's exactly; a policy the pool cannot use is refused at
 * submit; a windowed request preempted under a tight pool is recomputed (never swapped) and still
 * completes; a windowed request runs past the context (n_ctx) holding no more than its window; the
 * pool ends as it started. */
#include <string.h>

#include "model/synth.h"
#include "test_engine_rig.h"

typedef struct out {
    int32_t ids[512];
    int n;
    hr_request_stats st;
} out;

/* Runs n requests (policy[i] NULL = pool default) to the end. */
static void run_all(hr_engine *e, const int32_t *prompt, int n_prompt, int max_tokens,
                    const hr_kv_policy *const *policy, int n, out *o) {
    hr_request *r[8];
    hr_error err = {0};
    for (int i = 0; i < n; i++) {
        hr_request_params p = {.prompt = prompt,
                               .n_prompt = n_prompt,
                               .max_tokens = max_tokens,
                               .sampling = hr_sampler_default_params(),
                               .ignore_eos = true,
                               .kv_policy = policy[i]};
        CHECKF(hr_engine_submit(e, &p, &r[i], &err) == HR_OK, "submit: %s", err.msg);
    }
    CHECK(hr_engine_run_until_idle(e, &err) == HR_OK);
    for (int i = 0; i < n; i++) {
        const int32_t *ids = hr_request_output(r[i], &o[i].n);
        memcpy(o[i].ids, ids, sizeof(int32_t) * (size_t)o[i].n);
        hr_request_get_stats(r[i], &o[i].st);
        hr_request_release(r[i]);
    }
}

int main(void) {
    void *mem = NULL;
    hr_model *m = rig_build_model("tiny", 3, 0, &mem);
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = 3 + (i * 37) % 500;
    hr_kv_policy win32, wide, bad;
    hr_error err = {0};
    CHECK(hr_kv_policy_parse("window:32", &win32, &err) == HR_OK);
    CHECK(hr_kv_policy_parse("window:512", &wide, &err) == HR_OK);

    rig_opts ro = {.n_blocks = 64, .max_seqs = 4, .max_batch = 128, .n_ctx = 256, .fmt = HR_KV_F16};
    rig r = rig_open(m, &ro);
    hr_kv_pool_ledger before;
    hr_kv_pool_get_ledger(r.kv, &before);

    /* full vs window:32 side by side */
    const hr_kv_policy *pols[3] = {NULL, &win32, &wide};
    out o[3];
    run_all(r.e, prompt, 40, 100, pols, 3, o);
    CHECK(o[0].n == 100 && o[1].n == 100 && o[2].n == 100);
    CHECK(o[0].st.kv.blocks_evicted == 0 && o[0].st.kv.tokens_evicted == 0);
    CHECKF(o[1].st.kv.blocks_evicted > 0 && o[1].st.kv.tokens_evicted > 0, "window:32 evicted %d blocks",
           o[1].st.kv.blocks_evicted);
    CHECKF(o[1].st.kv.bytes_peak < o[0].st.kv.bytes_peak, "window peak %llu >= full peak %llu",
           (unsigned long long)o[1].st.kv.bytes_peak, (unsigned long long)o[0].st.kv.bytes_peak);
    /* a window wider than the sequence changes nothing */
    CHECK(!memcmp(o[0].ids, o[2].ids, sizeof(int32_t) * 100));

    /* a policy the pool cannot use is refused at submit, naming it */
    bad = (hr_kv_policy){.kind = HR_KV_POLICY_WINDOW, .window = 8};
    hr_request *rq = NULL;
    hr_request_params p = {
        .prompt = prompt, .n_prompt = 40, .max_tokens = 4, .sampling = hr_sampler_default_params(), .kv_policy = &bad};
    CHECK(hr_engine_submit(r.e, &p, &rq, &err) == HR_ERR_INVALID_ARG && rq == NULL && strstr(err.msg, "window"));

    /* past the context: n_ctx is 256; a windowed request generates 400 tokens after a 40-token
     * prompt, holding at most a window's blocks; the same request without a window is refused */
    p = (hr_request_params){.prompt = prompt,
                            .n_prompt = 40,
                            .max_tokens = 400,
                            .sampling = hr_sampler_default_params(),
                            .ignore_eos = true};
    CHECK(hr_engine_submit(r.e, &p, &rq, &err) == HR_ERR_RANGE && rq == NULL);
    const hr_kv_policy *long_pol[1] = {&win32};
    out lo;
    run_all(r.e, prompt, 40, 400, long_pol, 1, &lo);
    CHECKF(lo.n == 400 && lo.st.finish == HR_FINISH_LENGTH, "past the context: %d tokens, finish %d", lo.n,
           (int)lo.st.finish);
    CHECKF(lo.st.kv.bytes_peak <= o[1].st.kv.bytes_peak + hr_kv_block_bytes(hr_kv_pool_config(r.kv)),
           "peak %llu vs window peak %llu", (unsigned long long)lo.st.kv.bytes_peak,
           (unsigned long long)o[1].st.kv.bytes_peak);

    hr_kv_pool_ledger after;
    hr_kv_pool_get_ledger(r.kv, &after);
    CHECK(after.blocks_used == 0 && after.blocks_total == before.blocks_total);
    CHECK(hr_kv_pool_check(r.kv, &err) == HR_OK);
    rig_close(&r);

    /* a tight pool with a swap tier: windowed requests are preempted by recompute, never swapped */
    rig_opts tight = {.n_blocks = 8,
                      .max_seqs = 4,
                      .max_batch = 64,
                      .n_ctx = 256,
                      .fmt = HR_KV_F16,
                      .admission = HR_ADMIT_OPTIMISTIC,
                      .swap_blocks = 64,
                      .preempt = HR_PREEMPT_SWAP};
    r = rig_open(m, &tight);
    const hr_kv_policy *all_win[4] = {&win32, &win32, &win32, &win32};
    out w[4];
    run_all(r.e, prompt, 40, 60, all_win, 4, w);
    for (int i = 0; i < 4; i++)
        CHECKF(w[i].n == 60 && w[i].st.finish == HR_FINISH_LENGTH, "request %d: %d tokens, finish %d, state %d: %s", i,
               w[i].n, (int)w[i].st.finish, (int)w[i].st.state, w[i].st.error);
    int swapped = 0, preempted = 0;
    for (int i = 0; i < 4; i++) swapped += w[i].st.swapped_bytes > 0, preempted += w[i].st.n_preemptions;
    printf("tight pool: %d preemptions, %d requests swapped\n", preempted, swapped);
    CHECK(preempted > 0 && swapped == 0);
    for (int i = 1; i < 4; i++) CHECK(!memcmp(w[0].ids, w[i].ids, sizeof(int32_t) * 60));
    hr_kv_pool_get_ledger(r.kv, &after);
    CHECK(after.blocks_used == 0);
    CHECK(hr_kv_pool_check(r.kv, &err) == HR_OK);
    rig_close(&r);
    hr_model_destroy(m);
    free(mem);
    return hr_test_finish();
}

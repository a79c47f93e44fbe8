/* test_engine_events.c: the engine's event ring (hr_engine_events), which the dashboard and
 * `headroom top` draw as markers: every preemption is recorded once, naming its request, in order,
 * with the bytes it held; a window policy's evictions add up to the tokens its ledger says it evicted;
 * reading after a sequence number or with a small cap returns the right slice; per-request stats carry
 * the id events use and end with nothing swapped. Synthetic model; no ../shared needed. */
#include <stdlib.h>
#include <string.h>

#include "test_engine_rig.h"

#define N_REQ 32

static void test_preemption_events(const hr_model *m) {
    rig_opts o = {.n_blocks = 24, .max_seqs = 32, .max_batch = 64, .admission = HR_ADMIT_OPTIMISTIC, .fmt = HR_KV_F32};
    rig r = rig_open(m, &o);
    static int32_t prompts[N_REQ][64];
    rig_req q[N_REQ];
    memset(q, 0, sizeof q);
    for (int i = 0; i < N_REQ; i++) {
        for (int j = 0; j < 64; j++) prompts[i][j] = 1 + (i * 131 + j * 17) % 500;
        q[i] = (rig_req){.prompt = prompts[i], .n_prompt = 20 + i % 40, .max_tokens = 24};
    }
    rig_run(&r, q, N_REQ);
    hr_engine_stats st;
    hr_engine_get_stats(r.e, &st);
    CHECKF(st.preemptions > 0 && st.preemptions < HR_ENGINE_EVENTS, "%llu preemptions (want 1..%d)",
           (unsigned long long)st.preemptions, HR_ENGINE_EVENTS - 1);

    hr_engine_event *ev = calloc(HR_ENGINE_EVENTS, sizeof *ev);
    int n = hr_engine_events(r.e, 0, ev, HR_ENGINE_EVENTS);
    int per_req[N_REQ + 1] = {0};
    uint64_t block_bytes = hr_kv_block_bytes(hr_kv_pool_config(r.kv));
    int n_pre = 0;
    for (int i = 0; i < n; i++) {
        CHECKF(ev[i].seq == (uint64_t)i + 1, "event %d has seq %llu", i, (unsigned long long)ev[i].seq);
        if (i > 0) CHECK(ev[i].t >= ev[i - 1].t);
        CHECK(ev[i].kind != HR_EVENT_EVICT); /* full policy: nothing is evicted */
        CHECKF(ev[i].request >= 1 && ev[i].request <= N_REQ, "event names request %llu",
               (unsigned long long)ev[i].request);
        if (ev[i].request >= 1 && ev[i].request <= N_REQ) per_req[ev[i].request]++;
        CHECKF(ev[i].bytes % block_bytes == 0 && ev[i].tokens >= 0 && ev[i].tokens <= 64 + 24,
               "event %d: %llu bytes, %d tokens", i, (unsigned long long)ev[i].bytes, ev[i].tokens);
        n_pre++;
    }
    CHECKF((uint64_t)n_pre == st.preemptions, "%d preemption events for %llu preemptions", n_pre,
           (unsigned long long)st.preemptions);
    for (int i = 0; i < N_REQ; i++) {
        uint64_t id = q[i].stats.id;
        CHECKF(id >= 1 && id <= N_REQ && per_req[id] == q[i].stats.n_preemptions,
               "request %d (id %llu): %d events, %d preemptions", i, (unsigned long long)id,
               id >= 1 && id <= N_REQ ? per_req[id] : -1, q[i].stats.n_preemptions);
        CHECK(!q[i].stats.swapped && q[i].stats.state == HR_REQ_COMPLETED);
    }
    CHECK(strcmp(hr_engine_event_kind_name(HR_EVENT_PREEMPT_RECOMPUTE), "preempt_recompute") == 0);

    /* slices: after a sequence number, and the newest `cap` */
    if (n >= 3) {
        hr_engine_event two[2];
        CHECK(hr_engine_events(r.e, (uint64_t)n - 1, two, 2) == 1 && two[0].seq == (uint64_t)n);
        CHECK(hr_engine_events(r.e, 0, two, 2) == 2 && two[0].seq == (uint64_t)n - 1 && two[1].seq == (uint64_t)n);
        CHECK(hr_engine_events(r.e, (uint64_t)n, two, 2) == 0);
        CHECK(hr_engine_events(r.e, 0, two, 0) == 0);
    }
    printf("preemption: %d events for %llu preemptions over %d requests\n", n, (unsigned long long)st.preemptions,
           N_REQ);
    free(ev);
    CHECK(rig_pool_clean(&r));
    rig_close(&r);
}

static void test_eviction_events(const hr_model *m) {
    rig_opts o = {.n_blocks = 64, .max_seqs = 4, .max_batch = 128, .n_ctx = 256, .fmt = HR_KV_F16};
    rig r = rig_open(m, &o);
    hr_kv_policy win;
    hr_error err = {0};
    CHECK(hr_kv_policy_parse("window:32", &win, &err) == HR_OK);
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = 3 + (i * 37) % 500;
    hr_request_params p = {.prompt = prompt,
                           .n_prompt = 40,
                           .max_tokens = 150,
                           .sampling = hr_sampler_default_params(),
                           .ignore_eos = true,
                           .kv_policy = &win};
    hr_request *h = NULL;
    CHECKF(hr_engine_submit(r.e, &p, &h, &err) == HR_OK, "submit: %s", err.msg);
    CHECK(hr_engine_run_until_idle(r.e, &err) == HR_OK);
    hr_request_stats s;
    hr_request_get_stats(h, &s);
    hr_request_release(h);
    hr_engine_event ev[64];
    int n = hr_engine_events(r.e, 0, ev, 64), evicted = 0;
    for (int i = 0; i < n; i++) {
        CHECK(ev[i].kind == HR_EVENT_EVICT && ev[i].request == s.id && ev[i].tokens > 0);
        evicted += ev[i].tokens;
    }
    CHECKF(s.kv.tokens_evicted > 0 && evicted == s.kv.tokens_evicted, "events evicted %d tokens, the ledger %d",
           evicted, s.kv.tokens_evicted);
    CHECK(s.n_computed == 0 || s.n_computed <= 40 + 150);
    printf("eviction: window:32 over 190 tokens: %d events, %d tokens evicted\n", n, evicted);
    rig_close(&r);
}

int main(void) {
    void *mem = NULL;
    hr_model *m = rig_build_model("tiny", 3, 0, &mem);
    test_preemption_events(m);
    test_eviction_events(m);
    hr_model_destroy(m);
    free(mem);
    return hr_test_finish();
}

/* test_engine_prefix.c: prefix sharing end to end (issue #4 point 3). A second request whose first
 * 1,000 tokens equal a finished request's reuses every full block of them (992 tokens at block size
 * 16) from the prefix cache, runs only its suffix through the forward pass, and produces exactly the
 * greedy tokens it produces on a fresh engine with nothing cached. */
#include <string.h>

#include "model/synth.h"
#include "test_engine_rig.h"

#define SHARED 1000
#define SUFFIX 60
#define NGEN   16

/* Runs one greedy request to the end; returns its stats, output ids in ids. */
static hr_request_stats run_one(hr_engine *e, const int32_t *prompt, int n, int32_t *ids) {
    hr_request *r = NULL;
    hr_error err = {0};
    hr_request_params p = {.prompt = prompt,
                           .n_prompt = n,
                           .max_tokens = NGEN,
                           .sampling = hr_sampler_default_params(),
                           .ignore_eos = true};
    hr_request_stats st = {0};
    if (hr_engine_submit(e, &p, &r, &err) != HR_OK) {
        fprintf(stderr, "submit: %s\n", err.msg);
        hr_test_failed++;
        return st;
    }
    CHECK(hr_engine_run_until_idle(e, &err) == HR_OK);
    int n_out = 0;
    const int32_t *out = hr_request_output(r, &n_out);
    CHECK(n_out == NGEN);
    memcpy(ids, out, sizeof(int32_t) * NGEN);
    hr_request_get_stats(r, &st);
    hr_request_release(r);
    return st;
}

int main(void) {
    void *mem = NULL;
    hr_model *m = rig_build_model("tiny", 9, 2048, &mem);
    static int32_t a[SHARED + SUFFIX], b[SHARED + SUFFIX];
    hr_rng rng;
    hr_rng_seed(&rng, 5);
    for (int i = 0; i < SHARED; i++) a[i] = b[i] = 3 + (int32_t)(hr_rng_next(&rng) % 500);
    for (int i = SHARED; i < SHARED + SUFFIX; i++) {
        a[i] = 3 + (int32_t)(hr_rng_next(&rng) % 500);
        b[i] = 3 + (int32_t)(hr_rng_next(&rng) % 500);
    }
    b[SHARED] = a[SHARED] == 7 ? 8 : 7; /* the suffixes differ from their first token on */
    rig_opts ro = {.n_blocks = 200, .max_seqs = 2, .max_batch = 256, .n_ctx = 2048, .fmt = HR_KV_F16};

    /* engine 1: A, then B with A's blocks in the prefix cache */
    rig r = rig_open(m, &ro);
    int32_t out_a[NGEN], out_b[NGEN], out_b_fresh[NGEN];
    hr_request_stats sa = run_one(r.e, a, SHARED + SUFFIX, out_a);
    hr_engine_stats before;
    hr_engine_get_stats(r.e, &before);
    hr_request_stats sb = run_one(r.e, b, SHARED + SUFFIX, out_b);
    hr_engine_stats after;
    hr_engine_get_stats(r.e, &after);
    uint64_t b_prefill = after.prefill_tokens - before.prefill_tokens;
    printf("A: %d prefix-hit tokens; B: %d prefix-hit tokens, %llu prompt tokens computed of %d\n",
           sa.prefix_hit_tokens, sb.prefix_hit_tokens, (unsigned long long)b_prefill, SHARED + SUFFIX);
    CHECK(sa.prefix_hit_tokens == 0);
    CHECK(sb.prefix_hit_tokens == SHARED / 16 * 16);                    /* 992: every full block of the prefix */
    CHECK(b_prefill == (uint64_t)(SHARED + SUFFIX - SHARED / 16 * 16)); /* only the suffix: 68 tokens */
    CHECK(sb.kv.prefix_hit_tokens == SHARED / 16 * 16);
    rig_close(&r);

    /* engine 2: B alone, nothing cached: the same tokens */
    r = rig_open(m, &ro);
    hr_request_stats sf = run_one(r.e, b, SHARED + SUFFIX, out_b_fresh);
    CHECK(sf.prefix_hit_tokens == 0);
    CHECK(!memcmp(out_b, out_b_fresh, sizeof out_b));
    rig_close(&r);
    hr_model_destroy(m);
    free(mem);
    return hr_test_finish();
}

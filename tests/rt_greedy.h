/* rt_greedy.h: greedy ids of a prompt through a runtime, for the tests that compare two runtimes (the
 * CPU's and the GPU's). Header-only; needs harness.h's CHECK. */
#ifndef HR_TESTS_RT_GREEDY_H
#define HR_TESTS_RT_GREEDY_H

#include <string.h>

#include "harness.h"
#include "runtime/runtime.h"

/* greedy ids of `prompt` (ids, BOS first) on rt, n at most, into out; with top_ids (n x 2 ids, and
 * top_lp their log-probabilities), the two most likely tokens at each step. Returns how many. */
static inline int hr_test_greedy(hr_runtime *rt, const int32_t *prompt, int np, int n, int32_t *out, int32_t *top_ids,
                                 float *top_lp) {
    hr_rt_request_params p = {.prompt_ids = prompt, .n_prompt_ids = np, .max_tokens = n, .ignore_eos = true};
    p.sampling = hr_rt_sampling_default();
    p.sampling.temperature = 0;
    p.logprobs = top_ids != NULL;
    p.top_logprobs = top_ids ? 2 : 0;
    hr_rt_request *r = NULL;
    hr_error err = {0};
    if (hr_runtime_submit(rt, &p, &r, &err) != HR_OK || hr_runtime_run_until_idle(rt, &err) != HR_OK) {
        CHECKF(false, "generate: %s", err.msg);
        if (r) hr_rt_request_release(rt, r);
        return 0;
    }
    hr_rt_result res;
    hr_rt_request_result(r, &res);
    const int k = res.n_ids < n ? res.n_ids : n;
    memcpy(out, res.ids, sizeof(int32_t) * (size_t)k);
    if (top_ids) CHECK(hr_rt_request_logprobs(r, 0, k, NULL, top_ids, top_lp) == k);
    hr_rt_request_release(rt, r);
    return k;
}

#endif

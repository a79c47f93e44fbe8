/* test_sampler.c: greedy is argmax; seeded sampling is deterministic and follows the distribution;
 * top-k/top-p/min-p cut where they should; penalties move the choice. */
#include <math.h>
#include <string.h>

#include "common/util.h"
#include "harness.h"
#include "sampler/sampler.h"
#include "sampler/scan.h"

static hr_sampler *make(hr_sampler_params p, int n);

/* Row kinds for the scans: random, few distinct values (ties everywhere), NaN sprinkled, x[0] NaN, all
 * NaN but x[0], -inf rows, +-0 ties, +inf, the maximum at the very end, denormals, runs of NaN after a
 * finite start, one value throughout */
enum { SCAN_KINDS = 12 };
static void scan_row(hr_rng *rng, int kind, float *x, int n) {
    for (int i = 0; i < n; i++) {
        const float u = (float)hr_rng_uniform(rng);
        switch (kind) {
        case 0: x[i] = 40.0f * u - 20.0f; break;
        case 1: x[i] = (float)(int)(4.0f * u); break;
        case 2: x[i] = u < 0.1f ? NAN : 10.0f * u; break;
        case 3: x[i] = i == 0 ? NAN : u; break;
        case 4: x[i] = i == 0 ? -3.0f : NAN; break;
        case 5: x[i] = u < 0.5f ? -INFINITY : NAN; break;
        case 6: x[i] = u < 0.5f ? 0.0f : -0.0f; break;
        case 7: x[i] = u < 0.01f ? INFINITY : u; break;
        case 8: x[i] = i == n - 1 ? 2.0f : u; break;
        case 9: x[i] = u * 1e-40f; break;
        case 10: x[i] = i >= 40 && i < 400 ? NAN : u; break; /* whole chunks of NaN after a finite start */
        default: x[i] = 1.5f; break;                         /* one value: ties decided by id alone */
        }
    }
}

/* scan.h's AVX2 passes give the portable ones' indices on every kind of row, at every length around the
 * vector widths, from every start; and a sampler with them chooses what one with the portable passes
 * does (greedy and the full chain, the same seed) */
static void test_scans(void) {
    if (!hr_scan_has_avx2()) {
        printf("scans: this CPU has no AVX2 (the portable passes only)\n");
        return;
    }
    hr_rng rng;
    hr_rng_seed(&rng, 77);
    static float x[1100];
    int cases = 0, bad = 0;
    static hr_scan_cand ca[1100], cb[1100];
    double worst_rel = 0;
    for (int kind = 0; kind < SCAN_KINDS; kind++)
        for (int n = 1; n <= 70; n++)
            for (int rep = 0; rep < 3; rep++) {
                scan_row(&rng, kind, x, n);
                bad += hr_scan_argmax_avx2(x, n) != hr_scan_argmax_ref(x, n);
                /* logprobs' normalizer: the same maximum; the sums within 1e-6 relative (NaN alike) */
                const float xa = hr_scan_max_avx2(x, n), xr = hr_scan_max_ref(x, n);
                bad += xa != xr && !(xa != xa && xr != xr);
                if (isfinite(xr)) { /* hr_logsumexp's case */
                    const double ea = hr_scan_sum_exp_avx2(x, n, xr), er = hr_scan_sum_exp_ref(x, n, xr);
                    const double rel = fabs(ea - er) / er;
                    bad += !(rel <= 1e-6);
                    worst_rel = rel > worst_rel ? rel : worst_rel;
                }
                cases += 2;
                /* top-k's floor over k chunks of 8 or 16, and what is collected at it */
                for (int cs = 8; cs <= 16; cs += 8)
                    if (n >= cs) {
                        const int k = n / cs;
                        const float fa = hr_scan_chunk_floor_avx2(x, k, cs), fr = hr_scan_chunk_floor_ref(x, k, cs);
                        bad += fa != fr && !(fa != fa && fr != fr);
                        const int ma = hr_scan_collect_avx2(x, n, fr, ca), mr = hr_scan_collect_ref(x, n, fr, cb);
                        bad += ma != mr || memcmp(ca, cb, sizeof ca[0] * (size_t)mr) != 0;
                        cases += 2;
                    }
                for (int from = 0; from <= n; from += 1 + n / 9) {
                    const float t = from < n && x[from] == x[from] ? x[from] : 0.5f;
                    bad += hr_scan_above_avx2(x, from, n, t) != hr_scan_above_ref(x, from, n, t);
                    bad += hr_scan_above_avx2(x, from, n, -INFINITY) != hr_scan_above_ref(x, from, n, -INFINITY);
                    bad += hr_scan_above_avx2(x, from, n, NAN) != hr_scan_above_ref(x, from, n, NAN);
                    cases += 3;
                }
                cases++;
            }
    CHECKF(bad == 0, "%d of %d scans differ from the portable ones", bad, cases);
    /* whole samplers over 1,100-token rows: greedy and the default chain at temperature 0.8 (top-k 40
     * by the floor and the collected logits with AVX2, by the one-pass heap when portable) */
    int differ = 0, draws = 0;
    for (int greedy = 0; greedy < 2; greedy++) {
        hr_sampler_params q = hr_sampler_default_params();
        q.temperature = greedy ? 0.0f : 0.8f;
        q.seed = 5;
        hr_sampler *a = make(q, 1100);
        q.portable = true;
        hr_sampler *b = make(q, 1100);
        for (int kind = 0; kind < SCAN_KINDS; kind++)
            for (int rep = 0; rep < 20; rep++) {
                scan_row(&rng, kind, x, 1100);
                differ += hr_sampler_sample(a, x) != hr_sampler_sample(b, x);
                draws++;
            }
        hr_sampler_destroy(a);
        hr_sampler_destroy(b);
    }
    CHECKF(differ == 0, "%d of %d sampled ids differ between the AVX2 and the portable passes", differ, draws);
    printf("scans: %d argmax, max, sum-of-exp, floor, collect and above scans (sums within %.2g relative), %d "
           "sampled ids: AVX2 %s the portable passes\n",
           cases, worst_rel, draws, bad + differ == 0 ? "equal to" : "DIFFERENT from");
    /* hr_logsumexp against the double one over a 128256-logit row */
    static float big[128256];
    scan_row(&rng, 0, big, 128256);
    const float m = hr_scan_max_ref(big, 128256);
    const double lse = m + log(hr_scan_sum_exp_ref(big, 128256, m));
    CHECKF(fabs(hr_logsumexp(big, 128256) - lse) <= 2e-5 * fabs(lse) + 1e-6, "hr_logsumexp %.9g, double %.9g",
           (double)hr_logsumexp(big, 128256), lse);
    /* rows with no finite maximum, and NaN beside finite logits (counted as nothing) */
    const float neg[3] = {-INFINITY, NAN, -INFINITY}, pos[3] = {1.0f, INFINITY, 2.0f}, mixed[3] = {0.0f, NAN, 0.0f};
    CHECK(hr_logsumexp(neg, 3) == -INFINITY && hr_logsumexp(pos, 3) == INFINITY);
    CHECKF(fabs(hr_logsumexp(mixed, 3) - logf(2.0f)) < 1e-6, "%g", (double)hr_logsumexp(mixed, 3));
}

static int ref_cmp(const void *a, const void *b) { /* best first: larger logit, then lower id */
    const hr_scan_cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* hr_top_logits (logprobs' top alternatives) against sorting every logit that is not NaN: the same ids
 * and values in the same order, on every kind of row (NaN runs, infinities, ties, one value), at every
 * length around the vector widths, for k up to 20 and past the row */
static void test_top_logits(void) {
    hr_rng rng;
    hr_rng_seed(&rng, 91);
    static float x[1100];
    static hr_scan_cand all[1100];
    int32_t ids[HR_TOP_LOGITS_MAX];
    float vals[HR_TOP_LOGITS_MAX];
    int cases = 0, bad = 0;
    for (int kind = 0; kind < SCAN_KINDS; kind++)
        for (int n = 1; n <= 1100; n += n < 80 ? 1 : 97)
            for (int k = 1; k <= 21; k += 4) {
                scan_row(&rng, kind, x, n);
                int m = 0;
                for (int i = 0; i < n; i++)
                    if (x[i] == x[i]) all[m++] = (hr_scan_cand){.logit = x[i], .id = i};
                qsort(all, (size_t)m, sizeof all[0], ref_cmp);
                const int want = m < k ? m : k, got = hr_top_logits(x, n, k, ids, vals);
                bool ok = got == want;
                for (int j = 0; ok && j < got; j++) ok = ids[j] == all[j].id && vals[j] == all[j].logit;
                bad += !ok;
                cases++;
            }
    CHECKF(bad == 0, "hr_top_logits: %d of %d rows differ from the sorted row", bad, cases);
    const float nan3[3] = {NAN, NAN, NAN};
    CHECK(hr_top_logits(nan3, 3, 2, ids, vals) == 0);
    printf("top logits: %d rows, the k best as the sorted row has them\n", cases);
}

static hr_sampler *make(hr_sampler_params p, int n) {
    hr_sampler *s = NULL;
    hr_error err;
    if (hr_sampler_create(&p, n, &s, &err) != HR_OK) {
        fprintf(stderr, "sampler: %s\n", err.msg);
        exit(1);
    }
    return s;
}

int main(void) {
    float logits[6] = {0.1f, 2.0f, -1.0f, 1.9f, 0.0f, 2.0f};
    hr_sampler_params p = hr_sampler_default_params();

    /* greedy: the first of the tied maxima */
    hr_sampler *s = make(p, 6);
    CHECK(hr_sampler_sample(s, logits) == 1);
    CHECK(hr_argmax(logits, 6) == 1);
    hr_sampler_destroy(s);

    /* hr_sampler_is_argmax: greedy from the logits as they are (what a GPU's argmax may stand in for),
     * not with a temperature, a penalty or a logit bias, each of which can change the choice */
    {
        int32_t bid = 1;
        float bval = -100.0f;
        hr_sampler_params q[5] = {p, p, p, p, p};
        q[1].temperature = 0.7f;
        q[2].repeat_penalty = 1.3f;
        q[3].presence_penalty = 0.5f;
        q[4].bias_ids = &bid, q[4].bias_values = &bval, q[4].n_bias = 1;
        for (int i = 0; i < 5; i++) {
            hr_sampler *g = make(q[i], 6);
            CHECKF(hr_sampler_is_argmax(g) == (i == 0), "case %d", i);
            hr_sampler_destroy(g);
        }
        q[2].penalty_last_n = 0; /* a penalty over no tokens changes nothing */
        hr_sampler *g = make(q[2], 6);
        CHECK(hr_sampler_is_argmax(g));
        hr_sampler_destroy(g);
    }

    /* logit bias: -100 bans (the tie goes to the other maximum), +0.2 lifts token 3 over both, the
     * caller's arrays are copied, and bad entries are refused naming logit_bias */
    {
        int32_t ids[2] = {1, 5};
        float vals[2] = {-100.0f, -100.0f};
        hr_sampler_params q = p;
        q.bias_ids = ids;
        q.bias_values = vals;
        q.n_bias = 1;
        hr_sampler *bs = make(q, 6);
        ids[0] = 0; /* the sampler holds its own copy */
        CHECK(hr_sampler_sample(bs, logits) == 5);
        hr_sampler_destroy(bs);
        ids[0] = 3;
        vals[0] = 0.2f;
        bs = make(q, 6);
        CHECK(hr_sampler_sample(bs, logits) == 3);
        hr_sampler_destroy(bs);
        q.n_bias = 2;
        ids[0] = 1;
        vals[0] = -100.0f;
        q.temperature = 1.0f;
        q.top_k = 0;
        q.top_p = 1.0f;
        q.min_p = 0.0f;
        bs = make(q, 6);
        int hit = 0;
        for (int i = 0; i < 200; i++) {
            int t = hr_sampler_sample(bs, logits);
            hit += t == 1 || t == 5;
        }
        CHECK(hit == 0); /* banned tokens are never drawn */
        hr_sampler_destroy(bs);
        hr_error err = {0};
        hr_sampler *none = NULL;
        ids[1] = 6; /* outside the vocabulary of 6 */
        CHECK(hr_sampler_create(&q, 6, &none, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "logit bias") && !none &&
              err.param == HR_PARAM_LOGIT_BIAS);
        ids[1] = 5;
        vals[1] = 100.5f;
        CHECK(hr_sampler_create(&q, 6, &none, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "logit bias") && !none &&
              err.param == HR_PARAM_LOGIT_BIAS);
    }

    /* seeded sampling is reproducible; different seeds give a different sequence */
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = 7;
    hr_sampler *a = make(p, 6), *b = make(p, 6);
    p.seed = 8;
    hr_sampler *c = make(p, 6);
    int same_ab = 1, same_ac = 1;
    for (int i = 0; i < 64; i++) {
        int ta = hr_sampler_sample(a, logits), tb = hr_sampler_sample(b, logits), tc = hr_sampler_sample(c, logits);
        same_ab &= ta == tb;
        same_ac &= ta == tc;
    }
    CHECK(same_ab);
    CHECK(!same_ac);
    /* reset re-seeds: the sequence starts over */
    hr_sampler_reset(a);
    hr_sampler_reset(b);
    CHECK(hr_sampler_sample(a, logits) == hr_sampler_sample(b, logits));
    hr_sampler_destroy(a);
    hr_sampler_destroy(b);
    hr_sampler_destroy(c);

    /* frequencies follow softmax(logits / T): 3 tokens with probabilities .5 .3 .2 */
    float l3[3] = {logf(0.5f), logf(0.3f), logf(0.2f)};
    p.seed = 123;
    s = make(p, 3);
    int counts[3] = {0};
    const int N = 40000;
    for (int i = 0; i < N; i++) counts[hr_sampler_sample(s, l3)]++;
    CHECKF(fabs(counts[0] / (double)N - 0.5) < 0.015, "p0 %f", counts[0] / (double)N);
    CHECKF(fabs(counts[1] / (double)N - 0.3) < 0.015, "p1 %f", counts[1] / (double)N);
    CHECKF(fabs(counts[2] / (double)N - 0.2) < 0.015, "p2 %f", counts[2] / (double)N);
    hr_sampler_destroy(s);

    /* temperature 0.5 sharpens: p ~ (.5^2, .3^2, .2^2) normalized = .658 .237 .105 */
    p.temperature = 0.5f;
    s = make(p, 3);
    memset(counts, 0, sizeof counts);
    for (int i = 0; i < N; i++) counts[hr_sampler_sample(s, l3)]++;
    CHECKF(fabs(counts[0] / (double)N - 0.25 / 0.38) < 0.015, "T=0.5 p0 %f", counts[0] / (double)N);
    hr_sampler_destroy(s);
    p.temperature = 1.0f;

    /* top-k 1 and tiny top-p always pick the best; min-p 0.7 keeps only tokens within 70% of the best */
    p.top_k = 1;
    s = make(p, 6);
    int ok = 1;
    for (int i = 0; i < 200; i++) ok &= hr_sampler_sample(s, logits) == 1;
    CHECK(ok);
    hr_sampler_destroy(s);
    p.top_k = 0;
    p.top_p = 0.01f;
    s = make(p, 3);
    ok = 1;
    for (int i = 0; i < 200; i++) ok &= hr_sampler_sample(s, l3) == 0;
    CHECK(ok);
    hr_sampler_destroy(s);
    p.top_p = 1.0f;
    p.min_p = 0.7f; /* .3/.5 = .6 < .7: only token 0 survives */
    s = make(p, 3);
    ok = 1;
    for (int i = 0; i < 200; i++) ok &= hr_sampler_sample(s, l3) == 0;
    CHECK(ok);
    hr_sampler_destroy(s);
    p.min_p = 0.5f; /* token 1 (.6) survives, token 2 (.4) does not */
    s = make(p, 3);
    memset(counts, 0, sizeof counts);
    for (int i = 0; i < 4000; i++) counts[hr_sampler_sample(s, l3)]++;
    CHECK(counts[2] == 0 && counts[1] > 0);
    hr_sampler_destroy(s);

    /* top-p 0.75 over .5 .3 .2: keeps tokens 0 and 1 (cumulative .8 >= .75) */
    p.min_p = 0.0f;
    p.top_p = 0.75f;
    s = make(p, 3);
    memset(counts, 0, sizeof counts);
    for (int i = 0; i < 4000; i++) counts[hr_sampler_sample(s, l3)]++;
    CHECK(counts[2] == 0 && counts[1] > 0);
    hr_sampler_destroy(s);

    /* repetition penalty: after accepting token 1, greedy picks the other 2.0 token (5) */
    p = hr_sampler_default_params();
    p.repeat_penalty = 1.5f;
    s = make(p, 6);
    hr_sampler_accept(s, 1);
    CHECK(hr_sampler_sample(s, logits) == 5);
    /* now 1 and 5 are both penalized (2.0/1.5 = 1.33) and 3 (1.9) wins */
    CHECK(hr_sampler_sample(s, logits) == 3);
    hr_sampler_destroy(s);

    /* frequency penalty grows with the count; presence penalty is flat */
    p = hr_sampler_default_params();
    p.frequency_penalty = 0.06f;
    s = make(p, 6);
    hr_sampler_accept(s, 1);
    hr_sampler_accept(s, 1);
    hr_sampler_accept(s, 5);
    /* 1: 2.0 - 0.12 = 1.88, 5: 2.0 - 0.06 = 1.94, 3: 1.9 -> 5 */
    CHECK(hr_sampler_sample(s, logits) == 5);
    hr_sampler_destroy(s);
    p = hr_sampler_default_params();
    p.presence_penalty = 0.2f;
    s = make(p, 6);
    hr_sampler_accept(s, 1);
    hr_sampler_accept(s, 5);
    CHECK(hr_sampler_sample(s, logits) == 3);
    hr_sampler_destroy(s);

    /* invalid parameters are refused with the field named */
    hr_error err;
    p = hr_sampler_default_params();
    p.top_p = 0.0f;
    CHECK(hr_sampler_params_check(&p, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "top-p") &&
          err.param == HR_PARAM_TOP_P && !strcmp(err.value, "0"));
    p = hr_sampler_default_params();
    p.temperature = NAN;
    CHECK(hr_sampler_params_check(&p, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "temperature"));
    /* masked sampling (constrained decoding): greedy picks the best allowed token; every mode draws
     * only allowed tokens, in proportion among them; top-k counts allowed tokens only */
    {
        float ml[6] = {0.1f, 2.0f, -1.0f, 1.9f, 0.0f, 2.0f};
        uint64_t mask = (1u << 0) | (1u << 2) | (1u << 3); /* ids 0, 2, 3 */
        hr_sampler_params q = hr_sampler_default_params();
        hr_sampler *g = make(q, 6);
        CHECK(hr_sampler_sample_masked(g, ml, &mask) == 3);
        hr_sampler_destroy(g);
        q.temperature = 1.0f;
        q.top_k = 0;
        q.top_p = 1.0f;
        q.min_p = 0.0f;
        q.seed = 11;
        hr_sampler *t = make(q, 6);
        int hits[6] = {0};
        for (int i = 0; i < 20000; i++) hits[hr_sampler_sample_masked(t, ml, &mask)]++;
        CHECK(hits[1] == 0 && hits[4] == 0 && hits[5] == 0);
        /* p(3) / p(0) = e^(1.9 - 0.1) = 6.05 */
        double ratio = (double)hits[3] / (double)hits[0];
        CHECKF(ratio > 5.3 && ratio < 6.9, "ratio %g", ratio);
        hr_sampler_destroy(t);
        q.top_k = 1; /* the best allowed token, not the best token */
        t = make(q, 6);
        int best = 1;
        for (int i = 0; i < 200; i++) best &= hr_sampler_sample_masked(t, ml, &mask) == 3;
        CHECK(best);
        hr_sampler_destroy(t);
        /* every allowed logit -inf: still an allowed token */
        float inf_l[6] = {-INFINITY, 5, -INFINITY, -INFINITY, 1, 2};
        q.top_k = 40;
        t = make(q, 6);
        int32_t tok = hr_sampler_sample_masked(t, inf_l, &mask);
        CHECK(tok == 0 || tok == 2 || tok == 3);
        hr_sampler_destroy(t);
        q.temperature = 0;
        t = make(q, 6);
        tok = hr_sampler_sample_masked(t, inf_l, &mask);
        CHECK(tok == 0 || tok == 2 || tok == 3);
        hr_sampler_destroy(t);
    }
    test_scans();
    test_top_logits();
    return hr_test_finish();
}

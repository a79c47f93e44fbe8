/* test_engine.c: the engine end to end on a synthetic model (always runs; no ../shared needed).
 *   - batch invariance: greedy tokens of every request equal its tokens when run alone, for batches
 *     of 1 to 64, prefill chunks of 1 to 512 tokens, prefix-cache hits and preemption;
 *   - seeded sampling survives preemption: the same tokens as an uninterrupted run;
 *   - admission: reserve never preempts, optimistic and adaptive do when the pool is tight, all
 *     complete; refusals at submit (range, budget, full queue with a retry hint);
 *   - contiguous layout (one max-context slot per sequence) gives the same tokens at lower concurrency;
 *   - priorities (higher first, FCFS within one), cancellation at any point (randomized) leaves the
 *     pool as it started, every request ends in exactly one final state;
 *   - the engine thread with consumers reading the channels. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "model/synth.h"
#include "test_engine_rig.h"
#include "watchdog.h"

#define NP       64
#define PLEN_MAX 80

static int32_t prompts[NP][PLEN_MAX];
static int plen[NP];
static int32_t ref_greedy[NP][RIG_MAX_OUT];
static int32_t ref_sampled[NP][RIG_MAX_OUT];
static const int NGEN = 24;

/* Prompts of 3..80 tokens; every fourth shares a 40-token prefix with prompt 0 (prefix-cache hits). */
static void make_prompts(void) {
    hr_rng rng;
    hr_rng_seed(&rng, 11);
    for (int i = 0; i < NP; i++) {
        plen[i] = 3 + (int)(hr_rng_next(&rng) % (PLEN_MAX - 3));
        for (int j = 0; j < plen[i]; j++) prompts[i][j] = 1 + (int32_t)(hr_rng_next(&rng) % 500);
        if (i % 4 == 0 && i > 0) {
            plen[i] = HR_MAX(plen[i], 48);
            memcpy(prompts[i], prompts[0], sizeof(int32_t) * 40);
        }
    }
    plen[0] = HR_MAX(plen[0], 48);
}

static void fill(rig_req *q, int n, bool sampled) {
    memset(q, 0, sizeof *q * (size_t)n);
    for (int i = 0; i < n; i++) {
        q[i].prompt = prompts[i];
        q[i].n_prompt = plen[i];
        q[i].max_tokens = NGEN;
        q[i].temp = sampled ? 0.9f : 0;
        q[i].seed = 1000 + (uint64_t)i;
    }
}

static rig_opts opts(int n_blocks, int max_seqs, int max_batch, int chunk, hr_admission adm) {
    return (rig_opts){.n_blocks = n_blocks,
                      .max_seqs = max_seqs,
                      .max_batch = max_batch,
                      .prefill_chunk = chunk,
                      .admission = adm,
                      .layout = HR_LAYOUT_PAGED,
                      .fmt = HR_KV_F32};
}

/* Each prompt alone in a fresh engine: the reference outputs. */
static void make_reference(const hr_model *m) {
    for (int i = 0; i < NP; i++) {
        for (int s = 0; s < 2; s++) {
            rig_opts o = opts(64, 1, 512, 0, HR_ADMIT_RESERVE);
            rig r = rig_open(m, &o);
            rig_req q[1];
            fill(q, 1, s == 1);
            q[0].prompt = prompts[i], q[0].n_prompt = plen[i], q[0].seed = 1000 + (uint64_t)i;
            rig_run(&r, q, 1);
            CHECK(q[0].n_out == NGEN && q[0].stats.state == HR_REQ_COMPLETED);
            memcpy(s ? ref_sampled[i] : ref_greedy[i], q[0].out, sizeof(int32_t) * NGEN);
            /* one prefill step samples the first token; every later step is pure decode */
            hr_engine_stats st;
            hr_engine_get_stats(r.e, &st);
            CHECKF(st.generated_tokens == (uint64_t)NGEN && st.decode_steps == (uint64_t)NGEN - 1 &&
                       st.decode_tokens == (uint64_t)NGEN - 1 && st.steps == (uint64_t)NGEN,
                   "decode stats: %llu steps, %llu decode steps, %llu decode tokens for a %d-token prompt and %d "
                   "generated",
                   (unsigned long long)st.steps, (unsigned long long)st.decode_steps,
                   (unsigned long long)st.decode_tokens, plen[i], NGEN);
            rig_close(&r);
        }
    }
}

/* Counts requests whose output differs from the reference. */
static int mismatches(const rig_req *q, int n, bool sampled) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        const int32_t *ref = sampled ? ref_sampled[i] : ref_greedy[i];
        if (q[i].n_out != NGEN || memcmp(q[i].out, ref, sizeof(int32_t) * NGEN) != 0) bad++;
    }
    return bad;
}

static void test_batch_invariance(const hr_model *m) {
    static const int sizes[] = {1, 2, 7, 16, 64};
    static const int chunks[] = {0, 1, 5, 16, 33};
    rig_req *q = malloc(sizeof *q * NP);
    for (size_t si = 0; si < HR_ARRAY_LEN(sizes); si++) {
        for (size_t ci = 0; ci < HR_ARRAY_LEN(chunks); ci++) {
            if (sizes[si] < 16 && ci > 2) continue;
            rig_opts o = opts(1024, 64, chunks[ci] == 1 ? 64 : 256, chunks[ci], HR_ADMIT_ADAPTIVE);
            rig r = rig_open(m, &o);
            fill(q, sizes[si], false);
            rig_run(&r, q, sizes[si]);
            int bad = mismatches(q, sizes[si], false);
            CHECKF(bad == 0, "batch of %d, prefill chunk %d: %d requests differ from their solo run", sizes[si],
                   chunks[ci], bad);
            CHECK(rig_pool_clean(&r));
            hr_engine_stats st;
            hr_engine_get_stats(r.e, &st);
            CHECK(st.completed == (uint64_t)sizes[si]);
            if (sizes[si] == 64) {
                /* one-token chunks admit everything before any shared block is full: no hits there */
                CHECKF(chunks[ci] == 1 || st.prefix_hit_tokens > 0,
                       "no prefix-cache hits in a batch with shared prefixes");
                printf("batch 64, chunk %3d: %llu steps, peak %d running, %llu prefix-hit tokens, identical\n",
                       chunks[ci], (unsigned long long)st.steps, st.peak_running,
                       (unsigned long long)st.prefix_hit_tokens);
            }
            rig_close(&r);
        }
    }
    free(q);
}

/* A pool too small for everything at once: preemption must not change a single token, greedy or
 * seeded sampling. */
static void test_preemption(const hr_model *m) {
    rig_req *q = malloc(sizeof *q * NP);
    static const hr_admission modes[] = {HR_ADMIT_OPTIMISTIC, HR_ADMIT_ADAPTIVE, HR_ADMIT_RESERVE};
    for (int sampled = 0; sampled < 2; sampled++) {
        for (size_t mi = 0; mi < HR_ARRAY_LEN(modes); mi++) {
            rig_opts o = opts(24, 32, 64, 0, modes[mi]); /* 24 blocks = 384 tokens for 32 x ~70 */
            rig r = rig_open(m, &o);
            fill(q, 32, sampled);
            rig_run(&r, q, 32);
            int bad = mismatches(q, 32, sampled);
            hr_engine_stats st;
            hr_engine_get_stats(r.e, &st);
            CHECKF(bad == 0, "%s admission, %s: %d of 32 requests differ after %llu preemptions",
                   hr_admission_name(modes[mi]), sampled ? "sampled" : "greedy", bad,
                   (unsigned long long)st.preemptions);
            CHECK(st.completed == 32 && rig_pool_clean(&r));
            if (modes[mi] == HR_ADMIT_RESERVE) CHECKF(st.preemptions == 0, "reserve mode preempted");
            if (modes[mi] == HR_ADMIT_OPTIMISTIC) CHECKF(st.preemptions > 0, "optimistic mode never preempted");
            int per_req = 0;
            for (int i = 0; i < 32; i++) per_req += q[i].stats.n_preemptions;
            CHECK((uint64_t)per_req == st.preemptions);
            printf("%-10s %-7s: 32 requests in 24 blocks: %llu preemptions, %llu recomputed tokens, peak %d running, "
                   "identical\n",
                   hr_admission_name(modes[mi]), sampled ? "sampled" : "greedy", (unsigned long long)st.preemptions,
                   (unsigned long long)st.recomputed_tokens, st.peak_running);
            rig_close(&r);
        }
    }
    free(q);
}

/* Adaptive admission learns completion lengths: after a wave of 8-token completions it claims
 * prompt + 8 instead of prompt + max_tokens, so more requests run at once than under reserve, and
 * those that outgrow the prediction are preempted without changing a token. */
static void test_adaptive(const hr_model *m) {
    int peak[2] = {0, 0};
    static int32_t out_reserve[32][100];
    for (int mode = 0; mode < 2; mode++) {
        rig_opts o = opts(24, 32, 64, 0, mode ? HR_ADMIT_ADAPTIVE : HR_ADMIT_RESERVE);
        rig r = rig_open(m, &o);
        rig_req *q = malloc(sizeof *q * 32);
        fill(q, 16, false);
        for (int i = 0; i < 16; i++) q[i].max_tokens = 8;
        rig_run(&r, q, 16);
        hr_engine_stats st0;
        hr_engine_get_stats(r.e, &st0);
        fill(q, 32, false); /* 8-token prompts, 100-token outputs: reserve claims 7 blocks, adaptive 1 */
        for (int i = 0; i < 32; i++) q[i].n_prompt = 8, q[i].max_tokens = 100;
        rig_run(&r, q, 32);
        hr_engine_stats st;
        hr_engine_get_stats(r.e, &st);
        int bad = 0;
        for (int i = 0; i < 32; i++) {
            if (!mode) memcpy(out_reserve[i], q[i].out, sizeof out_reserve[i]);
            bad += q[i].n_out != 100 || memcmp(out_reserve[i], q[i].out, sizeof out_reserve[i]) != 0;
        }
        CHECKF(bad == 0, "adaptive: %d of 32 differ from reserve (which never preempts)", bad);
        CHECK(rig_pool_clean(&r));
        if (mode) {
            CHECKF(st0.predicted_output == 8, "predicted %d after 16 completions of 8", st0.predicted_output);
            CHECK(st.preemptions > 0); /* 100-token outputs outgrow the prediction of 8 */
        } else {
            CHECK(st.preemptions == 0);
        }
        peak[mode] = st.peak_running;
        printf("%-8s: 16 x 8 tokens, then 32 x (8 + 100) in 24 blocks: prediction %d, peak %d running, %llu "
               "preemptions, %llu recomputed tokens\n",
               mode ? "adaptive" : "reserve", st0.predicted_output, st.peak_running, (unsigned long long)st.preemptions,
               (unsigned long long)st.recomputed_tokens);
        free(q);
        rig_close(&r);
    }
    CHECKF(peak[1] > peak[0], "adaptive peak %d not above reserve's %d", peak[1], peak[0]);
}

/* Swap preemption (and auto): the blocks go to the tier and come back bit for bit, so the tokens are
 * the same again; auto picks swap or recompute per victim. */
static void test_swap(const hr_model *m) {
    rig_req *q = malloc(sizeof *q * NP);
    static const hr_preempt_mode modes[] = {HR_PREEMPT_SWAP, HR_PREEMPT_AUTO};
    for (int sampled = 0; sampled < 2; sampled++) {
        for (size_t mi = 0; mi < HR_ARRAY_LEN(modes); mi++) {
            rig_opts o = opts(24, 32, 64, 0, HR_ADMIT_OPTIMISTIC);
            o.preempt = modes[mi];
            o.swap_blocks = mi == 0 ? 256 : 6; /* auto: a small tier also forces recompute fallbacks */
            rig r = rig_open(m, &o);
            fill(q, 32, sampled);
            rig_run(&r, q, 32);
            hr_engine_stats st;
            hr_engine_get_stats(r.e, &st);
            int bad = mismatches(q, 32, sampled);
            CHECKF(bad == 0, "preempt %s, %s: %d of 32 differ", hr_preempt_mode_name(modes[mi]),
                   sampled ? "sampled" : "greedy", bad);
            CHECK(st.completed == 32 && rig_pool_clean(&r));
            CHECK(st.preempt_swap + st.preempt_recompute == st.preemptions);
            if (modes[mi] == HR_PREEMPT_SWAP) CHECKF(st.preempt_swap > 0, "swap mode never swapped");
            hr_kv_swap_ledger sl;
            hr_kv_swap_get_ledger(r.swap, &sl);
            CHECK(sl.slots_used == 0);
            printf("preempt %-5s %-7s: %llu preemptions (%llu swapped, %llu KiB moved; %llu recomputed, %llu tokens "
                   "recomputed), identical\n",
                   hr_preempt_mode_name(modes[mi]), sampled ? "sampled" : "greedy", (unsigned long long)st.preemptions,
                   (unsigned long long)st.preempt_swap, (unsigned long long)(st.swapped_bytes >> 10),
                   (unsigned long long)st.preempt_recompute, (unsigned long long)st.recomputed_tokens);
            rig_close(&r);
        }
    }
    free(q);
}

static void test_contiguous(const hr_model *m) {
    rig_req *q = malloc(sizeof *q * 16);
    rig_opts o = opts(64, 16, 128, 0, HR_ADMIT_ADAPTIVE);
    o.layout = HR_LAYOUT_CONTIGUOUS;
    o.n_ctx = 256; /* 16 blocks per slot: 4 slots fit */
    rig r = rig_open(m, &o);
    fill(q, 16, false);
    rig_run(&r, q, 16);
    hr_engine_stats st;
    hr_engine_get_stats(r.e, &st);
    CHECK(mismatches(q, 16, false) == 0);
    CHECKF(st.peak_running == 4, "contiguous: peak %d running, expected 4 slots", st.peak_running);
    CHECK(st.preemptions == 0 && st.prefix_hit_tokens == 0 && rig_pool_clean(&r));
    rig_close(&r);
    free(q);
}

static void test_refusals(const hr_model *m) {
    rig_opts o = opts(8, 4, 64, 0, HR_ADMIT_ADAPTIVE);
    o.n_ctx = 256;
    o.max_queue = 3;
    rig r = rig_open(m, &o);
    hr_error err = {0};
    hr_request *h = NULL;
    hr_request_params p = {.prompt = prompts[1], .n_prompt = plen[1], .max_tokens = 256};
    p.sampling = hr_sampler_default_params();
    CHECK(hr_engine_submit(r.e, &p, &h, &err) == HR_ERR_RANGE && strstr(err.msg, "context") && !h);
    p.max_tokens = 200 - plen[1]; /* within the context, beyond 8 blocks = 128 tokens */
    CHECK(hr_engine_submit(r.e, &p, &h, &err) == HR_ERR_BUDGET && strstr(err.msg, "pool") && !h);
    p.n_prompt = 0;
    CHECK(hr_engine_submit(r.e, &p, &h, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "empty") && !h);
    p.n_prompt = plen[1];
    /* each bad field is refused with its reason, and nothing is queued */
    p.max_tokens = 4;
    int32_t oov[3] = {1, 5, 1 << 20};
    const int32_t *good = p.prompt;
    p.prompt = oov, p.n_prompt = 3;
    CHECK(hr_engine_submit(r.e, &p, &h, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "outside the vocabulary") && !h);
    oov[2] = -1;
    CHECK(hr_engine_submit(r.e, &p, &h, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "vocabulary") && !h);
    p.prompt = good, p.n_prompt = plen[1];
    p.max_tokens = 0;
    CHECK(hr_engine_submit(r.e, &p, &h, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "max tokens") && !h &&
          err.param == HR_PARAM_MAX_TOKENS);
    p.max_tokens = -3;
    CHECK(hr_engine_submit(r.e, &p, &h, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "max tokens") && !h &&
          err.param == HR_PARAM_MAX_TOKENS);
    p.max_tokens = 4;
    p.sampling.temperature = NAN;
    CHECK(hr_engine_submit(r.e, &p, &h, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "temperature") && !h);
    p.sampling.temperature = -1;
    CHECK(hr_engine_submit(r.e, &p, &h, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "temperature") && !h);
    p.sampling = hr_sampler_default_params();
    p.sampling.top_p = 0;
    CHECK(hr_engine_submit(r.e, &p, &h, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "top-p") && !h &&
          err.param == HR_PARAM_TOP_P && !strcmp(err.value, "0"));
    p.sampling = hr_sampler_default_params();
    const char *stops[1] = {""};
    p.stop = stops, p.n_stop = 1;
    CHECK(hr_engine_submit(r.e, &p, &h, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "stop") && !h);
    p.stop = NULL, p.n_stop = 0;
    hr_engine_stats st0;
    hr_engine_get_stats(r.e, &st0);
    CHECK(st0.submitted == 0 && st0.n_waiting == 0);
    p.max_tokens = 4;
    hr_request *acc[3];
    for (int i = 0; i < 3; i++) CHECK(hr_engine_submit(r.e, &p, &acc[i], &err) == HR_OK);
    CHECK(hr_engine_submit(r.e, &p, &h, &err) == HR_ERR_FULL && strstr(err.msg, "retry") && !h);
    CHECK(hr_engine_run_until_idle(r.e, &err) == HR_OK);
    for (int i = 0; i < 3; i++) {
        hr_request_stats s;
        hr_request_get_stats(acc[i], &s);
        CHECK(s.state == HR_REQ_COMPLETED && s.n_output == 4 && s.finish == HR_FINISH_LENGTH);
        hr_request_release(acc[i]);
    }
    CHECK(hr_engine_submit(r.e, &p, &h, &err) == HR_OK); /* the queue drained: accepted again */
    hr_request_release(h);                               /* released before it ran: the engine still ends it */
    CHECK(hr_engine_run_until_idle(r.e, &err) == HR_OK && rig_pool_clean(&r));
    hr_engine_stats st;
    hr_engine_get_stats(r.e, &st);
    CHECK(st.refused_full == 1 && st.refused_budget == 1 && st.completed == 4);
    rig_close(&r);
}

/* A forward pass that fails (positions past the forward context's max_ctx, injected by giving the
 * engine a longer n_ctx) fails the requests of that batch with the reason; the engine goes on and
 * the next request completes; the pool is clean. */
static void test_forward_failure(const hr_model *m) {
    rig_opts o = opts(64, 4, 128, 0, HR_ADMIT_RESERVE);
    o.n_ctx = 256;
    o.ctx_max = 64;
    rig r = rig_open(m, &o);
    hr_error err = {0};
    int32_t longp[70];
    for (int i = 0; i < 70; i++) longp[i] = 1 + i;
    hr_request_params p = {.prompt = longp, .n_prompt = 70, .max_tokens = 4};
    p.sampling = hr_sampler_default_params();
    hr_request *a = NULL, *c = NULL;
    CHECK(hr_engine_submit(r.e, &p, &a, &err) == HR_OK);
    CHECK(hr_engine_run_until_idle(r.e, &err) == HR_OK);
    hr_request_stats s;
    hr_request_get_stats(a, &s);
    CHECKF(s.state == HR_REQ_FAILED && s.finish == HR_FINISH_ERROR && s.error_code == HR_ERR_RANGE &&
               strstr(s.error, "forward pass") && strstr(s.error, "context"),
           "state %s, error '%s'", hr_request_state_name(s.state), s.error);
    p.n_prompt = 10;
    CHECK(hr_engine_submit(r.e, &p, &c, &err) == HR_OK);
    CHECK(hr_engine_run_until_idle(r.e, &err) == HR_OK);
    hr_request_get_stats(c, &s);
    CHECK(s.state == HR_REQ_COMPLETED && s.n_output == 4);
    hr_engine_stats st;
    hr_engine_get_stats(r.e, &st);
    CHECK(st.failed == 1 && st.completed == 1 && rig_pool_clean(&r));
    hr_request_release(a);
    hr_request_release(c);
    rig_close(&r);
}

/* One sequence at a time: a high-priority request submitted last runs before the earlier low ones,
 * and equal priorities run in arrival order. */
static void test_priorities(const hr_model *m) {
    rig_opts o = opts(64, 1, 128, 0, HR_ADMIT_RESERVE);
    rig r = rig_open(m, &o);
    rig_req q[5];
    fill(q, 5, false);
    q[3].priority = 5;
    q[4].priority = 5;
    rig_run(&r, q, 5);
    /* expected order of completion: 3, 4 (priority 5, FCFS), then 0, 1, 2 */
    static const int order[5] = {3, 4, 0, 1, 2};
    int ok = 1;
    for (int k = 1; k < 5; k++) ok &= q[order[k - 1]].stats.t_finish <= q[order[k]].stats.t_first_token;
    CHECKF(ok, "requests did not run in priority then arrival order");
    CHECK(mismatches(q, 5, false) == 0);
    rig_close(&r);
}

/* Random submits and cancels between steps (and a few without steps); afterwards every request is in
 * exactly one final state, the counts add up, and the pool is back where it started. */
static void test_random_cancel(const hr_model *m) {
    for (int round = 0; round < 3; round++) {
        rig_opts o = opts(round == 2 ? 12 : 20 + round * 10, 8, 48, round == 1 ? 7 : 0, (hr_admission)round);
        rig r = rig_open(m, &o);
        hr_kv_pool_ledger l0;
        hr_kv_pool_get_ledger(r.kv, &l0);
        hr_rng rng;
        hr_rng_seed(&rng, 100 + (uint64_t)round);
        enum { N = 120 };
        hr_request *h[N] = {0};
        int n = 0;
        hr_error err = {0};
        for (int it = 0; it < 400 && (n < N || true); it++) {
            uint64_t a = hr_rng_next(&rng) % 10;
            if (a < 4 && n < N) {
                int i = (int)(hr_rng_next(&rng) % NP);
                hr_request_params p = {.prompt = prompts[i],
                                       .n_prompt = plen[i],
                                       .max_tokens = 1 + (int)(hr_rng_next(&rng) % 40),
                                       .priority = (int)(hr_rng_next(&rng) % 3)};
                p.sampling = hr_sampler_default_params();
                if (hr_engine_submit(r.e, &p, &h[n], &err) == HR_OK) n++;
            } else if (a < 6 && n > 0) {
                hr_engine_cancel(r.e, h[hr_rng_next(&rng) % (uint64_t)n]);
            } else {
                int pending = 0;
                CHECK(hr_engine_step(r.e, &pending, &err) == HR_OK);
                hr_error ce;
                if (hr_kv_pool_check(r.kv, &ce) != HR_OK) {
                    CHECKF(0, "pool check after a step: %s", ce.msg);
                    break;
                }
            }
        }
        CHECK(hr_engine_run_until_idle(r.e, &err) == HR_OK);
        int done = 0, cancelled = 0, failed = 0;
        for (int i = 0; i < n; i++) {
            hr_request_stats s;
            hr_request_get_stats(h[i], &s);
            done += s.state == HR_REQ_COMPLETED;
            cancelled += s.state == HR_REQ_CANCELLED;
            failed += s.state == HR_REQ_FAILED;
            hr_request_release(h[i]);
        }
        hr_engine_stats st;
        hr_engine_get_stats(r.e, &st);
        CHECKF(done + cancelled + failed == n && failed == 0, "%d submitted: %d completed, %d cancelled, %d failed", n,
               done, cancelled, failed);
        CHECK(st.completed == (uint64_t)done && st.cancelled == (uint64_t)cancelled && st.submitted == (uint64_t)n);
        hr_kv_pool_ledger l1;
        hr_kv_pool_get_ledger(r.kv, &l1);
        CHECK(rig_pool_clean(&r) && l1.blocks_total == l0.blocks_total);
        printf("random cancel round %d (%s): %d submitted, %d completed, %d cancelled, %llu preemptions; pool clean\n",
               round, hr_admission_name((hr_admission)round), n, done, cancelled, (unsigned long long)st.preemptions);
        rig_close(&r);
    }
}

/* The engine thread serves requests while consumer threads read their channels token by token. */
typedef struct consumer {
    hr_request *h;
    int32_t got[RIG_MAX_OUT];
    int n;
} consumer;

static void *consume(void *arg) {
    consumer *c = arg;
    for (;;) {
        hr_watchdog_wait(c->h, "a threaded stream");
        hr_request_delta d;
        hr_request_read(c->h, c->got + c->n, RIG_MAX_OUT - c->n, NULL, 0, &d);
        c->n += d.n_tokens;
        if (d.done) break;
    }
    return NULL;
}

static void test_thread(const hr_model *m) {
    rig_opts o = opts(40, 8, 64, 0, HR_ADMIT_OPTIMISTIC);
    rig r = rig_open(m, &o);
    hr_error err = {0};
    CHECK(hr_engine_start(r.e, &err) == HR_OK);
    enum { N = 16 };
    consumer c[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        hr_request_params p = {.prompt = prompts[i], .n_prompt = plen[i], .max_tokens = NGEN, .ignore_eos = true};
        p.sampling = hr_sampler_default_params();
        c[i].n = 0;
        CHECK(hr_engine_submit(r.e, &p, &c[i].h, &err) == HR_OK);
        pthread_create(&th[i], NULL, consume, &c[i]);
    }
    CHECK(hr_engine_step(r.e, NULL, &err) == HR_ERR_INVALID_ARG); /* not while the thread runs */
    int bad = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        bad += c[i].n != NGEN || memcmp(c[i].got, ref_greedy[i], sizeof(int32_t) * NGEN) != 0;
        hr_request_release(c[i].h);
    }
    /* cancels from this thread while the engine thread runs: each ends exactly once, cancelled or
     * (if it was quicker) completed; never failed, never lost */
    hr_request *late[8];
    for (int i = 0; i < 8; i++) {
        hr_request_params p = {.prompt = prompts[i], .n_prompt = plen[i], .max_tokens = 200, .ignore_eos = true};
        p.sampling = hr_sampler_default_params();
        CHECK(hr_engine_submit(r.e, &p, &late[i], &err) == HR_OK);
    }
    for (int i = 0; i < 8; i++) hr_engine_cancel(r.e, late[i]);
    int ended = 0;
    for (int i = 0; i < 8; i++) {
        hr_watchdog_wait_done(late[i], "a cancelled request");
        hr_request_stats s;
        hr_request_get_stats(late[i], &s);
        ended += s.state == HR_REQ_CANCELLED || s.state == HR_REQ_COMPLETED;
        hr_request_release(late[i]);
    }
    CHECK(ended == 8);
    hr_engine_stop(r.e);
    CHECKF(bad == 0, "threaded engine: %d of %d streams differ", bad, N);
    CHECK(rig_pool_clean(&r));
    rig_close(&r);
}

/* The step-executor seam: a simulator with no model drives the real scheduler and KV pool. Its
 * "forward" writes zeros as K/V and makes token t+1 the argmax after token t, so greedy outputs are
 * known; a pool of 6 blocks for 4 requests of 40 tokens forces preemption. */
typedef struct sim {
    hr_kv_pool *kv;
    int n_layers, n_vocab, width;
    int calls;
} sim;

static hr_status sim_forward(void *user, const hr_batch *b, float *logits, hr_error *err) {
    (void)err;
    sim *s = user;
    float zero[64] = {0};
    int row = 0;
    for (int i = 0; i < b->n_tokens; i++) {
        for (int l = 0; l < s->n_layers; l++) hr_kv_write(s->kv, l, b->seq[i], b->pos[i], zero, zero);
        if (!b->want_logits[i]) continue;
        float *y = logits + (size_t)row++ * s->n_vocab;
        for (int v = 0; v < s->n_vocab; v++) y[v] = 0;
        y[(b->tokens[i] + 1) % s->n_vocab] = 1;
    }
    s->calls++;
    return HR_OK;
}

/* The simulator's pool (2 layers, f16, block 16, 4 sequences, n_blocks blocks) and the engine
 * parameters that drive it: 32 ids, a context of 64, 4 running. */
static hr_engine_params sim_open(sim *sm, int n_blocks) {
    hr_kv_config kc = {.n_layers = 2,
                       .n_kv_heads = 2,
                       .head_dim = 16,
                       .block_size = 16,
                       .k_format = HR_KV_F16,
                       .v_format = HR_KV_F16,
                       .max_seqs = 4};
    kc.budget_bytes = hr_kv_block_bytes(&kc) * (uint64_t)n_blocks;
    hr_error err = {0};
    *sm = (sim){.n_layers = 2, .n_vocab = 32};
    CHECK(hr_kv_pool_create(&kc, &sm->kv, &err) == HR_OK);
    return (hr_engine_params){
        .kv = sm->kv, .forward = sim_forward, .forward_user = sm, .n_vocab = 32, .n_ctx = 64, .max_running = 4};
}

static void test_step_executor(void) {
    hr_error err = {0};
    sim sm;
    hr_engine_params ep = sim_open(&sm, 6);
    ep.admission = HR_ADMIT_OPTIMISTIC;
    hr_engine *e = NULL;
    CHECK(hr_engine_create(&ep, &e, &err) == HR_OK);
    hr_request *h[4];
    int32_t prompt[4][20];
    for (int i = 0; i < 4; i++) {
        for (int t = 0; t < 20; t++) prompt[i][t] = (i * 7 + t) % 32;
        hr_request_params p = {.prompt = prompt[i], .n_prompt = 20, .max_tokens = 20, .ignore_eos = true};
        p.sampling = hr_sampler_default_params();
        p.sampling.temperature = 0;
        p.logprobs = i == 0; /* request 0 records log-probabilities with its 3 best alternatives */
        p.top_logprobs = i == 0 ? 3 : 0;
        CHECK(hr_engine_submit(e, &p, &h[i], &err) == HR_OK);
    }
    CHECK(hr_engine_run_until_idle(e, &err) == HR_OK);
    hr_engine_stats st;
    hr_engine_get_stats(e, &st);
    CHECK(st.preemptions > 0 && st.completed == 4 && sm.calls > 0);
    for (int i = 0; i < 4; i++) {
        int n = 0;
        const int32_t *o = hr_request_output(h[i], &n);
        bool ok = n == 20;
        for (int t = 0; t < n && ok; t++) ok = o[t] == (prompt[i][19] + 1 + t) % 32;
        CHECKF(ok, "request %d: %d tokens, simulated ids wrong", i, n);
    }
    hr_kv_pool_ledger l;
    hr_kv_pool_get_ledger(sm.kv, &l);
    CHECK(l.blocks_used == 0 && hr_kv_pool_check(sm.kv, &err) == HR_OK);
    /* the simulated logits are one-hot (1 at the next id, 0 elsewhere over 32 ids): the chosen token's
     * log-probability is 1 - ln(e + 31), every other one -ln(e + 31); the top list starts with the
     * chosen token; preemption in between changed none of it */
    float lp[20], tlp[60];
    int32_t tid[60];
    CHECK(hr_request_logprobs(h[0], 0, 20, lp, tid, tlp) == 20);
    CHECK(hr_request_logprobs(h[1], 0, 20, lp, NULL, NULL) == 0); /* not asked for */
    CHECK(hr_request_logprobs(h[0], 0, 20, lp, tid, tlp) == 20);
    int n0 = 0;
    const int32_t *o0 = hr_request_output(h[0], &n0);
    double lse = log(exp(1.0) + 31.0);
    bool lp_ok = n0 == 20;
    for (int t = 0; t < 20 && lp_ok; t++)
        lp_ok = fabs(lp[t] - (1.0 - lse)) < 1e-5 && tid[3 * t] == o0[t] && fabs(tlp[3 * t] - lp[t]) < 1e-6 &&
                fabs(tlp[3 * t + 1] + lse) < 1e-5 && fabs(tlp[3 * t + 2] + lse) < 1e-5 && tid[3 * t + 1] != o0[t];
    CHECKF(lp_ok, "logprobs differ from the one-hot distribution's: %f (want %f)", lp[0], 1.0 - lse);
    CHECK(hr_request_logprobs(h[0], 18, 5, lp, NULL, NULL) == 2); /* only what exists */
    /* inter-token gaps: one fewer than the tokens, none negative, their sum the first-to-last span */
    float gaps[32];
    hr_request_stats rs;
    hr_request_get_stats(h[0], &rs);
    CHECK(hr_request_token_gaps(h[0], gaps, 32) == 19 && hr_request_token_gaps(h[0], gaps, 5) == 5);
    CHECK(hr_request_token_gaps(h[0], gaps, 32) == 19);
    double span = 0;
    bool nonneg = true;
    for (int t = 0; t < 19; t++) span += gaps[t], nonneg = nonneg && gaps[t] >= 0;
    CHECK(nonneg && span <= rs.t_finish - rs.t_first_token + 1e-3);
    for (int i = 0; i < 4; i++) hr_request_release(h[i]);
    /* top_logprobs is bounded and needs logprobs */
    hr_request_params bad = {.prompt = prompt[0], .n_prompt = 20, .max_tokens = 2, .top_logprobs = 3};
    bad.sampling = hr_sampler_default_params();
    hr_request *hb = NULL;
    CHECK(hr_engine_submit(e, &bad, &hb, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "top logprobs") && !hb &&
          err.param == HR_PARAM_TOP_LOGPROBS);
    bad.logprobs = true;
    bad.top_logprobs = 21;
    CHECK(hr_engine_submit(e, &bad, &hb, &err) == HR_ERR_INVALID_ARG && !hb);
    /* without a model, n_ctx and n_vocab are required */
    ep.n_vocab = 0;
    hr_engine *e2 = NULL;
    CHECK(hr_engine_create(&ep, &e2, &err) == HR_ERR_INVALID_ARG && !e2);
    hr_engine_destroy(e);
    hr_kv_pool_destroy(sm.kv);
}

/* The step observer (serve --step-log) sees each computed step as it ran: one request of a 5-token
 * prompt and 3 outputs is a prefill step of 5 tokens (keys 1+2+3+4+5) and two decode steps of one
 * token (6 and 7 keys); with a second request submitted after the first step, a step of one decode row
 * and a 4-token prompt. */
typedef struct step_log {
    hr_engine_step_info s[16];
    int n;
} step_log;

static void on_step(void *user, const hr_engine_step_info *s) {
    step_log *l = user;
    if (l->n < 16) l->s[l->n++] = *s;
}

static void test_step_observer(void) {
    hr_error err = {0};
    sim sm;
    step_log lg = {0};
    hr_engine_params ep = sim_open(&sm, 8);
    ep.on_step = on_step;
    ep.on_step_user = &lg;
    hr_engine *e = NULL;
    CHECK(hr_engine_create(&ep, &e, &err) == HR_OK);
    int32_t p1[5] = {1, 2, 3, 4, 5}, p2[4] = {9, 8, 7, 6};
    hr_request_params rp = {.prompt = p1, .n_prompt = 5, .max_tokens = 3, .ignore_eos = true};
    rp.sampling = hr_sampler_default_params();
    hr_request *h1 = NULL, *h2 = NULL;
    CHECK(hr_engine_submit(e, &rp, &h1, &err) == HR_OK);
    int left = 0;
    CHECK(hr_engine_step(e, &left, &err) == HR_OK);
    rp.prompt = p2, rp.n_prompt = 4, rp.max_tokens = 1;
    CHECK(hr_engine_submit(e, &rp, &h2, &err) == HR_OK);
    CHECK(hr_engine_run_until_idle(e, &err) == HR_OK);
    const hr_engine_step_info *s = lg.s;
    CHECKF(lg.n == 3, "%d steps observed", lg.n);
    CHECK(s[0].n_tokens == 5 && s[0].n_prefill == 5 && s[0].n_rows == 1 && s[0].n_seqs == 1 && s[0].visible_keys == 15);
    CHECK(s[1].n_tokens == 5 && s[1].n_prefill == 4 && s[1].n_rows == 2 && s[1].n_seqs == 2 &&
          s[1].visible_keys == 6 + (1 + 2 + 3 + 4));
    CHECK(s[2].n_tokens == 1 && s[2].n_prefill == 0 && s[2].n_rows == 1 && s[2].visible_keys == 7);
    bool times = true;
    for (int i = 0; i < lg.n; i++)
        times = times && s[i].forward_s >= 0 && s[i].step_s >= s[i].forward_s &&
                (i == 0 || s[i].t_begin >= s[i - 1].t_begin);
    CHECK(times);
    hr_request_release(h1);
    hr_request_release(h2);
    hr_engine_destroy(e);
    hr_kv_pool_destroy(sm.kv);
}

/* Rows sampled on the pool's threads (a step's rows x vocabulary past the CPU backend's
 * hr_model_ctx_run_items_min: 8 rows of 40,000) choose what one thread chooses: eight seeded requests
 * with logprobs and their top 3, run alone (one row a step: one thread) and together, give the same
 * ids and the same bits. */
static void test_threaded_sampling(void) {
    enum { NQ = 8, NT = 20, K = 3 };
    hr_error err = {0};
    hr_synth_shape shape;
    hr_model *m = NULL;
    void *mem = NULL;
    CHECK(hr_synth_shape_by_name("tiny", &shape, &err) == HR_OK);
    shape.n_vocab = 40000;
    if (hr_synth_model(&shape, HR_DTYPE_F32, 5, &m, &mem, &err)) {
        CHECKF(0, "model: %s", err.msg);
        return;
    }
    static int32_t ids[2][NQ][NT], top[2][NQ][NT * K];
    static float lp[2][NQ][NT], top_lp[2][NQ][NT * K];
    uint64_t threaded[2] = {0};
    for (int together = 0; together < 2; together++) {
        for (int first = 0; first < NQ; first += together ? NQ : 1) {
            const int n = together ? NQ : 1;
            rig_opts o = opts(256, NQ, 256, 0, HR_ADMIT_RESERVE);
            rig r = rig_open(m, &o);
            CHECK(hr_model_ctx_run_items_min(r.ctx) == 8 * 32000); /* two threads (rig_open) */
            hr_request *h[NQ] = {0};
            for (int i = first; i < first + n; i++) {
                hr_request_params p = {.prompt = prompts[i],
                                       .n_prompt = HR_MIN(plen[i], 24),
                                       .max_tokens = NT,
                                       .ignore_eos = true,
                                       .logprobs = true,
                                       .top_logprobs = K};
                p.sampling = hr_sampler_default_params();
                p.sampling.temperature = i % 4 == 3 ? 0 : 0.8f; /* one greedy row in four */
                p.sampling.top_k = i % 2 ? 0 : 40;
                p.sampling.seed = 77 + (uint64_t)i;
                CHECKF(hr_engine_submit(r.e, &p, &h[i - first], &err) == HR_OK, "submit: %s", err.msg);
            }
            CHECKF(hr_engine_run_until_idle(r.e, &err) == HR_OK, "%s", err.msg);
            for (int i = first; i < first + n; i++) {
                int nt = 0;
                const int32_t *out = hr_request_output(h[i - first], &nt);
                CHECK(nt == NT);
                memcpy(ids[together][i], out, sizeof(int32_t) * (size_t)HR_MIN(nt, NT));
                CHECK(hr_request_logprobs(h[i - first], 0, NT, lp[together][i], top[together][i],
                                          top_lp[together][i]) == NT);
                hr_request_release(h[i - first]);
            }
            hr_engine_stats st;
            hr_engine_get_stats(r.e, &st);
            threaded[together] += st.threaded_sample_steps;
            CHECK(st.sample_seconds > 0);
            rig_close(&r);
        }
    }
    CHECKF(threaded[0] == 0 && threaded[1] > 0, "steps sampled on several threads: %llu alone, %llu together",
           (unsigned long long)threaded[0], (unsigned long long)threaded[1]);
    CHECK(memcmp(ids[0], ids[1], sizeof ids[0]) == 0);
    CHECK(memcmp(lp[0], lp[1], sizeof lp[0]) == 0);
    CHECK(memcmp(top[0], top[1], sizeof top[0]) == 0 && memcmp(top_lp[0], top_lp[1], sizeof top_lp[0]) == 0);
    int distinct = 0; /* the rows did sample: the seeded ones differ from one another */
    for (int i = 1; i < NQ; i++) distinct += memcmp(ids[1][i], ids[1][0], sizeof ids[1][0]) != 0;
    CHECK(distinct == NQ - 1);
    printf("threaded sampling: %d requests over 40,000 logits, %llu steps on several threads, the same ids and "
           "logprobs as alone\n",
           NQ, (unsigned long long)threaded[1]);
    hr_model_destroy(m);
    free(mem);
}

int main(void) {
    test_step_executor();
    test_step_observer();
    void *mem = NULL;
    hr_model *m = rig_build_model("tiny", 7, 0, &mem);
    make_prompts();
    make_reference(m);
    test_batch_invariance(m);
    test_preemption(m);
    test_adaptive(m);
    test_swap(m);
    test_contiguous(m);
    test_refusals(m);
    test_priorities(m);
    test_forward_failure(m);
    test_random_cancel(m);
    test_thread(m);
    test_threaded_sampling();
    hr_model_destroy(m);
    free(mem);
    return hr_test_finish();
}

/* engine.c: the engine's mechanics: creation, submission and cancellation (any thread), and the step
 * that the engine thread (or hr_engine_step's caller) runs: take the inbox, apply cancellations,
 * plan (scheduler.c), one forward over the ragged batch, commit K/V, sample the rows that sample,
 * stream each token to its request's channel, finish requests and cache their blocks.
 *
 * Invariant: a request leaves the engine's lists exactly once, through finish_request (completed,
 * cancelled or failed), and the engine's reference is dropped there. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"

/* ---- names ------------------------------------------------------------------------------------- */

static const char *k_admission[] = {"adaptive", "reserve", "optimistic"};
static const char *k_preempt[] = {"auto", "recompute", "swap"};
static const char *k_layout[] = {"paged", "contiguous"};

static hr_status parse_name(const char *what, const char **names, int n, const char *name, int *out, hr_error *err) {
    for (int i = 0; i < n; i++)
        if (name && !strcmp(name, names[i])) {
            *out = i;
            return HR_OK;
        }
    char list[128] = "";
    for (int i = 0; i < n; i++) {
        strcat(list, names[i]);
        if (i + 1 < n) strcat(list, ", ");
    }
    return hr_error_set(err, HR_ERR_INVALID_ARG, "unknown %s '%s': expected one of %s", what, name ? name : "", list);
}

const char *hr_admission_name(hr_admission a) { return (unsigned)a < 3 ? k_admission[a] : "?"; }
const char *hr_preempt_mode_name(hr_preempt_mode m) { return (unsigned)m < 3 ? k_preempt[m] : "?"; }
const char *hr_kv_layout_name(hr_kv_layout l) { return (unsigned)l < 2 ? k_layout[l] : "?"; }

hr_status hr_admission_parse(const char *name, hr_admission *out, hr_error *err) {
    int v;
    hr_status st = parse_name("admission mode", k_admission, 3, name, &v, err);
    if (st == HR_OK) *out = (hr_admission)v;
    return st;
}
hr_status hr_preempt_mode_parse(const char *name, hr_preempt_mode *out, hr_error *err) {
    int v;
    hr_status st = parse_name("preemption mode", k_preempt, 3, name, &v, err);
    if (st == HR_OK) *out = (hr_preempt_mode)v;
    return st;
}
hr_status hr_kv_layout_parse(const char *name, hr_kv_layout *out, hr_error *err) {
    int v;
    hr_status st = parse_name("KV layout", k_layout, 2, name, &v, err);
    if (st == HR_OK) *out = (hr_kv_layout)v;
    return st;
}

/* ---- create / destroy -------------------------------------------------------------------------- */

/* The step buffers, one size each: create allocates exactly these, hr_engine_buffer_bytes adds them
 * up. T batch rows (token, position, sequence, wants-logits), a sampling slot, a device-picked id and a
 * logits row per running sequence. */
#define ENG_ELEM(field) sizeof(((const hr_engine *)0)->field[0])
typedef struct eng_sizes {
    size_t b_tokens, b_pos, b_seq, b_want, b_sample, b_ids, logits;
} eng_sizes;

static void eng_sizes_of(int max_batch_tokens, int max_running, int n_vocab, eng_sizes *z) {
    size_t T = (size_t)HR_MAX(0, max_batch_tokens), S = (size_t)HR_MAX(0, max_running);
    *z = (eng_sizes){.b_tokens = T * ENG_ELEM(b_tokens),
                     .b_pos = T * ENG_ELEM(b_pos),
                     .b_seq = T * ENG_ELEM(b_seq),
                     .b_want = T * ENG_ELEM(b_want),
                     .b_sample = S * ENG_ELEM(b_sample),
                     .b_ids = S * ENG_ELEM(b_ids),
                     .logits = S * (size_t)HR_MAX(0, n_vocab) * ENG_ELEM(logits)};
}

uint64_t hr_engine_buffer_bytes(int max_batch_tokens, int max_running, int n_vocab) {
    eng_sizes z;
    eng_sizes_of(max_batch_tokens, max_running, n_vocab, &z);
    return sizeof(hr_engine) + z.b_tokens + z.b_pos + z.b_seq + z.b_want + z.b_sample + z.b_ids + z.logits;
}

hr_status hr_engine_create(const hr_engine_params *params, hr_engine **out, hr_error *err) {
    if (!params->kv || (!params->forward && (!params->model || !params->ctx)))
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "engine: kv, and a model and ctx (or a step executor), are required");
    hr_engine_params p = *params;
    const hr_hparams *hp = p.model ? hr_model_hparams(p.model) : NULL;
    const hr_kv_config *kc = hr_kv_pool_config(p.kv);
    if (p.n_ctx <= 0 && hp) p.n_ctx = hp->n_ctx_train;
    if (p.n_ctx <= 0 || (!hp && p.n_vocab <= 0))
        return hr_error_set(err, HR_ERR_INVALID_ARG, "engine: without a model, n_ctx and n_vocab must be given");
    if (p.max_batch_tokens <= 0) p.max_batch_tokens = 512;
    if (p.max_running <= 0) p.max_running = kc->max_seqs;
    if (p.max_queue <= 0) p.max_queue = 1024;
    if (p.prefill_chunk <= 0) p.prefill_chunk = p.max_batch_tokens;
    if (p.predict_percentile <= 0 || p.predict_percentile > 1) p.predict_percentile = 0.9f;
    if (p.max_running > kc->max_seqs)
        return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_MAX_RUNNING, NULL,
                                  "engine: %d running sequences exceed the KV pool's %d sequence slots", p.max_running,
                                  kc->max_seqs);
    if ((unsigned)p.admission > 2 || (unsigned)p.preempt > 2 || (unsigned)p.layout > 1)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "engine: unknown admission, preemption or layout value");
    int n_stage = hr_kv_pool_n_stage(p.kv);
    if (n_stage > 0 && n_stage < p.max_running + 1)
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "engine: the KV pool has %d f16 tail buffers (%s/%s blocks being filled) for %d running "
                            "sequences: each holds one between steps, so at least %d are needed (leave "
                            "stage_blocks at 0 for enough for any step)",
                            n_stage, hr_kv_format_name(kc->k_format), hr_kv_format_name(kc->v_format), p.max_running,
                            p.max_running + 1);
    int n_blocks = hr_kv_pool_n_blocks(p.kv);
    int ctx_blocks = (p.n_ctx + kc->block_size - 1) / kc->block_size;
    if (p.layout == HR_LAYOUT_CONTIGUOUS && ctx_blocks > n_blocks)
        return hr_error_set_params(err, HR_ERR_BUDGET, HR_PARAM_KV_BUDGET, HR_PARAM_CONTEXT, NULL,
                                   "engine: a contiguous slot needs %d blocks (context %d) but the KV pool has %d: "
                                   "raise the KV budget or lower the context length",
                                   ctx_blocks, p.n_ctx, n_blocks);
    hr_engine *e = calloc(1, sizeof *e);
    if (!e) return hr_error_set(err, HR_ERR_NOMEM, "engine: out of memory");
    e->p = p;
    e->n_vocab = hp ? hp->n_vocab : p.n_vocab;
    e->block_size = kc->block_size;
    e->n_blocks = n_blocks;
    e->swap_ok = p.swap != NULL && p.preempt != HR_PREEMPT_RECOMPUTE;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_mutex_init(&e->ev_mu, NULL);
    atomic_init(&e->n_queued, 0);
    atomic_init(&e->running_thread, 0);
    eng_sizes z; /* what hr_engine_buffer_bytes counts */
    eng_sizes_of(p.max_batch_tokens, p.max_running, e->n_vocab, &z);
    e->b_tokens = malloc(z.b_tokens);
    e->b_pos = malloc(z.b_pos);
    e->b_seq = malloc(z.b_seq);
    e->b_want = malloc(z.b_want);
    e->b_sample = malloc(z.b_sample);
    e->b_ids = malloc(z.b_ids);
    e->logits = p.rows_alloc ? p.rows_alloc(p.rows_user, z.logits) : malloc(z.logits);
    if (!e->b_tokens || !e->b_pos || !e->b_seq || !e->b_want || !e->b_sample || !e->b_ids || !e->logits) {
        hr_engine_destroy(e);
        return hr_error_set(err, HR_ERR_NOMEM, "engine: out of memory for the step buffers");
    }
    e->st.swap_available = e->swap_ok;
    e->pub = e->st;
    *out = e;
    return HR_OK;
}

/* Makes r final and drops the engine's reference. r must be in none of the engine's lists. */
static void finish_request(hr_engine *e, hr_request *r, hr_request_state state, hr_finish_reason why, hr_status code,
                           const char *msg) {
    sched_release_seq(e, r);
    hr_matcher_destroy(r->matcher); /* here, on the engine's thread, which owns the store it uses */
    r->matcher = NULL;
    req_finish(r, e->p.tok, state, why, code, msg);
    if (state == HR_REQ_COMPLETED)
        e->st.completed++;
    else if (state == HR_REQ_CANCELLED)
        e->st.cancelled++;
    else
        e->st.failed++;
    req_unref(r);
}

static void fail_list(hr_engine *e, hr_req_list *l, bool queued, const char *msg) {
    while (l->n > 0) {
        hr_request *r = l->v[l->n - 1];
        l->n--;
        if (queued) atomic_fetch_sub(&e->n_queued, 1);
        finish_request(e, r, HR_REQ_FAILED, HR_FINISH_ERROR, HR_ERR_CANCELLED, msg);
    }
}

void hr_engine_destroy(hr_engine *e) {
    if (!e) return;
    hr_engine_stop(e);
    const char *msg = "the engine was shut down before the request finished";
    fail_list(e, &e->inbox, true, msg);
    fail_list(e, &e->waiting, true, msg);
    fail_list(e, &e->running, false, msg);
    free(e->inbox.v);
    free(e->waiting.v);
    free(e->running.v);
    free(e->b_tokens);
    free(e->b_pos);
    free(e->b_seq);
    free(e->b_want);
    free(e->b_sample);
    free(e->b_ids);
    if (!e->p.rows_alloc)
        free(e->logits);
    else if (e->p.rows_free)
        e->p.rows_free(e->p.rows_user, e->logits);
    hr_cons_store_destroy(e->cstore); /* after every request: their matchers are gone */
    hr_cons_vocab_destroy(e->cvocab);
    free(e->mask);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->ev_mu);
    free(e);
}

/* ---- submit / cancel --------------------------------------------------------------------------- */

/* An integer as an error's offending value (hr_error.value). */
static const char *int_text(long long x, char v[32]) {
    snprintf(v, 32, "%lld", x);
    return v;
}

static hr_status validate(hr_engine *e, const hr_request_params *p, hr_error *err) {
    if (!p->prompt || p->n_prompt < 1)
        return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_PROMPT, NULL,
                                  "the prompt is empty (at least one token is needed)");
    char v[32];
    if (p->max_tokens < 1)
        return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_MAX_TOKENS, int_text(p->max_tokens, v),
                                  "max tokens is %d: at least 1 is needed", p->max_tokens);
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= e->n_vocab)
            return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_PROMPT, int_text(p->prompt[i], v),
                                      "prompt token %d is %d, outside the vocabulary [0, %d)", i, (int)p->prompt[i],
                                      e->n_vocab);
    if (p->n_stop < 0 || p->n_stop > HR_ENGINE_MAX_STOP || (p->n_stop > 0 && (!p->stop || !e->p.tok)))
        return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_STOP, int_text(p->n_stop, v),
                                  "stop strings: at most %d, and only with a tokenizer", HR_ENGINE_MAX_STOP);
    for (int i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || !p->stop[i][0])
            return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_STOP, "", "stop string %d is empty", i);
    if (p->top_logprobs < 0 || p->top_logprobs > HR_ENGINE_MAX_TOP_LOGPROBS || (p->top_logprobs && !p->logprobs))
        return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_TOP_LOGPROBS, int_text(p->top_logprobs, v),
                                  "top logprobs is %d: 0..%d, and only with logprobs", p->top_logprobs,
                                  HR_ENGINE_MAX_TOP_LOGPROBS);
    if (p->grammar && !e->p.tok)
        return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_OUTPUT_FORMAT, NULL,
                                  "constrained decoding needs the tokenizer (token bytes)");
    hr_status st = hr_sampler_params_check(&p->sampling, err);
    if (st != HR_OK) return st;
    if (p->kv_policy && (st = hr_kv_policy_check(e->p.kv, p->kv_policy, err)) != HR_OK) {
        hr_error_about(err, HR_PARAM_KV_POLICY, NULL); /* the request's policy, which the pool refuses */
        return st;
    }
    /* a window or sinks policy bounds what the cache keeps, so such a request may run past n_ctx (its
     * prompt must still fit); every other request lives within n_ctx */
    int span = p->kv_policy ? hr_kv_policy_span(p->kv_policy) : 0;
    if (span > 0 && p->n_prompt > e->p.n_ctx)
        return hr_error_set_params(err, HR_ERR_RANGE, HR_PARAM_PROMPT, HR_PARAM_CONTEXT, int_text(p->n_prompt, v),
                                   "the prompt has %d tokens: beyond the context of %d tokens", p->n_prompt,
                                   e->p.n_ctx);
    if (span == 0 && (int64_t)p->n_prompt + p->max_tokens > e->p.n_ctx)
        return hr_error_set_params(
            err, HR_ERR_RANGE, HR_PARAM_PROMPT, HR_PARAM_MAX_TOKENS, int_text(p->n_prompt, v),
            "the prompt has %d tokens and max tokens is %d: together beyond the context of %d tokens "
            "(shorten the prompt, lower max tokens or raise the context length)",
            p->n_prompt, p->max_tokens, e->p.n_ctx);
    int64_t life = (int64_t)p->n_prompt + p->max_tokens - 1;
    if (span > 0) life = HR_MIN(life, (int64_t)span + 2 * e->block_size); /* resident at most */
    int64_t need = hr_kv_pool_seq_blocks(e->p.kv, life);                  /* every layer group's blocks */
    if (need > e->n_blocks) {
        uint64_t bb = hr_kv_block_bytes(hr_kv_pool_config(e->p.kv));
        char a[32], b[32];
        return hr_error_set_params(
            err, HR_ERR_BUDGET, HR_PARAM_KV_BUDGET, HR_PARAM_MAX_TOKENS,
            hr_format_size((uint64_t)e->n_blocks * bb, b, sizeof b),
            "the request needs %lld KV blocks (%s) for %d prompt + %d output tokens but the whole "
            "pool holds %d (%s): raise the KV budget or lower max tokens",
            (long long)need, hr_format_size((uint64_t)need * bb, a, sizeof a), p->n_prompt, p->max_tokens, e->n_blocks,
            hr_format_size((uint64_t)e->n_blocks * bb, b, sizeof b));
    }
    return HR_OK;
}

/* Seconds a refused client should wait: the queue drains at the recent completion rate. e->mu held. */
static double retry_after(const hr_engine *e, int queued) {
    double s = e->done_rate > 0 ? (queued + 1) / e->done_rate / 2 : 1.0;
    return s < 1 ? 1 : s > 60 ? 60 : s;
}

double hr_engine_retry_after_s(hr_engine *e) {
    pthread_mutex_lock(&e->mu);
    double s = retry_after(e, atomic_load(&e->n_queued));
    pthread_mutex_unlock(&e->mu);
    return s;
}

/* Drops requests the engine never saw (their second reference is the engine's, never taken). */
static void drop_unsubmitted(hr_request **r, int n) {
    for (int i = 0; i < n; i++) {
        atomic_store(&r[i]->refs, 1);
        req_unref(r[i]);
    }
}

hr_status hr_engine_submit_n(hr_engine *e, const hr_request_params *p, int n, hr_request **out, hr_error *err) {
    if (n < 1 || n > HR_ENGINE_MAX_GROUP)
        return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_CHOICES, NULL,
                                  "%d requests in one submission: 1..%d", n, HR_ENGINE_MAX_GROUP);
    hr_status st = validate(e, p, err);
    if (st != HR_OK) {
        pthread_mutex_lock(&e->mu);
        if (st == HR_ERR_BUDGET)
            e->st.refused_budget++;
        else
            e->st.refused_other++;
        pthread_mutex_unlock(&e->mu);
        return st;
    }
    hr_request *r[HR_ENGINE_MAX_GROUP];
    for (int i = 0; i < n; i++) {
        hr_request_params q = *p;
        q.sampling.seed = p->sampling.seed + (uint64_t)i;
        if ((st = req_create(e, &q, i > 0 ? r[0] : NULL, &r[i], err)) != HR_OK) {
            drop_unsubmitted(r, i);
            return st;
        }
    }
    pthread_mutex_lock(&e->mu);
    int queued = atomic_load(&e->n_queued);
    if (queued + n > e->p.max_queue) {
        e->st.refused_full++;
        double s = retry_after(e, queued);
        pthread_mutex_unlock(&e->mu);
        drop_unsubmitted(r, n);
        return hr_error_set_param(err, HR_ERR_FULL, HR_PARAM_QUEUE, NULL,
                                  "the waiting queue is full (%d requests, at most %d); retry in about %.0f s", queued,
                                  e->p.max_queue, s);
    }
    for (int i = 0; i < n; i++) {
        r[i]->arrival = e->next_arrival++;
        r[i]->stats.id = r[i]->arrival + 1; /* r is not visible to any other thread yet */
        if (list_insert(&e->inbox, r[i]) != HR_OK) {
            for (int k = 0; k < i; k++) list_remove_at(&e->inbox, list_find(&e->inbox, r[k]));
            pthread_mutex_unlock(&e->mu);
            drop_unsubmitted(r, n);
            /* a request's buffers grow with its max tokens: the one thing its sender can lower */
            return hr_error_set_param(err, HR_ERR_NOMEM, HR_PARAM_MAX_TOKENS, NULL, "out of memory queueing a request");
        }
    }
    atomic_fetch_add(&e->n_queued, n);
    e->st.submitted += (uint64_t)n;
    e->kick = true;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    for (int i = 0; i < n; i++) out[i] = r[i];
    return HR_OK;
}

hr_status hr_engine_submit(hr_engine *e, const hr_request_params *p, hr_request **out, hr_error *err) {
    return hr_engine_submit_n(e, p, 1, out, err);
}

void hr_engine_cancel(hr_engine *e, hr_request *r) {
    atomic_store(&r->cancel, 1);
    pthread_mutex_lock(&e->mu);
    e->kick = true;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

/* ---- the step ---------------------------------------------------------------------------------- */

/* Moves submissions into the waiting list (the inbox lock is held only for the move). Submitters
 * write their counters into e->st under e->mu; publish_stats copies e->st out under the same lock. */
static void take_inbox(hr_engine *e) {
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->inbox.n; i++) {
        if (list_insert(&e->waiting, e->inbox.v[i]) != HR_OK) {
            hr_request *r = e->inbox.v[i];
            atomic_fetch_sub(&e->n_queued, 1);
            finish_request(e, r, HR_REQ_FAILED, HR_FINISH_ERROR, HR_ERR_NOMEM, "out of memory queueing");
        }
    }
    e->inbox.n = 0;
    e->kick = false;
    pthread_mutex_unlock(&e->mu);
}

static void apply_cancels(hr_engine *e, hr_req_list *l, bool queued) {
    for (int i = 0; i < l->n;) {
        hr_request *r = l->v[i];
        if (!atomic_load(&r->cancel)) {
            i++;
            continue;
        }
        list_remove_at(l, i);
        if (queued) atomic_fetch_sub(&e->n_queued, 1);
        finish_request(e, r, HR_REQ_CANCELLED, HR_FINISH_CANCELLED, HR_ERR_CANCELLED, "cancelled by the client");
    }
}

/* Remembers a completion length for adaptive admission and refreshes the prediction. */
static int cmp_int(const void *a, const void *b) {
    return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

static void observe_completion(hr_engine *e, int n_output) {
    e->obs[e->n_obs % HR_ENGINE_OBS] = n_output;
    e->n_obs++;
    int n = HR_MIN(e->n_obs, HR_ENGINE_OBS);
    double now = hr_time_now();
    if (e->last_done_t > 0 && now > e->last_done_t) {
        double rate = 1.0 / (now - e->last_done_t);
        pthread_mutex_lock(&e->mu); /* submitters read it for their retry hints */
        e->done_rate = e->done_rate > 0 ? 0.9 * e->done_rate + 0.1 * rate : rate;
        pthread_mutex_unlock(&e->mu);
    }
    e->last_done_t = now;
    if (n < 8) return; /* too few to predict from: admission claims max_tokens meanwhile */
    int sorted[HR_ENGINE_OBS];
    memcpy(sorted, e->obs, sizeof(int) * (size_t)n);
    qsort(sorted, (size_t)n, sizeof(int), cmp_int);
    int k = (int)(e->p.predict_percentile * (float)(n - 1) + 0.999f);
    e->predicted = HR_MAX(1, sorted[HR_MIN(k, n - 1)]);
}

static void complete(hr_engine *e, hr_request *r, hr_finish_reason why) {
    int i = list_find(&e->running, r);
    if (i >= 0) list_remove_at(&e->running, i);
    observe_completion(e, r->n_known - r->n_prompt);
    finish_request(e, r, HR_REQ_COMPLETED, why, HR_OK, NULL);
}

/* Samples one row's token, streams it and finishes the request when it is done. */
/* Records output token `tok`'s log-probability at output index i (and the n_top most likely tokens):
 * the log-softmax of the raw logits. Written before the token is published, so readers, who see only
 * published indices, never see a half-written entry. */
static void record_logprobs(hr_request *r, int i, const float *logits, int n_vocab, int32_t tok) {
    const float lse = hr_logsumexp(logits, n_vocab); /* AVX2 where the CPU has it: 128256 logits in ~0.1 ms */
    r->lp[i] = logits[tok] - lse;
    if (r->n_top <= 0) return; /* top_id/top_lp are NULL then: even "+ 0" on them is undefined (fuzz_http) */
    int32_t *ids = r->top_id + (size_t)i * r->n_top;
    float *lps = r->top_lp + (size_t)i * r->n_top;
    const int k = hr_top_logits(logits, n_vocab, r->n_top, ids, lps); /* n_top <= 20 */
    for (int j = 0; j < k; j++) lps[j] -= lse;
    /* fewer than n_top where the row holds NaN: its NaN tokens (the ones not chosen) fill the list, as
     * ruled out */
    for (int j = k, v = 0; j < r->n_top && v < n_vocab; v++)
        if (logits[v] != logits[v]) ids[j] = v, lps[j++] = -INFINITY;
}

/* The engine's constraint tables, made at the first constrained request (the vocabulary's bytes
 * sorted once: tens of milliseconds for 128K tokens). */
static hr_status constrain_setup(hr_engine *e, hr_error *err) {
    if (e->cstore) return HR_OK;
    hr_status st = hr_cons_vocab_from_tokenizer(e->p.tok, &e->cvocab, err);
    if (st == HR_OK) st = hr_cons_store_create(e->cvocab, &e->cstore, err);
    if (st == HR_OK) {
        int n = HR_MAX(e->n_vocab, hr_cons_vocab_size(e->cvocab));
        e->mask = calloc(hr_cons_mask_words(n), sizeof(uint64_t));
        if (!e->mask) st = hr_error_set(err, HR_ERR_NOMEM, "out of memory for the token mask");
    }
    if (st != HR_OK) {
        hr_cons_store_destroy(e->cstore);
        hr_cons_vocab_destroy(e->cvocab);
        e->cstore = NULL;
        e->cvocab = NULL;
    }
    return st;
}

/* The allowed tokens for a constrained request into e->mask; returns how many (0: none can follow).
 * With ignore_eos the end-of-generation tokens are left out too. -1 when the tables cannot be made. */
static int constrain_mask(hr_engine *e, hr_request *r, hr_error *err) {
    if (!r->matcher &&
        (constrain_setup(e, err) != HR_OK || hr_matcher_create(e->cstore, r->grammar, &r->matcher, err) != HR_OK))
        return -1;
    double t0 = hr_time_now();
    int n = hr_matcher_fill_mask(r->matcher, e->mask);
    if (r->ignore_eos && n > 0) {
        int n_eog = 0;
        const int32_t *eog = hr_cons_vocab_eog(e->cvocab, &n_eog);
        for (int i = 0; i < n_eog; i++) {
            uint64_t bit = 1ull << (eog[i] & 63);
            if (e->mask[eog[i] >> 6] & bit) {
                e->mask[eog[i] >> 6] &= ~bit;
                n--;
            }
        }
    }
    e->st.mask_seconds += hr_time_now() - t0;
    e->st.masks++;
    return n;
}

/* The step's rows are all plain greedy (no grammar, no logprobs, a sampler whose choice is the argmax)
 * and the backend picks argmaxes itself (the GPU's, HEADROOM_CUDA_ARGMAX=device): then only their ids
 * come back (hr_batch.argmax), not the rows of logits. A step with one other row takes the logits. */
static bool step_argmax(const hr_engine *e, int rows) {
    if (e->p.forward || !e->p.ctx || rows == 0 || !hr_model_ctx_argmax(e->p.ctx)) return false;
    for (int i = 0; i < rows; i++) {
        const hr_request *r = e->b_sample[i];
        if (r->grammar || r->lp || !hr_sampler_is_argmax(r->sampler)) return false;
    }
    return true;
}

/* Row r's chosen token, taken: counted, then the end of generation, a stop string, a finished grammar
 * or the length limit may complete it. */
static void take_token(hr_engine *e, hr_request *r, int32_t tok) {
    e->st.generated_tokens++;
    if (!r->ignore_eos && e->p.tok && hr_tokenizer_is_eog(e->p.tok, tok)) {
        complete(e, r, HR_FINISH_EOG);
        return;
    }
    bool stopped = req_push_token(r, e->p.tok, tok);
    if (stopped)
        complete(e, r, HR_FINISH_STOP);
    else if (r->matcher && hr_matcher_is_done(r->matcher)) /* complete, and nothing may follow */
        complete(e, r, HR_FINISH_EOG);
    else if (r->n_known - r->n_prompt >= r->max_tokens || (r->span == 0 && r->n_known >= e->p.n_ctx))
        complete(e, r, HR_FINISH_LENGTH);
}

/* Row r's logprobs for token tok of logits, while its output has room for them. */
static void note_logprobs(const hr_engine *e, hr_request *r, const float *logits, int32_t tok) {
    if (r->lp && r->n_known - r->n_prompt < r->max_tokens)
        record_logprobs(r, r->n_known - r->n_prompt, logits, e->n_vocab, tok);
}

/* Row r's next token under its grammar's mask (the engine's one mask buffer: rows in turn), its
 * logprobs recorded, taken. */
static void sample_masked_row(hr_engine *e, hr_request *r, const float *logits) {
    hr_error err = {0};
    int n = constrain_mask(e, r, &err);
    if (n < 0) {
        int i = list_find(&e->running, r);
        if (i >= 0) list_remove_at(&e->running, i);
        finish_request(e, r, HR_REQ_FAILED, HR_FINISH_ERROR, err.code ? err.code : HR_ERR_NOMEM, err.msg);
        return;
    }
    if (n == 0) { /* no token continues the output: end with what it has (never loop) */
        complete(e, r, HR_FINISH_LENGTH);
        return;
    }
    int32_t tok = hr_sampler_sample_masked(r->sampler, logits, e->mask);
    hr_matcher_accept_token(r->matcher, tok); /* allowed, so it advances (an EOG token: no bytes) */
    note_logprobs(e, r, logits, tok);
    take_token(e, r, tok);
}

/* Row i without a grammar: its token into b_ids[i], its logprobs recorded. It touches only its own
 * request's sampler and logprobs, so the step's rows may run on any threads at once. */
static void sample_item(void *user, int64_t i, int ith) {
    (void)ith;
    hr_engine *e = user;
    hr_request *r = e->b_sample[i];
    if (r->grammar) return;
    const float *logits = e->logits + (size_t)i * e->n_vocab;
    e->b_ids[i] = hr_sampler_sample(r->sampler, logits);
    note_logprobs(e, r, logits, e->b_ids[i]);
}

/* The step's rows sampled from their logits: those without a grammar on the model context's host
 * threads where the step's logits are enough to pay for the hand-off (hr_model_ctx_run_items_min;
 * each request's sampler is its own, so the tokens are those of one thread), then in row order each
 * token taken and the grammar's rows sampled under their masks. */
static void sample_rows(hr_engine *e, int rows) {
    const double t0 = hr_time_now();
    if (e->p.ctx && rows > 1 && (int64_t)rows * e->n_vocab >= hr_model_ctx_run_items_min(e->p.ctx)) {
        hr_model_ctx_run_items(e->p.ctx, sample_item, e, rows);
        e->st.threaded_sample_steps++;
    } else {
        for (int i = 0; i < rows; i++) sample_item(e, i, 0);
    }
    for (int i = 0; i < rows; i++) {
        hr_request *r = e->b_sample[i];
        if (r->grammar)
            sample_masked_row(e, r, e->logits + (size_t)i * e->n_vocab);
        else
            take_token(e, r, e->b_ids[i]);
    }
    e->st.sample_seconds += hr_time_now() - t0;
}

/* Commits the step's K/V and advances computed; counts prefill and recomputed tokens. */
static void commit_batch(hr_engine *e) {
    for (int i = 0; i < e->running.n; i++) {
        hr_request *r = e->running.v[i];
        if (r->n_sched == 0) continue;
        hr_kv_seq_commit(e->p.kv, r->seq, r->tokens + r->n_computed, r->n_sched);
        int redo = HR_MAX(0, HR_MIN(r->n_computed + r->n_sched, r->n_hw) - r->n_computed);
        if (redo > 0) {
            e->st.recomputed_tokens += (uint64_t)redo;
            pthread_mutex_lock(&r->mu);
            r->stats.recomputed_tokens += redo;
            pthread_mutex_unlock(&r->mu);
        }
        if (r->n_known - r->n_computed > 1) e->st.prefill_tokens += (uint64_t)r->n_sched;
        r->n_computed += r->n_sched;
        r->n_hw = HR_MAX(r->n_hw, r->n_computed);
        sched_snapshot_ledger(e, r); /* a live stream sees its bytes now, not at release */
    }
    e->group_epoch++;
    for (int i = 0; i < e->running.n; i++) sched_group_account(e, e->running.v[i], false);
}

static void fail_scheduled(hr_engine *e, const char *msg, hr_status code) {
    for (int i = 0; i < e->running.n;) {
        hr_request *r = e->running.v[i];
        if (r->n_sched == 0) {
            i++;
            continue;
        }
        list_remove_at(&e->running, i);
        finish_request(e, r, HR_REQ_FAILED, HR_FINISH_ERROR, code, msg);
    }
}

static void publish_stats(hr_engine *e) {
    e->st.n_waiting = e->waiting.n;
    e->st.n_running = e->running.n;
    e->st.peak_running = HR_MAX(e->st.peak_running, e->running.n);
    e->st.predicted_output = e->predicted;
    e->st.headroom_blocks = sched_headroom_blocks(e);
    pthread_mutex_lock(&e->mu); /* submitters write the submit/refusal counters under e->mu */
    e->pub = e->st;
    pthread_mutex_unlock(&e->mu);
}

/* Fails the request that blocks the others when no step can make progress: the head of the waiting
 * list (admission is strict, so it is the one everything waits for), else the first running one. */
static void stall_fail_head(hr_engine *e) {
    hr_req_list *l = e->waiting.n > 0 ? &e->waiting : &e->running;
    hr_request *r = l->v[0];
    list_remove_at(l, 0);
    if (l == &e->waiting) atomic_fetch_sub(&e->n_queued, 1);
    char msg[600];
    snprintf(msg, sizeof msg, "no progress is possible for this request: %s",
             e->stall_msg[0] ? e->stall_msg : "the scheduler could not place it");
    finish_request(e, r, HR_REQ_FAILED, HR_FINISH_ERROR, HR_ERR_BUDGET, msg);
    e->stall_msg[0] = 0;
}

/* The step's figures for the on_step observer. */
static void report_step(hr_engine *e, const hr_batch *b, int rows, int n_prefill, double t_begin, double forward_s) {
    hr_engine_step_info s = {
        .t_begin = t_begin, .forward_s = forward_s, .n_tokens = b->n_tokens, .n_prefill = n_prefill, .n_rows = rows};
    for (int i = 0; i < b->n_tokens; i++) {
        s.visible_keys += (double)b->pos[i] + 1;
        s.n_seqs += i == 0 || b->seq[i] != b->seq[i - 1];
    }
    s.step_s = hr_time_now() - t_begin;
    e->p.on_step(e->p.on_step_user, &s);
}

/* One step; returns true when it made progress (a forward ran or a request changed state). */
static bool step(hr_engine *e) {
    const double t_begin = e->p.on_step ? hr_time_now() : 0;
    uint64_t finished0 = e->st.completed + e->st.cancelled + e->st.failed;
    take_inbox(e);
    apply_cancels(e, &e->waiting, true);
    apply_cancels(e, &e->running, false);
    sched_plan(e);
    int rows = 0;
    int T = sched_build_batch(e, &rows);
    if (T > 0) {
        const bool argmax = step_argmax(e, rows);
        hr_batch b = {.n_tokens = T,
                      .tokens = e->b_tokens,
                      .pos = e->b_pos,
                      .seq = e->b_seq,
                      .want_logits = e->b_want,
                      .argmax = argmax ? e->b_ids : NULL};
        hr_error err = {0};
        double t0 = hr_time_now();
        hr_status st = e->p.forward ? e->p.forward(e->p.forward_user, &b, e->logits, &err)
                                    : hr_model_forward(e->p.ctx, &b, e->logits, &err);
        const double forward_s = hr_time_now() - t0;
        e->st.forward_seconds += forward_s;
        if (st != HR_OK) {
            hr_error_prefix(&err, "forward pass");
            fail_scheduled(e, err.msg, st);
        } else {
            e->st.steps++;
            e->st.batch_tokens += (uint64_t)T;
            const uint64_t prefill0 = e->st.prefill_tokens;
            commit_batch(e);
            if (argmax) e->st.argmax_steps++;
            if (argmax) {
                for (int i = 0; i < rows; i++) { /* what its sampler would have chosen (step_argmax) */
                    hr_sampler_accept(e->b_sample[i]->sampler, e->b_ids[i]);
                    take_token(e, e->b_sample[i], e->b_ids[i]);
                }
            } else {
                sample_rows(e, rows);
            }
            if (e->st.prefill_tokens == prefill0 && rows == T) {
                e->st.decode_steps++;
                e->st.decode_tokens += (uint64_t)rows;
                e->st.decode_seconds += hr_time_now() - t0;
            }
            if (e->p.on_step) report_step(e, &b, rows, (int)(e->st.prefill_tokens - prefill0), t_begin, forward_s);
        }
        for (int i = 0; i < e->running.n; i++) e->running.v[i]->n_sched = 0;
    }
    bool progress = T > 0 || e->st.completed + e->st.cancelled + e->st.failed != finished0;
    if (progress || e->waiting.n + e->running.n == 0) {
        e->n_stalled = 0;
    } else if (++e->n_stalled >= 2) {
        /* Nothing was computed twice in a row with requests unfinished. Only computing frees KV for
         * others, so the state cannot change by itself: the first step may have been spent on
         * preemption (which blocks admission for that step), the second shows that the request at
         * the head cannot be placed even so. It fails with the scheduler's reason, and the requests
         * behind it go on. (Requests whose claim can never fit are refused at submit; this catches
         * whatever that check did not foresee, instead of spinning.) */
        stall_fail_head(e);
        e->n_stalled = 0;
        progress = true;
    } else {
        progress = true; /* one more try: see above */
    }
    publish_stats(e);
    return progress;
}

static int unfinished(hr_engine *e) {
    pthread_mutex_lock(&e->mu);
    int n = e->inbox.n;
    pthread_mutex_unlock(&e->mu);
    return n + e->waiting.n + e->running.n;
}

hr_status hr_engine_step(hr_engine *e, int *n_unfinished, hr_error *err) {
    if (atomic_load(&e->running_thread))
        return hr_error_set(err, HR_ERR_INVALID_ARG, "hr_engine_step: the engine thread is running (stop it first)");
    step(e);
    if (n_unfinished) *n_unfinished = unfinished(e);
    return HR_OK;
}

hr_status hr_engine_run_until_idle(hr_engine *e, hr_error *err) {
    int n = 0;
    do {
        if (atomic_load(&e->running_thread))
            return hr_error_set(err, HR_ERR_INVALID_ARG, "hr_engine_run_until_idle: the engine thread is running");
        bool progress = step(e);
        n = unfinished(e);
        if (!progress && n > 0)
            return hr_error_set(err, HR_ERR_INTERNAL, "engine: %d requests are stuck (no step makes progress)", n);
    } while (n > 0);
    return HR_OK;
}

/* ---- the engine thread ------------------------------------------------------------------------- */

static void *engine_main(void *arg) {
    hr_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stop_flag && !e->kick && e->inbox.n == 0 && e->waiting.n + e->running.n == 0)
            pthread_cond_wait(&e->cv, &e->mu);
        bool stop = e->stop_flag;
        pthread_mutex_unlock(&e->mu);
        if (stop) break;
        if (!step(e)) { /* nothing could move: sleep until a submit or cancel changes that */
            pthread_mutex_lock(&e->mu);
            while (!e->stop_flag && !e->kick) pthread_cond_wait(&e->cv, &e->mu);
            pthread_mutex_unlock(&e->mu);
        }
    }
    return NULL;
}

hr_status hr_engine_start(hr_engine *e, hr_error *err) {
    if (atomic_load(&e->running_thread)) return HR_OK;
    e->stop_flag = false;
    atomic_store(&e->running_thread, 1);
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        atomic_store(&e->running_thread, 0);
        return hr_error_set(err, HR_ERR_NOMEM, "engine: cannot start the engine thread");
    }
    return HR_OK;
}

void hr_engine_stop(hr_engine *e) {
    if (!atomic_load(&e->running_thread)) return;
    pthread_mutex_lock(&e->mu);
    e->stop_flag = true;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    atomic_store(&e->running_thread, 0);
}

void hr_engine_get_stats(hr_engine *e, hr_engine_stats *out) {
    pthread_mutex_lock(&e->mu);
    *out = e->pub;
    pthread_mutex_unlock(&e->mu);
}

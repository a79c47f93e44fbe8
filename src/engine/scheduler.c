/* scheduler.c: the policy half of the engine: who runs this step and with how many tokens, who is
 * admitted, who is preempted. kv/ only answers "reserve these slots" yes or no; every choice of a
 * victim is made here.
 *
 * Invariants:
 *   1. computed <= known for every request; a step schedules known - computed tokens at most, and
 *      a logits row only where the chunk reaches known (so each position is sampled exactly once,
 *      whatever preemption did before).
 *   2. headroom = (free + evictable blocks) - sum over running requests of the blocks their claim
 *      still lacks. Admission never lets a new claim exceed headroom; in reserve mode the claim is
 *      the request's whole life, so its reservations cannot fail and nothing is preempted.
 *   3. The running list and the waiting list are sorted by (priority desc, arrival asc); the victim
 *      of preemption is always the last running request (lowest priority, then latest arrival).
 *   4. A request holds a KV sequence exactly while it is RUNNING (or swapped out). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_internal.h"

static int blocks_of(const hr_engine *e, int slots) { return (slots + e->block_size - 1) / e->block_size; }
/* Physical blocks a sequence of this many slots holds at most, every layer group counted (kv.h: a
 * hybrid pool's window groups hold at most their window; a one-group pool, blocks_of). */
static int pool_blocks(const hr_engine *e, int slots) { return (int)hr_kv_pool_seq_blocks(e->p.kv, slots); }

/* ---- claims and headroom ----------------------------------------------------------------------- */

int sched_claim_slots(const hr_engine *e, const hr_request *r) {
    int life = r->n_prompt + r->max_tokens - 1; /* the last sampled token is never computed */
    int grow = HR_MIN(r->n_known + 1, life);    /* what the next step needs */
    switch (e->p.layout == HR_LAYOUT_CONTIGUOUS ? HR_ADMIT_RESERVE : e->p.admission) {
    case HR_ADMIT_RESERVE: return e->p.layout == HR_LAYOUT_CONTIGUOUS ? e->p.n_ctx : life;
    case HR_ADMIT_OPTIMISTIC: return grow;
    case HR_ADMIT_ADAPTIVE:
    default: {
        int pred = e->predicted > 0 ? HR_MIN(e->predicted, r->max_tokens) : r->max_tokens;
        return HR_MAX(grow, HR_MIN(r->n_prompt + pred - 1, life));
    }
    }
}

static int outstanding_blocks(const hr_engine *e, const hr_request *r) {
    int need = (int)hr_kv_seq_claim_blocks(e->p.kv, r->swapped ? -1 : r->seq, r->n_slots, sched_claim_slots(e, r));
    /* a window keeps at most span positions (+ a partial block at each end): the blocks it leaves
     * behind return to the pool as new ones are taken, so it never needs more than that ahead */
    if (r->span > 0) need = HR_MIN(need, pool_blocks(e, r->span + 2 * e->block_size));
    return need > 0 ? need : 0;
}

int sched_headroom_blocks(const hr_engine *e) {
    int h = hr_kv_pool_n_free(e->p.kv);
    for (int i = 0; i < e->running.n; i++) h -= outstanding_blocks(e, e->running.v[i]);
    return h;
}

/* ---- sequences --------------------------------------------------------------------------------- */

/* Records the sequence's ledger into the request's stats, keeping the peak over its whole life. */
void sched_snapshot_ledger(hr_engine *e, hr_request *r) {
    hr_kv_seq_ledger l;
    if (r->seq < 0 || hr_kv_seq_get_ledger(e->p.kv, r->seq, &l, NULL) != HR_OK) return;
    pthread_mutex_lock(&r->mu);
    uint64_t peak = HR_MAX(r->stats.kv.bytes_peak, l.bytes_peak);
    int hits = r->stats.kv.prefix_hit_tokens;
    int evicted = l.tokens_evicted - r->stats.kv.tokens_evicted; /* < 0 on a fresh sequence */
    r->stats.kv = l;
    r->stats.kv.bytes_peak = peak;
    r->stats.kv.prefix_hit_tokens = hits;
    r->stats.n_computed = r->n_computed;
    r->stats.swapped = r->swapped;
    pthread_mutex_unlock(&r->mu);
    if (evicted > 0) {
        r->evict_pending += evicted;
        ev_flush_evictions(e, r, false);
    }
}

void sched_group_account(hr_engine *e, hr_request *r, bool finishing) {
    hr_req_group *g = atomic_load(&r->group);
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    if (finishing || g->epoch != e->group_epoch) {
        hr_kv_seq seqs[HR_ENGINE_MAX_GROUP];
        int n = 0;
        for (int i = 0; i < g->n_members; i++)
            if (g->members[i]->seq >= 0) seqs[n++] = g->members[i]->seq;
        int blocks = hr_kv_seqs_distinct_blocks(e->p.kv, seqs, n);
        g->epoch = e->group_epoch;
        g->blocks_now = blocks;
        g->blocks_peak = HR_MAX(g->blocks_peak, blocks);
        if (finishing) g->blocks_final = HR_MAX(g->blocks_final, blocks);
    }
    pthread_mutex_unlock(&g->mu);
}

void sched_release_seq(hr_engine *e, hr_request *r) {
    if (r->seq < 0) return;
    sched_snapshot_ledger(e, r);
    sched_group_account(e, r, true);
    ev_flush_evictions(e, r, true);
    hr_kv_seq_free(e->p.kv, r->seq); /* full blocks go to the prefix cache */
    r->seq = -1;
    r->n_computed = 0;
    r->n_slots = 0;
    r->swapped = false;
}

/* ---- preemption -------------------------------------------------------------------------------- */

/* Whether moving v's blocks out and back costs less time than recomputing its tokens: recompute at
 * the measured forward rate (tokens/s), swap at the measured swap bandwidth (2 GB/s until measured). */
static bool swap_cheaper(const hr_engine *e, const hr_request *v) {
    double tok_s = e->st.forward_seconds > 0 ? (double)e->st.batch_tokens / e->st.forward_seconds : 1000.0;
    double bw = e->swap_bytes_per_s > 0 ? e->swap_bytes_per_s : 2e9;
    double bytes = (double)pool_blocks(e, v->n_computed) * (double)hr_kv_block_bytes(hr_kv_pool_config(e->p.kv));
    return 2 * bytes / bw < v->n_computed / tok_s;
}

static void note_swap_speed(hr_engine *e, uint64_t bytes, double seconds) {
    if (seconds <= 0) return;
    double bw = (double)bytes / seconds;
    e->swap_bytes_per_s = e->swap_bytes_per_s > 0 ? 0.8 * e->swap_bytes_per_s + 0.2 * bw : bw;
}

/* Swap preemption: v keeps its sequence handle and computed tokens; its blocks go to the tier. */
static bool try_swap_out(hr_engine *e, hr_request *v) {
    if (!e->swap_ok || v->n_computed == 0) return false;
    hr_kv_seq_ledger pl;
    if (hr_kv_seq_get_ledger(e->p.kv, v->seq, &pl, NULL) != HR_OK || pl.blocks_evicted > 0)
        return false; /* its policy dropped blocks: only recompute can bring it back */
    if (e->p.preempt == HR_PREEMPT_AUTO && !swap_cheaper(e, v)) return false;
    sched_snapshot_ledger(e, v);
    double t0 = hr_time_now();
    if (hr_kv_seq_swap_out(e->p.kv, e->p.swap, v->seq, NULL) != HR_OK) return false; /* tier full: recompute */
    hr_kv_seq_ledger l;
    uint64_t bytes = hr_kv_seq_get_ledger(e->p.kv, v->seq, &l, NULL) == HR_OK ? l.bytes_swapped : 0;
    note_swap_speed(e, bytes, hr_time_now() - t0);
    v->swapped = true;
    v->n_slots = 0;
    e->st.preempt_swap++;
    e->st.swapped_bytes += bytes;
    pthread_mutex_lock(&v->mu);
    v->stats.swapped_bytes += bytes;
    v->stats.n_preempt_swap++;
    pthread_mutex_unlock(&v->mu);
    return true;
}

/* Takes r's blocks away and puts it back in the waiting list, at its rank. Swap (when the mode and
 * the tier allow): the blocks move to the tier and come back bit for bit. Recompute: the sequence is
 * released (its full blocks stay in the prefix cache, so re-prefill often finds them). Either way the
 * tokens, the sampler state and the output stay in the request, so it resumes where it stopped. */
static void preempt(hr_engine *e, hr_request *v) {
    int i = list_find(&e->running, v);
    if (i >= 0) list_remove_at(&e->running, i);
    e->budget_left += v->n_sched;
    v->n_sched = 0;
    int computed = v->n_computed;
    bool recompute = !try_swap_out(e, v);
    if (recompute) {
        sched_release_seq(e, v);
        e->st.preempt_recompute++;
    }
    v->state = HR_REQ_PREEMPTED;
    pthread_mutex_lock(&v->mu);
    v->stats.state = HR_REQ_PREEMPTED;
    v->stats.n_preemptions++;
    if (recompute) v->stats.n_preempt_recompute++;
    v->stats.n_computed = v->n_computed;
    v->stats.swapped = v->swapped;
    uint64_t held = v->stats.kv.bytes_now; /* the snapshot taken just before the blocks left */
    v->stats.kv.bytes_now = 0;             /* it holds no pool block until readmitted */
    v->stats.kv.blocks_own = v->stats.kv.blocks_shared = 0;
    pthread_mutex_unlock(&v->mu);
    ev_push(e, recompute ? HR_EVENT_PREEMPT_RECOMPUTE : HR_EVENT_PREEMPT_SWAP, v->stats.id, computed, held);
    e->st.preemptions++;
    e->preempted_this_step = true;
    atomic_fetch_add(&e->n_queued, 1);
    if (list_insert(&e->waiting, v) != HR_OK) { /* cannot queue it again: it must still end */
        atomic_fetch_sub(&e->n_queued, 1);
        sched_release_seq(e, v);
        req_finish(v, e->p.tok, HR_REQ_FAILED, HR_FINISH_ERROR, HR_ERR_NOMEM,
                   "out of memory re-queueing after preemption");
        e->st.failed++;
        req_unref(v);
    }
}

/* Fails a running request outside the forward pass (a KV table allocation failed). */
static void fail_running(hr_engine *e, hr_request *r, hr_status code, const char *msg) {
    int i = list_find(&e->running, r);
    if (i >= 0) list_remove_at(&e->running, i);
    e->budget_left += r->n_sched;
    r->n_sched = 0;
    sched_release_seq(e, r);
    req_finish(r, e->p.tok, HR_REQ_FAILED, HR_FINISH_ERROR, code, msg);
    e->st.failed++;
    req_unref(r);
}

/* Makes r's sequence hold n_slots slots, preempting the lowest-ranked running requests while the pool
 * is exhausted. Returns false when r itself was preempted (or failed). */
static bool reserve_or_preempt(hr_engine *e, hr_request *r, int n_slots) {
    for (;;) {
        hr_error err;
        /* called even when the table is long enough (a contiguous slot): the blocks this step writes
         * must also be writable (q4/kivi2 tail buffers) */
        hr_status st = hr_kv_seq_reserve(e->p.kv, r->seq, n_slots, &err);
        if (st == HR_OK) {
            r->n_slots = HR_MAX(r->n_slots, n_slots);
            return true;
        }
        if (st != HR_ERR_FULL) {
            fail_running(e, r, st, err.msg);
            return false;
        }
        snprintf(e->stall_msg, sizeof e->stall_msg, "%s", err.msg);
        hr_request *victim = e->running.v[e->running.n - 1];
        preempt(e, victim);
        if (victim == r) return false;
    }
}

/* ---- scheduling -------------------------------------------------------------------------------- */

/* Tokens r would take this step: the catch-up of computed to known, bounded by the budget and, for
 * prefill chunks, by prefill_chunk. */
static int chunk_for(const hr_engine *e, const hr_request *r) {
    int n = r->n_known - r->n_computed;
    if (n > 1) n = HR_MIN(n, e->p.prefill_chunk);
    n = HR_MIN(n, e->budget_left);
    /* q4/kivi2: every block a chunk writes holds an f16 tail buffer until it fills. A chunk ends at a
     * block boundary where the free buffers run out, so a long prefill takes what is free and goes
     * on next step, instead of asking for more buffers than exist (which could never succeed). At
     * least the first block is always asked for: when even that fails, reserve_or_preempt frees
     * buffers by preemption. */
    int free_stage = hr_kv_pool_n_stage_free(e->p.kv);
    int B = e->block_size;
    while (n > 0 && hr_kv_seq_stage_need(e->p.kv, r->seq, r->n_computed + n) > free_stage) {
        int cut = ((r->n_computed + n - 1) / B) * B - r->n_computed; /* drop the last block reached */
        if (cut <= 0) break;
        n = cut;
    }
    return n;
}

/* Schedules running requests in rank order; decodes (one token to catch up) in the first pass so a
 * long prefill never stalls them (Sarathi), prefill chunks in the second. */
static void schedule_running(hr_engine *e, bool decodes) {
    for (int i = 0; i < e->running.n && e->budget_left > 0;) {
        hr_request *r = e->running.v[i];
        int gap = r->n_known - r->n_computed;
        if (r->n_sched > 0 || r->swapped || (gap == 1) != decodes) {
            i++;
            continue;
        }
        int n = chunk_for(e, r);
        if (n <= 0 || !reserve_or_preempt(e, r, r->n_computed + n)) {
            if (i < e->running.n && e->running.v[i] == r) i++;
            continue;
        }
        r->n_sched = n;
        e->budget_left -= n;
        i++;
    }
}

/* A sequence handle for r. When every slot is taken and swapped-out requests hold some, the
 * lowest-ranked of them falls back to recompute (its copy is dropped) so that the handles held by
 * waiting requests can never block the whole queue. */
static bool take_seq(hr_engine *e, hr_request *r) {
    for (;;) {
        if (hr_kv_seq_create(e->p.kv, &r->seq, NULL) == HR_OK) return true;
        r->seq = -1;
        int j = e->waiting.n - 1;
        while (j >= 0 && !(e->waiting.v[j]->swapped && e->waiting.v[j] != r)) j--;
        if (j < 0) return false;
        sched_release_seq(e, e->waiting.v[j]);
    }
}

/* Brings a swapped-out r back when its whole claim fits the headroom. */
static bool swap_back_in(hr_engine *e, hr_request *r) {
    int whole = pool_blocks(e, sched_claim_slots(e, r));
    if (r->span > 0) whole = HR_MIN(whole, pool_blocks(e, r->span + 2 * e->block_size));
    if (sched_headroom_blocks(e) < whole) {
        snprintf(e->stall_msg, sizeof e->stall_msg,
                 "swapping it back in needs %d KV blocks, the headroom is %d of the pool's %d blocks", whole,
                 sched_headroom_blocks(e), e->n_blocks);
        return false;
    }
    double t0 = hr_time_now();
    hr_kv_seq_ledger l;
    uint64_t bytes = hr_kv_seq_get_ledger(e->p.kv, r->seq, &l, NULL) == HR_OK ? l.bytes_swapped : 0;
    hr_error err = {0};
    hr_status st = hr_kv_seq_swap_in(e->p.kv, r->seq, &err);
    if (st == HR_ERR_FULL) {
        snprintf(e->stall_msg, sizeof e->stall_msg, "%s", err.msg);
        return false;
    }
    if (st != HR_OK) { /* the copy is unreadable: recompute instead */
        sched_release_seq(e, r);
        return true;
    }
    note_swap_speed(e, bytes, hr_time_now() - t0);
    r->swapped = false;
    r->n_slots = blocks_of(e, r->n_computed) * e->block_size;
    return true;
}

/* Tries to start the head of the waiting list: takes a sequence (or swaps its blocks back in), shares
 * its cached prefix, and checks its claim against the headroom. On refusal everything is undone and
 * false is returned. */
static bool try_admit(hr_engine *e, hr_request *r) {
    hr_kv_pool *kv = e->p.kv;
    if (r->swapped && !swap_back_in(e, r)) return false;
    bool fresh = r->seq < 0;
    if (fresh) {
        if (!take_seq(e, r)) { /* no sequence slot free now */
            snprintf(e->stall_msg, sizeof e->stall_msg, "all %d KV sequence slots are held",
                     hr_kv_pool_config(kv)->max_seqs);
            return false;
        }
        /* the request's policy goes on before anything is shared or computed (checked at submit) */
        if (r->has_policy && hr_kv_seq_set_policy(kv, r->seq, &r->policy, NULL) != HR_OK) {
            hr_kv_seq_free(kv, r->seq);
            r->seq = -1;
            return false;
        }
        hr_kv_seq_set_prompt_len(kv, r->seq, r->n_prompt);
        /* an empty fresh sequence: the scope cannot be refused */
        if (r->cache_scope) hr_kv_seq_set_scope(kv, r->seq, r->cache_scope, NULL);
        if (e->p.layout == HR_LAYOUT_PAGED) {
            int cached = 0;
            if (hr_kv_seq_share_prefix(kv, r->seq, r->tokens, r->n_known, &cached, NULL) == HR_OK) {
                r->n_computed = r->n_slots = cached;
            }
        }
    }
    int claim = sched_claim_slots(e, r);
    int need = outstanding_blocks(e, r);
    if (fresh && sched_headroom_blocks(e) < need) {
        snprintf(e->stall_msg, sizeof e->stall_msg,
                 "its claim needs %d more KV blocks, the headroom is %d of the pool's %d blocks", need,
                 sched_headroom_blocks(e), e->n_blocks);
        hr_kv_seq_free(kv, r->seq);
        r->seq = -1;
        r->n_computed = r->n_slots = 0;
        return false;
    }
    if (e->p.layout == HR_LAYOUT_CONTIGUOUS) { /* a llama.cpp slot: the whole context, up front */
        hr_error err;
        if (hr_kv_seq_reserve_ahead(kv, r->seq, claim, &err) != HR_OK) {
            snprintf(e->stall_msg, sizeof e->stall_msg, "%s", err.msg);
            hr_kv_seq_free(kv, r->seq);
            r->seq = -1;
            r->n_computed = r->n_slots = 0;
            return false;
        }
        r->n_slots = claim;
    }
    int hits = fresh ? r->n_computed : 0;
    list_remove_at(&e->waiting, 0);
    atomic_fetch_sub(&e->n_queued, 1);
    if (list_insert(&e->running, r) != HR_OK) {
        atomic_fetch_add(&e->n_queued, 1);
        list_insert(&e->waiting, r); /* shrinking never fails: the slot was just freed */
        hr_kv_seq_free(kv, r->seq);
        r->seq = -1;
        r->n_computed = r->n_slots = 0;
        return false;
    }
    r->state = HR_REQ_RUNNING;
    e->st.prefix_hit_tokens += (uint64_t)hits;
    if (fresh) e->st.prefix_query_tokens += (uint64_t)r->n_known;
    pthread_mutex_lock(&r->mu);
    r->stats.state = HR_REQ_RUNNING;
    r->stats.n_computed = r->n_computed;
    r->stats.swapped = r->swapped;
    if (r->stats.t_admit == 0) r->stats.t_admit = hr_time_now();
    r->stats.prefix_hit_tokens += hits;
    r->stats.kv.prefix_hit_tokens += hits;
    pthread_mutex_unlock(&r->mu);
    return true;
}

/* Admits waiting requests in rank order (strict: a head that does not fit blocks those behind it, so
 * a large request is not starved by small ones). Nothing is admitted in a step that preempted. */
static void admit_waiting(hr_engine *e) {
    while (!e->preempted_this_step && e->waiting.n > 0 && e->budget_left > 0 && e->running.n < e->p.max_running) {
        hr_request *r = e->waiting.v[0];
        if (!try_admit(e, r)) break;
        int n = chunk_for(e, r);
        if (n > 0 && reserve_or_preempt(e, r, r->n_computed + n)) {
            r->n_sched = n;
            e->budget_left -= n;
        }
    }
}

void sched_plan(hr_engine *e) {
    e->budget_left = e->p.max_batch_tokens;
    e->preempted_this_step = false;
    for (int i = 0; i < e->running.n; i++) e->running.v[i]->n_sched = 0;
    schedule_running(e, true);
    schedule_running(e, false);
    admit_waiting(e);
}

int sched_build_batch(hr_engine *e, int *n_rows) {
    int T = 0, rows = 0;
    for (int i = 0; i < e->running.n; i++) {
        hr_request *r = e->running.v[i];
        for (int j = 0; j < r->n_sched; j++) {
            e->b_tokens[T] = r->tokens[r->n_computed + j];
            e->b_pos[T] = r->n_computed + j;
            e->b_seq[T] = r->seq;
            e->b_want[T] = 0;
            T++;
        }
        if (r->n_sched > 0 && r->n_computed + r->n_sched == r->n_known) {
            e->b_want[T - 1] = 1;
            e->b_sample[rows++] = r;
        }
    }
    *n_rows = rows;
    return T;
}

/* sim.c: a traffic through the engine's real scheduler and KV block manager in virtual time, on a
 * runtime like any front end's (hr_runtime_open / submit / step, runtime/runtime.h).
 *
 * The runtime opens on a stand-in shape alone (hr_runtime_params.shape: one layer, one KV head of 64,
 * no weights; the candidate's format and block size, and the block count the plan gives the real model
 * on the device) with the "sim" backend (hr_runtime_params.backend: hr_backend_sim, the seam the CPU
 * backend plugs into), which computes nothing: it writes zero K/V for every token and returns fixed
 * logits, and prices the batch for the real shape. Each hr_runtime_step advances a virtual clock by the
 * cost model's time for the batch it ran; arrivals are submitted when the clock passes them; a token's
 * time is the clock at the end of the step that sampled it. Nothing reads the wall clock, so a run
 * depends only on its inputs. Preemption is by recompute: the engine's "auto" mode weighs swap against
 * recompute with measured real speeds, which a virtual-time run must not depend on. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "common/util.h"
#include "plan/plan.h"
#include "runtime/runtime.h"

#define SIM_VOCAB 256

typedef struct sim_exec {
    hr_kv_pool *kv;
    const hr_cost_model *cost;
    double weight_bytes;    /* streamed once a step */
    double matrix_params;   /* the layers' matrices: 2 flops each per token */
    double head_params;     /* the output projection: 2 flops each per token that samples */
    double token_bytes;     /* KV of one token, every layer: read once per query token that sees it */
    double swa_token_bytes; /* a hybrid pool: its window groups' share of a token (token_bytes: the rest) */
    double swa_flops_tok;   /* ... and of attn_flops_tok */
    int swa_window;         /* ... and their window */
    double attn_flops_tok;  /* 4 x layers x heads x head_dim: per query token per visible key */
    int window;             /* keys visible to a query: min(pos + 1, window) when > 0 */
    double step_s;          /* the last step's cost */
} sim_exec;

/* The sim backend's instance: the seam's handle first, then the shape and cost it prices with. */
typedef struct sim_ctx {
    hr_backend_base base;
    sim_exec *x;
} sim_ctx;

static hr_status sim_forward(hr_model_ctx *c, const hr_batch *b, float *logits, hr_error *err) {
    (void)err;
    sim_exec *x = ((sim_ctx *)(void *)c)->x;
    static const float zero[64];
    double kv_bytes = 0, attn = 0;
    int row = 0;
    for (int i = 0; i < b->n_tokens; i++) {
        hr_kv_write(x->kv, 0, b->seq[i], b->pos[i], zero, zero);
        double visible = (double)(x->window > 0 ? HR_MIN(b->pos[i] + 1, x->window) : b->pos[i] + 1);
        kv_bytes += visible * x->token_bytes;
        attn += visible * x->attn_flops_tok;
        if (x->swa_window > 0) { /* a hybrid pool's window layers see at most their window */
            double seen = (double)HR_MIN(b->pos[i] + 1, x->swa_window);
            kv_bytes += seen * x->swa_token_bytes;
            attn += seen * x->swa_flops_tok;
        }
        if (!b->want_logits || !b->want_logits[i]) continue; /* the output projection: rows that sample */
        float *y = logits + (size_t)row++ * SIM_VOCAB;
        for (int v = 0; v < SIM_VOCAB; v++) y[v] = 0;
        y[7] = 1; /* greedy picks 7; requests ignore EOS, so each runs to its output length */
    }
    hr_cost_step s = {.bytes = x->weight_bytes + kv_bytes,
                      .layer_flops = 2.0 * x->matrix_params * b->n_tokens,
                      .n_tokens = b->n_tokens,
                      .head_flops = 2.0 * x->head_params * row,
                      .n_rows = row,
                      .attn_flops = attn};
    x->step_s = hr_cost_step_s(x->cost, &s);
    return HR_OK;
}

/* No model (NULL): the shape and the cost model come as backend_user (a sim_exec), the pool is the
 * stand-in. */
static hr_status sim_create(const hr_model *m, hr_kv_pool *kv, const hr_model_ctx_params *p, hr_model_ctx **out,
                            hr_error *err) {
    (void)m;
    sim_ctx *c = calloc(1, sizeof *c);
    if (!c) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    c->base.ops = &hr_backend_sim;
    c->x = p->backend_user;
    c->x->kv = kv;
    *out = (hr_model_ctx *)(void *)c;
    return HR_OK;
}

static void sim_destroy(hr_model_ctx *c) { free(c); }

/* It holds no weights and no scratch: weight_bytes and scratch_bytes are none (the budget of the
 * device it models comes from the plan, not from this process). */
const hr_backend_ops hr_backend_sim = {
    .name = "sim", .create = sim_create, .destroy = sim_destroy, .forward = sim_forward};

typedef struct sim_req {
    hr_rt_request *h;
    int n_seen;
    double t_last;
    bool done;
} sim_req;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The p-th percentile (0..1) as `headroom bench` computes it (interpolated between ranks), so that the
 * two compare: with 30 requests the nearest-rank median and the interpolated one differed by 10%. */
static double pct(double *v, size_t n, double p) {
    if (n == 0) return 0;
    qsort(v, n, sizeof *v, cmp_double);
    return hr_percentile(v, (int)n, 100.0 * p);
}

/* The prompt's token ids: a prefix's tokens depend only on its id, the rest on the request. */
static void fill_prompt(int32_t *ids, const hr_traffic_req *q, int i) {
    for (int t = 0; t < q->n_prompt; t++) {
        uint64_t h = t < q->n_prefix ? ((uint64_t)q->prefix_id + 1) * 0x9E3779B97F4A7C15ull
                                     : ((uint64_t)i + 1) * 0xC2B2AE3D27D4EB4Full;
        h ^= (uint64_t)t * 0x165667B19E3779F9ull;
        h ^= h >> 29;
        ids[t] = (int32_t)(h % SIM_VOCAB);
    }
}

/* The block count the real model gets on the device (the plan's), for the stand-in pool (one layer,
 * one head, the candidate's format) to hold. */
static hr_status sim_blocks(const hr_plan_model *m, const hr_plan *pl, const hr_plan_device *d,
                            const hr_sim_candidate *c, const hr_traffic *t, const int32_t *windows,
                            const hr_kv_groups *lay, int *n_blocks, int *pool_blocks, uint64_t *real_block_bytes,
                            hr_error *err) {
    const hr_hparams *hp = &m->hp;
    hr_kv_budget_query q = {.kv = {.n_layers = hp->n_layer,
                                   .n_kv_heads = hp->n_head_kv,
                                   .head_dim = hp->head_dim,
                                   .v_from_k = hp->kv_lora_rank, /* deepseek2: a latent cache, V read from K */
                                   .block_size = pl->p.block_size,
                                   .k_format = (hr_kv_format)c->format,
                                   .v_format = (hr_kv_format)c->format,
                                   .max_seqs = c->max_running,
                                   .max_step_tokens = pl->p.max_batch_tokens,
                                   .layer_window = windows}, /* a hybrid model's groups, as the runtime's */
                            .n_ctx = pl->held_ctx,
                            .n_seqs = 1,
                            .mem = {.model = hp,
                                    .weight_bytes = m->resident_bytes,
                                    .max_batch_tokens = pl->p.max_batch_tokens,
                                    .n_threads = pl->p.n_threads,
                                    .base_bytes = d->reserved_bytes,
                                    .mem_limit = pl->usable_bytes}};
    hr_kv_budget b;
    hr_status st = hr_kv_budget_compute(&q, &b, err);
    if (st == HR_ERR_INVALID_ARG) return st; /* HR_ERR_BUDGET: the pool is smaller than a context: simulate it */
    *n_blocks = b.n_blocks;
    *real_block_bytes = b.block_bytes;
    if (d->gpu) { /* the pool `serve --device cuda` gets there: the GPU arena's */
        hr_cuda_arena_query aq = {.hp = hp,
                                  .weight_bytes = m->gpu_weight_bytes,
                                  .max_batch_tokens = pl->p.max_batch_tokens,
                                  .max_ctx = pl->p.n_ctx,
                                  .block_size = pl->p.block_size,
                                  .block_bytes = b.block_bytes,
                                  .stage_bytes = b.fixed_bytes,
                                  .total_bytes = d->mem_bytes,
                                  .free_bytes = d->mem_bytes - HR_MIN(d->mem_bytes, d->reserved_bytes),
                                  .util = d->util,
                                  .n_groups = lay->n_groups};
        hr_cuda_arena_plan g;
        if (hr_cuda_arena_plan_compute(&aq, &g, NULL) == HR_OK) *n_blocks = g.n_blocks;
    }
    /* a pool larger than every block the traffic could ever hold at once behaves the same (nothing is
     * ever evicted or refused for room), so the stand-in stops there: a GPU's millions of blocks would
     * cost real memory for nothing */
    uint64_t demand = (uint64_t)c->max_running + 1;
    for (int i = 0; i < t->n; i++)
        demand += (uint64_t)lay->n_groups *
                  ((uint64_t)(t->reqs[i].n_prompt + t->reqs[i].n_output + pl->p.block_size - 1) / pl->p.block_size);
    *pool_blocks = (int)HR_MIN((uint64_t)HR_MAX(1, *n_blocks), demand);
    return HR_OK;
}

hr_status hr_sim_run(const hr_plan_model *m, const hr_plan *pl, const hr_plan_device *d, const hr_cost_model *cost,
                     const hr_traffic *t, const hr_sim_candidate *c, hr_sim_result *out, hr_error *err) {
    memset(out, 0, sizeof *out);
    out->c = *c;
    if (cost->bw_gbps <= 0) return hr_error_set(err, HR_ERR_INVALID_ARG, "the cost model has no bandwidth");
    const hr_hparams *hp = &m->hp;
    sim_exec x = {.cost = cost, .window = c->window};
    uint64_t real_block_bytes = 0;
    int pool_blocks = 0;
    /* a model mixing window and full layers: the real runtime's hybrid pool (kv.h's layer groups), in
     * the block count and in the stand-in, which gets one layer per group of the same kinds */
    int32_t *win = malloc(sizeof(int32_t) * (size_t)HR_MAX(1, hp->n_layer));
    if (!win) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    const int32_t *windows = hr_plan_layer_windows(hp, win);
    hr_kv_groups lay = {.n_groups = 1};
    hr_kv_config gc = {.n_layers = hp->n_layer,
                       .n_kv_heads = hp->n_head_kv,
                       .head_dim = hp->head_dim,
                       .v_from_k = hp->kv_lora_rank,
                       .block_size = pl->p.block_size,
                       .k_format = (hr_kv_format)c->format,
                       .v_format = (hr_kv_format)c->format,
                       .max_seqs = c->max_running,
                       .max_step_tokens = pl->p.max_batch_tokens,
                       .layer_window = windows};
    if (windows && hr_kv_config_groups(&gc, &lay, NULL) != HR_OK) lay = (hr_kv_groups){.n_groups = 1};
    int win_groups = 0;
    for (int k = 0; lay.n_groups > 1 && k < lay.n_kinds; k++)
        win_groups += lay.kinds[k].window > 0 ? lay.kinds[k].n_groups : 0;
    hr_status st = sim_blocks(m, pl, d, c, t, windows, &lay, &out->n_blocks, &pool_blocks, &real_block_bytes, err);
    free(win);
    if (st) return st;
    uint64_t elems = 0;
    for (int i = 0; i < m->n_rows; i++) elems += m->rows[i].n_elements;
    x.weight_bytes = (double)m->tensor_bytes;
    /* every matrix but the embedding table (a lookup) and the output projection (counted apart) */
    x.head_params = (double)hp->n_vocab * hp->n_embd;
    x.matrix_params = (double)elems - (hp->tied_output ? 1.0 : 2.0) * x.head_params;
    x.token_bytes = (double)real_block_bytes / pl->p.block_size;
    x.attn_flops_tok = 4.0 * hp->n_layer * hp->n_head * hp->head_dim;
    if (hp->sliding_window > 0 && (x.window == 0 || hp->sliding_window < x.window)) x.window = hp->sliding_window;
    if (lay.n_groups > 1) { /* real_block_bytes is one group's: the full groups' and the window groups' */
        x.token_bytes = (double)real_block_bytes * (lay.n_groups - win_groups) / pl->p.block_size;
        x.swa_token_bytes = (double)real_block_bytes * win_groups / pl->p.block_size;
        x.attn_flops_tok = 4.0 * (hp->n_layer - hp->n_window_layers) * hp->n_head * hp->head_dim;
        x.swa_flops_tok = 4.0 * hp->n_window_layers * hp->n_head * hp->head_dim;
        x.swa_window = hp->swa_window;
        if (x.window > 0 && x.window < x.swa_window) x.swa_window = x.window; /* a window:W candidate */
    }

    /* A runtime on the stand-in shape (one layer, one KV head of 64, SIM_VOCAB logits) with the sim
     * backend pricing each step for the real shape (x): the runtime's pool, engine and requests as a
     * server has them, in the candidate's format, block count, admission and slots. */
    hr_rt_shape shape = {
        .n_vocab = SIM_VOCAB, .n_embd = 64, .n_ff = 64, .n_head = 1, .n_head_kv = 1, .n_layer = 1, .head_dim = 64};
    if (lay.n_groups > 1) { /* one stand-in layer per group, window groups first: the same block counts */
        shape.n_layer = lay.n_groups;
        shape.n_window_layers = win_groups;
        shape.swa_window = hp->swa_window;
    }
    hr_runtime_params rp = hr_runtime_default_params();
    rp.shape = &shape;
    rp.backend = &hr_backend_sim;
    rp.backend_user = &x;
    rp.n_ctx = pl->p.n_ctx;
    rp.k_format = rp.v_format = c->format;
    rp.block_size = pl->p.block_size;
    rp.max_batch_tokens = pl->p.max_batch_tokens;
    rp.max_running = c->max_running;
    rp.max_queue = t->n + 1;
    rp.admission = c->admission;
    rp.preempt = HR_RT_PREEMPT_RECOMPUTE;
    rp.kv_blocks = pool_blocks;
    rp.raw_ids = true;
    rp.n_threads = 1; /* nothing computes */
    hr_runtime *rt = NULL;
    if ((st = hr_runtime_open(&rp, &rt, NULL, err))) return st;
    char pol[32] = "";
    if (c->window > 0) snprintf(pol, sizeof pol, "window:%d", c->window);
    sim_req *rs = calloc((size_t)t->n, sizeof *rs);
    double *ttft = malloc(sizeof(double) * (size_t)t->n);
    size_t n_gaps = 0, cap_gaps = 1024;
    double *gaps = malloc(sizeof(double) * cap_gaps);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)HR_MAX(1, pl->p.n_ctx));
    if (!rs || !ttft || !gaps || !ids) st = hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    double now = 0, t_first = t->n ? t->reqs[0].t_arrival : 0, t_end = t_first;
    int next = 0, active = 0, n_ttft = 0;
    while (st == HR_OK && (next < t->n || active > 0)) {
        for (; next < t->n && t->reqs[next].t_arrival <= now; next++) {
            const hr_traffic_req *q = &t->reqs[next];
            fill_prompt(ids, q, next);
            hr_rt_request_params qp = {.prompt_ids = ids,
                                       .n_prompt_ids = q->n_prompt,
                                       .max_tokens = q->n_output,
                                       .ignore_eos = true,
                                       .kv_policy = c->window > 0 ? pol : NULL};
            qp.sampling = hr_rt_sampling_default();
            qp.sampling.temperature = 0;
            hr_error why;
            if (hr_runtime_submit(rt, &qp, &rs[next].h, &why) != HR_OK) {
                out->refused++;
                rs[next].done = true;
                continue;
            }
            rs[next].t_last = q->t_arrival;
            active++;
        }
        if (active == 0) { /* idle: jump to the next arrival */
            if (next < t->n) now = t->reqs[next].t_arrival;
            continue;
        }
        x.step_s = 0;
        int unfinished = 0;
        if ((st = hr_runtime_step(rt, &unfinished, err))) break;
        now += x.step_s;
        hr_runtime_pool pool;
        hr_runtime_get_pool(rt, &pool);
        out->peak_blocks = HR_MAX(out->peak_blocks, pool.ledger.blocks_used);
        for (int i = 0; i < next; i++) {
            sim_req *r = &rs[i];
            if (r->done) continue;
            hr_rt_result res;
            hr_rt_request_result(r->h, &res);
            int n = res.n_ids;
            for (; r->n_seen < n; r->n_seen++) {
                if (r->n_seen == 0)
                    ttft[n_ttft++] = now - t->reqs[i].t_arrival;
                else {
                    if (n_gaps == cap_gaps) {
                        double *ng = realloc(gaps, sizeof(double) * (cap_gaps *= 2));
                        if (!ng) {
                            st = hr_error_set(err, HR_ERR_NOMEM, "out of memory");
                            break;
                        }
                        gaps = ng;
                    }
                    gaps[n_gaps++] = now - r->t_last;
                }
                r->t_last = now;
            }
            if (res.state == HR_RT_COMPLETED || res.state == HR_RT_FAILED || res.state == HR_RT_CANCELLED) {
                r->done = true;
                active--;
                out->completed += res.state == HR_RT_COMPLETED;
                out->refused += res.state == HR_RT_FAILED; /* the engine gave up on it (it could never run) */
                out->output_tokens += (uint64_t)n;
                t_end = HR_MAX(t_end, now);
                hr_rt_request_release(rt, r->h);
                r->h = NULL;
            }
        }
    }
    if (st == HR_OK) {
        hr_runtime_pool pool;
        hr_runtime_get_pool(rt, &pool);
        out->preemptions = pool.engine.preemptions;
        out->peak_kv_bytes = (uint64_t)out->peak_blocks * real_block_bytes;
        out->makespan_s = t_end - t_first;
        out->throughput_tok_s = out->makespan_s > 0 ? (double)out->output_tokens / out->makespan_s : 0;
        out->ttft_p50 = pct(ttft, (size_t)n_ttft, 0.5);
        out->ttft_p99 = pct(ttft, (size_t)n_ttft, 0.99);
        out->itl_p50 = pct(gaps, n_gaps, 0.5);
        out->itl_p99 = pct(gaps, n_gaps, 0.99);
    }
    for (int i = 0; rs && i < t->n; i++) hr_rt_request_release(rt, rs[i].h);
    hr_runtime_close(rt);
    free(rs);
    free(ttft);
    free(gaps);
    free(ids);
    return st;
}

/* plan.c: the whole-process budget of a model on a device, one row per KV format, each computed by the
 * runtime's hr_kv_budget_compute twice: once for n_ctx x concurrency (what it needs), once with the
 * device's usable bytes as the limit (what the device holds). Nothing here re-derives a byte count the
 * runtime computes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "plan/plan.h"

static void fill_defaults(const hr_plan_model *m, const hr_plan_device *d, hr_plan_params *p) {
    if (p->n_ctx <= 0) p->n_ctx = m->hp.n_ctx_train > 0 ? HR_MIN(m->hp.n_ctx_train, 4096) : 4096;
    if (p->concurrency <= 0) p->concurrency = 1;
    if (p->block_size <= 0) p->block_size = 16;
    if (p->max_batch_tokens <= 0) p->max_batch_tokens = 512;
    if (p->max_running <= 0) p->max_running = HR_MAX(p->concurrency, 64);
    if (p->n_threads <= 0) p->n_threads = d->gpu ? 1 : (int)HR_MAX(1, sysconf(_SC_NPROCESSORS_ONLN));
}

/* Each layer's window as the pool will be told it: a model mixing window and full layers (gemma2/3)
 * gets hp->n_window_layers windows of hp->swa_window (which layers does not change the groups or
 * their bytes: only the counts do); NULL for a one-kind model (held_ctx covers a window of every
 * layer, as before). w holds n_layer entries. */
const int32_t *hr_plan_layer_windows(const hr_hparams *hp, int32_t *w) {
    if (hp->sliding_window > 0 || hp->n_window_layers <= 0 || hp->swa_window <= 0) return NULL;
    for (int l = 0; l < hp->n_layer; l++) w[l] = l < hp->n_window_layers ? hp->swa_window : 0;
    return w;
}

static void plan_row(const hr_plan_model *m, const hr_plan_device *d, hr_plan *pl, hr_rt_kv_format kf,
                     hr_rt_kv_format vf, const int32_t *windows, hr_plan_format_row *row) {
    const hr_plan_params *p = &pl->p;
    const hr_hparams *hp = &m->hp;
    memset(row, 0, sizeof *row);
    row->k_format = kf;
    row->v_format = vf;
    hr_kv_budget_query q = {.kv = {.n_layers = hp->n_layer,
                                   .n_kv_heads = hp->n_head_kv,
                                   .head_dim = hp->head_dim,
                                   .v_from_k = hp->kv_lora_rank, /* deepseek2: a latent cache, V read from K */
                                   .block_size = p->block_size,
                                   .k_format = (hr_kv_format)kf, /* the same numbers (runtime_types.h) */
                                   .v_format = (hr_kv_format)vf,
                                   .max_seqs = p->max_running,
                                   .max_step_tokens = p->max_batch_tokens,
                                   .layer_window = windows},
                            .n_ctx = pl->held_ctx,
                            .n_seqs = p->concurrency,
                            .mem = {.model = hp,
                                    .weight_bytes = m->resident_bytes,
                                    .max_batch_tokens = p->max_batch_tokens,
                                    .n_threads = p->n_threads,
                                    .base_bytes = d->reserved_bytes}};
    hr_status st = hr_kv_budget_compute(&q, &row->need, NULL);
    if (st == HR_ERR_INVALID_ARG) return;
    row->usable = true;
    row->token_bytes = row->need.token_bytes;
    row->fits = row->need.total_bytes <= pl->usable_bytes;
    q.mem.mem_limit = pl->usable_bytes;
    hr_kv_budget_compute(&q, &row->most, NULL); /* HR_ERR_BUDGET when not one sequence fits: the rows say */
    row->max_concurrency = row->most.n_seqs_at_ctx;
    row->max_ctx = (int64_t)(row->most.n_blocks / p->concurrency) * p->block_size;
    if (q.kv.layer_window) { /* a hybrid pool: the longest context whose sequences' groups all fit */
        int64_t lo = 0, hi = INT32_MAX / 2, per = row->most.n_blocks / p->concurrency;
        while (lo < hi) {
            int64_t mid = lo + (hi - lo + 1) / 2;
            if (hr_kv_seq_blocks_at(&q.kv, mid) <= per)
                lo = mid;
            else
                hi = mid - 1;
        }
        row->max_ctx = lo / p->block_size * p->block_size;
    }
    /* a sliding-window model holds at most the window per sequence: any context fits once that does */
    if (hp->sliding_window > 0 && row->max_concurrency >= p->concurrency) row->max_ctx = INT64_MAX;
}

hr_status hr_plan_compute(const hr_plan_model *m, const hr_plan_device *d, const hr_plan_params *params, hr_plan *out,
                          hr_error *err) {
    memset(out, 0, sizeof *out);
    out->p = *params;
    fill_defaults(m, d, &out->p);
    const hr_plan_params *p = &out->p;
    const hr_hparams *hp = &m->hp;
    double util = d->util > 0 && d->util <= 1 ? d->util : 1.0;
    out->usable_bytes = (uint64_t)((double)d->mem_bytes * util);
    /* blocks wholly past a sliding window are dropped (backend/cpu/forward.c sets the pool's window), so a
     * sequence holds the window plus the block being filled */
    out->held_ctx = hp->sliding_window > 0 ? HR_MIN(p->n_ctx, hp->sliding_window + p->block_size) : p->n_ctx;
    out->n_window_layers = hp->sliding_window > 0 ? hp->n_layer : hp->swa_window > 0 ? hp->n_window_layers : 0;
    out->n_full_layers = hp->n_layer - out->n_window_layers;
    out->chosen = -1;
    int32_t *win = malloc(sizeof(int32_t) * (size_t)HR_MAX(1, hp->n_layer));
    if (!win) return hr_error_set(err, HR_ERR_NOMEM, "out of memory for %d layer windows", hp->n_layer);
    const int32_t *windows = hr_plan_layer_windows(hp, win); /* NULL: one kind of layer */
    for (int f = 0; f < HR_RT_KV_FORMAT_COUNT; f++) {
        plan_row(m, d, out, (hr_rt_kv_format)f, (hr_rt_kv_format)f, windows, &out->rows[f]);
        if ((hr_rt_kv_format)f == p->k_format && p->k_format == p->v_format) out->chosen = f;
    }
    if (out->chosen < 0) { /* K and V in different formats: the pair replaces K's row */
        out->chosen = (int)p->k_format;
        plan_row(m, d, out, p->k_format, p->v_format, windows, &out->rows[out->chosen]);
    }
    const hr_plan_format_row *c = &out->rows[out->chosen];
    if (!c->usable) {
        hr_kv_budget_query q = {.kv = {.n_layers = hp->n_layer,
                                       .n_kv_heads = hp->n_head_kv,
                                       .head_dim = hp->head_dim,
                                       .v_from_k = hp->kv_lora_rank, /* deepseek2: a latent cache, V read from K */
                                       .block_size = p->block_size,
                                       .k_format = (hr_kv_format)p->k_format,
                                       .v_format = (hr_kv_format)p->v_format,
                                       .max_seqs = p->max_running},
                                .n_ctx = out->held_ctx};
        hr_kv_budget b;
        free(win);
        return hr_kv_budget_compute(&q, &b, err); /* the runtime's own message names format and shape */
    }
    out->layer_token_bytes = c->token_bytes / (uint64_t)HR_MAX(1, hp->n_layer);
    {
        hr_kv_config kc = {.n_layers = hp->n_layer,
                           .n_kv_heads = hp->n_head_kv,
                           .head_dim = hp->head_dim,
                           .v_from_k = hp->kv_lora_rank, /* the groups' bytes: a latent cache counts K only */
                           .block_size = p->block_size,
                           .k_format = (hr_kv_format)c->k_format,
                           .v_format = (hr_kv_format)c->v_format,
                           .max_seqs = p->max_running,
                           .max_step_tokens = p->max_batch_tokens,
                           .layer_window = windows};
        hr_status st = hr_kv_config_groups(&kc, &out->groups, err);
        if (st == HR_OK && d->gpu) {
            hr_cuda_arena_query aq = {.hp = hp,
                                      .weight_bytes = m->gpu_weight_bytes,
                                      .max_batch_tokens = p->max_batch_tokens,
                                      .max_ctx = p->n_ctx,
                                      .block_size = p->block_size,
                                      .block_bytes = hr_kv_block_bytes(&kc),
                                      .stage_bytes = hr_kv_fixed_bytes(&kc),
                                      .total_bytes = d->mem_bytes,
                                      .free_bytes = d->mem_bytes - HR_MIN(d->mem_bytes, d->reserved_bytes),
                                      .util = util,
                                      .n_groups = out->groups.n_groups};
            hr_error ge = {0};
            out->gpu_planned = true;
            out->gpu_ok = hr_cuda_arena_plan_compute(&aq, &out->gpu, &ge) == HR_OK;
            if (!out->gpu_ok) snprintf(out->gpu_why, sizeof out->gpu_why, "%s", ge.msg);
        }
        for (int k = 0; st == HR_OK && k < out->groups.n_kinds; k++) {
            out->kind_token_bytes[k] =
                out->groups.block_bytes * (uint64_t)out->groups.kinds[k].n_groups / (uint64_t)p->block_size;
            out->kind_seq_bytes[k] = (uint64_t)hr_kv_kind_blocks_at(&kc, k, out->held_ctx) * out->groups.block_bytes;
            out->seq_bytes += out->kind_seq_bytes[k];
        }
        free(win); /* kc.layer_window pointed into it */
        if (st != HR_OK) return st;
    }
    if (d->bw_gbps > 0) {
        /* a hybrid pool's window layers read at most their window */
        double seq_kv = out->groups.n_groups > 1 ? (double)out->seq_bytes : out->held_ctx * (double)c->token_bytes;
        double step_bytes = (double)m->tensor_bytes + (double)p->concurrency * seq_kv;
        out->step_s = step_bytes / (d->bw_gbps * 1e9);
        out->decode_tok_s = p->concurrency / out->step_s;
    }
    return HR_OK;
}

/* cmd_plan.c: `headroom plan`: the whole-process memory budget of a model (GGUF or config.json) on a
 * device, for a context x concurrency, at every KV format (src/plan; docs/PLAN.md). Prints a table, or
 * JSON with --json. Exit 0 when the asked configuration fits, 1 when it does not (stderr says what
 * would), 2 for a usage error. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/errors.h"
#include "cli/options.h"
#include "common/util.h"
#include "plan/plan.h"
#include "runtime/runtime.h"

typedef hr_plan_cli_opts plan_opts; /* cli/options.h: the table parses into it */

static bool parse(int argc, char **argv, plan_opts *o, bool *help) {
    hr_opt_dsts dst = {.p[HR_DST_PLAN] = o};
    hr_opts_defaults(HR_CMD_PLAN, &dst);
    for (int i = 1; i < argc; i++) {
        const hr_opt *row;
        const char *a = argv[i], *v = NULL;
        switch (hr_opts_parse(HR_CMD_PLAN, "plan", &dst, argc, argv, &i, &row, &v)) {
        case HR_OPT_STORED:
        case HR_OPT_CALLER: /* plan has no such row */ continue;
        case HR_OPT_BAD: return false;
        case HR_OPT_HELP: *help = true; return true;
        case HR_OPT_UNKNOWN:
            fprintf(stderr, "headroom plan: unknown option '%s' (see headroom plan --help)\n", a);
            return false;
        }
    }
    if (!o->model && !o->calibrate_file) {
        fprintf(stderr, "headroom plan: -m FILE.gguf|config.json is required (see headroom plan --help)\n");
        return false;
    }
    if (o->max_ppl > 0 && !o->eval_file) {
        fprintf(stderr, "headroom plan: --max-ppl-increase needs --eval FILE (a `headroom eval --json` result)\n");
        return false;
    }
    return true;
}

static const char *sz(uint64_t b, char *buf) { return hr_format_size(b, buf, 32); }

static void fmt_name(const hr_plan_format_row *r, char *buf, size_t n) {
    if (r->k_format == r->v_format)
        snprintf(buf, n, "%s", hr_rt_kv_format_name(r->k_format));
    else
        snprintf(buf, n, "%s/%s", hr_rt_kv_format_name(r->k_format), hr_rt_kv_format_name(r->v_format));
}

static void print_table(const plan_opts *o, const hr_plan_model *m, const hr_plan_device *d, const hr_plan *pl) {
    const hr_hparams *hp = &m->hp;
    const hr_plan_params *p = &pl->p;
    const hr_plan_format_row *c = &pl->rows[pl->chosen];
    char b1[32], b2[32], b3[32], fname[32];
    printf("model: %s (%s, %s): %d layers, %d heads / %d KV heads, head_dim %d, hidden %d, ffn %d, vocab %d, "
           "output %s%s\n",
           hp->name[0] ? hp->name : o->model, hp->arch_name, m->from_config ? "config.json, no weights" : "GGUF",
           hp->n_layer, hp->n_head, hp->n_head_kv, hp->head_dim, hp->n_embd, hp->n_ff, hp->n_vocab,
           hp->tied_output ? "tied to the embedding" : "untied", hp->sliding_window ? ", sliding window" : "");
    char bw[48];
    if (d->bw_gbps > 0)
        snprintf(bw, sizeof bw, "%.0f GB/s%s", d->bw_gbps, d->bw_measured ? " (measured)" : "");
    else
        snprintf(bw, sizeof bw, "unknown (--device-bw GBPS)");
    printf("device: %s: %s x %.2f = %s usable; bandwidth %s; %s %s\n\n", d->name, sz(d->mem_bytes, b1), d->util,
           sz(pl->usable_bytes, b2), bw, d->from_driver ? "in use now" : "runtime reserved", sz(d->reserved_bytes, b3));

    printf("weights (what gets loaded)        tensors      elements       bytes\n");
    for (int i = 0; i < m->n_rows; i++)
        printf("  %-30s %8d %13llu %11s\n", m->rows[i].type, m->rows[i].n_tensors,
               (unsigned long long)m->rows[i].n_elements, sz(m->rows[i].bytes, b1));
    printf("  %-30s %8s %13s %11s\n", m->from_config ? "file metadata (estimated)" : "file metadata (vocabulary...)",
           "", "", sz(m->file_bytes - m->tensor_bytes, b1));
    printf("  %-30s %8s %13s %11s\n", "norms copied to f32 at load", "", "", sz(m->resident_bytes - m->file_bytes, b1));
    printf("  %-30s %8s %13s %11s\n\n", "resident", "", "", sz(m->resident_bytes, b1));

    fmt_name(c, fname, sizeof fname);
    printf("KV cache per token (%s, block %d)\n", fname, p->block_size);
    if (pl->groups.n_kinds == 1 && pl->groups.kinds[0].latent) { /* MLA: one latent a token and layer, K only */
        const int nl = pl->groups.kinds[0].n_layers;
        printf("  latent layers           %3d x %s (one latent a layer; V read from it)\n", nl,
               sz(nl > 0 ? pl->kind_token_bytes[0] / (uint64_t)nl : 0, b1));
    } else {
        printf("  full-attention layers   %3d x %s\n", pl->n_full_layers, sz(pl->layer_token_bytes, b1));
        printf("  sliding-window layers   %3d x %s", pl->n_window_layers, sz(pl->layer_token_bytes, b1));
        if (hp->sliding_window)
            printf(" (capped at the window: %d tokens + one block)\n", hp->sliding_window);
        else
            printf("\n");
    }
    printf("  every layer             %s per token\n", sz(c->token_bytes, b1));
    if (pl->groups.n_groups > 1) { /* a hybrid pool: window groups hold at most their window */
        printf("  layer groups            %d of %d layers each (one pool, one budget)\n", pl->groups.n_groups,
               pl->groups.slots);
        for (int k = 0; k < pl->groups.n_kinds; k++) {
            char kind[32];
            if (pl->groups.kinds[k].window > 0)
                snprintf(kind, sizeof kind, "window %d", pl->groups.kinds[k].window);
            else
                snprintf(kind, sizeof kind, "%s", pl->groups.kinds[k].latent ? "latent" : "full");
            printf("    %-12s %3d layers  %s per token, one sequence at the context %s\n", kind,
                   pl->groups.kinds[k].n_layers, sz(pl->kind_token_bytes[k], b1), sz(pl->kind_seq_bytes[k], b2));
        }
        printf("  one sequence at the context: %s (every layer full: %s)\n", sz(pl->seq_bytes, b1),
               sz(c->token_bytes * (uint64_t)((p->n_ctx + p->block_size - 1) / p->block_size * p->block_size), b2));
    }
    printf("  held per sequence       %d tokens (context %d)\n\n", pl->held_ctx, p->n_ctx);

    const hr_kv_budget *n = &c->need;
    printf("budget: context %d x concurrency %d, KV %s       bytes\n", p->n_ctx, p->concurrency, fname);
    printf("  weights                                       %11s\n", sz(n->weight_bytes, b1));
    printf("  KV cache (worst case: every sequence full)    %11s\n", sz(n->budget_bytes, b1));
    printf("  activations and scratch (%5d batch tokens)  %11s\n", p->max_batch_tokens, sz(n->scratch_bytes, b1));
    printf("  pool tables, requests, tokenizer              %11s\n", sz(n->meta_bytes, b1));
    printf("  runtime overhead                              %11s\n", sz(n->base_bytes, b1));
    printf("  total                                         %11s of %s usable: %s (%.1f%%)\n\n", sz(n->total_bytes, b1),
           sz(pl->usable_bytes, b2), c->fits ? "fits" : "DOES NOT FIT",
           100.0 * (double)n->total_bytes / (double)(pl->usable_bytes ? pl->usable_bytes : 1));

    printf("every KV format   bytes/token   need (ctx x conc)  fits   max conc @ctx %-6d  max ctx @conc %-4d  "
           "pool tokens\n",
           p->n_ctx, p->concurrency);
    for (int f = 0; f < HR_RT_KV_FORMAT_COUNT; f++) {
        const hr_plan_format_row *r = &pl->rows[f];
        fmt_name(r, fname, sizeof fname);
        if (!r->usable) {
            printf("  %-14s  (cannot hold this shape: head_dim %d, block %d)\n", fname, hp->head_dim, p->block_size);
            continue;
        }
        char ctxs[32];
        if (r->max_ctx == INT64_MAX)
            snprintf(ctxs, sizeof ctxs, "any (window)");
        else
            snprintf(ctxs, sizeof ctxs, "%lld", (long long)r->max_ctx);
        printf("  %-14s  %11s   %17s  %-5s  %20d  %18s  %11lld\n", fname, sz(r->token_bytes, b1),
               sz(r->need.total_bytes, b2), r->fits ? "yes" : "no", r->max_concurrency, ctxs,
               (long long)r->most.n_tokens);
    }
    if (pl->gpu_planned) {
        const hr_cuda_arena_plan *g = &pl->gpu;
        fmt_name(c, fname, sizeof fname);
        printf("\nGPU arena: what serve --device cuda reserves at start (KV %s; util %.2f x %s = %s)\n", fname, g->util,
               sz(g->total_bytes, b1), sz(g->budget_bytes, b2));
        printf("  weights as uploaded                           %11s\n", sz(g->weight_bytes, b1));
        printf("  forward scratch (%d batch tokens, ctx %d)  %11s\n", p->max_batch_tokens, p->n_ctx,
               sz(g->scratch_bytes, b1));
        if (pl->gpu_ok) {
            printf("  KV pool: %d blocks of %s, %lld tokens      %11s\n", g->n_blocks, sz(g->block_bytes, b2),
                   (long long)g->n_blocks * p->block_size, sz(g->kv_bytes, b1));
            printf("  arena                                         %11s: %d sequences of context %d\n",
                   sz(g->arena_bytes, b1), g->n_blocks / HR_MAX(1, (p->n_ctx + p->block_size - 1) / p->block_size),
                   p->n_ctx);
        } else {
            printf("  does not fit: %s\n", pl->gpu_why);
        }
        if (m->gpu_refused[0]) printf("  but serve --device cuda refuses this model today: %s\n", m->gpu_refused);
    }
    if (pl->decode_tok_s > 0)
        printf("\ndecode roofline (%s): a step reads the weights and every sequence's KV: %.2f ms, %.0f tokens/s "
               "over %d sequences\n",
               hr_rt_kv_format_name(c->k_format), pl->step_s * 1e3, pl->decode_tok_s, p->concurrency);
}

static json_t *budget_json(const hr_kv_budget *b) {
    return json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:i}", "weight_bytes", (json_int_t)b->weight_bytes, "kv_bytes",
                     (json_int_t)b->budget_bytes, "scratch_bytes", (json_int_t)b->scratch_bytes, "meta_bytes",
                     (json_int_t)b->meta_bytes, "overhead_bytes", (json_int_t)b->base_bytes, "total_bytes",
                     (json_int_t)b->total_bytes, "kv_tokens", (json_int_t)b->n_tokens, "kv_blocks",
                     (json_int_t)b->n_blocks, "seqs_at_ctx", b->n_seqs_at_ctx);
}

static json_t *plan_json(const plan_opts *o, const hr_plan_model *m, const hr_plan_device *d, const hr_plan *pl) {
    const hr_hparams *hp = &m->hp;
    const hr_plan_params *p = &pl->p;
    json_t *rows = json_array();
    for (int i = 0; i < m->n_rows; i++)
        json_array_append_new(rows, json_pack("{s:s,s:i,s:I,s:I}", "type", m->rows[i].type, "tensors",
                                              m->rows[i].n_tensors, "elements", (json_int_t)m->rows[i].n_elements,
                                              "bytes", (json_int_t)m->rows[i].bytes));
    json_t *formats = json_array();
    for (int f = 0; f < HR_RT_KV_FORMAT_COUNT; f++) {
        const hr_plan_format_row *r = &pl->rows[f];
        char fname[32];
        fmt_name(r, fname, sizeof fname);
        json_t *fo = json_pack("{s:s,s:b}", "format", fname, "usable", r->usable);
        if (r->usable) {
            json_object_set_new(fo, "token_bytes", json_integer((json_int_t)r->token_bytes));
            json_object_set_new(fo, "fits", json_boolean(r->fits));
            json_object_set_new(fo, "need", budget_json(&r->need));
            json_object_set_new(fo, "most", budget_json(&r->most));
            json_object_set_new(fo, "max_concurrency", json_integer(r->max_concurrency));
            json_object_set_new(fo, "max_ctx", r->max_ctx == INT64_MAX ? json_null() : json_integer(r->max_ctx));
        }
        json_array_append_new(formats, fo);
    }
    const hr_plan_format_row *c = &pl->rows[pl->chosen];
    char fname[32];
    fmt_name(c, fname, sizeof fname);
    json_t *root = json_pack(
        "{s:{s:s,s:s,s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:b,s:i},"
        "s:{s:s,s:b,s:I,s:f,s:I,s:f,s:b,s:I},"
        "s:{s:i,s:i,s:i,s:i,s:i,s:i},"
        "s:{s:o,s:I,s:I,s:I,s:s},"
        "s:{s:s,s:I,s:I,s:i,s:i,s:i},"
        "s:o,s:b,s:o,s:{s:f,s:f}}",
        "model", "path", o->model, "arch", hp->arch_name, "source", m->from_config ? "config.json" : "gguf", "n_layer",
        hp->n_layer, "n_head", hp->n_head, "n_head_kv", hp->n_head_kv, "head_dim", hp->head_dim, "n_embd", hp->n_embd,
        "n_ff", hp->n_ff, "n_vocab", hp->n_vocab, "tied_output", hp->tied_output, "sliding_window", hp->sliding_window,
        "device", "name", d->name, "gpu", d->gpu, "mem_bytes", (json_int_t)d->mem_bytes, "util", d->util,
        "usable_bytes", (json_int_t)pl->usable_bytes, "bw_gbps", d->bw_gbps, "bw_measured", d->bw_measured,
        "reserved_bytes", (json_int_t)d->reserved_bytes, "params", "ctx", p->n_ctx, "concurrency", p->concurrency,
        "block_size", p->block_size, "max_batch_tokens", p->max_batch_tokens, "max_running", p->max_running, "threads",
        p->n_threads, "weights", "rows", rows, "tensor_bytes", (json_int_t)m->tensor_bytes, "file_bytes",
        (json_int_t)m->file_bytes, "resident_bytes", (json_int_t)m->resident_bytes, "weight_type", m->weight_type, "kv",
        "format", fname, "token_bytes", (json_int_t)c->token_bytes, "layer_token_bytes",
        (json_int_t)pl->layer_token_bytes, "full_layers", pl->n_full_layers, "window_layers", pl->n_window_layers,
        "held_ctx", pl->held_ctx, "budget", budget_json(&c->need), "fits", c->fits, "formats", formats, "roofline",
        "step_s", pl->step_s, "decode_tok_s", pl->decode_tok_s);
    /* the pool's layer groups (kv.h): per kind, bytes per token and one sequence at the context */
    json_t *kinds = json_array();
    for (int k = 0; k < pl->groups.n_kinds; k++)
        json_array_append_new(kinds, json_pack("{s:s,s:i,s:i,s:i,s:I,s:I}", "kind",
                                               pl->groups.kinds[k].window > 0 ? "window"
                                               : pl->groups.kinds[k].latent   ? "latent"
                                                                              : "full",
                                               "window", pl->groups.kinds[k].window, "layers",
                                               pl->groups.kinds[k].n_layers, "groups", pl->groups.kinds[k].n_groups,
                                               "token_bytes", (json_int_t)pl->kind_token_bytes[k], "seq_bytes",
                                               (json_int_t)pl->kind_seq_bytes[k]));
    if (pl->gpu_planned) {
        const hr_cuda_arena_plan *g = &pl->gpu;
        json_object_set_new(
            root, "gpu_arena",
            json_pack("{s:b,s:f,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:i,s:I,s:s}", "fits", pl->gpu_ok, "util", g->util,
                      "total_bytes", (json_int_t)g->total_bytes, "budget_bytes", (json_int_t)g->budget_bytes,
                      "weight_bytes", (json_int_t)g->weight_bytes, "scratch_bytes", (json_int_t)g->scratch_bytes,
                      "kv_bytes", (json_int_t)g->kv_bytes, "arena_bytes", (json_int_t)g->arena_bytes, "block_bytes",
                      (json_int_t)g->block_bytes, "kv_blocks", g->n_blocks, "kv_tokens",
                      (json_int_t)((int64_t)g->n_blocks * p->block_size), "error", pl->gpu_ok ? "" : pl->gpu_why));
        /* "" where serve --device cuda takes the model; else the line it refuses it with */
        json_object_set_new(json_object_get(root, "gpu_arena"), "refused", json_string(m->gpu_refused));
    }
    json_t *kv = json_object_get(root, "kv");
    if (kv) {
        json_object_set_new(kv, "layer_groups", json_integer(pl->groups.n_groups));
        json_object_set_new(kv, "group_slots", json_integer(pl->groups.slots));
        json_object_set_new(kv, "seq_bytes", json_integer((json_int_t)pl->seq_bytes));
        json_object_set_new(kv, "groups", kinds);
    } else {
        json_decref(kinds);
    }
    return root;
}

static int print_json(json_t *root) {
    if (!root) {
        fprintf(stderr, "headroom plan: out of memory building JSON\n");
        return HR_EXIT_FAIL;
    }
    char *s = json_dumps(root, JSON_INDENT(2));
    json_decref(root);
    if (!s) return HR_EXIT_FAIL;
    printf("%s\n", s);
    free(s);
    return HR_EXIT_OK;
}

/* ---- traffic simulation ------------------------------------------------------------------------- */

static int calibrate(const plan_opts *o) {
    hr_cost_model c;
    hr_error err;
    hr_status st = hr_cost_calibrate(o->weight_type ? o->weight_type : "q4_0", o->p.n_threads, &c, &err);
    if (st == HR_OK) st = hr_cost_save(&c, o->calibrate_file, &err);
    if (st) {
        fprintf(stderr, "headroom plan: --calibrate: %s\n", err.msg);
        return HR_EXIT_FAIL;
    }
    printf("%s\nsaved to %s (use it with --traffic ... --cost %s)\n", c.source, o->calibrate_file, o->calibrate_file);
    return HR_EXIT_OK;
}

static const char *cand_policy(const hr_sim_candidate *c, char *buf, size_t n) {
    if (c->window > 0)
        snprintf(buf, n, "window:%d", c->window);
    else
        snprintf(buf, n, "full");
    return buf;
}

static json_t *sim_row_json(const hr_sim_row *row) {
    const hr_sim_result *r = &row->r;
    char pol[32];
    json_t *o = json_pack("{s:s,s:s,s:s,s:i,s:b}", "kv_type", hr_rt_kv_format_name(r->c.format), "policy",
                          cand_policy(&r->c, pol, sizeof pol), "admission", hr_rt_admission_name(r->c.admission),
                          "max_running", r->c.max_running, "ran", row->ran);
    if (row->ran) {
        json_t *x =
            json_pack("{s:i,s:i,s:i,s:I,s:i,s:I,s:I,s:f,s:f,s:f,s:f,s:f,s:f,s:b}", "pool_blocks", r->n_blocks,
                      "completed", r->completed, "refused", r->refused, "preemptions", (json_int_t)r->preemptions,
                      "peak_blocks", r->peak_blocks, "peak_kv_bytes", (json_int_t)r->peak_kv_bytes, "output_tokens",
                      (json_int_t)r->output_tokens, "makespan_s", r->makespan_s, "throughput_tok_s",
                      r->throughput_tok_s, "ttft_p50_s", r->ttft_p50, "ttft_p99_s", r->ttft_p99, "itl_p50_s",
                      r->itl_p50, "itl_p99_s", r->itl_p99, "meets", row->meets);
        json_object_update(o, x);
        json_decref(x);
        json_object_set_new(o, "ppl_increase_pct", row->ppl_known ? json_real(row->ppl_increase_pct) : json_null());
    }
    if (!row->meets) json_object_set_new(o, "why", json_string(row->why));
    return o;
}

static void print_sim_row(const hr_sim_row *row, bool best) {
    const hr_sim_result *r = &row->r;
    char pol[32], kv[32];
    if (!row->ran) {
        printf("  %-6s %-12s %-10s %4d  (%s)\n", hr_rt_kv_format_name(r->c.format), cand_policy(&r->c, pol, sizeof pol),
               hr_rt_admission_name(r->c.admission), r->c.max_running, row->why);
        return;
    }
    char ppl[16] = "-";
    if (row->ppl_known) snprintf(ppl, sizeof ppl, "%+.2f%%", row->ppl_increase_pct);
    printf("%s %-6s %-12s %-10s %4d %7d %9.1f %8.3f %8.3f %7.1f %7.1f %10s %6llu %5d %8s  %s\n", best ? "*" : " ",
           hr_rt_kv_format_name(r->c.format), cand_policy(&r->c, pol, sizeof pol), hr_rt_admission_name(r->c.admission),
           r->c.max_running, r->n_blocks, r->throughput_tok_s, r->ttft_p50, r->ttft_p99, r->itl_p50 * 1e3,
           r->itl_p99 * 1e3, hr_format_size(r->peak_kv_bytes, kv, sizeof kv), (unsigned long long)r->preemptions,
           r->refused, ppl, row->meets ? "meets" : row->why);
}

static hr_status open_traffic(const plan_opts *o, const hr_plan *pl, hr_traffic *t, hr_error *err) {
    FILE *f = fopen(o->traffic, "r");
    if (f) {
        fclose(f);
        return hr_traffic_load(o->traffic, pl->p.n_ctx, t, err);
    }
    return hr_traffic_preset(o->traffic, o->n_requests, pl->p.n_ctx, o->seed ? o->seed : 1, t, err);
}

static int run_traffic(const plan_opts *o, const hr_plan_model *m, const hr_plan_device *d, const hr_plan *pl,
                       json_t *root) {
    hr_error err;
    hr_traffic t;
    hr_status st = open_traffic(o, pl, &t, &err);
    if (st) {
        fprintf(stderr, "headroom plan: --traffic: %s\n", err.msg);
        return st == HR_ERR_INVALID_ARG ? HR_EXIT_USAGE : HR_EXIT_FAIL;
    }
    hr_cost_model cost;
    if (o->cost_file)
        st = hr_cost_load(o->cost_file, &cost, &err);
    else if (d->gpu || o->device_bw > 0)
        hr_cost_roofline(d, &cost);
    else /* this machine without a saved calibration: measure now (a few seconds) */
        st = hr_cost_calibrate(m->from_config ? m->weight_type : "q4_0", pl->p.n_threads, &cost, &err);
    if (st) {
        fprintf(stderr, "headroom plan: %s\n", HR_CLI_ERROR(&err));
        hr_traffic_free(&t);
        return HR_EXIT_FAIL;
    }
    hr_rt_kv_format formats[] = {HR_RT_KV_F16, HR_RT_KV_Q8, HR_RT_KV_FP8, HR_RT_KV_Q4, HR_RT_KV_Q4H, HR_RT_KV_KIVI2};
    int window = HR_MAX(pl->p.block_size, pl->p.n_ctx / 4 / pl->p.block_size * pl->p.block_size);
    int windows[] = {0, window};
    hr_rt_admission adm[] = {HR_RT_ADMIT_ADAPTIVE, HR_RT_ADMIT_RESERVE, HR_RT_ADMIT_OPTIMISTIC};
    int runs_default[] = {pl->p.max_running};
    hr_sim_sweep_params sp = {.formats = formats,
                              .n_formats = 6,
                              .windows = windows,
                              .n_windows = 2,
                              .admissions = adm,
                              .n_admissions = 3,
                              .max_running = o->n_run_list ? o->run_list : runs_default,
                              .n_max_running = o->n_run_list ? o->n_run_list : 1,
                              .slo_ttft_s = o->slo_ttft,
                              .slo_itl_s = o->slo_itl,
                              .eval_path = o->eval_file,
                              .max_ppl_increase_pct = o->max_ppl};
    hr_sim_row *rows = NULL;
    int n = 0, best = -1;
    st = hr_sim_sweep(m, pl, d, &cost, &t, &sp, &rows, &n, &best, &err);
    if (st) {
        fprintf(stderr, "headroom plan: simulation: %s\n", err.msg);
        hr_traffic_free(&t);
        return st == HR_ERR_FORMAT ? HR_EXIT_USAGE : HR_EXIT_FAIL;
    }
    double span = t.n ? t.reqs[t.n - 1].t_arrival - t.reqs[0].t_arrival : 0;
    if (root) {
        json_t *cands = json_array();
        for (int i = 0; i < n; i++) json_array_append_new(cands, sim_row_json(&rows[i]));
        json_t *tr =
            json_pack("{s:s,s:i,s:f,s:s,s:f,s:f,s:o,s:o}", "name", t.name, "requests", t.n, "arrival_span_s", span,
                      "cost_model", cost.source, "slo_ttft_s", (double)o->slo_ttft, "slo_itl_s", (double)o->slo_itl,
                      "candidates", cands, "recommended", best >= 0 ? sim_row_json(&rows[best]) : json_null());
        json_object_set_new(root, "traffic", tr);
    } else {
        printf("\ntraffic %s: %d requests arriving over %.1f s; step costs: %s\n", t.name, t.n, span, cost.source);
        printf("  format policy       admission  run  blocks     tok/s  TTFT p50  p99 (s)  ITL p50  p99 (ms)   peak KV "
               "preempt refused  ppl\n");
        for (int i = 0; i < n; i++) print_sim_row(&rows[i], i == best);
        if (best >= 0) {
            const hr_sim_result *r = &rows[best].r;
            char pol[32];
            printf(
                "\nrecommended: --kv-type %s --kv-policy %s --admission %s --max-running %d: %.1f tokens/s, TTFT p99 "
                "%.3f s, ITL p99 %.1f ms\n",
                hr_rt_kv_format_name(r->c.format), cand_policy(&r->c, pol, sizeof pol),
                hr_rt_admission_name(r->c.admission), r->c.max_running, r->throughput_tok_s, r->ttft_p99,
                r->itl_p99 * 1e3);
        } else {
            printf("\nno candidate meets every bound (the last column says why for each)\n");
        }
    }
    free(rows);
    hr_traffic_free(&t);
    return best >= 0 ? HR_EXIT_OK : HR_EXIT_FAIL;
}

static hr_status open_device(const plan_opts *o, hr_plan_device *d, hr_error *err) {
    hr_status st;
    int ordinal = -1;
    if (o->device && !strncmp(o->device, "cuda", 4)) { /* this machine's GPU, as serve --device will see it */
        if (hr_rt_device_parse(o->device, &ordinal, NULL) || ordinal < 0)
            return hr_error_set(err, HR_ERR_NOT_FOUND, /* a usage error */
                                "unknown device '%s' (cuda or cuda:N: this machine's GPU; --help lists the others)",
                                o->device);
        st = hr_plan_device_cuda(ordinal, getenv("HEADROOM_CUDA_DRIVER"), d, err);
    } else if (o->device && strcasecmp(o->device, "host"))
        st = hr_plan_device_by_name(o->device, d, err);
    else
        st = hr_plan_device_host(o->device_bw <= 0, d, err);
    if (st) return st;
    if (o->device_mem) {
        d->mem_bytes = o->device_mem;
        d->source = "--device-mem";
        if (!o->device) snprintf(d->name, sizeof d->name, "by hand");
    }
    if (o->device_bw > 0) {
        d->bw_gbps = o->device_bw;
        d->bw_measured = false;
    }
    if (o->util > 0) d->util = o->util;
    return HR_OK;
}

int hr_cmd_plan(int argc, char **argv) {
    plan_opts o = {0};
    bool help = false;
    if (!parse(argc, argv, &o, &help)) return HR_EXIT_USAGE;
    if (help) {
        hr_opts_print_help(HR_CMD_PLAN, stdout);
        return HR_EXIT_OK;
    }
    hr_error err = {0};
    if (o.calibrate_file) return calibrate(&o);
    hr_plan_device dev;
    hr_status st = open_device(&o, &dev, &err);
    if (st) {
        fprintf(stderr, "headroom plan: %s\n", HR_CLI_ERROR(&err));
        return st == HR_ERR_NOT_FOUND ? HR_EXIT_USAGE : HR_EXIT_FAIL;
    }
    hr_plan_model m;
    if ((st = hr_plan_model_open(o.model, o.weight_type, &m, &err))) {
        fprintf(stderr, "headroom plan: %s\n", HR_CLI_ERROR(&err));
        return st == HR_ERR_INVALID_ARG ? HR_EXIT_USAGE : HR_EXIT_FAIL;
    }
    hr_plan *pl = calloc(1, sizeof *pl);
    if (!pl) return HR_EXIT_FAIL;
    if ((st = hr_plan_compute(&m, &dev, &o.p, pl, &err))) {
        fprintf(stderr, "headroom plan: %s\n", HR_CLI_ERROR(&err));
        free(pl);
        return HR_EXIT_USAGE;
    }
    json_t *root = o.json ? plan_json(&o, &m, &dev, pl) : NULL;
    if (!o.json) print_table(&o, &m, &dev, pl);
    int rc = HR_EXIT_OK;
    if (o.traffic) rc = run_traffic(&o, &m, &dev, pl, root);
    if (o.json) {
        int jrc = print_json(root);
        if (rc == HR_EXIT_OK) rc = jrc;
    }
    const hr_plan_format_row *c = &pl->rows[pl->chosen];
    if (rc == HR_EXIT_OK && !c->fits && !o.traffic) {
        char b1[32], b2[32], fname[32];
        fmt_name(c, fname, sizeof fname);
        if (c->max_concurrency == 0)
            fprintf(stderr,
                    "headroom plan: %s usable cannot hold one sequence of context %d at %s (it needs %s): the "
                    "largest context that fits is %lld; or pick a smaller KV format from the table\n",
                    sz(pl->usable_bytes, b1), pl->p.n_ctx, fname, sz(c->need.total_bytes, b2),
                    (long long)c->most.n_tokens);
        else
            fprintf(stderr,
                    "headroom plan: %d sequences of context %d at %s need %s, over %s usable: %d fit at that "
                    "context, or context %lld at concurrency %d\n",
                    pl->p.concurrency, pl->p.n_ctx, fname, sz(c->need.total_bytes, b1), sz(pl->usable_bytes, b2),
                    c->max_concurrency, (long long)c->max_ctx, pl->p.concurrency);
        rc = HR_EXIT_FAIL;
    }
    free(pl);
    return rc;
}

/* sweep.c: every candidate configuration through the simulator, each checked against the SLOs and a
 * quality bound read from a `headroom eval --json` result, and the best that meets them all. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "plan/plan.h"

/* The eval result's perplexity change for this format and policy ("full" or "window:W"). */
static bool eval_lookup(json_t *eval, hr_rt_kv_format f, int window, double *pct) {
    json_t *res = json_object_get(eval, "results");
    char pol[32];
    if (window > 0)
        snprintf(pol, sizeof pol, "window:%d", window);
    else
        snprintf(pol, sizeof pol, "full");
    for (size_t i = 0; i < json_array_size(res); i++) {
        json_t *o = json_array_get(res, i);
        const char *k = json_string_value(json_object_get(o, "kv_type_k"));
        const char *v = json_string_value(json_object_get(o, "kv_type_v"));
        const char *p = json_string_value(json_object_get(o, "policy"));
        json_t *c = json_object_get(o, "perplexity_change_pct");
        if (k && v && p && json_is_number(c) && !strcmp(k, hr_rt_kv_format_name(f)) && !strcmp(v, k) &&
            !strcmp(p, pol)) {
            *pct = json_number_value(c);
            return true;
        }
    }
    return false;
}

/* How lossy a candidate is: its measured perplexity change when the eval result has it, else the
 * formats' order by bits (f16, q8, fp8, q4h, q4, kivi2), a window after full attention. */
static double loss_rank(const hr_sim_row *row) {
    if (row->ppl_known) return row->ppl_increase_pct;
    static const int order[HR_RT_KV_FORMAT_COUNT] = {
        [HR_RT_KV_F32] = 0, [HR_RT_KV_F16] = 1, [HR_RT_KV_BF16] = 2, [HR_RT_KV_Q8] = 3,
        [HR_RT_KV_FP8] = 4, [HR_RT_KV_Q4H] = 5, [HR_RT_KV_Q4] = 6,   [HR_RT_KV_KIVI2] = 7};
    return 1000.0 + order[row->r.c.format] * 10 + (row->r.c.window > 0);
}

static void judge(const hr_sim_sweep_params *sp, const hr_traffic *t, hr_sim_row *row) {
    const hr_sim_result *r = &row->r;
    row->meets = false;
    if (r->completed < t->n)
        snprintf(row->why, sizeof row->why, "%d of %d requests refused", t->n - r->completed, t->n);
    else if (sp->slo_ttft_s > 0 && r->ttft_p99 > sp->slo_ttft_s)
        snprintf(row->why, sizeof row->why, "TTFT p99 %.3g s > %.3g s", r->ttft_p99, sp->slo_ttft_s);
    else if (sp->slo_itl_s > 0 && r->itl_p99 > sp->slo_itl_s)
        snprintf(row->why, sizeof row->why, "ITL p99 %.3g s > %.3g s", r->itl_p99, sp->slo_itl_s);
    else if (sp->eval_path && !row->ppl_known)
        snprintf(row->why, sizeof row->why, "no perplexity figure in the eval result");
    else if (sp->eval_path && row->ppl_increase_pct > sp->max_ppl_increase_pct)
        snprintf(row->why, sizeof row->why, "perplexity +%.2f%% > %.2f%%", row->ppl_increase_pct,
                 sp->max_ppl_increase_pct);
    else
        row->meets = true;
}

hr_status hr_sim_sweep(const hr_plan_model *m, const hr_plan *pl, const hr_plan_device *d, const hr_cost_model *cost,
                       const hr_traffic *t, const hr_sim_sweep_params *sp, hr_sim_row **rows_out, int *n_rows,
                       int *best, hr_error *err) {
    *rows_out = NULL;
    *n_rows = 0;
    *best = -1;
    json_t *eval = NULL;
    if (sp->eval_path) {
        json_error_t je;
        eval = json_load_file(sp->eval_path, 0, &je);
        if (!json_is_object(eval) || !json_is_array(json_object_get(eval, "results"))) {
            json_decref(eval);
            return hr_error_set(err, HR_ERR_FORMAT,
                                "--eval '%s' is not a `headroom eval --json` result (an object with \"results\")",
                                sp->eval_path);
        }
    }
    int n = sp->n_formats * sp->n_windows * sp->n_admissions * sp->n_max_running;
    hr_sim_row *rows = calloc((size_t)HR_MAX(1, n), sizeof *rows);
    if (!rows) {
        json_decref(eval);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    }
    hr_status st = HR_OK;
    int k = 0;
    for (int f = 0; f < sp->n_formats && st == HR_OK; f++)
        for (int w = 0; w < sp->n_windows && st == HR_OK; w++)
            for (int a = 0; a < sp->n_admissions && st == HR_OK; a++)
                for (int r = 0; r < sp->n_max_running && st == HR_OK; r++) {
                    hr_sim_row *row = &rows[k++];
                    hr_sim_candidate c = {.format = sp->formats[f],
                                          .window = sp->windows[w],
                                          .admission = sp->admissions[a],
                                          .max_running = sp->max_running[r]};
                    hr_error e;
                    hr_status rs = hr_sim_run(m, pl, d, cost, t, &c, &row->r, &e);
                    row->r.c = c;
                    if (rs == HR_ERR_INVALID_ARG) {
                        snprintf(row->why, sizeof row->why, "the format cannot hold this shape");
                        continue;
                    }
                    if (rs) {
                        st = hr_error_set(err, rs, "%s", e.msg);
                        break;
                    }
                    row->ran = true;
                    row->ppl_known = eval && eval_lookup(eval, c.format, c.window, &row->ppl_increase_pct);
                    judge(sp, t, row);
                }
    /* the best: the highest throughput, but among candidates within 2% of it (the offered load caps
     * throughput, so many tie) the least lossy one, then the lowest TTFT p99 */
    double top = 0;
    for (int i = 0; i < k; i++)
        if (rows[i].meets) top = HR_MAX(top, rows[i].r.throughput_tok_s);
    for (int i = 0; i < k; i++) {
        if (!rows[i].meets || rows[i].r.throughput_tok_s < 0.98 * top) continue;
        const hr_sim_row *b = *best >= 0 ? &rows[*best] : NULL;
        double li = loss_rank(&rows[i]), lb = b ? loss_rank(b) : 0;
        if (!b || li < lb || (li == lb && rows[i].r.ttft_p99 < b->r.ttft_p99)) *best = i;
    }
    json_decref(eval);
    if (st) {
        free(rows);
        *best = -1;
        return st;
    }
    *rows_out = rows;
    *n_rows = k;
    return HR_OK;
}

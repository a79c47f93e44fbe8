/* session.c: see session.h. The model, tokenizer, KV pool and forward context are opened here; every
 * generation goes through the runtime's engine, on this thread, one hr_runtime_step at a time. */
#include "cli/session.h"

#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/errors.h"
#include "common/util.h"

struct hr_session {
    hr_session_opts o;
    hr_runtime *rt;
    char warning[1024]; /* startup warnings for the CLI to print, '\n'-separated ("" when none) */
};

hr_session_opts hr_session_default_opts(void) {
    return (hr_session_opts){.rt = hr_runtime_default_params(), .sampling = hr_rt_sampling_default()};
}

hr_runtime_params hr_session_runtime_params(const hr_session_opts *o, int kv_seqs) {
    hr_runtime_params p = o->rt;
    p.kv_seqs = kv_seqs;
    p.prefault = true;
    return p;
}

hr_status hr_session_open(const hr_session_opts *o, hr_session **out, bool *bad_option, hr_error *err) {
    if (bad_option) *bad_option = false;
    hr_status st = hr_rt_sampling_check(&o->sampling, err);
    if (st) {
        if (bad_option) *bad_option = true;
        return st;
    }
    hr_session *s = calloc(1, sizeof *s);
    if (!s) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    s->o = *o;
    /* the default budget holds one context per prompt that can run at once */
    hr_runtime_params p = hr_session_runtime_params(o, HR_MAX(1, HR_MIN(o->n_prompts_hint, o->rt.max_running)));
    if ((st = hr_runtime_open(&p, &s->rt, bad_option, err))) {
        free(s);
        return st;
    }
    hr_rt_sampling builtin = hr_session_default_opts().sampling; /* generation_config.json where no flag set */
    hr_runtime_generation_defaults(s->rt, &builtin, &s->o.sampling);
    /* the runtime's warnings, after the chat template's in chat mode (one per line) */
    const char *chat = o->chat ? hr_runtime_chat_warning(s->rt) : "", *rtw = hr_runtime_warnings(s->rt);
    snprintf(s->warning, sizeof s->warning, "%s%s%s", chat, chat[0] && rtw[0] ? "\n" : "", rtw);
    *out = s;
    return HR_OK;
}

void hr_session_close(hr_session *s) {
    if (!s) return;
    hr_runtime_close(s->rt);
    free(s);
}

hr_runtime *hr_session_runtime(hr_session *s) { return s->rt; }
const hr_session_opts *hr_session_options(const hr_session *s) { return &s->o; }
const char *hr_session_warning(const hr_session *s) { return s->warning; }
int hr_session_n_ctx(const hr_session *s) { return hr_runtime_n_ctx(s->rt); }

/* ---- generation through the engine --------------------------------------------------------------- */

/* Submits prompt i (as a chat turn in chat mode); on refusal records the reason in g. The runtime
 * tokenizes, checks the context and clamps -n to it. */
static void submit_one(hr_session *s, int i, const char *prompt, hr_generation *g, hr_rt_request **h) {
    hr_error e = {0};
    *h = NULL;
    g->seed = hr_prompt_seed(s->o.sampling.seed, i);
    hr_rt_request_params p = {.max_tokens = s->o.n_predict,
                              .sampling = s->o.sampling,
                              .ignore_eos = s->o.ignore_eos,
                              .no_bos = s->o.no_bos,
                              .stop = (const char *const *)s->o.stop,
                              .n_stop = s->o.n_stop};
    p.sampling.seed = g->seed;
    hr_rt_chat_msg msgs[2];
    size_t n = 0;
    if (s->o.chat) {
        if (s->o.system) msgs[n++] = (hr_rt_chat_msg){.role = "system", .content = s->o.system};
        msgs[n++] = (hr_rt_chat_msg){.role = "user", .content = prompt};
        p.messages = msgs;
        p.n_messages = n;
    } else {
        p.prompt = prompt;
    }
    hr_status st = hr_runtime_submit(s->rt, &p, h, &e);
    if (st == HR_OK) {
        int np = 0;
        const int32_t *ids = hr_rt_request_prompt(*h, &np);
        g->prompt_ids = malloc(sizeof(int32_t) * (size_t)(np + 1));
        if (g->prompt_ids) memcpy(g->prompt_ids, ids, sizeof(int32_t) * (size_t)np);
        g->n_prompt = g->prompt_ids ? np : 0;
        g->max_tokens = hr_rt_request_max_tokens(*h);
        g->ctx_limited = hr_rt_request_ctx_limited(*h);
    }
    g->status = st;
    g->finish_reason = st == HR_OK ? "length" : "error";
    if (st != HR_OK) snprintf(g->error, sizeof g->error, "%s", HR_CLI_ERROR(&e));
}

/* Copies a final request's output and figures into g. */
static hr_status collect(hr_rt_request *h, hr_generation *g) {
    hr_rt_result r;
    hr_rt_request_result(h, &r);
    g->stats = r.stats;
    g->ids = malloc(sizeof(int32_t) * (size_t)(r.n_ids + 1));
    g->text = malloc(r.text_len + 1);
    if (!g->ids || !g->text) return HR_ERR_NOMEM;
    memcpy(g->ids, r.ids, sizeof(int32_t) * (size_t)r.n_ids);
    memcpy(g->text, r.text, r.text_len);
    g->text[r.text_len] = '\0';
    g->n_ids = r.n_ids;
    g->text_len = r.text_len;
    g->ledger = r.stats.kv;
    g->kv_bytes_peak = r.kv.bytes_peak;
    double t1 = r.t_first_token > 0 ? r.t_first_token : r.t_finish;
    g->prompt_seconds = t1 - r.t_submit;
    g->gen_seconds = r.t_finish - t1;
    g->finish_reason = r.finish_reason ? r.finish_reason : "error";
    g->limit = r.limit;
    if (r.state != HR_RT_COMPLETED) {
        g->status = r.status ? r.status : HR_ERR_INTERNAL;
        snprintf(g->error, sizeof g->error, "%s", r.error);
    }
    return HR_OK;
}

/* One line before any output when the context cut -n short for some prompt: what it was clamped to,
 * and what to change. */
static void warn_clamped(hr_session *s, const hr_generation *g, int n) {
    int n_clamped = 0, first = -1;
    for (int i = 0; i < n; i++) {
        if (g[i].status == HR_OK && g[i].ctx_limited) {
            if (first < 0) first = i;
            n_clamped++;
        }
    }
    if (!s->o.warn || first < 0) return;
    char who[64] = " ";
    if (n > 1) snprintf(who, sizeof who, " for %d of %d prompts (prompt %d: ", n_clamped, n, first + 1);
    hr_runtime_info info;
    hr_runtime_describe(s->rt, &info);
    int train = info.n_ctx_train;
    int n_ctx = hr_session_n_ctx(s);
    char hint[96];
    if (n_ctx < train)
        snprintf(hint, sizeof hint, "raise --ctx (up to the model's trained context, %d)", train);
    else
        snprintf(hint, sizeof hint, "use --kv-policy window:W to run past the context");
    fprintf(s->o.warn,
            "headroom %s: warning: -n %d is clamped%sto %d tokens by the context (--ctx %d, the prompt takes %d)%s: "
            "%s\n",
            s->o.cmd ? s->o.cmd : "run", s->o.n_predict, who, g[first].max_tokens, n_ctx, g[first].n_prompt,
            n > 1 ? ")" : "", hint);
}

hr_status hr_session_generate_many(hr_session *s, const char *const *prompts, int n, FILE *out, hr_generation *g,
                                   hr_error *err) {
    hr_rt_request **h = calloc((size_t)(n > 0 ? n : 1), sizeof *h);
    if (!h) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    memset(g, 0, sizeof *g * (size_t)n);
    for (int i = 0; i < n; i++) submit_one(s, i, prompts[i], &g[i], &h[i]);
    warn_clamped(s, g, n);
    const char *note = s->o.chat ? hr_runtime_chat_fallback_note(s->rt) : "";
    if (note[0] && s->o.warn) /* the model's template met something the interpreter refuses: say why */
        fprintf(s->o.warn, "headroom %s: warning: the model's chat template fell back to the %s family renderer: %s\n",
                s->o.cmd ? s->o.cmd : "run", hr_runtime_chat_family(s->rt), note);
    bool stream = out && n == 1 && h[0];
    hr_status st = HR_OK;
    for (int pending = 1; pending > 0;) {
        if ((st = hr_runtime_step(s->rt, &pending, err))) break;
        if (stream) {
            char buf[4096];
            hr_rt_delta d;
            do {
                hr_rt_request_read(h[0], NULL, 0, buf, sizeof buf, &d);
                if (d.n_text) fwrite(buf, 1, d.n_text, out);
            } while (d.n_text == sizeof buf - 1);
            fflush(out);
        }
    }
    for (int i = 0; i < n; i++) {
        if (h[i] && st == HR_OK && collect(h[i], &g[i]) != HR_OK)
            st = hr_error_set(err, HR_ERR_NOMEM, "out of memory collecting outputs");
        hr_rt_request_release(s->rt, h[i]);
        if (!g[i].text) g[i].text = calloc(1, 1);
        if (!g[i].ids) g[i].ids = calloc(1, sizeof(int32_t));
    }
    free(h);
    if (st == HR_OK && n == 1 && g[0].status != HR_OK) st = hr_error_set(err, g[0].status, "%s", g[0].error);
    return st;
}

hr_status hr_session_generate(hr_session *s, const char *prompt, FILE *out, hr_generation *g, hr_error *err) {
    const char *p[1] = {prompt};
    hr_status st = hr_session_generate_many(s, p, 1, out, g, err);
    if (st != HR_OK) hr_generation_free(g);
    return st;
}

void hr_generation_free(hr_generation *g) {
    free(g->prompt_ids);
    free(g->ids);
    free(g->text);
    memset(g, 0, sizeof *g);
}

void hr_generation_print_stats(const hr_session *s, const hr_generation *g, FILE *f) {
    hr_runtime_info info;
    hr_runtime_describe(s->rt, &info);
    char kb[32];
    double pps = g->prompt_seconds > 0 ? g->n_prompt / g->prompt_seconds : 0;
    double gps = g->gen_seconds > 0 ? g->n_ids / g->gen_seconds : 0;
    char why[96] = "";
    if (g->limit && !strcmp(g->limit, "context"))
        snprintf(why, sizeof why, " (stopped at the context: %d tokens, --ctx)", hr_session_n_ctx(s));
    else if (g->limit)
        snprintf(why, sizeof why, " (-n %d)", g->max_tokens);
    fprintf(f, "prompt: %d tokens, %.1f tok/s | generation: %d tokens, %.1f tok/s | finish: %s%s\n", g->n_prompt, pps,
            g->n_ids, gps, g->finish_reason, why);
    fprintf(f, "kv cache: %s peak (%d tokens, K %s / V %s, block %d) | kernels %s, %d threads\n",
            hr_format_size(g->kv_bytes_peak, kb, sizeof kb), g->ledger.tokens_total,
            hr_rt_kv_format_name(g->ledger.k_format), hr_rt_kv_format_name(g->ledger.v_format), s->o.rt.block_size,
            info.isa, info.n_threads);
}

json_t *hr_generation_to_json(const hr_session *s, const hr_generation *g) {
    hr_runtime_info info;
    hr_runtime_describe(s->rt, &info);
    json_t *root = json_object();
    json_t *pids = json_array(), *cids = json_array();
    for (int i = 0; i < g->n_prompt; i++) json_array_append_new(pids, json_integer(g->prompt_ids[i]));
    for (int i = 0; i < g->n_ids; i++) json_array_append_new(cids, json_integer(g->ids[i]));
    json_object_set_new(root, "completion", json_stringn(g->text, g->text_len));
    json_object_set_new(root, "finish_reason", json_string(g->finish_reason));
    if (g->limit) json_object_set_new(root, "limit", json_string(g->limit));
    json_object_set_new(root, "max_tokens", json_integer(g->max_tokens));
    json_object_set_new(root, "n_ctx", json_integer(hr_session_n_ctx(s)));
    /* a --seed past 2^63 does not fit a JSON integer: then it is a string of its digits */
    char seed[24];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)g->seed);
    json_object_set_new(root, "seed", g->seed <= INT64_MAX ? json_integer((json_int_t)g->seed) : json_string(seed));
    json_object_set_new(root, "prompt_tokens", json_integer(g->n_prompt));
    json_object_set_new(root, "completion_tokens", json_integer(g->n_ids));
    json_object_set_new(root, "prompt_token_ids", pids);
    json_object_set_new(root, "completion_token_ids", cids);
    json_object_set_new(root, "prompt_tokens_per_second",
                        json_real(g->prompt_seconds > 0 ? g->n_prompt / g->prompt_seconds : 0));
    json_object_set_new(root, "generation_tokens_per_second",
                        json_real(g->gen_seconds > 0 ? g->n_ids / g->gen_seconds : 0));
    json_object_set_new(root, "kv_bytes", json_integer((json_int_t)g->kv_bytes_peak));
    json_object_set_new(root, "kv_type_k", json_string(hr_rt_kv_format_name(g->ledger.k_format)));
    json_object_set_new(root, "kv_type_v", json_string(hr_rt_kv_format_name(g->ledger.v_format)));
    json_object_set_new(root, "model", json_string(info.model));
    json_object_set_new(root, "kernels", json_string(info.isa));
    json_object_set_new(root, "threads", json_integer(info.n_threads));
    json_object_set_new(root, "prefix_hit_tokens", json_integer(g->stats.prefix_hit_tokens));
    json_object_set_new(root, "preemptions", json_integer(g->stats.n_preemptions));
    json_object_set_new(root, "recomputed_tokens", json_integer(g->stats.recomputed_tokens));
    if (g->status != HR_OK) {
        json_object_set_new(root, "error", json_string(g->error));
        json_object_set_new(root, "error_code", json_string(hr_status_name(g->status)));
    }
    return root;
}

json_t *hr_session_engine_json(hr_session *s, double seconds) {
    hr_runtime_pool pool;
    hr_runtime_get_pool(s->rt, &pool);
    const hr_rt_engine_stats st = pool.engine;
    const hr_rt_pool_ledger l = pool.ledger;
    json_t *o = json_object();
    json_object_set_new(o, "seconds", json_real(seconds));
    json_object_set_new(o, "completed", json_integer((json_int_t)st.completed));
    json_object_set_new(o, "failed", json_integer((json_int_t)st.failed));
    json_object_set_new(o, "refused",
                        json_integer((json_int_t)(st.refused_full + st.refused_budget + st.refused_other)));
    json_object_set_new(o, "generated_tokens", json_integer((json_int_t)st.generated_tokens));
    json_object_set_new(o, "generation_tokens_per_second", json_real(seconds > 0 ? st.generated_tokens / seconds : 0));
    json_object_set_new(o, "requests_per_minute", json_real(seconds > 0 ? st.completed * 60.0 / seconds : 0));
    json_object_set_new(o, "steps", json_integer((json_int_t)st.steps));
    json_object_set_new(o, "batch_tokens", json_integer((json_int_t)st.batch_tokens));
    json_object_set_new(o, "prefill_tokens", json_integer((json_int_t)st.prefill_tokens));
    json_object_set_new(o, "peak_running", json_integer(st.peak_running));
    json_object_set_new(o, "preemptions", json_integer((json_int_t)st.preemptions));
    json_object_set_new(o, "recomputed_tokens", json_integer((json_int_t)st.recomputed_tokens));
    json_object_set_new(o, "preempt_swap", json_integer((json_int_t)st.preempt_swap));
    json_object_set_new(o, "swapped_bytes", json_integer((json_int_t)st.swapped_bytes));
    json_object_set_new(o, "prefix_hit_tokens", json_integer((json_int_t)st.prefix_hit_tokens));
    json_object_set_new(o, "predicted_output", json_integer(st.predicted_output));
    json_object_set_new(o, "forward_seconds", json_real(st.forward_seconds));
    json_object_set_new(o, "decode_steps", json_integer((json_int_t)st.decode_steps));
    json_object_set_new(o, "argmax_steps", json_integer((json_int_t)st.argmax_steps));
    json_object_set_new(o, "sample_seconds", json_real(st.sample_seconds));
    json_object_set_new(o, "threaded_sample_steps", json_integer((json_int_t)st.threaded_sample_steps));
    json_object_set_new(o, "decode_tokens", json_integer((json_int_t)st.decode_tokens));
    json_object_set_new(o, "decode_seconds", json_real(st.decode_seconds));
    json_object_set_new(o, "decode_tokens_per_second",
                        json_real(st.decode_seconds > 0 ? st.decode_tokens / st.decode_seconds : 0));
    json_object_set_new(o, "admission", json_string(hr_rt_admission_name(s->o.rt.admission)));
    json_object_set_new(o, "preempt", json_string(hr_rt_preempt_name(s->o.rt.preempt)));
    json_object_set_new(o, "kv_layout", json_string(hr_rt_layout_name(s->o.rt.layout)));
    json_object_set_new(o, "kv_pool_bytes", json_integer((json_int_t)l.bytes_total));
    json_object_set_new(o, "kv_pool_blocks", json_integer(l.blocks_total));
    return o;
}

void hr_session_print_engine_stats(hr_session *s, const hr_generation *g, int n, double seconds, FILE *f) {
    hr_runtime_pool pool;
    hr_runtime_get_pool(s->rt, &pool);
    const hr_rt_engine_stats st = pool.engine;
    hr_runtime_info info;
    hr_runtime_describe(s->rt, &info);
    int ok = 0;
    uint64_t peak = 0;
    for (int i = 0; i < n; i++) {
        ok += g[i].status == HR_OK;
        peak = HR_MAX(peak, g[i].kv_bytes_peak);
    }
    char kb[32];
    fprintf(f,
            "%d prompts: %d completed in %.2f s | %llu tokens generated, %.1f tok/s aggregate | %llu steps, "
            "peak %d running\n",
            n, ok, seconds, (unsigned long long)st.generated_tokens, seconds > 0 ? st.generated_tokens / seconds : 0,
            (unsigned long long)st.steps, st.peak_running);
    fprintf(f,
            "engine: admission %s, preempt %s, layout %s | %llu preemptions, %llu recomputed tokens, %llu "
            "prefix-hit tokens | kv cache: %s peak per sequence | kernels %s, %d threads\n",
            hr_rt_admission_name(s->o.rt.admission), hr_rt_preempt_name(s->o.rt.preempt),
            hr_rt_layout_name(s->o.rt.layout), (unsigned long long)st.preemptions,
            (unsigned long long)st.recomputed_tokens, (unsigned long long)st.prefix_hit_tokens,
            hr_format_size(peak, kb, sizeof kb), info.isa, info.n_threads);
}

void hr_session_print_ledger(hr_session *s, FILE *f) {
    hr_runtime_pool pool;
    hr_runtime_get_pool(s->rt, &pool);
    const hr_rt_pool_ledger l = pool.ledger;
    char a[32], b[32], c[32], d[32];
    fprintf(f, "kv pool: %d blocks (%s): used %d, cached %d (%s), free %d (%s), waste %llu slots (%s)\n",
            l.blocks_total, hr_format_size(l.bytes_total, a, sizeof a), l.blocks_used, l.blocks_cached,
            hr_format_size(l.bytes_cached, b, sizeof b), l.blocks_free, hr_format_size(l.bytes_free, c, sizeof c),
            (unsigned long long)l.waste_slots, hr_format_size(l.waste_bytes, d, sizeof d));
}

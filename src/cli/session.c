/* session.c: see session.h. The model, tokenizer, KV pool and forward context are opened here; every
 * generation goes through the engine (src/engine), on this thread, one hr_engine_step at a time. */
#include "cli/session.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "common/util.h"
#include "model/synth.h"
#include "tokenizer/chat.h"

struct hr_session {
    hr_session_opts o;
    void *demo_file; /* the in-memory demo GGUF (borrowed by the model's reader) */
    hr_model *model;
    hr_tokenizer *tok;
    hr_kv_pool *kv;
    hr_kv_swap *swap;
    hr_model_ctx *ctx;
    hr_engine *engine;
    int n_ctx;
    hr_chat_template chat_tpl; /* chat mode: the template prompts are rendered with */
    bool has_policy;           /* --kv-policy given: every request carries it */
    hr_kv_policy policy;
    char warning[1024]; /* startup warnings for the CLI to print, '\n'-separated ("" when none) */
};

/* Appends one line to the startup warnings (dropped when the buffer is full). */
__attribute__((format(printf, 2, 3))) static void add_warning(hr_session *s, const char *fmt, ...) {
    size_t n = strlen(s->warning);
    if (n && n + 1 < sizeof s->warning) s->warning[n++] = '\n';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->warning + n, sizeof s->warning - n, fmt, ap);
    va_end(ap);
}

hr_session_opts hr_session_default_opts(void) {
    hr_session_opts o = {0};
    o.k_format = o.v_format = HR_KV_F16;
    o.block_size = 16;
    o.n_batch = 512;
    o.max_running = 64;
    o.admission = HR_ADMIT_ADAPTIVE;
    o.preempt = HR_PREEMPT_AUTO;
    o.layout = HR_LAYOUT_PAGED;
    o.n_predict = 128;
    o.sampling = hr_sampler_default_params();
    o.sampling.temperature = 0.8f;
    return o;
}

bool hr_session_parse_common(hr_session_opts *o, const char *cmd, int argc, char **argv, int *i, const char **value) {
    const char *a = argv[*i];
#define IS(x) (!strcmp(a, x))
    if (IS("--mmap") || IS("--ctx-extend")) { /* the flags here without a value */
        if (IS("--mmap")) o->mmap_weights = true;
        if (IS("--ctx-extend")) o->ctx_extend = true;
        *value = a;
        return true;
    }
    bool known = IS("-m") || IS("--model") || IS("-c") || IS("--ctx") || IS("--kv-budget") || IS("--kv-type") ||
                 IS("--kv-type-k") || IS("--kv-type-v") || IS("--block-size") || IS("-b") || IS("--batch") ||
                 IS("--max-batch-tokens") || IS("--prefill-chunk") || IS("--max-running") || IS("--max-queue") ||
                 IS("--admission") || IS("--preempt") || IS("--kv-layout") || IS("--swap-space") || IS("-t") ||
                 IS("--threads") || IS("--isa") || IS("--temp") || IS("--top-k") || IS("--top-p") || IS("--min-p") ||
                 IS("--repeat-penalty") || IS("--presence-penalty") || IS("--frequency-penalty") ||
                 IS("--repeat-last-n") || IS("--seed");
    if (!known) return false;
    *value = NULL;
    const char *v = hr_arg_value(cmd, argc, argv, i);
    if (!v) return true;
    bool ok = true;
    hr_sampler_params *sp = &o->sampling;
    if (IS("-m") || IS("--model"))
        o->model_path = v;
    else if (IS("-c") || IS("--ctx"))
        ok = hr_arg_int(cmd, a, v, 1, 1 << 24, &o->n_ctx);
    else if (IS("--kv-budget")) {
        ok = hr_arg_size(cmd, a, v, &o->kv_budget);
        if (ok && o->kv_budget == 0) {
            fprintf(stderr,
                    "headroom %s: --kv-budget must be > 0; omit it for the default (one --ctx sequence per prompt "
                    "that can run at once)\n",
                    cmd);
            ok = false;
        }
    }
    else if (IS("--kv-type") || IS("--kv-type-k") || IS("--kv-type-v")) {
        hr_kv_format f;
        hr_error err;
        if (hr_kv_format_parse(v, &f, &err) != HR_OK) {
            fprintf(stderr, "headroom %s: %s: %s\n", cmd, a, err.msg);
            ok = false;
        } else {
            if (!IS("--kv-type-v")) o->k_format = f;
            if (!IS("--kv-type-k")) o->v_format = f;
        }
    } else if (IS("--block-size"))
        ok = hr_arg_int(cmd, a, v, 8, 256, &o->block_size);
    else if (IS("-b") || IS("--batch") || IS("--max-batch-tokens"))
        ok = hr_arg_int(cmd, a, v, 1, 1 << 16, &o->n_batch);
    else if (IS("--prefill-chunk"))
        ok = hr_arg_int(cmd, a, v, 1, 1 << 16, &o->prefill_chunk);
    else if (IS("--max-running"))
        ok = hr_arg_int(cmd, a, v, 1, 4096, &o->max_running);
    else if (IS("--swap-space"))
        ok = hr_arg_size(cmd, a, v, &o->swap_space);
    else if (IS("--max-queue"))
        ok = hr_arg_int(cmd, a, v, 1, 1 << 24, &o->max_queue);
    else if (IS("--admission") || IS("--preempt") || IS("--kv-layout")) {
        hr_error err;
        hr_status st = IS("--admission") ? hr_admission_parse(v, &o->admission, &err)
                       : IS("--preempt") ? hr_preempt_mode_parse(v, &o->preempt, &err)
                                         : hr_kv_layout_parse(v, &o->layout, &err);
        if (st != HR_OK) {
            fprintf(stderr, "headroom %s: %s: %s\n", cmd, a, err.msg);
            ok = false;
        }
    } else if (IS("-t") || IS("--threads")) {
        ok = hr_arg_int(cmd, a, v, 1, 1024, &o->n_threads);
        if (ok) o->n_threads = hr_arg_threads_cap(cmd, o->n_threads);
    } else if (IS("--isa"))
        o->isa = v;
    else if (IS("--temp"))
        ok = hr_arg_float(cmd, a, v, 0, 100, &sp->temperature);
    else if (IS("--top-k"))
        ok = hr_arg_int(cmd, a, v, 0, 1 << 24, &sp->top_k);
    else if (IS("--top-p"))
        ok = hr_arg_float(cmd, a, v, 1e-6, 1, &sp->top_p);
    else if (IS("--min-p"))
        ok = hr_arg_float(cmd, a, v, 0, 1, &sp->min_p);
    else if (IS("--repeat-penalty"))
        ok = hr_arg_float(cmd, a, v, 1e-3, 100, &sp->repeat_penalty);
    else if (IS("--presence-penalty"))
        ok = hr_arg_float(cmd, a, v, -2, 2, &sp->presence_penalty);
    else if (IS("--frequency-penalty"))
        ok = hr_arg_float(cmd, a, v, -2, 2, &sp->frequency_penalty);
    else if (IS("--repeat-last-n"))
        ok = hr_arg_int(cmd, a, v, -1, 1 << 20, &sp->penalty_last_n);
    else if (IS("--seed"))
        ok = hr_arg_u64(cmd, a, v, &sp->seed);
#undef IS
    if (ok) *value = v;
    return true;
}

static hr_status load_demo(hr_session *s, hr_error *err) {
    hr_synth_shape shape;
    hr_status st = hr_synth_shape_by_name("tiny", &shape, err);
    if (st) return st;
    return hr_synth_model(&shape, HR_DTYPE_F32, 42, &s->model, &s->demo_file, err);
}

/* Sizes and creates the KV pool: the budget must hold at least one n_ctx sequence. The default
 * budget holds one n_ctx sequence per prompt that can run at once. */
static hr_status open_kv(hr_session *s, hr_error *err) {
    const hr_hparams *hp = hr_model_hparams(s->model);
    int n_seqs = HR_MAX(1, HR_MIN(s->o.n_prompts_hint, s->o.max_running));
    hr_kv_config kc = {.n_layers = hp->n_layer,
                       .n_kv_heads = hp->n_head_kv,
                       .head_dim = hp->head_dim,
                       .block_size = s->o.block_size,
                       .k_format = s->o.k_format,
                       .v_format = s->o.v_format,
                       .max_seqs = n_seqs,
                       .max_step_tokens = s->o.n_batch, /* sizes the q4/kivi2 tail buffers for a full step */
                       .prefault = true};
    uint64_t block_bytes = hr_kv_block_bytes(&kc), fixed = hr_kv_fixed_bytes(&kc);
    if (block_bytes == 0) {
        /* the pool's own check says why: it fails on the config before allocating anything */
        hr_kv_pool *probe = NULL;
        hr_error why = {.msg = "the KV pool refuses this configuration"};
        if (hr_kv_pool_create(&kc, &probe, &why) == HR_OK) hr_kv_pool_destroy(probe);
        char fmt[32];
        if (kc.k_format == kc.v_format)
            snprintf(fmt, sizeof fmt, "%s", hr_kv_format_name(kc.k_format));
        else
            snprintf(fmt, sizeof fmt, "%s/%s", hr_kv_format_name(kc.k_format), hr_kv_format_name(kc.v_format));
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "--kv-type %s with --block-size %d cannot be used on this model (head_dim %d, %d KV "
                            "heads): %s",
                            fmt, kc.block_size, kc.head_dim, kc.n_kv_heads, why.msg);
    }
    uint64_t need_blocks = (uint64_t)(s->n_ctx + kc.block_size - 1) / kc.block_size;
    kc.budget_bytes = s->o.kv_budget ? s->o.kv_budget : fixed + need_blocks * block_bytes * (uint64_t)n_seqs;
    uint64_t have_blocks = kc.budget_bytes > fixed ? (kc.budget_bytes - fixed) / block_bytes : 0;
    /* a budget that cannot hold even one --ctx sequence is a startup error that says what fits (each
     * request is also checked against the pool when submitted) */
    if (have_blocks < need_blocks) {
        char b1[32], b2[32];
        return hr_error_set(err, HR_ERR_BUDGET,
                            "--kv-budget %s holds %llu tokens at %s/%s; the context is %d: raise --kv-budget to %s "
                            "or lower --ctx",
                            hr_format_size(kc.budget_bytes, b1, sizeof b1),
                            (unsigned long long)(have_blocks * (uint64_t)kc.block_size), hr_kv_format_name(kc.k_format),
                            hr_kv_format_name(kc.v_format), s->n_ctx,
                            hr_format_size(fixed + need_blocks * block_bytes, b2, sizeof b2));
    }
    return hr_kv_pool_create(&kc, &s->kv, err);
}

/* Whether a failure after the model and tokenizer loaded is about an option value rather than memory,
 * a file or the machine. */
static bool option_fault(hr_status st) { return st != HR_ERR_NOMEM && st != HR_ERR_IO && st != HR_ERR_INTERNAL; }

/* --ctx against the trained context: past it RoPE sees positions it was never trained on
 * (docs/POLICIES.md, "Positions, RoPE and running past the trained context"). */
static hr_status check_ctx(hr_session *s, const hr_hparams *hp, hr_error *err) {
    int train = hp->n_ctx_train;
    if (train <= 0 || s->n_ctx <= train) return HR_OK;
    if (!s->o.ctx_extend)
        return hr_error_set(err, HR_ERR_RANGE,
                            "--ctx %d exceeds the model's trained context (%d): positions past %d are out of "
                            "distribution for RoPE and quality degrades; add --ctx-extend to allow it anyway, or keep "
                            "--ctx <= %d and use --kv-policy window:W to run past the context",
                            s->n_ctx, train, train, train);
    add_warning(s,
                "--ctx %d exceeds the model's trained context (%d) (--ctx-extend): positions past %d are out of "
                "distribution for RoPE; expect quality to degrade there",
                s->n_ctx, train, train);
    return HR_OK;
}

hr_status hr_session_open(const hr_session_opts *o, hr_session **out, bool *bad_option, hr_error *err) {
    if (bad_option) *bad_option = false;
    hr_session *s = calloc(1, sizeof *s);
    if (!s) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    s->o = *o;
    bool loaded = false; /* past this point a failure is an option's, unless memory or I/O */
    hr_status st = o->model_path ? hr_model_load_hold(o->model_path, o->mmap_weights ? HR_GGUF_MMAP : HR_GGUF_RESIDENT,
                                                      &s->model, err)
                                 : load_demo(s, err);
    if (st) goto fail;
    if ((st = hr_tokenizer_load(hr_model_gguf(s->model), &s->tok, err))) goto fail;
    const hr_hparams *hp = hr_model_hparams(s->model);
    if (hr_tokenizer_n_vocab(s->tok) > hp->n_vocab) {
        st = hr_error_set(err, HR_ERR_FORMAT, "the vocabulary has %d tokens but the model's embedding has %d rows",
                          hr_tokenizer_n_vocab(s->tok), hp->n_vocab);
        goto fail;
    }
    loaded = true;
    if (o->chat_template) {
        s->chat_tpl = hr_chat_template_by_name(o->chat_template);
        if (s->chat_tpl == HR_CHAT_UNKNOWN) {
            st = hr_error_set(err, HR_ERR_INVALID_ARG, "unknown --chat-template '%s' (known: %s)", o->chat_template,
                              hr_chat_template_names());
            goto fail;
        }
    } else if (o->chat) {
        s->chat_tpl = hr_chat_template_from_gguf(hr_model_gguf(s->model), s->warning, sizeof s->warning);
    }
    s->n_ctx = o->n_ctx ? o->n_ctx : HR_MIN(hp->n_ctx_train, 4096);
    if ((st = check_ctx(s, hp, err))) goto fail;
    if ((st = open_kv(s, err))) goto fail;
    if (o->kv_policy) {
        if ((st = hr_kv_policy_parse(o->kv_policy, &s->policy, err)) ||
            (st = hr_kv_pool_set_default_policy(s->kv, &s->policy, err))) {
            hr_error_prefix(err, "--kv-policy");
            goto fail;
        }
        s->has_policy = true;
    }
    hr_model_ctx_params mp = {
        .n_threads = o->n_threads, .max_batch_tokens = o->n_batch, .max_ctx = s->n_ctx, .force_isa = o->isa};
    if ((st = hr_model_ctx_create(s->model, s->kv, &mp, &s->ctx, err))) goto fail;
    if ((st = hr_sampler_params_check(&o->sampling, err))) goto fail;
    /* the swap tier: --swap-space, or with --preempt swap as large as the pool */
    uint64_t swap_bytes = o->swap_space;
    if (!swap_bytes && o->preempt == HR_PREEMPT_SWAP)
        swap_bytes = (uint64_t)hr_kv_pool_n_blocks(s->kv) * hr_kv_block_bytes(hr_kv_pool_config(s->kv));
    if (swap_bytes && o->preempt != HR_PREEMPT_RECOMPUTE) {
        hr_kv_swap_config sc = {.path = NULL, .budget_bytes = swap_bytes};
        if ((st = hr_kv_swap_create(s->kv, &sc, &s->swap, err))) {
            hr_error_prefix(err, "--swap-space");
            goto fail;
        }
    }
    hr_engine_params ep = {.model = s->model,
                           .ctx = s->ctx,
                           .kv = s->kv,
                           .swap = s->swap,
                           .tok = s->tok,
                           .n_ctx = s->n_ctx,
                           .max_batch_tokens = o->n_batch,
                           .max_queue = o->max_queue,
                           .prefill_chunk = o->prefill_chunk,
                           .admission = o->admission,
                           .preempt = o->preempt,
                           .layout = o->layout};
    if ((st = hr_engine_create(&ep, &s->engine, err))) goto fail;
    *out = s;
    return HR_OK;
fail:
    if (bad_option) *bad_option = loaded && option_fault(st);
    hr_session_close(s);
    return st;
}

void hr_session_close(hr_session *s) {
    if (!s) return;
    hr_engine_destroy(s->engine); /* frees every sequence, swapped ones too, before the tier goes */
    hr_kv_swap_destroy(s->swap);
    hr_model_ctx_destroy(s->ctx);
    hr_kv_pool_destroy(s->kv);
    hr_tokenizer_destroy(s->tok);
    hr_model_destroy(s->model);
    free(s->demo_file);
    free(s);
}

const hr_model *hr_session_model(const hr_session *s) { return s->model; }
const hr_tokenizer *hr_session_tokenizer(const hr_session *s) { return s->tok; }
hr_kv_pool *hr_session_kv(hr_session *s) { return s->kv; }
hr_model_ctx *hr_session_ctx(hr_session *s) { return s->ctx; }
hr_engine *hr_session_engine(hr_session *s) { return s->engine; }
const hr_session_opts *hr_session_options(const hr_session *s) { return &s->o; }
const char *hr_session_warning(const hr_session *s) { return s->warning; }
int hr_session_n_ctx(const hr_session *s) { return s->n_ctx; }

/* ---- generation through the engine --------------------------------------------------------------- */

/* Renders a chat prompt (optional system message, then the user's) with the session's template. The
 * template writes BOS text itself, so the result is tokenized with special tokens parsed and no BOS
 * added. */
static hr_status render_chat(hr_session *s, const char *user, char **out, hr_error *err) {
    hr_chat_msg msgs[2];
    size_t n = 0;
    if (s->o.system) msgs[n++] = (hr_chat_msg){.role = "system", .content = s->o.system};
    msgs[n++] = (hr_chat_msg){.role = "user", .content = user};
    int32_t bos = hr_tokenizer_bos(s->tok), eos = hr_tokenizer_eos(s->tok);
    return hr_chat_render(s->chat_tpl, msgs, n, true, bos >= 0 ? hr_tokenizer_piece(s->tok, bos) : NULL,
                          eos >= 0 ? hr_tokenizer_piece(s->tok, eos) : NULL, out, err);
}

/* Tokenizes prompt into g->prompt_ids (rendered as a chat turn first in chat mode). */
static hr_status tokenize(hr_session *s, const char *prompt, hr_generation *g, hr_error *err) {
    hr_tokenize_opts to = {.add_bos = !s->o.no_bos && hr_tokenizer_add_bos_default(s->tok)};
    char *rendered = NULL;
    if (s->o.chat) {
        hr_status st = render_chat(s, prompt, &rendered, err);
        if (st) return st;
        prompt = rendered;
        to = (hr_tokenize_opts){.add_bos = false, .parse_special = true};
    }
    size_t n = 0, len = strlen(prompt);
    hr_status st = hr_tokenizer_encode(s->tok, prompt, len, &to, NULL, 0, &n, err);
    g->prompt_ids = st ? NULL : malloc(sizeof(int32_t) * (n + 1));
    if (!st && !g->prompt_ids) st = hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    if (!st) st = hr_tokenizer_encode(s->tok, prompt, len, &to, g->prompt_ids, n, &n, err);
    free(rendered);
    if (st) return st;
    g->n_prompt = (int)n;
    if (g->n_prompt == 0) return hr_error_set(err, HR_ERR_INVALID_ARG, "the prompt is empty after tokenization");
    if (g->n_prompt >= s->n_ctx)
        return hr_error_set(err, HR_ERR_RANGE, "the prompt has %d tokens but the context holds %d (raise --ctx)",
                            g->n_prompt, s->n_ctx);
    return HR_OK;
}

/* Tokenizes and submits prompt i; on refusal records the reason in g. */
static void submit_one(hr_session *s, int i, const char *prompt, hr_generation *g, hr_request **h) {
    hr_error e = {0};
    *h = NULL;
    hr_status st = tokenize(s, prompt, g, &e);
    /* a window or sinks policy lets a sequence run past the context; otherwise it ends there */
    int span = s->has_policy ? hr_kv_policy_span(&s->policy) : 0;
    int max_new = span > 0 ? s->o.n_predict : HR_MIN(s->o.n_predict, s->n_ctx - g->n_prompt);
    g->max_tokens = st == HR_OK ? max_new : 0;
    g->ctx_limited = st == HR_OK && max_new < s->o.n_predict;
    g->seed = hr_prompt_seed(s->o.sampling.seed, i);
    hr_sampler_params sp = s->o.sampling;
    sp.seed = g->seed;
    if (st == HR_OK && max_new > 0) {
        hr_request_params p = {.prompt = g->prompt_ids,
                               .n_prompt = g->n_prompt,
                               .max_tokens = max_new,
                               .sampling = sp,
                               .ignore_eos = s->o.ignore_eos,
                               .stop = (const char *const *)s->o.stop,
                               .n_stop = s->o.n_stop,
                               .kv_policy = s->has_policy ? &s->policy : NULL};
        st = hr_engine_submit(s->engine, &p, h, &e);
    }
    g->status = st;
    g->finish_reason = st == HR_OK ? "length" : "error";
    if (st != HR_OK) snprintf(g->error, sizeof g->error, "%s", e.msg);
}

/* Copies a final request's output and figures into g. */
static hr_status collect(hr_session *s, hr_request *h, hr_generation *g) {
    hr_request_get_stats(h, &g->stats);
    int n = 0;
    size_t tl = 0;
    const int32_t *ids = hr_request_output(h, &n);
    const char *text = hr_request_text(h, &tl);
    g->ids = malloc(sizeof(int32_t) * (size_t)(n + 1));
    g->text = malloc(tl + 1);
    if (!g->ids || !g->text) return HR_ERR_NOMEM;
    memcpy(g->ids, ids, sizeof(int32_t) * (size_t)n);
    memcpy(g->text, text, tl);
    g->text[tl] = '\0';
    g->n_ids = n;
    g->text_len = tl;
    const hr_request_stats *rs = &g->stats;
    g->ledger = rs->kv;
    g->kv_bytes_peak = rs->kv.bytes_peak;
    double t1 = rs->t_first_token > 0 ? rs->t_first_token : rs->t_finish;
    g->prompt_seconds = t1 - rs->t_submit;
    g->gen_seconds = rs->t_finish - t1;
    g->finish_reason = hr_finish_reason_name(rs->finish);
    g->limit = rs->finish == HR_FINISH_LENGTH ? (g->ctx_limited ? "context" : "max_tokens") : NULL;
    if (rs->state != HR_REQ_COMPLETED) {
        g->status = rs->error_code ? rs->error_code : HR_ERR_INTERNAL;
        snprintf(g->error, sizeof g->error, "%s", rs->error);
    }
    (void)s;
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
    int train = hr_model_hparams(s->model)->n_ctx_train;
    char hint[96];
    if (s->n_ctx < train)
        snprintf(hint, sizeof hint, "raise --ctx (up to the model's trained context, %d)", train);
    else
        snprintf(hint, sizeof hint, "use --kv-policy window:W to run past the context");
    fprintf(s->o.warn,
            "headroom %s: warning: -n %d is clamped%sto %d tokens by the context (--ctx %d, the prompt takes %d)%s: "
            "%s\n",
            s->o.cmd ? s->o.cmd : "run", s->o.n_predict, who, g[first].max_tokens, s->n_ctx, g[first].n_prompt,
            n > 1 ? ")" : "", hint);
}

hr_status hr_session_generate_many(hr_session *s, const char *const *prompts, int n, FILE *out, hr_generation *g,
                                   hr_error *err) {
    hr_request **h = calloc((size_t)(n > 0 ? n : 1), sizeof *h);
    if (!h) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    memset(g, 0, sizeof *g * (size_t)n);
    for (int i = 0; i < n; i++) submit_one(s, i, prompts[i], &g[i], &h[i]);
    warn_clamped(s, g, n);
    bool stream = out && n == 1 && h[0];
    hr_status st = HR_OK;
    for (int pending = 1; pending > 0;) {
        if ((st = hr_engine_step(s->engine, &pending, err))) break;
        if (stream) {
            char buf[4096];
            hr_request_delta d;
            do {
                hr_request_read(h[0], NULL, 0, buf, sizeof buf, &d);
                if (d.n_text) fwrite(buf, 1, d.n_text, out);
            } while (d.n_text == sizeof buf - 1);
            fflush(out);
        }
    }
    for (int i = 0; i < n; i++) {
        if (h[i] && st == HR_OK && collect(s, h[i], &g[i]) != HR_OK)
            st = hr_error_set(err, HR_ERR_NOMEM, "out of memory collecting outputs");
        hr_request_release(h[i]);
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
    char kb[32];
    double pps = g->prompt_seconds > 0 ? g->n_prompt / g->prompt_seconds : 0;
    double gps = g->gen_seconds > 0 ? g->n_ids / g->gen_seconds : 0;
    char why[96] = "";
    if (g->limit && !strcmp(g->limit, "context"))
        snprintf(why, sizeof why, " (stopped at the context: %d tokens, --ctx)", s->n_ctx);
    else if (g->limit)
        snprintf(why, sizeof why, " (-n %d)", g->max_tokens);
    fprintf(f, "prompt: %d tokens, %.1f tok/s | generation: %d tokens, %.1f tok/s | finish: %s%s\n", g->n_prompt, pps,
            g->n_ids, gps, g->finish_reason, why);
    fprintf(f, "kv cache: %s peak (%d tokens, K %s / V %s, block %d) | kernels %s, %d threads\n",
            hr_format_size(g->kv_bytes_peak, kb, sizeof kb), g->ledger.tokens_total,
            hr_kv_format_name(g->ledger.k_format), hr_kv_format_name(g->ledger.v_format), s->o.block_size,
            hr_model_ctx_isa(s->ctx), hr_model_ctx_n_threads(s->ctx));
}

json_t *hr_generation_to_json(const hr_session *s, const hr_generation *g) {
    json_t *root = json_object();
    json_t *pids = json_array(), *cids = json_array();
    for (int i = 0; i < g->n_prompt; i++) json_array_append_new(pids, json_integer(g->prompt_ids[i]));
    for (int i = 0; i < g->n_ids; i++) json_array_append_new(cids, json_integer(g->ids[i]));
    json_object_set_new(root, "completion", json_stringn(g->text, g->text_len));
    json_object_set_new(root, "finish_reason", json_string(g->finish_reason));
    if (g->limit) json_object_set_new(root, "limit", json_string(g->limit));
    json_object_set_new(root, "max_tokens", json_integer(g->max_tokens));
    json_object_set_new(root, "n_ctx", json_integer(s->n_ctx));
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
    json_object_set_new(root, "kv_type_k", json_string(hr_kv_format_name(g->ledger.k_format)));
    json_object_set_new(root, "kv_type_v", json_string(hr_kv_format_name(g->ledger.v_format)));
    json_object_set_new(root, "model", json_string(hr_model_hparams(s->model)->name));
    json_object_set_new(root, "kernels", json_string(hr_model_ctx_isa(s->ctx)));
    json_object_set_new(root, "threads", json_integer(hr_model_ctx_n_threads(s->ctx)));
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
    hr_engine_stats st;
    hr_engine_get_stats(s->engine, &st);
    hr_kv_pool_ledger l;
    hr_kv_pool_get_ledger(s->kv, &l);
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
    json_object_set_new(o, "decode_tokens", json_integer((json_int_t)st.decode_tokens));
    json_object_set_new(o, "decode_seconds", json_real(st.decode_seconds));
    json_object_set_new(o, "decode_tokens_per_second",
                        json_real(st.decode_seconds > 0 ? st.decode_tokens / st.decode_seconds : 0));
    json_object_set_new(o, "admission", json_string(hr_admission_name(s->o.admission)));
    json_object_set_new(o, "preempt", json_string(hr_preempt_mode_name(s->o.preempt)));
    json_object_set_new(o, "kv_layout", json_string(hr_kv_layout_name(s->o.layout)));
    json_object_set_new(o, "kv_pool_bytes", json_integer((json_int_t)l.bytes_total));
    json_object_set_new(o, "kv_pool_blocks", json_integer(l.blocks_total));
    return o;
}

void hr_session_print_engine_stats(hr_session *s, const hr_generation *g, int n, double seconds, FILE *f) {
    hr_engine_stats st;
    hr_engine_get_stats(s->engine, &st);
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
            hr_admission_name(s->o.admission), hr_preempt_mode_name(s->o.preempt), hr_kv_layout_name(s->o.layout),
            (unsigned long long)st.preemptions, (unsigned long long)st.recomputed_tokens,
            (unsigned long long)st.prefix_hit_tokens, hr_format_size(peak, kb, sizeof kb), hr_model_ctx_isa(s->ctx),
            hr_model_ctx_n_threads(s->ctx));
}

void hr_session_print_ledger(hr_session *s, FILE *f) {
    hr_kv_pool_ledger l;
    hr_kv_pool_get_ledger(s->kv, &l);
    char a[32], b[32], c[32], d[32];
    fprintf(f, "kv pool: %d blocks (%s): used %d, cached %d (%s), free %d (%s), waste %llu slots (%s)\n",
            l.blocks_total, hr_format_size(l.bytes_total, a, sizeof a), l.blocks_used, l.blocks_cached,
            hr_format_size(l.bytes_cached, b, sizeof b), l.blocks_free, hr_format_size(l.bytes_free, c, sizeof c),
            (unsigned long long)l.waste_slots, hr_format_size(l.waste_bytes, d, sizeof d));
}

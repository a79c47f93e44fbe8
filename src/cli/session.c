/* session.c: see session.h. */
#include "cli/session.h"

#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "common/util.h"
#include "model/synth.h"

/* Prompt chunks are bounded so the per-chunk position arrays can live on the stack. */
#define HR_MAX_STACK_BATCH 512

struct hr_session {
    hr_session_opts o;
    void *demo_file; /* the in-memory demo GGUF (borrowed by the model's reader) */
    hr_model *model;
    hr_tokenizer *tok;
    hr_kv_pool *kv;
    hr_model_ctx *ctx;
    hr_sampler *sampler;
    float *logits;   /* (V) */
    int n_ctx;
};

hr_session_opts hr_session_default_opts(void) {
    hr_session_opts o = {0};
    o.k_format = o.v_format = HR_KV_F16;
    o.block_size = 16;
    o.n_batch = 512;
    o.n_predict = 128;
    o.sampling = hr_sampler_default_params();
    o.sampling.temperature = 0.8f;
    return o;
}

bool hr_session_parse_common(hr_session_opts *o, const char *cmd, int argc, char **argv, int *i, const char **value) {
    const char *a = argv[*i];
#define IS(x) (!strcmp(a, x))
    bool known = IS("-m") || IS("--model") || IS("-c") || IS("--ctx") || IS("--kv-budget") || IS("--kv-type") ||
                 IS("--kv-type-k") || IS("--kv-type-v") || IS("--block-size") || IS("-b") || IS("--batch") ||
                 IS("-t") || IS("--threads") || IS("--isa") || IS("--temp") || IS("--top-k") || IS("--top-p") ||
                 IS("--min-p") || IS("--repeat-penalty") || IS("--presence-penalty") || IS("--frequency-penalty") ||
                 IS("--repeat-last-n") || IS("--seed");
    if (!known) return false;
    *value = NULL;
    const char *v = hr_arg_value(cmd, argc, argv, i);
    if (!v) return true;
    bool ok = true;
    hr_sampler_params *sp = &o->sampling;
    if (IS("-m") || IS("--model")) o->model_path = v;
    else if (IS("-c") || IS("--ctx")) ok = hr_arg_int(cmd, a, v, 1, 1 << 24, &o->n_ctx);
    else if (IS("--kv-budget")) ok = hr_arg_size(cmd, a, v, &o->kv_budget);
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
    } else if (IS("--block-size")) ok = hr_arg_int(cmd, a, v, 8, 256, &o->block_size);
    else if (IS("-b") || IS("--batch")) ok = hr_arg_int(cmd, a, v, 1, 1 << 16, &o->n_batch);
    else if (IS("-t") || IS("--threads")) ok = hr_arg_int(cmd, a, v, 1, 1024, &o->n_threads);
    else if (IS("--isa")) o->isa = v;
    else if (IS("--temp")) ok = hr_arg_float(cmd, a, v, 0, 100, &sp->temperature);
    else if (IS("--top-k")) ok = hr_arg_int(cmd, a, v, 0, 1 << 24, &sp->top_k);
    else if (IS("--top-p")) ok = hr_arg_float(cmd, a, v, 1e-6, 1, &sp->top_p);
    else if (IS("--min-p")) ok = hr_arg_float(cmd, a, v, 0, 1, &sp->min_p);
    else if (IS("--repeat-penalty")) ok = hr_arg_float(cmd, a, v, 1e-3, 100, &sp->repeat_penalty);
    else if (IS("--presence-penalty")) ok = hr_arg_float(cmd, a, v, -2, 2, &sp->presence_penalty);
    else if (IS("--frequency-penalty")) ok = hr_arg_float(cmd, a, v, -2, 2, &sp->frequency_penalty);
    else if (IS("--repeat-last-n")) ok = hr_arg_int(cmd, a, v, -1, 1 << 20, &sp->penalty_last_n);
    else if (IS("--seed")) ok = hr_arg_u64(cmd, a, v, &sp->seed);
#undef IS
    if (ok) *value = v;
    return true;
}

static hr_status load_demo(hr_session *s, hr_error *err) {
    hr_synth_shape shape;
    hr_status st = hr_synth_shape_by_name("tiny", &shape, err);
    if (st) return st;
    hr_gguf_writer *w = NULL;
    if ((st = hr_synth_build(&shape, HR_DTYPE_F32, 42, &w, err))) return st;
    size_t size = 0;
    st = hr_gguf_writer_write_memory(w, &s->demo_file, &size, err);
    hr_gguf_writer_destroy(w);
    if (st) return st;
    hr_gguf *g = NULL;
    if ((st = hr_gguf_open_memory(s->demo_file, size, &g, err))) return st;
    return hr_model_load_gguf(g, &s->model, err);
}

/* Sizes and creates the KV pool: the budget must hold at least one n_ctx sequence. */
static hr_status open_kv(hr_session *s, hr_error *err) {
    const hr_hparams *hp = hr_model_hparams(s->model);
    hr_kv_config kc = {.n_layers = hp->n_layer, .n_kv_heads = hp->n_head_kv, .head_dim = hp->head_dim,
                       .block_size = s->o.block_size, .k_format = s->o.k_format, .v_format = s->o.v_format,
                       .max_seqs = 64};
    uint64_t block_bytes = hr_kv_block_bytes(&kc);
    uint64_t need_blocks = (uint64_t)(s->n_ctx + kc.block_size - 1) / kc.block_size;
    kc.budget_bytes = s->o.kv_budget ? s->o.kv_budget : need_blocks * block_bytes;
    uint64_t have_blocks = kc.budget_bytes / block_bytes;
    if (have_blocks < need_blocks) {
        char b1[32], b2[32];
        return hr_error_set(err, HR_ERR_BUDGET,
                            "--kv-budget %s holds %llu tokens at %s/%s; the context is %d: raise --kv-budget to %s "
                            "or lower --ctx",
                            hr_format_size(kc.budget_bytes, b1, sizeof b1),
                            (unsigned long long)(have_blocks * (uint64_t)kc.block_size), hr_kv_format_name(kc.k_format),
                            hr_kv_format_name(kc.v_format), s->n_ctx,
                            hr_format_size(need_blocks * block_bytes, b2, sizeof b2));
    }
    return hr_kv_pool_create(&kc, &s->kv, err);
}

hr_status hr_session_open(const hr_session_opts *o, hr_session **out, hr_error *err) {
    hr_session *s = calloc(1, sizeof *s);
    if (!s) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    s->o = *o;
    hr_status st = o->model_path ? hr_model_load(o->model_path, &s->model, err) : load_demo(s, err);
    if (st) goto fail;
    if ((st = hr_tokenizer_load(hr_model_gguf(s->model), &s->tok, err))) goto fail;
    const hr_hparams *hp = hr_model_hparams(s->model);
    if (hr_tokenizer_n_vocab(s->tok) > hp->n_vocab) {
        st = hr_error_set(err, HR_ERR_FORMAT, "the vocabulary has %d tokens but the model's embedding has %d rows",
                          hr_tokenizer_n_vocab(s->tok), hp->n_vocab);
        goto fail;
    }
    s->n_ctx = o->n_ctx ? o->n_ctx : HR_MIN(hp->n_ctx_train, 4096);
    if ((st = open_kv(s, err))) goto fail;
    hr_model_ctx_params mp = {.n_threads = o->n_threads, .max_batch_tokens = o->n_batch, .max_ctx = s->n_ctx,
                              .force_isa = o->isa};
    if ((st = hr_model_ctx_create(s->model, s->kv, &mp, &s->ctx, err))) goto fail;
    if ((st = hr_sampler_create(&o->sampling, hp->n_vocab, &s->sampler, err))) goto fail;
    s->logits = malloc(sizeof(float) * (size_t)hp->n_vocab);
    if (!s->logits) {
        st = hr_error_set(err, HR_ERR_NOMEM, "out of memory");
        goto fail;
    }
    *out = s;
    return HR_OK;
fail:
    hr_session_close(s);
    return st;
}

void hr_session_close(hr_session *s) {
    if (!s) return;
    hr_sampler_destroy(s->sampler);
    hr_model_ctx_destroy(s->ctx);
    hr_kv_pool_destroy(s->kv);
    hr_tokenizer_destroy(s->tok);
    hr_model_destroy(s->model);
    free(s->demo_file);
    free(s->logits);
    free(s);
}

const hr_model *hr_session_model(const hr_session *s) { return s->model; }
const hr_tokenizer *hr_session_tokenizer(const hr_session *s) { return s->tok; }
hr_kv_pool *hr_session_kv(hr_session *s) { return s->kv; }
hr_model_ctx *hr_session_ctx(hr_session *s) { return s->ctx; }
const hr_session_opts *hr_session_options(const hr_session *s) { return &s->o; }

/* Appends bytes to the generation's text buffer. */
static hr_status text_append(hr_generation *g, const char *p, size_t n, size_t *cap, hr_error *err) {
    if (g->text_len + n + 1 > *cap) {
        size_t nc = (*cap ? *cap * 2 : 256) + n;
        char *t = realloc(g->text, nc);
        if (!t) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
        g->text = t;
        *cap = nc;
    }
    memcpy(g->text + g->text_len, p, n);
    g->text_len += n;
    g->text[g->text_len] = '\0';
    return HR_OK;
}

/* Finds the earliest stop string in text; returns its offset or -1. */
static long find_stop(const hr_session_opts *o, const char *text, size_t from) {
    long best = -1;
    for (int i = 0; i < o->n_stop; i++) {
        const char *p = strstr(text + from, o->stop[i]);
        if (p && (best < 0 || p - text < best)) best = p - text;
    }
    return best;
}

/* Runs one forward over tokens [0, n) of one sequence at positions pos0.., logits of the last. */
static hr_status forward_chunk(hr_session *s, hr_kv_seq seq, const int32_t *toks, int n, int pos0, bool want_last,
                               hr_error *err) {
    hr_status st = hr_kv_seq_reserve(s->kv, seq, pos0 + n, err);
    if (st) return st;
    int32_t pos[HR_MAX_STACK_BATCH];
    hr_kv_seq seqs[HR_MAX_STACK_BATCH];
    uint8_t want[HR_MAX_STACK_BATCH];
    for (int i = 0; i < n; i++) {
        pos[i] = pos0 + i;
        seqs[i] = seq;
        want[i] = want_last && i == n - 1;
    }
    hr_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .seq = seqs, .want_logits = want};
    if ((st = hr_model_forward(s->ctx, &b, s->logits, err))) return st;
    hr_kv_seq_commit(s->kv, seq, toks, n);
    return HR_OK;
}

hr_status hr_session_generate(hr_session *s, const char *prompt, FILE *out, hr_generation *g, hr_error *err) {
    memset(g, 0, sizeof *g);
    const hr_session_opts *o = &s->o;
    hr_tokenize_opts to = {.add_bos = !o->no_bos && hr_tokenizer_add_bos_default(s->tok)};
    size_t n = 0, len = strlen(prompt);
    hr_status st = hr_tokenizer_encode(s->tok, prompt, len, &to, NULL, 0, &n, err);
    if (st) return st;
    g->prompt_ids = malloc(sizeof(int32_t) * (n + 1));
    if (!g->prompt_ids) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    if ((st = hr_tokenizer_encode(s->tok, prompt, len, &to, g->prompt_ids, n, &n, err))) goto fail;
    g->n_prompt = (int)n;
    if (g->n_prompt == 0) {
        st = hr_error_set(err, HR_ERR_INVALID_ARG, "the prompt is empty after tokenization");
        goto fail;
    }
    if (g->n_prompt >= s->n_ctx) {
        st = hr_error_set(err, HR_ERR_RANGE, "the prompt has %d tokens but the context holds %d (raise --ctx)",
                          g->n_prompt, s->n_ctx);
        goto fail;
    }
    int max_new = HR_MIN(o->n_predict, s->n_ctx - g->n_prompt);
    g->ids = malloc(sizeof(int32_t) * (size_t)(max_new + 1));
    if (!g->ids) {
        st = hr_error_set(err, HR_ERR_NOMEM, "out of memory");
        goto fail;
    }
    hr_kv_seq seq;
    if ((st = hr_kv_seq_create(s->kv, &seq, err))) goto fail;
    hr_sampler_reset(s->sampler);

    double t0 = hr_time_now();
    int chunk = HR_MIN(o->n_batch, HR_MAX_STACK_BATCH);
    for (int p = 0; p < g->n_prompt; p += chunk) {
        int m = HR_MIN(chunk, g->n_prompt - p);
        if ((st = forward_chunk(s, seq, g->prompt_ids + p, m, p, p + m == g->n_prompt, err))) goto fail_seq;
    }
    double t1 = hr_time_now();
    g->prompt_seconds = t1 - t0;

    hr_detok dt;
    hr_detok_init(&dt);
    dt.at_start = false; /* a completion continues the prompt: keep its first token's leading space */
    size_t cap = 0, emitted = 0, max_stop = 0;
    for (int i = 0; i < o->n_stop; i++) max_stop = HR_MAX(max_stop, strlen(o->stop[i]));
    g->finish_reason = "length";
    char piece[512];
    for (int k = 0; k < max_new; k++) {
        int32_t tok = hr_sampler_sample(s->sampler, s->logits);
        if (!o->ignore_eos && hr_tokenizer_is_eog(s->tok, tok)) {
            g->finish_reason = "stop";
            break;
        }
        g->ids[g->n_ids++] = tok;
        size_t pn = hr_detok_push(s->tok, &dt, tok, piece, sizeof piece);
        if ((st = text_append(g, piece, pn, &cap, err))) goto fail_seq;
        long stop_at = o->n_stop ? find_stop(o, g->text, emitted > max_stop ? emitted - max_stop : 0) : -1;
        if (stop_at >= 0) {
            g->text_len = (size_t)stop_at;
            g->text[g->text_len] = '\0';
            g->finish_reason = "stop";
            break;
        }
        if (out) { /* print what can no longer become part of a stop string, on a UTF-8 boundary */
            size_t safe = g->text_len > (max_stop ? max_stop - 1 : 0) ? g->text_len - (max_stop ? max_stop - 1 : 0) : 0;
            while (safe > emitted && safe < g->text_len && ((unsigned char)g->text[safe] & 0xC0) == 0x80) safe--;
            if (safe > emitted) {
                fwrite(g->text + emitted, 1, safe - emitted, out);
                fflush(out);
                emitted = safe;
            }
        }
        if (k + 1 == max_new) break;
        if ((st = forward_chunk(s, seq, &tok, 1, g->n_prompt + g->n_ids - 1, true, err))) goto fail_seq;
    }
    size_t pn = hr_detok_flush(s->tok, &dt, piece, sizeof piece);
    if (pn && (st = text_append(g, piece, pn, &cap, err))) goto fail_seq;
    if (out && g->text_len > emitted) fwrite(g->text + emitted, 1, g->text_len - emitted, out);
    if (!g->text) {
        g->text = calloc(1, 1);
        if (!g->text) {
            st = hr_error_set(err, HR_ERR_NOMEM, "out of memory");
            goto fail_seq;
        }
    }
    g->gen_seconds = hr_time_now() - t1;
    hr_kv_seq_get_ledger(s->kv, seq, &g->ledger, NULL);
    g->kv_bytes_peak = g->ledger.bytes_peak;
    hr_kv_seq_free(s->kv, seq);
    return HR_OK;
fail_seq:
    hr_kv_seq_free(s->kv, seq);
fail:
    hr_generation_free(g);
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
    fprintf(f, "prompt: %d tokens, %.1f tok/s | generation: %d tokens, %.1f tok/s | finish: %s\n", g->n_prompt, pps,
            g->n_ids, gps, g->finish_reason);
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
    return root;
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

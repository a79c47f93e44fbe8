/* eval.c: see eval.h. The model is loaded once by a small base runtime (one thread, a context of a
 * few tokens: it only holds the weights and the tokenizer); every arm is a sibling runtime on it with
 * its own formats, pool and forward context, scored through hr_runtime_score. */
#include "eval/eval.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "runtime/runtime.h"
#include "tokenizer/tokenizer.h"

#define MAX_ARMS (HR_EVAL_MAX_FORMATS * HR_EVAL_MAX_POLICIES + 1)

typedef struct fmt_pair {
    hr_rt_kv_format k, v;
    char label[32];
} fmt_pair;

typedef struct pol_text {
    char text[256]; /* as given (NULL-equivalent "" for the default full policy) */
    char label[48]; /* canonical */
} pol_text;

/* One cache configuration under test: its runtime and running sums. */
typedef struct arm {
    fmt_pair f;
    const pol_text *pol;
    hr_runtime *rt;
    uint64_t seq_bytes;
    int kept;
    double nll, kl;
    long agree, n;
    uint64_t bytes_per_token_x1000;
    char error[HR_ERROR_MSG_MAX];
    hr_error why; /* the whole error behind `error` (its parameter, for a front end to name its flag) */
} arm;

struct hr_eval {
    hr_eval_params p;
    fmt_pair fp[HR_EVAL_MAX_FORMATS];
    int n_fmt;
    pol_text pols[HR_EVAL_MAX_POLICIES];
    int n_pol;
    pol_text full;    /* the reference's */
    hr_runtime *base; /* holds the model and tokenizer; the arms borrow them */
    hr_runtime_info info;
    int32_t *toks;
    size_t n_tok;
    int n_chunks, n_arms; /* n_arms: the reference included */
    arm arms[MAX_ARMS];
    int32_t *chunk;
    float *ref_logits, *logits; /* n_ctx x V */
    double *lp_ref, *lp;        /* V */
};

static hr_status parse_formats(const char *list, fmt_pair *out, int *n, hr_error *err) {
    *n = 0;
    if (!strcmp(list, "all")) {
        for (int f = 0; f < HR_RT_KV_FORMAT_COUNT; f++) {
            out[*n].k = out[*n].v = (hr_rt_kv_format)f;
            snprintf(out[*n].label, sizeof out[*n].label, "%s", hr_rt_kv_format_name((hr_rt_kv_format)f));
            (*n)++;
        }
        return HR_OK;
    }
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (*n == HR_EVAL_MAX_FORMATS)
            return hr_error_set(err, HR_ERR_INVALID_ARG, "at most %d formats", HR_EVAL_MAX_FORMATS);
        char *slash = strchr(tok, '/');
        if (slash) *slash = 0;
        hr_status st;
        if ((st = hr_rt_kv_format_parse(tok, &out[*n].k, err)) ||
            (st = hr_rt_kv_format_parse(slash ? slash + 1 : tok, &out[*n].v, err))) {
            hr_error_prefix(err, "--kv-type");
            return st;
        }
        if (slash)
            snprintf(out[*n].label, sizeof out[*n].label, "%s/%s", hr_rt_kv_format_name(out[*n].k),
                     hr_rt_kv_format_name(out[*n].v));
        else
            snprintf(out[*n].label, sizeof out[*n].label, "%s", hr_rt_kv_format_name(out[*n].k));
        (*n)++;
    }
    return *n > 0 ? HR_OK : hr_error_set(err, HR_ERR_INVALID_ARG, "--kv-type: no format in '%s'", list);
}

static hr_status parse_policies(const char *const *items, int n_items, pol_text *out, int *n, hr_error *err) {
    *n = 0;
    for (int i = 0; i < n_items; i++) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", items[i]);
        for (char *save = NULL, *tok = strtok_r(buf, ";", &save); tok; tok = strtok_r(NULL, ";", &save)) {
            if (*n == HR_EVAL_MAX_POLICIES)
                return hr_error_set(err, HR_ERR_INVALID_ARG, "at most %d policies", HR_EVAL_MAX_POLICIES);
            hr_status st = hr_rt_policy_parse(tok, out[*n].label, sizeof out[*n].label, err);
            if (st) {
                hr_error_prefix(err, "--policy");
                return st;
            }
            snprintf(out[*n].text, sizeof out[*n].text, "%s", tok);
            (*n)++;
        }
    }
    if (*n == 0) {
        out[0] = (pol_text){.text = "", .label = "full"};
        *n = 1;
    }
    return HR_OK;
}

hr_status hr_eval_create(const hr_eval_params *p, hr_eval **out, hr_error *err) {
    hr_eval *ev = calloc(1, sizeof *ev);
    if (!ev) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    ev->p = *p;
    if (ev->p.block_size <= 0) ev->p.block_size = 16;
    hr_status st = parse_formats(p->formats, ev->fp, &ev->n_fmt, err);
    if (st == HR_OK) st = parse_policies(p->policies, p->n_policies, ev->pols, &ev->n_pol, err);
    if (st) {
        free(ev);
        return st;
    }
    ev->full = (pol_text){.text = "", .label = "full"};
    ev->n_arms = 1 + ev->n_fmt * ev->n_pol;
    *out = ev;
    return HR_OK;
}

void hr_eval_destroy(hr_eval *ev) {
    if (!ev) return;
    for (int i = 0; i < ev->n_arms; i++) hr_runtime_close(ev->arms[i].rt);
    hr_runtime_close(ev->base);
    free(ev->toks), free(ev->chunk), free(ev->ref_logits), free(ev->logits), free(ev->lp_ref), free(ev->lp);
    free(ev);
}

static char *read_text(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    size_t got;
    while (b && (got = fread(b + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) {
            char *nb = realloc(b, cap *= 2);
            if (!nb) free(b);
            b = nb;
        }
    }
    fclose(f);
    if (b) b[n] = 0;
    *len = n;
    return b;
}

/* An arm's runtime: one sequence of n_ctx, whole chunks of n_ctx tokens in one forward (tail buffers
 * sized for that step); then whether its pool can use its policy (after the model's own sliding window
 * is known). */
static hr_status arm_open(hr_eval *ev, arm *a, hr_error *err) {
    hr_runtime_params p = hr_runtime_default_params();
    p.n_ctx = ev->p.n_ctx;
    p.ctx_extend = true; /* checked against the trained context in hr_eval_open */
    p.k_format = a->f.k;
    p.v_format = a->f.v;
    p.block_size = ev->p.block_size;
    p.max_batch_tokens = ev->p.n_ctx;
    p.max_running = 1;
    p.n_threads = ev->p.n_threads;
    p.device = ev->p.device;
    hr_status st = hr_runtime_open_sibling(ev->base, &p, &a->rt, NULL, err);
    if (st) return st;
    a->bytes_per_token_x1000 = hr_runtime_budget(a->rt)->block_bytes * 1000 / (uint64_t)ev->p.block_size;
    return a->pol->text[0] ? hr_runtime_check_policy(a->rt, a->pol->text, err) : HR_OK;
}

/* The base runtime: the model and its tokenizer, and the smallest pool and forward context there are
 * (it never runs). */
static hr_status open_base(hr_eval *ev, hr_error *err) {
    hr_runtime_params p = hr_runtime_default_params();
    p.model_path = ev->p.model_path;
    p.n_ctx = 8;
    p.ctx_extend = true;
    p.max_batch_tokens = 8;
    p.max_running = 1;
    p.n_threads = 1;
    p.device = ev->p.device;
    hr_status st = hr_runtime_open(&p, &ev->base, NULL, err);
    if (st == HR_OK) hr_runtime_describe(ev->base, &ev->info);
    return st;
}

hr_status hr_eval_open(hr_eval *ev, const char *text_path, bool *bad_option, hr_error *err) {
    *bad_option = false;
    hr_status st = open_base(ev, err);
    if (st) return st;
    int n_ctx = ev->p.n_ctx;
    size_t text_len = 0;
    char *text = read_text(text_path, &text_len);
    if (!text) return hr_error_set(err, HR_ERR_IO, "cannot read '%s'", text_path);
    if (ev->info.n_ctx_train > 0 && n_ctx > ev->info.n_ctx_train) {
        free(text);
        *bad_option = true;
        return hr_error_set(err, HR_ERR_RANGE,
                            "--ctx %d exceeds the model's trained context (%d): positions past it are out of "
                            "distribution for RoPE, so the scores would measure that, not the KV format; use --ctx "
                            "<= %d",
                            n_ctx, ev->info.n_ctx_train, ev->info.n_ctx_train);
    }
    const hr_tokenizer *tok = hr_runtime_tokenizer(ev->base);
    hr_tokenize_opts to = {.add_bos = hr_tokenizer_bos(tok) >= 0};
    hr_error terr = {0};
    st = hr_tokenizer_encode(tok, text, text_len, &to, NULL, 0, &ev->n_tok, &terr);
    if (st == HR_OK && !(ev->toks = malloc(sizeof(int32_t) * (ev->n_tok + 1)))) st = HR_ERR_NOMEM;
    if (st == HR_OK) st = hr_tokenizer_encode(tok, text, text_len, &to, ev->toks, ev->n_tok, &ev->n_tok, &terr);
    free(text);
    if (st) return hr_error_set(err, st, "%s", terr.msg[0] ? terr.msg : "out of memory");
    ev->n_chunks = (int)(ev->n_tok / (size_t)n_ctx);
    if (ev->p.max_chunks && ev->n_chunks > ev->p.max_chunks) ev->n_chunks = ev->p.max_chunks;
    if (ev->n_chunks < 1)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "'%s' has %zu tokens, fewer than one chunk of %d (lower --ctx)",
                            text_path, ev->n_tok, n_ctx);
    int V = ev->info.n_vocab;
    ev->chunk = malloc(sizeof(int32_t) * n_ctx);
    ev->ref_logits = malloc(sizeof(float) * (size_t)n_ctx * V);
    ev->logits = malloc(sizeof(float) * (size_t)n_ctx * V);
    ev->lp_ref = malloc(sizeof(double) * V);
    ev->lp = malloc(sizeof(double) * V);
    if (!ev->chunk || !ev->ref_logits || !ev->logits || !ev->lp_ref || !ev->lp)
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    /* arm 0 is the f32 reference */
    ev->arms[0].f = (fmt_pair){.k = HR_RT_KV_F32, .v = HR_RT_KV_F32, .label = "f32 (ref)"};
    ev->arms[0].pol = &ev->full;
    for (int i = 0; i + 1 < ev->n_arms; i++) {
        ev->arms[i + 1].f = ev->fp[i / ev->n_pol];
        ev->arms[i + 1].pol = &ev->pols[i % ev->n_pol];
    }
    bool listed = strcmp(ev->p.formats, "all") != 0; /* formats named one by one must all work */
    for (int i = 0; i < ev->n_arms; i++) {
        hr_status ost = arm_open(ev, &ev->arms[i], err);
        if (ost == HR_OK) continue;
        bool usage_fault = ost != HR_ERR_NOMEM && ost != HR_ERR_IO && ost != HR_ERR_INTERNAL;
        if (i == 0 || (listed && usage_fault)) {
            *bad_option = usage_fault;
            return ost;
        }
        snprintf(ev->arms[i].error, sizeof ev->arms[i].error, "%s", err->msg);
        ev->arms[i].why = *err;
    }
    return HR_OK;
}

const char *hr_eval_model_name(const hr_eval *ev) { return ev->info.model; }
size_t hr_eval_n_tokens(const hr_eval *ev) { return ev->n_tok; }
int hr_eval_n_chunks(const hr_eval *ev) { return ev->n_chunks; }
int hr_eval_n_arms(const hr_eval *ev) { return ev->n_arms; }

/* log-softmax of one row into out (double) */
static void log_softmax(const float *l, int V, double *out) {
    double mx = l[0];
    for (int i = 1; i < V; i++) mx = fmax(mx, l[i]);
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp(l[i] - mx);
    double lse = mx + log(sum);
    for (int i = 0; i < V; i++) out[i] = l[i] - lse;
}

/* The first index of the largest logit (the sampler's greedy choice). */
static hr_status arm_score(arm *a, const int32_t *chunk, int n, float *logits, hr_error *err) {
    hr_rt_score sc;
    hr_status st = hr_runtime_score(a->rt, a->pol->text[0] ? a->pol->text : NULL, chunk, n, logits, &sc, err);
    if (st) return st;
    if (sc.kv_bytes > a->seq_bytes) a->seq_bytes = sc.kv_bytes;
    if (sc.tokens_kept > a->kept) a->kept = sc.tokens_kept;
    return HR_OK;
}

hr_status hr_eval_run_chunk(hr_eval *ev, int c, void (*on_arm)(void *ctx, int arm, const char *label), void *ctx,
                            hr_error *err) {
    int n_ctx = ev->p.n_ctx, V = ev->info.n_vocab, first = n_ctx / 2;
    int32_t *chunk = ev->chunk;
    memcpy(chunk, ev->toks + (size_t)c * n_ctx, sizeof(int32_t) * n_ctx);
    int32_t bos = hr_tokenizer_bos(hr_runtime_tokenizer(ev->base));
    if (bos >= 0) chunk[0] = bos;
    arm *ref = &ev->arms[0];
    hr_status st = arm_score(ref, chunk, n_ctx, ev->ref_logits, err);
    if (st) return st;
    for (int j = first; j < n_ctx - 1; j++) {
        log_softmax(ev->ref_logits + (size_t)j * V, V, ev->lp_ref);
        ref->nll -= ev->lp_ref[chunk[j + 1]];
        ref->n++;
    }
    if (on_arm) on_arm(ctx, 0, ref->f.label);
    for (int i = 1; i < ev->n_arms; i++) {
        arm *a = &ev->arms[i];
        if (a->error[0]) continue;
        hr_error aerr = {0};
        if (arm_score(a, chunk, n_ctx, ev->logits, &aerr)) {
            snprintf(a->error, sizeof a->error, "%s", aerr.msg);
            a->why = aerr;
            if (on_arm) on_arm(ctx, i, a->f.label);
            continue;
        }
        for (int j = first; j < n_ctx - 1; j++) {
            log_softmax(ev->ref_logits + (size_t)j * V, V, ev->lp_ref);
            log_softmax(ev->logits + (size_t)j * V, V, ev->lp);
            double kl = 0;
            for (int t = 0; t < V; t++) kl += exp(ev->lp_ref[t]) * (ev->lp_ref[t] - ev->lp[t]);
            a->kl += kl;
            a->nll -= ev->lp[chunk[j + 1]];
            a->agree += hr_rt_argmax(ev->ref_logits + (size_t)j * V, V) == hr_rt_argmax(ev->logits + (size_t)j * V, V);
            a->n++;
        }
        if (on_arm) on_arm(ctx, i, a->f.label);
    }
    return HR_OK;
}

void hr_eval_get_arm(const hr_eval *ev, int i, hr_eval_arm *out) {
    const arm *a = &ev->arms[i];
    *out = (hr_eval_arm){.label = a->f.label,
                         .k_format = hr_rt_kv_format_name(a->f.k),
                         .v_format = hr_rt_kv_format_name(a->f.v),
                         .policy = a->pol->label,
                         .error = a->error,
                         .why = a->error[0] ? &a->why : NULL,
                         .nll = a->nll,
                         .kl = a->kl,
                         .agree = a->agree,
                         .n = a->n,
                         .kv_bytes_per_token = a->bytes_per_token_x1000 / 1000.0,
                         .seq_bytes = a->seq_bytes,
                         .kept = a->kept};
}

/* cmd_eval.c: `headroom eval`: what a KV format does to quality, on the user's own text.
 *
 * Method (teacher-forced, as llama.cpp's perplexity tool): the text is tokenized once (BOS first)
 * and cut into chunks of --ctx tokens; each chunk's first token is replaced by BOS, the chunk runs
 * through the model in one forward pass, and the second half of its positions is scored (each
 * position predicts the next token, with at least ctx/2 tokens of context). The same chunk runs once
 * with an f32 cache (the reference) and once per format asked for; for each format we report
 * perplexity, its change against the reference, the mean KL divergence KL(P_ref || P_format) and the
 * top-1 agreement over the scored positions, and the KV bytes each token costs.
 *
 * Eviction policies (--policy): every format runs under every policy asked for. A policy only acts
 * between forward passes, so a policy arm runs each chunk as a prompt and a generation: the first
 * half in one forward (the prompt: snapkv compresses it at its end, h2o evicts down to its budget),
 * then the scored second half one token per forward, teacher-forced, the policy evicting after each.
 * Full arms run the chunk in one forward (the same logits: attention is chunk-invariant). The KV
 * bytes a sequence holds at the end of a chunk are reported too. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/errors.h"
#include "cli/options.h"
#include "common/util.h"
#include "model/model.h"
#include "runtime/runtime.h"
#include "sampler/sampler.h"
#include "tokenizer/tokenizer.h"

#define MAX_FORMATS  16
#define MAX_POLICIES 16

typedef struct fmt_pair {
    hr_kv_format k, v;
    char label[32];
} fmt_pair;

static bool parse_formats(const char *list, fmt_pair *out, int *n) {
    *n = 0;
    if (!strcmp(list, "all")) {
        for (int f = 0; f < HR_KV_FORMAT_COUNT; f++) {
            out[*n].k = out[*n].v = (hr_kv_format)f;
            snprintf(out[*n].label, sizeof out[*n].label, "%s", hr_kv_format_name((hr_kv_format)f));
            (*n)++;
        }
        return true;
    }
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (*n == MAX_FORMATS) {
            fprintf(stderr, "headroom eval: at most %d formats\n", MAX_FORMATS);
            return false;
        }
        char *slash = strchr(tok, '/');
        if (slash) *slash = 0;
        hr_error err;
        if (hr_kv_format_parse(tok, &out[*n].k, &err) ||
            hr_kv_format_parse(slash ? slash + 1 : tok, &out[*n].v, &err)) {
            fprintf(stderr, "headroom eval: --kv-type: %s\n", err.msg);
            return false;
        }
        if (slash)
            snprintf(out[*n].label, sizeof out[*n].label, "%s/%s", hr_kv_format_name(out[*n].k),
                     hr_kv_format_name(out[*n].v));
        else
            snprintf(out[*n].label, sizeof out[*n].label, "%s", hr_kv_format_name(out[*n].k));
        (*n)++;
    }
    return *n > 0;
}

/* One cache configuration under test: its pool, forward context and running sums. */
typedef struct arm {
    fmt_pair f;
    hr_kv_policy pol;
    char pol_label[48];
    uint64_t seq_bytes; /* the most KV bytes the sequence held at the end of a chunk */
    int n_vocab;
    int kept;       /* the most tokens one layer and KV head kept at the end of a chunk */
    hr_runtime *rt; /* owns kv and ctx */
    hr_kv_pool *kv;
    hr_model_ctx *ctx;
    double nll, kl;
    long agree, n;
    uint64_t bytes_per_token_x1000;
    char error[HR_CLI_ERROR_MAX];
} arm;

/* An arm's pool and forward context come from the runtime (the one composition root): one sequence of
 * n_ctx, whole chunks of n_ctx tokens in one forward (tail buffers sized for that step). eval drives
 * the forward pass itself (teacher forcing), not the runtime's engine. */
static hr_status arm_open(arm *a, const hr_model *m, int n_ctx, int block_size, int n_threads, hr_error *err) {
    a->n_vocab = hr_model_hparams(m)->n_vocab;
    hr_runtime_params p = hr_runtime_default_params();
    p.model = m;
    p.n_ctx = n_ctx;
    p.ctx_extend = true; /* checked against the trained context by the command itself */
    p.k_format = a->f.k;
    p.v_format = a->f.v;
    p.block_size = block_size;
    p.max_batch_tokens = n_ctx;
    p.max_running = 1;
    p.n_threads = n_threads;
    hr_status st = hr_runtime_open(&p, &a->rt, NULL, err);
    if (st) return st;
    a->kv = hr_runtime_kv(a->rt);
    a->ctx = hr_runtime_ctx(a->rt);
    const hr_kv_budget *bud = hr_runtime_budget(a->rt);
    a->bytes_per_token_x1000 = bud->block_bytes * 1000 / (uint64_t)block_size;
    return hr_kv_policy_check(a->kv, &a->pol, err); /* after the model's own sliding window is known */
}

static bool parse_policies(char **items, int n_items, hr_kv_policy *out, int *n) {
    *n = 0;
    for (int i = 0; i < n_items; i++) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", items[i]);
        for (char *save = NULL, *tok = strtok_r(buf, ";", &save); tok; tok = strtok_r(NULL, ";", &save)) {
            if (*n == MAX_POLICIES) {
                fprintf(stderr, "headroom eval: at most %d policies\n", MAX_POLICIES);
                return false;
            }
            hr_error err;
            if (hr_kv_policy_parse(tok, &out[*n], &err)) {
                fprintf(stderr, "headroom eval: --policy: %s\n", err.msg);
                return false;
            }
            (*n)++;
        }
    }
    if (*n == 0) out[(*n)++] = (hr_kv_policy){.kind = HR_KV_POLICY_FULL};
    return true;
}

static void arm_close(arm *a) {
    hr_runtime_close(a->rt);
    a->rt = NULL;
    a->kv = NULL;
    a->ctx = NULL;
}

/* Runs one chunk through an arm; logits for every position land in `logits` (n x V). */
static hr_status arm_forward(arm *a, const int32_t *toks, int n, float *logits, int32_t *pos, hr_kv_seq *seqs,
                             uint8_t *want, hr_error *err) {
    hr_kv_seq s;
    hr_status st = hr_kv_seq_create(a->kv, &s, err);
    if (st) return st;
    if ((st = hr_kv_seq_set_policy(a->kv, s, &a->pol, err))) goto out;
    for (int i = 0; i < n; i++) pos[i] = i, seqs[i] = s, want[i] = 1;
    if (a->pol.kind == HR_KV_POLICY_FULL) {
        hr_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .seq = seqs, .want_logits = want};
        if ((st = hr_kv_seq_reserve(a->kv, s, n, err)) || (st = hr_model_forward(a->ctx, &b, logits, err))) goto out;
        hr_kv_seq_commit(a->kv, s, toks, n);
    } else {
        /* the first half as a prompt, then one token per forward: the policy acts between them */
        int first = n / 2;
        hr_kv_seq_set_prompt_len(a->kv, s, first);
        memset(want, 0, (size_t)first);
        hr_batch b = {.n_tokens = first, .tokens = toks, .pos = pos, .seq = seqs, .want_logits = want};
        if ((st = hr_kv_seq_reserve(a->kv, s, first, err)) || (st = hr_model_forward(a->ctx, &b, NULL, err))) goto out;
        hr_kv_seq_commit(a->kv, s, toks, first);
        for (int i = first; i < n; i++) {
            hr_batch d = {.n_tokens = 1, .tokens = toks + i, .pos = pos + i, .seq = seqs, .want_logits = want + i};
            want[i] = 1;
            if ((st = hr_kv_seq_reserve(a->kv, s, i + 1, err)) ||
                (st = hr_model_forward(a->ctx, &d, logits + (size_t)i * a->n_vocab, err)))
                goto out;
            hr_kv_seq_commit(a->kv, s, toks + i, 1);
        }
    }
    hr_kv_seq_ledger l;
    if (hr_kv_seq_get_ledger(a->kv, s, &l, NULL) == HR_OK) {
        if (l.bytes_now > a->seq_bytes) a->seq_bytes = l.bytes_now;
        if (l.tokens_kept_max > a->kept) a->kept = l.tokens_kept_max;
    }
out:
    hr_kv_seq_free(a->kv, s);
    return st;
}

/* log-softmax of one row into out (double) */
static void log_softmax(const float *l, int V, double *out) {
    double mx = l[0];
    for (int i = 1; i < V; i++) mx = fmax(mx, l[i]);
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp(l[i] - mx);
    double lse = mx + log(sum);
    for (int i = 0; i < V; i++) out[i] = l[i] - lse;
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

/* Progress on stderr. On a terminal one line rewritten in place per chunk; otherwise (a log file, a
 * pipe, CI) whole lines: one at start, one at least every PROGRESS_EVERY_S seconds while a long chunk
 * or many formats run, and one at the end, so that a long eval is never silent. */
#define PROGRESS_EVERY_S 5.0

typedef struct progress {
    bool tty, quiet;
    int n_chunks, n_arms; /* arms including the f32 reference */
    double t0, last;
} progress;

static void progress_start(progress *p, size_t n_tok, int n_ctx) {
    p->t0 = p->last = hr_time_now();
    if (p->quiet || p->tty) return;
    fprintf(stderr, "headroom eval: %zu tokens, %d chunks of %d, %d caches each (f32 reference included)\n", n_tok,
            p->n_chunks, n_ctx, p->n_arms);
}

/* After arm i_arm (0-based) of chunk `c` (0-based) ran. */
static void progress_note(progress *p, int c, int i_arm, const char *label) {
    if (p->quiet) return;
    double now = hr_time_now();
    if (p->tty || now - p->last < PROGRESS_EVERY_S) return;
    p->last = now;
    fprintf(stderr, "headroom eval: chunk %d/%d, cache %d/%d (%s) done, %.0f s elapsed\n", c + 1, p->n_chunks,
            i_arm + 1, p->n_arms, label, now - p->t0);
}

/* After every arm ran chunk c. */
static void progress_chunk(const progress *p, int c) {
    if (!p->quiet && p->tty) fprintf(stderr, "\rchunk %d/%d", c + 1, p->n_chunks);
}

static void progress_end(progress *p) {
    if (p->quiet) return;
    if (p->tty)
        fprintf(stderr, "\n");
    else
        fprintf(stderr, "headroom eval: %d/%d chunks done in %.1f s\n", p->n_chunks, p->n_chunks,
                hr_time_now() - p->t0);
}

int hr_cmd_eval(int argc, char **argv) {
    hr_eval_cli_opts eo = {0};
    hr_opt_dsts dst = {.p[HR_DST_EVAL] = &eo};
    hr_opts_defaults(HR_CMD_EVAL, &dst);
    const char *text_path = NULL;
    for (int i = 1; i < argc; i++) {
        const hr_opt *row;
        const char *a = argv[i], *v;
        switch (hr_opts_parse(HR_CMD_EVAL, "eval", &dst, argc, argv, &i, &row, &v)) {
        case HR_OPT_STORED: continue;
        case HR_OPT_CALLER: continue; /* eval has no such row */
        case HR_OPT_BAD: return HR_EXIT_USAGE;
        case HR_OPT_HELP: hr_opts_print_help(HR_CMD_EVAL, stdout); return HR_EXIT_OK;
        case HR_OPT_UNKNOWN: break;
        }
        if (a[0] == '-' && a[1]) {
            fprintf(stderr, "headroom eval: unknown option '%s' (see headroom eval --help)\n", a);
            return HR_EXIT_USAGE;
        } else if (!text_path) {
            text_path = a;
        } else {
            fprintf(stderr, "headroom eval: more than one text file ('%s' and '%s')\n", text_path, a);
            return HR_EXIT_USAGE;
        }
    }
    const char *model_path = eo.model_path, *formats = eo.formats;
    int n_ctx = eo.n_ctx, max_chunks = eo.max_chunks, block_size = eo.block_size, n_threads = eo.n_threads;
    bool json = eo.json, quiet = eo.quiet;
    if (!model_path || !text_path) {
        fprintf(stderr, "headroom eval: needs -m FILE.gguf and a TEXT_FILE (see headroom eval --help)\n");
        return HR_EXIT_USAGE;
    }
    fmt_pair fp[MAX_FORMATS];
    int n_fmt = 0;
    if (!parse_formats(formats, fp, &n_fmt)) return HR_EXIT_USAGE;
    hr_kv_policy pols[MAX_POLICIES];
    int n_pol = 0;
    if (!parse_policies((char **)eo.policy_args, eo.n_policy_args, pols, &n_pol)) return HR_EXIT_USAGE;
    int n_arms = n_fmt * n_pol; /* arms 1..n_arms: format-major, then policy */
    if (!hr_arg_regular_file("eval", "TEXT_FILE", text_path)) return HR_EXIT_FAIL;

    hr_error err = {0};
    hr_model *m = NULL;
    hr_tokenizer *tok = NULL;
    if (hr_model_load(model_path, &m, &err) || hr_tokenizer_load(hr_model_gguf(m), &tok, &err)) {
        fprintf(stderr, "headroom eval: %s\n", HR_CLI_ERROR(&err));
        hr_model_destroy(m);
        return HR_EXIT_FAIL;
    }
    const hr_hparams *hp = hr_model_hparams(m);
    int rc = HR_EXIT_FAIL;
    size_t text_len = 0, n_tok = 0;
    char *text = read_text(text_path, &text_len);
    int32_t *toks = NULL, *pos = NULL;
    hr_kv_seq *seqs = NULL;
    uint8_t *want = NULL;
    float *ref_logits = NULL, *logits = NULL;
    double *lp_ref = NULL, *lp = NULL;
    static arm arms[MAX_FORMATS * MAX_POLICIES + 1];
    memset(arms, 0, sizeof arms);
    if (!text) {
        fprintf(stderr, "headroom eval: cannot read '%s'\n", text_path);
        goto done;
    }
    if (hp->n_ctx_train > 0 && n_ctx > hp->n_ctx_train) {
        fprintf(stderr,
                "headroom eval: --ctx %d exceeds the model's trained context (%d): positions past it are out of "
                "distribution for RoPE, so the scores would measure that, not the KV format; use --ctx <= %d\n",
                n_ctx, hp->n_ctx_train, hp->n_ctx_train);
        rc = HR_EXIT_USAGE;
        goto done;
    }
    hr_tokenize_opts to = {.add_bos = hr_tokenizer_bos(tok) >= 0};
    if (hr_tokenizer_encode(tok, text, text_len, &to, NULL, 0, &n_tok, &err) ||
        !(toks = malloc(sizeof(int32_t) * (n_tok + 1))) ||
        hr_tokenizer_encode(tok, text, text_len, &to, toks, n_tok, &n_tok, &err)) {
        fprintf(stderr, "headroom eval: %s\n", err.msg[0] ? err.msg : "out of memory");
        goto done;
    }
    int n_chunks = (int)(n_tok / (size_t)n_ctx);
    if (max_chunks && n_chunks > max_chunks) n_chunks = max_chunks;
    if (n_chunks < 1) {
        fprintf(stderr, "headroom eval: '%s' has %zu tokens, fewer than one chunk of %d (lower --ctx)\n", text_path,
                n_tok, n_ctx);
        goto done;
    }
    int V = hp->n_vocab, first = n_ctx / 2;
    pos = malloc(sizeof(int32_t) * n_ctx);
    seqs = malloc(sizeof(hr_kv_seq) * n_ctx);
    want = malloc((size_t)n_ctx);
    ref_logits = malloc(sizeof(float) * (size_t)n_ctx * V);
    logits = malloc(sizeof(float) * (size_t)n_ctx * V);
    lp_ref = malloc(sizeof(double) * V);
    lp = malloc(sizeof(double) * V);
    if (!pos || !seqs || !want || !ref_logits || !logits || !lp_ref || !lp) {
        fprintf(stderr, "headroom eval: out of memory\n");
        goto done;
    }
    /* arm 0 is the f32 reference */
    arms[0].f = (fmt_pair){.k = HR_KV_F32, .v = HR_KV_F32, .label = "f32 (ref)"};
    arms[0].pol = (hr_kv_policy){.kind = HR_KV_POLICY_FULL};
    for (int i = 0; i < n_arms; i++) {
        arms[i + 1].f = fp[i / n_pol];
        arms[i + 1].pol = pols[i % n_pol];
    }
    for (int i = 0; i <= n_arms; i++) hr_kv_policy_str(&arms[i].pol, arms[i].pol_label, sizeof arms[i].pol_label);
    bool listed = strcmp(formats, "all") != 0; /* formats named one by one must all work */
    for (int i = 0; i <= n_arms; i++) {
        hr_status ost = arm_open(&arms[i], m, n_ctx, block_size, n_threads, &err);
        if (ost == HR_OK) continue;
        bool usage_fault = ost != HR_ERR_NOMEM && ost != HR_ERR_IO && ost != HR_ERR_INTERNAL;
        if (i == 0 || (listed && usage_fault)) {
            fprintf(stderr, "headroom eval: %s\n", HR_CLI_ERROR(&err));
            if (usage_fault) rc = HR_EXIT_USAGE;
            goto done;
        }
        snprintf(arms[i].error, sizeof arms[i].error, "%s", HR_CLI_ERROR(&err));
    }
    progress prog = {
        .tty = isatty(2), .quiet = quiet || (json && isatty(2)), .n_chunks = n_chunks, .n_arms = n_arms + 1};
    progress_start(&prog, n_tok, n_ctx);
    int32_t bos = hr_tokenizer_bos(tok);
    int32_t *chunk = malloc(sizeof(int32_t) * n_ctx);
    if (!chunk) goto done;
    for (int c = 0; c < n_chunks; c++) {
        memcpy(chunk, toks + (size_t)c * n_ctx, sizeof(int32_t) * n_ctx);
        if (bos >= 0) chunk[0] = bos;
        if (arm_forward(&arms[0], chunk, n_ctx, ref_logits, pos, seqs, want, &err)) {
            fprintf(stderr, "headroom eval: %s\n", HR_CLI_ERROR(&err));
            free(chunk);
            goto done;
        }
        for (int j = first; j < n_ctx - 1; j++) {
            log_softmax(ref_logits + (size_t)j * V, V, lp_ref);
            arms[0].nll -= lp_ref[chunk[j + 1]];
            arms[0].n++;
        }
        progress_note(&prog, c, 0, arms[0].f.label);
        for (int i = 1; i <= n_arms; i++) {
            arm *a = &arms[i];
            if (a->error[0]) continue;
            if (arm_forward(a, chunk, n_ctx, logits, pos, seqs, want, &err)) {
                snprintf(a->error, sizeof a->error, "%s", HR_CLI_ERROR(&err));
                progress_note(&prog, c, i, a->f.label);
                continue;
            }
            for (int j = first; j < n_ctx - 1; j++) {
                log_softmax(ref_logits + (size_t)j * V, V, lp_ref);
                log_softmax(logits + (size_t)j * V, V, lp);
                double kl = 0;
                for (int t = 0; t < V; t++) kl += exp(lp_ref[t]) * (lp_ref[t] - lp[t]);
                a->kl += kl;
                a->nll -= lp[chunk[j + 1]];
                a->agree += hr_argmax(ref_logits + (size_t)j * V, V) == hr_argmax(logits + (size_t)j * V, V);
                a->n++;
            }
            progress_note(&prog, c, i, a->f.label);
        }
        progress_chunk(&prog, c);
    }
    free(chunk);
    progress_end(&prog);
    double ref_ppl = exp(arms[0].nll / (double)arms[0].n);
    if (json) {
        json_t *root = json_object(), *res = json_array();
        json_object_set_new(root, "model", json_string(hp->name));
        json_object_set_new(root, "text", json_string(text_path));
        json_object_set_new(root, "chunk_tokens", json_integer(n_ctx));
        json_object_set_new(root, "chunks", json_integer(n_chunks));
        json_object_set_new(root, "tokens_scored", json_integer(arms[0].n));
        json_object_set_new(root, "perplexity_f32", json_real(ref_ppl));
        for (int i = 0; i <= n_arms; i++) {
            arm *a = &arms[i];
            json_t *o = json_object();
            json_object_set_new(o, "kv_type", json_string(i == 0 ? "f32" : a->f.label));
            json_object_set_new(o, "kv_type_k", json_string(hr_kv_format_name(a->f.k)));
            json_object_set_new(o, "kv_type_v", json_string(hr_kv_format_name(a->f.v)));
            json_object_set_new(o, "policy", json_string(a->pol_label));
            if (a->error[0]) {
                json_object_set_new(o, "error", json_string(a->error));
            } else {
                double ppl = exp(a->nll / (double)a->n);
                json_object_set_new(o, "perplexity", json_real(ppl));
                json_object_set_new(o, "perplexity_change_pct", json_real(100.0 * (ppl / ref_ppl - 1.0)));
                json_object_set_new(o, "kl_mean", json_real(i == 0 ? 0.0 : a->kl / (double)a->n));
                json_object_set_new(o, "top1_agreement", json_real(i == 0 ? 1.0 : (double)a->agree / (double)a->n));
                json_object_set_new(o, "kv_bytes_per_token", json_real(a->bytes_per_token_x1000 / 1000.0));
                json_object_set_new(o, "kv_bytes_per_seq", json_integer((json_int_t)a->seq_bytes));
                json_object_set_new(o, "tokens_kept", json_integer(a->kept));
            }
            json_array_append_new(res, o);
        }
        json_object_set_new(root, "results", res);
        char *s = json_dumps(root, JSON_INDENT(1));
        printf("%s\n", s);
        free(s);
        json_decref(root);
    } else {
        printf("%s: %d chunks of %d tokens, %ld tokens scored\n", text_path, n_chunks, n_ctx, arms[0].n);
        printf("%-12s %-20s %12s %10s %6s %11s %9s %11s %10s\n", "kv type", "policy", "bytes/token", "bytes/seq",
               "kept", "perplexity", "change", "mean KL", "top-1 agree");
        for (int i = 0; i <= n_arms; i++) {
            arm *a = &arms[i];
            if (a->error[0]) {
                printf("%-12s %-20s unavailable: %s\n", a->f.label, a->pol_label, a->error);
                continue;
            }
            double ppl = exp(a->nll / (double)a->n);
            printf("%-12s %-20s %12.1f %10llu %6d %11.4f %+8.2f%% %11.6f %9.2f%%\n", a->f.label, a->pol_label,
                   a->bytes_per_token_x1000 / 1000.0, (unsigned long long)a->seq_bytes, a->kept, ppl,
                   100.0 * (ppl / ref_ppl - 1.0), i == 0 ? 0.0 : a->kl / (double)a->n,
                   i == 0 ? 100.0 : 100.0 * (double)a->agree / (double)a->n);
        }
    }
    rc = HR_EXIT_OK;
done:
    for (int i = 0; i <= n_arms; i++) arm_close(&arms[i]);
    free(text), free(toks), free(pos), free(seqs), free(want), free(ref_logits), free(logits), free(lp_ref), free(lp);
    hr_tokenizer_destroy(tok);
    hr_model_destroy(m);
    return rc;
}

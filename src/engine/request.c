/* request.c: a request's life outside the scheduler: creation from its parameters, the output channel
 * the engine writes under the request's lock and consumers read (copying) under the same lock, the
 * final record, and reference counting (the engine holds one reference until the request is final,
 * the submitter one until hr_request_release). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine_internal.h"

/* ---- names ------------------------------------------------------------------------------------- */

const char *hr_request_state_name(hr_request_state s) {
    static const char *n[] = {"waiting", "running", "preempted", "completed", "cancelled", "failed"};
    return (unsigned)s < HR_ARRAY_LEN(n) ? n[s] : "?";
}

const char *hr_finish_reason_name(hr_finish_reason f) {
    static const char *n[] = {"none", "length", "stop", "stop", "cancelled", "error"};
    return (unsigned)f < HR_ARRAY_LEN(n) ? n[f] : "?";
}

/* ---- sorted lists ------------------------------------------------------------------------------ */

bool req_before(const hr_request *a, const hr_request *b) {
    if (a->priority != b->priority) return a->priority > b->priority;
    return a->arrival < b->arrival;
}

hr_status list_insert(hr_req_list *l, hr_request *r) {
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 16;
        hr_request **v = realloc(l->v, sizeof *v * (size_t)cap);
        if (!v) return HR_ERR_NOMEM;
        l->v = v;
        l->cap = cap;
    }
    int i = l->n;
    while (i > 0 && req_before(r, l->v[i - 1])) {
        l->v[i] = l->v[i - 1];
        i--;
    }
    l->v[i] = r;
    l->n++;
    return HR_OK;
}

void list_remove_at(hr_req_list *l, int i) {
    memmove(l->v + i, l->v + i + 1, sizeof *l->v * (size_t)(l->n - i - 1));
    l->n--;
}

int list_find(const hr_req_list *l, const hr_request *r) {
    for (int i = 0; i < l->n; i++)
        if (l->v[i] == r) return i;
    return -1;
}

/* ---- groups ------------------------------------------------------------------------------------ */

static void group_leave(hr_request *r) {
    hr_req_group *g = atomic_load(&r->group);
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < g->n_members; i++)
        if (g->members[i] == r) {
            g->members[i] = g->members[--g->n_members];
            break;
        }
    pthread_mutex_unlock(&g->mu);
    if (atomic_fetch_sub(&g->refs, 1) == 1) {
        pthread_mutex_destroy(&g->mu);
        free(g);
    }
}

/* Puts r in with's group, creating it (with `with` as its first member) on the first join. r is not
 * visible to the engine yet; `with` may be, so its group pointer is set once, atomically. */
static hr_status group_join(hr_request *r, hr_request *with, hr_error *err) {
    hr_req_group *g = atomic_load(&with->group);
    if (!g) {
        hr_req_group *fresh = calloc(1, sizeof *fresh);
        if (!fresh)
            return hr_error_set_param(err, HR_ERR_NOMEM, HR_PARAM_MAX_TOKENS, NULL,
                                      "out of memory creating a request group");
        pthread_mutex_init(&fresh->mu, NULL);
        atomic_init(&fresh->refs, 1);
        fresh->members[fresh->n_members++] = with;
        if (atomic_compare_exchange_strong(&with->group, &g, fresh)) {
            g = fresh;
        } else { /* another submitter grouped `with` first: join that group */
            pthread_mutex_destroy(&fresh->mu);
            free(fresh);
        }
    }
    pthread_mutex_lock(&g->mu);
    bool room = g->n_members < HR_ENGINE_MAX_GROUP;
    if (room) {
        g->members[g->n_members++] = r;
        atomic_fetch_add(&g->refs, 1);
    }
    pthread_mutex_unlock(&g->mu);
    if (!room)
        return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_CHOICES, NULL,
                                  "a request group holds at most %d requests", HR_ENGINE_MAX_GROUP);
    atomic_store(&r->group, g);
    return HR_OK;
}

bool hr_request_group_kv(hr_request *r, int *blocks_peak, int *blocks_final) {
    hr_req_group *g = atomic_load(&r->group);
    if (!g) return false;
    pthread_mutex_lock(&g->mu);
    *blocks_peak = g->blocks_peak;
    *blocks_final = g->blocks_final ? g->blocks_final : g->blocks_now;
    pthread_mutex_unlock(&g->mu);
    return true;
}

/* ---- creation ---------------------------------------------------------------------------------- */

/* ---- creation ---------------------------------------------------------------------------------- */

static void req_free(hr_request *r) {
    group_leave(r);
    hr_sampler_destroy(r->sampler);
    hr_grammar_release(r->grammar); /* the matcher went at finish, on the engine thread */
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->tokens);
    free(r->text);
    free(r->gap);
    free(r->lp);
    free(r->top_id);
    free(r->top_lp);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

/* A request's buffers, one size each: req_create allocates exactly these, hr_request_buffer_bytes
 * adds them up. Its known tokens (prompt and output), the per-token gaps, the text (grows with the
 * output from this first size), log-probabilities when asked for. */
#define REQ_ELEM(field) sizeof(((const hr_request *)0)->field[0])
#define REQ_TEXT_FIRST  64
typedef struct req_sizes {
    size_t tokens, gap, text, lp, top_id, top_lp;
} req_sizes;

static void req_sizes_of(const hr_request_params *p, req_sizes *z) {
    size_t n = (size_t)HR_MAX(0, p->n_prompt), m = (size_t)HR_MAX(0, p->max_tokens);
    size_t top = p->logprobs ? (size_t)HR_MAX(0, p->top_logprobs) : 0;
    *z = (req_sizes){.tokens = (n + m) * REQ_ELEM(tokens),
                     .gap = m * REQ_ELEM(gap),
                     .text = REQ_TEXT_FIRST,
                     .lp = p->logprobs ? m * REQ_ELEM(lp) : 0,
                     .top_id = m * top * REQ_ELEM(top_id),
                     .top_lp = m * top * REQ_ELEM(top_lp)};
}

uint64_t hr_request_buffer_bytes(const hr_request_params *p, int n_vocab) {
    req_sizes z;
    req_sizes_of(p, &z);
    return sizeof(hr_request) + z.tokens + z.gap + z.text + z.lp + z.top_id + z.top_lp +
           hr_sampler_bytes(&p->sampling, n_vocab);
}

hr_status req_create(hr_engine *e, const hr_request_params *p, hr_request *group_with, hr_request **out,
                     hr_error *err) {
    hr_request *r = calloc(1, sizeof *r);
    if (!r) return hr_error_set_param(err, HR_ERR_NOMEM, HR_PARAM_MAX_TOKENS, NULL, "out of memory creating a request");
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    atomic_init(&r->refs, 2);
    atomic_init(&r->cancel, 0);
    r->priority = p->priority;
    r->state = HR_REQ_WAITING;
    r->n_prompt = r->n_known = r->n_out = p->n_prompt;
    r->max_tokens = p->max_tokens;
    r->seq = -1;
    r->ignore_eos = p->ignore_eos;
    r->cache_scope = p->cache_scope;
    r->grammar = hr_grammar_retain(p->grammar);
    if (p->kv_policy) {
        r->has_policy = true;
        r->policy = *p->kv_policy;
        r->span = hr_kv_policy_span(p->kv_policy);
    }
    req_sizes z; /* what hr_request_buffer_bytes counts */
    req_sizes_of(p, &z);
    r->tokens = malloc(z.tokens);
    r->text = calloc(1, z.text);
    r->text_cap = z.text;
    if (p->logprobs) {
        r->n_top = p->top_logprobs;
        r->lp = malloc(z.lp);
        if (r->n_top > 0) {
            r->top_id = malloc(z.top_id);
            r->top_lp = malloc(z.top_lp);
        }
    }
    bool lp_ok = !p->logprobs || (r->lp && (r->n_top == 0 || (r->top_id && r->top_lp)));
    r->gap = malloc(z.gap);
    hr_status st =
        (r->tokens && r->text && r->gap && lp_ok)
            ? HR_OK
            : hr_error_set_param(err, HR_ERR_NOMEM, HR_PARAM_MAX_TOKENS, NULL, "out of memory creating a request");
    if (st == HR_OK) st = hr_sampler_create(&p->sampling, e->n_vocab, &r->sampler, err);
    if (st == HR_OK && group_with) st = group_join(r, group_with, err);
    for (int i = 0; st == HR_OK && i < p->n_stop; i++) {
        if (!(r->stop[i] = strdup(p->stop[i]))) st = hr_error_set(err, HR_ERR_NOMEM, "out of memory");
        r->n_stop = i + 1;
        r->max_stop_len = HR_MAX(r->max_stop_len, strlen(p->stop[i]));
    }
    if (st != HR_OK) {
        req_free(r);
        return st;
    }
    memcpy(r->tokens, p->prompt, sizeof(int32_t) * (size_t)p->n_prompt);
    hr_detok_init(&r->detok);
    r->detok.at_start = false; /* a completion continues its prompt: keep the first token's space */
    r->stats.state = HR_REQ_WAITING;
    r->stats.n_prompt = p->n_prompt;
    r->stats.priority = p->priority;
    r->stats.t_submit = hr_time_now();
    r->stats.kv.k_format = hr_kv_pool_config(e->p.kv)->k_format;
    r->stats.kv.v_format = hr_kv_pool_config(e->p.kv)->v_format;
    *out = r;
    return HR_OK;
}

void req_unref(hr_request *r) {
    if (r && atomic_fetch_sub(&r->refs, 1) == 1) req_free(r);
}

void hr_request_release(hr_request *r) { req_unref(r); }

/* ---- output, written by the engine ------------------------------------------------------------- */

static bool text_append(hr_request *r, const char *p, size_t n) {
    if (r->text_len + n + 1 > r->text_cap) {
        size_t cap = r->text_cap * 2 + n;
        char *t = realloc(r->text, cap);
        if (!t) return false;
        r->text = t;
        r->text_cap = cap;
    }
    memcpy(r->text + r->text_len, p, n);
    r->text_len += n;
    r->text[r->text_len] = '\0';
    return true;
}

/* The earliest stop string at or after `from`, or -1. */
static long find_stop(const hr_request *r, size_t from) {
    long best = -1;
    for (int i = 0; i < r->n_stop; i++) {
        const char *p = strstr(r->text + from, r->stop[i]);
        if (p && (best < 0 || p - r->text < best)) best = p - r->text;
    }
    return best;
}

/* Publishes text that can no longer become part of a stop string, cut on a UTF-8 boundary. */
static void publish_safe_text(hr_request *r) {
    size_t hold = r->max_stop_len ? r->max_stop_len - 1 : 0;
    size_t safe = r->text_len > hold ? r->text_len - hold : 0;
    while (safe > r->text_pub && safe < r->text_len && ((unsigned char)r->text[safe] & 0xC0) == 0x80) safe--;
    if (safe > r->text_pub) r->text_pub = safe;
}

bool req_push_token(hr_request *r, const hr_tokenizer *tok, int32_t token) {
    bool stopped = false;
    pthread_mutex_lock(&r->mu);
    double now = hr_time_now();
    int i_out = r->n_known - r->n_prompt;
    if (i_out < r->max_tokens) r->gap[i_out] = i_out == 0 ? 0.0f : (float)(now - r->t_last);
    r->t_last = now;
    r->tokens[r->n_known++] = token;
    r->n_out = r->n_known;
    r->stats.n_output = r->n_known - r->n_prompt;
    if (r->stats.t_first_token == 0) r->stats.t_first_token = now;
    if (tok) {
        char piece[512];
        size_t pn = hr_detok_push(tok, &r->detok, token, piece, sizeof piece);
        size_t before = r->text_len;
        if (pn && !text_append(r, piece, pn)) pn = 0; /* out of memory: the text loses a piece, ids don't */
        if (r->n_stop) {
            size_t from = before > r->max_stop_len ? before - r->max_stop_len : 0;
            long at = find_stop(r, from);
            if (at >= 0) {
                r->text_len = (size_t)at;
                r->text[at] = '\0';
                stopped = true;
            }
        }
        if (!stopped) publish_safe_text(r);
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return stopped;
}

void req_finish(hr_request *r, const hr_tokenizer *tok, hr_request_state state, hr_finish_reason why, hr_status code,
                const char *msg) {
    pthread_mutex_lock(&r->mu);
    if (tok && why != HR_FINISH_STOP) {
        char piece[64];
        size_t pn = hr_detok_flush(tok, &r->detok, piece, sizeof piece);
        if (pn) text_append(r, piece, pn);
    }
    r->text_pub = r->text_len;
    r->state = state;
    r->stats.state = state;
    r->stats.finish = why;
    r->stats.error_code = code;
    if (msg) snprintf(r->stats.error, sizeof r->stats.error, "%s", msg);
    r->stats.t_finish = hr_time_now();
    r->final = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* ---- consumers --------------------------------------------------------------------------------- */

void hr_request_read(hr_request *r, int32_t *tokens, int tokens_cap, char *text, size_t text_cap, hr_request_delta *d) {
    memset(d, 0, sizeof *d);
    pthread_mutex_lock(&r->mu);
    int avail = r->n_out - r->n_prompt - r->read_tokens;
    int nt = HR_MIN(avail, tokens_cap);
    if (nt > 0) {
        memcpy(tokens, r->tokens + r->n_prompt + r->read_tokens, sizeof(int32_t) * (size_t)nt);
        r->read_tokens += nt;
        d->n_tokens = nt;
    }
    if (text_cap > 0) {
        size_t nx = HR_MIN(r->text_pub - r->read_text, text_cap - 1);
        /* do not split a UTF-8 character across reads */
        while (nx > 0 && r->read_text + nx < r->text_pub && ((unsigned char)r->text[r->read_text + nx] & 0xC0) == 0x80)
            nx--;
        memcpy(text, r->text + r->read_text, nx);
        text[nx] = '\0';
        r->read_text += nx;
        d->n_text = nx;
    }
    bool tokens_done = tokens_cap > 0 ? r->read_tokens == r->n_out - r->n_prompt : true;
    bool text_done = text_cap > 0 ? r->read_text == r->text_pub : true;
    d->done = r->final && tokens_done && text_done;
    pthread_mutex_unlock(&r->mu);
}

static bool has_unread(const hr_request *r) {
    return r->final || r->read_tokens < r->n_out - r->n_prompt || r->read_text < r->text_pub;
}

bool hr_request_wait(hr_request *r, double timeout_s) {
    pthread_mutex_lock(&r->mu);
    if (timeout_s < 0) {
        while (!has_unread(r)) pthread_cond_wait(&r->cv, &r->mu);
    } else if (!has_unread(r)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double t = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + timeout_s;
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        while (!has_unread(r))
            if (pthread_cond_timedwait(&r->cv, &r->mu, &ts) != 0) break;
    }
    bool ok = has_unread(r);
    pthread_mutex_unlock(&r->mu);
    return ok;
}

void hr_request_wait_done(hr_request *r) {
    pthread_mutex_lock(&r->mu);
    while (!r->final) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

void hr_request_get_stats(hr_request *r, hr_request_stats *out) {
    pthread_mutex_lock(&r->mu);
    *out = r->stats;
    pthread_mutex_unlock(&r->mu);
}

const int32_t *hr_request_output(hr_request *r, int *n_tokens) {
    pthread_mutex_lock(&r->mu);
    *n_tokens = r->n_out - r->n_prompt;
    pthread_mutex_unlock(&r->mu);
    return r->tokens + r->n_prompt;
}

const char *hr_request_text(hr_request *r, size_t *n_bytes) {
    pthread_mutex_lock(&r->mu);
    *n_bytes = r->text_pub;
    const char *t = r->text;
    pthread_mutex_unlock(&r->mu);
    return t;
}

int hr_request_logprobs(hr_request *r, int from, int n, float *lp, int32_t *top_ids, float *top_lp) {
    pthread_mutex_lock(&r->mu);
    int have = r->lp ? r->n_out - r->n_prompt : 0;
    int k = from < 0 ? 0 : HR_MAX(0, HR_MIN(n, have - from));
    for (int i = 0; i < k; i++) {
        if (lp) lp[i] = r->lp[from + i];
        for (int j = 0; j < r->n_top; j++) {
            size_t src = (size_t)(from + i) * r->n_top + j, dst = (size_t)i * r->n_top + j;
            if (top_ids) top_ids[dst] = r->top_id[src];
            if (top_lp) top_lp[dst] = r->top_lp[src];
        }
    }
    pthread_mutex_unlock(&r->mu);
    return k;
}

int hr_request_token_gaps(hr_request *r, float *gaps, int cap) {
    pthread_mutex_lock(&r->mu);
    int n = HR_MAX(0, HR_MIN(cap, r->n_out - r->n_prompt - 1));
    for (int i = 0; i < n; i++) gaps[i] = r->gap[i + 1];
    pthread_mutex_unlock(&r->mu);
    return n;
}

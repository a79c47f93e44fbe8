/* sampler.c: see sampler.h for the order of operations. Candidates are kept as (id, logit) pairs
 * sorted by logit (descending, id ascending on ties) only as far as top-k needs, so sampling over a
 * 150k vocabulary costs one partial sort, not a full one. */
#include "sampler/sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "sampler/scan.h"

typedef hr_scan_cand cand;

struct hr_sampler {
    hr_sampler_params p;
    int n_vocab;
    hr_rng rng;
    cand *cands;      /* (n_vocab) */
    float *work;      /* (n_vocab) penalized logits */
    int32_t *history; /* ring of the last hist_cap tokens */
    int hist_cap, hist_len, hist_head;
    uint16_t *counts;  /* (n_vocab) occurrences within the window, rebuilt per sample */
    int32_t *bias_ids; /* (p.n_bias) owned copies of the logit bias */
    float *bias_values;
};

hr_sampler_params hr_sampler_default_params(void) {
    return (hr_sampler_params){.temperature = 0.0f,
                               .top_k = 40,
                               .top_p = 0.95f,
                               .min_p = 0.05f,
                               .repeat_penalty = 1.0f,
                               .presence_penalty = 0.0f,
                               .frequency_penalty = 0.0f,
                               .penalty_last_n = 64,
                               .seed = 0};
}

/* A number as an error's offending value (hr_error.value). */
static const char *num_text(double x, char v[32]) {
    snprintf(v, 32, "%g", x);
    return v;
}

hr_status hr_sampler_params_check(const hr_sampler_params *p, hr_error *err) {
    char v[32];
    if (!(p->temperature >= 0.0f) || p->temperature > 100.0f) /* NaN fails the first test */
        return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_TEMPERATURE, num_text(p->temperature, v),
                                  "temperature %g is outside [0, 100]", p->temperature);
    if (!(p->top_p > 0.0f) || p->top_p > 1.0f)
        return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_TOP_P, num_text(p->top_p, v),
                                  "top-p %g is outside (0, 1]", p->top_p);
    if (!(p->min_p >= 0.0f) || p->min_p > 1.0f)
        return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_MIN_P, num_text(p->min_p, v),
                                  "min-p %g is outside [0, 1]", p->min_p);
    if (!(p->repeat_penalty > 0.0f) || p->repeat_penalty > 100.0f)
        return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_REPEAT_PENALTY, num_text(p->repeat_penalty, v),
                                  "repeat penalty %g is outside (0, 100]", p->repeat_penalty);
    if (!isfinite(p->presence_penalty) || fabsf(p->presence_penalty) > 2.0f)
        return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_PRESENCE_PENALTY, num_text(p->presence_penalty, v),
                                  "presence penalty %g is outside [-2, 2]", p->presence_penalty);
    if (!isfinite(p->frequency_penalty) || fabsf(p->frequency_penalty) > 2.0f)
        return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_FREQUENCY_PENALTY,
                                  num_text(p->frequency_penalty, v), "frequency penalty %g is outside [-2, 2]",
                                  p->frequency_penalty);
    if (p->penalty_last_n < -1 || p->penalty_last_n > (1 << 20))
        return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_PENALTY_WINDOW, num_text(p->penalty_last_n, v),
                                  "penalty window %d is outside [-1, 1048576]", p->penalty_last_n);
    if (p->n_bias < 0 || p->n_bias > HR_SAMPLER_MAX_BIAS || (p->n_bias > 0 && (!p->bias_ids || !p->bias_values)))
        return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_LOGIT_BIAS, num_text(p->n_bias, v),
                                  "logit bias holds %d entries: at most %d", p->n_bias, HR_SAMPLER_MAX_BIAS);
    for (int i = 0; i < p->n_bias; i++)
        if (!(p->bias_values[i] >= -100.0f && p->bias_values[i] <= 100.0f))
            return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_LOGIT_BIAS, num_text(p->bias_values[i], v),
                                      "logit bias for token %d is %g: outside [-100, 100]", (int)p->bias_ids[i],
                                      p->bias_values[i]);
    return HR_OK;
}

/* The sampler's buffers, one size each: create allocates exactly these, hr_sampler_bytes adds them up. */
#define SMP_ELEM(field) sizeof(((const hr_sampler *)0)->field[0])
typedef struct smp_sizes {
    int hist_cap;
    size_t cands, work, history, counts, bias_ids, bias_values;
} smp_sizes;

static void smp_sizes_of(const hr_sampler_params *p, int n_vocab, smp_sizes *z) {
    size_t V = (size_t)HR_MAX(0, n_vocab), nb = (size_t)HR_MAX(0, p->n_bias);
    int hist_cap = p->penalty_last_n < 0 ? 1 << 16 : HR_MAX(p->penalty_last_n, 1);
    *z = (smp_sizes){.hist_cap = hist_cap,
                     .cands = V * SMP_ELEM(cands),
                     .work = V * SMP_ELEM(work),
                     .history = (size_t)hist_cap * SMP_ELEM(history),
                     .counts = V * SMP_ELEM(counts),
                     .bias_ids = nb * SMP_ELEM(bias_ids),
                     .bias_values = nb * SMP_ELEM(bias_values)};
}

uint64_t hr_sampler_bytes(const hr_sampler_params *p, int n_vocab) {
    smp_sizes z;
    smp_sizes_of(p, n_vocab, &z);
    return sizeof(hr_sampler) + z.cands + z.work + z.history + z.counts + z.bias_ids + z.bias_values;
}

hr_status hr_sampler_create(const hr_sampler_params *p, int n_vocab, hr_sampler **out, hr_error *err) {
    hr_status st = hr_sampler_params_check(p, err);
    if (st) return st;
    if (n_vocab < 1) return hr_error_set(err, HR_ERR_INVALID_ARG, "vocabulary size %d", n_vocab);
    hr_sampler *s = calloc(1, sizeof *s);
    if (!s) return hr_error_set(err, HR_ERR_NOMEM, "out of memory creating a sampler");
    s->p = *p;
    s->n_vocab = n_vocab;
    smp_sizes z; /* what hr_sampler_bytes counts */
    smp_sizes_of(p, n_vocab, &z);
    s->hist_cap = z.hist_cap;
    s->cands = malloc(z.cands);
    s->work = malloc(z.work);
    s->history = malloc(z.history);
    s->counts = calloc(1, z.counts);
    if (p->n_bias > 0) {
        s->bias_ids = malloc(z.bias_ids);
        s->bias_values = malloc(z.bias_values);
    }
    if (!s->cands || !s->work || !s->history || !s->counts || (p->n_bias > 0 && (!s->bias_ids || !s->bias_values))) {
        hr_sampler_destroy(s);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory creating a sampler");
    }
    for (int i = 0; i < p->n_bias; i++) {
        if (p->bias_ids[i] < 0 || p->bias_ids[i] >= n_vocab) {
            hr_sampler_destroy(s);
            char v[32];
            return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_LOGIT_BIAS, num_text(p->bias_ids[i], v),
                                      "logit bias names token %d, outside the vocabulary [0, %d)", (int)p->bias_ids[i],
                                      n_vocab);
        }
        s->bias_ids[i] = p->bias_ids[i];
        s->bias_values[i] = p->bias_values[i];
    }
    s->p.bias_ids = s->bias_ids;
    s->p.bias_values = s->bias_values;
    hr_rng_seed(&s->rng, p->seed);
    *out = s;
    return HR_OK;
}

void hr_sampler_destroy(hr_sampler *s) {
    if (!s) return;
    free(s->cands);
    free(s->work);
    free(s->history);
    free(s->counts);
    free(s->bias_ids);
    free(s->bias_values);
    free(s);
}

void hr_sampler_accept(hr_sampler *s, int32_t token) {
    s->history[s->hist_head] = token;
    s->hist_head = (s->hist_head + 1) % s->hist_cap;
    if (s->hist_len < s->hist_cap) s->hist_len++;
}

void hr_sampler_reset(hr_sampler *s) {
    s->hist_len = s->hist_head = 0;
    hr_rng_seed(&s->rng, s->p.seed);
}

float hr_logsumexp(const float *logits, int n) {
    const bool simd = hr_scan_has_avx2();
    const float mx = simd ? hr_scan_max_avx2(logits, n) : hr_scan_max_ref(logits, n);
    if (!isfinite(mx)) return mx; /* every logit -inf (or NaN): -inf; one +inf: +inf */
    return mx + (float)log(simd ? hr_scan_sum_exp_avx2(logits, n, mx) : hr_scan_sum_exp_ref(logits, n, mx));
}

int32_t hr_argmax(const float *logits, int n) {
    return hr_scan_has_avx2() ? hr_scan_argmax_avx2(logits, n) : hr_scan_argmax_ref(logits, n);
}

static bool penalties_active(const hr_sampler_params *p) {
    return p->penalty_last_n != 0 &&
           (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f);
}

/* Applies penalties to s->work (a copy of the logits) over the history window. */
static void apply_penalties(hr_sampler *s) {
    int n = s->hist_len;
    for (int i = 0; i < n; i++) {
        int32_t id = s->history[(s->hist_head - 1 - i + s->hist_cap) % s->hist_cap];
        if (id >= 0 && id < s->n_vocab && s->counts[id] < UINT16_MAX) s->counts[id]++;
    }
    for (int i = 0; i < n; i++) {
        int32_t id = s->history[(s->hist_head - 1 - i + s->hist_cap) % s->hist_cap];
        if (id < 0 || id >= s->n_vocab || s->counts[id] == 0) continue;
        float l = s->work[id];
        l = l > 0 ? l / s->p.repeat_penalty : l * s->p.repeat_penalty;
        l -= s->p.presence_penalty + (float)s->counts[id] * s->p.frequency_penalty;
        s->work[id] = l;
        s->counts[id] = 0; /* each distinct token once; also resets counts for the next call */
    }
}

static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* a "worse than" order for the min-heap: lower logit, or equal logit and higher id */
static bool worse(cand a, cand b) { return a.logit < b.logit || (a.logit == b.logit && a.id > b.id); }

static void sift_down(cand *h, int n, int i) {
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && worse(h[l], h[m])) m = l;
        if (r < n && worse(h[r], h[m])) m = r;
        if (m == i) return;
        cand t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

/* The k best of the m candidates in h (ids increasing) into h[0, k): a min-heap of the first k, then
 * each later one that beats its worst (a later id never wins a tie, so only a larger logit does). */
static void heap_best(cand *h, int k, int m) {
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(h, k, i);
    for (int i = k; i < m; i++)
        if (h[i].logit > h[0].logit) {
            h[0] = h[i];
            sift_down(h, k, 0);
        }
}

/* The heap h of k (sifted, its worst at h[0]) given each later logit of l[from, n) that beats its worst:
 * a later id never wins a tie, so the next entrant is the next logit strictly above it (scan.h; NaN
 * never is), found 32 at a time where simd */
static void heap_take_above(cand *h, int k, const float *l, int from, int n, bool simd) {
    for (int i = from; i < n; i++) {
        i = simd ? hr_scan_above_avx2(l, i, n, h[0].logit) : hr_scan_above_ref(l, i, n, h[0].logit);
        if (i == n) break;
        h[0] = (cand){.logit = l[i], .id = i};
        sift_down(h, k, 0);
    }
}

int hr_top_logits(const float *logits, int n, int k, int32_t *ids, float *vals) {
    cand h[HR_TOP_LOGITS_MAX];
    k = HR_MIN(k, HR_TOP_LOGITS_MAX);
    int m = 0, i = 0;
    for (; i < n && m < k; i++) /* the heap's first k: the first logits that are not NaN */
        if (logits[i] == logits[i]) h[m++] = (cand){.logit = logits[i], .id = i};
    for (int j = m / 2 - 1; j >= 0; j--) sift_down(h, m, j);
    if (m == k && k > 0) heap_take_above(h, k, logits, i, n, hr_scan_has_avx2());
    qsort(h, (size_t)m, sizeof(cand), cand_cmp);
    for (int j = 0; j < m; j++) ids[j] = h[j].id, vals[j] = h[j].logit;
    return m;
}

static bool any_nan(const float *x, int n) {
    for (int i = 0; i < n; i++)
        if (x[i] != x[i]) return true;
    return false;
}

/* Puts the top_k best candidates (all when top-k is off) at the front of s->cands, sorted best
 * first, and returns how many. With AVX2, where the row is long against k: a floor below which no
 * top-k logit lies (the least of k chunks' maxima, scan.h), the logits at or above it collected (tens
 * at Llama-3's 128256 and k 40), and a min-heap of the k best over those: two passes over the row, 8
 * logits a compare, where the one-pass heap below sifts a few hundred entrants (bench_sampler: 1.7x
 * sooner at 32000 logits, the same at 128256, where both wait on memory; the portable two passes were
 * 2-3x slower than the one-pass heap, so they are not used). The same k candidates either way; the
 * one-pass heap still runs where the first k logits hold a NaN (its heap order depends on NaN's
 * comparisons) or the row is short. */
static int top_k_select(hr_sampler *s, const float *l) {
    int n = s->n_vocab;
    int k = s->p.top_k > 0 && s->p.top_k < n ? s->p.top_k : n;
    cand *h = s->cands;
    const bool simd = !s->p.portable && hr_scan_has_avx2();
    if (k == n) {
        for (int i = 0; i < n; i++) h[i] = (cand){.logit = l[i], .id = i};
    } else if (simd && (int64_t)k * 8 <= n && !any_nan(l, k)) {
        const int cs = (n / k) & ~7;
        const int m = hr_scan_collect_avx2(l, n, hr_scan_chunk_floor_avx2(l, k, cs), h);
        heap_best(h, k, m); /* m >= k: the chunks' maxima, or every logit where the floor is -inf */
    } else {
        for (int i = 0; i < k; i++) h[i] = (cand){.logit = l[i], .id = i};
        for (int i = k / 2 - 1; i >= 0; i--) sift_down(h, k, i);
        heap_take_above(h, k, l, k, n, simd);
    }
    qsort(h, (size_t)k, sizeof(cand), cand_cmp);
    return k;
}

static int32_t sample(hr_sampler *s, const float *logits, const uint64_t *mask) {
    const hr_sampler_params *p = &s->p;
    const float *l = logits;
    if (penalties_active(p) || mask || p->n_bias > 0) {
        memcpy(s->work, logits, sizeof(float) * (size_t)s->n_vocab);
        if (penalties_active(p)) apply_penalties(s);
        /* OpenAI's -100 is a ban; other values shift the logit */
        for (int i = 0; i < p->n_bias; i++)
            s->work[p->bias_ids[i]] =
                p->bias_values[i] <= -100.0f ? -INFINITY : s->work[p->bias_ids[i]] + p->bias_values[i];
        l = s->work;
    }
    if (mask) /* disallowed tokens leave the distribution: -inf is below every finite logit */
        for (int i = 0; i < s->n_vocab; i++)
            if (!((mask[i >> 6] >> (i & 63)) & 1)) s->work[i] = -INFINITY;
    int32_t tok;
    if (p->temperature <= 0.0f) {
        tok = s->p.portable ? hr_scan_argmax_ref(l, s->n_vocab) : hr_argmax(l, s->n_vocab);
    } else {
        int n = top_k_select(s, l);
        while (n > 1 && s->cands[n - 1].logit == -INFINITY) n--; /* masked ones sort last: drop them */
        /* softmax over the survivors at temperature 1 to apply top-p and min-p (as llama.cpp does) */
        double mx = s->cands[0].logit, sum = 0.0;
        for (int i = 0; i < n; i++) sum += exp((double)s->cands[i].logit - mx);
        if (p->top_p < 1.0f) {
            double acc = 0.0;
            int keep = n;
            for (int i = 0; i < n; i++) {
                acc += exp((double)s->cands[i].logit - mx) / sum;
                if (acc >= p->top_p) {
                    keep = i + 1;
                    break;
                }
            }
            n = keep;
        }
        if (p->min_p > 0.0f) {
            double floor_logit = mx + log((double)p->min_p);
            int keep = 1;
            while (keep < n && s->cands[keep].logit >= floor_logit) keep++;
            n = keep;
        }
        /* temperature, softmax, draw */
        double total = 0.0;
        for (int i = 0; i < n; i++) total += exp(((double)s->cands[i].logit - mx) / p->temperature);
        double r = hr_rng_uniform(&s->rng) * total, acc = 0.0;
        tok = s->cands[n - 1].id;
        for (int i = 0; i < n; i++) {
            acc += exp(((double)s->cands[i].logit - mx) / p->temperature);
            if (r < acc) {
                tok = s->cands[i].id;
                break;
            }
        }
    }
    /* every allowed logit -inf (or NaN): the first allowed token, never a masked one */
    if (mask && !((mask[tok >> 6] >> (tok & 63)) & 1))
        for (int i = 0; i < s->n_vocab; i++)
            if ((mask[i >> 6] >> (i & 63)) & 1) {
                tok = i;
                break;
            }
    hr_sampler_accept(s, tok);
    return tok;
}

int32_t hr_sampler_sample(hr_sampler *s, const float *logits) { return sample(s, logits, NULL); }

bool hr_sampler_is_argmax(const hr_sampler *s) {
    return s->p.temperature <= 0.0f && !penalties_active(&s->p) && s->p.n_bias == 0;
}

int32_t hr_sampler_sample_masked(hr_sampler *s, const float *logits, const uint64_t *mask) {
    return sample(s, logits, mask);
}

/* pattern.c: the built-in traffic shapes (bench.h lists their distributions) and the open-loop
 * arrival process. Request i is a pure function of (pattern, seed, i, scale): its RNG is seeded from
 * seed and i alone, so runs are reproducible and a longer run extends a shorter one. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "bench/bench_internal.h"

static const char *const pattern_names[] = {"long-few",      "short-burst", "prefill-heavy", "decode-heavy",
                                            "shared-prefix", "mixed",       "trace"};

const char *hr_bench_pattern_name(hr_bench_pattern p) {
    return (unsigned)p < HR_ARRAY_LEN(pattern_names) ? pattern_names[p] : "?";
}

hr_status hr_bench_pattern_parse(const char *text, hr_bench_pattern *out, hr_error *err) {
    for (int i = 0; i < HR_BENCH_TRACE; i++)
        if (text && !strcmp(text, pattern_names[i])) {
            *out = (hr_bench_pattern)i;
            return HR_OK;
        }
    return hr_error_set(err, HR_ERR_INVALID_ARG,
                        "unknown pattern '%s' (expected long-few, short-burst, prefill-heavy, decode-heavy, "
                        "shared-prefix, mixed, or a trace file ending in .jsonl)",
                        text ? text : "");
}

/* Common short words: with SentencePiece or BPE vocabularies most are one or two tokens, so a prompt
 * of W words is roughly W to 2W tokens. */
static const char *const words[] = {
    "the",  "little", "dog",   "ran",   "to",   "a",    "big",   "house", "and",    "saw",   "cat",   "was",   "happy",
    "one",  "day",    "girl",  "named", "lily", "went", "park",  "with",  "her",    "mom",   "they",  "play",  "ball",
    "tree", "sun",    "bird",  "sang",  "song", "blue", "red",   "green", "friend", "boy",   "tom",   "found", "box",
    "toy",  "car",    "fast",  "slow",  "said", "look", "at",    "in",    "on",     "under", "water", "fish",  "swim",
    "jump", "high",   "smile", "love",  "cake", "eat",  "sleep", "night", "moon",   "star",  "story", "time"};

static int draw(hr_rng *r, int lo, int hi, double scale) {
    int v = lo + (int)(hr_rng_uniform(r) * (double)(hi - lo + 1));
    if (v > hi) v = hi;
    double s = floor((double)v * scale + 0.5);
    return s < 1 ? 1 : (int)s;
}

/* n words drawn from r, space separated, malloc'd; NULL when memory ran out. */
static char *make_words(hr_rng *r, int n) {
    size_t cap = (size_t)n * 8 + 1, len = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    for (int i = 0; i < n; i++) {
        const char *w = words[hr_rng_next(r) % HR_ARRAY_LEN(words)];
        size_t wl = strlen(w);
        if (len) s[len++] = ' ';
        memcpy(s + len, w, wl);
        len += wl;
    }
    s[len] = '\0';
    return s;
}

char *hr_bench_words_text(uint64_t seed, int n_words) {
    hr_rng r;
    hr_rng_seed(&r, seed);
    return make_words(&r, n_words);
}

static uint64_t mix(uint64_t seed, uint64_t i) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void hr_bench_spec_free(hr_bench_spec *s) {
    if (!s) return;
    free(s->prefix);
    free(s->prompt);
    memset(s, 0, sizeof *s);
}

hr_status hr_bench_pattern_spec(hr_bench_pattern p, uint64_t seed, int i, double scale, hr_bench_spec *out,
                                hr_error *err) {
    if ((unsigned)p >= HR_BENCH_TRACE || i < 0 || !(scale > 0 && scale <= 16))
        return hr_error_set(err, HR_ERR_INVALID_ARG, "bench pattern %d request %d scale %g: out of range", (int)p, i,
                            scale);
    hr_rng r;
    hr_rng_seed(&r, mix(seed, (uint64_t)i));
    hr_bench_pattern kind = p;
    if (p == HR_BENCH_MIXED) {
        double u = hr_rng_uniform(&r);
        kind = u < 0.05   ? HR_BENCH_LONG_FEW
               : u < 0.45 ? HR_BENCH_SHORT_BURST
               : u < 0.65 ? HR_BENCH_PREFILL_HEAVY
               : u < 0.80 ? HR_BENCH_DECODE_HEAVY
                          : HR_BENCH_SHARED_PREFIX;
    }
    hr_bench_spec s = {.prefix_id = -1, .kind = kind, .t_s = -1};
    int n_words = 0;
    switch (kind) {
    case HR_BENCH_LONG_FEW:
        n_words = draw(&r, 600, 1000, scale);
        s.max_tokens = draw(&r, 128, 256, scale);
        break;
    case HR_BENCH_SHORT_BURST:
        n_words = draw(&r, 8, 32, scale);
        s.max_tokens = draw(&r, 8, 32, scale);
        break;
    case HR_BENCH_PREFILL_HEAVY:
        n_words = draw(&r, 300, 600, scale);
        s.max_tokens = draw(&r, 4, 16, scale);
        break;
    case HR_BENCH_DECODE_HEAVY:
        n_words = draw(&r, 8, 32, scale);
        s.max_tokens = draw(&r, 200, 400, scale);
        break;
    default: /* shared-prefix: the prefixes depend on their id only, never on the seed */
        s.prefix_id = (int)(hr_rng_next(&r) % HR_BENCH_N_SHARED_PREFIXES);
        s.prefix = hr_bench_words_text(0x5eed0000u + (uint64_t)s.prefix_id, draw(&r, 200, 200, scale));
        n_words = draw(&r, 10, 40, scale);
        s.max_tokens = draw(&r, 16, 64, scale);
        if (!s.prefix) return hr_error_set(err, HR_ERR_NOMEM, "out of memory building a prompt");
        break;
    }
    s.prompt = make_words(&r, n_words);
    if (!s.prompt) {
        hr_bench_spec_free(&s);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory building a prompt");
    }
    *out = s;
    return HR_OK;
}

void hr_bench_pattern_max_len(hr_bench_pattern p, int *max_words, int *max_output) {
    /* the upper ends of the ranges hr_bench_pattern_spec draws from, at scale 1 (mixed: the largest
     * of the five, long-few's) */
    static const int top_words[] = {1000, 32, 600, 32, 240, 1000}, top_output[] = {256, 32, 16, 400, 64, 400};
    int i = (unsigned)p < HR_BENCH_TRACE ? (int)p : HR_BENCH_MIXED;
    *max_words = top_words[i];
    *max_output = top_output[i];
}

double hr_bench_fit_scale(hr_bench_pattern p, int n_ctx) {
    int n_words = 0, n_output = 0;
    hr_bench_pattern_max_len(p, &n_words, &n_output);
    if (n_ctx <= 0) return 1;
    double need = n_words * HR_BENCH_TOKENS_PER_WORD + n_output;
    double s = 0.95 * n_ctx / need;
    return s >= 1 ? 1 : s < 0.01 ? 0.01 : s;
}

void hr_bench_arrivals_init(hr_bench_arrivals *a, hr_bench_pattern p, uint64_t seed, double rate) {
    memset(a, 0, sizeof *a);
    hr_rng_seed(&a->rng, mix(seed, 0xA7717A15ull));
    a->pattern = p;
    a->rate = rate > 0 ? rate : 1;
    a->t = -1;
}

static double exp_gap(hr_rng *r, double mean) { return -log(1.0 - hr_rng_uniform(r)) * mean; }

double hr_bench_arrivals_next(hr_bench_arrivals *a) {
    if (a->pattern == HR_BENCH_SHORT_BURST) {
        if (a->burst_left > 0) {
            a->burst_left--;
            a->t += 0.005;
            return a->t;
        }
        /* a burst of 4..16: burst starts come at rate / mean burst size (10), so requests average rate */
        int size = 4 + (int)(hr_rng_next(&a->rng) % 13);
        a->burst_left = size - 1;
        a->t = a->t < 0 ? 0 : a->t + exp_gap(&a->rng, 10.0 / a->rate);
        return a->t;
    }
    a->t = (a->t < 0 ? 0 : a->t) + exp_gap(&a->rng, 1.0 / a->rate);
    return a->t;
}

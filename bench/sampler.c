/* sampler.c: hr_sampler_sample over rows of logits with the portable passes against the AVX2 ones
 * (src/sampler/scan.h; hr_sampler_params.portable), in the same rounds: greedy (one argmax a row) and
 * llama.cpp's default chain (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05: its cost is top-k's
 * scan of the row). Rows of Llama-3's 128256 logits drawn as a language model's look: a long tail
 * (normal, sd 2) with 1 in 400 tokens 8 higher; a pool of 64 rows (the e2e batch) taken in turn. Each
 * round times every variant once over the pool; the figures are medians over rounds of microseconds a
 * row, and the portable time over the AVX2 one of the same rounds. The two builds' ids are checked equal
 * (same seed: the same draws over the same candidates); a difference exits 1. Then logprobs'
 * normalizer (hr_logsumexp's passes: the row's max and the sum of exp), checked within 1e-6, and its
 * top 20 alternatives (hr_top_logits against an insertion into a sorted list, the ids checked equal).
 * One thread. Last, a step's rows as the engine samples them (one sampler a row, AVX2): one after another on one
 * thread against handed out to a pool of THREADS (hr_threadpool_run_items, the engine's
 * hr_model_ctx_run_items), at 2 to 64 rows, each round timing both; the ids checked equal.
 *
 * usage: bench_sampler [ROUNDS] [N_VOCAB] [THREADS]    (defaults 15 128256, this machine's CPUs) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "common/threadpool.h"
#include "common/util.h"
#include "sampler/sampler.h"
#include "sampler/scan.h"

enum { POOL = 64, MAX_ROUNDS = 64 };

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static hr_sampler *make(float temperature, bool portable, int V) {
    hr_sampler_params p = hr_sampler_default_params();
    p.temperature = temperature;
    p.portable = portable;
    hr_sampler *s = NULL;
    hr_error err;
    if (hr_sampler_create(&p, V, &s, &err) != HR_OK) {
        fprintf(stderr, "bench_sampler: %s\n", err.msg);
        exit(1);
    }
    return s;
}

/* logprobs' top 20 as the engine kept them until hr_top_logits: each logit against the list's worst,
 * an insertion where it beats it (the reference here, and the time it took) */
static void insertion_top(const float *x, int n, int k, int32_t *ids, float *vals) {
    int m = 0;
    for (int v = 0; v < n; v++) {
        if (!(x[v] == x[v]) || (m == k && x[v] <= vals[k - 1])) continue;
        int j = m < k ? m++ : k - 1;
        for (; j > 0 && vals[j - 1] < x[v]; j--) ids[j] = ids[j - 1], vals[j] = vals[j - 1];
        ids[j] = v, vals[j] = x[v];
    }
}

/* the top 20 of each row (a request with top_logprobs 20): the insertion loop against hr_top_logits;
 * 1 on ids that differ */
static int bench_top(const float *rows, int V, int rounds) {
    enum { K = 20 };
    static double t[2][MAX_ROUNDS], ratio[MAX_ROUNDS];
    int32_t ids[2][K];
    float vals[2][K];
    int bad = 0;
    for (int r = 0; r < rounds; r++) {
        for (int b = 0; b < 2; b++) {
            double t0 = hr_time_now();
            for (int k = 0; k < POOL; k++) {
                const float *l = rows + (size_t)k * (size_t)V;
                if (b)
                    hr_top_logits(l, V, K, ids[1], vals[1]);
                else
                    insertion_top(l, V, K, ids[0], vals[0]);
            }
            t[b][r] = (hr_time_now() - t0) / POOL * 1e6;
        }
        ratio[r] = t[0][r] / t[1][r];
        bad |= memcmp(ids[0], ids[1], sizeof ids[0]) != 0;
    }
    printf("  %-42s insertion %7.1f  heap %8.1f  insertion/heap %.2fx (ids equal)\n", "top 20 (logprobs' alternatives)",
           median(t[0], rounds), median(t[1], rounds), median(ratio, rounds));
    if (bad) fprintf(stderr, "bench_sampler: hr_top_logits chose other ids than the insertion loop\n");
    return bad;
}

/* a step's rows: row k of rows sampled by its own sampler s[k] into ids[k] */
typedef struct step_rows {
    hr_sampler **s;
    const float *rows;
    int V;
    int32_t *ids;
} step_rows;

static void sample_one(void *user, int64_t k, int ith) {
    (void)ith;
    step_rows *j = user;
    j->ids[k] = hr_sampler_sample(j->s[k], j->rows + (size_t)k * (size_t)j->V);
}

/* One thread against the pool over steps of 2..64 rows, greedy and the default chain; 1 on ids that
 * differ. */
static int bench_threads(const float *rows, int V, int rounds, int n_threads) {
    hr_threadpool *tp = NULL;
    hr_error err;
    if (hr_threadpool_create(n_threads, &tp, &err) != HR_OK) {
        fprintf(stderr, "bench_sampler: %s\n", err.msg);
        return 1;
    }
    printf("a step's rows, one sampler a row: one thread / a pool of %d (hr_threadpool_run_items), "
           "microseconds a step, medians:\n",
           n_threads);
    static const int batches[] = {2, 4, 8, 16, 32, POOL};
    int bad = 0;
    for (int c = 0; c < 2; c++)
        for (size_t bi = 0; bi < sizeof batches / sizeof batches[0]; bi++) {
            const int B = batches[bi];
            hr_sampler *s[3][POOL]; /* one thread, the pool, the pool woken: each its own, in step */
            for (int b = 0; b < 3; b++)
                for (int k = 0; k < B; k++) s[b][k] = make(c ? 0.8f : 0.0f, false, V);
            static double t[3][MAX_ROUNDS], ratio[2][MAX_ROUNDS];
            int32_t ids[3][POOL];
            for (int r = 0; r < rounds; r++) {
                for (int b = 0; b < 3; b++) {
                    step_rows j = {.s = s[b], .rows = rows, .V = V, .ids = ids[b]};
                    if (b == 2) usleep(5000); /* a GPU's forward in between: the workers have gone to sleep */
                    double t0 = hr_time_now();
                    if (b)
                        hr_threadpool_run_items(tp, sample_one, &j, B);
                    else
                        for (int k = 0; k < B; k++) sample_one(&j, k, 0);
                    t[b][r] = (hr_time_now() - t0) * 1e6;
                }
                ratio[0][r] = t[0][r] / t[1][r];
                ratio[1][r] = t[0][r] / t[2][r];
                bad |= memcmp(ids[0], ids[1], sizeof(int32_t) * (size_t)B) != 0 ||
                       memcmp(ids[0], ids[2], sizeof(int32_t) * (size_t)B) != 0;
            }
            printf("  %-8s %2d rows x %6d  one thread %9.1f  pool %9.1f  one/pool %.2fx  pool asleep %9.1f  one/asleep "
                   "%.2fx\n",
                   c ? "chain" : "greedy", B, V, median(t[0], rounds), median(t[1], rounds), median(ratio[0], rounds),
                   median(t[2], rounds), median(ratio[1], rounds));
            for (int b = 0; b < 3; b++)
                for (int k = 0; k < B; k++) hr_sampler_destroy(s[b][k]);
        }
    hr_threadpool_destroy(tp);
    if (bad) fprintf(stderr, "bench_sampler: the pool's rows chose other ids than one thread's\n");
    return bad;
}

int main(int argc, char **argv) {
    const int rounds = argc > 1 ? atoi(argv[1]) : 15, V = argc > 2 ? atoi(argv[2]) : 128256;
    const int n_threads = argc > 3 ? atoi(argv[3]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (rounds < 1 || rounds > MAX_ROUNDS || V < 64 || n_threads < 1 || n_threads > 1024) {
        fprintf(stderr, "usage: bench_sampler [ROUNDS 1..%d] [N_VOCAB >= 64] [THREADS 1..1024]\n", MAX_ROUNDS);
        return 2;
    }
    if (!hr_scan_has_avx2()) {
        printf("this CPU has no AVX2: nothing to compare\n");
        return 0;
    }
    float *rows = malloc(sizeof(float) * (size_t)POOL * (size_t)V);
    if (!rows) return 1;
    hr_rng rng;
    hr_rng_seed(&rng, 11);
    for (size_t i = 0; i < (size_t)POOL * (size_t)V; i++) {
        double u1 = hr_rng_uniform(&rng), u2 = hr_rng_uniform(&rng);
        double g = sqrt(-2.0 * log(u1 > 1e-300 ? u1 : 1e-300)) * cos(6.283185307179586 * u2);
        rows[i] = (float)(2.0 * g + (hr_rng_uniform(&rng) < 1.0 / 400 ? 8.0 : 0.0));
    }
    /* [greedy, chain] x [portable, avx2] */
    hr_sampler *s[2][2] = {{make(0.0f, true, V), make(0.0f, false, V)}, {make(0.8f, true, V), make(0.8f, false, V)}};
    static double t[2][2][MAX_ROUNDS];
    static int32_t ids[2][2][POOL];
    for (int r = 0; r < rounds; r++)
        for (int c = 0; c < 2; c++)
            for (int b = 0; b < 2; b++) {
                hr_sampler_reset(s[c][b]);
                double t0 = hr_time_now();
                for (int k = 0; k < POOL; k++) ids[c][b][k] = hr_sampler_sample(s[c][b], rows + (size_t)k * V);
                t[c][b][r] = (hr_time_now() - t0) / POOL * 1e6;
                if (b == 1 && memcmp(ids[c][0], ids[c][1], sizeof ids[c][0]) != 0) {
                    fprintf(stderr, "bench_sampler: the AVX2 passes chose other ids than the portable ones\n");
                    return 1;
                }
            }
    printf("hr_sampler_sample over %d-logit rows (a pool of %d), %d rounds, medians, microseconds a row:\n", V, POOL,
           rounds);
    static const char *const what[2] = {"greedy (argmax)", "T 0.8, top-k 40, top-p 0.95, min-p 0.05"};
    for (int c = 0; c < 2; c++) {
        double ratio[MAX_ROUNDS], mp, ma;
        for (int r = 0; r < rounds; r++) ratio[r] = t[c][0][r] / t[c][1][r];
        const double mr = median(ratio, rounds);
        mp = median(t[c][0], rounds);
        ma = median(t[c][1], rounds);
        printf("  %-42s portable %8.1f  avx2 %8.1f  portable/avx2 %.2fx (ids equal)\n", what[c], mp, ma, mr);
    }
    /* logprobs' normalizer (the engine's, per row of a request with logprobs): the max, then the sum of
     * exp; the AVX2 sums checked against the portable ones first, outside the timing */
    static double tl[2][MAX_ROUNDS];
    double worst = 0, sink = 0;
    for (int k = 0; k < POOL; k++) {
        const float *l = rows + (size_t)k * V;
        const double a = hr_scan_sum_exp_avx2(l, V, hr_scan_max_avx2(l, V)),
                     ref = hr_scan_sum_exp_ref(l, V, hr_scan_max_ref(l, V));
        worst = fmax(worst, fabs(a - ref) / ref);
    }
    for (int r = 0; r < rounds; r++)
        for (int b = 0; b < 2; b++) {
            double t0 = hr_time_now();
            for (int k = 0; k < POOL; k++) {
                const float *l = rows + (size_t)k * V;
                const float m = b ? hr_scan_max_avx2(l, V) : hr_scan_max_ref(l, V);
                sink += b ? hr_scan_sum_exp_avx2(l, V, m) : hr_scan_sum_exp_ref(l, V, m);
            }
            tl[b][r] = (hr_time_now() - t0) / POOL * 1e6;
        }
    double ratio[MAX_ROUNDS];
    for (int r = 0; r < rounds; r++) ratio[r] = tl[0][r] / tl[1][r];
    const double mr = median(ratio, rounds), mp = median(tl[0], rounds), ma = median(tl[1], rounds);
    printf("  %-42s portable %8.1f  avx2 %8.1f  portable/avx2 %.2fx (sums within %.1e relative)\n",
           "logsumexp (logprobs' normalizer)", mp, ma, mr, worst);
    if (!(worst <= 1e-6) || sink != sink) {
        fprintf(stderr, "bench_sampler: the AVX2 sums of exp are off by %.3g relative\n", worst);
        return 1;
    }
    for (int c = 0; c < 2; c++)
        for (int b = 0; b < 2; b++) hr_sampler_destroy(s[c][b]);
    if (bench_top(rows, V, rounds)) return 1;
    const int bad = bench_threads(rows, V, rounds, n_threads);
    free(rows);
    return bad;
}

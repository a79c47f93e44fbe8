/* membw.c: the machine's streaming read bandwidth, the roof a decode step is measured against.
 * Sums a 1 GiB buffer (larger than any cache) with 1 and 2 threads, repeats, prints medians in GB/s.
 * The buffer is asked for 2 MiB huge pages and read with a software prefetch 4 KiB ahead, as the
 * decode kernels read the weights, so the roof is the best streaming read the machine gives, not
 * one slowed by a TLB miss and a prefetcher restart every 4 KiB.
 * usage: bench_membw [MiB] [repeats] */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/util.h"

typedef struct job {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} job;

static void *reader(void *arg) {
    job *j = arg;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= j->n; i += 4) {
        if (i % 8 == 0) __builtin_prefetch(j->p + i + 512); /* 4 KiB ahead, every 64-byte line */
        s0 += j->p[i];
        s1 += j->p[i + 1];
        s2 += j->p[i + 2];
        s3 += j->p[i + 3];
    }
    j->sum = s0 + s1 + s2 + s3;
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double measure(const uint64_t *buf, size_t n, int threads) {
    pthread_t th[8];
    job jobs[8];
    double t0 = hr_time_now();
    for (int i = 0; i < threads; i++) {
        jobs[i] = (job){.p = buf + n / threads * i, .n = n / threads};
        pthread_create(&th[i], NULL, reader, &jobs[i]);
    }
    uint64_t total = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
        total += jobs[i].sum;
    }
    double dt = hr_time_now() - t0;
    if (total == 42) fprintf(stderr, " "); /* keep the sum alive */
    return (double)n * sizeof(uint64_t) / dt / 1e9;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)atoi(argv[1]) : 1024;
    int reps = argc > 2 ? atoi(argv[2]) : 7;
    if (mib < 64 || reps < 1 || reps > 100) {
        fprintf(stderr, "usage: bench_membw [MiB >= 64] [repeats 1..100]\n");
        return 2;
    }
    size_t n = mib * 1024 * 1024 / sizeof(uint64_t);
    uint64_t *buf = aligned_alloc(2u << 20, n * sizeof(uint64_t));
#ifdef MADV_HUGEPAGE
    if (buf) (void)madvise(buf, n * sizeof(uint64_t), MADV_HUGEPAGE);
#endif
    if (!buf) {
        fprintf(stderr, "bench_membw: cannot allocate %zu MiB\n", mib);
        return 1;
    }
    for (size_t i = 0; i < n; i++) buf[i] = i;
    printf("{\"mib\": %zu, \"repeats\": %d", mib, reps);
    for (int threads = 1; threads <= 2; threads++) {
        double r[100];
        for (int i = 0; i < reps; i++) r[i] = measure(buf, n, threads);
        qsort(r, (size_t)reps, sizeof r[0], cmp_double);
        printf(", \"gbps_%dt\": %.2f", threads, r[reps / 2]);
    }
    printf("}\n");
    free(buf);
    return 0;
}

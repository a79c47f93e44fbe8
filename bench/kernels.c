/* kernels.c: hr_matmul speed per weight type on an n x k weight matrix (default 2048 x 5632).
 * T = 1 prints the weight streaming rate in GB/s (decode is bound by it); T > 1 prints GFLOP/s
 * (2 T n k per call). Medians over repeats, of wall time and of CPU time: on a shared, loaded
 * machine the wall figure moves with the load, while CPU time per call (process CPU time divided by
 * the thread count; it includes pool spinning) shows what the kernel itself costs.
 * With a large n (e.g. 16384) the matrix no longer fits in the caches and T = 1 measures streaming
 * from memory.
 * First it prints the pool's fork/join cost: microseconds per run of empty shares (the caller takes
 * them all when the workers are not already spinning) and per run of 20 us shares (time beyond
 * 20 us is the cost of waking, joining and waiting), medians of 5 batches.
 * The weights sit in 2 MiB pages where the kernel allows (madvise, as the model loader holds them).
 * With copies > 1 each timed call walks that many copies of the matrix one after the other, so with
 * small shapes (TinyLlama's 2048 x 2048) the rows still come from DRAM as in a decode step, where
 * the whole model streams past the L3.
 * usage: bench_kernels [threads] [isa: scalar|avx2|avx512|best] [repeats] [types e.g. q8_0,q4_0]
 *                      [Ts e.g. 1,16,64,512] [n] [k] [copies] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "backend/cpu/matmul.h"
#include "common/util.h"

enum { T_MAX = 512, MAX_TS = 8 };

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof v[0], cmp_double);
    return v[n / 2];
}

/* Work of a given length: a busy wait, so the pool's overhead shows as time beyond it. */
static void busy_share(void *ctx, int ith, int nth) {
    const double until = hr_time_now() + *(const double *)ctx;
    while (hr_time_now() < until) {
    }
    (void)ith, (void)nth;
}

/* Microseconds per hr_threadpool_run whose shares each busy-wait `work_us`, median of 5 batches. */
static double pool_us(hr_threadpool *tp, double work_us, int runs) {
    double t[5], work_s = work_us * 1e-6;
    for (int b = 0; b < 5; b++) {
        const double t0 = hr_time_now();
        for (int i = 0; i < runs; i++) hr_threadpool_run(tp, busy_share, &work_s);
        t[b] = (hr_time_now() - t0) / runs * 1e6;
    }
    return median(t, 5);
}

static void bench_pool(hr_threadpool *tp) {
    const double w = 20, empty = pool_us(tp, 0, 20000), full = pool_us(tp, w, 2000);
    printf("fork/join (%d threads): %.2f us per run of empty shares; %.2f us per run of %.0f us shares "
           "(overhead %.2f us; %.0f us if one thread did all)\n",
           hr_threadpool_size(tp), empty, full, w, full - w, w * hr_threadpool_size(tp));
}

static bool listed(const char *list, const char *name) {
    if (!list) return true;
    const size_t len = strlen(name);
    for (const char *p = list; (p = strstr(p, name)); p += len)
        if ((p == list || p[-1] == ',') && (p[len] == ',' || p[len] == 0)) return true;
    return false;
}

int main(int argc, char **argv) {
    const int n_threads = argc > 1 ? atoi(argv[1]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    const char *isa = argc > 2 && strcmp(argv[2], "best") ? argv[2] : NULL;
    const int reps = HR_MAX(1, HR_MIN(argc > 3 ? atoi(argv[3]) : 7, 64));
    const char *type_list = argc > 4 ? argv[4] : NULL;
    int Ts[MAX_TS] = {1, 16, 64, 512}, nTs = 4;
    if (argc > 5) {
        nTs = 0;
        for (char *s = argv[5]; *s && nTs < MAX_TS;) {
            const long v = strtol(s, &s, 10);
            Ts[nTs++] = (int)HR_MAX(1, HR_MIN(T_MAX, v));
            if (*s == ',') s++;
        }
    }
    const int64_t N = argc > 6 ? atoll(argv[6]) : 2048, K = argc > 7 ? atoll(argv[7]) : 5632;
    const int copies = HR_MAX(1, HR_MIN(argc > 8 ? atoi(argv[8]) : 1, 1024));
    hr_kernels kern;
    hr_kernels_init(&kern, hr_cpu_detect(), isa);
    hr_error err;
    hr_threadpool *tp = NULL;
    hr_matmul_ctx *mm = NULL;
    if (hr_threadpool_create(n_threads, &tp, &err) != HR_OK ||
        hr_matmul_ctx_create(&kern, tp, T_MAX, K, &mm, &err) != HR_OK) {
        fprintf(stderr, "bench_kernels: %s\n", err.msg);
        return 1;
    }
    printf("isa %s, %d threads, W %lld x %lld (%d %s), medians of %d; each cell: wall | cpu-time figure\n", kern.isa,
           n_threads, (long long)N, (long long)K, copies, copies > 1 ? "copies" : "copy", reps);
    bench_pool(tp);
    hr_rng rng;
    hr_rng_seed(&rng, 1);
    float *wrow = malloc(sizeof(float) * (size_t)K), *X = malloc(sizeof(float) * (size_t)T_MAX * K);
    float *Y = malloc(sizeof(float) * (size_t)T_MAX * N);
    static const hr_dtype types[] = {HR_DTYPE_F32,     HR_DTYPE_F16,  HR_DTYPE_BF16,    HR_DTYPE_Q8_0,
                                     HR_DTYPE_Q8_0X16, HR_DTYPE_Q4_0, HR_DTYPE_Q4_0X16, HR_DTYPE_Q4_K,
                                     HR_DTYPE_Q4_KX16, HR_DTYPE_Q5_K, HR_DTYPE_Q5_KX16, HR_DTYPE_Q6_K,
                                     HR_DTYPE_Q6_KX16, HR_DTYPE_MXFP4};
    size_t wbytes = sizeof(float) * (size_t)N * K; /* the f32 rows are quantized in place */
    for (size_t ti = 0; ti < HR_ARRAY_LEN(types); ti++)
        if (listed(type_list, hr_dtype_get_info(types[ti])->name))
            wbytes = HR_MAX(wbytes, hr_dtype_row_bytes(types[ti], K) * (size_t)N * (size_t)copies);
    const size_t huge = (size_t)2 << 20;
    char *W = aligned_alloc(huge, (wbytes + huge - 1) / huge * huge);
    if (!wrow || !X || !Y || !W) return 1;
#ifdef MADV_HUGEPAGE
    (void)madvise(W, (wbytes + huge - 1) / huge * huge, MADV_HUGEPAGE); /* advice only */
#endif
    for (size_t i = 0; i < (size_t)T_MAX * K; i++) X[i] = hr_rng_normal(&rng);
    printf("%-7s", "type");
    for (int j = 0; j < nTs; j++) printf("  %7s=%-3d %s", "T", Ts[j], Ts[j] == 1 ? "GB/s " : "GF/s ");
    printf("\n");
    for (size_t ti = 0; ti < HR_ARRAY_LEN(types); ti++) {
        const hr_dtype t = types[ti];
        const hr_dtype_info *info = hr_dtype_get_info(t);
        if (!kern.type[t].vec_dot_tile || !listed(type_list, info->name) || N % info->row_group) continue;
        const size_t row = hr_dtype_row_bytes(t, K);
        for (int64_t i = 0; i < N; i++) {
            for (int64_t j = 0; j < K; j++) wrow[j] = hr_rng_normal(&rng);
            hr_quantize_row_ref(info->file_type, wrow, W + i * row, K); /* x16: repacked below */
        }
        if (info->row_group > 1) {
            void *tmp = malloc(row * HR_X16);
            hr_x16_repack(t, W, N, K, tmp);
            free(tmp);
        }
        for (int c = 1; c < copies; c++) memcpy(W + (size_t)c * row * N, W, row * N);
        printf("%-7s", info->name);
        for (int j = 0; j < nTs; j++) {
            const int T = Ts[j];
            double wall[64], cpu[64];
            hr_matmul(mm, W, t, N, K, X, T, Y); /* warm up */
            for (int i = 0; i < reps; i++) {
                const double c0 = cpu_now(), t0 = hr_time_now();
                for (int c = 0; c < copies; c++) hr_matmul(mm, W + (size_t)c * row * N, t, N, K, X, T, Y);
                wall[i] = hr_time_now() - t0;
                cpu[i] = (cpu_now() - c0) / n_threads;
            }
            const double mw = median(wall, reps), mc = median(cpu, reps);
            const double work = copies * (T == 1 ? (double)row * N : 2.0 * T * N * K);
            printf("  %6.1f | %6.1f", work / mw / 1e9, work / mc / 1e9);
        }
        printf("\n");
        fflush(stdout);
    }
    hr_matmul_ctx_destroy(mm);
    hr_threadpool_destroy(tp);
    free(wrow);
    free(X);
    free(Y);
    free(W);
    return 0;
}

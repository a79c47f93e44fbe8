/* kernels.c: hr_matmul speed per weight type on a 2048 x 5632 matrix (n = 2048 rows, k = 5632).
 * T = 1 prints the weight streaming rate in GB/s (decode is bound by it); T = 16, 64, 512 print
 * tokens x rows per second and GFLOP/s (2 T n k per call). Medians over repeats.
 * usage: bench_kernels [threads] [isa: scalar|avx2|avx512] [repeats] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cpu/matmul.h"
#include "common/util.h"

enum { N = 2048, K = 5632, T_MAX = 512 };

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const int n_threads = argc > 1 ? atoi(argv[1]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    const char *isa = argc > 2 ? argv[2] : NULL;
    const int reps = argc > 3 ? atoi(argv[3]) : 7;
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
    printf("isa %s, %d threads, W %d x %d, medians of %d\n", kern.isa, n_threads, N, K, reps);
    hr_rng rng;
    hr_rng_seed(&rng, 1);
    float *wf = malloc(sizeof(float) * (size_t)N * K), *X = malloc(sizeof(float) * (size_t)T_MAX * K);
    float *Y = malloc(sizeof(float) * (size_t)T_MAX * N);
    void *W = malloc(sizeof(float) * (size_t)N * K);
    if (!wf || !X || !Y || !W) return 1;
    for (size_t i = 0; i < (size_t)N * K; i++) wf[i] = hr_rng_normal(&rng);
    for (size_t i = 0; i < (size_t)T_MAX * K; i++) X[i] = hr_rng_normal(&rng);
    static const hr_dtype types[] = {HR_DTYPE_F32,  HR_DTYPE_F16,  HR_DTYPE_BF16, HR_DTYPE_Q8_0,
                                     HR_DTYPE_Q4_0, HR_DTYPE_Q4_K, HR_DTYPE_Q5_K, HR_DTYPE_Q6_K};
    static const int Ts[] = {1, 16, 64, 512};
    printf("%-5s %12s %22s %22s %22s\n", "type", "T=1 GB/s", "T=16 rows*tok/s GF/s", "T=64", "T=512");
    for (size_t ti = 0; ti < HR_ARRAY_LEN(types); ti++) {
        const hr_dtype t = types[ti];
        if (!kern.type[t].vec_dot) continue;
        const size_t row = hr_dtype_row_bytes(t, K);
        for (int i = 0; i < N; i++) hr_quantize_row_ref(t, wf + (size_t)i * K, (char *)W + i * row, K);
        printf("%-5s", hr_dtype_get_info(t)->name);
        for (size_t j = 0; j < HR_ARRAY_LEN(Ts); j++) {
            const int T = Ts[j];
            double times[64];
            const int r = HR_MIN(reps, 64);
            hr_matmul(mm, W, t, N, K, X, T, Y); /* warm up */
            for (int i = 0; i < r; i++) {
                const double t0 = hr_time_now();
                hr_matmul(mm, W, t, N, K, X, T, Y);
                times[i] = hr_time_now() - t0;
            }
            qsort(times, (size_t)r, sizeof times[0], cmp_double);
            const double med = times[r / 2];
            if (T == 1)
                printf(" %12.2f", (double)row * N / med / 1e9);
            else
                printf(" %12.3g %9.1f", (double)T * N / med, 2.0 * T * N * K / med / 1e9);
        }
        printf("\n");
        fflush(stdout);
    }
    hr_matmul_ctx_destroy(mm);
    hr_threadpool_destroy(tp);
    free(wf);
    free(X);
    free(Y);
    free(W);
    return 0;
}

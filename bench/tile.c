/* tile.c: the register-level tile kernels alone, on data that stays in the caches: GF/s of one
 * thread running vec_dot_tile over nr weight rows x nt tokens, so it shows the compute ceiling of
 * each kernel with memory out of the picture (bench_kernels adds memory, threads, quantizing).
 * Medians of 15 timed runs, each long enough (~20 ms) to dwarf the clock's resolution.
 * With a sixth argument `ideal` (isa avx2), the tiles that have one also run their loop of the same
 * instructions in registers only (tile_ideal.h), the two alternating, and print its rate and the
 * tile's share of it: how far the compiled tile is from what its instruction mix allows.
 * usage: bench_tile [types e.g. q8_0,q4_0] [nr] [k] [nt] [isa] [ideal] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/kernels.h"
#include "common/util.h"
#include "tile_ideal.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const char *types = argc > 1 ? argv[1] : "f16,q8_0,q4_0,q4_K";
    const int nr = argc > 2 ? atoi(argv[2]) : 64;
    const int64_t k = argc > 3 ? atoll(argv[3]) : 2048;
    const int nt = argc > 4 ? atoi(argv[4]) : 64;
    const char *isa = argc > 5 ? argv[5] : NULL;
    const int ideal = argc > 6 && !strcmp(argv[6], "ideal");
    if (nr < 1 || nt < 1 || k < 256 || k % 256) {
        fprintf(stderr, "bench_tile: nr and nt >= 1, k a multiple of 256\n");
        return 2;
    }
    hr_kernels kt;
    hr_kernels_init(&kt, hr_cpu_detect(), isa);
    printf("isa %s, %d rows x %d tokens, k %lld, 1 thread, medians of 15\n", kt.isa, nr, nt, (long long)k);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", types);
    for (char *name = strtok(buf, ","); name; name = strtok(NULL, ",")) {
        int t = 0;
        while (t < HR_DTYPE_TABLE &&
               !(hr_dtype_get_info((hr_dtype)t) && !strcmp(hr_dtype_get_info((hr_dtype)t)->name, name)))
            t++;
        if (t == HR_DTYPE_TABLE || !kt.type[t].vec_dot_tile || nr % hr_dtype_get_info((hr_dtype)t)->row_group) {
            fprintf(stderr, "bench_tile: no tile kernel for '%s' (or rows not a multiple of its row group)\n", name);
            return 2;
        }
        const hr_dtype at = hr_dtype_get_info((hr_dtype)t)->vec_dot_type;
        float *x = malloc(sizeof(float) * (size_t)k * (size_t)HR_MAX(nr, nt));
        for (int64_t i = 0; i < k * HR_MAX(nr, nt); i++) x[i] = (float)((i * 7919) % 2003) / 1001.0f - 1.0f;
        const size_t ws = hr_dtype_row_bytes((hr_dtype)t, k), as = hr_dtype_row_bytes(at, k);
        char *w = malloc(ws * (size_t)nr), *a = malloc(as * (size_t)nt);
        float *y = malloc(sizeof(float) * (size_t)nr * (size_t)nt);
        const hr_dtype ft = hr_dtype_get_info((hr_dtype)t)->file_type; /* q4_0 for q4_0x16 */
        for (int r = 0; r < nr; r++) hr_quantize_row_ref(ft, x + r * k, w + (size_t)r * ws, k);
        if (hr_dtype_get_info((hr_dtype)t)->row_group > 1) {
            void *tmp = malloc(ws * HR_X16);
            hr_x16_repack((hr_dtype)t, w, nr, k, tmp);
            free(tmp);
        }
        for (int i = 0; i < nt; i++) {
            if (at == HR_DTYPE_F32)
                memcpy(a + (size_t)i * as, x + i * k, sizeof(float) * (size_t)k);
            else
                kt.type[t].quantize_act(x + i * k, a + (size_t)i * as, k);
        }
        const double flop = 2.0 * (double)nr * (double)nt * (double)k;
        int reps = 1;
        for (double t0 = now(); now() - t0 < 0.02; reps *= 2)
            for (int i = 0; i < reps; i++) kt.type[t].vec_dot_tile(k, w, ws, nr, a, as, nt, y, (size_t)nr);
        tile_ideal id;
        const int with_ideal = ideal && !strcmp(kt.isa, "avx2") && tile_ideal_find(name, &id);
        const long passes = with_ideal ? (long)(flop * reps / id.flop) : 0; /* as long as the tile's */
        double g[15], gi[15], ratio[15];
        for (int s = 0; s < 15; s++) {
            double t0 = now();
            for (int i = 0; i < reps; i++) kt.type[t].vec_dot_tile(k, w, ws, nr, a, as, nt, y, (size_t)nr);
            g[s] = flop * reps / (now() - t0) / 1e9;
            if (with_ideal) {
                t0 = now();
                id.pass(passes);
                gi[s] = id.flop * (double)passes / (now() - t0) / 1e9;
                ratio[s] = g[s] / gi[s];
            }
        }
        qsort(g, 15, sizeof g[0], cmp_double);
        printf("%-7s %7.1f GF/s (quartiles %.1f-%.1f)\n", name, g[7], g[4], g[11]);
        if (with_ideal) {
            qsort(gi, 15, sizeof gi[0], cmp_double);
            qsort(ratio, 15, sizeof ratio[0], cmp_double);
            printf("  its instructions in registers: %.1f GF/s (quartiles %.1f-%.1f); tile / that %.2f (%.2f-%.2f)\n",
                   gi[7], gi[4], gi[11], ratio[7], ratio[4], ratio[11]);
        }
        free(x);
        free(w);
        free(a);
        free(y);
    }
    return 0;
}

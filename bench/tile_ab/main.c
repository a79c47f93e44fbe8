/* tile_ab: two builds of the AVX2 x16 tiles in one process, A (tile_ab.sh's OLD tree, symbols va_*)
 * and B (the NEW tree, vb_*), on the same weights and activations, alternating sample by sample, so
 * that a host whose speed moves by 1.5x within seconds (the shared 2-vCPU machines) moves both alike.
 * Prints each side's median GF/s and the median and quartiles of the per-sample ratio B / A, and
 * whether the two gave the same bits (they must: the tiles have one sequence per element).
 * COPIES > 1 cycles through that many copies of the weights (more than the L3 holds: from DRAM, as
 * the first pass of a decode step reads them); 1 leaves them in L2 as bench_tile does.
 * usage (through tile_ab.sh): tile_ab TYPE NR K NT [SAMPLES] [COPIES] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/isa.h"
#include "backend/cpu/kernels.h"
#include "common/util.h"
#include "tensor/tensor.h"
#include "tensor/tensor_ref.h"

typedef void (*tile_fn)(int64_t, const void *, size_t, int, const void *, size_t, int, float *, size_t);
#define TILES(X) X(q4_0x16) X(q8_0x16) X(q4_Kx16) X(q5_Kx16) X(q6_Kx16)
#define DECL(t)                                                                                                        \
    void va_tile_##t(int64_t, const void *, size_t, int, const void *, size_t, int, float *, size_t);                  \
    void vb_tile_##t(int64_t, const void *, size_t, int, const void *, size_t, int, float *, size_t);
TILES(DECL)
#define ENTRY(t) {#t, va_tile_##t, vb_tile_##t},
static const struct {
    const char *name;
    tile_fn a, b;
} tiles[] = {TILES(ENTRY)};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: tile_ab TYPE NR K NT [SAMPLES (41)] [COPIES (1)]\n");
        return 2;
    }
    const char *name = argv[1];
    const int nr = atoi(argv[2]), nt = atoi(argv[4]), S = argc > 5 ? atoi(argv[5]) : 41;
    const int64_t k = atoll(argv[3]);
    const int copies = argc > 6 ? atoi(argv[6]) : 1;
    size_t i = 0;
    while (i < sizeof tiles / sizeof tiles[0] && strcmp(tiles[i].name, name)) i++;
    if (i == sizeof tiles / sizeof tiles[0] || nr < 16 || nr % 16 || k < 256 || k % 256 || nt < 1 || S < 3 ||
        S > 1000 || copies < 1) {
        fprintf(stderr, "tile_ab: TYPE one of q4_0x16 q8_0x16 q4_Kx16 q5_Kx16 q6_Kx16, NR a multiple of 16, K of "
                        "256, NT >= 1, SAMPLES 3..1000, COPIES >= 1\n");
        return 2;
    }
    const tile_fn A = tiles[i].a, B = tiles[i].b;
    hr_kernels kt;
    hr_kernels_init(&kt, hr_cpu_detect(), "avx2");
    int t = 0;
    while (t < HR_DTYPE_TABLE &&
           !(hr_dtype_get_info((hr_dtype)t) && !strcmp(hr_dtype_get_info((hr_dtype)t)->name, name)))
        t++;
    const hr_dtype at = hr_dtype_get_info((hr_dtype)t)->vec_dot_type;
    const int64_t nx = k * HR_MAX(nr, nt);
    float *x = malloc(sizeof(float) * (size_t)nx);
    const size_t ws = hr_dtype_row_bytes((hr_dtype)t, k), as = hr_dtype_row_bytes(at, k), wall = ws * (size_t)nr;
    char *w = malloc(wall * (size_t)copies), *a = malloc(as * (size_t)nt);
    float *y1 = malloc(sizeof(float) * (size_t)nr * (size_t)nt), *y2 = malloc(sizeof(float) * (size_t)nr * (size_t)nt);
    void *tmp = malloc(ws * HR_X16);
    double *ga = malloc(sizeof(double) * (size_t)S * 3), *gb = ga + S, *r = gb + S;
    if (!x || !w || !a || !y1 || !y2 || !tmp || !ga) {
        fprintf(stderr, "tile_ab: out of memory\n");
        return 1;
    }
    for (int64_t j = 0; j < nx; j++) x[j] = (float)((j * 7919) % 2003) / 1001.0f - 1.0f;
    for (int row = 0; row < nr; row++)
        hr_quantize_row_ref(hr_dtype_get_info((hr_dtype)t)->file_type, x + row * k, w + (size_t)row * ws, k);
    hr_x16_repack((hr_dtype)t, w, nr, k, tmp);
    for (int c = 1; c < copies; c++) memcpy(w + (size_t)c * wall, w, wall);
    for (int j = 0; j < nt; j++) kt.type[t].quantize_act(x + (int64_t)j * k, a + (size_t)j * as, k);
    A(k, w, ws, nr, a, as, nt, y1, (size_t)nr);
    B(k, w, ws, nr, a, as, nt, y2, (size_t)nr);
    const int same = !memcmp(y1, y2, sizeof(float) * (size_t)nr * (size_t)nt);
    const double flop = 2.0 * nr * nt * (double)k;
    int reps = 1;
    for (double t0 = now(); now() - t0 < 0.01; reps *= 2)
        for (int j = 0; j < reps; j++) A(k, w, ws, nr, a, as, nt, y1, (size_t)nr);
    int ci = 0;
    for (int s = 0; s < S; s++) {
        double t0 = now();
        for (int j = 0; j < reps; j++, ci = (ci + 1) % copies)
            A(k, w + (size_t)ci * wall, ws, nr, a, as, nt, y1, (size_t)nr);
        ga[s] = flop * reps / (now() - t0) / 1e9;
        t0 = now();
        for (int j = 0; j < reps; j++, ci = (ci + 1) % copies)
            B(k, w + (size_t)ci * wall, ws, nr, a, as, nt, y2, (size_t)nr);
        gb[s] = flop * reps / (now() - t0) / 1e9;
        r[s] = gb[s] / ga[s];
    }
    qsort(ga, (size_t)S, sizeof *ga, cmp);
    qsort(gb, (size_t)S, sizeof *gb, cmp);
    qsort(r, (size_t)S, sizeof *r, cmp);
    printf("%s %d x %lld x %d, copies %d: A %.1f, B %.1f GF/s (medians of %d); B / A %.3f (quartiles %.3f-%.3f); "
           "%s\n",
           name, nr, (long long)k, nt, copies, ga[S / 2], gb[S / 2], S, r[S / 2], r[S / 4], r[3 * S / 4],
           same ? "same bits" : "RESULTS DIFFER");
    free(x);
    free(w);
    free(a);
    free(y1);
    free(y2);
    free(tmp);
    free(ga);
    return same ? 0 : 1;
}

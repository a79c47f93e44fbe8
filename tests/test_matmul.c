/* test_matmul.c: hr_matmul against the scalar reference, and its batch-invariance promise: every
 * element's bits are the same for T = 1 as inside a batch of 70 (with any other rows), as in batches
 * of 2, 3, 5, 16 and 17 tokens (every tile shape and leftover), for 1, 2 or 3 threads, and for a
 * matrix of only its first 37 or 5 rows (rows not a multiple of any tile height, other chunking;
 * q4_0x16: 48 and 16 of 64, whole groups),
 * for every type and every ISA this CPU has (only $HEADROOM_ISA's when set), and every table's bits
 * equal to the scalar table's (one program on every CPU). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/matmul.h"
#include "common/util.h"
#include "harness.h"

enum { N_ROWS = 70, T_BATCH = 70 }; /* T_BATCH > 64 crosses a token block of hr_matmul */

typedef struct {
    hr_threadpool *tp;
    hr_matmul_ctx *mm;
} runner;

static void runner_open(runner *r, const hr_kernels *k, int n_threads, int64_t max_k) {
    hr_error err;
    r->tp = NULL;
    r->mm = NULL;
    CHECK(hr_threadpool_create(n_threads, &r->tp, &err) == HR_OK);
    CHECK(hr_matmul_ctx_create(k, r->tp, T_BATCH, max_k, &r->mm, &err) == HR_OK);
}

static void runner_close(runner *r) {
    hr_matmul_ctx_destroy(r->mm);
    hr_threadpool_destroy(r->tp);
}

static void check_type(const hr_kernels *kern, const hr_kernels *scalar, hr_dtype wt, int64_t k, hr_rng *rng) {
    const hr_dtype_info *info = hr_dtype_get_info(wt);
    const size_t row_bytes = hr_dtype_row_bytes(wt, k);
    /* q4_0x16 / q8_0x16 (rows in groups of 16): 64 rows, quantized as q4_0 / q8_0 and repacked; the
     * reference dots the plain rows */
    const bool grouped = info->row_group > 1;
    const int NR = grouped ? 64 : N_ROWS;
    const hr_dtype ft = info->file_type;
    float *wf = malloc(sizeof(float) * NR * (size_t)k);
    unsigned char *W = malloc(row_bytes * NR);
    float *X = malloc(sizeof(float) * T_BATCH * (size_t)k);
    float *X2 = malloc(sizeof(float) * T_BATCH * (size_t)k);
    float *Yb = malloc(sizeof(float) * T_BATCH * NR);
    float *Yb3 = malloc(sizeof(float) * T_BATCH * NR);
    float *Y1 = malloc(sizeof(float) * NR);
    float *Yo = malloc(sizeof(float) * T_BATCH * NR);
    unsigned char *act = malloc(hr_dtype_row_bytes(HR_DTYPE_F32, k) + 64);
    for (int64_t i = 0; i < NR * k; i++) wf[i] = hr_rng_normal(rng);
    for (int i = 0; i < NR; i++) hr_quantize_row_ref(ft, wf + i * k, W + i * row_bytes, k);
    unsigned char *Wplain = malloc(row_bytes * NR);
    memcpy(Wplain, W, row_bytes * NR);
    if (grouped) {
        void *tmp = malloc(row_bytes * HR_X16);
        hr_x16_repack(wt, W, NR, k, tmp);
        free(tmp);
    }
    for (int64_t i = 0; i < T_BATCH * k; i++) X[i] = hr_rng_normal(rng);
    for (int64_t i = 0; i < T_BATCH * k; i++) X2[i] = 3 * hr_rng_normal(rng);

    runner r1, r2, r3;
    runner_open(&r1, kern, 1, k);
    runner_open(&r2, kern, 2, k);
    runner_open(&r3, kern, 3, k);

    hr_matmul(r2.mm, W, wt, NR, k, X, T_BATCH, Yb);
    hr_matmul(r3.mm, W, wt, NR, k, X, T_BATCH, Yb3);
    CHECKF(!memcmp(Yb, Yb3, sizeof(float) * T_BATCH * NR), "%s/%s: 2 vs 3 threads differ", kern->isa, info->name);
    runner rs;
    runner_open(&rs, scalar, 2, k);
    hr_matmul(rs.mm, W, wt, NR, k, X, T_BATCH, Yb3);
    CHECKF(!memcmp(Yb, Yb3, sizeof(float) * T_BATCH * NR), "%s/%s k=%lld: the batch differs from the scalar table's",
           kern->isa, info->name, (long long)k);
    runner_close(&rs);

    /* the first T tokens as a batch of their own, against the first n rows only */
    static const int small_T[] = {2, 3, 4, 5, 8, 16, 17};
    const int sub_rows[] = {grouped ? 48 : 37, grouped ? 16 : 5, NR};
    int bad_small = 0;
    for (size_t i = 0; i < HR_ARRAY_LEN(small_T); i++)
        for (size_t j = 0; j < HR_ARRAY_LEN(sub_rows); j++) {
            const int T = small_T[i], n = sub_rows[j];
            hr_matmul(r2.mm, W, wt, n, k, X, T, Yo);
            for (int t = 0; t < T; t++) bad_small += memcmp(Yo + t * n, Yb + t * NR, sizeof(float) * (size_t)n) != 0;
        }
    CHECKF(bad_small == 0, "%s/%s k=%lld: %d token rows differ in small batches or sub-matrices", kern->isa, info->name,
           (long long)k, bad_small);

    /* token t alone (1 thread) and token t at position (t * 7) % T of another batch */
    int bad_single = 0, bad_other = 0, bad_ref = 0;
    double worst = 0;
    for (int t = 0; t < T_BATCH; t++) {
        hr_matmul(r1.mm, W, wt, NR, k, X + t * k, 1, Y1);
        bad_single += memcmp(Y1, Yb + t * NR, sizeof(float) * NR) != 0;
        const int pos = (t * 7) % T_BATCH;
        memcpy(X2 + pos * k, X + t * k, sizeof(float) * (size_t)k);
        hr_matmul(r3.mm, W, wt, NR, k, X2, T_BATCH, Yo);
        bad_other += memcmp(Yo + pos * NR, Yb + t * NR, sizeof(float) * NR) != 0;
        /* reference: the activation quantized by the reference, dotted by the reference; tolerance
         * 1e-5 of sum |w * x| (float accumulations differ in order only) */
        const hr_dtype at = hr_dtype_get_info(ft)->vec_dot_type;
        hr_quantize_row_ref(at, X + t * k, act, k);
        float *deq_w = malloc(sizeof(float) * (size_t)k), *deq_a = malloc(sizeof(float) * (size_t)k);
        hr_dequantize_row_ref(at, act, deq_a, k);
        for (int i = 0; i < NR; i++) {
            hr_dequantize_row_ref(ft, Wplain + i * row_bytes, deq_w, k);
            double mag = 0;
            for (int64_t j = 0; j < k; j++) mag += fabs((double)deq_w[j] * deq_a[j]);
            const double want = hr_vec_dot_ref(ft, k, Wplain + i * row_bytes, act);
            const double e = fabs(Yb[t * NR + i] - want) / (mag + 1e-30);
            worst = fmax(worst, e);
            bad_ref += e > 1e-5;
        }
        free(deq_w);
        free(deq_a);
    }
    CHECKF(bad_single == 0, "%s/%s k=%lld: %d tokens differ alone vs in the batch", kern->isa, info->name, (long long)k,
           bad_single);
    CHECKF(bad_other == 0, "%s/%s k=%lld: %d tokens differ in another batch", kern->isa, info->name, (long long)k,
           bad_other);
    CHECKF(bad_ref == 0, "%s/%s k=%lld: %d elements off the reference (worst %g)", kern->isa, info->name, (long long)k,
           bad_ref, worst);

    runner_close(&r1);
    runner_close(&r2);
    runner_close(&r3);
    free(wf);
    free(W);
    free(Wplain);
    free(X);
    free(X2);
    free(Yb);
    free(Yb3);
    free(Y1);
    free(Yo);
    free(act);
}

int main(void) {
    const char *pinned = hr_test_isa();
    hr_rng rng;
    hr_rng_seed(&rng, 42);
    const hr_cpu_features f = hr_cpu_detect();
    static const char *isas[] = {"scalar", "avx2", "avx512"};
    hr_kernels scalar;
    hr_kernels_init(&scalar, f, "scalar");
    static const hr_dtype types[] = {HR_DTYPE_F32,     HR_DTYPE_F16,     HR_DTYPE_BF16,    HR_DTYPE_Q8_0,
                                     HR_DTYPE_Q4_0,    HR_DTYPE_Q5_0,    HR_DTYPE_Q5_1,    HR_DTYPE_Q4_K,
                                     HR_DTYPE_Q5_K,    HR_DTYPE_Q6_K,    HR_DTYPE_Q4_0X16, HR_DTYPE_Q8_0X16,
                                     HR_DTYPE_Q4_KX16, HR_DTYPE_Q5_KX16, HR_DTYPE_Q6_KX16, HR_DTYPE_Q5_0X16};
    for (size_t ii = 0; ii < HR_ARRAY_LEN(isas); ii++) {
        if (pinned && strcmp(pinned, isas[ii])) continue;
        if (!hr_kernels_isa_available(f, isas[ii])) continue;
        hr_kernels kern;
        hr_kernels_init(&kern, f, isas[ii]);
        for (size_t ti = 0; ti < HR_ARRAY_LEN(types); ti++) {
            if (!kern.type[types[ti]].vec_dot_tile) continue;
            const int block = hr_dtype_get_info(types[ti])->block_elems;
            check_type(&kern, &scalar, types[ti], block == 1 ? 77 : 256, &rng);
            check_type(&kern, &scalar, types[ti], block == 256 ? 768 : 1056, &rng);
        }
    }
    return hr_test_finish();
}

/* matmul.c: hr_matmul (see matmul.h).
 *
 * One call runs in two phases on the pool: (1) quantize each activation row into the scratch
 * (skipped for f32 activations, which are used in place), (2) compute output rows in chunks handed
 * out dynamically (hr_threadpool_run_items), so on a loaded machine a thread that loses its core
 * does not hold the others up. Decode (T = 1) streams each chunk of rows once, four rows at a time.
 * For T > 1 a chunk is a block of rows of about HR_MM_BLOCK_BYTES that is walked against blocks of
 * HR_MM_TOKENS tokens, so weights come from memory once per HR_MM_TOKENS tokens and from cache for
 * the rest; the kernel table's vec_dot_tile does the register-level tiling. Neither the chunking
 * nor the blocking nor which thread runs a chunk changes any element's bits (see matmul.h). */
#include "backend/cpu/matmul.h"

#include "common/util.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#define HR_MM_BLOCK_BYTES (256 * 1024) /* weight bytes per cache block: about half an L2 */
#define HR_MM_TOKENS      64           /* tokens per cache block */
#define HR_MM_ALIGN       64
#define HR_MM_CHUNKS      8  /* decode: chunks per thread (balance vs. hand-out cost) */
#define HR_MM_MIN_ROWS    16 /* decode: rows per chunk at least */
/* decode: weight bytes per chunk at most. A large matrix (gpt-oss's 201088 x 2880 q8_0 output, 615
 * MB) in 8 chunks a thread gave 38 MB chunks: a thread that lost its core for a while left the other
 * idle for up to one chunk at the end (1/16 of the step's largest matmul at 2 threads). */
#define HR_MM_MAX_CHUNK_BYTES (4 << 20)

struct hr_matmul_ctx {
    const hr_kernels *kernels; /* borrowed */
    hr_threadpool *tp;         /* borrowed */
    int64_t max_tokens, max_k;
    size_t act_row_cap; /* scratch bytes per activation row */
    void *act;          /* max_tokens x act_row_cap */

    /* the call in progress (read by the pool's threads) */
    struct {
        const hr_type_kernels *tk;
        const char *W;
        size_t w_stride;
        int64_t rows_per_block; /* rows per chunk, a multiple of 4 and of the type's row group */
        int64_t n, k, T;
        const float *X;
        int64_t x_stride; /* floats between X's rows */
        float *Y;
        const char *A; /* activations in vec_dot_type */
        size_t a_stride;
    } job;
};

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* The largest converted activation row of any type: q8_0 (34/32), q8_0s (40/32), q8_K (292/256) or
 * f16 (2 bytes an element); f32 activations are read in place. */
static size_t act_row_cap(int64_t max_k) {
    const size_t kq0 = (size_t)(max_k + HR_QK8_0 - 1) / HR_QK8_0 * sizeof(hr_block_q8_0);
    const size_t kqk = (size_t)(max_k + HR_QK_K - 1) / HR_QK_K * sizeof(hr_block_q8_K);
    const size_t kh = (size_t)max_k * sizeof(hr_f16);
    const size_t k0s = (size_t)(max_k + HR_QK8_0 - 1) / HR_QK8_0 * sizeof(hr_block_q8_0s);
    return round_up(HR_MAX(HR_MAX(HR_MAX(kq0, kqk), kh), k0s), HR_MM_ALIGN);
}

uint64_t hr_matmul_ctx_bytes(int64_t max_tokens, int64_t max_k) {
    return sizeof(hr_matmul_ctx) + (uint64_t)act_row_cap(max_k) * (uint64_t)HR_MAX(0, max_tokens);
}

hr_status hr_matmul_ctx_create(const hr_kernels *k, hr_threadpool *tp, int64_t max_tokens, int64_t max_k,
                               hr_matmul_ctx **out, hr_error *err) {
    if (!k || !tp) return hr_error_set(err, HR_ERR_INVALID_ARG, "matmul context needs a kernel table and a pool");
    if (max_tokens < 1 || max_k < 1 || max_k > ((int64_t)1 << 30) || max_tokens > ((int64_t)1 << 24))
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "matmul scratch for %lld tokens x %lld elements is out of range (expected 1..2^24 x "
                            "1..2^30)",
                            (long long)max_tokens, (long long)max_k);
    const size_t cap = act_row_cap(max_k);
    hr_matmul_ctx *m = calloc(1, sizeof *m);
    if (!m) return hr_error_set(err, HR_ERR_NOMEM, "out of memory for the matmul context");
    m->act = aligned_alloc(HR_MM_ALIGN, cap * (size_t)max_tokens);
    if (!m->act) {
        free(m);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory for %zu bytes of activation scratch",
                            cap * (size_t)max_tokens);
    }
    memset(m->act, 0, cap * (size_t)max_tokens); /* resident now: the first large step pays no page faults */
    m->kernels = k;
    m->tp = tp;
    m->max_tokens = max_tokens;
    m->max_k = max_k;
    m->act_row_cap = cap;
    *out = m;
    return HR_OK;
}

void hr_matmul_ctx_destroy(hr_matmul_ctx *m) {
    if (!m) return;
    free(m->act);
    free(m);
}

/* Phase 1: item t quantizes token row t. */
static void quantize_item(void *arg, int64_t t, int ith) {
    hr_matmul_ctx *m = arg;
    m->job.tk->quantize_act(m->job.X + t * m->job.x_stride, (char *)m->act + (size_t)t * m->act_row_cap, m->job.k);
}

/* Phase 2: item c computes the rows of chunk c for all tokens. */
static void compute_item(void *arg, int64_t c, int ith) {
    hr_matmul_ctx *m = arg;
    const int64_t n = m->job.n, T = m->job.T, rb = m->job.rows_per_block;
    const int64_t i0 = c * rb;
    const int nr = (int)HR_MIN(rb, n - i0);
    const char *W = m->job.W + (size_t)i0 * m->job.w_stride;
    for (int64_t t0 = 0; t0 < T; t0 += HR_MM_TOKENS) {
        const int nt = (int)HR_MIN(HR_MM_TOKENS, T - t0);
        m->job.tk->vec_dot_tile(m->job.k, W, m->job.w_stride, nr, m->job.A + (size_t)t0 * m->job.a_stride,
                                m->job.a_stride, nt, m->job.Y + t0 * n + i0, (size_t)n);
    }
}

void hr_matmul(hr_matmul_ctx *m, const void *W, hr_dtype wt, int64_t n, int64_t k, const float *X, int64_t T,
               float *Y) {
    hr_matmul_strided(m, W, wt, n, k, X, k, T, Y);
}

void hr_matmul_strided(hr_matmul_ctx *m, const void *W, hr_dtype wt, int64_t n, int64_t k, const float *X,
                       int64_t x_stride, int64_t T, float *Y) {
    const hr_dtype_info *info = hr_dtype_get_info(wt);
    assert(info && m->kernels->type[wt].vec_dot_tile);
    assert(T >= 0 && T <= m->max_tokens && k >= 0 && k <= m->max_k && k % info->block_elems == 0 && x_stride >= k);
    if (T == 0 || n == 0) return;
    const hr_type_kernels *tk = &m->kernels->type[wt];
    m->job.tk = tk;
    m->job.W = W;
    m->job.w_stride = hr_dtype_row_bytes(wt, k);
    /* chunks of whole tiles (4 rows) and whole row groups (16 rows of q4_0x16) */
    const int64_t unit = HR_MAX(4, info->row_group);
    assert(n % info->row_group == 0);
    if (T == 1) { /* a few chunks per thread */
        const int64_t per = HR_MIN(n / ((int64_t)hr_threadpool_size(m->tp) * HR_MM_CHUNKS),
                                   (int64_t)(HR_MM_MAX_CHUNK_BYTES / HR_MAX(1, m->job.w_stride)));
        m->job.rows_per_block = HR_MAX(HR_MAX(HR_MM_MIN_ROWS, unit), (per + unit - 1) / unit * unit);
    } else { /* a cache block of rows */
        m->job.rows_per_block =
            HR_MAX(unit, HR_MIN(64, (int64_t)(HR_MM_BLOCK_BYTES / HR_MAX(1, m->job.w_stride))) / unit * unit);
    }
    m->job.n = n;
    m->job.k = k;
    m->job.T = T;
    m->job.X = X;
    m->job.x_stride = x_stride;
    m->job.Y = Y;
    if (info->vec_dot_type == HR_DTYPE_F32) {
        m->job.A = (const char *)X;
        m->job.a_stride = (size_t)x_stride * sizeof(float);
    } else {
        m->job.A = m->act;
        m->job.a_stride = m->act_row_cap;
        /* one row is cheaper to quantize here than to hand out */
        if (T == 1)
            quantize_item(m, 0, 0);
        else
            hr_threadpool_run_items(m->tp, quantize_item, m, T);
    }
    hr_threadpool_run_items(m->tp, compute_item, m, (n + m->job.rows_per_block - 1) / m->job.rows_per_block);
}

/* kv_storage_cuda.c: a KV storage (kv/kv_storage.h) whose blocks live in one device allocation, in
 * the same byte layout as the CPU storage's blocks (HR_KV_BLOCK_LAYOUT: [L][K heads | V heads]), so
 * whole-block reads and writes (swap, the remote tier) move the same bytes either way.
 *
 * The forward pass's path runs on the device alone: hr_kv_storage_cuda_write_dev encodes a batch's
 * K/V rows into their slots (kernels/attention.cu's hr_k_kv_write, the CPU storage's encoders step for
 * step) and hr_kv_storage_cuda_attend_rows runs the split attention over device queries, block tables
 * and the caller's scratch, nothing allocated and nothing waited for. The storage ops the manager
 * calls with host rows (write, attend) move their rows up and down around the same kernels; they
 * return nothing, so a device fault there is kept (failed, msg) and the result is zeros; the caller
 * sees it on the next hr_kv_storage_cuda_check. Formats: f32, f16, bf16, q8, fp8, q4h (4-bit per
 * token, keys Hadamard-rotated: attention first rotates the queries into its scratch with
 * hr_k_hadamard_rows), and the deferred q4 and kivi2 (K per channel over a block, so a block is
 * encoded when it fills): their tokens go to the block's f16 stage (n_stage tail buffers on the
 * device, the CPU storage's layout, their fill counts kept here on the host: every write is the host's
 * doing), the write that fills a block has hr_k_kv_encode encode it from the stage (the CPU's
 * encoders, bit for bit), and attention reads a query's partial last block from its stage in f16 and
 * the full ones' codes fused. The forward pass gives each token's stage and has the fills counted
 * once a step (hr_kv_storage_cuda_stage_batch), so its launches stay the same whatever fills. Not yet
 * Token masks (h2o, snapkv: hr_kv_cuda_tokens) go to the split kernels, which give a masked token
 * weight 0, and where a query accumulates, hr_k_attn_score adds its normalized weights to the rows'
 * scores after the reduce (the host path: the views' masks up, their scores back). Not yet
 * run on a GPU (docs/GPU.md).
 *
 * The attention kernel: HEADROOM_CUDA_ATTN_KERNEL, read at create, picks "split" (the default:
 * hr_k_attn_split, a K row per thread) or "rows" (hr_k_attn_split_rows: K and V rows read by groups of
 * lanes, coalesced; used where head_dim % 8 == 0, else split); another value makes create fail.
 * hr_kv_storage_cuda_set_attn_kernel changes it on a storage (gpu_bench measures both). The default
 * stays split until a GPU measurement shows rows faster.
 *
 * Prefill attention: HEADROOM_CUDA_PREFILL_ATTN, read at create, picks "split" (the default: every
 * row through the split kernels above) or "mma": hr_kv_storage_cuda_attend_runs sends the rows of a
 * batch's runs (>= 16 rows of one sequence at consecutive positions, cut into tiles by the host) to
 * kernels/attn_prefill.cu's hr_k_attn_prefill (tensor cores, one block per tile and KV head, no split)
 * and the stretches between them to the split kernels; head_dim 8, 16, 32, 64 or 128 (otherwise
 * split).
 * hr_kv_storage_cuda_set_prefill_attn changes it (gpu_bench measures both); split stays the default
 * until a GPU measures mma faster. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "tensor/tensor.h"

/* attention.cu's HR_K_KV_* */
enum {
    CUDA_KV_F16 = 0,
    CUDA_KV_Q8 = 1,
    CUDA_KV_F32 = 2,
    CUDA_KV_BF16 = 3,
    CUDA_KV_FP8 = 4,
    CUDA_KV_Q4H = 5,
    CUDA_KV_Q4K = 6, /* q4's K: 4 bits per channel over the block (deferred) */
    CUDA_KV_Q2K = 7, /* kivi2's K: 2 bits per channel (deferred) */
    CUDA_KV_Q4V = 8, /* q4's V: 4 bits per token group (q4h's layout; deferred) */
    CUDA_KV_Q2V = 9  /* kivi2's V: 2 bits per token group (deferred) */
};
enum { CUDA_ATT_G = 8, CUDA_ATT_MAX_D = 256 }; /* its HR_K_ATT_G, HR_K_ATT_MAX_D */
enum { CUDA_PF_M = 128 };                      /* attn_prefill.cu's HR_PF_M: MMA rows (rows x G) a block */

/* kernels/attention.cu's hr_k_attn_shape, field for field (passed by value to the kernel) */
typedef struct attn_shape {
    uint64_t block_bytes, k_head_bytes, v_head_bytes;
    int n_layers, n_kv_heads, n_heads, head_dim, block_size;
    int k_fmt, v_fmt, k_group, v_group;
    int max_blocks, n_splits;
    int chunk;
    float scale, softcap;
} attn_shape;
_Static_assert(sizeof(attn_shape) == 80, "attn_shape must match hr_k_attn_shape in kernels/attention.cu");

typedef struct cuda_kv {
    hr_kv_storage base; /* first: the manager holds the storage by it */
    hr_kv_storage_params p;
    hr_cuda_device *dev;
    uint64_t arena;       /* n_blocks * block_bytes */
    uint64_t block_bytes; /* L * Hkv * (K + V head bytes) */
    uint64_t rows;        /* the host write op's device rows: k, v ([Hkv][D] f32 each), then slot, stage, fill */
    /* deferred formats (q4, kivi2): n_stage f16 tail buffers on the device, [L][K | V][Hkv][B][D] each,
     * and the slots written in each (stage, layer), kept here: every write is the host's doing (the
     * forward pass's through hr_kv_storage_cuda_stage_batch) */
    uint64_t stages, stage_bytes; /* 0 without deferred formats; one tail buffer's bytes */
    uint16_t *filled;             /* [n_stage][L] */
    bool deferred;
    int target_blocks; /* thread blocks an attention call aims for (hr_cuda_attn_target_blocks) */
    bool attn_rows;    /* hr_k_attn_split_rows where the shape allows it (HEADROOM_CUDA_ATTN_KERNEL=rows) */
    bool prefill_mma;  /* runs to hr_k_attn_prefill where the shape allows it (HEADROOM_CUDA_PREFILL_ATTN=mma) */
    bool failed;       /* a device call of a void op failed (msg says which) */
    hr_error msg;
} cuda_kv;

static int fmt_code(const kv_fmt *f) {
    switch (f->format) {
    case HR_KV_Q8: return CUDA_KV_Q8;
    case HR_KV_F32: return CUDA_KV_F32;
    case HR_KV_BF16: return CUDA_KV_BF16;
    case HR_KV_FP8: return CUDA_KV_FP8;
    case HR_KV_Q4H: return CUDA_KV_Q4H;
    case HR_KV_Q4: return f->role == KV_K ? CUDA_KV_Q4K : CUDA_KV_Q4V;
    case HR_KV_KIVI2: return f->role == KV_K ? CUDA_KV_Q2K : CUDA_KV_Q2V;
    default: return CUDA_KV_F16;
    }
}

static void keep(cuda_kv *s, hr_status st, const hr_error *e) {
    if (st && !s->failed) {
        s->failed = true;
        s->msg = *e;
    }
}

static void cuda_kv_destroy(hr_kv_storage *st) {
    if (!st) return;
    cuda_kv *s = (cuda_kv *)st;
    hr_cuda_free(s->dev, s->arena);
    hr_cuda_free(s->dev, s->rows);
    hr_cuda_free(s->dev, s->stages);
    free(s->filled);
    free(s);
}

static const char *cuda_kv_isa(const hr_kv_storage *st) { return "sm_90a"; }

static uint64_t cuda_kv_footprint(const hr_kv_storage *st) {
    const cuda_kv *s = (const cuda_kv *)st;
    return s->block_bytes * (uint64_t)s->p.n_blocks + s->stage_bytes * (uint64_t)s->p.n_stage;
}

/* the kernels' view of the storage (the per-call fields zero) */
static attn_shape shape_of(const cuda_kv *s) {
    const hr_kv_storage_params *p = &s->p;
    return (attn_shape){.block_bytes = s->block_bytes,
                        .k_head_bytes = p->k.head_bytes,
                        .v_head_bytes = p->v.head_bytes,
                        .n_layers = p->n_layers,
                        .n_kv_heads = p->n_kv_heads,
                        .head_dim = p->head_dim,
                        .block_size = p->block_size,
                        .k_fmt = fmt_code(&p->k),
                        .v_fmt = fmt_code(&p->v),
                        .k_group = p->k.G > 0 ? p->k.G : 1,
                        .v_group = p->v.G > 0 ? p->v.G : 1};
}

hr_status hr_kv_storage_cuda_write_dev(hr_kv_storage *st, int layer, uint64_t k, uint64_t v, uint64_t slots, int n,
                                       hr_error *err) {
    cuda_kv *s = (cuda_kv *)st;
    if (n <= 0) return HR_OK;
    attn_shape sh = shape_of(s);
    /* deferred formats: the tokens' stages and fills follow their slots (hr_kv_storage_cuda_stage_batch) */
    uint64_t tok_stage = s->deferred ? slots + (uint64_t)n * 4u : 0, fills = tok_stage + (uint64_t)n * 4u;
    void *args[] = {&s->arena, &s->stages, &k, &v, &slots, &tok_stage, &layer, &sh};
    hr_status r = hr_cuda_launch(s->dev, "hr_k_kv_write", (unsigned)n, (unsigned)(2 * s->p.n_kv_heads), 256, args, err);
    if (r || !s->deferred) return r;
    /* the blocks this batch filled, encoded from their stages (the grid of the writes, so a captured
     * graph replays it whatever fills) */
    void *eargs[] = {&s->arena, &s->stages, &slots, &tok_stage, &fills, &layer, &sh};
    return hr_cuda_launch(s->dev, "hr_k_kv_encode", (unsigned)n, (unsigned)(2 * s->p.n_kv_heads), 256, eargs, err);
}

/* one more slot of stage written in layer (the CPU storage's count): whether that filled its block */
static bool stage_count(cuda_kv *s, int32_t stage, int layer) {
    uint16_t *f = &s->filled[(size_t)stage * s->p.n_layers + layer];
    return ++*f == s->p.block_size;
}

hr_status hr_kv_storage_cuda_stage_batch(hr_kv_storage *st, int32_t *rows, int n, hr_error *err) {
    cuda_kv *s = (cuda_kv *)st;
    if (!s->deferred) return HR_OK;
    const int32_t *slots = rows, *stage = rows + n;
    int32_t *fills = rows + 2 * n;
    for (int i = 0; i < n; i++)
        if (stage[i] < 0 || stage[i] >= s->p.n_stage || slots[i] < 0 || slots[i] / s->p.block_size >= s->p.n_blocks ||
            s->filled[(size_t)stage[i] * s->p.n_layers] >= s->p.block_size)
            return hr_error_set(err, HR_ERR_INVALID_ARG,
                                "CUDA KV: token %d writes slot %d through stage %d of %d, full or none", i, slots[i],
                                stage[i], s->p.n_stage);
    /* every layer writes the batch's tokens (the forward pass), so every layer's count moves alike and
     * the token that fills a block fills it in each */
    for (int i = 0; i < n; i++) {
        fills[i] = stage_count(s, stage[i], 0);
        for (int l = 1; l < s->p.n_layers; l++) stage_count(s, stage[i], l);
    }
    return HR_OK;
}

/* The manager's write of one token: its rows up to the device, then the device's encoder (one encoder
 * for both paths: the bytes are the CPU storage's, test_cuda_kernels compares them); a deferred
 * format's row goes to its stage, and the write that fills the block in layer encodes it there. */
static void cuda_kv_write(hr_kv_storage *st, int layer, int32_t block, int t, int32_t stage, const float *k,
                          const float *v) {
    cuda_kv *s = (cuda_kv *)st;
    size_t row = (size_t)s->p.n_kv_heads * (size_t)s->p.head_dim * sizeof(float);
    int32_t place[3] = {block * s->p.block_size + t, stage, 0}; /* slot, stage, fill */
    hr_error e = {0};
    hr_status r = HR_OK;
    if (s->deferred &&
        (stage < 0 || stage >= s->p.n_stage || s->filled[(size_t)stage * s->p.n_layers + layer] >= s->p.block_size))
        r = hr_error_set(&e, HR_ERR_INVALID_ARG, "CUDA KV: a write to block %d through stage %d of %d, full or none",
                         block, stage, s->p.n_stage);
    else if (s->deferred)
        place[2] = stage_count(s, stage, layer);
    uint64_t dk = s->rows, dv = s->rows + row, dslot = s->rows + 2 * row;
    if (!r) r = hr_cuda_upload(s->dev, dk, k, row, &e);
    if (!r) r = hr_cuda_upload(s->dev, dv, v, row, &e);
    if (!r) r = hr_cuda_upload(s->dev, dslot, place, sizeof place, &e);
    if (!r) r = hr_kv_storage_cuda_write_dev(st, layer, dk, dv, dslot, 1, &e);
    keep(s, r, &e);
}

uint64_t hr_kv_storage_cuda_attend_scratch(const hr_kv_storage *st, int n, int n_heads, int max_ctx) {
    const cuda_kv *s = (const cuda_kv *)st;
    return hr_cuda_attn_scratch_bytes(s->p.n_kv_heads, s->p.head_dim, n_heads, n, max_ctx, s->target_blocks);
}

/* the rows kernel's lanes take 8 elements each (16- or 8-byte loads, q8 groups of >= 8; 8 channels of
 * 4-bit codes from one half of a 16-byte chunk: D % 16 == 0, of 2-bit ones from a quarter: D % 32 == 0) */
static bool rows_shape_ok(const cuda_kv *s, attn_shape sh) {
    const int D = s->p.head_dim;
    const bool b4 =
        sh.k_fmt == CUDA_KV_Q4H || sh.v_fmt == CUDA_KV_Q4H || sh.k_fmt == CUDA_KV_Q4K || sh.v_fmt == CUDA_KV_Q4V;
    const bool b2 = sh.k_fmt == CUDA_KV_Q2K || sh.v_fmt == CUDA_KV_Q2V;
    return D % 8 == 0 && (sh.k_fmt != CUDA_KV_Q8 || sh.k_group % 8 == 0) &&
           (sh.v_fmt != CUDA_KV_Q8 || sh.v_group % 8 == 0) && (!b4 || D % 16 == 0) && (!b2 || D % 32 == 0);
}

/* the split kernels and their reduce over rows [0, n) of the arrays given (a stretch of a batch: the
 * caller offsets them), with the batch's split (sh.n_splits, sh.chunk: the scratch holds it for every
 * stretch, fewer rows than the batch's) */
static hr_status attend_split(cuda_kv *s, int layer, attn_shape sh, uint64_t q, uint64_t tables, uint64_t qrow,
                              uint64_t n_ctx, uint64_t win, uint64_t tails, const hr_kv_cuda_tokens *tok, int n,
                              uint64_t out, uint64_t scratch, hr_error *err) {
    const int Hkv = s->p.n_kv_heads, D = s->p.head_dim;
    int H = sh.n_heads;
    int ng = (H / Hkv + CUDA_ATT_G - 1) / CUDA_ATT_G;
    /* the scratch (hr_cuda_attn_scratch_bytes): o_part, ml_part (then the batch's rotated queries) */
    uint64_t o_part = scratch, ml_part = scratch + (uint64_t)n * H * (uint64_t)sh.n_splits * (uint64_t)D * 4u;
    uint64_t stages = tails ? s->stages : 0;
    uint64_t tview = tok ? tok->view : 0, masks = tok ? tok->masks : 0;
    void *args[] = {&o_part, &ml_part, &q,     &s->arena, &tables, &qrow,  &n_ctx,
                    &win,    &stages,  &tails, &tview,    &masks,  &layer, &sh};
    const bool rows = s->attn_rows && rows_shape_ok(s, sh);
    hr_status r = hr_cuda_launch(s->dev, rows ? "hr_k_attn_split_rows" : "hr_k_attn_split", (unsigned)(n * Hkv * ng),
                                 (unsigned)sh.n_splits, 256, args, err);
    void *rargs[] = {&out, &o_part, &ml_part, &H, (void *)&D, &sh.n_splits};
    if (!r) r = hr_cuda_launch(s->dev, "hr_k_attn_reduce", (unsigned)n, (unsigned)H, 256, rargs, err);
    /* the policies' scores, from the splits' max and sum (the rows that accumulate; the others return) */
    uint64_t scores = tok ? tok->scores : 0;
    void *sargs[] = {&scores, &ml_part, &q,     &s->arena, &tables, &qrow,  &n_ctx,
                     &win,    &stages,  &tails, &tview,    &masks,  &layer, &sh};
    if (!r && scores) r = hr_cuda_launch(s->dev, "hr_k_attn_score", (unsigned)(n * Hkv), 1, 256, sargs, err);
    return r;
}

int hr_cuda_prefill_tile_rows(int n_heads, int n_kv_heads) {
    const int G = n_kv_heads > 0 ? n_heads / n_kv_heads : 0;
    return G > 0 && G <= CUDA_PF_M ? CUDA_PF_M / G : 0;
}

bool hr_kv_storage_cuda_prefill_on(const hr_kv_storage *st, int n_heads) {
    const cuda_kv *s = (const cuda_kv *)st;
    const int Hkv = s->p.n_kv_heads, D = s->p.head_dim;
    const attn_shape sh = shape_of(s);
    const bool q4h = sh.k_fmt == CUDA_KV_Q4H || sh.v_fmt == CUDA_KV_Q4H; /* its 8-channel reads: D % 16 == 0 */
    /* the deferred formats' rows stay on the split kernels (a tail block's f16 stage, per-channel K) */
    return s->prefill_mma && !s->deferred && (D == 8 || D == 16 || D == 32 || D == 64 || D == 128) &&
           n_heads % Hkv == 0 && hr_cuda_prefill_tile_rows(n_heads, Hkv) > 0 &&
           (sh.k_fmt != CUDA_KV_Q8 || sh.k_group % 8 == 0) && (sh.v_fmt != CUDA_KV_Q8 || sh.v_group % 8 == 0) &&
           (!q4h || D % 16 == 0);
}

int hr_cuda_attn_runs(const int32_t *qrow, const int32_t *pos, int n, int tile_rows, int32_t *out) {
    int k = 0;
    if (tile_rows < 1) return 0;
    for (int i = 0; i < n;) {
        int j = i + 1; /* [i, j): one sequence (its table row) at consecutive positions */
        while (j < n && qrow[j] == qrow[i] && pos[j] == pos[j - 1] + 1) j++;
        if (j - i >= HR_CUDA_PREFILL_MIN_RUN) { /* tiles of even size: 130 rows of 128 a tile: 65 + 65 */
            const int nt = (j - i + tile_rows - 1) / tile_rows;
            for (int t = 0, r = i; t < nt; t++) {
                const int rows = (j - r + nt - t - 1) / (nt - t);
                int32_t *e = out + 4 * k++;
                e[0] = r, e[1] = rows, e[2] = qrow[r], e[3] = pos[r];
                r += rows;
            }
        }
        i = j;
    }
    return k;
}

/* attention over device rows; qrow 0: query i reads table row i; runs (n_runs tiles): the rows for
 * hr_k_attn_prefill where the storage takes them there */
static hr_status attend_rows(cuda_kv *s, int layer, uint64_t q, uint64_t tables, int max_blocks, uint64_t qrow,
                             uint64_t n_ctx, uint64_t win, uint64_t tails, const hr_kv_cuda_tokens *tok, int n,
                             int max_ctx, int H, float scale, float softcap, const int32_t *runs, uint64_t d_runs,
                             int n_runs, uint64_t out, uint64_t scratch, hr_error *err) {
    if (n <= 0) return HR_OK;
    const int Hkv = s->p.n_kv_heads;
    if (H < Hkv || H % Hkv != 0)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "CUDA KV: %d query heads over %d KV heads", H, Hkv);
    attn_shape sh = shape_of(s);
    hr_cuda_attn_split(Hkv, H, n, max_ctx, s->target_blocks, &sh.n_splits, &sh.chunk);
    sh.n_heads = H;
    sh.max_blocks = max_blocks;
    sh.scale = scale;
    sh.softcap = softcap;
    if (sh.k_fmt == CUDA_KV_Q4H) { /* keys stored rotated: every kernel dots rotated queries, made once into
                                      the scratch after the whole batch's o_part and ml_part */
        const int D = s->p.head_dim;
        uint64_t qrot = scratch + (uint64_t)n * H * (uint64_t)sh.n_splits * (uint64_t)(D + 2) * 4u;
        void *hargs[] = {&qrot, &q, (void *)&D};
        hr_status r = hr_cuda_launch(s->dev, "hr_k_hadamard_rows", (unsigned)(n * H), 1, 256, hargs, err);
        if (r) return r;
        q = qrot;
    }
    if (tok && !tok->view) tok = NULL;
    if (!s->deferred) tails = 0;
    /* token masks: every row on the split kernels (the prefill kernel takes none) */
    if (n_runs <= 0 || !runs || tok || !hr_kv_storage_cuda_prefill_on(&s->base, H))
        return attend_split(s, layer, sh, q, tables, qrow, n_ctx, win, tails, tok, n, out, scratch, err);
    /* the stretches between the runs' tiles (in row order) on the split kernels, their arrays offset */
    const uint64_t row_bytes = (uint64_t)H * (uint64_t)s->p.head_dim * 4u;
    const int tile_rows = hr_cuda_prefill_tile_rows(H, Hkv);
    hr_status r = HR_OK;
    for (int i = 0, a = 0; i <= n_runs && !r; i++) {
        const int b = i < n_runs ? runs[4 * i] : n; /* the stretch [a, b) before tile i */
        if (i < n_runs && (runs[4 * i + 1] < 1 || runs[4 * i + 1] > tile_rows || b < a || b + runs[4 * i + 1] > n))
            return hr_error_set(err, HR_ERR_INVALID_ARG, "CUDA KV: run tile %d (rows %d + %d of %d, at most %d a tile)",
                                i, b, runs[4 * i + 1], n, tile_rows);
        if (b > a)
            r = attend_split(s, layer, sh, q + (uint64_t)a * row_bytes,
                             qrow ? tables : tables + (uint64_t)a * (uint64_t)max_blocks * 4u,
                             qrow ? qrow + (uint64_t)a * 4u : 0, n_ctx + (uint64_t)a * 4u,
                             win ? win + (uint64_t)a * 8u : 0, tails ? tails + (uint64_t)a * 4u : 0, NULL, b - a,
                             out + (uint64_t)a * row_bytes, scratch, err);
        if (i < n_runs) a = b + runs[4 * i + 1];
    }
    void *args[] = {&out, &q, &s->arena, &tables, &d_runs, &win, &layer, &sh};
    if (!r) r = hr_cuda_launch(s->dev, "hr_k_attn_prefill", (unsigned)n_runs, (unsigned)Hkv, 256, args, err);
    return r;
}

hr_status hr_kv_storage_cuda_attend_dev(hr_kv_storage *st, int layer, uint64_t q, uint64_t tables, int max_blocks,
                                        uint64_t n_ctx, int n, int max_ctx, int n_heads, float scale, float softcap,
                                        uint64_t out, uint64_t scratch, hr_error *err) {
    return attend_rows((cuda_kv *)st, layer, q, tables, max_blocks, 0, n_ctx, 0, 0, NULL, n, max_ctx, n_heads, scale,
                       softcap, NULL, 0, 0, out, scratch, err);
}

hr_status hr_kv_storage_cuda_attend_rows(hr_kv_storage *st, int layer, uint64_t q, uint64_t tables, int max_blocks,
                                         uint64_t qrow, uint64_t n_ctx, uint64_t win, uint64_t tails, int n,
                                         int max_ctx, int n_heads, float scale, float softcap, uint64_t out,
                                         uint64_t scratch, hr_error *err) {
    return attend_rows((cuda_kv *)st, layer, q, tables, max_blocks, qrow, n_ctx, win, tails, NULL, n, max_ctx, n_heads,
                       scale, softcap, NULL, 0, 0, out, scratch, err);
}

hr_status hr_kv_storage_cuda_attend_runs(hr_kv_storage *st, int layer, uint64_t q, uint64_t tables, int max_blocks,
                                         uint64_t qrow, uint64_t n_ctx, uint64_t win, uint64_t tails, int n,
                                         int max_ctx, int n_heads, float scale, float softcap, const int32_t *runs,
                                         uint64_t d_runs, int n_runs, const hr_kv_cuda_tokens *tok, uint64_t out,
                                         uint64_t scratch, hr_error *err) {
    return attend_rows((cuda_kv *)st, layer, q, tables, max_blocks, qrow, n_ctx, win, tails, tok, n, max_ctx, n_heads,
                       scale, softcap, runs, d_runs, n_runs, out, scratch, err);
}

/* The token masks of the host path's queries (views with a mask): query i's row of masks is i, its words
 * those of the blocks its context covers; its scores come back added to view->score. */
typedef struct host_tokens {
    int32_t *view;   /* [n][2] */
    uint64_t *words; /* [n][max_blocks][L][Hkv][MW], then the scores [n][max_blocks][L][Hkv][B] */
    size_t n_words, n_scores;
    hr_kv_cuda_tokens dev;
} host_tokens;

static hr_status host_tokens_make(cuda_kv *s, const hr_kv_attn_query *qs, int n, int max_blocks, host_tokens *t,
                                  hr_error *err) {
    const hr_kv_storage_params *p = &s->p;
    const size_t per = (size_t)p->n_layers * (size_t)p->n_kv_heads, MW = ((size_t)p->block_size + 63) / 64;
    t->n_words = (size_t)n * max_blocks * per * MW;
    t->n_scores = (size_t)n * max_blocks * per * (size_t)p->block_size;
    t->view = malloc((size_t)n * 2 * sizeof *t->view);
    t->words = calloc(t->n_words + t->n_scores, sizeof *t->words);
    if (!t->view || !t->words) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    bool any_score = false;
    for (int i = 0; i < n; i++) {
        const hr_kv_attn_view *v = qs[i].view;
        const bool masked = v && v->mask && qs[i].n_ctx > 0;
        t->view[2 * i] = masked ? i : -1;
        t->view[2 * i + 1] = masked && v->score;
        any_score |= masked && v->score;
        if (masked)
            memcpy(t->words + (size_t)i * max_blocks * per * MW, v->mask,
                   (size_t)((qs[i].n_ctx + p->block_size - 1) / p->block_size) * per * MW * sizeof *t->words);
    }
    hr_status r = hr_cuda_alloc(s->dev, (size_t)n * 2 * sizeof(int32_t), &t->dev.view, err);
    if (!r) r = hr_cuda_alloc(s->dev, (t->n_words + t->n_scores) * sizeof(uint64_t), &t->dev.masks, err);
    if (!r) r = hr_cuda_upload(s->dev, t->dev.view, t->view, (size_t)n * 2 * sizeof(int32_t), err);
    if (!r) r = hr_cuda_upload(s->dev, t->dev.masks, t->words, (t->n_words + t->n_scores) * sizeof(uint64_t), err);
    if (!r && any_score) t->dev.scores = t->dev.masks + t->n_words * sizeof(uint64_t);
    return r;
}

/* the scores down, each query's added to its view's (the manager's atomics: queries may share them) */
static hr_status host_tokens_scores(cuda_kv *s, const hr_kv_attn_query *qs, int n, host_tokens *t, hr_error *err) {
    if (!t->dev.scores) return HR_OK;
    uint64_t *sc = t->words + t->n_words;
    hr_status r = hr_cuda_download(s->dev, sc, t->dev.scores, t->n_scores * sizeof(uint64_t), err);
    const size_t row = t->n_scores / (size_t)n;
    for (int i = 0; i < n && !r; i++) {
        if (!t->view[2 * i + 1]) continue;
        for (size_t k = 0; k < row; k++)
            if (sc[(size_t)i * row + k])
                atomic_fetch_add_explicit(&qs[i].view->score[k], sc[(size_t)i * row + k], memory_order_relaxed);
    }
    return r;
}

static void host_tokens_free(cuda_kv *s, host_tokens *t) {
    hr_cuda_free(s->dev, t->dev.view);
    hr_cuda_free(s->dev, t->dev.masks);
    free(t->view);
    free(t->words);
}

/* The manager's attention (host rows): queries and tables up, the device path, the result down, and
 * under token masks (h2o, snapkv) the masks up and the scores back into the views. Its buffers are
 * allocated per call: the GPU forward pass does not come this way (it calls
 * hr_kv_storage_cuda_attend_runs with its own); tests and host callers do. */
static void cuda_kv_attend(const hr_kv_storage *st, int layer, const hr_kv_attn_query *qs, int n,
                           const hr_kv_attn_args *a, float *scratch) {
    cuda_kv *s = (cuda_kv *)(void *)(uintptr_t)st; /* the device calls need the handle; no host state changes */
    const hr_kv_storage_params *p = &s->p;
    int H = a->n_heads, D = p->head_dim, B = p->block_size, max_ctx = 1;
    for (int i = 0; i < n; i++) max_ctx = qs[i].n_ctx > max_ctx ? qs[i].n_ctx : max_ctx;
    int max_blocks = (max_ctx + B - 1) / B;
    size_t qf = (size_t)n * H * D;
    int32_t *tables = calloc((size_t)n * max_blocks, sizeof *tables);
    int32_t *n_ctx = calloc((size_t)n * 4, sizeof *n_ctx); /* [n] contexts, [n][2] windows, [n] tail stages */
    float *q = malloc(qf * sizeof *q), *out = calloc(qf, sizeof *out);
    uint64_t dq = 0, dout = 0, dtab = 0, dctx = 0, dscr = 0;
    hr_error e = {0};
    hr_status r = tables && n_ctx && q && out ? HR_OK : hr_error_set(&e, HR_ERR_NOMEM, "out of memory");
    bool any_win = false, any_mask = false;
    host_tokens tok = {0};
    int max_vis = 1; /* the most visible positions of a query: what the splits cover */
    for (int i = 0; i < n && !r; i++) {
        const hr_kv_attn_view *v = qs[i].view;
        any_mask |= v && v->mask;
        n_ctx[i] = qs[i].n_ctx;
        n_ctx[3 * n + i] = qs[i].tail_stage;
        const int sinks = v && v->lo > v->sinks ? v->sinks : 0, lo = v && v->lo > v->sinks ? v->lo : 0;
        n_ctx[n + 2 * i] = sinks;
        n_ctx[n + 2 * i + 1] = lo;
        any_win |= lo > 0;
        const int vis = lo > 0 ? sinks + qs[i].n_ctx - lo : qs[i].n_ctx;
        max_vis = vis > max_vis ? vis : max_vis;
        memcpy(q + (size_t)i * H * D, qs[i].q, (size_t)H * D * sizeof *q);
        memcpy(tables + (size_t)i * max_blocks, qs[i].table, (size_t)((qs[i].n_ctx + B - 1) / B) * sizeof *tables);
    }
    if (!r) r = hr_cuda_alloc(s->dev, qf * sizeof(float), &dq, &e);
    if (!r) r = hr_cuda_alloc(s->dev, qf * sizeof(float), &dout, &e);
    if (!r) r = hr_cuda_alloc(s->dev, (size_t)n * max_blocks * sizeof(int32_t), &dtab, &e);
    if (!r) r = hr_cuda_alloc(s->dev, (size_t)n * 4 * sizeof(int32_t), &dctx, &e);
    if (!r) r = hr_cuda_alloc(s->dev, (size_t)hr_kv_storage_cuda_attend_scratch(st, n, H, max_vis), &dscr, &e);
    if (!r) r = hr_cuda_upload(s->dev, dq, q, qf * sizeof(float), &e);
    if (!r) r = hr_cuda_upload(s->dev, dtab, tables, (size_t)n * max_blocks * sizeof(int32_t), &e);
    if (!r) r = hr_cuda_upload(s->dev, dctx, n_ctx, (size_t)n * 4 * sizeof(int32_t), &e);
    if (!r && any_mask) r = host_tokens_make(s, qs, n, max_blocks, &tok, &e);
    if (!r)
        r = attend_rows(s, layer, dq, dtab, max_blocks, 0, dctx, any_win ? dctx + (uint64_t)n * 4u : 0,
                        dctx + (uint64_t)n * 12u, any_mask ? &tok.dev : NULL, n, max_vis, H, a->scale, a->softcap, NULL,
                        0, 0, dout, dscr, &e);
    if (!r) r = hr_cuda_download(s->dev, out, dout, qf * sizeof(float), &e);
    if (!r && any_mask) r = host_tokens_scores(s, qs, n, &tok, &e);
    host_tokens_free(s, &tok);
    /* only the heads asked are written back; zeros on failure */
    const int h0 = a->head_begin, h1 = hr_kv_attn_head_end(a);
    for (int i = 0; i < n; i++) {
        float *o = qs[i].out + (size_t)h0 * D;
        if (r)
            memset(o, 0, (size_t)(h1 - h0) * D * sizeof(float));
        else
            memcpy(o, out + ((size_t)i * H + h0) * D, (size_t)(h1 - h0) * D * sizeof(float));
    }
    keep(s, r, &e);
    uint64_t bufs[] = {dq, dout, dtab, dctx, dscr};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) hr_cuda_free(s->dev, bufs[i]);
    free(tables);
    free(n_ctx);
    free(q);
    free(out);
}

static void cuda_kv_read_block(const hr_kv_storage *st, int32_t block, void *out) {
    cuda_kv *s = (cuda_kv *)(void *)(uintptr_t)st;
    hr_error e = {0};
    keep(s, hr_cuda_download(s->dev, out, s->arena + (uint64_t)block * s->block_bytes, s->block_bytes, &e), &e);
}

static void cuda_kv_write_block(hr_kv_storage *st, int32_t block, const void *in) {
    cuda_kv *s = (cuda_kv *)st;
    hr_error e = {0};
    keep(s, hr_cuda_upload(s->dev, s->arena + (uint64_t)block * s->block_bytes, in, s->block_bytes, &e), &e);
}

static void cuda_kv_copy_block(hr_kv_storage *st, int32_t from, int32_t to) {
    cuda_kv *s = (cuda_kv *)st;
    hr_error e = {0};
    keep(s,
         hr_cuda_copy(s->dev, s->arena + (uint64_t)to * s->block_bytes, s->arena + (uint64_t)from * s->block_bytes,
                      s->block_bytes, &e),
         &e);
}

/* the swap tier's slots in page-locked memory: whole-block reads and writes go by DMA straight into them */
static void *cuda_kv_host_alloc(hr_kv_storage *st, size_t bytes, hr_error *err) {
    void *p = hr_cuda_host_alloc(((cuda_kv *)st)->dev, bytes, err);
    if (!p) hr_error_prefix(err, "KV swap tier");
    return p;
}
static void cuda_kv_host_free(hr_kv_storage *st, void *p) { hr_cuda_host_free(((cuda_kv *)st)->dev, p); }

/* the tail buffers (deferred formats): the bytes on the device, the counts here; the manager calls
 * these only for a storage with stages */
static uint64_t stage_at(const cuda_kv *s, int32_t stage) { return s->stages + (uint64_t)stage * s->stage_bytes; }
static uint16_t *filled_of(const cuda_kv *s, int32_t stage) { return s->filled + (size_t)stage * s->p.n_layers; }

static void cuda_kv_stage_reset(hr_kv_storage *st, int32_t stage) {
    cuda_kv *s = (cuda_kv *)st;
    memset(filled_of(s, stage), 0, (size_t)s->p.n_layers * sizeof *s->filled);
}

static int cuda_kv_stage_filled(const hr_kv_storage *st, int32_t stage, int layer) {
    return filled_of((const cuda_kv *)st, stage)[layer];
}

static void cuda_kv_stage_read(const hr_kv_storage *st, int32_t stage, void *out, uint16_t *filled) {
    cuda_kv *s = (cuda_kv *)(void *)(uintptr_t)st;
    hr_error e = {0};
    keep(s, hr_cuda_download(s->dev, out, stage_at(s, stage), s->stage_bytes, &e), &e);
    memcpy(filled, filled_of(s, stage), (size_t)s->p.n_layers * sizeof *filled);
}

static void cuda_kv_stage_write(hr_kv_storage *st, int32_t stage, const void *in, const uint16_t *filled) {
    cuda_kv *s = (cuda_kv *)st;
    hr_error e = {0};
    keep(s, hr_cuda_upload(s->dev, stage_at(s, stage), in, s->stage_bytes, &e), &e);
    memcpy(filled_of(s, stage), filled, (size_t)s->p.n_layers * sizeof *filled);
}

static void cuda_kv_stage_copy(hr_kv_storage *st, int32_t from, int32_t to) {
    cuda_kv *s = (cuda_kv *)st;
    hr_error e = {0};
    keep(s, hr_cuda_copy(s->dev, stage_at(s, to), stage_at(s, from), s->stage_bytes, &e), &e);
    memcpy(filled_of(s, to), filled_of(s, from), (size_t)s->p.n_layers * sizeof *s->filled);
}

static const hr_kv_storage_ops cuda_kv_ops = {
    .name = "cuda",
    .destroy = cuda_kv_destroy,
    .isa = cuda_kv_isa,
    .footprint = cuda_kv_footprint,
    .write = cuda_kv_write,
    .attend = cuda_kv_attend,
    .read_block = cuda_kv_read_block,
    .write_block = cuda_kv_write_block,
    .copy_block = cuda_kv_copy_block,
    .stage_reset = cuda_kv_stage_reset,
    .stage_filled = cuda_kv_stage_filled,
    .stage_read = cuda_kv_stage_read,
    .stage_write = cuda_kv_stage_write,
    .stage_copy = cuda_kv_stage_copy,
    .host_alloc = cuda_kv_host_alloc,
    .host_free = cuda_kv_host_free,
};

/* "split" or "rows" (NULL or empty: split) */
static hr_status attn_kernel_of(const char *name, bool *rows, hr_error *err) {
    if (!name || !*name || !strcmp(name, "split")) {
        *rows = false;
    } else if (!strcmp(name, "rows")) {
        *rows = true;
    } else {
        return hr_error_set(err, HR_ERR_INVALID_ARG, "CUDA KV: attention kernel '%s': expected split or rows", name);
    }
    return HR_OK;
}

hr_status hr_kv_storage_cuda_set_attn_kernel(hr_kv_storage *st, const char *name, hr_error *err) {
    return attn_kernel_of(name, &((cuda_kv *)st)->attn_rows, err);
}

/* "split" or "mma" (NULL or empty: split) */
static hr_status prefill_attn_of(const char *name, bool *mma, hr_error *err) {
    if (!name || !*name || !strcmp(name, "split")) {
        *mma = false;
    } else if (!strcmp(name, "mma")) {
        *mma = true;
    } else {
        return hr_error_set(err, HR_ERR_INVALID_ARG, "CUDA KV: prefill attention '%s': expected split or mma", name);
    }
    return HR_OK;
}

hr_status hr_kv_storage_cuda_set_prefill_attn(hr_kv_storage *st, const char *name, hr_error *err) {
    return prefill_attn_of(name, &((cuda_kv *)st)->prefill_mma, err);
}

/* q4h's measurement-only variants (HEADROOM_KV_Q4H_VARIANT: keys unrotated, symmetric codes) are the
 * CPU's alone */
static bool fmt_ok(const kv_fmt *f) {
    return f->format == HR_KV_F32 || f->format == HR_KV_F16 || f->format == HR_KV_BF16 || f->format == HR_KV_Q8 ||
           f->format == HR_KV_FP8 || f->format == HR_KV_Q4 || f->format == HR_KV_KIVI2 ||
           (f->format == HR_KV_Q4H && !f->sym && (f->role != KV_K || f->rotate));
}

hr_status hr_kv_storage_cuda_create(hr_cuda_device *dev, const hr_kv_storage_params *p, hr_kv_storage **out,
                                    hr_error *err) {
    if (!fmt_ok(&p->k) || !fmt_ok(&p->v))
        return hr_error_set(
            err, HR_ERR_UNSUPPORTED,
            "CUDA KV: the formats on the GPU are f32, f16, bf16, q8, fp8, q4, kivi2 and q4h (K %s, V %s)",
            hr_kv_format_name(p->k.format), hr_kv_format_name(p->v.format));
    const bool deferred = p->k.deferred || p->v.deferred;
    if (p->n_blocks < 1 || p->n_stage < 0 || (deferred && p->n_stage < 1) || (!deferred && p->n_stage > 0) ||
        p->block_size > 256)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "CUDA KV: %d blocks of %d tokens and %d stages asked for (%s)",
                            p->n_blocks, p->block_size, p->n_stage,
                            deferred ? "q4 and kivi2 need stages" : "stages are for q4 and kivi2");
    if (p->head_dim > CUDA_ATT_MAX_D)
        return hr_error_set(err, HR_ERR_UNSUPPORTED, "CUDA KV: head_dim %d is over the attention kernel's %d",
                            p->head_dim, CUDA_ATT_MAX_D);
    if (p->v_from_k) /* its kernels read V from a V arena */
        return hr_error_set(err, HR_ERR_UNSUPPORTED,
                            "CUDA KV: a latent cache (V read from K: deepseek2) is not supported yet");
    bool rows = false;
    if (attn_kernel_of(getenv("HEADROOM_CUDA_ATTN_KERNEL"), &rows, err))
        return hr_error_set(err, HR_ERR_INVALID_ARG, "CUDA KV: HEADROOM_CUDA_ATTN_KERNEL=%s: expected split or rows",
                            getenv("HEADROOM_CUDA_ATTN_KERNEL"));
    bool mma = false;
    if (prefill_attn_of(getenv("HEADROOM_CUDA_PREFILL_ATTN"), &mma, err))
        return hr_error_set(err, HR_ERR_INVALID_ARG, "CUDA KV: HEADROOM_CUDA_PREFILL_ATTN=%s: expected split or mma",
                            getenv("HEADROOM_CUDA_PREFILL_ATTN"));
    cuda_kv *s = calloc(1, sizeof *s);
    if (!s) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    s->attn_rows = rows;
    s->prefill_mma = mma;
    s->base.ops = &cuda_kv_ops;
    s->p = *p;
    s->dev = dev;
    s->target_blocks = hr_cuda_attn_target_blocks();
    s->block_bytes = (uint64_t)p->n_layers * (uint64_t)p->n_kv_heads * (p->k.head_bytes + p->v.head_bytes);
    s->deferred = deferred;
    /* the pieces the arena plan counts (hr_cuda_arena_plan_compute): the blocks, the host write's rows,
     * the tail buffers (hr_kv_fixed_bytes) */
    hr_status st = hr_cuda_alloc(dev, (size_t)(s->block_bytes * (uint64_t)p->n_blocks), &s->arena, err);
    if (!st) st = hr_cuda_alloc(dev, (size_t)hr_cuda_storage_stage_bytes(p->n_kv_heads, p->head_dim), &s->rows, err);
    if (!st && deferred) {
        s->stage_bytes =
            (uint64_t)p->n_layers * 2u * (uint64_t)p->n_kv_heads * (uint64_t)p->block_size * (uint64_t)p->head_dim * 2u;
        st = hr_cuda_alloc(dev, (size_t)(s->stage_bytes * (uint64_t)p->n_stage), &s->stages, err);
        if (!st && !(s->filled = calloc((size_t)p->n_stage * (size_t)p->n_layers, sizeof *s->filled)))
            st = hr_error_set(err, HR_ERR_NOMEM, "CUDA KV: out of memory for %d stages' counts", p->n_stage);
    }
    if (st) {
        cuda_kv_destroy(&s->base);
        return st;
    }
    *out = &s->base;
    return HR_OK;
}

hr_status hr_kv_storage_cuda_create_in(void *dev, const hr_kv_storage_params *p, hr_kv_storage **out, hr_error *err) {
    return hr_kv_storage_cuda_create(dev, p, out, err);
}

uint64_t hr_kv_storage_cuda_arena(const hr_kv_storage *st) { return ((const cuda_kv *)st)->arena; }
hr_cuda_device *hr_kv_storage_cuda_device(const hr_kv_storage *st) { return ((const cuda_kv *)st)->dev; }
bool hr_kv_storage_cuda_attn_rows(const hr_kv_storage *st) { return ((const cuda_kv *)st)->attn_rows; }

hr_status hr_kv_storage_cuda_check(const hr_kv_storage *st, hr_error *err) {
    const cuda_kv *s = (const cuda_kv *)st;
    if (!s->failed) return HR_OK;
    if (err) *err = s->msg;
    return s->msg.code ? s->msg.code : HR_ERR_UNSUPPORTED;
}

/* kv_storage_cuda.c: a KV storage (kv/kv_storage.h) whose blocks live in one device allocation, in
 * the same byte layout as the CPU storage's blocks (HR_KV_BLOCK_LAYOUT: [L][K heads | V heads]), so
 * whole-block reads and writes (swap, the remote tier) move the same bytes either way.
 *
 * A first, simple version: every write converts one token on the host and copies it up; attend
 * copies the queries and tables up, runs kernels/attention.cu's split attention (chunks of 256
 * positions, a KV head's query heads together) and its reduction, and copies the result down. The storage ops return
 * nothing, so a device fault there is kept (failed, msg) and the result is zeros; hr_kv_storage_cuda_create's caller
 * sees it on the next check. None of this has run on a GPU yet (docs/GPU.md). Formats: f32, f16 and q8; the others
 * (bf16, fp8, and the deferred q4, kivi2, q4h) are refused. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda.h"
#include "tensor/tensor.h"

enum { CUDA_KV_F16 = 0, CUDA_KV_Q8 = 1, CUDA_KV_F32 = 2 };           /* kernels/attention.cu's HR_K_KV_* */
enum { CUDA_ATT_CHUNK = 256, CUDA_ATT_G = 8, CUDA_ATT_MAX_D = 256 }; /* its HR_K_ATT_* */

/* kernels/attention.cu's hr_k_attn_shape, field for field (passed by value to the kernel) */
typedef struct attn_shape {
    uint64_t block_bytes, k_head_bytes, v_head_bytes;
    int n_layers, n_kv_heads, n_heads, head_dim, block_size;
    int k_fmt, v_fmt, k_group, v_group;
    int max_blocks, n_splits;
    float scale, softcap;
} attn_shape;
_Static_assert(sizeof(attn_shape) == 80, "attn_shape must match hr_k_attn_shape in kernels/attention.cu");

typedef struct cuda_kv {
    hr_kv_storage base; /* first: the manager holds the storage by it */
    hr_kv_storage_params p;
    hr_cuda_device *dev;
    uint64_t arena;       /* n_blocks * block_bytes */
    uint64_t block_bytes; /* L * Hkv * (K + V head bytes) */
    bool failed;          /* a device call of a void op failed (msg says which) */
    hr_error msg;
} cuda_kv;

static int fmt_code(const kv_fmt *f) {
    return f->format == HR_KV_Q8 ? CUDA_KV_Q8 : f->format == HR_KV_F32 ? CUDA_KV_F32 : CUDA_KV_F16;
}

/* where head h of layer's K (role 0) or V (role 1) region starts in a block */
static uint64_t head_off(const cuda_kv *s, int layer, int role, int h) {
    const hr_kv_storage_params *p = &s->p;
    uint64_t layer_bytes = (uint64_t)p->n_kv_heads * (p->k.head_bytes + p->v.head_bytes);
    uint64_t off = (uint64_t)layer * layer_bytes;
    return role == 0 ? off + (uint64_t)h * p->k.head_bytes
                     : off + (uint64_t)p->n_kv_heads * p->k.head_bytes + (uint64_t)h * p->v.head_bytes;
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
    free(s);
}

static const char *cuda_kv_isa(const hr_kv_storage *st) { return "sm_90a"; }

static uint64_t cuda_kv_footprint(const hr_kv_storage *st) {
    const cuda_kv *s = (const cuda_kv *)st;
    return s->block_bytes * (uint64_t)s->p.n_blocks;
}

/* One token's head of D floats in format f at slot t: the floats, f16 halves, or q8 codes with an f16 scale per
 * group of G (scale = max |x| / 127 rounded to f16, code = round(x / scale) within +-127): the bytes
 * the CPU storage writes (test_cuda_backend compares them through the fake driver). */
static hr_status put_head(cuda_kv *s, const kv_fmt *f, uint64_t head, int t, const float *x, hr_error *err) {
    int D = f->D;
    unsigned char buf[2048];
    if ((size_t)D * 2 > sizeof buf)
        return hr_error_set(err, HR_ERR_UNSUPPORTED, "CUDA KV: head_dim %d is too large", D);
    if (f->format == HR_KV_F32)
        return hr_cuda_upload(s->dev, head + (uint64_t)t * (uint64_t)D * 4, x, (size_t)D * 4, err);
    if (f->format != HR_KV_Q8) {
        for (int d = 0; d < D; d++) {
            hr_f16 h = hr_f32_to_f16(x[d]);
            memcpy(buf + 2 * d, &h, 2);
        }
        return hr_cuda_upload(s->dev, head + (uint64_t)t * (uint64_t)D * 2, buf, (size_t)D * 2, err);
    }
    int G = f->G, n_groups = D / G;
    unsigned char scales[2 * 256];
    if (n_groups > 256) return hr_error_set(err, HR_ERR_UNSUPPORTED, "CUDA KV: too many q8 groups");
    for (int g = 0; g < n_groups; g++) {
        float amax = 0.0f;
        for (int i = 0; i < G; i++) amax = fmaxf(amax, fabsf(x[g * G + i]));
        /* the codes are made against the scale as stored (f16), so code * scale is what was meant */
        hr_f16 h = hr_f32_to_f16(amax / 127.0f);
        float sc = hr_f16_to_f32(h), inv = sc > 0.0f ? 1.0f / sc : 0.0f;
        for (int i = 0; i < G; i++) {
            float r = rintf(x[g * G + i] * inv);
            buf[g * G + i] = (unsigned char)(signed char)fmaxf(-127.0f, fminf(127.0f, r));
        }
        memcpy(scales + 2 * g, &h, 2);
    }
    hr_status st = hr_cuda_upload(s->dev, head + (uint64_t)t * (uint64_t)D, buf, (size_t)D, err);
    if (!st)
        st = hr_cuda_upload(s->dev, head + (uint64_t)f->B * (uint64_t)D + (uint64_t)t * (uint64_t)n_groups * 2, scales,
                            (size_t)n_groups * 2, err);
    return st;
}

static void cuda_kv_write(hr_kv_storage *st, int layer, int32_t block, int t, int32_t stage, const float *k,
                          const float *v) {
    cuda_kv *s = (cuda_kv *)st;
    int D = s->p.head_dim;
    uint64_t base = s->arena + (uint64_t)block * s->block_bytes;
    hr_error e = {0};
    hr_status r = HR_OK;
    for (int h = 0; h < s->p.n_kv_heads && !r; h++) {
        r = put_head(s, &s->p.k, base + head_off(s, layer, 0, h), t, k + (size_t)h * D, &e);
        if (!r) r = put_head(s, &s->p.v, base + head_off(s, layer, 1, h), t, v + (size_t)h * D, &e);
    }
    keep(s, r, &e);
}

static void cuda_kv_attend(const hr_kv_storage *st, int layer, const hr_kv_attn_query *qs, int n,
                           const hr_kv_attn_args *a, float *scratch) {
    cuda_kv *s = (cuda_kv *)(void *)(uintptr_t)st; /* the device calls need the handle; no host state changes */
    const hr_kv_storage_params *p = &s->p;
    int H = a->n_heads, D = p->head_dim, B = p->block_size, max_ctx = 1, max_blocks = 1;
    for (int i = 0; i < n; i++) max_ctx = qs[i].n_ctx > max_ctx ? qs[i].n_ctx : max_ctx;
    max_blocks = (max_ctx + B - 1) / B;
    int n_splits = (max_ctx + CUDA_ATT_CHUNK - 1) / CUDA_ATT_CHUNK, Hkv = p->n_kv_heads;
    int ng = (H / Hkv + CUDA_ATT_G - 1) / CUDA_ATT_G;
    size_t qf = (size_t)n * H * D, parts = (size_t)n * H * (size_t)n_splits;
    int32_t *tables = calloc((size_t)n * max_blocks, sizeof *tables);
    int32_t *n_ctx = calloc((size_t)n, sizeof *n_ctx);
    float *q = malloc(qf * sizeof *q), *out = calloc(qf, sizeof *out);
    uint64_t dq = 0, dout = 0, dtab = 0, dctx = 0, dopart = 0, dml = 0;
    hr_error e = {0};
    hr_status r = tables && n_ctx && q && out ? HR_OK : hr_error_set(&e, HR_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && !r; i++) {
        if (qs[i].view) r = hr_error_set(&e, HR_ERR_UNSUPPORTED, "CUDA KV: attention views are not supported yet");
        n_ctx[i] = qs[i].n_ctx;
        memcpy(q + (size_t)i * H * D, qs[i].q, (size_t)H * D * sizeof *q);
        memcpy(tables + (size_t)i * max_blocks, qs[i].table, (size_t)((qs[i].n_ctx + B - 1) / B) * sizeof *tables);
    }
    if (!r) r = hr_cuda_alloc(s->dev, qf * sizeof(float), &dq, &e);
    if (!r) r = hr_cuda_alloc(s->dev, qf * sizeof(float), &dout, &e);
    if (!r) r = hr_cuda_alloc(s->dev, (size_t)n * max_blocks * sizeof(int32_t), &dtab, &e);
    if (!r) r = hr_cuda_alloc(s->dev, (size_t)n * sizeof(int32_t), &dctx, &e);
    if (!r) r = hr_cuda_alloc(s->dev, parts * (size_t)D * sizeof(float), &dopart, &e);
    if (!r) r = hr_cuda_alloc(s->dev, parts * 2 * sizeof(float), &dml, &e);
    if (!r) r = hr_cuda_upload(s->dev, dq, q, qf * sizeof(float), &e);
    if (!r) r = hr_cuda_upload(s->dev, dtab, tables, (size_t)n * max_blocks * sizeof(int32_t), &e);
    if (!r) r = hr_cuda_upload(s->dev, dctx, n_ctx, (size_t)n * sizeof(int32_t), &e);
    attn_shape sh = {.block_bytes = s->block_bytes,
                     .k_head_bytes = p->k.head_bytes,
                     .v_head_bytes = p->v.head_bytes,
                     .n_layers = p->n_layers,
                     .n_kv_heads = Hkv,
                     .n_heads = H,
                     .head_dim = D,
                     .block_size = B,
                     .k_fmt = fmt_code(&p->k),
                     .v_fmt = fmt_code(&p->v),
                     .k_group = p->k.G > 0 ? p->k.G : 1,
                     .v_group = p->v.G > 0 ? p->v.G : 1,
                     .max_blocks = max_blocks,
                     .n_splits = n_splits,
                     .scale = a->scale,
                     .softcap = a->softcap};
    void *args[] = {&dopart, &dml, &dq, &s->arena, &dtab, &dctx, &layer, &sh};
    if (!r && n > 0)
        r = hr_cuda_launch(s->dev, "hr_k_attn_split", (unsigned)(n * Hkv * ng), (unsigned)n_splits, 256, args, &e);
    void *rargs[] = {&dout, &dopart, &dml, &H, &D, &n_splits};
    if (!r && n > 0) r = hr_cuda_launch(s->dev, "hr_k_attn_reduce", (unsigned)n, (unsigned)H, 256, rargs, &e);
    if (!r) r = hr_cuda_download(s->dev, out, dout, qf * sizeof(float), &e);
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
    hr_cuda_free(s->dev, dq);
    hr_cuda_free(s->dev, dout);
    hr_cuda_free(s->dev, dtab);
    hr_cuda_free(s->dev, dctx);
    hr_cuda_free(s->dev, dopart);
    hr_cuda_free(s->dev, dml);
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

/* no stages: create refuses the deferred formats that use them, so the manager never calls these */
static void cuda_kv_stage_reset(hr_kv_storage *st, int32_t stage) {}
static int cuda_kv_stage_filled(const hr_kv_storage *st, int32_t stage, int layer) { return 0; }
static void cuda_kv_stage_read(const hr_kv_storage *st, int32_t stage, void *out, uint16_t *filled) {}
static void cuda_kv_stage_write(hr_kv_storage *st, int32_t stage, const void *in, const uint16_t *filled) {}
static void cuda_kv_stage_copy(hr_kv_storage *st, int32_t from, int32_t to) {}

static const hr_kv_storage_ops cuda_kv_ops = {
    .name = "cuda",
    .whole_sequences = true, /* attend refuses views (below) */
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
};

static bool fmt_ok(const kv_fmt *f) {
    return f->format == HR_KV_F32 || f->format == HR_KV_F16 || f->format == HR_KV_Q8;
}

hr_status hr_kv_storage_cuda_create(hr_cuda_device *dev, const hr_kv_storage_params *p, hr_kv_storage **out,
                                    hr_error *err) {
    if (!fmt_ok(&p->k) || !fmt_ok(&p->v) || p->n_stage > 0)
        return hr_error_set(err, HR_ERR_UNSUPPORTED,
                            "CUDA KV: only the f32, f16 and q8 formats are supported (K %s, V %s)",
                            hr_kv_format_name(p->k.format), hr_kv_format_name(p->v.format));
    if (p->n_blocks < 1) return hr_error_set(err, HR_ERR_INVALID_ARG, "CUDA KV: no blocks asked for");
    if (p->head_dim > CUDA_ATT_MAX_D)
        return hr_error_set(err, HR_ERR_UNSUPPORTED, "CUDA KV: head_dim %d is over the attention kernel's %d",
                            p->head_dim, CUDA_ATT_MAX_D);
    if (p->v_from_k) /* its kernels read V from a V arena */
        return hr_error_set(err, HR_ERR_UNSUPPORTED,
                            "CUDA KV: a latent cache (V read from K: deepseek2) is not supported yet");
    cuda_kv *s = calloc(1, sizeof *s);
    if (!s) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    s->base.ops = &cuda_kv_ops;
    s->p = *p;
    s->dev = dev;
    s->block_bytes = (uint64_t)p->n_layers * (uint64_t)p->n_kv_heads * (p->k.head_bytes + p->v.head_bytes);
    hr_status st = hr_cuda_alloc(dev, (size_t)(s->block_bytes * (uint64_t)p->n_blocks), &s->arena, err);
    if (st) {
        free(s);
        return st;
    }
    *out = &s->base;
    return HR_OK;
}

hr_status hr_kv_storage_cuda_create_in(void *dev, const hr_kv_storage_params *p, hr_kv_storage **out, hr_error *err) {
    return hr_kv_storage_cuda_create(dev, p, out, err);
}

uint64_t hr_kv_storage_cuda_arena(const hr_kv_storage *st) { return ((const cuda_kv *)st)->arena; }

hr_status hr_kv_storage_cuda_check(const hr_kv_storage *st, hr_error *err) {
    const cuda_kv *s = (const cuda_kv *)st;
    if (!s->failed) return HR_OK;
    if (err) *err = s->msg;
    return s->msg.code ? s->msg.code : HR_ERR_UNSUPPORTED;
}

/* test_kv_storage.c: the KV manager reaches block bytes only through the storage interface
 * (kv/kv_storage.h), so a storage the pool did not make itself runs it unchanged.
 *
 * The storage here wraps the CPU one and stores block b at the CPU storage's block n - 1 - b (and tail
 * buffer s at n_stage - 1 - s), counting every call. A pool on it and a pool on the plain CPU storage
 * go through the same operations (writes, commits, a fork with a partial tail, a swap out and back
 * in, a block read for the remote tier, a prefix fetched through the observer): every attention
 * output must be equal bit for bit, and the counts must show that fork, swap and fetch moved bytes
 * through the interface (a manager that touched bytes another way would read the wrong block).
 * Also: the storage takes its ISA from the config and refuses a name it does not know. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kv_storage_cpu.h"
#include "harness.h"
#include "kv/kv.h"

enum { L = 2, HKV = 2, D = 16, H = 4, B = 16, NT = 45, NB = 24 };

/* ---- the wrapping storage ------------------------------------------------------------------------ */

enum {
    C_WRITE,
    C_ATTEND,
    C_READ,
    C_WRITE_BLOCK,
    C_COPY,
    C_STAGE_RESET,
    C_STAGE_READ,
    C_STAGE_WRITE,
    C_STAGE_COPY,
    C_N
};

typedef struct wrap {
    hr_kv_storage base;
    hr_kv_storage *in;
    int n_blocks, n_stage;
    long calls[C_N];
} wrap;

static wrap *g_last; /* the storage the last pool made, for the counts */

static int32_t wb(const wrap *w, int32_t b) { return w->n_blocks - 1 - b; }
static int32_t ws(const wrap *w, int32_t s) { return s < 0 ? s : w->n_stage - 1 - s; }

static void w_destroy(hr_kv_storage *st) {
    wrap *w = (wrap *)st;
    w->in->ops->destroy(w->in);
    free(w);
}
static const char *w_isa(const hr_kv_storage *st) {
    const wrap *w = (const wrap *)st;
    return w->in->ops->isa(w->in);
}
static uint64_t w_footprint(const hr_kv_storage *st) {
    const wrap *w = (const wrap *)st;
    return w->in->ops->footprint(w->in);
}
static void w_write(hr_kv_storage *st, int layer, int32_t b, int t, int32_t s, const float *k, const float *v) {
    wrap *w = (wrap *)st;
    __atomic_fetch_add(&w->calls[C_WRITE], 1, __ATOMIC_RELAXED);
    w->in->ops->write(w->in, layer, wb(w, b), t, ws(w, s), k, v);
}
static void w_attend(const hr_kv_storage *st, int layer, const hr_kv_attn_query *qs, int n, const hr_kv_attn_args *a,
                     float *scratch) {
    wrap *w = (wrap *)st;
    __atomic_fetch_add(&w->calls[C_ATTEND], 1, __ATOMIC_RELAXED);
    for (int i = 0; i < n; i++) {
        int32_t table[64];
        int nb = (qs[i].n_ctx + B - 1) / B;
        CHECK(nb <= 64);
        for (int j = 0; j < nb && j < 64; j++) table[j] = qs[i].table[j] < 0 ? -1 : wb(w, qs[i].table[j]);
        hr_kv_attn_query q = qs[i];
        q.table = table;
        q.tail_stage = ws(w, q.tail_stage);
        w->in->ops->attend(w->in, layer, &q, 1, a, scratch);
    }
}
static void w_read_block(const hr_kv_storage *st, int32_t b, void *out) {
    wrap *w = (wrap *)st;
    w->calls[C_READ]++;
    w->in->ops->read_block(w->in, wb(w, b), out);
}
static void w_write_block(hr_kv_storage *st, int32_t b, const void *in) {
    wrap *w = (wrap *)st;
    w->calls[C_WRITE_BLOCK]++;
    w->in->ops->write_block(w->in, wb(w, b), in);
}
static void w_copy_block(hr_kv_storage *st, int32_t from, int32_t to) {
    wrap *w = (wrap *)st;
    w->calls[C_COPY]++;
    w->in->ops->copy_block(w->in, wb(w, from), wb(w, to));
}
static void w_stage_reset(hr_kv_storage *st, int32_t s) {
    wrap *w = (wrap *)st;
    w->calls[C_STAGE_RESET]++;
    w->in->ops->stage_reset(w->in, ws(w, s));
}
static int w_stage_filled(const hr_kv_storage *st, int32_t s, int layer) {
    const wrap *w = (const wrap *)st;
    return w->in->ops->stage_filled(w->in, ws(w, s), layer);
}
static void w_stage_read(const hr_kv_storage *st, int32_t s, void *out, uint16_t *filled) {
    wrap *w = (wrap *)st;
    w->calls[C_STAGE_READ]++;
    w->in->ops->stage_read(w->in, ws(w, s), out, filled);
}
static void w_stage_write(hr_kv_storage *st, int32_t s, const void *in, const uint16_t *filled) {
    wrap *w = (wrap *)st;
    w->calls[C_STAGE_WRITE]++;
    w->in->ops->stage_write(w->in, ws(w, s), in, filled);
}
static void w_stage_copy(hr_kv_storage *st, int32_t from, int32_t to) {
    wrap *w = (wrap *)st;
    w->calls[C_STAGE_COPY]++;
    w->in->ops->stage_copy(w->in, ws(w, from), ws(w, to));
}

static const hr_kv_storage_ops wrap_ops = {.name = "wrap",
                                           .destroy = w_destroy,
                                           .isa = w_isa,
                                           .footprint = w_footprint,
                                           .write = w_write,
                                           .attend = w_attend,
                                           .read_block = w_read_block,
                                           .write_block = w_write_block,
                                           .copy_block = w_copy_block,
                                           .stage_reset = w_stage_reset,
                                           .stage_filled = w_stage_filled,
                                           .stage_read = w_stage_read,
                                           .stage_write = w_stage_write,
                                           .stage_copy = w_stage_copy};

static hr_status wrap_create(void *user, const hr_kv_storage_params *p, hr_kv_storage **out, hr_error *err) {
    wrap *w = calloc(1, sizeof *w);
    if (!w) return hr_error_set(err, HR_ERR_NOMEM, "wrap: out of memory");
    hr_status st = hr_kv_storage_cpu_create(p, &w->in, err);
    if (st != HR_OK) {
        free(w);
        return st;
    }
    w->base.ops = &wrap_ops;
    w->n_blocks = p->n_blocks;
    w->n_stage = p->n_stage;
    g_last = w;
    *out = &w->base;
    return HR_OK;
}

/* ---- the workload -------------------------------------------------------------------------------- */

static float kd[NT + B][HKV * D], vd[NT + B][HKV * D];
static int32_t tok[NT + B];

static hr_kv_config config(hr_kv_format f, hr_kv_storage_create_fn storage) {
    hr_kv_config c = {.n_layers = L,
                      .n_kv_heads = HKV,
                      .head_dim = D,
                      .block_size = B,
                      .k_format = f,
                      .v_format = f,
                      .max_seqs = 4,
                      .storage = storage};
    c.budget_bytes = hr_kv_block_bytes(&c) * NB + hr_kv_fixed_bytes(&c);
    return c;
}

static void put(hr_kv_pool *p, hr_kv_seq s, int from, int to) {
    hr_error err = {0};
    CHECKF(hr_kv_seq_reserve(p, s, to, &err) == HR_OK, "%s", err.msg);
    for (int t = from; t < to; t++)
        for (int l = 0; l < L; l++) hr_kv_write(p, l, s, t, kd[t], vd[t]);
    hr_kv_seq_commit(p, s, tok + from, to - from);
}

/* Attention of seq in both pools equal bit for bit for every n_ctx in [1, n] and every layer. */
static bool same(hr_kv_pool *p, hr_kv_seq a, hr_kv_pool *q, hr_kv_seq b, int n) {
    float x[H * D], oa[H * D], ob[H * D], scratch[1024];
    for (int i = 0; i < H * D; i++) x[i] = sinf(0.7f * (float)i);
    bool eq = true;
    for (int l = 0; l < L; l++)
        for (int t = 1; t <= n; t++) {
            memset(oa, 0, sizeof oa);
            memset(ob, 0xff, sizeof ob);
            hr_kv_attention(p, l, a, t, x, H, 0.25f, oa, scratch);
            hr_kv_attention(q, l, b, t, x, H, 0.25f, ob, scratch);
            eq &= memcmp(oa, ob, sizeof oa) == 0;
        }
    return eq;
}

/* The observer's fetch for the third pool: blocks come from the plain pool. */
static bool fetch_from(void *ctx, const hr_kv_block_info *bi, void *out, uint64_t n) {
    return hr_kv_pool_read_block(ctx, bi->hash, out, n);
}

static void run(hr_kv_format f) {
    const char *fn = hr_kv_format_name(f);
    bool deferred = f == HR_KV_Q4 || f == HR_KV_KIVI2;
    hr_error err = {0};
    hr_kv_config cp = config(f, NULL), cw = config(f, wrap_create);
    hr_kv_pool *p = NULL, *w = NULL;
    CHECKF(hr_kv_pool_create(&cp, &p, &err) == HR_OK, "%s", err.msg);
    g_last = NULL;
    CHECKF(hr_kv_pool_create(&cw, &w, &err) == HR_OK, "%s", err.msg);
    wrap *ws_ = g_last;
    CHECK(ws_ != NULL);
    if (!p || !w || !ws_) return;
    CHECKF(!strcmp(hr_kv_pool_isa(p), hr_kv_pool_isa(w)), "%s: isa %s vs %s", fn, hr_kv_pool_isa(p), hr_kv_pool_isa(w));
    CHECK(ws_->n_blocks == NB && (ws_->n_stage > 0) == deferred);
    CHECK(w_footprint(&ws_->base) == cw.budget_bytes); /* blocks + tail buffers: the whole budget */

    /* writes and commits: 2 full blocks and a partial one */
    hr_kv_seq a = -1, a2 = -1;
    CHECK(hr_kv_seq_create(p, &a, &err) == HR_OK && hr_kv_seq_create(w, &a2, &err) == HR_OK);
    put(p, a, 0, NT);
    put(w, a2, 0, NT);
    CHECK(ws_->calls[C_WRITE] == (long)NT * L);
    CHECKF(same(p, a, w, a2, NT), "%s: attention after writes differs", fn);
    CHECK(ws_->calls[C_ATTEND] == (long)NT * L);

    /* a prefix fetched through the observer (the remote tier's path) lands through write_block and
     * reads as the original */
    hr_kv_pool *x = NULL;
    g_last = NULL;
    CHECKF(hr_kv_pool_create(&cw, &x, &err) == HR_OK, "%s", err.msg);
    wrap *wx = g_last;
    hr_kv_observer obs = {.fetch = fetch_from, .ctx = p};
    CHECK(x && wx && hr_kv_pool_set_observer(x, &obs, &err) == HR_OK);
    hr_kv_seq e = -1;
    int n_cached = 0;
    CHECK(x && hr_kv_seq_create(x, &e, &err) == HR_OK);
    CHECK(x && hr_kv_seq_share_prefix(x, e, tok, NT, &n_cached, &err) == HR_OK);
    CHECKF(n_cached == 2 * B && wx && wx->calls[C_WRITE_BLOCK] == 2, "%s: fetched %d tokens", fn, n_cached);
    if (x && n_cached == 2 * B) {
        put(x, e, n_cached, NT);
        CHECKF(same(p, a, x, e, NT), "%s: attention over a fetched prefix differs", fn);
    }
    hr_kv_pool_destroy(x);

    /* fork: the full blocks are shared, the partial tail copied (with its tail buffer) */
    hr_kv_seq c = -1, c2 = -1;
    CHECK(hr_kv_seq_fork(p, a, &c, &err) == HR_OK && hr_kv_seq_fork(w, a2, &c2, &err) == HR_OK);
    CHECK(ws_->calls[C_COPY] == 1 && ws_->calls[C_STAGE_COPY] == (deferred ? 1 : 0));
    put(p, c, NT, NT + 8);
    put(w, c2, NT, NT + 8);
    CHECKF(same(p, c, w, c2, NT + 8), "%s: attention of the fork differs", fn);
    CHECKF(same(p, a, w, a2, NT), "%s: the fork changed its parent", fn);

    /* swap out and back in: bytes through read/write_block and the tail buffer's read/write */
    hr_kv_swap *sp = NULL, *sw = NULL;
    hr_kv_swap_config sc = {.budget_bytes = hr_kv_block_bytes(&cp) * 16};
    CHECK(hr_kv_swap_create(p, &sc, &sp, &err) == HR_OK && hr_kv_swap_create(w, &sc, &sw, &err) == HR_OK);
    long r0 = ws_->calls[C_READ], w0 = ws_->calls[C_WRITE_BLOCK];
    CHECK(hr_kv_seq_swap_out(p, sp, c, &err) == HR_OK && hr_kv_seq_swap_out(w, sw, c2, &err) == HR_OK);
    int nb = (NT + 8 + B - 1) / B;
    CHECK(ws_->calls[C_READ] - r0 == nb && ws_->calls[C_STAGE_READ] == (deferred ? 1 : 0));
    put(p, a, NT, NT + 3); /* the pool moves on meanwhile */
    put(w, a2, NT, NT + 3);
    CHECK(hr_kv_seq_swap_in(p, c, &err) == HR_OK && hr_kv_seq_swap_in(w, c2, &err) == HR_OK);
    CHECK(ws_->calls[C_WRITE_BLOCK] - w0 == nb && ws_->calls[C_STAGE_WRITE] == (deferred ? 1 : 0));
    CHECKF(same(p, c, w, c2, NT + 8), "%s: attention after a swap round trip differs", fn);
    CHECK(hr_kv_pool_check(w, &err) == HR_OK);

    /* the remote tier's read: the same bytes from both pools */
    uint64_t hashes[16];
    int nh = hr_kv_pool_prefix_hashes(p, hashes, 16);
    CHECK(nh >= 2);
    uint64_t bb = hr_kv_block_bytes(&cp);
    uint8_t *ba = malloc(bb), *bw = malloc(bb);
    CHECK(ba && bw);
    for (int i = 0; ba && bw && i < nh && i < 16; i++) {
        r0 = ws_->calls[C_READ];
        CHECK(hr_kv_pool_read_block(p, hashes[i], ba, bb) && hr_kv_pool_read_block(w, hashes[i], bw, bb));
        CHECKF(memcmp(ba, bw, bb) == 0, "%s: block %d's bytes differ", fn, i);
        CHECK(ws_->calls[C_READ] - r0 == 1);
    }
    free(ba);
    free(bw);

    hr_kv_seq_free(p, c);
    hr_kv_seq_free(w, c2);
    hr_kv_swap_destroy(sp);
    hr_kv_swap_destroy(sw);
    hr_kv_pool_destroy(p);
    hr_kv_pool_destroy(w);
}

static void test_isa(void) {
    hr_error err = {0};
    hr_kv_config c = config(HR_KV_Q8, NULL);
    hr_kv_pool *p = NULL;
    c.isa = "scalar";
    CHECK(hr_kv_pool_create(&c, &p, &err) == HR_OK && !strcmp(hr_kv_pool_isa(p), "scalar"));
    hr_kv_pool_destroy(p);
    p = NULL;
    c.isa = "sse9";
    CHECK(hr_kv_pool_create(&c, &p, &err) == HR_ERR_INVALID_ARG && p == NULL);
    CHECKF(strstr(err.msg, "sse9") && strstr(err.msg, "scalar, avx2 or avx512"), "%s", err.msg);
    c.isa = "avx2";
    c.force_scalar = true; /* force_scalar wins */
    CHECK(hr_kv_pool_create(&c, &p, &err) == HR_OK && !strcmp(hr_kv_pool_isa(p), "scalar"));
    hr_kv_pool_destroy(p);
}

int main(void) {
    for (int t = 0; t < NT + B; t++) {
        tok[t] = 3 + t % 11;
        for (int i = 0; i < HKV * D; i++) {
            kd[t][i] = sinf(0.37f * (float)(t * HKV * D + i)) * 2.0f;
            vd[t][i] = cosf(0.23f * (float)(t * HKV * D + i) + 1.0f);
        }
    }
    hr_kv_format fmts[] = {HR_KV_F16, HR_KV_Q8, HR_KV_Q4, HR_KV_KIVI2, HR_KV_Q4H};
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) run(fmts[i]);
    test_isa();
    return hr_test_finish();
}

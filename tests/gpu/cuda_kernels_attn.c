/* cuda_kernels_attn.c: test_gpu_cuda_kernels's attention over the KV storages (test_cuda_kernels.c says
 * what the program is): the device storage's encoders and attention kernels against the CPU storage's,
 * for every format, under token masks and scores, and for the deferred (staged) formats. */
#include <stdatomic.h>

#include "cuda_kernels_test.h"

#include "backend/cpu/kv_storage_cpu.h"

/* A CPU and a CUDA storage of one shape with K and V in fmt (p: their parameters). False, nothing made,
 * when fmt cannot hold this head size (q4h: head_dim a power of two); a failed create is a failed
 * check, its storage NULL. */
bool storage_pair(kt_ctx *kt, int L, int HKV, int D, int B, int NB, hr_kv_format fmt, hr_kv_storage_params *p,
                  hr_kv_storage **cpu, hr_kv_storage **gpu) {
    hr_error e = {0};
    *p = (hr_kv_storage_params){
        .n_layers = L, .n_kv_heads = HKV, .head_dim = D, .block_size = B, .n_blocks = NB, .isa = "scalar"};
    *cpu = *gpu = NULL;
    if (kv_fmt_init(&p->k, fmt, KV_K, B, D, &e) != HR_OK || kv_fmt_init(&p->v, fmt, KV_V, B, D, &e) != HR_OK)
        return false;
    CHECKF(hr_kv_storage_cpu_create(p, cpu, &e) == HR_OK, "%s", e.msg);
    CHECKF(hr_kv_storage_cuda_create(kt->dev, p, gpu, &e) == HR_OK, "%s", e.msg);
    return true;
}

/* A one-block f16 device storage, after checking that env=bad refuses to make one (naming it); NULL
 * when it could not be made. */
hr_kv_storage *switch_storage(kt_ctx *kt, const char *env, const char *bad) {
    hr_error e = {0};
    hr_kv_storage_params p = {
        .n_layers = 1, .n_kv_heads = 1, .head_dim = 64, .block_size = 16, .n_blocks = 1, .isa = "scalar"};
    kv_fmt_init(&p.k, HR_KV_F16, KV_K, 16, 64, &e);
    kv_fmt_init(&p.v, HR_KV_F16, KV_V, 16, 64, &e);
    hr_kv_storage *gpu = NULL;
    setenv(env, bad, 1);
    hr_status st = hr_kv_storage_cuda_create(kt->dev, &p, &gpu, &e);
    unsetenv(env);
    char named[96];
    snprintf(named, sizeof named, "%s=%s", env, bad);
    CHECKF(st == HR_ERR_INVALID_ARG && !gpu && strstr(e.msg, named), "%s", e.msg);
    CHECKF(hr_kv_storage_cuda_create(kt->dev, &p, &gpu, &e) == HR_OK, "%s", e.msg);
    return gpu;
}

/* paged attention: tokens written by the CPU storage, its blocks copied byte for byte into the
 * device storage, then both attend the same queries (GQA 12, tables in any order, one query over five
 * chunks of the split kernel, a softcap), through each attention kernel (hr_k_attn_split, the
 * default, and hr_k_attn_split_rows) */
/* one attention case on both storages: the GPU's within the format's bound of the CPU's (rel > 0: that
 * relative bound instead); qcpu: the CPU's queries where they differ (a table with a dropped block: the
 * CPU storage takes holes only with a view, so it gets the table without the hole and that many fewer
 * positions), or NULL */
static void check_attention(hr_kv_storage *cpu, hr_kv_storage *gpu, hr_kv_format fmt, const hr_kv_attn_query *qc,
                            const hr_kv_attn_query *qcpu, int nq, int H, int D, double rel_bound, const char *what) {
    enum { MAXQ = 4 };
    static float o_cpu[MAXQ][24 * 64], o_gpu[MAXQ][24 * 64];
    hr_kv_attn_query a_cpu[MAXQ], a_gpu[MAXQ];
    if (nq > MAXQ || H * D > 24 * 64) {
        CHECKF(false, "attention %s: %d queries of %d x %d are more than the check holds", what, nq, H, D);
        return;
    }
    for (int i = 0; i < nq; i++) {
        a_cpu[i] = qcpu ? qcpu[i] : qc[i];
        a_gpu[i] = qc[i];
        a_cpu[i].out = o_cpu[i];
        a_gpu[i].out = o_gpu[i];
    }
    hr_error e = {0};
    for (int softcap = 0; softcap < 2; softcap++) {
        hr_kv_attn_args a = {.n_heads = H, .scale = 0.125f, .softcap = softcap ? 30.0f : 0.0f};
        float *scratch = malloc(sizeof(float) << 20);
        cpu->ops->attend(cpu, 1, a_cpu, nq, &a, scratch);
        free(scratch);
        memset(o_gpu, 0xff, sizeof o_gpu); /* NaN: a head the kernel leaves out fails */
        gpu->ops->attend(gpu, 1, a_gpu, nq, &a, NULL);
        CHECKF(hr_kv_storage_cuda_check(gpu, &e) == HR_OK, "%s", e.msg);
        /* with an f16 V the CPU rounds each softmax weight to f16 before P.V (kv_attention.c's kv_weights),
         * the GPU keeps them in f32: each output moves by at most 2^-11 of the weights' sum (1) times max
         * |v| (25, the outlier), absolute. Otherwise the order of additions only. */
        double worst = 0; /* absolute for f16, relative (floor 1e-2) otherwise; a NaN is infinite */
        for (int i = 0; i < nq; i++)
            for (int j = 0; j < H * D; j++) {
                double d = fabs((double)o_gpu[i][j] - o_cpu[i][j]);
                if (fmt != HR_KV_F16) d /= fmax(fabs((double)o_cpu[i][j]), 1e-2);
                worst = d != d ? INFINITY : fmax(worst, d);
            }
        /* q4h: the CPU rounds its rotated query to int16 against the largest magnitude (kv_format.c's
         * dot_q4h_k), the GPU keeps it in f32: half a step, amax / 65534 (amax about 2 here), per element
         * moves a score by up to that times sum |k| (about 400 for the outlier token, rotated) times the
         * scale 0.125, 1.5e-3, and the outputs by as much relatively. q8's dot rounds its query the
         * same way (kv_format.c's dot_q8) against unrotated keys: 1e-3 at D 64, and sum |k| grows with D
         * (D 160 measured 1.02e-3 on one draw of the inputs) */
        const double rel = rel_bound > 0      ? rel_bound
                           : fmt == HR_KV_Q4H ? 4e-3
                           : fmt == HR_KV_Q8  ? 1e-3 * fmax(1.0, D / 64.0)
                                              : 1e-3;
        if (fmt == HR_KV_F16)
            CHECKF(worst < 25.0 * 0x1p-11 + 1e-5, "attention %s %s softcap %d: absolute error %g",
                   hr_kv_format_name(fmt), what, softcap, worst);
        else
            CHECKF(worst < rel, "attention %s %s softcap %d: relative error %g", hr_kv_format_name(fmt), what, softcap,
                   worst);
    }
}

/* Every format the device stores: the device's encoder (hr_k_kv_write, through the storage's write op
 * one token at a time and hr_kv_storage_cuda_write_dev for a batch) gives the CPU storage's bytes
 * exactly, and attention over them matches the CPU's, with the split count the storage picks and with
 * one split of many tiles (HEADROOM_CUDA_ATTN_BLOCKS=1: the online softmax across tiles), through both
 * kernels (the split variant: the default, then hr_kv_storage_cuda_set_attn_kernel "rows"; the
 * one-split variant: HEADROOM_CUDA_ATTN_KERNEL=rows at create, then "split"). The first shape is GQA
 * 12 (groups of 8 and 4) at D 64; the others reach the rows kernel's other lane maps, each with a
 * dropped block (-1) in a table: D 160 (32 lanes a row, 12 idle) with groups of 2, D 96 (16 lanes,
 * 4 idle, 2 rows a warp) with a group of 5 and B 32, D 32 (8 lanes, 4 idle, 4 rows a warp) without
 * GQA and B 8. */
void test_attention(kt_ctx *kt) {
    static const hr_kv_format fmts[] = {HR_KV_F16, HR_KV_Q8, HR_KV_F32, HR_KV_BF16, HR_KV_FP8, HR_KV_Q4H};
    static const struct {
        int HKV, H, D, B, NB;
    } shapes[] = {{2, 24, 64, 16, 72}, {2, 4, 160, 16, 24}, {2, 10, 96, 32, 12}, {3, 3, 32, 8, 48}};
    enum { L = 2, NQ = 4 };
    hr_error e = {0};
    { /* a kernel name the storage does not have: refused, from the environment and the setter */
        hr_kv_storage *gpu = switch_storage(kt, "HEADROOM_CUDA_ATTN_KERNEL", "tiles");
        if (gpu) {
            CHECK(hr_kv_storage_cuda_set_attn_kernel(gpu, "tiles", &e) == HR_ERR_INVALID_ARG);
            CHECK(hr_kv_storage_cuda_set_attn_kernel(gpu, "rows", &e) == HR_OK);
            CHECK(hr_kv_storage_cuda_set_attn_kernel(gpu, "split", &e) == HR_OK);
            gpu->ops->destroy(gpu);
        }
    }
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++) {
            const int HKV = shapes[si].HKV, H = shapes[si].H, D = shapes[si].D, B = shapes[si].B, NB = shapes[si].NB;
            const hr_kv_format fmt = fmts[fi];
            hr_kv_storage_params p;
            hr_kv_storage *cpu, *gpu;
            if (!storage_pair(kt, L, HKV, D, B, NB, fmt, &p, &cpu, &gpu)) continue; /* q4h: D 160, 96 no powers of 2 */
            float *kb = malloc(sizeof(float) * B * HKV * D), *vb = malloc(sizeof(float) * B * HKV * D);
            float *q = malloc(sizeof(float) * NQ * H * D);
            int32_t *tabs = malloc(sizeof(int32_t) * NQ * NB), *t3_cpu = malloc(sizeof(int32_t) * NB);
            if (!cpu || !gpu || !kb || !vb || !q || !tabs || !t3_cpu) {
                CHECKF(false, "attention: setup failed");
                return;
            }
            /* blocks 0..NB-2 one token at a time through the write op; the last block's tokens as one batch */
            for (int blk = 0; blk < NB; blk++)
                for (int l = 0; l < L; l++)
                    for (int t = 0; t < B; t++) {
                        float *k = kb + (size_t)t * HKV * D, *v = vb + (size_t)t * HKV * D;
                        fill(kt, k, HKV * D, 1.5f);
                        fill(kt, v, HKV * D, 1.0f);
                        if (t == 3) k[5] = 40.0f, v[7] = -25.0f; /* an outlier: its group's scale */
                        cpu->ops->write(cpu, l, blk, t, -1, k, v);
                        if (blk < NB - 1) gpu->ops->write(gpu, l, blk, t, -1, k, v);
                        if (blk == NB - 1 && t == B - 1) {
                            int32_t slots[64];
                            for (int i = 0; i < B; i++) slots[i] = blk * B + i;
                            size_t rows = sizeof(float) * B * HKV * D;
                            uint64_t dk = up(kt, kb, rows), dv = up(kt, vb, rows),
                                     ds = up(kt, slots, sizeof(int32_t) * B);
                            CHECKF(hr_kv_storage_cuda_write_dev(gpu, l, dk, dv, ds, B, &e) == HR_OK, "%s", e.msg);
                            hr_cuda_free(kt->dev, dk);
                            hr_cuda_free(kt->dev, dv);
                            hr_cuda_free(kt->dev, ds);
                        }
                    }
            size_t bb = (size_t)L * HKV * (p.k.head_bytes + p.v.head_bytes);
            unsigned char *bc = malloc(bb), *bg = malloc(bb);
            for (int blk = 0; blk < NB && bc && bg; blk++) {
                cpu->ops->read_block(cpu, blk, bc);
                gpu->ops->read_block(gpu, blk, bg);
                CHECKF(memcmp(bc, bg, bb) == 0, "%s block %d: the device's encoding differs from the CPU storage's",
                       hr_kv_format_name(fmt), blk);
            }
            free(bc);
            free(bg);
            int32_t *t0 = tabs, *t1 = tabs + NB, *t2 = tabs + 2 * NB, *t3 = tabs + 3 * NB;
            int n_ctx[NQ];
            if (si == 0) { /* tables in any order; the last one spans 70 blocks (1,117 positions: five tiles of 256) */
                static const int32_t a0[] = {3, 7, 1, 0, 11}, a1[] = {5, 4, 2};
                memcpy(t0, a0, sizeof a0);
                memcpy(t1, a1, sizeof a1);
                t2[0] = 9;
                for (int i = 0; i < 70; i++) t3[i] = 71 - i;
                n_ctx[0] = 5 * B - 3, n_ctx[1] = 3 * B, n_ctx[2] = 1, n_ctx[3] = 70 * B - 3;
            } else { /* the long one over every block but the batch's, backwards, its second block dropped */
                t0[0] = 2, t0[1] = 0;
                t1[0] = 5, t1[1] = 3;
                t2[0] = NB - 1;
                for (int i = 0; i < NB - 1; i++) t3[i] = i == 1 ? -1 : NB - 2 - i;
                for (int i = 0; i < NB - 2; i++) t3_cpu[i] = t3[i < 1 ? i : i + 1];
                n_ctx[0] = B + 3, n_ctx[1] = 2 * B, n_ctx[2] = 1, n_ctx[3] = (NB - 1) * B - 5;
            }
            fill(kt, q, (size_t)NQ * H * D, 1.0f);
            hr_kv_attn_query qc[NQ];
            for (int i = 0; i < NQ; i++)
                qc[i] = (hr_kv_attn_query){
                    .table = tabs + (size_t)i * NB, .n_ctx = n_ctx[i], .tail_stage = -1, .q = q + (size_t)i * H * D};
            hr_kv_attn_query qc_cpu[NQ];
            memcpy(qc_cpu, qc, sizeof qc);
            qc_cpu[3].table = t3_cpu, qc_cpu[3].n_ctx = n_ctx[3] - B;
            const hr_kv_attn_query *qcpu = si == 0 ? NULL : qc_cpu;
            char what[64];
            snprintf(what, sizeof what, "D %d G %d: split", D, H / HKV);
            check_attention(cpu, gpu, fmt, qc, qcpu, NQ, H, D, 0, what);
            CHECKF(hr_kv_storage_cuda_set_attn_kernel(gpu, "rows", &e) == HR_OK, "%s", e.msg);
            snprintf(what, sizeof what, "D %d G %d: split, rows kernel", D, H / HKV);
            check_attention(cpu, gpu, fmt, qc, qcpu, NQ, H, D, 0, what);
            gpu->ops->destroy(gpu);
            /* one split for every query: each block walks all its tiles; the rows kernel from the environment */
            setenv("HEADROOM_CUDA_ATTN_BLOCKS", "1", 1);
            setenv("HEADROOM_CUDA_ATTN_KERNEL", "rows", 1);
            gpu = NULL;
            CHECKF(hr_kv_storage_cuda_create(kt->dev, &p, &gpu, &e) == HR_OK, "%s", e.msg);
            unsetenv("HEADROOM_CUDA_ATTN_BLOCKS");
            unsetenv("HEADROOM_CUDA_ATTN_KERNEL");
            if (!gpu) return;
            unsigned char *blkbuf = malloc(bb);
            for (int blk = 0; blk < NB && blkbuf; blk++) {
                cpu->ops->read_block(cpu, blk, blkbuf);
                gpu->ops->write_block(gpu, blk, blkbuf);
            }
            free(blkbuf);
            snprintf(what, sizeof what, "D %d G %d: one split, rows kernel", D, H / HKV);
            check_attention(cpu, gpu, fmt, qc, qcpu, NQ, H, D, 0, what);
            CHECKF(hr_kv_storage_cuda_set_attn_kernel(gpu, "split", &e) == HR_OK, "%s", e.msg);
            snprintf(what, sizeof what, "D %d G %d: one split", D, H / HKV);
            check_attention(cpu, gpu, fmt, qc, qcpu, NQ, H, D, 0, what);
            gpu->ops->destroy(gpu);
            cpu->ops->destroy(cpu);
            free(kb), free(vb), free(q), free(tabs), free(t3_cpu);
        }
}

/* ---- token masks and scores (the h2o and snapkv policies) ------------------------------------------- */

/* The CUDA storage's attention under token-level views against the CPU storage's, the views' masks set
 * by hand (random bits, about 2 in 3 kept; one (block, layer, head) masked whole; a dropped block):
 * query 0 accumulates scores, query 1 is masked without accumulating (snapkv past its window), query 2
 * has no view, query 3 shares query 0's sequence (its table, masks and scores, at an earlier
 * position: two rows adding to one score array). Through both split kernels, for f32, f16 and q8.
 * Outputs: as check_attention's bounds. Scores (fixed point 2^-32, summed over a KV head's 3 query
 * heads, each head's weight rounded on its own): a masked or dropped token gets exactly 0 on both;
 * every other entry within 3 x 2^32 x (2e-6 + 2^-11 with an f16 V) of the CPU's: per head the two
 * weights differ by the exp's approximation (ex2.approx: 2 ulp) and the order of the sums (a few float
 * roundings of a weight <= 1, 1e-7 each; q8 and f32 measure under 6e-7 in the emulation), and
 * with an f16 V the CPU's weight is rounded to f16 (2^-11 of a weight <= 1) where the GPU's is not.
 * Layer 0's entries stay 0 (the queries are layer 1's), and each (layer 1, KV head) row of query 0's
 * and 3's scores sums to 2 x 3 x 2^32 (every head's weights sum to 1) within the same bound. */
void test_attention_masks(kt_ctx *kt) {
    enum { L = 2, HKV = 2, H = 6, D = 32, B = 16, NB = 10, NQ = 4, MW = 1 };
    static const hr_kv_format fmts[] = {HR_KV_F32, HR_KV_F16, HR_KV_Q8};
    hr_error e = {0};
    for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++) {
        const hr_kv_format fmt = fmts[fi];
        hr_kv_storage_params p;
        hr_kv_storage *cpu, *gpu;
        storage_pair(kt, L, HKV, D, B, NB, fmt, &p, &cpu, &gpu);
        if (!cpu || !gpu) return;
        float k[HKV * D], v[HKV * D];
        for (int blk = 0; blk < NB; blk++)
            for (int l = 0; l < L; l++)
                for (int t = 0; t < B; t++) {
                    fill(kt, k, HKV * D, 1.5f);
                    fill(kt, v, HKV * D, 1.0f);
                    cpu->ops->write(cpu, l, blk, t, -1, k, v);
                    gpu->ops->write(gpu, l, blk, t, -1, k, v);
                }
        /* sequence A (queries 0 and 3): 8 blocks, its block 2 dropped; sequence B (query 1): 4 blocks */
        static const int32_t ta[] = {6, 1, -1, 9, 0, 4, 8, 3}, tb[] = {2, 5, 7, 3};
        static uint64_t ma[8 * L * HKV * MW], mb[4 * L * HKV * MW];
        static atomic_uint_fast64_t sc_cpu[8 * L * HKV * B], sc_gpu[8 * L * HKV * B], sb[4 * L * HKV * B];
        for (size_t i = 0; i < sizeof ma / sizeof ma[0] + sizeof mb / sizeof mb[0]; i++) {
            uint64_t m = 0;
            for (int t = 0; t < B; t++) m |= (uint64_t)(frand(kt) > -0.33f) << t;
            if (i < sizeof ma / sizeof ma[0])
                ma[i] = m;
            else
                mb[i - sizeof ma / sizeof ma[0]] = m;
        }
        ma[((3 * L + 1) * HKV + 1) * MW] = 0; /* block 3, layer 1, KV head 1: every token masked */
        for (size_t i = 0; i < sizeof sc_cpu / sizeof sc_cpu[0]; i++)
            atomic_init(&sc_cpu[i], 0), atomic_init(&sc_gpu[i], 0);
        for (size_t i = 0; i < sizeof sb / sizeof sb[0]; i++) atomic_init(&sb[i], 0);
        hr_kv_attn_view va_cpu = {.mask = ma, .score = sc_cpu}, va_gpu = {.mask = ma, .score = sc_gpu};
        hr_kv_attn_view vb = {.mask = mb};
        float q[NQ * H * D];
        static float o_cpu[NQ][H * D], o_gpu[NQ][H * D];
        fill(kt, q, NQ * H * D, 1.0f);
        const int n_ctx[NQ] = {8 * B - 5, 4 * B - 1, 3 * B, 6 * B + 2};
        const int32_t *tabs[NQ] = {ta, tb, tb, ta};
        hr_kv_attn_query qc[NQ], qg[NQ];
        for (int i = 0; i < NQ; i++) {
            qc[i] = (hr_kv_attn_query){.table = tabs[i], .n_ctx = n_ctx[i], .tail_stage = -1, .q = q + i * H * D};
            qg[i] = qc[i];
            qc[i].out = o_cpu[i], qg[i].out = o_gpu[i];
        }
        qc[0].view = qc[3].view = &va_cpu, qg[0].view = qg[3].view = &va_gpu;
        qc[1].view = qg[1].view = &vb;
        /* the CPU takes a query without a view only over a table without holes: query 2's has none */
        hr_kv_attn_args a = {.n_heads = H, .scale = 0.125f};
        float *scratch = malloc(sizeof(float) << 16);
        cpu->ops->attend(cpu, 1, qc, NQ, &a, scratch);
        free(scratch);
        const double f16v = fmt == HR_KV_F16 ? 0x1p-11 : 0.0, bound = 3.0 * 4294967296.0 * (2e-6 + f16v);
        for (int kern = 0; kern < 2; kern++) {
            const char *kname = kern ? "rows" : "split";
            CHECKF(hr_kv_storage_cuda_set_attn_kernel(gpu, kname, &e) == HR_OK, "%s", e.msg);
            for (size_t i = 0; i < sizeof sc_gpu / sizeof sc_gpu[0]; i++) atomic_store(&sc_gpu[i], 0);
            memset(o_gpu, 0xff, sizeof o_gpu);
            gpu->ops->attend(gpu, 1, qg, NQ, &a, NULL);
            CHECKF(hr_kv_storage_cuda_check(gpu, &e) == HR_OK, "%s", e.msg);
            double worst = 0;
            for (int i = 0; i < NQ; i++)
                for (int j = 0; j < H * D; j++) {
                    double d = fabs((double)o_gpu[i][j] - o_cpu[i][j]);
                    if (fmt != HR_KV_F16) d /= fmax(fabs((double)o_cpu[i][j]), 1e-2);
                    worst = d != d ? INFINITY : fmax(worst, d);
                }
            CHECKF(worst < (fmt == HR_KV_F16 ? 0x1p-11 + 1e-5 : 1e-3), "masked attention %s %s: error %g",
                   hr_kv_format_name(fmt), kname, worst);
            double sworst = 0, sum_worst = 0;
            int bad_zero = 0;
            for (int j = 0; j < 8; j++)
                for (int l = 0; l < L; l++)
                    for (int kh = 0; kh < HKV; kh++) {
                        const size_t row = ((size_t)(j * L + l) * HKV + kh);
                        for (int t = 0; t < B; t++) {
                            const uint64_t c = atomic_load(&sc_cpu[row * B + t]), g = atomic_load(&sc_gpu[row * B + t]);
                            const bool kept = l == 1 && ta[j] >= 0 && (ma[row * MW] >> t & 1) && j * B + t < n_ctx[0];
                            bad_zero += !kept && (c != 0 || g != 0);
                            sworst = fmax(sworst, fabs((double)g - (double)c));
                        }
                    }
            for (int kh = 0; kh < HKV; kh++) {
                double sum = 0;
                for (int j = 0; j < 8; j++)
                    for (int t = 0; t < B; t++) sum += (double)atomic_load(&sc_gpu[((j * L + 1) * HKV + kh) * B + t]);
                sum_worst = fmax(sum_worst, fabs(sum - 2.0 * 3.0 * 4294967296.0));
            }
            printf("masked attention %s %s: output error %g, worst score difference %.0f (%.2g of the bound), sums "
                   "off by %.0f\n",
                   hr_kv_format_name(fmt), kname, worst, sworst, sworst / bound, sum_worst);
            CHECKF(bad_zero == 0, "masked attention %s %s: %d masked, dropped or layer-0 tokens with a score",
                   hr_kv_format_name(fmt), kname, bad_zero);
            CHECKF(sworst <= bound, "masked attention %s %s: a score differs by %g (bound %g)", hr_kv_format_name(fmt),
                   kname, sworst, bound);
            CHECKF(sum_worst <= 2.0 * bound, "masked attention %s %s: a head's weights sum off by %g",
                   hr_kv_format_name(fmt), kname, sum_worst);
            for (size_t i = 0; i < sizeof sb / sizeof sb[0]; i++)
                CHECKF(atomic_load(&sb[i]) == 0, "masked attention %s: a view without scores got some",
                       hr_kv_format_name(fmt));
        }
        gpu->ops->destroy(gpu);
        cpu->ops->destroy(cpu);
    }
}

/* The deferred formats (q4, kivi2: K per channel over a block, encoded when the block fills from its
 * f16 stage). Both storages take the same tokens: blocks 0..NB-3 one token at a time through the
 * write op (the write that fills a block encodes it), block NB-2 as one batch through
 * hr_kv_storage_cuda_stage_batch + write_dev (slots, stages, fills), block NB-1 partial (P tokens).
 * The encoded blocks must be the CPU storage's byte for byte (hr_k_kv_encode against encb_lowbit_k /
 * encb_lowbit_v), the stages' deferred halves and counts too, and a stage copy moves both. Then
 * attention on both kernels against the CPU's, queries ending in the partial block (read from its
 * stage), at a block's end (all encoded), and inside full blocks that still hold their stage (a
 * prefill batch's queries before the commit: read from the stage as the CPU does). D 64 and D 96
 * (kivi2's 2-bit rows: a last chunk of 32 channels); a mixed pair (q8 K, q4 V: only V staged). */
void test_attention_deferred(kt_ctx *kt) {
    static const struct {
        int HKV, H, D, B, NB;
        hr_kv_format k, v;
    } cases[] = {{2, 8, 64, 16, 6, HR_KV_Q4, HR_KV_Q4},
                 {2, 8, 64, 16, 6, HR_KV_KIVI2, HR_KV_KIVI2},
                 {1, 3, 96, 8, 5, HR_KV_KIVI2, HR_KV_KIVI2},
                 {1, 3, 96, 8, 5, HR_KV_Q8, HR_KV_Q4}};
    enum { L = 2, NQ = 4 };
    hr_error e = {0};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int HKV = cases[ci].HKV, H = cases[ci].H, D = cases[ci].D, B = cases[ci].B, NB = cases[ci].NB;
        const int P = B / 2 + 3, NS = NB + 1; /* tokens of the partial block; a stage for each block and a spare */
        hr_kv_storage_params p = {.n_layers = L,
                                  .n_kv_heads = HKV,
                                  .head_dim = D,
                                  .block_size = B,
                                  .n_blocks = NB,
                                  .n_stage = NS,
                                  .isa = "scalar"};
        kv_fmt_init(&p.k, cases[ci].k, KV_K, B, D, &e);
        kv_fmt_init(&p.v, cases[ci].v, KV_V, B, D, &e);
        kv_fmt_init(&p.stage, HR_KV_F16, KV_K, B, D, &e);
        hr_kv_storage *cpu = NULL, *gpu = NULL;
        CHECKF(hr_kv_storage_cpu_create(&p, &cpu, &e) == HR_OK, "%s", e.msg);
        CHECKF(hr_kv_storage_cuda_create(kt->dev, &p, &gpu, &e) == HR_OK, "%s", e.msg);
        const size_t row = (size_t)HKV * D;
        float *kb = malloc(sizeof(float) * B * row), *vb = malloc(sizeof(float) * B * row);
        float *q = malloc(sizeof(float) * NQ * H * D);
        const size_t bb = (size_t)L * HKV * (p.k.head_bytes + p.v.head_bytes), sb = (size_t)L * 2 * row * B * 2;
        unsigned char *bc = malloc(bb), *bg = malloc(bb), *sc = malloc(sb), *sg = malloc(sb);
        if (!cpu || !gpu || !kb || !vb || !q || !bc || !bg || !sc || !sg) {
            CHECKF(false, "deferred attention: setup failed");
            return;
        }
        for (int blk = 0; blk < NB; blk++) {
            cpu->ops->stage_reset(cpu, blk);
            gpu->ops->stage_reset(gpu, blk);
            const int n = blk == NB - 1 ? P : B;
            for (int t = 0; t < n; t++) { /* the block's tokens, one layer's rows each (the same in both layers) */
                fill(kt, kb + (size_t)t * row, row, 1.5f);
                fill(kt, vb + (size_t)t * row, row, 1.0f);
                if (t == 3) kb[(size_t)t * row + 5] = 40.0f, vb[(size_t)t * row + 7] = -25.0f; /* outliers */
            }
            for (int l = 0; l < L; l++)
                for (int t = 0; t < n; t++) {
                    cpu->ops->write(cpu, l, blk, t, blk, kb + (size_t)t * row, vb + (size_t)t * row);
                    if (blk != NB - 2) gpu->ops->write(gpu, l, blk, t, blk, kb + (size_t)t * row, vb + (size_t)t * row);
                }
            if (blk == NB - 2) { /* the forward pass's way: counted once for every layer, then each layer's batch */
                int32_t place[3 * 64];
                for (int t = 0; t < B; t++) place[t] = blk * B + t, place[B + t] = blk;
                CHECKF(hr_kv_storage_cuda_stage_batch(gpu, place, B, &e) == HR_OK, "%s", e.msg);
                int nf = 0;
                for (int t = 0; t < B; t++) nf += place[2 * B + t] != 0;
                CHECKF(nf == 1 && place[3 * B - 1], "the batch's fills: %d, the last token's %d", nf, place[3 * B - 1]);
                size_t rows = sizeof(float) * B * row;
                uint64_t dk = up(kt, kb, rows), dv = up(kt, vb, rows), ds = up(kt, place, sizeof(int32_t) * 3 * B);
                for (int l = 0; l < L; l++)
                    CHECKF(hr_kv_storage_cuda_write_dev(gpu, l, dk, dv, ds, B, &e) == HR_OK, "%s", e.msg);
                hr_cuda_free(kt->dev, dk);
                hr_cuda_free(kt->dev, dv);
                hr_cuda_free(kt->dev, ds);
            }
        }
        /* a stage already full is refused, nothing counted */
        int32_t again[3] = {0, 0, 0};
        CHECK(hr_kv_storage_cuda_stage_batch(gpu, again, 1, &e) == HR_ERR_INVALID_ARG &&
              gpu->ops->stage_filled(gpu, 0, 1) == B);
        CHECKF(hr_kv_storage_cuda_check(gpu, &e) == HR_OK, "%s", e.msg);
        const char *fk = hr_kv_format_name(cases[ci].k), *fv = hr_kv_format_name(cases[ci].v);
        for (int blk = 0; blk < NB - 1; blk++) {
            cpu->ops->read_block(cpu, blk, bc);
            gpu->ops->read_block(gpu, blk, bg);
            CHECKF(memcmp(bc, bg, bb) == 0, "%s/%s D %d block %d: the device's encoding differs from the CPU's", fk, fv,
                   D, blk);
        }
        /* the stages: the deferred roles' rows (the others' are never written) and the counts */
        gpu->ops->stage_copy(gpu, NB - 1, NB); /* the spare: a copy-on-write's */
        for (int st = 0; st <= NB; st++) {
            uint16_t fc[L], fg[L];
            cpu->ops->stage_read(cpu, st < NB ? st : NB - 1, sc, fc);
            gpu->ops->stage_read(gpu, st, sg, fg);
            for (int l = 0; l < L; l++) {
                CHECKF(fc[l] == fg[l], "%s/%s stage %d layer %d: %d slots written, the CPU's %d", fk, fv, st, l, fg[l],
                       fc[l]);
                for (int role = 0; role < 2; role++) {
                    if (!(role ? p.v.deferred : p.k.deferred)) continue;
                    const size_t half = row * (size_t)B * 2, at = (2 * (size_t)l + role) * half;
                    CHECKF(memcmp(sc + at, sg + at, half) == 0, "%s/%s stage %d layer %d role %d differs", fk, fv, st,
                           l, role);
                }
            }
        }
        /* the queries: over blocks in this order, the last one partial */
        int32_t tab[8];
        for (int j = 0; j < NB; j++) tab[j] = (j * 3 + 1) % (NB - 1);
        tab[NB - 1] = NB - 1;
        const int n_ctx[NQ] = {(NB - 1) * B + P, (NB - 1) * B, 2 * B + 5, 5};
        const int32_t tail[NQ] = {NB - 1, -1, tab[2], tab[0]};
        fill(kt, q, (size_t)NQ * H * D, 1.0f);
        hr_kv_attn_query qc[NQ];
        for (int i = 0; i < NQ; i++)
            qc[i] =
                (hr_kv_attn_query){.table = tab, .n_ctx = n_ctx[i], .tail_stage = tail[i], .q = q + (size_t)i * H * D};
        /* The CPU rounds q times K's scale to int16 against its largest magnitude (kv_format.c's
         * dot_lowbit_k, dot_q8), the GPU keeps q . (code x scale + min) in f32: half a step, amax /
         * 65534, per channel moves a score by at most scale x D x the largest code x amax / 65534,
         * amax = |q| (<= 1) times the largest scale: the outlier channel's range (40 + 1.5) over the
         * code's levels, with a quarter more for the least-squares refit (q4, kivi2), or its group's
         * 40 / 127 (q8). A score moved by d moves a weight by up to 2 d relatively, the outputs by as
         * much; the order of additions takes 1e-3 as for the other formats. */
        const int levels = cases[ci].k == HR_KV_Q4 ? 15 : cases[ci].k == HR_KV_KIVI2 ? 3 : 127;
        const double kscale = levels == 127 ? 40.0 / 127.0 : 1.25 * 41.5 / levels;
        const double rel = 2.0 * 0.125 * D * levels * kscale / 65534.0 + 1e-3;
        char what[64];
        snprintf(what, sizeof what, "K %s V %s D %d: split", fk, fv, D);
        check_attention(cpu, gpu, cases[ci].k, qc, NULL, NQ, H, D, rel, what);
        CHECKF(hr_kv_storage_cuda_set_attn_kernel(gpu, "rows", &e) == HR_OK, "%s", e.msg);
        snprintf(what, sizeof what, "K %s V %s D %d: rows kernel", fk, fv, D);
        check_attention(cpu, gpu, cases[ci].k, qc, NULL, NQ, H, D, rel, what);
        gpu->ops->destroy(gpu);
        cpu->ops->destroy(cpu);
        free(kb), free(vb), free(q), free(bc), free(bg), free(sc), free(sg);
    }
}

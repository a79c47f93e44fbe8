/* cuda_kernels_prefill.c: test_gpu_cuda_kernels's prefill attention on the tensor cores
 * (kernels/attn_prefill.cu; test_cuda_kernels.c says what the program is): the batch's runs, and the
 * prefill kernel against the CPU storage's attention and the split kernels. */
#include "cuda_kernels_test.h"

#include "backend/cpu/kv_storage_cpu.h"
#include "tensor/tensor.h"

/* a value of [-m, m] on a grid of 1/64: exact in f16 and bf16, and a sum of 128 products of two such
 * values is a multiple of 2^-12 below 2^12, exact in f32 in any order */
static float grid64(kt_ctx *kt, float m) { return roundf(frand(kt) * m * 64.0f) / 64.0f; }

/* The batch of test_prefill_attention, five sequences in rows of the storage's tables:
 *   row 0: A, one decode row at 50; rows 1..17: B, a run of 17 from b0; rows 18, 19: C at 5 and 6 (two
 *   rows: no run); rows 20..59: D, a run of 40 from d0, its table's block 1 dropped (-1); rows 60..75:
 *   E, a run of exactly 16 at 200..215 seeing 4 sinks and a window of 32 (lo = pos + 1 - 32: the tile
 *   of positions 64..127 is seen by no row, the kernel skips it).
 * b0, d0: 0 and 70 (B from the start, D a chunk after 70 cached positions), or 30 and 0. */
enum { PF_ROWS = 76, PF_SEQS = 5, PF_B = 16, PF_NB = 32, PF_MAXB = 14, PF_SINKS = 4, PF_WIN = 32 };
static void prefill_batch(int b0, int d0, int32_t *seq, int32_t *pos) {
    int r = 0;
    seq[r] = 0, pos[r++] = 50;
    for (int i = 0; i < 17; i++) seq[r] = 1, pos[r++] = b0 + i;
    for (int i = 0; i < 2; i++) seq[r] = 2, pos[r++] = 5 + i;
    for (int i = 0; i < 40; i++) seq[r] = 3, pos[r++] = d0 + i;
    for (int i = 0; i < 16; i++) seq[r] = 4, pos[r++] = 200 + i;
}

/* hr_cuda_attn_runs: the batch's runs and their tiles (even cuts), rows outside them left out */
void test_prefill_runs(void) {
    int32_t seq[PF_ROWS], pos[PF_ROWS], runs[4 * PF_ROWS];
    prefill_batch(0, 70, seq, pos);
    static const int32_t g4[] = {1, 17, 1, 0, 20, 20, 3, 70, 40, 20, 3, 90, 60, 16, 4, 200};
    CHECK(hr_cuda_prefill_tile_rows(8, 2) == 32 && hr_cuda_prefill_tile_rows(2, 2) == 128 &&
          hr_cuda_prefill_tile_rows(24, 3) == 16 && hr_cuda_prefill_tile_rows(256, 1) == 0);
    CHECK(hr_cuda_attn_runs(seq, pos, PF_ROWS, 32, runs) == 4 && memcmp(runs, g4, sizeof g4) == 0);
    static const int32_t g1[] = {1, 17, 1, 0, 20, 40, 3, 70, 60, 16, 4, 200};
    CHECK(hr_cuda_attn_runs(seq, pos, PF_ROWS, 128, runs) == 3 && memcmp(runs, g1, sizeof g1) == 0);
    static const int32_t g16[] = {1, 9, 1, 0, 10, 8, 1, 9, 20, 14, 3, 70, 34, 13, 3, 84, 47, 13, 3, 97, 60, 16, 4, 200};
    CHECK(hr_cuda_attn_runs(seq, pos, PF_ROWS, 16, runs) == 6 && memcmp(runs, g16, sizeof g16) == 0);
    /* 15 rows at consecutive positions, a gap in positions, a repeated position: no run */
    int32_t q2[40], p2[40];
    for (int i = 0; i < 40; i++) q2[i] = 0, p2[i] = i < 15 ? i : i < 30 ? i + 1 : 29;
    CHECK(hr_cuda_attn_runs(q2, p2, 40, 32, runs) == 0);
}

/* The prefill kernel against the CPU storage's attention, for every device format, D 64 and 128, GQA
 * (H 8 over Hkv 2: tiles of 32 rows) and H = Hkv (tiles of 128), and the demo models' D 8 (H 8 over 4,
 * K padded to the mma's k16 with zeros), the batch above through
 * hr_kv_storage_cuda_attend_runs: its runs on hr_k_attn_prefill, rows 0 and 18..19 on the split
 * kernels. Softcap 30 on every other case.
 *
 * The bound. Q, K and V are written on a grid of 1/64 (grid64), so Q is exact in f16, and so are K and
 * V stored as f32, f16 or bf16: the scores are then exact on both sides (the sums exact in f32), and
 * what differs is the softmax weights: the kernel rounds each P = e^(s - m) to f16 before P.V (its sum
 * l taken before the rounding): sum p~ v / sum p moves by at most u max|v|, u = 2^-11 (P below f16's
 * normal range, 2^-14, rounds by at most 2^-25 absolute: 216 positions of it are under 1e-5 with
 * sum p >= 1); with an f16 V the CPU rounds its normalized weights to f16 too: another u max|v|.
 * q8 and fp8 values (codes times a scale) are not on f16's grid: K's f16 rounding moves a score by at
 * most eps = scale u sum_d |q_d| |k_d| <= scale u |q|_1 kmax (kmax 1.51: the data's 1.5 and the q8
 * scale's own rounding), which moves each normalized weight by a factor within e^(+-2 eps): the output
 * by at most (e^(2 eps) - 1) max|v|; V's rounding adds u max|v|. The softcap is 1-Lipschitz; exp and
 * tanh (the hardware's against libm's) and the f32 sums in another order add under 5e-5. So
 *   |mma - cpu| <= vmax (e^(2 eps) - 1 + u (1 + [V q8/fp8] + [V f16])) + 5e-5,  vmax = 1.001,
 * eps = 0 for K f32/f16/bf16. The split kernels' rows (f32 throughout) are held to the same bound and
 * are bit for bit the same whichever prefill kernel the storage has.
 * q4h (D 64 and 128; at D 8 its 8-channel reads do not fit and the rows stay on the split kernels):
 * both paths dot the rotated query Hq against the stored rotated keys, the CPU after rounding Hq to
 * int16 against its largest magnitude (half a step, amax / 65534, a component), so a score moves by
 * scale (amax / 65534 + u) |Hq|_1-or-D kmax with kmax the largest |code x scale + min| the blocks hold
 * (read from their (scale, min) pairs): eps = scale kmax (D amax / 65534 + u |Hq|_1); V's values
 * (4-bit codes) are not on f16's grid either, and |v| <= vmax 1.1 (a 4-bit step over the data's 1). */
/* the normalized Hadamard transform of x[0..n) (n a power of two), as the CPU's kv_hadamard */
static void hadamard_ref(float *x, int n) {
    for (int h = 1; h < n; h *= 2)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b, x[j + h] = a - b;
            }
    for (int i = 0; i < n; i++) x[i] /= sqrtf((float)n);
}

void test_prefill_attention(kt_ctx *kt) {
    static const hr_kv_format fmts[] = {HR_KV_F16, HR_KV_Q8, HR_KV_F32, HR_KV_BF16, HR_KV_FP8, HR_KV_Q4H};
    static const struct { int HKV, H, D; } shapes[] = {{2, 8, 64}, {2, 8, 128}, {2, 2, 128}, {2, 2, 64}, {4, 8, 8}};
    enum { L = 2, N = PF_ROWS };
    hr_error e = {0};
    { /* the switch: a name it does not have is refused, from the environment and the setter */
        hr_kv_storage *gpu = switch_storage(kt, "HEADROOM_CUDA_PREFILL_ATTN", "wmma");
        if (gpu) {
            CHECK(!hr_kv_storage_cuda_prefill_on(gpu, 4)); /* split: the default */
            CHECK(hr_kv_storage_cuda_set_prefill_attn(gpu, "wmma", &e) == HR_ERR_INVALID_ARG);
            CHECK(hr_kv_storage_cuda_set_prefill_attn(gpu, "mma", &e) == HR_OK &&
                  hr_kv_storage_cuda_prefill_on(gpu, 4));
            CHECK(!hr_kv_storage_cuda_prefill_on(gpu, 256)); /* G 256: more heads than a block's 128 rows */
            CHECK(hr_kv_storage_cuda_set_prefill_attn(gpu, "split", &e) == HR_OK &&
                  !hr_kv_storage_cuda_prefill_on(gpu, 4));
            gpu->ops->destroy(gpu);
        }
    }
    const double u = 0x1p-11;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++) {
            const int HKV = shapes[si].HKV, H = shapes[si].H, D = shapes[si].D, B = PF_B, NB = PF_NB;
            const hr_kv_format fmt = fmts[fi];
            if (fmt == HR_KV_Q4H && D % 16 != 0) continue; /* stays on the split kernels (test_attention) */
            const bool softcap = (si + fi) % 2 == 1;
            const int b0 = si % 2 ? 30 : 0, d0 = si % 2 ? 0 : 70;
            hr_kv_storage_params p;
            hr_kv_storage *cpu, *gpu;
            storage_pair(kt, L, HKV, D, B, NB, fmt, &p, &cpu, &gpu);
            const size_t qf = (size_t)N * H * D, bb = (size_t)L * HKV * (p.k.head_bytes + p.v.head_bytes);
            float *q = malloc(sizeof(float) * qf), *o_cpu = malloc(sizeof(float) * qf);
            float *o_split = malloc(sizeof(float) * qf), *o_mma = malloc(sizeof(float) * qf);
            float *kv = malloc(sizeof(float) * 2 * HKV * D), *scratch = malloc(sizeof(float) << 20);
            unsigned char *blk = malloc(bb);
            if (!cpu || !gpu || !q || !o_cpu || !o_split || !o_mma || !kv || !scratch || !blk) {
                CHECKF(false, "prefill attention: setup failed");
                return;
            }
            /* every slot of every block through the CPU's encoders, the blocks copied to the device */
            for (int b = 0; b < NB; b++)
                for (int l = 0; l < L; l++)
                    for (int t = 0; t < B; t++) {
                        for (int i = 0; i < HKV * D; i++) kv[i] = grid64(kt, 1.5f), kv[HKV * D + i] = grid64(kt, 1.0f);
                        cpu->ops->write(cpu, l, b, t, -1, kv, kv + HKV * D);
                    }
            double kmax = 1.51; /* q4h: the largest |code x scale + min| of a K head region */
            for (int b = 0; b < NB; b++) {
                cpu->ops->read_block(cpu, b, blk);
                gpu->ops->write_block(gpu, b, blk);
                for (int l = 0; fmt == HR_KV_Q4H && l < L; l++)
                    for (int h = 0; h < HKV; h++) {
                        const unsigned char *head = blk + (size_t)l * HKV * (p.k.head_bytes + p.v.head_bytes) +
                                                    (size_t)h * p.k.head_bytes + p.k.scale_off;
                        for (int i = 0; i < B * (D / p.k.G); i++) {
                            uint16_t sm[2];
                            memcpy(sm, head + 4 * (size_t)i, 4);
                            const double sc = hr_f16_to_f32(sm[0]), mn = hr_f16_to_f32(sm[1]);
                            kmax = fmax(kmax, fmax(fabs(mn), fabs(mn + 15.0 * sc)));
                        }
                    }
            }
            /* the batch: tables (the blocks in a scrambled order), rows, windows, runs */
            int32_t seq[N], pos[N], nctx[N], win[2 * N], tabs[PF_SEQS * PF_MAXB], runs[4 * N];
            prefill_batch(b0, d0, seq, pos);
            for (int i = 0; i < PF_SEQS * PF_MAXB; i++) tabs[i] = (i * 11 + 5) % NB; /* a sequence's 14 differ */
            tabs[3 * PF_MAXB + 1] = -1;
            hr_kv_attn_view views[N];
            hr_kv_attn_query qs[N];
            int max_vis = 1;
            fill(kt, q, qf, 1.0f);
            for (size_t i = 0; i < qf; i++) q[i] = roundf(q[i] * 64.0f) / 64.0f;
            for (int r = 0; r < N; r++) {
                const int n = pos[r] + 1, lo = seq[r] == 4 ? n - PF_WIN : 0, sinks = lo > 0 ? PF_SINKS : 0;
                nctx[r] = n;
                win[2 * r] = sinks, win[2 * r + 1] = lo;
                const int vis = lo > 0 ? sinks + n - lo : n;
                max_vis = vis > max_vis ? vis : max_vis;
                /* the CPU storage takes a dropped block (D) or a window (E) through a view */
                views[r] = (hr_kv_attn_view){.sinks = sinks, .lo = lo};
                if (lo > 0) {
                    views[r].first_blk = lo / B;
                    views[r].sink_blocks = (sinks + B - 1) / B;
                }
                qs[r] = (hr_kv_attn_query){.table = tabs + seq[r] * PF_MAXB,
                                           .n_ctx = n,
                                           .tail_stage = -1,
                                           .view = seq[r] >= 3 ? &views[r] : NULL,
                                           .q = q + (size_t)r * H * D,
                                           .out = o_cpu + (size_t)r * H * D};
            }
            const int n_runs = hr_cuda_attn_runs(seq, pos, N, hr_cuda_prefill_tile_rows(H, HKV), runs);
            CHECK(n_runs == (hr_cuda_prefill_tile_rows(H, HKV) >= 40 ? 3 : 4));
            hr_kv_attn_args a = {.n_heads = H, .scale = 0.125f, .softcap = softcap ? 30.0f : 0.0f};
            cpu->ops->attend(cpu, 1, qs, N, &a, scratch);
            uint64_t dq = up(kt, q, sizeof(float) * qf), dout = up(kt, o_mma, sizeof(float) * qf);
            uint64_t dtab = up(kt, tabs, sizeof tabs), dctx = up(kt, nctx, sizeof nctx), dwin = up(kt, win, sizeof win);
            uint64_t dseq = up(kt, seq, sizeof seq),
                     druns = up(kt, runs, sizeof(int32_t) * 4 * (n_runs > 0 ? n_runs : 1));
            uint64_t dscr = 0;
            CHECKF(hr_cuda_alloc(kt->dev, hr_kv_storage_cuda_attend_scratch(gpu, N, H, max_vis), &dscr, &e) == HR_OK,
                   "%s", e.msg);
            for (int k = 0; k < 2; k++) {
                float *o = k ? o_mma : o_split;
                CHECK(hr_kv_storage_cuda_set_prefill_attn(gpu, k ? "mma" : "split", &e) == HR_OK);
                memset(o, 0xff, sizeof(float) * qf); /* NaN: a row neither path writes fails */
                hr_cuda_upload(kt->dev, dout, o, sizeof(float) * qf, &e);
                CHECKF(hr_kv_storage_cuda_attend_runs(gpu, 1, dq, dtab, PF_MAXB, dseq, dctx, dwin, 0, N, max_vis, H,
                                                      a.scale, a.softcap, runs, druns, n_runs, NULL, dout, dscr,
                                                      &e) == HR_OK,
                       "%s", e.msg);
                down(kt, o, dout, sizeof(float) * qf);
            }
            const bool exact_k = fmt == HR_KV_F32 || fmt == HR_KV_F16 || fmt == HR_KV_BF16;
            const double uv = u * (1.0 + (exact_k ? 0.0 : 1.0) + (fmt == HR_KV_F16 ? 1.0 : 0.0));
            const double vmax = fmt == HR_KV_Q4H ? 1.1 : 1.001;
            double worst[2] = {0, 0}, worst_frac = 0; /* |err| / bound: split, mma */
            bool same_rest = true, mma_ran = false;
            for (int r = 0; r < N; r++) {
                bool in_run = false;
                for (int i = 0; i < n_runs; i++) in_run |= r >= runs[4 * i] && r < runs[4 * i] + runs[4 * i + 1];
                for (int h = 0; h < H; h++) {
                    const float *qh = q + ((size_t)r * H + h) * D;
                    double q1 = 0, amax = 0;
                    float hq[128];
                    memcpy(hq, qh, sizeof(float) * (size_t)D);
                    if (fmt == HR_KV_Q4H) hadamard_ref(hq, D);
                    for (int d = 0; d < D; d++) q1 += fabs(hq[d]), amax = fmax(amax, fabs(hq[d]));
                    const double eps = exact_k            ? 0.0
                                       : fmt == HR_KV_Q4H ? a.scale * kmax * (D * amax / 65534.0 + u * q1)
                                                          : a.scale * u * q1 * 1.51;
                    const double bound = vmax * (expm1(2.0 * eps) + uv) + 5e-5;
                    for (int d = 0; d < D; d++) {
                        const size_t i = ((size_t)r * H + h) * D + d;
                        for (int k = 0; k < 2; k++) {
                            const double err = fabs((double)(k ? o_mma : o_split)[i] - o_cpu[i]) / bound;
                            worst[k] = err != err ? INFINITY : fmax(worst[k], err);
                        }
                        if (in_run)
                            mma_ran |= o_mma[i] != o_split[i];
                        else
                            same_rest &= memcmp(&o_mma[i], &o_split[i], sizeof(float)) == 0;
                        worst_frac = fmax(worst_frac, fabs((double)o_mma[i] - o_cpu[i]));
                    }
                }
            }
            CHECKF(worst[0] <= 1.0 && worst[1] <= 1.0,
                   "prefill attention %s D %d H %d/%d softcap %d: error / bound split %g, mma %g",
                   hr_kv_format_name(fmt), D, H, HKV, softcap, worst[0], worst[1]);
            CHECKF(same_rest, "prefill attention %s D %d H %d: the rows outside runs differ between the paths",
                   hr_kv_format_name(fmt), D, H);
            CHECKF(mma_ran, "prefill attention %s D %d H %d: the runs' rows are the split path's bit for bit",
                   hr_kv_format_name(fmt), D, H);
            printf("prefill attention %s D %d G %d softcap %d: worst |mma - cpu| %.3g (%.2g of the bound)\n",
                   hr_kv_format_name(fmt), D, H / HKV, softcap, worst_frac, worst[1]);
            uint64_t bufs[] = {dq, dout, dtab, dctx, dwin, dseq, druns, dscr};
            for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) hr_cuda_free(kt->dev, bufs[i]);
            gpu->ops->destroy(gpu);
            cpu->ops->destroy(cpu);
            free(q), free(o_cpu), free(o_split), free(o_mma), free(kv), free(scratch), free(blk);
        }
}

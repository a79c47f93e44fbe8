/* kernels_k_avx2.c: AVX2 dots and tiles of the K-quants (q4_K, q5_K, q6_K) against q8_K activations.
 *
 * A super-block (256 weights) is eight 32-weight chunks; chunk j's weights become 32 unsigned bytes
 * q_j (0..15, 0..31 or 0..63) and its scale(s) a vector sc_j of 16-bit lanes. The integer part per
 * (row, token) pair and super-block is eight int32 lanes
 *     s = sum_j madd(maddubs(q_j, y_j), sc_j)        (q6_K: minus 32 * madd(scales16, bsums))
 * which is exact, so it does not matter how it is grouped: the lone dot (decode: one token, nothing
 * to share) makes q_j on the fly, chunk by chunk; the batch tile interleaves chunk pairs and does
 * one madd per pair (see mix2 below), giving the same integers. The float part is one fixed
 * sequence per pair, the same for the lone dot and every tile:
 *     acc  = fma(set1(d_w) * set1(d_y), cvt(s), acc)                   super-blocks in order
 *     macc = fma(set1(dmin_w) * set1(d_y), cvt(madd(mins16, bsums)), macc)   (q4_K, q5_K)
 *     result = hsum8(acc) - hsum8(macc)
 * so the only horizontal sums are two per pair, at the end. The scales are decoded with vector
 * shuffles (no per-sub-block scalar work).
 *
 * The batch tile (vec_dot_tile, nt > 1) is 1 weight row x 8 tokens: the 8 tokens' super-blocks are
 * packed once per k-block (interleaved bytes, bsums, broadcast d) into a thread-local table read as
 * memory operands, each chunk pair of the row is unpacked once for the 8 tokens, and the 8 integer
 * sums stay in registers while the float accumulators go through memory (exact) between
 * super-blocks. Rows go in chunks of at most 32 (about 192 KiB of weights); per chunk the first
 * group of 8 tokens streams the rows whole (one sequential read the prefetcher follows, its table
 * in L2), the later groups take k-blocks of 4 super-blocks (table in L1, weights in L2), and the
 * tokens past the groups of 8 run 1 x 4, 1 x 3 and 1 x 2 tiles. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/kernels_tile.h"
#include "backend/cpu/simd_avx2.h"

/* gcc -O2 does not unroll the fixed 4- and 8-step loops by itself; unrolled, the block stays in registers. */
#define HR_UNROLL _Pragma("GCC unroll 8")

enum { K_Q4, K_Q5, K_Q6 };

/* A super-block's scales, ready to shuffle out per chunk. */
typedef struct kscale {
    __m256i src_lo, src_hi; /* 16-bit scales that chunks 0-3 and 4-7 pick from */
    __m256i corr16;         /* q4_K/q5_K: min m_j at 16-bit lanes 2j, 2j+1; q6_K: the 16 scales */
    __m256 d, dmin;         /* broadcast */
} kscale;

/* q4_K/q5_K: the 6-bit scales and mins of scales[12] (hr_get_scale_min_k4, four at a time). */
static inline kscale scales_k4(const uint8_t *scales, hr_f16 d, hr_f16 dmin) {
    uint32_t w[3];
    memcpy(w, scales, sizeof w);
    const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
    const uint32_t sc_lo = w[0] & m6, mn_lo = w[1] & m6;
    const uint32_t sc_hi = (w[2] & m4) | (((w[0] >> 6) & m2) << 4);
    const uint32_t mn_hi = ((w[2] >> 4) & m4) | (((w[1] >> 6) & m2) << 4);
    const __m128i b = _mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)mn_lo, (int)mn_hi); /* 8 scales, 8 mins */
    kscale k;
    k.src_lo = k.src_hi = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(b));
    k.corr16 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(b, b));
    k.d = _mm256_set1_ps(_cvtsh_ss(d));
    k.dmin = _mm256_set1_ps(_cvtsh_ss(dmin));
    return k;
}

static inline kscale scales_q6(const hr_block_q6_K *x) {
    kscale k;
    k.corr16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
    k.src_lo = _mm256_permute2x128_si256(k.corr16, k.corr16, 0x00);
    k.src_hi = _mm256_permute2x128_si256(k.corr16, k.corr16, 0x11);
    k.d = _mm256_set1_ps(_cvtsh_ss(x->d));
    k.dmin = _mm256_setzero_ps();
    return k;
}

/* sc_j: q4_K/q5_K: scale j in all 16 lanes; q6_K: scale 2j in lanes 0-7, 2j + 1 in lanes 8-15. */
static inline __m256i scale_j(const kscale *k, int j, const int kind) {
    if (kind != K_Q6) return _mm256_shuffle_epi8(k->src_lo, _mm256_set1_epi16((short)(((2 * j + 1) << 8) | (2 * j))));
    const int i = j & 3;
    const __m256i ctrl = _mm256_set_m128i(_mm_set1_epi16((short)(((4 * i + 3) << 8) | (4 * i + 2))),
                                          _mm_set1_epi16((short)(((4 * i + 1) << 8) | (4 * i))));
    return _mm256_shuffle_epi8(j < 4 ? k->src_lo : k->src_hi, ctrl);
}

static inline kscale block_scales(const char *row, int64_t i, const int kind) {
    if (kind == K_Q4) {
        const hr_block_q4_K *x = (const hr_block_q4_K *)row + i;
        return scales_k4(x->scales, x->d, x->dmin);
    }
    if (kind == K_Q5) {
        const hr_block_q5_K *x = (const hr_block_q5_K *)row + i;
        return scales_k4(x->scales, x->d, x->dmin);
    }
    return scales_q6((const hr_block_q6_K *)row + i);
}

/* q_j of super-block i: 32 unsigned bytes (q4_K: low nibbles of qs[32 (j/2)..] for even j, high for
 * odd; q5_K: plus bit j of qh[l] as 16; q6_K: 4 low bits from ql, 2 high from qh, value + 32). */
static inline __m256i chunk_j(const char *row, int64_t i, int j, const int kind) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    if (kind == K_Q4 || kind == K_Q5) {
        const uint8_t *qs = kind == K_Q4 ? ((const hr_block_q4_K *)row + i)->qs : ((const hr_block_q5_K *)row + i)->qs;
        const __m256i q4 = _mm256_loadu_si256((const __m256i *)(qs + 32 * (j / 2)));
        const __m256i nib = (j & 1) ? _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4) : _mm256_and_si256(q4, m4);
        if (kind == K_Q4) return nib;
        const __m256i hbits = _mm256_loadu_si256((const __m256i *)((const hr_block_q5_K *)row + i)->qh);
        const __m256i bit = _mm256_set1_epi8((char)(1 << j));
        const __m256i h = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, bit), bit), _mm256_set1_epi8(16));
        return _mm256_or_si256(nib, h);
    }
    const hr_block_q6_K *x = (const hr_block_q6_K *)row + i;
    const int h = j / 4, sub = j % 4;
    const __m256i ql = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32 * (sub & 1)));
    const __m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
    const __m256i lo = sub < 2 ? _mm256_and_si256(ql, m4) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * sub), _mm256_set1_epi8(3));
    return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
}

/* The float step of one pair and super-block (see the top of the file); bsums and dy are the
 * activation block's bsums and broadcast d. */
static inline __attribute__((always_inline)) void pair_step(__m256 *acc, __m256 *macc, __m256i s, const kscale *k,
                                                            __m256i bsums, __m256 dy, const int kind) {
    const __m256i corr = _mm256_madd_epi16(k->corr16, bsums);
    if (kind == K_Q6) s = _mm256_sub_epi32(s, _mm256_slli_epi32(corr, 5));
    *acc = _mm256_fmadd_ps(_mm256_mul_ps(k->d, dy), _mm256_cvtepi32_ps(s), *acc);
    if (kind != K_Q6) *macc = _mm256_fmadd_ps(_mm256_mul_ps(k->dmin, dy), _mm256_cvtepi32_ps(corr), *macc);
}

static inline __attribute__((always_inline)) void pair_step_blk(__m256 *acc, __m256 *macc, __m256i s, const kscale *k,
                                                                const hr_block_q8_K *yb, const int kind) {
    pair_step(acc, macc, s, k, _mm256_loadu_si256((const __m256i *)yb->bsums), _mm256_set1_ps(yb->d), kind);
}

/* Decode: one row, one token; chunks made on the fly. */
static inline __attribute__((always_inline)) float dot_1x1(int64_t k, const char *w, const char *a, const int kind) {
    __m256 acc = _mm256_setzero_ps(), macc = _mm256_setzero_ps();
    for (int64_t i = 0; i < k / HR_QK_K; i++) {
        const hr_block_q8_K *yb = (const hr_block_q8_K *)a + i;
        const kscale ks = block_scales(w, i, kind);
        __m256i s = _mm256_setzero_si256();
        HR_UNROLL
        for (int j = 0; j < 8; j++) {
            const __m256i yv = _mm256_loadu_si256((const __m256i *)(yb->qs + 32 * j));
            s = _mm256_add_epi32(
                s, _mm256_madd_epi16(_mm256_maddubs_epi16(chunk_j(w, i, j, kind), yv), scale_j(&ks, j, kind)));
        }
        pair_step_blk(&acc, &macc, s, &ks, yb, kind);
    }
    return hsum8(acc) - hsum8(macc);
}

/* ---- the batch tile ----
 * Chunks go in pairs (2jj, 2jj + 1) whose bytes are interleaved two at a time: dword i of m1 is
 * [a[4i], a[4i+1], b[4i], b[4i+1]] and of m2 [a[4i+2], a[4i+3], b[4i+2], b[4i+3]] (a, b the two
 * chunks), for weights and activations alike. Then maddubs(m1) + maddubs(m2) (int16, exact: at most
 * four products of |q| <= 63 and |y| <= 128) has chunk a's four products of dword i in its 16-bit
 * lane 2i and chunk b's in lane 2i + 1, and one madd with the scales [sc_a, sc_b] alternating gives
 * int32 lane i the same sum as madd(maddubs(a), sc_a) + madd(maddubs(b), sc_b): s is the same
 * integer vector with one multiply fewer per chunk pair. */
static inline __attribute__((always_inline)) void mix2(__m256i a, __m256i b, __m256i *m1, __m256i *m2) {
    *m1 = _mm256_blend_epi16(a, _mm256_slli_epi32(b, 16), 0xAA);
    *m2 = _mm256_blend_epi16(_mm256_srli_epi32(a, 16), b, 0xAA);
}

/* The weights of chunk pair jj of super-block i, interleaved. */
static inline __attribute__((always_inline)) void chunk_pair(const char *row, int64_t i, int jj, const int kind,
                                                             __m256i *m1, __m256i *m2) {
    if (kind == K_Q6) {
        mix2(chunk_j(row, i, 2 * jj, kind), chunk_j(row, i, 2 * jj + 1, kind), m1, m2);
        return;
    }
    /* q4_K/q5_K: the pair is the low and high nibbles of the same 32 bytes x */
    const uint8_t *qs = kind == K_Q4 ? ((const hr_block_q4_K *)row + i)->qs : ((const hr_block_q5_K *)row + i)->qs;
    const __m256i x = _mm256_loadu_si256((const __m256i *)(qs + 32 * jj));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    *m1 = _mm256_and_si256(_mm256_blend_epi16(x, _mm256_slli_epi32(x, 12), 0xAA), m4);
    *m2 = _mm256_and_si256(_mm256_blend_epi16(_mm256_srli_epi32(x, 16), _mm256_srli_epi32(x, 4), 0xAA), m4);
    if (kind == K_Q5) {
        /* bit j of qh[l] adds 16 to element l of chunk j: interleave the qh bytes like the nibbles,
         * the ones of chunk 2jj + 1 shifted down by one (bit 7 takes a neighbour's bit 0; only bits
         * up to 6 are used), then move bit 2jj of every byte to bit 4 */
        const __m256i h = _mm256_loadu_si256((const __m256i *)((const hr_block_q5_K *)row + i)->qh);
        const __m256i g1 = _mm256_blend_epi16(h, _mm256_slli_epi32(h, 15), 0xAA);
        const __m256i g2 = _mm256_blend_epi16(_mm256_srli_epi32(h, 16), _mm256_srli_epi32(h, 1), 0xAA);
        const int sh = 4 - 2 * jj;
        const __m256i m16 = _mm256_set1_epi8(16);
        const __m256i b1 = sh > 0 ? _mm256_slli_epi16(g1, sh) : sh < 0 ? _mm256_srli_epi16(g1, -sh) : g1;
        const __m256i b2 = sh > 0 ? _mm256_slli_epi16(g2, sh) : sh < 0 ? _mm256_srli_epi16(g2, -sh) : g2;
        *m1 = _mm256_or_si256(*m1, _mm256_and_si256(b1, m16));
        *m2 = _mm256_or_si256(*m2, _mm256_and_si256(b2, m16));
    }
}

/* The scales of chunk pair jj, alternating per 16-bit lane like the interleaved products (q6_K:
 * lanes 0-7 hold the chunks' first-16 scales, lanes 8-15 their second-16 ones). */
static inline __attribute__((always_inline)) __m256i scale_pair(const kscale *k, int jj, const int kind) {
    if (kind != K_Q6) {
        const int b = 4 * jj; /* byte of scale 2jj */
        return _mm256_shuffle_epi8(k->src_lo, _mm256_set1_epi32((b + 3) << 24 | (b + 2) << 16 | (b + 1) << 8 | b));
    }
    const int b = 8 * (jj & 1); /* byte of scale 4jj (mod 8) */
    const __m256i ctrl = _mm256_set_m128i(_mm_set1_epi32((b + 7) << 24 | (b + 6) << 16 | (b + 3) << 8 | (b + 2)),
                                          _mm_set1_epi32((b + 5) << 24 | (b + 4) << 16 | (b + 1) << 8 | b));
    return _mm256_shuffle_epi8(jj < 2 ? k->src_lo : k->src_hi, ctrl);
}

/* A token's super-block as the batch tile reads it. */
typedef struct kact {
    __m256i y[8];  /* chunk pair jj interleaved: y[2jj], y[2jj + 1] */
    __m256i bsums; /* as in the block */
    __m256 d;      /* broadcast */
} kact;

static inline __attribute__((always_inline)) kact load_kact(const char *a, int64_t i) {
    const hr_block_q8_K *yb = (const hr_block_q8_K *)a + i;
    kact v;
    HR_UNROLL
    for (int jj = 0; jj < 4; jj++)
        mix2(_mm256_loadu_si256((const __m256i *)(yb->qs + 64 * jj)),
             _mm256_loadu_si256((const __m256i *)(yb->qs + 64 * jj + 32)), &v.y[2 * jj], &v.y[2 * jj + 1]);
    v.bsums = _mm256_loadu_si256((const __m256i *)yb->bsums);
    v.d = _mm256_set1_ps(yb->d);
    return v;
}

/* The batch tile: one weight row x C tokens (C = HR_K_TC, or 4, 3 and 2 for a batch's leftover
 * tokens) over the super-blocks [i0, i1) of a k-block. The tokens' super-blocks are packed
 * beforehand (ap: super-block i's tokens at ap[(i - i0) * C + t]) and read as memory operands; each
 * chunk pair of the row is unpacked once for all the tokens, whose C integer sums stay in
 * registers. The float accumulators (acc[t], and macc at acc[C + t]) go through memory at every
 * super-block (an exact store and load) and stay there between k-blocks, so every element has the
 * one sequence of dot_1x1 and its bits. With AVX2's 16 registers: 8 sums, the chunk pair and its
 * scales, and the step's temporaries; the former 1 row x up to 64 tokens tile kept a whole
 * super-block's 8 chunks and 8 scale vectors live, and gcc spilled them. */
#define HR_K_TC HR_TILE_TC /* tokens of the batch tile */
#define HR_K_KS 4          /* super-blocks per k-block: the packed tokens (4 x 8 x 320 bytes) stay in L1 */
static inline __attribute__((always_inline)) void tile_row(const int C, int64_t i0, int64_t i1, const char *w,
                                                           const kact *ap, __m256 *acc, bool first, bool last, float *y,
                                                           size_t ys, const int kind) {
    if (first) {
        HR_UNROLL
        for (int t = 0; t < 2 * C; t++) acc[t] = _mm256_setzero_ps();
    }
    for (int64_t i = i0; i < i1; i++) {
        const kscale ks = block_scales(w, i, kind);
        __m256i s[HR_K_TC];
        HR_UNROLL
        for (int jj = 0; jj < 4; jj++) {
            /* hide from the compiler that the loads are of the same table, so it does not keep them
             * live across rows */
            const kact *v = ap + (i - i0) * C;
            __asm__("" : "+r"(v));
            __m256i q1, q2;
            chunk_pair(w, i, jj, kind, &q1, &q2);
            const __m256i sc = scale_pair(&ks, jj, kind);
            HR_UNROLL
            for (int t = 0; t < C; t++) {
                const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(q1, v[t].y[2 * jj]),
                                                   _mm256_maddubs_epi16(q2, v[t].y[2 * jj + 1]));
                const __m256i m = _mm256_madd_epi16(p, sc);
                s[t] = jj ? _mm256_add_epi32(s[t], m) : m;
                /* one running sum per token in its register (gcc otherwise regroups the exact
                 * integer sum into a tree and spills the partial sums) */
                __asm__("" : "+x"(s[t]));
            }
        }
        const kact *v = ap + (i - i0) * C;
        __m256 *c = acc; /* hidden too, so gcc does not try to keep the accumulators in registers */
        __asm__("" : "+r"(v), "+r"(c));
        HR_UNROLL
        for (int t = 0; t < C; t++) pair_step(&c[t], &c[C + t], s[t], &ks, v[t].bsums, v[t].d, kind);
    }
    if (last) {
        HR_UNROLL
        for (int t = 0; t < C; t++) y[(size_t)t * ys] = hsum8(acc[t]) - hsum8(acc[C + t]);
    }
}

/* The driver's k-blocks and row chunks (kernels_tile.h): the first group over a chunk streams the
 * rows in k-blocks of up to HR_K_KS_STREAM super-blocks (short runs of 32 interleaved rows left a
 * thread waiting on memory, 0.4x the rate), the later ones take HR_K_KS. */
#define HR_K_KS_STREAM   64           /* super-blocks: k <= 16384 in one k-block (8 x 64 x 320 bytes) */
#define HR_K_ROWS        32           /* rows per chunk at most */
#define HR_K_CHUNK_BYTES (192 * 1024) /* weight bytes per chunk at most (then at least one row) */

/* The driver's parts (kernels_tile.h): the step unit is a super-block; a lone token (decode) runs
 * dot_1x1 row after row, a batch the shared 1 x 8 driver. */
#define K_SUPERBLOCKS(k) ((k) / HR_QK_K)
static inline __attribute__((always_inline)) kact pack_k(const char *a, int64_t i, int64_t k) {
    (void)k;
    return load_kact(a, i);
}

#define HR_K_KERNELS(name, kind)                                                                                       \
    float hr_avx2_dot_##name(int64_t k, const void *w, const void *a) { return dot_1x1(k, w, a, kind); }               \
    static inline __attribute__((always_inline)) void row_##name(const int C, int64_t i0, int64_t i1, int64_t k,       \
                                                                 const char *w, const kact *ap, __m256 *acc,           \
                                                                 bool first, bool last, float *y, size_t ys) {         \
        (void)k;                                                                                                       \
        tile_row(C, i0, i1, w, ap, acc, first, last, y, ys, kind);                                                     \
    }                                                                                                                  \
    static void one_token_##name(int64_t k, const char *w, size_t ws, int nr, const char *a, float *y) {               \
        for (int r = 0; r < nr; r++) y[r] = dot_1x1(k, w + (size_t)r * ws, a, kind);                                   \
    }                                                                                                                  \
    HR_TILE_DRIVER(hr_avx2_tile_##name, kact, __m256, 2, K_SUPERBLOCKS, HR_K_KS, HR_K_KS_STREAM, HR_K_ROWS,            \
                   HR_K_CHUNK_BYTES, pack_k, row_##name, one_token_##name)

HR_K_KERNELS(q4_K, K_Q4)
HR_K_KERNELS(q5_K, K_Q5)
HR_K_KERNELS(q6_K, K_Q6)

/* q8_K activations with AVX2, byte for byte the reference's (quant_ref.c): the scale from the first
 * element of largest magnitude, q = min(127, nearest_int(iscale * x)) by the same 1.5 x 2^23 trick
 * (exact, so the vector form rounds as the scalar one), the sums of 16 from the bytes. */
void hr_avx2_quantize_q8_K(const float *x, void *dst, int64_t k) {
    hr_block_q8_K *y = dst;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < k / HR_QK_K; i++) {
        const float *xb = x + i * HR_QK_K;
        __m256 am = _mm256_setzero_ps();
        /* max_ps(a, b) gives b where either is NaN: a NaN element is passed over, as the reference's > does */
        for (int j = 0; j < HR_QK_K; j += 8) am = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xb + j)), am);
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(am), _mm256_extractf128_ps(am, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float amax = _mm_cvtss_f32(m);
        if (amax == 0) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        int first = 0; /* the reference keeps the first element of largest magnitude */
        while (first < HR_QK_K - 1 && fabsf(xb[first]) != amax) first++;
        const float iscale = -127.f / xb[first];
        const __m256 vs = _mm256_set1_ps(iscale), magic = _mm256_set1_ps(12582912.f);
        const __m256i mant = _mm256_set1_epi32(0x007fffff), off = _mm256_set1_epi32(0x00400000);
        const __m256i top = _mm256_set1_epi32(127);
        for (int j = 0; j < HR_QK_K; j += 32) {
            __m256i q[4];
            for (int u = 0; u < 4; u++) {
                const __m256 v = _mm256_add_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(xb + j + 8 * u)), magic);
                q[u] = _mm256_min_epi32(_mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(v), mant), off), top);
            }
            const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256((__m256i *)(y[i].qs + j),
                                _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        }
        for (int j = 0; j < HR_QK_K / 16; j++) {
            const __m128i b = _mm_loadu_si128((const __m128i *)(y[i].qs + 16 * j));
            const __m256i w = _mm256_cvtepi8_epi16(b);
            __m128i s = _mm_add_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
            s = _mm_add_epi16(s, _mm_srli_si128(s, 8));
            s = _mm_add_epi16(s, _mm_srli_si128(s, 4));
            s = _mm_add_epi16(s, _mm_srli_si128(s, 2));
            y[i].bsums[j] = (int16_t)_mm_cvtsi128_si32(s);
        }
        y[i].d = 1 / iscale;
    }
}

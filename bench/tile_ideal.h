/* tile_ideal.h: the AVX2 tiles' arithmetic alone, as the cores' bound for them (bench_tile prints it
 * beside the tile with --ideal). Each loop is one pass of a tile written in assembly with every value
 * in a register: the same instructions a tile must issue for 8 rows (vpmaddubsw, the int16 adds, the
 * vpmaddwd, the unpacking of the weights shared by the pass's tokens, the broadcasts of the
 * activations, the scaling (q4_Kx16, q5_Kx16: by the sub-block's scales into integer sums; q4_0x16,
 * q8_0x16: the float scale and FMA)) and nothing else: no address arithmetic, no spills, no loop
 * over blocks. Its rate is what a tile with this instruction mix can reach on this core; the real
 * tile's rate over it is how much of that the compiled tile gets. Included by tile.c only.
 *   q4_Kx16: one sub-block x 4 tokens (8 chunks, 4 at a time as k_four; the odd sub-block's shift;
 *            the scales' vpshufb, a vpmaddwd and a vpaddd a token; the super-block's FMA left out)
 *   q5_Kx16: the same with the fifth bits (k_fifth) and two vpmaddwd a token (4 tokens a pass: the
 *            tile takes 8 since 5a98064, sharing each chunk's unpacking between twice the tokens,
 *            which the registers here do not hold, so its share of this can pass 1)
 *   q4_0x16: one block x 4 tokens (8 nibble registers; the s8 term and the FMA)
 *   q8_0x16: one block x 8 tokens (vpsignb, vpmaddubsw, vpmaddwd and vpaddd a chunk; the float
 *            accumulators in memory, as the 8-token tile keeps them) */
#ifndef HR_BENCH_TILE_IDEAL_H
#define HR_BENCH_TILE_IDEAL_H

#include <stdint.h>
#include <string.h>

typedef struct {
    const char *name;     /* the tile's type, e.g. "q4_Kx16" */
    void (*pass)(long n); /* n passes */
    double flop;          /* per pass: 2 x 8 rows x 32 values x the pass's tokens */
} tile_ideal;

#if defined(__x86_64__)
#include <immintrin.h>

static int8_t act[8 * 256] __attribute__((aligned(64)));
static uint8_t wts[512 + 256] __attribute__((aligned(64)));
static float fb[128] __attribute__((aligned(64)));

/* the 4 activation broadcasts and vpmaddubsw of 4 chunks n0..n3 for token t's values at byte o, their
 * int16 sum into d (x0, x1 temporaries) */
#define K4(t, o, d)                                                                                                    \
    "vpbroadcastd " #t "*256+" #o "(%[p]),%[x0]\n vpmaddubsw %[x0],%[n0],%[x0]\n"                                      \
    "vpbroadcastd " #t "*256+" #o "+4(%[p]),%[x1]\n vpmaddubsw %[x1],%[n1],%[x1]\n vpaddw %[x1],%[x0],%[x0]\n"         \
    "vpbroadcastd " #t "*256+" #o "+8(%[p]),%[x1]\n vpmaddubsw %[x1],%[n2],%[x1]\n vpaddw %[x1],%[x0],%[x0]\n"         \
    "vpbroadcastd " #t "*256+" #o "+12(%[p]),%[x1]\n vpmaddubsw %[x1],%[n3],%[x1]\n vpaddw %[x1],%[x0]," d "\n"
/* 4 chunks' high nibbles into n0..n3 */
#define NIB4(o)                                                                                                        \
    "vmovdqu " #o "(%[w]),%[n0]\n vmovdqu " #o "+32(%[w]),%[n1]\n vmovdqu " #o "+64(%[w]),%[n2]\n"                     \
    "vmovdqu " #o "+96(%[w]),%[n3]\n vpsrlw $4,%[n0],%[n0]\n vpsrlw $4,%[n1],%[n1]\n vpsrlw $4,%[n2],%[n2]\n"          \
    "vpsrlw $4,%[n3],%[n3]\n vpand %[m4],%[n0],%[n0]\n vpand %[m4],%[n1],%[n1]\n vpand %[m4],%[n2],%[n2]\n"            \
    "vpand %[m4],%[n3],%[n3]\n"
/* token t's int16 sums d + x0 into int32 by the sub-block's scales (vpmaddwd), into its integer sum acc */
#define KFIN(t, d, acc) "vpaddw %[x0]," d "," d "\n vpmaddwd %[sc]," d "," d "\n vpaddd " d "," acc "," acc "\n"
/* the sub-block's scales as int16 pairs (k_sc16: one vpshufb of the scale bytes), into sc */
#define KSC "vpshufb 96(%[f]),%[m4],%[sc]\n"

/* q5_Kx16: each chunk's fifth bits (k_fifth: the bit of the sub-block, as 16) into its nibbles; the
 * bit and 16 as memory operands (no register left), the int16 sums of 4 chunks into int32 twice */
#define FIFTH(r, o)                                                                                                    \
    "vmovdqu " #o "+256(%[w]),%[x1]\n vpand 384(%[f]),%[x1],%[x1]\n vpcmpeqb 384(%[f]),%[x1],%[x1]\n"                  \
    "vpand 416(%[f]),%[x1],%[x1]\n vpor %[x1]," r "," r "\n"
#define NIB5(o) NIB4(o) FIFTH("%[n0]", o) FIFTH("%[n1]", o + 32) FIFTH("%[n2]", o + 64) FIFTH("%[n3]", o + 96)
#define K5FIN(t, d, acc)                                                                                               \
    "vpmaddwd %[sc]," d "," d "\n vpmaddwd %[sc],%[x0],%[x0]\n vpaddd %[x0]," d "," d "\n"                             \
    "vpaddd " d "," acc "," acc "\n"

/* a k-quant pass: NIB unpacks 4 chunks, FIN finishes a token */
#define KPASS(name, NIB, FIN)                                                                                          \
    __attribute__((target("avx2,fma"))) static void name(long n) {                                                     \
        __m256i n0 = _mm256_set1_epi8(1), n1 = n0, n2 = n0, n3 = n0, x0, x1, s0, s1, s2, s3, sc;                       \
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;                                                \
        const __m256i m4 = _mm256_set1_epi8(0x0F);                                                                     \
        for (long i = 0; i < n; i++)                                                                                   \
            __asm__ volatile(KSC NIB(0) K4(0, 0, "%[s0]") K4(1, 0, "%[s1]") K4(2, 0, "%[s2]") K4(3, 0, "%[s3]")        \
                                 NIB(128) K4(0, 16, "%[x0]") FIN(0, "%[s0]", "%[a0]") K4(1, 16, "%[x0]")               \
                                     FIN(1, "%[s1]", "%[a1]") K4(2, 16, "%[x0]") FIN(2, "%[s2]", "%[a2]")              \
                                         K4(3, 16, "%[x0]") FIN(3, "%[s3]", "%[a3]")                                   \
                             : [x0] "=&x"(x0), [x1] "=&x"(x1), [s0] "=&x"(s0), [s1] "=&x"(s1), [s2] "=&x"(s2),         \
                               [s3] "=&x"(s3), [n0] "+x"(n0), [n1] "+x"(n1), [n2] "+x"(n2), [n3] "+x"(n3),             \
                               [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [sc] "=&x"(sc)              \
                             : [p] "r"(act), [w] "r"(wts), [f] "r"(fb), [m4] "x"(m4)                                   \
                             : "memory");                                                                              \
        _mm256_storeu_si256((__m256i *)(fb + 64),                                                                      \
                            _mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)));                     \
    }
KPASS(q4k_pass, NIB4, KFIN)
KPASS(q5k_pass, NIB5, K5FIN)

/* q4_0x16: lo / hi nibbles of 4 chunks in l0..l3, h0..h3 */
#define Q0LD                                                                                                           \
    "vmovdqu (%[w]),%[l0]\n vmovdqu 32(%[w]),%[l1]\n vmovdqu 64(%[w]),%[l2]\n vmovdqu 96(%[w]),%[l3]\n"                \
    "vpsrlw $4,%[l0],%[h0]\n vpsrlw $4,%[l1],%[h1]\n vpsrlw $4,%[l2],%[h2]\n vpsrlw $4,%[l3],%[h3]\n"                  \
    "vpand %[m4],%[l0],%[l0]\n vpand %[m4],%[l1],%[l1]\n vpand %[m4],%[l2],%[l2]\n vpand %[m4],%[l3],%[l3]\n"          \
    "vpand %[m4],%[h0],%[h0]\n vpand %[m4],%[h1],%[h1]\n vpand %[m4],%[h2],%[h2]\n vpand %[m4],%[h3],%[h3]\n"
#define Q0M(t, o, r)                                                                                                   \
    "vpbroadcastd " #t "*64+" #o "(%[p]),%[x1]\n vpmaddubsw %[x1]," r ",%[x1]\n vpaddw %[x1],%[x0],%[x0]\n"
#define Q0T(t, acc)                                                                                                    \
    "vpbroadcastd " #t "*64(%[p]),%[x0]\n vpmaddubsw %[x0],%[l0],%[x0]\n" Q0M(t, 16, "%[h0]") Q0M(t, 4, "%[l1]")       \
        Q0M(t, 20, "%[h1]") Q0M(t, 8, "%[l2]") Q0M(t, 24, "%[h2]") Q0M(t, 12, "%[l3]")                                 \
            Q0M(t, 28, "%[h3]") "vpmaddwd %[ones],%[x0],%[x0]\n vpbroadcastd " #t                                      \
                                "*4+32(%[f]),%[x1]\n vpaddd %[x1],%[x0],%[x0]\n"                                       \
                                "vcvtdq2ps %[x0],%[x0]\n vbroadcastss " #t                                             \
                                "*4(%[f]),%[x1]\n vmulps 64(%[f]),%[x1],%[x1]\n"                                       \
                                "vfmadd231ps %[x1],%[x0]," acc "\n"

__attribute__((target("avx2,fma"))) static void q40_pass(long n) {
    __m256i l0, l1, l2, l3, h0, h1, h2, h3, x0, x1;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    for (long i = 0; i < n; i++)
        __asm__ volatile(Q0LD Q0T(0, "%[a0]") Q0T(1, "%[a1]") Q0T(2, "%[a2]") Q0T(3, "%[a3]")
                         : [x0] "=&x"(x0), [x1] "=&x"(x1), [l0] "=&x"(l0), [l1] "=&x"(l1), [l2] "=&x"(l2),
                           [l3] "=&x"(l3), [h0] "=&x"(h0), [h1] "=&x"(h1), [h2] "=&x"(h2), [h3] "=&x"(h3),
                           [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3)
                         : [p] "r"(act), [w] "r"(wts), [f] "r"(fb), [m4] "x"(m4), [ones] "x"(ones)
                         : "memory");
    _mm256_storeu_ps(fb + 64, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

/* q8_0x16: chunk c's signed values w and |w| once, then for each of 8 tokens sign(y, w), |w| y
 * pairs, into int32, into the token's sum */
#define Q8T(t, c, s)                                                                                                   \
    "vpbroadcastd " #t "*64+" #c "*4(%[p]),%[x0]\n vpsignb %[w],%[x0],%[x0]\n vpmaddubsw %[x0],%[aw],%[x0]\n"          \
    "vpmaddwd %[ones],%[x0],%[x0]\n vpaddd %[x0]," s "," s "\n"
#define Q8C(c)                                                                                                         \
    "vmovdqu " #c "*32(%[wp]),%[w]\n vpxor %[flip],%[w],%[w]\n vpabsb %[w],%[aw]\n" Q8T(0, c, "%[s0]")                 \
        Q8T(1, c, "%[s1]") Q8T(2, c, "%[s2]") Q8T(3, c, "%[s3]") Q8T(4, c, "%[s4]") Q8T(5, c, "%[s5]")                 \
            Q8T(6, c, "%[s6]") Q8T(7, c, "%[s7]")
#define Q8F(t, s)                                                                                                      \
    "vcvtdq2ps " s "," s "\n vbroadcastss " #t "*4(%[f]),%[x0]\n vmulps 32(%[f]),%[x0],%[x0]\n"                        \
    "vfmadd213ps " #t "*32+64(%[f]),%[x0]," s "\n vmovaps " s "," #t "*32+64(%[f])\n"

__attribute__((target("avx2,fma"))) static void q80_pass(long n) {
    __m256i w, aw, x0, s0, s1, s2, s3, s4, s5, s6, s7;
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1), z = _mm256_setzero_si256();
    for (long i = 0; i < n; i++) {
        s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = z;
        __asm__ volatile(Q8C(0) Q8C(1) Q8C(2) Q8C(3) Q8C(4) Q8C(5) Q8C(6) Q8C(7) Q8F(0, "%[s0]") Q8F(1, "%[s1]")
                             Q8F(2, "%[s2]") Q8F(3, "%[s3]") Q8F(4, "%[s4]") Q8F(5, "%[s5]") Q8F(6, "%[s6]")
                                 Q8F(7, "%[s7]")
                         : [w] "=&x"(w), [aw] "=&x"(aw), [x0] "=&x"(x0), [s0] "+x"(s0), [s1] "+x"(s1), [s2] "+x"(s2),
                           [s3] "+x"(s3), [s4] "+x"(s4), [s5] "+x"(s5), [s6] "+x"(s6), [s7] "+x"(s7)
                         : [p] "r"(act), [wp] "r"(wts), [f] "r"(fb), [flip] "x"(flip), [ones] "x"(ones)
                         : "memory");
    }
}

/* 1 and *out filled where type `name` has an ideal loop on this build (x86-64), else 0 */
static int tile_ideal_find(const char *name, tile_ideal *out) {
    static const tile_ideal all[] = {
        {"q4_Kx16", q4k_pass, 4 * 512.0},
        {"q5_Kx16", q5k_pass, 4 * 512.0},
        {"q4_0x16", q40_pass, 4 * 512.0},
        {"q8_0x16", q80_pass, 8 * 512.0},
    };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(all[i].name, name)) {
            *out = all[i];
            memset(act, 1, sizeof act);
            memset(wts, 0x21, sizeof wts);
            for (int j = 0; j < 96; j++) fb[j] = 0.5f;
            memset((char *)fb + 384, 0x04, 32); /* q5_Kx16's bit and 16 */
            memset((char *)fb + 416, 0x10, 32);
            return 1;
        }
    return 0;
}
#else
static int tile_ideal_find(const char *name, tile_ideal *out) {
    (void)name, (void)out;
    return 0;
}
#endif

#endif

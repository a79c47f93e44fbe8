/* kv_format.c: the KV formats as vocabulary: names, parsing, and each format's per-head byte layout
 * (kv_format.h). The kernels that encode and read these layouts belong to a KV storage
 * (backend/cpu/kv_format.c and kv_format_avx2.c for the CPU).
 *
 * Head-region layouts (B tokens, D = head_dim, G = group):
 *   F32   : f32 [B][D]
 *   F16   : f16 [B][D]
 *   BF16  : bf16 [B][D]
 *   Q8    : int8 [B][D], then f16 scale [B][D/G]            (symmetric, G = min(64, D) power of 2)
 *   FP8   : e4m3 [B][D], then f32 scale [B]                 (per token and head: amax / 448)
 *   Q4  K : f16 scale [D], f16 min [D], then u4 [B][D/2]    (per channel over the block, like KIVI)
 *   Q4  V : u4 [B][D/2], then f16 (scale, min) [B][D/G]     (per token, asymmetric, G <= 32)
 *   KIVI2 K: f16 scale [D], f16 min [D], then u2 [B][D/4]   (per channel over the block)
 *   KIVI2 V: u2 [B][D/4], then f16 (scale, min) [B][D/G]    (per token, asymmetric, G <= 32)
 *   Q4H K : u4 [B][D/2], then f16 (scale, min) [B][D/G]     (Q4 V's layout, of the key rotated by
 *           the normalized Hadamard transform of the head; D a power of two, G = min(32, D))
 *   Q4H V : exactly Q4 V's layout, encoded token by token at write time
 * Every head region is padded to a multiple of 64 bytes. */
#include <stdlib.h>
#include <string.h>

#include "kv/kv_format.h"
static const char *const kv_format_names[HR_KV_FORMAT_COUNT] = {"f32", "f16", "bf16",  "q8",
                                                                "q4",  "fp8", "kivi2", "q4h"};

const char *hr_kv_format_name(hr_kv_format f) {
    if ((unsigned)f >= HR_KV_FORMAT_COUNT) return "?";
    return kv_format_names[f];
}

/* Other spellings users bring from llama.cpp / vLLM flags. */
static const struct {
    const char *name;
    hr_kv_format f;
} kv_format_aliases[] = {{"fp32", HR_KV_F32}, {"fp16", HR_KV_F16},     {"q8_0", HR_KV_Q8},
                         {"int8", HR_KV_Q8},  {"q4_0", HR_KV_Q4},      {"int4", HR_KV_Q4},
                         {"e4m3", HR_KV_FP8}, {"fp8_e4m3", HR_KV_FP8}, {"q4_hadamard", HR_KV_Q4H}};

hr_status hr_kv_format_parse(const char *name, hr_kv_format *out, hr_error *err) {
    for (int i = 0; name && i < HR_KV_FORMAT_COUNT; i++) {
        if (strcmp(name, kv_format_names[i]) == 0) {
            *out = (hr_kv_format)i;
            return HR_OK;
        }
    }
    for (size_t i = 0; name && i < sizeof kv_format_aliases / sizeof kv_format_aliases[0]; i++) {
        if (strcmp(name, kv_format_aliases[i].name) == 0) {
            *out = kv_format_aliases[i].f;
            return HR_OK;
        }
    }
    return hr_error_set(err, HR_ERR_INVALID_ARG,
                        "unknown KV format '%s': expected one of f32, f16, bf16, q8, q4, fp8, kivi2, q4h",
                        name ? name : "(null)");
}

/* Largest power of two <= cap that divides D (D % 8 == 0 is checked by the caller, so >= 8). */
static int kv_group(int D, int cap) {
    int g = cap;
    while (g > 1 && D % g != 0) g /= 2;
    return g;
}

static size_t kv_align(size_t n, size_t a) { return (n + a - 1) / a * a; }

hr_status kv_fmt_init(kv_fmt *f, hr_kv_format format, int role, int B, int D, hr_error *err) {
    memset(f, 0, sizeof *f);
    f->format = format;
    f->role = role;
    f->B = B;
    f->D = D;
    size_t BD = (size_t)B * D;
    if ((unsigned)format >= HR_KV_FORMAT_COUNT)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "KV format id %d is not a format", (int)format);
    if (format >= HR_KV_Q8 && D % 8 != 0)
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "KV format %s needs head_dim a multiple of 8, got %d: use f16 or bf16",
                            hr_kv_format_name(format), D);
    switch (format) {
    case HR_KV_F32: f->scale_off = f->head_bytes = BD * 4; break;
    case HR_KV_F16:
    case HR_KV_BF16: f->scale_off = f->head_bytes = BD * 2; break;
    case HR_KV_Q8:
        /* groups of 64, not llama.cpp's q8_0 32: at head_dim 128 and 16-token blocks a head region is
         * 2,112 bytes against 2,176 (f16's 4,096 over it: 1.94x against 1.88x); the int16 x int8 group
         * sums stay exact in int32 (64 x 32767 x 127 < 2^31) */
        f->G = kv_group(D, 64);
        f->scale_off = BD;
        f->head_bytes = BD + (size_t)B * (D / f->G) * 2;
        break;
    case HR_KV_FP8:
        f->scale_off = kv_align(BD, 4);
        f->head_bytes = f->scale_off + (size_t)B * 4;
        break;
    case HR_KV_Q4:
    case HR_KV_KIVI2:
        f->bits = format == HR_KV_Q4 ? 4 : 2;
        f->deferred = true;
        f->G = kv_group(D, 32);
        if (role == KV_K) {
            f->per_channel = true;
            f->scale_off = 0;
            f->code_off = (size_t)D * 4;
            f->head_bytes = f->code_off + BD * f->bits / 8;
        } else {
            f->code_off = 0;
            f->scale_off = BD * f->bits / 8;
            f->head_bytes = f->scale_off + (size_t)B * (D / f->G) * 4;
        }
        break;
    case HR_KV_Q4H:
        if (role == KV_K && (D & (D - 1)) != 0)
            return hr_error_set(err, HR_ERR_INVALID_ARG,
                                "KV format q4h rotates keys by a Hadamard transform, which needs head_dim a "
                                "power of two; %d is not: use q4 (per-channel K scales) instead",
                                D);
        f->bits = 4;
        f->G = kv_group(D, 32);
        f->code_off = 0;
        f->scale_off = BD / 2;
        f->head_bytes = f->scale_off + (size_t)B * (D / f->G) * 4;
        if (role == KV_K) {
            /* measurement-only variants (docs/BENCHMARKS.md, the q4h section): HEADROOM_KV_Q4H_VARIANT=norot stores the
             * keys unrotated (plain per-token 4-bit K), =sym uses symmetric codes, =norot,sym both */
            const char *var = getenv("HEADROOM_KV_Q4H_VARIANT");
            f->rotate = !(var && strstr(var, "norot"));
            f->sym = var && strstr(var, "sym");
        }
        break;
    }
    f->head_bytes = kv_align(f->head_bytes, 64);
    return HR_OK;
}

/* rope_yarn.c: RoPE's frequency tables as every backend turns by them (hr_model_rope_inv_freq), and
 * YaRN's frequency correction and magnitude scale (model.h), as llama.cpp and ggml compute
 * them (the YaRN paper's NTK-by-parts interpolation: pairs that turn many times over the original
 * context keep their frequency, pairs that turn less than once are interpolated by 1/s, a linear ramp
 * between; plus the attention temperature 0.1 ln s + 1 on the rotated dims, which DeepSeek moves into
 * the attention scale: see model.h). The arithmetic of the
 * correction dims stays in float as ggml's, so floor/ceil pick the same pairs. */
#include <math.h>

#include "model/model.h"
#include "model/model_internal.h"

/* ggml's correction dim: the pair whose wavelength turns n_rotations times over n_ctx_orig. */
static float corr_dim(int n_dims, int n_ctx_orig, float n_rotations, float base) {
    return (float)n_dims * logf((float)n_ctx_orig / (n_rotations * 2.0f * (float)M_PI)) / (2.0f * logf(base));
}

double hr_rope_yarn_freq_factor(const hr_hparams *hp, double base, int i) {
    if (!(hp->yarn_factor > 0.0f)) return 1.0;
    const float freq_scale = 1.0f / hp->yarn_factor;
    float lo = floorf(corr_dim(hp->n_rot, hp->n_ctx_orig, hp->yarn_beta_fast, (float)base));
    float hi = ceilf(corr_dim(hp->n_rot, hp->n_ctx_orig, hp->yarn_beta_slow, (float)base));
    lo = lo > 0.0f ? lo : 0.0f;
    hi = hi < (float)(hp->n_rot - 1) ? hi : (float)(hp->n_rot - 1);
    const float y = ((float)i - lo) / fmaxf(0.001f, hi - lo);
    const float ramp = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * hp->yarn_ext_factor;
    return (double)freq_scale * (1.0 - ramp) + ramp;
}

/* llama.cpp's get_mscale: the YaRN paper's attention temperature 0.1 m ln s + 1 (1 where s <= 1) */
static float get_mscale(float s, float m) { return s <= 1.0f ? 1.0f : 0.1f * m * logf(s) + 1.0f; }

float hr_rope_yarn_attn_factor(float factor, float attn_factor, float mscale, float mscale_all_dims) {
    const float freq_scale = factor > 0.0f ? 1.0f / factor : 1.0f, s = 1.0f / freq_scale;
    /* DeepSeek's mscale over mscale_all_dims where the file has yarn_log_multiplier (the ratio is 1 for
     * every DeepSeek file: llama.cpp takes mscale = mscale_all_dims there), else get_mscale(s, 1) */
    float m = mscale_all_dims != 0.0f ? get_mscale(s, mscale) / get_mscale(s, mscale_all_dims) : get_mscale(s, 1.0f);
    m *= 1.0f / (1.0f + 0.1f * logf(s)); /* cancelled, as llama.cpp then does */
    return m * attn_factor;
}

float hr_rope_yarn_mscale(float factor, float attn_factor, float mscale, float mscale_all_dims) {
    const float freq_scale = factor > 0.0f ? 1.0f / factor : 1.0f;
    const float m = hr_rope_yarn_attn_factor(factor, attn_factor, mscale, mscale_all_dims);
    return m * (1.0f + 0.1f * logf(1.0f / freq_scale)); /* what ggml's rope_yarn multiplies in */
}

void hr_model_rope_inv_freq(const hr_model *m, int max_ctx, float *inv, float *inv_swa) {
    const hr_hparams *hp = &m->hp;
    /* LongRoPE (phi3): the long factors where a sequence may pass the original context, as llama.cpp
     * chooses them by its per-sequence context */
    const float *factors = m->rope_freqs;
    if (m->rope_long) factors = max_ctx > hp->n_ctx_orig ? m->rope_long : m->rope_short;
    /* the window layers' base (gemma3: 10000) goes in inv_swa where full layers exist beside them, and
     * in inv itself where every layer is a window layer */
    float base_swa = hp->rope_base;
    for (int il = 0; il < hp->n_layer; il++)
        if (m->layer_attn[il].kind == HR_ATTN_WINDOW) base_swa = m->layer_attn[il].rope_base;
    const double base = hp->n_window_layers == hp->n_layer ? base_swa : hp->rope_base;
    for (int i = 0; i < hp->n_rot / 2; i++) {
        double f = pow(base, -2.0 * i / hp->n_rot), f_swa = pow((double)base_swa, -2.0 * i / hp->n_rot);
        if (factors) f /= factors[i], f_swa /= factors[i];
        f *= hr_rope_yarn_freq_factor(hp, base, i); /* YaRN (gpt-oss, DeepSeek): 1 elsewhere */
        f_swa *= hr_rope_yarn_freq_factor(hp, base_swa, i);
        inv[i] = (float)f;
        if (inv_swa) inv_swa[i] = (float)f_swa;
    }
}

/* synth_internal.h: what synth.c, synth_arch.c and synth_vocab.c share. */
#ifndef HR_MODEL_SYNTH_INTERNAL_H
#define HR_MODEL_SYNTH_INTERNAL_H

#include "model/synth.h"

hr_status hr_synth_vocab_spm(hr_gguf_writer *w, int n_vocab, hr_error *err);
hr_status hr_synth_vocab_bpe(hr_gguf_writer *w, int n_vocab, const char *pre, hr_error *err);

/* rows x cols uniform in [-a, a], a = scale sqrt(3 / cols) (variance scale^2 / cols), seeded by the
 * tensor's name, stored in t (f16 where a row does not fill t's blocks). synth.c. */
hr_status hr_synth_add_matrix(hr_gguf_writer *w, const char *name, int64_t rows, int64_t cols, hr_dtype t,
                              uint64_t seed, float scale, hr_error *err);
/* n values base + jitter * uniform(-1, 1) in f32, seeded by the name (norm weights: gemma's converter
 * stores 1 + w, so every family's norms are plain multipliers near 1 in the file). synth.c. */
hr_status hr_synth_add_vector(hr_gguf_writer *w, const char *name, int64_t n, float base, float jitter, uint64_t seed,
                              hr_error *err);

#define HR_SYNTH_ARCH_SHAPE_NAMES                                                                                      \
    "qwen3-tiny, qwen3-tiny-yarn, qwen3-0.6b, gemma2-tiny, gemma2-2b, gemma3-tiny, gemma3-tiny-scaled, gemma3-1b, "    \
    "gemma3-4b, "                                                                                                      \
    "phi3-tiny, phi3.5-mini, qwen3moe-tiny, qwen3moe-small, qwen3moe-30b-a3b, mixtral-tiny, gpt-oss-tiny, "            \
    "gpt-oss-small, gpt-oss-20b, deepseek2-tiny, deepseek2-tiny-yarn, deepseek2-tiny-kvb, deepseek3-tiny, "            \
    "deepseek-v2-lite"

/* synth_arch.c: shapes and builders of the families past llama's (qwen3, gemma2, gemma3, phi3). */
bool hr_synth_arch_shape_by_name(const char *name, hr_synth_shape *out); /* false: not one of them */
bool hr_synth_arch_builds(const char *arch);                             /* qwen3, gemma2, gemma3, phi3 */
hr_status hr_synth_build_arch(const hr_synth_shape *s, hr_dtype type, uint64_t seed, hr_gguf_writer **out,
                              hr_error *err);

#endif

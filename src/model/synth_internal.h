/* synth_internal.h: vocabulary builders shared by synth.c and synth_vocab.c. */
#ifndef HR_MODEL_SYNTH_INTERNAL_H
#define HR_MODEL_SYNTH_INTERNAL_H

#include "model/synth.h"

hr_status hr_synth_vocab_spm(hr_gguf_writer *w, int n_vocab, hr_error *err);
hr_status hr_synth_vocab_bpe(hr_gguf_writer *w, int n_vocab, const char *pre, hr_error *err);

#define HR_SYNTH_ARCH_SHAPE_NAMES                                                                                      \
    "qwen3-tiny, qwen3-0.6b, gemma2-tiny, gemma2-2b, gemma3-tiny, gemma3-tiny-scaled, gemma3-1b, gemma3-4b, "          \
    "phi3-tiny, phi3.5-mini"

/* synth_arch.c: shapes and builders of the families past llama's (qwen3, gemma2, gemma3, phi3). */
bool hr_synth_arch_shape_by_name(const char *name, hr_synth_shape *out); /* false: not one of them */
bool hr_synth_arch_builds(const char *arch);                             /* qwen3, gemma2, gemma3, phi3 */
hr_status hr_synth_build_arch(const hr_synth_shape *s, hr_dtype type, uint64_t seed, hr_gguf_writer **out,
                              hr_error *err);

#endif

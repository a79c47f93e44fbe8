/* synth_internal.h: vocabulary builders shared by synth.c and synth_vocab.c. */
#ifndef HR_MODEL_SYNTH_INTERNAL_H
#define HR_MODEL_SYNTH_INTERNAL_H

#include "model/synth.h"

hr_status hr_synth_vocab_spm(hr_gguf_writer *w, int n_vocab, hr_error *err);
hr_status hr_synth_vocab_bpe(hr_gguf_writer *w, int n_vocab, const char *pre, hr_error *err);

#endif

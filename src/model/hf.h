/* hf.h: a Hugging Face checkpoint directory (config.json, model.safetensors or shards with
 * model.safetensors.index.json, tokenizer.json, tokenizer_config.json, generation_config.json) presented
 * as what model/load.c binds from a GGUF file: the metadata llama.cpp's convert_hf_to_gguf.py would
 * write (hyper-parameters, tokenizer, chat template) as a small in-memory GGUF with no tensors, and the
 * tensors under their GGUF names as views into the mapped shards (llama/mistral Q and K rows permuted
 * in place as the converter permutes them), or quantized at load into owned buffers.
 * Internal to src/model (load.c); the public entry is hr_model_load_dir (model.h). */
#ifndef HR_MODEL_HF_H
#define HR_MODEL_HF_H

#include "common/status.h"
#include "gguf/gguf.h"

typedef struct hr_hf hr_hf;

/* Opens dir. quantize: NULL (weights as stored: bf16/f16/f32, mapped) or "q8_0", "q4_0", "q4_K".
 * On success *hf holds the shards and buffers, *meta the metadata GGUF (reading memory *hf owns:
 * close *meta before destroying *hf). Every error names the file (and tensor or key). */
hr_status hr_hf_open(const char *dir, const char *quantize, hr_hf **hf, hr_gguf **meta, hr_error *err);
void hr_hf_destroy(hr_hf *h); /* NULL allowed */

/* A tensor by its GGUF name ("blk.0.attn_q.weight"), or NULL. */
const hr_gguf_tensor *hr_hf_find_tensor(const hr_hf *h, const char *name);
/* Bytes of the tensors as the model holds them (mapped or quantized) plus the metadata image. */
uint64_t hr_hf_bytes(const hr_hf *h);
/* The whole pages of tensor data [p, p + n) given back where they are a shard's mapped file, never
 * written (the Q/K rows permuted in place are kept): hr_safetensors_release. give false: only counted.
 * 0 for a converted tensor (owned memory). */
uint64_t hr_hf_release(hr_hf *h, const void *p, uint64_t n, bool give);
/* [p, p + n) inside a buffer the loader made (quantized at load, converted, the experts' stacks): its
 * whole pages unmapped for good (give) or counted; 0 for anything else. The bytes are gone: the caller
 * (hr_model_drop_host) promises nothing reads them again. */
uint64_t hr_hf_drop(hr_hf *h, const void *p, uint64_t n, bool give);

/* The quantization types --quantize takes, parsed ("q8_0" -> HR_DTYPE_Q8_0; tensor.h ids); -1 if unknown. */
int hr_hf_quantize_type(const char *name);

#endif

/* backend.c: the forward API of model.h dispatched through an instance's backend ops (backend.h). */
#include "backend/backend.h"

#include <stddef.h>
#include <stdint.h>

static const hr_backend_ops *ops_of(const hr_model_ctx *c) { return ((const hr_backend_base *)(const void *)c)->ops; }

const hr_backend_ops *hr_backend_of(const hr_model_ctx *c) { return ops_of(c); }

hr_status hr_model_ctx_create(const hr_model *m, hr_kv_pool *kv, const hr_model_ctx_params *p, hr_model_ctx **out,
                              hr_error *err) {
    const hr_backend_ops *b = p->backend ? p->backend : &hr_backend_cpu;
    return b->create(m, kv, p, out, err);
}

void hr_model_ctx_destroy(hr_model_ctx *c) {
    if (c) ops_of(c)->destroy(c);
}

hr_status hr_model_forward(hr_model_ctx *c, const hr_batch *b, float *logits, hr_error *err) {
    return ops_of(c)->forward(c, b, logits, err);
}

const char *hr_model_ctx_isa(const hr_model_ctx *c) { return ops_of(c)->isa ? ops_of(c)->isa(c) : "none"; }
int hr_model_ctx_n_threads(const hr_model_ctx *c) { return ops_of(c)->n_threads ? ops_of(c)->n_threads(c) : 1; }
bool hr_model_ctx_argmax(const hr_model_ctx *c) { return ops_of(c)->argmax && ops_of(c)->argmax(c); }

int64_t hr_model_ctx_run_items_min(const hr_model_ctx *c) {
    return ops_of(c)->run_items && hr_model_ctx_n_threads(c) > 1 ? ops_of(c)->run_items_min : INT64_MAX;
}

void hr_model_ctx_run_items(hr_model_ctx *c, hr_model_item_fn fn, void *user, int64_t n) {
    if (ops_of(c)->run_items) {
        ops_of(c)->run_items(c, fn, user, n);
        return;
    }
    for (int64_t i = 0; i < n; i++) fn(user, i, 0);
}

uint64_t hr_backend_weight_bytes(const hr_backend_ops *b, const hr_model *m) {
    if (!b) b = &hr_backend_cpu;
    return b->weight_bytes ? b->weight_bytes(m) : 0;
}

uint64_t hr_backend_scratch_bytes(const hr_backend_ops *b, const hr_hparams *hp, int max_batch_tokens, int max_ctx,
                                  int block_size, int n_threads) {
    if (!b) b = &hr_backend_cpu;
    return b->scratch_bytes ? b->scratch_bytes(hp, max_batch_tokens, max_ctx, block_size, n_threads) : 0;
}

uint64_t hr_model_ctx_scratch_bytes(const hr_hparams *hp, int max_batch_tokens, int max_ctx, int block_size,
                                    int n_threads) {
    return hr_backend_scratch_bytes(NULL, hp, max_batch_tokens, max_ctx, block_size, n_threads);
}

/* backend.h: the seam a compute backend plugs into. A backend runs a model's forward pass over a
 * ragged batch (model.h: hr_batch) against a KV storage, and says what memory it needs for the budget
 * (the weights as it holds them, its scratch for a given largest batch). model/ keeps the
 * architecture (hyper-parameters, tensor names, which operations each layer runs); a backend executes
 * it. The CPU backend (backend/cpu/forward.c) is the one that computes; the planner's simulator
 * (plan/sim.c) is one that computes nothing and prices each batch in modelled time.
 *
 * An instance is an hr_model_ctx, made by hr_model_ctx_create with hr_model_ctx_params.backend naming
 * the backend (NULL: the CPU); hr_model_forward, hr_model_ctx_isa and the rest dispatch through its ops,
 * so the engine and everything above it drive any backend the same way. */
#ifndef HR_BACKEND_BACKEND_H
#define HR_BACKEND_BACKEND_H

#include <stdint.h>

#include "common/status.h"
#include "kv/kv.h"
#include "model/model.h"

typedef struct hr_backend_ops {
    const char *name; /* "cpu", "sim" */
    /* One instance for model m (NULL for a backend that needs none: the simulator) writing to and
     * attending over kv, sized by p (its max_batch_tokens, max_ctx, n_threads, ISA; backend_user is
     * the backend's own). */
    hr_status (*create)(const hr_model *m, hr_kv_pool *kv, const hr_model_ctx_params *p, hr_model_ctx **out,
                        hr_error *err);
    void (*destroy)(hr_model_ctx *c);
    /* model.h's hr_model_forward contract: logits for the rows that ask, nothing committed to the
     * KV ledger. */
    hr_status (*forward)(hr_model_ctx *c, const hr_batch *b, float *logits, hr_error *err);
    const char *(*isa)(const hr_model_ctx *c); /* what its kernels run: "avx2", ...; "none" */
    int (*n_threads)(const hr_model_ctx *c);
    /* true where forward fills hr_batch.argmax instead of logits (model.h; NULL: never) */
    bool (*argmax)(const hr_model_ctx *c);
    /* model.h's hr_model_ctx_run_items on the instance's host threads (NULL: in order, inline), and the
     * least work its threads pay for (hr_model_ctx_run_items_min: how awake they are when it is called) */
    void (*run_items)(hr_model_ctx *c, hr_model_item_fn fn, void *user, int64_t n);
    int64_t run_items_min;
    /* Memory for the budget, pure (no instance made): the weights as this backend holds them, and the
     * scratch an instance allocates for this shape (every buffer it keeps for max_batch_tokens and
     * max_ctx). NULL: none. */
    uint64_t (*weight_bytes)(const hr_model *m);
    uint64_t (*scratch_bytes)(const hr_hparams *hp, int max_batch_tokens, int max_ctx, int block_size, int n_threads);
} hr_backend_ops;

/* Every backend's instance struct begins with this, so that one handle type (hr_model_ctx) serves them
 * all: the dispatch reads only this first member. */
typedef struct hr_backend_base {
    const hr_backend_ops *ops;
} hr_backend_base;

extern const hr_backend_ops hr_backend_cpu;

/* The ops of instance c. */
const hr_backend_ops *hr_backend_of(const hr_model_ctx *c);
/* Bytes of backend b's (NULL: the CPU's) weights as it holds them, and of its scratch for this shape:
 * what the memory budget counts for the forward pass. */
uint64_t hr_backend_weight_bytes(const hr_backend_ops *b, const hr_model *m);
uint64_t hr_backend_scratch_bytes(const hr_backend_ops *b, const hr_hparams *hp, int max_batch_tokens, int max_ctx,
                                  int block_size, int n_threads);

#endif

/* runtime_parts.h: the objects a runtime composes (model, KV pool, swap tier, forward context, engine),
 * lent to the code that must see them: the tests and benches that check the pool's and the engine's
 * invariants from the inside, and the runtime's own files. Front ends (src/cli, src/server, src/eval,
 * src/bench) never include it: they use runtime.h, which hands out none of these (tests/layering.sh
 * holds them to that). Every pointer is borrowed: it lives as long as the runtime. */
#ifndef HR_RUNTIME_RUNTIME_PARTS_H
#define HR_RUNTIME_RUNTIME_PARTS_H

#include "engine/engine.h"
#include "kv/kv.h"
#include "model/model.h"
#include "runtime/budget.h"
#include "runtime/runtime.h"

const hr_model *hr_runtime_model(const hr_runtime *rt);
hr_kv_pool *hr_runtime_kv(hr_runtime *rt);
hr_kv_swap *hr_runtime_swap(hr_runtime *rt); /* NULL when there is no tier */
hr_model_ctx *hr_runtime_ctx(hr_runtime *rt);
hr_engine *hr_runtime_engine(hr_runtime *rt);

/* The engine's request under r (its channel: hr_request_read / hr_request_wait). Front ends read a
 * request through hr_rt_request_read / hr_rt_request_wait instead. */
hr_request *hr_rt_request_handle(hr_rt_request *r);

#endif

/* vocab.h: inside runtime/ only: the runtime's vocabulary (runtime_types.h) to and from the layers'
 * own types. The enums need no function: their numbers are the same (vocab.c checks each at compile
 * time), so a cast converts them. */
#ifndef HR_RUNTIME_VOCAB_H
#define HR_RUNTIME_VOCAB_H

#include "engine/engine.h"
#include "kv/kv.h"
#include "runtime/runtime_types.h"
#include "sampler/sampler.h"
#include "tokenizer/chat.h"

hr_sampler_params hr_rt_to_sampler(const hr_rt_sampling *s);
hr_chat_msg hr_rt_to_chat_msg(const hr_rt_chat_msg *m);
void hr_rt_from_seq_ledger(const hr_kv_seq_ledger *in, hr_rt_seq_ledger *out);
void hr_rt_from_request_stats(const hr_request_stats *in, hr_rt_request_stats *out);
void hr_rt_from_pool_ledger(const hr_kv_pool_ledger *in, hr_rt_pool_ledger *out);
void hr_rt_from_engine_stats(const hr_engine_stats *in, hr_rt_engine_stats *out);

#endif

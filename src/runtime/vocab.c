/* vocab.c: see runtime_types.h and vocab.h. Names and parsing are the layers' own (one table each);
 * the snapshots are copied field by field, so a field added below is not seen above until it is
 * added here on purpose. */
#include "runtime/vocab.h"

#include <string.h>

#include "constrain/constrain.h"

/* the runtime's enums are the layers' numbers */
_Static_assert(HR_RT_KV_F32 == (int)HR_KV_F32 && HR_RT_KV_F16 == (int)HR_KV_F16 && HR_RT_KV_BF16 == (int)HR_KV_BF16 &&
                   HR_RT_KV_Q8 == (int)HR_KV_Q8 && HR_RT_KV_Q4 == (int)HR_KV_Q4 && HR_RT_KV_FP8 == (int)HR_KV_FP8 &&
                   HR_RT_KV_KIVI2 == (int)HR_KV_KIVI2 && HR_RT_KV_Q4H == (int)HR_KV_Q4H &&
                   HR_RT_KV_FORMAT_COUNT == HR_KV_FORMAT_COUNT,
               "hr_rt_kv_format follows hr_kv_format");
_Static_assert(HR_RT_ADMIT_ADAPTIVE == (int)HR_ADMIT_ADAPTIVE && HR_RT_ADMIT_RESERVE == (int)HR_ADMIT_RESERVE &&
                   HR_RT_ADMIT_OPTIMISTIC == (int)HR_ADMIT_OPTIMISTIC,
               "hr_rt_admission follows hr_admission");
_Static_assert(HR_RT_PREEMPT_AUTO == (int)HR_PREEMPT_AUTO && HR_RT_PREEMPT_RECOMPUTE == (int)HR_PREEMPT_RECOMPUTE &&
                   HR_RT_PREEMPT_SWAP == (int)HR_PREEMPT_SWAP,
               "hr_rt_preempt follows hr_preempt_mode");
_Static_assert(HR_RT_LAYOUT_PAGED == (int)HR_LAYOUT_PAGED && HR_RT_LAYOUT_CONTIGUOUS == (int)HR_LAYOUT_CONTIGUOUS,
               "hr_rt_layout follows hr_kv_layout");
_Static_assert(HR_RT_WAITING == (int)HR_REQ_WAITING && HR_RT_RUNNING == (int)HR_REQ_RUNNING &&
                   HR_RT_PREEMPTED == (int)HR_REQ_PREEMPTED && HR_RT_COMPLETED == (int)HR_REQ_COMPLETED &&
                   HR_RT_CANCELLED == (int)HR_REQ_CANCELLED && HR_RT_FAILED == (int)HR_REQ_FAILED,
               "hr_rt_state follows hr_request_state");
_Static_assert(HR_RT_CONS_NONE == (int)HR_CONS_NONE && HR_RT_CONS_JSON == (int)HR_CONS_JSON &&
                   HR_RT_CONS_JSON_SCHEMA == (int)HR_CONS_JSON_SCHEMA && HR_RT_CONS_REGEX == (int)HR_CONS_REGEX &&
                   HR_RT_CONS_GRAMMAR == (int)HR_CONS_GRAMMAR && HR_RT_CONS_CHOICE == (int)HR_CONS_CHOICE,
               "hr_rt_cons_kind follows hr_cons_kind");
_Static_assert(HR_RT_MAX_BIAS == HR_SAMPLER_MAX_BIAS, "the logit bias bound is the sampler's");

const char *hr_rt_kv_format_name(hr_rt_kv_format f) { return hr_kv_format_name((hr_kv_format)f); }
hr_status hr_rt_kv_format_parse(const char *name, hr_rt_kv_format *out, hr_error *err) {
    hr_kv_format f;
    hr_status st = hr_kv_format_parse(name, &f, err);
    if (st == HR_OK) *out = (hr_rt_kv_format)f;
    return st;
}
const char *hr_rt_admission_name(hr_rt_admission a) { return hr_admission_name((hr_admission)a); }
hr_status hr_rt_admission_parse(const char *name, hr_rt_admission *out, hr_error *err) {
    hr_admission a;
    hr_status st = hr_admission_parse(name, &a, err);
    if (st == HR_OK) *out = (hr_rt_admission)a;
    return st;
}
const char *hr_rt_preempt_name(hr_rt_preempt m) { return hr_preempt_mode_name((hr_preempt_mode)m); }
hr_status hr_rt_preempt_parse(const char *name, hr_rt_preempt *out, hr_error *err) {
    hr_preempt_mode m;
    hr_status st = hr_preempt_mode_parse(name, &m, err);
    if (st == HR_OK) *out = (hr_rt_preempt)m;
    return st;
}
const char *hr_rt_layout_name(hr_rt_layout l) { return hr_kv_layout_name((hr_kv_layout)l); }
hr_status hr_rt_layout_parse(const char *name, hr_rt_layout *out, hr_error *err) {
    hr_kv_layout l;
    hr_status st = hr_kv_layout_parse(name, &l, err);
    if (st == HR_OK) *out = (hr_rt_layout)l;
    return st;
}
const char *hr_rt_state_name(hr_rt_state s) { return hr_request_state_name((hr_request_state)s); }

hr_sampler_params hr_rt_to_sampler(const hr_rt_sampling *s) {
    return (hr_sampler_params){.temperature = s->temperature,
                               .top_k = s->top_k,
                               .top_p = s->top_p,
                               .min_p = s->min_p,
                               .repeat_penalty = s->repeat_penalty,
                               .presence_penalty = s->presence_penalty,
                               .frequency_penalty = s->frequency_penalty,
                               .penalty_last_n = s->penalty_last_n,
                               .seed = s->seed,
                               .bias_ids = s->bias_ids,
                               .bias_values = s->bias_values,
                               .n_bias = s->n_bias};
}

int32_t hr_rt_argmax(const float *logits, int n) { return hr_argmax(logits, n); }

hr_rt_sampling hr_rt_sampling_default(void) {
    hr_sampler_params d = hr_sampler_default_params();
    return (hr_rt_sampling){.temperature = d.temperature,
                            .top_k = d.top_k,
                            .top_p = d.top_p,
                            .min_p = d.min_p,
                            .repeat_penalty = d.repeat_penalty,
                            .presence_penalty = d.presence_penalty,
                            .frequency_penalty = d.frequency_penalty,
                            .penalty_last_n = d.penalty_last_n,
                            .seed = d.seed,
                            .bias_ids = d.bias_ids,
                            .bias_values = d.bias_values,
                            .n_bias = d.n_bias};
}

hr_status hr_rt_sampling_check(const hr_rt_sampling *p, hr_error *err) {
    hr_sampler_params s = hr_rt_to_sampler(p);
    return hr_sampler_params_check(&s, err);
}

hr_chat_msg hr_rt_to_chat_msg(const hr_rt_chat_msg *m) {
    return (hr_chat_msg){.role = m->role,
                         .content = m->content,
                         .tool_calls_json = m->tool_calls_json,
                         .tool_call_id = m->tool_call_id,
                         .name = m->name};
}

void hr_rt_from_seq_ledger(const hr_kv_seq_ledger *in, hr_rt_seq_ledger *out) {
    *out = (hr_rt_seq_ledger){.blocks_own = in->blocks_own,
                              .blocks_shared = in->blocks_shared,
                              .bytes_now = in->bytes_now,
                              .bytes_peak = in->bytes_peak,
                              .tokens_resident = in->tokens_resident,
                              .tokens_total = in->tokens_total,
                              .k_format = (hr_rt_kv_format)in->k_format,
                              .v_format = (hr_rt_kv_format)in->v_format,
                              .bytes_swapped = in->bytes_swapped,
                              .prefix_hit_tokens = in->prefix_hit_tokens,
                              .tokens_evicted = in->tokens_evicted,
                              .blocks_evicted = in->blocks_evicted,
                              .tokens_kept_max = in->tokens_kept_max,
                              .n_kinds = in->n_kinds,
                              .blocks_window_freed = in->blocks_window_freed};
    _Static_assert(HR_RT_KV_MAX_KINDS == HR_KV_MAX_KINDS, "the runtime's kinds are the pool's");
    for (int k = 0; k < in->n_kinds && k < HR_RT_KV_MAX_KINDS; k++)
        out->kinds[k] = (hr_rt_kv_kind){.window = in->kinds[k].window,
                                        .n_layers = in->kinds[k].n_layers,
                                        .blocks = in->kinds[k].blocks,
                                        .bytes = in->kinds[k].bytes,
                                        .latent = in->kinds[k].latent,
                                        .token_bytes = in->kinds[k].token_bytes};
}

void hr_rt_from_request_stats(const hr_request_stats *in, hr_rt_request_stats *out) {
    memset(out, 0, sizeof *out);
    out->state = (hr_rt_state)in->state;
    out->error_code = in->error_code;
    memcpy(out->error, in->error, sizeof out->error);
    _Static_assert(sizeof out->error == sizeof in->error, "the error text's room is the engine's");
    out->n_prompt = in->n_prompt;
    out->n_output = in->n_output;
    out->prefix_hit_tokens = in->prefix_hit_tokens;
    out->n_preemptions = in->n_preemptions;
    out->n_preempt_swap = in->n_preempt_swap;
    out->n_preempt_recompute = in->n_preempt_recompute;
    out->recomputed_tokens = in->recomputed_tokens;
    out->swapped_bytes = in->swapped_bytes;
    out->priority = in->priority;
    hr_rt_from_seq_ledger(&in->kv, &out->kv);
    out->t_submit = in->t_submit;
    out->t_admit = in->t_admit;
    out->t_first_token = in->t_first_token;
    out->t_finish = in->t_finish;
    out->id = in->id;
    out->n_computed = in->n_computed;
    out->swapped = in->swapped;
}

void hr_rt_from_pool_ledger(const hr_kv_pool_ledger *in, hr_rt_pool_ledger *out) {
    *out = (hr_rt_pool_ledger){.blocks_total = in->blocks_total,
                               .blocks_used = in->blocks_used,
                               .blocks_cached = in->blocks_cached,
                               .blocks_free = in->blocks_free,
                               .bytes_total = in->bytes_total,
                               .bytes_used = in->bytes_used,
                               .bytes_cached = in->bytes_cached,
                               .bytes_free = in->bytes_free,
                               .waste_slots = in->waste_slots,
                               .waste_bytes = in->waste_bytes,
                               .prefix_hit_tokens_total = in->prefix_hit_tokens_total,
                               .blocks_evicted_total = in->blocks_evicted_total,
                               .bytes_swapped = in->bytes_swapped,
                               .policy_blocks_evicted_total = in->policy_blocks_evicted_total,
                               .fetched_tokens_total = in->fetched_tokens_total,
                               .n_groups = in->n_groups,
                               .n_kinds = in->n_kinds,
                               .window_blocks_freed_total = in->window_blocks_freed_total};
    for (int k = 0; k < in->n_kinds && k < HR_RT_KV_MAX_KINDS; k++)
        out->kinds[k] = (hr_rt_kv_kind){.window = in->kinds[k].window,
                                        .n_layers = in->kinds[k].n_layers,
                                        .blocks = in->kinds[k].blocks,
                                        .bytes = in->kinds[k].bytes,
                                        .latent = in->kinds[k].latent,
                                        .token_bytes = in->kinds[k].token_bytes};
}

void hr_rt_from_engine_stats(const hr_engine_stats *in, hr_rt_engine_stats *out) {
    *out = (hr_rt_engine_stats){.steps = in->steps,
                                .batch_tokens = in->batch_tokens,
                                .prefill_tokens = in->prefill_tokens,
                                .generated_tokens = in->generated_tokens,
                                .submitted = in->submitted,
                                .refused_full = in->refused_full,
                                .refused_budget = in->refused_budget,
                                .refused_other = in->refused_other,
                                .completed = in->completed,
                                .cancelled = in->cancelled,
                                .failed = in->failed,
                                .preemptions = in->preemptions,
                                .preempt_recompute = in->preempt_recompute,
                                .preempt_swap = in->preempt_swap,
                                .recomputed_tokens = in->recomputed_tokens,
                                .swapped_bytes = in->swapped_bytes,
                                .prefix_hit_tokens = in->prefix_hit_tokens,
                                .prefix_query_tokens = in->prefix_query_tokens,
                                .n_waiting = in->n_waiting,
                                .n_running = in->n_running,
                                .peak_running = in->peak_running,
                                .predicted_output = in->predicted_output,
                                .forward_seconds = in->forward_seconds,
                                .decode_steps = in->decode_steps,
                                .decode_tokens = in->decode_tokens,
                                .decode_seconds = in->decode_seconds,
                                .swap_available = in->swap_available,
                                .headroom_blocks = in->headroom_blocks,
                                .masks = in->masks,
                                .mask_seconds = in->mask_seconds,
                                .argmax_steps = in->argmax_steps,
                                .sample_seconds = in->sample_seconds,
                                .threaded_sample_steps = in->threaded_sample_steps};
}

/* runtime.c: see runtime.h. Opening is one sequence (model, tokenizer, context check, KV budget and
 * pool, default policy, forward context, swap tier, engine), each step checking that what it builds
 * fits what came before; every failure after the model loaded says whether a parameter is at fault.
 * A request here is the engine's request plus what the front end asked for (its prompt ids after
 * chat rendering and tokenization, max_tokens after the context clamp). */
#include "runtime/runtime.h"
#include "runtime/budget.h"
#include "runtime/runtime_parts.h"
#include "runtime/vocab.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "backend/cuda/cuda.h"
#include "common/util.h"
#include "constrain/constrain.h"
#include "model/synth.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

#define HR_RT_GRAMMAR_CACHE    64           /* compiled constraints kept (least recently used dropped) */
#define HR_RT_GPU_SWAP_DEFAULT (4ull << 30) /* --preempt swap on a GPU without --swap-space */

struct hr_runtime {
    hr_runtime_params p;
    void *demo_file;       /* the in-memory demo GGUF (borrowed by the model's reader) */
    hr_model *owned;       /* the model when the runtime loaded it (NULL when borrowed) */
    const hr_model *model; /* NULL on a shape alone (p.shape) */
    hr_hparams shape_hp;   /* p.shape as the layers below read a shape */
    char *layer_kinds;     /* hr_runtime_info.layer_kinds: a letter a layer */
    hr_tokenizer *tok;
    hr_kv_pool *kv;
    hr_kv_swap *swap;
    hr_model_ctx *ctx;
    hr_cuda_device *cuda;   /* --device cuda[:N]: the GPU, shared by the KV storage and the backend */
    hr_cuda_arena_plan gpu; /* its arena as planned at open (open_gpu_arena) */
    hr_engine *engine;
    hr_grammar_cache *grammars; /* compiled constraints by content (any thread: locked inside) */
    FILE *step_log;             /* p.step_log opened: a JSON line per computed step */
    int n_ctx;
    hr_kv_budget budget;
    hr_chat *chat; /* the model's own template (interpreted), or a family renderer */
    bool has_policy;
    hr_kv_policy policy;
    char model_name[128];
    char warning[1024];
    char chat_warning[1024]; /* the model's chat template was not recognized or refused: what is used instead */
};

/* The engine's step observer with --step-log: one JSON object a line, in seconds (t: hr_time_now). */
static void log_step(void *user, const hr_engine_step_info *s) {
    fprintf((FILE *)user,
            "{\"t\":%.6f,\"step_s\":%.6f,\"forward_s\":%.6f,\"tokens\":%d,\"prefill\":%d,\"rows\":%d,"
            "\"seqs\":%d,\"visible_keys\":%.0f}\n",
            s->t_begin, s->step_s, s->forward_s, s->n_tokens, s->n_prefill, s->n_rows, s->n_seqs, s->visible_keys);
}

struct hr_rt_request {
    hr_request *h;
    int32_t *prompt;
    int n_prompt, max_tokens;
    bool ctx_limited;
    int block_size;
    uint64_t block_bytes;
};

/* ---- the KV budget ----------------------------------------------------------------------------- */
/* Every part is the figure of the module that allocates it, computed by the function that sizes its
 * allocation (test_mem_account holds each against what the module allocates): this section only adds
 * them up. */

uint64_t hr_mem_weight_bytes(const hr_hparams *hp, uint64_t file_bytes) {
    return hr_model_resident_bytes(hp, file_bytes);
}

/* The forward pass's scratch (model/forward.c: activations, matmul rows, attention scores per thread;
 * on a GPU the host's batch rows alone, its activations being in the device arena) and the engine's
 * step buffers (engine/engine.c: batch rows, a logits row per running sequence). */
static uint64_t mem_scratch_bytes(const hr_kv_budget_query *q) {
    const hr_hparams *hp = q->mem.model;
    int T = q->mem.max_batch_tokens > 0 ? q->mem.max_batch_tokens : 512;
    int S = HR_MAX(1, q->kv.max_seqs);
    hr_kv_groups lay = {.n_groups = 1};
    if (q->mem.device) (void)hr_kv_config_groups(&q->kv, &lay, NULL); /* the GPU keeps each group's rows */
    uint64_t fwd =
        q->mem.device
            ? hr_cuda_host_scratch_bytes(hp, T, q->n_ctx, q->kv.block_size, lay.n_groups, HR_MAX(1, q->mem.n_threads))
            : hr_model_ctx_scratch_bytes(hp, T, q->n_ctx, q->kv.block_size, HR_MAX(1, q->mem.n_threads));
    return fwd + hr_engine_buffer_bytes(T, S, hp->n_vocab);
}

/* Tables that do not grow with the pool: for each sequence slot, its block table (kv/) and a request's
 * buffers (engine/request.c, its sampler's included) at n_ctx tokens; the tokenizer's tables (measured
 * when loaded, else its estimate from the vocabulary size); the model's own (model/load.c). */
static uint64_t mem_meta_fixed_bytes(const hr_kv_budget_query *q) {
    int ctx = HR_MAX(1, q->n_ctx);
    hr_request_params at_ctx = {.n_prompt = 1, .max_tokens = ctx - 1, .sampling = hr_sampler_default_params()};
    uint64_t per_seq = hr_kv_seq_table_bytes(&q->kv, ctx) + hr_request_buffer_bytes(&at_ctx, q->mem.model->n_vocab);
    uint64_t tok =
        q->mem.tokenizer_bytes ? q->mem.tokenizer_bytes : hr_tokenizer_table_bytes_for(q->mem.model->n_vocab);
    return (uint64_t)HR_MAX(1, q->kv.max_seqs) * per_seq + tok + hr_model_table_bytes(q->mem.model);
}

/* The most blocks whose bytes and the pool's tables for them (hr_kv_pool_meta_bytes, which grows by
 * steps: the prefix map doubles) fit in spare bytes. */
static uint64_t blocks_that_fit(const hr_kv_config *kc, uint64_t block_bytes, uint64_t spare) {
    uint64_t lo = 0, hi = HR_MIN(spare / block_bytes, (uint64_t)1 << 30);
    while (lo < hi) { /* the tables grow with the count: the largest count that fits, by bisection */
        uint64_t mid = lo + (hi - lo + 1) / 2;
        if (mid * block_bytes + hr_kv_pool_meta_bytes(kc, (int)mid) <= spare)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

hr_status hr_kv_budget_compute(const hr_kv_budget_query *q, hr_kv_budget *out, hr_error *err) {
    memset(out, 0, sizeof *out);
    hr_kv_config kc = q->kv;
    uint64_t block_bytes = hr_kv_block_bytes(&kc);
    if (block_bytes == 0) {
        hr_error why = {.msg = "the KV pool refuses this configuration"};
        hr_kv_config_check(&kc, &why); /* the pool's own check says why */
        char fmt[32];
        if (kc.k_format == kc.v_format)
            snprintf(fmt, sizeof fmt, "%s", hr_kv_format_name(kc.k_format));
        else
            snprintf(fmt, sizeof fmt, "%s/%s", hr_kv_format_name(kc.k_format), hr_kv_format_name(kc.v_format));
        return hr_error_set_params(err, HR_ERR_INVALID_ARG, HR_PARAM_KV_FORMAT, HR_PARAM_BLOCK_SIZE, fmt,
                                   "KV format %s with block size %d cannot be used on this model (head_dim %d, %d KV "
                                   "heads): %s",
                                   fmt, kc.block_size, kc.head_dim, kc.n_kv_heads, why.msg);
    }
    int n_seqs = HR_MAX(1, q->n_seqs);
    uint64_t fixed = hr_kv_fixed_bytes(&kc);
    /* a hybrid pool's window groups hold at most their window of a sequence (kv.h's layer groups) */
    int ctx_blocks = (int)HR_MIN(hr_kv_seq_blocks_at(&kc, q->n_ctx), INT32_MAX);
    hr_kv_groups lay;
    hr_kv_config_groups(&kc, &lay, NULL);
    out->block_bytes = block_bytes;
    out->fixed_bytes = fixed;
    out->token_bytes = block_bytes * (uint64_t)lay.n_groups / (uint64_t)kc.block_size; /* every layer */
    out->ctx_blocks = ctx_blocks;
    const hr_mem_query *m = &q->mem;
    bool whole = m->model != NULL;
    uint64_t other = 0; /* the process without the pool's blocks and their tables */
    if (whole) {
        out->weight_bytes = m->weight_bytes;
        out->scratch_bytes = mem_scratch_bytes(q);
        out->base_bytes = m->base_bytes ? m->base_bytes : HR_MEM_BASE_BYTES;
        out->meta_bytes = mem_meta_fixed_bytes(q);
        out->request_bytes = m->request_bytes;
        other = out->weight_bytes + out->scratch_bytes + out->base_bytes + out->meta_bytes + out->request_bytes;
    }
    bool from_limit = whole && m->mem_limit > 0 && !kc.budget_bytes;
    if (kc.budget_bytes) {
        out->budget_bytes = kc.budget_bytes;
    } else if (from_limit) { /* every block costs its bytes and its rows in the pool's tables */
        uint64_t usable = m->mem_limit > m->unplanned_bytes ? m->mem_limit - m->unplanned_bytes : 0;
        uint64_t spare = usable > other + fixed ? usable - other - fixed : 0;
        out->budget_bytes = fixed + blocks_that_fit(&kc, block_bytes, spare) * block_bytes;
    } else {
        out->budget_bytes = fixed + (uint64_t)ctx_blocks * block_bytes * (uint64_t)n_seqs;
    }
    uint64_t nb = out->budget_bytes > fixed ? (out->budget_bytes - fixed) / block_bytes : 0;
    if (nb > (1u << 30)) nb = 1u << 30;
    out->n_blocks = (int)nb;
    out->n_tokens = (int64_t)nb * kc.block_size;
    out->n_seqs_at_ctx = ctx_blocks > 0 ? (int)(nb / (uint64_t)ctx_blocks) : 0;
    if (whole) {
        out->meta_bytes += hr_kv_pool_meta_bytes(&kc, (int)nb);
        out->total_bytes = out->weight_bytes + out->budget_bytes + out->scratch_bytes + out->meta_bytes +
                           out->base_bytes + out->request_bytes;
    }
    /* a budget that cannot hold even one n_ctx sequence is an error that says what fits (each request
     * is also checked against the pool when submitted) */
    if (nb < (uint64_t)ctx_blocks) {
        char b1[32], b2[32], b3[32];
        uint64_t one = fixed + (uint64_t)ctx_blocks * block_bytes;
        if (from_limit) {
            char b4[32], b5[32];
            hr_format_size(m->mem_limit, b1, sizeof b1);
            hr_format_size(out->weight_bytes, b2, sizeof b2);
            hr_format_size(other, b3, sizeof b3);
            uint64_t need = other + one + hr_kv_pool_meta_bytes(&kc, ctx_blocks);     /* and the margin on top */
            if (m->unplanned_bytes) need += need / (HR_MEM_LIMIT_MARGIN_DIV - 1) + 1; /* what serve leaves out */
            hr_format_size(need, b4, sizeof b4);
            hr_format_size(out->budget_bytes, b5, sizeof b5);
            if (nb == 0)
                return hr_error_set_param(err, HR_ERR_BUDGET, HR_PARAM_MEM_LIMIT, b1,
                                          "the memory limit %s leaves nothing for the KV cache: the weights (%s), "
                                          "scratch and the rest already take %s; one sequence of context %d at %s/%s "
                                          "needs a memory limit of %s",
                                          b1, b2, b3, q->n_ctx, hr_kv_format_name(kc.k_format),
                                          hr_kv_format_name(kc.v_format), b4);
            return hr_error_set_params(err, HR_ERR_BUDGET, HR_PARAM_MEM_LIMIT, HR_PARAM_CONTEXT, b1,
                                       "the memory limit %s leaves %s for the KV cache after the weights (%s) and the "
                                       "rest (%s in all); it holds %llu tokens at %s/%s but the context is %d: raise "
                                       "the memory limit to %s, or lower the context length to %llu (the longest that "
                                       "fits)",
                                       b1, b5, b2, b3, (unsigned long long)out->n_tokens,
                                       hr_kv_format_name(kc.k_format), hr_kv_format_name(kc.v_format), q->n_ctx, b4,
                                       (unsigned long long)out->n_tokens);
        }
        hr_format_size(out->budget_bytes, b1, sizeof b1);
        return hr_error_set_params(
            err, HR_ERR_BUDGET, HR_PARAM_KV_BUDGET, HR_PARAM_CONTEXT, b1,
            "the KV budget %s holds %llu tokens at %s/%s; the context is %d: raise the KV budget to %s "
            "or lower the context length (to %llu at most)",
            b1, (unsigned long long)out->n_tokens, hr_kv_format_name(kc.k_format), hr_kv_format_name(kc.v_format),
            q->n_ctx, hr_format_size(one, b2, sizeof b2), (unsigned long long)out->n_tokens);
    }
    if (whole && m->mem_limit > 0 && out->total_bytes > m->mem_limit) {
        char b1[32], b2[32];
        hr_format_size(kc.budget_bytes, b2, sizeof b2);
        hr_error_set_params(err, HR_ERR_BUDGET, HR_PARAM_KV_BUDGET, HR_PARAM_MEM_LIMIT, b2,
                            "the plan totals %s (weights, KV budget, scratch and the rest), over the memory limit %s: "
                            "lower the KV budget or leave it unset to size the pool from the limit",
                            hr_format_size(out->total_bytes, b1, sizeof b1),
                            hr_format_size(m->mem_limit, b2, sizeof b2));
        return HR_ERR_BUDGET;
    }
    return HR_OK;
}

/* ---- opening ----------------------------------------------------------------------------------- */

hr_runtime_params hr_runtime_default_params(void) {
    hr_runtime_params p = {0};
    p.k_format = p.v_format = HR_RT_KV_F16;
    p.block_size = 16;
    p.max_batch_tokens = 512;
    p.max_running = 64;
    p.admission = HR_RT_ADMIT_ADAPTIVE;
    p.preempt = HR_RT_PREEMPT_AUTO;
    p.layout = HR_RT_LAYOUT_PAGED;
    return p;
}

__attribute__((format(printf, 2, 3))) static void add_warning(hr_runtime *rt, const char *fmt, ...) {
    size_t n = strlen(rt->warning);
    if (n && n + 1 < sizeof rt->warning) rt->warning[n++] = '\n';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rt->warning + n, sizeof rt->warning - n, fmt, ap);
    va_end(ap);
}

/* p.synth: a shape of `headroom synth`'s, its layers cut or grown, its matrices in a GGUF type. */
static hr_status load_synth(hr_runtime *rt, hr_error *err) {
    const hr_rt_synth *y = rt->p.synth;
    hr_synth_shape shape;
    hr_status st = hr_synth_shape_by_name(y->shape ? y->shape : "tiny", &shape, err);
    if (st) return st;
    if (y->n_layer > 0) shape.n_layer = y->n_layer;
    int type = y->weight_type ? -1 : (int)HR_DTYPE_F32;
    for (uint32_t id = 0; type < 0 && id < 64; id++)
        if (!strcasecmp(hr_gguf_tensor_type_name(id), y->weight_type)) type = (int)id;
    if (type < 0) return hr_error_set(err, HR_ERR_INVALID_ARG, "unknown weight type '%s'", y->weight_type);
    return hr_synth_model(&shape, (hr_dtype)type, y->seed, &rt->owned, &rt->demo_file, err);
}

static hr_status load_demo(hr_runtime *rt, hr_error *err) {
    hr_synth_shape shape;
    hr_status st = hr_synth_shape_by_name("tiny", &shape, err);
    if (st) return st;
    return hr_synth_model(&shape, HR_DTYPE_F32, 42, &rt->owned, &rt->demo_file, err);
}

/* --ctx against the trained context: past it RoPE sees positions it was never trained on
 * (docs/POLICIES.md, "Positions, RoPE and running past the trained context"). */
static hr_status check_ctx(hr_runtime *rt, const hr_hparams *hp, hr_error *err) {
    int train = hp->n_ctx_train;
    if (train <= 0 || rt->n_ctx <= train) return HR_OK;
    if (!rt->p.ctx_extend) {
        char v[32];
        snprintf(v, sizeof v, "%d", rt->n_ctx);
        return hr_error_set_params(err, HR_ERR_RANGE, HR_PARAM_CONTEXT, HR_PARAM_CONTEXT_EXTEND, v,
                                   "the context length %d exceeds the model's trained context (%d): positions past %d "
                                   "are out of distribution for RoPE and quality degrades; allow context extension "
                                   "to run there anyway, or keep the context length <= %d and use a window KV policy "
                                   "(window:W) to run past the context",
                                   rt->n_ctx, train, train, train);
    }
    add_warning(rt,
                "--ctx %d exceeds the model's trained context (%d) (--ctx-extend): positions past %d are out of "
                "distribution for RoPE; expect quality to degrade there",
                rt->n_ctx, train, train);
    return HR_OK;
}

/* The model's shape, or the one given without a model. */
static const hr_hparams *rt_hparams(const hr_runtime *rt) {
    return rt->model ? hr_model_hparams(rt->model) : &rt->shape_hp;
}

/* the engine's logits rows in the GPU's page-locked host memory (hr_engine_params.rows_alloc) */
static void *pinned_rows_alloc(void *dev, size_t bytes) {
    hr_error e = {0};
    return hr_cuda_host_alloc(dev, bytes, &e);
}
static void pinned_rows_free(void *dev, void *p) { hr_cuda_host_free(dev, p); }

/* The engine's forward step on a shape alone: the default path wants a model (its vocabulary's size),
 * so the runtime hands the engine the forward context's dispatch itself. */
static hr_status shape_forward(void *user, const hr_batch *b, float *logits, hr_error *err) {
    return hr_model_forward(user, b, logits, err);
}

/* p.shape as an hr_hparams (a llama-like shape: nothing reads more of it without weights). */
static hr_status open_shape(hr_runtime *rt, hr_error *err) {
    const hr_rt_shape *s = rt->p.shape;
    if (!rt->p.backend)
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "a runtime on a shape alone needs a backend that needs no weights");
    if (s->n_vocab <= 0 || s->n_layer <= 0 || s->n_head_kv <= 0 || s->head_dim <= 0 || s->n_head < s->n_head_kv ||
        s->n_ctx_train < 0 || s->sliding_window < 0 || s->swa_window < 0 || s->n_window_layers < 0 ||
        s->n_window_layers > s->n_layer)
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "shape: vocabulary %d, layers %d, heads %d, KV heads %d, head_dim %d (each must be "
                            "positive, heads >= KV heads)",
                            s->n_vocab, s->n_layer, s->n_head, s->n_head_kv, s->head_dim);
    if (s->kv_lora_rank < 0 || (s->kv_lora_rank > 0 && (s->kv_lora_rank >= s->head_dim || s->n_head_kv != 1)))
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "shape: a latent cache's kv_lora_rank %d must be below head_dim %d with one KV head (%d)",
                            s->kv_lora_rank, s->head_dim, s->n_head_kv);
    hr_hparams *hp = &rt->shape_hp;
    snprintf(hp->arch_name, sizeof hp->arch_name, "shape");
    hp->n_vocab = s->n_vocab;
    hp->n_ctx_train = s->n_ctx_train;
    hp->n_embd = s->n_embd;
    hp->n_ff = s->n_ff;
    hp->n_head = s->n_head;
    hp->n_head_kv = s->n_head_kv;
    hp->n_layer = s->n_layer;
    hp->head_dim = s->head_dim;
    hp->n_rot = s->head_dim;
    hp->sliding_window = s->sliding_window;
    hp->n_window_layers = s->sliding_window > 0 ? s->n_layer : 0;
    if (s->sliding_window == 0 && s->swa_window > 0 && s->n_window_layers > 0) { /* a hybrid shape */
        hp->n_window_layers = s->n_window_layers;
        hp->swa_window = s->swa_window;
    }
    hp->kv_lora_rank = s->kv_lora_rank; /* open_kv: a latent pool (v_from_k) */
    hp->attn_sinks = s->attn_sinks;
    hp->n_ctx_orig = s->n_ctx_train;
    return HR_OK;
}

/* rt->layer_kinds from the model's layers, or a shape's counts (its first n_window_layers windowed), with
 * the pool's rule (kv/pool.c): a latent cache's layers are 'L' where they have no window. */
static hr_status set_layer_kinds(hr_runtime *rt, hr_error *err) {
    const hr_hparams *hp = rt_hparams(rt);
    const hr_layer_attn *la = rt->model ? hr_model_layer_attn(rt->model) : NULL;
    if (!(rt->layer_kinds = malloc((size_t)hp->n_layer + 1)))
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory for %d layer kinds", hp->n_layer);
    for (int l = 0; l < hp->n_layer; l++) {
        bool window = la ? la[l].window > 0 : hp->sliding_window > 0 || (hp->swa_window > 0 && l < hp->n_window_layers);
        rt->layer_kinds[l] = window ? 'W' : hp->kv_lora_rank > 0 ? 'L' : 'F';
    }
    rt->layer_kinds[hp->n_layer] = '\0';
    return HR_OK;
}

/* --device cuda: the one device arena, planned from the driver's report (hr_cuda_arena_plan_compute:
 * weights, scratch, then as many KV blocks as gpu_util leaves, or kv_budget's) and reserved before
 * anything is uploaded; *n_blocks is the pool's size. */
static hr_status open_gpu_arena(hr_runtime *rt, const hr_kv_config *kc, int *n_blocks, hr_error *err) {
    const hr_hparams *hp = rt_hparams(rt);
    uint64_t fr = 0, tot = 0;
    hr_status st = hr_cuda_device_mem(rt->cuda, &fr, &tot, err);
    if (st) return st;
    hr_kv_groups lay = {.n_groups = 1};
    if ((st = hr_kv_config_groups(kc, &lay, err))) return st;
    const int n_groups = lay.n_groups;
    hr_cuda_arena_query q = {.hp = hp,
                             .weight_bytes = hr_cuda_model_weight_bytes(rt->model),
                             .max_batch_tokens = rt->p.max_batch_tokens,
                             .max_ctx = rt->p.forward_max_ctx > 0 ? rt->p.forward_max_ctx : rt->n_ctx,
                             .block_size = kc->block_size,
                             .block_bytes = hr_kv_block_bytes(kc),
                             .stage_bytes = hr_kv_fixed_bytes(kc),
                             .total_bytes = tot,
                             .free_bytes = fr,
                             .util = rt->p.gpu_util,
                             .kv_budget = rt->p.kv_budget,
                             .n_blocks = rt->p.kv_blocks,
                             .n_groups = n_groups};
    if ((st = hr_cuda_arena_plan_compute(&q, &rt->gpu, err))) {
        hr_error_prefix(err, "%s", hr_cuda_device_name(rt->cuda));
        return st;
    }
    int64_t need = hr_kv_seq_blocks_at(kc, rt->n_ctx);
    if (rt->p.kv_blocks <= 0 && rt->gpu.n_blocks < need)
        return hr_error_set(err, HR_ERR_BUDGET,
                            "%s: the GPU budget (--gpu-util %.2f: %.2f GiB) leaves %d KV blocks (%lld tokens) after "
                            "the weights and scratch; one --ctx %d sequence needs %lld: lower --ctx or raise "
                            "--gpu-util",
                            hr_cuda_device_name(rt->cuda), rt->gpu.util, (double)rt->gpu.budget_bytes / (1u << 30),
                            rt->gpu.n_blocks, (long long)rt->gpu.n_blocks * kc->block_size, rt->n_ctx, (long long)need);
    *n_blocks = rt->gpu.n_blocks;
    return hr_cuda_arena_reserve(rt->cuda, rt->gpu.arena_bytes, err);
}

bool hr_runtime_device_mem(const hr_runtime *rt, hr_rt_device_mem *out) {
    memset(out, 0, sizeof *out);
    if (!rt->cuda) return false;
    snprintf(out->name, sizeof out->name, "%s", hr_cuda_device_name(rt->cuda));
    const hr_cuda_arena_plan *g = &rt->gpu;
    out->total_bytes = g->total_bytes;
    out->free_bytes = g->free_bytes;
    out->util = g->util;
    out->budget_bytes = g->budget_bytes;
    out->arena_bytes = g->arena_bytes;
    out->weight_bytes = g->weight_bytes;
    out->scratch_bytes = g->scratch_bytes;
    out->kv_bytes = g->kv_bytes;
    hr_cuda_arena_info(rt->cuda, NULL, &out->arena_used_bytes, &out->arena_peak_bytes);
    out->host_released = hr_cuda_backend_host_released(rt->ctx);
    return true;
}

static hr_status open_kv(hr_runtime *rt, hr_error *err) {
    const hr_hparams *hp = rt_hparams(rt);
    hr_kv_budget_query q = {
        .kv = {.n_layers = hp->n_layer,
               .n_kv_heads = hp->n_head_kv,
               .head_dim = hp->head_dim,
               .v_from_k = hp->kv_lora_rank,      /* deepseek2: a latent cache, V read from K */
               .q_per_kv = hr_model_q_per_kv(hp), /* attention's group of query heads */
               .block_size = rt->p.block_size,
               .k_format = (hr_kv_format)rt->p.k_format,
               .v_format = (hr_kv_format)rt->p.v_format,
               .max_seqs = rt->p.max_running,
               .max_step_tokens = rt->p.max_batch_tokens,
               .budget_bytes = rt->p.kv_budget,
               .prefault = rt->p.prefault,
               .isa = rt->p.isa, /* --isa reaches attention too: one dispatcher (kv_default_isa) */
               /* on the GPU the blocks live in its memory (backend/cuda/kv_storage_cuda.c) */
               .storage = rt->cuda ? hr_kv_storage_cuda_create_in : NULL,
               .storage_user = rt->cuda},
        .n_ctx = rt->n_ctx,
        .n_seqs = HR_MAX(1, HR_MIN(rt->p.kv_seqs, rt->p.max_running)),
        .mem = {.model = hp,
                .weight_bytes = !rt->model ? 0
                                : rt->cuda ? hr_cuda_host_weight_bytes(rt->model)
                                           : hr_mem_weight_bytes(hp, hr_model_file_bytes(rt->model)),
                .tokenizer_bytes = rt->tok ? hr_tokenizer_table_bytes(rt->tok) : 0,
                .max_batch_tokens = rt->p.max_batch_tokens,
                .n_threads = rt->p.n_threads > 0 ? rt->p.n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN),
                .mem_limit = rt->p.mem_limit,
                .request_bytes = rt->p.request_bytes,
                .unplanned_bytes = rt->p.mem_limit / HR_MEM_LIMIT_MARGIN_DIV,
                .device = rt->cuda != NULL}};
    /* each layer's window: a model mixing window and full layers (gemma2/3, gpt-oss) gets a hybrid pool
     * whose window groups free what they no longer see (kv.h's layer groups); borrowed until create */
    int32_t *windows = NULL;
    const hr_layer_attn *la = rt->model ? hr_model_layer_attn(rt->model) : NULL;
    bool any = false;
    for (int l = 0; la && l < hp->n_layer; l++) any |= la[l].window > 0;
    /* a hybrid shape alone (the planner's simulator): its first n_window_layers layers windowed; a shape
     * whose every layer has a window (mistral's, as hr_runtime_describe gives it): each layer's, as the
     * model's own pool has them */
    bool shape_hybrid = !la && rt->p.shape && hp->sliding_window == 0 && hp->swa_window > 0 && hp->n_window_layers > 0;
    bool shape_window = !la && rt->p.shape && hp->sliding_window > 0;
    if (any || shape_hybrid || shape_window) {
        if (!(windows = malloc((size_t)hp->n_layer * sizeof *windows)))
            return hr_error_set(err, HR_ERR_NOMEM, "out of memory for %d layer windows", hp->n_layer);
        for (int l = 0; l < hp->n_layer; l++)
            windows[l] = la             ? la[l].window
                         : shape_window ? hp->sliding_window
                                        : (l < hp->n_window_layers ? hp->swa_window : 0);
        q.kv.layer_window = windows;
    }
    hr_status st;
    int kv_blocks = rt->p.kv_blocks;
    if (rt->cuda && rt->model && (st = open_gpu_arena(rt, &q.kv, &kv_blocks, err))) {
        free(windows);
        return st;
    }
    if (kv_blocks > 0) { /* an exact block count: the shape must be usable, the size is given */
        q.kv.budget_bytes = 0;
        st = hr_kv_budget_compute(&q, &rt->budget, err);
        if (st == HR_ERR_INVALID_ARG) {
            free(windows);
            return st;
        }
        q.kv.budget_bytes = rt->budget.fixed_bytes + rt->budget.block_bytes * (uint64_t)kv_blocks;
        hr_kv_budget_compute(&q, &rt->budget, NULL); /* may hold less than a context: see runtime.h */
    } else if ((st = hr_kv_budget_compute(&q, &rt->budget, err))) {
        free(windows);
        return st;
    }
    q.kv.budget_bytes = rt->budget.budget_bytes;
    st = hr_kv_pool_create(&q.kv, &rt->kv, err);
    free(windows);
    return st;
}

/* Whether a failure after the model and tokenizer loaded is about a parameter rather than memory, a
 * file or the machine. */
static bool option_fault(hr_status st) { return st != HR_ERR_NOMEM && st != HR_ERR_IO && st != HR_ERR_INTERNAL; }

static void fill_defaults(hr_runtime_params *p) {
    if (p->block_size <= 0) p->block_size = 16;
    if (p->max_batch_tokens <= 0) p->max_batch_tokens = 512;
    if (p->max_running <= 0) p->max_running = 64;
    if (p->prefill_chunk <= 0) p->prefill_chunk = p->max_batch_tokens;
    if (p->kv_seqs <= 0) p->kv_seqs = 1;
}

static void set_model_name(hr_runtime *rt) {
    if (!rt->p.model_path) {
        snprintf(rt->model_name, sizeof rt->model_name, "%s",
                 rt->p.model   ? "model"
                 : rt->p.shape ? "shape"
                 : rt->p.synth ? (rt->p.synth->shape ? rt->p.synth->shape : "tiny")
                               : "demo");
        return;
    }
    size_t len = strlen(rt->p.model_path);
    while (len > 1 && rt->p.model_path[len - 1] == '/') len--; /* a checkpoint directory named "dir/" */
    const char *base = rt->p.model_path;
    for (size_t i = 0; i + 1 < len; i++)
        if (rt->p.model_path[i] == '/') base = rt->p.model_path + i + 1;
    size_t n = len - (size_t)(base - rt->p.model_path);
    if (n > 5 && !strcmp(base + n - 5, ".gguf")) n -= 5;
    snprintf(rt->model_name, sizeof rt->model_name, "%.*s", (int)HR_MIN(n, sizeof rt->model_name - 1), base);
}

hr_status hr_rt_device_parse(const char *text, int *ordinal, hr_error *err) {
    if (!text || !strcmp(text, "cpu")) {
        *ordinal = -1;
        return HR_OK;
    }
    if (!strcmp(text, "cuda")) {
        *ordinal = 0;
        return HR_OK;
    }
    char *end = NULL;
    long n = !strncmp(text, "cuda:", 5) && text[5] >= '0' && text[5] <= '9' ? strtol(text + 5, &end, 10) : -1;
    if (n < 0 || n > 255 || *end)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "unknown device '%s' (cpu, cuda or cuda:N)", text);
    *ordinal = (int)n;
    return HR_OK;
}

hr_status hr_runtime_open(const hr_runtime_params *params, hr_runtime **out, bool *bad_option, hr_error *err) {
    if (bad_option) *bad_option = false;
    hr_runtime *rt = calloc(1, sizeof *rt);
    if (!rt) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    rt->p = *params;
    fill_defaults(&rt->p);
    const hr_runtime_params *p = &rt->p;
    set_model_name(rt);
    bool loaded = false; /* past this point a failure is a parameter's, unless memory or I/O */
    hr_status st = HR_OK;
    /* --device cuda[:N]: the GPU is checked before the model is read, so that a machine without one
     * (or without the driver) says what is missing at once */
    hr_cuda_backend_params cuda = {.ordinal = -1};
    if ((st = hr_rt_device_parse(p->device, &cuda.ordinal, err))) {
        if (bad_option) *bad_option = true;
        hr_runtime_close(rt);
        return st;
    }
    if (cuda.ordinal >= 0) { /* opened here and kept: the KV storage and the backend share it */
        cuda.driver_lib = p->cuda_driver ? p->cuda_driver : getenv("HEADROOM_CUDA_DRIVER");
        if ((st = hr_cuda_device_open(cuda.driver_lib, cuda.ordinal, &rt->cuda, err))) goto fail;
        cuda.dev = rt->cuda;
    }
    if (p->shape) { /* no model to load: what fails from here on is a parameter's (or memory) */
        loaded = true;
        if ((st = open_shape(rt, err))) goto fail;
        goto shape_only;
    }
    if (p->model)
        rt->model = p->model;
    else if (p->synth)
        st = load_synth(rt, err);
    else if (p->model_path && p->quantize) /* a Hugging Face checkpoint directory quantized at load */
        st = hr_model_load_dir(p->model_path, p->quantize, !rt->cuda, &rt->owned, err);
    else if (p->model_path)
        /* --mmap keeps the file's pages shared: no repacking (which would copy them); so does the GPU,
         * which gives each matrix's pages back once it is uploaded (hr_cuda_host_weight_bytes) */
        st = hr_model_load_hold(p->model_path, p->mmap_weights || rt->cuda ? HR_GGUF_MMAP : HR_GGUF_RESIDENT,
                                !p->mmap_weights && !rt->cuda, /* the GPU takes the file's rows */
                                &rt->owned, err);
    else
        st = load_demo(rt, err);
    if (st) goto fail;
    if (!p->model) rt->model = rt->owned;
    if ((st = hr_tokenizer_load(hr_model_gguf(rt->model), &rt->tok, err))) goto fail;
    const hr_hparams *hp = hr_model_hparams(rt->model);
    if (hr_tokenizer_n_vocab(rt->tok) > hp->n_vocab) {
        st = hr_error_set(err, HR_ERR_FORMAT, "the vocabulary has %d tokens but the model's embedding has %d rows",
                          hr_tokenizer_n_vocab(rt->tok), hp->n_vocab);
        goto fail;
    }
    loaded = true;
    if ((st = hr_chat_create_from_gguf(hr_model_gguf(rt->model), p->chat_template, NULL, &rt->chat, rt->chat_warning,
                                       sizeof rt->chat_warning, err)))
        goto fail;
shape_only:
    rt->n_ctx = p->n_ctx ? p->n_ctx : HR_MIN(rt_hparams(rt)->n_ctx_train, 4096);
    if ((st = check_ctx(rt, rt_hparams(rt), err))) goto fail;
    if ((st = open_kv(rt, err)) || (st = set_layer_kinds(rt, err))) goto fail;
    if (p->kv_policy) {
        if ((st = hr_kv_policy_parse(p->kv_policy, &rt->policy, err)) ||
            (st = hr_kv_pool_set_default_policy(rt->kv, &rt->policy, err))) {
            hr_error_about(err, HR_PARAM_KV_POLICY, p->kv_policy); /* its messages say "KV policy" */
            goto fail;
        }
        rt->has_policy = true;
    }
    hr_model_ctx_params mp = {.n_threads = p->n_threads,
                              .max_batch_tokens = p->max_batch_tokens,
                              .max_ctx = p->forward_max_ctx > 0 ? p->forward_max_ctx : rt->n_ctx,
                              .force_isa = p->isa,
                              .backend = cuda.ordinal >= 0 ? &hr_backend_cuda : p->backend,
                              .backend_user = cuda.ordinal >= 0 ? &cuda : p->backend_user};
    if ((st = hr_model_ctx_create(rt->model, rt->kv, &mp, &rt->ctx, err))) goto fail;
    /* the swap tier: swap_space, or with swap preemption as large as the pool */
    uint64_t swap_bytes = p->swap_space;
    if (!swap_bytes && p->preempt == HR_RT_PREEMPT_SWAP) {
        swap_bytes = (uint64_t)hr_kv_pool_n_blocks(rt->kv) * hr_kv_block_bytes(hr_kv_pool_config(rt->kv)) +
                     hr_kv_stage_block_bytes(hr_kv_pool_config(rt->kv)) * (uint64_t)p->max_running;
        /* on a GPU the tier is page-locked host memory, not a file: at most vLLM's default 4 GiB of it
         * unless --swap-space says */
        if (rt->cuda && swap_bytes > HR_RT_GPU_SWAP_DEFAULT) swap_bytes = HR_RT_GPU_SWAP_DEFAULT;
    }
    if (swap_bytes && p->preempt != HR_RT_PREEMPT_RECOMPUTE) {
        hr_kv_swap_config sc = {.path = NULL, .budget_bytes = swap_bytes};
        if ((st = hr_kv_swap_create(rt->kv, &sc, &rt->swap, err))) {
            hr_error_prefix(err, "swap space");
            hr_error_about(err, HR_PARAM_SWAP_SPACE, NULL);
            goto fail;
        }
    }
    if (p->step_log && !(rt->step_log = fopen(p->step_log, "w"))) {
        st = hr_error_set_param(err, HR_ERR_IO, HR_PARAM_STEP_LOG, p->step_log, "cannot write the step log '%s'",
                                p->step_log);
        goto fail;
    }
    if (rt->step_log) setvbuf(rt->step_log, NULL, _IOLBF, 0); /* whole lines as they happen: tail -f works */
    hr_engine_params ep = {.model = rt->model,
                           .ctx = rt->ctx,
                           .kv = rt->kv,
                           .swap = rt->swap,
                           .tok = p->raw_ids ? NULL : rt->tok,
                           .n_ctx = rt->n_ctx,
                           .max_batch_tokens = p->max_batch_tokens,
                           .max_running = p->max_running,
                           .max_queue = p->max_queue,
                           .prefill_chunk = p->prefill_chunk,
                           .admission = (hr_admission)p->admission,
                           .preempt = (hr_preempt_mode)p->preempt,
                           .layout = (hr_kv_layout)p->layout,
                           .on_step = rt->step_log ? log_step : NULL,
                           .on_step_user = rt->step_log};
    /* HEADROOM_CUDA_PINNED_LOGITS=1: the engine's logits rows in page-locked memory, so the forward pass's
     * download of them is one DMA (off until a GPU measures it: gpu_bench's "logits to host" rows) */
    const char *pin = getenv("HEADROOM_CUDA_PINNED_LOGITS");
    if (rt->cuda && rt->model && pin && *pin && strcmp(pin, "0") != 0) {
        ep.rows_alloc = pinned_rows_alloc;
        ep.rows_free = pinned_rows_free;
        ep.rows_user = rt->cuda;
    }
    if (!rt->model) { /* a shape alone */
        ep.forward = shape_forward;
        ep.forward_user = rt->ctx;
        ep.n_vocab = rt->shape_hp.n_vocab;
    }
    if ((st = hr_engine_create(&ep, &rt->engine, err))) goto fail;
    if ((st = hr_grammar_cache_create(HR_RT_GRAMMAR_CACHE, &rt->grammars, err))) goto fail;
    *out = rt;
    return HR_OK;
fail:
    if (bad_option) *bad_option = loaded && option_fault(st);
    hr_runtime_close(rt);
    return st;
}

void hr_runtime_close(hr_runtime *rt) {
    if (!rt) return;
    hr_engine_destroy(rt->engine); /* stops the thread; frees every sequence, swapped ones too */
    hr_grammar_cache_destroy(rt->grammars);
    if (rt->step_log) fclose(rt->step_log);
    hr_kv_swap_destroy(rt->swap);
    hr_model_ctx_destroy(rt->ctx);
    hr_kv_pool_destroy(rt->kv);
    hr_cuda_device_close(rt->cuda); /* after the pool and the context: their device memory is freed */
    hr_tokenizer_destroy(rt->tok);
    hr_chat_destroy(rt->chat);
    hr_model_destroy(rt->owned);
    free(rt->demo_file);
    free(rt->layer_kinds);
    free(rt);
}

const hr_runtime_params *hr_runtime_get_params(const hr_runtime *rt) { return &rt->p; }
const hr_model *hr_runtime_model(const hr_runtime *rt) { return rt->model; }
const hr_tokenizer *hr_runtime_tokenizer(const hr_runtime *rt) { return rt->tok; }
hr_kv_pool *hr_runtime_kv(hr_runtime *rt) { return rt->kv; }
hr_kv_swap *hr_runtime_swap(hr_runtime *rt) { return rt->swap; }
hr_model_ctx *hr_runtime_ctx(hr_runtime *rt) { return rt->ctx; }
hr_engine *hr_runtime_engine(hr_runtime *rt) { return rt->engine; }
int hr_runtime_n_ctx(const hr_runtime *rt) { return rt->n_ctx; }
bool hr_runtime_is_demo(const hr_runtime *rt) {
    return rt->p.model_path == NULL && rt->p.model == NULL && rt->p.shape == NULL && rt->p.synth == NULL;
}
const char *hr_runtime_model_name(const hr_runtime *rt) { return rt->model_name; }
const char *hr_runtime_warnings(const hr_runtime *rt) { return rt->warning; }
const hr_kv_budget *hr_runtime_budget(const hr_runtime *rt) { return &rt->budget; }
const char *hr_runtime_chat_warning(const hr_runtime *rt) { return rt->chat_warning; }
const char *hr_runtime_chat_fallback_note(const hr_runtime *rt) {
    return rt->chat ? hr_chat_fallback_note(rt->chat) : "";
}
const char *hr_runtime_chat_family(const hr_runtime *rt) {
    return rt->chat ? hr_chat_template_name(hr_chat_family(rt->chat)) : "none";
}
bool hr_runtime_chat_native(const hr_runtime *rt) {
    return rt->chat && !strcmp(hr_chat_describe(rt->chat), "the model's chat template");
}

hr_status hr_runtime_open_sibling(const hr_runtime *base, const hr_runtime_params *p, hr_runtime **out,
                                  bool *bad_option, hr_error *err) {
    hr_runtime_params q = *p;
    q.model = base->model;
    q.model_path = base->p.model_path;            /* names it only */
    q.shape = base->model ? NULL : base->p.shape; /* a shape alone: the same shape */
    return hr_runtime_open(&q, out, bad_option, err);
}

void hr_runtime_describe(const hr_runtime *rt, hr_runtime_info *out) {
    const hr_hparams *hp = rt_hparams(rt);
    *out = (hr_runtime_info){.model = hp->name,
                             .arch = hp->arch_name,
                             .n_ctx_train = hp->n_ctx_train,
                             .n_vocab = hp->n_vocab,
                             .isa = hr_model_ctx_isa(rt->ctx),
                             .n_threads = hr_model_ctx_n_threads(rt->ctx),
                             .shape = {.n_vocab = hp->n_vocab,
                                       .n_ctx_train = hp->n_ctx_train,
                                       .n_embd = hp->n_embd,
                                       .n_ff = hp->n_ff,
                                       .n_head = hp->n_head,
                                       .n_head_kv = hp->n_head_kv,
                                       .n_layer = hp->n_layer,
                                       .head_dim = hp->head_dim,
                                       .sliding_window = hp->sliding_window,
                                       .swa_window = hp->swa_window,
                                       .n_window_layers = hp->n_window_layers,
                                       .kv_lora_rank = hp->kv_lora_rank,
                                       .attn_sinks = hp->attn_sinks},
                             .weight_bytes = rt->model ? hr_model_weight_bytes(rt->model) : 0,
                             .layer_kinds = rt->layer_kinds};
}

hr_status hr_runtime_step(hr_runtime *rt, int *n_unfinished, hr_error *err) {
    return hr_engine_step(rt->engine, n_unfinished, err);
}

hr_status hr_runtime_start(hr_runtime *rt, hr_error *err) { return hr_engine_start(rt->engine, err); }
void hr_runtime_stop(hr_runtime *rt) { hr_engine_stop(rt->engine); }
hr_status hr_runtime_run_until_idle(hr_runtime *rt, hr_error *err) { return hr_engine_run_until_idle(rt->engine, err); }

/* ---- requests ---------------------------------------------------------------------------------- */

/* Renders chat messages with the runtime's template and tokenizes them (hr_chat_tokenize: the
 * template's own text with special tokens parsed, the contents as text unless special_in_content; the
 * template writes BOS text itself, so none is added). */
static hr_status chat_ids(hr_runtime *rt, const hr_rt_chat_msg *rt_msgs, size_t n, const char *tools_json,
                          int32_t **ids, size_t *n_ids, hr_error *err) {
    hr_chat_msg *msgs = malloc(sizeof *msgs * n);
    if (!msgs) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) msgs[i] = hr_rt_to_chat_msg(&rt_msgs[i]);
    int32_t bos = hr_tokenizer_bos(rt->tok), eos = hr_tokenizer_eos(rt->tok);
    hr_chat_render_params cp = {.msgs = msgs,
                                .n_msgs = n,
                                .add_generation_prompt = true,
                                .bos = bos >= 0 ? hr_tokenizer_piece(rt->tok, bos) : NULL,
                                .eos = eos >= 0 ? hr_tokenizer_piece(rt->tok, eos) : NULL,
                                .tools_json = tools_json};
    hr_status st = hr_chat_tokenize(rt->chat, rt->tok, &cp, rt->p.special_in_content, ids, n_ids, err);
    free(msgs);
    return st;
}

/* The prompt's ids into r (tokenized text, rendered chat, or the ids as given). */
static hr_status prompt_ids(hr_runtime *rt, const hr_rt_request_params *p, hr_rt_request *r, hr_error *err) {
    int forms = (p->prompt != NULL) + (p->messages != NULL) + (p->prompt_ids != NULL);
    if (forms != 1)
        return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_PROMPT, NULL,
                                  "a request needs exactly one of a prompt, chat messages or token ids (got %d)",
                                  forms);
    if (p->prompt_ids) {
        if (p->n_prompt_ids < 1)
            return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_PROMPT, NULL,
                                      "the prompt is empty (at least one token is needed)");
        r->prompt = malloc(sizeof(int32_t) * (size_t)p->n_prompt_ids);
        if (!r->prompt) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
        memcpy(r->prompt, p->prompt_ids, sizeof(int32_t) * (size_t)p->n_prompt_ids);
        r->n_prompt = p->n_prompt_ids;
        return HR_OK;
    }
    if (!rt->tok)
        return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_PROMPT, NULL,
                                  "a runtime on a shape alone takes prompts as token ids only");
    int32_t *ids = NULL;
    size_t n = 0;
    hr_status st;
    if (p->messages) {
        if (p->n_messages == 0)
            return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_PROMPT, NULL, "the chat has no messages");
        st = chat_ids(rt, p->messages, p->n_messages, p->tools_json, &ids, &n, err);
    } else {
        /* a raw prompt's special-token text stays text too (see hr_rt_request_params.prompt_ids) */
        hr_tokenize_opts to = {.add_bos = !p->no_bos && hr_tokenizer_add_bos_default(rt->tok),
                               .parse_special = rt->p.special_in_content};
        size_t len = p->prompt_len ? p->prompt_len : strlen(p->prompt);
        if (len == 0) return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_PROMPT, NULL, "the prompt is empty");
        st = hr_tokenizer_encode_alloc(rt->tok, p->prompt, len, &to, &ids, &n, err);
    }
    if (st) return st;
    r->prompt = ids;
    r->n_prompt = (int)n;
    if (r->n_prompt == 0)
        return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_PROMPT, NULL,
                                  "the prompt is empty after tokenization");
    return HR_OK;
}

hr_status hr_runtime_submit_n(hr_runtime *rt, const hr_rt_request_params *p, int n, hr_rt_request **out,
                              hr_error *err) {
    if (n < 1 || n > HR_RT_MAX_CHOICES)
        return hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_CHOICES, NULL, "%d choices: 1..%d", n,
                                  HR_RT_MAX_CHOICES);
    hr_rt_request *r = calloc(1, sizeof *r);
    if (!r) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    r->block_size = rt->p.block_size;
    r->block_bytes = rt->budget.block_bytes;
    hr_status st = prompt_ids(rt, p, r, err);
    hr_kv_policy pol = rt->policy;
    bool has_pol = rt->has_policy;
    if (st == HR_OK && p->kv_policy) {
        if ((st = hr_kv_policy_parse(p->kv_policy, &pol, err)) == HR_OK)
            has_pol = true;
        else {
            hr_error_about(err, HR_PARAM_KV_POLICY, p->kv_policy); /* its messages say "KV policy" */
        }
    }
    /* a window or sinks policy lets a sequence run past the context; otherwise it ends there */
    int span = has_pol ? hr_kv_policy_span(&pol) : 0;
    if (st == HR_OK && span == 0 && r->n_prompt >= rt->n_ctx)
        st = hr_error_set_params(err, HR_ERR_RANGE, HR_PARAM_PROMPT, HR_PARAM_CONTEXT, NULL,
                                 "the prompt has %d tokens but the context holds %d (at least one more for the output)",
                                 r->n_prompt, rt->n_ctx);
    if (st == HR_OK) {
        /* a window runs past the context, up to HR_RT_WINDOW_CTX_MULT of them: its buffers are per token */
        int room = span > 0 ? (int)HR_MIN((int64_t)rt->n_ctx * HR_RT_WINDOW_CTX_MULT, INT32_MAX) - r->n_prompt
                            : rt->n_ctx - r->n_prompt;
        int want = p->max_tokens > 0 ? p->max_tokens : room;
        if (span > 0 && p->max_tokens <= 0)
            st = hr_error_set_params(err, HR_ERR_INVALID_ARG, HR_PARAM_MAX_TOKENS, HR_PARAM_KV_POLICY, NULL,
                                     "max tokens is needed with a window policy (it can run past the context)");
        r->max_tokens = HR_MIN(want, room);
        r->ctx_limited = p->max_tokens > 0 && r->max_tokens < p->max_tokens;
    }
    hr_grammar *grammar = NULL;
    if (st == HR_OK && p->constraint.kind != HR_RT_CONS_NONE) {
        const hr_rt_constraint *c = &p->constraint;
        if (!rt->tok) {
            st = hr_error_set_param(err, HR_ERR_INVALID_ARG, HR_PARAM_OUTPUT_FORMAT, NULL,
                                    "output format: constrained decoding needs the model's tokenizer");
        } else if ((st = hr_grammar_cache_get(rt->grammars, (hr_cons_kind)c->kind, c->src, c->len, &grammar, err)) !=
                   HR_OK) {
            hr_error_prefix(err, "output format");
            hr_error_about(err, HR_PARAM_OUTPUT_FORMAT, NULL);
            if (st != HR_ERR_NOMEM) st = HR_ERR_INVALID_ARG; /* a bound is the request's fault too */
            if (err) err->code = st;
        }
    }
    if (st == HR_OK) {
        hr_request_params rp = {.prompt = r->prompt,
                                .n_prompt = r->n_prompt,
                                .max_tokens = r->max_tokens,
                                .sampling = hr_rt_to_sampler(&p->sampling),
                                .priority = p->priority,
                                .ignore_eos = p->ignore_eos,
                                .stop = p->stop,
                                .n_stop = p->n_stop,
                                .kv_policy = has_pol ? &pol : NULL,
                                .logprobs = p->logprobs,
                                .top_logprobs = p->top_logprobs,
                                .cache_scope = p->cache_scope,
                                .grammar = grammar};
        hr_request *h[HR_RT_MAX_CHOICES];
        hr_rt_request *more[HR_RT_MAX_CHOICES] = {0};
        /* choices 1.. are copies of the first (own prompt ids: each is released on its own) */
        for (int i = 1; st == HR_OK && i < n; i++) {
            more[i] = malloc(sizeof *r);
            int32_t *ids = more[i] ? malloc(sizeof(int32_t) * (size_t)r->n_prompt) : NULL;
            if (!ids) {
                free(more[i]);
                more[i] = NULL;
                st = hr_error_set(err, HR_ERR_NOMEM, "out of memory");
                break;
            }
            *more[i] = *r;
            memcpy(ids, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
            more[i]->prompt = ids;
        }
        if (st == HR_OK) st = hr_engine_submit_n(rt->engine, &rp, n, h, err);
        for (int i = 1; i < n; i++) {
            if (st == HR_OK) {
                more[i]->h = h[i];
                out[i] = more[i];
            } else if (more[i]) {
                free(more[i]->prompt);
                free(more[i]);
            }
        }
        if (st == HR_OK) r->h = h[0];
    }
    hr_grammar_release(grammar); /* the request holds its own reference */
    if (st != HR_OK) {
        free(r->prompt);
        free(r);
        return st;
    }
    out[0] = r;
    return HR_OK;
}

hr_status hr_runtime_submit(hr_runtime *rt, const hr_rt_request_params *p, hr_rt_request **out, hr_error *err) {
    return hr_runtime_submit_n(rt, p, 1, out, err);
}

hr_request *hr_rt_request_handle(hr_rt_request *r) { return r->h; }
const int32_t *hr_rt_request_prompt(const hr_rt_request *r, int *n_prompt) {
    if (n_prompt) *n_prompt = r->n_prompt;
    return r->prompt;
}
int hr_rt_request_max_tokens(const hr_rt_request *r) { return r->max_tokens; }
bool hr_rt_request_ctx_limited(const hr_rt_request *r) { return r->ctx_limited; }
void hr_rt_request_cancel(hr_runtime *rt, hr_rt_request *r) { hr_engine_cancel(rt->engine, r->h); }

void hr_rt_request_read(hr_rt_request *r, int32_t *tokens, int tokens_cap, char *text, size_t text_cap,
                        hr_rt_delta *d) {
    hr_request_delta rd;
    hr_request_read(r->h, tokens, tokens_cap, text, text_cap, &rd);
    *d = (hr_rt_delta){.n_tokens = rd.n_tokens, .n_text = rd.n_text, .done = rd.done};
}
bool hr_rt_request_wait(hr_rt_request *r, double timeout_s) { return hr_request_wait(r->h, timeout_s); }
int hr_rt_request_logprobs(hr_rt_request *r, int from, int n, float *lp, int32_t *top_ids, float *top_lp) {
    return hr_request_logprobs(r->h, from, n, lp, top_ids, top_lp);
}
int hr_rt_request_token_gaps(hr_rt_request *r, float *gaps, int cap) { return hr_request_token_gaps(r->h, gaps, cap); }

void hr_rt_request_release(hr_runtime *rt, hr_rt_request *r) {
    if (!r) return;
    hr_request_stats s;
    hr_request_get_stats(r->h, &s);
    if (s.state != HR_REQ_COMPLETED && s.state != HR_REQ_CANCELLED && s.state != HR_REQ_FAILED)
        hr_engine_cancel(rt->engine, r->h);
    hr_request_release(r->h);
    free(r->prompt);
    free(r);
}

void hr_rt_request_result(hr_rt_request *r, hr_rt_result *out) {
    memset(out, 0, sizeof *out);
    hr_request_stats stats;
    hr_request_get_stats(r->h, &stats);
    hr_rt_from_request_stats(&stats, &out->stats);
    const hr_request_stats *s = &stats;
    out->state = (hr_rt_state)s->state;
    bool final = s->state == HR_REQ_COMPLETED || s->state == HR_REQ_CANCELLED || s->state == HR_REQ_FAILED;
    out->status = s->state == HR_REQ_COMPLETED ? HR_OK : s->error_code;
    out->error = out->stats.error;
    out->ids = hr_request_output(r->h, &out->n_ids);
    out->text = hr_request_text(r->h, &out->text_len);
    out->finish_reason = final ? hr_finish_reason_name(s->finish) : NULL;
    out->limit = s->finish == HR_FINISH_LENGTH ? (r->ctx_limited ? "context" : "max_tokens") : NULL;
    out->n_prompt = r->n_prompt;
    out->max_tokens = r->max_tokens;
    out->t_submit = s->t_submit;
    out->t_first_token = s->t_first_token;
    out->t_finish = s->t_finish;
    hr_rt_kv_usage *k = &out->kv;
    k->k_format = (hr_rt_kv_format)s->kv.k_format;
    k->v_format = (hr_rt_kv_format)s->kv.v_format;
    k->block_size = r->block_size;
    k->block_bytes = r->block_bytes;
    k->bytes_now = s->kv.bytes_now; /* once final: what it held at its last step, before release */
    k->bytes_peak = s->kv.bytes_peak;
    k->blocks_now = r->block_bytes ? (int)(k->bytes_now / r->block_bytes) : 0;
    k->blocks_peak = r->block_bytes ? (int)(k->bytes_peak / r->block_bytes) : 0;
    k->prefix_hit_tokens = s->prefix_hit_tokens;
    k->evicted_tokens = s->kv.tokens_evicted;
    k->preemptions = s->n_preemptions;
    k->preempt_swaps = s->n_preempt_swap;
    k->preempt_recomputes = s->n_preempt_recompute;
    k->swapped_bytes = s->swapped_bytes;
    k->queued_seconds = s->t_admit > 0 ? s->t_admit - s->t_submit : 0;
    k->first_token_seconds = s->t_first_token > 0 ? s->t_first_token - s->t_submit : 0;
    k->policy = hr_kv_policy_kind_name(s->kv.policy.kind);
    k->grouped = hr_request_group_kv(r->h, &k->group_blocks_peak, &k->group_blocks_final);
    k->n_kinds = s->kv.n_kinds;
    memcpy(k->kinds, s->kv.kinds, sizeof k->kinds);
    k->window_blocks_freed = s->kv.blocks_window_freed;
}

/* ---- the whole picture ------------------------------------------------------------------------- */

void hr_runtime_get_pool(hr_runtime *rt, hr_runtime_pool *out) {
    memset(out, 0, sizeof *out);
    hr_kv_pool_ledger l;
    hr_engine_stats e;
    hr_kv_pool_get_ledger(rt->kv, &l);
    hr_engine_get_stats(rt->engine, &e);
    hr_rt_from_pool_ledger(&l, &out->ledger);
    hr_rt_from_engine_stats(&e, &out->engine);
    out->budget_bytes = rt->budget.budget_bytes;
    out->headroom_bytes = (int64_t)out->engine.headroom_blocks * (int64_t)rt->budget.block_bytes;
}

void hr_mem_rss(uint64_t *rss_bytes, uint64_t *peak_bytes) {
    *rss_bytes = *peak_bytes = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "VmRSS:", 6)) *rss_bytes = strtoull(line + 6, NULL, 10) * 1024;
        if (!strncmp(line, "VmHWM:", 6)) *peak_bytes = strtoull(line + 6, NULL, 10) * 1024;
    }
    fclose(f);
}

void hr_runtime_get_memory(const hr_runtime *rt, hr_runtime_memory *out) {
    const hr_kv_budget *b = &rt->budget;
    *out = (hr_runtime_memory){.planned_bytes = b->total_bytes,
                               .weight_bytes = b->weight_bytes,
                               .kv_bytes = b->budget_bytes,
                               .scratch_bytes = b->scratch_bytes,
                               .meta_bytes = b->meta_bytes,
                               .base_bytes = b->base_bytes,
                               .request_bytes = b->request_bytes};
    if (rt->cuda) { /* the blocks live in the GPU's arena (hr_runtime_device_mem), not in this process */
        out->planned_bytes -= out->kv_bytes;
        out->kv_bytes = 0;
    }
    hr_mem_rss(&out->rss_bytes, &out->peak_rss_bytes);
}

double hr_runtime_retry_after_s(hr_runtime *rt) { return hr_engine_retry_after_s(rt->engine); }

void hr_runtime_generation_defaults(const hr_runtime *rt, const hr_rt_sampling *builtin, hr_rt_sampling *sp) {
    if (!rt->model) return;                      /* a shape alone has no checkpoint */
    const hr_gguf *g = hr_model_gguf(rt->model); /* model/hf.c keeps them as headroom.generation.* */
    double v;
#define TAKE(key, field, type)                                                                                         \
    if (sp->field == builtin->field && hr_gguf_get_float(g, "headroom.generation." key, &v, NULL) == HR_OK)            \
    sp->field = (type)v
    TAKE("temperature", temperature, float);
    TAKE("top_p", top_p, float);
    TAKE("top_k", top_k, int);
    TAKE("min_p", min_p, float);
    TAKE("repetition_penalty", repeat_penalty, float);
#undef TAKE
}

int hr_runtime_events(hr_runtime *rt, uint64_t after, hr_rt_event *out, int cap) {
    if (cap <= 0) return 0;
    hr_engine_event *ev = malloc(sizeof *ev * (size_t)HR_MIN(cap, HR_ENGINE_EVENTS));
    int n = ev ? hr_engine_events(rt->engine, after, ev, HR_MIN(cap, HR_ENGINE_EVENTS)) : 0;
    for (int i = 0; i < n; i++)
        out[i] = (hr_rt_event){.seq = ev[i].seq,
                               .t = ev[i].t,
                               .kind = hr_engine_event_kind_name(ev[i].kind),
                               .request = ev[i].request,
                               .tokens = ev[i].tokens,
                               .bytes = ev[i].bytes};
    free(ev);
    return n;
}

hr_status hr_rt_schema_to_gbnf(const char *json, size_t len, char **out, hr_error *err) {
    return hr_cons_schema_to_gbnf(json, len, out, err);
}

/* ---- scoring ----------------------------------------------------------------------------------- */

hr_status hr_rt_policy_parse(const char *policy, char *label, size_t cap, hr_error *err) {
    hr_kv_policy pol;
    hr_status st = hr_kv_policy_parse(policy, &pol, err);
    if (st == HR_OK && label) hr_kv_policy_str(&pol, label, cap);
    return st;
}

hr_status hr_runtime_check_policy(const hr_runtime *rt, const char *policy, hr_error *err) {
    hr_kv_policy pol;
    hr_status st = hr_kv_policy_parse(policy, &pol, err);
    return st ? st : hr_kv_policy_check(rt->kv, &pol, err);
}

hr_status hr_runtime_score(hr_runtime *rt, const char *policy, const int32_t *toks, int n, float *logits,
                           hr_rt_score *out, hr_error *err) {
    hr_kv_policy pol = {.kind = HR_KV_POLICY_FULL};
    hr_status st = policy ? hr_kv_policy_parse(policy, &pol, err) : HR_OK;
    if (st) return st;
    if (n < 1 || n > rt->n_ctx || n > rt->p.max_batch_tokens)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "%d tokens to score: 1..%d", n,
                            HR_MIN(rt->n_ctx, rt->p.max_batch_tokens));
    int V = rt_hparams(rt)->n_vocab;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n);
    hr_kv_seq *seqs = malloc(sizeof(hr_kv_seq) * (size_t)n);
    uint8_t *want = malloc((size_t)n);
    hr_kv_seq s;
    if (!pos || !seqs || !want) {
        st = hr_error_set(err, HR_ERR_NOMEM, "out of memory");
        goto out_free;
    }
    if ((st = hr_kv_seq_create(rt->kv, &s, err))) goto out_free;
    if ((st = hr_kv_seq_set_policy(rt->kv, s, &pol, err))) goto out;
    for (int i = 0; i < n; i++) pos[i] = i, seqs[i] = s, want[i] = 1;
    if (pol.kind == HR_KV_POLICY_FULL) {
        hr_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .seq = seqs, .want_logits = want};
        if ((st = hr_kv_seq_reserve(rt->kv, s, n, err)) || (st = hr_model_forward(rt->ctx, &b, logits, err))) goto out;
        hr_kv_seq_commit(rt->kv, s, toks, n);
    } else {
        /* the first half as a prompt, then one token per forward: the policy acts between them */
        int first = n / 2;
        hr_kv_seq_set_prompt_len(rt->kv, s, first);
        memset(want, 0, (size_t)first);
        hr_batch b = {.n_tokens = first, .tokens = toks, .pos = pos, .seq = seqs, .want_logits = want};
        if ((st = hr_kv_seq_reserve(rt->kv, s, first, err)) || (st = hr_model_forward(rt->ctx, &b, NULL, err)))
            goto out;
        hr_kv_seq_commit(rt->kv, s, toks, first);
        for (int i = first; i < n; i++) {
            hr_batch d = {.n_tokens = 1, .tokens = toks + i, .pos = pos + i, .seq = seqs, .want_logits = want + i};
            want[i] = 1;
            if ((st = hr_kv_seq_reserve(rt->kv, s, i + 1, err)) ||
                (st = hr_model_forward(rt->ctx, &d, logits + (size_t)i * V, err)))
                goto out;
            hr_kv_seq_commit(rt->kv, s, toks + i, 1);
        }
    }
    hr_kv_seq_ledger l;
    if (out && hr_kv_seq_get_ledger(rt->kv, s, &l, NULL) == HR_OK)
        *out = (hr_rt_score){.kv_bytes = l.bytes_now, .tokens_kept = l.tokens_kept_max};
out:
    hr_kv_seq_free(rt->kv, s);
out_free:
    free(pos);
    free(seqs);
    free(want);
    return st;
}

hr_status hr_runtime_time_forward(hr_runtime *rt, const int32_t *past, int n_past, const int32_t *tokens, int n,
                                  bool all, int reps, float *logits, double *seconds, hr_error *err) {
    if (n < 1 || n_past < 0 || n > rt->p.max_batch_tokens || n_past + n > rt->n_ctx || reps < 1)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "%d tokens after %d to time: 1..%d tokens, %d in all", n, n_past,
                            rt->p.max_batch_tokens, rt->n_ctx);
    int chunk = HR_MIN(128, rt->p.max_batch_tokens), cap = HR_MAX(n, chunk);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)cap);
    hr_kv_seq *seqs = malloc(sizeof(hr_kv_seq) * (size_t)cap);
    uint8_t *want = malloc((size_t)cap);
    hr_kv_seq s;
    hr_status st = HR_OK;
    if (!pos || !seqs || !want) {
        st = hr_error_set(err, HR_ERR_NOMEM, "out of memory");
        goto out_free;
    }
    if ((st = hr_kv_seq_create(rt->kv, &s, err))) goto out_free;
    if ((st = hr_kv_seq_reserve(rt->kv, s, n_past + n, err))) goto out;
    for (int done = 0; done < n_past;) { /* the cached tokens: computed, not timed */
        int k = HR_MIN(chunk, n_past - done);
        for (int i = 0; i < k; i++) pos[i] = done + i, seqs[i] = s, want[i] = 0;
        hr_batch b = {.n_tokens = k, .tokens = past + done, .pos = pos, .seq = seqs, .want_logits = want};
        if ((st = hr_model_forward(rt->ctx, &b, logits, err))) goto out;
        done += k;
    }
    for (int i = 0; i < n; i++) pos[i] = n_past + i, seqs[i] = s, want[i] = all || i == n - 1;
    hr_batch b = {.n_tokens = n, .tokens = tokens, .pos = pos, .seq = seqs, .want_logits = want};
    for (int rep = 0; rep < reps; rep++) {
        double t0 = hr_time_now();
        if ((st = hr_model_forward(rt->ctx, &b, logits, err))) goto out;
        seconds[rep] = hr_time_now() - t0;
    }
out:
    hr_kv_seq_free(rt->kv, s);
out_free:
    free(pos);
    free(seqs);
    free(want);
    return st;
}

/* backend_cuda.c: the CUDA backend's ops (backend/backend.h): the forward pass on the GPU.
 *
 * create uploads the model's weights once, as the file stores them (the runtime loads a model for the
 * GPU without the CPU's x16 repacking), the norms and the CPU backend's RoPE frequency table, and
 * takes the activations for max_batch_tokens rows and the batch's KV places from the device arena
 * (cuda_budget.c plans it). forward asks the KV manager where each token's K/V goes and which blocks
 * and positions each query sees (hr_kv_write_slot, hr_kv_seq_table, hr_kv_seq_window, and the token
 * masks of h2o/snapkv sequences: hr_kv_seq_token_mask), copies that up once, and runs the llama
 * family's layer loop on the device with nothing coming back until the logits (and, where an
 * h2o/snapkv query accumulates softmax weights, its sequence's scores, for hr_kv_seq_add_scores): embedding, RMSNorm
 * (fused with the residual add), the matrix products (gemv.cu below 16 tokens, gemm.cu's tensor cores from 16 for
 * bf16/f16/q8_0/q4_0), RoPE (with the biases and Q/K norms before it), K/V writes and attention in the CUDA KV storage
 * (kv_storage_cuda.c), SwiGLU, the output projection. Every kernel runs on the CPU in the tests through the emulating
 * driver (tests/cuda/emu_rt.c); none has run on a GPU yet (docs/GPU.md).
 *
 * Decode steps as CUDA graphs (HEADROOM_CUDA_GRAPHS=1 at create; off by default until a GPU measures
 * them): a batch of up to GRAPH_MAX_TOKENS tokens that all want logits replays the launches captured
 * the first time its key was seen (hr_cuda_graph_*), one submission instead of ~14 a layer. Every
 * kernel argument of such a step is a device address of a fixed buffer, T, a layer, or the
 * attention's split, so the key is T, whether a window is used, the attention kernel and a context
 * bucket: the split is taken for the batch's longest context rounded up to a power of two from one
 * attention tile (256), capped at max_ctx, so a sequence growing a token a step replays one graph for
 * hundreds of steps (the splits past a query's context are empty and the reduction skips them). The
 * batch's ids, positions, slots, tables, contexts, windows and logit rows are copied into those
 * buffers before the launch, as for an eager step. A capture that fails runs its step eagerly (said
 * once on stderr) and is tried once more; a key that fails twice stays eager. Never the request.
 *
 * Greedy ids on the device (HEADROOM_CUDA_ARGMAX=device at create; host, the logits copied, by default
 * until a GPU measures it): a batch that passes hr_batch.argmax gets each output row's argmax from
 * hr_k_argmax_rows, B ids downloaded instead of B x n_vocab floats (the engine asks only where every
 * row samples greedily from the logits as they are).
 *
 * The families: llama, mistral, qwen2 (Q/K/V biases), qwen3 (Q/K norms), phi3 (fused QKV and gate-up,
 * LongRoPE), gemma2 and gemma3 (window layers beside full ones: several KV layer groups, each layer at its
 * slot in its group's blocks; post norms, GeGLU, soft caps, a scaled embedding) and qwen3moe and Mixtral
 * (experts: ffn_moe); the biases and norms are applied with RoPE in one launch (hr_k_rope), which also
 * takes YaRN's and LongRoPE's magnitude and linear RoPE scaling. What it refuses, in one line beginning
 * "CUDA: ": a model the kernels do not cover yet (shared experts, MLA, sinks), q4/kivi2 KV with several
 * layer groups, and a weight type without a GEMV
 * kernel (f32, f16, bf16, q8_0, q4_0, q5_0, q5_1, q4_K, q5_K, q6_K have one). The token embedding is looked up on
 * the device for f32, f16 and q8_0 tables, and dequantized on the host for the rest. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/cuda/cuda.h"
#include "common/threadpool.h"
#include "model/model_internal.h"

/* kernels/embed.cu's table types */
enum { EMB_F32 = 0, EMB_F16 = 1, EMB_Q8_0 = 2 };

typedef struct dev_weight {
    uint64_t p; /* device address of the rows, 0: none */
    const char *gemv;
    int64_t rows, cols;
    uint64_t expert_bytes; /* a stack of experts (ffn_*_exps): one expert's bytes; 0: a matrix */
} dev_weight;

typedef struct dev_layer {
    uint64_t attn_norm, ffn_norm;
    uint64_t bias;                /* Q/K/V biases [H D | Hkv D | Hkv D] (a missing one zeros), 0: none (qwen2) */
    uint64_t q_norm, k_norm;      /* per-head RMSNorm weights (D), 0: none (qwen3) */
    uint64_t attn_post, ffn_post; /* gemma's post-attention and post-FFN RMSNorm weights (E), 0: none */
    int group, slot;              /* its KV layer group and its slot in the group's blocks */
    dev_weight wq, wk, wv, wo, wg, wu, wd;
    dev_weight router, eg, eu, ed; /* a mixture of experts' layer (qwen3moe, Mixtral): wg, wu, wd absent */
} dev_layer;

#define GRAPH_MAX_TOKENS 64  /* the largest batch replayed as a graph: decode steps, not prefill */
#define GRAPH_CTX_MIN    256 /* the smallest context bucket: one attention tile (kernels/attention.cu) */
#define GRAPH_CACHE      32  /* graphs kept per context (keys seen: batch sizes x buckets x window) */
/* captures tried per key: a second after a failure, since the eager step in between has loaded every
 * kernel of the step (a driver that loads kernels lazily may refuse the first load inside a capture) */
#define GRAPH_TRIES 2

typedef struct cuda_ctx {
    hr_backend_base base; /* first: the seam dispatches on it */
    hr_cuda_device *dev;
    bool own_dev;
    hr_threadpool *tp; /* host threads for the work around the forward pass (hr_model_ctx_run_items) */
    const hr_model *m;
    hr_kv_pool *kv;
    int max_tokens, max_ctx;
    /* weights on the device */
    dev_layer *L;
    uint64_t tok, out_norm, inv_freq, inv_freq_swa; /* _swa: window layers beside full ones (gemma), else 0 */
    int tok_type;
    dev_weight out;
    uint64_t host_released; /* host pages of uploaded weights given back (hr_model_release_host) */
    /* activations on the device, for max_tokens rows */
    uint64_t x, xb, xo, q, k, v, att, g, u, logits, ids, pos;
    uint64_t moe_probs, moe_sel, moe_w, moe_out; /* a mixture of experts' (0 without) */
    /* the batch's places in the KV cache, made on the host once per forward and copied up: each
     * token's slot (block * B + t), its table row and context; the table rows of the batch's
     * sequences ([T][max_blocks], one row per sequence); the attention's scratch */
    uint64_t slots, qrow, n_ctx, tables, attn_scratch, d_out_rows, win, runs;
    int32_t *h_slots, *h_qrow, *h_nctx, *h_tables, *h_win; /* h_win: [T][2] (sinks, lo) */
    int32_t *h_runs; /* [T][4]: the batch's runs for prefill attention (hr_cuda_attn_runs), n_runs of them */
    int n_runs;
    /* the token-level policies (h2o, snapkv) of the batch's sequences: per token its row of masks and
     * whether it accumulates (h_tlview [T][2]), the rows' masks and scores on the device (tl: up to
     * tl_cap sequences, hr_cuda_token_seqs), each row's sequence and blocks, one row's scores coming down */
    hr_kv_cuda_tokens tl;
    int32_t *h_tlview;
    hr_kv_seq *tl_seq;
    int *tl_blocks;
    bool *tl_acc;
    uint64_t *h_tlscore;
    int tl_cap, n_tl;
    bool argmax;    /* forward fills hr_batch.argmax on the device (HEADROOM_CUDA_ARGMAX=device) */
    bool any_win;   /* a token of this batch sees a window (win passed to attention), else all */
    bool staged;    /* the KV formats have stages (q4, kivi2): slots carries each token's stage and fill */
    int max_blocks; /* table row stride: blocks of max_ctx */
    /* the KV layer groups (gemma's window layers beside full ones): slots, tables and windows are a set a
     * group, group g's at g x the stride (host and device alike), read through its first layer */
    int n_groups, group_layer[HR_KV_MAX_GROUPS];
    float *hemb; /* [T][E]: embedding rows dequantized on the host (a table type the kernel lacks) */
    int *out_rows;
    /* CUDA graphs of decode steps, by key (run_graphed) */
    bool graphs, graphs_said;
    int n_graphs;
    uint64_t graph_clock;
    struct step_graph {
        int T, max_ctx; /* tokens; the context bucket the attention's split is taken for */
        bool win, rows; /* a window is passed to attention; the "rows" attention kernel */
        int fails;      /* captures that failed: from GRAPH_TRIES on, this key runs eagerly */
        uint64_t used;  /* graph_clock when last replayed (the least recent is replaced) */
        hr_cuda_graph *g;
    } graph[GRAPH_CACHE];
} cuda_ctx;

static void cuda_destroy(hr_model_ctx *c);
static void free_graphs(cuda_ctx *x);

/* ---- create ---------------------------------------------------------------------------------------- */

static hr_status up_floats(cuda_ctx *x, const float *v, size_t n, uint64_t *out, hr_error *err) {
    hr_status st = hr_cuda_alloc(x->dev, n * sizeof(float), out, err);
    return st ? st : hr_cuda_upload(x->dev, *out, v, n * sizeof(float), err);
}

/* The GEMV kernels of a weight type (kernels/gemv.cu's HR_K_GEMV_KERNELS pairs): the plain one, or
 * (experts) the stack's, which picks each slot's expert; NULL for a type without one. */
static const char *gemv_kernel_of(hr_dtype t, bool experts) {
    static const struct {
        hr_dtype t;
        const char *plain, *moe;
    } k[] = {{HR_DTYPE_F32, "hr_k_gemv_f32", "hr_k_gemv_moe_f32"},
             {HR_DTYPE_F16, "hr_k_gemv_f16", "hr_k_gemv_moe_f16"},
             {HR_DTYPE_Q8_0, "hr_k_gemv_q8_0", "hr_k_gemv_moe_q8_0"},
             {HR_DTYPE_Q4_0, "hr_k_gemv_q4_0", "hr_k_gemv_moe_q4_0"},
             {HR_DTYPE_BF16, "hr_k_gemv_bf16", "hr_k_gemv_moe_bf16"},
             {HR_DTYPE_Q4_K, "hr_k_gemv_q4_K", "hr_k_gemv_moe_q4_K"},
             {HR_DTYPE_Q5_K, "hr_k_gemv_q5_K", "hr_k_gemv_moe_q5_K"},
             {HR_DTYPE_Q6_K, "hr_k_gemv_q6_K", "hr_k_gemv_moe_q6_K"},
             {HR_DTYPE_Q5_0, "hr_k_gemv_q5_0", "hr_k_gemv_moe_q5_0"},
             {HR_DTYPE_Q5_1, "hr_k_gemv_q5_1", "hr_k_gemv_moe_q5_1"}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (k[i].t == t) return experts ? k[i].moe : k[i].plain;
    return NULL;
}
static const char *gemv_kernel(hr_dtype t) { return gemv_kernel_of(t, false); }

/* The tensor-core GEMM (kernels/gemm.cu) of a weight type, by its GEMV kernel's name, for batches of
 * GEMM_MIN_TOKENS or more; cols must be a multiple of col_step (the kernel's 16-byte loads for bf16 and
 * f16, whole blocks for q8_0 and q4_0). f32 weights stay on the GEMV: exact f32 products. */
#define GEMM_MIN_TOKENS 16
static const struct {
    const char *gemv, *gemm;
    int col_step;
} gemm_kernels[] = {{"hr_k_gemv_bf16", "hr_k_gemm_bf16", 8},
                    {"hr_k_gemv_f16", "hr_k_gemm_f16", 8},
                    {"hr_k_gemv_q8_0", "hr_k_gemm_q8_0", 32},
                    {"hr_k_gemv_q4_0", "hr_k_gemm_q4_0", 32}};

static int emb_type(hr_dtype t) {
    return t == HR_DTYPE_F32 ? EMB_F32 : t == HR_DTYPE_F16 ? EMB_F16 : t == HR_DTYPE_Q8_0 ? EMB_Q8_0 : -1;
}

/* Whether matrix w's host pages go once uploaded: all but an output tied to a token embedding the host
 * still reads (a type the device does not look up: its rows are dequantized on the host per batch). */
static bool host_gone(const hr_model *m, const hr_weight *w) {
    return !(w->data == m->tok_embd.data && emb_type(m->tok_embd.type) < 0);
}

/* matrix `what`'s type has no GEMV kernel */
static hr_status type_refused(const char *what, hr_dtype t, hr_error *err) {
    return hr_error_set(err, HR_ERR_UNSUPPORTED,
                        "CUDA: %s is %s; the GPU's matrix kernels take f32, f16, bf16, q8_0, q4_0, q5_0, q5_1, "
                        "q4_K, q5_K and q6_K so far",
                        what, hr_dtype_get_info(t)->name);
}

/* a matrix's rows, uploaded as stored; n_stack > 0: a stack of that many experts' matrices (w is the
 * first, the others follow it), whose products are the expert kernels' */
static hr_status up_weight(cuda_ctx *x, const hr_weight *w, int n_stack, const char *what, dev_weight *out,
                           hr_error *err) {
    out->gemv = gemv_kernel_of(w->type, n_stack > 0);
    if (!out->gemv) return type_refused(what, w->type, err);
    out->rows = w->rows;
    out->cols = w->cols;
    out->expert_bytes = n_stack > 0 ? (uint64_t)w->rows * w->row_bytes : 0;
    size_t bytes = (size_t)w->rows * w->row_bytes * (size_t)(n_stack > 0 ? n_stack : 1);
    hr_status st = hr_cuda_alloc(x->dev, bytes, &out->p, err);
    if (!st) st = hr_cuda_upload(x->dev, out->p, w->data, bytes, err);
    /* the copy has left these pages (a pageable upload returns once it has), so the host's are given
     * back one matrix at a time: the process never holds the whole file (hr_cuda_host_weight_bytes); a
     * buffer the loader made (a checkpoint quantized at load, the experts' stacks) is dropped for good,
     * unless it is the token embedding too, whose upload reads it next (dropped there) */
    if (!st && host_gone(x->m, w)) {
        x->host_released += hr_model_release_host(x->m, w->data, bytes);
        if (w->data != x->m->tok_embd.data) x->host_released += hr_model_drop_host(x->m, w->data, bytes);
    }
    return st;
}

/* What the kernels cover: the llama family (llama, mistral's sliding window in every layer), qwen2's
 * Q/K/V biases, qwen3's Q/K norms, phi3's fused QKV and gate-up matrices (their row ranges uploaded as
 * three and two matrices), every RoPE the CPU's frequency table and hr_k_rope's position scale and
 * magnitude carry (Llama 3's factors, LongRoPE, YaRN, linear scaling), and a mixture of experts in every
 * layer routed by a softmax, its top k renormalized (qwen3moe, Mixtral; kernels/moe.cu). */
hr_status hr_cuda_check_hparams(const hr_hparams *hp, hr_error *err) {
    const char *why = hp->attn_sinks ? "attention sinks"
                      : hp->ffn_act != HR_FFN_SILU && hp->ffn_act != HR_FFN_GELU_TANH
                          ? "an FFN activation other than SwiGLU and GeGLU"
                      : hp->n_expert > 0 && hp->moe_softmax_topk ? "experts routed by a softmax over the top k"
                      : hp->n_expert_shared > 0 || hp->n_layer_dense > 0
                          ? "shared experts or dense layers beside experts"
                      : hp->n_expert > 0 && hp->n_expert_used > 32 ? "more than 32 experts a token"
                      : hp->kv_lora_rank > 0                       ? "latent attention (MLA)"
                                                                   : NULL;
    if (why)
        return hr_error_set(err, HR_ERR_UNSUPPORTED, "CUDA: %s (%s) has %s, which the GPU kernels do not cover yet",
                            hp->name[0] ? hp->name : "the model", hp->arch_name, why);
    return HR_OK;
}

static uint64_t mat_bytes(const hr_weight *w) { return hr_cuda_arena_piece_bytes((uint64_t)w->rows * w->row_bytes); }

/* A layer's matrices in one order: the host's (l), their device copies (d), their GGUF names; a dense
 * layer has the first seven, a mixture of experts' the four attention ones, the router and the three
 * stacks of experts (FIRST_STACK on: n_expert matrices each, expert e's at data + e x one's bytes). A
 * matrix a layer lacks has no data. */
enum { LAYER_MATS = 11, FIRST_STACK = 8 };
static const char *const layer_mat_names[LAYER_MATS] = {"attn_q",        "attn_k",      "attn_v",       "attn_output",
                                                        "ffn_gate",      "ffn_up",      "ffn_down",     "ffn_gate_inp",
                                                        "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
static void layer_mats(const hr_layer *l, const hr_weight *w[LAYER_MATS]) {
    const hr_weight *all[LAYER_MATS] = {&l->wq,     &l->wk,       &l->wv,       &l->wo,     &l->w_gate,  &l->w_up,
                                        &l->w_down, &l->w_router, &l->exp_gate, &l->exp_up, &l->exp_down};
    memcpy(w, all, sizeof all);
}
static void dev_mats(dev_layer *d, dev_weight *w[LAYER_MATS]) {
    dev_weight *all[LAYER_MATS] = {&d->wq, &d->wk,     &d->wv, &d->wo, &d->wg, &d->wu,
                                   &d->wd, &d->router, &d->eg, &d->eu, &d->ed};
    memcpy(w, all, sizeof all);
}
/* matrix i of a layer: its bytes on the host and on the device (a stack: every expert's), 0 if absent */
static uint64_t layer_mat_bytes(const hr_model *m, const hr_weight *w, int i) {
    if (!w->data) return 0;
    return (uint64_t)w->rows * w->row_bytes * (i >= FIRST_STACK ? (uint64_t)m->hp.n_expert : 1u);
}

hr_status hr_cuda_check_model(const hr_model *m, hr_error *err) {
    hr_status st = hr_cuda_check_hparams(&m->hp, err);
    for (int il = 0; !st && il < m->hp.n_layer; il++) {
        const hr_weight *ws[LAYER_MATS];
        layer_mats(&m->layers[il], ws);
        for (int i = 0; !st && i < LAYER_MATS; i++)
            if (ws[i]->data && !gemv_kernel(ws[i]->type)) {
                char what[64];
                snprintf(what, sizeof what, "blk.%d.%s", il, layer_mat_names[i]);
                st = type_refused(what, ws[i]->type, err);
            }
    }
    if (!st && !gemv_kernel(m->output.type)) st = type_refused("output.weight", m->output.type, err);
    return st;
}

/* a layer's Q/K/V biases (one piece), Q/K norms and post norms (one piece each), as upload_model makes them */
static uint64_t layer_vec_bytes(const hr_hparams *hp, const hr_layer *l) {
    const uint64_t D = (uint64_t)hp->head_dim, qkv = ((uint64_t)hp->n_head + 2u * (uint64_t)hp->n_head_kv) * D;
    const uint64_t E = (uint64_t)hp->n_embd;
    return (l->bq || l->bk || l->bv ? hr_cuda_arena_piece_bytes(qkv * 4u) : 0) +
           (l->q_norm ? hr_cuda_arena_piece_bytes(D * 4u) : 0) + (l->k_norm ? hr_cuda_arena_piece_bytes(D * 4u) : 0) +
           (l->attn_post_norm ? hr_cuda_arena_piece_bytes(E * 4u) : 0) +
           (l->ffn_post_norm ? hr_cuda_arena_piece_bytes(E * 4u) : 0);
}

/* window layers beside full ones (gemma2, gemma3): two RoPE tables, several KV layer groups */
static bool hybrid(const hr_hparams *hp) { return hp->n_window_layers > 0 && hp->n_window_layers < hp->n_layer; }

uint64_t hr_cuda_model_weight_bytes(const hr_model *m) {
    const hr_hparams *hp = &m->hp;
    const uint64_t norm = hr_cuda_arena_piece_bytes((uint64_t)hp->n_embd * 4u);
    uint64_t b = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        const hr_weight *ws[LAYER_MATS];
        layer_mats(&m->layers[il], ws);
        b += 2 * norm + layer_vec_bytes(hp, &m->layers[il]);
        for (int i = 0; i < LAYER_MATS; i++) b += hr_cuda_arena_piece_bytes(layer_mat_bytes(m, ws[i], i));
    }
    b += norm + mat_bytes(&m->output);
    if (emb_type(m->tok_embd.type) >= 0) b += mat_bytes(&m->tok_embd);
    const uint64_t rope = hr_cuda_arena_piece_bytes((uint64_t)(hp->n_rot / 2 > 0 ? hp->n_rot / 2 : 1) * 4u);
    return b + rope * (hybrid(hp) ? 2u : 1u); /* the window layers' table beside the full ones' */
}

/* what upload_model lets go of the host's copy of [p, p + n), a matrix's: the file's pages given back,
 * the loader's own buffer dropped (not the token embedding's: counted with it) */
static uint64_t host_goes(const hr_model *m, const void *p, uint64_t n) {
    return hr_model_releasable(m, p, n) + (p != m->tok_embd.data ? hr_model_droppable(m, p, n) : 0);
}

/* Host bytes of weights that stay with --device cuda: the loader's (hr_model_resident_bytes) less the
 * pages upload_model gives back, the same ranges counted the same way (hr_model_releasable). */
uint64_t hr_cuda_host_weight_bytes(const hr_model *m) {
    const hr_hparams *hp = &m->hp;
    uint64_t gone = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        const hr_weight *ws[LAYER_MATS];
        layer_mats(&m->layers[il], ws);
        for (int i = 0; i < LAYER_MATS; i++)
            if (ws[i]->data) gone += host_goes(m, ws[i]->data, layer_mat_bytes(m, ws[i], i));
    }
    if (host_gone(m, &m->output)) gone += host_goes(m, m->output.data, (uint64_t)m->output.rows * m->output.row_bytes);
    const hr_weight *te = &m->tok_embd;
    const uint64_t tb = (uint64_t)te->rows * te->row_bytes;
    if (emb_type(te->type) >= 0 && te->data != m->output.data) gone += hr_model_releasable(m, te->data, tb);
    if (emb_type(te->type) >= 0) gone += hr_model_droppable(m, te->data, tb);
    /* a mapping holds whole pages: the last one's too */
    long ps = sysconf(_SC_PAGESIZE);
    const uint64_t page = ps > 0 ? (uint64_t)ps : 4096u, file = hr_model_file_bytes(m);
    const uint64_t keep = hr_model_resident_bytes(hp, gone ? (file + page - 1) / page * page : file);
    return keep > gone ? keep - gone : 0;
}

uint64_t hr_cuda_backend_host_released(const hr_model_ctx *c) {
    return c && hr_backend_of(c) == &hr_backend_cuda ? ((const cuda_ctx *)(const void *)c)->host_released : 0;
}

/* qwen2's biases as one [H D | Hkv D | Hkv D] vector (a missing one zeros: hr_k_rope adds all three),
 * qwen3's per-head norm weights, gemma's post norms */
static hr_status up_layer_vecs(cuda_ctx *x, const hr_layer *l, dev_layer *d, hr_error *err) {
    const hr_hparams *hp = &x->m->hp;
    const size_t D = (size_t)hp->head_dim, qd = (size_t)hp->n_head * D, kvd = (size_t)hp->n_head_kv * D;
    hr_status st = HR_OK;
    if (l->bq || l->bk || l->bv) {
        float *b = calloc(qd + 2 * kvd, sizeof *b);
        if (!b) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
        if (l->bq) memcpy(b, l->bq, qd * sizeof *b);
        if (l->bk) memcpy(b + qd, l->bk, kvd * sizeof *b);
        if (l->bv) memcpy(b + qd + kvd, l->bv, kvd * sizeof *b);
        st = up_floats(x, b, qd + 2 * kvd, &d->bias, err);
        free(b);
    }
    if (!st && l->q_norm) st = up_floats(x, l->q_norm, D, &d->q_norm, err);
    if (!st && l->k_norm) st = up_floats(x, l->k_norm, D, &d->k_norm, err);
    if (!st && l->attn_post_norm) st = up_floats(x, l->attn_post_norm, (size_t)hp->n_embd, &d->attn_post, err);
    if (!st && l->ffn_post_norm) st = up_floats(x, l->ffn_post_norm, (size_t)hp->n_embd, &d->ffn_post, err);
    return st;
}

static hr_status upload_model(cuda_ctx *x, hr_error *err) {
    const hr_model *m = x->m;
    const hr_hparams *hp = &m->hp;
    hr_status st = HR_OK;
    for (int il = 0; il < hp->n_layer && !st; il++) {
        const hr_layer *l = &m->layers[il];
        dev_layer *d = &x->L[il];
        const hr_weight *ws[LAYER_MATS];
        dev_weight *ds[LAYER_MATS];
        layer_mats(l, ws);
        dev_mats(d, ds);
        if ((st = up_floats(x, l->attn_norm, (size_t)hp->n_embd, &d->attn_norm, err)) ||
            (st = up_floats(x, l->ffn_norm, (size_t)hp->n_embd, &d->ffn_norm, err)) ||
            (st = up_layer_vecs(x, l, d, err)))
            return st;
        for (int i = 0; i < LAYER_MATS && !st; i++) {
            char what[64];
            snprintf(what, sizeof what, "blk.%d.%s", il, layer_mat_names[i]);
            if (ws[i]->data) st = up_weight(x, ws[i], i >= FIRST_STACK ? hp->n_expert : 0, what, ds[i], err);
        }
    }
    if (st) return st;
    if ((st = up_floats(x, m->output_norm, (size_t)hp->n_embd, &x->out_norm, err)) ||
        (st = up_weight(x, &m->output, 0, "output.weight", &x->out, err)))
        return st;
    const hr_weight *te = &m->tok_embd;
    x->tok_type = emb_type(te->type);
    /* another type's rows are dequantized on the host per batch (the model's own copy) and copied up */
    size_t tb = (size_t)te->rows * te->row_bytes;
    if (x->tok_type >= 0 &&
        ((st = hr_cuda_alloc(x->dev, tb, &x->tok, err)) || (st = hr_cuda_upload(x->dev, x->tok, te->data, tb, err))))
        return st;
    if (x->tok_type >= 0) { /* tied to the output: its pages came back for this copy, and go again */
        uint64_t r = hr_model_release_host(m, te->data, tb);
        if (te->data != m->output.data) x->host_released += r;
        x->host_released += hr_model_drop_host(m, te->data, tb); /* the output's upload left it (tied) */
    }
    /* the table every backend turns by (model.h), so the GPU rotates by the CPU's angles */
    size_t half = (size_t)(hp->n_rot / 2 > 0 ? hp->n_rot / 2 : 1);
    float *inv = malloc(sizeof(float) * half);
    if (!inv) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    float *inv_swa = hybrid(hp) ? malloc(sizeof(float) * half) : NULL;
    if (hybrid(hp) && !inv_swa) {
        free(inv);
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    }
    hr_model_rope_inv_freq(m, x->max_ctx, inv, inv_swa);
    st = up_floats(x, inv, half, &x->inv_freq, err);
    if (!st && inv_swa) st = up_floats(x, inv_swa, half, &x->inv_freq_swa, err);
    free(inv);
    free(inv_swa);
    return st;
}

static hr_status alloc_activations(cuda_ctx *x, hr_error *err) {
    const hr_hparams *hp = &x->m->hp;
    const size_t T = (size_t)x->max_tokens, E = (size_t)hp->n_embd;
    const int B = hr_kv_pool_config(x->kv)->block_size;
    x->max_blocks = (x->max_ctx + B - 1) / B;
    /* the buffers in hr_cuda_scratch_pieces' order (the arena plan counts the same pieces) */
    uint64_t bytes[HR_CUDA_SCRATCH_PIECES];
    uint64_t *bufs[HR_CUDA_SCRATCH_PIECES] = {
        &x->x,        &x->xb,        &x->xo,           &x->q,          &x->k,     &x->v,      &x->att,
        &x->g,        &x->u,         &x->logits,       &x->ids,        &x->pos,   &x->slots,  &x->qrow,
        &x->n_ctx,    &x->tables,    &x->attn_scratch, &x->d_out_rows, &x->win,   &x->runs,   &x->tl.view,
        &x->tl.masks, &x->tl.scores, &x->moe_probs,    &x->moe_sel,    &x->moe_w, &x->moe_out};
    int n = hr_cuda_scratch_pieces(hp, x->max_tokens, x->max_ctx, B, x->n_groups, bytes);
    for (int i = 0; i < n; i++) { /* a piece of 0 bytes (the experts' without them) is none, as planned */
        hr_status st = bytes[i] ? hr_cuda_alloc(x->dev, (size_t)bytes[i], bufs[i], err) : HR_OK;
        if (st) return st;
    }
    const size_t G = (size_t)x->n_groups;             /* slots, windows and tables: a set a group (slots_of) */
    x->h_slots = malloc(G * 3 * T * sizeof(int32_t)); /* slots, then stages and fills (q4, kivi2) */
    x->h_qrow = malloc(T * sizeof(int32_t));
    x->h_nctx = malloc(T * sizeof(int32_t));
    x->h_win = malloc(G * 2 * T * sizeof(int32_t));
    x->h_runs = malloc(4 * T * sizeof(int32_t));
    x->h_tables = malloc(G * T * (size_t)x->max_blocks * sizeof(int32_t));
    x->out_rows = malloc(T * sizeof(int));
    if (x->tok_type < 0) x->hemb = malloc(T * E * sizeof(float));
    x->tl_cap = hr_cuda_token_seqs(x->max_tokens);
    x->h_tlview = malloc(2 * T * sizeof(int32_t));
    x->tl_seq = malloc((size_t)x->tl_cap * sizeof(int32_t));
    x->tl_blocks = malloc((size_t)x->tl_cap * sizeof(int));
    x->tl_acc = malloc((size_t)x->tl_cap * sizeof(bool));
    x->h_tlscore = malloc((size_t)hr_cuda_token_row_bytes(hp, x->max_ctx, B, true));
    if (!x->h_slots || !x->h_qrow || !x->h_nctx || !x->h_win || !x->h_runs || !x->h_tables || !x->out_rows ||
        (x->tok_type < 0 && !x->hemb) || !x->h_tlview || !x->tl_seq || !x->tl_blocks || !x->tl_acc || !x->h_tlscore)
        return hr_error_set(err, HR_ERR_NOMEM, "out of memory for the GPU forward pass's host rows");
    return HR_OK;
}

/* HEADROOM_CUDA_ARGMAX: "host" (or unset: the rows of logits come down and the engine's sampler picks;
 * the default until a GPU measures the other) or "device" (a greedy step's ids are picked on the GPU by
 * hr_k_argmax_rows and only they come down: 4 bytes a row instead of n_vocab floats) */
static hr_status argmax_of(const char *v, bool *device, hr_error *err) {
    *device = v && strcmp(v, "device") == 0;
    if (!v || !*v || *device || strcmp(v, "host") == 0) return HR_OK;
    return hr_error_set(err, HR_ERR_INVALID_ARG, "HEADROOM_CUDA_ARGMAX is '%s': expected host or device", v);
}

static hr_status cuda_create(const hr_model *m, hr_kv_pool *kv, const hr_model_ctx_params *p, hr_model_ctx **out,
                             hr_error *err) {
    const hr_cuda_backend_params *cp = p->backend_user;
    cuda_ctx *x = calloc(1, sizeof *x);
    if (!x) return hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    x->base.ops = &hr_backend_cuda;
    x->m = m;
    x->kv = kv;
    x->max_tokens = p->max_batch_tokens;
    x->max_ctx = p->max_ctx;
    hr_status st = HR_OK;
    /* the device first: a machine without one says so before anything else */
    if (cp && cp->dev) {
        x->dev = cp->dev;
    } else if ((st = hr_cuda_device_open(cp ? cp->driver_lib : NULL, cp ? cp->ordinal : 0, &x->dev, err))) {
        free(x);
        return st;
    } else {
        x->own_dev = true;
    }
    if (!m || !kv || strcmp(hr_kv_pool_storage(kv)->ops->name, "cuda") != 0)
        st = hr_error_set(err, HR_ERR_INVALID_ARG,
                          "CUDA: %s opened; the forward pass needs a model and a KV pool on the GPU",
                          hr_cuda_device_name(x->dev));
    else if (p->max_batch_tokens < 1 || p->max_ctx < 1)
        st = hr_error_set(err, HR_ERR_INVALID_ARG, "max_batch_tokens and max_ctx must be positive");
    else if (p->max_batch_tokens > HR_CUDA_MAX_BATCH_TOKENS)
        st = hr_error_set(err, HR_ERR_INVALID_ARG, "CUDA: max_batch_tokens %d is past %d (the GEMV's grid rows)",
                          p->max_batch_tokens, HR_CUDA_MAX_BATCH_TOKENS);
    else if (m && m->hp.n_expert > 0 && (int64_t)p->max_batch_tokens * m->hp.n_expert_used > 65535)
        st = hr_error_set(err, HR_ERR_INVALID_ARG,
                          "CUDA: max_batch_tokens %d is past %d for %d experts a token (the expert GEMV's grid rows: "
                          "a (token, expert) each, at most 65,535)",
                          p->max_batch_tokens, 65535 / m->hp.n_expert_used, m->hp.n_expert_used);
    if (!st) st = hr_cuda_check_model(m, err);
    if (!st)
        st = hr_threadpool_create(p->n_threads > 0 ? p->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN), &x->tp, err);
    if (!st) st = argmax_of(getenv("HEADROOM_CUDA_ARGMAX"), &x->argmax, err);
    /* the device path writes and attends by physical slot: each layer in its group's blocks (gemma's
     * window layers beside its full ones: several groups, each with its own tables), at its slot there */
    if (!st) x->n_groups = hr_kv_pool_groups(kv)->n_groups;
    if (!st && x->n_groups > 1 && hr_kv_pool_n_stage(kv) > 0)
        st = hr_error_set(err, HR_ERR_UNSUPPORTED,
                          "CUDA: %s has sliding-window layers beside full ones (several KV layer groups), which the "
                          "GPU path covers with the formats written as they come (f32, f16, bf16, q8, fp8, q4h), "
                          "not q4 or kivi2 yet",
                          m->hp.name[0] ? m->hp.name : m->hp.arch_name);
    if (!st && hr_kv_pool_config(kv)->v_from_k)
        st = hr_error_set(err, HR_ERR_UNSUPPORTED, "CUDA: %s's KV layout (a latent cache) is not on the GPU yet",
                          m->hp.name[0] ? m->hp.name : m->hp.arch_name);
    if (!st) st = hr_kv_pool_set_attn_softcap(kv, m->hp.attn_softcap, err); /* gemma2's, as the CPU's forward */
    /* the model's own sliding window, as the CPU's forward pass tells the pool (its views then see it) */
    for (int il = 0; !st && il < m->hp.n_layer; il++)
        if (m->layer_attn[il].window > 0) st = hr_kv_pool_set_sliding_window(kv, il, m->layer_attn[il].window, err);
    if (!st) x->staged = hr_kv_pool_n_stage(kv) > 0;
    if (!st && !(x->L = calloc((size_t)m->hp.n_layer, sizeof *x->L)))
        st = hr_error_set(err, HR_ERR_NOMEM, "out of memory");
    for (int g = 0; !st && g < x->n_groups; g++) x->group_layer[g] = -1;
    for (int il = 0; !st && il < m->hp.n_layer; il++) {
        hr_kv_pool_layer_slot(kv, il, &x->L[il].group, &x->L[il].slot);
        if (x->group_layer[x->L[il].group] < 0) x->group_layer[x->L[il].group] = il;
    }
    if (!st) st = upload_model(x, err);
    if (!st) st = alloc_activations(x, err);
    const char *graphs = getenv("HEADROOM_CUDA_GRAPHS");
    if (!st && graphs && *graphs && strcmp(graphs, "0") != 0 &&
        !hr_cuda_backend_set_graphs((hr_model_ctx *)(void *)x, true))
        fprintf(stderr, "headroom: HEADROOM_CUDA_GRAPHS: %s; decode steps run launch by launch\n",
                hr_cuda_graphs_available(x->dev) ? "the KV cache is on another device object"
                                                 : "this driver has no CUDA graphs (CUDA 11.4 or later)");
    if (st) {
        cuda_destroy((hr_model_ctx *)(void *)x);
        return st;
    }
    *out = (hr_model_ctx *)(void *)x;
    return HR_OK;
}

static void free_weight(cuda_ctx *x, dev_weight *w) { hr_cuda_free(x->dev, w->p); }

static void cuda_destroy(hr_model_ctx *c) {
    if (!c) return;
    cuda_ctx *x = (cuda_ctx *)(void *)c;
    free_graphs(x);
    hr_threadpool_destroy(x->tp);
    for (int il = 0; x->L && x->m && il < x->m->hp.n_layer; il++) {
        dev_layer *d = &x->L[il];
        hr_cuda_free(x->dev, d->attn_norm);
        hr_cuda_free(x->dev, d->ffn_norm);
        hr_cuda_free(x->dev, d->bias);
        hr_cuda_free(x->dev, d->q_norm);
        hr_cuda_free(x->dev, d->k_norm);
        hr_cuda_free(x->dev, d->attn_post);
        hr_cuda_free(x->dev, d->ffn_post);
        dev_weight *ds[LAYER_MATS];
        dev_mats(d, ds);
        for (int i = 0; i < LAYER_MATS; i++) free_weight(x, ds[i]);
    }
    free_weight(x, &x->out);
    uint64_t bufs[] = {x->tok,
                       x->inv_freq_swa,
                       x->out_norm,
                       x->inv_freq,
                       x->x,
                       x->xb,
                       x->xo,
                       x->q,
                       x->k,
                       x->v,
                       x->att,
                       x->g,
                       x->u,
                       x->logits,
                       x->ids,
                       x->pos,
                       x->slots,
                       x->qrow,
                       x->n_ctx,
                       x->tables,
                       x->attn_scratch,
                       x->d_out_rows,
                       x->win,
                       x->runs,
                       x->tl.view,
                       x->tl.masks,
                       x->tl.scores,
                       x->moe_probs,
                       x->moe_sel,
                       x->moe_w,
                       x->moe_out};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) hr_cuda_free(x->dev, bufs[i]);
    if (x->own_dev) hr_cuda_device_close(x->dev);
    free(x->L);
    free(x->h_slots);
    free(x->h_qrow);
    free(x->h_nctx);
    free(x->h_win);
    free(x->h_runs);
    free(x->h_tables);
    free(x->out_rows);
    free(x->hemb);
    free(x->h_tlview);
    free(x->tl_seq);
    free(x->tl_blocks);
    free(x->tl_acc);
    free(x->h_tlscore);
    free(x);
}

/* ---- forward --------------------------------------------------------------------------------------- */

#define THREADS 256

/* y[t] = W x[t] for T rows: from GEMM_MIN_TOKENS tokens on the tensor cores where the type has a GEMM
 * (its grid: 128 rows a block, 64 tokens a grid row), else the GEMV (8 rows a block, a tile of up to 8
 * tokens a grid row). Below 16 tokens the GEMV reads W at most twice and a 64-token tile would be mostly
 * empty; from 16 on the GEMV reads W T / 8 times, the GEMM once per 64 tokens. */
static hr_status gemv(cuda_ctx *x, const dev_weight *w, uint64_t in, uint64_t out, int T, hr_error *err) {
    int rows = (int)w->rows, cols = (int)w->cols;
    uint64_t wp = w->p;
    void *a[] = {&out, &wp, &in, &rows, &cols, &T};
    for (size_t i = 0; T >= GEMM_MIN_TOKENS && i < sizeof gemm_kernels / sizeof gemm_kernels[0]; i++)
        if (strcmp(w->gemv, gemm_kernels[i].gemv) == 0 && cols % gemm_kernels[i].col_step == 0)
            return hr_cuda_launch(x->dev, gemm_kernels[i].gemm, (unsigned)((rows + 127) / 128),
                                  (unsigned)((T + 63) / 64), THREADS, a, err);
    return hr_cuda_launch(x->dev, w->gemv, (unsigned)((rows + HR_CUDA_GEMV_ROWS - 1) / HR_CUDA_GEMV_ROWS),
                          (unsigned)((T + HR_CUDA_GEMV_TOKENS - 1) / HR_CUDA_GEMV_TOKENS), THREADS, a, err);
}

/* out[i] = rmsnorm(x[r] += add[r]) * w for r = rows[i] (rows 0: i), i < n_rows; add 0: no add.
 * One launch for the residual add and the next norm. */
static hr_status add_rmsnorm(cuda_ctx *x, uint64_t out, uint64_t add, uint64_t w, uint64_t rows, int n_rows,
                             hr_error *err) {
    int n = x->m->hp.n_embd;
    float eps = x->m->hp.norm_eps;
    void *a[] = {&out, &x->x, &add, &w, &rows, &n, &eps};
    return hr_cuda_launch(x->dev, "hr_k_add_rmsnorm", (unsigned)n_rows, 1, THREADS, a, err);
}

/* y[s] = W_e x[s / x_div] for each of the T K (token, rank) slots s, e its expert (kernels/gemv.cu's
 * hr_k_gemv_moe_*: a slot a grid row) */
static hr_status gemv_experts(cuda_ctx *x, const dev_weight *w, uint64_t in, uint64_t out, int T, int x_div,
                              hr_error *err) {
    int rows = (int)w->rows, cols = (int)w->cols, div = x_div;
    uint64_t wp = w->p, eb = w->expert_bytes, sel = x->moe_sel;
    void *a[] = {&out, &wp, &in, &rows, &cols, &sel, &div, &eb};
    return hr_cuda_launch(x->dev, w->gemv, (unsigned)((rows + HR_CUDA_GEMV_ROWS - 1) / HR_CUDA_GEMV_ROWS),
                          (unsigned)(T * x->m->hp.n_expert_used), THREADS, a, err);
}

/* enough blocks for n elements, at most 1024 (the kernels loop over the rest) */
static unsigned grid_for(uint64_t n) {
    uint64_t g = (n + THREADS - 1) / THREADS;
    return (unsigned)(g < 1 ? 1 : g > 1024 ? 1024 : g);
}

/* Layer il's queries and keys made ready for attention, one launch (kernels/rope.cu): its biases and
 * Q/K norms where it has them, then RoPE at its position scale with the model's magnitude */
static hr_status rope(cuda_ctx *x, int T, int il, hr_error *err) {
    const hr_hparams *hp = &x->m->hp;
    const dev_layer *d = &x->L[il];
    int D = hp->head_dim, n_rot = hp->n_rot, neox = hp->rope_neox, hq = hp->n_head, hk = hp->n_head_kv;
    float pos_scale = x->m->layer_attn[il].rope_linear_scale, eps = hp->norm_eps,
          factor = hp->rope_attn_factor > 0.0f ? hp->rope_attn_factor : 1.0f;
    uint64_t bias = d->bias, qn = d->q_norm, kn = d->k_norm;
    /* gemma3's window layers turn by their own base, as the CPU's (hr_model_rope_inv_freq's inv_swa) */
    uint64_t inv = x->inv_freq_swa && x->m->layer_attn[il].kind == HR_ATTN_WINDOW ? x->inv_freq_swa : x->inv_freq;
    void *a[] = {&x->q, &x->k, &x->v, &x->pos, &inv,  &bias,      &qn,     &kn,
                 &hq,   &hk,   &D,    &n_rot,  &neox, &pos_scale, &factor, &eps};
    return hr_cuda_launch(x->dev, "hr_k_rope", (unsigned)T, 1, THREADS, a, err);
}

static hr_status check_batch(const cuda_ctx *x, const hr_batch *b, hr_error *err) {
    if (b->n_tokens < 1 || b->n_tokens > x->max_tokens)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "batch of %d tokens (allowed 1..%d)", b->n_tokens, x->max_tokens);
    for (int t = 0; t < b->n_tokens; t++) {
        if (b->tokens[t] < 0 || b->tokens[t] >= x->m->hp.n_vocab)
            return hr_error_set(err, HR_ERR_INVALID_ARG, "token id %d is outside the vocabulary (0..%d)", b->tokens[t],
                                x->m->hp.n_vocab - 1);
        if (b->pos[t] < 0 || b->pos[t] >= x->max_ctx)
            return hr_error_set(err, HR_ERR_RANGE, "position %d is outside the context (0..%d)", b->pos[t],
                                x->max_ctx - 1);
    }
    return HR_OK;
}

/* Token t's token-level view (h2o, snapkv): its sequence's row of masks (the first token of a sequence
 * under such a policy takes the next row, its masks copied up from the manager's words, as many
 * blocks as its table has) and whether its softmax weights are accumulated (that row's scores then
 * zeroed before the step and brought down after it: tokens_scores). r: the sequence's first token in
 * the batch, n_tab its table's blocks. */
static hr_status token_view(cuda_ctx *x, const hr_batch *b, int t, int r, int n_tab, hr_error *err) {
    int nb = 0, mw = 0;
    bool acc = false;
    const uint64_t *m = hr_kv_seq_token_mask(x->kv, b->seq[t], b->pos[t] + 1, &nb, &mw, &acc);
    x->h_tlview[2 * t] = -1;
    x->h_tlview[2 * t + 1] = 0;
    if (!m) return HR_OK;
    const hr_hparams *hp = &x->m->hp;
    const uint64_t per = (uint64_t)hp->n_layer * (uint64_t)hp->n_head_kv;
    int k = r < t ? x->h_tlview[2 * r] : x->n_tl;
    if (r == t) {
        if (k >= x->tl_cap) /* cuda_forward cuts batches into pieces of at most tl_cap such sequences */
            return hr_error_set(err, HR_ERR_INTERNAL, "CUDA: more than %d sequences under h2o/snapkv in a batch",
                                x->tl_cap);
        x->n_tl++;
        x->tl_seq[k] = b->seq[t];
        x->tl_blocks[k] = n_tab < nb ? n_tab : nb;
        x->tl_acc[k] = false;
        const int B = hr_kv_pool_config(x->kv)->block_size;
        hr_status st =
            hr_cuda_upload(x->dev, x->tl.masks + (uint64_t)k * hr_cuda_token_row_bytes(hp, x->max_ctx, B, false), m,
                           (size_t)((uint64_t)x->tl_blocks[k] * per * (uint64_t)mw * 8u), err);
        if (st) return st;
    }
    x->h_tlview[2 * t] = k;
    x->h_tlview[2 * t + 1] = acc;
    x->tl_acc[k] |= acc;
    return HR_OK;
}

/* accumulating row k's scores on the device, and the bytes its sequence's blocks take of them */
static size_t score_row(const cuda_ctx *x, int k, uint64_t *dev) {
    const hr_hparams *hp = &x->m->hp;
    const int B = hr_kv_pool_config(x->kv)->block_size;
    *dev = x->tl.scores + (uint64_t)k * hr_cuda_token_row_bytes(hp, x->max_ctx, B, true);
    return (size_t)x->tl_blocks[k] * (size_t)hp->n_layer * (size_t)hp->n_head_kv * (size_t)B * sizeof(uint64_t);
}

/* the rows that accumulate: their scores zeroed before the step (only the blocks their sequence has) */
static hr_status tokens_zero(cuda_ctx *x, hr_error *err) {
    for (int k = 0; k < x->n_tl; k++) {
        if (!x->tl_acc[k]) continue;
        uint64_t dev;
        const size_t bytes = score_row(x, k, &dev);
        memset(x->h_tlscore, 0, bytes);
        hr_status st = hr_cuda_upload(x->dev, dev, x->h_tlscore, bytes, err);
        if (st) return st;
    }
    return HR_OK;
}

/* after the step: each accumulating row's scores down and added to its sequence's (the policy decides
 * from them at the commit, as from the CPU's attention) */
static hr_status tokens_scores(cuda_ctx *x, hr_error *err) {
    for (int k = 0; k < x->n_tl; k++) {
        if (!x->tl_acc[k]) continue;
        uint64_t dev;
        const size_t bytes = score_row(x, k, &dev);
        hr_status st = hr_cuda_download(x->dev, x->h_tlscore, dev, bytes, err);
        if (st) return st;
        hr_kv_seq_add_scores(x->kv, x->tl_seq[k], x->h_tlscore, x->tl_blocks[k]);
    }
    return HR_OK;
}

/* group g's set of the batch's places: its slots (with stages and fills), table rows and windows, on
 * the host and on the device (4 bytes an entry), at g x the rows max_tokens holds */
static size_t slots_of(const cuda_ctx *x, int g) { return (size_t)g * 3u * (size_t)x->max_tokens; }
static size_t tables_of(const cuda_ctx *x, int g) { return (size_t)g * (size_t)x->max_tokens * (size_t)x->max_blocks; }
static size_t wins_of(const cuda_ctx *x, int g) { return (size_t)g * 2u * (size_t)x->max_tokens; }

/* The batch's places in the KV cache, from the manager (per KV layer group, asked through its first
 * layer: every layer of a group has the same slots and tables), copied up once for every layer: each
 * token's slot, its sequence's table row (a
 * row per distinct sequence, tokens of one sequence sharing it), its context pos + 1 and the window
 * it sees (a policy's sinks and window, the model's sliding window: hr_kv_seq_window), the token
 * masks of sequences under h2o or snapkv (token_view; the others pay nothing), and, where the
 * storage runs prefill attention on the tensor cores (HEADROOM_CUDA_PREFILL_ATTN=mma) and no token
 * is masked, the batch's runs of one sequence at consecutive positions. *max_ctx: the most positions
 * a token sees. */
static hr_status place_batch(cuda_ctx *x, const hr_batch *b, int *max_ctx, hr_error *err) {
    const int T = b->n_tokens, G = x->n_groups;
    int rows = 0, ctx = 1;
    x->any_win = false;
    x->n_tl = 0;
    for (int t = 0; t < T; t++) {
        int r = 0, n_tab = 0;
        while (r < t && b->seq[r] != b->seq[t]) r++;
        const int n = b->pos[t] + 1;
        x->h_nctx[t] = n;
        x->h_qrow[t] = r == t ? rows++ : x->h_qrow[r]; /* the sequence's first token in the batch: its row */
        for (int g = 0; g < G; g++) {                  /* each group through its first layer */
            const int il = x->group_layer[g];
            int32_t *sl = x->h_slots + slots_of(x, g);
            sl[t] = hr_kv_write_slot_stage(x->kv, il, b->seq[t], b->pos[t], NULL, &sl[T + t]);
            if (r == t) {
                const int32_t *tab = hr_kv_seq_table(x->kv, il, b->seq[t], &n_tab);
                if (n_tab > x->max_blocks) n_tab = x->max_blocks;
                memcpy(x->h_tables + tables_of(x, g) + (size_t)x->h_qrow[t] * x->max_blocks, tab,
                       (size_t)n_tab * sizeof *tab);
            }
            int sinks = 0, lo = 0;
            hr_kv_seq_window(x->kv, il, b->seq[t], n, &sinks, &lo);
            if (lo <= sinks) sinks = lo = 0;
            int32_t *w = x->h_win + wins_of(x, g);
            w[2 * t] = sinks;
            w[2 * t + 1] = lo;
            x->any_win |= lo > 0;
            const int vis = lo > 0 ? sinks + n - lo : n;
            ctx = vis > ctx ? vis : ctx;
        }
        /* n_tab: the sequence's blocks, which token_view reads at its first token (token policies have one
         * group) */
        hr_status st = token_view(x, b, t, r, n_tab, err);
        if (st) return st;
    }
    *max_ctx = ctx;
    const int H = x->m->hp.n_head, Hkv = x->m->hp.n_head_kv;
    x->n_runs = x->n_tl == 0 && hr_kv_storage_cuda_prefill_on(hr_kv_pool_storage(x->kv), H)
                    ? hr_cuda_attn_runs(x->h_qrow, b->pos, T, hr_cuda_prefill_tile_rows(H, Hkv), x->h_runs)
                    : 0;
    /* q4, kivi2 (one group: create refuses them with several): the tokens' stages follow their slots,
     * then whether each fills its block, which the storage counts now for the step (its launches the
     * same whatever fills) */
    hr_status st = hr_kv_storage_cuda_stage_batch(hr_kv_pool_storage_rw(x->kv), x->h_slots, T, err);
    const int place = x->staged ? 3 * T : T;
    if (st ||
        (x->n_tl > 0 && ((st = hr_cuda_upload(x->dev, x->tl.view, x->h_tlview, (size_t)T * 2 * sizeof(int32_t), err)) ||
                         (st = tokens_zero(x, err)))) ||
        (st = hr_cuda_upload(x->dev, x->qrow, x->h_qrow, (size_t)T * sizeof(int32_t), err)) ||
        (st = hr_cuda_upload(x->dev, x->n_ctx, x->h_nctx, (size_t)T * sizeof(int32_t), err)) ||
        (x->n_runs > 0 &&
         (st = hr_cuda_upload(x->dev, x->runs, x->h_runs, (size_t)x->n_runs * 4 * sizeof(int32_t), err))))
        return st;
    for (int g = 0; g < G; g++) {
        const size_t so = slots_of(x, g), wo = wins_of(x, g), to = tables_of(x, g);
        if ((st = hr_cuda_upload(x->dev, x->slots + so * 4u, x->h_slots + so, (size_t)place * sizeof(int32_t), err)) ||
            (x->any_win &&
             (st = hr_cuda_upload(x->dev, x->win + wo * 4u, x->h_win + wo, (size_t)T * 2 * sizeof(int32_t), err))) ||
            (st = hr_cuda_upload(x->dev, x->tables + to * 4u, x->h_tables + to,
                                 (size_t)rows * x->max_blocks * sizeof(int32_t), err)))
            return st;
    }
    return HR_OK;
}

/* Layer il's K/V writes and attention in the device storage: no row leaves the GPU */
static hr_status attend(cuda_ctx *x, int T, int il, int max_ctx, hr_error *err) {
    const hr_hparams *hp = &x->m->hp;
    hr_kv_storage *st = hr_kv_pool_storage_rw(x->kv);
    /* the layer's group's places; the storage's layer is its slot in the group's blocks */
    const int g = x->L[il].group, slot = x->L[il].slot;
    const uint64_t slots = x->slots + slots_of(x, g) * 4u, tables = x->tables + tables_of(x, g) * 4u,
                   win = x->any_win ? x->win + wins_of(x, g) * 4u : 0;
    hr_status r = hr_kv_storage_cuda_write_dev(st, slot, x->k, x->v, slots, T, err);
    if (r) return r;
    /* the token masks when a sequence has them, the scores when a row accumulates */
    bool acc = false;
    for (int k = 0; k < x->n_tl; k++) acc |= x->tl_acc[k];
    const hr_kv_cuda_tokens tl = {.view = x->tl.view, .masks = x->tl.masks, .scores = acc ? x->tl.scores : 0};
    /* a query's tail stage is its own token's: the block it writes, partial at its n_ctx = pos + 1 */
    const uint64_t tails = x->staged ? slots + (uint64_t)T * 4u : 0;
    return hr_kv_storage_cuda_attend_runs(st, slot, x->q, tables, x->max_blocks, x->qrow, x->n_ctx, win, tails, T,
                                          max_ctx, hp->n_head, hp->attn_scale, hp->attn_softcap, x->h_runs, x->runs,
                                          x->n_runs, x->n_tl > 0 ? &tl : NULL, x->att, x->attn_scratch, err);
}

/* p[0..n) *= s */
static hr_status scale(cuda_ctx *x, uint64_t p, float s, uint64_t n, hr_error *err) {
    void *a[] = {&p, &s, &n};
    return hr_cuda_launch(x->dev, "hr_k_scale", grid_for(n), 1, THREADS, a, err);
}

/* xo's T rows RMS-normed in place by w (gemma's post-attention and post-FFN norms; w 0: none) */
static hr_status post_norm(cuda_ctx *x, uint64_t w, int T, hr_error *err) {
    if (!w) return HR_OK;
    int n = x->m->hp.n_embd;
    float eps = x->m->hp.norm_eps;
    void *a[] = {&x->xo, &x->xo, &w, &n, &eps};
    return hr_cuda_launch(x->dev, "hr_k_rmsnorm", (unsigned)T, 1, THREADS, a, err);
}

/* A mixture of experts' FFN of xb's T rows into xo, the CPU's steps (moe_route, moe_ffn) in 7 launches
 * whatever the routing (so a step graphs): the router's logits, each token's k experts and weights
 * (hr_k_moe_route), every (token, rank) slot's gate and up rows through its expert (x read per token),
 * SwiGLU over all of them, each slot's down row, and each token's weighted sum in rank order. */
static hr_status ffn_moe(cuda_ctx *x, const dev_layer *d, int T, hr_error *err) {
    const hr_hparams *hp = &x->m->hp;
    int NE = hp->n_expert, K = hp->n_expert_used, E = hp->n_embd;
    uint64_t n = (uint64_t)T * (uint64_t)K * (uint64_t)hp->n_ff_exp;
    void *ra[] = {&x->moe_probs, &x->moe_sel, &x->moe_w, &NE, &K};
    void *sa[] = {&x->g, &x->g, &x->u, &n};
    void *ma[] = {&x->xo, &x->moe_out, &x->moe_w, &E, &K};
    hr_status st;
    if ((st = gemv(x, &d->router, x->xb, x->moe_probs, T, err)) ||
        (st = hr_cuda_launch(x->dev, "hr_k_moe_route", (unsigned)T, 1, 32, ra, err)) ||
        (st = gemv_experts(x, &d->eg, x->xb, x->g, T, K, err)) ||
        (st = gemv_experts(x, &d->eu, x->xb, x->u, T, K, err)) ||
        (st = hr_cuda_launch(x->dev, "hr_k_swiglu", grid_for(n), 1, THREADS, sa, err)) ||
        (st = gemv_experts(x, &d->ed, x->g, x->moe_out, T, 1, err)))
        return st;
    return hr_cuda_launch(x->dev, "hr_k_moe_sum", (unsigned)T, 1, THREADS, ma, err);
}

/* A step's launches once its inputs are on the device (ids, positions, the batch's places, the logit
 * rows, the host's embedding rows): the embedding lookup, the layers, the logits of the first n_out
 * rows of d_out_rows. Their arguments are the fixed buffers' addresses, T, n_out, the layer and the
 * split for max_ctx: what a graph captures. */
static hr_status launch_step(cuda_ctx *x, int T, int n_out, int max_ctx, hr_error *err) {
    const hr_hparams *hp = &x->m->hp;
    const int E = hp->n_embd, F = hp->n_ff;
    hr_status st;
    void *ea[] = {&x->x, &x->tok, &x->ids, (void *)&E, &x->tok_type};
    if (x->tok_type >= 0 && (st = hr_cuda_launch(x->dev, "hr_k_embed", (unsigned)T, 1, THREADS, ea, err))) return st;
    if (hp->embd_scale > 0.0f && (st = scale(x, x->x, hp->embd_scale, (uint64_t)T * (uint64_t)E, err)))
        return st; /* gemma: sqrt(E) */
    /* Each residual add is fused with the norm after it (hr_k_add_rmsnorm): the FFN's output joins
     * the stream in the next layer's attention norm, the last layer's in the output norm; gemma's
     * post norms first normalize each output in place. */
    for (int il = 0; il < hp->n_layer; il++) {
        const dev_layer *d = &x->L[il];
        if ((st = add_rmsnorm(x, x->xb, il > 0 ? x->xo : 0, d->attn_norm, 0, T, err)) ||
            (st = gemv(x, &d->wq, x->xb, x->q, T, err)) || (st = gemv(x, &d->wk, x->xb, x->k, T, err)) ||
            (st = gemv(x, &d->wv, x->xb, x->v, T, err)) || (st = rope(x, T, il, err)) ||
            (st = attend(x, T, il, max_ctx, err)) || (st = gemv(x, &d->wo, x->att, x->xo, T, err)) ||
            (st = post_norm(x, d->attn_post, T, err)) || (st = add_rmsnorm(x, x->xb, x->xo, d->ffn_norm, 0, T, err)))
            return st;
        if (d->eg.p) { /* the experts: their FFNs into xo (ffn_moe) */
            st = ffn_moe(x, d, T, err);
        } else if (!(st = gemv(x, &d->wg, x->xb, x->g, T, err)) && !(st = gemv(x, &d->wu, x->xb, x->u, T, err))) {
            uint64_t n = (uint64_t)T * F;
            void *sa[] = {&x->g, &x->g, &x->u, &n};
            const char *act = hp->ffn_act == HR_FFN_GELU_TANH ? "hr_k_geglu" : "hr_k_swiglu";
            if (!(st = hr_cuda_launch(x->dev, act, grid_for(n), 1, THREADS, sa, err)))
                st = gemv(x, &d->wd, x->g, x->xo, T, err);
        }
        if (st || (st = post_norm(x, d->ffn_post, T, err))) return st;
    }
    /* logits for the rows that want them: their last add and norm into xb's first rows (one launch),
     * then one GEMV; gemma's soft cap on them */
    if (n_out == 0) return HR_OK;
    if ((st = add_rmsnorm(x, x->xb, x->xo, x->out_norm, x->d_out_rows, n_out, err)) ||
        (st = gemv(x, &x->out, x->xb, x->logits, n_out, err)))
        return st;
    if (!(hp->final_softcap > 0.0f)) return HR_OK;
    uint64_t n = (uint64_t)n_out * (uint64_t)hp->n_vocab;
    float cap = hp->final_softcap;
    void *ca[] = {&x->logits, &cap, &n};
    return hr_cuda_launch(x->dev, "hr_k_softcap", grid_for(n), 1, THREADS, ca, err);
}

/* ---- CUDA graphs of decode steps -------------------------------------------------------------------- */

static void free_graphs(cuda_ctx *x) {
    for (int i = 0; i < x->n_graphs; i++) hr_cuda_graph_free(x->dev, x->graph[i].g);
    x->n_graphs = 0;
}

bool hr_cuda_backend_set_graphs(hr_model_ctx *c, bool on) {
    if (!c || ((hr_backend_base *)(void *)c)->ops != &hr_backend_cuda) return false;
    cuda_ctx *x = (cuda_ctx *)(void *)c;
    /* a graph captures the launches on the backend's device: the KV storage's must be the same one */
    on = on && hr_cuda_graphs_available(x->dev) && hr_kv_storage_cuda_device(hr_kv_pool_storage(x->kv)) == x->dev;
    if (!on) free_graphs(x);
    return x->graphs = on;
}

/* the context bucket of a step whose longest context is n: a power of two from GRAPH_CTX_MIN, at most
 * max_ctx (>= n) */
static int ctx_bucket(const cuda_ctx *x, int n) {
    int b = GRAPH_CTX_MIN;
    while (b < n && b < x->max_ctx) b *= 2;
    return b < x->max_ctx ? b : x->max_ctx;
}

/* the key's entry: found, or a new one (the least recently used replaced when all are taken) */
static struct step_graph *graph_entry(cuda_ctx *x, int T, int max_ctx, bool win, bool rows) {
    struct step_graph *s = NULL;
    for (int i = 0; i < x->n_graphs; i++) {
        struct step_graph *e = &x->graph[i];
        if (e->T == T && e->max_ctx == max_ctx && e->win == win && e->rows == rows) return e;
        if (!s || e->used < s->used) s = e;
    }
    if (x->n_graphs < GRAPH_CACHE)
        s = &x->graph[x->n_graphs++];
    else
        hr_cuda_graph_free(x->dev, s->g);
    *s = (struct step_graph){.T = T, .max_ctx = max_ctx, .win = win, .rows = rows};
    return s;
}

/* records the step's launches into s->g; a failure counted in s->fails, said once */
static void capture(cuda_ctx *x, struct step_graph *s) {
    hr_error e = {0}, e_end = {0};
    hr_status st = hr_cuda_graph_begin(x->dev, &e);
    if (!st) {
        st = launch_step(x, s->T, s->T, s->max_ctx, &e);
        /* ended whatever happened: the stream runs launches again */
        hr_status end = hr_cuda_graph_end(x->dev, &s->g, st ? &e_end : &e);
        if (!st) st = end;
    }
    if (!st) return;
    hr_cuda_graph_free(x->dev, s->g); /* a launch failed but the capture ended: not a whole step */
    s->g = NULL;
    s->fails++;
    if (!x->graphs_said)
        fprintf(stderr,
                "headroom: CUDA graphs: a %d-token step could not be captured (%s); it ran launch by launch "
                "(such a step is captured once more, then runs so)\n",
                s->T, e.msg);
    x->graphs_said = true;
}

/* a decode step of T tokens, all wanting logits: its graph replayed (captured first if new) */
static hr_status run_graphed(cuda_ctx *x, int T, int max_ctx, hr_error *err) {
    const bool rows = hr_kv_storage_cuda_attn_rows(hr_kv_pool_storage(x->kv));
    struct step_graph *s = graph_entry(x, T, max_ctx, x->any_win, rows);
    s->used = ++x->graph_clock;
    if (!s->g && s->fails < GRAPH_TRIES) capture(x, s);
    return s->g ? hr_cuda_graph_launch(x->dev, s->g, err) : launch_step(x, T, T, max_ctx, err);
}

static hr_status forward_batch(cuda_ctx *x, const hr_batch *b, float *logits, hr_error *err) {
    hr_status st;
    const hr_hparams *hp = &x->m->hp;
    const int T = b->n_tokens, E = hp->n_embd;
    int max_ctx = 1, n_out = 0;
    for (int t = 0; t < T; t++)
        if (b->want_logits && b->want_logits[t]) x->out_rows[n_out++] = t;
    /* every input up before the first launch (a graph's launch cannot wait for a copy in between) */
    if ((st = hr_cuda_upload(x->dev, x->ids, b->tokens, (size_t)T * sizeof(int32_t), err)) ||
        (st = hr_cuda_upload(x->dev, x->pos, b->pos, (size_t)T * sizeof(int32_t), err)) ||
        (st = place_batch(x, b, &max_ctx, err)) ||
        (n_out > 0 && (st = hr_cuda_upload(x->dev, x->d_out_rows, x->out_rows, (size_t)n_out * sizeof(int), err))))
        return st;
    if (x->tok_type < 0) {
        const hr_weight *te = &x->m->tok_embd;
        for (int t = 0; t < T; t++)
            hr_dequantize_row_ref(te->type, (const uint8_t *)te->data + (size_t)b->tokens[t] * te->row_bytes,
                                  x->hemb + (size_t)t * E, E);
        if ((st = hr_cuda_upload(x->dev, x->x, x->hemb, (size_t)T * E * sizeof(float), err))) return st;
    }
    /* a decode step (every token wants its logits) with graphs on: its graph, the split for the
     * context's bucket; a batch with runs for the prefill kernel (their tiles set its launches) or with
     * token masks (their rows set the score kernel's) eager */
    if (x->graphs && T <= GRAPH_MAX_TOKENS && n_out == T && x->n_runs == 0 && x->n_tl == 0) {
        max_ctx = ctx_bucket(x, max_ctx);
        st = run_graphed(x, T, max_ctx, err);
    } else {
        st = launch_step(x, T, n_out, max_ctx, err);
    }
    if (!st) st = tokens_scores(x, err);
    if (st || n_out == 0) return st;
    if (b->argmax && x->argmax) {
        /* the ids into x->ids (n_out <= T ints): the step has read its tokens from there already, and the
         * next step uploads its own before its first launch */
        int nv = hp->n_vocab;
        void *a[] = {&x->ids, &x->logits, &nv};
        if ((st = hr_cuda_launch(x->dev, "hr_k_argmax_rows", (unsigned)n_out, 1, THREADS, a, err))) return st;
        return hr_cuda_download(x->dev, b->argmax, x->ids, (size_t)n_out * sizeof(int32_t), err);
    }
    return hr_cuda_download(x->dev, logits, x->logits, (size_t)n_out * hp->n_vocab * sizeof(float), err);
}

static bool token_level(const cuda_ctx *x, hr_kv_seq seq) {
    int nb, mw;
    bool acc;
    return hr_kv_seq_token_mask(x->kv, seq, 0, &nb, &mw, &acc) != NULL;
}

/* where a piece of b from token `from` ends: before the token that would bring it a (tl_cap + 1)-th
 * sequence under a token-level policy (the device holds tl_cap sequences' masks and scores) */
static int piece_end(const cuda_ctx *x, const hr_batch *b, int from) {
    int n = 0;
    for (int t = from; t < b->n_tokens; t++) {
        if (!token_level(x, b->seq[t])) continue;
        bool seen = false;
        for (int r = from; r < t && !seen; r++) seen = b->seq[r] == b->seq[t];
        if (!seen && ++n > x->tl_cap) return t;
    }
    return b->n_tokens;
}

/* A batch with more sequences under h2o/snapkv than the device holds runs as consecutive pieces, each
 * a forward of its own (its logits after the previous piece's). A sequence cut between two pieces is
 * still right: the first piece's K/V are in the cache before the second attends (a batch lists a
 * sequence's tokens in position order). */
static hr_status cuda_forward(hr_model_ctx *c, const hr_batch *b, float *logits, hr_error *err) {
    cuda_ctx *x = (cuda_ctx *)(void *)c;
    hr_status st = check_batch(x, b, err);
    for (int from = 0, out = 0; !st && from < b->n_tokens;) {
        const int to = piece_end(x, b, from);
        if (from == 0 && to == b->n_tokens) return forward_batch(x, b, logits, err);
        const hr_batch p = {.n_tokens = to - from,
                            .tokens = b->tokens + from,
                            .pos = b->pos + from,
                            .seq = b->seq + from,
                            .want_logits = b->want_logits ? b->want_logits + from : NULL,
                            .argmax = b->argmax ? b->argmax + out : NULL};
        st = forward_batch(x, &p, logits ? logits + (size_t)out * x->m->hp.n_vocab : NULL, err);
        for (int t = from; t < to; t++) out += b->want_logits && b->want_logits[t];
        from = to;
    }
    return st;
}

static const char *cuda_isa(const hr_model_ctx *c) { return "sm_90a"; }
static int cuda_n_threads(const hr_model_ctx *c) { return hr_threadpool_size(((const cuda_ctx *)(const void *)c)->tp); }
static void cuda_run_items(hr_model_ctx *c, hr_model_item_fn fn, void *user, int64_t n) {
    hr_threadpool_run_items(((cuda_ctx *)(void *)c)->tp, fn, user, n);
}
static bool cuda_argmax(const hr_model_ctx *c) { return ((const cuda_ctx *)(const void *)c)->argmax; }

bool hr_cuda_backend_set_argmax(hr_model_ctx *ctx, bool on) {
    if (!ctx || hr_backend_of(ctx) != &hr_backend_cuda) return false;
    ((cuda_ctx *)(void *)ctx)->argmax = on;
    return on;
}

const hr_backend_ops hr_backend_cuda = {
    .name = "cuda",
    .create = cuda_create,
    .destroy = cuda_destroy,
    .forward = cuda_forward,
    .isa = cuda_isa,
    .n_threads = cuda_n_threads,
    .argmax = cuda_argmax,
    .run_items = cuda_run_items,
    /* the workers asleep through the GPU's forward pass: on 2 CPUs the wake-up paid only from 64 rows
     * of 128,256 (1.4-1.6x; 32 rows: 0.9x); check.sh's bench_sampler measures the GPU's host */
    .run_items_min = 64 * 128000,
    /* weights and activations live on the GPU: host memory for them is none beyond the model's own
     * copy, which the runtime's plan counts already */
    .weight_bytes = NULL,
    .scratch_bytes = NULL,
};

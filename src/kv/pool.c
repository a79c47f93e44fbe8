/* pool.c: the pool: its sizes from a config, create (the manager's metadata and the storage that
 * holds the bytes, both sized once from the budget) and destroy, and the sequence operations
 * (create, reserve, free, reset, fork). Block states and lists are block.c's.
 *
 * Eviction policies (policy*.c) release single blocks from the middle of a table and leave a hole
 * (-1) in their place: positions stay logical, so reserve, commit and the waste figure work
 * unchanged; every walk over a table here skips holes. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/isa.h"
#include "backend/cpu/kv_storage_cpu.h"
#include "common/util.h"
#include "kv/kv_internal.h"

/* ---- sizes --------------------------------------------------------------------------------------- */

/* A latent cache (v_from_k): V is read from K's bytes by V's kernels, which holds where a format lays
 * K and V out alike, token by token (f32, f16, bf16, q8, fp8); q4 and kivi2 quantize K per channel over
 * a block, q4h stores K rotated. */
static hr_status kv_check_latent(const hr_kv_config *cfg, const kv_fmt *kf, hr_error *err) {
    if (cfg->v_from_k < 0 || cfg->v_from_k > cfg->head_dim)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "KV v_from_k must be 0..head_dim (%d), got %d", cfg->head_dim,
                            cfg->v_from_k);
    if (kf->deferred || kf->rotate || kf->per_channel)
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "KV format %s cannot hold a latent cache (multi-head latent attention reads V from K's "
                            "bytes; %s stores K %s): use f16, bf16, f32, q8 or fp8",
                            hr_kv_format_name(cfg->k_format), hr_kv_format_name(cfg->k_format),
                            kf->rotate ? "rotated" : "per channel over a block");
    if (cfg->v_format != cfg->k_format)
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "a latent KV cache stores V inside K: V's format (%s) must be K's (%s)",
                            hr_kv_format_name(cfg->v_format), hr_kv_format_name(cfg->k_format));
    return HR_OK;
}

static hr_status kv_check_config(const hr_kv_config *cfg, kv_fmt *kf, kv_fmt *vf, hr_error *err) {
    if (!cfg) return hr_error_set(err, HR_ERR_INVALID_ARG, "KV config is NULL");
    if (cfg->n_layers < 1 || cfg->n_layers > 4096)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "KV n_layers must be 1..4096, got %d", cfg->n_layers);
    if (cfg->n_kv_heads < 1 || cfg->n_kv_heads > 1024)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "KV n_kv_heads must be 1..1024, got %d", cfg->n_kv_heads);
    if (cfg->head_dim < 1 || cfg->head_dim > KV_MAX_HEAD_DIM)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "KV head_dim must be 1..%d, got %d", KV_MAX_HEAD_DIM,
                            cfg->head_dim);
    if (cfg->block_size < 8 || cfg->block_size > 256)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "KV block_size must be 8..256 tokens, got %d (16 is usual)",
                            cfg->block_size);
    if (cfg->max_seqs < 1 || cfg->max_seqs > (1 << 20))
        return hr_error_set(err, HR_ERR_INVALID_ARG, "KV max_seqs must be 1..1048576, got %d", cfg->max_seqs);
    if (cfg->stage_blocks < 0 || cfg->stage_blocks > (1 << 22))
        return hr_error_set(err, HR_ERR_INVALID_ARG, "KV stage_blocks must be 0..4194304, got %d", cfg->stage_blocks);
    if (cfg->max_step_tokens < 0 || cfg->max_step_tokens > (1 << 24))
        return hr_error_set(err, HR_ERR_INVALID_ARG, "KV max_step_tokens must be 0..16777216, got %d",
                            cfg->max_step_tokens);
    for (int l = 0; cfg->layer_window && l < cfg->n_layers; l++)
        if (cfg->layer_window[l] < 0)
            return hr_error_set(err, HR_ERR_INVALID_ARG, "KV layer %d: sliding window %d (>= 0, 0 = full attention)", l,
                                cfg->layer_window[l]);
    hr_status rc = kv_fmt_init(kf, cfg->k_format, KV_K, cfg->block_size, cfg->head_dim, err);
    if (rc == HR_OK) rc = kv_fmt_init(vf, cfg->v_format, KV_V, cfg->block_size, cfg->head_dim, err);
    if (rc == HR_OK && cfg->v_from_k) rc = kv_check_latent(cfg, kf, err);
    if (rc != HR_OK) hr_error_prefix(err, "KV config");
    return rc;
}

/* ---- layer groups ------------------------------------------------------------------------------- */

static int kv_gcd(int a, int b) {
    while (b) {
        int t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static int kv_cfg_window(const hr_kv_config *cfg, int l) { return cfg->layer_window ? cfg->layer_window[l] : 0; }

/* The grouping of a checked config (see kv.h): kinds in order of their first layer, G the gcd of
 * their counts; one group of every layer for one kind, or where the kinds or groups would be too
 * many. */
static void kv_layout_of(const hr_kv_config *cfg, const kv_fmt *kf, const kv_fmt *vf, hr_kv_groups *lay) {
    memset(lay, 0, sizeof *lay);
    bool one = false;
    for (int l = 0; l < cfg->n_layers && !one; l++) {
        int w = kv_cfg_window(cfg, l), k = 0;
        while (k < lay->n_kinds && lay->kinds[k].window != w) k++;
        if (k == HR_KV_MAX_KINDS) {
            one = true;
            break;
        }
        if (k == lay->n_kinds) lay->kinds[lay->n_kinds++].window = w;
        lay->kinds[k].n_layers++;
    }
    int G = 0, n_groups = 0;
    for (int k = 0; k < lay->n_kinds && !one; k++) G = kv_gcd(G, lay->kinds[k].n_layers);
    if (!one && G > 0) n_groups = cfg->n_layers / G;
    if (one || lay->n_kinds <= 1 || n_groups > HR_KV_MAX_GROUPS) {
        /* one group of every layer, windows applied per layer by attention and eviction as before */
        int w0 = kv_cfg_window(cfg, 0);
        bool same = true;
        for (int l = 0; l < cfg->n_layers; l++) same &= kv_cfg_window(cfg, l) == w0;
        lay->n_kinds = 1; /* a mix fallen back to one group is counted as full: a full layer keeps all */
        lay->kinds[0] = (hr_kv_kind_info){.window = same ? w0 : 0, .n_layers = cfg->n_layers, .n_groups = 1};
        G = cfg->n_layers;
        n_groups = 1;
        lay->group_kind[0] = 0;
    } else {
        int g = 0;
        for (int k = 0; k < lay->n_kinds; k++) {
            lay->kinds[k].n_groups = lay->kinds[k].n_layers / G;
            for (int i = 0; i < lay->kinds[k].n_groups; i++) lay->group_kind[g++] = (int8_t)k;
        }
    }
    lay->n_groups = n_groups;
    lay->slots = G;
    /* a latent cache (v_from_k) stores K only: DeepSeek-V3's (512 + 64) f16 x 61 layers = 70,272 bytes a token */
    uint64_t layer_block = (uint64_t)cfg->n_kv_heads * (kf->head_bytes + (cfg->v_from_k ? 0 : vf->head_bytes));
    lay->block_bytes = (uint64_t)G * layer_block;
    lay->group_token_bytes = lay->block_bytes / (uint64_t)cfg->block_size;
    for (int k = 0; k < lay->n_kinds; k++) {
        /* a latent cache's layers are MLA's whole-context ones: reported as "latent", not "full" */
        lay->kinds[k].latent = cfg->v_from_k > 0 && lay->kinds[k].window == 0;
        lay->kinds[k].token_bytes = (uint64_t)lay->kinds[k].n_layers * layer_block / (uint64_t)cfg->block_size;
    }
}

/* Layer l's group and slot under lay (the i-th layer of its kind: group base + i / G, slot i % G). */
static void kv_layer_place(const hr_kv_config *cfg, const hr_kv_groups *lay, int l, int *group, int *slot) {
    if (lay->n_groups == 1) {
        *group = 0, *slot = l;
        return;
    }
    int w = kv_cfg_window(cfg, l), k = 0, base = 0, rank = 0;
    while (lay->kinds[k].window != w) base += lay->kinds[k++].n_groups;
    for (int i = 0; i < l; i++) rank += kv_cfg_window(cfg, i) == w;
    *group = base + rank / lay->slots;
    *slot = rank % lay->slots;
}

hr_status hr_kv_config_groups(const hr_kv_config *cfg, hr_kv_groups *out, hr_error *err) {
    kv_fmt kf, vf;
    hr_status rc = kv_check_config(cfg, &kf, &vf, err);
    if (rc == HR_OK) kv_layout_of(cfg, &kf, &vf, out);
    return rc;
}

static int64_t kv_floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

/* Blocks one group of `window` (0: full) holds when a reservation reaches m slots: a full group every
 * block; a window group the blocks from the first one its window still saw before the step (the
 * commit that frees older ones comes after) up to block ceil(m / B), most with the largest chunk a
 * step writes (max_step_tokens, 0: 512). */
static int64_t kv_group_blocks_at(const hr_kv_config *cfg, int window, int64_t m) {
    int64_t B = cfg->block_size, C = cfg->max_step_tokens > 0 ? cfg->max_step_tokens : 512;
    int64_t all = (m + B - 1) / B;
    if (window <= 0) return all;
    return HR_MIN(all, all - kv_floor_div(m - C + 1 - window, B));
}

/* Blocks one sequence of n_tokens slots holds at most in the groups of `kind` (-1: every group): the
 * largest total over its life, which is reached with a reservation ending in the last block of
 * positions (n - B, n] (B positions earlier cost a full block and gain nothing: the window counts
 * repeat with period B); the kinds' figures are those of that moment, so they add up to the total. */
static int64_t kv_blocks_at(const hr_kv_config *cfg, const hr_kv_groups *lay, int kind, int64_t n_tokens) {
    if (n_tokens <= 0) return 0;
    if (lay->n_groups == 1) return kind <= 0 ? (n_tokens + cfg->block_size - 1) / cfg->block_size : 0;
    int64_t best = -1, best_kind = 0;
    for (int64_t m = HR_MAX(1, n_tokens - cfg->block_size + 1); m <= n_tokens; m++) {
        int64_t total = 0, of_kind = 0;
        for (int k = 0; k < lay->n_kinds; k++) {
            int64_t n = kv_group_blocks_at(cfg, lay->kinds[k].window, m) * lay->kinds[k].n_groups;
            total += n;
            if (k == kind) of_kind = n;
        }
        if (total > best) best = total, best_kind = of_kind;
    }
    return kind < 0 ? best : best_kind;
}

int64_t hr_kv_seq_blocks_at(const hr_kv_config *cfg, int64_t n_tokens) {
    hr_kv_groups lay;
    if (hr_kv_config_groups(cfg, &lay, NULL) != HR_OK) return 0;
    return kv_blocks_at(cfg, &lay, -1, n_tokens);
}

int64_t hr_kv_kind_blocks_at(const hr_kv_config *cfg, int kind, int64_t n_tokens) {
    hr_kv_groups lay;
    if (kind < 0 || hr_kv_config_groups(cfg, &lay, NULL) != HR_OK || kind >= lay.n_kinds) return 0;
    return kv_blocks_at(cfg, &lay, kind, n_tokens);
}

uint64_t hr_kv_block_bytes(const hr_kv_config *cfg) {
    hr_kv_groups lay;
    if (hr_kv_config_groups(cfg, &lay, NULL) != HR_OK) return 0;
    return lay.block_bytes;
}

uint64_t hr_kv_stage_block_bytes(const hr_kv_config *cfg) {
    kv_fmt kf, vf;
    if (kv_check_config(cfg, &kf, &vf, NULL) != HR_OK) return 0;
    if (!kf.deferred && !vf.deferred) return 0;
    hr_kv_groups lay;
    kv_layout_of(cfg, &kf, &vf, &lay);
    return (uint64_t)lay.slots * 2 * cfg->n_kv_heads * cfg->block_size * cfg->head_dim * 2;
}

int hr_kv_stage_blocks_for(int block_size, int max_step_tokens, int max_seqs) {
    if (block_size < 1) return 0;
    int64_t step = max_step_tokens > 0 ? max_step_tokens : 512;
    int64_t n = (step + block_size - 1) / block_size + (int64_t)HR_MAX(max_seqs, 1) + 1;
    return n > (1 << 22) ? 1 << 22 : (int)n;
}

/* The tail buffers: as asked, or enough for a step (one set per layer group: each group's block being
 * filled holds its own, of G slots, so the bytes are those of one group of every layer) */
static int kv_n_stage(const hr_kv_config *cfg) {
    if (cfg->stage_blocks > 0) return cfg->stage_blocks;
    hr_kv_groups lay;
    int ng = hr_kv_config_groups(cfg, &lay, NULL) == HR_OK ? lay.n_groups : 1;
    int64_t n = (int64_t)hr_kv_stage_blocks_for(cfg->block_size, cfg->max_step_tokens, cfg->max_seqs) * ng;
    return n > (1 << 22) ? 1 << 22 : (int)n;
}

uint64_t hr_kv_fixed_bytes(const hr_kv_config *cfg) { return hr_kv_stage_block_bytes(cfg) * (uint64_t)kv_n_stage(cfg); }

hr_status hr_kv_config_check(const hr_kv_config *cfg, hr_error *err) {
    kv_fmt kf, vf;
    return kv_check_config(cfg, &kf, &vf, err);
}

/* The manager's bookkeeping beside the storage, one size per table hr_kv_pool_create allocates for n
 * blocks: create allocates exactly these, and hr_kv_pool_meta_bytes adds them up (with the storage's
 * own tables), so the budget's figure is the allocation's. */
#define KV_ELEM(field) sizeof(((const hr_kv_pool *)0)->field[0])
typedef struct kv_meta_sizes {
    size_t refcnt, state, flags, hash, parent, tokens, prev, next; /* per block */
    size_t blk_stage, stage_free, map;
    size_t seqs, pending;           /* per sequence slot */
    size_t native_window, layer_gs; /* per layer */
    size_t blk_group;               /* per block */
} kv_meta_sizes;

static void kv_meta_sizes_of(const hr_kv_config *cfg, int n_blocks, kv_meta_sizes *m) {
    size_t n = (size_t)HR_MAX(0, n_blocks), B = (size_t)cfg->block_size, S = (size_t)cfg->max_seqs;
    bool staged = hr_kv_fixed_bytes(cfg) > 0;
    *m = (kv_meta_sizes){.refcnt = n * KV_ELEM(refcnt),
                         .state = n * KV_ELEM(state),
                         .flags = n * KV_ELEM(flags),
                         .hash = n * KV_ELEM(hash),
                         .parent = n * KV_ELEM(parent),
                         .tokens = n * B * KV_ELEM(tokens),
                         .prev = n * KV_ELEM(prev),
                         .next = n * KV_ELEM(next),
                         .blk_stage = n * KV_ELEM(blk_stage),
                         .stage_free = ((size_t)(staged ? kv_n_stage(cfg) : 0) + 1) * KV_ELEM(stage_free),
                         .map = (size_t)kv_prefix_map_slots(n_blocks) * KV_ELEM(map),
                         .seqs = S * KV_ELEM(seqs),
                         .pending = S * B * KV_ELEM(pending),
                         .native_window = (size_t)cfg->n_layers * KV_ELEM(native_window),
                         .layer_gs = (size_t)cfg->n_layers * 3 * KV_ELEM(layer_gs),
                         .blk_group = n * KV_ELEM(blk_group)};
}

uint64_t hr_kv_pool_meta_bytes(const hr_kv_config *cfg, int n_blocks) {
    if (hr_kv_block_bytes(cfg) == 0) return 0;
    kv_meta_sizes m;
    kv_meta_sizes_of(cfg, n_blocks, &m);
    /* the CPU storage's own host tables (another storage keeps its bookkeeping where its bytes are) */
    hr_kv_groups lay;
    hr_kv_config_groups(cfg, &lay, NULL);
    uint64_t st =
        cfg->storage ? 0 : hr_kv_storage_cpu_meta_bytes(lay.slots, hr_kv_fixed_bytes(cfg) > 0 ? kv_n_stage(cfg) : 0);
    return sizeof(hr_kv_pool) + m.refcnt + m.state + m.flags + m.hash + m.parent + m.tokens + m.prev + m.next +
           m.blk_stage + m.stage_free + m.map + m.seqs + m.pending + m.native_window + m.layer_gs + m.blk_group + st;
}

uint64_t hr_kv_seq_table_bytes(const hr_kv_config *cfg, int n_tokens) {
    if (cfg->block_size < 1 || n_tokens < 1) return 0;
    int n = (int)(((int64_t)n_tokens + cfg->block_size - 1) / cfg->block_size);
    hr_kv_groups lay;
    if (hr_kv_config_groups(cfg, &lay, NULL) != HR_OK) return 0;
    /* a row per group, and several groups' holes and eviction marks */
    return (uint64_t)kv_table_cap(n) * sizeof(int32_t) * (uint64_t)lay.n_groups +
           (lay.n_groups > 1 ? 2 * (uint64_t)lay.n_groups * sizeof(int32_t) : 0);
}

/* ---- create / destroy ---------------------------------------------------------------------------- */

/* The kernels the CPU storage runs: the tree's one CPU-feature dispatcher (backend/cpu/isa.h) given
 * cfg->isa (the run's --isa; NULL: the best this CPU has), clamped to what the CPU has. A name the
 * dispatcher does not know goes to the storage as it is, which refuses it. */
static const char *kv_default_isa(const hr_kv_config *cfg) {
    if (cfg->force_scalar) return "scalar";
    hr_cpu_isa isa;
    if (cfg->isa && strcmp(cfg->isa, "auto") != 0 && !hr_cpu_isa_parse(cfg->isa, &isa)) return cfg->isa;
    return hr_cpu_isa_name(hr_cpu_isa_select(cfg->isa));
}

hr_status hr_kv_pool_create(const hr_kv_config *cfg, hr_kv_pool **out, hr_error *err) {
    kv_fmt kf, vf;
    hr_status rc = kv_check_config(cfg, &kf, &vf, err);
    if (rc != HR_OK) return rc;
    hr_kv_groups lay;
    kv_layout_of(cfg, &kf, &vf, &lay);
    uint64_t block_bytes = lay.block_bytes;
    uint64_t fixed = hr_kv_fixed_bytes(cfg);
    if (cfg->budget_bytes < fixed + block_bytes) {
        char b1[32], b2[32], b3[32];
        hr_format_size(cfg->budget_bytes, b1, sizeof b1);
        hr_format_size(block_bytes, b2, sizeof b2);
        hr_format_size(fixed + block_bytes, b3, sizeof b3);
        return hr_error_set(err, HR_ERR_BUDGET,
                            "KV budget %s holds no block: one block of %d tokens (%d layers, K %s, V %s) takes %s"
                            "%s; the smallest budget that fits one block is %s (%llu bytes); raise the budget, "
                            "or use a smaller block_size or format",
                            b1, cfg->block_size, lay.slots, hr_kv_format_name(cfg->k_format),
                            hr_kv_format_name(cfg->v_format), b2,
                            fixed ? " plus f16 tail buffers (stage_blocks) for the blocks being filled" : "", b3,
                            (unsigned long long)(fixed + block_bytes));
    }
    uint64_t nb = (cfg->budget_bytes - fixed) / block_bytes;
    if (nb > (1u << 30)) nb = 1u << 30;

    hr_kv_pool *p = calloc(1, sizeof *p);
    if (!p) return hr_error_set(err, HR_ERR_NOMEM, "KV pool: out of memory for the pool header");
    p->cfg = *cfg;
    p->lay = lay;
    p->n_groups = lay.n_groups;
    p->n_blocks = (int)nb;
    p->kf = kf;
    p->vf = vf;
    kv_fmt_init(&p->sf, HR_KV_F16, KV_K, cfg->block_size, cfg->head_dim, NULL);
    p->block_bytes = block_bytes;
    p->stage_slot_bytes = hr_kv_stage_block_bytes(cfg);
    p->n_stage = fixed ? kv_n_stage(cfg) : 0;

    /* the bytes: blocks and tail buffers in the storage, sized once here; it never grows */
    hr_kv_storage_params sp = {.n_layers = lay.slots, /* the storage sees G layer slots per block */
                               .n_kv_heads = cfg->n_kv_heads,
                               .head_dim = cfg->head_dim,
                               .block_size = cfg->block_size,
                               .k = kf,
                               .v = vf,
                               .stage = p->sf,
                               .n_blocks = p->n_blocks,
                               .n_stage = p->n_stage,
                               .prefault = cfg->prefault,
                               .v_from_k = cfg->v_from_k,
                               .isa = kv_default_isa(cfg)};
    rc = cfg->storage ? cfg->storage(cfg->storage_user, &sp, &p->st, err) : hr_kv_storage_cpu_create(&sp, &p->st, err);
    if (rc != HR_OK) {
        free(p);
        return rc;
    }
    KV_ASSERT(p->st->ops->footprint(p->st) <= cfg->budget_bytes);

    int n = p->n_blocks;
    kv_meta_sizes ms; /* what hr_kv_pool_meta_bytes counts */
    kv_meta_sizes_of(cfg, n, &ms);
    p->refcnt = calloc(1, ms.refcnt);
    p->state = calloc(1, ms.state);
    p->flags = calloc(1, ms.flags);
    p->hash = calloc(1, ms.hash);
    p->parent = calloc(1, ms.parent);
    p->tokens = calloc(1, ms.tokens);
    p->prev = malloc(ms.prev);
    p->next = malloc(ms.next);
    p->seqs = calloc(1, ms.seqs);
    p->pending = calloc(1, ms.pending);
    p->blk_stage = malloc(ms.blk_stage);
    p->stage_free = malloc(ms.stage_free);
    p->native_window = calloc(1, ms.native_window);
    p->layer_gs = malloc(ms.layer_gs);
    p->blk_group = calloc(1, ms.blk_group);
    p->default_pol = (hr_kv_policy){.kind = HR_KV_POLICY_FULL};
    bool ok = p->refcnt && p->state && p->flags && p->hash && p->parent && p->tokens && p->prev && p->next && p->seqs &&
              p->pending && p->blk_stage && p->stage_free && p->native_window && p->layer_gs && p->blk_group &&
              kv_prefix_map_init(p);
    if (!ok) {
        hr_kv_pool_destroy(p);
        return hr_error_set(err, HR_ERR_NOMEM, "KV pool: out of memory for the metadata of %d blocks", n);
    }
    for (int l = 0; l < cfg->n_layers; l++) {
        p->native_window[l] = kv_cfg_window(cfg, l);
        p->layer_gs[2 * cfg->n_layers + l] = kv_cfg_window(cfg, l);
        kv_layer_place(cfg, &lay, l, &p->layer_gs[2 * l], &p->layer_gs[2 * l + 1]);
    }
    /* the config's windows were borrowed: the pool's copy (fixed, unlike native_window, which
     * hr_kv_pool_set_sliding_window may still set on a one-group pool) */
    p->cfg.layer_window = cfg->layer_window ? p->layer_gs + 2 * cfg->n_layers : NULL;
    kv_blocks_init(p);
    for (int k = 0; k < HR_KV_MAX_KINDS; k++) atomic_init(&p->kind_used[k], 0);
    atomic_init(&p->window_freed, 0);
    atomic_init(&p->waste_slots, 0);
    atomic_init(&p->prefix_hits, 0);
    atomic_init(&p->evicted, 0);
    atomic_init(&p->bytes_swapped, 0);
    atomic_init(&p->policy_evicted, 0);
    atomic_init(&p->fetched_tokens, 0);
    *out = p;
    return HR_OK;
}

void hr_kv_pool_destroy(hr_kv_pool *p) {
    if (!p) return;
    if (p->seqs) {
        for (int i = 0; i < p->cfg.max_seqs; i++) {
            free(p->seqs[i].table);
            free(p->seqs[i].ghole);
            free(p->seqs[i].mask);
            free(p->seqs[i].score);
            if (p->seqs[i].swapped) kv_swap_drop(p, &p->seqs[i]);
        }
    }
    if (p->st) p->st->ops->destroy(p->st);
    free(p->refcnt);
    free(p->state);
    free(p->flags);
    free(p->hash);
    free(p->parent);
    free(p->tokens);
    free(p->prev);
    free(p->next);
    free(p->seqs);
    free(p->pending);
    free(p->blk_stage);
    free(p->stage_free);
    free(p->map);
    free(p->fetch_buf);
    free(p->native_window);
    free(p->layer_gs);
    free(p->blk_group);
    free(p);
}

const hr_kv_config *hr_kv_pool_config(const hr_kv_pool *p) { return &p->cfg; }
int hr_kv_pool_n_blocks(const hr_kv_pool *p) { return p->n_blocks; }
const char *hr_kv_pool_isa(const hr_kv_pool *p) { return p->st->ops->isa(p->st); }
const hr_kv_storage *hr_kv_pool_storage(const hr_kv_pool *p) { return p->st; }
hr_kv_storage *hr_kv_pool_storage_rw(hr_kv_pool *p) { return p->st; }
const hr_kv_groups *hr_kv_pool_groups(const hr_kv_pool *p) { return &p->lay; }
int64_t hr_kv_pool_seq_blocks(const hr_kv_pool *p, int64_t n_tokens) {
    return kv_blocks_at(&p->cfg, &p->lay, -1, n_tokens);
}

int64_t hr_kv_seq_claim_blocks(const hr_kv_pool *p, hr_kv_seq seq, int64_t n_slots, int64_t claim) {
    int64_t want = hr_kv_pool_seq_blocks(p, claim), held;
    if (p->n_groups == 1)
        held = hr_kv_pool_seq_blocks(p, n_slots);
    else if (kv_seq_valid(p, seq) && !p->seqs[seq].swapped)
        held = (int64_t)p->seqs[seq].n_table * p->n_groups - p->seqs[seq].n_holes;
    else
        held = 0;
    return want > held ? want - held : 0;
}

/* ---- sequences ----------------------------------------------------------------------------------- */

hr_status hr_kv_seq_create(hr_kv_pool *p, hr_kv_seq *out, hr_error *err) {
    for (int i = 0; i < p->cfg.max_seqs; i++) {
        kv_seq *s = &p->seqs[i];
        if (s->active) continue;
        int32_t *table = s->table, *ghole = s->ghole;
        int cap = s->cap, meta_cap = s->meta_cap;
        uint64_t *mask = s->mask;
        atomic_uint_fast64_t *score = s->score;
        if (p->n_groups > 1 && !ghole && !(ghole = calloc(2 * (size_t)p->n_groups, sizeof *ghole)))
            return hr_error_set(err, HR_ERR_NOMEM, "KV: out of memory for a sequence's %d group rows", p->n_groups);
        memset(s, 0, sizeof *s);
        s->table = table; /* keep the allocations of the previous user of this slot */
        s->cap = cap;
        s->ghole = ghole;
        if (ghole) memset(ghole, 0, 2 * (size_t)p->n_groups * sizeof *ghole);
        s->mask = mask;
        s->score = score;
        s->meta_cap = meta_cap;
        s->pol = p->default_pol;
        s->active = true;
        s->last_hash = kv_prefix_root(p);
        *out = i;
        return HR_OK;
    }
    return hr_error_set(err, HR_ERR_FULL, "KV: all %d sequence slots are in use (max_seqs); retry later",
                        p->cfg.max_seqs);
}

int hr_kv_seq_n_tokens(const hr_kv_pool *p, hr_kv_seq seq) { return kv_seq_valid(p, seq) ? p->seqs[seq].n_tokens : 0; }

/* Tail buffers that writing tokens up to n_tokens needs beyond those held: in every group, one for
 * each block from the first one not yet full up to the last one those tokens reach that has none (new
 * blocks included). */
static int kv_stage_need(const hr_kv_pool *p, const kv_seq *s, int need_blocks) {
    if (!kv_deferred(p)) return 0;
    int n = 0;
    for (int g = 0; g < p->n_groups; g++) {
        const int32_t *t = kv_tab(s, g);
        for (int i = s->n_tokens / p->cfg.block_size; i < need_blocks; i++)
            n += i >= s->n_table || (t[i] >= 0 && p->blk_stage[t[i]] < 0);
    }
    return n;
}

int hr_kv_seq_stage_need(const hr_kv_pool *p, hr_kv_seq seq, int n_tokens) {
    if (!kv_seq_valid(p, seq) || n_tokens <= 0) return 0;
    return kv_stage_need(p, &p->seqs[seq], (int)(((int64_t)n_tokens + p->cfg.block_size - 1) / p->cfg.block_size));
}

int hr_kv_pool_n_stage(const hr_kv_pool *p) { return p->n_stage; }
int hr_kv_pool_n_stage_free(const hr_kv_pool *p) { return p->n_stage_free; }

/* Grows the table to n_tokens slots (every group's row); with `writable`, also gives every block those
 * tokens reach (from the first one not yet full) a tail buffer. Plan first, then commit: on refusal
 * nothing changed. */
static hr_status kv_seq_reserve(hr_kv_pool *p, hr_kv_seq seq, int n_tokens, bool writable, hr_error *err) {
    if (!kv_seq_valid(p, seq)) return hr_error_set(err, HR_ERR_INVALID_ARG, "KV reserve: %d is not a sequence", seq);
    kv_seq *s = &p->seqs[seq];
    if (s->swapped)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "KV reserve: sequence %d is swapped out; swap it in first", seq);
    int B = p->cfg.block_size;
    if (n_tokens < 0) return hr_error_set(err, HR_ERR_INVALID_ARG, "KV reserve: n_tokens %d < 0", n_tokens);
    int need_blocks = (int)(((int64_t)n_tokens + B - 1) / B);
    int add = need_blocks - s->n_table;
    int stage = writable ? kv_stage_need(p, s, need_blocks) : 0;
    if (writable && s->reserve_end == 0 && n_tokens > s->n_tokens) s->reserve_end = n_tokens; /* snapkv's default */
    if (add <= 0 && stage == 0) return HR_OK;
    int64_t add_all = add > 0 ? (int64_t)add * p->n_groups : 0; /* a block per group per position block */
    if (add_all > hr_kv_pool_n_free(p))
        return hr_error_set(err, HR_ERR_FULL,
                            "KV reserve: %lld more blocks needed for %d tokens, %d free or evictable of %d",
                            (long long)add_all, n_tokens, hr_kv_pool_n_free(p), p->n_blocks);
    if (stage > p->n_stage_free)
        return hr_error_set(err, HR_ERR_FULL,
                            "KV reserve: %d blocks to fill need f16 tail buffers, %d of %d free (stage_blocks); "
                            "retry after commits or raise stage_blocks",
                            stage, p->n_stage_free, p->n_stage);
    if (add > 0) {
        hr_status rc = kv_table_reserve(p, s, need_blocks, err);
        if (rc == HR_OK) rc = kv_policy_meta_grow(p, s, need_blocks, err);
        if (rc != HR_OK) return rc;
        for (int i = 0; i < add; i++, s->n_table++)
            for (int g = 0; g < p->n_groups; g++) kv_tab(s, g)[s->n_table] = kv_block_alloc(p, g);
        atomic_fetch_add_explicit(&p->waste_slots, (uint64_t)add * B, memory_order_relaxed);
    }
    for (int g = 0; g < p->n_groups && stage > 0; g++) {
        int32_t *t = kv_tab(s, g);
        for (int i = s->n_tokens / B; i < need_blocks; i++)
            if (t[i] >= 0 && p->blk_stage[t[i]] < 0) kv_stage_take(p, t[i]);
    }
    kv_update_peak(p, s);
    return HR_OK;
}

hr_status hr_kv_seq_reserve(hr_kv_pool *p, hr_kv_seq seq, int n_tokens, hr_error *err) {
    return kv_seq_reserve(p, seq, n_tokens, true, err);
}

hr_status hr_kv_seq_reserve_ahead(hr_kv_pool *p, hr_kv_seq seq, int n_tokens, hr_error *err) {
    return kv_seq_reserve(p, seq, n_tokens, false, err);
}

void hr_kv_seq_reset(hr_kv_pool *p, hr_kv_seq seq) {
    if (!kv_seq_valid(p, seq)) return;
    kv_seq *s = &p->seqs[seq];
    if (s->swapped) kv_swap_drop(p, s);
    kv_seq_release_blocks(p, s);
    s->n_tokens = 0;
    s->prefix_hit_tokens = 0;
    s->last_hash = kv_prefix_root(p);
    s->meta_n = 0; /* masks and scores start again (all kept) */
    s->snap_done = false;
    s->reserve_end = 0;
}

void hr_kv_seq_free(hr_kv_pool *p, hr_kv_seq seq) {
    if (!kv_seq_valid(p, seq)) return;
    hr_kv_seq_reset(p, seq);
    p->seqs[seq].active = false;
}

hr_status hr_kv_seq_fork(hr_kv_pool *p, hr_kv_seq src, hr_kv_seq *out, hr_error *err) {
    if (!kv_seq_valid(p, src)) return hr_error_set(err, HR_ERR_INVALID_ARG, "KV fork: %d is not a sequence", src);
    kv_seq *s = &p->seqs[src];
    if (s->swapped)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "KV fork: sequence %d is swapped out; swap it in first", src);
    int B = p->cfg.block_size, NG = p->n_groups;
    int n_full = s->n_tokens / B;
    bool tail = s->n_tokens % B != 0;
    if (tail && (hr_kv_pool_n_free(p) < NG || (kv_deferred(p) && p->n_stage_free < NG)))
        return hr_error_set(err, HR_ERR_FULL, "KV fork: no free block (or tail buffer) to copy the partial tail into");
    hr_kv_seq c;
    hr_status rc = hr_kv_seq_create(p, &c, err);
    if (rc != HR_OK) return rc;
    s = &p->seqs[src];
    kv_seq *d = &p->seqs[c];
    d->pol = s->pol;
    rc = kv_table_reserve(p, d, n_full + (tail ? 1 : 0), err);
    if (rc == HR_OK) rc = kv_policy_meta_grow(p, d, s->meta_n < s->n_table ? s->meta_n : s->n_table, err);
    if (rc != HR_OK) {
        d->active = false;
        return rc;
    }
    if (kv_token_level(s) && d->meta_n > 0) { /* the child starts from the parent's masks and scores */
        size_t per = (size_t)p->cfg.n_layers * p->cfg.n_kv_heads;
        memcpy(d->mask, s->mask, (size_t)d->meta_n * per * kv_mask_words(p) * sizeof *d->mask);
        for (size_t i = 0; i < (size_t)d->meta_n * per * (size_t)B; i++)
            atomic_init(&d->score[i], atomic_load_explicit(&s->score[i], memory_order_relaxed));
    }
    for (int g = 0; g < NG; g++) {
        const int32_t *st = kv_tab(s, g);
        int32_t *dt = kv_tab(d, g);
        for (int i = 0; i < n_full; i++) {
            if (st[i] >= 0) kv_block_ref(p, st[i]);
            dt[i] = st[i];
        }
    }
    d->n_table = n_full;
    d->n_holes = s->n_holes;
    d->evict_from = s->evict_from;
    if (NG > 1) memcpy(d->ghole, s->ghole, 2 * (size_t)NG * sizeof *d->ghole);
    d->reserve_end = s->reserve_end;
    d->prompt_len = s->prompt_len;
    d->snap_done = s->snap_done;
    if (tail) {
        for (int g = 0; g < NG; g++) {
            int32_t from = kv_tab(s, g)[n_full], to = kv_block_alloc(p, g);
            p->st->ops->copy_block(p->st, from, to); /* the partial tail is the child's own copy */
            if (kv_deferred(p) && p->blk_stage[from] >= 0) {
                int32_t slot = kv_stage_take(p, to);
                p->st->ops->stage_copy(p->st, p->blk_stage[from], slot);
            }
            kv_tab(d, g)[n_full] = to;
        }
        d->n_table++;
    }
    memcpy(p->pending + (size_t)c * B, p->pending + (size_t)src * B, (size_t)B * sizeof *p->pending);
    d->n_tokens = s->n_tokens;
    d->last_hash = s->last_hash;
    d->scope = s->scope;
    d->prefix_hit_tokens = s->prefix_hit_tokens;
    atomic_fetch_add_explicit(&p->waste_slots, (uint64_t)d->n_table * B - (uint64_t)d->n_tokens, memory_order_relaxed);
    kv_update_peak(p, d);
    *out = c;
    return HR_OK;
}

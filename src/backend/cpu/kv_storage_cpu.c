/* kv_storage_cpu.c: the CPU KV storage: one page-aligned anonymous mapping for every layer's blocks
 * and the f16 tail buffers (allocated at create, never grown), the kernel table for the chosen ISA,
 * and the whole-block and tail-buffer copies the manager asks for (swap, the remote tier, fork).
 * Writes and attention are in kv_attention.c, the format kernels in kv_format*.c. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/cpu/kv_cpu.h"
#include "backend/cpu/kv_storage_cpu.h"
#include "common/util.h"

static void cpu_destroy(hr_kv_storage *st) {
    kv_cpu *p = (kv_cpu *)st;
    if (!p) return;
    if (p->arena) munmap(p->arena, p->arena_bytes);
    free(p->filled);
    free(p);
}

static const char *cpu_isa(const hr_kv_storage *st) { return ((const kv_cpu *)st)->avx2 ? "avx2" : "scalar"; }

static uint64_t cpu_footprint(const hr_kv_storage *st) { return ((const kv_cpu *)st)->arena_bytes; }

/* The block's bytes as one run: layer by layer, K then V (HR_KV_BLOCK_LAYOUT). */
static void cpu_read_block(const hr_kv_storage *st, int32_t b, void *out) {
    const kv_cpu *p = (const kv_cpu *)st;
    uint8_t *o = out;
    for (int l = 0; l < p->L; l++) {
        memcpy(o, kv_block_ptr(p, l, KV_K, b), p->k_block_bytes);
        o += p->k_block_bytes;
        memcpy(o, kv_block_ptr(p, l, KV_V, b), p->v_block_bytes);
        o += p->v_block_bytes;
    }
}

static void cpu_write_block(hr_kv_storage *st, int32_t b, const void *in) {
    kv_cpu *p = (kv_cpu *)st;
    const uint8_t *i = in;
    for (int l = 0; l < p->L; l++) {
        memcpy(kv_block_ptr(p, l, KV_K, b), i, p->k_block_bytes);
        i += p->k_block_bytes;
        memcpy(kv_block_ptr(p, l, KV_V, b), i, p->v_block_bytes);
        i += p->v_block_bytes;
    }
}

static void cpu_copy_block(hr_kv_storage *st, int32_t from, int32_t to) {
    kv_cpu *p = (kv_cpu *)st;
    for (int l = 0; l < p->L; l++) {
        memcpy(kv_block_ptr(p, l, KV_K, to), kv_block_ptr(p, l, KV_K, from), p->k_block_bytes);
        memcpy(kv_block_ptr(p, l, KV_V, to), kv_block_ptr(p, l, KV_V, from), p->v_block_bytes);
    }
}

static void cpu_stage_reset(hr_kv_storage *st, int32_t slot) {
    kv_cpu *p = (kv_cpu *)st;
    for (int l = 0; l < p->L; l++) atomic_store_explicit(&p->filled[(size_t)slot * p->L + l], 0, memory_order_relaxed);
}

static int cpu_stage_filled(const hr_kv_storage *st, int32_t slot, int layer) {
    const kv_cpu *p = (const kv_cpu *)st;
    return atomic_load(&((kv_cpu *)p)->filled[(size_t)slot * p->L + layer]);
}

static void cpu_stage_read(const hr_kv_storage *st, int32_t slot, void *out, uint16_t *filled) {
    const kv_cpu *p = (const kv_cpu *)st;
    memcpy(out, p->stage + (size_t)slot * p->stage_slot_bytes, p->stage_slot_bytes);
    for (int l = 0; l < p->L; l++) filled[l] = (uint16_t)cpu_stage_filled(st, slot, l);
}

static void cpu_stage_write(hr_kv_storage *st, int32_t slot, const void *in, const uint16_t *filled) {
    kv_cpu *p = (kv_cpu *)st;
    memcpy(p->stage + (size_t)slot * p->stage_slot_bytes, in, p->stage_slot_bytes);
    for (int l = 0; l < p->L; l++) atomic_store(&p->filled[(size_t)slot * p->L + l], filled[l]);
}

static void cpu_stage_copy(hr_kv_storage *st, int32_t from, int32_t to) {
    kv_cpu *p = (kv_cpu *)st;
    memcpy(p->stage + (size_t)to * p->stage_slot_bytes, p->stage + (size_t)from * p->stage_slot_bytes,
           p->stage_slot_bytes);
    for (int l = 0; l < p->L; l++)
        atomic_store(&p->filled[(size_t)to * p->L + l], atomic_load(&p->filled[(size_t)from * p->L + l]));
}

static const hr_kv_storage_ops kv_cpu_ops = {.name = "cpu",
                                             .destroy = cpu_destroy,
                                             .isa = cpu_isa,
                                             .footprint = cpu_footprint,
                                             .write = kv_cpu_write,
                                             .attend = kv_cpu_attend,
                                             .read_block = cpu_read_block,
                                             .write_block = cpu_write_block,
                                             .copy_block = cpu_copy_block,
                                             .stage_reset = cpu_stage_reset,
                                             .stage_filled = cpu_stage_filled,
                                             .stage_read = cpu_stage_read,
                                             .stage_write = cpu_stage_write,
                                             .stage_copy = cpu_stage_copy};

uint64_t hr_kv_storage_cpu_meta_bytes(int n_layers, int n_stage) {
    return sizeof(kv_cpu) +
           (n_stage > 0 ? (uint64_t)n_stage * (uint64_t)n_layers * sizeof(((kv_cpu *)0)->filled[0]) : 0);
}

hr_status hr_kv_storage_cpu_create(const hr_kv_storage_params *prm, hr_kv_storage **out, hr_error *err) {
    const char *isa = prm->isa ? prm->isa : "scalar";
    bool avx2 = !strcmp(isa, "avx2") || !strcmp(isa, "avx512");
    if (!avx2 && strcmp(isa, "scalar") != 0)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "KV storage: unknown isa '%s': expected scalar, avx2 or avx512",
                            isa);
    if (prm->n_blocks < 1 || prm->n_stage < 0 || prm->n_layers < 1 || prm->n_kv_heads < 1 || prm->block_size < 1 ||
        prm->head_dim < 1 || prm->head_dim > KV_MAX_HEAD_DIM)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "KV storage: bad shape (%d blocks, %d stages)", prm->n_blocks,
                            prm->n_stage);
    kv_cpu *p = calloc(1, sizeof *p);
    if (!p) return hr_error_set(err, HR_ERR_NOMEM, "KV pool: out of memory for the pool header");
    p->base.ops = &kv_cpu_ops;
    p->L = prm->n_layers;
    p->Hkv = prm->n_kv_heads;
    p->D = prm->head_dim;
    p->B = prm->block_size;
    p->n_blocks = prm->n_blocks;
    p->n_stage = prm->n_stage;
    p->kf = prm->k;
    p->vf = prm->v;
    p->sf = prm->stage;
    p->k_block_bytes = (size_t)p->Hkv * p->kf.head_bytes;
    p->v_from_k = prm->v_from_k;
    p->v_block_bytes = p->v_from_k ? 0 : (size_t)p->Hkv * p->vf.head_bytes;
    p->block_bytes = (uint64_t)p->L * (p->k_block_bytes + p->v_block_bytes);
    p->stage_slot_bytes = p->n_stage > 0 ? (uint64_t)p->L * 2 * p->Hkv * p->B * p->D * 2 : 0;
    p->stage_layer_bytes = (size_t)(p->stage_slot_bytes / (uint64_t)p->L);

    p->avx2 = avx2;
    kv_fmt_ops_ref(&p->kf, &p->kops);
    kv_fmt_ops_ref(&p->vf, &p->vops);
    kv_fmt_ops_ref(&p->sf, &p->sops);
    p->softmax = p->avx2 ? kv_softmax_avx2 : kv_softmax_ref;
    p->scale_round_f16 = p->avx2 ? kv_scale_round_f16_avx2 : kv_scale_round_f16_ref;
    if (p->avx2) {
        kv_fmt_ops_avx2(&p->kf, &p->kops);
        kv_fmt_ops_avx2(&p->vf, &p->vops);
        kv_fmt_ops_avx2(&p->sf, &p->sops);
    }

    /* one page-aligned mapping for all layers' blocks and the tail buffers; it never grows */
    size_t blocks_bytes = (size_t)p->n_blocks * p->block_bytes;
    size_t stage_bytes = (size_t)p->n_stage * p->stage_slot_bytes;
    p->arena_bytes = blocks_bytes + stage_bytes;
    int map_flags = MAP_PRIVATE | MAP_ANONYMOUS | (prm->prefault ? MAP_POPULATE : 0);
    void *mem = mmap(NULL, p->arena_bytes, PROT_READ | PROT_WRITE, map_flags, -1, 0);
    if (mem == MAP_FAILED) {
        free(p);
        char b1[32];
        return hr_error_set(err, HR_ERR_NOMEM, "KV pool: cannot map %s for %llu blocks; lower the budget",
                            hr_format_size(blocks_bytes, b1, sizeof b1), (unsigned long long)prm->n_blocks);
    }
    p->arena = mem;
    p->stage = stage_bytes ? p->arena + blocks_bytes : NULL;
    if (p->stage) {
        /* with the header: hr_kv_storage_cpu_meta_bytes */
        p->filled = calloc((size_t)p->n_stage * p->L, sizeof *p->filled);
        if (!p->filled) {
            cpu_destroy(&p->base);
            return hr_error_set(err, HR_ERR_NOMEM, "KV pool: out of memory for the metadata of %d blocks",
                                prm->n_blocks);
        }
    }
    *out = &p->base;
    return HR_OK;
}

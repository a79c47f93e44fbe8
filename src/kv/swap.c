/* swap.c: the swap tier: a file (or, when the storage gives host memory for its transfers, one
 * allocation of that memory: pinned on a GPU, so blocks move by DMA straight into their slots) with a
 * fixed number of block-sized slots, where a preempted
 * sequence's blocks wait (hr_kv_seq_swap_out) until they are copied back bit for bit
 * (hr_kv_seq_swap_in). The bytes move only through the storage (read_block / write_block, and
 * stage_read / stage_write for tail buffers) and one block-sized buffer of the tier's own; the
 * tier never sees the storage's memory.
 *
 * Slot layout: one block = [L][K block bytes | V block bytes], exactly the bytes read_block gives
 * (HR_KV_BLOCK_LAYOUT), so a round trip is a copy. A block with an f16 tail buffer (q4/kivi2, still
 * being filled) also stores the buffer, cut into as many further slots as it needs. Besides the
 * bytes, a swapped sequence keeps a small record in memory per block: its slot(s), and for full
 * blocks the prefix hash, parent hash and tokens, so the blocks come back shareable; for blocks
 * being filled, the per-layer fill counts. Both directions plan first (count, check space, allocate
 * the record) and then act, so an error leaves everything as it was. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fault.h"
#include "common/util.h"
#include "kv/kv_internal.h"

struct hr_kv_swap {
    int fd;              /* the file, or -1 with mem */
    uint8_t *mem;        /* the slots in the storage's host memory (ops->host_alloc), or NULL: the file */
    hr_kv_storage *st;   /* mem's owner, which frees it */
    char *path;          /* removed at destroy; NULL for an anonymous (already unlinked) file */
    uint64_t slot_bytes; /* one block, all layers, K and V */
    int n_slots, n_free;
    int32_t *free_slots; /* stack */
    int stage_units;     /* slots one tail buffer takes */
    uint8_t *buf;        /* one block or one tail buffer, whichever is larger: the bytes in transit */
    /* the ledger's figures, published for readers on other threads (the owner thread alone moves
     * n_free and the stack) */
    atomic_int slots_used;
    atomic_uint_fast64_t out_total, in_total;
};

typedef struct kv_swap_rec {
    int n_blocks, n_units;
    int n_table;    /* table entries per group it restores (holes stay holes) */
    int32_t *where; /* [n_blocks]: group * n_table + entry of each block (group by group, in order) */
    int32_t *holes; /* several groups: the sequence's ghole (holes and evict_from per group) */
    int32_t *units; /* n_units slot ids: one per block, then stage_units per staged block */
    uint8_t *flags; /* per block: KV_FLAG_HASHED, and bit 7 = had a tail buffer */
    uint64_t *hash, *parent;
    int32_t *tokens;  /* [n_blocks][B] */
    uint16_t *filled; /* [n_blocks][L] */
} kv_swap_rec;

enum { REC_STAGED = 0x80 };

/* ---- create / destroy ---------------------------------------------------------------------------- */

hr_status hr_kv_swap_create(const hr_kv_pool *p, const hr_kv_swap_config *cfg, hr_kv_swap **out, hr_error *err) {
    uint64_t slot = p->block_bytes;
    if (!cfg || cfg->budget_bytes < slot) {
        char b1[32], b2[32];
        return hr_error_set(err, HR_ERR_BUDGET, "KV swap budget %s holds no slot: one block takes %s; raise it",
                            hr_format_size(cfg ? cfg->budget_bytes : 0, b1, sizeof b1),
                            hr_format_size(slot, b2, sizeof b2));
    }
    uint64_t n = cfg->budget_bytes / slot;
    if (n > (1u << 30)) n = 1u << 30;
    hr_kv_swap *w = calloc(1, sizeof *w);
    if (!w) return hr_error_set(err, HR_ERR_NOMEM, "KV swap: out of memory");
    w->fd = -1;
    w->slot_bytes = slot;
    w->n_slots = (int)n;
    w->stage_units = kv_deferred(p) ? (int)((p->stage_slot_bytes + slot - 1) / slot) : 0;
    w->free_slots = malloc((size_t)n * sizeof *w->free_slots);
    w->buf = malloc((size_t)(p->stage_slot_bytes > slot ? p->stage_slot_bytes : slot));
    if (!w->free_slots || !w->buf) {
        free(w->free_slots);
        free(w->buf);
        free(w);
        return hr_error_set(err, HR_ERR_NOMEM, "KV swap: out of memory for %llu slots", (unsigned long long)n);
    }
    for (int i = (int)n - 1; i >= 0; i--) w->free_slots[w->n_free++] = i;
    if (p->st->ops->host_alloc && !cfg->path) { /* the storage's memory (a GPU's pinned host memory) */
        w->st = p->st;
        if (!(w->mem = p->st->ops->host_alloc(p->st, (size_t)(n * slot), err))) {
            hr_kv_swap_destroy(w);
            return err ? err->code : HR_ERR_NOMEM;
        }
        *out = w;
        return HR_OK;
    }
    if (cfg->path) {
        w->path = strdup(cfg->path);
        w->fd = open(cfg->path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    } else {
        const char *dir = getenv("TMPDIR");
        char tmpl[4096];
        snprintf(tmpl, sizeof tmpl, "%s/headroom-kv-swap-XXXXXX", dir && *dir ? dir : "/tmp");
        w->fd = mkstemp(tmpl);
        if (w->fd >= 0) unlink(tmpl); /* anonymous: gone when closed */
    }
    if (w->fd < 0 || ftruncate(w->fd, (off_t)(n * slot)) != 0) {
        int e = errno;
        hr_kv_swap_destroy(w);
        return hr_error_set(err, HR_ERR_IO, "KV swap: cannot create a %llu-byte file at %s: %s",
                            (unsigned long long)(n * slot), cfg->path ? cfg->path : "$TMPDIR", strerror(e));
    }
    *out = w;
    return HR_OK;
}

void hr_kv_swap_destroy(hr_kv_swap *w) {
    if (!w) return;
    if (w->mem) w->st->ops->host_free(w->st, w->mem);
    if (w->fd >= 0) close(w->fd);
    if (w->path) unlink(w->path);
    free(w->path);
    free(w->free_slots);
    free(w->buf);
    free(w);
}

void hr_kv_swap_get_ledger(const hr_kv_swap *w, hr_kv_swap_ledger *out) {
    memset(out, 0, sizeof *out);
    out->slots_total = w->n_slots;
    out->slots_used = atomic_load_explicit(&w->slots_used, memory_order_relaxed);
    out->bytes_total = (uint64_t)w->n_slots * w->slot_bytes;
    out->bytes_used = (uint64_t)out->slots_used * w->slot_bytes;
    out->blocks_out_total = atomic_load_explicit(&w->out_total, memory_order_relaxed);
    out->blocks_in_total = atomic_load_explicit(&w->in_total, memory_order_relaxed);
}

/* ---- I/O ----------------------------------------------------------------------------------------- */

static bool kv_pwrite_all(hr_kv_swap *sw, const void *buf, size_t n, off_t off) {
    if (sw->mem) {
        memcpy(sw->mem + off, buf, n);
        return true;
    }
    const int fd = sw->fd;
    const uint8_t *b = buf;
    while (n > 0) {
        /* the fault build's injected I/O error takes the same path as a real one */
        ssize_t w = HR_FAULT_HIT(HR_FAULT_SWAP_WRITE) ? (errno = EIO, -1) : pwrite(fd, b, n, off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        b += w, n -= (size_t)w, off += w;
    }
    return true;
}

static bool kv_pread_all(hr_kv_swap *sw, void *buf, size_t n, off_t off) {
    if (sw->mem) {
        memcpy(buf, sw->mem + off, n);
        return true;
    }
    const int fd = sw->fd;
    uint8_t *b = buf;
    while (n > 0) {
        ssize_t r = HR_FAULT_HIT(HR_FAULT_SWAP_READ) ? (errno = EIO, -1) : pread(fd, b, n, off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        b += r, n -= (size_t)r, off += r;
    }
    return true;
}

/* Copies block b to (or from) slot through the tier's buffer: each layer's K then V bytes, in order.
 * Reading, the block's bytes are written only once the whole slot was read. */
static bool kv_block_io(hr_kv_pool *p, hr_kv_swap *w, int32_t b, int32_t slot, bool out) {
    off_t off = (off_t)((uint64_t)slot * w->slot_bytes);
    if (w->mem) { /* the slot itself is the storage's memory: one copy each way */
        if (out)
            p->st->ops->read_block(p->st, b, w->mem + off);
        else
            p->st->ops->write_block(p->st, b, w->mem + off);
        return true;
    }
    if (out) {
        p->st->ops->read_block(p->st, b, w->buf);
        return kv_pwrite_all(w, w->buf, p->block_bytes, off);
    }
    if (!kv_pread_all(w, w->buf, p->block_bytes, off)) return false;
    p->st->ops->write_block(p->st, b, w->buf);
    return true;
}

/* Copies a tail buffer's bytes, in w->buf, to (or from) its stage_units slots, one slot's worth at a
 * time. */
static bool kv_stage_io(hr_kv_pool *p, hr_kv_swap *w, const int32_t *units, bool out) {
    uint8_t *buf = w->buf;
    uint64_t left = p->stage_slot_bytes;
    for (int u = 0; left > 0; u++) {
        size_t n = (size_t)(left < w->slot_bytes ? left : w->slot_bytes);
        off_t off = (off_t)((uint64_t)units[u] * w->slot_bytes);
        if (!(out ? kv_pwrite_all(w, buf, n, off) : kv_pread_all(w, buf, n, off))) return false;
        buf += n, left -= n;
    }
    return true;
}

static void kv_rec_free(kv_swap_rec *r) {
    if (!r) return;
    free(r->where);
    free(r->holes);
    free(r->units);
    free(r->flags);
    free(r->hash);
    free(r->parent);
    free(r->tokens);
    free(r->filled);
    free(r);
}

/* ---- out / in ------------------------------------------------------------------------------------ */

hr_status hr_kv_seq_swap_out(hr_kv_pool *p, hr_kv_swap *w, hr_kv_seq seq, hr_error *err) {
    if (!kv_seq_valid(p, seq)) return hr_error_set(err, HR_ERR_INVALID_ARG, "KV swap out: %d is not a sequence", seq);
    kv_seq *s = &p->seqs[seq];
    if (s->swapped) return hr_error_set(err, HR_ERR_INVALID_ARG, "KV swap out: sequence %d is already out", seq);
    int B = p->cfg.block_size, L = p->lay.slots, NG = p->n_groups;
    int nt = (s->n_tokens + B - 1) / B; /* reserved blocks past the tokens are released, not copied */
    /* a one-group pool's holes are a policy's; a hybrid pool's window-group holes are the model's
     * window, restored as holes, unless a policy made some */
    bool holes_ok = NG > 1 && s->pol.kind == HR_KV_POLICY_FULL;
    int nb = 0;
    for (int g = 0; g < NG; g++)
        for (int i = 0; i < nt; i++) {
            if (kv_tab(s, g)[i] >= 0) {
                nb++;
                continue;
            }
            if (!holes_ok)
                return hr_error_set(err, HR_ERR_UNSUPPORTED,
                                    "KV swap out: sequence %d has blocks its eviction policy dropped; preempt it by "
                                    "recompute",
                                    seq);
        }
    int n_staged = 0;
    for (int g = 0; g < NG; g++)
        for (int i = 0; i < nt; i++) {
            int32_t b = kv_tab(s, g)[i];
            n_staged += b >= 0 && kv_deferred(p) && p->blk_stage[b] >= 0;
        }
    int units = nb + n_staged * w->stage_units;
    if (units > w->n_slots)
        return hr_error_set(err, HR_ERR_BUDGET, "KV swap out: sequence %d needs %d slots, the tier has %d in all", seq,
                            units, w->n_slots);
    if (units > w->n_free)
        return hr_error_set(err, HR_ERR_FULL, "KV swap out: sequence %d needs %d slots, %d of %d free", seq, units,
                            w->n_free, w->n_slots);
    kv_swap_rec *r = calloc(1, sizeof *r);
    if (r) {
        r->units = malloc((size_t)(units + 1) * sizeof *r->units);
        r->flags = calloc((size_t)nb + 1, 1);
        r->hash = calloc((size_t)nb + 1, sizeof *r->hash);
        r->parent = calloc((size_t)nb + 1, sizeof *r->parent);
        r->tokens = malloc(((size_t)nb * B + 1) * sizeof *r->tokens);
        r->filled = calloc((size_t)nb * L + 1, sizeof *r->filled);
        r->where = malloc(((size_t)nb + 1) * sizeof *r->where);
        r->holes = NG > 1 ? malloc(2 * (size_t)NG * sizeof *r->holes) : NULL;
    }
    if (!r || !r->units || !r->flags || !r->hash || !r->parent || !r->tokens || !r->filled || !r->where ||
        (NG > 1 && !r->holes)) {
        kv_rec_free(r);
        return hr_error_set(err, HR_ERR_NOMEM, "KV swap out: out of memory for the record of %d blocks", nb);
    }
    r->n_blocks = nb;
    r->n_units = units;
    r->n_table = nt;
    if (r->holes) memcpy(r->holes, s->ghole, 2 * (size_t)NG * sizeof *r->holes);
    for (int u = 0; u < units; u++) r->units[u] = w->free_slots[w->n_free - 1 - u];
    int extra = nb, i = 0;
    for (int g = 0; g < NG; g++)
        for (int e = 0; e < nt; e++) {
            int32_t b = kv_tab(s, g)[e];
            if (b < 0) continue;
            r->where[i] = g * nt + e;
            bool ok = kv_block_io(p, w, b, r->units[i], true);
            r->flags[i] = p->flags[b] & KV_FLAG_HASHED;
            r->hash[i] = p->hash[b];
            r->parent[i] = p->parent[b];
            memcpy(r->tokens + (size_t)i * B, p->tokens + (size_t)b * B, (size_t)B * sizeof *r->tokens);
            if (ok && kv_deferred(p) && p->blk_stage[b] >= 0) {
                r->flags[i] |= REC_STAGED;
                p->st->ops->stage_read(p->st, p->blk_stage[b], w->buf, r->filled + (size_t)i * L);
                ok = kv_stage_io(p, w, r->units + extra, true);
                extra += w->stage_units;
            }
            if (!ok) {
                int en = errno;
                kv_rec_free(r);
                return hr_error_set(err, HR_ERR_IO, "KV swap out: writing block %d of sequence %d failed: %s", i, seq,
                                    strerror(en));
            }
            i++;
        }
    w->n_free -= units; /* commit: the slots were the top of the stack */
    atomic_fetch_add_explicit(&w->slots_used, units, memory_order_relaxed);
    atomic_fetch_add_explicit(&w->out_total, (uint64_t)nb, memory_order_relaxed);
    kv_seq_release_blocks(p, s);
    s->swapped = true;
    s->swap = w;
    s->rec = r;
    s->bytes_swapped = (uint64_t)units * w->slot_bytes;
    atomic_fetch_add_explicit(&p->bytes_swapped, s->bytes_swapped, memory_order_relaxed);
    return HR_OK;
}

hr_status hr_kv_seq_swap_in(hr_kv_pool *p, hr_kv_seq seq, hr_error *err) {
    if (!kv_seq_valid(p, seq)) return hr_error_set(err, HR_ERR_INVALID_ARG, "KV swap in: %d is not a sequence", seq);
    kv_seq *s = &p->seqs[seq];
    if (!s->swapped) return hr_error_set(err, HR_ERR_INVALID_ARG, "KV swap in: sequence %d is not swapped out", seq);
    kv_swap_rec *r = s->rec;
    hr_kv_swap *w = s->swap;
    int B = p->cfg.block_size, L = p->lay.slots, NG = p->n_groups;
    int n_staged = 0;
    for (int i = 0; i < r->n_blocks; i++) n_staged += (r->flags[i] & REC_STAGED) != 0;
    if (r->n_blocks > hr_kv_pool_n_free(p) || (kv_deferred(p) && n_staged > p->n_stage_free))
        return hr_error_set(err, HR_ERR_FULL, "KV swap in: sequence %d needs %d blocks (%d free or evictable)", seq,
                            r->n_blocks, hr_kv_pool_n_free(p));
    hr_status rc = kv_table_reserve(p, s, r->n_table, err);
    if (rc != HR_OK) return rc;
    /* every entry a hole first, then the blocks read into fresh ones; on a read error give them back
     * and leave the copy in the tier */
    for (int g = 0; g < NG; g++)
        for (int e = 0; e < r->n_table; e++) kv_tab(s, g)[e] = -1;
    s->n_table = r->n_table;
    int extra = r->n_blocks;
    for (int i = 0; i < r->n_blocks; i++) {
        int g = r->where[i] / r->n_table, e = r->where[i] % r->n_table;
        int32_t b = kv_block_alloc(p, g);
        kv_tab(s, g)[e] = b;
        bool ok = kv_block_io(p, w, b, r->units[i], false);
        if (ok && (r->flags[i] & REC_STAGED)) {
            int32_t slot = kv_stage_take(p, b);
            ok = kv_stage_io(p, w, r->units + extra, false);
            if (ok) p->st->ops->stage_write(p->st, slot, w->buf, r->filled + (size_t)i * L);
            extra += w->stage_units;
        }
        if (!ok) {
            int en = errno;
            int n_tokens = s->n_tokens;
            s->n_tokens = s->n_table * B; /* release without touching the waste figure */
            kv_seq_release_blocks(p, s);
            s->n_tokens = n_tokens;
            return hr_error_set(err, HR_ERR_IO, "KV swap in: reading block %d of sequence %d failed: %s", i, seq,
                                strerror(en));
        }
    }
    for (int i = 0; i < r->n_blocks; i++) {
        int32_t b = kv_tab(s, r->where[i] / r->n_table)[r->where[i] % r->n_table];
        if (!(r->flags[i] & KV_FLAG_HASHED)) continue;
        p->hash[b] = r->hash[i];
        p->parent[b] = r->parent[i];
        memcpy(p->tokens + (size_t)b * B, r->tokens + (size_t)i * B, (size_t)B * sizeof *p->tokens);
        p->flags[b] |= KV_FLAG_HASHED;
        kv_prefix_map_add(p, b); /* shareable again unless the cache already has this block */
    }
    if (r->holes) { /* the window groups' holes and where their eviction goes on */
        memcpy(s->ghole, r->holes, 2 * (size_t)NG * sizeof *s->ghole);
        s->n_holes = 0;
        for (int g = 0; g < NG; g++) s->n_holes += s->ghole[g];
    }
    atomic_fetch_add_explicit(&p->waste_slots, (uint64_t)s->n_table * B - (uint64_t)s->n_tokens, memory_order_relaxed);
    atomic_fetch_add_explicit(&w->in_total, (uint64_t)r->n_blocks, memory_order_relaxed);
    kv_swap_drop(p, s);
    kv_update_peak(p, s);
    return HR_OK;
}

void kv_swap_drop(hr_kv_pool *p, kv_seq *s) {
    kv_swap_rec *r = s->rec;
    hr_kv_swap *w = s->swap;
    if (r && w)
        for (int u = r->n_units - 1; u >= 0; u--) w->free_slots[w->n_free++] = r->units[u];
    if (r && w) atomic_fetch_sub_explicit(&w->slots_used, r->n_units, memory_order_relaxed);
    atomic_fetch_sub_explicit(&p->bytes_swapped, s->bytes_swapped, memory_order_relaxed);
    kv_rec_free(r);
    s->rec = NULL;
    s->swap = NULL;
    s->swapped = false;
    s->bytes_swapped = 0;
}

bool hr_kv_seq_is_swapped(const hr_kv_pool *p, hr_kv_seq seq) { return kv_seq_valid(p, seq) && p->seqs[seq].swapped; }

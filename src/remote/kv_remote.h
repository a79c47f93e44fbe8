/* kv_remote.h: a shared KV tier on Redis: full prefix blocks computed by one replica are written to
 * Redis and fetched by another that meets the same prefix, instead of being recomputed.
 *
 * Keys: a block lives under "hrkv:<key>:d" (its bytes: every layer's K then V block, as
 * hr_kv_pool_read_block gives them) and "hrkv:<key>:m" (its metadata), where key = a 64-bit mix of
 * the namespace (the model's identity: hr_kv_remote_params.model_id) and the block's chain hash (which
 * covers its parent chain, tokens, K/V formats, block size and the pool's shape). The data key is
 * written first and the metadata key only after Redis acknowledged it, so a reader that sees metadata
 * sees bytes (or none, if LRU evicted them: then the checksum fails). The metadata repeats the
 * namespace, hash, parent, formats, block size, shape, layout version, byte count, a checksum of the
 * bytes and the block's token ids; a fetched block is used only if every one matches, so a block of
 * another model, format or shape, a torn write or a collision is never used (it is counted, logged,
 * and the block is recomputed).
 *
 * A hybrid pool (layer groups: gemma2/3, gpt-oss; kv.h): each group's blocks are stored apart, keyed by
 * the group's own chain hash with the group (its index, kind and slots) mixed into the key and the
 * checksum; the pool's share_prefix fetches every full group's blocks of the prefix and, in window
 * groups, only the blocks the window still sees (its holes stay holes, never fetched). A one-group
 * pool's keys and metadata are as they were.
 *
 * Threads: fetch runs on the engine thread (the pool calls it during admission) with a bounded
 * command timeout; a failure marks the tier down for a second (then one reconnect is tried), so a
 * Redis that vanishes costs at most one timeout per second and every request still completes by
 * recompute. Stores copy the block on the engine thread into a bounded queue; a writer thread with its
 * own connection sends them. Redis is meant to run as a cache (maxmemory + allkeys-lru, no
 * persistence). */
#ifndef HR_REMOTE_KV_REMOTE_H
#define HR_REMOTE_KV_REMOTE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kv/kv.h"

typedef struct hr_kv_remote hr_kv_remote;

typedef struct hr_kv_remote_params {
    const char *url;                              /* redis://HOST[:PORT] (port 6379 by default) */
    const char *model_id;                         /* the model's identity (e.g. a fingerprint of the weights file) */
    hr_kv_pool *pool;                             /* borrowed: the pool whose blocks are stored and fetched */
    int timeout_ms;                               /* connect and command timeout (0: 500) */
    uint64_t queue_bytes;                         /* blocks waiting to be written (0: 256 MiB); a full queue drops */
    void (*log)(void *log_ctx, const char *line); /* optional: one line per rejected block or outage */
    void *log_ctx;
} hr_kv_remote_params;

/* Parses the URL and connects (bounded by timeout_ms). HR_ERR_INVALID_ARG for a URL that is not
 * redis://HOST[:PORT]; HR_ERR_IO when Redis cannot be reached (the message says where and why). */
hr_status hr_kv_remote_create(const hr_kv_remote_params *p, hr_kv_remote **out, hr_error *err);
/* Sends what is queued (bounded by the timeout per block), stops the writer, disconnects. NULL ok. */
void hr_kv_remote_destroy(hr_kv_remote *r);

/* The pool's callbacks (see hr_kv_observer): stored queues a computed block for writing (fetched
 * blocks are not written back); fetch reads, checks and copies one block. */
void hr_kv_remote_on_stored(hr_kv_remote *r, const hr_kv_block_info *b);
bool hr_kv_remote_fetch(hr_kv_remote *r, const hr_kv_block_info *b, void *out, uint64_t n_bytes);
hr_kv_observer hr_kv_remote_observer(hr_kv_remote *r); /* stored + fetch, ctx = r */

/* Waits until every block queued before the call was written or dropped (bounded by timeout_ms). */
bool hr_kv_remote_flush(hr_kv_remote *r, int timeout_ms);

typedef struct hr_kv_remote_stats {
    uint64_t fetched, missed, rejected, fetch_errors; /* blocks used / absent / failed a check / I/O errors */
    uint64_t stored, store_errors, dropped;           /* blocks written / failed / dropped (queue full) */
    uint64_t bytes_in, bytes_out;
} hr_kv_remote_stats;
void hr_kv_remote_get_stats(hr_kv_remote *r, hr_kv_remote_stats *out);

#endif

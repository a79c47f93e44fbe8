/* kv_events.h: publishes the prefix cache's changes as vLLM-compatible KV events over ZeroMQ, for
 * routers that score replicas by the blocks they hold (llm-d's precise prefix-cache scorer, Dynamo).
 *
 * Wire format (vLLM's): every batch is one PUB message of three frames: topic, the batch's sequence
 * number (8 bytes, big-endian, from 0, +1 per batch), and a msgpack array
 *   [timestamp (float seconds since the epoch), [event...], data_parallel_rank]
 * where an event is a tagged array:
 *   ["BlockStored", [hash...], parent_hash or nil, [token id...], block_size, lora_id (nil), medium]
 *   ["BlockRemoved", [hash...], medium]
 *   ["AllBlocksCleared"]
 * Hashes are the pool's chained 64-bit block hashes (kv/prefix.c); a BlockStored lists consecutive
 * blocks of one chain (parent_hash is the first one's parent, nil for a sequence's first block) and
 * their token ids in order, block_size per block. medium is nil unless set.
 *
 * Layer groups (a hybrid pool: gemma2/3, gpt-oss; kv.h): each group's blocks form a chain of their own
 * hashes, so with params.groups of more than one group every BlockStored and BlockRemoved also names
 * its group, in the fields vLLM gives a hybrid model's events (after lora_name and extra_keys, both
 * nil here):
 *   ["BlockStored", [hash...], parent, [token id...], block_size, nil, medium, nil, nil,
 *    group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window]
 *   ["BlockRemoved", [hash...], medium, group_idx]
 * group_idx is the pool's group index (0..n_groups-1), kv_cache_spec_kind its kind in vLLM's words
 * ("full_attention", "sliding_window", "mla_attention" for a latent cache), the window in tokens for a
 * sliding-window group, else nil. One event never mixes groups. A one-group pool (or params.groups
 * NULL) sends the 7- and 3-element events above, byte for byte as before (vLLM leaves the same fields
 * out when they are unset).
 *
 * Replay: a ROUTER socket answers a request [identity, "", start (8 bytes big-endian)] with
 * [identity, "", seq, payload] for each kept batch with seq >= start, then [identity, "", -1 as 8
 * bytes, ""]. A bounded ring keeps the newest batches (by count and bytes).
 *
 * Threading: the observer callbacks (hr_kv_events_observer) run on the engine thread and only append
 * to a bounded in-memory queue under a mutex; one publisher thread owns both sockets, encodes and
 * sends, so the engine never waits on the network. When the queue is full an event is dropped and
 * counted (a subscriber's view is then stale until the next AllBlocksCleared). */
#ifndef HR_EVENTS_KV_EVENTS_H
#define HR_EVENTS_KV_EVENTS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "kv/kv.h"

typedef struct hr_kv_events hr_kv_events;

typedef struct hr_kv_events_params {
    const char *endpoint;        /* PUB endpoint to bind, "tcp://HOST:PORT" (HOST an address or *) */
    const char *replay_endpoint; /* ROUTER endpoint to bind for replay; NULL: none */
    const char *topic;           /* first frame of every message; NULL: "" (as vLLM) */
    const char *medium;          /* the medium field; NULL: nil */
    int data_parallel_rank;      /* sent in every batch (0) */
    int replay_batches;          /* batches kept for replay (0: 10000) */
    uint64_t replay_bytes;       /* payload bytes kept for replay (0: 64 MiB) */
    uint64_t queue_bytes;        /* events waiting to be sent, approximate bytes (0: 64 MiB) */
    int flush_ms;                /* the publisher sends what is queued at least this often (0: 10) */
    const hr_kv_groups *groups;  /* the pool's layer groups (hr_kv_pool_groups; copied): with several,
                                    events name their group (above); NULL: one group */
} hr_kv_events_params;

hr_kv_events_params hr_kv_events_default_params(void);

/* Binds the sockets and starts the publisher thread. HR_ERR_INVALID_ARG for an endpoint that is not
 * tcp://HOST:PORT, HR_ERR_IO when a socket cannot bind (the message names the endpoint and why);
 * nothing is left running on error. */
hr_status hr_kv_events_create(const hr_kv_events_params *p, hr_kv_events **out, hr_error *err);

/* Publishes what is still queued (bounded: at most ~1 s), stops the thread, closes the sockets.
 * NULL allowed. */
void hr_kv_events_destroy(hr_kv_events *ev);

/* An observer for hr_kv_pool_set_observer; valid until hr_kv_events_destroy (unset it first). */
hr_kv_observer hr_kv_events_observer(hr_kv_events *ev);

/* Queues an AllBlocksCleared event (at start, so subscribers forget an earlier life of this
 * replica, and before the pool goes away). */
void hr_kv_events_all_cleared(hr_kv_events *ev);

/* Asks the publisher to send what is queued now and waits until it has (or timeout_ms passed).
 * Returns true when everything queued before the call was sent. */
bool hr_kv_events_flush(hr_kv_events *ev, int timeout_ms);

typedef struct hr_kv_events_stats {
    uint64_t batches;     /* messages published (= the next sequence number) */
    uint64_t events;      /* events in them */
    uint64_t dropped;     /* events dropped because the queue was full */
    uint64_t replays;     /* replay requests answered */
    uint64_t send_errors; /* messages the PUB socket refused */
} hr_kv_events_stats;
void hr_kv_events_get_stats(hr_kv_events *ev, hr_kv_events_stats *out);

#endif

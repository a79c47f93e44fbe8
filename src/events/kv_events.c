/* kv_events.c: the KV event publisher (see kv_events.h for the wire format and threading).
 *
 * Data flow: engine thread -> ev_on_stored/ev_on_removed -> `front` queue (mutex, bounded bytes)
 * -> publisher thread swaps it with `back` -> msgpack -> PUB (3 frames) and the replay ring.
 * Consecutive stored blocks of one chain coalesce into one BlockStored (as vLLM sends one per request
 * and step); consecutive removals into one BlockRemoved. */
#include "events/kv_events.h"
#include "common/util.h"

#include <errno.h>
#include <msgpack.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

enum { EV_STORED = 1, EV_REMOVED = 2, EV_CLEARED = 3 };

typedef struct ev_item {
    int kind;
    int group; /* the layer group (0 on a one-group pool) */
    bool has_parent;
    int block_size;
    uint64_t parent;
    size_t h0, nh; /* hashes [h0, h0 + nh) of the queue's hash array */
    size_t t0, nt; /* tokens [t0, t0 + nt) */
} ev_item;

typedef struct ev_queue {
    ev_item *items;
    size_t n_items, cap_items;
    uint64_t *hashes;
    size_t n_hashes, cap_hashes;
    int32_t *tokens;
    size_t n_tokens, cap_tokens;
    uint64_t bytes; /* approximate encoded size, for the bound */
} ev_queue;

typedef struct ev_ring { /* the newest published batches, oldest at head */
    uint64_t *seq;
    char **data;
    size_t *len;
    int cap, head, count;
    uint64_t bytes, max_bytes;
} ev_ring;

struct hr_kv_events {
    hr_kv_events_params p;
    hr_kv_groups groups; /* p.groups copied; n_groups 1 without one: the events name no group */
    char *topic, *medium;
    void *zctx, *pub, *replay;
    pthread_t thread;
    bool thread_started;
    atomic_bool stop;

    pthread_mutex_t mu;
    pthread_cond_t sent_cv;
    ev_queue front;        /* engine side, under mu */
    uint64_t enq_gen;      /* events queued so far, under mu */
    uint64_t sent_gen;     /* enq_gen of the newest published queue, under mu */
    hr_kv_events_stats st; /* under mu */

    ev_queue back; /* publisher thread only */
    ev_ring ring;  /* publisher thread only */
};

hr_kv_events_params hr_kv_events_default_params(void) {
    return (hr_kv_events_params){
        .replay_batches = 10000, .replay_bytes = 64u << 20, .queue_bytes = 64u << 20, .flush_ms = 10};
}

/* ---- queue (engine side) ------------------------------------------------------------------------- */

static bool ev_grow(void **a, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *n = realloc(*a, c * elem);
    if (!n) return false;
    *a = n;
    *cap = c;
    return true;
}

static void ev_queue_clear(ev_queue *q) { q->n_items = q->n_hashes = q->n_tokens = 0, q->bytes = 0; }
static void ev_queue_free(ev_queue *q) {
    free(q->items);
    free(q->hashes);
    free(q->tokens);
    memset(q, 0, sizeof *q);
}

/* Appends under ev->mu; false (and nothing changed) when the bound or memory says no. */
static bool ev_append(hr_kv_events *ev, int kind, int group, uint64_t hash, bool has_parent, uint64_t parent,
                      const int32_t *tokens, int block_size) {
    ev_queue *q = &ev->front;
    size_t nt = kind == EV_STORED ? (size_t)block_size : 0;
    uint64_t cost = 8 + 5 * (uint64_t)nt;
    ev_item *last = q->n_items ? &q->items[q->n_items - 1] : NULL;
    bool extend = last && last->kind == kind && last->group == group &&
                  ((kind == EV_REMOVED) || (kind == EV_STORED && has_parent && last->block_size == block_size &&
                                            q->hashes[last->h0 + last->nh - 1] == parent));
    if (!extend) cost += 32;
    if (q->bytes + cost > ev->p.queue_bytes) return false;
    if (!ev_grow((void **)&q->items, &q->cap_items, q->n_items + 1, sizeof *q->items) ||
        !ev_grow((void **)&q->hashes, &q->cap_hashes, q->n_hashes + 1, sizeof *q->hashes) ||
        !ev_grow((void **)&q->tokens, &q->cap_tokens, q->n_tokens + nt, sizeof *q->tokens))
        return false;
    if (!extend) {
        last = &q->items[q->n_items++];
        *last = (ev_item){.kind = kind,
                          .group = group,
                          .has_parent = has_parent,
                          .parent = parent,
                          .block_size = block_size,
                          .h0 = q->n_hashes,
                          .t0 = q->n_tokens};
    }
    if (kind != EV_CLEARED) {
        q->hashes[q->n_hashes++] = hash;
        last->nh++;
    }
    if (nt) {
        memcpy(q->tokens + q->n_tokens, tokens, nt * sizeof *tokens);
        q->n_tokens += nt;
        last->nt += nt;
    }
    q->bytes += cost;
    return true;
}

static void ev_record(hr_kv_events *ev, int kind, int group, uint64_t hash, bool has_parent, uint64_t parent,
                      const int32_t *tokens, int block_size) {
    pthread_mutex_lock(&ev->mu);
    if (ev_append(ev, kind, group, hash, has_parent, parent, tokens, block_size))
        ev->enq_gen++;
    else
        ev->st.dropped++;
    pthread_mutex_unlock(&ev->mu);
}

static void ev_on_stored(void *ctx, const hr_kv_block_info *b) {
    ev_record(ctx, EV_STORED, b->group, b->hash, b->has_parent, b->parent, b->tokens, b->block_size);
}
static void ev_on_removed(void *ctx, uint64_t hash, int group) {
    ev_record(ctx, EV_REMOVED, group, hash, false, 0, NULL, 0);
}

hr_kv_observer hr_kv_events_observer(hr_kv_events *ev) {
    return (hr_kv_observer){.stored = ev_on_stored, .removed = ev_on_removed, .ctx = ev};
}

void hr_kv_events_all_cleared(hr_kv_events *ev) {
    if (ev) ev_record(ev, EV_CLEARED, 0, 0, false, 0, NULL, 0);
}

/* ---- encoding ------------------------------------------------------------------------------------ */

static int ev_pack_str(msgpack_packer *pk, const char *s) {
    size_t n = strlen(s);
    return msgpack_pack_str(pk, n) | msgpack_pack_str_body(pk, s, n);
}

static int ev_pack_medium(msgpack_packer *pk, const char *medium) {
    return medium ? ev_pack_str(pk, medium) : msgpack_pack_nil(pk);
}

/* A hybrid pool's group fields of an event in group g (kv_events.h): BlockStored's lora_name and
 * extra_keys (nil), then group_idx, kv_cache_spec_kind and kv_cache_spec_sliding_window; BlockRemoved's
 * group_idx. */
static int ev_pack_group(msgpack_packer *pk, const hr_kv_groups *gs, int g, bool stored) {
    if (!stored) return msgpack_pack_int(pk, g);
    const hr_kv_kind_info *k = &gs->kinds[g >= 0 && g < gs->n_groups ? gs->group_kind[g] : 0];
    int rc = msgpack_pack_nil(pk) | msgpack_pack_nil(pk) | msgpack_pack_int(pk, g);
    rc |= ev_pack_str(pk, k->window > 0 ? "sliding_window" : k->latent ? "mla_attention" : "full_attention");
    return rc | (k->window > 0 ? msgpack_pack_int(pk, k->window) : msgpack_pack_nil(pk));
}

/* [ts, [events], rank] into sb; nonzero when an allocation failed. */
static int ev_encode(const hr_kv_events *ev, const ev_queue *q, msgpack_sbuffer *sb) {
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int rc = msgpack_pack_array(&pk, 3) | msgpack_pack_double(&pk, (double)ts.tv_sec + ts.tv_nsec * 1e-9) |
             msgpack_pack_array(&pk, q->n_items);
    for (size_t i = 0; i < q->n_items && rc == 0; i++) {
        const ev_item *it = &q->items[i];
        if (it->kind == EV_CLEARED) {
            rc |= msgpack_pack_array(&pk, 1) | ev_pack_str(&pk, "AllBlocksCleared");
            continue;
        }
        bool stored = it->kind == EV_STORED, grouped = ev->groups.n_groups > 1;
        rc |= msgpack_pack_array(&pk, stored ? (grouped ? 12 : 7) : (grouped ? 4 : 3)) |
              ev_pack_str(&pk, stored ? "BlockStored" : "BlockRemoved");
        rc |= msgpack_pack_array(&pk, it->nh);
        for (size_t k = 0; k < it->nh; k++) rc |= msgpack_pack_uint64(&pk, q->hashes[it->h0 + k]);
        if (stored) {
            rc |= it->has_parent ? msgpack_pack_uint64(&pk, it->parent) : msgpack_pack_nil(&pk);
            rc |= msgpack_pack_array(&pk, it->nt);
            for (size_t k = 0; k < it->nt; k++) rc |= msgpack_pack_int32(&pk, q->tokens[it->t0 + k]);
            rc |= msgpack_pack_int(&pk, it->block_size) | msgpack_pack_nil(&pk); /* lora_id: none */
        }
        rc |= ev_pack_medium(&pk, ev->medium);
        if (grouped) rc |= ev_pack_group(&pk, &ev->groups, it->group, stored);
    }
    return rc | msgpack_pack_int(&pk, ev->p.data_parallel_rank);
}

static void ev_seq_bytes(uint64_t seq, uint8_t out[8]) {
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)(seq >> (56 - 8 * i));
}

/* ---- replay ring (publisher thread) -------------------------------------------------------------- */

static void ev_ring_pop(ev_ring *r) {
    free(r->data[r->head]);
    r->bytes -= r->len[r->head];
    r->head = (r->head + 1) % r->cap;
    r->count--;
}

/* Takes ownership of data. */
static void ev_ring_push(ev_ring *r, uint64_t seq, char *data, size_t len) {
    if (len > r->max_bytes) { /* would never fit: keep nothing rather than a hole the client cannot see */
        free(data);
        while (r->count) ev_ring_pop(r);
        return;
    }
    while (r->count && (r->count == r->cap || r->bytes + len > r->max_bytes)) ev_ring_pop(r);
    int i = (r->head + r->count) % r->cap;
    r->seq[i] = seq, r->data[i] = data, r->len[i] = len;
    r->count++;
    r->bytes += len;
}

/* One replay request from the ROUTER socket: [identity, ..., start(8 bytes)]. A malformed request
 * gets just the end marker, so a client never waits for an answer that does not come. */
static void ev_serve_replay(hr_kv_events *ev) {
    uint8_t id[256], frame[16];
    int id_len = zmq_recv(ev->replay, id, sizeof id, ZMQ_DONTWAIT);
    if (id_len < 0) return;
    int last_len = -1, more = 1;
    size_t more_sz = sizeof more;
    zmq_getsockopt(ev->replay, ZMQ_RCVMORE, &more, &more_sz);
    while (more) { /* keep the last frame: the start sequence */
        last_len = zmq_recv(ev->replay, frame, sizeof frame, 0);
        if (last_len < 0) return;
        zmq_getsockopt(ev->replay, ZMQ_RCVMORE, &more, &more_sz);
    }
    if (id_len > (int)sizeof id) return; /* truncated identity: cannot route an answer */
    uint64_t start = UINT64_MAX;
    if (last_len == 8) {
        start = 0;
        for (int i = 0; i < 8; i++) start = start << 8 | frame[i];
    }
    uint8_t seqb[8];
    const ev_ring *r = &ev->ring;
    for (int k = 0; k < r->count && last_len == 8; k++) {
        int i = (r->head + k) % r->cap;
        if (r->seq[i] < start) continue;
        ev_seq_bytes(r->seq[i], seqb);
        zmq_send(ev->replay, id, (size_t)id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
        zmq_send(ev->replay, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
        zmq_send(ev->replay, seqb, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
        zmq_send(ev->replay, r->data[i], r->len[i], ZMQ_DONTWAIT);
    }
    memset(seqb, 0xff, sizeof seqb); /* -1: the end */
    zmq_send(ev->replay, id, (size_t)id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(ev->replay, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(ev->replay, seqb, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(ev->replay, "", 0, ZMQ_DONTWAIT);
    pthread_mutex_lock(&ev->mu);
    ev->st.replays++;
    pthread_mutex_unlock(&ev->mu);
}

/* ---- publisher thread ---------------------------------------------------------------------------- */

static void ev_publish_pending(hr_kv_events *ev) {
    pthread_mutex_lock(&ev->mu);
    ev_queue tmp = ev->front;
    ev->front = ev->back;
    ev->back = tmp;
    uint64_t gen = ev->enq_gen;
    pthread_mutex_unlock(&ev->mu);

    ev_queue *q = &ev->back;
    uint64_t seq = 0;
    bool sent = false, failed = false;
    if (q->n_items) {
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        if (ev_encode(ev, q, &sb) != 0) {
            failed = true;
            msgpack_sbuffer_destroy(&sb);
        } else {
            pthread_mutex_lock(&ev->mu);
            seq = ev->st.batches;
            pthread_mutex_unlock(&ev->mu);
            uint8_t seqb[8];
            ev_seq_bytes(seq, seqb);
            size_t tlen = strlen(ev->topic);
            sent = zmq_send(ev->pub, ev->topic, tlen, ZMQ_SNDMORE) == (int)tlen &&
                   zmq_send(ev->pub, seqb, 8, ZMQ_SNDMORE) == 8 && zmq_send(ev->pub, sb.data, sb.size, 0) >= 0;
            size_t len = sb.size;
            char *data = msgpack_sbuffer_release(&sb);
            /* a PUB send only fails on shutdown; the batch still takes its number and stays replayable */
            ev_ring_push(&ev->ring, seq, data, len);
        }
    }
    pthread_mutex_lock(&ev->mu);
    if (q->n_items && !failed) {
        ev->st.batches++;
        ev->st.events += q->n_items;
        if (!sent) ev->st.send_errors++;
    } else if (failed) {
        ev->st.dropped += q->n_items;
    }
    ev->sent_gen = gen;
    pthread_cond_broadcast(&ev->sent_cv);
    pthread_mutex_unlock(&ev->mu);
    ev_queue_clear(q);
}

static void *ev_thread(void *arg) {
    hr_kv_events *ev = arg;
    while (!atomic_load(&ev->stop)) {
        if (ev->replay) {
            zmq_pollitem_t it = {.socket = ev->replay, .events = ZMQ_POLLIN};
            if (zmq_poll(&it, 1, ev->p.flush_ms) > 0 && (it.revents & ZMQ_POLLIN)) ev_serve_replay(ev);
        } else {
            struct timespec d = {.tv_sec = ev->p.flush_ms / 1000, .tv_nsec = (long)(ev->p.flush_ms % 1000) * 1000000L};
            nanosleep(&d, NULL);
        }
        ev_publish_pending(ev);
    }
    ev_publish_pending(ev); /* what was queued before destroy */
    return NULL;
}

/* ---- lifecycle ----------------------------------------------------------------------------------- */

static bool ev_endpoint_ok(const char *e) {
    if (!e) return false;
    if (!strncmp(e, "ipc://", 6)) return e[6] != 0;
    if (strncmp(e, "tcp://", 6)) return false;
    const char *colon = strrchr(e + 6, ':');
    if (!colon || colon == e + 6 || !colon[1]) return false;
    for (const char *c = colon + 1; *c; c++)
        if (*c < '0' || *c > '9') return false;
    return true;
}

static hr_status ev_bind(void *zctx, int type, const char *endpoint, const char *what, void **out, hr_error *err) {
    if (!ev_endpoint_ok(endpoint))
        return hr_error_set(err, HR_ERR_INVALID_ARG, "%s: '%s' is not tcp://HOST:PORT (or ipc://PATH)", what,
                            endpoint ? endpoint : "(null)");
    void *s = zmq_socket(zctx, type);
    if (!s) return hr_error_set(err, HR_ERR_IO, "%s: cannot make a socket: %s", what, zmq_strerror(zmq_errno()));
    int linger = 1000, hwm = 100000;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    if (zmq_bind(s, endpoint) != 0) {
        int e = zmq_errno();
        zmq_close(s);
        return hr_error_set(err, HR_ERR_IO, "%s: cannot bind %s: %s", what, endpoint, zmq_strerror(e));
    }
    *out = s;
    return HR_OK;
}

hr_status hr_kv_events_create(const hr_kv_events_params *p, hr_kv_events **out, hr_error *err) {
    hr_kv_events_params d = hr_kv_events_default_params(), q = *p;
    if (q.replay_batches <= 0) q.replay_batches = d.replay_batches;
    if (!q.replay_bytes) q.replay_bytes = d.replay_bytes;
    if (!q.queue_bytes) q.queue_bytes = d.queue_bytes;
    if (q.flush_ms <= 0) q.flush_ms = d.flush_ms;
    hr_kv_events *ev = calloc(1, sizeof *ev);
    if (!ev) return hr_error_set(err, HR_ERR_NOMEM, "kv events: out of memory");
    ev->p = q;
    ev->groups = q.groups ? *q.groups : (hr_kv_groups){.n_groups = 1};
    ev->p.groups = NULL; /* copied: the caller's may go */
    ev->topic = strdup(q.topic ? q.topic : "");
    ev->medium = q.medium ? strdup(q.medium) : NULL;
    ev->ring.cap = q.replay_batches;
    ev->ring.max_bytes = q.replay_bytes;
    ev->ring.seq = calloc((size_t)q.replay_batches, sizeof *ev->ring.seq);
    ev->ring.data = calloc((size_t)q.replay_batches, sizeof *ev->ring.data);
    ev->ring.len = calloc((size_t)q.replay_batches, sizeof *ev->ring.len);
    pthread_mutex_init(&ev->mu, NULL);
    pthread_cond_init(&ev->sent_cv, NULL);
    atomic_init(&ev->stop, false);
    if (!ev->topic || (q.medium && !ev->medium) || !ev->ring.seq || !ev->ring.data || !ev->ring.len) {
        hr_kv_events_destroy(ev);
        return hr_error_set(err, HR_ERR_NOMEM, "kv events: out of memory");
    }
    ev->zctx = zmq_ctx_new();
    if (!ev->zctx) {
        hr_kv_events_destroy(ev);
        return hr_error_set(err, HR_ERR_IO, "kv events: cannot start ZeroMQ: %s", zmq_strerror(zmq_errno()));
    }
    hr_status rc = ev_bind(ev->zctx, ZMQ_PUB, q.endpoint, "--kv-events", &ev->pub, err);
    if (rc == HR_OK && q.replay_endpoint)
        rc = ev_bind(ev->zctx, ZMQ_ROUTER, q.replay_endpoint, "--kv-events-replay", &ev->replay, err);
    if (rc == HR_OK && pthread_create(&ev->thread, NULL, ev_thread, ev) != 0)
        rc = hr_error_set(err, HR_ERR_IO, "kv events: cannot start the publisher thread");
    if (rc != HR_OK) {
        hr_kv_events_destroy(ev);
        return rc;
    }
    ev->thread_started = true;
    *out = ev;
    return HR_OK;
}

void hr_kv_events_destroy(hr_kv_events *ev) {
    if (!ev) return;
    if (ev->thread_started) {
        atomic_store(&ev->stop, true);
        pthread_join(ev->thread, NULL);
    }
    if (ev->pub) zmq_close(ev->pub);
    if (ev->replay) {
        int zero = 0; /* unanswered replay traffic is not worth waiting for */
        zmq_setsockopt(ev->replay, ZMQ_LINGER, &zero, sizeof zero);
        zmq_close(ev->replay);
    }
    if (ev->zctx) zmq_ctx_term(ev->zctx); /* waits up to the PUB linger (1 s) for the last batches */
    while (ev->ring.data && ev->ring.count) ev_ring_pop(&ev->ring);
    free(ev->ring.seq);
    free(ev->ring.data);
    free(ev->ring.len);
    ev_queue_free(&ev->front);
    ev_queue_free(&ev->back);
    pthread_cond_destroy(&ev->sent_cv);
    pthread_mutex_destroy(&ev->mu);
    free(ev->topic);
    free(ev->medium);
    free(ev);
}

bool hr_kv_events_flush(hr_kv_events *ev, int timeout_ms) {
    struct timespec until = hr_deadline_after_ms(timeout_ms);
    pthread_mutex_lock(&ev->mu);
    uint64_t want = ev->enq_gen;
    int rc = 0;
    while (ev->sent_gen < want && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&ev->sent_cv, &ev->mu, &until);
    bool done = ev->sent_gen >= want;
    pthread_mutex_unlock(&ev->mu);
    return done;
}

void hr_kv_events_get_stats(hr_kv_events *ev, hr_kv_events_stats *out) {
    pthread_mutex_lock(&ev->mu);
    *out = ev->st;
    pthread_mutex_unlock(&ev->mu);
}

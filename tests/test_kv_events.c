/* test_kv_events.c: the KV event publisher end to end. A subscriber (libzmq SUB + the replay ROUTER
 * through a DEALER) rebuilds the set of cached blocks from vLLM-format events after a mixed workload
 * on a small pool (prefix hits, LRU evictions, concurrent sequences) and must find exactly the pool's
 * prefix map; every stored block's token ids must be a block-aligned run of a prompt that was
 * committed, with a nil parent exactly for first blocks; a replay from 0 must give the same bytes as
 * the live stream. Bad endpoints and a busy port are errors naming the endpoint. The same workload on a
 * hybrid pool (a 16-token window layer beside a full one: two layer groups) publishes events that name
 * their group (group_idx, kind, window: vLLM's hybrid fields), each group a chain of its own (a parent
 * is a block of the same group, a removal names the group its block was stored in), and the rebuilt set
 * is again exactly the pool's map; a one-group pool keeps the 7- and 3-element events. */
#include <msgpack.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include "events/kv_events.h"
#include "harness.h"
#include "kv/kv.h"

enum { B = 8, N_BLOCKS = 16, N_REQ = 160, MAX_PROMPT = 48, MAX_BATCHES = 4096, MAX_SET = 4096 };

static uint64_t rng_state = 0x1234567;
static uint32_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

/* ---- the workload's prompts ---------------------------------------------------------------------- */

static int32_t prompts[N_REQ][MAX_PROMPT];
static int prompt_len[N_REQ];
static int n_prompts;

/* Does tokens[0..n) equal prompt p's tokens from block j on, for some p, with j == 0 iff first? */
static bool run_in_prompts(const int32_t *tokens, int n, bool first) {
    for (int p = 0; p < n_prompts; p++) {
        int j_lo = first ? 0 : 1, j_hi = first ? 0 : (prompt_len[p] - n) / B;
        for (int j = j_lo; j <= j_hi && j * B + n <= prompt_len[p]; j++)
            if (!memcmp(prompts[p] + (size_t)j * B, tokens, (size_t)n * sizeof *tokens)) return true;
    }
    return false;
}

/* ---- subscriber state ---------------------------------------------------------------------------- */

typedef struct msg {
    bool have;
    char *data;
    size_t len;
} msg;
static msg live[MAX_BATCHES], replayed[MAX_BATCHES];

static uint64_t set[MAX_SET];
static int set_group[MAX_SET]; /* the group each cached hash was stored in */
static int n_set;
static int set_find(uint64_t h) {
    for (int i = 0; i < n_set; i++)
        if (set[i] == h) return i;
    return -1;
}

static int n_stored_events, n_removed_events, n_cleared_events, bad_events;
/* the pool the events come from: with several groups (hybrid) each event names one */
static const hr_kv_groups *pool_groups;
static int n_group_events[HR_KV_MAX_GROUPS];

static bool is_str(const msgpack_object *o, const char *s) {
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) && !memcmp(o->via.str.ptr, s, strlen(s));
}

static void apply_event(const msgpack_object *e) {
    if (e->type != MSGPACK_OBJECT_ARRAY || e->via.array.size < 1) {
        bad_events++;
        return;
    }
    const msgpack_object *f = e->via.array.ptr;
    if (is_str(&f[0], "AllBlocksCleared")) {
        n_cleared_events++;
        n_set = 0;
        return;
    }
    bool stored = is_str(&f[0], "BlockStored");
    if (!stored && !is_str(&f[0], "BlockRemoved")) {
        bad_events++;
        return;
    }
    bool hybrid = pool_groups->n_groups > 1;
    uint32_t want = stored ? (hybrid ? 12 : 7) : (hybrid ? 4 : 3);
    if (e->via.array.size != want || f[1].type != MSGPACK_OBJECT_ARRAY) {
        bad_events++;
        return;
    }
    const msgpack_object_array *hs = &f[1].via.array;
    int g = 0; /* the event's group: group_idx (BlockStored's field 9, BlockRemoved's 3) */
    if (hybrid) {
        const msgpack_object *gi = &f[stored ? 9 : 3];
        CHECKF(gi->type == MSGPACK_OBJECT_POSITIVE_INTEGER && gi->via.u64 < (uint64_t)pool_groups->n_groups,
               "group_idx of type %d", gi->type);
        g = gi->type == MSGPACK_OBJECT_POSITIVE_INTEGER && gi->via.u64 < HR_KV_MAX_GROUPS ? (int)gi->via.u64 : 0;
        n_group_events[g]++;
    }
    if (!stored) {
        n_removed_events++;
        CHECK(f[2].type == MSGPACK_OBJECT_NIL); /* medium */
        for (uint32_t i = 0; i < hs->size; i++) {
            int k = set_find(hs->ptr[i].via.u64);
            CHECKF(k >= 0, "BlockRemoved of a block never stored: %llx", (unsigned long long)hs->ptr[i].via.u64);
            if (k >= 0) CHECKF(set_group[k] == g, "a block stored in group %d removed from group %d", set_group[k], g);
            if (k >= 0) set[k] = set[n_set - 1], set_group[k] = set_group[n_set - 1], n_set--;
        }
        return;
    }
    n_stored_events++;
    if (hybrid) { /* lora_name, extra_keys nil; the group's kind and window as the pool has them */
        const hr_kv_kind_info *ki = &pool_groups->kinds[pool_groups->group_kind[g]];
        CHECK(f[7].type == MSGPACK_OBJECT_NIL && f[8].type == MSGPACK_OBJECT_NIL);
        CHECKF(is_str(&f[10], ki->window > 0 ? "sliding_window" : "full_attention"), "group %d: kind", g);
        CHECKF(ki->window > 0 ? f[11].type == MSGPACK_OBJECT_POSITIVE_INTEGER && f[11].via.u64 == (uint64_t)ki->window
                              : f[11].type == MSGPACK_OBJECT_NIL,
               "group %d: window field of type %d (the pool's window %d)", g, f[11].type, ki->window);
    }
    bool has_parent = f[2].type == MSGPACK_OBJECT_POSITIVE_INTEGER;
    CHECK(has_parent || f[2].type == MSGPACK_OBJECT_NIL);
    if (has_parent) {
        int k = set_find(f[2].via.u64);
        CHECKF(k >= 0, "a stored block's parent is not cached");
        if (k >= 0) CHECKF(set_group[k] == g, "group %d's block has a parent in group %d", g, set_group[k]);
    }
    CHECK(f[3].type == MSGPACK_OBJECT_ARRAY && f[3].via.array.size == hs->size * B);
    CHECK(f[4].type == MSGPACK_OBJECT_POSITIVE_INTEGER && f[4].via.u64 == B);
    CHECK(f[5].type == MSGPACK_OBJECT_NIL && f[6].type == MSGPACK_OBJECT_NIL); /* lora_id, medium */
    if (f[3].type == MSGPACK_OBJECT_ARRAY && f[3].via.array.size == hs->size * B) {
        int32_t tk[MAX_PROMPT];
        uint32_t n = f[3].via.array.size;
        CHECK(n <= MAX_PROMPT);
        for (uint32_t i = 0; i < n && i < MAX_PROMPT; i++) tk[i] = (int32_t)f[3].via.array.ptr[i].via.i64;
        CHECKF(n <= MAX_PROMPT && run_in_prompts(tk, (int)n, !has_parent),
               "stored token ids are not a block-aligned run of a committed prompt (first=%d)", !has_parent);
    }
    for (uint32_t i = 0; i < hs->size; i++) {
        CHECK(hs->ptr[i].type == MSGPACK_OBJECT_POSITIVE_INTEGER);
        CHECKF(set_find(hs->ptr[i].via.u64) < 0, "a block stored twice without removal");
        if (n_set < MAX_SET) set_group[n_set] = g, set[n_set++] = hs->ptr[i].via.u64;
    }
}

static void apply_batch(const char *data, size_t len) {
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    bool ok = msgpack_unpack_next(&up, data, len, &off) == MSGPACK_UNPACK_SUCCESS && off == len;
    CHECK(ok);
    const msgpack_object *o = &up.data;
    ok = ok && o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size == 3;
    CHECK(ok);
    if (ok) {
        const msgpack_object *f = o->via.array.ptr;
        CHECK(f[0].type == MSGPACK_OBJECT_FLOAT64 && f[0].via.f64 > 1.5e9); /* seconds since 1970 */
        CHECK(f[1].type == MSGPACK_OBJECT_ARRAY);
        CHECK(f[2].type == MSGPACK_OBJECT_POSITIVE_INTEGER && f[2].via.u64 == 0); /* data_parallel_rank */
        for (uint32_t i = 0; f[1].type == MSGPACK_OBJECT_ARRAY && i < f[1].via.array.size; i++)
            apply_event(&f[1].via.array.ptr[i]);
    }
    msgpack_unpacked_destroy(&up);
}

static uint64_t be64(const uint8_t *b) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = v << 8 | b[i];
    return v;
}

/* Receives one multipart message (up to 4 frames) with a bounded wait; returns the frame count or 0. */
static int recv_frames(void *s, zmq_msg_t *fr, int timeout_ms) {
    zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, timeout_ms) <= 0) return 0;
    int n = 0, more = 1;
    size_t sz = sizeof more;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, s, 0) < 0) {
            zmq_msg_close(&m);
            return 0;
        }
        if (n < 4)
            fr[n++] = m;
        else
            zmq_msg_close(&m);
        zmq_getsockopt(s, ZMQ_RCVMORE, &more, &sz);
    }
    return n;
}

static void close_frames(zmq_msg_t *fr, int n) {
    for (int i = 0; i < n; i++) zmq_msg_close(&fr[i]);
}

static char *dup_bytes(const void *p, size_t n) {
    char *d = malloc(n ? n : 1);
    if (d) memcpy(d, p, n);
    return d;
}

/* Reads live messages until none arrives for timeout_ms. */
static void drain_live(void *sub, int timeout_ms) {
    zmq_msg_t fr[4];
    int n;
    while ((n = recv_frames(sub, fr, timeout_ms)) > 0) {
        CHECK(n == 3 && zmq_msg_size(&fr[0]) == 0 && zmq_msg_size(&fr[1]) == 8);
        if (n == 3 && zmq_msg_size(&fr[1]) == 8) {
            uint64_t seq = be64(zmq_msg_data(&fr[1]));
            CHECK(seq < MAX_BATCHES);
            if (seq < MAX_BATCHES && !live[seq].have)
                live[seq] = (msg){true, dup_bytes(zmq_msg_data(&fr[2]), zmq_msg_size(&fr[2])), zmq_msg_size(&fr[2])};
        }
        close_frames(fr, n);
    }
}

/* Asks the replay socket for everything from start; returns the batches received (-1: no end marker). */
static int replay_from(void *dealer, uint64_t start) {
    uint8_t sb[8];
    for (int i = 0; i < 8; i++) sb[i] = (uint8_t)(start >> (56 - 8 * i));
    zmq_send(dealer, "", 0, ZMQ_SNDMORE);
    zmq_send(dealer, sb, 8, 0);
    int got = 0;
    for (;;) {
        zmq_msg_t fr[4];
        int n = recv_frames(dealer, fr, 10000);
        if (n == 0) return -1;
        bool shape = n == 3 && zmq_msg_size(&fr[0]) == 0 && zmq_msg_size(&fr[1]) == 8;
        CHECK(shape);
        if (!shape) {
            close_frames(fr, n);
            return -1;
        }
        const uint8_t *s = zmq_msg_data(&fr[1]);
        bool end = true;
        for (int i = 0; i < 8; i++) end = end && s[i] == 0xff;
        if (end) {
            CHECK(zmq_msg_size(&fr[2]) == 0);
            close_frames(fr, n);
            return got;
        }
        uint64_t seq = be64(s);
        CHECK(seq >= start && seq < MAX_BATCHES);
        if (seq < MAX_BATCHES && !replayed[seq].have)
            replayed[seq] = (msg){true, dup_bytes(zmq_msg_data(&fr[2]), zmq_msg_size(&fr[2])), zmq_msg_size(&fr[2])};
        got++;
        close_frames(fr, n);
    }
}

/* ---- the workload -------------------------------------------------------------------------------- */

static void run_request(hr_kv_pool *p, hr_kv_events *ev, hr_kv_seq *held, int *n_held) {
    /* one of three shared system prefixes (3 blocks), then a private tail */
    int32_t *t = prompts[n_prompts];
    int sys = (int)(rnd() % 3), tail = 1 + (int)(rnd() % 20);
    for (int i = 0; i < 3 * B; i++) t[i] = 1000 * (sys + 1) + i;
    for (int i = 0; i < tail; i++) t[3 * B + i] = (int32_t)(rnd() % 30000);
    int n = 3 * B + tail;
    prompt_len[n_prompts++] = n;
    hr_error err = {0};
    hr_kv_seq s;
    if (hr_kv_seq_create(p, &s, &err) != HR_OK) return;
    int cached = 0;
    CHECK(hr_kv_seq_share_prefix(p, s, t, n, &cached, &err) == HR_OK);
    if (hr_kv_seq_reserve(p, s, n, &err) != HR_OK) { /* pool full: the request is refused */
        hr_kv_seq_free(p, s);
        return;
    }
    /* commit in two chunks, like a chunked prefill */
    int mid = cached + (n - cached) / 2;
    hr_kv_seq_commit(p, s, t + cached, mid - cached);
    hr_kv_seq_commit(p, s, t + mid, n - mid);
    held[(*n_held)++] = s;
    if (*n_held == 2 || rnd() % 2) { /* keep up to two sequences alive at once */
        hr_kv_seq_free(p, held[0]);
        held[0] = held[1];
        (*n_held)--;
    }
    if (rnd() % 8 == 0) hr_kv_events_flush(ev, 5000); /* more, smaller batches */
}

/* The workload on a pool of n_layers layers (window: the first layer's window, 0: none; blocks of
 * every layer, so a hybrid pool gets as many blocks a group as the one-group pool), published to a fresh
 * subscriber, rebuilt from the events and compared with the pool's map. */
static void run_case(int n_layers, int window) {
    hr_error err = {0};
    hr_kv_events *ev = NULL;
    char ep[64], rep[64];
    /* fresh subscriber state: sequence numbers start at 0 again */
    for (int i = 0; i < MAX_BATCHES; i++) live[i] = replayed[i] = (msg){0};
    n_set = n_prompts = n_stored_events = n_removed_events = n_cleared_events = bad_events = 0;
    memset(n_group_events, 0, sizeof n_group_events);
    int32_t windows[2] = {window, 0};
    hr_kv_config c = {.n_layers = n_layers,
                      .n_kv_heads = 1,
                      .head_dim = 16,
                      .block_size = B,
                      .k_format = HR_KV_F16,
                      .v_format = HR_KV_F16,
                      .max_seqs = 4,
                      .layer_window = window > 0 ? windows : NULL};
    c.budget_bytes = hr_kv_block_bytes(&c) * N_BLOCKS * (uint64_t)n_layers + hr_kv_fixed_bytes(&c);
    hr_kv_pool *pool = NULL;
    CHECKF(hr_kv_pool_create(&c, &pool, &err) == HR_OK, "%s", err.msg);
    if (!pool) return;
    pool_groups = hr_kv_pool_groups(pool);
    CHECK(pool_groups->n_groups == n_layers);

    int port = -1, rport = -1;
    hr_status st = HR_ERR_IO;
    for (int tries = 0; tries < 5 && st != HR_OK; tries++) { /* a free port can be taken between probe and bind */
        port = hr_test_free_port();
        rport = hr_test_free_port();
        snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
        snprintf(rep, sizeof rep, "tcp://127.0.0.1:%d", rport);
        hr_kv_events_params p = hr_kv_events_default_params();
        p.endpoint = ep;
        p.replay_endpoint = rep;
        p.groups = pool_groups; /* copied */
        st = hr_kv_events_create(&p, &ev, &err);
    }
    CHECKF(st == HR_OK, "%s", err.msg);
    if (st != HR_OK) {
        hr_kv_pool_destroy(pool);
        return;
    }

    hr_kv_events *dup = NULL;
    hr_kv_events_params dp = hr_kv_events_default_params();
    dp.endpoint = ep;
    CHECK(hr_kv_events_create(&dp, &dup, &err) == HR_ERR_IO);
    CHECKF(strstr(err.msg, ep) != NULL, "the bind error names the endpoint: %s", err.msg);
    CHECK(dup == NULL);

    /* subscriber: wait (bounded) until the subscription is live, so the live stream is tested too */
    void *zctx = zmq_ctx_new();
    void *sub = zmq_socket(zctx, ZMQ_SUB), *dealer = zmq_socket(zctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(sub, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(dealer, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
    CHECK(zmq_connect(sub, ep) == 0);
    CHECK(zmq_connect(dealer, rep) == 0);
    bool joined = false;
    for (int i = 0; i < 200 && !joined; i++) {
        hr_kv_events_all_cleared(ev);
        hr_kv_events_flush(ev, 5000);
        zmq_msg_t fr[4];
        int n = recv_frames(sub, fr, 100);
        if (n == 3 && zmq_msg_size(&fr[1]) == 8) {
            uint64_t seq = be64(zmq_msg_data(&fr[1]));
            if (seq < MAX_BATCHES)
                live[seq] = (msg){true, dup_bytes(zmq_msg_data(&fr[2]), zmq_msg_size(&fr[2])), zmq_msg_size(&fr[2])};
            joined = true;
        }
        close_frames(fr, n);
    }
    CHECKF(joined, "the subscriber received nothing within 20 s");

    /* the workload */
    hr_kv_observer obs = hr_kv_events_observer(ev);
    CHECK(hr_kv_pool_set_observer(pool, &obs, &err) == HR_OK);
    hr_kv_seq held[2];
    int n_held = 0;
    for (int r = 0; r < N_REQ; r++) run_request(pool, ev, held, &n_held);
    CHECK(hr_kv_pool_check(pool, &err) == HR_OK);
    hr_kv_pool_ledger led;
    hr_kv_pool_get_ledger(pool, &led);
    CHECKF(led.prefix_hit_tokens_total > 0 && led.blocks_evicted_total > 0,
           "the workload mixes prefix hits (%llu tokens) and evictions (%llu blocks)",
           (unsigned long long)led.prefix_hit_tokens_total, (unsigned long long)led.blocks_evicted_total);

    CHECK(hr_kv_events_flush(ev, 10000));
    hr_kv_events_stats stats;
    hr_kv_events_get_stats(ev, &stats);
    CHECK(stats.dropped == 0 && stats.send_errors == 0);
    CHECK(stats.batches > 10 && stats.batches < MAX_BATCHES);
    drain_live(sub, 2000);

    /* replay: everything from 0 (the ring keeps 10000 batches) gives the same bytes as live */
    int got = replay_from(dealer, 0);
    CHECKF(got == (int)stats.batches, "replay from 0 returned %d of %llu batches", got,
           (unsigned long long)stats.batches);
    int n_live = 0, same = 0;
    for (uint64_t s = 0; s < stats.batches && s < MAX_BATCHES; s++) {
        if (!live[s].have) continue;
        n_live++;
        same +=
            replayed[s].have && replayed[s].len == live[s].len && !memcmp(replayed[s].data, live[s].data, live[s].len);
    }
    CHECKF(n_live > 0 && same == n_live, "%d live batches, %d equal to their replay", n_live, same);
    /* a replay from the middle starts there */
    uint64_t mid = stats.batches / 2;
    for (int i = 0; i < MAX_BATCHES; i++) free(replayed[i].data), replayed[i] = (msg){0};
    got = replay_from(dealer, mid);
    CHECK(got == (int)(stats.batches - mid) && replayed[mid].have && (mid == 0 || !replayed[mid - 1].have));
    /* a malformed request gets only the end marker */
    zmq_send(dealer, "", 0, ZMQ_SNDMORE);
    zmq_send(dealer, "abc", 3, 0);
    zmq_msg_t fr[4];
    int n = recv_frames(dealer, fr, 10000);
    CHECK(n == 3 && zmq_msg_size(&fr[1]) == 8 && ((uint8_t *)zmq_msg_data(&fr[1]))[0] == 0xff);
    close_frames(fr, n);

    /* rebuild the cache from the events, in sequence order, live where received and replay to fill gaps */
    for (int i = 0; i < MAX_BATCHES; i++) free(replayed[i].data), replayed[i] = (msg){0};
    CHECK(replay_from(dealer, 0) == (int)stats.batches);
    for (uint64_t s = 0; s < stats.batches; s++) {
        const msg *m = live[s].have ? &live[s] : &replayed[s];
        CHECKF(m->have, "batch %llu neither live nor replayed", (unsigned long long)s);
        if (m->have) apply_batch(m->data, m->len);
    }
    CHECK(bad_events == 0);
    CHECK(n_stored_events > 0 && n_removed_events > 0 && n_cleared_events > 0);
    if (n_layers > 1) { /* both groups' blocks came and went, each event in one group */
        int n_win = 0;
        for (int g = 0; g < pool_groups->n_groups; g++) {
            CHECKF(n_group_events[g] > 0, "no event of group %d", g);
            n_win += pool_groups->kinds[pool_groups->group_kind[g]].window > 0;
        }
        CHECK(pool_groups->n_groups == 2 && n_win == 1);
    }
    uint64_t *want = calloc(MAX_SET, sizeof *want);
    int n_want = hr_kv_pool_prefix_hashes(pool, want, MAX_SET);
    int missing = 0;
    for (int i = 0; i < n_want; i++) missing += set_find(want[i]) < 0;
    CHECKF(n_want == n_set && missing == 0, "pool holds %d cached blocks, the events %d, %d missing", n_want, n_set,
           missing);
    printf("kv events, %d group(s): %llu batches, %llu events (%d stored, %d removed, %d cleared), %d live, %d blocks "
           "cached\n",
           pool_groups->n_groups, (unsigned long long)stats.batches, (unsigned long long)stats.events, n_stored_events,
           n_removed_events, n_cleared_events, n_live, n_want);
    free(want);

    hr_kv_pool_set_observer(pool, NULL, NULL);
    hr_kv_pool_destroy(pool);
    hr_kv_events_destroy(ev);
    zmq_close(sub);
    zmq_close(dealer);
    zmq_ctx_term(zctx);
    for (int i = 0; i < MAX_BATCHES; i++) free(live[i].data), free(replayed[i].data);
}

int main(void) {
    hr_error err = {0};
    hr_kv_events *ev = NULL;

    /* bad input: endpoints that are not tcp://HOST:PORT, a port already bound */
    hr_kv_events_params bp = hr_kv_events_default_params();
    bp.endpoint = "http://127.0.0.1:5557";
    CHECK(hr_kv_events_create(&bp, &ev, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "http://127.0.0.1:5557"));
    bp.endpoint = "tcp://127.0.0.1:port";
    CHECK(hr_kv_events_create(&bp, &ev, &err) == HR_ERR_INVALID_ARG);
    CHECK(ev == NULL);

    run_case(1, 0);  /* one group: the events as before */
    run_case(2, 16); /* a 16-token window layer beside a full one: two groups */
    return hr_test_finish();
}

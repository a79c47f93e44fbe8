/* kv_remote.c: the Redis KV tier (see kv_remote.h for keys, checks and threads). */
#include "remote/kv_remote.h"
#include "common/util.h"
#include "kv/kv_storage.h" /* HR_KV_BLOCK_LAYOUT */

#include <errno.h>
#include <hiredis/hiredis.h>
#include <hiredis/sds.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

#define KR_MAGIC  0x31424c4b564b5248ull /* "HRKVKLB1" little-endian: the metadata's first 8 bytes */
#define KR_LAYOUT HR_KV_BLOCK_LAYOUT    /* the bytes a storage's read_block gives (kv/kv_storage.h) */
enum { KR_META_FIXED = 8 * 6 + 4 * 8 }; /* bytes before the token ids */

typedef struct kr_item { /* one block waiting to be written */
    struct kr_item *next;
    char key[40];
    uint8_t *meta;
    size_t meta_len;
    uint8_t *data;
    size_t data_len;
} kr_item;

struct hr_kv_remote {
    hr_kv_remote_params p;
    char *host;
    int port;
    uint64_t ns; /* namespace: the model id's hash */
    hr_kv_config cfg;
    uint64_t block_bytes;
    hr_kv_groups groups; /* the pool's layer groups: a hybrid pool's blocks are keyed per group */

    redisContext *rd;     /* engine thread: fetches */
    double rd_down_until; /* monotonic seconds: no reconnect before */
    uint8_t *meta_buf;    /* engine thread: the expected metadata of a fetch */

    pthread_t writer;
    bool writer_started;
    pthread_mutex_t mu;
    pthread_cond_t cv, done_cv;
    kr_item *head, *tail;                          /* the write queue, under mu */
    uint64_t queued_bytes, n_enqueued, n_finished; /* under mu */
    bool stop;                                     /* under mu */
    hr_kv_remote_stats st;                         /* under mu */
    int n_logged;                                  /* rejections logged (capped), under mu */
};

static uint64_t kr_hash_bytes(const void *data, size_t n, uint64_t seed) {
    const uint8_t *b = data;
    uint64_t h = hr_mix64(seed ^ n);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = hr_mix64(h ^ w) + i;
    }
    uint64_t tail = 0;
    memcpy(&tail, b + i, n - i);
    return hr_mix64(h ^ tail ^ 0xa5a5a5a5a5a5a5a5ull);
}

static void kr_log(hr_kv_remote *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void kr_log(hr_kv_remote *r, const char *fmt, ...) {
    if (!r->p.log) return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    r->p.log(r->p.log_ctx, line);
}

/* ---- metadata ------------------------------------------------------------------------------------ */

static uint8_t *kr_put64(uint8_t *o, uint64_t v) {
    for (int i = 0; i < 8; i++) o[i] = (uint8_t)(v >> (8 * i));
    return o + 8;
}
static uint8_t *kr_put32(uint8_t *o, uint32_t v) {
    for (int i = 0; i < 4; i++) o[i] = (uint8_t)(v >> (8 * i));
    return o + 4;
}

static size_t kr_meta_len(const hr_kv_remote *r) { return KR_META_FIXED + 4 * (size_t)r->cfg.block_size; }

/* Everything a reader must find equal, in a fixed little-endian layout. */
static void kr_meta(const hr_kv_remote *r, const hr_kv_block_info *b, uint64_t checksum, uint8_t *o) {
    o = kr_put64(o, KR_MAGIC);
    o = kr_put64(o, r->ns);
    o = kr_put64(o, b->hash);
    o = kr_put64(o, b->has_parent ? b->parent : 0);
    o = kr_put64(o, r->block_bytes);
    o = kr_put64(o, checksum);
    o = kr_put32(o, b->has_parent);
    o = kr_put32(o, (uint32_t)b->block_size);
    o = kr_put32(o, (uint32_t)r->cfg.k_format);
    o = kr_put32(o, (uint32_t)r->cfg.v_format);
    o = kr_put32(o, (uint32_t)r->cfg.n_layers);
    o = kr_put32(o, (uint32_t)r->cfg.n_kv_heads);
    o = kr_put32(o, (uint32_t)r->cfg.head_dim);
    o = kr_put32(o, KR_LAYOUT);
    for (int i = 0; i < b->block_size; i++) o = kr_put32(o, (uint32_t)b->tokens[i]);
}

/* A hybrid pool's group g in a block's key and checksum (0 on a one-group pool: its keys as before).
 * The group's hash already differs per group (kv_group_hash); the salt also covers the group's kind
 * and slots, so a block of another grouping of the same layers never matches. */
static uint64_t kr_group_salt(const hr_kv_remote *r, int g) {
    if (r->groups.n_groups <= 1 || g < 0 || g >= r->groups.n_groups) return 0;
    const hr_kv_kind_info *k = &r->groups.kinds[r->groups.group_kind[g]];
    return hr_mix64(0x67726f7570000000ull ^ (uint64_t)g ^ (uint64_t)k->window << 8 ^ (uint64_t)k->latent << 40 ^
                    (uint64_t)r->groups.slots << 48);
}

static void kr_key(const hr_kv_remote *r, uint64_t hash, int group, char *out, size_t n) {
    snprintf(out, n, "hrkv:%016llx", (unsigned long long)hr_mix64(r->ns ^ hr_mix64(hash) ^ kr_group_salt(r, group)));
}

/* ---- connections --------------------------------------------------------------------------------- */

static redisContext *kr_connect(const hr_kv_remote *r, char *why, size_t why_n) {
    struct timeval tv = {.tv_sec = r->p.timeout_ms / 1000, .tv_usec = (r->p.timeout_ms % 1000) * 1000};
    redisContext *c = redisConnectWithTimeout(r->host, r->port, tv);
    if (!c || c->err) {
        snprintf(why, why_n, "%s", c ? c->errstr : "out of memory");
        if (c) redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    redisReply *rep = redisCommand(c, "PING");
    bool ok = rep && rep->type != REDIS_REPLY_ERROR;
    if (!ok) snprintf(why, why_n, "%s", rep ? rep->str : c->errstr);
    if (rep) freeReplyObject(rep);
    if (!ok) {
        redisFree(c);
        return NULL;
    }
    return c;
}

/* ---- fetch (engine thread) ----------------------------------------------------------------------- */

static void kr_count(hr_kv_remote *r, uint64_t *field, uint64_t bytes_in) {
    pthread_mutex_lock(&r->mu);
    (*field)++;
    r->st.bytes_in += bytes_in;
    pthread_mutex_unlock(&r->mu);
}

static void kr_reject(hr_kv_remote *r, const hr_kv_block_info *b, const char *why) {
    pthread_mutex_lock(&r->mu);
    r->st.rejected++;
    bool log = r->n_logged++ < 20;
    pthread_mutex_unlock(&r->mu);
    if (log) kr_log(r, "kv-remote: block %016llx rejected (%s); recomputing it", (unsigned long long)b->hash, why);
}

bool hr_kv_remote_fetch(hr_kv_remote *r, const hr_kv_block_info *b, void *out, uint64_t n_bytes) {
    if (n_bytes != r->block_bytes || b->block_size != r->cfg.block_size) return false;
    if (!r->rd) {
        if (hr_time_now() < r->rd_down_until) return false;
        char why[256];
        r->rd = kr_connect(r, why, sizeof why);
        if (!r->rd) {
            r->rd_down_until = hr_time_now() + 1.0;
            return false;
        }
        kr_log(r, "kv-remote: reconnected to %s:%d", r->host, r->port);
    }
    char key[40];
    kr_key(r, b->hash, b->group, key, sizeof key);
    redisReply *rep = redisCommand(r->rd, "MGET %s:m %s:d", key, key);
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 2) {
        kr_log(r, "kv-remote: %s:%d: %s; recomputing without the tier for a second", r->host, r->port,
               rep && rep->type == REDIS_REPLY_ERROR ? rep->str : r->rd->errstr);
        if (rep) freeReplyObject(rep);
        redisFree(r->rd);
        r->rd = NULL;
        r->rd_down_until = hr_time_now() + 1.0;
        kr_count(r, &r->st.fetch_errors, 0);
        return false;
    }
    const redisReply *m = rep->element[0], *d = rep->element[1];
    bool ok = false;
    if (m->type != REDIS_REPLY_STRING) {
        kr_count(r, &r->st.missed, 0);
    } else if (d->type != REDIS_REPLY_STRING || d->len != n_bytes) {
        kr_reject(r, b, d->type != REDIS_REPLY_STRING ? "its bytes are gone" : "its size differs");
    } else {
        /* the metadata must equal what this pool would have written for this block and these bytes */
        size_t ml = kr_meta_len(r);
        kr_meta(r, b, kr_hash_bytes(d->str, d->len, r->ns ^ kr_group_salt(r, b->group)), r->meta_buf);
        if (m->len != ml || memcmp(m->str, r->meta_buf, ml) != 0) {
            kr_reject(r, b, "metadata or checksum mismatch: another model, format, shape or a torn write");
        } else {
            memcpy(out, d->str, n_bytes);
            kr_count(r, &r->st.fetched, n_bytes + ml);
            ok = true;
        }
    }
    freeReplyObject(rep);
    return ok;
}

/* ---- store (engine thread queues, writer thread sends) ------------------------------------------- */

void hr_kv_remote_on_stored(hr_kv_remote *r, const hr_kv_block_info *b) {
    if (b->fetched || b->block_size != r->cfg.block_size) return; /* it is in Redis already */
    size_t ml = kr_meta_len(r), need = ml + r->block_bytes + sizeof(kr_item);
    pthread_mutex_lock(&r->mu);
    bool full = r->queued_bytes + need > r->p.queue_bytes;
    pthread_mutex_unlock(&r->mu);
    kr_item *it = full ? NULL : calloc(1, sizeof *it);
    uint8_t *data = it ? malloc(r->block_bytes) : NULL, *meta = data ? malloc(ml) : NULL;
    if (!meta || !hr_kv_pool_read_block(r->p.pool, b->hash, data, r->block_bytes)) {
        free(it);
        free(data);
        free(meta);
        pthread_mutex_lock(&r->mu);
        r->st.dropped++;
        pthread_mutex_unlock(&r->mu);
        return;
    }
    kr_meta(r, b, kr_hash_bytes(data, r->block_bytes, r->ns ^ kr_group_salt(r, b->group)), meta);
    kr_key(r, b->hash, b->group, it->key, sizeof it->key);
    it->data = data, it->data_len = r->block_bytes, it->meta = meta, it->meta_len = ml;
    pthread_mutex_lock(&r->mu);
    if (r->tail)
        r->tail->next = it;
    else
        r->head = it;
    r->tail = it;
    r->queued_bytes += need;
    r->n_enqueued++;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* SET key:d with the block's bytes written straight from the item: hiredis would copy them into its
 * output buffer and, after each partial write(), move what is left to the front (a 2 MiB block took
 * about 30 MiB of memmove and page faults, 0.03-0.06 GB/s on loopback). The header and the bytes go
 * out with writev() on the context's socket (its send timeout bounds each call); the reply is read by
 * hiredis as usual. False on any error, the connection then being in an unknown state. */
static bool kr_send_data(redisContext *c, const kr_item *it) {
    char head[160];
    size_t klen = strlen(it->key) + 2;
    int hn =
        snprintf(head, sizeof head, "*3\r\n$3\r\nSET\r\n$%zu\r\n%s:d\r\n$%zu\r\n", klen, it->key, (size_t)it->data_len);
    if (hn <= 0 || (size_t)hn >= sizeof head || sdslen(c->obuf) != 0) return false;
    struct iovec v[3] = {{head, (size_t)hn}, {it->data, (size_t)it->data_len}, {(void *)"\r\n", 2}};
    int iv = 0;
    while (iv < 3) {
        ssize_t w = writev(c->fd, v + iv, 3 - iv);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        size_t left = (size_t)w;
        while (iv < 3 && left >= v[iv].iov_len) left -= v[iv++].iov_len;
        if (iv < 3) {
            v[iv].iov_base = (char *)v[iv].iov_base + left;
            v[iv].iov_len -= left;
        }
    }
    redisReply *rep = NULL;
    if (redisGetReply(c, (void **)&rep) != REDIS_OK) return false;
    bool ok = rep && rep->type == REDIS_REPLY_STATUS;
    if (rep) freeReplyObject(rep);
    return ok;
}

/* SET key:d, then (acknowledged) SET key:m. False on any error. */
static bool kr_write(redisContext *c, const kr_item *it) {
    if (!kr_send_data(c, it)) return false;
    redisReply *rep = redisCommand(c, "SET %s:m %b", it->key, it->meta, it->meta_len);
    bool ok = rep && rep->type == REDIS_REPLY_STATUS;
    if (rep) freeReplyObject(rep);
    return ok;
}

static void *kr_writer(void *arg) {
    hr_kv_remote *r = arg;
    redisContext *c = NULL;
    double down_until = 0;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->head && !r->stop) pthread_cond_wait(&r->cv, &r->mu);
        kr_item *it = r->head;
        if (!it) break; /* stop, and nothing left */
        r->head = it->next;
        if (!r->head) r->tail = NULL;
        pthread_mutex_unlock(&r->mu);

        bool ok = false;
        if (!c && hr_time_now() >= down_until) {
            char why[256];
            c = kr_connect(r, why, sizeof why);
            if (!c) down_until = hr_time_now() + 1.0;
        }
        if (c) {
            ok = kr_write(c, it);
            if (!ok) { /* the connection is in an unknown state: start a fresh one later */
                redisFree(c);
                c = NULL;
                down_until = hr_time_now() + 1.0;
            }
        }
        pthread_mutex_lock(&r->mu);
        if (ok) {
            r->st.stored++;
            r->st.bytes_out += it->data_len + it->meta_len;
        } else {
            r->st.store_errors++;
        }
        r->queued_bytes -= it->data_len + it->meta_len + sizeof *it;
        r->n_finished++;
        pthread_cond_broadcast(&r->done_cv);
        free(it->data);
        free(it->meta);
        free(it);
    }
    pthread_mutex_unlock(&r->mu);
    if (c) redisFree(c);
    return NULL;
}

bool hr_kv_remote_flush(hr_kv_remote *r, int timeout_ms) {
    struct timespec until = hr_deadline_after_ms(timeout_ms);
    pthread_mutex_lock(&r->mu);
    uint64_t want = r->n_enqueued;
    int rc = 0;
    while (r->n_finished < want && rc == 0) rc = pthread_cond_timedwait(&r->done_cv, &r->mu, &until);
    bool done = r->n_finished >= want;
    pthread_mutex_unlock(&r->mu);
    return done;
}

/* ---- lifecycle ----------------------------------------------------------------------------------- */

static void kr_obs_stored(void *ctx, const hr_kv_block_info *b) { hr_kv_remote_on_stored(ctx, b); }
static bool kr_obs_fetch(void *ctx, const hr_kv_block_info *b, void *out, uint64_t n) {
    return hr_kv_remote_fetch(ctx, b, out, n);
}
hr_kv_observer hr_kv_remote_observer(hr_kv_remote *r) {
    return (hr_kv_observer){.stored = kr_obs_stored, .fetch = kr_obs_fetch, .ctx = r};
}

static bool kr_parse_url(const char *url, char **host, int *port) {
    if (!url || strncmp(url, "redis://", 8) != 0) return false;
    const char *h = url + 8, *colon = strrchr(h, ':');
    size_t hl = colon ? (size_t)(colon - h) : strlen(h);
    if (hl == 0 || hl > 255) return false;
    *port = 6379;
    if (colon) {
        char *end = NULL;
        long v = strtol(colon + 1, &end, 10);
        if (!colon[1] || *end || v < 1 || v > 65535) return false;
        *port = (int)v;
    }
    *host = strndup(h, hl);
    return *host != NULL;
}

hr_status hr_kv_remote_create(const hr_kv_remote_params *p, hr_kv_remote **out, hr_error *err) {
    if (!p->pool) return hr_error_set(err, HR_ERR_INVALID_ARG, "--kv-remote: no pool");
    hr_kv_remote *r = calloc(1, sizeof *r);
    if (!r) return hr_error_set(err, HR_ERR_NOMEM, "--kv-remote: out of memory");
    r->p = *p;
    if (r->p.timeout_ms <= 0) r->p.timeout_ms = 500;
    if (!r->p.queue_bytes) r->p.queue_bytes = 256ull << 20;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    pthread_cond_init(&r->done_cv, NULL);
    if (!kr_parse_url(p->url, &r->host, &r->port)) {
        hr_kv_remote_destroy(r);
        return hr_error_set(err, HR_ERR_INVALID_ARG, "--kv-remote: '%s' is not redis://HOST[:PORT]",
                            p->url ? p->url : "(null)");
    }
    r->cfg = *hr_kv_pool_config(p->pool);
    r->block_bytes = hr_kv_block_bytes(&r->cfg); /* one physical block: one group's slots on a hybrid pool */
    r->groups = *hr_kv_pool_groups(p->pool);
    const char *id = p->model_id ? p->model_id : "";
    r->ns = kr_hash_bytes(id, strlen(id), 0x6872206b762074ull);
    r->meta_buf = malloc(kr_meta_len(r));
    if (!r->meta_buf) {
        hr_kv_remote_destroy(r);
        return hr_error_set(err, HR_ERR_NOMEM, "--kv-remote: out of memory");
    }
    char why[256];
    r->rd = kr_connect(r, why, sizeof why);
    if (!r->rd) {
        hr_status st = hr_error_set(err, HR_ERR_IO, "--kv-remote: cannot reach %s: %s", p->url, why);
        hr_kv_remote_destroy(r);
        return st;
    }
    if (pthread_create(&r->writer, NULL, kr_writer, r) != 0) {
        hr_kv_remote_destroy(r);
        return hr_error_set(err, HR_ERR_IO, "--kv-remote: cannot start the writer thread");
    }
    r->writer_started = true;
    *out = r;
    return HR_OK;
}

void hr_kv_remote_destroy(hr_kv_remote *r) {
    if (!r) return;
    if (r->writer_started) {
        pthread_mutex_lock(&r->mu);
        r->stop = true;
        pthread_cond_signal(&r->cv);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->writer, NULL);
    }
    for (kr_item *it = r->head, *n; it; it = n) {
        n = it->next;
        free(it->data);
        free(it->meta);
        free(it);
    }
    if (r->rd) redisFree(r->rd);
    pthread_cond_destroy(&r->done_cv);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r->meta_buf);
    free(r->host);
    free(r);
}

void hr_kv_remote_get_stats(hr_kv_remote *r, hr_kv_remote_stats *out) {
    pthread_mutex_lock(&r->mu);
    *out = r->st;
    pthread_mutex_unlock(&r->mu);
}

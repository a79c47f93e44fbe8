/* test_kv_pool.c: the block manager under random operations, checked after every operation against
 * hr_kv_pool_check and against a shadow model written independently here (plain arrays, linear scans,
 * blocks identified by the token prefix they hold), plus targeted tests: prefix-share length, data
 * seen through shared blocks, LRU eviction order, budget errors. Seeded and deterministic. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/util.h"
#include "harness.h"
#include "kv/kv.h"

/* ---- shadow model -------------------------------------------------------------------------------- */

enum { SH_MAX_BLOCKS = 64, SH_MAX_SEQS = 8, SH_MAX_TOK = 512, SH_B = 8, SH_DOCS = 3 };

typedef struct {
    int refcnt;
    bool in_map;
    uint64_t key;   /* FNV of the whole token prefix up to and including this block */
    uint64_t stamp; /* when it became cached (LRU: smallest goes first) */
} sh_block;

typedef struct {
    bool active;
    int n_tokens, n_table;
    int table[SH_MAX_BLOCKS];
    int32_t tokens[SH_MAX_TOK];
    int doc;
    int prefix_hits;
    bool swapped;
    int units; /* swap slots held while swapped */
} sh_seq;

typedef struct {
    int n_blocks;
    sh_block blk[SH_MAX_BLOCKS];
    sh_seq seq[SH_MAX_SEQS];
    uint64_t clock, evicted, hits;
    int swap_total, swap_free;
} shadow;

static int sh_count(const shadow *s, int what) { /* 0 free, 1 used, 2 cached */
    int n = 0;
    for (int b = 0; b < s->n_blocks; b++) {
        int st = s->blk[b].refcnt > 0 ? 1 : (s->blk[b].in_map ? 2 : 0);
        n += st == what;
    }
    return n;
}

static uint64_t fnv(const int32_t *t, int n) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) {
        h ^= (uint32_t)t[i];
        h *= 1099511628211ull;
    }
    return h;
}

static int sh_alloc(shadow *s) {
    for (int b = 0; b < s->n_blocks; b++)
        if (s->blk[b].refcnt == 0 && !s->blk[b].in_map) {
            s->blk[b].refcnt = 1;
            return b;
        }
    int best = -1;
    for (int b = 0; b < s->n_blocks; b++)
        if (s->blk[b].refcnt == 0 && s->blk[b].in_map && (best < 0 || s->blk[b].stamp < s->blk[best].stamp)) best = b;
    if (best < 0) return -1;
    s->blk[best].in_map = false;
    s->blk[best].refcnt = 1;
    s->evicted++;
    return best;
}

static void sh_release_blocks(shadow *s, sh_seq *q) {
    for (int i = q->n_table - 1; i >= 0; i--) {
        sh_block *b = &s->blk[q->table[i]];
        if (--b->refcnt == 0 && b->in_map) b->stamp = ++s->clock;
    }
    q->n_table = 0;
}

static void sh_release(shadow *s, sh_seq *q) {
    sh_release_blocks(s, q);
    if (q->swapped) s->swap_free += q->units;
    q->swapped = false;
    q->units = 0;
    q->n_tokens = 0;
    q->prefix_hits = 0;
}

static int sh_find(const shadow *s, uint64_t key) {
    for (int b = 0; b < s->n_blocks; b++)
        if (s->blk[b].in_map && s->blk[b].key == key) return b;
    return -1;
}

static void sh_commit(shadow *s, sh_seq *q, int n) {
    for (int i = 0; i < n; i++) {
        q->n_tokens++;
        if (q->n_tokens % SH_B) continue;
        uint64_t key = fnv(q->tokens, q->n_tokens);
        int b = q->table[q->n_tokens / SH_B - 1];
        if (sh_find(s, key) < 0) {
            s->blk[b].in_map = true;
            s->blk[b].key = key;
        }
    }
}

/* ---- the random test ----------------------------------------------------------------------------- */

static int32_t docs[SH_DOCS][SH_MAX_TOK];

static int32_t next_token(hr_rng *r, const sh_seq *q, int pos) {
    if (hr_rng_uniform(r) < 0.93) return docs[q->doc][pos];
    return (int32_t)(hr_rng_next(r) % 4);
}

static bool compare(const hr_kv_pool *p, const hr_kv_swap *w, const shadow *s, hr_kv_seq *handles, int step,
                    const char *op) {
    hr_error err = {0};
    hr_status rc = hr_kv_pool_check(p, &err);
    CHECKF(rc == HR_OK, "step %d after %s: %s", step, op, err.msg);
    hr_kv_pool_ledger l;
    hr_kv_pool_get_ledger(p, &l);
    bool ok = rc == HR_OK && l.blocks_used == sh_count(s, 1) && l.blocks_cached == sh_count(s, 2) &&
              l.blocks_free == sh_count(s, 0) && l.blocks_evicted_total == s->evicted &&
              l.prefix_hit_tokens_total == s->hits;
    CHECKF(ok, "step %d after %s: used/cached/free/evicted/hits %d/%d/%d/%llu/%llu, shadow %d/%d/%d/%llu/%llu", step,
           op, l.blocks_used, l.blocks_cached, l.blocks_free, (unsigned long long)l.blocks_evicted_total,
           (unsigned long long)l.prefix_hit_tokens_total, sh_count(s, 1), sh_count(s, 2), sh_count(s, 0),
           (unsigned long long)s->evicted, (unsigned long long)s->hits);
    uint64_t waste = 0, swapped = 0, bb = hr_kv_block_bytes(hr_kv_pool_config(p));
    hr_kv_swap_ledger wl;
    hr_kv_swap_get_ledger(w, &wl);
    for (int i = 0; i < SH_MAX_SEQS; i++) swapped += s->seq[i].active ? (uint64_t)s->seq[i].units * bb : 0;
    CHECKF(l.bytes_swapped == swapped && wl.slots_used == s->swap_total - s->swap_free,
           "step %d after %s: swapped %llu bytes (shadow %llu), slots used %d (shadow %d)", step, op,
           (unsigned long long)l.bytes_swapped, (unsigned long long)swapped, wl.slots_used,
           s->swap_total - s->swap_free);
    for (int i = 0; i < SH_MAX_SEQS; i++) {
        if (!s->seq[i].active) continue;
        const sh_seq *q = &s->seq[i];
        waste += q->swapped ? 0 : (uint64_t)q->n_table * SH_B - q->n_tokens;
        hr_kv_seq_ledger sl;
        CHECK(hr_kv_seq_get_ledger(p, handles[i], &sl, &err) == HR_OK);
        bool sok = hr_kv_seq_n_tokens(p, handles[i]) == q->n_tokens && sl.blocks_own + sl.blocks_shared == q->n_table &&
                   sl.bytes_now == (uint64_t)q->n_table * hr_kv_block_bytes(hr_kv_pool_config(p)) &&
                   sl.bytes_peak >= sl.bytes_now && sl.prefix_hit_tokens == q->prefix_hits;
        CHECKF(sok, "step %d after %s: seq %d tokens %d (shadow %d), blocks %d+%d (shadow %d)", step, op, i,
               hr_kv_seq_n_tokens(p, handles[i]), q->n_tokens, sl.blocks_own, sl.blocks_shared, q->n_table);
        ok = ok && sok;
    }
    CHECKF(l.waste_slots == waste, "step %d after %s: waste %llu, shadow %llu", step, op,
           (unsigned long long)l.waste_slots, (unsigned long long)waste);
    return ok && l.waste_slots == waste;
}

static void write_tokens(hr_kv_pool *p, hr_kv_seq h, int from, int to) {
    float k[8], v[8];
    for (int pos = from; pos < to; pos++) {
        for (int i = 0; i < 8; i++) k[i] = v[i] = (float)pos + 0.125f * (float)i;
        hr_kv_write(p, 0, h, pos, k, v);
    }
}

static void test_random(uint64_t seed, int n_ops, int n_blocks, hr_kv_format fmt) {
    hr_kv_config c = {.n_layers = 1,
                      .n_kv_heads = 1,
                      .head_dim = 8,
                      .block_size = SH_B,
                      .k_format = fmt,
                      .v_format = fmt,
                      .max_seqs = SH_MAX_SEQS,
                      .stage_blocks = n_blocks}; /* q4/kivi2: never the limit here (test_kv_formats covers it) */
    c.budget_bytes = hr_kv_block_bytes(&c) * (uint64_t)n_blocks + hr_kv_fixed_bytes(&c);
    /* a block being filled (q4/kivi2) also swaps its f16 tail buffer, in this many extra slots */
    int stage_units = (int)((hr_kv_stage_block_bytes(&c) + hr_kv_block_bytes(&c) - 1) / hr_kv_block_bytes(&c));
    hr_kv_pool *p = NULL;
    hr_error err = {0};
    CHECK(hr_kv_pool_create(&c, &p, &err) == HR_OK);
    static shadow s;
    memset(&s, 0, sizeof s);
    s.n_blocks = n_blocks;
    hr_kv_swap *w = NULL;
    hr_kv_swap_config wc = {.budget_bytes = hr_kv_block_bytes(&c) * (uint64_t)(n_blocks / 2)};
    CHECK(hr_kv_swap_create(p, &wc, &w, &err) == HR_OK);
    s.swap_total = s.swap_free = n_blocks / 2;
    hr_kv_seq handles[SH_MAX_SEQS];
    hr_rng r;
    hr_rng_seed(&r, seed);
    for (int d = 0; d < SH_DOCS; d++)
        for (int i = 0; i < SH_MAX_TOK; i++) docs[d][i] = (int32_t)(hr_rng_next(&r) % 4);
    int counts[8] = {0};
    for (int step = 0; step < n_ops; step++) {
        int op = (int)(hr_rng_next(&r) % 10);
        int si = (int)(hr_rng_next(&r) % SH_MAX_SEQS);
        sh_seq *q = &s.seq[si];
        const char *name = "?";
        if (!q->active) { /* create, and half the time try the prefix cache */
            name = "create";
            hr_kv_seq h;
            CHECK(hr_kv_seq_create(p, &h, &err) == HR_OK);
            int slot = 0;
            while (s.seq[slot].active) slot++;
            q = &s.seq[slot];
            memset(q, 0, sizeof *q);
            q->active = true;
            handles[slot] = h;
            q->doc = (int)(hr_rng_next(&r) % SH_DOCS);
            int n_prompt = 1 + (int)(hr_rng_next(&r) % 120);
            for (int i = 0; i < n_prompt; i++) q->tokens[i] = next_token(&r, q, i);
            if (op < 4) {
                name = "share_prefix";
                int got = -1;
                CHECK(hr_kv_seq_share_prefix(p, h, q->tokens, n_prompt, &got, &err) == HR_OK);
                int want = 0;
                for (int i = 0; i < (n_prompt - 1) / SH_B; i++) {
                    int b = sh_find(&s, fnv(q->tokens, (i + 1) * SH_B));
                    if (b < 0) break;
                    s.blk[b].refcnt++;
                    q->table[q->n_table++] = b;
                    want += SH_B;
                }
                q->n_tokens = want;
                q->prefix_hits = want;
                s.hits += (uint64_t)want;
                CHECKF(got == want, "step %d: share_prefix found %d, shadow %d", step, got, want);
            }
            counts[0]++;
        } else if (q->swapped && op <= 4) { /* a swapped-out sequence cannot grow or fork */
            name = "use_swapped";
            hr_kv_seq h;
            CHECK(hr_kv_seq_reserve(p, handles[si], q->n_tokens + 1, &err) == HR_ERR_INVALID_ARG);
            CHECK(hr_kv_seq_fork(p, handles[si], &h, &err) == HR_ERR_INVALID_ARG);
        } else if (op == 8 || op == 9) {
            int units = (q->n_tokens + SH_B - 1) / SH_B;
            int n_blocks_in = units;
            if (!q->swapped) units += (q->n_tokens % SH_B != 0) * stage_units;
            if (!q->swapped) {
                name = "swap_out";
                hr_status want = units > s.swap_total ? HR_ERR_BUDGET : units > s.swap_free ? HR_ERR_FULL : HR_OK;
                hr_status rc = hr_kv_seq_swap_out(p, w, handles[si], &err);
                CHECKF(rc == want, "step %d: swap out rc %d, shadow %d", step, rc, want);
                if (rc == HR_OK) {
                    sh_release_blocks(&s, q);
                    q->swapped = true;
                    q->units = units;
                    s.swap_free -= units;
                }
                counts[6]++;
            } else {
                name = "swap_in";
                units = n_blocks_in;
                bool fits = units <= sh_count(&s, 0) + sh_count(&s, 2);
                hr_status rc = hr_kv_seq_swap_in(p, handles[si], &err);
                CHECKF(rc == (fits ? HR_OK : HR_ERR_FULL), "step %d: swap in rc %d, shadow fits %d", step, rc, fits);
                if (rc == HR_OK) {
                    for (int i = 0; i < units; i++) q->table[q->n_table++] = sh_alloc(&s);
                    for (int i = 0; i < units; i++) { /* all blocks first, then they become shareable */
                        int b = q->table[i];
                        if ((i + 1) * SH_B > q->n_tokens) continue;
                        uint64_t key = fnv(q->tokens, (i + 1) * SH_B);
                        if (sh_find(&s, key) < 0) {
                            s.blk[b].in_map = true;
                            s.blk[b].key = key;
                        }
                    }
                    q->swapped = false;
                    s.swap_free += q->units;
                    q->units = 0;
                }
                counts[7]++;
            }
        } else if (op <= 2) { /* reserve + write + commit a chunk */
            name = "append";
            int n = 1 + (int)(hr_rng_next(&r) % 30);
            if (q->n_tokens + n > SH_MAX_TOK - 1) n = SH_MAX_TOK - 1 - q->n_tokens;
            int need = (q->n_tokens + n + SH_B - 1) / SH_B - q->n_table;
            bool fits = need <= sh_count(&s, 0) + sh_count(&s, 2);
            hr_status rc = hr_kv_seq_reserve(p, handles[si], q->n_tokens + n, &err);
            CHECKF(rc == (fits ? HR_OK : HR_ERR_FULL), "step %d: reserve rc %d, shadow fits %d", step, rc, fits);
            if (rc == HR_OK) {
                for (int i = 0; i < need; i++) q->table[q->n_table++] = sh_alloc(&s);
                for (int i = q->n_tokens; i < q->n_tokens + n; i++) q->tokens[i] = next_token(&r, q, i);
                write_tokens(p, handles[si], q->n_tokens, q->n_tokens + n);
                hr_kv_seq_commit(p, handles[si], q->tokens + q->n_tokens, n);
                sh_commit(&s, q, n);
            }
            counts[1]++;
        } else if (op == 3) { /* reserve until full */
            name = "reserve_until_full";
            for (;;) {
                int want = q->n_table * SH_B + SH_B;
                if (want > SH_MAX_BLOCKS * SH_B) break;
                bool fits = sh_count(&s, 0) + sh_count(&s, 2) >= 1;
                hr_status rc = hr_kv_seq_reserve(p, handles[si], want, &err);
                CHECK(rc == (fits ? HR_OK : HR_ERR_FULL));
                if (rc != HR_OK) break;
                q->table[q->n_table++] = sh_alloc(&s);
            }
            counts[2]++;
        } else if (op == 4) {
            name = "fork";
            int slot = 0;
            while (slot < SH_MAX_SEQS && s.seq[slot].active) slot++;
            bool tail = q->n_tokens % SH_B != 0;
            bool fits = !tail || sh_count(&s, 0) + sh_count(&s, 2) >= 1;
            hr_kv_seq h = -1;
            hr_status rc = hr_kv_seq_fork(p, handles[si], &h, &err);
            CHECKF(rc == (slot == SH_MAX_SEQS ? HR_ERR_FULL
                          : fits              ? HR_OK
                                              : HR_ERR_FULL),
                   "step %d: fork rc %d", step, rc);
            if (rc == HR_OK) {
                sh_seq *d = &s.seq[slot];
                *d = *q;
                handles[slot] = h;
                d->n_table = 0;
                for (int i = 0; i < q->n_tokens / SH_B; i++) {
                    d->table[d->n_table++] = q->table[i];
                    s.blk[q->table[i]].refcnt++;
                }
                if (tail) d->table[d->n_table++] = sh_alloc(&s);
            }
            counts[3]++;
        } else if (op == 5) {
            name = "reset";
            hr_kv_seq_reset(p, handles[si]);
            sh_release(&s, q);
            counts[4]++;
        } else {
            name = "free";
            hr_kv_seq_free(p, handles[si]);
            sh_release(&s, q);
            q->active = false;
            counts[5]++;
        }
        if (!compare(p, w, &s, handles, step, name)) break;
    }
    printf("%s seed %llu: %d ops (create %d, append %d, fill %d, fork %d, reset %d, free %d, swap out %d, in %d), "
           "evicted %llu, hit tokens %llu\n",
           hr_kv_format_name(fmt), (unsigned long long)seed, n_ops, counts[0], counts[1], counts[2], counts[3],
           counts[4], counts[5], counts[6], counts[7], (unsigned long long)s.evicted, (unsigned long long)s.hits);
    CHECK(s.hits > 0 && s.evicted > 0);
    for (int i = 0; i < SH_MAX_SEQS; i++)
        if (s.seq[i].active) hr_kv_seq_free(p, handles[i]);
    hr_kv_pool_ledger l;
    hr_kv_pool_get_ledger(p, &l);
    CHECK(l.blocks_used == 0 && l.blocks_free + l.blocks_cached == n_blocks && l.waste_slots == 0);
    CHECK(hr_kv_pool_check(p, &err) == HR_OK);
    hr_kv_pool_destroy(p);
    hr_kv_swap_destroy(w);
}

/* ---- targeted tests ------------------------------------------------------------------------------ */

static hr_kv_pool *make_pool(int B, int n_blocks, int D, hr_kv_format f) {
    hr_kv_config c = {
        .n_layers = 2, .n_kv_heads = 2, .head_dim = D, .block_size = B, .k_format = f, .v_format = f, .max_seqs = 8};
    c.budget_bytes = hr_kv_block_bytes(&c) * (uint64_t)n_blocks + hr_kv_fixed_bytes(&c);
    hr_kv_pool *p = NULL;
    hr_error err = {0};
    CHECK(hr_kv_pool_create(&c, &p, &err) == HR_OK);
    return p;
}

static void fill(hr_kv_pool *p, hr_kv_seq s, const int32_t *tokens, int from, int to) {
    const hr_kv_config *c = hr_kv_pool_config(p);
    float k[1024], v[1024];
    for (int pos = from; pos < to; pos++)
        for (int l = 0; l < c->n_layers; l++) {
            for (int i = 0; i < c->n_kv_heads * c->head_dim; i++) {
                k[i] = sinf((float)(tokens[pos] * 31 + pos * 7 + i + l));
                v[i] = cosf((float)(tokens[pos] * 17 + pos * 3 + i - l));
            }
            hr_kv_write(p, l, s, pos, k, v);
        }
    hr_kv_seq_commit(p, s, tokens + from, to - from);
}

static void test_share_1000(int B) {
    hr_kv_pool *p = make_pool(B, 200, 8, HR_KV_F16);
    hr_error err = {0};
    static int32_t tok[1000];
    for (int i = 0; i < 1000; i++) tok[i] = (i * 7919) % 500;
    hr_kv_seq a, b, c;
    CHECK(hr_kv_seq_create(p, &a, &err) == HR_OK);
    CHECK(hr_kv_seq_reserve(p, a, 1000, &err) == HR_OK);
    fill(p, a, tok, 0, 1000);
    int got = -1;
    CHECK(hr_kv_seq_create(p, &b, &err) == HR_OK);
    CHECK(hr_kv_seq_share_prefix(p, b, tok, 1000, &got, &err) == HR_OK);
    CHECKF(got == 999 / B * B, "B=%d: running prefix gave %d tokens, want %d", B, got, 999 / B * B);
    hr_kv_seq_ledger lb;
    CHECK(hr_kv_seq_get_ledger(p, b, &lb, &err) == HR_OK);
    CHECK(lb.blocks_shared == 999 / B && lb.blocks_own == 0 && lb.prefix_hit_tokens == got);
    hr_kv_seq_free(p, a);
    hr_kv_seq_free(p, b);
    CHECK(hr_kv_seq_create(p, &c, &err) == HR_OK);
    CHECK(hr_kv_seq_share_prefix(p, c, tok, 1000, &got, &err) == HR_OK);
    CHECKF(got == 999 / B * B, "B=%d: cached prefix gave %d tokens", B, got);
    /* a prompt that differs in its second block shares only the first */
    tok[B + 1] ^= 1;
    hr_kv_seq d;
    CHECK(hr_kv_seq_create(p, &d, &err) == HR_OK);
    CHECK(hr_kv_seq_share_prefix(p, d, tok, 1000, &got, &err) == HR_OK);
    CHECK(got == B);
    CHECK(hr_kv_pool_check(p, &err) == HR_OK);
    hr_kv_pool_destroy(p);
}

/* Cache scopes (issue 28): a prefix computed in one scope is found only in that scope, the map holds
 * both scopes' copies apart, a reset keeps the scope, a fork copies it, and a sequence holding tokens
 * cannot change scope. */
static void test_scopes(void) {
    const int B = 16, N = 100;
    hr_kv_pool *p = make_pool(B, 64, 8, HR_KV_F16);
    hr_error err = {0};
    int32_t tok[100];
    for (int i = 0; i < N; i++) tok[i] = (i * 31) % 97;
    const uint64_t s1 = 0x1234, s2 = 0x5678;
    hr_kv_seq a, b, c, d, f;
    CHECK(hr_kv_seq_create(p, &a, &err) == HR_OK && hr_kv_seq_set_scope(p, a, s1, &err) == HR_OK);
    CHECK(hr_kv_seq_reserve(p, a, N, &err) == HR_OK);
    fill(p, a, tok, 0, N);
    CHECK(hr_kv_seq_set_scope(p, a, s2, &err) == HR_ERR_INVALID_ARG); /* it holds tokens */
    int got = -1;
    CHECK(hr_kv_seq_create(p, &b, &err) == HR_OK && hr_kv_seq_set_scope(p, b, s2, &err) == HR_OK);
    CHECK(hr_kv_seq_share_prefix(p, b, tok, N, &got, &err) == HR_OK && got == 0);
    CHECK(hr_kv_seq_create(p, &c, &err) == HR_OK); /* the shared scope (0) */
    CHECK(hr_kv_seq_share_prefix(p, c, tok, N, &got, &err) == HR_OK && got == 0);
    CHECK(hr_kv_seq_create(p, &d, &err) == HR_OK && hr_kv_seq_set_scope(p, d, s1, &err) == HR_OK);
    CHECK(hr_kv_seq_share_prefix(p, d, tok, N, &got, &err) == HR_OK && got == (N - 1) / B * B);
    /* the other scope computes its own copy; both stay in the map */
    CHECK(hr_kv_seq_reserve(p, b, N, &err) == HR_OK);
    fill(p, b, tok, 0, N);
    int n_hashes = hr_kv_pool_prefix_hashes(p, NULL, 0);
    CHECKF(n_hashes == 2 * (N / B), "map holds %d hashes, want %d", n_hashes, 2 * (N / B));
    CHECK(hr_kv_seq_fork(p, b, &f, &err) == HR_OK);
    hr_kv_seq_free(p, a);
    hr_kv_seq_free(p, d);
    /* a reset sequence keeps its scope: it finds s2's blocks (the fork and b hold them), not s1's */
    hr_kv_seq_reset(p, b);
    CHECK(hr_kv_seq_share_prefix(p, b, tok, N, &got, &err) == HR_OK && got == (N - 1) / B * B);
    CHECK(hr_kv_pool_check(p, &err) == HR_OK);
    hr_kv_seq_free(p, b);
    hr_kv_seq_free(p, c);
    hr_kv_seq_free(p, f);
    hr_kv_pool_destroy(p);
}

/* Data written by seq A is what seq B reads through the shared blocks (and through a fork). */
static void test_shared_data(hr_kv_format f) {
    enum { B = 16, N = 40, H = 4, D = 16 };
    hr_kv_pool *p = make_pool(B, 32, D, f);
    hr_error err = {0};
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = i % 5;
    hr_kv_seq a, b;
    CHECK(hr_kv_seq_create(p, &a, &err) == HR_OK);
    CHECK(hr_kv_seq_reserve(p, a, N, &err) == HR_OK);
    fill(p, a, tok, 0, N);
    CHECK(hr_kv_seq_create(p, &b, &err) == HR_OK);
    int got = 0;
    CHECK(hr_kv_seq_share_prefix(p, b, tok, N, &got, &err) == HR_OK);
    CHECK(got == 32);
    CHECK(hr_kv_seq_reserve(p, b, N, &err) == HR_OK);
    fill(p, b, tok, got, N);
    hr_kv_seq c;
    CHECK(hr_kv_seq_fork(p, a, &c, &err) == HR_OK);
    CHECK(hr_kv_seq_n_tokens(p, c) == N);
    float q[H * D], oa[H * D], ob[H * D], oc[H * D], scratch[256];
    for (int i = 0; i < H * D; i++) q[i] = sinf((float)i * 0.37f);
    for (int l = 0; l < 2; l++)
        for (int n_ctx = 1; n_ctx <= N; n_ctx++) {
            hr_kv_attention(p, l, a, n_ctx, q, H, 0.3f, oa, scratch);
            hr_kv_attention(p, l, b, n_ctx, q, H, 0.3f, ob, scratch);
            hr_kv_attention(p, l, c, n_ctx, q, H, 0.3f, oc, scratch);
            CHECKF(memcmp(oa, ob, sizeof oa) == 0, "%s: shared prefix differs at n_ctx %d", hr_kv_format_name(f),
                   n_ctx);
            CHECKF(memcmp(oa, oc, sizeof oa) == 0, "%s: fork differs at n_ctx %d", hr_kv_format_name(f), n_ctx);
        }
    /* the fork's tail is a copy: writing the child leaves the parent alone */
    CHECK(hr_kv_seq_reserve(p, c, N + 1, &err) == HR_OK);
    int32_t more[N + 1];
    memcpy(more, tok, sizeof tok);
    more[N] = 99;
    fill(p, c, more, N, N + 1);
    hr_kv_attention(p, 0, a, N, q, H, 0.3f, ob, scratch);
    hr_kv_attention(p, 0, c, N, q, H, 0.3f, oc, scratch);
    hr_kv_attention(p, 0, a, N, q, H, 0.3f, oa, scratch);
    CHECK(memcmp(oa, ob, sizeof oa) == 0);
    CHECK(hr_kv_pool_check(p, &err) == HR_OK);
    hr_kv_pool_destroy(p);
}

static void test_lru(void) {
    enum { B = 8 };
    hr_kv_pool *p = make_pool(B, 4, 8, HR_KV_F32);
    hr_error err = {0};
    int32_t t[3][B + 1];
    hr_kv_seq s[3];
    for (int i = 0; i < 3; i++) { /* three one-block prompts, freed in order 0, 1, 2 */
        for (int j = 0; j <= B; j++) t[i][j] = i * 100 + j;
        CHECK(hr_kv_seq_create(p, &s[i], &err) == HR_OK);
        CHECK(hr_kv_seq_reserve(p, s[i], B, &err) == HR_OK);
        fill(p, s[i], t[i], 0, B);
    }
    for (int i = 0; i < 3; i++) hr_kv_seq_free(p, s[i]);
    hr_kv_pool_ledger l;
    hr_kv_pool_get_ledger(p, &l);
    CHECK(l.blocks_cached == 3 && l.blocks_free == 1 && hr_kv_pool_n_free(p) == 4);
    /* touch prompt 0 again: it becomes the most recently used */
    hr_kv_seq x;
    int got = 0;
    CHECK(hr_kv_seq_create(p, &x, &err) == HR_OK);
    CHECK(hr_kv_seq_share_prefix(p, x, t[0], B + 1, &got, &err) == HR_OK && got == B);
    hr_kv_seq_free(p, x);
    /* two new blocks: the free one, then the LRU head (prompt 1) */
    CHECK(hr_kv_seq_create(p, &x, &err) == HR_OK);
    CHECK(hr_kv_seq_reserve(p, x, 2 * B, &err) == HR_OK);
    hr_kv_pool_get_ledger(p, &l);
    CHECK(l.blocks_evicted_total == 1 && l.blocks_cached == 2);
    hr_kv_seq y;
    CHECK(hr_kv_seq_create(p, &y, &err) == HR_OK);
    CHECK(hr_kv_seq_share_prefix(p, y, t[1], B + 1, &got, &err) == HR_OK);
    CHECK(got == 0);
    CHECK(hr_kv_seq_share_prefix(p, y, t[2], B + 1, &got, &err) == HR_OK);
    CHECK(got == B);
    hr_kv_seq_free(p, y);
    CHECK(hr_kv_seq_reserve(p, x, 3 * B, &err) == HR_OK); /* evicts prompt 0 (prompt 2 was just touched) */
    CHECK(hr_kv_seq_create(p, &y, &err) == HR_OK);
    CHECK(hr_kv_seq_share_prefix(p, y, t[0], B + 1, &got, &err) == HR_OK && got == 0);
    CHECK(hr_kv_seq_share_prefix(p, y, t[2], B + 1, &got, &err) == HR_OK && got == B);
    /* everything is held now: one more block does not fit, and nothing changes */
    CHECK(hr_kv_seq_reserve(p, x, 4 * B, &err) == HR_ERR_FULL);
    CHECK(hr_kv_seq_n_tokens(p, x) == 0);
    CHECK(hr_kv_pool_check(p, &err) == HR_OK);
    hr_kv_pool_destroy(p);
}

static void test_budget(void) {
    hr_kv_config c = {.n_layers = 4,
                      .n_kv_heads = 4,
                      .head_dim = 64,
                      .block_size = 16,
                      .k_format = HR_KV_KIVI2,
                      .v_format = HR_KV_KIVI2,
                      .max_seqs = 16};
    uint64_t bb = hr_kv_block_bytes(&c), fx = hr_kv_fixed_bytes(&c);
    /* default stage_blocks: ceil(512 / 16) for the largest step + max_seqs + 1 */
    CHECK(hr_kv_stage_blocks_for(16, 0, 16) == 32 + 17);
    CHECK(hr_kv_stage_blocks_for(16, 100, 3) == 7 + 4);
    CHECK(fx == 49ull * 4 * 2 * 4 * 16 * 64 * 2);
    hr_kv_pool *p = NULL;
    hr_error err = {0};
    c.budget_bytes = fx + bb - 1;
    CHECK(hr_kv_pool_create(&c, &p, &err) == HR_ERR_BUDGET);
    CHECKF(strstr(err.msg, "tail buffers") != NULL, "%s", err.msg);
    c.budget_bytes = fx + bb;
    CHECK(hr_kv_pool_create(&c, &p, &err) == HR_OK);
    CHECK(hr_kv_pool_n_blocks(p) == 1);
    hr_kv_pool_ledger l;
    hr_kv_pool_get_ledger(p, &l);
    CHECK(l.bytes_total + fx <= c.budget_bytes);
    hr_kv_seq s;
    CHECK(hr_kv_seq_create(p, &s, &err) == HR_OK);
    CHECK(hr_kv_seq_reserve(p, s, 17, &err) == HR_ERR_FULL);
    CHECK(hr_kv_seq_reserve(p, s, 16, &err) == HR_OK);
    hr_kv_pool_destroy(p);
    c.head_dim = 12;
    CHECK(hr_kv_pool_create(&c, &p, &err) == HR_ERR_INVALID_ARG);
    c.max_seqs = 1;
    c.k_format = c.v_format = HR_KV_F16;
    c.budget_bytes = 1;
    CHECK(hr_kv_pool_create(&c, &p, &err) == HR_ERR_BUDGET);
    c.max_seqs = 1;
    c.budget_bytes = 1 << 20;
    CHECK(hr_kv_pool_create(&c, &p, &err) == HR_OK);
    hr_kv_seq s2;
    CHECK(hr_kv_seq_create(p, &s, &err) == HR_OK);
    CHECK(hr_kv_seq_create(p, &s2, &err) == HR_ERR_FULL);
    hr_kv_pool_destroy(p);
}

/* q4/kivi2 tail buffers are taken for the blocks a reserve makes writable and given back as blocks
 * fill: a contiguous slot reserved ahead holds none, a long prefill chunk holds one per block it
 * reaches, a sequence at rest holds only its partial last block. */
enum { LAZY_B = 16 };
static void test_stage_lazy(hr_kv_format f) {
    const int B = LAZY_B;
    hr_kv_config c = {.n_layers = 2,
                      .n_kv_heads = 2,
                      .head_dim = 32,
                      .block_size = B,
                      .k_format = f,
                      .v_format = f,
                      .max_seqs = 2,
                      .max_step_tokens = 64};
    c.budget_bytes = hr_kv_fixed_bytes(&c) + 16 * hr_kv_block_bytes(&c);
    hr_kv_pool *p = NULL;
    hr_error err = {0};
    CHECK(hr_kv_pool_create(&c, &p, &err) == HR_OK);
    CHECK(hr_kv_pool_n_stage(p) == 64 / B + 2 + 1);
    int total = hr_kv_pool_n_stage(p);
    hr_kv_seq s;
    int32_t toks[16 * LAZY_B];
    for (int i = 0; i < 16 * B; i++) toks[i] = i % 97;
    CHECK(hr_kv_seq_create(p, &s, &err) == HR_OK);
    CHECK(hr_kv_seq_reserve_ahead(p, s, 10 * B, &err) == HR_OK); /* a contiguous slot: no buffer yet */
    CHECK(hr_kv_pool_n_stage_free(p) == total);
    CHECK(hr_kv_seq_stage_need(p, s, 3 * B + 1) == 4);
    CHECK(hr_kv_seq_reserve(p, s, 3 * B + 1, &err) == HR_OK); /* a chunk reaching 4 blocks */
    CHECK(hr_kv_pool_n_stage_free(p) == total - 4);
    CHECK(hr_kv_seq_reserve(p, s, 3 * B + 1, &err) == HR_OK); /* idempotent */
    CHECK(hr_kv_pool_n_stage_free(p) == total - 4);
    fill(p, s, toks, 0, 3 * B + 1);
    CHECK(hr_kv_pool_n_stage_free(p) == total - 1); /* three blocks filled and encoded */
    CHECK(hr_kv_pool_check(p, &err) == HR_OK);
    /* more than the free buffers in one reserve: refused, nothing changes */
    CHECK(hr_kv_seq_stage_need(p, s, 3 * B + 1 + (total + 1) * B) == total + 1);
    CHECK(hr_kv_seq_reserve(p, s, 3 * B + 1 + total * B, &err) == HR_ERR_FULL);
    CHECKF(strstr(err.msg, "tail buffers") != NULL, "%s", err.msg);
    CHECK(hr_kv_pool_n_stage_free(p) == total - 1);
    CHECK(hr_kv_pool_check(p, &err) == HR_OK);
    hr_kv_seq_free(p, s);
    CHECK(hr_kv_pool_n_stage_free(p) == total);
    CHECK(hr_kv_pool_check(p, &err) == HR_OK);
    hr_kv_pool_destroy(p);
}

int main(void) {
    test_budget();
    test_stage_lazy(HR_KV_Q4);
    test_stage_lazy(HR_KV_KIVI2);
    test_share_1000(16);
    test_share_1000(8);
    test_share_1000(32);
    test_lru();
    test_scopes();
    for (int f = 0; f < HR_KV_FORMAT_COUNT; f++) test_shared_data((hr_kv_format)f);
    test_random(1, 4000, 24, HR_KV_F16);
    test_random(2, 4000, 48, HR_KV_F16);
    test_random(3, 3000, 12, HR_KV_F16);
    test_random(4, 3000, 24, HR_KV_KIVI2);
    test_random(5, 3000, 16, HR_KV_Q4);
    return hr_test_finish();
}

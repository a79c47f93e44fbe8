/* policy.c: the eviction-policy interface: parsing and checking policy strings, the registry of
 * policies and the dispatch after a commit, setting a policy on a pool or a sequence, and the ledger
 * figures. What policies do to a sequence (holes, masks and scores, top-k) is evict.c's. `full`
 * lives here too (it keeps everything; only a model sliding window makes it drop blocks, through the
 * window code).
 *
 * Invariants (checked by hr_kv_pool_check and tests/test_kv_policy.c):
 *   1. a hole (-1 table entry) is a whole block no query at n_ctx > n_tokens can see in any layer;
 *      s->n_holes counts them, and the waste figure is unchanged by holes (a hole's B slots were
 *      all filled).
 *   2. a dropped block is released like any other: a full hashed block goes to the prefix cache.
 *   3. token-level policies never clear the bit of a token a later query must see (the recent half
 *      for h2o, the observation window and everything after the prompt for snapkv). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv_internal.h"

/* ---- full ---------------------------------------------------------------------------------------- */

static hr_status full_check(const hr_kv_pool *p, const hr_kv_policy *pol, hr_error *err) { return HR_OK; }
static void full_after_commit(hr_kv_pool *p, kv_seq *s) { kv_pol_window.after_commit(p, s); /* model windows */ }

const kv_policy_ops kv_pol_full = {.kind = HR_KV_POLICY_FULL,
                                   .name = "full",
                                   .token_level = false,
                                   .check = full_check,
                                   .after_commit = full_after_commit};

const kv_policy_ops *kv_policy_ops_of(hr_kv_policy_kind k) {
    switch (k) {
    case HR_KV_POLICY_FULL: return &kv_pol_full;
    case HR_KV_POLICY_WINDOW: return &kv_pol_window;
    case HR_KV_POLICY_SINKS: return &kv_pol_sinks;
    case HR_KV_POLICY_H2O: return &kv_pol_h2o;
    case HR_KV_POLICY_SNAPKV: return &kv_pol_snapkv;
    }
    return NULL;
}

/* ---- parsing ------------------------------------------------------------------------------------- */

#define KV_POLICY_HELP                                                                                                 \
    "valid policies: full, window:W, sinks:S,window:W, h2o:B, snapkv:B (or snapkv:B,window:W), with W, S, B "          \
    "positive token counts"

static bool kv_parse_count(const char *v, int *out) {
    if (!*v) return false;
    long n = 0;
    for (const char *c = v; *c; c++) {
        if (*c < '0' || *c > '9') return false;
        n = n * 10 + (*c - '0');
        if (n > (1L << 30)) return false;
    }
    *out = (int)n;
    return true;
}

hr_status hr_kv_policy_parse(const char *text, hr_kv_policy *out, hr_error *err) {
    if (!text || !*text) return hr_error_set(err, HR_ERR_INVALID_ARG, "KV policy is empty; " KV_POLICY_HELP);
    char buf[128];
    if (strlen(text) >= sizeof buf)
        return hr_error_set(err, HR_ERR_INVALID_ARG, "KV policy '%.40s...' is too long; " KV_POLICY_HELP, text);
    snprintf(buf, sizeof buf, "%s", text);
    hr_kv_policy pol = {.kind = HR_KV_POLICY_FULL};
    int have_window = 0, have_sinks = 0, have_h2o = 0, have_snap = 0, have_full = 0;
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(item, ':');
        const char *val = colon ? colon + 1 : NULL;
        if (colon) *colon = 0;
        int n = 0;
        if (!strcmp(item, "full") && !val) {
            have_full++;
            continue;
        }
        if (strcmp(item, "window") && strcmp(item, "sinks") && strcmp(item, "h2o") && strcmp(item, "snapkv"))
            return hr_error_set(err, HR_ERR_INVALID_ARG, "KV policy '%s': unknown item '%s'; " KV_POLICY_HELP, text,
                                item);
        if (!val || !kv_parse_count(val, &n))
            return hr_error_set(err, HR_ERR_INVALID_ARG,
                                "KV policy '%s': '%s' needs a token count (e.g. %s:64); " KV_POLICY_HELP, text, item,
                                item);
        if (n == 0)
            return hr_error_set(err, HR_ERR_INVALID_ARG, "KV policy '%s': %s:0 keeps nothing; use a positive count",
                                text, item);
        if (!strcmp(item, "window")) have_window++, pol.window = n;
        if (!strcmp(item, "sinks")) have_sinks++, pol.sinks = n;
        if (!strcmp(item, "h2o")) have_h2o++, pol.budget = n;
        if (!strcmp(item, "snapkv")) have_snap++, pol.budget = n;
    }
    int kinds = (have_full > 0) + (have_h2o > 0) + (have_snap > 0) + (have_window > 0 && !have_snap);
    if (have_window > 1 || have_sinks > 1 || have_h2o > 1 || have_snap > 1 || have_full > 1 || kinds > 1 ||
        (have_sinks && !have_window) || (have_sinks && (have_h2o || have_snap)) || (have_window && have_h2o))
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "KV policy '%s' mixes items that do not go together; " KV_POLICY_HELP, text);
    if (have_h2o)
        pol.kind = HR_KV_POLICY_H2O;
    else if (have_snap)
        pol.kind = HR_KV_POLICY_SNAPKV;
    else if (have_sinks)
        pol.kind = HR_KV_POLICY_SINKS;
    else if (have_window)
        pol.kind = HR_KV_POLICY_WINDOW;
    *out = pol;
    return HR_OK;
}

const char *hr_kv_policy_str(const hr_kv_policy *pol, char *buf, size_t cap) {
    switch (pol->kind) {
    case HR_KV_POLICY_FULL: snprintf(buf, cap, "full"); break;
    case HR_KV_POLICY_WINDOW: snprintf(buf, cap, "window:%d", pol->window); break;
    case HR_KV_POLICY_SINKS: snprintf(buf, cap, "sinks:%d,window:%d", pol->sinks, pol->window); break;
    case HR_KV_POLICY_H2O: snprintf(buf, cap, "h2o:%d", pol->budget); break;
    case HR_KV_POLICY_SNAPKV:
        if (pol->window)
            snprintf(buf, cap, "snapkv:%d,window:%d", pol->budget, pol->window);
        else
            snprintf(buf, cap, "snapkv:%d", pol->budget);
        break;
    default: snprintf(buf, cap, "?");
    }
    return buf;
}

static int kv_native_max(const hr_kv_pool *p) {
    int mx = 0;
    for (int l = 0; l < p->cfg.n_layers; l++) mx = p->native_window[l] > mx ? p->native_window[l] : mx;
    return mx;
}

hr_status hr_kv_policy_check(const hr_kv_pool *p, const hr_kv_policy *pol, hr_error *err) {
    const kv_policy_ops *ops = pol ? kv_policy_ops_of(pol->kind) : NULL;
    if (!ops) return hr_error_set(err, HR_ERR_INVALID_ARG, "KV policy: unknown kind; " KV_POLICY_HELP);
    int nat = kv_native_max(p);
    char name[64];
    hr_kv_policy_str(pol, name, sizeof name);
    if (nat > 0 && ops->token_level)
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "KV policy %s: this model attends through its own sliding window of %d tokens, which "
                            "already bounds its cache; token eviction needs full attention (use full, window:W or "
                            "sinks:S,window:W with W <= %d)",
                            name, nat, nat);
    /* a policy window wider than the model's only has an effect where some layer attends in full
     * (gemma's global layers): refused only where every layer has a window of its own */
    bool every_layer = true;
    for (int l = 0; l < p->cfg.n_layers; l++) every_layer &= p->native_window[l] > 0;
    if (nat > 0 && every_layer && (pol->kind == HR_KV_POLICY_WINDOW || pol->kind == HR_KV_POLICY_SINKS) &&
        pol->window > nat)
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "KV policy %s: the model's sliding window is %d tokens; a policy window can only be "
                            "smaller (window:W with W <= %d, or full for the model's own)",
                            name, nat, nat);
    return ops->check(p, pol, err);
}

/* ---- setting ------------------------------------------------------------------------------------- */

hr_status hr_kv_pool_set_sliding_window(hr_kv_pool *p, int layer, int window, hr_error *err) {
    if (layer < -1 || layer >= p->cfg.n_layers || window < 0)
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "KV sliding window: layer %d (0..%d or -1 for all), window %d (>= 0)", layer,
                            p->cfg.n_layers - 1, window);
    /* a hybrid pool's groups were made from its config's windows: they are fixed */
    for (int l = 0; p->n_groups > 1 && l < p->cfg.n_layers; l++)
        if ((layer < 0 || l == layer) && p->cfg.layer_window[l] != window)
            return hr_error_set(err, HR_ERR_INVALID_ARG,
                                "KV sliding window %d for layer %d: this pool groups its layers by the windows its "
                                "config gave (layer %d: %d); give the windows in hr_kv_config.layer_window",
                                window, l, l, p->cfg.layer_window[l]);
    for (int l = 0; l < p->cfg.n_layers; l++)
        if (layer < 0 || l == layer) p->native_window[l] = window;
    return HR_OK;
}

hr_status hr_kv_pool_set_attn_softcap(hr_kv_pool *p, float cap, hr_error *err) {
    if (!(cap >= 0.0f) || !isfinite(cap))
        return hr_error_set(err, HR_ERR_INVALID_ARG, "KV attention soft-capping %g (>= 0, 0 = none)", (double)cap);
    p->attn_softcap = cap;
    return HR_OK;
}

hr_status hr_kv_pool_set_default_policy(hr_kv_pool *p, const hr_kv_policy *pol, hr_error *err) {
    hr_status rc = hr_kv_policy_check(p, pol, err);
    if (rc == HR_OK) p->default_pol = *pol;
    return rc;
}

hr_status hr_kv_seq_set_policy(hr_kv_pool *p, hr_kv_seq seq, const hr_kv_policy *pol, hr_error *err) {
    if (!kv_seq_valid(p, seq)) return hr_error_set(err, HR_ERR_INVALID_ARG, "KV set_policy: %d is not a sequence", seq);
    kv_seq *s = &p->seqs[seq];
    hr_status rc = hr_kv_policy_check(p, pol, err);
    if (rc != HR_OK) return rc;
    if (s->n_holes > 0 || s->snap_done || (kv_token_level(s) && s->n_tokens > 0))
        return hr_error_set(err, HR_ERR_INVALID_ARG,
                            "KV set_policy: sequence %d has already evicted under its policy; set the policy before "
                            "its first forward (or reset it)",
                            seq);
    hr_kv_policy old = s->pol;
    s->pol = *pol;
    s->meta_n = 0;
    rc = kv_policy_meta_grow(p, s, s->n_table, err);
    if (rc != HR_OK) s->pol = old;
    return rc;
}

hr_kv_policy hr_kv_seq_policy(const hr_kv_pool *p, hr_kv_seq seq) {
    hr_kv_policy none = {.kind = HR_KV_POLICY_FULL};
    return kv_seq_valid(p, seq) ? p->seqs[seq].pol : none;
}

void hr_kv_seq_set_prompt_len(hr_kv_pool *p, hr_kv_seq seq, int n_prompt) {
    if (kv_seq_valid(p, seq) && n_prompt >= 0) p->seqs[seq].prompt_len = n_prompt;
}

void kv_policy_after_commit(hr_kv_pool *p, kv_seq *s) { kv_policy_ops_of(s->pol.kind)->after_commit(p, s); }

/* ---- ledger -------------------------------------------------------------------------------------- */

void kv_policy_ledger(const hr_kv_pool *p, const kv_seq *s, hr_kv_seq_ledger *l) {
    int B = p->cfg.block_size, L = p->cfg.n_layers, Hkv = p->cfg.n_kv_heads, MW = kv_mask_words(p);
    l->policy = s->pol;
    l->blocks_evicted = s->blocks_evicted;
    int n = s->n_tokens, evicted = 0, kept_max = 0;
    if (kv_token_level(s)) {
        for (int l_ = 0; l_ < L; l_++)
            for (int kh = 0; kh < Hkv; kh++) {
                int kept = 0;
                for (int j = 0; j * B < n && j < s->meta_n; j++) {
                    if (s->table[j] < 0) continue;
                    const uint64_t *m = s->mask + kv_meta_index(p, j, l_, kh) * MW;
                    for (int t = 0; t < B && j * B + t < n; t++) kept += (m[t / 64] >> (t % 64)) & 1;
                }
                kept_max = kept > kept_max ? kept : kept_max;
            }
        for (int pos = 0; pos < n; pos++) {
            int j = pos / B, t = pos % B;
            bool seen = false;
            if (j < s->meta_n && s->table[j] >= 0)
                for (int i = 0; i < L * Hkv && !seen; i++)
                    seen = (s->mask[((size_t)j * L * Hkv + i) * MW + t / 64] >> (t % 64)) & 1;
            evicted += !seen;
        }
    } else {
        int S = kv_policy_sinks(s), wmax = 0;
        bool all = false;
        for (int l_ = 0; l_ < L; l_++) {
            int w = kv_layer_window(p, s, l_);
            all |= w == 0;
            wmax = w > wmax ? w : wmax;
        }
        /* the next query sits at position n: it sees positions > n - w, and the sinks */
        int lo = all ? 0 : n + 1 - wmax;
        if (lo < 0) lo = 0;
        int sinks = S < n ? S : n;
        if (lo <= sinks) {
            evicted = 0;
            kept_max = n;
        } else {
            evicted = lo - sinks;
            kept_max = n - evicted;
        }
    }
    l->tokens_evicted = evicted;
    l->tokens_kept_max = kept_max;
}

const char *hr_kv_policy_kind_name(hr_kv_policy_kind kind) {
    const kv_policy_ops *ops = kv_policy_ops_of(kind);
    return ops ? ops->name : "?";
}

int hr_kv_policy_span(const hr_kv_policy *pol) {
    switch (pol->kind) {
    case HR_KV_POLICY_WINDOW: return pol->window;
    case HR_KV_POLICY_SINKS: return pol->sinks + pol->window;
    default: return 0;
    }
}

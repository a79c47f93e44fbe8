/* test_cli_options.c: the CLI's one options table (src/cli/options.c) keeps its promises. Every row
 * has a synopsis, help and a range (numeric rows a min below their max that parse at both ends and
 * refuse just outside; enumerations their values, each of which parses to a distinct value); no name
 * selects two rows of one command; every default parses through its own row and equals the default of
 * the struct it fills (hr_runtime_default_params, hr_server_default_params: a row without a default
 * leaves a zero there, one with a command-only default finds zero), and rows of eval and plan that
 * restate a run flag's default restate it exactly; `headroom CMD --help` (the built binary) shows the
 * synopsis of every row of CMD and names no --flag that is not one of CMD's rows. */
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/options.h"
#include "cli/serve_cluster.h"
#include "harness.h"
#include "sampler/sampler.h" /* hr_sampler_params (plan/plan.h no longer brings it) */

static const struct {
    unsigned bit;
    const char *name;
} cmds[] = {{HR_CMD_RUN, "run"}, {HR_CMD_SERVE, "serve"}, {HR_CMD_EVAL, "eval"}, {HR_CMD_PLAN, "plan"}};

/* The structs a row may fill, zeroed. */
typedef struct dsts_buf {
    hr_session_opts session;
    hr_server_params server;
    hr_eval_cli_opts eval;
    hr_plan_cli_opts plan;
    hr_opt_dsts d;
} dsts_buf;

static void dsts_init(dsts_buf *b) {
    memset(b, 0, sizeof *b);
    b->d.p[HR_DST_SESSION] = &b->session;
    b->d.p[HR_DST_SERVER] = &b->server;
    b->d.p[HR_DST_EVAL] = &b->eval;
    b->d.p[HR_DST_PLAN] = &b->plan;
}

/* The bytes a row's field takes (0: a pointer, compared as a string). */
static size_t field_size(const hr_opt *r) {
    switch (r->type) {
    case HR_OPT_FLAG: return sizeof(bool);
    case HR_OPT_INT:
    case HR_OPT_ENUM: return sizeof(int);
    case HR_OPT_FLOAT: return sizeof(float);
    case HR_OPT_U64:
    case HR_OPT_SIZE: return sizeof(uint64_t);
    case HR_OPT_SIZE_T: return sizeof(size_t);
    case HR_OPT_DOUBLE:
    case HR_OPT_RATE: return sizeof(double);
    case HR_OPT_KV_FORMAT: return sizeof(hr_kv_format);
    case HR_OPT_STR:
    case HR_OPT_CUSTOM: return 0;
    }
    return 0;
}

static bool is_numeric(hr_opt_type t) {
    return t == HR_OPT_INT || t == HR_OPT_U64 || t == HR_OPT_FLOAT || t == HR_OPT_DOUBLE || t == HR_OPT_SIZE ||
           t == HR_OPT_SIZE_T || t == HR_OPT_RATE;
}

static const char *cmd_name(unsigned cmds_mask) {
    for (size_t c = 0; c < sizeof cmds / sizeof cmds[0]; c++)
        if (cmds_mask & cmds[c].bit) return cmds[c].name;
    return "?";
}

/* hr_opts_store with stderr silenced (a refused value prints its one line there). */
static bool store_quiet(const hr_opt *r, const char *text, dsts_buf *b) {
    fflush(stderr);
    int saved = dup(2), null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, 2);
    bool ok = hr_opts_store(r, cmd_name(r->cmds), r->names[0], text, &b->d);
    fflush(stderr);
    if (saved >= 0) dup2(saved, 2);
    if (saved >= 0) close(saved);
    if (null >= 0) close(null);
    return ok;
}

static int enum_count(const hr_opt *r) {
    if (r->values) {
        int n = 0;
        while (r->values[n]) n++;
        return n;
    }
    return r->n_values;
}

static const char *enum_value(const hr_opt *r, int k) { return r->values ? r->values[k] : r->value_name(k); }

static void test_rows_have_help_and_range(void) {
    CHECK(hr_n_opts > 50);
    for (int i = 0; i < hr_n_opts; i++) {
        const hr_opt *r = &hr_opts[i];
        const char *n = r->names[0] ? r->names[0] : "(no name)";
        CHECKF(r->cmds != 0, "row %d (%s) belongs to no command", i, n);
        CHECKF(r->names[0] && r->names[0][0] == '-', "row %d has no flag name", i);
        CHECKF(r->syn && r->names[0] && strstr(r->syn, r->names[0]), "%s: synopsis '%s'", n, r->syn ? r->syn : "");
        CHECKF(r->help && strlen(r->help) >= 10, "%s has no help", n);
        CHECKF(r->sec != 0, "%s has no --help section", n);
        if (r->type == HR_OPT_FLAG) {
            CHECKF(!r->def && r->min == 0 && r->max == 0, "%s: a flag has no value, default or range", n);
            continue;
        }
        if (is_numeric(r->type) || (r->type == HR_OPT_CUSTOM && r->max > 0)) {
            CHECKF(r->min < r->max, "%s: range [%g, %g]", n, r->min, r->max);
            if (r->type == HR_OPT_INT || r->type == HR_OPT_CUSTOM)
                CHECKF(r->min == floor(r->min) && r->max == floor(r->max), "%s: an integer range [%g, %g]", n, r->min,
                       r->max);
        } else if (r->type == HR_OPT_ENUM || r->type == HR_OPT_KV_FORMAT) {
            int nv = enum_count(r);
            CHECKF(nv >= 2, "%s: an enumeration lists %d values", n, nv);
            int seen[64];
            for (int k = 0; k < nv && k < 64; k++) {
                const char *v = enum_value(r, k);
                CHECKF(v && *v, "%s: value %d has no name", n, k);
                dsts_buf b;
                dsts_init(&b);
                /* a sentinel, so that a value stored as 0 is seen as stored */
                memset((char *)b.d.p[r->dst] + r->off, 0x5a, sizeof(int));
                CHECKF(v && store_quiet(r, v, &b), "%s: its own value '%s' is refused", n, v ? v : "");
                memcpy(&seen[k], (char *)b.d.p[r->dst] + r->off, sizeof(int));
                for (int j = 0; j < k; j++) CHECKF(seen[j] != seen[k], "%s: '%s' and value %d store the same", n, v, j);
            }
            dsts_buf b;
            dsts_init(&b);
            CHECKF(!store_quiet(r, "no-such-value", &b), "%s accepts 'no-such-value'", n);
        } else {
            CHECKF(r->range && *r->range, "%s: a %s row says what it accepts (.range)", n,
                   r->type == HR_OPT_STR ? "text" : "custom");
        }
    }
}

/* Numeric rows take their ends and refuse just past them (what the old per-flag checks did). */
static void test_ranges_enforced(void) {
    for (int i = 0; i < hr_n_opts; i++) {
        const hr_opt *r = &hr_opts[i];
        if (!is_numeric(r->type)) continue;
        char lo[64], hi[64], below[64], above[64];
        bool integral = r->type == HR_OPT_INT || r->type == HR_OPT_U64 || r->type == HR_OPT_SIZE ||
                        r->type == HR_OPT_SIZE_T || r->type == HR_OPT_RATE;
        if (integral) {
            snprintf(lo, sizeof lo, "%.0f", r->min);
            snprintf(hi, sizeof hi, "%.0f", r->max >= 1.8e19 ? 1e18 : r->max);
            snprintf(below, sizeof below, "%.0f", r->min - 1);
            snprintf(above, sizeof above, "%.0f", r->max + 1);
        } else {
            snprintf(lo, sizeof lo, "%.9g", r->min);
            snprintf(hi, sizeof hi, "%.9g", r->max);
            snprintf(below, sizeof below, "%.9g", r->min - fabs(r->min) * 0.01 - 1e-3);
            snprintf(above, sizeof above, "%.9g", r->max + fabs(r->max) * 0.01 + 1e-3);
        }
        dsts_buf b;
        dsts_init(&b);
        CHECKF(store_quiet(r, lo, &b), "%s refuses its min %s", r->names[0], lo);
        CHECKF(store_quiet(r, hi, &b), "%s refuses its max %s", r->names[0], hi);
        if (r->min > 0 || r->type == HR_OPT_INT || r->type == HR_OPT_FLOAT || r->type == HR_OPT_DOUBLE)
            CHECKF(!store_quiet(r, below, &b), "%s accepts %s, below its min", r->names[0], below);
        if (r->max < 1.8e19) CHECKF(!store_quiet(r, above, &b), "%s accepts %s, above its max", r->names[0], above);
        CHECKF(!store_quiet(r, "twelve", &b), "%s accepts 'twelve'", r->names[0]);
    }
}

static void test_names_unique_per_command(void) {
    for (size_t c = 0; c < sizeof cmds / sizeof cmds[0]; c++) {
        for (int i = 0; i < hr_n_opts; i++) {
            if (!(hr_opts[i].cmds & cmds[c].bit)) continue;
            for (int k = 0; k < 3 && hr_opts[i].names[k]; k++) {
                const hr_opt *found = hr_opts_find(cmds[c].bit, hr_opts[i].names[k]);
                CHECKF(found == &hr_opts[i], "%s: '%s' selects two rows", cmds[c].name, hr_opts[i].names[k]);
            }
        }
    }
}

/* Where a row's field sits in the reference defaults: its struct's own default, or NULL when that
 * struct has none (eval's and plan's are zero until the table's defaults go in). */
static const char *reference(const hr_opt *r, const hr_runtime_params *rt, const hr_server_params *srv,
                             const hr_session_opts *ses) {
    if (r->dst == HR_DST_SERVER) return (const char *)srv + r->off;
    if (r->dst != HR_DST_SESSION) return NULL;
    size_t rt0 = offsetof(hr_session_opts, rt), s0 = offsetof(hr_session_opts, sampling);
    if (r->off >= rt0 && r->off < rt0 + sizeof(hr_runtime_params)) return (const char *)rt + (r->off - rt0);
    /* sampling: the defaults a request without the field gets (the server's: the sampler's, with
       the CLI's temperature) */
    if (r->off >= s0 && r->off < s0 + sizeof(hr_sampler_params)) return (const char *)&srv->sampling + (r->off - s0);
    return (const char *)ses + r->off; /* the session's own fields: zero by default */
}

static void test_defaults_match_runtime(void) {
    hr_runtime_params rt = hr_runtime_default_params();
    hr_server_params srv = hr_server_default_params();
    hr_session_opts ses = {0}; /* the session's own fields have no default but the table's */
    int n_checked = 0;
    for (int i = 0; i < hr_n_opts; i++) {
        const hr_opt *r = &hr_opts[i];
        const char *n = r->names[0];
        size_t sz = field_size(r);
        const char *ref = reference(r, &rt, &srv, &ses);
        if (!r->dst || r->type == HR_OPT_CUSTOM) continue;
        dsts_buf b;
        dsts_init(&b);
        const char *got = (const char *)b.d.p[r->dst] + r->off;
        if (r->def) CHECKF(store_quiet(r, r->def, &b), "%s: its default '%s' does not parse", n, r->def);
        if (!ref) continue;
        if (r->def && (r->flags & HR_OPTF_OWN_DEFAULT)) {
            /* the command's own default: the struct it fills must have none to contradict it */
            static const char zero[16];
            CHECKF(sz == 0 || !memcmp(ref, zero, sz), "%s: marked as the CLI's own default, but the struct has one", n);
            continue;
        }
        n_checked++;
        if (sz == 0) { /* a string */
            const char *a, *d;
            memcpy(&a, got, sizeof a);
            memcpy(&d, ref, sizeof d);
            CHECKF((!a && !d) || (a && d && !strcmp(a, d)), "%s: table default '%s', runtime's '%s'", n,
                   a ? a : "(none)", d ? d : "(none)");
        } else {
            CHECKF(!memcmp(got, ref, sz), "%s: the table's default '%s' differs from the runtime's", n,
                   r->def ? r->def : "(none: zero)");
        }
    }
    CHECK(n_checked >= 40);
    /* eval and plan restate some of run's flags: the same default, or none */
    for (int i = 0; i < hr_n_opts; i++) {
        const hr_opt *r = &hr_opts[i];
        if (!(r->cmds & (HR_CMD_EVAL | HR_CMD_PLAN)) || !r->def || (r->flags & HR_OPTF_OWN_DEFAULT)) continue;
        const hr_opt *run = hr_opts_find(HR_CMD_RUN, r->names[0]);
        if (!run || run->type != r->type) continue;
        CHECKF(run->def && !strcmp(run->def, r->def), "%s: default '%s' here, '%s' in run", r->names[0], r->def,
               run->def ? run->def : "(none)");
    }
}

/* Whether word (a --flag) names a row of cmd, or is serve's replica flags (cli/serve_cluster.c). */
static bool known_word(unsigned cmd, const char *word) {
    if (!strcmp(word, "--help") || hr_opts_find(cmd, word)) return true;
    if (cmd != HR_CMD_SERVE) return false;
    const char *s = HR_SERVE_CLUSTER_HELP;
    size_t n = strlen(word);
    for (const char *p = strstr(s, word); p; p = strstr(p + 1, word))
        if (p[n] == ' ' || p[n] == '\n') return true;
    return false;
}

static void test_help_lists_the_rows(void) {
    for (size_t c = 0; c < sizeof cmds / sizeof cmds[0]; c++) {
        char args[32], *out = NULL;
        snprintf(args, sizeof args, "%s --help", cmds[c].name);
        int rc = hr_test_run_cli(args, &out, NULL);
        CHECKF(rc == 0 && out, "'%s' exited %d", args, rc);
        if (!out) continue;
        int n_rows = 0;
        for (int i = 0; i < hr_n_opts; i++) {
            if (!(hr_opts[i].cmds & cmds[c].bit)) continue;
            n_rows++;
            CHECKF(strstr(out, hr_opts[i].syn), "'%s' does not show '%s'", args, hr_opts[i].syn);
        }
        CHECKF(n_rows >= 9, "%s has %d rows", cmds[c].name, n_rows);
        /* every --word in the text is a row of this command */
        for (const char *p = strstr(out, "--"); p; p = strstr(p + 2, "--")) {
            if (p > out && (p[-1] == '-' || ((p[-1] >= 'a' && p[-1] <= 'z')))) continue;
            char word[64];
            size_t n = 2;
            while (n < sizeof word - 1 && ((p[n] >= 'a' && p[n] <= 'z') || (p[n] >= '0' && p[n] <= '9') ||
                                           (p[n] == '-' && p[n + 1] >= 'a' && p[n + 1] <= 'z')))
                n++;
            if (n == 2) continue; /* "--" itself, or "---" */
            memcpy(word, p, n);
            word[n] = '\0';
            CHECKF(known_word(cmds[c].bit, word), "'%s' names %s, which is not one of its rows", args, word);
        }
        free(out);
    }
}

int main(void) {
    test_rows_have_help_and_range();
    test_ranges_enforced();
    test_names_unique_per_command();
    test_defaults_match_runtime();
    test_help_lists_the_rows();
    return hr_test_finish();
}

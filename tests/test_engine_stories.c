/* test_engine_stories.c: the engine on the real stories260K model against the reference greedy ids in
 * ../shared/vectors/stories260K-greedy.jsonl (skipped when ../shared is absent). Every reference
 * prompt, replicated to 64 concurrent requests, must give exactly its 48 reference tokens:
 * alone, in batches of 1..64, with prefill chunks of 1..512 tokens, with prefix-cache hits, and in a
 * pool so small that requests are preempted and recomputed. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "greedy_vectors.h"
#include "test_engine_rig.h"

#define MAXV 16
#define NGEN HR_VEC_NGEN

/* Runs n requests (request i uses vector i % nv) and returns how many differ from the reference. */
static int run_case(const hr_model *m, const vec *v, int nv, int n, const rig_opts *o, hr_engine_stats *st) {
    rig r = rig_open(m, o);
    rig_req *q = calloc((size_t)n, sizeof *q);
    for (int i = 0; i < n; i++) {
        q[i].prompt = v[i % nv].ptoks;
        q[i].n_prompt = v[i % nv].np;
        q[i].max_tokens = NGEN;
    }
    rig_run(&r, q, n);
    int bad = 0;
    for (int i = 0; i < n; i++)
        bad += q[i].n_out != NGEN || memcmp(q[i].out, v[i % nv].ctoks, sizeof(int32_t) * NGEN) != 0;
    CHECK(rig_pool_clean(&r));
    hr_engine_get_stats(r.e, st);
    free(q);
    rig_close(&r);
    return bad;
}

/* Prefix-cache hits: wave 1 runs every vector; wave 2, on the same engine, continues each one from
 * its prompt + first 32 reference tokens, so its leading blocks come from the cache, and must give
 * the reference tokens 32..47. */
static void test_prefix_hits(const hr_model *m, const vec *v, int nv) {
    rig_opts o = {.n_blocks = 512, .max_seqs = 16, .max_batch = 512, .admission = HR_ADMIT_ADAPTIVE, .fmt = HR_KV_F32};
    rig r = rig_open(m, &o);
    rig_req q[MAXV];
    int32_t cont[MAXV][64 + NGEN];
    memset(q, 0, sizeof q);
    for (int i = 0; i < nv; i++) q[i].prompt = v[i].ptoks, q[i].n_prompt = v[i].np, q[i].max_tokens = NGEN;
    rig_run(&r, q, nv);
    int bad = 0, hits = 0;
    for (int i = 0; i < nv; i++) bad += memcmp(q[i].out, v[i].ctoks, sizeof(int32_t) * NGEN) != 0;
    memset(q, 0, sizeof q);
    for (int i = 0; i < nv; i++) {
        memcpy(cont[i], v[i].ptoks, sizeof(int32_t) * (size_t)v[i].np);
        memcpy(cont[i] + v[i].np, v[i].ctoks, sizeof(int32_t) * 32);
        q[i].prompt = cont[i], q[i].n_prompt = v[i].np + 32, q[i].max_tokens = NGEN - 32;
    }
    rig_run(&r, q, nv);
    for (int i = 0; i < nv; i++) {
        bad += q[i].n_out != NGEN - 32 || memcmp(q[i].out, v[i].ctoks + 32, sizeof(int32_t) * (NGEN - 32)) != 0;
        hits += q[i].stats.prefix_hit_tokens;
    }
    CHECKF(bad == 0, "prefix hits: %d outputs differ from the reference", bad);
    CHECKF(hits > 0, "wave 2 found no cached prefix");
    CHECK(rig_pool_clean(&r));
    printf("%-44s %2d requests: %s; %d prefix-hit tokens\n", "continuations from the prefix cache", nv,
           bad ? "DIFFER" : "all exact", hits);
    rig_close(&r);
}

int main(void) {
    const char *vpath = hr_test_shared_path("vectors/stories260K-greedy.jsonl");
    const char *mpath = hr_test_shared_path("models/stories260K.gguf");
    if (!vpath || !mpath) HR_SKIP("../shared (stories260K model and vectors) is absent");
    vec v[MAXV];
    int nv = load_vectors(vpath, v, MAXV);
    CHECK(nv >= 8);
    hr_error err = {0};
    hr_model *m = NULL;
    if (hr_model_load(mpath, &m, &err) != HR_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    static const struct {
        int n, blocks, seqs, batch, chunk;
        hr_admission adm;
        const char *what;
    } cases[] = {
        {1, 64, 1, 512, 0, HR_ADMIT_RESERVE, "alone"},
        {4, 256, 4, 512, 0, HR_ADMIT_ADAPTIVE, "batch 4"},
        {16, 512, 16, 512, 0, HR_ADMIT_ADAPTIVE, "batch 16"},
        {64, 1024, 64, 512, 0, HR_ADMIT_ADAPTIVE, "batch 64"},
        {64, 1024, 64, 64, 1, HR_ADMIT_ADAPTIVE, "batch 64, prefill chunk 1"},
        {64, 1024, 64, 128, 7, HR_ADMIT_ADAPTIVE, "batch 64, prefill chunk 7"},
        {64, 40, 32, 256, 0, HR_ADMIT_OPTIMISTIC, "batch 64 in 40 blocks (preemption)"},
        {64, 40, 32, 256, 16, HR_ADMIT_ADAPTIVE, "batch 64 in 40 blocks, adaptive, chunk 16"},
    };
    for (size_t c = 0; c < HR_ARRAY_LEN(cases); c++) {
        for (int i = 0; i < (cases[c].n == 1 ? nv : 1); i++) {
            rig_opts o = {.n_blocks = cases[c].blocks,
                          .max_seqs = cases[c].seqs,
                          .max_batch = cases[c].batch,
                          .prefill_chunk = cases[c].chunk,
                          .admission = cases[c].adm,
                          .fmt = HR_KV_F32};
            hr_engine_stats st;
            /* "alone": each vector by itself (the vectors are rotated so request 0 is vector i) */
            vec one[1];
            const vec *vv = v;
            int nvv = nv;
            if (cases[c].n == 1) {
                one[0] = v[i];
                vv = one;
                nvv = 1;
            }
            int bad = run_case(m, vv, nvv, cases[c].n, &o, &st);
            CHECKF(bad == 0, "%s: %d of %d requests differ from the reference", cases[c].what, bad, cases[c].n);
            if (cases[c].n > 1 || i == nv - 1)
                printf("%-44s %2d requests: %s; %llu steps, peak %d running, %llu prefix-hit, %llu preemptions, "
                       "%llu recomputed\n",
                       cases[c].what, cases[c].n == 1 ? nv : cases[c].n, bad ? "DIFFER" : "all exact",
                       (unsigned long long)st.steps, st.peak_running, (unsigned long long)st.prefix_hit_tokens,
                       (unsigned long long)st.preemptions, (unsigned long long)st.recomputed_tokens);
            if (c == 6) CHECKF(st.preemptions > 0, "the small pool never preempted");
        }
    }
    test_prefix_hits(m, v, nv);
    hr_model_destroy(m);
    return hr_test_finish();
}

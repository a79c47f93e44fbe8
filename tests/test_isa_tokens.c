/* test_isa_tokens.c: `--isa` is a choice of speed only, made by one dispatcher (backend/cpu/isa.h).
 * `headroom run --isa scalar` gives exactly the default run's token ids (greedy), for every KV format
 * with an AVX2 build (and f32, the control), prompts batched and alone. Today the runtime hands
 * --isa to the matmul tables; once the KV storage takes the same choice (hr_cpu_isa_choose, wired at
 * the KV split's merge) this test covers attention too, and fails where a scalar KV kernel does not
 * reduce in its AVX2 build's order. Also the dispatcher's own contract: probed once, forced names
 * clamp to what the CPU has, the matmul tables follow its choice, and the families with only AVX2
 * builds (the KV formats and attention) run them exactly where the choice is AVX2 or above. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/isa.h"
#include "backend/cpu/kernels.h"
#include "harness.h"

/* The completion_token_ids of every result of `headroom run ... --json`, as one JSON text; NULL (and
 * a failed check) when the run fails or prints no tokens. */
static char *token_ids(const char *args) {
    char *out = NULL, *err = NULL;
    int rc = hr_test_run_cli(args, &out, &err);
    CHECKF(rc == 0, "'%s' exited %d: %s", args, rc, err ? err : "");
    json_error_t je;
    json_t *j = out ? json_loads(out, 0, &je) : NULL;
    free(out);
    free(err);
    if (!j) return NULL;
    json_t *res = json_object_get(j, "results"), *ids = json_array();
    if (!res) { /* one prompt: the object itself */
        res = json_array();
        json_array_append(res, j);
    } else {
        json_incref(res);
    }
    size_t i, n_tok = 0;
    json_t *r;
    json_array_foreach(res, i, r) {
        json_t *t = json_object_get(r, "completion_token_ids");
        n_tok += json_array_size(t);
        json_array_append(ids, t ? t : json_null());
    }
    CHECKF(n_tok > 0, "'%s' printed no tokens", args);
    char *text = json_dumps(ids, JSON_COMPACT);
    json_decref(ids);
    json_decref(res);
    json_decref(j);
    return text;
}

static void same_tokens(const char *model, const char *kv, const char *prompts) {
    char a[2048], b[2048];
    snprintf(a, sizeof a, "run -m %s --temp 0 -n 48 --kv-type %s %s --json", model, kv, prompts);
    snprintf(b, sizeof b, "run -m %s --temp 0 -n 48 --kv-type %s %s --isa scalar --json", model, kv, prompts);
    char *ta = token_ids(a), *tb = token_ids(b);
    CHECKF(ta && tb && !strcmp(ta, tb), "%s, KV %s: default %s, --isa scalar %s", model, kv, ta ? ta : "-",
           tb ? tb : "-");
    free(ta);
    free(tb);
}

static void dispatcher_contract(void) {
    const hr_cpu_features f = hr_cpu_detect(), none = {0};
    /* probed once: the same answer every time */
    const hr_cpu_features g = hr_cpu_detect();
    CHECK(!memcmp(&f, &g, sizeof f));
    CHECK(hr_cpu_isa_choose(f, "scalar") == HR_CPU_ISA_SCALAR);
    CHECK(hr_cpu_isa_select("scalar") == HR_CPU_ISA_SCALAR && hr_cpu_isa_select(NULL) == hr_cpu_isa_choose(f, NULL));
    CHECK(hr_cpu_isa_choose(none, NULL) == HR_CPU_ISA_SCALAR); /* clamped to what the CPU has */
    CHECK(hr_cpu_isa_choose(none, "avx512") == HR_CPU_ISA_SCALAR);
    const hr_cpu_isa best = hr_cpu_isa_choose(f, NULL);
    CHECK(hr_cpu_isa_available(f, hr_cpu_isa_name(best)));
    CHECK(best == HR_CPU_ISA_AVX512 || !hr_cpu_isa_available(f, "avx512"));
    CHECK(best >= HR_CPU_ISA_AVX2 || !hr_cpu_isa_available(f, "avx2"));
    CHECK(hr_cpu_isa_choose(f, "avx2") == (hr_cpu_isa_available(f, "avx2") ? HR_CPU_ISA_AVX2 : HR_CPU_ISA_SCALAR));
    hr_cpu_isa parsed;
    CHECK(hr_cpu_isa_parse("avx2", &parsed) && parsed == HR_CPU_ISA_AVX2);
    CHECK(!hr_cpu_isa_parse("sse9", &parsed) && !hr_cpu_isa_available(f, "sse9"));
    /* attention (AVX2 or scalar builds) and the matmul tables follow the one choice */
    CHECK(!hr_cpu_isa_has_avx2(HR_CPU_ISA_SCALAR) && hr_cpu_isa_has_avx2(HR_CPU_ISA_AVX2) &&
          hr_cpu_isa_has_avx2(HR_CPU_ISA_AVX512));
    static const char *names[] = {"scalar", "avx2", "avx512"};
    for (int i = 0; i < 3; i++) {
        if (!hr_cpu_isa_available(f, names[i])) continue;
        hr_kernels k;
        hr_kernels_init(&k, f, names[i]);
        const hr_cpu_isa isa = hr_cpu_isa_choose(f, names[i]);
        /* the table's highest ISA is the choice (avx512 only where the CPU has VNNI for its entries) */
        CHECKF(!strcmp(k.isa, hr_cpu_isa_name(isa)) || (isa == HR_CPU_ISA_AVX512 && !f.avx512vnni),
               "--isa %s: table %s, dispatcher %s", names[i], k.isa, hr_cpu_isa_name(isa));
    }
}

int main(void) {
    dispatcher_contract();
    const char *models[] = {HR_SOURCE_DIR "/models/stories260K-q8_0.gguf",
                            hr_test_shared_path("models/stories260K.gguf")};
    /* the formats with AVX2 encode/decode/attention builds, and f32 (scalar only: the control) */
    static const char *kvs[] = {"f16", "q8", "q4", "fp8", "kivi2", "q4h", "f32"};
    for (int mi = 0; mi < 2; mi++) {
        if (!models[mi]) continue;
        for (size_t k = 0; k < sizeof kvs / sizeof kvs[0]; k++)
            same_tokens(models[mi], kvs[k], "-p 'Once upon a time' -p 'The little dog' -p 'Tom had a red ball'");
        same_tokens(models[mi], "q4", "-p 'Lily went to the park'"); /* one sequence alone */
    }
    return hr_test_finish();
}

/* cuda_forward_quality.c: test_gpu_cuda_forward's agreement with the CPU (test_cuda_forward.c says what the
 * program is): ../shared's F32 greedy vectors exactly; the q8_0 model's and the synthetic mixes' greedy ids,
 * teacher-forced where they part from the CPU's; ../shared's corpus per KV format; prefill attention on the
 * tensor cores against the split kernels. */
#include <jansson.h>
#include <math.h>

#include "cuda_forward_test.h"
#include "greedy_vectors.h"

#include "tokenizer/tokenizer.h"

#define NGEN 48
#define MAXP 8

void test_f32_vectors(const ft_ctx *ft) {
    const char *model = hr_test_shared_path("models/stories260K.gguf");
    const char *vpath = hr_test_shared_path("vectors/stories260K-greedy.jsonl");
    if (!model || !vpath) {
        printf("F32 vectors: skipped (../shared is absent)\n");
        return;
    }
    static vec v[MAXP];
    int n = load_vectors(vpath, v, MAXP);
    hr_error err = {0};
    hr_runtime *rt = open_rt(ft, model, "cuda", HR_RT_KV_F32, &err);
    CHECKF(rt, "open on the GPU: %s", err.msg);
    if (!rt) return;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int32_t got[NGEN];
        int k = generate(rt, v[i].ptoks, v[i].np, HR_VEC_NGEN, got);
        bool ok = k == HR_VEC_NGEN && !memcmp(got, v[i].ctoks, sizeof(int32_t) * (size_t)k);
        if (!ok) {
            int at = 0;
            while (at < k && got[at] == v[i].ctoks[at]) at++;
            fprintf(stderr, "prompt %d: first differs at completion index %d\n", i, at);
        }
        bad += !ok;
    }
    CHECKF(n == 8 && bad == 0, "F32 vectors on the GPU: %d of %d prompts differ", bad, n);
    printf("F32 vectors, f32 KV: %d of %d prompts give the recorded 48 ids\n", n - bad, n);
    hr_runtime_close(rt);
}

/* Greedy on both; where the GPU's completion leaves the CPU's, teacher-forced from there: the GPU's
 * argmax after each longer prefix of the CPU's completion (before it, the two agree by construction).
 * >= 95% of the positions must agree, and every disagreement must be a near-tie on the CPU: the GPU's
 * token the CPU's second choice, within 0.1 of its log-probability (the GPU multiplies f32
 * activations where the CPU quantizes them; a random-weight model's logits are flat, so such ties are
 * common there). fp8 KV: within 0.5, since its codes are 1/8 apart: a K or V element that differs
 * slightly before encoding (those activations) can land one code away, a 6-12% step, where the other
 * formats move by rounding; the device's fp8 bytes and attention are the CPU's exactly and within
 * 1e-3 for the same input (test_cuda_kernels). */
void agreement(const ft_ctx *ft, const char *model, hr_rt_kv_format kvf, const char *label) {
    const float tie_gap = kvf == HR_RT_KV_FP8 ? 0.5f : 0.1f;
    static const int32_t prompts[][5] = {{1, 403, 407, 261, 378}, {1, 291, 376, 400, 428}, {1, 423, 268, 329, 290}};
    enum { NP = 5, NG = 24 };
    hr_error err = {0};
    hr_runtime *cpu = open_rt(ft, model, "cpu", kvf, &err);
    CHECKF(cpu, "%s: open on the CPU: %s", label, err.msg);
    hr_runtime *gpu = open_rt(ft, model, "cuda", kvf, &err);
    CHECKF(gpu, "%s: open on the GPU: %s", label, err.msg);
    if (!cpu || !gpu) {
        hr_runtime_close(cpu);
        hr_runtime_close(gpu);
        return;
    }
    int agree = 0, total = 0, same_greedy = 0, ties = 0;
    float worst_gap = 0.0f;
    for (size_t i = 0; i < sizeof prompts / sizeof prompts[0]; i++) {
        int32_t ref[NG], greedy[NG], seq[NP + NG], one, top[NG * 2];
        float lp[NG * 2];
        CHECK(generate_top2(cpu, prompts[i], NP, NG, ref, top, lp) == NG);
        int k = generate(gpu, prompts[i], NP, NG, greedy), j = 0;
        while (j < k && greedy[j] == ref[j]) j++;
        same_greedy += j == NG;
        agree += j;
        total += j;
        memcpy(seq, prompts[i], sizeof(int32_t) * NP);
        memcpy(seq + NP, ref, sizeof(int32_t) * (size_t)j);
        for (; j < NG; j++) {
            bool same = generate(gpu, seq, NP + j, 1, &one) == 1 && one == ref[j];
            agree += same;
            total++;
            if (!same) { /* a near-tie on the CPU, or a fault */
                bool tie = one == top[2 * j + 1] && lp[2 * j] - lp[2 * j + 1] < tie_gap;
                ties += tie;
                if (one == top[2 * j + 1] && lp[2 * j] - lp[2 * j + 1] > worst_gap)
                    worst_gap = lp[2 * j] - lp[2 * j + 1];
                CHECKF(tie, "%s: prompt %zu step %d: the GPU chose %d, the CPU %d (its second choice %d, %.3f below)",
                       label, i, j, one, ref[j], top[2 * j + 1], (double)(lp[2 * j] - lp[2 * j + 1]));
            }
            seq[NP + j] = ref[j];
        }
    }
    CHECKF(total == 3 * NG && agree * 100 >= total * 95,
           "%s: the GPU's top-1 agrees with the CPU's at %d of %d positions", label, agree, total);
    printf("%s: teacher-forced top-1 agreement %d of %d (the rest %d near-ties, within %.3f of the CPU's "
           "log-probability); %d of 3 greedy completions identical\n",
           label, agree, total, ties, (double)worst_gap, same_greedy);
    hr_runtime_close(cpu);
    hr_runtime_close(gpu);
}

/* llama.cpp's mixes as `headroom synth` writes them (the tiny shape's rows are not whole 256-weight
 * super-blocks, so its K-quant mixes hold q5_0 / q5_1 where llama.cpp falls back to them, and q6_K /
 * q8_0 elsewhere), and bf16 matrices */
void test_mixes(const ft_ctx *ft) {
    static const char *const mixes[][2] = {
        {"--mix Q4_K_M", "Q4_K_M"}, {"--mix Q5_K_M", "Q5_K_M"}, {"--mix Q6_K", "Q6_K"}, {"--type bf16", "bf16"}};
    for (size_t i = 0; i < sizeof mixes / sizeof mixes[0]; i++) {
        char path[512], cmd[1200], label[64];
        snprintf(path, sizeof path, "%s/tiny-%s.gguf", hr_test_tmpdir(), mixes[i][1]);
        snprintf(cmd, sizeof cmd, "'%s' synth --shape tiny %s -o '%s' > /dev/null 2>&1", HR_HEADROOM_BIN, mixes[i][0],
                 path);
        CHECKF(system(cmd) == 0, "synth: %s", cmd);
        snprintf(label, sizeof label, "tiny %s, f16 KV", mixes[i][1]);
        agreement(ft, path, HR_RT_KV_F16, label);
    }
}

/* Teacher-forced top-1 agreement with the CPU on ../shared's corpus (stories260K's own samples; with
 * the F32 model neither side quantizes activations): chunks of 256 tokens (BOS then the text),
 * each scored in one forward pass on both backends with the same KV format; every position's argmax
 * compared. The bar is >= 99% for f16, bf16 and q8; fp8 is reported too. On a GPU every
 * chunk of the corpus; through the emulator (slow: a fiber per GPU thread) the first max_chunks. */
void test_corpus_agreement(const ft_ctx *ft, const char *model, const char *label, int n_fmts, double bar_scale,
                           int max_chunks) {
    const char *text = hr_test_shared_path("corpus/stories260K-samples.txt");
    if (!model || !text) {
        printf("corpus agreement: skipped (../shared is absent)\n");
        return;
    }
    static const struct {
        hr_rt_kv_format f;
        const char *name;
        double bar;
    } fmts[] = {{HR_RT_KV_F16, "f16", 0.99},    {HR_RT_KV_BF16, "bf16", 0.99}, {HR_RT_KV_Q8, "q8", 0.99},
                {HR_RT_KV_FP8, "fp8", 0.95},    {HR_RT_KV_Q4H, "q4h", 0.95},   {HR_RT_KV_Q4, "q4", 0.95},
                {HR_RT_KV_KIVI2, "kivi2", 0.95}};
    enum { CHUNK = 256 };
    FILE *f = fopen(text, "rb");
    char *buf = malloc(1 << 20);
    size_t len = f && buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    if (f) fclose(f);
    for (int fi = 0; fi < n_fmts && fi < (int)(sizeof fmts / sizeof fmts[0]) && buf && len; fi++) {
        hr_error err = {0};
        hr_runtime_params p = rt_params(ft, model, "cpu", fmts[fi].f);
        p.max_batch_tokens = CHUNK;
        p.n_ctx = CHUNK;
        hr_runtime *cpu = NULL, *gpu = NULL;
        CHECKF(hr_runtime_open(&p, &cpu, NULL, &err) == HR_OK, "%s", err.msg);
        p.device = "cuda";
        CHECKF(hr_runtime_open(&p, &gpu, NULL, &err) == HR_OK, "%s", err.msg);
        int32_t *ids = NULL;
        size_t n_ids = 0;
        hr_tokenize_opts to = {.add_bos = false};
        if (cpu && gpu)
            CHECKF(hr_tokenizer_encode_alloc(hr_runtime_tokenizer(cpu), buf, len, &to, &ids, &n_ids, &err) == HR_OK,
                   "%s", err.msg);
        hr_runtime_info info;
        if (cpu) hr_runtime_describe(cpu, &info);
        const int V = cpu ? info.n_vocab : 0;
        float *lc = malloc(sizeof(float) * CHUNK * (size_t)(V > 0 ? V : 1));
        float *lg = malloc(sizeof(float) * CHUNK * (size_t)(V > 0 ? V : 1));
        long agree = 0, total = 0;
        double worst = 0;
        int chunks = 0;
        for (size_t at = 0; ids && lc && lg && at + CHUNK - 1 <= n_ids && (max_chunks <= 0 || chunks < max_chunks);
             at += CHUNK - 1, chunks++) {
            int32_t chunk[CHUNK];
            chunk[0] = 1; /* BOS */
            memcpy(chunk + 1, ids + at, sizeof(int32_t) * (CHUNK - 1));
            hr_rt_score sc;
            if (hr_runtime_score(cpu, NULL, chunk, CHUNK, lc, &sc, &err) != HR_OK ||
                hr_runtime_score(gpu, NULL, chunk, CHUNK, lg, &sc, &err) != HR_OK) {
                CHECKF(false, "corpus %s chunk %d: %s", fmts[fi].name, chunks, err.msg);
                break;
            }
            for (int t = 0; t < CHUNK; t++) {
                const float *a = lc + (size_t)t * V, *b = lg + (size_t)t * V;
                int ia = 0, ib = 0;
                for (int v = 1; v < V; v++) {
                    ia = a[v] > a[ia] ? v : ia;
                    ib = b[v] > b[ib] ? v : ib;
                }
                agree += ia == ib;
                total++;
                for (int v = 0; v < V; v++) worst = fmax(worst, fabs((double)a[v] - b[v]));
            }
        }
        CHECKF(total > 0 && (double)agree >= fmts[fi].bar * bar_scale * (double)total,
               "corpus, %s, %s KV: the GPU's top-1 agrees with the CPU's at %ld of %ld positions", label, fmts[fi].name,
               agree, total);
        printf("corpus, %s, %s KV: teacher-forced top-1 agreement %ld of %ld positions (%.2f%%; %d chunks of %d), "
               "largest logit difference %.4f\n",
               label, fmts[fi].name, agree, total, total ? 100.0 * (double)agree / (double)total : 0.0, chunks, CHUNK,
               worst);
        free(ids);
        free(lc);
        free(lg);
        hr_runtime_close(cpu);
        hr_runtime_close(gpu);
    }
    free(buf);
}

/* Prefill attention on the tensor cores (HEADROOM_CUDA_PREFILL_ATTN=mma, read when the runtime makes
 * its device storage) against the split kernels (the default), on a model: a 40-token prompt scored
 * in one forward pass (one run of 40 rows: hr_k_attn_prefill, in tiles of 64 / G rows) gives every
 * position's logits within `bound` of the split path's, and not all of them bit for bit (the tensor
 * cores ran); a 24-token prompt's greedy completion (a prefill run, then decode rows on the split
 * kernels) gives the same 16 ids. Where the two differ: Q, K and V in f16 and P rounded to f16 (each
 * attention output within about 2^-10 of max|v| plus K's rounding of the scores: test_cuda_kernels'
 * bound), carried through the model's 5 layers to the logits. The bound, 0.05 (3e-3 of these
 * models' largest logit, 17), is not derived through the layers: it is about 3.5x what the
 * emulator measures (0.014 on both models), the hardware's exp2 approximations aside. */
static void prefill_mma_case(const ft_ctx *ft, const char *model, hr_rt_kv_format kvf, const char *label,
                             double bound) {
    enum { NT = 40, NP = 24, NG = 16 };
    int32_t toks[NT];
    for (int i = 0; i < NT; i++) toks[i] = i == 0 ? 1 : 3 + (i * 37) % 500;
    hr_error err = {0};
    hr_runtime *rt[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        if (k) setenv("HEADROOM_CUDA_PREFILL_ATTN", "mma", 1);
        rt[k] = open_rt(ft, model, "cuda", kvf, &err);
        unsetenv("HEADROOM_CUDA_PREFILL_ATTN");
        CHECKF(rt[k], "%s: open on the GPU (%s): %s", label, k ? "mma" : "split", err.msg);
    }
    hr_runtime_info info;
    if (rt[0] && rt[1]) {
        hr_runtime_describe(rt[0], &info);
        float *lg[2] = {malloc(sizeof(float) * NT * (size_t)info.n_vocab),
                        malloc(sizeof(float) * NT * (size_t)info.n_vocab)};
        hr_rt_score sc;
        bool ok = lg[0] && lg[1];
        for (int k = 0; k < 2 && ok; k++) {
            ok = hr_runtime_score(rt[k], NULL, toks, NT, lg[k], &sc, &err) == HR_OK;
            CHECKF(ok, "%s: score: %s", label, err.msg);
        }
        double worst = 0, big = 0;
        bool differ = false;
        for (size_t i = 0; ok && i < (size_t)NT * info.n_vocab; i++) {
            const double d = fabs((double)lg[1][i] - lg[0][i]);
            big = fmax(big, fabs((double)lg[0][i]));
            worst = d != d ? INFINITY : fmax(worst, d);
            differ |= lg[1][i] != lg[0][i];
        }
        CHECKF(ok && worst <= bound, "%s: mma prefill attention's logits %g from the split path's (bound %g)", label,
               worst, bound);
        CHECKF(ok && differ, "%s: the logits are the split path's bit for bit: the mma kernel did not run", label);
        int32_t ids[2][NG];
        int n[2];
        for (int k = 0; k < 2; k++) n[k] = generate(rt[k], toks, NP, NG, ids[k]);
        CHECKF(n[0] == NG && n[1] == NG && !memcmp(ids[0], ids[1], sizeof ids[0]),
               "%s: the greedy completions differ between the mma and split prefill attention", label);
        printf("%s: mma prefill attention, logits of a 40-token prefill (|logit| up to %.3g) within %.3g of the split "
               "path's (bound %g); the greedy ids the same\n",
               label, big, worst, bound);
        free(lg[0]);
        free(lg[1]);
    }
    hr_runtime_close(rt[0]);
    hr_runtime_close(rt[1]);
}

void test_prefill_mma(const ft_ctx *ft) {
    const char *f32 = hr_test_shared_path("models/stories260K.gguf");
    if (f32) prefill_mma_case(ft, f32, HR_RT_KV_F32, "stories260K F32, f32 KV", 0.05);
    prefill_mma_case(ft, HR_SOURCE_DIR "/models/stories260K-q8_0.gguf", HR_RT_KV_F16, "stories260K q8_0, f16 KV", 0.05);
}

/* gpu_bench.c: the GPU's measurements for bench/gpu/check.sh's step 5 (docs/GPU.md, "Measurements").
 *
 *   1. copy:      device-to-device copy bandwidth (hr_cuda_copy), the reference every "% of copy" is of;
 *                 and the logits' download at the e2e batches (what sampling on the device could save),
 *                 into pageable and into page-locked memory, the first's time over the second's;
 *   1a. argmax:   the greedy choice at those batches both ways, the logits downloaded and hr_argmax on the
 *                 host against hr_k_argmax_rows on the device and the ids downloaded (its ids checked
 *                 against the host's), and the first's time over the second's (> 1: the device faster);
 *   2. gemv:      each GEMV kernel at Llama-3-8B's matrix shapes, one token: weight bytes / time;
 *   3. prefill:   the same matrices at 512 tokens, through the GEMV and the tensor-core GEMM (f16, bf16,
 *                 q8_0, q4_0): 2 rows cols T / time;
 *   4. attention: the device KV storage's decode attention (hr_kv_storage_cuda_attend_dev) per KV format
 *                 at 1K, 8K and 32K positions, 16 queries: K and V bytes read / time, through each
 *                 attention kernel on the same storage (hr_kv_storage_cuda_set_attn_kernel: "rows", then
 *                 "split", the default), each checked; then split's time over rows' per format and
 *                 context (which is faster); f16's time over q8's, q4h's and q4's;
 *   4a. attention under token masks (h2o, snapkv) at 8K positions, f16 KV: without masks, with every
 *                 mask bit set (checked bit for bit against the unmasked outputs) and with the scores
 *                 accumulated (hr_k_attn_score; each head's weights checked to sum to 1): ms each, and
 *                 the two masked times over the unmasked one;
 *   4b. prefill attention: a 512-token chunk at Llama-3-8B's shape (H 32/8, D 128) after 0 and 8K
 *                 positions, f16 KV, through the split kernels and through hr_k_attn_prefill (tensor
 *                 cores; kv_storage_cuda.c's HEADROOM_CUDA_PREFILL_ATTN), each checked: TFLOP/s, and
 *                 split's time over mma's (which is faster);
 *   5. e2e:       the runtime's decode steps at batch 1, 16, 64 and a 512-token prefill step on a
 *                 Llama-3-8B-shaped synthetic bf16 model (--e2e-layers of its 32 layers); each decode
 *                 batch launch by launch, then replayed as CUDA graphs (hr_cuda_backend_set_graphs), and
 *                 the two side by side ("eager/graphs": eager time / graphs time, > 1: graphs faster);
 *                 then graphs with the greedy ids picked on the device (hr_cuda_backend_set_argmax) against
 *                 graphs with the logits copied ("logits/argmax": > 1, the device's pick is faster);
 *   6. capacity:  the engine's concurrent 8K sessions at one 16 GiB KV pool per KV format (f16, q8, fp8,
 *                 q4h, q4), each over f16's (run before 5, which takes what time is left).
 *
 * Every kernel's output is checked against the CPU before it is timed (GEMV: the reference
 * dequantization; attention: the CPU KV storage's), at the shape measured; a wrong one fails the run
 * (exit 1) and is not timed. Kernel timing: GPU events (hr_cuda_time_begin / _end) around a loop of R
 * back-to-back reps after a warm-up rep, R chosen so a loop lasts about 2 ms; the figure is the median
 * over the loops of (loop time / R). The e2e figures are host wall-clock time per engine step
 * (hr_runtime_step, logits download and sampling included), median over the steps.
 *
 * Usage: gpu_bench [--driver LIB] [--quick] [--json FILE] [--md FILE] [--commit C] [--driver-version V]
 *                  [--max-seconds S] [--e2e-layers N] [--no-e2e] [--only gemv,attention,capacity,e2e]
 *        gpu_bench --validate FILE.json [FILE.md]   (the files' shape: every expected key, every check ok)
 * --quick: tiny shapes for the emulating driver (seconds on a CPU). Exit 0 when every check passed, 1 when
 * one failed, 2 for usage, 77 when the GPU cannot be opened.
 *
 * This file: the options, the JSON's header, the sections in order, the markdown and --validate; the
 * sections are in gpu_bench_kernels.c (1-3), gpu_bench_attn.c (4) and gpu_bench_engine.c (5, 6), their
 * shared state and helpers in gpu_bench.h and gpu_bench_rows.c. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/cuda.h"
#include "common/util.h"
#include "gpu_bench.h"
#include "plan/plan.h"

#define SCHEMA "headroom-gpu-bench/1"

/* ---- output --------------------------------------------------------------------------------------------- */

static const char *k_sections[] = {"copy", "gemv", "prefill", "attention", "e2e", "capacity"};
static const char *k_titles[] = {
    "1. Device-to-device copy (the reference bandwidth)",
    "2. GEMV, one token (weight bytes / time)",
    "3. Prefill matrix products, GEMV and tensor-core GEMM (2 rows cols T / time)",
    "4. Decode attention, device KV storage (K+V bytes of every query's context / time)",
    "5. End to end through the runtime (wall clock per engine step)",
    "6. Capacity: concurrent sessions at one KV budget (the engine on the GPU)",
};

static void md_escape(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '|') fputc('\\', f);
        fputc(*s, f);
    }
}

static bool write_md(gpu_bench *g, const char *path, const char *device, const char *date) {
    FILE *f = fopen(path, "w");
    if (!f) return false;
    fprintf(f, "# GPU measurements (bench/gpu/gpu_bench%s)\n\n",
            g->o.quick ? " --quick: the emulator's tiny shapes" : "");
    fprintf(f, "- device: %s\n- driver: %s\n- date: %s\n- commit: %s\n", device,
            g->o.driver_version ? g->o.driver_version : "unknown", date, g->o.commit ? g->o.commit : "unknown");
    fprintf(f, "- copy bandwidth (the reference of every %% of copy): %.1f GB/s\n", g->copy_gbs);
    fprintf(f, "- kernels: GPU events around loops of R reps after a warm-up, median over the loops of loop/R "
               "(shown as median (loops x R)); end to end: wall clock per engine step, median over the steps\n");
    fprintf(f, "- checks: %d, failed: %d\n", g->n_checked, g->n_failed);
    for (size_t s = 0; s < HR_ARRAY_LEN(k_sections); s++) {
        fprintf(f, "\n## %s\n\n", k_titles[s]);
        fprintf(f, "| what | shape | value | median (loops x reps) | %% of copy | target | %% of target | check |\n");
        fprintf(f, "| --- | --- | ---: | ---: | ---: | --- | ---: | --- |\n");
        for (int i = 0; i < g->n_rows; i++) {
            const row *r = &g->rows[i];
            if (strcmp(r->section, k_sections[s])) continue;
            fputs("| ", f);
            md_escape(f, r->what);
            fputs(" | ", f);
            md_escape(f, r->shape);
            if (isfinite(r->value))
                fprintf(f, " | %.4g %s", r->value, r->unit);
            else
                fputs(" | -", f);
            if (isfinite(r->median_ms))
                fprintf(f, " | %.4g ms (%dx%d)", r->median_ms, r->loops, r->reps);
            else
                fputs(" | -", f);
            if (isfinite(r->pct_copy))
                fprintf(f, " | %.1f%%", r->pct_copy);
            else
                fputs(" | -", f);
            fputs(" | ", f);
            md_escape(f, r->target[0] ? r->target : "-");
            if (isfinite(r->pct_target))
                fprintf(f, " | %.1f%%", r->pct_target);
            else
                fputs(" | -", f);
            fputs(" | ", f);
            md_escape(f, r->check);
            fputs(" |\n", f);
        }
    }
    return fclose(f) == 0;
}

/* --validate: the JSON as written, read back: every top-level key, every row's keys, sections present,
 * no failed check; the markdown (when given) has every section's title */
static int validate(const char *json_path, const char *md_path) {
    json_error_t je;
    json_t *root = json_load_file(json_path, 0, &je);
    int bad = 0;
    if (!root) {
        printf("validate: %s does not parse: %s (line %d)\n", json_path, je.text, je.line);
        return 1;
    }
    static const char *top[] = {"schema", "device",  "driver_version", "date",    "commit",
                                "quick",  "timing",  "checks",         "targets", "copy",
                                "gemv",   "prefill", "attention",      "e2e",     "capacity"};
    static const char *keys[] = {"what",          "shape",          "value",  "unit",          "median_ms", "loops",
                                 "reps_per_loop", "pct_of_copy_bw", "target", "pct_of_target", "check"};
    for (size_t i = 0; i < HR_ARRAY_LEN(top); i++)
        if (!json_object_get(root, top[i])) {
            printf("validate: no key '%s'\n", top[i]);
            bad++;
        }
    const bool quick = json_is_true(json_object_get(root, "quick"));
    const char *schema = json_string_value(json_object_get(root, "schema"));
    if (!schema || strcmp(schema, SCHEMA)) {
        printf("validate: schema is not %s\n", SCHEMA);
        bad++;
    }
    for (size_t s = 0; s < HR_ARRAY_LEN(k_sections); s++) {
        json_t *arr = json_object_get(root, k_sections[s]);
        if (!json_is_array(arr) || json_array_size(arr) == 0) {
            printf("validate: section '%s' is not a non-empty array\n", k_sections[s]);
            bad++;
            continue;
        }
        size_t i;
        json_t *o;
        int measured = 0;
        json_array_foreach(arr, i, o) {
            for (size_t k = 0; k < HR_ARRAY_LEN(keys); k++)
                if (!json_object_get(o, keys[k])) {
                    printf("validate: %s[%zu] has no '%s'\n", k_sections[s], i, keys[k]);
                    bad++;
                }
            const char *chk = json_string_value(json_object_get(o, "check"));
            if (!chk || !strncmp(chk, "FAIL", 4)) {
                printf("validate: %s[%zu] check: %s\n", k_sections[s], i, chk ? chk : "(none)");
                bad++;
            }
            json_t *v = json_object_get(o, "value");
            bool has = json_is_number(v) && isfinite(json_number_value(v)) && json_number_value(v) > 0;
            measured += has;
            if (!has && (!chk || strncmp(chk, "skipped", 7))) {
                printf("validate: %s[%zu] has neither a value nor a reason it was skipped\n", k_sections[s], i);
                bad++;
            }
        }
        if (!measured && quick) { /* a full run may skip (time budget, refused formats) */
            printf("validate: section '%s' has no measured value\n", k_sections[s]);
            bad++;
        }
    }
    json_t *checks = json_object_get(root, "checks");
    json_t *nf = json_object_get(checks, "failed"), *nc = json_object_get(checks, "passed");
    if (!json_is_integer(nf) || json_integer_value(nf) != 0 || !json_is_integer(nc) || json_integer_value(nc) < 1) {
        printf("validate: checks.passed >= 1 and checks.failed == 0 expected\n");
        bad++;
    }
    json_decref(root);
    if (md_path) {
        FILE *f = fopen(md_path, "r");
        char *text = NULL;
        long n = 0;
        if (f && !fseek(f, 0, SEEK_END) && (n = ftell(f)) > 0 && !fseek(f, 0, SEEK_SET) &&
            (text = calloc((size_t)n + 1, 1)) && fread(text, 1, (size_t)n, f) == (size_t)n) {
            for (size_t s = 0; s < HR_ARRAY_LEN(k_titles); s++)
                if (!strstr(text, k_titles[s])) {
                    printf("validate: %s lacks the section '%s'\n", md_path, k_titles[s]);
                    bad++;
                }
        } else {
            printf("validate: cannot read %s\n", md_path);
            bad++;
        }
        free(text);
        if (f) fclose(f);
    }
    printf("validate: %s%s%s: %s\n", json_path, md_path ? ", " : "", md_path ? md_path : "",
           bad ? "FAILED" : "every key present, every check ok");
    return bad ? 1 : 0;
}

/* --only's list names the section */
static bool wanted(gpu_bench *g, const char *section) {
    if (!g->o.only) return true;
    size_t n = strlen(section);
    for (const char *p = g->o.only; (p = strstr(p, section)) != NULL; p += n)
        if ((p == g->o.only || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) return true;
    return false;
}

static void usage(void) {
    fprintf(stderr,
            "usage: gpu_bench [--driver LIB] [--quick] [--json FILE] [--md FILE] [--commit C] "
            "[--driver-version V] [--max-seconds S] [--e2e-layers N] [--no-e2e] [--only gemv,attention,capacity,e2e]\n"
            "       gpu_bench --validate FILE.json [FILE.md]\n");
    exit(2);
}

int main(int argc, char **argv) {
    gpu_bench run = {.copy_gbs = NAN, .rng = 0x9e3779b97f4a7c15ULL}, *g = &run;
    g->o.max_seconds = 0;
    g->o.e2e = true;
    g->o.e2e_layers = 8;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--validate")) {
            if (!v) usage();
            return validate(v, i + 2 < argc ? argv[i + 2] : NULL);
        } else if (!strcmp(a, "--quick"))
            g->o.quick = true;
        else if (!strcmp(a, "--no-e2e"))
            g->o.e2e = false;
        else if (!v)
            usage();
        else if (!strcmp(a, "--driver"))
            g->o.driver = argv[++i];
        else if (!strcmp(a, "--json"))
            g->o.json = argv[++i];
        else if (!strcmp(a, "--md"))
            g->o.md = argv[++i];
        else if (!strcmp(a, "--only"))
            g->o.only = argv[++i];
        else if (!strcmp(a, "--commit"))
            g->o.commit = argv[++i];
        else if (!strcmp(a, "--driver-version"))
            g->o.driver_version = argv[++i];
        else if (!strcmp(a, "--max-seconds"))
            g->o.max_seconds = atof(argv[++i]);
        else if (!strcmp(a, "--e2e-layers")) {
            g->o.e2e_layers = atoi(argv[++i]);
            if (g->o.e2e_layers < 1 || g->o.e2e_layers > 32) usage();
        } else
            usage();
    }
    if (g->o.max_seconds <= 0) g->o.max_seconds = g->o.quick ? 120 : 300;
    g->t_start = hr_time_now();
    g->deadline = g->t_start + g->o.max_seconds;
    hr_error e = {0};
    if (hr_cuda_device_open(g->o.driver, 0, &g->dev, &e)) {
        printf("gpu_bench: %s\n", e.msg);
        return 77;
    }
    char device[256];
    snprintf(device, sizeof device, "%s", hr_cuda_device_name(g->dev));
    hr_plan_device prof;
    if (hr_plan_device_by_name(device, &prof, &e) == HR_OK) {
        g->spec_gbs = prof.bw_gbps;
        snprintf(g->spec_card, sizeof g->spec_card, "%s", prof.name);
    }
    e = (hr_error){0};
    uint64_t mem_free = 0, mem_total = 0;
    (void)hr_cuda_device_mem(g->dev, &mem_free, &mem_total, &e);
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    printf("gpu_bench%s on %s (%.1f GiB), %s, commit %s\n", g->o.quick ? " --quick" : "", device,
           mem_total / (MIB * 1024.0), date, g->o.commit ? g->o.commit : "unknown");
    printf("  %-10s %-14s %-38s %-20s %-22s %-8s %-30s %-8s %s\n", "section", "what", "shape", "value",
           "median (loops x R)", "% copy", "target", "% tgt", "check");
    g->jroot = json_object();
    json_object_set_new(g->jroot, "schema", json_string(SCHEMA));
    json_object_set_new(g->jroot, "device", json_string(device));
    json_object_set_new(g->jroot, "device_memory_bytes", json_integer((json_int_t)mem_total));
    json_object_set_new(g->jroot, "device_datasheet_gbs", g->spec_gbs > 0 ? json_real(g->spec_gbs) : json_null());
    json_object_set_new(g->jroot, "driver_version",
                        g->o.driver_version ? json_string(g->o.driver_version) : json_null());
    json_object_set_new(g->jroot, "driver_library",
                        g->o.driver ? json_string(g->o.driver) : json_string("libcuda.so.1"));
    json_object_set_new(g->jroot, "date", json_string(date));
    json_object_set_new(g->jroot, "commit", g->o.commit ? json_string(g->o.commit) : json_null());
    json_object_set_new(g->jroot, "quick", json_boolean(g->o.quick));
    json_object_set_new(g->jroot, "timing",
                        json_string("kernels: GPU events (hr_cuda_time_begin/_end) around a loop of reps_per_loop "
                                    "back-to-back reps after one warm-up rep; median_ms is the median over `loops` "
                                    "loops of (loop time / reps_per_loop). e2e: host wall clock per engine step."));
    json_t *tg = json_object();
    json_object_set_new(tg, "gemv_pct_of_copy_bw_bf16_q8_0_q4_0", json_real(GEMV_TARGET_PCT));
    json_object_set_new(tg, "prefill_tflops_bf16", json_real(PREFILL_TARGET_PCT / 100.0 * H200_BF16_TFLOPS));
    json_object_set_new(tg, "attention_pct_of_copy_bw_f16_q8_at_8k", json_real(ATTN_TARGET_PCT));
    json_object_set_new(tg, "attention_q8_over_f16_speed", json_real(ATTN_Q8_F16_TARGET));
    json_object_set_new(tg, "e2e_batch1_weight_bw_pct_of_copy", json_real(E2E_TARGET_PCT));
    json_object_set_new(tg, "attention_4bit_over_f16_speed", json_real(ATTN_4BIT_F16_TARGET));
    json_object_set_new(tg, "capacity_q8_over_f16_sessions", json_real(CAPACITY_Q8_TARGET));
    json_object_set_new(g->jroot, "targets", tg);

    gb_bench_copy(g);
    gb_bench_argmax(g);
    if (wanted(g, "gemv"))
        gb_bench_gemv(g);
    else
        gb_skip_row(g, "gemv", "-", "-", "--only"), gb_skip_row(g, "prefill", "-", "-", "--only");
    if (wanted(g, "attention")) {
        gb_bench_attention(g);
        gb_bench_attn_tokens(g);
        gb_bench_prefill_attn(g);
    } else
        gb_skip_row(g, "attention", "-", "-", "--only");
    hr_cuda_device_close(g->dev); /* the runtime opens its own */
    g->dev = NULL;
    /* capacity first: a few seconds, where the end-to-end model's synthesis takes what time is left */
    if (g->o.e2e && wanted(g, "capacity"))
        gb_bench_capacity(g);
    else
        gb_skip_row(g, "capacity", "sessions", "-", g->o.e2e ? "--only" : "--no-e2e");
    if (g->o.e2e && wanted(g, "e2e"))
        gb_bench_e2e(g);
    else
        gb_skip_row(g, "e2e", "decode", "-", g->o.e2e ? "--only" : "--no-e2e");

    json_t *ck = json_object();
    json_object_set_new(ck, "passed", json_integer(g->n_checked - g->n_failed));
    json_object_set_new(ck, "failed", json_integer(g->n_failed));
    json_object_set_new(g->jroot, "checks", ck);
    json_object_set_new(g->jroot, "seconds", json_real(hr_time_now() - g->t_start));
    int rc = g->n_failed ? 1 : 0;
    if (g->o.json && json_dump_file(g->jroot, g->o.json, JSON_INDENT(2) | JSON_PRESERVE_ORDER)) {
        fprintf(stderr, "gpu_bench: cannot write %s\n", g->o.json);
        rc = 1;
    }
    if (g->o.md && !write_md(g, g->o.md, device, date)) {
        fprintf(stderr, "gpu_bench: cannot write %s\n", g->o.md);
        rc = 1;
    }
    json_decref(g->jroot);
    free(g->rows);
    printf("gpu_bench: %d checks, %d failed, %.1f s%s%s%s%s\n", g->n_checked, g->n_failed, hr_time_now() - g->t_start,
           g->o.json ? "; " : "", g->o.json ? g->o.json : "", g->o.md ? ", " : "", g->o.md ? g->o.md : "");
    return rc;
}

/* test_plan.c: the memory planner (src/plan) and the runtime's budget arithmetic under it, against
 * figures computed by hand: KV bytes per token per format for TinyLlama and Llama-3-8B, Llama-3-8B's
 * weights and vLLM's published KV token count, config.json parsing and each way it can be wrong, and
 * `headroom plan` (exit codes, JSON fields, the messages for a device or budget that does not fit). */
#include <jansson.h>
#include <string.h>

#include "harness.h"
#include "plan/plan.h"

#define GIB (1ull << 30)

static const char *const tinyllama_json =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"hidden_size\":2048,"
    "\"intermediate_size\":5632,\"num_attention_heads\":32,\"num_hidden_layers\":22,\"num_key_value_heads\":4,"
    "\"vocab_size\":32000,\"max_position_embeddings\":2048,\"tie_word_embeddings\":false,"
    "\"torch_dtype\":\"bfloat16\"}";

static hr_status from_text(const char *text, const char *wt, hr_plan_model *m, hr_error *err) {
    return hr_plan_model_from_config(text, strlen(text), wt, m, err);
}

static uint64_t kv_token_bytes(const hr_hparams *hp, hr_kv_format f) {
    hr_kv_budget_query q = {.kv = {.n_layers = hp->n_layer,
                                   .n_kv_heads = hp->n_head_kv,
                                   .head_dim = hp->head_dim,
                                   .block_size = 16,
                                   .k_format = f,
                                   .v_format = f,
                                   .max_seqs = 4},
                            .n_ctx = 1024,
                            .n_seqs = 1};
    hr_kv_budget b;
    hr_error err;
    return hr_kv_budget_compute(&q, &b, &err) == HR_OK ? b.token_bytes : 0;
}

/* KV bytes per token, by hand: layers x KV heads x 2 (K and V) x bytes of one head row. f16 rows are
 * 2 bytes a value; q8 keeps int8 values and an f16 scale per group of 64 (or head_dim, if less); fp8 one byte a value
 * and an f32 scale per head row. */
static void test_kv_per_token(void) {
    hr_plan_model m;
    hr_error err;
    CHECK(from_text(tinyllama_json, NULL, &m, &err) == HR_OK);
    CHECK(kv_token_bytes(&m.hp, HR_KV_F16) == 22ull * 4 * 2 * (64 * 2)); /* 22,528 */
    CHECK(kv_token_bytes(&m.hp, HR_KV_F32) == 22ull * 4 * 2 * (64 * 4)); /* 45,056 */
    CHECK(kv_token_bytes(&m.hp, HR_KV_BF16) == 22ull * 4 * 2 * (64 * 2));
    CHECK(kv_token_bytes(&m.hp, HR_KV_Q8) == 22ull * 4 * 2 * (64 + 2 * 2)); /* 11,968 */
    char *text = hr_test_slurp(HR_SOURCE_DIR "/tests/plan/llama-3-8b.config.json", NULL);
    CHECK(text != NULL);
    if (!text) return;
    CHECK(from_text(text, NULL, &m, &err) == HR_OK);
    free(text);
    CHECK(kv_token_bytes(&m.hp, HR_KV_F16) == 131072);                       /* 32 x 8 x 2 x 256 = 128 KiB */
    CHECK(kv_token_bytes(&m.hp, HR_KV_Q8) == 32ull * 8 * 2 * (128 + 2 * 2)); /* 67,584 */
    CHECK(kv_token_bytes(&m.hp, HR_KV_FP8) == 32ull * 8 * 2 * (128 + 4));    /* 67,584 */
}

/* Llama-3-8B in bf16: 8,030,261,248 parameters (8,029,995,008 in matrices, 266,240 in the 65 norm
 * vectors), 16,061,054,976 bytes = 14.96 GiB, vLLM's "model weights take 14.96GiB". vLLM's KV cache of
 * 53.29 GiB at 128 KiB a token held 436,552 tokens; the runtime's pool of 16-token blocks holds the
 * whole blocks of that: 27,284 blocks = 436,544 tokens. */
static void test_llama3_8b(void) {
    char *text = hr_test_slurp(HR_SOURCE_DIR "/tests/plan/llama-3-8b.config.json", NULL);
    CHECK(text != NULL);
    if (!text) return;
    hr_plan_model m;
    hr_error err;
    CHECKF(from_text(text, NULL, &m, &err) == HR_OK, "%s", err.msg);
    free(text);
    CHECK(!strcmp(m.weight_type, "bf16"));
    CHECK(m.hp.n_head_kv == 8 && m.hp.head_dim == 128 && !m.hp.tied_output && m.hp.n_ctx_train == 8192);
    uint64_t elems = 0;
    for (int i = 0; i < m.n_rows; i++) elems += m.rows[i].n_elements;
    CHECKF(elems == 8030261248ull, "%llu", (unsigned long long)elems);
    CHECKF(m.tensor_bytes == 16061054976ull, "%llu", (unsigned long long)m.tensor_bytes);
    CHECK(!strcmp(m.rows[0].type, "bf16") && m.rows[0].n_tensors == 2 + 32 * 7);
    CHECK(!strcmp(m.rows[1].type, "f32") && m.rows[1].n_tensors == 65);
    hr_kv_budget_query q = {.kv = {.n_layers = 32,
                                   .n_kv_heads = 8,
                                   .head_dim = 128,
                                   .block_size = 16,
                                   .k_format = HR_KV_F16,
                                   .v_format = HR_KV_F16,
                                   .max_seqs = 256,
                                   .budget_bytes = 436552ull * 131072},
                            .n_ctx = 8192};
    hr_kv_budget b;
    CHECK(hr_kv_budget_compute(&q, &b, &err) == HR_OK);
    CHECKF(b.n_tokens == 436544 && b.n_blocks == 27284, "%lld", (long long)b.n_tokens);
    CHECK(b.n_seqs_at_ctx == 53); /* 27,284 / 512 blocks of 8192 tokens */
    CHECK(b.total_bytes == 0);    /* no model given: the pool alone */
}

/* The whole-process parts add up, and a limit sizes the pool so the total stays under it. */
static void test_mem_limit(void) {
    hr_plan_model m;
    hr_error err;
    CHECK(from_text(tinyllama_json, "q4_0", &m, &err) == HR_OK);
    hr_kv_budget_query q = {
        .kv = {.n_layers = 22,
               .n_kv_heads = 4,
               .head_dim = 64,
               .block_size = 16,
               .k_format = HR_KV_F16,
               .v_format = HR_KV_F16,
               .max_seqs = 8,
               .max_step_tokens = 256},
        .n_ctx = 2048,
        .n_seqs = 2,
        .mem = {.model = &m.hp, .weight_bytes = m.resident_bytes, .max_batch_tokens = 256, .n_threads = 2}};
    hr_kv_budget b;
    CHECK(hr_kv_budget_compute(&q, &b, &err) == HR_OK);
    CHECK(b.budget_bytes == 2ull * 128 * 16 * 22528); /* two sequences of 128 blocks */
    CHECK(b.weight_bytes == m.resident_bytes && b.scratch_bytes > 0 && b.meta_bytes > 0);
    CHECK(b.total_bytes == b.weight_bytes + b.budget_bytes + b.scratch_bytes + b.meta_bytes + b.base_bytes);
    uint64_t limit = b.total_bytes + 100ull * 16 * 22528; /* room for about 100 more blocks */
    q.mem.mem_limit = limit;
    hr_kv_budget c;
    CHECK(hr_kv_budget_compute(&q, &c, &err) == HR_OK);
    CHECK(c.total_bytes <= limit && c.n_blocks >= 256 + 95 && c.n_blocks <= 256 + 100);
    /* a limit below weights + one sequence: the error says what would fit */
    q.mem.mem_limit = b.total_bytes - b.budget_bytes + 64ull * 16 * 22528; /* half a context */
    CHECK(hr_kv_budget_compute(&q, &c, &err) == HR_ERR_BUDGET);
    CHECKF(strstr(err.msg, "the memory limit ") && strstr(err.msg, "the longest that fits"), "%s", err.msg);
    CHECK(err.param == HR_PARAM_MEM_LIMIT && err.also == HR_PARAM_CONTEXT && err.value[0]);
    CHECK(c.n_blocks >= 60 && c.n_blocks < 128);
    /* an explicit budget over the limit */
    q.kv.budget_bytes = b.budget_bytes;
    q.mem.mem_limit = b.total_bytes - 1;
    CHECK(hr_kv_budget_compute(&q, &c, &err) == HR_ERR_BUDGET && strstr(err.msg, "over the memory limit"));
    CHECK(err.param == HR_PARAM_KV_BUDGET && err.also == HR_PARAM_MEM_LIMIT);
}

static void expect_config_error(const char *text, hr_status want, const char *needle) {
    hr_plan_model m;
    hr_error err = {0};
    hr_status st = from_text(text, NULL, &m, &err);
    CHECKF(st == want && strstr(err.msg, needle), "status %d, message '%s', wanted '%s'", st, err.msg, needle);
}

static void test_config_bad(void) {
    const char *base_fields = "\"intermediate_size\":5632,\"num_attention_heads\":32,\"num_hidden_layers\":22,"
                              "\"vocab_size\":32000,\"torch_dtype\":\"float16\"";
    char buf[1024];
    snprintf(buf, sizeof buf, "{\"model_type\":\"llama\",%s}", base_fields);
    expect_config_error(buf, HR_ERR_FORMAT, "'hidden_size'");
    expect_config_error("{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4,"
                        "\"intermediate_size\":128,\"vocab_size\":100,\"torch_dtype\":\"float16\"}",
                        HR_ERR_FORMAT, "'num_hidden_layers'");
    expect_config_error("{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4,"
                        "\"num_hidden_layers\":2,\"intermediate_size\":128,\"torch_dtype\":\"float16\"}",
                        HR_ERR_FORMAT, "'vocab_size'");
    snprintf(buf, sizeof buf, "{\"model_type\":\"gpt_neox\",\"hidden_size\":2048,%s}", base_fields);
    expect_config_error(buf, HR_ERR_UNSUPPORTED, "'gpt_neox' is not supported");
    snprintf(buf, sizeof buf, "{\"architectures\":[\"FalconForCausalLM\"],\"hidden_size\":2048,%s}", base_fields);
    expect_config_error(buf, HR_ERR_UNSUPPORTED, "'FalconForCausalLM'");
    snprintf(buf, sizeof buf, "{\"hidden_size\":2048,%s}", base_fields);
    expect_config_error(buf, HR_ERR_FORMAT, "'model_type'");
    expect_config_error("{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4,"
                        "\"num_hidden_layers\":2,\"intermediate_size\":128,\"vocab_size\":100}",
                        HR_ERR_FORMAT, "\"torch_dtype\"");
    expect_config_error("{\"model_type\":\"llama\",\"hidden_size\":\"64\",\"num_attention_heads\":4,"
                        "\"num_hidden_layers\":2,\"intermediate_size\":128,\"vocab_size\":100}",
                        HR_ERR_FORMAT, "'hidden_size' must be");
    expect_config_error("{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4,"
                        "\"num_key_value_heads\":3,\"num_hidden_layers\":2,\"intermediate_size\":128,"
                        "\"vocab_size\":100,\"torch_dtype\":\"float16\"}",
                        HR_ERR_FORMAT, "not a multiple");
    expect_config_error("{\"model_type\": ", HR_ERR_FORMAT, "not JSON");
    expect_config_error("[1,2]", HR_ERR_FORMAT, "not a JSON object");
    hr_plan_model m;
    hr_error err;
    CHECK(from_text(tinyllama_json, "q3_x", &m, &err) == HR_ERR_INVALID_ARG && strstr(err.msg, "q4_0"));
}

/* GQA, tied embeddings, head_dim, sliding windows (mistral's on; qwen2's off unless use_sliding_window). */
static void test_config_shapes(void) {
    hr_plan_model m;
    hr_error err;
    const char *mistral = "{\"model_type\":\"mistral\",\"hidden_size\":4096,\"intermediate_size\":14336,"
                          "\"num_attention_heads\":32,\"num_key_value_heads\":8,\"num_hidden_layers\":32,"
                          "\"vocab_size\":32000,\"sliding_window\":4096,\"torch_dtype\":\"bfloat16\","
                          "\"max_position_embeddings\":32768}";
    CHECKF(from_text(mistral, NULL, &m, &err) == HR_OK, "%s", err.msg);
    CHECK(m.hp.arch == HR_ARCH_MISTRAL && m.hp.sliding_window == 4096);
    hr_plan_device d = {.mem_bytes = 80 * GIB, .util = 1, .reserved_bytes = GIB};
    hr_plan_params p = {.n_ctx = 32768, .concurrency = 4, .k_format = HR_RT_KV_F16, .v_format = HR_RT_KV_F16};
    hr_plan *pl = calloc(1, sizeof *pl);
    CHECK(hr_plan_compute(&m, &d, &p, pl, &err) == HR_OK);
    CHECK(pl->held_ctx == 4096 + 16 && pl->n_window_layers == 32 && pl->n_full_layers == 0);
    CHECK(pl->rows[HR_KV_F16].need.budget_bytes == 4ull * (4112 / 16) * 16 * 131072);
    CHECK(pl->rows[HR_KV_F16].max_ctx == INT64_MAX); /* any context: a sequence never holds more */
    const char *qwen = "{\"model_type\":\"qwen2\",\"hidden_size\":896,\"intermediate_size\":4864,"
                       "\"num_attention_heads\":14,\"num_key_value_heads\":2,\"num_hidden_layers\":24,"
                       "\"vocab_size\":151936,\"sliding_window\":32768,\"use_sliding_window\":false,"
                       "\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\"}";
    CHECKF(from_text(qwen, NULL, &m, &err) == HR_OK, "%s", err.msg);
    CHECK(m.hp.sliding_window == 0 && m.hp.tied_output && m.hp.has_qkv_bias && m.hp.head_dim == 64);
    /* tied: one V x E matrix (not two); q/k/v biases f32 */
    uint64_t mat = 151936ull * 896 + 24ull * (896 * 896 + 2 * 128 * 896 + 896 * 896 + 3 * 896 * 4864);
    CHECKF(m.rows[0].n_elements == mat, "%llu vs %llu", (unsigned long long)m.rows[0].n_elements,
           (unsigned long long)mat);
    CHECK(m.rows[1].n_elements == (2 * 24 + 1) * 896ull + 24ull * (896 + 2 * 128));
    const char *hd = "{\"model_type\":\"llama\",\"hidden_size\":2048,\"head_dim\":256,\"intermediate_size\":8192,"
                     "\"num_attention_heads\":8,\"num_key_value_heads\":1,\"num_hidden_layers\":4,"
                     "\"vocab_size\":1000,\"torch_dtype\":\"float32\"}";
    CHECK(from_text(hd, NULL, &m, &err) == HR_OK && m.hp.head_dim == 256 && !strcmp(m.weight_type, "f32"));
    CHECK(kv_token_bytes(&m.hp, HR_KV_F16) == 4ull * 1 * 2 * 256 * 2);
    /* quantized types: rows whose length the block does not divide stay f16 (TinyLlama's are all 32-multiples) */
    CHECK(from_text(tinyllama_json, "q4_0", &m, &err) == HR_OK && !strcmp(m.rows[0].type, "q4_0"));
    free(pl);
}

static void test_devices(void) {
    hr_plan_device d;
    hr_error err;
    CHECK(hr_plan_device_by_name("H100-80GB", &d, &err) == HR_OK && d.gpu && d.mem_bytes == 81559ull << 20 &&
          d.bw_gbps == 3350 && d.util == 0.9);
    /* the driver's names for the cards (nvidia-smi's), the variants with other memory not */
    CHECK(hr_plan_device_by_name("NVIDIA H100 80GB HBM3", &d, &err) == HR_OK && d.mem_bytes == 81559ull << 20);
    CHECK(hr_plan_device_by_name("NVIDIA H200", &d, &err) == HR_OK && d.mem_bytes == 143771ull << 20 &&
          d.bw_gbps == 4800);
    CHECK(hr_plan_device_by_name("NVIDIA A100-SXM4-40GB", &d, &err) == HR_OK && d.mem_bytes == 40960ull << 20);
    CHECK(hr_plan_device_by_name("NVIDIA H100 PCIe", &d, &err) == HR_ERR_NOT_FOUND);
    CHECK(hr_plan_device_by_name("NVIDIA H200 NVL", &d, &err) == HR_ERR_NOT_FOUND);
    CHECK(hr_plan_device_by_name("tpu-v5", &d, &err) == HR_ERR_NOT_FOUND);
    CHECK(strstr(err.msg, "h200") && strstr(err.msg, "rtx4090") && strstr(err.msg, "--device-mem") &&
          strstr(err.msg, "--device-bw"));
    CHECK(hr_plan_device_host(false, &d, &err) == HR_OK && d.mem_bytes > (64ull << 20) && !d.gpu);
}

static void test_cli(void) {
    FILE *probe = fopen(HR_HEADROOM_BIN, "rb");
    if (!probe) {
        printf("the headroom binary is not built: CLI checks skipped\n");
        return;
    }
    fclose(probe);
    char *out = NULL, *errs = NULL;
    const char *cfg = HR_SOURCE_DIR "/tests/plan/llama-3-8b.config.json";
    char args[1024];
    snprintf(args, sizeof args, "plan -m %s --device h100-80gb --ctx 8192 --json", cfg);
    CHECK(hr_test_run_cli(args, &out, &errs) == 0);
    json_error_t je;
    long long f16_blocks = 0;
    json_t *j = out ? json_loads(out, 0, &je) : NULL;
    CHECKF(j != NULL, "not JSON: %s", out ? out : "(null)");
    if (j) {
        json_t *b = json_object_get(j, "budget");
        CHECK(json_integer_value(json_object_get(b, "weight_bytes")) ==
              16061054976ll + 4 * 266240 + 128256 * 32 + 65536);
        CHECK(json_integer_value(json_object_get(b, "kv_bytes")) == 8192ll * 131072);
        CHECK(json_integer_value(json_object_get(json_object_get(j, "kv"), "token_bytes")) == 131072);
        CHECK(json_is_true(json_object_get(j, "fits")));
        CHECK(json_array_size(json_object_get(j, "formats")) == HR_KV_FORMAT_COUNT);
        CHECK(json_integer_value(json_object_get(json_object_get(j, "device"), "mem_bytes")) == 81559ll << 20);
        json_decref(j);
    }
    free(out);
    free(errs);
    /* a GPU profile: the arena `serve --device cuda` would reserve there (hr_cuda_arena_plan_compute):
     * 0.9 of the H200's memory; the weights every tensor as stored, each in a 256-byte piece (291
     * tensors and RoPE's table); the KV pool every 2 MiB block the rest holds */
    snprintf(args, sizeof args, "plan -m %s --device h200 --ctx 8192 --json", cfg);
    CHECK(hr_test_run_cli(args, &out, &errs) == 0);
    j = out ? json_loads(out, 0, &je) : NULL;
    json_t *g = j ? json_object_get(j, "gpu_arena") : NULL;
    CHECKF(g && json_is_true(json_object_get(g, "fits")), "%s", out ? out : "(null)");
    if (g) {
        long long total = json_integer_value(json_object_get(g, "total_bytes")),
                  budget = json_integer_value(json_object_get(g, "budget_bytes")),
                  w = json_integer_value(json_object_get(g, "weight_bytes")),
                  sc = json_integer_value(json_object_get(g, "scratch_bytes")),
                  kv = json_integer_value(json_object_get(g, "kv_bytes")),
                  arena = json_integer_value(json_object_get(g, "arena_bytes")),
                  blk = json_integer_value(json_object_get(g, "block_bytes")),
                  nb = json_integer_value(json_object_get(g, "kv_blocks"));
        CHECK(total == 143771ll << 20 && budget == (long long)((double)total * 0.9));
        CHECKF(w == 16061054976ll + 292 * 256, "weights %lld", w);
        CHECK(blk == 16 * 131072 && nb * blk <= kv && kv - nb * blk < 16384);
        CHECK(arena == w + sc + kv && arena <= budget && budget - arena < blk + 512);
        CHECKF(sc > 512ll * 128256 * 4 && sc < (1ll << 30), "scratch %lld", sc); /* the logits' rows and the rest */
        printf("plan --device h200, llama-3-8b bf16, ctx 8192: arena %.2f GiB = weights %.2f + scratch %.3f + KV "
               "%.2f GiB (%lld blocks, %lld tokens)\n",
               arena / 1073741824.0, w / 1073741824.0, sc / 1073741824.0, kv / 1073741824.0, nb, nb * 16);
        f16_blocks = nb;
        const char *refused = json_string_value(json_object_get(g, "refused"));
        CHECK(refused && !refused[0]); /* llama: served */
    }
    json_decref(j);
    free(out);
    free(errs);
    /* the same arena with q8 KV: its blocks hold >= 1.9x f16's sessions of 8,192 tokens (512 blocks each;
     * issue 24's target), which q8's groups of 64 reach (2,112 bytes a head region against 4,096) */
    snprintf(args, sizeof args, "plan -m %s --device h200 --ctx 8192 --kv-type q8 --json", cfg);
    CHECK(hr_test_run_cli(args, &out, &errs) == 0);
    j = out ? json_loads(out, 0, &je) : NULL;
    g = j ? json_object_get(j, "gpu_arena") : NULL;
    if (g && f16_blocks > 0) {
        long long nb = json_integer_value(json_object_get(g, "kv_blocks")),
                  blk = json_integer_value(json_object_get(g, "block_bytes"));
        long long s8 = nb / 512, s16 = f16_blocks / 512;
        CHECKF(blk == 32ll * 8 * 2 * 2112 && s8 * 10 >= s16 * 19, "q8 blocks of %lld bytes: %lld sessions, f16 %lld",
               blk, s8, s16);
        printf("plan --device h200, llama-3-8b bf16, ctx 8192: q8 KV %lld sessions against f16's %lld (%.3fx)\n", s8,
               s16, (double)s8 / (double)s16);
    } else
        CHECKF(0, "no q8 gpu_arena: %s", out ? out : "(null)");
    json_decref(j);
    free(out);
    free(errs);
    /* whether serve --device cuda takes the model: qwen2's biases, qwen3's norms and gemma3's layer groups
     * it does; gpt-oss's sinks and a weight type without a GEMV kernel it refuses, and the plan says so
     * with the server's own line */
    static const struct {
        const char *synth, *name, *refused;
    } fam[] = {{"--shape qwen2-tiny --type q8_0", "qwen2-tiny", ""},
               {"--shape qwen3-tiny --type f16", "qwen3-tiny", ""},
               {"--shape gemma3-tiny --type q8_0", "gemma3-tiny", ""},
               {"--shape gpt-oss-tiny --type q8_0", "gpt-oss-tiny",
                "(gpt-oss) has attention sinks, which the GPU kernels do not cover yet"},
               {"--shape tiny --type mxfp4", "tiny-mxfp4", "CUDA: blk.0.attn_q is mxfp4; the GPU's matrix kernels"}};
    for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s.gguf", hr_test_tmpdir(), fam[i].name);
        snprintf(args, sizeof args, "synth %s -o %s", fam[i].synth, path);
        CHECK(hr_test_run_cli(args, &out, &errs) == 0);
        free(out), free(errs);
        snprintf(args, sizeof args, "plan -m %s --device h200 --ctx 256 --json", path);
        CHECK(hr_test_run_cli(args, &out, &errs) == 0);
        j = out ? json_loads(out, 0, &je) : NULL;
        const char *r = json_string_value(json_object_get(json_object_get(j, "gpu_arena"), "refused"));
        CHECKF(r && (fam[i].refused[0] ? strstr(r, fam[i].refused) != NULL : !r[0]), "%s: refused '%s'", fam[i].name,
               r ? r : "(none)");
        json_decref(j);
        free(out), free(errs);
        snprintf(args, sizeof args, "plan -m %s --device h200 --ctx 256", path);
        CHECK(hr_test_run_cli(args, &out, &errs) == 0);
        CHECKF(out &&
                   (strstr(out, "but serve --device cuda refuses this model today: ") != NULL) == !!fam[i].refused[0],
               "%s: %s", fam[i].name, out ? out : "(null)");
        free(out), free(errs);
    }
    /* the table names every part */
    snprintf(args, sizeof args, "plan -m %s --device a100-40gb", cfg);
    CHECK(hr_test_run_cli(args, &out, &errs) == 0);
    CHECK(out && strstr(out, "bf16") && strstr(out, "KV cache per token") && strstr(out, "activations and scratch") &&
          strstr(out, "runtime overhead") && strstr(out, "kivi2"));
    free(out);
    free(errs);
    /* an unknown device: usage error listing the known ones */
    snprintf(args, sizeof args, "plan -m %s --device tpu", cfg);
    CHECK(hr_test_run_cli(args, &out, &errs) == 2);
    CHECK(errs && strstr(errs, "unknown device 'tpu'") && strstr(errs, "l40s") && strstr(errs, "--device-mem"));
    free(out);
    free(errs);
    /* too small for one sequence: exit 1, the largest context that fits */
    snprintf(args, sizeof args, "plan -m %s --device-mem 16GiB --device-bw 100 --ctx 8192", cfg);
    CHECK(hr_test_run_cli(args, &out, &errs) == 1);
    CHECKF(errs && strstr(errs, "cannot hold one sequence of context 8192") && strstr(errs, "largest context"), "%s",
           errs ? errs : "");
    free(out);
    free(errs);
    /* too many sequences: exit 1, how many fit */
    snprintf(args, sizeof args, "plan -m %s --device l4 --ctx 8192 --concurrency 64", cfg);
    CHECK(hr_test_run_cli(args, &out, &errs) == 1);
    CHECK(errs && strstr(errs, "fit at that context"));
    free(out);
    free(errs);
    /* a config.json missing a field: exit 1 naming it; no -m: 2 */
    char path[512];
    snprintf(path, sizeof path, "%s/bad.config.json", hr_test_tmpdir());
    FILE *f = fopen(path, "w");
    fputs("{\"model_type\":\"llama\",\"hidden_size\":64}\n", f);
    fclose(f);
    snprintf(args, sizeof args, "plan -m %s --device h200", path);
    CHECK(hr_test_run_cli(args, &out, &errs) == 1);
    CHECK(errs && strstr(errs, "'intermediate_size'"));
    free(out);
    free(errs);
    CHECK(hr_test_run_cli("plan --device h200", &out, &errs) == 2);
    free(out);
    free(errs);
    snprintf(args, sizeof args, "plan -m %s --device h200 --weight-type q3", cfg);
    CHECK(hr_test_run_cli(args, &out, &errs) == 2);
    free(out);
    free(errs);
}

int main(void) {
    test_kv_per_token();
    test_llama3_8b();
    test_mem_limit();
    test_config_bad();
    test_config_shapes();
    test_devices();
    test_cli();
    return hr_test_finish();
}

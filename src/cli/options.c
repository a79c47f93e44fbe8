/* options.c: see options.h. The table first (grouped by command, in --help order within each section),
 * then the parser that stores a value into a row's field, then the --help pages built from the rows. */
#include "cli/options.h"

#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/serve_cluster.h"
#include "common/util.h"

/* ---- values of the enumerations ---------------------------------------------------------------- */

static hr_status parse_admission(const char *t, int *out, hr_error *e) {
    hr_rt_admission v;
    hr_status st = hr_rt_admission_parse(t, &v, e);
    if (st == HR_OK) *out = (int)v;
    return st;
}
static hr_status parse_preempt(const char *t, int *out, hr_error *e) {
    hr_rt_preempt v;
    hr_status st = hr_rt_preempt_parse(t, &v, e);
    if (st == HR_OK) *out = (int)v;
    return st;
}
static hr_status parse_layout(const char *t, int *out, hr_error *e) {
    hr_rt_layout v;
    hr_status st = hr_rt_layout_parse(t, &v, e);
    if (st == HR_OK) *out = (int)v;
    return st;
}
static const char *admission_name(int v) { return hr_rt_admission_name((hr_rt_admission)v); }
static const char *preempt_name(int v) { return hr_rt_preempt_name((hr_rt_preempt)v); }
static const char *layout_name(int v) { return hr_rt_layout_name((hr_rt_layout)v); }
static const char *format_name(int v) { return hr_rt_kv_format_name((hr_rt_kv_format)v); }

/* enumerations are stored as an int */
_Static_assert(sizeof(hr_rt_admission) == sizeof(int) && sizeof(hr_rt_preempt) == sizeof(int) &&
                   sizeof(hr_rt_layout) == sizeof(int) && sizeof(hr_rt_kv_format) == sizeof(int) &&
                   sizeof(hr_cache_scope_mode) == sizeof(int) && sizeof(hr_metrics_compat) == sizeof(int),
               "an enumeration the table stores is not int-sized");

static const char *const cache_scopes[] = {"auto", "key", "shared", NULL}; /* = hr_cache_scope_mode */
static const char *const metrics_modes[] = {"vllm", "none", NULL};
static const int metrics_ids[] = {HR_METRICS_VLLM, HR_METRICS_NATIVE};

/* ---- values that need more than a type ---------------------------------------------------------- */

/* --kv-policy: the syntax is checked here (a usage error); the runtime checks it fits the model */
static bool opt_policy(const hr_opt *r, const char *cmd, const char *flag, const char *v, void *dst) {
    hr_error err;
    if (hr_rt_policy_parse(v, NULL, 0, &err) != HR_OK) {
        fprintf(stderr, "headroom %s: %s: %s\n", cmd, flag, err.msg);
        return false;
    }
    memcpy((char *)dst + r->off, &v, sizeof v);
    return true;
}

/* --device: cpu, cuda, cuda:N (a usage error otherwise); whether the GPU is there is the runtime's */
static bool opt_device(const hr_opt *r, const char *cmd, const char *flag, const char *v, void *dst) {
    hr_error err;
    int ordinal;
    if (hr_rt_device_parse(v, &ordinal, &err) != HR_OK) {
        fprintf(stderr, "headroom %s: %s: %s\n", cmd, flag, err.msg);
        return false;
    }
    memcpy((char *)dst + r->off, &v, sizeof v);
    return true;
}

static bool opt_stop(const hr_opt *r, const char *cmd, const char *flag, const char *v, void *dst) {
    (void)r;
    (void)flag;
    hr_session_opts *o = dst;
    if (o->n_stop == HR_SESSION_MAX_STOP) {
        fprintf(stderr, "headroom %s: at most %d --stop strings\n", cmd, HR_SESSION_MAX_STOP);
        return false;
    }
    if (!*v) {
        fprintf(stderr, "headroom %s: --stop needs a non-empty string\n", cmd);
        return false;
    }
    o->stop[o->n_stop++] = v;
    return true;
}

static bool opt_eval_policy(const hr_opt *r, const char *cmd, const char *flag, const char *v, void *dst) {
    (void)r;
    (void)flag;
    hr_eval_cli_opts *o = dst;
    if (o->n_policy_args == HR_EVAL_MAX_POLICY_ARGS) {
        fprintf(stderr, "headroom %s: at most %d --policy flags\n", cmd, HR_EVAL_MAX_POLICY_ARGS);
        return false;
    }
    o->policy_args[o->n_policy_args++] = v;
    return true;
}

static bool opt_weight_type(const hr_opt *r, const char *cmd, const char *flag, const char *v, void *dst) {
    (void)r;
    (void)flag;
    if (hr_plan_weight_type_id(v) < 0) {
        fprintf(stderr,
                "headroom %s: unknown --weight-type '%s' (known: f32, f16, bf16, q8_0, q4_0, q4_K, q5_K, q6_K)\n", cmd,
                v);
        return false;
    }
    ((hr_plan_cli_opts *)dst)->weight_type = v;
    return true;
}

static bool opt_sim_running(const hr_opt *r, const char *cmd, const char *flag, const char *v, void *dst) {
    hr_plan_cli_opts *o = dst;
    char *dup = strdup(v), *save = NULL;
    bool ok = dup != NULL;
    o->n_run_list = 0;
    for (char *tok = dup ? strtok_r(dup, ",", &save) : NULL; ok && tok; tok = strtok_r(NULL, ",", &save)) {
        if (o->n_run_list == 8) {
            fprintf(stderr, "headroom %s: --sim-running takes at most 8 values\n", cmd);
            ok = false;
        } else {
            ok = hr_arg_int(cmd, flag, tok, (long)r->min, (long)r->max, &o->run_list[o->n_run_list++]);
        }
    }
    free(dup);
    return ok;
}

/* ---- the table ---------------------------------------------------------------------------------- */

/* The runtime's defaults as its flags spell them (tests/test_cli_options.c checks each against
 * hr_runtime_default_params); eval's and plan's rows for the same setting take them from here too. */
#define DEF_KV_FORMAT    "f16"
#define DEF_BLOCK_SIZE   "16"
#define DEF_BATCH_TOKENS "512"

/* clang-format off */
/* (a row per flag, kept on few lines so that the table reads as one) */
#define RS     (HR_CMD_RUN | HR_CMD_SERVE)
#define SES(f) .dst = HR_DST_SESSION, .off = offsetof(hr_session_opts, f)
#define SRV(f) .dst = HR_DST_SERVER, .off = offsetof(hr_server_params, f)
#define EVL(f) .dst = HR_DST_EVAL, .off = offsetof(hr_eval_cli_opts, f)
#define PLN(f) .dst = HR_DST_PLAN, .off = offsetof(hr_plan_cli_opts, f)
#define SIZE_MAX_D 18446744073709551615.0 /* UINT64_MAX: sizes without an upper bound */

/* RS rows print in `run --help` section by section in this order, and in serve's compact lists in this
 * order too: so -m comes before the cache and engine rows and --chat-template after them. */
const hr_opt hr_opts[] = {
    /* ---- run and serve: the runtime's parameters (hr_runtime_params, in hr_session_opts.rt) ---- */
    {RS, {"-m", "--model"}, "-m, --model FILE", HR_OPT_STR, .range = "a file path", SES(rt.model_path),
     .sec = HR_SEC_MODEL,
     .help = "GGUF model (llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3;\n"
             "f32/f16/bf16/q8_0/q4_0/q5_0/q5_1/q4_K/q5_K/q6_K/mxfp4), or a Hugging Face\n"
             "checkpoint "
             "directory (config.json, *.safetensors, tokenizer.json; docs/MODELS.md)"},
    {RS, {"--quantize"}, "--quantize T", HR_OPT_STR, .range = "q8_0, q4_0, q4_K (checked by the loader)",
     SES(rt.quantize), .sec = HR_SEC_MODEL,
     .help = "a checkpoint directory's matrices quantized at load: q8_0, q4_0, q4_K\n"
             "(default: bf16/f16/f32 as stored, memory-mapped)"},
    {RS, {"-c", "--ctx"}, "-c, --ctx N", HR_OPT_INT, 1, 1 << 24, SES(rt.n_ctx), .sec = HR_SEC_CACHE,
     .help = "context length (default: the model's, at most 4096). Prompt + -n must fit:\n"
             "a longer -n is clamped (a warning; finish \"length\", limit \"context\").\n"
             "Above the model's trained context it needs --ctx-extend"},
    {RS, {"--ctx-extend"}, "--ctx-extend", HR_OPT_FLAG, SES(rt.ctx_extend), .sec = HR_SEC_CACHE,
     .help = "allow --ctx past the trained context: positions past it are out of\n"
             "distribution for RoPE and quality degrades (docs/POLICIES.md); a\n"
             "window policy (--kv-policy window:W) runs past the context without that"},
    {RS, {"--kv-budget"}, "--kv-budget SIZE", HR_OPT_SIZE, 1, SIZE_MAX_D, SES(rt.kv_budget), .sec = HR_SEC_CACHE,
     .bad = "must be > 0; omit it for the default (one --ctx sequence per prompt that can run at once)",
     .help = "KV pool size > 0, e.g. 256MiB; allocated once, never grows (default, when\n"
             "omitted: one --ctx sequence per prompt that can run at once)"},
    {RS, {"--kv-type"}, "--kv-type F", HR_OPT_KV_FORMAT, .n_values = HR_RT_KV_FORMAT_COUNT, .value_name = format_name,
     .def = DEF_KV_FORMAT, SES(rt.k_format), .off2 = offsetof(hr_session_opts, rt.v_format), .sec = HR_SEC_CACHE,
     .flags = HR_OPTF_KV_BOTH,
     .help = "KV format for K and V: f32, f16, bf16, q8, q4, fp8, kivi2, q4h (default {default})"},
    {RS, {"--kv-type-k"}, "--kv-type-k F", HR_OPT_KV_FORMAT, .n_values = HR_RT_KV_FORMAT_COUNT,
     .value_name = format_name, .def = DEF_KV_FORMAT, SES(rt.k_format), .sec = HR_SEC_CACHE,
     .help = "the format of K or V alone"},
    {RS, {"--kv-type-v"}, "--kv-type-v F", HR_OPT_KV_FORMAT, .n_values = HR_RT_KV_FORMAT_COUNT,
     .value_name = format_name, .def = DEF_KV_FORMAT, SES(rt.v_format), .sec = HR_SEC_CACHE, .flags = HR_OPTF_JOINED,
     .help = "the format of V alone"},
    {RS, {"--kv-policy"}, "--kv-policy P", HR_OPT_CUSTOM, .custom = opt_policy,
     .range = "full, window:W, sinks:S,window:W, h2o:B, snapkv:B", SES(rt.kv_policy), .sec = HR_SEC_CACHE,
     .help = "what stays resident: full (default), window:W, sinks:S,window:W,\n"
             "h2o:B, snapkv:B (docs/POLICIES.md); a model's own sliding window\n"
             "(Mistral; Gemma's window layers) always applies"},
    {RS, {"--block-size"}, "--block-size N", HR_OPT_INT, 8, 256, .def = DEF_BLOCK_SIZE, SES(rt.block_size),
     .sec = HR_SEC_CACHE,
     .help = "tokens per KV block, {min}..{max} (default {default}); a --kv-type the model's head\n"
             "size cannot use with it is a startup error naming both"},
    {RS, {"--kv-layout"}, "--kv-layout L", HR_OPT_ENUM, .n_values = 2, .value_name = layout_name,
     .parse_enum = parse_layout, .def = "paged", SES(rt.layout), .sec = HR_SEC_CACHE,
     .help = "paged (blocks on demand, prefix sharing; default) or contiguous (each\n"
             "sequence reserves --ctx slots up front, like llama.cpp slots)"},
    {RS, {"-b", "--max-batch-tokens", "--batch"}, "-b, --max-batch-tokens N", HR_OPT_INT, 1, 1 << 16,
     .def = DEF_BATCH_TOKENS, SES(rt.max_batch_tokens), .sec = HR_SEC_ENGINE,
     .help = "tokens per engine step, decodes and prefill chunks mixed (default {default};\n"
             "--batch is the same flag)"},
    {RS, {"--prefill-chunk"}, "--prefill-chunk N", HR_OPT_INT, 1, 1 << 16, SES(rt.prefill_chunk),
     .sec = HR_SEC_ENGINE, .help = "most prompt tokens of one sequence per step (default: --max-batch-tokens)"},
    {RS, {"--max-running"}, "--max-running N", HR_OPT_INT, 1, 4096, .def = "64", SES(rt.max_running),
     .sec = HR_SEC_ENGINE, .help = "sequences in flight at once (default {default})"},
    /* the default queue (1024) is the engine's: 0 here lets it choose */
    {RS, {"--max-queue"}, "--max-queue N", HR_OPT_INT, 1, 1 << 24, SES(rt.max_queue), .sec = HR_SEC_ENGINE,
     .help = "waiting requests before new ones are refused (default 1024)",
     .brief = "(429 with Retry-After when full)"},
    {RS, {"--admission"}, "--admission M", HR_OPT_ENUM, .n_values = 3, .value_name = admission_name,
     .parse_enum = parse_admission, .def = "adaptive", SES(rt.admission), .sec = HR_SEC_ENGINE,
     .help = "adaptive (default: reserve prompt + p90 of completion lengths seen),\n"
             "reserve (prompt + -n must fit; never preempts), optimistic (prompt must\n"
             "fit; preempt when the pool runs out)"},
    {RS, {"--preempt"}, "--preempt M", HR_OPT_ENUM, .n_values = 3, .value_name = preempt_name,
     .parse_enum = parse_preempt, .def = "auto", SES(rt.preempt), .sec = HR_SEC_ENGINE,
     .help = "recompute (drop blocks, re-prefill later; cached prefix blocks reused),\n"
             "swap (move its blocks to the swap tier and back), auto (default: swap when\n"
             "moving the bytes is cheaper than recomputing, given a --swap-space)"},
    {RS, {"--swap-space"}, "--swap-space SIZE", HR_OPT_SIZE, 0, SIZE_MAX_D, SES(rt.swap_space), .sec = HR_SEC_ENGINE,
     .help = "swap tier size (an anonymous temp file; with --device cuda page-locked\n"
             "host memory; default none, or with --preempt swap the KV budget, on a\n"
             "GPU at most 4 GiB)"},
    {RS, {"-t", "--threads"}, "-t, --threads N", HR_OPT_INT, 1, 1024, SES(rt.n_threads), .sec = HR_SEC_ENGINE,
     .flags = HR_OPTF_CORES, .help = "worker threads, {min}..{max} (default: all cores): the CPU's kernels, and a large\n"
                         "step's rows sampled (with --device cuda, the host's only work); more than the\n"
                         "online cores warns and uses the online cores"},
    {RS, {"--mmap"}, "--mmap", HR_OPT_FLAG, SES(rt.mmap_weights), .sec = HR_SEC_ENGINE,
     .help = "map the model file (pages shared with the page cache, read as touched;\n"
             "q4_0, q8_0, q4_K, q5_K, q6_K weights then stay in the file's layout)\n"
             "instead of reading it at start into private memory backed by 2 MiB\n"
             "huge pages where the kernel allows (faster weight streaming)"},
    {RS, {"--isa"}, "--isa NAME", HR_OPT_STR, .range = "scalar, avx2, avx512", SES(rt.isa), .sec = HR_SEC_ENGINE,
     .help = "force kernels, KV attention included: scalar, avx2, avx512 (default: best available)"},
    {RS, {"--device"}, "--device D", HR_OPT_CUSTOM, .custom = opt_device, .range = "cpu, cuda, cuda:N",
     SES(rt.device), .sec = HR_SEC_ENGINE,
     .help = "where the model runs: cpu (default), cuda or cuda:N (GPU N, sm_90: H100,\n"
             "H200; needs only the NVIDIA driver; llama, mistral, qwen2, qwen3, phi3,\n"
             "gemma2, gemma3, qwen3moe and Mixtral models, KV f32, f16, bf16, q8, fp8,\n"
             "q4 and kivi2 (not beside gemma's window layers), q4h, every KV policy\n"
             "(full, window, sinks, h2o, snapkv); anything else\n"
             "is refused in one line; the GGUF is mapped and each matrix's host\n"
             "pages given back once uploaded; docs/GPU.md)"},
    {RS, {"--gpu-util"}, "--gpu-util F", HR_OPT_DOUBLE, 0.001, 1, SES(rt.gpu_util), .sec = HR_SEC_ENGINE,
     .help = "with --device cuda: the fraction of the GPU's memory the one device arena\n"
             "(weights, scratch, KV blocks) takes, reserved at start; the KV pool is\n"
             "what it leaves unless --kv-budget says (default 0.9; `headroom plan\n"
             "--device h200` shows the same arena)"},

    /* ---- run: the prompts ---- */
    {HR_CMD_RUN, {"-p", "--prompt"}, "-p, --prompt TEXT", HR_OPT_STR, .range = "any text", .sec = HR_SEC_MODEL,
     .help = "a prompt (repeatable: all run concurrently)"},
    {HR_CMD_RUN, {"--prompts"}, "--prompts FILE", HR_OPT_STR, .range = "a file path", .sec = HR_SEC_MODEL,
     .help = "more prompts, one per line (blank lines skipped)"},
    {HR_CMD_RUN, {"--no-bos"}, "--no-bos", HR_OPT_FLAG, SES(no_bos), .sec = HR_SEC_MODEL,
     .help = "do not prepend the BOS token"},
    {HR_CMD_RUN, {"--chat"}, "--chat", HR_OPT_FLAG, SES(chat), .sec = HR_SEC_MODEL,
     .help = "treat each prompt as a user message and render it with the model's chat\n"
             "template (tokenizer.chat_template, run by the Jinja interpreter; one it\n"
             "refuses warns and uses the family recognized from it, else chatml)"},
    {HR_CMD_RUN, {"--system"}, "--system TEXT", HR_OPT_STR, .range = "any text", SES(system), .sec = HR_SEC_MODEL,
     .help = "a system message before the user's (implies --chat)"},
    {RS, {"--chat-template"}, "--chat-template NAME", HR_OPT_STR,
     .range = "chatml, llama2, llama3, mistral, mistral-v1, phi3, gemma, zephyr, deepseek", SES(rt.chat_template),
     .sec = HR_SEC_MODEL,
     .help = "use this template family instead of the model's own (implies --chat):\n"
             "chatml, llama2, llama3, mistral, mistral-v1, phi3, gemma, zephyr, deepseek"},

    /* ---- run: generation; serve: the sampling defaults ---- */
    {HR_CMD_RUN, {"-n", "--n-predict"}, "-n, --n-predict N", HR_OPT_INT, 0, 1 << 24, .def = "128", SES(n_predict),
     .sec = HR_SEC_GEN, .flags = HR_OPTF_OWN_DEFAULT, .help = "tokens to generate (default {default})"},
    {RS, {"--temp"}, "--temp T", HR_OPT_FLOAT, 0, 100, .def = "0.8", SES(sampling.temperature), .sec = HR_SEC_GEN,
     .help = "temperature, 0 = greedy (default {default})", .brief = "({default})"},
    {RS, {"--top-k"}, "--top-k K", HR_OPT_INT, 0, 1 << 24, .def = "40", SES(sampling.top_k), .sec = HR_SEC_GEN,
     .help = "(default {default}, 0 = off)", .brief = "({default})"},
    {RS, {"--top-p"}, "--top-p P", HR_OPT_FLOAT, 1e-6, 1, .def = "0.95", SES(sampling.top_p), .sec = HR_SEC_GEN,
     .help = "(default {default}, 1 = off)", .brief = "({default})"},
    {RS, {"--min-p"}, "--min-p P", HR_OPT_FLOAT, 0, 1, .def = "0.05", SES(sampling.min_p), .sec = HR_SEC_GEN,
     .help = "(default {default}, 0 = off)", .brief = "({default})"},
    {RS, {"--repeat-penalty"}, "--repeat-penalty X", HR_OPT_FLOAT, 1e-3, 100, .def = "1.0",
     SES(sampling.repeat_penalty), .sec = HR_SEC_GEN, .help = "(default {default} = off)"},
    {RS, {"--presence-penalty"}, "--presence-penalty X", HR_OPT_FLOAT, -2, 2, .def = "0",
     SES(sampling.presence_penalty), .sec = HR_SEC_GEN, .help = "(default {default})"},
    {RS, {"--frequency-penalty"}, "--frequency-penalty X", HR_OPT_FLOAT, -2, 2, .def = "0",
     SES(sampling.frequency_penalty), .sec = HR_SEC_GEN, .flags = HR_OPTF_JOINED, .help = "(default {default})"},
    {RS, {"--repeat-last-n"}, "--repeat-last-n N", HR_OPT_INT, -1, 1 << 20, .def = "64", SES(sampling.penalty_last_n),
     .sec = HR_SEC_GEN, .help = "tokens the penalties look back over (default {default})"},
    {RS, {"--seed"}, "--seed S", HR_OPT_U64, 0, SIZE_MAX_D, .def = "0", SES(sampling.seed), .sec = HR_SEC_GEN,
     .help = "sampler seed (default {default}); same seed, same output. With several prompts,\n"
             "prompt 1 uses S and prompt i > 1 splitmix64(S ^ splitmix64(i - 1)) >> 1, so\n"
             "repeats of one prompt differ (--json reports each prompt's \"seed\")",
     .brief = "(requests without a seed get S mixed with a request counter)"},
    {HR_CMD_RUN, {"--stop"}, "--stop TEXT", HR_OPT_CUSTOM, .custom = opt_stop, .range = "non-empty text",
     .dst = HR_DST_SESSION, .sec = HR_SEC_GEN, .help = "stop when TEXT appears (repeatable; TEXT is not printed)"},
    {HR_CMD_RUN, {"--ignore-eos"}, "--ignore-eos", HR_OPT_FLAG, SES(ignore_eos), .sec = HR_SEC_GEN,
     .help = "keep generating past end-of-generation tokens"},

    /* ---- run: output ---- */
    {HR_CMD_RUN, {"--json"}, "--json", HR_OPT_FLAG, .sec = HR_SEC_OUTPUT,
     .help = "print one JSON object (completion, token ids and counts, finish_reason and,\n"
             "for \"length\", limit: \"max_tokens\" or \"context\", seed, speeds, KV bytes;\n"
             "with several prompts a \"results\" array in input order and \"engine\" figures)"},
    {HR_CMD_RUN, {"-v", "--verbose"}, "-v, --verbose", HR_OPT_FLAG, .sec = HR_SEC_OUTPUT,
     .help = "print the KV ledger after the run"},

    /* ---- serve: the server (hr_server_params) ---- */
    {HR_CMD_SERVE, {"--host"}, "--host H", HR_OPT_STR, .range = "a numeric IPv4 or IPv6 address", .def = "127.0.0.1",
     SRV(host), .sec = HR_SEC_SERVER,
     .help = "numeric address to bind (default {default}; 0.0.0.0 or :: for all)"},
    {HR_CMD_SERVE, {"--port"}, "--port P", HR_OPT_INT, 0, 65535, .def = "8080", SRV(port), .sec = HR_SEC_SERVER,
     .help = "TCP port (default {default}; 0 picks a free one, printed at start)"},
    {HR_CMD_SERVE, {"--api-key"}, "--api-key K", HR_OPT_STR, .range = "a key, or K1,K2,...", .sec = HR_SEC_SERVER,
     .help = "require \"Authorization: Bearer K\" on /v1/*, /tokenize, /detokenize (401\n"
             "otherwise; /health, /metrics and the dashboard page stay open: the page asks\n"
             "for the key); default: $HEADROOM_API_KEY. Repeat it, or give K1,K2,..., for\n"
             "several keys: each is a tenant (see --cache-scope)"},
    {HR_CMD_SERVE, {"--cache-scope"}, "--cache-scope M", HR_OPT_ENUM, .values = cache_scopes, .def = "auto",
     SRV(cache_scope), .sec = HR_SEC_SERVER,
     .help = "who shares the prefix cache (a hit tells a prompt's prefix was seen): auto\n"
             "(default: per API key when several are given, else shared), key, shared. A\n"
             "request's \"cache_salt\" string narrows its scope further in every mode"},
    {HR_CMD_SERVE, {"--special-in-content"}, "--special-in-content", HR_OPT_FLAG, SES(rt.special_in_content),
     .sec = HR_SEC_SERVER,
     .help = "parse special-token text (\"<|im_end|>\", \"</s>\") inside chat message\n"
             "contents and raw prompts as control tokens; default: it stays text, and only\n"
             "the chat template's own markers are control tokens (send ids for control\n"
             "tokens in a raw prompt)"},
    {HR_CMD_SERVE, {"--max-parse-memory"}, "--max-parse-memory SIZE", HR_OPT_SIZE_T, 1u << 20, 64ull << 30,
     .def = "64MiB", .bad = "must be 1MiB..64GiB", .bad_got = true, SRV(max_parse_bytes), .sec = HR_SEC_SERVER,
     .help = "memory all request bodies being parsed may hold at once (default\n"
             "{default}, part of the memory plan); one body may take a quarter, and at most\n"
             "64 x its size + 256KiB (413 above; 503 while others hold it all for 5 s)"},
    {HR_CMD_SERVE, {"--drain-timeout"}, "--drain-timeout S", HR_OPT_DOUBLE, 0, 86400, .def = "30",
     SRV(drain_timeout_s), .sec = HR_SEC_SERVER,
     .help = "on SIGINT/SIGTERM, seconds in-flight requests may still run (default {default};\n"
             "meanwhile /health answers 503 \"draining\"). SIGUSR1 logs a state line;\n"
             "SIGHUP, SIGUSR2 and SIGALRM are logged and ignored"},
    {HR_CMD_SERVE, {"--metrics-compat"}, "--metrics-compat vllm", HR_OPT_ENUM, .values = metrics_modes,
     .ids = metrics_ids, .def = "none", SRV(metrics_compat), .sec = HR_SEC_SERVER,
     .help = "also export vllm:num_requests_running/waiting, vllm:kv_cache_usage_perc,\n"
             "vllm:gpu_cache_usage_perc, vllm:num_preemptions_total,\n"
             "vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total (tokens)"},
    {HR_CMD_SERVE, {"--max-body"}, "--max-body SIZE", HR_OPT_SIZE_T, 0, SIZE_MAX_D, .def = "4MiB", SRV(max_body_bytes),
     .sec = HR_SEC_SERVER, .help = "largest request body (default {default}; 413 above)"},
    {HR_CMD_SERVE, {"--max-connections"}, "--max-connections N", HR_OPT_INT, 1, 65536, .def = "256",
     SRV(max_connections), .sec = HR_SEC_SERVER,
     .help = "requests served at once, one thread each (default {default}); a connection\n"
             "waits without a thread until its request headers are in (up to 4 x N of\n"
             "them; when full, the one waiting longest makes room), then for a thread"},
    {HR_CMD_SERVE, {"--listen-backlog"}, "--listen-backlog N", HR_OPT_INT, 1, 65535, .def = "1024",
     SRV(listen_backlog), .sec = HR_SEC_SERVER,
     .help = "connections the kernel holds when every waiting one is ready for a thread\n"
             "(default {default}, capped by net.core.somaxconn)"},
    {HR_CMD_SERVE, {"--max-conns-per-ip"}, "--max-conns-per-ip N", HR_OPT_INT, 0, 65536, .def = "64",
     SRV(max_conns_per_ip), .sec = HR_SEC_SERVER,
     .help = "connections one client address may have waiting, and as many served\n"
             "(default {default}; more are closed at once; 0: no cap; behind a proxy every\n"
             "client has the proxy's address)"},
    {HR_CMD_SERVE, {"--header-timeout"}, "--header-timeout S", HR_OPT_DOUBLE, 0.1, 3600, .def = "10",
     SRV(header_timeout_s), .sec = HR_SEC_SERVER,
     .help = "seconds a connection has to send its request headers (default {default}; then it\n"
             "is closed)"},
    {HR_CMD_SERVE, {"--body-min-rate"}, "--body-min-rate SIZE", HR_OPT_RATE, 0, SIZE_MAX_D, .def = "1KiB",
     SRV(body_min_rate), .sec = HR_SEC_SERVER,
     .help = "bytes per second a request body must keep up after --header-timeout's\n"
             "grace (default {default}; slower connections are closed; 0: no check). Streams\n"
             "and requests waiting on the engine have no deadline; every response\n"
             "closes its connection"},
    {HR_CMD_SERVE, {"--max-header"}, "--max-header SIZE", HR_OPT_SIZE_T, 32u << 10, 16u << 20, .def = "32KiB",
     .bad = "must be 32KiB..16MiB", .bad_got = true, SRV(max_header_bytes), .sec = HR_SEC_SERVER,
     .help = "per-connection memory for the request line and headers (default {default},\n"
             "at least 32KiB; 431 above)"},
    {HR_CMD_SERVE, {"--max-n"}, "--max-n N", HR_OPT_INT, 1, 8, .def = "8", SRV(max_choices), .sec = HR_SEC_SERVER,
     .help = "largest \"n\" (choices) a request may ask for, {min}..{max} (default {default})"},
    {HR_CMD_SERVE, {"--max-tokens-limit"}, "--max-tokens-limit N", HR_OPT_INT, 0, 1 << 30, .def = "0",
     SRV(max_tokens_limit), .sec = HR_SEC_SERVER,
     .help = "largest max_tokens a request may ask for (400 above; also the default\n"
             "when it gives none); default {default}: only the context bounds it. A prompt\n"
             "longer than the context (-c) is a 400. A request under a window policy\n"
             "(kv_policy) may run past the context, up to 4 contexts"},
    /* ---- serve: runtime parameters run does not take ---- */
    {HR_CMD_SERVE, {"--kv-seqs"}, "--kv-seqs N", HR_OPT_INT, 1, 4096, .def = "4", SES(rt.kv_seqs),
     .sec = HR_SEC_SERVE_RT, .flags = HR_OPTF_OWN_DEFAULT,
     .help = "without --kv-budget, the pool holds N sequences of --ctx (default {default})"},
    {HR_CMD_SERVE, {"--mem-limit"}, "--mem-limit SIZE", HR_OPT_SIZE, 0, SIZE_MAX_D, SES(rt.mem_limit),
     .sec = HR_SEC_SERVE_RT,
     .help = "size the pool from the memory plan so the whole process stays under SIZE\n"
             "(weights, scratch and the rest first; `headroom plan` shows the parts);\n"
             "the plan is logged at start, the measured peak RSS at exit"},
    {HR_CMD_SERVE, {"--step-log"}, "--step-log FILE", HR_OPT_STR, .range = "a file path", SES(rt.step_log),
     .sec = HR_SEC_SERVE_RT,
     .help = "write one JSON line per engine step that computed: start time, seconds in\n"
             "the step and its forward pass, tokens, prompt tokens, sampled rows, sequences,\n"
             "keys attended (to check `headroom plan`'s cost model against this machine)"},

    /* ---- eval (hr_eval_cli_opts) ---- */
    {HR_CMD_EVAL, {"-m", "--model"}, "-m FILE", HR_OPT_STR, .range = "a file path", EVL(model_path),
     .sec = HR_SEC_MAIN, .help = "GGUF model"},
    {HR_CMD_EVAL, {"--kv-type"}, "--kv-type LIST", HR_OPT_STR, .range = "formats, K/V pairs or all",
     .def = "f16,q8", EVL(formats), .sec = HR_SEC_MAIN,
     .help = "formats to measure, comma-separated: f32, f16, bf16, q8, q4, fp8, kivi2, q4h;\n"
             "K/V for different K and V formats (e.g. q4/f16); 'all' for every format\n"
             "(default: {default})"},
    {HR_CMD_EVAL, {"-c", "--ctx"}, "-c, --ctx N", HR_OPT_INT, 8, 1 << 20, .def = "256", EVL(n_ctx),
     .sec = HR_SEC_MAIN, .flags = HR_OPTF_OWN_DEFAULT,
     .help = "chunk length in tokens (default {default}, at most the model's trained context:\n"
             "positions past it are out of distribution for RoPE)"},
    {HR_CMD_EVAL, {"--chunks"}, "--chunks N", HR_OPT_INT, 1, 1 << 30, EVL(max_chunks), .sec = HR_SEC_MAIN,
     .help = "score at most N chunks (default: the whole text)"},
    {HR_CMD_EVAL, {"--policy", "--kv-policy"}, "--policy, --kv-policy P", HR_OPT_CUSTOM, .custom = opt_eval_policy,
     .range = "full, window:W, sinks:S,window:W, h2o:B, snapkv:B[,window:W]", .dst = HR_DST_EVAL, .sec = HR_SEC_MAIN,
     .help = "KV eviction policy to measure; repeat the flag (or separate with ';') for\n"
             "several: full, window:W, sinks:S,window:W, h2o:B, snapkv:B[,window:W]\n"
             "(default: full). Each format runs under each policy; policy runs score\n"
             "the second half of a chunk one token at a time after a first-half prompt"},
    {HR_CMD_EVAL, {"--block-size"}, "--block-size N", HR_OPT_INT, 8, 256, .def = DEF_BLOCK_SIZE, EVL(block_size),
     .sec = HR_SEC_MAIN,
     .help = "KV block size, {min}..{max} (default {default}); a format listed in --kv-type that the\n"
             "model's head size cannot use with it is a startup error naming both ('all'\n"
             "lists such a format as unavailable instead)"},
    {HR_CMD_EVAL, {"-t", "--threads"}, "-t, --threads N", HR_OPT_INT, 1, 1024, EVL(n_threads), .sec = HR_SEC_MAIN,
     .flags = HR_OPTF_CORES, .help = "worker threads, {min}..{max} (default: all cores); more than the online cores\n"
             "warns and uses the online cores"},
    {HR_CMD_EVAL, {"--device"}, "--device D", HR_OPT_CUSTOM, .custom = opt_device, .range = "cpu, cuda, cuda:N",
     EVL(device), .sec = HR_SEC_MAIN, .help = "where the model runs: cpu (default), cuda, cuda:N (docs/GPU.md)"},
    {HR_CMD_EVAL, {"--json"}, "--json", HR_OPT_FLAG, EVL(json), .sec = HR_SEC_MAIN,
     .help = "one JSON object instead of the table"},
    {HR_CMD_EVAL, {"-q", "--quiet"}, "-q, --quiet", HR_OPT_FLAG, EVL(quiet), .sec = HR_SEC_MAIN,
     .help = "no progress on stderr (default: a line rewritten per chunk on a terminal;\n"
             "otherwise one line at start, one at least every 5 s, and one at the end)"},

    /* ---- plan (hr_plan_cli_opts) ---- */
    {HR_CMD_PLAN, {"-m", "--model"}, "-m, --model FILE", HR_OPT_STR, .range = "a file path", PLN(model),
     .sec = HR_SEC_MAIN, .help = "a GGUF file, a config.json, or a checkpoint directory (its config.json)"},
    {HR_CMD_PLAN, {"--weight-type"}, "--weight-type T", HR_OPT_CUSTOM, .custom = opt_weight_type,
     .range = "f32, f16, bf16, q8_0, q4_0, q4_K, q5_K, q6_K", .dst = HR_DST_PLAN, .sec = HR_SEC_MAIN,
     .help = "config.json: the matrices' type (f32, f16, bf16, q8_0, q4_0, q4_K, q5_K,\n"
             "q6_K; default: its torch_dtype)"},
    {HR_CMD_PLAN, {"--device"}, "--device NAME", HR_OPT_STR, .range = "a device name (--help lists them)",
     PLN(device), .sec = HR_SEC_MAIN,
     .help = "{devices};\n"
             "a GPU by the name its driver gives it (\"NVIDIA H100 80GB HBM3\"); cuda[:N]:\n"
             "this machine's GPU as its driver reports it now; default host (MemAvailable,\n"
             "bandwidth measured in about 0.2 s)"},
    {HR_CMD_PLAN, {"--device-mem"}, "--device-mem SIZE", HR_OPT_SIZE, 0, SIZE_MAX_D, PLN(device_mem),
     .sec = HR_SEC_MAIN, .help = "the device's memory by hand (e.g. 24GiB); with --device, overrides it"},
    {HR_CMD_PLAN, {"--device-bw"}, "--device-bw GBPS", HR_OPT_FLOAT, 0.001, 1e6, PLN(device_bw), .sec = HR_SEC_MAIN,
     .help = "the device's memory bandwidth in GB/s (skips the measurement)"},
    {HR_CMD_PLAN, {"--util"}, "--util F", HR_OPT_FLOAT, 0.01, 1, PLN(util), .sec = HR_SEC_MAIN,
     .help = "fraction of the memory to plan for (default 0.9 on GPUs, 1 on host)"},
    {HR_CMD_PLAN, {"-c", "--ctx"}, "-c, --ctx N", HR_OPT_INT, 1, 1 << 24, PLN(p.n_ctx), .sec = HR_SEC_MAIN,
     .help = "context per sequence (default: the model's, capped at 4096)"},
    {HR_CMD_PLAN, {"--concurrency"}, "--concurrency N", HR_OPT_INT, 1, 1 << 20, .def = "1", PLN(p.concurrency),
     .sec = HR_SEC_MAIN, .flags = HR_OPTF_OWN_DEFAULT, .help = "sequences of --ctx at once (default {default})"},
    {HR_CMD_PLAN, {"--kv-type"}, "--kv-type F", HR_OPT_KV_FORMAT, .n_values = HR_RT_KV_FORMAT_COUNT,
     .value_name = format_name, .def = DEF_KV_FORMAT, PLN(p.k_format), .off2 = offsetof(hr_plan_cli_opts, p.v_format),
     .sec = HR_SEC_MAIN, .flags = HR_OPTF_KV_BOTH,
     .help = "the KV format of the budget table (default {default}; every format is listed)"},
    {HR_CMD_PLAN, {"--kv-type-k"}, "--kv-type-k F", HR_OPT_KV_FORMAT, .n_values = HR_RT_KV_FORMAT_COUNT,
     .value_name = format_name, .def = DEF_KV_FORMAT, PLN(p.k_format), .sec = HR_SEC_MAIN,
     .help = "K and V formats apart"},
    {HR_CMD_PLAN, {"--kv-type-v"}, "--kv-type-v F", HR_OPT_KV_FORMAT, .n_values = HR_RT_KV_FORMAT_COUNT,
     .value_name = format_name, .def = DEF_KV_FORMAT, PLN(p.v_format), .sec = HR_SEC_MAIN, .flags = HR_OPTF_JOINED,
     .help = "the V format apart"},
    {HR_CMD_PLAN, {"--block-size"}, "--block-size N", HR_OPT_INT, 1, 4096, .def = DEF_BLOCK_SIZE, PLN(p.block_size),
     .sec = HR_SEC_MAIN, .help = "KV block size in tokens (default {default})"},
    {HR_CMD_PLAN, {"-b", "--max-batch-tokens"}, "-b, --max-batch-tokens N", HR_OPT_INT, 1, 1 << 20,
     .def = DEF_BATCH_TOKENS, PLN(p.max_batch_tokens), .sec = HR_SEC_MAIN,
     .help = "tokens per engine step: sizes activations and scratch (default {default})"},
    {HR_CMD_PLAN, {"--max-running"}, "--max-running N", HR_OPT_INT, 1, 1 << 20, PLN(p.max_running),
     .sec = HR_SEC_MAIN, .help = "sequence slots (default max(concurrency, 64)): engine logits rows"},
    {HR_CMD_PLAN, {"-t", "--threads"}, "-t, --threads N", HR_OPT_INT, 1, 4096, PLN(p.n_threads), .sec = HR_SEC_MAIN,
     .help = "host threads (attention scratch per thread; default: every core)"},
    {HR_CMD_PLAN, {"--json"}, "--json", HR_OPT_FLAG, PLN(json), .sec = HR_SEC_MAIN,
     .help = "one JSON object instead of the table"},
    {HR_CMD_PLAN, {"--traffic"}, "--traffic T", HR_OPT_STR, .range = "chat, rag, agent, burst, long, or a trace file",
     PLN(traffic), .sec = HR_SEC_SIM,
     .help = "chat, rag, agent, burst, long (documented distributions), or a trace file of\n"
             "JSON lines {\"t\": s, \"prompt\": n, \"output\": n, \"prefix\": id,\n"
             "\"prefix_tokens\": n}; runs every candidate (KV format x full or window:ctx/4 x\n"
             "admission x max running) and recommends the best that meets the bounds"},
    {HR_CMD_PLAN, {"--requests"}, "--requests N", HR_OPT_INT, 1, 1 << 20, PLN(n_requests), .sec = HR_SEC_SIM,
     .help = "requests a preset draws (default: the preset's)"},
    {HR_CMD_PLAN, {"--seed"}, "--seed S", HR_OPT_U64, 0, SIZE_MAX_D, .def = "1", PLN(seed), .sec = HR_SEC_SIM,
     .flags = HR_OPTF_OWN_DEFAULT, .help = "the preset's seed (default {default}; same seed, same results)"},
    {HR_CMD_PLAN, {"--sim-running"}, "--sim-running LIST", HR_OPT_CUSTOM, 1, 4096, .custom = opt_sim_running,
     .dst = HR_DST_PLAN, .sec = HR_SEC_SIM,
     .help = "max running sequences to try, e.g. 8,32,128 (default: --max-running)"},
    {HR_CMD_PLAN, {"--slo-ttft"}, "--slo-ttft S", HR_OPT_FLOAT, 1e-6, 1e6, PLN(slo_ttft), .sec = HR_SEC_SIM,
     .help = "bound on TTFT p99 in seconds; --slo-itl S: on inter-token latency p99"},
    {HR_CMD_PLAN, {"--slo-itl"}, "--slo-itl S", HR_OPT_FLOAT, 1e-6, 1e6, PLN(slo_itl), .sec = HR_SEC_SIM,
     .flags = HR_OPTF_INLINE, .help = "bound on inter-token latency p99 in seconds"},
    {HR_CMD_PLAN, {"--eval"}, "--eval FILE", HR_OPT_STR, .range = "a file path", PLN(eval_file), .sec = HR_SEC_SIM,
     .help = "a `headroom eval --json` result: each candidate's perplexity change"},
    {HR_CMD_PLAN, {"--max-ppl-increase"}, "--max-ppl-increase P", HR_OPT_FLOAT, 0, 1e6, PLN(max_ppl),
     .sec = HR_SEC_SIM, .help = "with --eval: the most perplexity increase (percent) a candidate may cost"},
    {HR_CMD_PLAN, {"--cost"}, "--cost FILE", HR_OPT_STR, .range = "a file path", PLN(cost_file), .sec = HR_SEC_SIM,
     .help = "step costs from a saved calibration (default: a GPU's roofline; on this\n"
             "machine, a calibration measured now)"},
    {HR_CMD_PLAN, {"--calibrate"}, "--calibrate FILE", HR_OPT_STR, .range = "a file path", PLN(calibrate_file),
     .sec = HR_SEC_SIM,
     .help = "measure this machine's kernels once (a synthetic TinyLlama-shaped model in\n"
             "--weight-type, default q4_0: bandwidth, the layers' and the output\n"
             "projection's matrix rates at 1..512 tokens a step, attention's rate, and the\n"
             "cost per step and per sampled row of decode steps; about 10 s) and save the\n"
             "cost model to FILE; no -m needed"},
};
/* clang-format on */
const int hr_n_opts = (int)(sizeof hr_opts / sizeof hr_opts[0]);

/* ---- parsing ------------------------------------------------------------------------------------ */

const hr_opt *hr_opts_find(unsigned cmd, const char *name) {
    for (int r = 0; r < hr_n_opts; r++) {
        if (!(hr_opts[r].cmds & cmd)) continue;
        for (int k = 0; k < 3 && hr_opts[r].names[k]; k++)
            if (!strcmp(hr_opts[r].names[k], name)) return &hr_opts[r];
    }
    return NULL;
}

/* The value's index in row->values ("expects a, b or c, got 'v'" otherwise), or what parse_enum says. */
static bool store_enum(const hr_opt *r, const char *cmd, const char *flag, const char *v, char *field) {
    int id = -1;
    if (r->parse_enum) {
        hr_error err;
        if (r->parse_enum(v, &id, &err) != HR_OK) {
            fprintf(stderr, "headroom %s: %s: %s\n", cmd, flag, err.msg);
            return false;
        }
    } else {
        int n = 0;
        for (; r->values[n]; n++)
            if (!strcmp(r->values[n], v)) id = r->ids ? r->ids[n] : n;
        if (id < 0) {
            fprintf(stderr, "headroom %s: %s expects ", cmd, flag);
            for (int k = 0; k < n; k++) fprintf(stderr, "%s%s", k == 0 ? "" : k == n - 1 ? " or " : ", ", r->values[k]);
            fprintf(stderr, ", got '%s'\n", v);
            return false;
        }
    }
    memcpy(field, &id, sizeof id);
    return true;
}

/* A size in [min, max]: the row's own message when outside. */
static bool store_size(const hr_opt *r, const char *cmd, const char *flag, const char *v, uint64_t *out) {
    if (!hr_arg_size(cmd, flag, v, out)) return false;
    if ((double)*out >= r->min && (double)*out <= r->max) return true;
    if (r->bad_got)
        fprintf(stderr, "headroom %s: %s %s, got '%s'\n", cmd, r->names[0], r->bad, v);
    else
        fprintf(stderr, "headroom %s: %s %s\n", cmd, r->names[0], r->bad);
    return false;
}

bool hr_opts_store(const hr_opt *r, const char *cmd, const char *flag, const char *v, const hr_opt_dsts *d) {
    char *base = r->dst ? d->p[r->dst] : NULL;
    if (!base) return true; /* the command reads this one itself */
    char *field = base + r->off;
    switch (r->type) {
    case HR_OPT_FLAG: {
        bool on = true;
        memcpy(field, &on, sizeof on);
        return true;
    }
    case HR_OPT_INT: {
        int n;
        if (!hr_arg_int(cmd, flag, v, (long)r->min, (long)r->max, &n)) return false;
        if (r->flags & HR_OPTF_CORES) n = hr_arg_threads_cap(cmd, n);
        memcpy(field, &n, sizeof n);
        return true;
    }
    case HR_OPT_U64: {
        uint64_t n;
        if (!hr_arg_u64(cmd, flag, v, &n)) return false;
        memcpy(field, &n, sizeof n);
        return true;
    }
    case HR_OPT_FLOAT:
    case HR_OPT_DOUBLE: {
        float x; /* a double field still reads the value as a float, as it always has */
        if (!hr_arg_float(cmd, flag, v, r->min, r->max, &x)) return false;
        if (r->type == HR_OPT_FLOAT) {
            memcpy(field, &x, sizeof x);
        } else {
            double dx = x;
            memcpy(field, &dx, sizeof dx);
        }
        return true;
    }
    case HR_OPT_SIZE:
    case HR_OPT_SIZE_T:
    case HR_OPT_RATE: {
        uint64_t n;
        if (!store_size(r, cmd, flag, v, &n)) return false;
        if (r->type == HR_OPT_SIZE) {
            memcpy(field, &n, sizeof n);
        } else if (r->type == HR_OPT_SIZE_T) {
            size_t s = (size_t)n;
            memcpy(field, &s, sizeof s);
        } else {
            double x = (double)n;
            memcpy(field, &x, sizeof x);
        }
        return true;
    }
    case HR_OPT_STR: memcpy(field, &v, sizeof v); return true;
    case HR_OPT_ENUM: return store_enum(r, cmd, flag, v, field);
    case HR_OPT_KV_FORMAT: {
        hr_rt_kv_format f;
        hr_error err;
        if (hr_rt_kv_format_parse(v, &f, &err) != HR_OK) {
            fprintf(stderr, "headroom %s: %s: %s\n", cmd, flag, err.msg);
            return false;
        }
        memcpy(field, &f, sizeof f);
        if (r->flags & HR_OPTF_KV_BOTH) memcpy(base + r->off2, &f, sizeof f); /* --kv-type: V too */
        return true;
    }
    case HR_OPT_CUSTOM: return r->custom(r, cmd, flag, v, base);
    }
    return false;
}

hr_opt_result hr_opts_parse(unsigned cmd, const char *cmd_name, const hr_opt_dsts *d, int argc, char **argv, int *i,
                            const hr_opt **row, const char **value) {
    const char *a = argv[*i];
    *row = NULL;
    *value = NULL;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) return HR_OPT_HELP;
    const hr_opt *r = hr_opts_find(cmd, a);
    if (!r) return HR_OPT_UNKNOWN;
    *row = r;
    const char *v = NULL;
    if (r->type != HR_OPT_FLAG && !(v = hr_arg_value(cmd_name, argc, argv, i))) return HR_OPT_BAD;
    *value = v;
    if (!r->dst) return HR_OPT_CALLER;
    return hr_opts_store(r, cmd_name, a, v, d) ? HR_OPT_STORED : HR_OPT_BAD;
}

void hr_opts_defaults(unsigned cmd, const hr_opt_dsts *d) {
    for (int r = 0; r < hr_n_opts; r++) {
        const hr_opt *o = &hr_opts[r];
        if (!(o->cmds & cmd) || !o->def || !o->dst || !d->p[o->dst]) continue;
        bool ok = hr_opts_store(o, "defaults", o->names[0], o->def, d);
        (void)ok; /* every default parses: tests/test_cli_options.c */
    }
}

/* ---- --help ------------------------------------------------------------------------------------- */

/* The pages: text between groups of rows. A group lists the rows of its sections (a bit set of
 * 1 << hr_opt_section) in table order, in full (synopsis, column, help) or compact (a wrapped list of
 * synopses, serve's "as in run"). */
typedef struct help_part {
    const char *text;
    unsigned secs;
    bool compact;
} help_part;

typedef struct help_page {
    unsigned cmd;
    int col;          /* where help text starts */
    bool flat_indent; /* every synopsis at 2 spaces (eval); else 2 with a short name, 6 without */
    help_part parts[16];
} help_page;

#define SEC(s) (1u << (s))

static const help_page pages[] = {
    {HR_CMD_RUN,
     25,
     false,
     {{.text = "usage: headroom run [-m FILE.gguf] -p PROMPT [-p PROMPT ...] [--prompts FILE] [options]\n\n"
               "Generates a completion of each PROMPT. Several prompts run concurrently through the engine and\n"
               "print in input order. Without -m, a built-in tiny demo model with random weights is used (its\n"
               "text is noise; it shows the pipeline works).\n\n"
               "model and prompt:\n"},
      {.secs = SEC(HR_SEC_MODEL)},
      {.text = "generation:\n"},
      {.secs = SEC(HR_SEC_GEN)},
      {.text = "cache and compute:\n"},
      {.secs = SEC(HR_SEC_CACHE)},
      {.text = "engine (continuous batching):\n"},
      {.secs = SEC(HR_SEC_ENGINE)},
      {.text = "output:\n"},
      {.secs = SEC(HR_SEC_OUTPUT)},
      {.text = "One prompt streams its completion to stdout. Several print in input order, each after a header\n"
               "line `--- [i/N] ---` (an error: `--- [i/N] error: MESSAGE ---`).\n"
               "\n" HR_EXIT_HELP}}},
    {HR_CMD_SERVE,
     25,
     false,
     {{.text = "usage: headroom serve [-m FILE.gguf] [--host H] [--port P] [--api-key K] [options]\n\n"
               "Serves the model over HTTP with OpenAI's API: POST /v1/completions, /v1/chat/completions (stream\n"
               "true/false; every usage carries a \"kv\" object: the request's KV blocks and bytes, prefix-cache\n"
               "hits, evictions, preemptions, queue time), GET /v1/models, GET /v1/kv (the pool, every running\n"
               "request's ledger, rates and events), GET / or /dashboard (a live dashboard of it in the browser;\n"
               "`headroom top` shows it in a terminal), GET /metrics (Prometheus), GET /health, POST /tokenize,\n"
               "/detokenize. Request extensions: \"kv_policy\" (e.g. \"window:256\"), \"priority\" (int),\n"
               "\"ignore_eos\" (bool), \"cache_salt\" (string: only requests with the same salt share cached\n"
               "prefix blocks). Constrained output (docs/CONSTRAIN.md): \"response_format\" (json_object,\n"
               "json_schema), \"guided_json\", \"guided_regex\", \"guided_grammar\" (GBNF), \"guided_choice\".\n"
               "Without -m, the built-in demo model (random weights: its text is noise).\n\n"
               "server:\n"},
      {.secs = SEC(HR_SEC_SERVER)},
      {.text = HR_SERVE_CLUSTER_HELP "model, cache and engine (as in `headroom run`; see its --help):\n"},
      {.secs = SEC(HR_SEC_MODEL) | SEC(HR_SEC_CACHE) | SEC(HR_SEC_ENGINE), .compact = true},
      {.secs = SEC(HR_SEC_SERVE_RT)},
      {.text = "sampling defaults (a request's own fields override them):\n"},
      {.secs = SEC(HR_SEC_GEN), .compact = true},
      {.text = "\n" HR_EXIT_HELP}}},
    {HR_CMD_EVAL,
     19,
     true,
     {{.text = "usage: headroom eval -m FILE.gguf [--kv-type LIST] [options] TEXT_FILE\n\n"
               "Measures what each KV cache format does to quality on TEXT_FILE, against an f32 cache.\n"
               "Scoring: chunks of --ctx tokens, the first replaced by BOS, the second half of each chunk\n"
               "scored (the method of llama.cpp's perplexity tool, so figures compare with its own).\n\n"},
      {.secs = SEC(HR_SEC_MAIN)},
      {.text = "Output columns: KV bytes per token (all layers, K and V), KV bytes one sequence holds at the\n"
               "end of a chunk (after its policy), the most tokens one layer and KV head keeps then,\n"
               "perplexity, its change against the f32 full-cache run,\n"
               "mean KL divergence from that run (nats), top-1 agreement with it.\n"
               "TEXT_FILE must be a regular file (a directory is an error).\n\n" HR_EXIT_HELP}}},
    {HR_CMD_PLAN,
     25,
     false,
     {{.text = "usage: headroom plan -m FILE.gguf|config.json [--device NAME] [--ctx N] [--concurrency N] [options]\n\n"
               "The memory a server needs before it starts: weights by tensor type (what gets loaded), KV bytes per\n"
               "token (per layer kind; sliding-window layers capped at their window), the worst-case KV for context\n"
               "x concurrency, activations and scratch at the batch-token budget, runtime overhead, the total\n"
               "against the device's memory, and for every KV format the largest concurrency at the context and\n"
               "the largest context at the concurrency that fit. The figures come from the function the runtime\n"
               "sizes its pool with (docs/PLAN.md). A Hugging Face checkpoint directory or its config.json (any\n"
               "architecture -m DIR loads) plans a model without reading its weights.\n\n"},
      {.secs = SEC(HR_SEC_MAIN)},
      {.text = "\ntraffic simulation (the engine's real scheduler and KV block manager in virtual time, no model\n"
               "compute; docs/PLAN.md):\n"},
      {.secs = SEC(HR_SEC_SIM)},
      {.text = "\nexit status: 0 the configuration fits (with --traffic: a candidate meets every bound); 1 it does\n"
               "not (stderr says the largest context or concurrency that does; with --traffic: none meets them)\n"
               "or the model file cannot be read or is not a model (a config.json missing a field or of an unknown\n"
               "architecture: the message names it); 2 a usage error (a bad flag or value, an unknown device or\n"
               "traffic preset: the message lists the known ones)\n"}}},
};

/* A growable string for building one row's lines. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) return; /* --help only: a truncated line under memory pressure */
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

/* Appends text to b with {default}, {min}, {max} and {devices} filled in from the row. */
static void expand(sbuf *b, const hr_opt *r, const char *text) {
    for (const char *s = text; *s;) {
        const char *open = strchr(s, '{');
        const char *close = open ? strchr(open, '}') : NULL;
        if (!close) {
            sb_add(b, s, strlen(s));
            break;
        }
        sb_add(b, s, (size_t)(open - s));
        char num[32];
        const char *fill = NULL;
        size_t key = (size_t)(close - open - 1);
        if (key == 7 && !strncmp(open + 1, "default", key))
            fill = r->def ? r->def : "";
        else if (key == 3 && (!strncmp(open + 1, "min", key) || !strncmp(open + 1, "max", key)))
            snprintf(num, sizeof num, "%g", open[2] == 'i' ? r->min : r->max), fill = num;
        else if (key == 7 && !strncmp(open + 1, "devices", key))
            fill = hr_plan_device_names();
        if (fill) {
            sb_add(b, fill, strlen(fill));
            s = close + 1;
        } else { /* a literal brace (JSON in the help text) */
            sb_add(b, open, 1);
            s = open + 1;
        }
    }
}

static bool row_in(const hr_opt *r, unsigned cmd, unsigned secs) { return (r->cmds & cmd) && (secs & SEC(r->sec)); }

/* One row in full: "  -x, --name ARG      help" (continuation lines at the column), with the rows joined
 * to it on its line. Returns the index after the rows it printed. */
static int print_full(FILE *f, const help_page *pg, unsigned secs, int r) {
    sbuf b = {0};
    const hr_opt *o = &hr_opts[r];
    bool short_name = o->syn[0] == '-' && o->syn[1] != '-';
    sb_add(&b, pg->flat_indent || short_name ? "  " : "      ", pg->flat_indent || short_name ? 2 : 6);
    sb_add(&b, o->syn, strlen(o->syn));
    int next = r + 1;
    for (; next < hr_n_opts; next++) { /* rows on this line, and rows named inside its help */
        const hr_opt *j = &hr_opts[next];
        if (!row_in(j, pg->cmd, secs)) continue;
        if (j->flags & HR_OPTF_JOINED) {
            sb_add(&b, ", ", 2);
            sb_add(&b, j->syn, strlen(j->syn));
        } else if (!(j->flags & HR_OPTF_INLINE)) {
            break;
        }
    }
    if (b.n < (size_t)pg->col) {
        while (b.n < (size_t)pg->col) sb_add(&b, " ", 1);
    } else { /* past the column: two spaces, one before a parenthesised note (it reads as the synopsis's) */
        sb_add(&b, "  ", o->help[0] == '(' ? 1 : 2);
    }
    sbuf h = {0};
    expand(&h, o, o->help);
    for (const char *s = h.p; s && *s;) {
        size_t len = strcspn(s, "\n");
        sb_add(&b, s, len);
        sb_add(&b, "\n", 1);
        s += len;
        if (*s == '\n') {
            s++;
            for (int k = 0; k < pg->col; k++) sb_add(&b, " ", 1);
        }
    }
    if (b.p) fputs(b.p, f);
    free(b.p);
    free(h.p);
    return next;
}

/* serve's "as in run" lists: every synopsis (and its brief note) comma-separated, wrapped at 100
 * columns with a two-space indent, between synopses or inside a brief note only. */
static void print_compact(FILE *f, const help_page *pg, unsigned secs) {
    sbuf all = {0};
    for (int r = 0; r < hr_n_opts; r++) {
        const hr_opt *o = &hr_opts[r];
        if (!row_in(o, pg->cmd, secs)) continue;
        if (all.n) sb_add(&all, ", ", 2);
        for (const char *c = o->syn; *c; c++) /* a synopsis never wraps inside: '\1' prints as a space */
            sb_add(&all, *c == ' ' ? "\1" : c, 1);
        if (o->brief) {
            sb_add(&all, " ", 1);
            expand(&all, o, o->brief);
        }
    }
    int width = 2;
    fputs("  ", f);
    for (const char *s = all.p; s && *s;) {
        size_t len = strcspn(s, " ");
        if (width > 2 && width + 1 + (int)len > 100) {
            fputs("\n  ", f);
            width = 2;
        } else if (width > 2) {
            fputc(' ', f);
            width++;
        }
        for (size_t k = 0; k < len; k++) fputc(s[k] == '\1' ? ' ' : s[k], f);
        width += (int)len;
        s += len;
        s += *s == ' ';
    }
    fputc('\n', f);
    free(all.p);
}

void hr_opts_print_help(unsigned cmd, FILE *f) {
    for (size_t p = 0; p < sizeof pages / sizeof pages[0]; p++) {
        const help_page *pg = &pages[p];
        if (pg->cmd != cmd) continue;
        for (int k = 0; k < 16 && (pg->parts[k].text || pg->parts[k].secs); k++) {
            const help_part *part = &pg->parts[k];
            if (part->text) {
                fputs(part->text, f);
            } else if (part->compact) {
                print_compact(f, pg, part->secs);
            } else {
                for (int r = 0; r < hr_n_opts;) {
                    if (row_in(&hr_opts[r], cmd, part->secs) && !(hr_opts[r].flags & (HR_OPTF_JOINED | HR_OPTF_INLINE)))
                        r = print_full(f, pg, part->secs, r);
                    else
                        r++;
                }
            }
        }
    }
}

// bench.mjs: llama.cpp's prompt and generation speed on this machine, measured the way llama-bench
// measures pp and tg, through node-llama-cpp's prebuilt CPU libraries (no compiler, no PyPI needed).
//
// usage: node bench.mjs MODEL.gguf [MODEL.gguf ...] [--threads 2] [--prompt 512] [--gen 64]
//                       [--repeats 3] [--parallel 0] [--tries 3] [--quiet 60]
// prints one JSON line per model (medians over repeats, and every run).
//
//   pp: N prompt tokens (BOS, then ordinary vocabulary tokens chosen deterministically) decoded as one
//       batch into an empty KV cache (n_batch = n_ubatch = N, so one llama_decode: llama-bench's pp512);
//       tok/s = N / wall time of that decode.
//   tg: after a 4-token prompt, N tokens generated one at a time, greedy (decode + sample per token);
//       tok/s = N / wall time of the N decodes (llama-bench's tg, which also starts near depth 0).
//   parallel P (optional): P sequences in one context, each with its own 4-token prompt, then N steps
//       in which one llama_decode carries one token of every sequence; aggregate tok/s = P*N / time.
//
// Settings are llama-bench's defaults: flash attention off, f16 K and V cache, mmap, the thread count
// given (for batch and generation alike), a warm-up decode before the timed ones. The CPU library is
// the one ggml picks for this CPU (printed as "cpu_backend"; on AVX2 without AVX-512: haswell).
// It drives node-llama-cpp's native context (LlamaContext._ctx: initBatch/addToBatch/decodeBatch/
// sampleToken) directly, below its JS batching queue, so the timing holds llama_decode and sampling only.
// These are internal names of node-llama-cpp 3.22.1, the version package.json pins.
//
// On a shared machine: llama.cpp's threads spin at each barrier, so another process on one of the
// cores slows a run many times over. Each timed run therefore counts the CPU time other processes took
// meanwhile (/proc/stat less this process's own); a run where they took 10% or more of the CPUs is
// tried again, up to --tries times, after waiting up to --quiet seconds for the CPUs to calm down, and
// the least disturbed try is kept ("others_pct": the most any kept run saw).
import {getLlama, LlamaLogLevel} from "node-llama-cpp";
import {parseArgs} from "node:util";
import {performance} from "node:perf_hooks";
import {readFileSync} from "node:fs";
import path from "node:path";

const {values: opt, positionals: models} = parseArgs({
    allowPositionals: true,
    options: {
        threads: {type: "string", default: "2"},
        prompt: {type: "string", default: "512"},
        gen: {type: "string", default: "64"},
        repeats: {type: "string", default: "3"},
        parallel: {type: "string", default: "0"},
        tries: {type: "string", default: "3"},
        quiet: {type: "string", default: "60"},
    },
});
const [threads, nPrompt, nGen, repeats, nPar, tries, quietSeconds] =
    [opt.threads, opt.prompt, opt.gen, opt.repeats, opt.parallel, opt.tries, opt.quiet].map(Number);
if (models.length === 0) {
    console.error("usage: node bench.mjs MODEL.gguf [...] [--threads 2] [--prompt 512] [--gen 64] [--repeats 3] [--parallel 0]");
    process.exit(2);
}
const SHORT = 4; // prompt length before tg

const llama = await getLlama({gpu: false, build: "never", maxThreads: 0, logLevel: LlamaLogLevel.error});
// the CPU variant ggml loaded for this machine (libggml-cpu-haswell.so, -zen4.so, ...)
const cpuBackend = readFileSync("/proc/self/maps", "utf8").match(/libggml-cpu-([\w-]+)\.so/)?.[1] ?? "unknown";
const nlcDir = path.dirname(path.dirname(new URL(import.meta.resolve("node-llama-cpp")).pathname));
const nlcVersion = JSON.parse(readFileSync(path.join(nlcDir, "package.json"), "utf8")).version;

const median = (xs) => {
    const s = [...xs].sort((a, b) => a - b), m = s.length >> 1;
    return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const round = (x) => Math.round(x * 100) / 100;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// busy and all ticks of all cores (USER_HZ = 100 per second)
function cpuTicks() {
    const [user, nice, system, idle] = readFileSync("/proc/stat", "utf8").split("\n")[0].split(/\s+/).slice(1, 5).map(Number);
    return {busy: user + nice + system, all: user + nice + system + idle};
}
// percent of all cores that other processes used while fn ran, and fn's result
async function othersWhile(fn) {
    const t0 = cpuTicks(), c0 = process.cpuUsage();
    const value = await fn();
    const t1 = cpuTicks(), own = process.cpuUsage(c0);
    const ownTicks = (own.user + own.system) / 1e4;
    return {value, others: Math.max(0, 100 * (t1.busy - t0.busy - ownTicks) / Math.max(1, t1.all - t0.all))};
}
async function waitQuiet() {
    for (const end = Date.now() + quietSeconds * 1e3; Date.now() < end;)
        if ((await othersWhile(() => sleep(2000))).others < 10) return;
}
// the least disturbed of up to `tries` tries of fn (which returns tokens per second)
async function leastDisturbed(fn) {
    let best = null;
    for (let i = 0; i < tries && !(best?.others < 10); i++) {
        if (i > 0) await waitQuiet();
        const run = await othersWhile(fn);
        if (!best || run.others < best.others) best = run;
    }
    return best;
}

// n token ids: BOS (if the model adds one), then ordinary (non-special, non-byte) tokens spread over the vocabulary
const normalTokens = new WeakMap();
function promptTokens(model, n, offset = 0) {
    if (!normalTokens.has(model)) {
        const vocab = model.fileInfo.metadata.tokenizer.ggml.tokens.length;
        normalTokens.set(model, [...Array(vocab).keys()].filter((t) => model.getTokenAttributes(t).normal));
    }
    const normal = normalTokens.get(model);
    const ids = model.tokens.shouldPrependBosToken && model.tokens.bos != null ? [model.tokens.bos] : [];
    for (let i = 0; ids.length < n; i++) ids.push(normal[((i + offset) * 7919) % normal.length]);
    return ids;
}

async function newContext(model, {contextSize, batchSize, sequences = 1}) {
    const context = await model.createContext({
        contextSize, batchSize, sequences, threads, flashAttention: false,
        experimentalKvCacheKeyType: "F16", experimentalKvCacheValueType: "F16",
    });
    const ctx = context._ctx; // the native llama_context wrapper
    ctx.setThreads(threads);
    if (ctx.getThreads() !== threads) throw new Error(`context runs ${ctx.getThreads()} threads, not ${threads}`);
    return {context, ctx};
}

// one llama_decode of several sequences' tokens; returns the batch index of each sequence's last token
async function decode(ctx, items /* [{seq, pos, tokens}] */) {
    ctx.initBatch(items.reduce((n, it) => n + it.tokens.length, 0));
    const logitIdx = items.map(({seq, pos, tokens}) =>
        ctx.addToBatch(seq, pos, Uint32Array.from(tokens), Uint32Array.of(tokens.length - 1))[0]);
    await ctx.decodeBatch();
    return logitIdx;
}

function clear(ctx, nSeq) {
    for (let s = 0; s < nSeq; s++) ctx.removeTokenCellsFromSequence(s, 0, -1);
}

async function benchPrompt(model) {
    const tokens = promptTokens(model, nPrompt);
    const {context, ctx} = await newContext(model, {contextSize: nPrompt, batchSize: nPrompt});
    await decode(ctx, [{seq: 0, pos: 0, tokens: tokens.slice(0, 64)}]); // warm-up: weights paged in, threads up
    const runs = [];
    for (let r = 0; r < repeats; r++) {
        runs.push(await leastDisturbed(async () => {
            clear(ctx, 1);
            const t0 = performance.now();
            await decode(ctx, [{seq: 0, pos: 0, tokens}]);
            return nPrompt / ((performance.now() - t0) / 1e3);
        }));
    }
    await context.dispose();
    return runs;
}

// nSeq sequences generating together (nSeq = 1: single-stream tg)
async function benchGenerate(model, nSeq) {
    const prompts = Array.from({length: nSeq}, (_, s) => promptTokens(model, SHORT, 101 * s));
    const {context, ctx} = await newContext(model, {
        contextSize: SHORT + nGen + 1, batchSize: Math.max(nSeq * SHORT, 1), sequences: nSeq});
    const sampler = new llama._bindings.AddonSampler(model._model);
    sampler.applyConfig({temperature: 0}); // greedy
    const sample = (idx) => Promise.all(idx.map((i) => ctx.sampleToken(i, sampler)));
    const generate = async (steps) => {
        clear(ctx, nSeq);
        let next = await sample(await decode(ctx, prompts.map((tokens, seq) => ({seq, pos: 0, tokens}))));
        const t0 = performance.now();
        for (let i = 0; i < steps; i++)
            next = await sample(await decode(ctx, next.map((t, seq) => ({seq, pos: SHORT + i, tokens: [t]}))));
        return nSeq * steps / ((performance.now() - t0) / 1e3);
    };
    await generate(2); // warm-up
    const runs = [];
    for (let r = 0; r < repeats; r++) runs.push(await leastDisturbed(() => generate(nGen)));
    sampler.dispose();
    await context.dispose();
    return runs;
}

for (const modelPath of models) {
    const model = await llama.loadModel({modelPath});
    const pp = await benchPrompt(model);
    const tg = await benchGenerate(model, 1);
    const par = nPar > 0 ? await benchGenerate(model, nPar) : null;
    const all = [...pp, ...tg, ...(par ?? [])];
    const med = (runs) => round(median(runs.map((r) => r.value)));
    const each = (runs) => runs.map((r) => round(r.value));
    console.log(JSON.stringify({
        model: path.basename(modelPath), type: model.typeDescription, size_bytes: model.size,
        engine: `llama.cpp ${llama.llamaCppRelease.release} via node-llama-cpp ${nlcVersion}`,
        cpu_backend: cpuBackend, threads, flash_attn: false, kv_type: "f16",
        n_prompt: nPrompt, n_gen: nGen, repeats,
        pp_tokens_per_second: med(pp), tg_tokens_per_second: med(tg),
        ...(par && {parallel: nPar, parallel_tg_tokens_per_second: med(par)}),
        others_pct: Math.round(Math.max(...all.map((r) => r.others))),
        pp_runs: each(pp), tg_runs: each(tg), ...(par && {parallel_tg_runs: each(par)}),
    }));
    await model.dispose();
}
await llama.dispose();

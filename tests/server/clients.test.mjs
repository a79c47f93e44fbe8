// clients.test.mjs: `headroom serve` through the clients agent frameworks use, pinned (installed into
// SCRATCH_DIR by the test; exit 77, skipped, when npm cannot install them):
//   - openai: chat.completions.parse with zodResponseFormat (structured outputs), and zodFunction tools
//     with tool_choice required (parsed_arguments);
//   - LangChain JS: ChatOpenAI.withStructuredOutput (json_schema) and bindTools with tool_choice;
//   - the Vercel AI SDK: generateObject with @ai-sdk/openai-compatible, and streamText with a tool.
// On the demo model, at temperature 1 over many seeds: every structured answer parses and passes its
// zod schema, every tool call names a given tool with arguments that pass its schema, streaming and
// not. Run by ctest:  node clients.test.mjs HEADROOM_BIN SCRATCH_DIR [MODEL.gguf]. Every wait is bounded.
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

const [bin, scratchArg, model] = process.argv.slice(2);
const scratch = path.resolve(scratchArg);
const PINNED = { openai: '6.49.0', zod: '4.6.7', '@langchain/openai': '1.5.8', '@langchain/core': '1.4.0', ai: '6.0.333',
  '@ai-sdk/openai-compatible': '2.0.92' };
let failed = 0, passed = 0;
const check = (cond, what) => { if (cond) passed++; else { failed++; console.error(`CHECK failed: ${what}`); } };

mkdirSync(scratch, { recursive: true });
const have = Object.entries(PINNED).every(([n, v]) => {
  try { return JSON.parse(execFileSync('node', ['-p', `JSON.stringify(require('${n}/package.json'))`], { cwd: scratch, stdio: ['ignore', 'pipe', 'ignore'] })).version === v; } catch { return false; }
});
if (!have) {
  writeFileSync(path.join(scratch, 'package.json'), JSON.stringify({ name: 'headroom-clients', private: true }));
  try {
    execFileSync('npm', ['install', '--prefix', scratch, '--no-audit', '--no-fund', ...Object.entries(PINNED).map(([n, v]) => `${n}@${v}`)],
                 { stdio: 'pipe', timeout: 240000 });
  } catch (e) {
    console.log(`SKIP: npm could not install the clients (${String(e.stderr || e.message).split('\n')[0]})`);
    process.exit(77);
  }
}
const require = createRequire(path.join(scratch, 'package.json'));
const load = async (n) => import(require.resolve(n));
const { default: OpenAI } = await load('openai');
const { zodResponseFormat, zodFunction } = await load('openai/helpers/zod');
const { z } = await load('zod');
const { ChatOpenAI } = await load('@langchain/openai');
const { tool: lcTool } = await load('@langchain/core/tools');
const { generateObject, streamText, tool: aiTool, jsonSchema } = await load('ai');
const { createOpenAICompatible } = await load('@ai-sdk/openai-compatible');

// the demo model: a tiny vocabulary, so give the tools' description room (-c 1024)
const args = ['serve', '--port', '0', '--drain-timeout', '1', '-t', '1', '-c', '1024', '--ctx-extend', '--api-key', 'k'];
if (model && existsSync(model)) args.push('-m', model);
const srv = spawn(bin, args, { stdio: ['ignore', 'pipe', 'inherit'] });
process.on('exit', () => srv.kill('SIGKILL'));
const watchdog = setTimeout(() => { console.error('watchdog: 280 s'); process.exit(1); }, 280000);
const port = await new Promise((resolve, reject) => {
  let out = '';
  srv.stdout.on('data', (d) => { out += d; const m = out.match(/listening on \S+:(\d+)/); if (m) resolve(Number(m[1])); });
  srv.on('exit', (code) => reject(new Error(`headroom serve exited ${code}: ${out}`)));
});
const baseURL = `http://127.0.0.1:${port}/v1`;
for (let i = 0; i < 300; i++) { try { if ((await fetch(`http://127.0.0.1:${port}/health`)).ok) break; } catch {} await new Promise((r) => setTimeout(r, 200)); }
const name = (await (await fetch(`${baseURL}/models`, { headers: { authorization: 'Bearer k' } })).json()).data[0].id;

// bounded answers (the demo model writes noise: bounds keep every answer within max_tokens)
const Person = z.object({ name: z.string().max(12), age: z.number().int().min(0).max(120), mood: z.enum(['happy', 'sad', 'calm']),
  pets: z.array(z.enum(['cat', 'dog', 'fish'])).max(3) });
const Weather = z.object({ city: z.string().max(12), days: z.number().int().min(1).max(7) });
const SEEDS = 20;

// ---- openai ------------------------------------------------------------------------------------------
const client = new OpenAI({ baseURL, apiKey: 'k', maxRetries: 0, timeout: 60000 });
let ok = 0;
for (let seed = 0; seed < SEEDS; seed++) {
  try {
    const r = await client.chat.completions.parse({ model: name, messages: [{ role: 'user', content: 'Describe a person.' }],
      response_format: zodResponseFormat(Person, 'person'), temperature: 1, seed, max_tokens: 300 });
    const p = r.choices[0].message.parsed;
    if (p && Person.safeParse(p).success && r.choices[0].finish_reason === 'stop') ok++;
    else console.error(`openai parse seed ${seed}: ${JSON.stringify(r.choices[0])}`);
  } catch (e) { console.error(`openai parse seed ${seed}: ${e.message}`); }
}
check(ok === SEEDS, `openai chat.completions.parse + zodResponseFormat: ${ok}/${SEEDS} valid`);
ok = 0;
for (let seed = 0; seed < SEEDS; seed++) {
  try {
    const r = await client.chat.completions.parse({ model: name, messages: [{ role: 'user', content: 'Weather in Paris?' }],
      tools: [zodFunction({ name: 'get_weather', parameters: Weather })], tool_choice: 'required', parallel_tool_calls: false,
      temperature: 1, seed, max_tokens: 200 });
    const c = r.choices[0].message.tool_calls?.[0];
    if (r.choices[0].finish_reason === 'tool_calls' && c?.function.name === 'get_weather' && Weather.safeParse(c.function.parsed_arguments).success) ok++;
    else console.error(`openai tools seed ${seed}: ${JSON.stringify(r.choices[0])}`);
  } catch (e) { console.error(`openai tools seed ${seed}: ${e.message}`); }
}
check(ok === SEEDS, `openai zodFunction tools, tool_choice required: ${ok}/${SEEDS} valid calls`);
// streaming structured output through the SDK's stream helper
try {
  const stream = client.chat.completions.stream({ model: name, messages: [{ role: 'user', content: 'A person.' }],
    response_format: zodResponseFormat(Person, 'person'), temperature: 1, seed: 5, max_tokens: 300 });
  const final = await stream.finalChatCompletion();
  check(Person.safeParse(final.choices[0].message.parsed).success, `openai stream + zodResponseFormat: ${JSON.stringify(final.choices[0].message)}`);
} catch (e) { check(false, `openai stream: ${e.message}`); }

// ---- LangChain JS ------------------------------------------------------------------------------------
const lc = new ChatOpenAI({ model: name, apiKey: 'k', configuration: { baseURL }, temperature: 1, maxTokens: 300, maxRetries: 0 });
ok = 0;
for (let seed = 0; seed < SEEDS; seed++) {
  try {
    const seeded = new ChatOpenAI({ model: name, apiKey: 'k', configuration: { baseURL }, temperature: 1, maxTokens: 300,
      maxRetries: 0, modelKwargs: { seed } });
    const p = await seeded.withStructuredOutput(Person, { method: 'jsonSchema', name: 'person' }).invoke('Describe a person.');
    if (Person.safeParse(p).success) ok++; else console.error(`langchain seed ${seed}: ${JSON.stringify(p)}`);
  } catch (e) { console.error(`langchain seed ${seed}: ${e.message}`); }
}
check(ok === SEEDS, `LangChain withStructuredOutput (jsonSchema): ${ok}/${SEEDS} valid`);
try {
  const weatherTool = lcTool(async () => 'sunny', { name: 'get_weather', description: 'The weather', schema: Weather });
  let good = 0;
  for (let seed = 0; seed < 5; seed++) {
    const m = await lc.bindTools([weatherTool], { tool_choice: 'required', parallel_tool_calls: false }).invoke('Weather in Paris?', { seed });
    const c = m.tool_calls?.[0];
    if (c && c.name === 'get_weather' && Weather.safeParse(c.args).success) good++;
    else console.error(`langchain bindTools seed ${seed}: ${JSON.stringify(m.tool_calls)} ${JSON.stringify(m.content)}`);
  }
  check(good === 5, `LangChain bindTools tool_choice required: ${good}/5 valid calls`);
} catch (e) { check(false, `LangChain bindTools: ${e.message}`); }

// ---- Vercel AI SDK -----------------------------------------------------------------------------------
const provider = createOpenAICompatible({ name: 'headroom', baseURL, apiKey: 'k', supportsStructuredOutputs: true });
ok = 0;
for (let seed = 0; seed < SEEDS; seed++) {
  try {
    const { object } = await generateObject({ model: provider(name), schema: Person, prompt: 'Describe a person.', temperature: 1,
      seed, maxOutputTokens: 300, maxRetries: 0 });
    if (Person.safeParse(object).success) ok++; else console.error(`ai generateObject seed ${seed}: ${JSON.stringify(object)}`);
  } catch (e) { console.error(`ai generateObject seed ${seed}: ${e.message}`); }
}
check(ok === SEEDS, `AI SDK generateObject: ${ok}/${SEEDS} valid`);
try {
  let good = 0;
  for (let seed = 0; seed < 5; seed++) {
    const res = streamText({ model: provider(name), prompt: 'Weather in Paris?', temperature: 1, seed, maxOutputTokens: 200, maxRetries: 0,
      tools: { get_weather: aiTool({ description: 'The weather', inputSchema: Weather }) }, toolChoice: 'required',
      providerOptions: { headroom: { parallel_tool_calls: false } } });
    const calls = await res.toolCalls;
    const c = calls?.[0];
    if (c && c.toolName === 'get_weather' && Weather.safeParse(c.input).success) good++;
    else console.error(`ai streamText seed ${seed}: ${JSON.stringify(calls)} ${await res.text}`);
  }
  check(good === 5, `AI SDK streamText with a tool (toolChoice required): ${good}/5 valid calls`);
} catch (e) { check(false, `AI SDK streamText: ${e.message}`); }

clearTimeout(watchdog);
srv.kill('SIGTERM');
await new Promise((r) => srv.on('exit', r));
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
